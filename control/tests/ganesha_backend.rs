//! `rpcrdmad` beside an nfs-ganesha backend, in the backend's namespaces
//! (`dataplane/tests/support/ganesha.rs`, shared by path): the way the
//! storage gateway's tests will run it.
//!
//! * `rpcrdmad_registers_with_the_backends_rpcbind`: the daemon, started
//!   through `GaneshaBackend::command`, reaches the backend's private
//!   rpcbind through its local socket (`/run/rpcbind.sock` of the
//!   backend's mount namespace), registers its TCP listener there next to
//!   ganesha's NFS and MOUNT, and unregisters on SIGTERM; ganesha's
//!   registrations stay.
//!
//! Needs root, nfs-ganesha, nfs-ganesha-vfs, rpcbind, iproute2 and
//! util-linux; the real-peer rule applies.
#[path = "../../dataplane/tests/support/ganesha.rs"]
mod ganesha;
mod support;

use std::net::SocketAddr;

use control::programs::{BENCH_PROG, BENCH_VERS};
use control::rpcbind::{Mapping, RpcbindAddress, RpcbindClient};
use ganesha::GaneshaBackend;
use nix::sys::signal::Signal;
use support::*;

const NFS_PROGRAM: u32 = 100_003;
const MOUNT_PROGRAM: u32 = 100_005;

/// rpcbind's table, read over TCP from inside the backend's namespace.
fn dump(backend: &GaneshaBackend) -> Vec<(u32, u32, String)> {
    let addr: SocketAddr = "127.0.0.1:111".parse().unwrap();
    backend.in_netns(move || {
        let mut c =
            RpcbindClient::connect(&RpcbindAddress::Tcp(addr), PATIENCE).expect("reach rpcbind");
        c.dump()
            .expect("DUMP")
            .into_iter()
            .map(|m: Mapping| (m.program, m.version, m.netid))
            .collect()
    })
}

fn has(rows: &[(u32, u32, String)], prog: u32, vers: u32, netid: &str) -> bool {
    rows.iter()
        .any(|r| r.0 == prog && r.1 == vers && r.2 == netid)
}

#[test]
fn rpcrdmad_registers_with_the_backends_rpcbind() {
    let Some(backend) = GaneshaBackend::start("rpcrdmad") else {
        return;
    };
    let dir = scratch_dir("ganesha-backend");
    let cfg = write_file(
        &dir,
        "gateway.toml",
        "[[listeners]]\nurl = \"tcp://127.0.0.1:20050\"\n\n\
         [workers]\ncores = [0]\nidle = \"adaptive\"\n\n\
         [rpcbind]\nregister = true\naddress = \"/run/rpcbind.sock\"\n\n\
         [metrics]\nenabled = false\n",
    );
    let mut cmd = backend.command(BIN);
    cmd.arg("--config").arg(&cfg);
    let mut d = Daemon::spawn_command(cmd);
    d.wait_for_line("started");

    let rows = dump(&backend);
    for (prog, vers) in [
        (NFS_PROGRAM, 3),
        (MOUNT_PROGRAM, 3),
        (BENCH_PROG, BENCH_VERS),
    ] {
        assert!(
            has(&rows, prog, vers, "tcp"),
            "no {prog} v{vers} tcp in {rows:?}"
        );
    }

    d.signal(Signal::SIGTERM);
    let status = d.wait();
    assert_eq!(status.code(), Some(0), "stderr:\n{}", d.stderr());
    assert!(
        d.stderr().contains("rpcbind: unregistered"),
        "{}",
        d.stderr()
    );
    let rows = dump(&backend);
    assert!(!has(&rows, BENCH_PROG, BENCH_VERS, "tcp"), "{rows:?}");
    assert!(has(&rows, NFS_PROGRAM, 3, "tcp"), "{rows:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
