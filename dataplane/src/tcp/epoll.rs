//! The readiness set of one worker's TCP connections: an epoll instance,
//! level-triggered, keyed by socket descriptor. One `epoll_wait` with a
//! zero timeout per pass names the sockets that have work, so a pass costs
//! the same with 1 or 1,000 idle connections (docs/TCP.md, "Readiness").

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Events taken per `epoll_wait`. More ready sockets than this stay ready
/// (level-triggered) and are returned by the next pass.
pub(super) const EVENTS_PER_WAIT: usize = 64;

/// What a connection waits for, in epoll terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Interest(u32);

impl Interest {
    /// Nothing registered yet.
    pub const NONE: Interest = Interest(0);
    /// Input (and the peer's end of stream).
    pub const READ: Interest = Interest(libc::EPOLLIN as u32);
    /// Room in the socket's send buffer.
    pub const WRITE: Interest = Interest(libc::EPOLLOUT as u32);
    /// Both.
    pub const READ_WRITE: Interest = Interest((libc::EPOLLIN | libc::EPOLLOUT) as u32);
}

/// An epoll instance and the buffer its events land in (allocated once).
pub(super) struct EpollSet {
    epoll: OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl core::fmt::Debug for EpollSet {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("EpollSet")
            .field("epoll", &self.epoll.as_raw_fd())
            .finish()
    }
}

impl EpollSet {
    /// A new, empty set.
    pub fn new() -> io::Result<EpollSet> {
        // SAFETY: no pointer arguments; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(EpollSet {
            // SAFETY: `fd` is a fresh descriptor that nothing else owns.
            epoll: unsafe { OwnedFd::from_raw_fd(fd) },
            events: vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_WAIT],
        })
    }

    /// The epoll instance's descriptor: readable while a registered
    /// socket is ready (a sleeping worker waits on it).
    pub fn raw_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, interest: Interest) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: interest.0,
            u64: fd as u64,
        };
        // SAFETY: valid epoll descriptor; `ev` lives across the call; the
        // kernel checks `fd`.
        let rc = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watches `fd` for `interest`.
    pub fn add(&self, fd: RawFd, interest: Interest) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, interest)
    }

    /// Changes what `fd` is watched for.
    pub fn modify(&self, fd: RawFd, interest: Interest) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, interest)
    }

    /// Stops watching `fd` (before it is closed: a descriptor duplicated
    /// elsewhere would otherwise keep it in the set).
    pub fn remove(&self, fd: RawFd) {
        // A descriptor that was never added: nothing to undo.
        let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, Interest::NONE);
    }

    /// The descriptors with events now, appended to `out` (never blocks).
    ///
    /// # Errors
    /// The operating system's error (the caller then serves every
    /// connection this pass).
    pub fn ready(&mut self, out: &mut Vec<RawFd>) -> io::Result<()> {
        // SAFETY: valid epoll descriptor; the buffer holds
        // `events.len()` entries and lives across the call; timeout 0.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as libc::c_int,
                0,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        out.extend(self.events[..n as usize].iter().map(|e| e.u64 as RawFd));
        Ok(())
    }
}
