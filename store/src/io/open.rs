//! The table of I/O engines and the choice among them: each engine file exports an
//! [`EngineFactory`]; [`ENGINES`] lists them (adding an engine: its file and one line here, see
//! docs/ARCHITECTURE.md); [`open_engine`] builds the one asked for, or with
//! [`IoEngineChoice::Auto`] the first automatic one that the kernel allows.

use super::counting::CountingEngine;
use super::engine::{EngineConfig, EngineFactory, EngineFile, IoEngine};
use super::BufPool;
use std::path::Path;
use std::sync::Arc;

/// Every engine, in the order [`IoEngineChoice::Auto`] tries the automatic ones.
pub(crate) const ENGINES: &[EngineFactory] = &[
    super::uring::FACTORY,
    super::pread::FACTORY,
    super::mmap::FACTORY,
];

/// The names of every I/O engine (for `--io` and tests), in table order.
pub fn io_engine_names() -> Vec<&'static str> {
    ENGINES.iter().map(|f| f.name).collect()
}

/// The I/O engine asked for at open ([`crate::OpenOptions::engine`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoEngineChoice {
    /// The first automatic engine the kernel allows: io_uring, else (when the kernel refuses to
    /// set one up: `EPERM`/`ENOSYS`, e.g. a container's seccomp profile, or
    /// `COLI_IO_URING=off` in the environment) the pread engine, with one note on stderr per
    /// process.
    #[default]
    Auto,
    /// The engine of that name ([`io_engine_names`]), or an error at open.
    Engine(&'static str),
}

impl IoEngineChoice {
    /// The choice of the engine named `name`, if there is one.
    pub fn named(name: &str) -> Option<IoEngineChoice> {
        let name = if name == "io_uring" { "uring" } else { name };
        ENGINES
            .iter()
            .find(|f| f.name == name)
            .map(|f| IoEngineChoice::Engine(f.name))
    }

    /// Whether the engine chosen can read with O_DIRECT (`Auto`: yes).
    pub fn direct_io(self) -> bool {
        match self {
            IoEngineChoice::Auto => true,
            IoEngineChoice::Engine(n) => factory(n).is_none_or(|f| f.direct_io),
        }
    }
}

impl std::str::FromStr for IoEngineChoice {
    type Err = String;
    /// Parses `auto` or an engine name (`uring`, also spelled `io_uring`, `pread`, `mmap`).
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(IoEngineChoice::Auto);
        }
        IoEngineChoice::named(s).ok_or_else(|| {
            format!(
                "unknown I/O engine {s:?}: expected auto, {}",
                io_engine_names().join(", ")
            )
        })
    }
}

fn factory(name: &str) -> Option<&'static EngineFactory> {
    ENGINES.iter().find(|f| f.name == name)
}

/// An engine and, when it is not the one asked for, why (the fallback note).
pub(crate) type OpenedEngine = (Arc<CountingEngine>, Option<String>);

/// A name in messages: io_uring is known by that name.
fn title(name: &str) -> &str {
    if name == "uring" {
        "io_uring"
    } else {
        name
    }
}

/// Builds the engine asked for, wrapped in a [`CountingEngine`]. With
/// [`IoEngineChoice::Auto`] the automatic engines are tried in table order (io_uring is set up
/// and probed with one read of file 0); when one fails, the next is used, one note per process
/// says why (naming `context`, e.g. the store directory), and the reason is returned.
///
/// # Errors
/// When a named engine cannot be built (io_uring refused, a file that cannot be mapped), or
/// no automatic engine can.
pub(crate) fn open_engine(
    choice: IoEngineChoice,
    files: Vec<EngineFile>,
    cfg: &EngineConfig,
    context: &Path,
) -> std::io::Result<OpenedEngine> {
    let pool = BufPool::new(cfg.pooled_buffers.max(1));
    let wrap = |e: Arc<dyn IoEngine>| Arc::new(CountingEngine::new(e));
    match choice {
        IoEngineChoice::Engine(name) => {
            let f = factory(name).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("unknown I/O engine {name:?}"),
                )
            })?;
            match (f.open)(files, cfg, pool) {
                Ok(e) => Ok((wrap(e), None)),
                Err((_, e)) => Err(std::io::Error::new(
                    e.kind(),
                    format!("{} requested but unavailable: {e}", title(name)),
                )),
            }
        }
        IoEngineChoice::Auto => {
            let mut files = files;
            let mut refused: Vec<(&str, std::io::Error)> = Vec::new();
            for f in ENGINES.iter().filter(|f| f.auto) {
                match (f.open)(files, cfg, pool.clone()) {
                    Ok(e) => {
                        let why = (!refused.is_empty()).then(|| {
                            refused
                                .iter()
                                .map(|(n, e)| format!("{} unavailable ({e})", title(n)))
                                .collect::<Vec<_>>()
                                .join("; ")
                                + &format!("; using the {} engine", f.name)
                        });
                        if let Some(why) = &why {
                            static NOTE: std::sync::Once = std::sync::Once::new();
                            NOTE.call_once(|| {
                                eprintln!("coli-store: note: {}: {why}", context.display())
                            });
                        }
                        return Ok((wrap(e), why));
                    }
                    Err((back, e)) => {
                        refused.push((f.name, e));
                        files = back;
                        if files.is_empty() {
                            break;
                        }
                    }
                }
            }
            let (name, e) = refused.pop().expect("the table has automatic engines");
            Err(std::io::Error::new(
                e.kind(),
                format!("no I/O engine could be set up; {} failed: {e}", title(name)),
            ))
        }
    }
}
