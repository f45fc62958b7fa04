//! Qwen3-Next (`model_type: qwen3_next`), as transformers 5.25 `modeling_qwen3_next.py`
//! (tensors and config in `coli_format::spec::qwen3_next`):
//!
//! - three of every four layers are Gated DeltaNet linear attention
//!   ([`crate::layers::gated_delta`]): a recurrent state per sequence, no keys or values;
//! - the others are grouped-query attention with an output gate (`sigmoid(gate)` times the
//!   attention output before `o_proj`), per-head q/k RMSNorm and partial RoPE;
//! - every MoE layer routes with a softmax top-k (renormalized when `norm_topk_prob`) and adds
//!   a shared expert scaled by `sigmoid(shared_expert_gate . x)`;
//! - every RMSNorm but the gated one stores `w` and multiplies by `1 + w`: the loader folds the
//!   one in (`(1 + w)` in f32, as `Qwen3NextRMSNorm` forms it), so the shared norm computes
//!   the same product.

use crate::error::{EngineError, Result};
use crate::layers::{DecoderLayer, GatedDeltaNet, QkNorm, RmsNorm, Rope, SelfAttn};
use crate::models::{load_attention, load_ffn, load_lm_head, OutputScaling, Parts};
use crate::weights::Weights;
use coli_format::spec::{AttentionSpec, GatedDeltaInput, QkNormSpec, TensorSpec};
use coli_format::ModelSpec;

/// A zero-centred RMSNorm (`1 + w`).
fn offset_norm(w: &mut Weights<'_>, t: &TensorSpec, eps: f32) -> Result<RmsNorm> {
    let mut n = w.rms_norm(t, eps)?;
    for x in &mut n.weight {
        *x += 1.0;
    }
    Ok(n)
}

/// Loads a Qwen3-Next model's weights.
///
/// # Errors
/// Missing or misshapen tensors (named).
pub(crate) fn load<'s>(w: &mut Weights<'s>, spec: &ModelSpec) -> Result<Parts<'s>> {
    let g = spec
        .gated_delta
        .as_ref()
        .ok_or_else(|| EngineError::Config {
            file: "config.json".into(),
            what: "a qwen3_next model without its linear-attention dimensions".into(),
        })?;
    let eps = spec.rms_norm_eps;
    let t = &spec.tensors;
    let embed = w.matrix(&t.embed)?;
    let mut layers = Vec::with_capacity(t.layers.len());
    for l in &t.layers {
        let attn = match &l.attention {
            AttentionSpec::GatedDeltaNet(a) => {
                let GatedDeltaInput::Fused { qkvz, ba } = &a.input;
                let a_log = w.vector(&a.a_log)?;
                SelfAttn::GatedDelta(GatedDeltaNet {
                    qkvz: w.linear(qkvz)?,
                    ba: w.linear(ba)?,
                    conv: w.vector(&a.conv)?,
                    dt_bias: w.vector(&a.dt_bias)?,
                    neg_a: a_log.iter().map(|x| -x.exp()).collect(),
                    norm: w.rms_norm(&a.norm, eps)?,
                    out: w.linear(&a.out)?,
                    key_heads: g.key_heads,
                    value_heads: g.value_heads,
                    key_dim: g.key_head_dim,
                    value_dim: g.value_head_dim,
                    kernel: g.conv_kernel,
                })
            }
            AttentionSpec::Gqa {
                qk_norm: QkNormSpec::PerHead { q, k },
                ..
            } => {
                let (q, k) = (q.clone(), k.clone());
                SelfAttn::Gqa(load_attention(w, spec, l, |w| {
                    Ok(QkNorm::PerHead {
                        q: offset_norm(w, &q, eps)?,
                        k: offset_norm(w, &k, eps)?,
                    })
                })?)
            }
            _ => {
                return Err(EngineError::Config {
                    file: "config.json".into(),
                    what: format!(
                        "qwen3_next layer {} is neither a Gated DeltaNet nor gated attention with per-head q/k norms",
                        l.index
                    ),
                })
            }
        };
        layers.push(DecoderLayer {
            input_norm: offset_norm(w, &l.input_norm, eps)?,
            attn,
            post_norm: offset_norm(w, &l.post_norm, eps)?,
            ffn: load_ffn(w, spec, &l.ffn)?,
            output_convs: None,
        });
    }
    let final_norm = offset_norm(w, &t.final_norm, eps)?;
    let lm_head = load_lm_head(w, spec, embed)?;
    Ok(Parts {
        embed,
        embed_norm: None,
        output: OutputScaling::identity(spec.vocab_size),
        layers,
        final_norm,
        lm_head,
        rope: Rope::new(spec.rotary_dim, spec.rope_theta),
        mtp: None,
        mtp_chain: Vec::new(),
    })
}
