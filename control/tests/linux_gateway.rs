//! The Linux kernel's NFS/RDMA client through the storage gateway: a
//! `deploy/linux-peer` guest (Debian's kernel in qemu, rdma_rxe on its
//! NIC) mounts from `rpcrdmad`, whose `[[gateway]]` routes relay its calls
//! over TCP to nfs-ganesha. Everything on the host side runs in the
//! guest's network namespace (198.18.0.1): rpcbind and ganesha
//! (`GaneshaBackend::start_in_netns`, its own mount namespace for
//! `/run`), and `rpcrdmad` with a `roce://198.18.0.1:20049` listener.
//!
//! ```text
//!   guest 198.18.0.2                         host side 198.18.0.1
//!   mount.nfs ---- rpcbind GETPORT MOUNT/tcp ---> rpcbind :111
//!             ---- MNT over TCP ------------------> ganesha :20048
//!   NFS, NFSACL -- RPC-over-RDMA (rxe) ----------> rpcrdmad :20049
//!                                                    | TCP
//!                                                    v
//!                                                  ganesha :2049
//! ```
//!
//! * `linux_nfs3_over_rdma_through_the_gateway`: `mount -t nfs -o
//!   vers=3,proto=rdma,port=20049`: the mount helper finds MOUNT in the
//!   host side's rpcbind and gets the root handle from ganesha over TCP;
//!   every NFS and NFSACL call then comes over RDMA to the gateway. A
//!   64 MiB file written with dd (bs=1M, conv=fsync) has on ganesha's
//!   export the SHA-256 of its source, and so does what the guest reads
//!   back after a remount and a cache drop (READ results in the client's
//!   write chunks); `ls -l` of a 2,000-entry directory made on the export
//!   lists every entry; the umount is clean; the gateway's metrics count
//!   the relayed calls and no error. The daemon runs with every
//!   RPC-over-RDMA extension in `transport.extensions`: the Linux client
//!   speaks plain Version One and never asks for one, so it must not see
//!   one. The session passes as without them, and a capture of it on the
//!   guest's link (dumpcap, headers only) has thousands of RPC-over-RDMA
//!   headers each way and none of message type 5 (RDMA_OPTIONAL) or
//!   beyond. The NFSv4.1 test keeps the default, none.
//! * `linux_nfs41_over_rdma_through_the_gateway`: the same with
//!   `vers=4.1` from ganesha's pseudo path `/export` (no MOUNT protocol):
//!   READ and READDIR travel in COMPOUNDs after SEQUENCE and PUTFH, and
//!   the READ results must still be placed in the client's write chunks
//!   (RFC 8267 s5); no NFSACL (NFSv4 carries ACLs as attributes).
//!
//! Needs what `deploy/linux-peer` and the ganesha backend need (root,
//! qemu, busybox-static, the NFS/RDMA userland, nfs-ganesha and its VFS
//! FSAL, rpcbind, iproute2, util-linux), and dumpcap (wireshark) for the
//! NFSv3 test. The real-peer rule applies. On
//! drop, panics included, the guest unmounts (bounded), the daemon and
//! the backend are killed, the guest is powered off and the namespace
//! deleted.
#[path = "../../dataplane/tests/support/ganesha.rs"]
mod ganesha;
#[path = "../../dataplane/tests/support/linux_guest.rs"]
mod linux_guest;
mod support;

use std::net::SocketAddr;

use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use ganesha::{GaneshaBackend, RpcTcp, MAX_IO};
use linux_guest::Guest;
use nix::sys::signal::Signal;
use support::{find_tool, http_get, ip_packets, skip, write_file, Capture, Daemon, BIN};

/// The host side of the guest's link (deploy/linux-peer).
const HOST: &str = "198.18.0.1";
/// The gateway's NFS/RDMA port.
const PORT: u16 = 20049;
/// The gateway's metrics, inside the namespace.
const METRICS: &str = "127.0.0.1:19495";
/// Where the guest mounts.
const MNT: &str = "/mnt/gw";
/// The file written and read back, in MiB.
const BIG_MIB: usize = 64;
/// Entries of the directory `ls -l` lists.
const DIR_ENTRIES: usize = 2000;
/// The daemon's largest message: a 1 MiB READ or WRITE and its headers.
const MAX_MESSAGE: u32 = MAX_IO + 4096;

/// How long one guest command may take before it counts as stuck. Each
/// command bounds itself with `timeout` well below this; this only
/// catches a guest that stopped running jobs.
const GUEST_COMMAND_DEADLINE: Duration = Duration::from_secs(900);

/// The daemon's configuration: one RoCE listener on the host side of the
/// link; NFS (v3 and v4) and NFSACL to ganesha's port (ganesha answers
/// NFSACL there without registering it); MOUNT is not routed: the guest
/// asks rpcbind and calls ganesha over TCP itself. The routed programs
/// are registered under `rdma` with the namespace's rpcbind. `extensions`
/// is the value of `transport.extensions`.
fn gateway_config(extensions: &str) -> String {
    let nfs = ganesha::NFS_PORT;
    format!(
        "[workers]\ncores = [0]\nidle = \"adaptive\"\n\n\
         [[listeners]]\nurl = \"roce://{HOST}:{PORT}\"\n\n\
         [transport]\nmax_message = {MAX_MESSAGE}\nextensions = {extensions}\n\n\
         [[gateway]]\nprogram = 100003\nversions = [3, 4]\nbackend = \"127.0.0.1:{nfs}\"\nconnections = 2\n\n\
         [[gateway]]\nprogram = 100227\nversions = [3]\nbackend = \"127.0.0.1:{nfs}\"\n\n\
         [rpcbind]\nregister = true\naddress = \"/run/rpcbind.sock\"\n\n\
         [metrics]\nenabled = true\naddress = \"{METRICS}\"\n"
    )
}

/// The guest, the backend in its namespace and the gateway, torn down in
/// that order's reverse (fields drop in declaration order): the guest
/// unmounts first (in [`Drop`]), then the daemon and ganesha are killed,
/// then the guest is powered off and the namespace deleted.
struct Setup {
    daemon: Daemon,
    backend: GaneshaBackend,
    guest: Guest,
    mounted: bool,
    /// Held until the guest is gone (the last field drops last).
    _one_at_a_time: MutexGuard<'static, ()>,
}

/// One guest at a time: the tests of this binary run on parallel threads,
/// and two TCG guests and their gateways would share the CI host's two
/// cores for no gain.
static GUEST_LOCK: Mutex<()> = Mutex::new(());

/// Every extension, by name, in `transport.extensions`: the NFSv3 test's
/// daemon offers them all, and the Linux client, which speaks plain
/// Version One (it never calls CONF_RDMA version 2), must not notice.
const ALL_EXTENSIONS: &str =
    r#"["message_continuation", "responder_read_chunks", "remote_invalidate", "send_placement"]"#;

impl Setup {
    /// Boots the guest, starts ganesha and rpcbind in its namespace, puts
    /// the test directory on the export, and starts the gateway with
    /// `transport.extensions = extensions`. `None` when skipped (the
    /// real-peer rule).
    fn start(name: &str, extensions: &str) -> Option<Setup> {
        let one_at_a_time = GUEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let guest = Guest::boot(name)?;
        let backend = GaneshaBackend::start_in_netns(name, guest.netns())?;
        let export = backend.export_dir();
        std::fs::create_dir(export.join("many")).unwrap();
        for i in 0..DIR_ENTRIES {
            std::fs::write(export.join(format!("many/entry-{i:04}")), b"").unwrap();
        }
        let cfg = write_file(guest.dir(), "gateway.toml", &gateway_config(extensions));
        let mut cmd = backend.command(BIN);
        cmd.arg("--config").arg(&cfg);
        let mut daemon = Daemon::spawn_command(cmd);
        daemon.wait_for_line("started");
        Some(Setup {
            daemon,
            backend,
            guest,
            mounted: false,
            _one_at_a_time: one_at_a_time,
        })
    }

    /// Runs `cmd` in the guest: (exit status of the job, its output).
    fn run(&self, cmd: &str) -> (bool, String) {
        self.guest.run(cmd, GUEST_COMMAND_DEADLINE)
    }

    /// Runs `cmd` in the guest, which must succeed; its output.
    fn must(&self, cmd: &str) -> String {
        let (ok, out) = self.run(cmd);
        assert!(ok, "guest: {cmd}:\n{out}");
        out
    }

    /// Mounts `path` with `opts` on [`MNT`] (bounded: `timeout 120`);
    /// Err(output) when the mount fails or hangs.
    fn mount(&mut self, opts: &str, path: &str) -> Result<String, String> {
        let (_, out) = self.run(&format!(
            "mkdir -p {MNT}; timeout 120 mount -v -t nfs -o {opts} {HOST}:{path} {MNT}; \
             echo mount-exit=$?; grep ' {MNT} ' /proc/mounts"
        ));
        match exit_code(&out, "mount-exit") {
            0 => {
                self.mounted = true;
                Ok(out)
            }
            _ => Err(out),
        }
    }

    /// Unmounts [`MNT`], which must succeed at once (exit 0, no hang).
    fn umount(&mut self) {
        let (_, out) = self.run(&format!("timeout 120 umount {MNT}; echo umount-exit=$?"));
        assert_eq!(exit_code(&out, "umount-exit"), 0, "umount: {out}");
        self.mounted = false;
    }

    /// The gateway's `/metrics`.
    fn metrics(&self) -> String {
        let addr: SocketAddr = METRICS.parse().unwrap();
        let (status, body) = self.backend.in_netns(move || http_get(addr, "/metrics"));
        assert!(status.contains("200"), "{status}");
        body
    }

    /// What the guest's kernel said lately, and the RDMA device's counters.
    fn guest_state(&self) -> String {
        self.run(
            "dmesg | tail -40; rdma statistic show link rxe0/1; \
             grep -E '^\\s+(xprt|[A-Z_]+):' /proc/self/mountstats | grep -v ': 0 0 0 0 0'",
        )
        .1
    }

    /// The non-zero samples of `/metrics` (no histogram buckets).
    fn gateway_metrics(&self) -> String {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with("rpcrdma_") && !l.contains("_bucket") && !l.ends_with(" 0"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Panics with `what`, the guest's state, the gateway's counters and
    /// the daemon's log: what explains a failure.
    fn fail(&self, what: &str) -> ! {
        panic!(
            "{what}\nguest:\n{}\ngateway metrics:\n{}\nrpcrdmad:\n{}",
            self.guest_state(),
            self.gateway_metrics(),
            self.daemon.stderr()
        )
    }

    /// The relay counters of `program`: (calls, replies, errors).
    fn relayed(&self, program: u32) -> (u64, u64, u64) {
        let body = self.metrics();
        let get = |name: &str| sum_metric(&body, &format!("{name}{{program=\"{program}\""));
        (
            get("rpcrdma_gateway_calls_total"),
            get("rpcrdma_gateway_replies_total"),
            get("rpcrdma_gateway_errors_total"),
        )
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if self.mounted {
            // Lazy and forced: a failed test must not hang here.
            let _ = self.guest.run(
                &format!("timeout 30 umount -f -l {MNT}"),
                Duration::from_secs(60),
            );
        }
    }
}

/// The number after `NAME=` in `out`; panics when there is none.
fn exit_code(out: &str, name: &str) -> i32 {
    out.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in: {out}"))
}

/// The sum of every sample whose line starts with `prefix` (the name and
/// the first labels).
fn sum_metric(body: &str, prefix: &str) -> u64 {
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The first word of `sha256sum FILE`'s line for `file` in `out`.
fn sha_of(out: &str, file: &str) -> String {
    out.lines()
        .find(|l| l.trim_end().ends_with(file))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no checksum of {file} in: {out}"))
        .to_owned()
}

/// SHA-256 of a file on the host, by coreutils' sha256sum.
fn host_sha256(path: &std::path::Path) -> String {
    let out = Command::new(find_tool("sha256sum").expect("sha256sum (coreutils)"))
        .arg(path)
        .output()
        .expect("run sha256sum");
    assert!(out.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// The session both NFS versions run once mounted with `opts` from
/// `path`: the 64 MiB file written and read back, the directory listed,
/// the umount. Returns the file's SHA-256.
fn file_and_directory_session(s: &mut Setup, opts: &str, path: &str) -> String {
    // Written from a source in the guest's memory, with its checksum.
    let out = s.must(&format!(
        "head -c {BIG_MIB}M /dev/urandom > /tmp/big.src && sha256sum /tmp/big.src && \
         timeout 600 dd if=/tmp/big.src of={MNT}/big bs=1M conv=fsync 2>&1; echo dd-exit=$?"
    ));
    println!("guest dd:\n{out}");
    if exit_code(&out, "dd-exit") != 0 {
        s.fail(&format!("dd to the mount: {out}"));
    }
    let source = sha_of(&out, "/tmp/big.src");
    let on_export = s.backend.export_dir().join("big");
    let size = std::fs::metadata(&on_export)
        .expect("big on the export")
        .len();
    assert_eq!(
        size,
        (BIG_MIB << 20) as u64,
        "size of big on ganesha's export"
    );
    let exported = host_sha256(&on_export);
    assert_eq!(exported, source, "big on ganesha's export");

    // Read back from the server, not the page cache: a new mount after
    // the caches are dropped.
    s.umount();
    s.must("sync; echo 3 > /proc/sys/vm/drop_caches");
    if let Err(out) = s.mount(opts, path) {
        s.fail(&format!("remount: {out}"));
    }
    let out = s.must(&format!(
        "timeout 600 sha256sum {MNT}/big; echo sha-exit=$?; stat -c 'size=%s' {MNT}/big"
    ));
    if exit_code(&out, "sha-exit") != 0 {
        s.fail(&format!("read back: {out}"));
    }
    assert_eq!(sha_of(&out, &format!("{MNT}/big")), source, "big read back");
    println!("{BIG_MIB} MiB written and read back through the gateway: sha256 {source}");

    // ls -l: READDIRPLUS (long replies in reply chunks), and for an NFSv3
    // mount NFSACL GETACL per file.
    let out = s.must(&format!(
        "timeout 300 ls -l {MNT}/many > /tmp/ls.out; echo ls-exit=$?; \
         grep -c ' entry-' /tmp/ls.out; wc -l < /tmp/ls.out"
    ));
    if exit_code(&out, "ls-exit") != 0 {
        s.fail(&format!("ls -l: {out}"));
    }
    let counts: Vec<usize> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(
        counts,
        [DIR_ENTRIES, DIR_ENTRIES + 1],
        "entries and lines (with `total`) of ls -l: {out}"
    );
    println!("ls -l listed {DIR_ENTRIES} entries");
    s.umount();
    source
}

/// What the gateway's metrics must show after a session: the file's data
/// relayed both ways (the WRITEs' arguments to ganesha, the READs'
/// results back, placed by RDMA Write), every NFS call (and with
/// `nfsacl`, NFSACL call: the v3 client's GETACL for each file `ls -l`
/// shows) answered, no relay error, no data-path error but the
/// disconnects below, one RDMA connection per mount.
fn check_relay(s: &Setup, nfsacl: bool) {
    let (calls, replies, errors) = s.relayed(100_003);
    let (acl_calls, acl_replies, acl_errors) = s.relayed(100_227);
    println!(
        "relayed: NFS {calls} calls, {replies} replies, {errors} errors; \
         NFSACL {acl_calls} calls, {acl_replies} replies, {acl_errors} errors"
    );
    // 64 WRITEs and 64 READs of 1 MiB at least, and what else the client
    // needed.
    assert!(calls >= 2 * BIG_MIB as u64, "NFS calls relayed: {calls}");
    assert_eq!(calls, replies, "every NFS call answered");
    assert_eq!(errors, 0, "NFS relay errors\n{}", s.gateway_metrics());
    if nfsacl {
        assert!(acl_calls > 0, "no NFSACL call relayed");
    }
    assert_eq!(acl_calls, acl_replies, "every NFSACL call answered");
    assert_eq!(
        acl_errors,
        0,
        "NFSACL relay errors\n{}",
        s.gateway_metrics()
    );

    let body = s.metrics();
    let nfs = "{program=\"100003\"";
    let sent = sum_metric(&body, &format!("rpcrdma_gateway_bytes_sent_total{nfs}"));
    let received = sum_metric(&body, &format!("rpcrdma_gateway_bytes_received_total{nfs}"));
    println!("NFS record bytes to ganesha {sent}, from ganesha {received}");
    let big = (BIG_MIB << 20) as u64;
    assert!(sent >= big && received >= big, "{body}");
    // The kernel's disconnect at each umount (a CM DREQ) is the
    // connection's orderly end, not a lost connection: no data-path error
    // of any kind.
    let connections = sum_metric(&body, "rpcrdma_listener_connections_total");
    println!("RDMA connections {connections}");
    assert_eq!(connections, 2, "one RDMA connection per mount\n{body}");
    assert_eq!(
        sum_metric(&body, "rpcrdma_worker_errors_total"),
        0,
        "{body}"
    );
}

/// Bytes kept of each frame: Ethernet, IPv4, UDP, BTH, the largest
/// extension headers of a Send and the RPC-over-RDMA header's four fixed
/// words fit (86 bytes); the data does not need to be kept.
const SNAPLEN: &str = "128";

/// The message types of the RPC-over-RDMA Version One headers in a
/// capture, by sender: a header opens the first (or only) packet of every
/// Send, behind BTH and the opcode's extension headers (RFC 8166 s4.2:
/// XID, version, credits, message type). Counts indexed by type 0..=5
/// (5: anything from 5 up, where RDMA_OPTIONAL is 5), per direction
/// (0: from the guest, 1: to it).
fn rpcrdma_types(pcap: &[u8]) -> [[u64; 6]; 2] {
    use dataplane::wire::roce::Opcode;
    let mut counts = [[0u64; 6]; 2];
    for ip in ip_packets(pcap, 0) {
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        if ip[9] != 17 || ip.len() < ihl + 8 + 12 {
            continue;
        }
        let bth = &ip[ihl + 8..];
        let Some(op) = Opcode::from_u8(bth[0]) else {
            continue;
        };
        if !matches!(
            op,
            Opcode::RcSendFirst
                | Opcode::RcSendOnly
                | Opcode::RcSendOnlyImm
                | Opcode::RcSendOnlyInv
        ) {
            continue;
        }
        let at = 12 + op.headers().len();
        let Some(h) = bth.get(at..at + 16) else {
            continue;
        };
        let word = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        if word(4) != 1 {
            continue;
        }
        let from_guest = ip[12..16]
            == linux_guest::GUEST_IP
                .parse::<std::net::Ipv4Addr>()
                .unwrap()
                .octets();
        counts[usize::from(!from_guest)][word(12).min(5) as usize] += 1;
    }
    counts
}

#[test]
fn linux_nfs3_over_rdma_through_the_gateway() {
    let Some(dumpcap) = find_tool("dumpcap")
        .or_else(|| find_tool("tshark").map(|t| t.with_file_name("dumpcap")))
        .filter(|d| d.exists())
    else {
        return skip("dumpcap (wireshark) not installed");
    };
    let Some(mut s) = Setup::start("linux-gw-nfs3", ALL_EXTENSIONS) else {
        return;
    };
    // From before the mount to the end: the whole session with every
    // extension offered.
    let pcap = s.guest.dir().join("nfs3-session.pcap");
    let capture = Capture::start(
        s.guest.netns(),
        &dumpcap,
        "udp port 4791",
        Some(SNAPLEN),
        &pcap,
    );
    // What the guest's mount helper finds at the server's address: the
    // namespace's rpcbind maps MOUNT v3 over TCP to ganesha, so MNT goes
    // there straight (no MOUNT route in the gateway).
    let rpcbind: SocketAddr = format!("{HOST}:{}", ganesha::RPCBIND_PORT).parse().unwrap();
    let mount_port = s.backend.in_netns(move || {
        RpcTcp::connect(rpcbind)
            .map_err(|e| e.to_string())
            .and_then(|mut c| c.getport(100_005, 3, 6))
    });
    assert_eq!(
        mount_port,
        Ok(ganesha::MOUNT_PORT),
        "MOUNT v3/tcp in rpcbind"
    );

    let path = s.backend.export_path();
    let opts = format!("vers=3,proto=rdma,port={PORT}");
    let out = s
        .mount(&opts, &path)
        .unwrap_or_else(|out| s.fail(&format!("mount: {out}")));
    println!("guest {} mounted:\n{out}", linux_guest::GUEST_IP);
    for want in ["proto=rdma", "mountproto=tcp", &format!("mountaddr={HOST}")] {
        assert!(out.contains(want), "no {want} in the mount: {out}");
    }
    let (nfs_before, ..) = s.relayed(100_003);
    assert!(
        nfs_before > 0,
        "the mount made no NFS call through the gateway"
    );

    let sha = file_and_directory_session(&mut s, &opts, &path);
    capture.finish();

    check_relay(&s, true);
    // Both directions spoke RPC-over-RDMA Version One, and never with an
    // RDMA_OPTIONAL header (message type 5): the Linux client negotiated
    // no extension, so the daemon sent none (and Linux none either).
    let types = rpcrdma_types(&std::fs::read(&pcap).expect("the capture"));
    println!(
        "RPC-over-RDMA message types 0..=4, 5+ captured: from the guest {:?}, to it {:?}",
        types[0], types[1]
    );
    assert!(
        types[0][0] > 100 && types[1][0] > 100,
        "too few RDMA_MSG headers captured: {types:?}"
    );
    assert_eq!(
        (types[0][5], types[1][5]),
        (0, 0),
        "RDMA_OPTIONAL (type 5) or beyond on a Version One connection"
    );
    // The daemon ran with every extension offered.
    assert!(
        s.daemon.stderr().contains(
            "transport: extensions configured: \
             responder_read_chunks,remote_invalidate,message_continuation,send_placement; \
             offered to clients that negotiate with CONF_RDMA version 2: "
        ),
        "{}",
        s.daemon.stderr()
    );
    println!("sha256 of the 64 MiB file: {sha}");

    s.daemon.signal(Signal::SIGTERM);
    assert_eq!(s.daemon.wait().code(), Some(0), "{}", s.daemon.stderr());
}

/// NFSv4.1 over RDMA through the gateway: no MOUNT protocol (the pseudo
/// path `/export` of ganesha's export), only NFS COMPOUNDs (SEQUENCE,
/// PUTFH, READ and so on), whose READ results the gateway must place in
/// the client's write chunk as it does for NFSv3.
#[test]
fn linux_nfs41_over_rdma_through_the_gateway() {
    let Some(mut s) = Setup::start("linux-gw-nfs41", "[]") else {
        return;
    };
    let opts = format!("vers=4.1,proto=rdma,port={PORT}");
    let out = s
        .mount(&opts, "/export")
        .unwrap_or_else(|out| s.fail(&format!("mount: {out}")));
    println!("guest mounted:\n{out}");
    assert!(out.contains("proto=rdma"), "not an RDMA mount: {out}");
    let sha = file_and_directory_session(&mut s, &opts, "/export");
    check_relay(&s, false);
    println!("sha256 of the 64 MiB file: {sha}");
    s.daemon.signal(Signal::SIGTERM);
    assert_eq!(s.daemon.wait().code(), Some(0), "{}", s.daemon.stderr());
}
