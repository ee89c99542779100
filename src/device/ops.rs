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
}

/// Every priced driver operation, by kind (the keys of a cost model file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DriverOps {
    /// cuMemAlloc (cudaMalloc), failed attempts included.
    pub alloc: OpTally,
    /// cuMemFree (cudaFree), without its synchronization.
    pub free: OpTally,
    /// The device synchronization each cuMemFree implies.
    pub free_sync: OpTally,
    /// cuMemGetInfo.
    pub mem_info: OpTally,
    /// cuMemAddressReserve.
    pub reserve: OpTally,
    /// cuMemAddressFree.
    pub unreserve: OpTally,
    /// cuMemCreate, one per physical handle (failed attempts included).
    pub create: OpTally,
    /// cuMemMap, one per handle mapped (a page mapped a second time included).
    pub map: OpTally,
    /// cuMemSetAccess, one per mapping.
    pub set_access: OpTally,
    /// cuMemUnmap, one per mapping.
    pub unmap: OpTally,
    /// cuMemRelease, one per handle reference dropped.
    pub release: OpTally,
    /// The synchronization before a batch of unmaps (cuMemUnmap is not stream-ordered).
    pub unmap_sync: OpTally,
    /// A wait for one stream's queued work (cuStreamSynchronize).
    pub stream_sync: OpTally,
    /// cudaMallocAsync served by a stream-ordered pool.
    pub async_alloc: OpTally,
    /// cudaFreeAsync.
    pub async_free: OpTally,
}

impl DriverOps {
    /// Every kind with its key, in cost-model order.
    pub fn kinds(&self) -> [(&'static str, OpTally); 15] {
        [
            ("alloc", self.alloc),
            ("free", self.free),
            ("free_sync", self.free_sync),
            ("mem_info", self.mem_info),
            ("reserve", self.reserve),
            ("unreserve", self.unreserve),
            ("create", self.create),
            ("map", self.map),
            ("set_access", self.set_access),
            ("unmap", self.unmap),
            ("release", self.release),
            ("unmap_sync", self.unmap_sync),
            ("stream_sync", self.stream_sync),
            ("async_alloc", self.async_alloc),
            ("async_free", self.async_free),
        ]
    }

    /// Time of every kind together, ns.
    pub fn total_ns(&self) -> u64 {
        self.kinds().iter().map(|(_, t)| t.ns).sum()
    }

    /// The kinds a later snapshot added to this one (`later - self`, per kind).
    pub fn since(&self, earlier: &DriverOps) -> DriverOps {
        let d = |a: OpTally, b: OpTally| OpTally {
            calls: a.calls - b.calls,
            ns: a.ns - b.ns,
        };
        DriverOps {
            alloc: d(self.alloc, earlier.alloc),
            free: d(self.free, earlier.free),
            free_sync: d(self.free_sync, earlier.free_sync),
            mem_info: d(self.mem_info, earlier.mem_info),
            reserve: d(self.reserve, earlier.reserve),
            unreserve: d(self.unreserve, earlier.unreserve),
            create: d(self.create, earlier.create),
            map: d(self.map, earlier.map),
            set_access: d(self.set_access, earlier.set_access),
            unmap: d(self.unmap, earlier.unmap),
            release: d(self.release, earlier.release),
            unmap_sync: d(self.unmap_sync, earlier.unmap_sync),
            stream_sync: d(self.stream_sync, earlier.stream_sync),
            async_alloc: d(self.async_alloc, earlier.async_alloc),
            async_free: d(self.async_free, earlier.async_free),
        }
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
    }
}
