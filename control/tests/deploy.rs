//! `deploy/`: the host setup script plans without changing anything, and
//! systemd itself accepts the unit (`systemd-analyze verify`).

mod support;

use std::process::Command;

use support::{require_peer, scratch_dir, write_file, BIN};

const UNIT: &str = include_str!("../../deploy/rpcrdmad.service");

#[test]
fn setup_host_dry_run_changes_nothing_and_says_what_it_would_do() {
    let out = Command::new("bash")
        .args([
            "../deploy/setup-host",
            "--dry-run",
            "--no-packages",
            "--hugepages",
            "1",
        ])
        .output()
        .expect("run deploy/setup-host");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.lines().all(|l| l.starts_with("setup-host: ")),
        "{text}"
    );
    assert!(text.contains("packages: skipped (--no-packages)"), "{text}");
    assert!(
        text.contains("hugepages: unchanged") || text.contains("would reserve"),
        "{text}"
    );

    let bad = Command::new("bash")
        .args(["../deploy/setup-host", "--bogus"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn systemd_accepts_the_unit() {
    let Some(analyze) = require_peer("systemd-analyze") else {
        return;
    };
    let dir = scratch_dir("unit");
    let unit = write_file(
        &dir,
        "rpcrdmad.service",
        &UNIT.replace("/usr/local/bin/rpcrdmad", BIN),
    );
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("run systemd-analyze verify");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        !err.contains("rpcrdmad.service:"),
        "systemd complains: {err}"
    );
    for key in [
        "LimitMEMLOCK=infinity",
        "Restart=on-failure",
        "CPUAffinity=",
        "RestartPreventExitStatus=2",
    ] {
        assert!(UNIT.contains(key), "unit lacks {key}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The Grafana dashboard is JSON Grafana can import (a title, a uid,
/// panels with Prometheus queries), and every metric a query names is one
/// the daemon exports.
#[test]
fn grafana_dashboard_parses_and_queries_only_exported_metrics() {
    use control::metrics::{GatewayRouteSample, LatencySample, Registry};
    let text = include_str!("../../deploy/grafana/rpcrdma-dashboard.json");
    let dash: serde_json::Value = serde_json::from_str(text).expect("dashboard JSON");
    assert!(
        dash["title"].is_string() && dash["uid"].is_string(),
        "{dash}"
    );

    // Every family the daemon can export, gateway and latency included.
    let reg = Registry::new(&[0], &["tcp://127.0.0.1:1".into()]);
    reg.set_gateway(vec![GatewayRouteSample {
        program: 100_003,
        backend: "127.0.0.1:2049".into(),
        latency_bounds_us: vec![10],
        latency_buckets: vec![0, 0],
        ..GatewayRouteSample::default()
    }]);
    reg.set_latency(vec![LatencySample {
        program: 1,
        version: 1,
        procedure: "0".into(),
        bounds_ns: vec![1000],
        buckets: vec![1, 0],
        sum_ns: 10,
    }]);
    let exposition = reg.render();
    let exported: std::collections::HashSet<&str> = exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();

    let mut queries = 0;
    for panel in dash["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        assert!(panel["title"].is_string(), "{panel}");
        for t in panel["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("expr");
            queries += 1;
            let names: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("rpcrdma_"))
                .collect();
            assert!(!names.is_empty(), "query names no rpcrdma metric: {expr}");
            for n in names {
                assert!(exported.contains(n), "{n} in {expr:?} is not exported");
            }
        }
    }
    assert!(queries >= 10, "{queries} queries");
    let titles: Vec<&str> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["title"].as_str())
        .collect();
    for row in ["Workers", "Rates", "Latency", "Errors"] {
        assert!(titles.contains(&row), "no {row} row: {titles:?}");
    }
}
