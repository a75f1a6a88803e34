//! Benchmark arms of the WLB-LLM, DistCA and Megatron dynamic-CP planners for `skewsim
//! bench`: each setup builds its input untimed and returns the closure that `bench` times.

use anyhow::Result;
use rayon::prelude::*;

use skewsim::balance::distca::{self, DistcaConfig, DistcaScheduler, DEFAULT_EPSILON};
use skewsim::balance::megatron_dcp::{self, DcpConfig, DcpLoad};
use skewsim::balance::wlbllm::{ConstantThroughput, WlbConfig, WlbPacker};
use skewsim::workload::corpus::Corpus;
use skewsim::workload::pack::{global_batch, Packing};
use skewsim::workload::PackedSeq;

use super::bench::Timed;

fn batch(corpus: &str, sequences: usize, seq_len: u32) -> Result<Vec<PackedSeq>> {
    let c = Corpus::from_spec(corpus)?;
    Ok(global_batch(
        &c,
        seq_len,
        sequences,
        Packing::Sequential,
        0,
        0,
    )?)
}

/// The DistCA scheduler over one global batch: `servers` in-place attention servers, one
/// packed sequence of `seq_len` tokens each (`corpus`, sequential packing, seed 0),
/// Llama-3-8B's attention shape, ε = 0.10, 128-token shards.
fn distca(corpus: &'static str, servers: usize, seq_len: u32) -> Result<Timed> {
    let b = batch(corpus, servers, seq_len)?;
    let cfg = DistcaConfig::new(
        ConstantThroughput::h200_llama3_8b().shape,
        DEFAULT_EPSILON,
        128,
    )?;
    let loads: Vec<u64> = b.iter().map(PackedSeq::causal_pairs).collect();
    let mean = loads.iter().sum::<u64>() as f64 / loads.len().max(1) as f64;
    let before = loads
        .iter()
        .map(|&l| (l as f64 - mean).abs() / mean.max(1.0))
        .fold(0.0, f64::max);
    Ok(Box::new(move || {
        let s = distca::schedule(&b, &cfg)?;
        Ok(format!(
            "{:?}: max deviation {:.1}% → {:.1}%, {} transfers, {:.2} GB per layer",
            s.stop,
            100.0 * before,
            100.0 * s.max_deviation(),
            s.transfers.len(),
            s.bytes() as f64 / 1e9
        ))
    }))
}

pub fn distca_512() -> Result<Timed> {
    distca("wlbllm", 512, 131_072)
}

pub fn distca_512_256k() -> Result<Timed> {
    distca("libra-256k", 512, 262_144)
}

/// A DistCA scheduler (`scheduler`: the tight one on the baseline's contiguous layout, or
/// the repository's on its mirrored one) over one global batch of `sequences` packed
/// sequences of `seq_len` tokens on DP = `dp` replicas × CP = `cp` ranks (DP·CP in-place
/// attention servers): GA = sequences / DP schedules, one per GA index, no ping-pong,
/// scheduled in parallel and gathered in GA order as `distca::lower` plans a step.
fn distca_cp(
    corpus: &'static str,
    sequences: usize,
    seq_len: u32,
    dp: usize,
    cp: u32,
    scheduler: DistcaScheduler,
) -> Result<Timed> {
    let b = batch(corpus, sequences, seq_len)?;
    let cfg = DistcaConfig::new(
        ConstantThroughput::h200_llama3_8b().shape,
        DEFAULT_EPSILON,
        128,
    )?
    .with_scheduler(scheduler);
    Ok(Box::new(move || {
        let (mut moves, mut bytes, mut in_place, mut dev, mut balanced) =
            (0, 0u64, 0u64, 0.0f64, 0);
        let per_ga: Vec<Result<distca::DistcaSchedule, _>> = b
            .par_chunks(dp)
            .map(|ga| distca::schedule_step(ga, cp, &cfg))
            .collect();
        for s in per_ga {
            let s = s?;
            moves += s.transfers.len();
            bytes += s.moved_bytes();
            in_place += s.in_place_kv_bytes();
            dev = dev.max(s.max_deviation());
            balanced += usize::from(s.stop == distca::Stop::Balanced);
        }
        Ok(format!(
            "{balanced}/{} GA indices Balanced, max deviation {:.1}%, {moves} transfers, {:.2} GB moved + {:.2} GB in-place KV per layer",
            sequences / dp,
            100.0 * dev,
            bytes as f64 / 1e9,
            in_place as f64 / 1e9
        ))
    }))
}

pub fn distca_512_cp8() -> Result<Timed> {
    distca_cp("wlbllm", 512, 131_072, 64, 8, DistcaScheduler::Tight)
}

pub fn distca_reference_512x8() -> Result<Timed> {
    distca_cp("wlbllm", 512, 131_072, 64, 8, DistcaScheduler::Reference)
}

/// One WLB-LLM step: variable-length packing of a global batch of 512 sequences of 128K
/// tokens into 512 micro-batches under S_max = 2·L.
pub fn wlbllm_step() -> Result<Timed> {
    let (micro_batches, seq_len) = (512, 131_072);
    let b = batch("wlbllm", micro_batches, seq_len)?;
    let cfg = WlbConfig::new(micro_batches, 2 * seq_len, None)?;
    Ok(Box::new(move || {
        let mut p = WlbPacker::new(cfg.clone(), ConstantThroughput::h200_llama3_8b());
        let out = p.step(&b)?;
        Ok(format!(
            "estimated straggler {:.2} ms, {} carried",
            out.max_latency_s() * 1e3,
            out.carried.len()
        ))
    }))
}

/// Megatron dynamic CP's planner for one step (the schedule and its Plan): DP 64 × CP 8 =
/// 512 ranks, GA 8, a global batch of 512 sequences of 128K tokens (wlbllm), S = 128K / 8,
/// Megatron's ℓ² workload estimate.
pub fn megatron_dcp_512x8() -> Result<Timed> {
    let (ranks, seq_len) = (512u32, 131_072u32);
    let b = batch("wlbllm", 512, seq_len)?;
    let cfg = DcpConfig::new(ranks, seq_len / 8, 1)?;
    let model = ConstantThroughput::h200_llama3_8b();
    let shape = model.shape;
    Ok(Box::new(move || {
        let work = megatron_dcp::sample_work(DcpLoad::Pairs, &model);
        let s = megatron_dcp::schedule(&b, &cfg, work)?;
        let plan = megatron_dcp::to_plan(0, &s, &cfg, &shape);
        let counts = s.counts(ranks);
        let bytes: u64 = plan
            .groups
            .iter()
            .flat_map(|g| &g.transfers)
            .map(|t| t.bytes)
            .sum();
        Ok(format!(
            "{} samples, {} rounds, GA {}, micro-batches per rank {}–{}, {:.2} GB per layer",
            s.samples.len(),
            s.rounds,
            s.slots,
            counts.iter().min().unwrap_or(&0),
            counts.iter().max().unwrap_or(&0),
            bytes as f64 / 1e9
        ))
    }))
}
