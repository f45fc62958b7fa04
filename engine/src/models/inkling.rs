//! Inkling (`inkling_mm_model`'s language model `inkling_text`), as transformers 5.23
//! `modeling_inkling.py` (tensors and config in `coli_format::spec::inkling`; the math in
//! docs/ARCHITECTURES.md, "inkling"; the blocks in [`crate::layers::inkling`]):
//!
//! - embedding rows RMS-normalized (`embed_norm`);
//! - every layer: `h += attn_sconv(attn(attn_norm(h)))`, `h += mlp_sconv(mlp(mlp_norm(h)))`,
//!   the attention sliding (`swa_*` heads, window) or full (log-scaled logits), the MLP dense
//!   (`w13_dn`, `w2_md`, `global_scale`) or the MoE with the shared-expert sink;
//! - `unembed(norm(h) / logits_mup_width_multiplier)`, logits beyond `unpadded_vocab_size`
//!   set to -inf.
//!
//! No RoPE: the engine's rotary table is an unused placeholder.

use crate::error::{EngineError, Result};
use crate::layers::inkling::{FusedMlp, InklingAttention, ShortConv, SinkMoe};
use crate::layers::{DecoderLayer, Ffn, OutputConvs, Rope, SelfAttn};
use crate::models::{load_moe, OutputScaling, Parts};
use crate::weights::Weights;
use coli_format::spec::{AttentionSpec, FfnSpec, InklingSpec, LayerSpec, TensorSpec};
use coli_format::ModelSpec;

fn config_err(what: String) -> EngineError {
    EngineError::Config {
        file: "config.json".into(),
        what,
    }
}

/// A short convolution from its `[C, 1, K]` weight.
pub(crate) fn conv(w: &mut Weights<'_>, t: &TensorSpec) -> Result<ShortConv> {
    let weight = w.vector(t)?;
    let (channels, kernel) = (t.shape[0], t.shape[t.shape.len() - 1]);
    Ok(ShortConv {
        weight,
        channels,
        kernel,
        divisor: 1.0,
    })
}

/// One scalar tensor (`[1]`).
fn scalar(w: &mut Weights<'_>, t: &TensorSpec) -> Result<f32> {
    Ok(w.vector(t)?[0])
}

/// Loads an Inkling model's weights.
///
/// # Errors
/// Missing or misshapen tensors (named); a spec without Inkling parameters.
pub(crate) fn load<'s>(w: &mut Weights<'s>, spec: &ModelSpec) -> Result<Parts<'s>> {
    let ink: &InklingSpec = spec
        .inkling
        .as_ref()
        .ok_or_else(|| config_err("an inkling_text config without its parameters".into()))?;
    let eps = spec.rms_norm_eps;
    let t = &spec.tensors;
    let embed = w.matrix(&t.embed)?;
    let embed_norm = match &t.embed_norm {
        Some(n) => Some(w.rms_norm(n, eps)?),
        None => None,
    };
    let mut layers = Vec::with_capacity(t.layers.len());
    for l in &t.layers {
        layers.push(load_layer(w, spec, ink, l)?);
    }
    let final_norm = w.rms_norm(&t.final_norm, eps)?;
    let lm_head = w.matrix(&t.lm_head)?;
    let output = OutputScaling {
        divisor: ink.logits_divisor,
        vocab: ink.unpadded_vocab_size,
        softcap: None,
    };
    // The MTP layers, when the store holds them (whole: the converter refuses part of them).
    let present = t.mtp.iter().any(|m| m.dense().iter().any(|x| w.has(x)));
    let mut chain = Vec::new();
    if present {
        for m in &t.mtp {
            chain.push(crate::models::mtp::load_one(
                w,
                spec,
                m,
                (embed, lm_head),
                output,
                |w, l| load_layer(w, spec, ink, l),
            )?);
        }
    }
    let mut chain = chain.into_iter();
    let mtp = chain.next();
    let mtp_chain: Vec<_> = chain.collect();
    Ok(Parts {
        embed,
        embed_norm,
        output,
        layers,
        final_norm,
        lm_head,
        rope: Rope::new(2, 10_000.0),
        mtp,
        mtp_chain,
        blocks: None,
    })
}

/// Decoder layer `l` (a main layer, or an MTP layer's `transformer_block`).
///
/// # Errors
/// Missing or misshapen tensors; a layer spec of another family.
fn load_layer<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    ink: &InklingSpec,
    l: &LayerSpec,
) -> Result<DecoderLayer<'s>> {
    let eps = spec.rms_norm_eps;
    let AttentionSpec::Inkling(a) = &l.attention else {
        return Err(config_err(format!(
            "layer {} has no Inkling attention",
            l.index
        )));
    };
    let d = ink.layer_dims(spec, l.index);
    let attn = InklingAttention {
        q: w.linear(&a.q)?,
        k: w.linear(&a.k)?,
        v: w.linear(&a.v)?,
        r: w.linear(&a.r)?,
        o: w.linear(&a.o)?,
        q_norm: w.rms_norm(&a.q_norm, eps)?,
        k_norm: w.rms_norm(&a.k_norm, eps)?,
        k_conv: conv(w, &a.k_conv)?,
        v_conv: conv(w, &a.v_conv)?,
        rel_proj: w.vector(&a.rel_proj)?,
        d_rel: ink.d_rel,
        extent: d.extent,
        num_heads: d.heads,
        num_kv_heads: d.kv_heads,
        head_dim: d.head_dim,
        window: d.window,
        log_scaling: if d.window.is_none() {
            ink.log_scaling
        } else {
            None
        },
        hidden: spec.hidden_size,
    };
    let (ffn, mlp_conv) = match &l.ffn {
        FfnSpec::FusedDense(m) => (
            Ffn::FusedDense(FusedMlp {
                gate_up: w.linear(&m.gate_up)?,
                down: w.linear(&m.down)?,
                scale: scalar(w, &m.scale)?,
            }),
            &m.out_conv,
        ),
        FfnSpec::SinkMoe(m) => {
            let h = spec.hidden_size;
            let cut = |d: &coli_format::MatrixView<'_>| {
                (0..m.num_shared).all(|e| d.row_range(e * h, (e + 1) * h).is_some())
            };
            let mut shared_down = w.matrix(&m.shared_down)?;
            if shared_down.is_interleaved() && !cut(&shared_down) {
                // The interleaved order cuts between groups of 16 rows only.
                shared_down = w.row_major(&m.shared_down)?;
            }
            if !cut(&shared_down) {
                return Err(config_err(format!(
                    "{}: its {} encoding cannot be cut into the shared experts' [H, I] matrices (FP8 needs H a multiple of 128): convert it with --shared-experts bf16, int8 or int4-g64",
                    m.shared_down.name,
                    shared_down.encoding().name()
                )));
            }
            let moe = coli_format::spec::MoeSpec {
                router: m.router.clone(),
                router_bias: None,
                router_logit_bias: None,
                shared: None,
                shared_gate: None,
                experts: m.experts.clone(),
                hash_table: None,
                latent: None,
            };
            (
                Ffn::SinkMoe(SinkMoe {
                    experts: load_moe(w, spec, &moe)?,
                    bias: w.vector(&m.router_bias)?,
                    scale: ink.route_scale * scalar(w, &m.router_scale)?,
                    num_shared: m.num_shared,
                    shared_gate_up: w.matrix(&m.shared_gate_up)?,
                    shared_down,
                }),
                &m.out_conv,
            )
        }
        _ => return Err(config_err(format!("layer {} has no Inkling MLP", l.index))),
    };
    Ok(DecoderLayer {
        input_norm: w.rms_norm(&l.input_norm, eps)?,
        hyper: None,
        attn_res: None,
        kv_input_norms: None,
        output_convs: Some(OutputConvs {
            attn: conv(w, &a.out_conv)?,
            mlp: conv(w, mlp_conv)?,
        }),
        attn: SelfAttn::Inkling(attn),
        post_norm: w.rms_norm(&l.post_norm, eps)?,
        ffn,
    })
}
