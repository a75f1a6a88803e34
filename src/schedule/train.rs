//! A training run: which packed sequences each step gets, and one step simulated end to
//! end (build the Ulysses graph, run it on the engine). Metrics are `report::step`'s job.
//!
//! The global batch of a step is GBS = DP × GA packed sequences; replica r gets the
//! consecutive sequences r·GA .. (r+1)·GA (as a distributed sampler hands them out), in
//! micro-batch order.

use super::step::{build_step, StepGraph};
use super::{RankMap, RuntimeVariance};
use crate::cost::CostModel;
use crate::engine::{run, Timeline};
use crate::error::{invalid, Result};
use crate::net::NetworkModel;
use crate::workload::corpus::Corpus;
use crate::workload::pack::{batches, Packing};
use crate::workload::PackedSeq;

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
        let s: Vec<PackedSeq> = (0..6)
            .map(|i| PackedSeq::from_lengths(&[i + 1], 8, 0))
            .collect();
        let r = split_replicas(s.clone(), 3, 2);
        assert_eq!(r[1], vec![s[2].clone(), s[3].clone()]);
    }
}
