//! Noveck's extension messages (RDMA_OPTIONAL operations, data placement
//! structures, transport properties) and the CONF_RDMA v2 bodies: parse
//! must never panic, and whatever parses must re-emit to bytes that parse
//! equal.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // The CONF_RDMA v2 entry runs rtrext's parsers as well as its own.
    dataplane::wire::conf2::fuzz_parse(data);
});
