//! Warnings that may repeat fast (an accept loop failing for want of
//! descriptors) written at most once a second, each with the count of the
//! ones held back since the previous line: the log says what happens and
//! how often without growing with it.

use std::time::{Duration, Instant};

/// How long repeats are held back after a line.
const EVERY: Duration = Duration::from_secs(1);

/// One kind of warning, owned by the thread that may repeat it.
#[derive(Debug, Default)]
pub struct Warnings {
    last: Option<Instant>,
    held: u64,
}

impl Warnings {
    /// Writes `line()` as a warning unless one was written in the last
    /// second (then counts it); returns whether it was written.
    pub fn warn(&mut self, now: Instant, line: impl FnOnce() -> String) -> bool {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < EVERY)
        {
            self.held += 1;
            return false;
        }
        match std::mem::take(&mut self.held) {
            0 => tracing::warn!("{}", line()),
            n => tracing::warn!("{} ({n} more like it since the last line)", line()),
        }
        self.last = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_writes_one_line_a_second() {
        let mut w = Warnings::default();
        let t0 = Instant::now();
        let written = (0..500u64)
            .filter(|i| w.warn(t0 + Duration::from_millis(i * 5), || "x".into()))
            .count();
        // 2.5 s of repeats: lines at 0, 1 and 2 s.
        assert_eq!(written, 3);
        assert_eq!(w.held, 99);
    }
}
