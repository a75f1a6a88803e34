//! DistCA's step as a [`Plan`]: the scheduler's per-server tasks as units, its moves as
//! transfers.
//!
//! Owns the lowering only; the scheduler and the ping-pong split are the parent module's,
//! bytes and FLOPs `plan::build`'s (through [`crate::cost::AttnShape`]). No I/O.
//!
//! # Mapping
//! GBS packed sequences on DP replicas × CP ranks, the baseline's layout (paper: in-place
//! attention servers keep the linear layers where they are): GA = GBS/DP, batch index b
//! runs at GA index b / DP on replica b mod DP, laid out over its CP group (workers
//! replica·CP … + CP − 1), ⌈L/CP⌉ tokens per rank ([`seq_layout`]: the repository's
//! mirrored head/tail chunks for its scheduler, contiguous slices — [`contiguous_layout`],
//! as Ulysses — for the tight one; a document may span ranks). All DP·CP workers are one
//! attention pool: each GA index is one group over every worker, scheduled on its own
//! ([`schedule_step`], or both nano-batches of [`schedule_nanos`], whose units all land in
//! the same group: nano-batch 0's first). Every query range of every task is one
//! unit over all heads (H = 1; a head+tail shard is two units) on the task's server; its
//! queries lie on one rank (the task's home). A moved range brings its Q from the home
//! and sends the output back; K and V move only as far as causality needs — keys
//! [0, last query + 1), the scheduler's `kv_prefix` ([`KvReach::Reached`]) — from
//! whichever ranks hold them, once per (sample, destination). A unit left in place on a
//! later CP rank receives the prefix held by earlier ranks the same way. So the plan's
//! Q and output bytes are the scheduler's and its KV bytes at most the scheduler's (moved
//! and in-place; the scheduler charges the moved tasks of one sample on one server their
//! longest prefix once, as here, so they differ only where a server both keeps a piece of
//! a sample in place and receives another, or with ping-pong, where both nano-batches'
//! tasks of a sample on one server share one KV transfer).

use super::pingpong::NanoTable;
use super::{
    reference, schedule_nanos, schedule_step, DistcaConfig, DistcaSchedule, DistcaScheduler,
};
use crate::balance::ulysses::{check_fits, cp_group, ga_of};
use crate::error::{invalid, Result};
use crate::plan::build::{build_group, contiguous_layout, GroupSite, KvReach, UnitSpec};
use crate::plan::{Group, Plan, PlanSeq, Resident, SampleIndex, WorkerId, PLAN_VERSION};
use crate::workload::PackedSeq;
use rayon::prelude::*;

/// The plan of one step, and the schedules it lowered.
#[derive(Clone, Debug, PartialEq)]
pub struct DistcaPlan {
    /// The Plan.
    pub plan: Plan,
    /// Per GA index, its schedule (two with ping-pong: nano-batch 0, then 1).
    pub schedules: Vec<Vec<DistcaSchedule>>,
    /// Which nano-batch each unit and transfer belongs to (a side table; the Plan IR is
    /// unchanged).
    pub nano: NanoTable,
}

/// [`plan_step_cp`] with CP = 1: DP servers, each holding whole packed sequences.
pub fn plan_step(
    step: u64,
    batch: &[PackedSeq],
    dp: u32,
    cfg: &DistcaConfig,
    ping_pong: bool,
) -> Result<DistcaPlan> {
    plan_step_cp(step, batch, dp, 1, cfg, ping_pong)
}

/// Plan one step of DistCA. `batch` is the step's global batch in loader order; `dp`
/// replicas of `cp` ranks, DP·CP attention servers; `ping_pong` splits every micro-batch
/// into two nano-batches scheduled apart. Errors: DP or CP of 0, GBS not a multiple of DP,
/// a sequence over its capacity.
pub fn plan_step_cp(
    step: u64,
    batch: &[PackedSeq],
    dp: u32,
    cp: u32,
    cfg: &DistcaConfig,
    ping_pong: bool,
) -> Result<DistcaPlan> {
    let cfg = DistcaConfig::new(cfg.shape, cfg.epsilon, cfg.tile)?.with_scheduler(cfg.scheduler);
    if cp == 0 {
        return Err(invalid("cp", cp, "at least 1 rank per replica"));
    }
    let ga = ga_of(batch.len(), dp, cp)?;
    check_fits(batch)?;
    let workers: Vec<WorkerId> = (0..dp * cp).collect();
    // GA indices are scheduled apart: in parallel, gathered in order (the first error in
    // GA order is the one returned).
    let per_ga: Vec<Result<GaGroup>> = batch
        .par_chunks(dp as usize)
        .enumerate()
        .map(|(g, seqs)| ga_group(g as u32, seqs, dp, cp, &workers, &cfg, ping_pong))
        .collect();
    let mut groups = Vec::with_capacity(ga as usize);
    let mut schedules = Vec::with_capacity(ga as usize);
    let mut nano = Vec::with_capacity(ga as usize);
    for r in per_ga {
        let (group, scheds, counts) = r?;
        groups.push(group);
        schedules.push(scheds);
        nano.push(counts);
    }
    Ok(DistcaPlan {
        plan: Plan {
            version: PLAN_VERSION,
            scheme: "distca".into(),
            step,
            shape: cfg.shape,
            head_shards: 1,
            groups,
        },
        schedules,
        nano: NanoTable { units: nano },
    })
}

/// One GA index's group, its schedules (two with ping-pong) and its units per nano-batch.
type GaGroup = (Group, Vec<DistcaSchedule>, [u32; 2]);

/// GA index `g` of the step (its `dp` sequences `seqs`) scheduled and lowered.
fn ga_group(
    g: u32,
    seqs: &[PackedSeq],
    dp: u32,
    cp: u32,
    workers: &[WorkerId],
    cfg: &DistcaConfig,
    ping_pong: bool,
) -> Result<GaGroup> {
    let scheds: Vec<DistcaSchedule> = if ping_pong {
        schedule_nanos(seqs, cp, cfg)?.into()
    } else {
        vec![schedule_step(seqs, cp, cfg)?]
    };
    let index: Vec<SampleIndex> = seqs
        .iter()
        .map(|s| SampleIndex::new(&s.lengths().collect::<Vec<_>>()))
        .collect();
    let sequences: Vec<PlanSeq> = seqs
        .iter()
        .enumerate()
        .map(|(r, seq)| PlanSeq {
            id: g * dp + r as u32,
            samples: seq.lengths().collect(),
            capacity: seq.capacity,
            layout: seq_layout(seq, &cp_group(r as u32, cp), cfg.scheduler),
        })
        .collect();
    let mut units = Vec::new();
    let mut counts = [0u32; 2];
    for (h, sched) in scheds.iter().enumerate() {
        let before = units.len();
        for (dst, work) in sched.servers.iter().enumerate() {
            for task in &work.tasks {
                let r = task.sample.seq as usize;
                let (s0, _) = index[r].span(task.sample.index as usize);
                for &(lo, hi) in &task.q_ranges {
                    units.push(UnitSpec {
                        seq: r,
                        q_start: s0 + u64::from(lo),
                        q_end: s0 + u64::from(hi),
                        shard: 0,
                        worker: dst as u32,
                    });
                }
            }
        }
        counts[h.min(1)] += (units.len() - before) as u32;
    }
    let site = GroupSite {
        ga: g,
        pool: 0,
        workers,
        shape: &cfg.shape,
        head_shards: 1,
        kv: KvReach::Reached,
    };
    Ok((build_group(&site, sequences, &units), scheds, counts))
}

/// Where a replica's sequence lies on its CP ranks for `scheduler`: the repository's
/// mirrored placement ([`reference::layout`]) or contiguous slices.
pub fn seq_layout(
    seq: &PackedSeq,
    ranks: &[WorkerId],
    scheduler: DistcaScheduler,
) -> Vec<Resident> {
    match scheduler {
        DistcaScheduler::Reference => reference::layout(seq, ranks),
        DistcaScheduler::Tight => contiguous_layout(seq.tokens(), seq.capacity, ranks),
    }
}

#[cfg(test)]
mod tests {
    use super::super::DEFAULT_EPSILON;
    use super::*;
    use crate::cost::AttnShape;
    use crate::plan::{check, Payload};
    use crate::workload::corpus::Corpus;
    use crate::workload::pack::{global_batch, Packing};
    use crate::workload::PackedSeq;
    use proptest::prelude::*;

    /// 1 head, head_dim 1, 1 byte: Q = out = tokens bytes, KV = 2·tokens.
    const UNIT: AttnShape = AttnShape {
        heads_q: 1,
        heads_kv: 1,
        head_dim: 1,
        dtype_bytes: 1,
        mask: crate::cost::Mask::Causal,
    };

    fn seq(lens: &[u32], doc0: u64, slack: u32) -> PackedSeq {
        PackedSeq::from_lengths(lens, lens.iter().sum::<u32>() + slack, doc0)
    }

    /// (Q + output bytes, KV bytes) of a plan.
    fn plan_bytes(p: &Plan) -> (u64, u64) {
        let mut qo = 0;
        let mut kv = 0;
        for t in p.groups.iter().flat_map(|g| &g.transfers) {
            match t.carries {
                Payload::Kv { .. } => kv += t.bytes,
                _ => qo += t.bytes,
            }
        }
        (qo, kv)
    }

    /// (Q + output bytes, KV bytes: moved tasks' and in-place) of the schedules.
    fn sched_bytes(d: &DistcaPlan) -> (u64, u64) {
        let ss = d.schedules.iter().flatten();
        ss.fold((0, 0), |(qo, kv), s| {
            let q: u64 = s.transfers.iter().map(|t| t.q_bytes + t.out_bytes).sum();
            let k: u64 = s.transfers.iter().map(|t| t.kv_bytes).sum();
            (qo + q, kv + k + s.in_place_kv_bytes())
        })
    }

    #[test]
    fn head_tail_move_by_hand() {
        // The scheduler's hand case: server 0 holds samples 4 and 2, server 1 a 1; with
        // ε = 0.15, tile 1 the head+tail [0,1)+[3,4) of the 4 moves to server 1. Plan: two
        // moved units (positions [0,1) and [3,4) of sequence 0) on worker 1, each with 1 B
        // of Q and 1 B of output, and one KV transfer of keys [0,4) (2·4 = 8 B): 12 B, the
        // scheduler's 12.
        let batch = [seq(&[4, 2], 0, 0), seq(&[1], 10, 3)];
        let cfg = DistcaConfig::new(UNIT, 0.15, 1)
            .unwrap()
            .with_scheduler(DistcaScheduler::Tight);
        let d = plan_step(7, &batch, 2, &cfg, false).unwrap();
        let s = check(&d.plan).unwrap();
        assert_eq!(
            (s.groups, s.sequences, s.units, s.transfers, s.bytes),
            (1, 2, 5, 5, 12)
        );
        let g = &d.plan.groups[0];
        let on1: Vec<(u32, u64, u64)> = g
            .units
            .iter()
            .filter(|u| u.worker == 1)
            .map(|u| (u.seq, u.q_start, u.q_end))
            .collect();
        assert_eq!(on1, vec![(1, 0, 1), (0, 0, 1), (0, 3, 4)]);
        let kv: Vec<(u32, u32, u32)> = g
            .transfers
            .iter()
            .filter_map(|t| match t.carries {
                Payload::Kv { group, start, end } => Some((group.sample, start, end)),
                _ => None,
            })
            .collect();
        assert_eq!(kv, vec![(0, 0, 4)]);
        assert_eq!(d.plan.step, 7);
        assert_eq!(sched_bytes(&d), plan_bytes(&d.plan));
    }

    #[test]
    fn document_spanning_two_cp_ranks_lowers_by_hand() {
        // The scheduler's hand case (DP 2 × CP 2, one 8-token document on replica 0's
        // ranks, ε = 0.5, tile 1): moves [4,5) 1 → 2, [0,1) 0 → 2, [5,6) 1 → 3; keeps
        // [1,4) on 0 and [6,8) on 1. Plan: Q and output 1 B each per move (6 B); KV per
        // (document, worker) once, keys [0, largest end): worker 1 (in place, [6,8)) keys
        // [0,4) from worker 0 (8 B); worker 2 keys [0,5): [0,4) from 0 (8 B) and [4,5) from
        // 1 (2 B) — its [0,1) task's keys are inside them; worker 3 keys [0,6): 8 B from 0,
        // [4,6) 4 B from 1. Total 6 + 30 = 36 B, the scheduler's 36 (it charges the [0,1)
        // task no keys: they reached worker 2 with the [4,5) move).
        let batch = [seq(&[8], 0, 0), seq(&[], 5, 8)];
        let cfg = DistcaConfig::new(UNIT, 0.5, 1)
            .unwrap()
            .with_scheduler(DistcaScheduler::Tight);
        let d = plan_step_cp(0, &batch, 2, 2, &cfg, false).unwrap();
        let s = check(&d.plan).unwrap();
        assert_eq!((s.groups, s.sequences, s.units, s.bytes), (1, 2, 5, 36));
        let g = &d.plan.groups[0];
        assert_eq!(g.workers, vec![0, 1, 2, 3]);
        let lay: Vec<(u64, u64, u32)> = g.sequences[0]
            .layout
            .iter()
            .map(|r| (r.start, r.end, r.worker))
            .collect();
        assert_eq!(lay, vec![(0, 4, 0), (4, 8, 1)]);
        let mut kv: Vec<(u32, u32, u32, u32, u64)> = g
            .transfers
            .iter()
            .filter_map(|t| match t.carries {
                Payload::Kv { start, end, .. } => Some((t.src, t.dst, start, end, t.bytes)),
                _ => None,
            })
            .collect();
        kv.sort_unstable();
        assert_eq!(
            kv,
            vec![
                (0, 1, 0, 4, 8),
                (0, 2, 0, 4, 8),
                (0, 3, 0, 4, 8),
                (1, 2, 4, 5, 2),
                (1, 3, 4, 6, 4)
            ]
        );
        assert_eq!(plan_bytes(&d.plan), (6, 30));
        assert_eq!(sched_bytes(&d), (6, 30));
        // Without the pool (ε large), only the in-place prefix moves: 8 B.
        let cfg = DistcaConfig::new(UNIT, 10.0, 1)
            .unwrap()
            .with_scheduler(DistcaScheduler::Tight);
        let d = plan_step_cp(0, &batch, 2, 2, &cfg, true).unwrap();
        assert_eq!(check(&d.plan).unwrap().bytes, 8);
        assert_eq!(plan_bytes(&d.plan), sched_bytes(&d));
    }

    #[test]
    fn head_only_move_sends_only_its_key_prefix() {
        // Tile 384 on one 1024-token sample: the head [0, 384) moves; it reads keys
        // [0, 384) only: KV 768 B, Q 384, output 384.
        let batch = [seq(&[1024], 0, 0), seq(&[], 5, 8)];
        let cfg = DistcaConfig::new(UNIT, 0.0, 384)
            .unwrap()
            .with_scheduler(DistcaScheduler::Tight);
        let d = plan_step(0, &batch, 2, &cfg, false).unwrap();
        check(&d.plan).unwrap();
        assert_eq!(plan_bytes(&d.plan), (768, 768));
    }

    #[test]
    fn corpus_step_with_ping_pong_checks_and_conserves() {
        let corpus = Corpus::from_spec("wlbllm").unwrap();
        let batch = global_batch(&corpus, 65_536, 16, Packing::Sequential, 7, 0).unwrap();
        let shape = AttnShape {
            heads_q: 32,
            heads_kv: 8,
            head_dim: 128,
            dtype_bytes: 2,
            mask: crate::cost::Mask::Causal,
        };
        let cfg = DistcaConfig::new(shape, DEFAULT_EPSILON, 128).unwrap();
        for ping_pong in [false, true] {
            let d = plan_step(0, &batch, 8, &cfg, ping_pong).unwrap();
            let s = check(&d.plan).unwrap();
            assert_eq!((s.groups, s.sequences), (2, 16));
            let exact: u64 = batch.iter().map(PackedSeq::causal_pairs).sum();
            let want = shape.fwd_flops(exact, 32);
            assert!((s.flops - want).abs() <= 1e-9 * want);
            assert_eq!(d.schedules[0].len(), 1 + usize::from(ping_pong));
            let (pq, pkv) = plan_bytes(&d.plan);
            let (sq, skv) = sched_bytes(&d);
            assert_eq!(pq, sq);
            assert!(pkv <= skv && pkv > 0);
        }
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let batch = [seq(&[4], 0, 0), seq(&[3], 1, 0), seq(&[2], 2, 0)];
        let cfg = DistcaConfig::new(UNIT, 0.1, 1).unwrap();
        let e = plan_step(0, &batch, 2, &cfg, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("GBS = 3") && e.contains("multiple of DP = 2"),
            "{e}"
        );
        assert!(plan_step(0, &batch, 0, &cfg, false).is_err());
        let mut bad = cfg;
        bad.epsilon = -0.5;
        let e = plan_step(0, &batch, 3, &bad, true).unwrap_err().to_string();
        assert!(e.contains("epsilon = -0.5"), "{e}");
        let mut over = batch.clone();
        over[1].capacity = 2;
        let e = plan_step(0, &over, 3, &cfg, false).unwrap_err().to_string();
        assert!(e.contains("batch[1] tokens = 3"), "{e}");
    }

    proptest! {
        /// Random batches, DP, CP (documents spanning ranks), GA, ε, tile, ping-pong and
        /// scheduler: the plan checks, its FLOPs are the exact causal total, each group
        /// holds its GA index's sequences with their samples on their replica's CP layout
        /// (mirrored or contiguous, by scheduler), Q and output bytes are the scheduler's and KV bytes at most the
        /// scheduler's (moved and in place).
        #[test]
        fn random_steps_check(
            lens in proptest::collection::vec(proptest::collection::vec(1u32..600, 0..5), 1..7),
            dp in 1u32..5,
            cp in 1u32..5,
            ga in 1u32..3,
            eps in 0.0f64..0.4,
            tile in prop_oneof![Just(1u32), Just(16), Just(128)],
            ping_pong in any::<bool>(),
            hkv in prop_oneof![Just(1u32), Just(2), Just(4)],
            tight in any::<bool>(),
        ) {
            let shape = AttnShape { heads_q: 4, heads_kv: hkv, head_dim: 2, dtype_bytes: 2, mask: crate::cost::Mask::Causal };
            let n = (dp * ga) as usize;
            let batch: Vec<PackedSeq> =
                (0..n).map(|i| seq(&lens[i % lens.len()], 100 * i as u64, i as u32 % 2)).collect();
            let scheduler = if tight { DistcaScheduler::Tight } else { DistcaScheduler::Reference };
            let cfg = DistcaConfig::new(shape, eps, tile).unwrap().with_scheduler(scheduler);
            let d = plan_step_cp(2, &batch, dp, cp, &cfg, ping_pong).unwrap();
            d.nano.validate(&d.plan).unwrap();
            let s = check(&d.plan);
            prop_assert!(s.is_ok(), "{:?}", s);
            let s = s.unwrap();
            let exact: u64 = batch.iter().map(PackedSeq::causal_pairs).sum();
            let want = shape.fwd_flops(exact, 4);
            prop_assert!((s.flops - want).abs() <= 1e-9 * want.max(1.0));
            for g in &d.plan.groups {
                for sq in &g.sequences {
                    let b = &batch[sq.id as usize];
                    prop_assert_eq!(sq.id / dp, g.ga);
                    prop_assert_eq!(&sq.samples, &b.lengths().collect::<Vec<_>>());
                    let replica = sq.id % dp;
                    prop_assert_eq!(&sq.layout, &seq_layout(b, &cp_group(replica, cp), scheduler));
                }
            }
            let (pq, pkv) = plan_bytes(&d.plan);
            let (sq, skv) = sched_bytes(&d);
            prop_assert_eq!(pq, sq);
            prop_assert!(pkv <= skv);
        }
    }
}
