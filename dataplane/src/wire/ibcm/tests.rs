//! Golden MADs hand-assembled from the IBTA Vol. 1 s12.6 layouts (as
//! ROCE-NOTES s4 gives them), round trips, truncation, hostile values.

use super::*;

#[test]
fn mad_header_round_trip() {
    let h = MadHeader::cm(attr::REQ, 0x0000_0001_1234_5678);
    let mut b = [0u8; MAD_HEADER_LEN];
    assert_eq!(h.emit(&mut b), Ok(MAD_HEADER_LEN));
    assert_eq!(&b[..4], &[1, 0x07, 2, 3]);
    assert_eq!(MadHeader::parse(&b), Ok(h));
}
