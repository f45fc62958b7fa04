//! What every coli binary (coli-convert here; coli and coli-fsck through `coli_tools::cli`)
//! does the same way at its edges: one error format (`BINARY: error: the chain of causes`) and
//! a quiet exit when the reader of its standard output goes away (`coli info | head -1`), as
//! ripgrep does. It lives in the lowest crate that has a binary.

/// Exits the process with status 0, printing nothing, when a print to standard output fails
/// because the pipe's reader closed it (EPIPE: `println!` panics with "failed printing to
/// stdout: Broken pipe"); every other panic goes to the default hook. Call once at the start
/// of `main`.
pub fn exit_quietly_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map_or("", String::as_str);
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info)
    }));
}

/// Prints `e` and its causes, joined by ": ", as `BINARY: error: ...` on standard error (each
/// error adds its context once: a library error shows its inner error in its message or
/// returns it as `source()`, never both).
pub fn print_error(binary: &str, e: &anyhow::Error) {
    eprintln!("{binary}: error: {e:#}");
}
