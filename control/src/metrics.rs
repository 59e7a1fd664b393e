//! The metrics registry and its Prometheus exporter.
//!
//! # Registry
//! [`Registry`] holds one [`WorkerCounters`] per worker, each in its own
//! cache line pair ([`CachePadded`]), so workers never share a line: a
//! worker is the only writer of its counters and bumps them with
//! [`add`]/[`set`] (a relaxed load and store, no locked instruction). The
//! exporter only reads. Per-listener connection counters are written by the
//! control thread that owns the listener. Nothing here depends on
//! `dataplane`: the worker will take an `Arc<Registry>` and its index.
//!
//! # Exporter
//! [`MetricsServer`] is a small HTTP/1.1 server on a std [`TcpListener`] in
//! its own thread: `GET /metrics` (and `HEAD`) answer the Prometheus text
//! exposition format 0.0.4, any other path 404, any other method 405. One
//! request per connection (`Connection: close`), a read timeout on every
//! connection, a bounded request head. No web framework: a scraper sends
//! one small GET every few seconds.
//!
//! Metric names are listed in `docs/CONFIG.md` (section "Metrics").

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_utils::CachePadded;

/// Adds `n` to a counter owned by the calling worker. Only the owner may
/// write: the load and store are not one atomic step.
#[inline]
pub fn add(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
}

/// Sets a gauge owned by the calling thread.
#[inline]
pub fn set(gauge: &AtomicU64, v: u64) {
    gauge.store(v, Relaxed);
}

/// Kinds of data-path errors, counted per worker: the worker's own
/// error counters (`dataplane::worker::WorkerCounters`), one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A work completion with an error status (flushes included).
    CompletionError,
    /// A reply the engine refused (answered SYSTEM_ERR instead).
    ReplyRefused,
    /// A call the service could not answer (not a decodable call).
    DroppedCall,
    /// A work request the provider refused as malformed.
    PostRefused,
    /// A connection closed by a protocol violation or a transport error.
    ConnectionLost,
    /// A connection closed with resources still in use.
    Leak,
}

impl ErrorKind {
    /// How many kinds there are.
    pub const COUNT: usize = 6;
    /// Every kind, in label order.
    pub const ALL: [ErrorKind; Self::COUNT] = [
        ErrorKind::CompletionError,
        ErrorKind::ReplyRefused,
        ErrorKind::DroppedCall,
        ErrorKind::PostRefused,
        ErrorKind::ConnectionLost,
        ErrorKind::Leak,
    ];

    /// The `kind` label value.
    pub const fn label(self) -> &'static str {
        match self {
            ErrorKind::CompletionError => "completion_error",
            ErrorKind::ReplyRefused => "reply_refused",
            ErrorKind::DroppedCall => "dropped_call",
            ErrorKind::PostRefused => "post_refused",
            ErrorKind::ConnectionLost => "connection_lost",
            ErrorKind::Leak => "leak",
        }
    }
}

/// The buffer pools of a worker. Each connection's engine
/// memory lives in its own arena (docs/WORKER.md); what a worker pools is
/// the region leases its posted work requests hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// Region leases held by posted work requests.
    Leases,
    /// Buffers of the worker's bulk pools (every RDMA provider's), leased
    /// by large calls and replies.
    Bulk,
    /// Receives of the worker's shared receive queues (every RDMA
    /// provider's); in use: reserved for the grants of its connections.
    SharedReceives,
}

impl PoolKind {
    /// How many pools a worker has.
    pub const COUNT: usize = 3;
    /// Every pool, in label order.
    pub const ALL: [PoolKind; Self::COUNT] =
        [PoolKind::Leases, PoolKind::Bulk, PoolKind::SharedReceives];

    /// The `pool` label value.
    pub const fn label(self) -> &'static str {
        match self {
            PoolKind::Leases => "leases",
            PoolKind::Bulk => "bulk",
            PoolKind::SharedReceives => "shared_receives",
        }
    }
}

/// The counters of one worker. Written only by that worker.
#[derive(Debug, Default)]
pub struct WorkerCounters {
    /// Polls of the completion queues.
    pub polls: AtomicU64,
    /// Polls that found nothing to do.
    pub idle_polls: AtomicU64,
    /// Work completions reaped.
    pub completions: AtomicU64,
    /// RPCs completed (replies sent).
    pub rpcs: AtomicU64,
    /// Payload bytes received (Sends and RDMA Reads into us).
    pub bytes_received: AtomicU64,
    /// Payload bytes sent (Sends and RDMA Writes from us).
    pub bytes_sent: AtomicU64,
    /// Gauge: credits granted and not yet used by the peers.
    pub credits_in_use: AtomicU64,
    /// Times a call found the worker's bulk pool empty (each retry counts).
    pub bulk_pool_empty: AtomicU64,
    /// Gauge: buffers taken from each pool, indexed by [`PoolKind`].
    pub pool_in_use: [AtomicU64; PoolKind::COUNT],
    /// Gauge: buffers in each pool, indexed by [`PoolKind`].
    pub pool_capacity: [AtomicU64; PoolKind::COUNT],
    /// Errors, indexed by [`ErrorKind`].
    pub errors: [AtomicU64; ErrorKind::COUNT],
}

impl WorkerCounters {
    /// Counts one error of `kind`.
    #[inline]
    pub fn error(&self, kind: ErrorKind) {
        add(&self.errors[kind as usize], 1);
    }
}

/// The counters of one listener. Written by the control thread that owns
/// the listener.
#[derive(Debug, Default)]
pub struct ListenerCounters {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connection attempts refused, by reason
    /// ([`Refusal`](crate::refusal::Refusal) as index).
    pub rejected: [AtomicU64; crate::refusal::Refusal::ALL.len()],
    /// Gauge: connections open now.
    pub active: AtomicU64,
    /// Gauge: 1 while the listener is served by the data path.
    pub serving: AtomicU64,
}

impl ListenerCounters {
    /// Counts a refused connection attempt.
    pub fn refused(&self, reason: crate::refusal::Refusal) {
        add(&self.rejected[reason as usize], 1);
    }
}

/// Every counter of the daemon.
pub struct Registry {
    workers: Box<[CachePadded<WorkerCounters>]>,
    worker_cores: Vec<usize>,
    listeners: Box<[ListenerCounters]>,
    listener_urls: Vec<String>,
    /// Gauge: mappings registered with rpcbind now.
    pub rpcbind_registrations: AtomicU64,
    /// The gateway's routes, copied in at each scrape.
    gateway: Mutex<Vec<GatewayRouteSample>>,
    /// Called at the start of every [`Registry::render`]: copies counters
    /// kept elsewhere (the workers' own) into this registry.
    refresher: Mutex<Option<Refresher>>,
}

/// One gateway route's figures (all workers together), as a scrape
/// shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatewayRouteSample {
    /// The route's program.
    pub program: u32,
    /// The backend's TCP address.
    pub backend: String,
    /// Calls forwarded.
    pub calls: u64,
    /// Replies relayed.
    pub replies: u64,
    /// Bytes written to the backend.
    pub bytes_sent: u64,
    /// Bytes of replies read from the backend.
    pub bytes_received: u64,
    /// Calls sent again after a lost backend connection.
    pub resends: u64,
    /// Calls that waited for room in the backend connections' output.
    pub output_waits: u64,
    /// Errors by kind: `timeout`, `busy`, `connection`, `stray_reply`.
    pub errors: [(&'static str, u64); 4],
    /// Retransmissions the duplicate request cache handled, by kind:
    /// `hit` (answered from the cache), `joined` (answered with the reply
    /// of the call still at the backend).
    pub reply_cache: [(&'static str, u64); 2],
    /// Upper bounds of the latency buckets, microseconds.
    pub latency_bounds_us: Vec<u64>,
    /// Replies per bucket (not cumulative), one more than the bounds.
    pub latency_buckets: Vec<u64>,
    /// Sum of the latencies, nanoseconds.
    pub latency_sum_ns: u64,
}

/// See [`Registry::set_refresher`].
pub type Refresher = Box<dyn Fn(&Registry) + Send + Sync>;

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("worker_cores", &self.worker_cores)
            .field("listener_urls", &self.listener_urls)
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// A registry for workers pinned to `worker_cores` and listeners named
    /// by `listener_urls`, all counters zero.
    pub fn new(worker_cores: &[usize], listener_urls: &[String]) -> Self {
        Registry {
            workers: worker_cores
                .iter()
                .map(|_| CachePadded::new(WorkerCounters::default()))
                .collect(),
            worker_cores: worker_cores.to_vec(),
            listeners: listener_urls
                .iter()
                .map(|_| ListenerCounters::default())
                .collect(),
            listener_urls: listener_urls.to_vec(),
            rpcbind_registrations: AtomicU64::new(0),
            gateway: Mutex::new(Vec::new()),
            refresher: Mutex::new(None),
        }
    }

    /// Installs (or with `None` removes) the function every render calls
    /// first, e.g. to copy the workers' counters in. It runs on the
    /// exporter's thread, once per scrape.
    pub fn set_refresher(&self, refresher: Option<Refresher>) {
        *self.refresher.lock().unwrap_or_else(|e| e.into_inner()) = refresher;
    }

    /// Replaces the gateway's figures (the refresher's job).
    pub fn set_gateway(&self, routes: Vec<GatewayRouteSample>) {
        *self.gateway.lock().unwrap_or_else(|e| e.into_inner()) = routes;
    }

    /// The counters of worker `index` (in `workers.cores` order).
    pub fn worker(&self, index: usize) -> &WorkerCounters {
        &self.workers[index]
    }

    /// The counters of listener `index` (in `[[listeners]]` order).
    pub fn listener(&self, index: usize) -> &ListenerCounters {
        &self.listeners[index]
    }

    /// The whole registry in the Prometheus text format 0.0.4.
    pub fn render(&self) -> String {
        if let Some(refresh) = &*self.refresher.lock().unwrap_or_else(|e| e.into_inner()) {
            refresh(self);
        }
        let mut out = String::with_capacity(8192);
        let workers: Vec<(String, &WorkerCounters)> = self
            .workers
            .iter()
            .zip(&self.worker_cores)
            .enumerate()
            .map(|(i, (w, core))| (format!("worker=\"{i}\",core=\"{core}\""), &**w))
            .collect();

        type Field = fn(&WorkerCounters) -> &AtomicU64;
        let simple: [(&str, &str, &str, Field); 6] = [
            (
                "rpcrdma_worker_polls_total",
                "counter",
                "Completion queue polls by the worker.",
                |w| &w.polls,
            ),
            (
                "rpcrdma_worker_idle_polls_total",
                "counter",
                "Polls that found no work.",
                |w| &w.idle_polls,
            ),
            (
                "rpcrdma_worker_completions_total",
                "counter",
                "Work completions reaped.",
                |w| &w.completions,
            ),
            (
                "rpcrdma_worker_rpcs_total",
                "counter",
                "RPCs completed (replies sent).",
                |w| &w.rpcs,
            ),
            (
                "rpcrdma_worker_credits_in_use",
                "gauge",
                "Credits granted to peers and not yet used.",
                |w| &w.credits_in_use,
            ),
            (
                "rpcrdma_bulk_pool_empty_total",
                "counter",
                "Times a call found the worker's bulk pool empty and waited.",
                |w| &w.bulk_pool_empty,
            ),
        ];
        for (name, kind, help, field) in simple {
            header(&mut out, name, kind, help);
            for (labels, w) in &workers {
                sample(&mut out, name, labels, field(w).load(Relaxed));
            }
        }

        let name = "rpcrdma_worker_bytes_total";
        header(
            &mut out,
            name,
            "counter",
            "Payload bytes moved by the worker.",
        );
        for (labels, w) in &workers {
            for (dir, v) in [("received", &w.bytes_received), ("sent", &w.bytes_sent)] {
                sample(
                    &mut out,
                    name,
                    &format!("{labels},direction=\"{dir}\""),
                    v.load(Relaxed),
                );
            }
        }

        let name = "rpcrdma_worker_errors_total";
        header(&mut out, name, "counter", "Data-path errors by kind.");
        for (labels, w) in &workers {
            for kind in ErrorKind::ALL {
                sample(
                    &mut out,
                    name,
                    &format!("{labels},kind=\"{}\"", kind.label()),
                    w.errors[kind as usize].load(Relaxed),
                );
            }
        }

        for (name, help, field) in [
            (
                "rpcrdma_pool_buffers_in_use",
                "Buffers taken from the worker's pool.",
                (|w| &w.pool_in_use) as fn(&WorkerCounters) -> &[AtomicU64; PoolKind::COUNT],
            ),
            (
                "rpcrdma_pool_buffers",
                "Buffers in the worker's pool.",
                |w| &w.pool_capacity,
            ),
        ] {
            header(&mut out, name, "gauge", help);
            for (labels, w) in &workers {
                for pool in PoolKind::ALL {
                    sample(
                        &mut out,
                        name,
                        &format!("{labels},pool=\"{}\"", pool.label()),
                        field(w)[pool as usize].load(Relaxed),
                    );
                }
            }
        }

        let listeners: Vec<(String, &ListenerCounters)> = self
            .listener_urls
            .iter()
            .zip(self.listeners.iter())
            .map(|(url, l)| (format!("listener=\"{}\"", escape_label(url)), l))
            .collect();
        let name = "rpcrdma_listener_rejected_total";
        header(
            &mut out,
            name,
            "counter",
            "Connection attempts refused on the listener, by reason.",
        );
        for (labels, l) in &listeners {
            for r in crate::refusal::Refusal::ALL {
                let labels = format!("{labels},reason=\"{}\"", r.label());
                sample(
                    &mut out,
                    name,
                    &labels,
                    l.rejected[r as usize].load(Relaxed),
                );
            }
        }
        type LField = fn(&ListenerCounters) -> &AtomicU64;
        let per_listener: [(&str, &str, &str, LField); 3] = [
            (
                "rpcrdma_listener_connections_total",
                "counter",
                "Connections accepted on the listener.",
                |l| &l.accepted,
            ),
            (
                "rpcrdma_listener_connections",
                "gauge",
                "Connections open on the listener.",
                |l| &l.active,
            ),
            (
                "rpcrdma_listener_serving",
                "gauge",
                "1 while the data path serves the listener, 0 while it is pending.",
                |l| &l.serving,
            ),
        ];
        for (name, kind, help, field) in per_listener {
            header(&mut out, name, kind, help);
            for (labels, l) in &listeners {
                sample(&mut out, name, labels, field(l).load(Relaxed));
            }
        }

        self.render_gateway(&mut out);

        let name = "rpcrdma_rpcbind_registrations";
        header(&mut out, name, "gauge", "Mappings registered with rpcbind.");
        sample(&mut out, name, "", self.rpcbind_registrations.load(Relaxed));

        let name = "rpcrdma_build_info";
        header(&mut out, name, "gauge", "Version of rpcrdmad; always 1.");
        sample(
            &mut out,
            name,
            &format!("version=\"{}\"", escape_label(env!("CARGO_PKG_VERSION"))),
            1,
        );
        out
    }
}

impl Registry {
    /// The gateway's families: per route (program, backend), counters and
    /// a latency histogram. Nothing when no program is routed.
    fn render_gateway(&self, out: &mut String) {
        let routes = self
            .gateway
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if routes.is_empty() {
            return;
        }
        let labels = |r: &GatewayRouteSample| {
            format!(
                "program=\"{}\",backend=\"{}\"",
                r.program,
                escape_label(&r.backend)
            )
        };
        type Field = fn(&GatewayRouteSample) -> u64;
        let families: [(&str, &str, Field); 6] = [
            (
                "rpcrdma_gateway_calls_total",
                "Calls relayed to the backend.",
                |r| r.calls,
            ),
            (
                "rpcrdma_gateway_replies_total",
                "Backend replies relayed to clients.",
                |r| r.replies,
            ),
            (
                "rpcrdma_gateway_bytes_sent_total",
                "Bytes written to the backend.",
                |r| r.bytes_sent,
            ),
            (
                "rpcrdma_gateway_bytes_received_total",
                "Bytes of backend replies read.",
                |r| r.bytes_received,
            ),
            (
                "rpcrdma_gateway_resends_total",
                "Calls sent again after a lost backend connection.",
                |r| r.resends,
            ),
            (
                "rpcrdma_gateway_output_waits_total",
                "Calls that waited for room in the backend connections' output (sent once, later).",
                |r| r.output_waits,
            ),
        ];
        for (name, help, field) in families {
            header(out, name, "counter", help);
            for r in &routes {
                sample(out, name, &labels(r), field(r));
            }
        }
        let name = "rpcrdma_gateway_errors_total";
        header(
            out,
            name,
            "counter",
            "Relay errors by kind: timeout and busy calls were answered SYSTEM_ERR; connection counts lost or refused backend connections; stray_reply counts replies that matched no call.",
        );
        for r in &routes {
            for (kind, v) in r.errors {
                sample(out, name, &format!("{},kind=\"{kind}\"", labels(r)), v);
            }
        }
        let name = "rpcrdma_gateway_reply_cache_total";
        header(
            out,
            name,
            "counter",
            "Retransmitted non-idempotent calls the duplicate request cache handled: hit (answered from the cache), joined (answered with the reply of the call still at the backend).",
        );
        for r in &routes {
            for (kind, v) in r.reply_cache {
                sample(out, name, &format!("{},kind=\"{kind}\"", labels(r)), v);
            }
        }
        let name = "rpcrdma_gateway_latency_seconds";
        header(
            out,
            name,
            "histogram",
            "Backend reply latency, forward to reply.",
        );
        for r in &routes {
            let l = labels(r);
            let mut cumulative = 0;
            for (i, n) in r.latency_buckets.iter().enumerate() {
                cumulative += n;
                let le = match r.latency_bounds_us.get(i) {
                    Some(us) => format!("{}", *us as f64 / 1e6),
                    None => "+Inf".to_string(),
                };
                let _ = writeln!(out, "{name}_bucket{{{l},le=\"{le}\"}} {cumulative}");
            }
            let _ = writeln!(out, "{name}_sum{{{l}}} {}", r.latency_sum_ns as f64 / 1e9);
            let _ = writeln!(out, "{name}_count{{{l}}} {cumulative}");
        }
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &str, v: u64) {
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {v}");
    } else {
        let _ = writeln!(out, "{name}{{{labels}}} {v}");
    }
}

/// Escapes a label value (text format 0.0.4): backslash, double quote and
/// line feed.
pub fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// Longest request head read (request line and headers).
const MAX_REQUEST_HEAD: usize = 8192;
/// How long a connection may take to send its request, and we to answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// How long, and how much, unread request bytes are drained after an
/// answer.
const DRAIN_TIMEOUT: Duration = Duration::from_millis(200);
const MAX_DRAIN: usize = 64 * 1024;
/// How often the idle accept loop looks at the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// The exporter thread.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` and serves `registry` from a new thread named
    /// `metrics`.
    ///
    /// # Errors
    /// The bind error (address in use, not local, permission).
    pub fn start(addr: SocketAddr, registry: Arc<Registry>) -> io::Result<Self> {
        Self::serve(TcpListener::bind(addr)?, registry)
    }

    /// Serves `registry` on an already bound `listener` from a new thread
    /// named `metrics`.
    ///
    /// # Errors
    /// When the listener cannot be made non-blocking or the thread cannot
    /// be spawned.
    pub fn serve(listener: TcpListener, registry: Arc<Registry>) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || serve(listener, registry, flag))?;
        Ok(MetricsServer {
            local_addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address (useful when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and joins the thread (an answer in progress is
    /// finished first).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn serve(listener: TcpListener, registry: Arc<Registry>, stop: Arc<AtomicBool>) {
    while !stop.load(Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                if let Err(e) = answer(stream, &registry) {
                    tracing::debug!(%peer, "metrics request failed: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(e) => {
                tracing::warn!("metrics accept failed: {e}");
                std::thread::sleep(ACCEPT_POLL);
            }
        }
    }
}

/// Reads one request head and answers it.
fn answer(mut stream: TcpStream, registry: &Registry) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() >= MAX_REQUEST_HEAD {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "",
                false,
            );
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => respond(&mut stream, "200 OK", &registry.render(), true),
        ("HEAD", "/metrics") => respond(&mut stream, "200 OK", &registry.render(), false),
        (_, "/metrics") => respond(&mut stream, "405 Method Not Allowed", "", false),
        _ => respond(
            &mut stream,
            "404 Not Found",
            "not found; try /metrics\n",
            true,
        ),
    }
}

fn respond(stream: &mut TcpStream, status: &str, body: &str, send_body: bool) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        head.push_str("Allow: GET, HEAD\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    if send_body {
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()?;
    // Closing with unread request bytes would reset the connection and
    // could destroy the answer in flight: end our side, then drain a
    // bounded amount until the client closes.
    stream.shutdown(std::net::Shutdown::Write)?;
    stream.set_read_timeout(Some(DRAIN_TIMEOUT))?;
    let mut sink = [0u8; 1024];
    let mut drained = 0;
    while drained < MAX_DRAIN {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped() {
        assert_eq!(escape_label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape_label("x\ny"), "x\\ny");
    }

    #[test]
    fn render_has_help_type_and_samples() {
        let r = Registry::new(&[3], &["roce://127.0.0.1:20049".into()]);
        add(&r.worker(0).polls, 5);
        r.worker(0).error(ErrorKind::ReplyRefused);
        set(&r.worker(0).pool_capacity[PoolKind::Leases as usize], 128);
        add(&r.listener(0).accepted, 2);
        let text = r.render();
        assert!(text.contains("# TYPE rpcrdma_worker_polls_total counter\n"));
        assert!(text.contains("rpcrdma_worker_polls_total{worker=\"0\",core=\"3\"} 5\n"));
        assert!(text.contains(
            "rpcrdma_worker_errors_total{worker=\"0\",core=\"3\",kind=\"reply_refused\"} 1\n"
        ));
        assert!(
            text.contains("rpcrdma_pool_buffers{worker=\"0\",core=\"3\",pool=\"leases\"} 128\n")
        );
        assert!(text.contains(
            "rpcrdma_listener_connections_total{listener=\"roce://127.0.0.1:20049\"} 2\n"
        ));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "no HELP for {name}"
            );
        }
    }

    #[test]
    fn worker_counters_do_not_share_cache_lines() {
        let r = Registry::new(&[0, 1], &[]);
        let a = r.worker(0) as *const WorkerCounters as usize;
        let b = r.worker(1) as *const WorkerCounters as usize;
        assert!(b.abs_diff(a) >= 64);
        assert_eq!(a % 64, 0);
    }

    fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn http_server_answers_get_head_and_errors() {
        let r = Arc::new(Registry::new(&[0], &[]));
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), r).unwrap();
        let addr = server.local_addr();

        let get = exchange(addr, b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(get.starts_with("HTTP/1.1 200 OK\r\n"), "{get}");
        assert!(get.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        let (head, body) = get.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}\r\n", body.len())));
        assert!(body.contains("# TYPE rpcrdma_worker_polls_total counter"));

        let head = exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"));

        let post = exchange(addr, b"POST /metrics HTTP/1.1\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
        assert!(post.contains("Allow: GET, HEAD\r\n"));

        let other = exchange(addr, b"GET / HTTP/1.1\r\n\r\n");
        assert!(other.starts_with("HTTP/1.1 404 "), "{other}");

        let mut huge = b"GET /metrics HTTP/1.1\r\n".to_vec();
        huge.extend(std::iter::repeat_n(b'a', MAX_REQUEST_HEAD + 10));
        let big = exchange(addr, &huge);
        assert!(big.starts_with("HTTP/1.1 431 "), "{big}");

        server.stop();
        assert!(
            TcpStream::connect(addr).is_err(),
            "still listening after stop"
        );
    }
}
