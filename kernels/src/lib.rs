//! # coli-kernels: CPU kernels for coli
//!
//! Matrix-vector (decode) and small matrix-matrix (prefill) products `y = W x` over every
//! weight encoding of the store ([`coli_format::Encoding`]: f32, bf16, fp8 e4m3 with 128x128 block scales,
//! int8 with a per-row scale, int4 with per-group scales; layouts in `docs/FORMAT.md` section 6),
//! read directly from a [`MatrixView`] (weights `[rows = out features, cols = in features]`),
//! plus a few f32 helpers ([`dot`], [`rms_norm`], [`softmax_inplace`], [`silu`], [`axpy`]).
//!
//! ## Instruction sets
//! Each product has an AVX2+FMA kernel (x86-64 with AVX2, FMA and F16C, chosen at run time by
//! [`detected_isa`], coli's one CPU detection in `coli_format::cpu`, honouring `COLI_ISA`), AVX-512F kernels for the encodings that dominate decode (int4 with
//! a group size that is a multiple of 64, int8, mxfp4 and bf16; [`Isa::Avx512`]) and a portable scalar
//! twin ([`Isa::Scalar`]). All accumulate in f32 and agree within f32 rounding (about
//! `cols * 2^-24 * sum |w x|`), not bit for bit:
//!
//! - Scalar: decodes every weight exactly as the reference `MatrixView::dequantize_row` does
//!   (one f32 rounding of `code * scale`), then per row eight interleaved running sums (column
//!   `c` into sum `c % 8`, product rounded then added), combined pairwise.
//! - AVX2, f32/bf16/fp8 and int4 with other group sizes: each weight decoded as the reference
//!   (bf16 by a 16-bit shift, fp8 via float16, int4 by nibble unpacking), four 8-lane FMA
//!   accumulators (8-column chunk `k` into accumulator `k % 4`), combined pairwise.
//! - AVX2/AVX-512 int8: the same over the bare codes, the row scale applied once to the sum
//!   (`s * sum q x` instead of `sum (q s) x`).
//! - AVX-512 bf16: the AVX2 kernel's four 8-lane accumulators held as two 16-lane ones, so its
//!   results are the AVX2 kernel's bit for bit (`avx512.rs`).
//! - AVX2 int4 with a group size that is a multiple of 32 dividing `cols`: per group
//!   `sum (q - 8) x` over codes widened straight from the nibbles (activations permuted once
//!   per product to match), times the group scale with one FMA into the row total (`avx2.rs`).
//! - AVX-512 int4 with a group size that is a multiple of 64 dividing `cols`: the codes widened
//!   straight from the nibbles (activations permuted to match), each run of 16 decoded once to
//!   the reference weights `(q - 8) * scale` and multiplied into one of four 16-lane
//!   accumulators per token (`avx512.rs`): four FMAs per token and 64 columns, so a pass over
//!   several tokens costs little more than one.
//! - AVX2/AVX-512 mxfp4 with `cols` a multiple of 32: the same per 32-column block, the e2m1
//!   codes mapped to `2 v` (small integers) by one byte shuffle, times `2^(e - 128)` (half the
//!   e8m0 block scale, a power of two: exact). Other mxfp4 shapes decode each weight exactly
//!   (`e2m1 * 2^(e - 127)`) as the other AVX2 kernels do. One multiply per group or row instead of one per
//!   weight is what lets these kernels keep up with llama.cpp's (which quantize the activations
//!   to int8 instead, changing the results; these do not).
//!
//! ## Determinism
//! For a given [`Isa`], every output element is computed by one thread with a fixed summation
//! order: results are bit-identical whatever the thread count, and row `t` of [`matmul`] is
//! bit-identical to [`matvec`] of token `t` (prefill and decode agree exactly). Work is split
//! over output rows in chunks whose size depends only on the matrix shape.

use coli_format::{Encoding, MatrixView};
use rayon::prelude::*;

pub mod attend;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_ggml;
#[cfg(target_arch = "x86_64")]
mod avx2_quant;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod bf16a;
#[cfg(target_arch = "x86_64")]
mod bf16a_x86;
pub mod gated_delta;
mod interleave;
pub mod kda;
mod ops;
mod q8a;
#[cfg(target_arch = "x86_64")]
mod q8a_x86;
pub mod quantize;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod strided_x86;

pub use bf16a::round_bf16;
pub use interleave::interleave_sections;
pub use ops::{
    axpy, axpy_strided, axpy_strided_with, dot, dot_strided, dot_strided_with, exp_flush, rms_norm,
    silu, softmax_inplace,
};
pub use quantize::{quantize_int4_row, quantize_int4_row_with};

pub use coli_format::cpu::{detected_isa, Isa};

/// How the products treat their activations (`--numerics`, `COLI_NUMERICS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Numerics {
    /// f32 activations times each encoding's decoded weights (`exact`; this library's default,
    /// the reference the oracle tests compare with; the coli tools default to [`Numerics::Q8a`]).
    Exact,
    /// Integer activations (`q8a`): for int8, int4 (group 32 or a multiple of 64), mxfp4 and
    /// ggml integer-code matrices
    /// with `cols` a multiple of 64, the activations are quantized to int8 per block of 32 and
    /// multiplied by the integer codes, with the f32 steps in a fixed order, so every
    /// instruction set gives the same bits (the rule: docs/ENGINE.md "Precision", `q8a.rs`);
    /// for bf16 matrices with `cols` a multiple of 32, the activations are rounded to bf16 and
    /// summed in pairs in the order of AVX-512 BF16's `vdpbf16ps` (`bf16a.rs`).
    /// Every other matrix keeps its f32 kernel.
    Q8a,
}

impl Numerics {
    /// `exact` or `q8a`: the values `--numerics` and `COLI_NUMERICS` take.
    pub fn name(self) -> &'static str {
        match self {
            Numerics::Exact => "exact",
            Numerics::Q8a => "q8a",
        }
    }

    /// The numerics called `s` ([`Numerics::name`]; surrounding spaces and case ignored).
    ///
    /// # Errors
    /// A sentence naming the accepted values.
    pub fn parse(s: &str) -> Result<Numerics, String> {
        let t = s.trim();
        match t.to_ascii_lowercase().as_str() {
            "exact" => Ok(Numerics::Exact),
            "q8a" => Ok(Numerics::Q8a),
            _ => Err(format!(
                "unknown numerics {t:?}: expected exact (f32 activations) or q8a (int8 activations per block of 32)"
            )),
        }
    }
}

/// The process's numerics: 0 unset, 1 exact, 2 q8a.
static NUMERICS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The numerics [`matvec`] and [`matmul`] use: the last [`set_numerics`], else
/// `COLI_NUMERICS` (`exact` or `q8a`; anything else is [`Numerics::Exact`] with one warning on
/// stderr), else [`Numerics::Exact`].
pub fn numerics() -> Numerics {
    use std::sync::atomic::Ordering;
    match NUMERICS.load(Ordering::Relaxed) {
        1 => Numerics::Exact,
        2 => Numerics::Q8a,
        _ => {
            let n = match std::env::var("COLI_NUMERICS") {
                Ok(v) => Numerics::parse(&v).unwrap_or_else(|e| {
                    eprintln!("warning: COLI_NUMERICS: {e}; using exact");
                    Numerics::Exact
                }),
                Err(_) => Numerics::Exact,
            };
            set_numerics(n);
            n
        }
    }
}

/// Sets the numerics of every later [`matvec`] and [`matmul`] in this process (the CLI's
/// `--numerics`; set it before an engine is built: the engine's KV identity keys on it).
pub fn set_numerics(n: Numerics) {
    let v = match n {
        Numerics::Exact => 1,
        Numerics::Q8a => 2,
    };
    NUMERICS.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// Names the numbers the kernels of `isa` produce under [`numerics`]
/// ([`numerics_id_with`]).
pub fn numerics_id(isa: Isa) -> &'static str {
    numerics_id_with(isa, numerics())
}

/// Names the numbers the kernels of `isa` produce under `numerics`: the instruction set's name
/// ([`Isa::name`]), with a revision suffix `-rN` once its kernels' summation order has changed
/// since the first release (`avx512-r2`: the AVX-512 int4 kernel decodes each run to the
/// reference weights and multiplies them per token, where revision 1 summed `(q - 8) x` per
/// group), and `+q8a-r5` under [`Numerics::Q8a`] (the integer products are the same on every
/// instruction set; the f32 products of the other matrices are not; r2: the ggml block types
/// follow the rule too, where r1 ran them on f32 activations; r3: mxfp4 matrices too; r4: bf16
/// matrices take bf16 activations, `bf16a.rs`; r5: int8, int4 and mxfp4 products accumulate
/// once per block of 32 columns, where r1-r4 did per lane of 4). Two engines whose kernels
/// have the same numerics id give the same bits; anything that persists computed numbers (the
/// KV cache's file identity, docs/KV_CACHE.md) keys on it.
pub fn numerics_id_with(isa: Isa, numerics: Numerics) -> &'static str {
    match (isa, numerics) {
        (Isa::Scalar, Numerics::Exact) => "scalar",
        (Isa::Avx2Fma, Numerics::Exact) => "avx2-fma",
        (Isa::Avx512, Numerics::Exact) => "avx512-r2",
        (Isa::Scalar, Numerics::Q8a) => "scalar+q8a-r5",
        (Isa::Avx2Fma, Numerics::Q8a) => "avx2-fma+q8a-r5",
        (Isa::Avx512, Numerics::Q8a) => "avx512-r2+q8a-r5",
    }
}

/// True when the kernels multiply `w` faster in the interleaved row order
/// ([`MatrixView::interleave`]) under the process's numerics: under [`Numerics::Q8a`], the int8,
/// int4 and mxfp4 matrices its integer rule covers (the kernels keep 16 rows in the lanes of a
/// register; a row-major matrix is packed into that order 16 rows at a time as it is
/// multiplied, or with VNNI for one token read in place and reduced: on this project's machine
/// 25-29 us against 59-62 for one token and a 1024 x 2048 int4 matrix in cache, 105 when it was
/// packed, kernels/benches/q8a.rs). The results are the same bits in either order;
/// an engine reorders such a matrix once ([`interleave_sections`]), when it holds it for reuse.
///
/// [`set_interleave`]`(false)` (or `COLI_NO_INTERLEAVE=1` in the environment) makes it false
/// everywhere: for tests and A/B measurements.
pub fn prefers_interleaved(w: &MatrixView<'_>) -> bool {
    !w.is_interleaved() && reads_interleaved(w.encoding(), w.rows(), w.cols())
}

/// True when the kernels read a `[rows, cols]` matrix of `encoding` in the interleaved row
/// order under the process's numerics and interleave switch, whatever order it is in now (see
/// [`prefers_interleaved`]). Engines keep a matrix stored interleaved (format version 7) in
/// that order where this is true and reorder it to row-major where it is false (the f32
/// kernels of `--numerics exact` read rows).
///
/// False on the scalar integer path ([`integer_kernel`] `scalar`: no AVX2), whose kernel
/// gathers an interleaved matrix's rows one at a time: there a matrix is read row-major.
pub fn reads_interleaved(encoding: Encoding, rows: usize, cols: usize) -> bool {
    interleave()
        && numerics() == Numerics::Q8a
        && q8a_path(detected_isa()) != Q8aPath::Scalar
        && q8a::kind_of(encoding, cols).is_some()
        && MatrixView::can_interleave(encoding, rows, cols)
}

/// The process's interleave switch: 0 unset, 1 on, 2 off.
static INTERLEAVE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Whether [`prefers_interleaved`] may say yes: [`set_interleave`], else on unless
/// `COLI_NO_INTERLEAVE` is set in the environment.
pub fn interleave() -> bool {
    use std::sync::atomic::Ordering;
    match INTERLEAVE.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let on =
                std::env::var_os("COLI_NO_INTERLEAVE").is_none_or(|v| v.is_empty() || v == "0");
            INTERLEAVE.store(if on { 1 } else { 2 }, Ordering::Relaxed);
            on
        }
    }
}

/// Sets the process's interleave switch ([`interleave`]); engines read it when they load
/// weights.
pub fn set_interleave(on: bool) {
    INTERLEAVE.store(if on { 1 } else { 2 }, std::sync::atomic::Ordering::Relaxed);
}

/// The integer kernel that runs under [`Numerics::Q8a`] with `isa`: `avx512-vnni` where the
/// CPU has AVX-512 VNNI and `isa` is AVX-512, `avx2` for AVX2 and AVX-512 without VNNI,
/// `scalar` otherwise (the ggml block types have their own kernels on both SIMD paths). All
/// give the same bits; `coli doctor` and `--json` stats name it.
pub fn integer_kernel(isa: Isa) -> &'static str {
    match q8a_path(isa) {
        Q8aPath::Vnni => "avx512-vnni",
        Q8aPath::Avx2 => "avx2",
        Q8aPath::Scalar => "scalar",
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Q8aPath {
    Scalar,
    Avx2,
    Vnni,
}

fn q8a_path(isa: Isa) -> Q8aPath {
    #[cfg(target_arch = "x86_64")]
    {
        static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let vnni = *VNNI.get_or_init(|| {
            // Every VNNI CPU has AVX-512BW; the ggml tiles use its 16-bit shifts.
            std::is_x86_feature_detected!("avx512vnni")
                && std::is_x86_feature_detected!("avx512bw")
                && std::env::var("COLI_NO_VNNI").is_err()
        });
        match isa {
            Isa::Avx512 if vnni => return Q8aPath::Vnni,
            Isa::Avx512 | Isa::Avx2Fma => return Q8aPath::Avx2,
            Isa::Scalar => {}
        }
    }
    let _ = isa;
    Q8aPath::Scalar
}

/// `yt[i * n + t] = row (r0 + i) of w . token t` under the integer rule.
fn q8a_chunk(
    isa: Isa,
    kind: q8a::Kind,
    w: &MatrixView<'_>,
    qa: &q8a::QAct,
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    let path = q8a_path(isa);
    match (kind, path) {
        // The ggml types: 4 rows unpacked once (q8_0, q4_0, and with VNNI q4_k, q6_k and for
        // one token (iq4_xs: up to 4) six i-quants read in place), then every token.
        #[cfg(target_arch = "x86_64")]
        (q8a::Kind::Ggml(t), p @ (Q8aPath::Vnni | Q8aPath::Avx2)) => {
            // SAFETY: `require(isa)` checked AVX2+FMA+F16C; `kind()` admitted `w` (cols a multiple
            // of 64, an integer ggml type) and ggml matrices are never interleaved; `qa` was
            // quantized for it with `n` tokens.
            unsafe { q8a_x86::ggml_rows(p == Q8aPath::Vnni, t, w, qa, n, r0, yt) }
        }
        #[cfg(target_arch = "x86_64")]
        (_, p @ (Q8aPath::Vnni | Q8aPath::Avx2)) => {
            // SAFETY: `require(isa)` checked AVX2+FMA (and AVX-512F for `Isa::Avx512`); the
            // VNNI path is chosen only where the CPU reports AVX-512 VNNI; `kind` is `w`'s and
            // `qa` was quantized for it with `n` tokens.
            unsafe { q8a_x86::rows(p == Q8aPath::Vnni, kind, w, qa, n, r0, yt) }
        }
        _ => {
            for (i, yr) in yt.chunks_exact_mut(n).enumerate() {
                // The row once for its tokens (gathered from an interleaved view).
                let row = q8a::ScalarRow::new(w, r0 + i);
                for (t, y) in yr.iter_mut().enumerate() {
                    *y = q8a::dot_scalar(kind, &row, qa, t);
                }
            }
        }
    }
}

/// Rows per parallel task of an integer product: `rows` rounded up to whole groups of 16 for
/// int8, int4 and mxfp4 (whose kernels multiply a group at a time, interleaved or packed; a
/// task of fewer rows would pack and multiply the whole group for them). So a small matrix may
/// get fewer than [`matmul_chunk_rows`]' 8 tasks.
fn q8a_task_rows(kind: q8a::Kind, rows: usize) -> usize {
    match kind {
        q8a::Kind::Ggml(_) => rows,
        _ => rows.next_multiple_of(coli_format::INTERLEAVE_ROWS),
    }
}

/// [`matmul_with`] under the integer rule for a matrix of `kind`: `y` is `[n, rows]`.
fn q8a_product(isa: Isa, kind: q8a::Kind, w: &MatrixView<'_>, x: &[f32], n: usize, y: &mut [f32]) {
    let (rows, cols) = (w.rows(), w.cols());
    let qa = q8a::quantize(kind, x, n, cols);
    if n == 1 {
        if rows * cols < PARALLEL_MIN_WORK {
            q8a_chunk(isa, kind, w, &qa, 1, 0, y);
        } else {
            // Whole groups of 16 rows per task (a row's result is the same in any): the
            // kernels multiply 16 rows at a time, row-major ones packed into a group.
            let cr = q8a_task_rows(kind, chunk_rows(cols));
            y.par_chunks_mut(cr)
                .enumerate()
                .for_each(|(i, yc)| q8a_chunk(isa, kind, w, &qa, 1, i * cr, yc));
        }
        return;
    }
    // Whole groups per task, as for one token.
    let cr = q8a_task_rows(kind, matmul_chunk_rows(rows, cols));
    row_blocks(rows, cols, n, cr, y, |r0, yt| {
        q8a_chunk(isa, kind, w, &qa, n, r0, yt)
    });
}

/// The bf16-activation kernel that runs under [`Numerics::Q8a`] with `isa`: `avx512-bf16`
/// (`vdpbf16ps`) where the CPU has AVX-512 BF16 and `isa` is AVX-512, `avx2` for AVX2 and
/// AVX-512 without it, `scalar` otherwise. All give the same bits (`bf16a.rs`); `coli doctor`
/// names it.
pub fn bf16_kernel(isa: Isa) -> &'static str {
    match bf16a_path(isa) {
        Bf16aPath::Avx512Bf16 => "avx512-bf16",
        Bf16aPath::Avx2 => "avx2",
        Bf16aPath::Scalar => "scalar",
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Bf16aPath {
    Scalar,
    Avx2,
    Avx512Bf16,
}

fn bf16a_path(isa: Isa) -> Bf16aPath {
    #[cfg(target_arch = "x86_64")]
    {
        static BF16: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let bf16 = *BF16.get_or_init(|| std::is_x86_feature_detected!("avx512bf16"));
        match isa {
            Isa::Avx512 if bf16 => return Bf16aPath::Avx512Bf16,
            Isa::Avx512 | Isa::Avx2Fma => return Bf16aPath::Avx2,
            Isa::Scalar => {}
        }
    }
    let _ = isa;
    Bf16aPath::Scalar
}

/// `yt[i * n + t] = row (r0 + i) of w . token t` under the bf16-activation rule; `xb` holds
/// the `n` tokens rounded to bf16 and `safe` (AVX2 path only) which of them the AVX2 kernel may
/// multiply with plain FMAs.
fn bf16a_chunk(
    path: Bf16aPath,
    w: &MatrixView<'_>,
    xb: &[u16],
    safe: &[bool],
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    let cols = w.cols();
    match path {
        #[cfg(target_arch = "x86_64")]
        Bf16aPath::Avx512Bf16 => {
            // SAFETY: the path is chosen only where the CPU reports AVX-512F (`require`) and
            // AVX-512 BF16; `applies(w)` held; `xb` is `n` tokens of `cols` patterns.
            unsafe { bf16a_x86::rows_bf16(w, xb, n, r0, yt) }
        }
        #[cfg(target_arch = "x86_64")]
        Bf16aPath::Avx2 => {
            // SAFETY: `require(isa)` checked AVX2 and FMA; as above; `safe` has `n` entries.
            unsafe { bf16a_x86::rows_avx2(w, xb, safe, n, r0, yt) }
        }
        _ => {
            for (i, yr) in yt.chunks_exact_mut(n).enumerate() {
                let row = bf16a::row_bytes(w, r0 + i);
                for (t, y) in yr.iter_mut().enumerate() {
                    *y = bf16a::dot_scalar(row, &xb[t * cols..(t + 1) * cols]);
                }
            }
        }
    }
}

/// [`matmul_with`] under the bf16-activation rule (`bf16a.rs`): `y` is `[n, rows]`.
fn bf16a_product(isa: Isa, w: &MatrixView<'_>, x: &[f32], n: usize, y: &mut [f32]) {
    let (rows, cols) = (w.rows(), w.cols());
    let xb = bf16a::round_activations(x);
    let path = bf16a_path(isa);
    #[cfg(target_arch = "x86_64")]
    let safe: Vec<bool> = if path == Bf16aPath::Avx2 {
        xb.chunks_exact(cols)
            .map(|t| bf16a_x86::safe_range(t.iter().copied()))
            .collect()
    } else {
        Vec::new()
    };
    #[cfg(not(target_arch = "x86_64"))]
    let safe: Vec<bool> = Vec::new();
    let run = |r0: usize, yt: &mut [f32]| bf16a_chunk(path, w, &xb, &safe, n, r0, yt);
    if n == 1 {
        if rows * cols < PARALLEL_MIN_WORK {
            run(0, y);
        } else {
            let cr = chunk_rows(cols);
            y.par_chunks_mut(cr)
                .enumerate()
                .for_each(|(i, yc)| run(i * cr, yc));
        }
        return;
    }
    row_blocks(rows, cols, n, matmul_chunk_rows(rows, cols), y, run);
}

/// Runs a product of `n` tokens by a `[rows, cols]` matrix in blocks of `cr` rows: `block(r0,
/// yt)` computes rows `r0..r0 + m` transposed, `yt[i * n + t]` = row `r0 + i` . token `t`, into a
/// zeroed buffer of the thread's (reused, never reallocated once large enough), and the block is
/// then written to its rows of `y` (`[n, rows]`: `y[t * rows + r0 + i]`) while it is still in
/// the core's cache. Blocks run on the rayon pool when the product has `PARALLEL_MIN_WORK` or
/// more; each owns its rows, so the result does not depend on the blocking or the threads.
/// (Before, the tasks wrote one `[rows, n]` array, allocated and zeroed per product, which a
/// second pass scattered: 6% of a chunked prefill of the Qwen3.6 shape.)
fn row_blocks(
    rows: usize,
    cols: usize,
    n: usize,
    cr: usize,
    y: &mut [f32],
    block: impl Fn(usize, &mut [f32]) + Sync,
) {
    assert!(cr > 0 && y.len() == n * rows);
    thread_local! {
        static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    }
    let out = RowsOut(y.as_mut_ptr());
    let out = &out;
    let task = |b: usize| {
        let r0 = b * cr;
        let m = cr.min(rows - r0);
        // Taken out of the cell (not borrowed): a block that waits on the pool may run
        // another block on this thread, which then finds an empty buffer.
        let mut yt = SCRATCH.take();
        yt.clear();
        yt.resize(m * n, 0.0);
        block(r0, &mut yt);
        for t in 0..n {
            // SAFETY: `y` has `n * rows` elements (asserted) and outlives this call, which
            // returns after every task; block `b` writes only rows `r0..r0 + m` (within
            // `rows`) of each token, and no two blocks share a row, so no element is written
            // twice or read by another task.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add(t * rows + r0), m) };
            for (i, d) in dst.iter_mut().enumerate() {
                *d = yt[i * n + t];
            }
        }
        SCRATCH.set(yt);
    };
    let blocks = rows.div_ceil(cr);
    if rows * cols * n < PARALLEL_MIN_WORK {
        (0..blocks).for_each(task);
    } else {
        (0..blocks).into_par_iter().for_each(task);
    }
}

/// The output of [`row_blocks`], shared by its tasks, which write disjoint elements.
struct RowsOut(*mut f32);

// SAFETY: the pointer is only written through, by tasks that each own disjoint elements
// (`row_blocks`), while the slice it came from is mutably borrowed for the whole call.
unsafe impl Sync for RowsOut {}

/// Whether the CPU has AVX2 (std caches the detection): for portable code that also runs
/// compiled for AVX2, with the same bits ([`avx2_twin!`]).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
}

/// `avx2_twin!(docs pub fn name(args) => body, twin);` defines `name`, which runs the
/// portable function `body` (`#[inline(always)]`, same arguments) compiled for AVX2 (through
/// `twin`, a `target_feature` copy) where the CPU has it, else as built. The same IEEE
/// operations in the same order either way (Rust never contracts or reassociates them), so the
/// same bits; eight-lane sums and row updates then run in 256-bit registers.
macro_rules! avx2_twin {
    ($(#[$doc:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $body:ident, $twin:ident;) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            if crate::avx2() {
                // SAFETY: the CPU has AVX2 (checked).
                return unsafe { $twin($($arg),*) };
            }
            $body($($arg),*)
        }

        /// The function above compiled for AVX2.
        ///
        /// # Safety
        /// The CPU has AVX2.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $twin($($arg: $ty),*) {
            $body($($arg),*)
        }
    };
}
pub(crate) use avx2_twin;

/// The kernels' code path for products of `isa`: AVX-512 runs the AVX2 kernels except its own.
fn base(isa: Isa) -> Isa {
    match isa {
        Isa::Avx512 => Isa::Avx2Fma,
        other => other,
    }
}

/// Work (weight elements x tokens) per parallel task; chunk sizes derive from the shape only.
const CHUNK_WORK: usize = 1 << 15;
/// Below this much work (weight elements x tokens) a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// Output rows per parallel task of a matrix-vector product with `cols` columns: depends on the
/// shape only (never on the thread count).
fn chunk_rows(cols: usize) -> usize {
    (CHUNK_WORK / cols.max(1)).max(1)
}

/// Output rows per parallel task of a `[rows, cols]` matrix-matrix product: about
/// [`CHUNK_WORK`] weights (a chunk the matmul kernels sweep once per tile of tokens, so it
/// should stay in L1/L2), but at least 8 tasks where the matrix has the rows. Depends on the
/// shape only; a row's result never depends on its chunk.
fn matmul_chunk_rows(rows: usize, cols: usize) -> usize {
    chunk_rows(cols).min(rows.div_ceil(8)).max(1)
}

/// Panics unless `isa` runs on this CPU.
pub(crate) fn require(isa: Isa) {
    assert!(
        isa.supported(),
        "instruction set {} is not supported by this CPU",
        isa.name()
    );
}

/// Activations prepared for one product: as given, or permuted for an int4 or mxfp4 fast path
/// (`avx2::int4_permute`: blocks of 32 columns for AVX2 int4 and for mxfp4, 64 for AVX-512
/// int4).
enum Act<'a> {
    Plain(&'a [f32]),
    #[cfg(target_arch = "x86_64")]
    Int4Avx2(Vec<f32>),
    #[cfg(target_arch = "x86_64")]
    Int4Avx512(Vec<f32>),
    #[cfg(target_arch = "x86_64")]
    Mxfp4(Vec<f32>),
}

impl<'a> Act<'a> {
    /// Prepares `x` (`[n, w.cols()]`) for products of `w` with `isa`.
    fn new(isa: Isa, w: &MatrixView<'_>, x: &'a [f32]) -> Act<'a> {
        #[cfg(target_arch = "x86_64")]
        {
            if isa == Isa::Avx512 && avx512::int4_fast(w) {
                return Act::Int4Avx512(avx2::int4_permute(x, 64));
            }
            if base(isa) == Isa::Avx2Fma && avx2::int4_fast(w) {
                return Act::Int4Avx2(avx2::int4_permute(x, 32));
            }
            if base(isa) == Isa::Avx2Fma && avx2::mxfp4_fast(w) {
                return Act::Mxfp4(avx2::int4_permute(x, 32));
            }
        }
        let _ = (isa, w);
        Act::Plain(x)
    }
}

/// Computes `y[i] = sum_c W[r0 + i, c] * x[c]` for a chunk of rows with `isa`.
fn matvec_chunk(isa: Isa, w: &MatrixView<'_>, x: &Act<'_>, r0: usize, y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let (Isa::Avx512, Act::Plain(x)) = (isa, x) {
        if avx512::int8_fast(w) {
            // SAFETY: `require(isa)` checked AVX-512F+AVX2+FMA+F16C; `MatrixView::new` checked
            // the section lengths; `int8_fast(w)` holds; `x.len() == cols` (checked by the caller).
            unsafe { avx512::int8_matvec_rows(w, x, r0, y) };
            return;
        }
        if w.encoding() == coli_format::Encoding::Bf16 {
            // SAFETY: as above; the view is bf16.
            unsafe { avx512::bf16_matvec_rows(w, x, r0, y) };
            return;
        }
        if matches!(
            w.encoding(),
            coli_format::Encoding::Fp8 | coli_format::Encoding::Mxfp8
        ) {
            // SAFETY: as above; the view is fp8 or mxfp8.
            unsafe { avx512::fp8_matvec_rows(w, x, r0, y) };
            return;
        }
    }
    match (base(isa), x) {
        (Isa::Scalar, Act::Plain(x)) => scalar::matvec_rows(w, x, r0, y),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2Fma, Act::Plain(x)) => {
            // SAFETY: `require(isa)` checked AVX2+FMA+F16C support before any chunk runs;
            // `MatrixView::new` checked the section lengths.
            unsafe { avx2::matvec_rows(w, x, r0, y) }
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2Fma, Act::Int4Avx2(xp)) => {
            // SAFETY: as above; `Act::new` chose this path because `avx2::int4_fast(w)` holds,
            // and `xp` is the permuted `x` (`cols` long).
            unsafe { avx2::int4_matvec_rows(w, xp, r0, y) }
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2Fma, Act::Int4Avx512(xp)) => {
            // SAFETY: `Act::new` built this only for `Isa::Avx512` (AVX-512F checked by
            // `require`) with `avx512::int4_fast(w)`; `xp` is the permuted `x`.
            unsafe { avx512::int4_matvec_rows(w, xp, r0, y) }
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2Fma, Act::Mxfp4(xp)) => {
            if isa == Isa::Avx512 {
                // SAFETY: `Act::new` built this only with `avx2::mxfp4_fast(w)`; `require`
                // checked AVX-512F+AVX2+FMA+F16C for `Isa::Avx512`; `xp` is the permuted `x`.
                unsafe { avx512::mxfp4_matvec_rows(w, xp, r0, y) }
            } else {
                // SAFETY: as above, AVX2+FMA+F16C checked by `require`.
                unsafe { avx2::mxfp4_matvec_rows(w, xp, r0, y) }
            }
        }
        _ => unreachable!("activations prepared for another instruction set"),
    }
}

/// Computes `yt[i * n + t] = sum_c W[r0 + i, c] * X[t, c]` for a chunk of rows with `isa`.
fn matmul_chunk(isa: Isa, w: &MatrixView<'_>, x: &Act<'_>, n: usize, r0: usize, yt: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let (Isa::Avx512, Act::Plain(x)) = (isa, x) {
        if avx512::int8_fast(w) {
            // SAFETY: as in `matvec_chunk`; `x.len() == n * cols` (checked by the caller).
            unsafe { avx512::int8_matmul_rows(w, x, n, r0, yt) };
            return;
        }
        if w.encoding() == coli_format::Encoding::Bf16 {
            // SAFETY: as in `matvec_chunk`; the view is bf16; `x.len() == n * cols`.
            unsafe { avx512::bf16_matmul_rows(w, x, n, r0, yt) };
            return;
        }
        if matches!(
            w.encoding(),
            coli_format::Encoding::Fp8 | coli_format::Encoding::Mxfp8
        ) {
            // SAFETY: as in `matvec_chunk`; the view is fp8 or mxfp8; `x.len() == n * cols`.
            unsafe { avx512::fp8_matmul_rows(w, x, n, r0, yt) };
            return;
        }
    }
    match (base(isa), x) {
        (Isa::Scalar, Act::Plain(x)) => scalar::matmul_rows(w, x, n, r0, yt),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2Fma, Act::Plain(x)) => {
            // SAFETY: as in `matvec_chunk`; `x.len() == n * cols` was checked by the caller.
            unsafe { avx2::matmul_rows(w, x, n, r0, yt) }
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2Fma, Act::Int4Avx2(xp)) => {
            // SAFETY: as in `matvec_chunk`; `xp.len() == n * cols`.
            unsafe { avx2::int4_matmul_rows(w, xp, n, r0, yt) }
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2Fma, Act::Int4Avx512(xp)) => {
            // SAFETY: as in `matvec_chunk`; `xp.len() == n * cols`.
            unsafe { avx512::int4_matmul_rows(w, xp, n, r0, yt) }
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2Fma, Act::Mxfp4(xp)) => {
            if isa == Isa::Avx512 {
                // SAFETY: as in `matvec_chunk`; `xp.len() == n * cols`.
                unsafe { avx512::mxfp4_matmul_rows(w, xp, n, r0, yt) }
            } else {
                // SAFETY: as in `matvec_chunk`; `xp.len() == n * cols`.
                unsafe { avx2::mxfp4_matmul_rows(w, xp, n, r0, yt) }
            }
        }
        _ => unreachable!("activations prepared for another instruction set"),
    }
}

/// Matrix-vector product `y = W x` with the best instruction set ([`detected_isa`]).
///
/// `w` is `[rows, cols]` (any encoding), `x` has `cols` f32 activations, `y` receives `rows`
/// f32 outputs. Parallel over output rows with rayon (on the current pool); the result is
/// bit-identical for any thread count.
///
/// # Panics
/// If `x.len() != cols`, `y.len() != rows`, or `w`'s weight/scale sections do not have the
/// lengths its encoding and shape require.
pub fn matvec(w: &MatrixView<'_>, x: &[f32], y: &mut [f32]) {
    matvec_with(detected_isa(), w, x, y)
}

/// [`matvec`] with an explicit instruction set (tests and benches).
///
/// # Panics
/// As [`matvec`]; also if `isa` is not supported by this CPU ([`Isa::supported`]).
pub fn matvec_with(isa: Isa, w: &MatrixView<'_>, x: &[f32], y: &mut [f32]) {
    matvec_num(isa, numerics(), w, x, y)
}

/// [`matvec`] with an explicit instruction set and numerics (tests and benches).
///
/// # Panics
/// As [`matvec_with`].
pub fn matvec_num(isa: Isa, num: Numerics, w: &MatrixView<'_>, x: &[f32], y: &mut [f32]) {
    require(isa);
    assert_eq!(
        x.len(),
        w.cols(),
        "matvec: x has {} elements, cols = {}",
        x.len(),
        w.cols()
    );
    assert_eq!(
        y.len(),
        w.rows(),
        "matvec: y has {} elements, rows = {}",
        y.len(),
        w.rows()
    );
    if num == Numerics::Q8a {
        if let Some(kind) = q8a::kind(w) {
            q8a_product(isa, kind, w, x, 1, y);
            return;
        }
        if bf16a::applies(w) {
            bf16a_product(isa, w, x, 1, y);
            return;
        }
    }
    if w.is_interleaved() {
        // Only the integer kernels read the interleaved row order: the others take a row-major
        // copy (the engine interleaves only matrices the integer rule multiplies).
        let c = w.row_major_copy();
        return matvec_num(isa, num, &c.view(), x, y);
    }
    let x = &Act::new(isa, w, x);
    if w.rows() * w.cols() < PARALLEL_MIN_WORK {
        matvec_chunk(isa, w, x, 0, y);
        return;
    }
    let cr = chunk_rows(w.cols());
    y.par_chunks_mut(cr)
        .enumerate()
        .for_each(|(i, yc)| matvec_chunk(isa, w, x, i * cr, yc));
}

/// Small matrix-matrix product `Y = X W^T` with the best instruction set ([`detected_isa`]).
///
/// `x` is `[n, cols]` row-major (`n` tokens, e.g. a prefill of up to ~64 tokens), `y` receives
/// `[n, rows]` row-major. Each weight row is decoded once for all `n` tokens. Row `t` of `y` is
/// bit-identical to `matvec(w, x[t * cols..(t + 1) * cols])`, for any thread count.
///
/// # Panics
/// If `x.len() != n * cols`, `y.len() != n * rows`, or `w`'s sections are malformed (as
/// [`matvec`]).
pub fn matmul(w: &MatrixView<'_>, x: &[f32], n: usize, y: &mut [f32]) {
    matmul_with(detected_isa(), w, x, n, y)
}

/// Below this many rows [`matmul`] runs the matvec once per row (the same bits, faster there)
/// on the AVX2 and scalar kernels; the AVX-512 matmul kernels are faster from 2 rows
/// ([`matmul_min_rows`]).
pub const MATMUL_MIN_ROWS: usize = 4;

/// The fewest rows for which [`matmul_with`] runs its matmul kernels on `w` rather than the
/// matvec per row (the same bits either way; kernels/benches/matvec.rs): 2 where `isa` is
/// AVX-512 and `w` has an AVX-512 matmul kernel (int4 with a group size that is a multiple of
/// 64, int8, bf16, mxfp4 with `cols` a multiple of 32), which decodes a weight once for up to 6
/// (int4, int8, mxfp4) or 8 (bf16) tokens; [`MATMUL_MIN_ROWS`] elsewhere (the AVX2 kernels:
/// int4-g64 576x1536 at n = 2 ran at ~0.6x the matvec's per-row rate).
pub fn matmul_min_rows(isa: Isa, w: &MatrixView<'_>) -> usize {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512
        && (avx512::int4_fast(w)
            || avx512::int8_fast(w)
            || w.encoding() == coli_format::Encoding::Bf16
            || avx2::mxfp4_fast(w))
    {
        return 2;
    }
    let _ = (isa, w);
    MATMUL_MIN_ROWS
}

/// [`matmul`] with an explicit instruction set (tests and benches).
///
/// # Panics
/// As [`matmul`]; also if `isa` is not supported by this CPU ([`Isa::supported`]).
pub fn matmul_with(isa: Isa, w: &MatrixView<'_>, x: &[f32], n: usize, y: &mut [f32]) {
    matmul_num(isa, numerics(), w, x, n, y)
}

/// [`matmul`] with an explicit instruction set and numerics (tests and benches).
///
/// # Panics
/// As [`matmul_with`].
pub fn matmul_num(isa: Isa, num: Numerics, w: &MatrixView<'_>, x: &[f32], n: usize, y: &mut [f32]) {
    require(isa);
    let (rows, cols) = (w.rows(), w.cols());
    assert_eq!(
        x.len(),
        n * cols,
        "matmul: x has {} elements, n * cols = {n} * {cols}",
        x.len()
    );
    assert_eq!(
        y.len(),
        n * rows,
        "matmul: y has {} elements, n * rows = {n} * {rows}",
        y.len()
    );
    if n == 0 || rows == 0 {
        return;
    }
    if num == Numerics::Q8a {
        if let Some(kind) = q8a::kind(w) {
            // Each token's result is its matvec's bit for bit (the same per-token steps).
            q8a_product(isa, kind, w, x, n, y);
            return;
        }
        if bf16a::applies(w) {
            // As for the integer rule: the same per-token steps in any tile.
            bf16a_product(isa, w, x, n, y);
            return;
        }
    }
    if w.is_interleaved() {
        // As in `matvec_num`.
        let c = w.row_major_copy();
        return matmul_num(isa, num, &c.view(), x, n, y);
    }
    if n < matmul_min_rows(isa, w) {
        // A matmul row equals the matvec of that row bit for bit, and below this many rows the
        // matvec is faster per row.
        for (xt, yt) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
            matvec_num(isa, num, w, xt, yt);
        }
        return;
    }
    let x = &Act::new(isa, w, x);
    row_blocks(rows, cols, n, matmul_chunk_rows(rows, cols), y, |r0, yt| {
        matmul_chunk(isa, w, x, n, r0, yt)
    });
}

/// Row `r` of `w` decoded to f32 into `out` (`cols` values), bit-identical to the reference
/// `MatrixView::dequantize_row`, with the best instruction set ([`detected_isa`]): fp8 rows
/// go through the same float16 decode as the fp8 products (AVX2/F16C), everything else through
/// the reference decoder. Used by the converter to decode FP8 checkpoint rows.
///
/// # Panics
/// If `r >= rows` or `out.len() != cols`.
pub fn dequantize_row(w: &MatrixView<'_>, r: usize, out: &mut [f32]) {
    dequantize_row_with(detected_isa(), w, r, out)
}

/// [`dequantize_row`] with an explicit instruction set (tests).
///
/// # Panics
/// As [`dequantize_row`]; also if `isa` is not supported by this CPU.
pub fn dequantize_row_with(isa: Isa, w: &MatrixView<'_>, r: usize, out: &mut [f32]) {
    require(isa);
    assert!(
        r < w.rows() && out.len() == w.cols(),
        "dequantize_row: row {r} of a [{}, {}] matrix into {} values",
        w.rows(),
        w.cols(),
        out.len()
    );
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && w.encoding() == coli_format::Encoding::Fp8 {
        // SAFETY: `require(isa)` checked AVX2, FMA and F16C; the view is fp8 with checked
        // sections; `r < rows` and `out.len() == cols` were asserted above.
        unsafe { avx2::fp8_dequantize_row(w, r, out) };
        // Rare rows (NaN codes, overflowing products, scales of 2^119 and more) take the
        // reference path, which is exact for them.
        if out.iter().all(|v| v.is_finite()) {
            return;
        }
    }
    w.dequantize_row(r, out);
}
