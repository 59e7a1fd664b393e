//! The provider conformance suite run against `ibverbs` (real HCAs, rxe,
//! siw), in process and across two processes, exactly as for `shm`.
//!
//! Without an RDMA device every case prints `skipped: no RDMA device` and
//! passes, unless `RPCRDMA_REQUIRE_RDMA_DEVICE=1`, which turns the skip
//! into a failure (for machines that are meant to have one). The address
//! comes from `RPCRDMA_CONFORMANCE_ADDR` (default 127.0.0.1). See
//! docs/IBVERBS.md for running it on rxe.
//!
//! `on_linux_rxe` makes a host without an RDMA device run it all the
//! same: it boots a Linux guest with rdma_rxe (`deploy/linux-peer`) and
//! runs this very test binary there over rxe0, every case required.
#![cfg(feature = "ibverbs")]
#[macro_use]
mod conformance;
mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use dataplane::verbs::ibverbs::{probe, Ibverbs};
use dataplane::verbs::{Provider, VerbsError};
use support::linux_guest::{Guest, GUEST_IP};

/// Env var that makes a missing RDMA device a failure.
const REQUIRE: &str = "RPCRDMA_REQUIRE_RDMA_DEVICE";

/// Whether an RDMA device serves the suite's address; prints the skip
/// line (or fails, if one is required) when not.
fn have_device() -> bool {
    let url = conformance::unique_ip_url("ibverbs");
    match probe(&url) {
        Ok(()) => {
            // rdma_rxe checks a window's key and rights, but the range of
            // an access against the whole region (docs/IBVERBS.md).
            let ctx = Ibverbs::open(&url).expect("open the probed device");
            if ctx.device_name().starts_with("rxe") {
                conformance::WINDOW_RANGE_UNCHECKED.store(true, Ordering::Relaxed);
            }
            true
        }
        Err(e @ VerbsError::Unavailable(_)) => {
            assert!(
                std::env::var(REQUIRE).as_deref() != Ok("1"),
                "{REQUIRE}=1 but: {e}"
            );
            println!("skipped: no RDMA device ({e})");
            false
        }
        Err(e) => panic!("probing {url}: {e}"),
    }
}

/// Not a test of its own: the entry point of the re-executed child. In a
/// normal run the environment variable is absent and it returns at once.
#[test]
fn child_peer() {
    conformance::child_main::<Ibverbs>(conformance::cases());
}

provider_suite!(Ibverbs, have_device);

/// Two queue pairs on one shared receive queue (see the scenario).
#[test]
fn shared_receive_queue() {
    if have_device() {
        conformance::srq::two_connections_share_one_queue::<Ibverbs>();
    }
}

/// How long the whole suite may take in the guest before it counts as
/// hung (it takes a few minutes under TCG; see docs/TESTING.md).
const GUEST_RUN_DEADLINE: Duration = Duration::from_secs(900);

/// The suite on a real kernel RDMA stack when this host has no device:
/// this test binary, run in a Linux guest over rdma_rxe with every case
/// required (`RPCRDMA_REQUIRE_RDMA_DEVICE=1`, so a case cannot skip), one
/// test at a time. Passes when the guest's run passed and libtest counted
/// every test of the binary but this one as passed. Without root or the
/// guest's tools: the real-peer rule (fails under
/// `RPCRDMA_REQUIRE_PEERS=1`, else `skipped: ...`).
#[test]
fn on_linux_rxe() {
    if probe(&conformance::unique_ip_url("ibverbs")).is_ok() {
        println!("skipped: this host has an RDMA device; the cases above ran on it");
        return;
    }
    let Some(guest) = Guest::boot("conformance-rxe") else {
        return;
    };
    let exe = std::env::current_exe().unwrap();
    // Every case in process and cross process, child_peer,
    // every_case_is_listed and shared_receive_queue.
    let expected = 2 * conformance::cases::<Ibverbs>().len() + 3;
    let cmd = format!(
        "cd /tmp && RPCRDMA_REQUIRE_RDMA_DEVICE=1 {}={GUEST_IP} {} \
         --test-threads=1 --skip on_linux_rxe 2>&1",
        conformance::ENV_ADDR,
        exe.display()
    );
    let (ok, out) = guest.run(&cmd, GUEST_RUN_DEADLINE);
    println!("{out}");
    assert!(ok, "the suite failed in the guest (output above)");
    let summary = out
        .lines()
        .find_map(|l| l.strip_prefix("test result: ok. "))
        .expect("libtest's summary line");
    let passed: usize = summary
        .split(" passed")
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a pass count");
    assert!(summary.contains(" 0 failed;"), "{summary}");
    assert_eq!(passed, expected, "tests passed in the guest: {summary}");
}
