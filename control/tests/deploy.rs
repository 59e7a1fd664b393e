//! `deploy/`: the host setup script plans without changing anything,
//! systemd itself accepts the unit (`systemd-analyze verify`), and the
//! measuring tools run (`deploy/callgrind-per-rpc`, `deploy/kernel-paths`).

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

/// The Kubernetes manifests (`deploy/k8s/`) are valid for the API
/// versions `kubernetes-validate` ships schemas of (strict: no unknown
/// field). The ServiceMonitor is a custom resource it has no schema for;
/// its selector and port are checked against the Service here.
#[test]
fn kubernetes_manifests_validate() {
    let Some(tool) = require_peer("kubernetes-validate") else {
        return;
    };
    let dir = std::path::Path::new("../deploy/k8s");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "{files:?}");
    for f in &files {
        let out = Command::new(&tool)
            .arg("--strict")
            .arg(f)
            .output()
            .expect("run kubernetes-validate");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{}: {text}", f.display());
        assert!(!text.contains("ERROR"), "{}: {text}", f.display());
        for warn in text.lines().filter(|l| l.contains("WARN")) {
            assert!(
                warn.contains("kind ServiceMonitor"),
                "{}: unexpected warning {warn}",
                f.display()
            );
        }
    }
    let service = std::fs::read_to_string(dir.join("service.yaml")).unwrap();
    let monitor = std::fs::read_to_string(dir.join("servicemonitor.yaml")).unwrap();
    assert!(monitor.contains("app.kubernetes.io/name: rpcrdmad"));
    assert!(service.contains("    app.kubernetes.io/name: rpcrdmad\n  ports:"));
    assert!(monitor.contains("- port: metrics") && service.contains("- name: metrics"));
}

/// The block scalar `key: |` of a YAML file, unindented (our ConfigMap's
/// two files; a full YAML parser is not needed for them).
fn block_scalar(yaml: &str, key: &str) -> String {
    let head = format!("  {key}: |");
    let mut lines = yaml.lines().skip_while(|l| *l != head).skip(1);
    let mut out = String::new();
    for l in lines.by_ref() {
        if l.is_empty() {
            out.push('\n');
        } else if let Some(rest) = l.strip_prefix("    ") {
            out.push_str(rest);
            out.push('\n');
        } else {
            break;
        }
    }
    assert!(!out.is_empty(), "no {key} in the ConfigMap");
    out
}

/// The CPUs of a `Cpus_allowed_list` ("0-3,8").
fn cpu_list(list: &str) -> Vec<usize> {
    list.split(',')
        .flat_map(|r| {
            let (lo, hi) = r.split_once('-').unwrap_or((r, r));
            lo.trim().parse::<usize>().unwrap()..=hi.trim().parse::<usize>().unwrap()
        })
        .collect()
}

/// The container's entrypoint turns the ConfigMap's template into a file
/// `rpcrdmad --check-config` accepts, with one worker per CPU of the
/// affinity mask it runs under (the pod's exclusive cpuset).
#[test]
fn k8s_entrypoint_renders_a_config_with_the_pods_cpus() {
    let yaml = std::fs::read_to_string("../deploy/k8s/configmap.yaml").unwrap();
    let dir = scratch_dir("k8s-entrypoint");
    let template = write_file(
        &dir,
        "rpcrdmad.toml.in",
        &block_scalar(&yaml, "rpcrdmad.toml.in"),
    );
    let entrypoint = write_file(&dir, "entrypoint.sh", &block_scalar(&yaml, "entrypoint.sh"));
    let out = Command::new("sh")
        .arg(&entrypoint)
        .env("NODE_IP", "127.0.0.1")
        .env("RPCRDMA_TEMPLATE", &template)
        .env("RPCRDMA_RENDER_ONLY", "1")
        .output()
        .expect("run the entrypoint");
    let rendered = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{rendered}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let allowed = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim();
    let want = format!(
        "cores = [{}]",
        cpu_list(allowed)
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(rendered.contains(&want), "{want} not in:\n{rendered}");
    assert!(!rendered.contains('@'), "placeholder left:\n{rendered}");
    // This host may have no free hugepages; the pod requests its own.
    let cfg = write_file(
        &dir,
        "rpcrdmad.toml",
        &rendered.replace("hugepages = \"required\"", "hugepages = \"prefer\""),
    );
    let check = Command::new(BIN)
        .arg("--check-config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `deploy/callgrind-per-rpc` (behind `deploy/instructions`): per-RPC
/// instructions of the functions run a few times per RPC, the base run's
/// set-up subtracted and the idle loop left out.
#[test]
fn callgrind_per_rpc_subtracts_the_base_run_and_leaves_out_the_idle_loop() {
    let Some(python) = require_peer("python3") else {
        return;
    };
    let dir = scratch_dir("callgrind-per-rpc");
    // main calls `setup` once (both runs), `work` once per RPC and
    // `idle` a hundred times per RPC; names compressed as callgrind does.
    let profile = |rpcs: u64| {
        format!(
            "version: 1\ncreator: test\npositions: line\nevents: Ir\n\
             fn=(1) main\n0 10\n\
             cfn=(2) setup\ncalls=1 0\n0 777\n\
             cfn=(3) work\ncalls={rpcs} 0\n0 {}\n\
             cfn=(4) idle\ncalls={} 0\n0 {}\n\
             fn=(3)\n0 5\n",
            rpcs * 130,
            rpcs * 100,
            rpcs * 100 * 7
        )
    };
    let base = write_file(&dir, "cg.base", &profile(4));
    let long = write_file(&dir, "cg.long", &profile(10));
    let rows = output_rows(
        Command::new(python)
            .args(["../deploy/callgrind-per-rpc"])
            .arg(&long)
            .arg("10")
            .arg("--base")
            .arg(&base)
            .arg("4"),
    );
    // Below the heading row.
    assert_eq!(rows[1..], [vec!["130", "1.00", "130", "work"]], "{rows:?}");
}

/// Runs `cmd`, checks that it succeeded, and returns its standard
/// output's lines split into words.
fn output_rows(cmd: &mut Command) -> Vec<Vec<String>> {
    let out = cmd.output().expect("run the tool");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// `deploy/kernel-paths` compiles its C program and measures the mode it
/// is given: one round of the roce-shaped UDP GSO sends prints that mode
/// once, with a rate and the sender's CPU per GB.
#[test]
fn kernel_paths_measures_the_mode_it_is_given() {
    if require_peer("cc").is_none() {
        return;
    }
    let rows = output_rows(Command::new("../deploy/kernel-paths").args(["1", "0", "1", "gso45"]));
    assert_eq!(rows.len(), 1, "{rows:?}");
    // gso45  4.19 GB/s  sender 0.159 s/GB
    let r: Vec<&str> = rows[0].iter().map(String::as_str).collect();
    assert_eq!(
        (r[0], r[2], r[3], r[5]),
        ("gso45", "GB/s", "sender", "s/GB"),
        "{rows:?}"
    );
    for v in [r[1], r[4]] {
        let x: f64 = v.parse().expect("a number");
        assert!(x > 0.0, "{rows:?}");
    }
}
