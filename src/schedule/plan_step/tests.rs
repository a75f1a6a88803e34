use super::*;
use crate::balance::ulysses::{plan_step as ulysses_plan, UlyssesParams};
use crate::cost::ModelConfig;
use crate::engine::stub_net::StubNet;
use crate::schedule::step::build_step;
use crate::schedule::{NoVariance, Parallelism, PipelineKind, Placement, Precision};
use crate::workload::Sample;

fn seq(lens: &[u32], cap: u32) -> PackedSeq {
    PackedSeq {
        samples: lens
            .iter()
            .enumerate()
            .map(|(i, &len)| Sample {
                doc: i as u64,
                offset: 0,
                len,
                cut: false,
            })
            .collect(),
        capacity: cap,
    }
}

fn qwen() -> CostModel {
    CostModel::h200(ModelConfig::builtin("qwen3-30b-a3b").unwrap()).unwrap()
}

fn rank_map(dp: u32, pp: u32, cp: u32, ga: u32) -> RankMap {
    RankMap::new(
        Parallelism {
            dp,
            pp,
            cp,
            ga,
            pipeline: PipelineKind::OneFOneB,
            recompute: true,
            zero_stage: 1,
            dp_buckets: 2,
            tp: 1,
            sp: true,
            tp_overlap: false,
            ep: 1,
            moe_hot_share: 0.0,
            precision: Precision::Bf16,
        },
        Placement::new(8, 8),
        "test",
    )
    .unwrap()
}

/// A skewed global batch of 4 sequences of 32K: one long document in the first, short
/// ones elsewhere.
fn skewed() -> Vec<PackedSeq> {
    vec![
        seq(&[32_768], 32_768),
        seq(&[4096; 8], 32_768),
        seq(&[2048; 16], 32_768),
        seq(&[8192; 4], 32_768),
    ]
}

#[test]
fn a_cp1_ulysses_plan_through_the_plan_stage_equals_the_built_in_step() {
    // CP = 1: the Ulysses plan is one unit per sequence on its own rank, nothing moves,
    // so the plugged stage must reproduce the built-in attention to the picosecond
    // (linear blocks, 1F1B over 2 stages, GA 2, recomputation, bucketed all-reduce).
    let c = qwen();
    let m = rank_map(2, 2, 1, 2);
    let global = skewed();
    let p = UlyssesParams {
        cp: 1,
        shape: c.attn(),
    };
    let plan = ulysses_plan(0, &global, 2, &p).unwrap();
    let sg = build_plan_step(&c, m, &plan, &global, Overlap::HeadChunks(1), &NoVariance).unwrap();
    let t = run(&sg.graph, &mut StubNet::dgx_h200()).unwrap();
    // The Ulysses planner deals sequence b to GA index b / DP on replica b mod DP.
    let batch = replica_batches(&plan, &global, 2, 2, 1).unwrap();
    assert_eq!(batch[0], vec![global[0].clone(), global[2].clone()]);
    assert_eq!(batch[1], vec![global[1].clone(), global[3].clone()]);
    let sg0 = build_step(&c, m, &batch, 0, &NoVariance).unwrap();
    let t0 = run(&sg0.graph, &mut StubNet::dgx_h200()).unwrap();
    assert_eq!(t.makespan, t0.makespan);
    assert_eq!(sg.graph.ops.len(), sg0.graph.ops.len());
}

#[test]
fn libra_balances_a_skewed_batch_that_ulysses_waits_on() {
    let c = qwen();
    let m = rank_map(2, 1, 8, 2);
    let p = LibraParams {
        pool_size: 2,
        cp: 8,
        head_shards: 4,
        tile_tokens: 2048,
        chunks: 4,
        ..LibraParams::default()
    };
    let mut times = Vec::new();
    for s in [
        StepAttention::Ulysses,
        StepAttention::LibraTap(p),
        StepAttention::LibraTapVrsp(p),
        StepAttention::Libra(p),
    ] {
        let (sg, t) = simulate_scheme_batch(
            &s,
            &c,
            m,
            skewed(),
            0,
            &mut StubNet::dgx_h200(),
            &NoVariance,
        )
        .unwrap();
        // Determinism: the same step again is the same timeline.
        let (_, t2) = simulate_scheme_batch(
            &s,
            &c,
            m,
            skewed(),
            0,
            &mut StubNet::dgx_h200(),
            &NoVariance,
        )
        .unwrap();
        assert_eq!(t.end, t2.end, "{}", s.name());
        // every variant is one of the schemes, named as the experiment file names it
        assert_eq!(
            StepAttention::parse(s.name(), p).unwrap().scheme(),
            s.scheme()
        );
        assert!(s.name().starts_with(s.scheme().name()), "{}", s.name());
        assert!(sg.graph.ops.len() > 100);
        times.push(t.makespan);
    }
    // Ulysses' replica 0 holds both long-document sequences' skew (GA over 2 of them);
    // every Libra variant spreads each GA index's tiles over both replicas.
    assert!(times[1] < times[0], "{times:?}");
    assert!(times[3] <= times[2], "{times:?}");
}

#[test]
fn bad_schemes_and_plans_are_named() {
    let e = StepAttention::parse("megatron", LibraParams::default()).unwrap_err();
    assert!(e.to_string().contains("libra-tap-vrsp"), "{e}");
    let c = qwen();
    let p = UlyssesParams {
        cp: 1,
        shape: c.attn(),
    };
    let global = skewed();
    let plan = ulysses_plan(0, &global, 2, &p).unwrap();
    // The plan has 2 replicas × 2 GA: a layout with 1 GA index has no room for GA 1.
    let e = replica_batches(&plan, &global, 2, 1, 1).unwrap_err();
    assert!(e.to_string().contains("GA index"), "{e}");
    // A 4-replica layout leaves replicas 2 and 3 idle (empty micro-batches).
    let b = replica_batches(&plan, &global, 4, 2, 1).unwrap();
    assert_eq!(b[2][0].tokens(), 0);
    assert_eq!(b[0][1], global[2]);
    // ... and such a step still runs: the idle replicas only join the all-reduce.
    let sg = build_plan_step(
        &c,
        rank_map(4, 1, 1, 2),
        &plan,
        &global,
        Overlap::HeadChunks(1),
        &NoVariance,
    )
    .unwrap();
    let t = run(&sg.graph, &mut StubNet::dgx_h200()).unwrap();
    assert!(t.makespan > 0);
    // Two sequences on one slot (replica 0, GA 0) are concatenated.
    let mut two = plan.clone();
    two.groups[1].ga = 0; // group of sequence 1 (replica 1) ...
    for r in &mut two.groups[1].sequences[0].layout {
        r.worker = 0; // ... now lives on replica 0
    }
    let b = replica_batches(&two, &global, 2, 2, 1).unwrap();
    assert_eq!(b[0][0].tokens(), global[0].tokens() + global[1].tokens());
    assert_eq!(b[0][0].capacity, 65_536);
    assert_eq!(b[1][0].tokens(), 0);
    let e = simulate_scheme_batch(
        &StepAttention::Libra(LibraParams::default()),
        &c,
        rank_map(2, 1, 8, 2),
        global,
        0,
        &mut StubNet::dgx_h200(),
        &NoVariance,
    )
    .unwrap_err();
    assert!(e.to_string().contains("libra cp"), "{e}");
}

#[test]
fn distca_ping_pong_runs_each_nano_batch_under_the_others_linear_block() {
    use crate::balance::distca::{lower::plan_step as distca_plan, DistcaConfig};
    use crate::engine::OpClass;
    use crate::schedule::plan_attn::unit_fwd_ps_f;
    let mut model = ModelConfig::builtin("llama3-8b").unwrap();
    model.layers = 2;
    let c = CostModel::h200(model).unwrap();
    // 4 servers on 4 nodes (every move crosses a NIC), one micro-batch each.
    let m = RankMap::new(
        Parallelism {
            dp: 4,
            pp: 1,
            cp: 1,
            ga: 1,
            pipeline: PipelineKind::OneFOneB,
            recompute: false,
            zero_stage: 1,
            dp_buckets: 1,
            tp: 1,
            sp: true,
            tp_overlap: false,
            ep: 1,
            moe_hot_share: 0.0,
            precision: Precision::Bf16,
        },
        Placement::new(1, 4),
        "test",
    )
    .unwrap();
    let global = skewed();
    let cfg = DistcaConfig::new(c.attn(), 0.1, 128).unwrap();
    let d = distca_plan(0, &global, 4, &cfg, true).unwrap();
    assert!(
        d.plan.groups[0].transfers.len() > 1,
        "the skew makes DistCA move work"
    );
    let step = |o: Overlap<'_>| {
        let sg = build_plan_step(&c, m, &d.plan, &global, o, &NoVariance).unwrap();
        let t = run(&sg.graph, &mut StubNet::dgx_h200()).unwrap();
        (sg, t)
    };
    let (sn, tn) = step(Overlap::NanoBatches(&d.nano));
    let (s1, t1) = step(Overlap::HeadChunks(1));
    let ops = |sg: &StepGraph, class: OpClass| -> Vec<usize> {
        (0..sg.graph.ops.len())
            .filter(|&i| sg.graph.ops[i].label().class == class)
            .collect()
    };
    let gpu = |sg: &StepGraph, i: usize| sg.graph.streams[sg.graph.ops[i].stream as usize].gpu;
    // Every linear block is cut in two (one op per nano-batch).
    assert_eq!(
        ops(&sn, OpClass::LinearFwd).len(),
        2 * ops(&s1, OpClass::LinearFwd).len()
    );
    // Kernel time per layer = Σ over (worker, nano-batch with units) of its units' time
    // for all heads of the shard + one launch: priced by hand from the plan.
    let g = &d.plan.groups[0];
    let mut want = 0u64;
    for w in &g.workers {
        for k in 0..2u8 {
            let us: Vec<_> = g
                .units
                .iter()
                .filter(|u| u.worker == *w && d.nano.unit_nano(0, u.id) == k)
                .collect();
            if !us.is_empty() {
                let t: f64 = us
                    .iter()
                    .map(|u| unit_fwd_ps_f(&c, u, d.plan.heads_per_shard()))
                    .sum();
                want += (t + c.attn_launch_ps()).round() as u64;
            }
        }
    }
    let got: u64 = ops(&sn, OpClass::AttnFwd)
        .iter()
        .map(|&i| tn.end[i] - tn.start[i])
        .sum();
    assert_eq!(got, 2 * want, "two layers");
    // The mechanism: a dispatch runs while the same GPU computes a linear block (the other
    // nano-batch's). Without ping-pong a dispatch never overlaps its GPU's linear work.
    let overlapped = |sg: &StepGraph, t: &crate::engine::Timeline| {
        let lin = ops(sg, OpClass::LinearFwd);
        ops(sg, OpClass::A2aIn).iter().any(|&a| {
            lin.iter().any(|&l| {
                gpu(sg, a) == gpu(sg, l) && t.start[a].max(t.start[l]) < t.end[a].min(t.end[l])
            })
        })
    };
    assert!(overlapped(&sn, &tn));
    assert!(!overlapped(&s1, &t1));
    assert!(
        tn.makespan < t1.makespan,
        "{} vs {}",
        tn.makespan,
        t1.makespan
    );
}
