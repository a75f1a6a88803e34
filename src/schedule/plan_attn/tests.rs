use super::*;
use crate::cost::ModelConfig;
use crate::engine::run;
use crate::engine::stub_net::StubNet;
use crate::plan::{KvGroup, Payload, PlanSeq, Resident, Segment, Transfer, PLAN_VERSION};
use crate::schedule::{NoVariance, Parallelism, PipelineKind, Placement, Precision};

fn qwen() -> CostModel {
    CostModel::h200(ModelConfig::builtin("qwen3-30b-a3b").unwrap()).unwrap()
}

fn map(cp: u32, gpus_per_node: u32) -> RankMap {
    let par = Parallelism {
        dp: 1,
        pp: 1,
        cp,
        ga: 1,
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
    };
    RankMap::new(
        par,
        Placement::new(gpus_per_node, cp.div_ceil(gpus_per_node)),
        "test",
    )
    .unwrap()
}

/// One sequence of one sample of `len` tokens living on worker 0, one unit over all of it
/// (H = 1) executed on `exec`; when `exec` ≠ 0 its Q and KV go there and the output back.
fn one_unit_plan(cost: &CostModel, len: u32, exec: WorkerId, workers: u32) -> Plan {
    let shape = cost.attn();
    let pairs = crate::plan::segment_pairs(0, u64::from(len));
    let group = KvGroup {
        seq: 0,
        sample: 0,
        shard: 0,
    };
    let mut transfers = Vec::new();
    if exec != 0 {
        let l = u64::from(len);
        transfers.push(Transfer {
            src: 0,
            dst: exec,
            bytes: shape.q_bytes(l, shape.heads_q),
            carries: Payload::Q {
                unit: 0,
                start: 0,
                end: l,
            },
        });
        transfers.push(Transfer {
            src: 0,
            dst: exec,
            bytes: shape.kv_bytes(l, shape.heads_kv),
            carries: Payload::Kv {
                group,
                start: 0,
                end: len,
            },
        });
        transfers.push(Transfer {
            src: exec,
            dst: 0,
            bytes: shape.q_bytes(l, shape.heads_q),
            carries: Payload::Output {
                unit: 0,
                start: 0,
                end: l,
            },
        });
    }
    let plan = Plan {
        version: PLAN_VERSION,
        scheme: "test".into(),
        step: 0,
        shape,
        head_shards: 1,
        groups: vec![Group {
            ga: 0,
            pool: 0,
            workers: (0..workers).collect(),
            sequences: vec![PlanSeq {
                id: 0,
                samples: vec![len],
                capacity: len,
                layout: vec![Resident {
                    start: 0,
                    end: u64::from(len),
                    worker: 0,
                }],
            }],
            units: vec![WorkUnit {
                id: 0,
                seq: 0,
                q_start: 0,
                q_end: u64::from(len),
                shard: 0,
                segments: vec![Segment {
                    sample: 0,
                    start: 0,
                    end: len,
                }],
                kv_groups: vec![group],
                pairs,
                flops: shape.fwd_flops(pairs, shape.heads_q),
                q_home: 0,
                worker: exec,
            }],
            transfers,
        }],
    };
    // The hand-made plan is a valid plan.
    crate::plan::check(&plan).unwrap();
    plan
}

/// Emit one forward (or backward) layer of `plan` alone on a fresh graph and run it on
/// `net`; the makespan.
fn layer_time(
    cost: &CostModel,
    plan: &Plan,
    m: RankMap,
    chunks: u32,
    fwd: bool,
    net: &mut StubNet,
) -> (Ps, PlanAttention) {
    let mut pa = PlanAttention::new(cost, plan, m, Overlap::HeadChunks(chunks)).unwrap();
    let mut b = GraphBuilder::with_capacity(64);
    for g in 0..m.gpus() {
        for k in [
            StreamKind::Compute,
            StreamKind::CpComm,
            StreamKind::PpComm,
            StreamKind::DpComm,
        ] {
            b.add_stream(g, k);
        }
    }
    let env = StepEnv {
        map: m,
        var: &NoVariance,
        step: 0,
    };
    let mut last = vec![OpId::MAX; (m.par.dp * m.par.cp) as usize];
    let call = AttnCall {
        stage: 0,
        layer: 0,
        mb: 0,
        replica: None,
        fwd,
        recompute: false,
    };
    pa.emit(&mut b, &env, call, &mut last).unwrap();
    let g = b.build().unwrap();
    (run(&g, net).unwrap().makespan, pa)
}

#[test]
fn one_worker_one_unit_costs_the_cost_model_price() {
    let c = qwen();
    let plan = one_unit_plan(&c, 16_384, 0, 1);
    let mut net = StubNet::dgx_h200();
    let (t, _) = layer_time(&c, &plan, map(1, 8), 1, true, &mut net);
    assert_eq!(t, c.attn_fwd_ps([16_384], 32));
    // By hand: 16384·16385/2 pairs × 32 heads × 512 FLOPs at the table's 340.2 TFLOP/s.
    let want: f64 = 16384.0 * 16385.0 / 2.0 * 32.0 * 512.0 / 340.2;
    assert_eq!(t, want.round() as Ps);
    let (tb, _) = layer_time(&c, &plan, map(1, 8), 1, false, &mut net);
    assert_eq!(tb, c.attn_bwd_ps([16_384], 32));
    // A unit cut in two segments of one sample costs the sum of their prices.
    let a = c.attn();
    let mut u = plan.groups[0].units[0].clone();
    u.segments = vec![
        Segment {
            sample: 0,
            start: 0,
            end: 8192,
        },
        Segment {
            sample: 0,
            start: 8192,
            end: 16_384,
        },
    ];
    let lo =
        a.fwd_flops(crate::plan::segment_pairs(0, 8192), 32) / c.attn_eff.tflops(32, 8192, 8192);
    let hi = a.fwd_flops(crate::plan::segment_pairs(8192, 16_384), 32)
        / c.attn_eff.tflops(32, 8192, 16_384);
    assert!((unit_fwd_ps_f(&c, &u, 32) - (lo + hi)).abs() < 1e-3);
}

#[test]
fn transfer_bound_unit_costs_bytes_over_bandwidth_plus_compute() {
    let c = qwen();
    let a = c.attn();
    let len = 1024u32;
    // Two workers on two nodes (one GPU each): Q and KV cross at 10 GB/s, 5 µs latency.
    let plan = one_unit_plan(&c, len, 1, 2);
    let mut net = StubNet::new(1, 5_000_000, 450e9, 10e9);
    let (t, _) = layer_time(&c, &plan, map(2, 1), 1, true, &mut net);
    let l = u64::from(len);
    let inb = a.q_bytes(l, 32) + a.kv_bytes(l, 4);
    let outb = a.q_bytes(l, 32);
    let d = 5_000_000 + (inb as f64 / 10e9 * 1e12).round() as Ps;
    let r = 5_000_000 + (outb as f64 / 10e9 * 1e12).round() as Ps;
    let comp = c.attn_fwd_ps([len], 32);
    assert_eq!(t, d + comp + r);
    assert!(d + r > 10 * comp, "the case is transfer-bound");
    // Backward: dO in (output bytes), dQ+dK+dV back (Q + KV bytes).
    let (tb, _) = layer_time(&c, &plan, map(2, 1), 1, false, &mut net);
    let d_b = 5_000_000 + (outb as f64 / 10e9 * 1e12).round() as Ps;
    let r_b = 5_000_000 + (inb as f64 / 10e9 * 1e12).round() as Ps;
    assert_eq!(tb, d_b + c.attn_bwd_ps([len], 32) + r_b);
}

#[test]
fn pipeliner_hides_all_but_first_dispatch_and_last_return() {
    let c = qwen();
    let a = c.attn();
    let len = 16_384u32;
    let l = u64::from(len);
    let plan = one_unit_plan(&c, len, 1, 2);
    let mut net = StubNet::new(1, 5_000_000, 450e9, 50e9);
    let m = 4u32;
    let (t, pa) = layer_time(&c, &plan, map(2, 1), m, true, &mut net);
    assert_eq!(pa.chunks(), 4);
    // Chunk: 8 query heads; GQA 32/4 → one KV head per chunk.
    let d = 5_000_000 + ((a.q_bytes(l, 8) + a.kv_bytes(l, 1)) as f64 / 50e9 * 1e12).round() as Ps;
    let r = 5_000_000 + (a.q_bytes(l, 8) as f64 / 50e9 * 1e12).round() as Ps;
    let comp = c.attn_fwd_ps([len], 8);
    assert!(d + r < comp, "compute dominates: {d} + {r} vs {comp}");
    assert_eq!(t, d + 4 * comp + r);
    // Without the pipeliner every byte is exposed.
    let (t1, _) = layer_time(&c, &plan, map(2, 1), 1, true, &mut net);
    let d1 = 5_000_000 + ((a.q_bytes(l, 32) + a.kv_bytes(l, 4)) as f64 / 50e9 * 1e12).round() as Ps;
    let r1 = 5_000_000 + (a.q_bytes(l, 32) as f64 / 50e9 * 1e12).round() as Ps;
    assert_eq!(t1, d1 + c.attn_fwd_ps([len], 32) + r1);
    // When communication dominates instead, chunks cannot hide it: the layer takes at
    // least M dispatches and returns back to back on the one comm stream.
    let mut slow = StubNet::new(1, 5_000_000, 450e9, 1e9);
    let (ts, _) = layer_time(&c, &plan, map(2, 1), m, true, &mut slow);
    let ds = 5_000_000 + ((a.q_bytes(l, 8) + a.kv_bytes(l, 1)) as f64 / 1e9 * 1e12).round() as Ps;
    let rs = 5_000_000 + (a.q_bytes(l, 8) as f64 / 1e9 * 1e12).round() as Ps;
    assert!(ts >= 4 * (ds + rs), "{ts}");
}

#[test]
fn ports_aggregate_egress_and_ingress() {
    // GPUs 0..3 on node 0, 4..7 on node 1 (2 nodes of 4).
    let m = map(8, 4);
    let x = port_xfers(&[(0, 1, 10), (2, 1, 5), (0, 4, 7), (3, 3, 100)], m);
    // GPU 0: intra out 10, inter out 7; GPU 1: intra in 15; GPU 2: intra out 5; GPU 4:
    // inter in 7; the local piece moves nothing.
    assert_eq!(
        x,
        vec![
            Xfer {
                src: 0,
                dst: 1,
                bytes: 10
            },
            Xfer {
                src: 0,
                dst: 4,
                bytes: 7
            },
            Xfer {
                src: 1,
                dst: 2,
                bytes: 15
            },
            Xfer {
                src: 2,
                dst: 3,
                bytes: 5
            },
            Xfer {
                src: 4,
                dst: 0,
                bytes: 7
            },
        ]
    );
}

#[test]
fn reversed_pieces_aggregate_onto_the_same_ports() {
    // The backward reuses the forward's port transfers: reversing every piece swaps each
    // GPU's egress and ingress, and a port moves the larger of the two.
    let m = map(8, 4);
    let mut rng = crate::rng::stream(7, "ports", 0);
    for _ in 0..50 {
        use rand::Rng;
        let pieces: Vec<(GpuId, GpuId, u64)> = (0..rng.random_range(0..40))
            .map(|_| {
                (
                    rng.random_range(0..8),
                    rng.random_range(0..8),
                    rng.random_range(0..1000),
                )
            })
            .collect();
        let rev: Vec<_> = pieces.iter().map(|&(s, d, b)| (d, s, b)).collect();
        assert_eq!(port_xfers(&pieces, m), port_xfers(&rev, m), "{pieces:?}");
    }
}

#[test]
fn bad_chunks_and_foreign_workers_are_named() {
    let c = qwen();
    let plan = one_unit_plan(&c, 1024, 0, 1);
    let e = PlanAttention::new(&c, &plan, map(1, 8), Overlap::HeadChunks(3)).unwrap_err();
    assert!(e.to_string().contains("M (pipeliner chunks)"), "{e}");
    let plan2 = one_unit_plan(&c, 1024, 1, 2);
    let e = PlanAttention::new(&c, &plan2, map(1, 8), Overlap::HeadChunks(1)).unwrap_err();
    assert!(e.to_string().contains("worker"), "{e}");
}

#[test]
fn a_calibrated_backward_table_prices_plan_units_like_the_cost_model() {
    // A backward table at a flat 100 TFLOP/s and a 20 µs backward call: a whole-document
    // unit's backward kernel is exactly `CostModel::attn_bwd_ps` of that document, and not
    // the forward × factor / efficiency any more.
    use crate::cost::kernel::{EffPoint, EffTable};
    let mut c = qwen();
    let pts: Vec<EffPoint> = [1u32, 64]
        .iter()
        .flat_map(|&heads| {
            [128u32, 1 << 20].map(|len| EffPoint {
                heads,
                len,
                tflops: 100.0,
            })
        })
        .collect();
    c.attn_bwd_eff = Some(EffTable::from_points(&pts, "test").unwrap());
    c.launch.attn_bwd_launch_us = 20.0;
    let plan = one_unit_plan(&c, 8192, 0, 1);
    let pa = PlanAttention::new(&c, &plan, map(1, 8), Overlap::HeadChunks(1)).unwrap();
    let bwd = pa.ops[0][0][0][0].chunks[0].bwd[0];
    assert_eq!(bwd, c.attn_bwd_ps([8192], c.model.heads_q));
    let flops = c
        .attn()
        .fwd_flops(crate::plan::segment_pairs(0, 8192), c.model.heads_q);
    let want = flops * c.hw.attn_bwd_flop_factor / 100e12 * 1e12 + 20e6;
    assert_eq!(bwd, want.round() as Ps);
    c.attn_bwd_eff = None;
    let pa = PlanAttention::new(&c, &plan, map(1, 8), Overlap::HeadChunks(1)).unwrap();
    assert_ne!(pa.ops[0][0][0][0].chunks[0].bwd[0], bwd);
}

#[test]
fn a_calibrated_block_model_prices_a_workers_launch() {
    let plain = qwen();
    let plan = one_unit_plan(&plain, 16_384, 0, 1);
    let mut net = StubNet::dgx_h200();
    let (t0, _) = layer_time(&plain, &plan, map(1, 8), 1, true, &mut net);
    // The worker's one launch: 128 tiles × 32 heads = 4,096 blocks on 132 SMs × 2 slots.
    // The engine's forward time is the cost model's price of that launch, the blocks'
    // makespan, not the table's.
    let mut cal = qwen();
    cal.attn_blocks = Some(crate::cost::BlockModel::h200(1.0, 1000.0, 0.1, 200.0, 1.4));
    let (t, _) = layer_time(&cal, &plan, map(1, 8), 1, true, &mut net);
    assert_eq!(t, cal.attn_fwd_ps([16_384], 32));
    assert_ne!(t, t0);
    // At least every block's time spread over the slots at the SMs' shared throughput.
    let m = cal.attn_blocks.unwrap();
    let one_head: f64 = (0..128u64)
        .map(|k| {
            m.block_ps(
                m.shape(crate::cost::Mask::Causal, 128 * k, 128 * (k + 1)),
                128,
            )
        })
        .sum();
    let even = one_head * 32.0 * 1.4 / (132.0 * 2.0);
    assert!(t as f64 >= even && (t as f64) < 1.1 * even, "{t} {even}");
    // Twice the step time: twice the forward.
    let mut slow = qwen();
    slow.attn_blocks = Some(crate::cost::BlockModel::h200(2.0, 2000.0, 0.1, 400.0, 1.4));
    let (t2, _) = layer_time(&slow, &plan, map(1, 8), 1, true, &mut net);
    assert!((t2 as f64 / t as f64 - 2.0).abs() < 1e-6, "{t2} {t}");
    // The forward's block model leaves the backward alone.
    let (b0, _) = layer_time(&plain, &plan, map(1, 8), 1, false, &mut net);
    let (b, _) = layer_time(&cal, &plan, map(1, 8), 1, false, &mut net);
    assert_eq!(b, b0);
    // A backward block model prices the worker's backward call: the engine's backward time
    // is the cost model's price of that call (its blocks plus the backward overhead).
    let t = |iter_ns: f64| crate::cost::blocks::BlockTimes {
        block_ns: 2.0 * iter_ns,
        iter_ns,
        row_share: 0.3,
        diag_ns: 0.0,
        empty_ns: 0.0,
    };
    let mut bw = cal.clone();
    bw.attn_bwd_blocks = Some(crate::cost::BwdBlockModel::h200(
        0.05,
        t(2400.0),
        t(1500.0),
        1.6,
    ));
    bw.launch.attn_bwd_launch_us = 25.0;
    let (b1, _) = layer_time(&bw, &plan, map(1, 8), 1, false, &mut net);
    assert_eq!(b1, bw.attn_bwd_ps([16_384], 32));
    assert_ne!(b1, b0);
    // By hand, bounded below by the dQ launch's 256 blocks × 32 heads and the dK/dV
    // launch's as many, spread over the SMs' 264 slots at the shared throughput, plus the
    // row·head work and the call.
    let m = bw.attn_bwd_blocks.unwrap();
    let (dq, kv) = (
        crate::cost::blocks::bwd_dq_blocks(&m, crate::cost::Mask::Causal, [(0, 16_384, 1)]),
        crate::cost::blocks::bwd_dkdv_blocks(&m, crate::cost::Mask::Causal, [(0, 16_384, 1)]),
    );
    assert_eq!((dq.len(), kv.len()), (256, 256));
    let work = |tt: &crate::cost::blocks::BlockTimes, v: &[crate::cost::blocks::BlockShape]| {
        v.iter().map(|&s| tt.block_ps(s, 1.0, 64)).sum::<f64>() * 32.0 * 1.6 / 264.0
    };
    let even = work(&m.dq, &dq) + work(&m.dkdv, &kv) + 0.05e3 * 16_384.0 * 32.0 + 25e6;
    assert!(b1 as f64 >= even && (b1 as f64) < 1.1 * even, "{b1} {even}");
    // The forward is untouched by it.
    let (f1, _) = layer_time(&bw, &plan, map(1, 8), 1, true, &mut net);
    assert_eq!(f1, cal.attn_fwd_ps([16_384], 32));
}
