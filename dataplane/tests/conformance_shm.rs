//! The provider conformance suite run against `shm`, both in process (two
//! threads) and across two processes (this test binary re-executes itself
//! as the passive peer, see `child_peer`).
#[macro_use]
mod conformance;

use dataplane::verbs::shm::Shm;

/// Not a test of its own: the entry point of the re-executed child. In a
/// normal run the environment variable is absent and it returns at once.
#[test]
fn child_peer() {
    conformance::child_main::<Shm>(conformance::cases());
}

provider_suite!(Shm);

/// Two queue pairs on one shared receive queue (see the scenario).
#[test]
fn shared_receive_queue() {
    conformance::srq::two_connections_share_one_queue::<Shm>();
}
