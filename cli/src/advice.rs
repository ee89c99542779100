//! Advice that holds: a tuning report's recommendation checked by replaying it on the
//! workload it came from (`adaptalloc replay`, and the Python package's `report()`).

use adaptalloc::policy::Policy;
use adaptalloc::report::TuningReport;
use adaptalloc::size::ByteSize;

use crate::trace::ReplayMetrics;

/// Advice that holds: says when the workload's peak footprint (`needed`, what passthrough's
/// live blocks consume at most) does not fit the device, and otherwise replays the report's
/// recommended policy (`replay`) on the same trace and device, keeping it only when it fails
/// fewer allocations, or as many in less modelled driver time, than the run (`ran`); else the
/// report recommends no change and says what the replay measured.
pub fn check_advice(
    report: &mut TuningReport,
    used: &Policy,
    ran: &ReplayMetrics,
    needed: u64,
    capacity: u64,
    replay: impl Fn(&Policy) -> ReplayMetrics,
) {
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
        return;
    }
    if same == *used {
        return;
    }
    let r = replay(&report.recommended_policy);
    let ms = |m: &ReplayMetrics| m.modeled_driver_ns as f64 / 1e6;
    let measured = format!(
        "{} failed, {:.1} ms modelled driver time, against this run's {} failed, {:.1} ms",
        r.failed_allocs,
        ms(&r),
        ran.failed_allocs,
        ms(ran)
    );
    let better = r.failed_allocs < ran.failed_allocs
        || (r.failed_allocs == ran.failed_allocs && r.modeled_driver_ns < ran.modeled_driver_ns);
    if better {
        report.recommendations.push(format!(
            "replayed on this trace and device, the recommended policy made {measured}"
        ));
    } else {
        let considered = report.recommendations.join("; ");
        report.recommendations = vec![format!(
            "no change: replayed on this trace and device, the changes considered ({considered}) made {measured}"
        )];
        report.recommended_policy = used.clone();
        report.recommends_change = false;
    }
}
