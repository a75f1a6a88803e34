//! Megatron-Core's dynamic context parallelism (hybrid DP × CP, the `default_dynamic_cp`
//! sequence-packing scheduler): every sample gets its own CP group, sized by its length,
//! out of the pool of all DP × CP ranks, and the ranks run different numbers of
//! micro-batches in a step.
//!
//! Owns the schedule of one step's samples on the DP × CP ranks ([`schedule`]) and its
//! lowering to a [`Plan`] ([`to_plan`]) and to per-rank micro-batches for the step builder
//! ([`rank_batches`]). Bytes and FLOPs are `plan::build`'s (through `cost::AttnShape`); time
//! is the engine's. No I/O. The rules below are Megatron-LM's (pull requests #2054, #2282,
//! #2000, #5154, #5679: `megatron/core/datasets/data_schedule*.py`,
//! `pipeline_parallel/hybrid_cp_schedule.py`); the code is this module's own.
//!
//! # Rules
//! - **CP size of a sample** of ℓ tokens, with S = `max_seqlen_per_dp_cp_rank` and
//!   `min_dynamic_context_parallel_size` m: c(ℓ) = max(m, 2^⌈log₂⌈ℓ/S⌉⌉) — the fewest ranks
//!   that hold ℓ at S tokens each, rounded up to a power of two. A sample needing more than
//!   the N = DP·CP ranks is an error.
//! - **Groups.** N must be a power of two; the CP groups are the aligned blocks
//!   [j·2^k, (j+1)·2^k) of the DP × CP ranks (rank = replica · CP + position), the process
//!   groups Megatron builds once for every power of two up to N.
//! - **Rounds** (Megatron's "groups" of sub-samples, separated by a barrier over the DP × CP
//!   ranks): samples longest first; each goes to the least-loaded open CP group of its size
//!   in the round, or opens a new one while free ranks remain (a new group's load, 0, always
//!   wins); a sample with neither is deferred to the next round. A rank's load is Σ w(ℓ)/c
//!   of its samples, w the workload estimate ([`DcpLoad`]): Megatron's code uses ℓ² (here
//!   the exact causal pairs ℓ(ℓ+1)/2); NVIDIA's blog describes a cost model of each
//!   sample's execution time, here the forward attention + linear time. Once
//!   every rank is in a group and the samples have reached a smaller CP size than the
//!   round's first, the round closes as soon as the loads are within δ = 5 % (max − min ≤
//!   δ·max, the minimum over the groups that can still grow: those of a size some
//!   remaining sample has), the rest deferred. Ranks left free when the samples run out are filled by
//!   doubling CP groups (Megatron's `fill_empty_gpus`), so a sample may run on more ranks
//!   than its rule asks (never fewer).
//! - **Micro-batches.** A CP group's samples in a round are packed in order into THD
//!   micro-batches while no rank holds more than S tokens of one (the memory bound Megatron
//!   checks with `max_seqlen_per_dp_cp_rank`); each is sharded per document over the group
//!   (every sample cut into 2·c chunks, rank i holding chunks i and 2c−1−i: Transformer
//!   Engine's THD partition) and its attention gathers K and V of every sample within the
//!   group (ring attention moves the same bytes; [`KvReach::AllGather`]).
//! - **Per-token loss.** Megatron requires `--calculate-per-token-loss` with dynamic CP:
//!   ranks see different numbers of samples and tokens, so the loss is Σ token losses /
//!   Σ tokens over the DP × CP group (its token count all-reduced with the gradients), never
//!   a mean of per-micro-batch means. Every token is trained exactly once here, so the
//!   schedule changes no loss; the count's all-reduce is a scalar beside the gradients'.
//!
//! # Choices where the sources leave one open
//! - Deferral keeps the longest-first order (Megatron's buckets also keep it).
//! - The balance test skips groups that can no longer grow (Megatron compares every rank,
//!   so one lone group of a size no other sample has keeps its round open until every
//!   sample is in it).
//! - When free ranks remain, the most-loaded group that fits in them is doubled (Megatron
//!   doubles the first group of the smallest size); groups are then laid on aligned blocks
//!   in decreasing size (power-of-two sizes summing to ≤ N always fit that way).
//! - A round's micro-batches are aligned across ranks: micro-batch j of a round is GA index
//!   (the round's first index) + j on every rank of its group; a rank with fewer
//!   micro-batches in a round has empty slots there (zero tokens, no attention), so its next
//!   round waits, through its CP partners' data, for no one but them, and the DP gradient
//!   all-reduce waits for the slowest rank.
//! - S defaults to ⌈L / CP⌉ (the per-rank tokens of static CP on the same layout), m to 1.
//!
//! # Open and capped rounds
//! Open rounds ([`DcpRounds::Open`], the default) grow until the growable groups' loads
//! agree, so a group may take several micro-batches while others take one: in `four-way`,
//! libra-256k at DP 4, two CP-4 groups take five each, at 2.3–2.4× the load of the CP-8
//! groups. Megatron-Core bounds a round. Its current `next_hdp_group` lets a group take a
//! sample only while its packed tokens per rank stay within S, and ends the round at the
//! first sample that no group of its size has room for ([`DcpRounds::Capped`]: one
//! micro-batch per group a round, the arm tweak `rounds=capped`). Its older
//! `BalancedCPScheduler` trims the most-loaded group while that narrows the spread
//! (`trim_overload`), which is not modelled.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::Serialize;

use super::wlbllm::lower::sharded_group;
use super::wlbllm::{rank_share, shard_per_document, CpConfig, LatencyModel, KERNEL_TILE};
use crate::cost::AttnShape;
use crate::error::{invalid, Result};
use crate::plan::build::{GroupSite, KvReach};
use crate::plan::{Plan, WorkerId, PLAN_VERSION};
use crate::workload::{PackedSeq, Sample};

/// The load imbalance δ at which a round closes: max − min ≤ max / 20.
const BALANCE_SLACK_DIV: u128 = 20;

/// Checked settings of the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DcpConfig {
    /// N = DP · CP ranks (a power of two).
    pub ranks: u32,
    /// S = `max_seqlen_per_dp_cp_rank`: tokens one rank holds of one micro-batch.
    pub max_seqlen_per_rank: u32,
    /// `min_dynamic_context_parallel_size`: the smallest CP group (a power of two ≤ N).
    pub min_cp: u32,
    /// How far a round's groups may grow.
    pub rounds: DcpRounds,
}

/// How far a round's CP groups may grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum DcpRounds {
    /// Until the loads agree (the balance test above): a group may take several
    /// micro-batches in a round while another takes one.
    #[default]
    Open,
    /// Megatron-Core's current scheduler (`next_hdp_group`): a group takes a sample only
    /// while its tokens per rank stay within S, so every group runs one micro-batch a round;
    /// a round ends at the first sample that no group of its size has room for and no free
    /// ranks can take.
    Capped,
}

impl std::str::FromStr for DcpRounds {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> Result<DcpRounds> {
        match s {
            "open" => Ok(DcpRounds::Open),
            "capped" => Ok(DcpRounds::Capped),
            _ => Err(invalid("megatron-dcp rounds", s, "open or capped")),
        }
    }
}

impl DcpConfig {
    /// Check the settings; errors name the field, its value and what is allowed.
    pub fn new(ranks: u32, max_seqlen_per_rank: u32, min_cp: u32) -> Result<DcpConfig> {
        if ranks == 0 || !ranks.is_power_of_two() {
            return Err(invalid(
                "DP × CP (megatron-dcp ranks)",
                ranks,
                "a power of two (dynamic CP groups are aligned power-of-two blocks of the DP × CP ranks)",
            ));
        }
        if max_seqlen_per_rank == 0
            || u64::from(ranks) * u64::from(max_seqlen_per_rank) > u64::from(u32::MAX)
        {
            return Err(invalid(
                "max_seqlen_per_dp_cp_rank",
                max_seqlen_per_rank,
                format!(
                    "at least 1 token, and DP × CP = {ranks} times it at most {} tokens",
                    u32::MAX
                ),
            ));
        }
        if min_cp == 0 || !min_cp.is_power_of_two() || min_cp > ranks {
            return Err(invalid(
                "min_dynamic_cp",
                min_cp,
                format!("a power of two at most DP × CP = {ranks}"),
            ));
        }
        Ok(DcpConfig {
            ranks,
            max_seqlen_per_rank,
            min_cp,
            rounds: DcpRounds::Open,
        })
    }

    /// The same settings with rounds grown as `rounds` says.
    pub fn with_rounds(self, rounds: DcpRounds) -> DcpConfig {
        DcpConfig { rounds, ..self }
    }

    /// The CP size of a sample of `len` tokens: max(m, 2^⌈log₂⌈len/S⌉⌉). Errors when it
    /// exceeds the N ranks.
    pub fn cp_size(&self, len: u32) -> Result<u32> {
        let need = u64::from(len)
            .div_ceil(u64::from(self.max_seqlen_per_rank))
            .max(1)
            .next_power_of_two()
            .max(u64::from(self.min_cp));
        if need > u64::from(self.ranks) {
            return Err(invalid(
                "sample length",
                len,
                format!(
                    "at most DP × CP × max_seqlen_per_dp_cp_rank = {} × {} tokens",
                    self.ranks, self.max_seqlen_per_rank
                ),
            ));
        }
        Ok(need as u32)
    }
}

/// One micro-batch of one CP group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DcpMicroBatch {
    /// Its round (0-based).
    pub round: u32,
    /// Its GA index (its position in the step on every rank of its group).
    pub slot: u32,
    /// The group's first rank (a multiple of `cp`).
    pub first_rank: u32,
    /// The group's size.
    pub cp: u32,
    /// Its samples (indices into [`DcpSchedule::samples`]), in packing order.
    pub samples: Vec<usize>,
}

/// One step's schedule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DcpSchedule {
    /// The step's samples (every sample of every packed sequence, in batch order).
    pub samples: Vec<Sample>,
    /// Micro-batches in (slot, first rank) order.
    pub micro_batches: Vec<DcpMicroBatch>,
    /// Rounds (barrier-separated groups of micro-batches).
    pub rounds: u32,
    /// GA indices the step spans (Σ over rounds of the round's most micro-batches).
    pub slots: u32,
}

impl DcpSchedule {
    /// Micro-batches each of the `ranks` ranks runs.
    pub fn counts(&self, ranks: u32) -> Vec<u32> {
        let mut n = vec![0u32; ranks as usize];
        for mb in &self.micro_batches {
            for r in mb.first_rank..mb.first_rank + mb.cp {
                if let Some(x) = n.get_mut(r as usize) {
                    *x += 1;
                }
            }
        }
        n
    }
}

/// An open CP group of a round.
struct OpenGroup {
    size: u32,
    /// Per-rank load scaled by N: Σ pairs · N / size.
    load: u128,
    /// Tokens its first rank holds of its samples (what [`pack`] holds within S).
    held: u64,
    samples: Vec<usize>,
}

/// How the scheduler estimates a sample's work (its per-rank load is the work / c).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum DcpLoad {
    /// Megatron-LM's code (`dcp_get_total_workload`: ℓ²/c): the exact causal pairs.
    Pairs,
    /// The NVIDIA blog's cost-model estimate: forward attention + linear time of the sample
    /// (W_a + W_l, `LatencyModel::document_s`), so short samples weigh by their tokens too.
    Latency,
}

impl std::str::FromStr for DcpLoad {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> Result<DcpLoad> {
        match s {
            "pairs" => Ok(DcpLoad::Pairs),
            "latency" => Ok(DcpLoad::Latency),
            _ => Err(invalid("megatron-dcp load", s, "pairs or latency")),
        }
    }
}

/// The work of each sample length under `load` (integer: pairs, or picoseconds of `model`).
pub fn sample_work<'m, M: LatencyModel + ?Sized>(
    load: DcpLoad,
    model: &'m M,
) -> impl Fn(u32) -> u128 + 'm {
    move |len| match load {
        DcpLoad::Pairs => u128::from(model.mask().pairs(u64::from(len))),
        DcpLoad::Latency => (model.document_s(len) * 1e12).round().max(1.0) as u128,
    }
}

/// Schedule the samples of a step's global batch `batch` on the config's ranks, a sample of
/// ℓ tokens weighing `work(ℓ)` (see [`sample_work`]).
pub fn schedule(
    batch: &[PackedSeq],
    cfg: &DcpConfig,
    work: impl Fn(u32) -> u128,
) -> Result<DcpSchedule> {
    let samples: Vec<Sample> = batch
        .iter()
        .flat_map(|s| s.samples.iter().copied())
        .filter(|s| s.len > 0)
        .collect();
    let cps = samples
        .iter()
        .map(|s| cfg.cp_size(s.len))
        .collect::<Result<Vec<u32>>>()?;
    let pairs: Vec<u128> = samples.iter().map(|s| work(s.len)).collect();
    // tokens the first rank of a sample's CP group holds of it
    let shares: Vec<u64> = samples
        .iter()
        .zip(&cps)
        .map(|(s, &c)| rank_share(u64::from(s.len), c, 0))
        .collect();
    let mut order: Vec<usize> = (0..samples.len()).collect();
    order.sort_by_key(|&i| (Reverse(samples[i].len), i));
    let mut micro_batches = Vec::new();
    let (mut rounds, mut slots) = (0u32, 0u32);
    while !order.is_empty() {
        let room = match cfg.rounds {
            DcpRounds::Open => None,
            DcpRounds::Capped => Some((shares.as_slice(), u64::from(cfg.max_seqlen_per_rank))),
        };
        let (mut groups, deferred) = round(&order, &cps, &pairs, cfg.ranks, room);
        fill_free_ranks(&mut groups, &pairs, cfg.ranks);
        // aligned blocks in decreasing size (ties: opening order)
        let mut by_size: Vec<usize> = (0..groups.len()).collect();
        by_size.sort_by_key(|&g| (Reverse(groups[g].size), g));
        let mut first_rank = 0u32;
        let mut width = 0u32;
        for g in by_size {
            let OpenGroup {
                size, samples: ids, ..
            } = std::mem::replace(
                &mut groups[g],
                OpenGroup {
                    size: 0,
                    load: 0,
                    held: 0,
                    samples: Vec::new(),
                },
            );
            let packed = pack(&ids, &samples, size, cfg.max_seqlen_per_rank);
            width = width.max(packed.len() as u32);
            for (j, ids) in packed.into_iter().enumerate() {
                micro_batches.push(DcpMicroBatch {
                    round: rounds,
                    slot: slots + j as u32,
                    first_rank,
                    cp: size,
                    samples: ids,
                });
            }
            first_rank += size;
        }
        rounds += 1;
        slots += width;
        order = deferred;
    }
    micro_batches.sort_by_key(|m| (m.slot, m.first_rank));
    Ok(DcpSchedule {
        samples,
        micro_batches,
        rounds,
        slots,
    })
}

/// One round over the samples `order` (longest first): its open groups and the samples
/// deferred to the next round, in order. With `room` = (each sample's tokens on its group's
/// first rank, S), a group takes a sample only while it holds at most S tokens a rank
/// ([`DcpRounds::Capped`]).
fn round(
    order: &[usize],
    cps: &[u32],
    pairs: &[u128],
    n: u32,
    room: Option<(&[u64], u64)>,
) -> (Vec<OpenGroup>, Vec<usize>) {
    let sizes = n.trailing_zeros() as usize + 1;
    // per size exponent: (load, group) of its groups, least-loaded on top (stale entries
    // are skipped: a group's load only grows, its newest entry is the live one)
    let mut heaps: Vec<BinaryHeap<Reverse<(u128, usize)>>> = vec![BinaryHeap::new(); sizes];
    let mut groups: Vec<OpenGroup> = Vec::new();
    let mut deferred = Vec::new();
    let (mut used, mut max_load) = (0u32, 0u128);
    let mut first: Option<u32> = None;
    fn live_min(
        h: &mut BinaryHeap<Reverse<(u128, usize)>>,
        groups: &[OpenGroup],
    ) -> Option<(u128, usize)> {
        while let Some(&Reverse((l, g))) = h.peek() {
            if groups[g].load == l {
                return Some((l, g));
            }
            h.pop();
        }
        None
    }
    // samples of each size exponent not yet reached: a group whose size has none left can
    // no longer grow, and does not hold the round open
    let mut left = vec![0usize; sizes];
    for &i in order {
        left[cps[i].trailing_zeros() as usize] += 1;
    }
    for (k, &i) in order.iter().enumerate() {
        let c = cps[i];
        let e = c.trailing_zeros() as usize;
        left[e] -= 1;
        let g = if used + c <= n {
            used += c;
            groups.push(OpenGroup {
                size: c,
                load: 0,
                held: 0,
                samples: Vec::new(),
            });
            groups.len() - 1
        } else if let Some((shares, s)) = room {
            // the least-loaded group of its size with room (ties: the first opened)
            let fits = (0..groups.len())
                .filter(|&g| groups[g].size == c && groups[g].held + shares[i] <= s)
                .min_by_key(|&g| (groups[g].load, g));
            match fits {
                Some(g) => g,
                // no room in its size's groups: the round ends here
                None if groups.iter().any(|g| g.size == c) => {
                    deferred.extend_from_slice(&order[k..]);
                    break;
                }
                None => {
                    deferred.push(i);
                    continue;
                }
            }
        } else if let Some((_, g)) = live_min(&mut heaps[e], &groups) {
            g
        } else {
            deferred.push(i);
            continue;
        };
        let grp = &mut groups[g];
        grp.held += room.map_or(0, |(shares, _)| shares[i]);
        grp.load += pairs[i] * u128::from(n / c);
        grp.samples.push(i);
        heaps[e].push(Reverse((grp.load, g)));
        max_load = max_load.max(grp.load);
        let first_c = *first.get_or_insert(c);
        if used == n && c < first_c && k + 1 < order.len() {
            let min = (0..sizes)
                .filter(|&s| left[s] > 0)
                .filter_map(|s| live_min(&mut heaps[s], &groups).map(|x| x.0))
                .min()
                .unwrap_or(max_load);
            if (max_load - min) * BALANCE_SLACK_DIV <= max_load {
                deferred.extend_from_slice(&order[k + 1..]);
                break;
            }
        }
    }
    (groups, deferred)
}

/// Double CP groups into the ranks a round left free: the most-loaded group (ties: the
/// first opened) among those that fit, until none is free.
fn fill_free_ranks(groups: &mut [OpenGroup], pairs: &[u128], n: u32) {
    let mut used: u32 = groups.iter().map(|g| g.size).sum();
    while used < n {
        let free = n - used;
        let Some(g) = (0..groups.len())
            .filter(|&g| groups[g].size <= free)
            .max_by_key(|&g| (groups[g].load, Reverse(g)))
        else {
            return;
        };
        let grp = &mut groups[g];
        used += grp.size;
        grp.size *= 2;
        grp.load = grp
            .samples
            .iter()
            .map(|&i| pairs[i] * u128::from(n / grp.size))
            .sum();
    }
}

/// A group's samples packed in order into micro-batches whose per-rank tokens (per-document
/// sharding over `cp` ranks; rank 0 holds the most of every sample) stay within `s`.
fn pack(ids: &[usize], samples: &[Sample], cp: u32, s: u32) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut held = 0u64;
    for &i in ids {
        let share = rank_share(u64::from(samples[i].len), cp, 0);
        match out.last_mut() {
            Some(mb) if held + share <= u64::from(s) => {
                mb.push(i);
                held += share;
            }
            _ => {
                out.push(vec![i]);
                held = share;
            }
        }
    }
    out
}

/// The schedule as a Plan (scheme `megatron-dcp`): one group per micro-batch at its GA
/// index (pool = its first rank) over its CP group's ranks, one Plan sequence each (id = its
/// index in the schedule, capacity c·S), sharded per document, K and V all-gathered.
pub fn to_plan(step: u64, s: &DcpSchedule, cfg: &DcpConfig, shape: &AttnShape) -> Plan {
    let groups = s
        .micro_batches
        .iter()
        .enumerate()
        .map(|(id, mb)| {
            let workers: Vec<WorkerId> = (mb.first_rank..mb.first_rank + mb.cp).collect();
            let samples: Vec<Sample> = mb.samples.iter().map(|&i| s.samples[i]).collect();
            let ranks = shard_per_document(
                &samples,
                CpConfig {
                    cp: mb.cp,
                    tile: KERNEL_TILE,
                },
            );
            let site = GroupSite {
                ga: mb.slot,
                pool: mb.first_rank,
                workers: &workers,
                shape,
                head_shards: 1,
                kv: KvReach::AllGather,
            };
            let lens = samples.iter().map(|x| x.len).collect();
            sharded_group(
                &site,
                id as u32,
                lens,
                mb.cp * cfg.max_seqlen_per_rank,
                &ranks,
            )
        })
        .collect();
    Plan {
        version: PLAN_VERSION,
        scheme: "megatron-dcp".into(),
        step,
        shape: *shape,
        head_shards: 1,
        groups,
    }
}

/// Per rank of the `ranks` DP × CP ranks, its micro-batch at each of the plan's GA indices
/// as the step builder reads one (a rank is a replica of one): the layout pieces it holds
/// (one sample each, `doc` = the Plan sequence), capacity `max_seqlen` (its memory is
/// modelled at S); a GA index where it runs nothing is an empty micro-batch. Also the GA
/// count. Errors: a worker outside the ranks.
pub fn rank_batches(
    plan: &Plan,
    ranks: u32,
    max_seqlen: u32,
) -> Result<(Vec<Vec<PackedSeq>>, u32)> {
    let ga = plan.groups.iter().map(|g| g.ga + 1).max().unwrap_or(1);
    let empty = PackedSeq {
        samples: Vec::new(),
        capacity: max_seqlen,
    };
    let mut batch = vec![vec![empty; ga as usize]; ranks as usize];
    for g in &plan.groups {
        for seq in &g.sequences {
            for r in &seq.layout {
                let Some(mbs) = batch.get_mut(r.worker as usize) else {
                    return Err(invalid(
                        format!("plan group (GA {}, pool {}) worker", g.ga, g.pool),
                        r.worker,
                        format!("a rank below DP × CP = {ranks}"),
                    ));
                };
                mbs[g.ga as usize].samples.push(Sample {
                    doc: u64::from(seq.id),
                    offset: r.start as u32,
                    len: (r.end - r.start) as u32,
                    cut: true,
                });
            }
        }
    }
    Ok((batch, ga))
}

#[cfg(test)]
mod tests;
