//! `adaptalloc replay`: one allocator over one trace on SimDevice, with its tuning report.

use std::path::PathBuf;
use std::sync::Arc;

use adaptalloc::device::{Device, Granularity, SimDevice};
use adaptalloc::policy::Policy;
use adaptalloc::{Allocator, size::ByteSize};
use adaptalloc_cli::compare::{Contender, passthrough_min_capacity};
use adaptalloc_cli::trace::{ReplayOptions, ReplayTarget, load, replay_with};
use anyhow::Context;

use crate::common::{CapacityArgs, ReplayArgs};

#[derive(clap::Args)]
pub struct Args {
    /// The trace (CSV, RMM log or PyTorch snapshot).
    trace: PathBuf,
    /// A policy file, or a preset name (default, training, inference-edge, multi-tenant, ...).
    #[arg(long, conflicts_with = "strategy")]
    policy: Option<String>,
    /// A fixed strategy or a peer instead: passthrough, caching, suballoc, adaptive, pytorch,
    /// pytorch-expandable, cuda-async, cuda-async-retain, rmm-pool, iree-caching.
    #[arg(long)]
    strategy: Option<String>,
    #[command(flatten)]
    capacity: CapacityArgs,
    #[command(flatten)]
    run: ReplayArgs,
    /// Write the tuning report here (.toml, .json or .md by extension).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Skip frees of ids that are not live instead of failing (they are counted).
    #[arg(long)]
    lenient: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let trace = load(&args.trace, args.lenient)?;
    let trace = match args.run.window {
        Some(w) => trace.window(w.start, w.end),
        None => trace,
    };
    let granule = Granularity::default().large_granule;
    let capacity = args.capacity.capacity()?.bytes_for(trace.peak_live_bytes(), granule);
    let repeat = args.run.repeat;
    let events = trace.events.len() as u64 * repeat as u64;
    let script = args.run.tenant.map(|t| t.script(events)).unwrap_or_default();
    let dev = Arc::new(SimDevice::builder().capacity(capacity).tenants(script.clone()).build());
    let device: Arc<dyn Device> = dev.clone();
    let options = ReplayOptions {
        repeat,
        sync_every: args.run.sync_every,
    };
    // The policy the engine runs, when it runs one (its recommendation is replayed below).
    let used_policy = match (&args.policy, &args.strategy) {
        (_, Some(_)) => None,
        (Some(p), None) => Some(Policy::load(p)?),
        (None, None) => Some(Policy::default()),
    };
    // `ours` is None for a peer allocator (no tuning report).
    let (target, ours): (Box<dyn ReplayTarget>, Option<Allocator>) = match (&args.policy, &args.strategy) {
        (_, Some(name)) => {
            let c = Contender::parse(name)
                .with_context(|| format!("unknown strategy {name:?}; known: {}", Contender::known()))?;
            match c.build(device.clone()) {
                Some(a) => (Box::new(a.clone()), Some(a)),
                None => (c.target(device, &args.run.pytorch_conf), None),
            }
        }
        (Some(p), None) => {
            let policy = used_policy.clone().expect("loaded above");
            policy.check_fits(p, capacity)?;
            let a = Allocator::with_policy(device, policy);
            (Box::new(a.clone()), Some(a))
        }
        (None, None) => {
            let a = Allocator::with_policy(device, Policy::default());
            (Box::new(a.clone()), Some(a))
        }
    };
    let m = crate::progress::with_spinner("replaying", || {
        replay_with(&trace, &*target, options, |i| dev.advance_clock(i))
    });
    let mut text = format!(
        "{}: {} events on {}: {} failed allocations, {} driver allocations + {} frees, modelled driver time {:.1} ms, \
         peak live {}, peak reserved {}, {} tenant failures{}\n",
        trace.name,
        m.events,
        dev.name(),
        m.failed_allocs,
        m.driver_allocs,
        m.driver_frees,
        m.modeled_driver_ns as f64 / 1e6,
        ByteSize(m.peak_live_bytes),
        ByteSize(m.peak_reserved_bytes),
        dev.tenant_failures(),
        if args.lenient {
            format!(", {} unknown frees skipped", trace.skipped_frees)
        } else {
            String::new()
        }
    );
    match ours.and_then(|a| a.report()) {
        Some(mut report) => {
            let used = used_policy.expect("an engine runs a policy");
            let needed = passthrough_min_capacity(&trace, Granularity::default());
            let replay_policy = |policy: &Policy| {
                let dev = Arc::new(SimDevice::builder().capacity(capacity).tenants(script.clone()).build());
                let a = Allocator::with_policy(dev.clone() as Arc<dyn Device>, policy.clone());
                replay_with(&trace, &a, options, |i| dev.advance_clock(i))
            };
            adaptalloc_cli::advice::check_advice(&mut report, &used, &m, needed, capacity, replay_policy);
            text += &format!("\n{report}");
            if let Some(path) = &args.report {
                report
                    .write_to(path)
                    .with_context(|| format!("{}: cannot write the report", path.display()))?;
            }
        }
        None => {
            if args.report.is_some() {
                eprintln!("note: fixed strategies have no policy engine, so no tuning report; use --policy");
            }
        }
    }
    crate::common::emit(&text)?;
    Ok(())
}
