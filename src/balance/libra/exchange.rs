//! Tile exchange planning (Libra §6.1): the transfers a placement needs, and how many
//! bytes they put on each worker and each (source, destination) pair.
//!
//! Owns turning a [`Tiling`] and its [`Placement`] into a Plan [`Group`] (units and
//! transfers, built by the shared `plan::build`), and byte accounting over any Plan group. It may not change a placement or
//! price bytes itself (`plan::kv_group_bytes` and [`crate::cost::AttnShape`] do).
//!
//! Rules: a tile away from its Q-home receives its Q from the Q-home and sends its output
//! back; KV transfers are deduplicated per (sample, head shard, destination): the first
//! tile on a worker that reads a KV group brings, from each worker holding some of the
//! sample's tokens, the tokens not already on it; later tiles there reuse them. Local Q,
//! local outputs and resident KV tokens move nothing.

use std::collections::BTreeMap;

use serde::Serialize;

use super::tap::{Placement, Tiling};
use crate::cost::AttnShape;
use crate::plan::build::{self, GroupSite, KvReach, UnitSpec};
use crate::plan::{Group, Payload, PlanSeq, Resident, WorkerId};
use crate::workload::PackedSeq;

/// Where a pool sits in the step and on the cluster.
#[derive(Clone, Debug)]
pub struct PoolSite<'a> {
    /// GA index.
    pub ga: u32,
    /// Pool index inside the GA index.
    pub pool: u32,
    /// Global batch index of each pool sequence (DP-replica order).
    pub seq_ids: &'a [u32],
    /// Global worker id of each pool-local worker.
    pub workers: &'a [WorkerId],
}

/// Build the Plan group of a placed pool: one unit per tile (unit id = tile id), then the
/// transfers in tile order (each tile's Q, then the KV pieces it is first to need), then
/// the outputs in tile order. The tiling's layout and the placement become a
/// [`crate::plan::build`] unit list; the shared builder applies the rules above (whole KV
/// groups: [`KvReach::WholeSample`]).
pub fn build_group(
    site: &PoolSite<'_>,
    seqs: &[&PackedSeq],
    t: &Tiling,
    p: &Placement,
    shape: &AttnShape,
) -> Group {
    let gw = |r: u32| site.workers[r as usize];
    let sequences = seqs
        .iter()
        .enumerate()
        .map(|(i, s)| PlanSeq {
            id: site.seq_ids[i],
            samples: s.lengths().collect(),
            capacity: s.capacity,
            layout: t.layouts[i]
                .iter()
                .map(|&(start, end, r)| Resident {
                    start,
                    end,
                    worker: gw(r),
                })
                .collect(),
        })
        .collect();
    let units: Vec<UnitSpec> = (0..t.len())
        .map(|i| {
            let (c, shard) = t.tile(i);
            UnitSpec {
                seq: c.seq as usize,
                q_start: c.q_start,
                q_end: c.q_end,
                shard,
                worker: gw(p.worker[i]),
            }
        })
        .collect();
    let built = GroupSite {
        ga: site.ga,
        pool: site.pool,
        workers: site.workers,
        shape,
        head_shards: t.head_shards,
        kv: KvReach::WholeSample,
    };
    build::build_group(&built, sequences, &units)
}

/// Bytes one worker sends and receives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerBytes {
    /// The worker.
    pub worker: WorkerId,
    /// Bytes it sends.
    pub sent: u64,
    /// Bytes it receives.
    pub received: u64,
}

/// Bytes over one (source, destination) pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PairBytes {
    /// Sender.
    pub src: WorkerId,
    /// Receiver.
    pub dst: WorkerId,
    /// Bytes.
    pub bytes: u64,
}

/// What a group's transfers move.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExchangeStats {
    /// All bytes.
    pub total: u64,
    /// Q bytes.
    pub q: u64,
    /// KV bytes.
    pub kv: u64,
    /// Output bytes.
    pub output: u64,
    /// Per worker of the group, in the group's worker order.
    pub per_worker: Vec<WorkerBytes>,
    /// Per (source, destination) pair that moves anything, in (src, dst) order.
    pub per_pair: Vec<PairBytes>,
}

/// Byte accounting of any Plan group.
pub fn stats(g: &Group) -> ExchangeStats {
    let mut s = ExchangeStats {
        total: 0,
        q: 0,
        kv: 0,
        output: 0,
        per_worker: g
            .workers
            .iter()
            .map(|&worker| WorkerBytes {
                worker,
                sent: 0,
                received: 0,
            })
            .collect(),
        per_pair: Vec::new(),
    };
    let index: BTreeMap<WorkerId, usize> =
        g.workers.iter().enumerate().map(|(i, &w)| (w, i)).collect();
    let mut pairs: BTreeMap<(WorkerId, WorkerId), u64> = BTreeMap::new();
    for t in &g.transfers {
        s.total += t.bytes;
        match t.carries {
            Payload::Q { .. } => s.q += t.bytes,
            Payload::Kv { .. } => s.kv += t.bytes,
            Payload::Output { .. } => s.output += t.bytes,
        }
        if let Some(&i) = index.get(&t.src) {
            s.per_worker[i].sent += t.bytes;
        }
        if let Some(&i) = index.get(&t.dst) {
            s.per_worker[i].received += t.bytes;
        }
        *pairs.entry((t.src, t.dst)).or_default() += t.bytes;
    }
    s.per_pair = pairs
        .into_iter()
        .map(|((src, dst), bytes)| PairBytes { src, dst, bytes })
        .collect();
    s
}
