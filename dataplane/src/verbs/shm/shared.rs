//! Shared-memory layout of a connection's control region ("outbox"), peer
//! memory mappings, and the setup messages carried over the Unix socket.
//!
//! Every connection side owns one outbox memfd. The owner maps it
//! read-write, then seals it `F_SEAL_FUTURE_WRITE | F_SEAL_SEAL`
//! ([`Arena::share_read_only`](crate::mem::Arena::share_read_only)) before
//! passing it: the peer can only map it read-only (whatever descriptor it
//! opens), so it can never corrupt what we publish. Layout, in 64-bit words (all accessed as atomics):
//!
//! ```text
//! word 0        MAGIC
//! word 1..3     desc_cap, rq_cap, key_cap (powers of two)
//! word 4        features         bit 0: wakes a sleeping peer (M_RING)
//! line 1 (w8)   desc_head        descriptors produced by the owner
//! line 2 (w16)  recv_head        receives posted by the owner
//! line 3 (w24)  peer_desc_tail   peer descriptors consumed by the owner
//! line 4 (w32)  flags            bit 0 closed, bit 1 error
//! line 5 (w40)  sleeping         non-zero: the owner's poller sleeps
//! w64..         desc ring        desc_cap x 4 words
//!               recv ring        rq_cap x 10 words
//!               key table        key_cap x 8 words
//! ```
//!
//! Everything read from the peer's outbox is validated before use; the
//! peer controls those bytes.
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::verbs::{VerbsError, MAX_PRIVATE_DATA, MAX_SGE};

pub(crate) const MAGIC: u64 = 0x7270_6364_6d61_5348; // "rpcdmaSH"
pub(crate) const VERSION: u32 = 1;
pub(crate) const W_DESC_HEAD: usize = 8;
pub(crate) const W_RECV_HEAD: usize = 16;
pub(crate) const W_PEER_DESC_TAIL: usize = 24;
pub(crate) const W_FLAGS: usize = 32;
/// What the owner's side does beyond version 1 ([`FEATURE_DOORBELL`]);
/// zero in an outbox of a side that predates the word.
pub(crate) const W_FEATURES: usize = 4;
/// The owner understands `M_RING`, sends it when we sleep, and raises
/// [`W_SLEEPING`] when it sleeps.
pub(crate) const FEATURE_DOORBELL: u64 = 1;
/// Non-zero while the owner's poller sleeps (its completion queue
/// watches the connection's socket): a side that publishes something
/// for it then sends `M_RING` on the socket.
pub(crate) const W_SLEEPING: usize = 40;
pub(crate) const HEADER_WORDS: usize = 64;
pub(crate) const DESC_WORDS: usize = 4;
pub(crate) const RECV_WORDS: usize = 2 + 2 * MAX_SGE;
pub(crate) const KEY_WORDS: usize = 8;
pub(crate) const FLAG_CLOSED: u64 = 1;
pub(crate) const FLAG_ERROR: u64 = 2;
pub(crate) const MAX_RING: u32 = 1 << 16;
/// Key-table slots (the rkey's low byte).
pub(crate) const MAX_KEYS: u32 = crate::verbs::soft_mr::KEY_SLOTS as u32;
/// Most regions (memfds) one side may expose to a connection.
pub(crate) const MAX_REGIONS: usize = 1024;
/// Largest region a peer may hand us (1 TiB).
pub(crate) const MAX_REGION_LEN: u64 = 1 << 40;
/// Most bytes of a peer's regions one connection maps, all regions
/// together (1 TiB): sparse memfds cost a peer nothing, so without a
/// bound 1,024 regions of 1 TiB would use up our address space.
pub(crate) const MAX_PEER_MAPPED: u64 = MAX_REGION_LEN;
/// Most bytes of peers' memory this process maps at once, every
/// connection together (32 TiB, a quarter of x86-64's 128 TiB of user
/// address space): many connections each at their own bound must still
/// leave the process room for its own mappings.
pub(crate) const PEER_MAPPED_BUDGET: u64 = 32 << 40;

/// Bytes of peer memory mapped by this process now ([`Mapping`]s).
static PEER_MAPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Takes `len` bytes of `budget` in `counter`; false (nothing taken) when
/// they do not fit.
pub(crate) fn reserve(counter: &std::sync::atomic::AtomicU64, len: u64, budget: u64) -> bool {
    counter
        .fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
            |used| used.checked_add(len).filter(|&n| n <= budget),
        )
        .is_ok()
}

/// Descriptor kinds in the desc ring.
pub(crate) const D_SEND: u64 = 1;
pub(crate) const D_SEND_IMM: u64 = 2;
pub(crate) const D_SEND_INV: u64 = 3;
pub(crate) const D_WRITE_IMM: u64 = 4;
/// The sender found our receive too small: consume it with a length error.
pub(crate) const D_ERR_LEN: u64 = 5;

/// Ring and table sizes of one outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub desc_cap: u32,
    pub rq_cap: u32,
    pub key_cap: u32,
}

impl Layout {
    pub fn new(max_send_wr: u32, max_recv_wr: u32) -> Layout {
        Layout {
            desc_cap: max_send_wr.max(16).next_power_of_two().min(MAX_RING),
            rq_cap: max_recv_wr.max(16).next_power_of_two().min(MAX_RING),
            key_cap: MAX_KEYS,
        }
    }
    /// Checks sizes a peer announced.
    pub fn validate(self) -> Result<Layout, VerbsError> {
        let ok = |v: u32, max: u32| v.is_power_of_two() && v <= max;
        if ok(self.desc_cap, MAX_RING) && ok(self.rq_cap, MAX_RING) && ok(self.key_cap, MAX_KEYS) {
            Ok(self)
        } else {
            Err(VerbsError::Protocol("bad ring sizes"))
        }
    }
    pub fn desc_base(&self) -> usize {
        HEADER_WORDS
    }
    pub fn recv_base(&self) -> usize {
        self.desc_base() + self.desc_cap as usize * DESC_WORDS
    }
    pub fn key_base(&self) -> usize {
        self.recv_base() + self.rq_cap as usize * RECV_WORDS
    }
    pub fn words(&self) -> usize {
        self.key_base() + self.key_cap as usize * KEY_WORDS
    }
    pub fn bytes(&self) -> usize {
        self.words() * 8
    }
}

/// A mapping of a memfd (ours or the peer's). Unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    pub writable: bool,
    /// A writable mapping's registration with the SIGBUS guard: the peer
    /// can punch holes in its own memfd under our copies.
    guard: Option<crate::mem::guard::PeerWritable>,
}

// SAFETY: the mapping is plain shared memory; all access goes through
// atomics (control words) or bounds-checked copies by the owning QP, which
// is itself behind a mutex.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps a whole memfd received from a peer, after checking its seals:
    /// always `F_SEAL_SHRINK` (it cannot shrink under us and SIGBUS this
    /// process); for a read-only mapping also `F_SEAL_FUTURE_WRITE` or
    /// `F_SEAL_WRITE`, which block hole punching too (a punched hugetlbfs
    /// page faults back in only if the pool has a free page, else SIGBUS).
    /// Memory a peer hands us writable cannot be protected that way; it is
    /// guarded instead ([`crate::mem::guard`]): a hole that faults costs
    /// the connection, not the process.
    pub fn map_peer(fd: BorrowedFd<'_>, writable: bool) -> Result<Mapping, VerbsError> {
        let os = |what| move |source| VerbsError::Os { what, source };
        let seals = fcntl(fd, FcntlArg::F_GET_SEALS).map_err(os("F_GET_SEALS"))?;
        let seals = SealFlag::from_bits_truncate(seals);
        if !seals.contains(SealFlag::F_SEAL_SHRINK) {
            return Err(VerbsError::Protocol("peer memory is not size-sealed"));
        }
        if !writable && !seals.intersects(SealFlag::F_SEAL_FUTURE_WRITE | SealFlag::F_SEAL_WRITE) {
            return Err(VerbsError::Protocol(
                "peer read-only memory is not write-sealed",
            ));
        }
        let st = nix::sys::stat::fstat(fd).map_err(os("fstat"))?;
        let len = u64::try_from(st.st_size).map_err(|_| VerbsError::Protocol("negative size"))?;
        if len == 0 || len > MAX_REGION_LEN {
            return Err(VerbsError::Protocol("peer region size out of range"));
        }
        let nz = std::num::NonZeroUsize::new(len as usize)
            .ok_or(VerbsError::Protocol("empty region"))?;
        if !reserve(&PEER_MAPPED, len, PEER_MAPPED_BUDGET) {
            return Err(VerbsError::Limit("peer memory mapped by this process"));
        }
        let len = len as usize;
        let mut prot = ProtFlags::PROT_READ;
        if writable {
            prot |= ProtFlags::PROT_WRITE;
        }
        // SAFETY: a fresh shared mapping at a kernel-chosen address of a
        // sealed memfd of exactly `len` bytes.
        let ptr = match unsafe { mmap(None, nz, prot, MapFlags::MAP_SHARED, fd, 0) } {
            Ok(p) => p,
            Err(e) => {
                PEER_MAPPED.fetch_sub(len as u64, std::sync::atomic::Ordering::AcqRel);
                return Err(os("mmap peer memory")(e));
            }
        };
        let mut map = Mapping {
            ptr: ptr.cast(),
            len,
            writable,
            guard: None,
        };
        if writable {
            // A hugetlbfs memfd reports its page size as its block size;
            // the mapping (kernel-placed) is aligned to it.
            let page = usize::try_from(st.st_blksize)
                .ok()
                .filter(|p| p.is_power_of_two())
                .unwrap_or(crate::mem::PAGE_SIZE)
                .max(crate::mem::PAGE_SIZE);
            // SAFETY: our fresh mapping, unmapped only in `Drop`, after
            // the registration is dropped.
            let g = unsafe {
                crate::mem::guard::PeerWritable::register(map.ptr.as_ptr(), len, page)
            }
            .map_err(|_| VerbsError::Limit("peer-writable mappings guarded by this process"))?;
            map.guard = Some(g);
        }
        Ok(map)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The guard's view of a writable mapping.
    pub fn guard_probe(&self) -> Option<crate::mem::guard::GuardProbe> {
        self.guard
            .as_ref()
            .map(crate::mem::guard::PeerWritable::probe)
    }

    #[cfg(test)]
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The mapping as 64-bit atomic words.
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: mmap returns page-aligned memory of `len` bytes that stays
        // mapped as long as `self`; atomics tolerate concurrent access by
        // the other process. Loads on a read-only mapping are fine; we never
        // store through a read-only mapping (only our own outbox is stored
        // to, and it is mapped read-write).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr() as *const AtomicU64, self.len / 8) }
    }

    /// Pointer to `len` bytes at `off`, if they are inside the mapping.
    pub fn range(&self, off: u64, len: u64) -> Option<*mut u8> {
        let end = off.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: off <= end <= self.len, so the result is in the mapping.
        Some(unsafe { self.ptr.as_ptr().add(off as usize) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: created by mmap with this pointer and length; the owner
        // (a connection) is dropped only when no copy is in progress (it is
        // behind the QP mutex). The guard lets go of the range first.
        drop(self.guard.take());
        unsafe {
            let _ = munmap(self.ptr.cast(), self.len);
        }
        PEER_MAPPED.fetch_sub(self.len as u64, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Setup message types on the Unix socket.
pub(crate) const M_HELLO: u32 = 1;
pub(crate) const M_ACCEPT: u32 = 2;
pub(crate) const M_REJECT: u32 = 3;
pub(crate) const M_REGION: u32 = 4;
/// A wake-up: the sender published something while our [`W_SLEEPING`]
/// was raised. Carries nothing; sent only to a peer whose outbox has
/// [`FEATURE_DOORBELL`] (an older one would take it for a protocol
/// violation).
pub(crate) const M_RING: u32 = 5;

const MSG_HEADER: usize = 24;
pub(crate) const MSG_MAX: usize = MSG_HEADER + MAX_PRIVATE_DATA;

/// One setup message: `kind`, four u32 arguments, private data, maybe an fd.
#[derive(Debug)]
pub(crate) struct Msg {
    pub kind: u32,
    pub args: [u32; 4],
    pub data_len: usize,
    pub data: [u8; MAX_PRIVATE_DATA],
    pub fd: Option<OwnedFd>,
}

impl Msg {
    pub fn new(kind: u32, args: [u32; 4], data: &[u8]) -> Result<Msg, VerbsError> {
        if data.len() > MAX_PRIVATE_DATA {
            return Err(VerbsError::Limit("private data too long"));
        }
        let mut d = [0u8; MAX_PRIVATE_DATA];
        d[..data.len()].copy_from_slice(data);
        Ok(Msg {
            kind,
            args,
            data_len: data.len(),
            data: d,
            fd: None,
        })
    }

    pub fn private_data(&self) -> &[u8] {
        &self.data[..self.data_len]
    }

    /// Sends the message (and `fd`, if given) on a SEQPACKET socket.
    pub fn send(&self, sock: BorrowedFd<'_>, fd: Option<BorrowedFd<'_>>) -> Result<(), VerbsError> {
        let mut buf = [0u8; MSG_MAX];
        buf[0..4].copy_from_slice(&self.kind.to_le_bytes());
        for (i, a) in self.args.iter().enumerate() {
            buf[4 + 4 * i..8 + 4 * i].copy_from_slice(&a.to_le_bytes());
        }
        buf[20..24].copy_from_slice(&(self.data_len as u32).to_le_bytes());
        buf[MSG_HEADER..MSG_HEADER + self.data_len].copy_from_slice(self.private_data());
        let iov = [IoSlice::new(&buf[..MSG_HEADER + self.data_len])];
        let raw: [RawFd; 1] = [fd.map_or(-1, |f| f.as_raw_fd())];
        let cmsg = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage] = if fd.is_some() { &cmsg } else { &[] };
        // Never block: a peer that stops reading its socket must not stall
        // us (a full socket is that connection's error).
        let flags = MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT;
        sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, flags, None).map_err(|source| {
            VerbsError::Os {
                what: "sendmsg",
                source,
            }
        })?;
        Ok(())
    }

    /// Receives one message without blocking. `Ok(None)`: nothing queued.
    /// `Err(Protocol("hang-up"))`: the peer closed its end.
    pub fn recv(sock: BorrowedFd<'_>) -> Result<Option<Msg>, VerbsError> {
        Msg::recv_reusing(sock, &mut Msg::cmsg_buffer())
    }

    /// The control-message buffer [`Msg::recv_reusing`] needs (room for
    /// the descriptors a message may carry, and one more to notice extras).
    pub fn cmsg_buffer() -> Vec<u8> {
        nix::cmsg_space!([RawFd; 2])
    }

    /// [`Msg::recv`] with a control-message buffer of the caller's
    /// ([`Msg::cmsg_buffer`]), so that reading a message allocates
    /// nothing: a connection reads its socket on the data path (wake-ups,
    /// regions).
    // A `Vec`, not a slice: nix's `recvmsg` takes the buffer as a `Vec`
    // and uses its capacity.
    #[allow(clippy::ptr_arg)]
    pub fn recv_reusing(
        sock: BorrowedFd<'_>,
        cmsg_space: &mut Vec<u8>,
    ) -> Result<Option<Msg>, VerbsError> {
        // Peek first: the common "nothing queued" answer then costs one
        // syscall.
        let mut peek = [0u8; 1];
        match nix::sys::socket::recv(
            sock.as_raw_fd(),
            &mut peek,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ) {
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => return Ok(None),
            Err(source) => {
                return Err(VerbsError::Os {
                    what: "recv",
                    source,
                })
            }
            Ok(_) => {}
        }
        let mut buf = [0u8; MSG_MAX + 1];
        let (bytes, fd, truncated) = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let r = recvmsg::<()>(
                sock.as_raw_fd(),
                &mut iov,
                Some(cmsg_space),
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
            );
            let msg = match r {
                Ok(m) => m,
                Err(nix::errno::Errno::EAGAIN) => return Ok(None),
                Err(nix::errno::Errno::EINTR) => return Ok(None),
                Err(source) => {
                    return Err(VerbsError::Os {
                        what: "recvmsg",
                        source,
                    })
                }
            };
            let mut fd = None;
            let mut extra = false;
            if let Ok(cmsgs) = msg.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::ScmRights(fds) = c {
                        for f in fds {
                            // SAFETY: the kernel just installed this fd in
                            // our table for us; we take sole ownership (and
                            // close it on any error path by dropping).
                            let owned = unsafe { OwnedFd::from_raw_fd(f) };
                            if fd.is_none() {
                                fd = Some(owned);
                            } else {
                                extra = true;
                            }
                        }
                    }
                }
            }
            let truncated = msg
                .flags
                .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC)
                || extra;
            (msg.bytes, fd, truncated)
        };
        if bytes == 0 && fd.is_none() {
            return Err(VerbsError::Protocol("hang-up"));
        }
        if truncated || !(MSG_HEADER..=MSG_MAX).contains(&bytes) {
            return Err(VerbsError::Protocol("malformed setup message"));
        }
        let word = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        let data_len = word(20) as usize;
        if MSG_HEADER + data_len != bytes {
            return Err(VerbsError::Protocol("bad private data length"));
        }
        let mut m = Msg::new(
            word(0),
            [word(4), word(8), word(12), word(16)],
            &buf[MSG_HEADER..bytes],
        )?;
        m.fd = fd;
        Ok(Some(m))
    }

    /// Waits up to `timeout` for one message.
    pub fn recv_timeout(
        sock: BorrowedFd<'_>,
        timeout: std::time::Duration,
    ) -> Result<Msg, VerbsError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(m) = Msg::recv(sock)? {
                return Ok(m);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(VerbsError::Timeout);
            }
            wait_readable(sock, left)?;
        }
    }
}

/// Blocks until `fd` is readable or `timeout` passes (no error on timeout).
pub(crate) fn wait_readable(
    fd: BorrowedFd<'_>,
    timeout: std::time::Duration,
) -> Result<(), VerbsError> {
    wait_any_readable(std::iter::once(fd), timeout)
}

/// Blocks until one of `fds` is readable or `timeout` passes (no error on
/// timeout).
pub(crate) fn wait_any_readable<'a>(
    fds: impl Iterator<Item = BorrowedFd<'a>>,
    timeout: std::time::Duration,
) -> Result<(), VerbsError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds: Vec<PollFd<'a>> = fds.map(|fd| PollFd::new(fd, PollFlags::POLLIN)).collect();
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    match poll(
        &mut fds,
        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
    ) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Err(source) => Err(VerbsError::Os {
            what: "poll",
            source,
        }),
    }
}
