//! The provider conformance suite run against `shm`, both in process (two
//! threads) and across two processes (this test binary re-executes itself
//! as the passive peer, see `child_peer`).
mod conformance;

use dataplane::verbs::shm::Shm;

/// Not a test of its own: the entry point of the re-executed child. In a
/// normal run the environment variable is absent and it returns at once.
#[test]
fn child_peer() {
    conformance::child_main::<Shm>(conformance::cases());
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod in_process {
            $(#[test] fn $name() { super::conformance::in_process::<super::Shm>(stringify!($name)); })*
        }
        mod cross_process {
            $(#[test] fn $name() { super::conformance::cross_process::<super::Shm>(stringify!($name), "child_peer"); })*
        }
        #[test]
        fn every_case_is_listed() {
            let listed = [$(stringify!($name)),*];
            for c in conformance::cases::<Shm>() {
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
