//! The real `rpcrdmad` binary, started as a separate process, serving the
//! bench program over `shm` and `roce` to `dataplane::client` and over ONC RPC/TCP to `dataplane::tcp::TcpClient`,
//! all from the same workers.
//!
//! Sizes 0 B .. 16 MiB, each through the paths a requester can choose
//! (RFC 5666 s3.4, s5): inline, a DDP-eligible argument moved by a read
//! chunk, a DDP-eligible result placed in a write chunk, a reply chunk,
//! and a long call (RDMA_NOMSG with a position-zero read chunk); over TCP
//! the same calls as record-marked messages. Every byte is checked. No
//! timing assertion anywhere.
mod support;

use std::net::SocketAddr;

use dataplane::client::{Client, ReplyTarget};
use dataplane::service::bench::{self, Args};
use dataplane::tcp::{TcpClient, TcpClientConfig};
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;
use dataplane::verbs::Provider;
use support::bench_calls::*;
use support::*;

fn daemon_config(
    dir: &std::path::Path,
    url: &str,
    metrics: SocketAddr,
    extra: &str,
) -> std::path::PathBuf {
    write_file(
        dir,
        "serve.toml",
        &format!(
            "[[listeners]]\nurl = \"{url}\"\n\n[workers]\ncores = [0]\nidle = \"adaptive\"\n\n\
             [metrics]\naddress = \"{metrics}\"\n\n[rpcbind]\nregister = false\n\n{extra}"
        ),
    )
}

#[test]
fn bench_program_over_shm_every_size_and_path() {
    let dir = scratch_dir("serve-sizes");
    let url = format!("shm://{}/d.sock", dir.display());
    every_size_and_path::<Shm>(&dir, &url, "127.0.0.1:19481".parse().unwrap());
    assert!(!std::path::Path::new(&format!("{}/d.sock", dir.display())).exists());
    let _ = std::fs::remove_dir_all(dir);
}

/// The same over RoCEv2 on loopback: the daemon's listener binds UDP
/// 127.0.0.25:4791, this test process connects from its own loopback alias
/// (docs/ROCE.md, "Addressing").
#[test]
fn bench_program_over_roce_every_size_and_path() {
    let dir = scratch_dir("serve-roce");
    every_size_and_path::<Roce>(
        &dir,
        "roce://127.0.0.25:20251",
        "127.0.0.1:19483".parse().unwrap(),
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Sizes of the echo test.
const SIZES: [usize; 7] = [0, 1, 1024, 4096, 64 << 10, 1 << 20, 16 << 20];

fn every_size_and_path<P: Provider>(dir: &std::path::Path, url: &str, metrics: SocketAddr) {
    let max_message = 16 * MIB + 4096;
    let cfg = daemon_config(
        dir,
        url,
        metrics,
        &format!("[transport]\ncredits = 4\nmax_message = {max_message}\n"),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");

    let (calls, client) = rdma_calls::<P>(url, max_message, &SIZES, 0);
    expect_metrics(metrics, calls, 3 * (16 << 20));
    drop(client);
    d.stop_cleanly();
}

/// The TCP counterpart of [`rdma_calls`]: NULL, ECHO of every size,
/// SOURCE, SINK, every byte checked. Returns the number of calls made and
/// the connected client.
fn tcp_calls(url: &str, sizes: &[usize], seed: usize) -> (u64, TcpClient) {
    let largest = sizes.iter().copied().max().unwrap_or(0).max(MIB as usize);
    let mut client =
        TcpClient::connect_url(url, TcpClientConfig::for_data(largest, 1)).expect("tcp connect");
    tcp_call(&mut client, Args::Null);
    let mut calls = 1;
    for &size in sizes {
        let data = test_data(size, seed);
        let got = tcp_call(&mut client, Args::Echo(&data));
        assert!(got == data, "tcp echo of {size} bytes differs");
        calls += 1;
    }
    for n in [0u32, 100, 4095, 4097, MIB] {
        let got = tcp_call(&mut client, Args::Source(n));
        assert_eq!(got.len(), n as usize);
        assert_eq!(bench::pattern_mismatch(&got), None, "tcp source {n}");
        calls += 1;
    }
    tcp_call(&mut client, Args::Sink(&vec![5u8; MIB as usize]));
    (calls + 1, client)
}

/// The counters moved as far as `calls` and `bytes` say, one connection
/// was accepted and is open (the caller keeps its client), and promtool
/// accepts the exposition.
fn expect_metrics(metrics: SocketAddr, calls: u64, bytes: u64) {
    let body = scrape_until(metrics, "rpcrdma_worker_rpcs_total", calls);
    assert!(
        metric(&body, "rpcrdma_worker_bytes_total") > bytes,
        "{body}"
    );
    assert_eq!(
        metric(&body, "rpcrdma_listener_connections_total"),
        1,
        "{body}"
    );
    assert_eq!(metric(&body, "rpcrdma_listener_connections{"), 1, "{body}");
    promtool_accepts(&body);
}

/// The same calls over ONC RPC/TCP with record marking: the
/// daemon's `tcp://` listener, served by its workers.
#[test]
fn bench_program_over_tcp_every_size() {
    let dir = scratch_dir("serve-tcp");
    let url = "tcp://127.0.0.31:20311";
    let metrics: SocketAddr = "127.0.0.1:19484".parse().unwrap();
    let max_message = 16 * MIB + 4096;
    let cfg = daemon_config(
        &dir,
        url,
        metrics,
        &format!("[transport]\nmax_message = {max_message}\n"),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");
    let (calls, client) = tcp_calls(url, &SIZES, 0);
    expect_metrics(metrics, calls, 2 * (16 << 20));
    drop(client);
    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}

/// The names of process `pid`'s threads that are rpcrdmad workers, as the
/// kernel shows them in `comm` (15 bytes at most: the names are short
/// enough that the worker index survives).
fn worker_threads(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("/proc/PID/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| c.starts_with("rpcrdma-w"))
        .collect();
    names.sort();
    names
}

/// One daemon, one worker core, three listeners (shm, roce, tcp): clients
/// of all three transports at once, served by the one worker thread.
#[test]
fn one_worker_thread_serves_shm_roce_and_tcp_at_once() {
    let dir = scratch_dir("serve-mixed");
    let shm = format!("shm://{}/d.sock", dir.display());
    let roce = "roce://127.0.0.32:20321";
    let tcp = "tcp://127.0.0.32:20322";
    let metrics: SocketAddr = "127.0.0.1:19485".parse().unwrap();
    let max_message = 4 * MIB + 4096;
    let cfg = write_file(
        &dir,
        "mixed.toml",
        &format!(
            "[[listeners]]\nurl = \"{shm}\"\n[[listeners]]\nurl = \"{roce}\"\n\
             [[listeners]]\nurl = \"{tcp}\"\n\n[workers]\ncores = [0]\nidle = \"adaptive\"\n\n\
             [transport]\ncredits = 4\nmax_message = {max_message}\n\n\
             [metrics]\naddress = \"{metrics}\"\n\n[rpcbind]\nregister = false\n"
        ),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    let started = d.wait_for_line("started");
    assert!(started.contains("1 worker(s)"), "{started}");
    assert_eq!(worker_threads(d.child.id()), ["rpcrdma-w0"]);

    let sizes = [0usize, 1, 4096, 64 << 10, 1 << 20, 4 << 20];
    let clients: Vec<std::thread::JoinHandle<u64>> = vec![
        std::thread::spawn({
            let shm = shm.clone();
            move || rdma_calls::<Shm>(&shm, max_message, &sizes, 1).0
        }),
        std::thread::spawn(move || rdma_calls::<Roce>(roce, max_message, &sizes, 2).0),
        std::thread::spawn(move || tcp_calls(tcp, &sizes, 3).0),
    ];
    // Two TCP clients more, so that all transports overlap for a while.
    let extra: Vec<_> = (4..6)
        .map(|seed| std::thread::spawn(move || tcp_calls(tcp, &sizes, seed).0))
        .collect();
    let mut calls = 0;
    for (i, h) in clients.into_iter().chain(extra).enumerate() {
        calls += h.join().unwrap_or_else(|_| panic!("client {i} failed"));
    }

    // Still one worker thread; every call counted on worker 0.
    assert_eq!(worker_threads(d.child.id()), ["rpcrdma-w0"]);
    let body = scrape_until(metrics, "rpcrdma_worker_rpcs_total{worker=\"0\"", calls);
    for (url, accepted) in [(shm.as_str(), 1), (roce, 1), (tcp, 3)] {
        assert_eq!(
            metric(
                &body,
                &format!("rpcrdma_listener_connections_total{{listener=\"{url}\"}}")
            ),
            accepted,
            "{url}: {body}"
        );
    }
    promtool_accepts(&body);
    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sixty_four_concurrent_clients() {
    let dir = scratch_dir("serve-64");
    let metrics: SocketAddr = "127.0.0.1:19482".parse().unwrap();
    let max_message = (64 << 10) + 4096;
    let url = format!("shm://{}/d.sock", dir.display());
    let cfg = daemon_config(
        &dir,
        &url,
        metrics,
        &format!("[transport]\ncredits = 8\nmax_message = {max_message}\n"),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");

    let threads: Vec<_> = (0..64u32)
        .map(|t| {
            let url = url.clone();
            std::thread::spawn(move || {
                let mut c = Client::<Shm>::connect(&url, client_config(max_message, 4))
                    .unwrap_or_else(|e| panic!("client {t}: {e}"));
                for round in 0..8u32 {
                    let size = ((t * 977 + round * 3001) % (40 << 10)) as usize;
                    let data: Vec<u8> = (0..size).map(|i| (i as u32 ^ t) as u8).collect();
                    echo(&mut c, &data, EchoPath::DdpBothWays);
                }
            })
        })
        .collect();
    for (t, h) in threads.into_iter().enumerate() {
        h.join().unwrap_or_else(|_| panic!("client {t} failed"));
    }

    let (_, body) = http_get(metrics, "/metrics");
    assert_eq!(
        metric(&body, "rpcrdma_listener_connections_total"),
        64,
        "{body}"
    );
    assert!(
        metric(&body, "rpcrdma_worker_rpcs_total") >= 64 * 8,
        "{body}"
    );

    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}

/// `workers.max_connections`: a TCP connection beyond the limit is closed
/// at once and counted as rejected, with one warning naming the key; the
/// served client is untouched.
#[test]
fn tcp_connections_beyond_max_connections_are_refused() {
    let dir = scratch_dir("serve-limit");
    let tcp = "tcp://127.0.0.41:20341";
    let metrics: SocketAddr = "127.0.0.1:19486".parse().unwrap();
    let cfg = write_file(
        &dir,
        "limit.toml",
        &format!(
            "[[listeners]]\nurl = \"{tcp}\"\n\n[workers]\ncores = [0]\nidle = \"adaptive\"\n\
             max_connections = 1\n\n[metrics]\naddress = \"{metrics}\"\n\n\
             [rpcbind]\nregister = false\n"
        ),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");
    let config = TcpClientConfig::for_data(4096, 1);
    let mut served = TcpClient::connect_url(tcp, config).expect("tcp connect");
    tcp_call(&mut served, Args::Null);

    // The kernel completes the handshake; the daemon then closes the
    // stream without reading it, so the call fails instead of hanging.
    let mut refused = TcpClient::connect_url(tcp, config).expect("tcp connect");
    let failed = refused.call(Args::Null, 0).is_err() || {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            match refused.poll(|_| {}) {
                Err(_) => break true,
                Ok(_) if std::time::Instant::now() > deadline => break false,
                Ok(_) => std::thread::sleep(std::time::Duration::from_millis(2)),
            }
        }
    };
    assert!(failed, "the connection beyond the limit was served");
    d.wait_for_line("workers.max_connections");
    let body = scrape_until(metrics, "rpcrdma_listener_rejected_total", 1);
    assert_eq!(
        metric(
            &body,
            &format!("rpcrdma_listener_rejected_total{{listener=\"{tcp}\",reason=\"limit\"}}")
        ),
        1,
        "{body}"
    );
    // The first connection still works.
    tcp_call(&mut served, Args::Null);
    drop(served);
    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}

/// Two daemons on one shm path: the second refuses to start with one line
/// naming the first one's PID, and leaves its socket alone; the first keeps
/// serving, before and after the second's attempt, and still cleans up.
#[test]
fn a_second_daemon_on_the_same_shm_path_refuses_and_the_first_keeps_serving() {
    let dir = scratch_dir("serve-two-daemons");
    let url = format!("shm://{}/d.sock", dir.display());
    let sock = dir.join("d.sock");
    let first_cfg = daemon_config(&dir, &url, "127.0.0.1:19487".parse().unwrap(), "");
    let mut first = Daemon::spawn(&["--config", first_cfg.to_str().unwrap()]);
    first.wait_for_line("started");
    let mut client = Client::<Shm>::connect(&url, client_config(1 << 20, 4)).expect("connect");
    simple_call(&mut client, Args::Null, ReplyTarget::Inline);

    // The second: same path, its own metrics port and config file.
    let second_dir = scratch_dir("serve-two-daemons-2");
    let second_cfg = daemon_config(&second_dir, &url, "127.0.0.1:19488".parse().unwrap(), "");
    let (code, _, err) = run(&["--config", second_cfg.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    let refusals: Vec<&str> = err.lines().filter(|l| !l.contains(" WARN ")).collect();
    assert_eq!(refusals.len(), 1, "{err}");
    let pid = first.child.id();
    assert!(
        refusals[0].contains(&format!("in use by process {pid}")),
        "the refusal does not name the first daemon ({pid}): {err}"
    );
    assert!(sock.exists(), "the second daemon removed the live socket");

    // The established client and a new one are both still served.
    simple_call(&mut client, Args::Null, ReplyTarget::Inline);
    let mut again = Client::<Shm>::connect(&url, client_config(1 << 20, 4)).expect("reconnect");
    assert_eq!(
        simple_call(&mut again, Args::Echo(b"still here"), ReplyTarget::Inline),
        b"still here"
    );
    drop((client, again));
    first.stop_cleanly();
    assert!(!sock.exists(), "the first daemon left its socket behind");
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(second_dir);
}

/// The service latency histograms: nothing before any call, then one
/// count per call under its program, version and procedure; promtool
/// accepts them.
#[test]
fn latency_histograms_move_when_calls_run() {
    let dir = scratch_dir("serve-latency");
    let url = "tcp://127.0.0.52:20521";
    let metrics: SocketAddr = "127.0.0.1:19502".parse().unwrap();
    let cfg = daemon_config(&dir, url, metrics, "");
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");
    let count = "rpcrdma_rpc_latency_seconds_count";
    let (_, body) = http_get(metrics, "/metrics");
    assert!(
        body.contains("# TYPE rpcrdma_rpc_latency_seconds histogram\n"),
        "{body}"
    );
    assert_eq!(metric(&body, count), 0, "{body}");

    let mut client =
        TcpClient::connect_url(url, TcpClientConfig::for_data(4096, 1)).expect("tcp connect");
    for _ in 0..3 {
        tcp_call(&mut client, Args::Null);
    }
    for i in 0..5 {
        let data = test_data(100, i);
        assert_eq!(tcp_call(&mut client, Args::Echo(&data)), data);
    }
    let body = scrape_until(metrics, "rpcrdma_worker_rpcs_total", 8);
    let series = |proc: u32| {
        format!(
            "{count}{{program=\"{}\",version=\"1\",procedure=\"{proc}\"}}",
            bench::PROGRAM
        )
    };
    assert_eq!(metric(&body, &series(0)), 3, "{body}");
    assert_eq!(
        metric(&body, &series(bench::Proc::Echo as u32)),
        5,
        "{body}"
    );
    assert_eq!(metric(&body, count), 8, "{body}");
    // Every call took more than nothing and landed in some bucket up to
    // +Inf.
    let inf = format!(
        "rpcrdma_rpc_latency_seconds_bucket{{program=\"{}\",version=\"1\",procedure=\"0\",le=\"+Inf\"}} 3",
        bench::PROGRAM
    );
    assert!(body.contains(&inf), "{body}");
    promtool_accepts(&body);
    drop(client);
    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}

/// A client that closes in order is counted as a clean close, not as a
/// lost connection; a TCP client that ends its stream in the middle of a
/// record is a fault, and counted as both.
#[test]
fn clean_closes_and_faults_are_counted_apart() {
    use std::io::Write as _;
    let dir = scratch_dir("serve-closes");
    let shm = format!("shm://{}/d.sock", dir.display());
    let tcp = "tcp://127.0.0.53:20531";
    let roce = "roce://127.0.0.53:20532";
    let metrics: SocketAddr = "127.0.0.1:19503".parse().unwrap();
    let cfg = write_file(
        &dir,
        "closes.toml",
        &format!(
            "[[listeners]]\nurl = \"{shm}\"\n\n[[listeners]]\nurl = \"{tcp}\"\n\n\
             [[listeners]]\nurl = \"{roce}\"\n\n\
             [workers]\ncores = [0]\nidle = \"adaptive\"\n\n[metrics]\naddress = \"{metrics}\"\n\n\
             [rpcbind]\nregister = false\n\n[control]\nsocket = \"{}/ctl.sock\"\n",
            dir.display()
        ),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");

    let mut c = Client::<Shm>::connect(&shm, client_config(1 << 20, 4)).expect("shm connect");
    simple_call(&mut c, Args::Null, ReplyTarget::Inline);
    drop(c);
    let mut r = Client::<Roce>::connect(roce, client_config(1 << 20, 4)).expect("roce connect");
    simple_call(&mut r, Args::Null, ReplyTarget::Inline);
    drop(r);
    let mut t = TcpClient::connect_url(tcp, TcpClientConfig::for_data(4096, 1)).expect("tcp");
    tcp_call(&mut t, Args::Null);
    drop(t);
    let closed = "rpcrdma_connections_closed_total";
    let body = scrape_until(metrics, closed, 3);
    assert_eq!(
        metric(
            &body,
            &format!("{closed}{{worker=\"0\",core=\"0\",how=\"clean\"}}")
        ),
        3,
        "{body}"
    );
    assert_eq!(
        metric(
            &body,
            &format!("{closed}{{worker=\"0\",core=\"0\",how=\"fault\"}}")
        ),
        0,
        "{body}"
    );
    let lost = "rpcrdma_worker_errors_total{worker=\"0\",core=\"0\",kind=\"connection_lost\"}";
    assert_eq!(metric(&body, lost), 0, "{body}");

    // A record mark promising 100 bytes, 4 of them, then the end.
    let mut s = std::net::TcpStream::connect("127.0.0.53:20531").unwrap();
    s.write_all(&[0x80, 0, 0, 100, 1, 2, 3, 4]).unwrap();
    drop(s);
    let body = scrape_until(metrics, closed, 4);
    assert_eq!(
        metric(
            &body,
            &format!("{closed}{{worker=\"0\",core=\"0\",how=\"fault\"}}")
        ),
        1,
        "{body}"
    );
    assert_eq!(metric(&body, lost), 1, "{body}");
    promtool_accepts(&body);
    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}

/// Nothing is logged per RPC, even at the most verbose level: a few
/// hundred calls over shm and tcp add no line to the daemon's log
/// between its start and its stop but the two connections' hand-offs.
#[test]
fn no_log_line_per_rpc_even_at_trace() {
    let dir = scratch_dir("serve-quiet");
    let shm = format!("shm://{}/d.sock", dir.display());
    let tcp = "tcp://127.0.0.54:20541";
    let cfg = write_file(
        &dir,
        "quiet.toml",
        &format!(
            "[[listeners]]\nurl = \"{shm}\"\n\n[[listeners]]\nurl = \"{tcp}\"\n\n\
             [workers]\ncores = [0]\nidle = \"adaptive\"\n\n[metrics]\nenabled = false\n\n\
             [rpcbind]\nregister = false\n\n[control]\nsocket = \"{}/ctl.sock\"\n",
            dir.display()
        ),
    );
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(["--config", cfg.to_str().unwrap()])
        .env("RPCRDMAD_LOG", "trace");
    let mut d = Daemon::spawn_command(cmd);
    d.wait_for_line("started");
    let before = d.stderr().lines().count();
    let mut c = Client::<Shm>::connect(&shm, client_config(1 << 20, 4)).expect("shm connect");
    let mut t = TcpClient::connect_url(tcp, TcpClientConfig::for_data(4096, 1)).expect("tcp");
    const CALLS: usize = 300;
    for i in 0..CALLS {
        let data = test_data(32, i);
        assert_eq!(
            simple_call(&mut c, Args::Echo(&data), ReplyTarget::Inline),
            data
        );
        assert_eq!(tcp_call(&mut t, Args::Echo(&data)), data);
    }
    // A marker after the last call: the hand-off of a third connection
    // (a debug line naming its peer). Every line the calls caused came
    // before it.
    let marker = std::net::TcpStream::connect("127.0.0.54:20541").unwrap();
    let peer = marker.local_addr().unwrap().to_string();
    d.wait_for_line(&format!("{peer} handed to worker"));
    let during: Vec<String> = d
        .stderr()
        .lines()
        .skip(before)
        .take_while(|l| !l.contains(&peer))
        .map(str::to_owned)
        .collect();
    assert!(
        during.len() <= 4,
        "{} lines for {} calls:\n{}",
        during.len(),
        2 * CALLS,
        during.join("\n")
    );
    drop((c, t, marker));
    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}

/// `transport.extensions`: the daemon's connections negotiate them with a
/// client that asks with CONF_RDMA version 2, as far as both engines
/// implement them (the engine's advertised set, not a list written here),
/// and a Version One client gets none; both are served.
#[test]
fn configured_extensions_are_negotiated_with_a_version_two_client_only() {
    use dataplane::engine::{self, Connection, Extensions};
    let dir = scratch_dir("serve-extensions");
    let url = format!("shm://{}/d.sock", dir.display());
    let cfg = daemon_config(
        &dir,
        &url,
        "127.0.0.1:19511".parse().unwrap(),
        "[transport]\nextensions = [\"remote_invalidate\", \"message_continuation\"]\n",
    );
    let mut daemon = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    daemon.wait_for_line("started");
    let advertised = |ext| {
        Connection::new(engine::Config {
            extensions: ext,
            ..engine::Config::default()
        })
        .unwrap()
        .advertised_extensions()
    };
    let daemon_offers =
        advertised(Extensions::REMOTE_INVALIDATE.union(Extensions::MESSAGE_CONTINUATION));
    assert!(daemon_offers.contains(Extensions::REMOTE_INVALIDATE));
    assert!(
        daemon.stderr().contains(&format!(
            "transport: extensions configured: remote_invalidate,message_continuation; \
             offered to clients that negotiate with CONF_RDMA version 2: {}",
            dataplane::extension_names::Names(daemon_offers)
        )),
        "{}",
        daemon.stderr()
    );

    let mut v2 = client_config(1 << 20, 4);
    v2.extensions = Extensions::ALL;
    let mut c2 = Client::<Shm>::connect(&url, v2).expect("connect v2");
    assert_eq!(
        c2.negotiated(),
        advertised(Extensions::ALL).intersection(daemon_offers)
    );
    let mut c1 = Client::<Shm>::connect(&url, client_config(1 << 20, 4)).expect("connect v1");
    assert!(c1.conf_rdma_reply().is_some(), "the version 1 exchange ran");
    assert_eq!(c1.negotiated(), Extensions::EMPTY);
    let data = vec![7u8; 100_000];
    for c in [&mut c1, &mut c2] {
        assert_eq!(
            simple_call(
                c,
                Args::Echo(&data),
                ReplyTarget::WriteChunk { max_ddp: 100_000 }
            ),
            data
        );
    }
    // Message continuation through the daemon (its worker's shared
    // receives and credit pool): an 8 KiB echo goes in Sends both ways,
    // one round trip.
    if c2.negotiated().contains(Extensions::MESSAGE_CONTINUATION) {
        let mut v2 = client_config(64 << 10, 4);
        v2.extensions = Extensions::MESSAGE_CONTINUATION;
        let mut c3 = Client::<Shm>::connect(&url, v2).expect("connect v2");
        let data = vec![9u8; 8192];
        for _ in 0..3 {
            let back = simple_call(
                &mut c3,
                Args::Echo(&data),
                ReplyTarget::WriteChunk { max_ddp: 8192 },
            );
            assert_eq!(back, data);
        }
        let s = *c3.endpoint().connection().stats();
        assert_eq!(
            (s.call_groups_sent, s.reply_groups_received),
            (3, 3),
            "{s:?}"
        );
        assert_eq!((s.calls_pulled, s.replies_pulled), (0, 0));
        drop(c3);
    }
    drop((c1, c2));
    daemon.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}
