//! Page bookkeeping of a slab backed by virtual memory management (reserve an address range,
//! map and unmap physical pages in it, as CUDA's cuMemAddressReserve / cuMemMap do): which pages
//! are mapped, and how many live blocks touch each. A mapped page no live block touches can be
//! unmapped and its memory given back, even while its slab holds live blocks elsewhere; so free
//! space inside slabs is no longer stranded.

/// Pages of one slab. Offsets are relative to the slab's base.
#[derive(Debug, Clone)]
pub(crate) struct PageMap {
    page: u64,
    /// log2(page) when the page is a power of two (device pages, and most slabs backed by one
    /// handle): offsets then turn into pages by shifts; a slab of its own request's size backed
    /// by one handle has a page of that size, and divides.
    shift: Option<u32>,
    /// Live blocks overlapping each page.
    refs: Vec<u32>,
    mapped: Vec<bool>,
    pub(crate) mapped_bytes: u64,
    /// Mapped pages with no live block: memory that can be given back now.
    pub(crate) unused_mapped_bytes: u64,
}

impl PageMap {
    /// A slab of `size` bytes (a multiple of `page`), nothing mapped yet.
    pub(crate) fn new(size: u64, page: u64) -> Self {
        debug_assert!(page > 0, "page size 0");
        let n = size.div_ceil(page) as usize;
        PageMap {
            page,
            shift: page.is_power_of_two().then(|| page.trailing_zeros()),
            refs: vec![0; n],
            mapped: vec![false; n],
            mapped_bytes: 0,
            unused_mapped_bytes: 0,
        }
    }

    #[inline]
    fn pages_of(&self, offset: u64, len: u64) -> std::ops::Range<usize> {
        // Device pages are powers of two (CUDA's VMM granularity): shifts, not divisions.
        let (first, last) = match self.shift {
            Some(shift) => (offset >> shift, (offset + len + self.page - 1) >> shift),
            None => (offset / self.page, (offset + len).div_ceil(self.page)),
        };
        first as usize..(last as usize).min(self.refs.len())
    }

    /// The page size.
    pub(crate) fn page_size(&self) -> u64 {
        self.page
    }

    /// Every page is mapped (the common case once a slab is in use): nothing to map. One compare.
    #[inline]
    pub(crate) fn all_mapped(&self) -> bool {
        self.mapped_bytes == self.refs.len() as u64 * self.page
    }

    /// Pages in the slab.
    pub(crate) fn page_count(&self) -> usize {
        self.refs.len()
    }

    /// Page `p` is mapped and a live block touches it: its memory stays held until they go.
    pub(crate) fn is_pinned(&self, p: usize) -> bool {
        self.mapped[p] && self.refs[p] > 0
    }

    /// Every page under `offset..offset+len` is mapped.
    pub(crate) fn covers(&self, offset: u64, len: u64) -> bool {
        self.pages_of(offset, len).all(|p| self.mapped[p])
    }

    /// Bytes of the pages under `offset..offset+len` that no live block touches yet: what a
    /// block placed there would newly pin (memory that could otherwise go back).
    pub(crate) fn unpinned_bytes(&self, offset: u64, len: u64) -> u64 {
        self.pages_of(offset, len).filter(|&p| self.refs[p] == 0).count() as u64 * self.page
    }

    /// Runs `(offset, len)` of unmapped pages that a block at `offset..offset+len` needs.
    pub(crate) fn unmapped_runs(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for p in self.pages_of(offset, len) {
            if !self.mapped[p] {
                let start = p as u64 * self.page;
                match runs.last_mut() {
                    Some((s, l)) if *s + *l == start => *l += self.page,
                    _ => runs.push((start, self.page)),
                }
            }
        }
        runs
    }

    /// Records pages `offset..offset+len` as mapped (all of them unused so far).
    pub(crate) fn mark_mapped(&mut self, offset: u64, len: u64) {
        for p in self.pages_of(offset, len) {
            if !self.mapped[p] {
                self.mapped[p] = true;
                self.mapped_bytes += self.page;
                if self.refs[p] == 0 {
                    self.unused_mapped_bytes += self.page;
                }
            }
        }
    }

    /// A live block now covers `offset..offset+len` (its pages are mapped). Returns the bytes
    /// of pages it pinned (no live block touched them before).
    pub(crate) fn acquire(&mut self, offset: u64, len: u64) -> u64 {
        let mut pinned = 0;
        for p in self.pages_of(offset, len) {
            debug_assert!(self.mapped[p], "a live block on an unmapped page");
            if self.refs[p] == 0 {
                self.unused_mapped_bytes -= self.page;
                pinned += self.page;
            }
            self.refs[p] += 1;
        }
        pinned
    }

    /// The live block at `offset..offset+len` is gone. Returns the bytes of pages no live block
    /// touches any more.
    pub(crate) fn release(&mut self, offset: u64, len: u64) -> u64 {
        let mut unpinned = 0;
        for p in self.pages_of(offset, len) {
            self.refs[p] -= 1;
            if self.refs[p] == 0 {
                unpinned += self.page;
                if self.mapped[p] {
                    self.unused_mapped_bytes += self.page;
                }
            }
        }
        unpinned
    }

    /// Runs of mapped pages no live block touches, to unmap; marks them unmapped. Stops once
    /// `want` bytes are found.
    pub(crate) fn take_unused_runs(&mut self, want: u64) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut found = 0;
        for p in 0..self.refs.len() {
            if found >= want {
                break;
            }
            if self.mapped[p] && self.refs[p] == 0 {
                self.mapped[p] = false;
                self.mapped_bytes -= self.page;
                self.unused_mapped_bytes -= self.page;
                found += self.page;
                let start = p as u64 * self.page;
                match runs.last_mut() {
                    Some((s, l)) if *s + *l == start => *l += self.page,
                    _ => runs.push((start, self.page)),
                }
            }
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_live_blocks() {
        let mut m = PageMap::new(8 << 20, 2 << 20);
        assert_eq!(m.unmapped_runs(1 << 20, 3 << 20), vec![(0, 4 << 20)]);
        m.mark_mapped(0, 8 << 20);
        assert_eq!((m.mapped_bytes, m.unused_mapped_bytes), (8 << 20, 8 << 20));
        m.acquire(1 << 20, 3 << 20); // pages 0 and 1
        m.acquire(3 << 20, 1 << 20); // page 1
        assert_eq!(m.unused_mapped_bytes, 4 << 20);
        m.release(1 << 20, 3 << 20);
        assert_eq!(m.unused_mapped_bytes, 6 << 20, "page 0 free again, page 1 still used");
        let runs = m.take_unused_runs(u64::MAX);
        assert_eq!(runs, vec![(0, 2 << 20), (4 << 20, 4 << 20)]);
        assert_eq!((m.mapped_bytes, m.unused_mapped_bytes), (2 << 20, 0));
        assert_eq!(m.unmapped_runs(0, 6 << 20), vec![(0, 2 << 20), (4 << 20, 2 << 20)]);
    }
}
