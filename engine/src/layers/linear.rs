//! A linear projection `y = W x (+ b)` over a matrix kept in its store encoding.

use coli_format::MatrixView;

/// A `[rows, cols]` weight in the store's memory map (any dense encoding), with an optional f32
/// bias of `rows` values. As torch's `nn.Linear`: `y[t] = W x[t] + b`.
pub struct Linear<'s> {
    /// Tensor name (for errors).
    pub name: String,
    /// The weight: rows = output features, cols = input features.
    pub w: MatrixView<'s>,
    /// Optional bias, f32 `[rows]`.
    pub bias: Option<Vec<f32>>,
}

impl Linear<'_> {
    /// Output features.
    pub fn rows(&self) -> usize {
        self.w.rows()
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.w.cols()
    }

    /// `y[n, rows] = x[n, cols] W^T (+ b)`: `coli_kernels::matvec` for one token, `matmul` for
    /// more (bit-identical rows). Both slices are row-major.
    pub fn forward(&self, x: &[f32], n: usize, y: &mut [f32]) {
        debug_assert_eq!(x.len(), n * self.cols());
        debug_assert_eq!(y.len(), n * self.rows());
        if n == 1 {
            coli_kernels::matvec(&self.w, x, y);
        } else {
            coli_kernels::matmul(&self.w, x, n, y);
        }
        self.add_bias(y);
    }

    /// [`Linear::forward`] with f32 activations whatever the process's numerics
    /// (`coli_kernels::Numerics::Exact`): for a product whose input another form of the same
    /// layer multiplies exactly (MLA's `kv_b`, which the absorbed decode never applies to a
    /// quantized latent).
    pub fn forward_exact(&self, x: &[f32], n: usize, y: &mut [f32]) {
        debug_assert_eq!(x.len(), n * self.cols());
        debug_assert_eq!(y.len(), n * self.rows());
        let (isa, exact) = (coli_kernels::detected_isa(), coli_kernels::Numerics::Exact);
        if n == 1 {
            coli_kernels::matvec_num(isa, exact, &self.w, x, y);
        } else {
            coli_kernels::matmul_num(isa, exact, &self.w, x, n, y);
        }
        self.add_bias(y);
    }

    /// [`Linear::forward`] for the selection and mixing products the converter keeps in their
    /// source precision (MoE routers, a DSA indexer's `weights_proj` and k-pool gate,
    /// DeepSeek-V4's compressors): a bf16 weight multiplies f32 activations whatever the
    /// numerics (q8a's bf16 rule, revision 4, is for the linears the converter re-encodes; a
    /// discrete choice such as top-k follows these); any other weight (a GGUF file's quantized
    /// one) follows the numerics as every product does.
    pub fn forward_kept(&self, x: &[f32], n: usize, y: &mut [f32]) {
        if self.w.encoding() == coli_format::Encoding::Bf16 {
            self.forward_exact(x, n, y)
        } else {
            self.forward(x, n, y)
        }
    }

    /// Adds the bias (if any) to every row of `y`.
    fn add_bias(&self, y: &mut [f32]) {
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(self.rows()) {
                for (v, bb) in row.iter_mut().zip(b) {
                    *v += bb;
                }
            }
        }
    }
}
