//! Weight encodings of the store (docs/FORMAT.md section 6): ids, section sizes, and the
//! reference (scalar) dequantization that defines each encoding's meaning.

use crate::StoreError;

/// Rows of one FP8 scale block (and columns): the published FP8 checkpoints use 128x128 blocks.
pub const FP8_BLOCK: usize = 128;

/// Alignment of every weight and scale section inside a record or `dense.bin`, in bytes.
pub const SECTION_ALIGN: usize = 64;

/// A weight encoding, with its explicit on-disk id (never guessed from byte counts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Encoding {
    /// id 1: little-endian f32.
    F32,
    /// id 2: bfloat16 bit patterns (u16).
    Bf16,
    /// id 3: float8 e4m3fn with one f32 scale per 128x128 block.
    Fp8,
    /// id 4: i8 with one f32 scale per row.
    Int8,
    /// id 5: symmetric int4, two per byte, one f32 scale per `group_size` columns of a row.
    Int4 {
        /// Columns per scale group (32 or 64 in practice).
        group_size: u16,
    },
}

impl Encoding {
    /// The on-disk id (FORMAT.md section 6).
    pub fn id(self) -> u16 {
        match self {
            Encoding::F32 => 1,
            Encoding::Bf16 => 2,
            Encoding::Fp8 => 3,
            Encoding::Int8 => 4,
            Encoding::Int4 { .. } => 5,
        }
    }

    /// The group size field written next to the id: int4 group size, 128 for fp8, else 0.
    pub fn group_size(self) -> u16 {
        match self {
            Encoding::Int4 { group_size } => group_size,
            Encoding::Fp8 => FP8_BLOCK as u16,
            _ => 0,
        }
    }

    /// Rebuilds an encoding from its id and group size field.
    ///
    /// # Errors
    /// [`StoreError::Format`] for an unknown id or an int4 group size of 0 or odd.
    pub fn from_id(id: u16, group_size: u16) -> Result<Encoding, StoreError> {
        Ok(match id {
            1 => Encoding::F32,
            2 => Encoding::Bf16,
            3 => Encoding::Fp8,
            4 => Encoding::Int8,
            5 if group_size >= 2 && group_size.is_multiple_of(2) => Encoding::Int4 { group_size },
            _ => {
                return Err(StoreError::Format {
                    file: String::new(),
                    what: format!("unknown encoding id {id} with group size {group_size}"),
                })
            }
        })
    }

    /// A short name: `f32`, `bf16`, `fp8`, `int8`, `int4-g64`.
    pub fn name(self) -> String {
        match self {
            Encoding::F32 => "f32".into(),
            Encoding::Bf16 => "bf16".into(),
            Encoding::Fp8 => "fp8".into(),
            Encoding::Int8 => "int8".into(),
            Encoding::Int4 { group_size } => format!("int4-g{group_size}"),
        }
    }

    /// Bytes of the weight section of a [rows, cols] matrix.
    pub fn weight_bytes(self, rows: usize, cols: usize) -> usize {
        match self {
            Encoding::F32 => rows * cols * 4,
            Encoding::Bf16 => rows * cols * 2,
            Encoding::Fp8 | Encoding::Int8 => rows * cols,
            Encoding::Int4 { .. } => rows * cols.div_ceil(2),
        }
    }

    /// Number of f32 scales of a [rows, cols] matrix (0 for f32 and bf16).
    pub fn scale_count(self, rows: usize, cols: usize) -> usize {
        match self {
            Encoding::F32 | Encoding::Bf16 => 0,
            Encoding::Fp8 => rows.div_ceil(FP8_BLOCK) * cols.div_ceil(FP8_BLOCK),
            Encoding::Int8 => rows,
            Encoding::Int4 { group_size } => rows * cols.div_ceil(group_size as usize),
        }
    }

    /// Bytes of the scale section of a [rows, cols] matrix.
    pub fn scale_bytes(self, rows: usize, cols: usize) -> usize {
        self.scale_count(rows, cols) * 4
    }
}

/// Rounds `n` up to a multiple of `align` (a power of two or any positive number).
pub fn align_up(n: usize, align: usize) -> usize {
    n.div_ceil(align) * align
}

/// Byte layout of one expert record's sections (FORMAT.md section 5): offsets from the start of
/// the record of each matrix's weight and scale sections, in the order gate, up, down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordLayout {
    /// (weight offset, weight bytes, scale offset, scale bytes) for gate, up, down.
    pub sections: [(usize, usize, usize, usize); 3],
    /// Bytes before the zero padding.
    pub payload_len: usize,
}

impl RecordLayout {
    /// Layout of an expert with hidden size `hidden` (H) and intermediate size `inter` (I):
    /// gate [I, H], up [I, H], down [H, I].
    pub fn new(encoding: Encoding, hidden: usize, inter: usize) -> RecordLayout {
        let shapes = [(inter, hidden), (inter, hidden), (hidden, inter)];
        let mut off = 0usize;
        let mut sections = [(0, 0, 0, 0); 3];
        for (i, &(rows, cols)) in shapes.iter().enumerate() {
            let wb = encoding.weight_bytes(rows, cols);
            let w_off = off;
            off = align_up(off + wb, SECTION_ALIGN);
            let sb = encoding.scale_bytes(rows, cols);
            let s_off = if sb > 0 { off } else { 0 };
            if sb > 0 {
                off = align_up(off + sb, SECTION_ALIGN);
            }
            sections[i] = (w_off, wb, s_off, sb);
        }
        // payload_len is the end of the last section (without its trailing 64-byte round-up).
        let (w_off, wb, s_off, sb) = sections[2];
        let payload_len = if sb > 0 { s_off + sb } else { w_off + wb };
        RecordLayout {
            sections,
            payload_len,
        }
    }

    /// Record length on disk: the payload rounded up to `alignment`.
    pub fn record_len(&self, alignment: usize) -> usize {
        align_up(self.payload_len, alignment)
    }
}

/// A borrowed view of one encoded matrix: weights and scales in the store's byte layout.
///
/// `data` holds the weight section (FORMAT.md section 6); `scales` the f32 scales (empty for
/// f32/bf16). Produced by [`crate::ExpertBuf::gate`] and friends and by
/// [`crate::DenseTensor::matrix`]; consumed by `coli-kernels`.
#[derive(Clone, Copy, Debug)]
pub struct MatrixView<'a> {
    /// The encoding of `data`.
    pub encoding: Encoding,
    /// Output features (rows).
    pub rows: usize,
    /// Input features (columns).
    pub cols: usize,
    /// Weight bytes, `encoding.weight_bytes(rows, cols)` long.
    pub data: &'a [u8],
    /// Scales, `encoding.scale_count(rows, cols)` long.
    pub scales: &'a [f32],
}

/// Decodes one float8 e4m3fn value to f32 exactly (NaN codes 0x7F/0xFF give NaN).
pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((b >> 3) & 0x0F) as i32;
    let man = (b & 0x07) as f32;
    if exp == 0x0F && (b & 0x07) == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * (man / 8.0) * (2.0f32).powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * (2.0f32).powi(exp - 7)
    }
}

/// Decodes a bfloat16 bit pattern to f32 exactly.
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

impl MatrixView<'_> {
    /// Reference (scalar) dequantization of row `r` into `out` (`out.len() == cols`), exactly as
    /// FORMAT.md section 6 defines it. Kernels are tested against this.
    ///
    /// # Panics
    /// If `r >= rows` or `out.len() != cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows && out.len() == self.cols);
        let cols = self.cols;
        match self.encoding {
            Encoding::F32 => {
                let row = &self.data[r * cols * 4..(r + 1) * cols * 4];
                for (o, c) in out.iter_mut().zip(row.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            Encoding::Bf16 => {
                let row = &self.data[r * cols * 2..(r + 1) * cols * 2];
                for (o, c) in out.iter_mut().zip(row.chunks_exact(2)) {
                    *o = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
                }
            }
            Encoding::Fp8 => {
                let row = &self.data[r * cols..(r + 1) * cols];
                let bcols = cols.div_ceil(FP8_BLOCK);
                let srow = &self.scales[(r / FP8_BLOCK) * bcols..(r / FP8_BLOCK + 1) * bcols];
                for (c, o) in out.iter_mut().enumerate() {
                    *o = fp8_e4m3_to_f32(row[c]) * srow[c / FP8_BLOCK];
                }
            }
            Encoding::Int8 => {
                let row = &self.data[r * cols..(r + 1) * cols];
                let s = self.scales[r];
                for (o, &q) in out.iter_mut().zip(row) {
                    *o = (q as i8) as f32 * s;
                }
            }
            Encoding::Int4 { group_size } => {
                let g = group_size as usize;
                let stride = cols.div_ceil(2);
                let row = &self.data[r * stride..(r + 1) * stride];
                let ng = cols.div_ceil(g);
                let srow = &self.scales[r * ng..(r + 1) * ng];
                for (c, o) in out.iter_mut().enumerate() {
                    let byte = row[c / 2];
                    let nib = if c % 2 == 0 { byte & 0x0F } else { byte >> 4 };
                    *o = (nib as i32 - 8) as f32 * srow[c / g];
                }
            }
        }
    }
}
