//! `soak`: many client processes against one running server for a long
//! time, killed and restarted at random, every reply checked.
//!
//! The parent ([`run`]) starts `conns` copies of this program as
//! `soak-client` processes, spread round-robin over the server's URLs.
//! Each client ([`client`]) loops over *phases*: it picks an operation,
//! a size and a depth at random, opens a connection for them, keeps that
//! many calls in flight for a second or so, drains, and starts again, so
//! the server sees connects and clean closes all the time, every chunk
//! path (inline, read chunks, write chunks, directed placement) and
//! every size up to `max_size`. Every `kill_every` the parent SIGKILLs
//! one client at random and starts another in its place: the server sees
//! peers vanish mid-transfer.
//!
//! Every reply is checked against the call it answers. An ECHO carries a
//! sequence number unique to that call in its first bytes, so a reply
//! delivered to the wrong call, or twice, is seen; SOURCE data must be
//! the pattern; a completion for a slot with nothing in flight is a
//! duplicate. Each client reports once a second, on one stdout line of
//! JSON ([`ClientReport`]): its totals so far and the latencies of the
//! calls since its last line (a histogram's non-empty buckets), which the
//! parent merges. A killed client's last line stands; what it did after
//! it is not counted, neither as done nor as lost.
//!
//! The parent samples the server's memory (`--server-pid`: RSS, hugetlb
//! pages, descriptors) as it goes and once more after the last client
//! has gone. The verdict ([`SoakReport::problems`]) is clean when no call
//! was lost, duplicated, misdelivered or hung, no client crashed, the
//! server lived, and its memory after the run is no larger than at the
//! end of the warm-up. Under `--faults-expected` (the chaos run, with
//! packet loss injected) a call may fail with an error, but it must still
//! end: a hang or a wrong reply is a failure all the same.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use dataplane::service::bench::{decode_data_reply, decode_ddp_reply, decode_void_reply};
use dataplane::service::bench::{fill_pattern, Args};
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;

use crate::conns::ProcMemory;
use crate::driver::{idle, Reply, RpcDriver};
use crate::rdma::RdmaDriver;
use crate::spec::{
    new_histogram, record_latency, BenchError, Idle, LatencySummary, Op, OpenOptions, RunSpec,
};
use crate::tcp::TcpDriver;

/// How long a call may stay unanswered before the client declares it
/// hung. A call that fails is not hung: it ended with an error. Go-back-N
/// retries with seven retransmissions of a 64 ms timeout, doubling, end
/// well inside this.
pub const CALL_DEADLINE: Duration = Duration::from_secs(30);
/// How often a client reports.
const REPORT_EVERY: Duration = Duration::from_secs(1);
/// The sizes a phase picks from (those up to `max_size`).
const SIZES: [u32; 9] = [8, 100, 1000, 4096, 9000, 16384, 65536, 131072, 262144];
/// The depths a phase picks from (those up to `max_depth`).
const DEPTHS: [u32; 4] = [1, 2, 8, 16];
/// How long the parent waits for its clients past the run's end before
/// it kills them and counts them hung.
const EXIT_GRACE: Duration = Duration::from_secs(60);
/// After the last client: how long the server gets to close what the
/// clients left behind, before the final memory sample.
const SETTLE: Duration = Duration::from_secs(10);

/// What `soak` does.
#[derive(Debug, Clone)]
pub struct SoakSpec {
    /// The server's URLs (`shm://PATH`, `roce://IP:PORT`, `tcp://IP:PORT`);
    /// clients are spread over them round-robin.
    pub urls: Vec<String>,
    /// Client processes alive at once.
    pub conns: u32,
    /// How long the run lasts.
    pub duration: Duration,
    /// SIGKILL one client at random this often (`None`: never).
    pub kill_every: Option<Duration>,
    /// The server's process, for its memory and its liveness.
    pub server_pid: Option<u32>,
    /// Largest argument or result of a call.
    pub max_size: u32,
    /// Deepest a phase goes (the server's credits bound it).
    pub max_depth: u32,
    /// Sample the server's memory this often.
    pub sample_every: Duration,
    /// Seed of every random choice (clients get seeds derived from it).
    pub seed: u64,
    /// Calls may fail with a clean error (packet loss is being injected).
    pub faults_expected: bool,
}

/// xorshift64*: the soak's choices need to be varied and reproducible
/// from a seed, not unpredictable.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value; zero is remapped).
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15 | 1)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value below `n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A client's totals, as it reports them (cumulative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Calls answered with the right reply.
    pub ok: u64,
    /// Calls that ended with an error (the connection failed under them).
    pub failed: u64,
    /// Calls unanswered for [`CALL_DEADLINE`].
    pub hung: u64,
    /// Completions for a slot with no call in flight.
    pub duplicated: u64,
    /// Replies that do not answer their call (wrong data, wrong sequence
    /// number, undecodable).
    pub wrong: u64,
    /// Connections opened.
    pub connects: u64,
    /// Connection attempts that failed.
    pub connect_errors: u64,
    /// Starts deferred because every call slot was in use (a Send not
    /// yet acknowledged holds its slot after its reply arrived).
    #[serde(default)]
    pub busy: u64,
}

impl Totals {
    fn add(&mut self, o: &Totals) {
        self.ok += o.ok;
        self.failed += o.failed;
        self.hung += o.hung;
        self.duplicated += o.duplicated;
        self.wrong += o.wrong;
        self.connects += o.connects;
        self.connect_errors += o.connect_errors;
        self.busy += o.busy;
    }
}

/// One line of a client's stdout.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClientReport {
    /// Totals so far.
    pub totals: Totals,
    /// Latencies (ns) of the calls answered since the previous line, as
    /// `[value, count]` pairs of a histogram's non-empty buckets.
    pub latencies: Vec<(u64, u64)>,
    /// The last error seen, if any.
    pub last_error: Option<String>,
    /// This is the client's last line (it is exiting normally).
    pub last: bool,
}

/// The state of one phase's slot.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    seq: u64,
    started: Instant,
}

/// A client: phases until `duration` has passed, reporting on `out`.
///
/// # Errors
/// A URL this bench cannot parse; everything else is counted, not
/// returned.
pub fn client(
    url: &str,
    duration: Duration,
    seed: u64,
    max_size: u32,
    max_depth: u32,
    out: &mut dyn Write,
) -> Result<(), BenchError> {
    let options = OpenOptions {
        cores: None,
        idle: Idle::Adaptive,
        server_pid: None,
        extensions: dataplane::engine::Extensions::EMPTY,
        bulk_in_messages: false,
    };
    let scheme = url.split_once("://").map_or(url, |(s, _)| s);
    let mut state = ClientState::new(seed, max_size, max_depth, Instant::now() + duration);
    match scheme {
        "shm" => state.run(&mut RdmaDriver::<Shm>::connect("shm", url, &options), out),
        "roce" => state.run(&mut RdmaDriver::<Roce>::connect("roce", url, &options), out),
        "tcp" => state.run(&mut TcpDriver::connect(url, &options)?, out),
        other => Err(BenchError::BadUrl {
            url: url.to_owned(),
            reason: format!("soak runs over shm, roce and tcp, not `{other}`"),
        }),
    }
}

struct ClientState {
    rng: Rng,
    max_size: u32,
    max_depth: u32,
    end: Instant,
    totals: Totals,
    hist: hdrhistogram::Histogram<u64>,
    last_error: Option<String>,
    last_report: Instant,
    /// The next ECHO's sequence number (unique within this client).
    next_seq: u64,
    /// The SOURCE pattern, to check READ results against.
    pattern: Vec<u8>,
    /// ECHO arguments, one per slot; their first 8 bytes are the call's
    /// sequence number.
    payloads: Vec<Vec<u8>>,
    /// A reply's data, copied out of the peer's memory.
    scratch: Vec<u8>,
}

impl ClientState {
    fn new(seed: u64, max_size: u32, max_depth: u32, end: Instant) -> ClientState {
        let mut pattern = vec![0u8; max_size as usize];
        fill_pattern(&mut pattern);
        ClientState {
            rng: Rng::new(seed),
            max_size,
            max_depth: max_depth.max(1),
            end,
            totals: Totals::default(),
            hist: new_histogram(),
            last_error: None,
            last_report: Instant::now(),
            next_seq: 1,
            pattern,
            payloads: Vec::new(),
            scratch: Vec::with_capacity(max_size as usize),
        }
    }

    fn run<D: RpcDriver>(&mut self, driver: &mut D, out: &mut dyn Write) -> Result<(), BenchError> {
        while Instant::now() < self.end {
            let spec = self.pick_phase();
            match driver.prepare(&spec) {
                Ok(()) => self.totals.connects += 1,
                Err(e) => {
                    self.totals.connect_errors += 1;
                    self.last_error = Some(e.to_string());
                    self.report(out, false);
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
            let phase_end = (Instant::now() + spec.duration).min(self.end);
            self.phase(driver, &spec, phase_end, out);
            self.report(out, false);
        }
        self.report(out, true);
        Ok(())
    }

    fn pick_phase(&mut self) -> RunSpec {
        let op = [Op::Null, Op::Echo, Op::Read, Op::Write][self.rng.below(4) as usize];
        let sizes: Vec<u32> = SIZES
            .iter()
            .copied()
            .filter(|&s| s <= self.max_size)
            .collect();
        let size = if sizes.is_empty() {
            self.max_size.max(8)
        } else {
            sizes[self.rng.below(sizes.len() as u64) as usize]
        };
        let depths: Vec<u32> = DEPTHS
            .iter()
            .copied()
            .filter(|&d| d <= self.max_depth)
            .collect();
        let depth = depths[self.rng.below(depths.len() as u64) as usize];
        let millis = 300 + self.rng.below(1200);
        let mut spec = RunSpec::new(op, size, depth, Duration::from_millis(millis));
        spec.warmup_calls = 0;
        spec
    }

    /// One phase: `spec.depth` calls in flight until `phase_end`, then
    /// drained. Ends early when the connection fails or a call hangs.
    fn phase<D: RpcDriver>(
        &mut self,
        driver: &mut D,
        spec: &RunSpec,
        phase_end: Instant,
        out: &mut dyn Write,
    ) {
        let depth = spec.depth as usize;
        if spec.op == Op::Echo {
            self.payloads.resize_with(depth, Vec::new);
            for p in &mut self.payloads[..depth] {
                p.resize(spec.size as usize, 0);
                fill_pattern(p);
            }
        }
        let mut slots: Vec<Option<InFlight>> = vec![None; depth];
        let mut in_flight = 0u64;
        let mut polls = 0u32;
        let mut last_progress = Instant::now();
        let mut starting = true;
        loop {
            if starting && Instant::now() >= phase_end {
                starting = false;
            }
            // A start refused for want of a call slot: polled for below,
            // like a call in flight.
            let mut deferred = false;
            if starting {
                for (slot, entry) in slots.iter_mut().enumerate() {
                    if entry.is_some() {
                        continue;
                    }
                    match self.start(driver, spec, slot) {
                        Ok(s) => {
                            *entry = Some(s);
                            in_flight += 1;
                        }
                        // Back-pressure: this slot starts after a
                        // completion frees room (polled below).
                        Err(BenchError::Busy { .. }) => {
                            self.totals.busy += 1;
                            deferred = true;
                            break;
                        }
                        Err(e) => {
                            self.connection_failed(e, &mut in_flight);
                            return;
                        }
                    }
                }
            }
            if in_flight == 0 && !deferred {
                return;
            }
            let mut done = 0u64;
            let result = {
                let (totals, hist) = (&mut self.totals, &mut self.hist);
                let (payloads, pattern, scratch) =
                    (&self.payloads, &self.pattern, &mut self.scratch);
                driver.poll(|slot, reply| {
                    let Some(call) = slots.get_mut(slot as usize).and_then(Option::take) else {
                        totals.duplicated += 1;
                        return;
                    };
                    done += 1;
                    let expect = match spec.op {
                        Op::Echo => Expect::Echo(&payloads[slot as usize], call.seq),
                        Op::Read => Expect::Data(&pattern[..spec.size as usize]),
                        Op::Null | Op::Write => Expect::Void,
                    };
                    if reply_answers(reply, expect, scratch) {
                        totals.ok += 1;
                        record_latency(hist, call.started.elapsed().as_nanos() as u64);
                    } else {
                        totals.wrong += 1;
                    }
                })
            };
            in_flight -= done.min(in_flight);
            if let Err(e) = result {
                self.connection_failed(e, &mut in_flight);
                return;
            }
            if done > 0 {
                polls = 0;
                last_progress = Instant::now();
            } else {
                idle(Idle::Adaptive, &mut polls);
                if polls % 1024 == 0 && last_progress.elapsed() > CALL_DEADLINE {
                    // A slot that never frees is a hang too.
                    self.totals.hung += in_flight.max(u64::from(deferred));
                    self.last_error = Some(format!(
                        "{in_flight} call(s) of {:?} {} B at depth {} unanswered for {} s",
                        spec.op,
                        spec.size,
                        spec.depth,
                        CALL_DEADLINE.as_secs()
                    ));
                    // The next phase's prepare drops this connection.
                    return;
                }
            }
            if self.last_report.elapsed() >= REPORT_EVERY {
                self.report(out, false);
            }
        }
    }

    fn start<D: RpcDriver>(
        &mut self,
        driver: &mut D,
        spec: &RunSpec,
        slot: usize,
    ) -> Result<InFlight, BenchError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let args = match spec.op {
            Op::Null => Args::Null,
            Op::Read => Args::Source(spec.size),
            Op::Write => Args::Sink(&self.pattern[..spec.size as usize]),
            Op::Echo => {
                let p = &mut self.payloads[slot];
                let n = p.len().min(8);
                p[..n].copy_from_slice(&seq.to_be_bytes()[..n]);
                Args::Echo(p)
            }
        };
        let started = Instant::now();
        driver.start(slot as u32, args)?;
        Ok(InFlight { seq, started })
    }

    /// The connection failed under `in_flight` calls: they ended with an
    /// error (a client killed elsewhere must never cause this).
    fn connection_failed(&mut self, e: BenchError, in_flight: &mut u64) {
        self.totals.failed += (*in_flight).max(1);
        *in_flight = 0;
        self.last_error = Some(e.to_string());
    }

    fn report(&mut self, out: &mut dyn Write, last: bool) {
        let report = ClientReport {
            totals: self.totals,
            latencies: self
                .hist
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect(),
            last_error: self.last_error.take(),
            last,
        };
        self.hist.reset();
        self.last_report = Instant::now();
        if let Ok(line) = serde_json::to_string(&report) {
            // A parent that went away cannot be told; the run ends anyway.
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
}

/// What a reply must be.
#[derive(Clone, Copy)]
enum Expect<'a> {
    /// A void result.
    Void,
    /// These bytes (SOURCE).
    Data(&'a [u8]),
    /// The call's own argument, which starts with its sequence number.
    Echo(&'a [u8], u64),
}

/// Whether `reply` answers a call that expects `expect`.
fn reply_answers(reply: Reply<'_>, expect: Expect<'_>, scratch: &mut Vec<u8>) -> bool {
    let want: &[u8] = match expect {
        Expect::Void => return decode_void_reply(reply.message).is_ok(),
        Expect::Data(d) => d,
        Expect::Echo(p, seq) => {
            let n = p.len().min(8);
            if p[..n] != seq.to_be_bytes()[..n] {
                // Our own payload was overwritten: a bug in this client.
                return false;
            }
            p
        }
    };
    let got: &[u8] = match reply.ddp {
        Some(ddp) => {
            if decode_ddp_reply(reply.message, ddp.len()).is_err() || ddp.len() != want.len() {
                return false;
            }
            scratch.resize(ddp.len(), 0);
            ddp.read(0, scratch);
            scratch
        }
        None => match decode_data_reply(reply.message, None) {
            Ok(d) => d,
            Err(_) => return false,
        },
    };
    got == want
}

/// One server memory sample.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Seconds since the run started.
    pub at_s: f64,
    /// Client processes alive.
    pub clients: u32,
    /// The server's figures.
    pub memory: ProcMemory,
}

/// The run's result.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    /// The seed (rerun with it to repeat the choices).
    pub seed: u64,
    /// Seconds run.
    pub seconds: f64,
    /// Totals over every client.
    pub totals: Totals,
    /// Totals per URL.
    pub per_url: BTreeMap<String, Totals>,
    /// Clients killed on purpose.
    pub killed: u64,
    /// Clients started (the first ones and every replacement).
    pub started: u64,
    /// Clients that exited with an error, or were killed by anything but
    /// us, or had to be killed after the run's end.
    pub crashed: u64,
    /// Latency of every answered call.
    pub latency: LatencySummary,
    /// 99.9th percentile latency (ns).
    pub p999_ns: u64,
    /// The server's memory over time.
    pub samples: Vec<Sample>,
    /// The sample taken at the end of the warm-up (a fifth of the run).
    pub warm: Option<Sample>,
    /// The sample taken after the last client had gone and the server
    /// settled.
    pub after: Option<Sample>,
    /// Whether the server was alive at the end.
    pub server_alive: bool,
    /// Some of the last errors the clients reported, with their URL.
    pub errors: Vec<String>,
}

/// Memory growth the verdict tolerates between the warm-up and the end:
/// allocator slack, not a leak.
const MEMORY_SLACK_KIB: u64 = 32 * 1024;

impl SoakReport {
    /// What went wrong, one line each; empty when the run is clean.
    pub fn problems(&self, faults_expected: bool) -> Vec<String> {
        let t = &self.totals;
        let mut p = Vec::new();
        if t.ok == 0 {
            p.push("no call was answered".to_owned());
        }
        if t.failed > 0 && !faults_expected {
            p.push(format!("{} call(s) failed", t.failed));
        }
        if t.hung > 0 {
            p.push(format!("{} call(s) hung", t.hung));
        }
        if t.duplicated > 0 {
            p.push(format!("{} duplicated completion(s)", t.duplicated));
        }
        if t.wrong > 0 {
            p.push(format!("{} wrong repl(ies)", t.wrong));
        }
        if self.crashed > 0 {
            p.push(format!("{} client(s) crashed or hung", self.crashed));
        }
        if !self.server_alive {
            p.push("the server died".to_owned());
        }
        if let (Some(w), Some(a)) = (&self.warm, &self.after) {
            let (w, a) = (w.memory, a.memory);
            if a.rss_kib > w.rss_kib + w.rss_kib / 10 + MEMORY_SLACK_KIB {
                p.push(format!(
                    "server RSS grew from {} to {} KiB",
                    w.rss_kib, a.rss_kib
                ));
            }
            if a.hugetlb_kib > w.hugetlb_kib {
                p.push(format!(
                    "server hugetlb grew from {} to {} KiB",
                    w.hugetlb_kib, a.hugetlb_kib
                ));
            }
            if a.fds > w.fds {
                p.push(format!(
                    "server descriptors grew from {} to {}",
                    w.fds, a.fds
                ));
            }
        }
        p
    }
}

/// One client process as the parent sees it.
struct Running {
    child: Child,
    url: usize,
    /// The thread that reads its stdout; it ends at the pipe's end.
    reader: Option<std::thread::JoinHandle<()>>,
    /// Its latest totals.
    totals: Totals,
    /// It sent its last line (it ran to the end).
    finished: bool,
}

impl Running {
    /// Waits for the process until `deadline` (killing it then), then for
    /// its reader, so that every line it wrote is in the channel. Returns
    /// whether it exited with success on its own.
    fn reap(&mut self, deadline: Instant) -> bool {
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => break None,
            }
        };
        if status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        status.is_some_and(|s| s.success())
    }
}

/// Runs the soak: `spec.conns` client processes of `exe` (this program,
/// whose `soak-client` subcommand is [`client`]).
///
/// # Errors
/// [`BenchError::Io`] when a client cannot be started.
pub fn run(spec: &SoakSpec, exe: &std::path::Path) -> Result<SoakReport, BenchError> {
    let t0 = Instant::now();
    let end = t0 + spec.duration;
    let mut rng = Rng::new(spec.seed);
    let (tx, rx) = mpsc::channel::<(u64, ClientReport)>();
    let mut running: BTreeMap<u64, Running> = BTreeMap::new();
    let mut per_url: BTreeMap<String, Totals> = BTreeMap::new();
    let mut hist = new_histogram();
    let mut report = SoakReport {
        seed: spec.seed,
        seconds: 0.0,
        totals: Totals::default(),
        per_url: BTreeMap::new(),
        killed: 0,
        started: 0,
        crashed: 0,
        latency: LatencySummary::default(),
        p999_ns: 0,
        samples: Vec::new(),
        warm: None,
        after: None,
        server_alive: true,
        errors: Vec::new(),
    };
    let spawn = |id: u64, url: usize, rng: &mut Rng| -> Result<Running, BenchError> {
        let secs = end.saturating_duration_since(Instant::now()).as_secs_f64();
        let mut child = Command::new(exe)
            .args(["soak-client", "--url", &spec.urls[url]])
            .args(["--secs", &format!("{secs:.3}")])
            .args(["--seed", &rng.next_u64().to_string()])
            .args(["--max-size", &spec.max_size.to_string()])
            .args(["--max-depth", &spec.max_depth.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| BenchError::Io {
                what: format!("starting a soak client ({})", exe.display()),
                source,
            })?;
        let reader = child.stdout.take().map(|stdout| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Ok(r) = serde_json::from_str::<ClientReport>(&line) {
                        if tx.send((id, r)).is_err() {
                            break;
                        }
                    }
                }
            })
        });
        Ok(Running {
            child,
            url,
            reader,
            totals: Totals::default(),
            finished: false,
        })
    };
    let sample = |clients: usize| -> Option<Sample> {
        let pid = spec.server_pid?;
        ProcMemory::of(pid).ok().map(|memory| Sample {
            at_s: t0.elapsed().as_secs_f64(),
            clients: clients as u32,
            memory,
        })
    };
    // A report updates its client's totals and the latency histogram.
    let absorb = |running: &mut BTreeMap<u64, Running>,
                  hist: &mut hdrhistogram::Histogram<u64>,
                  errors: &mut Vec<String>,
                  (id, r): (u64, ClientReport)| {
        for &(v, n) in &r.latencies {
            let _ = hist.record_n(v, n);
        }
        if let Some(c) = running.get_mut(&id) {
            c.totals = r.totals;
            c.finished |= r.last;
            if let Some(e) = r.last_error {
                if errors.len() >= 20 {
                    errors.remove(0);
                }
                errors.push(format!("{}: {e}", spec.urls[c.url]));
            }
        }
    };
    // A client that is gone adds its last totals to the run's.
    let retire = |c: Running, per_url: &mut BTreeMap<String, Totals>| {
        per_url
            .entry(spec.urls[c.url].clone())
            .or_default()
            .add(&c.totals);
    };

    let mut next_id = 0u64;
    for i in 0..spec.conns {
        let url = i as usize % spec.urls.len();
        running.insert(next_id, spawn(next_id, url, &mut rng)?);
        next_id += 1;
    }
    report.started = u64::from(spec.conns);
    let mut next_kill = spec.kill_every.map(|k| t0 + k);
    let mut next_sample = t0;
    let warm_at = t0 + spec.duration / 5;

    // The run: absorb reports, kill and replace, sample.
    loop {
        // Wait for a report for at most a tick, then take what else is
        // there: the kills and samples below run every tick, however
        // busy the clients are.
        if let Ok(m) = rx.recv_timeout(Duration::from_millis(100)) {
            absorb(&mut running, &mut hist, &mut report.errors, m);
        }
        while let Ok(m) = rx.try_recv() {
            absorb(&mut running, &mut hist, &mut report.errors, m);
        }
        let now = Instant::now();
        if now >= end {
            break;
        }
        if let Some(pid) = spec.server_pid {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                report.server_alive = false;
                break;
            }
        }
        if next_kill.is_some_and(|k| now >= k) {
            next_kill = spec.kill_every.map(|k| now + k);
            let ids: Vec<u64> = running.keys().copied().collect();
            if !ids.is_empty() && end.saturating_duration_since(now) > Duration::from_secs(1) {
                let id = ids[rng.below(ids.len() as u64) as usize];
                if let Some(c) = running.get_mut(&id) {
                    c.reap(now); // past its deadline: killed at once
                }
                // Whatever it reported before it died stands.
                while let Ok(m) = rx.try_recv() {
                    absorb(&mut running, &mut hist, &mut report.errors, m);
                }
                if let Some(c) = running.remove(&id) {
                    let url = c.url;
                    retire(c, &mut per_url);
                    report.killed += 1;
                    running.insert(next_id, spawn(next_id, url, &mut rng)?);
                    next_id += 1;
                    report.started += 1;
                }
            }
        }
        if now >= next_sample {
            next_sample = now + spec.sample_every;
            if let Some(s) = sample(running.len()) {
                report.samples.push(s);
            }
        }
        if report.warm.is_none() && now >= warm_at {
            report.warm = sample(running.len());
        }
    }

    // The end: every client exits on its own within EXIT_GRACE, having
    // written its last line.
    let deadline = Instant::now() + EXIT_GRACE;
    let mut exited_well = BTreeMap::new();
    for (id, c) in running.iter_mut() {
        exited_well.insert(*id, c.reap(deadline));
    }
    drop(tx);
    while let Ok(m) = rx.try_recv() {
        absorb(&mut running, &mut hist, &mut report.errors, m);
    }
    for (id, c) in std::mem::take(&mut running) {
        if !c.finished || !exited_well.get(&id).copied().unwrap_or(false) {
            report.crashed += 1;
        }
        retire(c, &mut per_url);
    }
    report.seconds = t0.elapsed().as_secs_f64();
    if let Some(pid) = spec.server_pid {
        report.server_alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        // The server closes what killed clients left (a dead shm or TCP
        // peer at once, a silent roce peer on its timers): wait until its
        // descriptors are back to the warm-up's count, or SETTLE.
        let settle_end = Instant::now() + SETTLE;
        loop {
            let s = sample(0);
            let settled = match (&s, &report.warm) {
                (Some(s), Some(w)) => s.memory.fds <= w.memory.fds,
                _ => true,
            };
            if settled || Instant::now() >= settle_end {
                report.after = s;
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    for t in per_url.values() {
        report.totals.add(t);
    }
    report.per_url = per_url;
    report.latency = LatencySummary::of(&hist);
    report.p999_ns = if hist.is_empty() {
        0
    } else {
        hist.value_at_quantile(0.999)
    };
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_repeats_from_its_seed_and_stays_below_its_bound() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..1000 {
            let x = a.below(10);
            assert_eq!(x, b.below(10));
            assert!(x < 10);
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
        assert_ne!(Rng::new(0).next_u64(), 0);
    }

    #[test]
    fn a_clean_report_has_no_problems_and_each_fault_is_named() {
        let mut r = SoakReport {
            seed: 1,
            seconds: 1.0,
            totals: Totals {
                ok: 10,
                ..Totals::default()
            },
            per_url: BTreeMap::new(),
            killed: 0,
            started: 1,
            crashed: 0,
            latency: LatencySummary::default(),
            p999_ns: 0,
            samples: Vec::new(),
            warm: None,
            after: None,
            server_alive: true,
            errors: Vec::new(),
        };
        assert!(r.problems(false).is_empty());
        r.totals.failed = 2;
        assert_eq!(r.problems(false), vec!["2 call(s) failed".to_owned()]);
        assert!(r.problems(true).is_empty());
        r.totals.hung = 1;
        r.totals.duplicated = 3;
        assert_eq!(r.problems(true).len(), 2);
    }
}
