//! RoCEv2 between two hosts, played by two network namespaces joined by a
//! veth pair that the test creates: the real `rpcrdmad`
//! runs in namespace A with a `roce://10.77.0.1:20049` listener, the
//! client (this test binary, re-executed under `ip netns exec B`) connects
//! from 10.77.0.2 with `Client::<Roce>`. Nothing crosses loopback: every
//! packet goes over the veth, as it would over a cable.
//!
//! * `bench_program_between_namespaces`: NULL, echo through a read chunk
//!   and a write chunk, through a reply chunk, and as a long call, 0 B to
//!   1 MiB; SOURCE into write chunks; SINK from a read chunk; every byte
//!   checked; then SIGTERM and exit 0.
//! * `tshark_decodes_a_whole_session_between_namespaces`: the same kind of
//!   session captured on the daemon's veth with dumpcap, then read back
//!   with tshark: CM REQ/REP/RTU and DREQ/DREP, RPC-over-RDMA headers with
//!   the XIDs the client used and the chunk lists each path needs, RPC
//!   calls and replies with the same XIDs, no malformed frame, no expert
//!   error, and the ICRC of every frame recomputed by
//!   `dataplane::wire::roce::icrc`.
//!
//! Needs root (namespaces, veth, capture). The real-peer rule: without
//! `ip` (iproute2), without the right to create namespaces, or (second
//! test) without tshark/dumpcap, the test fails when
//! `RPCRDMA_REQUIRE_PEERS=1`, else prints `skipped: ...` and passes.
//! `KEEP_PCAP=1` keeps the capture (its path is printed).
//!
//! The namespaces are removed when the test ends, panics included (a
//! guard's `Drop`), and a later run removes those of a test process that
//! was killed.
mod support;

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use dataplane::client::{Client, ReplyTarget};
use dataplane::service::bench::{self, Args};
use dataplane::verbs::roce::Roce;
use dataplane::wire::roce::icrc;
use nix::sys::signal::Signal;
use support::bench_calls::{call_with_xid, client_config, echo, EchoPath};
use support::*;

const MIB: u32 = 1 << 20;
/// The daemon's address (namespace A) and the client's (namespace B).
const ADDR_A: &str = "10.77.0.1";
const ADDR_B: &str = "10.77.0.2";
/// The NFS/RDMA port (RFC 5666 s10). tshark 4.0 would decode
/// RPC-over-RDMA on any port (its heuristic checks the header itself, see
/// docs/ROCE.md); 20049 is what an NFS/RDMA user would run.
const URL: &str = "roce://10.77.0.1:20049";
/// The daemon's metrics, inside namespace A (reached by the client over
/// the veth).
const METRICS: &str = "10.77.0.1:19491";
/// Capture probes and end markers go to this UDP port (discard) on A.
const PROBE_PORT: u16 = 9;
const MAX_MESSAGE: u32 = 2 * MIB + 4096;
/// Hang guard for the client process (debug builds, 1 MiB transfers over
/// a 1 KiB MTU): never a statement about speed.
const CLIENT_PATIENCE: Duration = Duration::from_secs(600);

/// Set in the re-executed test binary: which client part to run.
const ROLE_ENV: &str = "RPCRDMA_NETNS_ROLE";
/// Set for the capture client: the capture file it probes.
const PCAP_ENV: &str = "RPCRDMA_NETNS_PCAP";

// ---------------------------------------------------------------------------
// The real-peer rule and namespaces

/// Runs `ip ARGS`; Err(stderr) when it fails.
fn ip(ip: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new(ip)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two namespaces joined by a veth pair, addressed 10.77.0.1/24 (A) and
/// 10.77.0.2/24 (B). Deleting a namespace deletes its end of the veth and
/// with it the pair.
struct Namespaces {
    ip: PathBuf,
    a: String,
    b: String,
    /// The veth end in A (where the capture runs).
    veth_a: String,
}

const NS_PREFIX: &str = "rpcrdma-test-";

impl Namespaces {
    /// Creates the pair for test `tag` (a short word); `None` after the
    /// real-peer rule said "skipped".
    fn create(tag: &str) -> Option<Namespaces> {
        let Some(ip_tool) = find_tool("ip") else {
            skip("ip (iproute2) not installed");
            return None;
        };
        remove_stale_namespaces(&ip_tool);
        let pid = std::process::id();
        let ns = Namespaces {
            a: format!("{NS_PREFIX}{pid}-{tag}-a"),
            b: format!("{NS_PREFIX}{pid}-{tag}-b"),
            // Interface names have at most 15 bytes.
            veth_a: format!("rv{}{}a", pid % 1_000_000, &tag[..1]),
            ip: ip_tool,
        };
        let veth_b = format!("rv{}{}b", pid % 1_000_000, &tag[..1]);
        if let Err(e) = ip(&ns.ip, &["netns", "add", &ns.a]) {
            skip(&format!("cannot create network namespaces ({e})"));
            return None;
        }
        // From here on, Drop cleans up whatever was made.
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", &ns.b],
            vec![
                "link", "add", &ns.veth_a, "type", "veth", "peer", "name", &veth_b,
            ],
            vec!["link", "set", &ns.veth_a, "netns", &ns.a],
            vec!["link", "set", &veth_b, "netns", &ns.b],
        ];
        for s in &steps {
            ip(&ns.ip, s).unwrap_or_else(|e| panic!("{e}"));
        }
        for (netns, dev, addr) in [(&ns.a, &ns.veth_a, ADDR_A), (&ns.b, &veth_b, ADDR_B)] {
            let cidr = format!("{addr}/24");
            for s in [
                vec!["-n", netns, "addr", "add", &cidr, "dev", dev],
                vec!["-n", netns, "link", "set", dev, "up"],
                vec!["-n", netns, "link", "set", "lo", "up"],
            ] {
                ip(&ns.ip, &s).unwrap_or_else(|e| panic!("{e}"));
            }
        }
        Some(ns)
    }

    /// `ip netns exec NS PROG`: iproute2 switches namespace and execs
    /// PROG, so the child's pid is PROG's.
    fn command(&self, ns: &str, prog: &Path) -> Command {
        let mut c = Command::new(&self.ip);
        c.args(["netns", "exec", ns]).arg(prog);
        c
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            if let Err(e) = ip(&self.ip, &["netns", "del", ns]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

/// Removes our namespaces left by a test process that no longer runs
/// (killed before its guard could drop).
fn remove_stale_namespaces(ip_tool: &Path) {
    let Ok(out) = Command::new(ip_tool).args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(NS_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(ip_tool, &["netns", "del", name]);
        }
    }
}

// ---------------------------------------------------------------------------
// The daemon (namespace A) and the client process (namespace B)

fn start_daemon(ns: &Namespaces, dir: &Path) -> Daemon {
    start_daemon_with(ns, dir, &[])
}

/// [`start_daemon`] with extra environment variables.
fn start_daemon_with(ns: &Namespaces, dir: &Path, env: &[(&str, &str)]) -> Daemon {
    let cfg = write_file(
        dir,
        "netns.toml",
        &format!(
            "[[listeners]]\nurl = \"{URL}\"\n\n[workers]\ncores = [0]\nidle = \"adaptive\"\n\n\
             [metrics]\naddress = \"{METRICS}\"\n\n[rpcbind]\nregister = false\n\n\
             [transport]\ncredits = 4\nmax_message = {MAX_MESSAGE}\n"
        ),
    );
    let mut cmd = ns.command(&ns.a, Path::new(BIN));
    cmd.arg("--config").arg(cfg).envs(env.iter().copied());
    let mut d = Daemon::spawn_command(cmd);
    d.wait_for_line("started");
    d
}

/// Runs this test binary's `test` in namespace B with `ROLE_ENV=role`;
/// returns its stdout once it passed.
fn run_client(ns: &Namespaces, test: &str, role: &str, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = ns.command(&ns.b, &exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run the client in namespace B");
    let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let read_all = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let (t_out, t_err) = (read_all(Box::new(out)), read_all(Box::new(err)));
    let status = wait_long(&mut child, CLIENT_PATIENCE);
    let (out, err) = (t_out.join().unwrap(), t_err.join().unwrap());
    println!("--- client (namespace B) stdout:\n{out}--- stderr:\n{err}---");
    assert!(status.success(), "client in namespace B failed: {status}");
    // An `--exact` filter that matched nothing would pass too: the role
    // prints this line only at its very end.
    assert!(
        out.contains("netns client: done"),
        "client did not run its role"
    );
    out
}

fn wait_long(child: &mut Child, patience: Duration) -> ExitStatus {
    let deadline = Instant::now() + patience;
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

// ---------------------------------------------------------------------------
// Calls (run by the client role)

fn pattern(size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i.wrapping_mul(7) ^ (i >> 8)) as u8)
        .collect()
}

fn connect() -> Client<Roce> {
    let client = Client::<Roce>::connect(URL, client_config(MAX_MESSAGE, 4)).expect("connect");
    // CONF_RDMA (RFC 5666 s6) ran at connect: the server's limits.
    let conf = client.conf_rdma_reply().expect("CONF_RDMA reply");
    assert_eq!(conf.maxcall_sendsize, 4096);
    assert!(conf.align >= 4 && conf.align.is_power_of_two(), "{conf:?}");
    client
}

/// Closes the client and waits until the daemon has seen the DREQ (its
/// open-connection gauge, read over the veth, is back to 0).
fn close_and_wait_for_daemon(client: Client<Roce>) -> String {
    client.close().expect("close");
    let metrics: SocketAddr = METRICS.parse().unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body) = http_get(metrics, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK");
        if metric(&body, "rpcrdma_listener_connections{") == 0 {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "daemon never saw the DREQ:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The client role of `bench_program_between_namespaces`.
fn full_session_client() {
    let mut client = connect();
    call_with_xid(&mut client, Args::Null, ReplyTarget::Inline);
    let sizes = [0usize, 1, 100, 4096, 4097, 64 << 10, 1 << 20];
    for &size in &sizes {
        let data = pattern(size);
        for path in [
            EchoPath::DdpBothWays,
            EchoPath::ReplyChunk,
            EchoPath::LongCall,
        ] {
            echo(&mut client, &data, path);
        }
    }
    // SOURCE into a write chunk (DDP) and inline; SINK from a read chunk.
    for n in [0u32, 100, 4095, 4097, MIB] {
        let (_, got) = call_with_xid(
            &mut client,
            Args::Source(n),
            ReplyTarget::WriteChunk { max_ddp: n.max(4) },
        );
        assert_eq!(got.len(), n as usize);
        assert_eq!(bench::pattern_mismatch(&got), None, "source {n}");
    }
    let (_, got) = call_with_xid(&mut client, Args::Source(1000), ReplyTarget::Inline);
    assert_eq!(bench::pattern_mismatch(&got), None);
    call_with_xid(
        &mut client,
        Args::Sink(&vec![5u8; MIB as usize]),
        ReplyTarget::Inline,
    );
    let body = close_and_wait_for_daemon(client);
    let rpcs = metric(&body, "rpcrdma_worker_rpcs_total");
    assert!(
        rpcs >= 1 + 3 * sizes.len() as u64 + 7,
        "rpcs {rpcs}:\n{body}"
    );
    assert_eq!(
        metric(&body, "rpcrdma_listener_connections_total"),
        1,
        "{body}"
    );
    println!("netns client: done ({rpcs} RPCs served)");
}

#[test]
fn bench_program_between_namespaces() {
    if std::env::var(ROLE_ENV).as_deref() == Ok("full") {
        return full_session_client();
    }
    let Some(ns) = Namespaces::create("session") else {
        return;
    };
    let dir = scratch_dir("netns-session");
    let mut d = start_daemon(&ns, &dir);
    run_client(&ns, "bench_program_between_namespaces", "full", &[]);
    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}

/// The same session with GSO on send across the veth too (`gso=all`,
/// docs/ROCE.md), both sides verifying every inbound ICRC: the receiving
/// stack splits each GSO send into datagrams whose IP IDs must be the ones
/// the sender sealed each segment's ICRC for.
#[test]
fn bench_program_between_namespaces_with_gso_everywhere() {
    if std::env::var(ROLE_ENV).as_deref() == Ok("full") {
        return full_session_client();
    }
    let Some(ns) = Namespaces::create("gso") else {
        return;
    };
    let env = [
        ("RPCRDMA_ROCE_GSO", "all"),
        ("RPCRDMA_ROCE_VERIFY_ICRC", "1"),
    ];
    let dir = scratch_dir("netns-gso");
    let mut d = start_daemon_with(&ns, &dir, &env);
    run_client(
        &ns,
        "bench_program_between_namespaces_with_gso_everywhere",
        "full",
        &env,
    );
    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}

// ---------------------------------------------------------------------------
// The captured session

/// The client role of the capture test: a short session whose every
/// message tshark is to decode (8 KiB is above the 4 KiB inline size, so
/// each path really uses its chunks), then the XIDs it used, printed for
/// the parent to look for in the capture.
fn capture_session_client() {
    let pcap = PathBuf::from(std::env::var_os(PCAP_ENV).expect("capture file"));
    let probe = std::net::UdpSocket::bind((ADDR_B, 0)).unwrap();
    // dumpcap says "Capturing on" before the capture is live: probe (to a
    // port left out of the checks) until the file grows past its header.
    let deadline = Instant::now() + PATIENCE;
    while std::fs::metadata(&pcap).map_or(0, |m| m.len()) <= 24 {
        assert!(Instant::now() < deadline, "capture never started");
        let _ = probe.send_to(b"probe", (ADDR_A, PROBE_PORT));
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut client = connect();
    let big = pattern(8192);
    // Calls run in this order (the vec's elements evaluate in order).
    let mut xids = vec![
        (
            "null",
            call_with_xid(&mut client, Args::Null, ReplyTarget::Inline).0,
        ),
        (
            "echo-inline",
            echo(&mut client, &big[..100], EchoPath::DdpBothWays),
        ),
        (
            "echo-read-write",
            echo(&mut client, &big, EchoPath::DdpBothWays),
        ),
        (
            "echo-read-reply",
            echo(&mut client, &big, EchoPath::ReplyChunk),
        ),
        (
            "echo-long-call",
            echo(&mut client, &big, EchoPath::LongCall),
        ),
    ];
    let (xid, got) = call_with_xid(
        &mut client,
        Args::Source(4097),
        ReplyTarget::WriteChunk { max_ddp: 4097 },
    );
    assert_eq!(bench::pattern_mismatch(&got), None);
    xids.push(("source-write", xid));
    close_and_wait_for_daemon(client);

    // Capture buffers deliver in blocks: send an end marker until it is in
    // the file; everything sent before it (the DREP included: the daemon
    // answered the DREQ before its gauge fell) is then in the file too.
    let marker = b"rpcrdma-capture-end-marker";
    let deadline = Instant::now() + PATIENCE;
    loop {
        let _ = probe.send_to(marker, (ADDR_A, PROBE_PORT));
        let now = std::fs::read(&pcap).unwrap_or_default();
        if now.windows(marker.len()).any(|w| w == marker) {
            break;
        }
        assert!(Instant::now() < deadline, "end marker never captured");
        std::thread::sleep(Duration::from_millis(20));
    }
    for (label, xid) in xids {
        println!("netns client: xid {xid} {label}");
    }
    println!("netns client: done");
}

/// dumpcap, stopped cleanly by [`Capture::finish`], or killed on drop (a
/// panicking test must not leave it running in its namespace).
struct Capture(Child);

impl Capture {
    /// SIGINT: dumpcap flushes and closes the file, then exits.
    fn finish(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, Signal::SIGINT);
        let _ = wait_long(&mut self.0, PATIENCE);
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts dumpcap on A's veth end; `None` (after the real-peer rule) when
/// this host lets nobody capture.
fn start_capture(
    ns: &Namespaces,
    dumpcap: &Path,
    file: &Path,
) -> Option<(Capture, std::thread::JoinHandle<String>)> {
    use std::io::{BufRead, BufReader};
    let mut cmd = ns.command(&ns.a, dumpcap);
    let mut cap = cmd
        .args(["-i", &ns.veth_a, "-f"])
        .arg(format!("udp port 4791 or udp port {PROBE_PORT}"))
        .args(["-P", "-w"])
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dumpcap");
    let mut err = BufReader::new(cap.stderr.take().unwrap());
    let mut said = String::new();
    let mut line = String::new();
    while err.read_line(&mut line).unwrap_or(0) > 0 {
        if line.contains("Capturing on") {
            // Keep draining stderr so dumpcap never blocks on it.
            let drain = std::thread::spawn(move || {
                let mut rest = String::new();
                let _ = err.read_to_string(&mut rest);
                rest
            });
            return Some((Capture(cap), drain));
        }
        said.push_str(&line);
        line.clear();
    }
    let _ = cap.wait();
    assert!(
        said.contains("ermission") || said.contains("not permitted"),
        "capture failed: {said}"
    );
    skip(&format!("no capture rights ({})", said.trim()));
    None
}

#[test]
fn tshark_decodes_a_whole_session_between_namespaces() {
    const TEST: &str = "tshark_decodes_a_whole_session_between_namespaces";
    if std::env::var(ROLE_ENV).as_deref() == Ok("capture") {
        return capture_session_client();
    }
    let Some(tshark) = find_tool("tshark") else {
        return skip("tshark not installed");
    };
    let dumpcap = tshark.with_file_name("dumpcap");
    if !dumpcap.is_file() {
        return skip("dumpcap not installed");
    }
    let Some(ns) = Namespaces::create("capture") else {
        return;
    };
    let dir = scratch_dir("netns-capture");
    let file = dir.join("session.pcap");
    let Some((cap, drain)) = start_capture(&ns, &dumpcap, &file) else {
        return;
    };
    // GSO off on both sides: a veth passes a GSO send on unsegmented, so
    // the capture would show several RoCE packets in one frame, which
    // neither tshark nor a per-frame ICRC check reads as RoCE.
    let no_gso = (dataplane::verbs::roce::ENV_GSO, "0");
    let mut d = start_daemon_with(&ns, &dir, &[no_gso]);
    let out = run_client(
        &ns,
        TEST,
        "capture",
        &[(PCAP_ENV, file.to_str().unwrap()), no_gso],
    );
    d.stop_cleanly();
    cap.finish();
    println!("dumpcap: {}", drain.join().unwrap_or_default().trim());
    let xids: Vec<(u32, String)> = out
        .lines()
        .filter_map(|l| {
            let at = l.find("netns client: xid ")?;
            let mut w = l[at + "netns client: xid ".len()..].split(' ');
            Some((w.next()?.parse().ok()?, w.next()?.to_owned()))
        })
        .collect();
    check_capture(&tshark, &file, &xids);
    if std::env::var_os("KEEP_PCAP").is_some() {
        println!("capture kept: {}", file.display());
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// One RoCE frame as tshark decodes it (`-T fields`, lists comma-separated).
#[derive(Debug)]
struct Decoded {
    frame: u32,
    from_client: bool,
    opcode: Option<u32>,
    cm_attribute: Option<u32>,
    rpcordma_xid: Option<u32>,
    msg_type: Option<u32>,
    reads: Option<u32>,
    writes: Option<u32>,
    replies: Option<u32>,
    positions: Vec<u32>,
    rpc_xids: Vec<u32>,
    rpc_msg_types: Vec<u32>,
    has_icrc: bool,
}

const FIELDS: [&str; 13] = [
    "frame.number",
    "ip.src",
    "infiniband.bth.opcode",
    "infiniband.mad.attributeid",
    "rpcordma.xid",
    "rpcordma.msg_type",
    "rpcordma.reads_count",
    "rpcordma.writes_count",
    "rpcordma.reply_count",
    "rpcordma.position",
    "rpc.xid",
    "rpc.msgtyp",
    "infiniband.invariant.crc",
];

fn numbers(field: &str) -> Vec<u32> {
    field
        .split(',')
        .filter(|v| !v.is_empty())
        .map(|v| match v.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => v.parse(),
        })
        .map(|r| r.unwrap_or_else(|e| panic!("tshark field value {v:?}: {e}", v = field)))
        .collect()
}

/// tshark options every read uses: RPC calls of a program Wireshark does
/// not know (the bench program) are decoded instead of being shown as
/// "Continuation data".
const TSHARK_OPTS: [&str; 2] = ["-o", "rpc.dissect_unknown_programs:TRUE"];

fn tshark(tshark: &Path, file: &Path, args: &[&str]) -> String {
    let all: Vec<&str> = TSHARK_OPTS.iter().chain(args).copied().collect();
    tshark_out(tshark, file, &all)
}

fn decode(tshark_bin: &Path, file: &Path) -> Vec<Decoded> {
    let mut args = vec![
        "-Y",
        "udp.port == 4791",
        "-T",
        "fields",
        "-E",
        "separator=/t",
    ];
    for f in FIELDS {
        args.extend(["-e", f]);
    }
    let text = tshark(tshark_bin, file, &args);
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), FIELDS.len(), "tshark line {l:?}");
            let one = |i: usize| numbers(f[i]).first().copied();
            Decoded {
                frame: one(0).expect("frame number"),
                from_client: f[1] == ADDR_B,
                opcode: one(2),
                cm_attribute: one(3),
                rpcordma_xid: one(4),
                msg_type: one(5),
                reads: one(6),
                writes: one(7),
                replies: one(8),
                positions: numbers(f[9]),
                rpc_xids: numbers(f[10]),
                rpc_msg_types: numbers(f[11]),
                has_icrc: !f[12].is_empty(),
            }
        })
        .collect()
}

/// CM attribute IDs (IBTA Vol. 1 ch. 12, as Wireshark shows them).
const CM_REQ: u32 = 0x10;
const CM_REP: u32 = 0x13;
const CM_RTU: u32 = 0x14;
const CM_DREQ: u32 = 0x15;
const CM_DREP: u32 = 0x16;
/// RPC-over-RDMA message types (RFC 5666 s4.3).
const RDMA_MSG: u32 = 0;
const RDMA_NOMSG: u32 = 1;

fn check_capture(tshark_bin: &Path, file: &Path, xids: &[(u32, String)]) {
    assert_eq!(xids.len(), 6, "the client reported its calls: {xids:?}");

    // Our own check first: every RoCE packet's ICRC, recomputed over the
    // IP header Linux really sent.
    let packets = ip_packets(&std::fs::read(file).expect("capture file"), PROBE_PORT);
    for (i, p) in packets.iter().enumerate() {
        assert_eq!(icrc::verify_frame(p), Ok(true), "ICRC of RoCE packet {i}");
    }

    // Nothing malformed, no expert error (the filter must parse: tshark
    // fails on a bad one).
    let bad = tshark(
        tshark_bin,
        file,
        &["-Y", "_ws.malformed || _ws.expert.severity == error"],
    );
    assert!(bad.trim().is_empty(), "malformed or expert errors:\n{bad}");
    let verbose = tshark(tshark_bin, file, &["-V"]);
    for bad in ["Malformed", "[Expert Info (Error"] {
        assert!(!verbose.contains(bad), "{bad} in tshark -V output");
    }

    let frames = decode(tshark_bin, file);
    assert_eq!(frames.len(), packets.len(), "tshark saw every RoCE packet");
    assert!(
        frames.iter().all(|f| f.has_icrc),
        "every frame shows an ICRC"
    );

    // The CM exchange, in order: REQ from the client, REP, RTU; at close
    // DREQ from the client and the daemon's DREP.
    let cm: Vec<(u32, bool)> = frames
        .iter()
        .filter_map(|f| Some((f.cm_attribute?, f.from_client)))
        .collect();
    assert_eq!(
        cm,
        [
            (CM_REQ, true),
            (CM_REP, false),
            (CM_RTU, true),
            (CM_DREQ, true),
            (CM_DREP, false)
        ],
        "CM messages"
    );
    let first_data = frames.iter().position(|f| f.rpcordma_xid.is_some());
    let rtu = frames.iter().position(|f| f.cm_attribute == Some(CM_RTU));
    let last_data = frames.iter().rposition(|f| f.rpcordma_xid.is_some());
    let dreq = frames.iter().position(|f| f.cm_attribute == Some(CM_DREQ));
    assert!(
        last_data < dreq,
        "DREQ after the last RPC-over-RDMA message"
    );
    assert!(
        rtu < first_data,
        "RTU before the first RPC-over-RDMA message"
    );

    // RPC-over-RDMA: wherever tshark also decoded the RPC message, its XID
    // is the header's (RFC 5666 s4.1: the header XID repeats the RPC XID).
    for f in &frames {
        if let Some(x) = f.rpcordma_xid {
            assert!(
                f.rpc_xids.iter().all(|&r| r == x),
                "frame {}: rpc.xid {:?} vs rpcordma.xid {x:#x}",
                f.frame,
                f.rpc_xids
            );
        }
    }
    // Every call the client made: one call message from the client, one
    // reply from the daemon, both carrying its XID, with the chunk lists
    // its path needs. (CONF_RDMA, before them, is checked likewise only
    // for XID agreement above.)
    for (xid, label) in xids {
        let find = |from_client: bool| {
            let v: Vec<&Decoded> = frames
                .iter()
                .filter(|f| f.rpcordma_xid == Some(*xid) && f.from_client == from_client)
                .collect();
            assert_eq!(v.len(), 1, "{label} (xid {xid:#x}): {v:?}");
            v[0]
        };
        let (call, reply) = (find(true), find(false));
        // The reply's RPC message: in the Send itself, or reassembled
        // from the reply chunk's RDMA Writes; a reply, with our XID.
        assert_eq!(reply.rpc_xids.first(), Some(xid), "{label}: {reply:?}");
        assert_eq!(reply.rpc_msg_types.first(), Some(&1), "{label}: {reply:?}");
        // Where tshark shows the RPC call: in the call's Send, or (a call
        // with a read chunk) in the last RDMA Read Response that carried
        // the chunk to the daemon, once it reassembled the call there.
        // It reassembles only when each read chunk has a handle of its
        // own, as per-exchange keys give (RDMA Read Response Last or
        // Only, BTH opcodes 15 and 16).
        let rpc_call_decoded = call.rpc_xids.first() == Some(xid)
            || frames.iter().any(|f| {
                f.from_client
                    && matches!(f.opcode, Some(15 | 16))
                    && f.rpc_xids.first() == Some(xid)
                    && f.rpc_msg_types.first() == Some(&0)
            });
        match label.as_str() {
            "null" | "echo-inline" => {
                assert_eq!(
                    (call.msg_type, call.reads),
                    (Some(RDMA_MSG), Some(0)),
                    "{label}: {call:?}"
                );
                assert!(rpc_call_decoded, "{label}: {call:?}");
                assert_eq!(call.rpc_msg_types.first(), Some(&0), "{label}: {call:?}");
            }
            "echo-read-write" => {
                assert_eq!(
                    (call.msg_type, call.reads, call.writes),
                    (Some(RDMA_MSG), Some(1), Some(1)),
                    "{label}: {call:?}"
                );
                assert!(call.positions.iter().all(|&p| p > 0), "{label}: {call:?}");
                assert!(rpc_call_decoded, "{label}: {call:?}");
                assert_eq!(
                    (reply.msg_type, reply.writes),
                    (Some(RDMA_MSG), Some(1)),
                    "{label}: {reply:?}"
                );
            }
            "echo-read-reply" => {
                assert_eq!(
                    (call.msg_type, call.reads, call.writes, call.replies),
                    (Some(RDMA_MSG), Some(1), Some(0), Some(1)),
                    "{label}: {call:?}"
                );
                assert!(call.positions.iter().all(|&p| p > 0), "{label}: {call:?}");
                assert_eq!(
                    (reply.msg_type, reply.replies),
                    (Some(RDMA_NOMSG), Some(1)),
                    "{label}: {reply:?}"
                );
            }
            "echo-long-call" => {
                assert_eq!(
                    (call.msg_type, call.reads, call.replies),
                    (Some(RDMA_NOMSG), Some(1), Some(1)),
                    "{label}: {call:?}"
                );
                assert_eq!(call.positions, [0], "{label}: position-zero read chunk");
                assert_eq!(
                    (reply.msg_type, reply.replies),
                    (Some(RDMA_NOMSG), Some(1)),
                    "{label}: {reply:?}"
                );
            }
            "source-write" => {
                assert_eq!(
                    (call.msg_type, call.writes),
                    (Some(RDMA_MSG), Some(1)),
                    "{label}: {call:?}"
                );
                assert!(rpc_call_decoded, "{label}: {call:?}");
                assert_eq!(
                    (reply.msg_type, reply.writes),
                    (Some(RDMA_MSG), Some(1)),
                    "{label}: {reply:?}"
                );
            }
            other => panic!("unknown call {other}"),
        }
    }
    // No RDMA_DONE (nor RDMA_MSGP or RDMA_ERROR): RDMA_DONE exists only
    // with responder-provided read chunks (docs/ENGINE.md), which neither
    // this client nor the daemon's default configuration negotiates;
    // every reply went inline, into a write chunk or into a reply chunk.
    for f in &frames {
        assert!(
            matches!(f.msg_type, None | Some(RDMA_MSG) | Some(RDMA_NOMSG)),
            "frame {}: message type {:?}",
            f.frame,
            f.msg_type
        );
    }
    // The data the chunks named moved as RDMA Reads (read chunks) and
    // RDMA Writes (write and reply chunks).
    let has = |lo: u32, hi: u32| {
        frames
            .iter()
            .any(|f| f.opcode.is_some_and(|o| (lo..=hi).contains(&o)))
    };
    assert!(has(12, 12), "an RDMA Read Request");
    assert!(has(13, 16), "RDMA Read Responses");
    assert!(has(6, 11), "RDMA Writes");
}
