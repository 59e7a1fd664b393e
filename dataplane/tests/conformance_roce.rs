//! The provider conformance suite run against `roce` over loopback UDP,
//! both in process (two threads sharing one device, as two processes share
//! an HCA) and across two processes (this test binary re-executes itself as
//! the passive peer, see `child_peer`; the child sends from a per-process
//! 127.128.0.0/9 alias since the parent owns the listening address).
//! Inbound ICRCs are verified (`unique_url` adds `?verify_icrc=1`).
mod conformance;

use dataplane::verbs::roce::Roce;

/// Not a test of its own: the entry point of the re-executed child. In a
/// normal run the environment variable is absent and it returns at once.
#[test]
fn child_peer() {
    conformance::child_main::<Roce>(conformance::cases());
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod in_process {
            $(#[test] fn $name() { super::conformance::in_process::<super::Roce>(stringify!($name)); })*
        }
        mod cross_process {
            $(#[test] fn $name() { super::conformance::cross_process::<super::Roce>(stringify!($name), "child_peer"); })*
        }
        #[test]
        fn every_case_is_listed() {
            let listed = [$(stringify!($name)),*];
            for c in conformance::cases::<Roce>() {
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
