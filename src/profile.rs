//! Workload profiles: what earlier runs of a workload showed on a device (its peak footprint),
//! kept in a small TOML file that the next run of the same workload reads.
//!
//! A first run learns its peak as it goes: until its footprint comes back to the peak, the
//! engine cannot tell a device it will fill from one it will not, so it backs slabs with 2 MiB
//! pages (a driver create, map and access grant each), and its first pass costs many times
//! PyTorch's allocator's. A later run given that peak (`bounds.expected_peak`) backs slabs
//! with handles sized to the memory free beyond it (`suballoc.backing = "auto"`) from its first
//! request. `ADAPTALLOC_PROFILE=FILE` does that hand-over by itself: each run reads the peak
//! from the file, if there is one, and writes back the larger of it and its own when it ends.
//!
//! A profile is a bet that the next run is the same workload. A run that passes the profile's
//! peak warns and learns as without it, and the file then carries the new peak; the large
//! handles taken before it passed stay, but out of memory splits those live blocks hold in part
//! (a peak given at half, three quarters or nine tenths of the real one failed no request of
//! 17 workloads from 1 to 1.2x passthrough's smallest device: `scripts/short-peak.sh`). Give each
//! workload a file of its own, and delete it after growing the batch, the sequence or the model.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::policy::{Policy, RoutingMode};
use crate::size::ByteSize;
use crate::strategy::SlabBacking;

/// The environment variable naming the profile file.
pub const PROFILE_ENV: &str = "ADAPTALLOC_PROFILE";

/// The schema version this build reads and writes.
const VERSION: u32 = 1;

/// What earlier runs of a workload showed on one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Schema version (1).
    pub version: u32,
    /// The total memory of the device the runs used: a profile is only read on a device of
    /// that size.
    pub device_total_bytes: u64,
    /// The largest peak footprint of those runs (what plain cudaMalloc would have held at the
    /// workload's highest): given to the next run as `bounds.expected_peak`, only while it
    /// stays within nine tenths of the device, as the tuning report's advice gives it
    /// ([`within_margin`](crate::report::within_margin)): nearer the capacity a handle larger
    /// than a page can strand the next request where pages would not.
    pub peak_footprint_bytes: u64,
    /// The most any run held from the device at once (the footprint and what the policy kept
    /// idle besides): for the reader; it decides nothing.
    pub peak_reserved_bytes: u64,
    /// Some run ran out of memory ([`TuningReport::ran_out`](crate::report::TuningReport::ran_out):
    /// a request failed, or was served only after idle memory was given back): the peak is
    /// then not given.
    pub ran_short: bool,
    /// Idle memory the policy's bounds gave back per million operations in the last run that
    /// learned its peak (was not given it).
    pub learned_release_per_mop: u64,
    /// Whether runs are given the peak: false once a run given it gave back more idle memory to
    /// the bounds than the learning run's rate, by more than one peak footprint (handles sized
    /// for the peak that the workload keeps giving back and taking again). Delete the file to
    /// try again.
    pub give_peak: bool,
    /// How many runs it sums up.
    pub runs: u64,
}

/// What one run showed, for [`Profile::after_run`]: the tuning report's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// The device's total memory.
    pub device_total: u64,
    /// Passthrough's footprint of the live blocks at its highest.
    pub peak_footprint: u64,
    /// The most the allocator held at once.
    pub peak_reserved: u64,
    /// Idle memory given back because of the policy's bounds.
    pub released_by_bounds: u64,
    /// Allocations and frees.
    pub operations: u64,
    /// Memory ran out ([`crate::report::TuningReport::ran_out`]).
    pub ran_short: bool,
    /// The run was given the profile's peak ([`Applied::Peak`]).
    pub given: bool,
}

impl RunSummary {
    /// The figures of a run's tuning report; `given` as [`Profile::apply`] said.
    pub fn of(report: &crate::report::TuningReport, given: bool) -> Self {
        RunSummary {
            device_total: report.device_total_bytes,
            peak_footprint: report.memory.peak_footprint_bytes,
            peak_reserved: report.memory.peak_reserved_bytes,
            released_by_bounds: report.bytes_released_by_bounds,
            operations: report.operations,
            ran_short: report.ran_out(),
            given,
        }
    }

    fn release_per_mop(&self) -> u64 {
        (self.released_by_bounds as u128 * 1_000_000 / self.operations.max(1) as u128).min(u64::MAX as u128) as u64
    }
}

/// What [`Profile::apply`] did to a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The policy now gives the profile's peak, and backs slabs by handles sized to the memory
    /// free beyond it.
    Peak(u64),
    /// The profile was made on a device of another size: not used (the run learns, and
    /// its end writes a profile for this device).
    OtherDevice {
        /// The device size the profile names.
        profiled: u64,
    },
    /// The policy gives a peak of its own (`bounds.expected_peak`): the policy wins.
    PolicyGivesPeak,
    /// The policy does not back slabs by handles it can split into pages under the adaptive
    /// engine (a fixed strategy, `page_release = false`, or `suballoc.backing` other than
    /// `auto` and `pages`): a profile changes nothing.
    NotPaged,
    /// The workload's peak footprint is over nine tenths of the device, or a run ran out of
    /// memory: pages keep the last margin.
    NearCapacity,
    /// A run given the peak gave back and took again more than the learning run
    /// ([`Profile::give_peak`] is false).
    Withheld,
}

impl Applied {
    /// The run was given the profile's peak: it counts as one given it, not one that learned.
    pub fn gave_peak(self) -> bool {
        matches!(self, Applied::Peak(_))
    }
}

/// The profile at `path`, where there is one, applied to `policy` on a device of `device_total`
/// bytes ([`Profile::apply`]); None for a first run (no file). What `from_env` and
/// `adaptalloc replay --profile` do at the start of a run.
pub fn apply_file(path: &Path, policy: &mut Policy, device_total: u64) -> Result<Option<Applied>, ConfigError> {
    Ok(Profile::read(path)?.map(|p| p.apply(policy, device_total)))
}

impl Profile {
    /// The profile in `text` (the contents of `file`); errors name the file, line and key.
    pub fn from_toml_str(text: &str, file: &str) -> Result<Self, ConfigError> {
        let p: Profile = crate::config::parse(text, file)?;
        let invalid = |key: &str, value: u64, reason: &str| ConfigError::Invalid {
            file: file.into(),
            key: key.into(),
            value: value.to_string(),
            reason: reason.into(),
        };
        if p.version != VERSION {
            return Err(invalid(
                "version",
                p.version.into(),
                "this build reads profiles of version 1; delete the file to start a new one",
            ));
        }
        if p.device_total_bytes == 0 {
            return Err(invalid(
                "device_total_bytes",
                0,
                "must be the device's size in bytes, over 0",
            ));
        }
        for (key, v) in [
            ("peak_footprint_bytes", p.peak_footprint_bytes),
            ("peak_reserved_bytes", p.peak_reserved_bytes),
        ] {
            if v == 0 || v > p.device_total_bytes {
                return Err(invalid(
                    key,
                    v,
                    "must be over 0 and at most device_total_bytes; delete the file to start a new one",
                ));
            }
        }
        Ok(p)
    }

    /// The profile at `path`; None where there is no such file (a first run).
    pub fn read(path: &Path) -> Result<Option<Self>, ConfigError> {
        if !path.exists() {
            return Ok(None);
        }
        let (file, text) = crate::config::read_file(path)?;
        Self::from_toml_str(&text, &file).map(Some)
    }

    /// Gives `policy` the profile's peak where it is the default kind of policy for it: the
    /// adaptive engine with slabs backed by handles it can split into pages (`auto`, the
    /// default, or `pages`, which the peak turns to `auto`) and no peak of its own, on a device
    /// of the profile's size.
    pub fn apply(&self, policy: &mut Policy, device_total: u64) -> Applied {
        if self.device_total_bytes != device_total {
            return Applied::OtherDevice {
                profiled: self.device_total_bytes,
            };
        }
        if policy.bounds.expected_peak.is_some() {
            return Applied::PolicyGivesPeak;
        }
        if !self.give_peak {
            return Applied::Withheld;
        }
        if self.ran_short || !crate::report::within_margin(self.peak_footprint_bytes, device_total) {
            return Applied::NearCapacity;
        }
        if policy.routing.mode != RoutingMode::Adaptive
            || !policy.suballoc.page_release
            || !matches!(policy.suballoc.backing, SlabBacking::Pages | SlabBacking::Auto)
        {
            return Applied::NotPaged;
        }
        policy.bounds.expected_peak = Some(ByteSize(self.peak_footprint_bytes));
        policy.suballoc.backing = SlabBacking::Auto;
        Applied::Peak(self.peak_footprint_bytes)
    }

    /// The profile after one more run: the larger peaks of the two on the same device, a new
    /// profile on another (or where there was none). A run given the peak that gave back more
    /// idle memory to the bounds than the learning run's rate allows, plus one peak footprint,
    /// withholds the peak from later runs. None for a run that allocated nothing.
    pub fn after_run(old: Option<&Self>, run: RunSummary) -> Option<Self> {
        if run.peak_footprint == 0 || run.device_total == 0 {
            return old.cloned();
        }
        let clamp = |v: u64| v.clamp(1, run.device_total);
        Some(match old {
            Some(o) if o.device_total_bytes == run.device_total => {
                let allowed = (o.learned_release_per_mop as u128 * run.operations as u128 / 1_000_000)
                    .saturating_add(o.peak_footprint_bytes as u128);
                Profile {
                    peak_footprint_bytes: o.peak_footprint_bytes.max(clamp(run.peak_footprint)),
                    peak_reserved_bytes: o.peak_reserved_bytes.max(clamp(run.peak_reserved)),
                    ran_short: o.ran_short || run.ran_short,
                    learned_release_per_mop: if run.given {
                        o.learned_release_per_mop
                    } else {
                        run.release_per_mop()
                    },
                    give_peak: o.give_peak && !(run.given && run.released_by_bounds as u128 > allowed),
                    runs: o.runs.saturating_add(1),
                    ..o.clone()
                }
            }
            _ => Profile {
                version: VERSION,
                device_total_bytes: run.device_total,
                peak_footprint_bytes: clamp(run.peak_footprint),
                peak_reserved_bytes: clamp(run.peak_reserved),
                ran_short: run.ran_short,
                learned_release_per_mop: run.release_per_mop(),
                give_peak: true,
                runs: 1,
            },
        })
    }

    /// The file's text: a comment that says what it is, then the keys.
    pub fn to_toml(&self) -> String {
        format!(
            "# adaptalloc workload profile (ADAPTALLOC_PROFILE): the largest peak footprint the runs of\n\
             # this workload showed ({}, on a device of {}). Each run reads it at its start (as\n\
             # bounds.expected_peak, with suballoc.backing = \"auto\") and writes it at its end.\n\
             # Delete it after growing the batch, the sequence or the model.\n{}",
            ByteSize(self.peak_footprint_bytes),
            ByteSize(self.device_total_bytes),
            toml::to_string(self).expect("a profile serializes")
        )
    }

    /// Writes the profile to `path` whole: a file beside it, renamed over it, so that a reader
    /// (another process of the same job) never sees half of one.
    pub fn write(&self, path: &Path) -> Result<(), ConfigError> {
        let tmp = PathBuf::from(format!("{}.{}.tmp", path.display(), std::process::id()));
        let failed = |e: std::io::Error| ConfigError::Write {
            file: path.display().to_string(),
            reason: e.to_string(),
        };
        std::fs::write(&tmp, self.to_toml()).map_err(failed)?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            failed(e)
        })
    }
}

/// At the end of a run: the profile at `path` updated with what the run showed, and written.
/// A file that does not read as a profile is replaced (with a warning): it was read at the
/// start, so it changed since.
pub fn record(path: &Path, run: RunSummary) -> Result<Option<Profile>, ConfigError> {
    let old = Profile::read(path).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "replacing a profile that does not read");
        None
    });
    let Some(new) = Profile::after_run(old.as_ref(), run) else {
        return Ok(None);
    };
    if old.as_ref() != Some(&new) {
        new.write(path)?;
    }
    Ok(Some(new))
}

/// What [`Profile::apply`] did, as the log and `adaptalloc replay --profile` say it.
impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Applied::Peak(peak) => write!(
                f,
                "the peak earlier runs showed is given from the first request ({}: bounds.expected_peak, backing \"auto\")",
                ByteSize(peak)
            ),
            Applied::OtherDevice { profiled } => write!(
                f,
                "made on a device of {}, another size; not used (this run's end writes one for this device)",
                ByteSize(profiled)
            ),
            Applied::PolicyGivesPeak => f.write_str("the policy gives bounds.expected_peak itself; not used"),
            Applied::NotPaged => f.write_str(
                "the policy does not back slabs by handles split into pages (suballoc.backing \"auto\" or \"pages\") under the adaptive engine; not used (it would change nothing)",
            ),
            Applied::NearCapacity => f.write_str(
                "the workload's peak footprint is over nine tenths of the device, or a run ran out of memory; \
                 not used (pages keep the last margin)",
            ),
            Applied::Withheld => f.write_str(
                "a run given the peak kept giving memory back and taking it again; not used (delete the file to try again)",
            ),
        }
    }
}

/// Says in the log what [`Profile::apply`] did: a warning for a profile of another device, else
/// info.
pub fn log_applied(path: &Path, applied: Applied) {
    let file = path.display();
    match applied {
        Applied::OtherDevice { .. } => tracing::warn!(%file, "profile: {applied}"),
        _ => tracing::info!(%file, "profile: {applied}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size::GIB;

    fn profile(total: u64, peak: u64) -> Profile {
        Profile {
            version: 1,
            device_total_bytes: total,
            peak_footprint_bytes: peak,
            peak_reserved_bytes: peak,
            ran_short: false,
            learned_release_per_mop: 0,
            give_peak: true,
            runs: 1,
        }
    }

    /// A run on `total` bytes that reached `peak`, held as much, over a million operations.
    fn run(total: u64, peak: u64) -> RunSummary {
        RunSummary {
            device_total: total,
            peak_footprint: peak,
            peak_reserved: peak,
            released_by_bounds: 0,
            operations: 1_000_000,
            ran_short: false,
            given: false,
        }
    }

    #[test]
    fn a_profile_gives_the_default_policy_its_peak_and_auto_backing() {
        let mut p = Policy::default();
        assert_eq!(
            profile(80 * GIB, 20 * GIB).apply(&mut p, 80 * GIB),
            Applied::Peak(20 * GIB)
        );
        assert_eq!(p.bounds.expected_peak, Some(ByteSize(20 * GIB)));
        assert_eq!(p.suballoc.backing, SlabBacking::Auto);
    }

    #[test]
    fn a_profile_leaves_policies_it_does_not_fit_alone() {
        let prof = profile(80 * GIB, 20 * GIB);
        let mut p = Policy::default();
        assert_eq!(
            prof.apply(&mut p, 40 * GIB),
            Applied::OtherDevice { profiled: 80 * GIB }
        );
        assert_eq!(p, Policy::default());
        p.bounds.expected_peak = Some(ByteSize(GIB));
        assert_eq!(prof.apply(&mut p, 80 * GIB), Applied::PolicyGivesPeak);
        assert_eq!(p.bounds.expected_peak, Some(ByteSize(GIB)));
        for change in [
            |p: &mut Policy| p.suballoc.backing = SlabBacking::Whole,
            |p: &mut Policy| p.suballoc.page_release = false,
            |p: &mut Policy| p.routing.mode = RoutingMode::Caching,
            |p: &mut Policy| p.routing.mode = RoutingMode::Suballoc,
        ] {
            let mut p = Policy::default();
            change(&mut p);
            let before = p.clone();
            assert_eq!(prof.apply(&mut p, 80 * GIB), Applied::NotPaged);
            assert_eq!(p, before);
        }
        let near = Profile {
            peak_footprint_bytes: 73 * GIB,
            ..prof.clone()
        };
        let mut p = Policy::default();
        assert_eq!(
            near.apply(&mut p, 80 * GIB),
            Applied::NearCapacity,
            "a footprint over nine tenths"
        );
        assert_eq!(p, Policy::default());
        let edge = Profile {
            peak_footprint_bytes: 72 * GIB,
            peak_reserved_bytes: 80 * GIB,
            ..prof.clone()
        };
        assert_eq!(
            edge.apply(&mut p, 80 * GIB),
            Applied::Peak(72 * GIB),
            "a footprint of nine tenths, whatever was held idle besides"
        );
        let withheld = Profile {
            give_peak: false,
            ..prof
        };
        let mut p = Policy::default();
        assert_eq!(withheld.apply(&mut p, 80 * GIB), Applied::Withheld);
        assert_eq!(p, Policy::default());
    }

    #[test]
    fn a_run_keeps_the_larger_peak_and_counts_itself() {
        let first = Profile::after_run(None, run(80 * GIB, 20 * GIB)).unwrap();
        assert_eq!(first, profile(80 * GIB, 20 * GIB));
        let smaller = Profile::after_run(Some(&first), run(80 * GIB, 15 * GIB)).unwrap();
        assert_eq!((smaller.peak_footprint_bytes, smaller.runs), (20 * GIB, 2));
        let larger = Profile::after_run(Some(&smaller), run(80 * GIB, 25 * GIB)).unwrap();
        assert_eq!(
            (larger.peak_footprint_bytes, larger.peak_reserved_bytes, larger.runs),
            (25 * GIB, 25 * GIB, 3)
        );
        let moved = Profile::after_run(Some(&larger), run(40 * GIB, 10 * GIB)).unwrap();
        assert_eq!(moved, profile(40 * GIB, 10 * GIB), "another device starts afresh");
        assert_eq!(
            Profile::after_run(Some(&first), run(80 * GIB, 0)),
            Some(first),
            "an empty run changes nothing"
        );
        assert_eq!(Profile::after_run(None, run(80 * GIB, 0)), None);
        let short = RunSummary {
            ran_short: true,
            ..run(80 * GIB, 20 * GIB)
        };
        let after = Profile::after_run(Some(&larger), short).unwrap();
        assert!(after.ran_short, "a run that ran short marks the profile");
        assert!(
            Profile::after_run(Some(&after), run(80 * GIB, 20 * GIB))
                .unwrap()
                .ran_short,
            "for good"
        );
    }

    /// A run given the peak may give back to the bounds what the learning run did at its rate,
    /// plus one peak footprint; past that, later runs learn again.
    #[test]
    fn a_given_peak_that_churns_is_withheld_from_later_runs() {
        let learned = Profile::after_run(
            None,
            RunSummary {
                released_by_bounds: 2 * GIB,
                ..run(80 * GIB, 20 * GIB)
            },
        )
        .unwrap();
        assert_eq!(learned.learned_release_per_mop, 2 * GIB);
        let given = |released| RunSummary {
            released_by_bounds: released,
            operations: 3_000_000,
            given: true,
            ..run(80 * GIB, 20 * GIB)
        };
        let within = Profile::after_run(Some(&learned), given(26 * GIB)).unwrap();
        assert!(within.give_peak, "3 x 2 GiB at the learned rate, plus the 20 GiB peak");
        assert_eq!(
            within.learned_release_per_mop,
            2 * GIB,
            "a given run does not reset the rate"
        );
        let churned = Profile::after_run(Some(&within), given(26 * GIB + 1)).unwrap();
        assert!(!churned.give_peak);
        let after = Profile::after_run(Some(&churned), run(80 * GIB, 20 * GIB)).unwrap();
        assert!(!after.give_peak, "withheld until the file is deleted");
        let mut p = Policy::default();
        assert_eq!(after.apply(&mut p, 80 * GIB), Applied::Withheld);
    }

    proptest::proptest! {
        /// Any values under the profile's keys either read as a profile whose peaks are within
        /// its device, or are refused naming the file; and any run after it keeps that so, with
        /// the larger peak, one more run, and the peak withheld for good once withheld.
        #[test]
        fn profiles_stay_within_their_device(
            version in 0u32..3,
            total in 0u64..(1 << 40),
            peak in 0u64..(1 << 41),
            reserved in 0u64..(1 << 41),
            give in proptest::bool::ANY,
            run_peak in 0u64..(1 << 41),
            released in 0u64..(1 << 44),
            operations in 0u64..(1 << 30),
            given in proptest::bool::ANY,
        ) {
            let text = format!(
                "version = {version}\ndevice_total_bytes = {total}\npeak_footprint_bytes = {peak}\n\
                 peak_reserved_bytes = {reserved}\nran_short = false\nlearned_release_per_mop = 7\n\
                 give_peak = {give}\nruns = 3\n"
            );
            let p = match Profile::from_toml_str(&text, "p.toml") {
                Ok(p) => p,
                Err(e) => {
                    proptest::prop_assert!(e.to_string().contains("p.toml"));
                    return Ok(());
                }
            };
            proptest::prop_assert!(p.peak_footprint_bytes > 0 && p.peak_footprint_bytes <= p.device_total_bytes);
            let run = RunSummary {
                device_total: total,
                peak_footprint: run_peak,
                peak_reserved: run_peak,
                released_by_bounds: released,
                operations,
                ran_short: false,
                given,
            };
            let next = Profile::after_run(Some(&p), run).unwrap();
            proptest::prop_assert!(next.peak_footprint_bytes <= total && next.peak_reserved_bytes <= total);
            proptest::prop_assert!(next.peak_footprint_bytes >= p.peak_footprint_bytes);
            proptest::prop_assert_eq!(next.runs, if run_peak == 0 { 3 } else { 4 });
            proptest::prop_assert!(p.give_peak || !next.give_peak);
            proptest::prop_assert_eq!(Profile::from_toml_str(&next.to_toml(), "next.toml").unwrap(), next);
        }
    }

    #[test]
    fn a_profile_round_trips_through_its_file() {
        let p = profile(80 * GIB, 20 * GIB);
        assert_eq!(Profile::from_toml_str(&p.to_toml(), "p.toml").unwrap(), p);
    }

    #[test]
    fn a_bad_profile_names_the_file_and_the_key() {
        let rest = "ran_short = false\nlearned_release_per_mop = 0\ngive_peak = true\nruns = 1\n";
        let cases = [
            (
                "version = 1\ndevice_total_bytes = 10\npeak_footprint_bytes = 5\npeak_reserved_bytes = 5\nspeed = 2\n",
                "speed",
            ),
            (
                "version = 2\ndevice_total_bytes = 10\npeak_footprint_bytes = 5\npeak_reserved_bytes = 5\n",
                "version",
            ),
            (
                "version = 1\ndevice_total_bytes = 10\npeak_footprint_bytes = 11\npeak_reserved_bytes = 5\n",
                "peak_footprint_bytes",
            ),
            (
                "version = 1\ndevice_total_bytes = 10\npeak_footprint_bytes = 5\npeak_reserved_bytes = 0\n",
                "peak_reserved_bytes",
            ),
            (
                "version = 1\ndevice_total_bytes = 0\npeak_footprint_bytes = 1\npeak_reserved_bytes = 1\n",
                "device_total_bytes",
            ),
            (
                "version = 1\ndevice_total_bytes = 10\npeak_footprint_bytes = \"x\"\npeak_reserved_bytes = 5\n",
                "peak_footprint_bytes",
            ),
        ];
        for (head, key) in cases {
            let text = format!("{head}{rest}");
            let e = Profile::from_toml_str(&text, "prof.toml").unwrap_err().to_string();
            assert!(e.contains("prof.toml") && e.contains(key), "{text:?}: {e}");
        }
    }

    #[test]
    fn record_writes_the_file_and_replaces_one_that_does_not_read() {
        let dir = std::env::temp_dir().join(format!("adaptalloc-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.toml");
        let _ = std::fs::remove_file(&path);
        assert_eq!(Profile::read(&path).unwrap(), None, "no file: a first run");
        record(&path, run(80 * GIB, 20 * GIB)).unwrap();
        assert_eq!(Profile::read(&path).unwrap(), Some(profile(80 * GIB, 20 * GIB)));
        record(&path, run(80 * GIB, 30 * GIB)).unwrap();
        let p = Profile::read(&path).unwrap().unwrap();
        assert_eq!((p.peak_footprint_bytes, p.runs), (30 * GIB, 2));
        std::fs::write(&path, "not = [a profile").unwrap();
        assert!(Profile::read(&path).is_err());
        record(&path, run(80 * GIB, 10 * GIB)).unwrap();
        assert_eq!(Profile::read(&path).unwrap(), Some(profile(80 * GIB, 10 * GIB)));
        let missing = dir.join("no-such-dir").join("p.toml");
        let e = record(&missing, run(80 * GIB, GIB)).unwrap_err().to_string();
        assert!(e.contains("no-such-dir") && e.contains("cannot write"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
