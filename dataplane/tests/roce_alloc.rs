//! The RoCE and IB CM codecs allocate nothing, on parse or on emit into a
//! caller buffer, measured with the counting allocator over the
//! `fuzz/seeds/roce_packet` inputs, every truncation of each and each aligned
//! word in turn set to 0xFFFFFFFF.

mod support;

use std::fs;
use std::path::PathBuf;

use dataplane::wire::ibcm::{CmMad, MadHeader, RdmaCmHeader, MAD_LEN};
use dataplane::wire::roce::{icrc, Packet, RocePacket};
use support::alloc_counter::{measure, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn hostile_inputs() -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/roce_packet");
    let base: Vec<Vec<u8>> = fs::read_dir(dir)
        .expect("seed directory")
        .map(|e| fs::read(e.expect("seed entry").path()).expect("seed file"))
        .collect();
    assert!(base.len() >= 5, "too few seeds");
    let mut out = Vec::new();
    for input in &base {
        for cut in 0..=input.len() {
            out.push(input[..cut].to_vec());
        }
        for word in (0..input.len()).step_by(4) {
            let mut hostile = input.clone();
            let end = (word + 4).min(hostile.len());
            hostile[word..end].fill(0xFF);
            out.push(hostile);
        }
    }
    out
}

#[test]
fn roce_and_cm_codecs_allocate_nothing() {
    let inputs = hostile_inputs();
    let mut packets = 0usize;
    let mut mads = 0usize;
    let mut out = [0u8; 1024];
    for input in &inputs {
        let ((), allocated) = measure(|| {
            if let Ok(p) = RocePacket::parse(input) {
                packets += 1;
                p.emit(&mut out).expect("re-emit");
                let mad = CmMad::parse(p.payload).ok();
                if let Some(m) = mad {
                    mads += 1;
                    m.emit(&mut out[..MAD_LEN]).expect("re-emit MAD");
                }
            }
            let _ = CmMad::parse(input);
            let _ = MadHeader::parse(input);
            let _ = RdmaCmHeader::parse(input);
            let _ = icrc::compute_frame(input);
            let v = Packet::new_unchecked(&input[..]);
            let _ = (v.psn(), v.icrc(), v.transport_body().len());
        });
        assert_eq!(allocated.count, 0, "allocated on {input:02x?}");
    }
    assert!(packets > 10, "only {packets} packets parsed");
    assert!(mads > 1, "only {mads} MADs parsed");
}
