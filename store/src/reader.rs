//! Opening a store and fetching experts and dense tensors.

use crate::{AlignedBuf, Encoding, ExpertKey, IndexRecord, IoMode, IoPreference, Manifest, MatrixView, StoreError};
use std::path::Path;

/// Options for [`Store::open_with`].
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Verify each record's checksum on every fetch (default true).
    pub verify_checksums: bool,
    /// O_DIRECT / buffered choice (default Auto).
    pub io: IoPreference,
    /// Reads in flight at once for a batch fetch (default 4).
    pub fetch_threads: usize,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { verify_checksums: true, io: IoPreference::Auto, fetch_threads: 4 }
    }
}

/// Counters of expert reads since open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchStats {
    /// Expert records read.
    pub reads: u64,
    /// Bytes read from segment files.
    pub bytes_read: u64,
}

/// An open, validated store.
pub struct Store {
    _private: (),
}

/// One fetched expert: its record bytes in an aligned buffer, with typed views of its matrices.
pub struct ExpertBuf {
    /// Which expert.
    pub key: ExpertKey,
    /// Its encoding.
    pub encoding: Encoding,
    /// Hidden size H.
    pub hidden: usize,
    /// Intermediate size I.
    pub intermediate: usize,
    _buf: AlignedBuf,
}

/// A dense tensor, borrowed from the store's memory map.
pub struct DenseTensor<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Encoding.
    pub encoding: Encoding,
    /// Shape: [n] or [rows, cols].
    pub shape: &'a [usize],
    /// Weight section.
    pub data: &'a [u8],
    /// Scales (empty for f32/bf16).
    pub scales: &'a [f32],
}

#[allow(unused_variables, missing_docs)]
impl Store {
    pub fn open(dir: impl AsRef<Path>) -> Result<Store, StoreError> { todo!() }
    pub fn open_with(dir: impl AsRef<Path>, opts: &OpenOptions) -> Result<Store, StoreError> { todo!() }
    pub fn dir(&self) -> &Path { todo!() }
    pub fn manifest(&self) -> &Manifest { todo!() }
    pub fn model_config(&self) -> &serde_json::Value { todo!() }
    pub fn file(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> { todo!() }
    pub fn index(&self) -> &[IndexRecord] { todo!() }
    pub fn record(&self, key: ExpertKey) -> Option<&IndexRecord> { todo!() }
    pub fn fetch(&self, keys: &[ExpertKey]) -> Result<Vec<ExpertBuf>, StoreError> { todo!() }
    pub fn fetch_one(&self, key: ExpertKey) -> Result<ExpertBuf, StoreError> { todo!() }
    pub fn dense(&self, name: &str) -> Result<DenseTensor<'_>, StoreError> { todo!() }
    pub fn has_dense(&self, name: &str) -> bool { todo!() }
    pub fn io_mode(&self) -> IoMode { todo!() }
    pub fn stats(&self) -> FetchStats { todo!() }
}

#[allow(missing_docs)]
impl ExpertBuf {
    pub fn gate(&self) -> MatrixView<'_> { todo!() }
    pub fn up(&self) -> MatrixView<'_> { todo!() }
    pub fn down(&self) -> MatrixView<'_> { todo!() }
    pub fn len_bytes(&self) -> usize { todo!() }
}

#[allow(missing_docs)]
impl<'a> DenseTensor<'a> {
    pub fn matrix(&self) -> MatrixView<'a> { todo!() }
    pub fn to_f32(&self) -> Vec<f32> { todo!() }
}
