//! Libra's configuration simulator (Libra §7): replay VRSP + TAP over a corpus's global
//! batches for candidate (P, H, B) and report what each costs and balances.
//!
//! Owns the replay and the recommendation rule. It may not read corpora (the caller
//! passes the batches) or group sequences itself (the caller passes the grouping, VRSP in
//! practice). Like the paper's simulator it gives decision support, not an optimum.
//!
//! Per candidate and step: pools from the grouping on the sequences' Σℓ² loads (Eq. 5);
//! **inter-pool imbalance** R − 1 = max_k L_k / mean_k L_k − 1 over the step's pools, L_k
//! a pool's exact causal attention work; **intra-pool imbalance** = max worker load / mean
//! worker load − 1 of TAP's placement, per pool; **exchanged bytes** = Σ over pools of
//! the bytes the exchange moves (one attention layer, forward), and the part of them that
//! crosses nodes (worker ids node-major, G GPUs per node). Rows average over steps
//! (and pools); the worst pool is reported too.

use rayon::prelude::*;
use serde::Serialize;

use super::{check_pools, check_tiles, exchange, pool_workers, step_shape, tap, LibraParams};
use crate::error::Result;
use crate::workload::PackedSeq;

/// One candidate configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Candidate {
    /// P.
    pub pool_size: u32,
    /// H.
    pub head_shards: u32,
    /// B.
    pub tile_tokens: u32,
}

/// What replaying one candidate found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConfigRow {
    /// The candidate.
    pub candidate: Candidate,
    /// Mean over steps of R − 1 between pools.
    pub inter_pool: f64,
    /// Mean over pools of TAP's intra-pool imbalance.
    pub intra_pool: f64,
    /// Worst pool's intra-pool imbalance.
    pub intra_pool_max: f64,
    /// Mean bytes exchanged per step (all pools, one layer forward).
    pub bytes_per_step: f64,
    /// The part of them between workers on different nodes (worker id / GPUs per node).
    pub inter_node_bytes_per_step: f64,
    /// Mean SH-tiles per pool.
    pub tiles_per_pool: f64,
}

/// A grouping policy: (step index, Σℓ² loads of the step's sequences, P) → pools of batch
/// indices.
pub type Grouping<'a> = dyn Fn(usize, &[u64], usize) -> Result<Vec<Vec<usize>>> + Sync + 'a;

/// Replay every candidate over `steps` (each a global batch) at DP = `dp`, other
/// settings from `base`. Candidates run in parallel; rows come back in candidate order.
pub fn simulate(
    steps: &[Vec<PackedSeq>],
    dp: u32,
    gpus_per_node: u32,
    base: &LibraParams,
    candidates: &[Candidate],
    grouping: &Grouping<'_>,
) -> Result<Vec<ConfigRow>> {
    let params: Vec<LibraParams> = candidates
        .iter()
        .map(|c| LibraParams {
            pool_size: c.pool_size,
            head_shards: c.head_shards,
            tile_tokens: c.tile_tokens,
            ..*base
        })
        .collect();
    if gpus_per_node == 0 {
        return Err(crate::error::invalid(
            "gpus per node",
            gpus_per_node,
            "at least 1",
        ));
    }
    for p in &params {
        p.validate()?;
        for s in steps {
            step_shape(s.len(), dp, p)?;
            check_tiles(s, p)?;
        }
    }
    params
        .par_iter()
        .zip(candidates.par_iter())
        .map(|(p, c)| replay(steps, dp, gpus_per_node, p, *c, grouping))
        .collect()
}

fn replay(
    steps: &[Vec<PackedSeq>],
    dp: u32,
    gpus_per_node: u32,
    p: &LibraParams,
    candidate: Candidate,
    grouping: &Grouping<'_>,
) -> Result<ConfigRow> {
    let mut inter = 0.0;
    let mut intra = 0.0;
    let mut intra_max: f64 = 0.0;
    let mut bytes = 0.0;
    let mut inter_node = 0.0;
    let mut tiles = 0.0;
    let mut pools_seen = 0usize;
    for (k, batch) in steps.iter().enumerate() {
        step_shape(batch.len(), dp, p)?;
        let loads: Vec<u64> = batch.iter().map(|s| s.load_under(&p.shape.mask)).collect();
        let pools = grouping(k, &loads, p.pool_size as usize)?;
        check_pools(&pools, batch.len(), p.pool_size)?;
        let mut pool_work = Vec::with_capacity(pools.len());
        let per_ga = dp / p.pool_size;
        for (k, pool) in pools.iter().enumerate() {
            let workers = pool_workers(k as u32 % per_ga, p);
            let seqs: Vec<&PackedSeq> = pool.iter().map(|&i| &batch[i]).collect();
            pool_work.push(seqs.iter().map(|s| s.pairs(&p.shape.mask)).sum::<u64>());
            let t = tap::tile(&seqs, p.cp, p.tile_tokens, p.head_shards, &p.shape);
            let pl = tap::place(&t, p.tau);
            let imb = tap::imbalance(&pl);
            intra += imb;
            intra_max = intra_max.max(imb);
            bytes += pl.comm as f64;
            // bytes between nodes: the exchange's transfers, by global worker id
            let ids: Vec<u32> = pool.iter().map(|&i| i as u32).collect();
            let site = exchange::PoolSite {
                ga: 0,
                pool: 0,
                seq_ids: &ids,
                workers: &workers,
            };
            let g = exchange::build_group(&site, &seqs, &t, &pl, &p.shape);
            inter_node += g
                .transfers
                .iter()
                .filter(|x| x.src / gpus_per_node != x.dst / gpus_per_node)
                .map(|x| x.bytes as f64)
                .sum::<f64>();
            tiles += t.len() as f64;
            pools_seen += 1;
        }
        inter += ratio_minus_one(&pool_work);
    }
    let n = steps.len().max(1) as f64;
    let np = pools_seen.max(1) as f64;
    Ok(ConfigRow {
        candidate,
        inter_pool: inter / n,
        intra_pool: intra / np,
        intra_pool_max: intra_max,
        bytes_per_step: bytes / n,
        inter_node_bytes_per_step: inter_node / n,
        tiles_per_pool: tiles / np,
    })
}

/// max / mean − 1 (0 when everything is 0).
pub fn ratio_minus_one(v: &[u64]) -> f64 {
    let total: u64 = v.iter().sum();
    if total == 0 || v.is_empty() {
        return 0.0;
    }
    v.iter().copied().max().unwrap_or(0) as f64 / (total as f64 / v.len() as f64) - 1.0
}

/// The recommendation and the trade-off behind it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recommendation {
    /// Index of the recommended row.
    pub pick: usize,
    /// True when the pick meets the imbalance target.
    pub meets_target: bool,
    /// The cheapest row in bytes (the communication end of the trade-off).
    pub cheapest: usize,
    /// The best-balanced row (the balance end of the trade-off).
    pub most_balanced: usize,
}

/// A row's imbalance: the worse of inter- and intra-pool.
pub fn worst_imbalance(r: &ConfigRow) -> f64 {
    r.inter_pool.max(r.intra_pool)
}

/// Recommend: of the rows whose imbalance (inter and intra) is within `target`, the one
/// that exchanges the fewest bytes (ties: lower imbalance, then the earlier row); when
/// none is, the best balanced. `None` for no rows.
pub fn recommend(rows: &[ConfigRow], target: f64) -> Option<Recommendation> {
    let by = |key: &dyn Fn(&ConfigRow) -> (f64, f64)| {
        (0..rows.len()).min_by(|&a, &b| {
            let (ka, kb) = (key(&rows[a]), key(&rows[b]));
            ka.0.total_cmp(&kb.0)
                .then(ka.1.total_cmp(&kb.1))
                .then(a.cmp(&b))
        })
    };
    let cheapest = by(&|r| (r.bytes_per_step, worst_imbalance(r)))?;
    let most_balanced = by(&|r| (worst_imbalance(r), r.bytes_per_step))?;
    let feasible = (0..rows.len())
        .filter(|&i| worst_imbalance(&rows[i]) <= target)
        .min_by(|&a, &b| {
            rows[a]
                .bytes_per_step
                .total_cmp(&rows[b].bytes_per_step)
                .then(worst_imbalance(&rows[a]).total_cmp(&worst_imbalance(&rows[b])))
                .then(a.cmp(&b))
        });
    Some(Recommendation {
        pick: feasible.unwrap_or(most_balanced),
        meets_target: feasible.is_some(),
        cheapest,
        most_balanced,
    })
}
