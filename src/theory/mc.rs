//! Monte Carlo of the residual imbalance R − 1 over trials, pool sizes and policies.
//!
//! Trial t groups its own batch (`batches[t]`) with the stream
//! `rng::stream(seed, "group/<policy>/P<p>", t)`: the draw for one (policy, P, trial) never
//! depends on which other policies, pool sizes or threads ran. Trials run in parallel
//! (rayon) and are gathered in trial order; summaries are computed serially afterwards, so
//! the result is the same bytes for any `RAYON_NUM_THREADS`.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::balance::{group, imbalance, Policy};
use crate::error::{invalid, Result};
use crate::rng::stream;

/// Summary of a sample of values (here R − 1 over trials).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// Values summarised.
    pub trials: usize,
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation (n − 1); 0 for one trial.
    pub std: f64,
    /// Smallest value.
    pub min: f64,
    /// Nearest-rank 5th, 50th and 95th percentiles.
    pub p05: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 95th percentile (nearest rank).
    pub p95: f64,
    /// Largest value.
    pub max: f64,
}

impl Spread {
    /// Summarises `values` (in the given order; the order does not change the result
    /// beyond float summation order, which is fixed).
    pub fn of(values: &[f64]) -> Spread {
        let n = values.len();
        if n == 0 {
            return Spread {
                trials: 0,
                mean: f64::NAN,
                std: f64::NAN,
                min: f64::NAN,
                p05: f64::NAN,
                p50: f64::NAN,
                p95: f64::NAN,
                max: f64::NAN,
            };
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        let mut s = values.to_vec();
        s.sort_by(f64::total_cmp);
        let rank = |q: f64| s[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
        Spread {
            trials: n,
            mean,
            std: var.sqrt(),
            min: s[0],
            p05: rank(0.05),
            p50: rank(0.5),
            p95: rank(0.95),
            max: s[n - 1],
        }
    }
}

/// R − 1 of one (pool size, policy) over every trial.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Residual {
    /// Pool size P.
    pub pool_size: usize,
    /// Grouping policy.
    pub policy: Policy,
    /// R − 1 of trial t at index t.
    pub per_trial: Vec<f64>,
    /// Summary over trials.
    pub spread: Spread,
}

/// The stream purpose for grouping with `policy` at pool size `p`.
pub fn purpose(policy: Policy, p: usize) -> String {
    format!("group/{policy}/P{p}")
}

/// R − 1 for every (pool size, policy), in that nesting order (pool sizes outer), over the
/// trial batches `batches` (each the per-sequence loads of one global batch, all the same
/// length D). Errors: no batches, batches of different lengths, or a P that does not divide D.
pub fn residual_imbalance(
    batches: &[Vec<u64>],
    pool_sizes: &[usize],
    policies: &[Policy],
    seed: u64,
) -> Result<Vec<Residual>> {
    let d = batches
        .first()
        .map(Vec::len)
        .ok_or_else(|| invalid("trials", 0, "at least 1 trial (one global batch per trial)"))?;
    if let Some(b) = batches.iter().find(|b| b.len() != d) {
        return Err(invalid(
            "batch size D",
            b.len(),
            format!("every trial's batch has the same D = {d}"),
        ));
    }
    // Validate sizes once up front, so the parallel part cannot fail on input.
    for &p in pool_sizes {
        crate::balance::vrsp(&vec![0; d], p)?;
    }
    let cells: Vec<(usize, Policy)> = pool_sizes
        .iter()
        .flat_map(|&p| policies.iter().map(move |&q| (p, q)))
        .collect();
    let per_trial: Vec<Vec<f64>> = batches
        .par_iter()
        .enumerate()
        .map(|(t, loads)| {
            cells
                .iter()
                .map(|&(p, policy)| {
                    let mut rng = stream(seed, &purpose(policy, p), t as u64);
                    group(loads, p, policy, &mut rng)
                        .map(|pools| imbalance(loads, &pools) - 1.0)
                        .unwrap_or(f64::NAN)
                })
                .collect()
        })
        .collect();
    Ok(cells
        .iter()
        .enumerate()
        .map(|(c, &(pool_size, policy))| {
            let values: Vec<f64> = per_trial.iter().map(|row| row[c]).collect();
            Residual {
                pool_size,
                policy,
                spread: Spread::of(&values),
                per_trial: values,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_by_hand() {
        let s = Spread::of(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!((s.mean, s.min, s.max), (2.5, 1.0, 4.0));
        assert!((s.std - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        // Nearest rank: p05 → rank 1, p50 → rank 2, p95 → rank 4.
        assert_eq!((s.p05, s.p50, s.p95), (1.0, 2.0, 4.0));
        assert_eq!(Spread::of(&[7.0]).std, 0.0);
    }

    #[test]
    fn deterministic_and_independent_of_other_cells_and_threads() {
        let batches: Vec<Vec<u64>> = (0..40u64)
            .map(|t| {
                (0..32u64)
                    .map(|i| (i * 7919 + t * 104_729) % 1000 + 1)
                    .collect()
            })
            .collect();
        let all = residual_imbalance(&batches, &[2, 8], &Policy::ALL, 5).unwrap();
        // The same cell computed alone gives the same numbers.
        let alone = residual_imbalance(&batches, &[8], &[Policy::Random], 5).unwrap();
        let in_all = all
            .iter()
            .find(|r| r.pool_size == 8 && r.policy == Policy::Random)
            .unwrap();
        assert_eq!(in_all.per_trial, alone[0].per_trial);
        // One thread gives the same numbers as the pool.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let serial =
            pool.install(|| residual_imbalance(&batches, &[2, 8], &Policy::ALL, 5).unwrap());
        assert_eq!(serial, all);
        // Order: pool sizes outer, policies inner.
        assert_eq!((all[1].pool_size, all[1].policy), (2, Policy::Production));
        // Production at P = 32 = D: one pool, R − 1 = 0 exactly; VRSP ≤ random on average.
        let one = residual_imbalance(&batches, &[32], &[Policy::Production], 5).unwrap();
        assert!(one[0].per_trial.iter().all(|&v| v == 0.0));
        let mean = |p| {
            all.iter()
                .find(|r| r.pool_size == 8 && r.policy == p)
                .unwrap()
                .spread
                .mean
        };
        assert!(mean(Policy::Vrsp) < mean(Policy::Random));
        assert!(residual_imbalance(&batches, &[3], &[Policy::Random], 5).is_err());
        assert!(residual_imbalance(&[], &[2], &[Policy::Random], 5).is_err());
    }
}
