//! RPC-over-RDMA transport header, RFC 8797 private data and CONF_RDMA
//! bodies: parse must never panic, and whatever parses must re-emit to
//! bytes that parse equal.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dataplane::wire::rpcrdma::fuzz_parse(data);
});
