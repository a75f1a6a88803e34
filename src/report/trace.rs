//! Perfetto / Chrome trace (`trace.json`, the Trace Event Format): one process per node,
//! one thread (track) per GPU stream, one complete ("X") event per op. Timestamps are
//! microseconds printed exactly from integer picoseconds, so equal timelines give
//! byte-identical files. A trace may hold only the first GPUs (a sample of a large run);
//! its `otherData` says which GPUs it holds out of how many.

use crate::engine::{Graph, OpKind, StreamId, StreamKind, Timeline};
use crate::net::Ps;
use crate::schedule::step::StepGraph;
use crate::schedule::RankMap;

fn us(ps: Ps) -> String {
    format!("{}.{:06}", ps / 1_000_000, ps % 1_000_000)
}

/// The trace of the first `max_gpus` GPUs (all when 0) of one step.
pub fn chrome_trace(sg: &StepGraph, t: &Timeline, max_gpus: u32) -> String {
    let g = &sg.graph;
    let spg = sg.streams_per_gpu;
    compose(&sg.map, spg, max_gpus, |gpu, k| {
        let sid = spg * gpu + k;
        let mut ev = Vec::new();
        stream_events(g, t, sid, sg.map.place.node(gpu), sid, &mut ev);
        (g.streams[sid as usize].kind, ev)
    })
}

/// How many GPUs a trace of the first `max_gpus` (all when 0) holds.
pub fn traced_gpus(map: &RankMap, max_gpus: u32) -> u32 {
    if max_gpus == 0 {
        map.gpus()
    } else {
        max_gpus.min(map.gpus())
    }
}

/// The events of stream `s` of `g` timed by `t`, as the trace shows them on track `sid`
/// (the stream's id in the step) of process `node`, appended to `out`.
pub fn stream_events(
    g: &Graph,
    t: &Timeline,
    s: StreamId,
    node: u32,
    sid: u32,
    out: &mut Vec<String>,
) {
    for &o in g.stream_ops(s) {
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
        out.push(format!(
            "{{\"ph\":\"X\",\"name\":\"{}{mb} L{}\",\"pid\":{node},\"tid\":{sid},\"ts\":{},\"dur\":{}{args}}}",
            op.label().class.name(),
            op.label().layer,
            us(st),
            us(en - st)
        ));
    }
}

/// The trace of the first `max_gpus` GPUs (all when 0) of a step laid out by `map` with
/// `spg` streams per GPU: per GPU its node's process, then per stream its track and the
/// events `events(gpu, k)` gives for its k-th stream (the stream's kind and
/// [`stream_events`]).
pub fn compose(
    map: &RankMap,
    spg: u32,
    max_gpus: u32,
    mut events: impl FnMut(u32, u32) -> (StreamKind, Vec<String>),
) -> String {
    let n = traced_gpus(map, max_gpus);
    let mut s = format!(
        "{{\"displayTimeUnit\":\"ns\",\"otherData\":{{\"gpus_traced\":\"0-{}\",\"gpus\":{}}},\"traceEvents\":[\n",
        n.saturating_sub(1),
        map.gpus()
    );
    let mut first = true;
    let mut push = |s: &mut String, e: &str| {
        if !first {
            s.push_str(",\n");
        }
        first = false;
        s.push_str(e);
    };
    let mut last_node = u32::MAX;
    for gpu in 0..n {
        let node = map.place.node(gpu);
        if node != last_node {
            push(&mut s, &format!("{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{node},\"args\":{{\"name\":\"node {node}\"}}}}"));
            last_node = node;
        }
        for k in 0..spg {
            let sid = spg * gpu + k;
            let (kind, ev) = events(gpu, k);
            push(&mut s, &format!(
                "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{node},\"tid\":{sid},\"args\":{{\"name\":\"gpu {gpu} {}\"}}}}",
                kind.name()
            ));
            for e in &ev {
                push(&mut s, e);
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
    use crate::schedule::{NoVariance, Parallelism, PipelineKind, Placement, Precision, RankMap};
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
            precision: Precision::Bf16,
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
