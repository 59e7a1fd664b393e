//! Owning wrappers around the raw librdmacm handles used during connection
//! setup: event channels, CM ids and CM events. Each wrapper owns exactly
//! one pointer and releases it on drop; the pointers never escape except
//! to the libraries.

use std::ffi::CStr;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use rdma_sys::*;

use super::translate::copy_private_data;
use crate::verbs::VerbsError;

/// The current `errno` as a [`VerbsError::Os`].
pub(super) fn os_error(what: &'static str) -> VerbsError {
    VerbsError::Os {
        what,
        source: nix::Error::last(),
    }
}

/// A [`VerbsError::Os`] from an errno value returned directly.
pub(super) fn errno_error(what: &'static str, errno: i32) -> VerbsError {
    VerbsError::Os {
        what,
        source: nix::Error::from_raw(errno),
    }
}

/// An rdma_cm event channel (a file descriptor), non-blocking.
#[derive(Debug)]
pub(super) struct Channel(*mut rdma_event_channel);

// SAFETY: an event channel is a file descriptor wrapper; librdmacm allows
// using it from any thread. We never read it from two threads at once
// (every owner keeps it behind `&mut` or a mutex).
unsafe impl Send for Channel {}
// SAFETY: see `Send`; shared access only reads the fd number.
unsafe impl Sync for Channel {}

impl Channel {
    pub(super) fn new() -> Result<Channel, VerbsError> {
        // SAFETY: no arguments; returns null on failure.
        let ch = unsafe { rdma_create_event_channel() };
        if ch.is_null() {
            return Err(os_error("rdma_create_event_channel"));
        }
        let ch = Channel(ch);
        let fd = ch.fd();
        // SAFETY: fcntl on a descriptor we own; no memory is passed.
        let ok = unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(os_error("fcntl(O_NONBLOCK) on the rdma_cm channel"));
        }
        Ok(ch)
    }

    pub(super) fn as_ptr(&self) -> *mut rdma_event_channel {
        self.0
    }

    pub(super) fn fd(&self) -> RawFd {
        // SAFETY: the channel pointer is valid while `self` lives.
        unsafe { (*self.0).fd }
    }

    /// The next event if one is queued.
    pub(super) fn try_event(&self) -> Result<Option<Event>, VerbsError> {
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: the channel is valid; `ev` is written on success only.
        let rc = unsafe { rdma_get_cm_event(self.0, &mut ev) };
        if rc != 0 {
            let e = nix::Error::last();
            if e == nix::Error::EAGAIN {
                return Ok(None);
            }
            return Err(VerbsError::Os {
                what: "rdma_get_cm_event",
                source: e,
            });
        }
        Ok(Some(Event(ev)))
    }

    /// Waits for the next event until `deadline`.
    pub(super) fn wait_event(&self, deadline: Instant) -> Result<Event, VerbsError> {
        loop {
            if let Some(ev) = self.try_event()? {
                return Ok(ev);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(VerbsError::Timeout);
            }
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            let mut pfd = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd on the stack.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc < 0 && nix::Error::last() != nix::Error::EINTR {
                return Err(os_error("poll on the rdma_cm channel"));
            }
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: we own the channel; every id on it was destroyed first
        // (owners declare the id before the channel, so it drops first).
        unsafe { rdma_destroy_event_channel(self.0) }
    }
}

/// One rdma_cm event, acknowledged on drop.
pub(super) struct Event(*mut rdma_cm_event);

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event({})", self.name())
    }
}

impl Event {
    pub(super) fn kind(&self) -> rdma_cm_event_type::Type {
        // SAFETY: the event is valid until acked (drop).
        unsafe { (*self.0).event }
    }
    pub(super) fn status(&self) -> i32 {
        // SAFETY: as above.
        unsafe { (*self.0).status }
    }
    pub(super) fn id(&self) -> *mut rdma_cm_id {
        // SAFETY: as above.
        unsafe { (*self.0).id }
    }
    /// The connection parameters' private data (connect request, response,
    /// reject, established).
    pub(super) fn private_data(&self) -> Vec<u8> {
        // SAFETY: for connection events `param.conn` is the active union
        // member; librdmacm sets private_data/len consistently (null/0 when
        // there is none); the bytes live until the ack.
        unsafe {
            let c = &(*self.0).param.conn;
            copy_private_data(c.private_data, c.private_data_len)
        }
    }
    /// The requester's RDMA Read depth (connect requests).
    pub(super) fn initiator_depth(&self) -> u8 {
        // SAFETY: as `private_data`.
        unsafe { (*self.0).param.conn.initiator_depth }
    }
    pub(super) fn name(&self) -> String {
        // SAFETY: rdma_event_str returns a static string for any value.
        unsafe { CStr::from_ptr(rdma_event_str(self.kind())) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: each event is acked exactly once, here.
        unsafe {
            rdma_ack_cm_event(self.0);
        }
    }
}

/// An rdma_cm id. Declare it before its [`Channel`] in any struct.
#[derive(Debug)]
pub(super) struct CmId(*mut rdma_cm_id);

// SAFETY: librdmacm calls on one id are safe from any thread; owners
// serialise them (a mutex or `&mut`).
unsafe impl Send for CmId {}
// SAFETY: see `Send`.
unsafe impl Sync for CmId {}

impl CmId {
    pub(super) fn new(ch: &Channel) -> Result<CmId, VerbsError> {
        let mut id = std::ptr::null_mut();
        // SAFETY: valid channel; `id` is written on success.
        let rc = unsafe {
            rdma_create_id(
                ch.as_ptr(),
                &mut id,
                std::ptr::null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(os_error("rdma_create_id"));
        }
        Ok(CmId(id))
    }

    /// Takes ownership of an id rdma_cm created (a connect request's).
    ///
    /// # Safety
    /// `id` must be a live id nobody else destroys.
    pub(super) unsafe fn from_raw(id: *mut rdma_cm_id) -> CmId {
        CmId(id)
    }

    pub(super) fn as_ptr(&self) -> *mut rdma_cm_id {
        self.0
    }

    /// The device context rdma_cm attached the id to (null before an
    /// address is bound or resolved, and for wildcard binds).
    pub(super) fn verbs(&self) -> *mut ibv_context {
        // SAFETY: the id is valid while `self` lives.
        unsafe { (*self.0).verbs }
    }

    pub(super) fn port_num(&self) -> u8 {
        // SAFETY: as `verbs`.
        unsafe { (*self.0).port_num }
    }

    pub(super) fn bind(&self, addr: SocketAddr) -> Result<(), VerbsError> {
        let mut sa = SockAddr::from(addr);
        // SAFETY: valid id; the sockaddr lives on the stack for the call.
        let rc = unsafe { rdma_bind_addr(self.0, sa.as_mut_ptr()) };
        if rc != 0 {
            return Err(os_error("rdma_bind_addr"));
        }
        Ok(())
    }

    pub(super) fn migrate(&self, ch: &Channel) -> Result<(), VerbsError> {
        // SAFETY: valid id and channel; every event of the id on its old
        // channel has been acked (callers drop the event first).
        if unsafe { rdma_migrate_id(self.0, ch.as_ptr()) } != 0 {
            return Err(os_error("rdma_migrate_id"));
        }
        Ok(())
    }

    /// `rdma_disconnect`: sends a DREQ (or answers one). Errors are
    /// ignored: the id may never have connected.
    pub(super) fn disconnect(&self) {
        // SAFETY: valid id; rdma_disconnect does not touch our QP (rdma_cm
        // does not know it) and fails harmlessly if not connected.
        unsafe {
            rdma_disconnect(self.0);
        }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: we own the id and all its events were acked (events are
        // dropped before their ids in every code path).
        unsafe {
            rdma_destroy_id(self.0);
        }
    }
}

/// A `sockaddr_in`/`sockaddr_in6` for librdmacm.
pub(super) struct SockAddr(libc::sockaddr_storage);

impl SockAddr {
    pub(super) fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        (&mut self.0 as *mut libc::sockaddr_storage).cast()
    }
}

impl From<SocketAddr> for SockAddr {
    fn from(a: SocketAddr) -> SockAddr {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        match a {
            SocketAddr::V4(v4) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(v4.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and suitably
                // aligned for sockaddr_in.
                unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            }
            SocketAddr::V6(v6) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: v6.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: v6.ip().octets(),
                    },
                    sin6_scope_id: v6.scope_id(),
                };
                // SAFETY: as above, for sockaddr_in6.
                unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            }
        }
        SockAddr(ss)
    }
}

/// How long each rdma_cm resolution step may take.
pub(super) fn step_ms(deadline: Instant) -> i32 {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
        .as_millis()
        .min(i32::MAX as u128) as i32
}

/// The device name of a context.
pub(super) fn device_name(ctx: *mut ibv_context) -> String {
    // SAFETY: a live context has a live device whose name is a C string.
    unsafe { CStr::from_ptr(ibv_get_device_name((*ctx).device)) }
        .to_string_lossy()
        .into_owned()
}

/// The device contexts librdmacm opened (one per RDMA device). They stay
/// open for the life of the process (librdmacm owns them), so the raw
/// pointers taken from this list remain valid after it is freed.
pub(super) struct DeviceList {
    list: *mut *mut ibv_context,
    n: usize,
}

impl DeviceList {
    pub(super) fn get() -> DeviceList {
        let mut n = 0;
        // SAFETY: `n` is written; the result is null or an array of `n`
        // context pointers followed by null.
        let list = unsafe { rdma_get_devices(&mut n) };
        DeviceList {
            list,
            n: if list.is_null() { 0 } else { n.max(0) as usize },
        }
    }
    pub(super) fn contexts(&self) -> &[*mut ibv_context] {
        if self.n == 0 {
            return &[];
        }
        // SAFETY: `list` holds `n` entries (see `get`).
        unsafe { std::slice::from_raw_parts(self.list, self.n) }
    }
    pub(super) fn names(&self) -> Vec<String> {
        self.contexts().iter().map(|&c| device_name(c)).collect()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if !self.list.is_null() {
            // SAFETY: frees the array only (the contexts stay open).
            unsafe { rdma_free_devices(self.list) }
        }
    }
}
