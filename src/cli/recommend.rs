//! `skewsim recommend`: which scheme, settings and layout to run for a model, a corpus, a
//! cluster and a GPU count (`skewsim::experiment::recommend`), written to `runs/recommend/`
//! (summary.md, recommend.csv, plot.svg, winner.toml); progress on stderr.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use skewsim::balance::schemes::Scheme;
use skewsim::experiment::{calfile, recommend as rec};

use super::{limits, Output, Stderr};

#[derive(clap::Args)]
pub struct Args {
    /// The model: a built-in name or a model TOML.
    #[arg(long, default_value = "llama3-8b")]
    pub model: String,
    /// The corpus: a built-in name, a length file or a parametric spec.
    #[arg(long)]
    pub corpus: String,
    /// The cluster: a built-in topology or a topology TOML.
    #[arg(long, default_value = "dgx-h200-roce")]
    pub topology: String,
    /// GPUs to use, all of them.
    #[arg(long, value_parser = limits::count::<u32>(1, rec::MAX_GPUS as u64))]
    pub gpus: u32,
    /// Tokens per packed sequence (L).
    #[arg(long, value_parser = limits::count::<u32>(1, rec::MAX_SEQ_LEN as u64))]
    pub seq_len: u32,
    /// Memory per GPU in GiB [default: the GPU's, 141 GB for the H200].
    #[arg(long)]
    pub memory_gib: Option<f64>,
    /// The GPU: a built-in (h200, h100, b200, gb200, gb300, a100) or a GPU TOML
    /// [default: the topology's].
    #[arg(long)]
    pub gpu: Option<String>,
    /// Sequences per step [default: 64K tokens per GPU].
    #[arg(long, value_parser = limits::count::<u32>(1, rec::MAX_GLOBAL_BATCH as u64))]
    pub global_batch: Option<u32>,
    /// Allow pipeline parallelism (PP > 1).
    #[arg(long)]
    pub pipeline: bool,
    /// Fix TP instead of searching it.
    #[arg(long, value_parser = limits::count::<u32>(1, rec::MAX_GPUS as u64))]
    pub tp: Option<u32>,
    /// Fix CP instead of searching it.
    #[arg(long, value_parser = limits::count::<u32>(1, rec::MAX_GPUS as u64))]
    pub cp: Option<u32>,
    /// Fix PP instead of searching it (more than 1 needs --pipeline).
    #[arg(long, value_parser = limits::count::<u32>(1, rec::MAX_GPUS as u64))]
    pub pp: Option<u32>,
    /// Schemes to consider, comma-separated (ulysses, wlbllm, distca, libra, megatron-dcp)
    /// [default: all].
    #[arg(long, value_delimiter = ',')]
    pub schemes: Vec<String>,
    /// Seeds (workload draws) each finalist runs at.
    #[arg(long, default_value_t = 3, value_parser = limits::count::<u32>(1, rec::MAX_SEEDS as u64))]
    pub seeds: u32,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Simulate only this many layers [default: all].
    #[arg(long, value_parser = limits::count::<u32>(1, 1 << 10))]
    pub layers: Option<u32>,
    /// Most candidates simulated at the first seed (in order of their lower bound).
    #[arg(long, default_value_t = 16, value_parser = limits::count::<u32>(1, rec::MAX_SIMULATE as u64))]
    pub simulate: u32,
    /// Finalists run at every seed.
    #[arg(long, default_value_t = 6, value_parser = limits::count::<u32>(1, rec::MAX_TOP as u64))]
    pub top: u32,
    /// ZeRO stage.
    #[arg(long, default_value_t = 3, value_parser = limits::count::<u8>(0, 3))]
    pub zero_stage: u8,
    /// Keep activations instead of recomputing them.
    #[arg(long)]
    pub no_recompute: bool,
    /// Worker threads [default: every core].
    #[arg(long, value_parser = limits::count::<usize>(1, 1 << 10))]
    pub threads: Option<usize>,
    /// Where to write the files.
    #[arg(long, default_value = "runs/recommend")]
    pub out: PathBuf,
    /// A calibration file (JSON, from `skewsim calibrate`) to price by.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// The attention kernel's built-in profile: torch-flash (default) or skewsim.
    #[arg(long)]
    pub kernel: Option<String>,
}

/// The library's spec from the flags.
pub fn spec(a: &Args) -> Result<rec::Spec> {
    let schemes = a
        .schemes
        .iter()
        .map(|s| {
            s.parse::<Scheme>()
                .with_context(|| format!("--schemes {s}"))
        })
        .collect::<Result<_>>()?;
    Ok(rec::Spec {
        memory_gib: a.memory_gib,
        global_batch: a.global_batch,
        pipeline: a.pipeline,
        tp: a.tp,
        cp: a.cp,
        pp: a.pp,
        schemes,
        seeds: a.seeds,
        seed: a.seed,
        layers: a.layers,
        simulate: a.simulate,
        top: a.top,
        recompute: !a.no_recompute,
        zero_stage: a.zero_stage,
        gpu: a.gpu.clone(),
        ..rec::Spec::new(&a.model, &a.corpus, &a.topology, a.gpus, a.seq_len)
    })
}

pub fn run(a: Args, out: Output) -> Result<()> {
    let spec = spec(&a)?;
    let kernel = calfile::kernel_flag(a.kernel.as_deref(), a.calibration.is_some())?;
    let t0 = Instant::now();
    let go = || {
        rec::recommend(
            &spec,
            std::path::Path::new("."),
            (a.calibration.as_deref(), kernel),
            &Stderr,
        )
    };
    let r = match a.threads {
        Some(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .context("--threads: starting the worker threads")?
            .install(go)?,
        None => go()?,
    };
    let o = r.outcome();
    super::run::write_files(&a.out, &o)?;
    eprintln!(
        "skewsim: recommend took {:.1} s; wrote {}",
        t0.elapsed().as_secs_f64(),
        a.out.display()
    );
    out.emit(&r, || format!("{}\nwrote {}\n", o.summary, a.out.display()))
}
