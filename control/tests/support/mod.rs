//! Helpers shared by the daemon's integration tests: scratch directories,
//! running the real `rpcrdmad` binary, waiting for its log lines, signals,
//! and the "real peer" rule.
#![allow(dead_code)]

pub mod bench_calls;
pub mod roce_reqs;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Generous bound for anything the daemon does at start or stop. Only a
/// guard against hanging: never an assertion about speed.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The daemon binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_rpcrdmad");

/// A fresh directory for one test, removed and re-created.
pub fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rpcrdmad-test-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Finds `tool` on PATH (and in /usr/sbin, /sbin, where rpcbind lives).
pub fn find_tool(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// The real-peer rule: `Some(path)` when `tool` is installed; otherwise
/// fails under `RPCRDMA_REQUIRE_PEERS=1`, else prints
/// `skipped: TOOL not installed` and returns `None`.
pub fn require_peer(tool: &str) -> Option<PathBuf> {
    match find_tool(tool) {
        Some(p) => Some(p),
        None if std::env::var("RPCRDMA_REQUIRE_PEERS").as_deref() == Ok("1") => {
            panic!("{tool} not installed and RPCRDMA_REQUIRE_PEERS=1")
        }
        None => {
            println!("skipped: {tool} not installed");
            None
        }
    }
}

/// A running daemon whose stderr is collected line by line.
pub struct Daemon {
    pub child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    rx: mpsc::Receiver<String>,
}

impl Daemon {
    /// Starts `rpcrdmad ARGS`.
    pub fn spawn(args: &[&str]) -> Daemon {
        let mut child = Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rpcrdmad");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[rpcrdmad] {line}");
                sink.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        Daemon { child, lines, rx }
    }

    /// Waits for a stderr line containing `needle`; panics (after killing
    /// the daemon) when the daemon exits first or PATIENCE runs out.
    pub fn wait_for_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => continue,
                Err(_) => {
                    let _ = self.child.kill();
                    panic!(
                        "no line containing {needle:?}; stderr so far:\n{}",
                        self.stderr()
                    );
                }
            }
        }
    }

    /// Everything the daemon wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Sends `sig` to the daemon.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, sig).expect("kill");
    }

    /// Waits for the daemon to exit (killing it after PATIENCE) and
    /// returns its status once its stderr is fully read.
    pub fn wait(&mut self) -> ExitStatus {
        let status = wait_child(&mut self.child);
        // The reader thread ends at EOF; drain what it still sends.
        let deadline = Instant::now() + PATIENCE;
        while let Ok(_line) = self
            .rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {}
        status
    }

    /// SIGTERM: the daemon exits 0 with every pool back to full.
    pub fn stop_cleanly(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        assert_eq!(self.wait().code(), Some(0), "{}", self.stderr());
        assert!(
            self.stderr().contains("every pool back to full"),
            "{}",
            self.stderr()
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits for `child`, killing it after PATIENCE.
pub fn wait_child(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("process {} did not exit", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `rpcrdmad ARGS` to completion: (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rpcrdmad");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = wait_child(&mut child);
    (status.code(), t_out.join().unwrap(), t_err.join().unwrap())
}

/// `GET path` over HTTP/1.1; returns (status line, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect_timeout(&addr, PATIENCE).expect("connect to metrics");
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("HTTP head");
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

impl Daemon {
    /// Starts the daemon through `cmd`, a command that ends up exec'ing
    /// [`BIN`] in the same process (e.g. `ip netns exec NS BIN ARGS`, which
    /// switches namespace and execs: the child's pid is the daemon's, so
    /// [`Daemon::signal`] reaches it).
    pub fn spawn_command(mut cmd: Command) -> Daemon {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rpcrdmad");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[rpcrdmad] {line}");
                sink.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        Daemon { child, lines, rx }
    }
}

/// `promtool check metrics` accepts `body` (the real-peer rule applies:
/// without promtool, skipped or failed per RPCRDMA_REQUIRE_PEERS).
pub fn promtool_accepts(body: &str) {
    let Some(promtool) = require_peer("promtool") else {
        return;
    };
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run promtool");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// IPv4 packets of a pcap file (Ethernet link type, as on a veth or a
/// tap), without UDP datagrams to `skip_port` (a test's capture probes).
#[allow(dead_code)]
pub fn ip_packets(pcap: &[u8], skip_port: u16) -> Vec<Vec<u8>> {
    assert!(pcap.len() >= 24, "pcap header");
    let le = pcap[0..4] == [0xd4, 0xc3, 0xb2, 0xa1];
    let rd32 = |b: &[u8]| {
        let a = [b[0], b[1], b[2], b[3]];
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    assert_eq!(rd32(&pcap[20..24]), 1, "Ethernet link type");
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let incl = rd32(&pcap[at + 8..at + 12]) as usize;
        let Some(frame) = pcap.get(at + 16..at + 16 + incl) else {
            break;
        };
        // IPv4 (EtherType 0x0800) only: a tap also carries IPv6 router
        // solicitations and the like.
        if frame.len() > 14 + 24 && frame[12..14] == [0x08, 0x00] {
            let ipf = &frame[14..];
            if u16::from_be_bytes([ipf[22], ipf[23]]) != skip_port {
                out.push(ipf.to_vec());
            }
        }
        at += 16 + incl;
    }
    out
}

/// The real-peer rule for a missing tool or right: fail under
/// `RPCRDMA_REQUIRE_PEERS=1`, else say `skipped: ...` and pass.
#[allow(dead_code)]
pub fn skip(why: &str) {
    if std::env::var("RPCRDMA_REQUIRE_PEERS").as_deref() == Ok("1") {
        panic!("{why} and RPCRDMA_REQUIRE_PEERS=1");
    }
    println!("skipped: {why}");
}

/// The median of `calls` round trips of `call` (given a call number):
/// the good client's latency the hostile tests report beside its quiet
/// figure. Printed, never asserted: the machine's load moves it.
#[allow(dead_code)]
pub fn median_round_trip(calls: u32, mut call: impl FnMut(u32)) -> Duration {
    let mut took: Vec<Duration> = (0..calls)
        .map(|i| {
            let t = std::time::Instant::now();
            call(i);
            t.elapsed()
        })
        .collect();
    took.sort_unstable();
    took.get(took.len() / 2).copied().unwrap_or_default()
}

/// One line comparing a good client's median NULL round trip under an
/// attack with its quiet one.
#[allow(dead_code)]
pub fn report_good_client(what: &str, quiet: Duration, attacked: Duration) {
    println!(
        "good client NULL p50 ({what}): quiet {quiet:?}, under attack {attacked:?} ({:.2}x)",
        attacked.as_secs_f64() / quiet.as_secs_f64().max(1e-9)
    );
}

/// The sum of every sample of the metric `name` in a Prometheus body.
#[allow(dead_code)]
pub fn metric(body: &str, name: &str) -> u64 {
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The sum of `rpcrdma_listener_rejected_total` for `reason` in a
/// Prometheus body.
#[allow(dead_code)]
pub fn rejected(body: &str, reason: &str) -> u64 {
    body.lines()
        .filter(|l| {
            l.starts_with("rpcrdma_listener_rejected_total{")
                && l.contains(&format!("reason=\"{reason}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// `tshark -r FILE ARGS`: its standard output; panics when it fails.
#[allow(dead_code)]
pub fn tshark_out(tshark: &Path, file: &Path, args: &[&str]) -> String {
    let out = Command::new(tshark)
        .arg("-r")
        .arg(file)
        .args(args)
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[allow(dead_code)]
/// Scrapes `/metrics` until the sum of `name` reaches `at_least` (a worker
/// folds its TCP counters in just after the pass that wrote the replies,
/// so a client can be ahead of them); PATIENCE only catches a hang.
pub fn scrape_until(metrics: SocketAddr, name: &str, at_least: u64) -> String {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let (status, body) = http_get(metrics, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK");
        let v = metric(&body, name);
        if v >= at_least {
            return body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} {v} < {at_least}:\n{body}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// dumpcap capturing on `tap0` of a network namespace, stopped by
/// [`Capture::finish`] (SIGINT: it flushes and closes the file) or on
/// drop, a failure's included: the capture is what explains it.
pub struct Capture(Child);

impl Capture {
    /// Starts `dumpcap` in `netns` with capture `filter`, writing `file`
    /// (pcapng); `snaplen` bytes of each frame when given. Returns once
    /// dumpcap says it is capturing.
    pub fn start(
        netns: &str,
        dumpcap: &Path,
        filter: &str,
        snaplen: Option<&str>,
        file: &Path,
    ) -> Capture {
        let mut cmd = Command::new(find_tool("ip").expect("ip"));
        cmd.args(["netns", "exec", netns])
            .arg(dumpcap)
            .args(["-i", "tap0", "-f", filter]);
        if let Some(n) = snaplen {
            cmd.args(["-s", n]);
        }
        let mut child = cmd
            .args(["-P", "-w"])
            .arg(file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run dumpcap");
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while err.read_line(&mut line).unwrap_or(0) > 0 {
            if line.contains("Capturing on") {
                // Keep draining stderr so dumpcap never blocks on it.
                std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
                return Capture(child);
            }
            line.clear();
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("dumpcap did not start: {line}");
    }

    /// SIGINT: dumpcap flushes and closes the file.
    pub fn finish(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
            let _ = wait_child(&mut self.0);
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop();
    }
}
