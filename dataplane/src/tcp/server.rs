//! The responder side: a non-blocking acceptor and the connections of one
//! worker, served in passes (see the module doc of [`super`]).

use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;

use nix::sys::socket::{send, MsgFlags};

use super::buf::{InBuf, OutBuf, ZeroedBuf};
use super::epoll::{EpollSet, Interest};
use super::peers::PeerCounts;
use super::{Readiness, TcpConfig, TcpError, TcpStats};
use crate::engine::Instant;
use crate::service::{Dispatch, Dispatcher};
use crate::wire::rpc::{write_record_header, RecordMarker, RecordReassembler};

/// A non-blocking TCP listener.
#[derive(Debug)]
pub struct TcpAcceptor {
    listener: TcpListener,
    local: SocketAddr,
}

impl TcpAcceptor {
    /// Listens on `addr` (port 0: a free port, see
    /// [`local_addr`](Self::local_addr)).
    ///
    /// # Errors
    /// [`TcpError::Bind`] (address in use, not configured on this host),
    /// [`TcpError::Io`] when the socket cannot be made non-blocking.
    pub fn bind(addr: SocketAddr) -> Result<TcpAcceptor, TcpError> {
        let listener = TcpListener::bind(addr).map_err(|source| TcpError::Bind { addr, source })?;
        TcpAcceptor::from_listener(listener)
    }

    /// Takes a listener bound elsewhere (e.g. by the control plane) and
    /// makes it non-blocking.
    ///
    /// # Errors
    /// [`TcpError::Io`] when the socket calls fail.
    pub fn from_listener(listener: TcpListener) -> Result<TcpAcceptor, TcpError> {
        let io = |what| move |source| TcpError::Io { what, source };
        listener
            .set_nonblocking(true)
            .map_err(io("set listener non-blocking"))?;
        let local = listener.local_addr().map_err(io("listener address"))?;
        Ok(TcpAcceptor { listener, local })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Its URL, `tcp://IP:PORT`.
    pub fn url(&self) -> String {
        format!("tcp://{}", self.local)
    }

    /// Accepts up to `max` waiting connections without blocking and hands
    /// each stream (still in blocking mode; [`TcpConnections::add`] changes
    /// that) to `on_accept`. Returns how many were accepted.
    ///
    /// A connection the peer abandoned before it was accepted
    /// (`ECONNABORTED`) is skipped.
    ///
    /// # Errors
    /// Any other `accept` error, e.g. `EMFILE` when the process is out of
    /// file descriptors; the connections accepted before it were handed on.
    pub fn accept_ready(
        &self,
        max: usize,
        mut on_accept: impl FnMut(TcpStream, SocketAddr),
    ) -> io::Result<usize> {
        let mut accepted = 0;
        while accepted < max {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    accepted += 1;
                    on_accept(stream, peer);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(accepted)
    }
}

/// The listening socket, for a control thread that waits for
/// connections with `poll(2)` before calling
/// [`accept_ready`](TcpAcceptor::accept_ready).
impl AsFd for TcpAcceptor {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }
}

/// Why a connection was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseReason {
    /// The peer ended the stream between records, and every reply was
    /// written.
    PeerClosed,
    /// A fragment header announced more than `max_record_len`.
    RecordTooLarge,
    /// The stream ended inside a record.
    Truncated,
    /// A socket error (reset, broken pipe, ...).
    Io(io::ErrorKind),
    /// No byte moved for `idle_timeout`.
    IdleTimeout,
    /// No byte came in `first_byte_timeout` after the connection was added.
    SilentTimeout,
    /// [`TcpConnections::close_all`].
    Shutdown,
}

/// A call a [`TcpRelay`] took from a connection, to be answered later
/// with [`TcpConnections::deliver`] (or given up with
/// [`TcpConnections::forget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpCallId {
    fd: RawFd,
    /// The connection's serial number: a descriptor is reused by the next
    /// socket, a serial number never.
    serial: u64,
}

/// What a [`TcpRelay`] did with a call record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relayed {
    /// Not one of its calls: the services answer it.
    NotMine,
    /// Taken: its reply comes later through [`TcpConnections::deliver`].
    Taken,
    /// Answered at once: the reply message is the first `len` bytes of
    /// the space the relay was given.
    Answered(usize),
}

/// Takes calls away from a connection's services, to answer them later
/// (the gateway's relay to its backends). Offered every complete call
/// record before the services see it.
pub trait TcpRelay {
    /// Looks at the call `record` that arrived from `peer` on the call
    /// `from`; `reply` is where an immediate answer goes.
    fn relay(
        &mut self,
        from: TcpCallId,
        peer: SocketAddr,
        record: &[u8],
        reply: &mut [u8],
    ) -> Relayed;
}

/// No relay: the services answer every call.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRelay;

impl TcpRelay for NoRelay {
    fn relay(&mut self, _: TcpCallId, _: SocketAddr, _: &[u8], _: &mut [u8]) -> Relayed {
        Relayed::NotMine
    }
}

/// One connection: its socket, its buffers and where the stream is.
struct Conn {
    stream: TcpStream,
    fd: RawFd,
    peer: SocketAddr,
    input: InBuf,
    reassembler: RecordReassembler<ZeroedBuf>,
    output: OutBuf,
    /// The peer sent end of stream; no more reads.
    peer_closed: bool,
    /// The last pass stopped reading because the output had no room for a
    /// reply; the connection waits for its socket to become writable.
    stalled: bool,
    /// Last time a byte moved either way.
    last_active: Instant,
    /// A byte came from the peer (the first-byte timeout no longer
    /// applies).
    heard: bool,
    /// Shutting down: every reply is written and our side of the stream
    /// is shut (FIN sent); input is read only to see the peer's end.
    write_shut: bool,
    /// What the epoll set watches this socket for ([`Interest::NONE`]:
    /// not registered).
    registered: Interest,
    /// The last epoll pass that served it (a socket both ready and carried
    /// is served once).
    pass: u64,
    /// Set at [`TcpConnections::add`]; never reused.
    serial: u64,
    /// Calls a relay took and has not answered yet: the connection does
    /// not shut its side while any remain.
    deferred: u32,
    /// This connection's own figures (`rpcrdmad status`).
    counts: TcpConnCounts,
}

/// One TCP connection's figures, as `rpcrdmad status` shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpConnCounts {
    /// Call records received whole.
    pub calls: u64,
    /// Replies written into the output (the relay's included).
    pub replies: u64,
    /// Bytes read from the socket.
    pub bytes_in: u64,
    /// Bytes written to the socket.
    pub bytes_out: u64,
    /// When the connection was added (the worker's clock).
    pub opened: Instant,
}

impl Conn {
    /// Why the connection is due to close for silence at `now`, if it is.
    fn timed_out(&self, cfg: &TcpConfig, now: Instant) -> Option<CloseReason> {
        let quiet = now.saturating_duration_since(self.last_active);
        match (self.heard, cfg.first_byte_timeout, cfg.idle_timeout) {
            (false, Some(t), _) if quiet >= t => Some(CloseReason::SilentTimeout),
            (_, _, Some(t)) if quiet >= t => Some(CloseReason::IdleTimeout),
            _ => None,
        }
    }

    fn new(stream: TcpStream, peer: SocketAddr, cfg: &TcpConfig, now: Instant) -> io::Result<Conn> {
        stream.set_nonblocking(true)?;
        // Each pass writes whole replies at once; Nagle would only hold
        // back the tail of one.
        stream.set_nodelay(true)?;
        Ok(Conn {
            fd: stream.as_raw_fd(),
            stream,
            peer,
            input: InBuf::new(cfg.read_buffer_len)?,
            reassembler: RecordReassembler::with_buffer(ZeroedBuf::new(cfg.max_record_len)?),
            output: OutBuf::new(RecordMarker::LEN + cfg.max_reply_len, cfg.batch_len)?,
            peer_closed: false,
            stalled: false,
            last_active: now,
            heard: false,
            write_shut: false,
            registered: Interest::NONE,
            pass: 0,
            serial: 0,
            deferred: 0,
            counts: TcpConnCounts {
                calls: 0,
                replies: 0,
                bytes_in: 0,
                bytes_out: 0,
                opened: now,
            },
        })
    }

    /// Answers the record the reassembler completed, if there is one (or
    /// hands it to the relay); returns whether there was.
    fn answer_complete<D: Dispatcher + ?Sized, R: TcpRelay + ?Sized>(
        &mut self,
        services: &D,
        relay: &mut R,
        stats: &mut TcpStats,
    ) -> bool {
        let Some(record) = self.reassembler.poll_record() else {
            return false;
        };
        let id = TcpCallId {
            fd: self.fd,
            serial: self.serial,
        };
        self.counts.calls += 1;
        let replies_before = stats.rpcs;
        let taken = answer(
            services,
            relay,
            (id, self.peer),
            record,
            &mut self.output,
            stats,
        );
        self.counts.replies += stats.rpcs - replies_before;
        if taken {
            self.deferred += 1;
        }
        true
    }

    /// One pass: take input, answer complete calls while the output has
    /// room for a reply, write what is pending. Returns the work done, or
    /// why the connection must close.
    fn service<D: Dispatcher + ?Sized, R: TcpRelay + ?Sized>(
        &mut self,
        services: &D,
        relay: &mut R,
        cfg: &TcpConfig,
        stats: &mut TcpStats,
        now: Instant,
    ) -> Result<usize, CloseReason> {
        let mut work = 0;
        let mut reads_left = cfg.reads_per_poll;
        self.stalled = false;
        loop {
            // Back-pressure: a call is taken from the stream only when its
            // reply is sure to fit, so the reassembler never holds a
            // complete record it cannot answer; when the peer does not read
            // its replies, its calls stay in its socket and TCP flow
            // control slows it down.
            if !self.output.make_reserve() {
                work += self.flush(stats, now)?;
                if !self.output.make_reserve() {
                    self.stalled = true;
                    stats.output_stalls += 1;
                    break;
                }
            }
            if self.input.is_empty() {
                if self.peer_closed || reads_left == 0 {
                    break;
                }
                reads_left -= 1;
                match self.stream.read(self.input.space()) {
                    Ok(0) => {
                        self.peer_closed = true;
                        break;
                    }
                    Ok(n) => {
                        self.input.filled(n);
                        stats.bytes_in += n as u64;
                        self.counts.bytes_in += n as u64;
                        self.last_active = now;
                        self.heard = true;
                        work += 1;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(CloseReason::Io(e.kind())),
                }
            }
            let Ok(used) = self.reassembler.push(self.input.unread()) else {
                // Answers to the calls before the bad record go out first,
                // as far as the socket takes them now (best effort: the
                // close that follows resets the connection).
                let _ = self.flush(stats, now);
                return Err(CloseReason::RecordTooLarge);
            };
            self.input.consume(used);
            if self.answer_complete(services, relay, stats) {
                work += 1;
            }
        }
        work += self.flush(stats, now)?;
        if self.peer_closed && self.input.is_empty() && self.output.is_empty() {
            return Err(if self.reassembler.is_mid_record() {
                CloseReason::Truncated
            } else {
                CloseReason::PeerClosed
            });
        }
        Ok(work)
    }

    /// One pass while shutting down ([`TcpConnections::begin_shutdown`]):
    /// a call whose record has begun is still read and answered, no new
    /// record is started; once nothing is in progress and every reply is
    /// written, our side of the stream is shut (the peer reads its last
    /// reply, then end of stream) and input is read only to see the
    /// peer's end, which closes the connection.
    fn finish<D: Dispatcher + ?Sized, R: TcpRelay + ?Sized>(
        &mut self,
        services: &D,
        relay: &mut R,
        cfg: &TcpConfig,
        stats: &mut TcpStats,
        now: Instant,
    ) -> Result<usize, CloseReason> {
        let mut work = 0;
        let mut reads_left = cfg.reads_per_poll;
        self.stalled = false;
        while !self.write_shut && self.reassembler.is_mid_record() {
            if !self.output.make_reserve() {
                work += self.flush(stats, now)?;
                if !self.output.make_reserve() {
                    self.stalled = true;
                    break;
                }
            }
            if self.input.is_empty() {
                if self.peer_closed || reads_left == 0 {
                    break;
                }
                reads_left -= 1;
                match self.read(stats, now)? {
                    0 => break,
                    n => work += n.min(1),
                }
                continue;
            }
            let Ok(used) = self.reassembler.push(self.input.unread()) else {
                let _ = self.flush(stats, now);
                return Err(CloseReason::RecordTooLarge);
            };
            self.input.consume(used);
            if self.answer_complete(services, relay, stats) {
                work += 1;
            }
        }
        work += self.flush(stats, now)?;
        if !self.write_shut {
            if self.reassembler.is_mid_record() {
                if self.peer_closed && self.input.is_empty() {
                    return Err(CloseReason::Truncated);
                }
                return Ok(work);
            }
            if !self.output.is_empty() {
                self.stalled = true;
                return Ok(work);
            }
            if self.deferred > 0 {
                // A relayed call's reply is still to come.
                return Ok(work);
            }
            // Everything answered and written: FIN. An error means the
            // peer is gone already.
            if self.stream.shutdown(std::net::Shutdown::Write).is_err() {
                return Err(CloseReason::Shutdown);
            }
            self.write_shut = true;
            work += 1;
        }
        // Calls after the last one we answer are not served: discard.
        self.input.consume(self.input.unread().len());
        while !self.peer_closed && reads_left > 0 {
            reads_left -= 1;
            if self.read(stats, now)? == 0 {
                break;
            }
            self.input.consume(self.input.unread().len());
        }
        if self.peer_closed {
            return Err(CloseReason::Shutdown);
        }
        Ok(work)
    }

    /// One non-blocking `read` into the (empty) input buffer: the bytes
    /// read, 0 when none are available or at end of stream (then
    /// `peer_closed` is set).
    fn read(&mut self, stats: &mut TcpStats, now: Instant) -> Result<usize, CloseReason> {
        loop {
            match self.stream.read(self.input.space()) {
                Ok(0) => {
                    self.peer_closed = true;
                    return Ok(0);
                }
                Ok(n) => {
                    self.input.filled(n);
                    stats.bytes_in += n as u64;
                    self.counts.bytes_in += n as u64;
                    self.last_active = now;
                    self.heard = true;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(CloseReason::Io(e.kind())),
            }
        }
    }

    /// Writes pending output until done or the socket is full.
    fn flush(&mut self, stats: &mut TcpStats, now: Instant) -> Result<usize, CloseReason> {
        let mut work = 0;
        while !self.output.is_empty() {
            // MSG_NOSIGNAL: a peer gone away is EPIPE here, not SIGPIPE in
            // whatever process embeds this crate.
            match send(self.fd, self.output.pending(), MsgFlags::MSG_NOSIGNAL) {
                Ok(0) => return Err(CloseReason::Io(io::ErrorKind::WriteZero)),
                Ok(n) => {
                    self.output.consume(n);
                    stats.bytes_out += n as u64;
                    self.counts.bytes_out += n as u64;
                    self.last_active = now;
                    work += 1;
                }
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(CloseReason::Io(io::Error::from(e).kind())),
            }
        }
        Ok(work)
    }

    /// The `poll(2)` events this connection waits for.
    fn interest(&self) -> libc::c_short {
        if self.stalled {
            libc::POLLOUT
        } else if self.output.is_empty() {
            libc::POLLIN
        } else {
            libc::POLLIN | libc::POLLOUT
        }
    }

    /// [`interest`](Self::interest) in epoll terms.
    fn epoll_interest(&self) -> Interest {
        if self.stalled {
            Interest::WRITE
        } else if self.output.is_empty() {
            Interest::READ
        } else {
            Interest::READ_WRITE
        }
    }

    /// Whether a pass has work to do without the socket being ready:
    /// input left over because the read budget ran out mid-buffer.
    fn has_buffered_input(&self) -> bool {
        !self.stalled && !self.input.is_empty()
    }
}

impl core::fmt::Debug for Conn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Conn")
            .field("peer", &self.peer)
            .field("peer_closed", &self.peer_closed)
            .field("stalled", &self.stalled)
            .finish()
    }
}

/// Answers one complete call record into `output`'s reserve (which the
/// caller made sure exists: the record mark plus `max_reply_len`), unless
/// `relay` takes it: then returns true and the reply comes later.
fn answer<D: Dispatcher + ?Sized, R: TcpRelay + ?Sized>(
    services: &D,
    relay: &mut R,
    (id, peer): (TcpCallId, SocketAddr),
    record: &[u8],
    output: &mut OutBuf,
    stats: &mut TcpStats,
) -> bool {
    let (mark, body) = output.reserve_mut().split_at_mut(RecordMarker::LEN);
    let dispatched = match relay.relay(id, peer, record, body) {
        Relayed::Taken => return true,
        Relayed::Answered(len) => Dispatch::Reply { len, ddp: None },
        Relayed::NotMine => services.dispatch(record, body),
    };
    match dispatched {
        Dispatch::Reply { len, .. } => {
            // Over TCP the DDP-eligible item simply stays inline. One
            // fragment: len <= max_reply_len, which the config keeps
            // under 2^31.
            if write_record_header(mark, len).is_ok() {
                output.commit(RecordMarker::LEN + len);
                stats.rpcs += 1;
            } else {
                stats.records_dropped += 1;
            }
        }
        Dispatch::Drop => stats.records_dropped += 1,
    }
    false
}

/// The TCP connections of one worker, served in passes by
/// [`poll`](Self::poll). Not shared: one worker owns it.
#[derive(Debug)]
pub struct TcpConnections {
    cfg: TcpConfig,
    conns: Vec<Conn>,
    pollfds: Vec<libc::pollfd>,
    stats: TcpStats,
    /// [`begin_shutdown`](Self::begin_shutdown) was called.
    stopping: bool,
    /// With [`Readiness::Epoll`] or `Auto`: every connection's socket.
    epoll: Option<EpollSet>,
    /// Index in `conns` of each open socket, by descriptor (`NO_SLOT`:
    /// none); grown when a connection is added, never per pass.
    slot_of_fd: Vec<u32>,
    /// The serial number of the next connection added.
    next_serial: u64,
    /// Sockets an epoll pass serves: the ready ones, then `carry`.
    due: Vec<RawFd>,
    /// Sockets with input left in their buffer after a pass (the read
    /// budget ran out): served next pass whether or not they are ready.
    carry: Vec<RawFd>,
    /// Epoll passes so far.
    pass: u64,
    /// When an epoll pass next looks for idle connections.
    next_idle_scan: Instant,
    /// The per-address counts an acceptor counted each connection into:
    /// a connection closed here, for whatever reason, is counted out.
    peers: Option<Arc<PeerCounts>>,
}

/// `slot_of_fd` entry of a descriptor that is not one of ours.
const NO_SLOT: u32 = u32::MAX;

impl TcpConnections {
    /// An empty set with room for `cfg.max_connections`.
    ///
    /// # Errors
    /// [`TcpError::Config`] from [`TcpConfig::validate`].
    pub fn new(cfg: TcpConfig) -> Result<TcpConnections, TcpError> {
        cfg.validate()?;
        let epoll = match cfg.readiness {
            Readiness::Epoll | Readiness::Auto { .. } => {
                Some(EpollSet::new().map_err(|source| TcpError::Io {
                    what: "create the connections' epoll set",
                    source,
                })?)
            }
            Readiness::ReadAll | Readiness::Poll => None,
        };
        Ok(TcpConnections {
            cfg,
            conns: Vec::with_capacity(cfg.max_connections),
            pollfds: Vec::with_capacity(cfg.max_connections),
            stats: TcpStats::default(),
            stopping: false,
            epoll,
            slot_of_fd: Vec::new(),
            next_serial: 1,
            due: Vec::with_capacity(super::epoll::EVENTS_PER_WAIT + cfg.max_connections.min(1024)),
            carry: Vec::with_capacity(cfg.max_connections.min(1024)),
            pass: 0,
            next_idle_scan: Instant(0),
            peers: None,
        })
    }

    /// Counts every connection closed from now on out of `peers` (the
    /// acceptor counted it in before handing it over).
    pub fn count_peers_out_of(&mut self, peers: Option<Arc<PeerCounts>>) {
        self.peers = peers;
    }

    fn count_out(&self, peer: SocketAddr) {
        if let Some(p) = &self.peers {
            p.remove(peer.ip());
        }
    }

    /// The configuration.
    pub fn config(&self) -> &TcpConfig {
        &self.cfg
    }

    /// Open connections.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// The counters so far.
    pub fn stats(&self) -> &TcpStats {
        &self.stats
    }

    /// Peer addresses of the open connections.
    pub fn peers(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.conns.iter().map(|c| c.peer)
    }

    /// Each open connection's peer and figures (for a status report; the
    /// data path never calls it).
    pub fn connection_counts(&self) -> impl Iterator<Item = (SocketAddr, TcpConnCounts)> + '_ {
        self.conns.iter().map(|c| (c.peer, c.counts))
    }

    /// Takes an accepted stream: makes it non-blocking, disables Nagle and
    /// reserves its buffers (the only allocation a connection makes).
    ///
    /// # Errors
    /// [`TcpError::TooManyConnections`] when `max_connections` are open;
    /// [`TcpError::Io`] when the socket options or the buffer mappings
    /// fail. The stream is dropped (closed) and counted as refused.
    pub fn add(&mut self, stream: TcpStream, now: Instant) -> Result<(), TcpError> {
        let peer = stream
            .peer_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        if self.conns.len() >= self.cfg.max_connections {
            self.stats.connections_refused += 1;
            self.count_out(peer);
            return Err(TcpError::TooManyConnections {
                max: self.cfg.max_connections,
                peer,
            });
        }
        let registered = Conn::new(stream, peer, &self.cfg, now).and_then(|mut c| {
            if let Some(epoll) = &self.epoll {
                epoll.add(c.fd, Interest::READ)?;
                c.registered = Interest::READ;
            }
            Ok(c)
        });
        match registered {
            Ok(mut c) => {
                c.serial = self.next_serial;
                self.next_serial += 1;
                let fd = c.fd as usize;
                if self.slot_of_fd.len() <= fd {
                    self.slot_of_fd.resize(fd + 1, NO_SLOT);
                }
                self.slot_of_fd[fd] = self.conns.len() as u32;
                self.conns.push(c);
                self.stats.connections_opened += 1;
                Ok(())
            }
            Err(source) => {
                self.stats.connections_refused += 1;
                self.count_out(peer);
                Err(TcpError::Io {
                    what: "set up an accepted connection",
                    source,
                })
            }
        }
    }

    /// One pass over the connections (see the module doc): reads what is
    /// available, answers every complete call through `services`, writes
    /// the replies, and closes connections that ended, broke the protocol,
    /// failed or idled out (counted in [`stats`](Self::stats)). Returns the
    /// work done (reads, writes, records, closes); 0 means idle. Never
    /// blocks, never allocates.
    ///
    /// `services` is the worker's [`Dispatcher`]
    /// ([`ServiceTable`](crate::service::ServiceTable) in the daemon); a
    /// reply's DDP-eligible item simply stays inline.
    pub fn poll<D: Dispatcher + ?Sized>(&mut self, services: &D, now: Instant) -> usize {
        self.poll_with(services, &mut NoRelay, now)
    }

    /// [`poll`](Self::poll), offering every call to `relay` first: a call
    /// it takes is answered later with [`deliver`](Self::deliver).
    pub fn poll_with<D: Dispatcher + ?Sized, R: TcpRelay + ?Sized>(
        &mut self,
        services: &D,
        relay: &mut R,
        now: Instant,
    ) -> usize {
        if self.conns.is_empty() {
            return 0;
        }
        let use_poll = match self.cfg.readiness {
            Readiness::ReadAll => false,
            Readiness::Poll => true,
            Readiness::Epoll => return self.poll_epoll(services, relay, now),
            Readiness::Auto { poll_from } if self.conns.len() >= poll_from => {
                return self.poll_epoll(services, relay, now)
            }
            Readiness::Auto { .. } => false,
        };
        self.scan(services, relay, now, use_poll)
    }

    /// Adds to `fds` what becomes ready when a connection has work for a
    /// sleeping worker (docs/WORKER.md, "Doorbells"): the epoll set,
    /// which holds every socket with its interest, or else each socket
    /// with its own (input, and room while output waits). Readiness is
    /// the kernel's and level-triggered: nothing to arm, and work that
    /// came before the sleep ends it at once.
    pub fn wakeup_fds(&self, fds: &mut Vec<libc::pollfd>) {
        match &self.epoll {
            Some(e) => fds.push(crate::wake::pollfd(e.raw_fd())),
            None => fds.extend(self.conns.iter().map(|c| libc::pollfd {
                fd: c.fd,
                events: c.interest(),
                revents: 0,
            })),
        }
    }

    /// Answers the relayed call `id` with the RPC reply `reply` (one
    /// record). False when the connection is gone, or its output has no
    /// room for the reply now (counted as a dropped record; the client
    /// retransmits).
    pub fn deliver(&mut self, id: TcpCallId, reply: &[u8], now: Instant) -> bool {
        let Some(i) = self.index_of(id) else {
            return false;
        };
        let conn = &mut self.conns[i];
        conn.deferred = conn.deferred.saturating_sub(1);
        if !conn.output.make_reserve() {
            let _ = conn.flush(&mut self.stats, now);
        }
        let fits = reply.len() <= self.cfg.max_reply_len && conn.output.make_reserve();
        if !fits {
            self.stats.records_dropped += 1;
            return false;
        }
        let (mark, body) = conn.output.reserve_mut().split_at_mut(RecordMarker::LEN);
        if write_record_header(mark, reply.len()).is_err() {
            self.stats.records_dropped += 1;
            return false;
        }
        body[..reply.len()].copy_from_slice(reply);
        conn.output.commit(RecordMarker::LEN + reply.len());
        self.stats.rpcs += 1;
        conn.counts.replies += 1;
        conn.last_active = now;
        // Written now if the socket takes it; otherwise the connection
        // waits for writability like any other.
        let _ = conn.flush(&mut self.stats, now);
        sync_interest(self.epoll.as_ref(), conn);
        true
    }

    /// The relayed call `id` will not be answered (its backend call was
    /// given up): the connection no longer waits for it.
    pub fn forget(&mut self, id: TcpCallId) {
        if let Some(i) = self.index_of(id) {
            let conn = &mut self.conns[i];
            conn.deferred = conn.deferred.saturating_sub(1);
        }
    }

    /// The connection of `id`, if it is still open.
    fn index_of(&self, id: TcpCallId) -> Option<usize> {
        let slot = *self.slot_of_fd.get(usize::try_from(id.fd).ok()?)?;
        let conn = self.conns.get(slot as usize)?;
        (conn.serial == id.serial).then_some(slot as usize)
    }

    /// A pass that looks at every connection: after a `poll(2)` over all
    /// of them (`use_poll`), or with a `read` on each.
    fn scan<D: Dispatcher + ?Sized, R: TcpRelay + ?Sized>(
        &mut self,
        services: &D,
        relay: &mut R,
        now: Instant,
        use_poll: bool,
    ) -> usize {
        let ready = use_poll && self.poll_readiness();
        let mut work = 0;
        let mut i = 0;
        while i < self.conns.len() {
            let conn = &mut self.conns[i];
            // While stopping, a connection that has not shut its side yet
            // is looked at every pass: it may only need its FIN.
            let due = !ready
                || self.pollfds[i].revents != 0
                || conn.has_buffered_input()
                || (self.stopping && !conn.write_shut);
            if due {
                self.stats.connections_served += 1;
            }
            let outcome = match (due, self.stopping) {
                (false, _) => Ok(0),
                (true, false) => conn.service(services, relay, &self.cfg, &mut self.stats, now),
                (true, true) => conn.finish(services, relay, &self.cfg, &mut self.stats, now),
            };
            let outcome = outcome.and_then(|w| match conn.timed_out(&self.cfg, now) {
                Some(reason) if w == 0 => Err(reason),
                _ => Ok(w),
            });
            match outcome {
                Ok(w) => {
                    // Auto mode may switch to epoll on a later pass: keep
                    // the registration in step (a system call only when
                    // the interest changed).
                    sync_interest(self.epoll.as_ref(), &mut self.conns[i]);
                    work += w;
                    i += 1;
                }
                Err(reason) => {
                    self.close(i, reason);
                    if ready {
                        self.pollfds.swap_remove(i);
                    }
                    work += 1;
                }
            }
        }
        work
    }

    /// An epoll pass: serves the sockets epoll reports ready and those
    /// with input left from the last pass, nothing else; looks for idle
    /// connections a few times per idle timeout. While shutting down,
    /// every connection is looked at (see [`scan`](Self::scan)).
    fn poll_epoll<D: Dispatcher + ?Sized, R: TcpRelay + ?Sized>(
        &mut self,
        services: &D,
        relay: &mut R,
        now: Instant,
    ) -> usize {
        if self.stopping || self.epoll.is_none() {
            return self.scan(services, relay, now, false);
        }
        self.pass += 1;
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        let failed = self.epoll.as_mut().map(|e| e.ready(&mut due).is_err());
        if failed == Some(true) {
            // Cannot tell who is ready: serve everyone this pass.
            due.extend(self.conns.iter().map(|c| c.fd));
        }
        due.append(&mut self.carry);
        let mut work = 0;
        for &fd in &due {
            let Some(&slot) = self.slot_of_fd.get(fd as usize) else {
                continue;
            };
            let i = slot as usize;
            let Some(conn) = self.conns.get_mut(i) else {
                continue;
            };
            if conn.pass == self.pass {
                continue;
            }
            conn.pass = self.pass;
            self.stats.connections_served += 1;
            match conn.service(services, relay, &self.cfg, &mut self.stats, now) {
                Ok(w) => {
                    sync_interest(self.epoll.as_ref(), conn);
                    if conn.has_buffered_input() {
                        self.carry.push(fd);
                    }
                    work += w;
                }
                Err(reason) => {
                    self.close(i, reason);
                    work += 1;
                }
            }
        }
        self.due = due;
        work + self.close_idle(now)
    }

    /// Closes connections idle for `idle_timeout`, or silent for
    /// `first_byte_timeout`, looking at most four times per (shorter)
    /// timeout period (a connection closes within 1.25 timeouts, and a
    /// pass costs nothing per connection otherwise).
    fn close_idle(&mut self, now: Instant) -> usize {
        let Some(timeout) = [self.cfg.idle_timeout, self.cfg.first_byte_timeout]
            .into_iter()
            .flatten()
            .min()
        else {
            return 0;
        };
        if now < self.next_idle_scan {
            return 0;
        }
        self.next_idle_scan = now.saturating_add(timeout / 4);
        let mut closed = 0;
        let mut i = 0;
        while i < self.conns.len() {
            if let Some(reason) = self.conns[i].timed_out(&self.cfg, now) {
                self.close(i, reason);
                closed += 1;
            } else {
                i += 1;
            }
        }
        closed
    }

    /// Fills `pollfds` and runs `poll(2)` with a zero timeout; false when
    /// it failed (then every connection is served).
    fn poll_readiness(&mut self) -> bool {
        self.pollfds.clear();
        self.pollfds.extend(self.conns.iter().map(|c| libc::pollfd {
            fd: c.fd,
            events: c.interest(),
            revents: 0,
        }));
        // SAFETY: the pointer and length describe `pollfds`, which lives
        // across the call; the fds are owned by `conns` and open.
        let n = unsafe {
            libc::poll(
                self.pollfds.as_mut_ptr(),
                self.pollfds.len() as libc::nfds_t,
                0,
            )
        };
        n >= 0
    }

    /// Removes connection `i` (swapping the last into its place) and
    /// counts why.
    fn close(&mut self, i: usize, reason: CloseReason) {
        let s = &mut self.stats;
        match reason {
            CloseReason::PeerClosed | CloseReason::Shutdown => s.connections_closed += 1,
            CloseReason::RecordTooLarge => {
                s.oversized_records += 1;
                s.connections_dropped += 1;
            }
            CloseReason::Truncated => {
                s.truncated_records += 1;
                s.connections_dropped += 1;
            }
            CloseReason::Io(_) => {
                s.io_errors += 1;
                s.connections_dropped += 1;
            }
            CloseReason::IdleTimeout => {
                s.idle_timeouts += 1;
                s.connections_dropped += 1;
            }
            CloseReason::SilentTimeout => {
                s.silent_timeouts += 1;
                s.connections_dropped += 1;
            }
        }
        // Out of the epoll set and the index before the descriptor closes
        // (its number is reused by the next socket).
        let fd = self.conns[i].fd;
        if let Some(epoll) = &self.epoll {
            epoll.remove(fd);
        }
        if let Some(slot) = self.slot_of_fd.get_mut(fd as usize) {
            *slot = NO_SLOT;
        }
        // Dropping the stream closes the socket; unread input makes the
        // kernel answer with a reset, which is what a broken peer gets.
        let closed = self.conns.swap_remove(i);
        self.count_out(closed.peer);
        drop(closed);
        if let Some(moved) = self.conns.get(i) {
            if let Some(slot) = self.slot_of_fd.get_mut(moved.fd as usize) {
                *slot = i as u32;
            }
        }
    }

    /// Starts a graceful shutdown: from the next [`poll`](Self::poll) on,
    /// each connection finishes the call whose record has begun, writes
    /// every reply, then shuts its side of the stream (the peer sees end
    /// of stream after its last reply) and closes at the peer's end of
    /// stream. Calls that follow are not read. Connections added later are
    /// shut at once. [`in_progress`](Self::in_progress) says when nothing
    /// is left to answer; [`close_all`](Self::close_all) ends the rest.
    pub fn begin_shutdown(&mut self) {
        self.stopping = true;
    }

    /// Whether [`begin_shutdown`](Self::begin_shutdown) was called.
    pub fn is_shutting_down(&self) -> bool {
        self.stopping
    }

    /// During a shutdown: connections that still have a call to finish or
    /// replies to write (their side is not shut yet). Before it: every
    /// open connection.
    pub fn in_progress(&self) -> usize {
        self.conns.iter().filter(|c| !c.write_shut).count()
    }

    /// Closes every connection (shutdown), counted as closed.
    pub fn close_all(&mut self) {
        while !self.conns.is_empty() {
            self.close(self.conns.len() - 1, CloseReason::Shutdown);
        }
    }
}

/// Brings `conn`'s epoll registration in step with what it waits for.
fn sync_interest(epoll: Option<&EpollSet>, conn: &mut Conn) {
    let Some(epoll) = epoll else { return };
    let want = conn.epoll_interest();
    if conn.registered != want && epoll.modify(conn.fd, want).is_ok() {
        conn.registered = want;
    }
}

/// A listener and the connections it accepted, polled together: for a
/// worker that owns its listener, and for tests and examples.
#[derive(Debug)]
pub struct TcpServer {
    acceptor: TcpAcceptor,
    connections: TcpConnections,
    accept_errors: u64,
}

impl TcpServer {
    /// Listens on `addr`.
    ///
    /// # Errors
    /// As [`TcpAcceptor::bind`] and [`TcpConnections::new`].
    pub fn bind(addr: SocketAddr, cfg: TcpConfig) -> Result<TcpServer, TcpError> {
        let connections = TcpConnections::new(cfg)?;
        Ok(TcpServer {
            acceptor: TcpAcceptor::bind(addr)?,
            connections,
            accept_errors: 0,
        })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.acceptor.local_addr()
    }

    /// The connections.
    pub fn connections(&self) -> &TcpConnections {
        &self.connections
    }

    /// The connections, e.g. to [`close_all`](TcpConnections::close_all).
    pub fn connections_mut(&mut self) -> &mut TcpConnections {
        &mut self.connections
    }

    /// The counters of the connections.
    pub fn stats(&self) -> &TcpStats {
        self.connections.stats()
    }

    /// `accept` failures other than would-block and aborted connections
    /// (e.g. out of file descriptors).
    pub fn accept_errors(&self) -> u64 {
        self.accept_errors
    }

    /// Accepts waiting connections (a few per pass, so that a connect storm
    /// cannot stall the data path) and runs one pass over the connections.
    /// Returns the work done; 0 means idle.
    pub fn poll<D: Dispatcher + ?Sized>(&mut self, services: &D, now: Instant) -> usize {
        const ACCEPTS_PER_POLL: usize = 16;
        let conns = &mut self.connections;
        let accepted = match self.acceptor.accept_ready(ACCEPTS_PER_POLL, |s, _| {
            // A refusal is counted in the connection stats.
            let _ = conns.add(s, now);
        }) {
            Ok(n) => n,
            Err(_) => {
                self.accept_errors += 1;
                0
            }
        };
        accepted + self.connections.poll(services, now)
    }
}
