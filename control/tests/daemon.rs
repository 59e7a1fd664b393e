//! The real `rpcrdmad` binary against real peers: Debian's rpcbind and
//! rpcinfo, Prometheus' promtool, and ports or sockets already in use.
//! Every test uses its own ports and paths.

mod support;

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use control::programs::{BENCH_PROG, BENCH_VERS};
use control::rpcbind::universal_address;
use dataplane::wire::conf::{CONFIG_RDMA_PROG, CONFIG_RDMA_VERS};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::Signal;
use support::{
    http_get, promtool_accepts, require_peer, run, scratch_dir, write_file, Daemon, PATIENCE,
};

/// `rpcinfo`'s full listing as (program, version, netid, address) rows.
fn rpcinfo_rows(rpcinfo: &std::path::Path) -> Vec<(u32, u32, String, String)> {
    let out = Command::new(rpcinfo).output().expect("run rpcinfo");
    assert!(out.status.success(), "rpcinfo failed: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.parse().ok()?,
                f.get(1)?.parse().ok()?,
                f.get(2)?.to_string(),
                f.get(3)?.to_string(),
            ))
        })
        .collect()
}

/// An rpcbind this test started, stopped on drop.
struct OwnRpcbind(Child);

impl Drop for OwnRpcbind {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
        support::wait_child(&mut self.0);
    }
}

/// The host's rpcbind for one test: the one already running, or one this
/// test started. Fields drop in order, so an rpcbind we started stops
/// before the next test may take its turn.
struct HostRpcbind {
    _own: Option<OwnRpcbind>,
    _turn: Flock<File>,
}

/// Waits for this test's turn at the host's rpcbind, then uses the running
/// one or starts `rpcbind -f -w`.
///
/// Tests take turns through a lock file, whether they run as threads of one
/// process (`cargo test`) or as processes (`cargo nextest`): rpcbind's own
/// lock file lets only one run per host, so two tests starting one at once
/// lose one of them, and the first to finish stopped the rpcbind the other
/// was still asking.
fn ensure_rpcbind(rpcbind: &std::path::Path) -> HostRpcbind {
    let path = std::env::temp_dir().join("rpcrdma-tests-host-rpcbind.lock");
    let file = File::create(&path).expect("create the rpcbind turn lock file");
    let turn = Flock::lock(file, FlockArg::LockExclusive).expect("lock the rpcbind turn file");
    HostRpcbind {
        _own: start_rpcbind_unless_running(rpcbind),
        _turn: turn,
    }
}

fn start_rpcbind_unless_running(rpcbind: &std::path::Path) -> Option<OwnRpcbind> {
    let addr: SocketAddr = "127.0.0.1:111".parse().unwrap();
    if TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok() {
        return None;
    }
    let child = Command::new(rpcbind)
        .args(["-f", "-w"])
        .stdin(Stdio::null())
        .spawn()
        .expect("start rpcbind -f -w");
    let guard = OwnRpcbind(child);
    let deadline = Instant::now() + PATIENCE;
    while TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
        assert!(Instant::now() < deadline, "rpcbind did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(guard)
}

#[test]
fn registers_with_real_rpcbind_and_unregisters_on_sigterm() {
    let (Some(rpcbind), Some(rpcinfo)) = (require_peer("rpcbind"), require_peer("rpcinfo")) else {
        return;
    };
    let _own = ensure_rpcbind(&rpcbind);

    // Each test's RoCE listener binds UDP 4791 on its own loopback address
    // (tests run in parallel).
    let v4: SocketAddr = "127.0.0.21:20149".parse().unwrap();
    let dir = scratch_dir("rpcbind");
    // rdma6 (IPv6 listeners) is covered by the planned_mappings unit test:
    // the served RDMA providers here (shm, roce) are IPv4 or pathnames.
    let text = format!(
        "[[listeners]]\nurl = \"roce://{v4}\"\n\n[[listeners]]\nurl = \"shm://{}/d.sock\"\n\n\
         [metrics]\nenabled = false\n",
        dir.display()
    );
    let cfg = write_file(&dir, "rpcbind.toml", &text);

    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    let started = d.wait_for_line("started");
    assert!(
        started.contains(&format!("serving roce://{v4}")),
        "{started}"
    );

    let expect = vec![
        (
            CONFIG_RDMA_PROG,
            CONFIG_RDMA_VERS,
            "rdma",
            universal_address(v4),
        ),
        (
            CONFIG_RDMA_PROG,
            dataplane::wire::conf2::CONFIG_RDMA_VERS2,
            "rdma",
            universal_address(v4),
        ),
        (BENCH_PROG, BENCH_VERS, "rdma", universal_address(v4)),
    ];
    assert_eq!(expect[0].3, "127.0.0.21.78.181");
    let rows = rpcinfo_rows(&rpcinfo);
    for (prog, vers, netid, addr) in &expect {
        assert!(
            rows.iter()
                .any(|r| r.0 == *prog && r.1 == *vers && r.2 == *netid && r.3 == *addr),
            "rpcinfo lacks {prog} {vers} {netid} {addr}: {rows:?}"
        );
    }
    // rpcbind's local socket tells the same (our client's DUMP over AF_LOCAL).
    let local = control::rpcbind::RpcbindAddress::Local("/run/rpcbind.sock".into());
    if let Ok(mut c) = control::rpcbind::RpcbindClient::connect(&local, PATIENCE) {
        let dump = c.dump().expect("DUMP over the local socket");
        for (prog, vers, netid, addr) in &expect {
            assert!(
                dump.iter().any(|m| m.program == *prog
                    && m.version == *vers
                    && m.netid == *netid
                    && m.addr == *addr),
                "DUMP lacks {prog} {vers} {netid} {addr}"
            );
        }
    }
    // shm is not registered (documented decision), and said so.
    assert!(d
        .stderr()
        .contains("not registered with rpcbind (shm is same-host"));

    d.signal(Signal::SIGTERM);
    let status = d.wait();
    assert_eq!(status.code(), Some(0), "stderr:\n{}", d.stderr());
    assert!(
        d.stderr().contains("rpcbind: unregistered"),
        "{}",
        d.stderr()
    );

    let rows = rpcinfo_rows(&rpcinfo);
    for (prog, vers, netid, _) in &expect {
        assert!(
            !rows
                .iter()
                .any(|r| r.0 == *prog && r.1 == *vers && r.2 == *netid),
            "rpcinfo still lists {prog} {vers} {netid}: {rows:?}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn rpcbind_unreachable_is_one_warning_and_the_daemon_keeps_running() {
    // A port nobody listens on: bound, then released.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dir = scratch_dir("unreachable");
    let cfg = write_file(
        &dir,
        "unreachable.toml",
        &format!(
            "[[listeners]]\nurl = \"roce://127.0.0.22:20150\"\n\n[metrics]\nenabled = false\n\n\
             [rpcbind]\naddress = \"{closed}\"\ntimeout_ms = 2000\n"
        ),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");
    let warnings: Vec<String> = d
        .stderr()
        .lines()
        .filter(|l| l.contains("WARN"))
        .map(String::from)
        .collect();
    let rpcbind_warnings: Vec<&String> =
        warnings.iter().filter(|l| l.contains("rpcbind")).collect();
    assert_eq!(rpcbind_warnings.len(), 1, "{warnings:?}");
    assert!(
        rpcbind_warnings[0].contains(&format!("rpcbind at {closed} unreachable"))
            && rpcbind_warnings[0].contains("serving without rpcbind registration"),
        "{}",
        rpcbind_warnings[0]
    );
    d.signal(Signal::SIGINT);
    assert_eq!(d.wait().code(), Some(0), "{}", d.stderr());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn metrics_pass_promtool_check_metrics() {
    let addr: SocketAddr = "127.0.0.1:19471".parse().unwrap();
    let dir = scratch_dir("promtool");
    let cfg = write_file(
        &dir,
        "metrics.toml",
        &format!(
            "[[listeners]]\nurl = \"roce://127.0.0.23:20151\"\n[[listeners]]\nurl = \"shm://{}/m.sock\"\n\n\
             [metrics]\naddress = \"{addr}\"\n\n[rpcbind]\nregister = false\n",
            dir.display()
        ),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");

    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    for name in [
        "rpcrdma_worker_polls_total{worker=\"0\",core=\"0\"}",
        "rpcrdma_worker_idle_polls_total",
        "rpcrdma_worker_sleeps_total",
        "rpcrdma_worker_doorbell_wakeups_total",
        "rpcrdma_worker_completions_total",
        "rpcrdma_worker_rpcs_total",
        "rpcrdma_worker_bytes_total",
        "rpcrdma_worker_errors_total",
        "rpcrdma_worker_credits_in_use",
        "rpcrdma_pool_buffers_in_use",
        // Two RDMA providers, a shared receive queue of 4096 each.
        "rpcrdma_pool_buffers{worker=\"0\",core=\"0\",pool=\"shared_receives\"} 8192",
        "rpcrdma_listener_connections{listener=\"roce://127.0.0.23:20151\"} 0",
        "rpcrdma_listener_serving",
    ] {
        assert!(body.contains(name), "no {name} in:\n{body}");
    }
    let (status, _) = http_get(addr, "/other");
    assert_eq!(status, "HTTP/1.1 404 Not Found");

    promtool_accepts(&body);

    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait().code(), Some(0), "{}", d.stderr());
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs the daemon on `text` and expects exit 1 with one stderr line that
/// contains every `needle`. Warnings about the host (no hugepages reserved,
/// say) may come before it: they depend on the machine, not the config.
fn expect_startup_failure(test: &str, text: &str, needles: &[&str]) {
    let dir = scratch_dir(test);
    let cfg = write_file(&dir, "c.toml", text);
    let (code, _, err) = run(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    let refusals: Vec<&str> = err.lines().filter(|l| !l.contains(" WARN ")).collect();
    assert_eq!(refusals.len(), 1, "{err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} not in {err}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn metrics_port_in_use_is_one_clear_line() {
    let busy = TcpListener::bind("127.0.0.1:19472").unwrap();
    expect_startup_failure(
        "metrics-in-use",
        "[[listeners]]\nurl = \"roce://127.0.0.24:20152\"\n\n[metrics]\naddress = \"127.0.0.1:19472\"\n\n\
         [rpcbind]\nregister = false\n",
        &[
            "rpcrdmad: cannot serve metrics on 127.0.0.1:19472 (metrics.address): ",
            "Address already in use",
        ],
    );
    drop(busy);
}

#[test]
fn tcp_listener_port_in_use_is_one_clear_line() {
    let busy = TcpListener::bind("127.0.0.1:19473").unwrap();
    expect_startup_failure(
        "tcp-in-use",
        "[[listeners]]\nurl = \"tcp://127.0.0.1:19473\"\n\n[metrics]\nenabled = false\n\n\
         [rpcbind]\nregister = false\n",
        &[
            "rpcrdmad: cannot listen on tcp://127.0.0.1:19473 (listeners[0].url): ",
            "Address already in use",
        ],
    );
    drop(busy);
}

#[test]
fn shm_socket_in_use_is_one_clear_line() {
    let dir = scratch_dir("shm-in-use-sock");
    let path = dir.join("busy.sock");
    let busy = UnixListener::bind(&path).unwrap();
    expect_startup_failure(
        "shm-in-use",
        &format!(
            "[[listeners]]\nurl = \"shm://{}\"\n\n[metrics]\nenabled = false\n\n\
             [rpcbind]\nregister = false\n",
            path.display()
        ),
        &[
            &format!(
                "rpcrdmad: cannot listen on shm://{} (listeners[0].url): socket {} is in use",
                path.display(),
                path.display()
            ),
            "change the url",
        ],
    );
    drop(busy);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn rdma_listener_on_a_foreign_address_is_one_clear_line() {
    // 192.0.2.0/24 is TEST-NET-1: never configured here. Nothing is sent.
    expect_startup_failure(
        "foreign-addr",
        "[[listeners]]\nurl = \"roce://192.0.2.10:20049\"\n\n[metrics]\nenabled = false\n\n\
         [rpcbind]\nregister = false\n",
        &["cannot listen on roce://192.0.2.10:20049 (listeners[0].url): address 192.0.2.10 is not usable on this host"],
    );
}

#[test]
fn ibverbs_listener_without_a_device_is_one_clear_line() {
    let text =
        "[[listeners]]\nurl = \"ibverbs://127.0.0.1:20253\"\n\n[metrics]\nenabled = false\n\n\
                [rpcbind]\nregister = false\n";
    let head = "rpcrdmad: cannot listen on ibverbs://127.0.0.1:20253 (listeners[0].url): ";
    #[cfg(feature = "ibverbs")]
    {
        if dataplane::verbs::ibverbs::probe("ibverbs://127.0.0.1:20253").is_ok() {
            println!("skipped: this host has an RDMA device");
            return;
        }
        expect_startup_failure(
            "ibverbs-no-device",
            text,
            &[head, "no RDMA device found", "shm://", "docs/VERBS.md"],
        );
    }
    #[cfg(not(feature = "ibverbs"))]
    expect_startup_failure(
        "ibverbs-no-feature",
        text,
        &[head, "built without the `ibverbs` feature"],
    );
}

/// `--log-format json`: every line the daemon logs, from start to a clean
/// stop, is one JSON object with a level and a message.
#[test]
fn json_logs_are_one_object_per_line() {
    let dir = scratch_dir("json-logs");
    let cfg = write_file(
        &dir,
        "json.toml",
        &format!(
            "[[listeners]]\nurl = \"shm://{}/d.sock\"\n\n[metrics]\naddress = \"127.0.0.1:19493\"\n\n\
             [rpcbind]\nregister = false\n",
            dir.display()
        ),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap(), "--log-format", "json"]);
    d.wait_for_line("started");
    d.stop_cleanly();
    let log = d.stderr();
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.len() >= 3, "{log}");
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["level"].is_string(), "{line}");
        assert!(v["timestamp"].is_string(), "{line}");
        assert!(v["fields"]["message"].is_string(), "{line}");
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\"level\":\"INFO\"") && l.contains("rpcrdmad stopped")),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A reload that moves the TCP listener moves its rpcbind mappings: the
/// new address is registered, the old one is gone.
#[test]
fn rpcbind_registrations_follow_the_listeners_on_sighup() {
    let (Some(rpcbind), Some(rpcinfo)) = (require_peer("rpcbind"), require_peer("rpcinfo")) else {
        return;
    };
    let _own = ensure_rpcbind(&rpcbind);
    let dir = scratch_dir("rpcbind-reload");
    let (old, new): (SocketAddr, SocketAddr) = (
        "127.0.0.62:20621".parse().unwrap(),
        "127.0.0.62:20622".parse().unwrap(),
    );
    let text = |a: SocketAddr| {
        format!(
            "[[listeners]]\nurl = \"tcp://{a}\"\n\n[metrics]\nenabled = false\n\n\
             [control]\nsocket = \"{}/ctl.sock\"\n",
            dir.display()
        )
    };
    let cfg = write_file(&dir, "rpcbind.toml", &text(old));
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");
    let listed = |a: SocketAddr| {
        rpcinfo_rows(&rpcinfo)
            .iter()
            .any(|r| r.0 == BENCH_PROG && r.2 == "tcp" && r.3 == universal_address(a))
    };
    assert!(listed(old), "{:?}", rpcinfo_rows(&rpcinfo));

    std::fs::write(&cfg, text(new)).unwrap();
    d.signal(Signal::SIGHUP);
    let line = d.wait_for_line("reload: ");
    assert!(line.contains("rpcbind: "), "{line}");
    assert!(listed(new), "{:?}", rpcinfo_rows(&rpcinfo));
    assert!(!listed(old), "{:?}", rpcinfo_rows(&rpcinfo));

    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait().code(), Some(0), "{}", d.stderr());
    assert!(!listed(new), "{:?}", rpcinfo_rows(&rpcinfo));
    let _ = std::fs::remove_dir_all(dir);
}
