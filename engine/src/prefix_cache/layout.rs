//! What a KV state's numbers depend on, and the shapes of its arrays.

use super::file::KV_LAYOUT_VERSION;
use xxhash_rust::xxh3::xxh3_64;

/// The MTP layer's state shapes ([`KvLayout::mtp`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MtpLayout {
    /// f32 values per position of the MTP layer's keys.
    pub kv_dim: usize,
    /// f32 values per position of its values (0 for MLA, which caches only keys).
    pub v_dim: usize,
    /// Hidden size: f32 values per pending hidden-state row.
    pub hidden_size: usize,
    /// f32 values per position of its convolution inputs (Inkling; 0 elsewhere).
    pub conv_dim: usize,
}

/// One engine's KV cache identity and shapes: a saved state is reused only by an engine whose
/// [`KvLayout::param_hash`] and store id are equal, and is read back with these shapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Id of the store the weights come from.
    pub store_id: [u8; 16],
    /// The canonical parameter string: every parameter that changes the cached numbers (cache
    /// layout version, store id, weights fingerprint, kernel numerics (`coli_kernels::numerics_id`), MLA decode form,
    /// the recurrent layers' rule (`coli_kernels::gated_delta::RULE_ID`, `coli_kernels::kda::RULE_ID`), KV dtype), and none
    /// that does not (budget, I/O engine, prefetch, threads, prefill chunk).
    pub params: String,
    /// XXH3-64 of [`KvLayout::params`].
    pub param_hash: u64,
    /// f32 values per position of each decoder layer's keys (MLA: latent, rope key and DSA
    /// indexer key).
    pub kv_dims: Vec<usize>,
    /// f32 values per position of each layer's values (0 for MLA).
    pub v_dims: Vec<usize>,
    /// f32 values per position of each layer's short-convolution inputs (Inkling's and the
    /// Gated DeltaNet layers' `LayerKv::conv`; 0 elsewhere).
    pub conv_dims: Vec<usize>,
    /// f32 values of each layer's recurrent state (`LayerKv::recurrent`; 0 for layers without
    /// one).
    pub recurrent_dims: Vec<usize>,
    /// Per layer, the convolution rows a recurrent layer's next position reads (`kernel - 1`),
    /// which its state and every checkpoint must hold; 0: not checked (set by the engine after
    /// [`KvLayout::new`]; not part of the parameter hash: it follows from the weights' shapes).
    pub conv_tails: Vec<usize>,
    /// Per layer, `(block_dim, block_rate)` of its compressed blocks (DeepSeek-V4's
    /// `LayerKv::blocks`; `(0, 0)` elsewhere; set by the engine after [`KvLayout::new`], not
    /// part of the parameter hash: it follows from the weights' shapes).
    pub blocks: Vec<(usize, usize)>,
    /// The MTP layer's shapes, when the model has one.
    pub mtp: Option<MtpLayout>,
}

impl KvLayout {
    /// The layout of an engine over store `store_id` whose weights have fingerprint `weights`
    /// (XXH3-64 of the store's MANIFEST and INDEX, which hold every tensor's and record's
    /// checksum: the store id names the conversion, not the bytes) running kernels whose
    /// numbers `isa` names (`coli_kernels::numerics_id`); `mla_decode` is `absorbed`, `expanded`, or `none` for
    /// families without MLA; `recurrent` is the rounding rule id of the model's recurrent layers
    /// (`gdr-r1`, `kda-r1`; models without such layers pass `gdr-r1`, the id every layout held
    /// before KDA, so their saved files keep their names).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store_id: [u8; 16],
        weights: u64,
        isa: &str,
        mla_decode: &str,
        recurrent: &str,
        kv_dims: Vec<usize>,
        v_dims: Vec<usize>,
        conv_dims: Vec<usize>,
        recurrent_dims: Vec<usize>,
        mtp: Option<MtpLayout>,
    ) -> KvLayout {
        let id: String = store_id.iter().map(|b| format!("{b:02x}")).collect();
        let params = format!(
            "kv-layout={KV_LAYOUT_VERSION};store={id};weights={weights:016x};isa={isa};mla-decode={mla_decode};recurrent={recurrent};kv-dtype=f32"
        );
        KvLayout {
            store_id,
            param_hash: xxh3_64(params.as_bytes()),
            params,
            kv_dims,
            v_dims,
            conv_tails: vec![0; recurrent_dims.len()],
            blocks: vec![(0, 0); recurrent_dims.len()],
            conv_dims,
            recurrent_dims,
            mtp,
        }
    }

    /// `<store id>-<parameter hash>`: the name prefix of this layout's files.
    pub fn file_prefix(&self) -> String {
        let id: String = self.store_id.iter().map(|b| format!("{b:02x}")).collect();
        format!("{id}-{:016x}", self.param_hash)
    }
}

/// The scope of a state cached for API key `key` (None: shared by every client): 0, or the
/// XXH3-64 of `coli-kv-scope:<key>` (never 0).
pub fn scope_of(key: Option<&str>) -> u64 {
    key.map_or(0, |k| {
        xxh3_64(format!("coli-kv-scope:{k}").as_bytes()).max(1)
    })
}

/// The scope of chat session `name`'s states: the XXH3-64 of `coli-kv-session:<name>` (never
/// 0), so that neither another session nor a server without API keys reuses them.
pub fn session_scope(name: &str) -> u64 {
    xxh3_64(format!("coli-kv-session:{name}").as_bytes()).max(1)
}
