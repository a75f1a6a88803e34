//! `skewsim calibrate --elementwise`: fit (or with `--score-only` score) the elementwise
//! model ([`skewsim::cost::elementwise`]) to measured kernels by kind
//! (`validate/torch/elementwise.py`'s CSVs), scored on held-out rows.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;

use skewsim::cost::elementwise::{self as ew, ElemRow, ElementwiseModel, KindRate};
use skewsim::experiment::inputs::{read_input_text, MAX_TABLE_BYTES};

use super::calibrate::Args;
use super::Output;

fn rows(files: &[PathBuf]) -> Result<Vec<ElemRow>> {
    let mut rows = Vec::new();
    for f in files {
        let name = f.display().to_string();
        let text =
            read_input_text(f, MAX_TABLE_BYTES).with_context(|| format!("reading {name}"))?;
        rows.extend(ew::rows_from_csv(&text, &name)?);
    }
    Ok(rows)
}

/// One kind's rate and its scores (median and max APE %) on the fit and held-out rows.
#[derive(Serialize)]
struct KindScore {
    rate: KindRate,
    fit: (usize, f64, f64),
    check: (usize, f64, f64),
}

#[derive(Serialize)]
struct Report {
    fitted: bool,
    kinds: Vec<KindScore>,
    out: Option<String>,
}

fn score(m: &ElementwiseModel, rows: &[ElemRow], r: &KindRate) -> (usize, f64, f64) {
    let mine: Vec<ElemRow> = rows
        .iter()
        .filter(|x| x.kind == r.kind && x.bwd == r.bwd)
        .cloned()
        .collect();
    let mut e = ew::errors(m, &mine);
    e.sort_by(f64::total_cmp);
    let q = |p: f64| {
        e.get(((e.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    (e.len(), q(0.5), q(1.0))
}

pub fn run(args: &Args, out: Output) -> Result<()> {
    let (fit_rows, check) = (rows(&args.elementwise)?, rows(&args.elementwise_check)?);
    let model = if args.score_only {
        ElementwiseModel::h200_default()?
    } else {
        ew::fit(&fit_rows)?
    };
    let path = (!args.score_only).then(|| args.out.clone());
    if let Some(p) = &path {
        let text = serde_json::to_string_pretty(&model)? + "\n";
        std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    let r = Report {
        fitted: !args.score_only,
        kinds: model
            .kinds
            .iter()
            .map(|k| KindScore {
                rate: k.clone(),
                fit: score(&model, &fit_rows, k),
                check: score(&model, &check, k),
            })
            .collect(),
        out: path.map(|p| p.display().to_string()),
    };
    out.emit(&r, || {
        let mut t = format!(
            "elementwise model ({}){}\nkind     pass  call µs  TB/s   fit n  median %  max %  check n  median %  max %\n",
            if r.fitted { "fitted" } else { "built in" },
            r.out.as_ref().map(|p| format!(", written to {p}")).unwrap_or_default()
        );
        for k in &r.kinds {
            t.push_str(&format!(
                "{:<8} {:<4} {:>8.2} {:>5.2} {:>7} {:>9.2} {:>6.2} {:>8} {:>9.2} {:>6.2}\n",
                k.rate.kind.name(),
                if k.rate.bwd { "bwd" } else { "fwd" },
                k.rate.call_us,
                k.rate.bytes_per_s * 1e-12,
                k.fit.0,
                k.fit.1,
                k.fit.2,
                k.check.0,
                k.check.1,
                k.check.2
            ));
        }
        t
    })
}
