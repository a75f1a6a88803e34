//! `skewsim validate --plan FILE...`: run a Plan's attention on a real GPU and measure it.
//!
//! Owns the edge between the Plan IR and the `validate` crate: a Plan group's per-worker
//! work is cut by the TAP pipeliner (Libra §6.2–6.3, [`pipeliner::pipeline`]) into M head
//! chunks, and each (worker, chunk) becomes one variable-length forward launch of
//! `validate`'s own [`WorkUnit`]s (each Plan segment = the sample-local queries [a, e) with
//! the sample's KV prefix [0, e)), timed with CUDA events, and one backward call of the same
//! units (dQ, dK, dV: the `bwd-v1` kernels after a forward that writes O and the LSE),
//! timed the same way (rows with `pass` = bwd). Each chunk's dispatch bytes (Q and KV
//! arriving) and return bytes (outputs leaving) are moved for real: by default, with one
//! GPU, as device-to-device copies of the planned bytes, which measure HBM, not a network;
//! with `--gpus N` ≥ 2 or `--transport nccl`, worker w runs on GPU w mod N
//! ([`gpu_moves`]) and each chunk's pieces go between the GPUs of their workers as one NCCL
//! grouped send/recv ([`validate::nccl::Mesh`]; with one GPU, `--transport nccl` sends each
//! GPU's pieces to itself through a one-rank communicator, so the NCCL path runs for real).
//!
//! With `--kernel torch-flash` or `torch-cudnn` the same launches, in the same order, run
//! through PyTorch's varlen attention instead, by the Python sidecar
//! ([`super::validate_torch`]), timed by the same protocol (warm-up calls, then back-to-back
//! calls between CUDA events), the copies as device-to-device copies on one GPU.
//!
//! Writes the measurement CSV ([`skewsim::cost::fit::Measurement`] rows) that
//! `skewsim calibrate` reads, and prints predicted vs measured per worker and per step,
//! predictions from the one cost model ([`skewsim::cost::fit::Pricing`]).
//! It may not price anything itself, and the `validate` crate never sees a Plan.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};

use skewsim::balance::libra::pipeliner;
use skewsim::cluster::TopologySpec;
use skewsim::cost::blocks::FWD_HEAD_DIM;
use skewsim::cost::fit::{self, MeasureKind, Measurement, Pass, SegCount};
use skewsim::cost::profile::Kernel;
use skewsim::experiment::inputs::{read_input_text, MAX_SPEC_BYTES};
use skewsim::net::analytical::AnalyticalModel;
use skewsim::net::collective::{analytical_phases, Transfer};
use skewsim::net::GpuId;
use skewsim::plan::Plan;
use validate::gpu::{FwdVariant, Gpu};
use validate::nccl::{Local, Mesh, Move};
use validate::units::{Batch, Heads, Layout, WorkUnit};

use super::validate_torch::{LaunchReq, LaunchTimes, Request, Sidecar, PROTOCOL};
use super::Output;

#[derive(clap::Args)]
pub struct Args {
    /// Plan files (JSON, as `skewsim plan` writes them); each is run in turn.
    #[arg(long, required = true, num_args = 1..)]
    pub plan: Vec<PathBuf>,
    /// Label stored with every row (the seed the plan was made with): `skewsim calibrate`
    /// splits fit and held-out plans by it.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Pipeliner head chunks M per worker (divides h_q/H) [default: the largest of 4, 2, 1
    /// that divides].
    #[arg(long)]
    pub chunks: Option<u32>,
    /// The attention kernel the launches run on: `skewsim` (the project's NVRTC kernels,
    /// no Python), `torch-flash` (PyTorch's varlen FlashAttention) or `torch-cudnn`
    /// (PyTorch's cuDNN attention, where it computes these units' causal mask); the torch
    /// kernels run through `--sidecar` on one GPU, with copies for transfers. Predictions
    /// use the kernel's built-in profile (`torch-cudnn`: torch-flash's) unless
    /// `--calibration`.
    #[arg(long, default_value = "skewsim", value_parser = ["skewsim", "torch-flash", "torch-cudnn"])]
    pub kernel: String,
    /// Python interpreter (with PyTorch) that runs the torch kernels' sidecar.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// The sidecar script the torch kernels run through.
    #[arg(long, default_value = "validate/torch/sidecar.py")]
    pub sidecar: PathBuf,
    /// Forward kernel variant of the `validate` crate (`--kernel skewsim`).
    #[arg(long, default_value = "v3w4")]
    pub variant: String,
    /// Untimed launches before each timed series.
    #[arg(long, default_value_t = 2, value_parser = super::limits::count::<usize>(0, super::limits::MAX_REPS))]
    pub warmup: usize,
    /// Timed launches per (worker, chunk); the row keeps median, p10 and p90.
    #[arg(long, default_value_t = 5, value_parser = super::limits::count::<usize>(1, super::limits::MAX_REPS))]
    pub reps: usize,
    /// CUDA device ordinal (one GPU: workers run one after another on it).
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// GPUs to spread workers over (devices 0..N; worker w runs on GPU w mod N). With
    /// N >= 2 each chunk's transfers go through NCCL grouped send/recv between the GPUs
    /// of their workers; with 1, they are device-to-device copies on `--device` unless
    /// `--transport nccl`.
    #[arg(long, default_value_t = 1)]
    pub gpus: usize,
    /// How transfers move: `auto` (copies on one GPU, NCCL on several), `copy` (one GPU
    /// only) or `nccl` (NCCL even on one GPU: each GPU's pieces to itself as NCCL
    /// send/recv to its own rank).
    #[arg(long, default_value = "auto", value_parser = ["auto", "copy", "nccl"])]
    pub transport: String,
    /// Skip the backward pass (forward rows and copies only).
    #[arg(long)]
    pub no_bwd: bool,
    /// Cut the plans into launches and print, per plan, the launches and the predicted GPU
    /// time of the whole measurement (warm-up + timed repetitions, both passes), without a
    /// GPU.
    #[arg(long)]
    pub dry_run: bool,
    /// Measurement CSV to write.
    #[arg(short, long, default_value = "measurements.csv")]
    pub out: PathBuf,
    /// Price predictions with this calibration file (JSON, `skewsim calibrate -o`) instead
    /// of `--kernel`'s built-in profile.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Topology whose first node's GPUs 0..N price the NCCL exchanges (the simulator's
    /// analytical network model over its NVLink), when transfers go through NCCL.
    #[arg(long, default_value = "topologies/dgx-h200-roce.toml")]
    pub topology: PathBuf,
}

/// The simulator's price of one NCCL exchange: the moves between GPUs as one phase on the
/// analytical network model of a node, after each GPU's moves to itself as copies.
struct ExchangeModel {
    net: AnalyticalModel,
    gpus: usize,
}

impl ExchangeModel {
    fn load(file: &std::path::Path, gpus: usize) -> Result<ExchangeModel> {
        let name = file.display().to_string();
        let text = read_input_text(file, MAX_SPEC_BYTES)
            .with_context(|| format!("reading topology {name} (--topology)"))?;
        let topo = TopologySpec::parse(&text, &name)?.build(Some(1))?;
        if (topo.gpus_per_node as usize) < gpus {
            bail!(
                "--topology {name}: a node of {} GPUs cannot hold --gpus {gpus}: allowed a topology with at least {gpus} GPUs per node",
                topo.gpus_per_node
            );
        }
        Ok(ExchangeModel {
            net: AnalyticalModel::new(std::sync::Arc::new(topo)),
            gpus,
        })
    }

    /// Predicted time of exchanging `moves`, ms.
    fn predict_ms(&self, pricing: &fit::Pricing, moves: &[Move]) -> f64 {
        let mut local = vec![0.0f64; self.gpus];
        let mut remote = Vec::new();
        for m in moves.iter().filter(|m| m.bytes > 0) {
            if m.src == m.dst {
                local[m.src] += pricing.copy_ms(m.bytes as u64);
            } else {
                remote.push(Transfer {
                    src: m.src as GpuId,
                    dst: m.dst as GpuId,
                    bytes: m.bytes as u64,
                });
            }
        }
        let net_ps = if remote.is_empty() {
            0
        } else {
            analytical_phases(&self.net, &vec![remote], 0)
        };
        local.into_iter().fold(0.0, f64::max) + net_ps as f64 * 1e-9
    }
}

/// Bytes of one launch while a plan is cut into launches and priced (1.6 KB measured on a
/// plan of idle workers; a launch's units and moves add to it).
const LAUNCH_BYTES: f64 = 2048.0;

/// One (worker, chunk) of a plan group: what the GPU runs and moves.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchSpec {
    pub ga: u32,
    pub pool: u32,
    pub worker: u32,
    pub chunk: u32,
    /// Query heads per unit in the launch (h_q / (H·M)).
    pub heads: u32,
    /// KV heads the launch reads per unit (GQA, at least 1).
    pub heads_kv: u32,
    /// Plan units on the worker.
    pub units: usize,
    /// The kernel's batch: the samples the units touch and one [`WorkUnit`] per segment.
    pub batch: Batch,
    /// Segment (query length, KV length) histogram, for pricing.
    pub segs: Vec<SegCount>,
    /// Forward FLOPs (the pipeliner's count).
    pub flops: f64,
    /// Bytes arriving before the chunk runs (Q and KV pieces).
    pub dispatch_bytes: u64,
    /// Bytes of outputs sent back after it runs.
    pub return_bytes: u64,
    /// The dispatch pieces as (src worker, dst worker, bytes).
    pub dispatch_moves: Vec<(u32, u32, u64)>,
    /// The return pieces as (src worker, dst worker, bytes).
    pub return_moves: Vec<(u32, u32, u64)>,
}

/// The default M: the largest of 4, 2, 1 dividing h_q/H.
pub fn default_chunks(plan: &Plan) -> u32 {
    let w = plan.heads_per_shard();
    [4, 2, 1].into_iter().find(|m| w % m == 0).unwrap_or(1)
}

/// Cut a plan into launches: per group, per worker, per head chunk (pipeliner order); their
/// memory is checked against the limit first.
pub fn launches(plan: &Plan, m: u32) -> Result<Vec<LaunchSpec>> {
    let workers: u64 = plan.groups.iter().map(|g| g.workers.len() as u64).sum();
    let n = workers * u64::from(m);
    super::limits::check_memory(
        &format!("{n} launches ({workers} workers × {m} head chunks)"),
        n as f64 * LAUNCH_BYTES,
    )?;
    let group_q_per_kv = plan
        .shape
        .heads_q
        .checked_div(plan.shape.heads_kv)
        .unwrap_or(0);
    let mut out = Vec::new();
    for g in &plan.groups {
        let pipes = pipeliner::pipeline(plan, g, m)?;
        let seqs: HashMap<u32, &skewsim::plan::PlanSeq> =
            g.sequences.iter().map(|s| (s.id, s)).collect();
        let units: HashMap<u32, &skewsim::plan::WorkUnit> =
            g.units.iter().map(|u| (u.id, u)).collect();
        for p in &pipes {
            // The worker's batch (same for every chunk: chunks cut heads, not tokens).
            let mut sample_of: HashMap<(u32, u32), usize> = HashMap::new();
            let mut batch = Batch {
                sample_lens: Vec::new(),
                units: Vec::new(),
            };
            let mut hist: HashMap<(u32, u32), u32> = HashMap::new();
            for id in &p.units {
                let u = units.get(id).ok_or_else(|| {
                    anyhow!("plan group ga {} pool {}: unit {id} missing", g.ga, g.pool)
                })?;
                let s = seqs.get(&u.seq).ok_or_else(|| {
                    anyhow!("plan group ga {} pool {}: unit {} names sequence {} which is not in the group", g.ga, g.pool, u.id, u.seq)
                })?;
                for seg in &u.segments {
                    if seg.end <= seg.start {
                        continue;
                    }
                    let len = *s.samples.get(seg.sample as usize).ok_or_else(|| {
                        anyhow!(
                            "unit {}: segment sample {} out of range 0..{}",
                            u.id,
                            seg.sample,
                            s.samples.len()
                        )
                    })?;
                    let next = batch.sample_lens.len();
                    let idx = *sample_of.entry((u.seq, seg.sample)).or_insert(next);
                    if idx == next {
                        batch.sample_lens.push(len);
                    }
                    batch.units.push(WorkUnit {
                        sample: idx,
                        a: seg.start,
                        e: seg.end,
                    });
                    *hist.entry((seg.end - seg.start, seg.end)).or_insert(0) += 1;
                }
            }
            let mut segs: Vec<SegCount> = hist
                .into_iter()
                .map(|((q, kv), n)| SegCount { q, kv, n })
                .collect();
            segs.sort_by_key(|s| (s.q, s.kv));
            for c in &p.chunks {
                let heads_kv = if group_q_per_kv > 0 && c.heads % group_q_per_kv == 0 {
                    c.heads / group_q_per_kv
                } else {
                    1
                };
                out.push(LaunchSpec {
                    ga: g.ga,
                    pool: g.pool,
                    worker: p.worker,
                    chunk: c.index,
                    heads: c.heads,
                    heads_kv,
                    units: p.units.len(),
                    batch: batch.clone(),
                    segs: segs.clone(),
                    flops: c.flops,
                    dispatch_bytes: c.dispatch.iter().map(|t| t.bytes).sum(),
                    return_bytes: c.returns.iter().map(|t| t.bytes).sum(),
                    dispatch_moves: c.dispatch.iter().map(|t| (t.src, t.dst, t.bytes)).collect(),
                    return_moves: c.returns.iter().map(|t| (t.src, t.dst, t.bytes)).collect(),
                });
            }
        }
    }
    Ok(out)
}

/// The GPU (index into the opened GPUs) worker `w` runs on: w mod `gpus`.
pub fn gpu_of(worker: u32, gpus: usize) -> usize {
    worker as usize % gpus.max(1)
}

/// Pieces between workers (src, dst, bytes) as moves between their GPUs ([`gpu_of`]),
/// merged per GPU pair, in (src, dst) order.
pub fn gpu_moves(pieces: &[(u32, u32, u64)], gpus: usize) -> Result<Vec<Move>> {
    if gpus == 0 {
        bail!("invalid GPU count 0: allowed 1 or more");
    }
    let mut m: std::collections::BTreeMap<(usize, usize), usize> = Default::default();
    for &(src, dst, b) in pieces {
        *m.entry((gpu_of(src, gpus), gpu_of(dst, gpus))).or_insert(0) += usize::try_from(b)?;
    }
    Ok(m.into_iter()
        .map(|((src, dst), bytes)| Move { src, dst, bytes })
        .collect())
}

/// The measurement rows of one launch spec (attention, dispatch copy, return copy) with
/// measured figures filled in by `measure` (median, p10, p90 ms).
#[allow(clippy::too_many_arguments)]
pub(crate) fn rows_of(
    spec: &LaunchSpec,
    plan_name: &str,
    seed: u64,
    plan: &Plan,
    tiles: usize,
    attn: (f64, f64, f64),
    bwd: Option<(f64, f64, f64)>,
    dispatch: (f64, f64, f64),
    ret: (f64, f64, f64),
) -> Vec<Measurement> {
    let base = Measurement {
        kind: MeasureKind::Attn,
        pass: Pass::Fwd,
        plan: plan_name.to_string(),
        seed,
        scheme: plan.scheme.clone(),
        step: plan.step,
        ga: spec.ga,
        pool: spec.pool,
        worker: spec.worker,
        chunk: spec.chunk,
        units: spec.units as u64,
        segments: spec.batch.units.len() as u64,
        tiles: tiles as u64,
        heads: spec.heads,
        kv_heads: spec.heads_kv,
        head_dim: plan.shape.head_dim,
        q_tokens: spec
            .segs
            .iter()
            .map(|s| u64::from(s.q) * u64::from(s.n))
            .sum(),
        flops: spec.flops,
        bytes: 0,
        predicted_ms: None,
        measured_ms: attn.0,
        p10_ms: attn.1,
        p90_ms: attn.2,
        segs: spec.segs.clone(),
        mask: plan.shape.mask,
    };
    let copy = |kind, bytes, t: (f64, f64, f64)| Measurement {
        kind,
        tiles: 0,
        flops: 0.0,
        bytes,
        measured_ms: t.0,
        p10_ms: t.1,
        p90_ms: t.2,
        segs: Vec::new(),
        ..base.clone()
    };
    let mut rows = vec![
        copy(MeasureKind::Dispatch, spec.dispatch_bytes, dispatch),
        base.clone(),
        copy(MeasureKind::Return, spec.return_bytes, ret),
    ];
    if let Some(b) = bwd {
        rows.push(Measurement {
            pass: Pass::Bwd,
            measured_ms: b.0,
            p10_ms: b.1,
            p90_ms: b.2,
            ..base
        });
    }
    rows
}

fn quantiles(ms: &[f64]) -> Result<(f64, f64, f64)> {
    let q = |p| validate::stats::quantile(ms, p).ok_or_else(|| anyhow!("no valid timings"));
    Ok((q(0.5)?, q(0.1)?, q(0.9)?))
}

/// The rows of launches timed by the torch sidecar (`times` in `specs`' order), as
/// [`rows_of`] writes the project kernel's; `tiles` counts the 128-row query tiles.
pub(crate) fn torch_rows(
    specs: &[LaunchSpec],
    times: &[LaunchTimes],
    plan_name: &str,
    seed: u64,
    plan: &Plan,
) -> Result<Vec<Measurement>> {
    let mut rows = Vec::with_capacity(4 * specs.len());
    for (spec, t) in specs.iter().zip(times) {
        let (attn, tiles) = match &t.fwd_ms {
            Some(ms) => (quantiles(ms)?, Layout::new(&spec.batch, 128)?.tiles.len()),
            None => ((0.0, 0.0, 0.0), 0),
        };
        let bwd = t.bwd_ms.as_deref().map(quantiles).transpose()?;
        let (d, r) = (quantiles(&t.dispatch_ms)?, quantiles(&t.return_ms)?);
        rows.extend(rows_of(spec, plan_name, seed, plan, tiles, attn, bwd, d, r));
    }
    Ok(rows)
}

/// Every plan's launches through the torch sidecar on `--device`.
fn measure_torch(args: &Args, plans: &[(String, Plan)]) -> Result<(Vec<Measurement>, String)> {
    if args.gpus != 1 || args.transport == "nccl" {
        bail!(
            "invalid --kernel {} with --gpus {} --transport {}: allowed one GPU with copies (the torch kernels run on --device; --gpus and NCCL go with --kernel skewsim)",
            args.kernel,
            args.gpus,
            args.transport
        );
    }
    let sidecar = Sidecar {
        python: args.python.clone(),
        script: args.sidecar.clone(),
    };
    let mut rows = Vec::new();
    let mut device = String::new();
    for (name, plan) in plans {
        let t0 = std::time::Instant::now();
        let m = args.chunks.unwrap_or_else(|| default_chunks(plan));
        let specs = launches(plan, m).with_context(|| format!("plan {name}"))?;
        let req = Request {
            protocol: PROTOCOL,
            kernel: args.kernel.clone(),
            device: args.device,
            warmup: args.warmup,
            reps: args.reps,
            head_dim: plan.shape.head_dim,
            bwd: !args.no_bwd,
            seed: args.seed,
            launches: specs.iter().map(LaunchReq::of).collect(),
        };
        let (ready, times) = sidecar.run(&req).with_context(|| format!("plan {name}"))?;
        device = format!("{ready}, --kernel {}", args.kernel);
        let r = torch_rows(&specs, &times, name, args.seed, plan)?;
        eprintln!(
            "{name}: {} rows in {:.1} s ({device})",
            r.len(),
            t0.elapsed().as_secs_f64()
        );
        rows.extend(r);
    }
    Ok((rows, device))
}

/// Elements of `v` (bf16 words) that are NaN.
fn nan_bf16(v: &[u16]) -> usize {
    v.iter()
        .filter(|&&x| validate::bf16::to_f32(x).is_nan())
        .count()
}

/// Run every launch of one plan on `gpus`; rows in launch order (per launch: dispatch,
/// forward, return, then backward unless `--no-bwd`).
fn measure_plan(
    gpus: &mut [Gpu],
    mesh: Option<(&Mesh, &ExchangeModel, &fit::Pricing)>,
    args: &Args,
    plan: &Plan,
    plan_name: &str,
) -> Result<Vec<Measurement>> {
    let m = args.chunks.unwrap_or_else(|| default_chunks(plan));
    let specs = launches(plan, m).with_context(|| format!("plan {plan_name}"))?;
    let var = FwdVariant::parse(&args.variant, plan.shape.head_dim)?;
    // The backward kernels take 64-row query tiles; this forward writes their O and LSE.
    let var64 = FwdVariant::v1(plan.shape.head_dim, 4);
    let (max_q, max_kv, heads, heads_kv) = specs.iter().fold((1, 1, 1, 1), |acc, s| {
        let q: u32 = s.batch.units.iter().map(|u| u.e - u.a).sum();
        let kv: u32 = s.batch.sample_lens.iter().sum();
        (
            acc.0.max(q),
            acc.1.max(kv),
            acc.2.max(s.heads),
            acc.3.max(s.heads_kv),
        )
    });
    let heads_max = Heads::new(heads, heads_kv, plan.shape.head_dim)
        .with_context(|| format!("{plan_name}: heads {heads}/{heads_kv}"))?;
    let mut bufs = Vec::with_capacity(gpus.len());
    let mut gbufs = Vec::with_capacity(gpus.len());
    for gpu in gpus.iter() {
        let b = validate::harness::upload_random_rows(gpu, heads_max, max_q, max_kv.max(max_q), 7)?;
        if !args.no_bwd {
            gbufs.push(gpu.alloc_bwd_within(&b, plan.shape.head_dim)?);
        }
        bufs.push(b);
    }
    let n = gpus.len();
    let moves = |pieces: &[(u32, u32, u64)]| gpu_moves(pieces, n);
    let scale = 1.0 / (plan.shape.head_dim as f32).sqrt();
    let mut rows = Vec::with_capacity(4 * specs.len());
    for spec in &specs {
        let g = gpu_of(spec.worker, n);
        let (gpu, buf) = (&mut gpus[g], &mut bufs[g]);
        let h = Heads::new(spec.heads, spec.heads_kv, plan.shape.head_dim)?;
        let layout = Layout::new(&spec.batch, var.block_m())?;
        // Every chunk of a worker runs the same units: poison and check the outputs once per
        // worker (chunk 0), and only the elements the layout writes.
        let check = spec.chunk == 0;
        let (attn, tiles) = if layout.tiles.is_empty() {
            ((0.0, 0.0, 0.0), 0)
        } else {
            gpu.set_layout_within(buf, &layout, h, false)?;
            if check {
                gpu.poison(buf)?;
            }
            let ms = gpu.time_fwd(var, h, buf, scale, args.warmup, args.reps)?;
            if check {
                let used = layout.q_rows * h.h_q as usize * h.head_dim as usize;
                let bad = nan_bf16(&gpu.download_o_prefix(buf, used)?);
                if bad > 0 {
                    bail!(
                        "{plan_name}: worker {} chunk {}: {bad} output elements unwritten or NaN",
                        spec.worker,
                        spec.chunk
                    );
                }
            }
            (quantiles(&ms)?, layout.tiles.len())
        };
        let bwd = if args.no_bwd || layout.tiles.is_empty() {
            None
        } else {
            let gb = &mut gbufs[g];
            let l64 = Layout::new(&spec.batch, 64)?;
            let key_tiles = l64.key_tiles(&spec.batch, 64)?;
            gpu.set_layout_within(buf, &l64, h, false)?;
            gpu.set_bwd_layout(gb, &l64, &key_tiles, h)?;
            if check {
                gpu.poison(buf)?;
                gpu.poison_dq(gb)?;
            }
            gpu.launch_fwd(var64, h, buf, scale)?;
            let ms = gpu.time_bwd(h, buf, gb, scale, args.warmup, args.reps)?;
            if check {
                let gr = gpu.download_bwd_used(gb)?;
                let bad = gr
                    .dq
                    .iter()
                    .chain(&gr.dk)
                    .chain(&gr.dv)
                    .filter(|x| !x.is_finite())
                    .count();
                if bad > 0 {
                    bail!(
                        "{plan_name}: worker {} chunk {}: {bad} gradient elements unwritten or not finite",
                        spec.worker,
                        spec.chunk
                    );
                }
            }
            Some(quantiles(&ms)?)
        };
        let (d, r) = match mesh {
            Some((mesh, _, _)) => (
                quantiles(&mesh.time_exchange(
                    &moves(&spec.dispatch_moves)?,
                    args.warmup,
                    args.reps,
                )?)?,
                quantiles(&mesh.time_exchange(
                    &moves(&spec.return_moves)?,
                    args.warmup,
                    args.reps,
                )?)?,
            ),
            None => (
                quantiles(&gpu.time_copy(
                    usize::try_from(spec.dispatch_bytes)?,
                    args.warmup,
                    args.reps,
                )?)?,
                quantiles(&gpu.time_copy(
                    usize::try_from(spec.return_bytes)?,
                    args.warmup,
                    args.reps,
                )?)?,
            ),
        };
        let mut got = rows_of(spec, plan_name, args.seed, plan, tiles, attn, bwd, d, r);
        if let Some((_, model, pricing)) = mesh {
            // rows_of's order: dispatch, forward, return[, backward]
            got[0].predicted_ms = Some(model.predict_ms(pricing, &moves(&spec.dispatch_moves)?));
            got[2].predicted_ms = Some(model.predict_ms(pricing, &moves(&spec.return_moves)?));
        }
        rows.extend(got);
    }
    Ok(rows)
}

/// Measure the plans on `--kernel` and compare with the pricing: `--calibration`'s, else the
/// kernel's built-in profile.
pub fn run(args: Args, out: Output) -> Result<()> {
    let profile = if args.kernel == "skewsim" {
        Kernel::Skewsim
    } else {
        Kernel::TorchFlash
    };
    let pricing = match &args.calibration {
        Some(p) => super::calfile::pricing(Some(p), None)?,
        None => profile.pricing()?,
    };
    // Read and check every plan before touching the GPU.
    let mut plans = Vec::new();
    for f in &args.plan {
        let (plan, _) = super::check_plan::check_file(f)?;
        if !plan.shape.mask.is_causal() {
            bail!(
                "{}: invalid shape.mask = {}: causal (the validation kernels compute causal \
                 attention only)",
                f.display(),
                plan.shape.mask
            );
        }
        let name = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| f.display().to_string());
        plans.push((name, plan));
    }
    if args.gpus == 0 {
        bail!("invalid --gpus = 0: allowed 1 or more");
    }
    // The variant is checked before any GPU work, dry runs included.
    FwdVariant::parse(&args.variant, FWD_HEAD_DIM).context("--variant")?;
    if args.dry_run {
        let mut text = String::from(
            "plan                          launches  heads/call  max q rows  fwd FLOPs  predicted GPU s\n",
        );
        for (name, plan) in &plans {
            let m = args.chunks.unwrap_or_else(|| default_chunks(plan));
            let specs = launches(plan, m).with_context(|| format!("plan {name}"))?;
            let mut rows = Vec::new();
            for s in &specs {
                let tiles = s.batch.units.len();
                rows.extend(rows_of(
                    s,
                    name,
                    args.seed,
                    plan,
                    tiles,
                    (0.0, 0.0, 0.0),
                    (!args.no_bwd).then_some((0.0, 0.0, 0.0)),
                    (0.0, 0.0, 0.0),
                    (0.0, 0.0, 0.0),
                ));
            }
            let once: f64 = rows.iter().map(|r| pricing.predict_ms(r)).sum::<f64>() * 1e-3;
            let max_q = specs
                .iter()
                .map(|s| s.batch.units.iter().map(|u| u.e - u.a).sum::<u32>())
                .max()
                .unwrap_or(0);
            let mut heads: Vec<u32> = specs.iter().map(|s| s.heads).collect();
            heads.sort_unstable();
            heads.dedup();
            text.push_str(&format!(
                "{name:<30}{:>8}{:>12}{:>12}{:>11.3e}{:>17.1}\n",
                specs.len(),
                format!("{heads:?}"),
                max_q,
                specs.iter().map(|s| s.flops).sum::<f64>(),
                once * (args.warmup + args.reps) as f64,
            ));
        }
        print!("{text}");
        return Ok(());
    }
    let (mut rows, device, exchanged) = if args.kernel == "skewsim" {
        measure_own(&args, &plans, &pricing)?
    } else {
        let (rows, device) = measure_torch(&args, &plans)?;
        (rows, device, None)
    };
    for r in rows.iter_mut().filter(|r| r.predicted_ms.is_none()) {
        r.predicted_ms = Some(pricing.predict_ms(r));
    }
    let csv = fit::measurements_to_csv(&rows)?;
    std::fs::write(&args.out, csv).with_context(|| format!("writing {}", args.out.display()))?;
    let summary = fit::summarize(&rows, &pricing);
    let exchanges = exchanged.map(|gpus| {
        let pairs: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.kind != MeasureKind::Attn && r.bytes > 0)
            .map(|r| (r.predicted_ms.unwrap_or(0.0), r.measured_ms))
            .collect();
        (gpus, fit::ErrStats::of(&pairs))
    });
    out.emit(&summary, || {
        let mut text = format!(
            "wrote {} ({} rows; {device})\n{}",
            args.out.display(),
            rows.len(),
            summary.table()
        );
        if let Some((gpus, e)) = exchanges {
            text.push_str(&format!(
                "{:<30}{:>5}{:>14.2}{:>11.2}{:>11.2}\n(the copy line prices the NCCL exchanges as HBM copies; the exchange line by the network model of {})\n",
                format!("NCCL exchange, {gpus} GPU(s)"),
                e.n,
                e.median_ape,
                e.p90_ape,
                e.max_ape,
                args.topology.display()
            ));
        }
        text
    })
}

/// Every plan's launches on the project's kernels: rows, the device line, and the GPU count
/// whose transfers went through NCCL (None: copies).
fn measure_own(
    args: &Args,
    plans: &[(String, Plan)],
    pricing: &fit::Pricing,
) -> Result<(Vec<Measurement>, String, Option<usize>)> {
    let open = |ordinal: usize| {
        Gpu::open(ordinal).map_err(|e| match e {
            validate::Error::NoDriver => anyhow!(
                "no CUDA driver found: `skewsim validate` runs plans on an NVIDIA GPU (libcuda could not be loaded here)"
            ),
            other => anyhow!(other),
        })
    };
    let visible = Gpu::count().map_err(|e| match e {
        validate::Error::NoDriver => anyhow!(
            "no CUDA driver found: `skewsim validate` runs plans on an NVIDIA GPU (libcuda could not be loaded here)"
        ),
        other => anyhow!(other),
    })?;
    if args.gpus > visible {
        bail!(
            "invalid --gpus = {}: {visible} GPU(s) visible here (CUDA_VISIBLE_DEVICES applies): allowed 1 to {visible}",
            args.gpus
        );
    }
    let ordinals: Vec<usize> = if args.gpus == 1 {
        vec![args.device]
    } else {
        (0..args.gpus).collect()
    };
    let mut gpus = Vec::with_capacity(ordinals.len());
    for &o in &ordinals {
        gpus.push(open(o)?);
    }
    let nccl = match args.transport.as_str() {
        "nccl" => true,
        "copy" if gpus.len() >= 2 => bail!(
            "invalid --transport copy with --gpus {}: allowed auto or nccl (transfers between GPUs go through NCCL)",
            gpus.len()
        ),
        "copy" => false,
        _ => gpus.len() >= 2,
    };
    let mesh = if nccl {
        let local = if gpus.len() == 1 {
            Local::Nccl
        } else {
            Local::Copy
        };
        let m = Mesh::new(gpus.iter().map(|g| g.stream.clone()).collect(), local)?;
        eprintln!(
            "NCCL {}: {} rank(s), a GPU's pieces to itself {}",
            Mesh::nccl_version()
                .map(|v| v.to_string())
                .unwrap_or_else(|e| e.to_string()),
            m.len(),
            if local == Local::Nccl {
                "as NCCL send/recv to its own rank"
            } else {
                "as device-to-device copies"
            }
        );
        Some(m)
    } else {
        None
    };
    let gpu = &gpus[0];
    eprintln!(
        "{} GPU(s) from device {}: {} ({} SMs), driver {}; transfers {}",
        gpus.len(),
        ordinals[0],
        gpu.name,
        gpu.sm_count,
        gpu.driver_version,
        if mesh.is_some() {
            "through NCCL grouped send/recv (worker w on GPU w mod N; one GPU: to itself, measuring NCCL's local path, not a network)"
        } else {
            "as device-to-device copies (HBM, not a network)"
        }
    );
    let device = format!("GPU {}, driver {}", gpu.name, gpu.driver_version);
    let exchange = match &mesh {
        Some(_) => Some(ExchangeModel::load(&args.topology, gpus.len())?),
        None => None,
    };
    let mut rows = Vec::new();
    for (name, plan) in plans {
        let t0 = std::time::Instant::now();
        let net = mesh
            .as_ref()
            .zip(exchange.as_ref())
            .map(|(m, e)| (m, e, pricing));
        let r = measure_plan(&mut gpus, net, args, plan, name)?;
        eprintln!(
            "{name}: {} rows in {:.1} s",
            r.len(),
            t0.elapsed().as_secs_f64()
        );
        rows.extend(r);
    }
    Ok((rows, device, exchange.map(|_| gpus.len())))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use skewsim::balance::libra::{consecutive_pools, plan_step, LibraParams};
    use skewsim::workload::{PackedSeq, Sample};

    /// Two packed sequences (one with two long samples, one with nine short ones), one pool
    /// of 2 replicas × CP 2, tiles of 64 tokens.
    pub(crate) fn small_plan() -> Plan {
        let batch: Vec<PackedSeq> = [vec![300u32, 200], vec![50; 9]]
            .iter()
            .map(|l| PackedSeq {
                samples: l
                    .iter()
                    .map(|&len| Sample {
                        doc: 0,
                        offset: 0,
                        len,
                        cut: false,
                    })
                    .collect(),
                capacity: 512,
            })
            .collect();
        let p = LibraParams {
            pool_size: 2,
            cp: 2,
            tile_tokens: 64,
            ..LibraParams::default()
        };
        plan_step(0, &batch, &consecutive_pools(2, 2), 2, &p).unwrap()
    }

    #[test]
    fn exchanges_are_priced_by_the_nodes_links_after_the_local_copies() {
        // test-small: 4 GPUs a node, NVLink 100 GB/s at efficiency 1, 1 µs latency.
        let topo = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/topologies/test-small.toml"
        ));
        let m = ExchangeModel::load(topo, 2).unwrap();
        let pricing = fit::Pricing::h200_default().unwrap();
        let mv = |src, dst, bytes| Move { src, dst, bytes };
        // 100 MB over GPU 0's NVLink port: 1 ms plus start-up; GPU 0's 10 MB to itself is a
        // copy first; GPU 1's 50 MB back shares no port direction with it.
        let moves = [
            mv(0, 1, 100_000_000),
            mv(1, 0, 50_000_000),
            mv(0, 0, 10_000_000),
        ];
        let copy = pricing.copy_ms(10_000_000);
        let t = m.predict_ms(&pricing, &moves);
        assert!(t > 1.0 + copy && t < 1.0 + copy + 0.01, "{t} vs {copy}");
        // only copies: the slowest GPU's
        let local = [mv(0, 0, 10_000_000), mv(1, 1, 20_000_000)];
        assert_eq!(m.predict_ms(&pricing, &local), pricing.copy_ms(20_000_000));
        let e = ExchangeModel::load(topo, 8).err().unwrap().to_string();
        assert!(e.contains("a node of 4 GPUs cannot hold --gpus 8"), "{e}");
    }

    #[test]
    fn worker_pieces_map_to_gpu_pairs() {
        // Workers 0..4 on 2 GPUs: 0,2 → GPU 0; 1,3 → GPU 1.
        let pieces = [(1, 0, 10), (3, 0, 5), (2, 0, 7), (0, 1, 1), (2, 3, 4)];
        let m = gpu_moves(&pieces, 2).unwrap();
        let want = [
            Move {
                src: 0,
                dst: 0,
                bytes: 7,
            },
            Move {
                src: 0,
                dst: 1,
                bytes: 5,
            },
            Move {
                src: 1,
                dst: 0,
                bytes: 15,
            },
        ];
        assert_eq!(m, want);
        // One GPU: everything is one local copy of all the bytes.
        let one = gpu_moves(&pieces, 1).unwrap();
        assert_eq!(
            one,
            vec![Move {
                src: 0,
                dst: 0,
                bytes: 27
            }]
        );
        assert!(gpu_moves(&pieces, 0).is_err());
    }

    #[test]
    fn workers_map_to_any_gpu_count_and_every_byte_travels_once() {
        let plan = small_plan();
        let specs = launches(&plan, default_chunks(&plan)).unwrap();
        let workers: Vec<u32> = {
            let mut w: Vec<u32> = specs.iter().map(|s| s.worker).collect();
            w.sort_unstable();
            w.dedup();
            w
        };
        assert_eq!(workers, vec![0, 1, 2, 3]);
        for n in 1..=8usize {
            // Round robin: GPU g holds workers g, g + n, ...; none is left out.
            for &w in &workers {
                assert_eq!(gpu_of(w, n), w as usize % n);
                assert!(gpu_of(w, n) < n);
            }
            for local in [Local::Copy, Local::Nccl] {
                for s in &specs {
                    for pieces in [&s.dispatch_moves, &s.return_moves] {
                        let moves = gpu_moves(pieces, n).unwrap();
                        let total: u64 = pieces.iter().map(|p| p.2).sum();
                        let moved: usize = moves.iter().map(|m| m.bytes).sum();
                        assert_eq!(moved as u64, total);
                        let ops = validate::nccl::exchange_ops(&moves, n, local).unwrap();
                        let sent: usize = ops
                            .sends
                            .iter()
                            .flatten()
                            .map(|&(_, i)| moves[i].bytes)
                            .sum();
                        let copied: usize = ops.copies.iter().map(|&i| moves[i].bytes).sum();
                        assert_eq!((sent + copied) as u64, total);
                        // With one GPU and NCCL, everything is a send to itself.
                        if n == 1 && local == Local::Nccl {
                            assert!(ops.copies.is_empty());
                            assert!(ops.sends[0].iter().all(|&(peer, _)| peer == 0));
                        }
                        // With as many GPUs as workers, a piece between two workers is
                        // one NCCL send from the source worker's GPU.
                        if n == 4 {
                            for &(src, dst, b) in pieces.iter().filter(|p| p.0 != p.1 && p.2 > 0) {
                                assert!(moves.iter().any(|m| m.src == src as usize
                                    && m.dst == dst as usize
                                    && m.bytes as u64 >= b));
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn launches_cover_the_plan_flops_and_bytes() {
        let plan = small_plan();
        let m = default_chunks(&plan);
        let specs = launches(&plan, m).unwrap();
        let total: f64 = specs.iter().map(|s| s.flops).sum();
        let want: f64 = plan
            .groups
            .iter()
            .flat_map(|g| &g.units)
            .map(|u| u.flops)
            .sum();
        assert!((total - want).abs() <= 1e-9 * want, "{total} vs {want}");
        // The kernel's own FLOP count of each launch equals the pipeliner's.
        for s in &specs {
            let h = Heads::new(s.heads, s.heads_kv, plan.shape.head_dim).unwrap();
            let k = s.batch.flops(h);
            assert!(
                (k - s.flops).abs() <= 1e-9 * s.flops.max(1.0),
                "{k} vs {}",
                s.flops
            );
            let hist: u32 = s.segs.iter().map(|x| x.n).sum();
            assert_eq!(hist as usize, s.batch.units.len());
        }
        let bytes: u64 = specs
            .iter()
            .map(|s| s.dispatch_bytes + s.return_bytes)
            .sum();
        let want: u64 = plan
            .groups
            .iter()
            .flat_map(|g| &g.transfers)
            .map(|t| t.bytes)
            .sum();
        assert_eq!(bytes, want);
    }
}
