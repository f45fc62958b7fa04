//! The multi-token-prediction (MTP) layer of DeepSeek-V3 / Kimi-K2 / GLM-5 / GLM-4.5: decoder layer
//! `num_hidden_layers` of the checkpoint (`model.layers.{N}.*`), skipped by the normal forward.
//! As transformers 5.23 `MtpLayer` and vLLM's `deepseek_mtp.py` compute it (written up in
//! `docs/MLA.md`, checked by `tests/fixtures/mla_reference.py`):
//!
//! ```text
//! h_i      = main-model hidden state at position i AFTER model.norm            [T, H]
//! e_i      = embed_tokens[t_{i+1}]  (the token after position i)               [T, H]
//! u_i      = eh_proj( cat( RMSNorm(e_i, enorm), RMSNorm(h_i, hnorm) ) )        [T, H]  embedding FIRST
//! g        = DecoderLayer_N(u) at positions i (causal, its own KV cache)
//! logits_i = shared_head.head( RMSNorm(g_i, shared_head.norm) )              [T, vocab]  predicts t_{i+2}
//! ```
//! The DeepSeek-V3 paper's eq. 21 writes the hidden state first; the released weights follow
//! the implementations' order (embedding first). RMSNorm eps is `rms_norm_eps`. The layer's
//! routed experts live in the store like the main layers' (converted with `--mtp`, int8 by
//! default) and go through the same expert cache. The decoder layer is the family's (MLA for
//! DeepSeek-V3 / GLM-5, GQA for GLM-4.5, whose MTP vLLM's `glm4_moe_mtp.py` runs the same way);
//! GLM-4.6/4.7 publish the layer without `embed_tokens` and `shared_head.head`, and the main
//! model's embedding and lm_head stand in. Qwen3-Next and Qwen3.5 (vLLM's `qwen3_next_mtp.py`)
//! name the pieces `pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `fc` and `norm`, share the
//! main embedding and lm_head, and zero-centre the norms as their main model does
//! (`models::rms_norm`).

use crate::error::Result;
use crate::layers::{DecoderLayer, LayerCtx, LayerKv, Linear, RmsNorm};
use crate::models::{rms_norm, OutputScaling};
use crate::weights::Weights;
use coli_format::spec::{LayerSpec, TensorSpec};
use coli_format::MatrixView;
use coli_format::ModelSpec;

/// The loaded MTP layer.
pub struct MtpLayer<'s> {
    /// Its layer index `N = num_hidden_layers`.
    pub layer: usize,
    /// `model.layers.{N}.embed_tokens.weight` `[vocab, H]` (or the main embedding where the
    /// layer has none and the spec allows it).
    pub embed: MatrixView<'s>,
    /// `enorm.weight` `[H]`.
    pub enorm: RmsNorm,
    /// `hnorm.weight` `[H]`.
    pub hnorm: RmsNorm,
    /// `eh_proj.weight` `[H, 2H]`.
    pub eh_proj: Linear<'s>,
    /// The decoder layer (MLA (+ DSA indexer) and the grouped sigmoid MoE).
    pub decoder: DecoderLayer<'s>,
    /// `shared_head.norm.weight` `[H]` (Inkling: the shared `chain_norm`, or none).
    pub norm: Option<RmsNorm>,
    /// `shared_head.head.weight` `[vocab, H]` (or the main lm_head where the layer has none
    /// and the spec allows it).
    pub head: MatrixView<'s>,
    /// How the head's input and rows become logits (Inkling: the main model's muP divisor and
    /// unpadded vocabulary; the identity elsewhere).
    pub output: OutputScaling,
    /// `eh_proj`'s input is `cat(hnorm(h), enorm(e))` (Inkling) rather than
    /// `cat(enorm(e), hnorm(h))`.
    pub hidden_first: bool,
    /// A chained step takes the output after `norm` (Inkling, transformers' `MtpModel`), not
    /// before it (vLLM's EAGLE chaining of `deepseek_mtp`).
    pub chain_normed: bool,
}

/// Loads the MTP layer the spec declares (`num_nextn_predict_layers` 1) when the store holds
/// it; `Ok(None)` when the config declares none or the store holds none of it. A store holding
/// only part of it (written by a converter that did not refuse such checkpoints) runs without
/// it: the missing tensors are named in a warning pushed to `warnings`. `main` is the main
/// model's `(embedding, lm_head)`, standing in for the layer's own where the spec marks them
/// optional and the store has none; `load_layer` loads its decoder layer (the family's
/// attention and MoE block).
///
/// # Errors
/// Misshapen tensors of a present MTP layer, named.
pub(crate) fn load<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    main: (MatrixView<'s>, MatrixView<'s>),
    warnings: &mut Vec<String>,
    load_layer: impl FnOnce(&mut Weights<'s>, &LayerSpec) -> Result<DecoderLayer<'s>>,
) -> Result<Option<MtpLayer<'s>>> {
    let Some(m) = spec.tensors.mtp.first() else {
        return Ok(None);
    };
    let n = m.layer.index;
    let store = w.store();
    let any_dense = m.dense().iter().any(|t| w.has(t));
    let experts = store
        .manifest()
        .expert_layers
        .iter()
        .any(|l| l.layer as usize == n);
    if !any_dense && !experts {
        return Ok(None);
    }
    let mut missing: Vec<&str> = m
        .dense()
        .into_iter()
        .filter(|t| !t.optional && !w.has(t))
        .map(|t| t.name.as_str())
        .collect();
    if !experts {
        missing.push("its routed experts");
    }
    if !missing.is_empty() {
        warnings.push(format!(
            "the store's MTP layer (decoder layer {n}) is incomplete (missing {}): running without multi-token prediction; convert the checkpoint again to include it whole",
            missing.join(", ")
        ));
        return Ok(None);
    }
    Ok(Some(load_one(
        w,
        spec,
        m,
        main,
        OutputScaling::identity(spec.vocab_size),
        load_layer,
    )?))
}

/// Loads MTP layer `m` (its tensors known to be in the store), with the main model's
/// `(embedding, lm_head)` standing in where `m` has none or its optional ones are absent, and
/// `output` the scaling of a head shared with the main model.
///
/// # Errors
/// Missing or misshapen tensors, named.
pub(crate) fn load_one<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    m: &coli_format::spec::MtpSpec,
    main: (MatrixView<'s>, MatrixView<'s>),
    output: OutputScaling,
    load_layer: impl FnOnce(&mut Weights<'s>, &LayerSpec) -> Result<DecoderLayer<'s>>,
) -> Result<MtpLayer<'s>> {
    let own_or = |w: &mut Weights<'s>, t: Option<&TensorSpec>, stand_in: MatrixView<'s>| match t {
        Some(t) if !t.optional || w.has(t) => w.matrix(t),
        _ => Ok(stand_in),
    };
    let head = own_or(w, m.head.as_ref(), main.1)?;
    Ok(MtpLayer {
        layer: m.layer.index,
        embed: own_or(w, m.embed.as_ref(), main.0)?,
        enorm: rms_norm(w, spec, &m.enorm)?,
        hnorm: rms_norm(w, spec, &m.hnorm)?,
        eh_proj: w.linear(&m.eh_proj)?,
        decoder: load_layer(w, &m.layer)?,
        norm: match &m.head_norm {
            Some(t) => Some(rms_norm(w, spec, t)?),
            None => None,
        },
        // A head of its own has its own rows; the main lm_head is scaled as the main model's.
        output: if m.head.is_some() {
            OutputScaling::identity(spec.vocab_size)
        } else {
            output
        },
        head,
        hidden_first: m.hidden_first,
        chain_normed: m.chain_normed,
    })
}

impl MtpLayer<'_> {
    /// f32 values per token of the MTP layer's own KV cache.
    pub fn kv_dim(&self) -> usize {
        self.decoder.attn.kv_dim()
    }

    /// Runs the MTP layer on `n = next_ids.len()` positions `pos0..pos0+n`: `hidden`
    /// (`[n, H]` f32, the main model's hidden states after `model.norm` at those positions)
    /// and `next_ids[i]` (the token following position `pos0 + i`), appending to `kv` (which
    /// must hold `pos0` positions). Returns one `[vocab]` f32 logits row per position (row i
    /// predicts the token two after position `pos0 + i`).
    ///
    /// # Errors
    /// Expert fetch failures.
    ///
    /// # Panics
    /// If `hidden.len() != next_ids.len() * H` or an id is out of the vocabulary (the engine
    /// checks both before calling).
    pub fn forward(
        &self,
        hidden: &[f32],
        next_ids: &[u32],
        pos0: usize,
        kv: &mut LayerKv,
        ctx: &mut LayerCtx<'_, '_>,
    ) -> Result<Vec<Vec<f32>>> {
        let n = next_ids.len();
        let u = self.layer_output(hidden, next_ids, pos0, kv, ctx)?;
        Ok(self.logits(&u, n))
    }

    /// One draft step of speculative decoding: runs the layer as [`MtpLayer::forward`] does on
    /// positions `pos0..pos0+n` but returns only the last position's `[vocab]` logits and its
    /// layer output before `shared_head.norm` (`[H]`, the hidden state a chained step feeds
    /// back, as vLLM's `EagleProposer` does for `deepseek_mtp`).
    ///
    /// # Errors
    /// Expert fetch failures.
    pub fn draft_step(
        &self,
        hidden: &[f32],
        next_ids: &[u32],
        pos0: usize,
        kv: &mut LayerKv,
        ctx: &mut LayerCtx<'_, '_>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let n = next_ids.len();
        let h = self.enorm.weight.len();
        let u = self.layer_output(hidden, next_ids, pos0, kv, ctx)?;
        let last = u[(n - 1) * h..n * h].to_vec();
        let logits = self.logits(&last, 1).pop().expect("one row");
        Ok((logits, self.chained(last)))
    }

    /// What the next step of a chain takes from this layer's output rows `u`: `u` itself, or
    /// `norm(u)` when [`MtpLayer::chain_normed`].
    pub fn chained(&self, u: Vec<f32>) -> Vec<f32> {
        match (&self.norm, self.chain_normed) {
            (Some(norm), true) => {
                let mut out = vec![0f32; u.len()];
                norm.forward(&u, &mut out);
                out
            }
            _ => u,
        }
    }

    /// Runs the layer on `n = next_ids.len()` positions `pos0..pos0+n` as
    /// [`MtpLayer::forward`] does, returning the logits rows and the rows the next layer of a
    /// chain takes ([`MtpLayer::chained`], `[n, H]`).
    ///
    /// # Errors
    /// Expert fetch failures.
    pub fn forward_chained(
        &self,
        hidden: &[f32],
        next_ids: &[u32],
        pos0: usize,
        kv: &mut LayerKv,
        ctx: &mut LayerCtx<'_, '_>,
    ) -> Result<(Vec<Vec<f32>>, Vec<f32>)> {
        let n = next_ids.len();
        let u = self.layer_output(hidden, next_ids, pos0, kv, ctx)?;
        let logits = self.logits(&u, n);
        Ok((logits, self.chained(u)))
    }

    /// `u` = the decoder layer's output (`[n, H]`) for `eh_proj(cat(enorm(e), hnorm(h)))`.
    fn layer_output(
        &self,
        hidden: &[f32],
        next_ids: &[u32],
        pos0: usize,
        kv: &mut LayerKv,
        ctx: &mut LayerCtx<'_, '_>,
    ) -> Result<Vec<f32>> {
        let n = next_ids.len();
        let h = self.enorm.weight.len();
        assert_eq!(hidden.len(), n * h, "MTP hidden states must be [n, H]");
        let mut cat = vec![0f32; n * 2 * h];
        let mut e = vec![0f32; h];
        for (t, &id) in next_ids.iter().enumerate() {
            self.embed.dequantize_row(id as usize, &mut e);
            let row = &mut cat[t * 2 * h..(t + 1) * 2 * h];
            let (first, second) = row.split_at_mut(h);
            let (e_part, h_part) = if self.hidden_first {
                (second, first)
            } else {
                (first, second)
            };
            self.enorm.forward(&e, e_part);
            self.hnorm.forward(&hidden[t * h..(t + 1) * h], h_part);
        }
        let mut u = vec![0f32; n * h];
        self.eh_proj.forward(&cat, n, &mut u);
        self.decoder.forward(&mut u, n, pos0, kv, ctx)?;
        Ok(u)
    }

    /// `shared_head.head(shared_head.norm(u))` for `n` rows of `u`: n `[vocab]` rows (Inkling:
    /// `unembed(u / divisor)`, rows past the unpadded vocabulary -inf).
    fn logits(&self, u: &[f32], n: usize) -> Vec<Vec<f32>> {
        let mut normed = match &self.norm {
            Some(norm) => {
                let mut x = vec![0f32; u.len()];
                norm.forward(u, &mut x);
                x
            }
            None => u.to_vec(),
        };
        if self.output.divisor != 1.0 {
            for v in &mut normed {
                *v /= self.output.divisor;
            }
        }
        let vocab = self.head.rows();
        let mut l = vec![0f32; n * vocab];
        if n == 1 {
            coli_kernels::matvec(&self.head, &normed, &mut l);
        } else {
            coli_kernels::matmul(&self.head, &normed, n, &mut l);
        }
        self.output.softcap_rows(&mut l, vocab);
        l.chunks_exact(vocab)
            .map(|r| {
                let mut r = r.to_vec();
                r[self.output.vocab.min(vocab)..].fill(f32::NEG_INFINITY);
                r
            })
            .collect()
    }
}
