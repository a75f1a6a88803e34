//! Calibration against GPU measurements.
//!
//! Owns the measurement record that `skewsim validate` writes and `skewsim calibrate` reads
//! ([`Measurement`], CSV text in and out), the [`Pricing`] of one measured launch through
//! the one cost model (the kernel efficiency table [`EffTable`] answered per segment by
//! (heads per call, query length, KV length), plus the launch and copy terms of
//! [`LaunchCosts`]), the predicted-vs-measured [`Summary`] and the [`fit`] that turns
//! measurements into a [`Calibration`].
//!
//! It may not read files or touch a device (the CLI does), and it never prices work by a
//! formula of its own: a launch of segments costs `attn_launch_us` + Σ segments FLOPs /
//! `EffTable::tflops(heads, q, kv)` (the engine's formula, Libra Eq. 8 FLOPs at the
//! measured rate) — or, when the pricing has a block model, `attn_launch_us` + the
//! makespan of the launch's thread blocks on the SMs ([`crate::cost::blocks::launch_fwd_ps_f`]); a copy
//! costs `copy_launch_us` + bytes / `copy_bytes_per_s`.
//!
//! Backward rows ([`Pass::Bwd`]: the dQ, dK, dV launches of the same units) price through
//! the same formula with the backward table ([`super::attn_bwd_segment_ps_f`]:
//! `attn_bwd_flop_factor` × forward FLOPs at the backward table's rate, or at the forward
//! rate × `attn_bwd_efficiency` while no backward table is known) plus the backward call's
//! overhead `attn_bwd_launch_us` — or, with a backward block model, that overhead + the
//! call's per-row·head work and its two launches' makespans ([`crate::cost::blocks::launch_bwd_ps_f`]).
//!
//! Fitting: copies by weighted least squares on relative residuals (closed form, 2
//! unknowns); attention, forward and backward alike, by Levenberg–Marquardt on relative
//! residuals over ln(TFLOP/s) at the grid's nodes and the launch overhead, pricing every
//! candidate through [`EffTable::from_points`] + [`EffTable::tflops`], so the fitted table
//! is exactly the one the engine will interpolate. Nodes no measurement reaches keep their
//! starting value (forward: the built-in H200 table's; backward: the fitted forward table
//! × `attn_bwd_efficiency`). The scalar `attn_bwd_efficiency` is refitted too (median
//! ratio of the forward-table backward price to the measured backward), for consumers that
//! price the backward as forward × factor / efficiency. With [`FitOptions::blocks`] the
//! forward's [`BlockModel`] (five times and factors) and its call overhead are fitted the
//! same way (Levenberg–Marquardt on the launches' relative residuals, every candidate priced
//! through [`crate::cost::blocks::LaunchBlocks::makespan_ps`]); the calibration then prices forward
//! launches by it, and keeps the fitted table for the backward's start and for reference.
//! With [`FitOptions::bwd_blocks`] the backward's [`BwdBlockModel`] is fitted likewise
//! (shared ratios searched; call overhead, per-row·head time and the dQ and dK/dV step
//! times solved by non-negative weighted least squares for each candidate) and prices
//! backward calls instead of the backward table.
//!
//! CSV format: a first line `#skewsim-measurements,v2`, then the header. Version 1 (no
//! version line, no `pass` column: forward rows only) and any other version are refused
//! with an error naming the file and the versions allowed.
//!
//! Files: `records.rs` (the CSV record), `pricing.rs`, `summary.rs`, `table_fit.rs`,
//! `block_fit.rs`, `solve.rs` (the solvers they share); [`fit`] here ties them together.

mod block_fit;
mod pricing;
mod records;
mod solve;
mod summary;
mod table_fit;
#[cfg(test)]
mod tests;

use block_fit::*;
pub(crate) use pricing::row_blocks;
pub use pricing::Pricing;
pub use records::*;
use solve::*;
pub use summary::*;
use table_fit::*;

use super::blocks::{BlockModel, BwdBlockModel};
use super::{Calibration, EffTable, LaunchCosts};
use crate::error::{invalid, Result};

/// Settings of [`fit`].
#[derive(Clone, Debug)]
pub struct FitOptions {
    /// Grid lengths (tokens) of the fitted table; empty: powers of 2 spanning the data.
    pub lens: Vec<u32>,
    /// Levenberg–Marquardt iterations.
    pub iterations: usize,
    /// Weight of the pull towards the starting pricing: one residual per node,
    /// `w·(ln tflops − ln tflops₀)`, and `w·(µs − µs₀)/10` for the launch overhead, beside
    /// the launches' relative errors. Keeps nodes and overhead that the data cannot tell
    /// apart (all launches long, few lengths) at the start instead of trading off wildly.
    pub prior_weight: f64,
    /// Fit the forward kernel's [`BlockModel`] with this geometry (SMs, resident blocks,
    /// rows and keys per block, head_dim; its times are ignored: the start is the starting
    /// pricing's model, else derived from the data); `None`: none (the table prices the
    /// forward).
    pub blocks: Option<BlockModel>,
    /// Fit the backward kernels' [`BwdBlockModel`] with this geometry (its times are
    /// ignored, as for `blocks`) when there are backward rows; `None`: none (the backward
    /// table prices the backward).
    pub bwd_blocks: Option<BwdBlockModel>,
    /// Wall-clock seconds each of the fits (forward table, forward block model, backward
    /// table, backward block model) may take; past it the fit stops with an error naming
    /// the fit and the model evaluations it made.
    pub time_budget_s: f64,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            time_budget_s: 120.0,
            lens: Vec::new(),
            iterations: 30,
            prior_weight: 0.03,
            blocks: None,
            bwd_blocks: None,
        }
    }
}

/// The fitted parameters and how well they reproduce the fitting data.
#[derive(Clone, Debug)]
pub struct FitResult {
    /// The fitted calibration.
    pub calibration: Calibration,
    /// Root mean square relative residual of the forward attention launches under the
    /// calibration's forward pricing (the block model when fitted, else the table; fraction).
    pub attn_rms_rel: f64,
    /// The same under the fitted table alone.
    pub table_rms_rel: f64,
    /// Forward attention launches used.
    pub attn_rows: usize,
    /// The same for backward calls under the calibration's backward pricing (the backward
    /// block model when fitted, else the backward table; `None` without backward rows).
    pub bwd_rms_rel: Option<f64>,
    /// The backward calls under the fitted backward table alone.
    pub bwd_table_rms_rel: Option<f64>,
    /// Backward calls used.
    pub bwd_rows: usize,
    /// Copies used.
    pub copy_rows: usize,
}

/// One fit's time budget: every model evaluation counts, and one past the deadline is an
/// error naming the fit, the evaluations made and the limit.
pub(super) struct Budget {
    fit: &'static str,
    start: std::time::Instant,
    limit_s: f64,
    evals: std::sync::atomic::AtomicUsize,
}

impl Budget {
    fn new(fit: &'static str, opts: &FitOptions) -> Self {
        Budget {
            fit,
            start: std::time::Instant::now(),
            limit_s: opts.time_budget_s,
            evals: Default::default(),
        }
    }

    /// Count one evaluation; an error once the budget is spent.
    fn tick(&self) -> Result<()> {
        let n = self
            .evals
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let t = self.start.elapsed().as_secs_f64();
        if t > self.limit_s {
            return Err(invalid(
                format!("calibration fit `{}`", self.fit),
                format!("{t:.1} s after {n} model evaluations"),
                format!(
                    "a fit within its time budget of {} s (are the measurement rows launches \
                     the kernels ran?)",
                    self.limit_s
                ),
            ));
        }
        Ok(())
    }
}

/// Fit copy terms: minimise Σ ((a + b·bytes − t)/t)², a = launch ms, b = ms per byte.
pub(super) fn fit_copies(rows: &[&Measurement], base: &LaunchCosts) -> LaunchCosts {
    let pts: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r.bytes > 0 && r.measured_ms > 0.0)
        .map(|r| (r.bytes as f64, r.measured_ms))
        .collect();
    let mut out = base.clone();
    if let Some((a, b)) = weighted_line(&pts) {
        if b > 0.0 {
            out.copy_launch_us = a * 1e3;
            out.copy_bytes_per_s = 1e3 / b;
        }
    }
    out
}

/// Lognormal σ of run-to-run jitter from each row's p10/p90 around its median:
/// median over rows of ln(p90/p10) / (2·z₀.₉), z₀.₉ = 1.2816.
pub(super) fn fit_jitter(rows: &[&Measurement]) -> Option<f64> {
    let mut s: Vec<f64> = rows
        .iter()
        .filter(|r| r.p10_ms > 0.0 && r.p90_ms >= r.p10_ms)
        .map(|r| (r.p90_ms / r.p10_ms).ln() / (2.0 * 1.2816))
        .collect();
    s.sort_by(f64::total_cmp);
    (!s.is_empty()).then(|| quantile(&s, 0.5))
}

/// The most common head_dim of `rows` (`or` without rows).
pub(super) fn common_head_dim(rows: &[&Measurement], or: u32) -> u32 {
    let mut dims: Vec<u32> = rows.iter().map(|r| r.head_dim).collect();
    dims.sort_unstable();
    dims.chunk_by(|a, b| a == b)
        .max_by_key(|c| c.len())
        .map_or(or, |c| c[0])
}

/// Fit the forward efficiency table (heads per call × length) and launch overhead, the
/// backward table and call overhead when there are backward rows, the scalar backward
/// efficiency, copy terms and jitter to `rows`. Tables start from `start` at every node
/// (the backward one, when `start` has none, from the fitted forward table ×
/// `attn_bwd_efficiency`).
pub fn fit(rows: &[Measurement], start: &Pricing, opts: &FitOptions) -> Result<FitResult> {
    let attn_of = |pass: Pass| -> Vec<&Measurement> {
        rows.iter()
            .filter(|r| {
                r.kind == MeasureKind::Attn
                    && r.pass == pass
                    && !r.segs.is_empty()
                    && r.measured_ms > 0.0
            })
            .collect()
    };
    let (attn, attn_bwd) = (attn_of(Pass::Fwd), attn_of(Pass::Bwd));
    let copies: Vec<&Measurement> = rows
        .iter()
        .filter(|r| r.kind != MeasureKind::Attn)
        .collect();
    if attn.is_empty() {
        return Err(invalid(
            "measurements",
            "no forward attention rows with segments and a positive time",
            "at least one measured attention launch",
        ));
    }
    let nodes = grid_nodes(&attn, opts)?;
    let start_t: Vec<f64> = nodes
        .iter()
        .map(|&(h, l)| start.eff.tflops(h, u64::from(l), u64::from(l)))
        .collect();
    let compute = |eff: &EffTable, r: &Measurement| {
        Pricing::attn_compute_ms(eff, r.heads, (r.head_dim, r.mask), &r.segs)
    };
    let table = fit_table(
        "forward table",
        &attn,
        &nodes,
        &start_t,
        start.launch.attn_launch_us,
        opts,
        &compute,
    )?;
    // The block model, fitted at the launches' most common head_dim, starts from the
    // starting pricing's when it has one of the same geometry.
    let blocks = match opts.blocks {
        None => None,
        Some(mut template) => {
            template.head_dim = common_head_dim(&attn, template.head_dim);
            let same = |m: &&BlockModel| m.layout() == template.layout();
            let s = start.blocks.as_ref().filter(same);
            Some(fit_blocks(&attn, &template, s, opts)?)
        }
    };
    // The backward is priced per segment: its starting table and the scalar efficiency
    // come from the per-segment forward table.
    let fwd_eff = EffTable::from_points(&table.points, "fit")?;
    let hw = start.hw;
    let mut launch = fit_copies(&copies, &start.launch);
    launch.attn_launch_us = blocks.as_ref().map_or(table.launch_us, |b| b.launch_us);
    launch.jitter_sigma = fit_jitter(&attn).or(start.launch.jitter_sigma);
    let mut hardware = hw;
    // Without backward rows there is no backward table (the scalar efficiency of `start`
    // stays); with them, the table, the call overhead and the scalar are fitted.
    let (attn_bwd_points, bwd_rms) = if attn_bwd.is_empty() {
        (None, None)
    } else {
        let factor = hw.attn_bwd_flop_factor;
        // The scalar for forward × factor / efficiency pricing: the median over backward
        // calls of (forward-table price × factor) / (measured − call overhead).
        let ratio = |launch_us: f64| -> Option<f64> {
            let mut v: Vec<f64> = attn_bwd
                .iter()
                .filter_map(|r| {
                    let t = r.measured_ms - launch_us * 1e-3;
                    let f =
                        Pricing::attn_compute_ms(&fwd_eff, r.heads, (r.head_dim, r.mask), &r.segs)
                            * factor;
                    (t > 0.0 && f > 0.0).then_some(f / t)
                })
                .collect();
            v.sort_by(f64::total_cmp);
            (!v.is_empty()).then(|| quantile(&v, 0.5).clamp(1e-3, 1.0))
        };
        // Nodes the backward rows do not reach start from the fitted forward table × this
        // measured ratio (not the assumed `attn_bwd_efficiency`).
        let e0 = ratio(0.0).unwrap_or(hw.attn_bwd_efficiency);
        let bnodes = grid_nodes(&attn_bwd, opts)?;
        let bstart: Vec<f64> = bnodes
            .iter()
            .map(|&(h, l)| {
                let l = u64::from(l);
                match &start.bwd {
                    Some(b) => b.tflops(h, l, l),
                    None => fwd_eff.tflops(h, l, l) * e0,
                }
            })
            .collect();
        let b = fit_table(
            "backward table",
            &attn_bwd,
            &bnodes,
            &bstart,
            start.bwd_launch_us(),
            opts,
            &|eff, r| {
                factor * Pricing::attn_compute_ms(eff, r.heads, (r.head_dim, r.mask), &r.segs)
            },
        )?;
        launch.attn_bwd_launch_us = b.launch_us;
        if let Some(e) = ratio(b.launch_us) {
            hardware.attn_bwd_efficiency = e;
        }
        (Some(b.points), Some(b.rms_rel))
    };
    // The backward block model, at the backward calls' most common head_dim, from the
    // starting pricing's when it has one of the same geometry; its call overhead replaces
    // the table's (the scalar efficiency above stays the table's reading).
    let bwd_blocks = match opts.bwd_blocks {
        Some(mut template) if !attn_bwd.is_empty() => {
            template.head_dim = common_head_dim(&attn_bwd, template.head_dim);
            let same = |m: &&BwdBlockModel| m.layout() == template.layout();
            let s = start.bwd_blocks.as_ref().filter(same);
            let f = fit_bwd_blocks(&attn_bwd, &template, s, opts)?;
            launch.attn_bwd_launch_us = f.launch_us;
            Some(f)
        }
        _ => None,
    };
    Ok(FitResult {
        calibration: Calibration {
            attn_fwd: table.points,
            attn_bwd: attn_bwd_points,
            hardware,
            launch,
            attn_blocks: blocks.as_ref().map(|b| b.model),
            attn_bwd_blocks: bwd_blocks.as_ref().map(|b| b.model),
        },
        attn_rms_rel: blocks.as_ref().map_or(table.rms_rel, |b| b.rms_rel),
        table_rms_rel: table.rms_rel,
        attn_rows: attn.len(),
        bwd_rms_rel: bwd_blocks.as_ref().map(|b| b.rms_rel).or(bwd_rms),
        bwd_table_rms_rel: bwd_rms,
        bwd_rows: attn_bwd.len(),
        copy_rows: copies.iter().filter(|r| r.bytes > 0).count(),
    })
}
