//! Random bits for the software providers' keys, PSNs, QPNs and CM ids.
//! No fallback: a key derived from anything guessable (the clock) would
//! let a peer forge access, so without randomness setup fails.
use crate::verbs::VerbsError;

#[cfg(test)]
thread_local! {
    /// Tests: make `random_u32` fail on this thread.
    pub(crate) static FAIL_RANDOM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Random bits for keys, PSNs, QPNs and CM ids, which must not be
/// predictable.
///
/// # Errors
/// `VerbsError::Os` ("getrandom") if the OS has no randomness to give.
pub(crate) fn random_u32() -> Result<u32, VerbsError> {
    let err = |raw: Option<i32>| VerbsError::Os {
        what: "getrandom",
        source: nix::Error::from_raw(raw.unwrap_or(libc::EIO)),
    };
    #[cfg(test)]
    if FAIL_RANDOM.with(|f| f.get()) {
        return Err(err(Some(libc::ENOSYS)));
    }
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).map_err(|e| err(e.raw_os_error()))?;
    Ok(u32::from_le_bytes(b))
}

pub(crate) fn random_u64() -> Result<u64, VerbsError> {
    Ok((random_u32()? as u64) << 32 | random_u32()? as u64)
}
