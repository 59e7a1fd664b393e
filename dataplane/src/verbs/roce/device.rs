//! Devices: one UDP socket at a local address, shared by the whole
//! process (the `DEVICES` registry), whose queue pairs live in shards,
//! one per completion queue that owns queue pairs there.
//!
//! * A **shard** holds the queue pairs created on one completion queue
//!   (their transport state, timers and transmit batch). Its lock is
//!   taken by the thread polling that queue and by that thread's posts,
//!   so it is uncontended; no lock of the device is taken on the data
//!   path.
//! * Every shard reads the shared socket, one at a time (the receive
//!   batch is only ever `try_lock`ed: nobody waits). A packet for a queue
//!   pair of another shard is copied into that shard's inbox (a bounded
//!   lock-free queue, buffers from the device's pool) and processed at
//!   its owner's next progress, before anything the owner reads later;
//!   with no free buffer the packet is dropped (the RC transport
//!   retransmits) and counted.
//! * The **control** part (connection manager, QP1 MADs, the map of
//!   which shard owns which QPN) has a lock of its own. Shards pass the
//!   MADs they receive to it through another bounded queue; it is run by
//!   `connect`, teardown and the device's thread (`Listener::accept` waits
//!   for it to take MADs).
//! * The device's thread runs the control part and drives only the shards
//!   that no thread has progressed for `RoceConfig::idle_after`.
//!
//! Lock order: control, then a completion queue's shard list, then the
//! device's shard list, then a shard, then a ready list (the receive
//! batch is only tried). A shard's lock is never held while the control
//! lock is taken.
use rustc_hash::FxHashMap;
use std::cell::Cell;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

use super::cm::{Cm, ConnState, QueuePairs};
use super::config::RoceConfig;
use super::io::{bind_udp, Rx, SocketBuffers, Tx, RX_BATCH, SLOT};
use super::random::random_u32;
use super::rc::RcQp;
use crate::verbs::{lock, VerbsError};
use crate::wire::ibcm;
use crate::wire::roce::{icrc, Opcode, Packet, Psn, RocePacket};

/// `recvmmsg` batches per progress call (bounds the work of one poll).
const RX_ROUNDS: usize = 8;

/// How often a shard ticks every queue pair, idle or not (see
/// `ShardState::active`).
const FULL_TICK_EVERY: Duration = Duration::from_millis(10);

/// How often the control part runs the connection manager's timers (REP
/// and DREQ resends, a QP's DREQ after an error); a local disconnect runs
/// them at once.
const CM_TIMERS_EVERY: Duration = Duration::from_millis(1);

/// Packets a device's inboxes hold together: what one progress step can
/// read for other shards (8 `recvmmsg` batches of 32). Their buffers
/// (about 1 MiB) are the device's, allocated with it, so no handoff ever
/// allocates and a shard costs only its queue of pointers.
const HANDOFF_BUFFERS: usize = RX_ROUNDS * RX_BATCH;

/// MADs the shards may queue for the control part: CM traffic is a few
/// messages per connection, and a lost one is resent by its sender (after
/// seconds: a good requester's REQ lost in a flood costs it that long).
/// As deep as the connection manager's queue of requests, so a burst of
/// REQs that queue could hold is not dropped on the way to it (256 lost
/// 200-400 of a flood of 1,152 while the worker drove the device; about
/// 270 KiB per device).
const MAD_QUEUE_DEPTH: usize = 1024;

/// How long the device's thread sleeps when threads drive shards (and
/// so read the socket): it looks again after that rather than spin on
/// the socket's readiness. Also the default of how long a shard may go
/// without a thread driving it before the device's thread steps in
/// (`RoceConfig::idle_after`).
const IDLE_AFTER: Duration = Duration::from_millis(1);

/// The longest the device's thread waits between looks while threads
/// drive every shard: from [`IDLE_AFTER`] it doubles at each look that
/// finds them all driven, back to [`IDLE_AFTER`] when one is not. Every
/// wake-up of the thread takes a core from a spinning worker or client
/// (with a thread per core there is no spare one), so waking every
/// millisecond cost about one call in a hundred tens of microseconds
/// (docs/ROCE.md). A worker or a client about to park hands its shards
/// over at once (`CompletionQueue::before_sleep`, which also sends the
/// ACKs it held); only an application that stops polling without saying
/// so is noticed this late, and its peer's tail probe covers the ACKs it
/// owes meanwhile. MADs and DREQs wake the thread at once.
const MAX_LOOK_EVERY: Duration = Duration::from_millis(8);

/// How long the device's thread, reading the socket for idle shards,
/// waits for a packet or a ring while something runs on a timer (a
/// queue pair ticking, the connection manager's retries), or some shard
/// is merely undriven rather than handed over by its thread.
const READER_WAIT: Duration = Duration::from_millis(2);

/// The same while every shard's thread sleeps and nothing runs on a
/// timer: a packet, a ring (`Device::wake_thread`: a MAD queued, a DREQ
/// owed, a shard handed over, a connection accepted) or a packet handed
/// to an inbox (`Device::handed_off`) ends it sooner. Bounded only as a
/// safety net.
const QUIET_WAIT: Duration = Duration::from_millis(100);

/// How soon the device's thread looks again while some shards are driven
/// by threads and others are idle: packets for the idle ones arrive
/// through their inboxes, which wake nobody (a responder nobody polls
/// answers within about this long, far below any retransmission
/// timeout).
const MIXED_LOOK_AGAIN: Duration = Duration::from_micros(50);

/// Puts `qp` on its shard's list of queue pairs to tick.
pub(super) fn mark_ticking(active: &mut Vec<u32>, qp: &mut RcQp) {
    if !qp.ticking {
        qp.ticking = true;
        active.push(qp.qpn);
    }
}

thread_local! {
    /// Whether this thread is inside a data-path call (a completion
    /// queue's poll, a post): the control lock taken then is counted.
    static ON_DATA_PATH: Cell<bool> = const { Cell::new(false) };
}

/// Marks the current thread as on the data path until dropped.
pub(super) struct DataPath {
    was: bool,
}

impl DataPath {
    pub(super) fn enter() -> DataPath {
        DataPath {
            was: ON_DATA_PATH.with(|c| c.replace(true)),
        }
    }
}

impl Drop for DataPath {
    fn drop(&mut self) {
        ON_DATA_PATH.with(|c| c.set(self.was));
    }
}

/// A received packet copied for the shard that owns its queue pair.
struct Handoff {
    len: usize,
    src: SocketAddrV4,
    bytes: [u8; SLOT],
}

/// A shard's inbox: packets other shards (or the control part) received
/// for its queue pairs, in buffers of the device's pool.
pub(super) struct Inbox {
    queue: ArrayQueue<Box<Handoff>>,
    /// Packets dropped because the device had no free buffer.
    dropped: AtomicU64,
}

impl Inbox {
    fn new() -> Inbox {
        Inbox {
            queue: ArrayQueue::new(HANDOFF_BUFFERS),
            dropped: AtomicU64::new(0),
        }
    }

    /// Copies a packet in, in a buffer from `spare`; false (and counted)
    /// when none is free.
    fn hand(&self, spare: &ArrayQueue<Box<Handoff>>, data: &[u8], src: SocketAddrV4) -> bool {
        let Some(mut h) = spare.pop() else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let len = data.len().min(SLOT);
        h.bytes[..len].copy_from_slice(&data[..len]);
        h.len = len;
        h.src = src;
        // The queue holds as many as the device has buffers: this push
        // cannot fail.
        let _ = self.queue.push(h);
        true
    }
}

/// The per-shard counters (relaxed atomics: written by the shard's
/// thread, read by anyone).
#[derive(Default)]
pub(super) struct ShardCounters {
    /// Progress runs by threads polling or posting on the shard.
    pub polled: AtomicU64,
    /// Progress runs by the device's thread (the shard was idle).
    pub idle_runs: AtomicU64,
    /// Packets this shard received for another shard and handed over.
    pub handed_out: AtomicU64,
    /// Handed-over packets this shard took from its inbox.
    pub handed_in: AtomicU64,
}

/// The queue pairs of one completion queue on one device.
pub(super) struct Shard {
    /// Unique for the process's life: a ready list names a shard by it.
    pub(super) id: usize,
    pub(super) state: Mutex<ShardState>,
    pub(super) inbox: Arc<Inbox>,
    /// When a thread last ran `progress` on it (ns since the device's
    /// epoch).
    last_progress: AtomicU64,
    pub(super) counters: ShardCounters,
}

/// [`Shard::last_progress`] of a shard its thread handed to the device's
/// thread ([`Shard::hand_to_device`]): idle at once, even on a device
/// younger than its idle threshold.
const HANDED_OVER: u64 = 0;

/// Source of [`Shard::id`].
static SHARD_IDS: AtomicUsize = AtomicUsize::new(1);

pub(super) struct ShardState {
    pub(super) tx: Tx,
    /// By QPN, looked up for every packet and every queue pair ticked:
    /// Fx hashing (a multiply) rather than SipHash (about 120
    /// instructions a lookup). Flooding cannot exploit it: the keys are
    /// our own random 24-bit QPNs, so a peer's chosen QPN can only land
    /// among entries we made.
    pub(super) qps: FxHashMap<u32, RcQp>,
    /// Queue pairs to tick at the next progress: touched by a packet or a
    /// post, or with timers or output pending (`RcQp::needs_tick`). The
    /// others are idle and cost a progress nothing; every
    /// [`FULL_TICK_EVERY`] all are ticked anyway.
    pub(super) active: Vec<u32>,
    next_full_tick: Instant,
    /// The inboxes of the queue pairs of the device's other shards, by
    /// QPN: kept current by the control part at connection setup and
    /// teardown, so a handoff needs no lock but this shard's.
    routes: FxHashMap<u32, Arc<Inbox>>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard").field("id", &self.id).finish()
    }
}

impl Shard {
    fn new(dev: &Device, routes: &FxHashMap<u32, Arc<Shard>>) -> Shard {
        Shard {
            id: SHARD_IDS.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(ShardState {
                tx: dev.tx(),
                qps: FxHashMap::default(),
                active: Vec::new(),
                next_full_tick: Instant::now(),
                routes: routes.iter().map(|(q, s)| (*q, s.inbox.clone())).collect(),
            }),
            inbox: Arc::new(Inbox::new()),
            last_progress: AtomicU64::new(dev.ns(Instant::now())),
            counters: ShardCounters::default(),
        }
    }

    pub(super) fn mark_progress(&self, dev: &Device, now: Instant) {
        self.last_progress.store(dev.ns(now), Ordering::Relaxed);
    }

    /// The thread driving this shard goes to sleep: the shard counts as
    /// idle at once and the device's thread is woken to drive it.
    pub(super) fn hand_to_device(&self, dev: &Device) {
        self.last_progress.store(HANDED_OVER, Ordering::Relaxed);
        dev.wake_thread();
    }

    /// Whether no thread has driven this shard for the device's idle
    /// threshold at `now`, or its thread handed it over: the device's
    /// thread may then drive it.
    pub(super) fn is_idle(&self, dev: &Device, now: Instant) -> bool {
        let last = self.last_progress.load(Ordering::Relaxed);
        last == HANDED_OVER || dev.ns(now).saturating_sub(last) >= dev.idle_after.as_nanos() as u64
    }

    /// Its counters, for `RoceShardStats`.
    pub(super) fn stats(&self) -> super::RoceShardStats {
        let c = &self.counters;
        super::RoceShardStats {
            polled: c.polled.load(Ordering::Relaxed),
            idle_runs: c.idle_runs.load(Ordering::Relaxed),
            handed_out: c.handed_out.load(Ordering::Relaxed),
            handed_in: c.handed_in.load(Ordering::Relaxed),
            inbox_drops: self.inbox.dropped.load(Ordering::Relaxed),
        }
    }
}

/// The device-wide counters.
#[derive(Default)]
pub(super) struct DeviceCounters {
    /// Inbound packets dropped for a bad ICRC.
    pub bad_icrc: AtomicU64,
    /// Packets dropped as spoofed: a REQ whose path GID is not its UDP
    /// source address, or a data packet from the peer's address but not
    /// from the UDP port its QP sends from.
    pub spoofed: AtomicU64,
    /// MADs dropped because the control part's queue was full.
    pub mads_dropped: AtomicU64,
    /// REQs rejected because their peer already had
    /// `MAX_HALF_OPEN_PER_PEER` connections half-open.
    pub half_open_refused: AtomicU64,
    /// Times the control lock was taken, and of those, by a thread inside
    /// a data-path call (a poll or a post): none by design.
    pub control_locks: AtomicU64,
    pub control_locks_on_data_path: AtomicU64,
    /// Data packets the control part received and handed to a shard.
    pub control_handed_out: AtomicU64,
}

/// A MAD received by a shard, for the control part.
struct MadIn {
    src: SocketAddrV4,
    mad: [u8; ibcm::MAD_LEN],
}

/// The control part of a device: the connection manager and which shard
/// owns which queue pair.
pub(super) struct Control {
    pub(super) tx: Tx,
    pub(super) cm: Cm,
    pub(super) gsi_psn: Psn,
    /// Every queue pair of the device, by QPN, and its shard.
    pub(super) routes: FxHashMap<u32, Arc<Shard>>,
    /// When the connection manager's timers next run.
    next_cm_timers: Instant,
}

/// One UDP socket at a local address, shared by the process.
pub(super) struct Device {
    pub(super) local: SocketAddrV4,
    socket: Arc<OwnedFd>,
    /// What the kernel granted the socket (queue pairs fit their window
    /// to it).
    pub(super) buffers: SocketBuffers,
    /// UDP GSO on send (`RoceConfig::gso`, `gso_everywhere`), and GRO on
    /// receive with it (see `Device::at`).
    gso: bool,
    verify_icrc: bool,
    /// See `RoceConfig::idle_after`.
    idle_after: Duration,
    control: Mutex<Control>,
    /// The shards, for the device's thread.
    shards: Mutex<Vec<Arc<Shard>>>,
    /// MADs shards received, waiting for the control part.
    mads: ArrayQueue<MadIn>,
    /// Set by a shard when one of its queue pairs owes the peer a DREQ
    /// (it entered the error state): the control part then looks.
    dreq_wake: AtomicBool,
    /// The device's thread, woken when the control part has work (a MAD,
    /// a DREQ owed) while it waits.
    thread: OnceLock<std::thread::Thread>,
    /// Rung with the unpark of [`Device::wake_thread`], and for a packet
    /// handed to an inbox while the thread is armed for its quiet wait
    /// ([`QUIET_WAIT`]): ends the thread's wait on the socket, which an
    /// unpark does not.
    bell: crate::wake::SleeperBell,
    /// Notified, with the control lock, whenever the connection manager
    /// took a MAD: `Listener::accept` waits on it for requests.
    mads_taken: Condvar,
    /// The receive batch, held by whoever reads the socket (see
    /// [`Device::try_read`]).
    rx: Mutex<Rx>,
    /// Free handoff buffers ([`HANDOFF_BUFFERS`]).
    spare: ArrayQueue<Box<Handoff>>,
    oversized: Arc<AtomicU64>,
    pub(super) counters: DeviceCounters,
    epoch: Instant,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("local", &self.local)
            .finish()
    }
}

/// Devices of this process by address (dead entries are kept: they say
/// the address was ours).
static DEVICES: Mutex<Vec<(SocketAddrV4, Weak<Device>)>> = Mutex::new(Vec::new());

fn os_err(what: &'static str, e: std::io::Error) -> VerbsError {
    VerbsError::Os {
        what,
        source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

impl Device {
    /// The process's device at `local`, bound now if there is none.
    pub(super) fn at(local: SocketAddrV4, cfg: &RoceConfig) -> Result<Arc<Device>, VerbsError> {
        let mut devs = lock(&DEVICES);
        if let Some(d) = devs
            .iter()
            .filter_map(|(_, w)| w.upgrade())
            .find(|d| d.local == local)
        {
            return Ok(d);
        }
        // A device of ours at this address may be closing on another thread
        // (its last reference just went): wait for its socket to close.
        let ours_before = devs.iter().any(|(a, _)| *a == local);
        let deadline = Instant::now() + Duration::from_millis(500);
        // GSO and GRO on loopback devices by default: there the kernel
        // never puts a GSO send on a wire. A device on any other address
        // keeps one datagram per packet unless asked (`gso=all`): GSO is
        // not tried against NICs that segment UDP themselves, and GRO
        // toward Linux rxe peers once broke the Linux NFS client's
        // connections to our gateway (no longer seen, docs/ROCE.md). Both
        // go together: a GSO send across a veth reaches a GRO socket
        // whole, where a socket without GRO makes the kernel split it into
        // datagrams on the sender's core.
        let offload = offloads(cfg, local);
        let fd = loop {
            match bind_udp(local, offload) {
                Ok(fd) => break fd,
                Err(e)
                    if ours_before
                        && e.raw_os_error() == Some(libc::EADDRINUSE)
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => return Err(os_err("bind RoCE UDP socket", e)),
            }
        };
        let buffers = SocketBuffers::of(fd.as_raw_fd());
        if buffers.short() {
            // Once per device: the host caps socket buffers below what a
            // window of full packets needs and we may not override it.
            let mtu = crate::wire::roce::seg::Mtu::Mtu4096;
            eprintln!(
                "roce {local}: socket buffers granted {} / {} bytes (receive / send; raise net.core.rmem_max and wmem_max, or run with CAP_NET_ADMIN), send window fitted to {} packets of {} bytes",
                buffers.rcv,
                buffers.snd,
                buffers.fit(mtu, super::rc::WINDOW as u32),
                mtu.bytes()
            );
        }
        let gsi_psn = Psn::from_masked(random_u32()?);
        devs.retain(|(a, w)| w.strong_count() > 0 || *a != local);
        let socket = Arc::new(fd);
        let oversized = Arc::new(AtomicU64::new(0));
        let dev = Arc::new(Device {
            local,
            control: Mutex::new(Control {
                tx: Tx::new(socket.clone(), local, oversized.clone(), offload),
                cm: Cm::default(),
                gsi_psn,
                routes: FxHashMap::default(),
                next_cm_timers: Instant::now(),
            }),
            socket,
            buffers,
            gso: offload,
            verify_icrc: cfg.verify_icrc,
            idle_after: cfg.idle_after,
            shards: Mutex::new(Vec::new()),
            mads: ArrayQueue::new(MAD_QUEUE_DEPTH),
            dreq_wake: AtomicBool::new(false),
            thread: OnceLock::new(),
            bell: crate::wake::SleeperBell::new().map_err(|source| VerbsError::Os {
                what: "eventfd for the device's thread",
                source,
            })?,
            mads_taken: Condvar::new(),
            rx: Mutex::new(Rx::new(offload)),
            spare: {
                let spare = ArrayQueue::new(HANDOFF_BUFFERS);
                for _ in 0..HANDOFF_BUFFERS {
                    let _ = spare.push(Box::new(Handoff {
                        len: 0,
                        src: local,
                        bytes: [0; SLOT],
                    }));
                }
                spare
            },
            oversized,
            counters: DeviceCounters::default(),
            epoch: Instant::now(),
        });
        devs.push((local, Arc::downgrade(&dev)));
        Device::spawn_thread(&dev);
        Ok(dev)
    }

    /// The device `connect` to `target` uses: the configured local
    /// address; for a loopback target, a loopback device this process
    /// already has, else the target address itself (a connection to our
    /// own device), else (another process owns it) a per-process alias in
    /// 127.128.0.0/9; otherwise the source address routing picks.
    pub(super) fn for_connect(
        target: Ipv4Addr,
        cfg: &RoceConfig,
    ) -> Result<Arc<Device>, VerbsError> {
        let port = cfg.udp_port;
        if let Some(ip) = cfg.local {
            return Device::at(SocketAddrV4::new(ip, port), cfg);
        }
        if !target.is_loopback() {
            let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| os_err("route lookup", e))?;
            s.connect((target, port))
                .map_err(|e| os_err("route lookup", e))?;
            let local = match s.local_addr().map_err(|e| os_err("route lookup", e))?.ip() {
                IpAddr::V4(v4) => v4,
                IpAddr::V6(_) => return Err(VerbsError::Protocol("IPv6 route to an IPv4 peer")),
            };
            return Device::at(SocketAddrV4::new(local, port), cfg);
        }
        {
            let devs = lock(&DEVICES);
            if let Some(d) = devs
                .iter()
                .filter_map(|(_, w)| w.upgrade())
                .find(|d| d.local.ip().is_loopback() && d.local.port() == port)
            {
                return Ok(d);
            }
        }
        match Device::at(SocketAddrV4::new(target, port), cfg) {
            Ok(d) => return Ok(d),
            Err(VerbsError::Os {
                source: nix::Error::EADDRINUSE,
                ..
            }) => {}
            Err(e) => return Err(e),
        }
        let pid = std::process::id();
        for k in 0..64u32 {
            let v = 0x7F80_0000 | (pid.wrapping_mul(64).wrapping_add(k) & 0x7F_FFFF);
            match Device::at(SocketAddrV4::new(Ipv4Addr::from(v), port), cfg) {
                Ok(d) => return Ok(d),
                Err(VerbsError::Os {
                    source: nix::Error::EADDRINUSE,
                    ..
                }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(VerbsError::Limit("no free loopback alias for RoCE"))
    }

    /// Nanoseconds since the device's epoch, at least 1 (0 is
    /// [`HANDED_OVER`]).
    fn ns(&self, t: Instant) -> u64 {
        (t.saturating_duration_since(self.epoch).as_nanos() as u64).max(1)
    }

    fn tx(&self) -> Tx {
        Tx::new(
            self.socket.clone(),
            self.local,
            self.oversized.clone(),
            self.gso,
        )
    }

    /// The control part, counted (see [`DeviceCounters`]).
    pub(super) fn control(&self) -> MutexGuard<'_, Control> {
        self.counters.control_locks.fetch_add(1, Ordering::Relaxed);
        if ON_DATA_PATH.with(Cell::get) {
            self.counters
                .control_locks_on_data_path
                .fetch_add(1, Ordering::Relaxed);
        }
        lock(&self.control)
    }

    /// The right to read the socket, if nobody holds it. One reader at a
    /// time, who hands over what is not its own before letting go, keeps
    /// each queue pair's packets in order: a shard takes its inbox after
    /// it gets the right, so everything read before is processed before
    /// what it reads. Nobody waits for it: a shard without it takes its
    /// inbox and runs its queue pairs. (Only ever `try_lock`ed: it is
    /// the device's one receive batch.)
    pub(super) fn try_read(&self) -> Option<MutexGuard<'_, Rx>> {
        self.rx.try_lock().ok()
    }

    /// Gives up the control lock until the connection manager has taken a
    /// MAD or `at_most` passed, and takes it again.
    pub(super) fn wait_for_mads<'a>(
        &'a self,
        ctl: MutexGuard<'a, Control>,
        at_most: Duration,
    ) -> MutexGuard<'a, Control> {
        match self.mads_taken.wait_timeout(ctl, at_most) {
            Ok((g, _)) => g,
            Err(poisoned) => poisoned.into_inner().0,
        }
    }

    /// Has the control part look for queue pairs that owe a DREQ.
    pub(super) fn wake_for_dreq(&self) {
        self.dreq_wake.store(true, Ordering::Relaxed);
        self.wake_thread();
    }

    /// Wakes the device's thread if it waits (a MAD or a DREQ for the
    /// control part).
    pub(super) fn wake_thread(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
        self.bell.ring();
    }

    /// A shard handed packets to another shard's inbox, which rings
    /// nobody: the device's thread, if armed for its quiet wait, must
    /// look (the owner may be asleep; [`Device::enter_quiet_wait`] is the
    /// other half).
    fn handed_off(&self) {
        self.bell.notify();
    }

    /// Whether the control part has nothing to do on a timer: no MAD
    /// queued, no DREQ owed, no REP or DREQ being retried, no request
    /// waiting in a listener's queue.
    fn control_is_quiet(&self) -> bool {
        if !self.mads.is_empty() || self.dreq_wake.load(Ordering::Relaxed) {
            return false;
        }
        let ctl = self.control();
        ctl.cm.listeners.values().all(|q| q.is_empty())
            && ctl.cm.conns.values().all(|r| {
                !matches!(
                    r.state,
                    ConnState::RepSent { .. } | ConnState::DreqSent { .. }
                )
            })
    }

    /// Arms the thread's bell and looks once more: true when the thread
    /// may wait long (every shard still handed over by its thread, no
    /// packet in an inbox, no MAD queued). Disarmed after the wait.
    fn enter_quiet_wait(&self) -> bool {
        self.bell.arm(|| {
            self.mads.is_empty()
                && lock(&self.shards).iter().all(|s| {
                    s.last_progress.load(Ordering::Relaxed) == HANDED_OVER
                        && s.inbox.queue.is_empty()
                })
        })
    }

    /// The device's socket, when no thread drives any of its shards at
    /// `now` (each handed to the device's thread or idle): only that
    /// thread reads the socket then, and a sleeper may wait on it too
    /// (`CompletionQueue::watch_also`). While a thread drives a shard it
    /// reads the socket itself, and a sleeper waiting there would be
    /// woken by every datagram that thread reads.
    pub(super) fn socket_if_nobody_drives(&self, now: Instant) -> Option<RawFd> {
        let shards = lock(&self.shards);
        shards
            .iter()
            .all(|s| s.is_idle(self, now))
            .then(|| self.socket.as_raw_fd())
    }

    /// Packets the kernel refused as larger than the route's MTU.
    pub(super) fn oversized(&self) -> u64 {
        self.oversized.load(Ordering::Relaxed)
    }

    /// Its counters and its shards', for `RoceDeviceStats`.
    pub(super) fn stats(&self) -> super::RoceDeviceStats {
        let c = &self.counters;
        let shards = lock(&self.shards).len();
        super::RoceDeviceStats {
            shards,
            bad_icrc: c.bad_icrc.load(Ordering::Relaxed),
            spoofed: c.spoofed.load(Ordering::Relaxed),
            mads_dropped: c.mads_dropped.load(Ordering::Relaxed),
            half_open_refused: c.half_open_refused.load(Ordering::Relaxed),
            control_locks: c.control_locks.load(Ordering::Relaxed),
            control_locks_on_data_path: c.control_locks_on_data_path.load(Ordering::Relaxed),
            handed_out_by_control: c.control_handed_out.load(Ordering::Relaxed),
            oversized: self.oversized(),
        }
    }

    /// The device's thread (one per device, never per connection): it
    /// runs the control part (MADs the shards queued, CM timers; the
    /// socket itself when no shard reads it), and drives the shards no
    /// thread has driven for `RoceConfig::idle_after`, so one-sided
    /// operations, ACKs and timers proceed against a process that is not
    /// polling (as an HCA would). A shard a thread polls is left alone. It exits when
    /// the device is dropped.
    fn spawn_thread(dev: &Arc<Device>) {
        let weak = Arc::downgrade(dev);
        let spawned = std::thread::Builder::new()
            .name("roce-idle".into())
            .spawn(move || {
                // Whether the last pass found the socket without a reader:
                // then this thread reads it and waits for it. Otherwise it
                // never waits in poll(2) on the socket: a thread blocked
                // there is woken by every datagram that arrives, even one a
                // spinning thread reads first (the kernel re-checks and
                // sleeps again inside the call), which took the cores of
                // the threads it shares them with 7,000 times a second.
                let mut reader = true;
                // Every shard's thread sleeps and nothing runs on a timer.
                let mut quiet = false;
                let mut look_every = IDLE_AFTER;
                loop {
                    // Holding the device keeps its socket open during poll(2).
                    let Some(dev) = weak.upgrade() else { break };
                    if reader {
                        // A packet or a ring ends the wait; it is long
                        // only while nothing runs on a timer.
                        let mut fds = [
                            crate::wake::pollfd(dev.socket.as_raw_fd()),
                            crate::wake::pollfd(dev.bell.as_fd().as_raw_fd()),
                        ];
                        let wait = if quiet && dev.enter_quiet_wait() {
                            QUIET_WAIT
                        } else {
                            READER_WAIT
                        };
                        crate::wake::sleep_on(&mut fds, wait);
                        dev.bell.disarm();
                    }
                    let now = Instant::now();
                    let pass = dev.idle_pass(now);
                    dev.control_step(now, pass.nobody_reads);
                    quiet = pass.all_asleep_untimed && dev.control_is_quiet();
                    drop(dev);
                    reader = pass.polled == 0;
                    if pass.polled > 0 && pass.drove > 0 {
                        // Threads read the socket and hand packets to the
                        // idle shards: the socket's readiness says nothing
                        // about those, so look again soon.
                        look_every = IDLE_AFTER;
                        std::thread::sleep(MIXED_LOOK_AGAIN);
                    } else if pass.polled > 0 {
                        // Threads drive every shard: look again later and
                        // later while they keep at it (MAX_LOOK_EVERY),
                        // sooner when the control part has work
                        // (`wake_thread`).
                        std::thread::park_timeout(look_every);
                        look_every = (look_every * 2).min(MAX_LOOK_EVERY);
                    } else {
                        look_every = IDLE_AFTER;
                    }
                }
            });
        if let Ok(handle) = spawned {
            let _ = dev.thread.set(handle.thread().clone());
        }
    }

    /// One pass of the device's thread over the shards: drives those that
    /// are idle (see [`Shard::is_idle`]).
    pub(super) fn idle_pass(&self, now: Instant) -> IdlePass {
        let shards = lock(&self.shards);
        let mut pass = IdlePass {
            polled: 0,
            drove: 0,
            nobody_reads: true,
            all_asleep_untimed: true,
        };
        for s in shards.iter() {
            if !s.is_idle(self, now) {
                pass.polled += 1;
                pass.nobody_reads = false;
                pass.all_asleep_untimed = false;
                continue;
            }
            pass.all_asleep_untimed &= s.last_progress.load(Ordering::Relaxed) == HANDED_OVER;
            // Not marked as progress: that records threads driving it, and
            // the shard stays idle until one does.
            match s.state.try_lock() {
                Ok(mut st) => {
                    st.progress(self, s, now, false);
                    s.counters.idle_runs.fetch_add(1, Ordering::Relaxed);
                    pass.drove += 1;
                    pass.all_asleep_untimed &= st.active.is_empty();
                }
                // A thread is in a poll or a post of the shard right now:
                // it drives it. Counted as driven, so this thread waits
                // instead of trying again at once; trying in a loop took
                // the core from that very thread, which then held the lock
                // longer (a spinning client went from 99 % to 87 % of its
                // core).
                Err(_) => {
                    pass.polled += 1;
                    pass.all_asleep_untimed = false;
                }
            }
            pass.nobody_reads = false;
        }
        pass
    }

    /// Runs the control part: receives from the socket when asked (no
    /// shard reads it), takes the MADs shards queued, runs the CM timers
    /// when due, sends.
    pub(super) fn control_step(&self, now: Instant, receive: bool) {
        let due = receive || !self.mads.is_empty() || self.dreq_wake.load(Ordering::Relaxed);
        let mut ctl = self.control();
        if !due && now < ctl.next_cm_timers {
            return;
        }
        let ctl = &mut *ctl;
        let mut handed = false;
        let mut right = if receive { self.try_read() } else { None };
        if let Some(rx) = right.as_deref_mut() {
            let fd = self.socket.as_raw_fd();
            for _ in 0..RX_ROUNDS {
                let n = rx.recv(fd);
                for i in 0..n {
                    let (data, src) = (rx.packet(i), rx.src(i));
                    match self.classify(data, src, rx.segment(i)) {
                        Inbound::Mad(p) => ctl.on_mad(self, p.payload, src, now),
                        Inbound::Data(p) => {
                            if let Some(s) = ctl.routes.get(&p.bth.dest_qpn) {
                                if s.inbox.hand(&self.spare, data, src) {
                                    self.counters
                                        .control_handed_out
                                        .fetch_add(1, Ordering::Relaxed);
                                    handed = true;
                                }
                            }
                        }
                        Inbound::Drop => {}
                    }
                }
                if !rx.full {
                    break;
                }
            }
        }
        drop(right);
        if handed {
            self.handed_off();
        }
        while let Some(m) = self.mads.pop() {
            ctl.on_mad(self, &m.mad, m.src, now);
        }
        if now >= ctl.next_cm_timers || self.dreq_wake.load(Ordering::Relaxed) {
            ctl.next_cm_timers = now + CM_TIMERS_EVERY;
            ctl.cm_timers(self, now);
        }
        ctl.tx.flush();
    }

    /// What an inbound datagram is: checks its ICRC (with `verify_icrc`)
    /// and parses it.
    fn classify<'a>(&self, data: &'a [u8], src: SocketAddrV4, segment: u16) -> Inbound<'a> {
        if self.verify_icrc {
            let mut ip =
                icrc::Ipv4Header::plain_udp_socket(src.ip().octets(), self.local.ip().octets());
            let ports = icrc::UdpPorts {
                src: src.port(),
                dst: self.local.port(),
            };
            let want = Packet::new_checked(data).map(|p| p.icrc()).ok();
            let mut ok = icrc::compute_ipv4(&ip, ports, data).ok() == want;
            if !ok && segment > 0 {
                // Segment k of a coalesced datagram: its sender sealed it
                // for the IP ID segmentation gives it (see `Tx`).
                ip.ident = segment;
                ok = icrc::compute_ipv4(&ip, ports, data).ok() == want;
            }
            if !ok {
                // A segment that reached us alone, or coalesced at another
                // boundary than its sender's run (seen rarely on a loaded
                // loopback, cause not pinned down): any ID a GSO run of
                // the kernel's 64 segments gives. A corrupted packet still
                // fails (64 in 2^32).
                ok = (1..64u16).any(|id| {
                    ip.ident = id;
                    icrc::compute_ipv4(&ip, ports, data).ok() == want
                });
            }
            if !ok {
                self.counters.bad_icrc.fetch_add(1, Ordering::Relaxed);
                return Inbound::Drop;
            }
        }
        let Ok(p) = RocePacket::parse(data) else {
            return Inbound::Drop;
        };
        if p.bth.dest_qpn == ibcm::GSI_QPN {
            if p.bth.opcode == Opcode::UdSendOnly {
                return Inbound::Mad(p);
            }
            return Inbound::Drop;
        }
        Inbound::Data(p)
    }

    /// Queues a MAD a shard received for the control part.
    fn queue_mad(&self, payload: &[u8], src: SocketAddrV4) {
        let mut m = MadIn {
            src,
            mad: [0; ibcm::MAD_LEN],
        };
        let len = payload.len().min(ibcm::MAD_LEN);
        m.mad[..len].copy_from_slice(&payload[..len]);
        if self.mads.push(m).is_err() {
            self.counters.mads_dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.wake_thread();
    }

    /// A new shard (for a completion queue that has none here yet); the
    /// control part is locked, so its routes start complete.
    pub(super) fn new_shard(&self, ctl: &Control) -> Arc<Shard> {
        let shard = Arc::new(Shard::new(self, &ctl.routes));
        lock(&self.shards).push(shard.clone());
        shard
    }

    /// Forgets a shard with no queue pairs left.
    pub(super) fn remove_shard(&self, shard: &Arc<Shard>) {
        lock(&self.shards).retain(|s| !Arc::ptr_eq(s, shard));
        // Packets still handed to it are for queue pairs that are gone:
        // their buffers go back to the device.
        while let Some(h) = shard.inbox.queue.pop() {
            let _ = self.spare.push(h);
        }
    }

    /// Number of queue pairs on the device.
    #[cfg(test)]
    pub(super) fn qp_count(&self) -> usize {
        self.control().routes.len()
    }
}

/// What [`Device::idle_pass`] found.
pub(super) struct IdlePass {
    /// Shards a thread drove within the idle threshold.
    pub polled: usize,
    /// Idle shards this pass drove.
    pub drove: usize,
    /// Nobody read the socket in this pass or recently.
    pub nobody_reads: bool,
    /// Every shard was handed over by its thread (not merely undriven for
    /// a while) and none of those this pass drove has timers running
    /// (queue pairs ticking: unacknowledged sends, held ACKs).
    pub all_asleep_untimed: bool,
}

enum Inbound<'a> {
    Mad(RocePacket<'a>),
    /// A packet for a queue pair (its `bth.dest_qpn`), parsed once here
    /// for whoever runs it.
    Data(RocePacket<'a>),
    Drop,
}

impl Control {
    /// A fresh random 24-bit QPN: an off-path sender cannot guess the
    /// QPN of a connection (it must also match address, port and PSN).
    pub(super) fn alloc_qpn(&self) -> Result<u32, VerbsError> {
        loop {
            let q = random_u32()? & 0xFF_FFFF;
            // Never QPN 0 or 1 (QP0/QP1 are special, IBTA Vol. 1 ch. 12).
            if q > 1 && !self.routes.contains_key(&q) {
                return Ok(q);
            }
        }
    }

    /// Puts `qp` into `shard` and tells the device's other shards where
    /// it lives.
    pub(super) fn insert_qp(&mut self, dev: &Device, shard: &Arc<Shard>, qp: RcQp) {
        let qpn = qp.qpn;
        {
            let mut st = lock(&shard.state);
            st.qps.insert(qpn, qp);
            // Room to tick every queue pair (a full tick marks them all),
            // set aside here, at connection setup, not on the data path.
            let n = st.qps.len();
            let more = n.saturating_sub(st.active.len());
            st.active.reserve(more);
        }
        for other in lock(&dev.shards).iter() {
            if !Arc::ptr_eq(other, shard) {
                lock(&other.state).routes.insert(qpn, shard.inbox.clone());
            }
        }
        self.routes.insert(qpn, shard.clone());
    }

    /// Takes queue pair `qpn` out of its shard and out of every shard's
    /// routes.
    pub(super) fn remove_qp(&mut self, dev: &Device, qpn: u32) -> Option<RcQp> {
        let shard = self.routes.remove(&qpn)?;
        for other in lock(&dev.shards).iter() {
            if !Arc::ptr_eq(other, &shard) {
                lock(&other.state).routes.remove(&qpn);
            }
        }
        let qp = lock(&shard.state).qps.remove(&qpn);
        qp
    }

    /// Runs `f` on queue pair `qpn` in its shard and has the shard tick it
    /// at its next progress (what the connection manager changed).
    pub(super) fn with_qp<R>(
        &self,
        dev: &Device,
        qpn: u32,
        f: impl FnOnce(&mut RcQp) -> R,
    ) -> Option<R> {
        QpRoutes {
            dev,
            map: &self.routes,
        }
        .with(qpn, f)
    }

    /// The connection manager and what each of its handlers works on, all
    /// borrowed from the control part at once: the queue pairs of `dev`
    /// (reached through their shards), the transmit batch and the GSI
    /// PSN.
    fn cm_parts<'a>(
        &'a mut self,
        dev: &'a Device,
    ) -> (&'a mut Cm, QpRoutes<'a>, &'a mut Tx, &'a mut Psn) {
        let Control {
            tx,
            cm,
            gsi_psn,
            routes,
            ..
        } = self;
        (cm, QpRoutes { dev, map: routes }, tx, gsi_psn)
    }

    fn on_mad(&mut self, dev: &Device, payload: &[u8], src: SocketAddrV4, now: Instant) {
        let (cm, qps, tx, gsi_psn) = self.cm_parts(dev);
        let counters = super::cm::CmCounters {
            spoofed: &dev.counters.spoofed,
            half_open_refused: &dev.counters.half_open_refused,
        };
        cm.on_mad(payload, src, &qps, tx, gsi_psn, now, counters);
        // A REQ may be queued, or an RTU made room: the acceptors look.
        dev.mads_taken.notify_all();
    }

    /// Runs the connection manager's timers ([`Cm::timers`]); with
    /// `dreq_wake` set, first collects the DREQs queue pairs owe.
    pub(super) fn cm_timers(&mut self, dev: &Device, now: Instant) {
        let scan = dev.dreq_wake.swap(false, Ordering::Relaxed);
        let (cm, qps, tx, gsi_psn) = self.cm_parts(dev);
        cm.timers(now, &qps, scan, tx, gsi_psn);
    }
}

/// The device's queue pairs, reached through the shards that own them
/// (for the connection manager).
pub(super) struct QpRoutes<'a> {
    dev: &'a Device,
    map: &'a FxHashMap<u32, Arc<Shard>>,
}

impl QueuePairs for QpRoutes<'_> {
    /// Runs `f` on queue pair `qpn` in its shard, after the packets
    /// handed to that shard: a DREQ read after a NAK must not fail the
    /// queue pair before the NAK completes its work request. The shard
    /// then ticks it at its next progress (what `f` changed).
    fn with<R>(&self, qpn: u32, f: impl FnOnce(&mut RcQp) -> R) -> Option<R> {
        let shard = self.map.get(&qpn)?;
        let mut st = lock(&shard.state);
        let now = Instant::now();
        let mut dreq = st.take_inbox(self.dev, shard, now);
        let ShardState {
            qps, active, tx, ..
        } = &mut *st;
        let qp = qps.get_mut(&qpn)?;
        let r = f(qp);
        mark_ticking(active, qp);
        dreq |= qp.dreq_due;
        tx.flush();
        if dreq {
            self.dev.wake_for_dreq();
        }
        Some(r)
    }

    fn for_each_qpn(&self, f: impl FnMut(u32)) {
        self.map.keys().copied().for_each(f);
    }
}

impl ShardState {
    /// Takes the packets handed over, receives, runs the queue pairs
    /// that need it, sends.
    pub(super) fn progress(&mut self, dev: &Device, shard: &Shard, now: Instant, hold_ack: bool) {
        let mut right = dev.try_read();
        let mut dreq = self.take_inbox(dev, shard, now);
        let mut handed = false;
        let fd = dev.socket.as_raw_fd();
        let rounds = if right.is_some() { RX_ROUNDS } else { 0 };
        for _ in 0..rounds {
            let Some(rx) = right.as_deref_mut() else {
                break;
            };
            let n = rx.recv(fd);
            for i in 0..n {
                let ShardState {
                    tx,
                    qps,
                    active,
                    routes,
                    ..
                } = self;
                let (data, src) = (rx.packet(i), rx.src(i));
                match dev.classify(data, src, rx.segment(i)) {
                    Inbound::Mad(p) => dev.queue_mad(p.payload, src),
                    Inbound::Data(p) => {
                        let qpn = p.bth.dest_qpn;
                        if let Some(qp) = qps.get_mut(&qpn) {
                            dreq |= on_packet(dev, qp, active, tx, &p, src, now);
                        } else if let Some(inbox) = routes.get(&qpn) {
                            if inbox.hand(&dev.spare, data, src) {
                                shard.counters.handed_out.fetch_add(1, Ordering::Relaxed);
                                handed = true;
                            }
                        }
                    }
                    Inbound::Drop => {}
                }
            }
            if !rx.full {
                break;
            }
        }
        drop(right);
        if handed {
            dev.handed_off();
        }
        let ShardState {
            tx,
            qps,
            active,
            next_full_tick,
            ..
        } = self;
        if now >= *next_full_tick {
            *next_full_tick = now + FULL_TICK_EVERY;
            for qp in qps.values_mut() {
                mark_ticking(active, qp);
            }
        }
        let mut i = 0;
        while i < active.len() {
            let Some(qp) = qps.get_mut(&active[i]) else {
                active.swap_remove(i);
                continue;
            };
            qp.tick(now, tx, hold_ack);
            dreq |= qp.dreq_due;
            if qp.needs_tick() {
                i += 1;
            } else {
                qp.ticking = false;
                active.swap_remove(i);
            }
        }
        self.tx.flush();
        // After the flush: the DREQ must not overtake what the queue pair
        // sent before it failed (a NAK).
        if dreq {
            dev.wake_for_dreq();
        }
    }

    /// What a post runs: the posting queue pair's transport (what it may
    /// send now, with the ACK it holds behind it), then the send. It does
    /// not read the socket: a `recvmmsg` ahead of the send put a system
    /// call on the path of every request and every answer, and the
    /// thread's next poll receives anyway. A queue pair that owes a DREQ
    /// wakes the control part, as in [`ShardState::progress`].
    pub(super) fn post_step(&mut self, dev: &Device, qpn: u32, now: Instant) {
        let ShardState { tx, qps, .. } = self;
        let mut dreq = false;
        if let Some(qp) = qps.get_mut(&qpn) {
            qp.tick(now, tx, true);
            dreq = qp.dreq_due;
        }
        tx.flush();
        if dreq {
            dev.wake_for_dreq();
        }
    }

    /// Runs the packets other shards handed over (already checked, for a
    /// queue pair of ours when they were sent); true if one of them made
    /// a queue pair owe a DREQ.
    fn take_inbox(&mut self, dev: &Device, shard: &Shard, now: Instant) -> bool {
        let ShardState {
            tx, qps, active, ..
        } = self;
        let mut dreq = false;
        while let Some(h) = shard.inbox.queue.pop() {
            // The reader parsed it too, but handed over the bytes.
            if let Ok(p) = RocePacket::parse(&h.bytes[..h.len]) {
                if let Some(qp) = qps.get_mut(&p.bth.dest_qpn) {
                    dreq |= on_packet(dev, qp, active, tx, &p, h.src, now);
                }
            }
            shard.counters.handed_in.fetch_add(1, Ordering::Relaxed);
            // Never full: it has room for all of them.
            let _ = dev.spare.push(h);
        }
        dreq
    }
}

/// Runs data packet `p` on its queue pair `qp` (the one its
/// `bth.dest_qpn` names); true if the queue pair now owes the peer a
/// DREQ.
fn on_packet(
    dev: &Device,
    qp: &mut RcQp,
    active: &mut Vec<u32>,
    tx: &mut Tx,
    p: &RocePacket<'_>,
    src: SocketAddrV4,
    now: Instant,
) -> bool {
    mark_ticking(active, qp);
    // Only the connected peer may talk to this QP: its address, and
    // the UDP source port its QP sends from. rxe derives that port
    // from its QPN (0xC000 + hash) and keeps it for the QP's life, as
    // does this provider (its one socket), so the first packet from
    // the peer's address pins it (the CM exchange does not carry it).
    if qp.peer.is_none_or(|peer| peer.addr.ip() != src.ip()) {
        return false;
    }
    match qp.peer_src_port {
        None => qp.peer_src_port = Some(src.port()),
        Some(port) if port != src.port() => {
            dev.counters.spoofed.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        Some(_) => {}
    }
    // The peer's QP talks to us: it has our REP, so this stands for an
    // RTU that was lost or is still on its way (the connection manager
    // sees it when the REP would be resent).
    qp.awaiting_rtu = false;
    qp.on_packet(p, now, tx);
    qp.dreq_due
}

/// Whether a device bound at `local` sends UDP GSO and receives with
/// `UDP_GRO` (the two go together, see `Device::at`): on loopback
/// addresses with `gso` on, on every address with `gso=all`.
pub(super) fn offloads(cfg: &RoceConfig, local: SocketAddrV4) -> bool {
    cfg.gso && (local.ip().is_loopback() || cfg.gso_everywhere)
}
