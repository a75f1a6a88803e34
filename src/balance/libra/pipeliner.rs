//! The TAP pipeliner's chunking (Libra §6.2–6.3): per worker, the M equal head chunks
//! and, per chunk, what must arrive before it runs (dispatch), what it computes and what
//! it sends back (return).
//!
//! Owns cutting a Plan group's per-worker work into chunks. It may not model time: the
//! engine schedules these lists on separate compute and communication streams in the
//! order [`overlap_stages`] gives, so the overlap is measured by simulation, not assumed.
//!
//! Every unit on a worker has the same head-shard width h_q/H; the worker's units are
//! concatenated and the head dimension cut into M equal parts (M divides h_q/H), chunk m
//! holding query heads [m·w/M, (m+1)·w/M) of every unit's shard (w = h_q/H). So each
//! chunk has the same FLOPs and the same Q and output bytes. KV bytes follow GQA: chunk m
//! brings the KV heads its query heads map to that no earlier chunk brought; they are
//! equal across chunks only when w/M is a multiple of h_q/h_kv, and otherwise an earlier
//! chunk brings a KV head that later chunks reuse. Summed over chunks, every quantity
//! equals the Plan's.

use serde::Serialize;

use crate::error::{invalid, Result};
use crate::plan::{kv_heads_of, Group, KvSpans, Payload, Plan, WorkerId};

/// One piece of a Plan transfer that a chunk needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ChunkTransfer {
    /// Index of the whole transfer in the group's `transfers`.
    pub transfer: usize,
    /// Sender.
    pub src: WorkerId,
    /// Receiver.
    pub dst: WorkerId,
    /// This chunk's share of the bytes.
    pub bytes: u64,
}

/// One head chunk of one worker.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HeadChunk {
    /// m, 0-based.
    pub index: u32,
    /// First query head of the chunk inside every unit's shard (m·w/M).
    pub head_offset: u32,
    /// Query heads per unit in the chunk (w/M).
    pub heads: u32,
    /// Causal pair·heads computed.
    pub pair_heads: u64,
    /// Forward FLOPs computed.
    pub flops: f64,
    /// Q and KV pieces that must reach this worker before the chunk computes.
    pub dispatch: Vec<ChunkTransfer>,
    /// Output pieces this worker sends back after the chunk computes.
    pub returns: Vec<ChunkTransfer>,
}

/// One worker's pipeline.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkerPipeline {
    /// The worker.
    pub worker: WorkerId,
    /// The units it computes, by id.
    pub units: Vec<u32>,
    /// Its M chunks, in order.
    pub chunks: Vec<HeadChunk>,
}

/// Cut every worker of `group` into `m` head chunks. `m` must divide h_q/H.
pub fn pipeline(plan: &Plan, group: &Group, m: u32) -> Result<Vec<WorkerPipeline>> {
    let w = plan.heads_per_shard();
    if w == 0 || m == 0 || w % m != 0 {
        return Err(invalid(
            "M (pipeliner chunks)",
            m,
            format!(
                "a divisor of h_q/H = {}/{} = {w}",
                plan.shape.heads_q, plan.head_shards
            ),
        ));
    }
    let cw = w / m;
    let shape = &plan.shape;
    let mut out: Vec<WorkerPipeline> = group
        .workers
        .iter()
        .map(|&worker| WorkerPipeline {
            worker,
            units: Vec::new(),
            chunks: (0..m)
                .map(|i| HeadChunk {
                    index: i,
                    head_offset: i * cw,
                    heads: cw,
                    pair_heads: 0,
                    flops: 0.0,
                    dispatch: Vec::new(),
                    returns: Vec::new(),
                })
                .collect(),
        })
        .collect();
    let slot = |wk: WorkerId| group.workers.iter().position(|&x| x == wk);
    let mut pairs = vec![0u64; out.len()];
    for u in &group.units {
        let Some(i) = slot(u.worker) else {
            return Err(invalid(
                "unit worker",
                u.worker,
                "a worker of the unit's group",
            ));
        };
        out[i].units.push(u.id);
        pairs[i] += u.pairs;
    }
    for (i, p) in out.iter_mut().enumerate() {
        p.units.sort_unstable();
        for c in &mut p.chunks {
            c.pair_heads = pairs[i] * u64::from(cw);
            c.flops = shape.fwd_flops(pairs[i], cw);
        }
    }
    let spans = KvSpans::new(&group.sequences);
    for (ti, t) in group.transfers.iter().enumerate() {
        let (end, tokens, kv_shard, is_return) = match t.carries {
            Payload::Q { start, end, .. } => (t.dst, end - start, None, false),
            Payload::Output { start, end, .. } => (t.src, end - start, None, true),
            Payload::Kv { group: kv, .. } => (t.dst, spans.tokens(t), Some(kv.shard), false),
        };
        let Some(i) = slot(end) else {
            return Err(invalid(
                "transfer worker",
                end,
                "a worker of the transfer's group",
            ));
        };
        for (k, c) in out[i].chunks.iter_mut().enumerate() {
            let k = k as u32;
            let bytes = match kv_shard {
                None => shape.q_bytes(tokens, cw),
                Some(s) => {
                    let lo = s * w + k * cw;
                    let (_, prev_hi) = kv_heads_of(shape, s * w, lo);
                    let (a, hi) = kv_heads_of(shape, lo, lo + cw);
                    let first_new = if k == 0 { a } else { a.max(prev_hi) };
                    shape.kv_bytes(tokens, hi.saturating_sub(first_new))
                }
            };
            if bytes == 0 {
                continue;
            }
            let piece = ChunkTransfer {
                transfer: ti,
                src: t.src,
                dst: t.dst,
                bytes,
            };
            if is_return {
                c.returns.push(piece);
            } else {
                c.dispatch.push(piece);
            }
        }
    }
    Ok(out)
}

/// The pipelines of every group of a plan, in the plan's group order.
pub fn pipeline_plan(plan: &Plan, m: u32) -> Result<Vec<Vec<WorkerPipeline>>> {
    plan.groups.iter().map(|g| pipeline(plan, g, m)).collect()
}

/// One step of the overlap schedule of §6.3: what each stream does side by side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Stage {
    /// Chunk whose inputs are dispatched.
    pub dispatch: Option<u32>,
    /// Chunk computed.
    pub compute: Option<u32>,
    /// Chunk whose outputs return.
    pub ret: Option<u32>,
}

/// The §6.3 order for M chunks: dispatch chunk 0 alone; then compute chunk m while chunk
/// m+1 dispatches and chunk m−1 returns; finally chunk M−1's return alone. Only the first
/// and the last stage's communication is exposed when compute covers the rest. The
/// engine enforces the dependencies (a chunk computes after its dispatch lands; its
/// return starts after it computes) and measures what actually overlaps.
pub fn overlap_stages(m: u32) -> Vec<Stage> {
    let mut v = Vec::with_capacity(m as usize + 2);
    if m == 0 {
        return v;
    }
    v.push(Stage {
        dispatch: Some(0),
        compute: None,
        ret: None,
    });
    for k in 0..m {
        v.push(Stage {
            dispatch: (k + 1 < m).then_some(k + 1),
            compute: Some(k),
            ret: k.checked_sub(1),
        });
    }
    v.push(Stage {
        dispatch: None,
        compute: None,
        ret: Some(m - 1),
    });
    v
}
