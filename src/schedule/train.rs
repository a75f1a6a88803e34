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
use crate::workload::pack::{batches, Packing};
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

    /// Successive global batches of `n` (= GBS) packed sequences from one continuous
    /// document stream (as a data loader hands them out): step s is the s-th item.
    pub fn batches(&self, n: usize) -> Result<Box<dyn Iterator<Item = Vec<PackedSeq>> + '_>> {
        Ok(match self {
            Workload::Corpus {
                corpus,
                seq_len,
                packing,
                seed,
            } => Box::new(batches(corpus, *seq_len, n, *packing, *seed, 0)?),
            Workload::Sequences(s) => {
                let mut i = 0usize;
                Box::new(std::iter::from_fn(move || {
                    let b = (0..n).map(|k| s[(i + k) % s.len()].clone()).collect();
                    i = (i + n) % s.len();
                    Some(b)
                }))
            }
            Workload::LogNormal {
                median,
                sigma,
                seq_len,
                seed,
            } => {
                let mut g = LogNormalStream::new(*median, *sigma, *seq_len, *seed);
                Box::new(std::iter::from_fn(move || {
                    Some((0..n).map(|_| g.next_seq()).collect())
                }))
            }
        })
    }

    /// The `n` packed sequences of step `step` (`n` = GBS): the `step`-th item of
    /// [`Workload::batches`].
    pub fn step_sequences(&self, step: u64, n: usize) -> Result<Vec<PackedSeq>> {
        let mut it = self.batches(n)?;
        it.nth(step as usize).ok_or_else(|| {
            invalid(
                "step",
                step,
                "a step the corpus has documents for (trace exhausted)",
            )
        })
    }
}

/// A continuous stream of packed sequences of `cap` tokens from log-normal document
/// lengths; a document that does not fit the space left is cut and its rest starts the
/// next sequence.
struct LogNormalStream {
    ln: Option<LogNormal<f64>>,
    median: f64,
    r: crate::rng::Rng,
    doc: u64,
    carry: Option<(u32, u32)>,
    cap: u32,
}

impl LogNormalStream {
    fn new(median: f64, sigma: f64, cap: u32, seed: u64) -> Self {
        Self {
            ln: LogNormal::new(median.max(1.0).ln(), sigma.max(0.0)).ok(),
            median,
            r: crate::rng::stream(seed, "lognormal-docs", 0),
            doc: 0,
            carry: None,
            cap: cap.max(1),
        }
    }

    fn next_seq(&mut self) -> PackedSeq {
        let mut samples = Vec::new();
        let mut used = 0u32;
        while used < self.cap {
            let (offset, len) = match self.carry.take() {
                Some(c) => c,
                None => {
                    self.doc += 1;
                    let l = match &self.ln {
                        Some(d) => d.sample(&mut self.r),
                        None => self.median,
                    };
                    (0, (l.round().max(1.0)).min(f64::from(u32::MAX)) as u32)
                }
            };
            let take = len.min(self.cap - used);
            if take < len {
                self.carry = Some((offset + take, len - take));
            }
            samples.push(Sample {
                doc: self.doc,
                offset,
                len: take,
                cut: offset > 0 || take < len,
            });
            used += take;
        }
        PackedSeq {
            samples,
            capacity: self.cap,
        }
    }
}

/// `n` packed sequences of `cap` tokens from log-normal document lengths, seeded (the
/// first `n` of one continuous stream).
pub fn lognormal_sequences(
    median: f64,
    sigma: f64,
    cap: u32,
    n: usize,
    seed: u64,
) -> Vec<PackedSeq> {
    let mut g = LogNormalStream::new(median, sigma, cap, seed);
    (0..n).map(|_| g.next_seq()).collect()
}

/// Split a step's GBS sequences over `dp` replicas of `ga` micro-batches.
pub fn split_replicas(seqs: Vec<PackedSeq>, dp: u32, ga: u32) -> Vec<Vec<PackedSeq>> {
    let mut it = seqs.into_iter();
    (0..dp)
        .map(|_| it.by_ref().take(ga as usize).collect())
        .collect()
}

/// Simulate one step whose global batch is `seqs` (GBS = DP × GA sequences) on `net`.
pub fn simulate_batch(
    cost: &CostModel,
    map: RankMap,
    seqs: Vec<PackedSeq>,
    step: u64,
    net: &mut dyn NetworkModel,
    var: &dyn RuntimeVariance,
) -> Result<(StepGraph, Timeline)> {
    let (dp, ga) = (map.par.dp, map.par.ga);
    if seqs.len() != (dp * ga) as usize {
        return Err(invalid(
            "global batch",
            seqs.len(),
            format!("dp x ga = {}", dp * ga),
        ));
    }
    let batch = split_replicas(seqs, dp, ga);
    let sg = build_step(cost, map, &batch, step, var)?;
    let t = run(&sg.graph, net)?;
    Ok((sg, t))
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
        // Steps come from one continuous stream: step 1 is the next 8 sequences.
        let two = wl.batches(8).unwrap().take(2).collect::<Vec<_>>();
        assert_eq!(two[0], a);
        assert_eq!(two[1], wl.step_sequences(1, 8).unwrap());
    }

    #[test]
    fn replicas_get_consecutive_sequences() {
        let s = lognormal_sequences(100.0, 0.5, 1000, 6, 1);
        let r = split_replicas(s.clone(), 3, 2);
        assert_eq!(r[1], vec![s[2].clone(), s[3].clone()]);
    }
}
