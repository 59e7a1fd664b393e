//! The provider conformance suite run against `roce` over loopback UDP,
//! both in process (two threads sharing one device, as two processes share
//! an HCA) and across two processes (this test binary re-executes itself as
//! the passive peer, see `child_peer`; the child sends from a per-process
//! 127.128.0.0/9 alias since the parent owns the listening address).
//! Inbound ICRCs are verified (`unique_url` adds `?verify_icrc=1`).
#[macro_use]
mod conformance;

use dataplane::verbs::roce::Roce;

/// Not a test of its own: the entry point of the re-executed child. In a
/// normal run the environment variable is absent and it returns at once.
#[test]
fn child_peer() {
    conformance::child_main::<Roce>(conformance::cases());
}

provider_suite!(Roce);

/// Two queue pairs on one shared receive queue (see the scenario).
#[test]
fn shared_receive_queue() {
    conformance::srq::two_connections_share_one_queue::<Roce>();
}
