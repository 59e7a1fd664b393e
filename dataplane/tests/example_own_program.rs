//! `examples/own_program.rs` (docs/EMBEDDING.md) works as shown: its
//! program is served and called, every result is right, the bulk result
//! travels by RDMA Write, and the pool shuts down whole.

#[path = "../examples/own_program.rs"]
#[allow(dead_code)]
mod own_program;

#[test]
fn the_embedding_example_serves_and_calls_its_own_program() {
    let socket = std::env::temp_dir().join(format!("own-program-test-{}.sock", std::process::id()));
    let (upper, reversed) = own_program::run(&socket).expect("the example");
    assert_eq!(upper.data, b"HELLO, RDMA");
    assert!(!upper.placed);
    let sent: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    let expected: Vec<u8> = sent.iter().rev().copied().collect();
    assert!(reversed.data == expected, "REVERSE returned other bytes");
    assert!(
        reversed.placed,
        "the 64 KiB result was not placed by RDMA Write"
    );
    assert!(!socket.exists(), "the listener's socket was left behind");
}
