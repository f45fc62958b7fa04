//! The prefix cache (engine/src/prefix_cache, docs/KV_CACHE.md) on real converted stores.
//!
//! - **Resume = continue**, every fixture family: a conversation (prompt, greedy reply, a
//!   follow-up turn) resumed from RAM, and from a file after the cache is reopened (a restart),
//!   gives logits bit-identical to the same sequence kept live, and the same greedy tokens as
//!   the whole conversation prefilled from scratch (whose logits agree within 1e-3: MLA
//!   prefill and decode differ in summation order). MTP state survives the file on the
//!   families that have an MTP layer: the next draft is the live one.
//! - **Faults**: a truncated, bit-flipped (header or body), foreign (other parameters) file is
//!   reported once, quarantined, never used, the prefix recomputed; a newer cache-layout version
//!   is ignored and left in place; another scope never sees a state; the disk budget evicts the
//!   least recently used; files are mode 0600.
//! - **Crash**: writer processes (two at once, sharing the directory) SIGKILLed at seeded random
//!   times never leave a file that is used half-written.
//!
//! `COLI_DEMO_STORE=DIR cargo test -p coli-tests --test prefix_cache -- --ignored demo` runs
//! the resume check on the demo store (tools/test.sh does).

use coli_engine::prefix_cache::{
    file::KV_LAYOUT_VERSION, scope_of, session_scope, KvLayout, PrefixCache, PrefixCacheOptions,
    Tier,
};
use coli_engine::{BatchItem, Engine, EngineOptions, Logits, Sequence};
use coli_store::IoPreference;
use coli_tests::{convert_fixture, expected, ids, open_store};
use std::path::{Path, PathBuf};

const FAMILIES: [&str; 18] = coli_tests::FIXTURE_FAMILIES;

fn argmax(row: &[f32]) -> u32 {
    coli_engine::sampling::argmax(row)
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Feeds `ids` to `seq` in chunks of 4 and returns the last position's logits.
fn feed(e: &mut Engine<'_>, seq: &mut Sequence, ids: &[u32]) -> Vec<f32> {
    let mut last = Vec::new();
    for chunk in ids.chunks(4) {
        let mut items = [BatchItem {
            seq: &mut *seq,
            ids: chunk,
            logits: Some(Logits::Last),
            verify: false,
        }];
        last = e.forward_many(&mut items).unwrap().remove(0).remove(0);
    }
    last
}

/// Greedy decode of `n` tokens after `logits` (the first one sampled from it); returns the
/// tokens and every logits row after the first.
fn decode(
    e: &mut Engine<'_>,
    seq: &mut Sequence,
    logits: &[f32],
    n: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut toks = vec![argmax(logits)];
    let mut rows = Vec::new();
    for _ in 1..n {
        let row = feed(e, seq, &[*toks.last().unwrap()]);
        toks.push(argmax(&row));
        rows.push(row);
    }
    (toks, rows)
}

fn cache(layout: KvLayout, dir: Option<&Path>, ram: u64) -> PrefixCache {
    PrefixCache::open(
        layout,
        &PrefixCacheOptions {
            ram_budget: ram,
            disk_dir: dir.map(Path::to_path_buf),
            disk_budget: 1 << 30,
        },
    )
    .unwrap()
}

/// The resume checks on the store at `dir` (see the module doc); `base` seeds the prompts, the
/// first turn being its first `p1_len` ids. A first turn long enough for the layers to drop
/// their older rows (Inkling's windows) cannot give back a short prefix: no file serves it.
fn check_resume(dir: &Path, name: &str, base: &[u32], p1_len: usize) {
    let store = open_store(dir, false, IoPreference::Auto);
    let mut e = Engine::new(
        &store,
        &EngineOptions {
            threads: Some(2),
            prefill_batch: 4,
            max_sequences: 6,
            ..Default::default()
        },
    )
    .unwrap();
    let vocab = e.spec().vocab_size as u32;
    let p1: Vec<u32> = base.iter().take(p1_len).copied().collect();
    let p2: Vec<u32> = (0..6)
        .map(|i| (base[i % base.len()] * 5 + 7 * i as u32 + 3) % vocab)
        .collect();
    let mtp = e.has_mtp();
    // The live conversation: the prompt, a greedy reply of 4 tokens (the last one sampled,
    // not fed), then the follow-up turn.
    let mut live = e.new_sequence().unwrap();
    if mtp {
        e.enable_mtp(&mut live).unwrap();
    }
    let l1 = feed(&mut e, &mut live, &p1);
    let (reply, _) = decode(&mut e, &mut live, &l1, 4);
    let history: Vec<u32> = live.tokens().to_vec();
    assert_eq!(history.len(), p1.len() + 3);
    let mut turn2 = vec![*reply.last().unwrap()];
    turn2.extend(&p2);
    let mut prompt2 = history.clone();
    prompt2.extend(&turn2);
    let layout = e.kv_layout();
    let tmp = tempfile::tempdir().unwrap();
    let kv_dir = tmp.path().join("kv");
    {
        // The conversation at the end of turn 1 goes to the cache (RAM and a file).
        let mut c = cache(layout.clone(), Some(&kv_dir), 1 << 30);
        let copy = e.fork_sequence(&live, usize::MAX).unwrap();
        c.put(0, copy.into_state());
        assert_eq!(c.stats().files_written, 1, "{name}");
        assert!(c.take_warnings().is_empty());
        // From RAM.
        let hit = c.take(0, &prompt2, prompt2.len() - 1).expect("a RAM hit");
        assert_eq!(hit.tier, Tier::Ram);
        assert_eq!(hit.state.len(), history.len());
        assert_eq!(hit.state.has_mtp_state(), mtp, "{name}");
        let mut seq = e.resume_sequence(hit.state).unwrap();
        compare_continuations(&mut e, &mut live, &mut seq, &turn2, name, "RAM");
    }
    // From disk, after a "restart": a new cache indexes the directory.
    let mut live = e.new_sequence().unwrap();
    if mtp {
        e.enable_mtp(&mut live).unwrap();
    }
    let l1b = feed(&mut e, &mut live, &p1);
    assert!(same_bits(&l1, &l1b));
    let _ = decode(&mut e, &mut live, &l1b, 4);
    let mut c = cache(layout.clone(), Some(&kv_dir), 0);
    assert_eq!(c.disk_files(), 1, "{name}: the file is indexed");
    let hit = c.take(0, &prompt2, prompt2.len() - 1).expect("a disk hit");
    assert_eq!(hit.tier, Tier::Disk, "{name}");
    assert_eq!(hit.state.tokens(), history.as_slice());
    assert!(c.take_warnings().is_empty());
    let mut seq = e.resume_sequence(hit.state).unwrap();
    if mtp {
        // The MTP state came back whole: the next drafts are the live sequence's.
        let next = turn2[0];
        let a = e.mtp_draft(&mut live, next, 2).unwrap();
        let b = e.mtp_draft(&mut seq, next, 2).unwrap();
        assert_eq!(a, b, "{name}: MTP drafts after a resume from disk");
    }
    let (resumed_tokens, resumed_last) =
        compare_continuations(&mut e, &mut live, &mut seq, &turn2, name, "disk");
    // A prefix shorter than the file: the file serves it (only the kept rows are held), and
    // it continues as the live sequence cut to the same prefix.
    let short = &prompt2[..5];
    let hit = c.take(0, short, short.len() - 1);
    if p1_len > 100 {
        // The rows the prefix needs were dropped: not served, and the file stays usable.
        assert!(hit.is_none(), "{name}: a short prefix of a trimmed state");
        assert!(c.take_warnings().is_empty());
        assert_eq!(c.disk_files(), 1, "{name}: the file is kept");
        assert!(c.take(0, &prompt2, prompt2.len() - 1).is_some(), "{name}");
    }
    if let Some(hit) = hit {
        assert_eq!(hit.state.len(), 4);
        assert!(c.take_warnings().is_empty());
        let mut part = e.resume_sequence(hit.state).unwrap();
        let mut cut = e.fork_sequence(&live, 4).unwrap();
        let a = feed(&mut e, &mut part, &prompt2[4..9]);
        let b = feed(&mut e, &mut cut, &prompt2[4..9]);
        assert!(same_bits(&a, &b), "{name}: a prefix read from a file");
    }
    // From scratch: the whole conversation prefilled at once.
    let mut scratch = e.new_sequence().unwrap();
    let ls = feed(&mut e, &mut scratch, &prompt2);
    let (scratch_tokens, _) = decode(&mut e, &mut scratch, &ls, 4);
    assert_eq!(
        scratch_tokens, resumed_tokens,
        "{name}: resumed vs scratch tokens"
    );
    let diff = coli_tests::max_abs_diff(&ls, &resumed_last);
    assert!(
        diff <= 1e-3,
        "{name}: resumed vs scratch logits differ by {diff}"
    );
}

/// Feeds `turn` to both sequences and decodes 4 greedy tokens: every logits row must be equal
/// bit for bit. Returns the tokens and the logits after `turn`.
fn compare_continuations(
    e: &mut Engine<'_>,
    live: &mut Sequence,
    resumed: &mut Sequence,
    turn: &[u32],
    name: &str,
    tier: &str,
) -> (Vec<u32>, Vec<f32>) {
    let a = feed(e, live, turn);
    let b = feed(e, resumed, turn);
    assert!(
        same_bits(&a, &b),
        "{name}: logits after the turn, resumed from {tier}"
    );
    let (ta, ra) = decode(e, live, &a, 4);
    let (tb, rb) = decode(e, resumed, &b, 4);
    assert_eq!(ta, tb, "{name}: tokens resumed from {tier}");
    for (x, y) in ra.iter().zip(&rb) {
        assert!(same_bits(x, y), "{name}: decode logits resumed from {tier}");
    }
    (ta, a)
}

#[test]
fn resumed_conversations_continue_exactly_on_every_family() {
    for name in FAMILIES {
        let (_tmp, dir) = convert_fixture(name, "int4_store");
        let base = ids(&expected(name)["prompt_ids"]);
        check_resume(&dir, name, &base, 9);
    }
    // Inkling after a first turn long enough for its layers to drop rows: the state saved,
    // read back and resumed continues exactly.
    let name = "inkling_bf16";
    let (_tmp, dir) = convert_fixture(name, "lossless_store");
    let base = ids(&expected(name)["long_prompt_ids"]);
    check_resume(&dir, name, &base, 180);
    // DeepSeek-V4 after 150 positions: windows trimmed (sliding and compressed layers), compressor
    // rows trimmed, 37 CSA and 18 HCA entries closed; the FP4/FP8 release layout too.
    for name in ["deepseek_v4_bf16", "deepseek_v4_fp8"] {
        let (_tmp, dir) = convert_fixture(name, "lossless_store");
        let base = ids(&expected(name)["long_prompt_ids"]);
        check_resume(&dir, name, &base, 150);
    }
}

#[test]
#[ignore = "needs COLI_DEMO_STORE (tools/test.sh sets it after building the demo store)"]
fn resumed_conversation_continues_exactly_on_the_demo_store() {
    let dir = std::env::var("COLI_DEMO_STORE").expect("COLI_DEMO_STORE=<demo store dir>");
    let base: Vec<u32> = vec![504, 2365, 314, 260, 3458, 28, 339, 1073, 253, 1432, 30];
    check_resume(Path::new(&dir), "demo", &base, 9);
}

/// An olmoe int4 store and an engine's state of `n` tokens (a prefill of derived ids).
struct Setup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
}

fn setup() -> Setup {
    let (tmp, dir) = convert_fixture("olmoe_fp8", "int4_store");
    Setup { _tmp: tmp, dir }
}

/// An engine with room for 4 sequences (the fault and budget tests use up to 3 at once).
fn engine(store: &coli_store::Store) -> Engine<'_> {
    Engine::new(
        store,
        &EngineOptions {
            max_sequences: 4,
            ..Default::default()
        },
    )
    .unwrap()
}

fn state_of(e: &mut Engine<'_>, tokens: &[u32]) -> coli_engine::KvState {
    let mut s = e.new_sequence().unwrap();
    feed(e, &mut s, tokens);
    s.into_state()
}

fn kv_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "kv"))
        .collect();
    v.sort();
    v
}

fn quarantined(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("quarantine")).map_or(0, |r| r.count())
}

#[test]
fn damaged_foreign_and_newer_files_are_never_used() {
    let s = setup();
    let store = open_store(&s.dir, false, IoPreference::Auto);
    let mut e = engine(&store);
    let layout = e.kv_layout();
    let tmp = tempfile::tempdir().unwrap();
    let kv = tmp.path().join("kv");
    let toks: Vec<u32> = (1..=12).collect();
    let mut prompt = toks.clone();
    prompt.push(40);
    let write = |e: &mut Engine<'_>| {
        let mut c = cache(layout.clone(), Some(&kv), 0);
        c.put(0, state_of(e, &toks));
        kv_files(&kv).pop().unwrap()
    };
    let path = write(&mut e);
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "KV cache files are private to the user");
    }
    let good = std::fs::read(&path).unwrap();
    let header_len = 88 + 4 * toks.len() + 8;
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Damage, &str)> = vec![
        (
            "truncated body",
            Box::new(|b: &mut Vec<u8>| b.truncate(b.len() - 100)),
            "truncated",
        ),
        (
            "flipped body bit",
            Box::new(|b: &mut Vec<u8>| {
                // In the last layer's values (its checkpoint and compressed-block counts, 0,
                // are the last 16 bytes).
                let n = b.len() - 23;
                b[n] ^= 0x10
            }),
            "body checksum",
        ),
        (
            "flipped token id",
            Box::new(move |b: &mut Vec<u8>| b[88 + 4] ^= 1),
            "header checksum",
        ),
        (
            "truncated header",
            Box::new(move |b: &mut Vec<u8>| b.truncate(header_len - 3)),
            "truncated",
        ),
        (
            "not a KV file",
            Box::new(|b: &mut Vec<u8>| b[0] = b'X'),
            "not a coli KV cache file",
        ),
        (
            // A damaged count with a consistent header length: refused before any allocation
            // of that size.
            "huge token count",
            Box::new(|b: &mut Vec<u8>| {
                let n: u64 = 1 << 24;
                b[12..16].copy_from_slice(&((96 + 4 * n) as u32).to_le_bytes());
                b[48..56].copy_from_slice(&n.to_le_bytes());
            }),
            "shorter than its",
        ),
        (
            "token count past the limit",
            Box::new(|b: &mut Vec<u8>| b[48..56].copy_from_slice(&(u64::MAX / 8).to_le_bytes())),
            "does not match",
        ),
    ];
    for (what, damage, says) in cases {
        let mut b = good.clone();
        damage(&mut b);
        std::fs::write(&path, &b).unwrap();
        let q0 = quarantined(&kv);
        let mut c = cache(layout.clone(), Some(&kv), 0);
        // Header damage shows at indexing, body damage when read back: either way, reported
        // once, quarantined, the prefix recomputed (no hit).
        let hit = c.take(0, &prompt, prompt.len() - 1);
        assert!(hit.is_none(), "{what}: a damaged file was used");
        let w = c.take_warnings();
        assert_eq!(w.len(), 1, "{what}: reported once: {w:?}");
        assert!(w[0].contains(says), "{what}: {}", w[0]);
        assert!(!path.exists(), "{what}: moved out of the way");
        assert_eq!(quarantined(&kv), q0 + 1, "{what}");
        assert!(c.take(0, &prompt, prompt.len() - 1).is_none());
        assert!(c.take_warnings().is_empty(), "{what}: reported once only");
        std::fs::write(&path, &good).unwrap();
    }
    // The good file is used.
    let mut c = cache(layout.clone(), Some(&kv), 0);
    let hit = c.take(0, &prompt, prompt.len() - 1).expect("the good file");
    assert_eq!(hit.state.len(), toks.len());
    // Another scope never sees it; keys and chat sessions each have their own.
    assert!(c
        .take(scope_of(Some("alice")), &prompt, prompt.len() - 1)
        .is_none());
    assert!(c
        .take(session_scope("alice"), &prompt, prompt.len() - 1)
        .is_none());
    assert_ne!(session_scope("alice"), scope_of(Some("alice")));
    assert!(session_scope("alice") != 0 && scope_of(Some("alice")) != 0);
    assert_ne!(scope_of(Some("alice")), scope_of(Some("bob")));
    // A foreign file (other parameters: another kernel instruction set) under this layout's
    // name: detected at indexing, quarantined.
    let other = KvLayout::new(
        layout.store_id,
        0,
        "other-isa",
        "none",
        "gdr-r1",
        layout.kv_dims.clone(),
        layout.v_dims.clone(),
        layout.conv_dims.clone(),
        layout.recurrent_dims.clone(),
        None,
    );
    assert_ne!(other.param_hash, layout.param_hash);
    let foreign_dir = tmp.path().join("foreign");
    {
        let mut c = cache(other.clone(), Some(&foreign_dir), 0);
        c.put(0, state_of(&mut e, &toks));
    }
    let foreign = kv_files(&foreign_dir).pop().unwrap();
    std::fs::copy(&foreign, &path).unwrap();
    let q0 = quarantined(&kv);
    let mut c = cache(layout.clone(), Some(&kv), 0);
    assert!(c.take(0, &prompt, prompt.len() - 1).is_none());
    let w = c.take_warnings();
    assert!(
        w.len() == 1 && w[0].contains("another store or other parameters"),
        "{w:?}"
    );
    assert_eq!(quarantined(&kv), q0 + 1);
    // The other layout's own cache never reads this layout's files.
    std::fs::write(&path, &good).unwrap();
    let c = cache(other, Some(&kv), 0);
    assert_eq!(c.disk_files(), 0);
    // A newer cache-layout version: ignored, left in place, untouched.
    let mut newer = good.clone();
    newer[8..12].copy_from_slice(&(KV_LAYOUT_VERSION + 1).to_le_bytes());
    std::fs::write(&path, &newer).unwrap();
    let mut c = cache(layout.clone(), Some(&kv), 0);
    assert!(c.take(0, &prompt, prompt.len() - 1).is_none());
    let w = c.take_warnings();
    assert!(w.len() == 1 && w[0].contains("newer coli"), "{w:?}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        newer,
        "left in place, untouched"
    );
    // A file of the previous cache layout (3: recurrent states without their checkpoints)
    // carries `kv-layout=3` in its parameter hash and so in its name: never indexed, read,
    // reported or moved.
    std::fs::remove_file(&path).unwrap();
    let mut v3 = layout.clone();
    assert!(v3
        .params
        .contains(&format!("kv-layout={KV_LAYOUT_VERSION};")));
    v3.params = v3
        .params
        .replace(&format!("kv-layout={KV_LAYOUT_VERSION};"), "kv-layout=3;");
    v3.param_hash = xxhash_rust::xxh3::xxh3_64(v3.params.as_bytes());
    {
        let mut c = cache(v3, Some(&kv), 0);
        c.put(0, state_of(&mut e, &toks));
    }
    let old = kv_files(&kv).pop().expect("the layout-3 file");
    let mut bytes = std::fs::read(&old).unwrap();
    bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
    std::fs::write(&old, &bytes).unwrap();
    let q0 = quarantined(&kv);
    let mut c = cache(layout.clone(), Some(&kv), 0);
    assert_eq!(c.disk_files(), 0, "an older layout's file is not indexed");
    assert!(c.take(0, &prompt, prompt.len() - 1).is_none());
    assert!(c.take_warnings().is_empty());
    assert_eq!(quarantined(&kv), q0);
    assert_eq!(
        std::fs::read(&old).unwrap(),
        bytes,
        "left in place, untouched"
    );
}

#[test]
fn disk_budget_evicts_least_recently_used_and_longer_states_replace_their_prefixes() {
    let s = setup();
    let store = open_store(&s.dir, false, IoPreference::Auto);
    let mut e = engine(&store);
    let layout = e.kv_layout();
    let tmp = tempfile::tempdir().unwrap();
    let kv = tmp.path().join("kv");
    let a: Vec<u32> = (1..=8).collect();
    let b: Vec<u32> = (20..=27).collect();
    let one = {
        let mut c = cache(layout.clone(), Some(&kv), 0);
        c.put(0, state_of(&mut e, &a));
        std::fs::metadata(kv_files(&kv).pop().unwrap())
            .unwrap()
            .len()
    };
    // A state that extends `a` replaces its file (the longer one serves every prefix).
    let mut a2 = a.clone();
    a2.extend([30, 31]);
    let mut c = cache(layout.clone(), Some(&kv), 0);
    c.put(0, state_of(&mut e, &a2));
    assert_eq!(kv_files(&kv).len(), 1);
    let hit = c
        .take(0, &[1, 2, 3, 4, 5, 6, 7, 8, 9], 8)
        .expect("a prefix of a2");
    assert_eq!(hit.state.len(), 8);
    // A budget of about two files: a third evicts the least recently used.
    let size_a2 = std::fs::metadata(kv_files(&kv).pop().unwrap())
        .unwrap()
        .len();
    let mut c = PrefixCache::open(
        layout.clone(),
        &PrefixCacheOptions {
            ram_budget: 0,
            disk_dir: Some(kv.clone()),
            disk_budget: size_a2 + one + one / 2,
        },
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    c.put(0, state_of(&mut e, &b));
    assert_eq!(kv_files(&kv).len(), 2);
    std::thread::sleep(std::time::Duration::from_millis(20));
    // Reading a2 back makes it the most recently used: b is evicted next.
    assert!(c.take(0, &[1, 2, 3, 4], 3).is_some());
    std::thread::sleep(std::time::Duration::from_millis(20));
    let c3: Vec<u32> = (50..=57).collect();
    c.put(0, state_of(&mut e, &c3));
    let left = kv_files(&kv);
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(
        c.take(0, &[20, 21, 22], 2).is_none(),
        "b was the least recently used"
    );
    assert!(c.take(0, &[1, 2, 3], 2).is_some());
    assert!(c.take(0, &[50, 51, 52], 2).is_some());
}

/// Child entry: writes states of growing token lists to $COLI_KV_TEST_DIR forever (until
/// killed), from the store at $COLI_KV_TEST_STORE; $COLI_KV_TEST_SEED varies the tokens.
#[test]
#[ignore = "child process entry, run by writers_killed_mid_write_never_leave_a_used_half_file"]
fn child_kv_writer() {
    let Ok(dir) = std::env::var("COLI_KV_TEST_DIR") else {
        panic!("COLI_KV_TEST_DIR not set: this test is a child entry point");
    };
    let store = open_store(
        Path::new(&std::env::var("COLI_KV_TEST_STORE").unwrap()),
        false,
        IoPreference::Auto,
    );
    let seed: u32 = std::env::var("COLI_KV_TEST_SEED").unwrap().parse().unwrap();
    let mut e = Engine::new(
        &store,
        &EngineOptions {
            max_sequences: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let mut c = cache(e.kv_layout(), Some(Path::new(&dir)), 0);
    let base: Vec<u32> = (0..40).map(|i| (seed * 31 + i * 7) % 50 + 1).collect();
    let state = state_of(&mut e, &base);
    println!("WRITER-READY");
    for round in 0u64.. {
        // Prefixes of several lengths under changing scopes: every round writes a file (a
        // longer state of a scope also removes that scope's shorter ones).
        let n = 8 + (round as usize % 30);
        c.put(seed as u64 * 1000 + round % 50 + 1, state.copy_prefix(n));
    }
}

#[test]
fn writers_killed_mid_write_never_leave_a_used_half_file() {
    use rand::{Rng, SeedableRng};
    let s = setup();
    let tmp = tempfile::tempdir().unwrap();
    let kv = tmp.path().join("kv");
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(24);
    let store = open_store(&s.dir, false, IoPreference::Auto);
    let e = Engine::new(&store, &EngineOptions::default()).unwrap();
    let layout = e.kv_layout();
    for kill in 0..8 {
        // Two writers share the directory; one is killed at a random time, then the other.
        let spawn = |seed: u32| {
            std::process::Command::new(&exe)
                .args(["--ignored", "--exact", "child_kv_writer", "--nocapture"])
                .env("COLI_KV_TEST_DIR", &kv)
                .env("COLI_KV_TEST_STORE", &s.dir)
                .env("COLI_KV_TEST_SEED", seed.to_string())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        };
        let mut a = spawn(kill * 2);
        let mut b = spawn(kill * 2 + 1);
        std::thread::sleep(std::time::Duration::from_millis(rng.gen_range(150..900)));
        a.kill().unwrap();
        a.wait().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(rng.gen_range(0..200)));
        b.kill().unwrap();
        b.wait().unwrap();
        // Every file under a final name reads back whole; no file is reported bad.
        let mut c = cache(layout.clone(), Some(&kv), 0);
        let w = c.take_warnings();
        assert!(w.is_empty(), "kill {kill}: {w:?}");
        for f in kv_files(&kv) {
            coli_engine::prefix_cache::file::read_state(&f, &layout)
                .unwrap_or_else(|err| panic!("kill {kill}: {err}"));
        }
        // Temporary files of the killed writers are gone once the directory is reopened.
        let tmps = std::fs::read_dir(&kv)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp."))
            .count();
        assert_eq!(tmps, 0, "kill {kill}: stale temporary files");
    }
    assert!(!kv_files(&kv).is_empty(), "the writers wrote files");
}

/// The store id names a conversion (converter, parameters, source names, sizes and headers),
/// not the weights' bytes: two checkpoints that differ only in tensor data get the same id.
/// Their KV states must not be shared: the layout's parameter hash covers the checksums of
/// every tensor and record (MANIFEST and INDEX).
#[test]
fn same_store_id_other_weights_never_share_states() {
    let (_a, store_a) = convert_fixture("olmoe_fp8", "int4_store");
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    std::fs::create_dir(&ck).unwrap();
    let src = coli_tests::fixture_dir("olmoe_fp8");
    let mut changed = false;
    let mut names: Vec<_> = std::fs::read_dir(&src)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    names.sort();
    for p in names {
        let mut bytes = std::fs::read(&p).unwrap();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !changed && name.ends_with(".safetensors") {
            // The last bytes are tensor data, not the header.
            let n = bytes.len();
            for b in &mut bytes[n - 64..] {
                *b ^= 0x01;
            }
            changed = true;
        }
        std::fs::write(ck.join(&name), bytes).unwrap();
    }
    assert!(changed);
    let store_b = tmp.path().join("store");
    coli_convert::run(&coli_convert::Options {
        input: ck,
        output: store_b.clone(),
        encodings: coli_convert::Encodings::new(
            coli_store::Encoding::Int4 { group_size: 64 },
            coli_store::Encoding::Bf16,
            coli_store::Encoding::Int8,
        ),
        matrix_order: coli_store::MatrixOrder::Interleaved,
        threads: Some(1),
        progress: false,
    })
    .unwrap();
    let a = open_store(&store_a, false, IoPreference::Auto);
    let b = open_store(&store_b, false, IoPreference::Auto);
    let la = Engine::new(&a, &EngineOptions::default())
        .unwrap()
        .kv_layout();
    let lb = Engine::new(&b, &EngineOptions::default())
        .unwrap()
        .kv_layout();
    assert_eq!(
        la.store_id, lb.store_id,
        "the store id does not see tensor data"
    );
    assert_ne!(
        la.param_hash, lb.param_hash,
        "other weights, same parameter hash"
    );
}

/// Qwen3-Next's KV cache files hold each Gated DeltaNet layer's recurrent state and its
/// checkpoints (cache layout 4): a file serves its whole token list, and a shorter prefix from
/// the longest checkpoint at or before it, continuing bit for bit as a fresh prefill of those
/// tokens does; a prefix before every checkpoint is recomputed and the file kept; a file whose
/// recurrent state or one of its checkpoints is damaged is reported, quarantined and never
/// served.
#[test]
fn recurrent_states_are_served_at_their_length_or_a_checkpoint_and_never_when_damaged() {
    let (_tmp, dir) = convert_fixture("qwen3_next_bf16", "lossless_store");
    let store = open_store(&dir, false, IoPreference::Auto);
    let mut e = engine(&store);
    let layout = e.kv_layout();
    let (conv, rd) = (layout.conv_dims[0], layout.recurrent_dims[0]);
    assert!(rd > 0 && conv > 0, "layer 0 is recurrent");
    let tmp = tempfile::tempdir().unwrap();
    let kv = tmp.path().join("kv");
    // Fed in passes of 4: every recurrent layer checkpoints at 4 and 8.
    let toks: Vec<u32> = (1..=12).collect();
    let mut prompt = toks.clone();
    prompt.extend([40, 41]);
    {
        let mut c = cache(layout.clone(), Some(&kv), 0);
        c.put(0, state_of(&mut e, &toks));
        assert!(c.take_warnings().is_empty());
    }
    let path = kv_files(&kv).pop().unwrap();
    let good = std::fs::read(&path).unwrap();
    // (prompt length, positions it may reuse, positions served)
    for (p, reuse, served) in [(6, 5, 4), (11, 10, 8), (9, 8, 8), (14, 13, 12)] {
        let mut c = cache(layout.clone(), Some(&kv), 0);
        let hit = c.take(0, &prompt[..p], reuse).unwrap_or_else(|| {
            panic!(
                "a prefix of at most {reuse} from disk: {:?}",
                c.take_warnings()
            )
        });
        assert!(c.take_warnings().is_empty());
        assert_eq!(hit.state.tokens(), &toks[..served], "reuse {reuse}");
        let mut resumed = e.resume_sequence(hit.state).unwrap();
        let mut fresh = e.new_sequence().unwrap();
        feed(&mut e, &mut fresh, &toks[..served]);
        let rest = &prompt[served..p];
        let a = feed(&mut e, &mut resumed, rest);
        let b = feed(&mut e, &mut fresh, rest);
        assert!(
            same_bits(&a, &b),
            "reuse {reuse}: a recurrent state read back from disk at {served}"
        );
        if served == 12 {
            // The checkpoints came back with the state: rolling the resumed sequence back to
            // the one at 4 continues as a fresh prefill of 4 does.
            assert!(resumed.can_truncate(4), "the checkpoint at 4 came back");
            resumed.truncate(4);
            let mut fresh4 = e.new_sequence().unwrap();
            feed(&mut e, &mut fresh4, &toks[..4]);
            let a = feed(&mut e, &mut resumed, &[50, 51]);
            let b = feed(&mut e, &mut fresh4, &[50, 51]);
            assert!(same_bits(&a, &b), "back to a checkpoint read from disk");
        }
    }
    {
        // Before the first checkpoint: not served, nothing reported, the file kept.
        let mut c = cache(layout.clone(), Some(&kv), 0);
        assert!(c.take(0, &prompt[..4], 3).is_none());
        assert!(c.take_warnings().is_empty());
        assert!(path.exists());
    }
    // One bit of layer 0's recurrent state (after its four u64s and its convolution rows), and
    // one of its first checkpoint's state (after the state, the checkpoint count and the
    // checkpoint's two u64s): each found by the body checksum, whichever prefix is asked for.
    let header_len = 88 + 4 * toks.len() + 8;
    let state_at = header_len + 32 + toks.len() * conv * 4;
    let u64_at = |at: usize| u64::from_le_bytes(good[at..at + 8].try_into().unwrap());
    let ck = state_at + rd * 4;
    assert_eq!(
        (u64_at(ck), u64_at(ck + 8), u64_at(ck + 16)),
        (2, 4, 1),
        "layer 0: two checkpoints, the first of 4 positions with convolution rows from 1"
    );
    // A checkpoint without the convolution rows its next position reads, in a file whose
    // checksums were recomputed to match (XXH3 is no signature): refused as malformed, never
    // restored (a rollback there would read rows the state does not hold).
    {
        let mut b = good.clone();
        let rows_at = ck + 24 + rd * 4;
        let removed = 3 * conv * 4;
        b.drain(rows_at..rows_at + removed);
        b[ck + 16..ck + 24].copy_from_slice(&4u64.to_le_bytes());
        let body_len = (b.len() - header_len) as u64;
        b[64..72].copy_from_slice(&body_len.to_le_bytes());
        let body_sum = xxhash_rust::xxh3::xxh3_64(&b[header_len..]);
        b[72..80].copy_from_slice(&body_sum.to_le_bytes());
        let head_sum = xxhash_rust::xxh3::xxh3_64(&b[..header_len - 8]);
        b[header_len - 8..header_len].copy_from_slice(&head_sum.to_le_bytes());
        std::fs::write(&path, &b).unwrap();
        let q0 = quarantined(&kv);
        let mut c = cache(layout.clone(), Some(&kv), 0);
        assert!(c.take(0, &prompt[..6], 5).is_none());
        let w = c.take_warnings();
        assert!(
            w.len() == 1 && w[0].contains("malformed") && w[0].contains("checkpoint 0"),
            "{w:?}"
        );
        assert_eq!(quarantined(&kv), q0 + 1);
    }
    for (what, at, p, reuse) in [
        ("recurrent state", state_at + 100, prompt.len(), 13),
        ("checkpoint", state_at + rd * 4 + 8 + 16 + 100, 6, 5),
    ] {
        let mut b = good.clone();
        b[at] ^= 0x10;
        std::fs::write(&path, &b).unwrap();
        let q0 = quarantined(&kv);
        let mut c = cache(layout.clone(), Some(&kv), 0);
        assert!(c.take(0, &prompt[..p], reuse).is_none(), "{what}");
        let w = c.take_warnings();
        assert_eq!(w.len(), 1, "{what}: {w:?}");
        assert!(w[0].contains("body checksum"), "{what}: {}", w[0]);
        assert!(!path.exists(), "{what}: quarantined");
        assert_eq!(quarantined(&kv), q0 + 1);
    }
}

/// A Qwen3-Next conversation that ended on a verification pass (speculative decoding: its
/// recurrent layers still hold the states of the pass's rows) goes into the prefix cache and
/// resumes from RAM and from disk, continuing as the live sequence does; a RAM copy also
/// gives back a prefix ending at a verification row exactly.
#[test]
fn a_state_after_verification_rows_resumes() {
    let (_tmp, dir) = convert_fixture("qwen3_next_bf16", "lossless_store");
    let store = open_store(&dir, false, IoPreference::Auto);
    let mut e = engine(&store);
    let layout = e.kv_layout();
    let tmp = tempfile::tempdir().unwrap();
    let kv = tmp.path().join("kv");
    let mut live = e.new_sequence().unwrap();
    feed(&mut e, &mut live, &[5, 6, 7, 8, 9]);
    // A verification pass of 4 rows, 2 kept (the fed token and one accepted draft).
    let mut items = [BatchItem {
        seq: &mut live,
        ids: &[10, 11, 12, 13],
        logits: Some(Logits::All),
        verify: true,
    }];
    e.forward_many(&mut items).unwrap();
    live.truncate(7);
    assert!(live.can_truncate(6), "the first row's state is kept");
    // From a RAM copy, a prefix ending at a verification row comes back exactly.
    {
        let mut c = cache(layout.clone(), None, 1 << 30);
        c.put(0, e.fork_sequence(&live, usize::MAX).unwrap().into_state());
        let hit = c
            .take(0, &[5, 6, 7, 8, 9, 10, 30], 6)
            .expect("a prefix of 6");
        assert_eq!(hit.state.len(), 6);
        let mut part = e.resume_sequence(hit.state).unwrap();
        let mut cut = e.fork_sequence(&live, 6).unwrap();
        assert_eq!(cut.len(), 6);
        let a = feed(&mut e, &mut part, &[30]);
        let b = feed(&mut e, &mut cut, &[30]);
        assert!(same_bits(&a, &b), "a verification row's state");
    }
    let mut c = cache(layout.clone(), Some(&kv), 1 << 30);
    c.put(0, e.fork_sequence(&live, usize::MAX).unwrap().into_state());
    assert!(c.take_warnings().is_empty());
    let prompt = [5, 6, 7, 8, 9, 10, 11, 20];
    let hit = c.take(0, &prompt, 7).expect("a RAM hit");
    let mut ram = e
        .resume_sequence(hit.state)
        .expect("a state after verification resumes");
    let want = feed(&mut e, &mut live, &[20]);
    assert!(same_bits(&feed(&mut e, &mut ram, &[20]), &want), "from RAM");
    drop(ram);
    let mut c = cache(layout, Some(&kv), 0);
    let hit = c.take(0, &prompt, 7).expect("a disk hit");
    let mut disk = e.resume_sequence(hit.state).unwrap();
    assert!(
        same_bits(&feed(&mut e, &mut disk, &[20]), &want),
        "from disk"
    );
}
