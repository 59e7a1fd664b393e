//! `rpcrdma-bench`: the load generator.
//!
//! Subcommands `lat`, `rate`, `read`, `write`, `sweep` run the bench
//! program over a transport (`--connect URL`, or the embedded default) and
//! print a table; `conns` measures many idle connections against a busy
//! one; `floor` measures this machine's physical references; `nfs` runs
//! NFSv3 READ and WRITE through the gateway and over TCP.
//! `--json FILE` writes everything measured as one JSON document. The
//! transports and the run loop are in the library (`bench::transport`,
//! `bench::driver`); `docs/BENCHMARKS.md` has commands and figures.
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bench::output::{self, Machine};
use bench::transport::{
    self, BenchError, Cores, Idle, Op, OpenOptions, RunResult, RunSpec, Transport, TRANSPORTS,
};
use clap::{Parser, Subcommand};
use serde_json::json;

mod ext_cmd;
mod floor;
mod nfs_cmd;
mod soak_cmd;
mod targets;

/// Measure RPC-over-RDMA latency, message rate and bulk throughput against
/// RPC over TCP and the physical floor of this machine.
#[derive(Debug, Parser)]
#[command(name = "rpcrdma-bench", version, about, long_about = None)]
struct Cli {
    /// Server: `tirpc` (embedded libtirpc server), `tirpc://IPV4:PORT`,
    /// `inproc`, `shm`, `tcp`, `roce` (embedded servers), `shm://PATH`,
    /// `tcp://IP:PORT`, `roce://IP:PORT` (a running server such as
    /// rpcrdmad). Without it: `shm` (embedded server).
    #[arg(long, value_name = "URL", global = true)]
    connect: Option<String>,
    /// Measured seconds per run (sweep, conns: per point). Default: 2 for lat,
    /// 1 for rate/read/write and conns points, 0.5 for sweep points.
    #[arg(long, value_name = "SECS", global = true)]
    duration: Option<f64>,
    /// Also write everything measured to FILE as JSON.
    #[arg(long, value_name = "FILE", global = true)]
    json: Option<PathBuf>,
    /// PID of the --connect server's process, to report its CPU time
    /// (from /proc/PID/stat; without it the server CPU is n/a) and, for
    /// conns, its memory (/proc/PID/smaps_rollup, status, fd).
    #[arg(long, value_name = "PID", global = true)]
    server_pid: Option<u32>,
    /// Busy-poll for completions, never yield the core (default: spin a
    /// little, then yield).
    #[arg(long, global = true)]
    spin: bool,
    /// Server core and client core for embedded servers and `floor`
    /// (default 0,1 on machines with two or more cores).
    #[arg(
        long,
        value_delimiter = ',',
        num_args = 2,
        value_name = "SERVER,CLIENT",
        global = true
    )]
    cores: Option<Vec<usize>>,
    /// Do not pin embedded servers and clients (the scheduler places
    /// them; on a shared machine this avoids queueing behind other work
    /// on a fixed core).
    #[arg(long, global = true)]
    no_pin: bool,
    /// RPC-over-RDMA extensions for `shm` and `roce`: comma-separated
    /// names (responder_read_chunks, remote_invalidate,
    /// message_continuation, send_placement), `all` or `none` (the
    /// default). The client offers them in CONF_RDMA version 2 and an
    /// embedded server offers them too; each transport prints the set
    /// negotiated once (docs/EXTENSIONS.md). `nfs` offers them to the
    /// gateway (rpcrdmad uses what its `[transport] extensions` lists).
    #[arg(
        long,
        value_name = "LIST",
        global = true,
        value_parser = dataplane::extension_names::parse_list
    )]
    extensions: Option<dataplane::engine::Extensions>,
    #[command(subcommand)]
    command: Option<Cmd>,
}

/// Parses `4096`, `4k`, `1m` (KiB, MiB).
pub(crate) fn parse_size(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let (digits, unit) = match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&t[..t.len() - 1], 1u64 << 20),
        _ => (t, 1),
    };
    let v = digits
        .parse::<u64>()
        .map_err(|e| format!("{s:?}: {e}"))?
        .checked_mul(unit)
        .filter(|&v| v <= u64::from(dataplane::service::bench::MAX_DATA))
        .ok_or_else(|| format!("{s:?}: at most 16m"))?;
    Ok(v as u32)
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Latency, one call outstanding: NULL (size 0) or ECHO of SIZE bytes.
    Lat {
        /// ECHO argument bytes; 0 calls NULL.
        #[arg(long, default_value = "0", value_parser = parse_size)]
        size: u32,
        /// Check every ECHO reply's bytes against the pattern.
        #[arg(long)]
        check: bool,
        /// Microseconds the client waits between a reply and its next
        /// call (not counted in the latency): calls that find an idle
        /// server, as an occasional client's do.
        #[arg(long, default_value_t = 0)]
        gap_us: u64,
    },
    /// Message rate: NULL calls pipelined at DEPTH.
    Rate {
        /// Calls in flight.
        #[arg(long, default_value_t = 16)]
        depth: u32,
    },
    /// Bulk READ: SOURCE(SIZE) calls at DEPTH (over RDMA the data comes in
    /// a write chunk).
    Read {
        /// Bytes per call.
        #[arg(long, default_value = "256k", value_parser = parse_size)]
        size: u32,
        /// Calls in flight.
        #[arg(long, default_value_t = 4)]
        depth: u32,
        /// Hash every reply's bytes and compare with the SOURCE pattern.
        #[arg(long)]
        check: bool,
    },
    /// Bulk WRITE: SINK calls of SIZE bytes at DEPTH (over RDMA the data
    /// goes in a read chunk).
    Write {
        /// Bytes per call.
        #[arg(long, default_value = "256k", value_parser = parse_size)]
        size: u32,
        /// Calls in flight.
        #[arg(long, default_value_t = 4)]
        depth: u32,
    },
    /// READ and WRITE over sizes x depths for each transport: a table,
    /// JSON, and SVG plots shaped like the Sun NFS/RDMA paper's figures
    /// 15-18.
    Sweep {
        /// Transports (URLs as for --connect); unavailable ones are
        /// reported and skipped. Default: --connect, else shm,tcp,tirpc.
        #[arg(long, value_delimiter = ',')]
        transports: Option<Vec<String>>,
        /// Sizes (default 512 B .. 1 MiB in powers of two).
        #[arg(long, value_delimiter = ',', value_parser = parse_size)]
        sizes: Option<Vec<u32>>,
        /// Depths.
        #[arg(long, value_delimiter = ',', default_values_t = [1u32, 2, 4, 8, 16])]
        depths: Vec<u32>,
        /// Operations: read, write.
        #[arg(long, value_delimiter = ',', default_values_t = ["read".to_owned(), "write".to_owned()])]
        ops: Vec<String>,
        /// Directory for the SVG plots.
        #[arg(long, default_value = "bench-plots")]
        plots: PathBuf,
        /// Depth of the CPU plots (the paper used 4).
        #[arg(long, default_value_t = 4)]
        cpu_depth: u32,
        /// Repetitions of every point: a point is their median, drawn
        /// with their range. The repetitions of a point run in separate
        /// rounds over the whole sweep, so that a burst of load elsewhere
        /// hits one repetition of many points, not every repetition of one.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
        reps: u32,
    },
    /// The physical floor: cross-core cache-line ping-pong vs shm RDMA
    /// Write and Send round trips (two pinned processes), and single-core
    /// memcpy bandwidth.
    Floor {
        /// Round trips per ping-pong.
        #[arg(long, default_value_t = 200_000)]
        iters: u64,
        /// memcpy buffer bytes (default: 4 x LLC, at least 64 MiB).
        #[arg(long, value_parser = parse_size)]
        memcpy_size: Option<u32>,
    },
    /// Every performance target of docs/BENCHMARKS.md, in one run: the floor, shm
    /// and libtirpc NULL latency, shm message rate, shm and TCP READ 256
    /// KiB at depth 8 (busy-polling), roce against TCP (NULL p50 and p99,
    /// READ 256 KiB at depth 8), and CPU per GB of shm and roce against
    /// TCP (adaptive), printed
    /// as the ratios the targets name with met / missed by how much.
    /// Embedded servers only (--connect is ignored). Each target is the
    /// median of its ratio over ROUNDS rounds, each round taking both
    /// sides of every ratio back to back.
    Targets {
        /// Round trips per floor ping-pong.
        #[arg(long, default_value_t = 100_000)]
        iters: u64,
        /// memcpy buffer bytes (default: 4 x LLC, at least 64 MiB).
        #[arg(long, value_parser = parse_size)]
        memcpy_size: Option<u32>,
        /// Rounds of the transport runs; each target is the median of its
        /// per-round ratios.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// What the RPC-over-RDMA extensions buy (message continuation and
    /// send-based data placement), in one run: for shm and roce (embedded
    /// servers), ECHO, READ and WRITE of each size at depth 1 (the data
    /// as the message's DDP-eligible item, as NFS carries it),
    /// busy-polling, once plain Version One and once with every extension
    /// offered on both sides: round trips per call and p50 latency each
    /// way, and their ratio (goal: at most 0.7x where the extensions carry
    /// the call in Sends alone).
    Extensions {
        /// Sizes (default 8k,16k,32k,64k).
        #[arg(long, value_delimiter = ',', value_parser = parse_size)]
        sizes: Option<Vec<u32>>,
        /// Transports: shm, roce (embedded servers).
        #[arg(long, value_delimiter = ',', default_values_t = ["shm".to_owned(), "roce".to_owned()])]
        transports: Vec<String>,
    },
    /// Many idle connections against one busy one: opens COUNT connections
    /// to the server (each completes one NULL; one of them then stays
    /// busy), and reports connect time, the server's memory per connection
    /// (--server-pid; an embedded server: this process) before, open and
    /// after close, and the busy connection's NULL latency at idle counts
    /// 0 .. COUNT-1 in one run. shm, roce, tcp (embedded or URL).
    Conns {
        /// Connections in all, the busy one included.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        count: u32,
        /// Measure at idle counts 0, STEP, 2 STEP, ..., COUNT-1 (default
        /// 0, 1, 4, 16, 64, 256, 1024 capped at COUNT-1).
        #[arg(long)]
        step: Option<u32>,
    },
    /// NFSv3 sequential READ and WRITE of one file, sizes x depths, through
    /// rpcrdmad's storage gateway over RPC-over-RDMA (--gateway) and over
    /// TCP straight to the NFS server (--direct), compared point by point
    /// in one run: a table, RDMA/TCP ratios, JSON, SVG plots.
    Nfs {
        #[command(flatten)]
        args: nfs_cmd::Args,
    },
    /// A soak: many client processes (shm, roce, tcp) against a running
    /// server for a long time, killed and restarted at random, mixed
    /// operations, sizes and depths; every reply checked. Reports lost,
    /// duplicated and wrong replies (none expected), the server's memory
    /// over time (--server-pid) and p99.9 latency; exits 1 unless clean.
    Soak {
        #[command(flatten)]
        args: soak_cmd::Args,
    },
    /// One client of `soak` (spawned by it).
    #[command(hide = true)]
    SoakClient {
        #[command(flatten)]
        args: soak_cmd::ClientArgs,
    },
    /// The responder half of `floor` (spawned by it).
    #[command(hide = true)]
    FloorPeer {
        #[arg(long)]
        url: String,
        #[arg(long)]
        page: String,
        #[arg(long)]
        core: usize,
        #[arg(long)]
        iters: u64,
    },
}

/// Progress on stderr while runs are under way: on a terminal a one-line
/// display redrawn in place (label, runs done, elapsed/expected time);
/// otherwise (a pipe, a log file) a plain line every
/// [`PROGRESS_LINE_EVERY`], so a long sweep is never silent.
struct Progress {
    state: Arc<Mutex<(String, usize)>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How often a non-terminal stderr gets a progress line.
const PROGRESS_LINE_EVERY: Duration = Duration::from_secs(10);

impl Progress {
    fn start(total_runs: usize, expected: Duration) -> Progress {
        let state = Arc::new(Mutex::new((String::new(), 0usize)));
        let stop = Arc::new(AtomicBool::new(false));
        let terminal = std::io::stderr().is_terminal();
        if total_runs > 1 {
            eprintln!(
                "{total_runs} runs, about {:.0} s",
                expected.as_secs_f64().ceil()
            );
        }
        let thread = {
            let (state, stop) = (Arc::clone(&state), Arc::clone(&stop));
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let mut last_line = t0;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    let (label, done) = state.lock().map(|s| s.clone()).unwrap_or_default();
                    let elapsed = t0.elapsed().as_secs_f64();
                    if terminal {
                        let frac = (elapsed / expected.as_secs_f64().max(1e-3)).min(1.0);
                        let bar = (frac * 30.0) as usize;
                        eprint!(
                            "\r[{}{}] {done}/{total_runs} runs, {elapsed:.0}/{:.0} s  {label:<40}",
                            "#".repeat(bar),
                            " ".repeat(30 - bar),
                            expected.as_secs_f64()
                        );
                    } else if last_line.elapsed() >= PROGRESS_LINE_EVERY {
                        last_line = Instant::now();
                        eprintln!(
                            "progress: {done}/{total_runs} runs, {elapsed:.0}/{:.0} s, now {label}",
                            expected.as_secs_f64()
                        );
                    }
                }
                if terminal {
                    eprint!("\r{:100}\r", "");
                }
            })
        };
        Progress {
            state,
            stop,
            thread: Some(thread),
        }
    }

    fn set(&self, label: String, done: usize) {
        if let Ok(mut s) = self.state.lock() {
            *s = (label, done);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Common {
    connect: Option<String>,
    duration: Option<f64>,
    idle: Idle,
    open: OpenOptions,
    cores: (usize, usize),
}

impl Common {
    fn duration(&self, default: f64) -> Duration {
        Duration::from_secs_f64(self.duration.unwrap_or(default).max(0.001))
    }
}

fn header(command: &str, common: &Common) -> serde_json::Value {
    json!({
        "tool": "rpcrdma-bench",
        "version": env!("CARGO_PKG_VERSION"),
        "command": command,
        "unix_time": output::unix_time(),
        "machine": Machine::this(),
        "idle": common.idle,
        "extensions": dataplane::extension_names::Names(common.open.extensions).to_string(),
    })
}

fn print_results(results: &[RunResult]) {
    let mut out = std::io::stdout().lock();
    let _ = output::print_table(&mut out, results);
}

/// One run of one spec on the --connect transport.
fn single(command: &str, spec: RunSpec, common: &Common) -> Result<serde_json::Value, BenchError> {
    let mut t = transport::open(common.connect.as_deref(), &common.open)?;
    println!("{}", t.describe());
    let progress = (spec.duration > Duration::from_secs(2))
        .then(|| Progress::start(1, spec.duration + Duration::from_millis(200)));
    if let Some(p) = &progress {
        p.set(format!("{} {}", t.name(), spec.op.name()), 0);
    }
    let r = t
        .run(&spec)
        .map_err(|e| transport::explain_size_limit(e, &spec))?;
    drop(progress);
    print_results(std::slice::from_ref(&r));
    if let Some(c) = &r.check {
        if !c.ok {
            return Err(BenchError::Call {
                transport: t.name(),
                reason: "reply bytes differ from the SOURCE pattern".to_owned(),
            });
        }
    }
    let mut doc = header(command, common);
    doc["transports"] = json!([t.describe()]);
    doc["results"] = json!([r]);
    Ok(doc)
}

#[allow(clippy::too_many_arguments)]
/// The `sweep` subcommand's arguments.
struct SweepArgs {
    transports: Option<Vec<String>>,
    sizes: Option<Vec<u32>>,
    depths: Vec<u32>,
    ops: Vec<String>,
    plots: PathBuf,
    cpu_depth: u32,
    reps: u32,
}

fn sweep(common: &Common, args: SweepArgs) -> Result<serde_json::Value, BenchError> {
    let SweepArgs {
        transports,
        sizes,
        depths,
        ops,
        plots,
        cpu_depth,
        reps,
    } = args;
    let urls = transports.unwrap_or_else(|| match &common.connect {
        Some(c) => vec![c.clone()],
        None => ["shm", "tcp", "tirpc"].map(str::to_owned).to_vec(),
    });
    let sizes = sizes.unwrap_or_else(|| (9..=20).map(|p| 1u32 << p).collect());
    let ops: Vec<Op> = ops
        .iter()
        .map(|o| match o.as_str() {
            "read" => Ok(Op::Read),
            "write" => Ok(Op::Write),
            other => Err(BenchError::Unsupported {
                transport: "sweep",
                reason: format!("unknown op {other:?} (read, write)"),
            }),
        })
        .collect::<Result<_, _>>()?;
    let duration = common.duration(0.5);
    let mut opened: Vec<Box<dyn Transport>> = Vec::new();
    let mut skipped = Vec::new();
    for url in &urls {
        match transport::open(Some(url), &common.open) {
            Ok(t) => {
                println!("{}", t.describe());
                opened.push(t);
            }
            Err(e) => {
                eprintln!("sweep: skipping {url}: {e}");
                skipped.push(json!({"transport": url, "reason": e.to_string()}));
            }
        }
    }
    if opened.is_empty() {
        return Err(BenchError::Unsupported {
            transport: "sweep",
            reason: format!("no transport of {urls:?} is available"),
        });
    }
    let total = reps as usize * opened.len() * ops.len() * sizes.len() * depths.len();
    // Each point also starts a client and waits for its calls to drain.
    let expected = (duration + Duration::from_millis(50)) * total as u32;
    let progress = Progress::start(total, expected);
    let mut results = Vec::with_capacity(total);
    let mut done = 0;
    for rep in 1..=reps {
        for t in &mut opened {
            for &op in &ops {
                for &depth in &depths {
                    for &size in &sizes {
                        progress.set(
                            format!(
                                "round {rep}/{reps}: {} {} {} depth {depth}",
                                t.name(),
                                op.name(),
                                output::size_label(size)
                            ),
                            done,
                        );
                        let mut spec = RunSpec::new(op, size, depth, duration);
                        spec.idle = common.idle;
                        spec.warmup_calls = 10;
                        results.push(
                            t.run(&spec)
                                .map_err(|e| transport::explain_size_limit(e, &spec))?,
                        );
                        done += 1;
                    }
                }
            }
        }
    }
    drop(progress);
    print_results(&results);
    let points = output::sweep_points(&results);
    let written = output::plot_sweep(&plots, &results, cpu_depth).map_err(|reason| {
        BenchError::Unsupported {
            transport: "sweep",
            reason: format!("plotting failed: {reason}"),
        }
    })?;
    for p in &written {
        println!("plot: {}", p.display());
    }
    let mut doc = header("sweep", common);
    doc["transports"] = json!(opened.iter().map(|t| t.describe()).collect::<Vec<_>>());
    doc["skipped"] = json!(skipped);
    doc["reps"] = json!(reps);
    doc["results"] = json!(results);
    doc["points"] = json!(points);
    doc["plots"] = json!(written);
    Ok(doc)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cores = match cli.cores.as_deref() {
        Some([s, c]) => Some(Cores {
            server: *s,
            client: *c,
        }),
        _ => Cores::default_pair(),
    };
    let pin = if cli.no_pin { None } else { cores };
    let idle = if cli.spin { Idle::Spin } else { Idle::Adaptive };
    let common = Common {
        connect: cli.connect,
        duration: cli.duration,
        idle,
        open: OpenOptions {
            cores: pin,
            idle,
            server_pid: cli.server_pid,
            extensions: cli.extensions.unwrap_or_default(),
            bulk_in_messages: false,
        },
        cores: cores.map_or((0, 0), |c| (c.server, c.client)),
    };
    let spec = |op, size, depth, default_s| {
        let mut s = RunSpec::new(op, size, depth, common.duration(default_s));
        s.idle = common.idle;
        s
    };
    let doc = match cli.command {
        Some(Cmd::Lat {
            size,
            check,
            gap_us,
        }) => {
            let op = if size == 0 { Op::Null } else { Op::Echo };
            let mut s = spec(op, size, 1, 2.0);
            s.check = check;
            s.gap = std::time::Duration::from_micros(gap_us);
            single("lat", s, &common)
        }
        Some(Cmd::Rate { depth }) => single("rate", spec(Op::Null, 0, depth, 1.0), &common),
        Some(Cmd::Read { size, depth, check }) => {
            let mut s = spec(Op::Read, size, depth, 1.0);
            s.check = check;
            single("read", s, &common)
        }
        Some(Cmd::Write { size, depth }) => {
            single("write", spec(Op::Write, size, depth, 1.0), &common)
        }
        Some(Cmd::Sweep {
            transports,
            sizes,
            depths,
            ops,
            plots,
            cpu_depth,
            reps,
        }) => sweep(
            &common,
            SweepArgs {
                transports,
                sizes,
                depths,
                ops,
                plots,
                cpu_depth,
                reps,
            },
        ),
        Some(Cmd::Floor { iters, memcpy_size }) => {
            let bytes = memcpy_size.map_or_else(bench::membw::default_buffer_bytes, |b| b as usize);
            let report = floor::run(iters.max(100), common.cores, bytes, common.duration(0.5));
            let mut doc = header("floor", &common);
            doc["floor"] = json!(report);
            Ok(doc)
        }
        Some(Cmd::Targets {
            iters,
            memcpy_size,
            rounds,
        }) => {
            let bytes = memcpy_size.map_or_else(bench::membw::default_buffer_bytes, |b| b as usize);
            let duration = common.duration(2.0);
            let rounds = rounds.max(1);
            targets::run(
                &common.open,
                common.cores,
                duration,
                iters.max(100),
                bytes,
                rounds,
            )
            .map(|report| {
                let mut doc = header("targets", &common);
                doc["targets"] = json!(report);
                doc
            })
        }
        Some(Cmd::Extensions { sizes, transports }) => {
            let sizes = sizes.unwrap_or_else(|| vec![8 << 10, 16 << 10, 32 << 10, 64 << 10]);
            ext_cmd::run(&common.open, common.duration(0.5), &sizes, &transports).map(|report| {
                let mut doc = header("extensions", &common);
                doc["extensions_compared"] = json!(report);
                doc
            })
        }
        Some(Cmd::Conns { count, step }) => {
            let spec = bench::conns::ConnsSpec {
                count,
                step,
                duration: common.duration(1.0),
                idle: common.idle,
                server_pid: cli.server_pid,
            };
            bench::conns::run(common.connect.as_deref(), &common.open, &spec).map(|report| {
                println!("{}", report.describe);
                let _ = output::print_conns(&mut std::io::stdout().lock(), &report);
                let mut doc = header("conns", &common);
                doc["conns"] = json!(report);
                doc
            })
        }
        Some(Cmd::Nfs { args }) => nfs_cmd::run(
            common.duration(0.5),
            common.idle,
            common.open.extensions,
            args,
        )
        .map(|body| {
            let mut doc = header("nfs", &common);
            if let serde_json::Value::Object(m) = body {
                for (k, v) in m {
                    doc[k] = v;
                }
            }
            doc
        }),
        Some(Cmd::Soak { args }) => match soak_cmd::run(args, cli.server_pid) {
            Ok((body, clean)) => {
                let mut doc = header("soak", &common);
                doc["soak"] = body;
                if let Some(path) = &cli.json {
                    if let Err(e) = output::write_json(path, &doc) {
                        eprintln!("rpcrdma-bench: cannot write {}: {e}", path.display());
                        return ExitCode::FAILURE;
                    }
                }
                return if clean {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                };
            }
            Err(e) => Err(e),
        },
        Some(Cmd::SoakClient { args }) => {
            return match soak_cmd::client(args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rpcrdma-bench soak-client: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Some(Cmd::FloorPeer {
            url,
            page,
            core,
            iters,
        }) => {
            floor::peer(&url, &page, core, iters.max(100));
            return ExitCode::SUCCESS;
        }
        None => {
            eprintln!(
                "rpcrdma-bench: give a subcommand: lat, rate, read, write, sweep, nfs, conns, soak, floor, targets (--help); transports: {}",
                TRANSPORTS
                    .iter()
                    .map(|t| format!("{}{}", t.0, if t.2.is_some() { " (not built)" } else { "" }))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return ExitCode::from(2);
        }
    };
    let doc = match doc {
        Ok(d) => d,
        Err(e) => {
            eprintln!("rpcrdma-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(path) = &cli.json {
        if let Err(e) = output::write_json(path, &doc) {
            eprintln!("rpcrdma-bench: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
