//! A Linux guest with rdma_rxe (`deploy/linux-peer`): booted on demand,
//! powered off and its network namespace deleted on drop, panics included.
//! The guest runs the host's userland (its root is the host's, read-only),
//! so a binary built here runs there at the same path.
//!
//! The real-peer rule: without root or the tools the script needs, a test
//! fails under `RPCRDMA_REQUIRE_PEERS=1` and otherwise prints
//! `skipped: ...` and passes.
//!
//! The daemon's tests include this file too (`control/tests/linux_peer.rs`,
//! by path): one guest lifecycle for both crates.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The guest's address; rxe0 runs on its NIC.
pub const GUEST_IP: &str = "198.18.0.2";

/// What `deploy/linux-peer up` runs or needs on the host (and, through the
/// shared root, in the guest).
const TOOLS: [&str; 9] = [
    "qemu-system-x86_64",
    "busybox",
    "rdma",
    "ip",
    "depmod",
    "rpc.nfsd",
    "rpc.mountd",
    "exportfs",
    "rpcbind",
];

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/linux-peer")
}

fn find_tool(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Fails under `RPCRDMA_REQUIRE_PEERS=1`, else says `skipped: WHY`.
fn skip(why: &str) {
    if std::env::var("RPCRDMA_REQUIRE_PEERS").as_deref() == Ok("1") {
        panic!("{why} and RPCRDMA_REQUIRE_PEERS=1");
    }
    println!("skipped: {why}");
}

/// A booted guest.
pub struct Guest {
    dir: PathBuf,
    /// The network namespace of the host's side of its link.
    netns: String,
}

impl Guest {
    /// Boots one (the script's own deadline, 300 s, turns a hung boot into
    /// a failure); `None` after the skip line when it cannot be booted here.
    pub fn boot(name: &str) -> Option<Guest> {
        if !nix::unistd::geteuid().is_root() {
            skip("root not available (the guest needs a network namespace, a tap and qemu)");
            return None;
        }
        for tool in TOOLS {
            if find_tool(tool).is_none() {
                skip(&format!("{tool} not installed (see deploy/linux-peer)"));
                return None;
            }
        }
        let dir = std::env::temp_dir().join(format!("rpcrdma-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Owned from here: a failed boot is still powered off on drop.
        let mut guest = Guest {
            dir,
            netns: String::new(),
        };
        let out = Command::new(script())
            .arg("up")
            .arg(&guest.dir)
            .output()
            .expect("run deploy/linux-peer up");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("{stderr}");
        let netns = stdout.lines().find_map(|l| l.strip_prefix("netns "));
        assert!(
            out.status.success() && netns.is_some(),
            "deploy/linux-peer up failed: {stdout}{stderr}"
        );
        guest.netns = netns.unwrap_or_default().to_owned();
        Some(guest)
    }

    /// Its state directory (captures may go there; kept when a test fails).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The name of the host side's network namespace (`ip netns exec`).
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// Runs the shell command `cmd` in the guest; its exit status and its
    /// output (stdout and stderr). Waiting longer than `deadline` means
    /// the command is stuck: the script gives up and this panics.
    pub fn run(&self, cmd: &str, deadline: Duration) -> (bool, String) {
        let out = Command::new(script())
            .env("LINUX_PEER_RUN_DEADLINE", deadline.as_secs().to_string())
            .arg("run")
            .arg(&self.dir)
            .arg("--")
            .arg(cmd)
            .output()
            .expect("run deploy/linux-peer run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("did not finish in the guest") && !stderr.contains("not running"),
            "guest: {cmd}: {stderr}"
        );
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // What the guest's RDMA stack thinks, for the failure report.
            let out = Command::new(script())
                .arg("run")
                .arg(&self.dir)
                .arg("--")
                .arg("dmesg | tail -20; rdma statistic show link rxe0/1; rdma resource show qp")
                .output();
            if let Ok(o) = out {
                eprintln!("guest state:\n{}", String::from_utf8_lossy(&o.stdout));
            }
        }
        let _ = Command::new(script()).arg("down").arg(&self.dir).status();
        // A failed run keeps the guest's console and any capture.
        if std::thread::panicking() || std::env::var_os("KEEP_LINUX_PEER").is_some() {
            eprintln!("kept: {} (console.log, captures)", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
