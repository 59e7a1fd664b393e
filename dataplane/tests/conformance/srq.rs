//! Shared receive queues: one scenario, generic over the provider, with
//! two requesters (threads) connected to one listener whose queue pairs
//! both take their receives from one shared receive queue.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use dataplane::mem::{Arena, Slab, WrKind};
use dataplane::verbs::*;

use super::{unique_url, Backoff, TIMEOUT};

const MSG: u32 = 4096;
const BUFS: u32 = 8;

/// What the listener tells a requester thread.
enum Order {
    /// Send these messages, in order, and report when they completed.
    Send(Vec<Vec<u8>>),
    /// Disconnect and end.
    Quit,
}

/// A requester on its own thread: connects, then sends what it is told.
fn requester<P: Provider>(url: String, orders: mpsc::Receiver<Order>, done: mpsc::Sender<()>) {
    let ctx = P::open(&url).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let arena = Arena::new((MSG * BUFS) as usize).unwrap();
    let mr = pd
        .register(&arena, 0, (MSG * BUFS) as usize, Access::LOCAL_WRITE)
        .unwrap();
    let slab = Slab::new(arena, 0, MSG, BUFS, mr.lkey(), WrKind::Send).unwrap();
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 1,
        // The listener's shared queue starts empty: wait for it forever.
        rnr_retry: 7,
        rnr_timer: Duration::from_millis(1),
        ..QpCaps::default()
    };
    let pqp = pd.create_qp(&cq, &cq, caps).unwrap();
    let (mut qp, _) = pqp.connect(&url, b"srq", TIMEOUT).unwrap();
    done.send(()).unwrap();
    let mut out: [Completion; 16] = std::array::from_fn(|_| Completion::default());
    while let Ok(Order::Send(msgs)) = orders.recv() {
        for m in &msgs {
            let mut buf = slab.alloc().unwrap();
            assert!(buf.fill(m));
            qp.post_send(SendWr::new(
                buf.wr_id(),
                SendOp::Send,
                SgeList::one(Sge::data(buf)),
            ))
            .unwrap();
        }
        let (mut left, deadline, mut b) = (msgs.len(), Instant::now() + TIMEOUT, Backoff::new());
        while left > 0 {
            let n = cq.poll(&mut out);
            for c in out.iter_mut().take(n) {
                assert_eq!(c.status, WcStatus::Success, "a send failed");
                left -= 1;
                drop(std::mem::take(c));
            }
            if n == 0 {
                assert!(Instant::now() < deadline, "sends never completed");
                b.wait();
            }
        }
        done.send(()).unwrap();
    }
    qp.disconnect();
    drop(qp);
    assert_eq!(slab.available(), slab.total(), "send buffers leaked");
}

/// Two queue pairs on one shared receive queue:
/// * a message that arrives while the queue is empty waits (the sender
///   sees receiver-not-ready and retries), and is delivered once
///   receives are posted;
/// * each message takes a posted shared receive and completes with the
///   number of the queue pair it arrived on, its bytes intact, in order
///   per queue pair;
/// * a queue pair on it refuses receives of its own;
/// * one queue pair's disconnect flushes nothing from the shared queue
///   (the software providers tell it with one bufferless completion):
///   the other's messages still land in the receives posted before;
/// * every buffer comes back.
pub fn two_connections_share_one_queue<P: Provider>() {
    let url = unique_url(P::SCHEME);
    let ctx = P::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).unwrap();
    let srq = pd
        .create_srq(SrqCaps {
            max_wr: BUFS,
            max_message: MSG,
            staging_slots: 2,
        })
        .unwrap();
    let arena = Arena::new((MSG * BUFS) as usize).unwrap();
    let mr = pd
        .register(&arena, 0, (MSG * BUFS) as usize, Access::LOCAL_WRITE)
        .unwrap();
    let slab = Slab::new(arena, 0, MSG, BUFS, mr.lkey(), WrKind::Recv).unwrap();

    // Two requesters, each accepted onto a queue pair of the shared queue.
    let mut qps = Vec::new();
    let mut threads = Vec::new();
    let (done_tx, done) = mpsc::channel();
    let mut orders = Vec::new();
    for _ in 0..2 {
        let (otx, orx) = mpsc::channel();
        let (u, d) = (url.clone(), done_tx.clone());
        threads.push(std::thread::spawn(move || requester::<P>(u, orx, d)));
        let inc = listener.accept(TIMEOUT).unwrap();
        let caps = QpCaps {
            max_recv_wr: 2,
            ..QpCaps::default()
        };
        let pqp = pd.create_qp_on_srq(&cq, &cq, &srq, caps).unwrap();
        let qp = inc.accept(pqp, b"ok").unwrap();
        done.recv_timeout(TIMEOUT).expect("requester connected");
        orders.push(otx);
        qps.push(qp);
    }
    let qpn = [qps[0].qp_num(), qps[1].qp_num()];

    // Its own receives are refused.
    let buf = slab.alloc().unwrap();
    let refused = qps[0]
        .post_recv(RecvWr {
            wr_id: buf.wr_id(),
            sgl: SgeList::one(Sge::whole(buf)),
        })
        .unwrap_err();
    assert_eq!(refused.error, PostError::Invalid);
    drop(refused);

    let post = |n: usize| {
        for _ in 0..n {
            let buf = slab.alloc().unwrap();
            srq.post_recv(RecvWr {
                wr_id: buf.wr_id(),
                sgl: SgeList::one(Sge::whole(buf)),
            })
            .unwrap();
        }
    };
    let mut out: [Completion; 16] = std::array::from_fn(|_| Completion::default());
    let recv = |want: usize| -> Vec<(u32, Vec<u8>)> {
        let mut out: [Completion; 16] = std::array::from_fn(|_| Completion::default());
        let (mut got, deadline, mut b) = (Vec::new(), Instant::now() + TIMEOUT, Backoff::new());
        while got.len() < want {
            let n = cq.poll(&mut out);
            for c in out.iter_mut().take(n) {
                let mut c = std::mem::take(c);
                assert_eq!(c.status, WcStatus::Success);
                assert_eq!(c.opcode, WcOpcode::Recv);
                let buf = c.sgl.take_first().unwrap();
                assert_eq!(buf.wr_id(), c.wr_id);
                assert_eq!(buf.len(), c.byte_len);
                got.push((c.qp_num, buf.to_vec()));
            }
            if n == 0 {
                assert!(Instant::now() < deadline, "receives never completed");
                b.wait();
            }
        }
        got
    };

    // A message to an empty shared queue waits for a receive.
    orders[0]
        .send(Order::Send(vec![b"first".to_vec()]))
        .unwrap();
    // Nothing can complete without a posted receive, however long the
    // listener polls (a few polls: a count, not a time, is the check).
    let mut b = Backoff::new();
    for _ in 0..50 {
        assert_eq!(cq.poll(&mut out), 0, "a receive completed with none posted");
        b.wait();
    }
    assert_eq!(srq.posted(), 0);
    post(4);
    let got = recv(1);
    assert_eq!(got, vec![(qpn[0], b"first".to_vec())]);
    done.recv_timeout(TIMEOUT).expect("first send completed");
    assert_eq!(srq.posted(), 3);

    // Both queue pairs draw from it; order holds per queue pair.
    orders[1]
        .send(Order::Send(vec![b"b1".to_vec(), vec![7u8; MSG as usize]]))
        .unwrap();
    orders[0].send(Order::Send(vec![b"a2".to_vec()])).unwrap();
    let got = recv(3);
    let from = |q: u32| -> Vec<Vec<u8>> {
        got.iter()
            .filter(|(n, _)| *n == q)
            .map(|(_, m)| m.clone())
            .collect()
    };
    assert_eq!(from(qpn[0]), vec![b"a2".to_vec()]);
    assert_eq!(from(qpn[1]), vec![b"b1".to_vec(), vec![7u8; MSG as usize]]);
    for _ in 0..2 {
        done.recv_timeout(TIMEOUT).expect("sends completed");
    }
    assert_eq!(srq.posted(), 0);

    // The first requester leaves; the shared queue keeps its receives.
    post(2);
    orders[0].send(Order::Quit).unwrap();
    threads.remove(0).join().expect("requester 0");
    // Its failure shows on the receive side: one bufferless flush of its
    // own on the software providers (no receive of its own could flush),
    // its state on all.
    let deadline = Instant::now() + TIMEOUT;
    let mut b = Backoff::new();
    let mut failed_seen = 0;
    let announced = P::SCHEME != "ibverbs";
    while qps[0].state() != QpState::Error || (announced && failed_seen == 0) {
        // Polling drives the software providers' progress.
        let n = cq.poll(&mut out);
        for c in out.iter_mut().take(n) {
            let c = std::mem::take(c);
            assert_eq!(
                (c.status, c.wr_id, c.qp_num, c.sgl.len()),
                (WcStatus::WrFlushErr, Default::default(), qpn[0], 0),
                "only the failure of the queue pair whose peer left"
            );
            failed_seen += 1;
        }
        assert!(
            Instant::now() < deadline,
            "the peer's disconnect never seen"
        );
        b.wait();
    }
    assert!(failed_seen <= 1, "the failure is told once");
    drop(qps.remove(0));
    assert_eq!(srq.posted(), 2);
    orders[1]
        .send(Order::Send(vec![b"b3".to_vec(), b"b4".to_vec()]))
        .unwrap();
    let got = recv(2);
    assert_eq!(
        got,
        vec![(qpn[1], b"b3".to_vec()), (qpn[1], b"b4".to_vec())]
    );
    done.recv_timeout(TIMEOUT).expect("last sends completed");
    orders[1].send(Order::Quit).unwrap();
    threads.remove(0).join().expect("requester 1");
    drop(qps);
    drop(srq);
    assert_eq!(slab.available(), slab.total(), "receive buffers leaked");
}
