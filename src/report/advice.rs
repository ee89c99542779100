//! The tuning report's advice: the policy it recommends after a run, each change with why, and
//! the alternatives a replay should weigh beside it (`adaptalloc replay` keeps whichever holds
//! best over ten passes).

use crate::policy::{Policy, Segregate};
use crate::size::ByteSize;
use crate::strategy::{SlabBacking, StrategyKind};

use super::TuningReport;

impl TuningReport {
    /// Derives the recommended policy from what happened. Each change says why.
    pub(super) fn recommend(&mut self) {
        let (tight, short, description) = (self.ran_short(), self.ran_short_text(), self.recommended_description());
        let within_margin = self.within_margin();
        let page_creates = self.handle_creates();
        let footprint = self.memory.peak_footprint_bytes;
        let outgrown = self.memory.outgrown_peak().map(ByteSize);
        let never_short = self.never_short_text();
        let p = &mut self.recommended_policy;
        let mut why = Vec::new();
        // Only keys that take effect under the policy's mode: slab settings where slabs are
        // used, idle bounds where memory is kept, routing where routes are chosen.
        let fixed = p.routing.mode.fixed();
        let slabs = uses_slabs(p);
        let keeps_idle = fixed != Some(StrategyKind::Passthrough);
        if tight && slabs {
            if p.suballoc.segregate != Segregate::Always {
                p.suballoc.segregate = Segregate::Always;
                why.push(format!(
                    "{short}: segregate slabs by size so freed holes fit the next request of their class"
                ));
            }
            if p.suballoc.loose_growth > p.suballoc.growth {
                p.suballoc.loose_growth = p.suballoc.growth;
                why.push("memory ran short: grow slabs slowly even while there is room".into());
            }
        } else if !tight
            && keeps_idle
            && self.driver.calls_ratio > 0.10
            && self.bytes_released_by_bounds > 0
            && let Some(share) = larger_spare_share(p.bounds.spare_share)
        {
            // Idle memory was given back and then asked for again: keep more of it.
            let used = p.bounds.spare_share;
            p.bounds.spare_share = share;
            p.bounds.idle_age_ops = p.bounds.idle_age_ops.saturating_mul(4).max(100_000);
            why.push(format!(
                "{:.0}% of passthrough's driver calls while {} of idle memory was released by bounds: keep more of it idle (bounds.spare_share = {share}, was {used}: half of what was left to other processes beyond the peak) and age it out 4x later",
                self.driver.calls_ratio * 100.0,
                ByteSize(self.bytes_released_by_bounds),
            ));
        }
        // The guard paid a driver call per refusal for a peak that never came: the workload
        // used at most half the device. Forecast its peak as the peak it has shown.
        let roomy = self.memory.peak_reserved_bytes.saturating_mul(2) <= self.device_total_bytes;
        if !tight && roomy && fixed.is_none() && self.strand_refusals > 0 && p.bounds.peak_growth > 1.0 {
            p.bounds.peak_growth = 1.0;
            why.push(format!(
                "the strand guard gave {} requests exact-size blocks (a driver call each) while peak reserved stayed at {} of {}: take the peak so far as the peak (bounds.peak_growth = 1)",
                self.strand_refusals,
                ByteSize(self.memory.peak_reserved_bytes),
                ByteSize(self.device_total_bytes)
            ));
        }
        // Slabs mapped in physical handles on a device the run never came close to filling: each
        // handle cost the driver a create and a map where one allocation backs a whole slab, and
        // the fine-grained release handles buy was not needed.
        if !tight && slabs && page_creates > 0 && matches!(p.suballoc.backing, SlabBacking::Pages | SlabBacking::Auto) {
            let (peak, total) = (
                ByteSize(self.memory.peak_reserved_bytes),
                ByteSize(self.device_total_bytes),
            );
            if roomy {
                p.suballoc.backing = SlabBacking::Whole;
                why.push(format!(
                    "{page_creates} physical handles were created for slabs while peak reserved stayed at {peak} of \
                     {total}: back slabs whole (suballoc.backing = \"whole\"), one driver allocation per slab"
                ));
            } else if within_margin && fixed.is_none() && footprint > 0 {
                // Memory never ran short, but the run came near enough to filling the device
                // that a whole slab could strand a request while the peak was unknown: the peak
                // this run showed, given from the first request, and (where slabs were in pages)
                // one handle a slab. Replayed over ten passes at 1.5x and 2x peak
                // live, that held best on 11 and 14 of the 17 workloads where handles shaped to
                // blocks (the advice before, now replayed beside it) held best on 2 and 1. Not
                // within a tenth of the device's capacity: there a handle larger than a page
                // can strand the next request where pages would not.
                let given = ByteSize(footprint);
                p.bounds.expected_peak = Some(given);
                let backing = if p.suballoc.backing == SlabBacking::Pages {
                    p.suballoc.backing = SlabBacking::Auto;
                    " and back each slab by one handle, split into pages out of memory (suballoc.backing = \"auto\")"
                } else {
                    ""
                };
                why.push(format!(
                    "{page_creates} physical handles were created for slabs while the peak was unknown, and \
                     {never_short}: {}{backing} (a later run whose peak passes it learns as without it)",
                    give_text(given)
                ));
            } else if p.suballoc.backing == SlabBacking::Pages && within_margin {
                // The same for a fixed suballocation policy, which has no engine to give a peak
                // to: handles shaped to blocks, a create per block instead of per page, each
                // given back whole (robustness grid: most of blocks' failing runs are at
                // passthrough's exact minimum to 1.02x it).
                p.suballoc.backing = SlabBacking::Blocks;
                why.push(format!(
                    "{page_creates} physical handles of a page each were created for slabs, and memory never ran short \
                     (peak reserved {peak} of {total}): shape handles to blocks (suballoc.backing = \"blocks\"), one \
                     handle for each block's whole pages (a run that fills the device to its last tenth may fail \
                     with them where pages would not)"
                ));
            }
        }
        // What slabs may strand: the guard's share guards a peak not yet seen, and this run saw
        // its peak with room (memory never ran short, peak reserved within nine tenths of the
        // device). Where the share cost driver calls (refusals, each an exact-size block) or
        // decides whether idle handles are pinned or made again (under `blocks`, where the
        // policy used has it), let slabs strand twice the share.
        let share = p.bounds.strand_share;
        if !tight
            && fixed.is_none()
            && (self.strand_refusals > 0 || p.suballoc.backing == SlabBacking::Blocks)
            && within_margin
            && let Some(doubled) = doubled_share(share)
        {
            p.bounds.strand_share = doubled;
            let cost = if self.strand_refusals > 0 {
                format!(
                    "the strand guard gave {} requests exact-size blocks (a driver call each)",
                    self.strand_refusals
                )
            } else {
                "under handles shaped to blocks the share decides whether an idle handle is pinned or made again".into()
            };
            why.push(format!(
                "{never_short} and {cost}: let slabs strand twice the share of the memory expected free at the peak \
                 (bounds.strand_share = {doubled}, was {share})"
            ));
        }
        // A peak given short: the workload outgrew it, and the engine learned past it. Under
        // `auto` the handles taken for the memory the given peak left free beyond it stay, and
        // near the capacity they can strand a request plain cudaMalloc completes: with `auto`
        // and a quarter under each workload's peak given, 6 of the 17 workloads failed at
        // passthrough's exact minimum (`training` 157 requests) and 4 at 1.05x it, none with a
        // tenth under (`scripts/short-peak.sh`).
        // (Unless a rule above already gave the run's peak.)
        if fixed.is_none()
            && let Some(short) = outgrown.filter(|&e| p.bounds.expected_peak == Some(e))
        {
            let given = ByteSize(footprint);
            p.bounds.expected_peak = Some(given);
            why.push(format!(
                "the workload's footprint reached {given}, past the {short} the policy gave: {} (a peak \
                 given short lets slabs backed \"auto\" take large handles for memory the workload then needs)",
                give_text(given)
            ));
        }
        if fixed.is_none() && self.route_changes.len() as u64 > 4 * self.classes.len().max(1) as u64 {
            p.routing.hysteresis = p.routing.hysteresis.saturating_mul(2).max(2);
            why.push(format!(
                "{} route changes over {} classes: double the hysteresis to stop routes flapping",
                self.route_changes.len(),
                self.classes.len()
            ));
        }
        if self.memory.reserved_over_live > 1.5 && !tight && slabs {
            p.suballoc.loose_growth = (p.suballoc.loose_growth / 2.0).max(0.125);
            p.suballoc.growth = p.suballoc.growth.min(p.suballoc.loose_growth);
            why.push(format!(
                "peak reserved is {:.2}x peak live: halve slab growth to {} for less waste",
                self.memory.reserved_over_live, p.suballoc.loose_growth
            ));
        }
        self.recommends_change = !why.is_empty();
        if why.is_empty() {
            why.push("the policy used fits this workload: no change".into());
        }
        p.description = description;
        self.recommendations = why;
    }

    /// For the report of a live run (the allocator's own, written at exit: `ADAPTALLOC_REPORT`),
    /// which has no trace to replay its advice on, as `adaptalloc replay` does: says so beside
    /// a recommended change, and how to check it. The advice bets that the next run is this
    /// one: its larger handles fail a larger workload near the capacity where cudaMalloc would
    /// not (given a peak a quarter short under `auto`, 6 of 17 workloads at passthrough's
    /// minimum, `scripts/short-peak.sh`; whole slabs as the default, 73 / 102 / 351 runs of the
    /// robustness grid against 7 / 3 / 4).
    pub fn note_not_replayed(&mut self) {
        if self.recommends_change {
            self.recommendations.push(
                "not replayed: a live run has no trace to check this advice on, and the advice bets \
                 that the next run's workload is this one (a larger one can fail near the device's \
                 capacity under it); to check it, record the workload (a PyTorch memory snapshot, an \
                 RMM log) and run `adaptalloc replay TRACE --capacity SIZE --report FILE`, which \
                 replays the advice and keeps what holds"
                    .into(),
            );
        }
    }

    /// Other changes worth replaying beside the recommended policy, each with why: a remedy
    /// whose effect depends on the workload more than the report can tell, for a replay to
    /// judge (`adaptalloc replay` keeps whichever candidate its replay shows best). Where memory
    /// ran short with slabs in use: slabs grown by all that is held (`suballoc.growth` and
    /// `loose_growth` 1), fewer and larger slabs, so that free memory is split across fewer slab
    /// boundaries and idle pages move between slabs less. Segregated slabs (the recommendation)
    /// suit a workload whose freed holes the next request of their class fits; larger slabs one
    /// whose pages moved between slabs every step: at 1.1x passthrough's minimum, replay over ten
    /// passes favoured larger slabs on `phase-change` (7.1 -> 0.03 ms a pass),
    /// `cpu-resnet18-train` (4.7 -> 0.03) and `gpu-medium-ctx256-infer` (65 -> 19), and
    /// segregated ones on `gpu-medium-ctx1024-infer` (222 -> 32).
    ///
    /// Wherever the run completed under adaptive routing and the recommendation does not give
    /// the peak already, the peak the run showed, given from the first request
    /// (`bounds.expected_peak`) with the backing as it was: a first run takes the peak as
    /// `bounds.peak_growth` times the peak so far until a cycle comes back to it, and pays for
    /// that margin in the strand guard's exact-size blocks (`small-churn` at 1.5x peak live:
    /// 1518 -> 2.2 ms over ten passes). Where memory never ran short, peak reserved stayed within
    /// nine tenths of the device and slabs were in page handles, also backed by handles the
    /// memory free beyond the peak covers (`suballoc.backing = "auto"`): beside whole slabs, or
    /// in place of the recommendation's own, handles shaped to blocks (with twice the strand
    /// guard's share, the advice before), replayed beside it.
    pub fn alternatives(&self, used: &Policy) -> Vec<(Policy, String)> {
        let mut out = Vec::new();
        let creates = self.handle_creates();
        let roomy = !self.ran_short()
            && self.within_margin()
            && matches!(used.suballoc.backing, SlabBacking::Pages | SlabBacking::Auto)
            && creates > 0;
        let gives = self.recommended_policy.bounds.expected_peak.is_some();
        if self.failed_allocs == 0
            && used.routing.mode.fixed().is_none()
            && used.bounds.expected_peak.is_none()
            && self.memory.peak_footprint_bytes > 0
            && !gives
        {
            let mut p = used.clone();
            // The footprint exactly: rounded up to a MiB it read better, but passed the device
            // at passthrough's exact minimum (`cpu-mobilenetv2-train`: 212 MiB on 211.08), where
            // a policy giving it is refused.
            let given = ByteSize(self.memory.peak_footprint_bytes);
            p.bounds.expected_peak = Some(given);
            p.description = self.recommended_description();
            let why = if roomy {
                p.suballoc.backing = SlabBacking::Auto;
                format!(
                    "{} and {creates} physical handles were created for slabs: {} and back slabs by handles the \
                     memory free beyond it covers (suballoc.backing = \"auto\")",
                    self.never_short_text(),
                    give_text(given)
                )
            } else {
                format!(
                    "{}, where a first run takes it as a margin over the peak so far until it comes back",
                    give_text(given)
                )
            };
            out.push((p, why));
        }
        if gives && roomy {
            let mut p = used.clone();
            p.suballoc.backing = SlabBacking::Blocks;
            if let Some(doubled) = doubled_share(p.bounds.strand_share) {
                p.bounds.strand_share = doubled;
            }
            p.description = self.recommended_description();
            out.push((
                p,
                format!(
                    "{}: shape handles to blocks (suballoc.backing = \"blocks\"), one handle for each block's whole \
                     pages, and let slabs strand twice the share of the memory expected free at the peak \
                     (bounds.strand_share)",
                    self.never_short_text()
                ),
            ));
        }
        if self.ran_short() && uses_slabs(used) && (used.suballoc.growth < 1.0 || used.suballoc.loose_growth < 1.0) {
            let mut p = used.clone();
            p.suballoc.growth = p.suballoc.growth.max(1.0);
            p.suballoc.loose_growth = p.suballoc.loose_growth.max(1.0);
            p.description = self.recommended_description();
            out.push((
                p,
                format!(
                    "{}: grow slabs by all they hold (suballoc.growth = 1), fewer and larger slabs, so that free \
                     memory is split across fewer slab boundaries",
                    self.ran_short_text()
                ),
            ));
        }
        out
    }

    /// "memory never ran short (peak reserved X of Y)", where the advice for a roomy run begins.
    fn never_short_text(&self) -> String {
        format!(
            "memory never ran short (peak reserved {} of {})",
            ByteSize(self.memory.peak_reserved_bytes),
            ByteSize(self.device_total_bytes)
        )
    }

    /// Physical handles created (cuMemCreate calls): slabs backed in handles.
    fn handle_creates(&self) -> u64 {
        self.driver
            .by_kind
            .iter()
            .find(|k| k.kind == "create")
            .map_or(0, |k| k.calls)
    }

    /// The workload's peak stayed out of the device's last tenth: its peak footprint (what
    /// plain cudaMalloc would hold, not what this run kept idle besides) within nine tenths of
    /// the device.
    fn within_margin(&self) -> bool {
        within_margin(self.memory.peak_footprint_bytes, self.device_total_bytes)
    }

    /// Memory ran short in the run: a request failed, an out-of-memory was recovered, or free
    /// memory fell under the low watermark.
    pub fn ran_short(&self) -> bool {
        self.ran_out() || self.pressure_events > 0
    }

    /// Memory ran out in the run: a request failed, or was served only after idle memory was
    /// given back (an out-of-memory recovered). What a workload profile withholds the peak for
    /// (`crate::profile`); unlike [`ran_short`](Self::ran_short), free memory under the low
    /// watermark alone does not count: what the policy keeps idle takes it there on a device the
    /// workload fills to two thirds (`small-churn` at 1.5x peak live, 20 MiB, three pressure
    /// events), and withheld for that its second run cost what its first did (1513 ms of
    /// warm-up against 2.0 given the peak). An out-of-memory recovered does count: given the peak
    /// after one, `gpu-medium-ctx128-infer` at 2x peak live paid 11.3 ms a pass in steady state
    /// where its first run paid none (whole slabs and its cached blocks over the share cap).
    pub fn ran_out(&self) -> bool {
        self.failed_allocs > 0 || self.oom_recoveries > 0
    }

    /// "memory ran short (...)" with the run's counts, as the reasons that follow from it begin.
    fn ran_short_text(&self) -> String {
        format!(
            "memory ran short ({} failed, {} recovered out-of-memory, {} pressure events)",
            self.failed_allocs, self.oom_recoveries, self.pressure_events
        )
    }

    /// The description a policy recommended from this run carries.
    fn recommended_description(&self) -> String {
        format!("recommended by adaptalloc for this workload; based on: {}", self.policy)
    }
}

/// Whether a workload's peak `footprint` stays out of the last tenth of a device of `total`
/// bytes: where handles larger than a page may back memory for a peak given from the first
/// request (the advice's rule, and a workload profile's). Nearer the capacity such a handle
/// can strand the next request where pages would not. The footprint, not what a run held: a
/// run's idle memory is the policy's choice, and counted it kept the peak from workloads that
/// need no more than two thirds of the device (`cpu-resnet18-train` at 1.5x peak live held
/// 90.1% of it).
pub fn within_margin(footprint: u64, total: u64) -> bool {
    footprint <= total / 10 * 9
}

/// "give the peak this run showed from the first request (bounds.expected_peak = ...)".
fn give_text(peak: ByteSize) -> String {
    format!(
        "give the peak this run showed from the first request (bounds.expected_peak = {})",
        toml_size(peak)
    )
}

/// A size as a policy file holds it: `"512MiB"` where a unit names it exactly, else the bytes.
fn toml_size(size: ByteSize) -> String {
    size.named_exactly()
        .map_or_else(|| size.0.to_string(), |named| format!("\"{named}\""))
}

/// Whether `policy`'s slab settings take effect: slabs serve some requests under its mode.
fn uses_slabs(policy: &Policy) -> bool {
    policy.routing.mode.fixed().is_none_or(|k| k == StrategyKind::Suballoc)
}

/// Twice a `bounds.strand_share` (at most all of the memory expected free at the peak); None for
/// a share of 0 (never strand) or one already at all of it.
fn doubled_share(share: f64) -> Option<f64> {
    (share > 0.0 && share < 1.0).then(|| (share * 2.0).min(1.0))
}

/// A `bounds.spare_share` that keeps more idle memory than `used`: half of what `used` left to
/// other processes beyond the workload's peak, rounded to hundredths; None when nothing is left.
fn larger_spare_share(used: f64) -> Option<f64> {
    (used < 1.0).then(|| ((used + 1.0) * 50.0).round() / 100.0)
}

#[cfg(test)]
mod tests {
    use super::{doubled_share, larger_spare_share, toml_size};
    use crate::size::{ByteSize, GIB, MIB};

    #[test]
    fn a_given_peak_is_written_as_a_policy_file_reads_it() {
        assert_eq!(toml_size(ByteSize(18 * GIB)), "\"18GiB\"");
        assert_eq!(toml_size(ByteSize(18 * GIB + 1)), "19327352833");
        assert_eq!(toml_size(ByteSize(1536 * MIB)), "\"1.50GiB\"");
        // 7000 MiB shows as "6.84GiB", which reads back as another size: the bytes instead.
        assert_eq!(toml_size(ByteSize(7000 * MIB)), "7340032000");
    }

    #[test]
    fn a_doubled_strand_share_stops_at_all_and_leaves_0_alone() {
        assert_eq!(doubled_share(0.25), Some(0.5));
        assert_eq!(doubled_share(0.75), Some(1.0));
        assert_eq!(doubled_share(0.0), None, "0 never strands");
        assert_eq!(doubled_share(1.0), None, "already all of it");
    }

    #[test]
    fn a_larger_spare_share_halves_what_was_left_to_others() {
        assert_eq!(larger_spare_share(0.0), Some(0.5));
        assert_eq!(larger_spare_share(0.5), Some(0.75));
        assert_eq!(larger_spare_share(0.75), Some(0.88));
        assert_eq!(larger_spare_share(0.99), Some(1.0));
        assert_eq!(larger_spare_share(1.0), None, "nothing left to give");
    }
}
