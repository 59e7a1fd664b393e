//! The provider conformance suite run against `ibverbs` (real HCAs, rxe,
//! siw), in process and across two processes, exactly as for `shm`.
//!
//! Without an RDMA device every case prints `skipped: no RDMA device` and
//! passes, unless `RPCRDMA_REQUIRE_RDMA_DEVICE=1`, which turns the skip
//! into a failure (for machines that are meant to have one). The address
//! comes from `RPCRDMA_CONFORMANCE_ADDR` (default 127.0.0.1). See
//! docs/IBVERBS.md for running it on rxe.
#![cfg(feature = "ibverbs")]
#[macro_use]
mod conformance;

use dataplane::verbs::ibverbs::{probe, Ibverbs};
use dataplane::verbs::VerbsError;

/// Env var that makes a missing RDMA device a failure.
const REQUIRE: &str = "RPCRDMA_REQUIRE_RDMA_DEVICE";

/// Whether an RDMA device serves the suite's address; prints the skip
/// line (or fails, if one is required) when not.
fn have_device() -> bool {
    let url = conformance::unique_ip_url("ibverbs");
    match probe(&url) {
        Ok(()) => true,
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
