//! Encoding id 7, `ggml`: llama.cpp's block types, kept bit for bit as a GGUF file stores them
//! (format version 4; the i-quants and GGUF's mxfp4 version 6; docs/FORMAT.md section 6). The group size field holds the ggml type id
//! (`GGMLQuantizationType` in gguf-py's `constants.py`, `enum ggml_type` in ggml.h), so
//! `(7, 12)` is `q4_k`. A row of `cols` weights is `cols / block_size` blocks of `type_size`
//! bytes (the row-major layout of a GGUF tensor whose `ne[0]` is `cols`); `cols` must be a
//! multiple of the type's block size. There is no scale section: each block carries its own
//! scales.
//!
//! One module per type defines its block layout and its reference decode. The decode is
//! gguf-py's numpy dequantization (`gguf.quants.<TYPE>.dequantize_blocks`, gguf 0.19) operation
//! by operation in f32 (the same products and differences, each rounded once, never fused), so
//! a decoded row equals gguf-py's bit for bit; `format/tests/ggml_gguf_py.rs` checks it against
//! vectors gguf-py wrote (`tests/fixtures/gguf/make_ggml_vectors.py`). The i-quants (iq1_*,
//! iq2_*, iq3_*) define only their integer form ([`GgmlType::codes`]: signed grid values, 8
//! at a time in a u64) and decode through it, `a * q` rounded once, which is gguf-py's value
//! (see `decode_from_codes`).
//!
//! Stores copy these blocks from a GGUF; no f32 value is ever encoded into them here, so
//! [`Codec::encode_row`] returns `None`.

mod f16;
mod iq1_m;
mod iq1_s;
mod iq2_s;
mod iq2_xs;
mod iq2_xxs;
mod iq3_s;
mod iq3_xxs;
mod iq4_nl;
mod iq4_xs;
mod iq_grids;
mod mxfp4;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;

use super::{Codec, ErrSums};
use crate::MatrixView;

/// Weights per block of the k-quants and IQ4_XS (`QK_K` in ggml).
pub const QK_K: usize = 256;

/// A ggml block type coli stores and decodes. The discriminant is the ggml type id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[repr(u16)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    /// IEEE half precision, one weight per 2 bytes.
    F16 = 1,
    /// 32 weights: f16 `d`, 16 bytes of 4-bit codes; `w = d * (q - 8)`.
    Q4_0 = 2,
    /// 32 weights: f16 `d`, f16 `m`, 16 bytes of 4-bit codes; `w = d * q + m`.
    Q4_1 = 3,
    /// 32 weights: f16 `d`, u32 of high bits, 16 bytes of low nibbles; `w = d * (q - 16)`.
    Q5_0 = 6,
    /// 32 weights: f16 `d`, f16 `m`, u32 of high bits, 16 bytes of low nibbles; `w = d * q + m`.
    Q5_1 = 7,
    /// 32 weights: f16 `d`, 32 signed bytes; `w = q * d`.
    Q8_0 = 8,
    /// 256 weights in 16 groups of 16 with 4-bit scales and mins, 2-bit codes.
    Q2_K = 10,
    /// 256 weights in 16 groups of 16 with 6-bit signed scales, 3-bit codes.
    Q3_K = 11,
    /// 256 weights in 8 groups of 32 with 6-bit scales and mins, 4-bit codes.
    Q4_K = 12,
    /// 256 weights in 8 groups of 32 with 6-bit scales and mins, 5-bit codes.
    Q5_K = 13,
    /// 256 weights in 16 groups of 16 with 8-bit signed scales, 6-bit codes.
    Q6_K = 14,
    /// 256 weights, 2.06 bits each: per 8 weights an 8-bit index into a lattice of values
    /// 8, 25, 43 and 7 sign bits; a 4-bit scale per 32.
    IQ2_XXS = 16,
    /// 256 weights, 2.31 bits each: per 8 weights a 9-bit lattice index and 7 sign bits; a
    /// 4-bit scale per 16.
    IQ2_XS = 17,
    /// 256 weights, 3.06 bits each: per 4 weights an 8-bit index into a lattice of values
    /// 4 .. 62; 7 sign bits per 8; a 4-bit scale per 32.
    IQ3_XXS = 18,
    /// 256 weights, 1.56 bits each: per 8 weights an 11-bit index into a lattice of -1, 0, 1;
    /// a 3-bit scale and a shift of +-1/8 per 32.
    IQ1_S = 19,
    /// 32 weights: f16 `d`, 16 bytes of 4-bit indices into a non-linear table.
    IQ4_NL = 20,
    /// 256 weights, 3.44 bits each: per 4 weights a 9-bit index into a lattice of odd values
    /// 1 .. 15; a sign bit per weight; a 4-bit scale per 32.
    IQ3_S = 21,
    /// 256 weights, 2.56 bits each: per 8 weights a 10-bit lattice index (values 8, 25, 43)
    /// and 8 sign bits; a 4-bit scale per 16.
    IQ2_S = 22,
    /// 256 weights in 8 groups of 32 with 6-bit signed scales, IQ4_NL's table.
    IQ4_XS = 23,
    /// 256 weights, 1.75 bits each: per 8 weights an 11-bit index into iq1_s's lattice and a
    /// shift of +-1/8; a 3-bit scale per 16; the f16 `d` spread over the scales' top bits.
    IQ1_M = 29,
    /// 32 weights: an e8m0 exponent and 16 bytes of e2m1 codes (OCP MXFP4 as GGUF stores it).
    MXFP4 = 39,
}

/// Every type, in id order.
pub const ALL: [GgmlType; 21] = [
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ3_XXS,
    GgmlType::IQ1_S,
    GgmlType::IQ4_NL,
    GgmlType::IQ3_S,
    GgmlType::IQ2_S,
    GgmlType::IQ4_XS,
    GgmlType::IQ1_M,
    GgmlType::MXFP4,
];

impl GgmlType {
    /// The type with ggml id `id`, if coli decodes it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        ALL.into_iter().find(|t| *t as u32 == id)
    }

    /// The ggml type id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Weights per block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4_NL
            | GgmlType::MXFP4 => 32,
            _ => QK_K,
        }
    }

    /// Bytes per block (gguf-py's `GGML_QUANT_SIZES`).
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F16 => 2,
            GgmlType::Q4_0 | GgmlType::IQ4_NL => 2 + 16,
            GgmlType::Q4_1 => 2 + 2 + 16,
            GgmlType::Q5_0 => 2 + 4 + 16,
            GgmlType::Q5_1 => 2 + 2 + 4 + 16,
            GgmlType::Q8_0 => 2 + 32,
            GgmlType::Q2_K => 2 + 2 + QK_K / 16 + QK_K / 4,
            GgmlType::Q3_K => 2 + QK_K / 4 + QK_K / 8 + 12,
            GgmlType::Q4_K => 2 + 2 + QK_K / 2 + 12,
            GgmlType::Q5_K => 2 + 2 + QK_K / 2 + QK_K / 8 + 12,
            GgmlType::Q6_K => 2 + QK_K / 2 + QK_K / 4 + QK_K / 16,
            GgmlType::IQ4_XS => 2 + 2 + QK_K / 2 + QK_K / 64,
            GgmlType::IQ2_XXS => 2 + QK_K / 4,
            GgmlType::IQ2_XS => 2 + QK_K / 4 + QK_K / 32,
            GgmlType::IQ2_S => 2 + QK_K / 4 + QK_K / 16,
            GgmlType::IQ3_XXS => 2 + 3 * QK_K / 8,
            GgmlType::IQ3_S => 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4,
            GgmlType::IQ1_S => 2 + QK_K / 8 + QK_K / 16,
            GgmlType::IQ1_M => QK_K / 8 + QK_K / 16 + QK_K / 32,
            GgmlType::MXFP4 => 1 + 16,
        }
    }

    /// llama.cpp's name of the type, lower case (`q4_k`, `iq4_xs`, `f16`).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F16 => "f16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q2_K => "q2_k",
            GgmlType::Q3_K => "q3_k",
            GgmlType::Q4_K => "q4_k",
            GgmlType::Q5_K => "q5_k",
            GgmlType::Q6_K => "q6_k",
            GgmlType::IQ4_NL => "iq4_nl",
            GgmlType::IQ4_XS => "iq4_xs",
            GgmlType::IQ2_XXS => "iq2_xxs",
            GgmlType::IQ2_XS => "iq2_xs",
            GgmlType::IQ2_S => "iq2_s",
            GgmlType::IQ3_XXS => "iq3_xxs",
            GgmlType::IQ3_S => "iq3_s",
            GgmlType::IQ1_S => "iq1_s",
            GgmlType::IQ1_M => "iq1_m",
            // coli's own encoding id 6 is `mxfp4`; this is the GGUF block layout.
            GgmlType::MXFP4 => "mxfp4_gguf",
        }
    }

    /// The oldest store format version that holds this type: 4 for the types of version 4
    /// (f16, q4_0 .. q6_k, iq4_nl, iq4_xs), 6 for the i-quants iq1_s .. iq3_s and GGUF's mxfp4
    /// (docs/FORMAT.md section 12).
    pub fn min_format_version(self) -> u32 {
        match self {
            GgmlType::IQ2_XXS
            | GgmlType::IQ2_XS
            | GgmlType::IQ2_S
            | GgmlType::IQ3_XXS
            | GgmlType::IQ3_S
            | GgmlType::IQ1_S
            | GgmlType::IQ1_M
            | GgmlType::MXFP4 => 6,
            _ => 4,
        }
    }

    /// gguf-py's and llama.cpp's name of the type, upper case as GGUF tools print it (`Q4_K`,
    /// `IQ2_XXS`, `MXFP4`).
    pub fn gguf_name(self) -> String {
        match self {
            GgmlType::MXFP4 => "MXFP4".into(),
            t => t.name().to_uppercase(),
        }
    }

    /// Bytes of `n` weights (`n` a multiple of the block size).
    pub fn bytes_of(self, n: usize) -> usize {
        n.div_ceil(self.block_size()) * self.type_size()
    }

    /// Decodes one block (`type_size()` bytes) into `out` (`block_size()` values): the type's
    /// reference decode (module docs).
    pub fn decode_block(self, b: &[u8], out: &mut [f32]) {
        debug_assert_eq!(b.len(), self.type_size());
        debug_assert_eq!(out.len(), self.block_size());
        match self {
            GgmlType::F16 => f16::decode(b, out),
            GgmlType::Q4_0 => q4_0::decode(b, out),
            GgmlType::Q4_1 => q4_1::decode(b, out),
            GgmlType::Q5_0 => q5_0::decode(b, out),
            GgmlType::Q5_1 => q5_1::decode(b, out),
            GgmlType::Q8_0 => q8_0::decode(b, out),
            GgmlType::Q2_K => q2_k::decode(b, out),
            GgmlType::Q3_K => q3_k::decode(b, out),
            GgmlType::Q4_K => q4_k::decode(b, out),
            GgmlType::Q5_K => q5_k::decode(b, out),
            GgmlType::Q6_K => q6_k::decode(b, out),
            GgmlType::IQ4_NL => iq4_nl::decode(b, out),
            GgmlType::IQ4_XS => iq4_xs::decode(b, out),
            GgmlType::IQ2_XXS
            | GgmlType::IQ2_XS
            | GgmlType::IQ2_S
            | GgmlType::IQ3_XXS
            | GgmlType::IQ3_S
            | GgmlType::IQ1_S
            | GgmlType::IQ1_M => decode_from_codes(self, b, out),
            GgmlType::MXFP4 => mxfp4::decode(b, out),
        }
    }

    /// Columns per scale of the type's integer form ([`GgmlType::codes`]): 16 (q2_k, q3_k,
    /// q6_k, iq2_xs, iq2_s, iq1_m), 32 (the others), None for f16 (no integer codes).
    pub fn code_group(self) -> Option<usize> {
        match self {
            GgmlType::F16 => None,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q6_K
            | GgmlType::IQ2_XS
            | GgmlType::IQ2_S
            | GgmlType::IQ1_M => Some(16),
            _ => Some(32),
        }
    }

    /// Whether the integer form has an offset per group (`w = a q + m`): q4_1, q5_1, q2_k,
    /// q4_k, q5_k.
    pub fn has_offset(self) -> bool {
        matches!(
            self,
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q2_K | GgmlType::Q4_K | GgmlType::Q5_K
        )
    }

    /// The integer form of one block (the integer-activation kernels' input): `q` (block_size
    /// codes), and per group of [`GgmlType::code_group`] columns the f32 scale `a` and, when
    /// [`GgmlType::has_offset`], the offset `m`, such that the reference decode of column `c` is
    /// `a[g] * q[c]` (`+ m[g]`) with `g = c / code_group`, the same f32 operations (checked for
    /// every type against gguf-py's vectors). `a` and `m` hold at least 16 values.
    ///
    /// # Panics
    /// For f16, which has no integer form.
    pub fn codes(self, b: &[u8], q: &mut [i8], a: &mut [f32], m: &mut [f32]) {
        match self {
            GgmlType::F16 => panic!("f16 has no integer codes"),
            GgmlType::Q4_0 => q4_0::codes(b, q, a, m),
            GgmlType::Q4_1 => q4_1::codes(b, q, a, m),
            GgmlType::Q5_0 => q5_0::codes(b, q, a, m),
            GgmlType::Q5_1 => q5_1::codes(b, q, a, m),
            GgmlType::Q8_0 => q8_0::codes(b, q, a, m),
            GgmlType::Q2_K => q2_k::codes(b, q, a, m),
            GgmlType::Q3_K => q3_k::codes(b, q, a, m),
            GgmlType::Q4_K => q4_k::codes(b, q, a, m),
            GgmlType::Q5_K => q5_k::codes(b, q, a, m),
            GgmlType::Q6_K => q6_k::codes(b, q, a, m),
            GgmlType::IQ4_NL => iq4_nl::codes(b, q, a, m),
            GgmlType::IQ4_XS => iq4_xs::codes(b, q, a, m),
            GgmlType::IQ2_XXS => iq2_xxs::codes(b, q, a, m),
            GgmlType::IQ2_XS => iq2_xs::codes(b, q, a, m),
            GgmlType::IQ2_S => iq2_s::codes(b, q, a, m),
            GgmlType::IQ3_XXS => iq3_xxs::codes(b, q, a, m),
            GgmlType::IQ3_S => iq3_s::codes(b, q, a, m),
            GgmlType::IQ1_S => iq1_s::codes(b, q, a, m),
            GgmlType::IQ1_M => iq1_m::codes(b, q, a, m),
            GgmlType::MXFP4 => mxfp4::codes(b, q, a, m),
        }
    }

    /// Decodes a run of whole blocks (`bytes_of(out.len())` bytes) into `out`.
    pub fn decode_blocks(self, b: &[u8], out: &mut [f32]) {
        let (bs, ts) = (self.block_size(), self.type_size());
        for (blk, o) in b.chunks_exact(ts).zip(out.chunks_exact_mut(bs)) {
            self.decode_block(blk, o);
        }
    }
}

/// The 8 six-bit scales and 8 six-bit mins of a q4_k or q5_k block, from its 12 packed bytes
/// (bytes 4..16 of the block): the unpacking the reference decode uses, for kernels.
#[inline]
pub fn q4_k_scale_min(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    q4_k::scale_min(packed)
}

/// The f16 at byte `at` of `b` (little-endian) widened to f32, exactly: a block's `d`, `dmin`
/// or `m`, as the reference decode reads it.
#[inline]
pub fn f16_at(b: &[u8], at: usize) -> f32 {
    f16(b, at)
}

/// The i-quants' tables, for kernels that decode their blocks in registers
/// ([`iq_tables`]). Each grid is ggml's (`ggml-common.h`), a point's unsigned byte values
/// little-endian in its integer.
#[derive(Clone, Copy, Debug)]
pub struct IqTables {
    /// iq2_xxs's lattice: 256 points of 8 values.
    pub iq2xxs_grid: &'static [u64; 256],
    /// iq2_xs's lattice: 512 points of 8 values.
    pub iq2xs_grid: &'static [u64; 512],
    /// iq2_s's lattice: 1024 points of 8 values.
    pub iq2s_grid: &'static [u64; 1024],
    /// iq3_xxs's lattice: 256 points of 4 values.
    pub iq3xxs_grid: &'static [u32; 256],
    /// iq3_s's lattice: 512 points of 4 values.
    pub iq3s_grid: &'static [u32; 512],
    /// The byte mask of a 7-bit sign index (iq2_xxs, iq2_xs, iq3_xxs: `KSIGNS`, the 7 sign bits
    /// and their parity as the eighth): byte `j` 0xFF where weight `j` is negative. A code is
    /// then `(p ^ m) - m`, the value [`GgmlType::codes`] gives.
    pub ksign_masks: &'static [u64; 128],
    /// IQ4_NL's and IQ4_XS's 16 signed levels.
    pub iq4_values: &'static [i8; 16],
}

/// The i-quants' tables ([`IqTables`]).
#[inline]
pub fn iq_tables() -> IqTables {
    IqTables {
        iq2xxs_grid: &iq_grids::IQ2XXS_GRID,
        iq2xs_grid: &iq_grids::IQ2XS_GRID,
        iq2s_grid: &iq_grids::IQ2S_GRID,
        iq3xxs_grid: &iq_grids::IQ3XXS_GRID,
        iq3s_grid: &iq_grids::IQ3S_GRID,
        ksign_masks: &SIGN_MASKS7,
        iq4_values: &iq4_nl::KVALUES,
    }
}

/// [`SIGN_MASKS`] of `KSIGNS[i]`: byte `j` 0xFF where bit `j` of `i` is set (j < 7), byte 7
/// 0xFF where `i` has an odd number of bits (ggml's `ksigns_iq2xs`).
static SIGN_MASKS7: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let s = i | (((i as u32).count_ones() as usize & 1) << 7);
        let mut j = 0;
        while j < 8 {
            if (s >> j) & 1 == 1 {
                t[i] |= 0xFF << (8 * j);
            }
            j += 1;
        }
        i += 1;
    }
    t
};

#[cfg(test)]
#[test]
fn sign_masks7_are_ksigns() {
    for i in 0..128 {
        assert_eq!(
            SIGN_MASKS7[i],
            SIGN_MASKS[iq_grids::KSIGNS[i] as usize],
            "{i}"
        );
    }
}

/// Byte masks of the sign bytes: byte `j` of `SIGN_MASKS[s]` is 0xFF where bit `j` of `s` is
/// set.
static SIGN_MASKS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut s = 0;
    while s < 256 {
        let mut j = 0;
        while j < 8 {
            if (s >> j) & 1 == 1 {
                t[s] |= 0xFF << (8 * j);
            }
            j += 1;
        }
        s += 1;
    }
    t
};

/// One in every byte.
const ONES: u64 = 0x0101_0101_0101_0101;

/// The 8 values of an i-quant grid point `p` (byte `j` = value `j`, each in 1..=127) as signed
/// codes, byte `j` negated where bit `j` of `signs` is set: `(p ^ m) + (m & 1)` per byte, which
/// never carries between bytes for values in 1..=127.
#[inline(always)]
fn signed(p: u64, signs: u8) -> u64 {
    let m = SIGN_MASKS[signs as usize];
    (p ^ m) + (m & ONES)
}

/// The 8 values of an iq1s grid point `p` (signed bytes -1, 0, 1) as the codes `8 v + 1`
/// (`plus`) or `8 v - 1`: `8 v - 1 = !(8 (-v))`, and `-v` swaps the bytes 0x01 and 0xFF.
#[inline(always)]
fn iq1_codes(p: u64, plus: bool) -> u64 {
    let eight = |x: u64| (x << 3) & 0xF8F8_F8F8_F8F8_F8F8;
    if plus {
        eight(p) | ONES
    } else {
        !eight(p ^ ((p & ONES) * 0xFE))
    }
}

/// The integer form iq2_xs and iq2_s share: 16 groups of 16 with the 4-bit scale `ls` = nibble
/// `g % 2` of byte `scales + g / 2` of the block, `a[g] = d * (0.5 + ls) * 0.25`; weights
/// `8l .. 8l + 8` are grid point `point(l)` with its sign byte.
#[inline(always)]
fn iq2_codes_16(
    b: &[u8],
    scales: usize,
    q: &mut [i8],
    a: &mut [f32],
    point: impl Fn(usize) -> (u64, u8),
) {
    let d = f16(b, 0);
    for (g, v) in a.iter_mut().enumerate().take(16) {
        let ls = (b[scales + g / 2] >> (4 * (g % 2))) & 0x0F;
        *v = d * (0.5 + ls as f32) * 0.25;
    }
    for l in 0..32 {
        let (p, signs) = point(l);
        put8(&mut q[8 * l..], signed(p, signs));
    }
}

/// Writes 8 codes (byte `j` of `v` = code `j`) to `q[..8]`.
#[inline(always)]
fn put8(q: &mut [i8], v: u64) {
    let q: &mut [i8; 8] = (&mut q[..8]).try_into().expect("8 codes");
    *q = v.to_le_bytes().map(|b| b as i8);
}

/// The reference decode of an i-quant block through its integer form: `out[c] = a[c / g] *
/// q[c]`, one f32 rounding. This is gguf-py's value: for iq2_* / iq3_* `(db * grid) * sign` (the
/// sign flips an exact product: rounding to nearest is symmetric), for iq1_* `dl * (grid +
/// delta)` with `a = dl / 8` and `q = 8 grid +- 1` (the same exact product, rounded once).
fn decode_from_codes(t: GgmlType, b: &[u8], out: &mut [f32]) {
    let (mut q, mut a, mut m) = ([0i8; QK_K], [0f32; 16], [0f32; 16]);
    t.codes(b, &mut q, &mut a, &mut m);
    let g = t.code_group().expect("an i-quant");
    for ((o, q), a) in out.chunks_exact_mut(g).zip(q.chunks_exact(g)).zip(a.iter()) {
        for (o, &q) in o.iter_mut().zip(q) {
            *o = a * q as f32;
        }
    }
}

/// IEEE half-precision bits to f32 (exact).
#[inline]
pub(crate) fn f16(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// The `ggml` codec of one type.
#[derive(Clone, Copy, Debug)]
pub struct Ggml(pub GgmlType);

impl Codec for Ggml {
    fn id(&self) -> u16 {
        7
    }
    fn group_size_field(&self) -> u16 {
        self.0 as u16
    }
    fn name(&self) -> String {
        self.0.name().into()
    }
    fn weight_bytes(&self, rows: usize, cols: usize) -> usize {
        rows * self.0.bytes_of(cols)
    }
    fn scale_count(&self, _rows: usize, _cols: usize) -> usize {
        0
    }
    fn decode_cols(&self, m: &MatrixView<'_>, r: usize, c0: usize, c1: usize, out: &mut [f32]) {
        let t = self.0;
        let (bs, ts) = (t.block_size(), t.type_size());
        let stride = t.bytes_of(m.cols());
        let row = &m.data()[r * stride..(r + 1) * stride];
        if c0.is_multiple_of(bs) && c1.is_multiple_of(bs) {
            t.decode_blocks(&row[c0 / bs * ts..c1 / bs * ts], &mut out[..c1 - c0]);
            return;
        }
        let mut tmp = [0f32; QK_K];
        let mut c = c0;
        while c < c1 {
            let b = c / bs;
            t.decode_block(&row[b * ts..(b + 1) * ts], &mut tmp[..bs]);
            let end = ((b + 1) * bs).min(c1);
            out[c - c0..end - c0].copy_from_slice(&tmp[c - b * bs..end - b * bs]);
            c = end;
        }
    }
    fn encode_row(&self, _w: &[f32], _dst: &mut [u8], _scales: &mut [f32]) -> Option<ErrSums> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_gguf_py() {
        // gguf-py constants.py GGML_QUANT_SIZES (block size, type size).
        let want = [
            (1, 2),
            (32, 18),
            (32, 20),
            (32, 22),
            (32, 24),
            (32, 34),
            (256, 84),
            (256, 110),
            (256, 144),
            (256, 176),
            (256, 210),
            (256, 66),
            (256, 74),
            (256, 98),
            (256, 50),
            (32, 18),
            (256, 110),
            (256, 82),
            (256, 136),
            (256, 56),
            (32, 17),
        ];
        for (t, w) in ALL.into_iter().zip(want) {
            assert_eq!((t.block_size(), t.type_size()), w, "{}", t.name());
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgmlType::from_id(35), None); // TQ2_0: not decoded
    }
}
