//! `coli-convert FILE.gguf STORE`: a GGUF's tensors into a block store, blocks kept bit for bit.
//!
//! Every dense tensor keeps its GGUF type (F32 and BF16 as coli's f32 and bf16, every other
//! type as the ggml encoding of that type); each layer's stacked expert tensors
//! (`blk.N.ffn_{gate,up,down}_exps.weight`, `[E, rows, cols]`) are cut into one record per
//! expert, the three matrices in the types the GGUF gives them (format version 4, or 6 with an
//! i-quant or MXFP4); llama.cpp's fused `attn_qkv` and `ffn_gate_up_exps` are read as the
//! tensors they join ([`super::fused`]). Nothing is
//! requantized, so the store holds exactly the GGUF's bits. The model spec comes from the
//! config.json [`super::arch::config_json`] builds from the metadata; the tokenizer from
//! [`super::tokenizer::files`]. Resumable and atomic as every conversion
//! ([`coli_store::StoreWriter`]).

use super::arch;
use super::file::{Gguf, TensorInfo};
use super::fused::{self, ExpertMatrix};
use crate::error::{ConvertError, Result};
use crate::pipeline::{self, Options, Report, ALIGNMENT, SEGMENT_MAX_BYTES};
use coli_format::encoding::GgmlType;
use coli_format::spec::ModelSpec;
use coli_format::{matrix_dims, Encoding, ExpertKey};
use coli_store::{EncodedMatrix, ExpertLayer, SourceFile, StoreSpec, StoreWriter};
use std::collections::BTreeMap;
use std::time::Instant;

fn terr(tensor: &str, what: impl Into<String>) -> ConvertError {
    ConvertError::Tensor {
        tensor: tensor.to_string(),
        what: what.into(),
    }
}

/// The store encoding of a GGUF tensor's type.
///
/// # Errors
/// [`ConvertError::Tensor`] for a type coli does not decode, naming the types it does.
pub fn encoding_of(t: &TensorInfo) -> Result<Encoding> {
    match t.ggml_type {
        0 => Ok(Encoding::F32),
        30 => Ok(Encoding::Bf16),
        id => GgmlType::from_id(id).map(Encoding::Ggml).ok_or_else(|| {
            terr(
                &t.name,
                format!(
                    "is {}, a type coli does not decode yet (it decodes F32, BF16, {}): requantize the GGUF with llama-quantize to one of these",
                    t.type_name(),
                    coli_format::encoding::ggml::ALL
                        .iter()
                        .map(|t| t.gguf_name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        }),
    }
}

/// Layer `s`'s three expert matrices (gate, up, down) in the GGUF: the stacked tensors, or the
/// halves of a fused `ffn_gate_up_exps` ([`fused::expert_sources`]), their shapes checked
/// against the spec (`[E, I, H]`, `[E, I, H]`, `[E, H, I]`; fused `[E, 2 I, H]`).
///
/// # Errors
/// [`ConvertError::Tensor`] naming a tensor that is missing, misshapen or of a type coli does
/// not decode.
pub fn expert_matrices<'a>(
    g: &'a Gguf,
    s: &coli_format::spec::ExpertsSpec,
) -> Result<[ExpertMatrix<'a>; 3]> {
    let e = s.count as usize;
    let mut out = Vec::with_capacity(3);
    for (k, (n, part)) in fused::expert_sources(g, s.layer).into_iter().enumerate() {
        let w = if k == 2 {
            [e, s.hidden, s.intermediate]
        } else {
            [e, s.intermediate * part.1, s.hidden]
        };
        let t = g.tensor(&n)?;
        if t.shape() != w {
            return Err(terr(
                &n,
                format!("has shape {:?}, the metadata makes it {w:?}", t.shape()),
            ));
        }
        // F32 and BF16 experts (unquantized GGUFs) are kept as coli's f32 / bf16 records.
        out.push(ExpertMatrix {
            t,
            encoding: encoding_of(t)?,
            part,
        });
    }
    Ok([out[0], out[1], out[2]])
}

/// The encodings of layer `s`'s three expert matrices ([`expert_matrices`]).
///
/// # Errors
/// As [`expert_matrices`].
pub fn expert_encodings(g: &Gguf, s: &coli_format::spec::ExpertsSpec) -> Result<[Encoding; 3]> {
    Ok(expert_matrices(g, s)?.map(|m| m.encoding))
}

/// The stacked F32 expert biases of layer `s` (gpt-oss: gate `[E, I]`, up `[E, I]`, down
/// `[E, H]`), checked, when the spec's experts carry biases; None otherwise.
///
/// # Errors
/// [`ConvertError::Tensor`] naming a bias tensor that is missing, misshapen or not F32.
pub fn expert_biases<'a>(
    g: &'a Gguf,
    s: &coli_format::spec::ExpertsSpec,
) -> Result<Option<[&'a TensorInfo; 3]>> {
    if !s.biases {
        return Ok(None);
    }
    let names = arch::expert_bias_tensors(s.layer);
    let want = [
        [s.count as usize, s.intermediate],
        [s.count as usize, s.intermediate],
        [s.count as usize, s.hidden],
    ];
    let mut out = Vec::with_capacity(3);
    for (n, w) in names.iter().zip(want) {
        let t = g.tensor(n)?;
        if t.shape() != w || t.ggml_type != 0 {
            return Err(terr(
                n,
                format!(
                    "is {} of shape {:?}: the experts' biases are F32 {w:?}",
                    t.type_name(),
                    t.shape()
                ),
            ));
        }
        out.push(t);
    }
    Ok(Some([out[0], out[1], out[2]]))
}

/// True when `path` names a GGUF file (by its magic).
pub fn is_gguf(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    path.is_file()
        && std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok()
        && &magic == super::file::MAGIC
}

/// One dense tensor to copy: spec name, GGUF tensor, shape.
struct DenseCopy<'a> {
    name: String,
    t: &'a TensorInfo,
    shape: Vec<usize>,
    encoding: Encoding,
    /// The values to store instead of the tensor's bytes, where the GGUF holds them in another
    /// form ([`arch::derived_values`], computed and checked before anything is written).
    derived: Option<Vec<u8>>,
}

/// The GGUF tensor the spec's dense tensor `name` of `shape` comes from (in the model
/// `config` describes), checked: its matrix dimensions, its full dimensions where the GGUF's
/// layout has more ([`arch::gguf_shape`]), and F32 values finite.
fn dense_source<'a>(
    g: &'a Gguf,
    config: &serde_json::Value,
    name: &str,
    shape: &[usize],
) -> Result<&'a TensorInfo> {
    let gname = arch::gguf_name_in(config, name).ok_or_else(|| {
        terr(
            name,
            "has no GGUF name in coli's map for this architecture (a bug: please report it)",
        )
    })?;
    let t = g.tensor(&gname)?;
    let (rows, cols) = matrix_dims(shape).unwrap_or((0, 0));
    let (trows, tcols) = matrix_dims(&t.shape()).unwrap_or((0, 0));
    if (rows, cols) != (trows, tcols) {
        return Err(terr(
            &gname,
            format!(
                "has shape {:?} in {}, but the metadata makes {name} {shape:?}",
                t.shape(),
                g.files[t.file].path.display()
            ),
        ));
    }
    if let Some(want) = arch::gguf_shape(config, name) {
        if t.shape() != want {
            return Err(terr(
                &gname,
                format!(
                    "has shape {:?}, the metadata makes it {want:?} ({name})",
                    t.shape()
                ),
            ));
        }
    }
    if t.ggml_type == 0 {
        let bad = g
            .data(t)
            .chunks_exact(4)
            .position(|c| !f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite());
        if let Some(i) = bad {
            return Err(terr(
                &gname,
                format!("value {i} is not finite (NaN or infinite)"),
            ));
        }
    }
    Ok(t)
}

/// Converts the GGUF `opts.input` into the store `opts.output` (see the module docs).
///
/// # Errors
/// As [`crate::run`]; a GGUF refused by [`Gguf::open`], [`arch::config_json`] or
/// [`super::tokenizer::files`], a tensor missing, misshapen or of a type coli does not decode;
/// encoding options other than the defaults ([`ConvertError::Usage`]: a GGUF's types are kept).
pub fn run(opts: &Options) -> Result<Report> {
    let t0 = Instant::now();
    let mut g = Gguf::open(&opts.input)?;
    let config = arch::config_json(&g)?;
    let spec = ModelSpec::from_config(&config, None).map_err(|e| ConvertError::Gguf {
        file: g.path().to_path_buf(),
        what: format!("the model its metadata describes is refused: {e}"),
    })?;
    fused::split_qkv(&mut g, &spec, &config)?;
    let g = g;
    let mut files = super::tokenizer::files(&g, spec.max_position_embeddings.max(1))?;
    files.extend(super::write::export_files(&g));

    // Dense tensors: every one the spec reads (its MTP layer's included), from the GGUF, in
    // the GGUF's type.
    let mut dense = Vec::new();
    for ts in spec.tensors.dense() {
        if ts.optional
            && arch::gguf_name_in(&config, &ts.name).is_none_or(|n| !g.tensors.contains_key(&n))
        {
            continue;
        }
        let t = dense_source(&g, &config, &ts.name, &ts.shape)?;
        // Values held in another form (the KDA families' `ssm_a`, K3's fused residual scores)
        // are F32, turned back and checked here, before anything is written.
        let source_type = arch::derived_source_type(&config, &ts.name);
        let derived = match arch::derived_values(&config, &ts.name, g.data(t)) {
            Some(_) if t.ggml_type != source_type => {
                return Err(terr(
                    &t.name,
                    format!(
                        "is {}: llama.cpp writes it as {}",
                        t.type_name(),
                        if source_type == 26 { "I32" } else { "F32" }
                    ),
                ))
            }
            Some(v) => Some(v.map_err(|e| terr(&t.name, e))?),
            None => None,
        };
        dense.push(DenseCopy {
            name: ts.name.clone(),
            t,
            shape: ts.shape.clone(),
            // Values turned back are f32 (an I32 routing table's ids included).
            encoding: if derived.is_some() {
                Encoding::F32
            } else {
                encoding_of(t)?
            },
            derived,
        });
    }
    // The main model's embedding and output stand in for the MTP layer's own where the GGUF
    // has none (`nextn.embed_tokens` / `nextn.shared_head_head`: GLM-4.6/4.7 and GLM-5.x
    // publish their MTP layer without them), as the checkpoint path records them.
    let stored: std::collections::BTreeSet<&str> = dense.iter().map(|d| d.name.as_str()).collect();
    let mut mtp_shared = BTreeMap::new();
    let head = if stored.contains(spec.tensors.lm_head.name.as_str()) {
        &spec.tensors.lm_head
    } else {
        &spec.tensors.embed
    };
    for m in &spec.tensors.mtp {
        for (t, main) in [(&m.embed, &spec.tensors.embed), (&m.head, head)] {
            if let Some(t) = t.as_ref().filter(|t| !stored.contains(t.name.as_str())) {
                mtp_shared.insert(t.name.clone(), main.name.clone());
            }
        }
    }
    // Experts: every layer's stacked tensors, checked before anything is written.
    let sets = spec.tensors.expert_sets();
    let mut layers = Vec::new();
    let mut type_names = std::collections::BTreeSet::new();
    for s in &sets {
        let ts = expert_matrices(&g, s)?;
        for m in &ts {
            type_names.insert(m.encoding.name());
        }
        let biases = expert_biases(&g, s)?;
        layers.push((*s, ts, biases));
    }
    let experts_param = type_names.into_iter().collect::<Vec<_>>().join("+");
    let mut parameters = BTreeMap::new();
    parameters.insert("source".to_string(), "gguf".to_string());
    parameters.insert("experts".to_string(), experts_param);
    parameters.insert("dense".to_string(), "gguf".to_string());
    let mtp = spec.num_mtp_layers > 0;
    parameters.insert(
        "mtp".to_string(),
        if mtp { "gguf" } else { "none" }.to_string(),
    );

    let estimated: u64 = dense.iter().map(|d| d.t.nbytes as u64).sum::<u64>()
        + layers
            .iter()
            .flat_map(|(s, ts, b)| {
                ts.iter()
                    .map(|m| (m.range(0, s.count as usize).1 * s.count as usize) as u64)
                    .chain(b.iter().flatten().map(|t| t.nbytes as u64))
            })
            .sum::<u64>();
    let _lock = pipeline::take_output(&opts.output, estimated)?;
    let first_expert = layers
        .first()
        .map_or(Encoding::F32, |(_, ts, _)| ts[0].encoding);
    let store_spec = StoreSpec {
        family: spec.model_type.clone(),
        config_json: serde_json::to_vec_pretty(&coli_format::json_sorted_keys(&config))
            .expect("serializes"),
        num_layers: (spec.num_layers + spec.num_mtp_layers) as u32,
        expert_layers: sets
            .iter()
            .map(|s| ExpertLayer {
                layer: s.layer,
                num_experts: s.count,
            })
            .collect(),
        expert_encoding: first_expert,
        alignment: ALIGNMENT,
        segment_max_bytes: SEGMENT_MAX_BYTES,
        // ggml block types have no interleaved order: every record is row-major.
        matrix_order: coli_store::MatrixOrder::RowMajor,
        converter_version: env!("CARGO_PKG_VERSION").to_string(),
        parameter_defaults: pipeline::parameter_defaults(),
        parameters: parameters.clone(),
        sources: g
            .files
            .iter()
            .map(|f| SourceFile {
                name: f.name.clone(),
                size: f.size,
                header_xxh3: coli_store::Xxh3Sum(f.header_xxh3),
            })
            .collect(),
    };
    let report = Report {
        status: "converted".into(),
        store: opts.output.clone(),
        family: spec.model_type.clone(),
        parameters,
        mtp_layer: mtp,
        mtp_shared: mtp_shared.clone(),
        tensors: dense.len() as u64,
        experts: sets.iter().map(|s| s.count as u64).sum(),
        experts_skipped: 0,
        bytes_skipped: 0,
        dense_skipped: 0,
        bytes_in: 0,
        bytes_out: 0,
        store_bytes: 0,
        rel_rms_error: BTreeMap::new(),
        not_converted: {
            let used: std::collections::BTreeSet<&str> = dense
                .iter()
                .map(|d| d.t.name.as_str())
                .chain(layers.iter().flat_map(|(_, ts, b)| {
                    ts.iter()
                        .map(|m| m.t.name.as_str())
                        .chain(b.iter().flatten().map(|t| t.name.as_str()))
                }))
                .collect();
            g.tensors
                .keys()
                .filter(|n| !used.contains(n.as_str()))
                .cloned()
                .collect()
        },
        tokenizer: None,
        elapsed_s: 0.0,
    };
    pipeline::write_store(&opts.output, store_spec, report, t0, |writer, report| {
        writer.set_mtp_shared(mtp_shared);
        write_all(&g, &config, &dense, &layers, &files, writer, report)
    })
}

type Layer<'a> = (
    &'a coli_format::spec::ExpertsSpec,
    [ExpertMatrix<'a>; 3],
    Option<[&'a TensorInfo; 3]>,
);

fn write_all(
    g: &Gguf,
    config: &serde_json::Value,
    dense: &[DenseCopy<'_>],
    layers: &[Layer<'_>],
    files: &[(String, Vec<u8>)],
    writer: &mut StoreWriter,
    report: &mut Report,
) -> Result<()> {
    for d in dense {
        if writer.is_dense_done(&d.name) {
            report.dense_skipped += 1;
            continue;
        }
        let (rows, cols) = matrix_dims(&d.shape).expect("checked");
        let data = match (arch::row_permutation(config, &d.name, rows), &d.derived) {
            (Some(perm), _) => arch::permute_rows(g.data(d.t), &perm),
            (None, Some(values)) => values.clone(),
            (None, None) => g.data(d.t).to_vec(),
        };
        let m = EncodedMatrix::new(d.encoding, rows, cols, data, Vec::new());
        writer.add_dense(&d.name, &d.shape, &m)?;
        g.release(d.t, 0, d.t.nbytes);
        report.bytes_in += d.t.nbytes as u64;
        report.bytes_out += d.t.nbytes as u64;
    }
    for (s, ts, biases) in layers {
        let n = s.count as usize;
        for e in 0..s.count {
            let key = ExpertKey::new(s.layer, e);
            if writer.is_expert_done(key) {
                report.experts_skipped += 1;
                continue;
            }
            let e = e as usize;
            if e + 1 < n {
                for m in ts {
                    let (at, len) = m.range(e + 1, n);
                    g.prefetch(m.t, at, len);
                }
            }
            let mut mats: Vec<EncodedMatrix> = ts
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let (rows, cols) = if i == 2 {
                        (s.hidden, s.intermediate)
                    } else {
                        (s.intermediate, s.hidden)
                    };
                    let (at, len) = m.range(e, n);
                    let bytes = g.data(m.t)[at..at + len].to_vec();
                    EncodedMatrix::new(m.encoding, rows, cols, bytes, Vec::new())
                })
                .collect();
            if let Some(bs) = biases {
                for ((m, t), rows) in
                    mats.iter_mut()
                        .zip(bs)
                        .zip([s.intermediate, s.intermediate, s.hidden])
                {
                    let raw = &g.data(t)[e * rows * 4..(e + 1) * rows * 4];
                    let v: Vec<f32> = raw
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    if let Some(j) = v.iter().position(|x| !x.is_finite()) {
                        return Err(terr(
                            &t.name,
                            format!("expert {e} value {j} is {} (biases must be finite)", v[j]),
                        ));
                    }
                    m.bias = Some(v);
                }
            }
            writer.add_expert(
                key,
                s.hidden,
                s.intermediate,
                [&mats[0], &mats[1], &mats[2]],
            )?;
            for m in ts {
                let (at, len) = m.range(e, n);
                g.release(m.t, at, len);
                report.bytes_in += len as u64;
                report.bytes_out += len as u64;
            }
        }
    }
    for (name, bytes) in files {
        writer.add_file(name, bytes)?;
    }
    Ok(())
}
