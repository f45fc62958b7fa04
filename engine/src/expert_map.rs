//! [`ExpertMap`]: every expert of the store, layer by expert, with the tokens routed to it and
//! where it lives now (pinned, cached, being read, or on which drive): what `coli web`'s heat
//! map draws. Read-only: building one changes nothing in the cache or the store.

use crate::cache::{ExpertCache, Residency};
use coli_format::ExpertKey;
use coli_store::Store;

/// One layer of an [`ExpertMap`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ExpertMapLayer {
    /// Decoder layer index (as in the store's INDEX; an MTP layer comes after the last
    /// decoder layer).
    pub layer: u32,
    /// Per expert index `0..experts`: tokens routed to it since the engine started (0 for an
    /// index the store holds no record of).
    pub routed: Vec<u64>,
    /// Per expert index: where it is now; `None` for an index without a record.
    pub residency: Vec<Option<Residency>>,
    /// Per expert index: the drive an unstriped read of it goes to ([`Store::drive_of`]: 0 the
    /// primary, k the k-th mirror).
    pub drive: Vec<u32>,
}

/// Every expert of a store: routing counts and residency, layer by expert.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ExpertMap {
    /// Columns: the largest expert index + 1 over all layers.
    pub experts: u32,
    /// Rows: the layers that hold experts, in increasing order.
    pub layers: Vec<ExpertMapLayer>,
    /// Tokens routed summed over every expert (each token counts once per expert it was
    /// routed to, so top-k times per MoE layer).
    pub routed_total: u64,
}

impl ExpertMap {
    /// Reads the routing counts and residency of every expert in `store`'s INDEX from `cache`.
    /// Cost: one pass over the INDEX and one lock of the cache per call.
    pub fn of(store: &Store, cache: &ExpertCache) -> ExpertMap {
        let keys: Vec<ExpertKey> = store.index().iter().map(|r| r.key()).collect();
        let residency = cache.residency(&keys);
        let routed = cache.routed_totals();
        let experts = keys.iter().map(|k| k.expert + 1).max().unwrap_or(0);
        let mut layers: Vec<ExpertMapLayer> = Vec::new();
        for (k, r) in keys.iter().zip(residency) {
            if layers.last().is_none_or(|l| l.layer != k.layer) {
                layers.push(ExpertMapLayer {
                    layer: k.layer,
                    routed: vec![0; experts as usize],
                    residency: vec![None; experts as usize],
                    drive: vec![0; experts as usize],
                });
            }
            let l = layers.last_mut().expect("pushed");
            let e = k.expert as usize;
            l.routed[e] = routed.get(k).copied().unwrap_or(0);
            l.residency[e] = Some(r);
            l.drive[e] = store.drive_of(*k).unwrap_or(0);
        }
        ExpertMap {
            experts,
            routed_total: layers.iter().flat_map(|l| &l.routed).sum(),
            layers,
        }
    }

    /// Experts in each residency: (disk, reading, cached, pinned).
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let mut c = (0, 0, 0, 0);
        for r in self.layers.iter().flat_map(|l| &l.residency).flatten() {
            match r {
                Residency::Disk => c.0 += 1,
                Residency::Reading => c.1 += 1,
                Residency::Cached => c.2 += 1,
                Residency::Pinned => c.3 += 1,
            }
        }
        c
    }
}
