//! A training run: which packed sequences each step gets, and one step simulated end to
//! end (build the Ulysses graph, run it on the engine). Metrics are `report::step`'s job.
//!
//! The global batch of a step is GBS = DP × GA packed sequences; replica r gets the
//! consecutive sequences r·GA .. (r+1)·GA (as a distributed sampler hands them out), in
//! micro-batch order.

use rand_distr::{Distribution, LogNormal};

use super::ulysses::{build_step, StepGraph};
use super::{RankMap, RuntimeVariance};
use crate::cost::CostModel;
use crate::engine::{run, Timeline};
use crate::error::{invalid, Result};
use crate::net::NetworkModel;
use crate::workload::corpus::Corpus;
use crate::workload::pack::{global_batch, Packing};
use crate::workload::{PackedSeq, Sample};

/// Where a run's packed sequences come from.
#[derive(Clone, Debug)]
pub enum Workload {
    /// A corpus (`workload::corpus`), packed into sequences of `seq_len` tokens; step s
    /// draws its global batch from the corpus's document stream for (seed, trial = s).
    Corpus {
        /// The corpus.
        corpus: Corpus,
        /// Packed sequence length L.
        seq_len: u32,
        /// How documents are packed.
        packing: Packing,
        /// Seed.
        seed: u64,
    },
    /// Explicit packed sequences (document lengths), used in order and cycled.
    Sequences(Vec<PackedSeq>),
    /// Documents drawn from a log-normal length distribution (median, σ of ln length),
    /// packed greedily in arrival order into sequences of `seq_len` tokens; a document
    /// that does not fit the space left is cut and its rest starts the next sequence.
    LogNormal {
        /// Median document length in tokens.
        median: f64,
        /// σ of the log length.
        sigma: f64,
        /// Packed sequence length L.
        seq_len: u32,
        /// Seed.
        seed: u64,
    },
}

impl Workload {
    /// Check the figures.
    pub fn validate(&self, ctx: &str) -> Result<()> {
        match self {
            Workload::Sequences(s) if s.is_empty() => Err(invalid(
                format!("{ctx}: sequences"),
                "[]",
                "at least one packed sequence",
            )),
            Workload::Sequences(s) => {
                for (i, q) in s.iter().enumerate() {
                    if q.tokens() > u64::from(q.capacity) || q.samples.iter().any(|x| x.len == 0) {
                        return Err(invalid(
                            format!("{ctx}: sequences[{i}]"),
                            q.tokens(),
                            format!(
                                "positive document lengths summing to at most seq_len = {}",
                                q.capacity
                            ),
                        ));
                    }
                }
                Ok(())
            }
            Workload::Corpus { seq_len, .. } => {
                if *seq_len == 0 {
                    return Err(invalid(
                        format!("{ctx}: seq_len"),
                        0,
                        "a positive token count",
                    ));
                }
                Ok(())
            }
            Workload::LogNormal {
                median,
                sigma,
                seq_len,
                ..
            } => {
                if !(median.is_finite() && *median >= 1.0) {
                    return Err(invalid(format!("{ctx}: median"), median, "a length >= 1"));
                }
                if !(sigma.is_finite() && *sigma >= 0.0 && *sigma <= 5.0) {
                    return Err(invalid(
                        format!("{ctx}: sigma"),
                        sigma,
                        "a number in [0, 5]",
                    ));
                }
                if *seq_len == 0 {
                    return Err(invalid(
                        format!("{ctx}: seq_len"),
                        0,
                        "a positive token count",
                    ));
                }
                Ok(())
            }
        }
    }

    /// The `n` packed sequences of step `step` (`n` = GBS).
    pub fn step_sequences(&self, step: u64, n: usize) -> Result<Vec<PackedSeq>> {
        Ok(match self {
            Workload::Corpus {
                corpus,
                seq_len,
                packing,
                seed,
            } => global_batch(corpus, *seq_len, n, *packing, *seed, step)?,
            Workload::Sequences(s) => (0..n)
                .map(|i| s[(step as usize * n + i) % s.len()].clone())
                .collect(),
            Workload::LogNormal {
                median,
                sigma,
                seq_len,
                seed,
            } => lognormal_sequences(
                *median,
                *sigma,
                *seq_len,
                n,
                seed.wrapping_add(step.wrapping_mul(0x9e37_79b9)),
            ),
        })
    }
}

/// `n` packed sequences of `cap` tokens from log-normal document lengths, seeded.
pub fn lognormal_sequences(
    median: f64,
    sigma: f64,
    cap: u32,
    n: usize,
    seed: u64,
) -> Vec<PackedSeq> {
    let ln = LogNormal::new(median.max(1.0).ln(), sigma.max(0.0)).ok();
    let mut r = crate::rng::stream(seed, "lognormal-docs", 0);
    let mut out = Vec::with_capacity(n);
    let mut doc = 0u64;
    let mut carry: Option<(u32, u32)> = None; // (offset, remaining) of a cut document
    for _ in 0..n {
        let mut samples = Vec::new();
        let mut used = 0u32;
        while used < cap {
            let (offset, len) = match carry.take() {
                Some(c) => c,
                None => {
                    doc += 1;
                    let l = ln.map(|d| d.sample(&mut r)).unwrap_or(median);
                    (0, (l.round().max(1.0)).min(f64::from(u32::MAX)) as u32)
                }
            };
            let take = len.min(cap - used);
            if take < len {
                carry = Some((offset + take, len - take));
            }
            let cut = offset > 0 || take < len;
            samples.push(Sample {
                doc,
                offset,
                len: take,
                cut,
            });
            used += take;
        }
        out.push(PackedSeq {
            samples,
            capacity: cap,
        });
    }
    out
}

/// Split a step's GBS sequences over `dp` replicas of `ga` micro-batches.
pub fn split_replicas(seqs: Vec<PackedSeq>, dp: u32, ga: u32) -> Vec<Vec<PackedSeq>> {
    let mut it = seqs.into_iter();
    (0..dp)
        .map(|_| it.by_ref().take(ga as usize).collect())
        .collect()
}

/// Simulate step `step` on `net`.
pub fn simulate_step(
    cost: &CostModel,
    map: RankMap,
    workload: &Workload,
    step: u64,
    net: &mut dyn NetworkModel,
    var: &dyn RuntimeVariance,
) -> Result<(StepGraph, Timeline)> {
    let (dp, ga) = (map.par.dp, map.par.ga);
    let seqs = workload.step_sequences(step, (dp * ga) as usize)?;
    let batch = split_replicas(seqs, dp, ga);
    let sg = build_step(cost, map, &batch, step, var)?;
    let t = run(&sg.graph, net)?;
    Ok((sg, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lognormal_packing_fills_every_sequence_and_keeps_cuts() {
        let s = lognormal_sequences(2000.0, 1.5, 8192, 20, 7);
        assert_eq!(s.len(), 20);
        for q in &s {
            assert_eq!(q.tokens(), 8192);
        }
        // A cut document continues at the start of the next sequence.
        for w in s.windows(2) {
            let last = w[0].samples.last().unwrap();
            let first = w[1].samples[0];
            if first.offset > 0 {
                assert_eq!(first.doc, last.doc);
                assert_eq!(first.offset, last.offset + last.len);
            }
        }
        assert_eq!(s, lognormal_sequences(2000.0, 1.5, 8192, 20, 7));
        assert_ne!(s, lognormal_sequences(2000.0, 1.5, 8192, 20, 8));
    }

    #[test]
    fn corpus_batches_have_gbs_full_sequences() {
        let wl = Workload::Corpus {
            corpus: Corpus::from_spec("libra-256k").unwrap(),
            seq_len: 65_536,
            packing: Packing::Sequential,
            seed: 3,
        };
        let a = wl.step_sequences(0, 8).unwrap();
        assert_eq!(a.len(), 8);
        assert!(a
            .iter()
            .all(|s| s.capacity == 65_536 && s.tokens() <= 65_536));
        assert_ne!(a, wl.step_sequences(1, 8).unwrap());
        assert_eq!(a, wl.step_sequences(0, 8).unwrap());
    }

    #[test]
    fn replicas_get_consecutive_sequences() {
        let s = lognormal_sequences(100.0, 0.5, 1000, 6, 1);
        let r = split_replicas(s.clone(), 3, 2);
        assert_eq!(r[1], vec![s[2].clone(), s[3].clone()]);
    }
}
