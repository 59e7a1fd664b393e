//! Startup and shutdown of `rpcrdmad`.
//!
//! ```text
//! main:  args -> config (exit 2 on error) -> start -> wait for SIGINT/SIGTERM -> shutdown -> exit 0
//! start: check the host (hugepages), check the listeners' addresses,
//!        start the workers and listen (serve.rs), bind the metrics
//!        listener, register with rpcbind
//!        (any failure but rpcbind's: one line, exit 1)
//! shutdown: stop accepting, unregister from rpcbind, let in-flight RPCs
//!        finish within shutdown.grace_ms, release the pools (a leak is
//!        logged), stop metrics
//! ```
//!
//! The data path (`crate::serve`: pinned workers, acceptors) starts before
//! rpcbind registration, so a client that finds us through rpcbind finds a
//! listener that answers.
//!
//! rpcbind is unregistered before the grace period rather than after it:
//! once the daemon stops accepting, a client
//! that still finds it through rpcbind would only be refused.
//!
//! Exit codes: 0 after a clean shutdown (and for `--check-config` of a
//! good file), 2 for a bad configuration or bad arguments, 1 for a startup
//! failure (port or socket in use, no hugepages when required, ...).

use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use clap::Parser;

use crate::config::{Config, Hugepages, ProviderUrl};
use crate::metrics::{MetricsServer, Registry};
use crate::programs::SERVED_PROGRAMS;
use crate::rpcbind::{universal_address, Mapping, RpcbindAddress, RpcbindClient, RpcbindError};
use crate::serve::{DataPath, ServeError};
use crate::status::StatusServer;

/// Exit code of a clean run.
pub const EXIT_OK: i32 = 0;
/// Exit code of a startup failure.
pub const EXIT_STARTUP: i32 = 1;
/// Exit code of a bad configuration or bad arguments.
pub const EXIT_CONFIG: i32 = 2;

/// Serve ONC RPC programs over RDMA (RFC 5666 / RFC 8166) from pinned,
/// busy-polling worker cores.
#[derive(Debug, Parser)]
#[command(name = "rpcrdmad", version, about, long_about = None)]
pub struct Args {
    /// Configuration file (TOML); without it, the built-in defaults
    /// (configs/default.toml).
    #[arg(long, value_name = "FILE", conflicts_with = "check_config")]
    pub config: Option<PathBuf>,
    /// Check a configuration file, print `FILE: ok` or `FILE:LINE: error`,
    /// and exit (0 or 2).
    #[arg(long, value_name = "FILE")]
    pub check_config: Option<PathBuf>,
    /// Log lines as text (for people) or as one JSON object per line (for
    /// log shippers: `timestamp`, `level`, `fields.message`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// A command for the running daemon instead of serving.
    #[command(subcommand)]
    pub command: Option<Subcommand>,
}

/// Commands for a running daemon.
#[derive(Debug, clap::Subcommand)]
pub enum Subcommand {
    /// Show the running daemon's workers, listeners, connections and
    /// pools (asked over its control socket).
    Status {
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// The daemon's configuration file: its control.socket is asked.
        #[arg(long, value_name = "FILE", conflicts_with = "socket")]
        config: Option<PathBuf>,
        /// The control socket to ask (default: control.socket of the
        /// built-in configuration).
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
    },
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `TIMESTAMP LEVEL message`, colored on a terminal.
    Text,
    /// One JSON object per line.
    Json,
}

/// How often the main thread looks for closed connections whose memory
/// it can give back ([`dataplane::mem::release_free_heap`]).
const HOUSEKEEPING_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// The daemon's entry point; returns the process exit code.
pub fn main() -> i32 {
    let args = Args::parse();

    if let Some(path) = &args.check_config {
        init_logging(args.log_format, crate::config::LogLevel::Info);
        return check_config(path);
    }
    if let Some(Subcommand::Status {
        json,
        config,
        socket,
    }) = &args.command
    {
        let socket = match (socket, config) {
            (Some(s), _) => s.clone(),
            (None, Some(file)) => match Config::load(file) {
                Ok(c) => c.control.socket,
                Err(e) => {
                    eprintln!("{e}");
                    return EXIT_CONFIG;
                }
            },
            (None, None) => Config::default().control.socket,
        };
        return crate::status::run(&socket, *json);
    }

    let config = match &args.config {
        Some(path) => Config::load(path),
        None => {
            let c = Config::default();
            c.check_defaults(&crate::config::HostFacts::current())
                .map(|()| c)
        }
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return EXIT_CONFIG;
        }
    };

    let log_level = init_logging(args.log_format, config.log.level);

    // Signals first, so a SIGTERM that arrives while we register with
    // rpcbind still leads to an orderly unregistration.
    let signals = match install_signal_handler() {
        Ok(rx) => rx,
        Err(e) => {
            eprintln!("rpcrdmad: cannot install the SIGINT/SIGTERM/SIGHUP handler: {e}");
            return EXIT_STARTUP;
        }
    };

    let mut daemon = match Daemon::start(config) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("rpcrdmad: {e}");
            return EXIT_STARTUP;
        }
    };
    // Until a stop (or the handler's end): SIGHUP reloads the
    // configuration file, and five times a second the memory of
    // connections that closed goes back to the kernel.
    let mut closed_seen = 0;
    loop {
        match signals.recv_timeout(HOUSEKEEPING_EVERY) {
            Ok(Signal::Reload) => match &args.config {
                Some(path) => {
                    if let Err(line) = daemon.reload_file(path, &log_level) {
                        tracing::warn!("{line}");
                    }
                }
                None => tracing::info!(
                    "SIGHUP: started without --config, nothing to reload (the built-in defaults \
                     do not change)"
                ),
            },
            Ok(Signal::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let closed = daemon.data.closed_connections();
        if closed != closed_seen {
            closed_seen = closed;
            dataplane::mem::release_free_heap();
        }
    }
    tracing::info!("signal received: shutting down");
    daemon.shutdown();
    EXIT_OK
}

/// Changes the log level while running (a reload).
pub struct LogLevelHandle {
    handle: Option<
        tracing_subscriber::reload::Handle<
            tracing_subscriber::filter::LevelFilter,
            tracing_subscriber::Registry,
        >,
    >,
    /// `RPCRDMAD_LOG` was set: it wins over `log.level`.
    from_env: bool,
}

impl std::fmt::Debug for LogLevelHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogLevelHandle")
            .field("from_env", &self.from_env)
            .finish_non_exhaustive()
    }
}

impl LogLevelHandle {
    /// Sets the level, unless `RPCRDMAD_LOG` chose it; returns whether it
    /// changed.
    fn set(&self, level: tracing::Level) -> bool {
        if self.from_env {
            return false;
        }
        self.handle.as_ref().is_some_and(|h| {
            h.modify(|f| *f = tracing_subscriber::filter::LevelFilter::from_level(level))
                .is_ok()
        })
    }
}

/// Sets up logging to stderr at `RPCRDMAD_LOG`'s level, or else
/// `configured`; returns the handle a reload changes the level with.
fn init_logging(format: LogFormat, configured: crate::config::LogLevel) -> LogLevelHandle {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let env = std::env::var("RPCRDMAD_LOG")
        .ok()
        .and_then(|l| l.parse::<tracing::Level>().ok());
    let level = env.unwrap_or(configured.level());
    let (filter, handle) = tracing_subscriber::reload::Layer::new(
        tracing_subscriber::filter::LevelFilter::from_level(level),
    );
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false);
    let registry = tracing_subscriber::registry().with(filter);
    let ok = match format {
        LogFormat::Text => registry
            .with(layer.with_ansi(std::io::stderr().is_terminal()))
            .try_init()
            .is_ok(),
        LogFormat::Json => registry.with(layer.json()).try_init().is_ok(),
    };
    LogLevelHandle {
        handle: ok.then_some(handle),
        from_env: env.is_some(),
    }
}

/// What the signal thread reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// SIGINT or SIGTERM: shut down.
    Stop,
    /// SIGHUP: reload the configuration file.
    Reload,
}

/// SIGINT and SIGTERM send [`Signal::Stop`] (a second one while shutting
/// down exits at once with 1); SIGHUP sends [`Signal::Reload`].
fn install_signal_handler() -> std::io::Result<mpsc::Receiver<Signal>> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let (tx, rx) = mpsc::channel();
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut stops = 0;
            for sig in signals.forever() {
                let msg = if sig == SIGHUP {
                    Signal::Reload
                } else {
                    stops += 1;
                    if stops > 1 {
                        eprintln!(
                            "rpcrdmad: second signal: exiting without finishing the shutdown"
                        );
                        std::process::exit(EXIT_STARTUP);
                    }
                    Signal::Stop
                };
                let _ = tx.send(msg);
            }
        })?;
    Ok(rx)
}

/// Why the daemon could not start. Each renders as one actionable line
/// that names the configuration key involved.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The metrics listener could not be bound.
    #[error(
        "cannot serve metrics on {addr} (metrics.address): {source}; \
         free the port or change metrics.address"
    )]
    MetricsBind {
        /// The configured address.
        addr: SocketAddr,
        /// The bind error.
        source: std::io::Error,
    },
    /// A listener's address cannot be used.
    #[error("cannot listen on {url} (listeners[{index}].url): {reason}")]
    Listener {
        /// The listener.
        url: ProviderUrl,
        /// Its position in `[[listeners]]`.
        index: usize,
        /// What is wrong and what to do.
        reason: String,
    },
    /// `memory.hugepages = "required"` and none are free.
    #[error(
        "memory.hugepages = \"required\" but no 2 MiB hugepages are free ({found}); reserve some \
         with deploy/setup-host or `sysctl -w vm.nr_hugepages=512`, or set memory.hugepages = \"prefer\""
    )]
    NoHugepages {
        /// What /proc/meminfo says.
        found: String,
    },
    /// `memory.hugepages = "required"` and fewer are free than the bulk
    /// pools take.
    #[error(
        "the workers' bulk pools need {needed} free 2 MiB hugepages ({pools}) but {free} are free; \
         lower workers.bulk_buffers or transport.max_message, reserve more with \
         `sysctl -w vm.nr_hugepages=N`, or set memory.hugepages = \"prefer\""
    )]
    BulkPoolHugepages {
        /// Hugepages the pools take.
        needed: u64,
        /// What they are: workers x providers x buffers x size.
        pools: String,
        /// HugePages_Free.
        free: u64,
    },
    /// The metrics thread could not be spawned.
    #[error("cannot start the metrics thread: {0}")]
    Thread(std::io::Error),
    /// The data path could not start.
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// A started daemon.
#[derive(Debug)]
pub struct Daemon {
    config: Config,
    registry: Arc<Registry>,
    data: DataPath,
    metrics: Option<MetricsServer>,
    registration: Registration,
    status: Option<StatusServer>,
}

impl Daemon {
    /// Checks the host and the listeners, binds the metrics listener and
    /// registers with rpcbind. rpcbind being unreachable is not an error
    /// (one warning line).
    ///
    /// # Errors
    /// A [`StartupError`] for the first problem found.
    pub fn start(config: Config) -> Result<Daemon, StartupError> {
        check_hugepages(config.memory.hugepages)?;
        check_bulk_hugepages(&config)?;
        for (index, l) in config.listeners.iter().enumerate() {
            check_listener(&l.url).map_err(|reason| StartupError::Listener {
                url: l.url.clone(),
                index,
                reason,
            })?;
        }

        let urls: Vec<String> = config.listeners.iter().map(|l| l.url.to_string()).collect();
        let registry = Arc::new(Registry::new(&config.workers.cores, &urls));
        let metrics = if config.metrics.enabled {
            let addr = config.metrics.address;
            let listener = TcpListener::bind(addr)
                .map_err(|source| StartupError::MetricsBind { addr, source })?;
            let server = MetricsServer::serve(listener, Arc::clone(&registry))
                .map_err(StartupError::Thread)?;
            Some(server)
        } else {
            None
        };

        // After the metrics listener (its port is the likelier conflict,
        // and nothing is served yet if it fails), before rpcbind.
        let data = DataPath::start(&config, &registry)?;
        // The status socket is for operators: a daemon that cannot open it
        // still serves, and says why in one line.
        let status = match StatusServer::start(
            &config.control.socket,
            crate::status::Sources {
                workers: data.workers(),
                registry: Arc::clone(&registry),
                cores: config.workers.cores.clone(),
            },
        ) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("{e}; `rpcrdmad status` will not reach this daemon");
                None
            }
        };

        let registration = if config.rpcbind.register {
            Registration::register(&config)
        } else {
            tracing::info!("rpcbind registration disabled (rpcbind.register = false)");
            Registration::none(&config)
        };
        registry
            .rpcbind_registrations
            .store(registration.mappings.len() as u64, Ordering::Relaxed);

        tracing::info!(
            "rpcrdmad {} started: {} worker(s) on core(s) {:?} ({} idle); serving {}; \
             metrics {}; rpcbind: {} mapping(s) registered",
            env!("CARGO_PKG_VERSION"),
            config.workers.cores.len(),
            config.workers.cores,
            config.workers.idle,
            urls.join(", "),
            metrics.as_ref().map_or_else(
                || "disabled".to_string(),
                |m| format!("http://{}/metrics", m.local_addr())
            ),
            registration.mappings.len(),
        );
        Ok(Daemon {
            config,
            registry,
            data,
            metrics,
            registration,
            status,
        })
    }

    /// The metrics registry the workers will write.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The bound metrics address, when metrics are enabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::local_addr)
    }

    /// Stops accepting, unregisters from rpcbind, lets in-flight RPCs
    /// finish within `shutdown.grace_ms`, releases the pools and stops the
    /// metrics exporter.
    pub fn shutdown(self) {
        let Daemon {
            config,
            registry,
            mut data,
            metrics,
            registration,
            status,
        } = self;
        if let Some(s) = status {
            s.stop();
        }
        // 1. Stop accepting (listeners close, shm sockets disappear).
        data.stop_accepting();
        // 2. Stop being found.
        registration.unregister();
        registry.rpcbind_registrations.store(0, Ordering::Relaxed);
        // 3. Drain within the grace period, then close and release.
        let grace = Duration::from_millis(config.shutdown.grace_ms.into());
        let report = data.finish(&registry, grace);
        let served: u64 = report.workers.iter().map(|w| w.connections).sum();
        let cut: u64 = report.workers.iter().map(|w| w.cut_short).sum();
        if cut > 0 {
            tracing::warn!(
                "{cut} connection(s) still had calls in progress after the grace period \
                 ({} ms, shutdown.grace_ms) and were closed",
                config.shutdown.grace_ms
            );
        }
        for w in &report.workers {
            for leak in &w.leaks {
                tracing::error!(
                    "worker {}: connection qp {} closed with resources in use: {:?}, \
                     {} region lease(s) not returned",
                    leak.worker,
                    leak.qp_num,
                    leak.resources,
                    leak.leases_in_use
                );
            }
        }
        for w in &report.panicked {
            tracing::error!("worker {w} panicked");
        }
        if report.is_clean() {
            tracing::info!(
                "pools released: every pool back to full ({served} connection(s) served)"
            );
        }
        // 4. Stop exporting.
        if let Some(m) = metrics {
            m.stop();
        }
        tracing::info!("rpcrdmad stopped");
    }
}

impl Daemon {
    /// SIGHUP: reads `path` again and applies what changed, or refuses
    /// the whole change with one line (the running configuration stays).
    ///
    /// # Errors
    /// The line: a bad file (`FILE:LINE: message`), a key that cannot
    /// change while running, or a new listener that cannot be opened.
    pub fn reload_file(&mut self, path: &Path, log: &LogLevelHandle) -> Result<(), String> {
        let file = path.display();
        let new = Config::load(path).map_err(|e| format!("reload refused: {e}"))?;
        self.reload(new, log)
            .map_err(|e| format!("reload of {file} refused: {e}; nothing was changed"))
    }

    /// Applies `new` over the running configuration: listeners (opened
    /// and closed, established connections kept), rpcbind registrations
    /// (following the listeners), `workers.max_connections`,
    /// `shutdown.grace_ms`, `log.level`, `[rpcbind]`. Anything else that
    /// differs refuses the whole reload.
    ///
    /// # Errors
    /// One line naming the first key that cannot change live, or the
    /// listener that cannot be opened.
    pub fn reload(&mut self, new: Config, log: &LogLevelHandle) -> Result<(), String> {
        if let Some(key) = fixed_key_changed(&self.config, &new) {
            return Err(format!(
                "{key} cannot change while rpcrdmad runs (restart it to apply)"
            ));
        }
        let mut done: Vec<String> = Vec::new();
        // The new relays are built before anything changes: a backend
        // rpcbind does not know refuses the reload.
        let gateway = if new.gateway == self.config.gateway {
            None
        } else {
            Some(self.data.prepare_gateway(&new).map_err(|e| e.to_string())?)
        };
        if new.listeners != self.config.listeners {
            for (index, l) in new.listeners.iter().enumerate() {
                if !self.config.listeners.contains(l) {
                    check_listener(&l.url).map_err(|reason| {
                        format!(
                            "cannot listen on {} (listeners[{index}].url): {reason}",
                            l.url
                        )
                    })?;
                }
            }
            let changes = self
                .data
                .set_listeners(&new.listeners, &self.registry)
                .map_err(|e| e.to_string())?;
            for u in &changes.added {
                done.push(format!("+{u}"));
            }
            for u in &changes.removed {
                done.push(format!("-{u}"));
            }
        }
        if let Some(prepared) = gateway {
            self.data.swap_gateway(prepared);
            done.push(format!("gateway: {} route(s)", new.gateway.len()));
        }
        if new.workers.max_connections != self.config.workers.max_connections {
            self.data
                .set_max_connections(new.workers.max_connections as usize);
            done.push(format!(
                "workers.max_connections {} -> {}",
                self.config.workers.max_connections, new.workers.max_connections
            ));
        }
        if new.shutdown.grace_ms != self.config.shutdown.grace_ms {
            done.push(format!(
                "shutdown.grace_ms {} -> {}",
                self.config.shutdown.grace_ms, new.shutdown.grace_ms
            ));
        }
        if new.log.level != self.config.log.level {
            let applied = log.set(new.log.level.level());
            done.push(format!(
                "log.level {:?} -> {:?}{}",
                self.config.log.level,
                new.log.level,
                if applied { "" } else { " (RPCRDMAD_LOG wins)" }
            ));
        }
        let old = std::mem::replace(&mut self.config, new);
        if old.rpcbind != self.config.rpcbind
            || old.listeners != self.config.listeners
            || old.gateway != self.config.gateway
        {
            let (set, unset) = self.registration.follow(&self.config);
            self.registry
                .rpcbind_registrations
                .store(self.registration.mappings.len() as u64, Ordering::Relaxed);
            if set + unset > 0 {
                done.push(format!("rpcbind: {set} mapping(s) set, {unset} unset"));
            }
        }
        if done.is_empty() {
            tracing::info!("reload: no change");
        } else {
            tracing::info!("reload: {}", done.join("; "));
        }
        Ok(())
    }
}

/// The first key that differs between `old` and `new` and cannot change
/// while serving: what sizes memory or threads at start (cores, pools,
/// the engine's buffers), and the exporters' and sockets' addresses.
fn fixed_key_changed(old: &Config, new: &Config) -> Option<&'static str> {
    let (o, n) = (&old.workers, &new.workers);
    let (ot, nt) = (&old.transport, &new.transport);
    let (oc, nc) = (&old.chunks, &new.chunks);
    let checks: [(&'static str, bool); 24] = [
        ("workers.cores", o.cores != n.cores),
        // The workers count connections out against the limit they
        // started with.
        (
            "workers.max_connections_per_peer",
            o.max_connections_per_peer != n.max_connections_per_peer,
        ),
        ("workers.idle", o.idle != n.idle),
        ("workers.park_max_us", o.park_max_us != n.park_max_us),
        ("workers.bulk_buffers", o.bulk_buffers != n.bulk_buffers),
        (
            "workers.shared_receives",
            o.shared_receives != n.shared_receives,
        ),
        ("workers.control_ring", o.control_ring != n.control_ring),
        ("transport.credits", ot.credits != nt.credits),
        (
            "transport.inline_receive",
            ot.inline_receive != nt.inline_receive,
        ),
        ("transport.inline_send", ot.inline_send != nt.inline_send),
        (
            "transport.max_rdma_read",
            ot.max_rdma_read != nt.max_rdma_read,
        ),
        ("transport.max_message", ot.max_message != nt.max_message),
        (
            "transport.idle_timeout_s",
            ot.idle_timeout_s != nt.idle_timeout_s,
        ),
        (
            "transport.extensions",
            ot.extension_set() != nt.extension_set(),
        ),
        (
            "chunks.max_read_segments",
            oc.max_read_segments != nc.max_read_segments,
        ),
        (
            "chunks.max_write_chunks",
            oc.max_write_chunks != nc.max_write_chunks,
        ),
        (
            "chunks.max_segments_per_chunk",
            oc.max_segments_per_chunk != nc.max_segments_per_chunk,
        ),
        (
            "chunks.max_reply_segments",
            oc.max_reply_segments != nc.max_reply_segments,
        ),
        (
            "memory.hugepages",
            old.memory.hugepages != new.memory.hugepages,
        ),
        (
            "metrics.enabled",
            old.metrics.enabled != new.metrics.enabled,
        ),
        (
            "metrics.address",
            old.metrics.address != new.metrics.address,
        ),
        (
            "shm.allowed_uids",
            old.shm.allowed_uids != new.shm.allowed_uids,
        ),
        // Listeners count connections against the limit they started with.
        (
            "shm.max_connections_per_uid",
            old.shm.max_connections_per_uid != new.shm.max_connections_per_uid,
        ),
        ("control.socket", old.control.socket != new.control.socket),
    ];
    checks.iter().find(|(_, changed)| *changed).map(|(k, _)| *k)
}

/// Reads `HugePages_Free` and `HugePages_Total` from `/proc/meminfo`.
fn hugepages_free() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    Some((field("HugePages_Free:")?, field("HugePages_Total:")?))
}

fn check_hugepages(policy: Hugepages) -> Result<(), StartupError> {
    if policy == Hugepages::Off {
        return Ok(());
    }
    let (free, total) = hugepages_free().unwrap_or((0, 0));
    if let Some(warning) = hugepage_verdict(policy, free, total)? {
        tracing::warn!("{warning}");
    }
    Ok(())
}

/// The 2 MiB hugepages the workers' bulk pools take, and how that adds
/// up: one pool per worker and RDMA provider listened on, each of
/// `workers.bulk_buffers` buffers of `transport.max_message` (rounded to
/// 64 bytes), rounded up to whole hugepages.
fn bulk_hugepages(config: &Config) -> (u64, String) {
    let mut schemes: Vec<&str> = config
        .listeners
        .iter()
        .filter(|l| !matches!(l.url, ProviderUrl::Tcp(_)))
        .map(|l| l.url.scheme())
        .collect();
    schemes.sort_unstable();
    schemes.dedup();
    let workers = config.workers.cores.len() as u64;
    let buffers = config.workers.bulk_buffers;
    let size = config.transport.max_message.next_multiple_of(64);
    let pool = dataplane::engine::BulkPool::memory_len(buffers, config.transport.max_message);
    let per_pool = (pool as u64).div_ceil(2 << 20);
    let needed = workers * schemes.len() as u64 * per_pool;
    let pools = format!(
        "{workers} worker(s) x {} RDMA provider(s) x {buffers} buffers of {size} bytes",
        schemes.len()
    );
    (needed, pools)
}

/// With `memory.hugepages = "required"`, the bulk pools must find their
/// hugepages free (else the workers fail to start with a less precise
/// error).
fn check_bulk_hugepages(config: &Config) -> Result<(), StartupError> {
    if config.memory.hugepages != Hugepages::Required {
        return Ok(());
    }
    let (needed, pools) = bulk_hugepages(config);
    let (free, _) = hugepages_free().unwrap_or((0, 0));
    if needed > free {
        return Err(StartupError::BulkPoolHugepages {
            needed,
            pools,
            free,
        });
    }
    Ok(())
}

/// What `policy` makes of `free` of `total` hugepages: fine, a warning
/// line, or a startup failure.
fn hugepage_verdict(
    policy: Hugepages,
    free: u64,
    total: u64,
) -> Result<Option<String>, StartupError> {
    if policy == Hugepages::Off || free > 0 {
        return Ok(None);
    }
    let found = format!("HugePages_Free {free} of HugePages_Total {total}");
    match policy {
        Hugepages::Required => Err(StartupError::NoHugepages { found }),
        _ => Ok(Some(format!(
            "no free 2 MiB hugepages ({found}): pools will use 4 KiB pages; \
             reserve some with `sysctl -w vm.nr_hugepages=512` (deploy/setup-host)"
        ))),
    }
}

/// Validates a listener address without serving it: the IP must be
/// configured on this host, a TCP port must be free, an shm socket's
/// directory must exist (it is created when missing) and no live process
/// may hold the socket.
fn check_listener(url: &ProviderUrl) -> Result<(), String> {
    match url {
        ProviderUrl::Tcp(a) => {
            // Bound and released at once: holding a port nobody serves
            // would let clients connect and hang.
            TcpListener::bind(a)
                .map(drop)
                .map_err(|e| format!("{e}; free the port or change the url"))
        }
        ProviderUrl::Ibverbs(a) => check_ibverbs(*a),
        ProviderUrl::Roce(a) => {
            // The RDMA service port is not a socket; check that the IP is
            // one of ours by binding an ephemeral UDP port on it.
            UdpSocket::bind(SocketAddr::new(a.ip(), 0))
                .map(drop)
                .map_err(|e| format!("address {} is not usable on this host: {e}", a.ip()))
        }
        ProviderUrl::Shm { path } => check_shm_path(path),
    }
}

/// An `ibverbs://` listener needs an RDMA device owning its address.
#[cfg(feature = "ibverbs")]
fn check_ibverbs(addr: SocketAddr) -> Result<(), String> {
    let url = format!("ibverbs://{addr}");
    dataplane::verbs::ibverbs::probe(&url).map_err(|e| {
        let line = e.to_string();
        // The caller's message already names the URL.
        match line.strip_prefix(&format!("{url}: ")) {
            Some(rest) => rest.to_owned(),
            None => line,
        }
    })
}

#[cfg(not(feature = "ibverbs"))]
fn check_ibverbs(_: SocketAddr) -> Result<(), String> {
    Err(
        "this rpcrdmad was built without the `ibverbs` feature (rebuild with \
         `--features control/ibverbs`, or use shm://; see docs/IBVERBS.md)"
            .to_owned(),
    )
}

fn check_shm_path(path: &Path) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        if !dir.is_dir() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create directory {}: {e}", dir.display()))?;
            tracing::info!("created directory {} for the shm socket", dir.display());
        }
    }
    shm_socket_free(path)
}

/// No live process listens at an shm socket path, and it is not another
/// kind of file: the probe of the shm provider (a SEQPACKET connect), as
/// start and `--check-config` report it.
fn shm_socket_free(path: &Path) -> Result<(), String> {
    use dataplane::verbs::shm::{probe_socket, SocketProbe};
    match probe_socket(path) {
        Ok(SocketProbe::Absent) => Ok(()),
        Ok(SocketProbe::NotASocket) => Err(format!(
            "{} exists and is not a socket; remove it or change the url",
            path.display()
        )),
        Ok(SocketProbe::Live { pid }) => Err(format!(
            "socket {} is in use by {} (another rpcrdmad?); stop it or change the url",
            path.display(),
            pid.map_or("a running process".to_owned(), |p| format!("process {p}"))
        )),
        Ok(SocketProbe::Stale) => {
            tracing::info!(
                "stale socket {} (nobody listens) will be replaced",
                path.display()
            );
            Ok(())
        }
        Err(e) => Err(format!("cannot check socket {}: {e}", path.display())),
    }
}

/// `--check-config FILE`: the file's own rules, then everything about this
/// host that start would refuse and that can be known without binding a
/// port. One line per problem (`FILE:LINE: key: message` where the key's
/// line is known), then exit 2; or `FILE: ok (...)` and one line naming
/// what was not checked, exit 0.
fn check_config(path: &Path) -> i32 {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return EXIT_CONFIG;
        }
    };
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let file = path.display();
    let problems = preflight(&config);
    for p in &problems {
        match p.needle.as_deref().and_then(|n| line_of(&text, n)) {
            Some(line) => eprintln!("{file}:{line}: {}: {}", p.key, p.message),
            None => eprintln!("{file}: {}: {}", p.key, p.message),
        }
    }
    if !problems.is_empty() {
        return EXIT_CONFIG;
    }
    println!(
        "{file}: ok ({} worker(s), {} listener(s))",
        config.workers.cores.len(),
        config.listeners.len()
    );
    println!(
        "{file}: not checked (known only when serving): that the ports are free to bind, \
         that rpcbind answers, that RDMA peers can reach the addresses"
    );
    EXIT_OK
}

/// The 1-based line of the first occurrence of `needle` in `text`.
fn line_of(text: &str, needle: &str) -> Option<usize> {
    Some(crate::config::line_of_offset(text, text.find(needle)?))
}

/// A reason the daemon would refuse to start on this host.
#[derive(Debug)]
pub struct Problem {
    /// The configuration key (`listeners[1].url`, `metrics.address`).
    pub key: String,
    /// Text to find the key's line by (the value as written).
    pub needle: Option<String>,
    /// What is wrong and what to do, one line.
    pub message: String,
}

/// Every startup check that needs no bound port, applied to `config` on
/// this host: listener addresses on this host, providers this build
/// serves, shm socket paths free (no live listener) and their directory
/// creatable, the metrics address on this host, hugepages when required.
/// (Cores outside the affinity mask are refused by [`Config::load`].)
pub fn preflight(config: &Config) -> Vec<Problem> {
    let mut out = Vec::new();
    for (index, l) in config.listeners.iter().enumerate() {
        let url = l.url.to_string();
        let reason = match &l.url {
            ProviderUrl::Tcp(a) | ProviderUrl::Roce(a) => address_on_this_host(a.ip()).err(),
            ProviderUrl::Ibverbs(a) => address_on_this_host(a.ip())
                .and_then(|()| check_ibverbs(*a))
                .err(),
            ProviderUrl::Shm { path } => shm_path_usable(path).err(),
        };
        if let Some(message) = reason {
            out.push(Problem {
                key: format!("listeners[{index}].url"),
                needle: Some(url.clone()),
                message: format!("cannot listen on {url}: {message}"),
            });
        }
    }
    if config.metrics.enabled {
        if let Err(message) = address_on_this_host(config.metrics.address.ip()) {
            out.push(Problem {
                key: "metrics.address".to_owned(),
                needle: Some(config.metrics.address.to_string()),
                message: format!(
                    "cannot serve metrics on {}: {message}",
                    config.metrics.address
                ),
            });
        }
    }
    if config.memory.hugepages == Hugepages::Required {
        let (free, total) = hugepages_free().unwrap_or((0, 0));
        if let Err(e) = hugepage_verdict(Hugepages::Required, free, total) {
            out.push(Problem {
                key: "memory.hugepages".to_owned(),
                needle: Some("hugepages".to_owned()),
                message: e.to_string(),
            });
        } else if let Err(e) = check_bulk_hugepages(config) {
            out.push(Problem {
                key: "workers.bulk_buffers".to_owned(),
                needle: Some("bulk_buffers".to_owned()),
                message: e.to_string(),
            });
        }
    }
    out
}

/// Whether `ip` is one this host answers on: the unspecified address, any
/// of 127.0.0.0/8 (Linux answers for the whole block on `lo`), or an
/// address assigned to an interface.
fn address_on_this_host(ip: IpAddr) -> Result<(), String> {
    if ip.is_unspecified() || ip.is_loopback() {
        return Ok(());
    }
    let ours = nix::ifaddrs::getifaddrs()
        .map_err(|e| format!("cannot list this host's addresses: {e}"))?
        .filter_map(|a| a.address)
        .any(|a| {
            a.as_sockaddr_in().map(|v4| IpAddr::V4(v4.ip())) == Some(ip)
                || a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())) == Some(ip)
        });
    if ours {
        Ok(())
    } else {
        Err(format!(
            "address {ip} is not assigned to any interface of this host (see `ip addr`)"
        ))
    }
}

/// An shm socket path with no live listener, whose directory exists and is
/// writable or can be created (nothing is created here).
fn shm_path_usable(path: &Path) -> Result<(), String> {
    shm_socket_free(path)?;
    // The nearest existing ancestor must let us create what is missing.
    let mut dir = path.parent();
    while let Some(d) = dir {
        if d.exists() {
            return nix::unistd::access(d, nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK)
                .map_err(|e| {
                    format!(
                        "cannot create the socket under {}: {e} (run as root, or choose a path you own)",
                        d.display()
                    )
                });
        }
        dir = d.parent();
    }
    Ok(())
}

/// The rpcbind mappings of this daemon.
#[derive(Debug)]
pub struct Registration {
    address: RpcbindAddress,
    timeout: Duration,
    mappings: Vec<Mapping>,
}

/// The mappings a configuration asks for, one per served program/version
/// and (listener netid), plus log lines for listeners left out.
pub fn planned_mappings(config: &Config) -> Vec<Mapping> {
    let owner = nix::unistd::geteuid().to_string();
    let mut out: Vec<Mapping> = Vec::new();
    for l in &config.listeners {
        let (netid, addr) = match &l.url {
            ProviderUrl::Shm { path } => {
                tracing::info!(
                    "listener {}: not registered with rpcbind (shm is same-host: clients \
                     find it by its socket path {})",
                    l.url,
                    path.display()
                );
                continue;
            }
            ProviderUrl::Roce(a) | ProviderUrl::Ibverbs(a) => {
                let netid = if a.is_ipv4() {
                    dataplane::wire::conf::NETID_RDMA
                } else {
                    dataplane::wire::conf::NETID_RDMA6
                };
                (netid, *a)
            }
            ProviderUrl::Tcp(a) => (if a.is_ipv4() { "tcp" } else { "tcp6" }, *a),
        };
        if let Some(prev) = out.iter().find(|m| m.netid == netid) {
            tracing::warn!(
                "listener {}: not registered with rpcbind: it holds one address per \
                 program, version and netid, and {netid} already maps to {}",
                l.url,
                prev.addr
            );
            continue;
        }
        let served = SERVED_PROGRAMS.iter().map(|p| (p.program, p.version));
        // Routed programs are registered for the RDMA listeners only. The
        // TCP listener relays them too, but registering them under `tcp`
        // would replace the backend's own mapping when the backend uses
        // this rpcbind (UNSET, then SET), and unregistering at shutdown
        // would leave the backend unfindable.
        let rdma = !matches!(l.url, ProviderUrl::Tcp(_));
        let routed = config
            .gateway
            .iter()
            .filter(|_| rdma)
            .flat_map(|g| g.versions.iter().map(move |&v| (g.program, v)));
        for (program, version) in served.chain(routed) {
            out.push(Mapping {
                program,
                version,
                netid: netid.to_string(),
                addr: universal_address(addr),
                owner: owner.clone(),
            });
        }
    }
    out
}

impl Registration {
    fn none(config: &Config) -> Self {
        Registration {
            address: config.rpcbind.address.clone(),
            timeout: Duration::from_millis(config.rpcbind.timeout_ms.into()),
            mappings: Vec::new(),
        }
    }

    /// RPCBPROC_SET for every planned mapping (after an UNSET that clears a
    /// stale entry of a previous run). Never fails: problems are one
    /// warning line and the daemon goes on without (some) registrations.
    pub fn register(config: &Config) -> Self {
        let mut reg = Registration::none(config);
        let planned = planned_mappings(config);
        if !planned.is_empty() {
            reg.apply(Vec::new(), planned, "serving without rpcbind registration");
        }
        reg
    }

    /// Makes the registrations follow `config` (a reload): UNSETs the
    /// mappings no longer planned, SETs the new ones, keeps the others.
    /// Returns (set, unset); a failure is one warning line.
    pub fn follow(&mut self, config: &Config) -> (usize, usize) {
        self.address = config.rpcbind.address.clone();
        self.timeout = Duration::from_millis(config.rpcbind.timeout_ms.into());
        let planned = if config.rpcbind.register {
            planned_mappings(config)
        } else {
            Vec::new()
        };
        let stale: Vec<Mapping> = self
            .mappings
            .iter()
            .filter(|m| !planned.contains(m))
            .cloned()
            .collect();
        let fresh: Vec<Mapping> = planned
            .into_iter()
            .filter(|m| !self.mappings.contains(m))
            .collect();
        if stale.is_empty() && fresh.is_empty() {
            return (0, 0);
        }
        self.apply(
            stale,
            fresh,
            "rpcbind registrations may not follow the listeners",
        )
    }

    /// UNSETs `stale`, then SETs each of `fresh` after an UNSET that clears
    /// what a previous run may have left (rpcbind keeps one address per
    /// program, version and netid). Returns (set, unset); a failure is
    /// one warning line ending in `after_failure`.
    fn apply(
        &mut self,
        stale: Vec<Mapping>,
        fresh: Vec<Mapping>,
        after_failure: &str,
    ) -> (usize, usize) {
        let (mut set, mut unset) = (0, 0);
        let result = (|| -> Result<(), RpcbindError> {
            let mut client = RpcbindClient::connect(&self.address, self.timeout)?;
            for m in &stale {
                client.unset(m)?;
                self.mappings.retain(|k| k != m);
                unset += 1;
            }
            for m in fresh {
                let _ = client.unset(&m)?;
                if client.set(&m)? {
                    tracing::info!(
                        "rpcbind: registered program {} version {} netid {} at {} (rpcbind v{})",
                        m.program,
                        m.version,
                        m.netid,
                        m.addr,
                        client.version()
                    );
                    self.mappings.push(m);
                    set += 1;
                } else {
                    tracing::warn!(
                        "rpcbind refused program {} version {} netid {} at {}: another owner \
                         holds it",
                        m.program,
                        m.version,
                        m.netid,
                        m.addr
                    );
                }
            }
            Ok(())
        })();
        if let Err(e) = result {
            tracing::warn!("{e}; {after_failure}");
        }
        (set, unset)
    }

    /// The mappings registered.
    pub fn mappings(&self) -> &[Mapping] {
        &self.mappings
    }

    /// RPCBPROC_UNSET for every registered mapping; a failure is one
    /// warning line.
    pub fn unregister(self) {
        if self.mappings.is_empty() {
            return;
        }
        let result = (|| -> Result<usize, RpcbindError> {
            let mut client = RpcbindClient::connect(&self.address, self.timeout)?;
            let mut removed = 0;
            for m in &self.mappings {
                removed += usize::from(client.unset(m)?);
            }
            Ok(removed)
        })();
        match result {
            Ok(n) => tracing::info!("rpcbind: unregistered {n} mapping(s)"),
            Err(e) => tracing::warn!("{e}; could not unregister from rpcbind"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hugepage_policies() {
        assert!(hugepage_verdict(Hugepages::Off, 0, 0).unwrap().is_none());
        assert!(hugepage_verdict(Hugepages::Prefer, 3, 64)
            .unwrap()
            .is_none());
        assert!(hugepage_verdict(Hugepages::Required, 3, 64)
            .unwrap()
            .is_none());
        let w = hugepage_verdict(Hugepages::Prefer, 0, 0).unwrap().unwrap();
        assert!(
            w.contains("4 KiB pages") && w.contains("vm.nr_hugepages"),
            "{w}"
        );
        let e = hugepage_verdict(Hugepages::Required, 0, 64)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "memory.hugepages = \"required\" but no 2 MiB hugepages are free (HugePages_Free 0 \
             of HugePages_Total 64); reserve some with deploy/setup-host or `sysctl -w \
             vm.nr_hugepages=512`, or set memory.hugepages = \"prefer\""
        );
    }

    #[test]
    fn shm_listeners_are_not_registered_and_netids_follow_the_address_family() {
        let listeners = [
            "shm:///run/x.sock",
            "roce://127.0.0.1:20049",
            "ibverbs://[::1]:20049",
            "tcp://127.0.0.1:2049",
            "roce://127.0.0.2:20049",
        ]
        .iter()
        .map(|u| crate::config::Listener {
            url: u.parse().unwrap(),
        })
        .collect();
        let c = Config {
            listeners,
            ..Config::default()
        };
        let m = planned_mappings(&c);
        let got: Vec<(u32, &str, &str)> = m
            .iter()
            .map(|m| (m.program, m.netid.as_str(), m.addr.as_str()))
            .collect();
        let bench = crate::programs::BENCH_PROG;
        assert_eq!(
            got,
            vec![
                (100_417, "rdma", "127.0.0.1.78.81"),
                (100_417, "rdma", "127.0.0.1.78.81"),
                (bench, "rdma", "127.0.0.1.78.81"),
                (100_417, "rdma6", "::1.78.81"),
                (100_417, "rdma6", "::1.78.81"),
                (bench, "rdma6", "::1.78.81"),
                (100_417, "tcp", "127.0.0.1.8.1"),
                (100_417, "tcp", "127.0.0.1.8.1"),
                (bench, "tcp", "127.0.0.1.8.1"),
            ]
        );
    }
}
