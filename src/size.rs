//! Byte sizes: the `ByteSize` newtype that parses "512MiB", and alignment helpers.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::ConfigError;

/// Every pointer adaptalloc hands out is aligned to this many bytes (what `cudaMalloc` guarantees).
pub const ALIGNMENT: u64 = 256;

/// 1024 bytes.
pub const KIB: u64 = 1 << 10;
/// 1024 KiB.
pub const MIB: u64 = 1 << 20;
/// 1024 MiB.
pub const GIB: u64 = 1 << 30;
/// 1024 GiB.
pub const TIB: u64 = 1 << 40;

/// Rounds `value` up to a multiple of `align` (a power of two). Saturates at the largest multiple
/// instead of overflowing, so `usize::MAX`-sized requests become a "too large" error, not a wrap.
#[inline]
pub fn align_up(value: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    match value.checked_add(align - 1) {
        Some(v) => v & !(align - 1),
        None => !(align - 1),
    }
}

/// Rounds `value` up to a multiple of `granule` (any positive number), saturating like [`align_up`].
#[inline]
pub fn round_up(value: u64, granule: u64) -> u64 {
    debug_assert!(granule > 0);
    let rem = value % granule;
    if rem == 0 {
        value
    } else {
        value
            .checked_add(granule - rem)
            .unwrap_or(u64::MAX - (u64::MAX % granule))
    }
}

/// A number of bytes. Parses and prints human units: `"512MiB"`, `"1.5 GiB"`, `"4096"`, `"2GB"`.
///
/// Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal units (KB, MB, GB, TB) powers of
/// 1000; a bare number, or the suffix `B`, is bytes. In TOML a size may be a string or an integer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl From<u64> for ByteSize {
    fn from(v: u64) -> Self {
        ByteSize(v)
    }
}

impl FromStr for ByteSize {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| ConfigError::BadSize {
            text: text.to_string(),
            reason: reason.to_string(),
        };
        let s = text.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
            .unwrap_or(s.len());
        let (number, unit) = s.split_at(split);
        let number = number.replace('_', "");
        if number.is_empty() {
            return Err(bad("it does not start with a number"));
        }
        let unit_bytes: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => KIB,
            "m" | "mib" => MIB,
            "g" | "gib" => GIB,
            "t" | "tib" => TIB,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            _ => {
                return Err(bad("unknown unit; use B, KiB, MiB, GiB, TiB (or KB, MB, GB, TB)"));
            }
        };
        if let Ok(whole) = number.parse::<u64>() {
            return whole
                .checked_mul(unit_bytes)
                .map(ByteSize)
                .ok_or_else(|| bad("it does not fit in 64 bits"));
        }
        let value: f64 = number.parse().map_err(|_| bad("the number is malformed"))?;
        let bytes = value * unit_bytes as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(bad("it does not fit in 64 bits"));
        }
        Ok(ByteSize(bytes.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    /// Exact when the size is a whole number of a binary unit ("512MiB"), else two decimals.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        for (unit, name) in [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
            if v >= unit {
                return if v % unit == 0 {
                    write!(f, "{}{}", v / unit, name)
                } else {
                    write!(f, "{:.2}{}", v as f64 / unit as f64, name)
                };
            }
        }
        write!(f, "{v}B")
    }
}

impl ByteSize {
    /// The size with a unit where that names it exactly ("512MiB", "1.50GiB"); None where only
    /// its bytes do (the display rounds to two decimals).
    pub fn named_exactly(&self) -> Option<String> {
        let named = self.to_string();
        (self.0 > 0 && named.parse::<ByteSize>().is_ok_and(|b| b == *self)).then_some(named)
    }
}

impl Serialize for ByteSize {
    /// A string with a unit where that names the size exactly, else the bytes as an integer:
    /// a policy written out reads back the same.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.named_exactly() {
            Some(named) => s.serialize_str(&named),
            None => s.serialize_u64(self.0),
        }
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: a non-negative integer of bytes or a string like \"512MiB\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("a size cannot be negative (got {v})")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!("512MiB".parse::<ByteSize>().unwrap(), ByteSize(512 * MIB));
        assert_eq!("1.5 GiB".parse::<ByteSize>().unwrap(), ByteSize(3 * GIB / 2));
        assert_eq!("4096".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert_eq!("2GB".parse::<ByteSize>().unwrap(), ByteSize(2_000_000_000));
        assert_eq!("1_024 KiB".parse::<ByteSize>().unwrap(), ByteSize(MIB));
    }

    #[test]
    fn rejects_garbage_with_reason() {
        let err = "12 parsecs".parse::<ByteSize>().unwrap_err().to_string();
        assert!(err.contains("12 parsecs") && err.contains("unknown unit"), "{err}");
        assert!("MiB".parse::<ByteSize>().is_err());
        assert!("-5MiB".parse::<ByteSize>().is_err());
        assert!("99999999999TiB".parse::<ByteSize>().is_err());
    }

    #[test]
    fn display_round_trips() {
        for v in [0, 1, 255, KIB, 3 * MIB, 5 * GIB, 2 * TIB] {
            let text = ByteSize(v).to_string();
            assert_eq!(text.parse::<ByteSize>().unwrap(), ByteSize(v), "{text}");
        }
    }

    #[test]
    fn rounding_saturates() {
        assert_eq!(align_up(1, 256), 256);
        assert_eq!(align_up(512, 256), 512);
        assert_eq!(align_up(u64::MAX, 256), !255);
        assert_eq!(round_up(5, 3), 6);
        assert_eq!(round_up(u64::MAX, 2 * MIB), u64::MAX - (u64::MAX % (2 * MIB)));
    }
}

/// Log-linear size classes used by the caching strategy.
///
/// Up to 4 KiB classes are linear, 256 B apart (no rounding beyond the 256 B alignment). Above,
/// each power of two is split into 8 classes, so a request is rounded up to its class's size by
/// less than 1/8 of the size: **worst-case rounding waste is 12.5%** (4097 B becomes 4608 B),
/// and the mean over uniformly spread sizes is about 6%.
pub mod class {
    use super::ALIGNMENT;

    const LINEAR_LIMIT: u64 = 4096;
    const LINEAR_CLASSES: u32 = (LINEAR_LIMIT / ALIGNMENT) as u32; // 16
    const SUB_BITS: u32 = 3;

    /// The class of a request of `bytes` (> 0). Cost: a few integer instructions.
    #[inline]
    pub fn of(bytes: u64) -> u32 {
        let s = super::align_up(bytes.max(1), ALIGNMENT);
        if s <= LINEAR_LIMIT {
            return (s / ALIGNMENT) as u32;
        }
        let e = 63 - (s - 1).leading_zeros(); // 2^e < s <= 2^(e+1), e >= 12
        let sub = ((s - 1) >> (e - SUB_BITS)) as u32 & ((1 << SUB_BITS) - 1);
        LINEAR_CLASSES + (e - 12) * (1 << SUB_BITS) + sub + 1
    }

    /// The block size every request of class `class` gets (its largest member).
    #[inline]
    pub fn size(class: u32) -> u64 {
        if class <= LINEAR_CLASSES {
            return class as u64 * ALIGNMENT;
        }
        let k = class - LINEAR_CLASSES - 1;
        let e = 12 + k / (1 << SUB_BITS);
        let sub = (k % (1 << SUB_BITS)) as u64;
        ((1 << SUB_BITS) + sub + 1) << (e - SUB_BITS)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn classes_cover_sizes_with_bounded_waste() {
            let mut probes: Vec<u64> = (1..70_000).step_by(37).collect();
            for shift in 12..50 {
                let p = 1u64 << shift;
                probes.extend([p - 1, p, p + 1, p + p / 3, p + p / 8 + 1]);
            }
            for b in probes {
                let c = of(b);
                let s = size(c);
                assert!(s >= b, "class {c} size {s} < request {b}");
                assert_eq!(s % ALIGNMENT, 0);
                assert_eq!(of(s), c, "size of class maps back to it ({b})");
                let aligned = crate::size::align_up(b, ALIGNMENT);
                assert!((s - aligned) * 8 <= aligned, "waste over 12.5% for {b}: {s}");
            }
            assert!(of(u64::MAX / 2) > of(1 << 40));
        }
    }
}
