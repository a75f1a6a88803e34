//! Descriptive statistics of a corpus and of its packed sequences: what `skewsim corpus`
//! prints, and what theory/ needs (the CV of the per-sequence load).

use std::collections::HashMap;

use serde::Serialize;

use super::PackedSeq;

/// Length statistics of a set of documents (nearest-rank quantiles).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LengthStats {
    /// Documents.
    pub count: usize,
    /// Mean length in tokens.
    pub mean: f64,
    /// Median length.
    pub median: u32,
    /// 90th percentile.
    pub p90: u32,
    /// 99th percentile.
    pub p99: u32,
    /// Longest document.
    pub max: u32,
}

/// The nearest-rank `q`-quantile of sorted values (q in [0, 1]).
pub fn quantile(sorted: &[u32], q: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Statistics of `lengths` (empty input gives zeros).
pub fn length_stats(lengths: &[u32]) -> LengthStats {
    let mut s = lengths.to_vec();
    s.sort_unstable();
    let sum: u64 = s.iter().map(|&x| u64::from(x)).sum();
    LengthStats {
        count: s.len(),
        mean: if s.is_empty() {
            0.0
        } else {
            sum as f64 / s.len() as f64
        },
        median: quantile(&s, 0.5),
        p90: quantile(&s, 0.9),
        p99: quantile(&s, 0.99),
        max: s.last().copied().unwrap_or(0),
    }
}

/// Mean and coefficient of variation (population σ/μ) of values.
pub fn mean_cv(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, if mean > 0.0 { var.sqrt() / mean } else { 0.0 })
}

/// Statistics of a set of packed sequences.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PackStats {
    /// Sequences measured.
    pub sequences: usize,
    /// Sequence length L.
    pub seq_len: u32,
    /// Mean samples per sequence.
    pub samples_per_seq: f64,
    /// Share of the tokens that are padding.
    pub padding_share: f64,
    /// Documents cut because they were longer than L.
    pub cut_documents: usize,
    /// Mean per-sequence attention load w(S) = Σℓ².
    pub load_mean: f64,
    /// Coefficient of variation of the per-sequence load.
    pub load_cv: f64,
    /// Largest per-sequence load over the mean.
    pub load_max_over_mean: f64,
    /// Share of the total load Σℓ² carried by documents of at least `long_doc` tokens.
    pub long_doc_load_share: f64,
    /// The threshold for `long_doc_load_share` (16K by default).
    pub long_doc: u32,
}

/// Statistics of `seqs`; a document is "long" when its whole length is ≥ `long_doc`.
pub fn pack_stats(seqs: &[PackedSeq], long_doc: u32) -> PackStats {
    let loads: Vec<f64> = seqs.iter().map(|s| s.load() as f64).collect();
    let (load_mean, load_cv) = mean_cv(&loads);
    let mut doc_len: HashMap<u64, u64> = HashMap::new();
    let mut cut = HashMap::new();
    for s in seqs.iter().flat_map(|s| &s.samples) {
        *doc_len.entry(s.doc).or_default() += u64::from(s.len);
        if s.cut {
            cut.insert(s.doc, ());
        }
    }
    let (mut long, mut total) = (0f64, 0f64);
    for s in seqs.iter().flat_map(|s| &s.samples) {
        let w = f64::from(s.len) * f64::from(s.len);
        total += w;
        if doc_len[&s.doc] >= u64::from(long_doc) {
            long += w;
        }
    }
    let capacity: u64 = seqs.iter().map(|s| u64::from(s.capacity)).sum();
    let padding: u64 = seqs.iter().map(PackedSeq::padding).sum();
    let max = loads.iter().copied().fold(0.0, f64::max);
    PackStats {
        sequences: seqs.len(),
        seq_len: seqs.first().map_or(0, |s| s.capacity),
        samples_per_seq: seqs.iter().map(|s| s.samples.len()).sum::<usize>() as f64
            / seqs.len().max(1) as f64,
        padding_share: padding as f64 / capacity.max(1) as f64,
        cut_documents: cut.len(),
        load_mean,
        load_cv,
        load_max_over_mean: if load_mean > 0.0 {
            max / load_mean
        } else {
            0.0
        },
        long_doc_load_share: if total > 0.0 { long / total } else { 0.0 },
        long_doc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Sample;

    #[test]
    fn quantiles_by_hand() {
        let s = length_stats(&[5, 1, 4, 2, 3, 10, 9, 8, 7, 6]);
        assert_eq!((s.count, s.median, s.p90, s.p99, s.max), (10, 5, 9, 10, 10));
        assert!((s.mean - 5.5).abs() < 1e-12);
    }

    #[test]
    fn pack_stats_by_hand() {
        let smp = |doc, len| Sample {
            doc,
            offset: 0,
            len,
            cut: false,
        };
        let a = PackedSeq {
            samples: vec![smp(0, 3), smp(1, 1)],
            capacity: 4,
        };
        let b = PackedSeq {
            samples: vec![smp(2, 2)],
            capacity: 4,
        };
        let st = pack_stats(&[a, b], 3);
        // loads 10 and 4: mean 7, σ 3
        assert!((st.load_mean - 7.0).abs() < 1e-12);
        assert!((st.load_cv - 3.0 / 7.0).abs() < 1e-12);
        assert!((st.long_doc_load_share - 9.0 / 14.0).abs() < 1e-12);
        assert!((st.padding_share - 2.0 / 8.0).abs() < 1e-12);
    }
}
