//! One training step's checked [`Plan`] for any scheme: `libra` (VRSP pools, TAP,
//! exchange), `ulysses`, `wlbllm`, `distca` or `megatron-dcp` — what `skewsim plan` writes
//! and `skewsim.plan` returns.
//!
//! Settings come from the caller ([`Workload`], [`SchemeKnobs`]); a settings or experiment
//! file may give them instead — its `[libra]` table if it has one, else its top level, the
//! settings' names in snake_case — and the caller's values override the file's
//! ([`Workload::resolve`], [`SchemeKnobs::with_file`]). `libra-config` shares the workload
//! half ([`load_steps`], [`policy`]).

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::balance::distca::{self, DistcaConfig, DistcaScheduler, DEFAULT_EPSILON};
use crate::balance::libra::pipeliner::{self, WorkerPipeline};
use crate::balance::libra::LibraParams;
use crate::balance::libra::{config::ratio_minus_one, exchange, plan_step, step_shape};
use crate::balance::megatron_dcp::{self, DcpConfig, DcpLoad};
use crate::balance::ulysses::{self, UlyssesParams};
use crate::balance::wlbllm::lower::{ShardingMode, WlbPlanParams};
use crate::balance::wlbllm::{self, ConstantThroughput, WlbConfig, WlbPacker, KERNEL_TILE};
use crate::balance::{group, Policy};
use crate::error::{bail, invalid, Context, Error, Result};
use crate::plan::{check, CheckSummary, Group, Plan};
use crate::workload::corpus::Corpus;
use crate::workload::pack::{batches, Packing};
use crate::workload::PackedSeq;

use super::inputs::{load_corpus, read_input_text, MAX_SPEC_BYTES};

/// The schemes that write plans, as `scheme = "..."` names them.
pub const SCHEMES: &[&str] = &["libra", "ulysses", "wlbllm", "distca", "megatron-dcp"];

/// Global batches a plan walks through, at most (the step planned is below it).
pub const MAX_STEPS: u64 = 1 << 16;

/// Checks the memory of a batch before it is packed: (corpus, L, sequences kept, seed,
/// what names the knob). The CLI refuses past its `--max-memory`; a caller without a
/// budget passes [`no_budget`].
pub type BatchBudget<'a> = &'a dyn Fn(&Corpus, u32, usize, u64, &str) -> Result<()>;

/// A [`BatchBudget`] that accepts every batch.
pub fn no_budget(_: &Corpus, _: u32, _: usize, _: u64, _: &str) -> Result<()> {
    Ok(())
}

/// The workload and cluster settings shared by `plan` and `libra-config`; `None`: the
/// file's, else the default.
#[derive(Clone, Debug, Default)]
pub struct Workload {
    /// Corpus: built-in name, parametric spec or trace file [default: libra-256k].
    pub corpus: Option<String>,
    /// Sequence length L [default: the corpus's own, else 262144].
    pub seq_len: Option<u32>,
    /// Global batch size, packed sequences per step [default: 32].
    pub gbs: Option<usize>,
    /// DP degree [default: 8].
    pub dp: Option<u32>,
    /// CP degree, workers per DP replica [default: 16].
    pub cp: Option<u32>,
    /// Soft-cap slack τ ≥ 0 of Algorithm 2 [default: 0.03].
    pub tau: Option<f64>,
    /// Pipeliner head chunks M [default: 4].
    pub chunks: Option<u32>,
    /// Seed of the document stream (and of `random` grouping) [default: 0].
    pub seed: Option<u64>,
    /// Packing: sequential, best-fit or best-fit:W [default: sequential].
    pub packing: Option<String>,
    /// Grouping into pools [default: vrsp].
    pub grouping: Option<String>,
}

/// Settings resolved from the caller, the file and defaults.
#[derive(Clone, Debug, Serialize)]
pub struct Resolved {
    /// The corpus.
    pub corpus: String,
    /// L (0 until the corpus is loaded when neither caller nor file gave it).
    pub seq_len: u32,
    /// GBS.
    pub gbs: usize,
    /// DP.
    pub dp: u32,
    /// The document stream's seed.
    pub seed: u64,
    /// The packing.
    pub packing: String,
    /// The grouping policy.
    pub grouping: String,
    /// Libra's P, CP, H, B, τ and M.
    pub params: LibraParams,
}

/// A settings file of `plan` and `libra-config` (a file without a `kind`): the settings'
/// names in snake_case, libra-config's candidate lists, nothing else.
#[derive(Deserialize)]
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
    tight: Option<bool>,
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
    let text = read_input_text(file, MAX_SPEC_BYTES)
        .with_context(|| format!("reading experiment file {}", file.display()))?;
    let doc: toml::Table =
        toml::from_str(&text).with_context(|| format!("{} is not valid TOML", file.display()))?;
    if doc.contains_key("kind") {
        super::check(&file.display().to_string(), &text, &doc)?;
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

/// `key` of `table` as a `T`, if present; a mistyped value is refused naming `file`, the
/// key, the value and the type wanted.
pub fn get<T: DeserializeOwned>(table: &toml::Table, key: &str, file: &Path) -> Result<Option<T>> {
    table
        .get(key)
        .map(|v| {
            v.clone().try_into::<T>().map_err(|e| Error::Context {
                context: file.display().to_string(),
                cause: Box::new(invalid(key, v, e.to_string().trim())),
            })
        })
        .transpose()
}

impl Workload {
    /// Fill what the caller leaves out from `file` (if any), then from defaults.
    /// `pool_size`, `head_shards` and `tile_tokens` are the single values `plan` uses.
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
            return Err(invalid(
                "seq_len",
                0,
                "a sequence length L ≥ 1 token (leave it out for the corpus's own)",
            ))
            .context(f.display());
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
        return Err(invalid(
            "grouping",
            name,
            "Libra needs pools of exactly P sequences (vrsp, production, random, zigzag, \
             zigzag-swap)",
        ));
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
) -> Result<Vec<Vec<usize>>> {
    let loads: Vec<u64> = batch.iter().map(PackedSeq::load).collect();
    let mut rng = crate::rng::stream(seed, "libra-grouping", step);
    group(&loads, pool_size as usize, policy, &mut rng)
}

/// The global batches of steps 0..n of a resolved workload (corpus loaded, L defaulted),
/// its GBS, DP and Libra settings checked.
pub fn load_steps(r: &mut Resolved, n: u64, budget: BatchBudget) -> Result<Vec<Vec<PackedSeq>>> {
    load_batches(r, n, Keep::All, budget, |r| {
        step_shape(r.gbs, r.dp, &r.params).map(|_| ())
    })
}

/// Which of the batches walked through are kept.
#[derive(Clone, Copy, PartialEq)]
enum Keep {
    All,
    Last,
}

/// The global batches of steps 0..n (all, or the last only) after `validate` accepted the
/// resolved settings; the kept batches' memory is checked by `budget` first.
fn load_batches(
    r: &mut Resolved,
    n: u64,
    keep: Keep,
    budget: BatchBudget,
    validate: impl FnOnce(&Resolved) -> Result<()>,
) -> Result<Vec<Vec<PackedSeq>>> {
    let corpus = load_corpus(&r.corpus)?;
    if r.seq_len == 0 {
        r.seq_len = corpus.default_seq_len().unwrap_or(262_144);
    }
    let packing: Packing = r.packing.parse()?;
    validate(r)?;
    if n > MAX_STEPS {
        return Err(invalid(
            "steps",
            n,
            format!("at most {MAX_STEPS} global batches are walked through"),
        ));
    }
    let kept = if keep == Keep::All { n } else { 1 };
    let flag = format!("--gbs {} × {kept} step(s) kept: GBS", r.gbs);
    budget(&corpus, r.seq_len, r.gbs * kept as usize, r.seed, &flag)?;
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

/// The scheme and the knobs of the schemes other than Libra; `None`: the file's, else the
/// default.
#[derive(Clone, Debug, Default)]
pub struct SchemeKnobs {
    /// Scheme: one of [`SCHEMES`] [default: libra].
    pub scheme: Option<String>,
    /// WLB-LLM memory cap S_max, tokens per micro-batch (2·CP must divide it) [default: 2·L].
    pub s_max: Option<u32>,
    /// WLB-LLM CP sharding: adaptive, per-sequence or per-document [default: adaptive].
    pub sharding: Option<String>,
    /// WLB-LLM outlier delay: thresholds L_1 < … < L_(n+1) (off when absent).
    pub outlier_thresholds: Option<Vec<u32>>,
    /// DistCA tolerance ε ≥ 0 [default: 0.10].
    pub epsilon: Option<f64>,
    /// DistCA: two ping-pong nano-batches per micro-batch [default: on].
    pub ping_pong: Option<bool>,
    /// DistCA: skewsim's tight scheduler instead of the public repository's [default: off].
    pub tight: Option<bool>,
}

impl SchemeKnobs {
    /// Fill what the caller leaves out from the experiment's table (keys `scheme`,
    /// `s_max`, `sharding`, `outlier_thresholds`, `epsilon`, `ping_pong`, `tight`).
    pub fn with_file(&self, table: Option<&toml::Table>, file: Option<&Path>) -> Result<Self> {
        let Some(t) = table else {
            return Ok(self.clone());
        };
        let f = file.unwrap_or(Path::new("(no file)"));
        Ok(SchemeKnobs {
            scheme: self.scheme.clone().or(get(t, "scheme", f)?),
            s_max: self.s_max.or(get(t, "s_max", f)?),
            sharding: self.sharding.clone().or(get(t, "sharding", f)?),
            outlier_thresholds: match &self.outlier_thresholds {
                Some(v) => Some(v.clone()),
                None => get(t, "outlier_thresholds", f)?,
            },
            epsilon: self.epsilon.or(get(t, "epsilon", f)?),
            ping_pong: self.ping_pong.or(get(t, "ping_pong", f)?),
            tight: self.tight.or(get(t, "tight", f)?),
        })
    }
}

/// A scheme's settings as resolved (for the report).
#[derive(Clone, Debug, Serialize)]
pub struct SchemeSettings {
    /// The scheme.
    pub scheme: String,
    /// WLB-LLM's S_max.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub s_max: Option<u32>,
    /// WLB-LLM's sharding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharding: Option<String>,
    /// WLB-LLM's outlier-delay thresholds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outlier_thresholds: Option<Vec<u32>>,
    /// DistCA's ε.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epsilon: Option<f64>,
    /// DistCA's ping-pong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ping_pong: Option<bool>,
}

/// One group of a plan: its work and the bytes it moves (one attention layer, forward).
#[derive(Clone, Debug, Serialize)]
pub struct GroupLine {
    /// GA index.
    pub ga: u32,
    /// Pool index.
    pub pool: u32,
    /// Work units.
    pub units: usize,
    /// FLOPs.
    pub flops: f64,
    /// Per-worker pairs: max / mean − 1.
    pub intra_pool_imbalance: f64,
    /// Bytes moved.
    pub bytes: u64,
    /// Query bytes.
    pub q_bytes: u64,
    /// K/V bytes.
    pub kv_bytes: u64,
    /// Output bytes.
    pub output_bytes: u64,
}

impl GroupLine {
    /// The line of group `g`.
    pub fn of(g: &Group) -> Self {
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
    }
}

/// Per-worker pairs of a group: max / mean − 1.
fn group_imbalance(g: &Group) -> f64 {
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
    ratio_minus_one(&loads)
}

/// Build the Libra plan of `step` for resolved settings.
pub fn build(r: &mut Resolved, step: u64, budget: BatchBudget) -> Result<Plan> {
    let pol = policy(&r.grouping)?;
    let steps = load_batches(r, step + 1, Keep::Last, budget, |r| {
        step_shape(r.gbs, r.dp, &r.params).map(|_| ())
    })?;
    let batch = steps.last().context("no step to plan")?;
    let pools = pools_of(batch, r.params.pool_size, pol, r.seed, step)?;
    plan_step(step, batch, &pools, r.dp, &r.params)
}

/// GBS a positive multiple of DP.
fn gbs_dp(r: &Resolved) -> Result<()> {
    if r.dp == 0 || r.gbs == 0 || r.gbs % r.dp as usize != 0 {
        return Err(invalid(
            "GBS",
            format!("{} with DP = {}", r.gbs, r.dp),
            "GBS must be a positive multiple of DP ≥ 1",
        ));
    }
    Ok(())
}

/// Build the plan of `step` for the scheme `a` names (Libra through [`build`]);
/// `cp_given` is the CP the caller or file gave (DistCA: one server per replica without).
pub fn build_scheme(
    r: &mut Resolved,
    a: &SchemeKnobs,
    cp_given: Option<u32>,
    step: u64,
    budget: BatchBudget,
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
    let shape = r.params.shape;
    let ping_pong = a.ping_pong != Some(false);
    let plan = match scheme.as_str() {
        "libra" => build(r, step, budget)?,
        "ulysses" => {
            let p = UlyssesParams {
                cp: r.params.cp,
                shape,
            };
            p.validate()?;
            let steps = load_batches(r, step + 1, Keep::Last, budget, gbs_dp)?;
            let batch = steps.last().context("no step to plan")?;
            ulysses::plan_step(step, batch, r.dp, &p)?
        }
        "wlbllm" => {
            let steps = load_batches(r, step + 1, Keep::All, budget, gbs_dp)?;
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
                Some(t) => {
                    set.outlier_thresholds = Some(t.clone());
                    Some(wlbllm::OutlierDelay::new(t.clone())?)
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
            // DistCA's servers hold the baseline's CP layout when CP is given (in-place
            // attention servers over DP·CP GPUs); without it, one server per replica.
            let cp = cp_given.unwrap_or(1);
            r.params.cp = cp;
            let epsilon = a.epsilon.unwrap_or(DEFAULT_EPSILON);
            let scheduler = if a.tight == Some(true) {
                DistcaScheduler::Tight
            } else {
                DistcaScheduler::Reference
            };
            let cfg = DistcaConfig::new(shape, epsilon, KERNEL_TILE)?.with_scheduler(scheduler);
            let steps = load_batches(r, step + 1, Keep::Last, budget, gbs_dp)?;
            let batch = steps.last().context("no step to plan")?;
            set.epsilon = Some(epsilon);
            set.ping_pong = Some(ping_pong);
            distca::lower::plan_step_cp(step, batch, r.dp, cp, &cfg, ping_pong)?.plan
        }
        "megatron-dcp" => {
            // Megatron's dynamic CP over the DP·CP ranks, S = ⌈L / CP⌉, ℓ² workload.
            let cp = r.params.cp.max(1);
            let cfg = DcpConfig::new(r.dp.saturating_mul(cp), r.seq_len.div_ceil(cp), 1)?;
            let steps = load_batches(r, step + 1, Keep::Last, budget, gbs_dp)?;
            let batch = steps.last().context("no step to plan")?;
            let model = ConstantThroughput {
                shape,
                ..ConstantThroughput::h200_llama3_8b()
            };
            let work = megatron_dcp::sample_work(DcpLoad::Pairs, &model);
            let sched = megatron_dcp::schedule(batch, &cfg, work)?;
            megatron_dcp::to_plan(step, &sched, &cfg, &shape)
        }
        other => {
            return Err(invalid(
                "scheme",
                other,
                format!("one of {}", SCHEMES.join(", ")),
            ))
        }
    };
    Ok((plan, set))
}

/// What `plan` asks for: the settings, an optional settings or experiment file, the step
/// and whether to build Libra's pipeliner chunks.
#[derive(Clone, Debug, Default)]
pub struct PlanRequest<'a> {
    /// A settings or experiment file; the caller's settings override it.
    pub file: Option<&'a Path>,
    /// The workload and cluster.
    pub workload: Workload,
    /// Pool size P [default: 8].
    pub pool_size: Option<u32>,
    /// Head shards H [default: 4].
    pub head_shards: Option<u32>,
    /// Tile tokens B [default: 4096].
    pub tile_tokens: Option<u32>,
    /// The scheme and its knobs.
    pub scheme: SchemeKnobs,
    /// The step (global batch index) to plan.
    pub step: u64,
    /// Also build the pipeliner's M head chunks per worker (Libra only).
    pub pipeline: bool,
}

impl PlanRequest<'_> {
    /// The caller's knobs that `scheme` does not read (another scheme's), as flags:
    /// planned without them, so a caller can say so.
    pub fn ignored_knobs(&self, scheme: &str) -> Vec<&'static str> {
        let (s, w) = (&self.scheme, &self.workload);
        [
            ("--s-max", "wlbllm", s.s_max.is_some()),
            ("--sharding", "wlbllm", s.sharding.is_some()),
            (
                "--outlier-thresholds",
                "wlbllm",
                s.outlier_thresholds.is_some(),
            ),
            ("--epsilon", "distca", s.epsilon.is_some()),
            ("--no-ping-pong", "distca", s.ping_pong.is_some()),
            ("--tight", "distca", s.tight.is_some()),
            ("--pool-size", "libra", self.pool_size.is_some()),
            ("--head-shards", "libra", self.head_shards.is_some()),
            ("--tile-tokens", "libra", self.tile_tokens.is_some()),
            ("--tau", "libra", w.tau.is_some()),
            ("--chunks", "libra", w.chunks.is_some()),
            ("--grouping", "libra", w.grouping.is_some()),
        ]
        .into_iter()
        .filter(|&(_, owner, given)| given && owner != scheme)
        .map(|(flag, _, _)| flag)
        .collect()
    }
}

/// A checked plan and what a person reads about it.
#[derive(Clone, Debug)]
pub struct PlanOutcome {
    /// The plan.
    pub plan: Plan,
    /// The settings it was made with.
    pub settings: Resolved,
    /// The scheme's settings.
    pub scheme: SchemeSettings,
    /// The step planned.
    pub step: u64,
    /// The checker's summary.
    pub check: CheckSummary,
    /// One line per group.
    pub groups: Vec<GroupLine>,
    /// The pipeliner's chunks per group and worker, when asked for.
    pub pipeline: Option<Vec<Vec<WorkerPipeline>>>,
}

/// The checked plan `req` asks for; `budget` checks the batches' memory before packing.
pub fn plan(req: &PlanRequest, budget: BatchBudget) -> Result<PlanOutcome> {
    let (mut r, table) =
        req.workload
            .resolve(req.file, req.pool_size, req.head_shards, req.tile_tokens)?;
    let knobs = req.scheme.with_file(table.as_ref(), req.file)?;
    if req.pipeline && knobs.scheme.as_deref().is_some_and(|s| s != "libra") {
        bail!("--pipeline writes Libra's pipeliner chunks: it needs --scheme libra");
    }
    let cp_given = match (req.workload.cp, &table) {
        (Some(c), _) => Some(c),
        (None, Some(t)) => get(t, "cp", req.file.unwrap_or(Path::new("(no file)")))?,
        (None, None) => None,
    };
    let (plan, scheme) = build_scheme(&mut r, &knobs, cp_given, req.step, budget)?;
    let check = check(&plan).map_err(|v| Error::Context {
        context: "the planner made a wrong plan".into(),
        cause: Box::new(v.into()),
    })?;
    let pipeline = if req.pipeline {
        Some(pipeliner::pipeline_plan(&plan, r.params.chunks)?)
    } else {
        None
    };
    let groups = plan.groups.iter().map(GroupLine::of).collect();
    Ok(PlanOutcome {
        plan,
        settings: r,
        scheme,
        step: req.step,
        check,
        groups,
        pipeline,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn temp(name: &str, body: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("skewsim-plan-lib-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn settings_come_from_the_caller_then_file_then_defaults() {
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
        assert_eq!(r.params.cp, 2); // caller beats file
        assert_eq!(r.params.tau, 0.1); // file
        assert_eq!(r.params.pool_size, 4); // caller
        assert_eq!(r.params.head_shards, 4); // default
        assert_eq!((r.dp, r.grouping.as_str()), (8, "vrsp")); // defaults

        let bad = temp("bad.toml", "gbs = \"many\"\n");
        let e = Workload::default()
            .resolve(Some(&bad), None, None, None)
            .unwrap_err();
        assert!(
            matches!(&e, Error::Context { context, cause }
                if context.contains("bad.toml: not a valid settings file")
                    && matches!(**cause, Error::Spec(ref m) if m.contains("invalid type"))),
            "{e}"
        );
        // a mistyped value in an experiment's [libra] table is named by its field
        let t: toml::Table = toml::from_str("gbs = \"many\"").unwrap();
        let e = get::<usize>(&t, "gbs", Path::new("x.toml")).unwrap_err();
        assert!(
            matches!(e.root(), Error::Invalid { field, value, .. }
                if field == "gbs" && value == "\"many\""),
            "{e}"
        );
    }

    #[test]
    fn scheme_knobs_come_from_the_caller_then_file() {
        let f = temp(
            "scheme.toml",
            "scheme = \"wlbllm\"\ns_max = 4096\noutlier_thresholds = [10, 20]\n\
             epsilon = 0.2\nping_pong = false\n",
        );
        let t = experiment_table(&f).unwrap();
        let knobs = SchemeKnobs {
            s_max: Some(64),
            ..SchemeKnobs::default()
        };
        let a = knobs.with_file(Some(&t), Some(&f)).unwrap();
        assert_eq!(a.scheme.as_deref(), Some("wlbllm")); // file
        assert_eq!(a.s_max, Some(64)); // caller beats file
        assert_eq!(a.outlier_thresholds, Some(vec![10, 20]));
        assert_eq!(
            (a.epsilon, a.ping_pong, a.tight),
            (Some(0.2), Some(false), None)
        );
        let bad = temp("scheme-bad.toml", "epsilon = \"tight\"\n");
        let e = experiment_table(&bad).unwrap_err().to_string();
        assert!(
            e.contains("scheme-bad.toml: not a valid settings file") && e.contains("epsilon"),
            "{e}"
        );
    }

    fn small() -> PlanRequest<'static> {
        PlanRequest {
            workload: Workload {
                corpus: Some("lognormal:median=600,p99=30000".into()),
                seq_len: Some(32768),
                gbs: Some(8),
                dp: Some(4),
                cp: Some(2),
                ..Workload::default()
            },
            pool_size: Some(2),
            head_shards: Some(2),
            tile_tokens: Some(1024),
            step: 1,
            ..PlanRequest::default()
        }
    }

    #[test]
    fn plan_of_a_small_workload_checks_and_bad_input_is_named() {
        let o = plan(&small(), &no_budget).unwrap();
        assert_eq!((o.plan.step, o.check.sequences, o.check.groups), (1, 8, 4));
        assert_eq!(o.groups.len(), o.plan.groups.len());
        // same settings, same plan
        assert_eq!(plan(&small(), &no_budget).unwrap().plan, o.plan);

        let field_of = |req: PlanRequest| match plan(&req, &no_budget).unwrap_err().root() {
            Error::Invalid { field, .. } => field.clone(),
            e => panic!("not a named field: {e}"),
        };
        assert_eq!(
            field_of(PlanRequest {
                pool_size: Some(3),
                ..small()
            }),
            "P (pool size)"
        );
        assert_eq!(
            field_of(PlanRequest {
                tile_tokens: Some(0),
                ..small()
            }),
            "B (tile tokens)"
        );
        let scheme = |s: &str| SchemeKnobs {
            scheme: Some(s.into()),
            ..SchemeKnobs::default()
        };
        assert_eq!(
            field_of(PlanRequest {
                scheme: scheme("megatron"),
                ..small()
            }),
            "scheme"
        );
        assert_eq!(
            field_of(PlanRequest {
                workload: Workload {
                    grouping: Some("lpt".into()),
                    ..small().workload
                },
                ..small()
            }),
            "grouping"
        );
        assert!(policy("nonsense").is_err());
        // every scheme plans the small workload's step, checked: the same exact causal
        // FLOPs (WLB-LLM: delay off, S_max = 2L, so it trains exactly the step's samples)
        for s in SCHEMES {
            let p = plan(
                &PlanRequest {
                    scheme: scheme(s),
                    ..small()
                },
                &no_budget,
            )
            .unwrap();
            assert_eq!(p.scheme.scheme, *s);
            assert!(
                (p.check.flops - o.check.flops).abs() <= 1e-9 * o.check.flops,
                "{s}: {} FLOPs, libra {}",
                p.check.flops,
                o.check.flops
            );
        }
    }
}
