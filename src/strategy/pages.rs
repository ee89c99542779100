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
        self.take_unused_runs_except(want, 0..0)
    }

    /// [`take_unused_runs`](Self::take_unused_runs), passing over handles that overlap the
    /// byte range `except`.
    pub(crate) fn take_unused_runs_except(&mut self, want: u64, except: std::ops::Range<u64>) -> Vec<(u64, u64)> {
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
            let (hs, he) = (p as u64 * self.page, (p + n) as u64 * self.page);
            let skipped = hs < except.end && except.start < he;
            if !skipped && !self.is_live(p as u32) {
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
mod tests;
