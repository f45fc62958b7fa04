//! Writing a GGUF (version 3) from a store that was converted from one (`coli export --gguf`):
//! the source's metadata key-value pairs byte for byte (kept in the store's files as
//! [`METADATA_FILE`]), its tensors in their source order ([`TENSORS_FILE`]), each tensor's data
//! assembled from the store (dense tensors whole, stacked expert tensors from every expert's
//! record), at offsets aligned to `general.alignment` as llama.cpp's writer places them. A store
//! made from a single-file GGUF exports the same bytes as that file, unless it held fused
//! `attn_qkv` tensors: those come back as the `attn_q`, `attn_k`, `attn_v` they join
//! (`super::fused::split_qkv` lists them so), which llama.cpp loads as well.

use super::file::{type_sizes, Gguf, DEFAULT_ALIGNMENT, MAGIC};
use crate::error::{ConvertError, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

/// The store file holding the source GGUF's key-value pairs: a u64 count (little-endian), then
/// the pairs exactly as the GGUF stored them (`split.*` left out).
pub const METADATA_FILE: &str = "gguf-metadata.kv";
/// The store file listing the source GGUF's tensors in file order ([`TensorEntry`], JSON).
pub const TENSORS_FILE: &str = "gguf-tensors.json";

/// One tensor of the source GGUF, as [`TENSORS_FILE`] lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorEntry {
    /// GGUF name.
    pub name: String,
    /// Dimensions, innermost first.
    pub dims: Vec<u64>,
    /// ggml type id.
    pub ggml_type: u32,
}

impl TensorEntry {
    /// Bytes of its data; None for an unknown type or an overflowing size (a damaged listing).
    pub fn checked_nbytes(&self) -> Option<u64> {
        let (bs, ts, _) = type_sizes(self.ggml_type)?;
        let n = self.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
        (n / bs).checked_mul(ts)
    }

    /// Bytes of its data (a listing checked by [`TensorEntry::checked_nbytes`]).
    pub fn nbytes(&self) -> u64 {
        self.checked_nbytes().unwrap_or(0)
    }
}

/// The two files a GGUF conversion keeps for export: ([`METADATA_FILE`], [`TENSORS_FILE`]).
pub fn export_files(g: &Gguf) -> Vec<(String, Vec<u8>)> {
    let mut kv = (g.kv_raw.len() as u64).to_le_bytes().to_vec();
    for (_, b) in &g.kv_raw {
        kv.extend_from_slice(b);
    }
    let tensors: Vec<TensorEntry> = g
        .order
        .iter()
        .map(|n| {
            let t = &g.tensors[n];
            TensorEntry {
                name: n.clone(),
                dims: t.dims.clone(),
                ggml_type: t.ggml_type,
            }
        })
        .collect();
    vec![
        (METADATA_FILE.to_string(), kv),
        (
            TENSORS_FILE.to_string(),
            serde_json::to_vec_pretty(&tensors).expect("serializes"),
        ),
    ]
}

fn werr(path: &Path, e: std::io::Error) -> ConvertError {
    ConvertError::io(path, e)
}

/// Writes a GGUF to `out` (through `out.partial`, renamed when complete): the key-value blob
/// `kv` (count then pairs, as [`METADATA_FILE`]), the tensor infos of `tensors`, and each
/// tensor's data as `data(i, &mut buf)` fills it (exactly `tensors[i].nbytes()` bytes).
/// `alignment` is the data alignment (`general.alignment`, 32 by default).
///
/// # Errors
/// [`ConvertError::Io`] naming the file; [`ConvertError::Tensor`] when `data` gives a tensor
/// of another length (nothing is then left at `out`).
pub fn write_gguf(
    out: &Path,
    kv: &[u8],
    tensors: &[TensorEntry],
    alignment: u64,
    mut data: impl FnMut(usize, &mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    let partial = crate::pipeline::partial_path(out);
    let r = (|| -> Result<()> {
        let f = std::fs::File::create(&partial).map_err(|e| werr(&partial, e))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        let mut head = Vec::new();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(kv); // key-value count, then the pairs
        let mut off = 0u64;
        for t in tensors {
            head.extend_from_slice(&(t.name.len() as u64).to_le_bytes());
            head.extend_from_slice(t.name.as_bytes());
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ggml_type.to_le_bytes());
            head.extend_from_slice(&off.to_le_bytes());
            off = (off + t.nbytes()).div_ceil(alignment) * alignment;
        }
        let pad = (head.len() as u64).div_ceil(alignment) * alignment - head.len() as u64;
        head.resize(head.len() + pad as usize, 0);
        w.write_all(&head).map_err(|e| werr(&partial, e))?;
        let mut buf = Vec::new();
        for (i, t) in tensors.iter().enumerate() {
            buf.clear();
            data(i, &mut buf)?;
            if buf.len() as u64 != t.nbytes() {
                return Err(ConvertError::Tensor {
                    tensor: t.name.clone(),
                    what: format!(
                        "the store gives {} bytes, the GGUF tensor has {}",
                        buf.len(),
                        t.nbytes()
                    ),
                });
            }
            w.write_all(&buf).map_err(|e| werr(&partial, e))?;
            // Padding after every tensor, the last one too, as ggml's and gguf-py's writers do.
            let pad = t.nbytes().div_ceil(alignment) * alignment - t.nbytes();
            w.write_all(&vec![0u8; pad as usize])
                .map_err(|e| werr(&partial, e))?;
        }
        let f = w.into_inner().map_err(|e| werr(&partial, e.into_error()))?;
        f.sync_all().map_err(|e| werr(&partial, e))?;
        Ok(())
    })();
    if let Err(e) = r {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, out).map_err(|e| werr(out, e))
}

/// `general.alignment` of a key-value blob ([`METADATA_FILE`]), or 32.
///
/// # Errors
/// [`ConvertError::Gguf`] naming `what` when the blob does not parse.
pub fn blob_alignment(kv: &[u8], what: &Path) -> Result<u64> {
    // Parse the blob as the header of a GGUF without tensors.
    let mut b = Vec::with_capacity(kv.len() + 16);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(kv);
    let (kvs, used) = super::file::parse_kv(what, &b)?;
    if used != b.len() {
        return Err(ConvertError::Gguf {
            file: what.to_path_buf(),
            what: format!("{} bytes after the last key-value pair", b.len() - used),
        });
    }
    Ok(kvs
        .get("general.alignment")
        .and_then(super::file::Value::as_u64)
        .unwrap_or(DEFAULT_ALIGNMENT))
}
