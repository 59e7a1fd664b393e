//! ONC RPC record marking over TCP (RFC 5531 s11): the reassembler must
//! agree with a direct walk of the fragment headers, never exceed its
//! maximum record size and never panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dataplane::wire::rpc::fuzz_reassembly(data);
});
