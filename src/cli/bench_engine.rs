//! Engine benchmarks: raw event throughput, one full training step of thousands of GPUs,
//! and wall time against GPU count. Each `pub fn` returns rows for the `skewsim bench`
//! registry; [`run`] prints them for the `bench-engine` subcommand.
//!
//! The network is the engine's `StubNet` (fixed alpha + bytes/bandwidth, no contention)
//! until the cluster's analytical model is plugged in at merge.

use anyhow::Result;
use serde::Serialize;
use std::time::Instant;

use skewsim::cost::{CostModel, ModelConfig};
use skewsim::engine::stub_net::StubNet;
use skewsim::engine::{run as run_graph, GraphBuilder, OpClass, OpKind, OpLabel, StreamKind};
use skewsim::report::step::step_report;
use skewsim::schedule::train::lognormal_sequences;
use skewsim::schedule::ulysses::build_step;
use skewsim::schedule::{NoVariance, Parallelism, PipelineKind, Placement, RankMap};
use skewsim::workload::PackedSeq;

use super::Output;

/// One measured figure.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    /// What was measured.
    pub name: String,
    /// The figure.
    pub value: f64,
    /// Its unit.
    pub unit: String,
    /// Parameters.
    pub note: String,
}

fn row(name: &str, value: f64, unit: &str, note: impl Into<String>) -> BenchRow {
    BenchRow {
        name: name.into(),
        value,
        unit: unit.into(),
        note: note.into(),
    }
}

/// Peak resident memory of this process so far (Linux), in GiB.
fn peak_rss_gib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|k| k.parse::<f64>().ok())
            })
        })
        .map(|kib| kib / (1024.0 * 1024.0))
        .unwrap_or(f64::NAN)
}

/// CPU time this thread has run, in seconds (Linux schedstat), to separate the
/// simulator's own cost from waiting for a core on a shared machine.
fn thread_cpu_s() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map(|ns| ns * 1e-9)
        .unwrap_or(f64::NAN)
}

/// Raw engine throughput on one core: `gpus` compute streams, each a chain of `ops`
/// kernels, every kernel also waiting for the previous kernel of the neighbouring GPU.
pub fn engine_throughput(gpus: u32, ops: u32) -> Result<Vec<BenchRow>> {
    let mut b = GraphBuilder::with_capacity((gpus * ops) as usize);
    for g in 0..gpus {
        b.add_stream(g, StreamKind::Compute);
    }
    let mut prev: Vec<u32> = vec![u32::MAX; gpus as usize];
    let lab = OpLabel {
        class: OpClass::LinearFwd,
        mb: 0,
        layer: 0,
    };
    for k in 0..ops {
        let mut cur = vec![0u32; gpus as usize];
        for g in 0..gpus {
            let dur = 1_000 + u64::from((g * 7919 + k * 104_729) % 1_000);
            let nb = prev[((g + 1) % gpus) as usize];
            let deps: &[u32] = if nb == u32::MAX {
                &[]
            } else {
                std::slice::from_ref(&nb)
            };
            cur[g as usize] = b.add_op(g, OpKind::Compute(dur), lab, deps);
        }
        prev = cur;
    }
    let graph = b.build()?;
    let mut net = StubNet::dgx_h200();
    let (t0, c0) = (Instant::now(), thread_cpu_s());
    let tl = run_graph(&graph, &mut net)?;
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), thread_cpu_s() - c0);
    let note = format!("{gpus} streams x {ops} kernels, neighbour deps, one thread");
    Ok(vec![
        row("engine events", tl.events as f64, "events", note.clone()),
        row("engine run wall", secs, "s", note.clone()),
        row("engine run cpu", cpu, "s", note.clone()),
        row(
            "engine throughput",
            tl.events as f64 / secs / 1e6,
            "M events/s",
            "per wall second",
        ),
        row(
            "engine throughput cpu",
            tl.events as f64 / cpu / 1e6,
            "M events/s",
            "per CPU second",
        ),
    ])
}

/// One full training step of qwen3-30b-a3b with Ulysses, CP = `cp`, DP = `dp`, GA = `ga`,
/// every rank simulated; `seq_len` tokens per packed sequence.
pub fn full_step(dp: u32, cp: u32, ga: u32, seq_len: u32) -> Result<Vec<BenchRow>> {
    let cost = CostModel::h200(ModelConfig::builtin("qwen3-30b-a3b")?)?;
    let par = Parallelism {
        dp,
        pp: 1,
        cp,
        ga,
        pipeline: PipelineKind::OneFOneB,
        recompute: false,
        zero_stage: 3,
        dp_buckets: 8,
    };
    let gpus = par.gpus() as u32;
    let map = RankMap::new(
        par,
        Placement {
            gpus_per_node: 8,
            nodes: gpus.div_ceil(8),
        },
        "bench",
    )?;
    let seqs = lognormal_sequences(1024.0, 1.6, seq_len, (dp * ga) as usize, 1);
    let batch: Vec<Vec<PackedSeq>> = seqs
        .chunks(ga as usize)
        .map(<[PackedSeq]>::to_vec)
        .collect();
    let (t0, c0) = (Instant::now(), thread_cpu_s());
    let sg = build_step(&cost, map, &batch, 0, &NoVariance)?;
    let t_build = t0.elapsed().as_secs_f64();
    let graph_gib = sg.graph.heap_bytes() as f64 / (1u64 << 30) as f64;
    let (t1, c1) = (Instant::now(), thread_cpu_s());
    let tl = run_graph(&sg.graph, &mut StubNet::dgx_h200())?;
    let (t_run, cpu_run) = (t1.elapsed().as_secs_f64(), thread_cpu_s() - c1);
    let t2 = Instant::now();
    let rep = step_report(&sg, &tl, &cost, 0);
    let t_rep = t2.elapsed().as_secs_f64();
    let cpu = thread_cpu_s() - c0;
    let note = format!("{gpus} GPUs: qwen3-30b-a3b CP={cp} DP={dp} GA={ga} L={seq_len}");
    Ok(vec![
        row("step ops", sg.graph.ops.len() as f64, "ops", note.clone()),
        row("step events", tl.events as f64, "events", note.clone()),
        row("step build", t_build, "s", note.clone()),
        row("step simulate", t_run, "s", note.clone()),
        row("step report", t_rep, "s", note.clone()),
        row("step total", t_build + t_run + t_rep, "s", note.clone()),
        row("step total cpu", cpu, "s", note.clone()),
        row("step simulate cpu", cpu_run, "s", note.clone()),
        row(
            "step throughput",
            tl.events as f64 / t_run / 1e6,
            "M events/s",
            note.clone(),
        ),
        row(
            "step throughput cpu",
            tl.events as f64 / cpu_run / 1e6,
            "M events/s",
            note.clone(),
        ),
        row("step graph memory", graph_gib, "GiB", note.clone()),
        row("peak RSS so far", peak_rss_gib(), "GiB", note.clone()),
        row(
            "simulated iteration",
            rep.iteration as f64 * 1e-12,
            "s",
            note,
        ),
    ])
}

/// Wall time of one full step against GPU count (CP = 16, DP = GPUs/16, GA = 8), with the
/// least-squares exponent of time ∝ GPUs^k.
pub fn scaling(gpu_counts: &[u32], seq_len: u32) -> Result<Vec<BenchRow>> {
    let mut rows = Vec::new();
    let mut pts = Vec::new();
    for &n in gpu_counts {
        let r = full_step(n / 16, 16, 8, seq_len)?;
        let total = r
            .iter()
            .find(|x| x.name == "step total")
            .map(|x| x.value)
            .unwrap_or(f64::NAN);
        pts.push(((f64::from(n)).ln(), total.ln()));
        rows.push(row(
            "scaling wall time",
            total,
            "s",
            format!("{n} GPUs (build + simulate + report)"),
        ));
    }
    let k = pts.len() as f64;
    let (sx, sy) = pts.iter().fold((0.0, 0.0), |a, p| (a.0 + p.0, a.1 + p.1));
    let (mx, my) = (sx / k, sy / k);
    let (num, den) = pts.iter().fold((0.0, 0.0), |a, p| {
        (a.0 + (p.0 - mx) * (p.1 - my), a.1 + (p.0 - mx) * (p.0 - mx))
    });
    rows.push(row(
        "scaling exponent",
        num / den,
        "",
        "fitted k in wall time ∝ GPUs^k",
    ));
    Ok(rows)
}

#[derive(clap::Args)]
pub struct Args {
    /// Which: throughput, step, scaling or all.
    #[arg(default_value = "all")]
    pub which: String,
    /// GPUs for `step` (CP = 16, DP = GPUs / 16, GA = 8).
    #[arg(long, default_value_t = 4096)]
    pub gpus: u32,
    /// Packed sequence length for `step` and `scaling`.
    #[arg(long, default_value_t = 262_144)]
    pub seq_len: u32,
}

pub fn run(args: Args, out: Output) -> Result<()> {
    let mut rows = Vec::new();
    let all = args.which == "all";
    if all || args.which == "throughput" {
        rows.extend(engine_throughput(4096, 2048)?);
    }
    if all || args.which == "step" {
        rows.extend(full_step(args.gpus / 16, 16, 8, args.seq_len)?);
    }
    if all || args.which == "scaling" {
        rows.extend(scaling(&[256, 1024, 4096, 16384], args.seq_len)?);
    }
    if rows.is_empty() {
        anyhow::bail!(
            "unknown benchmark {:?} (one of: throughput, step, scaling, all)",
            args.which
        );
    }
    out.emit(&rows, || {
        let mut s = format!(
            "{:<22} {:>14} {:<11} {}\n",
            "benchmark", "value", "unit", "parameters"
        );
        for r in &rows {
            s += &format!(
                "{:<22} {:>14.3} {:<11} {}\n",
                r.name, r.value, r.unit, r.note
            );
        }
        s
    })
}
