//! A worker's relay to its backends: the table of calls in flight, the
//! XID rewrite, resends after a lost connection, call timeouts.
//!
//! # A pending call's states
//!
//! | state | meaning | next |
//! |---|---|---|
//! | `Free` | slot unused | `Sent` (forward), `Queued` (no room) |
//! | `Sent` | in a backend connection's output or on the wire | `Free` (reply or timeout), `Queued` (connection lost) |
//! | `Queued` | waits for the worker to hand its call bytes again | `Sent` (resend), `Free` (timeout) |
//!
//! An RDMA call's bytes stay in the engine's responder slot until it is
//! answered, so a resend asks the worker for them again
//! ([`Forwarder::next_resend`]) instead of keeping a copy here. A call
//! taken from a TCP connection has no such home (the connection's record
//! buffer moves on to its next call): [`Forwarder::forward_copy`] keeps a
//! copy of calls up to [`KEEP_MAX`] bytes, which covers MOUNT, NLM, NSM
//! and NFS's metadata, and resends those itself. A larger one (a WRITE
//! over TCP) is not resent: its client retransmits on its own timer.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use super::backend::{BackendConn, LinkEvent};
use super::drc::{self, Drc, EntryRef, Key, Lookup};
use super::{GatewayConfig, GatewayCounters, RouteCounters};
use crate::engine::Instant;
use crate::wire::rpc::{peek_direction, peek_xid, CallHeader, MessageType};

/// A pending call's slot in the table, handed out by
/// [`Forwarder::next_resend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token(u32);

/// Why a call was not forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    /// No route for the call's program: serve it locally.
    #[error("program not routed")]
    NotRouted,
    /// Not a decodable call header.
    #[error("not a call")]
    Malformed,
    /// Every in-flight slot is taken: answer SYSTEM_ERR.
    #[error("too many calls in flight")]
    Busy,
}

/// What [`Forwarder::forward`] did with a call.
#[derive(Debug, PartialEq, Eq)]
pub enum Forwarded<'a> {
    /// Sent (or queued) to the backend: the answer comes from
    /// [`Forwarder::poll`].
    Sent,
    /// A retransmission of a call already answered: this is its reply
    /// (the duplicate request cache); the backend does not see it again.
    Cached(&'a [u8]),
    /// A retransmission of a call still at the backend: its reply, when
    /// it comes, answers this one too.
    Joined,
    /// A third copy of a call still at the backend: answer it SYSTEM_ERR
    /// (its client will retransmit once more, and find the reply cached).
    Refused,
}

/// What became of a forwarded call.
#[derive(Debug)]
pub enum Answer<'a> {
    /// The backend's reply, with the client's XID back in place.
    Reply {
        /// The whole RPC reply message.
        message: &'a [u8],
        /// The call's program, version and procedure (a reply does not
        /// say which procedure it answers; the DDP item depends on it).
        program: u32,
        /// See `program`.
        version: u32,
        /// See `program`.
        procedure: u32,
    },
    /// No reply within the call timeout: answer SYSTEM_ERR to `xid`.
    Failed {
        /// The client's XID.
        xid: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Sent { conn: u16 },
    Queued,
}

#[derive(Debug, Clone, Copy)]
struct Pending<O> {
    state: State,
    /// Bumped at every use: the high half of the backend XID.
    generation: u16,
    route: u16,
    origin: Option<O>,
    /// A retransmission that joined the call while at the backend.
    also: Option<O>,
    /// The call's entry in the duplicate request cache.
    drc: Option<EntryRef>,
    /// Its connection was lost: the next send is a resend (else a call
    /// queued for room in the output).
    lost: bool,
    /// Its bytes are in `kept`: the forwarder resends it itself.
    copied: bool,
    client_xid: u32,
    program: u32,
    version: u32,
    procedure: u32,
    /// When it was first forwarded.
    since: Instant,
}

/// One backend's connections.
#[derive(Debug)]
struct Backend {
    conns: Vec<BackendConn>,
    /// Where the round of connections continues.
    next: usize,
}

/// A worker's relay (see the module documentation). `O` is whatever the
/// worker needs to find a call's connection and slot again.
#[derive(Debug)]
pub struct Forwarder<O: Copy> {
    config: Arc<GatewayConfig>,
    counters: Arc<GatewayCounters>,
    /// One per route, in route order.
    backends: Vec<Backend>,
    pending: Vec<Pending<O>>,
    free: Vec<u32>,
    /// Slots in `Queued` whose origin hands their bytes back, oldest first.
    resend: VecDeque<u32>,
    /// Slots in `Queued` with a copy in `kept`, oldest first.
    resend_copied: VecDeque<u32>,
    /// Per slot: the copy of a call from an origin that does not keep
    /// it. Emptied, not freed, when the call ends, so steady state does
    /// not allocate.
    kept: Vec<Vec<u8>>,
    in_flight: usize,
    /// One past the highest slot ever taken: the free list is a stack, so
    /// slots in use stay at the bottom of the table and a sweep looks at
    /// this many, not at the whole table (65,536 by default), every
    /// millisecond.
    high_water: usize,
    next_sweep: Instant,
    drc: Drc,
}

/// What a relay needs from its worker's sleep ([`Forwarder::watch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayWatch {
    /// When the relay next needs the loop (the earliest call timeout).
    pub deadline: Option<Instant>,
    /// False when some of its news rings no descriptor (calls queued for
    /// room or a connection): the sleep must stay short.
    pub rings: bool,
}

/// The largest call [`Forwarder::forward_copy`] keeps a copy of.
pub const KEEP_MAX: usize = 64 * 1024;

/// How often pending calls are checked against the call timeout.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_millis(1);

impl<O: Copy> Forwarder<O> {
    /// A relay for `config` (validated), counting into `counters` (made
    /// for the same config). Reserves every buffer and table now;
    /// connections are made on first use.
    ///
    /// # Errors
    /// A buffer's mapping failed.
    pub fn new(config: Arc<GatewayConfig>, counters: Arc<GatewayCounters>) -> io::Result<Self> {
        let mut backends = Vec::with_capacity(config.routes.len());
        for r in &config.routes {
            let conns = (0..r.connections.max(1))
                .map(|_| BackendConn::new(r.backend, config.max_message))
                .collect::<io::Result<Vec<_>>>()?;
            backends.push(Backend { conns, next: 0 });
        }
        let n = config.max_in_flight.clamp(1, 65536) as usize;
        let pending = vec![
            Pending {
                state: State::Free,
                generation: 0,
                route: 0,
                origin: None,
                also: None,
                drc: None,
                lost: false,
                copied: false,
                client_xid: 0,
                program: 0,
                version: 0,
                procedure: 0,
                since: Instant::ZERO,
            };
            n
        ];
        let free = (0..n as u32).rev().collect();
        let drc = Drc::new(config.reply_cache_entries as usize, config.reply_cache_ttl);
        Ok(Forwarder {
            config,
            counters,
            backends,
            pending,
            free,
            resend: VecDeque::with_capacity(n),
            resend_copied: VecDeque::with_capacity(n),
            kept: vec![Vec::new(); n],
            in_flight: 0,
            high_water: 0,
            next_sweep: Instant::ZERO,
            drc,
        })
    }

    /// Backend connections, every route's: how many descriptors
    /// [`watch`](Self::watch) may add.
    pub fn connections(&self) -> usize {
        self.backends.iter().map(|b| b.conns.len()).sum()
    }

    /// Readies the relay for its worker's sleep (docs/WORKER.md,
    /// "Doorbells"): adds to `fds` the backend sockets whose readiness is
    /// news (a reply due, output or a connect waiting) and says until
    /// when the sleep may last. Nothing to watch, and no deadline, while
    /// no call is out. O(calls out), once per sleep.
    pub fn watch(&self, fds: &mut Vec<libc::pollfd>) -> RelayWatch {
        if self.in_flight == 0 {
            return RelayWatch {
                deadline: None,
                rings: true,
            };
        }
        for b in &self.backends {
            fds.extend(b.conns.iter().filter_map(BackendConn::watch));
        }
        // The sweep that fails a call runs once its timeout has passed.
        let timeout = self.config.call_timeout;
        let deadline = self.pending[..self.high_water]
            .iter()
            .filter(|p| p.state != State::Free)
            .map(|p| p.since.saturating_add(timeout))
            .min();
        RelayWatch {
            deadline,
            // A call queued for room or for a connection is tried again
            // by the loop (and a down link waits for its retry time):
            // no descriptor tells when.
            rings: self.resend.is_empty() && self.resend_copied.is_empty(),
        }
    }

    /// Calls waiting for their backend.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The route of a call of `program`.
    fn route_of(&self, program: u32) -> Option<usize> {
        self.config.routes.iter().position(|r| r.program == program)
    }

    /// Whether calls of `msg`'s program go to a backend.
    pub fn routes(&self, msg: &[u8]) -> bool {
        program_of(msg).is_some_and(|p| self.route_of(p).is_some())
    }

    fn route_counters(&self, route: usize) -> &RouteCounters {
        &self.counters.routes[route]
    }

    /// Sends the call message `msg` (whole, as the engine reassembled it)
    /// from `client` (the provider's peer identity) to its program's
    /// backend on behalf of `origin`, unless the duplicate request cache
    /// knows it (see [`Forwarded`]). The answer of a sent call comes from
    /// [`poll`](Self::poll).
    ///
    /// `origin` must be able to hand `msg` back for a resend
    /// ([`next_resend`](Self::next_resend)); see
    /// [`forward_copy`](Self::forward_copy) for one that cannot.
    ///
    /// # Errors
    /// [`ForwardError`]: nothing was taken.
    pub fn forward(
        &mut self,
        now: Instant,
        origin: O,
        client: u64,
        msg: &[u8],
    ) -> Result<Forwarded<'_>, ForwardError> {
        self.forward_inner(now, origin, client, msg, false)
    }

    /// [`forward`](Self::forward) for an origin that does not keep the
    /// call's bytes: a call of up to [`KEEP_MAX`] bytes is copied and, if
    /// its connection is lost, resent from the copy; a larger one is
    /// handed to [`next_resend`](Self::next_resend) like any other, for
    /// the worker to [`abandon`](Self::abandon).
    ///
    /// # Errors
    /// [`ForwardError`]: nothing was taken.
    pub fn forward_copy(
        &mut self,
        now: Instant,
        origin: O,
        client: u64,
        msg: &[u8],
    ) -> Result<Forwarded<'_>, ForwardError> {
        self.forward_inner(now, origin, client, msg, true)
    }

    fn forward_inner(
        &mut self,
        now: Instant,
        origin: O,
        client: u64,
        msg: &[u8],
        copy: bool,
    ) -> Result<Forwarded<'_>, ForwardError> {
        let (header, _) = CallHeader::parse(msg).map_err(|_| ForwardError::Malformed)?;
        let route = self
            .route_of(header.program)
            .ok_or(ForwardError::NotRouted)?;
        let key = drc::is_cached(header.program, header.version, header.procedure).then(|| {
            Key::of(
                client,
                msg,
                header.program,
                header.version,
                header.procedure,
            )
        });
        if let Some(k) = &key {
            let counters = &self.counters.routes[route];
            // The state first, the reply borrowed only to return it.
            let in_progress = match self.drc.lookup(k, now) {
                Lookup::Miss => None,
                Lookup::InProgress { slot } => Some(slot),
                Lookup::Done(_) => {
                    RouteCounters::add(&counters.cache_hits, 1);
                    let Lookup::Done(reply) = self.drc.lookup(k, now) else {
                        unreachable!("looked up just above")
                    };
                    return Ok(Forwarded::Cached(reply));
                }
            };
            match in_progress {
                None => {}
                Some(slot) => {
                    let p = &mut self.pending[slot as usize];
                    if p.also.is_some() {
                        return Ok(Forwarded::Refused);
                    }
                    p.also = Some(origin);
                    RouteCounters::add(&counters.cache_joins, 1);
                    return Ok(Forwarded::Joined);
                }
            }
        }
        let Some(slot) = self.free.pop() else {
            RouteCounters::add(&self.route_counters(route).errors_busy, 1);
            return Err(ForwardError::Busy);
        };
        self.high_water = self.high_water.max(slot as usize + 1);
        let entry = key.map(|k| self.drc.start(k, slot, now));
        let p = &mut self.pending[slot as usize];
        p.generation = p.generation.wrapping_add(1);
        p.route = route as u16;
        p.origin = Some(origin);
        p.also = None;
        p.drc = entry;
        p.lost = false;
        p.copied = copy && msg.len() <= KEEP_MAX;
        p.client_xid = header.xid;
        p.program = header.program;
        p.version = header.version;
        p.procedure = header.procedure;
        p.since = now;
        p.state = State::Queued;
        self.in_flight += 1;
        RouteCounters::add(&self.counters.routes[route].calls, 1);
        if self.pending[slot as usize].copied {
            let kept = &mut self.kept[slot as usize];
            kept.clear();
            kept.extend_from_slice(msg);
        }
        if !self.send(now, slot, msg) {
            self.queue(slot);
        }
        Ok(Forwarded::Sent)
    }

    /// Queues a slot in `Queued` for its resend.
    fn queue(&mut self, slot: u32) {
        if self.pending[slot as usize].copied {
            self.resend_copied.push_back(slot);
        } else {
            self.resend.push_back(slot);
        }
    }

    /// Sends again, from their copies, the queued calls that have one: at
    /// most one round of the queue. Returns the calls sent.
    fn resend_copies(&mut self, now: Instant) -> usize {
        let mut sent = 0;
        for _ in 0..self.resend_copied.len() {
            let Some(slot) = self.resend_copied.pop_front() else {
                break;
            };
            let p = self.pending[slot as usize];
            if p.state != State::Queued || !p.copied {
                continue;
            }
            // Taken out for the send, which borrows the whole relay.
            let msg = std::mem::take(&mut self.kept[slot as usize]);
            let ok = self.send(now, slot, &msg);
            self.kept[slot as usize] = msg;
            if !ok {
                self.resend_copied.push_front(slot);
                break;
            }
            let c = &self.counters.routes[usize::from(p.route)];
            RouteCounters::add(if p.lost { &c.resends } else { &c.output_waits }, 1);
            self.pending[slot as usize].lost = false;
            sent += 1;
        }
        sent
    }

    /// Puts a slot's call on one of its backend's connections.
    fn send(&mut self, now: Instant, slot: u32, msg: &[u8]) -> bool {
        let p = self.pending[slot as usize];
        let route = usize::from(p.route);
        let xid = (u32::from(p.generation) << 16) | slot;
        let backend = &mut self.backends[route];
        let n = backend.conns.len();
        for k in 0..n {
            let c = (backend.next + k) % n;
            let conn = &mut backend.conns[c];
            if !conn.is_usable()
                && conn.try_connect(now, self.config.reconnect_after) == LinkEvent::Lost
            {
                RouteCounters::add(&self.counters.routes[route].errors_connection, 1);
                continue;
            }
            if conn.is_usable() && conn.queue_call(msg, xid) {
                conn.in_flight += 1;
                backend.next = (c + 1) % n;
                self.pending[slot as usize].state = State::Sent { conn: c as u16 };
                return true;
            }
        }
        false
    }

    /// The next call to hand back through [`resend`](Self::resend): its
    /// token and origin. A worker calls it until `None`, once per
    /// iteration after [`poll`](Self::poll).
    pub fn next_resend(&mut self) -> Option<(Token, O)> {
        while let Some(slot) = self.resend.pop_front() {
            let p = &self.pending[slot as usize];
            if p.state == State::Queued {
                if let Some(origin) = p.origin {
                    return Some((Token(slot), origin));
                }
            }
        }
        None
    }

    /// Sends again the call of `token` (its message `msg`, as from the
    /// engine). Returns false when no connection took it: it stays queued
    /// for a later iteration.
    pub fn resend(&mut self, now: Instant, token: Token, msg: &[u8]) -> bool {
        let slot = token.0;
        let Some(p) = self.pending.get(slot as usize) else {
            return false;
        };
        if p.state != State::Queued || peek_xid(msg) != Some(p.client_xid) {
            return false;
        }
        let (route, lost) = (usize::from(p.route), p.lost);
        if self.send(now, slot, msg) {
            let c = &self.counters.routes[route];
            RouteCounters::add(if lost { &c.resends } else { &c.output_waits }, 1);
            self.pending[slot as usize].lost = false;
            true
        } else {
            // Ahead of calls queued later, but after this iteration.
            self.queue(slot);
            false
        }
    }

    /// The worker could not find a queued call's origin (its connection
    /// is gone): a retransmission that joined it takes its place (and is
    /// asked for at the next [`next_resend`](Self::next_resend)), else
    /// the slot frees now, and a late reply is dropped as stray.
    pub fn abandon(&mut self, token: Token) {
        let p = &mut self.pending[token.0 as usize];
        if let Some(also) = p.also.take() {
            p.origin = Some(also);
            self.resend.push_back(token.0);
            return;
        }
        self.free_slot(token.0);
    }

    fn free_slot(&mut self, slot: u32) {
        let p = &mut self.pending[slot as usize];
        if p.state == State::Free {
            return;
        }
        if let State::Sent { conn } = p.state {
            let c = &mut self.backends[usize::from(p.route)].conns[usize::from(conn)];
            c.in_flight = c.in_flight.saturating_sub(1);
        }
        p.state = State::Free;
        p.origin = None;
        p.also = None;
        p.copied = false;
        if let Some(r) = p.drc.take() {
            self.drc.forget(r);
        }
        self.in_flight -= 1;
        self.free.push(slot);
    }

    /// Moves every backend connection on: connects, writes, reads; hands
    /// each reply and each timed-out call to `on_answer` with its origin.
    /// Returns the work done (0: nothing happened).
    pub fn poll(&mut self, now: Instant, mut on_answer: impl FnMut(O, Answer<'_>)) -> usize {
        let mut work = 0;
        if self.in_flight == 0 {
            return 0;
        }
        for route in 0..self.backends.len() {
            for c in 0..self.backends[route].conns.len() {
                work += self.poll_conn(now, route, c, &mut on_answer);
            }
        }
        work += self.resend_copies(now);
        if now >= self.next_sweep {
            self.next_sweep = now.saturating_add(SWEEP_EVERY);
            work += self.expire(now, &mut on_answer);
        }
        work
    }

    fn poll_conn(
        &mut self,
        now: Instant,
        route: usize,
        c: usize,
        on_answer: &mut impl FnMut(O, Answer<'_>),
    ) -> usize {
        let retry = self.config.reconnect_after;
        let counters = &self.counters.routes[route];
        let pending = &mut self.pending;
        let free = &mut self.free;
        let cache = &mut self.drc;
        let in_flight = &mut self.in_flight;
        let mut replies = 0;
        let conn = &mut self.backends[route].conns[c];
        let (event, written) = conn.poll(now, retry, |record| {
            RouteCounters::add(&counters.bytes_in, record.len() as u64 + 4);
            let Some(slot) = match_reply(pending, route, c, record) else {
                RouteCounters::add(&counters.stray_replies, 1);
                return;
            };
            let p = pending[slot as usize];
            record[..4].copy_from_slice(&p.client_xid.to_be_bytes());
            pending[slot as usize].state = State::Free;
            pending[slot as usize].origin = None;
            pending[slot as usize].also = None;
            pending[slot as usize].copied = false;
            if let Some(r) = pending[slot as usize].drc.take() {
                cache.complete(r, record, now);
            }
            *in_flight -= 1;
            free.push(slot);
            replies += 1;
            RouteCounters::add(&counters.replies, 1);
            counters.record_latency(now.saturating_duration_since(p.since).as_nanos() as u64);
            for origin in [p.origin, p.also].into_iter().flatten() {
                on_answer(
                    origin,
                    Answer::Reply {
                        message: record,
                        program: p.program,
                        version: p.version,
                        procedure: p.procedure,
                    },
                );
            }
        });
        conn.in_flight = conn.in_flight.saturating_sub(replies);
        RouteCounters::add(&counters.bytes_out, written as u64);
        if event == LinkEvent::Lost {
            RouteCounters::add(&counters.errors_connection, 1);
            // Everything that was on it goes again, on another
            // connection or on this one once it is back.
            for (slot, p) in self.pending[..self.high_water].iter_mut().enumerate() {
                if p.state == (State::Sent { conn: c as u16 }) && usize::from(p.route) == route {
                    p.state = State::Queued;
                    p.lost = true;
                    if p.copied {
                        self.resend_copied.push_back(slot as u32);
                    } else {
                        self.resend.push_back(slot as u32);
                    }
                }
            }
        }
        usize::from(event != LinkEvent::Quiet) + usize::from(written > 0) + replies as usize
    }

    /// Answers `Failed` for every call past its timeout.
    fn expire(&mut self, now: Instant, on_answer: &mut impl FnMut(O, Answer<'_>)) -> usize {
        let timeout = self.config.call_timeout;
        let mut work = 0;
        for slot in 0..self.high_water {
            let p = self.pending[slot];
            if p.state == State::Free || now.saturating_duration_since(p.since) < timeout {
                continue;
            }
            RouteCounters::add(
                &self.counters.routes[usize::from(p.route)].errors_timeout,
                1,
            );
            self.free_slot(slot as u32);
            work += 1;
            for origin in [p.origin, p.also].into_iter().flatten() {
                on_answer(origin, Answer::Failed { xid: p.client_xid });
            }
        }
        work
    }
}

/// The pending slot a reply record from connection `c` of `route`
/// answers, by the XID the call went out with.
fn match_reply<O: Copy>(
    pending: &[Pending<O>],
    route: usize,
    c: usize,
    record: &[u8],
) -> Option<u32> {
    if peek_direction(record) != Some(MessageType::Reply) {
        return None;
    }
    let xid = peek_xid(record)?;
    let slot = xid & 0xffff;
    let p = pending.get(slot as usize)?;
    let sent_here = p.state == (State::Sent { conn: c as u16 }) && usize::from(p.route) == route;
    (sent_here && u32::from(p.generation) == xid >> 16).then_some(slot)
}

/// The program number of a call message (its fourth word).
fn program_of(msg: &[u8]) -> Option<u32> {
    if peek_direction(msg) != Some(MessageType::Call) {
        return None;
    }
    let w = msg.get(12..16)?;
    Some(u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
}
