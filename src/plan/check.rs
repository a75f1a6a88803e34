//! The Plan checker: verifies that a [`Plan`] computes every token's attention exactly
//! once and moves every byte it needs, and nothing it does not.
//!
//! What it checks, per group, in this order (the first violation is returned):
//! 1. the shape and H are sane; sequence ids are unique in the plan; each sequence's
//!    samples fit its capacity and its layout covers its tokens exactly, on group workers;
//! 2. each unit: a unique id, a known sequence, a non-empty query range inside the
//!    samples, a valid shard, group workers, segments and KV groups (Eq. 7) that match the
//!    query range, `pairs` equal to Eq. 8's exact count under the plan's mask
//!    (`shape.mask`, [`crate::cost::Mask`]), `flops` equal to
//!    `shape.fwd_flops(pairs, h_q/H)`, and its Q-home the layout's owner of `q_start`;
//! 3. coverage: for every sequence and head shard, the units' query ranges tile the
//!    sample tokens [0, tokens) exactly — every query token of every sample attended
//!    exactly once per head;
//! 4. transfers: never to self, between group workers, from a worker that holds what it
//!    sends (a KV span: the tokens its sender holds in it, starting and ending on such
//!    tokens, each sample it touches a KV group of its own), priced exactly by
//!    [`crate::cost::AttnShape`];
//! 5. reach: every non-local piece of a unit's queries comes to its executing worker
//!    and its output goes back (one transfer per piece); every KV group a unit references
//!    reaches its executing worker as far as the mask needs it — resident tokens plus KV
//!    transfers cover the keys [lo, e) of the sample, e the largest query end of the
//!    worker's units reading the group and lo the lowest key their queries reach
//!    ([`crate::cost::Mask::key_start`]; 0 under the causal mask), with no token twice
//!    (KV transfers are deduplicated per group and destination; a planner may move keys
//!    past e, as Libra moves whole groups, or only the prefix, as DistCA does) and no key
//!    below lo moved (a sliding window's query range needs only its last W keys); no
//!    transfer is unneeded;
//! 6. the FLOP total (in exact pair·heads) equals the exact total under the mask
//!    (causal: Σ ℓ(ℓ+1)/2 · h_q).
//!
//! Pure: no I/O. The Plan's own numbers are never trusted; everything is recomputed.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use super::{
    kv_group_bytes, KvGroup, KvSpans, Payload, Plan, PlanSeq, SampleIndex, WorkUnit, WorkerId,
};

/// Workers of one group: the largest CP degree or pool `skewsim plan` builds (65,536, its
/// largest parallel degree). A validator launches each worker's head chunks, so the count
/// bounds the launches a group expands to.
pub const MAX_GROUP_WORKERS: usize = 1 << 16;

/// The first thing found wrong with a plan, and where.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("GA {ga}, pool {pool}: {kind}")]
pub struct Violation {
    /// The group's GA index.
    pub ga: u32,
    /// The group's pool index.
    pub pool: u32,
    /// What is wrong.
    pub kind: ViolationKind,
}

/// What a [`Violation`] found.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ViolationKind {
    /// The plan's shape or H is unusable.
    #[error("plan field {field} = {value}: {allowed}")]
    Shape {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What is allowed.
        allowed: &'static str,
    },
    /// A group lists more than [`MAX_GROUP_WORKERS`] workers.
    #[error(
        "workers: {workers} in one group; at most {} per group",
        MAX_GROUP_WORKERS
    )]
    TooManyWorkers {
        /// The group's worker count.
        workers: usize,
    },
    /// A sequence id appears twice in the plan.
    #[error("sequence {seq} appears more than once in the plan")]
    DuplicateSequence {
        /// The id.
        seq: u32,
    },
    /// A sequence is malformed.
    #[error("sequence {seq}: {reason}")]
    BadSequence {
        /// The id.
        seq: u32,
        /// Why.
        reason: String,
    },
    /// A unit is malformed.
    #[error("unit {unit}: {reason}")]
    BadUnit {
        /// The unit id.
        unit: u32,
        /// Why.
        reason: String,
    },
    /// A unit's causal pair count is not Eq. 8's.
    #[error("unit {unit}: pairs = {pairs}, but its segments have {expected} causal pairs (Eq. 8)")]
    WrongPairs {
        /// The unit id.
        unit: u32,
        /// Claimed.
        pairs: u64,
        /// Recomputed.
        expected: u64,
    },
    /// A unit's FLOPs are not its pairs priced by the cost model.
    #[error("unit {unit}: flops = {flops}, but the cost model gives {expected}")]
    WrongFlops {
        /// The unit id.
        unit: u32,
        /// Claimed.
        flops: f64,
        /// Recomputed.
        expected: f64,
    },
    /// Query tokens that no unit attends (for one head shard).
    #[error(
        "sequence {seq}, head shard {shard}: queries [{start}, {end}) are attended by no unit"
    )]
    Uncovered {
        /// Sequence id.
        seq: u32,
        /// Head shard.
        shard: u32,
        /// First position.
        start: u64,
        /// One past the last.
        end: u64,
    },
    /// Query tokens attended by two units (for one head shard).
    #[error(
        "sequence {seq}, head shard {shard}: queries [{start}, {end}) are attended twice \
         (units {first} and {second})"
    )]
    DoubleCovered {
        /// Sequence id.
        seq: u32,
        /// Head shard.
        shard: u32,
        /// First position.
        start: u64,
        /// One past the last.
        end: u64,
        /// One unit.
        first: u32,
        /// The other.
        second: u32,
    },
    /// A transfer that is malformed or moves something nobody needs.
    #[error("transfer {index} ({src} -> {dst}): {reason}")]
    BadTransfer {
        /// Index in the group's transfers.
        index: usize,
        /// Sender.
        src: WorkerId,
        /// Receiver.
        dst: WorkerId,
        /// Why.
        reason: String,
    },
    /// A transfer's bytes are not the cost model's.
    #[error("transfer {index}: bytes = {bytes}, but the cost model gives {expected}")]
    WrongBytes {
        /// Index in the group's transfers.
        index: usize,
        /// Claimed.
        bytes: u64,
        /// Recomputed.
        expected: u64,
    },
    /// Part of a unit's queries never reaches its worker, or its output never returns.
    #[error(
        "unit {unit}: {what} of queries [{start}, {end}) held by worker {home} never \
         moves between it and executing worker {worker}"
    )]
    MissingQ {
        /// The unit id.
        unit: u32,
        /// `Q` or `output`.
        what: &'static str,
        /// First position.
        start: u64,
        /// One past the last.
        end: u64,
        /// The worker holding those queries.
        home: WorkerId,
        /// The executing worker.
        worker: WorkerId,
    },
    /// Tokens of a referenced KV group never reach the executing worker.
    #[error(
        "unit {unit} on worker {worker} reads KV group (seq {}, sample {}, shard {}), but \
         its tokens [{start}, {end}) never reach that worker",
        group.seq, group.sample, group.shard
    )]
    MissingKv {
        /// The unit id.
        unit: u32,
        /// The executing worker.
        worker: WorkerId,
        /// The group.
        group: KvGroup,
        /// First sample-local token.
        start: u32,
        /// One past the last.
        end: u32,
    },
    /// Tokens of a KV group reach a worker twice (not deduplicated, or already resident).
    #[error(
        "KV group (seq {}, sample {}, shard {}) tokens [{start}, {end}) reach worker \
         {worker} twice (transfers must be deduplicated per group and destination and \
         skip resident tokens)",
        group.seq, group.sample, group.shard
    )]
    DuplicateKv {
        /// The receiving worker.
        worker: WorkerId,
        /// The group.
        group: KvGroup,
        /// First sample-local token.
        start: u32,
        /// One past the last.
        end: u32,
    },
    /// KV tokens below the lowest key a worker's queries reach under the mask.
    #[error(
        "KV group (seq {}, sample {}, shard {}) tokens [{start}, {end}) reach worker \
         {worker}, but its queries reach no key below {lo} under the mask",
        group.seq, group.sample, group.shard
    )]
    KvOutOfReach {
        /// The receiving worker.
        worker: WorkerId,
        /// The group.
        group: KvGroup,
        /// First sample-local token.
        start: u32,
        /// One past the last.
        end: u32,
        /// The lowest key the worker's units on the group reach.
        lo: u32,
    },
    /// The FLOP total is not the exact total under the mask.
    #[error("total work = {got} pair·heads, but the sequences' exact total is {expected}")]
    FlopTotal {
        /// Σ units pairs · h_q/H.
        got: u128,
        /// Σ sequences Σ pairs(ℓ) · h_q (causal: Σ ℓ(ℓ+1)/2 · h_q).
        expected: u128,
    },
    /// A worker holds more tokens at one GA index than a memory-bounded planner allows
    /// ([`check_resident`]).
    #[error("worker {worker} holds {tokens} tokens at this GA index, over the cap of {cap}")]
    OverResident {
        /// The worker.
        worker: WorkerId,
        /// Its resident tokens over the GA index's groups.
        tokens: u64,
        /// The cap.
        cap: u64,
    },
}

/// What a plan that passed holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckSummary {
    /// Groups (GA index × pool).
    pub groups: usize,
    /// Packed sequences.
    pub sequences: usize,
    /// Work units.
    pub units: usize,
    /// Transfers.
    pub transfers: usize,
    /// Total forward FLOPs of the units.
    pub flops: f64,
    /// Total bytes moved.
    pub bytes: u64,
}

/// Check that no worker holds more than `cap` tokens (Q, K and V before attention: its
/// layout ranges over every group) at any one GA index — a memory bound such as
/// Megatron's `max_seqlen_per_dp_cp_rank`; the first worker over it, by (GA index, worker).
/// [`check`] runs it on Megatron dynamic-CP plans at their own S.
pub fn check_resident(plan: &Plan, cap: u64) -> Result<(), Violation> {
    let mut held: std::collections::BTreeMap<(u32, WorkerId), (u64, u32)> = Default::default();
    for g in &plan.groups {
        for r in plan_layouts(g) {
            let e = held.entry((g.ga, r.worker)).or_insert((0, g.pool));
            e.0 += r.end.saturating_sub(r.start);
        }
    }
    match held.into_iter().find(|(_, (t, _))| *t > cap) {
        None => Ok(()),
        Some(((ga, worker), (tokens, pool))) => Err(Violation {
            ga,
            pool,
            kind: ViolationKind::OverResident {
                worker,
                tokens,
                cap,
            },
        }),
    }
}

fn plan_layouts(g: &super::Group) -> impl Iterator<Item = &super::Resident> {
    g.sequences.iter().flat_map(|s| &s.layout)
}

/// Check a plan; the first violation found, or a summary of a correct plan.
pub fn check(plan: &Plan) -> Result<CheckSummary, Violation> {
    let first = plan
        .groups
        .first()
        .map(|g| (g.ga, g.pool))
        .unwrap_or((0, 0));
    let shape_err = |field, value: u32, allowed| Violation {
        ga: first.0,
        pool: first.1,
        kind: ViolationKind::Shape {
            field,
            value: u64::from(value),
            allowed,
        },
    };
    let s = &plan.shape;
    // bounds keep every byte count of a u32-token sequence inside u64
    if s.heads_q == 0 || s.heads_q > 1024 {
        return Err(shape_err("shape.heads_q", s.heads_q, "1 to 1024"));
    }
    if s.heads_kv == 0 || s.heads_q % s.heads_kv != 0 {
        return Err(shape_err(
            "shape.heads_kv",
            s.heads_kv,
            "at least 1 and dividing heads_q",
        ));
    }
    if s.head_dim == 0 || s.head_dim > 4096 {
        return Err(shape_err("shape.head_dim", s.head_dim, "1 to 4096"));
    }
    if s.dtype_bytes == 0 || s.dtype_bytes > 8 {
        return Err(shape_err("shape.dtype_bytes", s.dtype_bytes, "1 to 8"));
    }
    if plan.head_shards == 0 || s.heads_q % plan.head_shards != 0 {
        return Err(shape_err(
            "head_shards",
            plan.head_shards,
            "at least 1 and dividing shape.heads_q",
        ));
    }

    let mut seen_seqs = HashSet::new();
    let mut summary = CheckSummary {
        groups: plan.groups.len(),
        sequences: 0,
        units: 0,
        transfers: 0,
        flops: 0.0,
        bytes: 0,
    };
    let mut got: u128 = 0;
    let mut expected: u128 = 0;
    for g in &plan.groups {
        let at = |kind| Violation {
            ga: g.ga,
            pool: g.pool,
            kind,
        };
        let (gg, ge) = check_group(plan, g, &mut seen_seqs).map_err(at)?;
        got += gg;
        expected += ge;
        summary.sequences += g.sequences.len();
        summary.units += g.units.len();
        summary.transfers += g.transfers.len();
        summary.flops += g.units.iter().map(|u| u.flops).sum::<f64>();
        summary.bytes = g
            .transfers
            .iter()
            .fold(summary.bytes, |a, t| a.saturating_add(t.bytes));
    }
    if got != expected {
        return Err(Violation {
            ga: first.0,
            pool: first.1,
            kind: ViolationKind::FlopTotal { got, expected },
        });
    }
    if let Some(cap) = dcp_rank_cap(plan) {
        check_resident(plan, cap)?;
    }
    Ok(summary)
}

/// Megatron's dynamic CP (scheme `megatron-dcp`) sizes every micro-batch's sequence at
/// c · S over its c ranks, S = `max_seqlen_per_dp_cp_rank`: the tokens the memory model
/// prices one rank at (`megatron_dcp::rank_batches` gives each rank's micro-batch capacity
/// S). The smallest S of the plan, which [`check`] holds every rank to; `None` for other
/// schemes.
fn dcp_rank_cap(plan: &Plan) -> Option<u64> {
    if plan.scheme != "megatron-dcp" {
        return None;
    }
    plan.groups
        .iter()
        .flat_map(|g| {
            let c = g.workers.len().max(1) as u64;
            g.sequences.iter().map(move |s| u64::from(s.capacity) / c)
        })
        .min()
}

/// A sequence with its indexes.
struct SeqView<'a> {
    seq: &'a PlanSeq,
    samples: SampleIndex,
}

impl SeqView<'_> {
    /// The layout pieces of positions [start, end): (start, end, worker).
    fn pieces(&self, start: u64, end: u64) -> Vec<(u64, u64, WorkerId)> {
        let layout = &self.seq.layout;
        let mut i = layout.partition_point(|r| r.end <= start);
        let mut out = Vec::new();
        while i < layout.len() && layout[i].start < end {
            let r = layout[i];
            out.push((start.max(r.start), end.min(r.end), r.worker));
            i += 1;
        }
        out
    }

    /// The worker holding all of positions [start, end), if one does.
    fn holder(&self, start: u64, end: u64) -> Option<WorkerId> {
        match self.pieces(start, end).as_slice() {
            [(s, e, w)] if *s == start && *e == end => Some(*w),
            _ => None,
        }
    }
}

type Kind = ViolationKind;

fn bad_seq(seq: u32, reason: String) -> Kind {
    Kind::BadSequence { seq, reason }
}

fn bad_unit(unit: u32, reason: String) -> Kind {
    Kind::BadUnit { unit, reason }
}

/// A group's sequences with their indexes, by id.
type Seqs<'a> = HashMap<u32, SeqView<'a>>;
/// (unit, the non-executing end).
type QKey = (u32, WorkerId);
/// (start, end, transfer index) of KV a worker receives.
type KvPieces = Vec<(u32, u32, usize)>;

/// What a group's transfers deliver: queries in and outputs back per (unit, home), KV
/// pieces per (KV group, receiver).
#[derive(Default)]
struct Moved {
    q_in: HashMap<QKey, Vec<(u64, u64)>>,
    o_out: HashMap<QKey, Vec<(u64, u64)>>,
    kv_in: HashMap<(KvGroup, WorkerId), KvPieces>,
}

/// Check one group; returns (Σ units pair·heads, Σ sequences exact pair·heads). One
/// function per invariant, in order: sequences and layouts, units, coverage, transfers,
/// then what each unit must receive (queries, outputs, K/V reach) and nothing more.
fn check_group(
    plan: &Plan,
    g: &super::Group,
    seen_seqs: &mut HashSet<u32>,
) -> Result<(u128, u128), Kind> {
    if g.workers.len() > MAX_GROUP_WORKERS {
        return Err(Kind::TooManyWorkers {
            workers: g.workers.len(),
        });
    }
    let workers: HashSet<WorkerId> = g.workers.iter().copied().collect();
    let (seqs, expected) = check_sequences(plan, g, &workers, seen_seqs)?;
    let (units, got) = check_units(plan, g, &workers, &seqs)?;
    check_coverage(g, plan.head_shards)?;
    let mut moved = check_transfers(plan, g, &workers, &seqs, &units)?;
    let kv_done = check_received(plan, g, &seqs, &mut moved)?;
    check_nothing_extra(g, &moved, &kv_done)?;
    Ok((got, expected))
}

/// Sequences: each once in the plan, within capacity, laid out contiguously on the
/// group's workers; returns them indexed and their exact pair·heads.
fn check_sequences<'a>(
    plan: &Plan,
    g: &'a super::Group,
    workers: &HashSet<WorkerId>,
    seen_seqs: &mut HashSet<u32>,
) -> Result<(Seqs<'a>, u128), Kind> {
    let shape = &plan.shape;
    let mut seqs: HashMap<u32, SeqView> = HashMap::new();
    let mut expected: u128 = 0;
    for s in &g.sequences {
        if !seen_seqs.insert(s.id) {
            return Err(Kind::DuplicateSequence { seq: s.id });
        }
        let tokens = s.tokens();
        if tokens > u64::from(s.capacity) {
            return Err(bad_seq(
                s.id,
                format!(
                    "samples hold {tokens} tokens, more than capacity {}",
                    s.capacity
                ),
            ));
        }
        let mut at = 0u64;
        for r in &s.layout {
            if r.start != at || r.end <= r.start {
                return Err(bad_seq(
                    s.id,
                    format!(
                        "layout range [{}, {}) does not continue at position {at} or is empty",
                        r.start, r.end
                    ),
                ));
            }
            if !workers.contains(&r.worker) {
                return Err(bad_seq(
                    s.id,
                    format!("layout worker {} is not in the group", r.worker),
                ));
            }
            at = r.end;
        }
        if at != tokens {
            return Err(bad_seq(
                s.id,
                format!("layout ends at position {at}, but the samples hold {tokens} tokens"),
            ));
        }
        expected += u128::from(s.pairs(&shape.mask)) * u128::from(shape.heads_q);
        seqs.insert(
            s.id,
            SeqView {
                seq: s,
                samples: SampleIndex::new(&s.samples),
            },
        );
    }

    Ok((seqs, expected))
}

/// Units: ids unique, on the group's workers, query ranges, segments, KV groups, pairs
/// and FLOPs exactly as recomputed; returns them by id and their pair·heads.
fn check_units<'a>(
    plan: &Plan,
    g: &'a super::Group,
    workers: &HashSet<WorkerId>,
    seqs: &Seqs,
) -> Result<(HashMap<u32, &'a WorkUnit>, u128), Kind> {
    let shape = &plan.shape;
    let h = plan.head_shards;
    let w = plan.heads_per_shard();
    let mut units: HashMap<u32, &WorkUnit> = HashMap::new();
    let mut got: u128 = 0;
    for u in &g.units {
        if units.insert(u.id, u).is_some() {
            return Err(bad_unit(u.id, "id used twice in the group".into()));
        }
        let Some(sv) = seqs.get(&u.seq) else {
            return Err(bad_unit(
                u.id,
                format!("sequence {} is not in the group", u.seq),
            ));
        };
        let tokens = sv.samples.tokens();
        if u.q_start >= u.q_end || u.q_end > tokens {
            return Err(bad_unit(
                u.id,
                format!(
                    "query range [{}, {}) is empty or outside the samples [0, {tokens})",
                    u.q_start, u.q_end
                ),
            ));
        }
        if u.shard >= h {
            return Err(bad_unit(
                u.id,
                format!("head shard {} is not below H = {h}", u.shard),
            ));
        }
        for (what, wk) in [("worker", u.worker), ("q_home", u.q_home)] {
            if !workers.contains(&wk) {
                return Err(bad_unit(u.id, format!("{what} {wk} is not in the group")));
            }
        }
        let segs = sv.samples.segments(u.q_start, u.q_end);
        if segs != u.segments {
            return Err(bad_unit(
                u.id,
                format!(
                    "segments {:?} do not match query range [{}, {}) (expected {:?})",
                    u.segments, u.q_start, u.q_end, segs
                ),
            ));
        }
        let groups: Vec<KvGroup> = segs
            .iter()
            .map(|sg| KvGroup {
                seq: u.seq,
                sample: sg.sample,
                shard: u.shard,
            })
            .collect();
        if groups != u.kv_groups {
            return Err(bad_unit(
                u.id,
                format!(
                    "kv_groups {:?} are not the groups its segments intersect (Eq. 7): {:?}",
                    u.kv_groups, groups
                ),
            ));
        }
        let pairs: u64 = segs
            .iter()
            .map(|sg| {
                shape
                    .mask
                    .range_pairs(u64::from(sg.start), u64::from(sg.end))
            })
            .sum();
        if pairs != u.pairs {
            return Err(Kind::WrongPairs {
                unit: u.id,
                pairs: u.pairs,
                expected: pairs,
            });
        }
        let flops = shape.fwd_flops(pairs, w);
        if (u.flops - flops).abs() > 1e-9 * flops.abs().max(1.0) {
            return Err(Kind::WrongFlops {
                unit: u.id,
                flops: u.flops,
                expected: flops,
            });
        }
        let owner = sv.pieces(u.q_start, u.q_start + 1)[0].2;
        if owner != u.q_home {
            return Err(bad_unit(
                u.id,
                format!(
                    "q_home = {}, but the layout puts position {} on worker {owner}",
                    u.q_home, u.q_start
                ),
            ));
        }
        got += u128::from(pairs) * u128::from(w);
    }

    Ok((units, got))
}

/// Coverage: every (sequence, head shard) has each query attended exactly once.
fn check_coverage(g: &super::Group, h: u32) -> Result<(), Kind> {
    type Ranges = Vec<(u64, u64, u32)>; // (q_start, q_end, unit)
    let mut ranges: HashMap<(u32, u32), Ranges> = HashMap::new();
    for u in &g.units {
        ranges
            .entry((u.seq, u.shard))
            .or_default()
            .push((u.q_start, u.q_end, u.id));
    }
    for s in &g.sequences {
        let tokens = s.tokens();
        for shard in 0..h {
            let mut v = ranges.remove(&(s.id, shard)).unwrap_or_default();
            v.sort_unstable();
            let mut at = 0u64;
            let mut last = u32::MAX;
            for &(a, e, id) in &v {
                if a > at {
                    return Err(Kind::Uncovered {
                        seq: s.id,
                        shard,
                        start: at,
                        end: a,
                    });
                }
                if a < at {
                    return Err(Kind::DoubleCovered {
                        seq: s.id,
                        shard,
                        start: a,
                        end: at.min(e),
                        first: last,
                        second: id,
                    });
                }
                at = e;
                last = id;
            }
            if at < tokens {
                return Err(Kind::Uncovered {
                    seq: s.id,
                    shard,
                    start: at,
                    end: tokens,
                });
            }
        }
    }

    Ok(())
}

/// Transfers: between two of the group's workers, each payload where its sender holds it
/// and its bytes exactly as recomputed; returns what they deliver.
fn check_transfers(
    plan: &Plan,
    g: &super::Group,
    workers: &HashSet<WorkerId>,
    seqs: &Seqs,
    units: &HashMap<u32, &WorkUnit>,
) -> Result<Moved, Kind> {
    let shape = &plan.shape;
    let h = plan.head_shards;
    let w = plan.heads_per_shard();
    let mut moved = Moved::default();
    let Moved { q_in, o_out, kv_in } = &mut moved;
    let spans = KvSpans::new(&g.sequences);
    for (i, t) in g.transfers.iter().enumerate() {
        let bad = |reason: String| Kind::BadTransfer {
            index: i,
            src: t.src,
            dst: t.dst,
            reason,
        };
        if t.src == t.dst {
            return Err(bad("moves nothing: source = destination".into()));
        }
        for wk in [t.src, t.dst] {
            if !workers.contains(&wk) {
                return Err(bad(format!("worker {wk} is not in the group")));
            }
        }
        let expected_bytes = match t.carries {
            Payload::Q { unit, start, end } | Payload::Output { unit, start, end } => {
                let is_q = matches!(t.carries, Payload::Q { .. });
                let Some(u) = units.get(&unit) else {
                    return Err(bad(format!("unit {unit} is not in the group")));
                };
                if start >= end || start < u.q_start || end > u.q_end {
                    return Err(bad(format!(
                        "range [{start}, {end}) is empty or outside unit {unit}'s queries"
                    )));
                }
                let (exec, home) = if is_q { (t.dst, t.src) } else { (t.src, t.dst) };
                if exec != u.worker {
                    return Err(bad(format!(
                        "unit {unit} runs on worker {}, not {exec}",
                        u.worker
                    )));
                }
                if seqs[&u.seq].holder(start, end) != Some(home) {
                    return Err(bad(format!(
                        "worker {home} does not hold queries [{start}, {end})"
                    )));
                }
                let map = if is_q { &mut *q_in } else { &mut *o_out };
                map.entry((unit, home)).or_default().push((start, end));
                shape.q_bytes(end - start, w)
            }
            Payload::Kv { group, start, end } => {
                if group.shard >= h {
                    return Err(bad(format!(
                        "KV group (sample {}, shard {}) does not exist",
                        group.sample, group.shard
                    )));
                }
                // a span: the sender's tokens in it, per sample (each its own KV group)
                let pieces = spans.pieces(t.src, group, start, end).map_err(bad)?;
                let mut tokens = 0u64;
                for sg in pieces {
                    tokens += u64::from(sg.end - sg.start);
                    let grp = KvGroup {
                        sample: sg.sample,
                        ..group
                    };
                    kv_in
                        .entry((grp, t.dst))
                        .or_default()
                        .push((sg.start, sg.end, i));
                }
                kv_group_bytes(shape, h, group.shard, tokens)
            }
        };
        if t.bytes != expected_bytes {
            return Err(Kind::WrongBytes {
                index: i,
                bytes: t.bytes,
                expected: expected_bytes,
            });
        }
    }

    Ok(moved)
}

/// What each unit must receive: the queries and outputs its worker does not hold moved
/// from and to their home, and the K/V its queries reach under the mask (no key twice,
/// none below the reach); consumes what is matched from `moved` and returns the
/// (KV group, worker) pairs that were read.
fn check_received(
    plan: &Plan,
    g: &super::Group,
    seqs: &Seqs,
    moved: &mut Moved,
) -> Result<HashSet<(KvGroup, WorkerId)>, Kind> {
    let shape = &plan.shape;
    // need per (KV group, executing worker): keys [lo, e) for the largest sample-local
    // query end e of the worker's units reading the group and the lowest key lo they reach
    let mut kv_need: HashMap<(KvGroup, WorkerId), (u32, u32)> = HashMap::new();
    for u in &g.units {
        for (sg, &grp) in u.segments.iter().zip(&u.kv_groups) {
            let lo = shape.mask.key_start(u64::from(sg.start)) as u32;
            let n = kv_need.entry((grp, u.worker)).or_insert((lo, 0));
            *n = (n.0.min(lo), n.1.max(sg.end));
        }
    }
    let mut kv_done: HashSet<(KvGroup, WorkerId)> = HashSet::new();
    for u in &g.units {
        let sv = &seqs[&u.seq];
        check_q_moved(u, sv, moved)?;
        for &grp in &u.kv_groups {
            if !kv_done.insert((grp, u.worker)) {
                continue;
            }
            let j = grp.sample as usize;
            let (lo, need) = kv_need.get(&(grp, u.worker)).copied().unwrap_or((0, 0));
            let (s0, s1) = sv.samples.span(j);
            let mut iv: Vec<(u32, u32)> = sv
                .pieces(s0, s1)
                .into_iter()
                .filter(|p| p.2 == u.worker)
                .map(|(a, e, _)| ((a - s0) as u32, (e - s0) as u32))
                .collect();
            if let Some(v) = moved.kv_in.get(&(grp, u.worker)) {
                if let Some(&(a, e, _)) = v.iter().filter(|p| p.0 < lo).min() {
                    return Err(Kind::KvOutOfReach {
                        worker: u.worker,
                        group: grp,
                        start: a,
                        end: e.min(lo),
                        lo,
                    });
                }
                iv.extend(v.iter().map(|&(a, e, _)| (a, e)));
            }
            iv.sort_unstable();
            let mut at = 0u32;
            for (a, e) in iv {
                if a > at.max(lo) && at.max(lo) < need {
                    return Err(Kind::MissingKv {
                        unit: u.id,
                        worker: u.worker,
                        group: grp,
                        start: at.max(lo),
                        end: a.min(need),
                    });
                }
                if a < at {
                    return Err(Kind::DuplicateKv {
                        worker: u.worker,
                        group: grp,
                        start: a,
                        end: at.min(e),
                    });
                }
                at = at.max(e);
            }
            if at < need {
                return Err(Kind::MissingKv {
                    unit: u.id,
                    worker: u.worker,
                    group: grp,
                    start: at.max(lo),
                    end: need,
                });
            }
        }
    }
    Ok(kv_done)
}

/// A unit's queries and outputs held elsewhere are moved from and back to their home.
fn check_q_moved(u: &WorkUnit, sv: &SeqView, moved: &mut Moved) -> Result<(), Kind> {
    let pieces = sv.pieces(u.q_start, u.q_end);
    for (what, map) in [("Q", &mut moved.q_in), ("output", &mut moved.o_out)] {
        let mut need: HashMap<WorkerId, Vec<(u64, u64)>> = HashMap::new();
        for &(a, e, home) in &pieces {
            if home != u.worker {
                need.entry(home).or_default().push((a, e));
            }
        }
        let mut homes: Vec<_> = need.into_iter().collect();
        homes.sort_unstable();
        for (home, want) in homes {
            let mut have = map.remove(&(u.id, home)).unwrap_or_default();
            have.sort_unstable();
            if let Some(&(a, e)) = want.iter().find(|p| !have.contains(p)) {
                return Err(Kind::MissingQ {
                    unit: u.id,
                    what,
                    start: a,
                    end: e,
                    home,
                    worker: u.worker,
                });
            }
            if have != want {
                // every needed piece is there, so something moves twice or too much
                map.insert((u.id, home), have);
            }
        }
    }
    Ok(())
}

/// Nothing moved that no unit needs (or moved twice): the first such transfer.
fn check_nothing_extra(
    g: &super::Group,
    moved: &Moved,
    kv_done: &HashSet<(KvGroup, WorkerId)>,
) -> Result<(), Kind> {
    let mut leftover: Vec<(usize, String)> = Vec::new();
    for ((unit, home), v) in moved.q_in.iter().chain(moved.o_out.iter()) {
        if !v.is_empty() {
            leftover.push((
                transfer_index(g, *unit, *home),
                format!(
                    "unit {unit} does not need these queries or output moved with worker \
                     {home} (or they move twice)"
                ),
            ));
        }
    }
    for ((grp, dst), v) in &moved.kv_in {
        if !kv_done.contains(&(*grp, *dst)) {
            leftover.push((
                v[0].2,
                format!(
                    "no unit on worker {dst} reads KV group (seq {}, sample {}, shard {})",
                    grp.seq, grp.sample, grp.shard
                ),
            ));
        }
    }
    if let Some((index, reason)) = leftover.into_iter().min_by_key(|l| l.0) {
        let t = &g.transfers[index];
        return Err(Kind::BadTransfer {
            index,
            src: t.src,
            dst: t.dst,
            reason,
        });
    }
    Ok(())
}

/// The first Q or output transfer of `unit` with `home` at one end.
fn transfer_index(g: &super::Group, unit: u32, home: WorkerId) -> usize {
    g.transfers
        .iter()
        .position(|t| match t.carries {
            Payload::Q { unit: u, .. } => u == unit && t.src == home,
            Payload::Output { unit: u, .. } => u == unit && t.dst == home,
            Payload::Kv { .. } => false,
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::AttnShape;
    use crate::plan::{Group, Resident, Segment, Transfer, PLAN_VERSION};

    /// A plan built by hand: one sequence of samples [2, 2] laid out on workers 0 and 1;
    /// both units run on worker 0, so unit 1 needs its Q and sample 1's KV from worker 1
    /// and sends its output back. 2 query heads, 1 KV head, d = 1, 1 byte per element.
    fn hand_plan() -> Plan {
        let shape = AttnShape {
            heads_q: 2,
            heads_kv: 1,
            head_dim: 1,
            dtype_bytes: 1,
            mask: crate::cost::Mask::Causal,
        };
        let unit = |id: u32, a: u64, sample: u32, home: u32| WorkUnit {
            id,
            seq: 0,
            q_start: a,
            q_end: a + 2,
            shard: 0,
            segments: vec![Segment {
                sample,
                start: 0,
                end: 2,
            }],
            kv_groups: vec![KvGroup {
                seq: 0,
                sample,
                shard: 0,
            }],
            pairs: 3,
            flops: 3.0 * 2.0 * 4.0,
            q_home: home,
            worker: 0,
        };
        let group1 = KvGroup {
            seq: 0,
            sample: 1,
            shard: 0,
        };
        Plan {
            version: PLAN_VERSION,
            scheme: "hand".into(),
            step: 0,
            shape,
            head_shards: 1,
            groups: vec![Group {
                ga: 0,
                pool: 0,
                workers: vec![0, 1],
                sequences: vec![PlanSeq {
                    id: 0,
                    samples: vec![2, 2],
                    capacity: 4,
                    layout: vec![
                        Resident {
                            start: 0,
                            end: 2,
                            worker: 0,
                        },
                        Resident {
                            start: 2,
                            end: 4,
                            worker: 1,
                        },
                    ],
                }],
                units: vec![unit(0, 0, 0, 0), unit(1, 2, 1, 1)],
                transfers: vec![
                    // 2 tokens × 2 heads × 1 × 1 B
                    Transfer {
                        src: 1,
                        dst: 0,
                        bytes: 4,
                        carries: Payload::Q {
                            unit: 1,
                            start: 2,
                            end: 4,
                        },
                    },
                    // K and V: 2 × 2 tokens × 1 KV head × 1 × 1 B
                    Transfer {
                        src: 1,
                        dst: 0,
                        bytes: 4,
                        carries: Payload::Kv {
                            group: group1,
                            start: 0,
                            end: 2,
                        },
                    },
                    Transfer {
                        src: 0,
                        dst: 1,
                        bytes: 4,
                        carries: Payload::Output {
                            unit: 1,
                            start: 2,
                            end: 4,
                        },
                    },
                ],
            }],
        }
    }

    fn kind(p: &Plan) -> ViolationKind {
        check(p).unwrap_err().kind
    }

    #[test]
    fn hand_plan_passes_with_hand_totals() {
        let s = check(&hand_plan()).unwrap();
        assert_eq!((s.units, s.transfers, s.bytes), (2, 3, 12));
        assert_eq!(s.flops, 48.0);
    }

    /// The hand plan with unit 1 cut to query 0 of sample 1 (position 2) and a third unit,
    /// on worker 1, taking query 1 (position 3): worker 0 needs only key 0 of sample 1.
    fn prefix_plan(kv_end: Option<u32>) -> Plan {
        let mut p = hand_plan();
        let g = &mut p.groups[0];
        let mut u2 = g.units[1].clone();
        g.units[1].q_end = 3;
        g.units[1].segments[0].end = 1;
        g.units[1].pairs = 1;
        g.units[1].flops = 8.0;
        u2.id = 2;
        u2.q_start = 3;
        u2.segments[0].start = 1;
        u2.pairs = 2;
        u2.flops = 16.0;
        u2.worker = 1;
        g.units.push(u2);
        // Q and output of one token (2 B each); KV of `kv_end` keys (2 B per key)
        g.transfers = vec![
            Transfer {
                src: 1,
                dst: 0,
                bytes: 2,
                carries: Payload::Q {
                    unit: 1,
                    start: 2,
                    end: 3,
                },
            },
            Transfer {
                src: 0,
                dst: 1,
                bytes: 2,
                carries: Payload::Output {
                    unit: 1,
                    start: 2,
                    end: 3,
                },
            },
        ];
        if let Some(e) = kv_end {
            g.transfers.push(Transfer {
                src: 1,
                dst: 0,
                bytes: 2 * u64::from(e),
                carries: Payload::Kv {
                    group: KvGroup {
                        seq: 0,
                        sample: 1,
                        shard: 0,
                    },
                    start: 0,
                    end: e,
                },
            });
        }
        p
    }

    #[test]
    fn kv_needs_the_causal_prefix_only() {
        // key 0 suffices; the whole sample is tolerated; nothing is caught
        assert_eq!(check(&prefix_plan(Some(1))).unwrap().bytes, 6);
        assert_eq!(check(&prefix_plan(Some(2))).unwrap().bytes, 8);
        assert_eq!(
            kind(&prefix_plan(None)),
            ViolationKind::MissingKv {
                unit: 1,
                worker: 0,
                group: KvGroup {
                    seq: 0,
                    sample: 1,
                    shard: 0
                },
                start: 0,
                end: 1
            }
        );
    }

    #[test]
    fn hand_plan_violations() {
        let mut p = hand_plan();
        p.groups[0].units[1].q_home = 0;
        assert!(matches!(kind(&p), ViolationKind::BadUnit { unit: 1, .. }));

        let mut p = hand_plan();
        p.groups[0].transfers[1].src = 0;
        assert!(
            matches!(kind(&p), ViolationKind::BadTransfer { index: 1, ref reason, .. } if reason.contains("source = destination"))
        );

        let mut p = hand_plan();
        p.groups[0].transfers.remove(2);
        assert!(matches!(
            kind(&p),
            ViolationKind::MissingQ {
                unit: 1,
                what: "output",
                home: 1,
                worker: 0,
                ..
            }
        ));

        // a KV group nobody on worker 1 reads
        let mut p = hand_plan();
        p.groups[0].transfers.push(Transfer {
            src: 0,
            dst: 1,
            bytes: 4,
            carries: Payload::Kv {
                group: KvGroup {
                    seq: 0,
                    sample: 0,
                    shard: 0,
                },
                start: 0,
                end: 2,
            },
        });
        assert!(
            matches!(kind(&p), ViolationKind::BadTransfer { index: 3, ref reason, .. } if reason.contains("no unit on worker 1"))
        );

        // KV sent by a worker that does not hold it
        let mut p = hand_plan();
        p.groups[0].workers.push(2);
        p.groups[0].transfers[1].src = 2;
        assert!(
            matches!(kind(&p), ViolationKind::BadTransfer { index: 1, ref reason, .. } if reason.contains("does not hold"))
        );

        let mut p = hand_plan();
        p.head_shards = 3;
        assert!(matches!(
            kind(&p),
            ViolationKind::Shape {
                field: "head_shards",
                value: 3,
                ..
            }
        ));

        let mut p = hand_plan();
        let mut g = p.groups[0].clone();
        g.ga = 1;
        p.groups.push(g);
        let v = check(&p).unwrap_err();
        assert_eq!(
            (v.ga, v.kind.clone()),
            (1, ViolationKind::DuplicateSequence { seq: 0 })
        );
        assert!(v
            .to_string()
            .starts_with("GA 1, pool 0: sequence 0 appears more than once"));
    }
}
