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

/// Launch times expressed in the parameters of skewsim's variance model (`cluster::variance`:
/// per-kernel jitter `Lognormal { sigma }` plus spikes that slow a kernel by `1 + Exp(mean)`
/// with probability `prob`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VarianceFit {
    pub n: usize,
    /// σ of ln(factor), robust: (ln q90 − ln q10) / (2·1.28155), so spikes and drift in the
    /// tails do not inflate it.
    pub sigma: f64,
    /// Fraction of launches slower than `max(exp(4σ), 1 + SPIKE_FLOOR)` × median: beyond the
    /// lognormal body, and by at least 2% (a tight body would otherwise call +0.1% a spike).
    pub spike_prob: f64,
    /// Mean of (factor − 1) over those launches (0 when there are none).
    pub spike_mean: f64,
    /// Lag-1 autocorrelation of the factors (the model assumes 0).
    pub lag1: f64,
}

/// Smallest slowdown counted as a spike.
pub const SPIKE_FLOOR: f64 = 0.02;

/// z of the 90th percentile of the standard normal.
const Z90: f64 = 1.281_551_565_544_600_5;

/// Fits [`VarianceFit`] to launch times (any unit). `None` for fewer than 10 times, NaN or a
/// non-positive time.
pub fn fit_variance(times: &[f64]) -> Option<VarianceFit> {
    if times.len() < 10 || times.iter().any(|t| !(t.is_finite() && *t > 0.0)) {
        return None;
    }
    let med = quantile(times, 0.5)?;
    let f: Vec<f64> = times.iter().map(|t| t / med).collect();
    let sigma = (quantile(&f, 0.9)?.ln() - quantile(&f, 0.1)?.ln()) / (2.0 * Z90);
    let cut = (4.0 * sigma).exp().max(1.0 + SPIKE_FLOOR);
    let spikes: Vec<f64> = f.iter().copied().filter(|&x| x > cut).collect();
    let spike_mean = if spikes.is_empty() {
        0.0
    } else {
        spikes.iter().map(|x| x - 1.0).sum::<f64>() / spikes.len() as f64
    };
    Some(VarianceFit {
        n: f.len(),
        sigma,
        spike_prob: spikes.len() as f64 / f.len() as f64,
        spike_mean,
        lag1: lag1_autocorrelation(&f),
    })
}

/// σ of the persistent per-GPU factor from each GPU's median time for the same kernel: the
/// sample standard deviation (n − 1) of ln(median). `None` for fewer than two GPUs.
pub fn persistent_sigma(medians: &[f64]) -> Option<f64> {
    if medians.len() < 2 || medians.iter().any(|m| !(m.is_finite() && *m > 0.0)) {
        return None;
    }
    let l: Vec<f64> = medians.iter().map(|m| m.ln()).collect();
    let mean = l.iter().sum::<f64>() / l.len() as f64;
    Some((l.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (l.len() - 1) as f64).sqrt())
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
    fn variance_fit_recovers_sigma_and_spikes() {
        // 100 launches: factors exp(σ·z_i), z_i = (i − 49.5)/20 (a symmetric grid, |z| ≤ 2.475),
        // with two central ones replaced by spikes of +10% and +20%. σ̂ is checked against the
        // quantile formula evaluated independently here.
        let sigma = 0.01;
        let mut t: Vec<f64> = (0..100)
            .map(|i| (sigma * (i as f64 - 49.5) / 20.0).exp())
            .collect();
        t[50] = 1.10;
        t[51] = 1.20;
        let fit = fit_variance(&t).unwrap();
        let med = quantile(&t, 0.5).unwrap();
        let f: Vec<f64> = t.iter().map(|x| x / med).collect();
        let want =
            (quantile(&f, 0.9).unwrap().ln() - quantile(&f, 0.1).unwrap().ln()) / (2.0 * Z90);
        assert!((fit.sigma - want).abs() < 1e-15);
        // The body spans ±2.475σ: no body launch passes exp(4σ̂); both spikes do.
        assert_eq!(fit.spike_prob, 0.02);
        let want_mean = (1.10 / med - 1.0 + 1.20 / med - 1.0) / 2.0;
        assert!((fit.spike_mean - want_mean).abs() < 1e-12);
        assert!(fit_variance(&t[..9]).is_none());
        // A tight body: +1% is not a spike (floor 2%), +3% is.
        let mut tight = vec![1.0; 50];
        tight[3] = 1.01;
        tight[7] = 1.03;
        let ft = fit_variance(&tight).unwrap();
        assert_eq!((ft.spike_prob, ft.sigma), (0.02, 0.0));
        assert!((ft.spike_mean - 0.03).abs() < 1e-12);
        assert!(fit_variance(&[1.0; 10]).unwrap().sigma == 0.0);
        // Persistent: medians 1.0 and e^0.02 → ln-std = 0.02/√2.
        let p = persistent_sigma(&[1.0, 0.02f64.exp()]).unwrap();
        assert!((p - 0.02 / 2f64.sqrt()).abs() < 1e-12);
        assert!(persistent_sigma(&[1.0]).is_none());
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
