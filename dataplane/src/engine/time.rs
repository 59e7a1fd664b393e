//! Time as the engine sees it: a number the caller passes in.
//!
//! The engine never reads a clock. The worker passes the
//! monotonic time of its polling loop; the test harness passes virtual
//! time. [`Instant`] is a plain count of nanoseconds from an arbitrary
//! origin chosen by the caller, so both work without conversion and the
//! harness can start at zero.

use core::time::Duration;

/// A point in time: nanoseconds since an origin the caller chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(pub u64);

impl Instant {
    /// The origin.
    pub const ZERO: Instant = Instant(0);

    /// `self + d`, saturating at the end of time instead of wrapping.
    pub fn saturating_add(self, d: Duration) -> Instant {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }

    /// Time elapsed from `earlier` to `self` (zero if `earlier` is later).
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// The connection timers. Each has one deadline in [`TimerTable`]; the
/// table is indexed by the enum, as in quinn-proto.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// The earliest deadline of an outstanding call (requester side). On
    /// expiry the engine fails the calls whose deadline passed.
    CallTimeout = 0,
    /// The earliest deadline of a reply exposed in a read chunk (responder
    /// side, RFC 5666 s3.8): on expiry its memory is withdrawn even though
    /// no RDMA_DONE came.
    DoneReclaim = 1,
    /// [`super::Config::idle_timeout`]: checked when it fires; a
    /// connection with nothing in flight that received nothing for that
    /// long is closed ([`super::CloseReason::Idle`]), otherwise the timer
    /// is armed again for the new deadline.
    Idle = 2,
    /// A call waits for a buffer of the worker's bulk pool
    /// (`engine::bulk`): on expiry the waiting calls are tried again.
    /// Another connection gives the buffer back, so there is no event on
    /// this one to wait for.
    BulkRetry = 3,
    /// A transmission group is being received (rtrext s4.2): on expiry
    /// a group that stopped arriving is dropped
    /// ([`super::Config::group_timeout`]).
    GroupReassembly = 4,
}

impl Timer {
    /// Number of timers.
    pub const COUNT: usize = 5;
    /// Every timer, in index order.
    pub const ALL: [Timer; Timer::COUNT] = [
        Timer::CallTimeout,
        Timer::DoneReclaim,
        Timer::Idle,
        Timer::BulkRetry,
        Timer::GroupReassembly,
    ];
}

/// One optional deadline per [`Timer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TimerTable {
    deadlines: [Option<Instant>; Timer::COUNT],
}

impl TimerTable {
    /// Arms `timer` for `at` (replacing an earlier setting).
    pub fn set(&mut self, timer: Timer, at: Instant) {
        self.deadlines[timer as usize] = Some(at);
    }

    /// Disarms `timer`.
    pub fn stop(&mut self, timer: Timer) {
        self.deadlines[timer as usize] = None;
    }

    /// The deadline of `timer`, if armed.
    pub fn get(&self, timer: Timer) -> Option<Instant> {
        self.deadlines[timer as usize]
    }

    /// The earliest armed deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.iter().flatten().min().copied()
    }

    /// True if `timer` is armed and its deadline is at or before `now`.
    pub fn is_expired(&self, timer: Timer, now: Instant) -> bool {
        self.get(timer).is_some_and(|t| t <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_arithmetic_saturates() {
        let t = Instant(u64::MAX - 1);
        assert_eq!(t.saturating_add(Duration::from_secs(1)), Instant(u64::MAX));
        assert_eq!(
            Instant(5).saturating_duration_since(Instant(9)),
            Duration::ZERO
        );
        assert_eq!(
            Instant(9).saturating_duration_since(Instant(5)),
            Duration::from_nanos(4)
        );
    }

    #[test]
    fn timer_table_reports_earliest_and_expiry() {
        let mut tt = TimerTable::default();
        assert_eq!(tt.next_deadline(), None);
        tt.set(Timer::CallTimeout, Instant(10));
        assert_eq!(tt.next_deadline(), Some(Instant(10)));
        assert!(!tt.is_expired(Timer::CallTimeout, Instant(9)));
        assert!(tt.is_expired(Timer::CallTimeout, Instant(10)));
        tt.stop(Timer::CallTimeout);
        assert_eq!(tt.next_deadline(), None);
    }
}
