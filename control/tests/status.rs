//! `rpcrdmad status`: the real daemon, connections opened by this test,
//! and the per-connection figures the daemon reports checked against what
//! the test sent.
mod support;

use std::net::SocketAddr;

use dataplane::client::{Client, ReplyTarget};
use dataplane::service::bench::Args;
use dataplane::tcp::{TcpClient, TcpClientConfig};
use dataplane::verbs::shm::Shm;
use support::bench_calls::*;
use support::*;

fn status_json(socket: &std::path::Path) -> serde_json::Value {
    let (code, out, err) = run(&["status", "--json", "--socket", socket.to_str().unwrap()]);
    assert_eq!(code, Some(0), "status --json: {err}");
    assert_eq!(out.lines().count(), 1, "one JSON line: {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn connection<'a>(report: &'a serde_json::Value, peer: &str) -> &'a serde_json::Value {
    report["connections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["peer"] == peer)
        .unwrap_or_else(|| panic!("no connection from {peer}: {report}"))
}

#[test]
fn status_json_counts_each_connections_calls_and_bytes() {
    let dir = scratch_dir("status");
    let socket = dir.join("ctl.sock");
    let shm = format!("shm://{}/d.sock", dir.display());
    let tcp = "tcp://127.0.0.51:20511";
    let metrics: SocketAddr = "127.0.0.1:19501".parse().unwrap();
    let cfg = write_file(
        &dir,
        "status.toml",
        &format!(
            "[[listeners]]\nurl = \"{shm}\"\n\n[[listeners]]\nurl = \"{tcp}\"\n\n\
             [workers]\ncores = [0]\nidle = \"adaptive\"\n\n[metrics]\naddress = \"{metrics}\"\n\n\
             [rpcbind]\nregister = false\n\n[control]\nsocket = \"{}\"\n",
            socket.display()
        ),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "control socket mode {mode:o}");

    // Two TCP connections with different call counts, one shm connection.
    let mut tcp_clients = Vec::new();
    for calls in [3usize, 7] {
        let mut c = TcpClient::connect_url(tcp, TcpClientConfig::for_data(4096, 1)).unwrap();
        for i in 0..calls {
            let data = test_data(100 * (i + 1), i);
            assert_eq!(tcp_call(&mut c, Args::Echo(&data)), data);
        }
        tcp_clients.push((calls as u64, c));
    }
    let mut shm_client = Client::<Shm>::connect(&shm, client_config(1 << 20, 4)).unwrap();
    for _ in 0..5 {
        simple_call(&mut shm_client, Args::Null, ReplyTarget::Inline);
    }

    let report = status_json(&socket);
    assert_eq!(report["pid"], d.child.id(), "{report}");
    assert_eq!(report["workers"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(report["workers"][0]["connections"], 3, "{report}");
    assert_eq!(report["listeners"].as_array().unwrap().len(), 2, "{report}");
    assert_eq!(
        report["connections"].as_array().unwrap().len(),
        3,
        "{report}"
    );
    for (calls, c) in &tcp_clients {
        let peer = c.local_addr().unwrap().to_string();
        let row = connection(&report, &peer);
        assert_eq!(row["transport"], "tcp");
        assert_eq!(row["calls_received"], *calls, "{row}");
        assert_eq!(row["replies_sent"], *calls, "{row}");
        // Every byte the client wrote and read, record marks included.
        assert_eq!(row["bytes_received"], c.stats().bytes_out, "{row}");
        assert_eq!(row["bytes_sent"], c.stats().bytes_in, "{row}");
        assert_eq!(row["errors"], 0, "{row}");
    }
    let uid = nix::unistd::geteuid().as_raw();
    let row = connection(&report, &format!("uid {uid}"));
    assert_eq!(row["transport"], "shm");
    // The five NULL calls and the CONF_RDMA call the client made at
    // connect (answered by the engine).
    assert_eq!(row["calls_received"], 6, "{row}");
    assert_eq!(row["replies_sent"], 6, "{row}");
    assert!(row["credits_granted"].as_u64().unwrap() >= 1, "{row}");
    assert_eq!(row["credits_in_use"], 0, "{row}");
    assert!(
        report["pools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pool"] == "bulk" && p["provider"] == "shm"),
        "{report}"
    );

    // The text form names the same connections.
    let (code, text, err) = run(&["status", "--socket", socket.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    for (_, c) in &tcp_clients {
        assert!(
            text.contains(&c.local_addr().unwrap().to_string()),
            "{text}"
        );
    }
    assert!(text.contains("connections (3)"), "{text}");

    // Another user is kept out by the socket's mode.
    if let Some(setpriv) = find_tool("setpriv") {
        let out = std::process::Command::new(setpriv)
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN])
            .args(["status", "--socket", socket.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if nix::unistd::geteuid().is_root() {
            assert_eq!(out.status.code(), Some(1), "{err}");
            assert!(err.contains("permission denied"), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }

    drop(tcp_clients);
    drop(shm_client);
    d.stop_cleanly();
    assert!(!socket.exists(), "control socket left behind");

    // No daemon: one line saying so.
    let (code, out, err) = run(&["status", "--socket", socket.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(out.is_empty(), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("rpcrdmad is not running"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}
