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
use dataplane::verbs::shm::Shm;
use dataplane::verbs::{Context as _, Provider, VerbsError};
use dataplane::worker::{
    EndpointConfig, IdleStrategy as WorkerIdle, ShutdownReport, WorkerConfig, WorkerError,
    WorkerPool,
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
pub const SERVED_SCHEMES: &str = "shm://";

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
    pool: Arc<WorkerPool<P>>,
    acceptors: Vec<JoinHandle<()>>,
    /// `[[listeners]]` indexes served by this pool.
    listeners: Vec<usize>,
}

/// The running data path.
pub struct DataPath {
    shm: Option<Served<Shm>>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for DataPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPath")
            .field("shm_workers", &self.shm.as_ref().map(|s| s.pool.len()))
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
            if !matches!(l.url, ProviderUrl::Shm { .. }) {
                return Err(ServeError::Unserved {
                    url: l.url.clone(),
                    index,
                    scheme: l.url.scheme(),
                    served: SERVED_SCHEMES,
                });
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let services: Arc<ServiceTable> = Arc::new(ServiceTable::builtin());
        let cores: Vec<Option<usize>> = config.workers.cores.iter().map(|&c| Some(c)).collect();
        let shm_listeners: Vec<usize> = config
            .listeners
            .iter()
            .enumerate()
            .filter(|(_, l)| matches!(l.url, ProviderUrl::Shm { .. }))
            .map(|(i, _)| i)
            .collect();
        let mut path = DataPath { shm: None, stop };
        if !shm_listeners.is_empty() {
            let url = config.listeners[shm_listeners[0]].url.to_string();
            let ctx = Shm::open(&url).map_err(|source| ServeError::Listen {
                url: config.listeners[shm_listeners[0]].url.clone(),
                index: shm_listeners[0],
                source,
            })?;
            let pool = Arc::new(WorkerPool::<Shm>::spawn(
                Arc::new(ctx),
                &cores,
                worker_config(config),
                services,
            )?);
            let mut served = Served {
                pool,
                acceptors: Vec::new(),
                listeners: shm_listeners.clone(),
            };
            for &index in &shm_listeners {
                let url = &config.listeners[index].url;
                let listener =
                    served
                        .pool
                        .context()
                        .listen(&url.to_string())
                        .map_err(|source| ServeError::Listen {
                            url: url.clone(),
                            index,
                            source,
                        })?;
                // shm.allowed_uids come in addition to our own uid.
                let mut uids = vec![nix::unistd::getuid().as_raw()];
                uids.extend(&config.shm.allowed_uids);
                listener.allow_uids(&uids);
                let handle = spawn_acceptor(
                    url.clone(),
                    index,
                    Arc::clone(&served.pool),
                    listener,
                    Arc::clone(&path.stop),
                    Arc::clone(registry),
                )
                .map_err(|e| ServeError::Thread(url.clone(), e))?;
                metrics::set(&registry.listener(index).serving, 1);
                served.acceptors.push(handle);
            }
            path.shm = Some(served);
        }
        install_metrics_bridge(&path, registry);
        Ok(path)
    }

    /// Stops accepting: every acceptor thread ends and its listener closes.
    pub fn stop_accepting(&mut self, registry: &Registry) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(s) = &mut self.shm {
            for h in s.acceptors.drain(..) {
                let _ = h.join();
            }
            for &i in &s.listeners {
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
        if let Some(s) = self.shm.take() {
            match Arc::try_unwrap(s.pool) {
                Ok(pool) => {
                    let r = pool.stop(grace);
                    report.workers.extend(r.workers);
                    report.panicked.extend(r.panicked);
                }
                Err(_) => tracing::error!("worker pool still shared at shutdown; not stopped"),
            }
        }
        report
    }
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
    let Some(s) = &path.shm else { return };
    let counters = s.pool.counters();
    let listeners = s.listeners.clone();
    registry.set_refresher(Some(Box::new(move |reg: &Registry| {
        let mut connections = 0;
        for (i, c) in counters.iter().enumerate() {
            let snap = c.snapshot();
            connections += snap.connections;
            let w = reg.worker(i);
            metrics::set(&w.polls, snap.polls);
            metrics::set(&w.idle_polls, snap.idle_polls);
            metrics::set(&w.completions, snap.completions);
            metrics::set(&w.rpcs, snap.rpcs);
            metrics::set(&w.bytes_received, snap.bytes_in);
            metrics::set(&w.bytes_sent, snap.bytes_out);
            metrics::set(&w.credits_in_use, snap.credits_in_use);
            metrics::set(&w.pool_in_use[PoolKind::Leases as usize], snap.pool_in_use);
            let errors = [
                (ErrorKind::CompletionError, snap.errors_completion),
                (ErrorKind::ReplyRefused, snap.errors_reply),
                (ErrorKind::DroppedCall, snap.errors_dropped_calls),
                (ErrorKind::PostRefused, snap.errors_post),
                (ErrorKind::ConnectionLost, snap.errors_connection),
                (ErrorKind::Leak, snap.leaks),
            ];
            for (kind, v) in errors {
                metrics::set(&w.errors[kind as usize], v);
            }
        }
        // Connections are counted per worker, not per listener: with one
        // listener per provider (the usual case) the gauge is exact.
        if let [only] = listeners[..] {
            metrics::set(&reg.listener(only).active, connections);
        }
    })));
}
