//! `skewsim libra-config`: Libra's configuration simulator (§7). Replays grouping (VRSP by
//! default) + TAP over a corpus's first global batches for every candidate (P, H, B) and
//! prints inter-pool imbalance, intra-pool imbalance and exchanged bytes per step, the
//! recommendation and the trade-off it makes visible; `--svg FILE` also draws the
//! trade-off (bytes vs imbalance).

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;

use skewsim::balance::libra::config::{
    recommend, simulate, worst_imbalance, Candidate, ConfigRow, Recommendation,
};
use skewsim::report::svg::{Chart, Mark, Scale, Series};
use skewsim::report::table::{sig, Table};

use skewsim::experiment::plan::{get, load_steps, policy, Resolved};

use super::plan::{budget, Workload};
use super::{limits, Output};

#[derive(clap::Args)]
pub struct Args {
    /// An experiment file (TOML) giving the settings; flags override it. Lists may be
    /// given there as `pool_sizes`, `head_shards_list`, `tile_tokens_list`.
    pub experiment: Option<PathBuf>,
    #[command(flatten)]
    pub workload: Workload,
    /// Candidate pool sizes P (each dividing DP) [default: 2,4,8].
    #[arg(long, value_delimiter = ',')]
    pub pool_sizes: Vec<u32>,
    /// Candidate head shards H (each dividing h_q = 32) [default: 1,4,8].
    #[arg(long, value_delimiter = ',')]
    pub head_shards: Vec<u32>,
    /// Candidate tile sizes B [default: 4096].
    #[arg(long, value_delimiter = ',')]
    pub tile_tokens: Vec<u32>,
    /// Global batches (steps) to replay.
    #[arg(long, default_value_t = 2, value_parser = limits::count::<u64>(1, limits::MAX_STEPS))]
    pub steps: u64,
    /// Imbalance target (inter- and intra-pool, as max/mean − 1) the recommendation must
    /// meet.
    #[arg(long, default_value_t = 0.05)]
    pub target: f64,
    /// GPUs per node (worker ids are node-major), for the inter-node bytes column.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: u32,
    /// Also write the trade-off chart here (SVG).
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

#[derive(Serialize)]
struct Report {
    settings: Resolved,
    steps: u64,
    gpus_per_node: u32,
    target: f64,
    rows: Vec<ConfigRow>,
    recommendation: Option<Recommendation>,
    tradeoff: String,
}

fn list(
    flag: Vec<u32>,
    file_key: &str,
    t: &Option<toml::Table>,
    f: &Option<PathBuf>,
    default: &[u32],
) -> Result<Vec<u32>> {
    if !flag.is_empty() {
        return Ok(flag);
    }
    if let (Some(t), Some(f)) = (t, f) {
        if let Some(v) = get::<Vec<u32>>(t, file_key, f)? {
            return Ok(v);
        }
    }
    Ok(default.to_vec())
}

/// Words for the trade-off the rows show.
fn tradeoff(rows: &[ConfigRow], rec: &Recommendation, target: f64) -> String {
    let name = |r: &ConfigRow| {
        format!(
            "P={} H={} B={}",
            r.candidate.pool_size, r.candidate.head_shards, r.candidate.tile_tokens
        )
    };
    let gb = |r: &ConfigRow| r.bytes_per_step / 1e9;
    let pct = |x: f64| format!("{:.2}%", 100.0 * x);
    let pick = &rows[rec.pick];
    let mut s = if rec.meets_target {
        format!(
            "recommended: {} — the fewest bytes ({:.2} GB/step) among candidates within the \
             {} imbalance target (inter-pool {}, intra-pool {}).\n",
            name(pick),
            gb(pick),
            pct(target),
            pct(pick.inter_pool),
            pct(pick.intra_pool)
        )
    } else {
        format!(
            "no candidate meets the {} imbalance target; recommended the best balanced: {} \
             (inter-pool {}, intra-pool {}, {:.2} GB/step).\n",
            pct(target),
            name(pick),
            pct(pick.inter_pool),
            pct(pick.intra_pool),
            gb(pick)
        )
    };
    let cheap = &rows[rec.cheapest];
    if rec.cheapest != rec.pick {
        s += &format!(
            "trade-off: the cheapest, {}, moves {:.2} GB/step but leaves {} imbalance;",
            name(cheap),
            gb(cheap),
            pct(worst_imbalance(cheap))
        );
    } else {
        s += "trade-off: the pick is also the cheapest;";
    }
    let best = &rows[rec.most_balanced];
    if rec.most_balanced != rec.pick {
        s += &format!(
            " the best balanced, {}, reaches {} at {:.2} GB/step.\n",
            name(best),
            pct(worst_imbalance(best)),
            gb(best)
        );
    } else {
        s += " the pick is also the best balanced.\n";
    }
    s
}

/// The trade-off chart: bytes per step vs worst imbalance, one line per (H, B) over P.
fn chart(rows: &[ConfigRow], rec: &Recommendation) -> String {
    let mut keys: Vec<(u32, u32)> = rows
        .iter()
        .map(|r| (r.candidate.head_shards, r.candidate.tile_tokens))
        .collect();
    keys.dedup();
    keys.sort_unstable();
    keys.dedup();
    let floor = 1e-5;
    let gb: Vec<f64> = rows.iter().map(|r| r.bytes_per_step / 1e9).collect();
    let lo = gb.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = gb.iter().copied().fold(0.0, f64::max);
    let pad = ((hi - lo) * 0.08).max(hi * 0.02).max(1e-9);
    let mut c =
        Chart::new("Libra candidates: exchanged bytes vs imbalance (each line: P ascending)")
            .x("GB exchanged per step (one layer, forward)", Scale::Linear)
            .x_range((lo - pad).max(0.0), hi + pad)
            .y("max(inter, intra) imbalance, max/mean − 1", Scale::Log);
    for (h, b) in keys {
        let mut pts: Vec<(u32, f64, f64)> = rows
            .iter()
            .filter(|r| r.candidate.head_shards == h && r.candidate.tile_tokens == b)
            .map(|r| {
                (
                    r.candidate.pool_size,
                    r.bytes_per_step / 1e9,
                    worst_imbalance(r).max(floor),
                )
            })
            .collect();
        pts.sort_by_key(|p| p.0);
        c = c.series(Series::line(
            format!("H={h} B={b}"),
            pts.iter().map(|p| (p.1, p.2)).collect(),
        ));
    }
    let p = &rows[rec.pick];
    c = c.series(Series::new(
        "recommended",
        vec![(p.bytes_per_step / 1e9, worst_imbalance(p).max(floor))],
        Mark::Ring,
    ));
    c.render()
}

pub fn run(args: Args, out: Output) -> Result<()> {
    let (mut r, table) =
        args.workload
            .knobs()
            .resolve(args.experiment.as_deref(), None, None, None)?;
    let pool_sizes = list(
        args.pool_sizes,
        "pool_sizes",
        &table,
        &args.experiment,
        &[2, 4, 8],
    )?;
    let head_shards = list(
        args.head_shards,
        "head_shards_list",
        &table,
        &args.experiment,
        &[1, 4, 8],
    )?;
    let tile_tokens = list(
        args.tile_tokens,
        "tile_tokens_list",
        &table,
        &args.experiment,
        &[4096],
    )?;
    if !(args.target.is_finite() && args.target >= 0.0) {
        anyhow::bail!(
            "invalid --target = {}: a finite imbalance ≥ 0 (e.g. 0.05)",
            args.target
        );
    }
    if args.steps == 0 {
        anyhow::bail!("invalid --steps = 0: at least 1 global batch to replay");
    }
    let pol = policy(&r.grouping)?;
    let mut candidates = Vec::new();
    for &pool_size in &pool_sizes {
        for &h in &head_shards {
            for &b in &tile_tokens {
                candidates.push(Candidate {
                    pool_size,
                    head_shards: h,
                    tile_tokens: b,
                });
            }
        }
    }
    // the shared settings must hold for one candidate before loading the corpus
    r.params.pool_size = pool_sizes.first().copied().unwrap_or(r.params.pool_size);
    r.params.head_shards = head_shards.first().copied().unwrap_or(r.params.head_shards);
    let steps = load_steps(&mut r, args.steps, &budget)?;
    let seed = r.seed;
    let grouping = move |step: usize, loads: &[u64], p: usize| {
        // the same policy and stream as `skewsim plan`
        let mut rng = skewsim::rng::stream(seed, "libra-grouping", step as u64);
        skewsim::balance::group(loads, p, pol, &mut rng)
    };
    let rows = simulate(
        &steps,
        r.dp,
        args.gpus_per_node,
        &r.params,
        &candidates,
        &grouping,
    )?;
    let rec = recommend(&rows, args.target);
    let trade = rec
        .as_ref()
        .map(|rec| tradeoff(&rows, rec, args.target))
        .unwrap_or_default();
    if let (Some(path), Some(rec)) = (&args.svg, &rec) {
        std::fs::write(path, chart(&rows, rec))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let report = Report {
        settings: r,
        steps: args.steps,
        gpus_per_node: args.gpus_per_node,
        target: args.target,
        rows,
        recommendation: rec,
        tradeoff: trade,
    };
    out.emit(&report, || {
        let r = &report.settings;
        let mut t = Table::new([
            "P",
            "H",
            "B",
            "tiles/pool",
            "inter-pool R-1",
            "intra-pool mean",
            "intra-pool max",
            "GB/step",
            "inter-node GB/step",
            "GB/worker/step",
            "",
        ]);
        let workers = f64::from(r.dp * r.params.cp);
        for (i, row) in report.rows.iter().enumerate() {
            let c = row.candidate;
            let mark = match &report.recommendation {
                Some(rec) if rec.pick == i => "<- pick",
                _ => "",
            };
            t.row([
                c.pool_size.to_string(),
                c.head_shards.to_string(),
                c.tile_tokens.to_string(),
                format!("{:.0}", row.tiles_per_pool),
                sig(row.inter_pool, 3),
                sig(row.intra_pool, 3),
                sig(row.intra_pool_max, 3),
                format!("{:.2}", row.bytes_per_step / 1e9),
                format!("{:.2}", row.inter_node_bytes_per_step / 1e9),
                format!("{:.3}", row.bytes_per_step / 1e9 / workers),
                mark.to_string(),
            ]);
        }
        format!(
            "libra-config: {} at L = {}, GBS = {}, DP = {}, CP = {}, τ = {}, grouping {}, {} \
             step(s), {} GPUs per node; bytes: one attention layer, forward, GB = 1e9\n{}{}",
            r.corpus,
            r.seq_len,
            r.gbs,
            r.dp,
            r.params.cp,
            r.params.tau,
            r.grouping,
            report.steps,
            report.gpus_per_node,
            t.to_text(),
            report.tradeoff
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(p: u32, inter: f64, intra: f64, gb: f64) -> ConfigRow {
        ConfigRow {
            candidate: Candidate {
                pool_size: p,
                head_shards: 4,
                tile_tokens: 4096,
            },
            inter_pool: inter,
            intra_pool: intra,
            intra_pool_max: intra,
            bytes_per_step: gb * 1e9,
            inter_node_bytes_per_step: gb * 1e9,
            tiles_per_pool: 10.0,
        }
    }

    #[test]
    fn tradeoff_names_pick_cheapest_and_best_balanced() {
        let rows = vec![
            row(2, 0.9, 0.03, 10.0),
            row(8, 0.04, 0.03, 20.0),
            row(16, 0.01, 0.03, 40.0),
        ];
        let rec = recommend(&rows, 0.05).unwrap();
        let t = tradeoff(&rows, &rec, 0.05);
        assert!(
            t.starts_with("recommended: P=8 H=4 B=4096 — the fewest bytes (20.00 GB/step)"),
            "{t}"
        );
        assert!(
            t.contains(
                "the cheapest, P=2 H=4 B=4096, moves 10.00 GB/step but leaves 90.00% imbalance"
            ),
            "{t}"
        );
        assert!(
            t.contains("the best balanced, P=16 H=4 B=4096, reaches 3.00% at 40.00 GB/step"),
            "{t}"
        );
        let svg = chart(&rows, &rec);
        assert!(
            svg.starts_with("<svg") && svg.contains("recommended") && svg.contains("H=4 B=4096")
        );
    }
}
