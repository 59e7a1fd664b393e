//! Waking a parked poller: a doorbell another thread or process rings,
//! and the sleep that waits on doorbells.
//!
//! A worker or a client that finds nothing to do spins, yields, then
//! parks (`worker::IdleStrategy::Adaptive`). Parked, it would otherwise
//! see a new message only at its park's timeout. A [`Doorbell`] is an
//! eventfd: the sleeper asks its peers to ring it (through memory they
//! can read, e.g. the `shm` outbox's sleeping flag) and sleeps in
//! [`sleep_on`] with the doorbells among the descriptors it waits for; a
//! peer that publishes a message to a sleeper rings its doorbell, which
//! costs a `write(2)` only while the sleeper sleeps.
//!
//! Why an eventfd, not a futex: a worker waits for many sources at once
//! (its control ring, every connection's peer, a socket), and a futex
//! waits on one word; an eventfd is one more descriptor in one `ppoll`.
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
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

    /// A duplicate of the descriptor, to hand to a peer process.
    ///
    /// # Errors
    /// The `dup(2)` error.
    pub fn try_clone_fd(&self) -> nix::Result<OwnedFd> {
        self.fd
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
    }
}

/// Rings an eventfd (ours, or one a peer gave us and [`is_eventfd`]
/// accepted). Errors are ignored: a counter already at its maximum is
/// readable anyway, and a broken peer descriptor only loses the peer its
/// early wake-up.
pub fn ring_fd(fd: BorrowedFd<'_>) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live local buffer to a descriptor we
    // borrow for the call.
    let _ = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
}

/// Whether `fd` is an eventfd: a peer's doorbell is written to by the
/// polling thread, so it must be one (a pipe or socket could block it
/// or carry our writes somewhere else).
pub fn is_eventfd(fd: BorrowedFd<'_>) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|p| p.as_os_str() == "anon_inode:[eventfd]")
}

/// Sleeps until one of `fds` is readable or `timeout` passed (or a
/// signal came); returns whether one is readable. `fds` is the caller's
/// list, reused between sleeps so a sleep allocates nothing.
pub fn sleep_on(fds: &mut [libc::pollfd], timeout: Duration) -> bool {
    for p in fds.iter_mut() {
        p.events = libc::POLLIN;
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

    #[test]
    fn only_an_eventfd_passes_as_a_doorbell() {
        let d = Doorbell::new().unwrap();
        assert!(is_eventfd(d.as_fd()));
        let dup = d.try_clone_fd().unwrap();
        assert!(is_eventfd(dup.as_fd()));
        let (r, _w) = nix::unistd::pipe().unwrap();
        assert!(!is_eventfd(r.as_fd()));
    }
}
