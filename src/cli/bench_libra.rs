//! Libra's benchmark arms: TAP placement of one 1M-token pool at P = 8, CP = 16,
//! B = 4096, H = 4 (target < 50 ms: Libra runs it on the CPU once per iteration), and,
//! for context, the exchange build and the plan checker on the same pool.
//!
//! Each `pub fn` is a `skewsim bench` arm's setup: prepare untimed, return the timed closure.

use anyhow::Result;

use super::bench::Timed;

use skewsim::balance::libra::{exchange, pool_workers, tap, LibraParams};
use skewsim::plan::{check, Plan, PLAN_VERSION};
use skewsim::workload::corpus::Corpus;
use skewsim::workload::pack::{global_batch, Packing};
use skewsim::workload::PackedSeq;

/// The benchmark pool: the first P = 8 sequences of libra-1m packed to L = 1,048,576
/// (sequential packing, seed 0), and the paper's settings.
pub fn bench_pool() -> Result<(Vec<PackedSeq>, LibraParams)> {
    let corpus = Corpus::from_spec("libra-1m")?;
    let seq_len = corpus.default_seq_len().unwrap_or(1 << 20);
    let p = LibraParams {
        pool_size: 8,
        cp: 16,
        head_shards: 4,
        tile_tokens: 4096,
        ..LibraParams::default()
    };
    let seqs = global_batch(&corpus, seq_len, 8, Packing::Sequential, 0, 0)?;
    Ok((seqs, p))
}

/// TAP on the benchmark pool: SH-tiling (Eq. 8) + Algorithm 2 placement.
pub fn tap_pool_1m() -> Result<Timed> {
    let (seqs, p) = bench_pool()?;
    Ok(Box::new(move || {
        let refs: Vec<&PackedSeq> = seqs.iter().collect();
        let t = tap::tile(&refs, p.cp, p.tile_tokens, p.head_shards, &p.shape);
        let pl = tap::place(&t, p.tau);
        Ok(format!(
            "{} tiles on W = {} workers, {} samples, intra-pool imbalance {:.4}, {:.2} GB exchanged",
            t.len(),
            t.workers,
            t.samples.len(),
            tap::imbalance(&pl),
            pl.comm as f64 / 1e9
        ))
    }))
}

/// Exchange planning on the benchmark pool (placement done untimed).
pub fn exchange_pool_1m() -> Result<Timed> {
    let (seqs, p) = bench_pool()?;
    let refs: Vec<&PackedSeq> = seqs.iter().collect();
    let t = tap::tile(&refs, p.cp, p.tile_tokens, p.head_shards, &p.shape);
    let pl = tap::place(&t, p.tau);
    let ids: Vec<u32> = (0..8).collect();
    let workers = pool_workers(0, &p);
    Ok(Box::new(move || {
        let refs: Vec<&PackedSeq> = seqs.iter().collect();
        let site = exchange::PoolSite {
            ga: 0,
            pool: 0,
            seq_ids: &ids,
            workers: &workers,
        };
        let g = exchange::build_group(&site, &refs, &t, &pl, &p.shape);
        Ok(format!(
            "{} units, {} transfers",
            g.units.len(),
            g.transfers.len()
        ))
    }))
}

/// The plan checker on the benchmark pool's plan (built untimed).
pub fn check_pool_1m() -> Result<Timed> {
    let (seqs, p) = bench_pool()?;
    let refs: Vec<&PackedSeq> = seqs.iter().collect();
    let t = tap::tile(&refs, p.cp, p.tile_tokens, p.head_shards, &p.shape);
    let pl = tap::place(&t, p.tau);
    let ids: Vec<u32> = (0..8).collect();
    let workers = pool_workers(0, &p);
    let site = exchange::PoolSite {
        ga: 0,
        pool: 0,
        seq_ids: &ids,
        workers: &workers,
    };
    let plan = Plan {
        version: PLAN_VERSION,
        scheme: "libra".into(),
        step: 0,
        shape: p.shape,
        head_shards: p.head_shards,
        groups: vec![exchange::build_group(&site, &refs, &t, &pl, &p.shape)],
    };
    Ok(Box::new(move || {
        let s = check(&plan)?;
        Ok(format!("OK: {} units, {} transfers", s.units, s.transfers))
    }))
}
