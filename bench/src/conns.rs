//! `conns`: how a server scales with many idle connections.
//!
//! One run opens `count` connections to one server: one *busy* connection,
//! whose NULL latency is measured by the ordinary timed loop
//! ([`drive`]), and `count - 1` *idle* ones, each of which completes one
//! NULL call (so the server has really accepted and served it) and then
//! sits there. The latency of the busy connection is measured at a series
//! of idle counts (0, then more, up to `count - 1`) in the same run, so the
//! cost of idle connections to a busy one is one ratio. Each connect (with
//! its first NULL) is timed, and with a server pid the server's memory is
//! read before, with all connections open, and after they are closed.
//!
//! The busy connection keeps its connection across the series
//! (`keeping_connection`); the idle ones are lean
//! ([`lean_endpoint`](crate::rdma::lean_endpoint),
//! [`lean_client`](crate::tcp::lean_client)) so that this process stays small while the server
//! holds `count` connections.

use std::time::{Duration, Instant};

use serde::Serialize;

use dataplane::service::bench::{decode_void_reply, Args};
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;
use dataplane::worker::PoolProvider;

use crate::driver::{drive, RpcDriver};
use crate::rdma::RdmaDriver;
use crate::spec::{
    new_histogram, record_latency, BenchError, Idle, LatencySummary, Op, OpenOptions, RunResult,
    RunSpec,
};
use crate::tcp::TcpDriver;

/// How long one connect plus its first NULL may take before the run is
/// declared broken.
const CONNECT_DEADLINE: Duration = Duration::from_secs(10);
/// After closing: how long the server's RSS must stay unchanged to count
/// as settled, sampled every [`SETTLE_SAMPLE`], and the deadline after
/// which whatever it then is gets reported.
const SETTLE_STABLE: Duration = Duration::from_millis(500);
const SETTLE_SAMPLE: Duration = Duration::from_millis(50);
const SETTLE_DEADLINE: Duration = Duration::from_secs(10);

/// What `conns` does.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnsSpec {
    /// Connections in all (the busy one included), at least 1.
    pub count: u32,
    /// Idle-count step of the series (`None`: 0, 1, 4, 16, ... x4).
    pub step: Option<u32>,
    /// Measured time of each series point.
    pub duration: Duration,
    /// Idle policy of the busy client (and an embedded server).
    pub idle: Idle,
    /// The server's process, for its memory (`None` with an embedded
    /// server: this process).
    pub server_pid: Option<u32>,
}

/// The idle counts the series measures at: 0, `step`, `2 step`, ... or 0,
/// 1, 4, 16, 64, ... (x4); every one below `count - 1`, then `count - 1`.
pub fn idle_series(count: u32, step: Option<u32>) -> Vec<u32> {
    let last = count.saturating_sub(1);
    let mut v = vec![0u32];
    let mut next = match step {
        Some(k) => k.max(1),
        None => 1,
    };
    while next < last {
        v.push(next);
        next = match step {
            Some(k) => next.saturating_add(k.max(1)),
            None => next.saturating_mul(4),
        };
    }
    if last > 0 {
        v.push(last);
    }
    v
}

/// Memory of one process, in KiB, as `/proc/PID` reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ProcMemory {
    /// Resident 4 KiB-page memory (`smaps_rollup` Rss).
    pub rss_kib: u64,
    /// Hugetlb pages mapped (`smaps_rollup` Private_Hugetlb +
    /// Shared_Hugetlb; not part of Rss).
    pub hugetlb_kib: u64,
    /// Address space (`status` VmSize).
    pub vm_size_kib: u64,
    /// Open file descriptors (entries of `/proc/PID/fd`).
    pub fds: u64,
}

impl ProcMemory {
    /// Committed memory: Rss plus hugetlb.
    pub fn committed_kib(&self) -> u64 {
        self.rss_kib + self.hugetlb_kib
    }

    /// Reads process `pid`'s figures.
    ///
    /// # Errors
    /// [`BenchError::Io`] when `/proc/PID` cannot be read (no such
    /// process, or not ours to inspect).
    pub fn of(pid: u32) -> Result<ProcMemory, BenchError> {
        let read = |file: &str| {
            let path = format!("/proc/{pid}/{file}");
            std::fs::read_to_string(&path).map_err(|source| BenchError::Io {
                what: format!("reading {path} (the server's memory)"),
                source,
            })
        };
        let field = |text: &str, key: &str| -> u64 {
            text.lines()
                .filter_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
                .filter_map(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .sum()
        };
        let rollup = read("smaps_rollup")?;
        let status = read("status")?;
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
        Ok(ProcMemory {
            rss_kib: field(&rollup, "Rss"),
            hugetlb_kib: field(&rollup, "Private_Hugetlb") + field(&rollup, "Shared_Hugetlb"),
            vm_size_kib: field(&status, "VmSize"),
            fds,
        })
    }
}

/// The server's memory around the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryReport {
    /// The process read.
    pub pid: u32,
    /// What that process is (the server, or this process with an embedded
    /// server and every client).
    pub scope: String,
    /// Before the first connection.
    pub before: ProcMemory,
    /// With all connections open.
    pub open: ProcMemory,
    /// After all were closed and the figures settled (or the deadline).
    pub closed: ProcMemory,
    /// Whether `closed` settled (Rss unchanged for 0.5 s within 10 s).
    pub settled: bool,
    /// (open - before) committed memory / connections, bytes.
    pub committed_per_conn_bytes: f64,
    /// (open - before) address space / connections, bytes.
    pub address_space_per_conn_bytes: f64,
    /// (open - before) descriptors / connections.
    pub fds_per_conn: f64,
    /// Of the committed memory the connections added, the part given back
    /// on close, percent (100: all of it).
    pub committed_returned_pct: f64,
    /// The same for Rss alone (4 KiB pages: what the allocator may keep).
    pub rss_returned_pct: f64,
}

impl MemoryReport {
    fn new(
        pid: u32,
        scope: String,
        before: ProcMemory,
        open: ProcMemory,
        closed: ProcMemory,
        settled: bool,
        n: u32,
    ) -> MemoryReport {
        let per = |a: u64, b: u64, unit: f64| (a as f64 - b as f64) * unit / f64::from(n.max(1));
        let returned_pct = |before: u64, open: u64, closed: u64| {
            let added = open as f64 - before as f64;
            if added > 0.0 {
                100.0 * (open as f64 - closed as f64) / added
            } else {
                100.0
            }
        };
        MemoryReport {
            pid,
            scope,
            before,
            open,
            closed,
            settled,
            committed_per_conn_bytes: per(open.committed_kib(), before.committed_kib(), 1024.0),
            address_space_per_conn_bytes: per(open.vm_size_kib, before.vm_size_kib, 1024.0),
            fds_per_conn: per(open.fds, before.fds, 1.0),
            committed_returned_pct: returned_pct(
                before.committed_kib(),
                open.committed_kib(),
                closed.committed_kib(),
            ),
            rss_returned_pct: returned_pct(before.rss_kib, open.rss_kib, closed.rss_kib),
        }
    }
}

/// One point of the latency series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesPoint {
    /// Idle connections open during it.
    pub idle: u32,
    /// NULL latency of the busy connection.
    pub result: RunResult,
}

/// What `conns` measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConnsReport {
    /// Transport name.
    pub transport: String,
    /// The busy connection's description (server, cores).
    pub describe: String,
    /// Connections asked for and opened (the busy one included).
    pub count: u32,
    /// Connections whose first NULL completed (all of them, or the run
    /// failed).
    pub established: u32,
    /// Connect plus first NULL, over every connection.
    pub connect: LatencySummary,
    /// The idle counts of the series, in order.
    pub idle_counts: Vec<u32>,
    /// The busy connection's NULL latency at each idle count.
    pub series: Vec<SeriesPoint>,
    /// p50 with the most idle connections over p50 with none.
    pub p50_ratio: f64,
    /// p99 likewise.
    pub p99_ratio: f64,
    /// The server's memory, when a process to read is known.
    pub memory: Option<MemoryReport>,
    /// The limits the idle clients connect with.
    pub idle_client_limits: String,
    /// RLIMIT_NOFILE (soft, hard) after raising the soft limit.
    pub nofile_limit: (u64, u64),
}

/// Raises RLIMIT_NOFILE's soft limit to the hard one, returning (soft,
/// hard) afterwards: each connection takes descriptors (a socket, and for
/// shm memfds), and the usual soft limit of 1024 is below a thousand
/// connections.
pub fn raise_nofile_limit() -> (u64, u64) {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return (0, 0);
    }
    if rl.rlim_cur < rl.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: rl.rlim_max,
            rlim_max: rl.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass; raising the soft
        // limit up to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            rl = raised;
        }
    }
    (rl.rlim_cur, rl.rlim_max)
}

/// A client driver `conns` can use for its busy and idle connections.
pub trait ConnsDriver: RpcDriver {
    /// Closes the current connection (the driver and an embedded server
    /// stay).
    ///
    /// # Errors
    /// The close failed or leaked.
    fn close_connection(&mut self) -> Result<(), BenchError>;
}

impl<P: PoolProvider> ConnsDriver for RdmaDriver<P> {
    fn close_connection(&mut self) -> Result<(), BenchError> {
        RdmaDriver::close_connection(self)
    }
}

impl ConnsDriver for TcpDriver {
    fn close_connection(&mut self) -> Result<(), BenchError> {
        TcpDriver::close_connection(self);
        Ok(())
    }
}

/// Runs `conns` against `url` (`shm`, `roce`, `tcp` embedded, or
/// `shm://PATH`, `roce://IP:PORT`, `tcp://IP:PORT`).
///
/// # Errors
/// [`BenchError`]s of the transports; a connection that cannot be opened
/// is one [`BenchError::Unsupported`] line saying how many were and why.
pub fn run(
    url: Option<&str>,
    options: &OpenOptions,
    spec: &ConnsSpec,
) -> Result<ConnsReport, BenchError> {
    let url = url.unwrap_or("shm");
    let (scheme, rest) = url.split_once("://").unwrap_or((url, ""));
    // Idle connections are not pinned: they only connect and call once.
    let plain = OpenOptions {
        cores: None,
        ..*options
    };
    let rdma_limits =
        "rdma: 1 credit, 1 call slot, 1 KiB inline each way, 1 KiB messages, no DDP, 4 KiB pages";
    let tcp_limits = "tcp: 1 call slot, 1 KiB messages, 1 KiB read buffer";
    match scheme {
        "shm" | "roce" => {
            fn go<P: PoolProvider>(
                url: &str,
                embedded: bool,
                options: &OpenOptions,
                plain: &OpenOptions,
                spec: &ConnsSpec,
                limits: &str,
            ) -> Result<ConnsReport, BenchError> {
                let name = P::SCHEME;
                let busy = if embedded {
                    RdmaDriver::<P>::embedded(name, options)?
                } else {
                    RdmaDriver::<P>::connect(name, url, options)
                }
                .keeping_connection();
                let target = busy.url().to_owned();
                measure(
                    busy,
                    || RdmaDriver::<P>::connect(name, &target, plain).lean(),
                    embedded,
                    spec,
                    limits,
                )
            }
            if scheme == "shm" {
                go::<Shm>(url, rest.is_empty(), options, &plain, spec, rdma_limits)
            } else {
                go::<Roce>(url, rest.is_empty(), options, &plain, spec, rdma_limits)
            }
        }
        "tcp" => {
            let busy = if rest.is_empty() {
                TcpDriver::embedded(options)?
            } else {
                TcpDriver::connect(url, options)?
            }
            .keeping_connection();
            let target = busy.url();
            let embedded = busy.is_embedded();
            measure(
                busy,
                || {
                    TcpDriver::connect(&target, &plain)
                        .expect("the busy driver's own URL parses")
                        .lean()
                },
                embedded,
                spec,
                tcp_limits,
            )
        }
        other => Err(BenchError::BadUrl {
            url: url.to_owned(),
            reason: format!("conns runs over shm, roce and tcp, not `{other}`"),
        }),
    }
}

/// Connects `driver` (prepare) and completes one NULL call on it.
fn connect_and_call<D: RpcDriver>(driver: &mut D, spec: &RunSpec) -> Result<(), BenchError> {
    driver.prepare(spec)?;
    driver.start(0, Args::Null)?;
    let t0 = Instant::now();
    loop {
        let mut bad = None;
        let n = driver.poll(|_, reply| {
            if let Err(e) = decode_void_reply(reply.message) {
                bad = Some(e.to_string());
            }
        })?;
        if let Some(reason) = bad {
            return Err(BenchError::Call {
                transport: driver.name(),
                reason: format!("first NULL: {reason}"),
            });
        }
        if n > 0 {
            return Ok(());
        }
        if t0.elapsed() > CONNECT_DEADLINE {
            return Err(BenchError::Call {
                transport: driver.name(),
                reason: format!("first NULL unanswered for {} s", CONNECT_DEADLINE.as_secs()),
            });
        }
        std::thread::yield_now();
    }
}

/// One line for a connection that could not be opened: how many were,
/// why, and what to change.
fn cannot_open(
    name: &'static str,
    opened: u32,
    count: u32,
    err: &BenchError,
    nofile: (u64, u64),
    fds_per_conn: Option<f64>,
) -> BenchError {
    let text = err.to_string();
    let hint = if text.contains("Too many open files") || text.contains("EMFILE") {
        format!(
            "this process's open-file limit is {} (hard {}){}: raise the hard limit (ulimit -Hn, or LimitNOFILE= under systemd) or use a smaller --count",
            nofile.0,
            nofile.1,
            fds_per_conn.map_or(String::new(), |f| format!(", about {f:.1} descriptors per connection"))
        )
    } else if text.contains("refused")
        || text.contains("reset")
        || text.contains("closed")
        || text.contains("hang-up")
        || text.contains("Rejected")
    {
        format!(
            "the server refused or dropped it: check that its [workers] max_connections (default 1024) is at least {count}, its open-file limit (an embedded server shares this process's, {}), and its log",
            nofile.0
        )
    } else if text.contains("unanswered") {
        // The connect went through but nothing served it: a server out of
        // descriptors accepts nothing more, and the client's connect
        // still completes in the kernel's backlog.
        format!(
            "the server did not serve it: check the server's open-file limit (an embedded server shares this process's, {}) and its [workers] max_connections (default 1024) against {count}, and its log",
            nofile.0
        )
    } else {
        format!(
            "see the server's log and both sides' open-file limits (this process: {}); a smaller --count shows where it stops",
            nofile.0
        )
    };
    BenchError::Unsupported {
        transport: name,
        reason: format!(
            "opened {opened} of {count} connections; connection {} failed: {text}; {hint}",
            opened + 1
        ),
    }
}

fn measure<D: ConnsDriver>(
    mut busy: D,
    mut open_idle: impl FnMut() -> D,
    embedded: bool,
    spec: &ConnsSpec,
    idle_limits: &str,
) -> Result<ConnsReport, BenchError> {
    let name = busy.name();
    let count = spec.count.max(1);
    let nofile = raise_nofile_limit();
    let series_counts = idle_series(count, spec.step);
    let (pid, scope) = match (spec.server_pid, embedded) {
        (Some(p), _) => (Some(p), "server process (--server-pid)".to_owned()),
        (None, true) => (
            Some(std::process::id()),
            "this process: the embedded server and every client".to_owned(),
        ),
        (None, false) => (None, String::new()),
    };
    let null = {
        let mut s = RunSpec::new(Op::Null, 0, 1, Duration::ZERO);
        s.idle = spec.idle;
        s
    };
    let mut lat = RunSpec::new(Op::Null, 0, 1, spec.duration);
    lat.idle = spec.idle;
    let self_fds = || ProcMemory::of(std::process::id()).map(|m| m.fds).ok();

    let before = pid.map(ProcMemory::of).transpose()?;
    let mut connect = new_histogram();
    let fds0 = self_fds();
    let t = Instant::now();
    connect_and_call(&mut busy, &null)
        .map_err(|e| cannot_open(name, 0, count, &e, nofile, None))?;
    record_latency(&mut connect, t.elapsed().as_nanos() as u64);
    let describe = busy.describe();

    let mut idle: Vec<D> = Vec::with_capacity(count as usize - 1);
    let mut series = Vec::with_capacity(series_counts.len());
    for &target in &series_counts {
        while (idle.len() as u32) < target {
            let mut d = open_idle();
            let t = Instant::now();
            let opened = 1 + idle.len() as u32;
            if let Err(e) = connect_and_call(&mut d, &null) {
                let per = fds0
                    .zip(self_fds())
                    .map(|(a, b)| (b as f64 - a as f64) / f64::from(opened));
                return Err(cannot_open(name, opened, count, &e, nofile, per));
            }
            record_latency(&mut connect, t.elapsed().as_nanos() as u64);
            idle.push(d);
        }
        let result = drive(&mut busy, &lat)?;
        series.push(SeriesPoint {
            idle: target,
            result,
        });
    }
    let established = 1 + idle.len() as u32;
    let open = pid.map(ProcMemory::of).transpose()?;

    for mut d in idle.drain(..) {
        d.close_connection()?;
    }
    busy.close_connection()?;
    drop(idle);
    let memory = match (pid, before, open) {
        (Some(pid), Some(before), Some(open)) => {
            let (closed, settled) = settle(pid)?;
            Some(MemoryReport::new(
                pid, scope, before, open, closed, settled, count,
            ))
        }
        _ => None,
    };
    let ratio = |f: fn(&LatencySummary) -> u64| match (series.first(), series.last()) {
        (Some(a), Some(b)) if f(&a.result.latency) > 0 => {
            f(&b.result.latency) as f64 / f(&a.result.latency) as f64
        }
        _ => 0.0,
    };
    Ok(ConnsReport {
        transport: name.to_owned(),
        describe,
        count,
        established,
        connect: LatencySummary::of(&connect),
        idle_counts: series.iter().map(|p| p.idle).collect(),
        p50_ratio: ratio(|l| l.p50_ns),
        p99_ratio: ratio(|l| l.p99_ns),
        series,
        memory,
        idle_client_limits: idle_limits.to_owned(),
        nofile_limit: nofile,
    })
}

/// The process's figures once its Rss stopped changing after the closes
/// (the server frees a connection when it notices the disconnect, not when
/// our close returns), or at the deadline; and whether it settled.
fn settle(pid: u32) -> Result<(ProcMemory, bool), BenchError> {
    let start = Instant::now();
    let mut last = ProcMemory::of(pid)?;
    let mut stable_since = Instant::now();
    while start.elapsed() < SETTLE_DEADLINE {
        std::thread::sleep(SETTLE_SAMPLE);
        let now = ProcMemory::of(pid)?;
        if now.committed_kib() != last.committed_kib() || now.fds != last.fds {
            stable_since = Instant::now();
            last = now;
        } else if stable_since.elapsed() >= SETTLE_STABLE {
            return Ok((now, true));
        }
    }
    Ok((last, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_series_doubles_twice_or_steps_and_ends_at_count_minus_one() {
        assert_eq!(idle_series(1, None), vec![0]);
        assert_eq!(idle_series(2, None), vec![0, 1]);
        assert_eq!(idle_series(32, None), vec![0, 1, 4, 16, 31]);
        assert_eq!(idle_series(1024, None), vec![0, 1, 4, 16, 64, 256, 1023]);
        assert_eq!(idle_series(1025, None), vec![0, 1, 4, 16, 64, 256, 1024]);
        assert_eq!(idle_series(10, Some(4)), vec![0, 4, 8, 9]);
        assert_eq!(idle_series(9, Some(4)), vec![0, 4, 8]);
        assert_eq!(idle_series(9, Some(0)), (0..9).collect::<Vec<_>>());
    }

    #[test]
    fn this_process_memory_is_readable() {
        let m = ProcMemory::of(std::process::id()).unwrap();
        assert!(m.rss_kib > 0 && m.vm_size_kib > 0 && m.fds > 0, "{m:?}");
        assert!(ProcMemory::of(u32::MAX).is_err());
    }
}
