//! The engine: a loaded model, its KV cache, the expert cache and a thread pool; prefill in
//! batches, decode one token at a time, generation with sampling and stop on EOS.

use crate::cache::{CacheStats, ExpertCache};
use crate::error::{store_err, EngineError, Result};
use crate::layers::Span;
use crate::layers::{HeldUsage, LayerCtx, LayerKv};
use crate::models::Model;
use crate::options::EngineOptions;
use crate::placement::{Lookahead, Placement, PlacementPolicy, PrefetchGate};
use crate::prefix_cache::{KvLayout, MtpLayout};
use crate::sampling::{Sampler, SamplingParams};
use crate::sequence::KvState;
use crate::sequence::{Sequence, SlotGuard};
use crate::speculative::gate::{DraftGate, PassCosts};
use crate::speculative::{ngram, Speculate, SpeculationParams, SpeculationStats};
use crate::trace::RoutingTrace;
use coli_format::ModelSpec;
use coli_store::Store;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only those of the last token fed.
    Last,
    /// One row per token fed.
    All,
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// An EOS id was sampled (it is included in the output tokens).
    Eos,
    /// `max_tokens` tokens were generated.
    MaxTokens,
    /// The token callback asked to stop.
    Callback,
}

/// Timings and counters of one [`Engine::generate`] call.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct GenerationStats {
    /// Prompt tokens prefilled (after KV-cache reuse).
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Seconds from the call to the first sampled token.
    pub ttft_s: f64,
    /// Seconds of prefill.
    pub prefill_s: f64,
    /// Seconds of decode (the forward passes of generated tokens fed back).
    pub decode_s: f64,
    /// Decode forward passes (with speculation one pass can emit several tokens).
    pub decode_steps: usize,
    /// The draft source that ran (`Auto` resolved; `Off` without speculation).
    pub speculation_mode: Speculate,
    /// Drafts proposed and accepted, verify passes, passes the draft gate paused.
    pub speculation: SpeculationStats,
    /// Bytes of expert records read from disk during the call (store counter).
    pub expert_bytes_read: u64,
    /// Expert-cache counters during the call (hits by tier, misses, evictions, demand and
    /// prefetch bytes, prefetch precision/recall, I/O wait).
    pub cache: CacheStats,
}

impl GenerationStats {
    /// Prompt tokens per second of prefill.
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_s)
    }
    /// Tokens generated after the first per second of decode (the first token comes from
    /// the prefill's logits; without speculation this is decode passes per second).
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1), self.decode_s)
    }
    /// Tokens generated after the first per decode forward pass (1 without speculation).
    pub fn tokens_per_forward(&self) -> f64 {
        if self.decode_steps == 0 {
            0.0
        } else {
            self.generated_tokens.saturating_sub(1) as f64 / self.decode_steps as f64
        }
    }
    /// Expert bytes read from disk per generated token (prefill's reads included).
    pub fn expert_bytes_per_generated_token(&self) -> f64 {
        if self.generated_tokens == 0 {
            0.0
        } else {
            self.expert_bytes_read as f64 / self.generated_tokens as f64
        }
    }
    /// Expert bytes read from disk per token processed (prompt + decode steps).
    pub fn expert_bytes_per_token(&self) -> f64 {
        self.per_token(self.expert_bytes_read as f64)
    }
    /// `v` divided by the tokens run through the model (prompt tokens + decode steps).
    pub fn per_token(&self, v: f64) -> f64 {
        let t = self.prompt_tokens + self.decode_steps;
        if t == 0 {
            0.0
        } else {
            v / t as f64
        }
    }
    /// Seconds the forward passes waited for expert reads (demand reads and reads in flight;
    /// demand read time hidden behind the layer's compute is not counted, see
    /// [`crate::CacheStats::io_hidden_ns`]).
    pub fn io_wait_s(&self) -> f64 {
        self.cache.io_wait_s()
    }
    /// Seconds of prefill and decode not spent waiting for expert reads.
    pub fn compute_s(&self) -> f64 {
        (self.prefill_s + self.decode_s - self.io_wait_s()).max(0.0)
    }
    /// Disk throughput achieved: expert bytes read over the prefill + decode time, GiB/s.
    pub fn disk_gib_s(&self) -> f64 {
        let t = self.prefill_s + self.decode_s;
        if t > 0.0 {
            self.expert_bytes_read as f64 / t / (1u64 << 30) as f64
        } else {
            0.0
        }
    }
}

fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// Result of [`Engine::generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated ids (an EOS that stopped generation included).
    pub tokens: Vec<u32>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Timings and counters.
    pub stats: GenerationStats,
}

/// Generation parameters.
#[derive(Clone, Copy, Debug)]
pub struct GenerateParams {
    /// Maximum tokens to generate.
    pub max_tokens: usize,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Stop when an EOS id (config.json + generation_config.json) is sampled.
    pub stop_on_eos: bool,
    /// Speculative decoding ([`crate::speculative`]); the tokens are the same either way.
    pub speculation: SpeculationParams,
}

/// One sequence's part of a forward pass over several sequences ([`Engine::forward_many`]).
pub struct BatchItem<'a> {
    /// The sequence (its KV cache grows by `ids`).
    pub seq: &'a mut Sequence,
    /// Token ids fed after the sequence's cached tokens (at least one).
    pub ids: &'a [u32],
    /// Which logits to return for this sequence (None: none, e.g. a prefill chunk that is not
    /// the prompt's last).
    pub logits: Option<Logits>,
    /// Speculative verification: `ids` are the sampled token and its drafts. Every row is
    /// computed bit for bit as a one-token decode ([`Span::as_decode`]), and the rows' expert
    /// usage counts wait until they survive to the sequence's next pass (roll rejected rows
    /// back with [`Sequence::truncate`]; see [`Engine::commit_usage`]).
    pub verify: bool,
}

/// A model ready to run over a store, with its own sequence's KV cache (used by
/// [`Engine::forward`] and [`Engine::generate`]) and any number of further sequences up to
/// `max_sequences` ([`Engine::new_sequence`], run together by [`Engine::forward_many`]).
pub struct Engine<'s> {
    store: &'s Store,
    model: Model<'s>,
    cache: ExpertCache,
    policy: PlacementPolicy,
    /// The engine's own sequence.
    seq: Sequence,
    /// Sequences made by [`Engine::new_sequence`] and not yet dropped.
    live: Arc<AtomicUsize>,
    max_sequences: usize,
    /// Bytes of KV states a prefix cache may keep in RAM ([`EngineOptions::kv_cache_budget`]).
    kv_cache_budget: u64,
    /// Values per position of each layer's `v` cache rows (0 for MLA, which caches only `k`).
    v_dims: Vec<usize>,
    context: usize,
    prefill_batch: usize,
    /// [`EngineOptions::token_major_prefill`].
    token_major_prefill: bool,
    pool: rayon::ThreadPool,
    /// Warnings of the model load not yet taken.
    warnings: Vec<String>,
    /// Where each token's routing is recorded, if anywhere ([`crate::trace`]).
    trace: Option<RoutingTrace>,
    /// Wall time of forward passes by row count (the draft gate's cost model).
    pass_costs: PassCosts,
}

impl<'s> Engine<'s> {
    /// Reads the config (`config.json`, `generation_config.json`) and every dense tensor the
    /// architecture needs from `store`, and sets up the expert cache as the placement policy
    /// decides ([`PlacementPolicy::new`]).
    ///
    /// # Errors
    /// Invalid options ([`EngineOptions::validate`]), config errors, unsupported architecture,
    /// missing/misshapen tensors, a context of 0, a thread pool that cannot be built, a failed
    /// read of the experts to pin.
    pub fn new(store: &'s Store, opts: &EngineOptions) -> Result<Engine<'s>> {
        opts.validate()?;
        let gen_cfg = match store
            .file("generation_config.json")
            .map_err(store_err("reading generation_config.json"))?
        {
            Some(b) => Some(
                serde_json::from_slice::<serde_json::Value>(&b).map_err(|e| {
                    EngineError::Config {
                        file: "generation_config.json".into(),
                        what: format!("not valid JSON: {e}"),
                    }
                })?,
            ),
            None => None,
        };
        let config = ModelSpec::from_config(store.model_config(), gen_cfg.as_ref())?;
        let context = opts.context.unwrap_or(config.default_context());
        if context == 0 {
            return Err(EngineError::Invalid(
                "context and prefill batch must be at least 1".into(),
            ));
        }
        // Measured before the dense tensors are read: under a memory cgroup their pages would
        // count as usage here and be subtracted again as the dense set.
        let memory_limit = crate::placement::memory_limit_bytes();
        let mut model = Model::load(store, config)?;
        let warnings = std::mem::take(&mut model.warnings);
        let mut builder = rayon::ThreadPoolBuilder::new();
        if let Some(t) = opts.threads {
            builder = builder.num_threads(t);
        }
        let pool = builder.build().map_err(|e| EngineError::ThreadPool {
            threads: opts.threads.unwrap_or(0),
            msg: e.to_string(),
        })?;
        let seq = Sequence::new(layer_kv_dims(&model.layers), None);
        let v_dims = layer_v_dims(&model.layers);
        let kv_per_sequence = kv_bytes_per_sequence(&model, context);
        let kv_cache_budget = opts.kv_cache_budget.unwrap_or(kv_per_sequence);
        let kv_bytes = kv_per_sequence
            .saturating_mul(opts.max_sequences as u64)
            .saturating_add(kv_cache_budget);
        let (num_layers, top_k) = (model.spec.num_layers, model.spec.top_k);
        let (policy, cache) =
            PlacementPolicy::new(store, opts, kv_bytes, memory_limit, num_layers, top_k)?;
        let prefill_batch = match opts.prefill_batch {
            crate::options::PREFILL_BATCH_AUTO => {
                use crate::placement::budget;
                let dense = store.manifest().dense_file.length;
                // The cache never holds more than every expert: a default budget of all the
                // memory left leaves the rest to the prefill where the experts take less.
                let budget = policy
                    .placement()
                    .budget
                    .min(budget::store_held_bytes(store));
                let free = memory_limit.map(|m| {
                    m.saturating_sub(dense)
                        .saturating_sub(budget)
                        .saturating_sub(kv_bytes)
                        .saturating_sub(budget::BUDGET_RESERVE_BYTES)
                });
                budget::prefill_chunk(
                    free,
                    budget::prefill_row_bytes(&model.spec),
                    budget::prefill_fixed_bytes(&model.spec, context),
                    context,
                )
            }
            n => n,
        };
        Ok(Engine {
            store,
            model,
            cache,
            policy,
            seq,
            live: Arc::new(AtomicUsize::new(0)),
            max_sequences: opts.max_sequences,
            kv_cache_budget,
            v_dims,
            context,
            prefill_batch,
            token_major_prefill: opts.token_major_prefill,
            pool,
            warnings,
            trace: None,
            pass_costs: PassCosts::default(),
        })
    }

    /// Records every token's routing and lookahead prediction from now on into `trace`
    /// ([`crate::trace`]); None stops recording. Returns the trace that was set, if any (call
    /// [`RoutingTrace::finish`] on it to flush it).
    pub fn set_routing_trace(&mut self, trace: Option<RoutingTrace>) -> Option<RoutingTrace> {
        std::mem::replace(&mut self.trace, trace)
    }

    /// The lookahead prefetch gate: its estimate of the share of prefetched experts used and
    /// the forward passes it ran without prefetch.
    pub fn prefetch_gate(&self) -> &PrefetchGate {
        self.policy.gate()
    }

    /// Where the expert budget went (budget, pinned set, LRU capacity, prefetch, usage file).
    pub fn placement(&self) -> &Placement {
        self.policy.placement()
    }

    /// Warnings since the last call (tensors of the store the model does not use, an unreadable
    /// or corrupt usage history, a failed save); none of them stops the engine.
    pub fn take_warnings(&mut self) -> Vec<String> {
        let mut w = std::mem::take(&mut self.warnings);
        w.append(&mut self.policy.take_warnings());
        w
    }

    /// Merges the routing counts since the last save into the usage-history file (see
    /// [`PlacementPolicy::save_usage`]). A failure becomes a warning
    /// ([`Engine::take_warnings`]).
    pub fn save_usage(&mut self) {
        self.policy.save_usage(self.store, &self.cache);
    }

    /// The model spec (config and tensors) the engine runs.
    pub fn spec(&self) -> &ModelSpec {
        &self.model.spec
    }

    /// The store.
    pub fn store(&self) -> &'s Store {
        self.store
    }

    /// Replaces the EOS ids generation stops on (by default every `eos_token_id` of
    /// config.json and generation_config.json).
    pub fn set_eos_token_ids(&mut self, ids: Vec<u32>) {
        self.model.spec.eos_token_ids = ids;
    }

    /// The context limit, tokens.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Prompt tokens per prefill forward pass (`--prefill-batch`, or the chunk the memory plan
    /// chose: [`crate::placement::budget::prefill_chunk`]).
    pub fn prefill_batch(&self) -> usize {
        self.prefill_batch
    }

    /// The alignment of cuts between prefill passes ([`crate::prefill::align_for`]).
    pub fn prefill_align(&self) -> usize {
        crate::prefill::align_for(&self.model.spec)
    }

    /// `ids` fed after `pos` cached positions, cut into prefill passes of about
    /// [`Engine::prefill_batch`] tokens at the positions [`crate::prefill::spans`] chooses.
    fn prefill_chunks<'a>(&self, pos: usize, ids: &'a [u32]) -> Vec<&'a [u32]> {
        crate::prefill::spans(pos, ids.len(), self.prefill_batch, self.prefill_align())
            .into_iter()
            .map(|r| &ids[r])
            .collect()
    }

    /// Threads of the engine's pool.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Every expert of the store with the tokens routed to it since this engine started and
    /// where it is now (pinned, cached, being read, on which drive): `coli web`'s heat map.
    pub fn expert_map(&self) -> crate::expert_map::ExpertMap {
        crate::expert_map::ExpertMap::of(self.store, &self.cache)
    }

    /// Expert-cache counters since creation.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Expert-cache budget in bytes (`u64::MAX` when unbounded; pinned + LRU tiers) and bytes
    /// held.
    pub fn cache_usage(&self) -> (u64, u64) {
        (self.cache.capacity(), self.cache.used())
    }

    /// The token ids whose keys/values are in the engine's own sequence's KV cache.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.seq.tokens
    }

    /// Sequences whose KV caches the engine may hold at once ([`EngineOptions::max_sequences`]).
    pub fn max_sequences(&self) -> usize {
        self.max_sequences
    }

    /// Bytes of KV states a prefix cache beside this engine may keep in RAM: what the memory
    /// plan left room for ([`EngineOptions::kv_cache_budget`], default one sequence's KV cache
    /// at the context limit).
    pub fn kv_cache_budget(&self) -> u64 {
        self.kv_cache_budget
    }

    /// Sequences in use: those of [`Engine::new_sequence`] not yet dropped, plus the engine's
    /// own while it holds tokens.
    pub fn sequences_in_use(&self) -> usize {
        self.live.load(Ordering::Acquire) + usize::from(!self.seq.is_empty())
    }

    /// Bytes of KV cache one sequence takes at the context limit
    /// ([`Engine::kv_bytes_per_token`] x [`Engine::context`]; Inkling: its full layers' keys
    /// and values of every position plus the bounded state of its sliding windows and short
    /// convolutions, `coli_format::spec::InklingSpec::kv_values`).
    pub fn kv_bytes_per_sequence(&self) -> u64 {
        kv_bytes_per_sequence(&self.model, self.context)
    }

    fn too_many(&self) -> EngineError {
        EngineError::TooManySequences {
            max: self.max_sequences,
            kv_bytes_per_sequence: self.kv_bytes_per_sequence(),
        }
    }

    /// A new, empty sequence for [`Engine::forward_many`]; it counts against
    /// [`Engine::max_sequences`] until dropped.
    ///
    /// # Errors
    /// [`EngineError::TooManySequences`] when `max_sequences` are in use.
    pub fn new_sequence(&self) -> Result<Sequence> {
        Ok(Sequence::new(
            layer_kv_dims(&self.model.layers),
            Some(self.take_slot()?),
        ))
    }

    /// A new sequence holding a copy of the first `len` positions of `src`'s KV cache and
    /// tokens (all of them when `len >= src.len()`; fewer when those cannot be kept exactly:
    /// the longest exact prefix, [`Sequence::exact_at_most`], e.g. a recurrent layer's
    /// nearest checkpoint): n completions of one prompt share its prefill this way, and a new
    /// conversation can start from another's common prefix.
    ///
    /// # Errors
    /// As [`Engine::new_sequence`].
    pub fn fork_sequence(&self, src: &Sequence, len: usize) -> Result<Sequence> {
        Ok(src.fork(len, Some(self.take_slot()?)))
    }

    /// Makes `state` (a prefix cache entry of this engine, [`crate::prefix_cache`]) a live
    /// sequence again, counted against [`Engine::max_sequences`].
    ///
    /// # Errors
    /// As [`Engine::new_sequence`]; [`EngineError::Invalid`] when `state` does not fit this
    /// model (other layer shapes) or this context.
    pub fn resume_sequence(&self, state: KvState) -> Result<Sequence> {
        self.check_state(&state)?;
        let mut seq = state.seq;
        seq.set_windowed(&self.windowed_layers());
        seq.set_slot(self.take_slot()?);
        Ok(seq)
    }

    /// Per decoder layer: whether its keys and values drop their older rows (Inkling's
    /// sliding-window layers: `SelfAttn::row_bounds`).
    fn windowed_layers(&self) -> Vec<bool> {
        self.model
            .layers
            .iter()
            .map(|l| l.attn.row_bounds().0.is_some())
            .collect()
    }

    /// A copy of the engine's own sequence's KV state (what [`Engine::restore_own`] takes).
    pub fn own_state(&self) -> KvState {
        self.seq.fork(usize::MAX, None).into_state()
    }

    /// Replaces the engine's own sequence with `state` (e.g. a conversation read back from the
    /// prefix cache); [`Engine::generate`] then continues from its tokens.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] as [`Engine::resume_sequence`]; the own sequence is unchanged.
    pub fn restore_own(&mut self, state: KvState) -> Result<()> {
        self.check_state(&state)?;
        self.seq = state.seq;
        self.seq.set_windowed(&self.windowed_layers());
        Ok(())
    }

    fn check_state(&self, state: &KvState) -> Result<()> {
        let s = &state.seq;
        let dims = layer_kv_dims(&self.model.layers);
        let fits = s.kv_dims() == dims.as_slice()
            && s.kv
                .iter()
                .zip(dims.iter().zip(&self.v_dims))
                .zip(&self.model.layers)
                .all(|((l, (&kd, &vd)), layer)| state_fits(l, s.len(), (kd, vd), &layer.attn))
            && match (&s.mtp, &self.model.mtp) {
                (None, _) => true,
                (Some(m), Some(layer)) => state_fits(
                    &m.kv,
                    m.fed(),
                    (layer.kv_dim(), layer.decoder.attn.v_dim()),
                    &layer.decoder.attn,
                ),
                (Some(_), None) => false,
            };
        if !fits {
            return Err(EngineError::Invalid(
                "a saved KV state does not fit this model's layer shapes".into(),
            ));
        }
        if s.len() > self.context {
            return Err(EngineError::ContextOverflow {
                needed: s.len(),
                context: self.context,
            });
        }
        Ok(())
    }

    /// This engine's KV cache identity and shapes: what a saved state must match to be reused
    /// ([`crate::prefix_cache`]).
    pub fn kv_layout(&self) -> KvLayout {
        use crate::layers::SelfAttn;
        let mla = self
            .model
            .layers
            .iter()
            .find_map(|l| match &l.attn {
                SelfAttn::Mla(a) => Some(if a.absorb_decode {
                    "absorbed"
                } else {
                    "expanded"
                }),
                SelfAttn::Gqa(_)
                | SelfAttn::Inkling(_)
                | SelfAttn::Inkling2(_)
                | SelfAttn::GatedDelta(_)
                | SelfAttn::DeepseekV4(_) => None,
            })
            .unwrap_or("none");
        let recurrent = self
            .model
            .layers
            .iter()
            .find_map(|l| match &l.attn {
                SelfAttn::GatedDelta(a) => Some(a.rule_id()),
                _ => None,
            })
            .unwrap_or(coli_kernels::gated_delta::RULE_ID);
        let mtp = self.model.mtp.as_ref().map(|m| MtpLayout {
            kv_dim: m.kv_dim(),
            v_dim: m.decoder.attn.v_dim(),
            conv_dim: m.decoder.attn.conv_dim(),
            hidden_size: self.model.spec.hidden_size,
        });
        // The store id names the conversion; the checksums in MANIFEST and INDEX name the bytes.
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for f in [
            coli_format::disk::names::MANIFEST,
            coli_format::disk::names::INDEX,
        ] {
            h.update(&std::fs::read(self.store.dir().join(f)).unwrap_or_default());
        }
        let mut layout = KvLayout::new(
            self.store.manifest().store_id.0,
            h.digest(),
            coli_kernels::numerics_id(coli_kernels::detected_isa()),
            mla,
            recurrent,
            layer_kv_dims(&self.model.layers),
            self.v_dims.clone(),
            self.model
                .layers
                .iter()
                .map(|l| l.attn.conv_dim())
                .collect(),
            self.model
                .layers
                .iter()
                .map(|l| l.attn.recurrent_len())
                .collect(),
            mtp,
        );
        layout.conv_tails = self
            .model
            .layers
            .iter()
            .map(|l| {
                if l.attn.recurrent_len() > 0 {
                    l.attn.row_bounds().1 - 1
                } else {
                    0
                }
            })
            .collect();
        layout.blocks = self
            .model
            .layers
            .iter()
            .map(|l| match &l.attn {
                SelfAttn::DeepseekV4(a) if a.rate > 0 => (a.block_dim(), a.rate),
                _ => (0, 0),
            })
            .collect();
        layout
    }

    fn take_slot(&self) -> Result<SlotGuard> {
        let own = usize::from(!self.seq.is_empty());
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n + own < self.max_sequences).then_some(n + 1)
            })
            .map_err(|_| self.too_many())?;
        Ok(SlotGuard(self.live.clone()))
    }

    /// Bytes of KV cache per token over all decoder layers (f32 values, 4 bytes each): keys
    /// and values (`2 * num_kv_heads * head_dim`) for grouped-query attention; for MLA the
    /// latent `kv_lora_rank + qk_rope_head_dim` (nothing expanded), plus `index_head_dim`
    /// indexer-key values on GLM-5 layers that run a DSA indexer; Inkling: the keys and values
    /// of its full layers only (its sliding windows and convolution inputs are bounded:
    /// [`Engine::kv_bytes_per_sequence`]). The MTP layer's own cache (used only by
    /// [`Engine::mtp_logits`]) is not counted.
    pub fn kv_bytes_per_token(&self) -> u64 {
        kv_bytes_per_token(&self.model.layers)
    }

    /// MLA models: whether one-token forwards (decode) use the absorbed form (`true`, the
    /// default) or the expanded form (`false`; prefill always uses the expanded form). Both
    /// compute the same attention up to f32 summation order. No effect on other families.
    pub fn set_absorbed_decode(&mut self, on: bool) {
        use crate::layers::SelfAttn;
        let mtp = self.model.mtp.iter_mut().map(|m| &mut m.decoder);
        for l in self.model.layers.iter_mut().chain(mtp) {
            if let SelfAttn::Mla(a) = &mut l.attn {
                a.absorb_decode = on;
            }
        }
    }

    /// Whether the model has a multi-token-prediction layer loaded (DeepSeek-V3, GLM-5,
    /// DeepSeek-V3.2 and GLM-4.5 stores that hold layer `num_hidden_layers`).
    pub fn has_mtp(&self) -> bool {
        self.model.mtp.is_some()
    }

    /// Why the model has no MTP layer loaded, for errors that ask for one; `None` when it has
    /// one. Names the GGUF a store was converted from, or `coli-convert --mtp none` when the
    /// store was converted with it.
    pub fn mtp_absence(&self) -> Option<String> {
        if self.has_mtp() {
            return None;
        }
        let store = self.store();
        let params = &store.manifest().parameters;
        Some(
            if params.get("source").map(String::as_str) == Some("gguf") {
                format!(
                    "the GGUF the store {} was converted from holds no MTP layer coli converts (llama.cpp's converter leaves it out for some architectures, DeepSeek-V3's and V4's among them, or the file was written without it): draft with --speculate ngram",
                    store.dir().display()
                )
            } else if params.get("mtp").map(String::as_str) == Some("none") {
                format!(
                    "the store {} was converted with --mtp none (without its MTP layer): convert it again without that option to draft with the MTP layer",
                    store.dir().display()
                )
            } else if self.model.spec.mtp_layer().is_none()
                && self.model.spec.unconverted_mtp_layers > 0
            {
                format!(
                    "this {} model's MTP layer is not converted (transformers does not run it, so coli has no oracle for it): draft with --speculate ngram",
                    self.model.spec.model_type
                )
            } else if self.model.spec.mtp_layer().is_none() {
                format!(
                    "this {} model has no MTP layer (num_nextn_predict_layers is 0 or absent)",
                    self.model.spec.model_type
                )
            } else {
                "the store holds no MTP layer (the checkpoint it was converted from had none)"
                    .into()
            },
        )
    }

    /// Turns MTP drafting on for `seq` ([`Engine::mtp_draft`]): from now on every pass over it
    /// keeps its rows' final hidden states for the MTP layer. No effect when it is on already.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] without an MTP layer, or for a sequence that already holds
    /// tokens without MTP state (their hidden states are gone: start from an empty sequence).
    pub fn enable_mtp(&self, seq: &mut Sequence) -> Result<()> {
        let Some(mtp) = self.model.mtp.as_ref() else {
            return Err(EngineError::Invalid(self.mtp_absence().unwrap_or_default()));
        };
        if seq.mtp.is_some() {
            return Ok(());
        }
        if !seq.is_empty() {
            return Err(EngineError::Invalid(
                "MTP drafting must start on an empty sequence".into(),
            ));
        }
        seq.mtp = Some(crate::sequence::MtpState {
            kv: LayerKv::default(),
            kv_dim: mtp.kv_dim(),
            hidden: Vec::new(),
            hidden_size: self.model.spec.hidden_size,
        });
        Ok(())
    }

    /// Up to `k` draft tokens for `seq` from the MTP layer, `next` being the token sampled after
    /// its cached ones (not yet fed). The MTP layer first runs over the positions it has not
    /// seen (main-model hidden state of position i with the token after it; the last one pairs
    /// with `next`), whose last row proposes draft 1; draft j > 1 comes from one more MTP step
    /// on draft j - 1, chained as vLLM's `EagleProposer` chains `deepseek_mtp`
    /// (vllm/v1/spec_decode/eagle.py, `propose`): step 2 takes the main model's hidden state of
    /// the last position, later steps the MTP layer's own output of the step before. Drafts are
    /// the argmax of each step's logits. The chained positions are rolled back from the MTP
    /// cache afterwards; their expert usage is not counted.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] when MTP drafting is not on for `seq` ([`Engine::enable_mtp`])
    /// or it is empty; [`EngineError::TokenOutOfRange`] for `next`; expert fetch failures (the
    /// MTP cache is then rolled back to before the call).
    pub fn mtp_draft(&mut self, seq: &mut Sequence, next: u32, k: usize) -> Result<Vec<u32>> {
        let (h, vocab) = (self.model.spec.hidden_size, self.model.spec.vocab_size);
        if next as usize >= vocab {
            return Err(EngineError::TokenOutOfRange { id: next, vocab });
        }
        let len = seq.len();
        let tokens = &seq.tokens;
        let Some(state) = seq.mtp.as_mut() else {
            return Err(EngineError::Invalid(
                "MTP drafting is not on for this sequence".into(),
            ));
        };
        let fed = state.fed();
        if len == 0 || k == 0 || len <= fed {
            return Ok(Vec::new());
        }
        // Chained drafts roll back exactly only within the rows an Inkling layer keeps.
        let k = k.min(crate::layers::inkling::SLACK);
        // A failure rolls back to `fed`: when the rows run now are more than that keeps exact,
        // a copy of the (bounded) state is kept for it.
        let bounded = state.kv.conv_dim > 0 || state.kv.windowed;
        let saved =
            (bounded && len - fed + k > crate::layers::inkling::SLACK).then(|| state.kv.clone());
        let Engine {
            store,
            model,
            cache,
            pool,
            ..
        } = self;
        let mtp = model.mtp.as_ref().expect("enable_mtp checked the layer");
        let mut next_ids: Vec<u32> = tokens[fed + 1..len].to_vec();
        next_ids.push(next);
        let r = pool.install(|| -> Result<Vec<u32>> {
            let mut ctx = LayerCtx {
                rope: &model.rope,
                store,
                cache,
                trace: None,
                held_usage: None,
                ids: &next_ids,
            };
            let (logits, _) =
                mtp.draft_step(&state.hidden, &next_ids, fed, &mut state.kv, &mut ctx)?;
            let mut drafts = vec![crate::sampling::argmax(&logits)];
            let mut prev = state.hidden[(len - fed - 1) * h..(len - fed) * h].to_vec();
            // The chained rows' routing is held and dropped: they are drafts, not tokens.
            let mut held = HeldUsage {
                hold: vec![true],
                experts: vec![Vec::new()],
            };
            let mut ctx = LayerCtx {
                held_usage: Some(&mut held),
                ..ctx
            };
            while drafts.len() < k {
                let pos = len + drafts.len() - 1;
                let last = *drafts.last().expect("one draft");
                let (logits, out) = mtp.draft_step(&prev, &[last], pos, &mut state.kv, &mut ctx)?;
                if let Some(h) = ctx.held_usage.as_deref_mut() {
                    h.experts[0].clear();
                }
                drafts.push(crate::sampling::argmax(&logits));
                prev = out;
            }
            Ok(drafts)
        });
        // Keep the real positions (0..len); the chained ones go.
        match &r {
            Ok(_) => {
                state.kv.truncate(len, state.kv_dim);
                state.hidden.clear();
            }
            Err(_) => match saved {
                Some(s) => state.kv = s,
                None => state.kv.truncate(fed, state.kv_dim),
            },
        }
        r
    }

    /// Logits of the MTP layer ([`crate::models::mtp`]) at positions `0..n` from an empty MTP
    /// KV cache: `hidden` is `[n, H]` f32 (the main model's hidden states after `model.norm` at
    /// positions `0..n`), `next_ids[i]` the token after position i (`n = next_ids.len()`).
    /// Returns n `[vocab]` rows; row i predicts the token at position i + 2. Experts are read
    /// through the engine's expert cache; the main KV cache is untouched.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] without an MTP layer, for no ids or a `hidden` of the wrong
    /// length; [`EngineError::TokenOutOfRange`]; [`EngineError::ContextOverflow`] when n
    /// exceeds the context; expert fetch failures.
    pub fn mtp_logits(&mut self, hidden: &[f32], next_ids: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.check_mtp_input(hidden, next_ids, 1)?;
        let Engine {
            store,
            model,
            cache,
            pool,
            ..
        } = self;
        let mtp = model.mtp.as_ref().expect("checked above");
        pool.install(|| {
            let mut kv = LayerKv::default();
            let mut ctx = LayerCtx {
                rope: &model.rope,
                store,
                cache,
                trace: None,
                held_usage: None,
                ids: next_ids,
            };
            mtp.forward(hidden, next_ids, 0, &mut kv, &mut ctx)
        })
    }

    /// Logits of every MTP layer of a chain (Inkling's `model.mtp.layers.{k}`, as
    /// transformers' `MtpModel.forward_layer` runs them; a single-layer MTP model gives one
    /// depth) over positions `0..n`, each layer from an empty cache of its own. Depth 0 takes
    /// `hidden` (`[n, H]` f32, the main model's hidden states after its final norm at positions
    /// `0..n`) and `next_ids[i]` for position i; depth d takes depth d - 1's output rows
    /// ([`crate::models::mtp::MtpLayer::chained`]) and `next_ids[i + d]`, so `next_ids` holds
    /// `n + depths - 1` ids (`next_ids[i]` is the token at position i + 1). Returns, per depth
    /// d, n `[vocab]` rows; row i predicts the token at position i + d + 2.
    ///
    /// # Errors
    /// As [`Engine::mtp_logits`]; [`EngineError::Invalid`] when `next_ids` is not
    /// `n + depths - 1` long.
    pub fn mtp_chain_logits(
        &mut self,
        hidden: &[f32],
        next_ids: &[u32],
    ) -> Result<Vec<Vec<Vec<f32>>>> {
        let depths = 1 + self.model.mtp_chain.len();
        let n = self.check_mtp_input(hidden, next_ids, depths)?;
        let Engine {
            store,
            model,
            cache,
            pool,
            ..
        } = self;
        pool.install(|| {
            let mut ctx = LayerCtx {
                rope: &model.rope,
                store,
                cache,
                trace: None,
                held_usage: None,
                ids: &[],
            };
            let mut prev = hidden.to_vec();
            let mut out = Vec::with_capacity(depths);
            let layers = model.mtp.iter().chain(&model.mtp_chain);
            for (d, layer) in layers.enumerate() {
                let mut kv = LayerKv::default();
                let (logits, chained) =
                    layer.forward_chained(&prev, &next_ids[d..d + n], 0, &mut kv, &mut ctx)?;
                out.push(logits);
                prev = chained;
            }
            Ok(out)
        })
    }

    /// Whether [`Engine::truncate`] to `len` keeps the own KV cache exact
    /// ([`Sequence::can_truncate`]).
    pub fn can_truncate(&self, len: usize) -> bool {
        self.seq.can_truncate(len)
    }

    /// Checks the input of [`Engine::mtp_logits`] / [`Engine::mtp_chain_logits`] for a chain of
    /// `depths` MTP layers: an MTP layer, `hidden` a whole number n > 0 of `[H]` rows, n +
    /// depths - 1 ids in the vocabulary, n within the context. Returns n.
    fn check_mtp_input(&self, hidden: &[f32], next_ids: &[u32], depths: usize) -> Result<usize> {
        let (h, vocab) = (self.model.spec.hidden_size, self.model.spec.vocab_size);
        if let Some(why) = self.mtp_absence() {
            return Err(EngineError::Invalid(why));
        }
        let n = hidden.len() / h.max(1);
        if n == 0 || hidden.len() != n * h || next_ids.len() != n + depths - 1 {
            return Err(EngineError::Invalid(format!(
                "MTP input: {} hidden values ({n} positions of {h}) need {} ids for {depths} MTP layer(s), got {}",
                hidden.len(),
                n + depths - 1,
                next_ids.len()
            )));
        }
        if let Some(&id) = next_ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { id, vocab });
        }
        if n > self.context {
            return Err(EngineError::ContextOverflow {
                needed: n,
                context: self.context,
            });
        }
        Ok(n)
    }

    /// Empties the KV cache (the expert cache is kept).
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Keeps only the first `len` positions of the engine's own KV cache. A model whose layers
    /// drop their older rows (Inkling) goes back only as far as [`Engine::can_truncate`] says;
    /// further back the cache is emptied.
    pub fn truncate(&mut self, len: usize) {
        self.seq.truncate(len);
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        self.check_ids_after(self.seq.len(), ids)
    }

    /// Ids below the vocabulary size and room for them after `cached` positions.
    fn check_ids_after(&self, cached: usize, ids: &[u32]) -> Result<()> {
        let vocab = self.model.spec.vocab_size;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { id, vocab });
        }
        let needed = cached + ids.len();
        if needed > self.context {
            return Err(EngineError::ContextOverflow {
                needed,
                context: self.context,
            });
        }
        Ok(())
    }

    /// Feeds `ids` after the cached tokens (positions continue from the cache), in batches of up
    /// to `prefill_batch` tokens (one token: the matvec path), and returns f32 logits
    /// (`[vocab]` rows) for the last token or for every token. Several batches run layer by
    /// layer (docs/ENGINE.md, "Long prompts"): the same bits as feeding them one call at a
    /// time, with each layer's experts read and each MLA latent expanded once per call; with a
    /// routing trace they run one batch at a time.
    ///
    /// # Errors
    /// [`EngineError::TokenOutOfRange`], [`EngineError::ContextOverflow`] (nothing is run then),
    /// expert fetch failures (the KV cache is rolled back to its state before the call).
    pub fn forward(&mut self, ids: &[u32], which: Logits) -> Result<Vec<Vec<f32>>> {
        self.check_ids(ids)?;
        if self.seq.is_empty() && !ids.is_empty() && self.sequences_in_use() >= self.max_sequences {
            return Err(self.too_many());
        }
        let start = self.seq.len();
        // A failure rolls back to `start`: a long call keeps the state layers drop.
        if self.seq.needs_pin(ids.len()) {
            self.seq.pin();
        }
        let r = self.forward_from(ids, which, start);
        self.seq.unpin();
        r
    }

    /// [`Engine::forward`] after its checks, with the sequence pinned at `start`.
    fn forward_from(&mut self, ids: &[u32], which: Logits, start: usize) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::new();
        let chunks = self.prefill_chunks(start, ids);
        if chunks.len() > 1 && self.trace.is_none() && !self.token_major_prefill {
            let r = self.forward_layer_major(&chunks, which);
            if r.is_err() {
                self.truncate(start);
            }
            return r;
        }
        let last_chunk = chunks.len().saturating_sub(1);
        for (ci, chunk) in chunks.into_iter().enumerate() {
            let want = match which {
                Logits::All => Some(false),
                Logits::Last if ci == last_chunk => Some(true),
                Logits::Last => None,
            };
            match self.forward_batch(chunk, want, false) {
                Ok(mut l) => out.append(&mut l),
                Err(e) => {
                    self.truncate(start);
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Feeds `ids` after `seq`'s cached tokens as [`Engine::forward`] feeds the engine's own
    /// sequence: in chunks of `prefill_batch`, layer by layer when there are several (each
    /// layer's experts read and each MLA latent expanded once), returning the logits `which`
    /// asks for. The same bits as feeding the chunks one [`Engine::forward_many`] pass at a
    /// time. `coli serve` uses it for a prompt whose prefill is the only work. `stop` is
    /// asked between layer groups (between chunks when token-major): when it says true the
    /// prefill ends with [`EngineError::Stopped`].
    ///
    /// # Errors
    /// [`EngineError::Stopped`], no ids ([`EngineError::Invalid`]), [`EngineError::TokenOutOfRange`],
    /// [`EngineError::ContextOverflow`] (nothing is run then), expert fetch failures (`seq` is
    /// rolled back to its length before the call).
    pub fn prefill_sequence(
        &mut self,
        seq: &mut Sequence,
        ids: &[u32],
        which: Logits,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<Vec<f32>>> {
        if ids.is_empty() {
            return Err(EngineError::Invalid("a prefill needs token ids".into()));
        }
        self.check_ids_after(seq.len(), ids)?;
        let start = seq.len();
        if seq.needs_pin(ids.len()) {
            seq.pin();
        }
        let chunks = self.prefill_chunks(start, ids);
        let r = if chunks.len() > 1 && self.trace.is_none() && !self.token_major_prefill {
            self.commit_usage(seq);
            self.layer_major_inner(seq, &chunks, which, stop)
        } else {
            let last = chunks.len() - 1;
            let mut out = Vec::new();
            let mut r = Ok(());
            for (ci, chunk) in chunks.into_iter().enumerate() {
                let want = match which {
                    Logits::All => Some(false),
                    Logits::Last if ci == last => Some(true),
                    Logits::Last => None,
                };
                if ci > 0 && stop() {
                    r = Err(EngineError::Stopped);
                    break;
                }
                match self.pass(&mut [&mut *seq], &[chunk], &[want], &[false]) {
                    Ok(mut l) => out.append(&mut l.pop().expect("one sequence")),
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                }
            }
            r.map(|()| out)
        };
        if r.is_err() {
            seq.truncate(start);
        }
        seq.unpin();
        r
    }

    /// Layer groups of a layer-major prefill, in order: a group starts at every layer that does
    /// not read what the layer before it published ([`crate::layers::DecoderLayer::reads_previous_layer`]).
    /// The groups of layers a layer-major prefill ([`Engine::prefill_sequence`]) runs one after
    /// the other: its `stop` is asked before each group after the first, so a caller can count
    /// those calls for the prefill's progress (`groups done / this`).
    pub fn prefill_layer_groups(&self) -> usize {
        self.layer_groups().len()
    }

    fn layer_groups(&self) -> Vec<std::ops::Range<usize>> {
        let layers = &self.model.layers;
        let mut groups: Vec<std::ops::Range<usize>> = Vec::new();
        for (li, layer) in layers.iter().enumerate() {
            match groups.last_mut() {
                Some(g) if layer.reads_previous_layer() => g.end = li + 1,
                _ => groups.push(li..li + 1),
            }
        }
        groups
    }

    /// A prompt of several chunks through the engine's own sequence, layer by layer (see
    /// [`Engine::forward`]).
    fn forward_layer_major(&mut self, chunks: &[&[u32]], which: Logits) -> Result<Vec<Vec<f32>>> {
        let placeholder = Sequence::new(Vec::new(), None);
        let mut seq = std::mem::replace(&mut self.seq, placeholder);
        self.commit_usage(&mut seq);
        let r = self.layer_major_inner(&mut seq, chunks, which, &|| false);
        self.seq = seq;
        r
    }

    /// The layer-major prefill: the residual stream of the whole prompt is kept (`[P, H]`
    /// f32); for each group of layers ([`Engine::layer_groups`], usually one layer) every
    /// chunk runs through the group's layers in order, so a chunk's attention finds the
    /// earlier chunks' keys of that layer already cached. Each row is computed exactly as a
    /// token-major pass of the same chunks computes it, so logits and KV cache are the same
    /// bits. What changes is the order: a layer's experts serve all chunks of the prompt one
    /// after the other (each is read once per prompt when the layer's experts fit in the
    /// expert cache, instead of once per chunk), and an MLA layer expands each cached latent
    /// once ([`crate::layers::LayerKv::expanded`]) instead of once per chunk; a group of
    /// several MLA layers (GLM-5.2's shared indexer layers) expands per chunk as token-major
    /// does, so that one expansion at most is held, as the memory plan counts
    /// ([`crate::placement::budget::prefill_fixed_bytes`]). The router lookahead predicts the
    /// next layer from the group's last chunk (so its precision counters score that
    /// prediction against the next layer's first chunk). `stop` is asked before each group.
    fn layer_major_inner(
        &mut self,
        seq: &mut Sequence,
        chunks: &[&[u32]],
        which: Logits,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<Vec<f32>>> {
        let pos_start = seq.len();
        let n: usize = chunks.iter().map(|c| c.len()).sum();
        let h = self.model.residual_width();
        seq.reserve(self.context, &self.v_dims);
        let lookahead = self.policy.next_pass(&self.cache.stats());
        let groups = self.layer_groups();
        let mut bounds: Vec<(usize, usize)> = Vec::with_capacity(chunks.len());
        let mut r0 = 0;
        for c in chunks {
            bounds.push((r0, c.len()));
            r0 += c.len();
        }
        let Engine {
            store,
            model,
            cache,
            pool,
            ..
        } = self;
        let logits = pool.install(|| -> Result<Vec<Vec<f32>>> {
            let mut x = embed_rows(model, chunks.iter().flat_map(|c| c.iter()), n);
            let handle = cache.clone();
            let mut ctx = LayerCtx {
                rope: &model.rope,
                store,
                cache,
                trace: None,
                held_usage: None,
                ids: &[],
            };
            let layers = &model.layers;
            let mut run = |pf: Option<Option<&crate::prefetch::Prefetcher<'_, '_>>>| -> Result<()> {
                for g in &groups {
                    if g.start > 0 && stop() {
                        return Err(EngineError::Stopped);
                    }
                    let mla: Vec<usize> = g
                        .clone()
                        .filter(|&li| layers[li].mla_expansion_width().is_some())
                        .collect();
                    if let [li] = mla[..] {
                        let width = layers[li].mla_expansion_width().unwrap_or(0);
                        seq.kv[li].expanded = Some(Vec::with_capacity((pos_start + n) * width));
                    }
                    for (ci, &(r0, cn)) in bounds.iter().enumerate() {
                        let last = ci + 1 == bounds.len();
                        let pos0 = pos_start + r0;
                        let span = [Span::new(pos0, cn)];
                        let xs = &mut x[r0 * h..(r0 + cn) * h];
                        if let (Some(pf), 0, 0) = (pf, g.start, ci) {
                            crate::prefetch::predict_and_request(
                                &layers[0], xs, cn, pos0, &handle, None, pf,
                            );
                        }
                        ctx.ids = chunks[ci];
                        for li in g.clone() {
                            let handle = &handle;
                            let mut kvs = [&mut seq.kv[li]];
                            layers[li].forward_spans(xs, &span, &mut kvs, &mut ctx, |hs| {
                                // The next layer runs next for this chunk inside the group,
                                // or after the group's last chunk.
                                if li + 1 < g.end || last {
                                    if let (Some(pf), Some(next)) = (pf, layers.get(li + 1)) {
                                        crate::prefetch::predict_and_request(
                                            next, hs, cn, pos0, handle, None, pf,
                                        );
                                    }
                                }
                            })?;
                        }
                    }
                    for li in g.clone() {
                        seq.kv[li].expanded = None;
                    }
                }
                Ok(())
            };
            with_lookahead(lookahead, store, &handle, &mut run)?;
            if let Some(m) = seq.mtp.as_mut() {
                let hidden = model.hidden_of_residual(&x, n);
                let start = m.hidden.len();
                m.hidden.resize(start + hidden.len(), 0.0);
                model.final_norm.forward(&hidden, &mut m.hidden[start..]);
            }
            let rows: Vec<usize> = match which {
                Logits::Last => vec![n - 1],
                Logits::All => (0..n).collect(),
            };
            let vocab = model.spec.vocab_size;
            let l = logits_of_rows(model, &x, &rows);
            Ok(l.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
        })?;
        for c in chunks {
            seq.tokens.extend_from_slice(c);
        }
        self.policy.tokens_ran(n as u64, self.store, &self.cache);
        Ok(logits)
    }

    /// One batch of the engine's own sequence: `want` None = no logits, Some(true) = last row
    /// only, Some(false) = all rows; `verify` as [`BatchItem::verify`].
    fn forward_batch(
        &mut self,
        ids: &[u32],
        want: Option<bool>,
        verify: bool,
    ) -> Result<Vec<Vec<f32>>> {
        let placeholder = Sequence::new(Vec::new(), None);
        let mut seq = std::mem::replace(&mut self.seq, placeholder);
        let r = self.pass(&mut [&mut seq], &[ids], &[want], &[verify]);
        self.seq = seq;
        Ok(r?.pop().expect("one sequence"))
    }

    /// One forward pass over several sequences: for each sequence, `ids` fed after its cached
    /// tokens, in one pass (no prefill chunking: the caller sizes each item, e.g. one token of
    /// decode or one `--prefill-batch` chunk of a prompt). Per decoder layer the dense
    /// projections run once over all rows and the union of the experts the rows route to is
    /// fetched once ([`crate::layers::DecoderLayer::forward_spans`]). Returns, per item, the
    /// logits rows it asked for (`[vocab]` f32 each; none for `logits: None`).
    ///
    /// A sequence's logits and KV cache are bit-identical whatever else the pass holds: the
    /// same as running it alone with the same chunks.
    ///
    /// # Errors
    /// An item with no ids ([`EngineError::Invalid`]), [`EngineError::TokenOutOfRange`],
    /// [`EngineError::ContextOverflow`] (nothing is run then), expert fetch failures (every
    /// sequence is rolled back to its state before the call).
    pub fn forward_many(&mut self, items: &mut [BatchItem<'_>]) -> Result<Vec<Vec<Vec<f32>>>> {
        for (i, it) in items.iter().enumerate() {
            if it.ids.is_empty() {
                return Err(EngineError::Invalid(format!(
                    "batch item {i} has no token ids"
                )));
            }
            self.check_ids_after(it.seq.len(), it.ids)?;
        }
        let ids: Vec<&[u32]> = items.iter().map(|it| it.ids).collect();
        let want: Vec<Option<bool>> = items
            .iter()
            .map(|it| it.logits.map(|l| l == Logits::Last))
            .collect();
        let verify: Vec<bool> = items.iter().map(|it| it.verify).collect();
        let mut seqs: Vec<&mut Sequence> = items.iter_mut().map(|it| &mut *it.seq).collect();
        self.pass(&mut seqs, &ids, &want, &verify)
    }

    /// Counts the held expert usage of `seq`'s verified positions that are still in it
    /// ([`BatchItem::verify`]); a sequence's next pass does this itself, so call it only for a
    /// sequence that will not run again (e.g. before dropping or pooling it).
    pub fn commit_usage(&mut self, seq: &mut Sequence) {
        let held = std::mem::take(&mut seq.held_usage);
        let len = seq.len();
        let mut kept = 0u64;
        let mut counts: std::collections::BTreeMap<coli_format::ExpertKey, u64> =
            std::collections::BTreeMap::new();
        for (pos, experts) in held {
            if pos < len {
                kept += 1;
                for k in experts {
                    *counts.entry(k).or_insert(0) += 1;
                }
            }
        }
        self.cache.record_usage(counts);
        if kept > 0 {
            self.policy.tokens_ran(kept, self.store, &self.cache);
        }
    }

    /// The measured wall time of forward passes by row count (for the draft gate).
    pub fn pass_costs(&self) -> &PassCosts {
        &self.pass_costs
    }

    /// The forward pass of [`Engine::forward_many`] (ids already checked). On error every
    /// sequence is truncated back to its length before the pass.
    fn pass(
        &mut self,
        seqs: &mut [&mut Sequence],
        ids: &[&[u32]],
        want: &[Option<bool>],
        verify: &[bool],
    ) -> Result<Vec<Vec<Vec<f32>>>> {
        for s in seqs.iter_mut() {
            self.commit_usage(s);
        }
        let starts: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        // A failure rolls back to `starts`: a sequence given more rows than a rollback keeps
        // exact keeps a copy of the state its layers drop (the call's own pin comes first).
        let pinned: Vec<bool> = seqs
            .iter_mut()
            .zip(ids)
            .map(|(s, i)| {
                let pin = s.needs_pin(i.len()) && !s.is_pinned();
                if pin {
                    s.pin();
                }
                pin
            })
            .collect();
        let t0 = Instant::now();
        let r = self.pass_inner(seqs, ids, want, verify);
        let rows: usize = ids.iter().map(|i| i.len()).sum();
        self.pass_costs.record(rows, t0.elapsed().as_secs_f64());
        if r.is_err() {
            for (s, &len) in seqs.iter_mut().zip(&starts) {
                s.truncate(len);
            }
        }
        for (s, pin) in seqs.iter_mut().zip(pinned) {
            if pin {
                s.unpin();
            }
        }
        r
    }

    fn pass_inner(
        &mut self,
        seqs: &mut [&mut Sequence],
        ids: &[&[u32]],
        want: &[Option<bool>],
        verify: &[bool],
    ) -> Result<Vec<Vec<Vec<f32>>>> {
        let spans: Vec<Span> = seqs
            .iter()
            .zip(ids)
            .zip(verify)
            .map(|((s, ids), &v)| Span {
                pos0: s.len(),
                n: ids.len(),
                as_decode: v,
            })
            .collect();
        let n = Span::rows(&spans);
        let mut held = verify.iter().any(|&v| v).then(|| HeldUsage {
            hold: spans
                .iter()
                .flat_map(|s| std::iter::repeat_n(s.as_decode, s.n))
                .collect(),
            experts: vec![Vec::new(); n],
        });
        let h = self.model.residual_width();
        for s in seqs.iter_mut() {
            s.reserve(self.context, &self.v_dims);
        }
        let lookahead = self.policy.next_pass(&self.cache.stats());
        let Engine {
            store,
            model,
            cache,
            pool,
            trace,
            ..
        } = self;
        // The trace records positions of one sequence: passes over several are not traced.
        let trace = match spans.len() {
            1 => trace.as_ref(),
            _ => None,
        };
        let pos0 = spans.first().map_or(0, |s| s.pos0);
        if let Some(t) = trace {
            t.begin_pass();
        }
        let flat_ids: Vec<u32> = ids.iter().flat_map(|i| i.iter().copied()).collect();
        let logits = pool.install(|| -> Result<Vec<Vec<Vec<f32>>>> {
            let mut x = embed_rows(model, ids.iter().flat_map(|ids| ids.iter()), n);
            let handle = cache.clone();
            let mut ctx = LayerCtx {
                rope: &model.rope,
                store,
                cache,
                trace,
                held_usage: held.as_mut(),
                ids: &flat_ids,
            };
            let layers = &model.layers;
            let mut run = |pf: Option<Option<&crate::prefetch::Prefetcher<'_, '_>>>| -> Result<()> {
                for (li, layer) in layers.iter().enumerate() {
                    let mut kvs: Vec<&mut LayerKv> =
                        seqs.iter_mut().map(|s| &mut s.kv[li]).collect();
                    // Lookahead (see prefetch.rs): layer 0 from the embeddings, then layer
                    // li + 1 from the residual stream after layer li's attention.
                    if let (Some(pf), 0) = (pf, li) {
                        crate::prefetch::predict_and_request(
                            layer, &x, n, pos0, &handle, trace, pf,
                        );
                    }
                    let handle = &handle;
                    layer.forward_spans(&mut x, &spans, &mut kvs, &mut ctx, |h| {
                        if let (Some(pf), Some(next)) = (pf, layers.get(li + 1)) {
                            crate::prefetch::predict_and_request(
                                next, h, n, pos0, handle, trace, pf,
                            );
                        }
                    })?;
                }
                Ok(())
            };
            with_lookahead(lookahead, store, &handle, &mut run)?;
            // Sequences that draft with the MTP layer keep every row's final hidden state.
            let mut r0 = 0;
            for (s, span) in seqs.iter_mut().zip(&spans) {
                if let Some(m) = s.mtp.as_mut() {
                    let rows = model.hidden_of_residual(&x[r0 * h..(r0 + span.n) * h], span.n);
                    let start = m.hidden.len();
                    m.hidden.resize(start + rows.len(), 0.0);
                    model.final_norm.forward(&rows, &mut m.hidden[start..]);
                }
                r0 += span.n;
            }
            // The rows whose logits are wanted, over all items, then one lm_head product.
            let mut rows: Vec<usize> = Vec::new();
            let mut counts: Vec<usize> = Vec::with_capacity(spans.len());
            let mut r0 = 0;
            for (s, w) in spans.iter().zip(want) {
                let before = rows.len();
                match w {
                    None => {}
                    Some(true) => rows.push(r0 + s.n - 1),
                    Some(false) => rows.extend(r0..r0 + s.n),
                }
                counts.push(rows.len() - before);
                r0 += s.n;
            }
            let vocab = model.spec.vocab_size;
            let l = logits_of_rows(model, &x, &rows);
            let mut all = l.chunks_exact(vocab).map(<[f32]>::to_vec);
            Ok(counts
                .iter()
                .map(|&c| all.by_ref().take(c).collect())
                .collect())
        })?;
        let mut held_rows = 0;
        let mut held_experts = held.map(|h| h.experts.into_iter());
        for ((s, ids), span) in seqs.iter_mut().zip(ids).zip(&spans) {
            s.tokens.extend_from_slice(ids);
            if let Some(experts) = held_experts.as_mut() {
                let rows = experts.by_ref().take(span.n);
                if span.as_decode {
                    s.held_usage.extend((span.pos0..).zip(rows));
                    held_rows += span.n;
                }
            }
        }
        self.policy
            .tokens_ran((n - held_rows) as u64, self.store, &self.cache);
        Ok(logits)
    }

    /// Teacher-forced logits of every position of `ids` from an empty KV cache (the cache holds
    /// `ids` afterwards): row `t` predicts token `t + 1`.
    ///
    /// # Errors
    /// As [`Engine::forward`].
    pub fn forward_logits(&mut self, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.reset();
        self.forward(ids, Logits::All)
    }

    /// Mean negative log-likelihood (nats) of `ids[1..]` given their prefixes, from an empty KV
    /// cache, computed batch by batch (log-softmax in f64 of the f32 logits). Returns
    /// `(mean_nll, predicted_tokens)`.
    ///
    /// # Errors
    /// Fewer than 2 ids; otherwise as [`Engine::forward`].
    pub fn mean_nll(&mut self, ids: &[u32]) -> Result<(f64, usize)> {
        if ids.len() < 2 {
            return Err(EngineError::Invalid(
                "perplexity needs at least 2 tokens".into(),
            ));
        }
        self.reset();
        self.check_ids(ids)?;
        let mut total = 0.0f64;
        let mut count = 0usize;
        for span in crate::prefill::spans(0, ids.len(), self.prefill_batch, self.prefill_align()) {
            let logits = self.forward(&ids[span.clone()], Logits::All)?;
            for (i, row) in logits.iter().enumerate() {
                let t = span.start + i;
                if t + 1 >= ids.len() {
                    break;
                }
                total += nll(row, ids[t + 1] as usize);
                count += 1;
            }
        }
        Ok((total / count as f64, count))
    }

    /// Generates after `prompt`: the longest prefix of `prompt` already in the KV cache is
    /// reused (at least one prompt token is always fed, to get logits), the rest prefilled,
    /// then up to `max_tokens` tokens are sampled, each fed back with the decode path.
    /// `on_token` sees every generated id and returns false to stop.
    ///
    /// With `params.speculation` on, a decode pass may feed drafts after the sampled token and
    /// emit several tokens ([`crate::speculative`]); the tokens are the ones plain decode gives
    /// (bit-identical logits, the same sampler draws), drafts past a stop are rolled back, and
    /// the KV cache ends holding the prompt and every generated token but the last, as without
    /// speculation. Speculation is off while a routing trace is recorded (the trace records
    /// positions one decode at a time).
    ///
    /// # Errors
    /// Empty prompt, invalid sampling or speculation parameters (`mtp` without an MTP layer),
    /// context overflow (prompt + max_tokens must fit), token ids out of range, expert fetch
    /// failures, errors returned by `on_token`.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        mut on_token: impl FnMut(u32) -> Result<bool>,
    ) -> Result<Generation> {
        if prompt.is_empty() {
            return Err(EngineError::Invalid("the prompt has no tokens".into()));
        }
        params.sampling.validate()?;
        params.speculation.validate()?;
        let mut spec = params.speculation;
        spec.mode = spec.mode.resolve(self.mtp_absence().as_deref())?;
        if self.trace.is_some() {
            spec.mode = Speculate::Off;
        }
        if spec.mode == Speculate::Mtp {
            if self.seq.mtp.is_none() {
                // The cached positions' hidden states are gone: prefill them again.
                self.truncate(0);
                let mut own = std::mem::replace(&mut self.seq, Sequence::new(Vec::new(), None));
                let r = self.enable_mtp(&mut own);
                self.seq = own;
                r?;
            }
        } else {
            self.seq.mtp = None;
        }
        let t0 = Instant::now();
        let cache0 = self.cache.stats();
        let bytes0 = self.store.stats().bytes_read;
        let common = self
            .seq
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let keep = common.min(prompt.len() - 1);
        // A state whose layers dropped their older rows goes back only so far; a recurrent
        // state to its nearest checkpoint.
        let keep = self.seq.exact_at_most(keep);
        self.truncate(keep);
        let new = &prompt[keep..];
        let needed = keep + new.len() + params.max_tokens.saturating_sub(1);
        if needed > self.context {
            return Err(EngineError::ContextOverflow {
                needed,
                context: self.context,
            });
        }
        let mut sampler = Sampler::new(params.sampling);
        let mut stats = GenerationStats {
            prompt_tokens: new.len(),
            speculation_mode: spec.mode,
            ..Default::default()
        };
        let mut logits = self
            .forward(new, Logits::Last)?
            .pop()
            .expect("one row for the last token");
        stats.prefill_s = t0.elapsed().as_secs_f64();
        let mut tokens = Vec::new();
        let mut stop = None;
        let decode_start = Instant::now();
        let eos = self.model.spec.eos_token_ids.clone();
        // Emits one token: why generation stops after it, if it does.
        let mut emit = |id: u32, tokens: &mut Vec<u32>| -> Result<Option<StopReason>> {
            tokens.push(id);
            let go_on = on_token(id)?;
            Ok(if params.stop_on_eos && eos.contains(&id) {
                Some(StopReason::Eos)
            } else if !go_on {
                Some(StopReason::Callback)
            } else if tokens.len() >= params.max_tokens {
                Some(StopReason::MaxTokens)
            } else {
                None
            })
        };
        let mut gate = DraftGate::new();
        // A token already sampled (a rejected draft's replacement), fed by the next pass.
        let mut pending: Option<u32> = None;
        while tokens.len() < params.max_tokens {
            let id = match pending.take() {
                Some(id) => id,
                None => sampler.sample(&logits),
            };
            if tokens.is_empty() {
                stats.ttft_s = t0.elapsed().as_secs_f64();
            }
            if let Some(why) = emit(id, &mut tokens)? {
                stop = Some(why);
                break;
            }
            // Drafts: never past max_tokens (the pass emits up to drafts + 1 tokens).
            let k = spec.draft_tokens.min(params.max_tokens - tokens.len() - 1);
            let mut drafts = Vec::new();
            let t_draft = Instant::now();
            match spec.mode {
                Speculate::Ngram if k > 0 => {
                    let mut ctx = self.seq.tokens.clone();
                    ctx.push(id);
                    drafts = ngram::propose(&ctx, spec.max_ngram, k);
                    if !drafts.is_empty() && spec.gate {
                        let k = gate.choose(&self.pass_costs, 1, 1.0, drafts.len());
                        if k == 0 {
                            stats.speculation.gate_paused_passes += 1;
                        }
                        drafts.truncate(k);
                    }
                }
                Speculate::Mtp if k > 0 => {
                    let k = match spec.gate {
                        true => gate.choose(&self.pass_costs, 1, 1.0, k),
                        false => k,
                    };
                    if k > 0 {
                        let t = Instant::now();
                        let mut own =
                            std::mem::replace(&mut self.seq, Sequence::new(Vec::new(), None));
                        let r = self.mtp_draft(&mut own, id, k);
                        self.seq = own;
                        drafts = r?;
                        gate.record_draft_time(t.elapsed().as_secs_f64());
                    } else {
                        stats.speculation.gate_paused_passes += 1;
                    }
                }
                _ => {}
            }
            stats.speculation.draft_s += t_draft.elapsed().as_secs_f64();
            stats.decode_steps += 1;
            if drafts.is_empty() {
                logits = self.forward(&[id], Logits::Last)?.pop().expect("one row");
                continue;
            }
            let base = self.seq.len();
            let mut feed = Vec::with_capacity(drafts.len() + 1);
            feed.push(id);
            feed.extend_from_slice(&drafts);
            let rows = self.forward_batch(&feed, Some(false), true)?;
            stats.speculation.verify_passes += 1;
            stats.speculation.drafts_proposed += drafts.len() as u64;
            // Row i sampled as plain decode would; drafts accepted while they agree.
            let verdict = crate::speculative::accept(&mut sampler, &rows, &drafts);
            let accepted = verdict.accepted;
            let mut emitted = 1;
            for &z in &drafts[..accepted] {
                emitted += 1;
                if let Some(why) = emit(z, &mut tokens)? {
                    stop = Some(why);
                    break;
                }
            }
            pending = Some(verdict.next);
            stats.speculation.drafts_accepted += (emitted - 1) as u64;
            gate.record(accepted, drafts.len());
            // Keep the fed token and the accepted drafts emitted, except a last emitted token
            // that stopped generation (the cache never holds the final token).
            let kept = emitted - usize::from(stop.is_some());
            self.truncate(base + kept);
            if stop.is_some() {
                break;
            }
        }
        stats.decode_s = decode_start.elapsed().as_secs_f64();
        stats.generated_tokens = tokens.len();
        stats.cache = self.cache.stats().since(&cache0);
        stats.expert_bytes_read = self.store.stats().bytes_read - bytes0;
        let mut own = std::mem::replace(&mut self.seq, Sequence::new(Vec::new(), None));
        self.commit_usage(&mut own);
        self.seq = own;
        self.save_usage();
        Ok(Generation {
            tokens,
            stop: stop.unwrap_or(StopReason::MaxTokens),
            stats,
        })
    }
}

/// Whether `l` is a consistent state of `len` positions for a layer with attention `attn` and
/// row widths `(kv_dim, v_dim)`: rows from where it says, dropped rows only where the layer
/// drops them, and a `min_len` that covers what its window and convolutions read (a state read
/// from a file is checked before it runs: a bad one must not index a dropped row).
fn state_fits(
    l: &LayerKv,
    len: usize,
    (kd, vd): (usize, usize),
    attn: &crate::layers::SelfAttn<'_>,
) -> bool {
    if len == 0 {
        return l.k.is_empty()
            && l.v.is_empty()
            && l.conv.is_empty()
            && l.recurrent.is_empty()
            && l.first == 0;
    }
    let (window, kernel) = attn.row_bounds();
    let conv_dim = attn.conv_dim();
    // A recurrent state is whole (as are the verification rows' states it keeps).
    let recurrent = l.recurrent.len() == attn.recurrent_len()
        && l.recurrent_history
            .iter()
            .all(|(at, st)| *at < len && st.len() == l.recurrent.len());
    let shapes = l.first <= len
        && l.conv_first <= len
        && l.min_len <= len
        && l.conv_dim == conv_dim
        && l.k.len() == (len - l.first) * kd
        && l.v.len() == (len - l.first) * vd
        && l.conv.len() == (len - l.conv_first) * conv_dim;
    let keys = match window {
        _ if l.first == 0 => true,
        Some(w) => l.min_len >= l.first + w - 1,
        None => false,
    };
    let conv = l.conv_first == 0 || (conv_dim > 0 && l.min_len >= l.conv_first + kernel - 1);
    shapes && keys && conv && recurrent
}

/// f32 values per position of each layer's `v` cache rows (GQA: `kv_dim`; MLA: 0; Inkling:
/// its state row).
fn layer_v_dims(layers: &[crate::layers::DecoderLayer<'_>]) -> Vec<usize> {
    layers.iter().map(|l| l.attn.v_dim()).collect()
}

/// f32 values per position of each layer's KV cache (`LayerKv::k` row width).
fn layer_kv_dims(layers: &[crate::layers::DecoderLayer<'_>]) -> Vec<usize> {
    layers.iter().map(|l| l.attn.kv_dim()).collect()
}

/// Bytes of KV cache per token of `layers` (see [`Engine::kv_bytes_per_token`]): what grows
/// with the context (an Inkling sliding layer's keys and values and every Inkling layer's
/// convolution inputs are bounded: [`kv_bytes_per_sequence`]).
fn kv_bytes_per_token(layers: &[crate::layers::DecoderLayer<'_>]) -> u64 {
    let values: usize = layers
        .iter()
        .map(|l| match (&l.attn, l.attn.row_bounds()) {
            // DeepSeek-V4: the window is bounded; one entry per closed block grows.
            (crate::layers::SelfAttn::DeepseekV4(a), _) => {
                a.block_dim().div_ceil(a.rate.max(1)) * usize::from(a.rate > 0)
            }
            (_, (Some(_), _)) => 0,
            (_, (None, _)) => l.attn.kv_dim() + l.attn.v_dim(),
        })
        .sum();
    (values * std::mem::size_of::<f32>()) as u64
}

/// Bytes of KV cache of one sequence of `context` positions of `model` (see
/// [`Engine::kv_bytes_per_sequence`]).
fn kv_bytes_per_sequence(model: &Model<'_>, context: usize) -> u64 {
    let spec = &model.spec;
    let per_token = match (&spec.inkling, &spec.deepseek_v4) {
        (Some(ink), _) => (ink.kv_values(spec, context) * std::mem::size_of::<f32>()) as u64,
        (None, Some(v)) => {
            (v.kv_values(spec.head_dim, context) * std::mem::size_of::<f32>()) as u64
        }
        (None, None) => kv_bytes_per_token(&model.layers).saturating_mul(context as u64),
    };
    per_token + bounded_state_bytes(&model.layers)
}

/// Bytes of the state of one sequence that does not grow with the context, besides Inkling's
/// (counted by `InklingSpec::kv_values`): each recurrent layer's state, the convolution
/// inputs it keeps and its checkpoints (`GatedDeltaSpec::held_values`, the memory plan's
/// count too).
fn bounded_state_bytes(layers: &[crate::layers::DecoderLayer<'_>]) -> u64 {
    let values: usize = layers.iter().map(|l| l.attn.held_state_values()).sum();
    (values * std::mem::size_of::<f32>()) as u64
}

/// The residual stream of `ids`, `[n, residual width]` f32 (one row per id, in order): the
/// embeddings ([`Model::residual_of_embeddings`]).
fn embed_rows<'a>(model: &Model<'_>, ids: impl Iterator<Item = &'a u32>, n: usize) -> Vec<f32> {
    let h = model.spec.hidden_size;
    let mut x = vec![0f32; n * h];
    for (t, &id) in ids.enumerate() {
        model
            .embed
            .dequantize_row(id as usize, &mut x[t * h..(t + 1) * h]);
    }
    if let Some(norm) = &model.embed_norm {
        norm.forward_inplace(&mut x);
    }
    model.residual_of_embeddings(x, n)
}

/// Logits of rows `rows` of the residual stream `x` (`[N, streams H]`): the hidden state
/// ([`Model::hidden_of_residual`]), final norm, then `lm_head` (matvec for one row, matmul for
/// more: the same bits per row). `[rows.len() * vocab]` f32.
fn logits_of_rows(model: &Model<'_>, x: &[f32], rows: &[usize]) -> Vec<f32> {
    let h = model.residual_width();
    let mut l = vec![0f32; rows.len() * model.spec.vocab_size];
    if rows.is_empty() {
        return l;
    }
    let mut xs = Vec::with_capacity(rows.len() * h);
    for &t in rows {
        xs.extend_from_slice(&x[t * h..(t + 1) * h]);
    }
    let xs = model.hidden_of_residual(&xs, rows.len());
    let mut normed = vec![0f32; xs.len()];
    model.final_norm.forward(&xs, &mut normed);
    let out = model.output;
    if out.divisor != 1.0 {
        for v in &mut normed {
            *v /= out.divisor;
        }
    }
    let vocab = model.spec.vocab_size;
    // Only the unpadded rows of lm_head are logits; the rest are -inf.
    let head = if out.vocab < vocab {
        model.lm_head.row_range(0, out.vocab)
    } else {
        None
    };
    match head {
        Some(head) => {
            let mut part = vec![0f32; rows.len() * out.vocab];
            if rows.len() == 1 {
                coli_kernels::matvec(&head, &normed, &mut part);
            } else {
                coli_kernels::matmul(&head, &normed, rows.len(), &mut part);
            }
            for (dst, src) in l.chunks_exact_mut(vocab).zip(part.chunks_exact(out.vocab)) {
                dst[..out.vocab].copy_from_slice(src);
                dst[out.vocab..].fill(f32::NEG_INFINITY);
            }
        }
        None => {
            if rows.len() == 1 {
                coli_kernels::matvec(&model.lm_head, &normed, &mut l);
            } else {
                coli_kernels::matmul(&model.lm_head, &normed, rows.len(), &mut l);
            }
            for dst in l.chunks_exact_mut(vocab) {
                dst[out.vocab..].fill(f32::NEG_INFINITY);
            }
        }
    }
    out.softcap_rows(&mut l, vocab);
    l
}

/// Runs `run` with the lookahead the placement policy chose: with the prefetch thread
/// (`Some(Some(pf))`), predicting only (`Some(None)`), or without (`None`).
fn with_lookahead(
    lookahead: Lookahead,
    store: &Store,
    cache: &ExpertCache,
    mut run: impl FnMut(Option<Option<&crate::prefetch::Prefetcher<'_, '_>>>) -> Result<()>,
) -> Result<()> {
    match lookahead {
        Lookahead::PredictAndRead => {
            crate::prefetch::with_prefetcher(store, cache, |pf| run(Some(Some(pf)))).0
        }
        Lookahead::Predict => run(Some(None)),
        Lookahead::Off => run(None),
    }
}

/// `-log_softmax(logits)[target]` in f64.
pub fn nll(logits: &[f32], target: usize) -> f64 {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    -((logits[target] as f64 - max) - sum.ln())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_of_uniform_is_log_n() {
        assert!((nll(&[0.0; 4], 2) - 4f64.ln()).abs() < 1e-12);
        assert!(nll(&[10.0, 0.0], 0) < 1e-4);
    }
}
