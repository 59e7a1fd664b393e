//! ONC RPC call and reply headers (RFC 5531): parse must never panic, and
//! whatever parses must re-emit to bytes that parse equal.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dataplane::wire::rpc::fuzz_parse(data);
});
