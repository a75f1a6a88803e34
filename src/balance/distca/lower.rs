//! DistCA's step as a [`Plan`]: the scheduler's per-server tasks as units, its moves as
//! transfers.
//!
//! Owns the lowering only; the scheduler and the ping-pong split are the parent module's,
//! bytes and FLOPs `plan::build`'s (through [`crate::cost::AttnShape`]). No I/O.
//!
//! # Mapping
//! GBS packed sequences, DP servers (one GPU each: P = DP, the whole cluster is one
//! attention pool), GA = GBS/DP: batch index b runs at GA index b / DP on server b mod DP
//! (worker id = server), where its Q, K and V live. Each GA index is one group, scheduled
//! on its own ([`schedule`], or both nano-batches of [`schedule_ping_pong`], whose units all
//! land in the same group: nano-batch 0's first). Every query range of every task is one
//! unit over all heads (H = 1; a head+tail shard is two units) on the task's server. A
//! moved range brings its Q from the home server and sends the output back; K and V move
//! only as far as causality needs — keys [0, last query + 1), the scheduler's `kv_prefix`
//! ([`KvReach::CausalPrefix`]) — once per (sample, destination), so the plan's KV bytes are
//! at most the scheduler's (equal when no two tasks of a sample go to one server).

use super::pingpong::NanoTable;
use super::{schedule, schedule_ping_pong, DistcaConfig, DistcaSchedule};
use crate::balance::ulysses::{check_fits, ga_of};
use crate::error::Result;
use crate::plan::build::{build_group, GroupSite, KvReach, UnitSpec};
use crate::plan::{Plan, PlanSeq, Resident, SampleIndex, WorkerId, PLAN_VERSION};
use crate::workload::PackedSeq;

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

/// Plan one step of DistCA. `batch` is the step's global batch in loader order; `dp` the
/// number of attention servers; `ping_pong` splits every micro-batch into two nano-batches
/// scheduled apart. Errors: DP of 0, GBS not a multiple of DP, a sequence over its capacity.
pub fn plan_step(
    step: u64,
    batch: &[PackedSeq],
    dp: u32,
    cfg: &DistcaConfig,
    ping_pong: bool,
) -> Result<DistcaPlan> {
    let cfg = DistcaConfig::new(cfg.shape, cfg.epsilon, cfg.tile)?;
    let ga = ga_of(batch.len(), dp, 1)?;
    check_fits(batch)?;
    let workers: Vec<WorkerId> = (0..dp).collect();
    let mut groups = Vec::with_capacity(ga as usize);
    let mut schedules = Vec::with_capacity(ga as usize);
    let mut nano = Vec::with_capacity(ga as usize);
    for (g, servers) in batch.chunks(dp as usize).enumerate() {
        let g = g as u32;
        let scheds: Vec<DistcaSchedule> = if ping_pong {
            schedule_ping_pong(servers, &cfg)?
                .into_iter()
                .map(|n| n.schedule)
                .collect()
        } else {
            vec![schedule(servers, &cfg)?]
        };
        let index: Vec<SampleIndex> = servers
            .iter()
            .map(|s| SampleIndex::new(&s.lengths().collect::<Vec<_>>()))
            .collect();
        let sequences: Vec<PlanSeq> = servers
            .iter()
            .enumerate()
            .map(|(s, seq)| {
                let tokens = seq.tokens();
                PlanSeq {
                    id: g * dp + s as u32,
                    samples: seq.lengths().collect(),
                    capacity: seq.capacity,
                    layout: if tokens == 0 {
                        Vec::new()
                    } else {
                        vec![Resident {
                            start: 0,
                            end: tokens,
                            worker: s as u32,
                        }]
                    },
                }
            })
            .collect();
        let mut units = Vec::new();
        let mut counts = [0u32; 2];
        for (h, sched) in scheds.iter().enumerate() {
            let before = units.len();
            for (dst, work) in sched.servers.iter().enumerate() {
                for task in &work.tasks {
                    let home = task.sample.server as usize;
                    let (s0, _) = index[home].span(task.sample.index as usize);
                    for &(lo, hi) in &task.q_ranges {
                        units.push(UnitSpec {
                            seq: home,
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
        nano.push(counts);
        let site = GroupSite {
            ga: g,
            pool: 0,
            workers: &workers,
            shape: &cfg.shape,
            head_shards: 1,
            kv: KvReach::CausalPrefix,
        };
        groups.push(build_group(&site, sequences, &units));
        schedules.push(scheds);
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

#[cfg(test)]
mod tests {
    use super::super::DEFAULT_EPSILON;
    use super::*;
    use crate::cost::AttnShape;
    use crate::plan::{check, Payload};
    use crate::workload::corpus::Corpus;
    use crate::workload::pack::{global_batch, Packing};
    use proptest::prelude::*;

    /// 1 head, head_dim 1, 1 byte: Q = out = tokens bytes, KV = 2·tokens.
    const UNIT: AttnShape = AttnShape {
        heads_q: 1,
        heads_kv: 1,
        head_dim: 1,
        dtype_bytes: 1,
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

    fn sched_bytes(d: &DistcaPlan) -> (u64, u64) {
        let ts = d.schedules.iter().flatten().flat_map(|s| &s.transfers);
        ts.fold((0, 0), |(qo, kv), t| {
            (qo + t.q_bytes + t.out_bytes, kv + t.kv_bytes)
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
        let cfg = DistcaConfig::new(UNIT, 0.15, 1).unwrap();
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
    fn head_only_move_sends_only_its_key_prefix() {
        // Tile 384 on one 1024-token sample: the head [0, 384) moves; it reads keys
        // [0, 384) only: KV 768 B, Q 384, output 384.
        let batch = [seq(&[1024], 0, 0), seq(&[], 5, 8)];
        let cfg = DistcaConfig::new(UNIT, 0.0, 384).unwrap();
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
        /// Random batches, DP, GA, ε, tile and ping-pong: the plan checks, its FLOPs are the
        /// exact causal total, each group holds its GA index's sequences with their samples,
        /// Q and output bytes are the scheduler's and KV bytes at most the scheduler's.
        #[test]
        fn random_steps_check(
            lens in proptest::collection::vec(proptest::collection::vec(1u32..600, 0..5), 1..7),
            dp in 1u32..5,
            ga in 1u32..3,
            eps in 0.0f64..0.4,
            tile in prop_oneof![Just(1u32), Just(16), Just(128)],
            ping_pong in any::<bool>(),
            hkv in prop_oneof![Just(1u32), Just(2), Just(4)],
        ) {
            let shape = AttnShape { heads_q: 4, heads_kv: hkv, head_dim: 2, dtype_bytes: 2 };
            let n = (dp * ga) as usize;
            let batch: Vec<PackedSeq> =
                (0..n).map(|i| seq(&lens[i % lens.len()], 100 * i as u64, i as u32 % 2)).collect();
            let cfg = DistcaConfig::new(shape, eps, tile).unwrap();
            let d = plan_step(2, &batch, dp, &cfg, ping_pong).unwrap();
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
                }
            }
            let (pq, pkv) = plan_bytes(&d.plan);
            let (sq, skv) = sched_bytes(&d);
            prop_assert_eq!(pq, sq);
            prop_assert!(pkv <= skv);
        }
    }
}
