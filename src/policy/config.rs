//! The policy schema: the built-in default, the TOML files in `policies/` and what the tuner
//! recommends, with validation of every value. Every key is documented in
//! `policies/default.toml`.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::ConfigError;
use crate::size::ByteSize;
use crate::strategy::{SlabBacking, StrategyKind};

/// A size, or a fraction of the device's total memory ("5%", 0.05).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SizeOrFraction {
    /// A size in bytes ("512MiB").
    Bytes(u64),
    /// A share of the device's memory ("25%" or 0.25).
    Fraction(f64),
}

impl SizeOrFraction {
    /// Bytes on a device of `total` bytes.
    pub fn resolve(self, total: u64) -> u64 {
        match self {
            SizeOrFraction::Bytes(b) => b,
            SizeOrFraction::Fraction(f) => (total as f64 * f) as u64,
        }
    }
}

impl fmt::Display for SizeOrFraction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeOrFraction::Bytes(b) => write!(f, "{}", ByteSize(*b)),
            SizeOrFraction::Fraction(x) => write!(f, "{}%", (x * 1000.0).round() / 10.0),
        }
    }
}

impl Serialize for SizeOrFraction {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SizeOrFraction::Bytes(b) => ByteSize(*b).serialize(s),
            SizeOrFraction::Fraction(_) => s.serialize_str(&self.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for SizeOrFraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = SizeOrFraction;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size (\"512MiB\", 4096) or a fraction of device memory (\"5%\", 0.05)")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(SizeOrFraction::Bytes(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                u64::try_from(v)
                    .map(SizeOrFraction::Bytes)
                    .map_err(|_| E::custom(format!("cannot be negative (got {v})")))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
                if (0.0..=1.0).contains(&v) {
                    Ok(SizeOrFraction::Fraction(v))
                } else {
                    Err(E::custom(format!(
                        "a fraction must be within 0..1 (got {v}); write sizes as \"512MiB\""
                    )))
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                if let Some(pct) = v.trim().strip_suffix('%') {
                    let x: f64 = pct
                        .trim()
                        .parse()
                        .map_err(|_| E::custom(format!("bad percentage {v:?}")))?;
                    if !(0.0..=100.0).contains(&x) {
                        return Err(E::custom(format!("a percentage must be within 0..100 (got {v:?})")));
                    }
                    return Ok(SizeOrFraction::Fraction(x / 100.0));
                }
                v.parse::<ByteSize>()
                    .map(|b| SizeOrFraction::Bytes(b.0))
                    .map_err(E::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// How requests are routed to strategies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingPolicy {
    /// `adaptive`: the engine routes each size class and re-routes as the workload changes.
    /// Any strategy name (`passthrough`, `caching`, `suballoc`): every request goes there.
    pub mode: RoutingMode,
    /// Requests at least this big always go to passthrough (a slab or cache would only add waste).
    pub passthrough_min: ByteSize,
    /// A size class whose requests use at most this many distinct sizes, and whose freed blocks
    /// are wanted again, is cached (exact-size blocks: no fragmentation, O(1) reuse).
    pub cache_max_distinct_sizes: u32,
    /// Fraction of a class's requests that must find a freed block of their size waiting for the
    /// class to be cached.
    pub cache_min_reuse: f64,
    /// ... and whose blocks are at most this many live at once: then a cache needs that many
    /// driver allocations in all, fewer than slabs would. A class the slabs serve without
    /// driver calls stays there where its cached blocks would take what is held past the
    /// workload's peak (with a margin, see `bounds.peak_growth`) plus `bounds.spare_share` of
    /// the memory beyond it.
    pub cache_max_live_blocks: u64,
    /// Operations between routing decisions.
    pub interval_ops: u64,
    /// Requests a class needs in a window before its route may change.
    pub min_samples: u64,
    /// Consecutive windows that must agree before a route changes (no flapping).
    pub hysteresis: u32,
    /// While the device is tight (`bounds.tight_below`), requests under 1 MiB get exact-size
    /// cached blocks instead of slab space: a slab page holding one small live block pins 2 MiB.
    pub small_exact_when_tight: bool,
}

/// `adaptive`, or one fixed strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoutingMode {
    /// The engine routes each size class.
    Adaptive,
    /// Every request to the driver.
    Passthrough,
    /// Every request to the cache.
    Caching,
    /// Every request to the suballocator.
    Suballoc,
}

impl RoutingMode {
    /// The one strategy a fixed mode sends every request to; None under adaptive routing.
    pub fn fixed(self) -> Option<StrategyKind> {
        match self {
            RoutingMode::Adaptive => None,
            RoutingMode::Passthrough => Some(StrategyKind::Passthrough),
            RoutingMode::Caching => Some(StrategyKind::Caching),
            RoutingMode::Suballoc => Some(StrategyKind::Suballoc),
        }
    }
}

impl Default for RoutingPolicy {
    fn default() -> Self {
        RoutingPolicy {
            mode: RoutingMode::Adaptive,
            passthrough_min: ByteSize(4 << 30),
            cache_max_distinct_sizes: 2,
            cache_min_reuse: 0.9,
            cache_max_live_blocks: 4,
            interval_ops: 1024,
            min_samples: 32,
            hysteresis: 2,
            small_exact_when_tight: true,
        }
    }
}

/// Bounds on idle memory, from the device's free memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BoundsPolicy {
    /// Device memory kept free for others (other processes; cuBLAS, NCCL): idle memory is
    /// released whenever free memory would fall under it. Once the workload has shown its cycle,
    /// no more than what `spare_share` leaves others of the memory beyond the workload's peak
    /// (near passthrough's minimum that is less, and keeping more free there gave back every
    /// step pages the step took again).
    pub headroom: SizeOrFraction,
    /// Under this much free device memory the allocator is under pressure: it places
    /// compactly, takes exact-size driver allocations, and gives back idle memory until free
    /// memory is back at the headroom (or at the watermark, where that is higher).
    pub low_watermark: SizeOrFraction,
    /// Under this much free device memory, while the slabs strand more than half the strand
    /// guard's budget, the device is "tight": small requests get exact-size cached blocks
    /// (`routing.small_exact_when_tight`), slabs grow by `suballoc.growth` and are segregated
    /// by size class where `suballoc.segregate` says so. It ends once free memory, counting the
    /// cache's idle blocks, is over 1.5x this, or the slabs strand at most a quarter of the budget.
    /// Never tight once the workload's footprint has come back to its peak (its cycle repeats)
    /// with a quarter of the peak free at it, unless the device has under 8 pages or slabs are
    /// backed whole; nor, with slabs backed by pages, once what the allocator held at its
    /// highest leaves the headroom free (the cycle ran with its stranding).
    pub tight_below: SizeOrFraction,
    /// Idle blocks and empty slabs not reused within this many operations are released (0: never).
    pub idle_age_ops: u64,
    /// Operations between mem_info samples when no driver call forces one, at first: the gap
    /// doubles, up to 32 times this, while samples find free memory unchanged by others, over
    /// twice the headroom and the low watermark, and the device not near tight mode.
    pub mem_info_interval_ops: u64,
    /// Share of the memory expected free at the workload's peak that live blocks in slabs may
    /// strand: hold beyond what the driver would consume for them, where no release reaches
    /// (a small block alone in a 2 MiB page). Over it, a slab placement that would strand more
    /// gets an exact-size cached block instead (see `suballoc.strand_guard`). 0: never hold more
    /// than passthrough would; larger values let slabs pack more freely. Default a quarter (half
    /// failed more runs near the capacity; `assess::strand_budget` has the measurements). Once
    /// the workload's footprint has come back to its peak (its cycle repeats) with a quarter of
    /// the peak free at it, all of that memory (unless this is 0, or slabs are backed `auto`,
    /// whose handles this budget sizes, on a peak learned rather than given by `expected_peak`).
    pub strand_share: f64,
    /// Until the workload has shown a cycle (live memory fell under half its peak), its peak
    /// is taken to be this multiple of the peak so far when estimating the memory free at the
    /// peak; afterwards the peak so far.
    pub peak_growth: f64,
    /// What the allocator holds with idle memory in it never passes the workload's peak
    /// footprint plus this share of the memory beyond it (free device memory and what the
    /// allocator holds, less that peak; until a cycle is seen the peak is taken as
    /// `peak_growth` times the peak so far): the rest is left to other processes, which find it
    /// free when they ask (0.5: a co-tenant taking half of what passthrough would leave free
    /// gets it). No such bound where the rest is no more than `headroom`. Within that, while
    /// the slabs strand at most a quarter of the strand guard's budget (with the guard off:
    /// outside tight mode), idle memory is kept up to the same share of the memory expected
    /// free at the peak (see `peak_growth`); otherwise up to what the allocator held at its
    /// peak so far. 0: nothing idle beyond the workload's peak; 1: nothing left to others.
    pub spare_share: f64,
    /// The workload's peak footprint (what plain cudaMalloc would hold at its highest), where an
    /// earlier run showed it: the tuning report's advice writes it (`adaptalloc replay ...
    /// --report`). While the footprint stays within it, the engine takes it as the peak from
    /// the first request, as if the cycle had been seen and had come back to it: the strand
    /// guard may strand all the memory free beyond it, and under `suballoc.backing = "auto"`
    /// slabs get handles of that size from the start. Once the footprint passes it, the engine
    /// learns the peak as without it. None (the default): the peak is learned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_peak: Option<ByteSize>,
}

impl Default for BoundsPolicy {
    fn default() -> Self {
        BoundsPolicy {
            headroom: SizeOrFraction::Fraction(0.05),
            low_watermark: SizeOrFraction::Fraction(0.03),
            tight_below: SizeOrFraction::Fraction(0.35),
            idle_age_ops: 200_000,
            mem_info_interval_ops: 1024,
            strand_share: 0.25,
            peak_growth: 3.0,
            spare_share: 0.5,
            expected_peak: None,
        }
    }
}

/// Settings of the caching strategy when a class is cached.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CachingPolicy {
    /// `granule`: blocks are the request rounded to what the driver really consumes (no extra
    /// memory over passthrough); `log-linear`: 8 classes per power of two (<= 12.5% rounding,
    /// more reuse across near sizes).
    pub rounding: crate::strategy::Rounding,
}

impl Default for CachingPolicy {
    fn default() -> Self {
        CachingPolicy {
            rounding: crate::strategy::Rounding::Granule,
        }
    }
}

/// Settings of the suballocator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SuballocPolicy {
    /// Size. The smallest slab taken from the driver.
    pub min_slab: ByteSize,
    /// Size. The largest slab for requests that fit in it (bigger requests get a slab of their own size).
    pub max_slab: ByteSize,
    /// A new slab is about `growth` x the bytes its pool already reserves (the largest power of
    /// two under it for small requests; a whole number of requests for pools of 1 MiB and up),
    /// while the device is tight (free memory under `bounds.tight_below`).
    pub growth: f64,
    /// The same while the device has room: larger slabs, fewer driver calls.
    pub loose_growth: f64,
    /// Segregate slabs by size class (under 1 MiB; then one pool per power of two), so holes
    /// left by freed blocks fit the next request of their class: `always`, `never`, or
    /// `when-tight` (while free device memory is under `bounds.tight_below`: mixed slabs make
    /// fewer driver calls, segregated ones fragment less).
    pub segregate: Segregate,
    /// Where the device has virtual memory management, back slabs page by page and give back
    /// pages no live block touches when memory runs short (free space inside slabs is then
    /// never stranded).
    pub page_release: bool,
    /// How new slabs are backed where `page_release` is on: `auto` (the default: one physical
    /// handle per slab, pages where the device has no room for it whole; out of memory, or when
    /// other processes need memory, a handle live blocks touch in part is split, its live pages
    /// copied into pages of their own and the rest given back, so it strands no more than pages
    /// would), `pages` (one handle per device page: free memory inside slabs in use goes back a
    /// page at a time, with no copy; dearer to create, cheaper to hold near the capacity),
    /// `large-handles` (an eighth of the slab per handle), `blocks` (a handle shaped to each
    /// block as it is placed: the pages it covers whole in one handle, a page for each it may
    /// share) or `whole` (one driver allocation per slab, released only empty, never split).
    /// `auto` and `pages` keep the promise down to passthrough's exact minimum (the same
    /// robustness grid); the others are for a device known to have room (see BENCHMARKS.md for
    /// what each costs and fails).
    pub backing: SlabBacking,
    /// Under the adaptive policy, refuse slab placements that would strand memory beyond
    /// `bounds.strand_share` of the memory expected free at the peak; such requests get
    /// exact-size cached blocks. With it, what the allocator holds where no release can reach
    /// stays within what the device can spare at the workload's peak.
    pub strand_guard: bool,
}

/// When the suballocator segregates slabs by size class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Segregate {
    /// Always segregate.
    Always,
    /// Never.
    Never,
    /// While free device memory is under `bounds.tight_below`.
    WhenTight,
}

impl Default for SuballocPolicy {
    fn default() -> Self {
        SuballocPolicy {
            min_slab: ByteSize(2 << 20),
            max_slab: ByteSize(1 << 30),
            growth: 0.25,
            loose_growth: 0.25,
            segregate: Segregate::Never,
            page_release: true,
            backing: SlabBacking::Auto,
            strand_guard: true,
        }
    }
}

/// What to do when the device refuses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OomPolicy {
    /// Release idle memory (cached blocks, then empty slabs) and retry before failing.
    pub release_and_retry: bool,
}

impl Default for OomPolicy {
    fn default() -> Self {
        OomPolicy {
            release_and_retry: true,
        }
    }
}

/// A whole policy. Every section and key is optional in a file: what is absent keeps the
/// built-in default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// A note on what this policy is for.
    pub description: String,
    /// Where requests go.
    pub routing: RoutingPolicy,
    /// How much idle memory is kept, and when memory is short.
    pub bounds: BoundsPolicy,
    /// The cache's settings.
    pub caching: CachingPolicy,
    /// The suballocator's settings.
    pub suballoc: SuballocPolicy,
    /// What to do when the device refuses.
    pub oom: OomPolicy,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            description: DEFAULT_DESCRIPTION.into(),
            routing: RoutingPolicy::default(),
            bounds: BoundsPolicy::default(),
            caching: CachingPolicy::default(),
            suballoc: SuballocPolicy::default(),
            oom: OomPolicy::default(),
        }
    }
}

const DEFAULT_DESCRIPTION: &str =
    "zero-configuration default: adaptive routing, bounded idle memory, release and retry on OOM";

/// The presets shipped in `policies/`, by name.
pub const PRESETS: [(&str, &str); 6] = [
    ("default", include_str!("../../policies/default.toml")),
    ("training", include_str!("../../policies/training.toml")),
    ("inference-edge", include_str!("../../policies/inference-edge.toml")),
    ("multi-tenant", include_str!("../../policies/multi-tenant.toml")),
    (
        "benchmark-unbounded",
        include_str!("../../policies/benchmark-unbounded.toml"),
    ),
    ("passthrough", include_str!("../../policies/passthrough.toml")),
];

/// Keys policies once had, with what took their place: a file that still sets one is told so,
/// not only that the key is unknown.
const RETIRED: &[(&str, &str)] = &[
    (
        "bounds.pressure_max_idle",
        "retired: under the low watermark idle memory now goes back until free memory is at the \
         headroom again (or at the watermark, if higher); remove the key",
    ),
    (
        "bounds.max_idle",
        "retired: idle memory is kept up to what the workload held at its peak, within \
         `bounds.spare_share` of the memory beyond the peak, and goes back under the headroom \
         or by age (`bounds.idle_age_ops`); to keep more idle raise `bounds.spare_share`, to \
         keep less lower it; remove the key",
    ),
];

/// Adds what became of a retired key to the error that names it.
fn retired(mut e: ConfigError) -> ConfigError {
    if let ConfigError::Parse {
        key: Some(key),
        message,
        ..
    } = &mut e
        && let Some((_, why)) = RETIRED.iter().find(|(k, _)| k == key)
    {
        *message = format!("{message}; `{key}` was {why}");
    }
    e
}

impl Policy {
    /// Parses a policy from TOML text; `file` names it in errors. Nothing half-read is returned:
    /// either the whole file is valid or an error names the file, line and key.
    pub fn from_toml_str(text: &str, file: &str) -> Result<Self, ConfigError> {
        let policy: Policy = crate::config::parse(text, file).map_err(retired)?;
        policy.validate(file)?;
        Ok(policy)
    }

    /// A policy file; errors name the file, line and key.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let (file, text) = crate::config::read_file(path)?;
        Self::from_toml_str(&text, &file)
    }

    /// A preset by name (see [`PRESETS`]).
    pub fn preset(name: &str) -> Option<Self> {
        let (_, text) = PRESETS.iter().find(|(n, _)| *n == name)?;
        Some(Self::from_toml_str(text, &format!("policies/{name}.toml")).expect("presets parse (tested)"))
    }

    /// The policy named by `ADAPTALLOC_POLICY` (a file path or a preset name), else the default.
    pub fn from_env() -> Result<Self, ConfigError> {
        match std::env::var("ADAPTALLOC_POLICY") {
            Ok(v) if !v.trim().is_empty() => Self::load(v.trim()),
            _ => Ok(Self::default()),
        }
    }

    /// A preset by name, or else a policy file by path (a file of a preset's name wins).
    pub fn load(name_or_path: &str) -> Result<Self, ConfigError> {
        let path = Path::new(name_or_path);
        match Self::preset(name_or_path) {
            Some(p) if !path.exists() => Ok(p),
            // Neither a file nor a preset: say which presets there are.
            None if !path.exists() && path.extension().is_none() && !name_or_path.contains('/') => {
                Err(ConfigError::Read {
                    file: name_or_path.into(),
                    reason: format!(
                        "no such file, and not a preset (presets: {})",
                        PRESETS.map(|(name, _)| name).join(", ")
                    ),
                })
            }
            _ => Self::from_file(path),
        }
    }

    /// The policy as TOML, in the schema of `policies/default.toml`.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a policy always serializes")
    }

    /// Checks the bounds that depend on the device: the headroom and the low watermark must
    /// leave something of a device of `total` bytes, and an expected peak must fit in it
    /// (`file` names the policy in the error).
    pub fn check_fits(&self, file: &str, total: u64) -> Result<(), ConfigError> {
        let b = &self.bounds;
        if let Some(peak) = b.expected_peak.filter(|p| p.0 > total) {
            return Err(ConfigError::Invalid {
                file: file.into(),
                key: "bounds.expected_peak".into(),
                value: peak.to_string(),
                reason: format!(
                    "is more than the {} device holds: the workload cannot run here, or the peak is another \
                     workload's; set it from a run on this device (the tuning report's advice) or leave it out",
                    ByteSize(total)
                ),
            });
        }
        for (key, value) in [
            ("bounds.headroom", b.headroom),
            ("bounds.low_watermark", b.low_watermark),
        ] {
            if value.resolve(total) >= total {
                return Err(ConfigError::Invalid {
                    file: file.into(),
                    key: key.into(),
                    value: value.to_string(),
                    reason: format!(
                        "leaves nothing of a {} device; give a size under it or a fraction under 100%",
                        ByteSize(total)
                    ),
                });
            }
        }
        Ok(())
    }

    fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let bad = |key: &str, value: String, reason: &str| {
            Err(ConfigError::Invalid {
                file: file.into(),
                key: key.into(),
                value,
                reason: reason.into(),
            })
        };
        // A number that must lie in a closed range (NaN never does).
        let within = |key: &str, value: f64, lo: f64, hi: f64, reason: &str| {
            if (lo..=hi).contains(&value) {
                Ok(())
            } else {
                bad(key, value.to_string(), reason)
            }
        };
        let (r, s, b) = (&self.routing, &self.suballoc, &self.bounds);
        within(
            "routing.cache_min_reuse",
            r.cache_min_reuse,
            0.0,
            1.0,
            "a fraction within 0..1",
        )?;
        if r.interval_ops == 0 {
            return bad("routing.interval_ops", "0".into(), "at least 1 operation");
        }
        if s.min_slab.0 == 0 || s.min_slab > s.max_slab {
            return bad(
                "suballoc.min_slab",
                format!("{} (max_slab {})", s.min_slab, s.max_slab),
                "need 0 < min_slab <= max_slab",
            );
        }
        within(
            "suballoc.growth",
            s.growth,
            0.0,
            16.0,
            "a factor within 0..16 (0.25 is typical)",
        )?;
        within(
            "suballoc.loose_growth",
            s.loose_growth,
            0.0,
            16.0,
            "a factor within 0..16 (0.25 is the default)",
        )?;
        within(
            "bounds.strand_share",
            b.strand_share,
            0.0,
            f64::MAX,
            "a share of 0 or more (0.25 is the default; 0 never strands)",
        )?;
        within(
            "bounds.peak_growth",
            b.peak_growth,
            1.0,
            1000.0,
            "a factor within 1..1000 (3 is the default)",
        )?;
        within(
            "bounds.spare_share",
            b.spare_share,
            0.0,
            1.0,
            "a share within 0..1 (0.5 is the default; 0 keeps nothing idle beyond the workload's peak)",
        )?;
        if b.mem_info_interval_ops == 0 {
            return bad("bounds.mem_info_interval_ops", "0".into(), "at least 1 operation");
        }
        if b.expected_peak.is_some_and(|p| p.0 == 0) {
            return bad(
                "bounds.expected_peak",
                "0".into(),
                "a size over 0 (leave the key out where the peak is not known)",
            );
        }
        Ok(())
    }
}
