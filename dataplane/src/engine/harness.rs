//! Deterministic two-peer harness (tests only), in the spirit of
//! quinn-proto's `tests/util.rs`: two [`Connection`]s, virtual time, and
//! the harness playing the provider of a reliable connection between them.
//!
//! What it executes, per side, in the order the engine emits:
//! * `PostRecv`: appended to that side's receive queue.
//! * `Send`: the bytes are copied at post time and travel to the peer; on
//!   arrival they fill the peer's oldest posted receive (no receive: the
//!   sender completes with `ReceiverNotReady` and the connection breaks;
//!   too long: `LengthError`, breaks).
//! * `RdmaWrite` / `RdmaRead`: executed on arrival against the peer's
//!   [`BufferTable`] through [`BufferTable::resolve`] (rkey, bounds and
//!   exposure checked; a violation completes with `RemoteAccessError` and
//!   breaks the connection).
//!
//! Operations from one side arrive in post order (reliable-connection
//! ordering) unless a fault delays one.
//!
//! Faults: a hook sees every Send and every completion and may drop,
//! delay, duplicate or corrupt it. A broken connection flushes every
//! posted request of both sides with `Flushed` completions, as a queue
//! pair in the error state does.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::*;
use crate::wire::rpc::{AcceptStatus, CallHeader, OpaqueAuth, ReplyHeader};
use crate::wire::rpcrdma::Segment;
use crate::wire::xdr::Encoder;

/// What the fault hook is looking at.
#[derive(Debug)]
pub enum FaultPoint<'a> {
    /// A Send from side `from`, with its bytes.
    Send { from: usize, bytes: &'a [u8] },
    /// A completion about to be reported to side `side`.
    Completion { side: usize, wr_id: WrId },
}

/// What the fault hook decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Leave it alone.
    Deliver,
    /// Lose it (a Send vanishes; the sender still sees success).
    Drop,
    /// Deliver it this much later (later operations may overtake it).
    Delay(core::time::Duration),
    /// Deliver it twice.
    Duplicate,
    /// Flip bits of byte `offset % len` (Sends only).
    Corrupt { offset: usize, xor: u8 },
}

type Hook = Box<dyn FnMut(FaultPoint<'_>) -> Fault>;

#[derive(Debug, Clone)]
enum Op {
    Send {
        wr_id: WrId,
        bytes: Vec<u8>,
        /// Send With Invalidate of this rkey of the receiver.
        invalidate: Option<u32>,
    },
    Write {
        wr_id: WrId,
        bytes: Vec<u8>,
        remote: Segment,
    },
    Read {
        wr_id: WrId,
        local: LocalSlice,
        remote: Segment,
    },
}

impl Op {
    fn wr_id(&self) -> WrId {
        match self {
            Op::Send { wr_id, .. } | Op::Write { wr_id, .. } | Op::Read { wr_id, .. } => *wr_id,
        }
    }
}

#[derive(Debug)]
struct InFlight {
    at: Instant,
    seq: u64,
    from: usize,
    op: Op,
}

#[derive(Debug, Clone, Copy)]
enum Done {
    Recv {
        wr_id: WrId,
        len: u32,
        /// Our key the Send invalidated (Send With Invalidate), reported
        /// when the side uses key windows.
        invalidated: Option<u32>,
    },
    Wc {
        wr_id: WrId,
        status: WcStatus,
    },
}

#[derive(Debug)]
struct PendingDone {
    at: Instant,
    seq: u64,
    side: usize,
    done: Done,
    /// The fault hook already decided about this completion (it was
    /// delayed): report it as it is.
    decided: bool,
}

/// One side: its engine and the provider state the harness keeps for it.
#[derive(Debug)]
pub struct Peer {
    pub conn: Connection,
    rq: VecDeque<(WrId, BufId)>,
    /// Every event the engine emitted, in order.
    pub events: Vec<Event>,
    /// Highest number of receives posted at once.
    pub max_recvs_posted: usize,
}

/// The two peers, the "wire" between them and virtual time.
pub struct Pair {
    pub now: Instant,
    pub peers: [Peer; 2],
    /// One-way latency of every operation.
    pub latency: core::time::Duration,
    in_flight: Vec<InFlight>,
    done: Vec<PendingDone>,
    seq: u64,
    hook: Hook,
    broken: bool,
    /// Every Send delivered: (from side, bytes).
    pub sends: Vec<(usize, Vec<u8>)>,
    /// Counts of operations executed, by kind: sends, reads, writes.
    pub ops: [u64; 3],
    /// Receiver-not-ready events (must stay zero when credits work).
    pub rnr: u64,
    /// Rkeys invalidated by Send With Invalidate: (from side, rkey).
    pub invalidations: Vec<(usize, u32)>,
    /// With key windows ([`Pair::with_key_windows`]), each side's live
    /// keys as a provider keeps them: bound by a Bind, gone with its
    /// invalidation; the peer's one-sided accesses are checked here.
    pub live_keys: [Option<HashMap<u32, (LocalSlice, Access)>>; 2],
    /// Binds and local invalidations executed, per side.
    pub key_ops: [(u64, u64); 2],
}

impl core::fmt::Debug for Pair {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Pair").field("now", &self.now).finish()
    }
}

/// The id of Sends made up by [`Pair::inject`]; their completions are
/// not reported to any engine.
const INJECTED: WrId = WrId {
    kind: WrKind::ErrorSend,
    index: u32::MAX,
    generation: 0,
};

pub const CLIENT: usize = 0;
pub const SERVER: usize = 1;

impl Pair {
    pub fn new(client: Config, server: Config) -> Pair {
        let server = Connection::new(server).expect("config");
        Pair::with_server(client, server)
    }

    /// [`Pair::new`] whose server leases its large messages from `pool`
    /// (`engine::bulk`; several pairs may share one, as a worker's
    /// connections do).
    pub fn with_server_pool(client: Config, server: Config, pool: Arc<BulkPool>) -> Pair {
        let server = Connection::with_bulk_pool(server, None, pool).expect("config");
        Pair::with_server(client, server)
    }

    fn with_server(client: Config, server: Connection) -> Pair {
        let client = Connection::new(client).expect("config");
        let mk = |conn| Peer {
            conn,
            rq: VecDeque::new(),
            events: Vec::new(),
            max_recvs_posted: 0,
        };
        let mut p = Pair {
            now: Instant::ZERO,
            peers: [mk(client), mk(server)],
            latency: core::time::Duration::from_micros(1),
            in_flight: Vec::new(),
            done: Vec::new(),
            seq: 0,
            hook: Box::new(|_| Fault::Deliver),
            broken: false,
            sends: Vec::new(),
            ops: [0; 3],
            rnr: 0,
            invalidations: Vec::new(),
            live_keys: [None, None],
            key_ops: [(0, 0); 2],
        };
        // Distinct, non-sequential rkeys per side, as a provider would hand out.
        for side in 0..2 {
            let t = p.peers[side].conn.buffers_mut();
            for i in 0..t.count() as u32 {
                let key = (i.wrapping_mul(0x9e37_79b9) ^ (side as u32 * 0x5bd1_e995)) | 1;
                let addr = 0x7f00_0000_0000 + t.slab_offset(BufId(i)) as u64;
                t.set_remote_key(BufId(i), key, addr);
            }
        }
        p
    }

    /// [`Pair::new`] with memory windows on both sides: every exposure
    /// gets its own key, bound before it is advertised and invalidated when
    /// the exchange ends, and the harness enforces live keys as a provider
    /// does.
    pub fn with_key_windows(client: Config, server: Config) -> Pair {
        let mut p = Pair::new(client, server);
        for side in 0..2 {
            let conn = &mut p.peers[side].conn;
            let windows: Vec<crate::verbs::Window> = (0..conn.max_exposures() as u32)
                .map(|i| crate::verbs::Window::new(i, i + 1, 0xffff_f000))
                .collect();
            conn.set_key_windows(&windows);
            p.live_keys[side] = Some(HashMap::new());
        }
        p
    }

    /// Where a peer's access to side `side` with `seg` lands: through the
    /// live keys with key windows, else through the engine's exposure
    /// bookkeeping ([`BufferTable::resolve`]).
    fn resolve_at(&self, side: usize, seg: &Segment, want: Access) -> Option<LocalSlice> {
        super::fuzz::resolve(
            &self.peers[side].conn,
            self.live_keys[side].as_ref(),
            seg,
            want,
        )
    }

    pub fn set_fault_hook(&mut self, hook: impl FnMut(FaultPoint<'_>) -> Fault + 'static) {
        self.hook = Box::new(hook);
    }

    pub fn conn(&mut self, side: usize) -> &mut Connection {
        &mut self.peers[side].conn
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Completes a key operation; a failed one fails the queue pair.
    fn finish_key_op(&mut self, side: usize, wr_id: WrId, ok: bool, now: Instant) {
        let status = if ok {
            WcStatus::Success
        } else {
            WcStatus::Other
        };
        self.complete(side, Done::Wc { wr_id, status }, now);
        if !ok {
            self.break_connection();
        }
    }

    fn complete(&mut self, side: usize, done: Done, at: Instant) {
        let seq = self.next_seq();
        self.done.push(PendingDone {
            at,
            seq,
            side,
            done,
            decided: false,
        });
    }

    /// Takes every work request both engines queued and starts it.
    fn pump(&mut self) -> bool {
        let mut any = false;
        for side in 0..2 {
            while let Some(wr) = self.peers[side].conn.poll_transmit() {
                any = true;
                if self.broken {
                    let now = self.now;
                    self.complete(
                        side,
                        Done::Wc {
                            wr_id: wr.wr_id(),
                            status: WcStatus::Flushed,
                        },
                        now,
                    );
                    continue;
                }
                let op = match wr {
                    WorkRequest::PostRecv { wr_id, buf } => {
                        let peer = &mut self.peers[side];
                        peer.rq.push_back((wr_id, buf));
                        peer.max_recvs_posted = peer.max_recvs_posted.max(peer.rq.len());
                        continue;
                    }
                    WorkRequest::Bind {
                        wr_id,
                        rkey,
                        local,
                        access,
                        ..
                    } => {
                        // A key already live, or a side without windows, is
                        // a bad bind (IB: the window is still bound).
                        let ok = self.live_keys[side]
                            .as_mut()
                            .is_some_and(|k| k.insert(rkey, (local, access)).is_none());
                        self.key_ops[side].0 += 1;
                        self.finish_key_op(side, wr_id, ok, self.now);
                        continue;
                    }
                    WorkRequest::Invalidate { wr_id, rkey } => {
                        let ok = self.live_keys[side]
                            .as_mut()
                            .is_some_and(|k| k.remove(&rkey).is_some());
                        self.key_ops[side].1 += 1;
                        self.finish_key_op(side, wr_id, ok, self.now);
                        continue;
                    }
                    WorkRequest::Send {
                        wr_id,
                        local,
                        gather,
                        invalidate_rkey,
                    } => {
                        let bufs = self.peers[side].conn.buffers();
                        let mut bytes = bufs.to_vec(local).expect("send slice");
                        if let Some(g) = gather {
                            bytes.extend(bufs.to_vec(g).expect("gathered slice"));
                        }
                        Op::Send {
                            wr_id,
                            bytes,
                            invalidate: invalidate_rkey,
                        }
                    }
                    WorkRequest::RdmaWrite {
                        wr_id,
                        local,
                        remote,
                    } => {
                        assert_eq!(local.len, remote.length, "write lengths");
                        let bytes = self.peers[side]
                            .conn
                            .buffers()
                            .to_vec(local)
                            .expect("write slice");
                        Op::Write {
                            wr_id,
                            bytes,
                            remote,
                        }
                    }
                    WorkRequest::RdmaRead {
                        wr_id,
                        local,
                        remote,
                    } => {
                        assert_eq!(local.len, remote.length, "read lengths");
                        Op::Read {
                            wr_id,
                            local,
                            remote,
                        }
                    }
                };
                let mut at = self.now.saturating_add(self.latency);
                let mut copies = 1;
                let mut op = op;
                if let Op::Send { bytes, .. } = &mut op {
                    match (self.hook)(FaultPoint::Send { from: side, bytes }) {
                        Fault::Deliver => {}
                        Fault::Drop => {
                            // Lost on the wire: the sender still completes.
                            let wr_id = op.wr_id();
                            self.complete(
                                side,
                                Done::Wc {
                                    wr_id,
                                    status: WcStatus::Success,
                                },
                                at,
                            );
                            continue;
                        }
                        Fault::Delay(d) => at = at.saturating_add(d),
                        Fault::Duplicate => copies = 2,
                        Fault::Corrupt { offset, xor } => {
                            if !bytes.is_empty() {
                                let i = offset % bytes.len();
                                bytes[i] ^= xor;
                            }
                        }
                    }
                }
                for c in 0..copies {
                    let seq = self.next_seq();
                    // The duplicate reuses the id; the sender sees two completions.
                    let _ = c;
                    self.in_flight.push(InFlight {
                        at,
                        seq,
                        from: side,
                        op: op.clone(),
                    });
                }
            }
        }
        any
    }

    /// Executes the earliest operation or completion due at `now`.
    fn deliver_one(&mut self) -> bool {
        let now = self.now;
        let op_i = self
            .in_flight
            .iter()
            .enumerate()
            .filter(|(_, f)| f.at <= now)
            .min_by_key(|(_, f)| (f.at, f.seq))
            .map(|(i, _)| i);
        let done_i = self
            .done
            .iter()
            .enumerate()
            .filter(|(_, d)| d.at <= now)
            .min_by_key(|(_, d)| (d.at, d.seq))
            .map(|(i, _)| i);
        let take_op = match (op_i, done_i) {
            (Some(o), Some(d)) => {
                let (fo, fd) = (&self.in_flight[o], &self.done[d]);
                (fo.at, fo.seq) < (fd.at, fd.seq)
            }
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return false,
        };
        if take_op {
            let f = self.in_flight.remove(op_i.unwrap_or_default());
            self.execute(f);
        } else {
            let d = self.done.remove(done_i.unwrap_or_default());
            self.report(d);
        }
        true
    }

    fn execute(&mut self, f: InFlight) {
        let (from, to) = (f.from, 1 - f.from);
        let now = self.now;
        if self.broken {
            self.complete(
                from,
                Done::Wc {
                    wr_id: f.op.wr_id(),
                    status: WcStatus::Flushed,
                },
                now,
            );
            return;
        }
        match f.op {
            Op::Send {
                wr_id,
                bytes,
                invalidate,
            } => {
                self.ops[0] += 1;
                let Some((rwr, buf)) = self.peers[to].rq.pop_front() else {
                    self.rnr += 1;
                    self.complete(
                        from,
                        Done::Wc {
                            wr_id,
                            status: WcStatus::ReceiverNotReady,
                        },
                        now,
                    );
                    self.break_connection();
                    return;
                };
                let room = self.peers[to].conn.buffers().buf_len(buf) as usize;
                if bytes.len() > room {
                    self.complete(
                        to,
                        Done::Wc {
                            wr_id: rwr,
                            status: WcStatus::LengthError,
                        },
                        now,
                    );
                    self.complete(
                        from,
                        Done::Wc {
                            wr_id,
                            status: WcStatus::Other,
                        },
                        now,
                    );
                    self.break_connection();
                    return;
                }
                assert!(self.peers[to].conn.buffers_mut().write(buf, 0, &bytes));
                if let Some(rkey) = invalidate {
                    if !self.invalidate(to, rkey) {
                        // Invalid rkey: the receiver's QP fails (IB: remote
                        // invalid request).
                        self.complete(
                            from,
                            Done::Wc {
                                wr_id,
                                status: WcStatus::RemoteAccessError,
                            },
                            now,
                        );
                        self.break_connection();
                        return;
                    }
                    self.invalidations.push((from, rkey));
                }
                self.sends.push((from, bytes.clone()));
                self.complete(
                    to,
                    Done::Recv {
                        wr_id: rwr,
                        len: bytes.len() as u32,
                        invalidated: invalidate.filter(|_| self.live_keys[to].is_some()),
                    },
                    now,
                );
                self.complete(
                    from,
                    Done::Wc {
                        wr_id,
                        status: WcStatus::Success,
                    },
                    now,
                );
            }
            Op::Write {
                wr_id,
                bytes,
                remote,
            } => {
                self.ops[2] += 1;
                match self.resolve_at(to, &remote, Access::RemoteWrite) {
                    Some(s) => {
                        let t = self.peers[to].conn.buffers_mut();
                        assert!(t.write(s.buf, s.offset as usize, &bytes), "resolved");
                        self.complete(
                            from,
                            Done::Wc {
                                wr_id,
                                status: WcStatus::Success,
                            },
                            now,
                        );
                    }
                    None => {
                        self.complete(
                            from,
                            Done::Wc {
                                wr_id,
                                status: WcStatus::RemoteAccessError,
                            },
                            now,
                        );
                        self.break_connection();
                    }
                }
            }
            Op::Read {
                wr_id,
                local,
                remote,
            } => {
                self.ops[1] += 1;
                match self.resolve_at(to, &remote, Access::RemoteRead) {
                    Some(s) => {
                        let data = self.peers[to].conn.buffers().to_vec(s).expect("resolved");
                        assert_eq!(data.len(), local.len as usize, "read lengths");
                        assert!(
                            self.peers[from].conn.buffers_mut().write(
                                local.buf,
                                local.offset as usize,
                                &data
                            ),
                            "local read slice"
                        );
                        self.complete(
                            from,
                            Done::Wc {
                                wr_id,
                                status: WcStatus::Success,
                            },
                            now,
                        );
                    }
                    None => {
                        self.complete(
                            from,
                            Done::Wc {
                                wr_id,
                                status: WcStatus::RemoteAccessError,
                            },
                            now,
                        );
                        self.break_connection();
                    }
                }
            }
        }
    }

    /// The queue pairs enter the error state: every posted receive and
    /// every operation still travelling completes with `Flushed`.
    fn break_connection(&mut self) {
        if self.broken {
            return;
        }
        self.broken = true;
        let now = self.now;
        for side in 0..2 {
            while let Some((wr_id, _)) = self.peers[side].rq.pop_front() {
                self.complete(
                    side,
                    Done::Wc {
                        wr_id,
                        status: WcStatus::Flushed,
                    },
                    now,
                );
            }
        }
        for f in core::mem::take(&mut self.in_flight) {
            self.complete(
                f.from,
                Done::Wc {
                    wr_id: f.op.wr_id(),
                    status: WcStatus::Flushed,
                },
                now,
            );
        }
    }

    fn report(&mut self, d: PendingDone) {
        let wr_id = match d.done {
            Done::Recv { wr_id, .. } | Done::Wc { wr_id, .. } => wr_id,
        };
        if wr_id == INJECTED {
            return;
        }
        let mut times = 1;
        let fault = if d.decided {
            Fault::Deliver
        } else {
            (self.hook)(FaultPoint::Completion {
                side: d.side,
                wr_id,
            })
        };
        match fault {
            Fault::Drop => return,
            Fault::Delay(dl) => {
                let seq = self.next_seq();
                self.done.push(PendingDone {
                    at: self.now.saturating_add(dl),
                    seq,
                    decided: true,
                    ..d
                });
                return;
            }
            Fault::Duplicate => times = 2,
            Fault::Deliver | Fault::Corrupt { .. } => {}
        }
        let now = self.now;
        let conn = &mut self.peers[d.side].conn;
        for _ in 0..times {
            match d.done {
                Done::Recv {
                    wr_id,
                    len,
                    invalidated,
                } => conn.handle_recv_invalidating(now, wr_id, len, invalidated),
                Done::Wc { wr_id, status } => conn.handle_completion(now, wr_id, status),
            }
        }
    }

    /// Runs until nothing is left to do, calling `app` for every event
    /// (after recording it). Advances virtual time to the next operation,
    /// completion or engine timer when idle.
    pub fn drive_with(&mut self, app: &mut dyn FnMut(usize, &mut Connection, Instant, Event)) {
        self.drive_with_until(app, None);
    }

    /// [`Pair::drive`] that also stops once virtual time reaches `until`
    /// (for a connection that waits on something outside the pair, such
    /// as a bulk pool another pair holds).
    pub fn drive_until(&mut self, until: Instant) {
        self.drive_with_until(&mut echo_service, Some(until));
    }

    /// [`Pair::drive_with`] that stops once virtual time reaches `until`.
    pub fn drive_app_until(
        &mut self,
        app: &mut dyn FnMut(usize, &mut Connection, Instant, Event),
        until: Instant,
    ) {
        self.drive_with_until(app, Some(until));
    }

    fn drive_with_until(
        &mut self,
        app: &mut dyn FnMut(usize, &mut Connection, Instant, Event),
        until: Option<Instant>,
    ) {
        for _ in 0..1_000_000 {
            let mut progressed = self.pump();
            progressed |= self.deliver_one();
            for side in 0..2 {
                while let Some(ev) = self.peers[side].conn.poll_event() {
                    progressed = true;
                    self.peers[side].events.push(ev);
                    app(side, &mut self.peers[side].conn, self.now, ev);
                }
                if self.peers[side].conn.close_reason().is_some() && !self.broken {
                    // The worker tears the queue pair down when its engine closes.
                    self.break_connection();
                    progressed = true;
                }
            }
            if progressed {
                continue;
            }
            let next = self
                .in_flight
                .iter()
                .map(|f| f.at)
                .chain(self.done.iter().map(|d| d.at))
                .chain(self.peers.iter().filter_map(|p| p.conn.poll_timeout()))
                .min();
            let Some(t) = next else {
                return;
            };
            if until.is_some_and(|u| t > u) {
                return;
            }
            self.now = self.now.max(t);
            for side in 0..2 {
                if self.peers[side]
                    .conn
                    .poll_timeout()
                    .is_some_and(|t| t <= self.now)
                {
                    self.peers[side].conn.handle_timeout(self.now);
                }
            }
        }
        panic!("harness did not settle");
    }

    /// [`Pair::drive_with`] with the echo service on the server.
    pub fn drive(&mut self) {
        self.drive_with(&mut echo_service);
    }

    /// Delivers raw `bytes` as a Send from side `from` (a hand-crafted or
    /// hostile peer).
    pub fn inject(&mut self, from: usize, bytes: Vec<u8>) {
        let wr_id = INJECTED;
        let seq = self.next_seq();
        let at = self.now;
        self.in_flight.push(InFlight {
            at,
            seq,
            from,
            op: Op::Send {
                wr_id,
                bytes,
                invalidate: None,
            },
        });
    }

    /// Send With Invalidate as a provider executes it at side `side`: the
    /// buffer registered under `rkey` gets a fresh rkey (as FRWR would
    /// re-register it), so the old one no longer resolves. False when no
    /// buffer has that rkey.
    fn invalidate(&mut self, side: usize, rkey: u32) -> bool {
        if let Some(keys) = self.live_keys[side].as_mut() {
            return keys.remove(&rkey).is_some();
        }
        let t = self.peers[side].conn.buffers_mut();
        let Some(id) = (0..t.count() as u32)
            .map(BufId)
            .find(|&b| t.remote_key(b).0 == rkey)
        else {
            return false;
        };
        let mut fresh = rkey;
        loop {
            fresh = fresh.wrapping_add(0x0100_0002);
            if (0..t.count() as u32).all(|b| t.remote_key(BufId(b)).0 != fresh) {
                break;
            }
        }
        let addr = t.remote_key(id).1;
        t.set_remote_key(id, fresh, addr);
        true
    }

    /// A one-sided RDMA Read of `remote` by side `from` against its peer's
    /// memory, executed at once outside any engine (a hostile peer probing
    /// what is exposed). Err is the completion status it would get.
    pub fn peer_read(&self, from: usize, remote: Segment) -> Result<Vec<u8>, WcStatus> {
        let to = 1 - from;
        self.resolve_at(to, &remote, Access::RemoteRead)
            .and_then(|s| self.peers[to].conn.buffers().to_vec(s))
            .ok_or(WcStatus::RemoteAccessError)
    }

    /// The Sends side `side` delivered, in order.
    pub fn sends_from(&self, side: usize) -> impl Iterator<Item = &[u8]> {
        self.sends
            .iter()
            .filter(move |(f, _)| *f == side)
            .map(|(_, b)| &b[..])
    }
}

// ---------------------------------------------------------------------------
// A tiny RPC program for the tests: proc 1 echoes its opaque argument.

pub const TEST_PROG: u32 = 0x2000_0101;
pub const TEST_VERS: u32 = 1;
pub const PROC_ECHO: u32 = 1;

/// An RPC call to the echo procedure with `payload` as `opaque<>`; the
/// payload is the DDP-eligible item.
pub fn echo_call(xid: u32, payload: &[u8]) -> (Vec<u8>, DdpItem) {
    let h = CallHeader::new(
        xid,
        TEST_PROG,
        TEST_VERS,
        PROC_ECHO,
        OpaqueAuth::None,
        OpaqueAuth::None,
    );
    let hl = h.buffer_len();
    let mut buf = vec![0u8; hl + crate::wire::xdr::opaque_len(payload.len())];
    let mut e = Encoder::new(&mut buf);
    h.emit(&mut e).expect("call header");
    e.put_opaque(payload).expect("payload");
    let item = DdpItem {
        offset: (hl + 4) as u32,
        len: payload.len() as u32,
    };
    (buf, item)
}

/// A successful reply carrying `payload` as `opaque<>` (the DDP item).
pub fn echo_reply(xid: u32, payload: &[u8]) -> (Vec<u8>, DdpItem) {
    let h = ReplyHeader::accepted(xid, OpaqueAuth::None, AcceptStatus::Success);
    let hl = h.buffer_len();
    let mut buf = vec![0u8; hl + crate::wire::xdr::opaque_len(payload.len())];
    let mut e = Encoder::new(&mut buf);
    h.emit(&mut e).expect("reply header");
    e.put_opaque(payload).expect("payload");
    (
        buf,
        DdpItem {
            offset: (hl + 4) as u32,
            len: payload.len() as u32,
        },
    )
}

/// The opaque argument of an echo call.
pub fn echo_payload(call: &[u8]) -> Option<Vec<u8>> {
    let (_, hl) = CallHeader::parse(call).ok()?;
    let mut d = crate::wire::xdr::Decoder::new(&call[hl..]);
    d.get_opaque(usize::MAX).ok().map(<[u8]>::to_vec)
}

/// The server side of the tests: answers every echo call with its payload
/// as a DDP-eligible result.
pub fn echo_service(side: usize, conn: &mut Connection, now: Instant, ev: Event) {
    if side != SERVER {
        return;
    }
    if let Event::CallArrived { call, xid, .. } = ev {
        let payload = echo_payload(conn.call_message(call).expect("call")).expect("echo payload");
        reply_echo(conn, now, call, xid, &payload);
    }
}

/// Answers `call` with the echo of `payload`, its data DDP-eligible.
pub fn reply_echo(
    conn: &mut Connection,
    now: Instant,
    call: IncomingCall,
    xid: u32,
    payload: &[u8],
) {
    let (msg, item) = echo_reply(xid, payload);
    conn.send_reply(
        now,
        call,
        &OutgoingReply {
            message: &msg,
            ddp: &[item],
        },
    )
    .expect("reply");
}
