//! Layout replicas of the releases coli claims (issue 41): for each, a checkpoint with exactly
//! the release's tensor names and dtypes (tests/fixtures/published/<release>.tensors.txt, read
//! from the release's index or a public loader that lists it; `coli_tests::published`) and its
//! config.json at tiny widths must convert with the default options, load, generate 8 tokens,
//! and be read by `coli plan --checkpoint`. Every listed tensor the converter leaves out must
//! be one the listing declares as not read (`# not-read:`), so that a tensor a release ships
//! and coli silently ignores fails here.
//!
//! One test per listing under tests/fixtures/published/ (sources and caveats in each file's
//! header and that directory's README). The generator itself is also checked on a listing
//! written from a committed fixture's header, with a vision-tower tensor the converter must
//! leave out and a tensor it must not.

use coli_convert::{Encodings, Options};
use coli_engine::{Engine, EngineOptions, GenerateParams};
use coli_store::{Encoding, IoPreference};
use coli_tests::open_store;
use coli_tests::published::write_replica_of;

/// Converts, runs and plans the replica of `release`; returns the store's MANIFEST.
fn replica_runs(release: &str) -> coli_store::Manifest {
    let tmp = tempfile::tempdir().unwrap();
    replica_runs_listing(coli_tests::published::read_listing(release), tmp.path())
}

/// [`replica_runs`] of a listing already read, in the directory `tmp`.
fn replica_runs_listing(
    listing: coli_tests::published::Listing,
    tmp: &std::path::Path,
) -> coli_store::Manifest {
    let release = listing.release.clone();
    let release = release.as_str();
    let r = write_replica_of(listing, &tmp.join("ckpt"), 4);
    let not_read = |n: &str| r.listing.is_not_read(n);
    let unknown: Vec<&String> = r.unknown.iter().filter(|n| !not_read(n)).collect();
    assert!(
        unknown.is_empty(),
        "{release}: listed tensors the model spec does not know: {unknown:?}"
    );
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(r.dir.join("config.json")).unwrap()).unwrap();
    // Experts published as MXFP4 / FP4 are kept as published (what `--experts auto` picks).
    let experts = match coli_format::spec::declared_expert_encoding(&cfg) {
        Some(Encoding::Mxfp4) => Encoding::Mxfp4,
        _ => Encoding::Int4 { group_size: 64 },
    };
    let out = tmp.join("store");
    let report = coli_convert::run(&Options {
        input: r.dir.clone(),
        output: out.clone(),
        encodings: Encodings::new(experts, Encoding::Bf16, Encoding::Int8),
        matrix_order: coli_store::MatrixOrder::Interleaved,
        threads: None,
        progress: false,
    })
    .unwrap_or_else(|e| panic!("{release}: conversion refused: {e}"));
    let silently_dropped: Vec<&String> = report
        .not_converted
        .iter()
        .filter(|n| !not_read(n))
        .collect();
    assert!(
        silently_dropped.is_empty(),
        "{release}: the converter left out listed tensors: {silently_dropped:?}"
    );
    let store = open_store(&out, true, IoPreference::Auto);
    let mut e = Engine::new(&store, &EngineOptions::default())
        .unwrap_or_else(|e| panic!("{release}: the store does not load: {e}"));
    let params = GenerateParams {
        max_tokens: 8,
        sampling: Default::default(),
        stop_on_eos: false,
        speculation: Default::default(),
    };
    let g = e
        .generate(&[1, 2, 3, 4], &params, |_| Ok(true))
        .unwrap_or_else(|e| panic!("{release}: generation failed: {e}"));
    assert_eq!(g.tokens.len(), 8, "{release}");
    // A store holding the MTP layer's experts (index num_hidden_layers) loads it.
    let mtp_stored = store
        .manifest()
        .expert_layers
        .iter()
        .any(|l| l.layer as usize == e.spec().num_layers);
    assert!(
        !mtp_stored || e.has_mtp(),
        "{release}: the store holds the MTP layer but the engine did not load it: {:?}",
        e.take_warnings()
    );
    if e.has_mtp() {
        // The release's MTP layer drafts; speculation never changes the tokens.
        let spec = GenerateParams {
            speculation: coli_engine::SpeculationParams {
                mode: coli_engine::Speculate::Mtp,
                ..Default::default()
            },
            ..params
        };
        let s = e
            .generate(&[1, 2, 3, 4], &spec, |_| Ok(true))
            .unwrap_or_else(|e| panic!("{release}: MTP speculation failed: {e}"));
        assert_eq!(
            s.tokens, g.tokens,
            "{release}: MTP speculation changed the tokens"
        );
    }
    let plan =
        coli_convert::memory_plan::plan_from_config(&coli_convert::memory_plan::ConfigPlanArgs {
            gguf: None,
            checkpoint: Some(&r.dir),
            config: None,
            total_ram: 25 << 30,
            context: Some(4096),
            disk_gib_s: Some(3.0),
            experts: None,
            mtp: Some(Encoding::Int8),
            chosen: None,
        })
        .unwrap_or_else(|e| panic!("{release}: coli plan --checkpoint: {e:#}"));
    assert_eq!(
        plan.experts + plan.mtp_experts,
        store.index().len() as u64,
        "{release}: the plan's expert records"
    );
    store.manifest().clone()
}

/// Writes a listing (in the committed notation, compressed by hand for the expert ranges) of the
/// glm5_fp8 fixture's own tensors plus `extra` lines, with the fixture's config.
fn fixture_listing(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let fixture = coli_tests::fixture_dir("glm5_fp8");
    let ck = coli_convert::checkpoint::Checkpoint::open(&fixture).unwrap();
    let mut names: Vec<String> = ck
        .tensors
        .keys()
        .filter(|n| !n.contains(".mlp.experts."))
        .map(|n| {
            let (shard, info) = ck.get(n).unwrap();
            let _ = shard;
            format!("{n} {}", info.dtype.name())
        })
        .collect();
    // The experts as brace ranges (layers 1-3 hold 12 experts each; F8 with F32 scales).
    for m in ["gate_proj", "up_proj", "down_proj"] {
        names.push(format!(
            "model.layers.{{1..3}}.mlp.experts.{{0..11}}.{m}.weight F8_E4M3"
        ));
        let scale = format!("model.layers.1.mlp.experts.0.{m}.weight_scale_inv");
        let dtype = ck.get(&scale).unwrap().1.dtype.name();
        names.push(format!(
            "model.layers.{{1..3}}.mlp.experts.{{0..11}}.{m}.weight_scale_inv {dtype}"
        ));
    }
    let rel = fixture.join("config.json");
    let rel = rel
        .strip_prefix(coli_tests::published::repo_root())
        .map(|p| p.to_path_buf())
        .unwrap_or(rel);
    let text = format!(
        "# release: tests/fixtures/tiny/glm5_fp8 (a fixture, not a release: the generator's own test)\n\
         # config: {}\n# not-read: model.visual.\n{}\n{extra}\n",
        rel.display(),
        names.join("\n")
    );
    let path = dir.join("fixture.tensors.txt");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn the_replica_generator_writes_converts_and_runs_a_listing() {
    let tmp = tempfile::tempdir().unwrap();
    let listing = fixture_listing(tmp.path(), "model.visual.patch_embed.weight BF16");
    let l = coli_tests::published::read_listing_file(&listing);
    let fixture_names =
        coli_convert::checkpoint::Checkpoint::open(&coli_tests::fixture_dir("glm5_fp8"))
            .unwrap()
            .tensors
            .len();
    assert_eq!(
        l.tensors.len(),
        fixture_names + 1,
        "brace ranges expand to every expert"
    );
    let m = replica_runs_listing(l, tmp.path());
    assert_eq!(m.family, "glm_moe_dsa");
    assert_eq!(m.num_layers, 4, "the MTP layer converted");
    // A listed tensor outside the spec that the listing does not declare as not read fails.
    let tmp2 = tempfile::tempdir().unwrap();
    let listing = fixture_listing(tmp2.path(), "model.layers.0.mlp.extra_scale.weight BF16");
    let l = coli_tests::published::read_listing_file(&listing);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        replica_runs_listing(l, tmp2.path())
    }));
    assert!(
        r.is_err(),
        "a tensor the spec does not know must fail the replica"
    );
}

#[test]
fn gpt_oss_20b_as_published() {
    let m = replica_runs("gpt-oss-20b");
    assert_eq!(m.expert_encoding.name, "mxfp4");
}

#[test]
fn mixtral_8x7b_as_published() {
    replica_runs("mixtral-8x7b");
}

#[test]
fn olmoe_1b_7b_as_published() {
    replica_runs("olmoe-1b-7b");
}

#[test]
fn glm_5_1_as_published() {
    let m = replica_runs("glm-5.1");
    assert_eq!(m.family, "glm_moe_dsa");
    assert_eq!(m.num_layers, 79, "the MTP layer converted");
    assert!(
        !m.mtp_shared.is_empty(),
        "the MTP layer shares the main embedding and lm_head"
    );
}

#[test]
fn glm_4_5_as_published() {
    let m = replica_runs("glm-4.5");
    assert!(m.mtp_shared.is_empty(), "GLM-4.5 ships its own MTP copies");
}

#[test]
fn glm_4_6_as_published() {
    replica_runs("glm-4.6");
}

#[test]
fn deepseek_v3_as_published() {
    let m = replica_runs("deepseek-v3");
    assert!(
        m.mtp_shared.is_empty(),
        "DeepSeek-V3 ships its own MTP copies"
    );
}

#[test]
fn deepseek_v3_2_as_published() {
    replica_runs("deepseek-v3.2");
}

#[test]
fn kimi_k2_as_published() {
    replica_runs("kimi-k2");
}

#[test]
fn qwen3_235b_a22b_as_published() {
    replica_runs("qwen3-235b-a22b");
}

#[test]
fn minimax_m2_as_published() {
    replica_runs("minimax-m2");
}

#[test]
fn inkling_as_published() {
    replica_runs("inkling");
}

#[test]
fn qwen3_next_80b_a3b_as_published() {
    // 48 layers of 512 experts at tiny widths, and the MTP layer (`mtp.*`, layer 48).
    let m = replica_runs("qwen3-next-80b-a3b");
    assert_eq!(m.expert_layers.len(), 49);
    assert_eq!(
        m.expert_layers.last().map(|l| l.layer),
        Some(48),
        "the MTP layer's experts"
    );
}

#[test]
fn qwen3_6_35b_a3b_as_published() {
    // The language model nested under `model.language_model.` with its experts fused, a vision
    // tower (listed and declared not read) and an MTP layer (`mtp.*` at the top level, experts
    // per expert: layer 40).
    let m = replica_runs("qwen3.6-35b-a3b");
    assert_eq!(m.expert_layers.len(), 41);
    assert_eq!(
        m.expert_layers.last().map(|l| l.layer),
        Some(40),
        "the MTP layer's experts"
    );
}

#[test]
fn qwen3_6_35b_a3b_fp8_as_published() {
    // The block-FP8 release: per-expert FP8 experts with BF16 128x128 inverse scales, FP8 Gated
    // DeltaNet and attention projections, BF16 in_proj_a/b and convolution.
    let m = replica_runs("qwen3.6-35b-a3b-fp8");
    assert_eq!(m.expert_layers.len(), 41);
    assert_eq!(
        m.expert_layers.last().map(|l| l.layer),
        Some(40),
        "the MTP layer's experts"
    );
}

#[test]
fn kimi_linear_48b_a3b_as_published() {
    // 20 KDA layers (q/k/v convolutions, F32 decay tensors, A_log as (1, 1, H, 1)) and 7 NoPE
    // MLA layers, listed 1-based in `linear_attn_config`; a dense first layer, then 26 layers
    // of 256 experts under `block_sparse_moe` (w1/w3/w2); no MTP layer.
    let m = replica_runs("kimi-linear-48b-a3b");
    assert_eq!(m.expert_layers.len(), 26);
    assert_eq!(m.expert_layers[0].layer, 1);
}

#[test]
fn kimi_k3_as_published() {
    // 69 KDA layers (full-rank g_proj, A_log [H]) and 24 gated NoPE MLA layers, attention
    // residuals (per-layer and output `*_res_{norm,proj}`), a dense first layer, then 92
    // latent-MoE layers of 896 experts published as compressed-tensors MXFP4 (`weight_packed`,
    // `weight_scale`), kept bit for bit; the vision tower not read.
    let m = replica_runs("kimi-k3");
    assert_eq!(m.expert_layers.len(), 92);
    assert_eq!(m.expert_layers[0].layer, 1);
}

#[test]
fn glm_5_3_flash_as_published() {
    // 34 KDA layers (the safe forget gate, A_log as (H,)) and 11 DSA layers (NoPE MLA with the
    // k-pool indexer), every layer with its two hyper-connections (hc_attn_*, hc_ffn_*), nested
    // under model.language_model beside a vision tower; dense layers 0-2, then 42 layers of 288
    // experts; the MTP layer 45 is listed as not converted.
    let m = replica_runs("glm-5.3-flash");
    assert_eq!(m.expert_layers.len(), 42);
    assert_eq!(m.expert_layers[0].layer, 3);
}

/// DeepSeek-V4-Flash as released: FP8 attention and shared experts with F8_E8M0 `.scale`
/// blocks of 128x128, FP4 routed experts (I8 codes with an e8m0 scale per 32 columns) kept bit
/// for bit as mxfp4 records, I64 `tid2eid` tables on the three hash-routed layers, compressors
/// on the CSA and HCA layers and the indexer on the CSA ones, hyper-connections everywhere; the
/// MTP layer mtp.0 listed as not converted.
#[test]
fn deepseek_v4_flash_replica_runs() {
    let m = replica_runs("deepseek-v4-flash");
    assert_eq!(m.expert_layers.len(), 43);
    assert_eq!(m.family, "deepseek_v4");
}
