//! Bytes read through `read` are the bytes SOURCE produced: every reply of
//! a checked READ run hashes (FNV-1a 64) to the hash of the SOURCE pattern
//! computed here, at sizes around each threshold a transport may switch
//! at: the 1 KiB and 4 KiB inline limits (of the data, and of a whole
//! RPC-over-RDMA reply: 4096 bytes less the headers), the 64 KiB chunk
//! boundary, and 1 MiB. ECHO is checked the same way at the inline
//! thresholds.
//!
//! The same test runs for every transport in [`TRANSPORTS`] (the RDMA and
//! TCP ones with their embedded servers).

use std::time::Duration;

use bench::tirpc::TirpcError;
use bench::transport::{self, BenchError, Op, OpenOptions, RunSpec};

/// `--connect` URLs under test.
const TRANSPORTS: &[&str] = &["inproc", "shm", "tcp", "roce", "tirpc"];

const READ_SIZES: &[u32] = &[
    1,
    1023,
    1024,
    1025,
    4036,
    4040,
    4044,
    4095,
    4096,
    4097,
    65532,
    65536,
    65540,
    1 << 20,
];

fn open(url: &str) -> Option<Box<dyn transport::Transport>> {
    match transport::open(Some(url), &OpenOptions::default()) {
        Ok(t) => Some(t),
        Err(BenchError::Tirpc(TirpcError::Unavailable(why)))
            if std::env::var("RPCRDMA_REQUIRE_PEERS").as_deref() != Ok("1") =>
        {
            println!("skipped: libtirpc not installed ({why})");
            None
        }
        Err(e) => panic!("{url}: {e}"),
    }
}

#[test]
fn read_replies_hash_to_the_source_pattern_around_every_threshold() {
    for url in TRANSPORTS {
        let Some(mut t) = open(url) else { continue };
        for &size in READ_SIZES {
            for depth in [1, 3] {
                let mut spec = RunSpec::new(Op::Read, size, depth, Duration::from_millis(30));
                spec.check = true;
                spec.warmup_calls = 2;
                let r = t
                    .run(&spec)
                    .unwrap_or_else(|e| panic!("{url} read {size} depth {depth}: {e}"));
                let c = r.check.expect("a checked run reports its check");
                assert!(c.replies > 0, "{url} {size}: no reply hashed");
                assert_eq!(
                    c.first_fnv1a64,
                    transport::pattern_hash(size),
                    "{url} read {size} depth {depth}: first reply is not the pattern"
                );
                assert_eq!(c.differing, 0, "{url} read {size} depth {depth}");
                assert!(c.ok);
                assert_eq!(r.bytes, r.calls * u64::from(size));
            }
        }
    }
}

#[test]
fn echo_replies_hash_to_the_pattern_at_the_inline_thresholds() {
    for url in TRANSPORTS {
        let Some(mut t) = open(url) else { continue };
        for size in [1023, 1024, 1025, 4000, 4036, 4040, 4044, 4095, 4096, 4097] {
            let mut spec = RunSpec::new(Op::Echo, size, 1, Duration::from_millis(30));
            spec.check = true;
            spec.warmup_calls = 2;
            let r = t
                .run(&spec)
                .unwrap_or_else(|e| panic!("{url} echo {size}: {e}"));
            let c = r.check.expect("a checked run reports its check");
            assert!(c.ok, "{url} echo {size}: {c:?}");
        }
    }
}

#[test]
fn the_check_notices_bytes_that_are_not_the_pattern() {
    let c = transport::CheckReport::new(5, transport::pattern_hash(4096) ^ 1, 0, 4096);
    assert!(!c.ok);
    let c = transport::CheckReport::new(5, transport::pattern_hash(4096), 1, 4096);
    assert!(!c.ok);
    let c = transport::CheckReport::new(0, transport::pattern_hash(0), 0, 0);
    assert!(!c.ok, "no reply is no evidence");
    assert_ne!(transport::pattern_hash(4096), transport::pattern_hash(4097));
}
