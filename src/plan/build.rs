//! Building Plan groups from any scheme's decisions: the one place a layout and a list of
//! (query range, head shard, executing worker) choices become [`WorkUnit`]s and the
//! [`Transfer`]s they need.
//!
//! Owns the lowering every planner shares (`balance::libra::exchange::build_group`,
//! `balance::ulysses`, `balance::wlbllm::lower`, `balance::distca::lower`): the contiguous
//! CP layout, unit fields (segments, KV groups per Eq. 7, exact causal pairs per Eq. 8,
//! FLOPs and bytes through [`AttnShape`]) and the exchange rules the checker enforces. It
//! may not choose where work runs (the planners do) or do I/O.
//!
//! # Exchange rules
//! A unit whose queries live (partly) on other workers receives each such layout piece as
//! one Q transfer from its holder and sends the piece's output back (outputs after all
//! else, in unit order). KV transfers are deduplicated per (KV group, executing worker):
//! the first unit on a worker that reads a group brings, from every other holder, the
//! group's tokens it needs and does not hold — the whole sample ([`KvReach::WholeSample`],
//! an all-gather or all-to-all of K and V) or only the causal prefix the worker's units on
//! that group read, keys [0, largest query end) ([`KvReach::CausalPrefix`], DistCA).

use std::collections::{HashMap, HashSet};

use super::{
    kv_group_bytes, segment_pairs, Group, KvGroup, Payload, PlanSeq, Resident, SampleIndex,
    Transfer, WorkUnit, WorkerId,
};
use crate::cost::AttnShape;

/// How much of a KV group a worker receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvReach {
    /// Every token of the sample it does not hold.
    WholeSample,
    /// Keys [0, e) only, e the largest sample-local query end of its units on the group.
    CausalPrefix,
}

/// One unit as a planner decides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitSpec {
    /// Index of the sequence in the group's `sequences`.
    pub seq: usize,
    /// First query position.
    pub q_start: u64,
    /// One past the last query position.
    pub q_end: u64,
    /// Head shard.
    pub shard: u32,
    /// Executing worker.
    pub worker: WorkerId,
}

/// Where a group sits and what it prices with.
#[derive(Clone, Copy, Debug)]
pub struct GroupSite<'a> {
    /// GA index.
    pub ga: u32,
    /// Pool (or CP group) index inside the GA index.
    pub pool: u32,
    /// The group's workers.
    pub workers: &'a [WorkerId],
    /// The attention shape.
    pub shape: &'a AttnShape,
    /// H, head shards of the plan.
    pub head_shards: u32,
    /// How much KV a worker receives.
    pub kv: KvReach,
}

/// The contiguous CP layout of a sequence of `tokens` tokens and capacity `capacity` on
/// `ranks` (in rank order): rank r holds positions [r·⌈L/CP⌉, (r+1)·⌈L/CP⌉) ∩ [0, tokens).
pub fn contiguous_layout(tokens: u64, capacity: u32, ranks: &[WorkerId]) -> Vec<Resident> {
    let n = ranks.len().max(1) as u64;
    let per = u64::from(capacity).max(tokens).div_ceil(n).max(1);
    ranks
        .iter()
        .enumerate()
        .filter_map(|(r, &worker)| {
            let start = r as u64 * per;
            let end = (start + per).min(tokens);
            (start < end).then_some(Resident { start, end, worker })
        })
        .collect()
}

/// The layout pieces of positions [start, end): (start, end, worker), in position order.
fn pieces(
    layout: &[Resident],
    start: u64,
    end: u64,
) -> impl Iterator<Item = (u64, u64, WorkerId)> + '_ {
    let i = layout.partition_point(|r| r.end <= start);
    layout[i..]
        .iter()
        .take_while(move |r| r.start < end)
        .map(move |r| (start.max(r.start), end.min(r.end), r.worker))
}

/// Build the group: unit id = index in `units`; transfers in unit order (each unit's Q
/// pieces, then the KV pieces it is first to need), then the outputs in unit order.
/// `units` must lie inside their sequences' samples with non-empty query ranges, and
/// every layout must cover its sequence's tokens (the planners guarantee both; the checker
/// verifies the result).
pub fn build_group(site: &GroupSite<'_>, sequences: Vec<PlanSeq>, units: &[UnitSpec]) -> Group {
    let shape = site.shape;
    let h = site.head_shards.max(1);
    let w = shape.heads_q / h;
    let index: Vec<SampleIndex> = sequences
        .iter()
        .map(|s| SampleIndex::new(&s.samples))
        .collect();
    let segs: Vec<_> = units
        .iter()
        .map(|u| index[u.seq].segments(u.q_start, u.q_end))
        .collect();
    // keys each (group, worker) needs under the causal prefix (whole samples need no table)
    let mut need: HashMap<(KvGroup, WorkerId), u32> = HashMap::new();
    let prefix_units = match site.kv {
        KvReach::WholeSample => &[][..],
        KvReach::CausalPrefix => units,
    };
    for (u, ss) in prefix_units.iter().zip(&segs) {
        let seq = &sequences[u.seq];
        for sg in ss {
            let group = KvGroup {
                seq: seq.id,
                sample: sg.sample,
                shard: u.shard,
            };
            let n = need.entry((group, u.worker)).or_default();
            *n = (*n).max(sg.end);
        }
    }
    let mut delivered: HashSet<(KvGroup, WorkerId)> = HashSet::new();
    let mut out_units = Vec::with_capacity(units.len());
    let mut transfers = Vec::new();
    let mut outputs = Vec::new();
    for (i, (u, segments)) in units.iter().zip(segs).enumerate() {
        let id = i as u32;
        let seq = &sequences[u.seq];
        let mut q_home = u.worker;
        for (k, (a, e, holder)) in pieces(&seq.layout, u.q_start, u.q_end).enumerate() {
            if k == 0 {
                q_home = holder;
            }
            if holder == u.worker {
                continue;
            }
            let bytes = shape.q_bytes(e - a, w);
            transfers.push(Transfer {
                src: holder,
                dst: u.worker,
                bytes,
                carries: Payload::Q {
                    unit: id,
                    start: a,
                    end: e,
                },
            });
            outputs.push(Transfer {
                src: u.worker,
                dst: holder,
                bytes,
                carries: Payload::Output {
                    unit: id,
                    start: a,
                    end: e,
                },
            });
        }
        let mut kv_groups = Vec::with_capacity(segments.len());
        let mut pairs = 0u64;
        for sg in &segments {
            pairs += segment_pairs(u64::from(sg.start), u64::from(sg.end));
            let group = KvGroup {
                seq: seq.id,
                sample: sg.sample,
                shard: u.shard,
            };
            kv_groups.push(group);
            if !delivered.insert((group, u.worker)) {
                continue;
            }
            let e = match site.kv {
                KvReach::WholeSample => seq.samples[sg.sample as usize],
                KvReach::CausalPrefix => need.get(&(group, u.worker)).copied().unwrap_or(0),
            };
            let (s0, _) = index[u.seq].span(sg.sample as usize);
            for (a, b, holder) in pieces(&seq.layout, s0, s0 + u64::from(e)) {
                if holder == u.worker {
                    continue;
                }
                transfers.push(Transfer {
                    src: holder,
                    dst: u.worker,
                    bytes: kv_group_bytes(shape, h, u.shard, b - a),
                    carries: Payload::Kv {
                        group,
                        start: (a - s0) as u32,
                        end: (b - s0) as u32,
                    },
                });
            }
        }
        out_units.push(WorkUnit {
            id,
            seq: seq.id,
            q_start: u.q_start,
            q_end: u.q_end,
            shard: u.shard,
            segments,
            kv_groups,
            pairs,
            flops: shape.fwd_flops(pairs, w),
            q_home,
            worker: u.worker,
        });
    }
    transfers.extend(outputs);
    Group {
        ga: site.ga,
        pool: site.pool,
        workers: site.workers.to_vec(),
        sequences,
        units: out_units,
        transfers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{check, Plan, PLAN_VERSION};

    const TINY: AttnShape = AttnShape {
        heads_q: 2,
        heads_kv: 1,
        head_dim: 1,
        dtype_bytes: 1,
    };

    #[test]
    fn contiguous_layout_by_hand() {
        // L = 10 on 3 ranks: ⌈10/3⌉ = 4 → [0,4) [4,8) [8,9) for 9 tokens.
        let l = contiguous_layout(9, 10, &[5, 6, 7]);
        let got: Vec<_> = l.iter().map(|r| (r.start, r.end, r.worker)).collect();
        assert_eq!(got, vec![(0, 4, 5), (4, 8, 6), (8, 9, 7)]);
        // 3 tokens: only rank 0 holds any.
        assert_eq!(contiguous_layout(3, 10, &[5, 6, 7]).len(), 1);
        assert!(contiguous_layout(0, 10, &[5, 6]).is_empty());
    }

    fn plan(kv: KvReach, units: &[UnitSpec]) -> Plan {
        let workers = [0, 1];
        let seq = PlanSeq {
            id: 3,
            samples: vec![4, 4],
            capacity: 8,
            layout: contiguous_layout(8, 8, &workers),
        };
        let site = GroupSite {
            ga: 0,
            pool: 0,
            workers: &workers,
            shape: &TINY,
            head_shards: 1,
            kv,
        };
        Plan {
            version: PLAN_VERSION,
            scheme: "test".into(),
            step: 0,
            shape: TINY,
            head_shards: 1,
            groups: vec![build_group(&site, vec![seq], units)],
        }
    }

    #[test]
    fn causal_prefix_moves_only_the_keys_read() {
        // samples [0,4) on worker 0 and [4,8) on worker 1. Worker 0 runs sample 1's
        // queries [4,6) (sample-local [0,2)): it needs Q of 2 tokens (2 heads × 1 B = 4 B),
        // keys [0,2) of sample 1 (K+V, 1 KV head: 4 B) and returns 4 B of output.
        let u = |a, e, worker| UnitSpec {
            seq: 0,
            q_start: a,
            q_end: e,
            shard: 0,
            worker,
        };
        let units = [u(0, 4, 0), u(4, 6, 0), u(6, 8, 1)];
        let p = plan(KvReach::CausalPrefix, &units);
        let s = check(&p).unwrap();
        assert_eq!((s.transfers, s.bytes), (3, 12));
        let g = &p.groups[0];
        assert_eq!(g.units[1].q_home, 1);
        assert_eq!(g.units[1].pairs, 3);
        // Whole sample: keys [0,4) of sample 1 → 8 B of KV.
        let p = plan(KvReach::WholeSample, &units);
        assert_eq!(check(&p).unwrap().bytes, 16);
        // Dropping the KV transfer of the prefix plan is caught.
        let mut p = plan(KvReach::CausalPrefix, &units);
        p.groups[0]
            .transfers
            .retain(|t| !matches!(t.carries, Payload::Kv { .. }));
        let v = check(&p).unwrap_err().kind;
        assert!(
            matches!(
                v,
                crate::plan::ViolationKind::MissingKv {
                    start: 0,
                    end: 2,
                    worker: 0,
                    ..
                }
            ),
            "{v}"
        );
    }
}
