//! One worker thread's loop: every connection it owns, of every transport,
//! polled run-to-completion (docs/WORKER.md, "The loop").
//!
//! Each provider's connections live in a `ProviderConns<P>` of their own
//! type (most on the worker's shared completion queue of that provider)
//! and go through the same generic functions, so the hot path is
//! statically dispatched; the TCP connections are one [`TcpConnections`]
//! polled after them.
use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

use super::endpoint::{Endpoint, POLL_BURST};
use super::pool::PoolProvider;
use super::{
    engine, system_err_reply, Command, Completion, Dispatched, Dispatcher, Event, Idler,
    IncomingCall, Leak, OutgoingReply, Sleep, Transport, WorkerConfig, WorkerCounters,
    WorkerReport,
};
use crate::gateway::{Answer, Forwarded, Forwarder, Token};
use crate::service::KnownCall;
use crate::tcp::{Relayed, TcpCallId, TcpConnections, TcpRelay, TcpStats};
#[cfg(feature = "ibverbs")]
use crate::verbs::ibverbs::Ibverbs;
use crate::verbs::roce::Roce;
use crate::verbs::shm::Shm;
use crate::verbs::CompletionQueue as _;
use crate::wire::rpc::peek_xid;

/// One worker thread's state.
pub(super) struct Worker {
    pub(super) index: usize,
    pub(super) ring: Arc<ArrayQueue<Command>>,
    pub(super) counters: Arc<WorkerCounters>,
    pub(super) dispatcher: Arc<dyn Dispatcher>,
    pub(super) config: WorkerConfig,
    /// Rung by the control plane when it hands over work or stops the
    /// worker (a sleeping worker wakes at once).
    pub(super) doorbell: Arc<crate::wake::Doorbell>,
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

fn instant_after(now: engine::Instant, d: std::time::Duration) -> engine::Instant {
    now.saturating_add(d)
}

/// The largest call copied out so that its reply is encoded in place:
/// the copy costs the call's bytes and saves the reply's, so it pays for
/// the small calls of reads (and any call up to an inline threshold),
/// while a large WRITE, whose reply is small, keeps its call where it is.
const IN_PLACE_CALL_MAX: usize = 4096;

/// Buffers of the loop, allocated once, and the worker's relay.
struct Scratch {
    wcs: Vec<Completion>,
    /// Where the service writes an RDMA reply (TCP replies are written in
    /// the connection's output buffer).
    reply: Box<[u8]>,
    /// Where a call of at most [`IN_PLACE_CALL_MAX`] bytes is copied, so
    /// that its reply can be encoded in the buffer the call is in.
    call: Box<[u8]>,
    /// The relay to the gateway's backends, when programs are routed.
    forwarder: Option<Forwarder<Origin>>,
    /// Relays a reload replaced, kept until their calls in flight are
    /// answered (they take no new call).
    retiring: Vec<Forwarder<Origin>>,
}

/// A worker's new relay (the gateway's routes changed): `None` when no
/// program is routed any more. Built by the control plane
/// ([`WorkerSet::prepare_gateway`](super::WorkerSet::prepare_gateway)),
/// so that a failure changes nothing.
pub struct RelaySwap(pub(super) Option<Forwarder<Origin>>);

impl core::fmt::Debug for RelaySwap {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("RelaySwap").field(&self.0.is_some()).finish()
    }
}

/// Where a forwarded call came from: enough to find its connection (and
/// on RDMA its responder slot) again when the backend answers.
#[derive(Debug, Clone, Copy)]
pub(super) enum Origin {
    /// A responder slot of an RDMA connection, which keeps the call's
    /// bytes until it is answered.
    Rdma {
        transport: Transport,
        qp: u32,
        call: IncomingCall,
        xid: u32,
    },
    /// A call taken from a TCP connection (its bytes are not kept).
    Tcp { call: TcpCallId, xid: u32 },
}

/// The relay as the worker's TCP connections see it: MOUNT, NLM, NSM
/// (and NFS over TCP) of routed programs go to their backends too.
struct TcpGateway<'a> {
    fw: &'a mut Forwarder<Origin>,
    now: engine::Instant,
}

impl TcpRelay for TcpGateway<'_> {
    fn relay(
        &mut self,
        from: TcpCallId,
        peer: std::net::SocketAddr,
        record: &[u8],
        reply: &mut [u8],
    ) -> Relayed {
        if !self.fw.routes(record) {
            return Relayed::NotMine;
        }
        let Some(xid) = peek_xid(record) else {
            return Relayed::NotMine;
        };
        let origin = Origin::Tcp { call: from, xid };
        match self
            .fw
            .forward_copy(self.now, origin, ip_identity(peer.ip()), record)
        {
            Ok(Forwarded::Sent | Forwarded::Joined) => Relayed::Taken,
            Ok(Forwarded::Cached(cached)) if cached.len() <= reply.len() => {
                reply[..cached.len()].copy_from_slice(cached);
                Relayed::Answered(cached.len())
            }
            Ok(_) | Err(_) => Relayed::Answered(system_err_reply(xid.to_be_bytes(), reply)),
        }
    }
}

/// A client's identity from its IP address, as the roce provider gives
/// it (`Incoming::peer_identity`), so that a client's calls over TCP and
/// over RDMA share their reply-cache entries.
fn ip_identity(ip: std::net::IpAddr) -> u64 {
    match ip {
        std::net::IpAddr::V4(v4) => (2 << 32) | u64::from(u32::from(v4)),
        std::net::IpAddr::V6(v6) => {
            let b = v6.octets();
            (3 << 62)
                | (u64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]) >> 2)
        }
    }
}

/// Whether a connection that ended for `reason` ended cleanly: we closed
/// it (shutdown, a dropped call), it idled out, or its peer disconnected
/// in order.
fn is_clean(reason: engine::CloseReason) -> bool {
    matches!(
        reason,
        engine::CloseReason::Local
            | engine::CloseReason::Idle
            | engine::CloseReason::PeerDisconnected
    )
}

/// Descriptors a sleep waits on that [`Worker::run`] makes room for at
/// the start: the control doorbell, one per provider's completion queue
/// and the TCP epoll set, with room to spare (more only come with TCP
/// connections read without epoll, and grow the list once each).
const SLEEP_FDS: usize = 16;

/// Backend sockets a sleep may wait on for the worker's relays
/// ([`Forwarder::watch`]).
fn relay_fds(scratch: &Scratch) -> usize {
    scratch
        .forwarder
        .iter()
        .chain(&scratch.retiring)
        .map(Forwarder::connections)
        .sum()
}

/// How often the timers of connections on a shared completion queue are
/// looked at. Engine deadlines are milliseconds to seconds (call and idle
/// timeouts), so a millisecond late is nothing, and an iteration costs the
/// same however many connections are idle.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_millis(1);

/// How often the credit and lease gauges are recomputed (a pass over
/// every connection).
const GAUGES_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// One provider's connections on a worker.
///
/// Connections the worker accepted share its completion queue of the
/// provider (`shared`): one poll per iteration returns the completions of
/// all of them, each routed by queue-pair number to its endpoint, and only
/// endpoints that got a completion (or whose timer is due, or whose work
/// waits for room in a queue) are processed. Endpoints handed over with a
/// completion queue of their own (`own`) are polled one by one.
/// Endpoints stay in the box they came over the ring in: no copy of a
/// large struct at hand-off or when a list is compacted.
#[allow(clippy::vec_box)]
struct ProviderConns<P: PoolProvider> {
    own: Vec<Box<Endpoint<P>>>,
    shared: Vec<Box<Endpoint<P>>>,
    /// Index in `shared` by queue-pair number.
    by_qp: HashMap<u32, usize>,
    /// The worker's completion queues of `P`, taken from the endpoints on
    /// them: one, unless the provider was attached again (a new context
    /// brings new queues).
    cqs: Vec<Arc<P::Cq>>,
    /// Indices of `shared` to process; `queued[i]` says whether `i` is in
    /// `dirty`.
    dirty: Vec<usize>,
    queued: Vec<bool>,
    /// The other list of indices (an iteration processes one while marks
    /// go into the other).
    spare: Vec<usize>,
    /// When the timers of `shared` are next looked at.
    next_sweep: engine::Instant,
    /// Completions of queue pairs not (yet) here, with when they came: a
    /// connection's first message can complete between its accept and
    /// its arrival over the control ring. Delivered when it arrives;
    /// dropped after [`STRAY_TTL`] (a prepared connection that failed
    /// before its hand-off flushes its receives here).
    strays: VecDeque<(engine::Instant, Completion)>,
}

/// How long a completion waits for its connection to reach the worker.
const STRAY_TTL: std::time::Duration = std::time::Duration::from_secs(1);

impl<P: PoolProvider> ProviderConns<P> {
    fn new(hint: usize) -> Self {
        ProviderConns {
            own: Vec::new(),
            shared: Vec::with_capacity(hint),
            by_qp: HashMap::with_capacity(hint),
            cqs: Vec::with_capacity(1),
            dirty: Vec::with_capacity(hint),
            queued: Vec::with_capacity(hint),
            spare: Vec::with_capacity(hint),
            next_sweep: engine::Instant(0),
            strays: VecDeque::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.own.is_empty() && self.shared.is_empty()
    }

    fn push(&mut self, mut ep: Box<Endpoint<P>>, now: engine::Instant) {
        let Some(cq) = ep.shared_cq() else {
            self.own.push(ep);
            return;
        };
        if !self.cqs.iter().any(|known| Arc::ptr_eq(known, cq)) {
            self.cqs.push(cq.clone());
        }
        let qp = ep.qp_num();
        for _ in 0..self.strays.len() {
            let Some((at, mut wc)) = self.strays.pop_front() else {
                break;
            };
            if wc.qp_num == qp {
                ep.handle_completion(now, &mut wc);
            } else {
                self.strays.push_back((at, wc));
            }
        }
        let i = self.shared.len();
        self.by_qp.insert(ep.qp_num(), i);
        self.shared.push(ep);
        self.queued.push(false);
        // Every endpoint may be dirty at once: room for that is made here,
        // at hand-off, not when the iteration marks them.
        let n = self.shared.len();
        self.dirty.reserve(n.saturating_sub(self.dirty.len()));
        self.spare.reserve(n.saturating_sub(self.spare.len()));
        // Its first processing posts what the engine has queued.
        self.mark(i);
    }

    fn mark(&mut self, i: usize) {
        if !self.queued[i] {
            self.queued[i] = true;
            self.dirty.push(i);
        }
    }

    /// Removes `shared[i]` (the last one takes its place and its index).
    fn remove_shared(&mut self, i: usize) -> Box<Endpoint<P>> {
        let last = self.shared.len() - 1;
        let ep = self.shared.swap_remove(i);
        self.queued.swap_remove(i);
        self.by_qp.remove(&ep.qp_num());
        if i != last {
            self.by_qp.insert(self.shared[i].qp_num(), i);
            for d in self.dirty.iter_mut().filter(|d| **d == last) {
                *d = i;
            }
        }
        ep
    }

    /// The endpoint of queue pair `qp`, with its index in `shared` when
    /// it is there.
    fn find_mut(&mut self, qp: u32) -> Option<(&mut Endpoint<P>, Option<usize>)> {
        if let Some(&i) = self.by_qp.get(&qp) {
            return Some((&mut self.shared[i], Some(i)));
        }
        self.own
            .iter_mut()
            .find(|ep| ep.qp_num() == qp)
            .map(|ep| (&mut **ep, None))
    }

    fn all(&self) -> impl Iterator<Item = &Endpoint<P>> {
        self.own.iter().chain(self.shared.iter()).map(|ep| &**ep)
    }

    fn all_mut(&mut self) -> impl Iterator<Item = &mut Endpoint<P>> {
        self.own
            .iter_mut()
            .chain(self.shared.iter_mut())
            .map(|ep| &mut **ep)
    }

    fn busy(&self) -> usize {
        self.all()
            .filter(|ep| ep.resources().serve_slots_busy > 0)
            .count()
    }

    fn close_all(&mut self) {
        for ep in self.all_mut() {
            ep.close();
            ep.flush();
        }
        for i in 0..self.shared.len() {
            self.mark(i);
        }
    }

    /// The worker is about to park: its completion queues are told
    /// (`CompletionQueue::before_sleep`).
    fn before_sleep(&self) {
        for ep in &self.own {
            ep.before_sleep();
        }
        for cq in &self.cqs {
            cq.before_sleep();
        }
    }

    /// Arms every completion queue's doorbell for a sleep and adds the
    /// doorbells to `fds` (`CompletionQueue::arm_wakeup`); false when one
    /// has news already. Each arm is undone by `disarm_wakeup`.
    fn arm_wakeup(&self, fds: &mut Vec<libc::pollfd>) -> bool {
        let mut quiet = true;
        for ep in &self.own {
            if let Some(fd) = ep.wakeup_fd() {
                fds.push(crate::wake::pollfd(fd));
            }
            quiet &= ep.arm_wakeup();
            ep.watch_also(&mut |fd| fds.push(crate::wake::pollfd(fd)));
        }
        for cq in &self.cqs {
            if let Some(fd) = cq.wakeup_fd() {
                fds.push(crate::wake::pollfd(fd.as_raw_fd()));
            }
            quiet &= cq.arm_wakeup();
            cq.watch_also(&mut |fd| fds.push(crate::wake::pollfd(fd)));
        }
        quiet
    }

    fn disarm_wakeup(&self) {
        for ep in &self.own {
            ep.disarm_wakeup();
        }
        for cq in &self.cqs {
            cq.disarm_wakeup();
        }
    }

    /// The next time a connection of this provider needs the loop, from
    /// every endpoint's own deadline (not the periodic sweep of the
    /// shared ones, which an awake loop uses to stay O(1) per iteration):
    /// what a sleep that doorbells end may last. O(connections), once per
    /// sleep.
    fn sleep_deadline(&self) -> Option<engine::Instant> {
        let strays = self
            .strays
            .front()
            .map(|(at, _)| instant_after(*at, STRAY_TTL));
        self.all()
            .filter_map(|ep| ep.poll_timeout())
            .chain(strays)
            .min()
    }

    /// Whether every completion queue of this provider rings a doorbell
    /// (`CompletionQueue::wakeup_fd`): if one does not, a sleep must stay
    /// short, as its news wakes nobody.
    fn all_ring(&self) -> bool {
        self.own.iter().all(|ep| ep.wakeup_fd().is_some())
            && self.cqs.iter().all(|cq| cq.wakeup_fd().is_some())
    }

    /// The next time this provider's connections need the loop: the own
    /// endpoints' engine deadlines, the next sweep of the shared ones.
    fn next_deadline(&self) -> Option<engine::Instant> {
        let own = self.own.iter().filter_map(|ep| ep.poll_timeout()).min();
        let shared = (!self.shared.is_empty()).then_some(self.next_sweep);
        match (own, shared) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// (credits in use, region leases in use).
    fn gauges(&self) -> (u64, u64) {
        let (mut credits, mut leases) = (0u64, 0u64);
        for ep in self.all() {
            credits += u64::from(ep.resources().serve_slots_busy);
            leases += ep.leases_in_use() as u64;
        }
        (credits, leases)
    }
}

/// A worker's connections, one [`ProviderConns`] per provider, then TCP.
struct Conns {
    shm: ProviderConns<Shm>,
    roce: ProviderConns<Roce>,
    #[cfg(feature = "ibverbs")]
    ibverbs: ProviderConns<Ibverbs>,
    /// Created at the first TCP connection (most pools never see one).
    tcp: Option<TcpConnections>,
    /// TCP connections the gauges count on this worker.
    tcp_counted: usize,
    /// TCP counters already folded into the worker's.
    tcp_folded: TcpStats,
}

impl Conns {
    fn rdma_is_empty(&self) -> bool {
        #[cfg(feature = "ibverbs")]
        if !self.ibverbs.is_empty() {
            return false;
        }
        self.shm.is_empty() && self.roce.is_empty()
    }

    /// Connections with a call in progress (RDMA: a busy responder slot;
    /// TCP: a call being received or replies not yet written).
    fn busy(&self) -> usize {
        #[cfg(feature = "ibverbs")]
        let ibverbs = self.ibverbs.busy();
        #[cfg(not(feature = "ibverbs"))]
        let ibverbs = 0;
        self.shm.busy()
            + self.roce.busy()
            + ibverbs
            + self.tcp.as_ref().map_or(0, TcpConnections::in_progress)
    }

    fn close_all(&mut self) {
        self.shm.close_all();
        self.roce.close_all();
        #[cfg(feature = "ibverbs")]
        self.ibverbs.close_all();
        if let Some(tcp) = self.tcp.as_mut() {
            tcp.close_all();
        }
    }

    /// The worker is about to park (`ProviderConns::before_sleep`).
    fn before_sleep(&self) {
        self.shm.before_sleep();
        self.roce.before_sleep();
        #[cfg(feature = "ibverbs")]
        self.ibverbs.before_sleep();
    }

    /// The end of a sleep that doorbells can cut short
    /// (`ProviderConns::sleep_deadline`), every provider.
    fn sleep_deadline(&self) -> Option<engine::Instant> {
        let d = [self.shm.sleep_deadline(), self.roce.sleep_deadline()];
        #[cfg(feature = "ibverbs")]
        let d = [d[0], d[1], self.ibverbs.sleep_deadline()];
        d.into_iter().flatten().min()
    }

    /// Whether every connection's news rings a doorbell: TCP sockets do
    /// (their readiness), RDMA queues where the provider rings one.
    fn all_ring(&self) -> bool {
        let rdma = self.shm.all_ring() && self.roce.all_ring();
        #[cfg(feature = "ibverbs")]
        let rdma = rdma && self.ibverbs.all_ring();
        rdma
    }

    /// Arms every provider's doorbells (`ProviderConns::arm_wakeup`) and
    /// adds the TCP connections' readiness (`TcpConnections::wakeup_fds`).
    fn arm_wakeup(&self, fds: &mut Vec<libc::pollfd>) -> bool {
        if let Some(tcp) = &self.tcp {
            tcp.wakeup_fds(fds);
        }
        let quiet = self.shm.arm_wakeup(fds) & self.roce.arm_wakeup(fds);
        #[cfg(feature = "ibverbs")]
        let quiet = quiet & self.ibverbs.arm_wakeup(fds);
        quiet
    }

    fn disarm_wakeup(&self) {
        self.shm.disarm_wakeup();
        self.roce.disarm_wakeup();
        #[cfg(feature = "ibverbs")]
        self.ibverbs.disarm_wakeup();
    }

    fn next_deadline(&self) -> Option<engine::Instant> {
        let deadlines = [self.shm.next_deadline(), self.roce.next_deadline()];
        #[cfg(feature = "ibverbs")]
        let deadlines = [deadlines[0], deadlines[1], self.ibverbs.next_deadline()];
        deadlines.into_iter().flatten().min()
    }

    /// (credits in use, region leases in use) over the RDMA connections.
    fn gauges(&self) -> (u64, u64) {
        let (c1, l1) = self.shm.gauges();
        let (c2, l2) = self.roce.gauges();
        #[cfg(feature = "ibverbs")]
        let (c3, l3) = self.ibverbs.gauges();
        #[cfg(not(feature = "ibverbs"))]
        let (c3, l3) = (0, 0);
        (c1 + c2 + c3, l1 + l2 + l3)
    }
}

impl Worker {
    pub(super) fn run(self, forwarder: Option<Forwarder<Origin>>) -> WorkerReport {
        let mono = crate::clock::MonoClock::new();
        let clock = || mono.now();
        let hint = self.config.connections_hint;
        let mut conns = Conns {
            shm: ProviderConns::new(hint),
            roce: ProviderConns::new(hint),
            #[cfg(feature = "ibverbs")]
            ibverbs: ProviderConns::new(hint),
            tcp: None,
            tcp_counted: 0,
            tcp_folded: TcpStats::default(),
        };
        let mut scratch = Scratch {
            wcs: (0..POLL_BURST).map(|_| Completion::default()).collect(),
            reply: vec![0u8; self.config.endpoint.engine.max_reply_size as usize]
                .into_boxed_slice(),
            call: vec![0u8; IN_PLACE_CALL_MAX].into_boxed_slice(),
            forwarder,
            retiring: Vec::new(),
        };
        let mut idler = Idler::new(self.config.idle);
        // What a sleep waits on: the control doorbell, a doorbell per
        // completion queue, the TCP epoll set (or each socket without
        // one). Sized here, so the first sleep, which may come after the
        // traffic started, allocates nothing.
        let mut sleep_fds: Vec<libc::pollfd> = Vec::with_capacity(SLEEP_FDS + relay_fds(&scratch));
        let mut phase = Phase::Running;
        let mut report = WorkerReport {
            worker: self.index,
            ..WorkerReport::default()
        };
        let mut next_gauges = engine::Instant(0);
        let c = &*self.counters;
        // Start of the last iteration and whether it did work: its
        // length counts as busy time at the start of the next one.
        let mut last: Option<(engine::Instant, bool)> = None;
        loop {
            let now = clock();
            if let Some((then, true)) = last {
                c.busy_ns
                    .add(now.saturating_duration_since(then).as_nanos() as u64);
            }
            let mut work = 0usize;

            // Control ring.
            while let Some(cmd) = self.ring.pop() {
                work += 1;
                match cmd {
                    Command::AddShm(ep) => self.add(&mut conns.shm, ep, now, phase, &mut report),
                    Command::AddRoce(ep) => self.add(&mut conns.roce, ep, now, phase, &mut report),
                    #[cfg(feature = "ibverbs")]
                    Command::AddIbverbs(ep) => {
                        self.add(&mut conns.ibverbs, ep, now, phase, &mut report)
                    }
                    Command::AddTcp(stream) => {
                        report.connections += 1;
                        c.connections_total.add(1);
                        conns.tcp_counted += 1;
                        if conns.tcp.is_none() {
                            // Validated at spawn; should it fail anyway,
                            // the stream is dropped (closed) and the
                            // gauges corrected below.
                            conns.tcp = TcpConnections::new(self.config.tcp).ok();
                            if let Some(tcp) = conns.tcp.as_mut() {
                                tcp.count_peers_out_of(self.config.tcp_peers.clone());
                            }
                        }
                        if let Some(tcp) = conns.tcp.as_mut() {
                            if phase != Phase::Running {
                                tcp.begin_shutdown();
                            }
                            // A refusal is counted in the TCP stats.
                            let _ = tcp.add(stream, now);
                            if matches!(phase, Phase::Draining { .. }) {
                                tcp.close_all();
                            }
                        }
                        self.fold_tcp(&mut conns);
                    }
                    Command::Gateway(swap) => {
                        // New calls go to the new relay; the old one keeps
                        // answering the calls it has at its backends.
                        let old = std::mem::replace(&mut scratch.forwarder, swap.0);
                        if let Some(old) = old.filter(|f| f.in_flight() > 0) {
                            scratch.retiring.push(old);
                        }
                        // Room for the new relay's sockets in a sleep.
                        let room = SLEEP_FDS + relay_fds(&scratch);
                        sleep_fds.reserve(room.saturating_sub(sleep_fds.len()));
                    }
                    Command::Status(reply) => {
                        // The asker waits with a deadline; an answer it no
                        // longer wants is dropped here.
                        let _ = reply.try_send(self.status(&conns, now));
                    }
                    Command::Stop { grace } => {
                        if phase == Phase::Running {
                            phase = Phase::Grace {
                                deadline: instant_after(now, grace),
                            };
                            if let Some(tcp) = conns.tcp.as_mut() {
                                tcp.begin_shutdown();
                            }
                        }
                    }
                }
            }

            // Every connection: completions, timers, events, service,
            // posting; then TCP.
            work += self.poll_provider(&mut conns.shm, now, &mut scratch, &mut report);
            work += self.poll_provider(&mut conns.roce, now, &mut scratch, &mut report);
            #[cfg(feature = "ibverbs")]
            {
                work += self.poll_provider(&mut conns.ibverbs, now, &mut scratch, &mut report);
            }
            if let Some(fw) = scratch.forwarder.as_mut() {
                work += self.poll_gateway(fw, &mut conns, now);
            }
            if !scratch.retiring.is_empty() {
                for fw in scratch.retiring.iter_mut() {
                    work += self.poll_gateway(fw, &mut conns, now);
                }
                scratch.retiring.retain(|fw| fw.in_flight() > 0);
            }
            if let Some(tcp) = conns.tcp.as_mut() {
                work += match scratch.forwarder.as_mut() {
                    Some(fw) => tcp.poll_with(&*self.dispatcher, &mut TcpGateway { fw, now }, now),
                    None => tcp.poll(&*self.dispatcher, now),
                };
                self.fold_tcp(&mut conns);
            }

            // Shutdown.
            match phase {
                Phase::Running => {}
                Phase::Grace { deadline } => {
                    let busy = conns.busy();
                    if busy == 0 || now >= deadline {
                        report.cut_short += busy as u64;
                        conns.close_all();
                        self.fold_tcp(&mut conns);
                        phase = Phase::Draining {
                            deadline: instant_after(now, self.config.drain_timeout),
                        };
                        work += 1;
                    }
                }
                Phase::Draining { deadline } => {
                    if conns.rdma_is_empty() || now >= deadline {
                        self.leak_all(conns.shm.all(), &mut report);
                        self.leak_all(conns.roce.all(), &mut report);
                        #[cfg(feature = "ibverbs")]
                        self.leak_all(conns.ibverbs.all(), &mut report);
                        c.connections.set(0);
                        for t in Transport::ALL {
                            c.connections_by_transport[t.index()].set(0);
                        }
                        self.update_gauges(&conns);
                        report.counters = c.snapshot();
                        return report;
                    }
                }
            }

            c.polls.add(1);
            last = Some((now, work > 0));
            if now >= next_gauges {
                self.update_gauges(&conns);
                next_gauges = instant_after(now, GAUGES_EVERY);
            }
            if work == 0 {
                c.idle_polls.add(1);
                let next = conns
                    .next_deadline()
                    .map(|t| t.saturating_duration_since(now));
                if !idler.will_park() {
                    idler.idle(next);
                } else {
                    // Sleep on the doorbells: the control plane's (a
                    // hand-off, a stop) and every completion queue's
                    // (its peers ring it while we sleep), so a message to
                    // a sleeping worker does not wait for the timeout.
                    conns.before_sleep();
                    sleep_fds.clear();
                    sleep_fds.push(crate::wake::pollfd(self.doorbell.as_fd().as_raw_fd()));
                    // The gateway's backend sockets with a reply or
                    // output due.
                    let mut relays_ring = true;
                    let mut relay_deadline = None;
                    for fw in scratch.forwarder.iter().chain(&scratch.retiring) {
                        let w = fw.watch(&mut sleep_fds);
                        relays_ring &= w.rings;
                        relay_deadline = [relay_deadline, w.deadline].into_iter().flatten().min();
                    }
                    // Until a doorbell, the next deadline or `park_max`;
                    // no longer than a short nap while some news would
                    // ring nothing (a provider without doorbells, calls
                    // queued in a relay).
                    let phase_deadline = match phase {
                        Phase::Running => None,
                        Phase::Grace { deadline } | Phase::Draining { deadline } => Some(deadline),
                    };
                    let mut until = [conns.sleep_deadline(), phase_deadline, relay_deadline]
                        .into_iter()
                        .flatten()
                        .min()
                        .map(|t| t.saturating_duration_since(now));
                    let unrung = !conns.all_ring() || !relays_ring;
                    if unrung {
                        until = super::unrung(until);
                    }
                    if conns.arm_wakeup(&mut sleep_fds) {
                        c.sleeps.add(1);
                        if idler.idle_on(until, &mut sleep_fds) == Sleep::Woken {
                            c.doorbell_wakeups.add(1);
                        }
                    }
                    conns.disarm_wakeup();
                    self.doorbell.clear();
                }
            } else {
                idler.reset();
            }
        }
    }

    fn add<P: PoolProvider>(
        &self,
        eps: &mut ProviderConns<P>,
        mut ep: Box<Endpoint<P>>,
        now: engine::Instant,
        phase: Phase,
        report: &mut WorkerReport,
    ) {
        // The idle timeout (engine::Config::idle_timeout) counts from here.
        ep.connection_mut().start_idle_clock(now);
        report.connections += 1;
        self.counters.connections_total.add(1);
        if matches!(phase, Phase::Draining { .. }) {
            ep.close();
        }
        eps.push(ep, now);
    }

    /// One pass over one provider's connections; returns the work done.
    /// Connections on the worker's shared completion queue: one poll,
    /// each completion routed to its endpoint, then only the endpoints
    /// with something to do are processed. Connections with a queue of
    /// their own: each polled. Closed, flushed connections are retired
    /// (the leak check).
    fn poll_provider<P: PoolProvider>(
        &self,
        pc: &mut ProviderConns<P>,
        now: engine::Instant,
        scratch: &mut Scratch,
        report: &mut WorkerReport,
    ) -> usize {
        let mut work = 0;
        for ep in pc.own.iter_mut() {
            work += ep.poll_completions(now, &mut scratch.wcs);
            work += self.process(ep, now, scratch);
        }
        self.retire_own(&mut pc.own, report);
        for cq in &pc.cqs {
            let n = cq.poll(&mut scratch.wcs);
            work += n;
            for wc in scratch.wcs[..n].iter_mut() {
                match pc.by_qp.get(&wc.qp_num) {
                    Some(&i) => {
                        pc.shared[i].handle_completion(now, wc);
                        if !pc.queued[i] {
                            pc.queued[i] = true;
                            pc.dirty.push(i);
                        }
                    }
                    None => pc.strays.push_back((now, std::mem::take(wc))),
                }
            }
        }
        if now >= pc.next_sweep && !(pc.shared.is_empty() && pc.strays.is_empty()) {
            // Expired strays go, their leases with them.
            while pc
                .strays
                .front()
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= STRAY_TTL)
            {
                pc.strays.pop_front();
                self.counters.errors_completion.add(1);
            }
            for i in 0..pc.shared.len() {
                if pc.shared[i].poll_timeout().is_some_and(|t| t <= now) {
                    pc.shared[i].handle_timeouts(now);
                    pc.mark(i);
                }
            }
            pc.next_sweep = instant_after(now, SWEEP_EVERY);
        }
        // The endpoints with something to do. Work that found no room in
        // a queue keeps its endpoint marked for the next iteration.
        // Work on this iteration's list; what gets marked meanwhile goes
        // into the spare one (both sized at hand-off: no allocation).
        let mut dirty = std::mem::replace(&mut pc.dirty, std::mem::take(&mut pc.spare));
        let mut k = 0;
        while k < dirty.len() {
            let i = dirty[k];
            pc.queued[i] = false;
            work += self.process(&mut pc.shared[i], now, scratch);
            if pc.shared[i].backlog() > 0 {
                pc.mark(i);
            }
            k += 1;
            if pc.shared[i].is_drained() {
                self.retire(&pc.shared[i], report);
                pc.remove_shared(i);
                // The endpoint that took index `i` may be later in this
                // list under its old index, which `remove_shared` only
                // rewrites in `pc.dirty`.
                let moved = pc.shared.len();
                for d in dirty[k..].iter_mut().filter(|d| **d == moved) {
                    *d = i;
                }
            }
        }
        dirty.clear();
        pc.spare = dirty;
        work
    }

    /// Events, service and posting for one endpoint whose completions were
    /// handled; its counters folded into the worker's.
    fn process<P: PoolProvider>(
        &self,
        ep: &mut Endpoint<P>,
        now: engine::Instant,
        scratch: &mut Scratch,
    ) -> usize {
        let c = &*self.counters;
        c.endpoints_processed.add(1);
        let mut work = 0;
        ep.handle_timeouts(now);
        while let Some(ev) = ep.poll_event() {
            work += 1;
            match ev {
                Event::CallArrived { call, .. } => {
                    self.serve(now, ep, call, scratch);
                }
                Event::ConnectionLost { reason } => {
                    // Closing an idle connection is housekeeping, and
                    // a peer's orderly disconnect is its end: neither is
                    // an error.
                    if is_clean(reason) {
                        c.closed_clean.add(1);
                    } else {
                        c.closed_fault.add(1);
                        c.errors_connection.add(1);
                    }
                }
                // A server endpoint sends no calls of its own.
                Event::ReplyArrived { .. } | Event::CallFailed { .. } => {}
            }
        }
        work += ep.flush();
        let d = ep.take_counter_delta();
        c.completions.add(d.completions);
        c.bytes_in.add(d.bytes_in);
        c.bytes_out.add(d.bytes_out);
        c.rdma_reads.add(d.rdma_reads);
        c.rdma_writes.add(d.rdma_writes);
        c.errors_completion.add(d.error_completions);
        c.errors_post.add(d.post_invalid);
        work
    }

    /// Drops closed, drained endpoints with their own queue.
    #[allow(clippy::vec_box)]
    fn retire_own<P: PoolProvider>(
        &self,
        eps: &mut Vec<Box<Endpoint<P>>>,
        report: &mut WorkerReport,
    ) {
        eps.retain(|ep| {
            if !ep.is_drained() {
                return true;
            }
            self.retire(ep, report);
            false
        });
    }

    /// The leak check of an endpoint about to be dropped, and the gauges
    /// that counted it.
    fn retire<P: PoolProvider>(&self, ep: &Endpoint<P>, report: &mut WorkerReport) {
        let c = &*self.counters;
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
        c.connections.sub(1);
        c.connections_by_transport[P::TRANSPORT.index()].sub(1);
    }

    /// Reports every endpoint still held at exit as a leak.
    fn leak_all<'a, P: PoolProvider + 'a>(
        &self,
        eps: impl Iterator<Item = &'a Endpoint<P>>,
        report: &mut WorkerReport,
    ) {
        for ep in eps {
            self.counters.leaks.add(1);
            report.leaks.push(Leak {
                worker: self.index,
                qp_num: ep.qp_num(),
                resources: ep.resources(),
                leases_in_use: ep.leases_in_use(),
            });
        }
    }

    /// Folds the TCP counters into the worker's (they share `rpcs`,
    /// `bytes_*`, `errors_*`) and uncounts closed TCP connections.
    fn fold_tcp(&self, conns: &mut Conns) {
        let c = &*self.counters;
        let (open, s) = match conns.tcp.as_ref() {
            Some(tcp) => (tcp.len(), *tcp.stats()),
            None => (0, TcpStats::default()),
        };
        let d = &conns.tcp_folded;
        c.rpcs.add(s.rpcs - d.rpcs);
        c.bytes_in.add(s.bytes_in - d.bytes_in);
        c.bytes_out.add(s.bytes_out - d.bytes_out);
        c.errors_dropped_calls
            .add(s.records_dropped - d.records_dropped);
        // An idle timeout is housekeeping, as on RDMA; the other drops
        // (truncated or oversized records, socket errors, connections that
        // never spoke) are faults.
        let idled = s.idle_timeouts - d.idle_timeouts;
        let faults = (s.connections_dropped - d.connections_dropped) - idled;
        c.closed_clean
            .add((s.connections_closed - d.connections_closed) + idled);
        c.closed_fault.add(faults);
        c.errors_connection
            .add(faults + (s.connections_refused - d.connections_refused));
        conns.tcp_folded = s;
        if open < conns.tcp_counted {
            let gone = (conns.tcp_counted - open) as u64;
            c.connections.sub(gone);
            c.connections_by_transport[Transport::Tcp.index()].sub(gone);
            conns.tcp_counted = open;
        }
    }

    /// Every connection of this worker, for [`Command::Status`].
    fn status(&self, conns: &Conns, now: engine::Instant) -> super::WorkerStatus {
        let mut out = super::WorkerStatus {
            worker: self.index,
            connections: Vec::new(),
        };
        self.status_of(&conns.shm, &mut out);
        self.status_of(&conns.roce, &mut out);
        #[cfg(feature = "ibverbs")]
        self.status_of(&conns.ibverbs, &mut out);
        if let Some(tcp) = conns.tcp.as_ref() {
            for (peer, n) in tcp.connection_counts() {
                out.connections.push(super::ConnectionStatus {
                    worker: self.index,
                    transport: Transport::Tcp,
                    peer: peer.to_string(),
                    age: now.saturating_duration_since(n.opened),
                    credits_granted: 0,
                    credits_in_use: 0,
                    calls_received: n.calls,
                    replies_sent: n.replies,
                    bytes_received: n.bytes_in,
                    bytes_sent: n.bytes_out,
                    errors: 0,
                    hugepages: None,
                });
            }
        }
        out
    }

    fn status_of<P: PoolProvider>(&self, pc: &ProviderConns<P>, out: &mut super::WorkerStatus) {
        for ep in pc.all() {
            let stats = ep.stats();
            let n = ep.counters();
            out.connections.push(super::ConnectionStatus {
                worker: self.index,
                transport: P::TRANSPORT,
                peer: super::status::describe_peer(ep.peer_identity()),
                age: ep.opened().elapsed(),
                credits_granted: ep.connection().credits_granted(),
                credits_in_use: ep.resources().serve_slots_busy,
                calls_received: stats.calls_received,
                replies_sent: stats.replies_sent,
                bytes_received: n.bytes_in,
                bytes_sent: n.bytes_out,
                errors: n.error_completions
                    + stats.err_vers_sent
                    + stats.err_chunk_sent
                    + stats.transmission_errors_sent
                    + stats.credit_overruns,
                hugepages: Some(ep.is_hugepage_backed()),
            });
        }
    }

    fn update_gauges(&self, conns: &Conns) {
        let (credits, leases) = conns.gauges();
        self.counters.credits_in_use.set(credits);
        self.counters.pool_in_use.set(leases);
    }

    /// Runs the service for one call and answers it, or forwards it to
    /// its backend when its program is routed (the answer then comes from
    /// [`poll_gateway`](Self::poll_gateway)).
    fn serve<P: PoolProvider>(
        &self,
        now: engine::Instant,
        ep: &mut Endpoint<P>,
        call: IncomingCall,
        scratch: &mut Scratch,
    ) {
        let c = &*self.counters;
        let (qp, client) = (ep.qp_num(), ep.peer_identity());
        let conn = ep.connection_mut();
        let (Some(header_len), Some(msg)) = (conn.call_header_len(call), conn.call_message(call))
        else {
            return;
        };
        // The engine parsed the call's header: the service need not again
        // (`None` cannot happen for a call the engine delivered; the full
        // dispatch then).
        let known = KnownCall::peek(msg, header_len);
        let xid = msg.get(..4).map(|b| [b[0], b[1], b[2], b[3]]);
        if let (Some(fw), Some(x)) = (scratch.forwarder.as_mut(), xid) {
            if fw.routes(msg) {
                let origin = Origin::Rdma {
                    transport: P::TRANSPORT,
                    qp,
                    call,
                    xid: u32::from_be_bytes(x),
                };
                match fw.forward(now, origin, client, msg) {
                    Ok(Forwarded::Sent | Forwarded::Joined) => {}
                    Ok(Forwarded::Cached(reply)) => {
                        // A retransmission of a call already executed:
                        // the backend's reply again, not a second run.
                        let reply = OutgoingReply {
                            message: reply,
                            ddp: &[],
                        };
                        self.answer(now, ep, call, xid, &reply);
                    }
                    // Every in-flight slot is taken (counted by route), or
                    // a third copy of a call at the backend: an answer now
                    // rather than a call left hanging.
                    Ok(Forwarded::Refused) | Err(_) => self.answer_system_err(now, ep, call, x),
                }
                return;
            }
        }
        if let Some(call_copy) = scratch.call.get_mut(..msg.len()) {
            // A small call is copied out and the reply encoded where the
            // Send and the Writes read it: a pass over the reply saved.
            call_copy.copy_from_slice(msg);
            let Some(out) = conn.reply_buffer(call) else {
                return;
            };
            let limit = out.len().min(scratch.reply.len());
            match dispatch(
                &*self.dispatcher,
                call_copy,
                known.as_ref(),
                &mut out[..limit],
            ) {
                Dispatched::Reply { len, ddp } => {
                    let sent = ep.connection_mut().send_reply_in_place(now, call, len, ddp);
                    self.answered(now, ep, call, xid, sent);
                }
                Dispatched::Drop => {
                    c.errors_dropped_calls.add(1);
                    ep.close();
                }
            }
            return;
        }
        match dispatch(&*self.dispatcher, msg, known.as_ref(), &mut scratch.reply) {
            Dispatched::Reply { len, ddp } => {
                let reply = OutgoingReply {
                    message: scratch.reply.get(..len).unwrap_or(&[]),
                    ddp: ddp.as_slice(),
                };
                self.answer(now, ep, call, xid, &reply);
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

    /// Sends `reply` to `call`. A reply the engine cannot send (too large
    /// for the chunks the requester offered, or a service bug) becomes
    /// SYSTEM_ERR (RFC 5531 s9; RFC 5666 s3.4), so the call does not
    /// hang; a connection that cannot take even that is closed.
    fn answer<P: PoolProvider>(
        &self,
        now: engine::Instant,
        ep: &mut Endpoint<P>,
        call: IncomingCall,
        xid: Option<[u8; 4]>,
        reply: &OutgoingReply<'_>,
    ) {
        let sent = ep.connection_mut().send_reply(now, call, reply);
        self.answered(now, ep, call, xid, sent);
    }

    /// Counts a reply the engine took, or answers SYSTEM_ERR for one it
    /// refused (see [`Worker::answer`]).
    fn answered<P: PoolProvider>(
        &self,
        now: engine::Instant,
        ep: &mut Endpoint<P>,
        call: IncomingCall,
        xid: Option<[u8; 4]>,
        sent: Result<(), engine::ReplyError>,
    ) {
        match sent {
            Ok(()) => self.counters.rpcs.add(1),
            Err(_) => match xid {
                Some(xid) => self.answer_system_err(now, ep, call, xid),
                None => self.counters.errors_reply.add(1),
            },
        }
    }

    fn answer_system_err<P: PoolProvider>(
        &self,
        now: engine::Instant,
        ep: &mut Endpoint<P>,
        call: IncomingCall,
        xid: [u8; 4],
    ) {
        self.counters.errors_reply.add(1);
        let mut buf = [0u8; 24];
        let n = system_err_reply(xid, &mut buf);
        let reply = OutgoingReply {
            message: &buf[..n],
            ddp: &[],
        };
        if ep.connection_mut().send_reply(now, call, &reply).is_err() {
            ep.close();
        }
    }

    /// The relay's turn in the loop: backend connections moved on, each
    /// answer delivered to its call's connection (and posted at once),
    /// calls of lost backend connections handed over again.
    fn poll_gateway(
        &self,
        fw: &mut Forwarder<Origin>,
        conns: &mut Conns,
        now: engine::Instant,
    ) -> usize {
        let mut work = fw.poll(now, |origin, answer| match origin {
            Origin::Rdma { transport, .. } => match transport {
                Transport::Shm => self.deliver(&mut conns.shm, now, origin, answer),
                Transport::Roce => self.deliver(&mut conns.roce, now, origin, answer),
                #[cfg(feature = "ibverbs")]
                Transport::Ibverbs => self.deliver(&mut conns.ibverbs, now, origin, answer),
                _ => {}
            },
            Origin::Tcp { call, xid } => {
                let Some(tcp) = conns.tcp.as_mut() else {
                    return;
                };
                let mut err = [0u8; 24];
                let message = match answer {
                    Answer::Reply { message, .. } => message,
                    Answer::Failed { .. } => {
                        self.counters.errors_reply.add(1);
                        let n = system_err_reply(xid.to_be_bytes(), &mut err);
                        &err[..n]
                    }
                };
                if !tcp.deliver(call, message, now) {
                    self.counters.errors_dropped_calls.add(1);
                }
            }
        });
        // At most one round of the queue per iteration: a call that finds
        // no room goes to the back and waits for the next.
        while let Some((token, origin)) = fw.next_resend() {
            work += 1;
            let sent = match origin {
                Origin::Rdma { transport, .. } => match transport {
                    Transport::Shm => resend_from(&mut conns.shm, fw, now, token, origin),
                    Transport::Roce => resend_from(&mut conns.roce, fw, now, token, origin),
                    #[cfg(feature = "ibverbs")]
                    Transport::Ibverbs => resend_from(&mut conns.ibverbs, fw, now, token, origin),
                    _ => None,
                },
                // A TCP call larger than the relay keeps a copy of
                // (`gateway::KEEP_MAX`): its bytes went with its record,
                // so its client retransmits when its own timer runs out.
                Origin::Tcp { call, .. } => {
                    if let Some(tcp) = conns.tcp.as_mut() {
                        tcp.forget(call);
                    }
                    None
                }
            };
            match sent {
                Some(true) => {}
                Some(false) => break,
                None => fw.abandon(token),
            }
        }
        work
    }

    /// Answers a forwarded call on its connection, if that connection is
    /// still there and the slot still holds the call (a queue-pair number
    /// can come back with a new connection; the XID tells them apart).
    fn deliver<P: PoolProvider>(
        &self,
        pc: &mut ProviderConns<P>,
        now: engine::Instant,
        origin: Origin,
        answer: Answer<'_>,
    ) {
        let Origin::Rdma { qp, call, xid, .. } = origin else {
            return;
        };
        let Some((ep, shared)) = pc.find_mut(qp) else {
            self.counters.errors_dropped_calls.add(1);
            return;
        };
        let held = ep.connection().call_message(call).and_then(peek_xid);
        if held != Some(xid) {
            self.counters.errors_dropped_calls.add(1);
            return;
        }
        let xid = xid.to_be_bytes();
        match answer {
            Answer::Reply {
                message,
                program,
                version,
                procedure,
            } => {
                let items = crate::gateway::reply_ddp(program, version, procedure, message);
                let reply = OutgoingReply {
                    message,
                    ddp: items.as_slice(),
                };
                self.answer(now, ep, call, Some(xid), &reply);
            }
            Answer::Failed { .. } => self.answer_system_err(now, ep, call, xid),
        }
        ep.flush();
        if let Some(i) = shared {
            if ep.backlog() > 0 {
                pc.mark(i);
            }
        }
    }
}

/// Hands the call of `token` to the relay again, from its connection's
/// responder slot: `None` when the connection or the call is gone.
fn resend_from<P: PoolProvider>(
    pc: &mut ProviderConns<P>,
    fw: &mut Forwarder<Origin>,
    now: engine::Instant,
    token: Token,
    origin: Origin,
) -> Option<bool> {
    let Origin::Rdma { qp, call, xid, .. } = origin else {
        return None;
    };
    let (ep, _) = pc.find_mut(qp)?;
    let msg = ep.connection().call_message(call)?;
    (peek_xid(msg) == Some(xid)).then(|| fw.resend(now, token, msg))
}

/// `Dispatcher::dispatch_known` with the header the engine parsed, or the
/// full `dispatch` without it.
fn dispatch(
    dispatcher: &dyn Dispatcher,
    call: &[u8],
    known: Option<&KnownCall>,
    out: &mut [u8],
) -> Dispatched {
    match known {
        Some(k) => dispatcher.dispatch_known(call, k, out),
        None => dispatcher.dispatch(call, out),
    }
}
