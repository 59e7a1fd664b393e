//! Protection domains and memory regions.
use std::sync::Arc;

use super::config::RoceConfig;
use super::Roce;
use crate::verbs::soft_mr::MrTable;
use crate::verbs::{Access, Sge};

#[derive(Debug)]
pub(crate) struct PdInner {
    pub(super) mrs: Arc<MrTable>,
}

impl PdInner {
    /// Whether an SGE lies in a live registration of this PD with `need`,
    /// and if so, whether a peer may write its memory.
    pub(crate) fn check_local_source(&self, sge: &Sge, need: Access) -> Option<bool> {
        self.mrs.check_local_source(sge, need)
    }
}

/// A protection domain.
#[derive(Debug)]
pub struct RocePd {
    pub(super) inner: Arc<PdInner>,
    pub(super) cfg: RoceConfig,
}

/// A registered memory region; deregistered on drop.
pub type RoceMr = crate::verbs::SoftMr<Roce>;
