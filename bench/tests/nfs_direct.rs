//! The `nfs` subcommand's client against a real NFS server: nfs-ganesha
//! in namespaces of its own (`dataplane/tests/support/ganesha.rs`).
//! MOUNT's port from rpcbind, MNT, LOOKUP, then one short READ point and
//! one short WRITE point (UNSTABLE, COMMIT) over TCP straight, pipelined
//! at depth 4: every call answered, the written bytes on disk. The RDMA
//! half (through the gateway daemon) runs in `deploy/nfs-bench`. Never a
//! statement about speed.
//!
//! Needs root, nfs-ganesha, nfs-ganesha-vfs, rpcbind, iproute2 and
//! util-linux; the real-peer rule applies.
#[path = "../../dataplane/tests/support/ganesha.rs"]
mod ganesha;

use std::time::Duration;

use bench::nfs::{self, Files, NfsOp, NfsTransport, PointSpec, TcpNfs};
use bench::transport::Idle;
use ganesha::GaneshaBackend;

const MIB: usize = 1 << 20;

#[test]
fn read_and_write_points_over_tcp_against_ganesha() {
    let Some(backend) = GaneshaBackend::start("bench-nfs") else {
        return;
    };
    let export = backend.export_dir();
    let content: Vec<u8> = (0..2 * MIB).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(export.join("read-file"), &content).unwrap();
    std::fs::write(export.join("write-file"), b"").unwrap();
    let path = backend.export_path();
    let nfs_addr = backend.nfs_addr();
    let mut data = vec![0u8; nfs::MAX_IO as usize];
    dataplane::service::bench::fill_pattern(&mut data);
    let size = 64 << 10;

    let points = backend.in_netns(|| {
        let mount_addr = nfs::mount_addr("rpcbind://127.0.0.1").expect("MOUNT from rpcbind");
        assert_eq!(mount_addr, backend.mount_addr());
        let mut m = TcpNfs::connect("tcp", mount_addr).unwrap();
        let root = nfs::mount(&mut m, &path).expect("MNT");
        Box::new(m).close().unwrap();
        let mut t = TcpNfs::connect("tcp", nfs_addr).unwrap();
        let (read, read_size) = nfs::lookup(&mut t, &root, "read-file").unwrap();
        assert_eq!(read_size, 2 * MIB as u64);
        let (write, _) = nfs::lookup(&mut t, &root, "write-file").unwrap();
        assert!(nfs::lookup(&mut t, &root, "missing").is_err());
        let files = Files {
            read,
            read_size,
            write,
            write_span: read_size,
        };
        let mut points = Vec::new();
        for op in [NfsOp::Read, NfsOp::Write] {
            let spec = PointSpec {
                op,
                size,
                depth: 4,
                duration: Duration::from_millis(100),
                idle: Idle::Adaptive,
            };
            let p = nfs::run_point(&mut t, &files, &spec, &data, None, None)
                .unwrap_or_else(|e| panic!("{op:?} point: {e}"));
            points.push(p);
        }
        Box::new(t).close().unwrap();
        points
    });
    for p in &points {
        assert!(p.calls > 0, "{p:?}");
        assert_eq!(p.bytes, p.calls * size as u64, "{p:?}");
        assert!(p.mb_per_s > 0.0 && p.client_s_per_gb >= 0.0, "{p:?}");
    }
    // The WRITE point wrote the pattern from offset 0 on, wrapping at
    // 2 MiB: what is on disk is the pattern's first 64 KiB, repeated.
    let written = std::fs::read(export.join("write-file")).unwrap();
    let expect = (points[1].calls as usize * size as usize).min(2 * MIB);
    assert_eq!(written.len(), expect);
    for chunk in written.chunks(size as usize) {
        assert!(chunk == &data[..chunk.len()], "written bytes differ");
    }
}
