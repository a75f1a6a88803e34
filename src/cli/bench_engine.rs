//! Engine benchmarks: raw event throughput, one full training step of thousands of GPUs,
//! and wall time against GPU count. The `arm_*` functions are `skewsim bench` arms
//! (registered in `bench.rs`); the row functions give the figures with CPU time beside
//! wall time.
//!
//! Full steps run on the cluster's network models over `topologies/dgx-h200-roce.toml`
//! (analytical, or flow for the `-flow` arm); the engine-only arm needs no network.

use anyhow::Result;
use serde::Serialize;
use std::time::Instant;

use skewsim::cluster::{Topology, TopologySpec};
use skewsim::cost::{CostModel, ModelConfig};
use skewsim::engine::dag::run_dag;
use skewsim::engine::stub_net::StubNet;
use skewsim::engine::{
    run as run_graph, run_events, GraphBuilder, OpClass, OpKind, OpLabel, StreamKind,
};
use skewsim::net::{AnalyticalModel, FlowModel};
use skewsim::report::step::step_report;
use skewsim::schedule::step::{build_step, run_step, StepRun};
use skewsim::schedule::train::split_replicas;
use skewsim::schedule::{NoVariance, Parallelism, PipelineKind, Placement, RankMap};
use skewsim::workload::corpus::Corpus;
use skewsim::workload::pack::{global_batch, Packing};
use skewsim::workload::PackedSeq;
use std::sync::Arc;

use super::bench::Timed;

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

/// The DGX H200 RoCE topology with `nodes` nodes.
fn dgx(nodes: u32) -> Result<Arc<Topology>> {
    let spec = TopologySpec::parse(
        include_str!("../../topologies/dgx-h200-roce.toml"),
        "topologies/dgx-h200-roce.toml",
    )?;
    Ok(Arc::new(spec.build(Some(nodes))?))
}

/// qwen3-30b-a3b with Ulysses (PP 1, 1F1B, ZeRO-3, 8 gradient buckets) on nodes of 8
/// GPUs: the cost model, the rank map and one global batch of `corpus` packed to `seq_len`,
/// split into DP replicas of GA micro-batches.
#[allow(clippy::too_many_arguments)]
fn qwen_step_input(
    dp: u32,
    cp: u32,
    tp: u32,
    ga: u32,
    seq_len: u32,
    recompute: bool,
    corpus: &str,
    seed: u64,
) -> Result<(CostModel, RankMap, Vec<Vec<PackedSeq>>)> {
    let cost = CostModel::h200(ModelConfig::builtin("qwen3-30b-a3b")?)?;
    let par = Parallelism {
        dp,
        pp: 1,
        cp,
        ga,
        pipeline: PipelineKind::OneFOneB,
        recompute: recompute.into(),
        zero_stage: 3,
        dp_buckets: 8,
        tp,
        sp: true,
        tp_overlap: false,
        ep: 1,
        moe_hot_share: 0.0,
        ..Parallelism::default()
    };
    let nodes = (par.gpus() as u32).div_ceil(8);
    let map = RankMap::new(par, Placement::new(8, nodes), "bench")?;
    let corpus = Corpus::from_spec(corpus)?;
    let seqs = global_batch(
        &corpus,
        seq_len,
        (dp * ga) as usize,
        Packing::Sequential,
        seed,
        0,
    )?;
    Ok((cost, map, split_replicas(seqs, dp, ga)))
}

/// One full training step of qwen3-30b-a3b with Ulysses, CP = `cp`, DP = `dp`, GA = `ga`,
/// every rank simulated; `seq_len` tokens per packed sequence.
pub fn full_step(dp: u32, cp: u32, ga: u32, seq_len: u32) -> Result<Vec<BenchRow>> {
    // Documents: lognormal, median 1,024 tokens, σ 1.6 (ln 1024 = 6.9315).
    let corpus = "lognormal:mu=6.9315,sigma=1.6";
    let (cost, map, batch) = qwen_step_input(dp, cp, 1, ga, seq_len, false, corpus, 1)?;
    let gpus = map.gpus();
    let topo = dgx(gpus.div_ceil(8))?;
    let (run, wall, cpu) = timed(|| analytical_step(&cost, map, &batch, &topo))?;
    let rep = run.report;
    let note = format!("{gpus} GPUs: qwen3-30b-a3b CP={cp} DP={dp} GA={ga} L={seq_len}");
    Ok(vec![
        row("step events", rep.events as f64, "events", note.clone()),
        row("step total", wall, "s", note.clone()),
        row("step total cpu", cpu, "s", note.clone()),
        row(
            "step throughput",
            rep.events as f64 / wall / 1e6,
            "M events/s",
            note.clone(),
        ),
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
    let (mut wall_pts, mut cpu_pts) = (Vec::new(), Vec::new());
    for &n in gpu_counts {
        let r = full_step(n / 16, 16, 8, seq_len)?;
        let get = |name: &str| {
            r.iter()
                .find(|x| x.name == name)
                .map(|x| x.value)
                .unwrap_or(f64::NAN)
        };
        let (wall, cpu, events) = (get("step total"), get("step total cpu"), get("step events"));
        wall_pts.push((f64::from(n).ln(), wall.ln()));
        cpu_pts.push((f64::from(n).ln(), cpu.ln()));
        let note = format!("{n} GPUs, {events:.0} events (build + simulate + report)");
        rows.push(row("scaling wall time", wall, "s", note.clone()));
        rows.push(row("scaling cpu time", cpu, "s", note));
    }
    rows.push(row(
        "scaling exponent wall",
        fit_exponent(&wall_pts),
        "",
        "fitted k in wall time ∝ GPUs^k",
    ));
    rows.push(row(
        "scaling exponent cpu",
        fit_exponent(&cpu_pts),
        "",
        "fitted k in CPU time ∝ GPUs^k",
    ));
    Ok(rows)
}

/// Least-squares slope of ln y against ln x.
fn fit_exponent(pts: &[(f64, f64)]) -> f64 {
    let k = pts.len() as f64;
    let (sx, sy) = pts.iter().fold((0.0, 0.0), |a, p| (a.0 + p.0, a.1 + p.1));
    let (mx, my) = (sx / k, sy / k);
    let (num, den) = pts.iter().fold((0.0, 0.0), |a, p| {
        (a.0 + (p.0 - mx) * (p.1 - my), a.1 + (p.0 - mx) * (p.0 - mx))
    });
    num / den
}

// ---- arms for `skewsim bench` (registered in src/cli/bench.rs) ----

fn synthetic_graph(gpus: u32, ops: u32) -> Result<skewsim::engine::Graph> {
    let mut b = GraphBuilder::with_capacity((gpus * ops) as usize);
    for g in 0..gpus {
        b.add_stream(g, StreamKind::Compute);
    }
    let mut prev: Vec<u32> = vec![u32::MAX; gpus as usize];
    let mut cur: Vec<u32> = vec![0; gpus as usize];
    let lab = OpLabel {
        class: OpClass::LinearFwd,
        mb: 0,
        layer: 0,
    };
    for k in 0..ops {
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
        std::mem::swap(&mut prev, &mut cur);
    }
    Ok(b.build()?)
}

/// Arm `engine-throughput`: the engine alone on 4,096 streams × 2,048 kernels with
/// neighbour dependencies (8.4M events); the detail line gives events per second.
pub fn arm_engine_throughput() -> Result<Timed> {
    let graph = synthetic_graph(4096, 2048)?;
    Ok(Box::new(move || {
        let t0 = Instant::now();
        let tl = run_graph(&graph, &mut StubNet::dgx_h200())?;
        let s = t0.elapsed().as_secs_f64();
        Ok(format!(
            "{} events, {:.1} M events/s (target >= 5)",
            tl.events,
            tl.events as f64 / s / 1e6
        ))
    }))
}

/// CPU time of this whole process (all threads) so far, in seconds (Linux `/proc/self/stat`,
/// clock ticks of 10 ms).
fn process_cpu_s() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may hold spaces): utime and stime are
            // the 12th and 13th.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        })
        .unwrap_or(f64::NAN)
}

/// Wall and process CPU seconds of `f`.
/// Step 0 of `batch` on `topo` under the analytical network, timed part by part, with no
/// runtime variance and no trace.
fn analytical_step(
    cost: &CostModel,
    map: RankMap,
    batch: &[Vec<PackedSeq>],
    topo: &Arc<Topology>,
) -> Result<StepRun> {
    let mut net = AnalyticalModel::new(topo.clone());
    Ok(run_step(cost, map, batch, 0, &NoVariance, &mut net, None)?)
}

fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, f64, f64)> {
    let (t0, c0) = (Instant::now(), process_cpu_s());
    let v = f()?;
    Ok((v, t0.elapsed().as_secs_f64(), process_cpu_s() - c0))
}

fn arm_step(gpus: u32, flow: bool, tp: u32) -> Result<Timed> {
    // TP 8 leaves 4 query heads per rank: Ulysses' CP 4.
    let (cp, ga, seq_len) = (16 / tp.min(4), 8, 262_144);
    let dp = gpus / (cp * tp);
    let (cost, map, batch) = qwen_step_input(dp, cp, tp, ga, seq_len, true, "libra-256k", 0)?;
    let topo = dgx(gpus.div_ceil(8))?;
    let what = format!("{gpus} GPUs (TP {tp}, CP {cp}, DP {dp}, GA {ga}, libra-256k");
    if !flow {
        // Analytical: timed part by part.
        return Ok(Box::new(move || {
            let (run, t, c) = timed(|| analytical_step(&cost, map, &batch, &topo))?;
            Ok(format!(
                "{what}, analytical network, timed in parts): {} events; build + simulate + report {t:.2} s ({c:.2} cpu); simulated iteration {:.1} s, peak RSS {:.2} GiB",
                run.report.events,
                run.report.iteration as f64 * 1e-12,
                peak_rss_gib()
            ))
        }));
    }
    Ok(Box::new(move || {
        let (sg, t_build, c_build) = timed(|| Ok(build_step(&cost, map, &batch, 0, &NoVariance)?))?;
        let m_build = peak_rss_gib();
        let mut net = FlowModel::new(topo.clone());
        let (tl, t_run, c_run) = timed(|| Ok(run_graph(&sg.graph, &mut net)?))?;
        let m_run = peak_rss_gib();
        let (rep, t_rep, c_rep) = timed(|| Ok(step_report(&sg, &tl, &cost, 0)))?;
        let ops = sg.graph.ops.len();
        Ok(format!(
            "{what}, flow network, event engine): {ops} ops ({:.1} graph bytes/op), {} events; build {t_build:.2} s ({c_build:.2} cpu), simulate {t_run:.2} s ({c_run:.2} cpu), report {t_rep:.2} s ({c_rep:.2} cpu); simulated iteration {:.1} s, peak RSS {:.2} GiB (after build {m_build:.2}, after simulate {m_run:.2})",
            sg.graph.heap_bytes() as f64 / ops.max(1) as f64,
            tl.events,
            rep.iteration as f64 * 1e-12,
            peak_rss_gib()
        ))
    }))
}

/// Arm `engine-fast-path`: the step-4096 graph timed by the event engine and by the DAG
/// sweep (built untimed); the timed run is both; errors unless the timelines are equal.
pub fn arm_engine_fast_path() -> Result<Timed> {
    let (dp, cp, ga, seq_len) = (256, 16, 8, 262_144);
    let (cost, map, batch) = qwen_step_input(dp, cp, 1, ga, seq_len, true, "libra-256k", 0)?;
    let topo = dgx(512)?;
    let sg = build_step(&cost, map, &batch, 0, &NoVariance)?;
    Ok(Box::new(move || {
        let net = AnalyticalModel::new(topo.clone());
        let (ev, t_ev, c_ev) = timed(|| Ok(run_events(&sg.graph, &mut net.clone())?))?;
        let (dag, t_dag, c_dag) = timed(|| Ok(run_dag(&sg.graph, &net)?))?;
        anyhow::ensure!(
            ev == dag,
            "the DAG sweep's timeline differs from the event engine's"
        );
        Ok(format!(
            "4096 GPUs, {} ops, {} events: event engine {t_ev:.2} s ({c_ev:.2} cpu), DAG sweep {t_dag:.2} s ({c_dag:.2} cpu), {:.1}x; timelines equal",
            sg.graph.ops.len(),
            ev.events,
            t_ev / t_dag
        ))
    }))
}

/// Arm `step-4096`: one full training step of qwen3-30b-a3b on 4,096 GPUs (CP 16, DP 256,
/// GA 8, libra-256k at L = 256K, all layers fwd + bwd, every rank): build + simulate +
/// report.
pub fn arm_step_4096() -> Result<Timed> {
    arm_step(4096, false, 1)
}

/// Arm `step-4096-tp8`: the step-4096 step under tensor parallelism: TP 8 inside each node
/// (sequence parallel: every layer's TP all-gathers and reduce-scatters), CP 4, DP 128.
pub fn arm_step_4096_tp8() -> Result<Timed> {
    arm_step(4096, false, 8)
}

/// Arm `step-4096-flow`: the same step on the flow-level network model.
pub fn arm_step_4096_flow() -> Result<Timed> {
    arm_step(4096, true, 1)
}

/// Arm `step-16384`: the same on 16,384 GPUs (DP 1,024).
pub fn arm_step_16384() -> Result<Timed> {
    arm_step(16384, false, 1)
}

/// Arm `engine-scaling`: wall time of one full step against GPU count (256 … 65,536) and
/// the fitted exponent.
pub fn arm_engine_scaling() -> Result<Timed> {
    Ok(Box::new(|| {
        let rows = scaling(
            &[256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536],
            262_144,
        )?;
        let mut d = String::new();
        for r in &rows {
            let n = r.note.split_whitespace().next().unwrap_or("?");
            match r.name.as_str() {
                "scaling wall time" => d += &format!("{n}: {:.2} s", r.value),
                "scaling cpu time" => d += &format!(" ({:.2} cpu), ", r.value),
                "scaling exponent wall" => d += &format!("k = {:.2} wall", r.value),
                "scaling exponent cpu" => d += &format!(", {:.2} cpu", r.value),
                _ => {}
            }
        }
        Ok(d)
    }))
}

/// Arm `step-65536`: the step-4096 step on 65,536 GPUs (DP 4,096).
pub fn arm_step_65536() -> Result<Timed> {
    arm_step(65536, false, 1)
}

/// Arm `step-405b-16384-vp`: Llama 3.1 405B on 16,384 GPUs of DGX H100 nodes (TP 8 in a
/// node, PP 16, DP 128, GA 16 micro-batches of one 8,192-token sequence: 16M tokens),
/// interleaved with vp 2, the embedding and the loss counted as layers (126 + 2 = 128
/// slots, 4 a chunk), the distributed optimizer over BF16 gradients, one bucket a layer;
/// built, simulated in parts and reported.
pub fn arm_step_405b_16384_vp() -> Result<Timed> {
    let model = ModelConfig::from_toml_str(
        include_str!("../../models/llama3.1-405b.toml"),
        "models/llama3.1-405b.toml",
    )?;
    let h100 = skewsim::cost::gpu::Gpu::builtin("gpu", "h100")?;
    let cost = skewsim::experiment::calfile::cost_model_on(
        model,
        None,
        skewsim::cost::profile::Kernel::DEFAULT,
        &h100,
        skewsim::cost::gpu::Precision::Bf16,
    )?;
    let (tp, pp, dp, ga, seq_len) = (8, 16, 128, 16, 8192);
    let par = Parallelism {
        tp,
        vp: 2,
        account_for_embedding: true,
        account_for_loss: true,
        distributed_optimizer: true,
        grad_reduce_in_fp32: false,
        dp_buckets: skewsim::schedule::MAX_DP_BUCKETS,
        ..Parallelism::plain(dp, pp, 1, ga)
    };
    let spec = TopologySpec::parse(
        include_str!("../../topologies/dgx-h100-ib.toml"),
        "topologies/dgx-h100-ib.toml",
    )?;
    let topo = Arc::new(spec.build(Some(2048))?);
    let place = Placement::new(8, 2048)
        .with_collectives(skewsim::net::collective::CollectiveModel::of(&topo, true));
    let map = RankMap::new(par, place, "bench")?;
    let seq = PackedSeq::from_lengths(&[seq_len], seq_len, 0);
    let batch = vec![vec![seq; ga as usize]; dp as usize];
    Ok(Box::new(move || {
        let (r, wall, _) = timed(|| analytical_step(&cost, map, &batch, &topo))?;
        let rep = r.report;
        Ok(format!(
            "16384 GPUs, {} events in {wall:.2} s: iteration {:.3} s, {:.0} tokens/s per GPU, MFU {:.3}, bubble {:.3}, peak RSS {:.2} GiB",
            rep.events,
            rep.iteration as f64 * 1e-12,
            rep.tokens_per_s / 16384.0,
            rep.mfu,
            rep.bubble_fraction,
            peak_rss_gib()
        ))
    }))
}

/// Arm `step-262144`: the step-16384 step on 262,144 GPUs (DP 16,384; 32,768 nodes).
pub fn arm_step_262144() -> Result<Timed> {
    arm_step(262_144, false, 1)
}

/// Arm `step-16384-speedup`: the step-16384 step built, simulated and reported in a pool
/// of one thread and in the default pool (every core, or `RAYON_NUM_THREADS`); the timed
/// run is both; errors unless the graphs and the reports are equal.
pub fn arm_step_16384_speedup() -> Result<Timed> {
    let (dp, cp, ga, seq_len) = (1024, 16, 8, 262_144);
    let (cost, map, batch) = qwen_step_input(dp, cp, 1, ga, seq_len, true, "libra-256k", 0)?;
    let topo = dgx(2048)?;
    Ok(Box::new(move || {
        let step = || analytical_step(&cost, map, &batch, &topo);
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
        let (r1, t1, _) = timed(|| one.install(step))?;
        let (rn, tn, _) = timed(step)?;
        anyhow::ensure!(r1 == rn, "the step's report depends on the thread count");
        Ok(format!(
            "16384 GPUs, {} events: build + simulate + report in parts {t1:.2} s on 1 thread, {tn:.2} s on {} threads: {:.1}x (target >= 6x on 16 cores)",
            r1.report.events,
            rayon::current_num_threads(),
            t1 / tn
        ))
    }))
}

/// One step of each scheme (Ulysses, WLB-LLM, DistCA, Libra and Megatron DCP) on `gpus` GPUs
/// of DGX H200 + RoCE, analytical network: llama3-8b, CP 8, GA 8, full recomputation,
/// ZeRO-3, wlbllm corpus at L = 128K (the four-way experiment's settings), planning and
/// simulation timed, the global batch drawn untimed.
fn schemes(gpus: u32) -> Result<Timed> {
    use skewsim::balance::libra::LibraParams;
    use skewsim::balance::schemes::{Scheme, SchemePlanner, SchemeSettings};
    use skewsim::schedule::compare::{build_scheme_step, measure_scheme_step, plan_scheme_step};
    let (cp, ga, seq_len) = (8, 8, 131_072);
    let dp = gpus / cp;
    let cost = CostModel::h200(ModelConfig::builtin("llama3-8b")?)?;
    let base = Parallelism {
        recompute: true.into(),
        zero_stage: 3,
        dp_buckets: 4,
        ..Parallelism::plain(dp, 1, cp, ga)
    };
    let place = Placement::new(8, gpus / 8);
    let mut set = SchemeSettings {
        cp,
        libra: LibraParams {
            pool_size: 4,
            head_shards: 4,
            tile_tokens: 4096,
            chunks: 2,
            ..LibraParams::default()
        },
        seed: 1,
        ..SchemeSettings::default()
    };
    set.libra.cp = cp;
    let gbs = (dp * ga) as usize;
    let global = global_batch(
        &Corpus::from_spec("wlbllm")?,
        seq_len,
        gbs,
        Packing::Sequential,
        1,
        0,
    )?;
    let topo = dgx(gpus / 8)?;
    Ok(Box::new(move || {
        let mut d = Vec::new();
        for sc in Scheme::ALL {
            // Phase by phase, wall (and process CPU) seconds: plan, build, simulate, report.
            let mut ph = [(0.0, 0.0); 4];
            let (r, t, c) = timed(|| {
                let mut planner = SchemePlanner::new(sc, set.clone(), &cost, dp, gbs, seq_len)?;
                let (sp, t0, c0) =
                    timed(|| Ok(plan_scheme_step(&cost, &mut planner, base, 0, &global)?))?;
                let (sg, t1, c1) = timed(|| {
                    Ok(build_scheme_step(
                        &cost,
                        sc,
                        &set,
                        base,
                        place,
                        0,
                        &global,
                        sp,
                        &NoVariance,
                        false,
                    )?)
                })?;
                let mut net = AnalyticalModel::new(topo.clone());
                let (tl, t2, c2) = timed(|| Ok(run_graph(&sg.step.graph, &mut net)?))?;
                let (r, t3, c3) = timed(|| Ok(measure_scheme_step(&sg, &tl, &cost, 0)))?;
                ph = [(t0, c0), (t1, c1), (t2, c2), (t3, c3)];
                Ok(r)
            })?;
            let p = ph.map(|(w, _)| format!("{w:.1}")).join("/");
            let pc = ph.map(|(_, c)| format!("{c:.1}")).join("/");
            d.push(format!(
                "{} {t:.1} s ({p}; cpu {c:.1} s: {pc}; iteration {:.2} s)",
                sc.name(),
                r.report.iteration as f64 * 1e-12
            ));
        }
        Ok(format!(
            "{gpus} GPUs (CP {cp}, DP {dp}, GA {ga}, llama3-8b, wlbllm 128K), wall (and process CPU) s as plan/build/simulate/report: {}; peak RSS {:.2} GiB",
            d.join(", "),
            peak_rss_gib()
        ))
    }))
}

/// Arm `schemes-4096`: [`schemes`] on 4,096 GPUs (DP 512).
pub fn arm_schemes_4096() -> Result<Timed> {
    schemes(4096)
}

/// Arm `schemes-16384`: [`schemes`] on 16,384 GPUs (DP 2,048).
pub fn arm_schemes_16384() -> Result<Timed> {
    schemes(16384)
}
