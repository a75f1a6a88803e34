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

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;

use skewsim::balance::distca::{self, DistcaConfig, DistcaScheduler, DEFAULT_EPSILON};
use skewsim::balance::libra::{exchange, pipeliner, plan_step, step_shape, LibraParams};
use skewsim::balance::megatron_dcp::{self, DcpConfig, DcpLoad};
use skewsim::balance::ulysses::{self, UlyssesParams};
use skewsim::balance::wlbllm::lower::{ShardingMode, WlbPlanParams};
use skewsim::balance::wlbllm::{self, ConstantThroughput, WlbConfig, WlbPacker, KERNEL_TILE};
use skewsim::balance::{group, Policy};
use skewsim::plan::{check, CheckSummary, Plan};
use skewsim::workload::pack::{batches, Packing};
use skewsim::workload::PackedSeq;

use super::corpus::check_batch_memory;
use super::{limits, Output};
use skewsim::experiment::inputs::load_corpus;

/// The workload and cluster settings shared by `plan` and `libra-config`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Workload {
    /// Corpus: built-in name (libra-256k, libra-1m, wlbllm), parametric spec or trace file
    /// [default: libra-256k].
    #[arg(long)]
    pub corpus: Option<String>,
    /// Sequence length L [default: the corpus's own, else 262144].
    #[arg(long, value_parser = limits::count::<u32>(1, u64::from(u32::MAX)))]
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

/// Settings resolved from flags, file and defaults.
#[derive(Clone, Debug, Serialize)]
pub struct Resolved {
    pub corpus: String,
    pub seq_len: u32,
    pub gbs: usize,
    pub dp: u32,
    pub seed: u64,
    pub packing: String,
    pub grouping: String,
    pub params: LibraParams,
}

/// A settings file of `plan` and `libra-config` (a file without a `kind`): the flags'
/// names in snake_case, libra-config's candidate lists, nothing else.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // read for its schema; values are taken by `get`
struct SettingsFile {
    description: Option<String>,
    corpus: Option<String>,
    seq_len: Option<u32>,
    gbs: Option<usize>,
    dp: Option<u32>,
    cp: Option<u32>,
    tau: Option<f64>,
    chunks: Option<u32>,
    seed: Option<u64>,
    packing: Option<String>,
    grouping: Option<String>,
    pool_size: Option<u32>,
    head_shards: Option<u32>,
    tile_tokens: Option<u32>,
    scheme: Option<String>,
    s_max: Option<u32>,
    sharding: Option<String>,
    outlier_thresholds: Option<Vec<u32>>,
    epsilon: Option<f64>,
    ping_pong: Option<bool>,
    pool_sizes: Option<Vec<u32>>,
    head_shards_list: Option<Vec<u32>>,
    tile_tokens_list: Option<Vec<u32>>,
    /// The same settings in a table of their own.
    libra: Option<Box<SettingsFile>>,
}

/// The table of an experiment file that holds Libra settings: an experiment of a kind
/// `run` knows is checked against that kind's schema (as `run` does), a file without a
/// `kind` against the settings schema; unknown and mistyped fields are refused by both.
pub fn experiment_table(file: &Path) -> Result<toml::Table> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading experiment file {}", file.display()))?;
    let doc: toml::Table =
        toml::from_str(&text).with_context(|| format!("{} is not valid TOML", file.display()))?;
    if doc.contains_key("kind") {
        super::run::check_schema(file, &text, &doc)?;
    } else {
        toml::from_str::<SettingsFile>(&text).with_context(|| {
            format!(
                "{}: not a valid settings file (a file without `kind` holds the flags' names \
                 in snake_case)",
                file.display()
            )
        })?;
    }
    Ok(match doc.get("libra") {
        Some(toml::Value::Table(t)) => t.clone(),
        _ => doc,
    })
}

/// `key` of `table` as a `T`, if present.
pub fn get<T: DeserializeOwned>(table: &toml::Table, key: &str, file: &Path) -> Result<Option<T>> {
    table
        .get(key)
        .map(|v| {
            v.clone().try_into::<T>().map_err(|e| {
                anyhow::anyhow!(
                    "{}: field `{key}` = {v}: {}",
                    file.display(),
                    e.to_string().trim()
                )
            })
        })
        .transpose()
}

impl Workload {
    /// Fill what the flags leave out from `file` (if any), then from defaults. `pool_size`,
    /// `head_shards` and `tile_tokens` are the single values `plan` uses.
    pub fn resolve(
        &self,
        file: Option<&Path>,
        pool_size: Option<u32>,
        head_shards: Option<u32>,
        tile_tokens: Option<u32>,
    ) -> Result<(Resolved, Option<toml::Table>)> {
        let table = file.map(experiment_table).transpose()?;
        let empty = toml::Table::new();
        let t = table.as_ref().unwrap_or(&empty);
        let f = file.unwrap_or(Path::new("(no file)"));
        macro_rules! pick {
            ($flag:expr, $key:literal, $default:expr) => {
                match $flag.clone() {
                    Some(v) => v,
                    None => get(t, $key, f)?.unwrap_or($default),
                }
            };
        }
        let corpus: String = pick!(self.corpus, "corpus", "libra-256k".to_string());
        let seq_len: Option<u32> = match self.seq_len {
            Some(v) => Some(v),
            None => get(t, "seq_len", f)?,
        };
        if seq_len == Some(0) {
            bail!(
                "{}: invalid seq_len = 0: a sequence length L ≥ 1 token (leave it out for the \
                 corpus's own)",
                f.display()
            );
        }
        let d = LibraParams::default();
        let params = LibraParams {
            pool_size: pick!(pool_size, "pool_size", d.pool_size),
            cp: pick!(self.cp, "cp", d.cp),
            head_shards: pick!(head_shards, "head_shards", d.head_shards),
            tile_tokens: pick!(tile_tokens, "tile_tokens", d.tile_tokens),
            tau: pick!(self.tau, "tau", d.tau),
            chunks: pick!(self.chunks, "chunks", d.chunks),
            shape: d.shape,
        };
        let r = Resolved {
            seq_len: seq_len.unwrap_or(0),
            corpus,
            gbs: pick!(self.gbs, "gbs", 32),
            dp: pick!(self.dp, "dp", 8),
            seed: pick!(self.seed, "seed", 0),
            packing: pick!(self.packing, "packing", "sequential".to_string()),
            grouping: pick!(self.grouping, "grouping", "vrsp".to_string()),
            params,
        };
        Ok((r, table))
    }
}

/// Parse a grouping policy; only those that give every pool exactly P sequences.
pub fn policy(name: &str) -> Result<Policy> {
    let p: Policy = name.parse()?;
    if !p.exact_cardinality() {
        bail!(
            "invalid grouping = {name}: Libra needs pools of exactly P sequences \
             (vrsp, production, random, zigzag, zigzag-swap)"
        );
    }
    Ok(p)
}

/// Group one step's batch into pools with `policy` (Σℓ² loads; `random` seeded by
/// (seed, step)).
pub fn pools_of(
    batch: &[PackedSeq],
    pool_size: u32,
    policy: Policy,
    seed: u64,
    step: u64,
) -> skewsim::Result<Vec<Vec<usize>>> {
    let loads: Vec<u64> = batch.iter().map(PackedSeq::load).collect();
    let mut rng = skewsim::rng::stream(seed, "libra-grouping", step);
    group(&loads, pool_size as usize, policy, &mut rng)
}

/// The global batches of steps 0..n of a resolved workload (corpus loaded, L defaulted),
/// its GBS, DP and Libra settings checked.
pub fn load_steps(r: &mut Resolved, n: u64) -> Result<Vec<Vec<PackedSeq>>> {
    load_batches(r, n, Keep::All, |r| {
        Ok(step_shape(r.gbs, r.dp, &r.params).map(|_| ())?)
    })
}

/// Which of the batches walked through are kept.
#[derive(Clone, Copy, PartialEq)]
enum Keep {
    All,
    Last,
}

/// The global batches of steps 0..n (all, or the last only) after `validate` accepted the
/// resolved settings; the kept batches' memory is checked first.
fn load_batches(
    r: &mut Resolved,
    n: u64,
    keep: Keep,
    validate: impl FnOnce(&Resolved) -> Result<()>,
) -> Result<Vec<Vec<PackedSeq>>> {
    let corpus = load_corpus(&r.corpus)?;
    if r.seq_len == 0 {
        r.seq_len = corpus.default_seq_len().unwrap_or(262_144);
    }
    let packing: Packing = r.packing.parse()?;
    validate(r)?;
    if n > limits::MAX_STEPS {
        bail!(
            "invalid steps = {n}: at most {} global batches are walked through",
            limits::MAX_STEPS
        );
    }
    let kept = if keep == Keep::All { n } else { 1 };
    let flag = format!("--gbs {} × {kept} step(s) kept: GBS", r.gbs);
    check_batch_memory(&corpus, r.seq_len, r.gbs * kept as usize, r.seed, &flag)?;
    let mut walked = 0u64;
    let mut steps: Vec<Vec<PackedSeq>> = Vec::new();
    for b in batches(&corpus, r.seq_len, r.gbs, packing, r.seed, 0)?.take(n as usize) {
        walked += 1;
        if keep == Keep::Last {
            steps.clear();
        }
        steps.push(b);
    }
    if walked < n {
        bail!(
            "corpus {} yields only {} global batches of {} sequences at L = {}; asked for {n}",
            r.corpus,
            steps.len(),
            r.gbs,
            r.seq_len
        );
    }
    Ok(steps)
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
    /// Fill what the flags leave out from the experiment's table (keys `scheme`, `s_max`,
    /// `sharding`, `outlier_thresholds` as a list, `epsilon`, `ping_pong`); a flag
    /// overrides the file.
    pub fn with_file(&self, table: Option<&toml::Table>, file: Option<&Path>) -> Result<Self> {
        let Some(t) = table else {
            return Ok(self.clone());
        };
        let f = file.unwrap_or(Path::new("(no file)"));
        let thresholds: Option<Vec<u32>> = get(t, "outlier_thresholds", f)?;
        Ok(SchemeArgs {
            scheme: self.scheme.clone().or(get(t, "scheme", f)?),
            s_max: self.s_max.or(get(t, "s_max", f)?),
            sharding: self.sharding.clone().or(get(t, "sharding", f)?),
            outlier_thresholds: self
                .outlier_thresholds
                .clone()
                .or(thresholds.map(|v| v.iter().map(u32::to_string).collect::<Vec<_>>().join(","))),
            epsilon: self.epsilon.or(get(t, "epsilon", f)?),
            no_ping_pong: self.no_ping_pong || get::<bool>(t, "ping_pong", f)? == Some(false),
            tight: self.tight || get::<bool>(t, "tight", f)? == Some(true),
        })
    }
}

/// A scheme's settings as resolved (for the report).
#[derive(Clone, Debug, Serialize)]
pub struct SchemeSettings {
    pub scheme: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub s_max: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharding: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outlier_thresholds: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epsilon: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ping_pong: Option<bool>,
}

/// One group's line in the report.
#[derive(Serialize)]
struct GroupLine {
    ga: u32,
    pool: u32,
    units: usize,
    flops: f64,
    intra_pool_imbalance: f64,
    bytes: u64,
    q_bytes: u64,
    kv_bytes: u64,
    output_bytes: u64,
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

/// Per-worker FLOPs of a group: max / mean − 1.
fn group_imbalance(g: &skewsim::plan::Group) -> f64 {
    let loads: Vec<u64> = g
        .workers
        .iter()
        .map(|&w| {
            g.units
                .iter()
                .filter(|u| u.worker == w)
                .map(|u| u.pairs)
                .sum()
        })
        .collect();
    skewsim::balance::libra::config::ratio_minus_one(&loads)
}

/// Build the plan of `step` for resolved settings.
pub fn build(r: &mut Resolved, step: u64) -> Result<Plan> {
    let pol = policy(&r.grouping)?;
    let steps = load_batches(r, step + 1, Keep::Last, |r| {
        Ok(step_shape(r.gbs, r.dp, &r.params).map(|_| ())?)
    })?;
    let batch = steps.last().context("no step to plan")?;
    let pools = pools_of(batch, r.params.pool_size, pol, r.seed, step)?;
    Ok(plan_step(step, batch, &pools, r.dp, &r.params)?)
}

/// Build the plan of `step` for the scheme `a` names (Libra through [`build`]).
pub fn build_scheme(
    r: &mut Resolved,
    a: &SchemeArgs,
    cp_flag: Option<u32>,
    step: u64,
) -> Result<(Plan, SchemeSettings)> {
    let scheme = a.scheme.clone().unwrap_or_else(|| "libra".into());
    let mut set = SchemeSettings {
        scheme: scheme.clone(),
        s_max: None,
        sharding: None,
        outlier_thresholds: None,
        epsilon: None,
        ping_pong: None,
    };
    let gbs_dp = |r: &Resolved| -> Result<()> {
        if r.dp == 0 || r.gbs == 0 || r.gbs % r.dp as usize != 0 {
            bail!(
                "invalid GBS = {} with DP = {}: GBS must be a positive multiple of DP ≥ 1",
                r.gbs,
                r.dp
            );
        }
        Ok(())
    };
    let shape = r.params.shape;
    let plan = match scheme.as_str() {
        "libra" => build(r, step)?,
        "ulysses" => {
            let p = UlyssesParams {
                cp: r.params.cp,
                shape,
            };
            p.validate()?;
            let steps = load_batches(r, step + 1, Keep::Last, gbs_dp)?;
            let batch = steps.last().context("no step to plan")?;
            ulysses::plan_step(step, batch, r.dp, &p)?
        }
        "wlbllm" => {
            let steps = load_batches(r, step + 1, Keep::All, gbs_dp)?;
            let s_max = match a.s_max {
                Some(v) => v,
                None => r.seq_len.saturating_mul(2),
            };
            let sharding: ShardingMode = a.sharding.as_deref().unwrap_or("adaptive").parse()?;
            let model = ConstantThroughput {
                shape,
                ..ConstantThroughput::h200_llama3_8b()
            };
            let outlier = match &a.outlier_thresholds {
                None => None,
                Some(list) => {
                    let t = list
                        .split(',')
                        .map(|x| x.trim().parse::<u32>())
                        .collect::<std::result::Result<Vec<u32>, _>>()
                        .map_err(|_| {
                            anyhow::anyhow!(
                                "invalid outlier-thresholds = {list}: comma-separated token \
                                 counts L_1 < … < L_(n+1), e.g. 16384,32768,65536"
                            )
                        })?;
                    set.outlier_thresholds = Some(t.clone());
                    Some(wlbllm::OutlierDelay::new(t)?)
                }
            };
            let cfg = WlbConfig::new(r.gbs, s_max, outlier)?;
            let p = WlbPlanParams {
                dp: r.dp,
                cp: r.params.cp,
                tile: KERNEL_TILE,
                s_max,
                sharding,
                shape,
            };
            // check the CP chunking before packing every step
            wlbllm::CpConfig::new(p.cp, p.tile, s_max)?;
            let mut packer = WlbPacker::new(cfg, model);
            let mut out = None;
            for batch in &steps {
                out = Some(packer.step(batch)?);
            }
            let out = out.context("no step to plan")?;
            set.s_max = Some(s_max);
            set.sharding = Some(a.sharding.clone().unwrap_or_else(|| "adaptive".into()));
            wlbllm::lower::to_plan(&out, &p, &model)?.plan
        }
        "distca" => {
            // DistCA's servers hold the baseline's CP layout when --cp is given (in-place
            // attention servers over DP·CP GPUs); without it, one server per replica.
            let cp = cp_flag.unwrap_or(1);
            r.params.cp = cp;
            let epsilon = a.epsilon.unwrap_or(DEFAULT_EPSILON);
            let scheduler = if a.tight {
                DistcaScheduler::Tight
            } else {
                DistcaScheduler::Reference
            };
            let cfg = DistcaConfig::new(shape, epsilon, KERNEL_TILE)?.with_scheduler(scheduler);
            let steps = load_batches(r, step + 1, Keep::Last, gbs_dp)?;
            let batch = steps.last().context("no step to plan")?;
            set.epsilon = Some(epsilon);
            set.ping_pong = Some(!a.no_ping_pong);
            distca::lower::plan_step_cp(step, batch, r.dp, cp, &cfg, !a.no_ping_pong)?.plan
        }
        "megatron-dcp" => {
            // Megatron's dynamic CP over the DP·CP ranks, S = ⌈L / CP⌉, ℓ² workload.
            let cp = r.params.cp.max(1);
            let cfg = DcpConfig::new(r.dp.saturating_mul(cp), r.seq_len.div_ceil(cp), 1)?;
            let steps = load_batches(r, step + 1, Keep::Last, gbs_dp)?;
            let batch = steps.last().context("no step to plan")?;
            let model = ConstantThroughput {
                shape,
                ..ConstantThroughput::h200_llama3_8b()
            };
            let work = megatron_dcp::sample_work(DcpLoad::Pairs, &model);
            let sched = megatron_dcp::schedule(batch, &cfg, work)?;
            megatron_dcp::to_plan(step, &sched, &cfg, &shape)
        }
        other => bail!(
            "invalid scheme = {other}: one of {}",
            super::check_plan::SCHEMES.join(", ")
        ),
    };
    Ok((plan, set))
}

pub fn run(args: Args, out: Output) -> Result<()> {
    let (mut r, table) = args.workload.resolve(
        args.experiment.as_deref(),
        args.pool_size,
        args.head_shards,
        args.tile_tokens,
    )?;
    let file = args.experiment.as_deref();
    let sa = args.scheme.with_file(table.as_ref(), file)?;
    if args.pipeline.is_some() && sa.scheme.as_deref().is_some_and(|s| s != "libra") {
        bail!("--pipeline writes Libra's pipeliner chunks: it needs --scheme libra");
    }
    let cp_given = match (args.workload.cp, &table) {
        (Some(c), _) => Some(c),
        (None, Some(t)) => get(t, "cp", file.unwrap_or(Path::new("(no file)")))?,
        (None, None) => None,
    };
    let (plan, scheme) = build_scheme(&mut r, &sa, cp_given, args.step)?;
    let summary =
        check(&plan).map_err(|v| anyhow::anyhow!("the planner made a wrong plan: {v}"))?;
    if let Some(path) = &args.pipeline {
        let pipes = pipeliner::pipeline_plan(&plan, r.params.chunks)?;
        std::fs::write(path, serde_json::to_string(&pipes)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let json = plan.to_json()?;
    std::fs::write(&args.out, json + "\n")
        .with_context(|| format!("writing {}", args.out.display()))?;
    let groups: Vec<GroupLine> = plan
        .groups
        .iter()
        .map(|g| {
            let s = exchange::stats(g);
            GroupLine {
                ga: g.ga,
                pool: g.pool,
                units: g.units.len(),
                flops: g.units.iter().map(|u| u.flops).sum(),
                intra_pool_imbalance: group_imbalance(g),
                bytes: s.total,
                q_bytes: s.q,
                kv_bytes: s.kv,
                output_bytes: s.output,
            }
        })
        .collect();
    let report = Report {
        file: args.out.display().to_string(),
        settings: r,
        scheme,
        step: args.step,
        check: summary,
        groups,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, body: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("skewsim-plan-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn settings_come_from_flags_then_file_then_defaults() {
        let f = temp(
            "exp.toml",
            "[libra]\ncorpus = \"wlbllm\"\ngbs = 16\ncp = 4\ntau = 0.1\n",
        );
        let w = Workload {
            cp: Some(2),
            ..Workload::default()
        };
        let (r, _) = w.resolve(Some(&f), Some(4), None, None).unwrap();
        assert_eq!(r.corpus, "wlbllm"); // file
        assert_eq!(r.gbs, 16); // file
        assert_eq!(r.params.cp, 2); // flag beats file
        assert_eq!(r.params.tau, 0.1); // file
        assert_eq!(r.params.pool_size, 4); // flag
        assert_eq!(r.params.head_shards, 4); // default
        assert_eq!((r.dp, r.grouping.as_str()), (8, "vrsp")); // defaults

        let bad = temp("bad.toml", "gbs = \"many\"\n");
        let e = format!(
            "{:#}",
            Workload::default()
                .resolve(Some(&bad), None, None, None)
                .unwrap_err()
        );
        assert!(
            e.contains("bad.toml: not a valid settings file") && e.contains("invalid type"),
            "{e}"
        );
    }

    #[test]
    fn scheme_settings_come_from_flags_then_file() {
        let f = temp(
            "scheme.toml",
            "scheme = \"wlbllm\"\ns_max = 4096\noutlier_thresholds = [10, 20]\n\
             epsilon = 0.2\nping_pong = false\n",
        );
        let t = experiment_table(&f).unwrap();
        let flags = SchemeArgs {
            s_max: Some(64),
            ..SchemeArgs::default()
        };
        let a = flags.with_file(Some(&t), Some(&f)).unwrap();
        assert_eq!(a.scheme.as_deref(), Some("wlbllm")); // file
        assert_eq!(a.s_max, Some(64)); // flag beats file
        assert_eq!(a.outlier_thresholds.as_deref(), Some("10,20"));
        assert_eq!((a.epsilon, a.no_ping_pong), (Some(0.2), true));
        let bad = temp("scheme-bad.toml", "epsilon = \"tight\"\n");
        let e = format!("{:#}", experiment_table(&bad).unwrap_err());
        assert!(
            e.contains("scheme-bad.toml: not a valid settings file") && e.contains("epsilon"),
            "{e}"
        );
    }

    #[test]
    fn plan_of_a_small_workload_checks_and_bad_input_is_named() {
        let w = Workload {
            corpus: Some("lognormal:median=600,p99=30000".into()),
            seq_len: Some(32768),
            gbs: Some(8),
            dp: Some(4),
            cp: Some(2),
            ..Workload::default()
        };
        let (mut r, _) = w.resolve(None, Some(2), Some(2), Some(1024)).unwrap();
        let plan = build(&mut r, 1).unwrap();
        let s = check(&plan).unwrap();
        assert_eq!((plan.step, s.sequences, s.groups), (1, 8, 4));
        // same settings, same plan
        let (mut r2, _) = w.resolve(None, Some(2), Some(2), Some(1024)).unwrap();
        assert_eq!(build(&mut r2, 1).unwrap(), plan);

        let (mut r, _) = w.resolve(None, Some(3), None, None).unwrap();
        let e = build(&mut r, 0).unwrap_err().to_string();
        assert!(e.contains("P (pool size) = 3: a divisor of DP = 4"), "{e}");
        let (mut r, _) = w.resolve(None, None, Some(5), None).unwrap();
        let e = build(&mut r, 0).unwrap_err().to_string();
        assert!(e.contains("H (head shards) = 5"), "{e}");
        let (mut r, _) = w.resolve(None, Some(2), None, Some(0)).unwrap();
        let e = build(&mut r, 0).unwrap_err().to_string();
        assert!(e.contains("B (tile tokens) = 0"), "{e}");
        let e = policy("lpt").unwrap_err().to_string();
        assert!(e.contains("exactly P sequences"), "{e}");
        assert!(policy("nonsense").is_err());
    }
}
