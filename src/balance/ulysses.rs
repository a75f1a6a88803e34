//! DeepSpeed-Ulysses (Jacobs et al., "DeepSpeed Ulysses: System Optimizations for Enabling
//! Training of Extreme Long Sequence Transformer Models", 2023): the Plan of one step.
//!
//! Owns lowering a step's global batch to a [`Plan`] the Ulysses way. It may not move work
//! between DP replicas (Ulysses balances nothing across them), price work itself (every
//! FLOP and byte comes from [`AttnShape`] through `plan::build`) or model time.
//!
//! # Layout and the all-to-all
//! GBS packed sequences per step, DP replicas, GA = GBS/DP micro-steps: batch index b runs
//! at GA index b / DP on replica b mod DP, whose CP group is workers replica·CP … +CP−1.
//! Before attention a sequence is sharded by tokens: rank r holds the contiguous slice
//! [r·⌈L/CP⌉, (r+1)·⌈L/CP⌉) of Q, K and V of every head. The all-to-all then gives rank r
//! the whole sequence for query heads [r·h_q/CP, (r+1)·h_q/CP) (head shard r, H = CP), and
//! the KV heads those map to under GQA (KV heads replicated when CP > h_kv); after
//! attention a second all-to-all returns each rank's output slice.
//!
//! # As Plan groups
//! One group per (GA index, DP replica); one unit per (sequence, head shard r), queries
//! [0, tokens), executing on rank r. Its Q pieces held by the other ranks are the Q
//! scatter, its output pieces going back the gather, and the KV pieces of every sample
//! from the other ranks the KV scatter (whole samples: the all-to-all moves all keys).

use crate::cost::AttnShape;
use crate::error::{invalid, Result};
use crate::plan::build::{build_group, contiguous_layout, GroupSite, KvReach, UnitSpec};
use crate::plan::{Plan, PlanSeq, WorkerId, PLAN_VERSION};
use crate::workload::PackedSeq;

use super::libra::MAX_WORKERS;

/// Ulysses' knobs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UlyssesParams {
    /// CP: ranks per DP replica's sequence-parallel group (divides h_q).
    pub cp: u32,
    /// The attention shape.
    pub shape: AttnShape,
}

impl UlyssesParams {
    /// Reject unusable settings with the field, the value and what is allowed.
    pub fn validate(&self) -> Result<()> {
        let s = &self.shape;
        if s.heads_q == 0 || s.heads_kv == 0 || s.heads_q % s.heads_kv != 0 {
            return Err(invalid(
                "heads_q / heads_kv",
                format!("{} / {}", s.heads_q, s.heads_kv),
                "at least 1 each, heads_kv dividing heads_q",
            ));
        }
        if s.head_dim == 0 || s.dtype_bytes == 0 {
            return Err(invalid(
                "head_dim / dtype_bytes",
                format!("{} / {}", s.head_dim, s.dtype_bytes),
                "both at least 1",
            ));
        }
        crate::cost::head_split(s.heads_q, s.heads_kv, self.cp)?;
        Ok(())
    }
}

/// GA micro-steps of a batch of `gbs` sequences on `dp` replicas of `cp` ranks, checked.
pub(crate) fn ga_of(gbs: usize, dp: u32, cp: u32) -> Result<u32> {
    if dp == 0 {
        return Err(invalid("DP", dp, "at least 1"));
    }
    if u64::from(dp) * u64::from(cp) > MAX_WORKERS {
        return Err(invalid(
            "DP × CP (workers)",
            u64::from(dp) * u64::from(cp),
            format!("at most {MAX_WORKERS}"),
        ));
    }
    let gbs32 = u32::try_from(gbs).map_err(|_| invalid("GBS", gbs, "at most 2^32 − 1"))?;
    if gbs32 == 0 || gbs32 % dp != 0 {
        return Err(invalid(
            "GBS",
            gbs,
            format!("a positive multiple of DP = {dp}"),
        ));
    }
    Ok(gbs32 / dp)
}

/// Check that every sequence fits its capacity.
pub(crate) fn check_fits(batch: &[PackedSeq]) -> Result<()> {
    for (i, s) in batch.iter().enumerate() {
        if s.tokens() > u64::from(s.capacity) {
            return Err(invalid(
                format!("batch[{i}] tokens"),
                s.tokens(),
                format!("at most its capacity {}", s.capacity),
            ));
        }
    }
    Ok(())
}

/// The CP group of DP replica `replica`: workers replica·CP + r.
pub fn cp_group(replica: u32, cp: u32) -> Vec<WorkerId> {
    (0..cp).map(|r| replica * cp + r).collect()
}

/// Plan one step of Ulysses: `batch` is the step's global batch in loader order.
pub fn plan_step(step: u64, batch: &[PackedSeq], dp: u32, p: &UlyssesParams) -> Result<Plan> {
    p.validate()?;
    ga_of(batch.len(), dp, p.cp)?;
    check_fits(batch)?;
    let groups = batch
        .iter()
        .enumerate()
        .map(|(b, s)| {
            let b = b as u32;
            let (ga, replica) = (b / dp, b % dp);
            let workers = cp_group(replica, p.cp);
            let seq = PlanSeq {
                id: b,
                samples: s.lengths().collect(),
                capacity: s.capacity,
                layout: contiguous_layout(s.tokens(), s.capacity, &workers),
            };
            let tokens = s.tokens();
            let units: Vec<UnitSpec> = if tokens == 0 {
                Vec::new()
            } else {
                workers
                    .iter()
                    .enumerate()
                    .map(|(r, &worker)| UnitSpec {
                        seq: 0,
                        q_start: 0,
                        q_end: tokens,
                        shard: r as u32,
                        worker,
                    })
                    .collect()
            };
            let site = GroupSite {
                ga,
                pool: replica,
                workers: &workers,
                shape: &p.shape,
                head_shards: p.cp,
                kv: KvReach::WholeSample,
            };
            build_group(&site, vec![seq], &units)
        })
        .collect();
    Ok(Plan {
        version: PLAN_VERSION,
        scheme: "ulysses".into(),
        step,
        shape: p.shape,
        head_shards: p.cp,
        groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::libra::QWEN3_30B_A3B;
    use crate::plan::{check, Payload};
    use crate::workload::corpus::Corpus;
    use crate::workload::pack::{global_batch, Packing};
    use proptest::prelude::*;

    fn seq(lens: &[u32], cap: u32, doc0: u64) -> PackedSeq {
        PackedSeq::from_lengths(lens, cap, doc0)
    }

    const TINY: AttnShape = AttnShape {
        heads_q: 4,
        heads_kv: 1,
        head_dim: 1,
        dtype_bytes: 1,
        mask: crate::cost::Mask::Causal,
    };

    #[test]
    fn all_to_all_bytes_by_hand() {
        // One sequence, samples [6, 2], L = 8, CP = 2: rank 0 holds [0,4), rank 1 [4,8).
        // h_q = 4 → 2 query heads per rank; h_kv = 1 (replicated: both shards read KV head 0).
        // Unit on rank 0 (shard 0): Q [4,8) from rank 1 = 4 tokens × 2 heads = 8 B, output
        // back 8 B; KV of sample 0's tokens [4,6) (2 tok × K,V × 1 head = 4 B) and of
        // sample 1 [0,2) (4 B). Rank 1 symmetric: Q [0,4) 8 B, out 8 B, KV sample 0
        // [0,4) 8 B. Total 8+8+4+4 + 8+8+8 = 48 B.
        let p = UlyssesParams { cp: 2, shape: TINY };
        let plan = plan_step(0, &[seq(&[6, 2], 8, 0)], 1, &p).unwrap();
        let s = check(&plan).unwrap();
        assert_eq!((s.groups, s.units, s.transfers, s.bytes), (1, 2, 7, 48));
        // FLOPs: (21 + 3) pairs × 4 heads × 4·d.
        assert_eq!(s.flops, 24.0 * 4.0 * 4.0);
        let g = &plan.groups[0];
        let kv: Vec<(u32, u32, u32, u32)> = g
            .transfers
            .iter()
            .filter_map(|t| match t.carries {
                Payload::Kv { group, start, end } => Some((t.dst, group.sample, start, end)),
                _ => None,
            })
            .collect();
        assert_eq!(kv, vec![(0, 0, 4, 6), (0, 1, 0, 2), (1, 0, 0, 4)]);
    }

    #[test]
    fn groups_are_ga_major_and_cp_groups_of_replicas() {
        let batch: Vec<PackedSeq> = (0..6)
            .map(|i| seq(&[10 + i, 3], 20, 10 * i as u64))
            .collect();
        let p = UlyssesParams { cp: 4, shape: TINY };
        let plan = plan_step(3, &batch, 3, &p).unwrap();
        check(&plan).unwrap();
        let sites: Vec<(u32, u32, u32, Vec<u32>)> = plan
            .groups
            .iter()
            .map(|g| (g.ga, g.pool, g.sequences[0].id, g.workers.clone()))
            .collect();
        assert_eq!(sites[0], (0, 0, 0, vec![0, 1, 2, 3]));
        assert_eq!(sites[4], (1, 1, 4, vec![4, 5, 6, 7]));
        assert_eq!(plan.head_shards, 4);
        // every unit runs on the rank of its shard
        for g in &plan.groups {
            for u in &g.units {
                assert_eq!(u.worker, g.workers[u.shard as usize]);
            }
        }
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let p = UlyssesParams {
            cp: 5,
            shape: QWEN3_30B_A3B,
        };
        let e = plan_step(0, &[seq(&[4], 8, 0)], 1, &p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cp = 5")
                && e.contains("32 query heads")
                && e.contains("1, 2, 4, 8, 16, 32"),
            "{e}"
        );
        let p = UlyssesParams {
            cp: 2,
            shape: QWEN3_30B_A3B,
        };
        let e = plan_step(0, &[seq(&[4], 8, 0)], 2, &p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("GBS = 1") && e.contains("multiple of DP = 2"),
            "{e}"
        );
        assert!(plan_step(0, &[seq(&[4], 8, 0)], 0, &p).is_err());
        let e = plan_step(0, &[seq(&[9], 8, 0)], 1, &p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch[0] tokens = 9"), "{e}");
    }

    #[test]
    fn corpus_step_at_cp16_checks_with_gqa_replication() {
        // CP 16 > h_kv 4: each rank's 2 query heads read one (replicated) KV head.
        let corpus = Corpus::from_spec("wlbllm").unwrap();
        let batch = global_batch(&corpus, 65_536, 8, Packing::Sequential, 3, 0).unwrap();
        let p = UlyssesParams {
            cp: 16,
            shape: QWEN3_30B_A3B,
        };
        let plan = plan_step(0, &batch, 4, &p).unwrap();
        let s = check(&plan).unwrap();
        let exact: u64 = batch.iter().map(PackedSeq::causal_pairs).sum();
        let want = QWEN3_30B_A3B.fwd_flops(exact, 32);
        assert!((s.flops - want).abs() <= 1e-9 * want);
        // KV bytes: every rank receives every sample token it does not hold, for 1 KV head.
        let kv: u64 = plan
            .groups
            .iter()
            .flat_map(|g| &g.transfers)
            .filter(|t| matches!(t.carries, Payload::Kv { .. }))
            .map(|t| t.bytes)
            .sum();
        let tokens: u64 = batch.iter().map(PackedSeq::tokens).sum();
        assert_eq!(kv, 15 * QWEN3_30B_A3B.kv_bytes(tokens, 1));
    }

    proptest! {
        #[test]
        fn random_steps_check_and_keep_flops(
            lens in proptest::collection::vec(proptest::collection::vec(0u32..40, 0..5), 1..4),
            dp in 1u32..4,
            ga in 1u32..3,
            cp in prop_oneof![Just(1u32), Just(2), Just(4), Just(8)],
            hkv in prop_oneof![Just(1u32), Just(2), Just(8)],
        ) {
            let shape = AttnShape { heads_q: 8, heads_kv: hkv, head_dim: 2, dtype_bytes: 2, mask: crate::cost::Mask::Causal };
            let n = (dp * ga) as usize;
            let batch: Vec<PackedSeq> = (0..n)
                .map(|i| {
                    let l = &lens[i % lens.len()];
                    let cap = l.iter().sum::<u32>() + (i as u32 % 3);
                    seq(l, cap, 100 * i as u64)
                })
                .collect();
            let plan = plan_step(1, &batch, dp, &UlyssesParams { cp, shape }).unwrap();
            let s = check(&plan);
            prop_assert!(s.is_ok(), "{:?}", s);
            let s = s.unwrap();
            prop_assert_eq!(s.groups, n);
            let exact: u64 = batch.iter().map(PackedSeq::causal_pairs).sum();
            let want = shape.fwd_flops(exact, 8);
            prop_assert!((s.flops - want).abs() <= 1e-9 * want.max(1.0));
            // samples kept: each group's sequence is its batch sequence
            for g in &plan.groups {
                let b = g.sequences[0].id as usize;
                prop_assert_eq!(&g.sequences[0].samples, &batch[b].lengths().collect::<Vec<_>>());
            }
        }
    }
}
