//! A linear projection `y = W x (+ b)` over a matrix kept in its store encoding.

use crate::error::{store_err, EngineError, Result};
use coli_store::{MatrixView, Store};

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

/// Checks that `name` exists and has `shape`.
pub(crate) fn check_shape(store: &Store, name: &str, shape: &[usize], why: &str) -> Result<()> {
    if !store.has_dense(name) {
        return Err(EngineError::MissingTensor {
            name: name.into(),
            why: why.into(),
        });
    }
    let t = store
        .dense(name)
        .map_err(store_err(format!("reading dense tensor {name}")))?;
    if t.shape != shape {
        return Err(EngineError::Shape {
            name: name.into(),
            expected: shape.to_vec(),
            found: t.shape.to_vec(),
        });
    }
    Ok(())
}

/// Reads a 1-D tensor of `len` values as f32.
pub(crate) fn load_vector(store: &Store, name: &str, len: usize, why: &str) -> Result<Vec<f32>> {
    check_shape(store, name, &[len], why)?;
    let t = store
        .dense(name)
        .map_err(store_err(format!("reading dense tensor {name}")))?;
    Ok(t.to_f32())
}

/// Borrows a 2-D tensor of `[rows, cols]` from the store's memory map.
pub(crate) fn load_matrix<'s>(
    store: &'s Store,
    name: &str,
    rows: usize,
    cols: usize,
    why: &str,
) -> Result<MatrixView<'s>> {
    check_shape(store, name, &[rows, cols], why)?;
    let t = store
        .dense(name)
        .map_err(store_err(format!("reading dense tensor {name}")))?;
    Ok(t.matrix())
}

impl<'s> Linear<'s> {
    /// Loads `{prefix}.weight` of shape `[rows, cols]` and, when `bias`, `{prefix}.bias` `[rows]`.
    ///
    /// # Errors
    /// [`EngineError::MissingTensor`] / [`EngineError::Shape`] naming the tensor.
    pub fn load(
        store: &'s Store,
        prefix: &str,
        rows: usize,
        cols: usize,
        bias: bool,
    ) -> Result<Linear<'s>> {
        let name = format!("{prefix}.weight");
        let w = load_matrix(store, &name, rows, cols, "weight of a linear layer")?;
        let bias = if bias {
            Some(load_vector(
                store,
                &format!("{prefix}.bias"),
                rows,
                "attention_bias is true",
            )?)
        } else {
            None
        };
        Ok(Linear { name, w, bias })
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.w.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.w.cols
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
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(self.rows()) {
                for (v, bb) in row.iter_mut().zip(b) {
                    *v += bb;
                }
            }
        }
    }
}
