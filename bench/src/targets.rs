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
//!
//! The transports run in rounds (`--rounds`, default 3): every round
//! takes each pair a ratio compares back to back (roce's and shm's READ
//! next to TCP's, roce's NULL next to TCP's) and the raw ping-pong again,
//! and each target is the median of its per-round ratios. On a VM whose
//! vCPU placement changes from one minute to the next (the raw ping-pong
//! moved between 80 and 460 ns on the development machine, TCP's READ by
//! 1.6x between two runs), one round's ratio says more about the moment
//! than about the code; the median of a few adjacent pairs does not.
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
    /// The ratio of each round (`measured` is their median).
    pub rounds: Vec<f64>,
}

impl TargetRow {
    /// A target measured once.
    #[cfg(test)]
    fn new(
        target: &'static str,
        measured: Option<f64>,
        goal: f64,
        at_most: bool,
        from: String,
    ) -> TargetRow {
        TargetRow::of_rounds(target, measured.into_iter().collect(), goal, at_most, from)
    }

    /// A target measured once per round: its median, and the rounds'
    /// spread appended to `from`.
    fn of_rounds(
        target: &'static str,
        mut rounds: Vec<f64>,
        goal: f64,
        at_most: bool,
        mut from: String,
    ) -> TargetRow {
        let measured = median(&mut rounds);
        if rounds.len() > 1 {
            let (lo, hi) = (rounds[0], rounds[rounds.len() - 1]);
            from.push_str(&format!(" (rounds {lo:.2}-{hi:.2})"));
        }
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
            rounds,
        }
    }
}

/// Sorts `v` and returns its median (the mean of the middle two for an
/// even count), `None` when empty.
fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
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
    /// Rounds taken.
    pub rounds: usize,
    /// The raw ping-pong median of each round (ns).
    pub raw_pingpong_ns: Vec<f64>,
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
            if !skipped.iter().any(|(u, _)| u == url) {
                eprintln!("targets: {url} not measured: {why}");
                skipped.push((url.to_owned(), why));
            }
            Ok(None)
        }
    }
}

fn cpu_per_gb(r: &RunResult) -> Option<f64> {
    Some(r.client_cpu.s_per_gb? + r.server_cpu.as_ref()?.s_per_gb?)
}

/// Runs the floor and `rounds` rounds of the transports back to back and
/// prints the target table. `duration` is per transport run (and bounds
/// the memcpy measurement, at most 0.5 s).
///
/// # Errors
/// A transport that opens but fails during its run.
pub fn run(
    options: &OpenOptions,
    cores: (usize, usize),
    duration: Duration,
    iters: u64,
    memcpy_bytes: usize,
    rounds: usize,
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
    let rate = spec(Op::Null, 0, 32, Idle::Spin);
    let read = spec(Op::Read, 256 << 10, 8, Idle::Spin);
    let read_cpu = spec(Op::Read, 256 << 10, 8, Idle::Adaptive);
    let mut taken: Vec<Round> = Vec::new();
    for round in 0..rounds.max(1) {
        if rounds > 1 {
            println!("targets: round {} of {rounds}", round + 1);
        }
        // The first round's ping-pong is the floor's, taken just before.
        let round_raw_ns = if round == 0 {
            raw_ns
        } else {
            floor_again(iters, cores)?.raw_pingpong.median_ns() as f64
        };
        let (o, sk, rs) = (options, &mut skipped, &mut runs);
        let shm_lat = measure("shm", &null, o, sk, rs)?;
        let tirpc_lat = measure("tirpc", &null, o, sk, rs)?;
        let shm_rate = measure("shm", &rate, o, sk, rs)?;
        let shm_read = measure("shm", &read, o, sk, rs)?;
        let tcp_read = measure("tcp", &read, o, sk, rs)?;
        // Software RoCEv2 against RPC over TCP on the same loopback, back
        // to back: roce's READ right after TCP's, its NULL right before.
        let roce_read = measure("roce", &read, o, sk, rs)?;
        let roce_lat = measure("roce", &null, o, sk, rs)?;
        let tcp_lat = measure("tcp", &null, o, sk, rs)?;
        let shm_cpu = measure("shm", &read_cpu, o, sk, rs)?;
        let tcp_cpu = measure("tcp", &read_cpu, o, sk, rs)?;
        let roce_cpu = measure("roce", &read_cpu, o, sk, rs)?;
        taken.push(Round {
            raw_ns: round_raw_ns,
            shm_lat,
            tirpc_lat,
            shm_rate,
            shm_read,
            tcp_read,
            roce_read,
            roce_lat,
            tcp_lat,
            shm_cpu,
            tcp_cpu,
            roce_cpu,
        });
    }

    // The floor again, after the transports: on a VM the two vCPUs may
    // sit on cores that share a cache or not, and that changes from one
    // minute to the next (the raw ping-pong moved between 140 and 430 ns
    // here); a ratio is only as steady as that placement, so say how far
    // it moved during this run.
    let floor_after = floor_again(iters, cores)?;
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
    let p99 = |r: &Option<RunResult>| r.as_ref().map(|r| r.latency.p99_ns as f64);
    let mb = |r: &Option<RunResult>| r.as_ref().map(|r| r.mb_per_s);
    let cpu = |r: &Option<RunResult>| r.as_ref().and_then(cpu_per_gb);
    let div = |a: Option<f64>, b: Option<f64>| Some(a? / b?.max(f64::MIN_POSITIVE));
    // A figure of every round, and its median over the rounds.
    let each =
        |f: &dyn Fn(&Round) -> Option<f64>| -> Vec<f64> { taken.iter().filter_map(f).collect() };
    let med = |f: &dyn Fn(&Round) -> Option<f64>| median(&mut each(f));
    let show =
        |x: Option<f64>, unit: &str| x.map_or("n/a".to_owned(), |v| format!("{v:.0} {unit}"));
    let show_cpu = |x: Option<f64>| x.map_or("n/a".to_owned(), |v| format!("{v:.3} s/GB"));
    // "numerator / denominator", each the median over the rounds.
    let pair =
        |a: &dyn Fn(&Round) -> Option<f64>, b: &dyn Fn(&Round) -> Option<f64>, unit: &str| {
            format!("{} / {}", show(med(a), unit), show(med(b), unit))
        };
    // The same for the CPU-per-GB rows.
    let cpu_pair = |a: &dyn Fn(&Round) -> Option<f64>, b: &dyn Fn(&Round) -> Option<f64>| {
        format!("{} / {}", show_cpu(med(a)), show_cpu(med(b)))
    };
    let raw = |r: &Round| Some(r.raw_ns);

    let targets = vec![
        TargetRow::of_rounds(
            "shm NULL p50 / cache-line ping-pong RTT",
            each(&|r| div(p50(&r.shm_lat), Some(r.raw_ns))),
            4.0,
            true,
            pair(&|r| p50(&r.shm_lat), &raw, "ns"),
        ),
        TargetRow::of_rounds(
            "libtirpc NULL p50 / shm NULL p50",
            each(&|r| div(p50(&r.tirpc_lat), p50(&r.shm_lat))),
            10.0,
            false,
            pair(&|r| p50(&r.tirpc_lat), &|r| p50(&r.shm_lat), "ns"),
        ),
        TargetRow::of_rounds(
            "shm NULL calls/s pipelined at depth 32 (millions)",
            each(&|r| r.shm_rate.as_ref().map(|r| r.calls_per_s / 1e6)),
            4.0,
            false,
            show(
                med(&|r| r.shm_rate.as_ref().map(|r| r.calls_per_s)),
                "calls/s",
            ),
        ),
        TargetRow::of_rounds(
            "shm READ 256 KiB depth 8 / single-core memcpy",
            each(&|r| div(mb(&r.shm_read), Some(memcpy_mb_s))),
            0.8,
            false,
            format!(
                "{} / {memcpy_mb_s:.0} MB/s",
                show(med(&|r| mb(&r.shm_read)), "MB/s")
            ),
        ),
        TargetRow::of_rounds(
            "shm READ 256 KiB depth 8 / memcpy of its working set",
            each(&|r| div(mb(&r.shm_read), Some(memcpy_set_mb_s))),
            0.8,
            false,
            format!(
                "{} / {memcpy_set_mb_s:.0} MB/s",
                show(med(&|r| mb(&r.shm_read)), "MB/s")
            ),
        ),
        TargetRow::of_rounds(
            "shm READ 256 KiB depth 8 / RPC over TCP",
            each(&|r| div(mb(&r.shm_read), mb(&r.tcp_read))),
            3.0,
            false,
            pair(&|r| mb(&r.shm_read), &|r| mb(&r.tcp_read), "MB/s"),
        ),
        TargetRow::of_rounds(
            "shm CPU per GB / TCP CPU per GB (client + server, adaptive)",
            each(&|r| div(cpu(&r.shm_cpu), cpu(&r.tcp_cpu))),
            0.4,
            true,
            cpu_pair(&|r| cpu(&r.shm_cpu), &|r| cpu(&r.tcp_cpu)),
        ),
        TargetRow::of_rounds(
            "roce READ 256 KiB depth 8 / RPC over TCP",
            each(&|r| div(mb(&r.roce_read), mb(&r.tcp_read))),
            1.0,
            false,
            pair(&|r| mb(&r.roce_read), &|r| mb(&r.tcp_read), "MB/s"),
        ),
        TargetRow::of_rounds(
            "roce CPU per GB / TCP CPU per GB (client + server, adaptive)",
            each(&|r| div(cpu(&r.roce_cpu), cpu(&r.tcp_cpu))),
            1.0,
            true,
            cpu_pair(&|r| cpu(&r.roce_cpu), &|r| cpu(&r.tcp_cpu)),
        ),
        TargetRow::of_rounds(
            "roce NULL p50 / RPC over TCP NULL p50",
            each(&|r| div(p50(&r.roce_lat), p50(&r.tcp_lat))),
            1.3,
            true,
            pair(&|r| p50(&r.roce_lat), &|r| p50(&r.tcp_lat), "ns"),
        ),
        TargetRow::of_rounds(
            "roce NULL p99 / RPC over TCP NULL p99",
            each(&|r| div(p99(&r.roce_lat), p99(&r.tcp_lat))),
            3.0,
            true,
            pair(&|r| p99(&r.roce_lat), &|r| p99(&r.tcp_lat), "ns"),
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
        rounds: taken.len(),
        raw_pingpong_ns: taken.iter().map(|r| r.raw_ns).collect(),
    })
}

/// What one round measured: a run per transport and target (`None`: not
/// available here) and the raw ping-pong it is compared against.
struct Round {
    raw_ns: f64,
    shm_lat: Option<RunResult>,
    tirpc_lat: Option<RunResult>,
    shm_rate: Option<RunResult>,
    shm_read: Option<RunResult>,
    tcp_read: Option<RunResult>,
    roce_read: Option<RunResult>,
    roce_lat: Option<RunResult>,
    tcp_lat: Option<RunResult>,
    shm_cpu: Option<RunResult>,
    tcp_cpu: Option<RunResult>,
    roce_cpu: Option<RunResult>,
}

/// The floor's ping-pongs again (a short memcpy), on a thread of its own
/// (it pins the thread it runs on): for a later round, and after the
/// rounds.
fn floor_again(iters: u64, cores: (usize, usize)) -> Result<FloorReport, BenchError> {
    std::thread::scope(|s| {
        s.spawn(|| floor::run(iters, cores, 4 << 20, Duration::ZERO))
            .join()
    })
    .map_err(|_| BenchError::Call {
        transport: "floor",
        reason: "a floor measurement panicked".to_owned(),
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

    #[test]
    fn a_target_of_rounds_is_their_median_and_shows_their_spread() {
        let r = TargetRow::of_rounds("x", vec![1.3, 0.9, 1.1], 1.0, false, "a / b".into());
        assert_eq!(r.measured, Some(1.1));
        assert_eq!(r.verdict, Verdict::Met);
        assert_eq!(r.rounds, vec![0.9, 1.1, 1.3]);
        assert_eq!(r.from, "a / b (rounds 0.90-1.30)");
        let even = TargetRow::of_rounds("x", vec![2.0, 1.0], 4.0, true, String::new());
        assert_eq!(even.measured, Some(1.5));
        let none = TargetRow::of_rounds("x", Vec::new(), 4.0, true, String::new());
        assert_eq!(none.verdict, Verdict::NotMeasured);
    }
}
