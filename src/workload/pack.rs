//! Packing: documents → packed sequences of exactly `L` tokens (padding counted, never
//! computed) → global batches of GBS sequences (one optimizer step).
//!
//! Two packers, both streaming over a corpus's documents in arrival order:
//! - `sequential`: as a production loader does — a document that does not fit in what is
//!   left of the current sequence closes it (the rest is padding) and starts the next one;
//! - `best-fit:W`: the packer looks ahead over a window of the next `W` documents and fills
//!   each sequence by repeatedly taking the longest document that still fits (earliest
//!   arrival among equals), closing the sequence when none does.
//!
//! A document longer than `L` is cut into pieces of at most `L` tokens (offsets 0, L, 2L, …),
//! each a [`Sample`] of its own with `cut = true`; pieces enter the packer in order like
//! documents.

use std::cmp::Reverse;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::str::FromStr;

use super::corpus::Corpus;
use super::{PackedSeq, Sample};
use crate::error::{invalid, Error, Result};

/// The largest best-fit look-ahead window W (documents held at once; each take scans the
/// window's ordered map, so the cost per sequence grows as log W).
pub const MAX_WINDOW: usize = 1 << 20;

/// The longest packed sequence L, tokens.
pub const MAX_SEQ_LEN: u32 = 1 << 24;

/// How documents are packed into sequences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// Arrival order; a document that does not fit starts the next sequence.
    Sequential,
    /// Longest-fitting document first within a look-ahead window of `window` documents.
    BestFit {
        /// The look-ahead window W (≥ 1).
        window: usize,
    },
}

impl FromStr for Packing {
    type Err = Error;

    fn from_str(s: &str) -> Result<Packing> {
        let allowed =
            format!("sequential, best-fit (window 64) or best-fit:W with 1 ≤ W ≤ {MAX_WINDOW}");
        match s.trim() {
            "sequential" => Ok(Packing::Sequential),
            "best-fit" => Ok(Packing::BestFit { window: 64 }),
            other => match other.strip_prefix("best-fit:").map(str::parse::<usize>) {
                Some(Ok(window)) if (1..=MAX_WINDOW).contains(&window) => {
                    Ok(Packing::BestFit { window })
                }
                _ => Err(invalid("packing", other, allowed)),
            },
        }
    }
}

impl fmt::Display for Packing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Packing::Sequential => write!(f, "sequential"),
            Packing::BestFit { window } => write!(f, "best-fit:{window}"),
        }
    }
}

/// A stream of packed sequences over a stream of document lengths.
pub struct Packer<I> {
    docs: I,
    seq_len: u32,
    packing: Packing,
    next_doc: u64,
    /// Pieces of the current (cut) document not yet handed out.
    pieces: VecDeque<Sample>,
    /// Sequential: the piece that did not fit in the last sequence.
    carry: Option<Sample>,
    /// Best-fit: the look-ahead window, keyed (length, earliest arrival first).
    window: BTreeMap<(u32, Reverse<u64>), Sample>,
    arrivals: u64,
}

impl<I: Iterator<Item = u32>> Packer<I> {
    /// A packer of sequences of `seq_len` tokens.
    pub fn new(docs: I, seq_len: u32, packing: Packing) -> Result<Self> {
        if !(1..=MAX_SEQ_LEN).contains(&seq_len) {
            return Err(invalid(
                "seq-len",
                seq_len,
                format!("a sequence length L of 1..={MAX_SEQ_LEN} tokens"),
            ));
        }
        if let Packing::BestFit { window: 0 } = packing {
            return Err(invalid("packing window", 0, "a window W ≥ 1 document"));
        }
        Ok(Packer {
            docs,
            seq_len,
            packing,
            next_doc: 0,
            pieces: VecDeque::new(),
            carry: None,
            window: BTreeMap::new(),
            arrivals: 0,
        })
    }

    /// The next sample in arrival order: a whole document or the next piece of a cut one.
    fn next_piece(&mut self) -> Option<Sample> {
        if let Some(p) = self.pieces.pop_front() {
            return Some(p);
        }
        let len = self.docs.next()?.max(1);
        let doc = self.next_doc;
        self.next_doc += 1;
        if len <= self.seq_len {
            return Some(Sample {
                doc,
                offset: 0,
                len,
                cut: false,
            });
        }
        let mut offset = 0;
        while offset < len {
            let piece = (len - offset).min(self.seq_len);
            self.pieces.push_back(Sample {
                doc,
                offset,
                len: piece,
                cut: true,
            });
            offset += piece;
        }
        self.pieces.pop_front()
    }

    /// A finished sequence, or `None` when the document stream ran dry before it began.
    fn close(&self, samples: Vec<Sample>) -> Option<PackedSeq> {
        if samples.is_empty() {
            return None;
        }
        Some(PackedSeq {
            samples,
            capacity: self.seq_len,
        })
    }

    fn next_sequential(&mut self) -> Option<PackedSeq> {
        let mut samples = Vec::new();
        let mut used = 0u32;
        while let Some(s) = self.carry.take().or_else(|| self.next_piece()) {
            if s.len > self.seq_len - used {
                self.carry = Some(s);
                break;
            }
            used += s.len;
            samples.push(s);
        }
        self.close(samples)
    }

    fn refill(&mut self, window: usize) {
        while self.window.len() < window {
            let Some(s) = self.next_piece() else { break };
            self.window.insert((s.len, Reverse(self.arrivals)), s);
            self.arrivals += 1;
        }
    }

    fn next_best_fit(&mut self, window: usize) -> Option<PackedSeq> {
        let mut samples = Vec::new();
        let mut left = self.seq_len;
        loop {
            self.refill(window);
            let Some((&key, _)) = self.window.range(..=(left, Reverse(0))).next_back() else {
                break;
            };
            if let Some(s) = self.window.remove(&key) {
                left -= s.len;
                samples.push(s);
            }
        }
        self.close(samples)
    }
}

impl<I: Iterator<Item = u32>> Iterator for Packer<I> {
    type Item = PackedSeq;

    fn next(&mut self) -> Option<PackedSeq> {
        match self.packing {
            Packing::Sequential => self.next_sequential(),
            Packing::BestFit { window } => self.next_best_fit(window),
        }
    }
}

/// The global batch of trial `trial`: the first `gbs` packed sequences of the corpus's
/// document stream for `(seed, trial)`.
pub fn global_batch(
    corpus: &Corpus,
    seq_len: u32,
    gbs: usize,
    packing: Packing,
    seed: u64,
    trial: u64,
) -> Result<Vec<PackedSeq>> {
    Ok(batches(corpus, seq_len, gbs, packing, seed, trial)?
        .next()
        .unwrap_or_default())
}

/// Successive global batches (optimizer steps) of `gbs` sequences from one document stream.
pub fn batches(
    corpus: &Corpus,
    seq_len: u32,
    gbs: usize,
    packing: Packing,
    seed: u64,
    trial: u64,
) -> Result<impl Iterator<Item = Vec<PackedSeq>> + '_> {
    if gbs < 1 {
        return Err(invalid("gbs", gbs, "a global batch of ≥ 1 packed sequence"));
    }
    let mut packer = Packer::new(corpus.documents(seed, trial), seq_len, packing)?;
    Ok(std::iter::from_fn(move || {
        let batch: Vec<PackedSeq> = packer.by_ref().take(gbs).collect();
        (batch.len() == gbs).then_some(batch)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(seqs: &[PackedSeq]) -> Vec<Vec<u32>> {
        seqs.iter().map(|s| s.lengths().collect()).collect()
    }

    #[test]
    fn sequential_by_hand() {
        let p = Packer::new([4, 3, 5, 2, 9, 1].into_iter(), 8, Packing::Sequential).unwrap();
        let out: Vec<_> = p.collect();
        assert_eq!(
            lens(&out),
            vec![vec![4, 3], vec![5, 2], vec![8], vec![1, 1]]
        );
        // 9 > 8: cut into 8 + 1, recorded.
        assert!(out[2].samples[0].cut && out[3].samples[0].cut);
        assert_eq!(out[3].samples[0].offset, 8);
        assert_eq!(out[3].samples[0].doc, out[2].samples[0].doc);
        assert!(!out[3].samples[1].cut);
        assert_eq!(out[0].padding(), 1);
    }

    #[test]
    fn sequences_past_the_longest_are_refused() {
        let m = MAX_SEQ_LEN;
        let p = Packer::new([m - 1, 2, 5].into_iter(), m, Packing::Sequential).unwrap();
        assert_eq!(lens(&p.collect::<Vec<_>>()), vec![vec![m - 1], vec![2, 5]]);
        let e = Packer::new([1].into_iter(), m + 1, Packing::Sequential)
            .err()
            .unwrap();
        assert!(e.to_string().contains("1..=16777216 tokens"), "{e}");
    }

    #[test]
    fn best_fit_by_hand() {
        let p = Packer::new(
            [4, 3, 5, 2, 6, 1].into_iter(),
            8,
            Packing::BestFit { window: 3 },
        )
        .unwrap();
        // window {4,3,5}: take 5 (left 3), refill 2 → {4,3,2}: take 3 (left 0) → [5,3]
        // window {4,2,6}: take 6 (left 2), refill 1 → {4,2,1}: take 2 → [6,2]
        // window {4,1}: take 4, take 1 → [4,1]
        assert_eq!(
            lens(&p.collect::<Vec<_>>()),
            vec![vec![5, 3], vec![6, 2], vec![4, 1]]
        );
    }

    #[test]
    fn packing_conserves_tokens_and_respects_capacity() {
        let c = Corpus::from_spec("lognormal:median=3000,p99=90000").unwrap();
        for packing in [Packing::Sequential, Packing::BestFit { window: 16 }] {
            let docs: Vec<u32> = c.documents(3, 0).take(5000).collect();
            let seqs: Vec<_> = Packer::new(docs.iter().copied(), 32_768, packing)
                .unwrap()
                .collect();
            let total: u64 = docs.iter().map(|&d| u64::from(d)).sum();
            assert_eq!(
                seqs.iter().map(PackedSeq::tokens).sum::<u64>(),
                total,
                "{packing}"
            );
            assert!(seqs.iter().all(|s| s.tokens() <= 32_768));
            // every document's pieces add up to it
            let mut per_doc = vec![0u64; docs.len()];
            for s in seqs.iter().flat_map(|s| &s.samples) {
                per_doc[s.doc as usize] += u64::from(s.len);
            }
            assert!(per_doc.iter().zip(&docs).all(|(&a, &b)| a == u64::from(b)));
        }
    }

    #[test]
    fn best_fit_pads_less_than_sequential() {
        let c = Corpus::from_spec("wlbllm").unwrap();
        let pad = |p| -> u64 {
            global_batch(&c, 65_536, 64, p, 1, 0)
                .unwrap()
                .iter()
                .map(PackedSeq::padding)
                .sum()
        };
        assert!(pad(Packing::BestFit { window: 256 }) < pad(Packing::Sequential));
    }

    #[test]
    fn batches_are_whole_and_deterministic() {
        let c = Corpus::from_spec("libra-256k").unwrap();
        let b = global_batch(&c, 262_144, 16, Packing::Sequential, 5, 2).unwrap();
        assert_eq!(b.len(), 16);
        assert_eq!(
            b,
            global_batch(&c, 262_144, 16, Packing::Sequential, 5, 2).unwrap()
        );
        let two: Vec<_> = batches(&c, 262_144, 16, Packing::Sequential, 5, 2)
            .unwrap()
            .take(2)
            .collect();
        assert_eq!(two[0], b);
        assert_ne!(two[1], b);
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert!(Packer::new([1].into_iter(), 0, Packing::Sequential).is_err());
        assert!("best-fit:0".parse::<Packing>().is_err());
        assert!("greedy".parse::<Packing>().is_err());
        assert_eq!(
            "best-fit:8".parse::<Packing>(),
            Ok(Packing::BestFit { window: 8 })
        );
        let c = Corpus::from_spec("fixed:10").unwrap();
        assert!(global_batch(&c, 100, 0, Packing::Sequential, 0, 0).is_err());
    }
}
