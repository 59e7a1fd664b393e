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

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
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
    /// Sleeps of the adaptive idle.
    pub sleeps: AtomicU64,
    /// Sleeps a doorbell ended before their timeout.
    pub doorbell_wakeups: AtomicU64,
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
    /// Nanoseconds spent in loop iterations that found work.
    pub busy_ns: AtomicU64,
    /// Connections that ended cleanly (the peer's orderly close, our
    /// close, an idle timeout).
    pub closed_clean: AtomicU64,
    /// Connections that ended in a fault (protocol violation, transport
    /// or socket error, broken record).
    pub closed_fault: AtomicU64,
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
    /// Listeners by URL, in `[[listeners]]` order; a reload adds and
    /// removes entries (an acceptor keeps its own `Arc`).
    listeners: RwLock<Vec<(String, Arc<ListenerCounters>)>>,
    /// Gauge: mappings registered with rpcbind now.
    pub rpcbind_registrations: AtomicU64,
    /// The gateway's routes, copied in at each scrape.
    gateway: Mutex<Vec<GatewayRouteSample>>,
    /// The workers' latency histograms, merged at each scrape.
    latency: Mutex<Vec<LatencySample>>,
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

/// The service latency of one program, version and procedure, every
/// worker merged, as a scrape shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LatencySample {
    /// Program number.
    pub program: u32,
    /// Version.
    pub version: u32,
    /// Procedure (`other` past the table's last row).
    pub procedure: String,
    /// Upper bounds of the buckets, nanoseconds.
    pub bounds_ns: Vec<u64>,
    /// Calls per bucket (not cumulative), one more than the bounds.
    pub buckets: Vec<u64>,
    /// Sum of the latencies, nanoseconds.
    pub sum_ns: u64,
}

/// See [`Registry::set_refresher`].
pub type Refresher = Box<dyn Fn(&Registry) + Send + Sync>;

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("worker_cores", &self.worker_cores)
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
            listeners: RwLock::new(
                listener_urls
                    .iter()
                    .map(|u| (u.clone(), Arc::new(ListenerCounters::default())))
                    .collect(),
            ),
            rpcbind_registrations: AtomicU64::new(0),
            gateway: Mutex::new(Vec::new()),
            latency: Mutex::new(Vec::new()),
            refresher: Mutex::new(None),
        }
    }

    /// Installs (or with `None` removes) the function every render calls
    /// first, e.g. to copy the workers' counters in. It runs on the
    /// exporter's thread, once per scrape.
    pub fn set_refresher(&self, refresher: Option<Refresher>) {
        *lock(&self.refresher) = refresher;
    }

    /// Replaces the gateway's figures (the refresher's job).
    pub fn set_gateway(&self, routes: Vec<GatewayRouteSample>) {
        *lock(&self.gateway) = routes;
    }

    /// Replaces the merged latency histograms (the refresher's job).
    pub fn set_latency(&self, samples: Vec<LatencySample>) {
        *lock(&self.latency) = samples;
    }

    /// The counters of worker `index` (in `workers.cores` order).
    pub fn worker(&self, index: usize) -> &WorkerCounters {
        &self.workers[index]
    }

    /// Every listener's URL and counters, in order.
    pub fn listeners(&self) -> Vec<(String, Arc<ListenerCounters>)> {
        self.listeners
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The counters of listener `index` (in `[[listeners]]` order).
    ///
    /// # Panics
    /// When there is no such listener.
    pub fn listener(&self, index: usize) -> Arc<ListenerCounters> {
        Arc::clone(&self.listeners.read().unwrap_or_else(|e| e.into_inner())[index].1)
    }

    /// The counters of the listener `url`, added (zero) at the end when
    /// it is new.
    pub fn add_listener(&self, url: &str) -> Arc<ListenerCounters> {
        let mut l = self.listeners.write().unwrap_or_else(|e| e.into_inner());
        if let Some((_, c)) = l.iter().find(|(u, _)| u == url) {
            return Arc::clone(c);
        }
        let c = Arc::new(ListenerCounters::default());
        l.push((url.to_owned(), Arc::clone(&c)));
        c
    }

    /// Forgets the listener `url` (a reload removed it).
    pub fn remove_listener(&self, url: &str) {
        self.listeners
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(u, _)| u != url);
    }

    /// The whole registry in the Prometheus text format 0.0.4, encoded by
    /// the `prometheus-client` crate from a copy of every counter.
    pub fn render(&self) -> String {
        if let Some(refresh) = &*lock(&self.refresher) {
            refresh(self);
        }
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register_collector(Box::new(Scrape(self.families())));
        let mut out = String::with_capacity(16 << 10);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &reg);
        out
    }

    /// Every family with its samples, copied now.
    fn families(&self) -> Vec<Family> {
        let mut out = Vec::new();
        let workers: Vec<(Labels, &WorkerCounters)> = self
            .workers
            .iter()
            .zip(&self.worker_cores)
            .enumerate()
            .map(|(i, (w, core))| {
                (
                    vec![("worker", i.to_string()), ("core", core.to_string())],
                    &**w,
                )
            })
            .collect();
        let with = |base: &Labels, k: &'static str, v: &str| {
            let mut l = base.clone();
            l.push((k, v.to_owned()));
            l
        };

        type Field = fn(&WorkerCounters) -> &AtomicU64;
        let counters: [(&'static str, &'static str, Field); 7] = [
            (
                "rpcrdma_worker_polls_total",
                "Completion queue polls by the worker.",
                |w| &w.polls,
            ),
            (
                "rpcrdma_worker_idle_polls_total",
                "Polls that found no work.",
                |w| &w.idle_polls,
            ),
            (
                "rpcrdma_worker_sleeps_total",
                "Sleeps of the worker's adaptive idle.",
                |w| &w.sleeps,
            ),
            (
                "rpcrdma_worker_doorbell_wakeups_total",
                "Sleeps a doorbell (a peer's message, a hand-off, a stop) ended before their timeout.",
                |w| &w.doorbell_wakeups,
            ),
            (
                "rpcrdma_worker_completions_total",
                "Work completions reaped.",
                |w| &w.completions,
            ),
            (
                "rpcrdma_worker_rpcs_total",
                "RPCs completed (replies sent).",
                |w| &w.rpcs,
            ),
            (
                "rpcrdma_bulk_pool_empty_total",
                "Times a call found the worker's bulk pool empty and waited.",
                |w| &w.bulk_pool_empty,
            ),
        ];
        for (name, help, field) in counters {
            out.push(Family::counter(
                name,
                help,
                workers
                    .iter()
                    .map(|(l, w)| (l.clone(), field(w).load(Relaxed)))
                    .collect(),
            ));
        }
        out.push(Family {
            name: "rpcrdma_worker_busy_seconds_total",
            help: "Time the worker spent in loop iterations that found work.",
            values: Values::Seconds(
                workers
                    .iter()
                    .map(|(l, w)| (l.clone(), w.busy_ns.load(Relaxed) as f64 / 1e9))
                    .collect(),
            ),
        });
        out.push(Family::gauge(
            "rpcrdma_worker_credits_in_use",
            "Credits granted to peers and not yet used.",
            workers
                .iter()
                .map(|(l, w)| (l.clone(), w.credits_in_use.load(Relaxed)))
                .collect(),
        ));
        let mut bytes = Vec::new();
        let mut errors = Vec::new();
        let mut closed = Vec::new();
        let mut in_use = Vec::new();
        let mut capacity = Vec::new();
        for (l, w) in &workers {
            for (dir, v) in [("received", &w.bytes_received), ("sent", &w.bytes_sent)] {
                bytes.push((with(l, "direction", dir), v.load(Relaxed)));
            }
            for kind in ErrorKind::ALL {
                errors.push((
                    with(l, "kind", kind.label()),
                    w.errors[kind as usize].load(Relaxed),
                ));
            }
            for (how, v) in [("clean", &w.closed_clean), ("fault", &w.closed_fault)] {
                closed.push((with(l, "how", how), v.load(Relaxed)));
            }
            for pool in PoolKind::ALL {
                in_use.push((
                    with(l, "pool", pool.label()),
                    w.pool_in_use[pool as usize].load(Relaxed),
                ));
                capacity.push((
                    with(l, "pool", pool.label()),
                    w.pool_capacity[pool as usize].load(Relaxed),
                ));
            }
        }
        out.push(Family::counter(
            "rpcrdma_worker_bytes_total",
            "Payload bytes moved by the worker.",
            bytes,
        ));
        out.push(Family::counter(
            "rpcrdma_worker_errors_total",
            "Data-path errors by kind.",
            errors,
        ));
        out.push(Family::counter(
            "rpcrdma_connections_closed_total",
            "Connections ended, by how: clean (the peer's orderly close, our close, an idle timeout) or fault (protocol violation, transport or socket error, broken record).",
            closed,
        ));
        out.push(Family::gauge(
            "rpcrdma_pool_buffers_in_use",
            "Buffers taken from the worker's pool.",
            in_use,
        ));
        out.push(Family::gauge(
            "rpcrdma_pool_buffers",
            "Buffers in the worker's pool.",
            capacity,
        ));

        let listeners = self.listeners();
        let label = |url: &str| -> Labels { vec![("listener", url.to_owned())] };
        let mut rejected = Vec::new();
        for (url, l) in &listeners {
            for r in crate::refusal::Refusal::ALL {
                rejected.push((
                    with(&label(url), "reason", r.label()),
                    l.rejected[r as usize].load(Relaxed),
                ));
            }
        }
        out.push(Family::counter(
            "rpcrdma_listener_rejected_total",
            "Connection attempts refused on the listener, by reason.",
            rejected,
        ));
        type LField = fn(&ListenerCounters) -> &AtomicU64;
        let per_listener: [(&'static str, bool, &'static str, LField); 3] = [
            (
                "rpcrdma_listener_connections_total",
                true,
                "Connections accepted on the listener.",
                |l| &l.accepted,
            ),
            (
                "rpcrdma_listener_connections",
                false,
                "Connections open on the listener.",
                |l| &l.active,
            ),
            (
                "rpcrdma_listener_serving",
                false,
                "1 while the data path serves the listener, 0 while it is pending.",
                |l| &l.serving,
            ),
        ];
        for (name, counter, help, field) in per_listener {
            let samples = listeners
                .iter()
                .map(|(url, l)| (label(url), field(l).load(Relaxed)))
                .collect();
            out.push(if counter {
                Family::counter(name, help, samples)
            } else {
                Family::gauge(name, help, samples)
            });
        }

        let latency = lock(&self.latency).clone();
        out.push(Family {
            name: "rpcrdma_rpc_latency_seconds",
            help: "Service latency of calls answered by the daemon's own programs, per program, version and procedure, from dispatch to reply encoded (every worker merged).",
            values: Values::Histogram(
                latency
                    .iter()
                    .map(|s| {
                        (
                            vec![
                                ("program", s.program.to_string()),
                                ("version", s.version.to_string()),
                                ("procedure", s.procedure.clone()),
                            ],
                            Hist::from_ns(&s.bounds_ns, &s.buckets, s.sum_ns),
                        )
                    })
                    .collect(),
            ),
        });

        self.gateway_families(&mut out);

        out.push(Family::gauge(
            "rpcrdma_rpcbind_registrations",
            "Mappings registered with rpcbind.",
            vec![(Vec::new(), self.rpcbind_registrations.load(Relaxed))],
        ));
        out.push(Family::gauge(
            "rpcrdma_build_info",
            "Version of rpcrdmad; always 1.",
            vec![(vec![("version", env!("CARGO_PKG_VERSION").to_owned())], 1)],
        ));
        out
    }

    /// The gateway's families: per route (program, backend), counters and
    /// a latency histogram. Nothing when no program is routed.
    fn gateway_families(&self, out: &mut Vec<Family>) {
        let routes = lock(&self.gateway).clone();
        if routes.is_empty() {
            return;
        }
        let labels = |r: &GatewayRouteSample| -> Labels {
            vec![
                ("program", r.program.to_string()),
                ("backend", r.backend.clone()),
            ]
        };
        type Field = fn(&GatewayRouteSample) -> u64;
        let families: [(&'static str, &'static str, Field); 6] = [
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
            out.push(Family::counter(
                name,
                help,
                routes.iter().map(|r| (labels(r), field(r))).collect(),
            ));
        }
        let kinds = |f: fn(&GatewayRouteSample) -> &[(&'static str, u64)]| {
            routes
                .iter()
                .flat_map(|r| {
                    f(r).iter().map(move |(kind, v)| {
                        let mut l = labels(r);
                        l.push(("kind", (*kind).to_owned()));
                        (l, *v)
                    })
                })
                .collect()
        };
        out.push(Family::counter(
            "rpcrdma_gateway_errors_total",
            "Relay errors by kind: timeout and busy calls were answered SYSTEM_ERR; connection counts lost or refused backend connections; stray_reply counts replies that matched no call.",
            kinds(|r| &r.errors),
        ));
        out.push(Family::counter(
            "rpcrdma_gateway_reply_cache_total",
            "Retransmitted non-idempotent calls the duplicate request cache handled: hit (answered from the cache), joined (answered with the reply of the call still at the backend).",
            kinds(|r| &r.reply_cache),
        ));
        out.push(Family {
            name: "rpcrdma_gateway_latency_seconds",
            help: "Backend reply latency, forward to reply.",
            values: Values::Histogram(
                routes
                    .iter()
                    .map(|r| {
                        let bounds: Vec<u64> =
                            r.latency_bounds_us.iter().map(|us| us * 1000).collect();
                        (
                            labels(r),
                            Hist::from_ns(&bounds, &r.latency_buckets, r.latency_sum_ns),
                        )
                    })
                    .collect(),
            ),
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Label pairs of one sample.
type Labels = Vec<(&'static str, String)>;

/// One metric family as copied at a scrape.
#[derive(Debug)]
struct Family {
    /// The exposed name (counters with their `_total`).
    name: &'static str,
    help: &'static str,
    values: Values,
}

#[derive(Debug)]
enum Values {
    Counter(Vec<(Labels, u64)>),
    /// A counter of seconds (a float).
    Seconds(Vec<(Labels, f64)>),
    Gauge(Vec<(Labels, i64)>),
    Histogram(Vec<(Labels, Hist)>),
}

/// A histogram's buckets as the encoder takes them.
#[derive(Debug)]
struct Hist {
    /// (upper bound in seconds, count in that bucket), not cumulative;
    /// the last bound is +Inf.
    buckets: Vec<(f64, u64)>,
    count: u64,
    sum_s: f64,
}

impl Hist {
    fn from_ns(bounds_ns: &[u64], counts: &[u64], sum_ns: u64) -> Hist {
        let buckets: Vec<(f64, u64)> = counts
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let le = bounds_ns.get(i).map_or(f64::INFINITY, |&b| b as f64 / 1e9);
                (le, n)
            })
            .collect();
        Hist {
            count: counts.iter().sum(),
            buckets,
            sum_s: sum_ns as f64 / 1e9,
        }
    }
}

impl Family {
    fn counter(name: &'static str, help: &'static str, v: Vec<(Labels, u64)>) -> Family {
        Family {
            name,
            help,
            values: Values::Counter(v),
        }
    }

    fn gauge(name: &'static str, help: &'static str, v: Vec<(Labels, u64)>) -> Family {
        Family {
            name,
            help,
            values: Values::Gauge(
                v.into_iter()
                    .map(|(l, x)| (l, i64::try_from(x).unwrap_or(i64::MAX)))
                    .collect(),
            ),
        }
    }
}

/// A scrape's copy of every family, encoded by `prometheus-client`.
#[derive(Debug)]
struct Scrape(Vec<Family>);

impl prometheus_client::collector::Collector for Scrape {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::NoLabelSet;
        use prometheus_client::metrics::MetricType;
        for f in &self.0 {
            // The encoder appends `_total` to a counter's name itself.
            let (name, kind) = match f.values {
                Values::Counter(_) | Values::Seconds(_) => (
                    f.name.strip_suffix("_total").unwrap_or(f.name),
                    MetricType::Counter,
                ),
                Values::Gauge(_) => (f.name, MetricType::Gauge),
                Values::Histogram(_) => (f.name, MetricType::Histogram),
            };
            let mut m = encoder.encode_descriptor(name, f.help, None, kind)?;
            match &f.values {
                Values::Counter(v) => {
                    for (labels, x) in v {
                        m.encode_family(labels)?
                            .encode_counter::<NoLabelSet, u64, u64>(x, None)?;
                    }
                }
                Values::Seconds(v) => {
                    for (labels, x) in v {
                        m.encode_family(labels)?
                            .encode_counter::<NoLabelSet, f64, f64>(x, None)?;
                    }
                }
                Values::Gauge(v) => {
                    for (labels, x) in v {
                        m.encode_family(labels)?.encode_gauge(x)?;
                    }
                }
                Values::Histogram(v) => {
                    for (labels, h) in v {
                        m.encode_family(labels)?
                            .encode_histogram::<NoLabelSet>(h.sum_s, h.count, &h.buckets, None)?;
                    }
                }
            }
        }
        Ok(())
    }
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
    let mut failures = crate::ratelimit::Warnings::default();
    while !stop.load(Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                if let Err(e) = answer(stream, &registry) {
                    tracing::debug!(%peer, "metrics request failed: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(e) => {
                failures.warn(std::time::Instant::now(), || {
                    format!("metrics accept failed: {e}")
                });
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
        "HTTP/1.1 {status}\r\nContent-Type: {}\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
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
        let r = Registry::new(&[0], &["tcp://a\"b\\c".into()]);
        let text = r.render();
        assert!(
            text.contains("rpcrdma_listener_serving{listener=\"tcp://a\\\"b\\\\c\"} 0\n"),
            "{text}"
        );
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
