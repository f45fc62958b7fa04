//! Fused expert tensors: one checkpoint tensor holds a whole layer's experts (`[E, ...]`,
//! expert-major), as gpt-oss publishes them ([`ExpertStorage`]). [`gather`] cuts expert `e`'s
//! gate `[I, H]`, up `[I, H]` and down `[H, I]` (and their biases) out of them, reading only
//! that expert's byte range of each tensor from the memory map (bounded memory: one expert at a
//! time), de-interleaving gate and up and transposing the input-major BF16 layout, as
//! transformers' `GptOssExperts.forward` reads them:
//!
//! - [`ExpertStorage::FusedMxfp4`]: `gate_up_proj_blocks` `[E, 2I, H/32, 16]` row `2i` is gate
//!   row `i`, row `2i + 1` up row `i` (`gate_up[..., ::2]` / `[..., 1::2]` of the product); each
//!   row's `H/2` bytes and `H/32` e8m0 scales are copied as they are (the store's mxfp4 layout,
//!   docs/FORMAT.md section 6, is the published one: low nibble = even column).
//! - [`ExpertStorage::FusedInterleaved`]: `gate_up_proj` `[E, H, 2I]` (`hidden @ gate_up_proj`):
//!   gate `[i][c] = t[e][c][2i]`, up `[i][c] = t[e][c][2i + 1]`; `down_proj` `[E, I, H]`:
//!   down `[h][i] = t[e][i][h]`.
//! - [`ExpertStorage::FusedW13`] (Inkling): `w13_weight` `[E, 2I, H]`: gate row `i` is row
//!   `2i`, up row `i` row `2i + 1` (transformers' `Interleave(dim=1)`); `w2_weight` `[E, H, I]`
//!   is down as it is.
//! - [`ExpertStorage::FusedW13Mxfp8`] (Inkling 2's MXFP8 releases): as `FusedW13`, each row's
//!   e4m3 codes times `2^(e - 127)` of its block of 32 columns (`w13_weight_scale`,
//!   `w2_weight_scale`), decoded exactly to f32 and encoded as any source (a bf16 store holds
//!   them exactly).
//! - Biases `gate_up_proj_bias` `[E, 2I]` (interleaved the same way) and `down_proj_bias`
//!   `[E, H]`, widened to f32 exactly.

use crate::checkpoint::Checkpoint;
use crate::error::{ConvertError, Result};
use crate::quant::{self, decode, ErrStats, SourceMatrix};
use crate::safetensors::{Dtype, Shard, TensorInfo};
use coli_format::encoding::mxfp4::{E8M0_NAN, MXFP4_BLOCK};
use coli_format::spec::{ExpertStorage, ExpertsSpec};
use coli_format::Encoding;
use coli_store::EncodedMatrix;

/// A byte range of a checkpoint tensor (one expert's slice), for readahead and release.
pub type Region<'a> = (&'a Shard, TensorInfo);

fn terr(tensor: &str, what: impl Into<String>) -> ConvertError {
    ConvertError::Tensor {
        tensor: tensor.to_string(),
        what: what.into(),
    }
}

/// The layout of `set`'s experts as the checkpoint has them: `storage` as the spec declares it,
/// or the other fused layout when the checkpoint holds that one instead (a dequantized BF16
/// gpt-oss whose config.json still declares MXFP4, or the reverse; Inkling 2's experts with or
/// without their MXFP8 scales), or transformers 5's fused
/// [`ExpertStorage::FusedConcat`] when a per-expert family's checkpoint has `gate_up_proj` or
/// `down_proj` instead of expert 0's tensors (one of the two alone is then named as missing).
pub fn resolve_storage(ck: &Checkpoint, set: &ExpertsSpec) -> ExpertStorage {
    let p = &set.prefix;
    match set.storage {
        ExpertStorage::PerExpert(_)
            if !ck.has(&set.tensor_names(0)[0])
                && (ck.has(&format!("{p}.gate_up_proj")) || ck.has(&format!("{p}.down_proj"))) =>
        {
            ExpertStorage::FusedConcat
        }
        ExpertStorage::FusedMxfp4
            if !ck.has(&format!("{p}.gate_up_proj_blocks"))
                && ck.has(&format!("{p}.gate_up_proj")) =>
        {
            ExpertStorage::FusedInterleaved
        }
        ExpertStorage::FusedInterleaved
            if !ck.has(&format!("{p}.gate_up_proj"))
                && ck.has(&format!("{p}.gate_up_proj_blocks")) =>
        {
            ExpertStorage::FusedMxfp4
        }
        ExpertStorage::FusedW13
            if ck.has(&format!("{p}.w13_weight_scale"))
                || ck.has(&format!("{p}.w2_weight_scale")) =>
        {
            ExpertStorage::FusedW13Mxfp8
        }
        ExpertStorage::FusedW13Mxfp8
            if !ck.has(&format!("{p}.w13_weight_scale"))
                && !ck.has(&format!("{p}.w2_weight_scale")) =>
        {
            ExpertStorage::FusedW13
        }
        s => s,
    }
}

/// `--experts auto`: the encoding a store keeps `ck`'s routed experts in bit for bit when its
/// tensors hold them in one (gpt-oss's MXFP4 blocks and DeepSeek-V4's FP4 experts: mxfp4;
/// Inkling 2's MXFP8 codes with their scales: mxfp8), else int4-g64. The tensors decide ([`resolve_storage`]), whatever
/// config.json declares: a dequantized re-release that kept its `quantization_config` gets
/// int4-g64, a re-upload whose config lost it still keeps its MXFP8 experts.
pub fn auto_experts(ck: &Checkpoint) -> Encoding {
    for set in ck.spec.tensors.expert_sets() {
        match resolve_storage(ck, set) {
            ExpertStorage::FusedMxfp4 => return Encoding::Mxfp4,
            ExpertStorage::FusedW13Mxfp8 => return Encoding::Mxfp8,
            // DeepSeek-V4's FP4 experts: MXFP4's bits, one tensor per matrix.
            ExpertStorage::PerExpert(_)
                if ck
                    .get(&set.tensor_names(0)[0])
                    .is_some_and(|(_, i)| i.dtype == crate::safetensors::Dtype::I8) =>
            {
                return Encoding::Mxfp4
            }
            _ => {}
        }
    }
    Encoding::Int4 { group_size: 64 }
}

/// Checks the fused tensors of `set` (with `storage`) against the spec: present, shapes, dtypes
/// (U8 for MXFP4 blocks and scales; BF16, F16 or F32 otherwise). Returns their names.
///
/// # Errors
/// [`ConvertError::Tensor`] naming the tensor.
pub fn check(ck: &Checkpoint, set: &ExpertsSpec, storage: ExpertStorage) -> Result<Vec<String>> {
    let spec = ExpertsSpec {
        storage,
        ..set.clone()
    };
    if matches!(
        storage,
        ExpertStorage::FusedMxfp4 | ExpertStorage::FusedW13Mxfp8
    ) && (!set.hidden.is_multiple_of(MXFP4_BLOCK)
        || !set.intermediate.is_multiple_of(MXFP4_BLOCK))
    {
        let first = match storage {
            ExpertStorage::FusedW13Mxfp8 => "w13_weight",
            _ => "gate_up_proj_blocks",
        };
        return Err(terr(
            &format!("{}.{first}", set.prefix),
            format!(
                "MX experts (blocks of 32 columns) need hidden_size ({}) and intermediate_size ({}) to be multiples of 32",
                set.hidden, set.intermediate
            ),
        ));
    }
    let mut names = Vec::new();
    for (name, shape, dtype) in spec.fused_tensors() {
        let Some((shard, info)) = ck.get(&name) else {
            return Err(terr(
                &name,
                format!(
                    "missing from the checkpoint (layer {} fused experts, {} experts per config.json): is a shard absent?",
                    set.layer, set.count
                ),
            ));
        };
        if info.shape != shape {
            return Err(terr(
                &name,
                format!(
                    "shape {:?} in {}, expected {shape:?} (num_local_experts {}, hidden_size {}, intermediate_size {} from config.json)",
                    info.shape, shard.name, set.count, set.hidden, set.intermediate
                ),
            ));
        }
        let ok = match dtype {
            Some("U8") => info.dtype == Dtype::U8,
            Some("F8_E4M3") => info.dtype == Dtype::F8E4M3,
            _ => matches!(info.dtype, Dtype::Bf16 | Dtype::F16 | Dtype::F32),
        };
        if !ok {
            return Err(terr(
                &name,
                format!(
                    "is {} in {}, expected {}",
                    info.dtype.name(),
                    shard.name,
                    dtype.unwrap_or("BF16, F16 or F32")
                ),
            ));
        }
        names.push(name);
    }
    Ok(names)
}

/// Expert `e`'s byte range of the fused tensor `name` (`[E, ...]`, expert-major).
fn slice<'a>(ck: &'a Checkpoint, name: &str, e: u32, count: u32) -> Result<(Region<'a>, &'a [u8])> {
    let (shard, info) = ck
        .get(name)
        .ok_or_else(|| terr(name, "missing from the checkpoint"))?;
    let per = info.nbytes() / count as usize;
    let start = info.start + per * e as usize;
    let sub = TensorInfo {
        dtype: info.dtype,
        shape: info.shape[1..].to_vec(),
        start,
        end: start + per,
    };
    let data = &shard.data(info)[per * e as usize..per * (e as usize + 1)];
    Ok(((shard, sub), data))
}

/// The byte ranges expert `e` reads from the fused tensors `names` (readahead, release and
/// progress of skipped experts).
pub fn regions<'a>(ck: &'a Checkpoint, names: &[String], e: u32, count: u32) -> Vec<Region<'a>> {
    names
        .iter()
        .filter_map(|n| slice(ck, n, e, count).ok().map(|(r, _)| r))
        .collect()
}

/// One expert cut out of the fused tensors, encoded.
pub struct Gathered<'a> {
    /// gate, up, down, each with its bias.
    pub mats: Vec<EncodedMatrix>,
    /// Error sums per matrix (zero for copied MXFP4).
    pub stats: ErrStats,
    /// The byte ranges read.
    pub regions: Vec<Region<'a>>,
    /// Source bytes read.
    pub bytes_in: u64,
}

/// An MX matrix: `rows` rows of code bytes (`cols / 2` for MXFP4, `cols` for MXFP8) and
/// `cols / 32` e8m0 scales.
struct MxRows {
    data: Vec<u8>,
    scales: Vec<u8>,
}

/// Rows `rows` (in order) of expert slices `blocks` / `scales` whose rows are `cols` wide,
/// `per_byte` codes per byte (2 for MXFP4, 1 for MXFP8).
fn mx_rows(
    blocks: &[u8],
    scales: &[u8],
    cols: usize,
    per_byte: usize,
    rows: impl Iterator<Item = usize>,
) -> MxRows {
    let (rb, rs) = (cols / per_byte, cols / MXFP4_BLOCK);
    let mut m = MxRows {
        data: Vec::new(),
        scales: Vec::new(),
    };
    for r in rows {
        m.data.extend_from_slice(&blocks[r * rb..(r + 1) * rb]);
        m.scales.extend_from_slice(&scales[r * rs..(r + 1) * rs]);
    }
    m
}

/// One MX matrix of an expert (`native`: mxfp4 or mxfp8, its rows `m`) in `encoding`
/// ([`quant::encode_mx`]).
///
/// # Errors
/// As [`quant::encode_mx`].
fn mx_matrix(
    ck: &Checkpoint,
    name: &str,
    native: Encoding,
    m: MxRows,
    rows: usize,
    cols: usize,
    encoding: Encoding,
) -> Result<(EncodedMatrix, ErrStats)> {
    let file = ck
        .get(name)
        .map(|(s, _)| s.path.as_path())
        .unwrap_or(ck.dir.as_path());
    quant::encode_mx(name, file, native, (rows, cols), m.data, m.scales, encoding)
}

/// Refuses an e8m0 NaN code (0xFF) among expert `e`'s scale slices (`(tensor, shard, bytes)`),
/// naming the tensor, the position and the shard.
///
/// # Errors
/// [`ConvertError::Tensor`] for the first NaN scale.
fn refuse_nan_scales<const N: usize>(e: u32, scales: [(&String, &Shard, &[u8]); N]) -> Result<()> {
    for (name, shard, s) in scales {
        if let Some(k) = s.iter().position(|&x| x == E8M0_NAN) {
            return Err(terr(
                name,
                format!(
                    "e8m0 scale {k} of expert {e} ({}) is the NaN code 0xFF",
                    shard.name
                ),
            ));
        }
    }
    Ok(())
}

/// Widens `n` values `idx(k)` of a bias slice to f32, refusing NaN/Inf.
fn bias(
    name: &str,
    file: &std::path::Path,
    dtype: Dtype,
    data: &[u8],
    n: usize,
    idx: impl Fn(usize) -> usize,
) -> Result<Vec<f32>> {
    let v: Vec<f32> = (0..n).map(|k| decode(dtype, data, idx(k))).collect();
    if let Some(k) = v.iter().position(|x| !x.is_finite()) {
        return Err(ConvertError::NonFinite {
            tensor: name.to_string(),
            file: file.to_path_buf(),
            position: format!("element {} of this expert", idx(k)),
            value: format!("{}", v[k]),
        });
    }
    Ok(v)
}

/// Cuts expert `e` out of `set`'s fused tensors (`storage`, names from [`check`]) and encodes
/// its matrices into `encoding`: mxfp4 copies MXFP4 blocks and scales as published (refusing the
/// e8m0 NaN code 255, naming the tensor); any other encoding quantizes the decoded values
/// (MXFP4 decoded exactly, docs/FORMAT.md section 6) as for per-expert tensors.
///
/// # Errors
/// [`ConvertError::Tensor`] for an e8m0 NaN scale or an encoding the source cannot give (mxfp4
/// from BF16); [`ConvertError::NonFinite`] for NaN/Inf values.
pub fn gather<'a>(
    ck: &'a Checkpoint,
    set: &ExpertsSpec,
    storage: ExpertStorage,
    e: u32,
    encoding: Encoding,
) -> Result<Gathered<'a>> {
    let (h, i, n, p) = (set.hidden, set.intermediate, set.count, &set.prefix);
    let mut regions = Vec::new();
    let mut take = |name: String| -> Result<(String, &'a Shard, Dtype, &'a [u8])> {
        let ((shard, info), data) = slice(ck, &name, e, n)?;
        let dtype = info.dtype;
        regions.push((shard, info));
        Ok((name, shard, dtype, data))
    };
    let mut stats = ErrStats::default();
    let mut mats: Vec<EncodedMatrix> = Vec::with_capacity(3);
    match storage {
        ExpertStorage::FusedMxfp4 => {
            let (gbn, _, _, gb) = take(format!("{p}.gate_up_proj_blocks"))?;
            let (gsn, gss, _, gs) = take(format!("{p}.gate_up_proj_scales"))?;
            let (dbn, _, _, db) = take(format!("{p}.down_proj_blocks"))?;
            let (dsn, dss, _, ds) = take(format!("{p}.down_proj_scales"))?;
            refuse_nan_scales(e, [(&gsn, gss, gs), (&dsn, dss, ds)])?;
            let parts = [
                (mx_rows(gb, gs, h, 2, (0..i).map(|r| 2 * r)), i, h, &gbn),
                (mx_rows(gb, gs, h, 2, (0..i).map(|r| 2 * r + 1)), i, h, &gbn),
                (mx_rows(db, ds, i, 2, 0..h), h, i, &dbn),
            ];
            for (m, rows, cols, name) in parts {
                let (em, st) = mx_matrix(ck, name, Encoding::Mxfp4, m, rows, cols, encoding)?;
                stats.add(st);
                mats.push(em);
            }
        }
        ExpertStorage::FusedConcat => {
            // gate = rows 0..I, up = rows I..2I of the expert's [2I, H]; down its [H, I].
            let (gun, gush, gud, gu) = take(format!("{p}.gate_up_proj"))?;
            let (dn, dsh, dd, d) = take(format!("{p}.down_proj"))?;
            let half = i * h * gud.size();
            let parts = [
                (&gu[..half], i, h, &gun, gush, gud),
                (&gu[half..], i, h, &gun, gush, gud),
                (d, h, i, &dn, dsh, dd),
            ];
            for (bytes, rows, cols, name, shard, dtype) in parts {
                let (enc, st) = encode_slice(name, shard, dtype, rows, cols, bytes, encoding)?;
                stats.add(st);
                mats.push(enc);
            }
        }
        ExpertStorage::FusedInterleaved => {
            let (gun, gush, gud, gu) = take(format!("{p}.gate_up_proj"))?;
            let (dn, dsh, dd, d) = take(format!("{p}.down_proj"))?;
            let sz = gud.size();
            // gate/up [i][c] = t[c][2i + half], down [r][c] = t[c][r] (t = the expert's slice).
            let gather_t = |src: &[u8],
                            sz: usize,
                            rows: usize,
                            cols: usize,
                            stride: usize,
                            col_of: &dyn Fn(usize) -> usize| {
                let mut out = Vec::with_capacity(rows * cols * sz);
                for r in 0..rows {
                    let j = col_of(r);
                    for c in 0..cols {
                        let at = (c * stride + j) * sz;
                        out.extend_from_slice(&src[at..at + sz]);
                    }
                }
                out
            };
            let parts = [
                (
                    gather_t(gu, sz, i, h, 2 * i, &|r| 2 * r),
                    i,
                    h,
                    &gun,
                    gush,
                    gud,
                ),
                (
                    gather_t(gu, sz, i, h, 2 * i, &|r| 2 * r + 1),
                    i,
                    h,
                    &gun,
                    gush,
                    gud,
                ),
                (gather_t(d, dd.size(), h, i, h, &|r| r), h, i, &dn, dsh, dd),
            ];
            for (bytes, rows, cols, name, shard, dtype) in parts {
                let (enc, st) = encode_slice(name, shard, dtype, rows, cols, &bytes, encoding)?;
                stats.add(st);
                mats.push(enc);
            }
        }
        ExpertStorage::FusedW13 => {
            // gate = even rows, up = odd rows of the expert's [2I, H]; down its [H, I].
            let (gun, gush, gud, gu) = take(format!("{p}.w13_weight"))?;
            let (dn, dsh, dd, d) = take(format!("{p}.w2_weight"))?;
            let row = h * gud.size();
            let rows_of = |parity: usize| -> Vec<u8> {
                (0..i)
                    .flat_map(|r| &gu[(2 * r + parity) * row..(2 * r + parity + 1) * row])
                    .copied()
                    .collect()
            };
            let parts = [
                (rows_of(0), i, h, &gun, gush, gud),
                (rows_of(1), i, h, &gun, gush, gud),
                (d.to_vec(), h, i, &dn, dsh, dd),
            ];
            for (bytes, rows, cols, name, shard, dtype) in parts {
                let (enc, st) = encode_slice(name, shard, dtype, rows, cols, &bytes, encoding)?;
                stats.add(st);
                mats.push(enc);
            }
        }
        ExpertStorage::FusedW13Mxfp8 => {
            let (gun, gush, _, gu) = take(format!("{p}.w13_weight"))?;
            let (gsn, gss, _, gs) = take(format!("{p}.w13_weight_scale"))?;
            let (dn, dsh, _, d) = take(format!("{p}.w2_weight"))?;
            let (dsn, dss, _, ds) = take(format!("{p}.w2_weight_scale"))?;
            refuse_nan_scales(e, [(&gsn, gss, gs), (&dsn, dss, ds)])?;
            // e4m3 NaN codes are refused by name, whether the codes are copied or decoded.
            for (name, shard, codes) in [(&gun, gush, gu), (&dn, dsh, d)] {
                if let Some(k) = codes.iter().position(|&c| c & 0x7F == 0x7F) {
                    return Err(ConvertError::NonFinite {
                        tensor: name.to_string(),
                        file: shard.path.clone(),
                        position: format!("expert {e} element {k} (e4m3 code 0x{:02X})", codes[k]),
                        value: "NaN".into(),
                    });
                }
            }
            let parts = [
                (mx_rows(gu, gs, h, 1, (0..i).map(|r| 2 * r)), i, h, &gun),
                (mx_rows(gu, gs, h, 1, (0..i).map(|r| 2 * r + 1)), i, h, &gun),
                (mx_rows(d, ds, i, 1, 0..h), h, i, &dn),
            ];
            for (m, rows, cols, name) in parts {
                let (em, st) = mx_matrix(ck, name, Encoding::Mxfp8, m, rows, cols, encoding)?;
                stats.add(st);
                mats.push(em);
            }
        }
        ExpertStorage::PerExpert(_) => unreachable!("per-expert tensors are not fused"),
    }
    if set.biases {
        let (gbn, gbs, gbd, gb) = take(format!("{p}.gate_up_proj_bias"))?;
        let (dbn, dbs, dbd, db) = take(format!("{p}.down_proj_bias"))?;
        mats[0].bias = Some(bias(&gbn, &gbs.path, gbd, gb, i, |k| 2 * k)?);
        mats[1].bias = Some(bias(&gbn, &gbs.path, gbd, gb, i, |k| 2 * k + 1)?);
        mats[2].bias = Some(bias(&dbn, &dbs.path, dbd, db, h, |k| k)?);
    }
    let bytes_in = regions.iter().map(|(_, t)| t.nbytes() as u64).sum();
    Ok(Gathered {
        mats,
        stats,
        regions,
        bytes_in,
    })
}

/// Encodes a `[rows, cols]` matrix cut from the fused tensor `name` (its bytes in `dtype`).
fn encode_slice(
    name: &str,
    shard: &Shard,
    dtype: Dtype,
    rows: usize,
    cols: usize,
    bytes: &[u8],
    encoding: Encoding,
) -> Result<(EncodedMatrix, ErrStats)> {
    let src = SourceMatrix {
        name,
        file: &shard.path,
        dtype,
        rows,
        cols,
        data: bytes,
        scales: None,
    };
    quant::encode(&src, encoding)
}
