//! The cost model of driver calls used by [`SimDevice`](super::SimDevice).
//!
//! Costs are piecewise-linear curves over log2(size), loaded from TOML
//! (`tuning/cost-models/default.toml`; the sources of its numbers are in its comments).

use std::path::Path;

use serde::Deserialize;

use crate::error::ConfigError;
use crate::size::ByteSize;

/// Time of one driver call as a function of its size: points `(size, ns)`, linear in
/// log2(size) between points, flat beyond the ends.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CostCurve {
    /// `[[size, ns], ...]`, sizes strictly increasing.
    pub points: Vec<(ByteSize, u64)>,
}

impl CostCurve {
    pub fn flat(ns: u64) -> Self {
        CostCurve {
            points: vec![(ByteSize(1), ns)],
        }
    }

    /// Modelled nanoseconds for a call of `bytes`. Cost: a short scan of a handful of points.
    pub fn ns(&self, bytes: u64) -> u64 {
        let pts = &self.points;
        if pts.is_empty() {
            return 0;
        }
        if bytes <= pts[0].0.0 {
            return pts[0].1;
        }
        for w in pts.windows(2) {
            let ((s0, t0), (s1, t1)) = (w[0], w[1]);
            if bytes <= s1.0 {
                let x0 = (s0.0.max(1) as f64).log2();
                let x1 = (s1.0 as f64).log2();
                let x = (bytes as f64).log2();
                let f = if x1 > x0 { (x - x0) / (x1 - x0) } else { 1.0 };
                return (t0 as f64 + f * (t1 as f64 - t0 as f64)).round() as u64;
            }
        }
        pts[pts.len() - 1].1
    }

    fn validate(&self, file: &str, key: &str) -> Result<(), ConfigError> {
        if self.points.is_empty() {
            return Err(ConfigError::Invalid {
                file: file.into(),
                key: key.into(),
                value: "[]".into(),
                reason: "give at least one [size, ns] point".into(),
            });
        }
        for w in self.points.windows(2) {
            if w[1].0 <= w[0].0 {
                return Err(ConfigError::Invalid {
                    file: file.into(),
                    key: key.into(),
                    value: format!("{} after {}", w[1].0, w[0].0),
                    reason: "sizes must be strictly increasing".into(),
                });
            }
        }
        Ok(())
    }
}

/// Modelled cost of driver calls.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CostModel {
    /// A free-form description (where the numbers come from).
    #[serde(default)]
    pub description: String,
    /// cuMemAlloc latency by size.
    pub alloc: CostCurve,
    /// cuMemFree latency by size, not counting the synchronization below.
    pub free: CostCurve,
    /// The device synchronization a cuMemFree implies (waiting for queued work), in ns.
    pub free_sync_ns: u64,
    /// cuMemGetInfo latency, in ns.
    pub mem_info_ns: u64,
}

/// The default model, the same numbers as `tuning/cost-models/default.toml` (a test checks).
const DEFAULT_TOML: &str = include_str!("../../tuning/cost-models/default.toml");

impl Default for CostModel {
    fn default() -> Self {
        Self::from_toml_str(DEFAULT_TOML, "tuning/cost-models/default.toml")
            .expect("the bundled default cost model parses (checked by a test)")
    }
}

impl CostModel {
    /// A model where every call is free: for tests that count calls, not time.
    pub fn zero() -> Self {
        CostModel {
            description: "zero cost".into(),
            alloc: CostCurve::flat(0),
            free: CostCurve::flat(0),
            free_sync_ns: 0,
            mem_info_ns: 0,
        }
    }

    pub fn from_toml_str(text: &str, file: &str) -> Result<Self, ConfigError> {
        let model: CostModel = crate::config::parse(text, file)?;
        model.alloc.validate(file, "alloc.points")?;
        model.free.validate(file, "free.points")?;
        Ok(model)
    }

    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let (file, text) = crate::config::read_file(path)?;
        Self::from_toml_str(&text, &file)
    }

    pub fn alloc_ns(&self, bytes: u64) -> u64 {
        self.alloc.ns(bytes)
    }

    pub fn free_ns(&self, bytes: u64) -> u64 {
        self.free.ns(bytes) + self.free_sync_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size::{KIB, MIB};

    #[test]
    fn bundled_default_parses_and_is_monotone_for_large_sizes() {
        let m = CostModel::default();
        assert!(m.alloc_ns(4 * KIB) > 0);
        assert!(m.alloc_ns(1024 * MIB) >= m.alloc_ns(2 * MIB));
        assert!(m.free_ns(MIB) >= m.free_sync_ns);
    }

    #[test]
    fn interpolates_in_log_space() {
        let c = CostCurve {
            points: vec![(ByteSize(1024), 100), (ByteSize(4096), 300)],
        };
        assert_eq!(c.ns(1), 100);
        assert_eq!(c.ns(2048), 200);
        assert_eq!(c.ns(1 << 30), 300);
    }

    #[test]
    fn rejects_unsorted_points_and_unknown_keys() {
        let bad = "alloc = { points = [[\"2MiB\", 5], [\"1MiB\", 6]] }\nfree = { points = [[1, 1]] }\nfree_sync_ns = 0\nmem_info_ns = 0\n";
        let err = CostModel::from_toml_str(bad, "x.toml").unwrap_err().to_string();
        assert!(err.contains("alloc.points") && err.contains("increasing"), "{err}");
        let unknown = "alloc = { points = [[1, 1]] }\nfree = { points = [[1, 1]] }\nfree_sync_ns = 0\nmem_info_ns = 0\nspeed = 3\n";
        let err = CostModel::from_toml_str(unknown, "x.toml").unwrap_err().to_string();
        assert!(err.contains("x.toml:5") && err.contains("speed"), "{err}");
    }
}
