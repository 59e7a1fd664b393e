//! Loss tests for the `roce` provider: the test-only fault hook
//! (`faults=drop,dup,reorder` per mille, see docs/ROCE.md) drops,
//! duplicates and reorders data-path packets in both directions, and every
//! Send, RDMA Write and RDMA Read of up to 1 MiB still completes
//! byte-exact, through NAK/go-back-N, duplicate detection, read replay and
//! the retransmission timer.
mod support;

use dataplane::verbs::*;
use support::roce_pair::{pair, pattern, wait, Endpoint, BIG};

const SIZES: [usize; 8] = [0, 1, 1000, 1024, 4097, 65_536, 300_001, BIG];

fn is_send(c: &Completion) -> bool {
    !matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
}

fn exchange(a: &mut Endpoint, b: &mut Endpoint, rounds: u64) {
    let key = b.key();
    for round in 0..rounds {
        for (i, &len) in SIZES.iter().enumerate() {
            let seed = round * 100 + i as u64;
            // Send, alternating with Send-with-immediate.
            b.post_recv();
            let op = if i % 2 == 0 {
                SendOp::Send
            } else {
                SendOp::SendWithImm(seed as u32)
            };
            a.post(op, &pattern(seed, len), 0);
            let c = wait(a, is_send);
            assert_eq!(c.status, WcStatus::Success, "send {len}");
            let c = wait(b, |c| !is_send(c));
            assert_eq!(c.status, WcStatus::Success);
            assert_eq!(c.byte_len as usize, len);
            let got = c.sgl.iter().next().unwrap().buf.to_vec();
            assert!(got == pattern(seed, len)[..], "send bytes {len}");
            drop(c);

            // RDMA Write with immediate for odd sizes, plain Write else.
            let data = pattern(seed + 10_000, len);
            if i % 2 == 1 {
                b.post_recv();
                a.post(SendOp::WriteWithImm(key.at(0), 7), &data, 0);
            } else {
                a.post(SendOp::Write(key.at(0)), &data, 0);
            }
            let c = wait(a, is_send);
            assert_eq!(c.status, WcStatus::Success, "write {len}");
            if i % 2 == 1 {
                let c = wait(b, |c| c.opcode == WcOpcode::RecvRdmaWithImm);
                assert_eq!(c.byte_len as usize, len);
            }
            let mut landed = vec![0u8; len];
            assert!(b.rdma().read(0, &mut landed));
            assert!(landed == data, "write bytes {len}");

            // RDMA Read.
            let data = pattern(seed + 20_000, len);
            assert!(b.rdma().write(0, &data));
            a.post(SendOp::Read(key.at(0)), &[], len as u32);
            let c = wait(a, is_send);
            assert_eq!(c.status, WcStatus::Success, "read {len}");
            assert_eq!(c.opcode, WcOpcode::RdmaRead);
            assert_eq!(c.byte_len as usize, len);
            let got = c.sgl.iter().next().unwrap().buf.to_vec();
            assert!(got == data[..], "read bytes {len}");
        }
    }
}

fn run(faults: &str) -> ([u64; 3], [u64; 3]) {
    run_mtu(faults, 1024)
}

fn run_mtu(faults: &str, mtu: u32) -> ([u64; 3], [u64; 3]) {
    let url = support::roce_pair::loopback_url(&format!(
        "faults={faults}&ack_timeout_ms=10&verify_icrc=1&mtu={mtu}"
    ));
    let (mut a, mut b) = pair(&url, 0);
    exchange(&mut a, &mut b, 2);
    // And the other way round (the responder of before now requests).
    exchange(&mut b, &mut a, 1);
    assert_eq!(a.qp.state(), QpState::Rts);
    assert_eq!(b.qp.state(), QpState::Rts);
    assert_eq!(a.qp.bad_icrc_count(), 0);
    (a.qp.fault_counts(), b.qp.fault_counts())
}

#[test]
fn one_percent_each_fault() {
    let (fa, fb) = run("10,10,10,1");
    for k in 0..3 {
        assert!(
            fa[k] + fb[k] > 0,
            "fault kind {k} never happened: {fa:?} {fb:?}"
        );
    }
}

#[test]
fn five_percent_drop_two_percent_dup_and_reorder() {
    let (fa, fb) = run("50,20,20,2");
    for k in 0..3 {
        assert!(
            fa[k] + fb[k] > 0,
            "fault kind {k} never happened: {fa:?} {fb:?}"
        );
    }
}

#[test]
fn smallest_and_largest_path_mtu_under_loss() {
    for mtu in [256, 4096] {
        let (fa, fb) = run_mtu("20,10,10,3", mtu);
        assert!(fa[0] + fb[0] > 0, "mtu {mtu}: nothing dropped");
    }
}

/// A lost last packet has nothing after it to make the responder NAK: it
/// is recovered by the requester's tail probe (its last packet sent again
/// after a few milliseconds of silence), not by the retransmission
/// timeout. One-packet Sends make every drop a tail drop; the ACK timeout
/// is set far beyond what the probes need, so any timeout shows up in the
/// counts (a timeout needs four probes in a row lost, or their answers:
/// about (6 %)^4 per lost tail at 3 % drop each way).
#[test]
fn a_dropped_tail_is_recovered_by_a_probe_not_the_ack_timeout() {
    let url = support::roce_pair::loopback_url(
        "faults=30,0,0,5&ack_timeout_ms=5000&verify_icrc=1&mtu=1024",
    );
    let (mut a, mut b) = pair(&url, 0);
    for i in 0..200u64 {
        b.post_recv();
        a.post(SendOp::Send, &pattern(i, 100), 0);
        let c = wait(&a, is_send);
        assert_eq!(c.status, WcStatus::Success, "send {i}");
        let c = wait(&b, |c| !is_send(c));
        assert_eq!(c.status, WcStatus::Success);
        assert!(c.sgl.iter().next().unwrap().buf.to_vec() == pattern(i, 100));
    }
    let (fa, fb) = (a.qp.fault_counts(), b.qp.fault_counts());
    assert!(fa[0] > 0 && fb[0] > 0, "nothing dropped: {fa:?} {fb:?}");
    let r = a.qp.recovery_counts();
    assert!(r.tail_probes > 0, "no tail probe: {r:?}");
    assert_eq!(r.timeouts, 0, "a tail waited for the ACK timeout: {r:?}");
    assert_eq!(b.qp.recovery_counts().timeouts, 0);
    assert_eq!(a.qp.state(), QpState::Rts);
}
