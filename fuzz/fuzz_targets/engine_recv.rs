//! The transport engine fed arbitrary received messages: it must answer,
//! drop or close the connection, never panic, and leak nothing.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dataplane::engine::fuzz_recv(data);
});
