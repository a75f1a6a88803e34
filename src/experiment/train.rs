//! Experiment kind `train`: simulate training steps of a model under Ulysses context
//! parallelism (DP × PP × CP, GA micro-batches) and write steps.csv, gpus.csv,
//! microbatches.csv (+ .svg), trace.json and summary.md; with a `[sweep]` table, run every
//! point of the (dp × gbs × seq_len × corpus) grid in parallel and write points.csv,
//! scaling.svg and summary.md.
//!
//! ```toml
//! kind = "train"
//! model = "qwen3-30b-a3b"           # a built-in, or a path to a model TOML
//! # calibration = "cal.json"        # replaces the H200 attention table / hardware figures
//! steps = 2
//! [cluster]   # gpus_per_node, nodes; allow_subset = true lets a point's TP·CP·DP·PP
//!             # use fewer GPUs than nodes × gpus_per_node (otherwise it must equal it);
//!             # gpu = "b200" (or a GPU file) overrides the topology's GPU (default h200)
//! [network]   # topology = "../topologies/dgx-h200-roce.toml", model = "analytical" | "flow"
//!             # | "stub" (stub: alpha_us, intra_gbytes_per_s, inter_gbytes_per_s),
//!             # nvls = true | false (NVLS collectives where the topology has them)
//! [variance]  # the cluster's VarianceSpec (persistent, jitter, spike); absent: none
//! [parallel]  # dp, pp, cp, tp, sp, tp_overlap, ep, ga, pipeline = "1f1b" | "gpipe", recompute,
//!             # zero_stage, dp_buckets (GPUs = TP·CP·DP·PP, TP innermost), precision =
//!             # "bf16" | "fp8" (the linear GEMMs; fp8 as TransformerEngine, cost::gpu)
//! [workload]  # seq_len, seed, and one of: corpus = "libra-1m" (+ packing = "sequential"),
//!             # sequences = [[doc lengths], ...]; a distribution is a corpus spec:
//!             # corpus = "lognormal:median=800,p99=30000". seq_len is every point's L
//!             # (every swept corpus's too) unless [sweep] seq_len lists them; without it,
//!             # each corpus runs at its own L (libra-256k: 262144, libra-1m: 1048576)
//! [output]    # trace_step (default 0), trace_gpus (default 64; 0 = all)
//! [sweep]     # dp = [...], gbs = [...], seq_len = [...]  (ga = gbs / dp), corpus = [...],
//!             # scheme = [...], pool_size = [...], tile = [[B, H], ...]
//! scheme = "ulysses"   # or "libra-tap" (TAP on loader-order pools), "libra-tap-vrsp",
//!                      # "libra" (TAP + VRSP + pipeliner)
//! [libra]     # pool_size (P, capped at DP), head_shards (H), tile_tokens (B), tau, chunks (M)
//! ```

use super::calfile::Prices;
use super::inputs::{read_input_text, MAX_SPEC_BYTES};
use crate::cost::profile::Kernel;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::balance::libra::LibraParams;
use crate::cluster::{Faults, Topology, TopologySpec, VarianceModel, VarianceSpec};
use crate::cost::{CostModel, ModelConfig};
use crate::engine::stub_net::StubNet;
use crate::error::{bail, invalid, Context, Result};
use crate::net::collective::CollectiveModel;
use crate::net::{AnalyticalModel, FlowModel, NetworkModel};
use crate::report::comm::cp_comm_busy;
use crate::report::step::{gpus_csv, microbatches_csv, ms, step_report, steps_csv, StepReport};
use crate::report::svg::{palette, Chart, Mark, Scale, Series};
use crate::report::trace::chrome_trace;
use crate::schedule::plan_step::{simulate_scheme_batch, StepAttention};
use crate::schedule::train::Workload;
use crate::schedule::{NoVariance, Parallelism, Placement, RankMap, RuntimeVariance};
use crate::workload::pack::Packing;
use crate::workload::PackedSeq;
use std::sync::Arc;

use super::{Files, Observer, Outcome};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TrainFile {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    description: String,
    model: String,
    #[serde(default)]
    calibration: Option<PathBuf>,
    #[serde(default = "one")]
    steps: u64,
    cluster: ClusterSpec,
    #[serde(default)]
    network: NetSpec,
    parallel: Parallelism,
    workload: WorkloadSpec,
    #[serde(default)]
    output: OutputSpec,
    #[serde(default)]
    sweep: Option<SweepSpec>,
    /// Runtime variance (absent: none), seeded with `[workload] seed`.
    #[serde(default)]
    variance: Option<VarianceSpec>,
    /// The attention scheme (default `ulysses`).
    #[serde(default)]
    scheme: Option<String>,
    /// Libra's settings (for the `libra*` schemes).
    #[serde(default)]
    libra: Option<LibraSpec>,
}

/// `[cluster]`: the cluster the layout runs on. Every point's TP × CP × DP × PP must cover
/// its GPUs exactly unless `allow_subset` lets a point leave some idle (a DP sweep on the
/// cluster of its largest point).
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct ClusterSpec {
    gpus_per_node: u32,
    nodes: u32,
    #[serde(default)]
    allow_subset: bool,
    /// The GPU (a built-in name or a GPU file, relative to the experiment); absent: the
    /// topology's `gpu`, else `h200`.
    #[serde(default)]
    gpu: Option<String>,
}

impl ClusterSpec {
    fn placement(&self) -> Placement {
        Placement::new(self.gpus_per_node, self.nodes)
    }

    /// Refuse a layout that does not cover the cluster (or, with `allow_subset`, exceeds it),
    /// saying which DP would.
    fn check_covers(&self, par: &Parallelism, file: &str) -> Result<()> {
        for (name, v) in [("gpus_per_node", self.gpus_per_node), ("nodes", self.nodes)] {
            if v == 0 {
                return Err(invalid(
                    format!("{file}: [cluster] {name}"),
                    0,
                    "at least 1",
                ));
            }
        }
        let have = u64::from(self.gpus_per_node) * u64::from(self.nodes);
        let gpus = par.gpus();
        if gpus == have || (self.allow_subset && gpus < have) {
            return Ok(());
        }
        let (tp, cp, dp, pp) = (par.tp, par.cp, par.dp, par.pp);
        let rest = u64::from(tp) * u64::from(cp) * u64::from(pp);
        let fix = if have % rest == 0 {
            format!("dp = {} at this TP, CP and PP", have / rest)
        } else {
            format!("TP × CP × PP = {rest} does not divide {have}: change them")
        };
        bail!(
            "{file}: [parallel] tp × cp × dp × pp = {tp} × {cp} × {dp} × {pp} = {gpus} GPUs \
             (EP {} groups fold over them, adding none) but [cluster] has {} nodes × {} = {have}: \
             allowed is a layout of exactly {have} GPUs ({fix}){}",
            par.ep,
            self.nodes,
            self.gpus_per_node,
            if gpus < have {
                ", or `[cluster] allow_subset = true` to leave the rest idle"
            } else {
                ""
            }
        )
    }
}

/// `[libra]`: Libra's knobs; CP comes from `[parallel]`, the shape from the model.
#[derive(Serialize, Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields, default)]
struct LibraSpec {
    pool_size: u32,
    head_shards: u32,
    tile_tokens: u32,
    tau: f64,
    chunks: u32,
}

impl Default for LibraSpec {
    fn default() -> Self {
        let d = LibraParams::default();
        Self {
            pool_size: d.pool_size,
            head_shards: d.head_shards,
            tile_tokens: d.tile_tokens,
            tau: d.tau,
            chunks: d.chunks,
        }
    }
}

fn one() -> u64 {
    1
}

#[derive(Deserialize, Serialize, Clone)]
#[serde(deny_unknown_fields, default)]
pub(super) struct NetSpec {
    /// `stub` (fixed alpha + bytes/bandwidth, the default without a topology),
    /// `analytical` (the default with one) or `flow`.
    model: Option<String>,
    /// A topology file (relative to the experiment file), e.g.
    /// `../topologies/dgx-h200-roce.toml`; built with `[cluster] nodes` nodes.
    topology: Option<PathBuf>,
    alpha_us: f64,
    intra_gbytes_per_s: f64,
    inter_gbytes_per_s: f64,
    /// NVLink SHARP for collectives where the topology has it (`false`: the cluster runs
    /// with NCCL_NVLS_ENABLE=0).
    nvls: bool,
}

impl Default for NetSpec {
    fn default() -> Self {
        Self {
            model: None,
            topology: None,
            alpha_us: 5.0,
            intra_gbytes_per_s: 450.0,
            inter_gbytes_per_s: 50.0,
            nvls: true,
        }
    }
}

/// The network a point's steps run on.
#[derive(Clone)]
pub(super) enum NetChoice {
    Stub(NetSpec),
    Analytical(Arc<Topology>),
    Flow(Arc<Topology>),
}

impl NetChoice {
    pub(super) fn make(&self, gpus_per_node: u32) -> Box<dyn NetworkModel> {
        match self {
            NetChoice::Stub(n) => Box::new(StubNet::new(
                gpus_per_node,
                (n.alpha_us * 1e6).round() as u64,
                n.intra_gbytes_per_s * 1e9,
                n.inter_gbytes_per_s * 1e9,
            )),
            NetChoice::Analytical(t) => Box::new(AnalyticalModel::new(t.clone())),
            NetChoice::Flow(t) => Box::new(FlowModel::new(t.clone())),
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            NetChoice::Stub(n) => format!(
                "stand-in (alpha {} us, {} GB/s in a node, {} GB/s across, no contention)",
                n.alpha_us, n.intra_gbytes_per_s, n.inter_gbytes_per_s
            ),
            NetChoice::Analytical(t) => {
                format!("analytical over `{}` ({} nodes)", t.spec.name, t.nodes)
            }
            NetChoice::Flow(t) => format!(
                "flow-level max-min over `{}` ({} nodes)",
                t.spec.name, t.nodes
            ),
        }
    }
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct WorkloadSpec {
    /// Every point's L unless `[sweep] seq_len` lists them; absent: each corpus's own.
    #[serde(default)]
    seq_len: Option<u32>,
    #[serde(default)]
    seed: u64,
    #[serde(default)]
    sequences: Option<Vec<Vec<u32>>>,
    /// A corpus spec (`libra-1m`, `wlbllm`, a parametric spec); see `skewsim corpus`.
    #[serde(default)]
    corpus: Option<String>,
    /// `sequential` (default), `best-fit` or `best-fit:W`.
    #[serde(default)]
    packing: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct OutputSpec {
    /// The step whose trace.json and gpus.csv are written.
    trace_step: u64,
    /// GPUs in the trace (the first N; 0 = all). Default 64: a 4,096-GPU trace is ~1 GB.
    trace_gpus: u32,
}

impl Default for OutputSpec {
    fn default() -> Self {
        Self {
            trace_step: 0,
            trace_gpus: 64,
        }
    }
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields, default)]
struct SweepSpec {
    dp: Vec<u32>,
    gbs: Vec<u32>,
    seq_len: Vec<u32>,
    /// Corpora to sweep (each at `seq_len`, or at its own default sequence length).
    corpus: Vec<String>,
    /// Schemes to sweep.
    scheme: Vec<String>,
    /// Libra pool sizes P to sweep.
    pool_size: Vec<u32>,
    /// Libra tile shapes [B, H] to sweep.
    tile: Vec<[u32; 2]>,
}

fn workload(w: &WorkloadSpec, seq_len: u32, file: &str) -> Result<Workload> {
    let wl = match (&w.sequences, &w.corpus) {
        (None, Some(c)) => Workload::Corpus {
            corpus: super::inputs::load_corpus(c).with_context(|| format!("{file}: [workload] corpus"))?,
            seq_len,
            packing: w
                .packing
                .as_deref()
                .unwrap_or("sequential")
                .parse::<Packing>()
                .with_context(|| format!("{file}: [workload] packing"))?,
            seed: w.seed,
        },
        (Some(seqs), None) => Workload::Sequences(
            seqs.iter()
                .map(|lens| PackedSeq::from_lengths(lens, seq_len, 0))
                .collect(),
        ),
        _ => bail!("{file}: [workload] needs exactly one of `corpus` (a built-in, a trace or a parametric spec such as `lognormal:median=800,p99=30000`) or `sequences`"),
    };
    wl.validate(&format!("{file}: [workload]"))?;
    Ok(wl)
}

/// Everything one point of the experiment produced; lossless through a format whose
/// floats read back exactly (TOML: [`super::sweep::PointResult`]).
#[derive(Serialize, Deserialize)]
pub struct PointResult {
    dp: u32,
    ga: u32,
    seq_len: u32,
    corpus: String,
    steps: Vec<StepReport>,
    trace: Option<String>,
    gpus: Option<String>,
    placement: String,
    scheme: String,
    libra: LibraSpec,
    /// Mean per-GPU compute, CP-communication (hidden or not) and exposed-communication
    /// time over the steps, ps.
    compute: f64,
    cp_comm: f64,
    exposed: f64,
}

/// Simulate one point's steps; `out` (a file without `[sweep]`, whose only point writes
/// them) asks for its step's trace and per-GPU table.
#[allow(clippy::too_many_arguments)]
fn run_point(
    scheme: &StepAttention,
    cost: &CostModel,
    par: Parallelism,
    place: Placement,
    wl: &Workload,
    net: &NetChoice,
    var: Option<(VarianceSpec, u64, Faults)>,
    steps: u64,
    out: Option<&OutputSpec>,
    file: &str,
) -> Result<PointResult> {
    let map = RankMap::new(par, place, file)?;
    let vm = var
        .map(|(spec, seed, faults)| VarianceModel::new(spec, seed, map.gpus()).with_faults(faults));
    let variance: &dyn RuntimeVariance = match &vm {
        Some(v) => v,
        None => &NoVariance,
    };
    let mut reports = Vec::new();
    let (mut trace, mut gpus) = (None, None);
    let mut batches = wl.batches((par.dp * par.ga) as usize)?;
    let (mut compute, mut cp_comm, mut exposed) = (0.0, 0.0, 0.0);
    for step in 0..steps {
        let seqs = batches
            .next()
            .with_context(|| format!("{file}: the corpus ran out of documents at step {step}"))?;
        let mut network = net.make(place.gpus_per_node);
        let (sg, t) =
            simulate_scheme_batch(scheme, cost, map, seqs, step, network.as_mut(), variance)
                .with_context(|| format!("{file}: step {step}"))?;
        let r = step_report(&sg, &t, cost, step);
        let n = r.gpus.len().max(1) as f64;
        let busy = cp_comm_busy(&sg, &t);
        compute += r.gpus.iter().map(|g| g.compute as f64).sum::<f64>() / n;
        exposed += r.gpus.iter().map(|g| g.exposed_comm as f64).sum::<f64>() / n;
        cp_comm += busy.iter().map(|&b| b as f64).sum::<f64>() / n;
        if let Some(out) = out.filter(|o| o.trace_step == step) {
            trace = Some(chrome_trace(&sg, &t, out.trace_gpus));
            gpus = Some(gpus_csv(&r));
        }
        reports.push(r);
    }
    Ok(PointResult {
        dp: par.dp,
        ga: par.ga,
        seq_len: 0,
        corpus: String::new(),
        steps: reports,
        trace,
        gpus,
        placement: map.describe(),
        scheme: scheme.name().to_string(),
        libra: LibraSpec::default(),
        compute: compute / steps.max(1) as f64,
        cp_comm: cp_comm / steps.max(1) as f64,
        exposed: exposed / steps.max(1) as f64,
    })
}

/// (corpus, sequence length, GBS): one line of scaling.svg.
type CurveKey = (String, u32, u32);

/// A point's per-step figures as its tables print them: means over its steps, and the
/// most ranks any step found over the GPU's memory.
struct StepMeans {
    /// Tokens per second.
    tps: f64,
    /// Iteration time, ms.
    it: f64,
    mfu: f64,
    wait: f64,
    comm: f64,
    inf: u32,
}

impl StepMeans {
    fn of(r: &PointResult) -> StepMeans {
        StepMeans {
            tps: mean(r.steps.iter().map(|s| s.tokens_per_s)),
            it: mean(r.steps.iter().map(|s| s.iteration as f64 * 1e-9)),
            mfu: mean(r.steps.iter().map(|s| s.mfu)),
            wait: mean(r.steps.iter().map(|s| s.wait_fraction)),
            comm: mean(r.steps.iter().map(|s| s.exposed_comm_fraction)),
            inf: r
                .steps
                .iter()
                .map(|s| s.infeasible_ranks)
                .max()
                .unwrap_or(0),
        }
    }
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |a, x| (a.0 + x, a.1 + 1));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

/// Topologies shipped in `topologies/`, by name, for `topology = "NAME"`.
pub(super) const BUILTIN_TOPOLOGIES: &[(&str, &str)] = &[(
    "dgx-h200-roce",
    include_str!("../../topologies/dgx-h200-roce.toml"),
)];

/// Run a `train` experiment from its text; `file` names it in messages, `title` heads the
/// summary, relative paths inside it resolve against `base`.
/// The file as `run` reads it: unknown and mistyped fields refused, and no zero in a
/// `[sweep]` list of degrees, batch sizes or lengths.
fn parse(text: &str, file: &str) -> Result<TrainFile> {
    let f: TrainFile =
        toml::from_str(text).with_context(|| format!("{file}: not a valid `train` experiment"))?;
    if let Some(s) = &f.sweep {
        for (k, v) in [("dp", &s.dp), ("gbs", &s.gbs), ("seq_len", &s.seq_len)] {
            if v.contains(&0) {
                return Err(invalid(
                    format!("[sweep] {k}"),
                    format!("{v:?}"),
                    "every entry ≥ 1",
                ))
                .context(file);
            }
        }
    }
    let dps = match &f.sweep {
        Some(s) if !s.dp.is_empty() => s.dp.clone(),
        _ => vec![f.parallel.dp],
    };
    for dp in dps {
        let par = Parallelism { dp, ..f.parallel };
        par.validate(&format!("{file}: [parallel]"))?;
        f.cluster.check_covers(&par, file)?;
    }
    Ok(f)
}

/// Check `text` against the `train` schema (as [`super::run_text`] does) without running it.
pub fn check(text: &str, file: &str) -> Result<()> {
    parse(text, file).map(|_| ())
}

/// Run the `train` experiment `text`; `file` names it in messages, `title` heads the
/// summary, relative paths resolve against `base`; `calibration` replaces the file's own.
pub fn run_text(
    text: &str,
    file: &str,
    title: &str,
    base: &Path,
    calibration: Prices,
    observer: &dyn Observer,
) -> Result<Outcome> {
    let sweep = Sweep::new(text, file, title, base, calibration)?;
    let results = super::sweep::run_points(sweep.len(), observer, |i| sweep.run_point(i))?;
    sweep.finish(&results)
}

/// A `train` experiment split into its points: point `i` is one (attention variant, grid
/// point), variants outermost, run by [`Sweep::run_point`] alone — in any order, thread,
/// process or machine — and [`Sweep::finish`] writes from all of them the files
/// [`run_text`] writes. A file without `[sweep]` is one point.
pub struct Sweep {
    f: TrainFile,
    file: String,
    title: String,
    setup: Setup,
    points: Vec<GridPoint>,
    variants: Vec<(String, LibraSpec)>,
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
        let setup = setup(&f, file, base, calibration)?;
        let points = grid(&f, file)?;
        let variants = variants(&f, &setup, file)?;
        Ok(Sweep {
            f,
            file: file.to_string(),
            title: title.to_string(),
            setup,
            points,
            variants,
        })
    }

    /// How many points: attention variants × grid points.
    pub fn len(&self) -> usize {
        self.variants.len() * self.points.len()
    }

    /// Whether the sweep has no points.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn job(&self, i: usize) -> (&GridPoint, &(String, LibraSpec)) {
        let n = self.points.len();
        (&self.points[i % n], &self.variants[i / n])
    }

    /// Point `i` in words (`scheme S [P p B b H h] corpus C L l DP d GA g`), for messages.
    pub fn describe(&self, i: usize) -> String {
        let ((dp, ga, l, c), (sc, lv)) = self.job(i);
        let corpus = c.as_ref().or(self.f.workload.corpus.as_ref());
        let knobs = if sc == "ulysses" {
            String::new()
        } else {
            format!(
                " P {} B {} H {}",
                lv.pool_size, lv.tile_tokens, lv.head_shards
            )
        };
        format!(
            "scheme {sc}{knobs} corpus {} L {l} DP {dp} GA {ga}",
            corpus.map_or("(sequences)", String::as_str)
        )
    }

    /// Simulate sweep point `i` (in `0..len()`).
    pub fn run_point(&self, i: usize) -> Result<PointResult> {
        if i >= self.len() {
            return Err(invalid(
                "sweep point",
                i,
                format!(
                    "0..={} ({} points)",
                    self.len().saturating_sub(1),
                    self.len()
                ),
            ));
        }
        let (f, file) = (&self.f, self.file.as_str());
        let Setup {
            cost,
            rank_shape,
            cluster,
            net,
            variance,
            ..
        } = &self.setup;
        let ((dp, ga, l, c), (sc, lv)) = self.job(i);
        let (dp, ga, l) = (*dp, *ga, *l);
        let scheme = StepAttention::parse(
            sc,
            LibraParams {
                pool_size: lv.pool_size,
                cp: f.parallel.cp,
                head_shards: lv.head_shards,
                tile_tokens: lv.tile_tokens,
                tau: lv.tau,
                chunks: lv.chunks,
                shape: *rank_shape,
            },
        )?;
        let mut spec = f.workload.clone();
        if let Some(c) = c {
            spec.corpus = Some(c.clone());
        }
        let wl = workload(&spec, l, file)?;
        let par = Parallelism {
            dp,
            ga,
            ..f.parallel
        };
        let mut r = run_point(
            &scheme,
            cost,
            par,
            *cluster,
            &wl,
            net,
            variance.clone(),
            f.steps,
            f.sweep.is_none().then_some(&f.output),
            file,
        )?;
        r.seq_len = l;
        r.libra = *lv;
        r.corpus = c
            .clone()
            .or_else(|| f.workload.corpus.clone())
            .unwrap_or_default();
        Ok(r)
    }

    /// The files of the run from every point's result (`results[i]` point `i`'s), checked
    /// to be this sweep's points in order.
    pub fn finish(&self, results: &[PointResult]) -> Result<Outcome> {
        let (f, setup) = (&self.f, &self.setup);
        if results.len() != self.len() {
            return Err(invalid(
                "sweep point results",
                results.len(),
                format!("one per point ({})", self.len()),
            ))
            .context(self.file.as_str());
        }
        for (i, r) in results.iter().enumerate() {
            let ((dp, ga, l, _), (sc, lv)) = self.job(i);
            let lr = &r.libra;
            if (r.dp, r.ga, r.seq_len, &r.scheme) != (*dp, *ga, *l, sc)
                || (lr.pool_size, lr.tile_tokens, lr.head_shards)
                    != (lv.pool_size, lv.tile_tokens, lv.head_shards)
            {
                return Err(invalid(
                    format!("sweep point {i}'s result"),
                    format!(
                        "scheme {} P {} B {} H {} L {} DP {} GA {}",
                        r.scheme,
                        r.libra.pool_size,
                        r.libra.tile_tokens,
                        r.libra.head_shards,
                        r.seq_len,
                        r.dp,
                        r.ga
                    ),
                    format!("the sweep's point {i}: {}", self.describe(i)),
                ))
                .context(self.file.as_str());
            }
        }
        let mut files = Files::default();
        let mut summary = summary_head(f, setup, &self.title);
        let table = if f.sweep.is_none() {
            single_point(f, &setup.cost, &results[0], &mut files, &mut summary)?
        } else if is_multi(f) {
            multi_tables(results, &f.parallel, &mut files)?
        } else {
            scaling(f, results, &mut files)?
        };
        summary += &table;
        files.write("summary.md", &summary);
        Ok(Outcome {
            kind: f.kind.clone(),
            files: files.0,
            points_file: if f.sweep.is_none() {
                "steps.csv"
            } else {
                "points.csv"
            },
            summary,
            json: None,
        })
    }
}

/// What every point of a `train` experiment shares: the cost model, one TP rank's attention
/// shape, the cluster, the network and the runtime variance.
struct Setup {
    cost: CostModel,
    /// The summary's line on the GPU (empty on the H200's measured models).
    gpu_note: String,
    rank_shape: crate::cost::AttnShape,
    cluster: Placement,
    net: NetChoice,
    variance: Option<(VarianceSpec, u64, Faults)>,
}

/// Read the model, calibration and topology `f` names (relative to `path`) and check its
/// steps, output and network.
fn setup(f: &TrainFile, file: &str, path: &Path, calibration: Prices) -> Result<Setup> {
    let model = if f.model.ends_with(".toml") {
        let p = path.join(&f.model);
        let t = read_input_text(&p, MAX_SPEC_BYTES)
            .with_context(|| format!("{file}: reading model {}", p.display()))?;
        ModelConfig::from_toml_str(&t, &p.display().to_string())?
    } else {
        ModelConfig::builtin(&f.model).with_context(|| format!("{file}: model"))?
    };
    let cal_path = match (calibration, &f.calibration) {
        ((Some(flag), _), _) => Some(flag.to_path_buf()),
        ((None, None), Some(c)) => Some(path.join(c)),
        ((None, _), _) => None,
    };
    let kernel = calibration.1.unwrap_or(Kernel::DEFAULT);
    let cost = super::calfile::cost_model(model, cal_path.as_deref(), kernel)
        .with_context(|| format!("{file}: calibration"))?;
    if f.steps == 0 || f.steps > 10_000 {
        return Err(invalid("steps", f.steps, "an integer in 1..=10000")).context(file);
    }
    if f.output.trace_step >= f.steps {
        return Err(invalid(
            "[output] trace_step",
            f.output.trace_step,
            format!("a simulated step, 0..{}", f.steps),
        ))
        .context(file);
    }
    for (k, v) in [
        ("alpha_us", f.network.alpha_us),
        ("intra_gbytes_per_s", f.network.intra_gbytes_per_s),
        ("inter_gbytes_per_s", f.network.inter_gbytes_per_s),
    ] {
        if !(v.is_finite() && v >= 0.0) || (k != "alpha_us" && v == 0.0) {
            return Err(invalid(
                format!("[network] {k}"),
                v,
                "a finite positive number",
            ))
            .context(file);
        }
    }
    let topo = match &f.network.topology {
        None => None,
        Some(t) => {
            let p = path.join(t);
            let builtin = BUILTIN_TOPOLOGIES
                .iter()
                .find(|(n, _)| Path::new(n) == t.as_path() && !p.exists());
            let (name, text) = match builtin {
                Some((n, body)) => (format!("topologies/{n}.toml"), (*body).to_string()),
                None => {
                    let name = p.display().to_string();
                    let text = read_input_text(&p, MAX_SPEC_BYTES)
                        .with_context(|| format!("{file}: reading topology {name}"))?;
                    (name, text)
                }
            };
            let spec = TopologySpec::parse(&text, &name)?;
            if spec.gpus_per_node != f.cluster.gpus_per_node {
                return Err(invalid(
                    "[cluster] gpus_per_node",
                    f.cluster.gpus_per_node,
                    format!("topology {name}'s {}", spec.gpus_per_node),
                ))
                .context(file);
            }
            Some(Arc::new(spec.build(Some(f.cluster.nodes))?))
        }
    };
    let gpu = super::calfile::run_gpu(
        f.cluster.gpu.as_deref(),
        "[cluster] gpu",
        topo.as_ref().map(|t| &t.spec),
        path,
    )
    .context(file)?;
    let cost = super::calfile::on_gpu(&cost, cal_path.is_some(), &gpu, f.parallel.precision)
        .context(file)?;
    // Planners balance one TP rank's heads.
    let rank_shape = cost
        .tp_shard(f.parallel.tp, f.parallel.ep)
        .with_context(|| format!("{file}: [parallel]"))?
        .attn();
    let cluster = match &topo {
        Some(t) => f
            .cluster
            .placement()
            .with_collectives(CollectiveModel::of(t, f.network.nvls)),
        None => f.cluster.placement(),
    };
    let net = match (f.network.model.as_deref(), &topo) {
        (None | Some("stub"), None) | (Some("stub"), Some(_)) => NetChoice::Stub(f.network.clone()),
        (None | Some("analytical"), Some(t)) => NetChoice::Analytical(t.clone()),
        (Some("flow"), Some(t)) => NetChoice::Flow(t.clone()),
        (Some(m @ ("analytical" | "flow")), None) => {
            return Err(invalid(
                "[network] model",
                format!("{m:?}"),
                "stub without a `topology` file; analytical or flow with one",
            ))
            .context(file)
        }
        (Some(m), _) => {
            return Err(invalid(
                "[network] model",
                format!("{m:?}"),
                "one of stub, analytical, flow",
            ))
            .context(file)
        }
    };
    let faults = match (&topo, topo.as_ref().and_then(|t| t.spec.faults.clone())) {
        (Some(t), Some(fs)) => fs.resolve(t, file)?,
        _ => Faults::default(),
    };
    let variance = match &f.variance {
        None => None,
        Some(v) => {
            v.validate(file)?;
            Some((*v, f.workload.seed, faults))
        }
    };
    Ok(Setup {
        gpu_note: super::calfile::gpu_note(&gpu, &cost),
        cost,
        rank_shape,
        cluster,
        net,
        variance,
    })
}

/// A point of the grid: (dp, ga, seq_len, corpus).
type GridPoint = (u32, u32, u32, Option<String>);

/// The L of a point of `corpus` (the workload's when `None`) without `[sweep] seq_len`:
/// `[workload] seq_len` when given, else the corpus's own.
fn corpus_len(f: &TrainFile, corpus: Option<&str>, file: &str) -> Result<u32> {
    if let Some(l) = f.workload.seq_len {
        return Ok(l);
    }
    let Some(c) = corpus.or(f.workload.corpus.as_deref()) else {
        return Err(invalid(
            "[workload] seq_len",
            "none",
            "a sequence length L for the sequences",
        ))
        .context(file);
    };
    let corpus = super::inputs::load_corpus(c).with_context(|| format!("{file}: corpus {c}"))?;
    corpus
        .default_seq_len()
        .ok_or_else(|| {
            invalid(
                "[workload] seq_len",
                "none",
                format!("a sequence length L: corpus {c} has no L of its own"),
            )
        })
        .context(file)
}

/// The grid of points.
fn grid(f: &TrainFile, file: &str) -> Result<Vec<GridPoint>> {
    let mut points: Vec<GridPoint> = Vec::new();
    match &f.sweep {
        None => points.push((
            f.parallel.dp,
            f.parallel.ga,
            corpus_len(f, None, file)?,
            None,
        )),
        Some(s) => {
            let dps = if s.dp.is_empty() {
                vec![f.parallel.dp]
            } else {
                s.dp.clone()
            };
            let gbss = if s.gbs.is_empty() {
                vec![f.parallel.dp * f.parallel.ga]
            } else {
                s.gbs.clone()
            };
            let corpora: Vec<Option<String>> = if s.corpus.is_empty() {
                vec![None]
            } else {
                s.corpus.iter().cloned().map(Some).collect()
            };
            for c in &corpora {
                let lens = if s.seq_len.is_empty() {
                    vec![corpus_len(f, c.as_deref(), file)?]
                } else {
                    s.seq_len.clone()
                };
                for &l in &lens {
                    for &g in &gbss {
                        for &d in &dps {
                            if d == 0 || g % d != 0 {
                                return Err(invalid(
                                    "[sweep] gbs",
                                    g,
                                    format!("a multiple of dp = {d} (ga = gbs / dp)"),
                                ))
                                .context(file);
                            }
                            super::sweep::check_points(points.len() + 1, file)?;
                            points.push((d, g / d, l, c.clone()));
                        }
                    }
                }
            }
        }
    }
    Ok(points)
}

/// Whether the file compares attention variants (a scheme, Libra settings or a sweep of them).
fn is_multi(f: &TrainFile) -> bool {
    f.scheme.is_some()
        || f.libra.is_some()
        || f.sweep
            .as_ref()
            .is_some_and(|s| !(s.scheme.is_empty() && s.pool_size.is_empty() && s.tile.is_empty()))
}

/// Attention variants: (scheme, Libra settings), outermost so tables group by scheme.
fn variants(f: &TrainFile, setup: &Setup, file: &str) -> Result<Vec<(String, LibraSpec)>> {
    let rank_shape = setup.rank_shape;
    let lib = f.libra.unwrap_or_default();
    let sw = f.sweep.clone().unwrap_or_default();
    let schemes = if sw.scheme.is_empty() {
        vec![f.scheme.clone().unwrap_or_else(|| "ulysses".into())]
    } else {
        sw.scheme.clone()
    };
    let pools = if sw.pool_size.is_empty() {
        vec![lib.pool_size]
    } else {
        sw.pool_size.clone()
    };
    let tiles = if sw.tile.is_empty() {
        vec![[lib.tile_tokens, lib.head_shards]]
    } else {
        sw.tile.clone()
    };
    let mut variants: Vec<(String, LibraSpec)> = Vec::new();
    for sc in &schemes {
        StepAttention::parse(sc, LibraParams::default())
            .with_context(|| format!("{file}: scheme"))?;
        if sc == "ulysses" {
            variants.push((sc.clone(), lib));
            continue;
        }
        for &pool_size in &pools {
            for &[tile_tokens, head_shards] in &tiles {
                let v = LibraSpec {
                    pool_size,
                    tile_tokens,
                    head_shards,
                    ..lib
                };
                LibraParams {
                    pool_size,
                    cp: f.parallel.cp,
                    head_shards,
                    tile_tokens,
                    tau: v.tau,
                    chunks: v.chunks,
                    shape: rank_shape,
                }
                .validate()
                .with_context(|| format!("{file}: [libra] / [sweep]"))?;
                variants.push((sc.clone(), v));
            }
        }
    }
    Ok(variants)
}

/// The summary's title, description and the setup every point shares.
fn summary_head(f: &TrainFile, setup: &Setup, title: &str) -> String {
    let (cost, net) = (&setup.cost, &setup.net);
    let mut summary = format!("# {title}\n\n");
    if !f.description.is_empty() {
        summary += &format!("{}\n\n", f.description.trim());
    }
    summary += &setup.gpu_note;
    let m = &cost.model;
    summary +=
        &format!(
        "Model `{}`; cluster {} nodes x {} GPUs; PP {}, CP {}, {} pipeline; {} step(s) per point. \
         Network: {}. Runtime variance: {}.\n\n",
        m.name,
        f.cluster.nodes,
        f.cluster.gpus_per_node,
        f.parallel.pp,
        f.parallel.cp,
        if f.parallel.pipeline == crate::schedule::PipelineKind::Gpipe {
            "GPipe"
        } else {
            "1F1B"
        },
        f.steps,
        net.describe(),
        match &f.variance {
            None => "none".to_string(),
            Some(v) => format!(
                "persistent {:?}, per-kernel jitter {:?}, spikes {}; seed {}",
                v.persistent,
                v.jitter,
                v.spike.map_or("none".to_string(), |k| format!("p = {}, mean +{}", k.prob, k.mean)),
                f.workload.seed
            ),
        }
    );
    if f.parallel.tp > 1 || f.parallel.ep > 1 {
        summary += &format!(
            "Tensor parallelism TP {} (sequence parallel: {}, TP communication overlapped: {}) \
             innermost in each node; expert parallelism EP {} (dispatch and combine all-to-alls \
             per MoE layer; expert gradients reduced over each expert-data-parallel group). Every \
             scheme balances one TP rank's h_q/TP heads.\n\n",
            f.parallel.tp, f.parallel.sp, f.parallel.tp_overlap, f.parallel.ep
        );
    }
    summary
}

/// One point's files (steps, micro-batches, trace, GPUs) and its summary: placement,
/// forward spread, peak memory; returns the per-step table.
fn single_point(
    f: &TrainFile,
    cost: &CostModel,
    r: &PointResult,
    files: &mut Files,
    summary: &mut String,
) -> Result<String> {
    files.write("steps.csv", steps_csv(&r.steps));
    files.write("microbatches.csv", microbatches_csv(&r.steps));
    let mut fwd: Vec<f64> = r
        .steps
        .iter()
        .flat_map(|st| st.microbatches.iter().filter(|m| m.stage == 0))
        .map(|m| m.fwd_span as f64 * 1e-9)
        .collect();
    if fwd.len() > 1 {
        let mean_fwd = mean(fwd.iter().copied()).max(f64::MIN_POSITIVE);
        fwd.sort_by(f64::total_cmp);
        let pts = fwd
            .iter()
            .enumerate()
            .map(|(i, &x)| ((i + 1) as f64 / fwd.len() as f64, x / mean_fwd))
            .collect();
        let ch = Chart::new("Micro-batch forward time (stage 0), normalised to the mean")
            .x("fraction of micro-batches", Scale::Linear)
            .y("forward time / mean", Scale::Linear)
            .series(Series::new("Ulysses", pts, Mark::LinePoints).color(palette(0)));
        files.write("microbatches.svg", ch.render());
    }
    if let Some(t) = &r.trace {
        files.write("trace.json", t);
    }
    if let Some(g) = &r.gpus {
        files.write("gpus.csv", g);
    }
    *summary += &format!("```\n{}```\n\n", r.placement);
    let fwd: Vec<f64> = r
        .steps
        .iter()
        .flat_map(|s| s.microbatches.iter().filter(|m| m.stage == 0))
        .map(|m| m.fwd_span as f64 * 1e-9)
        .collect();
    if !fwd.is_empty() {
        let mean_fwd = mean(fwd.iter().copied());
        let (lo, hi) = fwd
            .iter()
            .fold((f64::INFINITY, 0.0f64), |a, &x| (a.0.min(x), a.1.max(x)));
        *summary += &format!(
            "Micro-batch forward time on stage 0 over {} micro-batches: min {lo:.1} ms, mean {mean_fwd:.1} ms, max {hi:.1} ms (normalised to the mean: {:.2} .. {:.2}).\n\n",
            fwd.len(),
            lo / mean_fwd,
            hi / mean_fwd
        );
    }
    if let Some(step) = r.steps.iter().find(|s| s.step == f.output.trace_step) {
        if let Some(g) = step
            .gpus
            .iter()
            .max_by_key(|g| (g.memory.total(), std::cmp::Reverse(g.gpu)))
        {
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            let m = g.memory;
            *summary += &format!(
                "Peak memory (step {}): GPU {} needs {:.1} GiB of {:.1} GiB — weights {:.1}, grads {:.1}, optimizer {:.1}, activations {:.1}, attention buffers {:.1}, comm buffers {:.1}.{}\n\n",
                step.step,
                g.gpu,
                gib(m.total()),
                gib(cost.hw.memory_bytes),
                gib(m.weights),
                gib(m.grads),
                gib(m.optimizer),
                gib(m.activations),
                gib(m.attn_buffers),
                gib(m.comm_buffers),
                if step.infeasible_ranks > 0 {
                    format!(" **INFEASIBLE: {} rank(s) exceed the GPU's memory.**", step.infeasible_ranks)
                } else {
                    String::new()
                }
            );
        }
    }
    let mut t = String::from("| step | iteration (ms) | tokens/s | MFU | sync wait | exposed comm | bubble | straggler GPU (excess) | infeasible ranks |\n|---|---|---|---|---|---|---|---|---|\n");
    for s in &r.steps {
        writeln!(
            t,
            "| {} | {} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} | {} (+{:.1}%) | {} |",
            s.step,
            ms(s.iteration),
            s.tokens_per_s,
            s.mfu,
            s.wait_fraction,
            s.exposed_comm_fraction,
            s.bubble_fraction,
            s.straggler_gpu,
            100.0 * s.straggler_excess,
            s.infeasible_ranks
        )?;
    }
    Ok(t)
}

/// A Ulysses sweep: `points.csv`, the scaling table and `scaling.svg` (efficiency against
/// the smallest DP of each corpus, L and GBS).
fn scaling(f: &TrainFile, results: &[PointResult], files: &mut Files) -> Result<String> {
    let mut csv = String::from("corpus,seq_len,gbs,dp,ga,gpus,mean_iteration_ms,tokens_per_s,mfu,wait_fraction,exposed_comm_fraction,speedup_vs_min_dp,scaling_efficiency,infeasible_ranks\n");
    let mut t = String::from("| corpus | L | GBS | DP | GA | GPUs | iteration (s) | tokens/s | MFU | sync wait | exposed comm | speedup | scaling eff. |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    // (corpus, L, GBS) → [(DP, scaling efficiency)] for scaling.svg, in input order.
    let mut curves: Vec<(CurveKey, Vec<(f64, f64)>)> = Vec::new();
    for r in results {
        let gbs = r.dp * r.ga;
        let base = results
            .iter()
            .filter(|b| b.seq_len == r.seq_len && b.corpus == r.corpus && b.dp * b.ga == gbs)
            .min_by_key(|b| b.dp)
            .map(|b| (b.dp, mean(b.steps.iter().map(|s| s.tokens_per_s))))
            .unwrap_or((r.dp, 1.0));
        let StepMeans {
            tps,
            it,
            mfu,
            wait,
            comm,
            inf,
        } = StepMeans::of(r);
        let speedup = tps / base.1;
        let eff = speedup / (f64::from(r.dp) / f64::from(base.0));
        let gpus = r.dp * f.parallel.pp * f.parallel.cp * f.parallel.tp;
        let key = (r.corpus.clone(), r.seq_len, gbs);
        match curves.iter_mut().find(|c| c.0 == key) {
            Some(c) => c.1.push((f64::from(r.dp), eff)),
            None => curves.push((key, vec![(f64::from(r.dp), eff)])),
        }
        writeln!(csv, "{},{},{gbs},{},{},{gpus},{it:.3},{tps:.1},{mfu:.6},{wait:.6},{comm:.6},{speedup:.4},{eff:.4},{inf}", r.corpus, r.seq_len, r.dp, r.ga)?;
        writeln!(t, "| {} | {} | {gbs} | {} | {} | {gpus} | {:.3} | {tps:.0} | {mfu:.3} | {wait:.3} | {comm:.3} | {speedup:.2}x | {:.1}% |", r.corpus, r.seq_len, r.dp, r.ga, it / 1e3, 100.0 * eff)?;
    }
    files.write("points.csv", csv);
    let dps: Vec<f64> = {
        let mut v: Vec<f64> = curves
            .iter()
            .flat_map(|c| c.1.iter().map(|p| p.0))
            .collect();
        v.sort_by(f64::total_cmp);
        v.dedup();
        v
    };
    if dps.len() > 1 {
        let mut ch = Chart::new("Ulysses scaling efficiency vs data parallelism")
            .x("DP (replicas)", Scale::Log)
            .x_range(dps[0], dps[dps.len() - 1])
            .x_ticks(dps)
            .y("scaling efficiency vs the smallest DP", Scale::Linear)
            .y_range(0.0, 1.05);
        for (i, ((corpus, l, gbs), pts)) in curves.iter().enumerate() {
            let name = if corpus.is_empty() {
                format!("L {}K, GBS {gbs}", l >> 10)
            } else {
                format!("{corpus}, GBS {gbs}")
            };
            ch = ch.series(Series::new(name, pts.clone(), Mark::LinePoints).color(palette(i)));
        }
        if f.sweep
            .as_ref()
            .is_some_and(|sw| sw.corpus.iter().any(|c| c == "libra-1m"))
        {
            ch = ch.series(
                Series::new("paper: 1M, DP 16", vec![(16.0, 0.276)], Mark::Ring).color("#000000"),
            );
        }
        files.write("scaling.svg", ch.render());
    }
    Ok(t)
}

/// The sweep tables of a multi-scheme run: `points.csv` (one row per point, with compute,
/// CP communication and exposed communication per GPU and the speedup over Ulysses at the
/// same DP), `microbatches.csv` (every micro-batch's forward span) and the Markdown tables.
fn multi_tables(results: &[PointResult], par: &Parallelism, files: &mut Files) -> Result<String> {
    let tps = |r: &PointResult| mean(r.steps.iter().map(|s| s.tokens_per_s));
    let eff_p = |r: &PointResult| {
        if r.scheme == "ulysses" {
            0
        } else {
            r.libra.pool_size.min(r.dp)
        }
    };
    let same_variant = |a: &PointResult, b: &PointResult| {
        a.scheme == b.scheme
            && (a.scheme == "ulysses"
                || (a.libra.pool_size == b.libra.pool_size
                    && a.libra.tile_tokens == b.libra.tile_tokens
                    && a.libra.head_shards == b.libra.head_shards))
    };
    let same_job = |a: &PointResult, b: &PointResult| {
        a.seq_len == b.seq_len && a.corpus == b.corpus && a.dp * a.ga == b.dp * b.ga
    };
    let mut csv = String::from("scheme,pool_size,tile_tokens,head_shards,chunks,corpus,seq_len,gbs,dp,ga,gpus,mean_iteration_ms,tokens_per_s,mfu,wait_fraction,exposed_comm_fraction,speedup_vs_min_dp,scaling_efficiency,vs_ulysses,compute_ms,cp_comm_ms,exposed_comm_ms,infeasible_ranks\n");
    let mut t = String::from("| scheme | P | B | H | corpus | L | GBS | DP | GA | iteration (s) | tokens/s | MFU | sync wait | exposed comm | speedup vs min DP | scaling eff. | vs Ulysses | compute (ms/GPU) | CP comm (ms/GPU) | exposed comm (ms/GPU) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut mbs = String::from("scheme,pool_size,tile_tokens,head_shards,corpus,seq_len,dp,ga,step,replica,stage,mb,fwd_ms\n");
    let mut mbt = String::from("\n\nMicro-batch forward time on stage 0 (first to last forward kernel of a replica's micro-batch), normalised to the mean of `libra` at the same corpus, L, GBS and DP (own mean when absent):\n\n| scheme | P | corpus | DP | GA | micro-batches | min | mean | max |\n|---|---|---|---|---|---|---|---|---|\n");
    let fwd = |r: &PointResult| -> Vec<f64> {
        r.steps
            .iter()
            .flat_map(|s| s.microbatches.iter().filter(|m| m.stage == 0))
            .map(|m| m.fwd_span as f64 * 1e-9)
            .collect()
    };
    for r in results {
        let gbs = r.dp * r.ga;
        let base = results
            .iter()
            .filter(|b| same_variant(b, r) && same_job(b, r))
            .min_by_key(|b| b.dp)
            .map(|b| (b.dp, tps(b)))
            .unwrap_or((r.dp, 1.0));
        let StepMeans {
            tps: rate,
            it,
            mfu,
            wait,
            comm,
            inf,
        } = StepMeans::of(r);
        let speedup = rate / base.1;
        let eff = speedup / (f64::from(r.dp) / f64::from(base.0));
        let vs_u = results
            .iter()
            .find(|b| b.scheme == "ulysses" && same_job(b, r) && b.dp == r.dp)
            .map(|b| rate / tps(b));
        let gpus = r.dp * par.pp * par.cp;
        let (cm, cc, ce) = (r.compute * 1e-9, r.cp_comm * 1e-9, r.exposed * 1e-9);
        let (b, h) = if r.scheme == "ulysses" {
            (0, 0)
        } else {
            (r.libra.tile_tokens, r.libra.head_shards)
        };
        let m = if r.scheme == "libra" {
            r.libra.chunks
        } else {
            1
        };
        let vs = vs_u.map_or(String::new(), |v| format!("{v:.4}"));
        writeln!(csv, "{},{},{b},{h},{m},{},{},{gbs},{},{},{gpus},{it:.3},{:.1},{mfu:.6},{wait:.6},{comm:.6},{speedup:.4},{eff:.4},{vs},{cm:.3},{cc:.3},{ce:.3},{inf}", r.scheme, eff_p(r), r.corpus, r.seq_len, r.dp, r.ga, rate)?;
        writeln!(t, "| {} | {} | {b} | {h} | {} | {} | {gbs} | {} | {} | {:.3} | {:.0} | {mfu:.3} | {wait:.3} | {comm:.3} | {speedup:.2}x | {:.1}% | {} | {cm:.1} | {cc:.1} | {ce:.1} |", r.scheme, eff_p(r), r.corpus, r.seq_len, r.dp, r.ga, it / 1e3, rate, 100.0 * eff, vs_u.map_or("".into(), |v| format!("{v:.2}x")))?;
        for s in &r.steps {
            for mb in &s.microbatches {
                writeln!(
                    mbs,
                    "{},{},{b},{h},{},{},{},{},{},{},{},{},{:.3}",
                    r.scheme,
                    eff_p(r),
                    r.corpus,
                    r.seq_len,
                    r.dp,
                    r.ga,
                    s.step,
                    mb.replica,
                    mb.stage,
                    mb.mb,
                    mb.fwd_span as f64 * 1e-9
                )?;
            }
        }
        let own = fwd(r);
        if !own.is_empty() {
            // Libra at the same pool and tile settings when the sweep has it, else any.
            let libra_at = |b: &&PointResult| b.scheme == "libra" && same_job(b, r) && b.dp == r.dp;
            let norm = results
                .iter()
                .filter(libra_at)
                .find(|b| {
                    r.scheme == "ulysses"
                        || (b.libra.pool_size == r.libra.pool_size
                            && b.libra.tile_tokens == r.libra.tile_tokens
                            && b.libra.head_shards == r.libra.head_shards)
                })
                .or_else(|| results.iter().find(libra_at))
                .map(|b| mean(fwd(b).into_iter()))
                .unwrap_or_else(|| mean(own.iter().copied()));
            let (lo, hi) = own
                .iter()
                .fold((f64::INFINITY, 0.0f64), |a, &x| (a.0.min(x), a.1.max(x)));
            writeln!(
                mbt,
                "| {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} |",
                variant_label(r, true, true),
                eff_p(r),
                r.corpus,
                r.dp,
                r.ga,
                own.len(),
                lo / norm,
                mean(own.iter().copied()) / norm,
                hi / norm
            )?;
        }
    }
    files.write("points.csv", csv);
    files.write("microbatches.csv", mbs);
    multi_charts(results, files)?;
    Ok(t + &mbt)
}

/// A point's variant, for legends: the scheme, plus P, B and H when a sweep varies them.
fn variant_label(r: &PointResult, pools: bool, tiles: bool) -> String {
    let mut s = r.scheme.clone();
    if r.scheme != "ulysses" {
        if pools {
            s += &format!(" P={}", r.libra.pool_size.min(r.dp));
        }
        if tiles {
            s += &format!(" B={} H={}", r.libra.tile_tokens, r.libra.head_shards);
        }
    }
    s
}

/// SVG charts of a multi-scheme sweep, per corpus: tokens/s against DP
/// (`scaling-CORPUS.svg`, when DP varies), compute / CP communication / exposed
/// communication against P (`pool-CORPUS.svg`, when P varies), speedup over Ulysses
/// against tiles per sequence (`tiles-CORPUS.svg`, when B × H varies) and every
/// micro-batch's forward span at the largest DP, sorted, over the `libra` mean
/// (`microbatches-CORPUS.svg`).
fn multi_charts(results: &[PointResult], files: &mut Files) -> Result<()> {
    let mut corpora: Vec<&str> = results.iter().map(|r| r.corpus.as_str()).collect();
    corpora.dedup();
    corpora.sort_unstable();
    corpora.dedup();
    let distinct = |f: &dyn Fn(&PointResult) -> u64| {
        let mut v: Vec<u64> = results
            .iter()
            .filter(|r| r.scheme != "ulysses")
            .map(f)
            .collect();
        v.sort_unstable();
        v.dedup();
        v.len() > 1
    };
    let pools = distinct(&|r| u64::from(r.libra.pool_size));
    let tiles =
        distinct(&|r| (u64::from(r.libra.tile_tokens) << 32) | u64::from(r.libra.head_shards));
    for c in corpora {
        let rs: Vec<&PointResult> = results.iter().filter(|r| r.corpus == c).collect();
        let mut dps: Vec<u32> = rs.iter().map(|r| r.dp).collect();
        dps.sort_unstable();
        dps.dedup();
        if dps.len() > 1 {
            files.write(
                format!("scaling-{c}.svg"),
                scaling_chart(c, &rs, &dps, pools, tiles),
            );
        }
        if pools {
            files.write(format!("pool-{c}.svg"), pool_chart(c, &rs));
        }
        if tiles {
            files.write(format!("tiles-{c}.svg"), tiles_chart(c, &rs));
        }
        if let Some(&dmax) = dps.last() {
            if let Some(svg) = microbatch_chart(c, &rs, dmax, pools, tiles) {
                files.write(format!("microbatches-{c}.svg"), svg);
            }
        }
    }
    Ok(())
}

/// A point's mean tokens/s over its steps.
fn tokens_per_s(r: &PointResult) -> f64 {
    mean(r.steps.iter().map(|s| s.tokens_per_s))
}

/// Corpus `c`'s tokens/s against DP, a line per variant.
fn scaling_chart(c: &str, rs: &[&PointResult], dps: &[u32], pools: bool, tiles: bool) -> String {
    let mut labels: Vec<String> = Vec::new();
    for r in rs {
        let l = variant_label(r, pools, tiles);
        if !labels.contains(&l) {
            labels.push(l);
        }
    }
    let mut ch = Chart::new(format!("{c}: tokens/s against DP (CP fixed)"))
        .x("DP replicas", Scale::Log)
        .x_ticks(dps.iter().map(|&d| f64::from(d)).collect())
        .y("tokens/s", Scale::Log);
    for (i, l) in labels.iter().enumerate() {
        let pts: Vec<(f64, f64)> = rs
            .iter()
            .filter(|r| &variant_label(r, pools, tiles) == l)
            .map(|r| (f64::from(r.dp), tokens_per_s(r)))
            .collect();
        ch = ch.series(Series::new(l.clone(), pts, Mark::LinePoints).color(palette(i)));
    }
    ch.render()
}

/// Corpus `c`'s compute, CP communication and exposed communication per GPU against the
/// pool size P, per Libra variant.
fn pool_chart(c: &str, rs: &[&PointResult]) -> String {
    let mut ps: Vec<u32> = rs
        .iter()
        .filter(|r| r.scheme != "ulysses")
        .map(|r| r.libra.pool_size.min(r.dp))
        .collect();
    ps.sort_unstable();
    ps.dedup();
    // Colour per scheme; compute a plain line, CP communication dashed, exposed
    // communication with points.
    let mut ch = Chart::new(format!("{c}: time per GPU against pool size P"))
        .x("P (DP replicas per pool)", Scale::Log)
        .x_ticks(ps.iter().map(|&p| f64::from(p)).collect())
        .y("seconds per GPU per step", Scale::Log);
    for (si, sc) in ["libra-tap", "libra-tap-vrsp", "libra"].iter().enumerate() {
        let mut pts: Vec<&&PointResult> = rs.iter().filter(|r| r.scheme == *sc).collect();
        if pts.is_empty() {
            continue;
        }
        pts.sort_by_key(|r| r.libra.pool_size);
        for (what, f, mark, dashed) in [
            (
                "compute",
                (|r: &PointResult| r.compute) as fn(&PointResult) -> f64,
                Mark::Line,
                false,
            ),
            ("CP comm", |r: &PointResult| r.cp_comm, Mark::Line, true),
            (
                "exposed comm",
                |r: &PointResult| r.exposed,
                Mark::LinePoints,
                false,
            ),
        ] {
            let p: Vec<(f64, f64)> = pts
                .iter()
                .map(|r| (f64::from(r.libra.pool_size.min(r.dp)), f(r) * 1e-12))
                .collect();
            let mut s = Series::new(format!("{sc}: {what}"), p, mark).color(palette(si));
            if dashed {
                s = s.dashed();
            }
            ch = ch.series(s);
        }
    }
    ch.render()
}

/// Corpus `c`'s speedup over Ulysses against tiles per sequence (L/B × H), a line per H.
fn tiles_chart(c: &str, rs: &[&PointResult]) -> String {
    let mut ch = Chart::new(format!(
        "{c}: speedup over Ulysses against tiles per sequence"
    ))
    .x("tiles per sequence (L/B × H)", Scale::Log)
    .y("tokens/s over Ulysses", Scale::Linear);
    let mut hs: Vec<u32> = rs
        .iter()
        .filter(|r| r.scheme != "ulysses")
        .map(|r| r.libra.head_shards)
        .collect();
    hs.sort_unstable();
    hs.dedup();
    for (i, &h) in hs.iter().enumerate() {
        let mut pts: Vec<(f64, f64)> = rs
            .iter()
            .filter(|r| r.scheme != "ulysses" && r.libra.head_shards == h)
            .filter_map(|r| {
                let u = rs.iter().find(|b| {
                    b.scheme == "ulysses" && b.dp == r.dp && b.dp * b.ga == r.dp * r.ga
                })?;
                let n = f64::from(r.seq_len.div_ceil(r.libra.tile_tokens.max(1)) * h);
                Some((n, tokens_per_s(r) / tokens_per_s(u)))
            })
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        ch = ch.series(Series::new(format!("H = {h}"), pts, Mark::LinePoints).color(palette(i)));
    }
    ch.render()
}

/// Corpus `c`'s micro-batch forward spans at DP `dmax`, sorted, over Libra's mean (none
/// without a Libra point there).
fn microbatch_chart(
    c: &str,
    rs: &[&PointResult],
    dmax: u32,
    pools: bool,
    tiles: bool,
) -> Option<String> {
    let fwd = |r: &PointResult| -> Vec<f64> {
        r.steps
            .iter()
            .flat_map(|s| s.microbatches.iter().filter(|m| m.stage == 0))
            .map(|m| m.fwd_span as f64)
            .collect()
    };
    let at: Vec<&&PointResult> = rs.iter().filter(|r| r.dp == dmax).collect();
    let norm = at
        .iter()
        .find(|r| r.scheme == "libra")
        .map(|r| mean(fwd(r).into_iter()))
        .filter(|&m| m > 0.0)?;
    let mut ch = Chart::new(format!(
        "{c}, DP = {dmax}: micro-batch forward time over Libra's mean (sorted)"
    ))
    .x("micro-batch rank (sorted)", Scale::Linear)
    .y("forward time / Libra mean", Scale::Log);
    for (i, r) in at.iter().enumerate() {
        let mut v = fwd(r);
        v.sort_by(|a, b| a.total_cmp(b));
        let pts = v
            .iter()
            .enumerate()
            .filter(|(_, &x)| x > 0.0)
            .map(|(k, &x)| (k as f64, x / norm))
            .collect();
        ch = ch.series(
            Series::new(variant_label(r, pools, tiles), pts, Mark::Scatter).color(palette(i)),
        );
    }
    Some(ch.render())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DP_SCALING: &str = include_str!("../../experiments/libra-dp-scaling.toml");

    /// The lengths of the grid's points, by corpus.
    fn lens(text: &str) -> Result<Vec<(Option<String>, u32)>> {
        let f = parse(text, "f.toml")?;
        let mut v: Vec<_> = grid(&f, "f.toml")?
            .into_iter()
            .map(|(_, _, l, c)| (c, l))
            .collect();
        v.dedup();
        Ok(v)
    }

    /// `[workload] seq_len` is every swept corpus's L; without it each corpus runs at its
    /// own; `[sweep] seq_len` lists them for every corpus.
    #[test]
    fn a_workload_length_holds_for_every_swept_corpus() {
        let corpora = |l: u32, m: u32| {
            vec![
                (Some("libra-256k".to_string()), l),
                (Some("libra-1m".to_string()), m),
            ]
        };
        assert_eq!(lens(DP_SCALING).unwrap(), corpora(262_144, 1_048_576));
        let given = DP_SCALING.replacen("seed = 1\n", "seed = 1\nseq_len = 131072\n", 1);
        assert_eq!(lens(&given).unwrap(), corpora(131_072, 131_072));
        let swept = DP_SCALING.replacen("[sweep]\n", "[sweep]\nseq_len = [65536]\n", 1);
        assert_eq!(lens(&swept).unwrap(), corpora(65_536, 65_536));
        // without a sweep: the workload corpus's own L
        let alone = DP_SCALING[..DP_SCALING.find("[sweep]").unwrap()].to_string();
        assert_eq!(lens(&alone).unwrap(), vec![(None, 262_144)]);
        // sequences have no L of their own
        let seqs = alone.replacen(
            "corpus = \"libra-256k\"\npacking = \"sequential\"\n",
            "sequences = [[100, 200]]\n",
            1,
        );
        assert_ne!(seqs, alone);
        let e = lens(&seqs).unwrap_err();
        assert_eq!(
            e.root(),
            &invalid(
                "[workload] seq_len",
                "none",
                "a sequence length L for the sequences"
            )
        );
    }
}
