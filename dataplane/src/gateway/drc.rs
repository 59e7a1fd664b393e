//! The relay's duplicate request cache, keyed as knfsd keys its own: who
//! the client is, the XID, the program, version and procedure, and a
//! checksum of the start of the call (RFC 5531 says nothing about it; the
//! practice is Linux's `nfsd_cache_lookup`).
//!
//! A client retransmits a call whose reply it did not get, on a new
//! connection (RFC 8166 s3.3.4: a requester retransmits only after the
//! connection is lost). A non-idempotent call executed twice answers
//! wrongly the second time (REMOVE: NFS3ERR_NOENT). So for the
//! procedures that are not idempotent the cache remembers the call while
//! it is at the backend and its reply afterwards:
//!
//! | lookup finds | the relay |
//! |---|---|
//! | nothing | forwards the call, remembers it in progress |
//! | the call in progress | does not forward it again; the reply, when it comes, also answers the retransmission |
//! | the call done | answers from the cache; the backend does not see it |
//!
//! The key never holds a port or a queue-pair number: both change with
//! the connection. The client is the provider's peer identity (an IP
//! address, or a local uid). The checksum covers the call from its
//! program number up to [`SUM_LEN`] bytes: the RPC-over-RDMA header is not
//! in it (the engine gives the relay the RPC message alone), so a
//! retransmission whose chunk lists differ still matches.
//!
//! Bounded: a fixed ring of entries (`GatewayConfig::reply_cache_entries`), the oldest
//! replaced first, and replies of at most [`MAX_CACHED_REPLY`] bytes (the
//! replies of non-idempotent NFS procedures are attribute updates, a few
//! hundred bytes); a longer reply is relayed but not kept. Entries older
//! than the time to live are not used.

use std::collections::HashMap;
use std::time::Duration;

use crate::engine::Instant;

/// Bytes of a call, from its program number on, that the checksum covers
/// (knfsd's `RC_CSUMLEN` is 256 bytes of the arguments).
pub(super) const SUM_LEN: usize = 256;
/// The longest reply kept.
pub(super) const MAX_CACHED_REPLY: usize = 1024;

/// What identifies a call across retransmissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Key {
    client: u64,
    xid: u32,
    program: u32,
    version: u32,
    procedure: u32,
    len: u32,
    sum: u32,
}

impl Key {
    /// The key of the call message `msg` from `client`.
    pub(super) fn of(client: u64, msg: &[u8], program: u32, version: u32, procedure: u32) -> Key {
        let xid = msg
            .get(..4)
            .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        let from = msg.get(12..).unwrap_or(&[]);
        Key {
            client,
            xid,
            program,
            version,
            procedure,
            len: msg.len() as u32,
            sum: crc32fast::hash(&from[..from.len().min(SUM_LEN)]),
        }
    }
}

/// An entry's place and use count, to find it again without a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct EntryRef {
    index: u32,
    generation: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Empty,
    /// At the backend, as the relay's pending slot `slot`.
    InProgress {
        slot: u32,
    },
    /// Answered; the reply is `len` bytes of the entry's reply room.
    Done {
        len: u32,
    },
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    key: Option<Key>,
    state: State,
    generation: u32,
    since: Instant,
}

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Lookup<'a> {
    /// Not seen (or forgotten): forward it.
    Miss,
    /// At the backend as pending slot `slot`.
    InProgress { slot: u32 },
    /// Answered before: this is the reply.
    Done(&'a [u8]),
}

/// A worker's duplicate request cache (see the module documentation).
#[derive(Debug)]
pub(super) struct Drc {
    entries: Vec<Entry>,
    index: HashMap<Key, u32>,
    replies: Box<[u8]>,
    /// Where the next entry goes (the oldest is replaced).
    next: usize,
    ttl: Duration,
}

impl Drc {
    /// A cache of `capacity` entries (at least 1) whose entries live
    /// `ttl`. Allocates everything now.
    pub(super) fn new(capacity: usize, ttl: Duration) -> Drc {
        let capacity = capacity.max(1);
        Drc {
            entries: vec![
                Entry {
                    key: None,
                    state: State::Empty,
                    generation: 0,
                    since: Instant::ZERO,
                };
                capacity
            ],
            // Twice the entries: removals leave tombstones, and the map
            // then rehashes in place only while it is at most half full;
            // fuller, it would grow, allocating on the data path.
            index: HashMap::with_capacity(2 * capacity),
            replies: vec![0u8; capacity * MAX_CACHED_REPLY].into_boxed_slice(),
            next: 0,
            ttl,
        }
    }

    /// What the cache knows of `key` at `now`.
    pub(super) fn lookup(&self, key: &Key, now: Instant) -> Lookup<'_> {
        let Some(&i) = self.index.get(key) else {
            return Lookup::Miss;
        };
        let e = &self.entries[i as usize];
        match e.state {
            State::InProgress { slot } => Lookup::InProgress { slot },
            State::Done { len } if now.saturating_duration_since(e.since) < self.ttl => {
                let at = i as usize * MAX_CACHED_REPLY;
                Lookup::Done(&self.replies[at..at + len as usize])
            }
            _ => Lookup::Miss,
        }
    }

    /// Remembers `key` as in progress at pending slot `slot`, in place of
    /// the oldest entry.
    pub(super) fn start(&mut self, key: Key, slot: u32, now: Instant) -> EntryRef {
        if let Some(i) = self.index.remove(&key) {
            // A stale entry of the same key (past its time to live).
            self.entries[i as usize].key = None;
            self.entries[i as usize].state = State::Empty;
        }
        let i = self.next;
        self.next = (self.next + 1) % self.entries.len();
        let e = &mut self.entries[i];
        if let Some(old) = e.key.take() {
            self.index.remove(&old);
        }
        e.generation = e.generation.wrapping_add(1);
        e.key = Some(key);
        e.state = State::InProgress { slot };
        e.since = now;
        self.index.insert(key, i as u32);
        EntryRef {
            index: i as u32,
            generation: e.generation,
        }
    }

    /// The call of `r` was answered with `reply`: kept when it fits, the
    /// entry forgotten otherwise. Nothing if the entry was replaced since.
    pub(super) fn complete(&mut self, r: EntryRef, reply: &[u8], now: Instant) {
        let Some(e) = self.entries.get_mut(r.index as usize) else {
            return;
        };
        if e.generation != r.generation || !matches!(e.state, State::InProgress { .. }) {
            return;
        }
        if reply.len() > MAX_CACHED_REPLY {
            self.forget(r);
            return;
        }
        let at = r.index as usize * MAX_CACHED_REPLY;
        self.replies[at..at + reply.len()].copy_from_slice(reply);
        e.state = State::Done {
            len: reply.len() as u32,
        };
        e.since = now;
    }

    /// The call of `r` got no reply (timed out): forgotten, so a
    /// retransmission is forwarded again.
    pub(super) fn forget(&mut self, r: EntryRef) {
        let Some(e) = self.entries.get_mut(r.index as usize) else {
            return;
        };
        if e.generation != r.generation {
            return;
        }
        if let Some(k) = e.key.take() {
            self.index.remove(&k);
        }
        e.state = State::Empty;
    }
}

/// Whether calls of `procedure` of `program`/`version` change the server's
/// state so that running them twice answers differently: the NFSv3
/// procedures knfsd caches (SETATTR, WRITE, CREATE, MKDIR, SYMLINK, MKNOD,
/// REMOVE, RMDIR, RENAME, LINK; RFC 1813 s3.3). NFSv4.1 and later have a
/// reply cache of their own per session slot (RFC 8881 s2.10.6), which a
/// retransmission through the relay reaches unchanged.
pub(super) fn is_cached(program: u32, version: u32, procedure: u32) -> bool {
    program == crate::nfs::NFS_PROGRAM
        && version == crate::nfs::NFS_V3
        && matches!(procedure, 2 | 7..=15)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(xid: u32, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        for w in [xid, 0, 2, 100_003, 3, 12] {
            m.extend_from_slice(&w.to_be_bytes());
        }
        m.extend_from_slice(body);
        m
    }

    fn key(client: u64, msg: &[u8]) -> Key {
        Key::of(client, msg, 100_003, 3, 12)
    }

    const T0: Instant = Instant(1_000);

    #[test]
    fn a_call_is_in_progress_then_done_then_answered_from_the_cache() {
        let mut drc = Drc::new(4, Duration::from_secs(60));
        let m = call(7, b"remove this");
        let k = key(1, &m);
        assert_eq!(drc.lookup(&k, T0), Lookup::Miss);
        let r = drc.start(k, 3, T0);
        assert_eq!(drc.lookup(&k, T0), Lookup::InProgress { slot: 3 });
        drc.complete(r, b"the reply", T0);
        assert_eq!(drc.lookup(&k, T0), Lookup::Done(b"the reply"));
        // Past the time to live: forwarded again.
        let late = T0.saturating_add(Duration::from_secs(61));
        assert_eq!(drc.lookup(&k, late), Lookup::Miss);
    }

    #[test]
    fn another_client_xid_or_body_is_another_call() {
        let mut drc = Drc::new(4, Duration::from_secs(60));
        let m = call(7, b"remove this");
        let r = drc.start(key(1, &m), 0, T0);
        drc.complete(r, b"ok", T0);
        assert_eq!(drc.lookup(&key(2, &m), T0), Lookup::Miss, "client");
        assert_eq!(
            drc.lookup(&key(1, &call(8, b"remove this")), T0),
            Lookup::Miss,
            "xid"
        );
        assert_eq!(
            drc.lookup(&key(1, &call(7, b"remove that")), T0),
            Lookup::Miss,
            "body"
        );
        // A different RPC-over-RDMA header is not part of the message: the
        // same RPC message is the same call.
        assert_eq!(
            drc.lookup(&key(1, &call(7, b"remove this")), T0),
            Lookup::Done(b"ok")
        );
    }

    #[test]
    fn the_oldest_entry_makes_room_and_its_late_completion_is_ignored() {
        let mut drc = Drc::new(2, Duration::from_secs(60));
        let (a, b, c) = (call(1, b"a"), call(2, b"b"), call(3, b"c"));
        let ra = drc.start(key(1, &a), 0, T0);
        drc.start(key(1, &b), 1, T0);
        drc.start(key(1, &c), 2, T0);
        assert_eq!(drc.lookup(&key(1, &a), T0), Lookup::Miss);
        drc.complete(ra, b"late", T0);
        assert_eq!(drc.lookup(&key(1, &a), T0), Lookup::Miss);
        assert_eq!(drc.lookup(&key(1, &c), T0), Lookup::InProgress { slot: 2 });
    }

    #[test]
    fn a_long_reply_or_a_timeout_forgets_the_call() {
        let mut drc = Drc::new(2, Duration::from_secs(60));
        let m = call(1, b"x");
        let r = drc.start(key(1, &m), 0, T0);
        drc.complete(r, &[0u8; MAX_CACHED_REPLY + 1], T0);
        assert_eq!(drc.lookup(&key(1, &m), T0), Lookup::Miss);
        let r = drc.start(key(1, &m), 0, T0);
        drc.forget(r);
        assert_eq!(drc.lookup(&key(1, &m), T0), Lookup::Miss);
    }

    #[test]
    fn only_nfsv3_procedures_that_change_state_are_cached() {
        for p in [2, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            assert!(is_cached(100_003, 3, p), "procedure {p}");
        }
        for p in [0, 1, 3, 4, 5, 6, 16, 17, 18, 19, 20, 21] {
            assert!(!is_cached(100_003, 3, p), "procedure {p}");
        }
        assert!(!is_cached(100_003, 4, 1));
        assert!(!is_cached(100_005, 3, 1));
    }
}
