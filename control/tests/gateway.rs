//! The storage gateway against a real NFS server: `rpcrdmad` with
//! `[[gateway]]` routes in front of nfs-ganesha (VFS FSAL), in the
//! backend's namespaces (`dataplane/tests/support/ganesha.rs`), and our
//! `dataplane::nfs` client over RPC-over-RDMA in front of it.
//!
//! * `nfs3_through_the_gateway_over_shm_and_roce`: MNT (routed to MOUNT,
//!   whose address the gateway asked of rpcbind), LOOKUP and READ of
//!   files of 0 B to 16 MiB (the data in the client's write chunk, RFC
//!   8267 s4), byte-exact and equal to what ganesha serves over TCP
//!   straight; WRITE (the data in a read chunk the gateway pulls) checked
//!   on disk; READDIRPLUS of 2,000 entries (long replies in the reply
//!   chunk); SYMLINK and READLINK; an NFSv4.0 COMPOUND with two READs
//!   (PUTROOTFH, LOOKUP, LOOKUP, READ, READ) and one write chunk: the
//!   first READ's data in the chunk, the second's in place (RFC 8267 s5,
//!   RFC 5666 s3.6); every call relayed, as the gateway's metrics count
//!   them.
//! * `killing_the_backend_costs_calls_not_connections`: ganesha is killed
//!   and restarted while a client reads a 32 MiB file through the gateway
//!   three times; the READs caught at the backend are sent again, every
//!   byte arrives, the clients' RDMA connections stay, and the lost
//!   backend connection is counted.
//! * `a_retransmitted_remove_is_answered_from_the_reply_cache`: a REMOVE
//!   runs, the client drops the connection (as if the reply were lost),
//!   reconnects and retransmits it under the same XID: the gateway's
//!   duplicate request cache answers NFS3_OK, where a second run at the
//!   backend would answer NFS3ERR_NOENT; the backend saw it once.
//! * `nfs3_through_the_gateway_with_the_extensions_negotiated`: a client
//!   and a gateway that both offer message continuation and send-based
//!   placement: 8 KiB WRITEs go with their data placed by Send (nothing
//!   pulled), 8 KiB READs come back written by RDMA (a write chunk, which
//!   costs no round trip), byte-exact on disk and read back.
//!
//! Needs root, nfs-ganesha, nfs-ganesha-vfs, rpcbind, iproute2 and
//! util-linux; the real-peer rule applies.
#[path = "../../dataplane/tests/support/ganesha.rs"]
mod ganesha;
mod support;

use std::collections::HashMap;
use std::net::SocketAddr;

use dataplane::client::{CallOutcome, Client, ReplyTarget};
use dataplane::nfs::{
    decode_mount_reply, decode_reply, encode_call, encode_mount_call, DirOpArgs3, DirPath,
    FileHandle, Filename, Ftype3, Lookup3Args, MntRes3, MountArgs, MountProc, MountRes, Nfs3Args,
    Nfs3Res, NfsPath, Read3Args, Readdirplus3Args, Readlink3Args, Res3, Sattr3, StableHow,
    Symlink3Args, Write3Args,
};
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;
use dataplane::verbs::Provider;
use dataplane::wire::rpc::{AuthSys, CallHeader, OpaqueAuth};
use dataplane::wire::xdr::Encoder;
use ganesha::{GaneshaBackend, RpcTcp, MAX_IO};
use nix::sys::signal::Signal;
use support::bench_calls::{client_config, reply_copies};
use support::*;

const MIB: usize = 1 << 20;
/// Files read through the gateway.
const READ_SIZES: [usize; 5] = [0, 1, 4096, MIB + 3, 16 * MIB];
const DIR_ENTRIES: usize = 2000;
const SYMLINK_TARGET: &[u8] = b"../over/the gateway";
/// The daemon's largest message: rtmax of data plus headers.
const MAX_MESSAGE: u32 = MAX_IO + 4096;

fn cred() -> OpaqueAuth<'static> {
    OpaqueAuth::Sys(AuthSys::new(0, b"rpcrdma-gateway-test", 0, 0, &[0]).unwrap())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[1] ^ seed)
        .collect()
}

/// An NFSv3 and MOUNT v3 client over RPC-over-RDMA, on our codecs.
struct NfsRdma<P: Provider> {
    client: Client<P>,
}

impl<P: Provider> NfsRdma<P> {
    fn connect(url: &str) -> NfsRdma<P> {
        Self::connect_offering(url, dataplane::engine::Extensions::EMPTY)
    }

    /// Connects offering `extensions` in CONF_RDMA version 2.
    fn connect_offering(url: &str, extensions: dataplane::engine::Extensions) -> NfsRdma<P> {
        let mut config = client_config(MAX_MESSAGE, 8);
        config.extensions = extensions;
        let client = Client::<P>::connect(url, config)
            .unwrap_or_else(|e| panic!("connect to the gateway at {url}: {e}"));
        NfsRdma { client }
    }

    /// One call: its reply message and the DDP data the server wrote.
    fn call_bytes(
        &mut self,
        target: ReplyTarget,
        encode: impl FnOnce(u32, &mut [u8]) -> Option<(usize, Option<dataplane::engine::DdpItem>)>,
    ) -> (Vec<u8>, Option<Vec<u8>>) {
        let call = self.client.call(target, encode).expect("send the call");
        match self.client.wait(call).expect("a reply") {
            CallOutcome::Reply { .. } => {}
            other => panic!("call failed: {other:?}"),
        }
        let copies = reply_copies(&self.client, call);
        assert!(self.client.release(call));
        copies
    }

    fn call<T>(
        &mut self,
        target: ReplyTarget,
        args: &Nfs3Args<'_>,
        f: impl FnOnce(Nfs3Res<'_>) -> T,
    ) -> T {
        let (msg, ddp) = self.call_bytes(target, |xid, buf| {
            let e = encode_call(buf, xid, cred(), args).ok()?;
            Some((e.len, e.ddp))
        });
        let res = decode_reply(args.procedure(), &msg, ddp.as_deref())
            .unwrap_or_else(|e| panic!("{:?} reply: {e}", args.procedure()));
        f(res)
    }

    fn mount(&mut self, path: &str) -> Vec<u8> {
        let args = MountArgs::Mnt(DirPath::new(path.as_bytes()).unwrap());
        let (msg, _) = self.call_bytes(ReplyTarget::Inline, |xid, buf| {
            Some((encode_mount_call(buf, xid, cred(), &args).ok()?.len, None))
        });
        match decode_mount_reply(MountProc::Mnt, &msg).expect("MNT reply") {
            MountRes::Mnt(MntRes3::Ok(ok)) => ok.fhandle().as_bytes().to_vec(),
            other => panic!("MNT {path}: {other:?}"),
        }
    }

    fn lookup(&mut self, dir: &[u8], name: &str) -> (Vec<u8>, u64, Ftype3) {
        let args = Nfs3Args::Lookup(Lookup3Args {
            what: dirop(dir, name),
        });
        self.call(ReplyTarget::Inline, &args, |res| match res {
            Nfs3Res::Lookup(Res3::Ok(ok)) => {
                let a = ok.obj_attributes.expect("LOOKUP attributes");
                (ok.object.as_bytes().to_vec(), a.size, a.ftype)
            }
            other => panic!("LOOKUP {name}: {other:?}"),
        })
    }

    /// READ in `MAX_IO` calls until eof, each result in a write chunk;
    /// returns the data and how many results came by RDMA Write.
    fn read_all(&mut self, fh: &[u8], expect_len: usize) -> (Vec<u8>, usize) {
        let mut data = Vec::with_capacity(expect_len);
        let mut placed = 0;
        for _ in 0..expect_len / MAX_IO as usize + 2 {
            let args = Nfs3Args::Read(Read3Args {
                file: FileHandle::new(fh).unwrap(),
                offset: data.len() as u64,
                count: MAX_IO,
            });
            let target = ReplyTarget::WriteChunk { max_ddp: MAX_IO };
            let (msg, ddp) = self.call_bytes(target, |xid, buf| {
                let e = encode_call(buf, xid, cred(), &args).ok()?;
                Some((e.len, e.ddp))
            });
            placed += usize::from(ddp.as_ref().is_some_and(|d| !d.is_empty()));
            let eof = match decode_reply(args.procedure(), &msg, ddp.as_deref()) {
                Ok(Nfs3Res::Read(Res3::Ok(ok))) => {
                    assert_eq!(ok.count as usize, ok.data.len(), "READ count");
                    data.extend_from_slice(ok.data);
                    ok.eof
                }
                other => panic!("READ: {other:?}"),
            };
            if eof {
                return (data, placed);
            }
        }
        panic!("no eof reading a {expect_len}-byte file");
    }
}

fn dirop<'a>(dir: &'a [u8], name: &'a str) -> DirOpArgs3<'a> {
    DirOpArgs3 {
        dir: FileHandle::new(dir).unwrap(),
        name: Filename::new(name.as_bytes()).unwrap(),
    }
}

/// The daemon's TCP listener (in the backend's namespace).
const GATEWAY_TCP: &str = "127.0.0.1:20050";

/// The daemon's configuration: shm, roce and tcp in front, NFS to
/// ganesha's port, MOUNT looked up in the backend's rpcbind.
fn gateway_config(shm: &str, roce: &str, metrics: SocketAddr) -> String {
    format!(
        "[workers]\ncores = [0]\nidle = \"adaptive\"\n\n\
         [[listeners]]\nurl = \"{shm}\"\n\n\
         [[listeners]]\nurl = \"{roce}\"\n\n\
         [[listeners]]\nurl = \"tcp://{GATEWAY_TCP}\"\n\n\
         [transport]\nmax_message = {MAX_MESSAGE}\n\n\
         [[gateway]]\nprogram = 100003\nversions = [3]\nbackend = \"127.0.0.1:{nfs}\"\nconnections = 2\n\n\
         [[gateway]]\nprogram = 100005\nversions = [3]\nbackend = \"rpcbind://127.0.0.1\"\n\n\
         [rpcbind]\nregister = true\naddress = \"/run/rpcbind.sock\"\n\n\
         [metrics]\nenabled = true\naddress = \"{metrics}\"\n",
        nfs = ganesha::NFS_PORT,
    )
}

/// The whole NFSv3 session through the gateway on `url`; returns what
/// each READ_SIZES file read as.
fn session<P: Provider>(url: &str, path: &str, tag: &str) -> Vec<Vec<u8>> {
    let mut nfs = NfsRdma::<P>::connect(url);
    let root = nfs.mount(path);
    let mut files = Vec::new();
    for size in READ_SIZES {
        let (fh, len, ftype) = nfs.lookup(&root, &format!("read-{size}"));
        assert_eq!((len, ftype), (size as u64, Ftype3::Reg));
        let (data, placed) = nfs.read_all(&fh, size);
        // Every non-empty result came by RDMA Write into the write chunk.
        assert_eq!(
            placed,
            size.div_ceil(MAX_IO as usize),
            "{tag} read-{size}: results placed"
        );
        files.push(data);
    }

    // WRITE: each call's data travels in a read chunk the gateway pulls.
    let written = pattern(2 * MIB + 5, tag.len() as u8);
    let name = format!("written-{tag}");
    // No CREATE codec: the file is made on the export beforehand.
    let (fh, _, _) = nfs.lookup(&root, &name);
    for (n, chunk) in written.chunks(MAX_IO as usize).enumerate() {
        let args = Nfs3Args::Write(Write3Args::new(
            FileHandle::new(&fh).unwrap(),
            (n * MAX_IO as usize) as u64,
            StableHow::FileSync,
            chunk,
        ));
        nfs.call(ReplyTarget::Inline, &args, |res| match res {
            Nfs3Res::Write(Res3::Ok(ok)) => assert_eq!(ok.count as usize, chunk.len()),
            other => panic!("WRITE: {other:?}"),
        });
    }

    // READDIRPLUS: replies of up to 32 KiB, in the reply chunk.
    let (dir, _, _) = nfs.lookup(&root, "many");
    let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
    let (mut cookie, mut cookieverf, mut calls) = (0u64, [0u8; 8], 0usize);
    loop {
        calls += 1;
        assert!(calls <= DIR_ENTRIES + 2, "READDIRPLUS never reached eof");
        let args = Nfs3Args::Readdirplus(Readdirplus3Args {
            dir: FileHandle::new(&dir).unwrap(),
            cookie,
            cookieverf,
            dircount: 8192,
            maxcount: 32768,
        });
        let eof = nfs.call(ReplyTarget::ReplyChunk, &args, |res| match res {
            Nfs3Res::Readdirplus(Res3::Ok(ok)) => {
                cookieverf = ok.cookieverf;
                for entry in ok.reply.entries.iter() {
                    *seen.entry(entry.name.as_bytes().to_vec()).or_default() += 1;
                    cookie = entry.cookie;
                }
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
    assert_eq!(seen.len(), DIR_ENTRIES, "{tag}: names in the directory");
    assert!(seen.values().all(|&n| n == 1), "{tag}: a name seen twice");

    // SYMLINK (its path may travel in a read chunk), READLINK (its path
    // may come in the write chunk).
    let link = format!("link-{tag}");
    let args = Nfs3Args::Symlink(Symlink3Args {
        dirop: dirop(&root, &link),
        symlink_attributes: Sattr3::default(),
        symlink_data: NfsPath::new(SYMLINK_TARGET).unwrap(),
    });
    nfs.call(ReplyTarget::Inline, &args, |res| match res {
        Nfs3Res::Symlink(Res3::Ok(_)) => {}
        other => panic!("SYMLINK: {other:?}"),
    });
    let (lfh, _, ftype) = nfs.lookup(&root, &link);
    assert_eq!(ftype, Ftype3::Lnk);
    let args = Nfs3Args::Readlink(Readlink3Args {
        symlink: FileHandle::new(&lfh).unwrap(),
    });
    let target = ReplyTarget::WriteChunk { max_ddp: 4096 };
    nfs.call(target, &args, |res| match res {
        Nfs3Res::Readlink(Res3::Ok(ok)) => assert_eq!(ok.data.as_bytes(), SYMLINK_TARGET),
        other => panic!("READLINK: {other:?}"),
    });
    two_reads_in_one_compound(&mut nfs, tag);
    nfs.client.close().expect("close");
    files
}

/// Big-endian XDR words.
fn xdr(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_be_bytes()).collect()
}

/// `data` as an XDR opaque<>.
fn xdr_opaque(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out.resize(out.len().next_multiple_of(4), 0);
}

/// Reads two ranges of `read-{MIB + 3}` in one NFSv4.0 COMPOUND, offering
/// one write chunk: the gateway walks ganesha's reply to both READs; the
/// first one's data comes by RDMA Write into the chunk, the second one's
/// in place, as RFC 5666 s3.6 pairs results with chunks.
fn two_reads_in_one_compound<P: Provider>(nfs: &mut NfsRdma<P>, tag: &str) {
    const NFS4: u32 = 4;
    const COMPOUND: u32 = 1;
    const PUTROOTFH: u32 = 24;
    const LOOKUP: u32 = 15;
    const READ: u32 = 25;
    let file = READ_SIZES[3];
    let ((o1, n1), (o2, n2)) = ((3_000usize, 1_000usize), (700_001usize, 2_003usize));
    let mut args = Vec::new();
    xdr_opaque(&mut args, tag.as_bytes());
    args.extend_from_slice(&xdr(&[0, 5, PUTROOTFH, LOOKUP]));
    xdr_opaque(&mut args, b"export");
    args.extend_from_slice(&xdr(&[LOOKUP]));
    xdr_opaque(&mut args, format!("read-{file}").as_bytes());
    for (offset, count) in [(o1, n1), (o2, n2)] {
        // The anonymous stateid (all zeros): a READ outside any OPEN.
        args.extend_from_slice(&xdr(&[READ, 0, 0, 0, 0, 0, offset as u32, count as u32]));
    }
    let target = ReplyTarget::WriteChunk { max_ddp: 4096 };
    let (msg, placed) = nfs.call_bytes(target, |xid, buf| {
        let header = CallHeader::new(
            xid,
            dataplane::nfs::NFS_PROGRAM,
            NFS4,
            COMPOUND,
            cred(),
            OpaqueAuth::None,
        );
        let mut e = Encoder::new(buf);
        header.emit(&mut e).ok()?;
        let n = e.position();
        buf.get_mut(n..n + args.len())?.copy_from_slice(&args);
        Some((n + args.len(), None))
    });
    let want = pattern(file, 3);
    assert_eq!(
        placed.as_deref(),
        Some(&want[o1..o1 + n1]),
        "{tag}: first READ in the chunk"
    );
    // The reply after its RPC header (accepted, AUTH_NONE verifier).
    let words = |at: usize| u32::from_be_bytes(msg[at..at + 4].try_into().unwrap());
    assert_eq!((words(8), words(20)), (0, 0), "{tag}: accepted, SUCCESS");
    let mut at = 24;
    assert_eq!(words(at), 0, "{tag}: COMPOUND status");
    at += 4 + 4 + (words(at + 4) as usize).next_multiple_of(4); // status, tag
    assert_eq!(words(at), 5, "{tag}: five results");
    at += 4;
    for op in [PUTROOTFH, LOOKUP, LOOKUP] {
        assert_eq!((words(at), words(at + 4)), (op, 0), "{tag}: op {op}");
        at += 8;
    }
    // First READ: its length word stays, its data went to the chunk.
    assert_eq!((words(at), words(at + 4), words(at + 8)), (READ, 0, 0));
    assert_eq!(words(at + 12) as usize, n1);
    at += 16;
    // Second READ: in place.
    assert_eq!((words(at), words(at + 4), words(at + 8)), (READ, 0, 0));
    assert_eq!(words(at + 12) as usize, n2);
    at += 16;
    assert_eq!(
        &msg[at..at + n2],
        &want[o2..o2 + n2],
        "{tag}: second READ in place"
    );
    assert_eq!(msg.len(), at + n2.next_multiple_of(4));
}

/// What ganesha serves for `name` over TCP, straight (no gateway).
fn read_over_tcp(nfs_addr: SocketAddr, mount_addr: SocketAddr, path: &str, name: &str) -> Vec<u8> {
    let mut buf = vec![0u8; 2 * MIB];
    let mut mnt = RpcTcp::connect(mount_addr).expect("MOUNT over TCP");
    let args = MountArgs::Mnt(DirPath::new(path.as_bytes()).unwrap());
    let e = encode_mount_call(&mut buf, mnt.xid(), cred(), &args).unwrap();
    let reply = mnt.call(&buf[..e.len]).unwrap();
    let MountRes::Mnt(MntRes3::Ok(ok)) = decode_mount_reply(MountProc::Mnt, &reply).unwrap() else {
        panic!("MNT over TCP");
    };
    let root = ok.fhandle().as_bytes().to_vec();
    let mut rpc = RpcTcp::connect(nfs_addr).expect("NFS over TCP");
    let call = |rpc: &mut RpcTcp, args: &Nfs3Args<'_>, buf: &mut Vec<u8>| {
        let e = encode_call(buf, rpc.xid(), cred(), args).unwrap();
        rpc.call(&buf[..e.len]).unwrap()
    };
    let args = Nfs3Args::Lookup(Lookup3Args {
        what: dirop(&root, name),
    });
    let reply = call(&mut rpc, &args, &mut buf);
    let Nfs3Res::Lookup(Res3::Ok(ok)) = decode_reply(args.procedure(), &reply, None).unwrap()
    else {
        panic!("LOOKUP over TCP");
    };
    let fh = ok.object.as_bytes().to_vec();
    let mut data = Vec::new();
    loop {
        let args = Nfs3Args::Read(Read3Args {
            file: FileHandle::new(&fh).unwrap(),
            offset: data.len() as u64,
            count: MAX_IO,
        });
        let reply = call(&mut rpc, &args, &mut buf);
        let Nfs3Res::Read(Res3::Ok(ok)) = decode_reply(args.procedure(), &reply, None).unwrap()
        else {
            panic!("READ over TCP");
        };
        data.extend_from_slice(ok.data);
        if ok.eof {
            return data;
        }
    }
}

#[test]
fn nfs3_through_the_gateway_over_shm_and_roce() {
    let Some(backend) = GaneshaBackend::start("gateway") else {
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
    for tag in ["shm", "roce"] {
        std::fs::write(export.join(format!("written-{tag}")), b"").unwrap();
    }

    let dir = scratch_dir("gateway");
    let shm = format!("shm://{}", dir.join("gw.sock").display());
    let roce = "roce://127.0.0.1:20049";
    let metrics: SocketAddr = "127.0.0.1:9477".parse().unwrap();
    let cfg = write_file(&dir, "gateway.toml", &gateway_config(&shm, roce, metrics));
    let mut cmd = backend.command(BIN);
    cmd.arg("--config").arg(&cfg);
    let mut d = Daemon::spawn_command(cmd);
    d.wait_for_line("started");
    assert!(
        d.stderr()
            .contains("gateway: program 100005 versions [3] -> tcp 127.0.0.1:20048"),
        "MOUNT's address from rpcbind: {}",
        d.stderr()
    );

    let path = backend.export_path();
    let shm_files = session::<Shm>(&shm, &path, "shm");
    let (p, r) = (path.clone(), roce.to_string());
    let roce_files = backend.in_netns(move || session::<Roce>(&r, &p, "roce"));

    // Byte-exact, and what ganesha serves over TCP straight.
    let (nfs_addr, mount_addr) = (backend.nfs_addr(), backend.mount_addr());
    for (i, size) in READ_SIZES.into_iter().enumerate() {
        let want = pattern(size, i as u8);
        assert!(shm_files[i] == want, "read-{size} over shm differs");
        assert!(roce_files[i] == want, "read-{size} over roce differs");
        let p = path.clone();
        let tcp = backend
            .in_netns(move || read_over_tcp(nfs_addr, mount_addr, &p, &format!("read-{size}")));
        assert!(tcp == want, "read-{size} over TCP straight differs");
        // The gateway's TCP listener relays MOUNT and NFS too.
        let gw: SocketAddr = GATEWAY_TCP.parse().unwrap();
        let p = path.clone();
        let relayed = backend.in_netns(move || read_over_tcp(gw, gw, &p, &format!("read-{size}")));
        assert!(
            relayed == want,
            "read-{size} over TCP through the gateway differs"
        );
    }
    for tag in ["shm", "roce"] {
        let on_disk = std::fs::read(export.join(format!("written-{tag}"))).unwrap();
        assert!(
            on_disk == pattern(2 * MIB + 5, tag.len() as u8),
            "written-{tag} on disk"
        );
        let link = std::fs::read_link(export.join(format!("link-{tag}"))).unwrap();
        assert_eq!(link.as_os_str().as_encoded_bytes(), SYMLINK_TARGET);
    }

    // Every call went through the relay; none failed.
    let (_, body) = backend.in_netns(move || http_get(metrics, "/metrics"));
    let calls = sum_metric(&body, "rpcrdma_gateway_calls_total{program=\"100003\"");
    let replies = sum_metric(&body, "rpcrdma_gateway_replies_total{program=\"100003\"");
    assert!(calls > 2 * 40, "NFS calls relayed: {calls}\n{body}");
    assert_eq!(calls, replies, "{body}");
    // MNT: once per RDMA session, and once per file read over the
    // gateway's TCP listener (those straight to ganesha are not counted).
    assert_eq!(
        sum_metric(&body, "rpcrdma_gateway_calls_total{program=\"100005\""),
        2 + READ_SIZES.len() as u64
    );
    assert_eq!(
        sum_metric(&body, "rpcrdma_gateway_errors_total{program=\"100003\""),
        0,
        "{body}"
    );

    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait().code(), Some(0), "{}", d.stderr());
    assert!(!d.stderr().contains("leak"), "{}", d.stderr());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The sum of every sample whose line starts with `prefix` (name and the
/// first labels).
fn sum_metric(body: &str, prefix: &str) -> u64 {
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn killing_the_backend_costs_calls_not_connections() {
    let Some(mut backend) = GaneshaBackend::start("gateway-kill") else {
        return;
    };
    std::fs::write(backend.export_dir().join("f"), pattern(100_000, 7)).unwrap();
    let dir = scratch_dir("gateway-kill");
    let shm = format!("shm://{}", dir.join("gw.sock").display());
    let metrics: SocketAddr = "127.0.0.1:9478".parse().unwrap();
    let cfg = write_file(
        &dir,
        "gateway.toml",
        &gateway_config(&shm, "roce://127.0.0.1:20051", metrics),
    );
    let mut cmd = backend.command(BIN);
    cmd.arg("--config").arg(&cfg);
    let mut d = Daemon::spawn_command(cmd);
    d.wait_for_line("started");

    let mut nfs = NfsRdma::<Shm>::connect(&shm);
    let root = nfs.mount(&backend.export_path());
    let (fh, _, _) = nfs.lookup(&root, "f");
    assert!(nfs.read_all(&fh, 100_000).0 == pattern(100_000, 7));

    // The backend dies and comes back (same ports, a new process) while a
    // second client is in the middle of reading a 32 MiB file: the
    // gateway's TCP connections to it are gone, the clients' RDMA
    // connections are not; the READs at the backend when it died are sent
    // again once it is back, and every byte arrives.
    std::fs::write(backend.export_dir().join("big"), pattern(32 << 20, 9)).unwrap();
    let (big, _, _) = nfs.lookup(&root, "big");
    let reads = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let reader = {
        let (url, big, reads) = (shm.clone(), big.clone(), reads.clone());
        std::thread::spawn(move || {
            let mut c = NfsRdma::<Shm>::connect(&url);
            for _ in 0..3 {
                let mut data = Vec::with_capacity(32 << 20);
                while data.len() < 32 << 20 {
                    let args = Nfs3Args::Read(Read3Args {
                        file: FileHandle::new(&big).unwrap(),
                        offset: data.len() as u64,
                        count: MAX_IO,
                    });
                    let target = ReplyTarget::WriteChunk { max_ddp: MAX_IO };
                    c.call(target, &args, |res| match res {
                        Nfs3Res::Read(Res3::Ok(ok)) => data.extend_from_slice(ok.data),
                        other => panic!("READ at {}: {other:?}", data.len()),
                    });
                    reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                assert!(data == pattern(32 << 20, 9), "the 32 MiB file differs");
            }
            c.client.close().expect("close");
        })
    };
    let deadline = std::time::Instant::now() + PATIENCE;
    while reads.load(std::sync::atomic::Ordering::Relaxed) < 8 {
        assert!(
            std::time::Instant::now() < deadline,
            "the reader never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    backend.kill();
    backend.restart();
    reader
        .join()
        .expect("the reader read the whole file three times");
    for _ in 0..3 {
        assert!(nfs.read_all(&fh, 100_000).0 == pattern(100_000, 7));
    }
    nfs.client.close().expect("close");
    let (_, body) = backend.in_netns(move || http_get(metrics, "/metrics"));
    let lost = sum_metric(
        &body,
        "rpcrdma_gateway_errors_total{program=\"100003\",backend=\"127.0.0.1:2049\",kind=\"connection\"}",
    );
    assert!(lost >= 1, "a lost backend connection counted\n{body}");
    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait().code(), Some(0), "{}", d.stderr());
    let _ = std::fs::remove_dir_all(&dir);
}

/// REMOVE (no codec: RFC 1813 s3.3.12 by hand) of `name` in `dir` under
/// the XID `xid`; the NFS status of the reply.
fn remove<P: Provider>(nfs: &mut NfsRdma<P>, xid: u32, dir: &[u8], name: &str) -> u32 {
    use dataplane::wire::rpc::CallHeader;
    use dataplane::wire::xdr::Encoder;
    let (msg, _) = nfs.call_bytes(ReplyTarget::Inline, |_, buf| {
        let mut e = Encoder::new(buf);
        CallHeader::new(xid, 100_003, 3, 12, cred(), OpaqueAuth::None)
            .emit(&mut e)
            .ok()?;
        e.put_opaque(dir).ok()?;
        e.put_opaque(name.as_bytes()).ok()?;
        Some((e.position(), None))
    });
    // xid, REPLY, MSG_ACCEPTED, AUTH_NONE verifier, SUCCESS: 24 bytes.
    assert_eq!(msg[..4], xid.to_be_bytes());
    assert_eq!(msg[20..24], [0; 4], "accepted SUCCESS");
    u32::from_be_bytes([msg[24], msg[25], msg[26], msg[27]])
}

#[test]
fn a_retransmitted_remove_is_answered_from_the_reply_cache() {
    let Some(backend) = GaneshaBackend::start("gateway-drc") else {
        return;
    };
    std::fs::write(backend.export_dir().join("victim"), b"x").unwrap();
    let dir = scratch_dir("gateway-drc");
    let shm = format!("shm://{}", dir.join("gw.sock").display());
    let metrics: SocketAddr = "127.0.0.1:9479".parse().unwrap();
    let cfg = write_file(
        &dir,
        "gateway.toml",
        &gateway_config(&shm, "roce://127.0.0.1:20053", metrics),
    );
    let mut cmd = backend.command(BIN);
    cmd.arg("--config").arg(&cfg);
    let mut d = Daemon::spawn_command(cmd);
    d.wait_for_line("started");
    let path = backend.export_path();

    // The REMOVE runs; the client "loses" the reply with its connection.
    let mut first = NfsRdma::<Shm>::connect(&shm);
    let root = first.mount(&path);
    assert_eq!(remove(&mut first, 0x5eed, &root, "victim"), 0, "NFS3_OK");
    assert!(!backend.export_dir().join("victim").exists());
    first.client.close().expect("close");

    // It reconnects and retransmits the same call: the cached NFS3_OK,
    // not the NFS3ERR_NOENT (2) a second run would answer.
    let mut again = NfsRdma::<Shm>::connect(&shm);
    let root = again.mount(&path);
    assert_eq!(
        remove(&mut again, 0x5eed, &root, "victim"),
        0,
        "answered from the cache"
    );
    // A new call (another XID) does run, and finds nothing to remove.
    assert_eq!(
        remove(&mut again, 0x5eee, &root, "victim"),
        2,
        "NFS3ERR_NOENT"
    );
    again.client.close().expect("close");

    let (_, body) = backend.in_netns(move || http_get(metrics, "/metrics"));
    let hits = sum_metric(
        &body,
        "rpcrdma_gateway_reply_cache_total{program=\"100003\",backend=\"127.0.0.1:2049\",kind=\"hit\"}",
    );
    assert_eq!(hits, 1, "{body}");
    // Two NFS calls reached the backend (the first REMOVE and the one
    // under a new XID), not three.
    let calls = sum_metric(&body, "rpcrdma_gateway_calls_total{program=\"100003\"");
    assert_eq!(calls, 2, "{body}");
    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait().code(), Some(0), "{}", d.stderr());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that offers the RPC-over-RDMA extensions to a gateway that
/// offers them too: WRITEs of 8 KiB go as transmission groups with their
/// data placed by Send (no read chunk for the gateway to pull), READs of
/// 8 KiB have their data written by RDMA (a plain write chunk: the Write
/// costs no round trip), and the file on disk and read back through the
/// gateway is byte-exact.
#[test]
fn nfs3_through_the_gateway_with_the_extensions_negotiated() {
    use dataplane::engine::Extensions;
    let Some(backend) = GaneshaBackend::start("gateway-ext") else {
        return;
    };
    std::fs::write(backend.export_dir().join("placed"), b"").unwrap();
    let dir = scratch_dir("gateway-ext");
    let shm = format!("shm://{}", dir.join("gw.sock").display());
    let metrics: SocketAddr = "127.0.0.1:9480".parse().unwrap();
    let config = gateway_config(&shm, "roce://127.0.0.1:20054", metrics).replace(
        "[transport]\n",
        "[transport]\nextensions = [\"message_continuation\", \"send_placement\"]\n",
    );
    let cfg = write_file(&dir, "gateway.toml", &config);
    let mut cmd = backend.command(BIN);
    cmd.arg("--config").arg(&cfg);
    let mut d = Daemon::spawn_command(cmd);
    d.wait_for_line("started");
    let path = backend.export_path();

    let mut nfs = NfsRdma::<Shm>::connect_offering(&shm, Extensions::ALL);
    let both = Extensions::MESSAGE_CONTINUATION.union(Extensions::SEND_PLACEMENT);
    assert_eq!(nfs.client.negotiated(), both);
    let root = nfs.mount(&path);
    let (fh, _, _) = nfs.lookup(&root, "placed");
    const IO: usize = 8192;
    let written = pattern(32 * IO + 5, 7);
    for (n, chunk) in written.chunks(IO).enumerate() {
        let args = Nfs3Args::Write(Write3Args::new(
            FileHandle::new(&fh).unwrap(),
            (n * IO) as u64,
            StableHow::FileSync,
            chunk,
        ));
        nfs.call(ReplyTarget::Inline, &args, |res| match res {
            Nfs3Res::Write(Res3::Ok(ok)) => assert_eq!(ok.count as usize, chunk.len()),
            other => panic!("WRITE: {other:?}"),
        });
    }
    // The last WRITE, of 5 bytes, fits one Send inline.
    let long_writes = (written.len() / IO) as u64;
    let stats = nfs.client.endpoint().connection().stats();
    assert_eq!(
        stats.items_placed_sent, long_writes,
        "every long WRITE's data placed"
    );
    assert_eq!(stats.calls_pulled, 0, "no read chunk pulled");
    let on_disk = std::fs::read(backend.export_dir().join("placed")).unwrap();
    assert!(on_disk == written, "the file on disk");

    let mut read = Vec::new();
    loop {
        let args = Nfs3Args::Read(Read3Args {
            file: FileHandle::new(&fh).unwrap(),
            offset: read.len() as u64,
            count: IO as u32,
        });
        let target = ReplyTarget::WriteChunk { max_ddp: IO as u32 };
        let eof = nfs.call(target, &args, |res| match res {
            Nfs3Res::Read(Res3::Ok(ok)) => {
                read.extend_from_slice(ok.data);
                ok.eof
            }
            other => panic!("READ: {other:?}"),
        });
        if eof {
            break;
        }
    }
    assert!(read == written, "read back through the gateway");
    nfs.client.close().expect("close");

    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait().code(), Some(0), "{}", d.stderr());
    assert!(!d.stderr().contains("leak"), "{}", d.stderr());
    let _ = std::fs::remove_dir_all(&dir);
}
