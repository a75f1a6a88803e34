//! `skewsim plan [EXPERIMENT.toml] [flags] [--scheme S] --step N -o plan.json`: write the
//! checked plan of one training step for scheme S: `libra` (default: VRSP pools, TAP,
//! exchange), `ulysses` (CP all-to-all to head shards), `wlbllm` (variable-length packing
//! over the step's GBS micro-batches, adaptive CP sharding, outlier delay off unless
//! `--outlier-thresholds`), `distca` (in-place attention servers, one per DP replica,
//! CP = 1, the public repository's planner unless `--tight`, ping-pong nano-batches
//! unless `--no-ping-pong`) or `megatron-dcp` (Megatron's dynamic CP over the DP·CP ranks,
//! max_seqlen_per_dp_cp_rank = ⌈L / CP⌉, ℓ² workload).
//!
//! Settings come from flags; an experiment file (TOML) may give them instead — its
//! `[libra]` table if it has one, else its top level, with the flags' names in snake_case
//! (`corpus`, `seq_len`, `gbs`, `dp`, `pool_size`, `cp`, `head_shards`, `tile_tokens`,
//! `tau`, `chunks`, `seed`, `packing`, `grouping`, and for the scheme `scheme`, `s_max`,
//! `sharding`, `outlier_thresholds` (a list), `epsilon`, `ping_pong`, `tight`); other keys are left
//! to their owners.
//! A flag overrides the file.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;

use skewsim::experiment::plan::{
    self, GroupLine, PlanRequest, Resolved, SchemeKnobs, SchemeSettings,
};
use skewsim::plan::CheckSummary;
use skewsim::workload::corpus::Corpus;

use super::corpus::check_batch_memory;
use super::{limits, Output};

/// The workload and cluster settings shared by `plan` and `libra-config`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Workload {
    /// Corpus: built-in name (libra-256k, libra-1m, wlbllm), parametric spec or trace file
    /// [default: libra-256k].
    #[arg(long)]
    pub corpus: Option<String>,
    /// Sequence length L [default: the corpus's own, else 262144].
    #[arg(long, value_parser = limits::count::<u32>(1, limits::MAX_SEQ_LEN))]
    pub seq_len: Option<u32>,
    /// Global batch size, packed sequences per step (at most 65536) [default: 32].
    #[arg(long, value_parser = limits::count::<usize>(1, limits::MAX_SEQUENCES))]
    pub gbs: Option<usize>,
    /// DP degree (at most 65536) [default: 8].
    #[arg(long, value_parser = limits::count::<u32>(1, limits::MAX_GPUS))]
    pub dp: Option<u32>,
    /// CP degree, workers per DP replica (at most 65536) [default: 16].
    #[arg(long, value_parser = limits::count::<u32>(1, limits::MAX_GPUS))]
    pub cp: Option<u32>,
    /// Soft-cap slack τ ≥ 0 of Algorithm 2 [default: 0.03].
    #[arg(long, allow_hyphen_values = true)]
    pub tau: Option<f64>,
    /// Pipeliner head chunks M, dividing h_q/H [default: 4].
    #[arg(long, value_parser = limits::count::<u32>(1, u64::from(u32::MAX)))]
    pub chunks: Option<u32>,
    /// Seed of the document stream (and of `random` grouping) [default: 0].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Packing: sequential, best-fit or best-fit:W [default: sequential].
    #[arg(long)]
    pub packing: Option<String>,
    /// Grouping into pools: vrsp (Libra), production (loader order), random, zigzag,
    /// zigzag-swap [default: vrsp].
    #[arg(long)]
    pub grouping: Option<String>,
}

impl Workload {
    /// The flags as the library's settings.
    pub fn knobs(&self) -> plan::Workload {
        plan::Workload {
            corpus: self.corpus.clone(),
            seq_len: self.seq_len,
            gbs: self.gbs,
            dp: self.dp,
            cp: self.cp,
            tau: self.tau,
            chunks: self.chunks,
            seed: self.seed,
            packing: self.packing.clone(),
            grouping: self.grouping.clone(),
        }
    }
}

/// The batch memory check of `plan` and `libra-config`: `--max-memory`'s budget.
pub fn budget(
    corpus: &Corpus,
    seq_len: u32,
    n: usize,
    seed: u64,
    flag: &str,
) -> skewsim::Result<()> {
    check_batch_memory(corpus, seq_len, n, seed, flag)
        .map_err(|e| skewsim::Error::Spec(format!("{e:#}")))
}

#[derive(clap::Args)]
pub struct Args {
    /// An experiment file (TOML) giving the settings below; flags override it.
    pub experiment: Option<PathBuf>,
    #[command(flatten)]
    pub workload: Workload,
    /// Pool size P, DP replicas per pool (divides DP) [default: 8].
    #[arg(long, value_parser = limits::count::<u32>(1, u64::from(u32::MAX)))]
    pub pool_size: Option<u32>,
    /// Head shards H, dividing h_q = 32 [default: 4].
    #[arg(long, value_parser = limits::count::<u32>(1, u64::from(u32::MAX)))]
    pub head_shards: Option<u32>,
    /// Tile tokens B ≥ 1 [default: 4096].
    #[arg(long, value_parser = limits::count::<u32>(1, u64::from(u32::MAX)))]
    pub tile_tokens: Option<u32>,
    /// The step (global batch index) to plan, at most 65535 (the document stream is
    /// packed from its start up to it).
    #[arg(long, default_value_t = 0, value_parser = limits::count::<u64>(0, limits::MAX_STEPS - 1))]
    pub step: u64,
    /// Where to write the plan.
    #[arg(short = 'o', long, default_value = "plan.json")]
    pub out: PathBuf,
    /// Also write the pipeliner's M head chunks per worker (dispatch / compute / return
    /// lists, JSON) here (Libra only).
    #[arg(long)]
    pub pipeline: Option<PathBuf>,
    #[command(flatten)]
    pub scheme: SchemeArgs,
}

/// The scheme and the knobs of the schemes other than Libra.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SchemeArgs {
    /// Scheme: libra, ulysses, wlbllm, distca or megatron-dcp [default: libra].
    #[arg(long)]
    pub scheme: Option<String>,
    /// WLB-LLM memory cap S_max, tokens per micro-batch (2·CP must divide it)
    /// [default: 2·L].
    #[arg(long)]
    pub s_max: Option<u32>,
    /// WLB-LLM CP sharding: adaptive, per-sequence or per-document [default: adaptive].
    #[arg(long)]
    pub sharding: Option<String>,
    /// WLB-LLM outlier delay: thresholds L_1 < … < L_(n+1), comma-separated (off when
    /// absent; it changes which samples a step trains).
    #[arg(long)]
    pub outlier_thresholds: Option<String>,
    /// DistCA tolerance ε ≥ 0 [default: 0.10].
    #[arg(long, allow_hyphen_values = true)]
    pub epsilon: Option<f64>,
    /// DistCA: schedule each micro-batch whole instead of as two ping-pong nano-batches.
    #[arg(long)]
    pub no_ping_pong: bool,
    /// DistCA: skewsim's tight scheduler on the contiguous CP layout instead of the public
    /// repository's planner on its mirrored head/tail layout.
    #[arg(long)]
    pub tight: bool,
}

impl SchemeArgs {
    /// The flags as the library's knobs (`--outlier-thresholds` parsed).
    pub fn knobs(&self) -> Result<SchemeKnobs> {
        let outlier_thresholds = match &self.outlier_thresholds {
            None => None,
            Some(list) => Some(
                list.split(',')
                    .map(|x| x.trim().parse::<u32>())
                    .collect::<std::result::Result<Vec<u32>, _>>()
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "invalid outlier-thresholds = {list}: comma-separated token \
                             counts L_1 < … < L_(n+1), e.g. 16384,32768,65536"
                        )
                    })?,
            ),
        };
        Ok(SchemeKnobs {
            scheme: self.scheme.clone(),
            s_max: self.s_max,
            sharding: self.sharding.clone(),
            outlier_thresholds,
            epsilon: self.epsilon,
            ping_pong: self.no_ping_pong.then_some(false),
            tight: self.tight.then_some(true),
        })
    }
}

#[derive(Serialize)]
struct Report {
    file: String,
    settings: Resolved,
    scheme: SchemeSettings,
    step: u64,
    check: CheckSummary,
    groups: Vec<GroupLine>,
}

pub fn run(args: Args, out: Output) -> Result<()> {
    let req = PlanRequest {
        file: args.experiment.as_deref(),
        workload: args.workload.knobs(),
        pool_size: args.pool_size,
        head_shards: args.head_shards,
        tile_tokens: args.tile_tokens,
        scheme: args.scheme.knobs()?,
        step: args.step,
        pipeline: args.pipeline.is_some(),
    };
    let o = plan::plan(&req, &budget)?;
    let ignored = req.ignored_knobs(&o.scheme.scheme);
    if !ignored.is_empty() {
        eprintln!(
            "skewsim: {} not read by scheme {}: planned without",
            ignored.join(", "),
            o.scheme.scheme
        );
    }
    if let (Some(path), Some(pipes)) = (&args.pipeline, &o.pipeline) {
        std::fs::write(path, serde_json::to_string(pipes)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let json = o.plan.to_json()?;
    std::fs::write(&args.out, json + "\n")
        .with_context(|| format!("writing {}", args.out.display()))?;
    let plan = o.plan;
    let report = Report {
        file: args.out.display().to_string(),
        settings: o.settings,
        scheme: o.scheme,
        step: args.step,
        check: o.check,
        groups: o.groups,
    };
    out.emit(&report, || {
        let r = &report.settings;
        let p = &r.params;
        let sc = &report.scheme;
        let mut s = if sc.scheme != "libra" {
            format!(
                "wrote {}: {} step {} of {} at L = {}, GBS = {} (DP {} × GA {}), {} groups, \
                 CP = {}{}{}{}{}{}\n",
                report.file,
                sc.scheme,
                report.step,
                r.corpus,
                r.seq_len,
                r.gbs,
                r.dp,
                r.gbs as u32 / r.dp.max(1),
                report.groups.len(),
                p.cp,
                sc.s_max
                    .map(|v| format!(", S_max = {v}"))
                    .unwrap_or_default(),
                sc.sharding
                    .as_ref()
                    .map(|v| format!(", sharding {v}"))
                    .unwrap_or_default(),
                sc.outlier_thresholds
                    .as_ref()
                    .map(|v| format!(", outlier delay {v:?}"))
                    .unwrap_or_default(),
                sc.epsilon.map(|v| format!(", ε = {v}")).unwrap_or_default(),
                sc.ping_pong
                    .map(|v| format!(", ping-pong {}", if v { "on" } else { "off" }))
                    .unwrap_or_default(),
            )
        } else {
            String::new()
        };
        if sc.scheme == "libra" {
            s += &format!(
                "wrote {}: libra step {} of {} at L = {}, GBS = {} (DP {} × GA {}), {} pools of \
             P = {} × CP = {} = {} workers, H = {}, B = {}, τ = {}, grouping {}\n",
                report.file,
                report.step,
                r.corpus,
                r.seq_len,
                r.gbs,
                r.dp,
                r.gbs as u32 / r.dp,
                report.groups.len(),
                p.pool_size,
                p.cp,
                p.pool_workers(),
                p.head_shards,
                p.tile_tokens,
                p.tau,
                r.grouping
            );
        }
        s += &format!(
            "{:>3} {:>4} {:>7} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9}\n",
            "ga", "pool", "units", "TFLOPs", "max/mean-1", "GB moved", "Q", "KV", "out"
        );
        for g in &report.groups {
            s += &format!(
                "{:>3} {:>4} {:>7} {:>11.1} {:>11.4} {:>9.3} {:>9.3} {:>9.3} {:>9.3}\n",
                g.ga,
                g.pool,
                g.units,
                g.flops / 1e12,
                g.intra_pool_imbalance,
                g.bytes as f64 / 1e9,
                g.q_bytes as f64 / 1e9,
                g.kv_bytes as f64 / 1e9,
                g.output_bytes as f64 / 1e9
            );
        }
        s += &format!(
            "(one attention layer, forward; bytes in GB = 1e9)\n{}",
            super::check_plan::verdict(&report.file, &plan, &report.check)
        );
        s
    })
}
