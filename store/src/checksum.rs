//! xxh3-64 with a seed, with the long-input loop in AVX2 chosen at run time.
//!
//! `xxhash-rust` picks its SIMD width at compile time (`cfg(target_feature)`), so a build
//! without `-C target-cpu=native` gets its SSE2 loop. Record checksums hash ~16 MiB per expert
//! on every fetch, so this module runs XXH3's long-input loop (accumulate 64-byte stripes,
//! scramble every 1024 bytes, merge the 8 accumulators) with AVX2 when the instruction set in
//! use has it (`coli_format::cpu::detected_isa`: run-time detection, `COLI_ISA=scalar` turns it
//! off). Inputs of 240 bytes or fewer, and CPUs without AVX2, use `xxhash-rust`.
//!
//! The result is bit-identical to `xxhash_rust::xxh3::xxh3_64_with_seed` (the checksums are
//! part of the store format, FORMAT.md); the algorithm follows the XXH3 specification
//! (`XXH3_hashLong_64b_withSeed` in xxhash.h, v0.8): for a non-zero seed the secret is the
//! default 192-byte secret with `seed` added to its even and subtracted from its odd 64-bit
//! words. Tests compare against `xxhash-rust` for many lengths and seeds.

/// xxh3-64 of `input` with `seed` (same value as `xxhash_rust::xxh3::xxh3_64_with_seed`).
pub fn xxh3_64_with_seed(input: &[u8], seed: u64) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if input.len() > MID_SIZE_MAX && coli_format::cpu::detected_isa().has_avx2() {
        // SAFETY: AVX2 is available (the detected instruction set includes it); the input is longer than one stripe.
        return unsafe { avx2::hash_long(input, seed) };
    }
    xxhash_rust::xxh3::xxh3_64_with_seed(input, seed)
}

/// Inputs up to this length use the short-input algorithms of `xxhash-rust`.
const MID_SIZE_MAX: usize = 240;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    const STRIPE_LEN: usize = 64;
    const SECRET_SIZE: usize = 192;
    const SECRET_CONSUME_RATE: usize = 8;
    const STRIPES_PER_BLOCK: usize = (SECRET_SIZE - STRIPE_LEN) / SECRET_CONSUME_RATE;
    const BLOCK_LEN: usize = STRIPE_LEN * STRIPES_PER_BLOCK;
    const SECRET_MERGEACCS_START: usize = 11;
    const SECRET_LASTACC_START: usize = 7;

    const PRIME32_1: u64 = 0x9E37_79B1;
    const PRIME32_2: u64 = 0x85EB_CA77;
    const PRIME32_3: u64 = 0xC2B2_AE3D;
    const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
    const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
    const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
    const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
    const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;

    /// The default secret (kSecret of the XXH3 specification).
    const DEFAULT_SECRET: [u8; SECRET_SIZE] = [
        0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad,
        0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3,
        0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc,
        0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6,
        0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65,
        0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19,
        0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9,
        0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31,
        0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb,
        0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0,
        0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d,
        0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f,
        0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
    ];

    fn read64(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
    }

    /// The secret derived from `seed` (XXH3_initCustomSecret).
    fn custom_secret(seed: u64) -> [u8; SECRET_SIZE] {
        let mut s = DEFAULT_SECRET;
        for i in 0..SECRET_SIZE / 16 {
            let lo = read64(&DEFAULT_SECRET, 16 * i).wrapping_add(seed);
            let hi = read64(&DEFAULT_SECRET, 16 * i + 8).wrapping_sub(seed);
            s[16 * i..16 * i + 8].copy_from_slice(&lo.to_le_bytes());
            s[16 * i + 8..16 * i + 16].copy_from_slice(&hi.to_le_bytes());
        }
        s
    }

    /// XXH3_accumulate_512 on two 256-bit accumulator lanes.
    ///
    /// # Safety
    /// AVX2 available; `input` valid for 64 bytes, `secret` for 64 bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn accumulate_512(acc: &mut [__m256i; 2], input: *const u8, secret: *const u8) {
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: in bounds per the caller; unaligned loads.
            let (data, key) = unsafe {
                (
                    _mm256_loadu_si256(input.add(32 * i).cast()),
                    _mm256_loadu_si256(secret.add(32 * i).cast()),
                )
            };
            let data_key = _mm256_xor_si256(data, key);
            let data_key_lo = _mm256_srli_epi64::<32>(data_key);
            let product = _mm256_mul_epu32(data_key, data_key_lo);
            // _MM_SHUFFLE(1, 0, 3, 2): swap the 64-bit halves of each 128-bit lane.
            let data_swap = _mm256_shuffle_epi32::<0b01_00_11_10>(data);
            *a = _mm256_add_epi64(product, _mm256_add_epi64(*a, data_swap));
        }
    }

    /// XXH3_scrambleAcc.
    ///
    /// # Safety
    /// AVX2 available; `secret` valid for 64 bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scramble(acc: &mut [__m256i; 2], secret: *const u8) {
        let prime32 = _mm256_set1_epi32(PRIME32_1 as i32);
        for (i, a) in acc.iter_mut().enumerate() {
            let shifted = _mm256_srli_epi64::<47>(*a);
            let data = _mm256_xor_si256(*a, shifted);
            // SAFETY: in bounds per the caller.
            let key = unsafe { _mm256_loadu_si256(secret.add(32 * i).cast()) };
            let data_key = _mm256_xor_si256(data, key);
            let data_key_hi = _mm256_srli_epi64::<32>(data_key);
            let prod_lo = _mm256_mul_epu32(data_key, prime32);
            let prod_hi = _mm256_mul_epu32(data_key_hi, prime32);
            *a = _mm256_add_epi64(prod_lo, _mm256_slli_epi64::<32>(prod_hi));
        }
    }

    fn mul128_fold64(a: u64, b: u64) -> u64 {
        let p = a as u128 * b as u128;
        (p as u64) ^ ((p >> 64) as u64)
    }

    fn avalanche(mut h: u64) -> u64 {
        h ^= h >> 37;
        h = h.wrapping_mul(0x1656_6791_9E37_79F9);
        h ^ (h >> 32)
    }

    /// XXH3 64-bit long-input hash with a seed (XXH3_hashLong_64b_withSeed), computed
    /// progressively over a buffer whose total length is known up front: full 1024-byte blocks
    /// are consumed as soon as they are final ([`Long::update`]), the last partial block, last
    /// stripe and merge at [`Long::finish`].
    pub(super) struct Long {
        acc: [__m256i; 2],
        secret: [u8; SECRET_SIZE],
        len: usize,
        nb_blocks: usize,
        blocks_done: usize,
    }

    impl Long {
        /// State for an input of `len` (> 240) bytes.
        ///
        /// # Safety
        /// AVX2 must be available.
        #[target_feature(enable = "avx2")]
        pub(super) unsafe fn new(seed: u64, len: usize) -> Long {
            debug_assert!(len > super::MID_SIZE_MAX);
            let init = [
                PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5,
                PRIME32_1,
            ];
            // SAFETY: `init` is 64 bytes; unaligned loads.
            let acc = unsafe {
                [
                    _mm256_loadu_si256(init.as_ptr().cast()),
                    _mm256_loadu_si256(init.as_ptr().add(4).cast()),
                ]
            };
            Long {
                acc,
                secret: custom_secret(seed),
                len,
                nb_blocks: (len - 1) / BLOCK_LEN,
                blocks_done: 0,
            }
        }

        /// Consumes the full blocks within `input[..valid]` not consumed yet.
        ///
        /// # Safety
        /// AVX2 must be available; `input.len()` is the length given to [`Long::new`].
        #[target_feature(enable = "avx2")]
        pub(super) unsafe fn update(&mut self, input: &[u8], valid: usize) {
            assert_eq!(input.len(), self.len, "input length changed");
            let valid = valid.min(self.len);
            let sp = self.secret.as_ptr();
            let ip = input.as_ptr();
            while self.blocks_done < self.nb_blocks && (self.blocks_done + 1) * BLOCK_LEN <= valid {
                let b = self.blocks_done;
                for s in 0..STRIPES_PER_BLOCK {
                    // SAFETY: (b + 1) * BLOCK_LEN <= valid <= len; the secret offset
                    // s * 8 + 64 <= 184 < 192.
                    unsafe {
                        accumulate_512(
                            &mut self.acc,
                            ip.add(b * BLOCK_LEN + s * STRIPE_LEN),
                            sp.add(s * SECRET_CONSUME_RATE),
                        )
                    };
                }
                // SAFETY: the last 64 bytes of the secret.
                unsafe { scramble(&mut self.acc, sp.add(SECRET_SIZE - STRIPE_LEN)) };
                self.blocks_done += 1;
            }
        }

        /// Consumes the rest of `input` and returns the hash.
        ///
        /// # Safety
        /// AVX2 must be available; `input.len()` is the length given to [`Long::new`].
        #[target_feature(enable = "avx2")]
        pub(super) unsafe fn finish(mut self, input: &[u8]) -> u64 {
            let len = self.len;
            // SAFETY: as the caller's.
            unsafe { self.update(input, len) };
            let sp = self.secret.as_ptr();
            let ip = input.as_ptr();
            let nb_blocks = self.nb_blocks;
            let nb_stripes = ((len - 1) - BLOCK_LEN * nb_blocks) / STRIPE_LEN;
            for s in 0..nb_stripes {
                // SAFETY: nb_blocks * BLOCK_LEN + (s + 1) * 64 <= len - 1; s < 16 keeps the
                // secret in bounds.
                unsafe {
                    accumulate_512(
                        &mut self.acc,
                        ip.add(nb_blocks * BLOCK_LEN + s * STRIPE_LEN),
                        sp.add(s * SECRET_CONSUME_RATE),
                    )
                };
            }
            // SAFETY: len > 64, so the last stripe is in bounds; the secret offset
            // 192 - 64 - 7 + 64 <= 192.
            unsafe {
                accumulate_512(
                    &mut self.acc,
                    ip.add(len - STRIPE_LEN),
                    sp.add(SECRET_SIZE - STRIPE_LEN - SECRET_LASTACC_START),
                )
            };
            let mut a = [0u64; 8];
            // SAFETY: `a` is 64 bytes; unaligned stores.
            unsafe {
                _mm256_storeu_si256(a.as_mut_ptr().cast(), self.acc[0]);
                _mm256_storeu_si256(a.as_mut_ptr().add(4).cast(), self.acc[1]);
            }
            let mut result = (len as u64).wrapping_mul(PRIME64_1);
            for i in 0..4 {
                let k = SECRET_MERGEACCS_START + 16 * i;
                result = result.wrapping_add(mul128_fold64(
                    a[2 * i] ^ read64(&self.secret, k),
                    a[2 * i + 1] ^ read64(&self.secret, k + 8),
                ));
            }
            avalanche(result)
        }
    }

    /// XXH3 64-bit long-input hash with a seed in one call.
    ///
    /// # Safety
    /// AVX2 must be available; `input.len() > 240`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn hash_long(input: &[u8], seed: u64) -> u64 {
        // SAFETY: as the caller's.
        unsafe { Long::new(seed, input.len()).finish(input) }
    }
}

/// xxh3-64 with a seed of a buffer that fills progressively (e.g. a record read in chunks):
/// call [`StreamingChecksum::update`] each time more of the buffer is final, so that most of
/// the hashing overlaps the reading of the rest, then [`StreamingChecksum::finish`]. The result
/// equals [`xxh3_64_with_seed`] of the whole buffer.
pub struct StreamingChecksum {
    inner: Inner,
    len: usize,
    done: usize,
}

enum Inner {
    #[cfg(target_arch = "x86_64")]
    Avx2(Box<avx2::Long>),
    Portable(Box<xxhash_rust::xxh3::Xxh3>),
    Short(u64),
}

impl StreamingChecksum {
    /// State for a buffer of `len` bytes hashed with `seed`.
    pub fn new(seed: u64, len: usize) -> StreamingChecksum {
        #[cfg(target_arch = "x86_64")]
        if len > MID_SIZE_MAX && coli_format::cpu::detected_isa().has_avx2() {
            // SAFETY: AVX2 available (the detected instruction set includes it); len > 240.
            let l = unsafe { avx2::Long::new(seed, len) };
            return StreamingChecksum {
                inner: Inner::Avx2(Box::new(l)),
                len,
                done: 0,
            };
        }
        let inner = if len > MID_SIZE_MAX {
            Inner::Portable(Box::new(xxhash_rust::xxh3::Xxh3::with_seed(seed)))
        } else {
            Inner::Short(seed)
        };
        StreamingChecksum {
            inner,
            len,
            done: 0,
        }
    }

    /// Notes that `buf[..valid]` is final (`buf` is the whole buffer, every call the same one
    /// with the same contents so far) and hashes what it can of it.
    ///
    /// # Panics
    /// If `buf.len()` differs from the length given to [`StreamingChecksum::new`].
    pub fn update(&mut self, buf: &[u8], valid: usize) {
        assert_eq!(
            buf.len(),
            self.len,
            "StreamingChecksum: buffer length changed"
        );
        let valid = valid.min(self.len);
        match &mut self.inner {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the Avx2 variant is only built when AVX2 is available; length checked.
            Inner::Avx2(l) => unsafe { l.update(buf, valid) },
            Inner::Portable(h) => {
                if valid > self.done {
                    h.update(&buf[self.done..valid]);
                    self.done = valid;
                }
            }
            Inner::Short(_) => {}
        }
    }

    /// Hashes the rest of `buf` and returns xxh3-64 of all of it.
    ///
    /// # Panics
    /// If `buf.len()` differs from the length given to [`StreamingChecksum::new`].
    pub fn finish(mut self, buf: &[u8]) -> u64 {
        self.update(buf, self.len);
        match self.inner {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the Avx2 variant is only built when AVX2 is available; length checked.
            Inner::Avx2(l) => unsafe { l.finish(buf) },
            Inner::Portable(h) => h.digest(),
            Inner::Short(seed) => xxhash_rust::xxh3::xxh3_64_with_seed(buf, seed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_xxhash_rust_for_many_lengths_and_seeds() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let data: Vec<u8> = (0..70_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let seeds = [0u64, 1, 7, (3 << 32) | 5, u64::MAX, 0x9E37_79B9_7F4A_7C15];
        let mut lens: Vec<usize> = (0..=300).collect();
        lens.extend([
            1023, 1024, 1025, 1088, 2047, 2048, 2049, 4096, 65_535, 65_536, 70_000,
        ]);
        for &seed in &seeds {
            for &n in &lens {
                for start in [0usize, 3] {
                    let s = &data[start..start + n.min(data.len() - start)];
                    assert_eq!(
                        xxh3_64_with_seed(s, seed),
                        xxhash_rust::xxh3::xxh3_64_with_seed(s, seed),
                        "len {} seed {seed:#x} offset {start}",
                        s.len()
                    );
                }
            }
        }
    }

    #[test]
    fn streaming_matches_one_shot_for_any_chunking() {
        let data: Vec<u8> = (0..50_000u32)
            .map(|i| i.wrapping_mul(2_654_435_761).rotate_right(13) as u8)
            .collect();
        for n in [0usize, 5, 240, 241, 1024, 1025, 4096, 10_000, 50_000] {
            for seed in [0u64, 3, (2 << 32) | 17] {
                let want = xxhash_rust::xxh3::xxh3_64_with_seed(&data[..n], seed);
                for step in [1usize, 64, 1000, 4096, 1 << 20] {
                    let mut h = StreamingChecksum::new(seed, n);
                    let mut v = 0;
                    while v < n {
                        v = (v + step).min(n);
                        h.update(&data[..n], v);
                    }
                    assert_eq!(h.finish(&data[..n]), want, "n {n} seed {seed} step {step}");
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_path_matches_when_available() {
        if !coli_format::cpu::Isa::Avx2Fma.supported() {
            return;
        }
        let data: Vec<u8> = (0..5000u32)
            .map(|i| i.wrapping_mul(2_654_435_761) as u8)
            .collect();
        for n in [241usize, 1000, 1025, 5000] {
            for seed in [0u64, 42, (1 << 32) | 9] {
                // SAFETY: AVX2 checked above; n > 240.
                let got = unsafe { avx2::hash_long(&data[..n], seed) };
                assert_eq!(
                    got,
                    xxhash_rust::xxh3::xxh3_64_with_seed(&data[..n], seed),
                    "n {n} seed {seed}"
                );
            }
        }
    }
}
