//! `expandable_segments:True`: one reserved address range per stream and pool (1.125x the
//! device's memory), mapped a page at a time (2 MiB pages for the small pool, 20 MiB for the
//! large), grown at its end and unmapped only by `release_cached_blocks`.

use super::{Block, Driver, LARGE_BUFFER, Model, Params, SMALL, SMALL_BUFFER, Segment};

impl Model {
    /// `try_allocate_expandable_block`: a mapped block of at least `p.size` bytes.
    pub(super) fn try_allocate_expandable_block<D: Driver>(&mut self, d: &mut D, p: &Params) -> Option<u64> {
        let mut candidate = self.find_expandable_block(d, p)?;
        if !self.blocks[&candidate].mapped {
            let n = self.blocks[&candidate].size.min(p.size);
            candidate = self.map_block(d, candidate, n)?;
        }
        while self.blocks[&candidate].size < p.size {
            // Invariant: free -> unmapped -> ...; map some of the unmapped and merge.
            let remaining = p.size - self.blocks[&candidate].size;
            let next = self.next(candidate)?;
            let n = remaining.min(self.blocks[&next].size);
            candidate = self.map_block(d, next, n)?;
        }
        self.remove_free(candidate);
        Some(candidate)
    }

    /// `find_expandable_block`: the lowest unmapped range of this stream's segment (with the
    /// free block before it) that has room, or a new segment.
    fn find_expandable_block<D: Driver>(&mut self, d: &mut D, p: &Params) -> Option<u64> {
        let allocatable = |m: &Self, a: Option<u64>| a.filter(|a| !m.blocks[a].allocated);
        let unmapped: Vec<u64> = self.unmapped[p.pool]
            .range((p.stream, 0)..)
            .take_while(|k| k.0 == p.stream)
            .map(|k| k.1)
            .collect();
        for c in unmapped {
            let c = allocatable(self, self.prev(c)).unwrap_or(c);
            let (mut bytes, mut at) = (0, Some(c));
            while bytes < p.size
                && let Some(a) = allocatable(self, at)
            {
                bytes += self.blocks[&a].size;
                at = self.next(a);
            }
            if bytes >= p.size {
                return Some(c);
            }
        }
        let page = if p.pool == SMALL { SMALL_BUFFER } else { LARGE_BUFFER };
        let total = d.total_memory();
        let size = (total + total / 8).div_ceil(page) * page;
        let base = d.reserve(size)?;
        self.segments.insert(base, Segment { size, page: Some(page) });
        self.blocks.insert(
            base,
            Block {
                size,
                stream: p.stream,
                pool: p.pool,
                allocated: false,
                mapped: false,
                seg: base,
                gc_base: 0,
            },
        );
        self.unmapped[p.pool].insert((p.stream, base));
        Some(base)
    }

    /// `map_block`: maps the pages under the first `size` bytes of the unmapped block `addr`
    /// (`mapAndSetAccess`: a create and a map per page, one access grant for the range), merges
    /// with free neighbours and returns the resulting free block; None when the device refused
    /// (nothing stays mapped).
    fn map_block<D: Driver>(&mut self, d: &mut D, addr: u64, size: u64) -> Option<u64> {
        let b = self.blocks[&addr].clone();
        let page = self.segments[&b.seg].page.expect("expandable");
        let bytes = size.div_ceil(page) * page;
        if !d.map(addr, bytes, page) {
            return None;
        }
        self.stats.page_maps += bytes / page;
        self.unmapped[b.pool].remove(&(b.stream, addr));
        if bytes < b.size {
            self.blocks.insert(
                addr + bytes,
                Block {
                    size: b.size - bytes,
                    mapped: false,
                    ..b.clone()
                },
            );
            self.unmapped[b.pool].insert((b.stream, addr + bytes));
        }
        {
            let m = self.blocks.get_mut(&addr).expect("block");
            m.size = bytes;
            m.mapped = true;
        }
        self.stats.reserved.add(bytes);
        let at = self.merge_neighbours(addr);
        self.insert_free(at);
        Some(at)
    }

    /// `unmap_block`: gives back the whole pages inside the free block `addr`; what is left of
    /// it on either side stays free and mapped. Returns the unmapped block (merged with
    /// unmapped neighbours), or `addr` when no whole page was inside.
    pub(super) fn unmap_block<D: Driver>(&mut self, d: &mut D, addr: u64) -> u64 {
        let b = self.blocks[&addr].clone();
        let page = self.segments[&b.seg].page.expect("expandable");
        let first = b.seg + (addr - b.seg).div_ceil(page) * page;
        let end = b.seg + (addr + b.size - b.seg) / page * page;
        if first >= end {
            return addr;
        }
        self.remove_free(addr);
        d.unmap(first, end - first);
        self.stats.page_unmaps += (end - first) / page;
        self.stats.reserved.sub(end - first);
        self.blocks.remove(&addr);
        if first > addr {
            self.blocks.insert(
                addr,
                Block {
                    size: first - addr,
                    ..b.clone()
                },
            );
            self.insert_free(addr);
        }
        if end < addr + b.size {
            self.blocks.insert(
                end,
                Block {
                    size: addr + b.size - end,
                    ..b.clone()
                },
            );
            self.insert_free(end);
        }
        self.blocks.insert(
            first,
            Block {
                size: end - first,
                mapped: false,
                ..b
            },
        );
        let at = self.merge_neighbours(first);
        let s = &self.blocks[&at];
        self.unmapped[s.pool].insert((s.stream, at));
        at
    }

    /// `release_expandable_segment`: a wholly unmapped segment gives back its address range.
    pub(super) fn release_expandable_segment<D: Driver>(&mut self, d: &mut D, addr: u64) {
        let b = self.blocks.remove(&addr).expect("block");
        self.unmapped[b.pool].remove(&(b.stream, addr));
        self.segments.remove(&b.seg);
        d.unreserve(b.seg);
    }
}
