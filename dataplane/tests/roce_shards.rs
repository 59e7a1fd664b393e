//! A `roce` device's queue pairs live in shards, one per completion
//! queue: the data path takes only its shard's lock, packets another
//! shard receives are handed over (docs/ROCE.md, "Who drives a
//! device"). The device's thread is tested in `roce_device_thread.rs`:
//! the device, whose options are its first opener's, is a process's.
mod support;

use std::time::Instant;

use dataplane::verbs::roce::RoceShardStats;
use dataplane::verbs::*;
use support::roce_pair::{loopback_url, pair, pattern, Endpoint, TIMEOUT};

fn is_send(c: &Completion) -> bool {
    !matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
}

/// Polls `me` and `other` in turn (one thread drives both shards of a
/// pair) until `me` has a completion; returns it.
fn wait_driving_both(me: &Endpoint, other: &Endpoint) -> Completion {
    let deadline = Instant::now() + TIMEOUT;
    let mut out: [Completion; 1] = [Completion::default()];
    loop {
        if me.poll(&mut out) == 1 {
            return std::mem::take(&mut out[0]);
        }
        other.poll(&mut []);
        assert!(Instant::now() < deadline, "timed out");
        std::hint::spin_loop();
    }
}

/// One Send, one Write with immediate and one Read from `a` to `b`, each
/// checked.
fn round(a: &mut Endpoint, b: &mut Endpoint, key: RemoteKey, data: &[u8]) {
    b.post_recv();
    a.post(SendOp::Send, data, 0);
    assert!(is_send(&wait_driving_both(a, b)));
    let c = wait_driving_both(b, a);
    assert!(c.is_ok() && c.opcode == WcOpcode::Recv, "{c:?}");
    b.post_recv();
    a.post(SendOp::WriteWithImm(key.at(0), 7), data, 0);
    assert!(wait_driving_both(a, b).is_ok());
    let c = wait_driving_both(b, a);
    assert!(c.is_ok() && c.opcode == WcOpcode::RecvRdmaWithImm, "{c:?}");
    a.post(SendOp::Read(key.at(0)), &[], data.len() as u32);
    let c = wait_driving_both(a, b);
    assert!(c.is_ok(), "{c:?}");
    let buf = &c.sgl.iter().next().unwrap().buf;
    assert_eq!(buf.to_vec(), data);
}

fn sum(stats: &[RoceShardStats], f: impl Fn(&RoceShardStats) -> u64) -> u64 {
    stats.iter().map(f).sum()
}

#[test]
fn two_threads_drive_their_shards_without_the_control_lock() {
    // Two connections on one device (same local address), each end with
    // its own completion queue: four shards, two threads.
    let (mut a1, mut b1) = pair(&loopback_url("mtu=1024&verify_icrc=1"), 0);
    let (mut a2, mut b2) = pair(&loopback_url("mtu=1024&verify_icrc=1"), 0);
    assert_eq!(a1.qp.local_addr(), a2.qp.local_addr());
    let shards = |eps: [&Endpoint; 4]| eps.map(|e| e.qp.shard_stats());
    let k1 = b1.key();
    let k2 = b2.key();
    let d1 = pattern(1, 5000);
    let d2 = pattern(2, 3000);
    // Warm-up: connection setup is over, queues reach their sizes.
    for _ in 0..20 {
        round(&mut a1, &mut b1, k1, &d1);
        round(&mut a2, &mut b2, k2, &d2);
    }
    let dev_before = a1.qp.device_stats();
    // All four ours: the connecting ends join the loopback device the
    // accepting ends opened, and this test is its binary's only one.
    assert_eq!(dev_before.shards, 4, "{dev_before:?}");
    let before = shards([&a1, &b1, &a2, &b2]);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..300 {
                round(&mut a1, &mut b1, k1, &d1);
            }
        });
        s.spawn(|| {
            for _ in 0..300 {
                round(&mut a2, &mut b2, k2, &d2);
            }
        });
    });
    let dev_after = a1.qp.device_stats();
    let after = shards([&a1, &b1, &a2, &b2]);
    // No poll or post took the control lock, now or during setup.
    assert_eq!(dev_after.control_locks_on_data_path, 0, "{dev_after:?}");
    // Every shard was driven by its thread, and packets one shard read
    // for another's queue pair reached it (the calls above completed
    // byte-exact; here the handoffs are counted).
    for (b, a) in before.iter().zip(&after) {
        assert!(a.polled > b.polled, "{before:?} {after:?}");
    }
    let handed_in = sum(&after, |s| s.handed_in) - sum(&before, |s| s.handed_in);
    let handed_out = sum(&after, |s| s.handed_out) - sum(&before, |s| s.handed_out);
    assert!(handed_in > 0, "{before:?} {after:?}");
    assert!(handed_out > 0, "{before:?} {after:?}");
    assert_eq!(dev_after.bad_icrc, 0);
    assert_eq!(dev_after.spoofed, 0);
}
