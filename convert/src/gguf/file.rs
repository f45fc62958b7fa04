//! Reading a GGUF file (llama.cpp's `gguf` format, versions 2 and 3): the header, the metadata
//! key-value pairs and the tensor infos are parsed with every length and offset checked
//! against the file; tensor data stays in a read-only memory map and is read only when a
//! tensor is converted. Split files (`NAME-00001-of-00003.gguf`) are opened together
//! ([`Gguf::open`]).
//!
//! Layout (gguf-py `gguf_reader.py` and `gguf_writer.py`, ggml's `docs/gguf.md`): magic
//! `GGUF`, u32 version, u64 tensor count, u64 key-value count; each key a u64-length string,
//! a u32 value type and the value (arrays: u32 element type, u64 count, elements); each tensor
//! info a name, u32 dimension count, u64 dimensions (`ne`, innermost first), u32 ggml type and
//! u64 offset relative to the data section, which starts at the end of the infos rounded up to
//! `general.alignment` (32 when absent). All little-endian.
//!
//! No kept Rust crate fitted (gguf 0.1.2 is unmaintained since 2023; gguf-rs reads everything
//! into owned values and does not check tensor extents against the file), and errors here name
//! the file, key and tensor.

use crate::error::{ConvertError, Result};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// The GGUF magic, bytes 0..4.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// Default alignment of the data section and of every tensor's offset.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Weights per block and bytes per block of every ggml type id a GGUF may hold (gguf-py
/// `GGML_QUANT_SIZES`), decodable by coli or not: used to check tensor extents.
pub fn type_sizes(id: u32) -> Option<(u64, u64, &'static str)> {
    Some(match id {
        0 => (1, 4, "F32"),
        1 => (1, 2, "F16"),
        2 => (32, 18, "Q4_0"),
        3 => (32, 20, "Q4_1"),
        6 => (32, 22, "Q5_0"),
        7 => (32, 24, "Q5_1"),
        8 => (32, 34, "Q8_0"),
        9 => (32, 40, "Q8_1"),
        10 => (256, 84, "Q2_K"),
        11 => (256, 110, "Q3_K"),
        12 => (256, 144, "Q4_K"),
        13 => (256, 176, "Q5_K"),
        14 => (256, 210, "Q6_K"),
        15 => (256, 292, "Q8_K"),
        16 => (256, 66, "IQ2_XXS"),
        17 => (256, 74, "IQ2_XS"),
        18 => (256, 98, "IQ3_XXS"),
        19 => (256, 50, "IQ1_S"),
        20 => (32, 18, "IQ4_NL"),
        21 => (256, 110, "IQ3_S"),
        22 => (256, 82, "IQ2_S"),
        23 => (256, 136, "IQ4_XS"),
        24 => (1, 1, "I8"),
        25 => (1, 2, "I16"),
        26 => (1, 4, "I32"),
        27 => (1, 8, "I64"),
        28 => (1, 8, "F64"),
        29 => (256, 56, "IQ1_M"),
        30 => (1, 2, "BF16"),
        34 => (256, 54, "TQ1_0"),
        35 => (256, 66, "TQ2_0"),
        39 => (32, 17, "MXFP4"),
        _ => return None,
    })
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Any unsigned integer type (u8, u16, u32, u64).
    Uint(u64),
    /// Any signed integer type (i8, i16, i32, i64).
    Int(i64),
    /// f64, or an f32 as the shortest decimal that rounds to it.
    Float(f64),
    /// bool.
    Bool(bool),
    /// UTF-8 string.
    Str(String),
    /// Array of values.
    Array(Vec<Value>),
}

impl std::fmt::Display for Value {
    /// The value as a GGUF tool prints it: numbers and bools plainly, strings quoted, arrays by
    /// their length.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Uint(v) => write!(f, "{v}"),
            Value::Int(v) => write!(f, "{v}"),
            Value::Float(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::Str(v) => write!(f, "{v:?}"),
            Value::Array(a) => write!(f, "an array of {}", a.len()),
        }
    }
}

impl Value {
    /// A bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A non-negative integer value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::Uint(v) => Some(v),
            Value::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// A number as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Uint(v) => Some(v as f64),
            Value::Int(v) => Some(v as f64),
            Value::Float(v) => Some(v),
            _ => None,
        }
    }
    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    /// An array value.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor of a GGUF.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// Name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions as GGUF stores them, innermost first (`ne[0]` is the row length).
    pub dims: Vec<u64>,
    /// ggml type id.
    pub ggml_type: u32,
    /// Index of the file holding it ([`Gguf::files`]).
    pub file: usize,
    /// Absolute byte offset of its data in that file.
    pub start: usize,
    /// Bytes of data.
    pub nbytes: usize,
}

impl TensorInfo {
    /// The type's name (`Q4_K`), or its id when unknown.
    pub fn type_name(&self) -> String {
        type_sizes(self.ggml_type)
            .map_or_else(|| format!("type {}", self.ggml_type), |t| t.2.into())
    }
    /// The shape as coli writes it: outermost first (`[rows, cols]`, `[E, rows, cols]`).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// One opened file of a GGUF.
pub struct GgufPart {
    /// Full path.
    pub path: PathBuf,
    /// File name.
    pub name: String,
    /// Size, bytes.
    pub size: u64,
    /// Bytes of header, metadata and tensor infos (before the data section's padding).
    pub header_len: usize,
    /// xxh3-64 (seed 0) of those bytes (the store's `sources`).
    pub header_xxh3: u64,
    map: Mmap,
    file: File,
}

/// An opened GGUF: metadata of the first file, tensors of every split file.
pub struct Gguf {
    /// The files (one, or every split in order).
    pub files: Vec<GgufPart>,
    /// Format version of the first file (2 or 3).
    pub version: u32,
    /// Metadata key-value pairs (of the first file; split files repeat only `split.*`).
    pub kv: BTreeMap<String, Value>,
    /// Tensors by name.
    pub tensors: BTreeMap<String, TensorInfo>,
    /// Tensor names in file order (the first file's, then each split's).
    pub order: Vec<String>,
    /// The first file's key-value pairs as stored, `split.*` left out: what a GGUF written back
    /// from the store repeats byte for byte (`write::export_files`).
    pub kv_raw: Vec<(String, Vec<u8>)>,
}

fn gerr(path: &Path, what: impl Into<String>) -> ConvertError {
    ConvertError::Gguf {
        file: path.to_path_buf(),
        what: what.into(),
    }
}

/// A bounds-checked reader over the header bytes.
struct Cur<'a> {
    b: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        match self.pos.checked_add(n).filter(|&e| e <= self.b.len()) {
            Some(end) => {
                let s = &self.b[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(gerr(
                self.path,
                format!(
                    "truncated: {} needs {n} bytes at offset {}, the file has {}",
                    what(),
                    self.pos,
                    self.b.len()
                ),
            )),
        }
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4"),
        ))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8"),
        ))
    }
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let n = self.u64(what)?;
        let n =
            usize::try_from(n).map_err(|_| gerr(self.path, format!("{}: length {n}", what())))?;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| gerr(self.path, format!("{} is not UTF-8", what())))
    }
    fn value(&mut self, ty: u32, what: &dyn Fn() -> String, depth: u32) -> Result<Value> {
        Ok(match ty {
            0 => Value::Uint(self.take(1, what)?[0] as u64),
            1 => Value::Int(self.take(1, what)?[0] as i8 as i64),
            2 => Value::Uint(u16::from_le_bytes(self.take(2, what)?.try_into().expect("2")) as u64),
            3 => Value::Int(i16::from_le_bytes(self.take(2, what)?.try_into().expect("2")) as i64),
            4 => Value::Uint(self.u32(what)? as u64),
            5 => Value::Int(self.u32(what)? as i32 as i64),
            // An f32 as the decimal it was written from (its shortest representation):
            // 1e-5 stays 1e-5, not 9.99999974738e-06.
            6 => {
                let v = f32::from_bits(self.u32(what)?);
                Value::Float(v.to_string().parse().unwrap_or(v as f64))
            }
            7 => match self.take(1, what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(gerr(self.path, format!("{}: bool byte {b}", what()))),
            },
            8 => Value::Str(self.string(what)?),
            9 => {
                if depth > 0 {
                    return Err(gerr(self.path, format!("{}: nested arrays", what())));
                }
                let ety = self.u32(what)?;
                let n = self.u64(what)?;
                // Every element takes at least one byte: a count beyond the file is corrupt.
                if n > (self.b.len() - self.pos) as u64 {
                    return Err(gerr(
                        self.path,
                        format!(
                            "{}: array of {n} elements runs past the end of the file",
                            what()
                        ),
                    ));
                }
                // Grown as read: a count is checked against the bytes left, not trusted for an
                // allocation.
                let mut v = Vec::with_capacity((n as usize).min(1 << 16));
                for _ in 0..n {
                    v.push(self.value(ety, what, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::Uint(self.u64(what)?),
            11 => Value::Int(self.u64(what)? as i64),
            12 => Value::Float(f64::from_bits(self.u64(what)?)),
            t => {
                return Err(gerr(
                    self.path,
                    format!("{}: unknown value type {t}", what()),
                ))
            }
        })
    }
}

/// The parsed header of one file.
struct Header {
    version: u32,
    kv: BTreeMap<String, Value>,
    /// Each key-value pair's bytes as stored (key string, type, value), in file order.
    kv_raw: Vec<(String, std::ops::Range<usize>)>,
    tensors: Vec<TensorInfo>,
    header_len: usize,
}

fn parse(path: &Path, b: &[u8], file: usize) -> Result<Header> {
    let mut c = Cur { b, pos: 0, path };
    let magic = c.take(4, &|| "the magic".into())?;
    if magic != MAGIC {
        return Err(gerr(
            path,
            format!("not a GGUF file: magic {magic:02x?}, expected \"GGUF\""),
        ));
    }
    let version = c.u32(&|| "the version".into())?;
    if !(2..=3).contains(&version) {
        return Err(gerr(
            path,
            format!("GGUF version {version}: coli reads versions 2 and 3 (GGUF version 1, llama.cpp's of 2023, must be converted again with a current llama.cpp; a newer version is not known to coli)"),
        ));
    }
    let n_tensors = c.u64(&|| "the tensor count".into())?;
    let n_kv = c.u64(&|| "the key-value count".into())?;
    // A key takes at least 12 bytes, a tensor info at least 24.
    if n_kv > b.len() as u64 / 12 || n_tensors > b.len() as u64 / 24 {
        return Err(gerr(
            path,
            format!("{n_tensors} tensors and {n_kv} keys cannot fit in {} bytes: the file is truncated or corrupt", b.len()),
        ));
    }
    let mut kv = BTreeMap::new();
    let mut kv_raw = Vec::with_capacity((n_kv as usize).min(1 << 12));
    for i in 0..n_kv {
        let start = c.pos;
        let key = c.string(&|| format!("key {i}"))?;
        let w = || format!("the value of {key}");
        let ty = c.u32(&w)?;
        let v = c.value(ty, &w, 0)?;
        if kv.insert(key.clone(), v).is_some() {
            return Err(gerr(path, format!("key {key} appears twice")));
        }
        kv_raw.push((key, start..c.pos));
    }
    let mut infos = Vec::with_capacity((n_tensors as usize).min(1 << 16));
    for i in 0..n_tensors {
        let name = c.string(&|| format!("the name of tensor {i}"))?;
        let w = || format!("the info of tensor {name}");
        let nd = c.u32(&w)?;
        if nd == 0 || nd > 4 {
            return Err(gerr(
                path,
                format!("tensor {name}: {nd} dimensions (1 to 4 expected)"),
            ));
        }
        let mut dims = Vec::with_capacity(nd as usize);
        for _ in 0..nd {
            dims.push(c.u64(&w)?);
        }
        let ggml_type = c.u32(&w)?;
        let offset = c.u64(&w)?;
        infos.push((name, dims, ggml_type, offset));
    }
    let header_len = c.pos;
    let align = match kv.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() => a,
            _ => {
                return Err(gerr(
                    path,
                    format!("general.alignment {v} is not a power of two"),
                ))
            }
        },
    };
    let data_start = (header_len as u64).div_ceil(align) * align;
    let mut tensors = Vec::with_capacity(infos.len());
    for (name, dims, ggml_type, offset) in infos {
        let Some((bs, ts, tname)) = type_sizes(ggml_type) else {
            return Err(gerr(
                path,
                format!("tensor {name}: unknown ggml type id {ggml_type}"),
            ));
        };
        let n = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let nbytes = match n {
            Some(n) if dims[0] % bs == 0 => (n / bs).checked_mul(ts),
            Some(_) => {
                return Err(gerr(
                    path,
                    format!(
                        "tensor {name}: row length {} is not a multiple of {tname}'s block of {bs}",
                        dims[0]
                    ),
                ))
            }
            None => None,
        };
        if offset % align != 0 {
            return Err(gerr(
                path,
                format!(
                    "tensor {name}: offset {offset} is not a multiple of the alignment {align}"
                ),
            ));
        }
        let start = data_start.checked_add(offset);
        let end = nbytes.and_then(|nb| start?.checked_add(nb));
        match (start, end) {
            (Some(s), Some(e)) if e <= b.len() as u64 => tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                file,
                start: s as usize,
                nbytes: (e - s) as usize,
            }),
            _ => {
                // Where it would end, in file bytes (the header's offsets count from the data
                // section, which starts at byte `data_start`).
                let what = match (start, end) {
                    (Some(s), Some(e)) => format!(
                        "would take bytes {s} to {e} of the file, past its end ({} bytes): the file is truncated",
                        b.len()
                    ),
                    _ => "would take more bytes than a file can hold: the header is corrupt"
                        .to_string(),
                };
                return Err(gerr(
                    path,
                    format!(
                        "tensor {name} ({tname} {dims:?}) at data offset {offset} (the data section starts at byte {data_start}) {what}"
                    ),
                ));
            }
        }
    }
    // No two tensors overlap.
    let mut spans: Vec<(usize, usize, &str)> = tensors
        .iter()
        .map(|t| (t.start, t.start + t.nbytes, t.name.as_str()))
        .collect();
    spans.sort();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(gerr(
                path,
                format!("tensors {} and {} overlap", w[0].2, w[1].2),
            ));
        }
    }
    Ok(Header {
        version,
        kv,
        kv_raw,
        tensors,
        header_len,
    })
}

/// The key-value pairs of GGUF bytes `b` (a header without tensors will do) and the bytes
/// they and the header took.
///
/// # Errors
/// As [`Gguf::open`] for a malformed header.
pub(crate) fn parse_kv(path: &Path, b: &[u8]) -> Result<(BTreeMap<String, Value>, usize)> {
    let h = parse(path, b, 0)?;
    Ok((h.kv, h.header_len))
}

fn open_part(path: &Path) -> Result<(GgufPart, Header)> {
    let file = File::open(path).map_err(|e| ConvertError::io(path, e))?;
    let size = file
        .metadata()
        .map_err(|e| ConvertError::io(path, e))?
        .len();
    if size < 24 {
        return Err(gerr(
            path,
            format!("file is {size} bytes, too short for a GGUF header (truncated?)"),
        ));
    }
    // SAFETY: the file is opened read-only and the mapping is private and read-only. The
    // converter's contract (docs/CONVERT.md) is that inputs are not modified while it runs;
    // every access is bounds-checked against the parsed extents.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| ConvertError::io(path, e))?;
    let h = parse(path, &map, 0)?;
    let header_xxh3 = xxhash_rust::xxh3::xxh3_64(&map[..h.header_len]);
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    Ok((
        GgufPart {
            path: path.to_path_buf(),
            name,
            size,
            header_len: h.header_len,
            header_xxh3,
            map,
            file,
        },
        h,
    ))
}

/// `(prefix, index, count)` of a split file name `PREFIX-00001-of-00003.gguf`.
fn split_name(name: &str) -> Option<(&str, u32, u32)> {
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, idx) = rest.rsplit_once('-')?;
    if idx.len() != 5 || count.len() != 5 {
        return None;
    }
    Some((prefix, idx.parse().ok()?, count.parse().ok()?))
}

impl Gguf {
    /// Opens a GGUF file, or every file of a split GGUF when `path` is one of them
    /// (`-00001-of-00003.gguf`; its `split.count` must agree).
    ///
    /// # Errors
    /// [`ConvertError::Io`] for a file that cannot be opened; [`ConvertError::Gguf`] naming the
    /// file and key or tensor for a truncated file, a bad magic or version, an unknown value
    /// or ggml type, a tensor past the end of its file or overlapping another, a split file
    /// missing, or a tensor in two splits.
    pub fn open(path: &Path) -> Result<Gguf> {
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let paths: Vec<PathBuf> = match split_name(&name) {
            Some((prefix, _, count)) if count > 1 => (1..=count)
                .map(|i| path.with_file_name(format!("{prefix}-{i:05}-of-{count:05}.gguf")))
                .collect(),
            _ => vec![path.to_path_buf()],
        };
        for p in &paths {
            if !p.is_file() {
                return Err(gerr(
                    p,
                    format!("missing: {} is one file of a split GGUF of {} files; all must be in the same directory", name, paths.len()),
                ));
            }
        }
        let mut files = Vec::new();
        let mut tensors = BTreeMap::new();
        let mut order = Vec::new();
        let mut kv_raw = Vec::new();
        let mut first: Option<(u32, BTreeMap<String, Value>)> = None;
        for (i, p) in paths.iter().enumerate() {
            let (part, mut h) = open_part(p)?;
            if paths.len() > 1 {
                let count = h.kv.get("split.count").and_then(Value::as_u64);
                let no = h.kv.get("split.no").and_then(Value::as_u64);
                if count != Some(paths.len() as u64) || no != Some(i as u64) {
                    let show = |v: Option<u64>| v.map_or("absent".to_string(), |v| v.to_string());
                    return Err(gerr(
                        p,
                        format!(
                            "split.count {} / split.no {} do not match file {} of {}",
                            show(count),
                            show(no),
                            i + 1,
                            paths.len()
                        ),
                    ));
                }
            }
            if first.is_none() {
                kv_raw = h
                    .kv_raw
                    .iter()
                    .filter(|(k, _)| !k.starts_with("split."))
                    .map(|(k, r)| (k.clone(), part.map[r.clone()].to_vec()))
                    .collect();
            }
            for mut t in h.tensors.drain(..) {
                t.file = i;
                order.push(t.name.clone());
                if let Some(old) = tensors.insert(t.name.clone(), t) {
                    return Err(gerr(
                        p,
                        format!(
                            "tensor {} is also in {}",
                            old.name,
                            paths[old.file].display()
                        ),
                    ));
                }
            }
            if first.is_none() {
                first = Some((h.version, h.kv));
            }
            files.push(part);
        }
        let (version, kv) = first.expect("at least one file");
        Ok(Gguf {
            files,
            version,
            kv,
            tensors,
            order,
            kv_raw,
        })
    }

    /// The path of the first file (for errors about metadata).
    pub fn path(&self) -> &Path {
        &self.files[0].path
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv.get(key)
    }

    /// A required non-negative integer key.
    ///
    /// # Errors
    /// [`ConvertError::Gguf`] naming the key when it is absent or not such an integer.
    pub fn u64(&self, key: &str) -> Result<u64> {
        self.get(key).and_then(Value::as_u64).ok_or_else(|| {
            gerr(
                self.path(),
                format!("metadata key {key} is missing or not a non-negative integer"),
            )
        })
    }

    /// A required number key.
    ///
    /// # Errors
    /// [`ConvertError::Gguf`] naming the key when it is absent or not a number.
    pub fn f64(&self, key: &str) -> Result<f64> {
        self.get(key)
            .and_then(Value::as_f64)
            .filter(|v| v.is_finite())
            .ok_or_else(|| {
                gerr(
                    self.path(),
                    format!("metadata key {key} is missing or not a finite number"),
                )
            })
    }

    /// A required string key.
    ///
    /// # Errors
    /// [`ConvertError::Gguf`] naming the key when it is absent or not a string.
    pub fn str(&self, key: &str) -> Result<&str> {
        self.get(key).and_then(Value::as_str).ok_or_else(|| {
            gerr(
                self.path(),
                format!("metadata key {key} is missing or not a string"),
            )
        })
    }

    /// The data bytes of a tensor.
    pub fn data(&self, t: &TensorInfo) -> &[u8] {
        &self.files[t.file].map[t.start..t.start + t.nbytes]
    }

    /// Starts asynchronous readahead of a byte range of a tensor (advice only).
    pub fn prefetch(&self, t: &TensorInfo, off: usize, len: usize) {
        self.advise(t, off, len, libc::POSIX_FADV_WILLNEED);
    }

    /// Drops the page cache of a byte range of a tensor once converted (advice only).
    pub fn release(&self, t: &TensorInfo, off: usize, len: usize) {
        self.advise(t, off, len, libc::POSIX_FADV_DONTNEED);
    }

    fn advise(&self, t: &TensorInfo, off: usize, len: usize, advice: libc::c_int) {
        if len == 0 {
            return;
        }
        use std::os::unix::io::AsRawFd;
        // SAFETY: plain syscall on a valid open file descriptor; no memory is passed.
        unsafe {
            libc::posix_fadvise(
                self.files[t.file].file.as_raw_fd(),
                (t.start + off) as libc::off_t,
                len as libc::off_t,
                advice,
            );
        }
    }

    /// A tensor by its GGUF name.
    ///
    /// # Errors
    /// [`ConvertError::Tensor`] naming it when the GGUF does not hold it.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors.get(name).ok_or_else(|| ConvertError::Tensor {
            tensor: name.to_string(),
            what: format!("missing from {}", self.path().display()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        assert_eq!(
            split_name("GLM-5-Q2_K-00001-of-00007.gguf"),
            Some(("GLM-5-Q2_K", 1, 7))
        );
        assert_eq!(split_name("model.gguf"), None);
        assert_eq!(split_name("a-1-of-2.gguf"), None);
    }

    #[test]
    fn sizes_agree_with_format() {
        for t in coli_format::encoding::ggml::ALL {
            let (bs, ts, _) = type_sizes(t.id()).unwrap();
            assert_eq!((bs as usize, ts as usize), (t.block_size(), t.type_size()));
        }
    }
}
