//! The CPU's instruction sets, detected once per process: the one place every crate asks
//! which SIMD code it may run (kernels, the store's checksum, the converter's quantizers).
//!
//! `COLI_ISA=scalar|avx2-fma|avx512` picks that instruction set when the CPU supports it (else
//! the best one; comparisons and tests use it), `COLI_FORCE_SCALAR=1` forces [`Isa::Scalar`].
//! With [`Isa::Scalar`] no crate runs SIMD code of its own.

use std::sync::OnceLock;

/// An instruction-set level. Ordered: each level includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust (any CPU); the reference twin of every SIMD path.
    Scalar,
    /// x86-64 AVX2 with FMA (8-lane f32 SIMD) and F16C (every AVX2 CPU has it; kernels use it
    /// to decode fp8).
    Avx2Fma,
    /// [`Isa::Avx2Fma`] plus AVX-512F (16-lane kernels where they exist; everything else runs
    /// the AVX2 code).
    Avx512,
}

impl Isa {
    /// Every level, best first.
    pub const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2Fma, Isa::Scalar];

    /// A short name: `scalar`, `avx2-fma` or `avx512` (the values `COLI_ISA` takes).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2Fma => "avx2-fma",
            Isa::Avx512 => "avx512",
        }
    }

    /// The level named `name` ([`Isa::name`]), if any.
    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == name)
    }

    /// Whether this CPU can run code of this level (run-time detection, cached).
    /// [`Isa::Scalar`] is always supported.
    pub fn supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2Fma => avx2_fma_available(),
            Isa::Avx512 => avx2_fma_available() && avx512_available(),
        }
    }

    /// Whether code of this level may use AVX2 (and FMA, F16C).
    pub fn has_avx2(self) -> bool {
        self >= Isa::Avx2Fma
    }
}

/// Run-time detection of AVX-512F, cached.
fn avx512_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx512f")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Run-time detection of AVX2, FMA and F16C, cached.
fn avx2_fma_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// The level to use in this process: [`Isa::Avx512`] when the CPU has AVX-512F (and AVX2,
/// FMA, F16C), else [`Isa::Avx2Fma`] when it has AVX2, FMA and F16C, else [`Isa::Scalar`];
/// `COLI_ISA` / `COLI_FORCE_SCALAR` override it (module docs). Decided at the first call and
/// cached.
pub fn detected_isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        if std::env::var("COLI_FORCE_SCALAR").is_ok_and(|v| v.trim() == "1") {
            return Isa::Scalar;
        }
        if let Some(isa) = std::env::var("COLI_ISA")
            .ok()
            .and_then(|w| Isa::from_name(w.trim()))
        {
            if isa.supported() {
                return isa;
            }
        }
        best_supported()
    })
}

/// The best level this CPU supports, ignoring `COLI_ISA`.
pub fn best_supported() -> Isa {
    Isa::ALL
        .into_iter()
        .find(|i| i.supported())
        .unwrap_or(Isa::Scalar)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_order() {
        for isa in Isa::ALL {
            assert_eq!(Isa::from_name(isa.name()), Some(isa));
        }
        assert_eq!(Isa::from_name("sse2"), None);
        assert!(Isa::Scalar < Isa::Avx2Fma && Isa::Avx2Fma < Isa::Avx512);
        assert!(!Isa::Scalar.has_avx2() && Isa::Avx512.has_avx2());
        assert!(Isa::Scalar.supported());
        assert!(best_supported().supported());
    }
}
