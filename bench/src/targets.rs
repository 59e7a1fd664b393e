//! `targets`: every performance target of docs/BENCHMARKS.md, measured in one run
//! and reported as the ratio the target names (docs/BENCHMARKS.md).
//!
//! Ratios only mean something when both sides ran on the same machine in
//! the same minute (the machines are shared and their speed moves), so
//! this command takes the floor (cache-line ping-pong, memcpy) and every
//! transport's figure back to back in one process and divides them there.
//! Latency and bandwidth runs busy-poll on both sides (the targets are
//! stated for busy polling); the CPU-per-GB runs use the adaptive idle on
//! both sides, because a spinning side costs a whole core whatever it
//! moves, which would make CPU per GB merely the inverse of throughput.
use std::time::Duration;

use bench::transport::{self, BenchError, Idle, Op, OpenOptions, RunResult, RunSpec};
use serde::Serialize;

use crate::floor::{self, FloorReport};

/// Whether a measured ratio meets its target.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Met.
    Met,
    /// Missed; `by` is how far off, as a factor >= 1.
    Missed { by: f64 },
    /// A side could not be measured (e.g. libtirpc not built).
    NotMeasured,
}

/// One target and what this run measured for it.
#[derive(Debug, Clone, Serialize)]
pub struct TargetRow {
    /// The target as docs/BENCHMARKS.md states it.
    pub target: &'static str,
    /// The measured ratio (or absolute figure for the message rate).
    pub measured: Option<f64>,
    /// The bound it is compared against.
    pub goal: f64,
    /// Whether `measured` must be at most (`true`) or at least the goal.
    pub at_most: bool,
    /// The figures the ratio comes from, for the reader.
    pub from: String,
    /// Met or missed, and by how much.
    pub verdict: Verdict,
}

impl TargetRow {
    fn new(
        target: &'static str,
        measured: Option<f64>,
        goal: f64,
        at_most: bool,
        from: String,
    ) -> TargetRow {
        let verdict = match measured {
            None => Verdict::NotMeasured,
            Some(m) if (at_most && m <= goal) || (!at_most && m >= goal) => Verdict::Met,
            Some(m) if at_most => Verdict::Missed { by: m / goal },
            Some(m) => Verdict::Missed {
                by: goal / m.max(f64::MIN_POSITIVE),
            },
        };
        TargetRow {
            target,
            measured,
            goal,
            at_most,
            from,
            verdict,
        }
    }
}

/// Everything `targets` measured.
#[derive(Debug, Clone, Serialize)]
pub struct TargetsReport {
    /// The physical references.
    pub floor: FloorReport,
    /// The floor taken again after the transport runs (how far the
    /// machine's own figures moved meanwhile).
    pub floor_after: FloorReport,
    /// memcpy over the READ target's working set (8 x 256 KiB, cached).
    pub memcpy_working_set: bench::membw::MemcpyReport,
    /// Every transport run, in the order taken.
    pub runs: Vec<RunResult>,
    /// Transports that could not be opened, with the reason.
    pub skipped: Vec<(String, String)>,
    /// The targets with their verdicts.
    pub targets: Vec<TargetRow>,
}

/// One run of `spec` on a transport opened for it (`None` when the
/// transport is not available here: the reason goes to `skipped`).
///
/// Each run opens and measures on a thread of its own: the client pins the
/// thread it runs on, and a thread's CPU mask is what the next embedded
/// server would inherit and check its core against.
fn measure(
    url: &str,
    spec: &RunSpec,
    options: &OpenOptions,
    skipped: &mut Vec<(String, String)>,
    runs: &mut Vec<RunResult>,
) -> Result<Option<RunResult>, BenchError> {
    let options = OpenOptions {
        idle: spec.idle,
        ..*options
    };
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            let mut t = match transport::open(Some(url), &options) {
                Ok(t) => t,
                Err(e) => return Ok(Err(e.to_string())),
            };
            println!("{}", t.describe());
            t.run(spec).map(Ok)
        })
        .join()
        .unwrap_or_else(|_| {
            Err(BenchError::Call {
                transport: "targets",
                reason: format!("the {url} run panicked"),
            })
        })
    })?;
    match outcome {
        Ok(r) => {
            runs.push(r.clone());
            Ok(Some(r))
        }
        Err(why) => {
            eprintln!("targets: {url} not measured: {why}");
            skipped.push((url.to_owned(), why));
            Ok(None)
        }
    }
}

fn cpu_per_gb(r: &RunResult) -> Option<f64> {
    Some(r.client_cpu.s_per_gb? + r.server_cpu.as_ref()?.s_per_gb?)
}

/// Runs the floor and the transports back to back and prints the target
/// table. `duration` is per transport run (and bounds the memcpy
/// measurement, at most 0.5 s).
///
/// # Errors
/// A transport that opens but fails during its run.
pub fn run(
    options: &OpenOptions,
    cores: (usize, usize),
    duration: Duration,
    iters: u64,
    memcpy_bytes: usize,
) -> Result<TargetsReport, BenchError> {
    // On a thread of its own too: the floor pins the thread it runs on.
    let floor = std::thread::scope(|s| {
        s.spawn(|| {
            floor::run(
                iters,
                cores,
                memcpy_bytes,
                duration.min(Duration::from_millis(500)),
            )
        })
        .join()
    })
    .map_err(|_| BenchError::Call {
        transport: "floor",
        reason: "the floor measurement panicked".to_owned(),
    })?;
    let raw_ns = floor.raw_pingpong.median_ns() as f64;
    let memcpy_mb_s = floor.memcpy.best_gb_per_s * 1000.0;
    // The floor's memcpy runs out of cache (buffers 4x the LLC); the READ
    // below cycles 8 buffers of 256 KiB per side, which stay cached. The
    // memcpy of that same working set is the like-for-like reference.
    let memcpy_set = std::thread::scope(|s| {
        s.spawn(|| {
            bench::membw::measure_blocks(
                256 << 10,
                8,
                duration.min(Duration::from_millis(500)),
                Some(cores.0),
            )
        })
        .join()
    })
    .map_err(|_| BenchError::Call {
        transport: "floor",
        reason: "the working-set memcpy panicked".to_owned(),
    })?;
    let memcpy_set_mb_s = memcpy_set.best_gb_per_s * 1000.0;
    println!(
        "memcpy, one core, 8 x 256 KiB blocks (the READ's working set, in cache): best {:.2} GB/s, mean {:.2} GB/s over {} rounds",
        memcpy_set.best_gb_per_s, memcpy_set.mean_gb_per_s, memcpy_set.copies
    );

    let (mut runs, mut skipped) = (Vec::new(), Vec::new());
    let spec = |op, size, depth, idle| {
        let mut s = RunSpec::new(op, size, depth, duration);
        s.idle = idle;
        s
    };
    let null = spec(Op::Null, 0, 1, Idle::Spin);
    let shm_lat = measure("shm", &null, options, &mut skipped, &mut runs)?;
    let tirpc_lat = measure("tirpc", &null, options, &mut skipped, &mut runs)?;
    let rate = spec(Op::Null, 0, 32, Idle::Spin);
    let shm_rate = measure("shm", &rate, options, &mut skipped, &mut runs)?;
    let read = spec(Op::Read, 256 << 10, 8, Idle::Spin);
    let shm_read = measure("shm", &read, options, &mut skipped, &mut runs)?;
    let tcp_read = measure("tcp", &read, options, &mut skipped, &mut runs)?;
    // Software RoCEv2 against RPC over TCP on the same loopback, back to
    // back: the NULL latency pair first, then the READ next to TCP's.
    let roce_lat = measure("roce", &null, options, &mut skipped, &mut runs)?;
    let tcp_lat = measure("tcp", &null, options, &mut skipped, &mut runs)?;
    let roce_read = measure("roce", &read, options, &mut skipped, &mut runs)?;
    let read_cpu = spec(Op::Read, 256 << 10, 8, Idle::Adaptive);
    let shm_cpu = measure("shm", &read_cpu, options, &mut skipped, &mut runs)?;
    let tcp_cpu = measure("tcp", &read_cpu, options, &mut skipped, &mut runs)?;

    // The floor again, after the transports: on a VM the two vCPUs may
    // sit on cores that share a cache or not, and that changes from one
    // minute to the next (the raw ping-pong moved between 140 and 430 ns
    // here); a ratio is only as steady as that placement, so say how far
    // it moved during this run.
    let floor_after = std::thread::scope(|s| {
        s.spawn(|| floor::run(iters, cores, 4 << 20, Duration::ZERO))
            .join()
    })
    .map_err(|_| BenchError::Call {
        transport: "floor",
        reason: "the second floor measurement panicked".to_owned(),
    })?;
    let raw_after_ns = floor_after.raw_pingpong.median_ns() as f64;
    println!(
        "raw cache-line ping-pong before / after the transport runs: {raw_ns:.0} / {raw_after_ns:.0} ns{}",
        if (raw_after_ns / raw_ns.max(1.0) - 1.0).abs() > 0.25 {
            " (moved: vCPU placement changed during the run; the latency ratio is unsteady)"
        } else {
            ""
        }
    );
    let p50 = |r: &Option<RunResult>| r.as_ref().map(|r| r.latency.p50_ns as f64);
    let mb = |r: &Option<RunResult>| r.as_ref().map(|r| r.mb_per_s);
    let cpu = |r: &Option<RunResult>| r.as_ref().and_then(cpu_per_gb);
    let div = |a: Option<f64>, b: Option<f64>| Some(a? / b?.max(f64::MIN_POSITIVE));
    let show =
        |x: Option<f64>, unit: &str| x.map_or("n/a".to_owned(), |v| format!("{v:.0} {unit}"));
    let p99 = |r: &Option<RunResult>| r.as_ref().map(|r| r.latency.p99_ns as f64);
    let show_cpu = |x: Option<f64>| x.map_or("n/a".to_owned(), |v| format!("{v:.3} s/GB"));

    let targets = vec![
        TargetRow::new(
            "shm NULL p50 / cache-line ping-pong RTT",
            div(p50(&shm_lat), Some(raw_ns)),
            4.0,
            true,
            format!("{} / {raw_ns:.0} ns", show(p50(&shm_lat), "ns")),
        ),
        TargetRow::new(
            "libtirpc NULL p50 / shm NULL p50",
            div(p50(&tirpc_lat), p50(&shm_lat)),
            10.0,
            false,
            format!(
                "{} / {}",
                show(p50(&tirpc_lat), "ns"),
                show(p50(&shm_lat), "ns")
            ),
        ),
        TargetRow::new(
            "shm NULL calls/s pipelined at depth 32 (millions)",
            shm_rate.as_ref().map(|r| r.calls_per_s / 1e6),
            4.0,
            false,
            show(shm_rate.as_ref().map(|r| r.calls_per_s), "calls/s"),
        ),
        TargetRow::new(
            "shm READ 256 KiB depth 8 / single-core memcpy",
            div(mb(&shm_read), Some(memcpy_mb_s)),
            0.8,
            false,
            format!("{} / {memcpy_mb_s:.0} MB/s", show(mb(&shm_read), "MB/s")),
        ),
        TargetRow::new(
            "shm READ 256 KiB depth 8 / memcpy of its working set",
            div(mb(&shm_read), Some(memcpy_set_mb_s)),
            0.8,
            false,
            format!(
                "{} / {memcpy_set_mb_s:.0} MB/s",
                show(mb(&shm_read), "MB/s")
            ),
        ),
        TargetRow::new(
            "shm READ 256 KiB depth 8 / RPC over TCP",
            div(mb(&shm_read), mb(&tcp_read)),
            3.0,
            false,
            format!(
                "{} / {}",
                show(mb(&shm_read), "MB/s"),
                show(mb(&tcp_read), "MB/s")
            ),
        ),
        TargetRow::new(
            "shm CPU per GB / TCP CPU per GB (client + server, adaptive)",
            div(cpu(&shm_cpu), cpu(&tcp_cpu)),
            0.4,
            true,
            format!("{} / {}", show_cpu(cpu(&shm_cpu)), show_cpu(cpu(&tcp_cpu))),
        ),
        TargetRow::new(
            "roce READ 256 KiB depth 8 / RPC over TCP",
            div(mb(&roce_read), mb(&tcp_read)),
            1.0,
            false,
            format!(
                "{} / {}",
                show(mb(&roce_read), "MB/s"),
                show(mb(&tcp_read), "MB/s")
            ),
        ),
        TargetRow::new(
            "roce NULL p50 / RPC over TCP NULL p50",
            div(p50(&roce_lat), p50(&tcp_lat)),
            1.3,
            true,
            format!(
                "{} / {}",
                show(p50(&roce_lat), "ns"),
                show(p50(&tcp_lat), "ns")
            ),
        ),
        TargetRow::new(
            "roce NULL p99 / RPC over TCP NULL p99",
            div(p99(&roce_lat), p99(&tcp_lat)),
            3.0,
            true,
            format!(
                "{} / {}",
                show(p99(&roce_lat), "ns"),
                show(p99(&tcp_lat), "ns")
            ),
        ),
    ];
    print_table(&targets);
    Ok(TargetsReport {
        floor,
        floor_after,
        memcpy_working_set: memcpy_set,
        runs,
        skipped,
        targets,
    })
}

fn print_table(rows: &[TargetRow]) {
    println!();
    println!(
        "{:<62} {:>9} {:>7}  {:<16} from",
        "target", "measured", "goal", "verdict"
    );
    for r in rows {
        let measured = r.measured.map_or("n/a".to_owned(), |m| format!("{m:.2}"));
        let goal = format!("{}{}", if r.at_most { "<=" } else { ">=" }, r.goal);
        let verdict = match r.verdict {
            Verdict::Met => "met".to_owned(),
            Verdict::Missed { by } => format!("missed by {by:.2}x"),
            Verdict::NotMeasured => "not measured".to_owned(),
        };
        println!(
            "{:<62} {:>9} {:>7}  {:<16} {}",
            r.target, measured, goal, verdict, r.from
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_compare_in_the_stated_direction() {
        let at_most = TargetRow::new("x", Some(5.0), 4.0, true, String::new());
        assert_eq!(at_most.verdict, Verdict::Missed { by: 1.25 });
        let met = TargetRow::new("x", Some(3.0), 4.0, true, String::new());
        assert_eq!(met.verdict, Verdict::Met);
        let at_least = TargetRow::new("x", Some(2.0), 4.0, false, String::new());
        assert_eq!(at_least.verdict, Verdict::Missed { by: 2.0 });
        let met = TargetRow::new("x", Some(4.0), 4.0, false, String::new());
        assert_eq!(met.verdict, Verdict::Met);
        let none = TargetRow::new("x", None, 4.0, false, String::new());
        assert_eq!(none.verdict, Verdict::NotMeasured);
    }
}
