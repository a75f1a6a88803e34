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
