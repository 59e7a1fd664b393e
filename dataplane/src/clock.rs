//! The data path's clock: nanoseconds since the clock was made, as the
//! engine's [`Instant`], read where the data path reads time (once per
//! worker iteration, twice per timed call, once per client round).
//!
//! `std::time::Instant::now` is a `clock_gettime` call: about 26 ns and
//! 45 instructions with its subtraction on the development VM, three or
//! four of them per RPC on each side. `quanta` reads the TSC instead
//! (about 10 ns there) and scales it with a calibration made once per
//! process; where the TSC is not invariant it falls back to the monotonic
//! clock itself. Both readings of a difference are always taken on one
//! thread (a worker, a client), so cross-core TSC skew never enters one.
use crate::engine::Instant;

/// A monotonic clock whose zero is its creation.
#[derive(Debug, Clone)]
pub struct MonoClock {
    clock: quanta::Clock,
    origin: u64,
}

impl Default for MonoClock {
    fn default() -> Self {
        MonoClock::new()
    }
}

impl MonoClock {
    /// A clock reading zero now.
    pub fn new() -> MonoClock {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        MonoClock { clock, origin }
    }

    /// Nanoseconds since the clock was made, as the engine's time.
    #[inline]
    pub fn now(&self) -> Instant {
        Instant(self.clock.delta_as_nanos(self.origin, self.clock.raw()))
    }

    /// An unscaled reading, for [`MonoClock::nanos_between`].
    #[inline]
    pub fn raw(&self) -> u64 {
        self.clock.raw()
    }

    /// Nanoseconds from one [`MonoClock::raw`] reading to a later one.
    #[inline]
    pub fn nanos_between(&self, start: u64, end: u64) -> u64 {
        self.clock.delta_as_nanos(start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_never_go_back_and_follow_the_system_clock() {
        let c = MonoClock::new();
        let std0 = std::time::Instant::now();
        let a = c.now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = c.now();
        let std_ns = std0.elapsed().as_nanos() as u64;
        assert!(b >= a);
        let ns = b.0 - a.0;
        // Slept 20 ms: the clock saw at least that, and not more than the
        // system clock saw around it.
        assert!(ns >= 19_000_000, "{ns} ns over a 20 ms sleep");
        assert!(
            ns <= std_ns + 1_000_000,
            "{ns} ns, the system clock {std_ns}"
        );
        let (r0, r1) = (c.raw(), c.raw());
        assert!(c.nanos_between(r0, r1) < 1_000_000_000);
    }
}
