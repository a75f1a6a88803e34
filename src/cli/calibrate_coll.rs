//! `skewsim calibrate --collectives FILE...`: the collective model against measured
//! collectives ([`skewsim::net::collective_fit`]). Reads the rows, prices each on the
//! topology's first GPUs, holds rows out by GPU count (`--holdout-gpus`) and by size
//! (`--holdout-every`), and fits two forms on the rest: the model's own parameters (NVLink
//! and NVLS efficiency, latency scale, NVLS chunk copy: topology settings) and a latency
//! and a bandwidth per algorithm (`[[collectives.fit]]` lines). Prints, for the held-out
//! rows, both fits' and the unfitted model's errors by (op, GPUs) and by size band. `-o`
//! gets the fits and the scores as JSON.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use skewsim::cluster::TopologySpec;
use skewsim::cost::fit::ErrStats;
use skewsim::experiment::inputs::{read_input_text, MAX_SPEC_BYTES, MAX_TABLE_BYTES};
use skewsim::net::collective::CollectiveModel;
use skewsim::net::collective_fit::{self, AlgoFit, CollRow, ParamFit, Priced};

use super::calibrate::Args;
use super::Output;

/// Sizes from this many bytes on are scored apart (the ≥ 64 MiB target).
const LARGE: u64 = 64 << 20;

/// One held-out group's errors.
#[derive(Serialize)]
struct Score {
    /// `op gpus` or a size band.
    group: String,
    /// With the fitted latency and bandwidth per algorithm.
    fitted: ErrStats,
    /// With the model's own parameters fitted.
    params: ErrStats,
    /// With the model as the topology and NCCL's table give it.
    model: ErrStats,
}

#[derive(Serialize)]
struct Report {
    topology: String,
    nvls: bool,
    rows: usize,
    /// Rows on one GPU (nothing crosses a link; neither fitted nor scored).
    single_gpu_rows: usize,
    fitted_rows: usize,
    held_out_rows: usize,
    params: ParamFit,
    fit: Vec<AlgoFit>,
    scores: Vec<Score>,
}

pub fn run(args: &Args, out: Output) -> Result<()> {
    let mut rows: Vec<CollRow> = Vec::new();
    for f in &args.collectives {
        let name = f.display().to_string();
        let text = read_input_text(f, MAX_TABLE_BYTES)
            .with_context(|| format!("reading collectives {name}"))?;
        rows.extend(collective_fit::rows_from_csv(&text, &name)?);
    }
    let total = rows.len();
    rows.retain(|r| r.gpus >= 2);
    let single = total - rows.len();
    if rows.is_empty() {
        bail!("--collectives: all {total} rows are on one GPU: a collective crosses no link there, nothing to fit or score (measure on 2 or more GPUs)");
    }
    let tname = args.topology.display().to_string();
    let text = read_input_text(&args.topology, MAX_SPEC_BYTES)
        .with_context(|| format!("reading topology {tname} (--topology)"))?;
    let mut spec = TopologySpec::parse(&text, &tname)?;
    let most = rows.iter().map(|r| r.gpus).max().unwrap_or(2);
    let nodes = collective_fit::nodes_for(&spec, most);
    if args.score_only {
        return score(args, out, &rows, single, tname, &spec, nodes);
    }
    // rows are priced by NCCL's table and the links, never by an earlier fit
    spec.collectives.fit.clear();
    let topo = Arc::new(spec.build(Some(nodes))?);
    let coll = CollectiveModel::of(&topo, args.nvls);
    let priced: Vec<Priced> = rows
        .iter()
        .map(|r| {
            collective_fit::price(r, &topo, &coll)
                .with_context(|| format!("{} on {} GPUs, {} bytes", r.op.name(), r.gpus, r.bytes))
        })
        .collect::<Result<_>>()?;
    // held out: by GPU count, and every K-th size of each (op, GPUs) series from the 2nd
    let mut held = vec![false; rows.len()];
    let mut series: BTreeMap<(_, u32), Vec<usize>> = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        held[i] = args.holdout_gpus.contains(&r.gpus);
        series.entry((r.op, r.gpus)).or_default().push(i);
    }
    if args.holdout_every > 0 {
        for idx in series.values_mut() {
            idx.sort_by_key(|&i| rows[i].bytes);
            for (k, &i) in idx.iter().enumerate() {
                held[i] |= k >= 1 && (k - 1) % args.holdout_every == 0;
            }
        }
    }
    let points: Vec<(&'static str, f64, f64)> = (0..rows.len())
        .filter(|&i| !held[i])
        .map(|i| (priced[i].algo, priced[i].port_bytes, rows[i].time_us))
        .collect();
    if points.is_empty() {
        bail!("--collectives: every row is held out (--holdout-gpus / --holdout-every): nothing left to fit");
    }
    let fits = collective_fit::fit(&points)?;
    let kept: Vec<CollRow> = (0..rows.len())
        .filter(|&i| !held[i])
        .map(|i| rows[i].clone())
        .collect();
    let params = collective_fit::fit_params(&spec, &kept, args.nvls)?;
    let mut pspec = spec.clone();
    params.apply_to(&mut pspec);
    let ptopo = Arc::new(pspec.build(Some(nodes))?);
    let pcoll = CollectiveModel::of(&ptopo, args.nvls);
    let fitted_us = |i: usize| -> Result<f64> {
        let f = fits.iter().find(|f| f.algo == priced[i].algo).with_context(|| {
            format!(
                "held-out {} row on {} GPUs uses algorithm {}, which no fitted row uses: hold out fewer rows",
                rows[i].op.name(),
                rows[i].gpus,
                priced[i].algo
            )
        })?;
        Ok(f.predict_us(priced[i].port_bytes))
    };
    // per group: (lines, measured), (parameters, measured) and (model, measured) pairs
    type Pairs = Vec<(f64, f64)>;
    let mut groups: BTreeMap<String, [Pairs; 3]> = BTreeMap::new();
    let mut held_n = 0;
    for i in (0..rows.len()).filter(|&i| held[i]) {
        held_n += 1;
        let r = &rows[i];
        let pair = (fitted_us(i)?, r.time_us);
        let par = (
            collective_fit::price(r, &ptopo, &pcoll)?.model_us,
            r.time_us,
        );
        let base = (priced[i].model_us, r.time_us);
        for key in groups_of(r, "all held out") {
            let g = groups.entry(key).or_default();
            g[0].push(pair);
            g[1].push(par);
            g[2].push(base);
        }
    }
    let scores: Vec<Score> = groups
        .into_iter()
        .map(|(group, [f, p, m])| Score {
            group,
            fitted: ErrStats::of(&f),
            params: ErrStats::of(&p),
            model: ErrStats::of(&m),
        })
        .collect();
    let report = Report {
        topology: tname,
        nvls: args.nvls,
        rows: total,
        single_gpu_rows: single,
        fitted_rows: points.len(),
        held_out_rows: held_n,
        params,
        fit: fits,
        scores,
    };
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", args.out.display()))?;
    out.emit(&report, || {
        report_text(&report, &args.out.display().to_string())
    })
}

/// The groups a row is scored in: its (op, GPUs), its size band and `all`.
fn groups_of(r: &CollRow, all: &str) -> [String; 3] {
    let band = if r.bytes >= LARGE {
        "sizes >= 64 MiB"
    } else {
        "sizes < 64 MiB"
    };
    [
        format!("{} {} GPUs", r.op.name(), r.gpus),
        band.to_string(),
        all.to_string(),
    ]
}

/// One row as the topology's model prices it.
#[derive(Serialize)]
struct RowScore {
    op: &'static str,
    gpus: u32,
    bytes: u64,
    algo: &'static str,
    measured_us: f64,
    model_us: f64,
    /// (model − measured) / measured, %.
    error_pct: f64,
}

/// One group's errors of the topology's model.
#[derive(Serialize)]
struct GroupScore {
    group: String,
    model: ErrStats,
}

#[derive(Serialize)]
struct ScoreReport {
    topology: String,
    nvls: bool,
    rows: usize,
    /// Rows on one GPU (nothing crosses a link; not scored).
    single_gpu_rows: usize,
    scored: Vec<RowScore>,
    scores: Vec<GroupScore>,
}

/// `--score-only`: every row priced by the topology's model as the file gives it (its
/// `[[collectives.fit]]` lines included), nothing fitted or held out.
fn score(
    args: &Args,
    out: Output,
    rows: &[CollRow],
    single: usize,
    tname: String,
    spec: &TopologySpec,
    nodes: u32,
) -> Result<()> {
    let topo = Arc::new(spec.build(Some(nodes))?);
    let coll = CollectiveModel::of(&topo, args.nvls);
    let mut scored = Vec::with_capacity(rows.len());
    let mut groups: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in rows {
        let p = collective_fit::price(r, &topo, &coll)
            .with_context(|| format!("{} on {} GPUs, {} bytes", r.op.name(), r.gpus, r.bytes))?;
        for key in groups_of(r, "all rows") {
            groups.entry(key).or_default().push((p.model_us, r.time_us));
        }
        scored.push(RowScore {
            op: r.op.name(),
            gpus: r.gpus,
            bytes: r.bytes,
            algo: p.algo,
            measured_us: r.time_us,
            model_us: p.model_us,
            error_pct: 100.0 * (p.model_us / r.time_us - 1.0),
        });
    }
    let report = ScoreReport {
        topology: tname,
        nvls: args.nvls,
        rows: rows.len() + single,
        single_gpu_rows: single,
        scored,
        scores: groups
            .into_iter()
            .map(|(group, pairs)| GroupScore {
                group,
                model: ErrStats::of(&pairs),
            })
            .collect(),
    };
    out.emit(&report, || score_text(&report))
}

fn score_text(r: &ScoreReport) -> String {
    let mut s = format!(
        "{} rows ({} on one GPU, left out), priced by topology {} as it is, NVLS {}; nothing fitted\n\n\
         op              GPUs        bytes  algorithm  measured us     model us   error %\n",
        r.rows,
        r.single_gpu_rows,
        r.topology,
        if r.nvls { "on" } else { "off" }
    );
    for x in &r.scored {
        s.push_str(&format!(
            "{:<16}{:>4}{:>13}  {:<9}{:>13.2}{:>13.2}{:>+10.2}\n",
            x.op, x.gpus, x.bytes, x.algo, x.measured_us, x.model_us, x.error_pct
        ));
    }
    s.push_str("\ngroup                             n  median APE %  p90 APE %  max APE %\n");
    for g in &r.scores {
        s.push_str(&format!(
            "{:<30}{:>5}{:>14.2}{:>11.2}{:>11.2}\n",
            g.group, g.model.n, g.model.median_ape, g.model.p90_ape, g.model.max_ape
        ));
    }
    s
}

fn report_text(r: &Report, out: &str) -> String {
    let p = &r.params;
    let mut s = format!(
        "{} rows ({} on one GPU, left out): {} fitted, {} held out; topology {}, NVLS {}\n\n\
         the model's own parameters ({} ring rows, {} NVLS rows inside one NVLink domain; {} round(s) of NCCL's choice)",
        r.rows,
        r.single_gpu_rows,
        r.fitted_rows,
        r.held_out_rows,
        r.topology,
        if r.nvls { "on" } else { "off" },
        p.ring_rows,
        p.nvls_rows,
        p.rounds,
    );
    // only what rows were fitted to: the rest stays the topology's
    let mut nvlink = Vec::new();
    let mut coll = Vec::new();
    if p.ring_rows > 0 {
        nvlink.push(format!("efficiency = {:.3}", p.nvlink_efficiency));
        coll.push(format!("latency_scale = {:.3}", p.latency_scale));
    }
    if p.nvls_rows > 0 {
        if let Some(e) = p.sharp_efficiency {
            nvlink.push(format!("sharp_efficiency = {e:.3}"));
        }
        if let Some(c) = p.nvls_copy_us {
            coll.push(format!("nvls_copy_us = {c:.3}"));
        }
    }
    if nvlink.is_empty() && coll.is_empty() {
        s.push_str(": none fitted, no row runs inside one NVLink domain\n");
    } else {
        s.push_str(
            ", as topology settings (or pass the -o file to `skewsim topo --collectives`):\n",
        );
        for (table, lines) in [("[nvlink]", &nvlink), ("[collectives]", &coll)] {
            if !lines.is_empty() {
                s.push_str(&format!("{table}\n{}\n", lines.join("\n")));
            }
        }
    }
    s.push_str("\na line per algorithm:\nalgorithm  rows  latency us  bandwidth GB/s\n");
    for f in &r.fit {
        s.push_str(&format!(
            "{:<10}{:>6}{:>12.2}{:>16.1}\n",
            f.algo, f.rows, f.latency_us, f.bandwidth_gbs
        ));
    }
    s.push_str("\nas topology entries:\n");
    for f in r.fit.iter().filter(|f| f.algo != "p2p") {
        s.push_str(&format!(
            "[[collectives.fit]]\nalgo = \"{}\"\nlatency_us = {:.3}\nbandwidth_gbyte_s = {:.3}\n",
            f.algo, f.latency_us, f.bandwidth_gbs
        ));
    }
    s.push_str(
        "\nheld out                          n   median/p90 APE %:  lines          parameters     model\n",
    );
    for sc in &r.scores {
        s.push_str(&format!(
            "{:<30}{:>5}{:>24.2}{:>7.2}{:>8.2}{:>7.2}{:>8.2}{:>7.2}\n",
            sc.group,
            sc.fitted.n,
            sc.fitted.median_ape,
            sc.fitted.p90_ape,
            sc.params.median_ape,
            sc.params.p90_ape,
            sc.model.median_ape,
            sc.model.p90_ape
        ));
    }
    s.push_str(&format!("wrote {out}\n"));
    s
}
