//! What a benchmark run is and what it reports: [`RunSpec`], [`RunResult`]
//! and its parts, [`BenchError`], the [`Transport`] trait and the options
//! transports are opened with.
//!
//! This is the bottom layer of the bench's run machinery: the drivers
//! ([`crate::driver`], [`crate::rdma`], [`crate::tcp`], [`crate::inproc`])
//! build on it, and [`crate::transport`] (the factory that opens them)
//! builds on those and re-exports everything here. It uses none of them,
//! so the dependencies between those files run one way.

use std::time::Duration;

use serde::Serialize;

use crate::tirpc::{CpuTimes, TirpcError};

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
    /// Pause between a reply and the next call of its slot (not part of
    /// the latency): a client that calls now and then, whose server has
    /// gone idle (parked, with the adaptive idle) by the time each call
    /// arrives. Zero: back to back.
    pub gap: Duration,
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
            gap: Duration::ZERO,
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
    fnv1a64_more(FNV1A64_START, data)
}

/// The FNV-1a state before any byte.
pub const FNV1A64_START: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a of `data` continued from state `h` (for data read in pieces).
pub fn fnv1a64_more(h: u64, data: &[u8]) -> u64 {
    data.iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
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
    /// Round trips per call (RPC over RDMA only): 1 for the call's Send
    /// and the reply, plus one for each RDMA Read the call or its reply
    /// needed (a read chunk the server pulled, a reply read chunk the
    /// client pulled), from the client engine's counters over the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round_trips_per_call: Option<f64>,
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
            round_trips_per_call: None,
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
    /// No room for another call now: every call slot is in use until a
    /// completion frees one (a Send whose acknowledgement is late holds
    /// its slot after the reply came). Back-pressure, not a failure.
    #[error("{transport}: no free call slot")]
    Busy {
        /// The transport.
        transport: &'static str,
    },
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

/// How [`open`](crate::transport::open) sets transports up.
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
    /// RPC-over-RDMA extensions (`--extensions`) the `shm` and `roce`
    /// clients offer in CONF_RDMA version 2, and their embedded servers
    /// too (docs/EXTENSIONS.md). Empty: plain Version One, no CONF_RDMA.
    pub extensions: dataplane::engine::Extensions,
    /// READ and WRITE over `shm` and `roce` carry their data as the
    /// message's DDP-eligible item, as NFS READ and WRITE do (write and
    /// read chunks in Version One), instead of as directed operations
    /// into registered application memory (the default).
    pub bulk_in_messages: bool,
}
