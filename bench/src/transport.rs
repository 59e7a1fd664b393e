//! What a benchmark run is, what it reports, and the transports that run
//! it.
//!
//! A run is a [`RunSpec`] (operation, size, depth, duration, idle policy,
//! whether to check reply bytes) handed to a [`Transport`], which returns a
//! [`RunResult`]. Dispatch through `dyn Transport` happens once per run;
//! the timed loop inside is the transport's own, monomorphised code:
//!
//! * in-process clients (RPC over RDMA over `shm`, RPC over TCP, the
//!   [`inproc`](crate::inproc) reference) implement
//!   [`RpcDriver`](crate::driver::RpcDriver) and are wrapped in
//!   [`Driven`](crate::driver::Driven), whose generic loop
//!   ([`drive`](crate::driver::drive)) keeps `depth` calls in flight,
//!   timestamps each, and records latencies into an HdrHistogram with no
//!   allocation and no dynamic dispatch per call;
//! * the libtirpc baseline ([`TirpcTransport`]) runs its loop in the C
//!   client process and reports the same figures.
//!
//! [`open`] maps a `--connect` URL (or none: the embedded default) to a
//! transport: `shm` and `roce` are [`RdmaDriver`](crate::rdma::RdmaDriver)s,
//! `tcp` a [`TcpDriver`](crate::tcp::TcpDriver), each with an embedded
//! server when the URL names no address. How to plug another one in is in
//! the [`driver`](crate::driver) module doc.

use std::time::Duration;

use serde::Serialize;

use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;

use crate::driver::Driven;
use crate::rdma::RdmaDriver;
use crate::tcp::TcpDriver;
use crate::tirpc::{self, CpuTimes, Proc, TirpcError, TirpcResult, TirpcServer, Workload};

/// The operation of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// NULL calls (no arguments, no results).
    Null,
    /// ECHO of `size` bytes.
    Echo,
    /// SOURCE(`size`): the server sends `size` bytes (over RDMA: a write
    /// chunk the client provides).
    Read,
    /// SINK of `size` bytes: the client sends them (over RDMA: a read
    /// chunk the server pulls).
    Write,
}

impl Op {
    /// Its name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Op::Null => "null",
            Op::Echo => "echo",
            Op::Read => "read",
            Op::Write => "write",
        }
    }

    /// Payload bytes moved by one call of `size` (ECHO counts one way).
    pub fn bytes_per_call(self, size: u32) -> u64 {
        match self {
            Op::Null => 0,
            Op::Echo | Op::Read | Op::Write => u64::from(size),
        }
    }
}

/// How an idle poller waits for the next completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Idle {
    /// Spin a while, then yield the core (`std::thread::yield_now`) while
    /// nothing completes: polite on shared machines; tests use it.
    #[default]
    Adaptive,
    /// Busy-poll without ever yielding (`--spin`): lowest latency when the
    /// cores are dedicated.
    Spin,
}

/// One run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    /// What each call does.
    pub op: Op,
    /// Bytes per call (ignored for [`Op::Null`]).
    pub size: u32,
    /// Calls in flight (1 for latency).
    pub depth: u32,
    /// Measured time.
    pub duration: Duration,
    /// Calls made before the measurement starts (per run, not per slot).
    pub warmup_calls: u32,
    /// Idle policy of the client (and of an embedded server that polls).
    pub idle: Idle,
    /// Hash every reply's data bytes and report it ([`CheckReport`]); adds
    /// a pass over the bytes to each call, so off by default.
    pub check: bool,
}

impl RunSpec {
    /// A run of `op` at `size` and `depth` for `duration`, adaptive idle,
    /// no checking, 100 warm-up calls.
    pub fn new(op: Op, size: u32, depth: u32, duration: Duration) -> RunSpec {
        RunSpec {
            op,
            size: if op == Op::Null { 0 } else { size },
            depth: depth.max(1),
            duration,
            warmup_calls: 100,
            idle: Idle::Adaptive,
            check: false,
        }
    }
}

/// Latency percentiles of the measured calls, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Calls recorded.
    pub count: u64,
    /// Smallest.
    pub min_ns: u64,
    /// Arithmetic mean.
    pub mean_ns: f64,
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest.
    pub max_ns: u64,
}

/// Highest latency the histograms track (60 s); larger samples saturate.
pub const HISTOGRAM_MAX_NS: u64 = 60_000_000_000;

/// A histogram for per-call latencies: 1 ns to [`HISTOGRAM_MAX_NS`], 3
/// significant digits (0.1 % resolution), allocated once per run.
pub fn new_histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, HISTOGRAM_MAX_NS, 3)
        .expect("constant bounds are valid")
}

/// Records one latency, clamped into the histogram's range (never fails).
#[inline]
pub fn record_latency(h: &mut hdrhistogram::Histogram<u64>, ns: u64) {
    h.saturating_record(ns.clamp(1, HISTOGRAM_MAX_NS));
}

impl LatencySummary {
    /// The percentiles of a histogram.
    pub fn of(h: &hdrhistogram::Histogram<u64>) -> LatencySummary {
        if h.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: h.len(),
            min_ns: h.min(),
            mean_ns: h.mean(),
            p50_ns: h.value_at_quantile(0.50),
            p90_ns: h.value_at_quantile(0.90),
            p99_ns: h.value_at_quantile(0.99),
            p999_ns: h.value_at_quantile(0.999),
            max_ns: h.max(),
        }
    }
}

/// CPU time of one side over the measured interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuReport {
    /// User seconds.
    pub user_s: f64,
    /// System seconds.
    pub sys_s: f64,
    /// User plus system.
    pub total_s: f64,
    /// `total_s` per 10^9 payload bytes (`None` without payload).
    pub s_per_gb: Option<f64>,
    /// `total_s` over the wall time, in percent of one core.
    pub utilization_pct: f64,
}

impl CpuReport {
    /// From CPU times, the payload bytes moved and the wall seconds.
    pub fn new(cpu: CpuTimes, bytes: u64, seconds: f64) -> CpuReport {
        let total = cpu.total_s().max(0.0);
        CpuReport {
            user_s: cpu.user_s.max(0.0),
            sys_s: cpu.sys_s.max(0.0),
            total_s: total,
            s_per_gb: (bytes > 0).then(|| total / (bytes as f64 / 1e9)),
            utilization_pct: if seconds > 0.0 {
                100.0 * total / seconds
            } else {
                0.0
            },
        }
    }
}

/// FNV-1a, 64 bits: the reply hash of a checked run (the C client's
/// `--check` computes the same).
pub fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The hash of `size` SOURCE pattern bytes: what every checked READ or
/// ECHO reply must hash to.
pub fn pattern_hash(size: u32) -> u64 {
    let mut data = vec![0u8; size as usize];
    dataplane::service::bench::fill_pattern(&mut data);
    fnv1a64(&data)
}

/// Reply bytes checked against the SOURCE pattern (a [`RunSpec::check`]
/// run of [`Op::Read`] or [`Op::Echo`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    /// Replies hashed.
    pub replies: u64,
    /// Hash of the first reply's data bytes.
    pub first_fnv1a64: u64,
    /// Replies whose hash differed from the first's.
    pub differing: u64,
    /// Hash of the pattern ([`pattern_hash`]).
    pub expected_fnv1a64: u64,
    /// `replies > 0`, no reply differed and the first matched the pattern.
    pub ok: bool,
}

impl CheckReport {
    /// Compares what a client saw with the pattern of `size` bytes.
    pub fn new(replies: u64, first: u64, differing: u64, size: u32) -> CheckReport {
        let expected = pattern_hash(size);
        CheckReport {
            replies,
            first_fnv1a64: first,
            differing,
            expected_fnv1a64: expected,
            ok: replies > 0 && differing == 0 && first == expected,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    /// The transport's name (`tirpc`, `shm`, ...).
    pub transport: String,
    /// The operation.
    pub op: Op,
    /// Bytes per call.
    pub size: u32,
    /// Calls in flight.
    pub depth: u32,
    /// Idle policy.
    pub idle: Idle,
    /// Measured wall time.
    pub seconds: f64,
    /// Calls completed in it.
    pub calls: u64,
    /// Payload bytes moved (`calls * size`; 0 for NULL).
    pub bytes: u64,
    /// Calls per second.
    pub calls_per_s: f64,
    /// 10^6 payload bytes per second.
    pub mb_per_s: f64,
    /// Per-call latency (issue to completion).
    pub latency: LatencySummary,
    /// The client's CPU time.
    pub client_cpu: CpuReport,
    /// The server's CPU time, when it can be measured (an embedded server
    /// or a local process; not a remote `--connect` server).
    pub server_cpu: Option<CpuReport>,
    /// Reply check, for checked runs.
    pub check: Option<CheckReport>,
}

impl RunResult {
    /// Fills the derived figures from the raw ones.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        transport: &str,
        spec: &RunSpec,
        seconds: f64,
        calls: u64,
        latency: LatencySummary,
        client: CpuTimes,
        server: Option<CpuTimes>,
        check: Option<CheckReport>,
    ) -> RunResult {
        let bytes = calls * spec.op.bytes_per_call(spec.size);
        let per_s = |x: f64| if seconds > 0.0 { x / seconds } else { 0.0 };
        RunResult {
            transport: transport.to_owned(),
            op: spec.op,
            size: spec.size,
            depth: spec.depth,
            idle: spec.idle,
            seconds,
            calls,
            bytes,
            calls_per_s: per_s(calls as f64),
            mb_per_s: per_s(bytes as f64 / 1e6),
            latency,
            client_cpu: CpuReport::new(client, bytes, seconds),
            server_cpu: server.map(|s| CpuReport::new(s, bytes, seconds)),
            check,
        }
    }
}

/// Errors of a benchmark run. Each names what was being done.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The URL is not one this bench understands.
    #[error("cannot parse --connect {url:?}: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The spec asks for something this transport cannot do.
    #[error("{transport}: {reason}")]
    Unsupported {
        /// The transport.
        transport: &'static str,
        /// What and why.
        reason: String,
    },
    /// The libtirpc peer failed.
    #[error(transparent)]
    Tirpc(#[from] TirpcError),
    /// A call failed or its reply was wrong.
    #[error("{transport}: call failed: {reason}")]
    Call {
        /// The transport.
        transport: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// Reading the latency samples or another local file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error from the operating system.
        source: std::io::Error,
    },
}

/// `transport.max_message` of an `rpcrdmad` left at its default (1 MiB of
/// data plus 4 KiB of headers): the bench cannot learn a server's limit
/// over the wire (CONF_RDMA carries inline sizes only), so an error names
/// the default and the key to raise.
pub const RPCRDMAD_DEFAULT_MAX_MESSAGE: u32 = (1 << 20) + 4096;

/// Turns the bare failure of a call that is larger than a default server
/// takes (ERR_CHUNK over RDMA, RFC 8166 s4.5; a closed connection over
/// TCP) into one line naming both sizes and the server's key. Other
/// errors, and calls within the default, pass unchanged.
pub fn explain_size_limit(err: BenchError, spec: &RunSpec) -> BenchError {
    let BenchError::Call { transport, reason } = &err else {
        return err;
    };
    let refused = reason.contains("PeerChunkError")
        || reason.contains("reset by peer")
        || reason.contains("closed");
    // ECHO's reply is as large as its call; READ's reply, WRITE's call.
    let message = u64::from(spec.size) + 256;
    if !refused || spec.op == Op::Null || message <= u64::from(RPCRDMAD_DEFAULT_MAX_MESSAGE) {
        return err;
    }
    BenchError::Call {
        transport,
        reason: format!(
            "the server refused the {} call of {} bytes ({reason}): a message of about {message} bytes \
             exceeds the server's transport.max_message ({RPCRDMAD_DEFAULT_MAX_MESSAGE} bytes \
             unless configured otherwise); raise transport.max_message in the server's \
             configuration or use a smaller --size",
            spec.op.name().to_uppercase(),
            spec.size,
        ),
    }
}

/// A benchmark transport: runs a [`RunSpec`] and reports a [`RunResult`].
/// Called once per run; the per-call loop lives inside.
pub trait Transport {
    /// Short name (`tirpc`, `shm`, `tcp`, `inproc`).
    fn name(&self) -> &'static str;
    /// One line: what this is and where its server runs.
    fn describe(&self) -> String;
    /// Runs one measurement.
    ///
    /// # Errors
    /// The transport's [`BenchError`]s: set-up, a failed call, a bad reply.
    fn run(&mut self, spec: &RunSpec) -> Result<RunResult, BenchError>;
}

/// Where an embedded server and the client run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cores {
    /// The server's core.
    pub server: usize,
    /// The client's core.
    pub client: usize,
}

impl Cores {
    /// Cores 0 and 1 when the machine has two or more, else none.
    pub fn default_pair() -> Option<Cores> {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        (n >= 2).then_some(Cores {
            server: 0,
            client: 1,
        })
    }
}

/// How [`open`] sets transports up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenOptions {
    /// Pin the embedded server and the client (`None`: no pinning).
    pub cores: Option<Cores>,
    /// Idle policy an embedded server starts with (a run with another
    /// policy restarts it).
    pub idle: Idle,
    /// PID of the `--connect` server's process, for its CPU figures
    /// (`/proc/<pid>/stat`); `None`: not reported.
    pub server_pid: Option<u32>,
}

/// The transports this bench knows, for `sweep` and the help text:
/// (scheme, what it is, why it is missing or `None` when available).
pub const TRANSPORTS: &[(&str, &str, Option<&str>)] = &[
    (
        "shm",
        "RPC over RDMA over the shm soft provider (embedded server on a pinned core)",
        None,
    ),
    (
        "tcp",
        "RPC over TCP (dataplane::tcp; embedded server thread on a pinned core)",
        None,
    ),
    (
        "tirpc",
        "libtirpc over loopback TCP (rpcgen server process, C client process)",
        None,
    ),
    (
        "roce",
        "RPC over RDMA over the RoCEv2 soft provider (embedded server on a loopback address)",
        None,
    ),
    (
        "inproc",
        "the bench service called in-process, no transport (XDR + dispatch cost)",
        None,
    ),
];

/// The transport the bench uses without `--connect`: RPC over RDMA over
/// `shm`, with an embedded one-worker server on the server core.
pub fn embedded_default() -> &'static str {
    "shm"
}

/// Opens the transport `url` names, or the embedded default for `None`.
///
/// URL forms: `tirpc` / `tirpc://` (embedded libtirpc server started here),
/// `tirpc://IPV4:PORT` (a running `bench_prog_server`), `inproc`; `shm`,
/// `tcp`, `roce` (embedded servers started here) and `shm://PATH`,
/// `tcp://IP:PORT`, `roce://IP:PORT` (a running server, e.g. `rpcrdmad`).
///
/// # Errors
/// [`BenchError::BadUrl`], and the transport's set-up errors (e.g.
/// [`TirpcError::Unavailable`] without libtirpc, an embedded server that
/// cannot start).
pub fn open(url: Option<&str>, options: &OpenOptions) -> Result<Box<dyn Transport>, BenchError> {
    let url: &str = match url {
        Some(u) => u,
        None => embedded_default(),
    };
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (s, r),
        None => (url, ""),
    };
    match scheme {
        "tirpc" if rest.is_empty() => Ok(Box::new(TirpcTransport::embedded(options)?)),
        "tirpc" => Ok(Box::new(TirpcTransport::connect(url, rest)?)),
        "inproc" => Ok(Box::new(crate::driver::Driven::new(
            crate::inproc::InProc::new(),
        ))),
        "shm" if rest.is_empty() => Ok(Box::new(Driven::new(RdmaDriver::<Shm>::embedded(
            "shm", options,
        )?))),
        "shm" => Ok(Box::new(Driven::new(RdmaDriver::<Shm>::connect(
            "shm", url, options,
        )))),
        "roce" if rest.is_empty() => Ok(Box::new(Driven::new(RdmaDriver::<Roce>::embedded(
            "roce", options,
        )?))),
        "roce" => Ok(Box::new(Driven::new(RdmaDriver::<Roce>::connect(
            "roce", url, options,
        )))),
        "tcp" if rest.is_empty() => Ok(Box::new(Driven::new(TcpDriver::embedded(options)?))),
        "tcp" => Ok(Box::new(Driven::new(TcpDriver::connect(url, options)?))),
        other => Err(BenchError::BadUrl {
            url: url.to_owned(),
            reason: format!(
                "unknown transport `{other}` (known: {})",
                TRANSPORTS
                    .iter()
                    .map(|t| t.0)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

/// The libtirpc baseline as a [`Transport`]: each run is one C client
/// process (`bench_prog_client`). libtirpc's `clnt_call` is synchronous,
/// so depth D is D client threads, each with its own TCP connection and
/// one call outstanding; the embedded server is one process with one
/// thread serving all connections. Per-call latencies come back through
/// a samples file and go into the same HdrHistogram as every transport's.
/// `--spin` does not apply: libtirpc waits in `poll(2)`.
pub struct TirpcTransport {
    server: Option<TirpcServer>,
    host: String,
    port: u16,
    cores: Option<Cores>,
}

impl TirpcTransport {
    /// Starts a server here (pinned to `options.cores.server`).
    ///
    /// # Errors
    /// [`TirpcError`]s of [`TirpcServer::start_pinned`].
    pub fn embedded(options: &OpenOptions) -> Result<TirpcTransport, BenchError> {
        let server = TirpcServer::start_pinned(0, options.cores.map(|c| c.server))?;
        Ok(TirpcTransport {
            port: server.port(),
            server: Some(server),
            host: "127.0.0.1".to_owned(),
            cores: options.cores,
        })
    }

    /// Uses a running server at `host_port` (`IPV4:PORT`).
    ///
    /// # Errors
    /// [`BenchError::BadUrl`], or [`TirpcError::Unavailable`] when the
    /// client was not built.
    pub fn connect(url: &str, host_port: &str) -> Result<TirpcTransport, BenchError> {
        tirpc::binaries()?;
        let bad = |reason: &str| BenchError::BadUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let (host, port) = host_port
            .rsplit_once(':')
            .ok_or_else(|| bad("expected tirpc://IPV4:PORT"))?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| bad("bad port"))?;
        if host.parse::<std::net::Ipv4Addr>().is_err() {
            return Err(bad("the libtirpc client takes an IPv4 address"));
        }
        Ok(TirpcTransport {
            server: None,
            host: host.to_owned(),
            port,
            cores: None,
        })
    }

    fn workload(spec: &RunSpec) -> Workload {
        let seconds = spec.duration.as_secs_f64().max(0.001);
        match spec.op {
            Op::Null | Op::Echo if spec.depth == 1 => Workload::LatFor {
                proc: if spec.op == Op::Null {
                    Proc::Null
                } else {
                    Proc::Echo
                },
                size: spec.size,
                seconds,
                warmup: u64::from(spec.warmup_calls),
            },
            Op::Null | Op::Echo => Workload::Rate {
                depth: spec.depth,
                seconds,
            },
            Op::Read => Workload::Read {
                size: spec.size,
                depth: spec.depth,
                seconds,
            },
            Op::Write => Workload::Write {
                size: spec.size,
                depth: spec.depth,
                seconds,
            },
        }
    }
}

impl Transport for TirpcTransport {
    fn name(&self) -> &'static str {
        "tirpc"
    }

    fn describe(&self) -> String {
        match &self.server {
            Some(s) => format!(
                "tirpc: libtirpc over TCP, embedded server pid {} on 127.0.0.1:{}{}",
                s.pid(),
                self.port,
                match self.cores {
                    Some(c) => format!(", server core {}, client core {}", c.server, c.client),
                    None => String::new(),
                }
            ),
            None => format!("tirpc: libtirpc over TCP to {}:{}", self.host, self.port),
        }
    }

    fn run(&mut self, spec: &RunSpec) -> Result<RunResult, BenchError> {
        if spec.op == Op::Echo && spec.depth > 1 {
            return Err(BenchError::Unsupported {
                transport: "tirpc",
                reason: "ECHO runs at depth 1 only (the C client's pipelined modes are NULL, SOURCE, SINK)".to_owned(),
            });
        }
        let workload = Self::workload(spec);
        let samples = tempfile_path("tirpc-samples");
        let options = tirpc::ClientOptions {
            host: self.host.clone(),
            samples: Some(samples.clone()),
            check: spec.check,
            core: self.cores.map(|c| c.client),
        };
        let before = self.server.as_ref().map(|s| s.cpu()).transpose()?;
        let result = tirpc::run_client_with(self.port, &workload, &options);
        let after = self.server.as_ref().map(|s| s.cpu()).transpose()?;
        let read = std::fs::read(&samples);
        let _ = std::fs::remove_file(&samples);
        let result = result?;
        let raw = read.map_err(|source| BenchError::Io {
            what: format!("reading the latency samples {}", samples.display()),
            source,
        })?;
        let mut hist = new_histogram();
        for chunk in raw.chunks_exact(8) {
            let ns = u64::from_ne_bytes(chunk.try_into().expect("8-byte chunk"));
            record_latency(&mut hist, ns);
        }
        let latency = LatencySummary::of(&hist);
        let server = before.zip(after).map(|(b, a)| a.since(b));
        let (seconds, calls, client, check) = match result {
            TirpcResult::Lat(l) => (
                l.seconds,
                l.count,
                CpuTimes {
                    user_s: l.client_user_s,
                    sys_s: l.client_sys_s,
                },
                l.check,
            ),
            TirpcResult::Rate(t) | TirpcResult::Read(t) | TirpcResult::Write(t) => (
                t.seconds,
                t.calls,
                CpuTimes {
                    user_s: t.client_user_s,
                    sys_s: t.client_sys_s,
                },
                t.check,
            ),
            TirpcResult::Verify(_) => unreachable!("no verify workload is built here"),
        };
        let check = if spec.check && matches!(spec.op, Op::Read | Op::Echo) {
            let c = check.ok_or_else(|| BenchError::Call {
                transport: "tirpc",
                reason: "the client did not report the reply check".to_owned(),
            })?;
            Some(CheckReport::new(
                c.replies,
                c.first_fnv1a64,
                c.differing,
                spec.size,
            ))
        } else {
            None
        };
        // NULL at depth > 1 ran as the C client's `rate`: the op stays NULL.
        Ok(RunResult::new(
            "tirpc", spec, seconds, calls, latency, client, server, check,
        ))
    }
}

/// A fresh path in the temporary directory, unique to this process.
pub fn tempfile_path(what: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "rpcrdma-bench-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

#[cfg(test)]
mod size_limit_tests {
    use super::*;

    #[test]
    fn a_refused_call_past_the_default_limit_names_the_key_and_both_sizes() {
        let spec = RunSpec::new(Op::Echo, 2 << 20, 1, Duration::from_secs(1));
        let err = BenchError::Call {
            transport: "shm",
            reason: "call failed: PeerChunkError".to_owned(),
        };
        let line = explain_size_limit(err, &spec).to_string();
        assert!(line.contains("transport.max_message"), "{line}");
        assert!(line.contains(&(2u32 << 20).to_string()), "{line}");
        assert!(line.contains("1052672"), "{line}");
        assert_eq!(line.lines().count(), 1);
        // Within the default, or another failure: unchanged.
        let small = RunSpec::new(Op::Echo, 4096, 1, Duration::from_secs(1));
        let err = BenchError::Call {
            transport: "shm",
            reason: "call failed: PeerChunkError".to_owned(),
        };
        assert_eq!(
            explain_size_limit(err, &small).to_string(),
            "shm: call failed: call failed: PeerChunkError"
        );
        let other = BenchError::Call {
            transport: "tcp",
            reason: "connect 127.0.0.1:1: refused".to_owned(),
        };
        assert!(!explain_size_limit(other, &spec)
            .to_string()
            .contains("max_message"));
    }
}
