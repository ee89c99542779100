//! The allocator its environment asks for (`ADAPTALLOC_POLICY`, `ADAPTALLOC_PROFILE`,
//! `ADAPTALLOC_REPORT`), and the files a run leaves when it ends: the tuning report and the
//! workload profile.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Allocator, Shared};
use crate::device::Device;
use crate::error::ConfigError;
use crate::policy::Policy;
use crate::profile::{PROFILE_ENV, RunSummary};
use crate::report::report_path_for_device;

/// Where a run's files go when it ends.
#[derive(Debug, Default)]
pub(super) struct ExitFiles {
    /// The tuning report (`ADAPTALLOC_REPORT`).
    pub report: Option<PathBuf>,
    /// The workload profile (`ADAPTALLOC_PROFILE`).
    pub profile: Option<PathBuf>,
    /// The run was given the profile's peak.
    pub profile_given: bool,
}

/// A path from the environment; None where unset or blank.
fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.to_string_lossy().trim().is_empty())
        .map(PathBuf::from)
}

impl Allocator {
    /// The allocator its environment asks for: the policy named by `ADAPTALLOC_POLICY` (a file
    /// or a preset name; the built-in default when unset), given the peak of the workload
    /// profile `ADAPTALLOC_PROFILE` names where there is one (see [`crate::profile`]), writing
    /// a tuning report to `ADAPTALLOC_REPORT` (.toml, .json or .md) and the profile when
    /// dropped. A broken policy or profile file is an error naming the file, line and key; no
    /// allocator starts on a half-read one.
    pub fn from_env(device: Arc<dyn Device>) -> Result<Self, ConfigError> {
        Self::from_env_device(device, 0)
    }

    /// [`from_env`](Self::from_env) for device `ordinal` of several: its report and profile
    /// files are those named, with `.N` before the extension from device 1 on (`prof.toml`,
    /// `prof.1.toml`, ...).
    pub fn from_env_device(device: Arc<dyn Device>, ordinal: i32) -> Result<Self, ConfigError> {
        let mut policy = Policy::from_env()?;
        let total = device.mem_info().map(|m| m.total).ok();
        if let Some(total) = total {
            let name = std::env::var("ADAPTALLOC_POLICY").unwrap_or_else(|_| "the default policy".into());
            policy.check_fits(&name, total)?;
        }
        let profile = env_path(PROFILE_ENV).map(|p| report_path_for_device(&p, ordinal));
        let mut profile_given = false;
        if let (Some(path), Some(total)) = (&profile, total)
            && let Some(applied) = crate::profile::apply_file(path, &mut policy, total)?
        {
            profile_given = applied.gave_peak();
            crate::profile::log_applied(path, applied);
        }
        let alloc = Self::with_policy(device, policy);
        *alloc.shared.exit.lock() = ExitFiles {
            report: env_path("ADAPTALLOC_REPORT").map(|p| report_path_for_device(&p, ordinal)),
            profile,
            profile_given,
        };
        Ok(alloc)
    }

    /// Writes the tuning report to `path` when the last clone of this allocator is dropped.
    pub fn set_report_path(&self, path: Option<PathBuf>) {
        self.shared.exit.lock().report = path;
    }

    /// Updates the workload profile at `path` (see [`crate::profile`]) when the last clone of
    /// this allocator is dropped. Reading one at the start is [`from_env`](Self::from_env)'s
    /// (or [`apply_file`](crate::profile::apply_file) on the policy given to [`with_policy`](Self::with_policy)).
    /// `given`: the policy was given the profile's peak ([`Applied::Peak`](crate::profile::Applied::Peak)), which decides
    /// whether the run counts as one that learned its peak or one that was given it.
    pub fn set_profile_path(&self, path: Option<PathBuf>, given: bool) {
        let mut exit = self.shared.exit.lock();
        exit.profile = path;
        exit.profile_given = given;
    }

    /// Whether a tuning report or a workload profile is to be written when the run ends
    /// ([`from_env`](Self::from_env) read a path for one, or one was set since).
    pub fn has_exit_files(&self) -> bool {
        let exit = self.shared.exit.lock();
        exit.report.is_some() || exit.profile.is_some()
    }

    /// Writes the tuning report and updates the profile now, where paths are set; a later
    /// drop writes neither again. For hosts whose allocator is never dropped (the C ABI writes
    /// at process exit). Failures are logged.
    pub fn write_exit_files(&self) {
        let files = std::mem::take(&mut *self.shared.exit.lock());
        self.shared.write_exit_files(files);
    }
}

impl Shared {
    /// The report and the profile of the run so far, written where `files` say.
    pub(super) fn write_exit_files(&self, files: ExitFiles) {
        if files.report.is_none() && files.profile.is_none() {
            return;
        }
        let Some(mut report) = self.report() else {
            tracing::warn!("ADAPTALLOC_REPORT or ADAPTALLOC_PROFILE is set but this allocator has no policy engine");
            return;
        };
        if let Some(path) = files.profile {
            write_profile(&path, RunSummary::of(&report, files.profile_given));
        }
        if let Some(path) = files.report {
            report.note_not_replayed();
            if let Err(e) = report.write_to(&path) {
                tracing::error!(path = %path.display(), error = %e, "cannot write the tuning report");
            }
        }
    }
}

fn write_profile(path: &Path, run: RunSummary) {
    match crate::profile::record(path, run) {
        Ok(Some(p)) => tracing::info!(
            path = %path.display(),
            peak = p.peak_footprint_bytes,
            runs = p.runs,
            "workload profile written"
        ),
        Ok(None) => {}
        Err(e) => tracing::error!(error = %e, "cannot write the workload profile"),
    }
}
