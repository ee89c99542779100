//! Advice that holds: a tuning report's recommendation checked by replaying it on the
//! workload it came from (`adaptalloc replay`, the Python package's `report()`, and
//! `examples/peers_md.rs`).

use std::sync::Arc;

use adaptalloc::Allocator;
use adaptalloc::device::{Device, Granularity, SimDevice};
use adaptalloc::policy::Policy;
use adaptalloc::report::TuningReport;
use adaptalloc::size::ByteSize;

use crate::compare::passthrough_min_capacity;
use crate::trace::{PassTimes, ReplayMetrics, ReplayOptions, Trace, replay_with};

/// One run of a policy with its tuning report, the advice checked by replay.
pub struct AdvisedRun {
    /// The run.
    pub metrics: ReplayMetrics,
    /// The device it ran on.
    pub device: Arc<SimDevice>,
    /// Its tuning report, the recommendation checked ([`check_advice`]).
    pub report: TuningReport,
    /// The replay of the recommended policy, where the report kept a recommendation.
    pub advised: Option<ReplayMetrics>,
}

/// Replays `trace` under `policy` on a fresh device from `device` (its co-tenants' clock
/// advanced by the replay), builds the tuning report, and checks its advice by replaying the
/// recommendation on another fresh device ([`check_advice`]).
pub fn run_with_advice(
    trace: &Trace,
    policy: &Policy,
    options: ReplayOptions,
    device: impl Fn() -> Arc<SimDevice>,
) -> AdvisedRun {
    let run = |p: &Policy, o: ReplayOptions| {
        let dev = device();
        let alloc = Allocator::with_policy(dev.clone() as Arc<dyn Device>, p.clone());
        let m = replay_with(trace, &alloc, o, |i| dev.advance_clock(i));
        (m, dev, alloc)
    };
    let (metrics, dev, alloc) = run(policy, options);
    let mut report = alloc.report().expect("an allocator with a policy has a report");
    // Modelled times are only as good as their prices: the report names them.
    report.device = format!("{} priced by {:?}", report.device, dev.cost_model().description);
    let needed = passthrough_min_capacity(trace, Granularity::default());
    let advised = check_advice(
        &mut report,
        policy,
        &metrics,
        needed,
        dev.capacity(),
        options,
        |p, o| run(p, o).0,
    );
    AdvisedRun {
        metrics,
        device: dev,
        report,
        advised,
    }
}

/// Passes over which [`check_advice`] compares the run's policy and the recommended one:
/// issue 24's yardstick, the warm-up (the first five passes less four steady ones) and the
/// steady state (the mean of passes 6-10).
pub const ADVICE_PASSES: u32 = 10;

/// Advice that holds: says when the workload's peak footprint (`needed`, what passthrough's
/// live blocks consume at most) does not fit the device, and otherwise replays the report's
/// recommended policy (`replay`) on the same trace and device, keeping it only when it fails
/// fewer allocations than the run (`ran`), or as many while costing less over
/// [`ADVICE_PASSES`] passes in all (the warm-up and the passes after it) and no more a pass in
/// steady state (5% or 0.05 ms a pass of slack), both policies replayed over those passes. A
/// training loop pays the steady state on every step: advice that saves the first pass and
/// costs each later one is no advice, and advice whose dearer warm-up the cheaper passes repay
/// within ten is (`gpu-medium-ctx1024-infer` at 1.1x passthrough's minimum: segregated slabs
/// cost 575 ms more to warm up and 190 ms less a pass). Else the report recommends no change
/// and says what the replay measured. Returns the replay of the recommendation with the run's
/// `options` when it is kept.
pub fn check_advice(
    report: &mut TuningReport,
    used: &Policy,
    ran: &ReplayMetrics,
    needed: u64,
    capacity: u64,
    options: ReplayOptions,
    replay: impl Fn(&Policy, ReplayOptions) -> ReplayMetrics,
) -> Option<ReplayMetrics> {
    let mut same = report.recommended_policy.clone();
    same.description.clone_from(&used.description);
    if needed > capacity {
        report.recommendations = vec![format!(
            "the workload's peak footprint ({}) does not fit this device ({}): no policy completes it \
             here; it needs a device of at least {} (passthrough's smallest)",
            ByteSize(needed),
            ByteSize(capacity),
            ByteSize(needed)
        )];
        report.recommended_policy = used.clone();
        report.recommends_change = false;
        return None;
    }
    if same == *used {
        return None;
    }
    let r = replay(&report.recommended_policy, options);
    // Each policy over ADVICE_PASSES: the replays above, when they already ran that many.
    let passes = |p: &Policy, m: &ReplayMetrics| {
        if options.repeat == ADVICE_PASSES {
            return m.passes;
        }
        let o = ReplayOptions {
            repeat: ADVICE_PASSES,
            ..options
        };
        replay(p, o).passes
    };
    let (was, now) = (passes(used, ran), passes(&report.recommended_policy, &r));
    let ms = |ns: u64| ns as f64 / 1e6;
    let measured = format!(
        "{} failed, {:.1} ms modelled driver time, against this run's {} failed, {:.1} ms; over {ADVICE_PASSES} \
         passes, {:.1} ms in all (a warm-up of {:.1} ms and {:.2} ms a pass after), against {:.1} ms ({:.1} ms \
         and {:.2} ms)",
        r.failed_allocs,
        ms(r.modeled_driver_ns),
        ran.failed_allocs,
        ms(ran.modeled_driver_ns),
        ms(over_passes(&now)),
        ms(now.warmup_ns),
        ms(now.steady_pass_ns),
        ms(over_passes(&was)),
        ms(was.warmup_ns),
        ms(was.steady_pass_ns)
    );
    let slack = (was.steady_pass_ns / 20).max(50_000);
    // Fewer failures win outright; as many, only cheaper over the passes in all and no dearer a
    // pass once warm.
    let better = r.failed_allocs < ran.failed_allocs
        || (r.failed_allocs == ran.failed_allocs
            && over_passes(&now) < over_passes(&was)
            && now.steady_pass_ns <= was.steady_pass_ns + slack);
    if better {
        report.recommendations.push(format!(
            "replayed on this trace and device, the recommended policy made {measured}"
        ));
        Some(r)
    } else {
        let considered = report.recommendations.join("; ");
        report.recommendations = vec![format!(
            "no change: replayed on this trace and device, the changes considered ({considered}) made {measured}"
        )];
        report.recommended_policy = used.clone();
        report.recommends_change = false;
        None
    }
}

/// Modelled driver time over [`ADVICE_PASSES`] passes: the warm-up (the first pass and the
/// one-off costs of the next four) and every pass after the first at the steady state's price.
fn over_passes(p: &PassTimes) -> u64 {
    p.warmup_ns + u64::from(ADVICE_PASSES - 1) * p.steady_pass_ns
}
