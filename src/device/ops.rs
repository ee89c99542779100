//! Driver operations by kind: what a device was asked to do, and the time each kind took
//! (modelled on [`SimDevice`](super::SimDevice), measured where a real device can tell).

use serde::Serialize;

/// One kind of driver operation: how many calls, and their time in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OpTally {
    /// Calls.
    pub calls: u64,
    /// Their time, ns.
    pub ns: u64,
}

impl OpTally {
    /// Counts `calls` calls of `ns` each. Cost: two adds.
    #[inline]
    pub fn charge(&mut self, calls: u64, ns: u64) {
        self.calls += calls;
        self.ns += calls * ns;
    }

    /// The mean price of a call seen so far, ns; None before the first.
    pub fn mean_ns(&self) -> Option<u64> {
        self.ns.checked_div(self.calls)
    }
}

/// Declares [`DriverOps`] from one list of kinds, with `kinds()` and `since()` over the same
/// list (a kind is added in one place).
macro_rules! driver_ops {
    ($($(#[$doc:meta])* $kind:ident,)*) => {
        /// Every priced driver operation, by kind (the keys of a cost model file).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
        pub struct DriverOps {
            $($(#[$doc])* pub $kind: OpTally,)*
        }

        impl DriverOps {
            /// How many kinds there are.
            pub const KINDS: usize = [$(stringify!($kind)),*].len();

            /// Every kind with its key, in cost-model order.
            pub fn kinds(&self) -> [(&'static str, OpTally); Self::KINDS] {
                [$((stringify!($kind), self.$kind)),*]
            }

            /// The kinds a later snapshot added to this one (`later - self`, per kind).
            pub fn since(&self, earlier: &DriverOps) -> DriverOps {
                DriverOps {
                    $($kind: OpTally {
                        calls: self.$kind.calls - earlier.$kind.calls,
                        ns: self.$kind.ns - earlier.$kind.ns,
                    },)*
                }
            }
        }
    };
}

driver_ops! {
    /// cuMemAlloc (cudaMalloc), failed attempts included.
    alloc,
    /// cuMemFree (cudaFree), without its synchronization.
    free,
    /// The device synchronization each cuMemFree implies.
    free_sync,
    /// cuMemGetInfo.
    mem_info,
    /// cuMemAddressReserve.
    reserve,
    /// cuMemAddressFree.
    unreserve,
    /// cuMemCreate, one per physical handle (failed attempts included).
    create,
    /// cuMemMap, one per handle mapped (a page mapped a second time included).
    map,
    /// cuMemSetAccess, one per mapped run.
    set_access,
    /// cuMemUnmap, one per mapping.
    unmap,
    /// cuMemRelease, one per handle reference dropped.
    release,
    /// The synchronization before a batch of unmaps (cuMemUnmap is not stream-ordered).
    unmap_sync,
    /// A wait for one stream's queued work (cuStreamSynchronize).
    stream_sync,
    /// cudaMallocAsync served by a stream-ordered pool.
    async_alloc,
    /// cudaFreeAsync.
    async_free,
}

impl DriverOps {
    /// Whether moving an idle page where a new one is needed (cuMemMap, cuMemSetAccess and
    /// cuMemUnmap) costs less than creating one there while an idle one is released elsewhere
    /// (cuMemCreate and cuMemRelease), at the mean prices these calls have had so far: the
    /// prices the device has shown (measured on a GPU, modelled on SimDevice), not constants.
    /// A tie goes to the move (the memory stays held rather than going back to be asked for
    /// again). True until every one of the five has been seen: at the published A100 prices a move
    /// costs about 63 us against 203 (the default cost model); at `vmm-fast.toml`'s, 33
    /// against 18, and pages are created instead.
    pub fn recycling_pays(&self) -> bool {
        let prices = [self.map, self.set_access, self.unmap, self.create, self.release].map(|t| t.mean_ns());
        match prices {
            [Some(map), Some(access), Some(unmap), Some(create), Some(release)] => {
                map + access + unmap <= create + release
            }
            _ => true,
        }
    }

    /// Time of every kind together, ns.
    pub fn total_ns(&self) -> u64 {
        self.kinds().iter().map(|(_, t)| t.ns).sum()
    }

    /// Every driver call charged, of every kind (the sum over [`kinds`](Self::kinds)).
    pub fn calls(&self) -> u64 {
        self.kinds().iter().map(|(_, t)| t.calls).sum()
    }

    /// Physical allocations: cuMemAlloc and cuMemCreate (one per handle).
    pub fn physical_allocs(&self) -> u64 {
        self.alloc.calls + self.create.calls
    }

    /// Physical frees: cuMemFree and cuMemRelease (one per handle reference).
    pub fn physical_frees(&self) -> u64 {
        self.free.calls + self.release.calls
    }
}

/// A call a stream-ordered pool serves without the driver's allocation path (see
/// [`Device::charge_pool_call`](super::Device::charge_pool_call)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolCall {
    /// cudaMallocAsync.
    Alloc,
    /// cudaFreeAsync.
    Free,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_subtracts_per_kind_and_total_sums_every_kind() {
        let mut a = DriverOps::default();
        a.alloc.charge(2, 10);
        a.unmap_sync.charge(1, 7);
        let mut b = a;
        b.alloc.charge(1, 10);
        b.async_free.charge(3, 1);
        let d = b.since(&a);
        assert_eq!((d.alloc.calls, d.alloc.ns), (1, 10));
        assert_eq!((d.async_free.calls, d.async_free.ns), (3, 3));
        assert_eq!(d.unmap_sync, OpTally::default());
        assert_eq!(b.total_ns(), 30 + 7 + 3);
        assert_eq!(a.kinds().len(), 15);
        b.create.charge(4, 1);
        b.release.charge(2, 1);
        assert_eq!(
            (b.calls(), b.physical_allocs(), b.physical_frees()),
            (3 + 1 + 3 + 4 + 2, 3 + 4, 2)
        );
    }
}
