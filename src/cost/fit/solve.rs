//! Small least-squares solvers the fits share: dense solve, weighted NNLS, a weighted line
//! and Levenberg–Marquardt.

/// Solve `a x = b` (n × n, row-major) by Gaussian elimination with partial pivoting.
pub(super) fn solve(mut a: Vec<f64>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    for c in 0..n {
        let p = (c..n).max_by(|&i, &j| a[i * n + c].abs().total_cmp(&a[j * n + c].abs()))?;
        if a[p * n + c].abs() < 1e-300 {
            return None;
        }
        if p != c {
            for k in 0..n {
                a.swap(p * n + k, c * n + k);
            }
            b.swap(p, c);
        }
        for r in c + 1..n {
            let f = a[r * n + c] / a[c * n + c];
            if f != 0.0 {
                for k in c..n {
                    a[r * n + k] -= f * a[c * n + k];
                }
                b[r] -= f * b[c];
            }
        }
    }
    let mut x = vec![0.0; n];
    for c in (0..n).rev() {
        let s: f64 = (c + 1..n).map(|k| a[c * n + k] * x[k]).sum();
        x[c] = (b[c] - s) / a[c * n + c];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// The coefficients β ≥ 0 minimising Σ ((β·x − t)/t)² over points (x, t) (weighted normal
/// equations, weight 1/t²): solved with every coefficient free, then, while one comes out
/// negative, with the most negative pinned at 0. `None` with fewer points than free
/// coefficients or a degenerate system.
pub(super) fn weighted_nnls(xs: &[Vec<f64>], ts: &[f64]) -> Option<Vec<f64>> {
    let k = xs.first()?.len();
    let mut free: Vec<usize> = (0..k).collect();
    loop {
        let n = free.len();
        if n == 0 || xs.len() < n {
            return None;
        }
        let mut a = vec![0.0; n * n];
        let mut b = vec![0.0; n];
        for (x, &t) in xs.iter().zip(ts) {
            let w = 1.0 / (t * t);
            for (i, &fi) in free.iter().enumerate() {
                b[i] += w * x[fi] * t;
                for (j, &fj) in free.iter().enumerate() {
                    a[i * n + j] += w * x[fi] * x[fj];
                }
            }
        }
        let v = solve(a, b)?;
        let worst = (0..n)
            .filter(|&i| v[i] < 0.0)
            .min_by(|&i, &j| v[i].total_cmp(&v[j]));
        match worst {
            None => {
                let mut out = vec![0.0; k];
                for (i, &fi) in free.iter().enumerate() {
                    out[fi] = v[i];
                }
                return Some(out);
            }
            Some(i) => {
                free.remove(i);
            }
        }
    }
}

/// The line a + b·x through points (x, t) minimising Σ ((a + b·x − t)/t)² with a ≥ 0
/// ([`weighted_nnls`] over the features (1, x); a pinned at 0 when it would go negative).
/// `None` with fewer than two points or a degenerate system.
pub(super) fn weighted_line(pts: &[(f64, f64)]) -> Option<(f64, f64)> {
    if pts.len() < 2 {
        return None;
    }
    let xs: Vec<Vec<f64>> = pts.iter().map(|&(x, _)| vec![1.0, x]).collect();
    let ts: Vec<f64> = pts.iter().map(|&(_, t)| t).collect();
    weighted_nnls(&xs, &ts).map(|v| (v[0], v[1]))
}
