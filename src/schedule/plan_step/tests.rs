use super::*;
use crate::balance::ulysses::{plan_step as ulysses_plan, UlyssesParams};
use crate::cost::ModelConfig;
use crate::engine::stub_net::StubNet;
use crate::schedule::ulysses::build_step;
use crate::schedule::{NoVariance, Parallelism, PipelineKind, Placement};
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
        },
        Placement {
            gpus_per_node: 8,
            nodes: 8,
        },
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
    let sg = build_plan_step(&c, m, &plan, &global, 1, &NoVariance).unwrap();
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
        Scheme::Ulysses,
        Scheme::LibraTap(p),
        Scheme::LibraTapVrsp(p),
        Scheme::Libra(p),
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
    let e = Scheme::parse("megatron", LibraParams::default()).unwrap_err();
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
    let sg = build_plan_step(&c, rank_map(4, 1, 1, 2), &plan, &global, 1, &NoVariance).unwrap();
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
        &Scheme::Libra(LibraParams::default()),
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
