//! The `roce` data path allocates nothing per work request in steady
//! state: 1000 rounds of Send, RDMA Write with immediate and RDMA Read
//! (each segmented into several packets, acknowledged, completed) are
//! measured on the driving thread with the counting allocator.
mod support;

use dataplane::verbs::*;
use support::alloc_counter::{measure, CountingAllocator};
use support::roce_pair::{loopback_url, pair, pattern, wait, Endpoint};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn is_send(c: &Completion) -> bool {
    !matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
}

fn round(a: &mut Endpoint, b: &mut Endpoint, key: RemoteKey, data: &[u8]) {
    b.post_recv();
    a.post(SendOp::Send, data, 0);
    assert!(wait(a, is_send).is_ok());
    assert!(wait(b, |c| !is_send(c)).is_ok());
    b.post_recv();
    a.post(SendOp::WriteWithImm(key.at(0), 1), data, 0);
    assert!(wait(a, is_send).is_ok());
    assert!(wait(b, |c| !is_send(c)).is_ok());
    a.post(SendOp::Read(key.at(0)), &[], data.len() as u32);
    let c = wait(a, is_send);
    assert!(c.is_ok());
    // Checked through a stack copy: this runs in the measured loop.
    let buf = &c.sgl.iter().next().unwrap().buf;
    let mut got = [0u8; 5000];
    assert_eq!(buf.len() as usize, data.len());
    assert!(buf.read(0, &mut got[..data.len()]) && got[..data.len()] == data[..]);
}

#[test]
fn no_heap_allocation_per_work_request() {
    let (mut a, mut b) = pair(&loopback_url("mtu=1024"), 0);
    let key = b.key();
    let data = pattern(1, 5000);
    // Warm-up: queues and hash tables reach their steady sizes.
    for _ in 0..50 {
        round(&mut a, &mut b, key, &data);
    }
    let ((), allocated) = measure(|| {
        for _ in 0..1000 {
            round(&mut a, &mut b, key, &data);
        }
    });
    assert_eq!(allocated.count, 0, "{allocated:?}");
}
