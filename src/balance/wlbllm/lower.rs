//! WLB-LLM's step as a [`Plan`]: the micro-batches of variable-length packing on DP
//! replicas and GA indices, each sharded over its CP group per sequence or per document.
//!
//! Owns the lowering only; packing, outlier delay and the sharding choice are the parent
//! module's, bytes and FLOPs `plan::build`'s (through [`AttnShape`]). No I/O.
//!
//! # Mapping
//! A step's N = DP·GA micro-batches (the packer's `micro_batches`): micro-batch m runs at
//! GA index m / DP on replica m mod DP, whose CP group is workers replica·CP … +CP−1; it is
//! Plan sequence m of capacity S_max. Its chosen sharding ([`choose_sharding`] for
//! [`ShardingMode::Adaptive`], else the one asked for) gives each rank its pieces: the
//! layout puts each piece's Q, K and V on its rank, and each maximal run of positions on one
//! rank is one unit over all heads (H = 1) computed where it lives. K and V of every sample
//! are all-gathered within the CP group: a rank receives the tokens it does not hold of
//! every sample it reads, from each other rank as one KV span over that rank's pieces
//! ([`KvReach::AllGather`]: under per-document sharding a rank holds two chunks of every
//! document, so per-piece transfers would be O(documents · CP²) per micro-batch; spans
//! are O(CP²)); Q and outputs never move.

use serde::{Deserialize, Serialize};

use super::{
    choose_sharding, shard_per_document, shard_per_sequence, CpConfig, CpRanks, CpSharding,
    LatencyModel, WlbStep,
};
use crate::balance::ulysses::cp_group;
use crate::cost::AttnShape;
use crate::error::{invalid, Result};
use crate::plan::build::{build_group, GroupSite, KvReach, UnitSpec};
use crate::plan::{Group, Plan, PlanSeq, Resident, PLAN_VERSION};

use crate::balance::libra::MAX_WORKERS;

/// Which CP sharding each micro-batch gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardingMode {
    /// WLB-LLM's adaptive choice by predicted latency (the paper's default).
    Adaptive,
    /// Always per-sequence.
    PerSequence,
    /// Always per-document.
    PerDocument,
}

impl std::str::FromStr for ShardingMode {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> Result<ShardingMode> {
        match s {
            "adaptive" => Ok(ShardingMode::Adaptive),
            "per-sequence" => Ok(ShardingMode::PerSequence),
            "per-document" => Ok(ShardingMode::PerDocument),
            _ => Err(invalid(
                "sharding",
                s,
                "adaptive, per-sequence or per-document",
            )),
        }
    }
}

/// How a step's micro-batches sit on the cluster.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WlbPlanParams {
    /// DP degree (divides the step's micro-batch count).
    pub dp: u32,
    /// CP degree (2·CP must divide S_max).
    pub cp: u32,
    /// The kernel tile the adaptive choice pads pieces to (128).
    pub tile: u32,
    /// The memory cap S_max (each micro-batch's capacity).
    pub s_max: u32,
    /// Sharding per micro-batch.
    pub sharding: ShardingMode,
    /// The attention shape.
    pub shape: AttnShape,
}

/// The plan of one packed step, and the sharding each micro-batch got.
#[derive(Clone, Debug, PartialEq)]
pub struct WlbPlan {
    /// The checked-shape Plan.
    pub plan: Plan,
    /// Per micro-batch (Plan sequence id), its CP sharding.
    pub shardings: Vec<CpSharding>,
}

/// Lower one packed step (`WlbPacker::step`'s output) to a Plan. Errors name the field:
/// DP not dividing the micro-batch count, a CP whose 2·CP chunks do not divide S_max, a
/// micro-batch over S_max, a bad shape.
pub fn to_plan<M: LatencyModel + ?Sized>(
    out: &WlbStep,
    p: &WlbPlanParams,
    model: &M,
) -> Result<WlbPlan> {
    let cp = CpConfig::new(p.cp, p.tile, p.s_max)?;
    let s = &p.shape;
    if s.heads_q == 0 || s.heads_kv == 0 || s.heads_q % s.heads_kv != 0 {
        return Err(invalid(
            "heads_q / heads_kv",
            format!("{} / {}", s.heads_q, s.heads_kv),
            "at least 1 each, heads_kv dividing heads_q",
        ));
    }
    let n = out.micro_batches.len();
    if p.dp == 0 || n == 0 || n % p.dp as usize != 0 {
        return Err(invalid(
            "DP",
            p.dp,
            format!("at least 1 and a divisor of the step's {n} micro-batches (N = DP × GA)"),
        ));
    }
    if u64::from(p.dp) * u64::from(p.cp) > MAX_WORKERS {
        return Err(invalid(
            "DP × CP (workers)",
            u64::from(p.dp) * u64::from(p.cp),
            format!("at most {MAX_WORKERS}"),
        ));
    }
    let mut groups = Vec::with_capacity(n);
    let mut shardings = Vec::with_capacity(n);
    for (m, mb) in out.micro_batches.iter().enumerate() {
        if mb.tokens > u64::from(p.s_max) {
            return Err(invalid(
                format!("micro-batch {m} tokens"),
                mb.tokens,
                format!("at most S_max = {}", p.s_max),
            ));
        }
        let m32 = m as u32;
        let (ga, replica) = (m32 / p.dp, m32 % p.dp);
        let workers = cp_group(replica, p.cp);
        let samples: Vec<_> = mb.samples.iter().map(|x| x.sample).collect();
        let (sharding, ranks) = match p.sharding {
            ShardingMode::Adaptive => {
                let c = choose_sharding(&samples, cp, model);
                (c.sharding, c.ranks)
            }
            ShardingMode::PerSequence => {
                (CpSharding::PerSequence, shard_per_sequence(&samples, cp))
            }
            ShardingMode::PerDocument => {
                (CpSharding::PerDocument, shard_per_document(&samples, cp))
            }
        };
        shardings.push(sharding);
        let lens: Vec<u32> = samples.iter().map(|x| x.len).collect();
        let site = GroupSite {
            ga,
            pool: replica,
            workers: &workers,
            shape: &p.shape,
            head_shards: 1,
            kv: KvReach::AllGather,
        };
        groups.push(sharded_group(&site, m32, lens, p.s_max, &ranks));
    }
    Ok(WlbPlan {
        plan: Plan {
            version: PLAN_VERSION,
            scheme: "wlbllm".into(),
            step: out.step,
            shape: p.shape,
            head_shards: 1,
            groups,
        },
        shardings,
    })
}

/// One sequence (Plan id `id`, sample lengths `lens`, capacity `capacity`) sharded over
/// `site.workers` as `ranks` says (rank i's pieces on worker i) as a plan group: each
/// piece's Q, K and V live on its rank, each maximal run of positions on one rank is one
/// unit over all heads (H = 1) computed where it lives, and KV moves as `site.kv` says.
pub fn sharded_group(
    site: &GroupSite<'_>,
    id: u32,
    lens: Vec<u32>,
    capacity: u32,
    ranks: &CpRanks,
) -> Group {
    let mut starts = Vec::with_capacity(lens.len());
    let mut at = 0u64;
    for &l in &lens {
        starts.push(at);
        at += u64::from(l);
    }
    // pieces as global position ranges on their rank, in position order, merged
    let mut ranges: Vec<(u64, u64, u32)> = ranks
        .iter()
        .enumerate()
        .flat_map(|(r, pieces)| {
            let starts = &starts;
            let w = site.workers[r];
            pieces.iter().map(move |pc| {
                let a = starts[pc.sample] + u64::from(pc.start);
                (a, a + u64::from(pc.len), w)
            })
        })
        .filter(|r| r.0 < r.1)
        .collect();
    ranges.sort_unstable();
    let mut layout: Vec<Resident> = Vec::with_capacity(ranges.len());
    for (start, end, worker) in ranges {
        match layout.last_mut() {
            Some(last) if last.worker == worker && last.end == start => last.end = end,
            _ => layout.push(Resident { start, end, worker }),
        }
    }
    let units: Vec<UnitSpec> = layout
        .iter()
        .map(|r| UnitSpec {
            seq: 0,
            q_start: r.start,
            q_end: r.end,
            shard: 0,
            worker: r.worker,
        })
        .collect();
    let seq = PlanSeq {
        id,
        samples: lens,
        capacity,
        layout,
    };
    build_group(site, vec![seq], &units)
}

#[cfg(test)]
mod tests {
    use super::super::{ConstantThroughput, OutlierDelay, WlbConfig, WlbPacker};
    use super::*;
    use crate::plan::{check, Payload};
    use crate::workload::corpus::Corpus;
    use crate::workload::pack::{batches, Packing};
    use crate::workload::{PackedSeq, Sample};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const TINY: AttnShape = AttnShape {
        heads_q: 2,
        heads_kv: 1,
        head_dim: 1,
        dtype_bytes: 1,
        mask: crate::cost::Mask::Causal,
    };

    fn batch_of(seqs: &[Vec<u32>], cap: u32, doc0: u64) -> Vec<PackedSeq> {
        let mut doc = doc0;
        seqs.iter()
            .map(|lens| PackedSeq {
                samples: lens
                    .iter()
                    .map(|&len| {
                        doc += 1;
                        Sample {
                            doc,
                            offset: 0,
                            len,
                            cut: false,
                        }
                    })
                    .collect(),
                capacity: cap,
            })
            .collect()
    }

    fn params(dp: u32, cp: u32, s_max: u32, sharding: ShardingMode) -> WlbPlanParams {
        WlbPlanParams {
            dp,
            cp,
            tile: 128,
            s_max,
            sharding,
            shape: TINY,
        }
    }

    #[test]
    fn per_document_all_gather_by_hand() {
        // One micro-batch holding one 16-token sample, CP 2, per-document: rank 0 holds
        // [0,4) and [12,16), rank 1 [4,12). Units: [0,4)@0, [4,12)@1, [12,16)@0. Rank 0
        // gathers [4,12) (8 tokens × K,V × 1 head = 16 B), rank 1 gathers [0,4) and
        // [12,16) as one span [0,16) over rank 0's 8 tokens (16 B): 32 B in 2 transfers,
        // and no Q or output moves.
        let mut packer = WlbPacker::new(
            WlbConfig::new(1, 16, None).unwrap(),
            ConstantThroughput::h200_llama3_8b(),
        );
        let out = packer.step(&batch_of(&[vec![16]], 16, 0)).unwrap();
        let w = to_plan(
            &out,
            &params(1, 2, 16, ShardingMode::PerDocument),
            &ConstantThroughput::h200_llama3_8b(),
        )
        .unwrap();
        let s = check(&w.plan).unwrap();
        assert_eq!((s.units, s.transfers, s.bytes), (3, 2, 32));
        let g = &w.plan.groups[0];
        let units: Vec<_> = g
            .units
            .iter()
            .map(|u| (u.q_start, u.q_end, u.worker))
            .collect();
        assert_eq!(units, vec![(0, 4, 0), (4, 12, 1), (12, 16, 0)]);
        let kv: Vec<_> = g
            .transfers
            .iter()
            .map(|t| match t.carries {
                Payload::Kv { group, start, end } => (t.src, t.dst, group.sample, start, end),
                _ => panic!("{t:?} is not KV"),
            })
            .collect();
        assert_eq!(kv, vec![(1, 0, 0, 4, 12), (0, 1, 0, 0, 16)]);
        // rank loads: 10 + 58 = 68 and 68 (the parent module's hand numbers).
        let load = |wk| -> u64 {
            g.units
                .iter()
                .filter(|u| u.worker == wk)
                .map(|u| u.pairs)
                .sum()
        };
        assert_eq!((load(0), load(1)), (68, 68));
    }

    #[test]
    fn micro_batches_map_ga_major_onto_replicas() {
        // N = 4 micro-batches, DP 2 → GA 2; micro-batch 3 at GA 1 on replica 1 (workers 2, 3).
        let cfg = WlbConfig::new(4, 64, None).unwrap();
        let model = ConstantThroughput::h200_llama3_8b();
        let mut packer = WlbPacker::new(cfg, model);
        let out = packer
            .step(&batch_of(
                &[vec![20, 5], vec![30], vec![9, 9, 9], vec![1]],
                40,
                0,
            ))
            .unwrap();
        let w = to_plan(&out, &params(2, 2, 64, ShardingMode::Adaptive), &model).unwrap();
        check(&w.plan).unwrap();
        let g = &w.plan.groups[3];
        assert_eq!((g.ga, g.pool, g.workers.clone()), (1, 1, vec![2, 3]));
        assert_eq!(g.sequences[0].id, 3);
        assert_eq!(w.shardings.len(), 4);
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let model = ConstantThroughput::h200_llama3_8b();
        let mut packer = WlbPacker::new(WlbConfig::new(3, 60, None).unwrap(), model);
        let out = packer.step(&batch_of(&[vec![5]], 10, 0)).unwrap();
        let e = to_plan(&out, &params(2, 1, 60, ShardingMode::Adaptive), &model)
            .unwrap_err()
            .to_string();
        assert!(e.contains("DP = 2") && e.contains("3 micro-batches"), "{e}");
        // 2·CP = 8 does not divide S_max = 60: the chunking error of CpConfig.
        let e = to_plan(&out, &params(3, 4, 60, ShardingMode::Adaptive), &model)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cp = 4") && e.contains("S_max = 60"), "{e}");
        // a micro-batch over the S_max the plan is told
        let e = to_plan(&out, &params(3, 1, 4, ShardingMode::Adaptive), &model)
            .unwrap_err()
            .to_string();
        assert!(e.contains("micro-batch") && e.contains("S_max = 4"), "{e}");
        assert!("sideways".parse::<ShardingMode>().is_err());
        assert_eq!(
            "per-document".parse::<ShardingMode>().unwrap(),
            ShardingMode::PerDocument
        );
    }

    #[test]
    fn corpus_steps_check_and_train_their_batches() {
        // wlbllm corpus at L = 32K, N = 8 = DP 4 × GA 2, S_max = 2L, CP 4: every step checks,
        // trains exactly its batch's samples (delay off, S_max ≥ L + longest) and its FLOPs
        // are the exact causal total.
        let corpus = Corpus::from_spec("wlbllm").unwrap();
        let l = 32_768;
        let model = ConstantThroughput::h200_llama3_8b();
        let mut packer = WlbPacker::new(WlbConfig::new(8, 2 * l, None).unwrap(), model);
        let shape = model.shape;
        let mut seen = [0usize; 2];
        for batch in batches(&corpus, l, 8, Packing::Sequential, 5, 0)
            .unwrap()
            .take(3)
        {
            let out = packer.step(&batch).unwrap();
            let mut p = params(4, 4, 2 * l, ShardingMode::Adaptive);
            p.shape = shape;
            let w = to_plan(&out, &p, &model).unwrap();
            let s = check(&w.plan).unwrap();
            let exact: u64 = batch.iter().map(PackedSeq::causal_pairs).sum();
            let want = shape.fwd_flops(exact, shape.heads_q);
            assert!((s.flops - want).abs() <= 1e-9 * want);
            let mut got: Vec<Sample> = out.trained().map(|x| x.sample).collect();
            let mut want: Vec<Sample> = batch.iter().flat_map(|s| s.samples.clone()).collect();
            got.sort();
            want.sort();
            assert_eq!(got, want);
            for sh in &w.shardings {
                seen[usize::from(*sh == CpSharding::PerDocument)] += 1;
            }
        }
        // the corpus makes the adaptive choice go both ways
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
    }

    fn multiset(it: impl Iterator<Item = Sample>) -> BTreeMap<Sample, usize> {
        let mut m = BTreeMap::new();
        for s in it {
            *m.entry(s).or_insert(0) += 1;
        }
        m
    }

    proptest! {
        /// Random batches, DP, GA, CP, sharding and outlier delay: every step's plan checks,
        /// its FLOPs are the exact causal total of the samples it trains, its sequences are
        /// its micro-batches; with delay off (and S_max ≥ L + longest) it trains exactly its
        /// batch's multiset of samples.
        #[test]
        fn random_steps_check(
            steps in proptest::collection::vec(
                proptest::collection::vec(proptest::collection::vec(1u32..=48, 1..5), 6),
                1..3),
            dp in 1u32..3,
            ga in 1u32..3,
            cp in prop_oneof![Just(1u32), Just(2), Just(4)],
            mode in prop_oneof![
                Just(ShardingMode::Adaptive),
                Just(ShardingMode::PerSequence),
                Just(ShardingMode::PerDocument)
            ],
            delay in any::<bool>(),
        ) {
            let n = (dp * ga) as usize;
            let cap = 48 * 4;
            let s_max = 2 * cap; // a multiple of 2·CP for CP ≤ 4
            let od = delay.then(|| OutlierDelay::new(vec![24, 48]).unwrap());
            let model = ConstantThroughput::h200_llama3_8b();
            let mut packer = WlbPacker::new(WlbConfig::new(n, s_max, od).unwrap(), model);
            let mut doc = 0;
            for seqs in &steps {
                let batch = batch_of(&seqs[..n], cap, doc);
                doc += 1000;
                let out = packer.step(&batch).unwrap();
                let mut p = params(dp, cp, s_max, mode);
                p.shape = AttnShape { heads_q: 4, heads_kv: 2, head_dim: 2, dtype_bytes: 2, mask: crate::cost::Mask::Causal };
                let w = to_plan(&out, &p, &model).unwrap();
                let s = check(&w.plan);
                prop_assert!(s.is_ok(), "{:?}", s);
                let s = s.unwrap();
                let exact: u64 = out
                    .trained()
                    .map(|x| crate::workload::causal_pairs(u64::from(x.sample.len)))
                    .sum();
                let want = p.shape.fwd_flops(exact, 4);
                prop_assert!((s.flops - want).abs() <= 1e-9 * want.max(1.0));
                for (m, g) in w.plan.groups.iter().enumerate() {
                    let lens: Vec<u32> =
                        out.micro_batches[m].samples.iter().map(|x| x.sample.len).collect();
                    prop_assert_eq!(&g.sequences[0].samples, &lens);
                }
                if !delay {
                    prop_assert_eq!(
                        multiset(out.trained().map(|x| x.sample)),
                        multiset(batch.iter().flat_map(|s| s.samples.iter().copied()))
                    );
                }
            }
        }
    }
}
