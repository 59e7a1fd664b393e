//! The guard that keeps a hole a peer punches in memory we share writable
//! from killing the process.
//!
//! No seal blocks `fallocate(FALLOC_FL_PUNCH_HOLE)` on a memfd without
//! also blocking the writes a writable exposure exists for, so a peer
//! holding such a memfd (our receive arenas, `REMOTE_WRITE` arenas, or its
//! own memory it hands us writable) can punch holes in it. On hugetlbfs
//! the next touch of a punched page needs a free hugepage; with the pool
//! exhausted the kernel sends the toucher SIGBUS, whose default action
//! ends the whole daemon.
//!
//! Every mapping a peer can punch is registered here
//! ([`PeerWritable::register`]) in a fixed table that the process-wide
//! SIGBUS handler reads without locks or allocation. A SIGBUS inside a
//! registered mapping replaces the faulting page (the mapping's page size:
//! a whole 2 MiB hugepage, since a hugetlb mapping can only be split on
//! its page boundaries) with private anonymous memory, so the faulting
//! instruction runs again and succeeds, and counts a fault on that
//! registration. The memory's owner sees the count ([`GuardProbe`]) on
//! its next poll and ends the connection: the page no longer reaches the
//! peer, so the exchange is lost either way, and only the connection that
//! shared it pays. A SIGBUS anywhere else goes to the handler that was
//! installed before ours, or gets the default action (the process dies,
//! as it would have without the guard).
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

/// Mappings registered at once at most. A connection registers a few
/// (its receive arena, its staging slots, the peer's regions it writes),
/// so this covers thousands of connections; past it a writable exposure
/// is refused rather than left unguarded.
pub const GUARD_SLOTS: usize = 16384;

const FREE: u64 = 0;
const BUSY: u64 = 1;
const LIVE: u64 = 2;
const STATE_BITS: u32 = 2;

/// One registered mapping. `state` is the slot's generation shifted left
/// by [`STATE_BITS`] plus FREE, BUSY (being filled) or LIVE; the handler
/// reads the fields between two equal LIVE loads of it.
struct Slot {
    state: AtomicU64,
    start: AtomicUsize,
    len: AtomicUsize,
    page: AtomicUsize,
    faults: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // the array initialiser only
const EMPTY_SLOT: Slot = Slot {
    state: AtomicU64::new(FREE),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    page: AtomicUsize::new(0),
    faults: AtomicU64::new(0),
};

/// Zero-initialised, so it lives in the BSS and costs memory only for
/// the slots in use.
static TABLE: [Slot; GUARD_SLOTS] = [EMPTY_SLOT; GUARD_SLOTS];

/// Pages replaced by the handler in this process, every mapping together.
static FAULTS: AtomicU64 = AtomicU64::new(0);

/// The handler's installation: once per process.
static INSTALLED: OnceLock<Result<(), nix::Error>> = OnceLock::new();

/// What handled SIGBUS before ours; set right after ours is installed
/// (until then a foreign SIGBUS gets the default action).
static PREVIOUS: OnceLock<SigAction> = OnceLock::new();

/// Pages the guard replaced in this process so far. Owners compare it
/// with the value they saw last to look at their own registrations only
/// when it moved.
pub fn faults_total() -> u64 {
    FAULTS.load(Ordering::Acquire)
}

/// Why a mapping could not be guarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    /// The SIGBUS handler could not be installed.
    #[error("cannot install the SIGBUS guard: {0}")]
    Install(nix::Error),
    /// Every slot is in use ([`GUARD_SLOTS`]).
    #[error("too many peer-writable mappings to guard ({GUARD_SLOTS})")]
    Full,
    /// The range is not aligned to its page size.
    #[error("peer-writable mapping not aligned to its page size")]
    Unaligned,
}

/// Installs the process-wide SIGBUS handler (once; later calls return
/// the first outcome).
pub fn install() -> Result<(), GuardError> {
    let r = INSTALLED.get_or_init(|| {
        // SA_ONSTACK: the standard library runs its stack-overflow report
        // on an alternate stack, and a SIGBUS from a stack guard page must
        // reach it the same way. SIGBUS stays blocked while the handler
        // runs, so a fault inside it is fatal instead of recursive.
        let ours = SigAction::new(
            SigHandler::SigAction(on_sigbus),
            SaFlags::SA_SIGINFO | SaFlags::SA_ONSTACK,
            SigSet::empty(),
        );
        // SAFETY: the handler only does async-signal-safe work: atomic
        // loads and stores on a static table, mmap, and the previous
        // handler or the default action.
        let before = unsafe { sigaction(Signal::SIGBUS, &ours) }?;
        let _ = PREVIOUS.set(before);
        Ok(())
    });
    r.map_err(GuardError::Install)
}

/// A registered peer-writable mapping; unregistered on drop, which must
/// happen before the mapping is unmapped.
#[derive(Debug)]
pub struct PeerWritable {
    slot: usize,
    generation: u64,
}

/// A copyable view of a registration's fault count, for an owner that
/// does not hold the registration itself (a connection checking an arena
/// it was given). A probe of a registration that is gone reads 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardProbe {
    slot: usize,
    generation: u64,
}

impl GuardProbe {
    /// Pages of the mapping the guard replaced so far.
    pub fn faults(&self) -> u64 {
        let s = &TABLE[self.slot];
        let f = s.faults.load(Ordering::Acquire);
        if s.state.load(Ordering::Acquire) == (self.generation << STATE_BITS) | LIVE {
            f
        } else {
            0
        }
    }
}

impl PeerWritable {
    /// Guards `[start, start + len)`, mapped `MAP_SHARED` from a memfd a
    /// peer can punch holes in, whose pages are `page` bytes.
    ///
    /// # Safety
    /// The range must be one mapping of ours that stays mapped, with
    /// pages of `page` bytes, until the registration is dropped: a fault
    /// in it replaces a page of it with anonymous memory.
    pub unsafe fn register(
        start: *mut u8,
        len: usize,
        page: usize,
    ) -> Result<PeerWritable, GuardError> {
        let start = start as usize;
        if !page.is_power_of_two() || start % page != 0 || len == 0 {
            return Err(GuardError::Unaligned);
        }
        install()?;
        for (i, s) in TABLE.iter().enumerate() {
            let state = s.state.load(Ordering::Relaxed);
            if state & 3 != FREE {
                continue;
            }
            let generation = state >> STATE_BITS;
            let busy = (generation << STATE_BITS) | BUSY;
            if s.state
                .compare_exchange(state, busy, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            s.start.store(start, Ordering::Relaxed);
            s.len.store(len, Ordering::Relaxed);
            s.page.store(page, Ordering::Relaxed);
            s.faults.store(0, Ordering::Relaxed);
            s.state
                .store((generation << STATE_BITS) | LIVE, Ordering::Release);
            return Ok(PeerWritable {
                slot: i,
                generation,
            });
        }
        Err(GuardError::Full)
    }

    /// Pages of the mapping the guard replaced so far.
    pub fn faults(&self) -> u64 {
        TABLE[self.slot].faults.load(Ordering::Acquire)
    }

    /// A probe of this registration.
    pub fn probe(&self) -> GuardProbe {
        GuardProbe {
            slot: self.slot,
            generation: self.generation,
        }
    }
}

impl Drop for PeerWritable {
    fn drop(&mut self) {
        // The next generation, free: the handler's second look at the
        // state sees the change, and probes of this registration read 0.
        let next = self.generation.wrapping_add(1) & (u64::MAX >> STATE_BITS);
        TABLE[self.slot]
            .state
            .store(next << STATE_BITS, Ordering::Release);
    }
}

/// Replaces the page holding `addr` if a registered mapping holds it.
/// Async-signal-safe: atomics and one mmap. Tests call it for faults
/// they cannot cause without exhausting the host's hugepage pool.
pub(crate) fn repair(addr: usize) -> bool {
    for s in TABLE.iter() {
        let state = s.state.load(Ordering::Acquire);
        if state & 3 != LIVE {
            continue;
        }
        let start = s.start.load(Ordering::Relaxed);
        let len = s.len.load(Ordering::Relaxed);
        let page = s.page.load(Ordering::Relaxed);
        if s.state.load(Ordering::Acquire) != state {
            continue;
        }
        if addr < start || addr - start >= len {
            continue;
        }
        let at = start + ((addr - start) & !(page - 1));
        let n = page.min(start + len - at);
        // SAFETY: `[at, at + n)` lies in a mapping its registrant keeps
        // mapped while registered; MAP_FIXED replaces exactly those pages
        // (page-aligned, so a hugetlb mapping splits on its boundaries).
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return false;
        }
        s.faults.fetch_add(1, Ordering::AcqRel);
        FAULTS.fetch_add(1, Ordering::AcqRel);
        return true;
    }
    false
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO.
    let addr = unsafe { (*info).si_addr() } as usize;
    if repair(addr) {
        return;
    }
    match PREVIOUS.get().map(SigAction::handler) {
        Some(SigHandler::SigAction(f)) => f(sig, info, ctx),
        Some(SigHandler::Handler(f)) => f(sig),
        _ => {
            // The default action: back to SIG_DFL and raise again. The
            // signal is blocked until we return, then kills the process
            // (a fault also repeats when the instruction runs again).
            // SAFETY: signal and raise are async-signal-safe.
            unsafe {
                libc::signal(libc::SIGBUS, libc::SIG_DFL);
                libc::raise(libc::SIGBUS);
            }
        }
    }
}

#[cfg(test)]
mod tests;
