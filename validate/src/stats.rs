//! Runtime-variance statistics: repeated identical launches expressed as multiplicative factors
//! relative to their median (the units of the simulator's per-kernel jitter model:
//! `t = t_nominal × factor`).

/// Quantile by linear interpolation between order statistics (type 7); `q` in `[0, 1]`.
/// `None` for an empty slice or a NaN.
pub fn quantile(xs: &[f64], q: f64) -> Option<f64> {
    if xs.is_empty() || xs.iter().any(|x| x.is_nan()) || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = q * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    Some(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

/// Jitter of repeated launches, each as a factor of the median time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Jitter {
    pub n: usize,
    pub median_ms: f64,
    pub min: f64,
    pub p10: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    /// Standard deviation of the factors (coefficient of variation around the median).
    pub std: f64,
    /// Lag-1 autocorrelation of consecutive launches' factors (0 for independent draws; near 1
    /// when the GPU drifts between slow and fast regimes that persist over many launches).
    pub lag1: f64,
}

/// Lag-1 autocorrelation of `xs` (0 when the series is constant or shorter than 2).
pub fn lag1_autocorrelation(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    let var: f64 = xs.iter().map(|x| (x - mean) * (x - mean)).sum();
    if var == 0.0 {
        return 0.0;
    }
    let cov: f64 = xs.windows(2).map(|w| (w[0] - mean) * (w[1] - mean)).sum();
    cov / var
}

impl Jitter {
    /// Summarises times in ms. `None` for an empty slice, NaN or a non-positive median.
    pub fn from_times(ms: &[f64]) -> Option<Self> {
        let med = quantile(ms, 0.5)?;
        if med <= 0.0 {
            return None;
        }
        let f: Vec<f64> = ms.iter().map(|t| t / med).collect();
        let mean = f.iter().sum::<f64>() / f.len() as f64;
        let var = f.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / f.len() as f64;
        Some(Jitter {
            n: ms.len(),
            median_ms: med,
            min: quantile(&f, 0.0)?,
            p10: quantile(&f, 0.1)?,
            p90: quantile(&f, 0.9)?,
            p99: quantile(&f, 0.99)?,
            max: quantile(&f, 1.0)?,
            std: var.sqrt(),
            lag1: lag1_autocorrelation(&f),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate() {
        let xs = [4.0, 1.0, 3.0, 2.0, 5.0];
        assert_eq!(quantile(&xs, 0.5), Some(3.0));
        assert_eq!(quantile(&xs, 0.0), Some(1.0));
        assert_eq!(quantile(&xs, 1.0), Some(5.0));
        assert_eq!(quantile(&xs, 0.9), Some(4.6));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[1.0, f64::NAN], 0.5), None);
    }

    #[test]
    fn lag1_autocorrelation_separates_drift_from_alternation() {
        // Alternating ±1: cov = -(n-1), var = n -> -(n-1)/n.
        let alt: Vec<f64> = (0..10)
            .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        assert!((lag1_autocorrelation(&alt) + 0.9).abs() < 1e-12);
        // Two regimes (five 0s then five 1s): deviations ±0.5, var = 2.5, cov = 8·0.25 − 0.25.
        let steps = [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        assert!((lag1_autocorrelation(&steps) - 0.7).abs() < 1e-12);
        assert_eq!(lag1_autocorrelation(&[2.0, 2.0, 2.0]), 0.0);
        assert_eq!(lag1_autocorrelation(&[1.0]), 0.0);
    }

    #[test]
    fn jitter_is_relative_to_the_median() {
        // 1..=101 ms: median 51, max factor 101/51, p90 = 91/51.
        let ms: Vec<f64> = (1..=101).map(f64::from).collect();
        let j = Jitter::from_times(&ms).unwrap();
        assert_eq!(j.n, 101);
        assert_eq!(j.median_ms, 51.0);
        assert!((j.max - 101.0 / 51.0).abs() < 1e-12);
        assert!((j.p90 - 91.0 / 51.0).abs() < 1e-12);
        assert!((j.min - 1.0 / 51.0).abs() < 1e-12);
        assert!(Jitter::from_times(&[0.0, 0.0]).is_none());
    }
}
