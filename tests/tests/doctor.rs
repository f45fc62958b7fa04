//! `coli doctor` on a converted fixture store: every check runs and passes where this machine
//! allows it; a mirror adds its drive to the O_DIRECT and bandwidth checks; io_uring turned off
//! (`COLI_IO_URING=off`, as a container's seccomp refusal does), an unwritable state directory,
//! a store on tmpfs (no O_DIRECT) and a damaged segment file each give the WARN or FAIL that
//! names them. One test function: the cases change process environment variables.

use clap::Parser;
use coli_tests::convert_fixture;
use coli_tools::doctor::{doctor, Level, Report};
use std::path::Path;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    doctor: coli_tools::doctor::DoctorArgs,
}

fn run(args: &[&str]) -> Report {
    let cli = Cli::try_parse_from(std::iter::once("coli-doctor").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    doctor(&cli.doctor).unwrap_or_else(|e| panic!("{args:?}: {e:#}"))
}

/// The checks named `name`.
fn named<'a>(r: &'a Report, name: &str) -> Vec<&'a coli_tools::doctor::Check> {
    r.checks.iter().filter(|c| c.name == name).collect()
}

fn level(r: &Report, name: &str) -> Level {
    let c = named(r, name);
    assert_eq!(c.len(), 1, "one {name} check: {:#?}", r.checks);
    c[0].level
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

#[test]
fn doctor_checks_the_machine_and_the_store() {
    let (tmp, dir) = convert_fixture("olmoe_fp8", "int4_store");
    let s = dir.to_str().unwrap();
    let state = tmp.path().join("state");
    std::env::set_var("COLI_STATE_DIR", &state);
    std::env::remove_var("COLI_IO_URING");

    // Everything, on a healthy store.
    let r = run(&["--store", s, "--probe-mib", "4"]);
    for name in [
        "cpu",
        "cores",
        "memory",
        "o_direct",
        "io_uring",
        "disk",
        "fsck",
        "checksums",
        "state_dir",
    ] {
        assert!(
            !named(&r, name).is_empty(),
            "no {name} check: {:#?}",
            r.checks
        );
    }
    assert_eq!(r.exit_code, 0, "{:#?}", r.checks);
    assert!(r.checks.iter().all(|c| c.level != Level::Fail));
    assert_eq!(level(&r, "memory"), Level::Pass, "{:#?}", r.checks);
    assert_eq!(level(&r, "fsck"), Level::Pass);
    assert_eq!(level(&r, "checksums"), Level::Pass, "{:#?}", r.checks);
    assert_eq!(level(&r, "state_dir"), Level::Pass);
    assert!(state.is_dir(), "the state directory was created");
    assert!(
        r.checks
            .iter()
            .all(|c| (c.level == Level::Pass) == c.fix.is_none()),
        "a fix exactly for WARN and FAIL: {:#?}",
        r.checks
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["checks"][0]["name"], "cpu");
    assert!(["PASS", "WARN"].contains(&json["checks"][0]["level"].as_str().unwrap()));

    // A mirror: its drive gets its own O_DIRECT and bandwidth lines.
    let mirror = tmp.path().join("mirror");
    std::fs::create_dir(&mirror).unwrap();
    let store = coli_store::Store::open(&dir).unwrap();
    coli_store::mirror::copy::copy_segments(&store, &mirror, 0).unwrap();
    drop(store);
    let m = mirror.to_str().unwrap();
    let r = run(&["--store", s, "--mirror", m, "--probe-mib", "4"]);
    assert_eq!(r.exit_code, 0, "{:#?}", r.checks);
    for name in ["o_direct", "disk"] {
        let c = named(&r, name);
        assert_eq!(c.len(), 2, "{name}: {c:#?}");
        assert!(c[1].detail.contains(m), "{:?}", c[1]);
    }

    // io_uring refused: the run would use the pread engine; a warning with the fix.
    std::env::set_var("COLI_IO_URING", "off");
    let r = run(&["--store", s, "--probe-mib", "0"]);
    std::env::remove_var("COLI_IO_URING");
    let c = named(&r, "io_uring");
    assert_eq!(c[0].level, Level::Warn, "{c:?}");
    assert!(c[0].detail.contains("pread"), "{c:?}");
    assert!(c[0].fix.as_deref().unwrap().contains("seccomp"), "{c:?}");
    assert!(
        named(&r, "memlock").is_empty(),
        "memlock only matters to io_uring"
    );
    assert_eq!(r.exit_code, 0);

    // An unwritable state directory (a file where the directory should be).
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    std::env::set_var("COLI_STATE_DIR", &file);
    let r = run(&["--store", s, "--probe-mib", "0"]);
    std::env::set_var("COLI_STATE_DIR", &state);
    assert_eq!(level(&r, "state_dir"), Level::Warn, "{:#?}", r.checks);
    assert_eq!(r.exit_code, 0, "a warning does not fail the doctor");

    // A store on tmpfs, which has no O_DIRECT.
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        let on_shm = shm.join(format!("coli-doctor-{}", std::process::id()));
        copy_dir(&dir, &on_shm);
        let r = run(&["--store", on_shm.to_str().unwrap(), "--probe-mib", "1"]);
        let _ = std::fs::remove_dir_all(&on_shm);
        let c = named(&r, "o_direct");
        if c[0].level == Level::Pass {
            eprintln!("/dev/shm accepts O_DIRECT here: the tmpfs case is not checked");
        } else {
            assert_eq!(c[0].level, Level::Warn, "{c:?}");
            assert!(c[0].fix.as_deref().unwrap().contains("ext4"), "{c:?}");
        }
    } else {
        eprintln!("no /dev/shm: the tmpfs case is not checked");
    }

    // One flipped byte inside an expert record (the structure intact): the quick fsck cannot
    // see it, the checksum check fails naming the record, and the doctor exits 1.
    let damaged = tmp.path().join("damaged");
    copy_dir(&dir, &damaged);
    let rec = {
        let st = coli_store::Store::open(&damaged).unwrap();
        let r = st.index()[st.index().len() / 2];
        (
            r.segment.get(),
            r.offset.get(),
            r.layer.get(),
            r.expert.get(),
        )
    };
    let seg = damaged.join(format!("segments/seg-{:05}.bin", rec.0));
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[rec.1 as usize + 100] ^= 0x40;
    std::fs::write(&seg, bytes).unwrap();
    let r = run(&["--store", damaged.to_str().unwrap(), "--probe-mib", "0"]);
    assert_eq!(level(&r, "fsck"), Level::Pass, "{:#?}", r.checks);
    let c = named(&r, "checksums");
    assert_eq!(c[0].level, Level::Fail, "{c:?}");
    assert!(
        c[0].detail.contains(&format!("L{}", rec.2)) || c[0].detail.contains("checksum"),
        "{c:?}"
    );
    assert_eq!(r.exit_code, 1);

    // A truncated segment file: the quick fsck fails, and so does the doctor (exit 1).
    let seg = dir.join("segments/seg-00000.bin");
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(len - 4096)
        .unwrap();
    let r = run(&["--store", s, "--probe-mib", "0"]);
    let c = named(&r, "fsck");
    assert_eq!(c[0].level, Level::Fail, "{c:?}");
    assert!(c[0].detail.contains("seg-00000.bin"), "{c:?}");
    assert_eq!(
        level(&r, "store"),
        Level::Fail,
        "the store does not open: {:#?}",
        r.checks
    );
    assert_eq!(r.exit_code, 1);
}
