//! The suballocator's byte counts, with one owner: every change goes through a method here that
//! names the event (a slab taken, pages mapped, a block placed, a splice made...), and debug
//! builds check after each that the counts still relate as they must.
//!
//! The counts and how they relate:
//! - `reserved`: bytes held from the device: whole slabs, the mapped pages of paged slabs, and
//!   the fresh pages of splices.
//! - `pool_reserved[p]`: the part of `reserved` in the slabs of size pool `p` (a new slab's size
//!   follows it). Splices belong to no pool, so `reserved = sum(pool_reserved) + spliced`.
//! - `spliced`: fresh pages mapped for splices.
//! - `used`: bytes of live blocks (a block's node size; a splice's body). `used <= reserved`.
//! - `empty`: bytes of wholly free slabs (their full size, mapped or not). Only slabs count, so
//!   `empty <= reserved` when no slab is paged; a paged empty slab may hold fewer mapped bytes.
//! - `pinned`: bytes that live blocks hold from the device and no release reaches while they
//!   live (pages a live block touches, whole unpaged slabs with a live block, splices' fresh
//!   pages). A page, not its handle: out of memory, a handle live blocks touch in part is split
//!   and the rest goes back. `pinned <= reserved`.
//! - `consumed`: what the driver would consume for the live blocks as allocations of their own.
//!   `pinned - consumed` (when positive) is what the slabs strand.

use super::POOLS;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Accounts {
    reserved: u64,
    pool_reserved: [u64; POOLS],
    spliced: u64,
    used: u64,
    empty: u64,
    pinned: u64,
    consumed: u64,
}

impl Default for Accounts {
    fn default() -> Self {
        Accounts {
            reserved: 0,
            pool_reserved: [0; POOLS],
            spliced: 0,
            used: 0,
            empty: 0,
            pinned: 0,
            consumed: 0,
        }
    }
}

impl Accounts {
    pub(super) fn reserved(&self) -> u64 {
        self.reserved
    }
    pub(super) fn pool_reserved(&self, pool: u8) -> u64 {
        self.pool_reserved[pool as usize]
    }
    pub(super) fn used(&self) -> u64 {
        self.used
    }
    pub(super) fn empty(&self) -> u64 {
        self.empty
    }
    pub(super) fn pinned(&self) -> u64 {
        self.pinned
    }
    pub(super) fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Device memory came in for pool `pool`: a whole slab, or pages mapped into a paged slab.
    #[inline]
    pub(super) fn held(&mut self, pool: u8, bytes: u64) {
        self.reserved += bytes;
        self.pool_reserved[pool as usize] += bytes;
        self.check();
    }

    /// Device memory of pool `pool` went back: a slab released, or pages unmapped.
    #[inline]
    pub(super) fn given_back(&mut self, pool: u8, bytes: u64) {
        self.reserved -= bytes;
        self.pool_reserved[pool as usize] -= bytes;
        self.check();
    }

    /// A live block of `size` bytes placed in a slab; the driver would consume `footprint` for
    /// it. What it newly pins follows ([`pinned_more`](Self::pinned_more)).
    #[inline]
    pub(super) fn placed(&mut self, size: u64, footprint: u64) {
        self.used += size;
        self.consumed += footprint;
        self.check();
    }

    /// A live block pins `bytes` that no live block pinned before (pages it touches first, or a
    /// whole unpaged slab it is the first block of).
    #[inline]
    pub(super) fn pinned_more(&mut self, bytes: u64) {
        self.pinned += bytes;
        self.check();
    }

    /// A live block of `size` bytes left its slab. What it unpins follows
    /// ([`unpinned`](Self::unpinned)).
    #[inline]
    pub(super) fn freed(&mut self, size: u64, footprint: u64) {
        self.used -= size;
        self.consumed -= footprint;
        self.check();
    }

    /// Bytes no live block pins any more (pages, or a whole unpaged slab, left by their last).
    #[inline]
    pub(super) fn unpinned(&mut self, bytes: u64) {
        self.pinned -= bytes;
        self.check();
    }

    /// A slab of `size` bytes became wholly free.
    #[inline]
    pub(super) fn emptied(&mut self, size: u64) {
        self.empty += size;
    }

    /// A wholly free slab of `size` bytes took a block or was released.
    #[inline]
    pub(super) fn filled(&mut self, size: u64) {
        self.empty -= size;
    }

    /// A splice: `fresh` bytes of new pages (pinned while it lives), a block body of `body`
    /// bytes, and `consumed` to bring the driver-footprint total to the block's own footprint
    /// (the free ends it took count theirs as slab blocks; negative where they count more).
    pub(super) fn spliced(&mut self, fresh: u64, body: u64, consumed: i64) {
        self.reserved += fresh;
        self.spliced += fresh;
        self.used += body;
        self.pinned += fresh;
        self.consumed = self.consumed.saturating_add_signed(consumed);
        self.check();
    }

    /// A splice freed: the reverse of [`spliced`](Self::spliced).
    pub(super) fn unspliced(&mut self, fresh: u64, body: u64, consumed: i64) {
        self.reserved -= fresh;
        self.spliced -= fresh;
        self.used -= body;
        self.pinned -= fresh;
        self.consumed = self.consumed.saturating_add_signed(-consumed);
        self.check();
    }

    /// The invariants, checked in debug builds and in the library's unit tests (release or not);
    /// nothing in a release build.
    #[inline]
    fn check(&self) {
        if cfg!(any(debug_assertions, test)) {
            // Summed wide and each part bounded: in a release build a wrapped count could still
            // add up modulo 2^64.
            let pools: u128 = self.pool_reserved.iter().map(|&p| u128::from(p)).sum();
            assert!(
                self.pool_reserved.iter().all(|&p| p <= self.reserved),
                "no pool holds more than all: {self:?}"
            );
            assert_eq!(
                u128::from(self.reserved),
                pools + u128::from(self.spliced),
                "reserved is the pools' bytes plus the splices': {self:?}"
            );
            assert!(self.used <= self.reserved, "live blocks within what is held: {self:?}");
            assert!(self.pinned <= self.reserved, "pinned within what is held: {self:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each event moves the counts it names and no other, and the reverse event undoes it.
    #[test]
    fn events_move_their_counts_and_reverse() {
        let mut a = Accounts::default();
        a.held(3, 4096);
        assert_eq!((a.reserved(), a.pool_reserved(3), a.pool_reserved(0)), (4096, 4096, 0));
        a.emptied(4096);
        a.filled(4096);
        a.placed(1024, 512);
        a.pinned_more(2048);
        assert_eq!((a.used(), a.consumed(), a.pinned()), (1024, 512, 2048));
        a.spliced(2048, 1536, 1000);
        assert_eq!(
            (a.reserved(), a.pool_reserved(3)),
            (6144, 4096),
            "a splice is in no pool"
        );
        assert_eq!((a.used(), a.consumed(), a.pinned()), (2560, 1512, 4096));
        a.unspliced(2048, 1536, 1000);
        a.freed(1024, 512);
        a.unpinned(2048);
        a.given_back(3, 4096);
        assert_eq!(a, Accounts::default());
    }

    /// Live blocks beyond what is held break an invariant (debug builds check every event).
    #[test]
    #[should_panic(expected = "live blocks within what is held")]
    fn used_over_reserved_is_caught() {
        let mut a = Accounts::default();
        a.held(0, 1024);
        a.placed(2048, 2048);
    }

    /// A splice counted into a pool breaks the reserved = pools + splices relation.
    #[test]
    #[should_panic(expected = "reserved is the pools' bytes plus the splices'")]
    fn reserved_relation_is_caught() {
        let mut a = Accounts::default();
        a.spliced(4096, 0, 0);
        a.spliced = 0;
        a.held(0, 1);
    }
}
