//! Blocked attention: the softmax attention of a block of query rows against one head's keys
//! and values, in tiles of [`KEY_TILE`] key positions, so that each tile is read from memory
//! once per block instead of once per row.
//!
//! Every attention kind of the engine (GQA with sliding windows and sinks, Inkling's relative
//! bias, MLA's expanded prefill, DSA-selected keys) supplies its keys and values through
//! [`KeyValues`]; [`attend_block`] owns the loop order. Each row's result is exactly what the
//! unblocked per-row computation gives, bit for bit:
//!
//! 1. `s_j` = the row's score against key `j` (as [`KeyValues::scores`] computes it: one value
//!    per key, independent of the others), for the row's keys in ascending position;
//! 2. the sink logit, if any, appended as one more score (its probability is dropped);
//! 3. [`softmax_inplace`] over the scores (max, `exp` with an f64 sum, one f32 scale);
//! 4. `o = 0`, then `o += p_j v_j` for the keys in ascending position ([`KeyValues::accumulate`]:
//!    each product rounded, then added, in that order).
//!
//! Tiling changes which memory is warm, never the order of any sum: step 1's values do not
//! depend on one another and step 4 adds each row's terms in the order of `j` across tiles. So
//! a row gives the same bits alone, in any block, in decode or in prefill, whatever the thread
//! count (`kernels/tests/attend.rs` checks it against the per-row form).
//!
//! The softmax is two-pass (all scores, then the probabilities) rather than an online softmax:
//! the scores of a block (`rows x keys` f32) are small next to the keys and values
//! (`2 x keys x head_dim` f32 per head), and the two-pass form keeps the numbers every earlier
//! release computed, so no cached KV state or recorded expectation changes.

#![forbid(unsafe_code)]

use crate::ops::softmax_inplace;

/// Key positions per tile: 64 keys of a 128-wide head are 32 KiB of keys and 32 KiB of values,
/// which stay in the core's L2 cache while every row of a block takes its terms.
pub const KEY_TILE: usize = 64;

/// The keys one query row attends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keys<'a> {
    /// Positions `lo..hi` (causal: `hi = pos + 1`; a sliding window raises `lo`).
    Range {
        /// First position.
        lo: usize,
        /// One past the last position.
        hi: usize,
    },
    /// These positions, strictly ascending (DSA's top-k selection).
    List(&'a [usize]),
}

impl Keys<'_> {
    /// Number of keys.
    pub fn len(&self) -> usize {
        match *self {
            Keys::Range { lo, hi } => hi.saturating_sub(lo),
            Keys::List(l) => l.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first position (None if empty).
    fn first(&self) -> Option<usize> {
        match *self {
            Keys::Range { lo, hi } => (lo < hi).then_some(lo),
            Keys::List(l) => l.first().copied(),
        }
    }

    /// One past the last position (0 if empty).
    fn end(&self) -> usize {
        match *self {
            Keys::Range { lo, hi } => {
                if lo < hi {
                    hi
                } else {
                    0
                }
            }
            Keys::List(l) => l.last().map_or(0, |&p| p + 1),
        }
    }

    /// The keys from index `at` (of this set) whose positions are below `end`: the run and its
    /// length. Keys before index `at` were taken by earlier tiles.
    fn run_below(&self, at: usize, end: usize) -> (Run<'_>, usize) {
        match *self {
            Keys::Range { lo, hi } => {
                let a = lo + at;
                let b = hi.min(end).max(a);
                (Run::Range { lo: a, hi: b }, b - a)
            }
            Keys::List(l) => {
                let rest = &l[at..];
                let n = rest.partition_point(|&p| p < end);
                // Strictly ascending: consecutive positions exactly when the span equals the
                // count. Such a run (DSA selects every key below `index_topk`) goes to the
                // sources' strided kernels as a range; each score and each value term has the
                // same bits either way (`KeyValues`'s contract).
                debug_assert!(
                    rest[..n].windows(2).all(|w| w[0] < w[1]),
                    "Keys::List positions must be strictly ascending"
                );
                if n > 0 && rest[n - 1] - rest[0] + 1 == n {
                    (
                        Run::Range {
                            lo: rest[0],
                            hi: rest[n - 1] + 1,
                        },
                        n,
                    )
                } else {
                    (Run::List(&rest[..n]), n)
                }
            }
        }
    }
}

/// The part of one row's keys inside one tile, in ascending position: what
/// [`KeyValues::scores`] and [`KeyValues::accumulate`] are asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Run<'a> {
    /// Positions `lo..hi`.
    Range {
        /// First position.
        lo: usize,
        /// One past the last position.
        hi: usize,
    },
    /// These positions (ascending).
    List(&'a [usize]),
}

impl Run<'_> {
    /// Number of keys.
    pub fn len(&self) -> usize {
        match *self {
            Run::Range { lo, hi } => hi - lo,
            Run::List(l) => l.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The positions, in order.
    pub fn positions(&self) -> impl Iterator<Item = usize> + '_ {
        let (range, list) = match *self {
            Run::Range { lo, hi } => (lo..hi, &[][..]),
            Run::List(l) => (0..0, l),
        };
        range.chain(list.iter().copied())
    }
}

/// Where the rows of one block find their keys and values.
///
/// [`attend_block`] calls [`KeyValues::load_keys`] before the rows of a block (more than one)
/// take their scores from a tile, and [`KeyValues::load_values`] before they take its values:
/// a source may gather that tile into contiguous memory there (a KV cache's rows of one head lie
/// a whole position apart, so the tile's keys of a wide cache fall into a few cache sets and
/// evict each other before the next row reads them). What a source computes must not depend on
/// whether it was loaded.
pub trait KeyValues {
    /// The rows are about to take scores from keys at positions `lo..hi` (the tile's keys that
    /// any row attends to; every run asked for until the next load lies inside it).
    fn load_keys(&mut self, lo: usize, hi: usize) {
        let _ = (lo, hi);
    }

    /// The rows are about to take values from positions `lo..hi` (as [`KeyValues::load_keys`]).
    fn load_values(&mut self, lo: usize, hi: usize) {
        let _ = (lo, hi);
    }

    /// Writes row `row`'s score against each key of `run` to `out` (`out.len() == run.len()`),
    /// in order: the logit the softmax takes (scaled, with any bias), computed for each key
    /// on its own.
    fn scores(&self, row: usize, run: Run<'_>, out: &mut [f32]);

    /// `out += p[i] * value(key i of run)` for `i = 0, 1, ...` (`p.len() == run.len()`, `out`
    /// the row's output, `width` f32): each product rounded, then added, in that order.
    fn accumulate(&self, row: usize, run: Run<'_>, p: &[f32], out: &mut [f32]);
}

/// One query row of a block: its keys and its attention sink (gpt-oss: one more logit in the
/// softmax whose probability is dropped).
#[derive(Clone, Copy, Debug)]
pub struct Row<'a> {
    /// The keys it attends to.
    pub keys: Keys<'a>,
    /// The sink logit, if any.
    pub sink: Option<f32>,
}

/// Attention of the block's `rows` against `kv`: row `i`'s output is written to
/// `out[i * width..(i + 1) * width]` (`out.len() == rows.len() * width`), computed as the module
/// documentation lists (scores, sink, softmax, weighted values), bit-identical to the per-row
/// form. Keys are visited in tiles of [`KEY_TILE`] positions (tile `t` covers positions
/// `t * KEY_TILE..(t + 1) * KEY_TILE`); within a tile every row takes its keys before the next
/// tile starts.
///
/// A row without keys or sink gets zeros (an empty softmax has no probabilities).
///
/// # Panics
/// If `out.len() != rows.len() * width`.
pub fn attend_block<K: KeyValues + ?Sized>(
    kv: &mut K,
    rows: &[Row<'_>],
    width: usize,
    out: &mut [f32],
) {
    assert_eq!(
        out.len(),
        rows.len() * width,
        "attend_block: output holds {} f32, {} rows of {width} need {}",
        out.len(),
        rows.len(),
        rows.len() * width
    );
    // Scores of row i at offsets[i].., its keys then its sink.
    let mut offsets = Vec::with_capacity(rows.len() + 1);
    let mut total = 0;
    for r in rows {
        offsets.push(total);
        total += r.keys.len() + usize::from(r.sink.is_some());
    }
    offsets.push(total);
    let mut scores = vec![0f32; total];
    let first = rows.iter().filter_map(|r| r.keys.first()).min();
    let end = rows.iter().map(|r| r.keys.end()).max().unwrap_or(0);
    let tiles = first.map_or(0..0, |f| f / KEY_TILE..end.div_ceil(KEY_TILE));

    walk_tiles(kv, rows, tiles.clone(), K::load_keys, |kv, i, run, k| {
        let at = offsets[i] + k;
        kv.scores(i, run, &mut scores[at..at + run.len()]);
    });
    for (i, r) in rows.iter().enumerate() {
        let s = &mut scores[offsets[i]..offsets[i + 1]];
        if let Some(sink) = r.sink {
            s[s.len() - 1] = sink;
        }
        softmax_inplace(s);
    }
    out.fill(0.0);
    walk_tiles(kv, rows, tiles, K::load_values, |kv, i, run, k| {
        let at = offsets[i] + k;
        kv.accumulate(
            i,
            run,
            &scores[at..at + run.len()],
            &mut out[i * width..(i + 1) * width],
        );
    });
}

/// Visits `tiles` in order; in each, first `load(kv, lo, hi)` (only for blocks of more than
/// one row; `lo..hi` = the positions the rows' runs in it cover, skipped when none has one),
/// then, for each row `i` with keys in the tile, `visit(kv, i, run, k)`: its run there and how
/// many of its keys earlier tiles took.
fn walk_tiles<K: KeyValues + ?Sized>(
    kv: &mut K,
    rows: &[Row<'_>],
    tiles: std::ops::Range<usize>,
    load: fn(&mut K, usize, usize),
    mut visit: impl FnMut(&K, usize, Run<'_>, usize),
) {
    let mut taken = vec![0usize; rows.len()];
    for t in tiles {
        let tile_end = (t + 1) * KEY_TILE;
        if rows.len() > 1 {
            if let Some((lo, hi)) = tile_span(rows, &taken, tile_end) {
                load(kv, lo, hi);
            }
        }
        for (i, r) in rows.iter().enumerate() {
            let (run, n) = r.keys.run_below(taken[i], tile_end);
            if n > 0 {
                visit(kv, i, run, taken[i]);
                taken[i] += n;
            }
        }
    }
}

/// The positions `lo..hi` spanning every row's keys below `end` from index `taken[i]` on (None
/// if no row has one).
fn tile_span(rows: &[Row<'_>], taken: &[usize], end: usize) -> Option<(usize, usize)> {
    let mut span: Option<(usize, usize)> = None;
    for (r, &at) in rows.iter().zip(taken) {
        let (run, n) = r.keys.run_below(at, end);
        if n == 0 {
            continue;
        }
        let (a, b) = match run {
            Run::Range { lo, hi } => (lo, hi),
            Run::List(l) => (l[0], l[n - 1] + 1),
        };
        span = Some(span.map_or((a, b), |(x, y)| (x.min(a), y.max(b))));
    }
    span
}

/// The per-row form [`attend_block`] must equal, one row at a time and one key at a time (for
/// tests and benchmarks): scores key by key, the sink, [`softmax_inplace`], then the weighted
/// values key by key.
pub fn attend_row_reference<K: KeyValues + ?Sized>(
    kv: &K,
    row: usize,
    r: &Row<'_>,
    out: &mut [f32],
) {
    let keys: Vec<usize> = match r.keys {
        Keys::Range { lo, hi } => (lo..hi).collect(),
        Keys::List(l) => l.to_vec(),
    };
    let mut s = vec![0f32; keys.len() + usize::from(r.sink.is_some())];
    for (k, &j) in keys.iter().enumerate() {
        kv.scores(row, Run::Range { lo: j, hi: j + 1 }, &mut s[k..k + 1]);
    }
    if let Some(sink) = r.sink {
        let last = s.len() - 1;
        s[last] = sink;
    }
    softmax_inplace(&mut s);
    out.fill(0.0);
    for (k, &j) in keys.iter().enumerate() {
        kv.accumulate(row, Run::Range { lo: j, hi: j + 1 }, &s[k..k + 1], out);
    }
}

/// The common case: query rows against one head of a KV cache whose positions are rows of
/// `stride` f32 (`keys` and `values` hold positions `first..`); the head's key is the
/// `queries[i].len()` columns from `key_offset`, its value the `value_width` columns from
/// `value_offset`. Score = `dot(q, k_j) * scale` ([`crate::dot_strided`], the same bits as
/// [`crate::dot`]); values by [`crate::axpy_strided`] (the same bits as [`crate::axpy`] key by
/// key). A loaded tile ([`KeyValues::load_keys`]) is a contiguous copy of the head's columns.
pub struct StridedHead<'a> {
    queries: Vec<&'a [f32]>,
    keys: &'a [f32],
    values: &'a [f32],
    stride: usize,
    key_offset: usize,
    value_offset: usize,
    value_width: usize,
    first: usize,
    scale: f32,
    /// The loaded tile: what it holds, its first position, `width` f32 per position.
    tile: (Tile, usize, Vec<f32>),
}

/// What [`StridedHead`]'s tile holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tile {
    Empty,
    Keys,
    Values,
}

impl<'a> StridedHead<'a> {
    /// Queries `queries` (one per row of the block, all the key's width) against the head of a
    /// KV cache described in the type's documentation.
    ///
    /// # Panics
    /// In [`KeyValues::scores`] / [`KeyValues::accumulate`], if a key position is below
    /// `first` or past the cache.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        queries: Vec<&'a [f32]>,
        keys: &'a [f32],
        values: &'a [f32],
        stride: usize,
        key_offset: usize,
        value_offset: usize,
        value_width: usize,
        first: usize,
        scale: f32,
    ) -> StridedHead<'a> {
        StridedHead {
            queries,
            keys,
            values,
            stride,
            key_offset,
            value_offset,
            value_width,
            first,
            scale,
            tile: (Tile::Empty, 0, Vec::new()),
        }
    }

    /// Width of the key (each query's length).
    fn key_width(&self) -> usize {
        self.queries.first().map_or(0, |q| q.len())
    }

    /// Copies the head's keys (or values) of positions `lo..hi` into the tile.
    fn load(&mut self, what: Tile, lo: usize, hi: usize) {
        let (m, offset, d) = match what {
            Tile::Values => (self.values, self.value_offset, self.value_width),
            _ => (self.keys, self.key_offset, self.key_width()),
        };
        let buf = &mut self.tile.2;
        buf.clear();
        for j in lo..hi {
            let at = (j - self.first) * self.stride + offset;
            buf.extend_from_slice(&m[at..at + d]);
        }
        self.tile.0 = what;
        self.tile.1 = lo;
    }

    /// Where `run`'s keys (or values) are: `(f32, stride, offset, first position)` of the
    /// loaded tile when it holds them, else of the cache.
    fn source(&self, what: Tile, run: &Run<'_>) -> (&[f32], usize, usize, usize) {
        let (cache, offset, d) = match what {
            Tile::Values => (self.values, self.value_offset, self.value_width),
            _ => (self.keys, self.key_offset, self.key_width()),
        };
        let (lo, hi) = match *run {
            Run::Range { lo, hi } => (lo, hi),
            Run::List(l) => (l[0], l[l.len() - 1] + 1),
        };
        let (held, t0, buf) = (&self.tile.0, self.tile.1, &self.tile.2);
        if *held == what && d > 0 && lo >= t0 && hi <= t0 + buf.len() / d {
            (buf, d, 0, t0)
        } else {
            (cache, self.stride, offset, self.first)
        }
    }
}

impl KeyValues for StridedHead<'_> {
    fn load_keys(&mut self, lo: usize, hi: usize) {
        self.load(Tile::Keys, lo, hi);
    }

    fn load_values(&mut self, lo: usize, hi: usize) {
        self.load(Tile::Values, lo, hi);
    }

    fn scores(&self, row: usize, run: Run<'_>, out: &mut [f32]) {
        if run.is_empty() {
            return;
        }
        let q = self.queries[row];
        let (m, stride, offset, first) = self.source(Tile::Keys, &run);
        match run {
            Run::Range { lo, .. } => {
                crate::dot_strided(q, &m[(lo - first) * stride..], stride, offset, out)
            }
            Run::List(l) => {
                for (o, &j) in out.iter_mut().zip(l) {
                    let at = (j - first) * stride + offset;
                    *o = crate::dot(q, &m[at..at + q.len()]);
                }
            }
        }
        for s in out.iter_mut() {
            *s *= self.scale;
        }
    }

    fn accumulate(&self, _row: usize, run: Run<'_>, p: &[f32], out: &mut [f32]) {
        if run.is_empty() {
            return;
        }
        let (m, stride, offset, first) = self.source(Tile::Values, &run);
        match run {
            Run::Range { lo, .. } => {
                crate::axpy_strided(p, &m[(lo - first) * stride..], stride, offset, out)
            }
            Run::List(l) => {
                for (&pj, &j) in p.iter().zip(l) {
                    let at = (j - first) * stride + offset;
                    crate::axpy(pj, &m[at..at + out.len()], out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_ranges_and_lists_at_tile_ends() {
        let r = Keys::Range { lo: 10, hi: 100 };
        assert_eq!(r.run_below(0, 64), (Run::Range { lo: 10, hi: 64 }, 54));
        assert_eq!(r.run_below(54, 128), (Run::Range { lo: 64, hi: 100 }, 36));
        assert_eq!(r.run_below(90, 192).1, 0);
        let l = [3usize, 63, 64, 65, 200];
        let k = Keys::List(&l);
        assert_eq!(k.run_below(0, 64), (Run::List(&l[..2]), 2));
        // Consecutive positions of a list run as a range (the strided kernels).
        assert_eq!(k.run_below(2, 128), (Run::Range { lo: 64, hi: 66 }, 2));
        assert_eq!(k.run_below(4, 192).1, 0);
        assert_eq!(k.run_below(4, 256), (Run::Range { lo: 200, hi: 201 }, 1));
        let gap = [7usize, 8, 10];
        assert_eq!(Keys::List(&gap).run_below(0, 64), (Run::List(&gap), 3));
        assert_eq!((k.first(), k.end()), (Some(3), 201));
        assert_eq!(Keys::Range { lo: 5, hi: 5 }.first(), None);
    }
}
