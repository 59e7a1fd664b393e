//! A real Linux kernel as the peer: Debian's kernel booted under qemu by
//! `deploy/linux-peer`, with soft-RoCE (rdma_rxe) and knfsd listening for
//! NFS over RDMA on port 20049. Every other test pairs our code with our
//! own code; here the other end is the kernel's RDMA CM, rxe transport and
//! svcrdma.
//!
//! `linux_kernel_peer` boots one guest (10-20 s here) and runs both
//! directions against it:
//!
//! 1. Our client, Linux's server: this test binary, re-executed in the
//!    guest's network namespace, connects `Client::<Roce>` to
//!    `roce://198.18.0.2:20049` and makes NFS NULL calls (program 100003,
//!    versions 3 and 4, AUTH_NONE): inline, with a reply chunk offered, and
//!    as a 64 KiB long call (RDMA_NOMSG, a position-zero read chunk that
//!    knfsd pulls with RDMA Reads). Every reply is MSG_ACCEPTED/SUCCESS
//!    with the call's XID, and knfsd's own counters show the six NULLs.
//!    Then NFSv4.0 COMPOUNDs: READs of the guest's 1 MiB `file1m` whose
//!    data knfsd RDMA-Writes into our write chunks (every byte checked),
//!    and a READDIR of its 300-entry `dir` whose reply comes through our
//!    reply chunk (every name checked).
//! 2. Linux's client, our server: `rpcrdmad` in the namespace with a
//!    `roce://198.18.0.1:20049` listener; the guest mounts NFSv4.0 over
//!    RDMA. The daemon serves no NFS: the kernel's NULL ping is answered
//!    PROG_UNAVAIL, so the mount fails with EPFNOSUPPORT; the daemon's log
//!    and metrics show the connection and the RPC.
//!
//! Each session is captured on the namespace's tap and checked: every
//! ICRC (Linux's included) recomputed by our codec, no malformed frame or
//! expert error in tshark, REQ/REP/RTU from the right sides, the first
//! data packet each way at the Starting PSN the receiving side announced,
//! no NAK either way, calls and replies with matching XIDs.
//!
//! `RPCRDMA_SAVE_LINUX_REP=PATH` writes the first REP Linux sent (the whole
//! RoCE packet, hex) to PATH: that is how
//! `dataplane/tests/data/linux_rep.hex` was made (see
//! `dataplane/tests/roce_linux_rep.rs`). `KEEP_PCAP=1` keeps the capture.
//!
//! Needs root, qemu-system-x86_64, busybox, tshark/dumpcap, the host
//! packages the guest borrows (rdma-core, nfs-kernel-server, rpcbind) and
//! the kernel cached by `deploy/linux-peer fetch`. Without them the test
//! fails under `RPCRDMA_REQUIRE_PEERS=1`, else prints `skipped: ...` and
//! passes. The guest and its namespace go away when the test ends, panics
//! included (a guard's `Drop`); a later run removes those of a killed run.
mod support;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dataplane::client::{CallOutcome, Client, ClientConfig, ReplyTarget};
use dataplane::engine;
use dataplane::verbs::roce::Roce;
use dataplane::wire::ibcm::{CmMad, CmMessage, GSI_QPN};
use dataplane::wire::roce::{icrc, Opcode, RocePacket, Syndrome};
use dataplane::wire::rpc::{CallHeader, OpaqueAuth, ReplyHeader};
use dataplane::wire::xdr::Encoder;
use dataplane::worker::{EndpointConfig, IdleStrategy};
use nix::sys::signal::Signal;
use support::*;

/// The namespace side (the tap) and the guest, as deploy/linux-peer sets them.
const HOST_IP: &str = "198.18.0.1";
const GUEST_IP: &str = "198.18.0.2";
/// knfsd's RDMA listener (RFC 5667 s10 port), our source address pinned.
const URL: &str = "roce://198.18.0.2:20049?local=198.18.0.1";
const NFS_PROGRAM: u32 = 100_003;
/// Capture probes and the end marker go to the discard port of the guest
/// (inside the namespace; the guest drops them).
const PROBE_PORT: u16 = 9;
/// Where deploy/linux-peer keeps the kernel (its default; the same
/// variable moves both).
fn kernel_cache() -> PathBuf {
    std::env::var_os("RPCRDMA_LINUX_PEER_CACHE")
        .map_or_else(|| "/var/cache/rpcrdma-linux-peer".into(), PathBuf::from)
}
/// Hang guard for the client process; never a statement about speed.
const CLIENT_PATIENCE: Duration = Duration::from_secs(180);

const ROLE_ENV: &str = "RPCRDMA_LINUX_PEER_ROLE";
const PCAP_ENV: &str = "RPCRDMA_LINUX_PEER_PCAP";

fn skip(why: &str) {
    if std::env::var("RPCRDMA_REQUIRE_PEERS").as_deref() == Ok("1") {
        panic!("{why} and RPCRDMA_REQUIRE_PEERS=1");
    }
    println!("skipped: {why}");
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/linux-peer")
}

// ---------------------------------------------------------------------------
// The guest

/// A booted guest; `Drop` powers it off and deletes its namespace.
struct Peer {
    dir: PathBuf,
    ns: String,
    tap: String,
}

const PEER_DIR_SUFFIX: &str = "-linux-peer";

impl Peer {
    /// `deploy/linux-peer up DIR`; `None` after the real-peer rule said
    /// "skipped".
    fn up() -> Option<Peer> {
        if !nix::unistd::geteuid().is_root() {
            skip("not root (the Linux peer needs namespaces, a tap and qemu)");
            return None;
        }
        for tool in [
            "qemu-system-x86_64",
            "busybox",
            "ip",
            "rdma",
            "rpc.nfsd",
            "exportfs",
            "rpcbind",
            "tshark",
            "dumpcap",
        ] {
            require_peer(tool)?;
        }
        let version = std::fs::read_to_string(kernel_cache().join("version"));
        if version.is_err() {
            skip("Linux kernel for the peer not installed (deploy/linux-peer fetch)");
            return None;
        }
        remove_stale_peers();
        let dir = scratch_dir(&PEER_DIR_SUFFIX[1..]);
        let started = Instant::now();
        let out = Command::new(script())
            .arg("up")
            .arg(&dir)
            .stdin(Stdio::null())
            .output()
            .expect("run deploy/linux-peer");
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprint!("{stderr}");
        // From here on, Drop cleans up whatever `up` left.
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let field = |name: &str| {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .unwrap_or("")
                .to_owned()
        };
        let peer = Peer {
            dir,
            ns: field("NS"),
            tap: field("TAP"),
        };
        assert!(out.status.success(), "deploy/linux-peer up failed");
        assert_eq!(field("GUEST"), GUEST_IP);
        assert_eq!(field("HOST"), HOST_IP);
        println!(
            "linux peer up in {:.1} s: namespace {}, tap {}",
            started.elapsed().as_secs_f64(),
            peer.ns,
            peer.tap
        );
        Some(peer)
    }

    /// `ip netns exec NS PROG`: the child's pid is PROG's.
    fn command(&self, prog: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns]).arg(prog);
        c
    }

    /// Runs `cmd` in the guest: (exit code, stdout, stderr).
    fn run(&self, cmd: &str) -> (Option<i32>, String, String) {
        let out = Command::new(script())
            .arg("run")
            .arg(&self.dir)
            .args(["--timeout", "60", "--", cmd])
            .stdin(Stdio::null())
            .output()
            .expect("deploy/linux-peer run");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let status = Command::new(script())
            .arg("down")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!(
                "cleanup: deploy/linux-peer down {}: {status:?}",
                self.dir.display()
            );
        }
        if std::thread::panicking() {
            eprintln!(
                "guest console log kept: {}",
                self.dir.join("console.log").display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Guests of test processes that no longer run (killed before their guard
/// could drop): `down` each, by the directory its test used.
fn remove_stale_peers() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("rpcrdmad-test-")
            .and_then(|r| r.strip_suffix(PEER_DIR_SUFFIX))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new(script())
                .arg("down")
                .arg(e.path())
                .stdin(Stdio::null())
                .status();
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

// ---------------------------------------------------------------------------
// The client role (runs inside the namespace)

fn client_config() -> ClientConfig {
    ClientConfig {
        endpoint: EndpointConfig {
            engine: engine::Config {
                credits: 8,
                max_outstanding_calls: 8,
                max_call_size: 128 << 10,
                max_reply_size: 512 << 10,
                max_ddp_size: 256 << 10,
                ..engine::Config::default()
            },
            ..EndpointConfig::default()
        },
        // knfsd does not serve CONF_RDMA (program 100417): plain Version One.
        conf_rdma: false,
        idle: IdleStrategy::Adaptive {
            park_max: Duration::from_micros(200),
        },
        wait_timeout: PATIENCE,
    }
}

/// NFS NULL of `version`, AUTH_NONE, followed by `junk` as an argument
/// knfsd's NULL does not read (empty for a plain NULL). Checks the reply
/// and returns the XID used.
fn nfs_null(client: &mut Client<Roce>, version: u32, target: ReplyTarget, junk: &[u8]) -> u32 {
    let mut used = 0;
    let call = client
        .call(target, |xid, buf| {
            used = xid;
            let h = CallHeader::new(
                xid,
                NFS_PROGRAM,
                version,
                0,
                OpaqueAuth::None,
                OpaqueAuth::None,
            );
            let mut enc = Encoder::new(buf);
            h.emit(&mut enc).ok()?;
            if !junk.is_empty() {
                enc.put_opaque(junk).ok()?;
            }
            Some((enc.position(), None))
        })
        .unwrap_or_else(|e| panic!("NFSv{version} NULL via {target:?}: {e}"));
    let outcome = client.wait(call).expect("NULL reply");
    let CallOutcome::Reply { len, .. } = outcome else {
        panic!("NFSv{version} NULL via {target:?}: {outcome:?}");
    };
    let msg = client.reply(call).expect("reply message");
    let (h, hlen) = ReplyHeader::parse(msg)
        .unwrap_or_else(|e| panic!("NFSv{version} NULL reply {msg:02x?}: {e}"));
    assert_eq!(h.xid, used, "reply XID");
    assert!(h.is_success(), "NFSv{version} NULL: {h:?}");
    assert_eq!(hlen, len as usize, "NULL has no results");
    assert!(client.release(call));
    used
}

/// NFSv4.0 operation numbers (RFC 7530 s16).
const OP_PUTROOTFH: u32 = 24;
const OP_LOOKUP: u32 = 15;
const OP_READ: u32 = 25;
/// The guest's test file and its documented pattern (deploy/linux-peer).
const FILE1M: &str = "file1m";
const FILE1M_LEN: usize = 1 << 20;
/// Largest READ we ask for (knfsd may return less; we loop).
const READ_CHUNK: u32 = 256 << 10;

fn file1m_byte(offset: usize) -> u8 {
    (offset % 251) as u8
}

/// One NFSv4.0 COMPOUND {PUTROOTFH; LOOKUP file1m; READ offset count}
/// with the special all-ones stateid (READ without OPEN; RFC 7530 s9.1.4.3:
/// also allowed during the server's grace period), AUTH_SYS root. The READ
/// data is DDP-eligible (RFC 8267): it is offered a write chunk, so knfsd
/// RDMA-Writes it into our memory and the inline reply keeps only its
/// length. Returns (eof, data, whether it came through the write chunk).
fn nfs4_read(client: &mut Client<Roce>, offset: u64, count: u32) -> (bool, Vec<u8>, bool) {
    let sys = dataplane::wire::rpc::AuthSys::new(0, b"linux-peer-test", 0, 0, &[]).unwrap();
    let mut used = 0;
    let call = client
        .call(ReplyTarget::WriteChunk { max_ddp: count }, |xid, buf| {
            used = xid;
            let h = CallHeader::new(
                xid,
                NFS_PROGRAM,
                4,
                1,
                OpaqueAuth::Sys(sys),
                OpaqueAuth::None,
            );
            let mut e = Encoder::new(buf);
            h.emit(&mut e).ok()?;
            e.put_opaque(b"").ok()?; // tag
            e.put_u32(0).ok()?; // minorversion
            e.put_u32(3).ok()?; // three operations
            e.put_u32(OP_PUTROOTFH).ok()?;
            e.put_u32(OP_LOOKUP).ok()?;
            e.put_opaque(FILE1M.as_bytes()).ok()?;
            e.put_u32(OP_READ).ok()?;
            e.put_u32(u32::MAX).ok()?; // stateid seqid: all ones
            e.put_opaque_fixed(&[0xFF; 12]).ok()?; // stateid other
            e.put_u64(offset).ok()?;
            e.put_u32(count).ok()?;
            Some((e.position(), None))
        })
        .unwrap_or_else(|e| panic!("NFSv4 READ {offset}+{count}: {e}"));
    let outcome = client.wait(call).expect("READ reply");
    let CallOutcome::Reply { ddp_len, .. } = outcome else {
        panic!("NFSv4 READ {offset}+{count}: {outcome:?}");
    };
    let msg = client.reply(call).expect("reply message");
    let (h, hlen) = ReplyHeader::parse(msg).expect("reply header");
    assert_eq!(h.xid, used, "reply XID");
    assert!(h.is_success(), "NFSv4 COMPOUND: {h:?}");
    let mut d = dataplane::wire::xdr::Decoder::new(&msg[hlen..]);
    let mut u32_ = || d.get_u32().expect("COMPOUND4res");
    assert_eq!(u32_(), 0, "COMPOUND status (NFS4_OK)");
    let tag_len = u32_();
    assert_eq!(tag_len, 0, "tag echoed");
    assert_eq!(u32_(), 3, "three results");
    for op in [OP_PUTROOTFH, OP_LOOKUP, OP_READ] {
        assert_eq!((u32_(), u32_()), (op, 0), "operation {op}: NFS4_OK");
    }
    let eof = u32_() != 0;
    let len = u32_() as usize;
    let data = match ddp_len {
        // The data went into the write chunk; the inline reply ends here.
        Some(n) => {
            assert_eq!(n as usize, len, "write chunk length = READ count");
            client.ddp(call).expect("DDP data")[..len].to_vec()
        }
        None => d.get_opaque_fixed(len).expect("inline READ data").to_vec(),
    };
    assert!(client.release(call));
    (eof, data, ddp_len.is_some())
}

const OP_READDIR: u32 = 26;
/// The guest's directory and its entry count (deploy/linux-peer).
const DIR: &str = "dir";
const DIR_ENTRIES: usize = 300;
/// FATTR4_FILEID (RFC 7530 s5.8.2.13): bit 20 of the first bitmap word.
const FATTR4_FILEID_WORD0: u32 = 1 << 20;

/// NFSv4.0 COMPOUND {PUTROOTFH; LOOKUP dir; READDIR cookie} asking for
/// each entry's fileid, with a reply chunk offered: 300 entries are far
/// above the 4 KiB inline size, so knfsd RDMA-Writes the whole reply into
/// the reply chunk. Returns (names, last cookie, cookie verifier, eof).
fn nfs4_readdir(
    client: &mut Client<Roce>,
    cookie: u64,
    verifier: [u8; 8],
) -> (Vec<String>, u64, [u8; 8], bool) {
    let sys = dataplane::wire::rpc::AuthSys::new(0, b"linux-peer-test", 0, 0, &[]).unwrap();
    let mut used = 0;
    let call = client
        .call(ReplyTarget::ReplyChunk, |xid, buf| {
            used = xid;
            let h = CallHeader::new(
                xid,
                NFS_PROGRAM,
                4,
                1,
                OpaqueAuth::Sys(sys),
                OpaqueAuth::None,
            );
            let mut e = Encoder::new(buf);
            h.emit(&mut e).ok()?;
            e.put_opaque(b"").ok()?;
            e.put_u32(0).ok()?;
            e.put_u32(3).ok()?;
            e.put_u32(OP_PUTROOTFH).ok()?;
            e.put_u32(OP_LOOKUP).ok()?;
            e.put_opaque(DIR.as_bytes()).ok()?;
            e.put_u32(OP_READDIR).ok()?;
            e.put_u64(cookie).ok()?;
            e.put_opaque_fixed(&verifier).ok()?;
            e.put_u32(64 << 10).ok()?; // dircount
            e.put_u32(64 << 10).ok()?; // maxcount
            e.put_u32(1).ok()?; // attr_request: one bitmap word
            e.put_u32(FATTR4_FILEID_WORD0).ok()?;
            Some((e.position(), None))
        })
        .unwrap_or_else(|e| panic!("NFSv4 READDIR: {e}"));
    let outcome = client.wait(call).expect("READDIR reply");
    let CallOutcome::Reply { len, .. } = outcome else {
        panic!("NFSv4 READDIR: {outcome:?}");
    };
    let msg = client.reply(call).expect("reply message");
    assert!(len > 4096, "a reply above the inline size ({len} bytes)");
    let (h, hlen) = ReplyHeader::parse(msg).expect("reply header");
    assert_eq!(h.xid, used, "reply XID");
    assert!(h.is_success(), "NFSv4 COMPOUND: {h:?}");
    let mut d = dataplane::wire::xdr::Decoder::new(&msg[hlen..]);
    assert_eq!(d.get_u32().expect("READDIR reply: status"), 0, "NFS4_OK");
    assert_eq!(d.get_u32().expect("READDIR reply: tag"), 0);
    assert_eq!(d.get_u32().expect("READDIR reply: count"), 3);
    for op in [OP_PUTROOTFH, OP_LOOKUP, OP_READDIR] {
        let r = (d.get_u32().unwrap(), d.get_u32().unwrap());
        assert_eq!(r, (op, 0), "operation {op}: NFS4_OK");
    }
    let mut verf = [0u8; 8];
    verf.copy_from_slice(d.get_opaque_fixed(8).expect("READDIR reply: cookieverf"));
    let (mut names, mut last) = (Vec::new(), cookie);
    while d.get_u32().expect("READDIR reply: value_follows") != 0 {
        last = d.get_u64().expect("READDIR reply: cookie");
        let name = d.get_opaque(255).expect("READDIR reply: name");
        names.push(String::from_utf8(name.to_vec()).expect("UTF-8 name"));
        let words = d.get_u32().expect("READDIR reply: bitmap");
        let bitmap: Vec<u32> = (0..words).map(|_| d.get_u32().unwrap()).collect();
        assert_eq!(
            bitmap.first(),
            Some(&FATTR4_FILEID_WORD0),
            "fileid returned"
        );
        let vals = d.get_opaque(64).expect("READDIR reply: attrlist");
        assert_eq!(vals.len(), 8, "one fileid");
    }
    let eof = d.get_u32().expect("READDIR reply: eof") != 0;
    assert!(client.release(call));
    (names, last, verf, eof)
}

/// Lists /export/dir with NFSv4 READDIR through reply chunks; checks the
/// 300 names. Returns how many READDIRs it took.
fn list_dir(client: &mut Client<Roce>) -> u32 {
    let (mut all, mut cookie, mut verf, mut calls) = (Vec::new(), 0, [0u8; 8], 0);
    loop {
        let (names, last, v, eof) = nfs4_readdir(client, cookie, verf);
        calls += 1;
        all.extend(names);
        (cookie, verf) = (last, v);
        if eof {
            break;
        }
        assert!(calls < 100, "READDIR loop");
    }
    all.sort();
    let want: Vec<String> = (0..DIR_ENTRIES)
        .map(|i| format!("entry-{i:03}-padding-to-make-readdirplus-long"))
        .collect();
    assert_eq!(all, want, "the directory's entries");
    calls
}

/// Reads the whole of /export/file1m with NFSv4 READs into write chunks
/// and checks every byte. Returns how many READs it took and how many of
/// them came back through the write chunk.
fn read_file1m(client: &mut Client<Roce>) -> (u32, u32) {
    let mut got = Vec::with_capacity(FILE1M_LEN);
    let (mut reads, mut placed) = (0, 0);
    loop {
        let (eof, data, ddp) = nfs4_read(client, got.len() as u64, READ_CHUNK);
        reads += 1;
        placed += u32::from(ddp && !data.is_empty());
        got.extend_from_slice(&data);
        assert!(got.len() <= FILE1M_LEN, "more than the file");
        if eof {
            break;
        }
        assert!(!data.is_empty(), "READ returned nothing before EOF");
        assert!(reads < 1000, "READ loop");
    }
    assert_eq!(got.len(), FILE1M_LEN, "file1m length");
    if let Some(i) = (0..FILE1M_LEN).find(|&i| got[i] != file1m_byte(i)) {
        panic!(
            "file1m differs at byte {i}: {} != {}",
            got[i],
            file1m_byte(i)
        );
    }
    (reads, placed)
}

fn client_role() {
    let pcap = PathBuf::from(std::env::var_os(PCAP_ENV).expect("capture file"));
    let probe = std::net::UdpSocket::bind((HOST_IP, 0)).unwrap();
    // dumpcap says "Capturing on" before the capture is live: probe until
    // the file grows past its header.
    let deadline = Instant::now() + PATIENCE;
    while std::fs::metadata(&pcap).map_or(0, |m| m.len()) <= 24 {
        assert!(Instant::now() < deadline, "capture never started");
        let _ = probe.send_to(b"probe", (GUEST_IP, PROBE_PORT));
        std::thread::sleep(Duration::from_millis(20));
    }

    let started = Instant::now();
    let mut client = Client::<Roce>::connect(URL, client_config()).expect("connect to knfsd");
    println!("linux peer client: connected in {:?}", started.elapsed());
    let long = vec![0xA5u8; 64 << 10];
    let xids = [
        (
            "v3-null",
            nfs_null(&mut client, 3, ReplyTarget::Inline, &[]),
        ),
        (
            "v4-null",
            nfs_null(&mut client, 4, ReplyTarget::Inline, &[]),
        ),
        (
            "v3-null-reply-chunk",
            nfs_null(&mut client, 3, ReplyTarget::ReplyChunk, &[]),
        ),
        (
            "v3-null-long-call",
            nfs_null(&mut client, 3, ReplyTarget::ReplyChunk, &long),
        ),
        (
            "v3-null-again",
            nfs_null(&mut client, 3, ReplyTarget::Inline, &[]),
        ),
        (
            "v4-null-again",
            nfs_null(&mut client, 4, ReplyTarget::Inline, &[]),
        ),
    ];
    let (reads, placed) = read_file1m(&mut client);
    println!(
        "linux peer client: read file1m (1 MiB, every byte checked) in {reads} READs, \
         {placed} through the write chunk"
    );
    let calls = list_dir(&mut client);
    println!("linux peer client: listed dir ({DIR_ENTRIES} entries) in {calls} READDIRs");
    // Every READ that returned data returned it by RDMA Write.
    assert!(
        placed >= reads - 1 && placed > 0,
        "{placed} of {reads} READs placed"
    );
    client.close().expect("close");

    // Capture buffers deliver in blocks: send an end marker until it is in
    // the file; everything before it is then in the file too.
    let marker = b"rpcrdma-linux-peer-end-marker";
    let deadline = Instant::now() + PATIENCE;
    loop {
        let _ = probe.send_to(marker, (GUEST_IP, PROBE_PORT));
        let now = std::fs::read(&pcap).unwrap_or_default();
        if now.windows(marker.len()).any(|w| w == marker) {
            break;
        }
        assert!(Instant::now() < deadline, "end marker never captured");
        std::thread::sleep(Duration::from_millis(50));
    }
    for (label, xid) in xids {
        println!("linux peer client: xid {xid} {label}");
    }
    println!("linux peer client: done");
}

/// Runs this test binary's `test` in the namespace with `ROLE_ENV=role`;
/// returns its stdout once it passed.
fn run_client(peer: &Peer, test: &str, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = peer
        .command(&exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, "client")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the client in the namespace");
    let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let read_all = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let (t_out, t_err) = (read_all(Box::new(out)), read_all(Box::new(err)));
    let deadline = Instant::now() + CLIENT_PATIENCE;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("client did not finish in {CLIENT_PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (t_out.join().unwrap(), t_err.join().unwrap());
    println!("--- client stdout:\n{out}--- stderr:\n{err}---");
    assert!(status.success(), "client in the namespace failed: {status}");
    assert!(
        out.contains("linux peer client: done"),
        "client did not run its role"
    );
    out
}

// ---------------------------------------------------------------------------
// The capture

/// dumpcap, stopped by [`Capture::finish`], killed on drop.
struct Capture(Child);

impl Capture {
    fn start(peer: &Peer, dumpcap: &Path, file: &Path) -> Capture {
        let mut cap = peer
            .command(dumpcap)
            .args(["-i", &peer.tap, "-f"])
            .arg(format!("udp port 4791 or udp port {PROBE_PORT}"))
            .args(["-P", "-w"])
            .arg(file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run dumpcap");
        let mut err = BufReader::new(cap.stderr.take().unwrap());
        let mut said = String::new();
        let mut line = String::new();
        while err.read_line(&mut line).unwrap_or(0) > 0 {
            if line.contains("Capturing on") {
                std::thread::spawn(move || {
                    let mut rest = String::new();
                    let _ = err.read_to_string(&mut rest);
                });
                return Capture(cap);
            }
            said.push_str(&line);
            line.clear();
        }
        let _ = cap.wait();
        panic!("dumpcap failed: {said}");
    }

    fn finish(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, Signal::SIGINT);
        let _ = wait_child(&mut self.0);
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// IPv4 packets of a pcap file (Ethernet link type), without the probes.
fn ip_packets(pcap: &[u8]) -> Vec<Vec<u8>> {
    assert!(pcap.len() >= 24, "pcap header");
    let le = pcap[0..4] == [0xd4, 0xc3, 0xb2, 0xa1];
    let rd32 = |b: &[u8]| {
        let a = [b[0], b[1], b[2], b[3]];
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    assert_eq!(rd32(&pcap[20..24]), 1, "Ethernet link type");
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let incl = rd32(&pcap[at + 8..at + 12]) as usize;
        let frame = &pcap[at + 16..at + 16 + incl];
        at += 16 + incl;
        if frame.len() < 14 + 28 || frame[12..14] != [0x08, 0x00] {
            continue;
        }
        let ipf = &frame[14..];
        if u16::from_be_bytes([ipf[22], ipf[23]]) != PROBE_PORT {
            out.push(ipf.to_vec());
        }
    }
    out
}

/// One RoCE packet of the capture, decoded by our own codecs.
struct Seen {
    from_linux: bool,
    /// The UDP payload (BTH .. ICRC).
    roce: Vec<u8>,
}

impl Seen {
    fn packet(&self) -> RocePacket<'_> {
        RocePacket::parse(&self.roce).expect("RoCE packet")
    }
    fn mad(&self) -> Option<CmMad<'_>> {
        let p = self.packet();
        (p.bth.dest_qpn == GSI_QPN).then(|| CmMad::parse(p.payload).expect("CM MAD"))
    }
}

fn roce_packets(ips: &[Vec<u8>]) -> Vec<Seen> {
    let guest: std::net::Ipv4Addr = GUEST_IP.parse().unwrap();
    ips.iter()
        .filter(|ip| ip[9] == 17 && u16::from_be_bytes([ip[22], ip[23]]) == 4791)
        .map(|ip| {
            let ihl = (ip[0] & 0x0F) as usize * 4;
            Seen {
                from_linux: ip[12..16] == guest.octets(),
                roce: ip[ihl + 8..].to_vec(),
            }
        })
        .collect()
}

fn tshark(tshark: &Path, file: &Path, args: &[&str]) -> String {
    let out = Command::new(tshark)
        .arg("-r")
        .arg(file)
        .args(args)
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Checks every capture gets: each ICRC, Linux's and ours, as our codec
/// computes it; nothing tshark calls malformed, no expert error. Returns
/// the RoCE packets.
fn check_frames(tshark_bin: &Path, file: &Path) -> Vec<Seen> {
    let ips = ip_packets(&std::fs::read(file).expect("capture file"));
    for (i, p) in ips.iter().enumerate() {
        if p[9] == 17 && u16::from_be_bytes([p[22], p[23]]) == 4791 {
            assert_eq!(icrc::verify_frame(p), Ok(true), "ICRC of IP packet {i}");
        }
    }
    let bad = tshark(
        tshark_bin,
        file,
        &["-Y", "_ws.malformed || _ws.expert.severity == error"],
    );
    assert!(bad.trim().is_empty(), "malformed or expert errors:\n{bad}");
    let verbose = tshark(tshark_bin, file, &["-V"]);
    for bad in ["Malformed", "[Expert Info (Error"] {
        assert!(!verbose.contains(bad), "{bad} in tshark -V output");
    }
    roce_packets(&ips)
}

/// The connection as both kernels' rules want it: REQ, REP, RTU from the
/// right sides; the first data packet each way at the Starting PSN that
/// the *receiving* side announced (each side announces the PSN it expects,
/// as Linux's cm.c loads it); no NAK either way. Returns the REQ and the
/// REP.
fn check_connection(seen: &[Seen], linux_is_client: bool) -> (&Seen, &Seen) {
    let cm: Vec<(bool, &'static str)> = seen
        .iter()
        .filter_map(|s| Some((s.from_linux, cm_name(&s.mad()?.message))))
        .collect();
    println!("CM messages (from_linux, name): {cm:?}");
    let c = linux_is_client;
    assert!(cm.len() >= 3, "CM handshake: {cm:?}");
    assert_eq!(
        cm[..3],
        [(c, "REQ"), (!c, "REP"), (c, "RTU")],
        "CM handshake"
    );
    assert!(
        cm.iter().any(|&(_, m)| m == "DREQ"),
        "a DREQ at close: {cm:?}"
    );
    let mad_of = |from_linux: bool, want: &str| {
        seen.iter()
            .find(|s| {
                s.from_linux == from_linux && s.mad().is_some_and(|m| cm_name(&m.message) == want)
            })
            .expect(want)
    };
    let req_seen = mad_of(c, "REQ");
    let rep_seen = mad_of(!c, "REP");
    let (CmMessage::Req(req), CmMessage::Rep(rep)) = (
        req_seen.mad().unwrap().message,
        rep_seen.mad().unwrap().message,
    ) else {
        unreachable!()
    };
    let rc = |from_linux: bool| {
        seen.iter()
            .filter(|s| s.from_linux == from_linux)
            .map(|s| s.packet())
            .filter(|p| p.bth.dest_qpn != GSI_QPN)
            .collect::<Vec<_>>()
    };
    let first_data = |from_linux: bool| {
        rc(from_linux)
            .into_iter()
            .find(|p| p.bth.opcode != Opcode::RcAcknowledge)
            .unwrap_or_else(|| panic!("no data packet (from_linux {from_linux})"))
    };
    // The client (REQ sender) sends from the REP's Starting PSN, to the
    // REP's QPN; the server from the REQ's, to the REQ's QPN.
    let from_client = first_data(c);
    assert_eq!(
        (from_client.bth.dest_qpn, from_client.bth.psn),
        (rep.local_qpn, rep.starting_psn),
        "the client's first data packet: to the REP's QPN at its Starting PSN"
    );
    let from_server = first_data(!c);
    assert_eq!(
        (from_server.bth.dest_qpn, from_server.bth.psn),
        (req.local_qpn, req.starting_psn),
        "the server's first data packet: to the REQ's QPN at its Starting PSN"
    );
    for p in rc(true).iter().chain(rc(false).iter()) {
        if let Some(a) = p.aeth {
            assert!(
                matches!(a.syndrome, Syndrome::Ack { .. }),
                "a NAK on the wire: {p:?}"
            );
        }
    }
    println!(
        "Starting PSNs: REQ {:#08x}, REP {:#08x}; {} packets from us, {} from Linux",
        req.starting_psn.value(),
        rep.starting_psn.value(),
        rc(false).len(),
        rc(true).len()
    );
    (req_seen, rep_seen)
}

/// Our client against knfsd: [`check_frames`], [`check_connection`], each
/// call and its reply as tshark decodes them, and the chunk traffic the
/// long call and the reply chunk caused.
fn check_client_capture(tshark_bin: &Path, file: &Path, xids: &[(u32, String)]) {
    let seen = check_frames(tshark_bin, file);
    // tshark saw each call and its reply as RPC (NFS) with our XIDs.
    let rpc = tshark(
        tshark_bin,
        file,
        &[
            "-Y",
            "rpc",
            "-T",
            "fields",
            "-e",
            "ip.src",
            "-e",
            "rpc.xid",
            "-e",
            "rpc.msgtyp",
        ],
    );
    let rdma = tshark(
        tshark_bin,
        file,
        &[
            "-Y",
            "rpcordma",
            "-T",
            "fields",
            "-e",
            "ip.src",
            "-e",
            "rpcordma.xid",
            "-e",
            "rpcordma.msg_type",
            "-e",
            "rpcordma.reply_count",
        ],
    );
    // (source, XID) -> (message type, reply chunks offered).
    let header = |src: &str, hex: &str| {
        rdma.lines()
            .map(|l| l.split('\t').collect::<Vec<_>>())
            .find(|f| f.len() == 4 && f[0] == src && f[1] == hex)
            .map(|f| (f[2].to_owned(), f[3].to_owned()))
    };
    for (xid, label) in xids {
        let hex = format!("0x{xid:08x}");
        let seen = |src: &str, typ: &str| {
            rpc.lines().any(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                f.len() == 3
                    && f[0] == src
                    && f[1].split(',').any(|x| x == hex)
                    && f[2].split(',').any(|t| t == typ)
            })
        };
        if label.contains("long-call") {
            // The call itself travelled in RDMA Read responses, which
            // tshark does not reassemble: its RPC-over-RDMA header must
            // be there, RDMA_NOMSG (1) with our XID.
            assert_eq!(
                header(HOST_IP, &hex).map(|h| h.0),
                Some("1".to_owned()),
                "{label}: no RDMA_NOMSG call {hex}:\n{rdma}"
            );
        } else {
            assert!(
                seen(HOST_IP, "0"),
                "{label}: tshark shows no call {hex}:\n{rpc}"
            );
        }
        assert!(
            seen(GUEST_IP, "1"),
            "{label}: tshark shows no reply {hex}:\n{rpc}"
        );
        // A call that expects an inline reply offers no reply chunk, and
        // Linux answers it inline (RDMA_MSG); offered a reply chunk, Linux
        // always uses it: RDMA Writes, then RDMA_NOMSG.
        let inline = !label.contains("reply-chunk") && !label.contains("long-call");
        let (call_chunks, reply_type) = if inline { ("0", "0") } else { ("1", "1") };
        assert_eq!(
            header(HOST_IP, &hex).map(|h| h.1),
            Some(call_chunks.to_owned()),
            "{label}: reply chunks offered:\n{rdma}"
        );
        assert_eq!(
            header(GUEST_IP, &hex).map(|h| h.0),
            Some(reply_type.to_owned()),
            "{label}: Linux's reply type:\n{rdma}"
        );
    }

    let (_, rep_seen) = check_connection(&seen, false);
    let rc = |from_linux: bool| {
        seen.iter()
            .filter(|s| s.from_linux == from_linux)
            .map(|s| s.packet())
            .filter(|p| p.bth.dest_qpn != GSI_QPN)
            .collect::<Vec<_>>()
    };
    let (ours, linux) = (rc(false), rc(true));
    let has = |v: &[RocePacket<'_>], o: Opcode| v.iter().any(|p| p.bth.opcode == o);
    assert!(
        has(&linux, Opcode::RcReadRequest),
        "knfsd pulled the long call"
    );
    assert!(
        has(&ours, Opcode::RcReadResponseFirst),
        "we answered its Reads"
    );
    assert!(
        linux
            .iter()
            .any(|p| matches!(p.bth.opcode, Opcode::RcWriteOnly | Opcode::RcWriteFirst)),
        "knfsd wrote a reply chunk"
    );
    // The 1 MiB file came by RDMA Writes: at MTU 1024, over a thousand
    // Write packets from Linux, and READ replies naming one write chunk.
    let writes = linux
        .iter()
        .filter(|p| {
            matches!(
                p.bth.opcode,
                Opcode::RcWriteFirst
                    | Opcode::RcWriteMiddle
                    | Opcode::RcWriteLast
                    | Opcode::RcWriteOnly
            )
        })
        .count();
    assert!(writes > 1024, "{writes} RDMA Write packets from Linux");
    let read_replies = tshark(
        tshark_bin,
        file,
        &[
            "-Y",
            "rpcordma && ip.src == 198.18.0.2 && rpcordma.writes_count == 1",
        ],
    );
    assert!(
        read_replies.lines().count() >= 4,
        "READ replies with a write chunk:\n{read_replies}"
    );

    if let Some(path) = std::env::var_os("RPCRDMA_SAVE_LINUX_REP") {
        let hex: String = rep_seen
            .roce
            .chunks(16)
            .map(|c| c.iter().map(|b| format!("{b:02x}")).collect::<String>() + "\n")
            .collect();
        std::fs::write(&path, hex).expect("write the REP");
        println!("Linux's REP saved to {}", Path::new(&path).display());
    }
}

fn cm_name(m: &CmMessage<'_>) -> &'static str {
    match m {
        CmMessage::Req(_) => "REQ",
        CmMessage::Rep(_) => "REP",
        CmMessage::Rtu(_) => "RTU",
        CmMessage::Dreq(_) => "DREQ",
        CmMessage::Drep(_) => "DREP",
        CmMessage::Rej(_) => "REJ",
        CmMessage::Mra(_) => "MRA",
    }
}

fn keep_pcap(file: &Path, name: &str) {
    if std::env::var_os("KEEP_PCAP").is_some() {
        let keep = std::env::temp_dir().join(format!("{name}-{}.pcap", std::process::id()));
        std::fs::copy(file, &keep).unwrap();
        println!("capture kept: {}", keep.display());
    }
}

/// Our `Client::<Roce>` (in the namespace) against knfsd in the guest.
fn our_client_against_knfsd(peer: &Peer, tshark_bin: &Path) {
    let started = Instant::now();
    let dumpcap = tshark_bin.with_file_name("dumpcap");
    let file = peer.dir.join("client.pcap");
    let cap = Capture::start(peer, &dumpcap, &file);
    let out = run_client(peer, TEST, &[(PCAP_ENV, file.to_str().unwrap())]);
    cap.finish();
    let xids: Vec<(u32, String)> = out
        .lines()
        .filter_map(|l| {
            let rest = l.split("linux peer client: xid ").nth(1)?;
            let mut w = rest.split(' ');
            Some((w.next()?.parse().ok()?, w.next()?.to_owned()))
        })
        .collect();
    assert_eq!(xids.len(), 6, "{out}");
    keep_pcap(&file, "linux-peer-client");
    check_client_capture(tshark_bin, &file, &xids);
    // knfsd saw them: its RPC counters moved (the guest's own view).
    let (rc, stats, err) = peer.run("cat /proc/net/rpc/nfsd");
    assert_eq!(rc, Some(0), "{err}");
    println!("knfsd /proc/net/rpc/nfsd:\n{stats}");
    // "procN COUNT NULL ...": four version 3 NULLs, two version 4 NULLs.
    let nulls = |v: &str| {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{v} ")))
            .and_then(|r| r.split(' ').nth(1)?.parse::<u64>().ok())
    };
    assert_eq!(
        (nulls("proc3"), nulls("proc4")),
        (Some(4), Some(2)),
        "{stats}"
    );
    println!(
        "our client against knfsd: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// `GET /metrics` of a daemon listening inside the namespace: from a
/// thread that joined the namespace (setns changes only the calling
/// thread), so no traffic leaves it.
fn metrics_in(peer: &Peer, addr: &str) -> String {
    let ns = PathBuf::from("/run/netns").join(&peer.ns);
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    std::thread::spawn(move || {
        let f = std::fs::File::open(&ns).expect("namespace file");
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        http_get(addr, "/metrics").1
    })
    .join()
    .unwrap()
}

/// Sends an end marker to the guest's discard port (from a thread inside
/// the namespace) until the capture file holds it.
fn mark_capture_end(peer: &Peer, pcap: &Path) {
    let ns = PathBuf::from("/run/netns").join(&peer.ns);
    let pcap = pcap.to_owned();
    std::thread::spawn(move || {
        let f = std::fs::File::open(&ns).expect("namespace file");
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let probe = std::net::UdpSocket::bind((HOST_IP, 0)).unwrap();
        let marker = b"rpcrdma-linux-peer-end-marker";
        let deadline = Instant::now() + PATIENCE;
        loop {
            let _ = probe.send_to(marker, (GUEST_IP, PROBE_PORT));
            let now = std::fs::read(&pcap).unwrap_or_default();
            if now.windows(marker.len()).any(|w| w == marker) {
                break;
            }
            assert!(Instant::now() < deadline, "end marker never captured");
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .join()
    .unwrap()
}

fn metric(body: &str, name: &str) -> u64 {
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The guest's Linux NFS/RDMA client against our `rpcrdmad` (in the
/// namespace, `roce://198.18.0.1:20049`). The daemon serves no NFS, so the
/// kernel's NULL ping is answered PROG_UNAVAIL and the mount fails the way
/// the kernel maps that (EPFNOSUPPORT, "Protocol family not supported").
/// NFSv4.0 because a version 3 mount asks mountd (over TCP) first and
/// would never reach the RDMA transport.
fn linux_client_against_rpcrdmad(peer: &Peer, tshark_bin: &Path) {
    const METRICS: &str = "198.18.0.1:19491";
    let started = Instant::now();
    let dumpcap = tshark_bin.with_file_name("dumpcap");
    let file = peer.dir.join("server.pcap");
    let cap = Capture::start(peer, &dumpcap, &file);
    let cfg = write_file(
        &peer.dir,
        "rpcrdmad.toml",
        &format!(
            "[[listeners]]\nurl = \"roce://{HOST_IP}:20049\"\n\n[workers]\ncores = [0]\n\
             idle = \"adaptive\"\n\n[metrics]\naddress = \"{METRICS}\"\n\n\
             [rpcbind]\nregister = false\n\n[memory]\nhugepages = \"off\"\n"
        ),
    );
    let mut cmd = peer.command(Path::new(BIN));
    cmd.arg("--config").arg(&cfg).env("RPCRDMAD_LOG", "debug");
    let mut d = Daemon::spawn_command(cmd);
    d.wait_for_line("started");
    let (rc, out, err) = peer.run(
        "modprobe -a nfsv4 && mkdir -p /mnt && \
         mount -t nfs -o rdma,port=20049,vers=4.0,retry=0 198.18.0.1:/ /mnt",
    );
    println!("guest mount: exit {rc:?}\n{out}{err}");
    assert_eq!(rc, Some(32), "mount.nfs fails (32: mount failure)");
    assert!(
        err.contains("Protocol family not supported"),
        "PROG_UNAVAIL, as sunrpc maps it: {err}"
    );
    d.wait_for_line("connection handed to worker");
    // The kernel disconnects after the failed ping: wait until the daemon
    // saw the DREQ (its open-connection gauge back to 0).
    let deadline = Instant::now() + PATIENCE;
    let body = loop {
        let body = metrics_in(peer, METRICS);
        if metric(&body, "rpcrdma_listener_connections{") == 0 {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "connection never closed:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        metric(&body, "rpcrdma_listener_connections_total") >= 1,
        "{body}"
    );
    assert!(metric(&body, "rpcrdma_worker_rpcs_total") >= 1, "{body}");
    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait().code(), Some(0), "{}", d.stderr());
    // An end marker until the capture holds it, and so everything before.
    mark_capture_end(peer, &file);
    cap.finish();
    keep_pcap(&file, "linux-peer-server");

    let seen = check_frames(tshark_bin, &file);
    check_connection(&seen, true);
    // The kernel's NULL (program 100003, version 4, procedure 0) and our
    // PROG_UNAVAIL (accept_stat 1) with its XID.
    let rpc = tshark(
        tshark_bin,
        &file,
        &[
            "-Y",
            "rpc",
            "-T",
            "fields",
            "-e",
            "ip.src",
            "-e",
            "rpc.xid",
            "-e",
            "rpc.msgtyp",
            "-e",
            "rpc.program",
            "-e",
            "rpc.programversion",
            "-e",
            "rpc.procedure",
            "-e",
            "rpc.state_accept",
        ],
    );
    println!("RPC messages:\n{rpc}");
    // A field tshark shows twice (the NFS layer repeats the version) is
    // compared by its first value.
    let rows: Vec<Vec<&str>> = rpc
        .lines()
        .map(|l| {
            l.split('\t')
                .map(|f| f.split(',').next().unwrap_or(""))
                .collect()
        })
        .collect();
    let call = rows
        .iter()
        .find(|f| f[0] == GUEST_IP && f[2] == "0")
        .expect("the kernel's call");
    assert_eq!(&call[3..6], ["100003", "4", "0"], "NFSv4 NULL");
    let reply = rows
        .iter()
        .find(|f| f[0] == HOST_IP && f[2] == "1" && f[1] == call[1])
        .expect("our reply with the call's XID");
    assert_eq!(reply[6], "1", "PROG_UNAVAIL");
    println!(
        "Linux client against rpcrdmad: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

const TEST: &str = "linux_kernel_peer";

/// One guest, both directions.
#[test]
fn linux_kernel_peer() {
    if std::env::var(ROLE_ENV).as_deref() == Ok("client") {
        return client_role();
    }
    let started = Instant::now();
    let Some(peer) = Peer::up() else {
        return;
    };
    let tshark_bin = find_tool("tshark").unwrap();
    our_client_against_knfsd(&peer, &tshark_bin);
    linux_client_against_rpcrdmad(&peer, &tshark_bin);
    drop(peer);
    println!(
        "linux peer test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
