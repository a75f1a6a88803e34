//! The table fit: kernel-efficiency nodes (ln TFLOP/s) and launch overhead by
//! Levenberg–Marquardt on relative residuals.

use super::*;
use crate::cost::{EffPoint, EffTable};
use crate::error::{invalid, Result};

/// Grid nodes (heads × lengths) spanning `rows`: their heads per call and powers of 2
/// spanning their segments' √(q·kv) (or `opts.lens`).
pub(super) fn grid_nodes(rows: &[&Measurement], opts: &FitOptions) -> Result<Vec<(u32, u32)>> {
    let mut heads: Vec<u32> = rows.iter().map(|r| r.heads).collect();
    heads.sort_unstable();
    heads.dedup();
    let lens: Vec<u32> = if opts.lens.is_empty() {
        let (mut lo, mut hi) = (f64::INFINITY, 0f64);
        for r in rows {
            for s in &r.segs {
                let l = (f64::from(s.q) * f64::from(s.kv)).sqrt();
                lo = lo.min(l);
                hi = hi.max(l);
            }
        }
        // Below 64 tokens a launch is all overhead: the table's first node is at least 64.
        let (a, b) = (
            lo.max(64.0).log2().floor() as u32,
            hi.max(64.0).log2().ceil() as u32,
        );
        (a.min(30)..=b.min(30)).map(|e| 1u32 << e).collect()
    } else {
        let mut l = opts.lens.clone();
        l.sort_unstable();
        l.dedup();
        l
    };
    if lens.is_empty() || lens[0] == 0 {
        return Err(invalid(
            "fit lengths",
            format!("{lens:?}"),
            "positive token counts",
        ));
    }
    Ok(heads
        .iter()
        .flat_map(|&h| lens.iter().map(move |&l| (h, l)))
        .collect())
}

/// Levenberg–Marquardt from `theta`: minimise Σ r(θ)² with a forward-difference Jacobian
/// (`h[k]` the step of parameter k); `project` puts a candidate back inside the parameters'
/// bounds. Returns the parameters and their residuals.
pub(super) fn levenberg_marquardt(
    mut theta: Vec<f64>,
    h: &[f64],
    iterations: usize,
    residuals: &dyn Fn(&[f64]) -> Result<Vec<f64>>,
    project: &dyn Fn(&mut [f64]),
) -> Result<(Vec<f64>, Vec<f64>)> {
    let np = theta.len();
    let cost = |r: &[f64]| r.iter().map(|x| x * x).sum::<f64>();
    let mut r = residuals(&theta)?;
    let mut c = cost(&r);
    let mut lambda = 1e-3;
    let n = r.len();
    for _ in 0..iterations {
        let mut jac = vec![0.0; n * np];
        for k in 0..np {
            let mut t2 = theta.clone();
            t2[k] += h[k];
            let r2 = residuals(&t2)?;
            for i in 0..n {
                jac[i * np + k] = (r2[i] - r[i]) / h[k];
            }
        }
        let mut jtj = vec![0.0; np * np];
        let mut jtr = vec![0.0; np];
        for i in 0..n {
            let row = &jac[i * np..(i + 1) * np];
            for a in 0..np {
                if row[a] == 0.0 {
                    continue;
                }
                jtr[a] += row[a] * r[i];
                for b in 0..np {
                    jtj[a * np + b] += row[a] * row[b];
                }
            }
        }
        let mut improved = false;
        for _ in 0..8 {
            let mut m = jtj.clone();
            for a in 0..np {
                m[a * np + a] += lambda * jtj[a * np + a].max(1e-12) + 1e-12;
            }
            let Some(step) = solve(m, jtr.iter().map(|v| -v).collect()) else {
                lambda *= 10.0;
                continue;
            };
            let mut t2: Vec<f64> = theta.iter().zip(&step).map(|(t, s)| t + s).collect();
            project(&mut t2);
            let r2 = residuals(&t2)?;
            let c2 = cost(&r2);
            if c2 < c {
                theta = t2;
                r = r2;
                let rel = (c - c2) / c.max(1e-300);
                c = c2;
                lambda = (lambda / 3.0).max(1e-9);
                improved = rel > 1e-10;
                break;
            }
            lambda *= 10.0;
        }
        if !improved {
            break;
        }
    }
    Ok((theta, r))
}

/// Root mean square of the first `n` residuals.
pub(super) fn rms(r: &[f64], n: usize) -> f64 {
    (r[..n].iter().map(|x| x * x).sum::<f64>() / n.max(1) as f64).sqrt()
}

/// A fitted table and call overhead.
pub(super) struct TableFit {
    pub(super) points: Vec<EffPoint>,
    pub(super) launch_us: f64,
    pub(super) rms_rel: f64,
}

/// Levenberg–Marquardt over ln(TFLOP/s) at `nodes` and one call overhead (µs, ≥ 0):
/// minimise Σ ((overhead + compute(table, row) − measured)/measured)² plus the prior's
/// pull towards the start (`start_tflops`, `start_us`).
pub(super) fn fit_table(
    fit_name: &'static str,
    rows: &[&Measurement],
    nodes: &[(u32, u32)],
    start_tflops: &[f64],
    start_us: f64,
    opts: &FitOptions,
    compute_ms: &dyn Fn(&EffTable, &Measurement) -> f64,
) -> Result<TableFit> {
    // Nodes' ln TFLOP/s, then the call overhead (µs, ≥ 0, fitted as is).
    let np = nodes.len() + 1;
    let mut theta: Vec<f64> = start_tflops.iter().map(|t| t.ln()).collect();
    theta.push(start_us.max(0.0));
    let points = |th: &[f64]| -> Vec<EffPoint> {
        nodes
            .iter()
            .zip(th)
            .map(|(&(heads, len), &t)| EffPoint {
                heads,
                len,
                // ln TFLOP/s kept inside [ln 0.01, ln 1e5]: a step never leaves the physical range.
                tflops: t.clamp(-4.6, 11.5).exp(),
            })
            .collect()
    };
    let theta0 = theta.clone();
    let w = opts.prior_weight.max(0.0);
    let budget = Budget::new(fit_name, opts);
    let residuals = |th: &[f64]| -> Result<Vec<f64>> {
        budget.tick()?;
        let eff = EffTable::from_points(&points(th), "fit")?;
        let us = th[np - 1].max(0.0);
        let mut r: Vec<f64> = rows
            .iter()
            .map(|r| (us * 1e-3 + compute_ms(&eff, r) - r.measured_ms) / r.measured_ms)
            .collect();
        if w > 0.0 {
            r.extend((0..np - 1).map(|k| w * (th[k] - theta0[k])));
            r.push(w * (us - theta0[np - 1]) / 10.0);
        }
        Ok(r)
    };
    let mut h = vec![1e-4; np];
    h[np - 1] = 0.5;
    let (theta, r) = levenberg_marquardt(theta, &h, opts.iterations, &residuals, &|t| {
        t[np - 1] = t[np - 1].max(0.0)
    })?;
    Ok(TableFit {
        points: points(&theta),
        launch_us: theta[np - 1],
        rms_rel: rms(&r, rows.len()),
    })
}
