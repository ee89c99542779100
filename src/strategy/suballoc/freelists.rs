//! The TLSF free lists of the suballocator: two-level bitmaps over size classes (16 per power
//! of two, in 256-byte units), so finding a good-fit free block is two bit scans; and the
//! free-block operations on them: insert with coalescing, remove, find.

use super::{FL, NIL, SL, SL_BITS, Suballoc, UNIT_SHIFT, USED};

#[derive(Debug, Clone)]
pub(super) struct FreeLists {
    fl_bitmap: u64,
    sl_bitmap: [u16; FL],
    pub(super) heads: Vec<u32>,
}

impl FreeLists {
    pub(super) fn new() -> Self {
        FreeLists {
            fl_bitmap: 0,
            sl_bitmap: [0; FL],
            heads: vec![NIL; FL * SL],
        }
    }

    /// No free block in any list.
    pub(super) fn is_empty(&self) -> bool {
        self.fl_bitmap == 0
    }
}

/// First- and second-level index of the list holding blocks of `size` bytes.
#[inline]
pub(super) fn mapping(size: u64) -> (usize, usize) {
    let u = size >> UNIT_SHIFT;
    if u < SL as u64 {
        return (0, u as usize);
    }
    let f = 63 - u.leading_zeros();
    ((f - SL_BITS + 1) as usize, ((u >> (f - SL_BITS)) as usize) & (SL - 1))
}

/// The list from which every block is at least `size` bytes (size rounded up to the next list).
#[inline]
pub(super) fn mapping_search(size: u64) -> (usize, usize) {
    let u = size >> UNIT_SHIFT;
    // Lists below SL units hold one size each; above, a list spans `step` units.
    let step = if u < SL as u64 {
        1
    } else {
        1u64 << (63 - u.leading_zeros() - SL_BITS)
    };
    mapping(u.saturating_add(step - 1) << UNIT_SHIFT)
}

impl Suballoc {
    /// A free node of list set `li` of at least `bytes`, or None. Good fit in O(1); when the
    /// rounded-up search finds nothing, scans the request's own list (a few entries) for an
    /// exact fit, which matters when memory is tight.
    pub(super) fn find(&self, li: u32, bytes: u64) -> Option<u32> {
        let lists = &self.lists[li as usize];
        let (fl, sl) = mapping_search(bytes);
        if fl < FL {
            let sl_map = lists.sl_bitmap[fl] & (!0u16 << sl);
            let (f, s) = if sl_map != 0 {
                (fl, sl_map.trailing_zeros() as usize)
            } else {
                let fl_map = if fl + 1 < 64 {
                    lists.fl_bitmap & (!0u64 << (fl + 1))
                } else {
                    0
                };
                if fl_map == 0 {
                    return self.find_exact(li, bytes);
                }
                let f = fl_map.trailing_zeros() as usize;
                (f, lists.sl_bitmap[f].trailing_zeros() as usize)
            };
            return Some(lists.heads[f * SL + s]);
        }
        self.find_exact(li, bytes)
    }

    #[cold]
    pub(super) fn find_exact(&self, li: u32, bytes: u64) -> Option<u32> {
        let (fl, sl) = mapping(bytes);
        let mut i = self.lists[li as usize].heads[fl * SL + sl];
        let mut steps = 0;
        while i != NIL && steps < crate::policy::FIND_EXACT_STEPS {
            if self.nodes[i].size >= bytes {
                return Some(i);
            }
            i = self.nodes[i].free_next;
            steps += 1;
        }
        None
    }

    /// Marks `idx` free in list set `li`, merging with free neighbours it may join; returns the
    /// index of the merged node.
    pub(super) fn insert_free(&mut self, mut idx: u32, li: u32) -> u32 {
        // Neighbours merge when they share a list, or one side is usable by every stream (the
        // result keeps the other side's stream restriction). All nodes of a slab share its pool.
        let mut tag = li;
        let prev = self.nodes[idx].phys_prev;
        if prev != NIL && self.joins(tag, self.nodes[prev].list) {
            if self.is_any(tag) {
                tag = self.nodes[prev].list;
            }
            self.remove_free(prev);
            self.absorb_next(prev);
            idx = prev;
        }
        let next = self.nodes[idx].phys_next;
        if next != NIL && self.joins(tag, self.nodes[next].list) {
            if self.is_any(tag) {
                tag = self.nodes[next].list;
            }
            self.remove_free(next);
            self.absorb_next(idx);
        }
        self.push_free(idx, tag);
        idx
    }

    /// Whether a free block of list `tag` may merge with a neighbour in list `other`.
    #[inline]
    pub(super) fn joins(&self, tag: u32, other: u32) -> bool {
        other != USED && (other == tag || self.is_any(other) || self.is_any(tag))
    }

    /// Node `idx` swallows its physical successor, whose slot is freed.
    pub(super) fn absorb_next(&mut self, idx: u32) {
        let next = self.nodes[idx].phys_next;
        let nn = self.nodes[next];
        let after = nn.phys_next;
        let node = &mut self.nodes[idx];
        node.size += nn.size;
        node.phys_next = after;
        if after != NIL {
            self.nodes[after].phys_prev = idx;
        }
        self.nodes[next].slab = NIL;
        self.nodes.release(next);
    }

    pub(super) fn push_free(&mut self, idx: u32, li: u32) {
        let (fl, sl) = mapping(self.nodes[idx].size);
        let lists = &mut self.lists[li as usize];
        let head = lists.heads[fl * SL + sl];
        lists.heads[fl * SL + sl] = idx;
        lists.fl_bitmap |= 1 << fl;
        lists.sl_bitmap[fl] |= 1 << sl;
        if head != NIL {
            self.nodes[head].free_prev = idx;
        }
        let n = &mut self.nodes[idx];
        n.free_prev = NIL;
        n.free_next = head;
        n.list = li;
    }

    pub(super) fn remove_free(&mut self, idx: u32) {
        let n = self.nodes[idx];
        debug_assert_ne!(n.list, USED);
        let (fl, sl) = mapping(n.size);
        if n.free_prev != NIL {
            self.nodes[n.free_prev].free_next = n.free_next;
        } else {
            let lists = &mut self.lists[n.list as usize];
            lists.heads[fl * SL + sl] = n.free_next;
            if n.free_next == NIL {
                lists.sl_bitmap[fl] &= !(1 << sl);
                if lists.sl_bitmap[fl] == 0 {
                    lists.fl_bitmap &= !(1 << fl);
                }
            }
        }
        if n.free_next != NIL {
            self.nodes[n.free_next].free_prev = n.free_prev;
        }
        self.nodes[idx].list = USED;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_search_never_returns_a_smaller_list() {
        for units in 1..5000u64 {
            let size = units << UNIT_SHIFT;
            let (fl, sl) = mapping_search(size);
            // The smallest size that maps to (fl, sl) must be >= size.
            let min_of_list = (1..=units * 2)
                .map(|u| u << UNIT_SHIFT)
                .find(|&s| mapping(s) == (fl, sl))
                .unwrap();
            assert!(min_of_list >= size, "size {size}: list min {min_of_list}");
        }
    }
}
