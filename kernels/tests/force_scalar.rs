//! `COLI_FORCE_SCALAR=1` selects the scalar kernels (own test binary = own process, so the
//! cached detection is decided here).

use coli_kernels::{detected_isa, Isa};

#[test]
fn env_forces_scalar() {
    // Edition 2021: set_var is safe; this binary has a single test, so no other thread reads
    // the environment concurrently.
    std::env::set_var("COLI_FORCE_SCALAR", "1");
    assert_eq!(detected_isa(), Isa::Scalar);
    assert!(Isa::Scalar.supported());
}
