//! Page bookkeeping of a slab backed by virtual memory management (reserve an address range,
//! map and unmap physical pages in it, as CUDA's cuMemAddressReserve / cuMemMap do): which pages
//! are mapped, and how many live blocks touch each. A mapped page no live block touches can be
//! unmapped and its memory given back, even while its slab holds live blocks elsewhere; so free
//! space inside slabs is no longer stranded.

/// No handle: the page is not mapped.
const UNMAPPED: u32 = u32::MAX;

/// Pages of one slab, and the physical handles mapped over them: a handle covers one page or a
/// run of them (a handle shaped to a block, `SlabBacking::Blocks`), and goes back whole, once no
/// live block touches any of its pages. Offsets are relative to the slab's base.
#[derive(Debug, Clone)]
pub(crate) struct PageMap {
    page: u64,
    /// log2(page) when the page is a power of two, as every device page is (the suballocator
    /// pages slabs only on such a device, and a larger handle is a run of pages): offsets then
    /// turn into pages by shifts. The division for other pages is kept: dropping the branch
    /// moved the pair hot path's callgrind count from 748.4 to 750.4 instructions, past issue
    /// 24's bar of 750.
    shift: Option<u32>,
    /// Each page's state: one bounds check per page on the hot path.
    st: Vec<Page>,
    /// Handles mapped here that are larger than a page (0: every handle is a page, as after a
    /// split of the last larger one).
    larger_handles: u32,
    /// One handle covers every page ([`covers_all`](Self::covers_all)), kept in step by
    /// `mark_mapped`, `unmark_idle` and `split`: read on every block placed and freed, where
    /// deriving it cost 12 instructions an operation (`scripts/hotpath.sh`, churn-adaptive).
    one_handle: bool,
    pub(crate) mapped_bytes: u64,
    /// Mapped handles no live block touches: memory that can be given back now.
    pub(crate) unused_mapped_bytes: u64,
}

/// One page of a [`PageMap`].
#[derive(Debug, Clone, Copy)]
struct Page {
    /// Live blocks overlapping the page.
    refs: u32,
    /// The page's handle, by its first page; [`UNMAPPED`] when the page is not mapped.
    head: u32,
    /// At a handle's first page: its pages, and how many of them live blocks touch.
    len: u32,
    live: u32,
}

impl PageMap {
    /// A slab of `size` bytes (a multiple of `page`), nothing mapped yet.
    pub(crate) fn new(size: u64, page: u64) -> Self {
        debug_assert!(page > 0, "page size 0");
        let n = size.div_ceil(page) as usize;
        PageMap {
            page,
            shift: page.is_power_of_two().then(|| page.trailing_zeros()),
            st: vec![
                Page {
                    refs: 0,
                    head: UNMAPPED,
                    len: 0,
                    live: 0,
                };
                n
            ],
            larger_handles: 0,
            one_handle: false,
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
        first as usize..(last as usize).min(self.st.len())
    }

    /// The page size: the unit handles are made of.
    pub(crate) fn page_size(&self) -> u64 {
        self.page
    }

    /// Every page is mapped (the common case once a slab is in use): nothing to map. One compare.
    #[inline]
    pub(crate) fn all_mapped(&self) -> bool {
        self.mapped_bytes == self.st.len() as u64 * self.page
    }

    /// The handle page `p` is mapped in, as (first page, pages), when a live block touches it.
    pub(crate) fn live_handle_at(&self, p: usize) -> Option<(usize, usize)> {
        let h = self.st.get(p)?.head;
        (h != UNMAPPED && self.is_live(h)).then(|| (h as usize, self.st[h as usize].len as usize))
    }

    /// Every page under `offset..offset+len` is mapped.
    pub(crate) fn covers(&self, offset: u64, len: u64) -> bool {
        self.pages_of(offset, len).all(|p| self.st[p].head != UNMAPPED)
    }

    /// Bytes that a block at `offset..offset+len` would newly pin: its pages that are not
    /// mapped or that no live block touches yet. A page is pinned, not its whole handle: out of
    /// memory, a handle live blocks touch in part is split and gives the rest back
    /// (`Suballoc::split_held_handles`), so what no release reaches is the touched pages.
    pub(crate) fn unpinned_bytes(&self, offset: u64, len: u64) -> u64 {
        let r = self.pages_of(offset, len);
        self.st[r]
            .iter()
            .filter(|pg| pg.head == UNMAPPED || pg.refs == 0)
            .count() as u64
            * self.page
    }

    /// Runs `(offset, len)` of unmapped pages that a block at `offset..offset+len` needs.
    pub(crate) fn unmapped_runs(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for p in self.pages_of(offset, len) {
            if self.st[p].head == UNMAPPED {
                let start = p as u64 * self.page;
                match runs.last_mut() {
                    Some((s, l)) if *s + *l == start => *l += self.page,
                    _ => runs.push((start, self.page)),
                }
            }
        }
        runs
    }

    /// Records pages `offset..offset+len` as mapped in handles of `handle` bytes each (a
    /// multiple of the page dividing `len`), none of them used so far. The live blocks already
    /// over those pages (none, where the caller maps what a new block needs) count.
    pub(crate) fn mark_mapped(&mut self, offset: u64, len: u64, handle: u64) {
        debug_assert!(handle % self.page == 0 && len % handle == 0, "handles of whole pages");
        let per = (handle / self.page) as usize;
        let range = self.pages_of(offset, len);
        self.one_handle = self.mapped_bytes == 0 && range.start == 0 && per == self.st.len();
        for first in range.clone().step_by(per.max(1)) {
            let h = first as u32;
            let pages = first..(first + per).min(range.end);
            debug_assert!(pages.clone().all(|p| self.st[p].head == UNMAPPED), "mapped twice");
            let live = pages.clone().filter(|&p| self.st[p].refs > 0).count() as u32;
            for p in pages.clone() {
                // `len` is kept at the first page only: 0 elsewhere, so that 1 means a page
                // that is a handle of its own.
                self.st[p].head = h;
                self.st[p].len = 0;
            }
            self.st[first].len = pages.len() as u32;
            self.st[first].live = live;
            self.larger_handles += u32::from(pages.len() > 1);
            let bytes = pages.len() as u64 * self.page;
            self.mapped_bytes += bytes;
            if live == 0 {
                self.unused_mapped_bytes += bytes;
            }
        }
    }

    /// A live block now covers `offset..offset+len` (its pages are mapped). Returns the bytes
    /// of the pages it pinned (no live block touched them before). Cost: a counter per page;
    /// where handles are larger than a page and more than one, a second per page no live block
    /// touched (cold).
    #[inline]
    pub(crate) fn acquire(&mut self, offset: u64, len: u64) -> u64 {
        let range = self.pages_of(offset, len);
        let mut now_touched = 0u32;
        for pg in &mut self.st[range.clone()] {
            debug_assert!(pg.head != UNMAPPED, "a live block on an unmapped page");
            pg.refs += 1;
            now_touched += u32::from(pg.refs == 1);
        }
        // The handles' own counts of touched pages, and the idle handles' bytes.
        let pinned_handles = if self.larger_handles == 0 {
            u64::from(now_touched) * self.page
        } else if self.one_handle {
            debug_assert!(self.covers_all());
            self.handle_touched(0, now_touched as i32)
        } else {
            self.handles_touched(range, 1)
        };
        self.unused_mapped_bytes -= pinned_handles;
        u64::from(now_touched) * self.page
    }

    /// The live block at `offset..offset+len` is gone. Returns the bytes of the pages no live
    /// block touches any more.
    #[inline]
    pub(crate) fn release(&mut self, offset: u64, len: u64) -> u64 {
        let range = self.pages_of(offset, len);
        let mut untouched = 0u32;
        for pg in &mut self.st[range.clone()] {
            pg.refs -= 1;
            untouched += u32::from(pg.refs == 0);
        }
        let freed_handles = if self.larger_handles == 0 {
            u64::from(untouched) * self.page
        } else if self.one_handle {
            debug_assert!(self.covers_all());
            self.handle_touched(0, -(untouched as i32))
        } else {
            self.handles_touched(range, -1)
        };
        self.unused_mapped_bytes += freed_handles;
        u64::from(untouched) * self.page
    }

    /// After [`acquire`](Self::acquire) (`by` 1) or [`release`](Self::release) (-1) over
    /// `range`, where some handle is larger than a page: counts the pages that live blocks now
    /// touch (or no longer do) in their handles; returns the bytes of the handles that became
    /// pinned (or free).
    #[cold]
    #[inline(never)]
    fn handles_touched(&mut self, range: std::ops::Range<usize>, by: i32) -> u64 {
        let changed = u32::from(by > 0);
        let mut bytes = 0;
        for p in range {
            let pg = self.st[p];
            if pg.refs == changed {
                bytes += if pg.len == 1 {
                    self.page
                } else {
                    self.handle_touched(pg.head as usize, by)
                };
            }
        }
        bytes
    }

    /// `by` more (or fewer, negative) pages of the handle at page `h` (of more than one page)
    /// are touched by live blocks; returns the handle's bytes when that took it from idle to
    /// used or back, else 0.
    #[inline]
    fn handle_touched(&mut self, h: usize, by: i32) -> u64 {
        let hd = &mut self.st[h];
        let was = hd.live;
        hd.live = hd.live.wrapping_add_signed(by);
        if (was == 0) != (hd.live == 0) {
            u64::from(hd.len) * self.page
        } else {
            0
        }
    }

    /// A live block touches handle `h`.
    fn is_live(&self, h: u32) -> bool {
        let hd = &self.st[h as usize];
        if hd.len == 1 { hd.refs > 0 } else { hd.live > 0 }
    }

    /// One handle covers every page (a slab backed whole by one handle, `SlabBacking::Auto`):
    /// its count of touched pages then moves by a block's pages at once, with no walk. What
    /// the `one_handle` field keeps.
    fn covers_all(&self) -> bool {
        self.st[0].head == 0 && self.st[0].len as usize == self.st.len()
    }

    /// The first page of each handle under `offset..offset+len`, in order.
    fn handles_under(&self, offset: u64, len: u64) -> impl Iterator<Item = usize> + '_ {
        let mut last = UNMAPPED;
        self.pages_of(offset, len).filter_map(move |p| {
            let h = self.st[p].head;
            if h == UNMAPPED || h == last {
                return None;
            }
            last = h;
            Some(h as usize)
        })
    }

    /// Every handle mapped here is one page: any idle one can be moved to any unmapped page.
    pub(crate) fn pages_only(&self) -> bool {
        self.larger_handles == 0
    }

    /// Some mapped handle has no live block: a quick test before a walk.
    #[inline]
    pub(crate) fn has_idle_handles(&self) -> bool {
        self.unused_mapped_bytes > 0
    }

    /// The first pages of the handles of more than one page that no live block touches,
    /// under `offset..offset+len` and reaching past the pages that range covers: a block
    /// placed there would pin all of them for part of their memory.
    fn overhanging_idle(&self, offset: u64, len: u64) -> impl Iterator<Item = usize> + '_ {
        let span = self.pages_of(offset, len);
        self.handles_under(offset, len).filter(move |&first| {
            let hd = &self.st[first];
            let n = hd.len as usize;
            n > 1 && hd.live == 0 && (first < span.start || first + n > span.end)
        })
    }

    /// Some idle handle would be pinned in part by a block at `offset..offset+len`.
    pub(crate) fn overhangs_idle(&self, offset: u64, len: u64) -> bool {
        self.has_idle_handles() && self.overhanging_idle(offset, len).next().is_some()
    }

    /// Takes back the idle handles a block at `offset..offset+len` would pin in part
    /// ([`overhangs_idle`](Self::overhangs_idle)): marks them unmapped and returns them as
    /// `(offset, len)`.
    pub(crate) fn take_unused_overhanging(&mut self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let firsts: Vec<usize> = self.overhanging_idle(offset, len).collect();
        let mut taken = Vec::with_capacity(firsts.len());
        for first in firsts {
            let bytes = self.unmark_idle(first);
            taken.push((first as u64 * self.page, bytes));
        }
        taken
    }

    /// Marks the idle handle starting at page `first` unmapped; returns its bytes.
    fn unmark_idle(&mut self, first: usize) -> u64 {
        let n = self.st[first].len as usize;
        debug_assert!(!self.is_live(first as u32), "only an idle handle goes back");
        self.one_handle = false;
        self.larger_handles -= u32::from(n > 1);
        for q in first..first + n {
            self.st[q].head = UNMAPPED;
        }
        let bytes = n as u64 * self.page;
        self.mapped_bytes -= bytes;
        self.unused_mapped_bytes -= bytes;
        bytes
    }

    /// The handles of more than one page that live blocks touch only in part, as (first page,
    /// pages, pages live blocks touch): each could give back its untouched pages if split
    /// ([`split`](Self::split)). Cold: a walk of the handles.
    pub(crate) fn partly_live_handles(&self) -> Vec<(usize, usize, usize)> {
        let mut found = Vec::new();
        if self.larger_handles == 0 {
            return found;
        }
        let mut p = 0;
        while p < self.st.len() {
            let hd = self.st[p];
            if hd.head == UNMAPPED {
                p += 1;
                continue;
            }
            let n = hd.len as usize;
            if n > 1 && hd.live > 0 && (hd.live as usize) < n {
                found.push((p, n, hd.live as usize));
            }
            p += n.max(1);
        }
        found
    }

    /// The pages of the handle at page `first` that live blocks touch, as byte offsets from
    /// the handle's start.
    pub(crate) fn live_pages_of(&self, first: usize) -> Vec<u64> {
        let n = self.st[first].len as usize;
        (0..n)
            .filter(|&i| self.st[first + i].refs > 0)
            .map(|i| i as u64 * self.page)
            .collect()
    }

    /// Handles of more than one page, every page of which live blocks touch, under
    /// `offset..offset+len`: (first page, pages).
    pub(crate) fn fully_live_handles_over(&self, offset: u64, len: u64) -> Vec<(usize, usize)> {
        self.handles_under(offset, len)
            .map(|h| (h, self.st[h].len as usize))
            .filter(|&(h, n)| n > 1 && self.st[h].live as usize == n)
            .collect()
    }

    /// Records the handle at page `first` split: each page a live block touches is a handle of
    /// its own, the others unmapped. Returns the bytes unmapped (pages no live block touched).
    pub(crate) fn split(&mut self, first: usize) -> u64 {
        let n = self.st[first].len as usize;
        let mut unmapped = 0;
        self.one_handle = false;
        self.larger_handles -= u32::from(n > 1);
        for p in first..first + n {
            let pg = &mut self.st[p];
            if pg.refs > 0 {
                (pg.head, pg.len, pg.live) = (p as u32, 1, 0);
            } else {
                (pg.head, pg.len, pg.live) = (UNMAPPED, 0, 0);
                unmapped += self.page;
            }
        }
        self.mapped_bytes -= unmapped;
        unmapped
    }

    /// Runs of whole handles no live block touches, to unmap; marks them unmapped. Stops once
    /// `want` bytes are found (the last handle may pass it).
    pub(crate) fn take_unused_runs(&mut self, want: u64) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut found = 0;
        let mut p = 0;
        while p < self.st.len() && found < want {
            let h = self.st[p].head;
            if h == UNMAPPED {
                p += 1;
                continue;
            }
            let n = self.st[p].len as usize;
            debug_assert_eq!(h as usize, p, "a handle is walked from its first page");
            if !self.is_live(p as u32) {
                let bytes = self.unmark_idle(p);
                found += bytes;
                let start = p as u64 * self.page;
                match runs.last_mut() {
                    Some((s, l)) if *s + *l == start => *l += bytes,
                    _ => runs.push((start, bytes)),
                }
            }
            p += n;
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
        m.mark_mapped(0, 8 << 20, 2 << 20);
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

    /// A handle of three pages goes back whole, only once no live block touches any of them;
    /// a block on one of its pages pins that page (out of memory, the handle is split and the
    /// rest goes back), and keeps the whole handle from the idle bytes.
    #[test]
    fn a_handle_of_pages_is_pinned_and_released_whole() {
        const P: u64 = 2 << 20;
        let mut m = PageMap::new(8 * P, P);
        m.mark_mapped(0, 3 * P, 3 * P);
        m.mark_mapped(3 * P, P, P);
        assert_eq!(m.unmapped_runs(0, 8 * P), vec![(4 * P, 4 * P)]);
        assert_eq!(m.unpinned_bytes(P, 1), P, "one byte on the handle pins its page");
        assert_eq!(
            m.unpinned_bytes(2 * P, 3 * P),
            3 * P,
            "a page of the handle, the page, an unmapped page"
        );
        assert_eq!(m.acquire(P, 1), P);
        assert_eq!(m.unused_mapped_bytes, P, "the handle is no longer idle; the page is");
        assert_eq!(m.acquire(2 * P, 2 * P), 2 * P, "a page of the handle, and the page");
        assert_eq!(m.unpinned_bytes(0, 3 * P), P, "page 0 is untouched");
        assert_eq!(
            m.live_handle_at(1),
            Some((0, 3)),
            "page 1 is in the handle of pages 0-2"
        );
        assert_eq!(m.live_handle_at(3), Some((3, 1)));
        assert_eq!(m.live_handle_at(4), None, "not mapped");
        assert_eq!(m.release(P, 1), P, "its page is free; another block touches the handle");
        assert_eq!(m.unused_mapped_bytes, 0);
        assert_eq!(m.release(3 * P, P), P);
        assert_eq!(m.live_handle_at(3), None, "no live block: not held");
        m.acquire(3 * P, P);
        assert_eq!(m.take_unused_runs(u64::MAX), vec![], "nothing is wholly unused");
        assert_eq!(m.release(2 * P, 2 * P), 2 * P);
        assert_eq!((m.mapped_bytes, m.unused_mapped_bytes), (4 * P, 4 * P));
        assert_eq!(
            m.take_unused_runs(1),
            vec![(0, 3 * P)],
            "a whole handle, past what was asked"
        );
        assert_eq!(m.take_unused_runs(u64::MAX), vec![(3 * P, P)]);
        assert_eq!((m.mapped_bytes, m.unused_mapped_bytes), (0, 0));
    }

    /// A slab mapped in one handle counts its touched pages without walking them, and agrees
    /// with the same handle among others; a split leaves the live pages as handles of their own.
    #[test]
    fn one_handle_over_the_slab_counts_as_any_handle() {
        const P: u64 = 2 << 20;
        let mut one = PageMap::new(6 * P, P);
        one.mark_mapped(0, 6 * P, 6 * P);
        let mut two = PageMap::new(7 * P, P);
        two.mark_mapped(0, 6 * P, 6 * P);
        two.mark_mapped(6 * P, P, P);
        for m in [&mut one, &mut two] {
            assert_eq!(m.acquire(P / 2, P), 2 * P, "pages 0 and 1");
            assert_eq!(m.acquire(P, P / 2), 0);
            assert_eq!(m.unused_mapped_bytes, m.mapped_bytes - 6 * P, "the handle is held");
            assert_eq!(m.partly_live_handles(), vec![(0, 6, 2)]);
            assert_eq!(m.release(P / 2, P), P, "page 0 is free; page 1 is not");
            assert_eq!(m.live_pages_of(0), vec![P]);
            assert!(!m.pages_only());
            assert_eq!(m.split(0), 5 * P);
            assert!(m.pages_only(), "every handle left is a page: a donor of moved pages");
            assert_eq!(m.live_handle_at(1), Some((1, 1)));
            assert_eq!(m.release(P, P / 2), P);
            assert_eq!(m.take_unused_runs(u64::MAX)[0], (P, P));
        }
        assert_eq!((one.mapped_bytes, two.mapped_bytes), (0, 0));
    }

    /// An idle handle that a block would cover only part of is taken back; one inside the
    /// block's pages, or one a live block holds, stays.
    #[test]
    fn overhanging_idle_handles_are_taken_back() {
        const P: u64 = 2 << 20;
        let mut m = PageMap::new(12 * P, P);
        m.mark_mapped(0, 4 * P, 4 * P); // pages 0-3
        m.mark_mapped(4 * P, 2 * P, 2 * P); // pages 4-5
        m.mark_mapped(6 * P, 4 * P, 4 * P); // pages 6-9
        m.acquire(9 * P, 1); // a live block on the last handle
        // A block on pages 3..6 (a byte into page 3 to the middle of page 5).
        let taken = m.take_unused_overhanging(3 * P + 1, 2 * P + 100);
        assert_eq!(taken, vec![(0, 4 * P)], "pages 0-3 overhang; 4-5 lie inside the block");
        assert!(!m.overhangs_idle(7 * P, P));
        assert_eq!(m.take_unused_overhanging(7 * P, P), vec![], "pages 6-9 are held");
        assert!(m.overhangs_idle(5 * P, 2 * P), "pages 4-5 reach before page 5");
        assert_eq!(m.mapped_bytes, 6 * P);
        assert_eq!(m.unused_mapped_bytes, 2 * P);
    }

    /// The handles and live pages of a slab, kept simply: each page's handle as (first page,
    /// pages), and each page's live blocks.
    struct Model {
        handle: Vec<Option<(usize, usize)>>,
        refs: Vec<u32>,
    }

    impl Model {
        fn live(&self, (first, n): (usize, usize)) -> bool {
            (first..first + n).any(|q| self.refs[q] > 0)
        }
        /// Distinct handles over `pages`, in order.
        fn handles_over(&self, pages: std::ops::Range<usize>) -> Vec<(usize, usize)> {
            let mut hs: Vec<(usize, usize)> = pages.filter_map(|q| self.handle[q]).collect();
            hs.dedup();
            hs
        }
        fn unmap(&mut self, (first, n): (usize, usize)) {
            for q in first..first + n {
                self.handle[q] = None;
            }
        }
    }

    fn pages(off: u64, len: u64, page: u64, n: usize) -> std::ops::Range<usize> {
        (off / page) as usize..((off + len).div_ceil(page) as usize).min(n)
    }

    proptest::proptest! {
        /// Mapping handles of 1 to 3 pages, placing and freeing blocks, and giving handles
        /// back: every count, and what a block would pin, as the simple model says.
        #[test]
        fn handles_match_a_simple_model(
            ops in proptest::collection::vec((0u8..6, 0usize..16, 1usize..7, 1usize..4), 1..300)
        ) {
            const P: u64 = 2 << 20;
            const N: usize = 16;
            let mut m = PageMap::new(N as u64 * P, P);
            let mut model = Model { handle: vec![None; N], refs: vec![0; N] };
            let mut blocks: Vec<(u64, u64)> = Vec::new();
            for (op, at, len, per) in ops {
                // A block a third of a page into page `at`, over about `len` half pages.
                let (off, bytes) = (at as u64 * P + P / 3, len as u64 * P / 2);
                match op {
                    0 => {
                        let end = (at + len).min(N);
                        let n = (end - at) / per * per;
                        if n == 0 || (at..at + n).any(|q| model.handle[q].is_some()) {
                            continue;
                        }
                        m.mark_mapped(at as u64 * P, n as u64 * P, per as u64 * P);
                        for f in (at..at + n).step_by(per) {
                            for q in f..f + per {
                                model.handle[q] = Some((f, per));
                            }
                        }
                    }
                    1 => {
                        let span = pages(off, bytes, P, N);
                        if off + bytes > N as u64 * P || span.clone().any(|q| model.handle[q].is_none()) {
                            continue;
                        }
                        let newly = span.clone().filter(|&q| model.refs[q] == 0).count() as u64 * P;
                        let idle_before = m.unused_mapped_bytes;
                        let held: u64 = model
                            .handles_over(span.clone())
                            .into_iter()
                            .filter(|&h| !model.live(h))
                            .map(|(_, n)| n as u64 * P)
                            .sum();
                        proptest::prop_assert_eq!(m.unpinned_bytes(off, bytes), newly);
                        proptest::prop_assert_eq!(m.acquire(off, bytes), newly);
                        proptest::prop_assert_eq!(idle_before - m.unused_mapped_bytes, held);
                        for q in span {
                            model.refs[q] += 1;
                        }
                        blocks.push((off, bytes));
                    }
                    2 if !blocks.is_empty() => {
                        let (off, bytes) = blocks.swap_remove(at % blocks.len());
                        let span = pages(off, bytes, P, N);
                        for q in span.clone() {
                            model.refs[q] -= 1;
                        }
                        let untouched = span.clone().filter(|&q| model.refs[q] == 0).count() as u64 * P;
                        let freed: u64 = model
                            .handles_over(span)
                            .into_iter()
                            .filter(|&h| !model.live(h))
                            .map(|(_, n)| n as u64 * P)
                            .sum();
                        let idle_before = m.unused_mapped_bytes;
                        proptest::prop_assert_eq!(m.release(off, bytes), untouched);
                        proptest::prop_assert_eq!(m.unused_mapped_bytes - idle_before, freed);
                    }
                    3 => {
                        let want = len as u64 * P;
                        let mut found = 0;
                        let mut expect: Vec<(u64, u64)> = Vec::new();
                        for h in model.handles_over(0..N) {
                            if found >= want {
                                break;
                            }
                            if !model.live(h) {
                                let (start, bytes) = (h.0 as u64 * P, h.1 as u64 * P);
                                match expect.last_mut() {
                                    Some((s, l)) if *s + *l == start => *l += bytes,
                                    _ => expect.push((start, bytes)),
                                }
                                found += bytes;
                                model.unmap(h);
                            }
                        }
                        proptest::prop_assert_eq!(m.take_unused_runs(want), expect);
                    }
                    5 => {
                        // Split a handle live blocks touch in part: its live pages become
                        // handles of their own, the rest is unmapped.
                        let partly: Vec<(usize, usize, usize)> = model
                            .handles_over(0..N)
                            .into_iter()
                            .filter(|&(f, n)| n > 1 && model.live((f, n)))
                            .map(|(f, n)| (f, n, (f..f + n).filter(|&q| model.refs[q] > 0).count()))
                            .filter(|&(_, n, live)| live < n)
                            .collect();
                        proptest::prop_assert_eq!(m.partly_live_handles(), partly.clone());
                        let full: Vec<(usize, usize)> = model
                            .handles_over(0..N)
                            .into_iter()
                            .filter(|&(f, n)| n > 1 && (f..f + n).all(|q| model.refs[q] > 0))
                            .collect();
                        proptest::prop_assert_eq!(m.fully_live_handles_over(0, N as u64 * P), full);
                        let Some(&(f, n, live)) = partly.get(at % partly.len().max(1)) else {
                            continue;
                        };
                        let kept: Vec<u64> = (0..n).filter(|&i| model.refs[f + i] > 0).map(|i| i as u64 * P).collect();
                        proptest::prop_assert_eq!(m.live_pages_of(f), kept);
                        proptest::prop_assert_eq!(m.split(f), (n - live) as u64 * P);
                        for q in f..f + n {
                            model.handle[q] = (model.refs[q] > 0).then_some((q, 1));
                        }
                    }
                    _ => {
                        let span = pages(off, bytes, P, N);
                        if off + bytes > N as u64 * P {
                            continue;
                        }
                        let over: Vec<(usize, usize)> = model
                            .handles_over(span.clone())
                            .into_iter()
                            .filter(|&(f, n)| n > 1 && !model.live((f, n)) && (f < span.start || f + n > span.end))
                            .collect();
                        proptest::prop_assert_eq!(m.overhangs_idle(off, bytes), !over.is_empty());
                        let expect: Vec<(u64, u64)> = over.iter().map(|&(f, n)| (f as u64 * P, n as u64 * P)).collect();
                        proptest::prop_assert_eq!(m.take_unused_overhanging(off, bytes), expect);
                        for h in over {
                            model.unmap(h);
                        }
                    }
                }
                let handles = model.handles_over(0..N);
                let mapped: u64 = handles.iter().map(|&(_, n)| n as u64 * P).sum();
                let idle: u64 = handles.iter().filter(|&&h| !model.live(h)).map(|&(_, n)| n as u64 * P).sum();
                proptest::prop_assert_eq!((m.mapped_bytes, m.unused_mapped_bytes), (mapped, idle));
                for q in 0..N {
                    let held = model.handle[q].filter(|&h| model.live(h));
                    proptest::prop_assert_eq!(m.live_handle_at(q), held);
                }
            }
        }
    }
}
