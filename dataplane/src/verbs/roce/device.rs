//! Devices: one UDP socket at a local address, shared by the whole
//! process (the `DEVICES` registry), and its engine, which receives,
//! hands each packet to its queue pair or to the connection manager,
//! ticks the queue pairs and sends; an idle-progress thread drives a
//! device no application thread drives.
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::cm::{Cm, ConnState};
use super::config::RoceConfig;
use super::io::{bind_udp, Rx, Tx, RX_BATCH};
use super::random::random_u32;
use super::rc::RcQp;
use crate::verbs::{lock, VerbsError};
use crate::wire::ibcm;
use crate::wire::roce::{icrc, Opcode, Packet, Psn, RocePacket};

/// `recvmmsg` batches per progress call (bounds the work of one poll).
const RX_ROUNDS: usize = 8;

/// How often a device ticks every queue pair, idle or not (see
/// `Engine::active`).
const FULL_TICK_EVERY: Duration = Duration::from_millis(10);

/// How often a progress runs the connection manager's timers (REP and
/// DREQ resends, a QP's DREQ after an error); a local disconnect runs them
/// at once.
const CM_TIMERS_EVERY: Duration = Duration::from_millis(1);

/// Puts `qp` on its device's list of queue pairs to tick.
pub(super) fn mark_ticking(active: &mut Vec<u32>, qp: &mut RcQp) {
    if !qp.ticking {
        qp.ticking = true;
        active.push(qp.qpn);
    }
}

pub(super) struct Engine {
    pub(super) local: SocketAddrV4,
    pub(super) tx: Tx,
    rx: Rx,
    pub(super) qps: HashMap<u32, RcQp>,
    /// Queue pairs to tick at the next progress: touched by a packet or a
    /// post, or with timers or output pending (`RcQp::needs_tick`). The
    /// others are idle and cost a progress nothing; every
    /// [`FULL_TICK_EVERY`] all are ticked anyway (what the connection
    /// manager changed).
    pub(super) active: Vec<u32>,
    next_full_tick: Instant,
    /// When a progress next runs the connection manager's timers.
    next_cm_timers: Instant,
    pub(super) cm: Cm,
    pub(super) gsi_psn: Psn,
    verify_icrc: bool,
    /// Inbound packets dropped for a bad ICRC.
    pub(super) bad_icrc: u64,
    /// Packets dropped as spoofed: a REQ whose path GID is not its UDP
    /// source address, or a data packet from the peer's address but not
    /// from the UDP port its QP sends from.
    pub(super) spoofed: u64,
}

/// One UDP socket at a local address, shared by the process.
pub(super) struct Device {
    /// Unique for the process's life (never reused, unlike an address),
    /// so a completion queue's ready list names its device safely.
    pub(super) id: usize,
    pub(super) local: SocketAddrV4,
    /// The socket (owned by the engine's `Tx`), for the idle thread's poll.
    raw_fd: i32,
    pub(super) eng: Mutex<Engine>,
    /// When some thread last ran `progress` (ns since `epoch`).
    last_progress: AtomicU64,
    epoch: Instant,
}

/// How long the device may go without an application thread driving it
/// before its idle-progress thread steps in.
const IDLE_AFTER: Duration = Duration::from_millis(1);

impl Device {
    pub(super) fn mark_progress(&self, now: Instant) {
        let ns = now.saturating_duration_since(self.epoch).as_nanos() as u64;
        self.last_progress.store(ns, Ordering::Relaxed);
    }

    fn idle_for(&self, now: Instant) -> Duration {
        let last = Duration::from_nanos(self.last_progress.load(Ordering::Relaxed));
        now.saturating_duration_since(self.epoch)
            .saturating_sub(last)
    }

    /// The device's idle-progress thread (one per device, never per
    /// connection): when no application thread has driven the device for
    /// [`IDLE_AFTER`], it receives and runs the transport, so one-sided
    /// operations, ACKs and timers proceed against a process that is not
    /// polling (as an HCA would). It exits when the device is dropped.
    fn spawn_idle_thread(dev: &Arc<Device>) {
        let weak = Arc::downgrade(dev);
        let _ = std::thread::Builder::new()
            .name("roce-idle".into())
            .spawn(move || loop {
                // Holding the device keeps its socket open during poll(2).
                let Some(dev) = weak.upgrade() else { break };
                let mut pfd = libc::pollfd {
                    fd: dev.raw_fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; the fd stays open (see above).
                unsafe { libc::poll(&mut pfd, 1, 2) };
                let now = Instant::now();
                if dev.idle_for(now) < IDLE_AFTER {
                    drop(dev);
                    std::thread::sleep(IDLE_AFTER);
                    continue;
                }
                if let Ok(mut eng) = dev.eng.try_lock() {
                    eng.progress(now);
                };
            });
    }
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

/// Source of [`Device::id`].
static DEVICE_IDS: AtomicUsize = AtomicUsize::new(1);

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
        let fd = loop {
            match bind_udp(local) {
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
        let gsi_psn = Psn::from_masked(random_u32()?);
        devs.retain(|(a, w)| w.strong_count() > 0 || *a != local);
        let dev = Arc::new(Device {
            id: DEVICE_IDS.fetch_add(1, Ordering::Relaxed),
            local,
            raw_fd: fd.as_raw_fd(),
            last_progress: AtomicU64::new(0),
            epoch: Instant::now(),
            eng: Mutex::new(Engine {
                local,
                tx: Tx::new(fd, local),
                rx: Rx::new(),
                qps: HashMap::new(),
                active: Vec::new(),
                next_full_tick: Instant::now(),
                next_cm_timers: Instant::now(),
                cm: Cm::default(),
                gsi_psn,
                verify_icrc: cfg.verify_icrc,
                bad_icrc: 0,
                spoofed: 0,
            }),
        });
        devs.push((local, Arc::downgrade(&dev)));
        Device::spawn_idle_thread(&dev);
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
}

impl Engine {
    /// A fresh random 24-bit QPN: an off-path sender cannot guess the
    /// QPN of a connection (it must also match address, port and PSN).
    pub(super) fn alloc_qpn(&mut self) -> Result<u32, VerbsError> {
        loop {
            let q = random_u32()? & 0xFF_FFFF;
            // Never QPN 0 or 1 (QP0/QP1 are special, IBTA Vol. 1 ch. 12).
            if q > 1 && !self.qps.contains_key(&q) {
                return Ok(q);
            }
        }
    }

    /// Receives, runs every QP, sends.
    pub(super) fn progress(&mut self, now: Instant) {
        let fd = self.tx.raw_fd();
        for _ in 0..RX_ROUNDS {
            let n = self.rx.recv(fd);
            for i in 0..n {
                self.dispatch(i, now);
            }
            if n < RX_BATCH {
                break;
            }
        }
        let Engine {
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
            qp.tick(now, tx);
            if qp.needs_tick() {
                i += 1;
            } else {
                qp.ticking = false;
                active.swap_remove(i);
            }
        }
        // The connection manager's timers walk every connection; their
        // periods are hundreds of milliseconds.
        if now >= self.next_cm_timers {
            self.next_cm_timers = now + CM_TIMERS_EVERY;
            self.cm_timers(now);
        }
        self.tx.flush();
    }

    fn dispatch(&mut self, i: usize, now: Instant) {
        let Engine {
            rx,
            tx,
            qps,
            cm,
            local,
            gsi_psn,
            verify_icrc,
            bad_icrc,
            spoofed,
            active,
            ..
        } = self;
        let data = rx.packet(i);
        let src = rx.srcs[i];
        if *verify_icrc {
            let ip = icrc::Ipv4Header::plain_udp_socket(src.ip().octets(), local.ip().octets());
            let ports = icrc::UdpPorts {
                src: src.port(),
                dst: local.port(),
            };
            let want = Packet::new_checked(data).map(|p| p.icrc());
            if icrc::compute_ipv4(&ip, ports, data).ok() != want.ok() {
                *bad_icrc += 1;
                return;
            }
        }
        let Ok(p) = RocePacket::parse(data) else {
            return;
        };
        if p.bth.dest_qpn == ibcm::GSI_QPN {
            if p.bth.opcode == Opcode::UdSendOnly {
                cm.on_mad(p.payload, src, qps, tx, gsi_psn, now, spoofed);
            }
            return;
        }
        let Some(qp) = qps.get_mut(&p.bth.dest_qpn) else {
            return;
        };
        mark_ticking(active, qp);
        // Only the connected peer may talk to this QP: its address, and
        // the UDP source port its QP sends from. rxe derives that port
        // from its QPN (0xC000 + hash) and keeps it for the QP's life, as
        // does this provider (its one socket), so the first packet from
        // the peer's address pins it (the CM exchange does not carry it).
        if qp.peer.is_none_or(|peer| peer.addr.ip() != src.ip()) {
            return;
        }
        match qp.peer_src_port {
            None => qp.peer_src_port = Some(src.port()),
            Some(port) if port != src.port() => {
                *spoofed += 1;
                return;
            }
            Some(_) => {}
        }
        if qp.awaiting_rtu {
            // The peer's QP talks to us: it has our REP, so this stands
            // for an RTU that was lost or is still on its way.
            qp.awaiting_rtu = false;
            if let Some(rec) = qp.conn.and_then(|c| cm.conns.get_mut(&c.local_comm_id)) {
                if matches!(rec.state, ConnState::RepSent { .. }) {
                    rec.state = ConnState::Established;
                }
            }
        }
        qp.on_packet(&p, now, tx);
    }

    /// Runs the connection manager's timers ([`Cm::timers`]).
    pub(super) fn cm_timers(&mut self, now: Instant) {
        let Engine {
            tx,
            qps,
            cm,
            gsi_psn,
            ..
        } = self;
        cm.timers(now, qps, tx, gsi_psn);
    }
}
