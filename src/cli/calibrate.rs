//! `skewsim calibrate --measurements m.csv -o calibration.json`: fit the cost model to GPU
//! measurements (issue 7, "Calibration").
//!
//! Reads measurement CSVs (`skewsim validate`) and PyTorch-profiler Chrome traces
//! (`--trace`, FlashAttention forward kernels joined to their shapes by
//! `validate::trace`), splits the plans by seed into fit and held-out sets, fits with
//! [`skewsim::cost::fit::fit`] and prints predicted vs measured on the held-out plans,
//! before (the starting table) and after calibration. Writes the calibration JSON that
//! `--calibration` reads. The fitting itself lives in the library (no I/O there).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use skewsim::cost::fit::{self, FitOptions, MeasureKind, Measurement, Pricing, SegCount, Summary};
use skewsim::cost::EffTable;

use super::Output;

#[derive(clap::Args)]
pub struct Args {
    /// Measurement CSVs written by `skewsim validate`.
    #[arg(long, num_args = 1..)]
    pub measurements: Vec<PathBuf>,
    /// PyTorch-profiler Chrome traces (record_shapes=True) of causal FlashAttention forward
    /// calls; every such kernel becomes a fitting row (whole documents).
    #[arg(long, num_args = 1..)]
    pub trace: Vec<PathBuf>,
    /// Seeds whose plans are held out for scoring [default: every second distinct seed,
    /// the 2nd, 4th, ... in increasing order].
    #[arg(long, value_delimiter = ',')]
    pub holdout_seeds: Option<Vec<u64>>,
    /// Start from this calibration instead of the built-in H200 table.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Grid lengths of the fitted table (tokens, comma-separated) [default: powers of 2
    /// spanning the data].
    #[arg(long, value_delimiter = ',')]
    pub lens: Option<Vec<u32>>,
    /// Pull of the fit towards the starting table (see `FitOptions::prior_weight`).
    #[arg(long, default_value_t = 0.03)]
    pub prior_weight: f64,
    /// Where to write the calibration JSON.
    #[arg(short, long, default_value = "calibration.json")]
    pub out: PathBuf,
}

/// Rows from a Chrome trace: each causal flash forward kernel as one launch of `b` whole
/// documents of `l` tokens at `h` heads.
pub fn trace_rows(json: &str, name: &str) -> Result<Vec<Measurement>> {
    let events = validate::trace::parse_kernels(json, "flash_fwd")
        .with_context(|| format!("reading trace {name}"))?;
    let mut rows = Vec::new();
    for (i, k) in events.iter().enumerate() {
        let (Some(flops), Some(dims)) = (k.causal_flash_fwd_flops(), k.input_dims.first()) else {
            continue;
        };
        let &[b, l, h, d] = dims.as_slice() else {
            continue;
        };
        let (Ok(b), Ok(l), Ok(h), Ok(d)) = (
            u32::try_from(b),
            u32::try_from(l),
            u32::try_from(h),
            u32::try_from(d),
        ) else {
            bail!("{name}: kernel {i}: shape {dims:?} out of range");
        };
        let ms = k.dur_us * 1e-3;
        rows.push(Measurement {
            kind: MeasureKind::Attn,
            plan: format!("trace:{name}"),
            seed: u64::MAX,
            scheme: "trace".into(),
            step: 0,
            ga: 0,
            pool: 0,
            worker: 0,
            chunk: i as u32,
            units: u64::from(b),
            segments: u64::from(b),
            tiles: 0,
            heads: h,
            head_dim: d,
            q_tokens: u64::from(b) * u64::from(l),
            flops,
            bytes: 0,
            predicted_ms: None,
            measured_ms: ms,
            p10_ms: ms,
            p90_ms: ms,
            segs: vec![SegCount { q: l, kv: l, n: b }],
        });
    }
    Ok(rows)
}

#[derive(Serialize)]
struct Report {
    fit_rows: usize,
    fit_copy_rows: usize,
    fit_rms_rel: f64,
    fit_seeds: Vec<u64>,
    holdout_seeds: Vec<u64>,
    holdout_before: Summary,
    holdout_after: Summary,
    out: String,
}

pub fn run(args: Args, out: Output) -> Result<()> {
    if args.measurements.is_empty() && args.trace.is_empty() {
        bail!("calibrate needs at least one --measurements CSV or --trace file");
    }
    let start = super::validate::pricing_from(args.calibration.as_deref())?;
    let mut rows = Vec::new();
    for f in &args.measurements {
        let name = f.display().to_string();
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading measurements {name}"))?;
        rows.extend(fit::measurements_from_csv(&text, &name)?);
    }
    let mut trace = Vec::new();
    for f in &args.trace {
        let name = f.display().to_string();
        let text = std::fs::read_to_string(f).with_context(|| format!("reading trace {name}"))?;
        let t = trace_rows(&text, &name)?;
        if t.is_empty() {
            bail!("{name}: no causal FlashAttention forward kernels with shapes (profile with record_shapes=True)");
        }
        trace.extend(t);
    }
    let mut seeds: Vec<u64> = rows.iter().map(|r| r.seed).collect();
    seeds.sort_unstable();
    seeds.dedup();
    let holdout: Vec<u64> = match &args.holdout_seeds {
        Some(h) => h.clone(),
        None => seeds.iter().skip(1).step_by(2).copied().collect(),
    };
    let (test, mut train): (Vec<Measurement>, Vec<Measurement>) =
        rows.into_iter().partition(|r| holdout.contains(&r.seed));
    train.extend(trace);
    if train.iter().all(|r| r.kind != MeasureKind::Attn) {
        bail!("no attention rows left to fit after holding out seeds {holdout:?}");
    }
    let opts = FitOptions {
        lens: args.lens.clone().unwrap_or_default(),
        prior_weight: args.prior_weight,
        ..FitOptions::default()
    };
    let f = fit::fit(&train, &start, &opts)?;
    let fitted = Pricing {
        eff: EffTable::from_points(&f.calibration.attn_fwd, "fit")?,
        launch: f.calibration.launch.clone(),
    };
    let json = serde_json::to_string_pretty(&f.calibration)?;
    std::fs::write(&args.out, json + "\n")
        .with_context(|| format!("writing {}", args.out.display()))?;
    let fit_seeds: Vec<u64> = seeds
        .iter()
        .filter(|s| !holdout.contains(s))
        .copied()
        .collect();
    let report = Report {
        fit_rows: f.attn_rows,
        fit_copy_rows: f.copy_rows,
        fit_rms_rel: f.attn_rms_rel,
        fit_seeds,
        holdout_seeds: holdout,
        holdout_before: fit::summarize(&test, &start),
        holdout_after: fit::summarize(&test, &fitted),
        out: args.out.display().to_string(),
    };
    out.emit(&report, || {
        let l = &f.calibration.launch;
        format!(
            "fitted on seeds {:?} ({} attention launches, {} copies; rms relative residual {:.2} %)\n\
             attention launch {:.2} µs, copy {:.2} µs + {:.3} TB/s, jitter σ {}\n\
             wrote {}\n\nheld-out seeds {:?}, before calibration (starting table):\n{}\n\
             held-out seeds {:?}, after calibration:\n{}",
            report.fit_seeds,
            report.fit_rows,
            report.fit_copy_rows,
            100.0 * report.fit_rms_rel,
            l.attn_launch_us,
            l.copy_launch_us,
            l.copy_bytes_per_s / 1e12,
            l.jitter_sigma
                .map(|s| format!("{s:.4}"))
                .unwrap_or_else(|| "-".into()),
            report.out,
            report.holdout_seeds,
            report.holdout_before.table(),
            report.holdout_seeds,
            report.holdout_after.table(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_trace_feeds_the_fit() {
        let text = include_str!("../../traces/h200_sdpa_flash_fwd.json");
        let rows = trace_rows(text, "h200_sdpa_flash_fwd.json").unwrap();
        // 3 shapes × 3 calls: (b, l, h) = (8, 512, 8), (2, 4096, 8), (1, 8192, 32).
        assert_eq!(rows.len(), 9);
        assert_eq!(
            rows[0].segs,
            vec![SegCount {
                q: 512,
                kv: 512,
                n: 8
            }]
        );
        assert_eq!(rows[8].heads, 32);
        assert!((rows[0].measured_ms - 0.033248).abs() < 1e-12);
        let start = Pricing::h200_default().unwrap();
        let f = fit::fit(
            &rows,
            &start,
            &FitOptions {
                lens: vec![512, 4096, 8192],
                iterations: 40,
                prior_weight: 1e-5,
            },
        )
        .unwrap();
        // Nine kernels of three shapes: the fitted table reproduces each shape's calls to
        // their own spread (repeat calls of one shape differ by a few %).
        assert!(f.attn_rms_rel < 0.05, "{}", f.attn_rms_rel);
        // The 8192-token 32-head calls: fitted rate within 5 % of the rate measured.
        let measured: Vec<f64> = rows[6..9]
            .iter()
            .map(|r| r.flops / (r.measured_ms * 1e9))
            .collect();
        let eff = EffTable::from_points(&f.calibration.attn_fwd, "fit").unwrap();
        let t = eff.tflops(32, 8192, 8192);
        let mean = measured.iter().sum::<f64>() / 3.0;
        assert!((t / mean - 1.0).abs() < 0.05, "{t} vs {measured:?}");
    }
}
