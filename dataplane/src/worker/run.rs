//! One worker thread's loop: every connection it owns, of every transport,
//! polled run-to-completion (docs/WORKER.md, "The loop").
//!
//! Each provider's connections live in a list of their own type
//! (`Vec<Box<Endpoint<P>>>`) and go through the same generic functions,
//! so the hot path is statically dispatched; the TCP connections are one
//! [`TcpConnections`] polled after them.
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

use super::endpoint::{Endpoint, POLL_BURST};
use super::pool::PoolProvider;
use super::{
    engine, system_err_reply, Command, Completion, Dispatched, Dispatcher, Event, Idler,
    IncomingCall, Leak, OutgoingReply, Transport, WorkerConfig, WorkerCounters, WorkerReport,
};
use crate::tcp::{TcpConnections, TcpStats};
#[cfg(feature = "ibverbs")]
use crate::verbs::ibverbs::Ibverbs;
use crate::verbs::roce::Roce;
use crate::verbs::shm::Shm;

/// One worker thread's state.
pub(super) struct Worker {
    pub(super) index: usize,
    pub(super) ring: Arc<ArrayQueue<Command>>,
    pub(super) counters: Arc<WorkerCounters>,
    pub(super) dispatcher: Arc<dyn Dispatcher>,
    pub(super) config: WorkerConfig,
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

/// Buffers of the loop, allocated once.
struct Scratch {
    wcs: Vec<Completion>,
    /// Where the service writes an RDMA reply (TCP replies are written in
    /// the connection's output buffer).
    reply: Box<[u8]>,
}

/// A worker's connections, one list per transport. Endpoints stay in the
/// box they came over the ring in: no copy of a large struct at hand-off
/// or when `retain` compacts a list.
#[allow(clippy::vec_box)]
struct Conns {
    shm: Vec<Box<Endpoint<Shm>>>,
    roce: Vec<Box<Endpoint<Roce>>>,
    #[cfg(feature = "ibverbs")]
    ibverbs: Vec<Box<Endpoint<Ibverbs>>>,
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
        let ibverbs = busy(&self.ibverbs);
        #[cfg(not(feature = "ibverbs"))]
        let ibverbs = 0;
        busy(&self.shm)
            + busy(&self.roce)
            + ibverbs
            + self.tcp.as_ref().map_or(0, TcpConnections::in_progress)
    }

    fn close_all(&mut self) {
        close_all(&mut self.shm);
        close_all(&mut self.roce);
        #[cfg(feature = "ibverbs")]
        close_all(&mut self.ibverbs);
        if let Some(tcp) = self.tcp.as_mut() {
            tcp.close_all();
        }
    }

    fn next_deadline(&self) -> Option<engine::Instant> {
        let deadlines = [next_deadline(&self.shm), next_deadline(&self.roce)];
        #[cfg(feature = "ibverbs")]
        let deadlines = [deadlines[0], deadlines[1], next_deadline(&self.ibverbs)];
        deadlines.into_iter().flatten().min()
    }

    /// (credits in use, region leases in use) over the RDMA connections.
    fn gauges(&self) -> (u64, u64) {
        let (c1, l1) = gauges(&self.shm);
        let (c2, l2) = gauges(&self.roce);
        #[cfg(feature = "ibverbs")]
        let (c3, l3) = gauges(&self.ibverbs);
        #[cfg(not(feature = "ibverbs"))]
        let (c3, l3) = (0, 0);
        (c1 + c2 + c3, l1 + l2 + l3)
    }
}

fn busy<P: PoolProvider>(eps: &[Box<Endpoint<P>>]) -> usize {
    eps.iter()
        .filter(|ep| ep.resources().serve_slots_busy > 0)
        .count()
}

fn close_all<P: PoolProvider>(eps: &mut [Box<Endpoint<P>>]) {
    for ep in eps.iter_mut() {
        ep.close();
        ep.flush();
    }
}

fn next_deadline<P: PoolProvider>(eps: &[Box<Endpoint<P>>]) -> Option<engine::Instant> {
    eps.iter().filter_map(|ep| ep.poll_timeout()).min()
}

fn gauges<P: PoolProvider>(eps: &[Box<Endpoint<P>>]) -> (u64, u64) {
    let (mut credits, mut leases) = (0u64, 0u64);
    for ep in eps {
        credits += u64::from(ep.resources().serve_slots_busy);
        leases += ep.leases_in_use() as u64;
    }
    (credits, leases)
}

impl Worker {
    pub(super) fn run(self) -> WorkerReport {
        let origin = std::time::Instant::now();
        let clock = || engine::Instant(origin.elapsed().as_nanos() as u64);
        let hint = self.config.connections_hint;
        let mut conns = Conns {
            shm: Vec::with_capacity(hint),
            roce: Vec::with_capacity(hint),
            #[cfg(feature = "ibverbs")]
            ibverbs: Vec::with_capacity(hint),
            tcp: None,
            tcp_counted: 0,
            tcp_folded: TcpStats::default(),
        };
        let mut scratch = Scratch {
            wcs: (0..POLL_BURST).map(|_| Completion::default()).collect(),
            reply: vec![0u8; self.config.endpoint.engine.max_reply_size as usize]
                .into_boxed_slice(),
        };
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
            work += self.poll_endpoints(&mut conns.shm, now, &mut scratch);
            work += self.poll_endpoints(&mut conns.roce, now, &mut scratch);
            #[cfg(feature = "ibverbs")]
            {
                work += self.poll_endpoints(&mut conns.ibverbs, now, &mut scratch);
            }
            if let Some(tcp) = conns.tcp.as_mut() {
                work += tcp.poll(&*self.dispatcher, now);
                self.fold_tcp(&mut conns);
            }

            // Retire closed, flushed connections (the leak check).
            self.retire(&mut conns.shm, &mut report);
            self.retire(&mut conns.roce, &mut report);
            #[cfg(feature = "ibverbs")]
            self.retire(&mut conns.ibverbs, &mut report);

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
                        self.leak_all(&conns.shm, &mut report);
                        self.leak_all(&conns.roce, &mut report);
                        #[cfg(feature = "ibverbs")]
                        self.leak_all(&conns.ibverbs, &mut report);
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
            if work == 0 {
                c.idle_polls.add(1);
                if iteration % 64 == 0 {
                    self.update_gauges(&conns);
                }
                let next = conns
                    .next_deadline()
                    .map(|t| t.saturating_duration_since(now));
                idler.idle(next);
            } else {
                idler.reset();
                if iteration % 1024 == 0 {
                    self.update_gauges(&conns);
                }
            }
        }
    }

    fn add<P: PoolProvider>(
        &self,
        eps: &mut Vec<Box<Endpoint<P>>>,
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
        eps.push(ep);
    }

    /// One pass over one provider's endpoints; returns the work done.
    fn poll_endpoints<P: PoolProvider>(
        &self,
        eps: &mut [Box<Endpoint<P>>],
        now: engine::Instant,
        scratch: &mut Scratch,
    ) -> usize {
        let c = &*self.counters;
        let mut work = 0;
        for ep in eps.iter_mut() {
            let before = *ep.counters();
            work += ep.poll_completions(now, &mut scratch.wcs);
            ep.handle_timeouts(now);
            while let Some(ev) = ep.poll_event() {
                work += 1;
                match ev {
                    Event::CallArrived { call, .. } => {
                        self.serve(now, ep, call, &mut scratch.reply);
                    }
                    Event::ConnectionLost { reason } => {
                        // Closing an idle connection is housekeeping, not
                        // an error.
                        if !matches!(
                            reason,
                            engine::CloseReason::Local | engine::CloseReason::Idle
                        ) {
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
        work
    }

    /// Drops closed, drained endpoints, leak-checking each.
    fn retire<P: PoolProvider>(&self, eps: &mut Vec<Box<Endpoint<P>>>, report: &mut WorkerReport) {
        let c = &*self.counters;
        let before = eps.len();
        eps.retain(|ep| {
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
        let retired = (before - eps.len()) as u64;
        c.connections.sub(retired);
        c.connections_by_transport[P::TRANSPORT.index()].sub(retired);
    }

    /// Reports every endpoint still held at exit as a leak.
    fn leak_all<P: PoolProvider>(&self, eps: &[Box<Endpoint<P>>], report: &mut WorkerReport) {
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
        c.errors_connection.add(
            (s.connections_dropped - d.connections_dropped)
                + (s.connections_refused - d.connections_refused),
        );
        conns.tcp_folded = s;
        if open < conns.tcp_counted {
            let gone = (conns.tcp_counted - open) as u64;
            c.connections.sub(gone);
            c.connections_by_transport[Transport::Tcp.index()].sub(gone);
            conns.tcp_counted = open;
        }
    }

    fn update_gauges(&self, conns: &Conns) {
        let (credits, leases) = conns.gauges();
        self.counters.credits_in_use.set(credits);
        self.counters.pool_in_use.set(leases);
    }

    /// Runs the service for one call and answers it.
    fn serve<P: PoolProvider>(
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
