//! Timing CUDA's virtual-memory calls for `adaptalloc gpu-bench`'s calibration: every call on
//! handles of one size ([`CudaDevice::time_vmm_calls`]), and one access grant over runs of
//! handles by the run's length and the handles already held ([`CudaDevice::time_run_grants`]).
//! Not on any allocation path: what it maps it gives back before it returns.

use std::time::Instant;

use cudarc::driver::sys;

use super::CudaDevice;
use super::cuda::check;
use super::cuda_vmm::allocation_prop;
use crate::error::DeviceError;

/// Median latency of each virtual-memory call on one device, ns (what `adaptalloc gpu-bench`
/// writes into a cost model's `[vmm]` table), with every call's time for its statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmmTimings {
    /// cuMemAddressReserve.
    pub reserve_ns: u64,
    /// cuMemAddressFree.
    pub unreserve_ns: u64,
    /// cuMemCreate of one handle.
    pub create_ns: u64,
    /// cuMemMap of one handle.
    pub map_ns: u64,
    /// cuMemSetAccess of one mapping.
    pub set_access_ns: u64,
    /// cuMemSetAccess over a run of the `n` handles, mapped one after another without grants,
    /// divided by `n`: what a handle costs in the one grant a mapped run gets (CudaDevice's
    /// way, and PyTorch's expandable segments').
    pub run_access_ns: u64,
    /// cuMemUnmap of one mapping.
    pub unmap_ns: u64,
    /// cuMemRelease of one handle.
    pub release_ns: u64,
    /// cuCtxSynchronize on an idle device: the floor of the wait before unmapping.
    pub sync_ns: u64,
    /// Each call's time, ns, by kind (`create`, `map`, `set_access`, `unmap`, `release`), sorted.
    pub samples: [(&'static str, Vec<u64>); 5],
}

/// The median of `v` (the upper one of an even count), sorting it in place; 0 when empty.
fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

impl CudaDevice {
    /// Times every virtual-memory call on `n` physical handles of `handle` bytes (a multiple
    /// of the granule): one reservation for them all, then per handle cuMemCreate, cuMemMap and
    /// cuMemSetAccess, then per handle cuMemUnmap and cuMemRelease, and cuMemAddressFree; the
    /// median of each. Everything it made is given back, on failure too. Errors when the device
    /// has no virtual memory management or `handle` is off the granule.
    pub fn time_vmm_calls(&self, handle: u64, n: usize) -> Result<VmmTimings, DeviceError> {
        let page = self.timing_page(handle, n)?;
        let _current = self.make_current()?;
        let (prop, desc) = props_and_access(self.ordinal());
        let total = handle * n as u64;
        let t = Instant::now();
        let base = reserve_range(total, page)?;
        let mut out = VmmTimings {
            reserve_ns: t.elapsed().as_nanos() as u64,
            ..Default::default()
        };
        // Phase 1: every handle created, mapped and granted on its own, then given back.
        let mut t1 = CallTimes::default();
        let (handles, mapped, mut result) = map_timed(base, handle, n, &prop, Some(&desc), &mut t1);
        let t = Instant::now();
        // SAFETY: the context is current; the call takes no pointers.
        let synced = check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() });
        out.sync_ns = t.elapsed().as_nanos() as u64;
        result = result
            .and(synced)
            .and(give_back_timed(base, handle, &handles, mapped, &mut t1));
        // Phase 2: the same again mapped without grants, then one grant for the run (what a
        // workload's mapping pays: CudaDevice's way, and PyTorch's expandable segments'), per
        // handle.
        if result.is_ok() {
            let (ns, run) = run_grant(base, handle, n, &prop, &desc);
            out.run_access_ns = ns.unwrap_or(0);
            result = run;
        }
        let t = Instant::now();
        let freed = free_range(base, total);
        out.unreserve_ns = t.elapsed().as_nanos() as u64;
        result.and(freed)?;
        let CallTimes {
            mut create,
            mut map,
            mut access,
            mut unmap,
            mut release,
        } = t1;
        out.create_ns = median(&mut create);
        out.map_ns = median(&mut map);
        out.set_access_ns = median(&mut access);
        out.unmap_ns = median(&mut unmap);
        out.release_ns = median(&mut release);
        out.samples = [
            ("create", create),
            ("map", map),
            ("set_access", access),
            ("unmap", unmap),
            ("release", release),
        ];
        Ok(out)
    }

    /// What one cuMemSetAccess over a run of freshly mapped handles of `handle` bytes costs a
    /// handle, by the run's length and by how many other handles the process has mapped and
    /// granted: for each of `backgrounds` (others mapped first, granted one by one, in a
    /// reservation of their own) and each of `runs`, the median over `reps` runs of the time of
    /// the one grant divided by the run's length. Returns (others mapped, run length, ns a
    /// handle). Runs or backgrounds over a quarter of the free memory are left out. Everything
    /// it made is given back, on failure too.
    pub fn time_run_grants(
        &self,
        handle: u64,
        runs: &[usize],
        backgrounds: &[usize],
        reps: usize,
    ) -> Result<Vec<(usize, usize, u64)>, DeviceError> {
        let page = self.timing_page(handle, reps)?;
        let _current = self.make_current()?;
        let (prop, desc) = props_and_access(self.ordinal());
        let room = crate::device::Device::mem_info(self).map(|m| m.free / 4).unwrap_or(0);
        let mut out = Vec::new();
        for &others in backgrounds.iter().filter(|&&b| b as u64 * handle <= room) {
            // The others: mapped and granted one by one, held while the runs are timed.
            let (bg, bg_handles, bg_mapped, mut result) = if others == 0 {
                (0, Vec::new(), 0, Ok(()))
            } else {
                let base = reserve_range(others as u64 * handle, page)?;
                let (h, m, r) = map_timed(base, handle, others, &prop, Some(&desc), &mut CallTimes::default());
                (base, h, m, r)
            };
            for &n in runs.iter().filter(|&&n| n as u64 * handle <= room) {
                if result.is_err() {
                    break;
                }
                let bytes = n as u64 * handle;
                let mut per = Vec::with_capacity(reps);
                for _ in 0..reps {
                    let run = reserve_range(bytes, page).and_then(|base| {
                        let (ns, run) = run_grant(base, handle, n, &prop, &desc);
                        per.extend(ns);
                        run.and(free_range(base, bytes))
                    });
                    if let Err(e) = run {
                        result = Err(e);
                        break;
                    }
                }
                if !per.is_empty() {
                    out.push((others, n, median(&mut per)));
                }
            }
            if others > 0 {
                result = result.and(give_back_timed(
                    bg,
                    handle,
                    &bg_handles,
                    bg_mapped,
                    &mut CallTimes::default(),
                ));
                result = result.and(free_range(bg, others as u64 * handle));
            }
            result?;
        }
        Ok(out)
    }

    /// The device's page, for timing handles of `handle` bytes `n` times: an error where the
    /// device has no virtual memory management, `handle` is off the granule or `n` is 0.
    fn timing_page(&self, handle: u64, n: usize) -> Result<u64, DeviceError> {
        let Some(page) = self.vmm_page else {
            return Err(DeviceError::Driver {
                call: "cuDeviceGetAttribute",
                code: "no virtual memory management on this device (or ADAPTALLOC_CUDA_VMM=0)".into(),
            });
        };
        if handle == 0 || handle % page != 0 || n == 0 {
            return Err(DeviceError::Driver {
                call: "cuMemCreate",
                code: format!("a handle of {handle} bytes is not a multiple of the {page}-byte granule"),
            });
        }
        Ok(page)
    }
}

/// The allocation properties of a pinned handle on device `ordinal`, and read-write access to it.
fn props_and_access(ordinal: i32) -> (sys::CUmemAllocationProp, sys::CUmemAccessDesc) {
    let prop = allocation_prop(ordinal);
    let desc = sys::CUmemAccessDesc {
        location: prop.location,
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    (prop, desc)
}

/// Reserves `bytes` of address space aligned to `page` (the context current).
fn reserve_range(bytes: u64, page: u64) -> Result<sys::CUdeviceptr, DeviceError> {
    let mut base: sys::CUdeviceptr = 0;
    // SAFETY: `base` is a live local; address space only.
    check("cuMemAddressReserve", unsafe {
        sys::cuMemAddressReserve(&mut base, bytes as usize, page as usize, 0, 0)
    })?;
    Ok(base)
}

/// Gives back the reservation `base..base + bytes` (every handle in it unmapped).
fn free_range(base: sys::CUdeviceptr, bytes: u64) -> Result<(), DeviceError> {
    // SAFETY: the caller's reservation, with nothing mapped in it.
    check("cuMemAddressFree", unsafe {
        sys::cuMemAddressFree(base, bytes as usize)
    })
}

/// Maps `n` fresh handles of `handle` bytes from `base` (unmapped, in the caller's reservation,
/// its context current) without grants, times one cuMemSetAccess over them all, and gives them
/// back: the grant's time a handle (None where mapping failed first), and the first failure.
fn run_grant(
    base: sys::CUdeviceptr,
    handle: u64,
    n: usize,
    prop: &sys::CUmemAllocationProp,
    desc: &sys::CUmemAccessDesc,
) -> (Option<u64>, Result<(), DeviceError>) {
    let mut t = CallTimes::default();
    let (handles, mapped, mut run) = map_timed(base, handle, n, prop, None, &mut t);
    let mut ns = None;
    if run.is_ok() {
        let t0 = Instant::now();
        // SAFETY: every handle of `base..base + n * handle` was just mapped; `desc` is one live
        // descriptor.
        run = check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(base, n * handle as usize, desc, 1)
        });
        ns = Some(t0.elapsed().as_nanos() as u64 / n as u64);
    }
    (ns, run.and(give_back_timed(base, handle, &handles, mapped, &mut t)))
}

/// The time of each call of one phase of [`CudaDevice::time_vmm_calls`], ns.
#[derive(Default)]
struct CallTimes {
    create: Vec<u64>,
    map: Vec<u64>,
    access: Vec<u64>,
    unmap: Vec<u64>,
    release: Vec<u64>,
}

/// Runs `call`, pushing its time onto `times`.
fn timed(times: &mut Vec<u64>, call: impl FnOnce() -> sys::CUresult) -> sys::CUresult {
    let t = Instant::now();
    let r = call();
    times.push(t.elapsed().as_nanos() as u64);
    r
}

/// Creates and maps `n` handles of `handle` bytes one after another from `base` (unmapped, in
/// the caller's reservation, its context current), granting each its own access when `desc` is
/// Some; every call timed into `t`. Returns the handles made, how many of them are mapped, and
/// the first failure (where it stopped).
fn map_timed(
    base: sys::CUdeviceptr,
    handle: u64,
    n: usize,
    prop: &sys::CUmemAllocationProp,
    desc: Option<&sys::CUmemAccessDesc>,
    t: &mut CallTimes,
) -> (Vec<sys::CUmemGenericAllocationHandle>, usize, Result<(), DeviceError>) {
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let va = base + (i as u64) * handle;
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `h` and `prop` are live; the context is current (the caller's contract).
        let r = timed(&mut t.create, || unsafe {
            sys::cuMemCreate(&mut h, handle as usize, prop, 0)
        });
        if let Err(e) = check("cuMemCreate", r) {
            return (handles, i, Err(e));
        }
        handles.push(h);
        // SAFETY: `va..va+handle` lies in the caller's reservation, unmapped; `h` is a handle
        // of exactly `handle` bytes that we hold.
        let r = timed(&mut t.map, || unsafe { sys::cuMemMap(va, handle as usize, 0, h, 0) });
        if let Err(e) = check("cuMemMap", r) {
            return (handles, i, Err(e));
        }
        if let Some(desc) = desc {
            // SAFETY: `va..va+handle` was just mapped; `desc` is one live descriptor.
            let r = timed(&mut t.access, || unsafe {
                sys::cuMemSetAccess(va, handle as usize, desc, 1)
            });
            if let Err(e) = check("cuMemSetAccess", r) {
                return (handles, i + 1, Err(e));
            }
        }
    }
    (handles, n, Ok(()))
}

/// Unmaps the first `mapped` of `handles` (mapped one after another from `base`, nothing queued
/// on them) and releases every one, timed into `t`; the first failure, after trying them all.
fn give_back_timed(
    base: sys::CUdeviceptr,
    handle: u64,
    handles: &[sys::CUmemGenericAllocationHandle],
    mapped: usize,
    t: &mut CallTimes,
) -> Result<(), DeviceError> {
    let mut result = Ok(());
    for (i, &h) in handles.iter().enumerate() {
        if i < mapped {
            let va = base + (i as u64) * handle;
            // SAFETY: mapped at this address by `map_timed`, nothing queued on it.
            let r = timed(&mut t.unmap, || unsafe { sys::cuMemUnmap(va, handle as usize) });
            result = result.and(check("cuMemUnmap", r));
        }
        // SAFETY: our reference from cuMemCreate, unmapped now: its memory goes back.
        let r = timed(&mut t.release, || unsafe { sys::cuMemRelease(h) });
        result = result.and(check("cuMemRelease", r));
    }
    result
}
