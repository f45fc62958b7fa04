//! MANIFEST (docs/FORMAT.md section 2): a 24-byte binary header (magic `COLIMAN\0`, u32 format
//! version, u32 crc32 of the body, u64 body length) and a JSON body ([`Manifest`]).

use super::hex::{StoreId, Xxh3Sum};
use super::{names, FORMAT_VERSION, MANIFEST_MAGIC};
use crate::{Encoding, FormatError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The most decoder layers a MANIFEST may declare (`num_layers`); published models have < 200.
pub const MAX_LAYERS: u32 = 1 << 12;
/// The most routed experts a layer may declare; published models have <= 512.
pub const MAX_EXPERTS: u32 = 1 << 16;

/// A layer that holds routed experts, and how many.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpertLayer {
    /// Decoder layer index.
    pub layer: u32,
    /// Experts 0..num_experts are expected in INDEX.
    pub num_experts: u32,
}

/// A source checkpoint file's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    /// File name inside the checkpoint directory.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// xxh3 (seed 0) of the safetensors length prefix and JSON header.
    pub header_xxh3: Xxh3Sum,
}

/// One dense tensor in `dense.bin` (section 7).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenseEntry {
    /// Tensor name as in the checkpoint.
    pub name: String,
    /// Encoding id (FORMAT.md section 6).
    pub encoding: u16,
    /// Group size field.
    pub group_size: u16,
    /// Shape: `[n]` for vectors, `[rows, cols]` for matrices.
    pub shape: Vec<usize>,
    /// Offset of the weight section in dense.bin, bytes (multiple of 64).
    pub offset: u64,
    /// Weight section length, bytes.
    pub length: u64,
    /// Offset of the scale section (0 when none).
    pub scales_offset: u64,
    /// Scale section length, bytes (0 when none).
    pub scales_length: u64,
    /// xxh3 of weight then scale section, seed = xxh3(name).
    pub xxh3: Xxh3Sum,
    /// The weight and scale sections are in the interleaved row order
    /// ([`crate::MatrixView::interleave`]; format version 7, FORMAT.md section 7): only for a
    /// matrix that [`crate::MatrixView::can_interleave`]. Absent (false) otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interleaved: bool,
}

/// The oldest format version that can hold the dense tensors `dense`: 7 when one is stored
/// interleaved, 4 or 6 when one is a ggml block type, 3 when one is int4 (FORMAT.md section 12), else 1. A writer stamps the larger
/// of this and [`crate::disk::index::min_format_version`] on every file of the store.
pub fn dense_min_format_version(dense: &[DenseEntry]) -> u32 {
    dense
        .iter()
        .map(DenseEntry::min_format_version)
        .max()
        .unwrap_or(1)
}

impl DenseEntry {
    /// True when the entry's encoding id is int4 (5): allowed for dense tensors from format
    /// version 3 on.
    pub fn is_int4(&self) -> bool {
        self.encoding == crate::Encoding::Int4 { group_size: 2 }.id()
    }

    /// The oldest format version that allows this dense tensor: 7 when it is stored interleaved,
    /// else its encoding's: 3 for int4, 4 or 6
    /// for a ggml block type ([`crate::encoding::GgmlType::min_format_version`]), 1 for the
    /// others (an unknown id: the current version, refused elsewhere).
    pub fn min_format_version(&self) -> u32 {
        if self.interleaved {
            return 7;
        }
        if self.is_int4() {
            return 3;
        }
        crate::Encoding::from_id(self.encoding, self.group_size).map_or(FORMAT_VERSION, |e| match e
        {
            crate::Encoding::Ggml(t) => t.min_format_version(),
            _ => 1,
        })
    }
}

/// A file copied from the checkpoint into `files/` (section 8).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File name (e.g. `tokenizer.json`).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// xxh3 (seed 0).
    pub xxh3: Xxh3Sum,
}

/// Length and checksum of a whole file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WholeFile {
    /// Bytes.
    pub length: u64,
    /// xxh3 (seed 0).
    pub xxh3: Xxh3Sum,
}

/// Expert encoding as recorded in the manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncodingInfo {
    /// Encoding id.
    pub id: u16,
    /// Short name (`int4-g64`).
    pub name: String,
    /// Group size field.
    pub group_size: u16,
}

impl EncodingInfo {
    /// The manifest's record of `e`.
    pub fn of(e: Encoding) -> EncodingInfo {
        EncodingInfo {
            id: e.id(),
            name: e.name(),
            group_size: e.group_size(),
        }
    }
}

/// The converter that wrote the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConverterInfo {
    /// Program name.
    pub name: String,
    /// Program version.
    pub version: String,
}

/// The MANIFEST body. Field order is the JSON's order on disk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version (also in the binary header).
    pub format_version: u32,
    /// The store id (section 2).
    pub store_id: StoreId,
    /// Record alignment, bytes.
    pub alignment: u64,
    /// `model_type` of the source config.
    pub family: String,
    /// The source `config.json`, parsed.
    pub config: serde_json::Value,
    /// Decoder layers in the model (MTP layers included when present).
    pub num_layers: u32,
    /// Every layer holding routed experts.
    pub expert_layers: Vec<ExpertLayer>,
    /// Encoding of the routed experts (one per store in version 1).
    pub expert_encoding: EncodingInfo,
    /// Number of segment files.
    pub segment_count: u32,
    /// Size bound of a segment file, bytes.
    pub segment_max_bytes: u64,
    /// Converter identity.
    pub converter: ConverterInfo,
    /// Conversion parameters (`experts`, `dense`, `mtp`, ...).
    pub parameters: BTreeMap<String, String>,
    /// Source files.
    pub sources: Vec<SourceFile>,
    /// Dense tensors.
    pub dense: Vec<DenseEntry>,
    /// dense.bin as a whole.
    pub dense_file: WholeFile,
    /// INDEX as a whole.
    pub index_file: WholeFile,
    /// Copied files.
    pub files: Vec<FileEntry>,
    /// The MTP layer's tensors the store does not hold because the model shares the main
    /// model's, each with the tensor that stands in (GLM-5's published
    /// `model.layers.78.shared_head.head.weight` -> `lm_head.weight`, `embed_tokens` ->
    /// `model.embed_tokens.weight`; FORMAT.md section 2). Absent from the JSON when empty: the
    /// MTP layer holds its own copies, or the store has no MTP layer.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mtp_shared: BTreeMap<String, String>,
}

fn fmt_err(what: impl Into<String>) -> FormatError {
    FormatError::format(names::MANIFEST, what)
}

impl Manifest {
    /// Parses and checks the MANIFEST file's bytes: magic, version (a newer one is
    /// [`FormatError::NewerVersion`] only when the body agrees; otherwise damage), body length
    /// and crc32, JSON (checksums and the store id must be hex of the right length), body
    /// version, alignment (a power of two in 512..=2^24), expert encoding, dense entries (against
    /// nothing but themselves; [`DenseEntry::check`] checks them against dense.bin's length),
    /// copied file names.
    ///
    /// # Errors
    /// [`FormatError::Format`] naming MANIFEST and the field; [`FormatError::NewerVersion`].
    pub fn parse(bytes: &[u8]) -> Result<Manifest, FormatError> {
        const F: &str = names::MANIFEST;
        if bytes.len() < 24 {
            return Err(fmt_err(format!(
                "{} bytes, shorter than the 24-byte header",
                bytes.len()
            )));
        }
        if bytes[0..8] != MANIFEST_MAGIC {
            return Err(fmt_err(format!(
                "magic {:02x?}, expected {:02x?} (COLIMAN)",
                &bytes[0..8],
                MANIFEST_MAGIC
            )));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
        let len = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
        let body = &bytes[24..];
        let body_ok = len == body.len() as u64 && crc32fast::hash(body) == crc;
        if version > FORMAT_VERSION {
            // A real newer store says so in its body too; a header that disagrees with an
            // intact body is damage, not a newer version.
            let body_version = if body_ok {
                serde_json::from_slice::<serde_json::Value>(body)
                    .ok()
                    .and_then(|v| v.get("format_version").and_then(|x| x.as_u64()))
            } else {
                None
            };
            if body_version == Some(version as u64) {
                return Err(FormatError::NewerVersion {
                    file: F.into(),
                    found: version,
                    known: FORMAT_VERSION,
                });
            }
            return Err(fmt_err(format!(
                "header version {version} is not a known version and does not match the body's format_version {body_version:?}: header damaged"
            )));
        }
        if version == 0 {
            return Err(fmt_err("format version 0 is invalid"));
        }
        if len != body.len() as u64 {
            return Err(fmt_err(format!(
                "body length field says {len} bytes, file holds {} after the header",
                body.len()
            )));
        }
        let found = crc32fast::hash(body);
        if found != crc {
            return Err(fmt_err(format!(
                "body crc32 mismatch: header says {crc:08x}, body has {found:08x}"
            )));
        }
        let m: Manifest = serde_json::from_slice(body)
            .map_err(|e| fmt_err(format!("JSON body does not parse: {e}")))?;
        if m.format_version != version {
            return Err(fmt_err(format!(
                "body format_version {} differs from header version {version}",
                m.format_version
            )));
        }
        if m.alignment < 512 || !m.alignment.is_power_of_two() || m.alignment > (1 << 24) {
            return Err(fmt_err(format!(
                "alignment {} is not a power of two in 512..=2^24",
                m.alignment
            )));
        }
        m.expert_encoding()?;
        if let Some(e) = m
            .dense
            .iter()
            .find(|e| e.min_format_version() > m.format_version)
        {
            let enc = crate::Encoding::from_id(e.encoding, e.group_size)
                .map_or_else(|_| format!("encoding {}", e.encoding), |x| x.name());
            let enc = if e.interleaved {
                format!("interleaved {enc}")
            } else if e.is_int4() {
                "int4".to_string()
            } else {
                enc
            };
            return Err(fmt_err(format!(
                "dense tensor {} is {enc}, which format version {} does not allow ({enc} dense tensors are version {}, FORMAT.md section 12)",
                e.name,
                m.format_version,
                e.min_format_version()
            )));
        }
        for f in &m.files {
            if f.name.is_empty() || f.name.contains('/') || f.name == ".." || f.name == "." {
                return Err(fmt_err(format!("bad file name {:?}", f.name)));
            }
        }
        m.check_layers()?;
        m.check_mtp_shared()?;
        Ok(m)
    }

    /// The MANIFEST file's bytes: header and pretty-printed JSON body (what [`Manifest::parse`]
    /// reads back).
    pub fn to_bytes(&self) -> Vec<u8> {
        let body = serde_json::to_vec_pretty(self).expect("manifest serializes");
        let mut out = Vec::with_capacity(24 + body.len());
        out.extend_from_slice(&MANIFEST_MAGIC);
        out.extend_from_slice(&self.format_version.to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Checks the fields that say what the store holds, against each other: `family` is set,
    /// `num_layers` is 1..=[`MAX_LAYERS`], `expert_layers` is strictly ascending (no layer
    /// twice), each below `num_layers` with 1..=[`MAX_EXPERTS`] experts. (Whether they are the
    /// model's is `coli_format::ModelSpec::of_store`.)
    ///
    /// # Errors
    /// [`FormatError::Format`] naming MANIFEST and the field.
    fn check_layers(&self) -> Result<(), FormatError> {
        if self.family.trim().is_empty() {
            return Err(fmt_err("family is empty"));
        }
        if !(1..=MAX_LAYERS).contains(&self.num_layers) {
            return Err(fmt_err(format!(
                "num_layers {} is not in 1..={MAX_LAYERS}",
                self.num_layers
            )));
        }
        let mut prev: Option<u32> = None;
        for l in &self.expert_layers {
            if prev.is_some_and(|p| l.layer <= p) {
                return Err(fmt_err(format!(
                    "expert_layers: layer {} follows layer {} (the list is strictly ascending, each layer once)",
                    l.layer,
                    prev.unwrap_or_default()
                )));
            }
            if l.layer >= self.num_layers {
                return Err(fmt_err(format!(
                    "expert_layers: layer {} is not below num_layers {}",
                    l.layer, self.num_layers
                )));
            }
            if !(1..=MAX_EXPERTS).contains(&l.num_experts) {
                return Err(fmt_err(format!(
                    "expert_layers: layer {} has num_experts {}, not in 1..={MAX_EXPERTS}",
                    l.layer, l.num_experts
                )));
            }
            prev = Some(l.layer);
        }
        Ok(())
    }

    /// Checks `mtp_shared` against the dense tensors: each shared tensor is absent from
    /// `dense`, and the tensor standing in for it is present.
    ///
    /// # Errors
    /// [`FormatError::Format`] naming MANIFEST, `mtp_shared` and the tensor.
    fn check_mtp_shared(&self) -> Result<(), FormatError> {
        let has = |n: &str| self.dense.iter().any(|d| d.name == n);
        for (shared, stand_in) in &self.mtp_shared {
            if has(shared) {
                return Err(fmt_err(format!(
                    "mtp_shared names {shared}, which the store holds as a dense tensor"
                )));
            }
            if !has(stand_in) {
                return Err(fmt_err(format!(
                    "mtp_shared: {stand_in}, standing in for {shared}, is not a dense tensor of the store"
                )));
            }
        }
        Ok(())
    }

    /// The routed experts' encoding.
    ///
    /// # Errors
    /// [`FormatError::Format`] for an unknown id or group size.
    pub fn expert_encoding(&self) -> Result<Encoding, FormatError> {
        let e = &self.expert_encoding;
        Encoding::from_id(e.id, e.group_size).map_err(|_| {
            fmt_err(format!(
                "expert_encoding id {} group size {} is unknown",
                e.id, e.group_size
            ))
        })
    }
}

impl DenseEntry {
    /// The `(rows, cols)` of this tensor's matrix view ([`crate::matrix_dims`]): `[n]` is
    /// `[1, n]`, an N-D shape its leading dimensions' product of rows of the last one.
    pub fn rows_cols(&self) -> Option<(usize, usize)> {
        crate::matrix_dims(&self.shape)
    }

    /// Checks this entry against the format and dense.bin's length `dense_len`; returns its
    /// encoding.
    ///
    /// # Errors
    /// [`FormatError::Format`] naming MANIFEST and the tensor: unknown encoding, a shape of
    /// another rank or too large, section lengths other than the encoding's, unaligned offsets,
    /// sections beyond dense.bin.
    pub fn check(&self, dense_len: u64) -> Result<Encoding, FormatError> {
        let e = self;
        let bad = |s: String| fmt_err(format!("dense tensor {}: {s}", e.name));
        let enc = Encoding::from_id(e.encoding, e.group_size).map_err(|_| {
            bad(format!(
                "unknown encoding id {} group size {}",
                e.encoding, e.group_size
            ))
        })?;
        if enc.group_size() != e.group_size {
            return Err(bad(format!(
                "group size {} invalid for {}",
                e.group_size,
                enc.name()
            )));
        }
        if !enc.has_f32_scales() {
            return Err(bad(format!(
                "{} is an expert encoding, not a dense one (FORMAT.md section 7)",
                enc.name()
            )));
        }
        let Some((rows, cols)) = e.rows_cols() else {
            return Err(bad(format!(
                "shape {:?} must have at least 1 dimension",
                e.shape
            )));
        };
        if rows.checked_mul(cols).is_none_or(|n| n > (1 << 40)) {
            return Err(bad(format!("shape {:?} too large", e.shape)));
        }
        let wb = enc.weight_bytes(rows, cols) as u64;
        let sb = enc.scale_bytes(rows, cols) as u64;
        if e.length != wb {
            return Err(bad(format!(
                "length {}, expected {wb} for {} {:?}",
                e.length,
                enc.name(),
                e.shape
            )));
        }
        if e.interleaved && !crate::MatrixView::can_interleave(enc, rows, cols) {
            return Err(bad(format!(
                "interleaved, but a {} {:?} matrix has no interleaved row order (FORMAT.md section 5)",
                enc.name(),
                e.shape
            )));
        }
        if e.scales_length != sb {
            return Err(bad(format!(
                "scales_length {}, expected {sb} for {} {:?}",
                e.scales_length,
                enc.name(),
                e.shape
            )));
        }
        if !e.offset.is_multiple_of(64) || (sb > 0 && !e.scales_offset.is_multiple_of(64)) {
            return Err(bad("section offsets must be multiples of 64".into()));
        }
        if sb == 0 && e.scales_offset != 0 {
            return Err(bad("scales_offset must be 0 without scales".into()));
        }
        let end_w = e.offset.checked_add(e.length);
        let end_s = e.scales_offset.checked_add(e.scales_length);
        match (end_w, end_s) {
            (Some(a), Some(b)) if a <= dense_len && b <= dense_len => {}
            _ => {
                return Err(bad(format!(
                    "sections [{}, +{}) / [{}, +{}) beyond dense.bin's {dense_len} bytes",
                    e.offset, e.length, e.scales_offset, e.scales_length
                )))
            }
        }
        Ok(enc)
    }
}

/// Writes `v` as canonical JSON: object keys sorted, no whitespace.
fn canonical_json(v: &serde_json::Value, out: &mut String) {
    match v {
        serde_json::Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(k).expect("string serializes"));
                out.push(':');
                canonical_json(&m[k.as_str()], out);
            }
            out.push('}');
        }
        serde_json::Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&serde_json::to_string(other).expect("scalar serializes")),
    }
}

impl StoreId {
    /// The store id of a conversion (section 2): the big-endian bytes of XXH3-128 over the
    /// canonical JSON (keys sorted, no whitespace) of `{"converter": {"name", "version"},
    /// "parameters", "sources"}`.
    pub fn of_conversion(
        converter: &ConverterInfo,
        parameters: &BTreeMap<String, String>,
        sources: &[SourceFile],
    ) -> StoreId {
        let v = serde_json::json!({
            "converter": converter,
            "parameters": parameters,
            "sources": sources,
        });
        let mut s = String::new();
        canonical_json(&v, &mut s);
        StoreId(xxhash_rust::xxh3::xxh3_128(s.as_bytes()).to_be_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            store_id: StoreId([7; 16]),
            alignment: 4096,
            family: "mixtral".into(),
            config: serde_json::json!({"model_type": "mixtral"}),
            num_layers: 1,
            expert_layers: vec![ExpertLayer {
                layer: 0,
                num_experts: 2,
            }],
            expert_encoding: EncodingInfo::of(Encoding::Int4 { group_size: 64 }),
            segment_count: 1,
            segment_max_bytes: 1 << 30,
            converter: ConverterInfo {
                name: "coli-convert".into(),
                version: "0.1.0".into(),
            },
            parameters: BTreeMap::new(),
            sources: vec![],
            dense: vec![],
            dense_file: WholeFile {
                length: 0,
                xxh3: Xxh3Sum(1),
            },
            index_file: WholeFile {
                length: 64,
                xxh3: Xxh3Sum(2),
            },
            files: vec![],
            mtp_shared: BTreeMap::new(),
        }
    }

    fn dense_entry(name: &str) -> DenseEntry {
        DenseEntry {
            name: name.into(),
            encoding: Encoding::Bf16.id(),
            group_size: Encoding::Bf16.group_size(),
            shape: vec![4, 4],
            offset: 0,
            length: 32,
            scales_offset: 0,
            scales_length: 0,
            xxh3: Xxh3Sum(3),
            interleaved: false,
        }
    }

    #[test]
    fn layer_fields_out_of_range_are_refused_by_name() {
        type Edit = Box<dyn Fn(&mut Manifest)>;
        let cases: Vec<(&str, Edit)> = vec![
            ("num_layers 0", Box::new(|m| m.num_layers = 0)),
            (
                "num_layers 4294967295",
                Box::new(|m| m.num_layers = u32::MAX),
            ),
            (
                "layer 0 follows layer 0",
                Box::new(|m| m.expert_layers.push(m.expert_layers[0].clone())),
            ),
            (
                "layer 1 is not below num_layers 1",
                Box::new(|m| m.expert_layers[0].layer = 1),
            ),
            (
                "num_experts 0",
                Box::new(|m| m.expert_layers[0].num_experts = 0),
            ),
            ("family is empty", Box::new(|m| m.family = " ".into())),
        ];
        for (want, edit) in cases {
            let mut m = sample();
            edit(&mut m);
            let e = Manifest::parse(&m.to_bytes()).unwrap_err().to_string();
            assert!(
                e.starts_with("MANIFEST: ") && e.contains(want),
                "{want}: {e}"
            );
        }
    }

    #[test]
    fn mtp_shared_round_trips_and_must_agree_with_the_dense_tensors() {
        let mut m = sample();
        // Absent when empty: stores without a shared MTP head keep their bytes.
        assert!(!String::from_utf8_lossy(&m.to_bytes()).contains("mtp_shared"));
        m.dense = vec![dense_entry("lm_head.weight")];
        let shared = "model.layers.1.shared_head.head.weight";
        m.mtp_shared.insert(shared.into(), "lm_head.weight".into());
        assert_eq!(Manifest::parse(&m.to_bytes()).unwrap(), m);
        // The shared tensor present as well: refused, named.
        let mut both = m.clone();
        both.dense.push(dense_entry(shared));
        let e = Manifest::parse(&both.to_bytes()).unwrap_err().to_string();
        assert!(e.contains("mtp_shared") && e.contains(shared), "{e}");
        // The stand-in absent: refused, named.
        let mut gone = m.clone();
        gone.dense.clear();
        let e = Manifest::parse(&gone.to_bytes()).unwrap_err().to_string();
        assert!(
            e.contains("mtp_shared") && e.contains("lm_head.weight"),
            "{e}"
        );
    }

    #[test]
    fn bytes_round_trip_and_damage_is_named() {
        let m = sample();
        let b = m.to_bytes();
        assert_eq!(Manifest::parse(&b).unwrap(), m);
        let body = String::from_utf8(b[24..].to_vec()).unwrap();
        assert!(body.contains("\"store_id\": \"07070707070707070707070707070707\""));
        assert!(body.contains("\"xxh3\": \"0000000000000001\""));
        let mut bad = b.clone();
        let n = bad.len();
        bad[n - 3] ^= 1;
        let e = Manifest::parse(&bad).unwrap_err().to_string();
        assert!(e.starts_with("MANIFEST: body crc32 mismatch"), "{e}");
        let mut newer = m.clone();
        newer.format_version = FORMAT_VERSION + 1;
        assert!(matches!(
            Manifest::parse(&newer.to_bytes()),
            Err(FormatError::NewerVersion { .. })
        ));
    }

    #[test]
    fn int4_dense_tensors_need_version_3() {
        let int4 = Encoding::Int4 { group_size: 32 };
        let entry = |enc: Encoding| DenseEntry {
            name: "model.layers.0.self_attn.q_proj.weight".into(),
            encoding: enc.id(),
            group_size: enc.group_size(),
            shape: vec![2, 64],
            offset: 0,
            length: enc.weight_bytes(2, 64) as u64,
            scales_offset: 64,
            scales_length: enc.scale_bytes(2, 64) as u64,
            xxh3: Xxh3Sum(3),
            interleaved: false,
        };
        assert_eq!(dense_min_format_version(&[entry(Encoding::Int8)]), 1);
        assert_eq!(
            dense_min_format_version(&[entry(Encoding::Int8), entry(int4)]),
            3
        );
        let mut m = sample();
        m.dense = vec![entry(int4)];
        assert_eq!(Manifest::parse(&m.to_bytes()).unwrap(), m);
        for v in [1, 2] {
            m.format_version = v;
            let e = Manifest::parse(&m.to_bytes()).unwrap_err().to_string();
            assert!(
                e.contains("dense tensor model.layers.0.self_attn.q_proj.weight is int4")
                    && e.contains(&format!("format version {v} does not allow")),
                "{e}"
            );
        }
    }
    #[test]
    fn iquant_dense_tensors_need_version_6() {
        use crate::encoding::GgmlType;
        let entry = |enc: Encoding| DenseEntry {
            name: "model.layers.0.self_attn.o_proj.weight".into(),
            encoding: enc.id(),
            group_size: enc.group_size(),
            shape: vec![2, 256],
            offset: 0,
            length: enc.weight_bytes(2, 256) as u64,
            scales_offset: 0,
            scales_length: 0,
            xxh3: Xxh3Sum(3),
            interleaved: false,
        };
        let q4k = Encoding::Ggml(GgmlType::Q4_K);
        assert_eq!(dense_min_format_version(&[entry(q4k)]), 4);
        for t in [GgmlType::IQ2_XXS, GgmlType::IQ1_M, GgmlType::MXFP4] {
            let iq = Encoding::Ggml(t);
            assert_eq!(dense_min_format_version(&[entry(q4k), entry(iq)]), 6);
            let mut m = sample();
            m.format_version = 6;
            m.dense = vec![entry(iq)];
            assert_eq!(Manifest::parse(&m.to_bytes()).unwrap(), m);
            for v in [4, 5] {
                m.format_version = v;
                let e = Manifest::parse(&m.to_bytes()).unwrap_err().to_string();
                assert!(
                    e.contains("model.layers.0.self_attn.o_proj.weight")
                        && e.contains(&format!("format version {v} does not allow")),
                    "{e}"
                );
            }
        }
    }
}
