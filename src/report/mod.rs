//! The tuning report written after a run: what the workload did, what the engine decided and
//! why, what it saved against passthrough, and a recommended policy in the same TOML schema the
//! policy files use (feed it back with `ADAPTALLOC_POLICY`). Data (serde: TOML, JSON) plus a
//! view (Display: Markdown, also fine in a terminal).

mod advice;
pub use advice::within_margin;

use std::fmt;

use serde::Serialize;

use crate::device::CostModel;
use crate::policy::{ClassSummary, Decision, Policy, RouteChange, TimelinePoint};
use crate::size::ByteSize;
use crate::stats::{Stats, StrategyStats};
use crate::strategy::StrategyKind;

/// Driver calls and time, against what passthrough would have done for the same requests.
#[non_exhaustive]
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DriverSummary {
    /// Physical allocations: cuMemAlloc, and cuMemCreate once per handle.
    pub driver_allocs: u64,
    /// Physical frees: cuMemFree, and cuMemRelease once per handle.
    pub driver_frees: u64,
    /// Every driver call charged, of every kind (the sum of `by_kind`'s calls: maps, unmaps,
    /// access grants, synchronizations and memory queries included).
    pub driver_calls: u64,
    /// Passthrough's calls for the same requests: a cuMemAlloc per request, and a cuMemFree
    /// and the device synchronization it implies per free.
    pub passthrough_calls: u64,
    /// Our driver calls as a fraction of passthrough's.
    pub calls_ratio: f64,
    /// Time in the driver: modelled on SimDevice, measured on a GPU.
    pub driver_ns: u64,
    /// Passthrough's driver time for the same requests, modelled with the default cost model
    /// from each class's mean size.
    pub passthrough_modeled_ns: u64,
    /// Passthrough's modelled time less ours (negative when ours took longer).
    pub saved_ns: i64,
    /// Driver calls and time by kind of operation (the kinds with calls), dearest first.
    pub by_kind: Vec<KindTime>,
}

/// Calls and time of one kind of driver operation (a key of the cost model).
#[non_exhaustive]
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct KindTime {
    /// The kind, a key of the cost model (`alloc`, `create`, ...).
    pub kind: &'static str,
    /// Calls of the kind.
    pub calls: u64,
    /// Their time, ns.
    pub ns: u64,
}

/// The kinds of `ops` with calls, dearest first (then by name).
pub fn by_kind(ops: &crate::device::DriverOps) -> Vec<KindTime> {
    let mut v: Vec<KindTime> = ops
        .kinds()
        .into_iter()
        .filter(|(_, t)| t.calls > 0)
        .map(|(kind, t)| KindTime {
            kind,
            calls: t.calls,
            ns: t.ns,
        })
        .collect();
    v.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.kind.cmp(b.kind)));
    v
}

/// `by_kind` as one line: "create 12.3 ms (64), set_access 2.3 ms (64)", the first `n` kinds.
pub fn by_kind_line(kinds: &[KindTime], n: usize) -> String {
    let parts: Vec<String> = kinds
        .iter()
        .take(n)
        .map(|k| format!("{} {:.1} ms ({})", k.kind, k.ns as f64 / 1e6, k.calls))
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// Memory at its peaks.
#[non_exhaustive]
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MemorySummary {
    /// The most bytes live at once.
    pub peak_live_bytes: u64,
    /// The most bytes held from the device at once.
    pub peak_reserved_bytes: u64,
    /// Peak reserved over peak live.
    pub reserved_over_live: f64,
    /// The most bytes held and not live at once.
    pub peak_idle_bytes: u64,
    /// The free memory the policy keeps for others, on this device.
    pub headroom_bytes: u64,
    /// Passthrough's footprint of the live blocks at its highest: the workload's peak as plain
    /// cudaMalloc would hold it, which `bounds.expected_peak` gives a later run.
    pub peak_footprint_bytes: u64,
    /// The peak the policy gave (`bounds.expected_peak`), if any: under `peak_footprint_bytes`,
    /// the run outgrew it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_peak_bytes: Option<u64>,
}

impl MemorySummary {
    /// The peak the policy gave, where the run's footprint passed it: the workload outgrew it.
    pub fn outgrown_peak(&self) -> Option<u64> {
        self.expected_peak_bytes.filter(|&e| self.peak_footprint_bytes > e)
    }
}

/// Hits and misses of one strategy.
#[non_exhaustive]
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HitRate {
    /// The strategy.
    pub strategy: StrategyKind,
    /// Requests served without a driver call.
    pub hits: u64,
    /// Requests that made driver calls.
    pub misses: u64,
    /// Hits over requests.
    pub hit_rate: f64,
}

/// Everything a run taught, and what to do next time.
#[non_exhaustive]
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TuningReport {
    /// The device, by name.
    pub device: String,
    /// Its memory in all.
    pub device_total_bytes: u64,
    /// The policy used (its description).
    pub policy: String,
    /// Allocations and frees in all.
    pub operations: u64,
    /// Allocations.
    pub requests: u64,
    /// Frees.
    pub frees: u64,
    /// Allocations refused.
    pub failed_allocs: u64,
    /// Out-of-memory errors recovered from by releasing idle memory and retrying.
    pub oom_recoveries: u64,
    /// Times free memory fell under the low watermark.
    pub pressure_events: u64,
    /// Slab placements the strand guard refused (each served by an exact-size block instead).
    pub strand_refusals: u64,
    /// The most memory live blocks in slabs held beyond their driver footprint, at a sample.
    pub peak_stranded_bytes: u64,
    /// Idle memory given back because of the policy's bounds: by the engine at its samples, and
    /// by the cache and the slabs on frees (idle over the bound the engine set at its last sample).
    pub bytes_released_by_bounds: u64,
    /// Samples of the device's free memory.
    pub mem_info_samples: u64,
    /// Driver calls and time.
    pub driver: DriverSummary,
    /// Memory at its peaks.
    pub memory: MemorySummary,
    /// Hits and misses per strategy.
    pub hit_rates: Vec<HitRate>,
    /// Size histogram and per-class behaviour: one entry per power-of-two class.
    pub classes: Vec<ClassSummary>,
    /// Size classes changing route, and why.
    pub route_changes: Vec<RouteChange>,
    /// Memory given back, and why.
    pub decisions: Vec<Decision>,
    /// Memory over the run.
    pub timeline: Vec<TimelinePoint>,
    /// Why the recommended policy differs from the one used.
    pub recommendations: Vec<String>,
    /// Whether the recommended policy differs from the one used.
    pub recommends_change: bool,
    /// The recommended policy, in the policy schema (the one used when no change is recommended).
    pub recommended_policy: Policy,
}

/// What the allocator hands the report builder.
pub(crate) struct ReportInput<'a> {
    pub device: String,
    pub device_total: u64,
    pub device_driver_ns: u64,
    pub device_ops: crate::device::DriverOps,
    pub policy: &'a Policy,
    pub stats: &'a Stats,
    pub operations: u64,
    pub headroom: u64,
    pub peak_footprint: u64,
    pub pressure_events: u64,
    pub peak_stranded: u64,
    pub released_by_bounds: u64,
    pub mem_info_samples: u64,
    pub classes: Vec<ClassSummary>,
    pub route_changes: Vec<RouteChange>,
    pub decisions: Vec<Decision>,
    pub timeline: Vec<TimelinePoint>,
}

impl TuningReport {
    pub(crate) fn build(input: ReportInput<'_>) -> Self {
        let st = input.stats;
        let requests: u64 = input.classes.iter().map(|c| c.requests).sum();
        let frees: u64 = input.classes.iter().map(|c| c.frees).sum();
        let cost = CostModel::default();
        let passthrough_ns: u64 = input
            .classes
            .iter()
            .map(|c| {
                let mean = c.bytes / c.requests.max(1);
                c.requests * cost.alloc_ns(mean) + c.frees * cost.free_ns(mean)
            })
            .sum();
        let passthrough_calls = requests + 2 * frees;
        let calls = input.device_ops.calls();
        let driver = DriverSummary {
            driver_allocs: input.device_ops.physical_allocs(),
            driver_frees: input.device_ops.physical_frees(),
            driver_calls: calls,
            passthrough_calls,
            calls_ratio: calls as f64 / passthrough_calls.max(1) as f64,
            driver_ns: input.device_driver_ns,
            passthrough_modeled_ns: passthrough_ns,
            saved_ns: passthrough_ns as i64 - input.device_driver_ns as i64,
            by_kind: by_kind(&input.device_ops),
        };
        let memory = MemorySummary {
            // Whole-run peaks: peak resets between steps (reset_peak_stats) leave them.
            peak_live_bytes: st.live_bytes.whole_run_peak(),
            peak_reserved_bytes: st.reserved_bytes.whole_run_peak(),
            reserved_over_live: st.reserved_bytes.whole_run_peak() as f64
                / st.live_bytes.whole_run_peak().max(1) as f64,
            peak_idle_bytes: st.idle_bytes.whole_run_peak(),
            headroom_bytes: input.headroom,
            peak_footprint_bytes: input.peak_footprint,
            expected_peak_bytes: input.policy.bounds.expected_peak.map(|b| b.0),
        };
        let hit_rates = st
            .per_strategy
            .iter()
            .map(|&(strategy, StrategyStats { hits, misses })| HitRate {
                strategy,
                hits,
                misses,
                hit_rate: hits as f64 / (hits + misses).max(1) as f64,
            })
            .collect();
        let mut report = TuningReport {
            device: input.device,
            device_total_bytes: input.device_total,
            policy: input.policy.description.clone(),
            operations: input.operations,
            requests,
            frees,
            failed_allocs: st.failed_allocs,
            oom_recoveries: st.oom_recoveries,
            pressure_events: input.pressure_events,
            strand_refusals: st.strand_refusals,
            peak_stranded_bytes: input.peak_stranded.max(st.stranded_bytes),
            bytes_released_by_bounds: input.released_by_bounds,
            mem_info_samples: input.mem_info_samples,
            driver,
            memory,
            hit_rates,
            classes: input.classes,
            route_changes: input.route_changes,
            decisions: input.decisions,
            timeline: input.timeline,
            recommendations: Vec::new(),
            recommends_change: false,
            recommended_policy: input.policy.clone(),
        };
        report.recommend();
        report
    }

    /// The report as pretty-printed JSON (feature `json`).
    #[cfg(feature = "json")]
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }

    /// The report as TOML.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string_pretty(self)
    }

    /// Writes the report to `path`, as TOML, JSON or Markdown by its extension (.toml, .json,
    /// .md or .markdown; any other is an error that names the path, so that `report.pdf` is not
    /// silently Markdown). JSON needs the crate's `json` feature (the command line and the C ABI
    /// have it); without it a .json path is an error that says so.
    pub fn write_to(&self, path: &std::path::Path) -> std::io::Result<()> {
        let text = match path.extension().and_then(|e| e.to_str()) {
            #[cfg(feature = "json")]
            Some("json") => self.to_json(),
            #[cfg(not(feature = "json"))]
            Some("json") => {
                return Err(std::io::Error::other(format!(
                    "{}: JSON reports need adaptalloc's `json` feature; enable it, or write .toml or .md",
                    path.display()
                )));
            }
            Some("toml") => self.to_toml().map_err(std::io::Error::other)?,
            Some("md" | "markdown") => self.to_string(),
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "{}: a tuning report is written as .md, .toml or .json; name the file with one of them",
                        path.display()
                    ),
                ));
            }
        };
        std::fs::write(path, text)
    }
}

/// Where device `device`'s report goes when `ADAPTALLOC_REPORT` names `path`: `path` itself for
/// device 0, and the device's number put before the extension for the others
/// (`rep.md` -> `rep.1.md`, `out/r.json` -> `out/r.2.json`), so that every report keeps the
/// extension that says its format. A path with no extension gets `.N` at its end.
pub fn report_path_for_device(path: &std::path::Path, device: i32) -> std::path::PathBuf {
    if device == 0 {
        return path.to_path_buf();
    }
    match (path.file_stem(), path.extension()) {
        (Some(stem), Some(ext)) => {
            let mut name = stem.to_os_string();
            name.push(format!(".{device}."));
            name.push(ext);
            path.with_file_name(name)
        }
        _ => {
            let mut name = path.as_os_str().to_os_string();
            name.push(format!(".{device}"));
            name.into()
        }
    }
}

fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

impl fmt::Display for TuningReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.driver;
        let m = &self.memory;
        writeln!(f, "# adaptalloc tuning report\n")?;
        writeln!(
            f,
            "Device: {} ({}). Policy: {}.\n",
            self.device,
            ByteSize(self.device_total_bytes),
            self.policy
        )?;
        writeln!(f, "## Summary\n")?;
        writeln!(f, "| | |\n|---|---|")?;
        writeln!(f, "| requests / frees | {} / {} |", self.requests, self.frees)?;
        writeln!(
            f,
            "| driver calls | {} ({} physical allocations, {} physical frees) = {:.1}% of passthrough's {} |",
            d.driver_calls,
            d.driver_allocs,
            d.driver_frees,
            d.calls_ratio * 100.0,
            d.passthrough_calls
        )?;
        let saved = if d.saved_ns >= 0 {
            format!("saved {}", ms(d.saved_ns as u64))
        } else {
            format!("lost {}", ms(d.saved_ns.unsigned_abs()))
        };
        writeln!(
            f,
            "| driver time | {} (passthrough, modelled: {}; {saved}) |",
            ms(d.driver_ns),
            ms(d.passthrough_modeled_ns),
        )?;
        writeln!(f, "| driver time by kind | {} |", by_kind_line(&d.by_kind, usize::MAX))?;
        writeln!(
            f,
            "| peak live / reserved | {} / {} ({:.2}x) |",
            ByteSize(m.peak_live_bytes),
            ByteSize(m.peak_reserved_bytes),
            m.reserved_over_live
        )?;
        let given = match (m.outgrown_peak(), m.expected_peak_bytes) {
            (Some(e), _) => format!(" (past the {} the policy gave)", ByteSize(e)),
            (None, Some(e)) => format!(" (the policy gave {})", ByteSize(e)),
            (None, None) => String::new(),
        };
        writeln!(
            f,
            "| peak footprint (what cudaMalloc would hold; bounds.expected_peak) | {}{given} |",
            ByteSize(m.peak_footprint_bytes)
        )?;
        writeln!(
            f,
            "| peak idle, headroom | {}, {} |",
            ByteSize(m.peak_idle_bytes),
            ByteSize(m.headroom_bytes)
        )?;
        writeln!(
            f,
            "| failed / recovered OOM / pressure events | {} / {} / {} |",
            self.failed_allocs, self.oom_recoveries, self.pressure_events
        )?;
        writeln!(
            f,
            "| idle memory released by bounds | {} |",
            ByteSize(self.bytes_released_by_bounds)
        )?;
        writeln!(
            f,
            "| strand guard | {} requests given exact-size blocks; at most {} stranded |",
            self.strand_refusals,
            ByteSize(self.peak_stranded_bytes)
        )?;
        for h in self.hit_rates.iter().filter(|h| h.hits + h.misses > 0) {
            writeln!(
                f,
                "| {} hit rate | {:.1}% ({} hits, {} misses) |",
                h.strategy,
                h.hit_rate * 100.0,
                h.hits,
                h.misses
            )?;
        }
        writeln!(f, "\n## Size classes\n")?;
        writeln!(
            f,
            "| class | route | requests | bytes | peak live | reuse | sizes | lifetime p50/p90 (ops) |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|---|")?;
        for c in &self.classes {
            let life = c
                .lifetime_ops_p50_p90_p99
                .map(|q| format!("{:.0} / {:.0}", q[0], q[1]))
                .unwrap_or("-".into());
            let sizes = if c.distinct_sizes > 4 {
                ">4".to_string()
            } else {
                c.distinct_sizes.to_string()
            };
            writeln!(
                f,
                "| {} | {} | {} | {} | {} | {:.0}% | {} | {} |",
                c.class,
                c.route,
                c.requests,
                ByteSize(c.bytes),
                ByteSize(c.peak_live_bytes),
                c.reuse_ratio * 100.0,
                sizes,
                life
            )?;
        }
        if !self.route_changes.is_empty() {
            writeln!(f, "\n## Route changes\n")?;
            for r in self.route_changes.iter().take(50) {
                writeln!(f, "- op {}: {} {} -> {}: {}", r.op, r.class, r.from, r.to, r.reason)?;
            }
            if self.route_changes.len() > 50 {
                writeln!(f, "- ... {} more", self.route_changes.len() - 50)?;
            }
        }
        let (released, backing): (Vec<&Decision>, Vec<&Decision>) =
            self.decisions.iter().partition(|d| d.action == "release");
        if !released.is_empty() {
            writeln!(f, "\n## Memory given back\n")?;
            for dcs in released.iter().take(20) {
                writeln!(
                    f,
                    "- op {}: {} {}: {}",
                    dcs.op,
                    dcs.action,
                    ByteSize(dcs.bytes),
                    dcs.reason
                )?;
            }
            if released.len() > 20 {
                writeln!(f, "- ... {} more", released.len() - 20)?;
            }
        }
        if !backing.is_empty() {
            writeln!(f, "\n## Slab backing\n")?;
            for dcs in backing {
                writeln!(f, "- op {}: {}: {}", dcs.op, dcs.action, dcs.reason)?;
            }
        }
        writeln!(f, "\n## Recommendation\n")?;
        for r in &self.recommendations {
            writeln!(f, "- {r}")?;
        }
        if self.recommends_change {
            writeln!(
                f,
                "\nTo apply it, save the TOML below as a file and run with `ADAPTALLOC_POLICY=FILE` (or \
                 `adaptalloc replay TRACE --policy FILE` to see what it does on a recorded workload)."
            )?;
        }
        writeln!(f, "\n```toml\n{}```", self.recommended_policy.to_toml())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::report_path_for_device;

    #[test]
    fn each_device_gets_a_report_of_its_own_that_keeps_the_extension() {
        let p = |s: &str, d| report_path_for_device(Path::new(s), d);
        assert_eq!(p("rep.md", 0), Path::new("rep.md"));
        assert_eq!(p("rep.md", 1), Path::new("rep.1.md"));
        assert_eq!(p("out/r.json", 12), Path::new("out/r.12.json"));
        assert_eq!(p("a.b/rep.toml", 2), Path::new("a.b/rep.2.toml"));
        assert_eq!(p("rep", 3), Path::new("rep.3"));
    }
}
