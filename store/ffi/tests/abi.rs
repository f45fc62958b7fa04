//! The C ABI called from Rust on real stores written with `StoreWriter` in temp directories:
//! every entry point's results against the Rust API, error codes for NULL/misuse/damage, the
//! caller-buffer fetch, threads, struct sizes, and the header listing every exported function.

use coli_store::*;
use coli_store_ffi::*;
use std::collections::BTreeMap;
use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::{null, null_mut};

const H: usize = 80;
const I: usize = 48;

/// Deterministic pseudo-random bytes (xorshift), so each expert's record differs.
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn matrix(enc: Encoding, rows: usize, cols: usize, seed: u64) -> EncodedMatrix {
    let mut data = bytes(seed, enc.weight_bytes(rows, cols));
    if enc == Encoding::Fp8 {
        // 0x7F/0xFF are NaN codes, which a store never holds.
        for b in &mut data {
            if *b & 0x7F == 0x7F {
                *b &= 0xF7;
            }
        }
    }
    if enc == Encoding::Bf16 {
        // Keep the values finite: clear the top exponent bit of each u16 (high byte bit 6).
        for hi in data.iter_mut().skip(1).step_by(2) {
            *hi &= 0xBF;
        }
    }
    if let Encoding::Int4 { .. } = enc {
        // Odd column counts end with a high nibble of 8 (FORMAT.md section 6).
        if cols % 2 == 1 {
            let stride = cols.div_ceil(2);
            for r in 0..rows {
                let b = &mut data[r * stride + stride - 1];
                *b = (*b & 0x0F) | 0x80;
            }
        }
    }
    let (scales, e8m0_scales) = if enc.has_f32_scales() {
        let s = (0..enc.scale_count(rows, cols))
            .map(|k| 0.001 * (1 + (k as u64 * 7 + seed) % 97) as f32)
            .collect();
        (s, Vec::new())
    } else {
        // mxfp4: e8m0 exponents around 2^0, never the NaN code 255.
        let e = (0..enc.scale_count(rows, cols))
            .map(|k| 100 + ((k as u64 * 13 + seed) % 50) as u8)
            .collect();
        (Vec::new(), e)
    };
    EncodedMatrix {
        encoding: enc,
        rows,
        cols,
        data,
        scales,
        e8m0_scales,
        bias: None,
    }
}

/// [`matrix`] with a bias of `rows` values.
fn matrix_with_bias(enc: Encoding, rows: usize, cols: usize, seed: u64) -> EncodedMatrix {
    let mut m = matrix(enc, rows, cols, seed);
    m.bias = Some(
        (0..rows)
            .map(|r| (r as f32 - 7.5) * 0.25 + seed as f32)
            .collect(),
    );
    m
}

/// Writes a store with 2 expert layers (layers 1 and 2 of 3) of 3 experts each in `enc`, one
/// bf16 norm vector and one fp8 [96, 80] matrix; returns its directory.
fn write_store(dir: &Path, enc: Encoding) -> PathBuf {
    write_store_with(dir, enc, false)
}

/// [`write_store`], with a bias per expert matrix when `biases` (format version 2).
fn write_store_with(dir: &Path, enc: Encoding, biases: bool) -> PathBuf {
    let mk = if biases { matrix_with_bias } else { matrix };
    let target = dir.join("s.coli");
    let spec = StoreSpec {
        family: "mixtral".into(),
        config_json: br#"{"model_type":"mixtral","hidden_size":80}"#.to_vec(),
        num_layers: 3,
        expert_layers: vec![
            ExpertLayer {
                layer: 1,
                num_experts: 3,
            },
            ExpertLayer {
                layer: 2,
                num_experts: 3,
            },
        ],
        expert_encoding: enc,
        alignment: 4096,
        segment_max_bytes: 1 << 20,
        matrix_order: Default::default(),
        converter_version: "0.1.0".into(),
        parameter_defaults: Default::default(),
        parameters: BTreeMap::from([("experts".to_string(), enc.name())]),
        sources: vec![],
    };
    let WriterStart::Fresh(mut w) = StoreWriter::create_or_resume(&target, spec).unwrap() else {
        panic!("new target");
    };
    for layer in 1..3u32 {
        for e in 0..3u32 {
            let s = (layer * 10 + e) as u64 * 3;
            let (g, u, d) = (mk(enc, I, H, s), mk(enc, I, H, s + 1), mk(enc, H, I, s + 2));
            w.add_expert(ExpertKey::new(layer, e), H, I, [&g, &u, &d])
                .unwrap();
        }
    }
    w.add_dense("model.norm.weight", &[H], &matrix(Encoding::Bf16, 1, H, 99))
        .unwrap();
    w.add_dense(
        "model.layers.0.self_attn.q_proj.weight",
        &[96, H],
        &matrix(Encoding::Fp8, 96, H, 98),
    )
    .unwrap();
    w.finish().unwrap()
}

fn last_error() -> String {
    // SAFETY: never NULL, NUL-terminated, valid until the next failing call on this thread.
    unsafe { CStr::from_ptr(coli_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

fn cstr(p: *const c_char) -> String {
    assert!(!p.is_null());
    // SAFETY: the library returns NUL-terminated strings owned by the live store.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string()
}

fn open(dir: &Path, io_mode: u32, verify: bool) -> *mut ColiStore {
    let path = CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    let mut o = std::mem::MaybeUninit::<coli_open_options>::uninit();
    // SAFETY: `o` is writable; init fills it completely.
    assert_eq!(unsafe { coli_open_options_init(o.as_mut_ptr()) }, COLI_OK);
    // SAFETY: initialised by coli_open_options_init.
    let mut o = unsafe { o.assume_init() };
    o.io_mode = io_mode;
    o.verify_checksums = verify as u32;
    let mut s = null_mut();
    // SAFETY: valid path, options and out-pointer.
    let rc = unsafe { coli_store_open(path.as_ptr(), &o, &mut s) };
    assert_eq!(rc, COLI_OK, "{}", last_error());
    s
}

/// A 4096-aligned heap buffer for caller-buffer fetches.
struct Aligned(AlignedBuf);
impl Aligned {
    fn new(len: usize) -> Aligned {
        Aligned(AlignedBuf::new(len, 4096))
    }
    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_slice().as_mut_ptr()
    }
}

fn view_slices(v: &coli_matrix_view) -> (&[u8], &[f32]) {
    // SAFETY: views from the library point at data_len bytes / scale_count floats that live
    // as long as the handle, which the caller keeps alive while using the slices.
    unsafe {
        (
            std::slice::from_raw_parts(v.data, v.data_len),
            if v.scale_count == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(v.scales, v.scale_count)
            },
        )
    }
}

/// The view's e8m0 scale bytes (mxfp4; empty otherwise).
fn view_e8m0(v: &coli_matrix_view) -> &[u8] {
    if v.e8m0_scale_count == 0 {
        assert!(v.e8m0_scales.is_null());
        return &[];
    }
    // SAFETY: the library's view points at e8m0_scale_count bytes living with the handle.
    unsafe { std::slice::from_raw_parts(v.e8m0_scales, v.e8m0_scale_count) }
}

/// The bias `coli_expert_bias` gives for `which` (None for NULL / 0).
fn c_bias(h: *const ColiExpert, which: u32) -> Option<Vec<f32>> {
    let mut p: *const f32 = null();
    let mut n = usize::MAX;
    // SAFETY: live handle, writable outs.
    let rc = unsafe { coli_expert_bias(h, which, &mut p, &mut n) };
    assert_eq!(rc, COLI_OK, "{}", last_error());
    if p.is_null() {
        assert_eq!(n, 0);
        return None;
    }
    assert_eq!(p as usize % 64, 0, "bias sections are 64-byte aligned");
    // SAFETY: `n` f32 values at `p` live with the handle.
    Some(unsafe { std::slice::from_raw_parts(p, n) }.to_vec())
}

fn check_expert_against_rust(h: *const ColiExpert, b: &ExpertBuf) {
    let mut info = std::mem::MaybeUninit::<coli_expert_info>::uninit();
    // SAFETY: live handle, writable out.
    let rc = unsafe { coli_expert_get_info(h, info.as_mut_ptr()) };
    assert_eq!(rc, COLI_OK);
    // SAFETY: written on success.
    let info = unsafe { info.assume_init() };
    assert_eq!((info.layer, info.expert), (b.key.layer, b.key.expert));
    assert_eq!(info.encoding, b.encoding.id() as u32);
    assert_eq!(info.group_size, b.encoding.group_size() as u32);
    assert_eq!((info.hidden, info.intermediate), (H, I));
    assert_eq!(info.record_len, b.len_bytes());
    // SAFETY: record_len bytes at `record` live with the handle.
    let rec = unsafe { std::slice::from_raw_parts(info.record, info.record_len) };
    assert_eq!(rec, b.bytes());
    assert_eq!(
        info.flags,
        if b.has_biases() {
            COLI_RECORD_FLAG_BIASES
        } else {
            0
        }
    );
    assert_eq!(info.reserved, 0);
    for (which, m, bias) in [
        (COLI_MATRIX_GATE, b.gate(), b.gate_bias()),
        (COLI_MATRIX_UP, b.up(), b.up_bias()),
        (COLI_MATRIX_DOWN, b.down(), b.down_bias()),
    ] {
        assert_eq!(c_bias(h, which).as_deref(), bias);
        let mut v = std::mem::MaybeUninit::<coli_matrix_view>::uninit();
        // SAFETY: live handle, writable out.
        let rc = unsafe { coli_expert_matrix(h, which, v.as_mut_ptr()) };
        assert_eq!(rc, COLI_OK);
        // SAFETY: written on success.
        let v = unsafe { v.assume_init() };
        assert_eq!((v.rows, v.cols), (m.rows(), m.cols()));
        assert_eq!(v.encoding, m.encoding().id() as u32);
        let (d, s) = view_slices(&v);
        assert_eq!(d, m.data());
        assert_eq!(s, m.scales());
        assert_eq!(view_e8m0(&v), m.e8m0_scales());
        assert_eq!(v.scales.is_null(), m.scales().is_empty());
        if !v.e8m0_scales.is_null() {
            assert_eq!(
                v.e8m0_scales as usize % 64,
                0,
                "e8m0 sections are 64-byte aligned"
            );
        }
        if !v.scales.is_null() {
            assert_eq!(
                v.scales as usize % 64,
                0,
                "scale sections are 64-byte aligned"
            );
        }
        let mut row = vec![0f32; m.cols()];
        let mut want = vec![0f32; m.cols()];
        for r in [0, m.rows() - 1] {
            // SAFETY: the view is alive; `row` has cols floats.
            let rc = unsafe { coli_dequantize_row(&v, r, row.as_mut_ptr(), row.len()) };
            assert_eq!(rc, COLI_OK, "{}", last_error());
            m.dequantize_row(r, &mut want);
            // Bitwise: random f32/bf16 test data includes NaN patterns.
            assert!(
                row.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "row {r}"
            );
        }
        // Out of range row and wrong length are errors, not UB.
        // SAFETY: as above.
        let rc = unsafe { coli_dequantize_row(&v, m.rows(), row.as_mut_ptr(), row.len()) };
        assert_eq!(rc, COLI_ERR_INVALID_ARGUMENT);
        // SAFETY: as above.
        let rc = unsafe { coli_dequantize_row(&v, 0, row.as_mut_ptr(), row.len() - 1) };
        assert_eq!(rc, COLI_ERR_INVALID_ARGUMENT);
        let mut bad = v;
        bad.data_len -= 1;
        // SAFETY: the inconsistent view is rejected before any read.
        let rc = unsafe { coli_dequantize_row(&bad, 0, row.as_mut_ptr(), row.len()) };
        assert_eq!(rc, COLI_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("do not match"), "{}", last_error());
        // The scales in the other field than the encoding's are refused too.
        let mut swapped = v;
        std::mem::swap(&mut swapped.scale_count, &mut swapped.e8m0_scale_count);
        if swapped.scale_count != v.scale_count {
            // SAFETY: the inconsistent view is rejected before any read.
            let rc = unsafe { coli_dequantize_row(&swapped, 0, row.as_mut_ptr(), row.len()) };
            assert_eq!(rc, COLI_ERR_INVALID_ARGUMENT);
        }
    }
    // Another `which` is refused by the bias call as by the matrix call.
    let (mut p, mut n) = (null(), 0usize);
    // SAFETY: live handle, writable outs.
    let rc = unsafe { coli_expert_bias(h, 3, &mut p, &mut n) };
    assert_eq!(rc, COLI_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("which = 3"), "{}", last_error());
}

fn run_encoding(enc: Encoding) {
    run_encoding_with(enc, false)
}

fn run_encoding_with(enc: Encoding, biases: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_store_with(tmp.path(), enc, biases);
    let rust = Store::open_with(
        &dir,
        &OpenOptions {
            io: IoPreference::Buffered,
            ..Default::default()
        },
    )
    .unwrap();
    let s = open(&dir, COLI_IO_BUFFERED, true);

    let mut p: *const c_char = null();
    // SAFETY: (every call in this block) `s` is a live handle and every out-pointer is a valid local.
    unsafe {
        assert_eq!(coli_store_family(s, &mut p), COLI_OK);
        assert_eq!(cstr(p), "mixtral");
        assert_eq!(coli_store_id(s, &mut p), COLI_OK);
        assert_eq!(cstr(p), rust.manifest().store_id.to_string());
        assert_eq!(coli_store_config_json(s, &mut p), COLI_OK);
        let cfg: serde_json::Value = serde_json::from_str(&cstr(p)).unwrap();
        assert_eq!(cfg["hidden_size"], 80);
        let mut n = 0u32;
        assert_eq!(coli_store_num_layers(s, &mut n), COLI_OK);
        assert_eq!(n, 3);
        let mut count = 0usize;
        assert_eq!(coli_store_expert_layer_count(s, &mut count), COLI_OK);
        assert_eq!(count, 2);
        let (mut l, mut ne) = (0u32, 0u32);
        assert_eq!(coli_store_expert_layer(s, 1, &mut l, &mut ne), COLI_OK);
        assert_eq!((l, ne), (2, 3));
        assert_eq!(
            coli_store_expert_layer(s, 2, &mut l, &mut ne),
            COLI_ERR_INVALID_ARGUMENT
        );
        assert_eq!(coli_store_layer_num_experts(s, 1, &mut ne), COLI_OK);
        assert_eq!(ne, 3);
        assert_eq!(
            coli_store_layer_num_experts(s, 0, &mut ne),
            COLI_ERR_NOT_FOUND
        );
        assert!(last_error().contains("layer 0"), "{}", last_error());
        let (mut e, mut g) = (0u32, 0u32);
        assert_eq!(coli_store_expert_encoding(s, &mut e, &mut g), COLI_OK);
        assert_eq!((e, g), (enc.id() as u32, enc.group_size() as u32));
        let (mut hh, mut ii) = (0u32, 0u32);
        assert_eq!(coli_store_expert_dims(s, 2, 1, &mut hh, &mut ii), COLI_OK);
        assert_eq!((hh, ii), (H as u32, I as u32));
        assert_eq!(
            coli_store_expert_dims(s, 2, 3, &mut hh, &mut ii),
            COLI_ERR_NOT_FOUND
        );
        let mut rl = 0usize;
        assert_eq!(coli_expert_record_len(s, 1, 0, &mut rl), COLI_OK);
        assert_eq!(
            rl as u64,
            rust.record(ExpertKey::new(1, 0)).unwrap().length.get()
        );
        let mut al = 0usize;
        assert_eq!(coli_store_buffer_alignment(s, &mut al), COLI_OK);
        assert_eq!(al, 4096);
        let mut io = 9u32;
        assert_eq!(coli_store_io_mode(s, &mut io), COLI_OK);
        assert_eq!(io, COLI_IO_BUFFERED);
    }

    // Single, batch and caller-buffer fetches give the same bytes as the Rust API.
    let keys: Vec<coli_expert_key> = (1..3)
        .flat_map(|l| {
            (0..3).map(move |e| coli_expert_key {
                layer: l,
                expert: e,
            })
        })
        .collect();
    let want = rust
        .fetch(
            &keys
                .iter()
                .map(|k| ExpertKey::new(k.layer, k.expert))
                .collect::<Vec<_>>(),
        )
        .unwrap();
    let mut hs = vec![null_mut(); keys.len()];
    // SAFETY: `keys` and `hs` hold keys.len() entries.
    let rc = unsafe { coli_fetch_experts(s, keys.as_ptr(), keys.len(), hs.as_mut_ptr()) };
    assert_eq!(rc, COLI_OK, "{}", last_error());
    for (h, b) in hs.iter().zip(&want) {
        check_expert_against_rust(*h, b);
        // SAFETY: fetched above, released once.
        unsafe { coli_expert_release(*h) };
    }
    let mut one = null_mut();
    // SAFETY: live handle, valid out.
    assert_eq!(unsafe { coli_fetch_expert(s, 2, 2, &mut one) }, COLI_OK);
    check_expert_against_rust(one, &want[5]);
    let len = want[5].len_bytes();
    let mut buf = Aligned::new(len + 4096);
    let mut into = null_mut();
    // SAFETY: `buf` has len + 4096 writable bytes, aligned to 4096.
    let rc = unsafe { coli_fetch_expert_into(s, 2, 2, buf.ptr().cast(), len, &mut into) };
    assert_eq!(rc, COLI_OK, "{}", last_error());
    check_expert_against_rust(into, &want[5]);
    // SAFETY: released once; `buf` outlives the handle.
    unsafe { coli_expert_release(into) };
    // Too small and misaligned buffers are refused.
    // SAFETY: the call only checks the buffer's size before any write.
    let rc = unsafe { coli_fetch_expert_into(s, 2, 2, buf.ptr().cast(), len - 1, &mut into) };
    assert_eq!(rc, COLI_ERR_BUFFER);
    assert!(last_error().contains("smaller"), "{}", last_error());
    // SAFETY: `buf.ptr() + 64` has len + 4032 >= len writable bytes; refused for alignment.
    let rc = unsafe { coli_fetch_expert_into(s, 2, 2, buf.ptr().add(64).cast(), len, &mut into) };
    assert_eq!(rc, COLI_ERR_BUFFER);
    assert!(last_error().contains("aligned"), "{}", last_error());
    // An expert handle outlives its store.
    let mut st = coli_stats::default();
    // SAFETY: live handle, valid out.
    assert_eq!(unsafe { coli_store_stats(s, &mut st) }, COLI_OK);
    assert_eq!(st.reads, keys.len() as u64 + 2);
    assert_eq!(
        st.bytes_read,
        want.iter().map(|b| b.len_bytes() as u64).sum::<u64>() + 2 * len as u64
    );

    // Dense tensors.
    // SAFETY: (every call in this block) live handle, valid out-pointers, NUL-terminated names.
    unsafe {
        let mut n = 0usize;
        assert_eq!(coli_dense_count(s, &mut n), COLI_OK);
        assert_eq!(n, 2);
        let mut p: *const c_char = null();
        assert_eq!(coli_dense_name(s, 1, &mut p), COLI_OK);
        assert_eq!(cstr(p), rust.manifest().dense[1].name);
        assert_eq!(coli_dense_name(s, 2, &mut p), COLI_ERR_INVALID_ARGUMENT);
        for name in [
            "model.norm.weight",
            "model.layers.0.self_attn.q_proj.weight",
        ] {
            let c = CString::new(name).unwrap();
            let mut v = std::mem::MaybeUninit::<coli_dense_view>::uninit();
            assert_eq!(
                coli_dense_get(s, c.as_ptr(), v.as_mut_ptr()),
                COLI_OK,
                "{}",
                last_error()
            );
            let v = v.assume_init();
            let t = rust.dense(name).unwrap();
            assert_eq!(cstr(v.name), name);
            assert_eq!(v.ndim as usize, t.shape.len());
            assert_eq!(&v.shape[..t.shape.len()], t.shape);
            let (d, sc) = view_slices(&v.matrix);
            assert_eq!(d, t.data);
            assert_eq!(sc, t.scales);
            let m = t.matrix();
            let mut row = vec![0f32; m.cols()];
            assert_eq!(
                coli_dequantize_row(&v.matrix, m.rows() - 1, row.as_mut_ptr(), m.cols()),
                COLI_OK
            );
            let want = t.to_f32();
            let want = &want[(m.rows() - 1) * m.cols()..];
            assert!(row
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        let c = CString::new("no.such.tensor").unwrap();
        let mut v = std::mem::MaybeUninit::<coli_dense_view>::uninit();
        assert_eq!(
            coli_dense_get(s, c.as_ptr(), v.as_mut_ptr()),
            COLI_ERR_NOT_FOUND
        );
        assert!(last_error().contains("no.such.tensor"), "{}", last_error());
    }
    // SAFETY: closed once; `one` stays valid after the close.
    unsafe { coli_store_close(s) };
    check_expert_against_rust(one, &want[5]);
    // SAFETY: released once.
    unsafe { coli_expert_release(one) };
}

#[test]
fn int4_store_through_the_c_abi() {
    run_encoding(Encoding::Int4 { group_size: 64 });
}

#[test]
fn fp8_int8_bf16_f32_stores_through_the_c_abi() {
    for enc in [
        Encoding::Fp8,
        Encoding::Int8,
        Encoding::Bf16,
        Encoding::F32,
        Encoding::Int4 { group_size: 32 },
    ] {
        run_encoding(enc);
    }
}

/// Format version 2 through the C ABI (version 2): mxfp4 records with biases (e8m0 scales in
/// `e8m0_scales`, the library's dequantization against the Rust reader's), int4 records with
/// biases, and mxfp4 without.
#[test]
fn mxfp4_and_bias_records_through_the_c_abi() {
    run_encoding_with(Encoding::Mxfp4, true);
    run_encoding_with(Encoding::Int4 { group_size: 64 }, true);
    run_encoding_with(Encoding::Mxfp4, false);
    // Format version 5: mxfp8's e8m0 scales go through `e8m0_scales` as mxfp4's do.
    run_encoding_with(Encoding::Mxfp8, false);
}

#[test]
fn null_arguments_give_error_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_store(tmp.path(), Encoding::Int8);
    let s = open(&dir, COLI_IO_AUTO, true);
    let mut u = 0u32;
    let mut z = 0usize;
    let mut p: *const c_char = null();
    let mut e: *mut ColiExpert = null_mut();
    // SAFETY: (every call in this block) every pointer is NULL or valid; NULLs must be rejected.
    unsafe {
        assert_eq!(coli_open_options_init(null_mut()), COLI_ERR_NULL_ARGUMENT);
        assert_eq!(
            coli_store_open(null(), null(), &mut null_mut()),
            COLI_ERR_NULL_ARGUMENT
        );
        assert!(last_error().contains("path"), "{}", last_error());
        let path = CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(
            coli_store_open(path.as_ptr(), null(), null_mut()),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(coli_store_family(null(), &mut p), COLI_ERR_NULL_ARGUMENT);
        assert_eq!(coli_store_family(s, null_mut()), COLI_ERR_NULL_ARGUMENT);
        assert_eq!(coli_store_id(s, null_mut()), COLI_ERR_NULL_ARGUMENT);
        assert_eq!(
            coli_store_config_json(null(), &mut p),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(coli_store_num_layers(s, null_mut()), COLI_ERR_NULL_ARGUMENT);
        assert_eq!(
            coli_store_expert_layer_count(null(), &mut z),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            coli_store_expert_layer(s, 0, &mut u, null_mut()),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            coli_store_layer_num_experts(s, 1, null_mut()),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            coli_store_expert_encoding(s, null_mut(), &mut u),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            coli_store_expert_dims(s, 1, 0, &mut u, null_mut()),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            coli_expert_record_len(s, 1, 0, null_mut()),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            coli_store_buffer_alignment(null(), &mut z),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(coli_store_io_mode(s, null_mut()), COLI_ERR_NULL_ARGUMENT);
        assert_eq!(coli_store_stats(s, null_mut()), COLI_ERR_NULL_ARGUMENT);
        assert_eq!(
            coli_fetch_expert(null(), 1, 0, &mut e),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            coli_fetch_expert(s, 1, 0, null_mut()),
            COLI_ERR_NULL_ARGUMENT
        );
        let k = coli_expert_key {
            layer: 1,
            expert: 0,
        };
        assert_eq!(
            coli_fetch_experts(s, null(), 1, &mut e),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            coli_fetch_experts(s, &k, 1, null_mut()),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(coli_fetch_experts(s, null(), 0, null_mut()), COLI_OK);
        assert_eq!(
            coli_fetch_expert_into(s, 1, 0, null_mut(), 1 << 20, &mut e),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            coli_expert_get_info(null(), null_mut()),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            coli_expert_matrix(null(), 0, null_mut()),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(coli_dense_count(s, null_mut()), COLI_ERR_NULL_ARGUMENT);
        assert_eq!(coli_dense_name(s, 0, null_mut()), COLI_ERR_NULL_ARGUMENT);
        assert_eq!(
            coli_dense_get(s, null(), null_mut()),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            coli_dequantize_row(null(), 0, null_mut(), 0),
            COLI_ERR_NULL_ARGUMENT
        );
        coli_expert_release(null_mut());
        coli_store_close(null_mut());
        // Misuse that is not NULL: bad `which`, unknown io mode, short struct, mirrors.
        assert_eq!(coli_fetch_expert(s, 1, 0, &mut e), COLI_OK);
        let mut v = std::mem::MaybeUninit::<coli_matrix_view>::uninit();
        assert_eq!(
            coli_expert_matrix(e, 3, v.as_mut_ptr()),
            COLI_ERR_INVALID_ARGUMENT
        );
        let (mut bp, mut bn) = (null(), 0usize);
        assert_eq!(
            coli_expert_bias(null(), 0, &mut bp, &mut bn),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            coli_expert_bias(e, 0, null_mut(), &mut bn),
            COLI_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            coli_expert_bias(e, 0, &mut bp, null_mut()),
            COLI_ERR_NULL_ARGUMENT
        );
        coli_expert_release(e);
        let mut o = std::mem::MaybeUninit::<coli_open_options>::uninit();
        assert_eq!(coli_open_options_init(o.as_mut_ptr()), COLI_OK);
        let o = o.assume_init();
        let mut out = null_mut();
        let bad_io = coli_open_options { io_mode: 7, ..o };
        assert_eq!(
            coli_store_open(path.as_ptr(), &bad_io, &mut out),
            COLI_ERR_INVALID_ARGUMENT
        );
        let short = coli_open_options {
            struct_size: 8,
            ..o
        };
        assert_eq!(
            coli_store_open(path.as_ptr(), &short, &mut out),
            COLI_ERR_INVALID_ARGUMENT
        );
        assert!(
            last_error().contains("coli_open_options_init"),
            "{}",
            last_error()
        );
        let m = CString::new("/mnt/mirror").unwrap();
        let dirs = [m.as_ptr()];
        let mirrors = coli_open_options {
            mirror_dirs: dirs.as_ptr(),
            mirror_count: 1,
            ..o
        };
        // A mirror directory that does not exist is an I/O error naming it.
        assert_eq!(
            coli_store_open(path.as_ptr(), &mirrors, &mut out),
            COLI_ERR_IO
        );
        assert!(last_error().contains("/mnt/mirror"), "{}", last_error());
        let null_dirs = [std::ptr::null::<std::ffi::c_char>()];
        let nulls = coli_open_options {
            mirror_dirs: null_dirs.as_ptr(),
            mirror_count: 1,
            ..o
        };
        assert_eq!(
            coli_store_open(path.as_ptr(), &nulls, &mut out),
            COLI_ERR_NULL_ARGUMENT
        );
        assert!(out.is_null(), "no handle on failure");
        coli_store_close(s);
    }
}

#[test]
fn store_errors_map_to_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_store(tmp.path(), Encoding::Int4 { group_size: 64 });
    let try_open = |d: &Path| {
        let path = CString::new(d.as_os_str().as_encoded_bytes()).unwrap();
        let mut s = null_mut();
        // SAFETY: valid path and out-pointer; NULL options = defaults.
        let rc = unsafe { coli_store_open(path.as_ptr(), null(), &mut s) };
        // SAFETY: NULL or a live handle, closed once.
        unsafe { coli_store_close(s) };
        rc
    };
    assert_eq!(try_open(&tmp.path().join("missing")), COLI_ERR_IO);
    assert!(last_error().contains("MANIFEST"), "{}", last_error());
    // A flipped byte in MANIFEST's body: crc32 mismatch.
    let copy = tmp.path().join("damaged");
    std::fs::create_dir_all(copy.join("segments")).unwrap();
    for f in ["MANIFEST", "INDEX", "dense.bin", "segments/seg-00000.bin"] {
        std::fs::copy(dir.join(f), copy.join(f)).unwrap();
    }
    let mut m = std::fs::read(copy.join("MANIFEST")).unwrap();
    let n = m.len();
    m[n - 3] ^= 0x01;
    std::fs::write(copy.join("MANIFEST"), &m).unwrap();
    assert_eq!(try_open(&copy), COLI_ERR_FORMAT);
    assert!(last_error().contains("crc32"), "{}", last_error());
    std::fs::copy(dir.join("MANIFEST"), copy.join("MANIFEST")).unwrap();
    // A flipped byte inside layer 2 expert 1's record: both fetch kinds report the checksum.
    let rust = Store::open(&copy).unwrap();
    let r = *rust.record(ExpertKey::new(2, 1)).unwrap();
    drop(rust);
    let mut seg = std::fs::read(copy.join("segments/seg-00000.bin")).unwrap();
    seg[r.offset.get() as usize + 100] ^= 0x40;
    std::fs::write(copy.join("segments/seg-00000.bin"), &seg).unwrap();
    let s = open(&copy, COLI_IO_BUFFERED, true);
    let mut e = null_mut();
    // SAFETY: live handle, valid out.
    let rc = unsafe { coli_fetch_expert(s, 2, 1, &mut e) };
    assert_eq!(rc, COLI_ERR_CHECKSUM);
    assert!(
        last_error().contains("layer 2 expert 1"),
        "{}",
        last_error()
    );
    assert!(e.is_null());
    let mut buf = Aligned::new(r.length.get() as usize);
    // SAFETY: `buf` holds the record length, 4096-aligned.
    let rc = unsafe {
        coli_fetch_expert_into(s, 2, 1, buf.ptr().cast(), r.length.get() as usize, &mut e)
    };
    assert_eq!(rc, COLI_ERR_CHECKSUM);
    assert!(last_error().contains("seg-00000.bin"), "{}", last_error());
    // The other experts still read; the batch fetch is all-or-nothing.
    // SAFETY: live handle, valid out.
    assert_eq!(unsafe { coli_fetch_expert(s, 2, 0, &mut e) }, COLI_OK);
    // SAFETY: released once.
    unsafe { coli_expert_release(e) };
    let keys = [
        coli_expert_key {
            layer: 2,
            expert: 0,
        },
        coli_expert_key {
            layer: 2,
            expert: 1,
        },
    ];
    let mut outs = [null_mut(); 2];
    // SAFETY: 2 keys and 2 out slots.
    let rc = unsafe { coli_fetch_experts(s, keys.as_ptr(), 2, outs.as_mut_ptr()) };
    assert_eq!(rc, COLI_ERR_CHECKSUM);
    assert!(outs.iter().all(|p| p.is_null()));
    // SAFETY: closed once.
    unsafe { coli_store_close(s) };
    // Without verification the damaged record is returned as is.
    let s = open(&copy, COLI_IO_BUFFERED, false);
    // SAFETY: `buf` holds the record length, 4096-aligned; live handle.
    let rc = unsafe {
        coli_fetch_expert_into(s, 2, 1, buf.ptr().cast(), r.length.get() as usize, &mut e)
    };
    assert_eq!(rc, COLI_OK);
    // SAFETY: released once, then the store closed once.
    unsafe {
        coli_expert_release(e);
        coli_store_close(s);
    }
}

#[test]
fn one_store_handle_serves_many_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_store(tmp.path(), Encoding::Fp8);
    let s = open(&dir, COLI_IO_AUTO, true);
    let want: Vec<Vec<u8>> = {
        let rust = Store::open(&dir).unwrap();
        (0..6)
            .map(|i| {
                rust.fetch_one(ExpertKey::new(1 + i / 3, i % 3))
                    .unwrap()
                    .bytes()
                    .to_vec()
            })
            .collect()
    };
    // Raw pointers are not Send; the handle is documented as shareable, so pass its address.
    let addr = s as usize;
    std::thread::scope(|sc| {
        for t in 0..4u32 {
            let want = &want;
            sc.spawn(move || {
                let s = addr as *const ColiStore;
                let mut buf = Aligned::new(1 << 16);
                for round in 0..12u32 {
                    let i = (t + round) % 6;
                    let (l, x) = (1 + i / 3, i % 3);
                    let mut e = null_mut();
                    let rc = if round % 2 == 0 {
                        // SAFETY: the store outlives the scope; valid out.
                        unsafe { coli_fetch_expert(s, l, x, &mut e) }
                    } else {
                        // SAFETY: each thread has its own 64 KiB aligned buffer.
                        unsafe {
                            coli_fetch_expert_into(s, l, x, buf.ptr().cast(), 1 << 16, &mut e)
                        }
                    };
                    assert_eq!(rc, COLI_OK, "{}", last_error());
                    let mut info = std::mem::MaybeUninit::<coli_expert_info>::uninit();
                    // SAFETY: live handle, valid out.
                    let rc = unsafe { coli_expert_get_info(e, info.as_mut_ptr()) };
                    assert_eq!(rc, COLI_OK);
                    // SAFETY: written on success; record_len bytes live with the handle.
                    let got = unsafe {
                        let info = info.assume_init();
                        std::slice::from_raw_parts(info.record, info.record_len).to_vec()
                    };
                    assert_eq!(got, want[i as usize]);
                    // SAFETY: released once.
                    unsafe { coli_expert_release(e) };
                }
            });
        }
    });
    let mut st = coli_stats::default();
    // SAFETY: live handle, valid out.
    assert_eq!(unsafe { coli_store_stats(s, &mut st) }, COLI_OK);
    assert_eq!(st.reads, 48);
    // SAFETY: closed once.
    unsafe { coli_store_close(s) };
}

#[test]
fn struct_layouts_match_the_header() {
    // The header's structs (store/ffi/include/coli_store.h) on LP64 targets; the C test
    // program asserts the same sizes with sizeof.
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<coli_open_options>(), 32);
    assert_eq!(offset_of!(coli_open_options, mirror_dirs), 16);
    assert_eq!(size_of::<coli_stats>(), 16);
    assert_eq!(size_of::<coli_expert_key>(), 8);
    assert_eq!(size_of::<coli_expert_info>(), 64);
    assert_eq!(offset_of!(coli_expert_info, record), 32);
    assert_eq!(offset_of!(coli_expert_info, flags), 56);
    assert_eq!(size_of::<coli_matrix_view>(), 72);
    assert_eq!(offset_of!(coli_matrix_view, encoding), 48);
    assert_eq!(offset_of!(coli_matrix_view, e8m0_scales), 56);
    assert_eq!(size_of::<coli_dense_view>(), 104);
    assert_eq!(offset_of!(coli_dense_view, ndim), 80);
    assert_eq!(offset_of!(coli_dense_view, shape), 88);
    assert_eq!(coli_abi_version(), 2);
    assert_eq!(coli_format_version(), FORMAT_VERSION);
}

#[test]
fn header_declares_every_exported_function_and_constant() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(root.join("include/coli_store.h")).unwrap();
    let mut n = 0;
    for f in std::fs::read_dir(root.join("src")).unwrap() {
        let src = std::fs::read_to_string(f.unwrap().path()).unwrap();
        for part in src.split("extern \"C\" fn ").skip(1) {
            let name = &part[..part.find('(').unwrap()];
            let declared =
                header.contains(&format!(" {name}(")) || header.contains(&format!("*{name}("));
            assert!(declared, "coli_store.h does not declare {name}");
            n += 1;
        }
        for line in src.lines() {
            if let Some(rest) = line.strip_prefix("pub const COLI_") {
                let (name, val) = rest.split_once(':').unwrap();
                let val = val.split('=').nth(1).unwrap().trim().trim_end_matches(';');
                let decl = format!("COLI_{name} = {val}");
                let decl_u = format!("COLI_{name} {val}u");
                assert!(
                    header.contains(&decl) || header.contains(&decl_u),
                    "coli_store.h lacks `{decl}`"
                );
            }
        }
    }
    assert!(n >= 30, "found only {n} exported functions");
}

#[test]
fn mirrors_through_the_c_abi_give_the_same_experts() {
    let t = tempfile::tempdir().unwrap();
    let dir = write_store(t.path(), Encoding::Int8);
    let m = t.path().join("mirror");
    std::fs::create_dir(&m).unwrap();
    let store = Store::open(&dir).unwrap();
    coli_store::mirror::copy::copy_segments(&store, &m, 0).unwrap();
    let path = CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    let mdir = CString::new(m.as_os_str().as_encoded_bytes()).unwrap();
    let dirs = [mdir.as_ptr()];
    let mut o = std::mem::MaybeUninit::<coli_open_options>::uninit();
    // SAFETY: `o` is writable; init fills it completely.
    assert_eq!(unsafe { coli_open_options_init(o.as_mut_ptr()) }, COLI_OK);
    // SAFETY: initialised by coli_open_options_init.
    let o = coli_open_options {
        mirror_dirs: dirs.as_ptr(),
        mirror_count: 1,
        ..unsafe { o.assume_init() }
    };
    let mut s = null_mut();
    // SAFETY: valid path, options (one valid mirror path) and out-pointer.
    let rc = unsafe { coli_store_open(path.as_ptr(), &o, &mut s) };
    assert_eq!(rc, COLI_OK, "{}", last_error());
    for r in store.index() {
        let k = r.key();
        let mut e = null_mut();
        // SAFETY: live handle, writable out.
        let rc = unsafe { coli_fetch_expert(s, k.layer, k.expert, &mut e) };
        assert_eq!(rc, COLI_OK, "{}", last_error());
        check_expert_against_rust(e, &store.fetch_one(k).unwrap());
        // SAFETY: a handle from coli_fetch_expert, released once.
        unsafe { coli_expert_release(e) };
    }
    // SAFETY: a handle from coli_store_open, closed once.
    unsafe { coli_store_close(s) };
}
