//! The routing trace (`coli run --routing-trace FILE`): for every token and every MoE layer of
//! the main model, the experts its router chose and the experts the router lookahead predicted
//! for it ([`crate::prefetch`]), one JSON object per line:
//!
//! ```text
//! {"pos":17,"layer":3,"experts":[41,7,...],"predicted":[12,41,...]}
//! ```
//!
//! - `pos`: the token's position in the sequence (0-based);
//! - `layer`: the decoder layer index;
//! - `experts`: the routed experts of that token, highest routing weight first (top-k);
//! - `predicted`: the top-k the lookahead computed for that token before the layer ran (layer
//!   `L`'s router applied to the residual stream after layer `L-1`'s attention; for the first
//!   MoE layer, to the stream before it), highest first; `null` when no prediction was made
//!   (prefetch off, or a layer the lookahead does not reach).
//!
//! It exists to measure a model's routing (usage balance, lookahead recall, top-k overlap of
//! consecutive tokens: `engine/bench/routing_stats.py`) on the code path that runs. The trace
//! only observes: the tokens are the same with and without it. The MTP layer is not traced.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::layers::moe::Routing;

/// A routing trace being written (see the module doc). Write errors are kept and returned by
/// [`RoutingTrace::finish`], so a full disk never changes or stops the generation.
pub struct RoutingTrace {
    path: PathBuf,
    state: Mutex<TraceState>,
}

struct TraceState {
    out: BufWriter<File>,
    /// Per layer, the per-token predictions of the pass in progress, keyed by position.
    predicted: HashMap<u32, Vec<(usize, Vec<u32>)>>,
    error: Option<std::io::Error>,
}

impl RoutingTrace {
    /// Creates (truncates) `path`.
    ///
    /// # Errors
    /// The file cannot be created; the message names it.
    pub fn create(path: &Path) -> Result<RoutingTrace, String> {
        let f = File::create(path)
            .map_err(|e| format!("routing trace {}: cannot create: {e}", path.display()))?;
        Ok(RoutingTrace {
            path: path.to_path_buf(),
            state: Mutex::new(TraceState {
                out: BufWriter::new(f),
                predicted: HashMap::new(),
                error: None,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, TraceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a forward pass: predictions left from a pass that failed before its layers
    /// consumed them are dropped, so they are never attributed to this pass's tokens. (Lines a
    /// failed pass already wrote stay in the file.)
    pub fn begin_pass(&self) {
        self.state().predicted.clear();
    }

    /// Records the lookahead's per-token routing for `layer` (`routes[t]` is the token at
    /// position `pos0 + t`); written with the layer's real routing by [`RoutingTrace::routed`].
    pub fn predicted(&self, layer: u32, pos0: usize, routes: &[Routing]) {
        let rows = routes
            .iter()
            .enumerate()
            .map(|(t, r)| (pos0 + t, r.iter().map(|x| x.0).collect()))
            .collect();
        self.state().predicted.insert(layer, rows);
    }

    /// Writes one line per token of `routes` (positions `pos0..`), with the prediction recorded
    /// for `layer` in this pass, if any (consumed).
    pub fn routed(&self, layer: u32, pos0: usize, routes: &[Routing]) {
        let mut s = self.state();
        let pred = s.predicted.remove(&layer).unwrap_or_default();
        let mut text = String::new();
        for (t, r) in routes.iter().enumerate() {
            let pos = pos0 + t;
            let experts: Vec<u32> = r.iter().map(|x| x.0).collect();
            let p = pred.iter().find(|(q, _)| *q == pos).map(|(_, e)| e);
            let line = serde_json::json!({
                "pos": pos, "layer": layer, "experts": experts, "predicted": p,
            });
            text.push_str(&line.to_string());
            text.push('\n');
        }
        if s.error.is_none() {
            if let Err(e) = s.out.write_all(text.as_bytes()) {
                s.error = Some(e);
            }
        }
    }

    /// Flushes the file.
    ///
    /// # Errors
    /// The first write or flush error, naming the file.
    pub fn finish(&self) -> Result<(), String> {
        let mut s = self.state();
        let flushed = s.out.flush();
        match s.error.take().map_or(flushed, Err) {
            Ok(()) => Ok(()),
            Err(e) => Err(format!("routing trace {}: {e}", self.path.display())),
        }
    }
}
