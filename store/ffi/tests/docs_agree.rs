//! What docs/C_API.md and docs/FORMAT.md state about versions and constants is what the code
//! does (the test reads the docs): the format version the library reads, the ABI version and
//! its history's newest row, every status code's value (against the header too), the
//! `coli_open_options` struct as the header declares it, and FORMAT.md's title version.

use std::path::Path;

fn read(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The number in the parentheses of the table row starting with `row` (`... reads (3) |`).
fn row_number(doc: &str, row: &str) -> u32 {
    let line = doc
        .lines()
        .find(|l| l.starts_with(row))
        .unwrap_or_else(|| panic!("no row {row:?}"));
    let open = line.rfind('(').expect("a parenthesis");
    line[open + 1..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number in {line:?}"))
}

#[test]
fn c_api_doc_states_the_versions_the_library_has() {
    let doc = read("docs/C_API.md");
    let format = coli_store_ffi::coli_format_version();
    assert_eq!(format, coli_store::FORMAT_VERSION);
    assert_eq!(
        row_number(&doc, "| `uint32_t coli_format_version(void)`"),
        format,
        "docs/C_API.md: coli_format_version"
    );
    let abi = coli_store_ffi::coli_abi_version();
    assert_eq!(
        row_number(&doc, "| `uint32_t coli_abi_version(void)`"),
        abi,
        "docs/C_API.md: coli_abi_version"
    );
    // The newest ABI history row is this ABI and lists every format version up to the current.
    let history = format!("| {abi} | ");
    let row = doc
        .lines()
        .find(|l| l.starts_with(&history))
        .unwrap_or_else(|| panic!("docs/C_API.md: no ABI history row for {abi}"));
    let versions: Vec<u32> = row
        .split('|')
        .nth(2)
        .unwrap()
        .split(',')
        .map(|v| v.trim().parse().expect("format version"))
        .collect();
    assert_eq!(versions, (1..=format).collect::<Vec<_>>(), "{row}");
    let header = read("store/ffi/include/coli_store.h");
    assert!(
        header.contains(&format!("#define COLI_ABI_VERSION {abi}u")),
        "coli_store.h: COLI_ABI_VERSION"
    );
    // "not supported yet" about a feature the library has.
    assert!(
        !doc.contains("not supported yet"),
        "docs/C_API.md still says not supported yet"
    );
}

#[test]
fn status_codes_agree_in_doc_header_and_library() {
    let doc = read("docs/C_API.md");
    let header = read("store/ffi/include/coli_store.h");
    let mut n = 0;
    for line in doc.lines().filter(|l| l.starts_with("| `COLI_")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (name, value) = (cells[1].trim_matches('`'), cells[2]);
        if !name.starts_with("COLI_OK") && !name.starts_with("COLI_ERR_") {
            continue;
        }
        let value: u32 = value.parse().unwrap_or_else(|_| panic!("{line}"));
        let decl = format!("{name} = {value}");
        let declared = header
            .match_indices(&decl)
            .any(|(i, _)| !header[i + decl.len()..].starts_with(|c: char| c.is_ascii_digit()));
        assert!(declared, "coli_store.h does not declare {decl}");
        let named = coli_store_ffi::coli_status_name(value as _);
        // SAFETY: coli_status_name returns a static NUL-terminated string.
        let named = unsafe { std::ffi::CStr::from_ptr(named) }.to_str().unwrap();
        assert_eq!(named, name, "status {value}");
        n += 1;
    }
    assert!(n >= 12, "{n} status codes in docs/C_API.md");
}

#[test]
fn format_doc_title_is_the_current_version() {
    let doc = read("docs/FORMAT.md");
    let title = doc.lines().next().unwrap();
    assert_eq!(
        title,
        format!(
            "# coli block store format, version {}",
            coli_store::FORMAT_VERSION
        )
    );
}
