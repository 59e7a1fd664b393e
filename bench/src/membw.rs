//! Single-core memcpy bandwidth: the physical reference for bulk
//! throughput on this machine. Any same-host transport moves each payload
//! byte at least once (a copy into the peer's memory), so a bulk transfer
//! cannot beat one core's memcpy for long; `floor` prints it next to the
//! cross-core ping-pong.
//!
//! The buffers are larger than the last-level cache (four times it, at
//! least 64 MiB, at most 1 GiB), so the figure is DRAM bandwidth as one core sees it, not
//! cache bandwidth.

use std::time::{Duration, Instant};

use serde::Serialize;

/// Smallest buffer used, whatever the cache size.
pub const MIN_BUFFER: usize = 64 << 20;
/// Largest default buffer (two of them are allocated), whatever sysfs
/// claims (guests sometimes report the host's whole L3).
pub const MAX_BUFFER: usize = 1 << 30;

/// The largest data or unified cache of cpu0 from sysfs, in bytes.
pub fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter_map(|e| {
            let kind = std::fs::read_to_string(e.path().join("type")).ok()?;
            if kind.trim() == "Instruction" {
                return None;
            }
            parse_cache_size(&std::fs::read_to_string(e.path().join("size")).ok()?)
        })
        .max()
}

/// `"32768K"`, `"32M"`, `"512"` -> bytes.
fn parse_cache_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, unit) = match t.as_bytes().last()? {
        b'K' | b'k' => (&t[..t.len() - 1], 1 << 10),
        b'M' | b'm' => (&t[..t.len() - 1], 1 << 20),
        b'G' | b'g' => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    digits.parse::<usize>().ok()?.checked_mul(unit)
}

/// The default buffer size: four times the LLC, within
/// [`MIN_BUFFER`]..=[`MAX_BUFFER`].
pub fn default_buffer_bytes() -> usize {
    last_level_cache_bytes()
        .map_or(MIN_BUFFER, |llc| llc.saturating_mul(4))
        .clamp(MIN_BUFFER, MAX_BUFFER)
}

/// What [`measure`] (or [`measure_blocks`]) found.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MemcpyReport {
    /// Bytes per copy (each of source and destination).
    pub buffer_bytes: usize,
    /// Distinct source/destination buffer pairs copied in turn (1 for
    /// [`measure`]); the working set is `2 * blocks * buffer_bytes`.
    pub blocks: usize,
    /// The LLC size it was chosen against, if sysfs told.
    pub llc_bytes: Option<usize>,
    /// Copies timed.
    pub copies: u32,
    /// Best copy: 10^9 bytes copied per second.
    pub best_gb_per_s: f64,
    /// All copies: bytes over total time.
    pub mean_gb_per_s: f64,
    /// Whether the thread was pinned to the requested core.
    pub pinned: bool,
}

/// Copies a `buffer_bytes` buffer into another on the calling thread
/// (pinned to `core` if given) for at least `duration` and at least three
/// times, after one untimed copy that faults the pages in.
pub fn measure(buffer_bytes: usize, duration: Duration, core: Option<usize>) -> MemcpyReport {
    measure_blocks(buffer_bytes, 1, duration, core)
}

/// Like [`measure`], over `blocks` pairs of `block_bytes` buffers copied in
/// turn: one timed copy is every block once. With the block size and
/// count of a pipelined bulk transfer (e.g. 8 x 256 KiB for READ 256 KiB
/// at depth 8) this is the memcpy of the same working set, which stays in
/// the caches as the transfer's buffers do.
pub fn measure_blocks(
    block_bytes: usize,
    blocks: usize,
    duration: Duration,
    core: Option<usize>,
) -> MemcpyReport {
    let pinned =
        core.is_some_and(|c| core_affinity::set_for_current(core_affinity::CoreId { id: c }));
    let len = block_bytes.max(4096);
    let blocks = blocks.max(1);
    let mut src: Vec<Vec<u8>> = (0..blocks)
        .map(|_| {
            let mut b = vec![0u8; len];
            dataplane::service::bench::fill_pattern(&mut b);
            b
        })
        .collect();
    let mut dst: Vec<Vec<u8>> = src.to_vec();
    let (mut best, mut total, mut copies) = (f64::INFINITY, 0.0f64, 0u32);
    let start = Instant::now();
    while copies < 3 || start.elapsed() < duration {
        let t = Instant::now();
        for (d, s) in dst.iter_mut().zip(&src) {
            d.copy_from_slice(s);
        }
        std::hint::black_box(&mut dst);
        let s = t.elapsed().as_secs_f64();
        best = best.min(s);
        total += s;
        copies += 1;
        // Vary the source so no copy can be skipped as redundant.
        for b in &mut src {
            b[copies as usize % len] ^= 1;
        }
    }
    let bytes = (len * blocks) as f64;
    MemcpyReport {
        buffer_bytes: len,
        blocks,
        llc_bytes: last_level_cache_bytes(),
        copies,
        best_gb_per_s: bytes / best.max(1e-12) / 1e9,
        mean_gb_per_s: bytes * f64::from(copies) / total.max(1e-12) / 1e9,
        pinned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse() {
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("8M"), Some(8 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size(""), None);
    }

    #[test]
    fn a_small_copy_reports_positive_bandwidth() {
        let r = measure(1 << 20, Duration::ZERO, None);
        assert!(r.copies >= 3);
        assert!(r.best_gb_per_s > 0.0 && r.mean_gb_per_s > 0.0);
        assert!(r.best_gb_per_s >= r.mean_gb_per_s);
        assert!(default_buffer_bytes() >= MIN_BUFFER);
        let w = measure_blocks(64 << 10, 4, Duration::ZERO, None);
        assert_eq!((w.buffer_bytes, w.blocks), (64 << 10, 4));
        assert!(w.copies >= 3 && w.best_gb_per_s >= w.mean_gb_per_s && w.mean_gb_per_s > 0.0);
    }
}
