//! Benchmarks of the WLB-LLM and DistCA planners (issue 6), for `skewsim bench`.
//!
//! Each function builds its input once (outside the timed region), times the planner over
//! `reps` runs and returns one row per configuration; [`table`] prints them. Wall-clock time
//! is measured here, at the edge, never in the library.

use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use skewsim::balance::distca::{self, DistcaConfig, DEFAULT_EPSILON};
use skewsim::balance::wlbllm::{ConstantThroughput, WlbConfig, WlbPacker};
use skewsim::workload::corpus::Corpus;
use skewsim::workload::pack::{global_batch, Packing};
use skewsim::workload::PackedSeq;

/// One benchmark result.
#[derive(Clone, Debug, Serialize)]
pub struct SchemeBenchRow {
    /// What was timed.
    pub bench: String,
    /// Its configuration.
    pub config: String,
    /// Samples in the input.
    pub samples: usize,
    /// What the planner produced (for a sanity glance).
    pub outcome: String,
    /// Timed runs.
    pub reps: usize,
    /// Median wall time per run, milliseconds.
    pub median_ms: f64,
    /// Fastest run, milliseconds.
    pub min_ms: f64,
}

fn time<T>(reps: usize, mut f: impl FnMut() -> Result<T>) -> Result<(T, f64, f64)> {
    let mut times = Vec::with_capacity(reps.max(1));
    let mut last = None;
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        let out = f()?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        last = Some(out);
    }
    times.sort_by(f64::total_cmp);
    let out = last.ok_or_else(|| anyhow::anyhow!("no run"))?;
    Ok((out, times[times.len() / 2], times[0]))
}

fn batch(corpus: &str, servers: usize, seq_len: u32) -> Result<Vec<PackedSeq>> {
    let c = Corpus::from_spec(corpus)?;
    Ok(global_batch(
        &c,
        seq_len,
        servers,
        Packing::Sequential,
        0,
        0,
    )?)
}

/// The DistCA scheduler over one global batch: `servers` in-place attention servers, one
/// packed sequence of `seq_len` tokens each (`corpus`, sequential packing, seed 0),
/// Llama-3-8B's attention shape, ε = 0.10, 128-token shards.
pub fn distca_scheduler(
    corpus: &str,
    servers: usize,
    seq_len: u32,
    reps: usize,
) -> Result<SchemeBenchRow> {
    let b = batch(corpus, servers, seq_len)?;
    let cfg = DistcaConfig::new(
        ConstantThroughput::h200_llama3_8b().shape,
        DEFAULT_EPSILON,
        128,
    )?;
    let (s, median_ms, min_ms) = time(reps, || Ok(distca::schedule(&b, &cfg)?))?;
    let loads: Vec<u64> = b.iter().map(PackedSeq::causal_pairs).collect();
    let mean = loads.iter().sum::<u64>() as f64 / loads.len().max(1) as f64;
    let before = loads
        .iter()
        .map(|&l| (l as f64 - mean).abs() / mean.max(1.0))
        .fold(0.0, f64::max);
    Ok(SchemeBenchRow {
        bench: "distca-scheduler".into(),
        config: format!("{servers} servers × {seq_len} tokens, {corpus}, ε 0.10"),
        samples: b.iter().map(|s| s.samples.len()).sum(),
        outcome: format!(
            "{:?}: max dev {:.1}% → {:.1}%, {} transfers, {:.2} GB",
            s.stop,
            100.0 * before,
            100.0 * s.max_deviation(),
            s.transfers.len(),
            s.bytes() as f64 / 1e9
        ),
        reps,
        median_ms,
        min_ms,
    })
}

/// One WLB-LLM step: variable-length packing of a global batch of `micro_batches` sequences
/// of `seq_len` tokens into `micro_batches` micro-batches under S_max = 2·seq_len.
pub fn wlbllm_step(micro_batches: usize, seq_len: u32, reps: usize) -> Result<SchemeBenchRow> {
    let b = batch("wlbllm", micro_batches, seq_len)?;
    let cfg = WlbConfig::new(micro_batches, 2 * seq_len, None)?;
    let (out, median_ms, min_ms) = time(reps, || {
        let mut p = WlbPacker::new(cfg.clone(), ConstantThroughput::h200_llama3_8b());
        Ok(p.step(&b)?)
    })?;
    Ok(SchemeBenchRow {
        bench: "wlbllm-step".into(),
        config: format!("{micro_batches} micro-batches, {seq_len}-token sequences, wlbllm"),
        samples: b.iter().map(|s| s.samples.len()).sum(),
        outcome: format!(
            "straggler {:.2} ms (estimated), {} carried",
            out.max_latency_s() * 1e3,
            out.carried.len()
        ),
        reps,
        median_ms,
        min_ms,
    })
}

/// The issue-6 benchmarks: the DistCA scheduler at 512 servers × 128K tokens (target: under
/// 100 ms in a release build), at 64 servers and on the libra-256k corpus, and one WLB-LLM
/// step of 512 micro-batches.
pub fn rows(reps: usize) -> Result<Vec<SchemeBenchRow>> {
    Ok(vec![
        distca_scheduler("wlbllm", 64, 131_072, reps)?,
        distca_scheduler("wlbllm", 512, 131_072, reps)?,
        distca_scheduler("libra-256k", 512, 262_144, reps)?,
        wlbllm_step(512, 131_072, reps)?,
    ])
}

/// A text table of the rows.
pub fn table(rows: &[SchemeBenchRow]) -> String {
    let mut s = format!(
        "{:<18} {:<50} {:>8} {:>10} {:>10}  outcome\n",
        "bench", "config", "samples", "median ms", "min ms"
    );
    for r in rows {
        s.push_str(&format!(
            "{:<18} {:<50} {:>8} {:>10.2} {:>10.2}  {}\n",
            r.bench, r.config, r.samples, r.median_ms, r.min_ms, r.outcome
        ));
    }
    s
}
