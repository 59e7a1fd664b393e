//! The device's thread drives only the shards that no thread polls
//! (docs/ROCE.md, "Who drives a device"). Its own binary: a device's
//! options (`idle_ms` here) are its first opener's, every loopback
//! endpoint of a process shares one device, and under `cargo test` a
//! test beside this one would open it with the default 1 ms, which a
//! busy machine's scheduler exceeds between two polls.
mod support;

use std::time::Instant;

use dataplane::verbs::*;
use support::roce_pair::{loopback_url, pair, pattern, TIMEOUT};

#[test]
fn the_device_thread_drives_only_the_shard_nobody_polls() {
    // A quarter-second idle threshold: a shard this test polls in a
    // tight loop never goes that long undriven, the one it never polls
    // does. (The retransmission budget, 7 x 500 ms, outlasts the first
    // wait for the device's thread.)
    let (mut a, mut b) = pair(&loopback_url("idle_ms=250&ack_timeout_ms=500"), 0);
    let data = pattern(3, 4096);
    assert!(b.rdma().write(0, &data));
    let key = b.key();
    // Reads from `b`'s memory: `b`'s responder must run, and no thread
    // polls `b`, so only the device's thread can drive it.
    // `a`'s shard is counted from its first completion on: before that,
    // while the connection was being set up, nobody polled it either, and
    // the device's thread may rightly have driven it.
    let mut a_idle_runs_polled = None;
    for _ in 0..20 {
        a.post(SendOp::Read(key.at(0)), &[], data.len() as u32);
        let deadline = Instant::now() + TIMEOUT;
        let mut out: [Completion; 1] = [Completion::default()];
        while a.poll(&mut out) == 0 {
            assert!(Instant::now() < deadline, "timed out");
            std::hint::spin_loop();
        }
        let c = std::mem::take(&mut out[0]);
        assert!(c.is_ok(), "{c:?}");
        assert_eq!(c.sgl.iter().next().unwrap().buf.to_vec(), data);
        a_idle_runs_polled.get_or_insert(a.qp.shard_stats().idle_runs);
    }
    let (sa, sb) = (a.qp.shard_stats(), b.qp.shard_stats());
    assert_eq!(sb.polled, 0, "{sb:?}");
    assert!(sb.idle_runs > 0, "{sb:?}");
    assert!(sa.polled > 0, "{sa:?}");
    // Nineteen Reads while this thread polled `a` in a tight loop: the
    // device's thread never drove it.
    assert_eq!(Some(sa.idle_runs), a_idle_runs_polled, "{sa:?}");
    // A completion queue reports the same shard.
    let cq_view = a.cq.shard_stats();
    assert_eq!(cq_view.len(), 1);
    assert!(cq_view[0].polled >= sa.polled);
}
