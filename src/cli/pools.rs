//! `skewsim pools`: residual attention-load imbalance R − 1 across fixed-size sequence pools,
//! per pool size and grouping policy, over Monte-Carlo trials — with the LLN bound (Libra
//! Eq. 4) beside it. Prints a table (or JSON), writes `pools.csv` and `pools.svg` to `--out`,
//! and, with `--assignment`, the first trial's pools for other tools to check.
//!
//! Flags are stable (other tools script them):
//! `skewsim pools (--corpus NAME|FILE | --packed FILE) --seq-len L --gbs D --pool-sizes 2,4,8
//!  --policies random,vrsp --trials N --seed S [--assignment OUT.json] [--out DIR] [--json]`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;

use skewsim::balance::{group, Policy};
use skewsim::experiment::study::{
    chart, check_pool_sizes, check_study_size, mean_doc_len, parse_policies, study, table,
    trial_loads, Source, MAX_GBS, MAX_TRIALS,
};
use skewsim::rng::stream;
use skewsim::theory::mc::purpose;

use super::{limits, Output};

/// The study's trials and global batch, as flags in messages.
pub const FLAGS: (&str, &str) = ("--trials", "--gbs");

/// Where the global batches come from (shared by `pools` and `theory`).
#[derive(clap::Args, Clone, Debug)]
#[group(required = true, multiple = false)]
pub struct SourceArgs {
    /// A built-in corpus (wlbllm, libra-256k, libra-1m), a parametric spec or a trace file.
    #[arg(long)]
    pub corpus: Option<String>,
    /// Pre-packed sequences: a JSON list of lists of sample lengths. The batch is its first
    /// D sequences; sequence indices in the output are positions in this file.
    #[arg(long)]
    pub packed: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Sequence length L (default: the corpus's own, else 131072; for --packed, the
    /// longest sequence in the file, and every sequence must fit in L).
    #[arg(long, value_parser = limits::count::<u32>(1, limits::MAX_SEQ_LEN))]
    pub seq_len: Option<u32>,
    /// Global batch size D (packed sequences per optimizer step).
    #[arg(long, default_value_t = 128,
          value_parser = limits::count::<usize>(1, MAX_GBS as u64))]
    pub gbs: usize,
    /// Pool sizes P, comma-separated; each must divide D.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16,32,64")]
    pub pool_sizes: Vec<usize>,
    /// Grouping policies, comma-separated (random, production, zigzag, zigzag-swap, vrsp, lpt).
    #[arg(long, value_delimiter = ',', default_value = "random,vrsp")]
    pub policies: Vec<String>,
    /// Monte-Carlo trials (one global batch each).
    #[arg(long, default_value_t = 200, value_parser = limits::count::<u64>(1, MAX_TRIALS))]
    pub trials: u64,
    /// Seed of every random stream.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Packing of corpus documents: sequential, best-fit or best-fit:W.
    #[arg(long, default_value = "sequential")]
    pub packing: String,
    /// Write the first trial's pools for each (P, policy) to this JSON file.
    #[arg(long)]
    pub assignment: Option<PathBuf>,
    /// Directory for pools.csv and pools.svg.
    #[arg(long, default_value = "runs/pools")]
    pub out: PathBuf,
}

/// Resolves `--corpus`/`--packed`, `--seq-len` and `--packing`.
pub fn resolve_source(
    src: &SourceArgs,
    seq_len: Option<u32>,
    packing: &str,
    gbs: usize,
) -> Result<Source> {
    Ok(skewsim::experiment::study::resolve_source(
        src.corpus.as_deref(),
        src.packed.as_deref(),
        seq_len,
        packing,
        gbs,
    )?)
}

/// Refuse a study past its size limits ([`check_study_size`], which [`trial_loads`] checks
/// again, cheaply) before one whose memory exceeds `--max-memory`: every trial's loads, and
/// one batch being packed per thread.
pub fn check_study_memory(src: &Source, gbs: usize, trials: u64, seed: u64) -> Result<()> {
    check_study_size(src, gbs, trials, seed, FLAGS)?;
    let loads = trials as f64 * (8.0 * gbs as f64 + 24.0);
    let packing = match src {
        Source::Corpus {
            corpus, seq_len, ..
        } => {
            rayon::current_num_threads() as f64
                * limits::packed_bytes(gbs as u64, *seq_len, mean_doc_len(corpus, *seq_len, seed))
        }
        Source::Packed { .. } => 0.0,
    };
    limits::check_memory(
        &format!("--trials {trials} of --gbs {gbs}"),
        loads + packing,
    )
}

#[derive(Serialize)]
struct Assignment {
    pool_size: usize,
    policy: Policy,
    pools: Vec<Vec<usize>>,
}

/// The first trial's pools for each (P, policy), with the same streams as the study.
fn assignment(
    loads: &[u64],
    pool_sizes: &[usize],
    policies: &[Policy],
    seed: u64,
) -> Result<String> {
    let mut out = Vec::new();
    for &p in pool_sizes {
        for &policy in policies {
            let mut rng = stream(seed, &purpose(policy, p), 0);
            out.push(Assignment {
                pool_size: p,
                policy,
                pools: group(loads, p, policy, &mut rng)?,
            });
        }
    }
    Ok(serde_json::to_string(&out)? + "\n")
}

/// Writes `text` to `path`, creating its directory.
pub fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A progress line on stderr (never on stdout, which carries the result).
pub fn progress(what: &str, since: Instant) {
    eprintln!("skewsim: {what} ({:.1} s)", since.elapsed().as_secs_f64());
}

pub fn run(args: Args, out: Output) -> Result<()> {
    let t0 = Instant::now();
    let policies = parse_policies(&args.policies, "--policies")?;
    check_pool_sizes(&args.pool_sizes, args.gbs, ("--pool-sizes", "--gbs"))?;
    let src = resolve_source(&args.source, args.seq_len, &args.packing, args.gbs)?;
    check_study_memory(&src, args.gbs, args.trials, args.seed)?;
    eprintln!(
        "skewsim: sampling {} global batches of {} sequences from {} (L = {})…",
        args.trials,
        args.gbs,
        src.name(),
        src.seq_len()
    );
    let loads = trial_loads(&src, args.gbs, args.trials, args.seed, FLAGS)?;
    progress("batches ready; grouping", t0);
    let st = study(
        &src,
        &loads,
        args.gbs,
        &args.pool_sizes,
        &policies,
        args.seed,
    )?;
    progress("grouping done", t0);
    let t = table(&st.rows);
    let csv_path = args.out.join("pools.csv");
    let svg_path = args.out.join("pools.svg");
    write(&csv_path, &t.to_csv())?;
    let title = format!(
        "R − 1 vs pool size — {} (L = {}, D = {}, {} trials)",
        st.source, st.seq_len, st.gbs, st.trials
    );
    write(
        &svg_path,
        &chart(&title, &st.rows, st.gbs, st.load.cv).render(),
    )?;
    if let Some(path) = &args.assignment {
        write(
            path,
            &assignment(&loads[0], &args.pool_sizes, &policies, args.seed)?,
        )?;
    }
    eprintln!(
        "skewsim: wrote {} and {}{}",
        csv_path.display(),
        svg_path.display(),
        args.assignment
            .as_ref()
            .map(|p| format!(" and {}", p.display()))
            .unwrap_or_default()
    );
    out.emit(&st, || {
        format!(
            "pools: {} (L = {}, {}), D = {}, {} trials, seed {}; per-sequence load CV {:.3}, skewness {:.2}\n\n{}",
            st.source,
            st.seq_len,
            st.packing,
            st.gbs,
            st.trials,
            st.seed,
            st.load.cv,
            st.load.skewness,
            t.to_text()
        )
    })
}
