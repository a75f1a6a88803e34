//! One training step of any scheme on one cluster, simulated the same way:
//! the scheme's planner (`balance::schemes`) makes the step's Plan, the generic Plan
//! lowering (`plan_step::build_plan_step`, `plan_attn`) or Ulysses' attention stage
//! (`step::build_step`) turns it into ops, the engine times them, `report::step` measures
//! them.
//!
//! Owns the per-scheme layout on the cluster (all four: the base DP × PP × CP and GA;
//! DistCA's attention pool spans every DP·CP GPU of a stage), the overlap each scheme gets
//! ([`scheme_overlap`]) and the core-attention-layer measure [`attention_span`]. It may
//! not plan, price or time anything itself.
//!
//! # Overlap, as simulated
//! Libra's pipeliner cuts each worker's attention into M head chunks whose transfers
//! overlap the other chunks' kernels. DistCA's ping-pong cuts each micro-batch into two
//! nano-batches (its planner's [`crate::balance::distca::pingpong::NanoTable`]): every
//! linear block becomes one op per nano-batch, so nano-batch 0's attention dispatch runs
//! under nano-batch 1's linear block, each kernel under the other nano-batch's transfers,
//! and nano-batch 1's return under nano-batch 0's next linear block
//! (`plan_attn::Overlap::NanoBatches`). What actually hides is the engine's measurement.

use super::plan_attn::{Overlap, PlanAttention};
use super::plan_step::build_plan_step;
use super::step::{build_step, build_step_with, StepGraph};
use super::train::split_replicas;
use super::{Parallelism, PipelineKind, Placement, RankMap, RuntimeVariance};
use crate::balance::distca::pingpong::NanoTable;
use crate::balance::distca::pingpong::{pp_ticks, Phase};
use crate::balance::distca::ticks::replica_batches;
use crate::balance::megatron_dcp::rank_batches;
use crate::balance::schemes::{Scheme, SchemePlan, SchemePlanner, SchemeSettings};
use crate::cost::CostModel;
use crate::engine::{run, OpClass, Timeline};
use crate::error::{invalid, Result};
use crate::net::{NetworkModel, Ps};
use crate::plan::{Payload, Plan};
use crate::report::step::{step_report_with, StepReport};
use crate::workload::PackedSeq;

/// What one scheme's step gave.
#[derive(Clone, Debug)]
pub struct SchemeStep {
    /// The scheme.
    pub scheme: Scheme,
    /// The step's metrics.
    pub report: StepReport,
    /// [`attention_span`] of the step.
    pub attn_span: Ps,
    /// Bytes the plan moves for one attention layer's forward pass, over every TP lane (0
    /// for Ulysses, whose all-to-alls are the step builder's).
    pub plan_bytes: u64,
}

/// The parallelism `scheme` runs with when the others run `base` (DP × PP × CP, GA): the
/// same for every scheme. DistCA keeps the baseline's layout and GA for its linear layers
/// (in-place attention servers) and pools the core attention of all DP·CP GPUs in its
/// plan; so does Libra within its pools. Errors: DistCA on a layout with no GPU (DP·CP =
/// 0: no attention server).
pub fn scheme_parallelism(scheme: Scheme, base: Parallelism) -> Result<Parallelism> {
    if scheme == Scheme::MegatronDcp && base.pipeline == PipelineKind::Ticks {
        return Err(invalid(
            "pipeline for megatron-dcp",
            "ticks",
            "gpipe or 1f1b (dynamic CP runs its own micro-batch counts)",
        ));
    }
    if scheme == Scheme::DistCa && base.dp * base.cp == 0 {
        return Err(invalid(
            "DP·CP for distca",
            base.dp * base.cp,
            "at least one attention server",
        ));
    }
    if scheme == Scheme::DistCa && base.pp > 1 {
        // DistCA pipelines in ticks: all stages in one phase, attention pooled across them.
        return Ok(Parallelism {
            pipeline: PipelineKind::Ticks,
            ..base
        });
    }
    Ok(base)
}

/// The overlap the generic lowering gives `scheme`: Libra's M head chunks, DistCA's
/// ping-pong nano-batches (`nano`, its planner's table) when ping-pong is on, else none.
pub fn scheme_overlap<'a>(
    scheme: Scheme,
    set: &SchemeSettings,
    nano: Option<&'a NanoTable>,
) -> Overlap<'a> {
    match (scheme, nano) {
        (Scheme::Libra, _) => Overlap::HeadChunks(set.libra.chunks),
        (Scheme::DistCa, Some(t)) if set.ping_pong => Overlap::NanoBatches(t),
        _ => Overlap::HeadChunks(1),
    }
}

/// The step's core-attention-layer time: per micro-batch, the longest span any GPU spends
/// in layer 0's forward core attention (from the start of its first dispatch / all-to-all /
/// kernel op to the end of its last), summed over the micro-batches. A GPU that waits for
/// a slow peer's data waits inside its span, so this is the straggler's latency of one
/// attention layer for the step's global batch.
/// ([`measure_scheme_step`] takes it GPU by GPU within the report's walk.)
pub fn attention_span(sg: &StepGraph, t: &Timeline) -> Ps {
    use rayon::prelude::*;
    let per_gpu: Vec<Vec<(Ps, Ps)>> = (0..sg.map.gpus())
        .into_par_iter()
        .map(|gpu| gpu_attn_spans(sg, t, gpu, None))
        .collect();
    span_total(&per_gpu)
}

/// GPU `gpu`'s layer-0 forward core-attention span per micro-batch (first start, last
/// end; `(Ps::MAX, 0)` where it has none), in one walk over its streams' ops. In DistCA's
/// ticks (`fwd_ticks[k]`: tick k runs forward) pooled attention ops carry the tick as their
/// micro-batch and layer j of every stage as layer j, so the span per forward tick is the
/// layer-0 pooled attention of every stage's first layer at once.
fn gpu_attn_spans(
    sg: &StepGraph,
    t: &Timeline,
    gpu: u32,
    fwd_ticks: Option<&[bool]>,
) -> Vec<(Ps, Ps)> {
    let g = &sg.graph;
    let s0 = sg.streams_per_gpu * gpu;
    // Backward reuses the classes (dO in, dQ/dK/dV out): forward ops of a micro-batch are
    // those that start before the GPU's first backward linear op of that micro-batch.
    let mut bwd_start: Vec<Ps> = Vec::new();
    // Layer-0 attention ops of a forward tick (any micro-batch without ticks): (mb, start,
    // end), kept until the backward starts are known.
    let mut cand: Vec<(usize, Ps, Ps)> = Vec::new();
    for i in (s0..s0 + sg.streams_per_gpu).flat_map(|s| g.stream_ops(s)) {
        let i = *i as usize;
        let l = g.ops[i].label();
        let mb = usize::from(l.mb);
        match l.class {
            OpClass::LinearBwd | OpClass::HeadBwd if fwd_ticks.is_none() => {
                if bwd_start.len() <= mb {
                    bwd_start.resize(mb + 1, Ps::MAX);
                }
                bwd_start[mb] = bwd_start[mb].min(t.start[i]);
            }
            OpClass::AttnFwd | OpClass::A2aIn | OpClass::A2aOut
                if l.layer == 0
                    && fwd_ticks.is_none_or(|f| f.get(mb).copied().unwrap_or(false)) =>
            {
                cand.push((mb, t.start[i], t.end[i]));
            }
            _ => {}
        }
    }
    let mut spans: Vec<(Ps, Ps)> = Vec::new();
    for (mb, s, e) in cand {
        if s >= bwd_start.get(mb).copied().unwrap_or(Ps::MAX) {
            continue;
        }
        if spans.len() <= mb {
            spans.resize(mb + 1, (Ps::MAX, 0));
        }
        spans[mb] = (spans[mb].0.min(s), spans[mb].1.max(e));
    }
    spans
}

/// Σ over micro-batches of the longest span any GPU spends ([`gpu_attn_spans`] per GPU).
fn span_total(per_gpu: &[Vec<(Ps, Ps)>]) -> Ps {
    let mut per_mb: Vec<Ps> = Vec::new();
    for spans in per_gpu {
        if per_mb.len() < spans.len() {
            per_mb.resize(spans.len(), 0);
        }
        for (m, &(s, e)) in per_mb.iter_mut().zip(spans) {
            if s <= e {
                *m = (*m).max(e - s);
            }
        }
    }
    per_mb.iter().sum()
}

/// Megatron dynamic CP's step on `base`'s DP × CP ranks: each rank is a replica of one
/// (`megatron_dcp::rank_batches`: its shares of its CP groups' micro-batches, an empty
/// micro-batch where it runs none, memory at `max_seqlen` tokens), GA = the plan's GA
/// indices, the plan's attention through `plan_attn`; the DP gradient all-reduce over all
/// of them waits for the rank with the most work.
pub fn dcp_step(
    cost: &CostModel,
    base: Parallelism,
    place: Placement,
    plan: &Plan,
    max_seqlen: u32,
    var: &dyn RuntimeVariance,
) -> Result<StepGraph> {
    let ranks = base.dp * base.cp;
    let (batch, ga) = rank_batches(plan, ranks, max_seqlen)?;
    let par = Parallelism {
        dp: ranks,
        cp: 1,
        ga,
        ..base
    };
    let map = RankMap::new(par, place, "megatron-dcp")?;
    let mut attn = PlanAttention::new(cost, plan, map, Overlap::HeadChunks(1))?;
    let mut sg = build_step_with(cost, map, &batch, plan.step, var, &mut attn)?;
    // A rank's micro-batch holds pieces of samples: the step's exact pairs are the plan's.
    let lens: Vec<u32> = plan
        .groups
        .iter()
        .flat_map(|g| &g.sequences)
        .flat_map(|s| s.samples.iter().copied())
        .collect();
    sg.class_pairs = cost.class_pairs(&lens);
    Ok(sg)
}

/// Plan and simulate step `step` of `planner`'s scheme for its global batch on `net`.
/// `base` is the DP × CP layout of the other schemes; `place` the cluster.
#[allow(clippy::too_many_arguments)]
pub fn simulate_scheme_step(
    cost: &CostModel,
    planner: &mut SchemePlanner<'_>,
    set: &SchemeSettings,
    base: Parallelism,
    place: Placement,
    step: u64,
    global: &[PackedSeq],
    net: &mut dyn NetworkModel,
    var: &dyn RuntimeVariance,
) -> Result<SchemeStep> {
    simulate_scheme_step_with(
        cost, planner, set, base, place, step, global, net, var, false,
    )
}

/// [`simulate_scheme_step`], with `signal` replacing every plan transfer by a one-token
/// signal (DistCA's "signal" ablation: the same dependencies, no data, so the difference
/// to the real step is the communication the step could not hide). `plan_bytes` stays the
/// real plan's. The phases are [`plan_scheme_step`], [`build_scheme_step`], the engine's
/// `run` and [`measure_scheme_step`].
#[allow(clippy::too_many_arguments)]
pub fn simulate_scheme_step_with(
    cost: &CostModel,
    planner: &mut SchemePlanner<'_>,
    set: &SchemeSettings,
    base: Parallelism,
    place: Placement,
    step: u64,
    global: &[PackedSeq],
    net: &mut dyn NetworkModel,
    var: &dyn RuntimeVariance,
    signal: bool,
) -> Result<SchemeStep> {
    let sp = plan_scheme_step(cost, planner, base, step, global)?;
    let sg = build_scheme_step(
        cost,
        planner.scheme(),
        set,
        base,
        place,
        step,
        global,
        sp,
        var,
        signal,
    )?;
    let t = run(&sg.step.graph, net)?;
    Ok(measure_scheme_step(&sg, &t, cost, step))
}

/// One scheme's step as a graph, before the engine times it.
#[derive(Debug)]
pub struct SchemeGraph {
    /// The scheme.
    pub scheme: Scheme,
    /// The step's graph.
    pub step: StepGraph,
    /// [`SchemeStep::plan_bytes`].
    pub plan_bytes: u64,
    /// Under DistCA's ticks: which ticks run forward (the attention span counts those);
    /// else empty.
    pub fwd_ticks: Vec<bool>,
}

/// The plan of step `step` of `planner`'s scheme for its global batch, on the layout the
/// scheme runs when the others run `base` ([`scheme_parallelism`]); `None` for Ulysses
/// (its attention is the step builder's own).
pub fn plan_scheme_step(
    cost: &CostModel,
    planner: &mut SchemePlanner<'_>,
    base: Parallelism,
    step: u64,
    global: &[PackedSeq],
) -> Result<Option<SchemePlan>> {
    let scheme = planner.scheme();
    if let Some(seq_len) = global.iter().map(|s| s.capacity).max() {
        cost.model.check_masks(seq_len)?;
    }
    let par = scheme_parallelism(scheme, base)?;
    Ok(match scheme {
        Scheme::Ulysses => None,
        _ if par.pipeline == PipelineKind::Ticks => Some(planner.plan_ticks(step, global, par.pp)?),
        _ => Some(planner.plan(step, global)?),
    })
}

/// The step graph of `scheme` (planned by [`plan_scheme_step`] as `sp`) for `global` on
/// `base`'s layout over `place`; `signal` as in [`simulate_scheme_step_with`].
#[allow(clippy::too_many_arguments)]
pub fn build_scheme_step(
    cost: &CostModel,
    scheme: Scheme,
    set: &SchemeSettings,
    base: Parallelism,
    place: Placement,
    step: u64,
    global: &[PackedSeq],
    sp: Option<SchemePlan>,
    var: &dyn RuntimeVariance,
    signal: bool,
) -> Result<SchemeGraph> {
    let par = scheme_parallelism(scheme, base)?;
    let map = RankMap::new(par, place, scheme.name())?;
    let ticks = par.pipeline == PipelineKind::Ticks;
    let fwd_ticks: Vec<bool> = if ticks {
        pp_ticks(par.pp, par.ga)?
            .iter()
            .map(|t| t.phase == Phase::Forward)
            .collect()
    } else {
        Vec::new()
    };
    let Some(mut sp) = sp.filter(|_| scheme != Scheme::Ulysses) else {
        let batch = split_replicas(global.to_vec(), par.dp, par.ga);
        return Ok(SchemeGraph {
            scheme,
            step: build_step(cost, map, &batch, step, var)?,
            plan_bytes: 0,
            fwd_ticks,
        });
    };
    let fwd_bytes = |g: &crate::plan::Group| -> u64 { g.transfers.iter().map(|t| t.bytes).sum() };
    let lane_bytes = if ticks {
        // Forward ticks move layer j of every stage at once: per model layer, / PP.
        sp.plan
            .groups
            .iter()
            .filter(|g| fwd_ticks.get(g.ga as usize).copied().unwrap_or(false))
            .map(fwd_bytes)
            .sum::<u64>()
            / u64::from(par.pp)
    } else {
        sp.plan.groups.iter().map(fwd_bytes).sum()
    };
    // The plan is one TP rank's: every lane of each TP group moves its bytes.
    let plan_bytes = lane_bytes * u64::from(par.tp);
    if signal {
        // The lowering prices a transfer by its payload's tokens: one token each.
        for t in sp.plan.groups.iter_mut().flat_map(|g| &mut g.transfers) {
            t.bytes = 1;
            match &mut t.carries {
                Payload::Q { start, end, .. } | Payload::Output { start, end, .. } => {
                    *end = (*start + 1).min(*end)
                }
                Payload::Kv { start, end, .. } => *end = (*start + 1).min(*end),
            }
        }
    }
    let overlap = scheme_overlap(scheme, set, sp.nano.as_ref());
    let sg = if ticks {
        let batch = replica_batches(global, par.dp)?;
        if batch[0].len() != par.ga as usize {
            return Err(invalid(
                "global batch for distca ticks",
                global.len(),
                format!("DP × GA = {} × {} sequences", par.dp, par.ga),
            ));
        }
        let mut attn = PlanAttention::pooled(cost, &sp.plan, map, overlap)?;
        build_step_with(cost, map, &batch, step, var, &mut attn)?
    } else if scheme == Scheme::MegatronDcp {
        let seq_len = global.iter().map(|s| s.capacity).max().unwrap_or(0);
        let s = set.dcp_config(base.dp, seq_len)?.max_seqlen_per_rank;
        dcp_step(cost, par, place, &sp.plan, s, var)?
    } else {
        build_plan_step(cost, map, &sp.plan, &sp.trained, overlap, var)?
    };
    Ok(SchemeGraph {
        scheme,
        step: sg,
        plan_bytes,
        fwd_ticks,
    })
}

/// What `sg`'s step, timed by the engine as `t`, gave.
pub fn measure_scheme_step(
    sg: &SchemeGraph,
    t: &Timeline,
    cost: &CostModel,
    step: u64,
) -> SchemeStep {
    let ticks = (sg.step.map.par.pipeline == PipelineKind::Ticks).then_some(&sg.fwd_ticks[..]);
    // Each GPU's attention spans are taken right after its report walk, ops still in cache.
    let (report, spans) = step_report_with(&sg.step, t, cost, step, |gpu| {
        gpu_attn_spans(&sg.step, t, gpu, ticks)
    });
    SchemeStep {
        scheme: sg.scheme,
        report,
        attn_span: span_total(&spans),
        plan_bytes: sg.plan_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::libra::LibraParams;
    use crate::cost::ModelConfig;
    use crate::engine::stub_net::StubNet;
    use crate::engine::{GraphBuilder, OpKind, OpLabel, StreamKind};
    use crate::schedule::{NoVariance, PipelineKind, Precision};
    use crate::workload::corpus::Corpus;
    use crate::workload::pack::{global_batch, Packing};

    fn par(dp: u32, cp: u32, ga: u32) -> Parallelism {
        Parallelism {
            dp,
            pp: 1,
            cp,
            ga,
            pipeline: PipelineKind::OneFOneB,
            recompute: false,
            zero_stage: 0,
            dp_buckets: 1,
            tp: 1,
            sp: true,
            tp_overlap: false,
            ep: 1,
            moe_hot_share: 0.0,
            precision: Precision::Bf16,
        }
    }

    #[test]
    fn attention_span_by_hand() {
        // GPU 0: mb 0 attention 100 ps, then its backward linear (50), then a backward dO
        // all-to-all of layer 0 (excluded: after the backward started), then mb 1 attention
        // 200 ps. GPU 1: mb 0 attention 300 ps, a layer-1 attention (excluded), its backward
        // linear. Span = max(100, 300) + 200 = 500.
        let lab = |class, mb, layer| OpLabel { class, mb, layer };
        let mut b = GraphBuilder::with_capacity(8);
        let s0 = b.add_stream(0, StreamKind::Compute);
        let s1 = b.add_stream(1, StreamKind::Compute);
        b.add_op(s0, OpKind::Compute(100), lab(OpClass::AttnFwd, 0, 0), &[]);
        b.add_op(s0, OpKind::Compute(50), lab(OpClass::LinearBwd, 0, 0), &[]);
        b.add_op(s0, OpKind::Compute(70), lab(OpClass::A2aIn, 0, 0), &[]);
        b.add_op(s0, OpKind::Compute(200), lab(OpClass::AttnFwd, 1, 0), &[]);
        b.add_op(s1, OpKind::Compute(300), lab(OpClass::AttnFwd, 0, 0), &[]);
        b.add_op(s1, OpKind::Compute(999), lab(OpClass::AttnFwd, 0, 1), &[]);
        b.add_op(s1, OpKind::Compute(10), lab(OpClass::LinearBwd, 0, 1), &[]);
        let graph = b.build().unwrap();
        let mut net = StubNet::new(8, 0, 1e12, 1e12);
        let t = run(&graph, &mut net).unwrap();
        let place = Placement::new(8, 1);
        let sg = StepGraph {
            graph,
            map: RankMap::new(par(2, 1, 1), place, "test").unwrap(),
            tokens: 0,
            class_pairs: vec![0],
            memory: Vec::new(),
            streams_per_gpu: 1,
        };
        assert_eq!(attention_span(&sg, &t), 500);
    }

    #[test]
    fn distca_layout_and_chunks() {
        // DistCA keeps the baseline's DP × PP × CP and GA (GA 4 < DP·CP = 32 is fine) and
        // pipelines in ticks.
        for sc in Scheme::ALL {
            let mut base = par(4, 8, 4);
            assert_eq!(scheme_parallelism(sc, base).unwrap(), base, "{sc:?}");
            base.pp = 4;
            let want = if sc == Scheme::DistCa {
                Parallelism {
                    pipeline: PipelineKind::Ticks,
                    ..base
                }
            } else {
                base
            };
            assert_eq!(scheme_parallelism(sc, base).unwrap(), want, "{sc:?}");
        }
        let e = scheme_parallelism(Scheme::DistCa, par(0, 8, 4)).unwrap_err();
        assert!(e.to_string().contains("attention server"), "{e}");
        let set = SchemeSettings {
            libra: LibraParams {
                chunks: 4,
                ..LibraParams::default()
            },
            ..SchemeSettings::default()
        };
        let table = NanoTable {
            units: vec![[1, 1]],
        };
        let chunks = |o: Overlap<'_>| match o {
            Overlap::HeadChunks(m) => m,
            Overlap::NanoBatches(_) => 0,
        };
        assert_eq!(chunks(scheme_overlap(Scheme::Libra, &set, None)), 4);
        assert_eq!(
            chunks(scheme_overlap(Scheme::DistCa, &set, Some(&table))),
            0
        );
        assert_eq!(
            chunks(scheme_overlap(Scheme::WlbLlm, &set, Some(&table))),
            1
        );
        let off = SchemeSettings {
            ping_pong: false,
            ..set
        };
        assert_eq!(
            chunks(scheme_overlap(Scheme::DistCa, &off, Some(&table))),
            1
        );
    }

    /// Two llama3-8b layers, 16 sequences of 16K (wlbllm corpus, seed `seed`), CP 4 and
    /// Libra on pools of 2 with 4 head shards and 2 chunks.
    fn small_step(seed: u64) -> (CostModel, Vec<PackedSeq>, SchemeSettings) {
        let mut model = ModelConfig::builtin("llama3-8b").unwrap();
        model.layers = 2;
        let cost = CostModel::h200(model).unwrap();
        let corpus = Corpus::from_spec("wlbllm").unwrap();
        let batch = global_batch(&corpus, 16_384, 16, Packing::Sequential, seed, 0).unwrap();
        let set = SchemeSettings {
            cp: 4,
            libra: LibraParams {
                pool_size: 2,
                head_shards: 4,
                chunks: 2,
                tile_tokens: 2048,
                ..LibraParams::default()
            },
            ..SchemeSettings::default()
        };
        (cost, batch, set)
    }

    /// [`small_step`]'s plan and graph of `sc` on DP 4 × CP 4, GA 4, two nodes of 8.
    fn small_graph(
        sc: Scheme,
        cost: &CostModel,
        batch: &[PackedSeq],
        set: &SchemeSettings,
    ) -> (Option<SchemePlan>, SchemeGraph) {
        let base = par(4, 4, 4);
        let mut planner = SchemePlanner::new(sc, set.clone(), cost, 4, 16, 16_384).unwrap();
        let sp = plan_scheme_step(cost, &mut planner, base, 0, batch).unwrap();
        let sg = build_scheme_step(
            cost,
            sc,
            set,
            base,
            Placement::new(8, 2),
            0,
            batch,
            sp.clone(),
            &NoVariance,
            false,
        )
        .unwrap();
        (sp, sg)
    }

    #[test]
    fn every_scheme_runs_a_step_and_the_signal_removes_exposed_bytes() {
        let (cost, batch, set) = small_step(2);
        let base = par(4, 4, 4);
        let place = Placement::new(8, 2);
        let tokens: u64 = batch.iter().map(PackedSeq::tokens).sum();
        for sc in Scheme::ALL {
            let step = |signal: bool| {
                let mut planner =
                    SchemePlanner::new(sc, set.clone(), &cost, 4, 16, 16_384).unwrap();
                let mut net = StubNet::dgx_h200();
                simulate_scheme_step_with(
                    &cost,
                    &mut planner,
                    &set,
                    base,
                    place,
                    0,
                    &batch,
                    &mut net,
                    &NoVariance,
                    signal,
                )
                .unwrap()
            };
            let (real, sig) = (step(false), step(true));
            assert_eq!(real.report.tokens, tokens, "{sc:?} trains every token");
            assert!(real.attn_span > 0 && real.attn_span < real.report.iteration);
            assert_eq!(real.plan_bytes == 0, sc == Scheme::Ulysses);
            // one-token transfers can only make the step faster (Ulysses has no plan)
            assert!(sig.report.iteration <= real.report.iteration, "{sc:?}");
            assert_eq!(sig.plan_bytes, real.plan_bytes);
        }
    }

    #[test]
    fn plans_graphs_and_reports_do_not_depend_on_the_thread_count() {
        // DistCA's GA indices and nano-batches, every plan's groups in the lowering and the
        // grouped send/recv layout run in parallel: 1 thread (each in turn) and 3 give the
        // same plan, graph and report.
        let (cost, batch, set) = small_step(3);
        for sc in Scheme::ALL {
            let step = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| {
                    let (sp, sg) = small_graph(sc, &cost, &batch, &set);
                    let t = run(&sg.step.graph, &mut StubNet::dgx_h200()).unwrap();
                    let r = measure_scheme_step(&sg, &t, &cost, 0);
                    (sp, sg.step.graph, r.report, r.attn_span)
                })
            };
            let (one, three) = (step(1), step(3));
            assert!(one == three, "{sc:?} depends on the thread count");
        }
    }

    #[test]
    fn the_fused_measure_equals_the_report_and_span_taken_apart() {
        // measure_scheme_step takes each GPU's attention spans within the report's walk:
        // the same report as step_report and the same span as attention_span.
        let (cost, batch, set) = small_step(4);
        for sc in Scheme::ALL {
            let (_, sg) = small_graph(sc, &cost, &batch, &set);
            let t = run(&sg.step.graph, &mut StubNet::dgx_h200()).unwrap();
            let r = measure_scheme_step(&sg, &t, &cost, 0);
            let alone = crate::report::step::step_report(&sg.step, &t, &cost, 0);
            assert_eq!(r.report, alone, "{sc:?}");
            assert_eq!(r.attn_span, attention_span(&sg.step, &t), "{sc:?}");
            assert!(r.attn_span > 0, "{sc:?}");
        }
    }

    #[test]
    fn distca_under_pp_runs_ticks_with_idle_stages_serving() {
        let mut model = ModelConfig::builtin("llama3-8b").unwrap();
        model.layers = 4;
        let cost = CostModel::h200(model).unwrap();
        let corpus = Corpus::from_spec("wlbllm").unwrap();
        let batch = global_batch(&corpus, 16_384, 8, Packing::Sequential, 3, 0).unwrap();
        let set = SchemeSettings {
            cp: 2,
            ..SchemeSettings::default()
        };
        let mut base = par(2, 2, 4);
        base.pp = 2;
        let place = Placement::new(8, 1);
        let mut planner =
            SchemePlanner::new(Scheme::DistCa, set.clone(), &cost, 2, 8, 16_384).unwrap();
        let st = simulate_scheme_step(
            &cost,
            &mut planner,
            &set,
            base,
            place,
            0,
            &batch,
            &mut StubNet::dgx_h200(),
            &NoVariance,
        )
        .unwrap();
        let tokens: u64 = batch.iter().map(PackedSeq::tokens).sum();
        assert_eq!(st.report.tokens, tokens);
        assert!(st.attn_span > 0 && st.attn_span < st.report.iteration);
        // The graph itself: in tick 0 only stage 0 (GPUs 0–3) runs linear layers, yet stage
        // 1's GPUs (4–7) compute attention — the idle warm-up stage serves.
        let par = scheme_parallelism(Scheme::DistCa, base).unwrap();
        let map = RankMap::new(par, place, "distca").unwrap();
        let sp = planner.plan_ticks(0, &batch, 2).unwrap();
        let overlap = scheme_overlap(Scheme::DistCa, &set, sp.nano.as_ref());
        let mut attn = PlanAttention::pooled(&cost, &sp.plan, map, overlap).unwrap();
        let reps = replica_batches(&batch, 2).unwrap();
        let sg = build_step_with(&cost, map, &reps, 0, &NoVariance, &mut attn).unwrap();
        let gpu = |o: &crate::engine::Op| sg.graph.streams[o.stream as usize].gpu;
        let tick0_attn: Vec<u32> = sg
            .graph
            .ops
            .iter()
            .filter(|o| o.label().class == OpClass::AttnFwd && o.label().mb == 0)
            .map(gpu)
            .collect();
        assert!(tick0_attn.iter().any(|&g| g >= 4), "{tick0_attn:?}");
        let t = run(&sg.graph, &mut StubNet::dgx_h200()).unwrap();
        assert_eq!(t.makespan, st.report.iteration);
    }
    #[test]
    fn uneven_micro_batch_counts_wait_at_the_all_reduce() {
        // Megatron dynamic CP on 2 ranks (DP 2 × CP 1), S = 1000, samples 900, 600, 500:
        // rank 0 runs [900], rank 1 runs [600] then [500] (balance::megatron_dcp's hand
        // test). Rank 0's second GA index is empty: no compute at all.
        use crate::balance::megatron_dcp::{schedule, to_plan, DcpConfig};
        let mut model = ModelConfig::builtin("llama3-8b").unwrap();
        model.layers = 2;
        let cost = CostModel::h200(model).unwrap();
        let cfg = DcpConfig::new(2, 1000, 1).unwrap();
        let batch = vec![PackedSeq::from_lengths(&[900, 600, 500], 2000, 0)];
        let sched = schedule(&batch, &cfg, |l| {
            u128::from(crate::workload::causal_pairs(u64::from(l)))
        })
        .unwrap();
        assert_eq!(sched.counts(2), vec![1, 2]);
        let plan = to_plan(0, &sched, &cfg, &cost.attn());
        let place = Placement::new(8, 1);
        let sg = dcp_step(&cost, par(2, 1, 1), place, &plan, 1000, &NoVariance).unwrap();
        assert_eq!((sg.map.par.dp, sg.map.par.cp, sg.map.par.ga), (2, 1, 2));
        assert_eq!(
            (sg.tokens, sg.class_pairs.as_slice()),
            (2000, &[405_450 + 180_300 + 125_250][..])
        );
        let t = run(&sg.graph, &mut StubNet::dgx_h200()).unwrap();
        let gpu = |o: &crate::engine::Op| sg.graph.streams[o.stream as usize].gpu;
        // per GPU: micro-batches with compute, the end of its last compute op, and its
        // all-reduce part (arrival, end, the collective's start)
        let mut mbs = [std::collections::BTreeSet::new(), Default::default()];
        let mut last = [0; 2];
        let mut ar = [(0, 0, 0); 2];
        for (i, o) in sg.graph.ops.iter().enumerate() {
            let g = gpu(o) as usize;
            match o.kind() {
                OpKind::Compute(d) => {
                    if d > 0 {
                        mbs[g].insert(o.label().mb);
                    }
                    last[g] = last[g].max(t.end[i]);
                }
                OpKind::Coll(c) if o.label().class == OpClass::DpAllReduce => {
                    ar[g] = (t.start[i], t.end[i], t.coll_start[c as usize]);
                }
                _ => {}
            }
        }
        assert_eq!(mbs[0].iter().copied().collect::<Vec<_>>(), vec![0]);
        assert_eq!(mbs[1].iter().copied().collect::<Vec<_>>(), vec![0, 1]);
        // Rank 1 (1100 tokens in two micro-batches) finishes last; rank 0 arrives at the
        // all-reduce when its one micro-batch is done and waits there for rank 1: the
        // reduction starts at rank 1's last op and ends together on both.
        assert!(last[0] < last[1], "{last:?}");
        assert_eq!((ar[0].0, ar[1].0), (last[0], last[1]));
        assert_eq!((ar[0].2, ar[1].2), (last[1], last[1]));
        assert_eq!(ar[0].1, ar[1].1);
        assert_eq!(t.makespan, ar[1].1);
    }

    #[test]
    fn dynamic_cp_under_tp2_runs_each_rank_on_both_lanes() {
        // The uneven hand case (rank 0: [900]; rank 1: [600], [500]; S = 1000) at TP 2: rank
        // r is GPUs 2r and 2r + 1, each lane runs its rank's micro-batches on half the query
        // heads (the plan is one TP rank's), and the DP all-reduce of all four GPUs waits
        // for rank 1's two micro-batches.
        use crate::balance::megatron_dcp::{schedule, to_plan, DcpConfig};
        let mut model = ModelConfig::builtin("llama3-8b").unwrap();
        model.layers = 2;
        let cost = CostModel::h200(model).unwrap();
        let cfg = DcpConfig::new(2, 1000, 1).unwrap();
        let batch = vec![PackedSeq::from_lengths(&[900, 600, 500], 2000, 0)];
        let sched = schedule(&batch, &cfg, |l| {
            u128::from(crate::workload::causal_pairs(u64::from(l)))
        })
        .unwrap();
        let lane = cost.tp_shard(2, 1).unwrap();
        assert_eq!(lane.attn().heads_q * 2, cost.attn().heads_q);
        let plan = to_plan(0, &sched, &cfg, &lane.attn());
        let place = Placement::new(8, 1);
        let tp2 = Parallelism {
            tp: 2,
            ..par(2, 1, 1)
        };
        // A plan at the whole model's shape is not one TP rank's: refused by name.
        let whole = to_plan(0, &sched, &cfg, &cost.attn());
        let e = dcp_step(&cost, tp2, place, &whole, 1000, &NoVariance)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("plan shape"), "{e}");
        let sg = dcp_step(&cost, tp2, place, &plan, 1000, &NoVariance).unwrap();
        assert_eq!((sg.map.par.dp, sg.map.par.tp, sg.map.par.ga), (2, 2, 2));
        let t = run(&sg.graph, &mut StubNet::dgx_h200()).unwrap();
        let gpu = |o: &crate::engine::Op| sg.graph.streams[o.stream as usize].gpu as usize;
        let mut mbs = vec![std::collections::BTreeSet::new(); 4];
        let mut attn = [0u64; 4];
        let mut last = [0; 4];
        let mut ar = Vec::new();
        for (i, o) in sg.graph.ops.iter().enumerate() {
            let g = gpu(o);
            match o.kind() {
                OpKind::Coll(c) if o.label().class == OpClass::DpAllReduce => {
                    ar.push((g, t.coll_start[c as usize], t.end[i]));
                    continue;
                }
                OpKind::Compute(d) if d > 0 => {
                    mbs[g].insert(o.label().mb);
                    if o.label().class == OpClass::AttnFwd {
                        attn[g] += d;
                    }
                }
                _ => {}
            }
            // the end of its last op before the all-reduce (compute or a TP collective)
            last[g] = last[g].max(t.end[i]);
        }
        let ids = |g: usize| mbs[g].iter().copied().collect::<Vec<_>>();
        assert_eq!((ids(0), ids(1)), (vec![0], vec![0]));
        assert_eq!((ids(2), ids(3)), (vec![0, 1], vec![0, 1]));
        // The two lanes of a rank run the same attention; rank 1's (600 and 500 tokens)
        // is less than rank 0's (900) by the causal pairs' ratio up to launch costs.
        assert_eq!((attn[0], attn[2]), (attn[1], attn[3]));
        assert!(attn[2] < attn[0], "{attn:?}");
        // Every GPU's all-reduce part starts when the slowest rank is done (its last TP
        // collective) and ends together.
        let slowest = last.iter().copied().max().unwrap();
        assert_eq!(slowest, last[2].max(last[3]));
        assert_eq!(ar.len(), 4, "{ar:?}");
        assert!(
            ar.iter().all(|&(_, s, e)| s == slowest && e == ar[0].2),
            "{ar:?} {last:?}"
        );
        assert_eq!(t.makespan, ar[0].2);
    }
}
