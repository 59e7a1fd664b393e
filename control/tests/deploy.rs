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
