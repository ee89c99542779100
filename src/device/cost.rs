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
    /// `[[size, ns], ...]`, sizes strictly increasing, each price at most one second.
    #[serde(deserialize_with = "price_points")]
    pub points: Vec<(ByteSize, u64)>,
}

/// The most one modelled driver call may cost: one second. A larger price is a typo (or an
/// attempt to overflow the modelled totals), refused where the file gives it.
pub const MAX_PRICE_NS: u64 = 1_000_000_000;

fn check_price(ns: u64) -> Result<u64, String> {
    if ns > MAX_PRICE_NS {
        return Err(format!(
            "a price of {ns} ns is more than one second a call; the cost model prices one driver call, at most {MAX_PRICE_NS} ns"
        ));
    }
    Ok(ns)
}

/// A price in ns, bounded by [`MAX_PRICE_NS`].
fn price<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    check_price(u64::deserialize(d)?).map_err(serde::de::Error::custom)
}

fn price_points<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<(ByteSize, u64)>, D::Error> {
    let points = Vec::<(ByteSize, u64)>::deserialize(d)?;
    for &(_, ns) in &points {
        check_price(ns).map_err(serde::de::Error::custom)?;
    }
    Ok(points)
}

impl CostCurve {
    /// The same `ns` at every size.
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

    /// Modelled nanoseconds for one call per size in `sizes` (handles priced each at its own
    /// size).
    pub fn total(&self, sizes: impl IntoIterator<Item = u64>) -> u64 {
        sizes.into_iter().map(|bytes| self.ns(bytes)).sum()
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

/// A price that may depend on size: a number of ns, or a curve `{ points = [[size, ns], ...] }`.
fn flat_or_curve<'de, D: serde::Deserializer<'de>>(d: D) -> Result<CostCurve, D::Error> {
    struct Visitor;
    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = CostCurve;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a number of ns, or a table { points = [[size, ns], ...] }")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<CostCurve, E> {
            check_price(v).map(CostCurve::flat).map_err(E::custom)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<CostCurve, E> {
            let v = u64::try_from(v).map_err(|_| E::custom(format!("a price cannot be negative (got {v})")))?;
            self.visit_u64(v)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<CostCurve, A::Error> {
            CostCurve::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_any(Visitor)
}

/// Prices of CUDA's virtual-memory calls, ns per call. `CudaDevice` backs a mapping with one
/// physical handle per page (2 MiB; larger where asked), so mapping `n` handles costs `n`
/// creates and maps and one access grant for the run, and unmapping them `n` unmaps and
/// releases, after one synchronization.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VmmCosts {
    /// cuMemAddressReserve.
    #[serde(deserialize_with = "price")]
    pub reserve_ns: u64,
    /// cuMemAddressFree.
    #[serde(deserialize_with = "price")]
    pub unreserve_ns: u64,
    /// cuMemCreate of one physical handle, by handle size (a number: the same for every size).
    #[serde(deserialize_with = "flat_or_curve")]
    pub create_ns: CostCurve,
    /// cuMemMap of one handle.
    #[serde(deserialize_with = "price")]
    pub map_ns: u64,
    /// cuMemSetAccess, one device, for each handle the call covers, by handle size (a number:
    /// the same for every size): one call grants a whole mapped run, and its time is about
    /// the same a handle whatever the run's length (measured on an H200: 23-36 us a 2 MiB
    /// handle over runs of 1 to 1,024, with up to 4,096 others mapped; one handle alone 33 us
    /// at 2 MiB, 90 us at 1 GiB).
    #[serde(deserialize_with = "flat_or_curve")]
    pub set_access_ns: CostCurve,
    /// cuMemUnmap of one mapping (host-synchronous), by handle size (a number: the same for
    /// every size).
    #[serde(deserialize_with = "flat_or_curve")]
    pub unmap_ns: CostCurve,
    /// cuMemRelease of one handle, by handle size (a number: the same for every size): where
    /// the last reference goes, the memory goes back to the driver, and that grows with the
    /// handle (H200, after unmapping: 14 us at 2 MiB, 83 us at 128 MiB, 573 us at 1 GiB).
    #[serde(deserialize_with = "flat_or_curve")]
    pub release_ns: CostCurve,
    /// The synchronization (cuCtxSynchronize) before a batch of unmaps: unmapping is not
    /// stream-ordered, so queued work must finish first.
    #[serde(deserialize_with = "price")]
    pub unmap_sync_ns: u64,
    /// A device-to-device copy of one page (cuMemcpyDtoD), by its bytes (a number: the same
    /// for every size): what splitting a larger handle into pages pays for each page a live
    /// block keeps ([`VirtualMemory::split_handle`](super::VirtualMemory::split_handle)).
    /// Optional in a file; absent, 10 us a call (assumed).
    #[serde(default = "default_copy_ns", deserialize_with = "flat_or_curve")]
    pub copy_ns: CostCurve,
}

/// The price of a device-to-device copy where a cost model gives none: 10 us a call (assumed:
/// a launch of a few microseconds and 2 MiB at about 1 TB/s; not measured).
const DEFAULT_COPY_NS: u64 = 10_000;

fn default_copy_ns() -> CostCurve {
    CostCurve::flat(DEFAULT_COPY_NS)
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
    #[serde(deserialize_with = "price")]
    pub free_sync_ns: u64,
    /// cuMemGetInfo latency, in ns.
    #[serde(deserialize_with = "price")]
    pub mem_info_ns: u64,
    /// A wait for one stream's queued work (cuStreamSynchronize), in ns: what the allocator
    /// pays when it waits for a stream before failing a request.
    #[serde(deserialize_with = "price")]
    pub stream_sync_ns: u64,
    /// cudaMallocAsync served from a stream-ordered pool's memory, in ns.
    #[serde(deserialize_with = "price")]
    pub async_alloc_ns: u64,
    /// cudaFreeAsync, in ns.
    #[serde(deserialize_with = "price")]
    pub async_free_ns: u64,
    /// Virtual-memory calls.
    pub vmm: VmmCosts,
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
            stream_sync_ns: 0,
            async_alloc_ns: 0,
            async_free_ns: 0,
            vmm: VmmCosts {
                reserve_ns: 0,
                unreserve_ns: 0,
                create_ns: CostCurve::flat(0),
                map_ns: 0,
                set_access_ns: CostCurve::flat(0),
                unmap_ns: CostCurve::flat(0),
                release_ns: CostCurve::flat(0),
                unmap_sync_ns: 0,
                copy_ns: CostCurve::flat(0),
            },
        }
    }

    /// A model from TOML text (`file` names it in errors); every curve is checked.
    pub fn from_toml_str(text: &str, file: &str) -> Result<Self, ConfigError> {
        let model: CostModel = crate::config::parse(text, file)?;
        model.alloc.validate(file, "alloc.points")?;
        model.free.validate(file, "free.points")?;
        model.vmm.create_ns.validate(file, "vmm.create_ns")?;
        model.vmm.set_access_ns.validate(file, "vmm.set_access_ns")?;
        model.vmm.unmap_ns.validate(file, "vmm.unmap_ns")?;
        model.vmm.release_ns.validate(file, "vmm.release_ns")?;
        model.vmm.copy_ns.validate(file, "vmm.copy_ns")?;
        Ok(model)
    }

    /// A model from a file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let (file, text) = crate::config::read_file(path)?;
        Self::from_toml_str(&text, &file)
    }

    /// A cuMemAlloc of `bytes`.
    pub fn alloc_ns(&self, bytes: u64) -> u64 {
        self.alloc.ns(bytes)
    }

    /// A cuMemFree of `bytes` with the synchronization it implies.
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

    /// Everything after `alloc` in a minimal model.
    const REST: &str = "free = { points = [[1, 1]] }\nfree_sync_ns = 0\nmem_info_ns = 0\nstream_sync_ns = 0\nasync_alloc_ns = 0\nasync_free_ns = 0\n[vmm]\nreserve_ns = 0\nunreserve_ns = 0\ncreate_ns = 5\nmap_ns = 1\nset_access_ns = 0\nunmap_ns = 0\nrelease_ns = 0\nunmap_sync_ns = 0\n";

    /// Every per-handle price (create, access grant, unmap, release) is a number or a curve by
    /// handle size, and an unsorted curve is refused naming its key.
    #[test]
    fn handle_prices_are_a_number_or_a_curve_by_handle_size() {
        let m = CostModel::from_toml_str(&format!("alloc = {{ points = [[1, 1]] }}\n{REST}"), "x.toml").unwrap();
        assert_eq!(m.vmm.create_ns.ns(2 * MIB), 5);
        assert_eq!(m.vmm.set_access_ns.ns(2 * MIB), 0);
        type Price = fn(&VmmCosts) -> &CostCurve;
        let keys: [(&str, &str, Price); 4] = [
            ("create_ns", "create_ns = 5", |v| &v.create_ns),
            ("set_access_ns", "set_access_ns = 0", |v| &v.set_access_ns),
            ("unmap_ns", "unmap_ns = 0", |v| &v.unmap_ns),
            ("release_ns", "release_ns = 0", |v| &v.release_ns),
        ];
        for (key, line, get) in keys {
            let curve = REST.replace(
                line,
                &format!("{key} = {{ points = [[\"2MiB\", 10], [\"32MiB\", 50]] }}"),
            );
            let m = CostModel::from_toml_str(&format!("alloc = {{ points = [[1, 1]] }}\n{curve}"), "x.toml").unwrap();
            assert_eq!(get(&m.vmm).ns(2 * MIB), 10, "{key}");
            assert_eq!(get(&m.vmm).ns(8 * MIB), 30, "{key}");
            let unsorted = REST.replace(
                line,
                &format!("{key} = {{ points = [[\"4MiB\", 10], [\"2MiB\", 50]] }}"),
            );
            let err = CostModel::from_toml_str(&format!("alloc = {{ points = [[1, 1]] }}\n{unsorted}"), "x.toml")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("vmm.{key}")) && err.contains("increasing"),
                "{err}"
            );
        }
    }

    #[test]
    fn rejects_unsorted_points_and_unknown_keys() {
        let bad = format!("alloc = {{ points = [[\"2MiB\", 5], [\"1MiB\", 6]] }}\n{REST}");
        let err = CostModel::from_toml_str(&bad, "x.toml").unwrap_err().to_string();
        assert!(err.contains("alloc.points") && err.contains("increasing"), "{err}");
        let unknown = format!("speed = 3\nalloc = {{ points = [[1, 1]] }}\n{REST}");
        let err = CostModel::from_toml_str(&unknown, "x.toml").unwrap_err().to_string();
        assert!(err.contains("x.toml:1") && err.contains("speed"), "{err}");
        let bad_vmm = format!(
            "alloc = {{ points = [[1, 1]] }}\n{}",
            REST.replace("map_ns = 1", "map_ns = 1\nspeed = 2")
        );
        let err = CostModel::from_toml_str(&bad_vmm, "x.toml").unwrap_err().to_string();
        assert!(err.contains("speed"), "{err}");
        let no_vmm = format!(
            "alloc = {{ points = [[1, 1]] }}\n{}",
            &REST[..REST.find("[vmm]").unwrap()]
        );
        let err = CostModel::from_toml_str(&no_vmm, "x.toml").unwrap_err().to_string();
        assert!(err.contains("vmm"), "{err}");
        let negative = format!(
            "alloc = {{ points = [[1, 1]] }}\n{}",
            REST.replace("create_ns = 5", "create_ns = -5")
        );
        let err = CostModel::from_toml_str(&negative, "x.toml").unwrap_err().to_string();
        assert!(err.contains("negative"), "{err}");
    }

    /// A price past one second a call is refused with the file, line and key: flat numbers
    /// (the issue's `free_sync_ns = i64::MAX` made passthrough look cheaper than under the
    /// default model, its totals wrapping), and curve points.
    #[test]
    fn prices_past_one_second_a_call_name_their_file_line_and_key() {
        let ok = format!("alloc = {{ points = [[1, 1]] }}\n{REST}");
        for (from, to, key, line) in [
            (
                "free_sync_ns = 0",
                "free_sync_ns = 9223372036854775807",
                "free_sync_ns",
                3,
            ),
            ("map_ns = 1", "map_ns = 1000000001", "vmm.map_ns", 12),
            ("create_ns = 5", "create_ns = 2000000000", "vmm.create_ns", 11),
            (
                "create_ns = 5",
                "create_ns = { points = [[1, 5], [\"2MiB\", 5000000000]] }",
                "vmm.create_ns",
                11,
            ),
            (
                "free = { points = [[1, 1]] }",
                "free = { points = [[1, 5000000000]] }",
                "free",
                2,
            ),
        ] {
            let text = ok.replace(from, to);
            let err = CostModel::from_toml_str(&text, "x.toml").unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("x.toml:{line}")) && msg.contains("more than one second"),
                "{to}: {msg}"
            );
            assert!(msg.contains(key), "{to}: {msg}");
        }
        let edge = ok.replace("map_ns = 1", &format!("map_ns = {MAX_PRICE_NS}"));
        assert_eq!(
            CostModel::from_toml_str(&edge, "x.toml").unwrap().vmm.map_ns,
            MAX_PRICE_NS
        );
    }
}
