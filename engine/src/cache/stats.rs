//! The expert cache's counters ([`CacheStats`]): hits by tier, misses, bytes read on demand
//! and by prefetch, prediction precision and recall, time stalled on reads.

/// Counters of the expert cache since it was created. Every expert lookup of a demand request
/// is exactly one of: a pinned hit, an LRU hit, a wait for a read in flight, or a miss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Lookups served without a demand read: `pinned_hits` + LRU hits + `inflight_waits`.
    pub hits: u64,
    /// Lookups served by the pinned tier.
    pub pinned_hits: u64,
    /// Lookups that waited for a prefetch read already in flight instead of reading again.
    pub inflight_waits: u64,
    /// Lookups that needed a demand read from the store.
    pub misses: u64,
    /// Experts dropped from the LRU tier to make room.
    pub evictions: u64,
    /// Bytes of expert records fetched from the store, demand and prefetch (sum of
    /// `ExpertBuf::len_bytes`).
    pub bytes_fetched: u64,
    /// Of `bytes_fetched`, bytes read on demand.
    pub demand_bytes: u64,
    /// Of `bytes_fetched`, bytes read by prefetch (used or not).
    pub prefetch_bytes: u64,
    /// `Store::fetch` calls made (demand and prefetch).
    pub fetch_calls: u64,
    /// Experts read by prefetch.
    pub prefetch_reads: u64,
    /// Prefetched experts that a demand request used (from RAM or by waiting for the read).
    pub prefetch_used: u64,
    /// Experts the lookahead router predicted (summed over layers and forward passes).
    pub predicted: u64,
    /// Predicted experts that the layer's demand request then asked for.
    pub predicted_used: u64,
    /// Experts asked for by demand requests of layers that had a prediction.
    pub demanded_after_prediction: u64,
    /// Experts pinned at start (loaded by [`crate::ExpertCache::pin`]).
    pub pinned_reads: u64,
    /// Nanoseconds demand requests spent waiting for reads (the compute thread stalled).
    pub io_wait_ns: u64,
    /// Nanoseconds of demand reads that ran while the layer computed the experts it already
    /// had ([`crate::ExpertCache::get_many_while`]): read time hidden behind compute.
    pub io_hidden_ns: u64,
    /// The most bytes (buffers' held bytes) of unpinned experts one demand request held at
    /// once, over the cache's life (not a difference in [`CacheStats::since`]): at most
    /// `max(LRU capacity, the largest record's held bytes)`, because the MoE block splits a
    /// larger union ([`crate::ExpertCache::request_groups`]). What a request may hold beyond the
    /// budget while its misses are read.
    pub largest_request_bytes: u64,
}

impl CacheStats {
    /// The share of lookups served from RAM (pinned or LRU): `(hits - inflight_waits) /
    /// (hits + misses)`; 1.0 before any lookup. A wait for a read already in flight is not a
    /// hit here (the bytes came from the disk, only earlier): [`CacheStats::inflight_rate`].
    pub fn hit_rate(&self) -> f64 {
        ratio(
            self.hits - self.inflight_waits,
            self.hits + self.misses,
            1.0,
        )
    }

    /// The share of lookups that waited for a prefetch read already in flight:
    /// `inflight_waits / (hits + misses)`; 0.0 before any lookup.
    pub fn inflight_rate(&self) -> f64 {
        ratio(self.inflight_waits, self.hits + self.misses, 0.0)
    }

    /// Prediction precision: `predicted_used / predicted` (0.0 before any prediction).
    pub fn prefetch_precision(&self) -> f64 {
        ratio(self.predicted_used, self.predicted, 0.0)
    }

    /// Prediction recall: `predicted_used / demanded_after_prediction` (0.0 before any).
    pub fn prefetch_recall(&self) -> f64 {
        ratio(self.predicted_used, self.demanded_after_prediction, 0.0)
    }

    /// Share of prefetch reads that a demand request used: `prefetch_used / prefetch_reads`
    /// (0.0 before any prefetch read). `1 -` this is the bandwidth spent on mispredictions.
    pub fn prefetch_read_precision(&self) -> f64 {
        ratio(self.prefetch_used, self.prefetch_reads, 0.0)
    }

    /// Seconds demand requests spent waiting for reads.
    pub fn io_wait_s(&self) -> f64 {
        self.io_wait_ns as f64 * 1e-9
    }

    /// The counters accumulated since `earlier` (a snapshot of the same cache);
    /// `largest_request_bytes` is this snapshot's (a maximum, not a count).
    pub fn since(&self, earlier: &CacheStats) -> CacheStats {
        CacheStats {
            hits: self.hits - earlier.hits,
            pinned_hits: self.pinned_hits - earlier.pinned_hits,
            inflight_waits: self.inflight_waits - earlier.inflight_waits,
            misses: self.misses - earlier.misses,
            evictions: self.evictions - earlier.evictions,
            bytes_fetched: self.bytes_fetched - earlier.bytes_fetched,
            demand_bytes: self.demand_bytes - earlier.demand_bytes,
            prefetch_bytes: self.prefetch_bytes - earlier.prefetch_bytes,
            fetch_calls: self.fetch_calls - earlier.fetch_calls,
            prefetch_reads: self.prefetch_reads - earlier.prefetch_reads,
            prefetch_used: self.prefetch_used - earlier.prefetch_used,
            predicted: self.predicted - earlier.predicted,
            predicted_used: self.predicted_used - earlier.predicted_used,
            demanded_after_prediction: self.demanded_after_prediction
                - earlier.demanded_after_prediction,
            pinned_reads: self.pinned_reads - earlier.pinned_reads,
            io_wait_ns: self.io_wait_ns - earlier.io_wait_ns,
            io_hidden_ns: self.io_hidden_ns - earlier.io_hidden_ns,
            largest_request_bytes: self.largest_request_bytes,
        }
    }
}

fn ratio(a: u64, b: u64, empty: f64) -> f64 {
    if b == 0 {
        empty
    } else {
        a as f64 / b as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_rate() {
        let s = CacheStats {
            hits: 3,
            misses: 1,
            ..Default::default()
        };
        assert_eq!(s.hit_rate(), 0.75);
        assert_eq!(CacheStats::default().hit_rate(), 1.0);
        // Waits for reads in flight are their own figure, not hits.
        let s = CacheStats {
            hits: 3,
            inflight_waits: 2,
            misses: 1,
            ..Default::default()
        };
        assert_eq!((s.hit_rate(), s.inflight_rate()), (0.25, 0.5));
    }
}
