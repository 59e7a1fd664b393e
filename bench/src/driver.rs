//! The generic timed loop for in-process clients, and the one trait a
//! transport implements to get it.
//!
//! # Plugging a transport in (shm, tcp, roce)
//!
//! Implement [`RpcDriver`] for a type that owns the client side (and, for
//! the embedded default, the server it started on its own pinned core):
//!
//! 1. [`RpcDriver::prepare`] connects (or reconnects) for a run: at least
//!    `spec.depth` calls in flight, buffers for `spec.size`-byte arguments
//!    and results registered once (DDP reply targets for READ: a write
//!    chunk per slot; the SINK argument offered as a read chunk). Called
//!    once per run, outside the measurement; it may allocate.
//! 2. [`RpcDriver::start`] encodes and posts one call for slot `slot`
//!    (`0..depth`), e.g. with `dataplane::service::bench::encode_call` into
//!    the slot's send buffer. No allocation, no blocking.
//! 3. [`RpcDriver::poll`] makes progress (polls the CQ or socket) and hands
//!    each finished call to `done(slot, reply)` with the RPC reply message
//!    and, when the data came by DDP, the placed bytes; it returns how many
//!    finished. No allocation, no blocking: [`drive`] owns the idle policy.
//! 4. [`RpcDriver::server_cpu`] returns the server's cumulative CPU time
//!    (an embedded worker thread: record [`current_thread_id`] on it and
//!    return [`thread_cpu_of`] that id), or `None` (remote server).
//!
//! then give [`transport::open`](crate::transport::open) an arm
//! `"shm" => Ok(Box::new(Driven::new(ShmDriver::new(url, options)?)))` and
//! set the transport's entry in
//! [`TRANSPORTS`](crate::transport::TRANSPORTS) to available. The
//! [`inproc`](crate::inproc) driver is a complete example.
//!
//! [`drive`] is generic over the driver, so the loop is monomorphised per
//! transport: no `dyn` call and no allocation per RPC. It decodes each
//! reply with the bench program's decoders (a wrong reply fails the run),
//! records its latency in an HdrHistogram allocated before the run, and
//! measures the client thread's CPU time with `getrusage(RUSAGE_THREAD)`.

use std::time::{Duration, Instant};

use dataplane::clock::MonoClock;
use dataplane::mem::PeerBytes;
use dataplane::service::bench::{decode_data_reply, decode_ddp_reply, decode_void_reply, Args};

use crate::spec::{
    fnv1a64, fnv1a64_more, new_histogram, record_latency, BenchError, CheckReport, Idle,
    LatencySummary, Op, RunResult, RunSpec, Transport, FNV1A64_START,
};
use crate::tirpc::CpuTimes;

/// A finished call as the transport received it.
#[derive(Debug, Clone, Copy)]
pub struct Reply<'a> {
    /// The RPC reply message (RFC 5531), as received inline.
    pub message: &'a [u8],
    /// The result's bytes when they were placed directly (an RDMA write
    /// chunk); the message then carries only the length word. A view to
    /// copy from: the server wrote those bytes and could again.
    pub ddp: Option<PeerBytes<'a>>,
}

/// The client side of one transport, driven by [`drive`]. See the module
/// doc for the contract of each method.
pub trait RpcDriver {
    /// Short name (`shm`, `tcp`, ...).
    fn name(&self) -> &'static str;

    /// One line: what this is and where its server runs.
    fn describe(&self) -> String;

    /// Gets ready for `spec`: `spec.depth` call slots, buffers for
    /// `spec.size` bytes. Outside the measurement.
    ///
    /// # Errors
    /// Set-up failures ([`BenchError::Unsupported`] for a depth or size the
    /// transport cannot take).
    fn prepare(&mut self, spec: &RunSpec) -> Result<(), BenchError>;

    /// Starts one call in `slot` (`< spec.depth`, not in flight).
    ///
    /// # Errors
    /// [`BenchError::Call`] when the call cannot be posted.
    fn start(&mut self, slot: u32, args: Args<'_>) -> Result<(), BenchError>;

    /// Makes progress; calls `done` for each finished call and returns how
    /// many finished (0: nothing yet).
    ///
    /// # Errors
    /// [`BenchError::Call`] when the connection failed.
    fn poll<F: FnMut(u32, Reply<'_>)>(&mut self, done: F) -> Result<usize, BenchError>;

    /// The server's cumulative CPU time, if this driver can see it.
    fn server_cpu(&self) -> Option<CpuTimes>;

    /// RPC over RDMA: (calls sent, RDMA Reads the calls and their replies
    /// needed, each a round trip of its own) so far on this connection,
    /// for [`RunResult::round_trips_per_call`]. `None` for transports
    /// without such a notion.
    fn round_trips(&self) -> Option<(u64, u64)> {
        None
    }
}

/// Empty polls before the adaptive idle policy starts yielding the core.
const ADAPTIVE_SPINS: u32 = 256;
/// Empty polls spent yielding before the adaptive policy naps.
const ADAPTIVE_YIELDS: u32 = 16;
/// One nap of the adaptive policy.
const ADAPTIVE_NAP: Duration = Duration::from_micros(20);
/// How long [`drive`] waits for one call before it declares a hang.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// CPU time of the calling thread (`getrusage(RUSAGE_THREAD)`).
pub fn thread_cpu() -> CpuTimes {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage; RUSAGE_THREAD is Linux's.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    if rc != 0 {
        return CpuTimes::default();
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    CpuTimes {
        user_s: secs(ru.ru_utime),
        sys_s: secs(ru.ru_stime),
    }
}

/// The kernel's id of the calling thread (`gettid`), for
/// [`thread_cpu_of`]: an embedded server records it on its worker thread.
pub fn current_thread_id() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Cumulative CPU time of thread `tid` of this process, from
/// `/proc/self/task/<tid>/stat` (clock ticks, 10 ms on usual kernels):
/// what an [`RpcDriver`] with an embedded server thread returns from
/// [`server_cpu`](RpcDriver::server_cpu). `None` once the thread is gone.
pub fn thread_cpu_of(tid: i32) -> Option<CpuTimes> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    crate::tirpc::parse_stat_cpu(&stat)
}

/// The argument and its buffer for every call of a run.
struct Workload {
    op: Op,
    size: u32,
    data: Vec<u8>,
}

impl Workload {
    fn new(spec: &RunSpec) -> Workload {
        let mut data = vec![
            0u8;
            if spec.op == Op::Null {
                0
            } else {
                spec.size as usize
            }
        ];
        dataplane::service::bench::fill_pattern(&mut data);
        Workload {
            op: spec.op,
            size: spec.size,
            data,
        }
    }

    #[inline]
    fn args(&self) -> Args<'_> {
        match self.op {
            Op::Null => Args::Null,
            Op::Echo => Args::Echo(&self.data),
            Op::Read => Args::Source(self.size),
            Op::Write => Args::Sink(&self.data),
        }
    }
}

/// Decodes one reply of `op`, and returns the hash of its data when
/// `hash` is set (0 otherwise).
#[inline]
fn check_reply(op: Op, size: u32, reply: Reply<'_>, hash: bool) -> Result<u64, String> {
    match op {
        Op::Null | Op::Write => decode_void_reply(reply.message)
            .map(|()| 0)
            .map_err(|e| e.to_string()),
        Op::Echo | Op::Read => {
            let (len, h) = match reply.ddp {
                Some(ddp) => {
                    decode_ddp_reply(reply.message, ddp.len()).map_err(|e| e.to_string())?;
                    (ddp.len(), if hash { fnv1a64_peer(&ddp) } else { 0 })
                }
                None => {
                    let data = decode_data_reply(reply.message, None).map_err(|e| e.to_string())?;
                    (data.len(), if hash { fnv1a64(data) } else { 0 })
                }
            };
            if len != size as usize {
                return Err(format!("{len} result bytes, not {size}"));
            }
            Ok(h)
        }
    }
}

/// FNV-1a of bytes the peer placed, copied out a page at a time.
fn fnv1a64_peer(data: &PeerBytes<'_>) -> u64 {
    let mut piece = [0u8; 4096];
    let mut h = FNV1A64_START;
    let mut at = 0;
    while at < data.len() {
        let n = (data.len() - at).min(piece.len());
        data.read(at, &mut piece[..n]);
        h = fnv1a64_more(h, &piece[..n]);
        at += n;
    }
    h
}

/// Runs `spec` on `driver`: `spec.warmup_calls` unmeasured calls, then
/// `spec.depth` calls kept in flight for `spec.duration`; the calls still
/// in flight at the end are completed but not counted.
///
/// # Errors
/// The driver's errors; [`BenchError::Call`] for a reply that does not
/// decode as the expected success, or a call unanswered for 60 s.
pub fn drive<D: RpcDriver>(driver: &mut D, spec: &RunSpec) -> Result<RunResult, BenchError> {
    driver.prepare(spec)?;
    let name = driver.name();
    let work = Workload::new(spec);
    let depth = spec.depth.max(1);
    let mut hist = new_histogram();
    // Per-call timestamps are TSC readings (`MonoClock`, as the data path
    // reads time): two a call, where `Instant::now` would be two
    // `clock_gettime` calls taken from the client's own core.
    let clock = MonoClock::new();
    let mut started: Vec<Option<u64>> = vec![None; depth as usize];
    // Slots to restart after a poll; never grows past `depth`.
    let mut restart: Vec<u32> = Vec::with_capacity(depth as usize);
    let hash = spec.check && matches!(spec.op, Op::Read | Op::Echo);
    let (mut first_hash, mut hashed, mut differing) = (0u64, 0u64, 0u64);

    // Warm-up: one call at a time, unmeasured.
    for _ in 0..spec.warmup_calls {
        driver.start(0, work.args())?;
        wait_one(driver, spec, &work)?;
    }

    let mut failure: Option<String> = None;
    let mut calls = 0u64;
    let mut in_flight = 0u32;
    let cpu0 = thread_cpu();
    let server0 = driver.server_cpu();
    let trips0 = driver.round_trips();
    let t0 = Instant::now();
    let end = t0 + spec.duration;
    for slot in 0..depth {
        started[slot as usize] = Some(clock.raw());
        driver.start(slot, work.args())?;
        in_flight += 1;
    }
    let mut measuring = true;
    let mut idle_polls = 0u32;
    let mut last_progress = Instant::now();
    let mut t_end = t0;
    while in_flight > 0 {
        restart.clear();
        let now_measuring = measuring;
        let finished = driver.poll(|slot, reply| {
            let now = clock.raw();
            let Some(t) = started
                .get_mut(slot as usize)
                .and_then(|s: &mut Option<u64>| s.take())
            else {
                failure.get_or_insert_with(|| format!("completion for idle slot {slot}"));
                return;
            };
            in_flight -= 1;
            match check_reply(work.op, work.size, reply, hash) {
                Ok(h) => {
                    if now_measuring {
                        calls += 1;
                        record_latency(&mut hist, clock.nanos_between(t, now));
                        if hash {
                            if hashed == 0 {
                                first_hash = h;
                            } else if h != first_hash {
                                differing += 1;
                            }
                            hashed += 1;
                        }
                    }
                }
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
            if now_measuring {
                restart.push(slot);
            }
        })?;
        if let Some(reason) = failure.take() {
            return Err(BenchError::Call {
                transport: name,
                reason,
            });
        }
        if finished == 0 {
            idle(spec.idle, &mut idle_polls);
            if idle_polls % 1024 == 0 && last_progress.elapsed() > CALL_TIMEOUT {
                return Err(BenchError::Call {
                    transport: name,
                    reason: format!("no reply for {} s", CALL_TIMEOUT.as_secs()),
                });
            }
            continue;
        }
        idle_polls = 0;
        let now = Instant::now();
        last_progress = now;
        if measuring && now >= end {
            measuring = false;
            t_end = now;
        }
        if measuring {
            if !spec.gap.is_zero() && !restart.is_empty() {
                std::thread::sleep(spec.gap);
            }
            for &slot in &restart {
                started[slot as usize] = Some(clock.raw());
                driver.start(slot, work.args())?;
                in_flight += 1;
            }
        }
    }
    if measuring {
        t_end = Instant::now();
    }
    let cpu = thread_cpu().since(cpu0);
    let server = driver.server_cpu().zip(server0).map(|(a, b)| a.since(b));
    let seconds = (t_end - t0).as_secs_f64();
    let check = hash.then(|| CheckReport::new(hashed, first_hash, differing, spec.size));
    let mut result = RunResult::new(
        name,
        spec,
        seconds,
        calls,
        LatencySummary::of(&hist),
        cpu,
        server,
        check,
    );
    result.round_trips_per_call =
        driver
            .round_trips()
            .zip(trips0)
            .and_then(|((c1, r1), (c0, r0))| {
                let calls = c1.saturating_sub(c0);
                (calls > 0).then(|| 1.0 + r1.saturating_sub(r0) as f64 / calls as f64)
            });
    Ok(result)
}

/// Polls until one call finishes (warm-up).
fn wait_one<D: RpcDriver>(
    driver: &mut D,
    spec: &RunSpec,
    work: &Workload,
) -> Result<(), BenchError> {
    let t = Instant::now();
    let mut idle_polls = 0u32;
    loop {
        let mut failure = None;
        let n = driver.poll(|_, reply| {
            if let Err(e) = check_reply(work.op, work.size, reply, false) {
                failure = Some(e);
            }
        })?;
        if let Some(reason) = failure {
            return Err(BenchError::Call {
                transport: driver.name(),
                reason,
            });
        }
        if n > 0 {
            return Ok(());
        }
        idle(spec.idle, &mut idle_polls);
        if idle_polls % 1024 == 0 && t.elapsed() > CALL_TIMEOUT {
            return Err(BenchError::Call {
                transport: driver.name(),
                reason: format!("no reply for {} s (warm-up)", CALL_TIMEOUT.as_secs()),
            });
        }
    }
}

#[inline]
pub(crate) fn idle(policy: Idle, polls: &mut u32) {
    *polls = polls.wrapping_add(1);
    match policy {
        Idle::Spin => std::hint::spin_loop(),
        Idle::Adaptive if *polls < ADAPTIVE_SPINS => std::hint::spin_loop(),
        Idle::Adaptive if *polls < ADAPTIVE_SPINS + ADAPTIVE_YIELDS => std::thread::yield_now(),
        // A sleeper is woken with the scheduler's wake-up credit; a thread
        // that keeps yielding on a crowded core waits a whole scheduling
        // period (tens of ms) for its turn (docs/BENCHMARKS.md).
        Idle::Adaptive => std::thread::sleep(ADAPTIVE_NAP),
    }
}

/// An [`RpcDriver`] as a [`Transport`]: each run goes through [`drive`].
pub struct Driven<D>(D);

impl<D: RpcDriver> Driven<D> {
    /// Wraps a driver.
    pub fn new(driver: D) -> Driven<D> {
        Driven(driver)
    }
}

impl<D: RpcDriver> Transport for Driven<D> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn describe(&self) -> String {
        self.0.describe()
    }

    fn run(&mut self, spec: &RunSpec) -> Result<RunResult, BenchError> {
        drive(&mut self.0, spec)
    }
}

#[cfg(test)]
mod tests {
    // The loop's own tests, which need a driver, are in `inproc` (the
    // reference driver): this module sits below it and does not use it.
    use super::*;

    #[test]
    fn another_threads_cpu_time_is_readable() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            tx.send(current_thread_id()).unwrap();
            let _ = stop_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let cpu = thread_cpu_of(tid).expect("a live thread has a stat file");
        assert!(cpu.total_s() >= 0.0);
        assert!(thread_cpu_of(current_thread_id()).is_some());
        stop_tx.send(()).unwrap();
        worker.join().unwrap();
        assert!(thread_cpu_of(-1).is_none());
    }

    #[test]
    fn a_histogram_takes_any_sample() {
        let mut h = new_histogram();
        for ns in [0, 1, 999, u64::MAX] {
            record_latency(&mut h, ns);
        }
        let s = LatencySummary::of(&h);
        assert_eq!(s.count, 4);
        assert_eq!(s.min_ns, 1);
        assert!(s.max_ns >= crate::spec::HISTOGRAM_MAX_NS);
        assert_eq!(LatencySummary::of(&new_histogram()).count, 0);
    }
}
