//! Regression test of a `roce` provider bug found by the daemon tests
//! (fixed by remembering held requests in the CM state).
//!
//! `Listener::accept` takes the REQ out of the listener's queue, and the
//! connection record only appears when `Incoming::accept` sends the REP.
//! A REQ the active side retransmits in between (every 500 ms) matches
//! neither, so it is queued as a new request and the application accepts
//! the same client twice. The daemon does exactly that when building the
//! endpoint takes longer than 500 ms (seen in `control/tests/serve.rs`
//! under a loaded `cargo test --workspace`: two connections accepted for
//! one client). Expected: the repeated REQ gets an MRA (or nothing), never
//! a second `Incoming`.
mod support;

use std::time::Duration;

use dataplane::verbs::roce::Roce;
use dataplane::verbs::*;
use support::roce_pair::{loopback_url, TIMEOUT};

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_inline: 64,
        rnr_retry: 7,
        rnr_timer: Duration::from_millis(1),
    }
}

#[test]
fn req_retransmitted_while_accepting_is_not_a_second_request() {
    let url = loopback_url("");
    let ctx = Roce::open(&url).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let url2 = url.clone();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let client = std::thread::spawn(move || {
        let ctx = Roce::open(&url2).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let pqp = pd.create_qp(&cq, &cq, caps()).unwrap();
        let (qp, _) = pqp.connect(&url2, b"client", TIMEOUT).unwrap();
        // Keep the connection up until the server side has looked.
        let _ = done_rx.recv_timeout(TIMEOUT);
        drop(qp);
    });
    let incoming = listener.accept(TIMEOUT).unwrap();
    // An application building its endpoint slowly: the active side
    // retransmits its REQ (500 ms) while we hold the Incoming.
    std::thread::sleep(Duration::from_millis(1600));
    let pqp = pd.create_qp(&cq, &cq, caps()).unwrap();
    let _qp = incoming.accept(pqp, b"server").unwrap();
    let second = listener.accept(Duration::from_secs(2));
    let _ = done_tx.send(());
    client.join().unwrap();
    assert!(
        second.is_err(),
        "the retransmitted REQ was queued as a second connection request"
    );
}
