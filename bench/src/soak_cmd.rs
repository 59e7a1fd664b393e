//! The `soak` subcommand (and its hidden `soak-client` half): arguments,
//! the run, the printed report. The run itself is `bench::soak`.

use std::io::Write;
use std::time::Duration;

use bench::soak::{self, SoakReport, SoakSpec};
use bench::transport::BenchError;

/// The subcommand's arguments (`rpcrdma-bench soak`).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The server's listeners (shm://PATH, roce://IP:PORT, tcp://IP:PORT),
    /// comma-separated; clients are spread over them round-robin.
    #[arg(long, value_delimiter = ',', required = true)]
    pub urls: Vec<String>,
    /// Client processes alive at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub conns: u32,
    /// Length of the run, seconds.
    #[arg(long, default_value_t = 600.0)]
    pub secs: f64,
    /// SIGKILL one client at random every this many seconds and start
    /// another in its place (0: never).
    #[arg(long, default_value_t = 2.0)]
    pub kill_every: f64,
    /// Largest argument or result of a call (at most the server's
    /// transport.max_message less its headers).
    #[arg(long, default_value = "256k", value_parser = crate::parse_size)]
    pub max_size: u32,
    /// Deepest a client goes (at most the server's transport.credits).
    #[arg(long, default_value_t = 16)]
    pub max_depth: u32,
    /// Sample the server's memory (--server-pid) every this many seconds.
    #[arg(long, default_value_t = 5.0)]
    pub sample_every: f64,
    /// Seed of every random choice (default: from the clock; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Packet loss is being injected (the chaos run): a call may fail with
    /// an error, but must still end, and with the right reply if any.
    #[arg(long)]
    pub faults_expected: bool,
}

/// The arguments of one client process (`rpcrdma-bench soak-client`).
#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    #[arg(long)]
    pub url: String,
    #[arg(long)]
    pub secs: f64,
    #[arg(long)]
    pub seed: u64,
    #[arg(long)]
    pub max_size: u32,
    #[arg(long)]
    pub max_depth: u32,
}

/// Runs the soak, prints its report; returns the JSON body and whether
/// the verdict is clean.
///
/// # Errors
/// Bad arguments, or a client that cannot be started.
pub fn run(args: Args, server_pid: Option<u32>) -> Result<(serde_json::Value, bool), BenchError> {
    let secs = |s: f64| Duration::from_secs_f64(s.max(0.0));
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let spec = SoakSpec {
        urls: args.urls,
        conns: args.conns,
        duration: secs(args.secs),
        kill_every: (args.kill_every > 0.0).then(|| secs(args.kill_every)),
        server_pid,
        max_size: args.max_size,
        max_depth: args.max_depth.max(1),
        sample_every: secs(args.sample_every.max(0.1)),
        seed,
        faults_expected: args.faults_expected,
    };
    let exe = std::env::current_exe().map_err(|source| BenchError::Io {
        what: "finding this program to start its soak clients".to_owned(),
        source,
    })?;
    let report = soak::run(&spec, &exe)?;
    let problems = report.problems(spec.faults_expected);
    let _ = print(&mut std::io::stdout().lock(), &spec, &report, &problems);
    let body = serde_json::json!({
        "report": report,
        "problems": problems,
        "faults_expected": spec.faults_expected,
        "urls": spec.urls,
        "conns": spec.conns,
    });
    Ok((body, problems.is_empty()))
}

/// Runs one client, reporting on stdout.
pub fn client(args: ClientArgs) -> Result<(), BenchError> {
    soak::client(
        &args.url,
        Duration::from_secs_f64(args.secs.max(0.0)),
        args.seed,
        args.max_size,
        args.max_depth,
        &mut std::io::stdout().lock(),
    )
}

fn print(
    out: &mut impl Write,
    spec: &SoakSpec,
    r: &SoakReport,
    problems: &[String],
) -> std::io::Result<()> {
    let us = |ns: u64| format!("{:.1} us", ns as f64 / 1e3);
    let t = &r.totals;
    writeln!(
        out,
        "soak: {} clients over {} URL(s) for {:.0} s (seed {}): {} calls answered, {} failed, {} hung, {} duplicated, {} wrong; {} connects ({} refused); {} clients killed, {} started, {} crashed",
        spec.conns,
        spec.urls.len(),
        r.seconds,
        r.seed,
        t.ok,
        t.failed,
        t.hung,
        t.duplicated,
        t.wrong,
        t.connects,
        t.connect_errors,
        r.killed,
        r.started,
        r.crashed
    )?;
    for (url, t) in &r.per_url {
        writeln!(
            out,
            "  {url}: {} answered, {} failed, {} hung, {} duplicated, {} wrong, {} connects ({} refused), {} starts deferred for want of a call slot",
            t.ok, t.failed, t.hung, t.duplicated, t.wrong, t.connects, t.connect_errors, t.busy
        )?;
    }
    writeln!(
        out,
        "latency: p50 {}, p99 {}, p99.9 {}, max {}",
        us(r.latency.p50_ns),
        us(r.latency.p99_ns),
        us(r.p999_ns),
        us(r.latency.max_ns)
    )?;
    if !r.samples.is_empty() {
        writeln!(
            out,
            "server memory:   at s  clients   RSS MiB  hugetlb MiB    fds"
        )?;
        let row = |out: &mut dyn Write, label: &str, s: &soak::Sample| {
            writeln!(
                out,
                "  {label:<12} {:>6.0} {:>8} {:>9.1} {:>12.1} {:>6}",
                s.at_s,
                s.clients,
                s.memory.rss_kib as f64 / 1024.0,
                s.memory.hugetlb_kib as f64 / 1024.0,
                s.memory.fds
            )
        };
        for s in &r.samples {
            row(out, "", s)?;
        }
        if let Some(w) = &r.warm {
            row(out, "warm-up end", w)?;
        }
        if let Some(a) = &r.after {
            row(out, "after", a)?;
        }
    }
    for e in r.errors.iter().rev().take(5) {
        writeln!(out, "last error: {e}")?;
    }
    if problems.is_empty() {
        writeln!(out, "verdict: clean")
    } else {
        writeln!(out, "verdict: {}", problems.join("; "))
    }
}
