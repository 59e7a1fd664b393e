//! `rpcrdma-bench conns` with 32 connections: against the real `rpcrdmad`
//! over shm and tcp (with `--server-pid`), and against the embedded
//! servers. Asserts on counts and events only: every connection completed
//! its NULL, the series has the expected idle counts, every point made
//! calls, the memory figures are there when a process is known; and a
//! count beyond the open-file limit ends in one line saying how many
//! connections opened. Never a statement about time.
//!
//! bench does not depend on control, so the daemon is the `rpcrdmad` built
//! next to this bench binary (`cargo build -p control`, which `cargo test
//! --workspace` does); without it that test says `skipped`, or fails under
//! `RPCRDMA_REQUIRE_PEERS=1`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;

use support::{run_bench, BIN};

const COUNT: u64 = 32;
/// The default series for 32 connections.
const SERIES: [u64; 5] = [0, 1, 4, 16, 31];
/// How long the daemon may take to say it started: longer means broken.
const DAEMON_START: Duration = Duration::from_secs(30);

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("rpcrdma-bench-conns-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `rpcrdma-bench ARGS conns --count 32 --json FILE`, checks it
/// succeeded and returns the `conns` part of the document.
fn run_conns(args: &[&str], json: &Path) -> Value {
    let count = COUNT.to_string();
    let mut argv = args.to_vec();
    argv.extend(["--no-pin", "--duration", "0.05", "conns", "--count", &count]);
    let (stdout, doc) = run_bench(&argv, json);
    assert!(stdout.contains("p50(31 idle) / p50(0 idle)"), "{stdout}");
    assert_eq!(doc["command"], "conns");
    doc["conns"].clone()
}

/// Every connection established, the series at the expected idle counts
/// with calls at each point.
fn check_counts(c: &Value, transport: &str) {
    assert_eq!(c["transport"], transport, "{c}");
    assert_eq!(c["count"], COUNT, "{c}");
    assert_eq!(c["established"], COUNT, "{c}");
    assert_eq!(c["connect"]["count"], COUNT, "{c}");
    let idle: Vec<u64> = c["idle_counts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(idle, SERIES, "{c}");
    let series = c["series"].as_array().unwrap();
    assert_eq!(series.len(), SERIES.len());
    for (p, want) in series.iter().zip(SERIES) {
        assert_eq!(p["idle"], want, "{p}");
        assert_eq!(p["result"]["op"], "null", "{p}");
        assert!(p["result"]["calls"].as_u64().unwrap() > 0, "{p}");
    }
}

/// The memory figures of process `pid`: present, and the connections
/// held descriptors that came back when they closed.
fn check_memory(c: &Value, pid: u64) {
    let m = &c["memory"];
    assert_eq!(m["pid"], pid, "{c}");
    for phase in ["before", "open", "closed"] {
        for field in ["rss_kib", "hugetlb_kib", "vm_size_kib", "fds"] {
            assert!(m[phase][field].is_u64(), "{phase}.{field} in {m}");
        }
    }
    let fds = |phase: &str| m[phase]["fds"].as_u64().unwrap();
    assert!(fds("open") > fds("before"), "{m}");
    assert!(fds("closed") < fds("open"), "{m}");
    for field in [
        "committed_per_conn_bytes",
        "address_space_per_conn_bytes",
        "fds_per_conn",
        "committed_returned_pct",
    ] {
        assert!(m[field].is_number(), "{field} in {m}");
    }
}

#[test]
fn embedded_shm_and_tcp_servers_serve_every_connection_at_every_idle_count() {
    let dir = scratch("embedded");
    for transport in ["shm", "tcp"] {
        let json = dir.join(format!("{transport}.json"));
        let c = run_conns(&["--connect", transport], &json);
        check_counts(&c, transport);
        // The embedded server is this process: memory comes without a pid.
        assert!(c["memory"]["scope"].as_str().unwrap().contains("embedded"));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `rpcrdmad` built next to this bench binary, if any.
fn daemon_binary() -> Option<PathBuf> {
    let bin = Path::new(BIN).parent()?.join("rpcrdmad");
    if bin.exists() {
        return Some(bin);
    }
    if std::env::var("RPCRDMA_REQUIRE_PEERS").as_deref() == Ok("1") {
        panic!(
            "{} missing (cargo build -p control), and RPCRDMA_REQUIRE_PEERS=1",
            bin.display()
        );
    }
    println!(
        "skipped: {} not built (cargo build -p control)",
        bin.display()
    );
    None
}

/// The daemon, killed when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn rpcrdmad_serves_every_connection_over_shm_and_tcp_and_reports_its_memory() {
    let Some(bin) = daemon_binary() else {
        return;
    };
    let dir = scratch("daemon");
    let shm = format!("shm://{}/d.sock", dir.display());
    let tcp = "tcp://127.0.0.43:20343";
    let config = dir.join("conns.toml");
    std::fs::write(
        &config,
        format!(
            "[[listeners]]\nurl = \"{shm}\"\n[[listeners]]\nurl = \"{tcp}\"\n\n\
             [workers]\ncores = [0]\nidle = \"adaptive\"\n\n\
             [metrics]\nenabled = false\n\n[rpcbind]\nregister = false\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(&bin)
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rpcrdmad");
    let stderr = child.stderr.take().unwrap();
    let daemon = Daemon(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[rpcrdmad] {line}");
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + DAEMON_START;
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("started") => break,
            Ok(_) => {}
            Err(e) => panic!("rpcrdmad did not say it started: {e}"),
        }
    }
    let pid = u64::from(daemon.0.id());
    for (name, url) in [("shm", shm.as_str()), ("tcp", tcp)] {
        let json = dir.join(format!("{name}.json"));
        let c = run_conns(&["--connect", url, "--server-pid", &pid.to_string()], &json);
        check_counts(&c, name);
        check_memory(&c, pid);
        assert!(c["memory"]["scope"].as_str().unwrap().contains("server"));
    }
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_count_beyond_the_open_file_limit_fails_with_one_line_saying_how_many_opened() {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--no-pin",
        "--duration",
        "0.05",
        "--connect",
        "shm",
        "conns",
        "--count",
        "64",
    ]);
    // SAFETY: setrlimit is async-signal-safe; it only lowers this child's
    // limits (soft and hard, so the bench cannot raise them back) before
    // exec.
    unsafe {
        cmd.pre_exec(|| {
            let rl = libc::rlimit {
                rlim_cur: 40,
                rlim_max: 40,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("run rpcrdma-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    // The embedded server may log its own failure (it shares the limit
    // and may hit it first); the bench's verdict is one line.
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("rpcrdma-bench:"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("rpcrdma-bench: shm: opened "),
        "{stderr}"
    );
    assert!(
        lines[0].contains(" of 64 connections; connection "),
        "{stderr}"
    );
    assert!(lines[0].contains("open-file limit"), "{stderr}");
}
