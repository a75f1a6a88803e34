//! Context-parallel communication of a simulated step, hidden or not: per GPU, the time
//! its CP-communication stream moves bytes (a collective part from the moment its
//! transfers start to its end; waiting for peers to arrive is not communication).
//!
//! Owns only this measure (the step report's exposed share is `report::step`'s); no I/O.
//! Libra §8.4 (pool-size sweep) sets this total against the compute and the exposed part.

use crate::engine::{OpKind, StreamKind, Timeline};
use crate::net::Ps;
use crate::schedule::step::StepGraph;

/// Per GPU: the union of the intervals its CP stream moves bytes, ps.
pub fn cp_comm_busy(sg: &StepGraph, t: &Timeline) -> Vec<Ps> {
    let g = &sg.graph;
    let n = sg.map.gpus();
    let mut out = Vec::with_capacity(n as usize);
    let mut iv: Vec<(Ps, Ps)> = Vec::new();
    let xs = g.xfer_starts(t);
    for gpu in 0..n {
        iv.clear();
        let s = sg.streams_per_gpu * gpu + StreamKind::CpComm as u32;
        for &o in g.stream_ops(s) {
            let (st, en) = (t.start[o as usize], t.end[o as usize]);
            let from = match g.ops[o as usize].kind() {
                OpKind::Coll(_) => xs
                    .as_ref()
                    .map_or_else(|| g.xfer_start(t, o), |v| v[o as usize])
                    .max(st),
                _ => st,
            };
            if en > from {
                iv.push((from, en));
            }
        }
        // One stream runs one op at a time, so its intervals are already disjoint.
        out.push(iv.iter().map(|&(a, b)| b - a).sum());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{CostModel, ModelConfig};
    use crate::engine::run;
    use crate::engine::stub_net::StubNet;
    use crate::schedule::step::build_step;
    use crate::schedule::{NoVariance, Parallelism, PipelineKind, Placement, Precision, RankMap};
    use crate::workload::{PackedSeq, Sample};

    #[test]
    fn ulysses_cp_comm_is_its_all_to_alls() {
        // CP = 2 inside one node, one 8192-token document, 1 micro-batch: per layer 2
        // forward + 2 backward all-to-alls, each a single NVLink transfer per GPU.
        let c = CostModel::h200(ModelConfig::builtin("qwen3-30b-a3b").unwrap()).unwrap();
        let par = Parallelism {
            dp: 1,
            pp: 1,
            cp: 2,
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
        let map = RankMap::new(par, Placement::new(8, 1), "t").unwrap();
        let seq = PackedSeq {
            samples: vec![Sample {
                doc: 0,
                offset: 0,
                len: 8192,
                cut: false,
            }],
            capacity: 8192,
        };
        let sg = build_step(&c, map, &[vec![seq]], 0, &NoVariance).unwrap();
        let mut net = StubNet::dgx_h200();
        let t = run(&sg.graph, &mut net).unwrap();
        let a = c.attn();
        // Per rank: 4096 tokens; each sends the peer half its Q/K/V for 16 query heads and
        // 2 KV heads (in) and half its output (out).
        let q = a.q_bytes(4096, 16);
        let inb = q + a.kv_bytes(4096, 2);
        let one = |b: u64| net.duration(0, 1, b);
        let want = 48 * 2 * (one(inb) + one(q));
        let busy = cp_comm_busy(&sg, &t);
        assert_eq!(busy, vec![want, want]);
    }
}
