//! The tensors a model needs, as a tree that mirrors the forward pass (embedding, layers with
//! their attention and feed-forward blocks, final norm, output head, MTP layers), each leaf a
//! [`TensorSpec`] with its checkpoint name, shape, class, kind and whether it may be absent.
//!
//! The converter's preflight walks the flat lists ([`ModelTensors::dense`],
//! [`ModelTensors::expert_sets`]); the engine's model files walk the tree. Both therefore ask
//! for exactly the same names and shapes.

/// Which part of the model a tensor belongs to (the converter picks encodings per class).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorClass {
    /// Resident weights of the main layers: embedding, attention, dense MLP layers, shared
    /// experts, routers, norms, output head.
    Dense,
    /// The routed experts of the main layers (streamed from the store's expert records).
    RoutedExpert,
    /// Every tensor of a multi-token-prediction layer, its routed experts included.
    Mtp,
}

/// What a tensor is: decides whether the converter may re-encode it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorKind {
    /// A token embedding `[vocab, H]` (one row read per token).
    Embedding,
    /// An output projection `[vocab, H]` (lm_head, an MTP layer's shared head).
    OutputHead,
    /// The weight of a linear layer `[out, in]`: attention, MLP and expert projections.
    Linear,
    /// A router (gate) weight `[experts, H]`: kept in the source precision.
    Router,
    /// A normalization weight or bias (1-D).
    Norm,
    /// A bias vector (1-D): linear biases, the router's `e_score_correction_bias`.
    Bias,
    /// A depthwise short-convolution weight `[channels, 1, kernel]` (Inkling's `*_sconv`):
    /// kept in the source precision (transformers keeps them in f32).
    Conv,
    /// A hyper-connection's mixing parameters (`hc_attn_fn` `[(2+N)N, N H]`, `hc_*_base`,
    /// `hc_*_scale`; GLM-5.3-Flash's k-pool indexer `index_kpool_compress_{gate,ape}`): small
    /// tensors read in f32 and kept in the source precision (transformers keeps most in f32).
    Mixing,
    /// An integer lookup table (DeepSeek-V4's hash router `ffn.gate.tid2eid` `[vocab, top_k]`,
    /// I64 expert ids): stored as f32 values, which hold every id below 2^24 exactly.
    Lookup,
}

/// Which block of a main layer a dense linear weight belongs to: the converter chooses an
/// encoding per role (`coli-convert --attention/--indexer/--shared-experts/--dense-mlp`, each
/// defaulting to `--dense`), as llama.cpp's quantization mixes do per tensor type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinearRole {
    /// Attention projections: GQA `q/k/v/o_proj`, MLA `q_a/q_b/q_proj`, `kv_a_proj_with_mqa`,
    /// `kv_b_proj`, `o_proj`.
    Attention,
    /// The DSA indexer's query and key projections (`self_attn.indexer.wq_b`, `.wk`).
    Indexer,
    /// The DSA indexer's head weights (`self_attn.indexer.weights_proj`): one of the linear
    /// weights the published FP8 checkpoints keep in BF16; never quantized below 8 bits.
    IndexerWeights,
    /// Shared experts of a MoE layer (`mlp.shared_experts.*`), and the latent MoE's
    /// projections around the routed experts (Kimi K3's `routed_expert_{down,up}_proj`).
    SharedExperts,
    /// The SwiGLU MLP of a dense (non-MoE) layer (`mlp.{gate,up,down}_proj`).
    DenseMlp,
}

impl LinearRole {
    /// Every role, in a fixed order.
    pub const ALL: [LinearRole; 5] = [
        LinearRole::Attention,
        LinearRole::Indexer,
        LinearRole::IndexerWeights,
        LinearRole::SharedExperts,
        LinearRole::DenseMlp,
    ];

    /// A short name (`attention`, `indexer`, `indexer_weights`, `shared_experts`,
    /// `dense_mlp`), as reports and `coli info` spell it.
    pub fn key(self) -> &'static str {
        match self {
            LinearRole::Attention => "attention",
            LinearRole::Indexer => "indexer",
            LinearRole::IndexerWeights => "indexer_weights",
            LinearRole::SharedExperts => "shared_experts",
            LinearRole::DenseMlp => "dense_mlp",
        }
    }

    /// True for the weights the published FP8 checkpoints keep in high precision (BF16): the
    /// converter keeps them as in the source when their role's choice is int4.
    pub fn kept_high_precision(self) -> bool {
        self == LinearRole::IndexerWeights
    }
}

/// One tensor the model reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Name as in the checkpoint (and in the store).
    pub name: String,
    /// Shape: `[n]` for vectors, `[rows, cols]` (out, in) for matrices.
    pub shape: Vec<usize>,
    /// Class.
    pub class: TensorClass,
    /// Kind.
    pub kind: TensorKind,
    /// Whether the model runs without it (a stated stand-in is used instead, see the field
    /// that holds it).
    pub optional: bool,
    /// The length a checkpoint may publish this vector padded to, of which the model reads the
    /// first `shape[0]` values ([`TensorSpec::accepts_shape`]): Kimi K3's `A_log`, published
    /// with `head_dim` (128) values for its 96 KDA heads (llama.cpp's converter and mlxcel read
    /// the first 96). None: exactly `shape`.
    pub padded_len: Option<u32>,
}

impl TensorSpec {
    /// A required tensor.
    pub(crate) fn new(
        name: impl Into<String>,
        shape: &[usize],
        class: TensorClass,
        kind: TensorKind,
    ) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            shape: shape.to_vec(),
            class,
            kind,
            optional: false,
            padded_len: None,
        }
    }

    /// The same vector, which a checkpoint may also publish padded to `len` values.
    pub(crate) fn padded_to(mut self, len: usize) -> TensorSpec {
        self.padded_len = u32::try_from(len).ok();
        self
    }

    /// Whether a tensor of `shape` (checkpoint or store) is this one: the spec's shape, or the
    /// padded length of [`TensorSpec::padded_len`].
    pub fn accepts_shape(&self, shape: &[usize]) -> bool {
        shape == self.shape.as_slice()
            || (self.shape.len() == 1 && self.padded_len.is_some_and(|p| shape == [p as usize]))
    }

    /// The same tensor, optional.
    pub(crate) fn optional(mut self) -> TensorSpec {
        self.optional = true;
        self
    }

    /// `(rows, cols)` of its matrix view ([`crate::matrix_dims`]): `[n]` is one row, an N-D
    /// shape (Inkling's stacked shared experts `[S, 2I, H]`, convolution weights `[C, 1, K]`)
    /// the product of its leading dimensions by the last.
    pub fn rows_cols(&self) -> (usize, usize) {
        crate::matrix_dims(&self.shape).expect("specs have at least one dimension")
    }
}

/// A linear layer: `{prefix}.weight` `[out, in]` and, when the config says so,
/// `{prefix}.bias` `[out]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinearSpec {
    /// The weight.
    pub weight: TensorSpec,
    /// The bias, when present.
    pub bias: Option<TensorSpec>,
}

/// MLA's key/value up-projection (`kv_b_proj`, `[heads * (nope + v_head), kv_lora_rank]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MlaKvBSpec {
    /// `kv_b_proj` as the Hugging Face releases hold it: per head, `nope` key rows then
    /// `v_head` value rows.
    Fused(LinearSpec),
    /// As llama.cpp's `convert_hf_to_gguf.py` (`DeepseekV2Model.modify_tensors`) writes it to a
    /// deepseek2 GGUF (`blk.N.attn_k_b` / `attn_v_b`), kept bit for bit: `k_b_proj`
    /// `[heads * kv_lora_rank, nope]` (head h's key rows of `kv_b_proj`, transposed: row
    /// `h * kv_lora_rank + c` holds column c of them) and `v_b_proj`
    /// `[heads * v_head, kv_lora_rank]` (the value rows, unchanged).
    Split {
        /// `self_attn.k_b_proj`.
        k: LinearSpec,
        /// `self_attn.v_b_proj`.
        v: LinearSpec,
    },
}

impl MlaKvBSpec {
    /// The linears it reads (one or two).
    pub fn linears(&self) -> Vec<&LinearSpec> {
        match self {
            MlaKvBSpec::Fused(l) => vec![l],
            MlaKvBSpec::Split { k, v } => vec![k, v],
        }
    }
}

/// A SwiGLU MLP `down(silu(gate(x)) * up(x))` (dense MLP layers, shared experts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlpSpec {
    /// `gate_proj` `[I, H]`.
    pub gate: LinearSpec,
    /// `up_proj` `[I, H]`.
    pub up: LinearSpec,
    /// `down_proj` `[H, I]`.
    pub down: LinearSpec,
}

/// The q/k normalization of a GQA attention block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QkNormSpec {
    /// None (Mixtral).
    None,
    /// RMSNorm of each head of q and k, weights `[head_dim]` (Qwen3-MoE).
    PerHead {
        /// `q_norm.weight`.
        q: TensorSpec,
        /// `k_norm.weight`.
        k: TensorSpec,
    },
    /// RMSNorm over the whole projected q and k vectors (OLMoE), `[heads * head_dim]` and
    /// `[kv_heads * head_dim]`.
    Full {
        /// `q_norm.weight`.
        q: TensorSpec,
        /// `k_norm.weight`.
        k: TensorSpec,
    },
}

/// The query path of MLA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MlaQuerySpec {
    /// `q_lora_rank` set: `q_b(RMSNorm(q_a(x)))`.
    Lora {
        /// `q_a_proj` `[q_lora_rank, H]`.
        a: LinearSpec,
        /// `q_a_layernorm.weight` `[q_lora_rank]`.
        norm: TensorSpec,
        /// `q_b_proj` `[heads * (nope + rope), q_lora_rank]`.
        b: LinearSpec,
    },
    /// `q_lora_rank` null: `q_proj` `[heads * (nope + rope), H]`.
    Direct(LinearSpec),
}

/// The DSA lightning indexer of a GLM-5 `"full"` layer (`self_attn.indexer.*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexerSpec {
    /// `wq_b` `[index_heads * index_head_dim, q_lora_rank]`.
    pub wq_b: LinearSpec,
    /// `wk` `[index_head_dim, H]`.
    pub wk: LinearSpec,
    /// `k_norm.weight` `[index_head_dim]` (LayerNorm).
    pub k_norm_weight: TensorSpec,
    /// `k_norm.bias` `[index_head_dim]`.
    pub k_norm_bias: TensorSpec,
    /// `weights_proj` `[index_heads, H]`.
    pub weights_proj: LinearSpec,
    /// GLM-5.3-Flash's k-pool compression (`index_kpool_compress_gate` `[index_head_dim, H]`,
    /// `index_kpool_compress_ape` `[index_kpool, index_head_dim]`); None for GLM-5 and
    /// DeepSeek-V3.2, whose indexers score every key.
    pub kpool: Option<KPoolTensors>,
}

/// The k-pool compression tensors of a GLM-5.3-Flash indexer (see [`IndexerSpec::kpool`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KPoolTensors {
    /// `index_kpool_compress_gate` `[index_head_dim, H]`: per-token, per-channel pooling logits.
    pub gate: TensorSpec,
    /// `index_kpool_compress_ape` `[index_kpool, index_head_dim]`: a learned logit offset per
    /// position inside a pool.
    pub ape: TensorSpec,
}

/// One manifold-constrained hyper-connection (mHC; GLM-5.3-Flash's `hc_attn_*` / `hc_ffn_*`,
/// transformers' `Glm5NextTextHyperConnection`): what mixes a layer's N residual streams into
/// its sublayer's input and its output back into the streams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HyperConnSpec {
    /// `hc_{attn,ffn}_fn` `[(2+N) N, N H]`: the projection of the normalized streams to the
    /// pre, post and comb logits.
    pub proj: TensorSpec,
    /// `hc_{attn,ffn}_base` `[(2+N) N]`: their offsets.
    pub base: TensorSpec,
    /// `hc_{attn,ffn}_scale` `[3]`: the pre, post and comb logit scales.
    pub scale: TensorSpec,
}

/// The two hyper-connections of a decoder layer (around its attention and its feed-forward).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerHyperSpec {
    /// Around the attention (`hc_attn_*`).
    pub attn: HyperConnSpec,
    /// Around the feed-forward block (`hc_ffn_*`).
    pub ffn: HyperConnSpec,
}

/// An attention block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttentionSpec {
    /// Grouped-query attention with RoPE.
    Gqa {
        /// `q_proj` `[heads * head_dim, H]`.
        q: LinearSpec,
        /// `k_proj` `[kv_heads * head_dim, H]`.
        k: LinearSpec,
        /// `v_proj` `[kv_heads * head_dim, H]`.
        v: LinearSpec,
        /// `o_proj` `[H, heads * head_dim]`.
        o: LinearSpec,
        /// q/k normalization.
        qk_norm: QkNormSpec,
        /// gpt-oss: `self_attn.sinks` `[heads]`, one learned logit per head that joins the
        /// softmax over the keys and carries no value.
        sinks: Option<TensorSpec>,
        /// Qwen3-Next / Qwen3.5: an output gate. `q_proj` is `[2 * heads * head_dim, H]`, each
        /// head's `head_dim` query rows followed by its `head_dim` gate rows; the attention
        /// output is multiplied by `sigmoid(gate)` before `o_proj`.
        gated: bool,
    },
    /// A Gated DeltaNet linear-attention layer (Qwen3-Next, Qwen3.5): a recurrent state per
    /// value head instead of keys and values per position.
    GatedDeltaNet(Box<GatedDeltaNetSpec>),
    /// Inkling's attention: per-head RMS-normalized q/k, short convolutions over the projected
    /// keys and values, a learned relative position bias instead of RoPE.
    Inkling(Box<InklingAttentionSpec>),
    /// Multi-head latent attention (DeepSeek-V3, GLM-5).
    Mla {
        /// The query path.
        q: MlaQuerySpec,
        /// `kv_a_proj_with_mqa` `[kv_lora_rank + rope, H]`.
        kv_a: LinearSpec,
        /// `kv_a_layernorm.weight` `[kv_lora_rank]`.
        kv_norm: TensorSpec,
        /// `kv_b_proj`, fused or as llama.cpp splits it.
        kv_b: MlaKvBSpec,
        /// `o_proj` `[H, heads * v_head]`.
        o: LinearSpec,
        /// The DSA indexer of a GLM-5 `"full"` layer (`None` elsewhere).
        indexer: Option<Box<IndexerSpec>>,
        /// Kimi K3's output gate (`mla_use_output_gate`): `self_attn.g_proj` `[heads * v_head,
        /// H]`; the attention output is multiplied by `sigmoid(g_proj(x))` (`x` the layer's
        /// normalized input) before `o_proj`. None elsewhere.
        gate: Option<Box<LinearSpec>>,
    },
    /// Inkling 2's attention block with the layer's other parts ([`Inkling2AttentionSpec`]).
    Inkling2(Box<Inkling2AttentionSpec>),
    /// DeepSeek-V4's attention ([`DeepseekV4AttentionSpec`]).
    DeepseekV4(Box<DeepseekV4AttentionSpec>),
}

/// A DeepSeek-V4 compressor (`attn.compressor` or the indexer's `attn.indexer.compressor`;
/// transformers 5.25 `DeepseekV4HCACompressor` / `DeepseekV4CSACompressor`): each position's
/// `wkv` and `wgate` rows, pooled per block of `rate` positions by a softmax over the block
/// (per channel, gate plus `ape`), normalized by `norm` and rotated at the block's first
/// position. `w` is the pooled width: the head dimension, doubled on overlapping (CSA) layers,
/// whose entry pools the previous block's first half with its own block's second half.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompressorSpec {
    /// `wkv.weight` `[w, H]`.
    pub kv: LinearSpec,
    /// `wgate.weight` `[w, H]`.
    pub gate: LinearSpec,
    /// `ape` `[rate, w]` (f32 as published): the gate's offset per slot of a block.
    pub ape: TensorSpec,
    /// `norm.weight` `[head_dim]`: the RMSNorm of a pooled entry.
    pub norm: TensorSpec,
}

/// The lightning indexer of a DeepSeek-V4 CSA layer (`attn.indexer`, `DeepseekV4Indexer`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeepseekV4IndexerSpec {
    /// `wq_b.weight` `[index_heads * index_head_dim, q_lora_rank]`: its queries, from the
    /// attention's normalized q latent.
    pub q_b: LinearSpec,
    /// `weights_proj.weight` `[index_heads, H]`: each head's weight per token.
    pub weights: LinearSpec,
    /// Its compressor (`attn.indexer.compressor`, pooled width `2 * index_head_dim`).
    pub compressor: CompressorSpec,
}

/// One DeepSeek-V4 attention block (`layers.{i}.attn`, transformers 5.25
/// `DeepseekV4Attention`; names as released): a q LoRA, one shared key-value head, a sink per
/// head, a grouped low-rank output, and on compressed layers the compressor (and the CSA
/// layers' indexer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeepseekV4AttentionSpec {
    /// `wq_a.weight` `[q_lora_rank, H]`.
    pub q_a: LinearSpec,
    /// `q_norm.weight` `[q_lora_rank]`.
    pub q_norm: TensorSpec,
    /// `wq_b.weight` `[heads * head_dim, q_lora_rank]`.
    pub q_b: LinearSpec,
    /// `wkv.weight` `[head_dim, H]`: the one key-value head (keys and values are the same rows).
    pub kv: LinearSpec,
    /// `kv_norm.weight` `[head_dim]`.
    pub kv_norm: TensorSpec,
    /// `wo_a.weight` `[o_groups * o_lora_rank, heads * head_dim / o_groups]`: group `g`'s rows
    /// `g * o_lora_rank..` project its heads.
    pub o_a: LinearSpec,
    /// `wo_b.weight` `[H, o_groups * o_lora_rank]`.
    pub o_b: LinearSpec,
    /// `attn_sink` `[heads]` (f32 as published).
    pub sinks: TensorSpec,
    /// The compressor of a CSA or HCA layer (None on sliding layers).
    pub compressor: Option<CompressorSpec>,
    /// The indexer of a CSA layer.
    pub indexer: Option<DeepseekV4IndexerSpec>,
}

/// A key or value short convolution of an Inkling 2 layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvConvSpec {
    /// Sliding layers (`Inkling2ShortConvolution`): `attn.{k,v}_sconv.weight`
    /// `[kv_heads * head_dim, 1, kernel]`.
    Static(TensorSpec),
    /// Full layers (`Inkling2DynamicShortConvolution`): taps `static_w` `[kernel, kv_dim]`
    /// (row `lag` weights the input `lag` positions back) plus per-token, per-head taps
    /// `weight_proj` `[kv_heads * kernel, H]` of the layer's normalized key (value) input.
    Dynamic {
        /// `attn.{k,v}_sconv.static_w` `[kernel, kv_heads * head_dim]`.
        static_w: TensorSpec,
        /// `attn.{k,v}_sconv.weight_proj` `[kv_heads * kernel, H]`.
        proj: LinearSpec,
    },
}

/// One Inkling 2 layer's attention (`Inkling2SlidingAttention` / `Inkling2FullAttention` of
/// transformers 5.25 `modeling_inkling2.py`) and what else the layer holds besides its norms
/// and MoE: the two output convolutions and the layer's attention-residual queries
/// (`model.llm.attn_res.*`). Names as published (`model.llm.layers.{i}.*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inkling2AttentionSpec {
    /// `attn.wq_du` `[heads * head_dim, H]`.
    pub q: LinearSpec,
    /// `attn.wk_dv` `[kv_heads * head_dim, H]`.
    pub k: LinearSpec,
    /// `attn.wv_dv` `[kv_heads * head_dim, H]`.
    pub v: LinearSpec,
    /// `attn.wr_du` `[heads * d_rel, H]`: the relative states.
    pub r: LinearSpec,
    /// `attn.wo_ud` `[H, heads * head_dim]`.
    pub o: LinearSpec,
    /// `attn.gate_attn` `[heads * head_dim, H]`: the sigmoid output gate.
    pub gate: LinearSpec,
    /// `attn.attn_sink_proj` `[heads, H]`: each token's per-head sink logit.
    pub sink: LinearSpec,
    /// `attn.q_l2_clip.scale` `[heads, head_dim]`.
    pub q_scale: TensorSpec,
    /// `attn.rel_l2_clip.scale` `[heads, d_rel]`.
    pub rel_scale: TensorSpec,
    /// The key convolution.
    pub k_conv: KvConvSpec,
    /// The value convolution.
    pub v_conv: KvConvSpec,
    /// `attn.rel_logits_proj.proj` `[d_rel, extent]`.
    pub rel_proj: TensorSpec,
    /// `attn_sconv.weight` `[H, 1, kernel]`.
    pub out_conv: TensorSpec,
    /// `mlp_sconv.weight` `[H, 1, kernel]`.
    pub mlp_out_conv: TensorSpec,
    /// Full layers: `k_input_norm.weight` and `v_input_norm.weight` `[H]` (the query's is the
    /// layer's `input_norm`, `q_input_norm`); None on sliding layers.
    pub kv_input_norms: Option<(TensorSpec, TensorSpec)>,
    /// `attn_res.attn_queries.{i - 1}`: `[H]` (sliding) or `[3, H]` (full: query, key, value
    /// inputs); None on layer 0, whose input is the embedding.
    pub attn_query: Option<TensorSpec>,
    /// `attn_res.mlp_queries.{i}` `[H]`.
    pub mlp_query: TensorSpec,
}

/// Inkling's attention block `model.llm.layers.{i}.attn.*` (`InklingAttention` of transformers
/// 5.23 `modeling_inkling.py`), with the layer's `attn_sconv` over its output. Sliding layers
/// have their own head counts and head dim (`swa_*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InklingAttentionSpec {
    /// `attn.wq_du` `[heads * head_dim, H]`.
    pub q: LinearSpec,
    /// `attn.wk_dv` `[kv_heads * head_dim, H]`.
    pub k: LinearSpec,
    /// `attn.wv_dv` `[kv_heads * head_dim, H]`.
    pub v: LinearSpec,
    /// `attn.wr_du` `[heads * d_rel, H]`: the relative states.
    pub r: LinearSpec,
    /// `attn.wo_ud` `[H, heads * head_dim]`.
    pub o: LinearSpec,
    /// `attn.q_norm.weight` `[head_dim]` (RMSNorm of each query head).
    pub q_norm: TensorSpec,
    /// `attn.k_norm.weight` `[head_dim]`.
    pub k_norm: TensorSpec,
    /// `attn.k_sconv.weight` `[kv_heads * head_dim, 1, kernel]`.
    pub k_conv: TensorSpec,
    /// `attn.v_sconv.weight` `[kv_heads * head_dim, 1, kernel]`.
    pub v_conv: TensorSpec,
    /// `attn.rel_logits_proj.proj` `[d_rel, extent]` (extent: `rel_extent` on full layers,
    /// `sliding_window_size` on sliding ones).
    pub rel_proj: TensorSpec,
    /// `attn_sconv.weight` `[H, 1, kernel]`: the short convolution over the attention output.
    pub out_conv: TensorSpec,
}

/// Inkling's dense MLP `mlp.w13_dn` / `mlp.w2_md` (`InklingMLP`) and the layer's `mlp_sconv`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusedMlpSpec {
    /// `mlp.w13_dn.weight` `[2I, H]`, gate and up rows interleaved (row `2i` gate feature `i`,
    /// row `2i + 1` up feature `i`: transformers' `Interleave(dim=0)` + `Chunk`).
    pub gate_up: LinearSpec,
    /// `mlp.w2_md.weight` `[H, I]`.
    pub down: LinearSpec,
    /// `mlp.global_scale` `[1]`: multiplies the output.
    pub scale: TensorSpec,
    /// `mlp_sconv.weight` `[H, 1, kernel]`: the short convolution over the MLP output.
    pub out_conv: TensorSpec,
}

/// Inkling's MoE block (`InklingMoE`): a router over the routed and the shared experts (the
/// shared experts' logits join the softmax as a sink), routed experts in the store, shared
/// experts stacked, and the layer's `mlp_sconv`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkMoeSpec {
    /// `mlp.gate.weight` `[E + S, H]`: rows `0..E` the routed experts, `E..E+S` the shared.
    pub router: TensorSpec,
    /// `mlp.gate.bias` `[E]` (F32): the selection bias (`e_score_correction_bias`).
    pub router_bias: TensorSpec,
    /// `mlp.gate.global_scale` `[1]` (F32): multiplies every routing weight.
    pub router_scale: TensorSpec,
    /// `mlp.shared_experts.shared_w13_weight` `[S, 2I, H]`, each expert's gate/up rows
    /// interleaved as [`FusedMlpSpec::gate_up`].
    pub shared_gate_up: TensorSpec,
    /// `mlp.shared_experts.shared_w2_weight` `[S, H, I]`.
    pub shared_down: TensorSpec,
    /// Shared experts S.
    pub num_shared: usize,
    /// The routed experts ([`ExpertStorage::FusedW13`]).
    pub experts: ExpertsSpec,
    /// `mlp_sconv.weight` `[H, 1, kernel]`.
    pub out_conv: TensorSpec,
}

/// How a checkpoint stores a layer's routed experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertStorage {
    /// One tensor per expert matrix: `{prefix}.{e}.{name}.weight` for the three names (gate,
    /// up, down: `gate_proj`, ... or Mixtral's `w1`, `w3`, `w2`).
    PerExpert([&'static str; 3]),
    /// transformers 5's fused layout of the SwiGLU families (`Qwen3MoeExperts`,
    /// `OlmoeExperts` parameters, as `save_pretrained` of transformers 5 writes them):
    /// `{prefix}.gate_up_proj` `[E, 2I, H]` (rows `0..I` gate, `I..2I` up: the product is
    /// `chunk(2)`-ed) and `{prefix}.down_proj` `[E, H, I]`, BF16/F16/F32, no biases. The spec of
    /// those families says [`ExpertStorage::PerExpert`]; the converter reads this layout when the
    /// checkpoint has it instead.
    FusedConcat,
    /// gpt-oss in BF16/F32 (transformers' `GptOssExperts` parameters): `{prefix}.gate_up_proj`
    /// `[E, H, 2I]` (input-major; column `2i` is gate feature `i`, column `2i + 1` up feature
    /// `i`), `{prefix}.down_proj` `[E, I, H]`, biases `{prefix}.gate_up_proj_bias` `[E, 2I]`
    /// (interleaved the same way) and `{prefix}.down_proj_bias` `[E, H]`.
    FusedInterleaved,
    /// gpt-oss as published (MXFP4 experts): `{prefix}.gate_up_proj_blocks` U8
    /// `[E, 2I, H/32, 16]` and `{prefix}.gate_up_proj_scales` U8 `[E, 2I, H/32]` (row `2i` is
    /// gate feature `i`, row `2i + 1` up feature `i`; e2m1 codes two per byte, low nibble first;
    /// e8m0 scales), `{prefix}.down_proj_blocks` `[E, H, I/32, 16]` and `..._scales`
    /// `[E, H, I/32]`, biases as [`ExpertStorage::FusedInterleaved`].
    FusedMxfp4,
    /// Inkling as published: `{prefix}.w13_weight` `[E, 2I, H]` (row `2i` is gate feature `i`,
    /// row `2i + 1` up feature `i`: transformers' `Interleave(dim=1)`) and `{prefix}.w2_weight`
    /// `[E, H, I]`, BF16/F16/F32, no biases.
    FusedW13,
    /// [`ExpertStorage::FusedW13`] with MXFP8 experts (Inkling 2's `-MXFP8` releases,
    /// transformers' finegrained FP8 with `weight_block_size` `[1, 32]`, `scale_fmt` `ue8m0`):
    /// `w13_weight` F8_E4M3 `[E, 2I, H]` with `w13_weight_scale` U8 `[E, 2I, H/32]` and
    /// `w2_weight` F8_E4M3 `[E, H, I]` with `w2_weight_scale` U8 `[E, H, I/32]`; a weight is
    /// `e4m3(code) * 2^(scale - 127)`, the scale of its row's block of 32 columns.
    FusedW13Mxfp8,
}

/// The routed experts of one layer: `count` records in the store, each holding expert `e`'s
/// gate `[I, H]`, up `[I, H]` and down `[H, I]` (and their biases when `biases`), stored in
/// the checkpoint as [`ExpertsSpec::storage`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertsSpec {
    /// Decoder layer index.
    pub layer: u32,
    /// Experts in the layer.
    pub count: u32,
    /// Hidden size H.
    pub hidden: usize,
    /// Intermediate size I of one expert.
    pub intermediate: usize,
    /// [`TensorClass::RoutedExpert`], or [`TensorClass::Mtp`] for an MTP layer's experts.
    pub class: TensorClass,
    /// Name prefix of the layer's experts (`model.layers.L.mlp.experts`).
    pub prefix: String,
    /// The checkpoint's tensors for them.
    pub storage: ExpertStorage,
    /// Each matrix has a bias (gpt-oss): gate `[I]`, up `[I]`, down `[H]`.
    pub biases: bool,
}

impl ExpertsSpec {
    /// The checkpoint names of expert `e`'s gate, up and down weights (per-expert storage).
    ///
    /// # Panics
    /// For fused storage, whose tensors hold every expert ([`ExpertsSpec::fused_tensors`]).
    pub fn tensor_names(&self, e: u32) -> [String; 3] {
        let ExpertStorage::PerExpert(m) = self.storage else {
            panic!("tensor_names of fused experts {}", self.prefix)
        };
        m.map(|m| format!("{}.{e}.{m}.weight", self.prefix))
    }

    /// Expert `e`'s three tensors with their shapes (per-expert storage).
    ///
    /// # Panics
    /// For fused storage.
    pub fn tensors(&self, e: u32) -> [TensorSpec; 3] {
        let (h, i) = (self.hidden, self.intermediate);
        let [g, u, d] = self.tensor_names(e);
        let t = |n: String, s: &[usize]| TensorSpec::new(n, s, self.class, TensorKind::Linear);
        [t(g, &[i, h]), t(u, &[i, h]), t(d, &[h, i])]
    }

    /// The fused tensors of the layer with their checkpoint shapes and dtypes (`"U8"` for MXFP4
    /// blocks and scales, `None` for "BF16, F16 or F32"): weights first, then biases. Empty for
    /// per-expert storage.
    pub fn fused_tensors(&self) -> Vec<(String, Vec<usize>, Option<&'static str>)> {
        let (e, h, i, p) = (
            self.count as usize,
            self.hidden,
            self.intermediate,
            &self.prefix,
        );
        let mut out = match self.storage {
            ExpertStorage::PerExpert(_) => return vec![],
            ExpertStorage::FusedConcat => vec![
                (format!("{p}.gate_up_proj"), vec![e, 2 * i, h], None),
                (format!("{p}.down_proj"), vec![e, h, i], None),
            ],
            ExpertStorage::FusedW13 => vec![
                (format!("{p}.w13_weight"), vec![e, 2 * i, h], None),
                (format!("{p}.w2_weight"), vec![e, h, i], None),
            ],
            ExpertStorage::FusedW13Mxfp8 => vec![
                (
                    format!("{p}.w13_weight"),
                    vec![e, 2 * i, h],
                    Some("F8_E4M3"),
                ),
                (
                    format!("{p}.w13_weight_scale"),
                    vec![e, 2 * i, h.div_ceil(32)],
                    Some("U8"),
                ),
                (format!("{p}.w2_weight"), vec![e, h, i], Some("F8_E4M3")),
                (
                    format!("{p}.w2_weight_scale"),
                    vec![e, h, i.div_ceil(32)],
                    Some("U8"),
                ),
            ],
            ExpertStorage::FusedInterleaved => vec![
                (format!("{p}.gate_up_proj"), vec![e, h, 2 * i], None),
                (format!("{p}.down_proj"), vec![e, i, h], None),
            ],
            ExpertStorage::FusedMxfp4 => vec![
                (
                    format!("{p}.gate_up_proj_blocks"),
                    vec![e, 2 * i, h.div_ceil(32), 16],
                    Some("U8"),
                ),
                (
                    format!("{p}.gate_up_proj_scales"),
                    vec![e, 2 * i, h.div_ceil(32)],
                    Some("U8"),
                ),
                (
                    format!("{p}.down_proj_blocks"),
                    vec![e, h, i.div_ceil(32), 16],
                    Some("U8"),
                ),
                (
                    format!("{p}.down_proj_scales"),
                    vec![e, h, i.div_ceil(32)],
                    Some("U8"),
                ),
            ],
        };
        if self.biases {
            out.push((format!("{p}.gate_up_proj_bias"), vec![e, 2 * i], None));
            out.push((format!("{p}.down_proj_bias"), vec![e, h], None));
        }
        out
    }
}

/// A feed-forward block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FfnSpec {
    /// A dense SwiGLU MLP (`mlp.{gate,up,down}_proj`).
    Dense(MlpSpec),
    /// A Mixture-of-Experts block.
    Moe(MoeSpec),
    /// Inkling's dense MLP with fused gate/up.
    FusedDense(FusedMlpSpec),
    /// Inkling's MoE block with the shared-expert sink.
    SinkMoe(Box<SinkMoeSpec>),
}

/// A Mixture-of-Experts block: router, routed experts, optional shared experts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeSpec {
    /// The router weight `[experts, H]`.
    pub router: TensorSpec,
    /// The selection bias `e_score_correction_bias` `[experts]` (sigmoid routing).
    pub router_bias: Option<TensorSpec>,
    /// The router's linear bias `[experts]`, added to its logits (gpt-oss `mlp.router.bias`).
    pub router_logit_bias: Option<TensorSpec>,
    /// Shared experts (always-on SwiGLU of `moe_intermediate_size * n_shared_experts`).
    pub shared: Option<Box<MlpSpec>>,
    /// Qwen3-Next / Qwen3.5: `mlp.shared_expert_gate.weight` `[1, H]`; the shared expert's
    /// output is multiplied by `sigmoid(gate . x)`.
    pub shared_gate: Option<TensorSpec>,
    /// The routed experts.
    pub experts: ExpertsSpec,
    /// DeepSeek-V4's hash-routed layers: `ffn.gate.tid2eid` `[vocab, top_k]`, the experts of
    /// each token id (the router weight only weighs them).
    pub hash_table: Option<TensorSpec>,
    /// Kimi K3's latent MoE: the routed experts run on `down(x)` (their hidden size is the
    /// latent size L, [`ExpertsSpec::hidden`]) and their weighted sum is normalized and
    /// projected back, `up(norm(sum))`; the router and the shared experts read `x`. None: the
    /// experts read `x`.
    pub latent: Option<Box<LatentMoeSpec>>,
}

/// Kimi K3's latent projections around the routed experts (`KimiSparseMoeBlock` with
/// `routed_expert_hidden_size` L).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatentMoeSpec {
    /// `block_sparse_moe.routed_expert_down_proj` `[L, H]`.
    pub down: LinearSpec,
    /// `block_sparse_moe.routed_expert_up_proj` `[H, L]`.
    pub up: LinearSpec,
    /// `block_sparse_moe.routed_expert_norm.weight` `[L]` (`latent_moe_use_norm`; epsilon
    /// `rms_norm_eps`), an RMSNorm of the routed experts' weighted sum before `up`.
    pub norm: Option<TensorSpec>,
}

/// A gated delta rule layer's tensors, with `Hk` key heads of `dk`, `Hv` value heads of `dv`
/// ([`crate::spec::GatedDeltaSpec`]) and the short convolution over the `C = 2 Hk dk + Hv dv`
/// channels of `[q | k | v]`: a Gated DeltaNet (`model.layers.{i}.linear_attn`, transformers
/// 5.25 `Qwen3NextGatedDeltaNet`) or a Kimi Delta Attention layer
/// (`model.layers.{i}.self_attn`, `KimiLinearDeltaAttention`; `Hk = Hv`, `dk = dv`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatedDeltaNetSpec {
    /// The input projections.
    pub input: GatedDeltaInput,
    /// The depthwise convolution's weights `[c, 1, K]` (no bias; SiLU after it), whose channels
    /// concatenated in order are the `C` channels `[q | k | v]`: Qwen3-Next's one
    /// `conv1d.weight` `[C, 1, K]`; KDA's `q_conv1d`, `k_conv1d`, `v_conv1d` (transformers
    /// concatenates them into its `conv1d` at load).
    pub convs: Vec<TensorSpec>,
    /// `dt_bias`: `[Hv]` (one per head) or, for KDA, `[Hv dk]` (one per key channel).
    pub dt_bias: TensorSpec,
    /// `A_log` `[Hv]` (KDA: `[1, 1, Hv, 1]`): the decay rate `exp(A_log)` per head
    /// (`g = -exp(A_log) softplus(a + dt_bias)`).
    pub a_log: TensorSpec,
    /// The gated RMSNorm of each value head's output, `[dv]` (weight used as is, then times
    /// the gate's activation): `norm.weight` (silu), KDA's `o_norm.weight` (sigmoid).
    pub norm: TensorSpec,
    /// `out_proj` / KDA's `o_proj` `[H, Hv dv]`.
    pub out: LinearSpec,
}

/// How a Gated DeltaNet layer projects its input.
#[derive(Clone, Debug, PartialEq, Eq)]
// One per layer, inside the boxed `GatedDeltaNetSpec`: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum GatedDeltaInput {
    /// Qwen3-Next: `in_proj_qkvz` `[2 Hk dk + 2 Hv dv, H]`, rows grouped per key head (each
    /// group `[q (dk) | k (dk) | v (Hv/Hk dv) | z (Hv/Hk dv)]`), and `in_proj_ba` `[2 Hv, H]`,
    /// grouped per key head (`[b (Hv/Hk) | a (Hv/Hk)]`), as `fix_query_key_value_ordering`
    /// reads them.
    Fused {
        /// `in_proj_qkvz`.
        qkvz: LinearSpec,
        /// `in_proj_ba`.
        ba: LinearSpec,
    },
    /// Qwen3.5 / Qwen3.6 (`Qwen3_5MoeGatedDeltaNet`): `in_proj_qkv` `[2 Hk dk + Hv dv, H]`
    /// (rows already the convolution's channels `[q | k | v]`), `in_proj_z` `[Hv dv, H]`,
    /// `in_proj_b` `[Hv, H]`, `in_proj_a` `[Hv, H]`.
    Split {
        /// `in_proj_qkv`.
        qkv: LinearSpec,
        /// `in_proj_z`.
        z: LinearSpec,
        /// `in_proj_b`.
        b: LinearSpec,
        /// `in_proj_a`.
        a: LinearSpec,
    },
    /// Qwen3-Next as llama.cpp's `Qwen3NextModel` writes it (a `qwen3next` GGUF's `attn_qkv`,
    /// `attn_gate`, `ssm_ba`): `in_proj_qkvz` split into `in_proj_qkv` `[2 Hk dk + Hv dv, H]`
    /// (`[q | k | v]`, the value heads grouped as published) and `in_proj_z` `[Hv dv, H]`;
    /// `in_proj_ba` `[2 Hv, H]` grouped per key head as in [`GatedDeltaInput::Fused`].
    SplitQkvz {
        /// `in_proj_qkv`.
        qkv: LinearSpec,
        /// `in_proj_z`.
        z: LinearSpec,
        /// `in_proj_ba`.
        ba: LinearSpec,
    },
    /// Kimi Delta Attention (`KimiLinearDeltaAttention`, `Hk = Hv` heads of `d = dk = dv`):
    /// `q_proj`, `k_proj`, `v_proj` `[Hv d, H]` (the convolution's channels in that order),
    /// the low-rank forget gate `f_a_proj` `[d, H]` then `f_b_proj` `[Hv d, d]` (one log decay
    /// per key channel), `b_proj` `[Hv, H]` (beta), the low-rank output gate `g_a_proj`
    /// `[d, H]` then `g_b_proj` `[Hv d, d]`, or Kimi K3's full-rank gate
    /// (`use_full_rank_gate`): `g_proj` `[Hv d, H]` in `g_b`, `g_a` None.
    Kda {
        /// `q_proj`.
        q: LinearSpec,
        /// `k_proj`.
        k: LinearSpec,
        /// `v_proj`.
        v: LinearSpec,
        /// `f_a_proj`.
        f_a: LinearSpec,
        /// `f_b_proj`.
        f_b: LinearSpec,
        /// `b_proj`.
        b: LinearSpec,
        /// `g_a_proj` (None: the gate is `g_b` alone, full rank).
        g_a: Option<LinearSpec>,
        /// `g_b_proj`, or the full-rank `g_proj`.
        g_b: LinearSpec,
    },
}

impl GatedDeltaInput {
    /// The projections, in checkpoint order.
    pub fn linears(&self) -> Vec<&LinearSpec> {
        match self {
            GatedDeltaInput::Fused { qkvz, ba } => vec![qkvz, ba],
            GatedDeltaInput::Split { qkv, z, b, a } => vec![qkv, z, b, a],
            GatedDeltaInput::SplitQkvz { qkv, z, ba } => vec![qkv, z, ba],
            GatedDeltaInput::Kda {
                q,
                k,
                v,
                f_a,
                f_b,
                b,
                g_a,
                g_b,
            } => [q, k, v, f_a, f_b, b]
                .into_iter()
                .chain(g_a.as_ref())
                .chain([g_b])
                .collect(),
        }
    }
}

/// One decoder layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSpec {
    /// Layer index (as in the tensor names).
    pub index: usize,
    /// `input_layernorm.weight` `[H]`.
    pub input_norm: TensorSpec,
    /// The attention block.
    pub attention: AttentionSpec,
    /// `post_attention_layernorm.weight` `[H]`.
    pub post_norm: TensorSpec,
    /// The feed-forward block.
    pub ffn: FfnSpec,
    /// The layer's hyper-connections when the model keeps several residual streams
    /// (GLM-5.3-Flash); None: one residual stream, plain residual adds.
    pub hyper: Option<Box<LayerHyperSpec>>,
    /// Kimi K3's attention-residual queries of the layer's two sublayers (None elsewhere;
    /// Inkling 2 keeps its queries in its attention spec).
    pub attn_res: Option<Box<LayerAttnResSpec>>,
}

/// One attention-residual query as Kimi K3 stores it (`{site}_res_norm.weight` `[H]` and
/// `{site}_res_proj.weight` `[1, H]`): the query is their elementwise product, which scores
/// each RMS-normalized source (`_apply_attn_res` of the release's `modeling_kimi_linear.py`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttnResQuerySpec {
    /// `{site}_res_norm.weight` `[H]`.
    pub norm: TensorSpec,
    /// `{site}_res_proj.weight` `[1, H]`.
    pub proj: TensorSpec,
}

/// A Kimi K3 layer's two attention-residual queries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerAttnResSpec {
    /// Before the attention (`self_attention_res_*`; layer 0's is never read: nothing is
    /// banked yet, so its tensors are optional).
    pub attn: AttnResQuerySpec,
    /// Before the feed-forward block (`mlp_res_*`).
    pub mlp: AttnResQuerySpec,
}

/// A multi-token-prediction layer: DeepSeek-V3, GLM-5, GLM-4.5 decoder layer
/// `num_hidden_layers` of the checkpoint; Inkling's `model.mtp.layers.{k}` (several, chained).
/// Present or absent as a whole, except `embed` and `head` where they are optional
/// (GLM-4.6/4.7: the main model's embedding and lm_head stand in).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MtpSpec {
    /// Its decoder layer (the family's attention; MoE, or Inkling's dense MLP).
    pub layer: LayerSpec,
    /// `embed_tokens.weight` `[vocab, H]` (a copy of the main embedding in the published
    /// checkpoints: DeepSeek-V3 shares it, paper section 2.2); None: the main embedding's rows
    /// as stored, without the main model's `embed_norm` (Inkling, transformers' `MtpModel`).
    pub embed: Option<TensorSpec>,
    /// `enorm.weight` `[H]` (Inkling: `embed_norm.weight`).
    pub enorm: TensorSpec,
    /// `hnorm.weight` `[H]` (Inkling: `hidden_norm.weight`).
    pub hnorm: TensorSpec,
    /// `eh_proj` `[H, 2H]` (Inkling: `input_proj`).
    pub eh_proj: LinearSpec,
    /// The RMSNorm of the layer's output before the head: `shared_head.norm.weight` `[H]`;
    /// Inkling's shared `model.mtp.chain_norm.weight` when `chain_hidden_post_norm`, else None.
    pub head_norm: Option<TensorSpec>,
    /// `shared_head.head.weight` `[vocab, H]` (the shared output head, paper section 2.2,
    /// stored in the layer); None: the main lm_head, with the main model's output scaling.
    pub head: Option<TensorSpec>,
    /// The hidden state comes before the embedding in `eh_proj`'s input (Inkling's
    /// `mtp_hidden_states_first`); DeepSeek-V3 puts the embedding first.
    pub hidden_first: bool,
    /// The next layer of the chain takes this layer's output after `head_norm` (transformers'
    /// `MtpModel` with `shared_post_norm`: Inkling); else before it (vLLM's EAGLE chaining of
    /// `deepseek_mtp`).
    pub chain_normed: bool,
}

/// Every tensor of a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelTensors {
    /// `model.embed_tokens.weight` `[vocab, H]`.
    pub embed: TensorSpec,
    /// An RMSNorm applied to every embedding row (Inkling's `model.llm.embed_norm.weight`
    /// `[H]`, `InklingNormedEmbedding`), None elsewhere.
    pub embed_norm: Option<TensorSpec>,
    /// The decoder layers `0..num_hidden_layers`.
    pub layers: Vec<LayerSpec>,
    /// `model.norm.weight` `[H]`.
    pub final_norm: TensorSpec,
    /// `lm_head.weight` `[vocab, H]`; optional when `tie_word_embeddings` (the embedding
    /// stands in).
    pub lm_head: TensorSpec,
    /// MTP layers (at most one).
    pub mtp: Vec<MtpSpec>,
    /// The attention-residual query of the output (Inkling 2's `model.llm.attn_res.output_query`
    /// `[H]`), None elsewhere.
    pub final_query: Option<TensorSpec>,
    /// Kimi K3's output attention-residual query (`model.output_attn_res_{norm,proj}.weight`),
    /// None elsewhere.
    pub final_res: Option<AttnResQuerySpec>,
    /// The weighted collapse of the residual streams before the final norm (DeepSeek-V4's
    /// `hc_head_fn` `[N, N H]`, `hc_head_base` `[N]`, `hc_head_scale` `[1]`); None: one stream,
    /// or the streams' mean (GLM-5.3-Flash).
    pub hyper_head: Option<HyperConnSpec>,
}

fn push_linear<'a>(out: &mut Vec<&'a TensorSpec>, l: &'a LinearSpec) {
    out.push(&l.weight);
    out.extend(l.bias.as_ref());
}

fn push_mlp<'a>(out: &mut Vec<&'a TensorSpec>, m: &'a MlpSpec) {
    for l in [&m.gate, &m.up, &m.down] {
        push_linear(out, l);
    }
}

impl LayerSpec {
    /// The layer's tensors other than its routed experts, in a fixed order.
    pub fn dense(&self) -> Vec<&TensorSpec> {
        let mut out = vec![&self.input_norm];
        if let Some(r) = &self.attn_res {
            out.extend([&r.attn.norm, &r.attn.proj, &r.mlp.norm, &r.mlp.proj]);
        }
        if let Some(hc) = &self.hyper {
            for c in [&hc.attn, &hc.ffn] {
                out.extend([&c.proj, &c.base, &c.scale]);
            }
        }
        match &self.attention {
            AttentionSpec::Gqa {
                q,
                k,
                v,
                o,
                qk_norm,
                sinks,
                ..
            } => {
                for l in [q, k, v, o] {
                    push_linear(&mut out, l);
                }
                if let QkNormSpec::PerHead { q, k } | QkNormSpec::Full { q, k } = qk_norm {
                    out.extend([q, k]);
                }
                out.extend(sinks.as_ref());
            }
            AttentionSpec::Inkling(a) => {
                for l in [&a.q, &a.k, &a.v, &a.r, &a.o] {
                    push_linear(&mut out, l);
                }
                out.extend([&a.q_norm, &a.k_norm, &a.k_conv, &a.v_conv, &a.rel_proj]);
                out.push(&a.out_conv);
            }
            AttentionSpec::Inkling2(a) => {
                out.extend(a.attn_query.as_ref());
                if let Some((k, v)) = &a.kv_input_norms {
                    out.extend([k, v]);
                }
                for l in [&a.q, &a.k, &a.v, &a.r, &a.o, &a.gate, &a.sink] {
                    push_linear(&mut out, l);
                }
                out.extend([&a.q_scale, &a.rel_scale]);
                for c in [&a.k_conv, &a.v_conv] {
                    match c {
                        KvConvSpec::Static(t) => out.push(t),
                        KvConvSpec::Dynamic { static_w, proj } => {
                            out.push(static_w);
                            push_linear(&mut out, proj);
                        }
                    }
                }
                out.extend([&a.rel_proj, &a.out_conv, &a.mlp_query, &a.mlp_out_conv]);
            }
            AttentionSpec::DeepseekV4(a) => {
                push_linear(&mut out, &a.q_a);
                out.push(&a.q_norm);
                push_linear(&mut out, &a.q_b);
                push_linear(&mut out, &a.kv);
                out.push(&a.kv_norm);
                push_linear(&mut out, &a.o_a);
                push_linear(&mut out, &a.o_b);
                out.push(&a.sinks);
                let ix = a.indexer.as_ref();
                for c in a.compressor.iter().chain(ix.map(|i| &i.compressor)) {
                    push_linear(&mut out, &c.kv);
                    push_linear(&mut out, &c.gate);
                    out.extend([&c.ape, &c.norm]);
                }
                if let Some(i) = ix {
                    push_linear(&mut out, &i.q_b);
                    push_linear(&mut out, &i.weights);
                }
            }
            AttentionSpec::GatedDeltaNet(a) => {
                for l in a.input.linears() {
                    push_linear(&mut out, l);
                }
                out.extend(&a.convs);
                out.extend([&a.dt_bias, &a.a_log, &a.norm]);
                push_linear(&mut out, &a.out);
            }
            AttentionSpec::Mla {
                q,
                kv_a,
                kv_norm,
                kv_b,
                o,
                indexer,
                gate,
            } => {
                match q {
                    MlaQuerySpec::Lora { a, norm, b } => {
                        push_linear(&mut out, a);
                        out.push(norm);
                        push_linear(&mut out, b);
                    }
                    MlaQuerySpec::Direct(l) => push_linear(&mut out, l),
                }
                push_linear(&mut out, kv_a);
                out.push(kv_norm);
                for l in kv_b.linears() {
                    push_linear(&mut out, l);
                }
                push_linear(&mut out, o);
                if let Some(g) = gate {
                    push_linear(&mut out, g);
                }
                if let Some(ix) = indexer {
                    push_linear(&mut out, &ix.wq_b);
                    push_linear(&mut out, &ix.wk);
                    out.extend([&ix.k_norm_weight, &ix.k_norm_bias]);
                    push_linear(&mut out, &ix.weights_proj);
                    if let Some(kp) = &ix.kpool {
                        out.extend([&kp.gate, &kp.ape]);
                    }
                }
            }
        }
        out.push(&self.post_norm);
        match &self.ffn {
            FfnSpec::Dense(m) => push_mlp(&mut out, m),
            FfnSpec::Moe(m) => {
                out.push(&m.router);
                out.extend(m.router_logit_bias.as_ref());
                out.extend(m.router_bias.as_ref());
                out.extend(m.hash_table.as_ref());
                if let Some(s) = &m.shared {
                    push_mlp(&mut out, s);
                }
                out.extend(m.shared_gate.as_ref());
                if let Some(l) = &m.latent {
                    push_linear(&mut out, &l.down);
                    push_linear(&mut out, &l.up);
                    out.extend(l.norm.as_ref());
                }
            }
            FfnSpec::FusedDense(m) => {
                push_linear(&mut out, &m.gate_up);
                push_linear(&mut out, &m.down);
                out.extend([&m.scale, &m.out_conv]);
            }
            FfnSpec::SinkMoe(m) => out.extend([
                &m.router,
                &m.router_bias,
                &m.router_scale,
                &m.shared_gate_up,
                &m.shared_down,
                &m.out_conv,
            ]),
        }
        out
    }

    /// The layer's linear weights outside the routed experts with their role (biases are
    /// not linear weights), in the order of [`LayerSpec::dense`].
    pub fn linear_roles<'a>(&'a self) -> Vec<(&'a TensorSpec, LinearRole)> {
        let mut out = Vec::new();
        let mut add = |l: &'a LinearSpec, r: LinearRole| out.push((&l.weight, r));
        match &self.attention {
            AttentionSpec::Gqa { q, k, v, o, .. } => {
                for l in [q, k, v, o] {
                    add(l, LinearRole::Attention);
                }
            }
            AttentionSpec::Inkling(a) => {
                for l in [&a.q, &a.k, &a.v, &a.r, &a.o] {
                    add(l, LinearRole::Attention);
                }
            }
            AttentionSpec::Inkling2(a) => {
                for l in [&a.q, &a.k, &a.v, &a.r, &a.o, &a.gate, &a.sink] {
                    add(l, LinearRole::Attention);
                }
                for c in [&a.k_conv, &a.v_conv] {
                    if let KvConvSpec::Dynamic { proj, .. } = c {
                        add(proj, LinearRole::Attention);
                    }
                }
            }
            AttentionSpec::GatedDeltaNet(a) => {
                for l in a.input.linears() {
                    add(l, LinearRole::Attention);
                }
                add(&a.out, LinearRole::Attention);
            }
            AttentionSpec::DeepseekV4(a) => {
                for l in [&a.q_a, &a.q_b, &a.kv, &a.o_a, &a.o_b] {
                    add(l, LinearRole::Attention);
                }
                // The compressors' projections ship in BF16 in the FP8 release (transformers'
                // `_keep_in_fp32_modules`): kept as published, like the indexer's weights.
                let ix = a.indexer.as_ref();
                for c in a.compressor.iter().chain(ix.map(|i| &i.compressor)) {
                    add(&c.kv, LinearRole::IndexerWeights);
                    add(&c.gate, LinearRole::IndexerWeights);
                }
                if let Some(i) = ix {
                    add(&i.q_b, LinearRole::Indexer);
                    add(&i.weights, LinearRole::IndexerWeights);
                }
            }
            AttentionSpec::Mla {
                q,
                kv_a,
                kv_b,
                o,
                indexer,
                gate,
                ..
            } => {
                match q {
                    MlaQuerySpec::Lora { a, b, .. } => {
                        add(a, LinearRole::Attention);
                        add(b, LinearRole::Attention);
                    }
                    MlaQuerySpec::Direct(l) => add(l, LinearRole::Attention),
                }
                for l in [kv_a, o]
                    .into_iter()
                    .chain(kv_b.linears())
                    .chain(gate.as_deref())
                {
                    add(l, LinearRole::Attention);
                }
                if let Some(ix) = indexer {
                    add(&ix.wq_b, LinearRole::Indexer);
                    add(&ix.wk, LinearRole::Indexer);
                    add(&ix.weights_proj, LinearRole::IndexerWeights);
                }
            }
        }
        match &self.ffn {
            FfnSpec::Dense(m) => {
                for l in [&m.gate, &m.up, &m.down] {
                    add(l, LinearRole::DenseMlp);
                }
            }
            FfnSpec::Moe(m) => {
                if let Some(s) = &m.shared {
                    for l in [&s.gate, &s.up, &s.down] {
                        add(l, LinearRole::SharedExperts);
                    }
                }
                if let Some(l) = &m.latent {
                    add(&l.down, LinearRole::SharedExperts);
                    add(&l.up, LinearRole::SharedExperts);
                }
            }
            FfnSpec::FusedDense(m) => {
                add(&m.gate_up, LinearRole::DenseMlp);
                add(&m.down, LinearRole::DenseMlp);
            }
            FfnSpec::SinkMoe(m) => {
                out.push((&m.shared_gate_up, LinearRole::SharedExperts));
                out.push((&m.shared_down, LinearRole::SharedExperts));
            }
        }
        out
    }

    /// The layer's routed experts, if it is a MoE layer.
    pub fn experts(&self) -> Option<&ExpertsSpec> {
        match &self.ffn {
            FfnSpec::Moe(m) => Some(&m.experts),
            FfnSpec::SinkMoe(m) => Some(&m.experts),
            FfnSpec::Dense(_) | FfnSpec::FusedDense(_) => None,
        }
    }
}

impl MtpSpec {
    /// The MTP layer's tensors other than its routed experts, in a fixed order.
    pub fn dense(&self) -> Vec<&TensorSpec> {
        let mut out: Vec<&TensorSpec> = self.embed.iter().collect();
        out.extend([&self.enorm, &self.hnorm]);
        push_linear(&mut out, &self.eh_proj);
        out.extend(self.layer.dense());
        out.extend(self.head_norm.iter().chain(&self.head));
        out
    }
}

impl ModelTensors {
    /// The role of every linear weight of the main layers outside the routed experts, by
    /// tensor name ([`LayerSpec::linear_roles`]); MTP layers are not included (their weights
    /// follow the converter's `--mtp`).
    pub fn linear_roles(&self) -> std::collections::HashMap<&str, LinearRole> {
        self.layers
            .iter()
            .flat_map(LayerSpec::linear_roles)
            .map(|(t, r)| (t.name.as_str(), r))
            .collect()
    }

    /// Every tensor other than routed experts (main layers, then MTP layers), in a fixed order.
    pub fn dense(&self) -> Vec<&TensorSpec> {
        let mut out = self.main_dense();
        for m in &self.mtp {
            out.extend(m.dense());
        }
        out
    }

    /// The tensors of the main model other than routed experts (no MTP layer), in a fixed
    /// order: embedding, layers, final norm, lm_head.
    pub fn main_dense(&self) -> Vec<&TensorSpec> {
        let mut out = vec![&self.embed];
        out.extend(self.embed_norm.as_ref());
        for l in &self.layers {
            out.extend(l.dense());
        }
        out.extend(self.final_query.as_ref());
        if let Some(r) = &self.final_res {
            out.extend([&r.norm, &r.proj]);
        }
        if let Some(hh) = &self.hyper_head {
            out.extend([&hh.proj, &hh.base, &hh.scale]);
        }
        out.extend([&self.final_norm, &self.lm_head]);
        out
    }

    /// Every layer's routed experts (main layers, then MTP layers).
    pub fn expert_sets(&self) -> Vec<&ExpertsSpec> {
        self.layers
            .iter()
            .chain(self.mtp.iter().map(|m| &m.layer))
            .filter_map(LayerSpec::experts)
            .collect()
    }
}
