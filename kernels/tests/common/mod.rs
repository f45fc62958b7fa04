//! What the recurrence tests (`gated_delta.rs`, `kda.rs`) share: the oracle cases their fixture
//! scripts write (`tests/fixtures/<dir>/cases.json` with shapes and offsets into
//! `cases.bin`, little-endian f32), the largest element difference, and the two checks of a
//! rule's forms ([`check_splits`], [`check_split_rounding`]).

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

/// A case's run with the first `split` tokens in the chunkwise form and the rest token by
/// token: (outputs, final state).
pub type Run<'a> = &'a dyn Fn(usize) -> (Vec<f32>, Vec<f32>);

/// A case's float64 oracle for a form (`"chunk"` or `"recurrent"`): (outputs, final state,
/// transformers' float32 outputs).
pub type Oracles<'a, 'o> = &'a dyn Fn(&str) -> (&'o [f32], &'o [f32], &'o [f32]);

/// Case `name` of `n` tokens run chunked, token by token and as whole aligned chunks of `chunk`
/// plus a recurrent tail, each within `tol` of the float64 oracle `oracle(form)` gives for the
/// form that ran first (`"chunk"` or `"recurrent"`): (outputs, state, transformers' float32
/// outputs, printed for scale).
pub fn check_splits<'o>(
    name: &str,
    n: usize,
    chunk: usize,
    tol: f32,
    run: Run<'_>,
    oracle: Oracles<'_, 'o>,
) {
    for (what, split, form) in [
        ("chunked", n, "chunk"),
        ("recurrent", 0, "recurrent"),
        (
            "aligned chunks + recurrent tail",
            n / chunk * chunk,
            "chunk",
        ),
    ] {
        let (out, state) = run(split);
        let (eo, es, f32_out) = oracle(form);
        let (d_out, d_state) = (max_diff(&out, eo), max_diff(&state, es));
        let t_out = max_diff(f32_out, eo);
        println!(
            "{name} {what}: out {d_out:.2e} state {d_state:.2e} (transformers f32 {t_out:.2e})"
        );
        assert!(
            d_out <= tol && d_state <= tol,
            "{name} {what}: outputs differ by {d_out}, state by {d_state} from the float64 oracle"
        );
    }
}

/// The same tokens grouped differently give the same function: the chunked and the
/// token-by-token runs of case `name` (`n` tokens) agree within `tol`, and the chunked run is
/// reproducible bit for bit.
pub fn check_split_rounding(name: &str, n: usize, tol: f32, run: Run<'_>) {
    let (a, sa) = run(n);
    let (b, sb) = run(0);
    assert!(
        max_diff(&a, &b) <= tol && max_diff(&sa, &sb) <= tol,
        "{name}"
    );
    let (a2, sa2) = run(n);
    assert_eq!(a, a2, "{name}: chunked run not reproducible");
    assert_eq!(sa, sa2);
}
