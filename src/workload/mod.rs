//! Workload: documents, packed sequences and global batches.
//!
//! Owns the corpus (a source of document lengths), packing of documents into packed
//! sequences of exactly `L` tokens, and the attention-load measures of a packed sequence:
//! the proxy w(S) = Σ ℓ² (Libra Eq. 1/5) and the exact causal query–key pair count
//! Σ ℓ(ℓ+1)/2. It does no I/O: trace *text* is parsed here, files are read at the edge.
//!
//! Architecture invariant: a packed sequence never holds more than `L` tokens, and a
//! document longer than `L` is cut into pieces of at most `L` tokens, each a sample of its
//! own, with the cut recorded on the sample.

pub mod corpus;
pub mod pack;
pub mod stats;

use serde::{Deserialize, Serialize};

/// One sample inside a packed sequence: a whole document, or one piece of a document that
/// was longer than the sequence length and had to be cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Sample {
    /// Index of the document in arrival order.
    pub doc: u64,
    /// Token offset of this piece inside its document (0 for an uncut document).
    pub offset: u32,
    /// Tokens in this sample.
    pub len: u32,
    /// True when the document was longer than `L` and this is one of its pieces.
    pub cut: bool,
}

/// Exact causal query–key pairs of one sample of `len` tokens: Σ_{q<len} (q+1).
pub fn causal_pairs(len: u64) -> u64 {
    crate::cost::Mask::Causal.pairs(len)
}

/// A packed sequence: samples laid end to end in a sequence of `capacity` tokens; the
/// rest is padding (counted in tokens, never computed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackedSeq {
    /// The samples in position order.
    pub samples: Vec<Sample>,
    /// The sequence length `L`.
    pub capacity: u32,
}

impl PackedSeq {
    /// A sequence of `capacity` tokens holding whole documents of the given lengths,
    /// numbered `first_doc`, `first_doc + 1`, … (for pre-packed inputs and tests).
    pub fn from_lengths(lengths: &[u32], capacity: u32, first_doc: u64) -> PackedSeq {
        PackedSeq {
            samples: lengths
                .iter()
                .zip(first_doc..)
                .map(|(&len, doc)| Sample {
                    doc,
                    offset: 0,
                    len,
                    cut: false,
                })
                .collect(),
            capacity,
        }
    }

    /// Tokens holding samples.
    pub fn tokens(&self) -> u64 {
        self.samples.iter().map(|s| u64::from(s.len)).sum()
    }

    /// Padding tokens.
    pub fn padding(&self) -> u64 {
        u64::from(self.capacity) - self.tokens()
    }

    /// The attention-load proxy w(S) = Σ ℓ² (Libra Eq. 1).
    pub fn load(&self) -> u64 {
        self.samples
            .iter()
            .map(|s| u64::from(s.len) * u64::from(s.len))
            .sum()
    }

    /// The load proxy under `mask`: Σ 2·pairs(ℓ) − ℓ ([`crate::cost::Mask::load`]; equal
    /// to [`PackedSeq::load`] under the causal mask).
    pub fn load_under(&self, mask: &crate::cost::Mask) -> u64 {
        self.samples
            .iter()
            .map(|s| mask.load(u64::from(s.len)))
            .sum()
    }

    /// Exact causal query–key pairs Σ ℓ(ℓ+1)/2 (multiply by 4·heads·head_dim for FLOPs).
    pub fn causal_pairs(&self) -> u64 {
        self.pairs(&crate::cost::Mask::Causal)
    }

    /// Exact query–key pairs under `mask`: Σ over samples of the mask's pairs.
    pub fn pairs(&self, mask: &crate::cost::Mask) -> u64 {
        self.samples
            .iter()
            .map(|s| mask.pairs(u64::from(s.len)))
            .sum()
    }

    /// The sample lengths in position order.
    pub fn lengths(&self) -> impl Iterator<Item = u32> + '_ {
        self.samples.iter().map(|s| s.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_and_pairs_by_hand() {
        let s = PackedSeq::from_lengths(&[3, 4], 10, 0);
        assert_eq!(s.samples[1].doc, 1);
        assert_eq!(s.tokens(), 7);
        assert_eq!(s.padding(), 3);
        assert_eq!(s.load(), 9 + 16);
        assert_eq!(s.causal_pairs(), 6 + 10);
    }
}
