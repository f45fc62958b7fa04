//! Checksums and store ids: integers in memory, lowercase hex strings in the MANIFEST's JSON
//! (docs/FORMAT.md section 2), converted once when the JSON is parsed or written.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// An xxh3-64 checksum (16 lowercase hex digits in JSON).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Xxh3Sum(pub u64);

/// A store id: the big-endian bytes of an XXH3-128 (32 lowercase hex digits in JSON and in
/// messages; raw 16 bytes in segment and staged headers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreId(pub [u8; 16]);

impl Xxh3Sum {
    /// Parses exactly 16 hex digits.
    pub fn from_hex(s: &str) -> Option<Xxh3Sum> {
        if s.len() != 16 || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(s, 16).ok().map(Xxh3Sum)
    }
}

impl StoreId {
    /// Parses exactly 32 hex digits.
    pub fn from_hex(s: &str) -> Option<StoreId> {
        if s.len() != 32 || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(StoreId(out))
    }
}

impl fmt::Display for Xxh3Sum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Display for StoreId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl Serialize for Xxh3Sum {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl Serialize for StoreId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Xxh3Sum {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Xxh3Sum, D::Error> {
        let s = String::deserialize(d)?;
        Xxh3Sum::from_hex(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("checksum {s:?} is not 16 hex digits")))
    }
}

impl<'de> Deserialize<'de> for StoreId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<StoreId, D::Error> {
        let s = String::deserialize(d)?;
        StoreId::from_hex(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("store_id {s:?} is not 32 hex digits")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refusals() {
        let x = Xxh3Sum(0x0123_4567_89ab_cdef);
        assert_eq!(x.to_string(), "0123456789abcdef");
        assert_eq!(Xxh3Sum::from_hex("0123456789ABCDEF"), Some(x));
        assert_eq!(Xxh3Sum::from_hex("+123456789abcdef"), None);
        assert_eq!(Xxh3Sum::from_hex("123"), None);
        let id = StoreId([0xab; 16]);
        assert_eq!(StoreId::from_hex(&id.to_string()), Some(id));
        assert_eq!(
            serde_json::to_string(&x).unwrap(),
            "\"0123456789abcdef\"".to_string()
        );
        let e = serde_json::from_str::<StoreId>("\"zz\"").unwrap_err();
        assert!(
            e.to_string()
                .contains("store_id \"zz\" is not 32 hex digits"),
            "{e}"
        );
    }
}
