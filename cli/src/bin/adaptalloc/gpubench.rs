//! `adaptalloc gpu-bench`: on a machine with an NVIDIA GPU, calibrates the cost model and
//! replays traces through CudaDevice with every strategy and through CUDA's stream-ordered pool.
//! Driven by `scripts/gpu-bench.sh`.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use adaptalloc::device::{CostCurve, CostModel, CudaDevice, CudaPool, Device, DevicePtr, VmmTimings};
use adaptalloc::size::ByteSize;
use adaptalloc::strategy::StreamId;
use adaptalloc_cli::compare::Contender;
use adaptalloc_cli::estimate::{Estimate, median, quantile};
use adaptalloc_cli::trace::{ReplayOptions, ReplayTarget, TargetCounters, Trace, replay_with};
use anyhow::Context;

#[derive(clap::Args)]
pub struct Args {
    /// Traces to replay (CSV, RMM log or PyTorch snapshot); with none, the bundled workloads.
    traces: Vec<PathBuf>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: i32,
    /// Where to write the calibrated cost model (default tuning/cost-models/<gpu-name>.toml).
    #[arg(long)]
    cost_model: Option<PathBuf>,
    /// Where to write the results table (Markdown).
    #[arg(long, default_value = "out/gpu-bench/results.md")]
    results: PathBuf,
    /// Fewer timing repetitions (a smoke run).
    #[arg(long)]
    quick: bool,
    /// Replay each trace N times back to back: 1 to 10,000.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    repeat: u32,
    /// Skip frees of ids that are not live instead of failing.
    #[arg(long)]
    lenient: bool,
}

/// A file-name-safe form of the GPU's name ("NVIDIA H200" -> "nvidia-h200").
fn slug(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    s.split('-').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("-")
}

/// Median cuMemAlloc / cuMemFree and pool cuMemAllocAsync / cuMemFreeAsync latencies by size,
/// as a cost-model TOML.
fn calibrate(cuda: &Arc<CudaDevice>, quick: bool) -> anyhow::Result<String> {
    let free = cuda.mem_info()?.free;
    let pool = CudaPool::new(cuda.clone())?;
    let mut alloc_pts = Vec::new();
    let mut free_pts = Vec::new();
    let mut pool_rows = String::new();
    let (mut all_pa, mut all_pf) = (Vec::new(), Vec::new());
    let mut size = 512u64;
    while size <= 4 << 30 {
        if size > free / 10 * 9 {
            eprintln!("calibrate: {} skipped ({} free)", ByteSize(size), ByteSize(free));
            break;
        }
        let reps = match (size, quick) {
            (_, true) => 3,
            (s, false) if s <= 32 << 20 => 50,
            (s, false) if s <= 512 << 20 => 10,
            _ => 4,
        };
        let (mut a, mut f) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let t = Instant::now();
            let p = cuda.allocate(size)?;
            a.push(t.elapsed().as_nanos() as u64);
            let t = Instant::now();
            cuda.free(p)?;
            f.push(t.elapsed().as_nanos() as u64);
        }
        // The pool: one warm-up so that the timed calls are pool hits, as in a steady loop.
        let (p, _) = pool.alloc_async(size)?;
        pool.free_async(p)?;
        pool.synchronize()?;
        let (mut pa, mut pf) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let (p, ns) = pool.alloc_async(size)?;
            pa.push(ns);
            pf.push(pool.free_async(p)?);
            pool.synchronize()?;
        }
        all_pa.extend_from_slice(&pa);
        all_pf.extend_from_slice(&pf);
        let (ia, i_f) = (median(a), median(f));
        // Within a workload, an allocation has live neighbours: the same count again, kept live
        // until the last is taken, then freed in the order taken. What the model prices.
        let (ma, mf) = match live_neighbours(cuda, size, reps, free)? {
            Some((la, lf)) => (la, lf),
            None => (ia, i_f),
        };
        eprintln!(
            "calibrate: {}: cuMemAlloc {ma} ns, cuMemFree {mf} ns with live neighbours; alone {ia} / {i_f} ns",
            ByteSize(size)
        );
        alloc_pts.push(format!("    [{size}, {ma}],  # {}; alone {ia}", ByteSize(size)));
        free_pts.push(format!("    [{size}, {mf}],  # alone {i_f}"));
        let _ = writeln!(
            pool_rows,
            "#   {:>10}  {:>8}  {:>8}",
            ByteSize(size).to_string(),
            median(pa),
            median(pf)
        );
        size *= 4;
    }
    let mut info = Vec::new();
    for _ in 0..100 {
        let t = Instant::now();
        cuda.mem_info()?;
        info.push(t.elapsed().as_nanos() as u64);
    }
    let vmm = calibrate_vmm(cuda, quick)?;
    let date = std::process::Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let default = CostModel::default();
    Ok(format!(
        "# Measured by scripts/gpu-bench.sh (adaptalloc gpu-bench) on {name}, {date}: medians of\n\
         # each driver call on an idle device (no queued work). cuMemAlloc and cuMemFree: blocks\n\
         # taken one after another and kept live, then freed in order (a workload's allocations have\n\
         # live neighbours); each point's comment gives the same call alone (taken and freed at\n\
         # once). The schema and the meaning of each key are in tuning/cost-models/default.toml.\n\
         description = \"{name}, measured {date} (medians, idle device)\"\n\n\
         # Kept from the default model: the wait for queued work that cuMemFree's synchronization\n\
         # adds depends on the workload (this device was idle, so it was not measured).\n\
         free_sync_ns = {sync}\n\n\
         # cuMemGetInfo, median of 100 calls.\n\
         mem_info_ns = {info}\n\n\
         # Kept from the default model, as free_sync_ns: a wait for one stream's queued work.\n\
         stream_sync_ns = {ssync}\n\n\
         # cuMemAllocAsync / cuMemFreeAsync on the default pool (release threshold at its maximum),\n\
         # pool hits, medians over every size below.\n\
         async_alloc_ns = {async_alloc}\n\
         async_free_ns = {async_free}\n\n\
         [alloc]\npoints = [\n{alloc}\n]\n\n[free]\npoints = [\n{free}\n]\n\n\
         {vmm}\n\
         # The stream-ordered pool by size, ns:\n\
         #         size     alloc      free\n{pool_rows}",
        name = cuda.name(),
        sync = default.free_sync_ns,
        ssync = default.stream_sync_ns,
        info = median(info),
        async_alloc = median(all_pa),
        async_free = median(all_pf),
        alloc = alloc_pts.join("\n"),
        free = free_pts.join("\n"),
    ))
}

/// Median cuMemAlloc and cuMemFree times for `reps` blocks of `size` taken one after another
/// and kept live, then freed in the order taken; None where they would take over a quarter of
/// `free` (the isolated timings stand).
fn live_neighbours(cuda: &CudaDevice, size: u64, reps: usize, free: u64) -> anyhow::Result<Option<(u64, u64)>> {
    if size.saturating_mul(reps as u64) > free / 4 {
        return Ok(None);
    }
    let (mut a, mut f, mut held) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        let t = Instant::now();
        let p = cuda.allocate(size);
        a.push(t.elapsed().as_nanos() as u64);
        match p {
            Ok(p) => held.push(p),
            Err(e) => {
                for p in held {
                    cuda.free(p)?;
                }
                return Err(e.into());
            }
        }
    }
    for p in held {
        let t = Instant::now();
        cuda.free(p)?;
        f.push(t.elapsed().as_nanos() as u64);
    }
    Ok(Some((median(a), median(f))))
}

/// The `[vmm]` table: every virtual-memory call timed on handles from one granule to 1 GiB, with
/// each price's confidence interval, and cuMemCreate priced by handle size; or the default's
/// prices, said so, where the device has none.
fn calibrate_vmm(cuda: &CudaDevice, quick: bool) -> anyhow::Result<String> {
    let default = CostModel::default().vmm;
    let Some(page) = cuda.vmm_page_size() else {
        eprintln!("calibrate: no virtual memory management on this device; [vmm] keeps the default's prices");
        let at_2mib = |c: &CostCurve| c.ns(2 << 20);
        return Ok(format!(
            "# Not measured: this device has no virtual memory management (or ADAPTALLOC_CUDA_VMM=0);\n\
             # the default model's prices for 2 MiB handles.\n\
             [vmm]\nreserve_ns = {}\nunreserve_ns = {}\ncreate_ns = {}\nmap_ns = {}\nset_access_ns = {}\n\
             unmap_ns = {}\nrelease_ns = {}\nunmap_sync_ns = {}\n",
            default.reserve_ns,
            default.unreserve_ns,
            at_2mib(&default.create_ns),
            default.map_ns,
            at_2mib(&default.set_access_ns),
            at_2mib(&default.unmap_ns),
            at_2mib(&default.release_ns),
            default.unmap_sync_ns
        ));
    };
    // Handle sizes from one granule to 1 GiB (for 2 MiB granules: 2, 8, 32, 128, 512 MiB,
    // 1 GiB), fewer handles of the larger ones, and never more than half the free memory.
    let plan: [(u64, usize); 6] = if quick {
        [(1, 4), (4, 2), (16, 2), (64, 2), (256, 2), (512, 2)]
    } else {
        [(1, 64), (4, 32), (16, 16), (64, 8), (256, 4), (512, 4)]
    };
    let free = cuda.mem_info().map(|m| m.free).unwrap_or(0);
    let mut measured = Vec::new();
    let mut notes = String::new();
    for (pages, n) in plan {
        let size = page * pages;
        let n = n.min((free / 2 / size) as usize);
        if n < 2 {
            let _ = writeln!(
                notes,
                "#   {}: not measured (two handles would take over half the {} free)",
                ByteSize(size),
                ByteSize(free)
            );
            continue;
        }
        let t = cuda
            .time_vmm_calls(size, n)
            .with_context(|| format!("timing {} handles", ByteSize(size)))?;
        eprintln!("calibrate: vmm, {n} handles of {}: {t:?}", ByteSize(size));
        measured.push((size, t));
    }
    let Some((_, small)) = measured.first() else {
        anyhow::bail!("no handle size could be measured: {} free", ByteSize(free));
    };
    let mut table = String::new();
    for (size, t) in &measured {
        for (kind, samples) in &t.samples {
            if let Some(e) = Estimate::of(samples) {
                let _ = writeln!(table, "#   {:>7} {kind:<10} {e}", ByteSize(*size).to_string());
            }
        }
        let _ = writeln!(
            table,
            "#   {:>7} run grant  {} a handle, one cuMemSetAccess over {} of them",
            ByteSize(*size).to_string(),
            t.run_access_ns,
            t.samples[0].1.len()
        );
    }
    // How a run grant's price a handle moves with the run's length and with the handles the
    // process already holds mapped (a workload's grants come late in a run, with thousands
    // mapped): the set access price above is one number a handle, measured with none held.
    let (runs, others, reps): (&[usize], &[usize], usize) = if quick {
        (&[1, 4], &[0, 4], 1)
    } else {
        (&[1, 16, 64, 256, 1024], &[0, 1024, 4096], 3)
    };
    let grants = cuda
        .time_run_grants(page, runs, others, reps)
        .context("timing run grants")?;
    if !grants.is_empty() {
        let _ = writeln!(
            table,
            "# Run grants of {} handles, ns a handle (median of {reps}), by run length, with other handles mapped:",
            ByteSize(page)
        );
        for &o in others {
            let row: Vec<String> = grants
                .iter()
                .filter(|g| g.0 == o)
                .map(|&(_, n, ns)| format!("{n}: {ns}"))
                .collect();
            if !row.is_empty() {
                let _ = writeln!(table, "#   {o:>5} others mapped: {}", row.join(", "));
            }
        }
    }
    let copy = match time_page_copies(cuda, page, if quick { 2 } else { 8 }) {
        Some(ns) => format!(
            "# A page kept in a split handle, copied on the device (cuMemcpyDtoD, median of the\n\
             # splits' means, four pages each of an eight-page handle):\ncopy_ns = {ns}\n"
        ),
        None => format!(
            "# Page copies not measured (no room for an eight-page handle); the default's:\ncopy_ns = {}\n",
            default.copy_ns.ns(page)
        ),
    };
    // A price by handle size: the medians at every size measured.
    let curve = |price: fn(&VmmTimings) -> u64| {
        let points: Vec<String> = measured
            .iter()
            .map(|(size, t)| format!("[{size}, {}]", price(t)))
            .collect();
        format!("{{ points = [{}] }}", points.join(", "))
    };
    Ok(format!(
        "# Virtual memory: each call timed on handles of every size below (ns; the median is the\n\
         # price, the mean's 95% confidence interval says how sure it is). cuMemCreate, set access\n\
         # (charged per handle a call covers), unmap and release are priced by handle size; map,\n\
         # reserve and unreserve from the {ps} handles. Set access is one grant over the handles\n\
         # of a run, per handle (\"run grant\" below; \"set_access\" is one handle's grant alone).\n\
         # cuCtxSynchronize on the idle device took {sync} ns; unmap_sync_ns keeps the default's,\n\
         # as free_sync_ns.\n\
         {table}{notes}\
         [vmm]\nreserve_ns = {reserve}\nunreserve_ns = {unreserve}\n\
         create_ns = {create}\nmap_ns = {map}\nset_access_ns = {access}\nunmap_ns = {unmap}\n\
         release_ns = {release}\nunmap_sync_ns = {usync}\n{copy}",
        ps = ByteSize(page),
        sync = small.sync_ns,
        reserve = small.reserve_ns,
        unreserve = small.unreserve_ns,
        create = curve(|t| t.create_ns),
        map = small.map_ns,
        access = curve(|t| t.run_access_ns),
        unmap = curve(|t| t.unmap_ns),
        release = curve(|t| t.release_ns),
        usync = default.unmap_sync_ns,
    ))
}

/// The price of a page copy as a split makes it (`VirtualMemory::split_handle`, on the device):
/// `reps` times, a handle of eight pages mapped, split keeping every other page, and the copies'
/// time read from the device's own timing by kind; the median of each split's mean. None where
/// the device has no room for a handle and its copies (a third of its free memory) or a split
/// fails.
fn time_page_copies(cuda: &CudaDevice, page: u64, reps: usize) -> Option<u64> {
    let vmm = cuda.vmm()?;
    let free = cuda.mem_info().ok()?.free;
    if 12 * page > free / 3 {
        return None;
    }
    let keep: Vec<u64> = (0..8).step_by(2).map(|i| i * page).collect();
    let mut means = Vec::new();
    for _ in 0..reps {
        let va = vmm.reserve(8 * page).ok()?;
        if vmm.map_handles(va, 8 * page, 8 * page).is_err() {
            let _ = vmm.unreserve(va);
            return None;
        }
        let before = cuda.stats().ops.copy;
        let split = vmm.quiesce().and_then(|()| vmm.split_handle(va, 8 * page, &keep));
        let after = cuda.stats().ops.copy;
        match split {
            Ok(()) => {
                for &o in &keep {
                    let _ = vmm.unmap(va + o, page);
                }
            }
            Err(e) => {
                eprintln!("calibrate: splitting a handle failed ({e}); copy_ns keeps the default's");
                let _ = vmm.unmap(va, 8 * page);
                let _ = vmm.unreserve(va);
                return None;
            }
        }
        let _ = vmm.unreserve(va);
        let calls = after.calls - before.calls;
        means.push((after.ns - before.ns) / calls.max(1));
    }
    means.sort_unstable();
    means.get(means.len() / 2).copied()
}

/// A replay target with every call timed.
struct Timed<'a> {
    inner: &'a dyn ReplayTarget,
    ns: RefCell<Vec<u64>>,
}

impl ReplayTarget for Timed<'_> {
    fn allocate(&self, bytes: u64, stream: StreamId) -> Option<DevicePtr> {
        let t = Instant::now();
        let r = self.inner.allocate(bytes, stream);
        self.ns.borrow_mut().push(t.elapsed().as_nanos() as u64);
        r
    }
    fn deallocate(&self, ptr: DevicePtr, stream: StreamId) {
        let t = Instant::now();
        self.inner.deallocate(ptr, stream);
        self.ns.borrow_mut().push(t.elapsed().as_nanos() as u64);
    }
    fn counters(&self) -> TargetCounters {
        self.inner.counters()
    }
    fn reset_peaks(&self) {
        self.inner.reset_peaks()
    }
    fn device(&self) -> &Arc<dyn Device> {
        self.inner.device()
    }
}

fn results_row(trace: &Trace, name: &str, target: &dyn ReplayTarget, repeat: u32) -> String {
    let timed = Timed {
        inner: target,
        ns: RefCell::new(Vec::with_capacity(trace.events.len())),
    };
    let m = replay_with(
        trace,
        &timed,
        ReplayOptions {
            repeat,
            ..Default::default()
        },
        |_| {},
    );
    let mut ns = timed.ns.into_inner();
    ns.sort_unstable();
    let q = |f: f64| quantile(&ns, f);
    let mean = ns.iter().sum::<u64>() as f64 / ns.len().max(1) as f64;
    // Every kind of driver call made, with its measured time: what a cost model must price.
    let kinds = adaptalloc::report::by_kind(&m.driver_ops);
    format!(
        "| {} | {name} | {} | {} | {:.1} | {:.1} | {} | {:.0} | {} | {} | {:.3} |\n",
        trace.name,
        m.failed_allocs,
        m.driver_calls,
        m.modeled_driver_ns as f64 / 1e6,
        m.wall_ns as f64 / 1e6,
        adaptalloc::report::by_kind_line(&kinds, kinds.len()),
        mean,
        q(0.5),
        q(0.99),
        m.peak_reserved_bytes as f64 / m.peak_live_bytes.max(1) as f64,
    )
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let cuda = Arc::new(CudaDevice::new(args.device).context("gpu-bench needs a CUDA device")?);
    let name = cuda.name();
    let cost_path = args
        .cost_model
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("tuning/cost-models/{}.toml", slug(&name))));
    let toml = calibrate(&cuda, args.quick)?;
    if let Some(dir) = cost_path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    }
    std::fs::write(&cost_path, &toml).with_context(|| format!("{}: cannot write", cost_path.display()))?;
    CostModel::from_file(&cost_path).context("the calibrated cost model does not parse")?;
    eprintln!("wrote {}", cost_path.display());

    let traces = crate::common::load_traces(&args.traces, args.lenient, None)?;
    let total = cuda.mem_info()?.total;
    let mut md = format!(
        "# gpu-bench on {name} ({} total)\n\nEvery strategy and CUDA's stream-ordered pool (cuMemAllocAsync on the default \
         pool, release threshold at its maximum) replaying each trace through the real driver. Driver ms is the \
         time measured inside driver calls, by kind in the next column (ms, calls); wall time includes it and \
         the allocator's own work; per-event times are host-side (the pool's frees complete on the stream). \
         Driver calls for cuda-pool are its async calls.\n\n\
         | trace | allocator | failed | driver calls | driver ms | wall ms | by kind: ms (calls) | mean ns/event | p50 ns | p99 ns | peak reserved / live |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
        ByteSize(total)
    );
    if let Some(dir) = args.results.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    }
    // Written after every trace, so that a run stopped part way keeps the rows it finished.
    let write = |md: &str| {
        std::fs::write(&args.results, md).with_context(|| format!("{}: cannot write", args.results.display()))
    };
    for trace in &traces {
        let free = cuda.mem_info()?.free;
        if trace.peak_live_bytes() > free / 10 * 9 {
            let _ = writeln!(
                md,
                "| {} | skipped: peak live {} > 90% of {} free | | | | | | | | | |",
                trace.name,
                ByteSize(trace.peak_live_bytes()),
                ByteSize(free)
            );
            continue;
        }
        for c in Contender::all() {
            let target = c.target(cuda.clone() as Arc<dyn Device>, &Default::default());
            md += &results_row(trace, c.name(), &*target, args.repeat);
        }
        let pool = adaptalloc_cli::peers::CudaPoolTarget::new(cuda.clone())?;
        md += &results_row(trace, "cuda-pool", &pool, args.repeat);
        drop(pool);
        write(&md)?;
        eprintln!("replayed {}", trace.name);
    }
    write(&md)?;
    print!("{md}");
    Ok(())
}
