//! Format version 7: matrices stored in the interleaved row order (FORMAT.md sections 5 and 7).
//! A store written `MatrixOrder::Interleaved` reads back the same numbers as the row-major one,
//! resumes a torn build, maps its records in place, and a store that claims the order where
//! its version or its matrices do not allow it is refused, naming the record or tensor.

mod common;
use coli_store::{ExpertKey, MatrixOrder, MatrixView, Store, StoreWriter, WriterStart};
use common::*;

/// A model whose gate and up ([48, 64] int4) and one dense matrix (layer 1's `q_proj`, [65, 64]
/// int8) have the interleaved order; down ([64, 48]) and the other dense tensors (vectors, bf16,
/// f32, a 12-row int8 table) do not.
fn model(order: MatrixOrder) -> Model {
    let mut m = make_model(&ModelParams {
        dense: 6,
        ..Default::default()
    });
    m.spec.matrix_order = order;
    m
}

/// Every row of `a` and `b` decodes to the same values, bit for bit (random f32 test tensors
/// hold NaNs).
fn same_rows(a: &MatrixView<'_>, b: &MatrixView<'_>, what: &str) {
    assert_eq!((a.rows(), a.cols()), (b.rows(), b.cols()), "{what}");
    let (mut ra, mut rb) = (vec![0f32; a.cols()], vec![0f32; b.cols()]);
    for r in 0..a.rows() {
        a.dequantize_row(r, &mut ra);
        b.dequantize_row(r, &mut rb);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&ra), bits(&rb), "{what} row {r}");
    }
}

#[test]
fn interleaved_stores_read_the_same_numbers_as_row_major_ones() {
    let t = tempdir();
    let (rm, il) = (t.path().join("rm.coli"), t.path().join("il.coli"));
    let m = model(MatrixOrder::Interleaved);
    write_model(&rm, &model(MatrixOrder::RowMajor));
    write_model(&il, &m);
    let (a, b) = (Store::open(&rm).unwrap(), Store::open(&il).unwrap());
    assert_eq!(a.manifest().format_version, 1);
    assert_eq!(b.manifest().format_version, 7);
    for (k, h, i, mats) in &m.experts {
        let (x, y) = (a.fetch_one(*k).unwrap(), b.fetch_one(*k).unwrap());
        assert_eq!(x.interleaved(), [false; 3]);
        assert_eq!(
            y.interleaved(),
            [true, true, false],
            "{k}: [{i}, {h}] gate and up"
        );
        assert!(b.record(*k).unwrap().is_interleaved());
        for (n, (vx, vy)) in [(x.gate(), y.gate()), (x.up(), y.up()), (x.down(), y.down())]
            .into_iter()
            .enumerate()
        {
            same_rows(&vx, &vy, &format!("{k} matrix {n}"));
            // The source matrix, row-major as the writer was given it.
            let src = &mats[n];
            let sv =
                MatrixView::new(src.encoding, src.rows, src.cols, &src.data, &src.scales).unwrap();
            same_rows(&sv, &vy, &format!("{k} matrix {n} vs source"));
        }
        // Reordered back, the record is the row-major store's, byte for byte.
        let mut back = b.fetch_one(*k).unwrap();
        back.deinterleave(|_| false);
        assert_eq!(back.bytes(), x.bytes(), "{k}");
    }
    let mut interleaved = 0;
    for d in &b.manifest().dense {
        let (x, y) = (a.dense(&d.name).unwrap(), b.dense(&d.name).unwrap());
        same_rows(&x.matrix(), &y.matrix(), &d.name);
        interleaved += y.interleaved as usize;
        assert_eq!(y.interleaved, y.matrix().is_interleaved(), "{}", d.name);
        // Both orders of the same tensor, from the one store.
        let rm = b
            .dense_ordered(&d.name, false, MatrixView::interleave)
            .unwrap();
        let il = b
            .dense_ordered(&d.name, true, MatrixView::interleave)
            .unwrap();
        assert!(!rm.is_interleaved());
        same_rows(&rm, &y.matrix(), &d.name);
        same_rows(&il, &y.matrix(), &d.name);
        let rm_a = a
            .dense_ordered(&d.name, true, MatrixView::interleave)
            .unwrap();
        same_rows(&rm_a, &x.matrix(), &d.name);
    }
    assert_eq!(interleaved, 1, "layer 1's q_proj ([65, 64] int8)");
}

#[test]
fn mapped_records_are_the_fetched_bytes_and_fail_their_checksum_alike() {
    let t = tempdir();
    let target = target_in(&t);
    let m = model(MatrixOrder::Interleaved);
    write_model(&target, &m);
    let s = Store::open(&target).unwrap();
    let keys: Vec<ExpertKey> = m.experts.iter().map(|e| e.0).collect();
    let mapped = s.map_records(&keys).unwrap();
    let fetched = s.fetch(&keys).unwrap();
    for (a, b) in mapped.iter().zip(&fetched) {
        assert!(a.is_mapped() && !b.is_mapped());
        assert_eq!(a.bytes(), b.bytes());
        assert_eq!(a.held_bytes(), a.len_bytes().next_multiple_of(4096));
    }
    assert_eq!(s.stats().reads, 2 * keys.len() as u64);
    // A reorder of a mapped record copies it first: the map is read-only.
    let mut one = s.map_records(&keys[..1]).unwrap().pop().unwrap();
    one.deinterleave(|_| false);
    assert!(!one.is_mapped());
    drop(mapped);
    // One byte of the third record flipped on disk.
    let r = *s.record(keys[2]).unwrap();
    drop(s);
    let seg = target.join(format!("segments/seg-{:05}.bin", r.segment.get()));
    let mut b = std::fs::read(&seg).unwrap();
    b[r.offset.get() as usize + 10] ^= 0x40;
    std::fs::write(&seg, b).unwrap();
    let s = Store::open(&target).unwrap();
    let err = s.map_records(&keys).err().expect("refused").to_string();
    let want = s.fetch(&keys).err().expect("refused").to_string();
    assert_eq!(err, want);
    assert!(err.contains(&keys[2].to_string()), "{err}");
}

#[test]
fn an_interleaved_build_resumes_to_the_same_bytes() {
    let t = tempdir();
    let m = model(MatrixOrder::Interleaved);
    let whole = t.path().join("whole.coli");
    write_model(&whole, &m);
    // Half the experts, then the writer is dropped without finishing (a crash).
    let torn = t.path().join("torn.coli");
    let WriterStart::Fresh(mut w) = StoreWriter::create_or_resume(&torn, m.spec.clone()).unwrap()
    else {
        panic!("a new target");
    };
    for (k, h, i, mats) in &m.experts[..m.experts.len() / 2] {
        w.add_expert(*k, *h, *i, [&mats[0], &mats[1], &mats[2]])
            .unwrap();
    }
    drop(w);
    assert_eq!(write_model(&torn, &m), "resumed");
    assert_eq!(snapshot(&torn), snapshot(&whole));
    // The same build asked row-major is another store: refused, naming the difference.
    let mut rm = m.spec.clone();
    rm.matrix_order = MatrixOrder::RowMajor;
    let torn2 = t.path().join("torn2.coli");
    let WriterStart::Fresh(w) = StoreWriter::create_or_resume(&torn2, m.spec.clone()).unwrap()
    else {
        panic!("a new target");
    };
    drop(w);
    let err = match StoreWriter::create_or_resume(&torn2, rm) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("resumed an interleaved build as row-major"),
    };
    assert!(err.contains("matrix_order"), "{err}");
}

#[test]
fn the_order_is_refused_where_the_version_or_the_matrix_does_not_allow_it() {
    let t = tempdir();
    // A version-2 store (records with biases) whose record 1 claims flag bit 1.
    let mut m = model(MatrixOrder::RowMajor);
    for (_, _, _, mats) in &mut m.experts {
        for mat in mats.iter_mut() {
            mat.bias = Some(vec![0.5; mat.rows]);
        }
    }
    let v2 = t.path().join("v2.coli");
    write_model(&v2, &m);
    assert_eq!(Store::open(&v2).unwrap().manifest().format_version, 2);
    let p = v2.join("INDEX");
    let mut b = std::fs::read(&p).unwrap();
    let rec = 64 + 64;
    b[rec + 56] |= 2;
    let crc = crc32fast_hash(&b[rec..rec + 60]);
    b[rec + 60..rec + 64].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let (len, sum) = (b.len(), format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&b)));
    rewrite_manifest(&v2, 2, |v| {
        v["index_file"] = serde_json::json!({"length": len, "xxh3": sum});
    });
    let err = Store::open(&v2).err().expect("refused").to_string();
    assert!(
        err.contains("record 1") && err.contains("flag bit 1") && err.contains("version 2"),
        "{err}"
    );

    // A version-7 store whose MANIFEST claims the order for a vector (no such order).
    let il = t.path().join("il.coli");
    write_model(&il, &model(MatrixOrder::Interleaved));
    let norm = Store::open(&il).unwrap().manifest().dense[0].name.clone();
    assert!(norm.ends_with("layernorm.weight"), "{norm}");
    rewrite_manifest(&il, 7, |v| {
        v["dense"][0]["interleaved"] = serde_json::Value::Bool(true);
    });
    let err = Store::open(&il).err().expect("refused").to_string();
    assert!(
        err.contains(&norm) && err.contains("no interleaved row order"),
        "{err}"
    );
    // An older store listing an interleaved dense tensor.
    let old = t.path().join("old.coli");
    write_model(&old, &model(MatrixOrder::RowMajor));
    let q = Store::open(&old)
        .unwrap()
        .manifest()
        .dense
        .iter()
        .position(|d| d.name == "model.layers.1.self_attn.q_proj.weight")
        .unwrap();
    rewrite_manifest(&old, 1, |v| {
        v["dense"][q]["interleaved"] = serde_json::Value::Bool(true);
    });
    let err = Store::open(&old).err().expect("refused").to_string();
    assert!(err.contains("q_proj") && err.contains("version 1"), "{err}");
}
