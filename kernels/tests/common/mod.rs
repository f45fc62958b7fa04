//! What the recurrence tests (`gated_delta.rs`, `kda.rs`) share: the oracle cases their fixture
//! scripts write (`tests/fixtures/<dir>/cases.json` with shapes and offsets into
//! `cases.bin`, little-endian f32) and the largest element difference.

use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

/// One case: its JSON entry and every case's arrays.
pub struct Oracle {
    pub meta: Value,
    pub data: Arc<Vec<f32>>,
}

impl Oracle {
    /// The case's name.
    pub fn name(&self) -> &str {
        self.meta["name"].as_str().unwrap()
    }

    /// A size field of the case (`n`, `dk`, ...).
    pub fn dim(&self, key: &str) -> usize {
        self.meta[key].as_u64().unwrap() as usize
    }

    /// Array `key`, flattened.
    pub fn array(&self, key: &str) -> &[f32] {
        let a = &self.meta["arrays"][key];
        let off = a["offset"].as_u64().unwrap() as usize;
        let len: usize = a["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .product();
        &self.data[off..off + len]
    }
}

/// The cases under `tests/fixtures/<dir>/`.
pub fn oracles(dir: &str) -> Vec<Oracle> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(dir);
    let doc: Value =
        serde_json::from_slice(&std::fs::read(dir.join("cases.json")).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("cases.bin")).unwrap();
    let data: Arc<Vec<f32>> = Arc::new(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
    );
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Oracle {
            meta: c.clone(),
            data: data.clone(),
        })
        .collect()
}

/// The largest `|a[i] - b[i]|`.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
