//! A measured price with its uncertainty: the mean of repeated timings and the half-width of its
//! 95% confidence interval (Student's t, since a GPU benchmark takes few samples), beside the
//! median that a cost model uses (robust to the odd slow call).

use statrs::distribution::{ContinuousCDF, StudentsT};
use statrs::statistics::Statistics;

/// The `f` quantile (0..=1) of sorted values, the nearest rank (the upper median of an even
/// count); 0 when there are none.
pub fn quantile(sorted: &[u64], f: f64) -> u64 {
    let i = ((sorted.len().max(1) - 1) as f64 * f).round() as usize;
    sorted.get(i).copied().unwrap_or(0)
}

/// The median of `v` ([`quantile`] 0.5).
pub fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    quantile(&v, 0.5)
}

/// Repeated timings of one call, summarized.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// Samples.
    pub n: usize,
    /// Their median, ns ([`median`]: the price a cost model takes).
    pub median: u64,
    /// Their mean, ns.
    pub mean: f64,
    /// Half-width of the mean's 95% confidence interval, ns (0 for one sample: no spread is
    /// known, and the text says n = 1).
    pub ci95: f64,
}

impl Estimate {
    /// The summary of `samples` (ns); None when there are none.
    pub fn of(samples: &[u64]) -> Option<Estimate> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let median = quantile(&sorted, 0.5);
        let xs: Vec<f64> = samples.iter().map(|&x| x as f64).collect();
        let n = xs.len();
        let mean = xs.iter().mean();
        let ci95 = if n < 2 {
            0.0
        } else {
            let sd = xs.iter().std_dev();
            // The 97.5% quantile of Student's t with n - 1 degrees of freedom.
            let t = StudentsT::new(0.0, 1.0, (n - 1) as f64)
                .map(|d| d.inverse_cdf(0.975))
                .unwrap_or(f64::NAN);
            t * sd / (n as f64).sqrt()
        };
        Some(Estimate { n, median, mean, ci95 })
    }
}

impl std::fmt::Display for Estimate {
    /// "median 190000, mean 191000 ± 1200 (95%, n = 64)".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "median {}, mean {:.0} ± {:.0} (95%, n = {})",
            self.median, self.mean, self.ci95, self.n
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_is_students_t_on_the_standard_error() {
        // 1..=10: mean 5.5, sample sd 3.0277, t(0.975, 9) = 2.2622: half-width 2.1659.
        let e = Estimate::of(&(1..=10).collect::<Vec<u64>>()).unwrap();
        assert_eq!((e.n, e.median), (10, 6), "the upper median, as the cost model's price");
        assert!((e.mean - 5.5).abs() < 1e-9);
        assert!((e.ci95 - 2.1659).abs() < 1e-3, "{}", e.ci95);
        // Two samples: t(0.975, 1) = 12.706, so the interval is wide, as it should be.
        let two = Estimate::of(&[100, 110]).unwrap();
        assert!((two.ci95 - 12.706 * 5.0).abs() < 0.01, "{}", two.ci95);
        // Equal samples: no spread.
        assert_eq!(Estimate::of(&[7, 7, 7]).unwrap().ci95, 0.0);
        assert_eq!(Estimate::of(&[42]).unwrap().ci95, 0.0);
        assert!(Estimate::of(&[]).is_none());
        assert_eq!(
            Estimate::of(&[1, 2, 3]).unwrap().to_string(),
            "median 2, mean 2 ± 2 (95%, n = 3)"
        );
    }
}
