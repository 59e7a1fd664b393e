//! The provider's random bits come from the verbs layer's (shared with
//! `shm`).
#[cfg(test)]
pub(super) use crate::verbs::random::FAIL_RANDOM;
pub(super) use crate::verbs::random::{random_u32, random_u64};
