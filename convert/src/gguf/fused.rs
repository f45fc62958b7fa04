//! llama.cpp's fused tensors, read as the tensors they join.
//!
//! `convert_hf_to_gguf.py --fuse-qkv` writes a layer's query, key and value projections as one
//! `blk.N.attn_qkv.{weight,bias}` (`torch.cat([q, k, v], dim=0)`: the rows of q, then k, then v;
//! `conversion/base.py`, `modify_tensors`), for every architecture whose tensor list has
//! `ATTN_QKV` (llama, olmoe, qwen3moe, gpt-oss, glm4moe, minimax-m2, qwen3next, qwen35moe, ...),
//! and `--fuse-gate-up-exps` a MoE layer's stacked gate and up experts as one
//! `blk.N.ffn_gate_up_exps.weight` (`[E, 2 I, H]`: per expert the gate's I rows, then the up
//! projection's; llama.cpp's `build_moe_ffn` views them back as the first and second halves),
//! for qwen3next and qwen35moe. Rows are whole blocks in every ggml type, so each part is a
//! byte range of the fused data and comes out bit for bit as an unfused file holds it.
//!
//! [`split_qkv`] replaces a fused `attn_qkv` by the three tensors the model spec asks for (row
//! ranges of the same bytes), where the spec reads q, k and v of that layer and the file has
//! none of them (Qwen3-Next's and Qwen3.5's Gated DeltaNet layers have an `attn_qkv` of their
//! own, which the spec reads whole). [`ExpertMatrix`] is one of a layer's three expert
//! matrices, a half of `ffn_gate_up_exps` or a whole stacked tensor.

use super::file::{Gguf, TensorInfo};
use crate::error::{ConvertError, Result};
use coli_format::spec::ModelSpec;

/// Rewrites `g`'s tensor map: every fused `blk.N.attn_qkv.{weight,bias}` of a layer whose q, k
/// and v the spec (of `config`) reads and the file lacks becomes `blk.N.attn_q`, `attn_k`,
/// `attn_v` (row ranges of its data, rows as the spec's shapes say), in the map and in the
/// file order (so `coli export --gguf` writes them unfused, which llama.cpp loads as well).
///
/// # Errors
/// [`ConvertError::Tensor`] naming the fused tensor when its rows are not the three parts' sum
/// or its row length is not theirs.
pub fn split_qkv(g: &mut Gguf, spec: &ModelSpec, config: &serde_json::Value) -> Result<()> {
    // The spec's dense tensors by GGUF name: (shape).
    let wanted: std::collections::HashMap<String, &[usize]> = spec
        .tensors
        .dense()
        .into_iter()
        .filter_map(|t| super::arch::gguf_name_in(config, &t.name).map(|n| (n, t.shape.as_slice())))
        .collect();
    let fused: Vec<String> = g
        .tensors
        .keys()
        .filter(|n| {
            n.starts_with("blk.")
                && (n.ends_with(".attn_qkv.weight") || n.ends_with(".attn_qkv.bias"))
        })
        .cloned()
        .collect();
    for name in fused {
        let (stem, suffix) = name.rsplit_once(".attn_qkv.").expect("filtered");
        let parts: Vec<String> = ["q", "k", "v"]
            .iter()
            .map(|p| format!("{stem}.attn_{p}.{suffix}"))
            .collect();
        if parts.iter().any(|p| g.tensors.contains_key(p))
            || !parts.iter().all(|p| wanted.contains_key(p))
        {
            continue;
        }
        let t = g.tensors[&name].clone();
        let shape = t.shape();
        let err = |what: String| ConvertError::Tensor {
            tensor: name.clone(),
            what,
        };
        let rows: Vec<usize> = parts.iter().map(|p| wanted[p][0]).collect();
        let inner: Vec<&[usize]> = parts.iter().map(|p| &wanted[p][1..]).collect();
        if shape.is_empty()
            || shape[0] != rows.iter().sum::<usize>()
            || inner.iter().any(|i| *i != &shape[1..])
        {
            return Err(err(format!(
                "has shape {shape:?}: the fused q, k and v (llama.cpp's --fuse-qkv) of this layer are {:?}, {:?} and {:?}",
                wanted[&parts[0]], wanted[&parts[1]], wanted[&parts[2]]
            )));
        }
        if !t.nbytes.is_multiple_of(shape[0]) {
            return Err(err(format!(
                "holds {} bytes, not a whole number of its {} rows",
                t.nbytes, shape[0]
            )));
        }
        let row_bytes = t.nbytes / shape[0];
        g.tensors.remove(&name);
        if let Some(i) = g.order.iter().position(|n| *n == name) {
            g.order.splice(i..=i, parts.iter().cloned());
        }
        let mut at = 0;
        for (p, r) in parts.into_iter().zip(rows) {
            let mut dims = t.dims.clone();
            *dims.last_mut().expect("not empty") = r as u64;
            g.tensors.insert(
                p.clone(),
                TensorInfo {
                    name: p,
                    dims,
                    ggml_type: t.ggml_type,
                    file: t.file,
                    start: t.start + at * row_bytes,
                    nbytes: r * row_bytes,
                },
            );
            at += r;
        }
    }
    Ok(())
}

/// One of an expert layer's three matrices in a GGUF: part `part` of `parts` equal row ranges
/// of each expert's slice of the stacked tensor `t` (`(0, 1)`: the whole slice; `(0, 2)` /
/// `(1, 2)`: the gate / up half of `ffn_gate_up_exps`).
#[derive(Clone, Copy)]
pub struct ExpertMatrix<'a> {
    /// The stacked tensor.
    pub t: &'a TensorInfo,
    /// Its store encoding.
    pub encoding: coli_format::Encoding,
    /// Which part of each expert's slice, of how many.
    pub part: (usize, usize),
}

impl ExpertMatrix<'_> {
    /// The byte range (offset, length) within `t`'s data of expert `e` of `n`.
    pub fn range(&self, e: usize, n: usize) -> (usize, usize) {
        let per = self.t.nbytes / n / self.part.1;
        ((e * self.part.1 + self.part.0) * per, per)
    }
}

/// The stacked tensors of MoE layer `layer` for gate, up and down, with the part of each
/// expert's slice each takes (`(part, parts)`, as [`ExpertMatrix::part`]): `ffn_gate_exps` /
/// `ffn_up_exps` when the file has either, else both halves of `ffn_gate_up_exps` when it has
/// that (`[E, 2 I, H]`).
pub fn expert_sources(g: &Gguf, layer: u32) -> [(String, (usize, usize)); 3] {
    let [gate, up, down] = super::arch::expert_tensors(layer);
    let fused = format!("blk.{layer}.ffn_gate_up_exps.weight");
    if !g.tensors.contains_key(&gate)
        && !g.tensors.contains_key(&up)
        && g.tensors.contains_key(&fused)
    {
        [(fused.clone(), (0, 2)), (fused, (1, 2)), (down, (0, 1))]
    } else {
        [(gate, (0, 1)), (up, (0, 1)), (down, (0, 1))]
    }
}
