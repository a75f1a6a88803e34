//! `skewsim theory`: Libra Eq. 4's LLN bound on E[R] beside a Monte-Carlo estimate under
//! random grouping, for a corpus and a list of pool sizes; recommends the smallest listed P
//! meeting a target R − 1 (by the bound and by Monte Carlo) and says where, and why, the two
//! disagree. Under `--mask` (a sliding window, chunked or block-sparse layer) each
//! sequence's load is the mask's (Σ 2·pairs(ℓ) − ℓ: ℓ·W-style for a window W instead of
//! Σℓ²), so the CV and the bound are those of that layer type.

use std::time::Instant;

use anyhow::Result;

use skewsim::cost::Mask;
use skewsim::experiment::study::{
    check_pool_sizes, check_target, theory_report, trial_loads_under, TheoryReport, MAX_GBS,
    MAX_TRIALS,
};
use skewsim::report::table::{sig, Table};
use skewsim::theory;

use super::pools::{check_study_memory, progress, resolve_source, SourceArgs, FLAGS};
use super::{limits, Output};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Sequence length L (default: the corpus's own, else 131072).
    #[arg(long, value_parser = limits::count::<u32>(1, limits::MAX_SEQ_LEN))]
    pub seq_len: Option<u32>,
    /// Global batch size D.
    #[arg(long, default_value_t = 128,
          value_parser = limits::count::<usize>(1, MAX_GBS as u64))]
    pub gbs: usize,
    /// Pool sizes P to evaluate, comma-separated; each must divide D.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16,32,64")]
    pub pool_sizes: Vec<usize>,
    /// Target residual imbalance R − 1 for the recommendation.
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    pub target: f64,
    /// Monte-Carlo trials.
    #[arg(long, default_value_t = 1000, value_parser = limits::count::<u64>(1, MAX_TRIALS))]
    pub trials: u64,
    /// Seed of every random stream.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Packing of corpus documents: sequential, best-fit or best-fit:W.
    #[arg(long, default_value = "sequential")]
    pub packing: String,
    /// The attention mask whose per-sequence load is bounded: causal, sliding:W,
    /// chunked:C or block-sparse:B:local=K:global=G.
    #[arg(long, default_value = "causal")]
    pub mask: String,
}

pub fn run(args: Args, out: Output) -> Result<()> {
    let t0 = Instant::now();
    check_target(args.target)?;
    check_pool_sizes(&args.pool_sizes, args.gbs, ("--pool-sizes", "--gbs"))?;
    let mask = Mask::parse(&args.mask, "--mask")?;
    let src = resolve_source(&args.source, args.seq_len, &args.packing, args.gbs)?;
    mask.check_len(src.seq_len(), "--mask")?;
    check_study_memory(&src, args.gbs, args.trials, args.seed)?;
    eprintln!(
        "skewsim: sampling {} global batches of {} sequences from {}…",
        args.trials,
        args.gbs,
        src.name()
    );
    let loads = trial_loads_under(&src, args.gbs, args.trials, args.seed, &mask, FLAGS)?;
    progress("batches ready; Monte Carlo", t0);
    let report = theory_report(
        &src,
        &mask,
        &loads,
        args.gbs,
        &args.pool_sizes,
        args.seed,
        args.target,
    )?;
    out.emit(&report, || text(&report))
}

fn text(r: &TheoryReport) -> String {
    let mut t = Table::new([
        "P",
        "K",
        "bound_R-1",
        "gauss_exact",
        "mc_mean",
        "mc_std",
        "mc_p05",
        "mc_p95",
        "gap",
    ]);
    for c in &r.rows {
        t.row([
            c.pool_size.to_string(),
            c.pools.to_string(),
            sig(c.bound, 4),
            sig(c.gaussian_exact, 4),
            sig(c.mc.mean, 4),
            sig(c.mc.std, 3),
            sig(c.mc.p05, 4),
            sig(c.mc.p95, 4),
            format!("{:+.0}%", c.gap * 100.0),
        ]);
    }
    let rec =
        |p: Option<usize>| p.map_or("none of the listed P".to_string(), |p| format!("P = {p}"));
    let mut s = format!(
        "theory: {} (L = {}), D = {}, {} trials, seed {}\n\
         per-sequence load {}: CV {:.3}, skewness {:.2}, max/mean {:.1}\n\
         E[R] ≈ 1 + (CV/√P)·√(2 ln(D/P))  (Libra Eq. 4); gauss_exact uses the exact E[max of K Gaussians];\n\
         mc = random grouping; gap = (bound − mc)/mc\n\n{}\n\
         target R − 1 ≤ {}: by the bound {}, by Monte Carlo {}\n",
        r.source,
        r.seq_len,
        r.gbs,
        r.trials,
        r.seed,
        if r.mask.is_causal() {
            "Σℓ²".to_string()
        } else {
            format!("under {} (Σ 2·pairs(ℓ) − ℓ)", r.mask)
        },
        r.load.cv,
        r.load.skewness,
        r.load.max_over_mean,
        t.to_text(),
        r.target,
        rec(r.recommended_by_bound),
        rec(r.recommended_by_mc),
    );
    let notes: Vec<String> = r
        .rows
        .iter()
        .filter(|c| !c.note.is_empty())
        .map(|c| format!("  P = {}: {}\n", c.pool_size, c.note))
        .collect();
    if !notes.is_empty() {
        s += &format!(
            "\nwhere bound and Monte Carlo disagree by more than {:.0}% (a finding, not noise):\n{}",
            theory::DISAGREE * 100.0,
            notes.concat()
        );
    }
    s
}
