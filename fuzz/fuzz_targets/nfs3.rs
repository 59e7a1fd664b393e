//! NFSv3 and MOUNT v3 arguments and results (RFC 1813): parse must never
//! panic, and whatever parses must re-emit to bytes that parse equal.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dataplane::nfs::fuzz_parse(data);
});
