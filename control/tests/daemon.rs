//! The real `rpcrdmad` binary against real peers: Debian's rpcbind and
//! rpcinfo, Prometheus' promtool, and ports or sockets already in use.
//! Every test uses its own ports and paths.

mod support;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use control::programs::{BENCH_PROG, BENCH_VERS};
use control::rpcbind::universal_address;
use dataplane::wire::conf::{CONFIG_RDMA_PROG, CONFIG_RDMA_VERS};
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

/// Uses the running rpcbind, or starts `rpcbind -f -w` and returns its
/// guard.
fn ensure_rpcbind(rpcbind: &std::path::Path) -> Option<OwnRpcbind> {
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
        "rpcrdma_worker_completions_total",
        "rpcrdma_worker_rpcs_total",
        "rpcrdma_worker_bytes_total",
        "rpcrdma_worker_errors_total",
        "rpcrdma_worker_credits_in_use",
        "rpcrdma_pool_buffers_in_use",
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
/// contains every `needle`.
fn expect_startup_failure(test: &str, text: &str, needles: &[&str]) {
    let dir = scratch_dir(test);
    let cfg = write_file(&dir, "c.toml", text);
    let (code, _, err) = run(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
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
    // Not even a SEQPACKET socket: a stream listener is live all the same.
    let busy = UnixListener::bind(&path).unwrap();
    expect_startup_failure(
        "shm-in-use",
        &format!(
            "[[listeners]]\nurl = \"shm://{}\"\n\n[metrics]\nenabled = false\n\n\
             [rpcbind]\nregister = false\n",
            path.display()
        ),
        &[&format!(
            "rpcrdmad: cannot listen on shm://{} (listeners[0].url): socket is in use by \
             process {} (another rpcrdmad?); stop it or choose another path",
            path.display(),
            std::process::id()
        )],
    );
    assert!(path.exists());
    drop(busy);
    let _ = std::fs::remove_dir_all(dir);
}

/// A NULL call to the bench program over shm at `url`.
fn null_call_over_shm(url: &str) {
    null_call::<dataplane::verbs::shm::Shm>(url);
}

/// A NULL call to the bench program over provider `P` at `url`.
fn null_call<P: dataplane::verbs::Provider>(url: &str) {
    use dataplane::client::{CallOutcome, Client, ClientConfig, ReplyTarget};
    use dataplane::service::bench::{self, Args};
    let config = ClientConfig {
        wait_timeout: PATIENCE,
        ..ClientConfig::default()
    };
    let mut client =
        Client::<P>::connect(url, config).unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    let call = client
        .call(ReplyTarget::Inline, |xid, buf| {
            bench::encode_call(buf, xid, Args::Null)
                .ok()
                .map(|e| (e.len, e.ddp))
        })
        .expect("NULL call");
    let CallOutcome::Reply { .. } = client.wait(call).expect("NULL reply") else {
        panic!("NULL failed");
    };
    bench::decode_void_reply(client.reply(call).unwrap()).expect("void reply");
    assert!(client.release(call));
}

#[test]
fn a_second_daemon_on_the_same_shm_path_refuses_and_the_first_keeps_serving() {
    let dir = scratch_dir("two-daemons");
    let sock = dir.join("d.sock");
    let url = format!("shm://{}", sock.display());
    let cfg = write_file(
        &dir,
        "d.toml",
        &format!(
            "[[listeners]]\nurl = \"{url}\"\n\n[metrics]\nenabled = false\n\n\
             [rpcbind]\nregister = false\n"
        ),
    );
    let mut first = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    first.wait_for_line("started");
    null_call_over_shm(&url);

    let (code, _, err) = run(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(
        err.trim_end(),
        format!(
            "rpcrdmad: cannot listen on {url} (listeners[0].url): socket is in use by process \
             {} (another rpcrdmad?); stop it or choose another path",
            first.child.id()
        )
    );
    // `--check-config` says the same, naming the file and the url's line
    // (exit 1: the file is fine, the host cannot serve it now).
    let (code, out, err) = run(&["--check-config", cfg.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert_eq!(
        err.trim_end(),
        format!(
            "{}:2: cannot listen on {url} (listeners[0].url): socket is in use by process {} \
             (another rpcrdmad?); stop it or choose another path",
            cfg.display(),
            first.child.id()
        )
    );

    // The first daemon still owns its socket and serves.
    assert!(sock.exists());
    null_call_over_shm(&url);
    // The probes were peers that left, not refused connections.
    assert!(
        !first.stderr().contains("connection refused"),
        "{}",
        first.stderr()
    );

    first.signal(Signal::SIGTERM);
    assert_eq!(first.wait().code(), Some(0), "{}", first.stderr());
    assert!(!sock.exists());
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

/// A network namespace of this test's own (only `lo`, up), deleted on drop.
struct OwnNetns {
    ip: std::path::PathBuf,
    name: String,
}

impl OwnNetns {
    /// `None` after the real-peer rule said "skipped" (no `ip`, or no right
    /// to create namespaces).
    fn create(tag: &str) -> Option<OwnNetns> {
        let ip = require_peer("ip")?;
        let name = format!("rpcrdma-test-{}-{tag}", std::process::id());
        let run_ip = |args: &[&str]| {
            Command::new(&ip)
                .args(args)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| e.to_string())
                .and_then(|o| {
                    if o.status.success() {
                        Ok(())
                    } else {
                        Err(String::from_utf8_lossy(&o.stderr).trim().to_owned())
                    }
                })
        };
        if let Err(e) = run_ip(&["netns", "add", &name]) {
            let why = format!("cannot create a network namespace ({e})");
            if std::env::var("RPCRDMA_REQUIRE_PEERS").as_deref() == Ok("1") {
                panic!("{why} and RPCRDMA_REQUIRE_PEERS=1");
            }
            println!("skipped: {why}");
            return None;
        }
        let lo_up = run_ip(&["-n", &name, "link", "set", "lo", "up"]);
        let ns = OwnNetns { ip, name };
        lo_up.expect("lo up");
        Some(ns)
    }

    /// `ip netns exec NAME prog`: execs `prog` in the namespace (same pid).
    fn command(&self, prog: &std::path::Path) -> Command {
        let mut c = Command::new(&self.ip);
        c.args(["netns", "exec", &self.name]).arg(prog);
        c
    }

    /// Runs `f` on a thread that joined the namespace (a network namespace
    /// is per thread: the rest of this process stays where it is).
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let fd = std::fs::File::open(&path).expect("open the namespace");
            nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("thread in the namespace")
    }
}

impl Drop for OwnNetns {
    fn drop(&mut self) {
        let _ = Command::new(&self.ip)
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// configs/loopback.toml as shipped (only the shm socket moved to a
/// scratch directory: the file system is not per namespace) starts in a
/// namespace of its own, where its fixed ports are free, and serves NULL
/// over all three transports and metrics on its address.
#[test]
fn loopback_toml_starts_and_serves_every_listener() {
    use dataplane::service::bench::Args;
    use dataplane::tcp::{TcpClient, TcpClientConfig};
    const SHIPPED: &str = include_str!("../../configs/loopback.toml");
    const SHM: &str = "shm:///run/rpcrdma/rpcrdmad.sock";
    assert!(
        SHIPPED.contains(SHM),
        "configs/loopback.toml moved its shm socket"
    );
    let Some(ns) = OwnNetns::create("loopback") else {
        return;
    };
    let dir = scratch_dir("loopback-toml");
    let shm = format!("shm://{}/d.sock", dir.display());
    let cfg = write_file(&dir, "loopback.toml", &SHIPPED.replace(SHM, &shm));

    let mut cmd = ns.command(std::path::Path::new(support::BIN));
    cmd.arg("--config").arg(&cfg);
    let mut d = Daemon::spawn_command(cmd);
    let started = d.wait_for_line("started");
    for url in [
        shm.as_str(),
        "roce://127.0.0.1:20049",
        "tcp://127.0.0.1:20050",
    ] {
        assert!(started.contains(url), "{started}");
    }
    assert!(
        started.contains("metrics http://127.0.0.1:9464/metrics"),
        "{started}"
    );

    null_call_over_shm(&shm);
    let body = ns.run(|| {
        // RoCE: this process connects from its own loopback alias.
        null_call::<dataplane::verbs::roce::Roce>("roce://127.0.0.1:20049");
        let mut tcp =
            TcpClient::connect_url("tcp://127.0.0.1:20050", TcpClientConfig::for_data(4096, 1))
                .expect("tcp connect");
        let xid = tcp.call(Args::Null, 0).expect("tcp NULL").expect("a slot");
        let mut replied = false;
        let deadline = Instant::now() + PATIENCE;
        while !replied {
            assert!(Instant::now() < deadline, "no tcp reply");
            tcp.poll(|r| {
                assert_eq!(r.xid, xid);
                r.check_void().expect("void reply");
                replied = true;
            })
            .expect("tcp poll");
        }
        let (status, body) = http_get("127.0.0.1:9464".parse().unwrap(), "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK");
        body
    });
    for listener in [
        shm.as_str(),
        "roce://127.0.0.1:20049",
        "tcp://127.0.0.1:20050",
    ] {
        assert!(
            body.contains(&format!(
                "rpcrdma_listener_connections_total{{listener=\"{listener}\"}} 1"
            )),
            "{listener} in:\n{body}"
        );
    }

    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait().code(), Some(0), "{}", d.stderr());
    drop(ns);
    let _ = std::fs::remove_dir_all(dir);
}
