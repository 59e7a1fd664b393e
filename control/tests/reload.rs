//! SIGHUP: the real daemon reloads its file while clients keep calling.
//! Listeners come and go without touching established connections; a
//! key that cannot change live is refused with one line and nothing
//! changes; the log level follows the file.
mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::client::{Client, ReplyTarget};
use dataplane::service::bench::Args;
use dataplane::tcp::{TcpClient, TcpClientConfig};
use dataplane::verbs::shm::Shm;
use nix::sys::signal::Signal;
use support::bench_calls::*;
use support::*;

const TCP_A: &str = "tcp://127.0.0.61:20611";
const TCP_B: &str = "tcp://127.0.0.61:20612";

fn config(dir: &Path, listeners: &[&str], extra: &str) -> String {
    let mut text = String::new();
    for l in listeners {
        text.push_str(&format!("[[listeners]]\nurl = \"{l}\"\n\n"));
    }
    text.push_str(&format!(
        "[workers]\ncores = [0]\nidle = \"adaptive\"\n\n[metrics]\naddress = \"127.0.0.1:19504\"\n\n\
         [rpcbind]\nregister = false\n\n[control]\nsocket = \"{}/ctl.sock\"\n\n{extra}",
        dir.display()
    ));
    text
}

/// Waits until `calls` has grown by `more` (the client thread made that
/// many calls since); PATIENCE catches a client that stopped.
fn wait_for_calls(calls: &AtomicU64, more: u64) {
    let target = calls.load(Ordering::SeqCst) + more;
    let deadline = Instant::now() + PATIENCE;
    while calls.load(Ordering::SeqCst) < target {
        assert!(Instant::now() < deadline, "the clients stopped calling");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn sighup_adds_and_removes_listeners_while_clients_keep_calling() {
    let dir = scratch_dir("reload");
    let shm = format!("shm://{}/a.sock", dir.display());
    let file = dir.join("rpcrdmad.toml");
    std::fs::write(&file, config(&dir, &[TCP_A, &shm], "")).unwrap();
    let mut d = Daemon::spawn(&["--config", file.to_str().unwrap()]);
    d.wait_for_line("started");

    // One client through each listener that is going away, calling
    // without pause on its established connection; any error fails.
    let calls = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tcp = TcpClient::connect_url(TCP_A, TcpClientConfig::for_data(4096, 1)).unwrap();
    let mut rdma = Client::<Shm>::connect(&shm, client_config(1 << 20, 4)).unwrap();
    let caller = {
        let (calls, stop) = (Arc::clone(&calls), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut i = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let data = test_data(64 + i % 512, i);
                assert_eq!(tcp_call(&mut tcp, Args::Echo(&data)), data, "tcp call {i}");
                assert_eq!(
                    simple_call(&mut rdma, Args::Echo(&data), ReplyTarget::Inline),
                    data,
                    "shm call {i}"
                );
                calls.fetch_add(2, Ordering::SeqCst);
                i += 1;
            }
            (tcp, rdma)
        })
    };
    wait_for_calls(&calls, 100);

    // Remove both listeners the clients came through, add another.
    std::fs::write(&file, config(&dir, &[TCP_B], "")).unwrap();
    d.signal(Signal::SIGHUP);
    let line = d.wait_for_line("reload: ");
    assert!(line.contains(&format!("+{TCP_B}")), "{line}");
    assert!(line.contains(&format!("-{TCP_A}")), "{line}");
    assert!(line.contains(&format!("-{shm}")), "{line}");
    wait_for_calls(&calls, 100);
    // The removed listeners are gone, the new one answers.
    assert!(std::net::TcpStream::connect("127.0.0.61:20611").is_err());
    assert!(!dir.join("a.sock").exists(), "shm socket left behind");
    let mut fresh = TcpClient::connect_url(TCP_B, TcpClientConfig::for_data(4096, 1)).unwrap();
    tcp_call(&mut fresh, Args::Null);
    let metrics: SocketAddr = "127.0.0.1:19504".parse().unwrap();
    let (_, body) = http_get(metrics, "/metrics");
    assert!(
        body.contains(&format!(
            "rpcrdma_listener_serving{{listener=\"{TCP_B}\"}} 1"
        )),
        "{body}"
    );
    assert!(!body.contains(TCP_A), "{body}");

    // A key that cannot change live: one line naming it, nothing changes.
    std::fs::write(
        &file,
        config(&dir, &[TCP_A, TCP_B], "").replace("cores = [0]", "cores = [0, 1]"),
    )
    .unwrap();
    d.signal(Signal::SIGHUP);
    let line = d.wait_for_line("refused");
    assert!(line.contains("workers.cores cannot change"), "{line}");
    assert!(line.contains("nothing was changed"), "{line}");
    wait_for_calls(&calls, 100);
    assert!(
        std::net::TcpStream::connect("127.0.0.61:20611").is_err(),
        "a refused reload opened a listener"
    );

    // The log level follows the file: at debug, a connection's hand-off
    // is logged.
    std::fs::write(&file, config(&dir, &[TCP_B], "[log]\nlevel = \"debug\"\n")).unwrap();
    d.signal(Signal::SIGHUP);
    let line = d.wait_for_line("reload: ");
    assert!(line.contains("log.level Info -> Debug"), "{line}");
    let mut another = TcpClient::connect_url(TCP_B, TcpClientConfig::for_data(4096, 1)).unwrap();
    tcp_call(&mut another, Args::Null);
    d.wait_for_line("handed to worker");
    wait_for_calls(&calls, 100);

    stop.store(true, Ordering::SeqCst);
    let (tcp, rdma) = caller.join().expect("the clients saw an error");
    drop((tcp, rdma, fresh, another));
    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}

/// A backend in this process: the bench program over ONC RPC/TCP, polled
/// by a thread until `stop`.
fn backend(addr: &str, stop: &Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    use dataplane::engine::Instant as EngineInstant;
    use dataplane::service::ServiceTable;
    use dataplane::tcp::{TcpConfig, TcpServer};
    let mut server = TcpServer::bind(addr.parse().unwrap(), TcpConfig::default()).unwrap();
    let stop = Arc::clone(stop);
    std::thread::spawn(move || {
        let services = ServiceTable::builtin();
        let start = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let now = EngineInstant(start.elapsed().as_nanos() as u64);
            if server.poll(&services, now) == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    })
}

/// Calls of the bench program relayed by route `backend`, from a scrape.
fn relayed(body: &str, backend: &str) -> u64 {
    body.lines()
        .filter(|l| l.starts_with("rpcrdma_gateway_calls_total{"))
        .filter(|l| l.contains(&format!("backend=\"{backend}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A `[[gateway]]` route moves to another backend, then goes away, while
/// an shm client keeps calling the routed program: no call fails, the new
/// backend gets the calls after the reload, and without the route the
/// daemon answers them itself.
#[test]
fn sighup_moves_a_gateway_route_while_a_client_keeps_calling() {
    let dir = scratch_dir("reload-gateway");
    let shm = format!("shm://{}/g.sock", dir.display());
    let (a, b) = ("127.0.0.63:20631", "127.0.0.63:20632");
    let stop_backends = Arc::new(AtomicBool::new(false));
    let backends = [backend(a, &stop_backends), backend(b, &stop_backends)];
    let route = |backend: &str| {
        format!(
            "[[gateway]]\nprogram = {}\nversions = [1]\nbackend = \"{backend}\"\n",
            dataplane::service::bench::PROGRAM
        )
    };
    let text =
        |extra: &str| config(&dir, &[&shm], extra).replace("127.0.0.1:19504", "127.0.0.1:19505");
    let file = dir.join("rpcrdmad.toml");
    std::fs::write(&file, text(&route(a))).unwrap();
    let mut d = Daemon::spawn(&["--config", file.to_str().unwrap()]);
    d.wait_for_line("started");
    let metrics: SocketAddr = "127.0.0.1:19505".parse().unwrap();

    let calls = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut rdma = Client::<Shm>::connect(&shm, client_config(1 << 20, 4)).unwrap();
    let caller = {
        let (calls, stop) = (Arc::clone(&calls), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut i = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let data = test_data(64 + i % 256, i);
                assert_eq!(
                    simple_call(&mut rdma, Args::Echo(&data), ReplyTarget::Inline),
                    data,
                    "call {i}"
                );
                calls.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
            rdma
        })
    };
    wait_for_calls(&calls, 50);
    let body = scrape_until(metrics, "rpcrdma_gateway_calls_total", 50);
    assert!(relayed(&body, a) >= 50, "{body}");

    // To the other backend.
    std::fs::write(&file, text(&route(b))).unwrap();
    d.signal(Signal::SIGHUP);
    let line = d.wait_for_line("reload: ");
    assert!(line.contains("gateway: 1 route(s)"), "{line}");
    wait_for_calls(&calls, 50);
    let body = scrape_until(metrics, "rpcrdma_gateway_calls_total", 50);
    assert!(relayed(&body, b) >= 50, "{body}");
    assert_eq!(relayed(&body, a), 0, "{body}");

    // No route: the daemon answers the bench program itself.
    std::fs::write(&file, text("")).unwrap();
    d.signal(Signal::SIGHUP);
    let line = d.wait_for_line("reload: ");
    assert!(line.contains("gateway: 0 route(s)"), "{line}");
    wait_for_calls(&calls, 50);
    let (_, body) = http_get(metrics, "/metrics");
    assert!(!body.contains("rpcrdma_gateway_calls_total{"), "{body}");

    stop.store(true, Ordering::SeqCst);
    let rdma = caller.join().expect("the client saw an error");
    drop(rdma);
    d.stop_cleanly();
    stop_backends.store(true, Ordering::SeqCst);
    for b in backends {
        b.join().unwrap();
    }
    let _ = std::fs::remove_dir_all(dir);
}
