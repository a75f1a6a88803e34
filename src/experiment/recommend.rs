//! `recommend`: for a model, a corpus, a cluster and a GPU count, which scheme at which
//! settings and parallel layout to run, and how sure the answer is.
//!
//! # The search
//! The space is every scheme (Ulysses, WLB-LLM with S_max ∈ {L, 1.5·L, 2·L}, DistCA with
//! ε ∈ {0.05, 0.10, 0.20}, Libra with P ∈ {2, 4, 8, 16}, H ∈ {1, 4}, B ∈ {4096, 8192},
//! Megatron-Core's dynamic CP) on every layout TP × CP × DP × PP (powers of two; TP inside
//! a node; PP only when allowed; EP for MoE models) of the GPUs, at one global batch.
//! Rules prune it, each counted (the first two before anything is simulated, the others
//! while the survivors are):
//!
//! 1. `layout`: the layout or the scheme's settings are refused (TP not dividing the heads,
//!    DP not dividing the global batch, Ulysses' CP not dividing the heads, P not dividing
//!    DP, …).
//! 2. `memory`: a rank's peak memory (`cost::memory`, with exactly the inputs the step
//!    builder gives it: `schedule::step::stage_rank_memory`) exceeds the memory per GPU.
//! 3. `bound`: branch and bound. Every candidate has a lower bound on its step
//!    (`lower_bound_ps`: the busiest GPU's compute stream from the cost model), hence an
//!    upper bound on its tokens/s (the batch's tokens over it). Candidates are simulated in
//!    order of lower bound, [`WAVE`] at a time (`screen`); once [`Spec::top`] distinct
//!    candidates are simulated, one whose most tokens/s is below the last of them can never
//!    be a finalist, and neither can any after it: they are not simulated. Unless the
//!    budget runs out first, the finalists are exactly those a search simulating every
//!    survivor would pick.
//!    Waves are formed from the waves before them, so the pruning does not depend on the
//!    thread count.
//! 4. `libra-pareto`: a Libra (P, H, B) that Libra's configuration simulator
//!    (`balance::libra::config`) finds no better balanced and no cheaper in bytes than
//!    another of the same layout (dominated on the first global batch), checked for a
//!    layout when its first Libra candidate comes up (the bound spares the rest the
//!    configuration simulator).
//! 5. `budget`: candidates left when [`Spec::simulate`] of them have been simulated.
//!
//! The simulated candidates run one step at the first seed through the same code as
//! `skewsim run` (`schemes::run_arm`); the [`Spec::top`] fastest run at every further seed.
//! A candidate whose simulated memory is over capacity is dropped (never recommended).
//! Rows rank by mean tokens/s; a candidate's wins are the seeds at which it is the fastest.

use std::fmt::Write as _;
use std::path::Path;

use rayon::prelude::*;
use serde::Serialize;

use super::calfile::Prices;
use super::schemes::{load_model, load_topology, parse_arm, run_arm, ArmResult, RunOpts};
use super::{Observer, Outcome, Progress};
use crate::balance::libra::config::{
    simulate as libra_simulate, worst_imbalance, Candidate as LibraCandidate, ConfigRow,
};
use crate::balance::libra::LibraParams;
use crate::balance::schemes::{Scheme, SchemePlanner};
use crate::cost::profile::Kernel;
use crate::cost::{CostModel, Ffn, LinearPart};
use crate::error::{bail, invalid, Context, Error, Result};
use crate::report::svg::{palette, Chart, Scale, Series};
use crate::schedule::pipeline::chunk_layers;
use crate::schedule::step::{attn_split, stage_rank_memory};
use crate::schedule::train::Workload;
use crate::schedule::{Parallelism, PipelineKind, Precision};
use crate::workload::pack::Packing;
use crate::workload::PackedSeq;

/// Most GPUs a recommendation searches: the most one simulated point may have, so that
/// `skewsim run` runs every winner at its size.
pub const MAX_GPUS: u32 = super::inputs::MAX_SIM_GPUS as u32;
/// Most seeds.
pub const MAX_SEEDS: u32 = 16;
/// Most candidates simulated at the first seed.
pub const MAX_SIMULATE: u32 = 256;
/// Most finalists (candidates run at every seed).
pub const MAX_TOP: u32 = 32;
/// Most sequences in the global batch.
pub const MAX_GLOBAL_BATCH: u32 = 1 << 16;
/// Longest packed sequence.
pub const MAX_SEQ_LEN: u32 = crate::workload::pack::MAX_SEQ_LEN;
/// Candidates simulated side by side between two `bound` checks.
pub const WAVE: usize = 8;

/// What to recommend for.
#[derive(Clone, Debug, Serialize)]
pub struct Spec {
    /// A built-in model or a model TOML.
    pub model: String,
    /// A built-in corpus, a length file or a parametric spec.
    pub corpus: String,
    /// A built-in topology or a topology TOML.
    pub topology: String,
    /// GPUs to use, all of them.
    pub gpus: u32,
    /// Tokens per packed sequence (L).
    pub seq_len: u32,
    /// Memory per GPU in GiB (default: the cost model's GPU, 141 GB for the H200).
    pub memory_gib: Option<f64>,
    /// Sequences per step (default: 64K tokens per GPU, at least one sequence).
    pub global_batch: Option<u32>,
    /// Whether pipeline parallelism (PP > 1) may be used.
    pub pipeline: bool,
    /// Fixed TP, CP or PP degrees (None: searched).
    pub tp: Option<u32>,
    /// See [`Spec::tp`].
    pub cp: Option<u32>,
    /// See [`Spec::tp`].
    pub pp: Option<u32>,
    /// Schemes to consider (empty: all).
    pub schemes: Vec<Scheme>,
    /// Seeds (workload draws) per finalist.
    pub seeds: u32,
    /// The first seed; seed k is `seed + k`.
    pub seed: u64,
    /// Simulate only this many layers (None: all).
    pub layers: Option<u32>,
    /// Most candidates simulated at the first seed.
    pub simulate: u32,
    /// Finalists run at every seed.
    pub top: u32,
    /// Full activation recomputation.
    pub recompute: bool,
    /// ZeRO stage 0..=3.
    pub zero_stage: u8,
    /// The GPU (a built-in name or a GPU file; None: the topology's, else `h200`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
}

impl Spec {
    /// A spec with the defaults: no limits beyond the GPU's memory, no pipeline, all
    /// schemes, 3 seeds from 1, 16 candidates simulated, 6 finalists, recomputation on,
    /// ZeRO 3.
    pub fn new(model: &str, corpus: &str, topology: &str, gpus: u32, seq_len: u32) -> Spec {
        Spec {
            model: model.into(),
            corpus: corpus.into(),
            topology: topology.into(),
            gpus,
            seq_len,
            memory_gib: None,
            global_batch: None,
            pipeline: false,
            tp: None,
            cp: None,
            pp: None,
            schemes: Vec::new(),
            seeds: 3,
            seed: 1,
            layers: None,
            simulate: 16,
            top: 6,
            recompute: true,
            zero_stage: 3,
            gpu: None,
        }
    }

    fn check(&self) -> Result<()> {
        let range = |field: &str, v: u64, lo: u64, hi: u64| {
            if v < lo || v > hi {
                Err(invalid(field, v, format!("{lo}..={hi}")))
            } else {
                Ok(())
            }
        };
        range("gpus", self.gpus.into(), 1, MAX_GPUS.into())?;
        range("seq_len", self.seq_len.into(), 1, MAX_SEQ_LEN.into())?;
        range("seeds", self.seeds.into(), 1, MAX_SEEDS.into())?;
        range("simulate", self.simulate.into(), 1, MAX_SIMULATE.into())?;
        range("top", self.top.into(), 1, MAX_TOP.into())?;
        range("zero_stage", self.zero_stage.into(), 0, 3)?;
        if let Some(b) = self.global_batch {
            range("global_batch", b.into(), 1, MAX_GLOBAL_BATCH.into())?;
        }
        // the search tries powers of two whose product divides the GPUs: a fixed degree
        // outside them would leave no candidate
        let mut fixed = 1u64;
        for (f, v) in [("tp", self.tp), ("cp", self.cp), ("pp", self.pp)] {
            if let Some(v) = v {
                range(f, v.into(), 1, self.gpus.into())?;
                fixed *= u64::from(v);
                if !v.is_power_of_two() || u64::from(self.gpus) % fixed != 0 {
                    return Err(invalid(
                        f,
                        v,
                        format!(
                            "a power of two that, times the other fixed degrees, divides \
                             gpus = {}",
                            self.gpus
                        ),
                    ));
                }
            }
        }
        if self.pp.is_some_and(|p| p > 1) && !self.pipeline {
            return Err(invalid(
                "pp",
                self.pp.unwrap_or(1),
                "1 unless pipeline parallelism is allowed",
            ));
        }
        if let Some(m) = self.memory_gib {
            if !(m.is_finite() && m > 0.0 && m <= 1e5) {
                return Err(invalid(
                    "memory per GPU (GiB)",
                    m,
                    "a number in (0, 100000]",
                ));
            }
        }
        if self.seed.checked_add(u64::from(self.seeds)).is_none() {
            return Err(invalid(
                "seed",
                self.seed,
                "a seed that leaves room for the seeds",
            ));
        }
        Ok(())
    }

    /// The global batch in sequences.
    pub fn batch(&self) -> u32 {
        self.global_batch.unwrap_or_else(|| {
            let b = u64::from(self.gpus) * 65_536 / u64::from(self.seq_len.max(1));
            b.clamp(1, u64::from(MAX_GLOBAL_BATCH)) as u32
        })
    }
}

/// One point of the search: a scheme arm (as `arms` spells it) on a layout.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    /// The arm, e.g. `libra:p=4:h=1:b=4096`.
    pub arm: String,
    /// Its scheme.
    pub scheme: Scheme,
    /// Tensor parallelism.
    pub tp: u32,
    /// Context parallelism.
    pub cp: u32,
    /// Data parallelism.
    pub dp: u32,
    /// Pipeline stages.
    pub pp: u32,
    /// Expert parallelism.
    pub ep: u32,
    /// Micro-batches per step (global batch / DP).
    pub ga: u32,
}

impl Candidate {
    /// `TP 1 × CP 8 × DP 4 × PP 1, GA 2` (and EP where > 1).
    pub fn layout(&self) -> String {
        let ep = if self.ep > 1 {
            format!(" × EP {}", self.ep)
        } else {
            String::new()
        };
        format!(
            "TP {} × CP {} × DP {} × PP {}{ep}, GA {}",
            self.tp, self.cp, self.dp, self.pp, self.ga
        )
    }
}

/// How many candidates a pruning rule removed.
#[derive(Clone, Debug, Serialize)]
pub struct Rule {
    /// The rule's name.
    pub name: &'static str,
    /// What it removes.
    pub what: &'static str,
    /// Candidates it removed.
    pub removed: usize,
    /// The first removal's reason, for a reader to check.
    pub example: Option<String>,
}

/// One ranked finalist.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// 1 for the recommendation.
    pub rank: usize,
    /// The candidate.
    pub candidate: Candidate,
    /// The arm `skewsim run` runs it as (Libra: with its pipeliner's M).
    pub run_arm: String,
    /// Its lower bound on the step (ms; `lower_bound_ps`).
    pub lower_bound_ms: f64,
    /// Tokens/s at each seed.
    pub per_seed: Vec<f64>,
    /// Mean tokens/s over the seeds.
    pub tokens_per_s: f64,
    /// Lowest and highest tokens/s over the seeds.
    pub tokens_per_s_min: f64,
    /// See [`Row::tokens_per_s_min`].
    pub tokens_per_s_max: f64,
    /// Mean model FLOPs utilisation.
    pub mfu: f64,
    /// Mean iteration time (ms).
    pub iteration_ms: f64,
    /// Highest peak memory of a GPU over the seeds (GiB).
    pub peak_mem_gib: f64,
    /// Mean straggler attention-layer latency (ms; layer 0's forward core attention).
    pub attn_ms: f64,
    /// Mean share of the step in exposed communication.
    pub exposed_comm: f64,
    /// Mean share of the step in the pipeline bubble.
    pub bubble: f64,
    /// Mean share of the step spent waiting for slower peers.
    pub wait: f64,
    /// Seeds at which it was the fastest finalist.
    pub wins: u32,
}

/// A recommendation: the pruning, the ranked finalists and why the first wins.
#[derive(Clone, Debug, Serialize)]
pub struct Recommendation {
    /// What was asked.
    pub spec: Spec,
    /// The global batch used (sequences per step).
    pub global_batch: u32,
    /// Candidates in the search space.
    pub space: usize,
    /// The pruning rules in order, and what each removed.
    pub rules: Vec<Rule>,
    /// Candidates simulated at the first seed.
    pub simulated: usize,
    /// Candidates a planner refused while simulating (none expected), with the first reason.
    pub refused: Vec<String>,
    /// Simulated candidates left out of the finalists as equal to a faster one (same scheme
    /// and layout, the same step to the picosecond: e.g. an S_max that never binds).
    pub equivalent: usize,
    /// The finalists, best first.
    pub rows: Vec<Row>,
    /// How often the winner was the fastest finalist (wins / seeds).
    pub confidence: f64,
    /// One sentence on why the winner wins, from measured figures.
    pub why: String,
}

/// The knob grids.
const S_MAX_FACTORS: [(u32, u32); 3] = [(1, 1), (3, 2), (2, 1)];
const EPSILONS: [&str; 3] = ["0.05", "0.10", "0.20"];
const POOLS: [u32; 4] = [2, 4, 8, 16];
const HEAD_SHARDS: [u32; 2] = [1, 4];
const TILES: [u32; 2] = [4096, 8192];
/// Libra's pipeliner chunks: the first of these dividing a worker's heads.
const CHUNKS: [u32; 3] = [2, 1, 1];

/// The arms of `scheme` at L = `seq_len`.
fn arms_of(scheme: Scheme, seq_len: u32) -> Vec<String> {
    match scheme {
        Scheme::Ulysses => vec!["ulysses".into()],
        Scheme::MegatronDcp => vec!["megatron-dcp".into()],
        Scheme::WlbLlm => S_MAX_FACTORS
            .iter()
            .map(|&(a, b)| {
                format!(
                    "wlbllm:s-max={}",
                    u64::from(seq_len) * u64::from(a) / u64::from(b)
                )
            })
            .collect(),
        Scheme::DistCa => EPSILONS.iter().map(|e| format!("distca:eps={e}")).collect(),
        Scheme::Libra => POOLS
            .iter()
            .flat_map(|&p| {
                HEAD_SHARDS.iter().flat_map(move |&h| {
                    TILES
                        .iter()
                        .map(move |&b| format!("libra:p={p}:h={h}:b={b}"))
                })
            })
            .collect(),
    }
}

/// Powers of two 1, 2, 4, … up to `hi`.
fn pow2(hi: u32) -> impl Iterator<Item = u32> {
    (0..32).map(|k| 1u32 << k).take_while(move |&v| v <= hi)
}

/// Everything `recommend` loaded once.
struct Setup {
    cost: CostModel,
    topo: (String, crate::cluster::TopologySpec),
    gpn: u32,
    batch: Vec<PackedSeq>,
    gbs: u32,
}

/// Search the space of `spec` and rank what survives; files it names resolve against
/// `base`; `prices` as `skewsim run`'s flags give them; progress goes to `observer`.
pub fn recommend(
    spec: &Spec,
    base: &Path,
    prices: Prices,
    observer: &dyn Observer,
) -> Result<Recommendation> {
    search(spec, &setup(spec, base, prices)?, observer)
}

/// Load what the search shares: the cost model, the topology and the first seed's batch.
fn setup(spec: &Spec, base: &Path, prices: Prices) -> Result<Setup> {
    spec.check()?;
    let file = "recommend";
    let kernel = prices.1.unwrap_or(Kernel::DEFAULT);
    let label = Path::new(&spec.topology)
        .file_stem()
        .map_or(spec.topology.clone(), |x| x.to_string_lossy().into_owned());
    let tspec = load_topology(&spec.topology, base, file)?;
    let gpu =
        super::calfile::run_gpu(spec.gpu.as_deref(), "--gpu", Some(&tspec), base).context(file)?;
    let mut cost = super::calfile::cost_model_on(
        load_model(&spec.model, base, file, spec.layers)?,
        prices.0,
        kernel,
        &gpu,
        Precision::Bf16,
    )
    .context("recommend: calibration")?;
    if let Some(g) = spec.memory_gib {
        cost.hw.memory_bytes = (g * (1u64 << 30) as f64) as u64;
    }
    let gpn = tspec.gpus_per_node;
    let gbs = spec.batch();
    let corpus = super::inputs::load_corpus(&spec.corpus).context("recommend: corpus")?;
    let wl = Workload::Corpus {
        corpus,
        seq_len: spec.seq_len,
        packing: Packing::Sequential,
        seed: spec.seed,
    };
    wl.validate("recommend")?;
    let batch = wl
        .batches(gbs as usize)?
        .next()
        .context("recommend: the corpus has no global batch")?;
    Ok(Setup {
        cost,
        topo: (label, tspec),
        gpn,
        batch,
        gbs,
    })
}

/// The search space: (candidate, why it is refused, if it is).
fn space(spec: &Spec, s: &Setup) -> Vec<(Candidate, Option<String>)> {
    let m = &s.cost.model;
    let schemes: Vec<Scheme> = if spec.schemes.is_empty() {
        Scheme::ALL.to_vec()
    } else {
        spec.schemes.clone()
    };
    let experts = match m.ffn {
        Ffn::Moe { experts, .. } => experts,
        Ffn::Dense { .. } => 1,
    };
    let mut out = Vec::new();
    for tp in pow2(s.gpn.min(spec.gpus)).filter(|t| spec.tp.is_none_or(|x| x == *t)) {
        let pps: Vec<u32> = if spec.pipeline {
            pow2(m.layers.min(16)).collect()
        } else {
            vec![1]
        };
        for pp in pps.into_iter().filter(|p| spec.pp.is_none_or(|x| x == *p)) {
            for cp in pow2(spec.gpus / (tp * pp)).filter(|c| spec.cp.is_none_or(|x| x == *c)) {
                if spec.gpus % (tp * pp * cp) != 0 {
                    continue;
                }
                let dp = spec.gpus / (tp * pp * cp);
                for ep in pow2(experts.min(tp * cp * dp)) {
                    let ga = s.gbs / dp;
                    let layout_err = layout_error(spec, s, tp, cp, dp, pp, ep);
                    for &scheme in &schemes {
                        for arm in arms_of(scheme, spec.seq_len) {
                            let c = Candidate {
                                arm,
                                scheme,
                                tp,
                                cp,
                                dp,
                                pp,
                                ep,
                                ga,
                            };
                            let why = layout_err
                                .clone()
                                .or_else(|| scheme_error(spec, s, &c).err().map(|e| e.to_string()));
                            out.push((c, why));
                        }
                    }
                }
            }
        }
    }
    out
}

/// Why a layout cannot run at all, if it cannot.
fn layout_error(
    spec: &Spec,
    s: &Setup,
    tp: u32,
    cp: u32,
    dp: u32,
    pp: u32,
    ep: u32,
) -> Option<String> {
    if s.gbs % dp != 0 {
        return Some(format!(
            "DP {dp} does not divide the global batch of {} sequences",
            s.gbs
        ));
    }
    let ga = s.gbs / dp;
    if u64::from(ga) > super::inputs::MAX_GA {
        return Some(format!(
            "GA {ga} is past {} micro-batches",
            super::inputs::MAX_GA
        ));
    }
    let par = parallelism(spec, tp, cp, dp, pp, ep, ga);
    par.validate("layout")
        .and_then(|_| crate::schedule::step::check_moe_layout(&s.cost.model, par))
        .and_then(|_| s.cost.tp_shard(tp, ep).map(|_| ()))
        .err()
        .map(|e| e.to_string())
}

/// The parallelism a candidate runs with (as `skewsim run` builds it from the winner's
/// experiment file).
fn parallelism(spec: &Spec, tp: u32, cp: u32, dp: u32, pp: u32, ep: u32, ga: u32) -> Parallelism {
    Parallelism {
        dp,
        pp,
        cp,
        ga,
        pipeline: PipelineKind::OneFOneB,
        recompute: spec.recompute.into(),
        zero_stage: spec.zero_stage,
        dp_buckets: DP_BUCKETS,
        tp,
        sp: true,
        tp_overlap: false,
        ep,
        moe_hot_share: 0.0,
        ..Parallelism::default()
    }
}

/// Gradient buckets of the DP all-reduce.
const DP_BUCKETS: u32 = 4;

fn par_of(spec: &Spec, c: &Candidate) -> Parallelism {
    parallelism(spec, c.tp, c.cp, c.dp, c.pp, c.ep, c.ga)
}

/// The scheme's own refusal of a candidate's settings (its planner, Libra's parameters,
/// Ulysses' head split).
fn scheme_error(spec: &Spec, s: &Setup, c: &Candidate) -> Result<()> {
    let arm = parse_arm(&c.arm, &Default::default(), "recommend")?;
    let shard = s.cost.tp_shard(c.tp, c.ep)?;
    if c.scheme == Scheme::Ulysses {
        attn_split(&shard.model, c.cp, false)?;
    }
    let mut set = arm.set.clone();
    (set.cp, set.libra.cp) = (c.cp, c.cp);
    if c.scheme == Scheme::Libra {
        set.libra.shape = shard.attn();
        set.libra.chunks = libra_chunks(shard.attn().heads_q, set.libra.head_shards);
        if c.dp % set.libra.pool_size != 0 {
            return Err(invalid(
                "libra P",
                set.libra.pool_size,
                format!("a divisor of DP = {}", c.dp),
            ));
        }
        set.libra.validate()?;
    }
    SchemePlanner::new(c.scheme, set, &shard, c.dp, s.gbs as usize, spec.seq_len)?;
    Ok(())
}

/// Libra's M: the first of [`CHUNKS`] dividing a worker's h_q / H heads.
fn libra_chunks(heads_q: u32, h: u32) -> u32 {
    let per = heads_q / h.max(1);
    CHUNKS.iter().copied().find(|&m| per % m == 0).unwrap_or(1)
}

/// The arm `skewsim run` runs for a candidate: its label plus Libra's M.
fn run_label(s: &Setup, c: &Candidate) -> Result<String> {
    Ok(if c.scheme == Scheme::Libra {
        let shard = s.cost.tp_shard(c.tp, c.ep)?;
        let h = parse_arm(&c.arm, &Default::default(), "recommend")?
            .set
            .libra
            .head_shards;
        format!("{}:m={}", c.arm, libra_chunks(shard.attn().heads_q, h))
    } else {
        c.arm.clone()
    })
}

/// A candidate's peak memory per GPU (bytes), as the step builder prices it: every
/// pipeline stage's rank, sequences of L tokens (WLB-LLM's micro-batches: S_max).
fn memory_bytes(spec: &Spec, s: &Setup, c: &Candidate) -> Result<u64> {
    let shard = s.cost.tp_shard(c.tp, c.ep)?;
    let split = attn_split(&shard.model, c.cp, c.scheme != Scheme::Ulysses)?;
    let cap = if c.scheme == Scheme::WlbLlm {
        let arm = parse_arm(&c.arm, &Default::default(), "recommend")?;
        arm.set.s_max.unwrap_or(spec.seq_len.saturating_mul(2))
    } else {
        spec.seq_len
    };
    let par = par_of(spec, c);
    let chunks = chunk_layers(&par, shard.model.layers);
    Ok((0..c.pp)
        .map(|k| stage_rank_memory(&shard, par, &chunks, k, split, cap.into()).total())
        .max()
        .unwrap_or(0))
}

/// A lower bound on a candidate's step (ps): the compute stream of its busiest GPU, which
/// the step cannot be shorter than. Per micro-batch and layer of the largest stage, every
/// GPU runs the linear blocks' forward (twice under recomputation) and backward over its
/// L / CP tokens, and its share of the attention: each sequence's forward and backward over
/// its documents on one TP rank's heads, divided over CP, summed over the replica's
/// micro-batches — Ulysses' slowest replica (it moves no work between replicas), the mean
/// replica for the schemes that move work (the busiest GPU carries at least the mean);
/// under PP, 1F1B's PP − 1 micro-batch slots of bubble. No communication and no waiting
/// are counted. The premises (a piece of a sequence's attention costs no less than its
/// share of the whole; no GPU trains fewer than L / CP tokens per micro-batch) are checked
/// against the simulation over a sweep of candidates in this module's tests.
fn lower_bound_ps(spec: &Spec, s: &Setup, c: &Candidate, attn: &[f64]) -> Result<f64> {
    let shard = s.cost.tp_shard(c.tp, c.ep)?;
    let tokens = u64::from(spec.seq_len).div_ceil(u64::from(c.cp));
    let fwd = shard.linear_fwd_ps_f(LinearPart::PreAttn, tokens)
        + shard.linear_fwd_ps_f(LinearPart::PostAttn, tokens);
    let bwd = (shard.linear_bwd_ps(LinearPart::PreAttn, tokens)
        + shard.linear_bwd_ps(LinearPart::PostAttn, tokens)) as f64;
    let linear = fwd * if spec.recompute { 2.0 } else { 1.0 } + bwd;
    let (dp, ga) = (c.dp as usize, c.ga as usize);
    // micro-batch m of replica r = global[m·DP + r]
    let replica =
        |r: usize| -> f64 { (0..ga).map(|m| attn[m * dp + r]).sum::<f64>() / f64::from(c.cp) };
    let per: Vec<f64> = (0..dp).map(replica).collect();
    let attn_total = if c.scheme == Scheme::Ulysses {
        per.iter().copied().fold(0.0, f64::max)
    } else {
        per.iter().sum::<f64>() / per.len().max(1) as f64
    };
    let layers = f64::from(shard.model.layers.div_ceil(c.pp));
    let mb = f64::from(c.ga);
    let stage = layers * (mb * linear + attn_total);
    let bubble = f64::from(c.pp - 1) * layers * (linear + attn_total / mb);
    Ok(stage + bubble)
}

fn search(spec: &Spec, s: &Setup, observer: &dyn Observer) -> Result<Recommendation> {
    let all = space(spec, s);
    let n_space = all.len();
    observer.progress(&format!("{n_space} candidates in the search space"));
    let mut rules = rules();
    let alive = admit(spec, s, all, &mut rules)?;
    observer.progress(&format!(
        "layout removed {}, memory {}; {} left",
        rules[0].removed,
        rules[1].removed,
        alive.len()
    ));
    // 3. bound, 4. libra-pareto (a layout's, when its first Libra candidate comes up),
    // 5. budget: branch and bound in order of lower bound
    let bound_of = lower_bounds(spec, s, &alive)?;
    let mut order: Vec<(f64, usize)> = bound_of.iter().copied().zip(0..).collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    observer.progress(&format!(
        "layout removed {}, memory {}; {} to screen in order of lower bound",
        rules[0].removed,
        rules[1].removed,
        order.len()
    ));
    let tokens = s.batch.iter().map(PackedSeq::tokens).sum::<u64>() as f64;
    let budget = spec.simulate as usize;
    let progress = Progress::new(
        budget.min(order.len()),
        "candidates simulated (first seed)",
        observer,
    );
    let mut pareto: Vec<Option<Option<String>>> = vec![None; alive.len()];
    let mut gate = |i: usize| -> Result<Option<String>> {
        if alive[i].0.scheme != Scheme::Libra {
            return Ok(None);
        }
        if pareto[i].is_none() {
            for (j, d) in libra_dominated(s, &alive, &alive[i].0)? {
                pareto[j] = Some(d);
            }
        }
        Ok(pareto[i].clone().flatten())
    };
    let mut screened: Vec<(usize, ArmResult)> = Vec::new();
    let mut refused = Vec::new();
    let mut over: Vec<String> = Vec::new();
    let mut run = |wave: &[usize]| -> Result<f64> {
        let out: Vec<Result<ArmResult>> = wave
            .par_iter()
            .map(|&i| {
                progress.check()?;
                let r = simulate(spec, s, &alive[i].0, run_opts(spec, 0));
                progress.tick();
                r
            })
            .collect();
        for (&i, r) in wave.iter().zip(out) {
            let c = &alive[i].0;
            match r {
                Err(Error::Cancelled) => return Err(Error::Cancelled),
                Err(err) => refused.push(format!("{} on {}: {err}", c.arm, c.layout())),
                Ok(r) if r.infeasible > 0 => over.push(format!(
                    "{} on {}: {} ranks over capacity when simulated",
                    c.arm,
                    c.layout(),
                    r.infeasible
                )),
                Ok(r) => screened.push((i, r)),
            }
        }
        let fin = finalists(&alive, &screened, spec.top as usize).0;
        Ok(match fin.get(spec.top as usize - 1) {
            Some(&f) => screened[f].1.tokens_per_s,
            None => 0.0,
        })
    };
    let fates = screen(&order, tokens, budget, &mut gate, &mut run)?;
    for w in over {
        rules[1].remove(w);
    }
    let mut simulated = 0;
    for (i, fate) in fates {
        let c = &alive[i].0;
        let at = format!("{} on {}", c.arm, c.layout());
        match fate {
            Fate::Simulated => simulated += 1,
            Fate::Bound(most, bar) => rules[2].remove(format!(
                "{at}: lower bound {:.1} ms, at most {most:.0} tokens/s < {bar:.0} (finalist {})",
                bound_of[i] * 1e-9,
                spec.top
            )),
            Fate::Gated(w) => rules[3].remove(format!("{at}: {w}")),
            Fate::Budget => rules[4].remove(at),
        }
    }
    observer.progress(&format!(
        "simulated {simulated}; bound removed {}, libra-pareto {}, budget {}",
        rules[2].removed, rules[3].removed, rules[4].removed
    ));
    if screened.is_empty() {
        bail!(
            "recommend: no candidate could be simulated ({} refused; first: {})",
            refused.len(),
            refused.first().map_or("none", String::as_str)
        );
    }
    let (fin, by_speed, equivalent) = finalists(&alive, &screened, spec.top as usize);
    let runs = further_seeds(spec, s, &alive, &screened, &fin, observer)?;
    let rows = rank(s, &alive, &screened, &fin, &runs, &bound_of, spec.seeds)?;
    let Some(win) = rows.first() else {
        bail!("recommend: every finalist went over capacity at some seed");
    };
    let confidence = f64::from(win.wins) / f64::from(spec.seeds);
    // the comparator of another scheme: a finalist, else the fastest screened one
    let other = rows
        .iter()
        .skip(1)
        .find(|r| r.candidate.scheme != win.candidate.scheme)
        .cloned()
        .or_else(|| {
            by_speed
                .iter()
                .find(|&&i| alive[screened[i].0].0.scheme != win.candidate.scheme)
                .map(|&i| {
                    let c = &alive[screened[i].0].0;
                    row(
                        c,
                        c.arm.clone(),
                        bound_of[screened[i].0],
                        std::slice::from_ref(&screened[i].1),
                    )
                })
        })
        .or_else(|| rows.get(1).cloned());
    let why = why(win, other.as_ref());
    Ok(Recommendation {
        spec: spec.clone(),
        global_batch: s.gbs,
        space: n_space,
        rules,
        simulated,
        refused,
        equivalent,
        rows,
        confidence,
        why,
    })
}

/// Every candidate's lower bound on the step (ps), by position in `alive`.
fn lower_bounds(spec: &Spec, s: &Setup, alive: &[(Candidate, u64)]) -> Result<Vec<f64>> {
    let attn = sequence_attention(s, alive)?;
    alive
        .iter()
        .map(|(c, _)| {
            let Some((_, _, a)) = attn.iter().find(|(tp, ep, _)| (*tp, *ep) == (c.tp, c.ep)) else {
                bail!("recommend: no attention time for TP {} EP {}", c.tp, c.ep);
            };
            lower_bound_ps(spec, s, c, a)
        })
        .collect()
}

/// How one candidate is simulated at seed offset `k`: one step.
fn run_opts(spec: &Spec, k: u32) -> RunOpts {
    RunOpts {
        steps: 1,
        seed: spec.seed + u64::from(k),
        nvls: true,
    }
}

/// Each finalist's runs: its first-seed run, then one per further seed (simulated in
/// parallel, gathered in seed order).
fn further_seeds(
    spec: &Spec,
    s: &Setup,
    alive: &[(Candidate, u64)],
    screened: &[(usize, ArmResult)],
    fin: &[usize],
    observer: &dyn Observer,
) -> Result<Vec<Vec<ArmResult>>> {
    let jobs: Vec<(usize, u32)> = fin
        .iter()
        .flat_map(|&f| (1..spec.seeds).map(move |k| (f, k)))
        .collect();
    let progress = Progress::new(jobs.len(), "finalist runs (further seeds)", observer);
    let more: Vec<Result<ArmResult>> = jobs
        .par_iter()
        .map(|&(f, k)| {
            progress.check()?;
            let r = simulate(spec, s, &alive[screened[f].0].0, run_opts(spec, k));
            progress.tick();
            r
        })
        .collect();
    let mut runs: Vec<Vec<ArmResult>> = fin.iter().map(|&f| vec![screened[f].1.clone()]).collect();
    for ((f, _), r) in jobs.iter().zip(more) {
        let Some(pos) = fin.iter().position(|x| x == f) else {
            bail!("recommend: a seed's run of candidate {f} is not a finalist's");
        };
        runs[pos].push(r?);
    }
    Ok(runs)
}

/// The pruning rules, in the order the search applies them, none counted yet.
fn rules() -> Vec<Rule> {
    vec![
        Rule {
            name: "layout",
            what: "the layout or the scheme's settings are refused",
            removed: 0,
            example: None,
        },
        Rule {
            name: "memory",
            what: "a rank's peak memory (cost::memory) exceeds the memory per GPU",
            removed: 0,
            example: None,
        },
        Rule {
            name: "bound",
            what: "its lower bound on the step leaves it slower than the last finalist simulated so far",
            removed: 0,
            example: None,
        },
        Rule {
            name: "libra-pareto",
            what: "a Libra (P, H, B) no better balanced and no cheaper than another (configuration simulator)",
            removed: 0,
            example: None,
        },
        Rule {
            name: "budget",
            what: "left when the simulation budget (--simulate) was spent",
            removed: 0,
            example: None,
        },
    ]
}

impl Rule {
    /// Count one removal; the first one's reason is kept as the example.
    fn remove(&mut self, why: String) {
        self.removed += 1;
        if self.example.is_none() {
            self.example = Some(why);
        }
    }
}

/// The layout and memory rules over the whole space (counted in `rules[0]` and
/// `rules[1]`): the candidates left, each with its peak bytes per GPU; none left is a named
/// error that says what was tried.
fn admit(
    spec: &Spec,
    s: &Setup,
    all: Vec<(Candidate, Option<String>)>,
    rules: &mut [Rule],
) -> Result<Vec<(Candidate, u64)>> {
    let n_space = all.len();
    let cap = s.cost.hw.memory_bytes;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut alive: Vec<(Candidate, u64)> = Vec::new();
    let mut first_layout: Option<String> = None;
    for (c, why) in all {
        if let Some(w) = why {
            first_layout.get_or_insert_with(|| format!("{} on {}: {w}", c.arm, c.layout()));
            rules[0].remove(format!("{} on {}: {w}", c.arm, c.layout()));
            continue;
        }
        let mem = memory_bytes(spec, s, &c)?;
        if mem > cap {
            let w = format!(
                "{} on {}: {:.1} GiB per GPU > {:.1} GiB",
                c.arm,
                c.layout(),
                gib(mem),
                gib(cap)
            );
            rules[1].remove(w);
            continue;
        }
        alive.push((c, mem));
    }
    if alive.is_empty() {
        let tried = format!(
            "{n_space} candidates on {} GPUs at L = {} and a global batch of {} sequences: \
             {} refused by layout (first: {}), {} over {:.1} GiB per GPU (first: {})",
            spec.gpus,
            spec.seq_len,
            s.gbs,
            rules[0].removed,
            first_layout.as_deref().unwrap_or("none"),
            rules[1].removed,
            gib(cap),
            rules[1].example.as_deref().unwrap_or("none"),
        );
        return Err(invalid(
            "gpus, memory per GPU",
            spec.gpus,
            format!("a setting some layout fits; tried {tried}"),
        ));
    }
    Ok(alive)
}

/// The finalists' rows, each over all its seeds, fastest first and numbered; a finalist
/// over capacity at any seed is dropped; `wins` counts the seeds at which each is fastest.
fn rank(
    s: &Setup,
    alive: &[(Candidate, u64)],
    screened: &[(usize, ArmResult)],
    fin: &[usize],
    runs: &[Vec<ArmResult>],
    bound_of: &[f64],
    seeds: u32,
) -> Result<Vec<Row>> {
    let mut rows: Vec<Row> = fin
        .iter()
        .zip(runs)
        .map(|(&f, rs)| {
            let c = &alive[screened[f].0].0;
            Ok(row(c, run_label(s, c)?, bound_of[screened[f].0], rs))
        })
        .collect::<Result<_>>()?;
    // a finalist over capacity at another seed is dropped too
    rows.retain(|r| {
        let over = fin
            .iter()
            .position(|&f| alive[screened[f].0].0 == r.candidate)
            .is_some_and(|p| runs[p].iter().any(|x| x.infeasible > 0));
        !over
    });
    for k in 0..seeds as usize {
        if let Some(w) = (0..rows.len()).max_by(|&a, &b| {
            rows[a].per_seed[k]
                .total_cmp(&rows[b].per_seed[k])
                .then(b.cmp(&a))
        }) {
            rows[w].wins += 1;
        }
    }
    rows.sort_by(|a, b| b.tokens_per_s.total_cmp(&a.tokens_per_s));
    for (i, r) in rows.iter_mut().enumerate() {
        r.rank = i + 1;
    }
    Ok(rows)
}

/// The finalists among `screened` (positions in it): the `top` fastest at the first seed
/// (ties: the one simulated first), one of each set of candidates of one scheme and layout
/// whose step came out the same; with every position fastest first, and how many were left
/// out as equal to a faster one.
fn finalists(
    alive: &[(Candidate, u64)],
    screened: &[(usize, ArmResult)],
    top: usize,
) -> (Vec<usize>, Vec<usize>, usize) {
    let mut by_speed: Vec<usize> = (0..screened.len()).collect();
    by_speed.sort_by(|&a, &b| {
        screened[b]
            .1
            .tokens_per_s
            .total_cmp(&screened[a].1.tokens_per_s)
            .then(a.cmp(&b))
    });
    let same = |a: usize, b: usize| {
        let (ca, cb) = (&alive[screened[a].0].0, &alive[screened[b].0].0);
        let (ra, rb) = (&screened[a].1, &screened[b].1);
        ca.scheme == cb.scheme
            && ca.layout() == cb.layout()
            && ra.iteration_ms == rb.iteration_ms
            && ra.attn_mean_ms == rb.attn_mean_ms
    };
    let mut fin: Vec<usize> = Vec::new();
    let mut equivalent = 0;
    for &i in &by_speed {
        if fin.iter().any(|&f| same(f, i)) {
            equivalent += 1;
        } else if fin.len() < top {
            fin.push(i);
        }
    }
    (fin, by_speed, equivalent)
}

/// What the branch and bound did with a candidate.
#[derive(Clone, Debug, PartialEq)]
enum Fate {
    /// Simulated at the first seed.
    Simulated,
    /// Its most tokens/s (first) is below what the last finalist reached (second).
    Bound(f64, f64),
    /// Removed by the gate, for the reason given.
    Gated(String),
    /// Left when the simulation budget was spent.
    Budget,
}

/// Branch and bound over `order` ((lower bound of the step in ps, candidate), ascending):
/// candidates are simulated [`WAVE`] at a time by `run`, which returns the tokens/s the
/// last finalist reaches so far (0 while there are fewer finalists than wanted). A
/// candidate that trains at most `tokens` tokens in a step at least its lower bound long
/// runs at most `tokens / bound` tokens/s; below that figure it can never be a finalist and
/// is not simulated (`Bound`; every later one then is too). The rest pass `gate` (None:
/// admitted) before a wave takes them, until `budget` have been simulated. Each wave is
/// formed from the figures of the waves before it, so what is pruned does not depend on
/// the thread count.
fn screen(
    order: &[(f64, usize)],
    tokens: f64,
    budget: usize,
    gate: &mut dyn FnMut(usize) -> Result<Option<String>>,
    run: &mut dyn FnMut(&[usize]) -> Result<f64>,
) -> Result<Vec<(usize, Fate)>> {
    let mut fates = Vec::with_capacity(order.len());
    let mut bar = 0.0f64;
    let (mut next, mut simulated) = (0, 0);
    while next < order.len() && simulated < budget {
        let mut wave = Vec::new();
        while next < order.len() && wave.len() < WAVE && simulated + wave.len() < budget {
            let (lb, i) = order[next];
            next += 1;
            let most = tokens * 1e12 / lb;
            if most < bar {
                fates.push((i, Fate::Bound(most, bar)));
            } else if let Some(why) = gate(i)? {
                fates.push((i, Fate::Gated(why)));
            } else {
                wave.push(i);
            }
        }
        if wave.is_empty() {
            break;
        }
        bar = run(&wave)?;
        simulated += wave.len();
        fates.extend(wave.iter().map(|&i| (i, Fate::Simulated)));
    }
    fates.extend(order[next..].iter().map(|&(_, i)| (i, Fate::Budget)));
    Ok(fates)
}

/// Simulate one candidate for one step at `opts`' seed, as `skewsim run` would.
fn simulate(spec: &Spec, s: &Setup, c: &Candidate, opts: RunOpts) -> Result<ArmResult> {
    let label = run_label(s, c)?;
    let arm = parse_arm(&label, &Default::default(), "recommend")?;
    run_arm(
        &opts,
        &s.cost,
        &Some(s.topo.clone()),
        "analytical",
        &spec.corpus,
        spec.seq_len,
        par_of(spec, c),
        &arm,
    )
}

fn row(c: &Candidate, run_arm: String, bound_ps: f64, rs: &[ArmResult]) -> Row {
    let n = rs.len().max(1) as f64;
    let mean = |f: &dyn Fn(&ArmResult) -> f64| rs.iter().map(f).sum::<f64>() / n;
    let tps: Vec<f64> = rs.iter().map(|r| r.tokens_per_s).collect();
    Row {
        rank: 0,
        candidate: c.clone(),
        run_arm,
        lower_bound_ms: bound_ps * 1e-9,
        tokens_per_s: mean(&|r| r.tokens_per_s),
        tokens_per_s_min: tps.iter().copied().fold(f64::INFINITY, f64::min),
        tokens_per_s_max: tps.iter().copied().fold(0.0, f64::max),
        per_seed: tps,
        mfu: mean(&|r| r.mfu),
        iteration_ms: mean(&|r| r.iteration_ms),
        peak_mem_gib: rs.iter().map(|r| r.peak_mem_gib).fold(0.0, f64::max),
        attn_ms: mean(&|r| r.attn_mean_ms),
        exposed_comm: mean(&|r| r.exposed_comm),
        bubble: mean(&|r| r.bubble),
        wait: mean(&|r| r.wait),
        wins: 0,
    }
}

/// Per (TP, EP) of the candidates: each sequence's attention forward + backward time (ps)
/// on one TP rank's heads.
fn sequence_attention(s: &Setup, alive: &[(Candidate, u64)]) -> Result<Vec<(u32, u32, Vec<f64>)>> {
    let mut keys: Vec<(u32, u32)> = alive.iter().map(|(c, _)| (c.tp, c.ep)).collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter()
        .map(|(tp, ep)| {
            let shard = s.cost.tp_shard(tp, ep)?;
            let h = shard.model.heads_q;
            let t = s
                .batch
                .par_iter()
                .map(|q| {
                    let lens: Vec<u32> = q.lengths().collect();
                    (shard.attn_fwd_ps(lens.iter().copied(), h)
                        + shard.attn_bwd_ps(lens.iter().copied(), h)) as f64
                })
                .collect();
            Ok((tp, ep, t))
        })
        .collect()
}

/// For each Libra candidate on the layout of `of` (its position in `alive`): why Libra's
/// configuration simulator finds its (P, H, B) dominated, or None.
fn libra_dominated(
    s: &Setup,
    alive: &[(Candidate, u64)],
    of: &Candidate,
) -> Result<Vec<(usize, Option<String>)>> {
    let lay = (of.tp, of.cp, of.dp, of.pp, of.ep);
    let idx: Vec<usize> = (0..alive.len())
        .filter(|&i| {
            let c = &alive[i].0;
            c.scheme == Scheme::Libra && (c.tp, c.cp, c.dp, c.pp, c.ep) == lay
        })
        .collect();
    let shard = s.cost.tp_shard(lay.0, lay.4)?;
    let cands: Vec<LibraCandidate> = idx
        .iter()
        .map(|&i| {
            let l = parse_arm(&alive[i].0.arm, &Default::default(), "recommend")?
                .set
                .libra;
            Ok(LibraCandidate {
                pool_size: l.pool_size,
                head_shards: l.head_shards,
                tile_tokens: l.tile_tokens,
            })
        })
        .collect::<Result<_>>()?;
    let basep = LibraParams {
        cp: lay.1,
        shape: shard.attn(),
        // the pipeliner's M plays no part in the configuration simulator
        chunks: 1,
        ..LibraParams::default()
    };
    let grouping = |_: usize, loads: &[u64], p: usize| crate::balance::grouping::vrsp(loads, p);
    // one step's batch as the planner sees it at one GA index: DP sequences
    let steps: Vec<Vec<PackedSeq>> = vec![s.batch[..lay.2 as usize].to_vec()];
    let rows = libra_simulate(&steps, lay.2, s.gpn, &basep, &cands, &grouping)?;
    let key = |r: &ConfigRow| (worst_imbalance(r), r.bytes_per_step);
    Ok(rows
        .iter()
        .enumerate()
        .map(|(a, ra)| {
            let (ia, ba) = key(ra);
            let by = rows.iter().enumerate().find(|(b, rb)| {
                let (ib, bb) = key(rb);
                *b != a && ib <= ia && bb <= ba && ((ib, bb) != (ia, ba) || *b < a)
            });
            let why = by.map(|(_, rb)| {
                format!(
                    "imbalance {:.3}, {:.0} MiB/step vs p={} h={} b={}: {:.3}, {:.0} MiB/step",
                    ia,
                    ba / (1u64 << 20) as f64,
                    rb.candidate.pool_size,
                    rb.candidate.head_shards,
                    rb.candidate.tile_tokens,
                    key(rb).0,
                    key(rb).1 / (1u64 << 20) as f64
                )
            });
            (idx[a], why)
        })
        .collect())
}

/// Why the winner `w` wins, from measured figures: against `o` (the best candidate of
/// another scheme, else the runner-up), the time each of attention straggling, exposed communication, the
/// bubble and waiting cost per step, largest saving first.
fn why(w: &Row, o: Option<&Row>) -> String {
    let Some(o) = o else {
        return format!(
            "{} on {} is the only finalist: {:.0} tokens/s, MFU {:.3}.",
            w.candidate.arm,
            w.candidate.layout(),
            w.tokens_per_s,
            w.mfu
        );
    };
    // (ms per step the winner saves, what it measured); shares below 0.05% left out
    let parts = [
        (
            (o.attn_ms - w.attn_ms),
            format!(
                "its straggler's attention layer takes {:.1} ms vs {:.1} ms",
                w.attn_ms, o.attn_ms
            ),
        ),
        (
            o.exposed_comm * o.iteration_ms - w.exposed_comm * w.iteration_ms,
            format!(
                "exposed communication is {:.1}% of its step vs {:.1}%",
                100.0 * w.exposed_comm,
                100.0 * o.exposed_comm
            ),
        ),
        (
            o.bubble * o.iteration_ms - w.bubble * w.iteration_ms,
            format!(
                "the pipeline bubble {:.1}% vs {:.1}%",
                100.0 * w.bubble,
                100.0 * o.bubble
            ),
        ),
        (
            o.wait * o.iteration_ms - w.wait * w.iteration_ms,
            format!(
                "waiting on slower peers {:.1}% vs {:.1}%",
                100.0 * w.wait,
                100.0 * o.wait
            ),
        ),
    ];
    let shown = [
        true,
        w.exposed_comm.max(o.exposed_comm) >= 5e-4,
        w.bubble.max(o.bubble) >= 5e-4,
        w.wait.max(o.wait) >= 5e-4,
    ];
    let mut order: Vec<usize> = (0..parts.len()).filter(|&i| shown[i]).collect();
    order.sort_by(|&a, &b| parts[b].0.total_cmp(&parts[a].0).then(a.cmp(&b)));
    let list: Vec<&str> = order.iter().map(|&i| parts[i].1.as_str()).collect();
    let once = if o.per_seed.len() < w.per_seed.len() {
        " (simulated at the first seed only)"
    } else {
        ""
    };
    format!(
        "{} on {} wins at {:.0} tokens/s, {:.2}x {} on {}{once}: {}.",
        w.candidate.arm,
        w.candidate.layout(),
        w.tokens_per_s,
        w.tokens_per_s / o.tokens_per_s.max(1e-12),
        o.candidate.arm,
        o.candidate.layout(),
        list.join(", ")
    )
}

impl Recommendation {
    /// The ranked table (Markdown).
    pub fn table(&self) -> String {
        let mut t = String::from(
            "| rank | arm | layout | tokens/s (mean) | min … max over seeds | wins | MFU | iteration (ms) | peak mem (GiB) | attn layer (ms) | exposed comm | bubble | wait | lower bound (ms) |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for r in &self.rows {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {:.0} | {:.0} … {:.0} | {}/{} | {:.3} | {:.1} | {:.1} | {:.2} | {:.1}% | {:.1}% | {:.1}% | {:.1} |",
                r.rank,
                r.candidate.arm,
                r.candidate.layout(),
                r.tokens_per_s,
                r.tokens_per_s_min,
                r.tokens_per_s_max,
                r.wins,
                self.spec.seeds,
                r.mfu,
                r.iteration_ms,
                r.peak_mem_gib,
                r.attn_ms,
                100.0 * r.exposed_comm,
                100.0 * r.bubble,
                100.0 * r.wait,
                r.lower_bound_ms
            );
        }
        t
    }

    /// summary.md: what was asked, the pruning, the table, why the winner wins.
    pub fn markdown(&self) -> String {
        let sp = &self.spec;
        let mut md = format!(
            "# recommend: {} on {} ({} GPUs), corpus {}, L = {}\n\n\
             Global batch {} sequences; seeds {}…{}; {}; ZeRO {}; recomputation {}; one step per \
             seed, analytical network, no runtime variance.\n\n",
            sp.model,
            sp.topology,
            sp.gpus,
            sp.corpus,
            sp.seq_len,
            self.global_batch,
            sp.seed,
            sp.seed + u64::from(sp.seeds) - 1,
            if sp.pipeline {
                "pipeline allowed"
            } else {
                "no pipeline"
            },
            sp.zero_stage,
            if sp.recompute { "on" } else { "off" },
        );
        let _ = writeln!(md, "## Pruning ({} candidates)\n", self.space);
        md += "| rule | removes | removed | first removed |\n|---|---|---|---|\n";
        for r in &self.rules {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                r.name,
                r.what,
                r.removed,
                r.example.as_deref().unwrap_or("").replace('|', "\\|")
            );
        }
        let _ = writeln!(
            md,
            "\nSimulated at the first seed: {}; finalists at every seed: {} (left out as equal to \
             a faster candidate of the same scheme and layout: {}).",
            self.simulated,
            self.rows.len(),
            self.equivalent
        );
        if !self.refused.is_empty() {
            let _ = writeln!(
                md,
                "Refused while simulating: {} (first: {}).",
                self.refused.len(),
                self.refused[0]
            );
        }
        md += "\n## Ranked\n\n";
        md += &self.table();
        let _ = writeln!(
            md,
            "\n**Recommendation.** {} Confidence: it is the fastest finalist at {} of {} seeds ({:.0}%).",
            self.why,
            self.rows[0].wins,
            sp.seeds,
            100.0 * self.confidence
        );
        md
    }

    /// The table as CSV, one row per finalist.
    pub fn csv(&self) -> String {
        let mut c = String::from(
            "rank,arm,scheme,tp,cp,dp,pp,ep,ga,tokens_per_s,tokens_per_s_min,tokens_per_s_max,wins,mfu,iteration_ms,peak_mem_gib,attn_ms,exposed_comm,bubble,wait,lower_bound_ms\n",
        );
        for r in &self.rows {
            let k = &r.candidate;
            let _ = writeln!(
                c,
                "{},{},{},{},{},{},{},{},{},{:.1},{:.1},{:.1},{},{:.4},{:.3},{:.2},{:.3},{:.4},{:.4},{:.4},{:.3}",
                r.rank,
                k.arm,
                k.scheme.name(),
                k.tp,
                k.cp,
                k.dp,
                k.pp,
                k.ep,
                k.ga,
                r.tokens_per_s,
                r.tokens_per_s_min,
                r.tokens_per_s_max,
                r.wins,
                r.mfu,
                r.iteration_ms,
                r.peak_mem_gib,
                r.attn_ms,
                r.exposed_comm,
                r.bubble,
                r.wait,
                r.lower_bound_ms
            );
        }
        c
    }

    /// plot.svg: tokens/s of each finalist at each seed (dots) and their mean (ring), by rank.
    pub fn svg(&self) -> String {
        let n = self.rows.len();
        let mut chart = Chart::new(format!(
            "recommend: the {n} finalists' tokens/s at each of {} seeds ({} GPUs, L = {})",
            self.spec.seeds, self.spec.gpus, self.spec.seq_len
        ))
        .x("rank", Scale::Linear)
        .y("tokens/s", Scale::Linear)
        .x_range(0.5, n as f64 + 0.5)
        .x_ticks((1..=n).map(|k| k as f64).collect())
        .size(960.0, 520.0);
        for r in &self.rows {
            let x = r.rank as f64;
            let col = palette(
                Scheme::ALL
                    .iter()
                    .position(|s| *s == r.candidate.scheme)
                    .unwrap_or(0),
            );
            chart = chart.series(
                Series::scatter(
                    format!("#{} {} · {}", r.rank, r.candidate.arm, r.candidate.layout()),
                    r.per_seed.iter().map(|&y| (x, y)).collect(),
                )
                .color(col),
            );
        }
        chart.render()
    }

    /// An experiment file that `skewsim run` runs the winner with, at the first seed.
    pub fn winner_toml(&self) -> String {
        experiment_file(&self.spec, &self.rows[0].candidate, &self.rows[0].run_arm)
    }

    /// The files a run writes: summary.md, recommend.csv, plot.svg, winner.toml.
    pub fn outcome(&self) -> Outcome {
        let md = self.markdown();
        Outcome {
            kind: "recommend".into(),
            files: vec![
                ("summary.md".into(), md.clone()),
                ("recommend.csv".into(), self.csv()),
                ("plot.svg".into(), self.svg()),
                ("winner.toml".into(), self.winner_toml()),
            ],
            points_file: "recommend.csv",
            summary: md,
            json: serde_json::to_string_pretty(self).ok(),
        }
    }
}

/// The experiment file that `skewsim run` runs candidate `w` with (as `arm`), at the
/// first seed of `sp`.
fn experiment_file(sp: &Spec, w: &Candidate, arm: &str) -> String {
    let layers = sp
        .layers
        .map_or(String::new(), |l| format!("layers = {l}\n"));
    format!(
        "kind = \"four-way\"\n\
         description = \"skewsim recommend's winner: {arm} on {layout}\"\n\
         model = {model:?}\n{layers}steps = 1\narms = [{arm:?}]\n\n\
         [network]\ntopology = {topo:?}\nmodel = \"analytical\"\n\n\
         [parallel]\ncp = {cp}\nga = {ga}\npp = {pp}\ntp = {tp}\nep = {ep}\n\
         recompute = {rc}\nzero_stage = {zs}\ndp_buckets = {DP_BUCKETS}\n\n\
         [workload]\ncorpus = {corpus:?}\nseq_len = {l}\nseed = {seed}\n\n\
         [sweep]\ndp = [{dp}]\n",
        layout = w.layout(),
        model = sp.model,
        topo = sp.topology,
        cp = w.cp,
        ga = w.ga,
        pp = w.pp,
        tp = w.tp,
        ep = w.ep,
        rc = sp.recompute,
        zs = sp.zero_stage,
        corpus = sp.corpus,
        l = sp.seq_len,
        seed = sp.seed,
        dp = w.dp,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Twenty candidates in order of lower bound: candidate k at (k + 1) s, so with 60
    /// tokens a step it runs at most 60 / (k + 1) tokens/s; the gate removes candidate 2.
    fn twenty() -> Vec<(f64, usize)> {
        (0..20).map(|k| ((k + 1) as f64 * 1e12, k)).collect()
    }

    /// A fixed degree no candidate can have is refused by name before the search.
    #[test]
    fn fixed_degrees_must_divide_the_gpus_as_powers_of_two() {
        let base = Spec::new("llama3-8b", "wlbllm", "dgx-h200-roce", 8, 65_536);
        let fixed = |tp, cp, pp| Spec {
            tp,
            cp,
            pp,
            pipeline: true,
            ..base.clone()
        };
        for (spec, field, value) in [
            (fixed(None, Some(3), None), "cp", "3"),
            (fixed(Some(4), Some(4), None), "cp", "4"),
            (fixed(Some(2), Some(2), Some(4)), "pp", "4"),
            (
                Spec {
                    gpus: 12,
                    ..fixed(None, Some(8), None)
                },
                "cp",
                "8",
            ),
        ] {
            let e = spec.check().unwrap_err();
            assert!(
                matches!(&e, Error::Invalid { field: f, value: v, allowed }
                    if f == field && v == value && allowed.contains("divides gpus")),
                "{e:?}"
            );
        }
        assert!(fixed(Some(2), Some(2), Some(2)).check().is_ok());
        assert!(Spec {
            gpus: 12,
            ..fixed(None, Some(4), None)
        }
        .check()
        .is_ok());
    }

    #[test]
    fn the_bound_prunes_exactly_what_cannot_reach_the_last_finalist() {
        let mut gated = Vec::new();
        let mut gate = |i: usize| {
            gated.push(i);
            Ok((i == 2).then(|| "dominated".to_string()))
        };
        let mut waves = Vec::new();
        // after the first wave the last finalist runs at 6 tokens/s: candidate 9 (at most
        // 60 / 10 = 6) can still tie it, candidate 10 (60 / 11 < 6) and all after cannot
        let mut run = |w: &[usize]| {
            waves.push(w.to_vec());
            Ok(6.0)
        };
        let fates = screen(&twenty(), 60.0, 16, &mut gate, &mut run).unwrap();
        assert_eq!(waves, vec![vec![0, 1, 3, 4, 5, 6, 7, 8], vec![9]]);
        // the gate is asked only about candidates a wave would take
        assert_eq!(gated, (0..10).collect::<Vec<_>>());
        let fate = |k: usize| fates.iter().find(|(i, _)| *i == k).unwrap().1.clone();
        assert_eq!(fate(2), Fate::Gated("dominated".into()));
        for k in [0, 1, 3, 8, 9] {
            assert_eq!(fate(k), Fate::Simulated, "candidate {k}");
        }
        for k in 10..20 {
            assert_eq!(
                fate(k),
                Fate::Bound(60.0 / (k + 1) as f64, 6.0),
                "candidate {k}"
            );
        }
        assert_eq!(fates.len(), 20);
    }

    #[test]
    fn without_enough_finalists_nothing_is_bound_and_the_budget_stops_the_search() {
        let mut gate = |i: usize| Ok((i == 2).then(|| "dominated".to_string()));
        let mut waves = Vec::new();
        let mut run = |w: &[usize]| {
            waves.push(w.to_vec());
            Ok(0.0)
        };
        let fates = screen(&twenty(), 60.0, 10, &mut gate, &mut run).unwrap();
        assert_eq!(waves, vec![vec![0, 1, 3, 4, 5, 6, 7, 8], vec![9, 10]]);
        let budget: Vec<usize> = fates
            .iter()
            .filter(|(_, f)| *f == Fate::Budget)
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(budget, (11..20).collect::<Vec<_>>());
        assert!(!fates.iter().any(|(_, f)| matches!(f, Fate::Bound(..))));
    }

    /// Every candidate the layout rules admit (llama3-8b cut to 2 layers on 8 GPUs, PP
    /// allowed: every scheme and setting on every layout, 184 candidates) simulates to a
    /// step no shorter than its lower bound and no more tokens/s than the bound allows, the
    /// premises of the `bound` rule.
    #[test]
    fn the_lower_bound_never_exceeds_the_simulated_step() {
        let mut spec = Spec::new("llama3-8b", "wlbllm", "dgx-h200-roce", 8, 65_536);
        spec.layers = Some(2);
        spec.pipeline = true;
        let s = setup(&spec, Path::new(env!("CARGO_MANIFEST_DIR")), (None, None)).unwrap();
        let alive: Vec<(Candidate, u64)> = space(&spec, &s)
            .into_iter()
            .filter(|(_, why)| why.is_none())
            .map(|(c, _)| (c, 0))
            .collect();
        let attn = sequence_attention(&s, &alive).unwrap();
        let tokens = s.batch.iter().map(PackedSeq::tokens).sum::<u64>() as f64;
        let sweep: Vec<&Candidate> = alive.iter().map(|(c, _)| c).collect();
        let checked: Vec<String> = sweep
            .par_iter()
            .filter_map(|c| {
                let a = &attn.iter().find(|x| (x.0, x.1) == (c.tp, c.ep)).unwrap().2;
                let lb = lower_bound_ps(&spec, &s, c, a).unwrap();
                let opts = RunOpts {
                    steps: 1,
                    seed: spec.seed,
                    nvls: true,
                };
                let r = simulate(&spec, &s, c, opts).ok()?;
                let at = format!("{} on {}", c.arm, c.layout());
                assert!(
                    lb * 1e-9 <= r.iteration_ms,
                    "{at}: lower bound {} ms > simulated {} ms",
                    lb * 1e-9,
                    r.iteration_ms
                );
                assert!(
                    r.tokens_per_s <= tokens * 1e12 / lb,
                    "{at}: {} tokens/s above the bound's {}",
                    r.tokens_per_s,
                    tokens * 1e12 / lb
                );
                Some(format!("{:?}", c.scheme))
            })
            .collect();
        // the sweep reached every scheme and most of its candidates ran
        for sc in Scheme::ALL {
            assert!(
                checked.contains(&format!("{sc:?}")),
                "{sc:?} never simulated"
            );
        }
        assert!(
            checked.len() * 10 >= sweep.len() * 9,
            "{} of {}",
            checked.len(),
            sweep.len()
        );
    }

    /// A winner at the largest size `recommend` searches is an experiment `skewsim run`
    /// accepts; twice as many GPUs get the per-point limit's named error.
    #[test]
    fn the_winner_file_runs_at_every_size_recommend_searches() {
        let spec = Spec::new("llama3-8b", "wlbllm", "dgx-h200-roce", MAX_GPUS, 131_072);
        let w = Candidate {
            arm: "libra:p=8:h=4:b=8192:m=2".into(),
            scheme: Scheme::Libra,
            tp: 1,
            cp: 2,
            dp: MAX_GPUS / 2,
            pp: 1,
            ep: 1,
            ga: 1,
        };
        // the file as `skewsim run` reads it (every point's layout checked), not run
        let check = |c: &Candidate| {
            let text = experiment_file(&spec, c, &c.arm);
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("winner.toml");
            crate::experiment::sweep(&path, &text, (None, None)).map(|s| s.len())
        };
        assert_eq!(check(&w).unwrap(), 1);
        let err = check(&Candidate { cp: 4, ..w.clone() })
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("= 32768 simulated GPUs: at most 16384 per point"),
            "{err}"
        );
    }
}
