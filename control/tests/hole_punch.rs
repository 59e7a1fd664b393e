//! A peer punches holes in hugepage memory a running `rpcrdmad` writes,
//! while the daemon cannot get a hugepage: the daemon's copy into the
//! hole takes SIGBUS, the guard (docs/VERBS.md, "Known gaps") replaces the
//! page, the attacking connection ends and is counted
//! `peer_memory_fault`, and a good client keeps being served.
//!
//! The pool is exhausted for the daemon alone: it is moved into a cgroup
//! v2 of its own whose `hugetlb.2MB.max` is 0 once every connection's
//! memory is in place, so no other process loses a hugepage. Its own
//! binary, so that the fds it punches can only be the attacker's.
mod support;

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

use dataplane::client::{CallOutcome, Client, ReplyTarget};
use dataplane::service::bench::{self, Args};
use dataplane::verbs::shm::Shm;
use support::bench_calls::*;
use support::*;

/// Hugepages the daemon takes at its defaults with one core (its bulk
/// pool and shared receives) plus the connections', with room.
const HUGEPAGES_NEEDED: u64 = 64;

fn free_hugepages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("HugePages_Free:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// The cgroup v2 root with the hugetlb controller handed to children.
fn hugetlb_cgroup_root() -> Option<PathBuf> {
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(PathBuf::from)
        .find(|root| {
            std::fs::read_to_string(root.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "hugetlb"))
                && std::fs::write(root.join("cgroup.subtree_control"), "+hugetlb").is_ok()
        })
}

/// A cgroup of its own for the daemon, removed on drop (after the daemon
/// is moved back to the root).
struct Cgroup {
    root: PathBuf,
    dir: PathBuf,
}

impl Cgroup {
    fn new(root: &Path) -> Cgroup {
        let dir = root.join(format!("rpcrdma-hole-punch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the test cgroup");
        Cgroup {
            root: root.to_path_buf(),
            dir,
        }
    }

    /// No hugepage may be faulted in by `pid` from now on.
    fn starve(&self, pid: u32) {
        std::fs::write(self.dir.join("hugetlb.2MB.max"), "0").expect("hugetlb.2MB.max");
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("move the daemon");
    }

    fn release(&self, pid: u32) {
        let _ = std::fs::write(self.root.join("cgroup.procs"), pid.to_string());
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// This process's open fds.
fn open_fds() -> Vec<i32> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Punches the whole of every hugetlbfs memfd among `fds`; returns how
/// many let it (memory sealed read-only refuses, as it should).
fn punch_hugetlb_memfds(fds: &[i32]) -> usize {
    use nix::fcntl::{fallocate, FallocateFlags};
    let mut punched = 0;
    for &fd in fds {
        let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap_or_default();
        if !link.to_string_lossy().contains("memfd:") {
            continue;
        }
        // SAFETY: the fd is open for the rest of this function (its owner,
        // a client of this test, is alive).
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let huge = nix::sys::statfs::fstatfs(fd)
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::HUGETLBFS_MAGIC);
        let len = nix::sys::stat::fstat(fd).map_or(0, |s| s.st_size);
        if !huge || len == 0 {
            continue;
        }
        let how = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
        if fallocate(fd, how, 0, len).is_ok() {
            punched += 1;
        }
    }
    punched
}

#[test]
fn a_peer_punching_hugepage_memory_costs_only_its_connection() {
    if free_hugepages() < HUGEPAGES_NEEDED {
        skip(&format!(
            "fewer than {HUGEPAGES_NEEDED} free 2 MiB hugepages"
        ));
        return;
    }
    let Some(root) = hugetlb_cgroup_root() else {
        skip("no cgroup v2 hugetlb controller to exhaust the daemon's hugepages with");
        return;
    };
    let cgroup = Cgroup::new(&root);
    let dir = scratch_dir("hole-punch");
    let url = format!("shm://{}/d.sock", dir.display());
    let metrics: SocketAddr = "127.0.0.1:19496".parse().unwrap();
    let cfg = write_file(
        &dir,
        "hole-punch.toml",
        &format!(
            "[[listeners]]\nurl = \"{url}\"\n\n[workers]\ncores = [0]\nidle = \"adaptive\"\n\n\
             [memory]\nhugepages = \"required\"\n\n\
             [metrics]\naddress = \"{metrics}\"\n\n[rpcbind]\nregister = false\n"
        ),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");
    let pid = d.child.id();

    let mut good = Client::<Shm>::connect(&url, client_config(1 << 20, 4)).expect("good client");
    simple_call(&mut good, Args::Null, ReplyTarget::Inline);
    // The attacker's fds are the ones its connect opens: its own arenas
    // and the daemon's memory it was handed.
    let before = open_fds();
    let mut attacker =
        Client::<Shm>::connect(&url, client_config(1 << 20, 4)).expect("attacker connects");
    simple_call(&mut attacker, Args::Null, ReplyTarget::Inline);
    let theirs: Vec<i32> = open_fds()
        .into_iter()
        .filter(|fd| !before.contains(fd))
        .collect();

    // Every connection's memory is in place: from now on the daemon gets
    // no hugepage, and the attacker punches every hugepage memfd it can.
    cgroup.starve(pid);
    let punched = punch_hugetlb_memfds(&theirs);
    if punched == 0 {
        cgroup.release(pid);
        d.stop_cleanly();
        skip("the attacker's connection has no hugepage memory to punch");
        return;
    }
    // The daemon's reply lands in a punched receive buffer of the
    // attacker: SIGBUS there, which the guard turns into the end of this
    // connection.
    let call = attacker.call(ReplyTarget::Inline, |xid, buf| {
        bench::encode_call(buf, xid, Args::Null)
            .ok()
            .map(|e| (e.len, e.ddp))
    });
    let outcome = call.map_err(|e| e.to_string()).and_then(|c| {
        attacker
            .wait(c)
            .map_err(|e| e.to_string())
            .and_then(|o| match o {
                CallOutcome::Reply { .. } => Err("answered".to_string()),
                other => Ok(format!("{other:?}")),
            })
    });
    let body = scrape_until(metrics, "rpcrdma_listener_rejected_total", 1);
    assert_eq!(rejected(&body, "peer_memory_fault"), 1, "{body}");
    assert!(
        outcome.as_ref().err().is_none_or(|e| e != "answered"),
        "the attacker's call was answered from a punched page"
    );
    // The daemon lives on and serves the good client.
    assert!(d.child.try_wait().unwrap().is_none(), "the daemon died");
    for _ in 0..10 {
        simple_call(&mut good, Args::Null, ReplyTarget::Inline);
    }
    assert!(
        d.stderr().contains("punched a hole"),
        "no log line for the fault:\n{}",
        d.stderr()
    );
    drop(attacker);
    good.close().expect("close");
    cgroup.release(pid);
    d.stop_cleanly();
    drop(cgroup);
    let _ = std::fs::remove_dir_all(dir);
}
