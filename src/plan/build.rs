//! Building Plan groups from any scheme's decisions: the one place a layout and a list of
//! (query range, head shard, executing worker) choices become [`WorkUnit`]s and the
//! [`Transfer`]s they need.
//!
//! Owns the lowering every planner shares (`balance::libra::exchange::build_group`,
//! `balance::ulysses`, `balance::wlbllm::lower`, `balance::distca::lower`): the contiguous
//! CP layout, unit fields (segments, KV groups per Eq. 7, exact pairs per Eq. 8 under the
//! shape's mask,
//! FLOPs and bytes through [`AttnShape`]) and the exchange rules the checker enforces. It
//! may not choose where work runs (the planners do) or do I/O.
//!
//! # Exchange rules
//! A unit whose queries live (partly) on other workers receives each such layout piece as
//! one Q transfer from its holder and sends the piece's output back (outputs after all
//! else, in unit order). KV transfers are deduplicated per (KV group, executing worker):
//! the first unit on a worker that reads a group brings, from every other holder, the
//! group's tokens it needs and does not hold — the whole sample ([`KvReach::WholeSample`],
//! an all-gather or all-to-all of K and V) or only the keys the worker's units on that
//! group reach, [lowest reached key, largest query end) ([`KvReach::Reached`], DistCA).
//! Under [`KvReach::AllGather`] the whole-sample KV is not sent per group and piece but per
//! (sequence, shard, receiver, sender) as few spans as the layout allows, after every
//! unit's Q pieces and before the outputs. Under a mask that is not causal no key below
//! the lowest one a worker's queries reach moves ([`crate::cost::Mask::key_start`]): the
//! whole sample becomes its keys from that one on, and the all-gather is sent per group
//! as the whole sample's.

use std::collections::{HashMap, HashSet};

use super::{
    kv_group_bytes, Group, KvGroup, KvSpans, Payload, Plan, PlanSeq, Resident, SampleIndex,
    Transfer, WorkUnit, WorkerId,
};
use crate::cost::{AttnShape, Mask};

/// How much of a KV group a worker receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvReach {
    /// Every token of the sample it does not hold (from the lowest key its units reach).
    WholeSample,
    /// Keys [lo, e) only, e the largest sample-local query end of its units on the group
    /// and lo the lowest key they reach under the mask (0 under the causal mask).
    Reached,
    /// What [`KvReach::WholeSample`] moves, merged: per (sequence, head shard, receiver,
    /// sender) one KV span ([`Payload::Kv`]) per maximal run of the sender's tokens in
    /// samples the receiver reads — the sender's share of an all-gather in one transfer,
    /// however many pieces of however many samples it holds (WLB-LLM's per-document
    /// sharding gives every rank two chunks of every document).
    AllGather,
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
    // a causal all-gather is sent as spans; under another mask, per group from its reach
    let kv = match site.kv {
        KvReach::AllGather if !shape.mask.is_causal() => KvReach::WholeSample,
        k => k,
    };
    // keys [lo, e) each (group, worker) reaches (causal whole samples need no table)
    let mut need: HashMap<(KvGroup, WorkerId), (u32, u32)> = HashMap::new();
    let reach_units = match kv {
        KvReach::WholeSample if !shape.mask.is_causal() => units,
        KvReach::WholeSample | KvReach::AllGather => &[][..],
        KvReach::Reached => units,
    };
    for (u, ss) in reach_units.iter().zip(&segs) {
        let seq = &sequences[u.seq];
        for sg in ss {
            let group = KvGroup {
                seq: seq.id,
                sample: sg.sample,
                shard: u.shard,
            };
            let lo = shape.mask.key_start(u64::from(sg.start)) as u32;
            let n = need.entry((group, u.worker)).or_insert((lo, 0));
            *n = (n.0.min(lo), n.1.max(sg.end));
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
            pairs += shape
                .mask
                .range_pairs(u64::from(sg.start), u64::from(sg.end));
            let group = KvGroup {
                seq: seq.id,
                sample: sg.sample,
                shard: u.shard,
            };
            kv_groups.push(group);
            if kv == KvReach::AllGather || !delivered.insert((group, u.worker)) {
                continue;
            }
            let (lo, e) = need.get(&(group, u.worker)).copied().unwrap_or((0, 0));
            let e = match kv {
                KvReach::WholeSample | KvReach::AllGather => seq.samples[sg.sample as usize],
                KvReach::Reached => e,
            };
            let (s0, _) = index[u.seq].span(sg.sample as usize);
            for (a, b, holder) in pieces(&seq.layout, s0 + u64::from(lo), s0 + u64::from(e)) {
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
    if kv == KvReach::AllGather {
        all_gather_spans(site, &sequences, &index, &out_units, &mut transfers);
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

/// The KV spans of [`KvReach::AllGather`], appended to `transfers`: for each sequence, head
/// shard and receiver (group worker order) the samples its units read; then for each
/// sender (group worker order) its layout tokens in position order, a span running over
/// the tokens of read samples and closing at a sample the receiver does not read.
fn all_gather_spans(
    site: &GroupSite<'_>,
    sequences: &[PlanSeq],
    index: &[SampleIndex],
    units: &[WorkUnit],
    transfers: &mut Vec<Transfer>,
) {
    let h = site.head_shards.max(1);
    // (sequence index, shard, receiver) → samples read, sorted
    let slot: HashMap<u32, usize> = sequences
        .iter()
        .enumerate()
        .map(|(i, s)| (s.id, i))
        .collect();
    let mut reads: Vec<(usize, u32, WorkerId, u32)> = units
        .iter()
        .flat_map(|u| {
            let i = slot.get(&u.seq).copied().unwrap_or(usize::MAX);
            u.segments
                .iter()
                .map(move |sg| (i, u.shard, u.worker, sg.sample))
        })
        .filter(|r| r.0 < sequences.len())
        .collect();
    reads.sort_unstable();
    reads.dedup();
    let mut at = 0;
    while at < reads.len() {
        let (si, shard, _, _) = reads[at];
        let seq = &sequences[si];
        let mut read = vec![false; seq.samples.len()];
        let mut held: HashMap<WorkerId, Vec<&Resident>> = HashMap::new();
        for r in &seq.layout {
            held.entry(r.worker).or_default().push(r);
        }
        let next = at + reads[at..].partition_point(|r| (r.0, r.1) == (si, shard));
        for &dst in site.workers {
            read.iter_mut().for_each(|x| *x = false);
            let mut any = false;
            for r in reads[at..next].iter().filter(|r| r.2 == dst) {
                read[r.3 as usize] = true;
                any = true;
            }
            if !any {
                continue;
            }
            for &src in site.workers.iter().filter(|&&w| w != dst) {
                // the open span: (first sample, its first position, span start, end, tokens)
                let mut open: Option<(u32, u64, u64, u64, u64)> = None;
                let mut close = |open: &mut Option<(u32, u64, u64, u64, u64)>| {
                    if let Some((j, p0, a, e, n)) = open.take() {
                        transfers.push(Transfer {
                            src,
                            dst,
                            bytes: kv_group_bytes(site.shape, h, shard, n),
                            carries: Payload::Kv {
                                group: KvGroup {
                                    seq: seq.id,
                                    sample: j,
                                    shard,
                                },
                                start: (a - p0) as u32,
                                end: (e - p0) as u32,
                            },
                        });
                    }
                };
                for r in held.get(&src).map_or(&[][..], Vec::as_slice) {
                    for sg in index[si].segments(r.start, r.end) {
                        let (p0, _) = index[si].span(sg.sample as usize);
                        let (a, e) = (p0 + u64::from(sg.start), p0 + u64::from(sg.end));
                        if !read[sg.sample as usize] {
                            close(&mut open);
                            continue;
                        }
                        match &mut open {
                            Some(o) => {
                                o.3 = e;
                                o.4 += e - a;
                            }
                            None => open = Some((sg.sample, p0, a, e, e - a)),
                        }
                    }
                }
                close(&mut open);
            }
        }
        at = next;
    }
}

/// The plan of `plan`'s placement for layers of a narrower `mask` ([`Mask::within`] the
/// plan's): the same groups, units and Q/output transfers; every unit's pairs and FLOPs
/// under `mask`; every KV transfer cut at sample boundaries and clipped to the keys its
/// receiver's units reach under `mask` ([`Mask::key_start`]), pieces below them dropped.
/// A model whose layers mix masks runs one placement per step: the plan is made for the
/// widest mask and each layer class runs this narrowing of it.
pub fn narrow(plan: &Plan, mask: Mask) -> Plan {
    let shape = AttnShape { mask, ..plan.shape };
    let w = plan.heads_per_shard();
    let groups = plan
        .groups
        .iter()
        .map(|g| {
            let mut lo: HashMap<(KvGroup, WorkerId), u32> = HashMap::new();
            let units: Vec<WorkUnit> = g
                .units
                .iter()
                .map(|u| {
                    for (sg, &grp) in u.segments.iter().zip(&u.kv_groups) {
                        let k = mask.key_start(u64::from(sg.start)) as u32;
                        let e = lo.entry((grp, u.worker)).or_insert(k);
                        *e = (*e).min(k);
                    }
                    let pairs = u
                        .segments
                        .iter()
                        .map(|sg| mask.range_pairs(u64::from(sg.start), u64::from(sg.end)))
                        .sum();
                    WorkUnit {
                        pairs,
                        flops: shape.fwd_flops(pairs, w),
                        ..u.clone()
                    }
                })
                .collect();
            let spans = KvSpans::new(&g.sequences);
            let mut transfers = Vec::with_capacity(g.transfers.len());
            for t in &g.transfers {
                let Payload::Kv { group, start, end } = t.carries else {
                    transfers.push(t.clone());
                    continue;
                };
                for sg in spans.pieces(t.src, group, start, end).unwrap_or_default() {
                    let grp = KvGroup {
                        sample: sg.sample,
                        ..group
                    };
                    let from = sg.start.max(lo.get(&(grp, t.dst)).copied().unwrap_or(0));
                    if from >= sg.end {
                        continue;
                    }
                    transfers.push(Transfer {
                        bytes: kv_group_bytes(
                            &shape,
                            plan.head_shards,
                            grp.shard,
                            u64::from(sg.end - from),
                        ),
                        carries: Payload::Kv {
                            group: grp,
                            start: from,
                            end: sg.end,
                        },
                        ..t.clone()
                    });
                }
            }
            Group {
                units,
                transfers,
                ..g.clone()
            }
        })
        .collect();
    Plan {
        shape,
        groups,
        ..plan.clone()
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
        mask: crate::cost::Mask::Causal,
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
        let seq = PlanSeq {
            id: 3,
            samples: vec![4, 4],
            capacity: 8,
            layout: contiguous_layout(8, 8, &[0, 1]),
        };
        plan_of(TINY, seq, kv, units)
    }

    /// One group of `seq` on workers 0 and 1, H = 1.
    fn plan_of(shape: AttnShape, seq: PlanSeq, kv: KvReach, units: &[UnitSpec]) -> Plan {
        let workers = [0, 1];
        let site = GroupSite {
            ga: 0,
            pool: 0,
            workers: &workers,
            shape: &shape,
            head_shards: 1,
            kv,
        };
        Plan {
            version: PLAN_VERSION,
            scheme: "test".into(),
            step: 0,
            shape,
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
        let p = plan(KvReach::Reached, &units);
        let s = check(&p).unwrap();
        assert_eq!((s.transfers, s.bytes), (3, 12));
        let g = &p.groups[0];
        assert_eq!(g.units[1].q_home, 1);
        assert_eq!(g.units[1].pairs, 3);
        // Whole sample: keys [0,4) of sample 1 → 8 B of KV.
        let p = plan(KvReach::WholeSample, &units);
        assert_eq!(check(&p).unwrap().bytes, 16);
        // Dropping the KV transfer of the prefix plan is caught.
        let mut p = plan(KvReach::Reached, &units);
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

    /// Samples [4, 6] (positions [0,4) and [4,10)), worker 0 holding [0,7) and worker 1
    /// [7,10); units: sample 0 and sample 1's queries [4,8) on worker 0, [8,10) on worker 1.
    fn window_plan(mask: crate::cost::Mask, kv: KvReach) -> Plan {
        let layout = vec![
            Resident {
                start: 0,
                end: 7,
                worker: 0,
            },
            Resident {
                start: 7,
                end: 10,
                worker: 1,
            },
        ];
        let seq = PlanSeq {
            id: 0,
            samples: vec![4, 6],
            capacity: 10,
            layout,
        };
        let u = |a, e, worker| UnitSpec {
            seq: 0,
            q_start: a,
            q_end: e,
            shard: 0,
            worker,
        };
        plan_of(
            AttnShape { mask, ..TINY },
            seq,
            kv,
            &[u(0, 4, 0), u(4, 8, 0), u(8, 10, 1)],
        )
    }

    #[test]
    fn a_window_straddling_a_document_boundary_reaches_only_its_own_document() {
        use crate::cost::Mask;
        let sliding = Mask::Sliding { w: 3 };
        // sliding:3 pairs: sample 0 keys per query 1 2 3 3 = 9; sample 1 1 2 3 3 3 3 = 15.
        let p = window_plan(sliding, KvReach::Reached);
        let s = check(&p).unwrap();
        assert_eq!(s.flops, 4.0 * 2.0 * (9.0 + 15.0));
        let g = &p.groups[0];
        assert_eq!(
            g.units.iter().map(|u| u.pairs).collect::<Vec<_>>(),
            [9, 1 + 2 + 3 + 3, 6]
        );
        // Worker 0's queries of sample 1 are sample-local [0,4): a window of 3 positions
        // back from position 4 would straddle into sample 0 ([2,5)), but keys stay in the
        // document: [0,4) of sample 1, of which it lacks key 3 (position 7): 1 token, K+V
        // of 1 KV head at 1 B = 2 B, plus Q and output of position 7 (2 B each). Worker
        // 1's queries are sample-local [4,6): keys [2,6); it holds [3,6), so exactly key
        // 2 (position 6) moves: 2 B. Causally it would need keys [0,3): 6 B.
        let kv: Vec<_> = g
            .transfers
            .iter()
            .filter_map(|t| match t.carries {
                Payload::Kv { group, start, end } => {
                    Some((t.src, t.dst, group.sample, start, end, t.bytes))
                }
                _ => None,
            })
            .collect();
        assert_eq!(kv, vec![(1, 0, 1, 3, 4, 2), (0, 1, 1, 2, 3, 2)]);
        assert_eq!(s.bytes, 8);
        let causal = window_plan(Mask::Causal, KvReach::Reached);
        assert_eq!(check(&causal).unwrap().bytes, 12);
        // The causal plan narrowed to the window is the window's own plan.
        assert_eq!(narrow(&causal, sliding), p);
        // Whole samples under the window: from the lowest key reached to the sample's end
        // (worker 0: keys [3, 6), 6 B; worker 1: key 2, 2 B), never a key below it.
        let w = window_plan(sliding, KvReach::WholeSample);
        assert_eq!(check(&w).unwrap().bytes, 4 + 6 + 2);
        // The checker refuses keys the window does not reach, and a missing reach.
        let mut bad = p.clone();
        for t in bad.groups[0].transfers.iter_mut().filter(|t| t.dst == 1) {
            if let Payload::Kv { start, .. } = &mut t.carries {
                *start = 0;
                t.bytes = 6;
            }
        }
        let v = check(&bad).unwrap_err().kind;
        assert!(
            matches!(
                v,
                crate::plan::ViolationKind::KvOutOfReach {
                    start: 0,
                    end: 2,
                    lo: 2,
                    worker: 1,
                    ..
                }
            ),
            "{v}"
        );
        let mut bad = p.clone();
        bad.groups[0]
            .transfers
            .retain(|t| t.dst != 1 || !matches!(t.carries, Payload::Kv { .. }));
        let v = check(&bad).unwrap_err().kind;
        assert!(
            matches!(
                v,
                crate::plan::ViolationKind::MissingKv {
                    start: 2,
                    end: 3,
                    worker: 1,
                    ..
                }
            ),
            "{v}"
        );
        // A plan claiming causal pairs under the window is caught by its pairs.
        let mut bad = p.clone();
        bad.groups[0].units[2].pairs = 4 + 5;
        assert!(matches!(
            check(&bad).unwrap_err().kind,
            crate::plan::ViolationKind::WrongPairs { expected: 6, .. }
        ));
    }

    /// Samples [4, 2, 4] on workers 0–2 as [0,2)@0 [2,4)@1 [4,5)@0 [5,6)@2 [6,8)@1
    /// [8,10)@0, each range a unit on its holder (WLB-LLM's shape of plan).
    fn spans_plan(kv: KvReach) -> Plan {
        let workers = [0, 1, 2];
        let layout = [
            (0, 2, 0),
            (2, 4, 1),
            (4, 5, 0),
            (5, 6, 2),
            (6, 8, 1),
            (8, 10, 0),
        ];
        let seq = PlanSeq {
            id: 3,
            samples: vec![4, 2, 4],
            capacity: 10,
            layout: layout
                .iter()
                .map(|&(start, end, worker)| Resident { start, end, worker })
                .collect(),
        };
        let units: Vec<_> = layout
            .iter()
            .map(|&(q_start, q_end, worker)| UnitSpec {
                seq: 0,
                q_start,
                q_end,
                shard: 0,
                worker,
            })
            .collect();
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
            groups: vec![build_group(&site, vec![seq], &units)],
        }
    }

    fn kv_of(p: &Plan) -> Vec<(WorkerId, WorkerId, u32, u32, u32, u64)> {
        p.groups[0]
            .transfers
            .iter()
            .map(|t| match t.carries {
                Payload::Kv { group, start, end } => {
                    (t.src, t.dst, group.sample, start, end, t.bytes)
                }
                _ => panic!("{t:?} is not KV"),
            })
            .collect()
    }

    #[test]
    fn all_gather_spans_by_hand() {
        // Reads: worker 0 samples {0, 1, 2}, worker 1 {0, 2}, worker 2 {1}. 2 B per token.
        // To 0: from 1 its [2,4) and [6,8) as one span (sample 1 between holds none of
        // 1's tokens): sample 0, [2, 8), 4 tokens; from 2 its [5,6) = sample 1 [1, 2).
        // To 1: from 0 [0,2), then [4,5) is sample 1, which 1 does not read: the span
        // closes; [8,10) = sample 2 [2, 4). Worker 2's [5,6) is in sample 1: nothing.
        // To 2: from 0 [4,5) = sample 1 [0, 1); 1 holds none of sample 1.
        let p = spans_plan(KvReach::AllGather);
        assert_eq!(
            kv_of(&p),
            vec![
                (1, 0, 0, 2, 8, 8),
                (2, 0, 1, 1, 2, 2),
                (0, 1, 0, 0, 2, 4),
                (0, 1, 2, 2, 4, 4),
                (0, 2, 1, 0, 1, 2),
            ]
        );
        let s = check(&p).unwrap();
        // the same bytes as one transfer per piece (6 of them)
        let whole = spans_plan(KvReach::WholeSample);
        let w = check(&whole).unwrap();
        assert_eq!((s.transfers, s.bytes, w.transfers, w.bytes), (5, 20, 6, 20));
        // the pipeliner counts a span's held tokens, not its length: per (src, dst) the
        // same chunk bytes as the per-piece plan
        let by_pair = |p: &Plan| {
            let mut m = std::collections::BTreeMap::new();
            for wp in crate::balance::libra::pipeliner::pipeline(p, &p.groups[0], 1).unwrap() {
                for c in wp.chunks.iter().flat_map(|c| &c.dispatch) {
                    *m.entry((c.src, c.dst)).or_insert(0u64) += c.bytes;
                }
            }
            m
        };
        assert_eq!(by_pair(&p), by_pair(&whole));
        assert_eq!(by_pair(&p)[&(1, 0)], 8);
    }

    #[test]
    fn malformed_spans_are_caught() {
        use crate::plan::ViolationKind;
        let reason = |p: &Plan| match check(p).unwrap_err().kind {
            ViolationKind::BadTransfer { index, reason, .. } => (index, reason),
            k => panic!("{k}"),
        };
        let set = |start: u32, end: u32, bytes: u64, i: usize| {
            let mut p = spans_plan(KvReach::AllGather);
            let t = &mut p.groups[0].transfers[i];
            t.bytes = bytes;
            if let Payload::Kv {
                start: ref mut a,
                end: ref mut e,
                ..
            } = t.carries
            {
                (*a, *e) = (start, end);
            }
            p
        };
        // starts on position 1, which worker 1 does not hold
        let (i, r) = reason(&set(1, 8, 8, 0));
        assert!(
            i == 0 && r.contains("does not hold the first and last"),
            "{r}"
        );
        // reaches past the sequence's 10 tokens
        let (_, r) = reason(&set(2, 11, 8, 0));
        assert!(r.contains("reaches past the sequence's 10 tokens"), "{r}");
        // 0 → 1 [0, 5) takes in worker 0's sample-1 token, which worker 1 never reads
        let (i, r) = reason(&set(0, 5, 6, 2));
        assert!(i == 2 && r.contains("no unit on worker 1 reads"), "{r}");
        // priced as its length (6 tokens), not its held tokens (4)
        let v = check(&set(2, 8, 12, 0)).unwrap_err().kind;
        assert!(
            matches!(
                v,
                ViolationKind::WrongBytes {
                    index: 0,
                    bytes: 12,
                    expected: 8
                }
            ),
            "{v}"
        );
        // a span and a piece bringing the same tokens: caught as a duplicate
        let mut p = spans_plan(KvReach::AllGather);
        let mut extra = p.groups[0].transfers[0].clone();
        extra.carries = Payload::Kv {
            group: KvGroup {
                seq: 3,
                sample: 2,
                shard: 0,
            },
            start: 0,
            end: 2,
        };
        extra.bytes = 4;
        p.groups[0].transfers.push(extra);
        let v = check(&p).unwrap_err().kind;
        assert!(
            matches!(
                v,
                ViolationKind::DuplicateKv {
                    worker: 0,
                    start: 0,
                    end: 2,
                    ..
                }
            ),
            "{v}"
        );
    }

    fn random_plan(
        kv: KvReach,
        samples: &[u32],
        cuts: &[(u32, u32)],
        exec: &[u32],
        shards: u32,
    ) -> Plan {
        let workers = [0, 1, 2, 3];
        let tokens: u64 = samples.iter().map(|&l| u64::from(l)).sum();
        // layout: pieces of the given lengths (the last stretched to the end) on workers
        let mut layout = Vec::new();
        let mut at = 0u64;
        for (k, &(len, w)) in cuts.iter().enumerate() {
            let end = if k + 1 == cuts.len() {
                tokens
            } else {
                (at + u64::from(len)).min(tokens)
            };
            if end > at {
                layout.push(Resident {
                    start: at,
                    end,
                    worker: w,
                });
            }
            at = end;
        }
        let units: Vec<_> = (0..shards)
            .flat_map(|shard| {
                let layout = &layout;
                layout.iter().enumerate().map(move |(k, r)| UnitSpec {
                    seq: 0,
                    q_start: r.start,
                    q_end: r.end,
                    shard,
                    worker: exec[(k + shard as usize) % exec.len()],
                })
            })
            .collect();
        let shape = AttnShape {
            heads_q: 4,
            heads_kv: 2,
            head_dim: 2,
            dtype_bytes: 2,
            mask: crate::cost::Mask::Causal,
        };
        let site = GroupSite {
            ga: 0,
            pool: 0,
            workers: &workers,
            shape: &shape,
            head_shards: shards,
            kv,
        };
        let seq = PlanSeq {
            id: 7,
            samples: samples.to_vec(),
            capacity: tokens as u32,
            layout,
        };
        Plan {
            version: PLAN_VERSION,
            scheme: "test".into(),
            step: 0,
            shape,
            head_shards: shards,
            groups: vec![build_group(&site, vec![seq], &units)],
        }
    }

    proptest::proptest! {
        /// Random layouts, units on random workers, 1–4 head shards: the all-gather spans
        /// plan checks and moves, per (sender, receiver) and pipeliner chunk, exactly the
        /// bytes of the one-transfer-per-piece plan, in no more transfers.
        #[test]
        fn spans_move_what_pieces_move(
            samples in proptest::collection::vec(1u32..12, 1..6),
            cuts in proptest::collection::vec((1u32..7, 0u32..4), 1..12),
            exec in proptest::collection::vec(0u32..4, 1..5),
            shards in proptest::prop_oneof![
                proptest::strategy::Just(1u32),
                proptest::strategy::Just(2),
                proptest::strategy::Just(4)
            ],
            m in 1u32..3,
        ) {
            let spans = random_plan(KvReach::AllGather, &samples, &cuts, &exec, shards);
            let pieces = random_plan(KvReach::WholeSample, &samples, &cuts, &exec, shards);
            let a = check(&spans);
            proptest::prop_assert!(a.is_ok(), "{:?}", a);
            let b = check(&pieces).unwrap();
            let a = a.unwrap();
            proptest::prop_assert_eq!(a.bytes, b.bytes);
            proptest::prop_assert!(a.transfers <= b.transfers);
            let m = if (4 / shards) % m == 0 { m } else { 1 };
            let chunks = |p: &Plan| {
                let mut out = std::collections::BTreeMap::new();
                for wp in crate::balance::libra::pipeliner::pipeline(p, &p.groups[0], m)
                    .unwrap()
                {
                    for (k, c) in wp.chunks.iter().enumerate() {
                        for x in c.dispatch.iter().chain(&c.returns) {
                            *out.entry((k, x.src, x.dst)).or_insert(0u64) += x.bytes;
                        }
                    }
                }
                out
            };
            proptest::prop_assert_eq!(chunks(&spans), chunks(&pieces));
        }
    }
}
