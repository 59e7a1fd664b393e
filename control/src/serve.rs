//! The data path as the daemon runs it: the worker pool, one acceptor
//! thread per listener, and the bridge from the workers' counters to the
//! metrics registry.
//!
//! ```text
//! start:    engine/endpoint config from [transport] [chunks] [memory]
//!           -> WorkerPool (one pinned thread per workers.cores entry)
//!           -> per listener: listen, then an acceptor thread:
//!              accept (RFC 8797 private data, receives pre-posted)
//!              -> hand off to the least-loaded worker
//! stop_accepting: acceptor threads end, listeners close (socket removed)
//! finish:   workers get shutdown.grace_ms for calls in progress, close
//!           everything, and report pools that did not come back full
//! ```
//!
//! Listeners whose provider this build does not serve are refused at start
//! with one line naming the providers that are served (DESIGN s8).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use dataplane::engine;
use dataplane::mem::Backing;
use dataplane::service::ServiceTable;
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;
use dataplane::verbs::{Context as _, Provider, VerbsError};
use dataplane::worker::{
    Dispatcher, EndpointConfig, IdleStrategy as WorkerIdle, ShutdownReport, WorkerConfig,
    WorkerCounters, WorkerError, WorkerPool, WorkerSnapshot,
};

use crate::config::{Config, Hugepages, IdleStrategy, ProviderUrl};
use crate::metrics::{self, ErrorKind, PoolKind, Registry};

/// How long an acceptor waits for a connection request before it looks at
/// the stop flag again.
const ACCEPT_POLL: Duration = Duration::from_millis(100);

/// Why the data path could not start: one line each.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The worker pool could not start (core not in the mask, ...).
    #[error("cannot start the workers (workers.cores): {0}")]
    Workers(#[from] WorkerError),
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
pub const SERVED_SCHEMES: &str = "shm://, roce://";

/// The engine and endpoint configuration the daemon's connections use.
pub fn endpoint_config(c: &Config) -> EndpointConfig {
    let t = &c.transport;
    let engine = engine::Config {
        inline_recv_size: t.inline_receive,
        inline_send_size: t.inline_send,
        credits: t.credits,
        // The daemon answers calls; it sends none of its own. The
        // engine wants at least one requester slot.
        max_outstanding_calls: 1,
        max_call_size: t.max_message,
        max_reply_size: t.max_message,
        max_ddp_size: 4096,
        max_rdma_read: t.max_rdma_read,
        inbound_rdma_read: t.max_rdma_read,
        serve_conf_rdma: true,
        limits: c.chunks.to_wire_limits(),
        ..engine::Config::default()
    };
    EndpointConfig {
        engine,
        backing: match c.memory.hugepages {
            Hugepages::Off => Backing::Small,
            Hugepages::Prefer => Backing::Auto,
            Hugepages::Required => Backing::Huge,
        },
        ..EndpointConfig::default()
    }
}

/// The worker configuration from `[workers]`.
pub fn worker_config(c: &Config) -> WorkerConfig {
    WorkerConfig {
        endpoint: endpoint_config(c),
        idle: match c.workers.idle {
            IdleStrategy::Spin => WorkerIdle::Spin,
            IdleStrategy::Adaptive => WorkerIdle::Adaptive {
                park_max: Duration::from_micros(c.workers.park_max_us.into()),
            },
        },
        ..WorkerConfig::default()
    }
}

/// One provider's workers and the acceptors feeding them.
struct Served<P: Provider> {
    pool: Option<Arc<WorkerPool<P>>>,
    acceptors: Vec<JoinHandle<()>>,
    /// `[[listeners]]` indexes served by this pool.
    listeners: Vec<usize>,
}

/// What the control plane does with a provider's pool (not on the data
/// path: a trait object is fine here).
trait ServedPool: Send {
    fn scheme(&self) -> &'static str;
    fn listeners(&self) -> &[usize];
    fn counters(&self) -> Vec<Arc<WorkerCounters>>;
    fn join_acceptors(&mut self);
    fn finish(&mut self, grace: Duration) -> ShutdownReport;
}

impl<P: Provider> ServedPool for Served<P> {
    fn scheme(&self) -> &'static str {
        P::SCHEME
    }
    fn listeners(&self) -> &[usize] {
        &self.listeners
    }
    fn counters(&self) -> Vec<Arc<WorkerCounters>> {
        self.pool.as_ref().map_or_else(Vec::new, |p| p.counters())
    }
    fn join_acceptors(&mut self) {
        for h in self.acceptors.drain(..) {
            let _ = h.join();
        }
    }
    fn finish(&mut self, grace: Duration) -> ShutdownReport {
        self.join_acceptors();
        match self.pool.take().map(Arc::try_unwrap) {
            Some(Ok(pool)) => pool.stop(grace),
            Some(Err(_)) => {
                tracing::error!(
                    "{} worker pool still shared at shutdown; not stopped",
                    P::SCHEME
                );
                ShutdownReport::default()
            }
            None => ShutdownReport::default(),
        }
    }
}

/// The running data path.
pub struct DataPath {
    pools: Vec<Box<dyn ServedPool>>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for DataPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPath")
            .field(
                "providers",
                &self.pools.iter().map(|p| p.scheme()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl DataPath {
    /// Starts the workers and listens on every listener.
    ///
    /// # Errors
    /// [`ServeError`]: the first listener or worker problem.
    pub fn start(config: &Config, registry: &Arc<Registry>) -> Result<DataPath, ServeError> {
        for (index, l) in config.listeners.iter().enumerate() {
            if !matches!(l.url, ProviderUrl::Shm { .. } | ProviderUrl::Roce(_)) {
                return Err(ServeError::Unserved {
                    url: l.url.clone(),
                    index,
                    scheme: l.url.scheme(),
                    served: SERVED_SCHEMES,
                });
            }
        }
        let mut path = DataPath {
            pools: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let services: Arc<ServiceTable> = Arc::new(ServiceTable::builtin());
        let of = |scheme: &str| -> Vec<usize> {
            config
                .listeners
                .iter()
                .enumerate()
                .filter(|(_, l)| l.url.scheme() == scheme)
                .map(|(i, _)| i)
                .collect()
        };
        // shm.allowed_uids come in addition to our own uid.
        let mut uids = vec![nix::unistd::getuid().as_raw()];
        uids.extend(&config.shm.allowed_uids);
        let shm = start_provider::<Shm>(config, registry, &path.stop, &services, of("shm"), |l| {
            l.allow_uids(&uids)
        })?;
        path.pools.extend(shm);
        let roce =
            start_provider::<Roce>(config, registry, &path.stop, &services, of("roce"), |_| {})?;
        path.pools.extend(roce);
        install_metrics_bridge(&path, registry);
        Ok(path)
    }

    /// Stops accepting: every acceptor thread ends and its listener closes.
    pub fn stop_accepting(&mut self, registry: &Registry) {
        self.stop.store(true, Ordering::SeqCst);
        for p in &mut self.pools {
            p.join_acceptors();
            for &i in p.listeners() {
                metrics::set(&registry.listener(i).serving, 0);
            }
        }
    }

    /// Lets calls in progress finish within `grace`, closes every
    /// connection and stops the workers. The report names any pool that
    /// did not come back full.
    pub fn finish(mut self, registry: &Registry, grace: Duration) -> ShutdownReport {
        self.stop_accepting(registry);
        registry.set_refresher(None);
        let mut report = ShutdownReport::default();
        for p in &mut self.pools {
            let r = p.finish(grace);
            report.workers.extend(r.workers);
            report.panicked.extend(r.panicked);
        }
        report
    }
}

/// Starts one provider's worker pool and an acceptor per listener of it
/// (`None` when no listener uses the provider).
fn start_provider<P: Provider>(
    config: &Config,
    registry: &Arc<Registry>,
    stop: &Arc<AtomicBool>,
    services: &Arc<ServiceTable>,
    listeners: Vec<usize>,
    setup: impl Fn(&P::Listener),
) -> Result<Option<Box<dyn ServedPool>>, ServeError> {
    let Some(&first) = listeners.first() else {
        return Ok(None);
    };
    let listen_error = |index: usize| {
        let url = config.listeners[index].url.clone();
        move |source| ServeError::Listen { url, index, source }
    };
    let ctx = P::open(&config.listeners[first].url.to_string()).map_err(listen_error(first))?;
    let cores: Vec<Option<usize>> = config.workers.cores.iter().map(|&c| Some(c)).collect();
    let dispatcher: Arc<dyn Dispatcher> = services.clone();
    let pool = Arc::new(WorkerPool::<P>::spawn(
        Arc::new(ctx),
        &cores,
        worker_config(config),
        dispatcher,
    )?);
    let mut served = Served {
        pool: Some(Arc::clone(&pool)),
        acceptors: Vec::new(),
        listeners: listeners.clone(),
    };
    for &index in &listeners {
        let url = &config.listeners[index].url;
        let listener = pool
            .context()
            .listen(&url.to_string())
            .map_err(listen_error(index))?;
        setup(&listener);
        let handle = spawn_acceptor(
            url.clone(),
            index,
            Arc::clone(&pool),
            listener,
            Arc::clone(stop),
            Arc::clone(registry),
        )
        .map_err(|e| ServeError::Thread(url.clone(), e))?;
        metrics::set(&registry.listener(index).serving, 1);
        served.acceptors.push(handle);
    }
    Ok(Some(Box::new(served)))
}

fn spawn_acceptor<P: Provider>(
    url: ProviderUrl,
    index: usize,
    pool: Arc<WorkerPool<P>>,
    listener: P::Listener,
    stop: Arc<AtomicBool>,
    registry: Arc<Registry>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("rpcrdma-accept-{index}"))
        .spawn(move || {
            let counters = registry.listener(index);
            while !stop.load(Ordering::SeqCst) {
                match pool.accept(&listener, ACCEPT_POLL) {
                    Ok(worker) => {
                        metrics::add(&counters.accepted, 1);
                        tracing::debug!("{url}: connection handed to worker {worker}");
                    }
                    Err(WorkerError::Verbs(VerbsError::Timeout)) => {}
                    Err(e) => {
                        metrics::add(&counters.rejected, 1);
                        tracing::warn!("{url}: connection refused: {e}");
                    }
                }
            }
            // Dropping the listener closes it (and removes an shm socket).
            drop(listener);
        })
}

/// Makes every `/metrics` scrape copy the workers' counters into the
/// registry first (the workers write their own cache-padded counters; the
/// registry is the exporter's view).
fn install_metrics_bridge(path: &DataPath, registry: &Arc<Registry>) {
    // Per provider: its workers' counters (worker i of every provider
    // runs on workers.cores[i]) and its listeners.
    let sources: Vec<(Vec<Arc<WorkerCounters>>, Vec<usize>)> = path
        .pools
        .iter()
        .map(|p| (p.counters(), p.listeners().to_vec()))
        .collect();
    registry.set_refresher(Some(Box::new(move |reg: &Registry| {
        let workers = sources.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
        for i in 0..workers {
            let mut sum = WorkerSnapshot::default();
            for (counters, _) in &sources {
                if let Some(c) = counters.get(i) {
                    add_snapshot(&mut sum, &c.snapshot());
                }
            }
            let w = reg.worker(i);
            metrics::set(&w.polls, sum.polls);
            metrics::set(&w.idle_polls, sum.idle_polls);
            metrics::set(&w.completions, sum.completions);
            metrics::set(&w.rpcs, sum.rpcs);
            metrics::set(&w.bytes_received, sum.bytes_in);
            metrics::set(&w.bytes_sent, sum.bytes_out);
            metrics::set(&w.credits_in_use, sum.credits_in_use);
            metrics::set(&w.pool_in_use[PoolKind::Leases as usize], sum.pool_in_use);
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
        // Connections are counted per worker, not per listener: with one
        // listener per provider (the usual case) the gauge is exact.
        for (counters, listeners) in &sources {
            if let [only] = listeners[..] {
                let open = counters.iter().map(|c| c.connections.get()).sum();
                metrics::set(&reg.listener(only).active, open);
            }
        }
    })));
}

fn add_snapshot(sum: &mut WorkerSnapshot, s: &WorkerSnapshot) {
    sum.polls += s.polls;
    sum.idle_polls += s.idle_polls;
    sum.completions += s.completions;
    sum.rpcs += s.rpcs;
    sum.bytes_in += s.bytes_in;
    sum.bytes_out += s.bytes_out;
    sum.credits_in_use += s.credits_in_use;
    sum.pool_in_use += s.pool_in_use;
    sum.errors_completion += s.errors_completion;
    sum.errors_reply += s.errors_reply;
    sum.errors_dropped_calls += s.errors_dropped_calls;
    sum.errors_post += s.errors_post;
    sum.errors_connection += s.errors_connection;
    sum.leaks += s.leaks;
}
