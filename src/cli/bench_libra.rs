//! Libra's benchmark arms (issue 5): TAP placement of one 1M-token pool at P = 8, CP = 16,
//! B = 4096, H = 4 (target < 50 ms: Libra runs it on the CPU once per iteration), and,
//! for context, the exchange build and the plan checker on the same pool.
//!
//! [`tap_pool_1m`] has the shape of a `skewsim bench` arm's setup (prepare untimed, return
//! the timed closure); [`rows`] times every arm here itself and returns a table's rows.

use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use skewsim::balance::libra::{exchange, pool_workers, tap, LibraParams};
use skewsim::plan::{check, Plan, PLAN_VERSION};
use skewsim::workload::corpus::Corpus;
use skewsim::workload::pack::{global_batch, Packing};
use skewsim::workload::PackedSeq;

/// A timed closure: runs once, returns a line of detail.
pub type Timed = Box<dyn FnMut() -> Result<String>>;

/// The benchmark pool: the first P = 8 sequences of libra-1m packed to L = 1,048,576
/// (sequential packing, seed 0), and the paper's settings.
pub fn bench_pool() -> Result<(Vec<PackedSeq>, LibraParams)> {
    let corpus = Corpus::from_spec("libra-1m")?;
    let seq_len = corpus.default_seq_len().unwrap_or(1 << 20);
    let p = LibraParams {
        pool_size: 8,
        cp: 16,
        head_shards: 4,
        tile_tokens: 4096,
        ..LibraParams::default()
    };
    let seqs = global_batch(&corpus, seq_len, 8, Packing::Sequential, 0, 0)?;
    Ok((seqs, p))
}

/// TAP on the benchmark pool: SH-tiling (Eq. 8) + Algorithm 2 placement.
pub fn tap_pool_1m() -> Result<Timed> {
    let (seqs, p) = bench_pool()?;
    Ok(Box::new(move || {
        let refs: Vec<&PackedSeq> = seqs.iter().collect();
        let t = tap::tile(&refs, p.cp, p.tile_tokens, p.head_shards, &p.shape);
        let pl = tap::place(&t, p.tau);
        Ok(format!(
            "{} tiles on W = {} workers, {} samples, intra-pool imbalance {:.4}, {:.2} GB exchanged",
            t.len(),
            t.workers,
            t.samples.len(),
            tap::imbalance(&pl),
            pl.comm as f64 / 1e9
        ))
    }))
}

/// Exchange planning on the benchmark pool (placement done untimed).
pub fn exchange_pool_1m() -> Result<Timed> {
    let (seqs, p) = bench_pool()?;
    let refs: Vec<&PackedSeq> = seqs.iter().collect();
    let t = tap::tile(&refs, p.cp, p.tile_tokens, p.head_shards, &p.shape);
    let pl = tap::place(&t, p.tau);
    let ids: Vec<u32> = (0..8).collect();
    let workers = pool_workers(0, &p);
    Ok(Box::new(move || {
        let refs: Vec<&PackedSeq> = seqs.iter().collect();
        let site = exchange::PoolSite {
            ga: 0,
            pool: 0,
            seq_ids: &ids,
            workers: &workers,
        };
        let g = exchange::build_group(&site, &refs, &t, &pl, &p.shape);
        Ok(format!(
            "{} units, {} transfers",
            g.units.len(),
            g.transfers.len()
        ))
    }))
}

/// The plan checker on the benchmark pool's plan (built untimed).
pub fn check_pool_1m() -> Result<Timed> {
    let (seqs, p) = bench_pool()?;
    let refs: Vec<&PackedSeq> = seqs.iter().collect();
    let t = tap::tile(&refs, p.cp, p.tile_tokens, p.head_shards, &p.shape);
    let pl = tap::place(&t, p.tau);
    let ids: Vec<u32> = (0..8).collect();
    let workers = pool_workers(0, &p);
    let site = exchange::PoolSite {
        ga: 0,
        pool: 0,
        seq_ids: &ids,
        workers: &workers,
    };
    let plan = Plan {
        version: PLAN_VERSION,
        scheme: "libra".into(),
        step: 0,
        shape: p.shape,
        head_shards: p.head_shards,
        groups: vec![exchange::build_group(&site, &refs, &t, &pl, &p.shape)],
    };
    Ok(Box::new(move || {
        let s = check(&plan)?;
        Ok(format!("OK: {} units, {} transfers", s.units, s.transfers))
    }))
}

/// One measured arm.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    /// Arm name.
    pub arm: &'static str,
    /// What it times.
    pub what: &'static str,
    /// Timed runs (the median is reported).
    pub runs: usize,
    /// Median wall time, milliseconds.
    pub median_ms: f64,
    /// Target, milliseconds, if the issue sets one.
    pub target_ms: Option<f64>,
    /// Whether the median met the target.
    pub met: Option<bool>,
    /// The last run's detail line.
    pub detail: String,
}

/// An arm: (name, what, target ms, setup).
pub type Arm = (
    &'static str,
    &'static str,
    Option<f64>,
    fn() -> Result<Timed>,
);

/// The arms.
pub const ARMS: &[Arm] = &[
    (
        "libra-tap-1m",
        "TAP tiling + Algorithm 2 placement of one 1M-token pool (P=8, CP=16, B=4096, H=4)",
        Some(50.0),
        tap_pool_1m,
    ),
    (
        "libra-exchange-1m",
        "exchange planning (units + deduplicated transfers) of the same pool",
        None,
        exchange_pool_1m,
    ),
    (
        "libra-check-1m",
        "plan checker on the same pool's plan",
        None,
        check_pool_1m,
    ),
];

/// Run every arm `runs` times (after one untimed warm-up) and report the medians.
pub fn rows(runs: usize) -> Result<Vec<BenchRow>> {
    let runs = runs.max(1);
    let mut out = Vec::new();
    for &(arm, what, target_ms, setup) in ARMS {
        let mut f = setup()?;
        let mut detail = f()?;
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t0 = Instant::now();
            detail = f()?;
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        let median_ms = times[times.len() / 2];
        out.push(BenchRow {
            arm,
            what,
            runs,
            median_ms,
            target_ms,
            met: target_ms.map(|t| median_ms < t),
            detail,
        });
    }
    Ok(out)
}

#[derive(clap::Args)]
pub struct Args {
    /// Timed runs per arm (the median is reported).
    #[arg(long, default_value_t = 11)]
    pub runs: usize,
}

/// `skewsim bench-libra`: run [`ARMS`] and print a table.
pub fn run(args: Args, out: super::Output) -> Result<()> {
    let rows = rows(args.runs)?;
    out.emit(&rows, || {
        let mut s = format!(
            "{:<18} {:>5} {:>11} {:>10} {:>5}  detail\n",
            "arm", "runs", "median_ms", "target_ms", "met"
        );
        for r in &rows {
            s += &format!(
                "{:<18} {:>5} {:>11.2} {:>10} {:>5}  {}\n",
                r.arm,
                r.runs,
                r.median_ms,
                r.target_ms
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "-".into()),
                r.met.map(|m| if m { "yes" } else { "NO" }).unwrap_or("-"),
                r.detail
            );
        }
        s
    })
}
