//! The worker's endpoint layer and the engine over a fake provider whose
//! completions (any order, any status, stale and foreign ids), queue room
//! and memory contents all come from the input: it must answer, drop or
//! close, never panic, and give back every work request, lease and
//! buffer after the close.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dataplane::worker::fuzz_endpoint(data);
});
