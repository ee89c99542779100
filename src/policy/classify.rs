//! Size classes: their statistics (a few adds on the hot path), the route each class wants
//! ([`want`], pure) and the hysteresis that turns wants into route changes ([`settle`], pure).

use super::RoutingPolicy;
use super::constants::{RING, SIZES};
use crate::stats::Counter;
use crate::strategy::StrategyKind;

/// Size classes for routing: one per power of two (class `b` holds sizes 2^b .. 2^(b+1)-1).
pub const BUCKETS: usize = 64;

/// The routing class of a request. Cost: one instruction.
#[inline]
pub fn bucket_of(bytes: u64) -> usize {
    (63 - bytes.max(1).leading_zeros()) as usize
}

/// The smallest and largest size of class `b`.
pub fn bucket_range(b: usize) -> (u64, u64) {
    let lo = 1u64 << b;
    (lo, if b >= 63 { u64::MAX } else { (lo << 1) - 1 })
}

/// A class's name: its size range, "1MiB..2MiB".
pub fn class_name(b: usize) -> String {
    let (lo, hi) = bucket_range(b);
    format!(
        "{}..{}",
        crate::size::ByteSize(lo),
        crate::size::ByteSize(hi.saturating_add(1))
    )
}

/// The last [`RING`] values of a quantity, for quantiles.
#[derive(Clone, Debug)]
pub(crate) struct Ring {
    values: Vec<u64>,
    pos: usize,
}

impl Ring {
    fn new() -> Self {
        Ring {
            values: Vec::new(),
            pos: 0,
        }
    }
    #[inline]
    fn push(&mut self, v: u64) {
        if self.values.len() < RING {
            self.values.push(v);
        } else {
            self.values[self.pos] = v;
            self.pos = (self.pos + 1) % RING;
        }
    }

    /// The 50th, 90th and 99th percentiles (slow path: a sort of at most [`RING`] values).
    pub(crate) fn quantiles(&self) -> Option<[f64; 3]> {
        if self.values.is_empty() {
            return None;
        }
        let mut sorted = self.values.clone();
        sorted.sort_unstable();
        Some([quantile(&sorted, 0.5), quantile(&sorted, 0.9), quantile(&sorted, 0.99)])
    }
}

/// The `tau` quantile of non-empty `sorted` values by the median-unbiased estimator (Hyndman and
/// Fan's type 8, R's `quantile(type = 8)`): position h = (n + 1/3) tau + 1/3 (1-based), linear
/// between the values on either side, clamped to the smallest and largest.
fn quantile(sorted: &[u64], tau: f64) -> f64 {
    let n = sorted.len();
    let h = (n as f64 + 1.0 / 3.0) * tau + 1.0 / 3.0;
    let hf = h as usize;
    if hf == 0 {
        return sorted[0] as f64;
    }
    if hf >= n {
        return sorted[n - 1] as f64;
    }
    let (a, b) = (sorted[hf - 1] as f64, sorted[hf] as f64);
    a + (h - hf as f64) * (b - a)
}

/// What the engine knows of one size class: totals for the report, and a window since the last
/// routing decision.
#[derive(Clone, Debug)]
pub(crate) struct ClassStats {
    pub requests: u64,
    pub bytes: u64,
    pub frees: u64,
    pub live: Counter,
    pub live_blocks: u64,
    /// Most blocks of the class live at once in the window.
    pub w_peak_blocks: u64,
    pub reuse_hits: u64,
    /// Freed blocks of this class not yet followed by a request of the class.
    waiting: u64,
    last_free_op: u64,
    pub lifetimes: Ring,
    pub reuse_distances: Ring,
    pub w_requests: u64,
    pub w_reuse_hits: u64,
    /// Requests of the class in the window that made driver calls.
    pub w_misses: u64,
    w_sizes: [u64; SIZES],
    /// Distinct sizes in the window, SIZES + 1 meaning "more than SIZES".
    pub w_distinct: u8,
    pub all_distinct: u8,
    all_sizes: [u64; SIZES],
    /// A route wanted at the last decisions but not yet taken, and for how many in a row.
    pub pending: Option<(usize, u32)>,
}

impl ClassStats {
    pub fn new() -> Self {
        ClassStats {
            requests: 0,
            bytes: 0,
            frees: 0,
            live: Counter::default(),
            live_blocks: 0,
            w_peak_blocks: 0,
            reuse_hits: 0,
            waiting: 0,
            last_free_op: 0,
            lifetimes: Ring::new(),
            reuse_distances: Ring::new(),
            w_requests: 0,
            w_reuse_hits: 0,
            w_misses: 0,
            w_sizes: [0; SIZES],
            w_distinct: 0,
            all_distinct: 0,
            all_sizes: [0; SIZES],
            pending: None,
        }
    }

    /// A request of `bytes` at operation `op` (hot path: a few adds and a scan of 4 sizes).
    #[inline]
    pub fn on_alloc(&mut self, bytes: u64, op: u64) {
        self.requests += 1;
        self.w_requests += 1;
        self.bytes += bytes;
        self.live.add(bytes);
        self.live_blocks += 1;
        self.w_peak_blocks = self.w_peak_blocks.max(self.live_blocks);
        if self.waiting > 0 {
            self.waiting -= 1;
            self.reuse_hits += 1;
            self.w_reuse_hits += 1;
            self.reuse_distances.push(op - self.last_free_op);
        }
        note_size(&mut self.w_sizes, &mut self.w_distinct, bytes);
        note_size(&mut self.all_sizes, &mut self.all_distinct, bytes);
    }

    /// A free of a block of `bytes` that lived `lifetime_ops` (hot path: a few adds).
    #[inline]
    pub fn on_free(&mut self, bytes: u64, lifetime_ops: u64, op: u64) {
        self.frees += 1;
        self.live.sub(bytes);
        self.live_blocks -= 1;
        self.waiting += 1;
        self.last_free_op = op;
        self.lifetimes.push(lifetime_ops);
    }

    /// Starts a new window (after a routing decision on the class).
    pub fn new_window(&mut self) {
        self.w_requests = 0;
        self.w_reuse_hits = 0;
        self.w_misses = 0;
        self.w_distinct = 0;
        self.w_peak_blocks = self.live_blocks;
    }
}

#[inline]
fn note_size(sizes: &mut [u64; SIZES], distinct: &mut u8, size: u64) {
    if *distinct as usize > SIZES {
        return; // saturated: "more than SIZES" already, no need to scan
    }
    let n = *distinct as usize;
    if sizes[..n].contains(&size) {
        return;
    }
    if n < SIZES {
        sizes[n] = size;
        *distinct += 1;
    } else {
        *distinct = SIZES as u8 + 1;
    }
}

/// A class's window as [`want`] reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Window {
    /// The smallest size of the class.
    pub min_bytes: u64,
    /// Fraction of the window's requests that found a freed block of the class waiting.
    pub reuse: f64,
    pub distinct: u8,
    pub peak_blocks: u64,
    /// The class is in the slabs and made no driver call in the window, and what the allocator
    /// holds plus the class's peak would pass the engine's
    /// [`cache_bound`](super::assess::Plan::cache_bound).
    pub stays_in_slabs: bool,
}

impl Window {
    pub fn of(c: &ClassStats, min_bytes: u64, in_slabs: bool, reserved: u64, cache_bound: u64) -> Self {
        Window {
            min_bytes,
            reuse: c.w_reuse_hits as f64 / c.w_requests as f64,
            distinct: c.w_distinct,
            peak_blocks: c.w_peak_blocks,
            // A class the slabs serve without a driver call stays there, however cacheable,
            // where its blocks cached beside the slab holes they leave would take the held
            // memory past the cache bound (the workload's peak, with a margin, plus
            // `bounds.spare_share` of the memory beyond it): the idle bound would strip the
            // cache again on every cycle (the 17 workloads repeated 5 times at 2x peak live:
            // 8,381 driver calls with the move, 901 without; gpu-small-fwd-fp32 and the
            // gpu-medium inference traces make 5-21% of passthrough's calls with it, 0.2-1.2%
            // without), and near passthrough's minimum exact-size blocks strand what slabs
            // would share (the bound without the margin: one more failing run at the exact
            // minimum). Where the device has the room, the cache's O(1) reuse is the faster host
            // path: one size allocated and freed in a loop, 744 instructions a pair in the
            // cache against 1,590 in slabs (callgrind, examples/hotpath).
            stays_in_slabs: in_slabs && c.w_misses == 0 && reserved.saturating_add(c.live.peak) > cache_bound,
        }
    }
}

/// The route a class wants: passthrough from `routing.passthrough_min` up; exact-size caching
/// for few sizes that are reused and few live at once (unless it stays in the slabs);
/// suballocation otherwise.
pub(crate) fn want(w: &Window, r: &RoutingPolicy) -> StrategyKind {
    if w.min_bytes >= r.passthrough_min.0 {
        StrategyKind::Passthrough
    } else if (w.distinct as u32) <= r.cache_max_distinct_sizes
        && w.reuse >= r.cache_min_reuse
        && w.peak_blocks <= r.cache_max_live_blocks
        && !w.stays_in_slabs
    {
        StrategyKind::Caching
    } else {
        StrategyKind::Suballoc
    }
}

/// Hysteresis: a class moves to `want` (a strategy index) only after wanting it at `hysteresis`
/// decisions in a row. Returns the new pending state and whether to move now.
pub(crate) fn settle(
    pending: Option<(usize, u32)>,
    want: usize,
    route: usize,
    hysteresis: u32,
) -> (Option<(usize, u32)>, bool) {
    if want == route {
        return (None, false);
    }
    let count = match pending {
        Some((idx, n)) if idx == want => n + 1,
        _ => 1,
    };
    if count < hysteresis.max(1) {
        (Some((want, count)), false)
    } else {
        (None, true)
    }
}

/// "4", or "more than 4" for a saturated count.
pub(crate) fn distinct_text(n: u8) -> String {
    if n as usize > SIZES {
        format!("more than {SIZES}")
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size::{ByteSize, KIB, MIB};

    #[test]
    fn classes_are_powers_of_two() {
        assert_eq!(
            (bucket_of(0), bucket_of(1), bucket_of(4095), bucket_of(4096)),
            (0, 0, 11, 12)
        );
        assert_eq!(bucket_range(12), (4096, 8191));
        assert_eq!(bucket_range(63).1, u64::MAX);
        assert_eq!(class_name(20), "1MiB..2MiB");
    }

    /// R's quantile(1:10, c(0.5, 0.9, 0.99), type = 8): 5.5, 9.6333, 10 (clamped).
    #[test]
    fn quantiles_are_type_8() {
        let mut r = Ring::new();
        for v in [4, 1, 10, 3, 2, 9, 5, 8, 6, 7] {
            r.push(v);
        }
        let [p50, p90, p99] = r.quantiles().unwrap();
        assert_eq!(p50, 5.5);
        assert!((p90 - (9.0 + 1.9 / 3.0)).abs() < 1e-9, "{p90}");
        assert_eq!(p99, 10.0);
        assert_eq!(Ring::new().quantiles(), None);
    }

    #[test]
    fn distinct_sizes_saturate_past_four() {
        let mut c = ClassStats::new();
        for (i, size) in [1, 2, 2, 3, 4].into_iter().enumerate() {
            c.on_alloc(size, i as u64);
        }
        assert_eq!(c.w_distinct, 4);
        c.on_alloc(5, 9);
        assert_eq!((c.w_distinct, distinct_text(c.w_distinct)), (5, "more than 4".into()));
    }

    #[test]
    fn reuse_counts_frees_followed_by_a_request() {
        let mut c = ClassStats::new();
        c.on_alloc(64, 1);
        c.on_free(64, 1, 2);
        c.on_alloc(64, 5);
        c.on_alloc(64, 6);
        assert_eq!((c.w_requests, c.w_reuse_hits), (3, 1));
        assert_eq!(c.reuse_distances.quantiles().unwrap()[0], 3.0);
        c.new_window();
        assert_eq!((c.w_requests, c.w_peak_blocks), (0, 2));
    }

    /// Each routing rule by name: the window that triggers it and the route it gives.
    #[test]
    fn want_rules() {
        let r = RoutingPolicy::default();
        let cacheable = Window {
            min_bytes: 64 * KIB,
            reuse: 0.9,
            distinct: 1,
            peak_blocks: 4,
            stays_in_slabs: false,
        };
        let rows: [(&str, Window, StrategyKind); 6] = [
            ("few reused sizes, few live: caching", cacheable, StrategyKind::Caching),
            (
                "at passthrough_min: passthrough",
                Window {
                    min_bytes: r.passthrough_min.0,
                    ..cacheable
                },
                StrategyKind::Passthrough,
            ),
            (
                "too many sizes: suballoc",
                Window {
                    distinct: r.cache_max_distinct_sizes as u8 + 1,
                    ..cacheable
                },
                StrategyKind::Suballoc,
            ),
            (
                "too little reuse: suballoc",
                Window {
                    reuse: 0.0,
                    ..cacheable
                },
                StrategyKind::Suballoc,
            ),
            (
                "too many live: suballoc",
                Window {
                    peak_blocks: r.cache_max_live_blocks + 1,
                    ..cacheable
                },
                StrategyKind::Suballoc,
            ),
            (
                "served by slabs and caching would pass the cache bound: stays",
                Window {
                    stays_in_slabs: true,
                    ..cacheable
                },
                StrategyKind::Suballoc,
            ),
        ];
        for (name, w, kind) in rows {
            assert_eq!(want(&w, &r), kind, "{name} ({})", ByteSize(w.min_bytes));
        }
    }

    #[test]
    fn stays_in_slabs_needs_no_misses_and_the_cache_bound_passed() {
        let mut c = ClassStats::new();
        c.on_alloc(MIB, 0);
        c.w_requests = 1;
        assert!(Window::of(&c, MIB, true, 10 * MIB, 10 * MIB).stays_in_slabs);
        assert!(
            !Window::of(&c, MIB, true, 8 * MIB, 10 * MIB).stays_in_slabs,
            "fits the bound"
        );
        assert!(
            !Window::of(&c, MIB, false, 10 * MIB, 10 * MIB).stays_in_slabs,
            "not in slabs"
        );
        c.w_misses = 1;
        assert!(
            !Window::of(&c, MIB, true, 10 * MIB, 10 * MIB).stays_in_slabs,
            "it missed"
        );
    }

    #[test]
    fn hysteresis_moves_after_n_wants_in_a_row() {
        assert_eq!(settle(None, 1, 1, 3), (None, false), "already there");
        assert_eq!(settle(None, 2, 1, 3), (Some((2, 1)), false));
        assert_eq!(settle(Some((2, 1)), 2, 1, 3), (Some((2, 2)), false));
        assert_eq!(settle(Some((2, 2)), 2, 1, 3), (None, true));
        assert_eq!(
            settle(Some((2, 2)), 0, 1, 3),
            (Some((0, 1)), false),
            "a new want restarts"
        );
        assert_eq!(settle(None, 2, 1, 0), (None, true), "0 acts as 1");
    }
}
