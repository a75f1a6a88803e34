//! `skewsim calibrate --measurements m.csv -o calibration.json`: fit the cost model to GPU
//! measurements.
//!
//! Reads measurement CSVs (`skewsim validate`) and PyTorch-profiler Chrome traces
//! (`--trace`, FlashAttention forward kernels joined to their shapes by
//! `validate::trace`), splits the plans into fit and held-out sets — by seed, by scheme
//! (`--holdout-schemes`) or by plan name (`--holdout-plans`, e.g. a corpus or L in the
//! file names) — fits with [`skewsim::cost::fit::fit`] (forward, and backward when the
//! CSVs have `pass` = bwd rows; with `--kernel-model blocks`, the default, the kernels'
//! block models of both passes beside the tables) and prints predicted vs measured on the held-out plans,
//! before (the starting table) and after calibration, overall and per held-out scheme. Writes the calibration JSON that
//! `--calibration` reads. The fitting itself lives in the library (no I/O there).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use skewsim::cost::{gemm, Calibration};
use skewsim::experiment::inputs::{read_input_text, MAX_TABLE_BYTES};

use skewsim::cost::fit::{
    self, FitOptions, MeasureKind, Measurement, Pass, Pricing, SegCount, Summary,
};

use skewsim::cost::blocks::{
    BlockModel, BlockTimes, BwdBlockModel, Placement, TileOrder, BLOCK_ROWS, BWD_BLOCKS_PER_SM,
    BWD_BLOCK_M, BWD_BLOCK_N, FWD_BLOCKS_PER_SM, FWD_BLOCK_M, FWD_BLOCK_N, FWD_HEAD_DIM, H200_SMS,
    MAX_BLOCKS_PER_SM, MAX_SMS,
};

use super::{limits, Output};

#[derive(clap::Args)]
pub struct Args {
    /// Measurement CSVs written by `skewsim validate`.
    #[arg(long, num_args = 1..)]
    pub measurements: Vec<PathBuf>,
    /// PyTorch-profiler Chrome traces (record_shapes=True) of causal FlashAttention forward
    /// calls; every such kernel becomes a fitting row (whole documents).
    #[arg(long, num_args = 1..)]
    pub trace: Vec<PathBuf>,
    /// Seeds whose plans are held out for scoring [default, when no --holdout-* is given:
    /// every second distinct seed, the 2nd, 4th, ... in increasing order].
    #[arg(long, value_delimiter = ',')]
    pub holdout_seeds: Option<Vec<u64>>,
    /// Schemes whose plans are held out (the CSV's `scheme` column: libra, ulysses,
    /// wlbllm, distca).
    #[arg(long, value_delimiter = ',')]
    pub holdout_schemes: Option<Vec<String>>,
    /// Plans held out by name: every plan whose name contains one of these strings.
    #[arg(long, value_delimiter = ',')]
    pub holdout_plans: Option<Vec<String>>,
    /// Plans left out altogether (neither fitted nor scored): every plan whose name contains
    /// one of these strings.
    #[arg(long, value_delimiter = ',')]
    pub exclude_plans: Option<Vec<String>>,
    /// Start from this calibration instead of the built-in default kernel profile
    /// (torch-flash).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Start from (with --score-only: price by) a built-in kernel profile instead:
    /// torch-flash (PyTorch's varlen FlashAttention-2 on the H200) or skewsim (the
    /// project's own kernels).
    #[arg(long)]
    pub kernel: Option<String>,
    /// Grid lengths of the fitted table (tokens, comma-separated) [default: powers of 2
    /// spanning the data].
    #[arg(long, value_delimiter = ',')]
    pub lens: Option<Vec<u32>>,
    /// Pull of the fit towards the starting table (see `FitOptions::prior_weight`).
    #[arg(long, default_value_t = 0.03, allow_hyphen_values = true,
          value_parser = super::limits::non_negative)]
    pub prior_weight: f64,
    /// How the calibration prices an attention call, forward and backward: `blocks` (the
    /// kernels' thread blocks list-scheduled onto the SMs, `cost::blocks`; fitted beside the
    /// tables) or `table` (Σ segments at the fitted efficiency tables' rates).
    #[arg(long, value_enum, default_value_t = KernelModel::Blocks)]
    pub kernel_model: KernelModel,
    /// SMs of the block model (132 on an H200).
    #[arg(long, default_value_t = H200_SMS,
          value_parser = limits::count::<u32>(1, MAX_SMS.into()))]
    pub sms: u32,
    /// Resident blocks per SM of the forward kernel (2 for v3-w4).
    #[arg(long, default_value_t = FWD_BLOCKS_PER_SM,
          value_parser = limits::count::<u32>(1, MAX_BLOCKS_PER_SM.into()))]
    pub blocks_per_sm: u32,
    /// Query rows per block of the forward kernel.
    #[arg(long, default_value_t = FWD_BLOCK_M, value_parser = block_rows)]
    pub block_m: u32,
    /// Keys per step of the forward kernel's key loop.
    #[arg(long, default_value_t = FWD_BLOCK_N, value_parser = block_rows)]
    pub block_n: u32,
    /// Resident blocks per SM of the backward kernels (2 at head_dim 128).
    #[arg(long, default_value_t = BWD_BLOCKS_PER_SM,
          value_parser = limits::count::<u32>(1, MAX_BLOCKS_PER_SM.into()))]
    pub bwd_blocks_per_sm: u32,
    /// Rows per tile of the backward kernels (query rows of dQ, keys of dK/dV).
    #[arg(long, default_value_t = BWD_BLOCK_M, value_parser = block_rows)]
    pub bwd_block_m: u32,
    /// Rows per step of the backward kernels' loops (keys of dQ, query rows of dK/dV).
    #[arg(long, default_value_t = BWD_BLOCK_N, value_parser = block_rows)]
    pub bwd_block_n: u32,
    /// Whose blocks the model lays out: `skewsim` (`validate/kernels`: tiles longest
    /// first, dQ a launch of its own) or `flash2` (FlashAttention-2's varlen grid, as
    /// PyTorch runs it: tiles in grid order, each segment padded with empty blocks to the
    /// launch's most tiles, dQ accumulated by the dK/dV blocks).
    #[arg(long, value_enum, default_value_t = BlockLayout::Skewsim)]
    pub block_layout: BlockLayout,
    /// Where the forward model's dispatcher puts blocks past the first of every SM:
    /// `in-order` (each freed slot takes the next block, the lowest SM first) or
    /// `any-free-slot` (a free slot at random, as measured on the H200; the median of
    /// seeded draws).
    #[arg(long, value_enum, default_value_t = PlacementArg::InOrder)]
    pub placement: PlacementArg,
    /// Score without fitting: price every row (measurements and traces, no holdout) by
    /// `--calibration`, else by the built-in default, and print predicted vs measured.
    /// With `--collectives`: every row by the `--topology` file's collective model as it
    /// is (its `[[collectives.fit]]` included).
    #[arg(long)]
    pub score_only: bool,
    /// GEMM measurement CSVs (`validate/torch/torch_grid.py`'s gemm section): fit the GEMM
    /// model to them and write it to `--out` (with --score-only: score the built-in one)
    /// instead of the attention calibration.
    #[arg(long, num_args = 1..)]
    pub gemm: Vec<PathBuf>,
    /// GEMM measurement CSVs held out: scored, never fitted.
    #[arg(long, num_args = 1..)]
    pub gemm_check: Vec<PathBuf>,
    /// Elementwise measurement CSVs (`validate/torch/elementwise.py`): fit the elementwise
    /// model (a call term and a rate per kind and pass) and write it to `--out` (with
    /// --score-only: score the built-in one) instead of the attention calibration.
    #[arg(long, num_args = 1..)]
    pub elementwise: Vec<PathBuf>,
    /// Elementwise measurement CSVs held out: scored, never fitted.
    #[arg(long, num_args = 1..)]
    pub elementwise_check: Vec<PathBuf>,
    /// Fit only the sliding-window step term of `--calibration`'s forward block model to
    /// the windowed forward rows (`mask` = sliding:W) of `--measurements` at its head_dim,
    /// every other figure held; write the calibration with it to `--out`.
    #[arg(long, requires = "calibration")]
    pub window: bool,
    /// Where to write the calibration JSON.
    #[arg(short, long, default_value = "calibration.json")]
    pub out: PathBuf,
    /// Fit the collective model instead: nccl-tests-style rows (CSV columns op, gpus, bytes,
    /// time_us; `validate/torch/collectives.py` writes them). Fits the model's own parameters
    /// (NVLink and NVLS efficiency, latency scale, NVLS chunk copy; printed as topology
    /// settings) and a latency and a bandwidth per algorithm (`[[collectives.fit]]` lines),
    /// both scored on held-out rows (`--holdout-gpus`, `--holdout-every`).
    #[arg(long, num_args = 1..)]
    pub collectives: Vec<PathBuf>,
    /// The topology the collective rows ran on (GPUs 0..N of it).
    #[arg(long, default_value = "topologies/dgx-h200-roce.toml")]
    pub topology: PathBuf,
    /// Let the collective model pick NVLS (measurements made with NVLink SHARP on; the
    /// shared machines run with NCCL_NVLS_ENABLE=0).
    #[arg(long)]
    pub nvls: bool,
    /// Collective rows at these GPU counts are held out (scored, not fitted).
    #[arg(long, value_delimiter = ',')]
    pub holdout_gpus: Vec<u32>,
    /// Of each (op, GPUs) series in increasing size, every K-th row from the 2nd is held
    /// out (0: none by size).
    #[arg(long, default_value_t = 2, value_parser = super::limits::count::<usize>(0, 1_000))]
    pub holdout_every: usize,
}

/// What `--score-only` reports.
#[derive(Serialize)]
struct ScoreReport {
    /// The calibration file, or the built-in default.
    pricing: String,
    rows: usize,
    summary: Summary,
}

/// How a calibration prices an attention call (forward and backward).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelModel {
    /// The kernels' blocks on the SMs (`cost::blocks`).
    Blocks,
    /// The efficiency tables per segment.
    Table,
}

/// Whose kernels a fitted block model lays out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BlockLayout {
    /// The project's kernels (`validate/kernels`).
    Skewsim,
    /// FlashAttention-2's varlen kernels.
    Flash2,
}

/// Where the dispatcher puts blocks past the first of every SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlacementArg {
    /// Each freed slot takes the next block, the lowest SM first.
    InOrder,
    /// A free slot at random (the H200's, measured).
    AnyFreeSlot,
}

/// The tile order of a block layout.
fn order(layout: BlockLayout) -> TileOrder {
    match layout {
        BlockLayout::Skewsim => TileOrder::LongestFirst,
        BlockLayout::Flash2 => TileOrder::Grid,
    }
}

/// Rows from a Chrome trace: each causal flash forward kernel as one launch of `b` whole
/// documents of `l` tokens at `h` heads.
pub fn trace_rows(json: &str, name: &str) -> Result<Vec<Measurement>> {
    let events = validate::trace::parse_kernels(json, "flash_fwd")
        .with_context(|| format!("reading trace {name}"))?;
    let mut rows = Vec::new();
    for (i, k) in events.iter().enumerate() {
        let (Some(flops), Some(dims)) = (k.causal_flash_fwd_flops(), k.input_dims.first()) else {
            continue;
        };
        let &[b, l, h, d] = dims.as_slice() else {
            continue;
        };
        let (Ok(b), Ok(l), Ok(h), Ok(d)) = (
            u32::try_from(b),
            u32::try_from(l),
            u32::try_from(h),
            u32::try_from(d),
        ) else {
            bail!("{name}: kernel {i}: shape {dims:?} out of range");
        };
        let ms = k.dur_us * 1e-3;
        rows.push(Measurement {
            kind: MeasureKind::Attn,
            pass: Pass::Fwd,
            plan: format!("trace:{name}"),
            seed: u64::MAX,
            scheme: "trace".into(),
            step: 0,
            ga: 0,
            pool: 0,
            worker: 0,
            chunk: i as u32,
            units: u64::from(b),
            segments: u64::from(b),
            tiles: 0,
            heads: h,
            // Forward rows: the KV heads do not change their price.
            kv_heads: h,
            head_dim: d,
            q_tokens: u64::from(b) * u64::from(l),
            flops,
            bytes: 0,
            predicted_ms: None,
            measured_ms: ms,
            p10_ms: ms,
            p90_ms: ms,
            segs: vec![SegCount { q: l, kv: l, n: b }],
            mask: skewsim::cost::Mask::Causal,
        });
    }
    Ok(rows)
}

/// Held-out error of one scheme's plans.
#[derive(Serialize)]
struct SchemeErr {
    scheme: String,
    plans: Vec<String>,
    before: Summary,
    after: Summary,
}

#[derive(Serialize)]
struct Report {
    fit_rows: usize,
    fit_bwd_rows: usize,
    fit_copy_rows: usize,
    fit_rms_rel: f64,
    fit_table_rms_rel: f64,
    blocks: Option<BlockModel>,
    bwd_blocks: Option<BwdBlockModel>,
    fit_bwd_rms_rel: Option<f64>,
    fit_bwd_table_rms_rel: Option<f64>,
    fit_seeds: Vec<u64>,
    fit_plans: Vec<String>,
    holdout_seeds: Vec<u64>,
    holdout_plans: Vec<String>,
    holdout_before: Summary,
    holdout_after: Summary,
    holdout_by_scheme: Vec<SchemeErr>,
    out: String,
}

/// Distinct values of `f` over `rows`, sorted.
fn distinct<T: Ord + Clone>(rows: &[Measurement], f: impl Fn(&Measurement) -> T) -> Vec<T> {
    let mut v: Vec<T> = rows.iter().map(f).collect();
    v.sort();
    v.dedup();
    v
}

/// The rows of GEMM measurement CSVs.
fn gemm_rows(files: &[PathBuf]) -> Result<Vec<gemm::GemmRow>> {
    let mut rows = Vec::new();
    for f in files {
        let name = f.display().to_string();
        let text =
            read_input_text(f, MAX_TABLE_BYTES).with_context(|| format!("reading {name}"))?;
        rows.extend(gemm::gemm_rows_from_csv(&text, &name)?);
    }
    Ok(rows)
}

/// A GEMM model's scores: rows, median, p90 and max APE %.
#[derive(Serialize)]
struct GemmScore {
    rows: usize,
    median_ape: f64,
    p90_ape: f64,
    max_ape: f64,
}

impl GemmScore {
    fn of(m: &gemm::GemmModel, rows: &[gemm::GemmRow]) -> Self {
        let (median_ape, p90_ape, max_ape) = gemm::score(m, rows);
        GemmScore {
            rows: rows.len(),
            median_ape,
            p90_ape,
            max_ape,
        }
    }
}

#[derive(Serialize)]
struct GemmReport {
    model: gemm::GemmModel,
    fitted: bool,
    fit: GemmScore,
    check: GemmScore,
    out: Option<String>,
}

#[derive(Serialize)]
struct WindowReport {
    calibration: String,
    head_dim: u32,
    window_ns: f64,
    rows: usize,
    rms_rel: f64,
    out: String,
}

/// `calibrate --window`: fit the window step term of `--calibration`'s forward block model.
fn run_window(args: &Args, rows: &[Measurement], out: Output) -> Result<()> {
    let Some(path) = args.calibration.as_deref() else {
        bail!("--window needs --calibration: the calibration whose block model it extends");
    };
    let mut cal = super::calfile::read(path)?;
    let name = path.display().to_string();
    let Some(model) = cal.attn_blocks else {
        bail!("{name}: --window needs a forward block model (attn_blocks)");
    };
    let fit_rows = skewsim::cost::fit_window::window_rows(rows, model.head_dim);
    let f = skewsim::cost::fit_window::fit_window_ns(&model, cal.launch.attn_launch_us, &fit_rows)?;
    cal.attn_blocks = Some(BlockModel {
        window_ns: f.window_ns,
        ..model
    });
    let text = serde_json::to_string_pretty(&cal)? + "\n";
    std::fs::write(&args.out, text).with_context(|| format!("writing {}", args.out.display()))?;
    let r = WindowReport {
        calibration: name,
        head_dim: model.head_dim,
        window_ns: f.window_ns,
        rows: f.rows,
        rms_rel: f.rms_rel,
        out: args.out.display().to_string(),
    };
    out.emit(&r, || {
        format!(
            "window step of {} (head_dim {}): {:.1} ns per windowed step over {} launches, RMS {:.2} %; written to {}\n",
            r.calibration,
            r.head_dim,
            r.window_ns,
            r.rows,
            100.0 * r.rms_rel,
            r.out
        )
    })
}

/// `calibrate --gemm`: fit (or with --score-only score) the GEMM model.
fn run_gemm(args: &Args, out: Output) -> Result<()> {
    let (fit_rows, check) = (gemm_rows(&args.gemm)?, gemm_rows(&args.gemm_check)?);
    let builtin = gemm::GemmModel::h200_default()?;
    let model = if args.score_only {
        builtin
    } else {
        gemm::fit(&fit_rows, &builtin)?
    };
    let path = (!args.score_only).then(|| args.out.clone());
    if let Some(p) = &path {
        let text = serde_json::to_string_pretty(&model)? + "\n";
        std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    let r = GemmReport {
        fit: GemmScore::of(&model, &fit_rows),
        check: GemmScore::of(&model, &check),
        fitted: !args.score_only,
        out: path.map(|p| p.display().to_string()),
        model,
    };
    out.emit(&r, || {
        let m = &r.model;
        let line = |n: &str, s: &GemmScore| {
            format!(
                "{n:<9} {:>5} {:>13.2} {:>10.2} {:>10.2}\n",
                s.rows, s.median_ape, s.p90_ape, s.max_ape
            )
        };
        format!(
            "GEMM model ({}): {:.1} TFLOP/s main loop, {:.2} TB/s, call {:.2} µs, floor {:.2} µs{}\nrows          n  median APE %  p90 APE %  max APE %\n{}{}",
            if r.fitted { "fitted" } else { "built in" },
            m.tflops,
            m.bytes_per_s * 1e-12,
            m.call_us,
            m.floor_us,
            r.out.as_ref().map(|p| format!(", written to {p}")).unwrap_or_default(),
            line("gemm", &r.fit),
            line("check", &r.check),
        )
    })
}

pub fn run(args: Args, out: Output) -> Result<()> {
    if !args.collectives.is_empty() {
        if !args.measurements.is_empty() || !args.trace.is_empty() || !args.gemm.is_empty() {
            bail!("--collectives fits the collective model alone: give it without --measurements, --trace or --gemm");
        }
        return super::calibrate_coll::run(&args, out);
    }
    if !args.elementwise.is_empty() || !args.elementwise_check.is_empty() {
        if !args.measurements.is_empty() || !args.trace.is_empty() || !args.gemm.is_empty() {
            bail!("--elementwise and --measurements/--trace/--gemm: calibrate one model at a time");
        }
        if args.elementwise.is_empty() && !args.score_only {
            bail!(
                "--elementwise-check without --elementwise: give the rows to fit (or --score-only)"
            );
        }
        return super::calibrate_elem::run(&args, out);
    }
    if !args.gemm.is_empty() || !args.gemm_check.is_empty() {
        if !args.measurements.is_empty() || !args.trace.is_empty() {
            bail!("--gemm and --measurements/--trace: calibrate one model at a time");
        }
        if args.gemm.is_empty() && !args.score_only {
            bail!("--gemm-check without --gemm: give the GEMM rows to fit (or --score-only)");
        }
        return run_gemm(&args, out);
    }
    if args.measurements.is_empty() && args.trace.is_empty() {
        bail!("calibrate needs at least one --measurements CSV or --trace file (or --collectives)");
    }
    let start = super::calfile::pricing(args.calibration.as_deref(), args.kernel.as_deref())?;
    let (mut rows, trace) = read_rows(&args)?;
    if args.window {
        return run_window(&args, &rows, out);
    }
    if args.score_only {
        rows.extend(trace);
        return run_score(&args, rows, &start, out);
    }
    run_fit(&args, rows, trace, &start, out)
}

/// The rows of every `--measurements` CSV and those of every `--trace`, less
/// `--exclude-plans`.
fn read_rows(args: &Args) -> Result<(Vec<Measurement>, Vec<Measurement>)> {
    let mut rows = Vec::new();
    for f in &args.measurements {
        let name = f.display().to_string();
        let text = read_input_text(f, MAX_TABLE_BYTES)
            .with_context(|| format!("reading measurements {name}"))?;
        rows.extend(fit::measurements_from_csv(&text, &name)?);
    }
    let mut trace = Vec::new();
    for f in &args.trace {
        let name = f.display().to_string();
        let text =
            read_input_text(f, MAX_TABLE_BYTES).with_context(|| format!("reading trace {name}"))?;
        let t = trace_rows(&text, &name)?;
        if t.is_empty() {
            bail!("{name}: no causal FlashAttention forward kernels with shapes (profile with record_shapes=True)");
        }
        trace.extend(t);
    }
    if let Some(ex) = &args.exclude_plans {
        rows.retain(|r| !ex.iter().any(|n| r.plan.contains(n.as_str())));
        trace.retain(|r| !ex.iter().any(|n| r.plan.contains(n.as_str())));
    }
    Ok((rows, trace))
}

/// `--score-only`: `rows` priced by `start`, nothing fitted.
fn run_score(args: &Args, rows: Vec<Measurement>, start: &Pricing, out: Output) -> Result<()> {
    let report = ScoreReport {
        pricing: match (&args.calibration, &args.kernel) {
            (Some(p), _) => p.display().to_string(),
            (None, Some(k)) => format!("the built-in {k} profile"),
            (None, None) => "the built-in default".into(),
        },
        rows: rows.len(),
        summary: fit::summarize(&rows, start),
    };
    out.emit(&report, || {
        format!(
            "{} rows priced by {}, no fitting:\n{}",
            report.rows,
            report.pricing,
            report.summary.table()
        )
    })
}

/// A block's rows or a step's keys, within [`BLOCK_ROWS`].
fn block_rows(s: &str) -> std::result::Result<u32, String> {
    limits::count::<u32>(u64::from(*BLOCK_ROWS.start()), u64::from(*BLOCK_ROWS.end()))(s)
}

/// What to fit: the block models' geometry, lengths and the prior's weight.
fn fit_options(args: &Args) -> FitOptions {
    FitOptions {
        lens: args.lens.clone().unwrap_or_default(),
        prior_weight: args.prior_weight,
        blocks: (args.kernel_model == KernelModel::Blocks).then_some(BlockModel {
            sms: args.sms,
            blocks_per_sm: args.blocks_per_sm,
            block_m: args.block_m,
            block_n: args.block_n,
            head_dim: FWD_HEAD_DIM,
            order: order(args.block_layout),
            placement: match args.placement {
                PlacementArg::InOrder => Placement::InOrder,
                PlacementArg::AnyFreeSlot => Placement::AnyFreeSlot,
            },
            ..BlockModel::h200(0.0, 1.0, 0.0, 0.0, 1.0)
        }),
        bwd_blocks: (args.kernel_model == KernelModel::Blocks).then(|| {
            let t = BlockTimes {
                block_ns: 0.0,
                iter_ns: 1.0,
                row_share: 0.0,
                diag_ns: 0.0,
                empty_ns: 0.0,
            };
            BwdBlockModel {
                sms: args.sms,
                blocks_per_sm: args.bwd_blocks_per_sm,
                block_m: args.bwd_block_m,
                block_n: args.bwd_block_n,
                order: order(args.block_layout),
                dq_launch: args.block_layout == BlockLayout::Skewsim,
                ..BwdBlockModel::h200(0.0, t, t, 1.0)
            }
        }),
        ..FitOptions::default()
    }
}

/// Fit a calibration to the rows not held out (and `trace`), write it to `--out` and score
/// it on the held-out rows against `start`.
fn run_fit(
    args: &Args,
    rows: Vec<Measurement>,
    trace: Vec<Measurement>,
    start: &Pricing,
    out: Output,
) -> Result<()> {
    let seeds = distinct(&rows, |r| r.seed);
    let by_name = args.holdout_schemes.is_some() || args.holdout_plans.is_some();
    let holdout_seeds: Vec<u64> = match &args.holdout_seeds {
        Some(h) => h.clone(),
        None if by_name => Vec::new(),
        None => seeds.iter().skip(1).step_by(2).copied().collect(),
    };
    let schemes = args.holdout_schemes.clone().unwrap_or_default();
    let names = args.holdout_plans.clone().unwrap_or_default();
    let held = |r: &Measurement| {
        holdout_seeds.contains(&r.seed)
            || schemes.contains(&r.scheme)
            || names.iter().any(|n| r.plan.contains(n.as_str()))
    };
    let (test, mut train): (Vec<Measurement>, Vec<Measurement>) =
        rows.into_iter().partition(|r| held(r));
    if test.is_empty() {
        bail!(
            "no plan is held out (seeds {holdout_seeds:?}, schemes {schemes:?}, plan names containing {names:?}): nothing to score"
        );
    }
    let fit_seeds = distinct(&train, |r| r.seed);
    let fit_plans = distinct(&train, |r| r.plan.clone());
    train.extend(trace);
    if train
        .iter()
        .all(|r| !(r.kind == MeasureKind::Attn && r.pass == Pass::Fwd))
    {
        bail!(
            "no forward attention rows left to fit after holding out seeds {holdout_seeds:?}, schemes {schemes:?}, plan names containing {names:?}"
        );
    }
    let f = fit::fit(&train, start, &fit_options(args))?;
    let fitted = Pricing::from_calibration(&f.calibration, "fit")?;
    let json = serde_json::to_string_pretty(&f.calibration)?;
    std::fs::write(&args.out, json + "\n")
        .with_context(|| format!("writing {}", args.out.display()))?;
    let holdout_by_scheme = distinct(&test, |r| r.scheme.clone())
        .into_iter()
        .map(|scheme| {
            let part: Vec<Measurement> = test
                .iter()
                .filter(|r| r.scheme == scheme)
                .cloned()
                .collect();
            SchemeErr {
                plans: distinct(&part, |r| r.plan.clone()),
                before: fit::summarize(&part, start),
                after: fit::summarize(&part, &fitted),
                scheme,
            }
        })
        .collect();
    let report = Report {
        fit_rows: f.attn_rows,
        fit_bwd_rows: f.bwd_rows,
        fit_copy_rows: f.copy_rows,
        fit_rms_rel: f.attn_rms_rel,
        fit_table_rms_rel: f.table_rms_rel,
        blocks: f.calibration.attn_blocks,
        bwd_blocks: f.calibration.attn_bwd_blocks,
        fit_bwd_rms_rel: f.bwd_rms_rel,
        fit_bwd_table_rms_rel: f.bwd_table_rms_rel,
        fit_seeds,
        fit_plans,
        holdout_seeds: distinct(&test, |r| r.seed),
        holdout_plans: distinct(&test, |r| r.plan.clone()),
        holdout_before: fit::summarize(&test, start),
        holdout_after: fit::summarize(&test, &fitted),
        holdout_by_scheme,
        out: args.out.display().to_string(),
    };
    out.emit(&report, || fit_text(&report, &f.calibration))
}

/// The fit's report as text.
fn fit_text(report: &Report, cal: &Calibration) -> String {
    let l = &cal.launch;
    let mut s = format!(
        "fitted on {} plans, seeds {:?}: {} forward launches (rms relative residual {:.2} %; table alone {:.2} %), {} backward calls{}, {} copies\n\
         forward: {}, call {:.2} µs\n\
         backward: {}, call {:.2} µs; backward efficiency (scalar) {:.3}; copy {:.2} µs + {:.3} TB/s, jitter σ {}\n\
         wrote {}\n\nheld out: {} plans {:?}\nbefore calibration (starting table):\n{}\n\
         after calibration:\n{}",
        report.fit_plans.len(),
        report.fit_seeds,
        report.fit_rows,
        100.0 * report.fit_rms_rel,
        100.0 * report.fit_table_rms_rel,
        report.fit_bwd_rows,
        report
            .fit_bwd_rms_rel
            .map(|r| format!(
                " (rms {:.2} %{})",
                100.0 * r,
                match (report.bwd_blocks, report.fit_bwd_table_rms_rel) {
                    (Some(_), Some(t)) => format!("; table alone {:.2} %", 100.0 * t),
                    _ => String::new(),
                }
            ))
            .unwrap_or_default(),
        report.fit_copy_rows,
        report
            .blocks
            .map(|b| format!(
                "blocks ({} SMs × {}, {}×{} tiles, head_dim {}): block {:.1} ns + steps of {:.2} ns ({:.0} % by rows) + {:.2} ns on the diagonal, two on an SM {:.3}× slower each",
                b.sms,
                b.blocks_per_sm,
                b.block_m,
                b.block_n,
                b.head_dim,
                b.block_ns,
                b.iter_ns,
                100.0 * b.row_share,
                b.diag_ns,
                b.pair_slowdown
            ))
            .unwrap_or_else(|| "the table per segment".into()),
        l.attn_launch_us,
        report
            .bwd_blocks
            .map(|b| {
                let t = |t: &BlockTimes| format!(
                    "block {:.1} ns + steps of {:.2} ns ({:.0} % by rows) + {:.2} ns on the diagonal",
                    t.block_ns,
                    t.iter_ns,
                    100.0 * t.row_share,
                    t.diag_ns
                );
                format!(
                    "blocks ({} SMs × {}, {}×{} tiles, head_dim {}): {:.4} ns per query row·head, dQ {}, dK/dV {}, two on an SM {:.3}× slower each",
                    b.sms,
                    b.blocks_per_sm,
                    b.block_m,
                    b.block_n,
                    b.head_dim,
                    b.row_head_ns,
                    t(&b.dq),
                    t(&b.dkdv),
                    b.pair_slowdown
                )
            })
            .unwrap_or_else(|| "the backward table per segment".into()),
        l.attn_bwd_launch_us,
        cal.hardware.attn_bwd_efficiency,
        l.copy_launch_us,
        l.copy_bytes_per_s / 1e12,
        l.jitter_sigma
            .map(|s| format!("{s:.4}"))
            .unwrap_or_else(|| "-".into()),
        report.out,
        report.holdout_plans.len(),
        report.holdout_plans,
        report.holdout_before.table(),
        report.holdout_after.table(),
    );
    if report.holdout_by_scheme.len() > 1 {
        for e in &report.holdout_by_scheme {
            s.push_str(&format!(
                "\nheld-out {} plans {:?}, after calibration:\n{}",
                e.scheme,
                e.plans,
                e.after.table()
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_trace_feeds_the_fit() {
        let text = include_str!("../../traces/h200_sdpa_flash_fwd.json");
        let rows = trace_rows(text, "h200_sdpa_flash_fwd.json").unwrap();
        // 3 shapes × 3 calls: (b, l, h) = (8, 512, 8), (2, 4096, 8), (1, 8192, 32).
        assert_eq!(rows.len(), 9);
        assert_eq!(
            rows[0].segs,
            vec![SegCount {
                q: 512,
                kv: 512,
                n: 8
            }]
        );
        assert_eq!(rows[8].heads, 32);
        assert!((rows[0].measured_ms - 0.033248).abs() < 1e-12);
        let start = Pricing::h200_default().unwrap();
        let f = fit::fit(
            &rows,
            &start,
            &FitOptions {
                lens: vec![512, 4096, 8192],
                iterations: 40,
                prior_weight: 1e-5,
                blocks: None,
                bwd_blocks: None,
                ..FitOptions::default()
            },
        )
        .unwrap();
        // Nine kernels of three shapes: the fitted table reproduces each shape's calls to
        // their own spread (repeat calls of one shape differ by a few %).
        assert!(f.attn_rms_rel < 0.05, "{}", f.attn_rms_rel);
        // The 8192-token 32-head calls: fitted rate within 5 % of the rate measured.
        let measured: Vec<f64> = rows[6..9]
            .iter()
            .map(|r| r.flops / (r.measured_ms * 1e9))
            .collect();
        let eff = skewsim::cost::EffTable::from_points(&f.calibration.attn_fwd, "fit").unwrap();
        let t = eff.tflops(32, 8192, 8192);
        let mean = measured.iter().sum::<f64>() / 3.0;
        assert!((t / mean - 1.0).abs() < 0.05, "{t} vs {measured:?}");
    }
}
