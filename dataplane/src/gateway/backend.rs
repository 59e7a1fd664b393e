//! One non-blocking TCP connection from a worker to a backend: connect
//! without waiting, record-marked calls out (RFC 5531 s11), reassembled
//! replies in. Buffers are reserved once, when the connection object is
//! made, and reused across reconnects.

use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    connect, getsockopt, send, setsockopt, socket, sockopt, AddressFamily, MsgFlags, SockFlag,
    SockType, SockaddrStorage,
};

use crate::engine::Instant;
use crate::tcp::buf::{InBuf, OutBuf, ZeroedBuf};
use crate::wire::rpc::{write_record_header, RecordMarker, RecordReassembler};

/// Output space beyond one record, where pipelined calls gather to leave
/// in one `send`: several of the largest calls (1 MiB WRITEs at depth),
/// so that a deep client does not wait for each to drain. Address space:
/// pages are touched only as far as the output reaches.
const BATCH: usize = 4 << 20;
/// Bytes asked for per `read`.
const READ_LEN: usize = 64 << 10;
/// `read` calls per poll at most, so one busy backend cannot hold the
/// worker.
const READS_PER_POLL: usize = 16;
/// A fragment with at least this much left is read into the record
/// directly; a shorter one (small replies, headers) through the read
/// buffer, where one `read` may bring several replies.
const DIRECT_READ_MIN: usize = 16 << 10;

/// Where a connection is.
#[derive(Debug)]
enum Link {
    /// Not connected; the next attempt is not before `retry_at`.
    Down { retry_at: Instant },
    /// `connect` is in progress.
    Connecting(TcpStream),
    /// Connected.
    Up(TcpStream),
}

/// What a poll of the connection saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LinkEvent {
    /// Nothing changed.
    Quiet,
    /// The connection came up.
    Established,
    /// The connection failed or was refused; everything that was on it is
    /// lost.
    Lost,
}

/// A backend connection and its buffers.
#[derive(Debug)]
pub(super) struct BackendConn {
    addr: SocketAddr,
    link: Link,
    out: OutBuf,
    input: InBuf,
    reassembler: RecordReassembler<ZeroedBuf>,
    /// Calls of this connection waiting for their reply.
    pub(super) in_flight: u32,
}

impl BackendConn {
    /// A connection to `addr`, down, with room for records of up to
    /// `max_message` bytes. Reserves address space only: pages are
    /// touched as records reach them.
    pub(super) fn new(addr: SocketAddr, max_message: usize) -> io::Result<BackendConn> {
        Ok(BackendConn {
            addr,
            link: Link::Down {
                retry_at: Instant::ZERO,
            },
            out: OutBuf::new(max_message + RecordMarker::LEN, BATCH)?,
            input: InBuf::new(READ_LEN)?,
            reassembler: RecordReassembler::with_buffer(ZeroedBuf::new(max_message)?),
            in_flight: 0,
        })
    }

    /// Whether calls can be queued on it (up, or on its way up).
    pub(super) fn is_usable(&self) -> bool {
        !matches!(self.link, Link::Down { .. })
    }

    /// What a sleeping worker waits for on this connection
    /// (docs/WORKER.md, "Doorbells"): its socket, readable while replies
    /// are due, writable while a connect is under way or calls wait in the
    /// output. `None` when nothing here can be news (down, or up and
    /// quiet); an error or hang-up ends the sleep whatever was asked.
    pub(super) fn watch(&self) -> Option<libc::pollfd> {
        let (fd, events) = match &self.link {
            Link::Down { .. } => return None,
            Link::Connecting(stream) => (stream.as_raw_fd(), libc::POLLOUT),
            Link::Up(stream) => {
                let mut events = 0;
                if self.in_flight > 0 {
                    events |= libc::POLLIN;
                }
                if !self.out.is_empty() {
                    events |= libc::POLLOUT;
                }
                if events == 0 {
                    return None;
                }
                (stream.as_raw_fd(), events)
            }
        };
        Some(libc::pollfd {
            fd,
            events,
            revents: 0,
        })
    }

    /// Starts a connection attempt if down and `now` allows one. Returns
    /// [`LinkEvent::Lost`] when the attempt failed at once (the next one
    /// waits `retry_after`).
    pub(super) fn try_connect(
        &mut self,
        now: Instant,
        retry_after: std::time::Duration,
    ) -> LinkEvent {
        let Link::Down { retry_at } = self.link else {
            return LinkEvent::Quiet;
        };
        if now < retry_at {
            return LinkEvent::Quiet;
        }
        match start_connect(self.addr) {
            Ok((stream, true)) => {
                let _ = stream.set_nodelay(true);
                self.link = Link::Up(stream);
                LinkEvent::Established
            }
            Ok((stream, false)) => {
                self.link = Link::Connecting(stream);
                LinkEvent::Quiet
            }
            Err(_) => {
                self.fail(now, retry_after);
                LinkEvent::Lost
            }
        }
    }

    /// Appends one record holding `msg` with its first word (the XID)
    /// replaced by `xid`. Returns false, writing nothing, when the output
    /// has no room for a whole record now (it drains as the socket takes
    /// bytes).
    pub(super) fn queue_call(&mut self, msg: &[u8], xid: u32) -> bool {
        if msg.len() < 4 || !self.out.make_reserve() {
            return false;
        }
        let room = self.out.reserve_mut();
        let Ok(mark) = write_record_header(room, msg.len()) else {
            return false;
        };
        let Some(dst) = room.get_mut(mark..mark + msg.len()) else {
            return false;
        };
        dst.copy_from_slice(msg);
        dst[..4].copy_from_slice(&xid.to_be_bytes());
        self.out.commit(mark + msg.len());
        true
    }

    /// Advances the connection: finishes a connect, writes queued bytes,
    /// reads, and hands every complete reply record to `on_record` (as
    /// writable bytes, for the XID to be restored in place). Returns the
    /// link event and the bytes written.
    pub(super) fn poll(
        &mut self,
        now: Instant,
        retry_after: std::time::Duration,
        mut on_record: impl FnMut(&mut [u8]),
    ) -> (LinkEvent, usize) {
        let mut event = LinkEvent::Quiet;
        if let Link::Connecting(stream) = &self.link {
            match connect_finished(stream) {
                Ok(false) => return (LinkEvent::Quiet, 0),
                Ok(true) => {
                    let Link::Connecting(stream) =
                        std::mem::replace(&mut self.link, Link::Down { retry_at: now })
                    else {
                        unreachable!("matched above")
                    };
                    let _ = stream.set_nodelay(true);
                    self.link = Link::Up(stream);
                    event = LinkEvent::Established;
                }
                Err(_) => {
                    self.fail(now, retry_after);
                    return (LinkEvent::Lost, 0);
                }
            }
        }
        let Link::Up(stream) = &mut self.link else {
            return (event, 0);
        };
        let mut written = 0;
        // Writes.
        while !self.out.is_empty() {
            match send(
                stream.as_raw_fd(),
                self.out.pending(),
                MsgFlags::MSG_NOSIGNAL,
            ) {
                Ok(0) => {
                    self.fail(now, retry_after);
                    return (LinkEvent::Lost, written);
                }
                Ok(n) => {
                    self.out.consume(n);
                    written += n;
                }
                Err(Errno::EAGAIN) => break,
                Err(Errno::EINTR) => {}
                Err(_) => {
                    self.fail(now, retry_after);
                    return (LinkEvent::Lost, written);
                }
            }
        }
        // Reads, only while replies are due: an idle backend costs no
        // system call per iteration.
        if self.in_flight == 0 && self.input.is_empty() {
            return (event, written);
        }
        let mut reads_left = READS_PER_POLL;
        loop {
            if self.input.is_empty() {
                if reads_left == 0 {
                    break;
                }
                reads_left -= 1;
                // Bulk data (most of a large READ reply) goes from the
                // socket straight into the record: no copy through the
                // read buffer.
                if let Some(space) = self
                    .reassembler
                    .fragment_space()
                    .filter(|s| s.len() >= DIRECT_READ_MIN)
                {
                    match stream.read(space) {
                        Ok(0) => {
                            self.fail(now, retry_after);
                            return (LinkEvent::Lost, written);
                        }
                        Ok(n) => self.reassembler.fragment_filled(n),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(_) => {
                            self.fail(now, retry_after);
                            return (LinkEvent::Lost, written);
                        }
                    }
                    if let Some(record) = self.reassembler.poll_record_mut() {
                        on_record(record);
                    }
                    continue;
                }
                match stream.read(self.input.space()) {
                    Ok(0) => {
                        self.fail(now, retry_after);
                        return (LinkEvent::Lost, written);
                    }
                    Ok(n) => self.input.filled(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        self.fail(now, retry_after);
                        return (LinkEvent::Lost, written);
                    }
                }
            }
            let Ok(used) = self.reassembler.push(self.input.unread()) else {
                // A record over the limit: its boundaries are lost.
                self.fail(now, retry_after);
                return (LinkEvent::Lost, written);
            };
            self.input.consume(used);
            if let Some(record) = self.reassembler.poll_record_mut() {
                on_record(record);
            }
        }
        (event, written)
    }

    /// Closes the connection and forgets what was queued or half read; the
    /// next attempt waits `retry_after`.
    pub(super) fn fail(&mut self, now: Instant, retry_after: std::time::Duration) {
        self.link = Link::Down {
            retry_at: now.saturating_add(retry_after),
        };
        while !self.out.is_empty() {
            let n = self.out.pending().len();
            self.out.consume(n);
        }
        let n = self.input.unread().len();
        self.input.consume(n);
        self.reassembler.reset();
        self.in_flight = 0;
    }
}

/// A non-blocking `connect` to `addr`: the stream and whether it is
/// already connected (loopback often is).
fn start_connect(addr: SocketAddr) -> io::Result<(TcpStream, bool)> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd: OwnedFd = socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let _ = setsockopt(&fd, sockopt::TcpNoDelay, &true);
    let done = match connect(fd.as_raw_fd(), &SockaddrStorage::from(addr)) {
        Ok(()) => true,
        Err(Errno::EINPROGRESS) | Err(Errno::EINTR) => false,
        Err(e) => return Err(e.into()),
    };
    Ok((TcpStream::from(fd), done))
}

/// Whether a connect in progress has finished: `Ok(true)` connected,
/// `Ok(false)` still going, `Err` refused or unreachable.
fn connect_finished(stream: &TcpStream) -> io::Result<bool> {
    let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLOUT)];
    let n = poll(&mut fds, PollTimeout::ZERO)?;
    if n == 0 {
        return Ok(false);
    }
    match getsockopt(stream, sockopt::SocketError)? {
        0 => Ok(true),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}
