//! Pool-size theory: the law-of-large-numbers bound on the residual imbalance left by
//! grouping D packed sequences into K = D/P pools of P (Libra note §3.2, Eq. 4)
//!
//! E\[R\] ≈ 1 + (CV/√P)·√(2 ln(D/P)),
//!
//! a Monte-Carlo estimate of E\[R\] and its spread under random grouping (and, for the
//! pool-size study, under every grouping policy), the smallest pool size meeting a target
//! R − 1, and a diagnosis of where bound and simulation part ways.
//!
//! Eq. 4 makes two approximations, and skewsim reports them separately so the gap is a
//! finding rather than noise: (1) the CLT — a pool's sum of P loads is taken as Gaussian,
//! which long-tailed loads reach only for large P; (2) the extreme-value step — the mean of
//! the largest of K standard Gaussians is taken as √(2 ln K), which is poor for small K
//! (K = 2: √(2 ln 2) = 1.18 against the exact 0.56). [`gaussian_max_mean`] computes the exact
//! E[max of K] so the "Gaussian, exact max" column isolates approximation (1).
//!
//! Reads workload loads only; needs no engine. Pure: no I/O. Monte Carlo is parallel over
//! trials (rayon), each trial with its own stream `rng::stream(seed, purpose, trial)`, and
//! results are gathered in trial order, so output is identical for any thread count.

pub mod mc;

use serde::{Deserialize, Serialize};

use crate::error::{invalid, Result};

pub use mc::{residual_imbalance, Residual, Spread};

/// Moments of a per-sequence load distribution.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadStats {
    /// Sequences measured.
    pub n: usize,
    /// Mean load.
    pub mean: f64,
    /// Population standard deviation.
    pub std: f64,
    /// Coefficient of variation σ/μ.
    pub cv: f64,
    /// Skewness E[(X−μ)³]/σ³ (0 for a Gaussian; large for long tails).
    pub skewness: f64,
    /// Largest load over the mean.
    pub max_over_mean: f64,
}

/// Moments of `loads` (population formulas). An empty list or zero mean gives zeros.
pub fn load_stats(loads: &[u64]) -> LoadStats {
    let n = loads.len();
    if n == 0 {
        return LoadStats {
            n,
            mean: 0.0,
            std: 0.0,
            cv: 0.0,
            skewness: 0.0,
            max_over_mean: 0.0,
        };
    }
    let nf = n as f64;
    let mean = loads.iter().map(|&x| x as f64).sum::<f64>() / nf;
    let (m2, m3) = loads.iter().fold((0.0, 0.0), |(a, b), &x| {
        let d = x as f64 - mean;
        (a + d * d, b + d * d * d)
    });
    let std = (m2 / nf).sqrt();
    let max = loads.iter().copied().max().unwrap_or(0) as f64;
    LoadStats {
        n,
        mean,
        std,
        cv: if mean > 0.0 { std / mean } else { 0.0 },
        skewness: if std > 0.0 {
            m3 / nf / std.powi(3)
        } else {
            0.0
        },
        max_over_mean: if mean > 0.0 { max / mean } else { 0.0 },
    }
}

fn check_sizes(d: usize, p: usize) -> Result<usize> {
    if p == 0 {
        return Err(invalid("pool size P", 0, "at least 1 sequence per pool"));
    }
    if d == 0 || d % p != 0 {
        return Err(invalid(
            "pool size P",
            p,
            format!("a divisor of the batch size D = {d} (K = D/P pools of exactly P sequences)"),
        ));
    }
    Ok(d / p)
}

/// Libra Eq. 4: E\[R\] ≈ 1 + (CV/√P)·√(2 ln(D/P)). For K = 1 it gives exactly 1 (one pool
/// holds the whole batch). Errors: P = 0 or D not divisible by P.
pub fn lln_bound(cv: f64, d: usize, p: usize) -> Result<f64> {
    let k = check_sizes(d, p)?;
    Ok(1.0 + cv / (p as f64).sqrt() * (2.0 * (k as f64).ln()).sqrt())
}

/// Eq. 4 with its extreme-value step made exact: 1 + (CV/√P)·E[max of K iid N(0,1)]. The
/// batch-mean normalisation of R makes the K pool deviations sum to zero; their maximum
/// still has mean σ·E[max of K iid], so no finite-population factor is needed.
pub fn gaussian_exact(cv: f64, d: usize, p: usize) -> Result<f64> {
    let k = check_sizes(d, p)?;
    Ok(1.0 + cv / (p as f64).sqrt() * gaussian_max_mean(k))
}

/// E[max of K iid standard normals] = ∫ x·K·φ(x)·Φ(x)^{K−1} dx, by Simpson's rule on
/// [−12, 12] with 4,800 panels (error < 1e-9 for K ≤ 10⁶). 0 for K ≤ 1.
pub fn gaussian_max_mean(k: usize) -> f64 {
    if k <= 1 {
        return 0.0;
    }
    let kf = k as f64;
    let f = |x: f64| {
        let phi = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
        let cdf = 0.5 * statrs::function::erf::erfc(-x / std::f64::consts::SQRT_2);
        // Φ^{K−1} through logs so large K does not underflow early.
        let pow = if cdf > 0.0 {
            ((kf - 1.0) * cdf.ln()).exp()
        } else {
            0.0
        };
        x * kf * phi * pow
    };
    let (a, b, n) = (-12.0f64, 12.0f64, 4800usize);
    let h = (b - a) / n as f64;
    let mut s = f(a) + f(b);
    for i in 1..n {
        let x = a + i as f64 * h;
        s += if i % 2 == 1 { 4.0 } else { 2.0 } * f(x);
    }
    s * h / 3.0
}

/// The indivisible-outlier floor on R − 1 for *any* grouping of `loads` into K = D/P pools:
/// a pool holds at least the heaviest sequence, so R ≥ F_max / (Σ F / K). No policy can go
/// below it; when it is large, the residual is the corpus's, not the policy's. Errors: P = 0
/// or D not divisible by P.
pub fn outlier_floor(loads: &[u64], p: usize) -> Result<f64> {
    let k = check_sizes(loads.len(), p)?;
    let total: u128 = loads.iter().map(|&f| u128::from(f)).sum();
    let max = loads.iter().copied().max().unwrap_or(0);
    if total == 0 {
        return Ok(0.0);
    }
    Ok((max as f64 * k as f64 / total as f64 - 1.0).max(0.0))
}

/// The floor on R − 1 for groupings with exactly P per pool: the pool holding the heaviest
/// sequence also holds P − 1 others, at least the P − 1 lightest, so
/// R ≥ (F_max + Σ of the P − 1 smallest other loads) / (Σ F / K). At least
/// [`outlier_floor`]; `lpt` (no cardinality constraint) may go below it.
pub fn cardinality_floor(loads: &[u64], p: usize) -> Result<f64> {
    let k = check_sizes(loads.len(), p)?;
    let total: u128 = loads.iter().map(|&f| u128::from(f)).sum();
    if total == 0 {
        return Ok(0.0);
    }
    let mut sorted = loads.to_vec();
    sorted.sort_unstable();
    let heaviest = u128::from(sorted[sorted.len() - 1]);
    let lightest: u128 = sorted[..p - 1].iter().map(|&f| u128::from(f)).sum();
    Ok(((heaviest + lightest) as f64 * k as f64 / total as f64 - 1.0).max(0.0))
}

/// Eq. 4 against Monte Carlo at one pool size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// Pool size P.
    pub pool_size: usize,
    /// Pools per global batch, K = D / P.
    pub pools: usize,
    /// R − 1 by Eq. 4.
    pub bound: f64,
    /// R − 1 by the CLT with the exact mean maximum of K Gaussians.
    pub gaussian_exact: f64,
    /// Monte-Carlo R − 1 under random grouping.
    pub mc: Spread,
    /// (bound − MC)/MC: positive when Eq. 4 over-predicts.
    pub gap: f64,
    /// Where and why bound and simulation disagree (empty when they agree within
    /// [`DISAGREE`]).
    pub note: String,
}

/// A relative gap above this is flagged as a disagreement.
pub const DISAGREE: f64 = 0.25;

/// Compares Eq. 4 with Monte Carlo under random grouping over `batches` (trial t's loads
/// in `batches[t]`; all of length D), at each pool size. The CV is that of every load of
/// every batch pooled (the corpus's per-sequence load distribution as sampled).
pub fn compare(
    batches: &[Vec<u64>],
    pool_sizes: &[usize],
    seed: u64,
) -> Result<(LoadStats, Vec<Comparison>)> {
    let all: Vec<u64> = batches.iter().flatten().copied().collect();
    let stats = load_stats(&all);
    let d = batches.first().map_or(0, Vec::len);
    let res = residual_imbalance(batches, pool_sizes, &[crate::balance::Policy::Random], seed)?;
    let mut out = Vec::with_capacity(res.len());
    for r in res {
        let p = r.pool_size;
        let bound = lln_bound(stats.cv, d, p)? - 1.0;
        let exact = gaussian_exact(stats.cv, d, p)? - 1.0;
        let mc = r.spread.clone();
        let gap = if mc.mean > 0.0 {
            (bound - mc.mean) / mc.mean
        } else if bound > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        let note = diagnose(d / p, bound, exact, &mc, gap, &stats);
        out.push(Comparison {
            pool_size: p,
            pools: d / p,
            bound,
            gaussian_exact: exact,
            mc,
            gap,
            note,
        });
    }
    Ok((stats, out))
}

/// Names the approximation that fails, when bound and MC differ by more than [`DISAGREE`].
fn diagnose(k: usize, bound: f64, exact: f64, mc: &Spread, gap: f64, stats: &LoadStats) -> String {
    if gap.abs() <= DISAGREE {
        return String::new();
    }
    let mut why = Vec::new();
    let sqrt2lnk = (2.0 * (k as f64).ln()).sqrt();
    let emax = gaussian_max_mean(k);
    if k > 1 && (sqrt2lnk - emax).abs() / emax > DISAGREE {
        why.push(format!(
            "small K = {k}: √(2 ln K) = {sqrt2lnk:.2} but E[max of {k} Gaussians] = {emax:.2}"
        ));
    }
    if mc.mean > 0.0 && (exact - mc.mean).abs() / mc.mean > DISAGREE {
        why.push(format!(
            "pool sums not Gaussian (load skewness {:.1}, max/mean {:.0}): the CLT with the exact max gives {:.3}",
            stats.skewness, stats.max_over_mean, exact
        ));
    }
    if why.is_empty() {
        why.push("both approximations hold separately but compound".into());
    }
    format!(
        "bound {} MC by {:.0}%: {}",
        if bound > mc.mean {
            "over-predicts"
        } else {
            "under-predicts"
        },
        gap.abs() * 100.0,
        why.join("; ")
    )
}

/// Smallest P (from `rows`) with R − 1 ≤ `target`, by Eq. 4 and by MC mean.
pub fn recommend(rows: &[Comparison], target: f64) -> (Option<usize>, Option<usize>) {
    let mut sorted: Vec<&Comparison> = rows.iter().collect();
    sorted.sort_by_key(|c| c.pool_size);
    let by_bound = sorted
        .iter()
        .find(|c| c.bound <= target)
        .map(|c| c.pool_size);
    let by_mc = sorted
        .iter()
        .find(|c| c.mc.mean <= target)
        .map(|c| c.pool_size);
    (by_bound, by_mc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_by_hand() {
        // CV = 2, D = 128, P = 8: 1 + 2/√8·√(2 ln 16) = 1 + 0.70711·2.35482 = 2.66511.
        let b = lln_bound(2.0, 128, 8).unwrap();
        assert!((b - 2.665_11).abs() < 1e-4, "{b}");
        assert_eq!(lln_bound(3.0, 64, 64).unwrap(), 1.0);
        assert!(lln_bound(1.0, 128, 0).is_err());
        let e = lln_bound(1.0, 128, 3).unwrap_err().to_string();
        assert!(
            e.contains("pool size P = 3") && e.contains("D = 128"),
            "{e}"
        );
    }

    #[test]
    fn outlier_floor_by_hand() {
        // F = [10, 1, 1, 1, 1, 2], P = 2, K = 3: 10 / (16/3) − 1 = 0.875.
        assert!((outlier_floor(&[10, 1, 1, 1, 1, 2], 2).unwrap() - 0.875).abs() < 1e-12);
        // No outlier: floor 0.
        assert_eq!(outlier_floor(&[3, 3, 3, 3], 2).unwrap(), 0.0);
        // With P per pool: (10 + 1) / (16/3) − 1 = 1.0625.
        assert!((cardinality_floor(&[10, 1, 1, 1, 1, 2], 2).unwrap() - 1.0625).abs() < 1e-12);
        assert!((cardinality_floor(&[3, 3, 3, 3], 2).unwrap()).abs() < 1e-12);
        // Every policy respects the floors (lpt only the cardinality-free one).
        let f = [10, 1, 1, 1, 1, 2];
        for pol in crate::balance::Policy::ALL {
            let pools =
                crate::balance::group(&f, 2, pol, &mut crate::rng::stream(0, "t", 0)).unwrap();
            let r = crate::balance::imbalance(&f, &pools) - 1.0;
            assert!(r >= 0.875 - 1e-12);
            if pol.exact_cardinality() {
                assert!(r >= 1.0625 - 1e-12, "{pol}: {r}");
            }
        }
    }

    #[test]
    fn gaussian_max_matches_known_values() {
        // E[max of 2] = 1/√π; of 3 = 3/(2√π); of 5 ≈ 1.16296; of 10 ≈ 1.53875 (tables).
        let pi = std::f64::consts::PI;
        assert!((gaussian_max_mean(2) - 1.0 / pi.sqrt()).abs() < 1e-9);
        assert!((gaussian_max_mean(3) - 1.5 / pi.sqrt()).abs() < 1e-9);
        assert!((gaussian_max_mean(5) - 1.162_964).abs() < 1e-6);
        assert!((gaussian_max_mean(10) - 1.538_753).abs() < 1e-6);
        assert_eq!(gaussian_max_mean(1), 0.0);
        // √(2 ln K) approaches from above, slowly.
        let k = 100_000;
        assert!(gaussian_max_mean(k) < (2.0 * (k as f64).ln()).sqrt());
    }

    #[test]
    fn load_stats_by_hand() {
        // [1, 1, 1, 5]: mean 2, var (1+1+1+9)/4 = 3, skewness (−1−1−1+27)/4/3^1.5.
        let s = load_stats(&[1, 1, 1, 5]);
        assert_eq!(s.mean, 2.0);
        assert!((s.std - 3f64.sqrt()).abs() < 1e-12);
        assert!((s.cv - 3f64.sqrt() / 2.0).abs() < 1e-12);
        assert!((s.skewness - 6.0 / 3f64.powf(1.5)).abs() < 1e-12);
        assert_eq!(s.max_over_mean, 2.5);
    }

    /// Gaussian-like loads (many small uniform parts), large P·K: MC must agree with the
    /// exact-max Gaussian model within a few percent — an independent check of both the
    /// MC machinery and of `gaussian_exact`.
    #[test]
    fn mc_matches_gaussian_model_on_light_tails() {
        use rand::Rng as _;
        let (d, trials) = (256usize, 400u64);
        let batches: Vec<Vec<u64>> = (0..trials)
            .map(|t| {
                let mut r = crate::rng::stream(3, "test-batch", t);
                (0..d).map(|_| r.random_range(1_000u64..3_000)).collect()
            })
            .collect();
        let (stats, rows) = compare(&batches, &[4, 16], 9).unwrap();
        // Uniform[1000, 3000): CV = (2000/√12)/2000 = 0.2887.
        assert!((stats.cv - 0.2887).abs() < 0.01, "{}", stats.cv);
        for c in &rows {
            let rel = (c.gaussian_exact - c.mc.mean).abs() / c.mc.mean;
            assert!(
                rel < 0.06,
                "P = {}: exact {} mc {}",
                c.pool_size,
                c.gaussian_exact,
                c.mc.mean
            );
        }
        // P = 4, K = 64: Eq. 4 over-predicts (√(2 ln 64) = 2.88 vs E[max 64] = 2.40).
        assert!(rows[0].bound > rows[0].mc.mean);
    }

    #[test]
    fn long_tails_and_small_k_are_flagged() {
        // One sequence in 64 carries a huge load: at P = 64 of D = 128 (K = 2) the bound
        // and MC part ways and the note says why.
        let batches: Vec<Vec<u64>> = (0..200u64)
            .map(|t| {
                (0..128u64)
                    .map(|i| if (i + t) % 64 == 0 { 1_000_000 } else { 100 })
                    .collect()
            })
            .collect();
        let (_, rows) = compare(&batches, &[2, 64], 1).unwrap();
        let k2 = &rows[1];
        assert_eq!(k2.pools, 2);
        assert!(k2.gap.abs() > DISAGREE, "{k2:?}");
        assert!(k2.note.contains("small K = 2"), "{}", k2.note);
        // Recommendation: smallest P meeting the target, each way.
        let (b, m) = recommend(&rows, 1e9);
        assert_eq!((b, m), (Some(2), Some(2)));
        assert_eq!(recommend(&rows, -1.0), (None, None));
    }
}
