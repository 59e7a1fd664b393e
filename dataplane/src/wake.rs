//! Waking a parked poller: a doorbell another thread or process rings,
//! and the sleep that waits on doorbells.
//!
//! A worker or a client that finds nothing to do spins, yields, then
//! parks (`worker::IdleStrategy::Adaptive`). Parked, it would otherwise
//! see a new message only at its park's timeout. Instead it sleeps in
//! [`sleep_on`] on descriptors that news makes readable:
//!
//! * a [`Doorbell`] (an eventfd) that threads of this process ring: the
//!   control plane, the `roce` device's thread;
//! * a [`ReadySet`] (an epoll set) of sockets shared with peer processes:
//!   an `shm` peer that publishes a message while the sleeper says so
//!   (its outbox's sleeping flag) sends a small message on the
//!   connection's own socket, which costs a system call only then. An
//!   eventfd is never handed to another process: that process could make
//!   it blocking and fill its counter, and a ring would block us.
//!
//! Why descriptors, not a futex: a worker waits for many sources at once
//! (its control ring, every connection's peer, TCP sockets), and a futex
//! waits on one word; each source here is one more descriptor in one
//! `ppoll`.
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};

/// An eventfd that wakes a sleeper in [`sleep_on`]. Non-blocking: ringing
/// never blocks, even a doorbell that nobody clears.
#[derive(Debug)]
pub struct Doorbell {
    fd: EventFd,
}

impl Doorbell {
    /// A fresh, quiet doorbell.
    ///
    /// # Errors
    /// The `eventfd(2)` error (e.g. out of descriptors).
    pub fn new() -> nix::Result<Doorbell> {
        let fd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        Ok(Doorbell { fd })
    }

    /// Makes the doorbell readable (wakes a sleeper, or the next sleep
    /// returns at once).
    pub fn ring(&self) {
        ring_fd(self.fd.as_fd());
    }

    /// Makes it quiet again; returns whether it had been rung.
    pub fn clear(&self) -> bool {
        // A non-blocking eventfd read returns the count and zeroes it, or
        // EAGAIN when it is zero.
        self.fd.read().is_ok()
    }

    /// The descriptor, for [`sleep_on`].
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A [`Doorbell`] that notifiers ring only while its sleeper says it
/// sleeps. The sleeper raises its flag, fences, then looks for news
/// ([`SleeperBell::arm`]); a notifier publishes its news, fences, then
/// reads the flag ([`SleeperBell::notify`]): one of the two sees the
/// other, so news never waits for the sleep's timeout, and a notifier of
/// an awake sleeper pays a fence and a load, no system call. Within one
/// process (the `roce` ready lists and the device's thread); `shm` keeps
/// the same protocol in shared memory, with a socket for the ring.
#[derive(Debug)]
pub struct SleeperBell {
    sleeping: AtomicBool,
    bell: Doorbell,
}

impl SleeperBell {
    /// A quiet bell, its sleeper awake.
    ///
    /// # Errors
    /// The `eventfd(2)` error.
    pub fn new() -> nix::Result<SleeperBell> {
        Ok(SleeperBell {
            sleeping: AtomicBool::new(false),
            bell: Doorbell::new()?,
        })
    }

    /// The sleeper is about to sleep: raises the flag, fences, and
    /// returns what `quiet` says (whether no news came already; false:
    /// look again instead of sleeping). Undone by
    /// [`SleeperBell::disarm`], whatever it returned.
    pub fn arm(&self, quiet: impl FnOnce() -> bool) -> bool {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        quiet()
    }

    /// News was published: rings if the sleeper sleeps.
    pub fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            self.bell.ring();
        }
    }

    /// Rings whether or not the sleeper sleeps.
    pub fn ring(&self) {
        self.bell.ring();
    }

    /// The sleeper is back: notifiers stop ringing, the bell is quiet.
    pub fn disarm(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
        self.bell.clear();
    }

    /// The descriptor, for [`sleep_on`].
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.bell.as_fd()
    }
}

/// Rings an eventfd of this process. Errors are ignored: a counter
/// already at its maximum is readable anyway. Never hand a doorbell to
/// another process: it could make the descriptor blocking and fill the
/// counter, and a ring would then block the ringing thread (a peer
/// process is woken through a socket it shares with us instead, as `shm`
/// does with [`ReadySet`]).
pub fn ring_fd(fd: BorrowedFd<'_>) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live local buffer to a descriptor we
    // borrow for the call.
    let _ = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
}

/// A set of descriptors (sockets) that wakes a sleeper when any of them
/// is readable or hung up: an epoll instance, whose own descriptor goes
/// into [`sleep_on`]. Each member carries a token, to find which ones
/// are ready afterwards ([`ReadySet::ready`]).
#[derive(Debug)]
pub struct ReadySet {
    epoll: OwnedFd,
}

impl ReadySet {
    /// An empty set.
    ///
    /// # Errors
    /// The `epoll_create1(2)` error.
    pub fn new() -> nix::Result<ReadySet> {
        // SAFETY: no pointer arguments; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(nix::errno::Errno::last());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(ReadySet {
            epoll: unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) },
        })
    }

    /// The set's descriptor, for [`sleep_on`].
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.epoll.as_fd()
    }

    /// Adds `fd` (level-triggered: readable or hung up) under `token`.
    ///
    /// # Errors
    /// The `epoll_ctl(2)` error.
    pub fn add(&self, fd: RawFd, token: u64) -> nix::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            u64: token,
        };
        // SAFETY: `ev` is a valid event for the call's duration.
        let rc =
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if rc < 0 {
            return Err(nix::errno::Errno::last());
        }
        Ok(())
    }

    /// Removes `fd` (call before closing it: epoll forgets a descriptor
    /// only when every copy of its file is closed).
    pub fn remove(&self, fd: RawFd) {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: as in `add`; an error (not a member) changes nothing.
        let _ =
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
    }

    /// The tokens of up to `out.len()` ready members, without waiting.
    pub fn ready(&self, out: &mut [u64]) -> usize {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 32];
        let max = out.len().min(events.len());
        // SAFETY: `events` holds `max` entries for the call's duration.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                max as libc::c_int,
                0,
            )
        };
        let n = n.max(0) as usize;
        for (o, e) in out.iter_mut().zip(&events[..n]) {
            *o = e.u64;
        }
        n
    }
}

/// Sleeps until one of `fds` is ready for what its entry asks
/// (`events`: [`pollfd`] asks for input; a gateway backend waiting to
/// send asks for room), hung up or in error, or `timeout` passed (or a
/// signal came); returns whether one is. `fds` is the caller's list,
/// reused between sleeps so a sleep allocates nothing.
pub fn sleep_on(fds: &mut [libc::pollfd], timeout: Duration) -> bool {
    for p in fds.iter_mut() {
        p.revents = 0;
    }
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fds` is a valid array of `fds.len()` pollfds for the
    // call's duration; `ts` lives on the stack; no signal mask.
    let ready = unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    ready > 0
}

/// A pollfd entry for [`sleep_on`].
pub fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_rung_doorbell_ends_the_sleep_and_clears_once() {
        let d = Doorbell::new().unwrap();
        assert!(!d.clear(), "a fresh doorbell is quiet");
        d.ring();
        d.ring();
        let mut fds = [pollfd(d.as_fd().as_raw_fd())];
        // Rung before the sleep: the sleep returns at once, well before
        // its one-minute timeout (a deadline that means broken).
        let t = Instant::now();
        assert!(sleep_on(&mut fds, Duration::from_secs(60)));
        assert!(t.elapsed() < Duration::from_secs(30));
        assert_eq!(fds[0].revents & libc::POLLIN, libc::POLLIN);
        assert!(d.clear(), "two rings, one clear");
        assert!(!d.clear());
    }

    #[test]
    fn a_doorbell_rung_from_another_thread_wakes_the_sleeper() {
        let d = std::sync::Arc::new(Doorbell::new().unwrap());
        let ringer = {
            let d = d.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                d.ring();
            })
        };
        let mut fds = [pollfd(d.as_fd().as_raw_fd())];
        assert!(
            sleep_on(&mut fds, Duration::from_secs(60)),
            "woken by the ring"
        );
        assert_eq!(fds[0].revents & libc::POLLIN, libc::POLLIN);
        ringer.join().unwrap();
    }

    /// Each entry is woken by what it asks for: an entry asking for room
    /// wakes on a socket with room and no input, one asking for input
    /// does not (a gateway backend whose call waits to leave sleeps on
    /// room).
    #[test]
    fn a_sleep_waits_for_what_each_entry_asks() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut input = [pollfd(a.as_raw_fd())];
        assert!(!sleep_on(&mut input, Duration::ZERO), "no input: not ready");
        let mut room = [libc::pollfd {
            fd: a.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        }];
        assert!(sleep_on(&mut room, Duration::from_secs(60)), "room: ready");
        assert_eq!(room[0].events, libc::POLLOUT, "the entry is left as asked");
        assert_eq!(room[0].revents & libc::POLLOUT, libc::POLLOUT);
    }

    #[test]
    fn a_ready_set_wakes_on_input_and_hang_up_and_names_the_member() {
        let set = ReadySet::new().unwrap();
        let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let (c, d) = std::os::unix::net::UnixStream::pair().unwrap();
        set.add(a.as_raw_fd(), 7).unwrap();
        set.add(c.as_raw_fd(), 9).unwrap();
        let mut tokens = [0u64; 4];
        assert_eq!(set.ready(&mut tokens), 0, "quiet");
        b.send(&[1]).unwrap();
        let mut fds = [pollfd(set.as_fd().as_raw_fd())];
        assert!(sleep_on(&mut fds, Duration::from_secs(60)), "input wakes");
        assert_eq!(set.ready(&mut tokens), 1);
        assert_eq!(tokens[0], 7);
        let mut byte = [0u8; 1];
        a.recv(&mut byte).unwrap();
        assert_eq!(
            set.ready(&mut tokens),
            0,
            "level-triggered: quiet once read"
        );
        drop(d);
        assert!(
            sleep_on(&mut fds, Duration::from_secs(60)),
            "a hang-up wakes"
        );
        assert_eq!(set.ready(&mut tokens), 1);
        assert_eq!(tokens[0], 9);
        set.remove(c.as_raw_fd());
        assert_eq!(set.ready(&mut tokens), 0, "removed");
    }
}
