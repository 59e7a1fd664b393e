//! The control plane's side of the workers: spawning and pinning them,
//! handing connections of any transport to the least-loaded one, stopping
//! them ([`WorkerSet`]); and the single-provider view kept for embedders
//! ([`WorkerPool`]).
use std::net::TcpStream;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;

use super::endpoint::{BulkBuffers, Endpoint, EndpointError, PreparedEndpoint, SharedRecvs};
use super::run::Worker;
use super::{
    Command, Dispatcher, GatewaySetup, GatewayState, ShutdownReport, Transport, WorkerConfig,
    WorkerCounters, WorkerError, WorkerReport, WorkerSnapshot,
};
use crate::gateway::Forwarder;
#[cfg(feature = "ibverbs")]
use crate::verbs::ibverbs::Ibverbs;
use crate::verbs::roce::Roce;
use crate::verbs::shm::Shm;
use crate::verbs::{Context as _, Incoming as _, Listener as _, Provider};
use crate::wake::Doorbell;

/// A verbs provider the workers serve: every provider built in (`Shm`,
/// `Roce`; `Ibverbs` with the `ibverbs` feature). Sealed: a worker keeps
/// one connection list per provider, so a provider is added in this
/// module, not outside the crate.
pub trait PoolProvider: Provider + sealed::Served {
    /// The transport its connections count as.
    const TRANSPORT: Transport;
    /// Whether the connections a worker accepts share one completion
    /// queue per worker (software queues, unbounded per queue pair), or
    /// each get their own (a hardware queue has a fixed depth that would
    /// have to cover every connection of the worker).
    const SHARED_CQ: bool;
}

pub(crate) mod sealed {
    use super::*;

    /// A provider's context and the protection domain its connections are
    /// built in.
    pub struct Attached<P: Provider> {
        pub ctx: Arc<P::Context>,
        pub pd: Arc<P::Pd>,
        /// One completion queue per worker, by worker index, when the
        /// provider shares them ([`PoolProvider::SHARED_CQ`]).
        pub cqs: Vec<Arc<P::Cq>>,
        /// One bulk buffer pool per worker, by worker index, unless
        /// `WorkerConfig::bulk_buffers` is 0.
        pub bulk: Vec<Arc<BulkBuffers<P>>>,
        /// One shared receive queue per worker, by worker index, unless
        /// `WorkerConfig::shared_receives` is 0.
        pub srqs: Vec<Arc<SharedRecvs<P>>>,
    }

    impl<P: Provider> Attached<P> {
        /// Workers whose bulk pool is not back to full (after they
        /// stopped, a leak).
        pub fn bulk_short(&self) -> impl Iterator<Item = (&'static str, usize)> + '_ {
            self.bulk
                .iter()
                .enumerate()
                .filter(|(_, b)| !b.is_idle())
                .map(|(i, _)| (P::SCHEME, i))
        }

        /// Workers whose shared receive queue misses buffers.
        pub fn shared_recv_short(&self) -> impl Iterator<Item = (&'static str, usize)> + '_ {
            self.srqs
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.is_full())
                .map(|(i, _)| (P::SCHEME, i))
        }
    }

    impl<P: Provider> core::fmt::Debug for Attached<P> {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.debug_struct("Attached")
                .field("provider", &P::SCHEME)
                .finish()
        }
    }

    /// The providers attached to a [`WorkerSet`](super::WorkerSet).
    #[derive(Default, Debug)]
    pub struct Providers {
        pub shm: Option<Attached<Shm>>,
        pub roce: Option<Attached<Roce>>,
        #[cfg(feature = "ibverbs")]
        pub ibverbs: Option<Attached<Ibverbs>>,
    }

    impl Providers {
        /// (worker, pool) of every bulk pool, every provider.
        pub fn bulk_pools(&self) -> Vec<(usize, Arc<crate::engine::BulkPool>)> {
            fn of<P: Provider>(
                a: &Option<Attached<P>>,
            ) -> impl Iterator<Item = (usize, Arc<crate::engine::BulkPool>)> + '_ {
                a.iter()
                    .flat_map(|a| a.bulk.iter().enumerate())
                    .map(|(i, b)| (i, b.pool().clone()))
            }
            let pools = of(&self.shm).chain(of(&self.roce));
            #[cfg(feature = "ibverbs")]
            let pools = pools.chain(of(&self.ibverbs));
            pools.collect()
        }

        /// (worker, credits) of every shared receive queue, every provider.
        pub fn credit_pools(&self) -> Vec<(usize, Arc<crate::engine::CreditPool>)> {
            fn of<P: Provider>(
                a: &Option<Attached<P>>,
            ) -> impl Iterator<Item = (usize, Arc<crate::engine::CreditPool>)> + '_ {
                a.iter()
                    .flat_map(|a| a.srqs.iter().enumerate())
                    .map(|(i, s)| (i, s.credits().clone()))
            }
            let pools = of(&self.shm).chain(of(&self.roce));
            #[cfg(feature = "ibverbs")]
            let pools = pools.chain(of(&self.ibverbs));
            pools.collect()
        }

        /// Every bulk pool and shared receive queue, for a status report.
        pub fn pool_status(&self) -> Vec<crate::worker::status::PoolStatus> {
            use crate::worker::status::PoolStatus;
            fn of<P: Provider>(a: &Option<Attached<P>>, out: &mut Vec<PoolStatus>) {
                let Some(a) = a else {
                    return;
                };
                for (worker, b) in a.bulk.iter().enumerate() {
                    let p = b.pool();
                    out.push(PoolStatus {
                        pool: "bulk",
                        provider: P::SCHEME,
                        worker,
                        buffers: u64::from(p.count()),
                        used: u64::from(p.count() - p.available()),
                        buffer_bytes: u64::from(p.buf_len()),
                        hugepages: p.is_hugepage_backed(),
                    });
                }
                for (worker, q) in a.srqs.iter().enumerate() {
                    let c = q.credits();
                    out.push(PoolStatus {
                        pool: "shared_receives",
                        provider: P::SCHEME,
                        worker,
                        buffers: u64::from(c.total()),
                        used: u64::from(c.reserved()),
                        buffer_bytes: u64::from(q.buf_size()),
                        hugepages: q.is_hugepage_backed(),
                    });
                }
            }
            let mut out = Vec::new();
            of(&self.shm, &mut out);
            of(&self.roce, &mut out);
            #[cfg(feature = "ibverbs")]
            of(&self.ibverbs, &mut out);
            out
        }

        /// (scheme, worker) of every bulk pool not back to full.
        pub fn bulk_short(&self) -> Vec<(&'static str, usize)> {
            let mut short: Vec<(&'static str, usize)> = Vec::new();
            short.extend(self.shm.iter().flat_map(Attached::bulk_short));
            short.extend(self.roce.iter().flat_map(Attached::bulk_short));
            #[cfg(feature = "ibverbs")]
            short.extend(self.ibverbs.iter().flat_map(Attached::bulk_short));
            short
        }

        /// (scheme, worker) of every shared receive queue missing buffers.
        pub fn shared_recv_short(&self) -> Vec<(&'static str, usize)> {
            let mut short: Vec<(&'static str, usize)> = Vec::new();
            short.extend(self.shm.iter().flat_map(Attached::shared_recv_short));
            short.extend(self.roce.iter().flat_map(Attached::shared_recv_short));
            #[cfg(feature = "ibverbs")]
            short.extend(self.ibverbs.iter().flat_map(Attached::shared_recv_short));
            short
        }
    }

    /// Where a provider's connections go: its ring command and its slot.
    pub trait Served: Provider {
        fn command(ep: Box<Endpoint<Self>>) -> Command;
        /// The endpoint of a command made by [`Served::command`].
        fn take_back(cmd: Command) -> Option<Box<Endpoint<Self>>>;
        fn slot(p: &Providers) -> &Option<Attached<Self>>;
        fn slot_mut(p: &mut Providers) -> &mut Option<Attached<Self>>;
    }

    impl Served for Shm {
        fn command(ep: Box<Endpoint<Shm>>) -> Command {
            Command::AddShm(ep)
        }
        fn take_back(cmd: Command) -> Option<Box<Endpoint<Shm>>> {
            match cmd {
                Command::AddShm(ep) => Some(ep),
                _ => None,
            }
        }
        fn slot(p: &Providers) -> &Option<Attached<Shm>> {
            &p.shm
        }
        fn slot_mut(p: &mut Providers) -> &mut Option<Attached<Shm>> {
            &mut p.shm
        }
    }

    impl Served for Roce {
        fn command(ep: Box<Endpoint<Roce>>) -> Command {
            Command::AddRoce(ep)
        }
        fn take_back(cmd: Command) -> Option<Box<Endpoint<Roce>>> {
            match cmd {
                Command::AddRoce(ep) => Some(ep),
                _ => None,
            }
        }
        fn slot(p: &Providers) -> &Option<Attached<Roce>> {
            &p.roce
        }
        fn slot_mut(p: &mut Providers) -> &mut Option<Attached<Roce>> {
            &mut p.roce
        }
    }

    #[cfg(feature = "ibverbs")]
    impl Served for Ibverbs {
        fn command(ep: Box<Endpoint<Ibverbs>>) -> Command {
            Command::AddIbverbs(ep)
        }
        fn take_back(cmd: Command) -> Option<Box<Endpoint<Ibverbs>>> {
            match cmd {
                Command::AddIbverbs(ep) => Some(ep),
                _ => None,
            }
        }
        fn slot(p: &Providers) -> &Option<Attached<Ibverbs>> {
            &p.ibverbs
        }
        fn slot_mut(p: &mut Providers) -> &mut Option<Attached<Ibverbs>> {
            &mut p.ibverbs
        }
    }
}

impl PoolProvider for Shm {
    const TRANSPORT: Transport = Transport::Shm;
    const SHARED_CQ: bool = true;
}

impl PoolProvider for Roce {
    const TRANSPORT: Transport = Transport::Roce;
    const SHARED_CQ: bool = true;
}

#[cfg(feature = "ibverbs")]
impl PoolProvider for Ibverbs {
    const TRANSPORT: Transport = Transport::Ibverbs;
    const SHARED_CQ: bool = false;
}

/// Depth asked for a worker's shared completion queue (informational for
/// the software providers that share them: each queue pair buffers its
/// own completions).
const SHARED_CQ_DEPTH: usize = 4096;

struct WorkerHandle {
    ring: Arc<ArrayQueue<Command>>,
    counters: Arc<WorkerCounters>,
    latency: Arc<crate::service::latency::LatencyTable>,
    /// The worker's control doorbell (it sleeps on it, `run::Worker`).
    doorbell: Arc<Doorbell>,
    thread: Option<JoinHandle<WorkerReport>>,
}

impl WorkerHandle {
    /// Wakes the worker for a command just pushed on its ring: rings its
    /// doorbell (a worker sleeping on its doorbells) and unparks its
    /// thread (one parked without any).
    fn wake(&self) {
        self.doorbell.ring();
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }
}

/// The name of worker thread `index`: `rpcrdma-wN`. Linux keeps 15 bytes of
/// a thread name (`/proc/PID/task/*/comm`, `top -H`, `perf`), so a longer
/// prefix would cut the index off and every worker would look the same.
pub(crate) fn worker_thread_name(index: usize) -> String {
    format!("{WORKER_THREAD_PREFIX}{index}")
}

/// What every worker thread's name starts with (tools that find the
/// workers among a process's threads match on it).
pub const WORKER_THREAD_PREFIX: &str = "rpcrdma-w";

/// One pinned worker thread per configured core, each serving
/// connections of every attached provider and ONC RPC/TCP connections in
/// one loop (docs/WORKER.md).
///
/// ```text
/// let mut set = WorkerSet::spawn(&cores, config, dispatcher)?;
/// set.attach::<Shm>(shm_ctx)?;              // a PD per provider
/// set.accept::<Shm>(&listener, timeout)?;   // RDMA: accept + hand off
/// set.hand_off_tcp(stream)?;                // TCP: an accepted stream
/// set.stop(grace)                           // -> ShutdownReport
/// ```
pub struct WorkerSet {
    workers: Vec<WorkerHandle>,
    providers: sealed::Providers,
    config: WorkerConfig,
    /// [`WorkerConfig::max_connections`], changeable while serving
    /// ([`WorkerSet::set_max_connections`]).
    max_connections: std::sync::atomic::AtomicUsize,
    /// The gateway's routes and each worker's counters now
    /// ([`WorkerConfig::gateway`] at spawn; [`WorkerSet::swap_gateway`]
    /// changes them).
    gateway: Arc<std::sync::Mutex<Option<GatewayState>>>,
}

/// Relays built for every worker, ready to replace theirs
/// ([`WorkerSet::prepare_gateway`], [`WorkerSet::swap_gateway`]).
#[derive(Debug)]
pub struct PreparedGateway {
    relays: Vec<super::run::RelaySwap>,
    state: Option<GatewayState>,
}

impl core::fmt::Debug for WorkerSet {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("WorkerSet")
            .field("workers", &self.workers.len())
            .field("providers", &self.providers)
            .field("config", &self.config)
            .finish()
    }
}

impl WorkerSet {
    /// Spawns one worker per entry of `cores` (`Some(core)`: pinned there
    /// with core_affinity; `None`: not pinned) serving `dispatcher`, with
    /// no provider attached yet (TCP connections need none).
    ///
    /// # Errors
    /// [`WorkerError::CoreUnavailable`] for a core outside the process's
    /// mask, [`WorkerError::PinFailed`], [`WorkerError::Spawn`],
    /// [`WorkerError::NoWorkers`], [`WorkerError::Tcp`] for a bad
    /// `config.tcp`, [`WorkerError::GatewayConfig`] for bad routes and
    /// [`WorkerError::Gateway`] when a worker cannot map its relay.
    pub fn spawn(
        cores: &[Option<usize>],
        config: WorkerConfig,
        dispatcher: Arc<dyn Dispatcher>,
    ) -> Result<WorkerSet, WorkerError> {
        if cores.is_empty() {
            return Err(WorkerError::NoWorkers);
        }
        config.tcp.validate()?;
        if let Some(g) = config.gateway.as_ref() {
            g.config.validate()?;
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
        let mut set = WorkerSet {
            workers: Vec::with_capacity(cores.len()),
            providers: sealed::Providers::default(),
            config: config.clone(),
            max_connections: std::sync::atomic::AtomicUsize::new(config.max_connections),
            gateway: Arc::new(std::sync::Mutex::new(None)),
        };
        let state = config
            .gateway
            .as_ref()
            .map(|g| GatewayState::new(g, cores.len()));
        let programs = dispatcher.programs();
        for (index, core) in cores.iter().copied().enumerate() {
            let ring = Arc::new(ArrayQueue::new(config.ring_capacity.max(1)));
            let counters = Arc::new(WorkerCounters::default());
            // Each worker times its calls into a table of its own.
            let latency = Arc::new(crate::service::latency::LatencyTable::new(&programs));
            let timed: Arc<dyn Dispatcher> = Arc::new(crate::service::latency::Timed::new(
                dispatcher.clone(),
                latency.clone(),
            ));
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            // This worker's relay counts into counters of its own.
            let relay_counters = state
                .as_ref()
                .map(|g| (g.config.clone(), g.counters[index].clone()));
            // Its doorbell (an eventfd): failing to make one is failing
            // to start the thread.
            let doorbell = Arc::new(Doorbell::new().map_err(|e| WorkerError::Spawn(e.into()))?);
            let worker = Worker {
                index,
                ring: ring.clone(),
                counters: counters.clone(),
                dispatcher: timed,
                config: config.clone(),
                doorbell: doorbell.clone(),
            };
            let thread = std::thread::Builder::new()
                .name(worker_thread_name(index))
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
                    // The relay's buffers are mapped here, so that a
                    // failure stops the start instead of leaving the
                    // routed programs unserved.
                    let forwarder = match relay_counters {
                        None => None,
                        Some((config, counters)) => match Forwarder::new(config, counters) {
                            Ok(f) => Some(f),
                            Err(source) => {
                                let _ = ready_tx.send(Err(WorkerError::Gateway {
                                    worker: index,
                                    source,
                                }));
                                return WorkerReport {
                                    worker: index,
                                    ..WorkerReport::default()
                                };
                            }
                        },
                    };
                    let _ = ready_tx.send(Ok(()));
                    worker.run(forwarder)
                })
                .map_err(WorkerError::Spawn)?;
            let started = ready_rx.recv().unwrap_or(Err(WorkerError::PinFailed {
                worker: index,
                core: core.unwrap_or(0),
            }));
            set.workers.push(WorkerHandle {
                ring,
                counters,
                latency,
                doorbell,
                thread: Some(thread),
            });
            // On error the set (and its started workers) stops on drop.
            started?;
        }
        *set.gateway.lock().unwrap_or_else(|e| e.into_inner()) = state;
        Ok(set)
    }

    /// Attaches provider `P`: its connections will be built in one
    /// protection domain allocated from `ctx`. Attaching again replaces
    /// the context for connections built from then on.
    ///
    /// # Errors
    /// [`WorkerError::Verbs`] when the PD cannot be allocated.
    pub fn attach<P: PoolProvider>(&mut self, ctx: Arc<P::Context>) -> Result<(), WorkerError> {
        let pd = Arc::new(ctx.alloc_pd()?);
        let mut cqs = Vec::new();
        if P::SHARED_CQ {
            for _ in &self.workers {
                cqs.push(Arc::new(ctx.create_cq(SHARED_CQ_DEPTH)?));
            }
        }
        let mut bulk = Vec::new();
        let count = self.config.bulk_buffers;
        if count > 0 {
            let e = &self.config.endpoint;
            let buf_len = e.engine.max_call_size.max(e.engine.max_reply_size);
            // Every posted work request naming a pool buffer holds a lease
            // (a reply's Writes and Send, a call's Reads): plenty per buffer.
            let leases = count.saturating_mul(64).min(1 << 20);
            for worker in 0..self.workers.len() {
                let pool = BulkBuffers::new(&*pd, count, buf_len, e.backing, leases).map_err(
                    |source| WorkerError::BulkPool {
                        scheme: P::SCHEME,
                        worker,
                        bytes: crate::engine::BulkPool::memory_len(count, buf_len),
                        source,
                    },
                )?;
                bulk.push(Arc::new(pool));
            }
        }
        let mut srqs = Vec::new();
        let count = self.config.shared_receives;
        if count > 0 {
            let e = &self.config.endpoint;
            for worker in 0..self.workers.len() {
                let srq = SharedRecvs::new(&*pd, count, e.engine.inline_recv_size, e.backing)
                    .map_err(|source| WorkerError::SharedReceives {
                        scheme: P::SCHEME,
                        worker,
                        count,
                        source,
                    })?;
                srqs.push(Arc::new(srq));
            }
        }
        *P::slot_mut(&mut self.providers) = Some(sealed::Attached {
            ctx,
            pd,
            cqs,
            bulk,
            srqs,
        });
        Ok(())
    }

    /// Every worker's bulk pools (one per attached provider), with the
    /// index of the worker that owns each: for gauges.
    pub fn bulk_pools(&self) -> Vec<(usize, Arc<crate::engine::BulkPool>)> {
        self.providers.bulk_pools()
    }

    /// Every worker's bulk pools and shared receive queues: size, use,
    /// hugepages (for a status report).
    pub fn pool_status(&self) -> Vec<super::status::PoolStatus> {
        self.providers.pool_status()
    }

    /// Every worker's shared receive queues as credits (one per attached
    /// provider), with the index of the worker that owns each: for gauges.
    pub fn credit_pools(&self) -> Vec<(usize, Arc<crate::engine::CreditPool>)> {
        self.providers.credit_pools()
    }

    /// Every worker's shared receive queue of provider `P`, by worker
    /// index (empty without them).
    pub fn shared_recvs<P: PoolProvider>(&self) -> Vec<Arc<SharedRecvs<P>>> {
        P::slot(&self.providers)
            .as_ref()
            .map_or_else(Vec::new, |a| a.srqs.clone())
    }

    /// The context of provider `P`, if attached.
    pub fn context<P: PoolProvider>(&self) -> Option<&Arc<P::Context>> {
        P::slot(&self.providers).as_ref().map(|a| &a.ctx)
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Never true for a spawned set.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// The configuration.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Builds a connection's prepared side (memory registered, receives
    /// posted) of provider `P` with its PD and the set's configuration.
    ///
    /// # Errors
    /// [`WorkerError::NotAttached`], or as [`PreparedEndpoint::new`].
    pub fn prepare<P: PoolProvider>(&self) -> Result<PreparedEndpoint<P>, WorkerError> {
        let a = P::slot(&self.providers)
            .as_ref()
            .ok_or(WorkerError::NotAttached { scheme: P::SCHEME })?;
        Ok(PreparedEndpoint::new(
            &*a.ctx,
            &*a.pd,
            &self.config.endpoint,
        )?)
    }

    /// [`prepare`](Self::prepare) for worker `worker`: on its shared
    /// completion queue when the provider shares them (the endpoint must
    /// then go to that worker, [`hand_off_to`](Self::hand_off_to)).
    ///
    /// # Errors
    /// As [`prepare`](Self::prepare).
    pub fn prepare_for<P: PoolProvider>(
        &self,
        worker: usize,
    ) -> Result<PreparedEndpoint<P>, WorkerError> {
        let a = P::slot(&self.providers)
            .as_ref()
            .ok_or(WorkerError::NotAttached { scheme: P::SCHEME })?;
        Ok(PreparedEndpoint::with_cq(
            &*a.ctx,
            &*a.pd,
            &self.config.endpoint,
            a.cqs.get(worker).cloned(),
            a.bulk.get(worker).map(|b| &**b),
            a.srqs.get(worker),
        )?)
    }

    /// Index of the worker with the fewest connections (every transport
    /// counted).
    pub fn least_loaded(&self) -> usize {
        self.workers
            .iter()
            .enumerate()
            .min_by_key(|(_, w)| w.counters.connections.get())
            .map_or(0, |(i, _)| i)
    }

    /// Pushes an `Add*` command on the least-loaded worker's ring (the
    /// next one when that ring is full); gives it back when every ring is.
    fn push(&self, mut cmd: Command, transport: Transport) -> Result<usize, Command> {
        let first = self.least_loaded();
        let n = self.workers.len();
        for k in 0..n {
            let i = (first + k) % n;
            let w = &self.workers[i];
            // Count it before the worker sees it, so that concurrent
            // hand-offs spread.
            w.counters.connections.add(1);
            w.counters.connections_by_transport[transport.index()].add(1);
            match w.ring.push(cmd) {
                Ok(()) => {
                    w.wake();
                    return Ok(i);
                }
                Err(back) => {
                    w.counters.connections.sub(1);
                    w.counters.connections_by_transport[transport.index()].sub(1);
                    cmd = back;
                }
            }
        }
        Err(cmd)
    }

    /// Connections the set serves now, every transport (counted at
    /// hand-off, uncounted when a worker drops them).
    pub fn connections(&self) -> usize {
        self.workers
            .iter()
            .map(|w| w.counters.connections.get() as usize)
            .sum()
    }

    /// The gateway's routes and counters in force, shared with whoever
    /// reads them (the metrics); a reload replaces what it holds.
    pub fn gateway(&self) -> Arc<std::sync::Mutex<Option<GatewayState>>> {
        Arc::clone(&self.gateway)
    }

    /// Builds a relay for `setup` for every worker (its buffers mapped,
    /// no connection made yet), without changing anything.
    ///
    /// # Errors
    /// [`WorkerError::GatewayConfig`] for bad routes,
    /// [`WorkerError::Gateway`] when a relay's buffers cannot be mapped.
    pub fn prepare_gateway(
        &self,
        setup: Option<GatewaySetup>,
    ) -> Result<PreparedGateway, WorkerError> {
        if let Some(g) = setup.as_ref() {
            g.config.validate()?;
        }
        let state = setup
            .as_ref()
            .map(|g| GatewayState::new(g, self.workers.len()));
        let mut relays = Vec::with_capacity(self.workers.len());
        for worker in 0..self.workers.len() {
            let relay = match state.as_ref() {
                None => None,
                Some(g) => Some(
                    Forwarder::new(g.config.clone(), g.counters[worker].clone())
                        .map_err(|source| WorkerError::Gateway { worker, source })?,
                ),
            };
            relays.push(super::run::RelaySwap(relay));
        }
        Ok(PreparedGateway { relays, state })
    }

    /// Hands every worker its new relay: calls of routed programs go to
    /// the new routes from the worker's next iteration, and the calls the
    /// old relay has at its backends are still answered through it.
    pub fn swap_gateway(&self, prepared: PreparedGateway) {
        for (w, relay) in self.workers.iter().zip(prepared.relays) {
            let mut cmd = Command::Gateway(Box::new(relay));
            // A full ring drains quickly: the worker is running.
            while let Err(back) = w.ring.push(cmd) {
                cmd = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            w.wake();
        }
        *self.gateway.lock().unwrap_or_else(|e| e.into_inner()) = prepared.state;
    }

    /// The connection limit in force.
    pub fn max_connections(&self) -> usize {
        self.max_connections
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Changes the connection limit while serving: connections above a
    /// lowered limit stay; new ones are refused until the count is below
    /// it.
    pub fn set_max_connections(&self, limit: usize) {
        self.max_connections
            .store(limit, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether one more connection may be taken
    /// ([`WorkerConfig::max_connections`]). Acceptors ask before setting a
    /// connection up; concurrent acceptors of several listeners may
    /// overshoot by one each.
    ///
    /// # Errors
    /// [`WorkerError::ConnectionLimit`].
    pub fn admit(&self) -> Result<(), WorkerError> {
        self.admit_more(0)
    }

    /// [`admit`](Self::admit) for an acceptor that holds `held`
    /// connections of its own not handed to a worker yet (waiting for a
    /// full control ring to drain): they count against the limit too.
    ///
    /// # Errors
    /// [`WorkerError::ConnectionLimit`].
    pub fn admit_more(&self, held: usize) -> Result<(), WorkerError> {
        let limit = self.max_connections();
        if self.connections().saturating_add(held) >= limit {
            return Err(WorkerError::ConnectionLimit { limit });
        }
        Ok(())
    }

    /// Counts a TCP connection from `peer` in before it is handed to a
    /// worker ([`hand_off_tcp`](Self::hand_off_tcp)), which counts it out
    /// when it closes it; the caller that drops the stream instead counts
    /// it out itself ([`tcp_peer_gone`](Self::tcp_peer_gone)).
    ///
    /// # Errors
    /// [`WorkerError::PeerLimit`] when `peer` already has
    /// `workers.max_connections_per_peer` connections.
    pub fn admit_tcp_peer(&self, peer: std::net::IpAddr) -> Result<(), WorkerError> {
        match &self.config.tcp_peers {
            Some(p) if !p.try_add(peer) => Err(WorkerError::PeerLimit {
                limit: p.limit() as usize,
            }),
            _ => Ok(()),
        }
    }

    /// Counts out a TCP connection that was counted in but never handed
    /// to a worker.
    pub fn tcp_peer_gone(&self, peer: std::net::IpAddr) {
        if let Some(p) = &self.config.tcp_peers {
            p.remove(peer);
        }
    }

    /// Hands `ep` to worker `worker` (the one whose completion queue it
    /// is on, [`prepare_for`](Self::prepare_for)).
    ///
    /// # Errors
    /// The endpoint, when that worker's ring is full or there is no such
    /// worker.
    pub fn hand_off_to<P: PoolProvider>(
        &self,
        worker: usize,
        ep: Endpoint<P>,
    ) -> Result<usize, Box<Endpoint<P>>> {
        let Some(w) = self.workers.get(worker) else {
            return Err(Box::new(ep));
        };
        let t = P::TRANSPORT.index();
        w.counters.connections.add(1);
        w.counters.connections_by_transport[t].add(1);
        match w.ring.push(P::command(Box::new(ep))) {
            Ok(()) => {
                w.wake();
                Ok(worker)
            }
            Err(back) => {
                w.counters.connections.sub(1);
                w.counters.connections_by_transport[t].sub(1);
                match P::take_back(back) {
                    Some(ep) => Err(ep),
                    None => unreachable!("ring returned another command"),
                }
            }
        }
    }

    /// Hands `ep` to the least-loaded worker over its control ring; returns
    /// the worker index. An endpoint built on a worker's shared completion
    /// queue ([`prepare_for`](Self::prepare_for)) goes to that worker.
    ///
    /// # Errors
    /// The endpoint, when every ring is full (or its worker's is).
    pub fn hand_off<P: PoolProvider>(&self, ep: Endpoint<P>) -> Result<usize, Box<Endpoint<P>>> {
        let owner = ep.shared_cq().and_then(|cq| {
            P::slot(&self.providers)
                .as_ref()?
                .cqs
                .iter()
                .position(|c| Arc::ptr_eq(c, cq))
        });
        if let Some(worker) = owner {
            return self.hand_off_to(worker, ep);
        }
        self.push(P::command(Box::new(ep)), P::TRANSPORT)
            .map_err(|back| match P::take_back(back) {
                Some(ep) => ep,
                // A full ring hands back exactly what was pushed.
                None => unreachable!("ring returned another command"),
            })
    }

    /// Hands an accepted ONC RPC/TCP stream to the least-loaded worker;
    /// returns the worker index. The worker makes it non-blocking and
    /// serves it with its other connections (`dataplane::tcp`).
    ///
    /// # Errors
    /// The stream, when every ring is full.
    pub fn hand_off_tcp(&self, stream: TcpStream) -> Result<usize, TcpStream> {
        self.push(Command::AddTcp(stream), Transport::Tcp)
            .map_err(|back| match back {
                Command::AddTcp(s) => s,
                _ => unreachable!("ring returned another command"),
            })
    }

    /// Waits up to `timeout` for one connection request on `listener` of
    /// provider `P`, accepts it with our RFC 8797 private data (receives
    /// pre-posted before the accept) and hands it to the least-loaded
    /// worker. Returns the worker index.
    ///
    /// # Errors
    /// [`WorkerError::Verbs`] (including
    /// [`VerbsError::Timeout`](crate::verbs::VerbsError::Timeout)),
    /// [`WorkerError::NotAttached`], [`WorkerError::Endpoint`],
    /// [`WorkerError::Busy`], [`WorkerError::ConnectionLimit`] (the request
    /// was rejected).
    pub fn accept<P: PoolProvider>(
        &self,
        listener: &P::Listener,
        timeout: Duration,
    ) -> Result<usize, WorkerError> {
        let incoming = listener.accept(timeout)?;
        if let Err(e) = self.admit() {
            // Refused before any memory is registered for it.
            incoming.reject(&[])?;
            return Err(e);
        }
        // The worker first: the connection is built on its completion
        // queue.
        let worker = self.worker_for(incoming.peer_identity());
        let prepared = self.prepare_for::<P>(worker)?;
        let ep = prepared.accept(incoming)?;
        self.hand_off_to(worker, ep).map_err(|_| WorkerError::Busy)
    }

    /// The worker a connection from `peer` goes to: the least-loaded one,
    /// except behind a gateway, where every connection of one client goes
    /// to one worker (chosen by its identity), so that the worker's
    /// duplicate request cache sees the client's retransmissions after a
    /// reconnect (docs/GATEWAY.md, "Reply cache").
    fn worker_for(&self, peer: u64) -> usize {
        let n = self.workers.len() as u64;
        let routed = self
            .gateway
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if !routed || peer == 0 || n <= 1 {
            return self.least_loaded();
        }
        // Fibonacci hashing: consecutive addresses spread over workers.
        ((peer.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) % n) as usize
    }

    /// The counters of every worker.
    pub fn snapshot(&self) -> Vec<WorkerSnapshot> {
        self.workers.iter().map(|w| w.counters.snapshot()).collect()
    }

    /// The shared counters of every worker (for a metrics exporter).
    pub fn counters(&self) -> Vec<Arc<WorkerCounters>> {
        self.workers.iter().map(|w| w.counters.clone()).collect()
    }

    /// Every worker's latency table (each written by its worker only;
    /// a reader merges them).
    pub fn latency(&self) -> Vec<Arc<crate::service::latency::LatencyTable>> {
        self.workers.iter().map(|w| w.latency.clone()).collect()
    }

    /// Asks every worker for its connections and waits for the answers,
    /// at most `timeout` in all; a worker that did not answer in time (its
    /// ring stayed full, or it is gone) is left out.
    pub fn status(&self, timeout: Duration) -> Vec<super::WorkerStatus> {
        let deadline = std::time::Instant::now() + timeout;
        let (tx, rx) = std::sync::mpsc::sync_channel(self.workers.len());
        let mut asked = 0;
        for w in &self.workers {
            let mut cmd = Command::Status(tx.clone());
            loop {
                match w.ring.push(cmd) {
                    Ok(()) => {
                        asked += 1;
                        break;
                    }
                    Err(back) if std::time::Instant::now() < deadline => {
                        cmd = back;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(_) => break,
                }
            }
            w.wake();
        }
        drop(tx);
        let mut out: Vec<super::WorkerStatus> = Vec::with_capacity(asked);
        while out.len() < asked {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(s) => out.push(s),
                Err(_) => break,
            }
        }
        out.sort_by_key(|s| s.worker);
        out
    }

    /// Stops every worker: calls in progress get `grace` to finish (TCP
    /// connections stop reading new calls, write their replies and shut
    /// their side), then every connection is closed and flushed; the
    /// report names any pool that did not come back full.
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
            w.wake();
        }
        for (i, w) in self.workers.iter_mut().enumerate() {
            if let Some(t) = w.thread.take() {
                match t.join() {
                    Ok(r) => report.workers.push(r),
                    Err(_) => report.panicked.push(i),
                }
            }
        }
        // The workers dropped their connections: every bulk buffer and
        // every lease over the pools is back, or it leaked.
        report.bulk_short = self.providers.bulk_short();
        report.shared_recv_short = self.providers.shared_recv_short();
        report
    }
}

impl Drop for WorkerSet {
    fn drop(&mut self) {
        if self.workers.iter().any(|w| w.thread.is_some()) {
            let _ = self.stop_inner(Duration::ZERO);
        }
    }
}

/// The workers serving one provider: a [`WorkerSet`] with only `P`
/// attached (the API embedders and the tests use). Its workers are the
/// same multi-transport loop, so [`WorkerPool::set`] may also take TCP
/// streams.
pub struct WorkerPool<P: PoolProvider> {
    set: WorkerSet,
    _provider: core::marker::PhantomData<fn() -> P>,
}

impl<P: PoolProvider> core::fmt::Debug for WorkerPool<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("provider", &P::SCHEME)
            .field("workers", &self.set.len())
            .field("config", &self.set.config)
            .finish()
    }
}

impl<P: PoolProvider> WorkerPool<P> {
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
        let mut set = WorkerSet::spawn(cores, config, dispatcher)?;
        set.attach::<P>(ctx)?;
        Ok(WorkerPool {
            set,
            _provider: core::marker::PhantomData,
        })
    }

    /// The multi-transport set underneath (e.g. to hand it TCP streams).
    pub fn set(&self) -> &WorkerSet {
        &self.set
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Never true for a spawned pool.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// The provider context the pool's connections use.
    pub fn context(&self) -> &Arc<P::Context> {
        match self.set.context::<P>() {
            Some(ctx) => ctx,
            None => unreachable!("a WorkerPool attaches its provider at spawn"),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &WorkerConfig {
        self.set.config()
    }

    /// Builds a connection's prepared side (memory registered, receives
    /// posted) with the pool's PD and configuration.
    ///
    /// # Errors
    /// As [`PreparedEndpoint::new`].
    pub fn prepare(&self) -> Result<PreparedEndpoint<P>, EndpointError> {
        match P::slot(&self.set.providers) {
            Some(a) => PreparedEndpoint::new(&*a.ctx, &*a.pd, &self.set.config.endpoint),
            None => unreachable!("a WorkerPool attaches its provider at spawn"),
        }
    }

    /// Index of the worker with the fewest connections.
    pub fn least_loaded(&self) -> usize {
        self.set.least_loaded()
    }

    /// Hands `ep` to the least-loaded worker over its control ring; returns
    /// the worker index. On failure the endpoint is handed back.
    ///
    /// # Errors
    /// The endpoint, when every ring is full.
    pub fn hand_off(&self, ep: Endpoint<P>) -> Result<usize, Box<Endpoint<P>>> {
        self.set.hand_off(ep)
    }

    /// Waits up to `timeout` for one connection request on `listener`,
    /// accepts it with our RFC 8797 private data (receives pre-posted
    /// before the accept) and hands it to the least-loaded worker. Returns
    /// the worker index.
    ///
    /// # Errors
    /// [`WorkerError::Verbs`] (including
    /// [`VerbsError::Timeout`](crate::verbs::VerbsError::Timeout)),
    /// [`WorkerError::Endpoint`], [`WorkerError::Busy`],
    /// [`WorkerError::ConnectionLimit`] (the request was rejected).
    pub fn accept(&self, listener: &P::Listener, timeout: Duration) -> Result<usize, WorkerError> {
        self.set.accept::<P>(listener, timeout)
    }

    /// The counters of every worker.
    pub fn snapshot(&self) -> Vec<WorkerSnapshot> {
        self.set.snapshot()
    }

    /// Connections the pool serves now (see [`WorkerSet::connections`]).
    pub fn connections(&self) -> usize {
        self.set.connections()
    }

    /// The shared counters of every worker (for a metrics exporter).
    pub fn counters(&self) -> Vec<Arc<WorkerCounters>> {
        self.set.counters()
    }

    /// Stops every worker: calls in progress get `grace` to finish, then
    /// every connection is closed and flushed; the report names any pool
    /// that did not come back full.
    pub fn stop(self, grace: Duration) -> ShutdownReport {
        self.set.stop(grace)
    }
}

#[cfg(test)]
mod thread_name_tests {
    use super::worker_thread_name;

    #[test]
    fn worker_thread_names_keep_their_index_within_the_kernel_limit() {
        for index in [0, 7, 63, 999_999] {
            let name = worker_thread_name(index);
            assert!(name.len() <= 15, "{name} is cut in comm");
            assert!(name.ends_with(&index.to_string()));
        }
    }
}
