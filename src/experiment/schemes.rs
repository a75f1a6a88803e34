//! Experiment kinds that compare the balancing schemes on one simulated cluster:
//! `four-way` (all four across DP scale, corpus and topology), `attention-microbench`
//! (the core-attention layer alone: per-step straggler latency, mean and max over the
//! steps) and `distca-ablation` (DistCA vs WLB-LLM and DistCA's ablations). Each writes
//! `points.csv`, `summary.md` and `plot.svg`.
//!
//! ```toml
//! kind = "four-way"                  # | "attention-microbench" | "distca-ablation"
//! description = "..."
//! notes = """..."""                  # copied into summary.md (the papers' figures, causes)
//! model = "llama3-8b"                # a built-in or a model TOML (relative to this file)
//! layers = 2                         # optional: simulate only this many layers
//! steps = 2                          # global batches per point (a GBS window)
//! arms = ["ulysses", "wlbllm", "distca", "libra"]
//!     # an arm is a scheme with optional `:`-separated tweaks: distca:tight (skewsim's
//!     # scheduler instead of the repository's), distca:no-ping-pong,
//!     # distca:signal, libra:signal, wlbllm:signal (1-byte transfers: communication
//!     # cost removed, dependencies kept), distca:eps=0.15,
//!     # wlbllm:per-document | per-sequence, wlbllm:cp=N (the same GPUs and global batch
//!     # on CP N: DP and GA rescaled), wlbllm:best-cp (every such CP, the fastest kept),
//!     # wlbllm:s-max=TOKENS, libra:m=1, libra:p=P, libra:h=H, libra:b=B (pool size, head
//!     # shards, tile tokens), any arm :table (attention priced by the built-in measured
//!     # H200 table of whole FlashAttention-2 launches, not the thread-block models: no
//!     # launch waits on its longest block),
//!     # megatron-dcp (Megatron-Core's
//!     # dynamic CP):s=TOKENS (max_seqlen_per_dp_cp_rank), :min-cp=N, :load=pairs (ℓ², the
//!     # code's) | latency (attention + linear time, the blog's), :rounds=open (a round's
//!     # groups grow until balanced) | capped (Megatron-Core's current scheduler: within S
//!     # tokens a rank, one micro-batch per group a round); the first arm is the baseline
//! [network]  topology = "dgx-h200-roce", model = "analytical" | "flow"
//!            (nodes = TP·CP·DP·PP / the topology's GPUs per node, per point),
//!            nvls = true | false (NVLS collectives where the topology has them)
//! [parallel] cp, ga, pp, tp, sp, tp_overlap, ep, moe_hot_share, pipeline, recompute, zero_stage, dp_buckets,
//!            precision = "bf16" | "fp8"
//!            (dp from [sweep]; GPUs = TP·CP·DP·PP, TP innermost inside one node)
//! [cluster]  gpu = "b200" (or a GPU file): every point's GPU (absent: each topology's, else h200)
//! [workload] corpus = "libra-256k", seq_len = 262144, seed = 1
//! [settings] epsilon, ping_pong, s_max, sharding, pool_size, head_shards, tile_tokens,
//!            tau, chunks, max_seqlen_per_dp_cp_rank (default ⌈L / CP⌉), min_dynamic_cp
//!            (Libra's knobs are checked as the train kind checks them, pool_size before
//!            it is capped at DP; tau and epsilon take any finite value ≥ 0: past W − 1
//!            and 1 they lift the load cap and the move threshold altogether; every arm's
//!            settings are checked on every point's layout before the first point runs)
//! [sweep]    dp = [...], corpus = [...], seq_len = [...], topology = [...], model = [...]
//! [sweep.attention]  sliding_share = [...], window = [...], period = N   # the model's
//!            attention pattern as an axis (`mix.rs`): x of the plot, skew per mix
//! [[sweep.layout]]  dp, cp, ga, model = "...", seq_len = N   # instead of dp: the points'
//!            layouts, each at its model and L only when it names them (a paper's
//!            GPU counts, each with its own CP and batch)
//! calibration = "cal.json"           # optional (`skewsim calibrate`; `--calibration` wins):
//!                                    # prices attention by the measured GPU, planners included
//! ```

use super::calfile::Prices;
use super::inputs::{read_input_text, MAX_SPEC_BYTES};
use crate::cost::profile::Kernel;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::balance::distca::DistcaScheduler;
use crate::balance::libra::LibraParams;
use crate::balance::schemes::{Scheme, SchemePlanner, SchemeSettings};
use crate::balance::wlbllm::lower::ShardingMode;
use crate::cluster::TopologySpec;
use crate::cost::{CostModel, ModelConfig};
use crate::error::{invalid, Context, Result};
use crate::net::collective::CollectiveModel;
use crate::report::svg::{Chart, Scale, Series};
use crate::schedule::compare::simulate_scheme_step_with;
use crate::schedule::train::Workload;
use crate::schedule::{NoVariance, Parallelism, PipelineKind, Placement, Precision};
use crate::workload::pack::Packing;

use super::train::{NetChoice, BUILTIN_TOPOLOGIES};
use super::{Observer, Outcome};

mod mix;

/// The kinds this module runs.
pub const KINDS: &[&str] = &["four-way", "attention-microbench", "distca-ablation"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompareFile {
    kind: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    notes: String,
    model: String,
    #[serde(default)]
    layers: Option<u32>,
    #[serde(default = "one")]
    steps: u64,
    arms: Vec<String>,
    #[serde(default)]
    network: NetFile,
    parallel: ParFile,
    workload: WorkFile,
    #[serde(default)]
    settings: SettingsFile,
    #[serde(default)]
    sweep: SweepFile,
    #[serde(default)]
    calibration: Option<String>,
    #[serde(default)]
    cluster: ClusterFile,
}

/// `[cluster]`: the GPU every point runs on (a built-in name or a GPU file, relative to the
/// experiment); absent: each topology's `gpu`, else `h200`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    #[serde(default)]
    gpu: Option<String>,
}

fn one() -> u64 {
    1
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct NetFile {
    topology: Option<String>,
    model: Option<String>,
    /// NVLink SHARP for collectives where the topology has it (`false`: NCCL_NVLS_ENABLE=0).
    #[serde(default = "yes")]
    nvls: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ParFile {
    cp: u32,
    ga: u32,
    #[serde(default = "one32")]
    pp: u32,
    #[serde(default)]
    pipeline: Option<PipelineKind>,
    #[serde(default)]
    recompute: bool,
    #[serde(default)]
    zero_stage: u8,
    #[serde(default = "one32")]
    dp_buckets: u32,
    #[serde(default)]
    dp: Option<u32>,
    #[serde(default = "one32")]
    tp: u32,
    #[serde(default = "yes")]
    sp: bool,
    #[serde(default)]
    tp_overlap: bool,
    #[serde(default = "one32")]
    ep: u32,
    #[serde(default)]
    moe_hot_share: f64,
    #[serde(default)]
    precision: Precision,
}

fn one32() -> u32 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkFile {
    corpus: String,
    #[serde(default)]
    seq_len: Option<u32>,
    #[serde(default)]
    seed: u64,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct SettingsFile {
    epsilon: Option<f64>,
    ping_pong: Option<bool>,
    s_max: Option<u32>,
    sharding: Option<String>,
    pool_size: Option<u32>,
    head_shards: Option<u32>,
    tile_tokens: Option<u32>,
    tau: Option<f64>,
    chunks: Option<u32>,
    max_seqlen_per_dp_cp_rank: Option<u32>,
    min_dynamic_cp: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct SweepFile {
    dp: Vec<u32>,
    layout: Vec<LayoutFile>,
    corpus: Vec<String>,
    seq_len: Vec<u32>,
    topology: Vec<String>,
    model: Vec<String>,
    attention: Option<mix::MixFile>,
}

/// One `[[sweep.layout]]`: a point's DP × CP and GA, at one model and L when it names them.
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct LayoutFile {
    dp: u32,
    cp: u32,
    ga: u32,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    seq_len: Option<u32>,
}

/// Which CP an arm runs on at a point.
#[derive(Clone, Copy, Debug, PartialEq)]
enum CpChoice {
    /// The point's.
    Point,
    /// `wlbllm:cp=N`.
    Fixed(u32),
    /// `wlbllm:best-cp`: every CP that keeps the point's GPUs and global batch; the fastest.
    Best,
}

/// One arm: a scheme and its tweaks.
#[derive(Clone, Debug)]
pub(crate) struct Arm {
    pub(crate) label: String,
    pub(crate) scheme: Scheme,
    pub(crate) set: SchemeSettings,
    signal: bool,
    /// `:table`: attention priced by the built-in measured H200 table of whole launches,
    /// not the thread-block models.
    table: bool,
    cp: CpChoice,
}

/// A tweak's count (`p=8`): a whole number ≥ 1, else an error naming the arm and tweak.
fn tweak_count(file: &str, arm: &str, name: &str, v: &str) -> Result<u32> {
    v.parse()
        .ok()
        .filter(|&n: &u32| n >= 1)
        .ok_or_else(|| invalid(format!("arms {arm:?} {name}"), v, "a count ≥ 1"))
        .context(file)
}

pub(crate) fn parse_arm(s: &str, base: &SchemeSettings, file: &str) -> Result<Arm> {
    let mut parts = s.split(':');
    let name = parts.next().unwrap_or_default();
    let scheme: Scheme = name
        .parse()
        .with_context(|| format!("{file}: arms: {s:?}"))?;
    let mut set = base.clone();
    let (mut signal, mut table) = (false, false);
    let mut cp = CpChoice::Point;
    for t in parts {
        match (scheme, t) {
            (_, "table") => table = true,
            (Scheme::DistCa, "no-ping-pong") => set.ping_pong = false,
            (Scheme::DistCa, "tight") => set.distca_scheduler = DistcaScheduler::Tight,
            (Scheme::DistCa | Scheme::Libra | Scheme::WlbLlm, "signal") => signal = true,
            (Scheme::DistCa, e) if e.starts_with("eps=") => {
                set.epsilon = e[4..]
                    .parse()
                    .map_err(|_| invalid(format!("arms {s:?} eps"), &e[4..], "a number"))
                    .context(file)?;
            }
            (Scheme::WlbLlm, m @ ("per-document" | "per-sequence" | "adaptive")) => {
                set.sharding = m.parse()?
            }
            (Scheme::WlbLlm, c) if c.starts_with("cp=") => {
                cp = CpChoice::Fixed(
                    c[3..]
                        .parse()
                        .ok()
                        .filter(|&n: &u32| n >= 1)
                        .ok_or_else(|| invalid(format!("arms {s:?} cp"), &c[3..], "a degree ≥ 1"))
                        .context(file)?,
                );
            }
            (Scheme::WlbLlm, "best-cp") => cp = CpChoice::Best,
            (Scheme::WlbLlm, x) if x.starts_with("s-max=") => {
                set.s_max = Some(tweak_count(file, s, "s-max", &x[6..])?);
            }
            (Scheme::Libra, x) if x.starts_with("p=") => {
                set.libra.pool_size = tweak_count(file, s, "p", &x[2..])?;
            }
            (Scheme::Libra, x) if x.starts_with("h=") => {
                set.libra.head_shards = tweak_count(file, s, "h", &x[2..])?;
            }
            (Scheme::Libra, x) if x.starts_with("b=") => {
                set.libra.tile_tokens = tweak_count(file, s, "b", &x[2..])?;
            }
            (Scheme::Libra, m) if m.starts_with("m=") => {
                set.libra.chunks = m[2..]
                    .parse()
                    .map_err(|_| invalid(format!("arms {s:?} m"), &m[2..], "a count"))
                    .context(file)?;
            }
            (Scheme::MegatronDcp, x) if x.starts_with("s=") => {
                set.max_seqlen_per_rank = Some(
                    x[2..]
                        .parse()
                        .map_err(|_| invalid(format!("arms {s:?} s"), &x[2..], "a count"))
                        .context(file)?,
                );
            }
            (Scheme::MegatronDcp, x) if x.starts_with("load=") => {
                set.dcp_load = x[5..].parse()?;
            }
            (Scheme::MegatronDcp, x) if x.starts_with("rounds=") => {
                set.dcp_rounds = x[7..].parse()?;
            }
            (Scheme::MegatronDcp, x) if x.starts_with("min-cp=") => {
                set.min_dynamic_cp = x[7..]
                    .parse()
                    .map_err(|_| invalid(format!("arms {s:?} min-cp"), &x[7..], "a count"))
                    .context(file)?;
            }
            _ => {
                return Err(invalid(
                    format!("arms {s:?} tweak"),
                    format!("{t:?}"),
                    format!(
                        "a tweak {name} takes (any scheme: table; distca: tight, no-ping-pong, \
                         signal, eps=X; wlbllm: adaptive, per-document, per-sequence, cp=N, \
                         best-cp, signal, s-max=TOKENS; libra: m=N, p=N, h=N, b=TOKENS, signal; \
                         megatron-dcp: s=TOKENS, min-cp=N, load=pairs|latency, \
                         rounds=open|capped)"
                    ),
                ))
                .context(file)
            }
        }
    }
    Ok(Arm {
        label: s.to_string(),
        scheme,
        set,
        signal,
        table,
        cp,
    })
}

/// One (point, arm) result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ArmResult {
    pub(crate) model: String,
    pub(crate) topology: String,
    pub(crate) corpus: String,
    pub(crate) seq_len: u32,
    pub(crate) dp: u32,
    pub(crate) gpus: u32,
    pub(crate) cp: u32,
    pub(crate) ga: u32,
    /// The CP the arm ran on (`wlbllm:best-cp`'s choice).
    pub(crate) ran_cp: u32,
    pub(crate) arm: String,
    #[serde(with = "exact_f64")]
    pub(crate) iteration_ms: f64,
    #[serde(with = "exact_f64")]
    pub(crate) tokens_per_s: f64,
    #[serde(with = "exact_f64")]
    pub(crate) mfu: f64,
    #[serde(with = "exact_f64")]
    pub(crate) attn_mean_ms: f64,
    #[serde(with = "exact_f64")]
    pub(crate) attn_max_ms: f64,
    #[serde(with = "exact_f64")]
    pub(crate) plan_gib: f64,
    #[serde(with = "exact_f64")]
    pub(crate) peak_mem_gib: f64,
    pub(crate) infeasible: u32,
    /// Mean over steps of the share of the step lost to the pipeline bubble.
    #[serde(with = "exact_f64")]
    pub(crate) bubble: f64,
    /// Mean over steps of the share of the step spent in exposed communication.
    #[serde(with = "exact_f64")]
    pub(crate) exposed_comm: f64,
    /// Mean over steps of the share of the step spent waiting for peers (stragglers).
    #[serde(with = "exact_f64")]
    pub(crate) wait: f64,
}

pub(crate) fn load_topology(name: &str, base: &Path, file: &str) -> Result<TopologySpec> {
    let p = base.join(name);
    let builtin = BUILTIN_TOPOLOGIES
        .iter()
        .find(|(n, _)| *n == name && !p.exists());
    let (src, text) = match builtin {
        Some((n, body)) => (format!("topologies/{n}.toml"), (*body).to_string()),
        None => {
            let src = p.display().to_string();
            let text = read_input_text(&p, MAX_SPEC_BYTES)
                .with_context(|| format!("{file}: reading topology {src}"))?;
            (src, text)
        }
    };
    TopologySpec::parse(&text, &src)
}

pub(crate) fn load_model(
    name: &str,
    base: &Path,
    file: &str,
    layers: Option<u32>,
) -> Result<ModelConfig> {
    let mut m = if name.ends_with(".toml") {
        let p = base.join(name);
        let t = read_input_text(&p, MAX_SPEC_BYTES)
            .with_context(|| format!("{file}: reading model {}", p.display()))?;
        ModelConfig::from_toml_str(&t, &p.display().to_string())?
    } else {
        ModelConfig::builtin(name).with_context(|| format!("{file}: model"))?
    };
    if let Some(l) = layers {
        if l == 0 || l > m.layers {
            return Err(invalid(
                "layers",
                l,
                format!("1..={} (the model's layers)", m.layers),
            ))
            .context(file);
        }
        m.layers = l;
    }
    Ok(m)
}

/// What a run writes.
pub struct CompareOutput {
    /// summary.md
    pub markdown: String,
    /// points.csv
    pub csv: String,
    /// plot.svg
    pub svg: String,
    /// The results table alone (Markdown), for the terminal.
    pub table: String,
}

impl CompareOutput {
    /// The run's files as an [`Outcome`] of kind `kind`.
    pub fn outcome(self, kind: String) -> Outcome {
        Outcome {
            kind,
            files: vec![
                ("summary.md".into(), self.markdown.clone()),
                ("points.csv".into(), self.csv),
                ("plot.svg".into(), self.svg),
            ],
            points_file: "points.csv",
            summary: self.markdown,
            json: None,
        }
    }
}
/// The schemes' settings from `[settings]` and `[parallel]` (defaults where a key is
/// absent).
fn settings(f: &CompareFile, file: &str) -> Result<SchemeSettings> {
    let s = &f.settings;
    let d = SchemeSettings::default();
    let dl = LibraParams::default();
    let mut set = SchemeSettings {
        cp: f.parallel.cp,
        s_max: s.s_max,
        sharding: match &s.sharding {
            Some(x) => x
                .parse::<ShardingMode>()
                .with_context(|| format!("{file}: [settings] sharding"))?,
            None => d.sharding,
        },
        outlier: None,
        epsilon: s.epsilon.unwrap_or(d.epsilon),
        ping_pong: s.ping_pong.unwrap_or(d.ping_pong),
        distca_scheduler: d.distca_scheduler,
        libra: LibraParams {
            pool_size: s.pool_size.unwrap_or(dl.pool_size),
            head_shards: s.head_shards.unwrap_or(dl.head_shards),
            tile_tokens: s.tile_tokens.unwrap_or(dl.tile_tokens),
            tau: s.tau.unwrap_or(dl.tau),
            chunks: s.chunks.unwrap_or(dl.chunks),
            ..dl
        },
        seed: f.workload.seed,
        max_seqlen_per_rank: s.max_seqlen_per_dp_cp_rank,
        min_dynamic_cp: s.min_dynamic_cp.unwrap_or(d.min_dynamic_cp),
        dcp_load: d.dcp_load,
        dcp_rounds: d.dcp_rounds,
    };
    if !(set.epsilon.is_finite() && set.epsilon >= 0.0) {
        return Err(invalid(
            "[settings] epsilon",
            set.epsilon,
            "a finite tolerance ≥ 0 (DistCA: 0.10)",
        ))
        .context(file);
    }
    set.libra.cp = f.parallel.cp;
    Ok(set)
}

/// Each point's layout: `[[sweep.layout]]`, else `[parallel]` at every `[sweep] dp`; each
/// checked, with every arm's, and a layout's model named by the file.
fn layouts(f: &CompareFile, file: &str, arms: &[Arm]) -> Result<Vec<LayoutFile>> {
    let dps: Vec<u32> = if f.sweep.dp.is_empty() {
        vec![f.parallel.dp.unwrap_or(1)]
    } else {
        f.sweep.dp.clone()
    };
    let layouts: Vec<LayoutFile> = if f.sweep.layout.is_empty() {
        dps.iter()
            .map(|&dp| LayoutFile {
                dp,
                cp: f.parallel.cp,
                ga: f.parallel.ga,
                model: None,
                seq_len: None,
            })
            .collect()
    } else if !f.sweep.dp.is_empty() || f.parallel.dp.is_some() {
        let (field, value) = match f.parallel.dp {
            Some(dp) => ("[parallel] dp", dp.to_string()),
            None => ("[sweep] dp", format!("{:?}", f.sweep.dp)),
        };
        return Err(invalid(
            field,
            value,
            "none: [[sweep.layout]] gives each point its DP",
        ))
        .context(file);
    } else {
        f.sweep.layout.clone()
    };
    for (i, y) in layouts.iter().enumerate() {
        let p = &f.parallel;
        let table = if f.sweep.layout.is_empty() {
            "[parallel]/[sweep]".to_string()
        } else {
            format!("[[sweep.layout]] #{}", i + 1)
        };
        super::inputs::check_layout(file, &table, [y.dp, p.pp, y.cp, p.tp], y.ga)?;
        for a in arms {
            for c in arm_cps(a, y.dp, y.cp, y.ga) {
                arm_layout(&a.label, c, y.dp, y.cp, y.ga)
                    .with_context(|| format!("{file}: arms at {table}"))?;
            }
        }
        let named =
            |v: &[String], one: &String, x: &String| v.contains(x) || (v.is_empty() && one == x);
        if let Some(m) = &y.model {
            if !named(&f.sweep.model, &f.model, m) {
                return Err(invalid(
                    format!("{table} model"),
                    format!("{m:?}"),
                    "one of the file's models",
                ))
                .context(file);
            }
        }
    }
    Ok(layouts)
}

/// The sweep's points: model (each attention mix) × topology × corpus × seq_len × the
/// layouts for that model and length; a layout that matches no point is refused.
fn points(
    f: &CompareFile,
    file: &str,
    base: &Path,
    cal: Option<&Path>,
    kernel: Kernel,
    layouts: &[LayoutFile],
) -> Result<Vec<Point>> {
    let pick = |v: &[String], one: Option<String>| -> Vec<Option<String>> {
        if v.is_empty() {
            vec![one]
        } else {
            v.iter().cloned().map(Some).collect()
        }
    };
    let models = pick(&f.sweep.model, Some(f.model.clone()));
    let corpora = pick(&f.sweep.corpus, Some(f.workload.corpus.clone()));
    let topos = pick(&f.sweep.topology, f.network.topology.clone());
    // points: (model, topology, corpus, seq_len, dp) × arms
    let mut points = Vec::new();
    let mut variants = Vec::new();
    for m in models.iter().flatten() {
        let model = load_model(m, base, file, f.layers)?;
        match &f.sweep.attention {
            None => variants.push((m, None, model)),
            Some(a) => {
                for x in mix::mixes(a, model.layers).with_context(|| file.to_string())? {
                    let mm = mix::apply(model.clone(), m, &x).with_context(|| file.to_string())?;
                    variants.push((m, Some(x), mm));
                }
            }
        }
    }
    for (m, mix, model) in variants {
        let measured = super::calfile::cost_model(model, cal, kernel)
            .with_context(|| format!("{file}: calibration"))?;
        let label = mix.map_or(m.clone(), |x| x.label(m));
        for t in &topos {
            let topo = match t {
                Some(t) => {
                    let label = Path::new(t)
                        .file_stem()
                        .map_or(t.clone(), |x| x.to_string_lossy().into_owned());
                    Some((label, load_topology(t, base, file)?))
                }
                None => None,
            };
            // The point's GPU: `[cluster] gpu`, else the topology's, else the H200.
            let gpu = super::calfile::run_gpu(
                f.cluster.gpu.as_deref(),
                "[cluster] gpu",
                topo.as_ref().map(|t| &t.1),
                base,
            )
            .context(file)?;
            let cost = super::calfile::on_gpu(&measured, cal.is_some(), &gpu, f.parallel.precision)
                .context(file)?;
            let gpu_note = super::calfile::gpu_note(&gpu, &cost);
            let cost = Arc::new(cost);
            for c in corpora.iter().flatten() {
                let corpus =
                    super::inputs::load_corpus(c).with_context(|| format!("{file}: corpus"))?;
                let lens: Vec<u32> = if !f.sweep.seq_len.is_empty() {
                    f.sweep.seq_len.clone()
                } else if let Some(l) = f.workload.seq_len {
                    vec![l]
                } else {
                    vec![corpus
                        .default_seq_len()
                        .ok_or_else(|| {
                            invalid(
                                "[workload] seq_len",
                                "none",
                                format!("a length: corpus {c} has no default"),
                            )
                        })
                        .context(file)?]
                };
                for &l in &lens {
                    let at = layouts.iter().filter(|y| {
                        y.model.as_ref().is_none_or(|x| x == m) && y.seq_len.is_none_or(|x| x == l)
                    });
                    let before = points.len();
                    for y in at {
                        super::sweep::check_points(points.len() + 1, file)?;
                        points.push(Point {
                            model: label.clone(),
                            base_model: m.clone(),
                            mix,
                            cost: cost.clone(),
                            gpu_note: gpu_note.clone(),
                            topo: topo.clone(),
                            corpus: c.clone(),
                            seq_len: l,
                            dp: y.dp,
                            cp: y.cp,
                            ga: y.ga,
                        });
                    }
                    if points.len() == before {
                        return Err(invalid(
                            "[[sweep.layout]]",
                            format!("none for model {m} at L = {l}"),
                            "a layout for every model and seq_len of the file",
                        ))
                        .context(file);
                    }
                }
            }
        }
    }
    if let Some((i, _)) = f.sweep.layout.iter().enumerate().find(|(_, y)| {
        !points.iter().any(|p| {
            (p.dp, p.cp, p.ga) == (y.dp, y.cp, y.ga)
                && y.model.as_ref().is_none_or(|m| *m == p.base_model)
                && y.seq_len.is_none_or(|l| l == p.seq_len)
        })
    }) {
        return Err(invalid(
            format!("[[sweep.layout]] #{}", i + 1),
            "a layout that matches no point",
            "a model and seq_len among the file's models and L",
        ))
        .context(file);
    }
    Ok(points)
}

fn parse(text: &str, file: &str) -> Result<CompareFile> {
    toml::from_str(text).with_context(|| format!("{file}: not a valid comparison experiment"))
}

/// Check `text` against the comparison kinds' schema (as [`super::run_text`] does) without running it.
pub fn check(text: &str, file: &str) -> Result<()> {
    parse(text, file).map(|_| ())
}

/// Run the experiment text; `file` names it in messages, `title` heads the summary,
/// relative paths resolve against `base`; `calibration` replaces the file's `calibration`.
pub fn run_text(
    text: &str,
    file: &str,
    title: &str,
    base: &Path,
    calibration: Prices,
    observer: &dyn Observer,
) -> Result<CompareOutput> {
    let sweep = Sweep::new(text, file, title, base, calibration)?;
    let results = super::sweep::run_points(sweep.len(), observer, |i| sweep.run_point(i))?;
    sweep.finish(&results)
}

/// One simulated point of a comparison: a model, topology, corpus, L and layout, which
/// every arm runs.
struct Point {
    /// The model as the results name it (with its `[sweep.attention]` mix).
    model: String,
    /// The model as the file names it.
    base_model: String,
    /// Its `[sweep.attention]` mix.
    mix: Option<mix::Mix>,
    cost: Arc<CostModel>,
    /// The summary's line on the point's GPU (empty on the H200's measured models).
    gpu_note: String,
    topo: Option<(String, TopologySpec)>,
    corpus: String,
    seq_len: u32,
    dp: u32,
    cp: u32,
    ga: u32,
}

/// A comparison experiment split into its sweep points: point `i` is one (point, arm) of
/// the grid, run by [`Sweep::run_point`] alone — in any order, thread, process or machine
/// — and [`Sweep::finish`] writes from all of them the files [`run_text`] writes.
pub struct Sweep {
    f: CompareFile,
    file: String,
    title: String,
    /// The calibration file that prices the run, if any.
    cal: Option<PathBuf>,
    /// `--kernel`'s profile, when it replaced the file's calibration.
    kernel_flag: Option<Kernel>,
    arms: Vec<Arm>,
    points: Vec<Point>,
    net_model: String,
}

/// One sweep point's result; lossless through serde (every float kept as its shortest
/// round-tripping decimal), so that results gathered from files give [`run_text`]'s output
/// byte for byte.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PointResult(ArmResult);

/// Serde for an `f64` as the shortest decimal text that parses back to the same bits
/// (JSON numbers are read back within an ulp, not exactly).
mod exact_f64 {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        let t = String::deserialize(d)?;
        t.parse()
            .map_err(|_| D::Error::custom(format!("{t:?} is not a number")))
    }
}

impl Sweep {
    /// Parse and check the experiment and lay out its points (arguments as [`run_text`]'s);
    /// nothing is simulated.
    pub fn new(
        text: &str,
        file: &str,
        title: &str,
        base: &Path,
        calibration: Prices,
    ) -> Result<Sweep> {
        let f = parse(text, file)?;
        let cal = match calibration {
            (Some(flag), _) => Some(flag.to_path_buf()),
            (None, None) => f.calibration.as_ref().map(|c| base.join(c)),
            (None, Some(_)) => None,
        };
        let kernel = calibration.1.unwrap_or(Kernel::DEFAULT);
        if !KINDS.contains(&f.kind.as_str()) {
            return Err(invalid(
                "kind",
                format!("{:?}", f.kind),
                format!("one of {}", KINDS.join(", ")),
            ))
            .context(file);
        }
        if f.steps == 0 || f.steps > 1000 {
            return Err(invalid("steps", f.steps, "1..=1000")).context(file);
        }
        if f.arms.is_empty() {
            return Err(invalid(
                "arms",
                "[]",
                "at least one scheme (ulysses, wlbllm, distca, libra, megatron-dcp)",
            ))
            .context(file);
        }
        let set = settings(&f, file)?;
        let arms: Vec<Arm> = f
            .arms
            .iter()
            .map(|a| parse_arm(a, &set, file))
            .collect::<Result<_>>()?;
        let layouts = layouts(&f, file, &arms)?;
        // A [network] topology that [sweep] overrides must still exist.
        if let (Some(t), false) = (&f.network.topology, f.sweep.topology.is_empty()) {
            load_topology(t, base, file).context("[network] topology")?;
        }
        let net_model = f
            .network
            .model
            .clone()
            .unwrap_or_else(|| "analytical".into());
        if !matches!(net_model.as_str(), "analytical" | "flow") {
            return Err(invalid(
                "[network] model",
                format!("{net_model:?}"),
                "one of analytical, flow",
            ))
            .context(file);
        }
        let points = points(&f, file, base, cal.as_deref(), kernel, &layouts)?;
        let sweep = Sweep {
            f,
            file: file.to_string(),
            title: title.to_string(),
            cal,
            kernel_flag: calibration.1,
            arms,
            points,
            net_model,
        };
        sweep.check_arms()?;
        Ok(sweep)
    }

    /// How many sweep points: the grid's points × arms.
    pub fn len(&self) -> usize {
        self.points.len() * self.arms.len()
    }

    /// The experiment's kind.
    pub fn kind(&self) -> &str {
        &self.f.kind
    }

    /// Whether the sweep has no points.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Point `i` in words (`model M corpus C L N DP d CP c arm A`), for messages.
    pub fn describe(&self, i: usize) -> String {
        let (p, arm) = self.job(i);
        format!(
            "model {} corpus {} L {} DP {} CP {} arm {}",
            p.model, p.corpus, p.seq_len, p.dp, p.cp, arm.label
        )
    }

    fn job(&self, i: usize) -> (&Point, &Arm) {
        let a = self.arms.len();
        (&self.points[i / a], &self.arms[i % a])
    }

    /// Point `p`'s parallel layout, before an arm picks its CP.
    fn parallelism(&self, p: &Point) -> Parallelism {
        let f = &self.f;
        Parallelism {
            dp: p.dp,
            pp: f.parallel.pp,
            cp: p.cp,
            ga: p.ga,
            pipeline: f.parallel.pipeline.unwrap_or(PipelineKind::OneFOneB),
            recompute: f.parallel.recompute.into(),
            zero_stage: f.parallel.zero_stage,
            dp_buckets: f.parallel.dp_buckets,
            tp: f.parallel.tp,
            sp: f.parallel.sp,
            tp_overlap: f.parallel.tp_overlap,
            ep: f.parallel.ep,
            moe_hot_share: f.parallel.moe_hot_share,
            precision: f.parallel.precision,
            ..Parallelism::default()
        }
    }

    /// Every point's arms planned on their layouts before any runs: a setting that one
    /// point refuses (Libra's P = 0, an H that does not divide a model's heads) fails the
    /// experiment at once, naming the point, not after the points before it have run.
    fn check_arms(&self) -> Result<()> {
        for i in 0..self.len() {
            let (p, arm) = self.job(i);
            let par = self.parallelism(p);
            let at_point = || format!("{}: point {}", self.file, self.describe(i));
            let shard = p.cost.tp_shard(par.tp, par.ep).with_context(at_point)?;
            for c in arm_cps(arm, p.dp, p.cp, p.ga) {
                let (dp, cp, ga) = arm_layout(&arm.label, c, p.dp, p.cp, p.ga)?;
                let at = Parallelism { dp, cp, ga, ..par };
                arm_planner(arm, &shard, at, p.seq_len)
                    .with_context(|| format!("{} (CP {cp})", at_point()))?;
            }
        }
        Ok(())
    }

    /// Simulate sweep point `i` (in `0..len()`).
    pub fn run_point(&self, i: usize) -> Result<PointResult> {
        if i >= self.len() {
            return Err(crate::error::Error::Invalid {
                field: "sweep point".into(),
                value: i.to_string(),
                allowed: format!(
                    "0..={} ({} points)",
                    self.len().saturating_sub(1),
                    self.len()
                ),
            });
        }
        let (p, arm) = self.job(i);
        let (f, net_model) = (&self.f, &self.net_model);
        let par = self.parallelism(p);
        let ctx = format!("{}: point {}", self.file, self.describe(i));
        let opts = RunOpts {
            steps: f.steps,
            seed: f.workload.seed,
            nvls: f.network.nvls,
        };
        // the fastest of the arm's CPs (one, unless best-cp); ties keep the first
        let mut best: Option<ArmResult> = None;
        for c in arm_cps(arm, p.dp, p.cp, p.ga) {
            let (dp, cp, ga) = arm_layout(&arm.label, c, p.dp, p.cp, p.ga)?;
            let r = run_arm(
                &opts,
                p.cost.as_ref(),
                &p.topo,
                net_model,
                &p.corpus,
                p.seq_len,
                Parallelism { dp, cp, ga, ..par },
                arm,
            )
            .with_context(|| format!("{ctx} (CP {cp})"))?;
            if best
                .as_ref()
                .is_none_or(|b| r.tokens_per_s > b.tokens_per_s)
            {
                best = Some(r);
            }
        }
        best.map(|mut r| {
            r.model = p.model.clone();
            // the point's layout, whatever CP the arm ran on
            (r.ran_cp, r.dp, r.cp, r.ga) = (r.cp, p.dp, p.cp, p.ga);
            r
        })
        .ok_or_else(|| {
            invalid(
                format!("arms {:?} cp", arm.label),
                "none",
                "a CP the point's layout allows",
            )
        })
        .context(ctx)
        .map(PointResult)
    }

    /// The files of the run from every point's result (`results[i]` point `i`'s), checked
    /// to be this sweep's points in order.
    pub fn finish(&self, results: &[PointResult]) -> Result<CompareOutput> {
        if results.len() != self.len() {
            return Err(invalid(
                "point results",
                results.len(),
                format!("{} (the sweep's points)", self.len()),
            ))
            .context(&self.file);
        }
        for (i, PointResult(r)) in results.iter().enumerate() {
            let (p, arm) = self.job(i);
            let topo = p.topo.as_ref().map(|t| t.0.as_str()).unwrap_or_default();
            if (
                &r.model,
                r.topology.as_str(),
                &r.corpus,
                r.seq_len,
                r.dp,
                r.cp,
                r.ga,
                &r.arm,
            ) != (
                &p.model, topo, &p.corpus, p.seq_len, p.dp, p.cp, p.ga, &arm.label,
            ) {
                return Err(invalid(
                    format!("point {i}'s result"),
                    format!(
                        "model {} topology {} corpus {} L {} DP {} CP {} GA {} arm {}",
                        r.model, r.topology, r.corpus, r.seq_len, r.dp, r.cp, r.ga, r.arm
                    ),
                    format!("the sweep's point {i} ({} GA {})", self.describe(i), p.ga),
                ))
                .context(&self.file);
            }
        }
        let results: Vec<ArmResult> = results.iter().map(|r| r.0.clone()).collect();
        let (f, title, arms, points, cal) = (
            &self.f,
            self.title.as_str(),
            &self.arms,
            &self.points,
            &self.cal,
        );
        let mut extra = String::new();
        if f.kind == "attention-microbench" {
            extra += &last_arm_cuts(arms, &results);
        }
        if f.kind == "distca-ablation" {
            extra += "\n## DistCA's tolerance: what ε trims (scheduler only, step 0 of each point)\n\n\
                  Bytes moved and the largest per-server attention buffer (2 × received Q/K/V + outputs \
                  computed for others, `balance::pricing::distca_tolerance`), relative to ε = 0.\n\n\
                  | model | L | servers | ε | moved GiB/layer | vs ε=0 | max buffer (MiB) | vs ε=0 | max deviation | moves |\n\
                  |---|---|---|---|---|---|---|---|---|---|\n";
            for p in points.iter() {
                let shard = p.cost.tp_shard(f.parallel.tp, f.parallel.ep)?;
                let lay = [p.dp, p.cp, p.ga];
                extra += &tolerance_rows(f, &shard, &p.model, &p.corpus, p.seq_len, lay)?;
            }
        }
        if arms.iter().any(|a| a.scheme == Scheme::WlbLlm) {
            extra += &s_max_rows(
                f,
                &points
                    .iter()
                    .map(|p| (p.model.clone(), p.cost.clone(), p.seq_len, p.dp, p.cp))
                    .collect::<Vec<_>>(),
            )?;
        }
        let mut out = render(f, title, arms, &results);
        if f.sweep.attention.is_some() {
            let (tables, svg) = mix::report(self, &results)?;
            extra += &tables;
            out.svg = svg;
        }
        if let Some(c) = &cal {
            out.markdown += &format!(
            "\nPriced by the calibration `{}` (`skewsim calibrate`), not the built-in kernel profile.\n",
            c.display()
        );
        } else if let Some(k) = self.kernel_flag {
            out.markdown += &format!(
                "\nPriced by the built-in `{}` kernel profile (`--kernel`).\n",
                k.name()
            );
        }
        let mut notes: Vec<&str> = Vec::new();
        for p in points.iter().filter(|p| !p.gpu_note.is_empty()) {
            if !notes.contains(&p.gpu_note.as_str()) {
                notes.push(&p.gpu_note);
            }
        }
        for n in notes {
            out.markdown += &format!("\n{}", n.trim_end());
            out.markdown += "\n";
        }
        out.markdown += &extra;
        if !f.notes.is_empty() {
            out.markdown += &format!("\n{}\n", f.notes.trim());
        }
        Ok(out)
    }
}

/// The CPs arm `a` runs at a point of DP `dp` × CP `cp` and GA `ga`: the point's, the
/// arm's own, or (best-cp) every CP whose DP divides the point's DP × GA sequences.
fn arm_cps(a: &Arm, dp: u32, cp: u32, ga: u32) -> Vec<u32> {
    match a.cp {
        CpChoice::Point => vec![cp],
        CpChoice::Fixed(c) => vec![c],
        CpChoice::Best => (1..=dp * cp)
            .filter(|&c| (dp * cp) % c == 0 && (dp * ga) % ((dp * cp) / c) == 0)
            .collect(),
    }
}

/// The (DP, CP, GA) arm `label` runs on CP `c` at a point of DP `dp` × CP `cp` and GA `ga`:
/// the same DP × CP ranks and the same DP × GA sequences.
fn arm_layout(label: &str, c: u32, dp: u32, cp: u32, ga: u32) -> Result<(u32, u32, u32)> {
    let ranks = dp * cp;
    if ranks % c != 0 {
        return Err(invalid(
            format!("arms {label:?} cp"),
            c,
            format!("a divisor of the point's DP × CP = {dp} × {cp} = {ranks} ranks"),
        ));
    }
    let (dp2, batch) = (ranks / c, dp * ga);
    if batch % dp2 != 0 {
        return Err(invalid(
            format!("arms {label:?} cp"),
            c,
            format!(
                "a CP whose DP ({dp2} here) divides the global batch of DP × GA = {dp} × {ga} = \
                 {batch} sequences"
            ),
        ));
    }
    Ok((dp2, c, batch / dp2))
}

/// What every arm of a run shares beyond its point: steps per point, the workload's seed
/// and whether collectives may use NVLS.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunOpts {
    pub(crate) steps: u64,
    pub(crate) seed: u64,
    pub(crate) nvls: bool,
}

/// The settings `arm` runs with on `par` and its planner over the TP shard `shard`, for
/// global batches of DP × GA sequences of `seq_len` tokens: errors name the setting the
/// layout refuses.
fn arm_planner<'a>(
    arm: &Arm,
    shard: &'a CostModel,
    par: Parallelism,
    seq_len: u32,
) -> Result<(SchemeSettings, SchemePlanner<'a>)> {
    let mut set = arm.set.clone();
    (set.cp, set.libra.cp) = (par.cp, par.cp);
    let gbs = (par.dp * par.ga) as usize;
    let planner = SchemePlanner::new(arm.scheme, set.clone(), shard, par.dp, gbs, seq_len)?;
    Ok((set, planner))
}

/// Simulate `arm` at one point: `steps` global batches of `corpus` packed to `seq_len` on
/// `par`, on the topology `topo` (label, spec) under the network model `net_model`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_arm(
    f: &RunOpts,
    cost: &CostModel,
    topo: &Option<(String, TopologySpec)>,
    net_model: &str,
    corpus: &str,
    seq_len: u32,
    par: Parallelism,
    arm: &Arm,
) -> Result<ArmResult> {
    let by_table;
    let cost = if arm.table {
        by_table = cost.by_measured_table()?;
        &by_table
    } else {
        cost
    };
    let gpus = par.dp * par.pp * par.cp * par.tp;
    // the topology's node size (each swept topology brings its own)
    let Some(gpn) = topo.as_ref().map(|t| t.1.gpus_per_node) else {
        return Err(invalid(
            "[network] topology",
            "none",
            "a topology (e.g. \"dgx-h200-roce\")",
        ));
    };
    // whole NVLink super-nodes (NVL72: 18 nodes of 4), spare GPUs idle
    let per_domain = topo
        .as_ref()
        .and_then(|t| t.1.super_node.as_ref())
        .map_or(1, |s| s.nodes.max(1));
    let nodes = gpus.div_ceil(gpn).div_ceil(per_domain) * per_domain;
    let mut place = Placement::new(gpn, nodes);
    let net = match topo {
        Some((_, spec)) => {
            let t = Arc::new(spec.build(Some(nodes))?);
            place = place.with_collectives(CollectiveModel::of(&t, f.nvls));
            if net_model == "flow" {
                NetChoice::Flow(t)
            } else {
                NetChoice::Analytical(t)
            }
        }
        None => {
            return Err(invalid(
                "[network] topology",
                "none",
                "a topology (e.g. \"dgx-h200-roce\")",
            ))
        }
    };
    let wl = Workload::Corpus {
        corpus: super::inputs::load_corpus(corpus)?,
        seq_len,
        packing: Packing::Sequential,
        seed: f.seed,
    };
    wl.validate("[workload]")?;
    // Every scheme plans one TP rank's head shard.
    let shard = cost.tp_shard(par.tp, par.ep)?;
    let (set, mut planner) = arm_planner(arm, &shard, par, seq_len)?;
    let mut batches = wl.batches((par.dp * par.ga) as usize)?;
    let (mut it, mut tps, mut mfu, mut attn, mut bytes, mut mem) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), 0u64, 0u64);
    let mut infeasible = 0;
    let (mut bubble, mut exposed, mut wait) = (Vec::new(), Vec::new(), Vec::new());
    for step in 0..f.steps {
        let global = batches.next().ok_or_else(|| {
            invalid(
                "steps",
                f.steps,
                format!("at most {step}: the corpus ran out of documents at step {step}"),
            )
        })?;
        let mut network = net.make(gpn);
        let r = simulate_scheme_step_with(
            cost,
            &mut planner,
            &set,
            par,
            place,
            step,
            &global,
            network.as_mut(),
            &NoVariance,
            arm.signal,
        )?;
        it.push(r.report.iteration as f64 * 1e-9);
        tps.push(r.report.tokens_per_s);
        mfu.push(r.report.mfu);
        attn.push(r.attn_span as f64 * 1e-9);
        bubble.push(r.report.bubble_fraction);
        exposed.push(r.report.exposed_comm_fraction);
        wait.push(r.report.wait_fraction);
        bytes += r.plan_bytes;
        mem = mem.max(
            r.report
                .gpus
                .iter()
                .map(|g| g.memory.total())
                .max()
                .unwrap_or(0),
        );
        infeasible = infeasible.max(r.report.infeasible_ranks);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    Ok(ArmResult {
        model: String::new(),
        topology: topo.as_ref().map(|t| t.0.clone()).unwrap_or_default(),
        corpus: corpus.to_string(),
        seq_len,
        dp: par.dp,
        gpus,
        cp: par.cp,
        ga: par.ga,
        ran_cp: par.cp,
        arm: arm.label.clone(),
        iteration_ms: mean(&it),
        tokens_per_s: mean(&tps),
        mfu: mean(&mfu),
        attn_mean_ms: mean(&attn),
        attn_max_ms: attn.iter().copied().fold(0.0, f64::max),
        plan_gib: gib(bytes) / f.steps as f64,
        peak_mem_gib: gib(mem),
        infeasible,
        bubble: mean(&bubble),
        exposed_comm: mean(&exposed),
        wait: mean(&wait),
    })
}

/// The last arm's (Libra's) cut of mean and max attention-layer latency vs every other
/// arm, per point.
fn last_arm_cuts(arms: &[Arm], rs: &[ArmResult]) -> String {
    let Some(last) = arms.last() else {
        return String::new();
    };
    let mut t = format!(
        "\n## {l}'s cut of the straggler's attention-layer latency\n\n\
         | corpus | L | vs | mean cut | max cut | mean speedup | max speedup |\n|---|---|---|---|---|---|---|\n",
        l = last.label
    );
    for r in rs.iter().filter(|r| r.arm == last.label) {
        for o in rs.iter().filter(|o| {
            o.arm != last.label
                && (&o.model, &o.topology, &o.corpus, o.seq_len, o.dp, o.cp)
                    == (&r.model, &r.topology, &r.corpus, r.seq_len, r.dp, r.cp)
        }) {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {:.1}% | {:.1}% | {:.2}x | {:.2}x |",
                r.corpus,
                r.seq_len,
                o.arm,
                100.0 * (1.0 - r.attn_mean_ms / o.attn_mean_ms.max(1e-12)),
                100.0 * (1.0 - r.attn_max_ms / o.attn_max_ms.max(1e-12)),
                o.attn_mean_ms / r.attn_mean_ms.max(1e-12),
                o.attn_max_ms / r.attn_max_ms.max(1e-12),
            );
        }
    }
    t
}

/// WLB-LLM's S_max priced by `cost::memory` (stage 0, the smallest DP of each model and
/// L): peak memory per rank at S_max = L and 2·L (the default), and the largest S_max that
/// fits the GPU.
fn s_max_rows(
    f: &CompareFile,
    points: &[(String, Arc<CostModel>, u32, u32, u32)],
) -> Result<String> {
    use crate::balance::pricing::{wlb_max_s_max, wlb_s_max_memory};
    use crate::cost::memory::{stage_rank_params, MemoryInputs, GRAD_BYTES_PER_PARAM};
    use crate::schedule::step::{in_flight, stage_layers};
    let mut seen: Vec<(String, u32, u32)> = Vec::new();
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut t = String::from(
        "\n## WLB-LLM's memory cap S_max, priced by `cost::memory`\n\n\
         Peak memory of a first-stage rank budgeting S_max tokens per micro-batch \
         (`balance::pricing::wlb_s_max_memory`; one TP rank's under TP); the default is \
         S_max = 2·L.\n\n\
         | model | L | CP | DP | S_max = L (GiB) | S_max = 2·L (GiB) | largest S_max that fits |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let par = &f.parallel;
    for (model, cost, l, dp, cp) in points {
        if seen.contains(&(model.clone(), *l, *cp)) {
            continue;
        }
        seen.push((model.clone(), *l, *cp));
        // One TP rank's memory.
        let shard = cost.tp_shard(par.tp, par.ep)?;
        let cost = &shard;
        let m = &cost.model;
        let pp = par.pp.max(1);
        let (lf, ll) = stage_layers(m.layers, pp)[0];
        let grad = stage_rank_params(m, ll - lf, true, pp == 1, par.ep) * GRAD_BYTES_PER_PARAM;
        let kind = par.pipeline.unwrap_or(PipelineKind::OneFOneB);
        let base = MemoryInputs {
            layers: ll - lf,
            first_stage: true,
            last_stage: pp == 1,
            zero_stage: par.zero_stage,
            shard_degree: dp * cp,
            tokens_per_rank: 0,
            attn_tokens: 0,
            attn_heads_q: 0,
            attn_heads_kv: 0,
            held_layers: u64::from(in_flight(kind, pp, 0, par.ga)) * u64::from(ll - lf),
            recompute: par.recompute.into(),
            grad_fp32: true,
            bucket_bytes: grad.div_ceil(u64::from(par.dp_buckets.max(1))),
            seq_shard: if par.sp { par.tp } else { 1 },
            expert_shard: par.ep,
            fp8: cost.precision == Precision::Fp8,
        };
        let at = |s: u32| wlb_s_max_memory(cost, &base, s, *cp).map(|b| gib(b.total()));
        let best = wlb_max_s_max(cost, &base, *cp, crate::balance::wlbllm::KERNEL_TILE)?;
        let _ = writeln!(
            t,
            "| {model} | {l} | {cp} | {dp} | {:.1} | {:.1} | {} |",
            at(*l)?,
            at(l.saturating_mul(2))?,
            best.map_or("none".to_string(), |b| format!(
                "{b} ({:.2}·L)",
                f64::from(b) / f64::from(*l)
            ))
        );
    }
    Ok(t)
}

/// DistCA's ε trade-off rows for one point: the scheduler alone on step 0's global batch
/// cut into GA indices of DP replicas × CP ranks (DP·CP servers; under TP one lane's, with
/// `cost` the TP rank's: bytes are multiplied by TP, buffers are per GPU).
fn tolerance_rows(
    f: &CompareFile,
    cost: &CostModel,
    model: &str,
    corpus: &str,
    seq_len: u32,
    [dp, cp, ga]: [u32; 3],
) -> Result<String> {
    use crate::balance::distca::DistcaConfig;
    use crate::balance::pricing::distca_tolerance;
    let servers = (dp * cp) as usize;
    let wl = Workload::Corpus {
        corpus: super::inputs::load_corpus(corpus)?,
        seq_len,
        packing: Packing::Sequential,
        seed: f.workload.seed,
    };
    let global = wl.step_sequences(0, (dp * ga) as usize)?;
    let batches: Vec<Vec<_>> = global.chunks(dp as usize).map(<[_]>::to_vec).collect();
    let cfg = DistcaConfig::new(cost.attn(), 0.0, crate::balance::wlbllm::KERNEL_TILE)?;
    let rows = distca_tolerance(&batches, cp, &cfg, &[0.0, 0.05, 0.10, 0.15, 0.20])?;
    let (b0, m0) = (
        rows[0].bytes.max(1) as f64,
        rows[0].max_buffer_bytes.max(1) as f64,
    );
    let mut t = String::new();
    let lanes = f64::from(f.parallel.tp);
    for r in &rows {
        let _ = writeln!(
            t,
            "| {model} | {seq_len} | {servers} | {:.2} | {:.3} | {:+.1}% | {:.1} | {:+.1}% | {:.3} | {} |",
            r.epsilon,
            lanes * r.bytes as f64 / (1u64 << 30) as f64,
            100.0 * (r.bytes as f64 / b0 - 1.0),
            r.max_buffer_bytes as f64 / (1u64 << 20) as f64,
            100.0 * (r.max_buffer_bytes as f64 / m0 - 1.0),
            r.max_deviation,
            r.moves
        );
    }
    Ok(t)
}

fn render(f: &CompareFile, title: &str, arms: &[Arm], rs: &[ArmResult]) -> CompareOutput {
    let key = |r: &ArmResult| {
        (
            r.model.clone(),
            r.topology.clone(),
            r.corpus.clone(),
            r.seq_len,
            r.dp,
            r.cp,
        )
    };
    let baseline = |r: &ArmResult| {
        rs.iter()
            .find(|b| key(b) == key(r) && b.arm == arms[0].label)
            .cloned()
    };
    // per-point layouts: CP and GA columns, and the CP an arm chose
    let laid = !f.sweep.layout.is_empty();
    let mut csv = format!(
        "model,topology,corpus,seq_len,dp,{}gpus,arm,iteration_ms,tokens_per_s,mfu,attn_mean_ms,attn_max_ms,speedup_vs_baseline,attn_reduction_vs_baseline,plan_gib_per_layer,peak_mem_gib,infeasible_ranks\n",
        if laid { "cp,ga,ran_cp," } else { "" }
    );
    let mut t = format!(
        "| model | topology | corpus | L | {} | GPUs | arm | iteration (ms) | tokens/s | MFU | attn layer mean (ms) | attn layer max (ms) | speedup vs {b} | attn cut vs {b} | moved GiB/layer | peak mem (GiB) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        if laid { "DP × CP × GA" } else { "DP" },
        b = arms[0].label
    );
    for r in rs {
        let b = baseline(r);
        let (lay_csv, lay_md) = if laid {
            (
                format!("{},{},{},", r.cp, r.ga, r.ran_cp),
                format!("{} × {} × {}", r.dp, r.cp, r.ga),
            )
        } else {
            (String::new(), r.dp.to_string())
        };
        let arm_md = if r.ran_cp == r.cp {
            r.arm.clone()
        } else {
            format!("{} (CP {})", r.arm, r.ran_cp)
        };
        let speed = b.as_ref().map_or(1.0, |b| r.tokens_per_s / b.tokens_per_s);
        let cut = b
            .as_ref()
            .map_or(0.0, |b| 1.0 - r.attn_mean_ms / b.attn_mean_ms.max(1e-12));
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{}{},{},{:.3},{:.1},{:.4},{:.3},{:.3},{:.4},{:.4},{:.4},{:.2},{}",
            r.model,
            r.topology,
            r.corpus,
            r.seq_len,
            r.dp,
            lay_csv,
            r.gpus,
            r.arm,
            r.iteration_ms,
            r.tokens_per_s,
            r.mfu,
            r.attn_mean_ms,
            r.attn_max_ms,
            speed,
            cut,
            r.plan_gib,
            r.peak_mem_gib,
            r.infeasible
        );
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.0} | {:.3} | {:.2} | {:.2} | {:.2}x | {:.1}% | {} | {:.1}{} |",
            r.model,
            r.topology,
            r.corpus,
            r.seq_len,
            lay_md,
            r.gpus,
            arm_md,
            r.iteration_ms,
            r.tokens_per_s,
            r.mfu,
            r.attn_mean_ms,
            r.attn_max_ms,
            speed,
            100.0 * cut,
            if r.arm.starts_with("ulysses") {
                "n/a".to_string()
            } else {
                format!("{:.3}", r.plan_gib)
            },
            r.peak_mem_gib,
            if r.infeasible > 0 { " (over)" } else { "" }
        );
    }
    let svg = plot(f, title, arms, rs);
    let mut md = format!("# {title}\n\n");
    if !f.description.is_empty() {
        md += &format!("{}\n\n", f.description.trim());
    }
    md += &format!(
        "Kind `{}`; {} step(s) per point (a GBS window); layers simulated: {}; {}PP {}; \
         analytical network unless stated; no runtime variance. The attention layer is layer 0's \
         forward core attention (dispatch, kernels, return), its span over all GPUs summed over \
         the micro-batches: the straggler's latency for the step.\n\n",
        f.kind,
        f.steps,
        f.layers.map_or("all".to_string(), |l| l.to_string()),
        if laid {
            "DP, CP and GA per point, ".to_string()
        } else {
            format!("CP {}, GA {}, ", f.parallel.cp, f.parallel.ga)
        },
        f.parallel.pp
    );
    if f.parallel.tp > 1 || f.parallel.ep > 1 {
        md += &format!(
            "Tensor parallelism TP {} ({}; TP communication {}) innermost in each node, EP {}: \
             every scheme balances one TP rank's h_q/TP heads, and every TP rank of a group \
             runs that plan on its own head shard.\n\n",
            f.parallel.tp,
            if f.parallel.sp {
                "sequence parallel: an all-gather and a reduce-scatter around each attention and MLP block"
            } else {
                "all-reduces after each attention and MLP block"
            },
            if f.parallel.tp_overlap {
                "overlapped with the GEMMs beside it"
            } else {
                "not overlapped"
            },
            f.parallel.ep
        );
    }
    md += &t;
    CompareOutput {
        markdown: md,
        csv,
        svg,
        table: t,
    }
}

/// Throughput of `r` over the baseline arm's (the first arm) at the same point (1 when
/// there is none).
fn speedup(arms: &[Arm], rs: &[ArmResult], r: &ArmResult) -> f64 {
    rs.iter()
        .find(|b| {
            b.arm == arms[0].label
                && (&b.model, &b.topology, &b.corpus, b.seq_len, b.dp, b.cp)
                    == (&r.model, &r.topology, &r.corpus, r.seq_len, r.dp, r.cp)
        })
        .map_or(1.0, |b| r.tokens_per_s / b.tokens_per_s)
}

/// A point's curve key: (model, topology, corpus, L).
type CurveKey = (String, String, String, u32);

/// `dgx-h200-roce` → `roce`, `../topologies/gb200-nvl72.toml` → `nvl72`: short enough for a
/// legend.
fn short_topology(t: &str) -> String {
    let t = t.rsplit('/').next().unwrap_or(t).trim_end_matches(".toml");
    t.rsplit('-').next().unwrap_or(t).to_string()
}

/// plot.svg: speedup over the baseline arm (or throughput, for one arm) against GPUs.
/// When the points span more than one (topology, corpus) — the four-way comparison — one
/// panel per (topology, corpus), rows by topology, columns by corpus, on a shared y range,
/// each with the baseline as a flat grey line and every other arm as a series (colour =
/// arm; dashes = a second model or L). Otherwise one chart: one series per
/// (arm, model, topology, corpus, L), colour = arm, dashes = a second topology or model.
fn plot(f: &CompareFile, title: &str, arms: &[Arm], rs: &[ArmResult]) -> String {
    let mut keys: Vec<CurveKey> = rs
        .iter()
        .map(|r| {
            (
                r.model.clone(),
                r.topology.clone(),
                r.corpus.clone(),
                r.seq_len,
            )
        })
        .collect();
    keys.sort();
    keys.dedup();
    let mut cells: Vec<(String, String)> =
        keys.iter().map(|k| (k.1.clone(), k.2.clone())).collect();
    cells.sort();
    cells.dedup();
    if cells.len() <= 1 {
        return single_chart(title, arms, rs, &keys).render();
    }
    panels(f, title, arms, rs, &keys, &cells)
}

/// The small multiples of [`plot`]: one panel per (topology, corpus) in `cells`.
fn panels(
    f: &CompareFile,
    title: &str,
    arms: &[Arm],
    rs: &[ArmResult],
    keys: &[CurveKey],
    cells: &[(String, String)],
) -> String {
    let rel = arms.len() > 1;
    let base_label = &arms[0].label;
    let value = |r: &ArmResult| {
        if rel {
            speedup(arms, rs, r)
        } else {
            r.tokens_per_s
        }
    };
    // shared axes: every panel on the same GPUs and y range, so panels compare by eye
    let mut gpus: Vec<u32> = rs.iter().map(|r| r.gpus).collect();
    gpus.sort_unstable();
    gpus.dedup();
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for r in rs {
        let v = value(r);
        if v.is_finite() {
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    let pad = ((hi - lo) * 0.08).max(0.02);
    let corpora: std::collections::BTreeSet<&String> = cells.iter().map(|c| &c.1).collect();
    let pp = if f.parallel.pp > 1 {
        format!(" × PP {}", f.parallel.pp)
    } else {
        String::new()
    };
    let tp = if f.parallel.tp > 1 {
        format!("TP {} × ", f.parallel.tp)
    } else {
        String::new()
    };
    let x_label = if f.sweep.layout.is_empty() {
        format!("GPUs ({tp}DP × CP {}{pp}; log scale)", f.parallel.cp)
    } else {
        format!("GPUs ({tp}DP × CP{pp}; log scale)")
    };
    let y_label = if rel {
        format!("speedup over {base_label} (tokens/s ratio, ×)")
    } else {
        "throughput (tokens/s)".to_string()
    };
    let mut grid = crate::report::svg::Grid::new(if rel {
        format!("{title}: speedup over {base_label} in training tokens/s, per topology (rows) and corpus (columns)")
    } else {
        format!("{title}: training throughput, per topology (rows) and corpus (columns)")
    })
    .columns(corpora.len().min(3));
    for (topo, corpus) in cells {
        let inside: Vec<&CurveKey> = keys
            .iter()
            .filter(|k| (&k.1, &k.2) == (topo, corpus))
            .collect();
        let mut variants: Vec<(String, u32)> = inside.iter().map(|k| (k.0.clone(), k.3)).collect();
        variants.sort();
        variants.dedup();
        let (vm, vl) = (
            variants
                .iter()
                .map(|v| &v.0)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                > 1,
            variants
                .iter()
                .map(|v| v.1)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                > 1,
        );
        let mut chart = Chart::new(format!(
            "corpus {corpus} · topology {}",
            short_topology(topo)
        ))
        .x(x_label.clone(), Scale::Log)
        .y(y_label.clone(), Scale::Linear)
        .y_range(lo - pad, hi + pad)
        .size(560.0, 400.0);
        if let (Some(&a), Some(&b)) = (gpus.first(), gpus.last()) {
            // one GPU count: centred, one tick
            let widen = if b > a { 1.25 } else { 2.0 };
            chart = chart
                .x_range(f64::from(a) / widen, f64::from(b) * widen)
                .x_ticks(gpus.iter().map(|&g| f64::from(g)).collect());
        }
        for (vi, k) in inside.iter().enumerate() {
            for (ai, a) in arms.iter().enumerate() {
                let pts: Vec<(f64, f64)> = rs
                    .iter()
                    .filter(|r| {
                        r.arm == a.label
                            && (&r.model, &r.topology, &r.corpus, r.seq_len)
                                == (&k.0, &k.1, &k.2, k.3)
                    })
                    .map(|r| (f64::from(r.gpus), value(r)))
                    .collect();
                if pts.is_empty() {
                    continue;
                }
                let mut parts = vec![if rel && ai == 0 {
                    format!("{} (baseline = 1)", a.label)
                } else {
                    a.label.clone()
                }];
                if vm {
                    parts.push(k.0.replace("llama", "l"));
                }
                if vl {
                    parts.push(format!("{}K", k.3 / 1024));
                }
                let name = parts.join(" · ");
                let mut s = if pts.len() > 1 {
                    Series::line(name, pts)
                } else {
                    Series::scatter(name, pts)
                };
                s = s.color(if rel && ai == 0 {
                    "#808080"
                } else {
                    crate::report::svg::palette(ai)
                });
                if vi % 2 == 1 {
                    s = s.dashed();
                }
                chart = chart.series(s);
            }
        }
        grid = grid.panel(chart);
    }
    grid.render()
}

/// The single chart of [`plot`].
fn single_chart(title: &str, arms: &[Arm], rs: &[ArmResult], keys: &[CurveKey]) -> Chart {
    let baseline = |r: &ArmResult| speedup(arms, rs, r);
    // plot: speedup over the baseline arm vs GPUs; colour = arm, dashes = a second
    // topology (or model), one series per (arm, model, topology, corpus, L)
    let rel = arms.len() > 1;
    let base_label = arms[0].label.clone();
    let mut chart = Chart::new(if rel {
        format!("{title}: speedup over {base_label} (tokens/s)")
    } else {
        format!("{title}: throughput")
    })
    .x("GPUs", Scale::Log)
    .y(
        if rel {
            format!("tokens/s ÷ {base_label}'s")
        } else {
            "tokens/s".to_string()
        },
        Scale::Linear,
    )
    .size(960.0, 520.0);
    let mut gpus: Vec<u32> = rs.iter().map(|r| r.gpus).collect();
    gpus.sort_unstable();
    gpus.dedup();
    if let (Some(&lo), Some(&hi)) = (gpus.first(), gpus.last()) {
        if hi > lo {
            chart = chart
                .x_range(f64::from(lo) / 1.25, f64::from(hi) * 1.25)
                .x_ticks(gpus.iter().map(|&g| f64::from(g)).collect());
        }
    }
    let mut dashes: Vec<(String, String)> =
        keys.iter().map(|k| (k.0.clone(), k.1.clone())).collect();
    dashes.sort();
    dashes.dedup();
    let vary = |i: usize| {
        keys.iter()
            .map(|k| [&k.0, &k.1, &k.2][i])
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1
    };
    let (vm, vt, vc) = (vary(0), vary(1), vary(2));
    let vl = keys
        .iter()
        .map(|k| k.3)
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        > 1;
    for k in keys {
        for (ai, a) in arms.iter().enumerate() {
            if rel && ai == 0 {
                continue;
            }
            let pts: Vec<(f64, f64)> = rs
                .iter()
                .filter(|r| {
                    r.arm == a.label
                        && (&r.model, &r.topology, &r.corpus, r.seq_len) == (&k.0, &k.1, &k.2, k.3)
                })
                .map(|r| {
                    let y = if rel { baseline(r) } else { r.tokens_per_s };
                    (f64::from(r.gpus), y)
                })
                .collect();
            if pts.is_empty() {
                continue;
            }
            let mut parts = vec![a.label.clone()];
            if vm {
                parts.push(k.0.replace("llama", "l"));
            }
            if vt {
                // dgx-h200-roce → roce, gb200-nvl72 → nvl72: the legend is narrow
                parts.push(k.1.rsplit('-').next().unwrap_or(&k.1).to_string());
            }
            if vc {
                parts.push(k.2.clone());
            }
            if vl {
                parts.push(format!("{}K", k.3 / 1024));
            }
            let name = parts.join(" · ");
            let mut s = if pts.len() > 1 {
                Series::line(name, pts)
            } else {
                Series::scatter(name, pts)
            };
            s = s.color(crate::report::svg::palette(ai));
            if dashes
                .iter()
                .position(|d| (&d.0, &d.1) == (&k.0, &k.1))
                .unwrap_or(0)
                % 2
                == 1
            {
                s = s.dashed();
            }
            chart = chart.series(s);
        }
    }
    chart
}

/// The built-in four-way comparison `skewsim` runs without a subcommand: all four schemes
/// on llama3-8b (all 32 layers), the `wlbllm` corpus packed to 64K tokens, DP 2 and 4 ×
/// CP 4 (8 and 16 GPUs of DGX H200 nodes, analytical network), GA 4, two steps.
pub const DEFAULT_FOUR_WAY: &str = r#"
kind = "four-way"
description = "Built-in default: Ulysses, WLB-LLM, DistCA and Libra on llama3-8b, wlbllm corpus at 64K tokens, 8 and 16 H200 GPUs."
model = "llama3-8b"
steps = 2
arms = ["ulysses", "wlbllm", "distca", "libra"]

[network]
topology = "dgx-h200-roce"
model = "analytical"

[parallel]
cp = 4
ga = 4
recompute = true
zero_stage = 3
dp_buckets = 4

[workload]
corpus = "wlbllm"
seq_len = 65536
seed = 1

[settings]
pool_size = 2
head_shards = 4
chunks = 2

[sweep]
dp = [2, 4]
"#;

/// Run [`DEFAULT_FOUR_WAY`] (the `skewsim` binary's run without a subcommand).
pub fn run_default(observer: &dyn Observer) -> Result<CompareOutput> {
    run_text(
        DEFAULT_FOUR_WAY,
        "built-in four-way comparison",
        "default",
        Path::new("."),
        (None, None),
        observer,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::megatron_dcp::{DcpLoad, DcpRounds};
    use crate::error::Error;

    /// A point result read back from its JSON has every float's bits, awkward ones
    /// included, and a float given as a JSON number is refused.
    #[test]
    fn point_results_round_trip_exactly() {
        let awkward = [
            0.1 + 0.2,
            1.0 / 3.0,
            f64::MIN_POSITIVE / 3.0,
            f64::MAX,
            -0.0,
            123_456.789_012_345_68,
            f64::INFINITY,
        ];
        for (k, &x) in awkward.iter().enumerate() {
            let r = PointResult(ArmResult {
                model: "llama3-8b".into(),
                topology: "dgx-h200-roce".into(),
                corpus: "wlbllm".into(),
                seq_len: 65536,
                dp: 2,
                gpus: 8,
                cp: 4,
                ga: 4,
                ran_cp: 4,
                arm: "libra".into(),
                iteration_ms: x,
                tokens_per_s: x * 7.0,
                mfu: x / 7.0,
                attn_mean_ms: -x,
                attn_max_ms: x.sqrt(),
                plan_gib: x.ln_1p(),
                peak_mem_gib: x * x,
                infeasible: k as u32,
                bubble: x / 3.0,
                exposed_comm: x * 0.3,
                wait: x - 1.0,
            });
            let json = serde_json::to_string_pretty(&r).unwrap();
            let back: PointResult = serde_json::from_str(&json).unwrap();
            let bits = |p: &PointResult| {
                let a = &p.0;
                [
                    a.iteration_ms,
                    a.tokens_per_s,
                    a.mfu,
                    a.attn_mean_ms,
                    a.attn_max_ms,
                    a.plan_gib,
                    a.peak_mem_gib,
                    a.bubble,
                    a.exposed_comm,
                    a.wait,
                ]
                .map(f64::to_bits)
            };
            assert_eq!(bits(&back), bits(&r), "{x:e}");
            assert_eq!(back.0.infeasible, k as u32);
        }
        let bad = r#"{"model": "m", "mfu": 0.5}"#;
        let e = serde_json::from_str::<PointResult>(bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("invalid type: floating point `0.5`, expected a string"),
            "{e}"
        );
    }

    /// Points run one by one and gathered by `finish` give `run_text`'s files; results in
    /// another order are refused by point.
    #[test]
    fn a_sweep_point_by_point_finishes_as_run_text() {
        let text = DEFAULT_FOUR_WAY
            .replace("steps = 2", "layers = 2\nsteps = 1")
            .replace("seq_len = 65536", "seq_len = 32768")
            .replace(
                "[\"ulysses\", \"wlbllm\", \"distca\", \"libra\"]",
                "[\"ulysses\", \"libra\"]",
            )
            .replace("dp = [2, 4]", "dp = [1, 2]");
        let (file, base) = ("small.toml", Path::new("."));
        let sweep = Sweep::new(&text, file, "small", base, (None, None)).unwrap();
        assert_eq!(sweep.len(), 4);
        let mut rs: Vec<PointResult> = (0..4).map(|i| sweep.run_point(i).unwrap()).collect();
        let whole = run_text(
            &text,
            file,
            "small",
            base,
            (None, None),
            &super::super::Quiet,
        )
        .unwrap();
        let parts = sweep.finish(&rs).unwrap();
        assert_eq!(
            (parts.markdown, parts.csv, parts.svg),
            (whole.markdown, whole.csv, whole.svg)
        );
        rs.swap(1, 2);
        let e = sweep.finish(&rs).err().unwrap();
        assert!(
            matches!(e.root(), Error::Invalid { field, value, .. }
                if field == "point 1's result" && value.starts_with("model llama3-8b")),
            "{e:?}"
        );
        let e = sweep.run_point(4).err().unwrap();
        assert_eq!(e, invalid("sweep point", 4, "0..=3 (4 points)"));
    }

    /// A comparison's refusals are `Error::Invalid`, naming the field and the value.
    #[test]
    fn sweep_refusals_name_the_field() {
        let cases = [
            (
                "kind = \"four-way\"",
                "kind = \"five-way\"",
                "kind",
                "\"five-way\"",
            ),
            ("steps = 2", "steps = 0", "steps", "0"),
            (
                "[\"ulysses\", \"wlbllm\", \"distca\", \"libra\"]",
                "[]",
                "arms",
                "[]",
            ),
            (
                "chunks = 2",
                "chunks = 2\nepsilon = -1.0",
                "[settings] epsilon",
                "-1",
            ),
            (
                "model = \"analytical\"",
                "model = \"ns3\"",
                "[network] model",
                "\"ns3\"",
            ),
            ("steps = 2", "layers = 99\nsteps = 2", "layers", "99"),
            (
                "dp = [2, 4]",
                "dp = [2, 4]\n[[sweep.layout]]\ndp = 1\ncp = 2\nga = 1",
                "[sweep] dp",
                "[2, 4]",
            ),
            (
                "\"libra\"]",
                "\"wlbllm:cp=3\"]",
                "arms \"wlbllm:cp=3\" cp",
                "3",
            ),
            // settings an arm refuses on a point's layout: found before any point runs
            ("pool_size = 2", "pool_size = 0", "P (pool size)", "0"),
            ("head_shards = 4", "head_shards = 5", "H (head shards)", "5"),
            // TP 8 leaves 4 heads a rank: H = 4 shards of one head, not M = 2 chunks
            ("cp = 4\n", "cp = 4\ntp = 8\n", "M (pipeliner chunks)", "2"),
        ];
        for (i, (from, to, field, value)) in cases.into_iter().enumerate() {
            assert!(DEFAULT_FOUR_WAY.contains(from), "{from}");
            let text = DEFAULT_FOUR_WAY.replacen(from, to, 1);
            let e = Sweep::new(&text, "f.toml", "t", Path::new("."), (None, None)).err();
            let e = e.unwrap_or_else(|| panic!("case {i} ran"));
            assert!(
                matches!(&e, Error::Context { context, .. } if context.starts_with("f.toml")),
                "case {i}: {e:?}"
            );
            assert!(
                matches!(e.root(), Error::Invalid { field: f, value: v, .. } if f == field && v == value),
                "case {i}: {e:?}"
            );
        }
    }

    #[test]
    fn distca_tweaks_compose() {
        let base = SchemeSettings::default();
        let a = parse_arm("distca:tight:eps=0.15:no-ping-pong", &base, "f.toml").unwrap();
        assert_eq!(a.set.distca_scheduler, DistcaScheduler::Tight);
        assert_eq!((a.set.epsilon, a.set.ping_pong), (0.15, false));
        let d = parse_arm("distca:eps=0", &base, "f.toml").unwrap();
        assert_eq!(d.set.distca_scheduler, DistcaScheduler::Reference);
        let e = parse_arm("wlbllm:tight", &base, "f.toml").unwrap_err();
        assert!(
            matches!(e.root(), Error::Invalid { field, value, allowed }
                if field == "arms \"wlbllm:tight\" tweak" && value == "\"tight\""
                    && allowed.starts_with("a tweak wlbllm takes")),
            "{e:?}"
        );
    }

    #[test]
    fn knob_tweaks_set_the_settings_they_name() {
        let base = SchemeSettings::default();
        let l = parse_arm("libra:p=4:h=2:b=2048:m=1", &base, "f.toml").unwrap();
        let p = &l.set.libra;
        assert_eq!(
            (p.pool_size, p.head_shards, p.tile_tokens, p.chunks),
            (4, 2, 2048, 1)
        );
        let w = parse_arm("wlbllm:s-max=98304", &base, "f.toml").unwrap();
        assert_eq!(w.set.s_max, Some(98304));
        let d = parse_arm("megatron-dcp:rounds=capped:load=latency", &base, "f.toml").unwrap();
        assert_eq!(
            (d.set.dcp_rounds, d.set.dcp_load),
            (DcpRounds::Capped, DcpLoad::Latency)
        );
        assert_eq!(base.dcp_rounds, DcpRounds::Open);
        let e = parse_arm("megatron-dcp:rounds=closed", &base, "f.toml").unwrap_err();
        assert_eq!(
            e.root(),
            &invalid("megatron-dcp rounds", "closed", "open or capped")
        );
        for (bad, knob, v) in [
            ("libra:p=0", "p", "0"),
            ("libra:h=x", "h", "x"),
            ("wlbllm:s-max=-1", "s-max", "-1"),
        ] {
            let e = parse_arm(bad, &base, "f.toml").unwrap_err();
            let want = invalid(format!("arms {bad:?} {knob}"), v, "a count ≥ 1");
            assert_eq!(e.root(), &want, "{bad}");
        }
    }
}
