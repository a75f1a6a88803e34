//! The sliding-window step term of a forward block model ([`BlockModel::window_ns`]),
//! fitted to measured windowed launches with every other figure of the model held — the
//! causal launches a model was fitted to keep their prices bit for bit.
//!
//! A windowed launch is priced as its blocks under the window ([`super::blocks`]: the key
//! blocks between each tile's lowest reached key and its last row, the window's edge
//! counted as masked steps) plus `window_ns` per step run in the kernel's window mode.
//! The term is the one number left; it is found by a golden-section search of the summed
//! squared relative error of (call overhead + makespan) against the measured medians.

use rayon::prelude::*;

use super::blocks::{prices_mask, BlockModel, LaunchBlocks};
use super::fit::{row_blocks, Measurement, Pass};
use super::Mask;
use crate::error::{invalid, Result};

/// A fitted window term: the nanoseconds per windowed step and the RMS relative error of
/// the rows it was fitted to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowFit {
    /// [`BlockModel::window_ns`].
    pub window_ns: f64,
    /// RMS of (predicted − measured) / measured over the fitted rows.
    pub rms_rel: f64,
    /// Rows fitted.
    pub rows: usize,
}

/// The forward rows of `rows` a window term is fitted to: attention launches under a
/// sliding window at `head_dim`.
pub fn window_rows(rows: &[Measurement], head_dim: u32) -> Vec<&Measurement> {
    rows.iter()
        .filter(|r| {
            r.pass == Pass::Fwd
                && matches!(r.mask, Mask::Sliding { .. })
                && prices_mask(&r.mask)
                && r.head_dim == head_dim
                && !r.segs.is_empty()
                && r.measured_ms > 0.0
        })
        .collect()
}

/// Fit `model`'s window term to `rows` (forward launches under sliding windows), each
/// priced at `launch_us` of call overhead plus its blocks' makespan; searched in [0, 4 ×
/// the model's step].
pub fn fit_window_ns(
    model: &BlockModel,
    launch_us: f64,
    rows: &[&Measurement],
) -> Result<WindowFit> {
    if rows.is_empty() {
        return Err(invalid(
            "measurements",
            "no forward rows under a sliding window at the model's head_dim",
            "at least one measured windowed forward launch (a `mask` column of sliding:W)",
        ));
    }
    let launches: Vec<LaunchBlocks> = rows.iter().map(|r| row_blocks(model, r)).collect();
    let sse = |w: f64| -> f64 {
        let m = BlockModel {
            window_ns: w,
            ..*model
        };
        launches
            .par_iter()
            .zip(rows.par_iter())
            .map(|(l, r)| {
                let p = launch_us * 1e-3 + l.makespan_ps(&m) * 1e-9;
                ((p - r.measured_ms) / r.measured_ms).powi(2)
            })
            .sum()
    };
    // Golden-section search on [0, 4 · iter_ns].
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let (mut a, mut b) = (0.0, 4.0 * model.iter_ns);
    let (mut c, mut d) = (b - g * (b - a), a + g * (b - a));
    let (mut fc, mut fd) = (sse(c), sse(d));
    for _ in 0..48 {
        if fc < fd {
            b = d;
            (d, fd) = (c, fc);
            c = b - g * (b - a);
            fc = sse(c);
        } else {
            a = c;
            (c, fc) = (d, fd);
            d = a + g * (b - a);
            fd = sse(d);
        }
    }
    let window_ns = (a + b) / 2.0;
    Ok(WindowFit {
        window_ns,
        rms_rel: (sse(window_ns) / rows.len() as f64).sqrt(),
        rows: rows.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::fit::{MeasureKind, SegCount};

    fn row(segs: Vec<SegCount>, heads: u32, w: u32, ms: f64) -> Measurement {
        Measurement {
            kind: MeasureKind::Attn,
            pass: Pass::Fwd,
            plan: "w".into(),
            seed: 1,
            scheme: "torch-flash".into(),
            step: 0,
            ga: 0,
            pool: 0,
            worker: 0,
            chunk: 0,
            units: 1,
            segments: 1,
            tiles: 0,
            heads,
            kv_heads: heads,
            head_dim: 128,
            q_tokens: 0,
            flops: 0.0,
            bytes: 0,
            predicted_ms: None,
            measured_ms: ms,
            p10_ms: ms,
            p90_ms: ms,
            segs,
            mask: Mask::Sliding { w },
        }
    }

    /// Launches priced by a model with a known window term are fitted back to it; causal
    /// rows and rows of another head_dim are not fitted.
    #[test]
    fn recovers_a_known_window_term() {
        let truth = BlockModel {
            window_ns: 350.0,
            ..BlockModel::h200(1800.0, 1850.0, 0.1, 400.0, 1.5)
        };
        let launch_us = 19.0;
        let shapes = [
            (
                vec![SegCount {
                    q: 8192,
                    kv: 8192,
                    n: 2,
                }],
                8,
                1024,
            ),
            (
                vec![SegCount {
                    q: 512,
                    kv: 40_000,
                    n: 3,
                }],
                32,
                4096,
            ),
            (
                vec![
                    SegCount {
                        q: 3000,
                        kv: 3000,
                        n: 5,
                    },
                    SegCount {
                        q: 100,
                        kv: 9000,
                        n: 1,
                    },
                ],
                4,
                256,
            ),
            (
                vec![SegCount {
                    q: 65_536,
                    kv: 65_536,
                    n: 1,
                }],
                16,
                16_384,
            ),
        ];
        let mut rows: Vec<Measurement> = shapes
            .into_iter()
            .map(|(segs, heads, w)| {
                let mut r = row(segs, heads, w, 1.0);
                let l = row_blocks(&truth, &r);
                r.measured_ms = launch_us * 1e-3 + l.makespan_ps(&truth) * 1e-9;
                r
            })
            .collect();
        let mut causal = rows[0].clone();
        causal.mask = Mask::Causal;
        let mut d64 = rows[1].clone();
        d64.head_dim = 64;
        rows.extend([causal, d64]);
        let fit_rows = window_rows(&rows, 128);
        assert_eq!(fit_rows.len(), 4);
        let base = BlockModel {
            window_ns: 0.0,
            ..truth
        };
        let f = fit_window_ns(&base, launch_us, &fit_rows).unwrap();
        assert!((f.window_ns - 350.0).abs() < 0.5, "{f:?}");
        assert!(f.rms_rel < 1e-4, "{f:?}");
        let e = fit_window_ns(&base, launch_us, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("sliding"), "{e}");
    }
}
