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
    // rpcbind: running, or the plan to start it, or why it cannot be.
    assert!(
        text.contains("rpcbind: unchanged (running, pid ")
            || text.contains("would start rpcbind (")
            || text.contains("rpcbind: not installed, not started"),
        "{text}"
    );
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

/// Where no rpcbind runs, setup-host starts one, and a second run leaves
/// it alone. Played in namespaces of its own (pid, mount with a private
/// tmpfs on /run, network), so the host's rpcbind is neither seen nor
/// touched; the namespace's rpcbind ends with its pid namespace.
#[test]
fn setup_host_starts_rpcbind_once() {
    let (Some(unshare), Some(_)) = (require_peer("unshare"), require_peer("rpcbind")) else {
        return;
    };
    let script = std::fs::canonicalize("../deploy/setup-host").unwrap();
    let inner = format!(
        "mount -t tmpfs tmpfs /run && \
         bash {s} --no-packages --hugepages 0 && echo --- && \
         bash {s} --no-packages --hugepages 0",
        s = script.display()
    );
    let out = Command::new(unshare)
        .args([
            "--pid",
            "--fork",
            "--mount-proc",
            "--net",
            "sh",
            "-c",
            &inner,
        ])
        .output()
        .expect("run unshare");
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && !text.contains("setup-host:") {
        let why = format!("cannot create namespaces ({})", err.trim());
        assert!(
            std::env::var("RPCRDMA_REQUIRE_PEERS").as_deref() != Ok("1"),
            "{why} and RPCRDMA_REQUIRE_PEERS=1"
        );
        println!("skipped: {why}");
        return;
    }
    assert!(out.status.success(), "{text}{err}");
    let (first, second) = text.split_once("---\n").expect("two runs");
    // PID 1 of the namespace is sh, not systemd: rpcbind is run directly.
    assert!(
        first.contains("setup-host: rpcbind: started (") && first.contains("rpcbind -w)"),
        "{first}"
    );
    assert!(
        second.contains("setup-host: rpcbind: unchanged (running, pid "),
        "{second}"
    );
}
