//! Perfetto / Chrome trace (`trace.json`, the Trace Event Format): one process per node,
//! one thread (track) per GPU stream, one complete ("X") event per op. Timestamps are
//! microseconds printed exactly from integer picoseconds, so equal timelines give
//! byte-identical files. A trace may hold only the first GPUs (a sample of a large run);
//! its `otherData` says which GPUs it holds out of how many.

use crate::engine::{OpKind, Timeline};
use crate::net::Ps;
use crate::schedule::step::StepGraph;

fn us(ps: Ps) -> String {
    format!("{}.{:06}", ps / 1_000_000, ps % 1_000_000)
}

/// The trace of the first `max_gpus` GPUs (all when 0) of one step.
pub fn chrome_trace(sg: &StepGraph, t: &Timeline, max_gpus: u32) -> String {
    let g = &sg.graph;
    let n = if max_gpus == 0 {
        sg.map.gpus()
    } else {
        max_gpus.min(sg.map.gpus())
    };
    let mut s = format!(
        "{{\"displayTimeUnit\":\"ns\",\"otherData\":{{\"gpus_traced\":\"0-{}\",\"gpus\":{}}},\"traceEvents\":[\n",
        n.saturating_sub(1),
        sg.map.gpus()
    );
    let mut first = true;
    let mut push = |s: &mut String, e: String| {
        if !first {
            s.push_str(",\n");
        }
        first = false;
        s.push_str(&e);
    };
    let mut last_node = u32::MAX;
    for gpu in 0..n {
        let node = sg.map.place.node(gpu);
        if node != last_node {
            push(&mut s, format!("{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{node},\"args\":{{\"name\":\"node {node}\"}}}}"));
            last_node = node;
        }
        for k in 0..sg.streams_per_gpu {
            let sid = sg.streams_per_gpu * gpu + k;
            let kind = g.streams[sid as usize].kind;
            push(&mut s, format!(
                "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{node},\"tid\":{sid},\"args\":{{\"name\":\"gpu {gpu} {}\"}}}}",
                kind.name()
            ));
            for &o in g.stream_ops(sid) {
                let op = g.ops[o as usize];
                let (st, en) = (t.start[o as usize], t.end[o as usize]);
                let mb = if op.label().mb == u16::MAX {
                    String::new()
                } else {
                    format!(" mb{}", op.label().mb)
                };
                let args = match op.kind() {
                    OpKind::Coll(_) => {
                        format!(",\"args\":{{\"wait_us\":{}}}", us(g.xfer_start(t, o) - st))
                    }
                    _ => String::new(),
                };
                push(&mut s, format!(
                    "{{\"ph\":\"X\",\"name\":\"{}{mb} L{}\",\"pid\":{node},\"tid\":{sid},\"ts\":{},\"dur\":{}{args}}}",
                    op.label().class.name(),
                    op.label().layer,
                    us(st),
                    us(en - st)
                ));
            }
        }
    }
    s.push_str("\n]}\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{CostModel, ModelConfig};
    use crate::engine::run;
    use crate::engine::stub_net::StubNet;
    use crate::schedule::step::build_step;
    use crate::schedule::{NoVariance, Parallelism, PipelineKind, Placement, RankMap};
    use crate::workload::{PackedSeq, Sample};

    #[test]
    fn trace_is_valid_json_with_one_track_per_stream() {
        let cost = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
        let par = Parallelism {
            dp: 1,
            pp: 2,
            cp: 2,
            ga: 2,
            pipeline: PipelineKind::OneFOneB,
            recompute: false,
            zero_stage: 0,
            dp_buckets: 1,
            tp: 1,
            sp: true,
            tp_overlap: false,
            ep: 1,
            moe_hot_share: 0.0,
        };
        let map = RankMap::new(par, Placement::new(2, 2), "t").unwrap();
        let s = PackedSeq {
            samples: vec![Sample {
                doc: 0,
                offset: 0,
                len: 4000,
                cut: false,
            }],
            capacity: 4096,
        };
        let sg = build_step(&cost, map, &[vec![s.clone(), s]], 0, &NoVariance).unwrap();
        let t = run(&sg.graph, &mut StubNet::new(2, 1_000_000, 450e9, 50e9)).unwrap();
        let text = chrome_trace(&sg, &t, 0);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let ev = v["traceEvents"].as_array().unwrap();
        let x = ev.iter().filter(|e| e["ph"] == "X").count();
        assert_eq!(x, sg.graph.ops.len());
        let procs = ev.iter().filter(|e| e["name"] == "process_name").count();
        let threads = ev.iter().filter(|e| e["name"] == "thread_name").count();
        assert_eq!((procs, threads), (2, 16));
        assert_eq!(us(1_234_567), "1.234567");
        assert_eq!(v["otherData"]["gpus_traced"], "0-3");
        // Only the first GPU, and the trace says so.
        let one: serde_json::Value = serde_json::from_str(&chrome_trace(&sg, &t, 1)).unwrap();
        assert_eq!(one["otherData"]["gpus_traced"], "0-0");
        assert_eq!(one["otherData"]["gpus"], 4);
        assert!(one["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["tid"].as_u64().unwrap_or(0) < 4));
    }
}
