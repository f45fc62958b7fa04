//! A validating safetensors reader (format: <https://github.com/huggingface/safetensors>).
//!
//! Layout of a file: `u64` little-endian header length `N`, then `N` bytes of UTF-8 JSON mapping
//! tensor names to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets in bytes,
//! relative to byte `8 + N`), plus an optional `"__metadata__"` string map; then the data.
//!
//! Everything is checked before any data is used: header length within the file and at most
//! [`MAX_HEADER_BYTES`], valid JSON without duplicate keys (at any depth), supported dtypes,
//! `product(shape) * dtype size == end - begin`, offsets inside the file and not overlapping.
//! A Git-LFS pointer file in place of a shard is recognized and named as such.
//!
//! The data is memory-mapped read-only; tensor data alignment is not guaranteed by the format,
//! so every consumer reads it bytewise (`from_le_bytes`), never through typed slices.

use crate::error::{ConvertError, Result};
use memmap2::Mmap;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest accepted JSON header, bytes (100 MB).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Element types the converter reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// `F8_E4M3`: float8 e4m3fn, 1 byte.
    F8E4M3,
    /// `BF16`: bfloat16, 2 bytes.
    Bf16,
    /// `F16`: IEEE half, 2 bytes.
    F16,
    /// `F32`: IEEE single, 4 bytes.
    F32,
    /// `U8`: raw bytes; only MXFP4 expert blocks (two e2m1 codes per byte) and their e8m0
    /// scales are read as U8.
    U8,
    /// `I64`: little-endian signed 64-bit integers; only lookup tables (DeepSeek-V4's
    /// `tid2eid`) are read as I64, stored as exact f32 values.
    I64,
    /// `I8`: raw bytes; only DeepSeek-V4's FP4 experts (two e2m1 codes per byte, low nibble
    /// first, `[rows, cols / 2]`) are read as I8.
    I8,
    /// `F8_E8M0`: a power of two `2^(code - 127)` (0xFF: NaN), 1 byte: block scales
    /// (DeepSeek-V4's `.scale` of its FP8 and FP4 weights).
    F8E8M0,
}

impl Dtype {
    /// Parses a safetensors dtype string; `None` for the ones the converter does not handle.
    pub fn parse(s: &str) -> Option<Dtype> {
        Some(match s {
            "F8_E4M3" => Dtype::F8E4M3,
            "BF16" => Dtype::Bf16,
            "F16" => Dtype::F16,
            "F32" => Dtype::F32,
            "U8" => Dtype::U8,
            "I64" => Dtype::I64,
            "I8" => Dtype::I8,
            "F8_E8M0" => Dtype::F8E8M0,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F8E4M3 | Dtype::U8 | Dtype::I8 | Dtype::F8E8M0 => 1,
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
            Dtype::I64 => 8,
        }
    }

    /// The safetensors spelling.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::Bf16 => "BF16",
            Dtype::F16 => "F16",
            Dtype::F32 => "F32",
            Dtype::U8 => "U8",
            Dtype::I64 => "I64",
            Dtype::I8 => "I8",
            Dtype::F8E8M0 => "F8_E8M0",
        }
    }
}

/// One tensor's header entry, with absolute byte offsets in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Element type.
    pub dtype: Dtype,
    /// Shape (row-major; for 2-D weights `[out_features, in_features]`).
    pub shape: Vec<usize>,
    /// Absolute offset of the first data byte in the file.
    pub start: usize,
    /// Absolute offset one past the last data byte.
    pub end: usize,
}

impl TensorInfo {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Data bytes.
    pub fn nbytes(&self) -> usize {
        self.end - self.start
    }
}

/// A parsed, validated, memory-mapped safetensors file.
pub struct Shard {
    /// Full path.
    pub path: PathBuf,
    /// File name inside the checkpoint directory.
    pub name: String,
    /// File size, bytes.
    pub size: u64,
    /// `8 + N`: bytes of length prefix plus JSON header.
    pub header_bytes: usize,
    /// xxh3-64 (seed 0) of the first `8 + N` bytes (FORMAT.md section 2, `sources`).
    pub header_xxh3: u64,
    /// Tensors by name.
    pub tensors: BTreeMap<String, TensorInfo>,
    map: Option<Mmap>,
    file: File,
}

fn st_err(path: &Path, what: impl Into<String>) -> ConvertError {
    ConvertError::Safetensors {
        file: path.to_path_buf(),
        what: what.into(),
    }
}

impl Shard {
    /// Opens, validates and memory-maps a safetensors file.
    ///
    /// # Errors
    /// [`ConvertError::Io`] when the file cannot be opened or read;
    /// [`ConvertError::Safetensors`] for a Git-LFS pointer, a truncated file, a header length
    /// past the end of the file or above 100 MB, invalid JSON, duplicate keys, an unsupported
    /// dtype, a shape disagreeing with its data offsets, offsets out of bounds or overlapping.
    pub fn open(path: &Path, name: &str) -> Result<Shard> {
        let mut file = File::open(path).map_err(|e| ConvertError::io(path, e))?;
        let size = file
            .metadata()
            .map_err(|e| ConvertError::io(path, e))?
            .len();
        let mut head = Vec::with_capacity(64);
        (&mut file)
            .take(64)
            .read_to_end(&mut head)
            .map_err(|e| ConvertError::io(path, e))?;
        if head.starts_with(b"version https://git-lfs") {
            return Err(st_err(
                path,
                "this is a Git-LFS pointer file, not the tensor data: fetch the real file \
                 (`git lfs pull` or download it with huggingface-cli)",
            ));
        }
        if size < 8 || head.len() < 8 {
            return Err(st_err(
                path,
                format!("file is {size} bytes, too short for a safetensors header (truncated?)"),
            ));
        }
        let n = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
        if n > MAX_HEADER_BYTES {
            return Err(st_err(
                path,
                format!("header length {n} exceeds the 100 MB limit (not a safetensors file, or corrupt)"),
            ));
        }
        if 8 + n > size {
            return Err(st_err(
                path,
                format!(
                    "header length {n} runs past the end of the file ({size} bytes): the file is truncated or not safetensors"
                ),
            ));
        }
        let header_bytes = 8 + n as usize;
        // SAFETY: the file is opened read-only and the mapping is private and read-only. The
        // converter's contract (docs/CONVERT.md) is that input checkpoints are not modified
        // while it runs; every access below is bounds-checked against the validated offsets.
        let map = if size > 0 {
            // SAFETY: see above: read-only private mapping of a file not modified meanwhile.
            Some(unsafe { Mmap::map(&file) }.map_err(|e| ConvertError::io(path, e))?)
        } else {
            None
        };
        if let Some(m) = &map {
            // The preflight then touches only small, scattered scale tensors: without this,
            // every first touch reads a whole readahead window (often MBs) around it, i.e.
            // most of the checkpoint. `read_sequentially` switches back before converting.
            let _ = m.advise(memmap2::Advice::Random);
        }
        let bytes: &[u8] = map.as_deref().unwrap_or(&[]);
        let header = &bytes[8..header_bytes];
        let header_xxh3 = xxhash_rust::xxh3::xxh3_64(&bytes[..header_bytes]);
        let tensors = parse_header(path, header, size - header_bytes as u64, header_bytes)?;
        Ok(Shard {
            path: path.to_path_buf(),
            name: name.to_string(),
            size,
            header_bytes,
            header_xxh3,
            tensors,
            map,
            file,
        })
    }

    /// The data bytes of a tensor (unaligned; read bytewise).
    pub fn data(&self, t: &TensorInfo) -> &[u8] {
        &self.map.as_deref().unwrap_or(&[])[t.start..t.end]
    }

    /// Restores normal readahead on the mapping (it is opened with `MADV_RANDOM` so that the
    /// preflight's scattered scale reads do not pull in whole readahead windows); call before
    /// streaming the tensors. Errors are ignored (advice only).
    pub fn read_sequentially(&self) {
        if let Some(m) = &self.map {
            let _ = m.advise(memmap2::Advice::Normal);
        }
    }

    /// Asks the kernel to start reading the bytes of `t` into the page cache now
    /// (`posix_fadvise(POSIX_FADV_WILLNEED)`: asynchronous readahead), so that a later access
    /// through the mapping does not wait for the disk. Errors are ignored (advice only).
    pub fn prefetch(&self, t: &TensorInfo) {
        if t.end <= t.start {
            return;
        }
        use std::os::unix::io::AsRawFd;
        // SAFETY: plain syscall on a valid open file descriptor; no memory is passed.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                t.start as libc::off_t,
                (t.end - t.start) as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            );
        }
    }

    /// Tells the kernel that the pages of `t` are no longer needed: `madvise(MADV_DONTNEED)` on
    /// the mapping and `posix_fadvise(POSIX_FADV_DONTNEED)` on the file, so a conversion's page
    /// cache footprint stays bounded. Errors are ignored (advice only).
    pub fn release(&self, t: &TensorInfo) {
        if t.end <= t.start {
            return;
        }
        if let Some(map) = &self.map {
            // SAFETY: the mapping is a private read-only file mapping; MADV_DONTNEED only drops
            // pages, which are faulted in again from the unchanged file if read later, and no
            // slice into the dropped range is alive across this call in a way that could
            // observe different contents (the file is not modified).
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    t.start,
                    t.end - t.start,
                )
            };
        }
        use std::os::unix::io::AsRawFd;
        // SAFETY: plain syscall on a valid open file descriptor; no memory is passed.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                t.start as libc::off_t,
                (t.end - t.start) as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }
}

/// Parses and validates a header. `data_len` is the size of the data section; `base` is `8+N`.
fn parse_header(
    path: &Path,
    header: &[u8],
    data_len: u64,
    base: usize,
) -> Result<BTreeMap<String, TensorInfo>> {
    let text = std::str::from_utf8(header)
        .map_err(|e| st_err(path, format!("header is not UTF-8: {e}")))?;
    let mut de = serde_json::Deserializer::from_str(text);
    let root = StrictValue::deserialize_strict(&mut de)
        .map_err(|e| st_err(path, format!("invalid JSON header: {e}")))?;
    de.end()
        .map_err(|e| st_err(path, format!("invalid JSON header: {e}")))?;
    let Value::Object(root) = root else {
        return Err(st_err(path, "JSON header is not an object"));
    };
    let mut out = BTreeMap::new();
    let mut spans: Vec<(u64, u64, String)> = Vec::new();
    for (name, v) in root {
        if name == "__metadata__" {
            match &v {
                Value::Object(m) if m.values().all(Value::is_string) => continue,
                _ => return Err(st_err(path, "__metadata__ must be a map of strings")),
            }
        }
        let bad = |what: String| st_err(path, format!("tensor {name}: {what}"));
        let Value::Object(entry) = v else {
            return Err(bad("header entry is not an object".into()));
        };
        let dtype_s = entry
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("missing string field \"dtype\"".into()))?;
        let dtype = Dtype::parse(dtype_s).ok_or_else(|| {
            bad(format!(
                "unsupported dtype {dtype_s} (coli-convert reads F8_E4M3, BF16, F16, F32, U8 MXFP4 blocks, I8 FP4 experts, F8_E8M0 scales and I64 lookup tables)"
            ))
        })?;
        let shape: Vec<u64> = entry
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
            .ok_or_else(|| bad("\"shape\" is not an array of non-negative integers".into()))?;
        let offs: Vec<u64> = entry
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
            .filter(|a| a.len() == 2)
            .ok_or_else(|| bad("\"data_offsets\" is not [begin, end]".into()))?;
        let (b, e) = (offs[0], offs[1]);
        if b > e {
            return Err(bad(format!("data_offsets [{b}, {e}] has begin > end")));
        }
        if e > data_len {
            return Err(bad(format!(
                "data_offsets [{b}, {e}] out of bounds: the data section is {data_len} bytes (file truncated?)"
            )));
        }
        let nbytes = shape
            .iter()
            .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
        if nbytes != e - b {
            return Err(bad(format!(
                "shape {shape:?} of {dtype_s} needs {nbytes} bytes but data_offsets [{b}, {e}] span {} bytes",
                e - b
            )));
        }
        spans.push((b, e, name.clone()));
        out.insert(
            name.clone(),
            TensorInfo {
                dtype,
                shape: shape.iter().map(|&d| d as usize).collect(),
                start: base + b as usize,
                end: base + e as usize,
            },
        );
    }
    spans.sort();
    for w in spans.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if b.0 < a.1 && b.1 > b.0 && a.1 > a.0 {
            return Err(st_err(
                path,
                format!(
                    "tensors {} [{}, {}] and {} [{}, {}] overlap",
                    a.2, a.0, a.1, b.2, b.0, b.1
                ),
            ));
        }
    }
    Ok(out)
}

/// A JSON value deserializer that refuses duplicate object keys at any depth (serde_json keeps
/// the last one silently).
struct StrictValue;

impl StrictValue {
    fn deserialize_strict<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictSeed;

impl<'de> de::DeserializeSeed<'de> for StrictSeed {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = seq.next_element_seed(StrictSeed)? {
            v.push(x);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut m = serde_json::Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let v = map.next_value_seed(StrictSeed)?;
            if m.contains_key(&k) {
                return Err(de::Error::custom(format!("duplicate key \"{k}\"")));
            }
            m.insert(k, v);
        }
        Ok(Value::Object(m))
    }
}

/// Parses JSON text refusing duplicate keys at any depth (used for config.json and the index).
///
/// # Errors
/// The serde_json error, including "duplicate key" ones.
pub fn parse_json_strict(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let v = StrictValue::deserialize_strict(&mut de)?;
    de.end()?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(h: &str, data_len: u64) -> Result<BTreeMap<String, TensorInfo>> {
        parse_header(
            Path::new("s.safetensors"),
            h.as_bytes(),
            data_len,
            8 + h.len(),
        )
    }

    #[test]
    fn valid_header_with_metadata_and_empty_tensor() {
        let h = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F8_E4M3","shape":[2,3],"data_offsets":[0,6]},"e":{"dtype":"F32","shape":[0],"data_offsets":[6,6]},"b":{"dtype":"F16","shape":[1],"data_offsets":[6,8]}}"#;
        let t = parse(h, 8).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t["a"].start, 8 + h.len());
        assert_eq!(t["b"].nbytes(), 2);
    }

    #[test]
    fn nested_duplicate_keys_refused() {
        let h = r#"{"a":{"dtype":"F16","dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        let e = parse(h, 4).unwrap_err().to_string();
        assert!(e.contains("duplicate key \"dtype\""), "{e}");
    }

    #[test]
    fn begin_after_end_and_bad_metadata_refused() {
        let e = parse(
            r#"{"a":{"dtype":"F16","shape":[0],"data_offsets":[4,2]}}"#,
            4,
        )
        .unwrap_err();
        assert!(e.to_string().contains("begin > end"), "{e}");
        let e = parse(r#"{"__metadata__":{"x":1}}"#, 0).unwrap_err();
        assert!(e.to_string().contains("__metadata__"), "{e}");
    }
}
