//! nfs-ganesha as a real NFSv3 backend, in namespaces of its own.
//!
//! [`GaneshaBackend::start`] makes a fresh network namespace (`lo` only)
//! and, inside it, a private mount namespace whose `/run` is an empty
//! tmpfs. rpcbind runs there, so its fixed socket path
//! (`/run/rpcbind.sock`) and port 111 are the test's own and the host's
//! rpcbind is never touched; ganesha.nfsd joins the same two namespaces
//! (ganesha will not start without an rpcbind to register with) and serves
//! one export, a scratch directory the test owns, with the VFS FSAL. The
//! backend is ready once rpcbind maps NFS v3 and MOUNT v3 over TCP to the
//! configured ports and both programs answer a NULL call there.
//!
//! Everything is undone on drop, panics included: ganesha and rpcbind are
//! killed, the namespace deleted, the scratch directory removed. A later
//! run also removes what a killed test process left behind.
//!
//! [`GaneshaBackend::start_in_netns`] does the same in a network namespace
//! that exists already (the host side of a `deploy/linux-peer` guest's
//! link: the guest then finds rpcbind and ganesha at that side's
//! address), and leaves that namespace alone on drop.
//!
//! The real-peer rule: without root, iproute2, util-linux's
//! nsenter/unshare, rpcbind, ganesha.nfsd or the VFS FSAL, [`start`]
//! fails under `RPCRDMA_REQUIRE_PEERS=1` and otherwise prints
//! `skipped: ...` and returns `None`.
//!
//! The daemon's tests include this file too (by `#[path]`), so a gateway
//! test can run `rpcrdmad` in the backend's namespace
//! ([`GaneshaBackend::command`]):
//!
//! ```ignore
//! #[path = "../../dataplane/tests/support/ganesha.rs"]
//! mod ganesha;
//!
//! let Some(backend) = ganesha::GaneshaBackend::start("gateway") else {
//!     return; // skipped (the real-peer rule)
//! };
//! std::fs::write(backend.export_dir().join("f"), b"data").unwrap();
//! let mut gateway = backend.command(BIN).arg("--config").arg(&cfg).spawn().unwrap();
//! let (path, nfs) = (backend.export_path(), backend.nfs_addr());
//! backend.in_netns(move || {
//!     let mut rpc = ganesha::RpcTcp::connect(nfs).unwrap(); // 127.0.0.1:2049
//!     // MNT `path` on backend.mount_addr(), calls through the gateway...
//! });
//! gateway.kill().unwrap(); // before the backend drops
//! ```
//!
//! [`start`]: GaneshaBackend::start
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use dataplane::wire::rpc::{
    AcceptStatus, CallHeader, OpaqueAuth, RecordMarker, ReplyBody, ReplyHeader,
};
use dataplane::wire::xdr::{Decoder, Encoder};

/// ganesha's NFS port inside the backend's namespace.
pub const NFS_PORT: u16 = 2049;
/// ganesha's MOUNT port inside the backend's namespace.
pub const MOUNT_PORT: u16 = 20048;
/// rpcbind's port inside the backend's namespace.
pub const RPCBIND_PORT: u16 = 111;
/// ganesha's largest READ and WRITE (its FSINFO rtmax and wtmax), 1 MiB
/// as Linux's knfsd. ganesha's own default is 64 MiB, more than an
/// RPC-over-RDMA gateway would forward in one call.
pub const MAX_IO: u32 = 1 << 20;

/// Bound on anything the backend does at start or stop, and on one RPC
/// round trip. Only a guard against a hang: never a statement about speed.
pub const BACKEND_PATIENCE: Duration = Duration::from_secs(60);

const NFS_PROGRAM: u32 = 100_003;
const MOUNT_PROGRAM: u32 = 100_005;
const PMAP_PROGRAM: u32 = 100_000;
/// `IPPROTO_TCP` in a PMAP v2 mapping.
const PMAP_TCP: u32 = 6;
/// Largest reply record [`RpcTcp`] accepts (a 1 MiB READ and its header fit).
const MAX_REPLY: usize = 4 << 20;

/// Namespace and scratch directory names: this prefix, the test
/// process's pid, a counter.
const NS_PREFIX: &str = "rpcrdma-ganesha-";

/// What a backend needs on the host, besides root.
const TOOLS: [&str; 6] = [
    "ip",
    "nsenter",
    "unshare",
    "mount",
    "rpcbind",
    "ganesha.nfsd",
];

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

/// The VFS FSAL plugin of nfs-ganesha-vfs (a multiarch library path).
fn vfs_fsal_installed() -> bool {
    let Ok(dirs) = std::fs::read_dir("/usr/lib") else {
        return false;
    };
    dirs.filter_map(Result::ok)
        .map(|d| d.path().join("ganesha/libfsalvfs.so"))
        .chain([PathBuf::from("/usr/lib/ganesha/libfsalvfs.so")])
        .any(|p| p.is_file())
}

/// Runs `ip ARGS`; Err(stderr) when it fails.
fn ip(ip: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new(ip)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Kills every process in namespace `ns` and deletes it.
fn remove_namespace(ip_tool: &Path, ns: &str) {
    if let Ok(out) = Command::new(ip_tool).args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(pid) = pid.parse::<i32>() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    if let Err(e) = ip(ip_tool, &["netns", "del", ns]) {
        eprintln!("ganesha backend cleanup: {e}");
    }
}

/// Removes the namespaces (and kills the ganesha and rpcbind in them) of
/// a test process that no longer runs (killed before its drop ran).
fn remove_stale_namespaces(ip_tool: &Path) {
    let Ok(out) = Command::new(ip_tool).args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(NS_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            remove_namespace(ip_tool, name);
        }
    }
}

/// Removes the scratch directories of test processes that no longer run.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(NS_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Waits for `child` to exit, killing it when it has not after
/// [`BACKEND_PATIENCE`].
fn reap(child: &mut Child) {
    let deadline = Instant::now() + BACKEND_PATIENCE;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// ganesha.nfsd and its rpcbind in namespaces of their own, serving one
/// scratch directory over NFSv3 and MOUNT v3 (and NFSv4) on TCP.
pub struct GaneshaBackend {
    /// Scratch: `export/`, `ganesha.conf`, `ganesha.log`, `ganesha.pid`,
    /// `recovery/` (ganesha's NFSv4 client records).
    dir: PathBuf,
    /// The network namespace, `/run/netns/NAME`.
    netns: String,
    /// Whether the namespace was made here (and is deleted on drop), not
    /// given to [`start_in_netns`](Self::start_in_netns).
    owns_netns: bool,
    ip: PathBuf,
    nsenter: PathBuf,
    ganesha_bin: PathBuf,
    /// rpcbind: its process anchors the private mount namespace (the
    /// tmpfs on `/run`) that ganesha and [`command`](Self::command) join.
    rpcbind: Option<Child>,
    ganesha: Option<Child>,
    /// ganesha.nfsd processes started so far (1 after `start`).
    starts: u32,
}

impl GaneshaBackend {
    /// Starts a backend for test `tag` (a short word) and waits until it
    /// serves; `None` after the real-peer rule said "skipped". Panics when
    /// it cannot start or is not ready within [`BACKEND_PATIENCE`].
    pub fn start(tag: &str) -> Option<GaneshaBackend> {
        Self::start_with(tag, None)
    }

    /// [`start`](Self::start), but in the existing network namespace
    /// `netns` (e.g. the host side of a `deploy/linux-peer` guest's link,
    /// so that the guest reaches rpcbind and ganesha at that side's
    /// address). rpcbind and ganesha listen on its wildcard addresses; the
    /// namespace must have no rpcbind of its own (port 111) and nothing
    /// on ganesha's ports. On drop only the processes started here are
    /// killed: the namespace and whatever else runs in it stay.
    pub fn start_in_netns(tag: &str, netns: &str) -> Option<GaneshaBackend> {
        Self::start_with(tag, Some(netns))
    }

    fn start_with(tag: &str, existing_netns: Option<&str>) -> Option<GaneshaBackend> {
        if !nix::unistd::geteuid().is_root() {
            skip("root not available (the ganesha backend needs namespaces and mounts)");
            return None;
        }
        let mut paths = Vec::new();
        for tool in TOOLS {
            match find_tool(tool) {
                Some(p) => paths.push(p),
                None => {
                    skip(&format!("{tool} not installed"));
                    return None;
                }
            }
        }
        if !vfs_fsal_installed() {
            skip("nfs-ganesha-vfs not installed");
            return None;
        }
        let [ip_tool, nsenter, unshare, _mount, rpcbind, ganesha_bin] =
            <[PathBuf; 6]>::try_from(paths).unwrap();
        remove_stale_namespaces(&ip_tool);
        remove_stale_dirs();

        static SEQ: AtomicU32 = AtomicU32::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("{NS_PREFIX}{pid}-{n}-{tag}"));
        assert!(
            !dir.starts_with("/run") && !dir.starts_with("/var/run"),
            "the backend's scratch directory must not be under /run (TMPDIR={}): \
             the backend's mount namespace hides /run",
            dir.display()
        );
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("export")).unwrap();
        std::fs::create_dir_all(dir.join("recovery")).unwrap();
        let netns = match existing_netns {
            Some(ns) => {
                assert!(
                    Path::new(&format!("/run/netns/{ns}")).exists(),
                    "no network namespace {ns}"
                );
                ns.to_owned()
            }
            None => {
                let netns = format!("{NS_PREFIX}{pid}-{n}");
                if let Err(e) = ip(&ip_tool, &["netns", "add", &netns]) {
                    let _ = std::fs::remove_dir_all(&dir);
                    skip(&format!("cannot create a network namespace ({e})"));
                    return None;
                }
                netns
            }
        };
        // From here on, Drop undoes whatever was made.
        let mut b = GaneshaBackend {
            dir,
            netns,
            owns_netns: existing_netns.is_none(),
            ip: ip_tool,
            nsenter,
            ganesha_bin,
            rpcbind: None,
            ganesha: None,
            starts: 0,
        };
        ip(&b.ip, &["-n", &b.netns, "link", "set", "lo", "up"]).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(b.config_path(), b.config()).unwrap();

        // rpcbind: in the namespace, in a new mount namespace (private
        // propagation: nothing mounted there reaches the host) whose /run
        // is an empty tmpfs. nsenter, unshare and sh each exec the next,
        // so the child's pid is rpcbind's.
        let rpcbind_child = Command::new(&b.nsenter)
            .arg(format!("--net=/run/netns/{}", b.netns))
            .arg("--")
            .arg(&unshare)
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg("mount -t tmpfs -o mode=0755,size=4m rpcrdma-ganesha-run /run && exec \"$0\" -f")
            .arg(&rpcbind)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn rpcbind");
        b.rpcbind = Some(rpcbind_child);
        b.wait_rpcbind();
        b.spawn_ganesha();
        b.wait_ready();
        // ganesha warns about a parameter it does not know (or not in
        // that block) and goes on without it: a silently dropped setting.
        let log = b.log();
        assert!(
            !log.contains("Unknown parameter") && !log.contains("CONFIG :CRIT"),
            "ganesha did not take the generated config:\n{}",
            b.log_tail()
        );
        Some(b)
    }

    /// The exported directory, as the host sees it (and as ganesha does:
    /// only /run differs in its mount namespace). Files the test puts
    /// there are what NFS clients see.
    pub fn export_dir(&self) -> PathBuf {
        self.dir.join("export")
    }

    /// The MOUNT v3 `dirpath` of the export (its path on the server).
    pub fn export_path(&self) -> String {
        self.export_dir().to_str().expect("a UTF-8 path").to_owned()
    }

    /// ganesha's NFS address inside the namespace.
    pub fn nfs_addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, NFS_PORT))
    }

    /// ganesha's MOUNT address inside the namespace.
    pub fn mount_addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, MOUNT_PORT))
    }

    /// The network namespace's name (`ip netns exec NAME ...`,
    /// `/run/netns/NAME`).
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The scratch directory (config, log, pid file, export).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// ganesha's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("ganesha.log")).unwrap_or_default()
    }

    /// How many ganesha.nfsd processes have been started (1 after
    /// [`start`](Self::start), one more per [`restart`](Self::restart)).
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// rpcbind's pid; `/proc/PID/root` shows the backend's mount
    /// namespace (its own `/run`).
    pub fn rpcbind_pid(&self) -> u32 {
        self.rpcbind.as_ref().expect("rpcbind runs").id()
    }

    /// The running ganesha.nfsd's pid.
    pub fn ganesha_pid(&self) -> Option<u32> {
        self.ganesha.as_ref().map(Child::id)
    }

    /// A command that runs `program` in the backend's network namespace
    /// and its mount namespace (where rpcbind's socket is), e.g. the
    /// gateway daemon or a client tool. nsenter execs `program`, so the
    /// child's pid is the program's. The caller owns the child: kill it
    /// before the backend drops.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let rpcbind = self.rpcbind.as_ref().expect("rpcbind runs").id();
        let mut c = Command::new(&self.nsenter);
        c.arg(format!("--target={rpcbind}"))
            .args(["--mount", "--net", "--"])
            .arg(program);
        c
    }

    /// Runs `f` on a thread that lives in the backend's network namespace
    /// (network namespaces are per thread; sockets made there stay there,
    /// and may be used from any thread afterwards). The thread keeps the
    /// host's mount namespace. A panic of `f` is resumed here.
    pub fn in_netns<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.netns);
        std::thread::scope(|s| {
            s.spawn(move || {
                let ns = std::fs::File::open(&path).expect("open the namespace");
                nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                f()
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }

    /// Kills ganesha.nfsd (SIGKILL: a backend failure, no unregistering)
    /// and waits until it is gone. rpcbind keeps running, with ganesha's
    /// now stale registrations. Nothing when it is not running.
    pub fn kill(&mut self) {
        if let Some(mut g) = self.ganesha.take() {
            let _ = g.kill();
            reap(&mut g);
        }
    }

    /// [`kill`](Self::kill)s ganesha if it runs, starts a new one on the
    /// same config and export, and waits until it serves. The new process
    /// listens on the same ports; connections to the old one are gone.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn_ganesha();
        self.wait_ready();
    }

    fn config_path(&self) -> PathBuf {
        self.dir.join("ganesha.conf")
    }

    /// The generated ganesha.conf. No `Bind_addr`: ganesha listens on the
    /// wildcard address whatever it says, and in a namespace whose only
    /// interface is `lo` it refuses even `127.0.0.1` ("No IP address
    /// found"). Kerberos is off (no keytab), NLM, RQUOTA and UDP too.
    /// MaxRead and friends belong to the EXPORT block (ganesha ignores
    /// them, with a warning, in NFS_CORE_PARAM).
    fn config(&self) -> String {
        let export = self.export_path();
        let recovery = self.dir.join("recovery");
        format!(
            "NFS_CORE_PARAM {{\n\
             \tNFS_Port = {NFS_PORT};\n\
             \tMNT_Port = {MOUNT_PORT};\n\
             \tEnable_NLM = false;\n\
             \tEnable_RQUOTA = false;\n\
             \tEnable_UDP = false;\n\
             \tProtocols = 3, 4;\n\
             }}\n\
             NFSV4 {{\n\
             \tGraceless = true;\n\
             \tOnly_Numeric_Owners = true;\n\
             \tRecoveryRoot = \"{recovery}\";\n\
             }}\n\
             NFS_KRB5 {{\n\
             \tActive_krb5 = false;\n\
             }}\n\
             EXPORT {{\n\
             \tExport_Id = 1;\n\
             \tPath = \"{export}\";\n\
             \tPseudo = /export;\n\
             \tAccess_Type = RW;\n\
             \tSquash = No_Root_Squash;\n\
             \tSecType = sys;\n\
             \tProtocols = 3, 4;\n\
             \tTransports = TCP;\n\
             \tMaxRead = {MAX_IO};\n\
             \tMaxWrite = {MAX_IO};\n\
             \tPrefRead = {MAX_IO};\n\
             \tPrefWrite = {MAX_IO};\n\
             \tFSAL {{\n\
             \t\tName = VFS;\n\
             \t}}\n\
             }}\n",
            recovery = recovery.display(),
        )
    }

    fn spawn_ganesha(&mut self) {
        assert!(self.ganesha.is_none(), "ganesha already runs");
        let log = self.dir.join("ganesha.log");
        let child = self
            .command(&self.ganesha_bin)
            .arg("-F")
            .arg("-f")
            .arg(self.config_path())
            .arg("-L")
            .arg(&log)
            .arg("-p")
            .arg(self.dir.join("ganesha.pid"))
            .args(["-N", "NIV_EVENT"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn ganesha.nfsd");
        self.ganesha = Some(child);
        self.starts += 1;
    }

    /// Panics with `what` and ganesha's log when rpcbind or ganesha has
    /// exited.
    fn check_alive(&mut self, what: &str) {
        let mut exited = None;
        for (name, child) in [
            ("rpcbind", &mut self.rpcbind),
            ("ganesha.nfsd", &mut self.ganesha),
        ] {
            if let Some(Ok(Some(status))) = child.as_mut().map(Child::try_wait) {
                exited = Some((name, status));
            }
        }
        if let Some((name, status)) = exited {
            panic!(
                "{what}: {name} exited ({status}); ganesha log:\n{}",
                self.log_tail()
            );
        }
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Polls `probe` (in the namespace) until it returns Ok, failing when
    /// a process dies or after [`BACKEND_PATIENCE`].
    fn wait_until(&mut self, what: &str, probe: impl Fn() -> Result<(), String> + Sync) {
        let deadline = Instant::now() + BACKEND_PATIENCE;
        loop {
            self.check_alive(what);
            let last = match self.in_netns(&probe) {
                Ok(()) => return,
                Err(e) => e,
            };
            if Instant::now() > deadline {
                panic!(
                    "{what}: not ready after {BACKEND_PATIENCE:?} (last: {last}); ganesha log:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// rpcbind answers on TCP and has made its local socket (which
    /// ganesha registers through).
    fn wait_rpcbind(&mut self) {
        let pid = self.rpcbind.as_ref().unwrap().id();
        let sock = PathBuf::from(format!("/proc/{pid}/root/run/rpcbind.sock"));
        self.wait_until("rpcbind", move || {
            if !sock.exists() {
                return Err(format!("no {}", sock.display()));
            }
            let mut c = RpcTcp::connect(rpcbind_addr()).map_err(|e| e.to_string())?;
            c.null(PMAP_PROGRAM, 2)
        });
    }

    /// rpcbind maps NFS v3 and MOUNT v3 over TCP to our ports, and both
    /// answer NULL there.
    fn wait_ready(&mut self) {
        let (nfs, mount) = (self.nfs_addr(), self.mount_addr());
        self.wait_until("ganesha", move || {
            let mut pmap = RpcTcp::connect(rpcbind_addr()).map_err(|e| e.to_string())?;
            for (prog, port) in [(NFS_PROGRAM, NFS_PORT), (MOUNT_PROGRAM, MOUNT_PORT)] {
                let got = pmap.getport(prog, 3, PMAP_TCP)?;
                if got != port {
                    return Err(format!("rpcbind maps program {prog} v3 to port {got}"));
                }
            }
            RpcTcp::connect(nfs)
                .map_err(|e| format!("NFS: {e}"))?
                .null(NFS_PROGRAM, 3)?;
            RpcTcp::connect(mount)
                .map_err(|e| format!("MOUNT: {e}"))?
                .null(MOUNT_PROGRAM, 3)
        });
    }
}

impl Drop for GaneshaBackend {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "ganesha backend {}: log tail:\n{}",
                self.dir.display(),
                self.log_tail()
            );
        }
        self.kill();
        if let Some(mut r) = self.rpcbind.take() {
            let _ = r.kill();
            reap(&mut r);
        }
        if self.owns_netns {
            remove_namespace(&self.ip, &self.netns);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rpcbind_addr() -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, RPCBIND_PORT))
}

/// A blocking ONC RPC client over one TCP connection (RFC 5531 record
/// marking), one call at a time: the test encodes a call message, this
/// frames it, sends it and returns the reply message whose XID matches.
pub struct RpcTcp {
    stream: TcpStream,
    next_xid: u32,
}

impl RpcTcp {
    /// Connects to `addr` (from a thread in the backend's namespace);
    /// every read and write gives up after [`BACKEND_PATIENCE`].
    pub fn connect(addr: SocketAddr) -> std::io::Result<RpcTcp> {
        let stream = TcpStream::connect_timeout(&addr, BACKEND_PATIENCE)?;
        stream.set_read_timeout(Some(BACKEND_PATIENCE))?;
        stream.set_write_timeout(Some(BACKEND_PATIENCE))?;
        stream.set_nodelay(true)?;
        Ok(RpcTcp {
            stream,
            next_xid: 0x6a00_0000 ^ std::process::id(),
        })
    }

    /// A fresh XID for the next call.
    pub fn xid(&mut self) -> u32 {
        self.next_xid = self.next_xid.wrapping_add(1);
        self.next_xid
    }

    /// Sends the call message `msg` (its XID is its first word) as one
    /// record and returns the reply with that XID (a reply of several
    /// fragments is joined). Err when the connection fails or closes, or
    /// a reply is over 4 MiB or has another XID.
    pub fn call(&mut self, msg: &[u8]) -> Result<Vec<u8>, String> {
        let mut mark = [0u8; RecordMarker::LEN];
        RecordMarker::new(msg.len(), true)
            .and_then(|m| m.emit(&mut mark))
            .map_err(|e| format!("record mark: {e}"))?;
        self.stream
            .write_all(&mark)
            .and_then(|()| self.stream.write_all(msg))
            .map_err(|e| format!("send: {e}"))?;
        let mut reply = Vec::new();
        loop {
            let mut mark = [0u8; RecordMarker::LEN];
            self.stream
                .read_exact(&mut mark)
                .map_err(|e| format!("receive: {e}"))?;
            let word = u32::from_be_bytes(mark);
            let len = (word & !RecordMarker::LAST_FRAGMENT) as usize;
            if reply.len() + len > MAX_REPLY {
                return Err(format!("reply over {MAX_REPLY} bytes"));
            }
            let at = reply.len();
            reply.resize(at + len, 0);
            self.stream
                .read_exact(&mut reply[at..])
                .map_err(|e| format!("receive: {e}"))?;
            if word & RecordMarker::LAST_FRAGMENT != 0 {
                break;
            }
        }
        if reply.get(..4) != msg.get(..4) {
            return Err(format!(
                "reply XID {:02x?} for call XID {:02x?}",
                reply.get(..4),
                msg.get(..4)
            ));
        }
        Ok(reply)
    }

    /// Calls `procedure` of `program`/`version` with AUTH_NONE and
    /// `args` (XDR), returning the results of a successful reply.
    pub fn call_raw(
        &mut self,
        program: u32,
        version: u32,
        procedure: u32,
        args: &[u8],
    ) -> Result<Vec<u8>, String> {
        let xid = self.xid();
        let mut buf = vec![0u8; 64 + args.len()];
        let mut e = Encoder::new(&mut buf);
        CallHeader::new(
            xid,
            program,
            version,
            procedure,
            OpaqueAuth::None,
            OpaqueAuth::None,
        )
        .emit(&mut e)
        .map_err(|e| e.to_string())?;
        e.put_opaque_fixed(args).map_err(|e| e.to_string())?;
        let len = e.position();
        let reply = self.call(&buf[..len])?;
        success_results(&reply).map(<[u8]>::to_vec)
    }

    /// NULL of `program`/`version`: Ok when the server runs it.
    pub fn null(&mut self, program: u32, version: u32) -> Result<(), String> {
        let results = self.call_raw(program, version, 0, &[])?;
        if results.is_empty() {
            Ok(())
        } else {
            Err(format!("NULL of {program} v{version}: results"))
        }
    }

    /// PMAP v2 GETPORT (rpcbind's port 111): the port `program`/`version`
    /// is registered on for `protocol` (6 TCP, 17 UDP), 0 when none.
    pub fn getport(&mut self, program: u32, version: u32, protocol: u32) -> Result<u16, String> {
        let mut args = [0u8; 16];
        let mut e = Encoder::new(&mut args);
        for w in [program, version, protocol, 0] {
            e.put_u32(w).unwrap();
        }
        let results = self.call_raw(PMAP_PROGRAM, 2, 3, &args)?;
        let mut d = Decoder::new(&results);
        let port = d.get_u32().map_err(|e| format!("GETPORT result: {e}"))?;
        u16::try_from(port).map_err(|_| format!("GETPORT result {port}"))
    }
}

/// The results of an accepted, successful RPC reply; Err naming what the
/// reply was otherwise.
pub fn success_results(reply: &[u8]) -> Result<&[u8], String> {
    let (header, len) = ReplyHeader::parse(reply).map_err(|e| format!("reply header: {e}"))?;
    match header.body {
        ReplyBody::Accepted(a) if a.status == AcceptStatus::Success => Ok(&reply[len..]),
        ReplyBody::Accepted(a) => Err(format!("call accepted but not run: {:?}", a.status)),
        ReplyBody::Denied(_) => Err("call denied".to_owned()),
    }
}
