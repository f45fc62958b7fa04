//! The build spec kept in `TARGET.partial/spec.json`: what it records, how a resumed build is
//! checked against it (differences named field by field), and the validation of a new spec.

use super::{writer_err, StoreSpec};
use crate::{Encoding, ExpertLayer, SourceFile, StoreError, StoreId, Xxh3Sum};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The spec as kept in `TARGET.partial/spec.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct SpecFile {
    pub(super) store_id: StoreId,
    pub(super) family: String,
    pub(super) config_xxh3: Xxh3Sum,
    pub(super) config_len: u64,
    pub(super) num_layers: u32,
    pub(super) expert_layers: Vec<ExpertLayer>,
    pub(super) expert_encoding: Encoding,
    pub(super) alignment: usize,
    pub(super) segment_max_bytes: u64,
    /// Absent in the spec.json of older writers: row-major.
    #[serde(default)]
    pub(super) matrix_order: super::MatrixOrder,
    pub(super) converter_version: String,
    pub(super) parameters: BTreeMap<String, String>,
    pub(super) sources: Vec<SourceFile>,
}

impl SpecFile {
    pub(super) fn from_spec(spec: &StoreSpec) -> SpecFile {
        SpecFile {
            store_id: spec.store_id(),
            family: spec.family.clone(),
            config_xxh3: Xxh3Sum(xxh3_64_with_seed(&spec.config_json, 0)),
            config_len: spec.config_json.len() as u64,
            num_layers: spec.num_layers,
            expert_layers: spec.expert_layers.clone(),
            expert_encoding: spec.expert_encoding,
            alignment: spec.alignment,
            segment_max_bytes: spec.segment_max_bytes,
            matrix_order: spec.matrix_order,
            converter_version: spec.converter_version.clone(),
            parameters: spec.recorded_parameters(),
            sources: spec.sources.clone(),
        }
    }
}

/// Lists what differs between what a store (or partial store) was built with and what is
/// requested now; a parameter absent on one side is named by what its absence means
/// (`defaults`), else "(not given)".
pub(super) fn describe_differences(
    defaults: &BTreeMap<String, String>,
    old_params: &BTreeMap<String, String>,
    new_params: &BTreeMap<String, String>,
    old_sources: &[SourceFile],
    new_sources: &[SourceFile],
    old_version: &str,
    new_version: &str,
) -> Vec<String> {
    let mut d = Vec::new();
    let keys: BTreeSet<&String> = old_params.keys().chain(new_params.keys()).collect();
    for k in keys {
        let a = old_params.get(k);
        let b = new_params.get(k);
        if a != b {
            let absent = defaults.get(k).map_or("(not given)", String::as_str);
            d.push(format!(
                "parameter {k}: existing {} vs requested {}",
                a.map_or(absent, String::as_str),
                b.map_or(absent, String::as_str)
            ));
        }
    }
    let old_map: BTreeMap<&str, &SourceFile> =
        old_sources.iter().map(|s| (s.name.as_str(), s)).collect();
    let new_map: BTreeMap<&str, &SourceFile> =
        new_sources.iter().map(|s| (s.name.as_str(), s)).collect();
    for (name, s) in &old_map {
        match new_map.get(name) {
            None => d.push(format!(
                "source {name}: in the existing store, not in the request"
            )),
            Some(n) if n != s => d.push(format!(
                "source {name}: existing size {} header {} vs requested size {} header {}",
                s.size, s.header_xxh3, n.size, n.header_xxh3
            )),
            _ => {}
        }
    }
    for name in new_map.keys() {
        if !old_map.contains_key(name) {
            d.push(format!(
                "source {name}: requested, not in the existing store"
            ));
        }
    }
    if d.is_empty() && old_sources != new_sources {
        d.push("sources: same files in a different order".into());
    }
    if old_version != new_version {
        d.push(format!(
            "converter version: existing {old_version} vs requested {new_version}"
        ));
    }
    d
}

pub(super) fn spec_differences(
    defaults: &BTreeMap<String, String>,
    old: &SpecFile,
    new: &SpecFile,
) -> Vec<String> {
    let mut d = describe_differences(
        defaults,
        &old.parameters,
        &new.parameters,
        &old.sources,
        &new.sources,
        &old.converter_version,
        &new.converter_version,
    );
    macro_rules! cmp {
        ($f:ident) => {
            if old.$f != new.$f {
                d.push(format!(
                    "{}: existing {:?} vs requested {:?}",
                    stringify!($f),
                    old.$f,
                    new.$f
                ));
            }
        };
    }
    cmp!(family);
    cmp!(config_xxh3);
    cmp!(num_layers);
    cmp!(expert_layers);
    cmp!(expert_encoding);
    cmp!(alignment);
    cmp!(segment_max_bytes);
    if old.matrix_order != new.matrix_order {
        d.push(format!(
            "matrix order: existing {} vs requested {}",
            old.matrix_order.name(),
            new.matrix_order.name()
        ));
    }
    d
}

pub(super) fn validate_spec(spec: &StoreSpec) -> Result<serde_json::Value, StoreError> {
    if spec.alignment < 512 || spec.alignment > 1 << 24 || !spec.alignment.is_power_of_two() {
        return Err(writer_err(format!(
            "alignment {} must be a power of two from 512 bytes to 16 MiB (what readers accept)",
            spec.alignment
        )));
    }
    if spec.segment_max_bytes < 2 * spec.alignment as u64 {
        return Err(writer_err(format!(
            "segment_max_bytes {} must be at least twice the alignment ({})",
            spec.segment_max_bytes, spec.alignment
        )));
    }
    let mut prev: Option<u32> = None;
    for l in &spec.expert_layers {
        if prev.is_some_and(|p| l.layer <= p) {
            return Err(writer_err(format!(
                "expert_layers must be sorted by layer without duplicates (layer {})",
                l.layer
            )));
        }
        if l.layer >= spec.num_layers {
            return Err(writer_err(format!(
                "expert layer {} is not below num_layers {}",
                l.layer, spec.num_layers
            )));
        }
        prev = Some(l.layer);
    }
    serde_json::from_slice(&spec.config_json)
        .map_err(|e| writer_err(format!("config.json is not valid JSON: {e}")))
}
