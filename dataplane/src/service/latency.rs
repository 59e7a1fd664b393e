//! Latency histograms per program, version and procedure, recorded by a
//! worker as it dispatches calls and merged by whoever reads them (the
//! daemon's metrics scrape).
//!
//! Each worker owns one [`LatencyTable`] and is its only writer: a record
//! is a bucket search over a fixed array and two relaxed load/store
//! pairs, with no lock, no locked instruction and no allocation, so the
//! hot path pays a few nanoseconds and never contends. Readers on other
//! threads load the same atomics; a scrape that races a record may see
//! the bucket before the sum, which a histogram tolerates (both only
//! grow).
//!
//! The table is sized when the worker starts, from the programs its
//! dispatcher serves: a call of another program (answered PROG_UNAVAIL)
//! is not recorded, and procedures past [`MAX_PROCEDURE`] share one
//! `other` row, so a peer cannot grow the table or the label set.
//!
//! [`Timed`] is the dispatcher a worker runs: it reads the clock around
//! the inner dispatch and records the time under the call's program,
//! version and procedure.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::{Dispatch, Dispatcher, KnownCall};

/// Upper bounds of the buckets, nanoseconds: 1 µs to 1 s in 1-2-5 steps
/// (a NULL call answered from memory takes about a microsecond; a gateway
/// backend's reply, measured elsewhere, up to seconds).
pub const BOUNDS_NS: [u64; 19] = [
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    50_000_000,
    100_000_000,
    200_000_000,
    500_000_000,
    1_000_000_000,
];

/// Procedures recorded one by one (0..=MAX_PROCEDURE); higher numbers
/// share the row after them. NFSv3 has 22, NLM 24, MOUNT 6.
pub const MAX_PROCEDURE: u32 = 63;

/// Rows per program and version: one per procedure and the `other` row.
const ROWS: usize = MAX_PROCEDURE as usize + 2;

/// One histogram: a count per bucket (the last one past every bound) and
/// the sum of the values. Written by one thread only.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BOUNDS_NS.len() + 1],
    sum_ns: AtomicU64,
}

/// The single writer's increment: a relaxed load and store, no locked
/// instruction (another writer would lose counts; there is none).
#[inline]
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
}

impl Histogram {
    /// Records one value. Only the owning thread may call it.
    #[inline]
    pub fn record(&self, ns: u64) {
        let i = BOUNDS_NS.partition_point(|&b| b < ns);
        bump(&self.buckets[i], 1);
        bump(&self.sum_ns, ns);
    }

    /// Values per bucket (not cumulative; one more than [`BOUNDS_NS`]).
    pub fn buckets(&self) -> [u64; BOUNDS_NS.len() + 1] {
        core::array::from_fn(|i| self.buckets[i].load(Relaxed))
    }

    /// Sum of the values recorded, nanoseconds.
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns.load(Relaxed)
    }
}

/// A worker's histograms, one per (program, version, procedure row).
#[derive(Debug)]
pub struct LatencyTable {
    programs: Box<[(u32, u32)]>,
    rows: Box<[Histogram]>,
}

/// One histogram of a [`LatencyTable`] as a reader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencySample {
    /// Program number.
    pub program: u32,
    /// Program version.
    pub version: u32,
    /// Procedure number; `None` for the row of procedures past
    /// [`MAX_PROCEDURE`].
    pub procedure: Option<u32>,
    /// Calls per bucket (not cumulative).
    pub buckets: [u64; BOUNDS_NS.len() + 1],
    /// Sum of their latencies, nanoseconds.
    pub sum_ns: u64,
}

impl LatencyTable {
    /// A table for these (program, version) pairs, every count zero.
    pub fn new(programs: &[(u32, u32)]) -> LatencyTable {
        let mut p = programs.to_vec();
        p.sort_unstable();
        p.dedup();
        LatencyTable {
            rows: (0..p.len() * ROWS).map(|_| Histogram::default()).collect(),
            programs: p.into_boxed_slice(),
        }
    }

    /// The histogram of a call, if its program and version are in the
    /// table.
    #[inline]
    pub fn histogram(&self, program: u32, version: u32, procedure: u32) -> Option<&Histogram> {
        // A handful of programs: a linear scan beats hashing.
        let p = self
            .programs
            .iter()
            .position(|&k| k == (program, version))?;
        let row = procedure.min(MAX_PROCEDURE + 1) as usize;
        self.rows.get(p * ROWS + row)
    }

    /// Records a call's latency. Only the owning worker may call it.
    #[inline]
    pub fn record(&self, program: u32, version: u32, procedure: u32, ns: u64) {
        if let Some(h) = self.histogram(program, version, procedure) {
            h.record(ns);
        }
    }

    /// Every histogram with at least one call.
    pub fn samples(&self) -> Vec<LatencySample> {
        let mut out = Vec::new();
        for (p, &(program, version)) in self.programs.iter().enumerate() {
            for row in 0..ROWS {
                let h = &self.rows[p * ROWS + row];
                let buckets = h.buckets();
                if buckets.iter().all(|&n| n == 0) {
                    continue;
                }
                out.push(LatencySample {
                    program,
                    version,
                    procedure: (row <= MAX_PROCEDURE as usize).then_some(row as u32),
                    buckets,
                    sum_ns: h.sum_ns(),
                });
            }
        }
        out
    }
}

/// Program, version and procedure of an RPC call message (RFC 5531:
/// xid, direction, rpcvers, prog, vers, proc lead every call).
#[inline]
pub fn peek_procedure(call: &[u8]) -> Option<(u32, u32, u32)> {
    let word = |i: usize| -> Option<u32> {
        let b = call.get(i..i + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    Some((word(12)?, word(16)?, word(20)?))
}

/// A worker's dispatcher: the shared one, timed into the worker's own
/// [`LatencyTable`].
pub struct Timed {
    inner: Arc<dyn Dispatcher>,
    table: Arc<LatencyTable>,
    clock: crate::clock::MonoClock,
}

impl core::fmt::Debug for Timed {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Timed").field("table", &self.table).finish()
    }
}

impl Timed {
    /// Times `inner` into `table` (the worker's own).
    pub fn new(inner: Arc<dyn Dispatcher>, table: Arc<LatencyTable>) -> Timed {
        Timed {
            inner,
            table,
            clock: crate::clock::MonoClock::new(),
        }
    }
}

impl Timed {
    /// Runs `dispatch` and records its time under the procedure
    /// `procedure` names when it answered.
    #[inline]
    fn timed(
        &self,
        dispatch: impl FnOnce() -> Dispatch,
        procedure: impl FnOnce() -> Option<(u32, u32, u32)>,
    ) -> Dispatch {
        let start = self.clock.raw();
        let d = dispatch();
        if matches!(d, Dispatch::Reply { .. }) {
            if let Some((program, version, procedure)) = procedure() {
                let ns = self.clock.nanos_between(start, self.clock.raw());
                self.table.record(program, version, procedure, ns);
            }
        }
        d
    }
}

impl Dispatcher for Timed {
    #[inline]
    fn dispatch(&self, call: &[u8], reply: &mut [u8]) -> Dispatch {
        self.timed(|| self.inner.dispatch(call, reply), || peek_procedure(call))
    }

    /// As `dispatch`, with the procedure taken from `known` instead of
    /// peeked.
    #[inline]
    fn dispatch_known(&self, call: &[u8], known: &KnownCall, reply: &mut [u8]) -> Dispatch {
        self.timed(
            || self.inner.dispatch_known(call, known, reply),
            || Some((known.program, known.version, known.procedure)),
        )
    }

    fn programs(&self) -> Vec<(u32, u32)> {
        self.inner.programs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_first_bucket_whose_bound_holds_them() {
        let h = Histogram::default();
        for ns in [0, 1_000, 1_001, 999_999_999, 1_000_000_000, 5_000_000_000] {
            h.record(ns);
        }
        let b = h.buckets();
        assert_eq!(b[0], 2, "0 and 1 µs are <= 1 µs");
        assert_eq!(b[1], 1, "1.001 µs");
        assert_eq!(b[BOUNDS_NS.len() - 1], 2, "up to 1 s");
        assert_eq!(b[BOUNDS_NS.len()], 1, "past every bound");
        assert_eq!(
            h.sum_ns(),
            1_000 + 1_001 + 999_999_999 + 1_000_000_000 + 5_000_000_000
        );
    }

    #[test]
    fn unknown_programs_are_not_recorded_and_high_procedures_share_a_row() {
        let t = LatencyTable::new(&[(100_003, 3), (100_003, 3), (7, 1)]);
        t.record(100_003, 3, 6, 3_000);
        t.record(100_003, 3, 64, 3_000);
        t.record(100_003, 3, 1_000_000, 3_000);
        t.record(100_003, 4, 6, 3_000);
        t.record(9, 1, 0, 3_000);
        let s = t.samples();
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[0].procedure, Some(6));
        assert_eq!(s[1].procedure, None);
        assert_eq!(s[1].buckets.iter().sum::<u64>(), 2);
    }

    #[test]
    fn the_call_header_gives_program_version_and_procedure() {
        let mut call = Vec::new();
        for w in [9u32, 0, 2, 100_003, 3, 6] {
            call.extend_from_slice(&w.to_be_bytes());
        }
        assert_eq!(peek_procedure(&call), Some((100_003, 3, 6)));
        assert_eq!(peek_procedure(&call[..20]), None);
    }
}
