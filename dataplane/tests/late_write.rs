//! A late RDMA Write, end to end through the engine on a real provider
//! (`shm`, `roce`): a client's call offers a write chunk and times out
//! while the server is still working on it; the timeout invalidates every
//! key the call advertised, so when the server finally writes its result
//! the provider refuses the Write (remote access error, the server's
//! connection fails) and not one byte of the client's memory changes.
//!
//! The server is held by a gate in its dispatcher that the test opens
//! only after the client has seen the timeout: the order of events is
//! forced, not raced.

mod support;

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use dataplane::client::{CallOutcome, Client, ReplyTarget};
use dataplane::engine::{BufClass, BufId, CallFailure};
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;
use dataplane::worker::{Dispatched, Dispatcher, PoolProvider};
use support::worker_harness::*;

/// Deadline meaning "broken", not "slow".
const BROKEN: Duration = Duration::from_secs(30);

/// The bench service behind a gate: a call waits in the dispatcher until
/// the test opens the gate.
struct Gate {
    inner: Arc<dyn Dispatcher>,
    state: Mutex<(bool, bool)>,
    changed: Condvar,
}

impl Gate {
    fn new() -> Arc<Gate> {
        Arc::new(Gate {
            inner: bench_service(),
            state: Mutex::new((false, false)),
            changed: Condvar::new(),
        })
    }
    fn arrived(&self) -> bool {
        self.state.lock().unwrap().0
    }
    fn open(&self) {
        self.state.lock().unwrap().1 = true;
        self.changed.notify_all();
    }
}

impl Dispatcher for Gate {
    fn dispatch(&self, call: &[u8], reply: &mut [u8]) -> Dispatched {
        let mut s = self.state.lock().unwrap();
        s.0 = true;
        self.changed.notify_all();
        // Bounded: a broken test must not hang the worker forever.
        let (s, _) = self
            .changed
            .wait_timeout_while(s, BROKEN, |s| !s.1)
            .unwrap();
        drop(s);
        self.inner.dispatch(call, reply)
    }
}

/// The client's reply and write-chunk buffers, copied out.
fn client_targets<P: PoolProvider>(client: &Client<P>) -> Vec<Vec<u8>> {
    let t = client.endpoint().connection().buffers();
    (0..t.count() as u32)
        .map(BufId)
        .filter(|&b| matches!(t.class(b), Some(BufClass::Ddp | BufClass::Reply)))
        .map(|b| t.peer_bytes(b, 0, t.buf_len(b) as usize).unwrap().to_vec())
        .collect()
}

fn late_write_is_refused<P: PoolProvider>(url: String) {
    let gate = Gate::new();
    let server = Server::<P>::at(
        url.clone(),
        1,
        engine_config(64 << 10, 4),
        gate.clone(),
        |_| {},
    );
    let mut engine = engine_config(64 << 10, 4);
    engine.call_timeout = Some(Duration::from_millis(200));
    let mut client = Client::<P>::connect(&url, client_config(engine)).unwrap();
    let data = pattern(32 << 10, 7);
    let call = client
        .call(ReplyTarget::WriteChunk { max_ddp: 64 << 10 }, |xid, buf| {
            encode_call(xid, ECHO, Arg::Opaque(&data, true), buf)
        })
        .unwrap();
    let t0 = Instant::now();
    while !gate.arrived() {
        assert!(t0.elapsed() < BROKEN, "the call never reached the server");
        client.progress();
        std::thread::yield_now();
    }
    match client.wait(call).unwrap() {
        CallOutcome::Failed(CallFailure::Timeout) => {}
        other => panic!("expected the call to time out, got {other:?}"),
    }
    let before = client_targets(&client);
    let errors_before = server.pool().set().counters()[0].errors_completion.get();
    gate.open();
    // The server writes its result into the invalidated write chunk: the
    // provider refuses it, the server's queue pair fails and with it the
    // connection.
    // The worker folds its counters into the shared ones as it goes:
    // wait for both events.
    let refused = || server.pool().set().counters()[0].errors_completion.get() > errors_before;
    let t0 = Instant::now();
    while client.endpoint().close_reason().is_none() || !refused() {
        assert!(
            t0.elapsed() < BROKEN,
            "no refused Write and closed connection: closed {:?}, server errors {}",
            client.endpoint().close_reason(),
            refused()
        );
        client.progress();
        std::thread::yield_now();
    }
    assert!(
        client_targets(&client) == before,
        "a byte of the client changed"
    );
    drop(client);
    assert_clean(&server.stop(Duration::from_secs(5)));
}

#[test]
fn shm_a_late_write_after_a_timeout_fails_at_the_provider_and_changes_no_byte() {
    late_write_is_refused::<Shm>(sock_url());
}

#[test]
fn roce_a_late_write_after_a_timeout_fails_at_the_provider_and_changes_no_byte() {
    late_write_is_refused::<Roce>(support::roce_pair::loopback_url(""));
}
