//! Pinned polling workers: where the engine meets a verbs provider
//! (docs/WORKER.md).
//!
//! A [`WorkerSet`] runs one thread per configured core, and each thread
//! serves every transport: the RDMA connections of every attached provider
//! ([`endpoint::Endpoint`], one list per provider, statically dispatched)
//! and its ONC RPC/TCP connections ([`crate::tcp::TcpConnections`]). Each
//! worker runs to completion: poll completions in bursts of 32, feed the
//! engines, run the service inline for every call that arrived and answer
//! it from one preallocated scratch buffer, post the resulting work once
//! per iteration (one doorbell per run of send work), run timers, one pass
//! over the TCP connections, drain its control ring (new connections,
//! stop). Nothing is shared on the hot path but cache-padded counters.
//!
//! The control plane accepts connections ([`WorkerSet::accept`],
//! [`endpoint::PreparedEndpoint`] by hand, or a TCP acceptor) and hands each
//! one to the least-loaded worker ([`WorkerSet::hand_off`],
//! [`WorkerSet::hand_off_tcp`]). [`WorkerPool<P>`] is the same workers with
//! one provider attached.
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::engine::{self, Event, IncomingCall, OutgoingReply};
use crate::tcp::{TcpConfig, TcpError};
use crate::verbs::roce::Roce;
use crate::verbs::shm::Shm;
use crate::verbs::{Completion, VerbsError};

pub mod endpoint;
mod fuzz;
mod pool;
mod run;
pub mod status;

pub use endpoint::{
    Endpoint, EndpointConfig, EndpointError, PreparedEndpoint, SharedRecvs, POLL_BURST,
};
pub use fuzz::{fuzz_endpoint, FuzzProvider};
pub use pool::{PoolProvider, PreparedGateway, WorkerPool, WorkerSet, WORKER_THREAD_PREFIX};
pub use status::{ConnectionStatus, WorkerStatus};

/// The seam to the service layer, defined there (`service::Dispatcher`);
/// `Dispatched` is the name the worker's users know for `service::Dispatch`.
pub use crate::service::{Dispatch as Dispatched, Dispatcher};

/// How a worker waits when a loop iteration found nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleStrategy {
    /// Never sleep (dedicated cores).
    Spin,
    /// Spin a while, then yield a while, then park for at most `park_max`
    /// (or until the next engine deadline, or until a command arrives).
    Adaptive {
        /// Longest sleep.
        park_max: Duration,
    },
}

impl Default for IdleStrategy {
    /// Adaptive, sleeping at most [`DEFAULT_PARK_MAX`].
    fn default() -> Self {
        IdleStrategy::Adaptive {
            park_max: DEFAULT_PARK_MAX,
        }
    }
}

/// Default longest sleep of the adaptive idle: 100 ms. Doorbells end a
/// sleep as soon as news comes (docs/WORKER.md, "Doorbells"), so the
/// bound only sets how often an idle worker looks around on its own:
/// measured on an idle `rpcrdmad`, 10 wake-ups a second and 0.4-0.6 % of
/// a core, against about 1,000 and 3 % at the 1 ms it was before
/// doorbells, with the same latency for an occasional call
/// (docs/BENCHMARKS.md, "Doorbells").
pub const DEFAULT_PARK_MAX: Duration = Duration::from_millis(100);

/// Idle iterations spent spinning before yielding (adaptive).
const IDLE_SPINS: u32 = 1024;
/// Idle iterations spent yielding before parking (adaptive). Few: on a
/// crowded core a `sched_yield` can cost a whole CFS period, so a long
/// yield phase is slower than a short park (measured with the bench
/// client, docs/BENCHMARKS.md).
const IDLE_YIELDS: u32 = 16;

/// Idle state of one polling loop (also used by the client).
#[derive(Debug, Clone, Copy)]
pub struct Idler {
    strategy: IdleStrategy,
    idle: u32,
}

impl Idler {
    /// A fresh idler.
    pub fn new(strategy: IdleStrategy) -> Idler {
        Idler { strategy, idle: 0 }
    }
    /// Work was found: start over.
    pub fn reset(&mut self) {
        self.idle = 0;
    }
    /// Whether the next [`Idler::idle`] parks (rather than spin or yield):
    /// the caller then tells its completion queues
    /// (`CompletionQueue::before_sleep`).
    pub fn will_park(&self) -> bool {
        matches!(self.strategy, IdleStrategy::Adaptive { .. })
            && self.idle.saturating_add(1) >= IDLE_SPINS + IDLE_YIELDS
    }

    /// Nothing was found: spin, yield or park (at most until `deadline`
    /// from now, if given). Returns true if it parked.
    pub fn idle(&mut self, until_deadline: Option<Duration>) -> bool {
        self.idle_then(until_deadline, std::thread::park_timeout) != Sleep::None
    }

    /// As [`Idler::idle`], but a park sleeps on `fds` (doorbells armed by
    /// the caller, `crate::wake`) until one is readable or the timeout;
    /// with no descriptors it parks the thread as `idle` does.
    pub fn idle_on(&mut self, until_deadline: Option<Duration>, fds: &mut [libc::pollfd]) -> Sleep {
        if fds.is_empty() {
            return self.idle_then(until_deadline, std::thread::park_timeout);
        }
        let mut woken = false;
        match self.idle_then(until_deadline, |t| woken = crate::wake::sleep_on(fds, t)) {
            Sleep::None => Sleep::None,
            _ if woken => Sleep::Woken,
            _ => Sleep::TimedOut,
        }
    }

    fn idle_then(
        &mut self,
        until_deadline: Option<Duration>,
        park: impl FnOnce(Duration),
    ) -> Sleep {
        self.idle = self.idle.saturating_add(1);
        match self.strategy {
            IdleStrategy::Spin => {
                std::hint::spin_loop();
                Sleep::None
            }
            IdleStrategy::Adaptive { park_max } => {
                if self.idle < IDLE_SPINS {
                    std::hint::spin_loop();
                    Sleep::None
                } else if self.idle < IDLE_SPINS + IDLE_YIELDS {
                    std::thread::yield_now();
                    Sleep::None
                } else {
                    park(until_deadline.map_or(park_max, |d| d.min(park_max)));
                    Sleep::TimedOut
                }
            }
        }
    }
}

/// Longest sleep while some news would ring no doorbell (a queue without
/// a wake-up descriptor, a relay call queued for a backend connection;
/// docs/WORKER.md, "Doorbells").
pub const UNRUNG_SLEEP_MAX: Duration = Duration::from_millis(1);

/// A sleep's bound `until` (none: `park_max`) shortened to
/// [`UNRUNG_SLEEP_MAX`], for a sleeper some of whose news rings nothing.
pub(crate) fn unrung(until: Option<Duration>) -> Option<Duration> {
    Some(until.map_or(UNRUNG_SLEEP_MAX, |u| u.min(UNRUNG_SLEEP_MAX)))
}

/// How an [`Idler`] step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sleep {
    /// It spun or yielded: no sleep.
    None,
    /// It slept to its timeout (or a plain park was unparked).
    TimedOut,
    /// A doorbell ended the sleep (`Idler::idle_on`).
    Woken,
}

/// Default of [`WorkerConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// Send-queue depth of a server connection: a reply's Writes and Send
/// for half the credits at once at rpcrdmad's defaults; more waits in
/// the endpoint's backlog. The software providers keep a queue of work
/// requests and one of completions this deep per connection (about
/// 47 KiB at 128), so it weighs on an idle connection's memory.
pub const SERVER_MAX_SEND_WR: u32 = 128;

/// Default of [`WorkerConfig::bulk_buffers`]: as many large messages at
/// once as one connection's responder slots at the default 32 credits.
pub const DEFAULT_BULK_BUFFERS: u32 = 64;

/// Default of [`WorkerConfig::shared_receives`]: the floor of every
/// connection [`DEFAULT_MAX_CONNECTIONS`] allows on one worker, three
/// times over (16 MiB per worker and provider at 4 KiB inline receives).
pub const DEFAULT_SHARED_RECEIVES: u32 = 4096;

/// Worker configuration.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// How connections are built (engine limits, queue depths).
    pub endpoint: EndpointConfig,
    /// Idle strategy.
    pub idle: IdleStrategy,
    /// Commands a worker's control ring holds.
    pub ring_capacity: usize,
    /// Connections a worker holds without reallocating its table.
    pub connections_hint: usize,
    /// After a stop's grace period, how long closed connections may take
    /// to flush before the worker gives up and reports them as leaks.
    pub drain_timeout: Duration,
    /// Limits of the ONC RPC/TCP connections a worker serves (the daemon
    /// sets both message limits to `transport.max_message`).
    pub tcp: TcpConfig,
    /// Connections of every transport the whole set serves at once. A
    /// request beyond it is refused before any memory is set up for it
    /// (an RDMA connection is rejected, a TCP stream closed), so a peer
    /// that opens connections in a loop cannot exhaust the node's
    /// registered memory (each connection holds its buffers for life).
    pub max_connections: usize,
    /// Buffers of each worker's bulk pool, per provider (docs/WORKER.md,
    /// "Bulk buffers"), each as large as the largest call or reply: the
    /// large messages of every connection the worker serves lease from
    /// it. 0: no pool, every responder slot owns a buffer of the largest
    /// message (the address space of a connection is then about
    /// `1.25 x credits x max message`). An exchange leases one buffer at
    /// most (its call, then its reply, share it).
    pub bulk_buffers: u32,
    /// Receives of each worker's shared receive queue, per provider
    /// (docs/WORKER.md, "Shared receives"), each of the inline receive
    /// size: every connection of the worker receives from it, and gives
    /// each buffer back as soon as it has copied the message out. They
    /// back the grants of all those connections: each reserves one at
    /// least, so a worker takes no more connections than this, and grants
    /// are cut to what is free. 0: no shared queue, every connection posts
    /// `credits` receives of its own.
    pub shared_receives: u32,
    /// Programs relayed to ONC RPC servers over TCP (docs/GATEWAY.md):
    /// each worker forwards the RDMA calls of a routed program to its
    /// backend and relays the replies. `None`: every call is served by
    /// the dispatcher.
    pub gateway: Option<GatewaySetup>,
    /// Live TCP connections per peer address, shared with the acceptors
    /// that count connections in ([`WorkerSet::admit_tcp_peer`]); each
    /// worker counts out the ones it closes. `None`: no limit per address.
    pub tcp_peers: Option<std::sync::Arc<crate::tcp::PeerCounts>>,
}

/// What every worker's relay is built from: the routes and limits. Each
/// worker counts into counters of its own ([`GatewayState`]).
#[derive(Debug, Clone)]
pub struct GatewaySetup {
    /// Routes and limits (validated).
    pub config: std::sync::Arc<crate::gateway::GatewayConfig>,
}

/// The routes the workers relay now and each worker's counters for them
/// (written by that worker only; a reader sums them).
#[derive(Debug, Clone)]
pub struct GatewayState {
    /// Routes and limits.
    pub config: std::sync::Arc<crate::gateway::GatewayConfig>,
    /// One per worker, in worker order.
    pub counters: Vec<std::sync::Arc<crate::gateway::GatewayCounters>>,
}

impl GatewayState {
    /// Fresh counters for every one of `workers` workers.
    fn new(setup: &GatewaySetup, workers: usize) -> GatewayState {
        GatewayState {
            config: setup.config.clone(),
            counters: (0..workers)
                .map(|_| std::sync::Arc::new(crate::gateway::GatewayCounters::new(&setup.config)))
                .collect(),
        }
    }
}

impl Default for WorkerConfig {
    /// The engine's defaults, except no requester slot: a server
    /// connection never calls, so its memory is the responder's
    /// (docs/WORKER.md, "Memory per connection").
    fn default() -> Self {
        let mut endpoint = EndpointConfig::default();
        endpoint.engine.max_outstanding_calls = 0;
        endpoint.max_send_wr = SERVER_MAX_SEND_WR;
        WorkerConfig {
            endpoint,
            idle: IdleStrategy::default(),
            ring_capacity: 256,
            connections_hint: 64,
            drain_timeout: Duration::from_secs(5),
            tcp: TcpConfig::default(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            bulk_buffers: DEFAULT_BULK_BUFFERS,
            shared_receives: DEFAULT_SHARED_RECEIVES,
            gateway: None,
            tcp_peers: None,
        }
    }
}

/// A cache-padded relaxed counter.
#[derive(Debug, Default)]
pub struct Counter(CachePadded<AtomicU64>);

impl Counter {
    fn add(&self, n: u64) {
        if n != 0 {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
    }
    fn sub(&self, n: u64) {
        if n != 0 {
            self.0.fetch_sub(n, Ordering::Relaxed);
        }
    }
    fn set(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }
    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A worker's counters, written by the worker (Relaxed), read by anyone.
/// TCP connections feed the same counters as RDMA ones: `rpcs`,
/// `bytes_in`/`bytes_out` (socket bytes), `errors_dropped_calls` (records
/// that are not a decodable call; the TCP connection stays),
/// `errors_connection` (TCP connections dropped for an oversized or
/// truncated record, a socket error or the idle timeout, or refused), and
/// the connection gauges.
#[derive(Debug, Default)]
pub struct WorkerCounters {
    /// Loop iterations.
    pub polls: Counter,
    /// Iterations that found nothing to do.
    pub idle_polls: Counter,
    /// Times the worker slept (adaptive idle's park).
    pub sleeps: Counter,
    /// Sleeps a doorbell ended before their timeout: a peer published a
    /// message, or the control plane handed over work or a stop.
    pub doorbell_wakeups: Counter,
    /// Completions handled.
    pub completions: Counter,
    /// Calls answered (service replies sent).
    pub rpcs: Counter,
    /// Bytes received (Sends and RDMA Reads).
    pub bytes_in: Counter,
    /// Bytes sent (Sends and RDMA Writes).
    pub bytes_out: Counter,
    /// RDMA Reads completed (call read chunks pulled).
    pub rdma_reads: Counter,
    /// RDMA Writes completed (write and reply chunks filled).
    pub rdma_writes: Counter,
    /// Completions with an error status (flushes included).
    pub errors_completion: Counter,
    /// Replies the engine refused (answered SYSTEM_ERR instead).
    pub errors_reply: Counter,
    /// Calls the service dropped (the connection is closed).
    pub errors_dropped_calls: Counter,
    /// Work requests refused as malformed.
    pub errors_post: Counter,
    /// Connections closed by a protocol violation or a transport error.
    pub errors_connection: Counter,
    /// Connections closed with resources still in use.
    pub leaks: Counter,
    /// Times an RDMA connection was processed (events, service, posting).
    /// Connections on a worker's shared completion queue are processed
    /// only when they have work, so this grows with the traffic, not with
    /// the number of idle connections.
    pub endpoints_processed: Counter,
    /// Gauge: peer calls being served (credits in use).
    pub credits_in_use: Counter,
    /// Gauge: region leases held by posted work (pool occupancy).
    pub pool_in_use: Counter,
    /// Gauge: connections on this worker, every transport.
    pub connections: Counter,
    /// Connections accepted by this worker so far, every transport.
    pub connections_total: Counter,
    /// Gauge: connections on this worker per transport (index
    /// [`Transport::index`]).
    pub connections_by_transport: [Counter; 4],
    /// Nanoseconds spent in loop iterations that did work (the worker's
    /// busy time; from the clock the loop reads anyway, once per
    /// iteration).
    pub busy_ns: Counter,
    /// Connections that ended cleanly: the peer disconnected in order or
    /// ended its stream between calls, or we closed it (shutdown, idle
    /// timeout).
    pub closed_clean: Counter,
    /// Connections that ended in a fault: a protocol violation, a
    /// transport error, a truncated or oversized record, a socket error.
    pub closed_fault: Counter,
}

/// A point-in-time copy of [`WorkerCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct WorkerSnapshot {
    pub polls: u64,
    pub idle_polls: u64,
    pub sleeps: u64,
    pub doorbell_wakeups: u64,
    pub completions: u64,
    pub rpcs: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub rdma_reads: u64,
    pub rdma_writes: u64,
    pub errors_completion: u64,
    pub errors_reply: u64,
    pub errors_dropped_calls: u64,
    pub errors_post: u64,
    pub errors_connection: u64,
    pub leaks: u64,
    pub endpoints_processed: u64,
    pub credits_in_use: u64,
    pub pool_in_use: u64,
    pub connections: u64,
    pub connections_total: u64,
    pub connections_by_transport: [u64; 4],
    pub busy_ns: u64,
    pub closed_clean: u64,
    pub closed_fault: u64,
}

impl WorkerCounters {
    /// Reads every counter (each Relaxed; not one atomic snapshot).
    pub fn snapshot(&self) -> WorkerSnapshot {
        WorkerSnapshot {
            polls: self.polls.get(),
            idle_polls: self.idle_polls.get(),
            sleeps: self.sleeps.get(),
            doorbell_wakeups: self.doorbell_wakeups.get(),
            completions: self.completions.get(),
            rpcs: self.rpcs.get(),
            bytes_in: self.bytes_in.get(),
            bytes_out: self.bytes_out.get(),
            rdma_reads: self.rdma_reads.get(),
            rdma_writes: self.rdma_writes.get(),
            errors_completion: self.errors_completion.get(),
            errors_reply: self.errors_reply.get(),
            errors_dropped_calls: self.errors_dropped_calls.get(),
            errors_post: self.errors_post.get(),
            errors_connection: self.errors_connection.get(),
            leaks: self.leaks.get(),
            endpoints_processed: self.endpoints_processed.get(),
            credits_in_use: self.credits_in_use.get(),
            pool_in_use: self.pool_in_use.get(),
            connections: self.connections.get(),
            connections_total: self.connections_total.get(),
            connections_by_transport: core::array::from_fn(|i| {
                self.connections_by_transport[i].get()
            }),
            busy_ns: self.busy_ns.get(),
            closed_clean: self.closed_clean.get(),
            closed_fault: self.closed_fault.get(),
        }
    }
}

/// A command on a worker's control ring.
///
/// One variant per transport, so the worker keeps each provider's
/// connections in a list of its own type and polls them with static
/// dispatch (each provider also has an endpoint list in `run::Conns` and
/// a [`PoolProvider`] impl in `pool.rs`).
pub enum Command {
    /// Serve this `shm` connection (accepted, receives pre-posted).
    AddShm(Box<Endpoint<Shm>>),
    /// Serve this `roce` connection (accepted, receives pre-posted).
    AddRoce(Box<Endpoint<Roce>>),
    /// Serve this `ibverbs` connection (accepted, receives pre-posted).
    #[cfg(feature = "ibverbs")]
    AddIbverbs(Box<Endpoint<crate::verbs::ibverbs::Ibverbs>>),
    /// Serve this accepted ONC RPC/TCP stream (the worker makes it
    /// non-blocking).
    AddTcp(TcpStream),
    /// Report every connection ([`status`]) on this channel.
    Status(std::sync::mpsc::SyncSender<WorkerStatus>),
    /// Relay routed programs with this relay from now on (a reload).
    Gateway(Box<run::RelaySwap>),
    /// Stop: let calls in progress finish for at most `grace`, then close
    /// everything and exit.
    Stop {
        /// Grace period.
        grace: Duration,
    },
}

impl core::fmt::Debug for Command {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Command::AddShm(ep) => f.debug_tuple("AddShm").field(ep).finish(),
            Command::AddRoce(ep) => f.debug_tuple("AddRoce").field(ep).finish(),
            #[cfg(feature = "ibverbs")]
            Command::AddIbverbs(ep) => f.debug_tuple("AddIbverbs").field(ep).finish(),
            Command::AddTcp(s) => f.debug_tuple("AddTcp").field(s).finish(),
            Command::Status(_) => f.write_str("Status"),
            Command::Gateway(g) => f.debug_tuple("Gateway").field(g).finish(),
            Command::Stop { grace } => f.debug_struct("Stop").field("grace", grace).finish(),
        }
    }
}

/// The transports a worker serves, for per-transport gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// `shm://` (same-host RDMA).
    Shm,
    /// `roce://` (software RoCEv2).
    Roce,
    /// `ibverbs://` (an HCA; cargo feature `ibverbs`).
    Ibverbs,
    /// `tcp://` (ONC RPC over TCP with record marking).
    Tcp,
}

impl Transport {
    /// Every transport, in index order.
    pub const ALL: [Transport; 4] = [
        Transport::Shm,
        Transport::Roce,
        Transport::Ibverbs,
        Transport::Tcp,
    ];

    /// Its URL scheme.
    pub fn scheme(self) -> &'static str {
        match self {
            Transport::Shm => "shm",
            Transport::Roce => "roce",
            Transport::Ibverbs => "ibverbs",
            Transport::Tcp => "tcp",
        }
    }

    /// Its index in [`Transport::ALL`] (and in the per-transport arrays
    /// of [`WorkerCounters`]).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A connection that was closed with resources still in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leak {
    /// Worker index.
    pub worker: usize,
    /// Queue-pair number of the connection.
    pub qp_num: u32,
    /// Engine resources still in use.
    pub resources: engine::Resources,
    /// Region leases never returned by the provider.
    pub leases_in_use: usize,
}

/// What one worker reports when it exits.
#[derive(Debug, Clone, Default)]
pub struct WorkerReport {
    /// Worker index.
    pub worker: usize,
    /// Connections served over the worker's life.
    pub connections: u64,
    /// Connections closed while calls were still in progress (the grace
    /// period ran out).
    pub cut_short: u64,
    /// Leaks (empty when every pool came back full).
    pub leaks: Vec<Leak>,
    /// Final counters.
    pub counters: WorkerSnapshot,
}

/// What [`WorkerPool::stop`] reports.
#[derive(Debug, Clone, Default)]
pub struct ShutdownReport {
    /// One per worker.
    pub workers: Vec<WorkerReport>,
    /// Workers whose thread panicked.
    pub panicked: Vec<usize>,
    /// Bulk pools (provider scheme, worker) not back to full once every
    /// worker stopped: leaked buffers or work-request leases.
    pub bulk_short: Vec<(&'static str, usize)>,
    /// Shared receive queues (provider scheme, worker) missing buffers
    /// once every worker stopped: a buffer neither posted nor free.
    pub shared_recv_short: Vec<(&'static str, usize)>,
}

impl ShutdownReport {
    /// True when every pool came back full and no worker panicked.
    pub fn is_clean(&self) -> bool {
        self.panicked.is_empty()
            && self.bulk_short.is_empty()
            && self.shared_recv_short.is_empty()
            && self.workers.iter().all(|w| w.leaks.is_empty())
    }
}

/// Control-path errors of the worker pool.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A configured core does not exist or is not in this process's CPU
    /// mask.
    #[error("core {core} is not available to this process (allowed cores: {allowed:?}); fix `cores` in the configuration or the CPU mask (taskset/cpuset)")]
    CoreUnavailable {
        /// The core asked for.
        core: usize,
        /// Cores this process may run on.
        allowed: Vec<usize>,
    },
    /// Pinning the thread failed.
    #[error("cannot pin worker {worker} to core {core}")]
    PinFailed {
        /// Worker index.
        worker: usize,
        /// The core.
        core: usize,
    },
    /// No workers were configured.
    #[error("at least one worker is needed")]
    NoWorkers,
    /// Spawning a thread failed.
    #[error("cannot spawn worker thread: {0}")]
    Spawn(std::io::Error),
    /// Building or accepting a connection failed.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// Provider errors (accept).
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// Every worker's control ring is full, or the pool is stopping.
    #[error("no worker can take the connection (control rings full or stopping)")]
    Busy,
    /// The set already serves `max_connections`; the request was refused.
    #[error("connection limit reached: {limit} connections already served (raise `workers.max_connections` if the node has memory for more)")]
    ConnectionLimit {
        /// The configured limit.
        limit: usize,
    },
    /// The peer address already has the most connections one address may
    /// have; the request was refused.
    #[error("per-address limit reached: this address already has {limit} connections (raise `workers.max_connections_per_peer` if one client host needs more)")]
    PeerLimit {
        /// The configured limit.
        limit: usize,
    },
    /// A worker's bulk pool could not be allocated or registered
    /// (`WorkerSet::attach`).
    #[error("cannot set up worker {worker}'s {scheme} bulk pool of {bytes} bytes ({source}): lower WorkerConfig::bulk_buffers or the message sizes, or free memory")]
    BulkPool {
        /// The provider.
        scheme: &'static str,
        /// The worker.
        worker: usize,
        /// Bytes the pool needs.
        bytes: usize,
        /// The memory or registration error.
        source: EndpointError,
    },
    /// A worker's shared receive queue could not be set up
    /// (`WorkerSet::attach`).
    #[error("cannot set up worker {worker}'s {scheme} shared receive queue of {count} buffers ({source}): lower WorkerConfig::shared_receives, or free memory")]
    SharedReceives {
        /// The provider.
        scheme: &'static str,
        /// The worker.
        worker: usize,
        /// Buffers asked for.
        count: u32,
        /// The memory, registration or queue error.
        source: EndpointError,
    },
    /// No context of this provider was attached to the worker set.
    #[error("no {scheme} provider attached to the workers")]
    NotAttached {
        /// The provider's scheme.
        scheme: &'static str,
    },
    /// The TCP configuration is out of range.
    #[error(transparent)]
    Tcp(#[from] TcpError),
    /// The gateway's routes or limits are refused.
    #[error("gateway configuration: {0}")]
    GatewayConfig(#[from] crate::gateway::GatewayConfigError),
    /// A worker could not set up its relay to the gateway's backends.
    #[error("cannot set up worker {worker}'s gateway relay ({source}): lower the gateway's max_message or connections, or free memory")]
    Gateway {
        /// The worker.
        worker: usize,
        /// The mapping or socket error.
        source: std::io::Error,
    },
}

/// Writes an accepted SYSTEM_ERR reply with `xid` (RFC 5531 s9:
/// xid, REPLY, MSG_ACCEPTED, AUTH_NONE verifier, SYSTEM_ERR); returns its
/// length (24).
fn system_err_reply(xid: [u8; 4], out: &mut [u8]) -> usize {
    const WORDS: [u32; 5] = [1, 0, 0, 0, 5];
    if out.len() < 24 {
        return 0;
    }
    out[..4].copy_from_slice(&xid);
    for (i, w) in WORDS.iter().enumerate() {
        out[4 + 4 * i..8 + 4 * i].copy_from_slice(&w.to_be_bytes());
    }
    24
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_server_connection_fits_one_registration() {
        let cfg = WorkerConfig::default();
        let len = engine::Connection::memory_len(&cfg.endpoint.engine).unwrap();
        assert!(len.private < u32::MAX as usize, "{len:?}");
        assert!(len.peer < u32::MAX as usize, "{len:?}");
        eprintln!(
            "default connection memory: {} MiB private, {} MiB peer",
            len.private >> 20,
            len.peer >> 20
        );
    }

    #[test]
    fn system_err_reply_is_an_accepted_system_err() {
        let mut out = [0u8; 32];
        let n = system_err_reply(7u32.to_be_bytes(), &mut out);
        let (h, hl) = crate::wire::rpc::ReplyHeader::parse(&out[..n]).unwrap();
        assert_eq!((h.xid, hl), (7, 24));
        assert!(matches!(
            h.body,
            crate::wire::rpc::ReplyBody::Accepted(a)
                if a.status == crate::wire::rpc::AcceptStatus::SystemErr
        ));
        assert_eq!(system_err_reply([0; 4], &mut [0u8; 8]), 0);
    }
}
