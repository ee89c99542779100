//! An arena of nodes addressed by `u32` index, recycling released slots: the host-side node
//! storage of the caching and suballocation strategies (no pointers into device memory).

use std::ops::{Index, IndexMut};

#[derive(Debug, Clone)]
pub(crate) struct Slots<T> {
    items: Vec<T>,
    released: Vec<u32>,
}

impl<T> Slots<T> {
    pub(crate) fn new() -> Self {
        Slots {
            items: Vec::new(),
            released: Vec::new(),
        }
    }

    /// Stores `item` in a recycled slot or a new one; O(1) amortized.
    #[inline]
    pub(crate) fn insert(&mut self, item: T) -> u32 {
        match self.released.pop() {
            Some(i) => {
                self.items[i as usize] = item;
                i
            }
            None => {
                self.items.push(item);
                (self.items.len() - 1) as u32
            }
        }
    }

    /// Marks slot `idx` free for reuse. The caller no longer reads it.
    #[inline]
    pub(crate) fn release(&mut self, idx: u32) {
        debug_assert!((idx as usize) < self.items.len());
        self.released.push(idx);
    }

    /// Slots in use.
    pub(crate) fn live(&self) -> usize {
        self.items.len() - self.released.len()
    }

    /// Every slot ever stored, released ones included (callers mark those themselves).
    pub(crate) fn iter_all(&self) -> impl Iterator<Item = &T> {
        self.items.iter()
    }
}

impl<T> Index<u32> for Slots<T> {
    type Output = T;
    #[inline]
    fn index(&self, idx: u32) -> &T {
        &self.items[idx as usize]
    }
}

impl<T> IndexMut<u32> for Slots<T> {
    #[inline]
    fn index_mut(&mut self, idx: u32) -> &mut T {
        &mut self.items[idx as usize]
    }
}
