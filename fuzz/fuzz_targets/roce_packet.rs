//! RoCEv2 packets (BTH and extension headers, ICRC) and IB CM MADs with the
//! rdma_cm private-data header: parse must never panic, and whatever parses
//! must re-emit to bytes that parse equal.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dataplane::wire::roce::fuzz_parse(data);
    // The IB CM codecs (also on a UD packet's payload): `roce` is below
    // `ibcm`, so the two entries are combined here.
    dataplane::wire::ibcm::fuzz_parse(data);
});
