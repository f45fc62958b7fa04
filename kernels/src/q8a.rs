//! Integer-activation products (numerics `q8a`, revision 5; bf16 matrices: `bf16a.rs`): the
//! activations quantized to int8 per block of 32, integer dot products with the weights'
//! integer codes, f32 scales applied per block of 32 columns (int8, int4, mxfp4) or per run of
//! 4 columns (the ggml types) in a fixed order. Every instruction set gives the scalar twin's
//! bits.
//!
//! ## The rule (docs/ENGINE.md, "Precision")
//! Applies to int8 matrices, int4 matrices with group size 32 or a multiple of 64 dividing
//! `cols`, (revision 2) the ggml block types with integer codes (every type but f16) and
//! (revision 3) mxfp4 matrices, with `cols` a multiple of 64 (every other matrix keeps its f32
//! kernel).
//!
//! 1. **Activations**, per token, per block of 32 consecutive columns `B`:
//!    `amax = max |x_c|` (f32); if `amax == 0` then `d = 0` and every `q_c = 0`; else
//!    `inv = 127 / amax` and `d = amax / 127` (f32 divisions, rounded to nearest) and
//!    `q_c = clamp(round_half_even(x_c * inv), -127, 127)` (the product rounded to f32 first).
//! 2. **int8, int4, mxfp4** (revision 5): per row and token, per activation block `B` of 32
//!    columns in column order, `p_B = sum (w_c q_c)` over the block's columns, exact in i32,
//!    with `w_c` the int8 code, the int4 code minus 8, or for mxfp4 twice the e2m1 value
//!    (`E2M1_DOUBLED`, an integer in -12..=12). The block's multiplier is `m_B = d_B` (int8) or
//!    `m_B = d_B * s_g` (int4: the scale of the group holding `B`; mxfp4: `s_B = 2^(e_B - 128)`,
//!    the block's e8m0 scale halved; one f32 rounding). One accumulator from 0.0 becomes
//!    `acc = fma(m_B, p_B, acc)` (one rounding) block after block; int8 then `y = acc * s_row`
//!    (the row scale). (`|p_B| <= 32 * 128 * 127 < 2^24`: exact in f32.) Revisions 1-4 gave
//!    these encodings the ggml types' 16 lanes of 4 columns (step 3), eight times the f32 work
//!    per column of one accumulation per block.
//! 3. **ggml types** (columns in order; each chunk of 64 columns splits into 16 lanes of 4, lane
//!    `j` = columns `4j .. 4j + 3`): each block's integer form (`GgmlType::codes`: codes `q_c`,
//!    a scale `a_g` and for q4_1, q5_1, q2_k, q4_k, q5_k an offset `m_g` per group of 16 or 32
//!    columns, so that the weight is `a_g q_c (+ m_g)`); per lane `p = sum (q_c x_c)` and
//!    `s = sum x_c` (the activation codes), exact in i32; accumulator `j` (of 16, from 0.0)
//!    becomes `acc_j = fma(d_B * a_g, p, acc_j)`, then for a type with offsets
//!    `acc_j = fma(d_B * m_g, s, acc_j)`, chunks in column order. This is llama.cpp's pairing of
//!    its block types with q8 activations, in coli's fixed order (`q8a_x86::ggml_rows`: AVX-512
//!    VNNI or AVX2).
//! 4. **Sum** (ggml types): `v8_i = a_i + a_{i+8}`, `v4_i = v8_i + v8_{i+4}`,
//!    `v2_i = v4_i + v4_{i+2}`, `r = v2_0 + v2_1`.
//!
//! The oracle (tests/fixtures) emulates step 1 exactly in torch float32 and takes the rest as
//! an f64 product of the dequantized weights with `d * q`: steps 2-4 only round in f32.

use coli_format::encoding::mxfp4::{e8m0_half, E2M1_DOUBLED};
use coli_format::encoding::GgmlType;
use coli_format::{Encoding, MatrixView};
use std::borrow::Cow;

/// Columns per activation block (one f32 scale each).
pub const BLOCK: usize = 32;
/// Columns per chunk (16 lanes of 4).
const CHUNK: usize = 64;
/// Lanes per chunk.
pub(crate) const LANES: usize = 16;

/// What the rule needs to know of a matrix's encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// int8 codes, one f32 scale per row.
    Int8,
    /// int4 codes (offset 8), one f32 scale per group of `group` columns.
    Int4 { group: usize },
    /// A ggml block type's integer form (rule step 3).
    Ggml(GgmlType),
    /// mxfp4: e2m1 codes as [`E2M1_DOUBLED`], one e8m0 scale per block of 32 columns.
    Mxfp4,
}

/// The rule's kind for `w`, None when `w` keeps its f32 kernel (see the module doc).
pub(crate) fn kind(w: &MatrixView<'_>) -> Option<Kind> {
    kind_of(w.encoding(), w.cols())
}

/// [`kind`] of a matrix of `encoding` with `cols` columns.
pub(crate) fn kind_of(encoding: Encoding, cols: usize) -> Option<Kind> {
    if cols == 0 || !cols.is_multiple_of(CHUNK) {
        return None;
    }
    match encoding {
        Encoding::Int8 => Some(Kind::Int8),
        Encoding::Int4 { group_size } => {
            let g = group_size as usize;
            (g == 32 || (g > 0 && g.is_multiple_of(CHUNK) && cols.is_multiple_of(g)))
                .then_some(Kind::Int4 { group: g })
        }
        Encoding::Ggml(t) => t.code_group().map(|_| Kind::Ggml(t)),
        Encoding::Mxfp4 => Some(Kind::Mxfp4),
        _ => None,
    }
}

/// Quantized activations of `n` tokens for one matrix kind, in lane order.
pub(crate) struct QAct {
    /// `[n, cols]`: each token's codes in lane order: column `c` at `lane_pos(c)` (int8 and
    /// the ggml types `c`; int4 and mxfp4 per chunk of 64 the even columns, then the odd).
    pub q: Vec<i8>,
    /// `[n, cols / per]`: per lane (ggml types, `per` 4) or per block of 32 (int8, int4,
    /// mxfp4) the block's scale `d`.
    pub d: Vec<f32>,
    /// `[n, cols / per]`: for int8, int4 and mxfp4 per block the sum of its `q` times the
    /// codes' offset in the kernels' unsigned form (int4: -8; int8: -128, for `code + 128`;
    /// mxfp4: -12, for `E2M1_DOUBLED + 12`); for the ggml types per lane the plain sum (their
    /// kernels scale it by the offset each form needs: q4_0's -8, the VNNI codes' -128, a
    /// type's `m_g`).
    pub corr: Vec<i32>,
    pub cols: usize,
    /// Columns per entry of `d` and `corr`.
    per: usize,
}

impl QAct {
    /// Token `t`'s `(q, d, corr)`.
    #[inline]
    pub fn token(&self, t: usize) -> (&[i8], &[f32], &[i32]) {
        let (c, l) = (self.cols, self.cols / self.per);
        (
            &self.q[t * c..(t + 1) * c],
            &self.d[t * l..(t + 1) * l],
            &self.corr[t * l..(t + 1) * l],
        )
    }
}

/// `1.5 * 2^23`: adding and subtracting it rounds an f32 of magnitude below `2^22` to an
/// integer, half to even (the default rounding of the addition), with plain arithmetic that
/// vectorizes (`f32::round_ties_even` is a library call on baseline x86-64).
pub(crate) const ROUND_MAGIC: f32 = 12_582_912.0;

/// Step 1 of the rule for one block of 32: fills `q`, returns `d`. A block holding an
/// infinity gets `d = NaN` and zero codes (the product is then NaN, as the exact kernels' would
/// be); a NaN is skipped by the maximum (`f32::max`) and its own code is 0.
pub(crate) fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 || !amax.is_finite() {
        q.fill(0);
        return if amax == 0.0 { 0.0 } else { f32::NAN };
    }
    let inv = 127.0 / amax;
    for (o, v) in q.iter_mut().zip(x) {
        // |v * inv| <= 127 (+ rounding), so the magic-number rounding applies (with an amax
        // below 127 / f32::MAX, `inv` is infinite: a zero gives NaN, which the clamp keeps and
        // the cast makes 0; any other value saturates to ±127).
        let r = (v * inv + ROUND_MAGIC) - ROUND_MAGIC;
        *o = r.clamp(-127.0, 127.0) as i8;
    }
    amax / 127.0
}

/// [`quantize_block`] with AVX-512 where the CPU has it (`q8a_x86::quantize_block_avx512`: the
/// same codes and `d`, unit-tested against this scalar step; a block holding a NaN takes the
/// scalar step), else the scalar step. `x` and `q` are one block of 32.
#[inline]
fn quantize_block_fast(x: &[f32], q: &mut [i8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            let (xb, qb) = (
                x.try_into().expect("a block of 32"),
                q.try_into().expect("a block of 32"),
            );
            // SAFETY: AVX-512F detected above.
            if let Some(d) = unsafe { crate::q8a_x86::quantize_block_avx512(xb, qb) } {
                return d;
            }
        }
    }
    quantize_block(x, q)
}

/// Quantizes `x` (`[n, cols]`) by step 1 and lays it out in lane order for `kind` (int8 and
/// the ggml types: the column order; int4 and mxfp4: per chunk the even columns, then the odd
/// ones), with per block (or for the ggml types per lane) `d` and `corr`.
pub(crate) fn quantize(kind: Kind, x: &[f32], n: usize, cols: usize) -> QAct {
    let per = if matches!(kind, Kind::Ggml(_)) {
        4
    } else {
        BLOCK
    };
    let units = cols / per;
    let mut out = QAct {
        q: vec![0; n * cols],
        d: vec![0.0; n * units],
        corr: vec![0; n * units],
        cols,
        per,
    };
    let offset = match kind {
        Kind::Int8 => -128,
        Kind::Int4 { .. } => -8,
        Kind::Mxfp4 => -MXFP4_OFFSET,
        Kind::Ggml(_) => 1,
    };
    let mut qn = [0i8; CHUNK];
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        let qt = &mut out.q[t * cols..(t + 1) * cols];
        let dt = &mut out.d[t * units..(t + 1) * units];
        let ct = &mut out.corr[t * units..(t + 1) * units];
        for k in 0..cols / CHUNK {
            let xk = &xt[k * CHUNK..(k + 1) * CHUNK];
            let d0 = quantize_block_fast(&xk[..BLOCK], &mut qn[..BLOCK]);
            let d1 = quantize_block_fast(&xk[BLOCK..], &mut qn[BLOCK..]);
            let qk = &mut qt[k * CHUNK..(k + 1) * CHUNK];
            match kind {
                Kind::Int8 | Kind::Ggml(_) => qk.copy_from_slice(&qn),
                Kind::Int4 { .. } | Kind::Mxfp4 => {
                    for c in 0..CHUNK / 2 {
                        qk[c] = qn[2 * c];
                        qk[CHUNK / 2 + c] = qn[2 * c + 1];
                    }
                }
            }
            if let Kind::Ggml(_) = kind {
                for j in 0..LANES {
                    let s: i32 = qk[4 * j..4 * j + 4].iter().map(|&v| v as i32).sum();
                    ct[k * LANES + j] = s;
                    dt[k * LANES + j] = if j < 8 { d0 } else { d1 };
                }
            } else {
                for (b, d) in [d0, d1].into_iter().enumerate() {
                    let s: i32 = qn[b * BLOCK..(b + 1) * BLOCK]
                        .iter()
                        .map(|&v| v as i32)
                        .sum();
                    ct[2 * k + b] = offset * s;
                    dt[2 * k + b] = d;
                }
            }
        }
    }
    out
}

/// What the SIMD kernels add to an mxfp4 code's integer form to make it an unsigned byte
/// (`0..=24`), as `vpdpbusd` and `vpmaddubsw` need; `QAct::corr` takes it off again.
pub(crate) const MXFP4_OFFSET: i32 = 12;

/// Step 4: the 16 accumulators summed in the rule's order.
#[inline]
pub(crate) fn sum16(a: &[f32; LANES]) -> f32 {
    let v8: [f32; 8] = std::array::from_fn(|i| a[i] + a[i + 8]);
    let v4: [f32; 4] = std::array::from_fn(|i| v8[i] + v8[i + 4]);
    let v2: [f32; 2] = std::array::from_fn(|i| v4[i] + v4[i + 2]);
    v2[0] + v2[1]
}

/// The integer weight of column `c` of a row (its bytes `row`, row-major) of an int8, int4 or
/// mxfp4 matrix: rule step 2's `w_c`.
#[inline]
fn weight(kind: Kind, row: &[u8], c: usize) -> i32 {
    match kind {
        Kind::Int8 => row[c] as i8 as i32,
        _ => {
            let byte = row[c / 2];
            let code = if c.is_multiple_of(2) {
                byte & 15
            } else {
                byte >> 4
            };
            match kind {
                Kind::Mxfp4 => E2M1_DOUBLED[code as usize] as i32,
                _ => code as i32 - 8,
            }
        }
    }
}

/// Column `c`'s position in a token's lane-ordered `q` ([`QAct::q`]).
#[inline]
fn lane_pos(kind: Kind, c: usize) -> usize {
    match kind {
        Kind::Int4 { .. } | Kind::Mxfp4 => {
            let (k, i) = (c / CHUNK, c % CHUNK);
            k * CHUNK + i % 2 * (CHUNK / 2) + i / 2
        }
        _ => c,
    }
}

/// One row of a matrix in the row-major order, for [`dot_scalar`]: its weight bytes, f32
/// scales and e8m0 scales (borrowed from a row-major view, gathered from an interleaved one).
pub(crate) struct ScalarRow<'a> {
    bytes: Cow<'a, [u8]>,
    scales: Cow<'a, [f32]>,
    e8m0: Cow<'a, [u8]>,
    cols: usize,
}

impl<'a> ScalarRow<'a> {
    /// Row `r` of `w`.
    pub(crate) fn new(w: &MatrixView<'a>, r: usize) -> ScalarRow<'a> {
        ScalarRow {
            bytes: w.row_bytes(r),
            scales: w.row_scales(r),
            e8m0: w.row_e8m0(r),
            cols: w.cols(),
        }
    }
}

/// The scalar twin: `row` (of a `kind` matrix) dotted with token `t` of `qa`.
pub(crate) fn dot_scalar(kind: Kind, row: &ScalarRow<'_>, qa: &QAct, t: usize) -> f32 {
    let cols = row.cols;
    let (q, d, _) = qa.token(t);
    if let Kind::Ggml(t) = kind {
        let mut acc = [0f32; LANES];
        let (bs, ts) = (t.block_size(), t.type_size());
        let row = &row.bytes[..];
        let g = t.code_group().expect("kind() admits integer types only");
        let offset = t.has_offset();
        let (mut codes, mut a, mut m) = ([0i8; 256], [0f32; 16], [0f32; 16]);
        for blk in 0..cols / bs {
            t.codes(
                &row[blk * ts..(blk + 1) * ts],
                &mut codes[..bs],
                &mut a,
                &mut m,
            );
            for c0 in (0..bs).step_by(4) {
                let col = blk * bs + c0;
                let (k, j) = (col / CHUNK, (col % CHUNK) / 4);
                let (mut p, mut sx) = (0i32, 0i32);
                for i in 0..4 {
                    let qx = q[col + i] as i32;
                    p += codes[c0 + i] as i32 * qx;
                    sx += qx;
                }
                let dl = d[k * LANES + j];
                acc[j] = (dl * a[c0 / g]).mul_add(p as f32, acc[j]);
                if offset {
                    acc[j] = (dl * m[c0 / g]).mul_add(sx as f32, acc[j]);
                }
            }
        }
        return sum16(&acc);
    }
    // int8, int4, mxfp4: one accumulation per block of 32 (step 2).
    let (scales, e8m0) = (&row.scales, &row.e8m0);
    let row = &row.bytes[..];
    let mut acc = 0f32;
    for b in 0..cols / BLOCK {
        let p: i32 = (b * BLOCK..(b + 1) * BLOCK)
            .map(|c| weight(kind, row, c) * q[lane_pos(kind, c)] as i32)
            .sum();
        let m = match kind {
            Kind::Int4 { group } => d[b] * scales[b * BLOCK / group],
            Kind::Mxfp4 => d[b] * e8m0_half(e8m0[b]),
            _ => d[b],
        };
        acc = m.mul_add(p as f32, acc);
    }
    match kind {
        Kind::Int8 => acc * scales[0],
        _ => acc,
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::{quantize_block, BLOCK};

    /// The AVX-512 step gives the scalar step's codes and `d` bit for bit on random blocks of
    /// every magnitude, with zeros, signed zeros, subnormals, infinities and values on the
    /// rounding boundaries; a block with a NaN is left to the scalar step.
    #[test]
    fn avx512_block_step_is_the_scalar_step() {
        if !std::is_x86_feature_detected!("avx512f") {
            return;
        }
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let specials = [
            0.0,
            -0.0,
            f32::MIN_POSITIVE / 4.0,
            -f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.5,
            -1.5,
            126.5,
            f32::MAX,
        ];
        for round in 0..200_000 {
            let scale = f32::from_bits(((next() % 200 + 27) as u32) << 23);
            let mut x = [0f32; BLOCK];
            for v in &mut x {
                let r = next();
                *v = if r % 17 == 0 {
                    specials[(r >> 8) as usize % specials.len()]
                } else {
                    ((r >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0) * scale
                };
            }
            if round % 1000 == 0 {
                x = [0.0; BLOCK];
                x[(round / 1000) % BLOCK] = -0.0;
            }
            if round % 1000 == 1 {
                // A largest magnitude so small that 127 / amax overflows, beside zeros.
                x = [0.0; BLOCK];
                x[(round / 1000) % BLOCK] = f32::from_bits((next() % (1 << 25)) as u32);
            }
            let (mut a, mut b) = ([0i8; BLOCK], [0i8; BLOCK]);
            let d = quantize_block(&x, &mut a);
            // SAFETY: AVX-512F checked above.
            let Some(e) = (unsafe { crate::q8a_x86::quantize_block_avx512(&x, &mut b) }) else {
                // Left to the scalar step: only a block whose 127 / amax overflows.
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                assert!(!(127.0 / amax).is_finite(), "{x:?}");
                continue;
            };
            assert_eq!((d.to_bits(), a), (e.to_bits(), b), "{x:?}");
        }
        let mut x = [1.0f32; BLOCK];
        x[7] = f32::NAN;
        let mut q = [5i8; BLOCK];
        // SAFETY: as above.
        assert!(unsafe { crate::q8a_x86::quantize_block_avx512(&x, &mut q) }.is_none());
        assert_eq!(q, [5; BLOCK]);
    }
}
