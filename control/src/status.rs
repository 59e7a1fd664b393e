//! `rpcrdmad status`: the running daemon's workers, listeners,
//! connections and pools, asked over a local control socket.
//!
//! ```text
//! daemon:  StatusServer thread: UnixListener on control.socket (mode 0600)
//!          accept -> SO_PEERCRED uid is root or ours? -> read one request
//!          line -> "status": ask every worker (WorkerSet::status), answer
//!          one JSON object, close
//! client:  connect -> "status\n" -> the JSON -> printed as is (--json) or
//!          as tables
//! ```
//!
//! The socket's mode keeps other users out at connect time; the uid check
//! keeps them out should the mode be loosened by hand. One request per
//! connection, a short I/O timeout, a bounded request line: the socket is
//! for an operator's command, not a stream of queries.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dataplane::worker::WorkerSet;
use serde::{Deserialize, Serialize};

use crate::metrics::Registry;

/// The whole answer to `status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// rpcrdmad's version.
    pub version: String,
    /// The daemon's process id.
    pub pid: u32,
    /// Seconds since the daemon started.
    pub uptime_s: f64,
    /// One per worker.
    pub workers: Vec<WorkerRow>,
    /// One per listener served.
    pub listeners: Vec<ListenerRow>,
    /// Every open connection, every worker.
    pub connections: Vec<ConnectionRow>,
    /// Every bulk pool and shared receive queue.
    pub pools: Vec<PoolRow>,
}

/// A worker.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerRow {
    /// Index in `workers.cores`.
    pub worker: usize,
    /// The core it is pinned to.
    pub core: usize,
    /// Connections it serves now.
    pub connections: u64,
    /// RPCs answered per second, over the last second or two.
    pub calls_per_s: f64,
    /// Share of that time spent in loop iterations that found work, in
    /// percent.
    pub busy_percent: f64,
    /// RPCs answered since start.
    pub rpcs: u64,
}

/// A listener.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ListenerRow {
    /// Its URL.
    pub url: String,
    /// Whether the data path serves it.
    pub serving: bool,
    /// Connections accepted since start.
    pub accepted: u64,
    /// Connection attempts refused since start.
    pub rejected: u64,
}

/// A connection.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnectionRow {
    /// The worker serving it.
    pub worker: usize,
    /// `shm`, `roce`, `ibverbs` or `tcp`.
    pub transport: String,
    /// Who the peer is (address, or `uid N` over shm).
    pub peer: String,
    /// Seconds since it was set up.
    pub age_s: f64,
    /// Calls the peer may have in progress (RDMA credits; 0 over tcp).
    pub credits_granted: u32,
    /// Calls in progress now (RDMA; 0 over tcp).
    pub credits_in_use: u32,
    /// Calls received.
    pub calls_received: u64,
    /// Replies sent.
    pub replies_sent: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Errors seen on it.
    pub errors: u64,
    /// Whether hugepages back its buffers (`null` over tcp).
    pub hugepages: Option<bool>,
}

/// A pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolRow {
    /// `bulk` or `shared_receives`.
    pub pool: String,
    /// The provider's scheme.
    pub provider: String,
    /// The worker owning it.
    pub worker: usize,
    /// Buffers in use.
    pub used: u64,
    /// Buffers free.
    pub free: u64,
    /// Bytes per buffer.
    pub buffer_bytes: u64,
    /// Whether 2 MiB hugepages back it.
    pub hugepages: bool,
}

/// How long a client may take to send its request, and we to answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest request line.
const MAX_REQUEST: u64 = 1024;
/// How often the idle accept loop looks at the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(100);
/// How often worker figures are sampled for the rates.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How long the workers have to answer.
const WORKERS_TIMEOUT: Duration = Duration::from_secs(2);

/// Why the control socket could not be opened: one line naming the key.
#[derive(Debug, thiserror::Error)]
#[error("cannot open the control socket {} (control.socket): {reason}", path.display())]
pub struct SocketError {
    path: PathBuf,
    reason: String,
}

/// The control socket's thread.
#[derive(Debug)]
pub struct StatusServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What the status thread reads.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The workers (weak: the data path owns them and stops them).
    pub workers: Weak<WorkerSet>,
    /// The metrics registry (listener counters).
    pub registry: Arc<Registry>,
    /// `workers.cores`.
    pub cores: Vec<usize>,
}

impl StatusServer {
    /// Binds `path` (replacing a stale socket; a live one belongs to
    /// another daemon and is an error), makes it mode 0600 and serves it
    /// from a thread named `control`.
    ///
    /// # Errors
    /// [`SocketError`]: one line naming the path and `control.socket`.
    pub fn start(path: &Path, sources: Sources) -> Result<StatusServer, SocketError> {
        let fail = |reason: String| SocketError {
            path: path.to_owned(),
            reason,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
        }
        match UnixStream::connect(path) {
            Ok(_) => {
                return Err(fail(
                    "another process (another rpcrdmad?) answers on it; stop it or change \
                     control.socket"
                        .into(),
                ))
            }
            Err(_) if path.exists() => {
                let meta = std::fs::symlink_metadata(path).map_err(|e| fail(e.to_string()))?;
                use std::os::unix::fs::FileTypeExt;
                if !meta.file_type().is_socket() {
                    return Err(fail("it exists and is not a socket; remove it".into()));
                }
                std::fs::remove_file(path).map_err(|e| fail(format!("stale socket: {e}")))?;
            }
            Err(_) => {}
        }
        let listener = UnixListener::bind(path).map_err(|e| fail(e.to_string()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| fail(format!("chmod 0600: {e}")))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| fail(e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || serve(listener, sources, flag))
            .map_err(|e| fail(format!("cannot start its thread: {e}")))?;
        Ok(StatusServer {
            path: path.to_owned(),
            stop,
            thread: Some(thread),
        })
    }

    /// Stops serving and removes the socket.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for StatusServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Worker figures at one instant, for rates.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    /// (rpcs, busy ns) per worker.
    workers: Vec<(u64, u64)>,
}

fn sample(set: &WorkerSet) -> Sample {
    Sample {
        at: Instant::now(),
        workers: set.snapshot().iter().map(|w| (w.rpcs, w.busy_ns)).collect(),
    }
}

fn serve(listener: UnixListener, sources: Sources, stop: Arc<AtomicBool>) {
    let started = Instant::now();
    // Rates are taken against a sample one to two seconds old.
    let (mut older, mut newer): (Option<Sample>, Option<Sample>) = (None, None);
    let mut next_sample = Instant::now();
    let mut failures = crate::ratelimit::Warnings::default();
    while !stop.load(Ordering::SeqCst) {
        if Instant::now() >= next_sample {
            if let Some(set) = sources.workers.upgrade() {
                older = newer.take();
                newer = Some(sample(&set));
            }
            next_sample = Instant::now() + SAMPLE_EVERY;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                let base = older.as_ref().or(newer.as_ref());
                if let Err(e) = answer(stream, &sources, base, started) {
                    tracing::debug!("control socket request failed: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(e) => {
                failures.warn(Instant::now(), || {
                    format!("control socket accept failed: {e}")
                });
                std::thread::sleep(ACCEPT_POLL);
            }
        }
    }
}

/// Root and the daemon's own uid may ask.
fn allowed(stream: &UnixStream) -> bool {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    match getsockopt(stream, PeerCredentials) {
        Ok(cred) => cred.uid() == 0 || cred.uid() == nix::unistd::geteuid().as_raw(),
        Err(_) => false,
    }
}

fn answer(
    stream: UnixStream,
    sources: &Sources,
    base: Option<&Sample>,
    started: Instant,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut out = &stream;
    if !allowed(&stream) {
        writeln!(
            out,
            "{{\"error\":\"permission denied: only root and the daemon's user may ask\"}}"
        )?;
        return Ok(());
    }
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_REQUEST)).read_line(&mut line)?;
    let body = match line.trim() {
        "status" => serde_json::to_string(&report(sources, base, started))
            .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")),
        other => serde_json::json!({ "error": format!("unknown request {other:?}; try status") })
            .to_string(),
    };
    out.write_all(body.as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()
}

/// Everything `status` shows, from the workers (asked now), the pools
/// and the registry.
fn report(sources: &Sources, base: Option<&Sample>, started: Instant) -> Report {
    let mut r = Report {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        pid: std::process::id(),
        uptime_s: started.elapsed().as_secs_f64(),
        ..Report::default()
    };
    for (url, l) in sources.registry.listeners() {
        use std::sync::atomic::Ordering::Relaxed;
        r.listeners.push(ListenerRow {
            url,
            serving: l.serving.load(Relaxed) == 1,
            accepted: l.accepted.load(Relaxed),
            rejected: l.rejected.iter().map(|c| c.load(Relaxed)).sum(),
        });
    }
    let Some(set) = sources.workers.upgrade() else {
        return r;
    };
    let now = sample(&set);
    let snaps = set.snapshot();
    for (i, w) in snaps.iter().enumerate() {
        let (mut per_s, mut busy) = (0.0, 0.0);
        if let Some(b) = base {
            let secs = now.at.saturating_duration_since(b.at).as_secs_f64();
            if let (Some(&(rpcs, ns)), true) = (b.workers.get(i), secs > 0.0) {
                per_s = w.rpcs.saturating_sub(rpcs) as f64 / secs;
                busy = (w.busy_ns.saturating_sub(ns) as f64 / 1e9 / secs * 100.0).min(100.0);
            }
        }
        r.workers.push(WorkerRow {
            worker: i,
            core: sources.cores.get(i).copied().unwrap_or(0),
            connections: w.connections,
            calls_per_s: per_s,
            busy_percent: busy,
            rpcs: w.rpcs,
        });
    }
    for w in set.status(WORKERS_TIMEOUT) {
        for c in w.connections {
            r.connections.push(ConnectionRow {
                worker: c.worker,
                transport: c.transport.scheme().to_owned(),
                peer: c.peer,
                age_s: c.age.as_secs_f64(),
                credits_granted: c.credits_granted,
                credits_in_use: c.credits_in_use,
                calls_received: c.calls_received,
                replies_sent: c.replies_sent,
                bytes_received: c.bytes_received,
                bytes_sent: c.bytes_sent,
                errors: c.errors,
                hugepages: c.hugepages,
            });
        }
    }
    for p in set.pool_status() {
        r.pools.push(PoolRow {
            pool: p.pool.to_owned(),
            provider: p.provider.to_owned(),
            worker: p.worker,
            used: p.used,
            free: p.buffers.saturating_sub(p.used),
            buffer_bytes: p.buffer_bytes,
            hugepages: p.hugepages,
        });
    }
    r
}

/// Why `rpcrdmad status` got no report.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket.
    #[error("rpcrdmad is not running (nothing answers on {0}; see control.socket)")]
    NotRunning(String),
    /// The socket is not ours to open.
    #[error("cannot reach {0}: permission denied; run as root or as the daemon's user")]
    Denied(String),
    /// Anything else.
    #[error("cannot ask rpcrdmad at {0}: {1}")]
    Other(String, String),
}

/// Asks the daemon at `socket` for its status: the JSON line it answered.
///
/// # Errors
/// [`ClientError`], one line each.
pub fn ask(socket: &Path) -> Result<String, ClientError> {
    let name = socket.display().to_string();
    let mut s = UnixStream::connect(socket).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
            ClientError::NotRunning(name.clone())
        }
        io::ErrorKind::PermissionDenied => ClientError::Denied(name.clone()),
        _ => ClientError::Other(name.clone(), e.to_string()),
    })?;
    let other = |e: io::Error| ClientError::Other(name.clone(), e.to_string());
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(other)?;
    s.write_all(b"status\n").map_err(other)?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).map_err(other)?;
    if let Ok(serde_json::Value::Object(o)) = serde_json::from_str(&line) {
        if let Some(e) = o.get("error").and_then(|e| e.as_str()) {
            return Err(ClientError::Other(name, e.to_owned()));
        }
    }
    Ok(line.trim_end().to_owned())
}

/// A report as tables for people.
pub fn render_text(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "rpcrdmad {} (pid {}), up {}",
        r.version,
        r.pid,
        human_secs(r.uptime_s)
    );
    let _ = writeln!(
        o,
        "\nworkers\n  {:>6} {:>5} {:>11} {:>9} {:>6}",
        "worker", "core", "connections", "calls/s", "busy"
    );
    for w in &r.workers {
        let _ = writeln!(
            o,
            "  {:>6} {:>5} {:>11} {:>9.0} {:>5.1}%",
            w.worker, w.core, w.connections, w.calls_per_s, w.busy_percent
        );
    }
    let _ = writeln!(
        o,
        "\nlisteners\n  {:<40} {:>7} {:>9} {:>8}",
        "url", "serving", "accepted", "rejected"
    );
    for l in &r.listeners {
        let _ = writeln!(
            o,
            "  {:<40} {:>7} {:>9} {:>8}",
            l.url,
            if l.serving { "yes" } else { "no" },
            l.accepted,
            l.rejected
        );
    }
    let _ = writeln!(
        o,
        "\nconnections ({})\n  {:>2} {:<7} {:<22} {:>8} {:>9} {:>9} {:>9} {:>11} {:>11} {:>6}",
        r.connections.len(),
        "w",
        "via",
        "peer",
        "age",
        "credits",
        "calls in",
        "replies",
        "bytes in",
        "bytes out",
        "errors"
    );
    for c in &r.connections {
        let _ = writeln!(
            o,
            "  {:>2} {:<7} {:<22} {:>8} {:>4}/{:<4} {:>9} {:>9} {:>11} {:>11} {:>6}",
            c.worker,
            c.transport,
            c.peer,
            human_secs(c.age_s),
            c.credits_in_use,
            c.credits_granted,
            c.calls_received,
            c.replies_sent,
            c.bytes_received,
            c.bytes_sent,
            c.errors
        );
    }
    let _ = writeln!(
        o,
        "\npools\n  {:<16} {:<8} {:>6} {:>8} {:>8} {:>10} {:>9}",
        "pool", "provider", "worker", "used", "free", "bytes", "hugepages"
    );
    for p in &r.pools {
        let _ = writeln!(
            o,
            "  {:<16} {:<8} {:>6} {:>8} {:>8} {:>10} {:>9}",
            p.pool,
            p.provider,
            p.worker,
            p.used,
            p.free,
            p.buffer_bytes,
            if p.hugepages { "yes" } else { "no" }
        );
    }
    o
}

fn human_secs(s: f64) -> String {
    let s = s as u64;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s / 60) % 60),
    }
}

/// `rpcrdmad status [--json]`: prints the report (or one line why not);
/// returns the exit code.
pub fn run(socket: &Path, json: bool) -> i32 {
    match ask(socket) {
        Ok(line) if json => {
            println!("{line}");
            0
        }
        Ok(line) => match serde_json::from_str::<Report>(&line) {
            Ok(r) => {
                print!("{}", render_text(&r));
                0
            }
            Err(e) => {
                eprintln!(
                    "rpcrdmad status: unexpected answer from {}: {e}",
                    socket.display()
                );
                1
            }
        },
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}
