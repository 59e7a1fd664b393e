//! The provider conformance suite run against `ibverbs` (real HCAs, rxe,
//! siw), in process and across two processes, exactly as for `shm`.
//!
//! Without an RDMA device every case prints `skipped: no RDMA device` and
//! passes, unless `RPCRDMA_REQUIRE_RDMA_DEVICE=1`, which turns the skip
//! into a failure (for machines that are meant to have one). The address
//! comes from `RPCRDMA_CONFORMANCE_ADDR` (default 127.0.0.1). See
//! docs/IBVERBS.md for running it on rxe.
#![cfg(feature = "ibverbs")]
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

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod in_process {
            $(#[test] fn $name() {
                if super::have_device() {
                    super::conformance::in_process::<super::Ibverbs>(stringify!($name));
                }
            })*
        }
        mod cross_process {
            $(#[test] fn $name() {
                if super::have_device() {
                    super::conformance::cross_process::<super::Ibverbs>(stringify!($name), "child_peer");
                }
            })*
        }
        #[test]
        fn every_case_is_listed() {
            let listed = [$(stringify!($name)),*];
            for c in conformance::cases::<Ibverbs>() {
                assert!(listed.contains(&c.name), "case {} not run", c.name);
            }
        }
    };
}

suite!(
    send_recv_sizes_and_order,
    rnr_retry_exceeded,
    local_length_error,
    write_then_send_visibility,
    rdma_read,
    write_with_immediate,
    send_with_invalidate,
    local_invalidate,
    bad_rkey,
    out_of_bounds,
    wrong_access_flag,
    flush_on_close,
    peer_death_mid_transfer,
    many_qps_256,
);
