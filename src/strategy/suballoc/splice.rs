//! Spliced blocks, the suballocator's last resort on out-of-memory. A page that live blocks keep
//! mapped may have its end (or its start) free, and no request fits there. With virtual memory
//! management the same physical page can be mapped a second time: a new block gets an address
//! range of its own, made of that page (mapped again, the block starting in its free end), fresh
//! pages, and another held page whose free start the block ends in. It then needs fewer fresh
//! pages than a driver allocation of its size would consume; a block of up to two pages' worth
//! of free ends needs none.
//!
//! The free ends it uses are taken as blocks of their slabs (so nothing else lands there, and
//! their pages stay pinned while the spliced block lives); freeing it unmaps the range, gives the
//! fresh pages back and frees those parts. Everything here is cold.

use crate::device::{Device, DevicePtr};
use crate::strategy::{BlockMeta, Grant, StreamId};

use super::{NIL, Suballoc};

/// A block spliced from page ends and fresh pages.
#[derive(Debug, Clone, Copy)]
pub(super) struct Splice {
    /// The block's own address range (a reservation): the front page, the fresh pages, the
    /// back page, each where present.
    base: DevicePtr,
    /// The slab node holding the block's bytes on the held page mapped again at `base`.
    front: Option<u32>,
    /// Bytes of fresh pages mapped after the front page.
    fresh: u64,
    /// The slab node holding the block's bytes on the held page mapped again after the fresh
    /// pages.
    back: Option<u32>,
    /// Bytes of the block on fresh pages.
    body: u64,
    /// What was added to the driver-footprint total for the fresh part.
    consumed: u64,
}

/// A free page end: `len` free bytes at the end (tail) or start (head) of the held page at
/// `page` (an address), inside free node `node`.
#[derive(Debug, Clone, Copy)]
struct End {
    node: u32,
    page: DevicePtr,
    len: u64,
}

/// How a request is spliced: bytes on the front page's tail, fresh pages, bytes on the back
/// page's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Plan {
    fresh_pages: u64,
    aliases: u8,
    front: u64,
    back: u64,
}

impl Suballoc {
    /// Serves `bytes` by splicing (`Splice`) when that needs less new memory than a driver
    /// allocation of `bytes` would consume, or None. Cost: a scan of every node; cold.
    #[cold]
    pub fn allocate_spliced(&mut self, dev: &dyn Device, bytes: u64, stream: StreamId) -> Option<Grant> {
        let page = self.paged_vmm(dev)?.page_size();
        let footprint = self.footprint(dev, bytes);
        let (tail, head) = self.largest_free_ends(page, stream);
        let plan = plan(bytes, page, tail.map_or(0, |e| e.len), head.map_or(0, |e| e.len))?;
        if plan.fresh_pages * page >= footprint {
            return None;
        }
        let (tail, head) = (tail.filter(|_| plan.front > 0), head.filter(|_| plan.back > 0));
        let vmm = dev.vmm().expect("checked above");
        let fresh = plan.fresh_pages * page;
        let held_pages = u64::from(tail.is_some()) + u64::from(head.is_some());
        let base = vmm.reserve(held_pages * page + fresh).ok()?;
        if let Err(e) = self.map_splice(dev, base, tail, fresh, head, page) {
            tracing::debug!(bytes, error = %e, "splice refused by the device");
            let _ = vmm.unreserve(base);
            return None;
        }
        let front = tail.map(|t| self.take_end(dev, t.node, t.page + page - plan.front, plan.front));
        let back = head.map(|h| self.take_end(dev, h.node, h.page, plan.back));
        let body = bytes - plan.front - plan.back;
        // The parts on held pages count at their own footprint (0 for an absent part).
        let parts = self.footprint(dev, plan.front) + self.footprint(dev, plan.back);
        let consumed = footprint.saturating_sub(parts);
        self.acct.spliced(fresh, body, consumed);
        // The block starts in the front page's free tail, or where its body ends the fresh
        // pages when only a back page follows.
        let ptr = match tail {
            Some(_) => base + page - plan.front,
            None => base + fresh - body,
        };
        let splice = self.splices.insert(Splice {
            base,
            front,
            fresh,
            back,
            body,
            consumed,
        });
        tracing::info!(
            bytes,
            fresh,
            saved = footprint - fresh,
            "spliced a block from free page ends"
        );
        Some(Grant {
            ptr,
            block_bytes: bytes,
            hit: false,
            meta: BlockMeta::Spliced { splice },
        })
    }

    /// Frees a spliced block: unmaps its range, gives its fresh pages back, frees its parts.
    #[cold]
    #[inline(never)]
    pub(in crate::strategy) fn free_spliced(&mut self, dev: &dyn Device, meta: BlockMeta, stream: StreamId, now: u64) {
        let BlockMeta::Spliced { splice: id } = meta else {
            debug_assert!(false, "suballoc got a block it did not grant: {meta:?}");
            return;
        };
        let s = self.splices[id];
        self.splices.release(id);
        // The block's last work was queued before this free: wait for it before unmapping. On
        // a device that cannot synchronize (a sticky error) the unmaps go ahead, logged.
        self.now = now;
        self.quiesce(dev);
        let vmm = dev.vmm().expect("a spliced block's device has vmm");
        let page = vmm.page_size();
        let front_len = if s.front.is_some() { page } else { 0 };
        let unmap = |r: Result<(), crate::error::DeviceError>, what: &str| {
            if let Err(e) = r {
                tracing::error!(ptr = s.base, error = %e, what, "unmapping a spliced block failed");
            }
        };
        if s.front.is_some() {
            unmap(vmm.unmap_alias(s.base, page), "front page");
        }
        if s.fresh > 0 {
            unmap(vmm.unmap(s.base + front_len, s.fresh), "fresh pages");
        }
        if s.back.is_some() {
            unmap(vmm.unmap_alias(s.base + front_len + s.fresh, page), "back page");
        }
        unmap(vmm.unreserve(s.base), "range");
        self.acct.unspliced(s.fresh, s.body, s.consumed);
        for node in [s.front, s.back].into_iter().flatten() {
            self.deallocate(dev, BlockMeta::Sub { node }, stream, now);
        }
    }

    /// The largest free tail and the largest free head of held pages usable by `stream`, from
    /// different nodes.
    fn largest_free_ends(&self, page: u64, stream: StreamId) -> (Option<End>, Option<End>) {
        let (mut tail, mut head): (Option<End>, Option<End>) = (None, None);
        for (i, n) in self.nodes.iter_all().enumerate() {
            if n.slab == NIL || !self.free_for(n, stream) {
                continue;
            }
            // Only slabs backed by device pages, and only pages that are handles of their own
            // (`is_pinned_page`): a page of a larger handle cannot be mapped again on its own
            // (cuMemMap maps whole handles from offset 0).
            let Some(Some(pm)) = self
                .pages
                .get(n.slab as usize)
                .filter(|p| p.as_ref().is_some_and(|pm| pm.page_size() == page))
            else {
                continue;
            };
            let slab_base = self.slabs[n.slab].base;
            let (start, end) = (n.addr - slab_base, n.addr - slab_base + n.size);
            // The page the node starts in, if the node runs to its end: a free tail.
            let first = (start / page) as usize;
            if start % page != 0 && end >= (first as u64 + 1) * page && pm.is_pinned_page(first) {
                let len = (first as u64 + 1) * page - start;
                if tail.is_none_or(|t| len > t.len) {
                    tail = Some(End {
                        node: i as u32,
                        page: slab_base + first as u64 * page,
                        len,
                    });
                }
            }
            // The page the node ends in, if the node starts at or before its start: a free head.
            let last = (end / page) as usize;
            if end % page != 0 && start <= last as u64 * page && last < pm.page_count() && pm.is_pinned_page(last) {
                let len = end - last as u64 * page;
                if head.is_none_or(|h| len > h.len) {
                    head = Some(End {
                        node: i as u32,
                        page: slab_base + last as u64 * page,
                        len,
                    });
                }
            }
        }
        if let (Some(t), Some(h)) = (tail, head)
            && t.node == h.node
        {
            // One node with held pages at both ends: use the longer end only.
            return if t.len >= h.len {
                (Some(t), None)
            } else {
                (None, Some(h))
            };
        }
        (tail, head)
    }

    /// Maps a splice's range at `base`: the tail's page again, `fresh` bytes of new pages, the
    /// head's page again. On failure nothing stays mapped.
    fn map_splice(
        &self,
        dev: &dyn Device,
        base: DevicePtr,
        tail: Option<End>,
        fresh: u64,
        head: Option<End>,
        page: u64,
    ) -> Result<(), crate::error::DeviceError> {
        let vmm = dev.vmm().expect("checked by the caller");
        let front_len = if tail.is_some() { page } else { 0 };
        if let Some(t) = tail {
            vmm.map_alias(base, t.page, page)?;
        }
        if fresh > 0
            && let Err(e) = vmm.map(base + front_len, fresh)
        {
            if tail.is_some() {
                let _ = vmm.unmap_alias(base, page);
            }
            return Err(e);
        }
        if let Some(h) = head
            && let Err(e) = vmm.map_alias(base + front_len + fresh, h.page, page)
        {
            if fresh > 0 {
                let _ = vmm.unmap(base + front_len, fresh);
            }
            if tail.is_some() {
                let _ = vmm.unmap_alias(base, page);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Takes `len` bytes at slab address `at` out of free node `node` as a block of its slab.
    fn take_end(&mut self, dev: &dyn Device, node: u32, at: DevicePtr, len: u64) -> u32 {
        let pad = at - self.nodes[node].addr;
        debug_assert!(pad + len <= self.nodes[node].size);
        let footprint = self.footprint(dev, len);
        self.take(node, pad, len, footprint).0
    }
}

/// The splice of `bytes` over free ends of `tail` and `head` bytes that needs the fewest fresh
/// pages (then the fewest second mappings), or None when no free end helps. The fresh pages are
/// filled first; the ends take only the rest, leaving what they can to their slabs.
fn plan(bytes: u64, page: u64, tail: u64, head: u64) -> Option<Plan> {
    let fresh_for = |end: u64| (bytes - end.min(bytes)).div_ceil(page);
    let mut options = Vec::with_capacity(3);
    for (end, at_front) in [(tail, true), (head, false)] {
        let fresh_pages = fresh_for(end);
        let rest = bytes.saturating_sub(fresh_pages * page);
        if end > 0 && rest > 0 {
            let (front, back) = if at_front { (rest, 0) } else { (0, rest) };
            options.push(Plan {
                fresh_pages,
                aliases: 1,
                front,
                back,
            });
        }
    }
    if tail > 0 && head > 0 {
        // Fresh pages between two ends must be filled: the ends take what the pages leave.
        let fresh_pages = fresh_for(tail + head);
        let rest = bytes.saturating_sub(fresh_pages * page);
        let front = tail.min(rest);
        if rest > front && rest - front <= head {
            options.push(Plan {
                fresh_pages,
                aliases: 2,
                front,
                back: rest - front,
            });
        }
    }
    options.into_iter().min()
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 2 << 20;

    #[test]
    fn plans_take_the_fewest_fresh_pages() {
        // 40 MB after a 1.7 MB free head: 19 fresh pages, not 20.
        let p = plan(40_960_000, P, 0, 1_784_832).unwrap();
        assert_eq!((p.fresh_pages, p.front, p.back), (19, 0, 40_960_000 - 19 * P));
        // Two ends that hold it together: no fresh page.
        let p = plan(300 << 10, P, 200 << 10, 150 << 10).unwrap();
        assert_eq!(
            (p.fresh_pages, p.aliases, p.front, p.back),
            (0, 2, 200 << 10, 100 << 10)
        );
        // A tail alone that holds it: the tail only (one second mapping).
        let p = plan(100 << 10, P, 200 << 10, 150 << 10).unwrap();
        assert_eq!((p.fresh_pages, p.aliases), (0, 1));
        // Both ends and fresh pages between: the pages are filled.
        let p = plan(3 * P, P, P / 2, P / 2).unwrap();
        assert_eq!((p.fresh_pages, p.front + p.back), (2, P));
        assert!(plan(P, P, 0, 0).is_none());
    }
}
