//! Live TCP connections per peer address, so that one address cannot take
//! every connection a server holds (`workers.max_connections_per_peer`).
//!
//! An acceptor counts a connection in ([`PeerCounts::try_add`]) before it
//! hands the stream to a worker; the worker's `TcpConnections` counts it
//! out when it closes it, for any reason. Opens and closes are per
//! connection, never per call, so one mutex over a map is cheap enough and
//! exact: the map holds only addresses with live connections, so it never
//! grows past the connections served.
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

/// Live connections per peer address, bounded by a limit.
#[derive(Debug)]
pub struct PeerCounts {
    limit: u32,
    live: Mutex<HashMap<IpAddr, u32>>,
}

impl PeerCounts {
    /// Counts with at most `limit` live connections per address (at least
    /// 1).
    pub fn new(limit: u32) -> PeerCounts {
        PeerCounts {
            limit: limit.max(1),
            live: Mutex::new(HashMap::new()),
        }
    }

    /// The limit per address.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Counts a connection from `ip` in, unless `ip` already has `limit`.
    pub fn try_add(&self, ip: IpAddr) -> bool {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let n = live.entry(ip).or_insert(0);
        if *n >= self.limit {
            return false;
        }
        *n += 1;
        true
    }

    /// Counts a connection from `ip` out (one that was never counted in
    /// changes nothing).
    pub fn remove(&self, ip: IpAddr) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = live.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                live.remove(&ip);
            }
        }
    }

    /// Live connections from `ip`.
    pub fn count(&self, ip: IpAddr) -> u32 {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.get(&ip).copied().unwrap_or(0)
    }

    /// Addresses with live connections.
    pub fn addresses(&self) -> usize {
        self.live.lock().map_or(0, |l| l.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_its_limit_and_a_close_makes_room() {
        let p = PeerCounts::new(2);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "::1".parse().unwrap());
        assert!(p.try_add(a) && p.try_add(a));
        assert!(!p.try_add(a), "past the limit");
        assert!(p.try_add(b), "another address has its own count");
        p.remove(a);
        assert_eq!(p.count(a), 1);
        assert!(p.try_add(a));
        p.remove(a);
        p.remove(a);
        p.remove(a); // never counted in: no underflow
        p.remove(b);
        assert_eq!((p.count(a), p.addresses()), (0, 0), "the map empties");
    }
}
