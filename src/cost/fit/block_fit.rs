//! The block-model fits: forward and backward thread-block models by variable projection
//! (ratios searched from a start grid, times by non-negative weighted least squares).

use super::*;
use crate::cost::blocks::{
    BlockModel, BlockTimes, BwdBlockModel, BwdLaunchBlocks, LaunchBlocks, TileOrder,
};
use crate::error::{invalid, Result};

/// A fitted block model and forward call overhead.
pub(super) struct BlockFit {
    pub(super) model: BlockModel,
    pub(super) launch_us: f64,
    pub(super) rms_rel: f64,
}

/// The nonlinear half of a variable-projection fit: score every start (projected) by
/// Σ r², then Levenberg–Marquardt (steps `h`, restarted while it gains) from the best two
/// — a makespan is piecewise linear in the block times (blocks change SMs), so a single
/// descent can stall on a kink; at most `iterations` restarts each. Returns the best
/// parameters found.
pub(super) fn search_ratios(
    budget: &Budget,
    mut starts: Vec<Vec<f64>>,
    descents: usize,
    h: &[f64],
    iterations: usize,
    residuals: &(dyn Fn(&[f64]) -> Vec<f64> + Sync),
    project: &dyn Fn(&mut [f64]),
) -> Result<Vec<f64>> {
    let sum_sq = |r: &[f64]| r.iter().map(|x| x * x).sum::<f64>();
    for s in starts.iter_mut() {
        project(s);
    }
    let mut scored: Vec<(f64, Vec<f64>)> = Vec::with_capacity(starts.len());
    for s in starts {
        budget.tick()?;
        scored.push((sum_sq(&residuals(&s)), s));
    }
    scored.sort_by(|x, y| x.0.total_cmp(&y.0));
    let res = |th: &[f64]| -> Result<Vec<f64>> {
        budget.tick()?;
        Ok(residuals(th))
    };
    let mut best: Option<(f64, Vec<f64>)> = None;
    for (_, s) in scored.into_iter().take(descents.max(1)) {
        let (mut theta, mut r) = levenberg_marquardt(s, h, iterations, &res, project)?;
        for _ in 0..iterations {
            let (t2, r2) = levenberg_marquardt(theta.clone(), h, iterations, &res, project)?;
            let gained = sum_sq(&r2) < sum_sq(&r) * (1.0 - 1e-6);
            (theta, r) = (t2, r2);
            if !gained {
                break;
            }
        }
        let c = sum_sq(&r);
        if best.as_ref().is_none_or(|b| c < b.0) {
            best = Some((c, theta));
        }
    }
    best.map(|b| b.1)
        .ok_or_else(|| invalid("block fit starts", 0, "at least one"))
}

/// The linear half: coefficients ≥ 0 of the features `xs` (one row per launch) that best
/// explain the measured times in relative terms, and the relative residuals.
pub(super) fn linear_part(xs: &[Vec<f64>], rows: &[&Measurement]) -> (Vec<f64>, Vec<f64>) {
    let ts: Vec<f64> = rows.iter().map(|r| r.measured_ms).collect();
    let k = xs.first().map_or(0, Vec::len);
    let beta = weighted_nnls(xs, &ts).unwrap_or_else(|| {
        let mut v = vec![0.0; k];
        if let Some(last) = v.last_mut() {
            *last = 1.0;
        }
        v
    });
    let r = xs
        .iter()
        .zip(&ts)
        .map(|(x, &t)| (x.iter().zip(&beta).map(|(a, b)| a * b).sum::<f64>() - t) / t)
        .collect();
    (beta, r)
}

/// The block model's fit by variable projection: a launch's makespan is proportional to
/// the step time `iter_ns` once the other times are given as ratios to it, so for every
/// candidate (block_ns / iter_ns, row_share, diag_ns / iter_ns, pair_slowdown) the step
/// time and the call overhead are solved in closed form ([`weighted_line`]) and only these
/// four are searched ([`search_ratios`]).
pub(super) fn fit_blocks(
    rows: &[&Measurement],
    template: &BlockModel,
    start: Option<&BlockModel>,
    opts: &FitOptions,
) -> Result<BlockFit> {
    let iterations = opts.iterations;
    use rayon::prelude::*;
    let launches: Vec<LaunchBlocks> = rows.iter().map(|r| row_blocks(template, r)).collect();
    let per_sm = f64::from(template.blocks_per_sm.max(1));
    // A grid of padded segments has empty blocks: their time is a fifth ratio.
    let grid = template.order == TileOrder::Grid;
    // Ratios → the model at a 1 ns step.
    let unit = |th: &[f64]| BlockModel {
        iter_ns: 1.0,
        block_ns: th[0],
        row_share: th[1],
        diag_ns: th[2],
        pair_slowdown: th[3],
        empty_ns: th.get(4).copied().unwrap_or(0.0),
        ..*template
    };
    // Per candidate: (overhead ms, ms per step ns) and the relative residuals.
    let solve_at = |th: &[f64]| -> (Vec<f64>, Vec<f64>) {
        let m = unit(th);
        let xs: Vec<Vec<f64>> = launches
            .par_iter()
            .map(|l| vec![1.0, l.makespan_ps(&m) * 1e-9])
            .collect();
        linear_part(&xs, rows)
    };
    let project = |t: &mut [f64]| {
        t[0] = t[0].max(0.0);
        t[1] = t[1].clamp(0.0, 1.0);
        t[2] = t[2].max(0.0);
        t[3] = t[3].clamp(1.0, per_sm);
        if let Some(e) = t.get_mut(4) {
            *e = e.max(0.0);
        }
    };
    let mut starts: Vec<Vec<f64>> = Vec::new();
    if let Some(s) = start {
        starts.push(vec![
            s.block_ns / s.iter_ns,
            s.row_share,
            s.diag_ns / s.iter_ns,
            s.pair_slowdown,
        ]);
    }
    for b in [0.2, 1.0, 4.0] {
        for rs in [0.1, 0.5] {
            for d in [0.2, 1.0] {
                for sg in [1.15, 1.45, 1.75] {
                    starts.push(vec![b, rs, d, sg]);
                }
            }
        }
    }
    if grid {
        for s in &mut starts {
            s.push(0.2);
        }
    }
    let theta = search_ratios(
        &Budget::new("forward block model", opts),
        starts,
        2,
        &[1e-2; 5][..4 + usize::from(grid)],
        iterations,
        &|th| solve_at(th).1,
        &project,
    )?;
    let (beta, r) = solve_at(&theta);
    let (launch_ms, iter_ns) = (beta[0], beta[1]);
    let m = unit(&theta);
    Ok(BlockFit {
        model: BlockModel {
            iter_ns,
            block_ns: m.block_ns * iter_ns,
            diag_ns: m.diag_ns * iter_ns,
            empty_ns: m.empty_ns * iter_ns,
            ..m
        },
        launch_us: launch_ms * 1e3,
        rms_rel: rms(&r, rows.len()),
    })
}

/// A fitted backward block model and backward call overhead.
pub(super) struct BwdBlockFit {
    pub(super) model: BwdBlockModel,
    pub(super) launch_us: f64,
    pub(super) rms_rel: f64,
}

/// The backward block model's fit, by variable projection as [`fit_blocks`]: the two
/// launches share their block times — the ratios block_ns / iter_ns and row_share and the
/// pair slowdown are searched ([`search_ratios`], one descent: each candidate prices both
/// launches of every call); the call overhead, the per-row·head time, the step time and —
/// when some calls have fewer KV heads than query heads — the grouped-query reduction's
/// time per byte enter a call's time linearly and are solved in closed form for every
/// candidate
/// ([`weighted_nnls`], all ≥ 0). No diagonal term: the backward kernels compute every
/// element of a masked step and select (`attn_bwd.cu`), and a fitted one came out at 0
/// (0.01 ns of a 1.4–2.4 µs step). One step time for both launches, not one each: fitted
/// apart they swap order with the data (not identified), and shared they hold the held-out
/// slowest worker closer than apart (BENCHMARKS.md, "Block models of the attention
/// kernels").
pub(super) fn fit_bwd_blocks(
    rows: &[&Measurement],
    template: &BwdBlockModel,
    start: Option<&BwdBlockModel>,
    opts: &FitOptions,
) -> Result<BwdBlockFit> {
    let iterations = opts.iterations;
    use rayon::prelude::*;
    let launches: Vec<BwdLaunchBlocks> = rows
        .iter()
        .map(|r| {
            let segs = Pricing::seg_ranges(&r.segs);
            BwdLaunchBlocks::new(template, r.mask, r.heads, r.kv_heads, r.head_dim, segs)
        })
        .collect();
    // Calls with fewer KV heads than query heads identify the grouped-query reduction.
    let grouped = launches.iter().any(|l| l.reduce_bytes > 0.0);
    let per_sm = f64::from(template.blocks_per_sm.max(1));
    let grid = template.order == TileOrder::Grid;
    // Ratios → the model at 1 ns steps and 1 ns per row·head.
    let unit = |th: &[f64]| {
        let t = BlockTimes {
            block_ns: th[0],
            iter_ns: 1.0,
            row_share: th[1],
            diag_ns: 0.0,
            empty_ns: th.get(3).copied().unwrap_or(0.0),
        };
        BwdBlockModel {
            row_head_ns: 1.0,
            dq: t,
            dkdv: t,
            pair_slowdown: th[2],
            ..*template
        }
    };
    // Per candidate: (call ms, ms per row·head ns, ms per step ns[, ms per reduced
    // byte]) and the relative residuals.
    let solve_at = |th: &[f64]| -> (Vec<f64>, Vec<f64>) {
        let m = unit(th);
        let xs: Vec<Vec<f64>> = launches
            .par_iter()
            .map(|l| {
                let p = l.parts_ps(&m);
                let mut x = vec![1.0, p[0] * 1e-9, (p[1] + p[2]) * 1e-9];
                if grouped {
                    x.push(l.reduce_bytes);
                }
                x
            })
            .collect();
        linear_part(&xs, rows)
    };
    let project = |t: &mut [f64]| {
        t[0] = t[0].max(0.0);
        t[1] = t[1].clamp(0.0, 1.0);
        t[2] = t[2].clamp(1.0, per_sm);
        if let Some(e) = t.get_mut(3) {
            *e = e.max(0.0);
        }
    };
    let mut starts: Vec<Vec<f64>> = Vec::new();
    if let Some(s) = start {
        starts.push(vec![
            s.dq.block_ns / s.dq.iter_ns,
            s.dq.row_share,
            s.pair_slowdown,
        ]);
    }
    for b in [0.2, 1.0, 4.0] {
        for rs in [0.0, 0.3] {
            for sg in [1.15, 1.45, 1.75] {
                starts.push(vec![b, rs, sg]);
            }
        }
    }
    if grid {
        for s in &mut starts {
            s.push(0.2);
        }
    }
    let theta = search_ratios(
        &Budget::new("backward block model", opts),
        starts,
        1,
        &[1e-2; 4][..3 + usize::from(grid)],
        iterations,
        &|th| solve_at(th).1,
        &project,
    )?;
    let (beta, r) = solve_at(&theta);
    let m = unit(&theta);
    // A step time that came out 0 (no data sees it) is kept a tiny positive one.
    let s = beta[2].max(1e-6);
    let t = BlockTimes {
        block_ns: m.dq.block_ns * s,
        iter_ns: s,
        empty_ns: m.dq.empty_ns * s,
        ..m.dq
    };
    Ok(BwdBlockFit {
        model: BwdBlockModel {
            row_head_ns: beta[1],
            dq: t,
            dkdv: t,
            // ms per byte → ps per byte.
            reduce_ps_per_byte: beta.get(3).map_or(0.0, |b| b * 1e9),
            ..m
        },
        launch_us: beta[0] * 1e3,
        rms_rel: rms(&r, rows.len()),
    })
}
