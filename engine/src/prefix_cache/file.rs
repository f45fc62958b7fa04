//! The KV cache file: one sequence's KV state on disk (specified in docs/KV_CACHE.md).
//!
//! A file is a header (magic, cache-layout version, store id, parameter hash, scope, token ids,
//! layer count, body length and checksum) closed by an XXH3-64 of its own bytes, then the body:
//! every layer's f32 keys and values, then the MTP state when there is one. All integers and
//! floats are little-endian. A file is written to a temporary name, fsynced, renamed into
//! place and its directory fsynced ([`write_atomic`]), so a reader sees either no file or a
//! whole one; [`read_header`] and [`read_state`] check everything before a byte is used.

use super::layout::KvLayout;
use crate::layers::{LayerKv, RecurrentCheckpoint};
use crate::sequence::{KvState, MtpState, Sequence};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};
use zerocopy::IntoBytes;

#[cfg(target_endian = "big")]
compile_error!("KV cache files are little-endian f32; this build writes them as native bytes");

/// First 8 bytes of every KV cache file.
pub const KV_FILE_MAGIC: [u8; 8] = *b"COLIKV\0\0";

/// The cache-layout version this build writes and reads. A file of a newer version is left
/// alone (a newer coli owns it); any change to what the cached numbers mean or to the bytes
/// below bumps it.
/// Version 2: each layer's arrays start with the positions its rows begin at (a layer that
/// dropped older rows, Inkling) and end with its short-convolution inputs.
/// Version 3: each layer's u64s add the f32 count of its recurrent state (0 or the layer's
/// state size) and its arrays end with that state (a Gated DeltaNet's `[Hv, dk, dv]`).
/// Version 4: each layer ends with its recurrent checkpoints (a count, then per checkpoint its
/// length, the position its convolution rows start at, its state and those rows), so that a
/// file serves every prefix one of them makes exact.
/// Version 5: each layer ends with its compressed blocks (a count of f32, then the rows:
/// DeepSeek-V4's pooled entries, one per closed block of positions; 0 for other layers).
pub const KV_LAYOUT_VERSION: u32 = 5;

/// Bytes of the header before the token ids.
const FIXED_HEADER_BYTES: usize = 88;

/// Header flag: the body ends with an MTP state.
const FLAG_MTP: u32 = 1;

/// Token ids a file may hold at most (16 Mi: beyond any context), so that a damaged count
/// cannot make a reader allocate before the checksums have been checked.
pub const MAX_TOKENS: u64 = 1 << 24;

/// What a KV cache file's header says (docs/KV_CACHE.md, "Header").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvFileHeader {
    /// Cache-layout version ([`KV_LAYOUT_VERSION`]).
    pub version: u32,
    /// Id of the store the numbers were computed from.
    pub store_id: [u8; 16],
    /// XXH3-64 of the canonical parameter string ([`KvLayout::params`]).
    pub param_hash: u64,
    /// Who may reuse the state: 0 = anyone; else the XXH3-64 of an API key.
    pub scope: u64,
    /// The token ids whose keys and values the body holds, in position order.
    pub tokens: Vec<u32>,
    /// Decoder layers in the body.
    pub layers: u32,
    /// Whether the body ends with an MTP state.
    pub has_mtp: bool,
    /// Bytes of the body.
    pub body_len: u64,
    /// XXH3-64 of the body.
    pub body_xxh3: u64,
    /// When the file was written, seconds since the Unix epoch.
    pub created_unix_s: u64,
}

impl KvFileHeader {
    /// Bytes of the header on disk: the fixed part, 4 per token, the 8-byte checksum.
    pub fn encoded_len(tokens: usize) -> usize {
        FIXED_HEADER_BYTES + 4 * tokens + 8
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::encoded_len(self.tokens.len()));
        b.extend_from_slice(&KV_FILE_MAGIC);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(Self::encoded_len(self.tokens.len()) as u32).to_le_bytes());
        b.extend_from_slice(&self.store_id);
        b.extend_from_slice(&self.param_hash.to_le_bytes());
        b.extend_from_slice(&self.scope.to_le_bytes());
        b.extend_from_slice(&(self.tokens.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.layers.to_le_bytes());
        let flags = if self.has_mtp { FLAG_MTP } else { 0 };
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&self.body_len.to_le_bytes());
        b.extend_from_slice(&self.body_xxh3.to_le_bytes());
        b.extend_from_slice(&self.created_unix_s.to_le_bytes());
        debug_assert_eq!(b.len(), FIXED_HEADER_BYTES);
        for t in &self.tokens {
            b.extend_from_slice(&t.to_le_bytes());
        }
        let sum = xxh3_64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    }
}

/// Why a KV cache file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KvFileError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Not a KV cache file at all.
    #[error("{path}: not a coli KV cache file (bad magic bytes)")]
    NotKvFile {
        /// The file.
        path: PathBuf,
    },
    /// A shorter prefix of the state was asked for than its layers can give back exactly
    /// (they dropped older rows: Inkling's sliding windows): not damage, left in place.
    #[error("{path}: its state cannot be cut back to {keep} positions exactly")]
    Unshortenable {
        /// The file.
        path: PathBuf,
        /// The positions asked for.
        keep: usize,
    },
    /// Written by a newer coli: left in place.
    #[error("{path}: written by a newer coli (cache layout version {found}; this build reads version {KV_LAYOUT_VERSION}); left in place")]
    Newer {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
    },
    /// Shorter than its header says.
    #[error("{path}: truncated ({what})")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What is missing.
        what: String,
    },
    /// A checksum does not match: the bytes changed after they were written.
    #[error("{path}: {part} checksum mismatch (stored {stored:016x}, computed {computed:016x}): the file is damaged")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// `header` or `body`.
        part: &'static str,
        /// What the file says.
        stored: u64,
        /// What its bytes give.
        computed: u64,
    },
    /// Computed from another store or with other parameters.
    #[error(
        "{path}: belongs to another store or other parameters ({what}); it is never reused here"
    )]
    Foreign {
        /// The file.
        path: PathBuf,
        /// Which field differs.
        what: String,
    },
    /// Checksums match but the content does not fit this model (shapes, lengths).
    #[error("{path}: malformed ({what})")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
}

impl KvFileError {
    /// Whether the file should be moved out of the way (damaged, foreign or not ours): every
    /// error but I/O failures (possibly transient) and newer versions (left in place).
    pub fn quarantine(&self) -> bool {
        !matches!(
            self,
            KvFileError::Io { .. } | KvFileError::Newer { .. } | KvFileError::Unshortenable { .. }
        )
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KvFileError + '_ {
    move |source| KvFileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads `reader` to fill `buf`; a short read is [`KvFileError::Truncated`] naming `what`.
fn read_full(
    r: &mut impl Read,
    buf: &mut [u8],
    path: &Path,
    what: &str,
) -> Result<(), KvFileError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(KvFileError::Truncated {
                    path: path.to_path_buf(),
                    what: format!("{what}: {got} of {} bytes", buf.len()),
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(path)(e)),
        }
    }
    Ok(())
}

/// Reads and checks a file's header (magic, version, header checksum); the body is not read.
/// With `expect`, also that the file belongs to that store and parameters.
///
/// # Errors
/// [`KvFileError`]: I/O, not a KV file, newer version, truncated, header checksum, foreign.
pub fn read_header(path: &Path, expect: Option<&KvLayout>) -> Result<KvFileHeader, KvFileError> {
    let mut f = File::open(path).map_err(io(path))?;
    let file_len = f.metadata().map_err(io(path))?.len();
    read_header_from(&mut f, path, file_len, expect)
}

fn read_header_from(
    f: &mut impl Read,
    path: &Path,
    file_len: u64,
    expect: Option<&KvLayout>,
) -> Result<KvFileHeader, KvFileError> {
    let mut fixed = [0u8; FIXED_HEADER_BYTES];
    read_full(f, &mut fixed, path, "fixed header")?;
    if fixed[..8] != KV_FILE_MAGIC {
        return Err(KvFileError::NotKvFile {
            path: path.to_path_buf(),
        });
    }
    let version = u32_at(&fixed, 8);
    if version > KV_LAYOUT_VERSION {
        return Err(KvFileError::Newer {
            path: path.to_path_buf(),
            found: version,
        });
    }
    let malformed = |what: String| KvFileError::Malformed {
        path: path.to_path_buf(),
        what,
    };
    if version != KV_LAYOUT_VERSION {
        return Err(malformed(format!("cache layout version {version}")));
    }
    let header_len = u32_at(&fixed, 12) as usize;
    let tokens = u64_at(&fixed, 48);
    // A header length that disagrees with the token count is damage (the checksum below
    // cannot be trusted to catch it: it would be read over the wrong span).
    if tokens > MAX_TOKENS || header_len != KvFileHeader::encoded_len(tokens as usize) {
        return Err(malformed(format!(
            "header length {header_len} does not match {tokens} token ids (at most {MAX_TOKENS})"
        )));
    }
    if header_len as u64 > file_len {
        return Err(KvFileError::Truncated {
            path: path.to_path_buf(),
            what: format!("{file_len} bytes, shorter than its {header_len}-byte header"),
        });
    }
    let mut rest = vec![0u8; header_len - FIXED_HEADER_BYTES];
    read_full(f, &mut rest, path, "header token ids")?;
    let mut hasher = Xxh3::new();
    hasher.update(&fixed);
    hasher.update(&rest[..rest.len() - 8]);
    let computed = hasher.digest();
    let stored = u64_at(&rest, rest.len() - 8);
    if stored != computed {
        return Err(KvFileError::Checksum {
            path: path.to_path_buf(),
            part: "header",
            stored,
            computed,
        });
    }
    let flags = u32_at(&fixed, 60);
    if flags & !FLAG_MTP != 0 {
        return Err(malformed(format!("unknown flags {flags:#x}")));
    }
    let h = KvFileHeader {
        version,
        store_id: fixed[16..32].try_into().expect("16 bytes"),
        param_hash: u64_at(&fixed, 32),
        scope: u64_at(&fixed, 40),
        tokens: rest[..rest.len() - 8]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect(),
        layers: u32_at(&fixed, 56),
        has_mtp: flags & FLAG_MTP != 0,
        body_len: u64_at(&fixed, 64),
        body_xxh3: u64_at(&fixed, 72),
        created_unix_s: u64_at(&fixed, 80),
    };
    if let Some(l) = expect {
        let foreign = |what: String| KvFileError::Foreign {
            path: path.to_path_buf(),
            what,
        };
        if h.store_id != l.store_id {
            return Err(foreign(format!(
                "store {} instead of {}",
                hex(&h.store_id),
                hex(&l.store_id)
            )));
        }
        if h.param_hash != l.param_hash {
            return Err(foreign(format!(
                "parameter hash {:016x} instead of {:016x} ({})",
                h.param_hash, l.param_hash, l.params
            )));
        }
        if h.layers as usize != l.kv_dims.len() {
            return Err(malformed(format!(
                "{} layers, the model has {}",
                h.layers,
                l.kv_dims.len()
            )));
        }
    }
    Ok(h)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Reads a whole file and checks it against `layout` (store, parameters, header and body
/// checksums, every array's length against the model's dimensions).
///
/// # Errors
/// [`KvFileError`]; nothing is returned from a file that fails any check.
pub fn read_state(path: &Path, layout: &KvLayout) -> Result<(KvFileHeader, KvState), KvFileError> {
    read_state_prefix(path, layout, usize::MAX)
}

/// [`read_state`] keeping only the first `keep` positions (all when `keep` is larger): every
/// byte is still read and checked, but only what is kept is held in memory (a short prefix of
/// a long file costs the file's read, not its size in RAM).
///
/// # Errors
/// As [`read_state`].
pub fn read_state_prefix(
    path: &Path,
    layout: &KvLayout,
    keep: usize,
) -> Result<(KvFileHeader, KvState), KvFileError> {
    let f = File::open(path).map_err(io(path))?;
    let file_len = f.metadata().map_err(io(path))?.len();
    let mut r = BufReader::with_capacity(1 << 20, f);
    let h = read_header_from(&mut r, path, file_len, Some(layout))?;
    let header_len = KvFileHeader::encoded_len(h.tokens.len()) as u64;
    let whole = header_len.saturating_add(h.body_len);
    let truncated = |what: String| KvFileError::Truncated {
        path: path.to_path_buf(),
        what,
    };
    if file_len < whole {
        return Err(truncated(format!(
            "{file_len} bytes, the header says {whole}"
        )));
    }
    if file_len > whole {
        return Err(KvFileError::Malformed {
            path: path.to_path_buf(),
            what: format!("{file_len} bytes, the header says {whole}"),
        });
    }
    let mut body = BodyReader {
        r: &mut r,
        path,
        hasher: Xxh3::new(),
        left: h.body_len,
    };
    let n = h.tokens.len();
    let keep = keep.min(n);
    let mut read = Vec::with_capacity(layout.kv_dims.len());
    for (l, (&kd, &vd)) in layout.kv_dims.iter().zip(&layout.v_dims).enumerate() {
        let cd = layout.conv_dims.get(l).copied().unwrap_or(0);
        let rd = layout.recurrent_dims.get(l).copied().unwrap_or(0);
        let tail = layout.conv_tails.get(l).copied().unwrap_or(0);
        let blocks = layout.blocks.get(l).copied().unwrap_or((0, 0));
        read.push(body.layer(
            n,
            keep,
            (kd, vd, cd),
            (rd, tail),
            blocks,
            &format!("layer {l}"),
        )?);
    }
    let mtp = if h.has_mtp {
        let Some(m) = &layout.mtp else {
            return Err(KvFileError::Malformed {
                path: path.to_path_buf(),
                what: "an MTP state, but the model has no MTP layer".into(),
            });
        };
        let fed = body.u64("MTP positions")? as usize;
        if fed > n {
            return Err(KvFileError::Malformed {
                path: path.to_path_buf(),
                what: format!("MTP state of {fed} positions in a sequence of {n}"),
            });
        }
        let kv = body
            .layer(
                fed,
                fed,
                (m.kv_dim, m.v_dim, m.conv_dim),
                (0, 0),
                (0, 0),
                "MTP layer",
            )?
            .finish(fed, fed, m.kv_dim);
        let hidden = body.f32s((n - fed).saturating_mul(m.hidden_size), "MTP hidden states")?;
        Some(MtpState {
            kv,
            kv_dim: m.kv_dim,
            hidden,
            hidden_size: m.hidden_size,
        })
    } else {
        None
    };
    if body.left != 0 {
        return Err(KvFileError::Malformed {
            path: path.to_path_buf(),
            what: format!("{} body bytes beyond the model's arrays", body.left),
        });
    }
    let computed = body.hasher.digest();
    if computed != h.body_xxh3 {
        return Err(KvFileError::Checksum {
            path: path.to_path_buf(),
            part: "body",
            stored: h.body_xxh3,
            computed,
        });
    }
    // The longest prefix of at most `keep` positions every layer holds exactly: `keep` itself
    // where no layer is recurrent (or the whole file is asked for), else the longest
    // checkpoint every recurrent layer has that the other layers can be cut back to.
    let exact = |len: usize| {
        read.iter().all(|r| r.exact_at(len, n))
            && mtp
                .as_ref()
                .is_none_or(|m: &MtpState| m.kv.can_truncate(len.min(m.fed())))
    };
    let len = if exact(keep) {
        keep
    } else {
        let mut lens: Vec<usize> = read
            .iter()
            .flat_map(|r| r.checkpoints.iter().map(|c| c.len))
            .filter(|&c| c < keep)
            .collect();
        lens.sort_unstable_by(|a, b| b.cmp(a));
        lens.into_iter().find(|&c| exact(c)).unwrap_or(0)
    };
    if len == 0 && keep > 0 {
        return Err(KvFileError::Unshortenable {
            path: path.to_path_buf(),
            keep,
        });
    }
    let mut seq = Sequence::new(layout.kv_dims.clone(), None);
    seq.kv = read
        .into_iter()
        .zip(&layout.kv_dims)
        .map(|(r, &kd)| r.finish(len, n, kd))
        .collect();
    seq.tokens = h.tokens.clone();
    seq.tokens.truncate(len);
    seq.mtp = mtp;
    if len < n {
        // The layers were read to at most `keep` rows and cut to `len`; this cuts the MTP
        // state.
        if let Some(m) = seq.mtp.as_mut() {
            m.truncate(len, n);
        }
    }
    Ok((h, KvState::new(seq)))
}

/// One layer as read ([`BodyReader::layer`]): its rows up to the kept length, its state at the
/// file's length when that was kept, and the checkpoints it can be cut back to.
struct ReadLayer {
    kv: LayerKv,
    /// Whether the layer holds a recurrent state (exact at the file's length and at its
    /// checkpoints only).
    recurrent: bool,
    /// Its recurrent checkpoints of at most the kept length, oldest first.
    checkpoints: Vec<RecurrentCheckpoint>,
}

impl ReadLayer {
    /// Whether this layer of a file of `n` positions gives back its first `len` exactly.
    fn exact_at(&self, len: usize, n: usize) -> bool {
        if len == 0 {
            return true;
        }
        if self.recurrent {
            len == n || self.checkpoints.iter().any(|c| c.len == len)
        } else {
            len >= self.kv.min_len
        }
    }

    /// The layer's state at `len` positions (exact there: [`ReadLayer::exact_at`]) of a file
    /// of `n`, its rows `kv_dim` f32 wide. A recurrent layer cut back takes its checkpoint's
    /// state and convolution rows; its older checkpoints stay.
    fn finish(self, len: usize, n: usize, kv_dim: usize) -> LayerKv {
        let mut kv = self.kv;
        if len == 0 {
            return kv.emptied();
        }
        if self.recurrent && len < n {
            let c = self
                .checkpoints
                .iter()
                .find(|c| c.len == len)
                .expect("exact_at chose a checkpoint length")
                .clone();
            kv.k.truncate(len.saturating_sub(kv.first) * kv_dim);
            kv.v.truncate(len.saturating_sub(kv.first) * kv_dim);
            kv.recurrent = c.recurrent;
            kv.conv = c.conv;
            kv.conv_first = c.conv_from;
            kv.min_len = len;
        } else if len < n {
            // Rows were read up to the length asked for; exact_at checked `len` against
            // `min_len`.
            kv.truncate(len, kv_dim);
        }
        if self.recurrent {
            // The rows the next position reads: all the layer holds (the writer trimmed them).
            kv.conv_tail = len - kv.conv_first;
            kv.checkpoints = self.checkpoints;
            kv.checkpoints.retain(|c| c.len <= len);
        }
        kv
    }
}

struct BodyReader<'a, R: Read> {
    r: &'a mut R,
    path: &'a Path,
    hasher: Xxh3,
    left: u64,
}

impl<R: Read> BodyReader<'_, R> {
    fn take(&mut self, buf: &mut [u8], what: &str) -> Result<(), KvFileError> {
        if (buf.len() as u64) > self.left {
            return Err(KvFileError::Malformed {
                path: self.path.to_path_buf(),
                what: format!(
                    "{what}: {} bytes needed, {} left in the body",
                    buf.len(),
                    self.left
                ),
            });
        }
        read_full(self.r, buf, self.path, what)?;
        self.hasher.update(buf);
        self.left -= buf.len() as u64;
        Ok(())
    }

    fn f32s(&mut self, n: usize, what: &str) -> Result<Vec<f32>, KvFileError> {
        // Checked before allocating: the body is no longer than the file.
        let bytes = (n as u64).saturating_mul(4);
        if bytes > self.left {
            return Err(KvFileError::Malformed {
                path: self.path.to_path_buf(),
                what: format!(
                    "{what}: {bytes} bytes needed, {} left in the body",
                    self.left
                ),
            });
        }
        let mut v = vec![0f32; n];
        self.take(v.as_mut_bytes(), what)?;
        Ok(v)
    }

    /// `rows` rows of `width` f32 of which the first `keep` are returned; the rest are read
    /// and hashed in chunks, not held.
    fn f32s_prefix(
        &mut self,
        rows: usize,
        keep: usize,
        width: usize,
        what: &str,
    ) -> Result<Vec<f32>, KvFileError> {
        let total = (rows as u64).saturating_mul(width as u64).saturating_mul(4);
        if total > self.left {
            return Err(KvFileError::Malformed {
                path: self.path.to_path_buf(),
                what: format!(
                    "{what}: {total} bytes needed, {} left in the body",
                    self.left
                ),
            });
        }
        let v = self.f32s(keep * width, what)?;
        let mut skip = total - (keep * width * 4) as u64;
        let mut buf = vec![0u8; (skip as usize).min(1 << 20)];
        while skip > 0 {
            let n = (skip as usize).min(buf.len());
            self.take(&mut buf[..n], what)?;
            skip -= n as u64;
        }
        Ok(v)
    }

    /// One layer's state of a sequence of `n` positions, keeping positions `..keep`: its
    /// row starts, `min_len` and the f32 count of its recurrent state (0 or `recurrent`) (four
    /// u64), then keys and values from `first` (`dims.0`, `dims.1` f32 per position),
    /// convolution inputs from `conv_first` (`dims.2`), the recurrent state (kept only when
    /// `keep` is `n`), and the recurrent checkpoints (those of at most `keep` positions kept).
    /// `recurrent` is `(state size, convolution rows the next position reads)`: the state and
    /// every checkpoint must hold that many rows (fewer only at the sequence's start). Last the
    /// compressed blocks, `(block_dim, block_rate)` (`(0, 0)`: none): `n / block_rate` rows,
    /// those of the first `keep` positions kept.
    fn layer(
        &mut self,
        n: usize,
        keep: usize,
        dims: (usize, usize, usize),
        (recurrent, tail): (usize, usize),
        (block_dim, block_rate): (usize, usize),
        what: &str,
    ) -> Result<ReadLayer, KvFileError> {
        let first = self.u64(what)? as usize;
        let conv_first = self.u64(what)? as usize;
        let min_len = self.u64(what)? as usize;
        let count = self.u64(what)? as usize;
        if keep > 0 && keep < n && keep < min_len && count == 0 {
            // Stop here: the rest of the file need not be read for a prefix it cannot give.
            return Err(KvFileError::Unshortenable {
                path: self.path.to_path_buf(),
                keep,
            });
        }
        if first > n || conv_first > n || min_len > n || (dims.2 == 0 && conv_first != 0) {
            return Err(KvFileError::Malformed {
                path: self.path.to_path_buf(),
                what: format!(
                    "{what}: rows from {first} / {conv_first}, exact from {min_len}, in a sequence of {n}"
                ),
            });
        }
        let (rows, kept) = (n - first, keep.saturating_sub(first));
        let (conv_rows, conv_kept) = (n - conv_first, keep.saturating_sub(conv_first));
        let k = self.f32s_prefix(rows, kept, dims.0, &format!("{what} keys"))?;
        let v = self.f32s_prefix(rows, kept, dims.1, &format!("{what} values"))?;
        let conv = self.f32s_prefix(conv_rows, conv_kept, dims.2, &format!("{what} conv"))?;
        // A recurrent state is whole (the layer's size, exact at the sequence's length) or
        // absent (an empty sequence).
        if count != 0 && (count != recurrent || min_len != n || n - conv_first < tail.min(n)) {
            return Err(KvFileError::Malformed {
                path: self.path.to_path_buf(),
                what: format!(
                    "{what}: a recurrent state of {count} values exact from {min_len}, convolution rows from {conv_first}, in a sequence of {n} (the layer's state has {recurrent} values and reads {tail} rows)"
                ),
            });
        }
        let whole = keep > 0 && keep == n;
        let state = self.f32s_prefix(
            1,
            usize::from(whole),
            count,
            &format!("{what} recurrent state"),
        )?;
        // The checkpoints: each at most 16 + 4 * count bytes of the body, so a damaged count
        // is refused before anything is allocated.
        let ckpts = self.u64(what)?;
        if ckpts != 0 && count == 0 {
            return Err(KvFileError::Malformed {
                path: self.path.to_path_buf(),
                what: format!("{what}: {ckpts} recurrent checkpoints without a recurrent state"),
            });
        }
        if ckpts.saturating_mul(16 + 4 * count as u64) > self.left {
            return Err(KvFileError::Malformed {
                path: self.path.to_path_buf(),
                what: format!(
                    "{what}: {ckpts} recurrent checkpoints, {} bytes left in the body",
                    self.left
                ),
            });
        }
        let mut checkpoints = Vec::new();
        let mut last = 0;
        for i in 0..ckpts {
            let len = self.u64(what)? as usize;
            let conv_from = self.u64(what)? as usize;
            if len <= last || len > n || conv_from > len || len - conv_from < tail.min(len) {
                return Err(KvFileError::Malformed {
                    path: self.path.to_path_buf(),
                    what: format!(
                        "{what}: recurrent checkpoint {i} of {len} positions with convolution rows from {conv_from} (after one of {last}, in a sequence of {n}; the layer reads {tail} rows)"
                    ),
                });
            }
            last = len;
            let held = len <= keep;
            let what = format!("{what} checkpoint {i}");
            let state = self.f32s_prefix(1, usize::from(held), count, &what)?;
            let conv = self.f32s_prefix(
                len - conv_from,
                if held { len - conv_from } else { 0 },
                dims.2,
                &what,
            )?;
            if held {
                checkpoints.push(RecurrentCheckpoint {
                    len,
                    recurrent: state,
                    conv,
                    conv_from,
                });
            }
        }
        let block_values = self.u64(what)?;
        let rows = n.checked_div(block_rate).unwrap_or(0);
        if block_values != (rows * block_dim) as u64 {
            return Err(KvFileError::Malformed {
                path: self.path.to_path_buf(),
                what: format!(
                    "{what}: {block_values} values of compressed blocks, the layer holds {rows} of {block_dim} for {n} positions"
                ),
            });
        }
        let blocks = self.f32s_prefix(
            rows,
            keep.checked_div(block_rate).unwrap_or(0),
            block_dim,
            &format!("{what} compressed blocks"),
        )?;
        Ok(ReadLayer {
            kv: LayerKv {
                k,
                v,
                conv,
                blocks,
                block_dim,
                block_rate,
                first: if keep == 0 { 0 } else { first },
                conv_first: if keep == 0 { 0 } else { conv_first },
                conv_dim: dims.2,
                min_len: if keep == 0 { 0 } else { min_len },
                expanded: None,
                windowed: false,
                recurrent: state,
                recurrent_history: Vec::new(),
                checkpoints: Vec::new(),
                conv_tail: 0,
            },
            recurrent: count != 0,
            checkpoints,
        })
    }

    fn u64(&mut self, what: &str) -> Result<u64, KvFileError> {
        let mut b = [0u8; 8];
        self.take(&mut b, what)?;
        Ok(u64::from_le_bytes(b))
    }
}

/// Body bytes of `state` ([`write_atomic`] writes exactly this many).
pub fn body_len(state: &KvState) -> u64 {
    let s = &state.seq;
    // Each layer's four u64 (row starts, min_len, recurrent count) take eight f32-sized slots,
    // its checkpoint count two, each checkpoint's two u64 four, its block count two.
    let n = s.tokens.len();
    let layer = |l: &LayerKv, n: usize| {
        let ckpts: usize = written_checkpoints(l, n)
            .map(|c| 4 + c.recurrent.len() + c.conv.len())
            .sum();
        12 + l.k.len() + l.v.len() + l.conv.len() + l.recurrent.len() + ckpts + l.blocks.len()
    };
    let kv: usize = s.kv.iter().map(|l| layer(l, n)).sum();
    let mtp = s
        .mtp
        .as_ref()
        .map_or(0, |m| 2 + layer(&m.kv, m.fed()) + m.hidden.len());
    // The MTP position count is one u64 (two f32-sized slots above).
    4 * (kv + mtp) as u64
}

/// The recurrent checkpoints a file holds for layer `l` of a sequence of `n` positions: the
/// ones a reader accepts (none without a recurrent state; each of a state's size, covering
/// 1..=n positions, each longer than the one before, convolution rows from at most its length).
fn written_checkpoints(l: &LayerKv, n: usize) -> impl Iterator<Item = &RecurrentCheckpoint> {
    let mut last = 0;
    l.checkpoints.iter().filter(move |c| {
        let ok = !l.recurrent.is_empty()
            && c.len > last
            && c.len <= n
            && c.conv_from <= c.len
            && c.recurrent.len() == l.recurrent.len()
            && c.conv.len() == (c.len - c.conv_from) * l.conv_dim;
        if ok {
            last = c.len;
        }
        ok
    })
}

/// Writes `state` to `path` atomically: a temporary file in the same directory (mode 0600),
/// fsynced, renamed over `path`, the directory fsynced. Returns the bytes written.
///
/// # Errors
/// [`KvFileError::Io`]; the temporary file is removed and `path` is untouched then.
pub fn write_atomic(
    path: &Path,
    state: &KvState,
    store_id: [u8; 16],
    param_hash: u64,
    scope: u64,
) -> Result<u64, KvFileError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let r = write_file(&tmp, state, store_id, param_hash, scope).and_then(|n| {
        std::fs::rename(&tmp, path).map_err(io(path))?;
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&dir))?;
        Ok(n)
    });
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

fn write_file(
    tmp: &Path,
    state: &KvState,
    store_id: [u8; 16],
    param_hash: u64,
    scope: u64,
) -> Result<u64, KvFileError> {
    use std::os::unix::fs::OpenOptionsExt;
    let s = &state.seq;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)
        .map_err(io(tmp))?;
    let mut header = KvFileHeader {
        version: KV_LAYOUT_VERSION,
        store_id,
        param_hash,
        scope,
        tokens: s.tokens.clone(),
        layers: s.kv.len() as u32,
        has_mtp: s.mtp.is_some(),
        body_len: body_len(state),
        body_xxh3: 0,
        created_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let header_len = KvFileHeader::encoded_len(s.tokens.len());
    let mut w = BufWriter::with_capacity(1 << 20, f);
    // The header's checksums need the body: a placeholder first, the header last.
    w.write_all(&vec![0u8; header_len]).map_err(io(tmp))?;
    let mut hasher = Xxh3::new();
    let put = |w: &mut BufWriter<File>, h: &mut Xxh3, b: &[u8]| -> Result<(), KvFileError> {
        h.update(b);
        w.write_all(b).map_err(io(tmp))
    };
    let n = s.tokens.len();
    let layer = |w: &mut BufWriter<File>, h: &mut Xxh3, l: &LayerKv| -> Result<(), KvFileError> {
        // A recurrent state is written as the state at the sequence's length: exact there only.
        let min_len = if l.recurrent.is_empty() { l.min_len } else { n };
        for x in [l.first, l.conv_first, min_len, l.recurrent.len()] {
            put(w, h, &(x as u64).to_le_bytes())?;
        }
        put(w, h, l.k.as_bytes())?;
        put(w, h, l.v.as_bytes())?;
        put(w, h, l.conv.as_bytes())?;
        put(w, h, l.recurrent.as_bytes())?;
        put(
            w,
            h,
            &(written_checkpoints(l, n).count() as u64).to_le_bytes(),
        )?;
        for c in written_checkpoints(l, n) {
            put(w, h, &(c.len as u64).to_le_bytes())?;
            put(w, h, &(c.conv_from as u64).to_le_bytes())?;
            put(w, h, c.recurrent.as_bytes())?;
            put(w, h, c.conv.as_bytes())?;
        }
        put(w, h, &(l.blocks.len() as u64).to_le_bytes())?;
        put(w, h, l.blocks.as_bytes())?;
        Ok(())
    };
    for l in &s.kv {
        layer(&mut w, &mut hasher, l)?;
    }
    if let Some(m) = &s.mtp {
        put(&mut w, &mut hasher, &(m.fed() as u64).to_le_bytes())?;
        layer(&mut w, &mut hasher, &m.kv)?;
        put(&mut w, &mut hasher, m.hidden.as_bytes())?;
    }
    header.body_xxh3 = hasher.digest();
    w.seek(SeekFrom::Start(0)).map_err(io(tmp))?;
    w.write_all(&header.encode()).map_err(io(tmp))?;
    let f = w.into_inner().map_err(|e| io(tmp)(e.into_error()))?;
    f.sync_all().map_err(io(tmp))?;
    Ok(header_len as u64 + header.body_len)
}
