//! Whether the workload's footprint has come back to its peak: the sign that its cycle repeats
//! (a training step, a serving batch, a pass), so that the peak so far is the peak to plan for.

use super::constants::CYCLE_FALL_DIVISOR;

/// For passthrough's footprint at its peak so far: whether the footprint has fallen under half
/// of it since a sample first saw it, and then been exactly at it again. A workload that
/// repeats its steps (the same requests in the same order) comes back to the same peak byte
/// for byte. A random walk's running peak keeps rising, and rarely comes back to the very
/// byte without passing it: the falls alone, or a return to near the peak, did not tell the
/// two apart (see `assess::tight`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PeakRecurrence {
    /// The peak the last sample saw.
    peak: u64,
    /// The footprint has fallen under half of `peak` since (seen at a later sample).
    fell: bool,
    /// After the fall, the footprint was exactly at `peak` again.
    recurred: bool,
}

impl PeakRecurrence {
    /// After an allocation took the footprint to `current`. Hot path: one compare, true only
    /// at the peak.
    #[inline]
    pub fn on_alloc(&mut self, current: u64) {
        if current == self.peak && self.fell {
            self.recurred = true;
        }
    }

    /// At a sample, with the footprint's peak so far and its lowest since the previous sample
    /// (or now): whether the peak has come back. A new peak starts afresh, and a fall in the
    /// interval that raised it does not count (it may have come before the rise).
    pub fn at_sample(&mut self, peak: u64, low: u64) -> bool {
        if peak != self.peak {
            *self = PeakRecurrence {
                peak,
                ..PeakRecurrence::default()
            };
        } else if low < peak / CYCLE_FALL_DIVISOR {
            self.fell = true;
        }
        self.recurred
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_recurs_when_the_footprint_comes_back_to_it_exactly_after_a_fall() {
        let mut r = PeakRecurrence::default();
        assert!(!r.at_sample(100, 0), "a new peak");
        r.on_alloc(100);
        assert!(!r.at_sample(100, 60), "at the peak again without a fall under half");
        assert!(!r.at_sample(100, 49), "fell under half");
        r.on_alloc(99);
        assert!(!r.at_sample(100, 99), "back near the peak, not at it");
        r.on_alloc(100);
        assert!(r.at_sample(100, 100), "back at the peak exactly");
        assert!(r.at_sample(100, 10), "and it stays recurred");
        assert!(!r.at_sample(101, 10), "until a higher peak");
    }

    #[test]
    fn a_fall_in_the_interval_that_raised_the_peak_does_not_count() {
        let mut r = PeakRecurrence::default();
        assert!(
            !r.at_sample(100, 10),
            "raised to 100; the low of 10 may have come first"
        );
        r.on_alloc(100);
        assert!(!r.at_sample(100, 100));
        assert!(!r.at_sample(100, 40), "the fall, seen after the peak");
        r.on_alloc(100);
        assert!(r.at_sample(100, 100));
    }

    #[test]
    fn a_return_to_an_old_peak_after_a_higher_one_does_not_count() {
        let mut r = PeakRecurrence::default();
        r.at_sample(100, 0);
        r.at_sample(100, 10);
        assert!(!r.at_sample(150, 10), "a higher peak");
        r.on_alloc(100);
        assert!(!r.at_sample(150, 100), "the old peak's byte is not the new peak");
    }
}
