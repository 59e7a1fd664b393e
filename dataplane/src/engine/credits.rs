//! Grants backed by a shared receive queue (docs/WORKER.md, "Shared
//! receives").
//!
//! With receives of its own, a connection backs its grant with as many
//! posted buffers, for life. On a worker's shared receive queue the
//! buffers are the worker's, and every connection's grant must still be
//! backed: a Linux requester does not retry a Send that finds no receive
//! (xprtrdma connects with an RNR retry count of 0), so a receive missing
//! when a granted call arrives ends its connection. RFC 5666 s3.3 lets a
//! grant go up or down in any reply; the difficulty is that a requester
//! acts on a lowered grant only once it has seen it, and the responder
//! never learns when that is.
//!
//! What bounds the requester exactly is the order of the connection:
//! replies arrive in the order they were sent, and after it has processed
//! `p` of them it sends at most `p + g_p` messages in all (`g_p` the
//! grant in the `p`-th; it may have processed every reply sent so far).
//! So the messages it can ever have sent, as far as the responder knows,
//! are the *horizon* `max over sent replies p of (p + g_p)`, and those
//! still to arrive are `horizon - received`. That many receives are
//! reserved in the worker's [`CreditPool`] for the connection, and never
//! fewer than one, so that a connection with nothing in flight can always
//! be granted the credit RFC 5666 requires. A message that has arrived is
//! copied out and its buffer posted again at once, unless its call waits
//! for a responder slot: then its receive stays reserved until it is
//! given back. The grant of a reply is what the requester asked for in
//! its call (up to `credits`), cut to the connection's fair share of the
//! pool (its receives over the connections on it, at least 2) and to
//! what the pool can still back.
//!
//! A grant that falls frees receives only as the messages the earlier,
//! larger grants allowed arrive, so a connection that goes quiet keeps
//! its last grant reserved: the fair share bounds what that costs the
//! others.
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::Arc;

/// Receives reserved for every connection on the queue, even with
/// nothing in flight.
pub const CREDIT_FLOOR: u32 = 1;

/// The receives of one shared receive queue, as credits that connections
/// reserve for their grants. Shared by the connections of one worker (one
/// thread); atomics keep it `Sync` without a lock.
#[derive(Debug)]
pub struct CreditPool {
    total: u32,
    /// `total` minus every reservation; negative only while a peer that
    /// sent beyond its grant holds more than it was backed for.
    free: AtomicI64,
    /// Connections reserving from it.
    members: AtomicU32,
}

impl CreditPool {
    /// A pool of `total` receives.
    pub fn new(total: u32) -> CreditPool {
        CreditPool {
            total,
            free: AtomicI64::new(i64::from(total)),
            members: AtomicU32::new(0),
        }
    }

    /// What one connection's grant may reach: the receives over the
    /// connections on the pool, at least 2.
    pub fn fair_share(&self) -> u32 {
        let n = self.members.load(Ordering::Relaxed).max(1);
        (self.total / n).max(2)
    }

    /// Receives in all.
    pub fn total(&self) -> u32 {
        self.total
    }

    /// Receives reserved by no connection.
    pub fn available(&self) -> u32 {
        self.free
            .load(Ordering::Relaxed)
            .clamp(0, i64::from(self.total)) as u32
    }

    /// Receives reserved.
    pub fn reserved(&self) -> u32 {
        (i64::from(self.total) - self.free.load(Ordering::Relaxed)).max(0) as u32
    }

    /// Reserves `n` receives if that many are free.
    fn try_take(&self, n: u32) -> bool {
        let n = i64::from(n);
        self.free
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| {
                (f >= n).then_some(f - n)
            })
            .is_ok()
    }

    /// Reserves `n` receives whether or not they are free.
    fn take_anyway(&self, n: u32) {
        self.free.fetch_sub(i64::from(n), Ordering::Relaxed);
    }

    fn give(&self, n: u32) {
        self.free.fetch_add(i64::from(n), Ordering::Relaxed);
    }
}

/// One connection's side of a [`CreditPool`].
#[derive(Debug)]
pub(super) struct Backing {
    pool: Arc<CreditPool>,
    /// Messages that carried a grant (replies and RDMA_ERRORs) sent.
    sent: u64,
    /// Messages received.
    received: u64,
    /// The most messages the peer may have sent in all (module docs).
    horizon: u64,
    /// Received messages still holding their receive (parked calls).
    held: u32,
    /// Messages of transmission groups beyond their first (rtrext s4.3):
    /// a group of n takes n credits and one answer returns them all, so
    /// each such message moves the peer's reckoning on like an answer.
    extra: u64,
    /// Receives reserved in the pool.
    reserved: u32,
}

impl Backing {
    /// Reserves the floor; `None` when the pool has no receive left for
    /// one more connection. Before any reply the peer may send one
    /// message (RFC 8166 s4.3.1: a requester starts with one credit).
    pub(super) fn new(pool: Arc<CreditPool>) -> Option<Backing> {
        if !pool.try_take(CREDIT_FLOOR) {
            return None;
        }
        pool.members.fetch_add(1, Ordering::Relaxed);
        Some(Backing {
            pool,
            sent: 0,
            received: 0,
            horizon: 1,
            held: 0,
            extra: 0,
            reserved: CREDIT_FLOOR,
        })
    }

    /// What the reservation must be with horizon `horizon`.
    fn needed_with(&self, horizon: u64) -> u32 {
        let ahead = horizon.saturating_sub(self.received);
        (ahead.min(u64::from(u32::MAX)) as u32).max(CREDIT_FLOOR) + self.held
    }

    /// Moves the reservation to what is needed (a larger one is taken
    /// whether or not the pool has it: see [`Backing::received`]).
    fn settle(&mut self) {
        let want = self.needed_with(self.horizon);
        if want > self.reserved {
            self.pool.take_anyway(want - self.reserved);
        } else {
            self.pool.give(self.reserved - want);
        }
        self.reserved = want;
    }

    /// A message arrived in a shared receive. False if the peer sent
    /// beyond every grant it was given (its receive was not reserved: the
    /// connection then takes what it needs past the pool's free receives,
    /// at the expense of the grants of other connections, until it
    /// closes).
    pub(super) fn received(&mut self, hold: bool) -> bool {
        self.received += 1;
        self.held += u32::from(hold);
        self.settle();
        self.received <= self.horizon
    }

    /// One more message will come that no grant covers (the reply to a
    /// call of ours). It also lets one more call be in progress in
    /// [`Backing::calls_allowed`], which errs on the lenient side.
    pub(super) fn expect_one_more(&mut self) {
        self.horizon += 1;
        self.settle();
    }

    /// `n` messages of a transmission group beyond its first came (or
    /// are on their way): they count as answered ones in every later
    /// grant's horizon.
    pub(super) fn answered_extra(&mut self, n: u32) {
        self.extra += u64::from(n);
        self.horizon += u64::from(n);
        self.settle();
    }

    /// The message just received keeps its receive (its call waits).
    pub(super) fn hold(&mut self) {
        self.held += 1;
        self.settle();
    }

    /// A held receive was given back.
    pub(super) fn released(&mut self) {
        self.held = self.held.saturating_sub(1);
        self.settle();
    }

    /// The grant for the next message that carries one: `want`, cut to
    /// the fair share and to what the pool can back, and at least 1.
    /// Records it as sent.
    ///
    /// A grant of 1 needs nothing beyond the floor: every message carrying
    /// a grant answers one received, so `received >= sent + 1` and the
    /// horizon `sent + 2` is at most one ahead.
    pub(super) fn grant(&mut self, want: u32) -> u32 {
        let n = self.sent + 1 + self.extra;
        let want = u64::from(want.min(self.pool.fair_share()).max(1));
        let extra = self
            .needed_with(self.horizon.max(n + want))
            .saturating_sub(self.reserved);
        let g = if extra == 0 || self.pool.try_take(extra) {
            self.reserved += extra;
            want
        } else {
            // As far as the receives still free can back.
            let can = self.received + u64::from(self.reserved) + u64::from(self.pool.available());
            let horizon = can.saturating_sub(u64::from(self.held));
            horizon.saturating_sub(n).clamp(1, want)
        };
        self.horizon = self.horizon.max(n + g);
        self.sent += 1;
        self.settle();
        g as u32
    }

    /// The largest number of calls the peer may have in progress at us:
    /// the grant its latest possible view allows beyond the replies sent.
    pub(super) fn calls_allowed(&self) -> u32 {
        self.horizon
            .saturating_sub(self.sent + self.extra)
            .min(u64::from(u32::MAX)) as u32
    }

    /// Receives reserved (gauges, tests).
    pub(super) fn reserved(&self) -> u32 {
        self.reserved
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        self.pool.give(self.reserved);
        self.pool.members.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    fn pool(n: u32) -> Arc<CreditPool> {
        Arc::new(CreditPool::new(n))
    }

    #[test]
    fn a_connection_reserves_its_floor_or_is_refused() {
        let p = pool(2);
        let a = Backing::new(p.clone()).expect("first");
        let b = Backing::new(p.clone()).expect("second");
        assert_eq!(p.available(), 0);
        assert!(Backing::new(p.clone()).is_none(), "no receive left");
        drop((a, b));
        assert_eq!(p.available(), 2, "dropped connections give back");
    }

    #[test]
    fn grants_are_cut_to_what_the_pool_backs_and_never_zero() {
        let p = pool(4);
        let mut a = Backing::new(p.clone()).unwrap();
        assert!(a.received(false));
        // 4 receives in all: this reply can let the peer send 4 more.
        assert_eq!(a.grant(64), 4);
        assert_eq!((a.reserved(), p.available()), (4, 0));
        // The pool is empty, yet a reply after all arrived still grants 1.
        for _ in 0..4 {
            assert!(a.received(false));
        }
        assert_eq!(a.reserved(), 1, "all granted messages arrived");
        // Three calls are still unanswered; the grant counts them: the
        // fair share (4, one connection) lets the peer send one more.
        assert_eq!(a.grant(64), 4, "the receives came back");
        assert_eq!((a.reserved(), p.available()), (1, 3));
        let mut b = Backing::new(pool(1)).unwrap();
        assert!(b.received(false));
        assert_eq!(b.grant(8), 1, "nothing free beyond the floor");
        assert!(b.received(false));
        assert!(!b.received(false), "a third message was never granted");
    }

    #[test]
    fn a_grant_is_cut_to_the_fair_share() {
        let p = pool(64);
        let mut conns: Vec<Backing> = (0..8).map(|_| Backing::new(p.clone()).unwrap()).collect();
        assert_eq!(p.fair_share(), 8);
        assert!(conns[0].received(false));
        assert_eq!(conns[0].grant(32), 8, "64 receives over 8 connections");
        conns.truncate(1);
        assert_eq!(p.fair_share(), 64);
        assert!(conns[0].received(false));
        assert_eq!(conns[0].grant(32), 32, "alone on the pool: what it asked");
    }

    #[test]
    fn a_held_receive_stays_reserved_until_given_back() {
        let p = pool(8);
        let mut a = Backing::new(p.clone()).unwrap();
        assert!(a.received(false));
        a.hold();
        assert_eq!(a.reserved(), 2, "floor and the held receive");
        a.released();
        assert_eq!(a.reserved(), 1);
        assert_eq!(p.available(), 7);
    }

    /// A compliant requester (RFC 5666 s3.3: it sends while its calls in
    /// flight are below the latest grant it has processed, and processes
    /// replies in order, late) against connections sharing one pool, in
    /// a seeded random interleaving: a message in flight toward the
    /// responder always has a reserved receive, and the pool is never
    /// overdrawn.
    #[test]
    fn every_message_in_flight_has_a_reserved_receive() {
        struct Peer {
            b: Backing,
            /// Calls sent by the requester, not yet received.
            wire: u32,
            /// Calls received, not yet answered.
            serving: u32,
            /// Grants of replies sent, not yet processed by the requester.
            replies: VecDeque<u32>,
            grant_seen: u32,
            in_flight: u32,
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let p = pool(24);
        let mut peers: Vec<Peer> = (0..6)
            .map(|_| Peer {
                b: Backing::new(p.clone()).unwrap(),
                wire: 0,
                serving: 0,
                replies: VecDeque::new(),
                grant_seen: 1,
                in_flight: 0,
            })
            .collect();
        for _ in 0..200_000 {
            let x = &mut peers[rnd(6) as usize];
            match rnd(4) {
                // The requester sends a call if its grant allows.
                0 if x.in_flight < x.grant_seen => {
                    x.in_flight += 1;
                    x.wire += 1;
                }
                // The responder receives one.
                1 if x.wire > 0 => {
                    x.wire -= 1;
                    assert!(x.b.received(false), "a compliant call beyond the horizon");
                    x.serving += 1;
                }
                // The responder answers one, with what its load calls for.
                2 if x.serving > 0 => {
                    x.serving -= 1;
                    let want = (2 * x.serving + 2).min(16);
                    x.replies.push_back(x.b.grant(want));
                }
                // The requester processes the oldest reply.
                3 => {
                    if let Some(g) = x.replies.pop_front() {
                        x.in_flight -= 1;
                        x.grant_seen = g;
                    }
                }
                _ => {}
            }
            for x in &peers {
                assert!(
                    x.wire <= x.b.reserved(),
                    "a call in flight without a receive"
                );
            }
            assert!(p.free.load(Ordering::Relaxed) >= 0, "the pool overdrawn");
        }
    }
}
