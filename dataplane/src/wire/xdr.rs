//! XDR, the External Data Representation (RFC 4506).
//!
//! Every item is a multiple of four bytes, big-endian. [`Encoder`] writes
//! into a caller-supplied buffer and never allocates; [`Decoder`] reads from
//! a borrowed slice, tracks its position and returns borrowed slices for
//! opaque data and strings (zero copy).
//!
//! # Limits
//! XDR counts come from the peer. Every decoding call that reads a count
//! (variable-length opaque, string, array) takes a caller-given maximum and
//! also refuses any count that the remaining input could not possibly hold,
//! so a hostile count such as `0xFFFF_FFFF` fails before anything is
//! allocated or skipped.
//!
//! # Panic contract
//! No method panics on any input; errors are [`Error`] values.

use super::{Error, Result};

/// RDMA_MSGP padding parameters (RFC 5666 s3.9, s4.3), re-exported as
/// `wire::rpcrdma::Padding`. Here because [`Decoder`] applies them to
/// padded opaques.
///
/// The rule (RFC 5666 s3.9, as the Linux client applied it): an opaque item
/// of the inline RPC message whose length is at or above `thresh` has
/// padding bytes inserted between its length word and its data, so that
/// the data starts at a multiple of `align` counted from the first byte of
/// the Send (the transport header's first byte: the receiver posts each
/// buffer for one Send, so that is the alignment the receiver sees). The
/// padding is not part of the RPC message; the receiver skips it. An
/// `align` of 0 or 1 means no padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Padding {
    /// Alignment the sender padded opaque data to, in bytes.
    pub align: u32,
    /// Opaque length at or above which padding was applied.
    pub thresh: u32,
}

impl Padding {
    /// Number of padding bytes in front of the data of an opaque item of
    /// `opaque_len` bytes whose data would, unpadded, start at
    /// `data_offset` bytes from the start of the Send.
    ///
    /// # Errors
    /// [`Error::Malformed`] when padding applies and `align` is not a
    /// multiple of 4 (the padding would break the XDR alignment of what
    /// follows, so no valid message can use it).
    pub fn pad_len(&self, data_offset: usize, opaque_len: u32) -> Result<usize> {
        if self.align <= 1 || opaque_len < self.thresh {
            return Ok(0);
        }
        if self.align & 3 != 0 {
            return Err(Error::Malformed);
        }
        let align = self.align as usize;
        Ok((align - data_offset % align) % align)
    }
}

/// Number of zero bytes that pad `len` bytes to the next XDR unit (RFC 4506
/// s4.9-4.10): 0..=3.
#[inline]
pub const fn pad_len(len: usize) -> usize {
    (4 - (len & 3)) & 3
}

/// `len` rounded up to a multiple of four (XDR roundup, RFC 4506 s3).
///
/// Saturates at the largest multiple of four instead of wrapping.
#[inline]
pub const fn roundup(len: usize) -> usize {
    match len.checked_add(pad_len(len)) {
        Some(n) => n,
        None => usize::MAX & !3,
    }
}

/// Encoded size of a variable-length opaque or string of `len` bytes: the
/// length word plus the padded data.
#[inline]
pub const fn opaque_len(len: usize) -> usize {
    4 + roundup(len)
}

/// Writes XDR items into a caller-supplied buffer.
///
/// On [`Error::BufferTooShort`] the position is left where it was before
/// the failing item, so nothing half-written is counted.
#[derive(Debug)]
pub struct Encoder<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Encoder<'a> {
    /// An encoder that writes from the start of `buf`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        Encoder { buf, pos: 0 }
    }

    /// Bytes written so far.
    #[inline]
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes still free in the buffer.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The bytes written so far.
    pub fn written(&self) -> &[u8] {
        &self.buf[..self.pos]
    }

    /// Consumes the encoder, returning the written part of the buffer.
    pub fn finish(self) -> &'a mut [u8] {
        &mut self.buf[..self.pos]
    }

    /// Reserves `n` bytes and returns them for the caller to fill.
    #[inline]
    pub(crate) fn take(&mut self, n: usize) -> Result<&mut [u8]> {
        if self.remaining() < n {
            return Err(Error::BufferTooShort);
        }
        let start = self.pos;
        self.pos += n;
        Ok(&mut self.buf[start..start + n])
    }

    /// `unsigned int` (RFC 4506 s4.2).
    #[inline]
    pub fn put_u32(&mut self, v: u32) -> Result<()> {
        self.take(4)?.copy_from_slice(&v.to_be_bytes());
        Ok(())
    }

    /// `int` (RFC 4506 s4.1).
    #[inline]
    pub fn put_i32(&mut self, v: i32) -> Result<()> {
        self.put_u32(v as u32)
    }

    /// `unsigned hyper` (RFC 4506 s4.5).
    #[inline]
    pub fn put_u64(&mut self, v: u64) -> Result<()> {
        self.take(8)?.copy_from_slice(&v.to_be_bytes());
        Ok(())
    }

    /// `hyper` (RFC 4506 s4.5).
    #[inline]
    pub fn put_i64(&mut self, v: i64) -> Result<()> {
        self.put_u64(v as u64)
    }

    /// `bool` (RFC 4506 s4.4): FALSE is 0, TRUE is 1.
    #[inline]
    pub fn put_bool(&mut self, v: bool) -> Result<()> {
        self.put_u32(v as u32)
    }

    /// `enum` (RFC 4506 s4.3), written as its signed discriminant.
    #[inline]
    pub fn put_enum(&mut self, v: i32) -> Result<()> {
        self.put_i32(v)
    }

    /// Fixed-length opaque (RFC 4506 s4.9): the bytes, then zero padding.
    pub fn put_opaque_fixed(&mut self, data: &[u8]) -> Result<()> {
        let padded = roundup(data.len());
        let out = self.take(padded)?;
        out[..data.len()].copy_from_slice(data);
        out[data.len()..].fill(0);
        Ok(())
    }

    /// Variable-length opaque (RFC 4506 s4.10): length, bytes, padding.
    pub fn put_opaque(&mut self, data: &[u8]) -> Result<()> {
        let len = u32::try_from(data.len()).map_err(|_| Error::LimitExceeded)?;
        if self.remaining() < opaque_len(data.len()) {
            return Err(Error::BufferTooShort);
        }
        self.put_u32(len)?;
        self.put_opaque_fixed(data)
    }

    /// Variable-length opaque whose bytes the caller writes in place: the
    /// length word and zero padding are written, the `len` data bytes are
    /// returned to fill (e.g. a generated payload, without a staging copy).
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] if `len` does not fit the length word,
    /// [`Error::BufferTooShort`] (nothing written) if it does not fit.
    pub fn put_opaque_in_place(&mut self, len: usize) -> Result<&mut [u8]> {
        let word = u32::try_from(len).map_err(|_| Error::LimitExceeded)?;
        if self.remaining() < opaque_len(len) {
            return Err(Error::BufferTooShort);
        }
        self.put_u32(word)?;
        let out = self.take(roundup(len))?;
        let (data, pad) = out.split_at_mut(len);
        pad.fill(0);
        Ok(data)
    }

    /// `string` (RFC 4506 s4.11): encoded exactly like variable opaque.
    pub fn put_string(&mut self, s: &str) -> Result<()> {
        self.put_opaque(s.as_bytes())
    }

    /// The count word of a counted array (RFC 4506 s4.13); the caller then
    /// writes `count` elements.
    pub fn put_count(&mut self, count: usize) -> Result<()> {
        self.put_u32(u32::try_from(count).map_err(|_| Error::LimitExceeded)?)
    }

    /// The discriminant of optional data (RFC 4506 s4.19), also the `*next`
    /// link of an XDR list: TRUE when an item follows.
    pub fn put_present(&mut self, present: bool) -> Result<()> {
        self.put_bool(present)
    }
}

/// Reads XDR items from a borrowed slice.
///
/// On error the position is left where it was before the failing item.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    /// A decoder that reads from the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    #[inline]
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes not yet consumed.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The unconsumed rest of the input.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    /// Fails with [`Error::TrailingBytes`] unless all input was consumed.
    pub fn finish(&self) -> Result<()> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(Error::TrailingBytes)
        }
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.remaining() < n {
            return Err(Error::Truncated);
        }
        let start = self.pos;
        self.pos += n;
        Ok(&self.buf[start..start + n])
    }

    /// `unsigned int` (RFC 4506 s4.2).
    #[inline]
    pub fn get_u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// `int` (RFC 4506 s4.1).
    #[inline]
    pub fn get_i32(&mut self) -> Result<i32> {
        Ok(self.get_u32()? as i32)
    }

    /// `unsigned hyper` (RFC 4506 s4.5).
    #[inline]
    pub fn get_u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        Ok(u64::from_be_bytes(w))
    }

    /// `hyper` (RFC 4506 s4.5).
    #[inline]
    pub fn get_i64(&mut self) -> Result<i64> {
        Ok(self.get_u64()? as i64)
    }

    /// `bool` (RFC 4506 s4.4). Any value other than 0 or 1 is
    /// [`Error::UnknownValue`].
    pub fn get_bool(&mut self) -> Result<bool> {
        let save = self.pos;
        match self.get_u32()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => {
                self.pos = save;
                Err(Error::UnknownValue)
            }
        }
    }

    /// `enum` (RFC 4506 s4.3) as its raw discriminant; the caller maps it.
    #[inline]
    pub fn get_enum(&mut self) -> Result<i32> {
        self.get_i32()
    }

    /// Fixed-length opaque of `len` bytes (RFC 4506 s4.9); the padding is
    /// consumed and not returned. Padding bytes are not checked for zero:
    /// RFC 4506 asks senders to zero them, and being liberal here costs
    /// nothing.
    pub fn get_opaque_fixed(&mut self, len: usize) -> Result<&'a [u8]> {
        if roundup(len) > self.remaining() {
            return Err(Error::Truncated);
        }
        let data = self.take(len)?;
        self.pos += pad_len(len);
        Ok(data)
    }

    /// Variable-length opaque (RFC 4506 s4.10) of at most `max` bytes.
    pub fn get_opaque(&mut self, max: usize) -> Result<&'a [u8]> {
        let save = self.pos;
        let len = self.get_u32()? as usize;
        let r = if len > max {
            Err(Error::LimitExceeded)
        } else {
            self.get_opaque_fixed(len)
        };
        if r.is_err() {
            self.pos = save;
        }
        r
    }

    /// Variable-length opaque of at most `max` bytes in a message that
    /// arrived in RDMA_MSGP (RFC 5666 s3.9): when the length is at or above
    /// `padding.thresh`, the pad bytes between the length word and the
    /// data are skipped ([`Padding::pad_len`]). `base` is the offset of
    /// this decoder's first byte from the start of the Send (the transport
    /// header length, when the decoder starts at the RPC message), because
    /// the sender aligned the data relative to the Send.
    ///
    /// # Errors
    /// As [`Decoder::get_opaque`]; [`Error::Malformed`] when padding
    /// applies and `padding.align` is not a multiple of 4. On error the
    /// position is left where it was.
    pub fn get_opaque_padded(
        &mut self,
        max: usize,
        padding: &Padding,
        base: usize,
    ) -> Result<&'a [u8]> {
        let save = self.pos;
        let r = self.opaque_padded(max, padding, base);
        if r.is_err() {
            self.pos = save;
        }
        r
    }

    fn opaque_padded(&mut self, max: usize, padding: &Padding, base: usize) -> Result<&'a [u8]> {
        let len = self.get_u32()?;
        if len as usize > max {
            return Err(Error::LimitExceeded);
        }
        let at = base.checked_add(self.pos).ok_or(Error::LimitExceeded)?;
        let pad = padding.pad_len(at, len)?;
        self.skip(pad)?;
        self.get_opaque_fixed(len as usize)
    }

    /// `string` (RFC 4506 s4.11) of at most `max` bytes. The bytes are
    /// returned as they are: ONC RPC strings are ASCII by convention but not
    /// by rule, so checking UTF-8 is the caller's choice.
    pub fn get_string(&mut self, max: usize) -> Result<&'a [u8]> {
        self.get_opaque(max)
    }

    /// The count of a counted array (RFC 4506 s4.13) whose elements take at
    /// least `min_elem_len` bytes each. Fails with [`Error::LimitExceeded`]
    /// when the count is above `max` or when the remaining input cannot hold
    /// that many elements, so the caller may size storage by the result.
    pub fn get_count(&mut self, max: usize, min_elem_len: usize) -> Result<usize> {
        let save = self.pos;
        let count = self.get_u32()? as usize;
        let fits = count
            .checked_mul(min_elem_len)
            .is_some_and(|n| n <= self.remaining());
        if count > max || !fits {
            self.pos = save;
            return Err(Error::LimitExceeded);
        }
        Ok(count)
    }

    /// The discriminant of optional data (RFC 4506 s4.19), also the `*next`
    /// link of an XDR list: `true` when an item follows.
    pub fn get_present(&mut self) -> Result<bool> {
        self.get_bool()
    }

    /// Skips `n` bytes.
    pub fn skip(&mut self, n: usize) -> Result<()> {
        self.take(n).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4506_primitives_golden() {
        let mut buf = [0u8; 64];
        let mut e = Encoder::new(&mut buf);
        e.put_u32(0x0102_0304).unwrap();
        e.put_i32(-2).unwrap();
        e.put_u64(0x0102_0304_0506_0708).unwrap();
        e.put_i64(-1).unwrap();
        e.put_bool(true).unwrap();
        e.put_enum(7).unwrap();
        let n = e.position();
        #[rustfmt::skip]
        let golden: [u8; 32] = [
            0x01, 0x02, 0x03, 0x04,
            0xff, 0xff, 0xff, 0xfe,
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x00, 0x00, 0x00, 0x01,
            0x00, 0x00, 0x00, 0x07,
        ];
        assert_eq!(&buf[..n], &golden[..]);

        let mut d = Decoder::new(&golden);
        assert_eq!(d.get_u32(), Ok(0x0102_0304));
        assert_eq!(d.get_i32(), Ok(-2));
        assert_eq!(d.get_u64(), Ok(0x0102_0304_0506_0708));
        assert_eq!(d.get_i64(), Ok(-1));
        assert_eq!(d.get_bool(), Ok(true));
        assert_eq!(d.get_enum(), Ok(7));
        assert_eq!(d.finish(), Ok(()));
    }

    #[test]
    fn opaque_in_place_matches_put_opaque() {
        for len in 0..9usize {
            let data: Vec<u8> = (0..len as u8).map(|i| i + 1).collect();
            let mut a = [0xAAu8; 16];
            let mut b = [0xAAu8; 16];
            let mut ea = Encoder::new(&mut a);
            ea.put_opaque(&data).unwrap();
            let na = ea.position();
            let mut eb = Encoder::new(&mut b);
            eb.put_opaque_in_place(len).unwrap().copy_from_slice(&data);
            assert_eq!(eb.position(), na);
            assert_eq!(a[..na], b[..na], "len {len}");
        }
        let mut small = [0u8; 8];
        let mut e = Encoder::new(&mut small);
        assert_eq!(e.put_opaque_in_place(5).err(), Some(Error::BufferTooShort));
        assert_eq!(e.position(), 0);
    }

    #[test]
    fn rfc4506_opaque_and_string_padding() {
        let mut buf = [0xAAu8; 32];
        let mut e = Encoder::new(&mut buf);
        e.put_opaque(b"abcde").unwrap();
        e.put_string("xy").unwrap();
        e.put_opaque_fixed(b"z").unwrap();
        let n = e.position();
        #[rustfmt::skip]
        let golden: [u8; 24] = [
            0, 0, 0, 5, b'a', b'b', b'c', b'd', b'e', 0, 0, 0,
            0, 0, 0, 2, b'x', b'y', 0, 0,
            b'z', 0, 0, 0,
        ];
        assert_eq!(&buf[..n], &golden[..]);
        let mut d = Decoder::new(&golden);
        assert_eq!(d.get_opaque(16), Ok(&b"abcde"[..]));
        assert_eq!(d.get_string(2), Ok(&b"xy"[..]));
        assert_eq!(d.get_opaque_fixed(1), Ok(&b"z"[..]));
        assert_eq!(d.finish(), Ok(()));
    }

    #[test]
    fn rfc4506_optional_list() {
        // An XDR list of two u32 (`struct { u32 v; node *next; }`).
        let mut buf = [0u8; 32];
        let mut e = Encoder::new(&mut buf);
        for v in [10u32, 20] {
            e.put_present(true).unwrap();
            e.put_u32(v).unwrap();
        }
        e.put_present(false).unwrap();
        let n = e.position();
        let mut d = Decoder::new(&buf[..n]);
        let mut got = [0u32; 2];
        let mut i = 0;
        while d.get_present().unwrap() {
            got[i] = d.get_u32().unwrap();
            i += 1;
        }
        assert_eq!(got, [10, 20]);
        d.finish().unwrap();
    }

    #[test]
    fn hostile_counts_fail_before_allocation() {
        let bytes = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];
        let mut d = Decoder::new(&bytes);
        assert_eq!(d.get_opaque(usize::MAX), Err(Error::Truncated));
        assert_eq!(d.position(), 0);
        assert_eq!(d.get_opaque(1024), Err(Error::LimitExceeded));
        assert_eq!(d.get_count(usize::MAX, 4), Err(Error::LimitExceeded));
        assert_eq!(d.get_count(usize::MAX, 0), Ok(0xffff_ffff));
        let small = [0, 0, 0, 3, 1, 2, 3, 4, 5, 6, 7, 8];
        let mut d = Decoder::new(&small);
        assert_eq!(d.get_count(10, 4), Err(Error::LimitExceeded));
        assert_eq!(d.get_count(10, 2), Ok(3));
    }

    #[test]
    fn truncation_and_short_buffers() {
        let golden = [0, 0, 0, 5, b'a', b'b', b'c', b'd', b'e', 0, 0, 0];
        for cut in 0..golden.len() {
            let mut d = Decoder::new(&golden[..cut]);
            assert!(d.get_opaque(64).is_err(), "cut at {cut}");
            assert_eq!(d.position(), 0);
        }
        let mut d = Decoder::new(&[0, 0, 0, 2]);
        assert_eq!(d.get_bool(), Err(Error::UnknownValue));
        for len in 0..12 {
            let mut buf = vec![0u8; len];
            let mut e = Encoder::new(&mut buf);
            assert_eq!(e.put_opaque(b"abcde"), Err(Error::BufferTooShort));
            assert_eq!(e.position(), 0);
        }
    }

    #[test]
    fn rfc5666_s3_9_padded_opaque_skips_padding_relative_to_the_send() {
        // An opaque of 8 bytes whose data would start at Send offset 44 + 4
        // = 48; align 32 puts it at 64 (16 pad bytes).
        let p = Padding {
            align: 32,
            thresh: 8,
        };
        let mut bytes = vec![0, 0, 0, 8];
        bytes.extend_from_slice(&[0; 16]);
        bytes.extend_from_slice(b"abcdefgh");
        bytes.extend_from_slice(&[0, 0, 0, 3, b'x', b'y', b'z', 0]);
        let mut d = Decoder::new(&bytes);
        assert_eq!(d.get_opaque_padded(64, &p, 44), Ok(&b"abcdefgh"[..]));
        // Below the threshold: no padding.
        assert_eq!(d.get_opaque_padded(64, &p, 44), Ok(&b"xyz"[..]));
        assert_eq!(d.finish(), Ok(()));
        // Already aligned: no padding; align 0 or 1: never padding.
        let plain = [0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8];
        for (p, base) in [
            (p, 28),
            (
                Padding {
                    align: 1,
                    thresh: 0,
                },
                3,
            ),
        ] {
            let mut d = Decoder::new(&plain);
            assert_eq!(d.get_opaque_padded(64, &p, base), Ok(&plain[4..]));
        }
        // Misaligned `align`, over `max`, padding past the input, base
        // overflow: errors, position unchanged.
        let bad = Padding {
            align: 6,
            thresh: 0,
        };
        let mut d = Decoder::new(&bytes);
        assert_eq!(d.get_opaque_padded(64, &bad, 44), Err(Error::Malformed));
        assert_eq!(d.get_opaque_padded(7, &p, 44), Err(Error::LimitExceeded));
        assert_eq!(
            d.get_opaque_padded(
                64,
                &Padding {
                    align: 4096,
                    thresh: 0
                },
                44
            ),
            Err(Error::Truncated)
        );
        assert_eq!(
            d.get_opaque_padded(64, &p, usize::MAX),
            Err(Error::LimitExceeded)
        );
        assert_eq!(d.position(), 0);
    }

    #[test]
    fn roundup_rules() {
        assert_eq!(roundup(0), 0);
        assert_eq!(roundup(1), 4);
        assert_eq!(roundup(4), 4);
        assert_eq!(roundup(5), 8);
        assert_eq!(roundup(usize::MAX), usize::MAX & !3);
        assert_eq!(opaque_len(3), 8);
    }
}
