//! Big-endian field access at fixed offsets, for the codecs whose
//! messages are fixed layouts (`roce`, `ibcm`) and for shortcuts over a
//! header already known to be long enough (`rpcrdma`). The caller
//! guarantees `at` plus the field's width is within `b`: these index, and
//! so panic on a short slice, which a total decoder must rule out first.

/// The 16-bit big-endian value at `at`.
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The 24-bit big-endian value at `at`.
pub(crate) fn be24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

/// The 32-bit big-endian value at `at`.
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The 64-bit big-endian value at `at`.
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}

/// Writes the low 24 bits of `v`, big-endian, at `at`.
pub(crate) fn put24(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_and_write_big_endian() {
        let b = [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09];
        assert_eq!(be16(&b, 1), 0x0203);
        assert_eq!(be24(&b, 1), 0x02_0304);
        assert_eq!(be32(&b, 1), 0x0203_0405);
        assert_eq!(be64(&b, 1), 0x0203_0405_0607_0809);
        let mut w = [0u8; 5];
        put24(&mut w, 1, 0xAABB_CCDD);
        assert_eq!(w, [0, 0xBB, 0xCC, 0xDD, 0]);
    }
}
