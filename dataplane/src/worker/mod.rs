//! Pinned polling workers: where the engine meets a verbs provider
//! (DESIGN s2, s5; docs/WORKER.md).
//!
//! A [`WorkerPool`] runs one thread per configured core. Each worker owns
//! its connections ([`endpoint::Endpoint`]) and runs to completion: poll
//! completions in bursts of 32, feed the engines, run the service inline
//! for every call that arrived and answer it from one preallocated scratch
//! buffer, post the resulting work once per iteration (one doorbell per
//! run of send work), run timers, drain its control ring (new connections,
//! stop). Nothing is shared on the hot path but cache-padded counters.
//!
//! The control plane accepts connections ([`WorkerPool::accept`] or
//! [`endpoint::PreparedEndpoint`] by hand) and hands each one to the
//! least-loaded worker ([`WorkerPool::hand_off`]).
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;

use crate::engine::{self, DdpItem, Event, IncomingCall, OutgoingReply};
use crate::verbs::{Completion, Listener, Provider, VerbsError};

pub mod endpoint;

pub use endpoint::{Endpoint, EndpointConfig, EndpointError, PreparedEndpoint, POLL_BURST};

/// What a worker does with a call message: the seam to the service layer
/// (`service::ServiceTable` implements it).
pub trait Dispatcher: Send + Sync + 'static {
    /// Handles the RPC call message `call` (XDR, as received), writing the
    /// whole RPC reply message into `reply`.
    fn dispatch(&self, call: &[u8], reply: &mut [u8]) -> Dispatched;
}

/// Outcome of [`Dispatcher::dispatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatched {
    /// The reply is `reply[..len]`; `ddp` marks its DDP-eligible result.
    Reply {
        /// Length of the reply message.
        len: usize,
        /// The DDP-eligible item, if any.
        ddp: Option<DdpItem>,
    },
    /// No reply (RFC 5531 lets a server drop a call it cannot parse).
    Drop,
}

/// The service layer's table is what the daemon runs: [`Dispatched`] is
/// [`crate::service::Dispatch`] one to one. (The trait keeps the loop
/// testable with any handler; this impl lives here because the worker is
/// where the two meet.)
impl Dispatcher for crate::service::ServiceTable {
    fn dispatch(&self, call: &[u8], reply: &mut [u8]) -> Dispatched {
        match crate::service::ServiceTable::dispatch(self, call, reply) {
            crate::service::Dispatch::Reply { len, ddp } => Dispatched::Reply { len, ddp },
            crate::service::Dispatch::Drop => Dispatched::Drop,
        }
    }
}

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
    fn default() -> Self {
        IdleStrategy::Adaptive {
            park_max: Duration::from_millis(1),
        }
    }
}

/// Idle iterations spent spinning before yielding (adaptive).
const IDLE_SPINS: u32 = 1024;
/// Idle iterations spent yielding before parking (adaptive).
const IDLE_YIELDS: u32 = 64;

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
    /// Nothing was found: spin, yield or park (at most until `deadline`
    /// from now, if given). Returns true if it parked.
    pub fn idle(&mut self, until_deadline: Option<Duration>) -> bool {
        self.idle = self.idle.saturating_add(1);
        match self.strategy {
            IdleStrategy::Spin => {
                std::hint::spin_loop();
                false
            }
            IdleStrategy::Adaptive { park_max } => {
                if self.idle < IDLE_SPINS {
                    std::hint::spin_loop();
                    false
                } else if self.idle < IDLE_SPINS + IDLE_YIELDS {
                    std::thread::yield_now();
                    false
                } else {
                    let t = until_deadline.map_or(park_max, |d| d.min(park_max));
                    std::thread::park_timeout(t);
                    true
                }
            }
        }
    }
}

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
}

impl Default for WorkerConfig {
    /// The engine's defaults, except one requester slot: a server
    /// connection never calls (the slot only satisfies the engine), so its
    /// memory is the responder's (docs/WORKER.md, "Memory").
    fn default() -> Self {
        let mut endpoint = EndpointConfig::default();
        endpoint.engine.max_outstanding_calls = 1;
        WorkerConfig {
            endpoint,
            idle: IdleStrategy::default(),
            ring_capacity: 256,
            connections_hint: 64,
            drain_timeout: Duration::from_secs(5),
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
    fn set(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }
    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A worker's counters, written by the worker (Relaxed), read by anyone.
#[derive(Debug, Default)]
pub struct WorkerCounters {
    /// Loop iterations.
    pub polls: Counter,
    /// Iterations that found nothing to do.
    pub idle_polls: Counter,
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
    /// Gauge: peer calls being served (credits in use).
    pub credits_in_use: Counter,
    /// Gauge: region leases held by posted work (pool occupancy).
    pub pool_in_use: Counter,
    /// Gauge: connections on this worker.
    pub connections: Counter,
    /// Connections accepted by this worker so far.
    pub connections_total: Counter,
}

/// A point-in-time copy of [`WorkerCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct WorkerSnapshot {
    pub polls: u64,
    pub idle_polls: u64,
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
    pub credits_in_use: u64,
    pub pool_in_use: u64,
    pub connections: u64,
    pub connections_total: u64,
}

impl WorkerCounters {
    /// Reads every counter (each Relaxed; not one atomic snapshot).
    pub fn snapshot(&self) -> WorkerSnapshot {
        WorkerSnapshot {
            polls: self.polls.get(),
            idle_polls: self.idle_polls.get(),
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
            credits_in_use: self.credits_in_use.get(),
            pool_in_use: self.pool_in_use.get(),
            connections: self.connections.get(),
            connections_total: self.connections_total.get(),
        }
    }
}

/// A command on a worker's control ring.
pub enum Command<P: Provider> {
    /// Serve this connection (accepted, receives pre-posted).
    Add(Box<Endpoint<P>>),
    /// Stop: let calls in progress finish for at most `grace`, then close
    /// everything and exit.
    Stop {
        /// Grace period.
        grace: Duration,
    },
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
}

impl ShutdownReport {
    /// True when every pool came back full and no worker panicked.
    pub fn is_clean(&self) -> bool {
        self.panicked.is_empty() && self.workers.iter().all(|w| w.leaks.is_empty())
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
}

impl<P: Provider> core::fmt::Debug for Command<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Command::Add(ep) => f.debug_tuple("Add").field(ep).finish(),
            Command::Stop { grace } => f.debug_struct("Stop").field("grace", grace).finish(),
        }
    }
}

struct WorkerHandle<P: Provider> {
    ring: Arc<ArrayQueue<Command<P>>>,
    counters: Arc<WorkerCounters>,
    thread: Option<JoinHandle<WorkerReport>>,
}

/// A set of pinned workers and the handles the control plane needs.
pub struct WorkerPool<P: Provider> {
    workers: Vec<WorkerHandle<P>>,
    ctx: Arc<P::Context>,
    pd: Arc<P::Pd>,
    config: WorkerConfig,
}

impl<P: Provider> core::fmt::Debug for WorkerPool<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("workers", &self.workers.len())
            .field("config", &self.config)
            .finish()
    }
}

impl<P: Provider> WorkerPool<P> {
    /// Spawns one worker per entry of `cores` (`Some(core)`: pinned there
    /// with core_affinity; `None`: not pinned) serving `dispatcher`. The
    /// pool allocates one protection domain from `ctx` for its connections.
    ///
    /// # Errors
    /// [`WorkerError::CoreUnavailable`] for a core outside the process's
    /// mask, [`WorkerError::PinFailed`], [`WorkerError::Spawn`],
    /// [`WorkerError::NoWorkers`], or a PD allocation error.
    pub fn spawn(
        ctx: Arc<P::Context>,
        cores: &[Option<usize>],
        config: WorkerConfig,
        dispatcher: Arc<dyn Dispatcher>,
    ) -> Result<WorkerPool<P>, WorkerError> {
        use crate::verbs::Context as _;
        if cores.is_empty() {
            return Err(WorkerError::NoWorkers);
        }
        let allowed: Vec<usize> = core_affinity::get_core_ids()
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.id)
            .collect();
        for core in cores.iter().flatten() {
            if !allowed.contains(core) {
                return Err(WorkerError::CoreUnavailable {
                    core: *core,
                    allowed,
                });
            }
        }
        let pd = Arc::new(ctx.alloc_pd()?);
        let mut pool = WorkerPool {
            workers: Vec::with_capacity(cores.len()),
            ctx,
            pd,
            config: config.clone(),
        };
        for (index, core) in cores.iter().copied().enumerate() {
            let ring = Arc::new(ArrayQueue::new(config.ring_capacity.max(1)));
            let counters = Arc::new(WorkerCounters::default());
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let worker = Worker::<P> {
                index,
                ring: ring.clone(),
                counters: counters.clone(),
                dispatcher: dispatcher.clone(),
                config: config.clone(),
            };
            let thread = std::thread::Builder::new()
                .name(format!("rpcrdma-worker-{index}"))
                .spawn(move || {
                    if let Some(core) = core {
                        if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
                            let _ = ready_tx.send(Err(WorkerError::PinFailed {
                                worker: index,
                                core,
                            }));
                            return WorkerReport {
                                worker: index,
                                ..WorkerReport::default()
                            };
                        }
                    }
                    let _ = ready_tx.send(Ok(()));
                    worker.run()
                })
                .map_err(WorkerError::Spawn)?;
            let started = ready_rx.recv().unwrap_or(Err(WorkerError::PinFailed {
                worker: index,
                core: core.unwrap_or(0),
            }));
            pool.workers.push(WorkerHandle {
                ring,
                counters,
                thread: Some(thread),
            });
            // On error the pool (and its started workers) stops on drop.
            started?;
        }
        Ok(pool)
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Never true for a spawned pool.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// The provider context the pool's connections use.
    pub fn context(&self) -> &Arc<P::Context> {
        &self.ctx
    }

    /// The configuration.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Builds a connection's prepared side (memory registered, receives
    /// posted) with the pool's PD and configuration.
    ///
    /// # Errors
    /// As [`PreparedEndpoint::new`].
    pub fn prepare(&self) -> Result<PreparedEndpoint<P>, EndpointError> {
        PreparedEndpoint::new(&*self.ctx, &*self.pd, &self.config.endpoint)
    }

    /// Index of the worker with the fewest connections.
    pub fn least_loaded(&self) -> usize {
        self.workers
            .iter()
            .enumerate()
            .min_by_key(|(_, w)| w.counters.connections.get())
            .map_or(0, |(i, _)| i)
    }

    /// Hands `ep` to the least-loaded worker over its control ring; returns
    /// the worker index. On failure the endpoint is handed back.
    ///
    /// # Errors
    /// The endpoint, when every ring is full.
    pub fn hand_off(&self, ep: Endpoint<P>) -> Result<usize, Box<Endpoint<P>>> {
        let first = self.least_loaded();
        let mut ep = Box::new(ep);
        for k in 0..self.workers.len() {
            let i = (first + k) % self.workers.len();
            let w = &self.workers[i];
            // Count it before the worker sees it, so that concurrent
            // hand-offs spread.
            w.counters.connections.add(1);
            match w.ring.push(Command::Add(ep)) {
                Ok(()) => {
                    if let Some(t) = &w.thread {
                        t.thread().unpark();
                    }
                    return Ok(i);
                }
                Err(back) => {
                    w.counters.connections.0.fetch_sub(1, Ordering::Relaxed);
                    match back {
                        Command::Add(back) => ep = back,
                        // A full ring hands back exactly what was pushed.
                        Command::Stop { .. } => unreachable!("ring returned another command"),
                    }
                }
            }
        }
        Err(ep)
    }

    /// Waits up to `timeout` for one connection request on `listener`,
    /// accepts it with our RFC 8797 private data (receives pre-posted
    /// before the accept) and hands it to the least-loaded worker. Returns
    /// the worker index.
    ///
    /// # Errors
    /// [`WorkerError::Verbs`] (including [`VerbsError::Timeout`]),
    /// [`WorkerError::Endpoint`], [`WorkerError::Busy`].
    pub fn accept(&self, listener: &P::Listener, timeout: Duration) -> Result<usize, WorkerError> {
        let incoming = listener.accept(timeout)?;
        let prepared = self.prepare()?;
        let ep = prepared.accept(incoming)?;
        self.hand_off(ep).map_err(|_| WorkerError::Busy)
    }

    /// The counters of every worker.
    pub fn snapshot(&self) -> Vec<WorkerSnapshot> {
        self.workers.iter().map(|w| w.counters.snapshot()).collect()
    }

    /// The shared counters of every worker (for a metrics exporter).
    pub fn counters(&self) -> Vec<Arc<WorkerCounters>> {
        self.workers.iter().map(|w| w.counters.clone()).collect()
    }

    /// Stops every worker: calls in progress get `grace` to finish, then
    /// every connection is closed and flushed; the report names any pool
    /// that did not come back full.
    pub fn stop(mut self, grace: Duration) -> ShutdownReport {
        self.stop_inner(grace)
    }

    fn stop_inner(&mut self, grace: Duration) -> ShutdownReport {
        let mut report = ShutdownReport::default();
        for w in &self.workers {
            let mut cmd = Command::Stop { grace };
            // A full ring drains quickly: the worker is running.
            while let Err(back) = w.ring.push(cmd) {
                cmd = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            if let Some(t) = &w.thread {
                t.thread().unpark();
            }
        }
        for (i, w) in self.workers.iter_mut().enumerate() {
            if let Some(t) = w.thread.take() {
                match t.join() {
                    Ok(r) => report.workers.push(r),
                    Err(_) => report.panicked.push(i),
                }
            }
        }
        report
    }
}

impl<P: Provider> Drop for WorkerPool<P> {
    fn drop(&mut self) {
        if self.workers.iter().any(|w| w.thread.is_some()) {
            let _ = self.stop_inner(Duration::ZERO);
        }
    }
}

/// One worker thread's state.
struct Worker<P: Provider> {
    index: usize,
    ring: Arc<ArrayQueue<Command<P>>>,
    counters: Arc<WorkerCounters>,
    dispatcher: Arc<dyn Dispatcher>,
    config: WorkerConfig,
}

/// Phase of a worker's shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// Serving until no call is in progress or the deadline.
    Grace {
        deadline: engine::Instant,
    },
    /// Everything closed; flushing until the deadline.
    Draining {
        deadline: engine::Instant,
    },
}

fn instant_after(now: engine::Instant, d: Duration) -> engine::Instant {
    now.saturating_add(d)
}

impl<P: Provider> Worker<P> {
    fn run(self) -> WorkerReport {
        let origin = std::time::Instant::now();
        let clock = || engine::Instant(origin.elapsed().as_nanos() as u64);
        let mut endpoints: Vec<Box<Endpoint<P>>> = Vec::with_capacity(self.config.connections_hint);
        let mut wcs: Vec<Completion> = (0..POLL_BURST).map(|_| Completion::default()).collect();
        let mut scratch =
            vec![0u8; self.config.endpoint.engine.max_reply_size as usize].into_boxed_slice();
        let mut idler = Idler::new(self.config.idle);
        let mut phase = Phase::Running;
        let mut report = WorkerReport {
            worker: self.index,
            ..WorkerReport::default()
        };
        let mut iteration: u64 = 0;
        let c = &*self.counters;
        loop {
            let now = clock();
            iteration += 1;
            let mut work = 0usize;

            // Control ring.
            while let Some(cmd) = self.ring.pop() {
                work += 1;
                match cmd {
                    Command::Add(mut ep) => {
                        report.connections += 1;
                        c.connections_total.add(1);
                        if matches!(phase, Phase::Draining { .. }) {
                            ep.close();
                        }
                        endpoints.push(ep);
                    }
                    Command::Stop { grace } => {
                        if phase == Phase::Running {
                            phase = Phase::Grace {
                                deadline: instant_after(now, grace),
                            };
                        }
                    }
                }
            }

            // Completions, timers, events, service, posting.
            for ep in endpoints.iter_mut() {
                let before = *ep.counters();
                let n = ep.poll_completions(now, &mut wcs);
                work += n;
                ep.handle_timeouts(now);
                while let Some(ev) = ep.poll_event() {
                    work += 1;
                    match ev {
                        Event::CallArrived { call, .. } => {
                            self.serve(now, ep, call, &mut scratch);
                        }
                        Event::ConnectionLost { reason } => {
                            if reason != engine::CloseReason::Local {
                                c.errors_connection.add(1);
                            }
                        }
                        // A server endpoint sends no calls of its own.
                        Event::ReplyArrived { .. } | Event::CallFailed { .. } => {}
                    }
                }
                work += ep.flush();
                let after = *ep.counters();
                c.completions.add(after.completions - before.completions);
                c.bytes_in.add(after.bytes_in - before.bytes_in);
                c.bytes_out.add(after.bytes_out - before.bytes_out);
                c.rdma_reads.add(after.rdma_reads - before.rdma_reads);
                c.rdma_writes.add(after.rdma_writes - before.rdma_writes);
                c.errors_completion
                    .add(after.error_completions - before.error_completions);
                c.errors_post.add(after.post_invalid - before.post_invalid);
            }

            // Retire closed, flushed connections (the leak check).
            let before = endpoints.len();
            endpoints.retain(|ep| {
                if !ep.is_drained() {
                    return true;
                }
                let res = ep.resources();
                if !res.is_idle() {
                    c.leaks.add(1);
                    report.leaks.push(Leak {
                        worker: self.index,
                        qp_num: ep.qp_num(),
                        resources: res,
                        leases_in_use: ep.leases_in_use(),
                    });
                }
                false
            });
            let retired = before - endpoints.len();
            if retired > 0 {
                c.connections.0.fetch_sub(retired as u64, Ordering::Relaxed);
            }

            // Shutdown.
            match phase {
                Phase::Running => {}
                Phase::Grace { deadline } => {
                    let busy = endpoints
                        .iter()
                        .any(|ep| ep.resources().serve_slots_busy > 0);
                    if !busy || now >= deadline {
                        if busy {
                            report.cut_short += endpoints
                                .iter()
                                .filter(|ep| ep.resources().serve_slots_busy > 0)
                                .count() as u64;
                        }
                        for ep in endpoints.iter_mut() {
                            ep.close();
                            ep.flush();
                        }
                        phase = Phase::Draining {
                            deadline: instant_after(now, self.config.drain_timeout),
                        };
                        work += 1;
                    }
                }
                Phase::Draining { deadline } => {
                    if endpoints.is_empty() || now >= deadline {
                        for ep in &endpoints {
                            c.leaks.add(1);
                            report.leaks.push(Leak {
                                worker: self.index,
                                qp_num: ep.qp_num(),
                                resources: ep.resources(),
                                leases_in_use: ep.leases_in_use(),
                            });
                        }
                        c.connections.set(0);
                        self.update_gauges(&endpoints);
                        report.counters = c.snapshot();
                        return report;
                    }
                }
            }

            c.polls.add(1);
            if work == 0 {
                c.idle_polls.add(1);
                if iteration % 64 == 0 {
                    self.update_gauges(&endpoints);
                }
                let next = endpoints
                    .iter()
                    .filter_map(|ep| ep.poll_timeout())
                    .min()
                    .map(|t| t.saturating_duration_since(now));
                idler.idle(next);
            } else {
                idler.reset();
                if iteration % 1024 == 0 {
                    self.update_gauges(&endpoints);
                }
            }
        }
    }

    fn update_gauges(&self, endpoints: &[Box<Endpoint<P>>]) {
        let (mut credits, mut leases) = (0u64, 0u64);
        for ep in endpoints {
            credits += u64::from(ep.resources().serve_slots_busy);
            leases += ep.leases_in_use() as u64;
        }
        self.counters.credits_in_use.set(credits);
        self.counters.pool_in_use.set(leases);
    }

    /// Runs the service for one call and answers it.
    fn serve(
        &self,
        now: engine::Instant,
        ep: &mut Endpoint<P>,
        call: IncomingCall,
        scratch: &mut [u8],
    ) {
        let c = &*self.counters;
        let conn = ep.connection_mut();
        let Some(msg) = conn.call_message(call) else {
            return;
        };
        let xid = msg.get(..4).map(|b| [b[0], b[1], b[2], b[3]]);
        match self.dispatcher.dispatch(msg, scratch) {
            Dispatched::Reply { len, ddp } => {
                let reply = OutgoingReply {
                    message: scratch.get(..len).unwrap_or(&[]),
                    ddp,
                };
                match conn.send_reply(now, call, &reply) {
                    Ok(()) => c.rpcs.add(1),
                    Err(_) => {
                        // Too large for the chunks the requester offered, or
                        // a service bug: answer SYSTEM_ERR (RFC 5531 s9) so
                        // the call does not hang.
                        c.errors_reply.add(1);
                        let Some(xid) = xid else { return };
                        let n = system_err_reply(xid, scratch);
                        let reply = OutgoingReply {
                            message: &scratch[..n],
                            ddp: None,
                        };
                        if conn.send_reply(now, call, &reply).is_err() {
                            ep.close();
                        }
                    }
                }
            }
            Dispatched::Drop => {
                // The engine keeps a call's slot (and the peer its credit)
                // until it is answered; a peer whose calls cannot even be
                // answered loses its connection rather than leaking slots.
                c.errors_dropped_calls.add(1);
                ep.close();
            }
        }
    }
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
        assert!(len < u32::MAX as usize, "{len}");
        eprintln!("default connection memory: {} MiB", len >> 20);
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
