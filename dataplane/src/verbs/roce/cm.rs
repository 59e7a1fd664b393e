//! The connection manager: the IB CM MADs on QP1 (REQ/REP/RTU/REJ/DREQ/
//! DREP/MRA) that set connections up and tear them down the way rdma_cm
//! does over RoCEv2, and their retransmission timers.
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::io::Tx;
use super::random::random_u64;
use super::rc::{ConnRef, PeerPath, RcQp};
use crate::wire::ibcm::{
    self, gsi_packet, ipv4_mapped_gid, CmMad, CmMessage, CmPath, CommIds, Dreq, Mra, RdmaCmHeader,
    Rej, Req, MAD_LEN, RDMA_CM_HEADER_LEN,
};
use crate::wire::roce::seg::Mtu;
use crate::wire::roce::Psn;

/// The device's queue pairs as the connection manager reaches them
/// (they live in shards it does not know).
pub(super) trait QueuePairs {
    /// Runs `f` on queue pair `qpn`, if it exists.
    fn with<R>(&self, qpn: u32, f: impl FnOnce(&mut RcQp) -> R) -> Option<R>;
    /// Calls `f` with every queue pair's number.
    fn for_each_qpn(&self, f: impl FnMut(u32));
}

/// User private data that fits a REQ after the 36-byte rdma_cm header.
pub const MAX_REQ_PRIVATE_DATA: usize = ibcm::private_len::REQ - RDMA_CM_HEADER_LEN;

/// Interval between REQ (and DREQ) retransmissions. rdma_cm waits
/// 4.096 us x 2^20 (about 4.3 s); a shorter wait recovers a lost MAD on a
/// LAN faster and stays far above any loopback/LAN round trip. A peer that
/// needs longer answers with an MRA.
pub(super) const CM_RETRY: Duration = Duration::from_millis(500);
/// DREQ retransmissions before the connection is forgotten.
const DREQ_RETRIES: u8 = 3;
/// REP retransmissions (every [`CM_RETRY`]) while the passive side waits
/// for the RTU; then the connection fails (REJ "timeout", QP to error).
/// Without the limit a peer that never completes the handshake would hold
/// an accepted connection, and its memory, forever.
pub(super) const REP_RETRIES: u8 = 3;
/// Connection requests a listener queues before rejecting.
const LISTEN_BACKLOG: usize = 1024;
/// Connections one peer address may have half-open at once (REQ queued
/// or held, or REP sent and no RTU yet). A client opens its connections
/// one after another, or a few at once (the Linux NFS client: two); a
/// peer past this is flooding.
pub(super) const MAX_HALF_OPEN_PER_PEER: usize = 16;
/// Connections a device has between the application's accept and the RTU
/// (requests held by the application, REPs awaiting their RTU). Those
/// are the half-open connections that cost memory (a queue pair and its
/// buffers); past this many, requests wait in the queue, which costs a
/// few hundred bytes each. With [`MAX_HALF_OPEN_PER_PEER`] and the queue's
/// bound this caps what a flood of requests from any number of addresses
/// can take, and the REP retries free a slot within about two seconds.
pub(super) const MAX_ACCEPTING: usize = 32;
/// How long an address that left a REP unanswered stays suspect: its
/// requests rank behind everyone else's for an accepting place, and its
/// REPs are the first given up when a request that ranks higher waits
/// for one ([`Cm::make_room`]). A requester that completes a handshake is
/// cleared at once.
pub(super) const SUSPECT_FOR: Duration = Duration::from_secs(30);
/// Suspect addresses remembered at once (about 30 bytes each): a flood
/// from more addresses than this keeps only the fair share of
/// [`Cm::take_request`] against the rest.
const MAX_SUSPECTS: usize = 4096;
/// How long a request waits in the queue for the application. Its sender
/// was told (MRA) to wait about 17 s; past this it gets a REJ "timeout"
/// rather than a REP it may no longer expect.
pub(super) const QUEUE_TIMEOUT: Duration = Duration::from_secs(15);

/// Private data as handed to the application: IB CM carries fixed-size
/// areas with no length, so trailing zero bytes are removed.
pub(super) fn trim_private(pd: &[u8]) -> Vec<u8> {
    let end = pd.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    pd[..end].to_vec()
}

/// A connection request waiting in a listener's queue.
#[derive(Debug, Clone)]
pub(super) struct PendingReq {
    pub(super) peer_ip: Ipv4Addr,
    pub(super) remote_comm_id: u32,
    pub(super) remote_qpn: u32,
    pub(super) psn: Psn,
    pub(super) mtu: Mtu,
    pub(super) tid: u64,
    /// The requester's responder resources (its capacity for our Reads).
    pub(super) responder_resources: u8,
    pub(super) private: Vec<u8>,
    /// When it was queued (for [`QUEUE_TIMEOUT`]).
    pub(super) queued_at: Instant,
}

#[derive(Debug)]
pub(super) enum ConnState {
    /// Active: REQ sent, waiting for REP (or REJ / MRA).
    ReqSent,
    /// Passive: REP sent, waiting for the RTU (or the first packet of the
    /// peer's QP, which implies it); the REP is resent at `next`, `left`
    /// more times, then the connection fails.
    RepSent { next: Instant, left: u8 },
    /// Active: REP received, RTU sent. Passive: RTU (or data) received.
    Established,
    /// Active: the peer refused, with its private data.
    Rejected(Vec<u8>),
    /// DREQ sent, waiting for DREP.
    DreqSent { next: Instant, left: u8 },
    /// Active: established and already torn down by the peer before
    /// `connect` saw it (kept until `connect` returns the QP).
    Closed,
}

#[derive(Debug)]
pub(super) struct ConnRec {
    pub(super) local_comm_id: u32,
    pub(super) remote_comm_id: u32,
    pub(super) peer_ip: Ipv4Addr,
    pub(super) qpn: u32,
    pub(super) remote_qpn: u32,
    pub(super) active: bool,
    pub(super) state: ConnState,
    /// Last REQ (active) or REP (passive), for retransmission.
    pub(super) mad: Box<[u8; MAD_LEN]>,
    /// The peer's REP private data (active).
    pub(super) peer_private: Vec<u8>,
    /// Active: MRA received, do not retransmit the REQ before this.
    pub(super) quiet_until: Option<Instant>,
    /// Active: `connect` has returned this connection.
    pub(super) claimed: bool,
}

#[derive(Default)]
pub(super) struct Cm {
    pub(super) listeners: HashMap<u16, VecDeque<PendingReq>>,
    pub(super) conns: HashMap<u32, ConnRec>,
    /// Requests the application took with `Listener::accept` and has not
    /// answered yet, as (peer, its comm id): a REQ the peer resends
    /// meanwhile gets an MRA, not a second queue entry (else one client
    /// would be accepted twice).
    pub(super) held: Vec<(Ipv4Addr, u32)>,
    /// Addresses that left a REP unanswered, until when they are suspect
    /// ([`SUSPECT_FOR`]).
    pub(super) suspects: HashMap<Ipv4Addr, Instant>,
}

/// Where a request stands in the line for an accepting place: requests of
/// suspect addresses last, then by how many places their address holds.
/// Lower goes first.
type Rank = (bool, usize);

impl Cm {
    /// Forgets a held request (answered or dropped).
    pub(super) fn release_held(&mut self, peer_ip: Ipv4Addr, remote_comm_id: u32) {
        self.held
            .retain(|&(ip, id)| !(ip == peer_ip && id == remote_comm_id));
    }

    /// Connections between accept and RTU from `peer` (any address for
    /// `None`): requests the application holds, REPs awaiting the RTU.
    pub(super) fn accepting(&self, peer: Option<Ipv4Addr>) -> usize {
        let from = |ip: Ipv4Addr| peer.is_none_or(|p| p == ip);
        self.held.iter().filter(|(ip, _)| from(*ip)).count()
            + self
                .conns
                .values()
                .filter(|c| {
                    !c.active && from(c.peer_ip) && matches!(c.state, ConnState::RepSent { .. })
                })
                .count()
    }

    /// Accepting places held per address (see [`Cm::accepting`]), counted
    /// in one pass.
    fn accepting_by_peer(&self) -> HashMap<Ipv4Addr, usize> {
        let mut by_peer: HashMap<Ipv4Addr, usize> = HashMap::new();
        for (ip, _) in &self.held {
            *by_peer.entry(*ip).or_default() += 1;
        }
        for c in self.conns.values() {
            if !c.active && matches!(c.state, ConnState::RepSent { .. }) {
                *by_peer.entry(c.peer_ip).or_default() += 1;
            }
        }
        by_peer
    }

    /// Whether `peer` left a REP unanswered less than [`SUSPECT_FOR`] ago.
    pub(super) fn is_suspect(&self, peer: Ipv4Addr, now: Instant) -> bool {
        self.suspects.get(&peer).is_some_and(|&until| now < until)
    }

    /// Marks `peer` suspect for [`SUSPECT_FOR`] from `now`, within
    /// [`MAX_SUSPECTS`] addresses (expired ones are forgotten first).
    fn suspect(&mut self, peer: Ipv4Addr, now: Instant) {
        if self.suspects.len() >= MAX_SUSPECTS && !self.suspects.contains_key(&peer) {
            self.suspects.retain(|_, until| now < *until);
            if self.suspects.len() >= MAX_SUSPECTS {
                return;
            }
        }
        self.suspects.insert(peer, now + SUSPECT_FOR);
    }

    /// The request of listener `port` that an accepting place goes to
    /// next, as its index and rank: the first, in turn order, of the best
    /// rank.
    fn next_in_line(
        &self,
        port: u16,
        places: &HashMap<Ipv4Addr, usize>,
        now: Instant,
    ) -> Option<(usize, Rank)> {
        let mut best: Option<(usize, Rank)> = None;
        for (i, p) in self.listeners.get(&port)?.iter().enumerate() {
            let rank = (
                self.is_suspect(p.peer_ip, now),
                places.get(&p.peer_ip).copied().unwrap_or(0),
            );
            if best.is_none_or(|(_, b)| rank < b) {
                best = Some((i, rank));
                if rank == (false, 0) {
                    break;
                }
            }
        }
        best
    }

    /// When every accepting place is taken and a request waits, gives up
    /// the REP that least deserves its place, if one deserves it less than
    /// the request waiting: a REP the peer left unanswered past a
    /// retransmission (on a LAN an RTU follows a REP within a millisecond)
    /// or sent to a suspect address, whose address ranks no better than
    /// the waiting request's would with one place fewer. The REP is made
    /// due for its last retry, so the next [`Cm::timers`] run refuses it
    /// (REJ "timeout"), fails its queue pair and marks its address
    /// suspect. True when one was given up.
    ///
    /// Without this, the places of a flood of requests that never finish
    /// were freed only by the REP retries (about two seconds), and a good
    /// client waited for them in turn with every flooding address.
    pub(super) fn make_room(&mut self, port: u16, now: Instant) -> bool {
        let places = self.accepting_by_peer();
        if places.values().sum::<usize>() < MAX_ACCEPTING {
            return false;
        }
        let Some((_, waiting)) = self.next_in_line(port, &places, now) else {
            return false;
        };
        let victim = self
            .conns
            .values()
            .filter_map(|c| match c.state {
                ConnState::RepSent { next, left } if !c.active => {
                    let suspect = self.is_suspect(c.peer_ip, now);
                    let overdue = left < REP_RETRIES;
                    let held = places.get(&c.peer_ip).copied().unwrap_or(1);
                    let rank: Rank = (suspect, held - 1);
                    // Worst rank first, then the longest unanswered.
                    ((suspect || overdue) && rank >= waiting)
                        .then_some(((rank, std::cmp::Reverse(next)), c.local_comm_id))
                }
                _ => None,
            })
            .max_by_key(|(key, _)| *key)
            .map(|(_, id)| id);
        let Some(rec) = victim.and_then(|id| self.conns.get_mut(&id)) else {
            return false;
        };
        rec.state = ConnState::RepSent { next: now, left: 0 };
        true
    }

    /// The next request of listener `port` for the application, now held:
    /// none while [`MAX_ACCEPTING`] connections are being accepted;
    /// otherwise the first request, in turn order, of the best rank
    /// ([`Rank`]: addresses that are not suspect, then those with the
    /// fewest connections being accepted), so that requests from flooding
    /// addresses cannot keep another address waiting behind them.
    pub(super) fn take_request(&mut self, port: u16, now: Instant) -> Option<PendingReq> {
        let places = self.accepting_by_peer();
        if places.values().sum::<usize>() >= MAX_ACCEPTING {
            return None;
        }
        let (i, _) = self.next_in_line(port, &places, now)?;
        let queue = self.listeners.get_mut(&port)?;
        let req = queue.remove(i)?;
        // Addresses take turns: the rest of this address's requests go
        // behind everyone else's (in their order), so an address whose
        // request was refused does not come straight back ahead of the
        // others.
        let (theirs, others): (VecDeque<_>, VecDeque<_>) =
            queue.drain(..).partition(|p| p.peer_ip == req.peer_ip);
        queue.extend(others);
        queue.extend(theirs);
        self.held.push((req.peer_ip, req.remote_comm_id));
        Some(req)
    }

    /// Makes room in listener `port`'s full queue for a request from
    /// `peer`: when another address has more requests queued than `peer`
    /// would with this one, its youngest is refused (REJ "no resources").
    /// False when `peer` already has its fair share.
    fn evict_for(&mut self, port: u16, peer: Ipv4Addr, tx: &mut Tx, gsi_psn: &mut Psn) -> bool {
        let Some(queue) = self.listeners.get_mut(&port) else {
            return false;
        };
        let mut queued: HashMap<Ipv4Addr, usize> = HashMap::new();
        for p in queue.iter() {
            *queued.entry(p.peer_ip).or_default() += 1;
        }
        let mine = queued.get(&peer).copied().unwrap_or(0);
        let Some((&heaviest, &most)) = queued.iter().max_by_key(|(_, n)| **n) else {
            return false;
        };
        if most <= mine + 1 {
            return false;
        }
        let Some(i) = queue.iter().rposition(|p| p.peer_ip == heaviest) else {
            return false;
        };
        if let Some(p) = queue.remove(i) {
            let reason = ibcm::rej_reason::NO_RESOURCES;
            send_rej(
                tx,
                gsi_psn,
                p.peer_ip,
                p.tid,
                0,
                p.remote_comm_id,
                reason,
                &[],
            );
        }
        true
    }

    /// Refuses (REJ "timeout") the queued requests older than
    /// [`QUEUE_TIMEOUT`].
    fn expire_queued(&mut self, now: Instant, tx: &mut Tx, gsi_psn: &mut Psn) {
        for queue in self.listeners.values_mut() {
            while let Some(i) = queue
                .iter()
                .position(|p| now.saturating_duration_since(p.queued_at) >= QUEUE_TIMEOUT)
            {
                if let Some(p) = queue.remove(i) {
                    let reason = ibcm::rej_reason::TIMEOUT;
                    send_rej(
                        tx,
                        gsi_psn,
                        p.peer_ip,
                        p.tid,
                        0,
                        p.remote_comm_id,
                        reason,
                        &[],
                    );
                }
            }
        }
    }
}

/// The device counters the connection manager adds to.
#[derive(Clone, Copy)]
pub(super) struct CmCounters<'a> {
    /// REQs whose path does not name their sender.
    pub spoofed: &'a AtomicU64,
    /// REQs refused for too many half-open connections of their peer.
    pub half_open_refused: &'a AtomicU64,
}

pub(super) fn send_mad(tx: &mut Tx, gsi_psn: &mut Psn, dst: Ipv4Addr, port: u16, mad: &[u8]) {
    let psn = *gsi_psn;
    *gsi_psn = psn.next();
    let p = gsi_packet(psn, mad);
    let slot = tx.slot();
    if let Ok(n) = p.emit(slot) {
        tx.commit(n, SocketAddrV4::new(dst, port), None);
    }
}

pub(super) fn emit_mad(mad: &CmMad<'_>) -> Option<[u8; MAD_LEN]> {
    let mut b = [0u8; MAD_LEN];
    mad.emit(&mut b).ok()?;
    Some(b)
}

fn send_dreq(tx: &mut Tx, gsi_psn: &mut Psn, rec: &ConnRec) {
    let port = tx.local.port();
    // The TID only pairs the DREP with this DREQ; without randomness (an
    // error nobody on this path could act on) the comm ids serve.
    let tid =
        random_u64().unwrap_or(u64::from(rec.local_comm_id) << 32 | u64::from(rec.remote_comm_id));
    let m = CmMad::new(
        tid,
        CmMessage::Dreq(Dreq {
            local_comm_id: rec.local_comm_id,
            remote_comm_id: rec.remote_comm_id,
            remote_qpn: rec.remote_qpn,
            private_data: &[],
        }),
    );
    if let Some(b) = emit_mad(&m) {
        send_mad(tx, gsi_psn, rec.peer_ip, port, &b);
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn send_rej(
    tx: &mut Tx,
    gsi_psn: &mut Psn,
    dst: Ipv4Addr,
    tid: u64,
    local_comm_id: u32,
    remote_comm_id: u32,
    reason: u16,
    private_data: &[u8],
) {
    let port = tx.local.port();
    let m = CmMad::new(
        tid,
        CmMessage::Rej(Rej {
            local_comm_id,
            remote_comm_id,
            message_rejected: 0,
            reject_info_len: 0,
            reason,
            ari: [0; 72],
            private_data,
        }),
    );
    if let Some(b) = emit_mad(&m) {
        send_mad(tx, gsi_psn, dst, port, &b);
    }
}

impl Cm {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_mad(
        &mut self,
        payload: &[u8],
        src: SocketAddrV4,
        qps: &impl QueuePairs,
        tx: &mut Tx,
        gsi_psn: &mut Psn,
        now: Instant,
        counters: CmCounters<'_>,
    ) {
        let Ok(mad) = CmMad::parse(payload) else {
            return;
        };
        let port = tx.local.port();
        match mad.message {
            CmMessage::Req(r) => {
                // The REP goes to the address in the REQ's path: it must be
                // the sender's, or anyone could aim our REPs (and bind a
                // connection) at a third party.
                if ibcm::gid_to_ip(r.primary_path.local_gid) != IpAddr::V4(*src.ip()) {
                    counters.spoofed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                let refused = self.on_req(&r, mad.tid, src, tx, gsi_psn, now);
                counters
                    .half_open_refused
                    .fetch_add(refused, Ordering::Relaxed);
            }
            CmMessage::Rep(r) => {
                let Some(rec) = self.conns.get_mut(&r.remote_comm_id) else {
                    return;
                };
                if !rec.active || rec.peer_ip != *src.ip() {
                    return;
                }
                match rec.state {
                    ConnState::ReqSent => {
                        if r.local_qpn <= 1 || r.local_qpn > 0xFF_FFFF {
                            send_rej(
                                tx,
                                gsi_psn,
                                rec.peer_ip,
                                mad.tid,
                                rec.local_comm_id,
                                r.local_comm_id,
                                ibcm::rej_reason::NO_QP,
                                &[],
                            );
                            rec.state = ConnState::Rejected(Vec::new());
                            return;
                        }
                        rec.remote_comm_id = r.local_comm_id;
                        rec.remote_qpn = r.local_qpn;
                        rec.peer_private = trim_private(r.private_data);
                        qps.with(rec.qpn, |qp| {
                            // We send from the PSN the REP announced (the
                            // first the peer expects); the peer sends from
                            // the one our REQ announced.
                            let mtu = qp.mtu;
                            qp.bind(
                                PeerPath {
                                    addr: SocketAddrV4::new(rec.peer_ip, port),
                                    qpn: r.local_qpn,
                                },
                                r.starting_psn,
                                ConnRef {
                                    local_comm_id: rec.local_comm_id,
                                },
                                mtu,
                                r.responder_resources,
                            );
                        });
                        rec.state = ConnState::Established;
                        send_rtu(tx, gsi_psn, rec, mad.tid);
                    }
                    // Our RTU was lost: the peer repeats its REP.
                    ConnState::Established => send_rtu(tx, gsi_psn, rec, mad.tid),
                    _ => {}
                }
            }
            CmMessage::Rtu(ids) => {
                if let Some(rec) = self.conns.get_mut(&ids.remote_comm_id) {
                    if !rec.active
                        && rec.peer_ip == *src.ip()
                        && rec.remote_comm_id == ids.local_comm_id
                        && matches!(rec.state, ConnState::RepSent { .. })
                    {
                        rec.state = ConnState::Established;
                        qps.with(rec.qpn, |qp| qp.awaiting_rtu = false);
                        let peer = rec.peer_ip;
                        self.suspects.remove(&peer);
                    }
                }
            }
            CmMessage::Rej(j) => {
                let Some(rec) = self.conns.get_mut(&j.remote_comm_id) else {
                    return;
                };
                if rec.peer_ip != *src.ip() {
                    return;
                }
                match rec.state {
                    ConnState::ReqSent => {
                        rec.state = ConnState::Rejected(trim_private(j.private_data))
                    }
                    _ => {
                        qps.with(rec.qpn, |qp| qp.enter_error(None, false));
                        if rec.active && !rec.claimed {
                            rec.state = ConnState::Closed;
                        } else {
                            self.conns.remove(&j.remote_comm_id);
                        }
                    }
                }
            }
            CmMessage::Mra(m) => {
                if let Some(rec) = self.conns.get_mut(&m.remote_comm_id) {
                    if matches!(rec.state, ConnState::ReqSent) && rec.peer_ip == *src.ip() {
                        // Service timeout: 4.096 us x 2^t, plus our own.
                        let us = 4.096 * f64::from(1u32 << m.service_timeout.min(31));
                        rec.quiet_until =
                            Some(now + CM_RETRY + Duration::from_micros(us.min(6e7) as u64));
                    }
                }
            }
            CmMessage::Dreq(d) => {
                let mut drep_ids = (0, d.local_comm_id);
                if let Some(rec) = self.conns.get_mut(&d.remote_comm_id) {
                    if rec.active && matches!(rec.state, ConnState::ReqSent) {
                        // The peer accepted (it sent a REP, which has not
                        // reached us yet) and is already disconnecting.
                        // Closing now would hand `connect` a connection
                        // without the REP's QPN and private data; the DREQ
                        // is dropped unanswered instead, as the IB CM does
                        // outside the established states, and the peer
                        // repeats it (`DreqSent` retries) after the REP.
                        return;
                    }
                    if rec.peer_ip == *src.ip() && d.remote_qpn == rec.qpn {
                        qps.with(rec.qpn, |qp| {
                            qp.peer_disconnected = true;
                            qp.enter_error(None, false)
                        });
                        drep_ids = (rec.local_comm_id, rec.remote_comm_id);
                        if rec.active && !rec.claimed {
                            rec.state = ConnState::Closed;
                        } else {
                            self.conns.remove(&d.remote_comm_id);
                        }
                    }
                }
                let m = CmMad::new(
                    mad.tid,
                    CmMessage::Drep(CommIds {
                        local_comm_id: drep_ids.0,
                        remote_comm_id: drep_ids.1,
                        private_data: &[],
                    }),
                );
                if let Some(b) = emit_mad(&m) {
                    send_mad(tx, gsi_psn, *src.ip(), port, &b);
                }
            }
            CmMessage::Drep(ids) => {
                if let Some(rec) = self.conns.get(&ids.remote_comm_id) {
                    if matches!(rec.state, ConnState::DreqSent { .. }) {
                        self.conns.remove(&ids.remote_comm_id);
                    }
                }
            }
        }
    }

    /// Answers or queues a REQ. Returns how many requests were refused
    /// for want of room (this one, for too many half-open connections of
    /// its peer, or a queued one of a heavier address making room for it).
    fn on_req(
        &mut self,
        r: &Req<'_>,
        tid: u64,
        src: SocketAddrV4,
        tx: &mut Tx,
        gsi_psn: &mut Psn,
        now: Instant,
    ) -> u64 {
        let port = tx.local.port();
        // Checked against the path GID by the caller.
        let peer_ip = *src.ip();
        // A repeated REQ: answer with our REP again, or MRA while the
        // application has not decided yet.
        if let Some(rec) = self
            .conns
            .values()
            .find(|c| !c.active && c.peer_ip == peer_ip && c.remote_comm_id == r.local_comm_id)
        {
            if matches!(
                rec.state,
                ConnState::Established | ConnState::RepSent { .. }
            ) {
                let mad = *rec.mad;
                send_mad(tx, gsi_psn, peer_ip, port, &mad);
            }
            return 0;
        }
        let pending = self.listeners.values().any(|q| {
            q.iter()
                .any(|p| p.peer_ip == peer_ip && p.remote_comm_id == r.local_comm_id)
        }) || self.held.contains(&(peer_ip, r.local_comm_id));
        if pending {
            let m = CmMad::new(
                tid,
                CmMessage::Mra(Mra {
                    local_comm_id: 0,
                    remote_comm_id: r.local_comm_id,
                    message_mraed: 0,
                    // 4.096 us x 2^22: about 17 s.
                    service_timeout: 22,
                    private_data: &[],
                }),
            );
            if let Some(b) = emit_mad(&m) {
                send_mad(tx, gsi_psn, peer_ip, port, &b);
            }
            return 0;
        }
        let reject = |tx: &mut Tx, gsi_psn: &mut Psn, reason| {
            send_rej(tx, gsi_psn, peer_ip, tid, 0, r.local_comm_id, reason, &[]);
        };
        let listener =
            ibcm::tcp_port_of_service_id(r.service_id).filter(|p| self.listeners.contains_key(p));
        let Some(listener) = listener else {
            reject(tx, gsi_psn, ibcm::rej_reason::INVALID_SERVICE_ID);
            return 0;
        };
        if r.transport_type != 0 || r.local_qpn <= 1 || r.local_qpn > 0xFF_FFFF {
            reject(tx, gsi_psn, ibcm::rej_reason::NO_QP);
            return 0;
        }
        let Ok((_hdr, user)) = RdmaCmHeader::parse(r.private_data) else {
            reject(tx, gsi_psn, ibcm::rej_reason::CONSUMER_DEFINED);
            return 0;
        };
        // A connection costs its memory from the application's accept on,
        // and a peer that never sends its RTU would hold it until the REP
        // retries run out: a flood of REQs from one address (any source
        // ports) must not take every connection a server can hold, so
        // each address gets a bounded number half-open at once. Counted
        // by the caller.
        let half_open = self.accepting(Some(peer_ip))
            + self
                .listeners
                .values()
                .map(|q| q.iter().filter(|p| p.peer_ip == peer_ip).count())
                .sum::<usize>();
        if half_open >= MAX_HALF_OPEN_PER_PEER {
            reject(tx, gsi_psn, ibcm::rej_reason::NO_RESOURCES);
            return 1;
        }
        // A full queue makes room for an address with fewer requests in
        // it than the heaviest one's (refusing the heaviest one's
        // youngest), so a flood cannot fill the queue against others.
        let mut evicted = 0;
        if self.listeners.get(&listener).map_or(0, VecDeque::len) >= LISTEN_BACKLOG {
            if !self.evict_for(listener, peer_ip, tx, gsi_psn) {
                reject(tx, gsi_psn, ibcm::rej_reason::NO_RESOURCES);
                return 1;
            }
            evicted = 1;
        }
        let Some(queue) = self.listeners.get_mut(&listener) else {
            return 0;
        };
        queue.push_back(PendingReq {
            peer_ip,
            remote_comm_id: r.local_comm_id,
            remote_qpn: r.local_qpn,
            psn: r.starting_psn,
            mtu: r.path_mtu,
            tid,
            responder_resources: r.responder_resources,
            private: trim_private(user),
            queued_at: now,
        });
        evicted
    }
}

fn send_rtu(tx: &mut Tx, gsi_psn: &mut Psn, rec: &ConnRec, tid: u64) {
    let port = tx.local.port();
    let m = CmMad::new(
        tid,
        CmMessage::Rtu(CommIds {
            local_comm_id: rec.local_comm_id,
            remote_comm_id: rec.remote_comm_id,
            private_data: &[],
        }),
    );
    if let Some(b) = emit_mad(&m) {
        send_mad(tx, gsi_psn, rec.peer_ip, port, &b);
    }
}

pub(super) fn ca_guid(ip: Ipv4Addr) -> u64 {
    0x0200_00FF_FE00_0000 | u64::from(u32::from(ip) & 0x00FF_FFFF)
}

pub(super) fn cm_path(local: Ipv4Addr, remote: Ipv4Addr, ack_code: u8) -> CmPath {
    CmPath {
        local_lid: 0xFFFF,
        remote_lid: 0xFFFF,
        local_gid: ipv4_mapped_gid(local),
        remote_gid: ipv4_mapped_gid(remote),
        flow_label: 0,
        packet_rate: 0,
        traffic_class: 0,
        hop_limit: 64,
        sl: 0,
        subnet_local: false,
        local_ack_timeout: ack_code,
    }
}

impl Cm {
    /// CM timers: DREQs for QPs that entered the error state (looked for
    /// only with `scan_dreqs`: a shard says when one of its queue pairs
    /// owes one), DREQ retries, and REP retries while a passive connection
    /// awaits its RTU.
    pub(super) fn timers(
        &mut self,
        now: Instant,
        qps: &impl QueuePairs,
        scan_dreqs: bool,
        tx: &mut Tx,
        gsi_psn: &mut Psn,
    ) {
        // Collected first: the records are changed below.
        let mut owing = Vec::new();
        if scan_dreqs {
            qps.for_each_qpn(|qpn| {
                let conn = qps.with(qpn, |qp| {
                    let due = std::mem::take(&mut qp.dreq_due);
                    qp.conn.filter(|_| due)
                });
                owing.extend(conn.flatten());
            });
        }
        for c in owing {
            if let Some(rec) = self.conns.get_mut(&c.local_comm_id) {
                rec.state = ConnState::DreqSent {
                    next: now + CM_RETRY,
                    left: DREQ_RETRIES,
                };
                send_dreq(tx, gsi_psn, rec);
            }
        }
        self.expire_queued(now, tx, gsi_psn);
        // Every record whose retries ran out in this run is forgotten in
        // this run (one at a time would REJ the others again each tick).
        let (mut answered, mut unanswered) = (Vec::new(), Vec::new());
        self.conns.retain(|_, rec| {
            if let ConnState::RepSent { next, left } = &mut rec.state {
                if now >= *next {
                    // A packet of the peer's QP stands for the RTU.
                    if qps.with(rec.qpn, |qp| !qp.awaiting_rtu) == Some(true) {
                        answered.push(rec.peer_ip);
                        rec.state = ConnState::Established;
                        return true;
                    }
                    if *left == 0 {
                        // No RTU and no packet: the requester is gone or
                        // never meant to finish. Tell it and fail the QP
                        // (its owner sees the flush and drops it).
                        send_rej(
                            tx,
                            gsi_psn,
                            rec.peer_ip,
                            0,
                            rec.local_comm_id,
                            rec.remote_comm_id,
                            ibcm::rej_reason::TIMEOUT,
                            &[],
                        );
                        unanswered.push(rec.peer_ip);
                        qps.with(rec.qpn, |qp| {
                            qp.awaiting_rtu = false;
                            qp.enter_error(None, false);
                        });
                        return false;
                    }
                    *left -= 1;
                    *next = now + CM_RETRY;
                    let (peer, port) = (rec.peer_ip, tx.local.port());
                    send_mad(tx, gsi_psn, peer, port, &rec.mad[..]);
                }
                return true;
            }
            if let ConnState::DreqSent { next, left } = &mut rec.state {
                if now >= *next {
                    if *left == 0 {
                        return false;
                    }
                    *left -= 1;
                    *next = now + CM_RETRY;
                    send_dreq(tx, gsi_psn, rec);
                }
            }
            true
        });
        for peer in answered {
            self.suspects.remove(&peer);
        }
        for peer in unanswered {
            self.suspect(peer, now);
        }
    }
}
