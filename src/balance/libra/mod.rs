//! Libra's planner (Libra §4–§7): from one step's global batch, already grouped into
//! fixed-size pools by VRSP, to a checked [`Plan`].
//!
//! Owns TAP ([`tap`]: SH-tiles, Eq. 8 FLOPs, Algorithm 2 placement), the tile exchange
//! planner ([`exchange`], §6.1), the pipeliner's equal-head chunking ([`pipeliner`],
//! §6.2–6.3) and the configuration simulator ([`config`], §7). It may not do I/O, group
//! sequences into pools (VRSP lives in `balance::grouping`; the caller passes its pools),
//! or model time (the engine schedules the chunk lists the pipeliner exposes).
//!
//! # Pools, GA indices and workers
//! DP replicas are grouped P at a time; a pool is P replicas × their CP groups,
//! W = P·CP workers, fixed as DP grows. With GBS sequences per step, GA = GBS/DP
//! micro-steps each run DP/P pools side by side. The caller's pools are taken GA-major,
//! pool-minor: pool k runs at GA index k / (DP/P) on pool slot k mod (DP/P); its i-th
//! sequence goes to DP replica slot·P + i. Worker ids are global: replica · CP + cp_rank.

pub mod config;
pub mod exchange;
pub mod pipeliner;
pub mod tap;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::cost::fit::MAX_KEY_TILES;
use crate::cost::AttnShape;
use crate::error::{invalid, Result};
use crate::plan::{Group, Plan, WorkerId, PLAN_VERSION};
use crate::workload::PackedSeq;

/// The attention shape of qwen3-30b-a3b: 32 query heads, 4 KV heads, head dim 128, bf16.
pub const QWEN3_30B_A3B: AttnShape = AttnShape {
    heads_q: 32,
    heads_kv: 4,
    head_dim: 128,
    dtype_bytes: 2,
    mask: crate::cost::Mask::Causal,
};

/// The most workers a pool may have (P·CP).
pub const MAX_POOL_WORKERS: u64 = 1 << 16;

/// The most workers a step may use (DP·CP): worker ids stay far inside u32.
pub const MAX_WORKERS: u64 = 1 << 24;

/// The most SH-tiles one step may be cut into (Σ over its sequences of ⌈L/B⌉ · H): the
/// plan's units, transfers and pipeliner lists grow with them.
pub const MAX_STEP_TILES: u64 = 1 << 22;

/// The most tokens in one tile (B): 16 Mi, sixteen times the longest corpus sequence
/// (libra-1m's 1 Mi tokens); a B past a sequence's length leaves it one tile.
pub const MAX_TILE_TOKENS: u32 = 1 << 24;

/// Libra's knobs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LibraParams {
    /// P: DP replicas per pool.
    pub pool_size: u32,
    /// CP: workers per DP replica's context-parallel group.
    pub cp: u32,
    /// H: equal head shards (divides h_q).
    pub head_shards: u32,
    /// B: tokens per sequence chunk (≥ 1).
    pub tile_tokens: u32,
    /// τ: slack of the soft load cap C = (1+τ)ΣF/|W| (≥ 0).
    pub tau: f64,
    /// M: pipeliner head chunks per worker (divides h_q/H).
    pub chunks: u32,
    /// The attention shape.
    pub shape: AttnShape,
}

impl Default for LibraParams {
    /// The paper's settings (P = 8, τ = 0.03, M = 4) at CP = 16, H = 4, B = 4096 on
    /// qwen3-30b-a3b's attention.
    fn default() -> Self {
        LibraParams {
            pool_size: 8,
            cp: 16,
            head_shards: 4,
            tile_tokens: 4096,
            tau: 0.03,
            chunks: 4,
            shape: QWEN3_30B_A3B,
        }
    }
}

impl LibraParams {
    /// Reject unusable settings with the field, the value and what is allowed.
    pub fn validate(&self) -> Result<()> {
        let s = &self.shape;
        if s.heads_q == 0 {
            return Err(invalid("heads_q", s.heads_q, "at least 1"));
        }
        if s.heads_kv == 0 || s.heads_q % s.heads_kv != 0 {
            return Err(invalid(
                "heads_kv",
                s.heads_kv,
                format!("at least 1 and a divisor of heads_q = {}", s.heads_q),
            ));
        }
        if s.head_dim == 0 || s.dtype_bytes == 0 {
            return Err(invalid(
                "head_dim / dtype_bytes",
                format!("{} / {}", s.head_dim, s.dtype_bytes),
                "both at least 1",
            ));
        }
        if self.pool_size == 0 {
            return Err(invalid("P (pool size)", self.pool_size, "at least 1"));
        }
        if self.cp == 0 {
            return Err(invalid("CP", self.cp, "at least 1"));
        }
        if u64::from(self.pool_size) * u64::from(self.cp) > MAX_POOL_WORKERS {
            return Err(invalid(
                "P × CP (workers per pool)",
                u64::from(self.pool_size) * u64::from(self.cp),
                format!("at most {MAX_POOL_WORKERS}"),
            ));
        }
        if !(1..=MAX_TILE_TOKENS).contains(&self.tile_tokens) {
            return Err(invalid(
                "B (tile tokens)",
                self.tile_tokens,
                format!("1..={MAX_TILE_TOKENS} tokens"),
            ));
        }
        if self.head_shards == 0 || s.heads_q % self.head_shards != 0 {
            return Err(invalid(
                "H (head shards)",
                self.head_shards,
                format!("a divisor of h_q = {}: {}", s.heads_q, divisors(s.heads_q)),
            ));
        }
        let per_shard = s.heads_q / self.head_shards;
        if self.chunks == 0 || per_shard % self.chunks != 0 {
            return Err(invalid(
                "M (pipeliner chunks)",
                self.chunks,
                format!(
                    "a divisor of h_q/H = {}/{} = {per_shard}: {}",
                    s.heads_q,
                    self.head_shards,
                    divisors(per_shard)
                ),
            ));
        }
        if !self.tau.is_finite() || self.tau < 0.0 {
            return Err(invalid(
                "tau",
                self.tau,
                "a finite number ≥ 0 (paper: 0.03)",
            ));
        }
        Ok(())
    }

    /// Workers per pool, W = P·CP.
    pub fn pool_workers(&self) -> u32 {
        self.pool_size * self.cp
    }
}

fn divisors(n: u32) -> String {
    let d: Vec<String> = (1..=n)
        .filter(|d| n % d == 0)
        .map(|d| d.to_string())
        .collect();
    d.join(", ")
}

/// How one step's global batch maps onto GA indices, pools and workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepShape {
    /// Global batch size (sequences).
    pub gbs: u32,
    /// DP degree.
    pub dp: u32,
    /// GA micro-steps, GBS / DP.
    pub ga: u32,
    /// Pools side by side at each GA index, DP / P.
    pub pools_per_ga: u32,
}

/// Check GBS, DP and P against each other.
pub fn step_shape(gbs: usize, dp: u32, p: &LibraParams) -> Result<StepShape> {
    p.validate()?;
    if dp == 0 {
        return Err(invalid("DP", dp, "at least 1"));
    }
    if u64::from(dp) * u64::from(p.cp) > MAX_WORKERS {
        return Err(invalid(
            "DP × CP (workers)",
            u64::from(dp) * u64::from(p.cp),
            format!("at most {MAX_WORKERS}"),
        ));
    }
    if dp % p.pool_size != 0 {
        return Err(invalid(
            "P (pool size)",
            p.pool_size,
            format!("a divisor of DP = {dp}: {}", divisors(dp)),
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
    Ok(StepShape {
        gbs: gbs32,
        dp,
        ga: gbs32 / dp,
        pools_per_ga: dp / p.pool_size,
    })
}

/// Refuse a step whose sequences would be cut into more than [`MAX_STEP_TILES`] tiles
/// (each sequence counted at its capacity L).
pub fn check_tiles(batch: &[PackedSeq], p: &LibraParams) -> Result<()> {
    let b = u64::from(p.tile_tokens.max(1));
    let per_shard: u64 = batch
        .iter()
        .map(|s| u64::from(s.capacity).div_ceil(b))
        .sum();
    let tiles = per_shard.saturating_mul(u64::from(p.head_shards));
    if tiles > MAX_STEP_TILES {
        return Err(invalid(
            "B (tile tokens)",
            p.tile_tokens,
            format!(
                "a tile size that cuts a step into at most {MAX_STEP_TILES} tiles: {} \
                 sequences at B = {} and H = {} make {tiles}",
                batch.len(),
                p.tile_tokens,
                p.head_shards
            ),
        ));
    }
    Ok(())
}

/// Check a grouping: GBS/P pools of exactly P batch indices, every index once.
pub fn check_pools(pools: &[Vec<usize>], gbs: usize, pool_size: u32) -> Result<()> {
    let want = gbs / pool_size.max(1) as usize;
    if pools.len() != want {
        return Err(invalid(
            "pools",
            format!("{} pools", pools.len()),
            format!("GBS/P = {gbs}/{pool_size} = {want} pools"),
        ));
    }
    let mut seen = vec![false; gbs];
    for (k, pool) in pools.iter().enumerate() {
        if pool.len() != pool_size as usize {
            return Err(invalid(
                format!("pools[{k}]"),
                format!("{} sequences", pool.len()),
                format!("exactly P = {pool_size} sequences"),
            ));
        }
        for &i in pool {
            if i >= gbs || std::mem::replace(&mut seen[i], true) {
                return Err(invalid(
                    format!("pools[{k}]"),
                    format!("sequence index {i}"),
                    format!("each batch index 0..{gbs} exactly once over all pools"),
                ));
            }
        }
    }
    Ok(())
}

/// Global worker ids of pool slot `slot`: replica (slot·P + i) · CP + rank.
pub fn pool_workers(slot: u32, p: &LibraParams) -> Vec<WorkerId> {
    (0..p.pool_size)
        .flat_map(|i| (0..p.cp).map(move |rank| (slot * p.pool_size + i) * p.cp + rank))
        .collect()
}

/// Plan one step of Libra. `batch` is the step's global batch in loader order; `pools`
/// the grouping (VRSP's output: GBS/P pools of P batch indices each, pool-id order, each
/// in placement order), taken GA-major, pool-minor. Every batch index must appear exactly
/// once.
pub fn plan_step(
    step: u64,
    batch: &[PackedSeq],
    pools: &[Vec<usize>],
    dp: u32,
    p: &LibraParams,
) -> Result<Plan> {
    let sh = step_shape(batch.len(), dp, p)?;
    check_tiles(batch, p)?;
    check_pools(pools, batch.len(), p.pool_size)?;
    for (i, s) in batch.iter().enumerate() {
        if s.tokens() > u64::from(s.capacity) {
            return Err(invalid(
                format!("batch[{i}] tokens"),
                s.tokens(),
                format!("at most its capacity {}", s.capacity),
            ));
        }
    }
    let groups = pools
        .par_iter()
        .enumerate()
        .map(|(k, pool)| {
            let k = k as u32;
            let (ga, slot) = (k / sh.pools_per_ga, k % sh.pools_per_ga);
            let seqs: Vec<&PackedSeq> = pool.iter().map(|&i| &batch[i]).collect();
            let ids: Vec<u32> = pool.iter().map(|&i| i as u32).collect();
            let workers = pool_workers(slot, p);
            let tiling = tap::tile(&seqs, p.cp, p.tile_tokens, p.head_shards, &p.shape);
            let placement = tap::place(&tiling, p.tau);
            let site = exchange::PoolSite {
                ga,
                pool: slot,
                seq_ids: &ids,
                workers: &workers,
            };
            exchange::build_group(&site, &seqs, &tiling, &placement, &p.shape)
        })
        .collect::<Vec<Group>>();
    check_launches(&groups, p)?;
    Ok(Plan {
        version: PLAN_VERSION,
        scheme: "libra".into(),
        step,
        shape: p.shape,
        head_shards: p.head_shards,
        groups,
    })
}

/// Refuse a plan one worker of which would launch more than [`MAX_KEY_TILES`] key tiles
/// of 64 tokens in one group (Σ ⌈end/64⌉ over its tiles' segments: the blocks of its
/// backward dK/dV launch, which the block models enumerate), as tiles far shorter than
/// their documents make.
fn check_launches(groups: &[Group], p: &LibraParams) -> Result<()> {
    for g in groups {
        let mut tiles: std::collections::BTreeMap<WorkerId, u64> = Default::default();
        for u in &g.units {
            let t: u64 = u
                .segments
                .iter()
                .map(|s| u64::from(s.end.div_ceil(64)))
                .sum();
            *tiles.entry(u.worker).or_default() += t;
        }
        if let Some((w, n)) = tiles.into_iter().find(|&(_, n)| n > MAX_KEY_TILES) {
            return Err(invalid(
                "B (tile tokens)",
                p.tile_tokens,
                format!(
                    "tiles whose attention launches stay within {MAX_KEY_TILES} key tiles of \
                     64 tokens per worker: worker {w} at GA {} would launch {n}",
                    g.ga
                ),
            ));
        }
    }
    Ok(())
}

/// Pools of P consecutive batch indices (the loader's own order, no rebalancing): the
/// grouping of Libra(TAP) without VRSP.
pub fn consecutive_pools(gbs: usize, pool_size: usize) -> Vec<Vec<usize>> {
    (0..gbs)
        .collect::<Vec<_>>()
        .chunks(pool_size.max(1))
        .map(<[usize]>::to_vec)
        .collect()
}

#[cfg(test)]
mod tests;
