//! Our NFSv3 and MOUNT v3 codecs (`dataplane::nfs`) against a real NFS
//! server: nfs-ganesha with the VFS FSAL ([`GaneshaBackend`]), over plain
//! ONC RPC on TCP (record marking), in a namespace of the test's own.
//!
//! * `nfs3_session_against_ganesha`: MNT of the export; FSINFO for the
//!   server's rtmax and wtmax (1 MiB, the harness's setting); LOOKUP and
//!   READ (in rtmax chunks until eof) of files of 0, 1, 4096 and
//!   1 MiB + 3 bytes the test wrote into the export, byte-exact; CREATE,
//!   WRITE (wtmax chunks, UNSTABLE) and COMMIT of a 1 MiB + 3 file,
//!   checked byte-exact on disk; READDIRPLUS
//!   of a 2,000-entry directory following cookies until eof, every name
//!   seen exactly once; SYMLINK and READLINK, checked on disk too; UMNT;
//!   NFSACL v3 (program 100227) served on the NFS port though rpcbind
//!   does not map it.
//! * `ganesha_backend_kill_and_restart`: the harness itself: after
//!   `kill()` nothing answers on the NFS port, after `restart()` a new
//!   ganesha serves the same export; the backend's `/run` (rpcbind's
//!   socket) is not the host's; a process from `command()` reaches the
//!   backend's rpcbind.
//!
//! FSINFO and CREATE have no codec in `dataplane::nfs`: their XDR is
//! written here by hand (RFC 1813 s3.3.19, s3.3.8).
//!
//! Needs root, nfs-ganesha, nfs-ganesha-vfs, rpcbind, iproute2 and
//! util-linux; the real-peer rule applies (`skipped: ...` or, under
//! `RPCRDMA_REQUIRE_PEERS=1`, a failure).
mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;

use dataplane::nfs::{
    decode_mount_reply, decode_reply, encode_call, encode_mount_call, Commit3Args, DirOpArgs3,
    DirPath, Fattr3, FileHandle, Filename, Ftype3, Lookup3Args, MntRes3, MountArgs, MountProc,
    MountRes, Nfs3Args, Nfs3Proc, Nfs3Res, NfsPath, Read3Args, Readdirplus3Args, Readlink3Args,
    Res3, Sattr3, StableHow, Symlink3Args, Write3Args, Xdr, NFS_PROGRAM, NFS_V3,
};
use dataplane::wire::rpc::{AuthSys, CallHeader, OpaqueAuth};
use dataplane::wire::xdr::{Decoder, Encoder};
use support::ganesha::{success_results, GaneshaBackend, RpcTcp, MAX_IO, RPCBIND_PORT};

const MIB: usize = 1 << 20;
/// The sizes of the files read back.
const READ_SIZES: [usize; 4] = [0, 1, 4096, MIB + 3];
/// Entries of the READDIRPLUS directory.
const DIR_ENTRIES: usize = 2000;
/// READDIRPLUS limits: small enough that the directory takes many calls.
const RDP_DIRCOUNT: u32 = 8192;
const RDP_MAXCOUNT: u32 = 32768;
const SYMLINK_TARGET: &[u8] = b"../somewhere/else with spaces";
/// NFSACL, the side program for POSIX ACLs that the Linux NFSv3 client
/// calls on the NFS server's port.
const NFSACL_PROGRAM: u32 = 100_227;

/// Root, as `No_Root_Squash` lets it create files.
fn cred() -> OpaqueAuth<'static> {
    OpaqueAuth::Sys(AuthSys::new(0, b"rpcrdma-test", 0, 0, &[0]).unwrap())
}

/// Distinct bytes for each file (offset and a per-file seed).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ seed)
        .collect()
}

/// An NFSv3 client over one TCP connection, on our codecs.
struct Nfs {
    rpc: RpcTcp,
    buf: Vec<u8>,
}

impl Nfs {
    fn connect(addr: SocketAddr) -> Nfs {
        Nfs {
            rpc: RpcTcp::connect(addr).expect("connect to ganesha's NFS port"),
            buf: vec![0u8; 2 * MIB],
        }
    }

    /// Calls `args` and hands the decoded results to `f`.
    fn call<T>(&mut self, args: &Nfs3Args<'_>, f: impl FnOnce(Nfs3Res<'_>) -> T) -> T {
        let xid = self.rpc.xid();
        let enc = encode_call(&mut self.buf, xid, cred(), args).expect("encode the call");
        let reply = self
            .rpc
            .call(&self.buf[..enc.len])
            .unwrap_or_else(|e| panic!("{:?}: {e}", args.procedure()));
        let res = decode_reply(args.procedure(), &reply, None)
            .unwrap_or_else(|e| panic!("{:?} reply: {e}", args.procedure()));
        f(res)
    }

    /// A call with hand-written arguments (procedures without a codec):
    /// the results of its successful reply.
    fn call_raw(&mut self, proc_: Nfs3Proc, args: impl FnOnce(&mut Encoder<'_>)) -> Vec<u8> {
        let xid = self.rpc.xid();
        let mut e = Encoder::new(&mut self.buf);
        CallHeader::new(
            xid,
            NFS_PROGRAM,
            NFS_V3,
            proc_.to_wire(),
            cred(),
            OpaqueAuth::None,
        )
        .emit(&mut e)
        .unwrap();
        args(&mut e);
        let len = e.position();
        let reply = self
            .rpc
            .call(&self.buf[..len])
            .unwrap_or_else(|e| panic!("{proc_:?}: {e}"));
        success_results(&reply)
            .unwrap_or_else(|e| panic!("{proc_:?}: {e}"))
            .to_vec()
    }

    /// FSINFO (no codec: RFC 1813 s3.3.19 by hand): (rtmax, wtmax).
    fn fsinfo(&mut self, root: &[u8]) -> (u32, u32) {
        let res = self.call_raw(Nfs3Proc::Fsinfo, |e| e.put_opaque(root).unwrap());
        let mut d = Decoder::new(&res);
        assert_eq!(d.get_u32().unwrap(), 0, "FSINFO status");
        let _attrs = Option::<Fattr3>::decode(&mut d, None).expect("FSINFO attributes");
        // rtmax, rtpref, rtmult, wtmax, wtpref, wtmult, dtpref
        let w: Vec<u32> = (0..7).map(|_| d.get_u32().unwrap()).collect();
        let _maxfilesize = d.get_u64().unwrap();
        let _time_delta = (d.get_u32().unwrap(), d.get_u32().unwrap());
        let _properties = d.get_u32().unwrap();
        d.finish().expect("FSINFO result length");
        (w[0], w[3])
    }

    /// CREATE (no codec: RFC 1813 s3.3.8 by hand), UNCHECKED, mode 0644:
    /// the new file's handle.
    fn create(&mut self, dir: &[u8], name: &str) -> Vec<u8> {
        let res = self.call_raw(Nfs3Proc::Create, |e| {
            e.put_opaque(dir).unwrap();
            e.put_opaque(name.as_bytes()).unwrap();
            e.put_u32(0).unwrap(); // createmode3 UNCHECKED
            Sattr3 {
                mode: Some(0o644),
                ..Sattr3::default()
            }
            .emit(e)
            .unwrap();
        });
        let mut d = Decoder::new(&res);
        assert_eq!(d.get_u32().unwrap(), 0, "CREATE status");
        let fh = Option::<FileHandle<'_>>::decode(&mut d, None)
            .unwrap()
            .expect("CREATE returns the handle (post_op_fh3)");
        fh.as_bytes().to_vec()
    }

    /// LOOKUP: the handle and attributes of `name` in `dir`.
    fn lookup(&mut self, dir: &[u8], name: &str) -> (Vec<u8>, Fattr3) {
        let args = Nfs3Args::Lookup(Lookup3Args {
            what: dirop(dir, name),
        });
        self.call(&args, |res| match res {
            Nfs3Res::Lookup(Res3::Ok(ok)) => (
                ok.object.as_bytes().to_vec(),
                ok.obj_attributes.expect("LOOKUP attributes"),
            ),
            other => panic!("LOOKUP {name}: {other:?}"),
        })
    }

    /// READ of the whole file in `chunk`-byte calls until eof; the data
    /// and how many READs it took.
    fn read_all(&mut self, fh: &[u8], chunk: u32, expect_len: usize) -> (Vec<u8>, usize) {
        let mut data = Vec::with_capacity(expect_len);
        let most_calls = expect_len / chunk as usize + 2;
        for calls in 1..=most_calls {
            let args = Nfs3Args::Read(Read3Args {
                file: FileHandle::new(fh).unwrap(),
                offset: data.len() as u64,
                count: chunk,
            });
            let eof = self.call(&args, |res| match res {
                Nfs3Res::Read(Res3::Ok(ok)) => {
                    assert_eq!(ok.count as usize, ok.data.len(), "READ count");
                    assert!(ok.data.len() <= chunk as usize, "READ over count");
                    data.extend_from_slice(ok.data);
                    ok.eof
                }
                other => panic!("READ: {other:?}"),
            });
            if eof {
                return (data, calls);
            }
        }
        panic!("no eof after {most_calls} READs of a {expect_len}-byte file");
    }
}

fn dirop<'a>(dir: &'a [u8], name: &'a str) -> DirOpArgs3<'a> {
    DirOpArgs3 {
        dir: FileHandle::new(dir).unwrap(),
        name: Filename::new(name.as_bytes()).unwrap(),
    }
}

/// MNT of `path` over MOUNT v3: the export's root handle.
fn mount(addr: SocketAddr, path: &str) -> Vec<u8> {
    let mut rpc = RpcTcp::connect(addr).expect("connect to ganesha's MOUNT port");
    let mut buf = vec![0u8; 4096];
    let args = MountArgs::Mnt(DirPath::new(path.as_bytes()).unwrap());
    let enc = encode_mount_call(&mut buf, rpc.xid(), cred(), &args).unwrap();
    let reply = rpc.call(&buf[..enc.len]).expect("MNT");
    match decode_mount_reply(MountProc::Mnt, &reply).expect("MNT reply") {
        MountRes::Mnt(MntRes3::Ok(ok)) => {
            assert!(
                ok.auth_flavors().contains(&1),
                "AUTH_SYS offered: {:?}",
                ok.auth_flavors()
            );
            ok.fhandle().as_bytes().to_vec()
        }
        other => panic!("MNT {path}: {other:?}"),
    }
}

fn umount(addr: SocketAddr, path: &str) {
    let mut rpc = RpcTcp::connect(addr).expect("connect to ganesha's MOUNT port");
    let mut buf = vec![0u8; 4096];
    let args = MountArgs::Umnt(DirPath::new(path.as_bytes()).unwrap());
    let enc = encode_mount_call(&mut buf, rpc.xid(), cred(), &args).unwrap();
    let reply = rpc.call(&buf[..enc.len]).expect("UMNT");
    assert_eq!(
        decode_mount_reply(MountProc::Umnt, &reply).expect("UMNT reply"),
        MountRes::Umnt(())
    );
}

#[test]
fn nfs3_session_against_ganesha() {
    let Some(backend) = GaneshaBackend::start("nfs3") else {
        return;
    };
    let export = backend.export_dir();
    for (i, size) in READ_SIZES.into_iter().enumerate() {
        std::fs::write(export.join(format!("read-{size}")), pattern(size, i as u8)).unwrap();
    }
    std::fs::create_dir(export.join("many")).unwrap();
    for i in 0..DIR_ENTRIES {
        std::fs::write(export.join(format!("many/entry-{i:04}")), b"").unwrap();
    }
    let path = backend.export_path();
    let (nfs_addr, mount_addr) = (backend.nfs_addr(), backend.mount_addr());
    let rpcbind = SocketAddr::from(([127, 0, 0, 1], RPCBIND_PORT));

    let written = pattern(MIB + 3, 0xa5);
    let to_write = written.clone();
    backend.in_netns(move || {
        let root = mount(mount_addr, &path);
        let mut nfs = Nfs::connect(nfs_addr);
        let (rtmax, wtmax) = nfs.fsinfo(&root);
        // NFSACL v3 (which the Linux NFSv3 client calls on the NFS port):
        // served there, though not registered with rpcbind. GETACL
        // (procedure 1: the handle and a mask) is by hand.
        nfs.rpc.null(NFSACL_PROGRAM, 3).expect("NFSACL v3 NULL");
        let mut getacl = vec![0u8; 4 + root.len().next_multiple_of(4) + 4];
        let mut e = Encoder::new(&mut getacl);
        e.put_opaque(&root).unwrap();
        e.put_u32(0xf).unwrap(); // NA_ACL | NA_ACLCNT | NA_DFACL | NA_DFACLCNT
        let res = nfs
            .rpc
            .call_raw(NFSACL_PROGRAM, 3, 1, &getacl)
            .expect("GETACL");
        assert_eq!(res.get(..4), Some(&[0u8; 4][..]), "GETACL status");
        let mut pmap = RpcTcp::connect(rpcbind).expect("connect to rpcbind");
        assert_eq!(
            pmap.getport(NFSACL_PROGRAM, 3, 6),
            Ok(0),
            "NFSACL in rpcbind"
        );

        // The harness's MaxRead/MaxWrite: a 1 MiB + 3 file takes two.
        assert_eq!((rtmax, wtmax), (MAX_IO, MAX_IO), "FSINFO rtmax, wtmax");

        // LOOKUP and READ, byte-exact.
        for (i, size) in READ_SIZES.into_iter().enumerate() {
            let (fh, attrs) = nfs.lookup(&root, &format!("read-{size}"));
            assert_eq!(attrs.ftype, Ftype3::Reg);
            assert_eq!(attrs.size, size as u64, "size of read-{size}");
            let (data, calls) = nfs.read_all(&fh, rtmax, size);
            assert!(
                data == pattern(size, i as u8),
                "read-{size}: content differs"
            );
            // At least one READ, the last with eof (a server may also
            // need one more, empty, to say eof).
            let least = size.div_ceil(rtmax as usize).max(1);
            assert!(
                calls == least || calls == least + 1,
                "read-{size}: {calls} READs of {rtmax}"
            );
        }

        // CREATE, WRITE (UNSTABLE, wtmax at a time), COMMIT.
        let fh = nfs.create(&root, "written");
        let mut verf = None;
        assert_eq!(to_write.chunks(wtmax as usize).len(), 2, "WRITEs");
        for (n, chunk) in to_write.chunks(wtmax as usize).enumerate() {
            let args = Nfs3Args::Write(Write3Args::new(
                FileHandle::new(&fh).unwrap(),
                (n * wtmax as usize) as u64,
                StableHow::Unstable,
                chunk,
            ));
            let v = nfs.call(&args, |res| match res {
                Nfs3Res::Write(Res3::Ok(ok)) => {
                    assert_eq!(ok.count as usize, chunk.len(), "WRITE count");
                    ok.verf
                }
                other => panic!("WRITE: {other:?}"),
            });
            assert_eq!(*verf.get_or_insert(v), v, "write verifier changed");
        }
        let args = Nfs3Args::Commit(Commit3Args {
            file: FileHandle::new(&fh).unwrap(),
            offset: 0,
            count: 0,
        });
        let commit_verf = nfs.call(&args, |res| match res {
            Nfs3Res::Commit(Res3::Ok(ok)) => ok.verf,
            other => panic!("COMMIT: {other:?}"),
        });
        assert_eq!(Some(commit_verf), verf, "COMMIT verifier");

        // READDIRPLUS of 2,000 entries, cookie after cookie.
        let (dir, _) = nfs.lookup(&root, "many");
        let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
        let (mut cookie, mut cookieverf, mut calls) = (0u64, [0u8; 8], 0usize);
        loop {
            calls += 1;
            assert!(calls <= DIR_ENTRIES + 2, "READDIRPLUS never reached eof");
            let args = Nfs3Args::Readdirplus(Readdirplus3Args {
                dir: FileHandle::new(&dir).unwrap(),
                cookie,
                cookieverf,
                dircount: RDP_DIRCOUNT,
                maxcount: RDP_MAXCOUNT,
            });
            let eof = nfs.call(&args, |res| match res {
                Nfs3Res::Readdirplus(Res3::Ok(ok)) => {
                    cookieverf = ok.cookieverf;
                    let before = cookie;
                    for entry in ok.reply.entries.iter() {
                        let name = entry.name.as_bytes();
                        if name != b"." && name != b".." {
                            assert!(entry.name_handle.is_some(), "no handle for {name:?}");
                        }
                        *seen.entry(name.to_vec()).or_default() += 1;
                        cookie = entry.cookie;
                    }
                    assert!(
                        ok.reply.eof || cookie != before,
                        "a READDIRPLUS reply without entries and without eof"
                    );
                    ok.reply.eof
                }
                other => panic!("READDIRPLUS: {other:?}"),
            });
            if eof {
                break;
            }
        }
        seen.remove(&b"."[..]);
        seen.remove(&b".."[..]);
        let dups: Vec<_> = seen.iter().filter(|(_, &n)| n != 1).collect();
        assert!(dups.is_empty(), "names seen more than once: {dups:?}");
        assert_eq!(seen.len(), DIR_ENTRIES, "names in the directory");
        for i in 0..DIR_ENTRIES {
            assert!(seen.contains_key(format!("entry-{i:04}").as_bytes()));
        }
        assert!(
            calls > 1,
            "the directory fit one READDIRPLUS of {RDP_MAXCOUNT}"
        );
        println!("READDIRPLUS: {DIR_ENTRIES} entries in {calls} calls");

        // SYMLINK, READLINK.
        let args = Nfs3Args::Symlink(Symlink3Args {
            dirop: dirop(&root, "link"),
            symlink_attributes: Sattr3::default(),
            symlink_data: NfsPath::new(SYMLINK_TARGET).unwrap(),
        });
        let link = nfs.call(&args, |res| match res {
            Nfs3Res::Symlink(Res3::Ok(ok)) => ok.obj.map(|fh| fh.as_bytes().to_vec()),
            other => panic!("SYMLINK: {other:?}"),
        });
        let link = link.unwrap_or_else(|| nfs.lookup(&root, "link").0);
        let args = Nfs3Args::Readlink(Readlink3Args {
            symlink: FileHandle::new(&link).unwrap(),
        });
        nfs.call(&args, |res| match res {
            Nfs3Res::Readlink(Res3::Ok(ok)) => assert_eq!(ok.data.as_bytes(), SYMLINK_TARGET),
            other => panic!("READLINK: {other:?}"),
        });

        umount(mount_addr, &path);
    });

    // What the server did, as the file system has it.
    assert!(
        std::fs::read(export.join("written")).unwrap() == written,
        "the WRITE data on disk differ"
    );
    assert_eq!(
        std::fs::read_link(export.join("link")).unwrap().as_os_str(),
        std::ffi::OsStr::new(std::str::from_utf8(SYMLINK_TARGET).unwrap())
    );
}

#[test]
fn ganesha_backend_kill_and_restart() {
    let Some(mut backend) = GaneshaBackend::start("restart") else {
        return;
    };
    // The backend's /run is a file system of its own: its rpcbind socket
    // is not the host's.
    let private_run = format!("/proc/{}/root/run", backend.rpcbind_pid());
    let dev = |p: &str| std::fs::metadata(p).map(|m| m.dev()).unwrap();
    assert_ne!(
        dev(&private_run),
        dev("/run"),
        "the backend's /run is the host's"
    );
    assert!(std::path::Path::new(&format!("{private_run}/rpcbind.sock")).exists());

    std::fs::write(backend.export_dir().join("file"), b"still here").unwrap();
    let (path, nfs_addr, mount_addr) = (
        backend.export_path(),
        backend.nfs_addr(),
        backend.mount_addr(),
    );
    let read_file = move || {
        let root = mount(mount_addr, &path);
        let mut nfs = Nfs::connect(nfs_addr);
        let (fh, attrs) = nfs.lookup(&root, "file");
        nfs.read_all(&fh, 4096, attrs.size as usize).0
    };
    assert_eq!(backend.in_netns(read_file.clone()), b"still here");
    let first = backend.ganesha_pid().unwrap();

    backend.kill();
    assert_eq!(backend.ganesha_pid(), None);
    let refused = backend.in_netns(move || RpcTcp::connect(nfs_addr).err());
    assert_eq!(
        refused.map(|e| e.kind()),
        Some(std::io::ErrorKind::ConnectionRefused),
        "NFS port after kill()"
    );

    backend.restart();
    assert_eq!(backend.starts(), 2);
    assert_ne!(backend.ganesha_pid(), Some(first));
    assert_eq!(backend.in_netns(read_file), b"still here");
    // A process run through command() sees the backend's rpcbind.
    if let Some(rpcinfo) = ["/usr/sbin/rpcinfo", "/usr/bin/rpcinfo", "/sbin/rpcinfo"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
    {
        let out = backend
            .command(rpcinfo)
            .args(["-T", "tcp", "127.0.0.1", "100003", "3"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rpcinfo in the namespace: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
