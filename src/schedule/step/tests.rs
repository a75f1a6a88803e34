use super::*;
use crate::cost::ModelConfig;
use crate::engine::stub_net::StubNet;
use crate::engine::{run, Timeline};
use crate::schedule::{NoVariance, Parallelism, Placement, Precision};

pub(crate) fn seq(lens: &[u32], cap: u32) -> PackedSeq {
    PackedSeq::from_lengths(lens, cap, 0)
}

fn par(dp: u32, pp: u32, cp: u32, ga: u32) -> Parallelism {
    Parallelism {
        dp,
        pp,
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

fn qwen() -> CostModel {
    CostModel::h200(ModelConfig::builtin("qwen3-30b-a3b").unwrap()).unwrap()
}

fn go(cost: &CostModel, p: Parallelism, batch: &[Vec<PackedSeq>]) -> (StepGraph, Timeline) {
    let map = RankMap::new(p, Placement::new(8, 64), "test").unwrap();
    let sg = build_step(cost, map, batch, 0, &NoVariance).unwrap();
    let t = run(&sg.graph, &mut StubNet::dgx_h200()).unwrap();
    (sg, t)
}

fn compute_busy(sg: &StepGraph, t: &Timeline, gpu: u32) -> Ps {
    sg.graph
        .stream_ops(sg.streams_per_gpu * gpu)
        .iter()
        .map(|&o| t.end[o as usize] - t.start[o as usize])
        .sum()
}

#[test]
fn heads_divide_or_are_rejected() {
    assert_eq!(head_split(32, 4, 16).unwrap(), HeadSplit { q: 2, kv: 1 });
    assert_eq!(head_split(32, 4, 4).unwrap(), HeadSplit { q: 8, kv: 1 });
    assert_eq!(head_split(32, 8, 2).unwrap(), HeadSplit { q: 16, kv: 4 });
    assert_eq!(head_split(64, 8, 32).unwrap(), HeadSplit { q: 2, kv: 1 });
    assert!(head_split(32, 4, 3)
        .unwrap_err()
        .to_string()
        .contains("32 query heads"));
    assert!(head_split(48, 12, 8)
        .unwrap_err()
        .to_string()
        .contains("12 KV heads"));
}

#[test]
fn pipeline_orders() {
    let f = |v: Vec<(bool, u32)>| {
        v.iter()
            .map(|&(f, m)| format!("{}{m}", if f { 'F' } else { 'B' }))
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        f(stage_order(PipelineKind::OneFOneB, 4, 0, 6)),
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"
    );
    assert_eq!(
        f(stage_order(PipelineKind::OneFOneB, 4, 3, 3)),
        "F0 B0 F1 B1 F2 B2"
    );
    assert_eq!(
        f(stage_order(PipelineKind::OneFOneB, 4, 0, 2)),
        "F0 F1 B0 B1"
    );
    assert_eq!(f(stage_order(PipelineKind::Gpipe, 2, 1, 2)), "F0 F1 B0 B1");
    assert_eq!(
        stage_layers(48, 5),
        vec![(0, 10), (10, 20), (20, 30), (30, 39), (39, 48)]
    );
    assert_eq!(in_flight(PipelineKind::OneFOneB, 4, 1, 8), 3);
}

/// A single GPU, a single document, no variance: the step is exactly the cost model's sum.
#[test]
fn single_gpu_step_is_the_cost_model_sum() {
    let c = qwen();
    let s = seq(&[30_000], 32_768);
    let (sg, t) = go(&c, par(1, 1, 1, 1), &[vec![s.clone()]]);
    let tok = 30_000;
    let per_layer = c.linear_fwd_ps(LinearPart::PreAttn, tok)
        + c.linear_fwd_ps(LinearPart::PostAttn, tok)
        + c.linear_bwd_ps(LinearPart::PreAttn, tok)
        + c.linear_bwd_ps(LinearPart::PostAttn, tok)
        + c.attn_fwd_ps([30_000], 32)
        + c.attn_bwd_ps([30_000], 32);
    let want = 48 * per_layer + 3 * c.lm_head_fwd_ps(tok);
    assert_eq!(t.makespan, want);
    assert_eq!(compute_busy(&sg, &t, 0), want);
    assert_eq!(sg.graph.collectives(), 0);
    assert_eq!(sg.tokens, 30_000);
}

/// Identical sequences everywhere: no rank ever waits at a collective.
#[test]
fn balanced_batch_never_waits() {
    let c = qwen();
    let s = seq(&[4096, 8192, 4096], 16_384);
    let batch = vec![vec![s.clone(), s.clone()], vec![s.clone(), s.clone()]];
    let (sg, t) = go(&c, par(2, 1, 4, 2), &batch);
    let mut colls = 0;
    for (i, op) in sg.graph.ops.iter().enumerate() {
        if let OpKind::Coll(cid) = op.kind() {
            colls += 1;
            assert_eq!(t.start[i], t.coll_start[cid as usize], "op {i} waited");
        }
    }
    // 2 a2a fwd + 2 bwd per layer, per GPU, per micro-batch, plus the DP all-reduce part.
    assert_eq!(colls, 8 * (48 * 4 * 2 + 1));
    // A skewed batch: replica 1 carries one long document and waits less than replica 0.
    let heavy = seq(&[16_384], 16_384);
    let skew = vec![vec![s.clone(), s.clone()], vec![heavy.clone(), s.clone()]];
    let (sg2, t2) = go(&c, par(2, 1, 4, 2), &skew);
    let wait = |gpu: u32| -> Ps {
        sg2.graph
            .stream_ops(4 * gpu + 3)
            .iter()
            .map(|&o| {
                t2.coll_start[match sg2.graph.ops[o as usize].kind() {
                    OpKind::Coll(c) => c as usize,
                    _ => unreachable!(),
                }] - t2.start[o as usize]
            })
            .sum()
    };
    let busy0 = compute_busy(&sg2, &t2, 0);
    let busy4 = compute_busy(&sg2, &t2, 4);
    assert!(busy4 > busy0);
    // Replica 0 (GPUs 0..4) waits at the all-reduce for exactly the compute it lacks
    // (up to the a2a and rounding differences of the two replicas' timelines).
    assert!(wait(0) > 0 && wait(4) == 0, "{} {}", wait(0), wait(4));
    let diff = (busy4 - busy0) as f64;
    assert!(
        (wait(0) as f64 - diff).abs() / diff < 0.05,
        "wait {} vs compute gap {diff}",
        wait(0)
    );
}

/// Doubling DP at a fixed global batch halves each replica's work.
#[test]
fn doubling_dp_halves_per_replica_work() {
    let c = qwen();
    let seqs: Vec<PackedSeq> = (0..8)
        .map(|i| seq(&[1000 * (i + 1), 2000], 16_384))
        .collect();
    let (sg1, t1) = go(&c, par(1, 1, 2, 8), std::slice::from_ref(&seqs));
    let halves = vec![
        seqs.iter().step_by(2).cloned().collect::<Vec<_>>(),
        seqs.iter().skip(1).step_by(2).cloned().collect(),
    ];
    let (sg2, t2) = go(&c, par(2, 1, 2, 4), &halves);
    let w1: Ps = (0..2).map(|g| compute_busy(&sg1, &t1, g)).sum();
    let w2a: Ps = (0..2).map(|g| compute_busy(&sg2, &t2, g)).sum();
    let w2b: Ps = (2..4).map(|g| compute_busy(&sg2, &t2, g)).sum();
    // Work is conserved and split between the replicas by their sequences.
    assert!(
        (w2a + w2b).abs_diff(w1) <= 2 * 48 * 8 * 10,
        "{} + {} vs {}",
        w2a,
        w2b,
        w1
    );
    let half = w1 as f64 / 2.0;
    assert!((w2a as f64 - half).abs() / half < 0.15 && (w2b as f64 - half).abs() / half < 0.15);
    // Identical sequences: exactly half.
    let same: Vec<PackedSeq> = (0..8).map(|_| seq(&[5000, 3000], 8192)).collect();
    let (s1, u1) = go(&c, par(1, 1, 2, 8), std::slice::from_ref(&same));
    let (s2, u2) = go(
        &c,
        par(2, 1, 2, 4),
        &[same[..4].to_vec(), same[4..].to_vec()],
    );
    assert_eq!(compute_busy(&s1, &u1, 0), 2 * compute_busy(&s2, &u2, 0));
    assert_eq!(compute_busy(&s2, &u2, 0), compute_busy(&s2, &u2, 2));
}

#[test]
fn all_to_all_bytes_by_hand() {
    let c = qwen();
    // CP = 16 over two nodes: each rank sends Q (2 heads) + K,V (1 KV head) for its 1024
    // tokens to each peer: 7 peers in its node, 8 across.
    let (sg, _) = go(&c, par(1, 1, 16, 1), &[vec![seq(&[16_384], 16_384)]]);
    let pair = 1024 * 2 * 128 * 2 + 2 * 1024 * 128 * 2;
    let x = sg.graph.coll_xfers(0);
    assert_eq!(x.len(), 32);
    assert_eq!(
        x[0],
        Xfer {
            src: 0,
            dst: 1,
            bytes: 7 * pair
        }
    );
    assert_eq!(
        x[1],
        Xfer {
            src: 0,
            dst: 8,
            bytes: 8 * pair
        }
    );
    // Destinations are permutations: no NIC or NVLink port receives two aggregates.
    let mut inter: Vec<u32> = x
        .iter()
        .filter(|t| t.src / 8 != t.dst / 8)
        .map(|t| t.dst)
        .collect();
    let mut intra: Vec<u32> = x
        .iter()
        .filter(|t| t.src / 8 == t.dst / 8)
        .map(|t| t.dst)
        .collect();
    inter.sort_unstable();
    intra.sort_unstable();
    assert_eq!(inter, (0..16).collect::<Vec<_>>());
    assert_eq!(intra, (0..16).collect::<Vec<_>>());
    // The output all-to-all carries Q-sized blocks.
    assert_eq!(sg.graph.coll_xfers(1)[0].bytes, 7 * 1024 * 2 * 128 * 2);
}

#[test]
fn pipeline_stage_waits_for_activations() {
    let c = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
    let s = seq(&[8192], 8192);
    let mut p = par(1, 2, 1, 2);
    p.pipeline = PipelineKind::Gpipe;
    let (sg, t) = go(&c, p, &[vec![s.clone(), s.clone()]]);
    // DP × CP = 1 fills no node, so stage 1 is GPU 1; it starts when GPU 0's first send lands.
    let sends: Vec<usize> = sg.graph.stream_ops(2).iter().map(|&o| o as usize).collect();
    let first1 = sg.graph.stream_ops(4)[0] as usize;
    assert_eq!(t.start[first1], t.end[sends[0]]);
    // The send moved 8192 tokens × 4096 × 2 bytes over NVLink: 5 µs + 64 MiB / 450 GB/s.
    let dur = t.end[sends[0]] - t.start[sends[0]];
    assert_eq!(
        dur,
        5_000_000 + (8192.0 * 4096.0 * 2.0 / 450e9 * 1e12_f64).round() as Ps
    );
    // Bubble: stage 1 idles while stage 0 runs its first forward.
    assert!(t.makespan > compute_busy(&sg, &t, 0) && t.makespan > compute_busy(&sg, &t, 1));
}

#[test]
fn bucketed_allreduce_overlaps_backward() {
    let c = qwen();
    let s = seq(&[8192], 8192);
    let batch = vec![vec![s.clone()], vec![s.clone()]];
    let (_, t1) = go(&c, par(2, 1, 1, 1), &batch);
    let mut p = par(2, 1, 1, 1);
    p.dp_buckets = 4;
    let (_, t4) = go(&c, p, &batch);
    assert!(
        t4.makespan < t1.makespan,
        "{} !< {}",
        t4.makespan,
        t1.makespan
    );
}

#[test]
fn wrong_batch_shapes_are_rejected() {
    let c = qwen();
    let map = RankMap::new(par(2, 1, 1, 1), Placement::new(8, 1), "t").unwrap();
    let e = build_step(&c, map, &[vec![seq(&[10], 10)]], 0, &NoVariance).unwrap_err();
    assert!(e.to_string().contains("dp = 2"), "{e}");
    let map = RankMap::new(par(1, 1, 3, 1), Placement::new(8, 1), "t").unwrap();
    assert!(build_step(&c, map, &[vec![seq(&[10], 12)]], 0, &NoVariance).is_err());
}

/// The variance seam: a persistent slow GPU and a per-(layer, op) kernel factor reach the
/// op durations, and the slow GPU's CP peers wait for it at every all-to-all.
#[test]
fn runtime_variance_reaches_every_kernel() {
    struct Var;
    impl crate::schedule::RuntimeVariance for Var {
        fn kernel_factor(&self, _gpu: u32, step: u64, layer: u32, op: OpClass, _mb: u32) -> f64 {
            if step == 7 && layer == 0 && op == OpClass::AttnFwd {
                2.0
            } else {
                1.0
            }
        }
        fn persistent_factor(&self, gpu: u32) -> f64 {
            if gpu == 5 {
                1.25
            } else {
                1.0
            }
        }
    }
    let c = qwen();
    let s = seq(&[8192, 8192], 16_384);
    let batch = vec![vec![s.clone()], vec![s.clone()]];
    let map = RankMap::new(par(2, 1, 4, 1), Placement::new(8, 1), "t").unwrap();
    let sg = build_step(&c, map, &batch, 7, &Var).unwrap();
    let t = run(&sg.graph, &mut StubNet::dgx_h200()).unwrap();
    let attn = c.attn_fwd_ps([8192, 8192], 8);
    let dur = |gpu: u32, class: OpClass, layer: u16| -> Ps {
        sg.graph
            .stream_ops(4 * gpu)
            .iter()
            .map(|&o| o as usize)
            .find(|&o| {
                sg.graph.ops[o].label().class == class && sg.graph.ops[o].label().layer == layer
            })
            .map(|o| t.end[o] - t.start[o])
            .unwrap()
    };
    assert_eq!(dur(0, OpClass::AttnFwd, 0), 2 * attn);
    assert_eq!(dur(0, OpClass::AttnFwd, 1), attn);
    assert_eq!(
        dur(5, OpClass::AttnFwd, 1),
        (attn as f64 * 1.25).round() as Ps
    );
    // GPU 4 (same CP group as 5) waits at the all-to-all after attention; GPU 0 does not.
    let waited = |gpu: u32| -> Ps {
        sg.graph
            .stream_ops(4 * gpu + 1)
            .iter()
            .map(|&o| {
                let OpKind::Coll(cid) = sg.graph.ops[o as usize].kind() else {
                    return 0;
                };
                t.coll_start[cid as usize] - t.start[o as usize]
            })
            .sum()
    };
    assert!(
        waited(4) > 0 && waited(0) == 0,
        "{} {}",
        waited(4),
        waited(0)
    );
}

/// The gradient all-reduce: a ring over the stage's DP × CP ranks, each sending
/// 2(n−1)/n of its bucket to the next; buckets split the stage's fp32 gradients.
#[test]
fn ring_allreduce_bytes_by_hand() {
    let c = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
    let mut p = par(2, 1, 2, 1);
    p.dp_buckets = 2;
    let s = seq(&[1000], 1024);
    let (sg, _) = go(&c, p, &[vec![s.clone()], vec![s.clone()]]);
    let n = sg.graph.collectives();
    let total = 4 * c.model.total_params();
    let (b0, b1) = (total.div_ceil(2), total / 2);
    for (k, b) in [(n - 2, b0), (n - 1, b1)] {
        let x = sg.graph.coll_xfers(k as u32);
        assert_eq!(x.len(), 4);
        for (i, t) in x.iter().enumerate() {
            assert_eq!((t.src, t.dst), (i as u32, ((i + 1) % 4) as u32));
            assert_eq!(t.bytes, (2 * 3 * b).div_ceil(4));
        }
    }
}

/// The cluster's VarianceModel through the seam: no variance reproduces the nominal
/// timeline exactly; the calibrated default perturbs it deterministically, and every
/// micro-batch of a layer gets its own draw.
#[test]
fn cluster_variance_model_plugs_into_the_seam() {
    use crate::cluster::{VarianceModel, VarianceSpec};
    let c = qwen();
    let s = seq(&[4096, 4096], 8192);
    let batch = vec![vec![s.clone(), s.clone()], vec![s.clone(), s.clone()]];
    let map = RankMap::new(par(2, 1, 2, 2), Placement::new(8, 1), "t").unwrap();
    let time = |v: &dyn crate::schedule::RuntimeVariance| {
        let sg = build_step(&c, map, &batch, 3, v).unwrap();
        let t = run(&sg.graph, &mut StubNet::dgx_h200()).unwrap();
        (sg, t)
    };
    let (_, nominal) = time(&NoVariance);
    let (_, none) = time(&VarianceModel::new(VarianceSpec::none(), 1, 4));
    assert_eq!(nominal, none);
    let vm = VarianceModel::new(VarianceSpec::default(), 1, 4);
    let (sg, a) = time(&vm);
    let (_, b) = time(&vm);
    assert_eq!(a, b);
    assert_ne!(a.makespan, nominal.makespan);
    // Attention forward of layer 5, micro-batches 0 and 1, on GPU 0: different draws.
    let d: Vec<Ps> = sg
        .graph
        .stream_ops(0)
        .iter()
        .map(|&o| o as usize)
        .filter(|&o| {
            sg.graph.ops[o].label().class == OpClass::AttnFwd && sg.graph.ops[o].label().layer == 5
        })
        .map(|o| a.end[o] - a.start[o])
        .collect();
    assert_eq!(d.len(), 2);
    assert_ne!(d[0], d[1]);
}

/// Across nodes the ring all-reduce runs one channel per GPU of a node: 1/g of each
/// GPU's ring traffic leaves through its own NIC to the same position in the next node.
#[test]
fn ring_allreduce_across_nodes_uses_every_nic() {
    let c = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
    let s = seq(&[1000], 1024);
    // DP 4 x CP 4 = 16 GPUs on 2 nodes of 8.
    let (sg, _) = go(&c, par(4, 1, 4, 1), &vec![vec![s.clone()]; 4]);
    let n = sg.graph.collectives();
    let x = sg.graph.coll_xfers(n as u32 - 1);
    let total = 4 * c.model.total_params();
    let per = (2 * 15 * total).div_ceil(16);
    let inter = per.div_ceil(8);
    assert_eq!(x.len(), 32);
    for src in 0..16u32 {
        let mine: Vec<_> = x.iter().filter(|t| t.src == src).collect();
        assert_eq!(mine.len(), 2);
        assert_eq!(
            *mine[0],
            Xfer {
                src,
                dst: (src / 8) * 8 + (src % 8 + 1) % 8,
                bytes: per - inter
            }
        );
        assert_eq!(
            *mine[1],
            Xfer {
                src,
                dst: (src + 8) % 16,
                bytes: inter
            }
        );
    }
}

#[test]
fn ticks_run_every_stage_in_the_tick_order_and_count_in_flight() {
    // PP 2, GA 3 under ticks: each stage's compute stream runs its slots in pp_ticks order
    // (stage 0: F0 F1 F2 B0 B1 B2 — its first backward waits for stage 1's, two ticks
    // later; stage 1: F0 B0 F1 B1 F2 B2), and the same batch under
    // 1F1B trains the same work; 4 layers (PP must divide them).
    let mut m = ModelConfig::builtin("llama3-8b").unwrap();
    m.layers = 4;
    let c = CostModel::h200(m).unwrap();
    let s = seq(&[4096; 2], 8192);
    let batch = vec![vec![s.clone(), s.clone(), s.clone()]];
    let mut p = par(1, 2, 1, 3);
    p.pipeline = PipelineKind::Ticks;
    assert_eq!(
        stage_order(PipelineKind::Ticks, 2, 0, 3),
        vec![
            (true, 0),
            (true, 1),
            (true, 2),
            (false, 0),
            (false, 1),
            (false, 2)
        ]
    );
    assert_eq!(
        stage_order(PipelineKind::Ticks, 2, 1, 3),
        vec![
            (true, 0),
            (false, 0),
            (true, 1),
            (false, 1),
            (true, 2),
            (false, 2)
        ]
    );
    assert_eq!(in_flight(PipelineKind::Ticks, 2, 0, 3), 3);
    assert_eq!(in_flight(PipelineKind::Ticks, 2, 1, 3), 1);
    let (sg, t) = go(&c, p, &batch);
    for gpu in 0..2u32 {
        // The micro-batch order of the stage's linear ops follows its tick order.
        let mut seen: Vec<(bool, u16)> = Vec::new();
        for &o in sg.graph.stream_ops(4 * gpu) {
            let l = sg.graph.ops[o as usize].label();
            let fwd = match l.class {
                OpClass::LinearFwd | OpClass::HeadFwd => true,
                OpClass::LinearBwd | OpClass::HeadBwd => false,
                _ => continue,
            };
            if seen.last() != Some(&(fwd, l.mb)) {
                seen.push((fwd, l.mb));
            }
        }
        let want: Vec<(bool, u16)> = stage_order(PipelineKind::Ticks, 2, gpu, 3)
            .into_iter()
            .map(|(f, mb)| (f, mb as u16))
            .collect();
        assert_eq!(seen, want, "stage {gpu}");
    }
    p.pipeline = PipelineKind::OneFOneB;
    let (sg1, t1) = go(&c, p, &batch);
    assert_eq!(sg.tokens, sg1.tokens);
    assert_eq!(compute_busy(&sg, &t, 0), compute_busy(&sg1, &t1, 0));
    // A layer count PP does not divide is refused under ticks, naming both.
    let mut m5 = ModelConfig::builtin("llama3-8b").unwrap();
    m5.layers = 5;
    let c5 = CostModel::h200(m5).unwrap();
    let mut p5 = par(1, 2, 1, 3);
    p5.pipeline = PipelineKind::Ticks;
    let map = RankMap::new(p5, Placement::new(8, 1), "t").unwrap();
    let e = build_step(&c5, map, &batch, 0, &NoVariance)
        .unwrap_err()
        .to_string();
    assert!(e.contains("5 layers") && e.contains("pp"), "{e}");
}

/// The collectives whose ops on `gpu` have class `class`, in issue order (one per op).
fn colls_of(sg: &StepGraph, gpu: u32, class: OpClass) -> Vec<(OpLabel, Vec<Xfer>)> {
    let spg = sg.streams_per_gpu;
    (spg * gpu..spg * (gpu + 1))
        .flat_map(|s| sg.graph.stream_ops(s).to_vec())
        .filter_map(|o| {
            let op = &sg.graph.ops[o as usize];
            match op.kind() {
                OpKind::Coll(c) if op.label().class == class => {
                    Some((op.label(), sg.graph.coll_xfers(c).to_vec()))
                }
                _ => None,
            }
        })
        .collect()
}

#[test]
fn tp_all_gather_and_reduce_scatter_bytes_by_hand() {
    // llama3-8b, TP 4 with sequence parallelism, one 8192-token sequence on one rank: per
    // layer an all-gather before QKV, a reduce-scatter after the O projection and an
    // all-gather + reduce-scatter around the MLP; each ring step sends (TP−1)/TP of the
    // activation 8192 · 4096 · 2 bytes to the next rank of the node.
    let c = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
    let p = Parallelism {
        tp: 4,
        ..par(1, 1, 1, 1)
    };
    let (sg, t) = go(&c, p, &[vec![seq(&[8192], 8192)]]);
    assert_eq!(sg.streams_per_gpu, 5);
    let act = 8192 * 4096 * 2u64;
    let tp = colls_of(&sg, 0, OpClass::TpComm);
    // 32 layers × 4 forward + the LM head's all-gather, and as many backward.
    assert_eq!(tp.len(), 2 * (32 * 4 + 1));
    for (_, x) in &tp {
        assert_eq!(x.len(), 4);
        for (k, xf) in x.iter().enumerate() {
            assert_eq!(xf.bytes, 3 * act / 4);
            assert_eq!((xf.src, xf.dst), (k as u32, (k as u32 + 1) % 4));
        }
    }
    // An all-gather plus a reduce-scatter moves 2·(TP−1)/TP of the activation per rank.
    assert_eq!(tp[0].1[0].bytes + tp[1].1[0].bytes, 2 * 3 * act / 4);
    // Every TP rank computes a quarter of the linear FLOPs: the same busy time on each.
    let busy: Vec<Ps> = (0..4).map(|g| compute_busy(&sg, &t, g)).collect();
    assert!(busy.iter().all(|&b| b == busy[0]), "{busy:?}");
    // Without SP: two all-reduces per layer of 2·(TP−1)/TP of the activation, and no
    // gather before the head.
    let (sg, _) = go(
        &c,
        Parallelism { sp: false, ..p },
        &[vec![seq(&[8192], 8192)]],
    );
    let ar = colls_of(&sg, 0, OpClass::TpComm);
    assert_eq!(ar.len(), 2 * 32 * 2);
    assert!(ar.iter().all(|(_, x)| x[0].bytes == 2 * 3 * act / 4));
}

#[test]
fn tp_splits_linear_work_and_memory() {
    // TP 8: each rank's compute is the eighth of the linear GEMMs plus its norms on 1/8
    // of the tokens; attention on 4 of 32 heads. Memory per rank far below TP 1's.
    let c = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
    let batch = [vec![seq(&[16_384], 16_384)]];
    let (s1, t1) = go(&c, par(1, 1, 1, 1), &batch);
    let (s8, t8) = go(
        &c,
        Parallelism {
            tp: 8,
            ..par(1, 1, 1, 1)
        },
        &batch,
    );
    let (b1, b8) = (compute_busy(&s1, &t1, 0), compute_busy(&s8, &t8, 0));
    let r = b1 as f64 / b8 as f64;
    assert!(r > 7.0 && r < 8.5, "{r}");
    let (m1, m8) = (s1.memory[0].total(), s8.memory[0].total());
    assert!(m8 * 6 < m1, "{m1} {m8}");
    assert!(t8.makespan < t1.makespan);
}

#[test]
fn ep_all_to_all_bytes_per_token_by_hand() {
    // Qwen3-30B-A3B at CP 8, EP 8, one 8192-token sequence: each rank's 1024 tokens send
    // 8 (top-k) copies of their hidden state (2048 · 2 bytes) per MoE layer, 1/8 of them
    // to each EP peer: 7 same-node peers in one NVLink aggregate.
    let c = qwen();
    let p = Parallelism {
        ep: 8,
        ..par(1, 1, 8, 1)
    };
    let (sg, _) = go(&c, p, &[vec![seq(&[8192], 8192)]]);
    let ep = colls_of(&sg, 0, OpClass::EpA2a);
    // Dispatch and combine per layer, forward and backward.
    assert_eq!(ep.len(), 4 * 48);
    let per_peer = 1024 * 8 / 8 * 2048 * 2u64;
    for (_, x) in &ep {
        assert_eq!(x[0].bytes, 7 * per_peer);
    }
    // Per token: top-k · hidden · dtype · (EP−1)/EP leave the rank in each direction.
    assert_eq!(7 * per_peer, 1024 * 8 * 2048 * 2 * 7 / 8);
    // Expert gradients are reduced over the expert-data-parallel groups (one rank each
    // here: nothing), dense gradients over DP × CP.
    let dp = colls_of(&sg, 0, OpClass::DpAllReduce);
    assert_eq!(dp.len(), 1);
    let m = &c.model;
    let dense = crate::cost::memory::stage_grad_bytes(m, 48, true, true)
        - crate::cost::memory::stage_expert_params(m, 48) * 4;
    assert_eq!(dp[0].1[0].bytes, (2 * 7 * dense).div_ceil(8));
}

#[test]
fn shared_experts_under_tp_and_ep_add_their_gather_and_scatter_by_hand() {
    // Qwen3-30B-A3B with one shared expert (intermediate 2048) at TP 2 (SP), EP 2, one
    // 8192-token sequence. Megatron's shared experts are a TP-split dense MLP: per layer,
    // after the routed experts' combine, an all-gather of the TP group's activation, the
    // shared MLP and a reduce-scatter, on top of the attention block's all-gather and
    // reduce-scatter. Each ring step of TP 2 sends (TP−1)/TP = 1/2 of the activation
    // 8192 · 2048 · 2 bytes to the other rank.
    let text = include_str!("../../../models/qwen3-30b-a3b.toml").replace(
        "shared_experts = 0\nshared_expert_intermediate = 0",
        "shared_experts = 1\nshared_expert_intermediate = 2048",
    );
    let shared = CostModel::h200(ModelConfig::from_toml_str(&text, "q.toml").unwrap()).unwrap();
    let p = Parallelism {
        tp: 2,
        ep: 2,
        ..par(1, 1, 1, 1)
    };
    let batch = [vec![seq(&[8192], 8192)]];
    let act = 8192 * 2048 * 2u64;
    let (sg, t) = go(&shared, p, &batch);
    let tp = colls_of(&sg, 0, OpClass::TpComm);
    // 48 layers × (2 + 2) forward + the LM head's all-gather, and as many backward.
    assert_eq!(tp.len(), 2 * (48 * 4 + 1));
    for (_, x) in &tp {
        assert_eq!(x.len(), 2);
        assert!(x.iter().all(|xf| xf.bytes == act / 2), "{x:?}");
    }
    // Without shared experts: only the attention block's pair per layer.
    let (sg0, t0) = go(&qwen(), p, &batch);
    assert_eq!(colls_of(&sg0, 0, OpClass::TpComm).len(), 2 * (48 * 2 + 1));
    // The shared experts' GEMMs add the TP rank's half of them per layer: three matrices
    // of 2048 × 1024 over 8192 tokens at the GEMM rate, forward once and backward twice.
    let extra = compute_busy(&sg, &t, 0) - compute_busy(&sg0, &t0, 0);
    let rate = shared.hw.peak_tflops * shared.hw.gemm_efficiency;
    let fwd = (2.0 * 8192.0 * 3.0 * 2048.0 * 1024.0 / rate).round() as Ps;
    assert_eq!(extra, 48 * 3 * fwd);
}

#[test]
fn bad_tp_and_ep_layouts_are_named() {
    let c = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
    let q = qwen();
    let one = [vec![seq(&[8192], 8192)]];
    let two = [one[0].clone(), one[0].clone()];
    let fail = |cost: &CostModel, p: Parallelism, batch: &[Vec<PackedSeq>]| {
        let map = RankMap::new(p, Placement::new(8, 8), "t").unwrap();
        build_step(cost, map, batch, 0, &NoVariance)
            .unwrap_err()
            .to_string()
    };
    let e = fail(
        &c,
        Parallelism {
            ep: 2,
            tp: 2,
            ..par(1, 1, 1, 1)
        },
        &one,
    );
    assert!(
        e.contains("ep") && e.contains("dense model llama3-8b"),
        "{e}"
    );
    let e = fail(
        &q,
        Parallelism {
            ep: 2,
            tp: 2,
            sp: false,
            ..par(1, 1, 1, 1)
        },
        &one,
    );
    assert!(
        e.contains("sp") && e.contains("sequence parallelism"),
        "{e}"
    );
    let e = fail(
        &q,
        Parallelism {
            ep: 4,
            ..par(2, 1, 2, 1)
        },
        &two,
    );
    assert!(e.contains("TP × CP = 2"), "{e}");
    // EP must divide the experts (qwen3-30b-a3b: 128; EP 3 lies inside TP × CP = 3).
    let e = fail(
        &q,
        Parallelism {
            ep: 3,
            ..par(1, 1, 3, 1)
        },
        &one,
    );
    assert!(
        e.contains("ep") && e.contains("a divisor of qwen3-30b-a3b's 128 experts"),
        "{e}"
    );
    // TP larger than a node's NVLink domain, and a layout larger than the cluster.
    let refused = |p: Parallelism| {
        RankMap::new(p, Placement::new(8, 8), "t")
            .unwrap_err()
            .to_string()
    };
    let e = refused(Parallelism {
        tp: 16,
        ..par(1, 1, 1, 1)
    });
    assert!(e.contains("tp") && e.contains("NVLink domain"), "{e}");
    let e = refused(Parallelism {
        tp: 8,
        ..par(4, 2, 2, 1)
    });
    assert!(
        e.contains("tp × cp × dp × pp") && e.contains("at most the cluster's 64 GPUs"),
        "{e}"
    );
}

#[test]
fn tp_comm_overlap_hides_collectives_under_gemms() {
    // With tp-comm-overlap each TP collective runs beside its GEMM: the step is faster,
    // no faster than its compute alone, and the compute is unchanged.
    let c = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
    let p = Parallelism {
        tp: 8,
        ..par(1, 1, 1, 2)
    };
    let batch = [vec![seq(&[16_384], 16_384), seq(&[4096; 4], 16_384)]];
    let (s0, t0) = go(&c, p, &batch);
    let (s1, t1) = go(
        &c,
        Parallelism {
            tp_overlap: true,
            ..p
        },
        &batch,
    );
    let (b0, b1) = (compute_busy(&s0, &t0, 0), compute_busy(&s1, &t1, 0));
    assert_eq!(b0, b1);
    assert!(t1.makespan < t0.makespan, "{} {}", t1.makespan, t0.makespan);
    assert!(t1.makespan >= b1);
}

#[test]
fn routing_skew_loads_the_hot_experts_rank_by_hand() {
    // Qwen3 (128 experts, top-8) at CP 8, EP 8, one 8192-token sequence: each rank routes
    // 1024 · 8 = 8192 copies. With half of them to expert 0 (rank 0), rank 0's experts get
    // 0.5 + 15 · 0.5/127 = 0.55906 of the group's 65536 copies (36638; 4580 of its own),
    // a cold rank's 16 · 0.5/127 = 0.06299 (4128; 516 its own).
    let c = qwen();
    let p = Parallelism {
        ep: 8,
        moe_hot_share: 0.5,
        ..par(1, 1, 8, 1)
    };
    let batch = [vec![seq(&[8192], 8192)]];
    let (sg, t) = go(&c, p, &batch);
    let ep = colls_of(&sg, 0, OpClass::EpA2a);
    let x = &ep[0].1;
    let copy = 2048 * 2u64;
    // Rank 0's port: ingress 36638 − 4580 = 32058 copies, over 7 peers; rank 1's: egress
    // 8192 − 516 = 7676.
    assert_eq!(x[0].bytes, 7 * 32_058u64.div_ceil(7) * copy);
    assert_eq!(x[1].bytes, 7 * 7676u64.div_ceil(7) * copy);
    assert!(compute_busy(&sg, &t, 0) > compute_busy(&sg, &t, 1));
    let (_, uniform) = go(
        &c,
        Parallelism {
            moe_hot_share: 0.0,
            ..p
        },
        &batch,
    );
    assert!(t.makespan > uniform.makespan);
    for bad in [0.001, 1.5, f64::NAN] {
        let e = build_step(
            &c,
            RankMap::new(
                Parallelism {
                    moe_hot_share: bad,
                    ..p
                },
                Placement::new(8, 64),
                "t",
            )
            .unwrap(),
            &batch,
            0,
            &NoVariance,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("moe_hot_share"), "{e}");
    }
}

/// Emitted in parts (any number, on any number of threads), a step's graph is the one a
/// single emitter over every replica builds, op for op: under each pipeline kind, with
/// buckets, recomputation, TP chains, EP with routing skew, and variance with a fault.
#[test]
fn parts_build_the_graph_of_one_emitter() {
    use crate::cluster::{VarianceModel, VarianceSpec};
    let c = qwen();
    let mut batch: Vec<Vec<PackedSeq>> = Vec::new();
    for r in 0..5u32 {
        batch.push(
            (0..4u32)
                .map(|m| seq(&[1024 + 512 * r, 2048 + 256 * m, 300 * (r + m + 1)], 8192))
                .collect(),
        );
    }
    let faults = crate::cluster::faults::Faults {
        gpu: vec![crate::cluster::faults::GpuFault {
            gpu: 3,
            slowdown: 1.5,
            from_step: 0,
            to_step: 9,
        }],
        link: Vec::new(),
    };
    let mut layouts = Vec::new();
    for kind in [
        PipelineKind::OneFOneB,
        PipelineKind::Gpipe,
        PipelineKind::Ticks,
    ] {
        layouts.push(Parallelism {
            pipeline: kind,
            recompute: true,
            dp_buckets: 3,
            ..par(5, 2, 2, 4)
        });
    }
    layouts.push(Parallelism {
        tp: 2,
        ep: 2,
        moe_hot_share: 0.5,
        tp_overlap: true,
        ..par(5, 2, 2, 4)
    });
    layouts.push(Parallelism {
        tp: 2,
        sp: false,
        ..par(5, 1, 1, 4)
    });
    for p in layouts {
        let map = RankMap::new(p, Placement::new(8, 8), "t").unwrap();
        let var =
            VarianceModel::new(VarianceSpec::default(), 7, map.gpus()).with_faults(faults.clone());
        let env = StepEnv {
            map,
            var: &var,
            step: 2,
        };
        let mut u = UlyssesAttention::new(&c, map, &batch).unwrap();
        let whole = build_step_with(&c, map, &batch, 2, &var, &mut u).unwrap();
        for n in [1, 2, 3, 5, 64] {
            let sg = build_parts(&c, env, &batch, n).unwrap();
            assert!(sg.graph == whole.graph, "{n} parts under {p:?}");
        }
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let sg = pool
                .install(|| build_step(&c, map, &batch, 2, &var))
                .unwrap();
            assert!(sg.graph == whole.graph, "{threads} threads under {p:?}");
            assert_eq!(sg.memory, whole.memory);
        }
    }
}

/// Timed part by part, a step gives the whole graph's report and trace, to the
/// picosecond: under each pipeline kind, GA, buckets, recomputation, TP chains, EP with
/// routing skew, variance with a slow GPU, and degraded links on a fabric of two spines
/// (where a transfer's ECMP tag picks its route), in any number of parts.
#[test]
fn parts_timed_apart_give_the_whole_steps_report_and_trace() {
    use crate::cluster::{TopologySpec, VarianceModel, VarianceSpec};
    use crate::net::{AnalyticalModel, NetworkModel};
    use crate::report::step::step_report;
    use crate::report::trace::chrome_trace;
    use rand::Rng;
    let topo = std::sync::Arc::new(
        TopologySpec::parse(include_str!("../../../topologies/test-small.toml"), "t")
            .unwrap()
            .build(None)
            .unwrap(),
    );
    let c = qwen();
    let faults = crate::cluster::faults::Faults {
        gpu: vec![crate::cluster::faults::GpuFault {
            gpu: 3,
            slowdown: 1.5,
            from_step: 0,
            to_step: 9,
        }],
        link: Vec::new(),
    };
    let kinds = [
        PipelineKind::OneFOneB,
        PipelineKind::Gpipe,
        PipelineKind::Ticks,
    ];
    let mut checked = 0;
    for seed in 0..12u64 {
        let mut rng = crate::rng::stream(seed, "step-parts-differential", 0);
        let pp = [1, 2][rng.random_range(0..2)];
        let (tp, ep) = [(1, 1), (2, 1), (2, 2), (1, 2)][rng.random_range(0..4)];
        let cp = if ep > tp {
            2
        } else {
            [1, 2][rng.random_range(0..2)]
        };
        // Every GPU of both leaves: DP all-reduces (PP 1) or pipeline sends (PP 2) cross
        // the spines.
        let dp = 16 / (pp * tp * cp);
        let ga = rng.random_range(1..5);
        let p = Parallelism {
            pipeline: kinds[rng.random_range(0..3)],
            recompute: rng.random_range(0..2) == 1,
            dp_buckets: rng.random_range(1..5),
            tp,
            ep,
            sp: tp == 1 || ep > 1 || rng.random_range(0..2) == 1,
            tp_overlap: tp > 1 && rng.random_range(0..2) == 1,
            moe_hot_share: if ep > 1 { 0.5 } else { 0.0 },
            ..par(dp, pp, cp, ga)
        };
        let batch: Vec<Vec<PackedSeq>> = (0..dp)
            .map(|r| {
                (0..ga)
                    .map(|m| seq(&[512 + 256 * r, 1024 + 128 * m, 100 * (r + m + 1)], 4096))
                    .collect()
            })
            .collect();
        let map = RankMap::new(p, Placement::new(4, 4), "t").unwrap();
        let var = VarianceModel::new(VarianceSpec::default(), seed, map.gpus())
            .with_faults(faults.clone());
        let mut net = AnalyticalModel::new(topo.clone());
        let spine: Vec<u32> = (0..topo.links.len() as u32)
            .filter(|&l| topo.links[l as usize].kind == crate::cluster::LinkKind::LeafSpine)
            .collect();
        for _ in 0..rng.random_range(1..4) {
            let l = spine[rng.random_range(0..spine.len())];
            net.set_link_scale(0, l, rng.random_range(0.05..0.5));
        }
        let sg = build_step(&c, map, &batch, 1, &var).unwrap();
        let t = crate::engine::run(&sg.graph, &mut net).unwrap();
        let whole = StepRun {
            report: step_report(&sg, &t, &c, 1),
            trace: Some(chrome_trace(&sg, &t, 5)),
        };
        let env = StepEnv {
            map,
            var: &var,
            step: 1,
        };
        let d = net.fixed_durations().unwrap();
        for parts in [1, 2, 3, 64] {
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let r = pool
                    .install(|| timed::in_parts(&c, env, &batch, d, Some(5), parts))
                    .unwrap();
                assert_eq!(r, whole, "{parts} parts, {threads} threads under {p:?}");
            }
        }
        checked += 1;
    }
    assert_eq!(checked, 12);
}
