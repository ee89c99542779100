//! `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF`, as PyTorch's `CUDAAllocatorConfig` parses
//! it: comma-separated `key:value` pairs. Values are checked as PyTorch checks them, and an
//! unknown key is an error that names it (PyTorch raises on unknown keys too).

use adaptalloc::size::MIB;

/// PyTorch's size constants (c10/cuda/CUDACachingAllocator.cpp).
pub mod consts {
    use adaptalloc::size::MIB;
    /// Every request rounds up to a multiple of this (`kMinBlockSize`).
    pub const MIN_BLOCK: u64 = 512;
    /// Requests up to this go to the small pool (`kSmallSize`).
    pub const SMALL_SIZE: u64 = MIB;
    /// The small pool's segment (`kSmallBuffer`), and its expandable page.
    pub const SMALL_BUFFER: u64 = 2 * MIB;
    /// The segment of a large request under [`MIN_LARGE_ALLOC`] (`kLargeBuffer`), and the
    /// large pool's expandable page.
    pub const LARGE_BUFFER: u64 = 20 * MIB;
    /// From here a large request gets a segment of its own size (`kMinLargeAlloc`).
    pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
    /// ... rounded up to this (`kRoundLarge`).
    pub const ROUND_LARGE: u64 = 2 * MIB;
    /// `roundup_power2_divisions` has one setting per power-of-two interval from 1 MiB to 64 GiB.
    pub const ROUNDUP_INTERVALS: usize = 16;
}

/// A `PYTORCH_CUDA_ALLOC_CONF` that the `pytorch` peer models.
#[derive(Clone, Debug, PartialEq)]
pub struct PytorchConf {
    /// `max_split_size_mb`: blocks of this size or more are never split (and are not used for
    /// smaller requests). `u64::MAX` (the default) means unlimited.
    pub max_split_size: u64,
    /// `max_non_split_rounding_mb`: a request of `max_split_size` or more may take a cached
    /// oversize block at most this much larger (default 20 MiB, `kLargeBuffer`).
    pub max_non_split_rounding: u64,
    /// `roundup_power2_divisions`: per power-of-two interval from 1 MiB (index 0) to 64 GiB,
    /// how many steps to round a request to (0 or 1: plain 512-byte rounding).
    pub roundup_power2_divisions: [u64; consts::ROUNDUP_INTERVALS],
    /// `garbage_collection_threshold` (0 = off). PyTorch acts on it only when a per-process
    /// memory fraction is set ([`memory_fraction`](Self::memory_fraction)).
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`.
    pub expandable_segments: bool,
    /// `torch.cuda.set_per_process_memory_fraction(F)`: not a configuration key in PyTorch but
    /// a call; the peer takes it as `per_process_memory_fraction:F` so that garbage collection
    /// can be modelled (PyTorch's collector runs only with a fraction set).
    pub memory_fraction: Option<f64>,
}

impl Default for PytorchConf {
    /// PyTorch's defaults: unlimited split size, no power-of-two rounding, no garbage
    /// collection, no expandable segments.
    fn default() -> Self {
        PytorchConf {
            max_split_size: u64::MAX,
            max_non_split_rounding: consts::LARGE_BUFFER,
            roundup_power2_divisions: [0; consts::ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            memory_fraction: None,
        }
    }
}

/// A configuration string PyTorch would refuse, or that the peer cannot model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PyTorch allocator setting {key:?} = {value:?}: {reason}")]
pub struct ConfError {
    pub key: String,
    pub value: String,
    pub reason: String,
}

/// Keys PyTorch accepts that change nothing the peer models (host memory, locking, graphs).
const IGNORED_KEYS: [&str; 5] = [
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "release_lock_on_cudamalloc",
    "graph_capture_record_stream_reuse",
];

const KNOWN: &str = "max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, \
                     garbage_collection_threshold, expandable_segments, backend, per_process_memory_fraction";

impl std::str::FromStr for PytorchConf {
    type Err = ConfError;

    fn from_str(s: &str) -> Result<Self, ConfError> {
        let mut conf = PytorchConf::default();
        for item in split_top_level(s) {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let err = |key: &str, value: &str, reason: String| ConfError {
                key: key.into(),
                value: value.into(),
                reason,
            };
            let (key, value) = item
                .split_once(':')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| err(item, "", "write key:value, e.g. max_split_size_mb:128".into()))?;
            let mb = |v: &str| -> Result<u64, ConfError> {
                v.parse::<u64>()
                    .map_err(|_| err(key, v, "give a whole number of MiB".into()))
            };
            match key {
                "max_split_size_mb" => {
                    let v = mb(value)?;
                    // PyTorch: "must be > 20" (kLargeBuffer in MiB).
                    if v <= consts::LARGE_BUFFER / MIB {
                        return Err(err(key, value, "too small: PyTorch requires more than 20".into()));
                    }
                    conf.max_split_size = v.saturating_mul(MIB);
                }
                "max_non_split_rounding_mb" => {
                    let v = mb(value)?;
                    if v == 0 {
                        return Err(err(key, value, "give a positive number of MiB".into()));
                    }
                    conf.max_non_split_rounding = v.saturating_mul(MIB);
                }
                "roundup_power2_divisions" => conf.roundup_power2_divisions = parse_divisions(value, &err)?,
                "garbage_collection_threshold" => {
                    let v: f64 = value
                        .parse()
                        .map_err(|_| err(key, value, "give a number between 0 and 1".into()))?;
                    if !(v > 0.0 && v < 1.0) {
                        return Err(err(key, value, "PyTorch requires 0 < threshold < 1".into()));
                    }
                    conf.garbage_collection_threshold = v;
                }
                "expandable_segments" => {
                    conf.expandable_segments = match value {
                        "True" | "true" => true,
                        "False" | "false" => false,
                        _ => return Err(err(key, value, "give True or False".into())),
                    }
                }
                "backend" => match value {
                    "native" => {}
                    "cudaMallocAsync" => {
                        return Err(err(
                            key,
                            value,
                            "that backend is CUDA's stream-ordered pool: compare the `cuda-async` peer".into(),
                        ));
                    }
                    _ => return Err(err(key, value, "PyTorch knows native and cudaMallocAsync".into())),
                },
                "per_process_memory_fraction" => {
                    let v: f64 = value
                        .parse()
                        .map_err(|_| err(key, value, "give a number in (0, 1]".into()))?;
                    if !(v > 0.0 && v <= 1.0) {
                        return Err(err(key, value, "give a number in (0, 1]".into()));
                    }
                    conf.memory_fraction = Some(v);
                }
                k if IGNORED_KEYS.contains(&k) => {}
                _ => return Err(err(key, value, format!("unknown key; known: {KNOWN}"))),
            }
        }
        Ok(conf)
    }
}

/// Splits at commas outside `[...]` (the list form of `roundup_power2_divisions`).
fn split_top_level(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// `4` (every interval) or `[256:1,512:2,>:4]` (intervals from a power-of-two MiB size; `>`
/// for the rest), each a power of two, as PyTorch parses them.
fn parse_divisions(
    value: &str,
    err: &impl Fn(&str, &str, String) -> ConfError,
) -> Result<[u64; consts::ROUNDUP_INTERVALS], ConfError> {
    let key = "roundup_power2_divisions";
    let pow2 = |v: &str| -> Result<u64, ConfError> {
        match v.trim().parse::<u64>() {
            Ok(n) if n.is_power_of_two() => Ok(n),
            _ => Err(err(
                key,
                value,
                format!("{v:?}: each division count must be a power of two"),
            )),
        }
    };
    let mut out = [0; consts::ROUNDUP_INTERVALS];
    let Some(list) = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) else {
        out.fill(pow2(value)?);
        return Ok(out);
    };
    // The first interval no entry has set yet: each entry fills from there to its own interval.
    let mut next = 0usize;
    let last = consts::ROUNDUP_INTERVALS - 1;
    for pair in list.split(',') {
        let (size, div) = pair
            .split_once(':')
            .ok_or_else(|| err(key, value, format!("{pair:?}: write SIZE_MB:DIVISIONS")))?;
        let div = pow2(div)?;
        if size.trim() == ">" {
            out[next..].fill(div);
            continue;
        }
        let mb: u64 = size
            .trim()
            .parse()
            .ok()
            .filter(|m: &u64| m.is_power_of_two())
            .ok_or_else(|| err(key, value, format!("{size:?}: sizes must be powers of two (MiB)")))?;
        let index = (mb.trailing_zeros() as usize).min(last);
        out[next..=index.max(next).min(last)].fill(div);
        next = index + 1;
    }
    Ok(out)
}

impl PytorchConf {
    /// `round_size`: what a request of `size` bytes becomes.
    /// None when the rounded size does not fit in 64 bits (no device holds such a request).
    pub fn round_size(&self, size: u64) -> Option<u64> {
        use consts::MIN_BLOCK;
        if size < MIN_BLOCK {
            return Some(MIN_BLOCK);
        }
        let divisions = self.divisions_for(size);
        if divisions > 1 && size > MIN_BLOCK * divisions {
            roundup_power2_next_division(size, divisions)
        } else {
            size.checked_next_multiple_of(MIN_BLOCK)
        }
    }

    fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - size.leading_zeros() as i64;
        let index = (log - 20).clamp(0, consts::ROUNDUP_INTERVALS as i64 - 1);
        self.roundup_power2_divisions[index as usize]
    }
}

/// PyTorch's `roundup_power2_next_division`: the next of `divisions` equal steps between
/// the powers of two around `size`.
fn roundup_power2_next_division(size: u64, divisions: u64) -> Option<u64> {
    if size.is_power_of_two() {
        return Some(size);
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor.checked_mul(2);
    }
    let down = size & !(step - 1);
    if down == size {
        Some(size)
    } else {
        down.checked_add(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_keys_parse_and_bad_values_name_their_key() {
        let c: PytorchConf =
            "max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.8,expandable_segments:True"
                .parse()
                .unwrap();
        assert_eq!(c.max_split_size, 128 * MIB);
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
        assert_eq!(c.garbage_collection_threshold, 0.8);
        assert!(c.expandable_segments);
        assert_eq!("".parse::<PytorchConf>().unwrap(), PytorchConf::default());
        for (bad, key) in [
            ("max_split_size_mb:20", "max_split_size_mb"),
            ("max_split_size_mb:lots", "max_split_size_mb"),
            ("roundup_power2_divisions:3", "roundup_power2_divisions"),
            ("garbage_collection_threshold:1.0", "garbage_collection_threshold"),
            ("expandable_segments:yes", "expandable_segments"),
            ("max_spilt_size_mb:128", "max_spilt_size_mb"),
            ("backend:cudaMallocAsync", "backend"),
        ] {
            let e = bad.parse::<PytorchConf>().unwrap_err();
            assert_eq!(e.key, key, "{bad}");
            assert!(e.to_string().contains(key), "{e}");
        }
        let e = "max_spilt_size_mb:128".parse::<PytorchConf>().unwrap_err();
        assert!(e.reason.contains("max_split_size_mb"), "lists the known keys: {e}");
    }

    #[test]
    fn rounding_follows_pytorch() {
        let d = PytorchConf::default();
        assert_eq!(d.round_size(1), Some(512));
        assert_eq!(d.round_size(513), Some(1024));
        assert_eq!(d.round_size(3 * MIB + 1), Some(3 * MIB + 512));
        let four: PytorchConf = "roundup_power2_divisions:4".parse().unwrap();
        // 1 MiB..2 MiB in four steps of 256 KiB.
        assert_eq!(four.round_size(MIB + 1), Some(MIB + 256 * 1024));
        assert_eq!(four.round_size(2 * MIB), Some(2 * MIB));
        // At or below 512 B x divisions, plain rounding.
        assert_eq!(four.round_size(1500), Some(1536));
        // The list form: 1 division up to 256 MiB's interval, 4 after.
        let list: PytorchConf = "roundup_power2_divisions:[256:1,>:4]".parse().unwrap();
        assert_eq!(list.roundup_power2_divisions[8], 1);
        assert_eq!(list.roundup_power2_divisions[9], 4);
        assert_eq!(list.round_size(300 * MIB), Some(300 * MIB));
        assert_eq!(
            list.round_size(600 * MIB),
            Some(640 * MIB),
            "512 MiB..1 GiB in four steps"
        );
        assert_eq!(list.round_size(3 * MIB + 1), Some(3 * MIB + 512));
        // Past what 64 bits hold: no size, never a wrapped small one.
        assert_eq!(d.round_size(u64::MAX - 100), None);
        assert_eq!(four.round_size(u64::MAX - (1 << 40)), None);
        let three: PytorchConf = "roundup_power2_divisions:[1:2,4:4,>:8]".parse().unwrap();
        let mut want = [8; 16];
        want[..3].copy_from_slice(&[2, 4, 4]);
        assert_eq!(
            three.roundup_power2_divisions, want,
            "each entry fills up to its interval"
        );
    }
}
