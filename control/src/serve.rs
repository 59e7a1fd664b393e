//! The data path as the daemon runs it: one set of workers for every
//! transport, one acceptor thread per listener, and the bridge from the
//! workers' counters to the metrics registry.
//!
//! ```text
//! start:    engine/endpoint config from [transport] [chunks] [memory],
//!           TCP limits from transport.max_message
//!           -> WorkerSet: ONE pinned thread per workers.cores entry, which
//!              polls the shm and roce connections and the tcp connections
//!              it is given (one worker per core)
//!           -> attach each provider in use (its context and PD)
//!           -> per listener: listen, then an acceptor thread:
//!              shm/roce: accept (RFC 8797 private data, receives
//!                        pre-posted) -> hand off to the least-loaded worker
//!              tcp:      poll(2) the listening socket, accept the waiting
//!                        streams -> hand each to the least-loaded worker
//! stop_accepting: acceptor threads end, listeners close (socket removed)
//! finish:   workers get shutdown.grace_ms for calls in progress (tcp:
//!           no new calls read, replies written, FIN), close everything,
//!           and report pools that did not come back full
//! ```
//!
//! "Least loaded" counts every transport's connections on a worker.
//! `ibverbs://` listeners are served by a build with the `ibverbs` feature;
//! other builds refuse them at start with one line naming the schemes
//! that are served.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dataplane::engine;
use dataplane::mem::Backing;
use dataplane::service::ServiceTable;
use dataplane::tcp::{PeerCounts, TcpAcceptor, TcpConfig, TcpError};
#[cfg(feature = "ibverbs")]
use dataplane::verbs::ibverbs::Ibverbs;
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;
use dataplane::verbs::{Context as _, VerbsError};
use dataplane::worker::{
    Dispatcher, EndpointConfig, IdleStrategy as WorkerIdle, PoolProvider, ShutdownReport,
    Transport, WorkerConfig, WorkerError, WorkerSet,
};

use crate::config::{Config, Hugepages, IdleStrategy, ProviderUrl};
use crate::metrics::{self, ErrorKind, PoolKind, Registry};
use crate::refusal::{Refusal, RefusalLog};

/// How long an acceptor waits for a connection request before it looks at
/// the stop flag again.
const ACCEPT_POLL: Duration = Duration::from_millis(100);

/// Why the data path could not start: one line each.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A gateway route's backend could not be found.
    #[error("{0}")]
    Gateway(#[from] crate::gateway::GatewayError),
    /// The worker pool could not start (core not in the mask, ...).
    #[error("cannot start the workers (workers.cores): {0}")]
    Workers(#[from] WorkerError),
    /// A worker's bulk pool could not be set up.
    #[error("{0} (workers.bulk_buffers x transport.max_message per worker and RDMA provider)")]
    BulkPool(WorkerError),
    /// A listener could not be opened.
    #[error("cannot listen on {url} (listeners[{index}].url): {source}")]
    Listen {
        /// The listener.
        url: ProviderUrl,
        /// Its position in `[[listeners]]`.
        index: usize,
        /// The provider's error.
        source: VerbsError,
    },
    /// A tcp listener could not be opened.
    #[error("cannot listen on {url} (listeners[{index}].url): {source}; free the port or change the url")]
    ListenTcp {
        /// The listener.
        url: ProviderUrl,
        /// Its position in `[[listeners]]`.
        index: usize,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The listener's provider is not served by this build.
    #[error(
        "cannot listen on {url} (listeners[{index}].url): the {scheme} provider is not served \
         by this build of rpcrdmad; served here: {served}"
    )]
    Unserved {
        /// The listener.
        url: ProviderUrl,
        /// Its position.
        index: usize,
        /// Its scheme.
        scheme: &'static str,
        /// The schemes that are served.
        served: &'static str,
    },
    /// An acceptor thread could not be spawned.
    #[error("cannot start the acceptor thread for {0}: {1}")]
    Thread(ProviderUrl, std::io::Error),
}

/// The schemes this build serves (for the error line above).
#[cfg(feature = "ibverbs")]
pub const SERVED_SCHEMES: &str = "shm://, roce://, ibverbs://, tcp://";
/// The schemes this build serves (for the error line above).
#[cfg(not(feature = "ibverbs"))]
pub const SERVED_SCHEMES: &str =
    "shm://, roce://, tcp:// (ibverbs:// needs a build with --features control/ibverbs)";

/// Whether this build serves listeners of `url`'s provider.
fn served(url: &ProviderUrl) -> bool {
    match url {
        ProviderUrl::Shm { .. } | ProviderUrl::Roce(_) | ProviderUrl::Tcp(_) => true,
        ProviderUrl::Ibverbs(_) => cfg!(feature = "ibverbs"),
    }
}

/// The engine and endpoint configuration the daemon's connections use.
pub fn endpoint_config(c: &Config) -> EndpointConfig {
    let t = &c.transport;
    let engine = engine::Config {
        inline_recv_size: t.inline_receive,
        inline_send_size: t.inline_send,
        credits: t.credits,
        // The daemon answers calls; it sends none of its own, so its
        // connections carry no requester buffers.
        max_outstanding_calls: 0,
        max_call_size: t.max_message,
        max_reply_size: t.max_message,
        max_ddp_size: 4096,
        max_rdma_read: t.max_rdma_read,
        inbound_rdma_read: t.max_rdma_read,
        serve_conf_rdma: true,
        extensions: t.extension_set(),
        limits: c.chunks.to_wire_limits(),
        idle_timeout: (t.idle_timeout_s > 0).then(|| Duration::from_secs(t.idle_timeout_s.into())),
        ..engine::Config::default()
    };
    EndpointConfig {
        engine,
        backing: match c.memory.hugepages {
            Hugepages::Off => Backing::Small,
            Hugepages::Prefer => Backing::Auto,
            Hugepages::Required => Backing::Huge,
        },
        // The daemon answers calls: its peers need a key to its memory
        // only when it may expose replies in responder-provided read
        // chunks (`transport.extensions`).
        expose_memory: engine.reply_read_chunks
            || engine
                .extensions
                .contains(engine::Extensions::RESPONDER_READ_CHUNKS),
        max_send_wr: dataplane::worker::SERVER_MAX_SEND_WR,
        ..EndpointConfig::default()
    }
}

/// The extensions the daemon's connections advertise in CONF_RDMA
/// version 2: those of `transport.extensions` the engine implements
/// (`Connection::advertised_extensions`, which depends on the configured
/// set alone, so a small probe connection answers it).
pub fn offered_extensions(c: &Config) -> engine::Extensions {
    engine::Connection::new(engine::Config {
        extensions: c.transport.extension_set(),
        ..engine::Config::default()
    })
    .map_or(engine::Extensions::EMPTY, |probe| {
        probe.advertised_extensions()
    })
}

/// The TCP limits: a call record and a reply may each be
/// `transport.max_message` bytes, like an RDMA message; the rest are the
/// `dataplane::tcp` defaults (docs/TCP.md).
pub fn tcp_config(c: &Config) -> TcpConfig {
    let max = c.transport.max_message as usize;
    TcpConfig {
        max_record_len: max,
        max_reply_len: max,
        ..TcpConfig::default()
    }
}

/// The worker configuration from `[workers]`.
pub fn worker_config(c: &Config) -> WorkerConfig {
    WorkerConfig {
        endpoint: endpoint_config(c),
        tcp: tcp_config(c),
        idle: match c.workers.idle {
            IdleStrategy::Spin => WorkerIdle::Spin,
            IdleStrategy::Adaptive => WorkerIdle::Adaptive {
                park_max: Duration::from_micros(c.workers.park_max_us.into()),
            },
        },
        max_connections: c.workers.max_connections as usize,
        bulk_buffers: c.workers.bulk_buffers,
        shared_receives: c.workers.shared_receives,
        ring_capacity: c.workers.control_ring as usize,
        tcp_peers: (c.workers.max_connections_per_peer > 0)
            .then(|| Arc::new(PeerCounts::new(c.workers.max_connections_per_peer))),
        ..WorkerConfig::default()
    }
}

/// The running data path.
pub struct DataPath {
    workers: Option<Arc<WorkerSet>>,
    /// The listeners served, each with its own acceptor thread.
    listeners: Vec<Served>,
    /// Peer uids allowed on shm listeners (ours and `shm.allowed_uids`).
    uids: Vec<u32>,
    /// `shm.max_connections_per_uid` (0: no limit).
    per_uid: u32,
}

/// One listener being served: its acceptor thread and what stops it.
struct Served {
    url: ProviderUrl,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<metrics::ListenerCounters>,
}

impl Served {
    /// Ends the acceptor thread; its listener closes (an shm socket is
    /// removed). Connections it accepted stay with their workers.
    fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        metrics::set(&self.counters.serving, 0);
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop();
    }
}

impl std::fmt::Debug for DataPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPath")
            .field("workers", &self.workers)
            .field(
                "listeners",
                &self.listeners.iter().map(|l| &l.url).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// What a change of `[[listeners]]` did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ListenerChanges {
    /// Listeners now served that were not.
    pub added: Vec<ProviderUrl>,
    /// Listeners no longer served.
    pub removed: Vec<ProviderUrl>,
}

impl DataPath {
    /// Starts the workers and listens on every listener.
    ///
    /// # Errors
    /// [`ServeError`]: the first listener or worker problem.
    pub fn start(config: &Config, registry: &Arc<Registry>) -> Result<DataPath, ServeError> {
        for (index, l) in config.listeners.iter().enumerate() {
            if !served(&l.url) {
                return Err(ServeError::Unserved {
                    url: l.url.clone(),
                    index,
                    scheme: l.url.scheme(),
                    served: SERVED_SCHEMES,
                });
            }
        }
        let extensions = config.transport.extension_set();
        if !extensions.is_empty() {
            use dataplane::extension_names::Names;
            tracing::info!(
                "transport: extensions configured: {}; offered to clients that negotiate with \
                 CONF_RDMA version 2: {}",
                Names(extensions),
                Names(offered_extensions(config))
            );
        }
        let services: Arc<ServiceTable> = Arc::new(ServiceTable::builtin());
        let dispatcher: Arc<dyn Dispatcher> = services;
        let cores: Vec<Option<usize>> = config.workers.cores.iter().map(|&c| Some(c)).collect();
        let mut workers = worker_config(config);
        workers.gateway = crate::gateway::setup(config)?;
        let mut set = WorkerSet::spawn(&cores, workers, dispatcher)?;
        attach::<Shm>(config, &mut set)?;
        attach::<Roce>(config, &mut set)?;
        #[cfg(feature = "ibverbs")]
        attach::<Ibverbs>(config, &mut set)?;
        let set = Arc::new(set);
        // shm.allowed_uids come in addition to our own uid.
        let mut uids = vec![nix::unistd::getuid().as_raw()];
        uids.extend(&config.shm.allowed_uids);
        let mut path = DataPath {
            workers: Some(Arc::clone(&set)),
            listeners: Vec::new(),
            uids,
            per_uid: config.shm.max_connections_per_uid,
        };
        for (index, l) in config.listeners.iter().enumerate() {
            let served = path.open(&l.url, index, registry)?;
            path.listeners.push(served);
        }
        install_metrics_bridge(&set, registry);
        Ok(path)
    }

    /// Listens on `url` (listener `index` of the configuration) and starts
    /// its acceptor thread.
    fn open(
        &self,
        url: &ProviderUrl,
        index: usize,
        registry: &Registry,
    ) -> Result<Served, ServeError> {
        let Some(set) = self.workers.as_ref() else {
            return Err(ServeError::Workers(WorkerError::Busy));
        };
        if !served(url) {
            return Err(ServeError::Unserved {
                url: url.clone(),
                index,
                scheme: url.scheme(),
                served: SERVED_SCHEMES,
            });
        }
        let stop = Arc::new(AtomicBool::new(false));
        let counters = registry.add_listener(&url.to_string());
        let thread = |e| ServeError::Thread(url.clone(), e);
        let handle = match url {
            ProviderUrl::Shm { .. } => {
                let listener = listen::<Shm>(set, url, index)?;
                listener.allow_uids(&self.uids);
                listener.limit_per_uid(self.per_uid);
                spawn_acceptor::<Shm>(url, index, set, listener, &stop, &counters, |l| {
                    ProviderRefusals {
                        peer_memory_faults: l.peer_memory_faults(),
                        ..ProviderRefusals::default()
                    }
                })
                .map_err(thread)?
            }
            ProviderUrl::Roce(_) => {
                let listener = listen::<Roce>(set, url, index)?;
                spawn_acceptor::<Roce>(url, index, set, listener, &stop, &counters, |l| {
                    ProviderRefusals {
                        half_open: l.device_stats().half_open_refused,
                        cm_queue_full: l.device_stats().mads_dropped,
                        ..ProviderRefusals::default()
                    }
                })
                .map_err(thread)?
            }
            ProviderUrl::Tcp(addr) => {
                let acceptor = TcpAcceptor::bind(*addr).map_err(|e| ServeError::ListenTcp {
                    url: url.clone(),
                    index,
                    source: tcp_io_error(e),
                })?;
                spawn_tcp_acceptor(url, index, set, acceptor, &stop, &counters).map_err(thread)?
            }
            #[cfg(feature = "ibverbs")]
            ProviderUrl::Ibverbs(_) => {
                let listener = listen::<Ibverbs>(set, url, index)?;
                spawn_acceptor::<Ibverbs>(url, index, set, listener, &stop, &counters, |_| {
                    ProviderRefusals::default()
                })
                .map_err(thread)?
            }
            // Refused above.
            #[cfg(not(feature = "ibverbs"))]
            ProviderUrl::Ibverbs(_) => unreachable!("unserved providers are refused first"),
        };
        metrics::set(&counters.serving, 1);
        Ok(Served {
            url: url.clone(),
            stop,
            thread: Some(handle),
            counters,
        })
    }

    /// Serves exactly the listeners `wanted` (a reload): the new ones are
    /// opened first, and if any cannot be, those just opened are closed
    /// again and nothing changes; then the ones no longer wanted stop
    /// accepting. Established connections are never touched: they belong
    /// to their workers, whichever listener accepted them.
    ///
    /// # Errors
    /// [`ServeError`] for the first new listener that cannot be opened
    /// (address in use, a provider the daemon was not started with).
    pub fn set_listeners(
        &mut self,
        wanted: &[crate::config::Listener],
        registry: &Registry,
    ) -> Result<ListenerChanges, ServeError> {
        let mut opened = Vec::new();
        for (index, l) in wanted.iter().enumerate() {
            if self.listeners.iter().any(|s| s.url == l.url) {
                continue;
            }
            match self.open(&l.url, index, registry) {
                Ok(s) => opened.push(s),
                Err(e) => {
                    for s in &opened {
                        registry.remove_listener(&s.url.to_string());
                    }
                    // Dropping them stops their acceptors.
                    drop(opened);
                    return Err(e);
                }
            }
        }
        let mut changes = ListenerChanges {
            added: opened.iter().map(|s| s.url.clone()).collect(),
            removed: Vec::new(),
        };
        let (keep, gone): (Vec<Served>, Vec<Served>) = std::mem::take(&mut self.listeners)
            .into_iter()
            .partition(|s| wanted.iter().any(|l| l.url == s.url));
        for mut s in gone {
            s.stop();
            registry.remove_listener(&s.url.to_string());
            changes.removed.push(s.url.clone());
        }
        self.listeners = keep;
        self.listeners.extend(opened);
        // In configuration order, as the status and metrics list them.
        self.listeners.sort_by_key(|s| {
            wanted
                .iter()
                .position(|l| l.url == s.url)
                .unwrap_or(usize::MAX)
        });
        Ok(changes)
    }

    /// Relays for `config`'s `[[gateway]]` routes, built for every worker
    /// (backends asked of rpcbind, buffers mapped) without changing what
    /// is served.
    ///
    /// # Errors
    /// [`ServeError`]: a backend rpcbind does not know, a relay that
    /// cannot be built.
    pub fn prepare_gateway(
        &self,
        config: &Config,
    ) -> Result<dataplane::worker::PreparedGateway, ServeError> {
        let setup = crate::gateway::setup(config)?;
        let set = self
            .workers
            .as_ref()
            .ok_or(ServeError::Workers(WorkerError::Busy))?;
        Ok(set.prepare_gateway(setup)?)
    }

    /// Makes the workers relay with `prepared` (calls at the old backends
    /// are still answered).
    pub fn swap_gateway(&self, prepared: dataplane::worker::PreparedGateway) {
        if let Some(set) = &self.workers {
            set.swap_gateway(prepared);
        }
    }

    /// Changes the connection limit of the workers.
    pub fn set_max_connections(&self, limit: usize) {
        if let Some(set) = &self.workers {
            set.set_max_connections(limit);
        }
    }

    /// The workers, for readers that must not keep them alive (the
    /// status socket).
    pub fn workers(&self) -> std::sync::Weak<WorkerSet> {
        self.workers
            .as_ref()
            .map_or_else(std::sync::Weak::new, Arc::downgrade)
    }

    /// Connections closed so far, every worker and transport (opened
    /// minus open).
    pub fn closed_connections(&self) -> u64 {
        self.workers.as_ref().map_or(0, |set| {
            set.snapshot()
                .iter()
                .map(|w| w.connections_total.saturating_sub(w.connections))
                .sum()
        })
    }

    /// Stops accepting: every acceptor thread ends and its listener closes.
    pub fn stop_accepting(&mut self) {
        // Every flag first, so that the acceptors wind down together.
        for s in &self.listeners {
            s.stop.store(true, Ordering::SeqCst);
        }
        for s in &mut self.listeners {
            s.stop();
        }
    }

    /// Lets calls in progress finish within `grace`, closes every
    /// connection and stops the workers. The report names any pool that
    /// did not come back full.
    pub fn finish(mut self, registry: &Registry, grace: Duration) -> ShutdownReport {
        self.stop_accepting();
        self.listeners.clear();
        registry.set_refresher(None);
        match self.workers.take().map(Arc::try_unwrap) {
            Some(Ok(set)) => set.stop(grace),
            Some(Err(_)) => {
                tracing::error!("workers still shared at shutdown; not stopped");
                ShutdownReport::default()
            }
            None => ShutdownReport::default(),
        }
    }
}

impl Drop for DataPath {
    /// A data path dropped without [`DataPath::finish`] (a later listener
    /// failed at start, or an embedding application lets go of it) still
    /// stops its acceptors; the workers stop when their set is dropped.
    fn drop(&mut self) {
        self.stop_accepting();
    }
}

/// Attaches provider `P` to the workers when a listener uses it: its
/// context is opened on the first such listener's URL.
fn attach<P: PoolProvider>(config: &Config, set: &mut WorkerSet) -> Result<(), ServeError> {
    let Some((index, l)) = config
        .listeners
        .iter()
        .enumerate()
        .find(|(_, l)| l.url.scheme() == P::SCHEME)
    else {
        return Ok(());
    };
    let listen_error = |source| ServeError::Listen {
        url: l.url.clone(),
        index,
        source,
    };
    let ctx = P::open(&l.url.to_string()).map_err(listen_error)?;
    match set.attach::<P>(Arc::new(ctx)) {
        Ok(()) => Ok(()),
        Err(WorkerError::Verbs(e)) => Err(listen_error(e)),
        Err(e @ WorkerError::BulkPool { .. }) => Err(ServeError::BulkPool(e)),
        Err(e) => Err(ServeError::Workers(e)),
    }
}

/// Listens on an RDMA listener of provider `P` (attached by [`attach`]).
fn listen<P: PoolProvider>(
    set: &WorkerSet,
    url: &ProviderUrl,
    index: usize,
) -> Result<P::Listener, ServeError> {
    let listen_error = |source| ServeError::Listen {
        url: url.clone(),
        index,
        source,
    };
    let ctx = set
        .context::<P>()
        .ok_or(ServeError::Workers(WorkerError::NotAttached {
            scheme: P::SCHEME,
        }))?;
    ctx.listen(&url.to_string()).map_err(listen_error)
}

/// The operating system's error inside a [`TcpError`].
fn tcp_io_error(e: TcpError) -> std::io::Error {
    match e {
        TcpError::Bind { source, .. } | TcpError::Io { source, .. } => source,
        other => std::io::Error::other(other.to_string()),
    }
}

/// What a provider refused or ended on its own, as running totals for
/// the listener: the acceptor counts and logs the increase under its
/// reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ProviderRefusals {
    /// roce: connection requests over the per-address half-open bound,
    /// rejected before the daemon saw them (for the listener's device).
    half_open: u64,
    /// shm: connections ended because their peer punched a hole in
    /// shared writable memory that faulted (the SIGBUS guard).
    peer_memory_faults: u64,
    /// roce: connection-manager messages dropped because the device's
    /// queue for them was full.
    cm_queue_full: u64,
}

/// Reads a listener's [`ProviderRefusals`].
type ProviderRefusalsOf<L> = fn(&L) -> ProviderRefusals;

#[allow(clippy::too_many_arguments)]
fn spawn_acceptor<P: PoolProvider>(
    url: &ProviderUrl,
    index: usize,
    set: &Arc<WorkerSet>,
    listener: P::Listener,
    stop: &Arc<AtomicBool>,
    counters: &Arc<metrics::ListenerCounters>,
    provider_refusals: ProviderRefusalsOf<P::Listener>,
) -> std::io::Result<JoinHandle<()>> {
    let (url, set, stop, counters) = (
        url.clone(),
        Arc::clone(set),
        Arc::clone(stop),
        Arc::clone(counters),
    );
    // The provider's counts are its device's, which other listeners may
    // share: what they held before this listener is not its refusals. The
    // baseline is read here, before the thread exists: read in the thread,
    // it missed refusals made before the thread first ran (a flood sent
    // as soon as the daemon said it had started was refused, and never
    // counted).
    let mut provider_seen = provider_refusals(&listener);
    std::thread::Builder::new()
        .name(format!("rpcrdma-acc{index}"))
        .spawn(move || {
            let mut log = RefusalLog::new(url.to_string());
            while !stop.load(Ordering::SeqCst) {
                let refused = provider_refusals(&listener);
                if refused.half_open > provider_seen.half_open {
                    let n = refused.half_open - provider_seen.half_open;
                    metrics::add(&counters.rejected[Refusal::HalfOpen as usize], n);
                    log.refused(Instant::now(), Refusal::HalfOpen, || {
                        format!(
                            "{n} connection request(s) rejected: their address already has \
                             the most connections half-open the provider allows"
                        )
                    });
                }
                if refused.peer_memory_faults > provider_seen.peer_memory_faults {
                    let n = refused.peer_memory_faults - provider_seen.peer_memory_faults;
                    metrics::add(&counters.rejected[Refusal::PeerMemoryFault as usize], n);
                    log.refused(Instant::now(), Refusal::PeerMemoryFault, || {
                        format!(
                            "{n} connection(s) ended: the peer punched a hole in memory shared \
                             writable with it and the hugepage pool could not refill it \
                             (the daemon replaced the page and goes on)"
                        )
                    });
                }
                if refused.cm_queue_full > provider_seen.cm_queue_full {
                    let n = refused.cm_queue_full - provider_seen.cm_queue_full;
                    metrics::add(&counters.rejected[Refusal::CmQueueFull as usize], n);
                    log.refused(Instant::now(), Refusal::CmQueueFull, || {
                        format!(
                            "{n} connection-manager message(s) dropped: the device's queue for \
                             them was full (a flood of connection requests; real senders retry)"
                        )
                    });
                }
                provider_seen = refused;
                match set.accept::<P>(&listener, ACCEPT_POLL) {
                    Ok(worker) => {
                        metrics::add(&counters.accepted, 1);
                        tracing::debug!("{url}: connection handed to worker {worker}");
                    }
                    Err(WorkerError::Verbs(VerbsError::Timeout)) => {}
                    Err(e) => {
                        let reason = Refusal::of(&e);
                        counters.refused(reason);
                        log.refused(Instant::now(), reason, || e.to_string());
                    }
                }
            }
            // Dropping the listener closes it (and removes an shm socket).
            drop(listener);
        })
}

/// Accepts per wake-up of a tcp acceptor, so that a connect storm is
/// handed out in bounded batches.
const TCP_ACCEPT_BATCH: usize = 16;

/// How often a tcp acceptor with streams waiting for a worker's ring
/// tries again.
const TCP_HAND_OFF_RETRY: Duration = Duration::from_millis(1);

fn spawn_tcp_acceptor(
    url: &ProviderUrl,
    index: usize,
    set: &Arc<WorkerSet>,
    acceptor: TcpAcceptor,
    stop: &Arc<AtomicBool>,
    counters: &Arc<metrics::ListenerCounters>,
) -> std::io::Result<JoinHandle<()>> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let (url, set, stop, counters) = (
        url.clone(),
        Arc::clone(set),
        Arc::clone(stop),
        Arc::clone(counters),
    );
    let wait = PollTimeout::try_from(ACCEPT_POLL).unwrap_or(PollTimeout::MAX);
    let retry = PollTimeout::try_from(TCP_HAND_OFF_RETRY).unwrap_or(PollTimeout::MAX);
    std::thread::Builder::new()
        .name(format!("rpcrdma-acc{index}"))
        .spawn(move || {
            let mut log = RefusalLog::new(url.to_string());
            // Streams accepted while every worker's control ring was full,
            // oldest first: a connect burst waits here for the rings to
            // drain instead of being closed unread. Counted against
            // workers.max_connections like the connections served.
            let mut waiting: VecDeque<(TcpStream, SocketAddr)> = VecDeque::new();
            while !stop.load(Ordering::SeqCst) {
                while let Some((stream, peer)) = waiting.pop_front() {
                    match set.hand_off_tcp(stream) {
                        Ok(worker) => {
                            metrics::add(&counters.accepted, 1);
                            tracing::debug!("{url}: {peer} handed to worker {worker}");
                        }
                        Err(stream) => {
                            waiting.push_front((stream, peer));
                            break;
                        }
                    }
                }
                // Sleep until a connection waits (or look at the stop flag
                // again, or at the streams waiting for a ring); the socket
                // itself is non-blocking.
                let mut fds = [PollFd::new(acceptor.as_fd(), PollFlags::POLLIN)];
                let timeout = if waiting.is_empty() { wait } else { retry };
                if !matches!(poll(&mut fds, timeout), Ok(n) if n > 0) {
                    continue;
                }
                let accepted = acceptor.accept_ready(TCP_ACCEPT_BATCH, |stream, peer| {
                    if let Err(e) = set.admit_more(waiting.len()) {
                        counters.refused(Refusal::Limit);
                        log.refused(Instant::now(), Refusal::Limit, || format!("{peer}: {e}"));
                        drop(stream);
                        return;
                    }
                    // Counted in here, out by the worker that closes it.
                    if let Err(e) = set.admit_tcp_peer(peer.ip()) {
                        counters.refused(Refusal::PeerLimit);
                        log.refused(Instant::now(), Refusal::PeerLimit, || {
                            format!("{peer}: {e}")
                        });
                        drop(stream);
                        return;
                    }
                    if !waiting.is_empty() {
                        waiting.push_back((stream, peer));
                        return;
                    }
                    match set.hand_off_tcp(stream) {
                        Ok(worker) => {
                            metrics::add(&counters.accepted, 1);
                            tracing::debug!("{url}: {peer} handed to worker {worker}");
                        }
                        Err(stream) => waiting.push_back((stream, peer)),
                    }
                });
                if let Err(e) = accepted {
                    // E.g. out of file descriptors: the connection stays
                    // queued, so wait before trying again.
                    counters.refused(Refusal::Accept);
                    log.refused(Instant::now(), Refusal::Accept, || {
                        format!("accept failed: {e}")
                    });
                    std::thread::sleep(ACCEPT_POLL);
                }
            }
            // Streams never handed out close with the acceptor.
            for (stream, peer) in waiting.drain(..) {
                set.tcp_peer_gone(peer.ip());
                drop(stream);
            }
            drop(acceptor);
        })
}

/// Makes every `/metrics` scrape copy the workers' counters into the
/// registry first (the workers write their own cache-padded counters; the
/// registry is the exporter's view).
fn install_metrics_bridge(set: &WorkerSet, registry: &Arc<Registry>) {
    let counters = set.counters();
    let latency = set.latency();
    let bulk = set.bulk_pools();
    let credits = set.credit_pools();
    let gateway = set.gateway();
    registry.set_refresher(Some(Box::new(move |reg: &Registry| {
        for (i, c) in counters.iter().enumerate() {
            let sum = c.snapshot();
            let w = reg.worker(i);
            metrics::set(&w.polls, sum.polls);
            metrics::set(&w.idle_polls, sum.idle_polls);
            metrics::set(&w.sleeps, sum.sleeps);
            metrics::set(&w.doorbell_wakeups, sum.doorbell_wakeups);
            metrics::set(&w.completions, sum.completions);
            metrics::set(&w.rpcs, sum.rpcs);
            metrics::set(&w.bytes_received, sum.bytes_in);
            metrics::set(&w.bytes_sent, sum.bytes_out);
            metrics::set(&w.credits_in_use, sum.credits_in_use);
            metrics::set(&w.busy_ns, sum.busy_ns);
            metrics::set(&w.closed_clean, sum.closed_clean);
            metrics::set(&w.closed_fault, sum.closed_fault);
            metrics::set(&w.pool_in_use[PoolKind::Leases as usize], sum.pool_in_use);
            let mine = bulk
                .iter()
                .filter(|(worker, _)| *worker == i)
                .map(|(_, p)| p);
            let (mut total, mut free, mut empty) = (0u64, 0u64, 0u64);
            for p in mine {
                total += u64::from(p.count());
                free += u64::from(p.available());
                empty += p.times_empty();
            }
            metrics::set(&w.pool_capacity[PoolKind::Bulk as usize], total);
            metrics::set(&w.pool_in_use[PoolKind::Bulk as usize], total - free);
            metrics::set(&w.bulk_pool_empty, empty);
            let (mut total, mut reserved) = (0u64, 0u64);
            for (_, p) in credits.iter().filter(|(worker, _)| *worker == i) {
                total += u64::from(p.total());
                reserved += u64::from(p.reserved());
            }
            let k = PoolKind::SharedReceives as usize;
            metrics::set(&w.pool_capacity[k], total);
            metrics::set(&w.pool_in_use[k], reserved);
            let errors = [
                (ErrorKind::CompletionError, sum.errors_completion),
                (ErrorKind::ReplyRefused, sum.errors_reply),
                (ErrorKind::DroppedCall, sum.errors_dropped_calls),
                (ErrorKind::PostRefused, sum.errors_post),
                (ErrorKind::ConnectionLost, sum.errors_connection),
                (ErrorKind::Leak, sum.leaks),
            ];
            for (kind, v) in errors {
                metrics::set(&w.errors[kind as usize], v);
            }
        }
        // The routes a reload may have changed.
        let routes = match &*gateway.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(g) => gateway_samples(g),
            None => Vec::new(),
        };
        reg.set_gateway(routes);
        reg.set_latency(latency_samples(&latency));
        // Per transport, its listeners (they change with a reload): a
        // transport with one listener (the usual case) gets an exact
        // per-listener connection gauge.
        let listeners = reg.listeners();
        for t in Transport::ALL {
            let prefix = format!("{}://", t.scheme());
            let mut of_t = listeners.iter().filter(|(u, _)| u.starts_with(&prefix));
            if let (Some((_, only)), None) = (of_t.next(), of_t.next()) {
                let open = counters
                    .iter()
                    .map(|c| c.connections_by_transport[t.index()].get())
                    .sum();
                metrics::set(&only.active, open);
            }
        }
    })));
}

/// The workers' latency tables merged: one sample per program, version
/// and procedure that has calls.
fn latency_samples(
    tables: &[Arc<dataplane::service::latency::LatencyTable>],
) -> Vec<metrics::LatencySample> {
    use dataplane::service::latency::BOUNDS_NS;
    let mut merged: std::collections::BTreeMap<(u32, u32, Option<u32>), metrics::LatencySample> =
        std::collections::BTreeMap::new();
    for t in tables {
        for s in t.samples() {
            let m = merged
                .entry((s.program, s.version, s.procedure))
                .or_insert_with(|| metrics::LatencySample {
                    program: s.program,
                    version: s.version,
                    procedure: s
                        .procedure
                        .map_or_else(|| "other".to_owned(), |p| p.to_string()),
                    bounds_ns: BOUNDS_NS.to_vec(),
                    buckets: vec![0; BOUNDS_NS.len() + 1],
                    sum_ns: 0,
                });
            for (a, b) in m.buckets.iter_mut().zip(s.buckets) {
                *a += b;
            }
            m.sum_ns += s.sum_ns;
        }
    }
    merged.into_values().collect()
}

/// The gateway's counters as the metrics show them, one per route, every
/// worker's summed.
fn gateway_samples(g: &dataplane::worker::GatewayState) -> Vec<metrics::GatewayRouteSample> {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    g.config
        .routes
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let routes: Vec<&dataplane::gateway::RouteCounters> =
                g.counters.iter().filter_map(|c| c.routes.get(i)).collect();
            let sum = |f: fn(&dataplane::gateway::RouteCounters) -> &AtomicU64| -> u64 {
                routes.iter().map(|c| f(c).load(Relaxed)).sum()
            };
            let buckets = dataplane::gateway::LATENCY_BOUNDS_US.len() + 1;
            metrics::GatewayRouteSample {
                program: r.program,
                backend: r.backend.to_string(),
                calls: sum(|c| &c.calls),
                replies: sum(|c| &c.replies),
                bytes_sent: sum(|c| &c.bytes_out),
                bytes_received: sum(|c| &c.bytes_in),
                resends: sum(|c| &c.resends),
                output_waits: sum(|c| &c.output_waits),
                errors: [
                    ("timeout", sum(|c| &c.errors_timeout)),
                    ("busy", sum(|c| &c.errors_busy)),
                    ("connection", sum(|c| &c.errors_connection)),
                    ("stray_reply", sum(|c| &c.stray_replies)),
                ],
                reply_cache: [
                    ("hit", sum(|c| &c.cache_hits)),
                    ("joined", sum(|c| &c.cache_joins)),
                ],
                latency_bounds_us: dataplane::gateway::LATENCY_BOUNDS_US.to_vec(),
                latency_buckets: (0..buckets)
                    .map(|b| routes.iter().map(|c| c.latency[b].load(Relaxed)).sum())
                    .collect(),
                latency_sum_ns: sum(|c| &c.latency_sum_ns),
            }
        })
        .collect()
}
