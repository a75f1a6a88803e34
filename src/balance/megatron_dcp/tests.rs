use super::*;
use crate::plan::{check, check_resident, Payload};
use crate::workload::causal_pairs;
use proptest::prelude::*;

const TINY: AttnShape = AttnShape {
    heads_q: 4,
    heads_kv: 2,
    head_dim: 2,
    dtype_bytes: 2,
    mask: crate::cost::Mask::Causal,
};

fn pairs_work(len: u32) -> u128 {
    u128::from(causal_pairs(u64::from(len)))
}

fn seqs(lens: &[&[u32]], cap: u32) -> Vec<PackedSeq> {
    let mut doc = 0;
    lens.iter()
        .map(|l| {
            let s = PackedSeq::from_lengths(l, cap, doc);
            doc += l.len() as u64;
            s
        })
        .collect()
}

#[test]
fn cp_size_rule_by_hand() {
    let c = DcpConfig::new(8, 1000, 1).unwrap();
    let got: Vec<u32> = [1, 1000, 1001, 2000, 2001, 4000, 4001, 8000]
        .iter()
        .map(|&l| c.cp_size(l).unwrap())
        .collect();
    assert_eq!(got, vec![1, 1, 2, 2, 4, 4, 8, 8]);
    let e = c.cp_size(8001).unwrap_err().to_string();
    assert!(
        e.contains("sample length = 8001") && e.contains("8 × 1000"),
        "{e}"
    );
    // min_dynamic_context_parallel_size lifts short samples
    let m = DcpConfig::new(8, 1000, 2).unwrap();
    assert_eq!((m.cp_size(10).unwrap(), m.cp_size(3000).unwrap()), (2, 4));
    for (r, s, m, field) in [
        (6, 1000, 1, "DP × CP"),
        (0, 1000, 1, "DP × CP"),
        (8, 0, 1, "max_seqlen_per_dp_cp_rank"),
        (8, 1000, 3, "min_dynamic_cp"),
        (8, 1000, 16, "min_dynamic_cp"),
    ] {
        let e = DcpConfig::new(r, s, m).unwrap_err().to_string();
        assert!(e.contains(field), "{e}");
    }
}

#[test]
fn short_samples_run_on_one_rank_each_with_no_cp_traffic() {
    // 16 samples of 1000 tokens on DP × CP = 4 ranks, S = 4096: every sample needs CP 1;
    // one round, LPT gives each rank 4 samples = 4000 tokens ≤ S: one micro-batch each.
    let cfg = DcpConfig::new(4, 4096, 1).unwrap();
    let b = seqs(&[&[1000; 8], &[1000; 8]], 8192);
    let s = schedule(&b, &cfg, pairs_work).unwrap();
    assert_eq!((s.rounds, s.slots), (1, 1));
    assert!(s
        .micro_batches
        .iter()
        .all(|m| m.cp == 1 && m.samples.len() == 4));
    assert_eq!(s.counts(4), vec![1; 4]);
    let plan = to_plan(3, &s, &cfg, &TINY);
    let sum = check(&plan).unwrap();
    assert_eq!((sum.transfers, sum.bytes), (0, 0));
    assert!(plan.groups.iter().all(|g| g.workers.len() == 1));
    let exact: u64 = b.iter().map(PackedSeq::causal_pairs).sum();
    let want = TINY.fwd_flops(exact, 4);
    assert!((sum.flops - want).abs() <= 1e-9 * want);
    check_resident(&plan, 4096).unwrap();
}

#[test]
fn a_long_sample_gets_the_cp_size_the_rule_says() {
    // S = 1000 on 8 ranks: 2500 tokens need ⌈2.5⌉ = 3 → CP 4; the four short ones CP 1.
    // The CP-4 group opens first (ranks 0–3), the short samples fill ranks 4–7.
    let cfg = DcpConfig::new(8, 1000, 1).unwrap();
    let b = seqs(&[&[2500, 900], &[800, 700, 600]], 4000);
    let s = schedule(&b, &cfg, pairs_work).unwrap();
    let long = s
        .micro_batches
        .iter()
        .find(|m| m.samples == vec![0])
        .unwrap();
    assert_eq!((long.cp, long.first_rank, long.slot), (4, 0, 0));
    let short: Vec<(u32, u32)> = s
        .micro_batches
        .iter()
        .filter(|m| m.samples != vec![0])
        .map(|m| (m.first_rank, m.cp))
        .collect();
    assert_eq!(short, vec![(4, 1), (5, 1), (6, 1), (7, 1)]);
    let plan = to_plan(0, &s, &cfg, &TINY);
    check(&plan).unwrap();
    // Only the CP-4 group moves data (K and V all-gathered among its 4 ranks).
    for g in &plan.groups {
        assert_eq!(
            g.transfers.is_empty(),
            g.workers.len() == 1,
            "{:?}",
            g.workers
        );
        assert!(g
            .transfers
            .iter()
            .all(|t| matches!(t.carries, Payload::Kv { .. })));
    }
    // Per-document sharding: rank 0 holds chunks 0 and 7 of 2500 tokens (8 chunks of
    // 312, remainder 4 on chunks 0–3): 313 + 312 = 625 ≤ S.
    check_resident(&plan, 1000).unwrap();
    assert!(check_resident(&plan, 899).is_err());
    // Alone, the long sample is doubled into the free ranks: CP 8 (never fewer than 4).
    let alone = schedule(&seqs(&[&[2500]], 4000), &cfg, pairs_work).unwrap();
    assert_eq!(alone.micro_batches[0].cp, 8);
}

#[test]
fn uneven_micro_batch_counts_by_hand() {
    // 2 ranks, S = 1000, samples 900, 600, 500 (all CP 1). 900 opens rank 0's group, 600
    // rank 1's; 500 joins the less-loaded rank 1 (600² < 900²), but 600 + 500 > S: two
    // micro-batches there. Rank 0 runs one, rank 1 two; GA indices 0 and 1.
    let cfg = DcpConfig::new(2, 1000, 1).unwrap();
    let s = schedule(&seqs(&[&[900, 600, 500]], 2000), &cfg, pairs_work).unwrap();
    let mbs: Vec<(u32, u32, Vec<usize>)> = s
        .micro_batches
        .iter()
        .map(|m| (m.slot, m.first_rank, m.samples.clone()))
        .collect();
    assert_eq!(mbs, vec![(0, 0, vec![0]), (0, 1, vec![1]), (1, 1, vec![2])]);
    assert_eq!((s.counts(2), s.slots), (vec![1, 2], 2));
    let plan = to_plan(0, &s, &cfg, &TINY);
    let (batch, ga) = rank_batches(&plan, 2, 1000).unwrap();
    assert_eq!(ga, 2);
    let tokens: Vec<Vec<u64>> = batch
        .iter()
        .map(|r| r.iter().map(PackedSeq::tokens).collect())
        .collect();
    assert_eq!(tokens, vec![vec![900, 0], vec![600, 500]]);
    assert!(batch.iter().flatten().all(|m| m.capacity == 1000));
    assert!(rank_batches(&plan, 1, 1000).is_err());
}

#[test]
fn the_checker_holds_every_rank_to_its_max_seqlen() {
    // The hand test's schedule: rank 1 runs [600] at GA 0 and [500] at GA 1, S = 1000.
    let cfg = DcpConfig::new(2, 1000, 1).unwrap();
    let s = schedule(&seqs(&[&[900, 600, 500]], 2000), &cfg, pairs_work).unwrap();
    let plan = to_plan(0, &s, &cfg, &TINY);
    check(&plan).unwrap();
    // Both of rank 1's micro-batches at one GA index: 1100 tokens resident on it, over the
    // S = 1000 its memory was priced at.
    let mut both = plan.clone();
    for g in &mut both.groups {
        g.ga = 0;
    }
    let v = check(&both).unwrap_err();
    assert_eq!(
        v.kind,
        crate::plan::ViolationKind::OverResident {
            worker: 1,
            tokens: 1100,
            cap: 1000
        }
    );
    // Other schemes carry no such bound.
    both.scheme = "wlbllm".into();
    check(&both).unwrap();
}

#[test]
fn a_round_closes_once_balanced_below_its_first_cp_size() {
    // 4 ranks, S = 1000: one 2000-token sample (CP 2, per-rank load 2001000 / 2 · 2 …) and
    // many 100-token samples. The CP-2 group takes ranks 0–1; the short ones fill ranks 2
    // and 3 until their loads are within 5 % of the long one's, and the rest waits for a
    // second round on all four ranks.
    let cfg = DcpConfig::new(4, 1000, 1).unwrap();
    let mut lens = vec![2000];
    lens.extend(std::iter::repeat_n(100, 400));
    let b = seqs(&[&lens], 50_000);
    let s = schedule(&b, &cfg, pairs_work).unwrap();
    assert!(s.rounds >= 2, "{}", s.rounds);
    let plan = to_plan(0, &s, &cfg, &TINY);
    check(&plan).unwrap();
    check_resident(&plan, 1000).unwrap();
    // Round 0: ranks 2 and 3 carry ≈ the long sample's per-rank load (pairs · N / c).
    let long = causal_pairs(2000) * 2;
    let short = causal_pairs(100) * 4;
    let load2: u64 = s
        .micro_batches
        .iter()
        .filter(|m| m.round == 0 && m.first_rank == 2)
        .map(|m| m.samples.len() as u64 * short)
        .sum();
    assert!(load2 <= long + short, "{load2} vs {long}");
    // … packed 10 samples (1000 tokens) a micro-batch: ranks 0 and 1 run one micro-batch
    // in round 0, ranks 2 and 3 many.
    let counts = s.counts(4);
    assert!(counts[2] > counts[0] + 10, "{counts:?}");
    assert!(load2 * 20 >= long * 19, "{load2} vs {long}");
}

#[test]
fn capped_rounds_run_one_micro_batch_per_group() {
    // The batch above under Megatron-Core's current rule: ranks 2 and 3 take 100-token
    // samples only while they hold at most S = 1000 tokens, so round 0 is one micro-batch
    // on every rank (the CP-2 group's one sample, ten short ones on ranks 2 and 3), and so
    // is every later round.
    let cfg = DcpConfig::new(4, 1000, 1)
        .unwrap()
        .with_rounds(DcpRounds::Capped);
    let mut lens = vec![2000];
    lens.extend(std::iter::repeat_n(100, 400));
    let s = schedule(&seqs(&[&lens], 50_000), &cfg, pairs_work).unwrap();
    let round0: Vec<(u32, u32, usize)> = s
        .micro_batches
        .iter()
        .filter(|m| m.round == 0)
        .map(|m| (m.slot, m.first_rank, m.samples.len()))
        .collect();
    assert_eq!(round0, vec![(0, 0, 1), (0, 2, 10), (0, 3, 10)]);
    // 380 short samples left, 40 a round on the four ranks
    assert_eq!((s.rounds, s.slots), (11, 11));
    assert!(s.counts(4).iter().all(|&c| c == 11), "{:?}", s.counts(4));
    let plan = to_plan(0, &s, &cfg, &TINY);
    check(&plan).unwrap();
    check_resident(&plan, 1000).unwrap();
    // the same batch in open rounds: ranks 2 and 3 run many micro-batches in round 0
    let open = schedule(
        &seqs(&[&lens], 50_000),
        &cfg.with_rounds(DcpRounds::Open),
        pairs_work,
    )
    .unwrap();
    assert!(open.slots > open.rounds, "{} {}", open.slots, open.rounds);
    assert_eq!("capped".parse::<DcpRounds>().unwrap(), DcpRounds::Capped);
    assert!("closed".parse::<DcpRounds>().is_err());
}

proptest! {
    /// Random batches, open or capped rounds: every sample trained exactly once, at a CP
    /// size at least its rule's, in a power-of-two aligned group; each plan checks (every
    /// query once per head, FLOPs the exact causal total) and no rank holds more than S
    /// tokens of a micro-batch; capped rounds are one micro-batch each.
    #[test]
    fn every_schedule_is_a_checked_plan_within_s(
        lens in proptest::collection::vec(1u32..3000, 1..40),
        exp in 0u32..4,
        s in 300u32..1500,
        min_exp in 0u32..2,
        capped in any::<bool>(),
    ) {
        let n = 1u32 << exp;
        let min_cp = (1u32 << min_exp).min(n);
        let rounds = if capped { DcpRounds::Capped } else { DcpRounds::Open };
        let cfg = DcpConfig::new(n, s, min_cp).unwrap().with_rounds(rounds);
        let b = vec![PackedSeq::from_lengths(&lens, lens.iter().sum(), 0)];
        let Ok(sched) = schedule(&b, &cfg, pairs_work) else {
            // only a sample longer than N · S is refused
            prop_assert!(lens.iter().any(|&l| u64::from(l) > u64::from(n) * u64::from(s)));
            return Ok(());
        };
        let mut seen = vec![0u32; lens.len()];
        for mb in &sched.micro_batches {
            prop_assert!(mb.cp.is_power_of_two() && mb.first_rank % mb.cp == 0);
            prop_assert!(mb.first_rank + mb.cp <= n && mb.slot < sched.slots);
            for &i in &mb.samples {
                seen[i] += 1;
                prop_assert!(mb.cp >= cfg.cp_size(lens[i]).unwrap());
            }
        }
        prop_assert!(seen.iter().all(|&x| x == 1));
        // no rank is in two micro-batches at one GA index
        let mut busy = std::collections::HashSet::new();
        for mb in &sched.micro_batches {
            for r in mb.first_rank..mb.first_rank + mb.cp {
                prop_assert!(busy.insert((mb.slot, r)));
            }
        }
        let plan = to_plan(0, &sched, &cfg, &TINY);
        let sum = check(&plan);
        prop_assert!(sum.is_ok(), "{:?}", sum);
        let exact: u64 = lens.iter().map(|&l| causal_pairs(u64::from(l))).sum();
        let want = TINY.fwd_flops(exact, 4);
        prop_assert!((sum.unwrap().flops - want).abs() <= 1e-9 * want);
        prop_assert!(check_resident(&plan, u64::from(s)).is_ok());
        // capped rounds: one micro-batch per group a round
        prop_assert!(!capped || sched.slots == sched.rounds);
    }
}
