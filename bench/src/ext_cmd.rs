//! `extensions`: what message continuation and send-based data placement
//! (draft-dnoveck-rpcrdma-rtrext-02, docs/EXTENSIONS.md) buy, in one run.
//! For each of `shm` and `roce` (embedded servers), each operation and
//! size, the same run twice back to back: plain Version One (no
//! extensions), then with the extensions the engine implements offered
//! on both sides. READ and WRITE carry their data as the message's
//! DDP-eligible item (`OpenOptions::bulk_in_messages`): write and read
//! chunks in Version One, placed in Sends with the extensions. Reported
//! per point: round trips per call (`RunResult::round_trips_per_call`)
//! and p50 latency each way, and their ratio.
//!
//! The goal stated for it: every point the extensions carry in Sends alone
//! (one round trip) has a p50 at most 0.7x the chunked path's.
use std::time::Duration;

use bench::transport::{self, BenchError, Idle, Op, OpenOptions, RunResult, RunSpec};
use dataplane::engine::Extensions;
use serde::Serialize;

/// The p50 ratio a point carried in Sends alone must reach.
pub const GOAL: f64 = 0.7;

/// One operation and size, both ways.
#[derive(Debug, Clone, Serialize)]
pub struct ExtRow {
    /// `shm` or `roce`.
    pub transport: String,
    /// ECHO, READ or WRITE.
    pub op: Op,
    /// Bytes per call.
    pub size: u32,
    /// Round trips per call without extensions.
    pub trips_plain: Option<f64>,
    /// Round trips per call with them.
    pub trips_ext: Option<f64>,
    /// p50 without, ns.
    pub p50_plain_ns: u64,
    /// p50 with, ns.
    pub p50_ext_ns: u64,
    /// `p50_ext_ns / p50_plain_ns`.
    pub ratio: f64,
    /// Carried in Sends alone with the extensions (one round trip) and
    /// more than one without: the goal applies.
    pub goal_applies: bool,
    /// Whether the goal is met where it applies.
    pub met: Option<bool>,
}

/// Everything `extensions` measured.
#[derive(Debug, Clone, Serialize)]
pub struct ExtReport {
    /// What "with extensions" offered.
    pub offered: String,
    /// Every run, plain then with extensions, point by point.
    pub runs: Vec<RunResult>,
    /// The comparison.
    pub rows: Vec<ExtRow>,
    /// Transports that could not be opened.
    pub skipped: Vec<(String, String)>,
}

/// One run on a transport opened for it, on a thread of its own (the
/// client pins the thread it runs on).
fn measure(url: &str, spec: &RunSpec, options: &OpenOptions) -> Result<RunResult, String> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut t = transport::open(Some(url), options).map_err(|e| e.to_string())?;
            t.run(spec).map_err(|e| e.to_string())
        })
        .join()
        .unwrap_or_else(|_| Err(format!("the {url} run panicked")))
    })
}

/// Runs every point both ways and prints the table.
///
/// # Errors
/// A run that fails once its transport opened.
pub fn run(
    options: &OpenOptions,
    duration: Duration,
    sizes: &[u32],
    transports: &[String],
) -> Result<ExtReport, BenchError> {
    let ext = Extensions::ALL;
    let mut report = ExtReport {
        offered: dataplane::extension_names::Names(ext).to_string(),
        runs: Vec::new(),
        rows: Vec::new(),
        skipped: Vec::new(),
    };
    'transports: for url in transports {
        for op in [Op::Echo, Op::Read, Op::Write] {
            for &size in sizes {
                let mut spec = RunSpec::new(op, size, 1, duration);
                spec.idle = Idle::Spin;
                let mut results = Vec::with_capacity(2);
                for extensions in [Extensions::EMPTY, ext] {
                    // READ and WRITE as NFS does them: the data is the
                    // message's DDP-eligible item, which the extensions
                    // may carry in Sends (directed operations into
                    // application memory keep their RDMA by design).
                    let opts = OpenOptions {
                        idle: Idle::Spin,
                        extensions,
                        bulk_in_messages: true,
                        ..*options
                    };
                    match measure(url, &spec, &opts) {
                        Ok(r) => results.push(r),
                        Err(why) if report.runs.is_empty() || results.is_empty() => {
                            eprintln!("extensions: {url} not measured: {why}");
                            report.skipped.push((url.clone(), why));
                            continue 'transports;
                        }
                        Err(why) => {
                            return Err(BenchError::Call {
                                transport: "extensions",
                                reason: format!("{url} {} {size}: {why}", op.name()),
                            })
                        }
                    }
                }
                let (plain, with) = (&results[0], &results[1]);
                let (p0, p1) = (plain.latency.p50_ns, with.latency.p50_ns);
                let ratio = p1 as f64 / p0.max(1) as f64;
                let one = |t: Option<f64>| t.is_some_and(|t| t < 1.0 + 1e-9);
                let goal_applies =
                    one(with.round_trips_per_call) && !one(plain.round_trips_per_call);
                report.rows.push(ExtRow {
                    transport: url.clone(),
                    op,
                    size,
                    trips_plain: plain.round_trips_per_call,
                    trips_ext: with.round_trips_per_call,
                    p50_plain_ns: p0,
                    p50_ext_ns: p1,
                    ratio,
                    goal_applies,
                    met: goal_applies.then_some(ratio <= GOAL),
                });
                report.runs.extend(results);
            }
        }
    }
    print_table(&report);
    Ok(report)
}

fn trips(t: Option<f64>) -> String {
    t.map_or_else(|| "n/a".to_owned(), |t| format!("{t:.2}"))
}

fn print_table(r: &ExtReport) {
    println!(
        "plain Version One vs extensions offered ({}), depth 1, busy-polling, p50:",
        r.offered
    );
    println!(
        "{:<6} {:<6} {:>8} {:>12} {:>12} {:>10} {:>10} {:>7}  goal (<= {GOAL}x where one round trip)",
        "", "op", "size", "trips plain", "trips ext", "p50 plain", "p50 ext", "ratio"
    );
    for row in &r.rows {
        println!(
            "{:<6} {:<6} {:>8} {:>12} {:>12} {:>8.1}us {:>8.1}us {:>7.2}  {}",
            row.transport,
            row.op.name(),
            row.size,
            trips(row.trips_plain),
            trips(row.trips_ext),
            row.p50_plain_ns as f64 / 1e3,
            row.p50_ext_ns as f64 / 1e3,
            row.ratio,
            match row.met {
                None => "-",
                Some(true) => "met",
                Some(false) => "missed",
            }
        );
    }
    for (url, why) in &r.skipped {
        println!("{url}: not measured: {why}");
    }
}
