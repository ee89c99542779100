//! A fast hasher for the allocator's small integer keys (pointers, size classes, streams).
//! SipHash's DoS resistance buys nothing here (keys come from the allocator itself) and costs
//! ~20 ns a lookup; this is a multiply and a fold.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const K: u64 = 0x517c_c1b7_2722_0a95;

/// Multiply-rotate hashing (as in rustc's FxHash), with a final fold so that keys whose low bits
/// are always zero (256-byte-aligned pointers) still spread over the table's low-bit buckets.
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

impl FastHasher {
    #[inline]
    fn mix(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(K);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29) ^ (self.0 >> 47)
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut buf = [0u8; 8];
            buf[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(buf));
        }
    }
    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.mix(v as u64);
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.mix(v as u64);
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.mix(v);
    }
    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.mix(v as u64);
    }
    #[inline]
    fn write_isize(&mut self, v: isize) {
        self.mix(v as u64);
    }
}

/// A HashMap with [`FastHasher`].
pub type FastMap<K, V> = HashMap<K, V, FastBuild>;

/// The builder of [`FastHasher`]s, for maps and sets of the allocator's keys.
pub type FastBuild = BuildHasherDefault<FastHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, BuildHasherDefault};

    #[test]
    fn aligned_pointers_spread_over_low_bits() {
        let b = BuildHasherDefault::<FastHasher>::default();
        let mut buckets = [0u32; 64];
        for i in 0..6400u64 {
            let h = b.hash_one(0x7f00_0000_0000u64 + i * 256);
            buckets[(h & 63) as usize] += 1;
        }
        assert!(buckets.iter().all(|&n| n > 50 && n < 150), "{buckets:?}");
    }
}
