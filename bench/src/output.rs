//! What the bench prints and writes: tables on stdout, one JSON document
//! per invocation (`--json FILE`), and SVG plots for `sweep`.
//!
//! The plots follow the Sun NFS/RDMA paper's figures (s7.3), with every
//! transport on one set of axes: throughput against transfer size, one
//! plot per depth ("reads ahead", figures 15, 16); CPU utilisation against
//! throughput at one depth (figure 17); CPU per byte against transfer size
//! (figure 18). A sweep point is the median of its repetitions, drawn with
//! its range.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde::Serialize;

use crate::spec::{Op, RunResult};

/// Human size: 512, 4K, 1M (binary units, as the `--size` arguments).
pub fn size_label(bytes: u32) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{}M", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes % (1 << 10) == 0 {
        format!("{}K", bytes >> 10)
    } else {
        bytes.to_string()
    }
}

fn micros(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

/// Prints results as a table: one row per run.
pub fn print_table(out: &mut impl Write, results: &[RunResult]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<7} {:<5} {:>6} {:>5} {:>10} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>6} {:>6} {:>8} {:>8}",
        "transp",
        "op",
        "size",
        "depth",
        "calls/s",
        "MB/s",
        "p50 us",
        "p90 us",
        "p99 us",
        "p99.9 us",
        "max us",
        "cli %",
        "srv %",
        "cli s/GB",
        "srv s/GB"
    )?;
    let opt = |v: Option<f64>, prec: usize| match v {
        Some(x) => format!("{x:.prec$}"),
        None => "-".to_owned(),
    };
    for r in results {
        writeln!(
            out,
            "{:<7} {:<5} {:>6} {:>5} {:>10.0} {:>9.1} {:>8} {:>8} {:>8} {:>9} {:>9} {:>6.0} {:>6} {:>8} {:>8}",
            r.transport,
            r.op.name(),
            size_label(r.size),
            r.depth,
            r.calls_per_s,
            r.mb_per_s,
            micros(r.latency.p50_ns),
            micros(r.latency.p90_ns),
            micros(r.latency.p99_ns),
            micros(r.latency.p999_ns),
            micros(r.latency.max_ns),
            r.client_cpu.utilization_pct,
            opt(r.server_cpu.map(|c| c.utilization_pct), 0),
            opt(r.client_cpu.s_per_gb, 3),
            opt(r.server_cpu.and_then(|c| c.s_per_gb), 3),
        )?;
        if let Some(c) = &r.check {
            writeln!(
                out,
                "        check: {} replies, FNV-1a {:016x} (pattern {:016x}), {} differing: {}",
                c.replies,
                c.first_fnv1a64,
                c.expected_fnv1a64,
                c.differing,
                if c.ok { "ok" } else { "MISMATCH" }
            )?;
        }
    }
    Ok(())
}

/// Prints a `conns` report: connect times, the server's memory per
/// connection, and the busy connection's NULL latency at each idle count.
pub fn print_conns(out: &mut impl Write, r: &crate::conns::ConnsReport) -> std::io::Result<()> {
    let kib = |b: f64| format!("{:.1} KiB", b / 1024.0);
    writeln!(
        out,
        "conns: {} connections (1 busy, {} idle), {} established; idle clients: {}",
        r.count,
        r.count - 1,
        r.established,
        r.idle_client_limits
    )?;
    writeln!(
        out,
        "connect + first NULL: p50 {} us, p99 {} us, max {} us over {} connects",
        micros(r.connect.p50_ns),
        micros(r.connect.p99_ns),
        micros(r.connect.max_ns),
        r.connect.count
    )?;
    match &r.memory {
        Some(m) => {
            writeln!(
                out,
                "memory of pid {} ({}): per connection {} committed (Rss + hugetlb), {} address space, {:.1} fds",
                m.pid,
                m.scope,
                kib(m.committed_per_conn_bytes),
                kib(m.address_space_per_conn_bytes),
                m.fds_per_conn
            )?;
            for (label, p) in [
                ("before", &m.before),
                ("open", &m.open),
                ("closed", &m.closed),
            ] {
                writeln!(
                    out,
                    "  {label:<7} Rss {:>9} KiB  hugetlb {:>9} KiB  VmSize {:>10} KiB  fds {:>6}",
                    p.rss_kib, p.hugetlb_kib, p.vm_size_kib, p.fds
                )?;
            }
            writeln!(
                out,
                "  after close: {:.0}% of the committed memory the connections added came back ({:.0}% of the Rss){}",
                m.committed_returned_pct,
                m.rss_returned_pct,
                if m.settled {
                    ""
                } else {
                    " (not settled within 10 s)"
                }
            )?;
        }
        None => writeln!(out, "memory: n/a (give --server-pid PID)")?,
    }
    writeln!(
        out,
        "{:>6} {:>10} {:>8} {:>8} {:>8} {:>9} {:>9} {:>6}",
        "idle", "calls/s", "p50 us", "p90 us", "p99 us", "p99.9 us", "max us", "srv %"
    )?;
    for p in &r.series {
        let l = &p.result.latency;
        writeln!(
            out,
            "{:>6} {:>10.0} {:>8} {:>8} {:>8} {:>9} {:>9} {:>6}",
            p.idle,
            p.result.calls_per_s,
            micros(l.p50_ns),
            micros(l.p90_ns),
            micros(l.p99_ns),
            micros(l.p999_ns),
            micros(l.max_ns),
            p.result
                .server_cpu
                .map_or("-".to_owned(), |c| format!("{:.0}", c.utilization_pct))
        )?;
    }
    if let (Some(first), Some(last)) = (r.series.first(), r.series.last()) {
        writeln!(
            out,
            "p50({} idle) / p50({} idle) = {:.2}; p99 ratio {:.2}",
            last.idle, first.idle, r.p50_ratio, r.p99_ratio
        )?;
    }
    Ok(())
}

/// Where and on what the figures were taken.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// `uname -n`.
    pub host: String,
    /// `uname -r`.
    pub kernel: String,
    /// `model name` of /proc/cpuinfo.
    pub cpu_model: String,
    /// Logical CPUs available to this process.
    pub cpus: usize,
    /// 1-minute load average when the run started.
    pub load_average: Option<f64>,
}

impl Machine {
    /// The machine this runs on.
    pub fn this() -> Machine {
        let uts = nix::sys::utsname::uname().ok();
        let field = |f: fn(&nix::sys::utsname::UtsName) -> &std::ffi::OsStr| {
            uts.as_ref()
                .map(|u| f(u).to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_default();
        let load_average = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|t| t.split_whitespace().next()?.parse().ok());
        Machine {
            host: field(|u| u.nodename()),
            kernel: field(|u| u.release()),
            cpu_model,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            load_average,
        }
    }
}

/// Seconds since the Unix epoch, for the JSON `unix_time` field.
pub fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Writes `value` as pretty JSON to `path`.
///
/// # Errors
/// The file cannot be created or written.
pub fn write_json(path: &Path, value: &serde_json::Value) -> std::io::Result<()> {
    let mut text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    text.push('\n');
    std::fs::write(path, text)
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// A named line of (x, y) points.
pub type Series = (String, Vec<(f64, f64)>);

/// A figure taken several times: the median and the range of the
/// repetitions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// Smallest.
    pub min: f64,
    /// Median (the mean of the middle two for an even count).
    pub median: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; `None` when empty.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut v: Vec<f64> = values.into_iter().collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Spread {
            min: v[0],
            median,
            max: v[n - 1],
        })
    }

    /// A single measurement.
    pub fn one(v: f64) -> Spread {
        Spread {
            min: v,
            median: v,
            max: v,
        }
    }
}

/// A named line of points with their spread in y, joined in the order
/// given.
pub type SpreadSeries = (String, Vec<(f64, Spread)>);

/// One line chart to `path`: `x_log` puts x on a log scale.
///
/// # Errors
/// The chart could not be drawn or written (the text says which).
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    x_log: bool,
    series: &[Series],
) -> Result<(), String> {
    let series: Vec<SpreadSeries> = series
        .iter()
        .map(|(name, pts)| {
            let pts = pts.iter().map(|&(x, y)| (x, Spread::one(y))).collect();
            (name.clone(), pts)
        })
        .collect();
    spread_chart(path, title, x_label, y_label, x_log, &series)
}

/// A line chart of medians with a min-max bar at every point where the
/// repetitions differ; each line joins its points in the order given.
///
/// # Errors
/// The chart could not be drawn or written (the text says which).
pub fn spread_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    x_log: bool,
    series: &[SpreadSeries],
) -> Result<(), String> {
    let points = series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, 0.0f64, 0.0f64);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y.max);
    }
    if !x0.is_finite() {
        return Err(format!("{}: no data to plot", path.display()));
    }
    if x1 <= x0 {
        x1 = x0 * 2.0 + 1.0;
    }
    let y1 = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70);
    // The two axis kinds are different chart types; what is drawn on
    // them is the same.
    macro_rules! draw_lines {
        ($chart:expr) => {{
            let chart = $chart;
            for (i, (name, pts)) in series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                chart
                    .draw_series(LineSeries::new(
                        pts.iter().map(|&(x, y)| (x, y.median)),
                        color.stroke_width(2),
                    ))
                    .map_err(|e| err(&e))?
                    .label(name)
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
                chart
                    .draw_series(
                        pts.iter()
                            .map(|&(x, y)| Circle::new((x, y.median), 3, color.filled())),
                    )
                    .map_err(|e| err(&e))?;
                chart
                    .draw_series(pts.iter().filter(|(_, y)| y.max > y.min).map(|&(x, y)| {
                        ErrorBar::new_vertical(x, y.min, y.median, y.max, color.stroke_width(1), 8)
                    }))
                    .map_err(|e| err(&e))?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }};
    }
    if x_log {
        let mut chart = builder
            .build_cartesian_2d((x0..x1).log_scale(), 0.0..y1)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .x_label_formatter(&|x| size_label(x.round() as u32))
            .draw()
            .map_err(|e| err(&e))?;
        draw_lines!(&mut chart);
    } else {
        let mut chart = builder
            .build_cartesian_2d(0.0..x1 * 1.05, 0.0..y1)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .draw()
            .map_err(|e| err(&e))?;
        draw_lines!(&mut chart);
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Total CPU (client + server when known) in percent of one core.
fn cpu_pct(r: &RunResult) -> f64 {
    r.client_cpu.utilization_pct + r.server_cpu.map_or(0.0, |s| s.utilization_pct)
}

/// Total CPU seconds per GB (client + server when known).
fn cpu_per_gb(r: &RunResult) -> Option<f64> {
    let c = r.client_cpu.s_per_gb?;
    Some(c + r.server_cpu.and_then(|s| s.s_per_gb).unwrap_or(0.0))
}

/// One sweep point (transport, op, size, depth) over its repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct SweepPoint {
    /// The transport's name.
    pub transport: String,
    /// The operation.
    pub op: Op,
    /// Bytes per call.
    pub size: u32,
    /// Calls in flight.
    pub depth: u32,
    /// Repetitions taken.
    pub reps: usize,
    /// 10^6 payload bytes per second.
    pub mb_per_s: Spread,
    /// CPU (client + server when known), percent of one core.
    pub cpu_pct: Spread,
    /// CPU seconds per GB (client + server when known), when measured.
    pub cpu_s_per_gb: Option<Spread>,
}

/// Groups `results` into points, each the repetitions of one
/// (transport, op, size, depth), in transport, op, depth, size order.
pub fn sweep_points(results: &[RunResult]) -> Vec<SweepPoint> {
    let mut keys: Vec<(&str, u8, u32, u32)> = results
        .iter()
        .map(|r| (r.transport.as_str(), op_rank(r.op), r.depth, r.size))
        .collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|(t, rank, depth, size)| {
            let runs: Vec<&RunResult> = results
                .iter()
                .filter(|r| {
                    r.transport == t && op_rank(r.op) == rank && r.depth == depth && r.size == size
                })
                .collect();
            let first = runs.first()?;
            let per_gb: Vec<f64> = runs.iter().filter_map(|r| cpu_per_gb(r)).collect();
            Some(SweepPoint {
                transport: t.to_owned(),
                op: first.op,
                size,
                depth,
                reps: runs.len(),
                mb_per_s: Spread::of(runs.iter().map(|r| r.mb_per_s))?,
                cpu_pct: Spread::of(runs.iter().map(|r| cpu_pct(r)))?,
                cpu_s_per_gb: if per_gb.len() == runs.len() {
                    Spread::of(per_gb)
                } else {
                    None
                },
            })
        })
        .collect()
}

/// The plots' order of operations.
fn op_rank(op: Op) -> u8 {
    match op {
        Op::Read => 0,
        Op::Write => 1,
        Op::Echo => 2,
        Op::Null => 3,
    }
}

/// Writes the sweep's plots into `dir` and returns their paths. Every
/// point is the median of its repetitions, with a min-max bar; every
/// transport shares the axes of each figure, and lines join points in
/// size order:
/// * `<op>-throughput-depth<D>.svg`: MB/s against size, a line per
///   transport, one figure per depth (the paper's figures 15 and 16 put
///   the depths of one transport together; here RDMA and TCP meet);
/// * `<op>-cpu-per-gb.svg`: CPU seconds per GB against size, a line per
///   transport, at the depth nearest `cpu_depth` (figure 18);
/// * `<op>-cpu-vs-throughput.svg`: CPU % against MB/s at that depth, each
///   transport's points joined from the smallest size up (figure 17).
///
/// # Errors
/// A plot could not be drawn or written (the text says which).
pub fn plot_sweep(
    dir: &Path,
    results: &[RunResult],
    cpu_depth: u32,
) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let points = sweep_points(results);
    let mut written = Vec::new();
    let transports: BTreeSet<&str> = points.iter().map(|p| p.transport.as_str()).collect();
    let ops: Vec<Op> = [Op::Read, Op::Write, Op::Echo, Op::Null]
        .into_iter()
        .filter(|op| points.iter().any(|p| p.op == *op))
        .collect();
    // One line per transport of `y` against `x` at `depth`, in size order
    // (the points come sorted by size).
    let lines = |op: Op, depth: u32, xy: &dyn Fn(&SweepPoint) -> Option<(f64, Spread)>| {
        transports
            .iter()
            .map(|&t| {
                let pts: Vec<(f64, Spread)> = points
                    .iter()
                    .filter(|p| p.op == op && p.transport == t && p.depth == depth)
                    .filter_map(xy)
                    .collect();
                (t.to_owned(), pts)
            })
            .filter(|s| !s.1.is_empty())
            .collect::<Vec<SpreadSeries>>()
    };
    for &op in &ops {
        let depths: BTreeSet<u32> = points
            .iter()
            .filter(|p| p.op == op)
            .map(|p| p.depth)
            .collect();
        for &depth in &depths {
            let series = lines(op, depth, &|p| Some((f64::from(p.size), p.mb_per_s)));
            let path = dir.join(format!("{}-throughput-depth{depth}.svg", op.name()));
            spread_chart(
                &path,
                &format!("{} throughput vs size, depth {depth}", op.name()),
                "bytes per call",
                "MB/s (10^6 B/s), median and range",
                true,
                &series,
            )?;
            written.push(path);
        }
        let Some(&depth) = depths
            .iter()
            .min_by_key(|&&d| (i64::from(d) - i64::from(cpu_depth)).abs())
        else {
            continue;
        };
        let series = lines(op, depth, &|p| Some((f64::from(p.size), p.cpu_s_per_gb?)));
        if !series.is_empty() {
            let path = dir.join(format!("{}-cpu-per-gb.svg", op.name()));
            spread_chart(
                &path,
                &format!(
                    "{}: CPU seconds per GB (client + server) vs size, depth {depth}",
                    op.name()
                ),
                "bytes per call",
                "CPU s / GB, median and range",
                true,
                &series,
            )?;
            written.push(path);
        }
        let series = lines(op, depth, &|p| Some((p.mb_per_s.median, p.cpu_pct)));
        let path = dir.join(format!("{}-cpu-vs-throughput.svg", op.name()));
        spread_chart(
            &path,
            &format!(
                "{}: CPU (client + server) vs throughput, depth {depth}, small to large calls",
                op.name()
            ),
            "MB/s (median)",
            "CPU, % of one core, median and range",
            false,
            &series,
        )?;
        written.push(path);
    }
    Ok(written)
}
