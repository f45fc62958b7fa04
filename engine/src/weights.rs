//! [`Weights`]: the one narrow API through which a model loads its dense tensors from the store,
//! by the model spec's [`TensorSpec`]s (name and shape from `coli_format::spec`), recording every
//! tensor it loads (candle's `VarBuilder` plays this part there).

use crate::error::{store_err, EngineError, Result};
use crate::layers::{Linear, RmsNorm};
use coli_format::spec::{LinearSpec, TensorClass, TensorKind, TensorSpec};
use coli_format::MatrixView;
use coli_store::Store;
use std::collections::BTreeSet;

/// Loads dense tensors of `store` by spec and remembers which it loaded.
pub struct Weights<'s> {
    store: &'s Store,
    read: BTreeSet<String>,
}

/// What a tensor is for, in error messages.
fn purpose(t: &TensorSpec) -> String {
    let what = match t.kind {
        TensorKind::Embedding => "token embedding",
        TensorKind::OutputHead => "output projection",
        TensorKind::Linear => "weight of a linear layer",
        TensorKind::Router => "router weight",
        TensorKind::Norm => "normalization weight",
        TensorKind::Bias => "bias",
        TensorKind::Conv => "short-convolution weight",
        TensorKind::Mixing => "hyper-connection, compressor or k-pool mixing parameter",
        TensorKind::Lookup => "lookup table",
    };
    match t.class {
        TensorClass::Mtp => format!("{what} of the MTP layer"),
        _ => what.to_string(),
    }
}

impl<'s> Weights<'s> {
    /// A loader over `store`.
    pub fn new(store: &'s Store) -> Weights<'s> {
        Weights {
            store,
            read: BTreeSet::new(),
        }
    }

    /// The store.
    pub fn store(&self) -> &'s Store {
        self.store
    }

    /// Whether the store holds `t`.
    pub fn has(&self, t: &TensorSpec) -> bool {
        self.store.has_dense(&t.name)
    }

    /// `t` as a matrix view borrowed from the store's memory map (`[n]` vectors as `[1, n]`), in
    /// the order it is stored in, except that a matrix stored interleaved (format version 7)
    /// that the kernels read row-major (`--numerics exact`) comes from a row-major copy the
    /// store keeps ([`Store::dense_ordered`]).
    ///
    /// # Errors
    /// [`EngineError::MissingTensor`] when the store lacks it, [`EngineError::Shape`] when its
    /// shape is not the spec's, store errors (checksum) naming the tensor.
    pub fn matrix(&mut self, t: &TensorSpec) -> Result<MatrixView<'s>> {
        if !self.store.has_dense(&t.name) {
            return Err(EngineError::MissingTensor {
                name: t.name.clone(),
                why: purpose(t),
            });
        }
        let d = self
            .store
            .dense(&t.name)
            .map_err(store_err(format!("reading dense tensor {}", t.name)))?;
        if !t.accepts_shape(d.shape) {
            return Err(EngineError::Shape {
                name: t.name.clone(),
                expected: t.shape.clone(),
                found: d.shape.to_vec(),
            });
        }
        self.read.insert(t.name.clone());
        let m = d.matrix();
        if m.is_interleaved() && !reads_interleaved(&m) {
            return self.ordered(t, false);
        }
        Ok(m)
    }

    /// `t` row-major: [`Weights::matrix`], or a row-major copy of a matrix stored interleaved
    /// (for a reader that cuts rows anywhere, or multiplies with f32 activations).
    ///
    /// # Errors
    /// As [`Weights::matrix`].
    pub fn row_major(&mut self, t: &TensorSpec) -> Result<MatrixView<'s>> {
        let m = self.matrix(t)?;
        if m.is_interleaved() {
            return self.ordered(t, false);
        }
        Ok(m)
    }

    /// `t` in the interleaved row order or the row-major one ([`Store::dense_ordered`]).
    fn ordered(&self, t: &TensorSpec, interleaved: bool) -> Result<MatrixView<'s>> {
        self.store
            .dense_ordered(&t.name, interleaved, coli_kernels::interleave_sections)
            .map_err(store_err(format!("reading dense tensor {}", t.name)))
    }

    /// `t` as the weight of products: [`Weights::matrix`], in the interleaved row order where
    /// the kernels multiply it faster so (`coli_kernels::reads_interleaved`: as stored, format
    /// version 7, or a copy the store keeps, [`Store::dense_ordered`]). The same numbers either
    /// way.
    ///
    /// # Errors
    /// As [`Weights::matrix`].
    pub fn product_matrix(&mut self, t: &TensorSpec) -> Result<MatrixView<'s>> {
        let m = self.matrix(t)?;
        if !coli_kernels::prefers_interleaved(&m) {
            return Ok(m);
        }
        self.ordered(t, true)
    }

    /// `t` (a vector) decoded to f32.
    ///
    /// # Errors
    /// As [`Weights::matrix`].
    pub fn vector(&mut self, t: &TensorSpec) -> Result<Vec<f32>> {
        let m = self.matrix(t)?;
        let mut out = vec![0f32; m.rows() * m.cols()];
        if m.cols() > 0 {
            for (r, row) in out.chunks_exact_mut(m.cols()).enumerate() {
                m.dequantize_row(r, row);
            }
        }
        Ok(out)
    }

    /// A linear layer: its weight and, when the spec has one, its bias.
    ///
    /// # Errors
    /// As [`Weights::matrix`], for either tensor.
    pub fn linear(&mut self, l: &LinearSpec) -> Result<Linear<'s>> {
        let w = self.product_matrix(&l.weight)?;
        self.linear_of(l, w)
    }

    /// A linear layer that multiplies with f32 activations whatever the numerics
    /// ([`Linear::forward_exact`]): its weight row-major ([`Weights::matrix`], or a row-major
    /// copy of a matrix stored interleaved; the interleaved order serves the integer kernels
    /// only).
    ///
    /// # Errors
    /// As [`Weights::linear`].
    pub fn exact_linear(&mut self, l: &LinearSpec) -> Result<Linear<'s>> {
        let w = self.row_major(&l.weight)?;
        self.linear_of(l, w)
    }

    fn linear_of(&mut self, l: &LinearSpec, w: MatrixView<'s>) -> Result<Linear<'s>> {
        Ok(Linear {
            name: l.weight.name.clone(),
            w,
            bias: match &l.bias {
                Some(b) => Some(self.vector(b)?),
                None => None,
            },
        })
    }

    /// An RMSNorm with weight `t` and epsilon `eps`.
    ///
    /// # Errors
    /// As [`Weights::matrix`].
    pub fn rms_norm(&mut self, t: &TensorSpec, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: self.vector(t)?,
            eps,
        })
    }

    /// The names of every tensor loaded so far.
    pub fn into_read(self) -> BTreeSet<String> {
        self.read
    }
}

/// Whether the kernels read `m`'s matrix in the interleaved row order.
pub(crate) fn reads_interleaved(m: &MatrixView<'_>) -> bool {
    coli_kernels::reads_interleaved(m.encoding(), m.rows(), m.cols())
}
