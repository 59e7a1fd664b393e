//! Refused connection attempts: why (the `reason` label of
//! `rpcrdma_listener_rejected_total`), and a log that stays readable under
//! a flood: the first refusal of a kind is logged at once, the next ones
//! within a second are counted and summed up in the next line logged.
//!
//! A flood of refusals is the situation where a line per refusal hurts
//! most (the log's disk and the acceptor's time go to the attacker), and
//! the counters already hold the totals; the log's job is to say that it
//! happens and why.

use std::time::{Duration, Instant};

use dataplane::verbs::VerbsError;
use dataplane::worker::WorkerError;

/// Why a connection attempt was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `workers.max_connections` reached.
    Limit,
    /// Every worker's control ring was full, or no worker could take it.
    Busy,
    /// shm: the peer's uid is not allowed (`shm.allowed_uids`).
    NotAllowed,
    /// shm: no setup message within the setup timeout.
    SetupTimeout,
    /// The connection setup did not follow the protocol (a bad or
    /// unexpected setup message, private data we refuse).
    BadSetup,
    /// Memory, registration or queue resources for it ran out.
    Resources,
    /// The listening socket's accept failed (e.g. out of descriptors).
    Accept,
    /// roce: the requester's address already had the most connections
    /// half-open that the provider allows per address (rejected by its
    /// connection manager before the daemon saw the request).
    HalfOpen,
    /// tcp: the peer's address already had
    /// `workers.max_connections_per_peer` connections; shm: the peer's uid
    /// already had `shm.max_connections_per_uid`.
    PeerLimit,
    /// shm: an established connection was ended because its peer punched
    /// a hole in memory shared writable with it and touching the hole
    /// faulted (the hugepage pool could not refill it); the SIGBUS guard
    /// kept the daemon alive.
    PeerMemoryFault,
    /// roce: connection-manager messages (a flood's requests, mostly)
    /// dropped because the device's queue for them was full while
    /// threads drove it; a real sender retries, a flooder's request is
    /// simply gone.
    CmQueueFull,
}

impl Refusal {
    /// Every reason, in label order.
    pub const ALL: [Refusal; 11] = [
        Refusal::Limit,
        Refusal::Busy,
        Refusal::NotAllowed,
        Refusal::SetupTimeout,
        Refusal::BadSetup,
        Refusal::Resources,
        Refusal::Accept,
        Refusal::HalfOpen,
        Refusal::PeerLimit,
        Refusal::PeerMemoryFault,
        Refusal::CmQueueFull,
    ];

    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Limit => "limit",
            Refusal::Busy => "busy",
            Refusal::NotAllowed => "not_allowed",
            Refusal::SetupTimeout => "setup_timeout",
            Refusal::BadSetup => "bad_setup",
            Refusal::Resources => "resources",
            Refusal::Accept => "accept",
            Refusal::HalfOpen => "half_open",
            Refusal::PeerLimit => "peer_limit",
            Refusal::PeerMemoryFault => "peer_memory_fault",
            Refusal::CmQueueFull => "cm_queue_full",
        }
    }

    /// The reason a worker set's refusal stands for.
    pub fn of(e: &WorkerError) -> Refusal {
        match e {
            WorkerError::ConnectionLimit { .. } => Refusal::Limit,
            WorkerError::PeerLimit { .. } => Refusal::PeerLimit,
            WorkerError::Busy => Refusal::Busy,
            WorkerError::Verbs(v) => match v {
                VerbsError::PeerNotAllowed { .. } => Refusal::NotAllowed,
                VerbsError::PeerLimit { .. } => Refusal::PeerLimit,
                VerbsError::SetupTimeout => Refusal::SetupTimeout,
                VerbsError::Protocol(_) | VerbsError::Rejected { .. } => Refusal::BadSetup,
                _ => Refusal::Resources,
            },
            _ => Refusal::Resources,
        }
    }
}

/// How long refusals of one kind are summed up before the next line.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// A refusal log for one listener, owned by its acceptor thread.
#[derive(Debug)]
pub struct RefusalLog {
    what: String,
    /// Per reason: when it was last logged, and how many were not since.
    last: [(Option<Instant>, u64); Refusal::ALL.len()],
}

impl RefusalLog {
    /// A log whose lines start with `what` (the listener's URL).
    pub fn new(what: impl Into<String>) -> RefusalLog {
        RefusalLog {
            what: what.into(),
            last: [(None, 0); Refusal::ALL.len()],
        }
    }

    /// Records a refusal for `reason` at `now`, described by `detail`
    /// (only built when a line is written). Returns whether a line was
    /// written.
    pub fn refused(
        &mut self,
        now: Instant,
        reason: Refusal,
        detail: impl FnOnce() -> String,
    ) -> bool {
        let (last, suppressed) = &mut self.last[reason as usize];
        if last.is_some_and(|t| now.saturating_duration_since(t) < LOG_EVERY) {
            *suppressed += 1;
            return false;
        }
        let more = match *suppressed {
            0 => String::new(),
            n => format!(
                " ({n} more refused for {} since the last line)",
                reason.label()
            ),
        };
        tracing::warn!("{}: connection refused: {}{more}", self.what, detail());
        *last = Some(now);
        *suppressed = 0;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_one_kind_writes_a_line_a_second_and_counts_the_rest() {
        let mut log = RefusalLog::new("tcp://127.0.0.1:1");
        let t0 = Instant::now();
        let mut lines = 0;
        // 1,000 refusals over 2.5 simulated seconds: lines at 0 s, 1 s, 2 s.
        for i in 0..1000u64 {
            let now = t0 + Duration::from_micros(i * 2500);
            lines += usize::from(log.refused(now, Refusal::Busy, || "busy".into()));
        }
        assert_eq!(lines, 3);
        // Another reason has its own budget.
        assert!(
            log.refused(t0 + Duration::from_millis(2600), Refusal::Limit, || {
                "limit".into()
            })
        );
        // Since the line at 2 s: the 199 refusals after it.
        assert_eq!(log.last[Refusal::Busy as usize].1, 199);
    }

    #[test]
    fn labels_are_distinct() {
        let mut labels: Vec<&str> = Refusal::ALL.iter().map(|r| r.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Refusal::ALL.len());
        for (i, r) in Refusal::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }
}
