//! The live-pointer table: device pointer -> record, touched by every allocate and free.
//!
//! Open addressing with linear probing and backward-shift deletion (no tombstones), Fibonacci
//! hashing of the pointer without its always-zero low 8 bits, load at most 1/2. Cost: a multiply,
//! a shift and, at that load, 1-2 probes for an insert, lookup or remove; a hash map of 56-byte
//! entries cost ~3x the instructions (callgrind, examples/hotpath.rs). Keys are 256-byte-aligned
//! device pointers, so `u64::MAX` (never aligned) marks an empty slot.

const EMPTY: u64 = u64::MAX;
const MIN_SLOTS: usize = 64;

#[derive(Debug, Clone)]
pub(crate) struct PtrTable<V> {
    keys: Vec<u64>,
    vals: Vec<V>,
    len: usize,
    /// `64 - log2(slots)`: the hash's top bits pick the home slot.
    shift: u32,
}

impl<V: Copy + Default> Default for PtrTable<V> {
    fn default() -> Self {
        Self::with_slots(MIN_SLOTS)
    }
}

impl<V: Copy + Default> PtrTable<V> {
    fn with_slots(slots: usize) -> Self {
        debug_assert!(slots.is_power_of_two());
        PtrTable {
            keys: vec![EMPTY; slots],
            vals: vec![V::default(); slots],
            len: 0,
            shift: 64 - slots.trailing_zeros(),
        }
    }

    #[inline]
    fn mask(&self) -> usize {
        self.keys.len() - 1
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        ((key >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Inserts or replaces; returns the value replaced. `key` must not be `u64::MAX`.
    #[inline]
    pub(crate) fn insert(&mut self, key: u64, val: V) -> Option<V> {
        debug_assert_ne!(key, EMPTY);
        if (self.len + 1) * 2 > self.keys.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let k = self.keys[i];
            if k == EMPTY {
                self.keys[i] = key;
                self.vals[i] = val;
                self.len += 1;
                return None;
            }
            if k == key {
                return Some(std::mem::replace(&mut self.vals[i], val));
            }
            i = (i + 1) & mask;
        }
    }

    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        if key == EMPTY {
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let k = self.keys[i];
            if k == key {
                return Some(i);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<&V> {
        self.find(key).map(|i| &self.vals[i])
    }

    /// Removes `key`; later entries of its probe run shift back into the hole.
    #[inline]
    pub(crate) fn remove(&mut self, key: u64) -> Option<V> {
        let mut hole = self.find(key)?;
        let val = self.vals[hole];
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let k = self.keys[j];
            if k == EMPTY {
                break;
            }
            // The entry at j may fill the hole unless its home lies cyclically in (hole, j].
            let home = self.home(k);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.keys[hole] = k;
                self.vals[hole] = self.vals[j];
                hole = j;
            }
        }
        self.keys[hole] = EMPTY;
        self.len -= 1;
        Some(val)
    }

    /// Takes every entry out, in slot order.
    pub(crate) fn drain(&mut self) -> Vec<(u64, V)> {
        let out = self
            .keys
            .iter()
            .zip(&self.vals)
            .filter(|(k, _)| **k != EMPTY)
            .map(|(k, v)| (*k, *v))
            .collect();
        *self = Self::default();
        out
    }

    #[cold]
    fn grow(&mut self) {
        let old = std::mem::replace(self, Self::with_slots(self.keys.len() * 2));
        for (k, v) in old.keys.into_iter().zip(old.vals) {
            if k != EMPTY {
                self.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn max_key_is_never_found() {
        let mut t = PtrTable::<u32>::default();
        t.insert(256, 1);
        assert_eq!(t.get(u64::MAX), None);
        assert_eq!(t.remove(u64::MAX), None);
        assert_eq!(t.len(), 1);
    }

    proptest! {
        /// Against a HashMap, with keys crowded into few home slots so probe runs wrap and shift.
        #[test]
        fn matches_a_hash_map(ops in proptest::collection::vec((0u8..3, 0u64..200), 1..600)) {
            let mut t = PtrTable::<u64>::default();
            let mut m = HashMap::new();
            for (n, (op, k)) in ops.into_iter().enumerate() {
                let key = k << 8;
                match op {
                    0 => prop_assert_eq!(t.insert(key, n as u64), m.insert(key, n as u64)),
                    1 => prop_assert_eq!(t.remove(key), m.remove(&key)),
                    _ => prop_assert_eq!(t.get(key), m.get(&key)),
                }
                prop_assert_eq!(t.len(), m.len());
            }
            for (k, v) in &m {
                prop_assert_eq!(t.get(*k), Some(v));
            }
            let mut drained = t.drain();
            drained.sort();
            let mut expect: Vec<_> = m.into_iter().collect();
            expect.sort();
            prop_assert_eq!(drained, expect);
            prop_assert_eq!(t.len(), 0);
        }
    }
}
