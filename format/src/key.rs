//! The identity of one routed expert.

/// Identity of one routed expert: its decoder layer index and its index within the layer.
///
/// Layers are numbered as in the checkpoint's tensor names (`model.layers.{layer}.…`), so an
/// MTP layer (DeepSeek-V3, GLM-5) has `layer == num_hidden_layers`. Keys order by layer, then
/// expert: the order of the store's INDEX (docs/FORMAT.md section 3).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ExpertKey {
    /// Decoder layer index (0-based, as in the checkpoint's tensor names).
    pub layer: u32,
    /// Expert index within the layer.
    pub expert: u32,
}

impl ExpertKey {
    /// Makes a key.
    pub fn new(layer: u32, expert: u32) -> ExpertKey {
        ExpertKey { layer, expert }
    }

    /// The checksum seed of this expert's record: `(layer << 32) | expert` (FORMAT.md section
    /// 3). Mixing the key into the checksum makes a record read from the wrong place fail.
    pub fn checksum_seed(self) -> u64 {
        ((self.layer as u64) << 32) | self.expert as u64
    }
}

impl std::fmt::Display for ExpertKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "layer {} expert {}", self.layer, self.expert)
    }
}
