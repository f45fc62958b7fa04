//! `coli export --gguf STORE OUT.gguf`: a store converted from a GGUF written back as a GGUF
//! that llama.cpp loads (`coli_convert::gguf::write`): the source's metadata byte for byte, its
//! tensors in their source order and types, dense tensors from `dense.bin`, the stacked
//! `blk.N.ffn_{gate,up,down}_exps.weight` from every expert's record, one expert at a time
//! (bounded memory). A store made from a single-file GGUF gives back that file's bytes.
//!
//! Stores converted from Hugging Face checkpoints have no GGUF metadata and are refused, as are
//! encodings GGUF has no type for (int4-g64, int8 per row, fp8): say so, naming the store.

use anyhow::{bail, Context};
use coli_convert::gguf::write::{
    blob_alignment, write_gguf, TensorEntry, METADATA_FILE, TENSORS_FILE,
};
use coli_store::{Encoding, ExpertKey};
use std::collections::HashMap;
use std::path::Path;

/// The ggml type id of a store encoding GGUF has, if any.
fn ggml_id(e: Encoding) -> Option<u32> {
    match e {
        Encoding::F32 => Some(0),
        Encoding::Bf16 => Some(30),
        Encoding::Ggml(t) => Some(t.id()),
        _ => None,
    }
}

/// `(layer, matrix index)` of a stacked expert tensor name (`blk.3.ffn_down_exps.weight`;
/// index 3..6: gpt-oss's stacked biases `ffn_{gate,up,down}_exps.bias`).
fn stacked(name: &str) -> Option<(u32, usize)> {
    let rest = name.strip_prefix("blk.")?;
    let (n, rest) = rest.split_once('.')?;
    let m = match rest {
        "ffn_gate_exps.weight" => 0,
        "ffn_up_exps.weight" => 1,
        "ffn_down_exps.weight" => 2,
        "ffn_gate_exps.bias" => 3,
        "ffn_up_exps.bias" => 4,
        "ffn_down_exps.bias" => 5,
        _ => return None,
    };
    Some((n.parse().ok()?, m))
}

/// Runs `coli export --gguf`.
///
/// # Errors
/// A store that does not open, that was not converted from a GGUF, or whose tensors no longer
/// match the listing it kept; I/O errors naming the file. Nothing is left at `out` on error.
pub fn run(store_dir: &Path, out: &Path) -> anyhow::Result<()> {
    let store = crate::options::open_store(store_dir, &coli_store::OpenOptions::default())?;
    let (Some(kv), Some(list)) = (store.file(METADATA_FILE)?, store.file(TENSORS_FILE)?) else {
        bail!(
            "{}: this store was not converted from a GGUF (it has no {METADATA_FILE}): coli export --gguf writes back stores made by `coli-convert FILE.gguf`, whose blocks and metadata are llama.cpp's",
            store_dir.display()
        );
    };
    let source = store
        .manifest()
        .sources
        .first()
        .map_or_else(|| "the file".to_string(), |f| f.name.clone());
    if store.manifest().config["model_type"].as_str() == Some("deepseek_v4") {
        bail!(
            "{}: a store converted from a deepseek4 GGUF holds its hash-routing tables (tid2eid) as f32 ids where the GGUF holds I32 (coli_convert::gguf::arch::derived_values): it is not written back; the source GGUF is {source}",
            store_dir.display()
        );
    }
    if matches!(
        store.manifest().config["model_type"].as_str(),
        Some("kimi_k3" | "kimi_linear" | "glm5_next" | "qwen3_next" | "qwen3_5_moe")
    ) {
        bail!(
            "{}: a store converted from a kimi-k3, kimi-linear, glm5-next, qwen3next or qwen35moe GGUF holds A_log (and K3's attention-residual norms and projections) where the GGUF holds -exp(A_log) (and their fused scores; coli_convert::gguf::arch::derived_values): it is not written back; the source GGUF is {source}",
            store_dir.display()
        );
    }
    let tensors: Vec<TensorEntry> = serde_json::from_slice(&list)
        .with_context(|| format!("{}: files/{TENSORS_FILE}", store_dir.display()))?;
    let config = store.manifest().config.clone();
    if let Some(t) = tensors.iter().find(|t| t.checked_nbytes().is_none()) {
        bail!(
            "{}: files/{TENSORS_FILE} lists tensor {} of type {} with dimensions {:?}, which no GGUF holds: the store's files are damaged (coli-fsck)",
            store_dir.display(),
            t.name,
            t.ggml_type,
            t.dims
        );
    }
    let alignment = blob_alignment(&kv, &store_dir.join("files").join(METADATA_FILE))?;
    // GGUF name -> store dense name.
    let dense: HashMap<String, String> = store
        .manifest()
        .dense
        .iter()
        .filter_map(|d| {
            coli_convert::gguf::arch::gguf_name(&store.manifest().family, &d.name)
                .map(|g| (g, d.name.clone()))
        })
        .collect();
    let experts: HashMap<u32, u32> = store
        .manifest()
        .expert_layers
        .iter()
        .map(|l| (l.layer, l.num_experts))
        .collect();
    for t in &tensors {
        if stacked(&t.name).is_none_or(|(l, _)| !experts.contains_key(&l))
            && !dense.contains_key(&t.name)
        {
            bail!(
                "{}: tensor {} of the source GGUF is not in the store (the conversion did not keep it), so the GGUF cannot be written back whole",
                store_dir.display(),
                t.name
            );
        }
    }
    write_gguf(out, &kv, &tensors, alignment, |i, buf| {
        let t = &tensors[i];
        let check = |e: Encoding| -> coli_convert::Result<()> {
            if ggml_id(e) != Some(t.ggml_type) {
                return Err(coli_convert::ConvertError::Tensor {
                    tensor: t.name.clone(),
                    what: format!(
                        "the store holds it as {}, the GGUF listed type {}: GGUF has no such type",
                        e.name(),
                        t.ggml_type
                    ),
                });
            }
            Ok(())
        };
        let store_err = |e: coli_store::StoreError| coli_convert::ConvertError::Store(e);
        match stacked(&t.name) {
            Some((layer, m)) => {
                for e in 0..experts[&layer] {
                    let x = store
                        .fetch_one(ExpertKey::new(layer, e))
                        .map_err(store_err)?;
                    if m >= 3 {
                        check(Encoding::F32)?;
                        let b = [x.gate_bias(), x.up_bias(), x.down_bias()][m - 3].ok_or_else(
                            || coli_convert::ConvertError::Tensor {
                                tensor: t.name.clone(),
                                what: format!("expert {e}'s record has no biases"),
                            },
                        )?;
                        for v in b {
                            buf.extend_from_slice(&v.to_le_bytes());
                        }
                        continue;
                    }
                    let v = [x.gate(), x.up(), x.down()][m];
                    check(v.encoding())?;
                    buf.extend_from_slice(v.data());
                }
            }
            None => {
                let name = &dense[&t.name];
                let d = store.dense(name).map_err(store_err)?;
                check(d.encoding)?;
                // Rows the GGUF's converter reordered (llama's q/k) go back to its order.
                match coli_convert::gguf::arch::row_permutation(&config, name, d.shape[0]) {
                    Some(perm) => buf.extend_from_slice(&coli_convert::gguf::arch::permute_rows(
                        d.data,
                        &coli_convert::gguf::arch::inverse(&perm),
                    )),
                    None => buf.extend_from_slice(d.data),
                }
            }
        }
        Ok(())
    })
    .with_context(|| format!("writing {}", out.display()))?;
    eprintln!("wrote {} ({} tensors)", out.display(), tensors.len());
    Ok(())
}
