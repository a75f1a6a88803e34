//! Experiment kind `throughput`: published training throughput beside skewsim's, row by row.
//!
//! Reads a table of published pre-training runs (`experiments/data/public-throughput.csv`:
//! model, GPU, GPU count, TP / PP / CP / VP / EP, global and micro-batch, sequence length,
//! precision, recomputation, the published tokens/s per GPU, and the source of each) and
//! simulates one step of each chosen row as the run's framework lays it out (Megatron-Core
//! through NeMo): micro-batches of `mbs` whole sequences of `seq_len` tokens (the
//! benchmarks train full causal sequences), GA = GBS / (DP · MBS), interleaved 1F1B with
//! the row's VP, sequence parallelism with TP communication overlapped, the distributed
//! optimizer with its gradient reduce-scatters and parameter gathers overlapped and
//! gradients reduced in BF16 (NeMo's and Megatron-Bridge's performance recipes:
//! `grad_reduce_in_fp32 = False`), the row's precision and recomputation, on the
//! topology and GPU the experiment names for the row's GPU; a row run with FSDP shards its
//! parameters, gradients and optimizer states as ZeRO 3. Writes `summary.md` (published
//! beside simulated, the error, the target and the verdict, memory against the GPU's
//! capacity) and `points.csv`.
//!
//! ```toml
//! kind = "throughput"
//! table = "data/public-throughput.csv"  # relative to this file
//! root = ".."                           # the table's model files resolve against it
//! rows = [12, 40]                       # the rows to run, by row_id
//! [topologies]                          # the cluster of each GPU in the table
//! h100 = "../topologies/dgx-h100-ib.toml"
//! [targets]                             # the error each (GPU, precision) must stay within
//! "h100-bf16" = 0.10
//! default = 0.15
//! [models."llama3.1-405b"]              # per-model layout options of the recipes
//! account_for_embedding = true
//! account_for_loss = true
//! ```
//!
//! Departures, listed in the summary too: context parallelism runs as Ulysses' all-to-all
//! (Megatron-Core's default is ring attention over P2P); recomputation the source does not
//! state runs as none (the recipes' default at these sizes); every layer is its own gradient
//! bucket (Megatron's 40M-parameter default buckets are smaller than one of these models'
//! layers, and a bucket holds at least one layer here).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::calfile::Prices;
use super::inputs::{read_input_text, MAX_SPEC_BYTES, MAX_TABLE_BYTES};
use super::{Files, Observer, Outcome};
use crate::balance::libra::LibraParams;
use crate::cluster::TopologySpec;
use crate::cost::gpu::Precision;
use crate::cost::profile::Kernel;
use crate::cost::{CostModel, ModelConfig};
use crate::error::{bail, invalid, Context, Result};
use crate::net::collective::CollectiveModel;
use crate::net::AnalyticalModel;
use crate::report::step::step_report;
use crate::report::table::sig;
use crate::schedule::plan_step::{simulate_scheme_batch, StepAttention};
use crate::schedule::{NoVariance, Parallelism, Placement, RankMap, Recompute};
use crate::workload::PackedSeq;

/// Most rows one experiment runs.
pub const MAX_ROWS: usize = 4096;

/// Most GPUs one row may simulate.
pub const MAX_ROW_GPUS: u32 = 1 << 16;

/// Most sequences in one row's global batch.
pub const MAX_ROW_SEQUENCES: u32 = 1 << 20;

/// The experiment file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ThroughputFile {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    description: String,
    /// The table of published rows (CSV), relative to the experiment file.
    table: PathBuf,
    /// The folder the table's `model_file` paths resolve against, relative to the file.
    #[serde(default)]
    root: Option<PathBuf>,
    /// The rows to run, by `row_id` (in this order).
    rows: Vec<u32>,
    /// The topology file of each GPU name the rows use, relative to the experiment file.
    topologies: BTreeMap<String, PathBuf>,
    /// Allowed relative error per "GPU-precision" (e.g. `h100-bf16`), `default` for others.
    #[serde(default)]
    targets: BTreeMap<String, f64>,
    /// Per-model layout options (by the model's name).
    #[serde(default)]
    models: BTreeMap<String, ModelOptions>,
}

/// A model's layout options, as its recipe sets them.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelOptions {
    #[serde(default)]
    account_for_embedding: bool,
    #[serde(default)]
    account_for_loss: bool,
}

/// One published row, as the table holds it (the columns this kind reads).
#[derive(Debug, Clone, Deserialize)]
struct Row {
    row_id: u32,
    source_id: String,
    model: String,
    model_file: String,
    gpu: String,
    gpus: u32,
    tp: u32,
    pp: u32,
    cp: u32,
    vp: Option<u32>,
    ep: u32,
    fsdp: Option<String>,
    gbs: u32,
    mbs: u32,
    seq_len: u32,
    precision: String,
    recompute: String,
    tokens_per_s_per_gpu: f64,
}

/// One row's simulated step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointResult {
    /// The table's row id.
    pub row_id: u32,
    /// Simulated tokens per second per GPU.
    pub tokens_per_s_per_gpu: f64,
    /// Simulated model FLOPs utilisation (skewsim's FLOP count: exact causal pairs).
    pub mfu: f64,
    /// Iteration time, ms.
    pub iteration_ms: f64,
    /// Pipeline bubble share.
    pub bubble: f64,
    /// Peak memory of the fullest rank, bytes.
    pub peak_memory: u64,
    /// The GPU's memory, bytes.
    pub capacity: u64,
    /// Ranks over the GPU's memory.
    pub infeasible_ranks: u32,
}

/// A `throughput` experiment laid out: its rows and what each runs on.
pub struct Sweep {
    f: ThroughputFile,
    file: String,
    title: String,
    base: PathBuf,
    rows: Vec<Row>,
    calibration: Option<PathBuf>,
    kernel: Option<Kernel>,
}

fn parse(text: &str, file: &str) -> Result<ThroughputFile> {
    let f: ThroughputFile =
        toml::from_str(text).map_err(|e| crate::error::parse_error(file, e.to_string()))?;
    if f.rows.is_empty() || f.rows.len() > MAX_ROWS {
        return Err(invalid(
            "rows",
            f.rows.len(),
            format!("1 to {MAX_ROWS} row ids of the table"),
        ))
        .context(file);
    }
    for (k, &v) in &f.targets {
        if !(v.is_finite() && v > 0.0 && v < 1.0) {
            return Err(invalid(
                format!("[targets] {k}"),
                v,
                "a relative error in (0, 1)",
            ))
            .context(file);
        }
    }
    Ok(f)
}

/// Check a `throughput` file's schema without reading its table.
pub fn check(text: &str, file: &str) -> Result<()> {
    parse(text, file).map(|_| ())
}

impl Sweep {
    /// Read the file and its table and pick the rows; nothing is simulated.
    pub fn new(text: &str, file: &str, title: &str, base: &Path, prices: Prices) -> Result<Sweep> {
        let f = parse(text, file)?;
        let tpath = base.join(&f.table);
        let ttext = read_input_text(&tpath, MAX_TABLE_BYTES)
            .with_context(|| format!("{file}: table {}", tpath.display()))?;
        // Only the chosen rows are read whole: other rows may leave columns empty.
        let tname = tpath.display().to_string();
        let bad =
            |k: usize, e: csv::Error| crate::error::parse_error(&tname, format!("row {k}: {e}"));
        let mut rd = csv::ReaderBuilder::new().from_reader(ttext.as_bytes());
        let headers = rd.headers().map_err(|e| bad(0, e))?.clone();
        let mut all: BTreeMap<u32, Row> = BTreeMap::new();
        let mut ids = 0;
        for (k, rec) in rd.records().enumerate() {
            let rec = rec.map_err(|e| bad(k + 1, e))?;
            ids += 1;
            let id: u32 = rec.get(0).and_then(|v| v.parse().ok()).unwrap_or(0);
            if f.rows.contains(&id) {
                all.insert(
                    id,
                    rec.deserialize(Some(&headers)).map_err(|e| bad(k + 1, e))?,
                );
            }
        }
        let mut rows = Vec::with_capacity(f.rows.len());
        for &id in &f.rows {
            let r = all.get(&id).cloned().ok_or_else(|| {
                invalid(
                    "rows",
                    id,
                    format!("a row_id of {} ({ids} rows)", tpath.display()),
                )
            })?;
            check_row(&r, &f).with_context(|| format!("{file}: row {id}"))?;
            rows.push(r);
        }
        Ok(Sweep {
            f,
            file: file.to_string(),
            title: title.to_string(),
            base: base.to_path_buf(),
            rows,
            calibration: prices.0.map(Path::to_path_buf),
            kernel: prices.1,
        })
    }

    /// How many rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Row `i` in words.
    pub fn describe(&self, i: usize) -> String {
        let r = &self.rows[i];
        format!("row {} ({} on {} {})", r.row_id, r.model, r.gpus, r.gpu)
    }

    /// Simulate row `i` (in `0..len()`).
    pub fn run_point(&self, i: usize) -> Result<PointResult> {
        let r = self.rows.get(i).ok_or_else(|| {
            invalid(
                "sweep point",
                i,
                format!("0..{} ({} rows)", self.len(), self.len()),
            )
        })?;
        self.simulate(r)
            .with_context(|| format!("{}: row {}", self.file, r.row_id))
    }

    fn simulate(&self, r: &Row) -> Result<PointResult> {
        let root = self.base.join(self.f.root.clone().unwrap_or_default());
        let mpath = root.join(&r.model_file);
        let mtext = read_input_text(&mpath, MAX_SPEC_BYTES)
            .with_context(|| format!("model {}", mpath.display()))?;
        let model = ModelConfig::from_toml_str(&mtext, &mpath.display().to_string())?;
        let opts = self.f.models.get(&model.name).copied().unwrap_or_default();
        let topo_path = self.base.join(&self.f.topologies[&r.gpu]);
        let ttext = read_input_text(&topo_path, MAX_SPEC_BYTES)
            .with_context(|| format!("topology {}", topo_path.display()))?;
        let spec = TopologySpec::parse(&ttext, &topo_path.display().to_string())?;
        let gpn = spec.gpus_per_node;
        let unit = spec.super_node.as_ref().map_or(1, |s| s.nodes).max(1);
        let nodes = r.gpus.div_ceil(gpn).div_ceil(unit) * unit;
        let precision = match r.precision.as_str() {
            "bf16" => Precision::Bf16,
            "fp8" => Precision::Fp8,
            p => bail!("precision {p:?}: allowed are bf16 and fp8"),
        };
        let prices = (self.calibration.as_deref(), self.kernel);
        let cost = row_cost(model, &spec, &self.base, precision, prices)?;
        let topo = std::sync::Arc::new(spec.build(Some(nodes))?);
        let dp = r.gpus / (r.tp * r.pp * r.cp);
        let ga = r.gbs / (dp * r.mbs);
        let par = Parallelism {
            tp: r.tp,
            pp: r.pp,
            cp: r.cp,
            vp: r.vp.unwrap_or(1),
            ep: r.ep,
            dp,
            ga,
            sp: true,
            tp_overlap: r.tp > 1,
            recompute: match r.recompute.as_str() {
                "selective" => Recompute::Selective,
                "full" => Recompute::Full,
                _ => Recompute::None,
            },
            precision,
            account_for_embedding: opts.account_for_embedding,
            account_for_loss: opts.account_for_loss,
            distributed_optimizer: true,
            overlap_param_gather: true,
            grad_reduce_in_fp32: false,
            zero_stage: if sharded(r) { 3 } else { 0 },
            dp_buckets: crate::schedule::MAX_DP_BUCKETS,
            ..Parallelism::default()
        };
        let place = Placement::new(gpn, nodes).with_collectives(CollectiveModel::of(&topo, true));
        let map = RankMap::new(par, place, "row")?;
        let seq = PackedSeq::from_lengths(&vec![r.seq_len; r.mbs as usize], r.seq_len * r.mbs, 0);
        let global = vec![seq; (dp * ga) as usize];
        let scheme = StepAttention::parse("ulysses", LibraParams::default())?;
        let mut net = AnalyticalModel::new(topo);
        let (sg, t) = simulate_scheme_batch(&scheme, &cost, map, global, 0, &mut net, &NoVariance)?;
        let rep = step_report(&sg, &t, &cost, 0);
        let peak = sg.memory.iter().map(|m| m.total()).max().unwrap_or(0);
        Ok(PointResult {
            row_id: r.row_id,
            tokens_per_s_per_gpu: rep.tokens_per_s / f64::from(r.gpus),
            mfu: rep.mfu,
            iteration_ms: rep.iteration as f64 * 1e-9,
            bubble: rep.bubble_fraction,
            peak_memory: peak,
            capacity: cost.hw.memory_bytes,
            infeasible_ranks: rep.infeasible_ranks,
        })
    }

    /// The target error of a row: `[targets]` "gpu-precision", else `default`, else 15 %.
    fn target(&self, r: &Row) -> f64 {
        let key = format!("{}-{}", r.gpu, r.precision);
        self.f
            .targets
            .get(&key)
            .or_else(|| self.f.targets.get("default"))
            .copied()
            .unwrap_or(0.15)
    }

    /// The run's files from every row's result, checked to be this sweep's rows.
    pub fn finish(&self, results: &[PointResult]) -> Result<Outcome> {
        if results.len() != self.rows.len()
            || results
                .iter()
                .zip(&self.rows)
                .any(|(p, r)| p.row_id != r.row_id)
        {
            return Err(invalid(
                "sweep point results",
                results.len(),
                format!("one per row ({}), in the file's order", self.rows.len()),
            ))
            .context(self.file.as_str());
        }
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let mut csv = String::from(
            "row_id,source_id,model,gpu,gpus,tp,pp,cp,vp,ep,dp,ga,gbs,mbs,seq_len,precision,recompute,published_tokens_per_s_per_gpu,skewsim_tokens_per_s_per_gpu,error,target,within,mfu,iteration_ms,bubble,peak_memory_gib,capacity_gib,infeasible_ranks\n",
        );
        let mut s = format!("# {}\n\n", self.title);
        if !self.f.description.is_empty() {
            let _ = writeln!(s, "{}\n", self.f.description.trim());
        }
        s += "Published tokens/s per GPU beside skewsim's simulated step of the same layout \
              (`kind = \"throughput\"`, `src/experiment/throughput.rs`: how a row is laid \
              out and what departs from the run). Error = skewsim / published − 1.\n\n\
              | row | source | model | GPU | GPUs | layout | GBS × seq | prec. | published | \
              skewsim | error | target | within | MFU | peak / capacity GiB |\n\
              |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
        let mut within = 0;
        let mut fits = 0;
        for (p, r) in results.iter().zip(&self.rows) {
            let dp = r.gpus / (r.tp * r.pp * r.cp);
            let ga = r.gbs / (dp * r.mbs);
            let vp = r.vp.unwrap_or(1);
            let err = p.tokens_per_s_per_gpu / r.tokens_per_s_per_gpu - 1.0;
            let target = self.target(r);
            let ok = err.abs() <= target;
            within += usize::from(ok);
            fits += usize::from(p.infeasible_ranks == 0);
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{},{},{},{vp},{},{dp},{ga},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                r.row_id,
                r.source_id,
                r.model,
                r.gpu,
                r.gpus,
                r.tp,
                r.pp,
                r.cp,
                r.ep,
                r.gbs,
                r.mbs,
                r.seq_len,
                r.precision,
                r.recompute.replace(',', ";"),
                r.tokens_per_s_per_gpu,
                sig(p.tokens_per_s_per_gpu, 6),
                sig(err, 4),
                target,
                ok,
                sig(p.mfu, 4),
                sig(p.iteration_ms, 6),
                sig(p.bubble, 4),
                sig(gib(p.peak_memory), 4),
                sig(gib(p.capacity), 4),
                p.infeasible_ranks
            );
            let layout = format!(
                "TP{} PP{} CP{}{} DP{dp}{}",
                r.tp,
                r.pp,
                r.cp,
                if vp > 1 {
                    format!(" VP{vp}")
                } else {
                    String::new()
                },
                if r.ep > 1 {
                    format!(" EP{}", r.ep)
                } else {
                    String::new()
                }
            );
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {layout} | {} × {} | {} | {:.1} | {:.1} | {:+.1} % | {:.0} % | {} | {:.3} | {:.1} / {:.1}{} |",
                r.row_id,
                r.source_id,
                r.model,
                r.gpu,
                r.gpus,
                r.gbs,
                r.seq_len,
                r.precision,
                r.tokens_per_s_per_gpu,
                p.tokens_per_s_per_gpu,
                100.0 * err,
                100.0 * target,
                if ok { "yes" } else { "**no**" },
                p.mfu,
                gib(p.peak_memory),
                gib(p.capacity),
                if p.infeasible_ranks > 0 {
                    format!(" (**{} ranks over**)", p.infeasible_ranks)
                } else {
                    String::new()
                }
            );
        }
        let _ = write!(
            s,
            "\n{within} of {} rows within their target; {fits} of {} fit the GPU's memory.\n\n\
             Departures from the published runs: context parallelism runs as Ulysses' \
             all-to-all (Megatron-Core's default is ring attention over P2P); recomputation \
             a source does not state runs as none; every layer is its own gradient bucket; \
             sequences are whole documents of `seq_len` tokens (full causal attention).\n",
            results.len(),
            results.len()
        );
        let mut files = Files::default();
        files.write("summary.md", s.clone());
        files.write("points.csv", csv);
        Ok(Outcome {
            kind: "throughput".to_string(),
            files: files.0,
            points_file: "points.csv",
            summary: s,
            json: None,
        })
    }
}

/// A row's cost model: the model on the topology's GPU at the row's precision, priced by
/// `prices` (a calibration file or kernel profile) when given, else the built-in profile
/// derived for that GPU (`calfile::on_gpu`).
fn row_cost(
    model: ModelConfig,
    topo: &TopologySpec,
    base: &Path,
    precision: Precision,
    prices: Prices,
) -> Result<CostModel> {
    let kernel = prices.1.unwrap_or(Kernel::DEFAULT);
    let gpu = super::calfile::run_gpu(None, "gpu", Some(topo), base)?;
    super::calfile::cost_model_on(model, prices.0, kernel, &gpu, precision)
}

/// Whether the row runs FSDP (its `fsdp` column: 1 or a sharding group's size): parameters,
/// gradients and optimizer states sharded over the data-parallel ranks, as ZeRO 3.
fn sharded(r: &Row) -> bool {
    r.fsdp.as_deref().is_some_and(|f| !f.is_empty() && f != "0")
}

/// Refuse a row the simulator cannot lay out, naming the column.
fn check_row(r: &Row, f: &ThroughputFile) -> Result<()> {
    for (k, v) in [
        ("gpus", r.gpus),
        ("tp", r.tp),
        ("pp", r.pp),
        ("cp", r.cp),
        ("ep", r.ep),
        ("gbs", r.gbs),
        ("mbs", r.mbs),
        ("seq_len", r.seq_len),
    ] {
        if v == 0 {
            return Err(invalid(k, 0, "a positive integer"));
        }
    }
    if r.gpus > MAX_ROW_GPUS {
        return Err(invalid("gpus", r.gpus, format!("at most {MAX_ROW_GPUS}")));
    }
    let model = r.tp * r.pp * r.cp;
    if r.gpus % model != 0 {
        return Err(invalid(
            "gpus",
            r.gpus,
            format!("a multiple of TP × PP × CP = {model}"),
        ));
    }
    let tokens = u64::from(r.seq_len) * u64::from(r.mbs);
    if tokens > u64::from(crate::workload::pack::MAX_SEQ_LEN) {
        return Err(invalid(
            "seq_len × mbs",
            tokens,
            format!(
                "at most {} tokens in one micro-batch",
                crate::workload::pack::MAX_SEQ_LEN
            ),
        ));
    }
    if r.gbs > MAX_ROW_SEQUENCES {
        return Err(invalid(
            "gbs",
            r.gbs,
            format!("at most {MAX_ROW_SEQUENCES} sequences a step"),
        ));
    }
    let dp = r.gpus / model;
    if r.gbs % (dp * r.mbs) != 0 {
        return Err(invalid(
            "gbs",
            r.gbs,
            format!("a multiple of DP × MBS = {}", dp * r.mbs),
        ));
    }
    if !f.topologies.contains_key(&r.gpu) {
        return Err(invalid(
            "gpu",
            &r.gpu,
            format!(
                "a GPU with a topology under [topologies]: {}",
                f.topologies.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    if r.model_file.is_empty() {
        return Err(invalid("model_file", "(empty)", "a model file in models/"));
    }
    if !(r.tokens_per_s_per_gpu.is_finite() && r.tokens_per_s_per_gpu > 0.0) {
        return Err(invalid(
            "tokens_per_s_per_gpu",
            r.tokens_per_s_per_gpu,
            "a positive published figure",
        ));
    }
    Ok(())
}

/// Run every row (in parallel) and gather the files.
pub fn run_text(
    text: &str,
    file: &str,
    title: &str,
    base: &Path,
    prices: Prices,
    observer: &dyn Observer,
) -> Result<Outcome> {
    let sw = Sweep::new(text, file, title, base, prices)?;
    let results = super::sweep::run_points(sw.len(), observer, |i| sw.run_point(i))?;
    sw.finish(&results)
}
