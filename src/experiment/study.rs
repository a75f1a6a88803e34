//! The pool study: residual attention-load imbalance R − 1 across fixed-size sequence
//! pools, per pool size and grouping policy, over Monte-Carlo trials, beside the LLN bound
//! (Libra Eq. 4) and the outlier and exact-cardinality floors. `skewsim pools`, `skewsim
//! theory` and the `pools` experiment kind all read their batches through [`Source`].

use std::path::Path;

use rayon::prelude::*;
use serde::{Deserialize, Deserializer, Serialize};

use crate::balance::Policy;
use crate::cost::Mask;
use crate::error::{bail, invalid, spec_error, Context, Result};
use crate::report::svg::{Chart, Mark, Scale, Series};
use crate::report::table::{sig, Table};
use crate::theory::{self, Residual};
use crate::workload::corpus::Corpus;
use crate::workload::pack::{global_batch, Packing};
use crate::workload::stats::{length_stats, pack_stats, LengthStats, PackStats};
use crate::workload::PackedSeq;

use super::inputs::{load_corpus, read_input_text, MAX_TABLE_BYTES};

/// The default sequence length of a corpus that does not name its own.
pub const DEFAULT_SEQ_LEN: u32 = 131_072;

/// Most Monte-Carlo trials (global batches) of one study.
pub const MAX_TRIALS: u64 = 1 << 20;
/// Most packed sequences in one global batch of a study.
pub const MAX_GBS: usize = 1 << 16;
/// Most documents one study may draw (trials × D × documents per packed sequence): about
/// three minutes of packing on two cores.
pub const MAX_STUDY_DOCUMENTS: f64 = (1u64 << 33) as f64;

/// The mean document length, tokens (each cut to `seq_len`), of the first documents of
/// `corpus`'s stream under `seed`: what a batch's size is estimated from before packing.
pub fn mean_doc_len(corpus: &Corpus, seq_len: u32, seed: u64) -> f64 {
    const PROBE: usize = 4096;
    corpus
        .documents(seed, 0)
        .take(PROBE)
        .map(|l| f64::from(l.min(seq_len.max(1))))
        .sum::<f64>()
        / PROBE as f64
}

/// Refuse trials or a global batch size past their limits; `names` are the two knobs'
/// names in messages (trials first).
pub fn check_study_counts(
    gbs: usize,
    trials: u64,
    (trials_name, gbs_name): (&str, &str),
) -> Result<()> {
    if !(1..=MAX_TRIALS).contains(&trials) {
        return Err(invalid(
            trials_name,
            trials,
            format!("a whole number of trials in 1..={MAX_TRIALS}"),
        ));
    }
    if !(1..=MAX_GBS).contains(&gbs) {
        return Err(invalid(
            gbs_name,
            gbs,
            format!("a global batch of 1..={MAX_GBS} packed sequences"),
        ));
    }
    Ok(())
}

/// Refuse a study past [`check_study_counts`]'s limits, or whose packing would draw more
/// than [`MAX_STUDY_DOCUMENTS`] documents (estimated from the corpus's mean document
/// length); `names` are the trials' and the global batch's knobs in messages.
pub fn check_study_size(
    src: &Source,
    gbs: usize,
    trials: u64,
    seed: u64,
    names: (&str, &str),
) -> Result<()> {
    check_study_counts(gbs, trials, names)?;
    let (trials_name, gbs_name) = names;
    if let Source::Corpus {
        corpus, seq_len, ..
    } = src
    {
        let per_seq = f64::from(*seq_len) / mean_doc_len(corpus, *seq_len, seed).max(1.0) + 1.0;
        let docs = trials as f64 * gbs as f64 * per_seq;
        if docs > MAX_STUDY_DOCUMENTS {
            return Err(invalid(
                trials_name,
                trials,
                format!(
                    "{trials} trials of {gbs} sequences of L = {seq_len} tokens from {} \
                     would draw ~{docs:.2e} documents; at most {MAX_STUDY_DOCUMENTS:.2e}: \
                     fewer trials, a smaller {gbs_name} or a shorter L",
                    corpus.name()
                ),
            ));
        }
    }
    Ok(())
}

/// A corpus's document lengths and its packed sequences (`skewsim corpus`).
#[derive(Serialize, Debug, Clone)]
pub struct CorpusReport {
    /// The corpus's name.
    pub corpus: String,
    /// Document lengths: every document of a trace, `samples` draws of a distribution.
    pub documents: LengthStats,
    /// `sequences` packed sequences of L tokens.
    pub packed: PackStats,
    /// The packing.
    pub packing: String,
}

/// Statistics of `corpus` (its trace, else `samples` documents drawn under `seed`) and of
/// its first `sequences` packed sequences of `seq_len` tokens.
pub fn corpus_report(
    corpus: &Corpus,
    seq_len: u32,
    sequences: usize,
    samples: usize,
    packing: Packing,
    seed: u64,
) -> Result<CorpusReport> {
    let lengths: Vec<u32> = match corpus.trace() {
        Some(t) => t.to_vec(),
        None => corpus.documents(seed, 0).take(samples).collect(),
    };
    let seqs = global_batch(corpus, seq_len, sequences, packing, seed, 0)?;
    Ok(CorpusReport {
        corpus: corpus.name().to_string(),
        documents: length_stats(&lengths),
        packed: pack_stats(&seqs, 16_384),
        packing: packing.to_string(),
    })
}

/// Libra Eq. 4's bound beside Monte Carlo per pool size, and the recommended P
/// (`skewsim theory`).
#[derive(Serialize, Debug, Clone)]
pub struct TheoryReport {
    /// The corpus or packed file.
    pub source: String,
    /// Sequence length L.
    pub seq_len: u32,
    /// Global batch size D.
    pub gbs: usize,
    /// Monte-Carlo trials.
    pub trials: u64,
    /// Seed of every stream.
    pub seed: u64,
    /// The attention mask whose per-sequence load is bounded (left out when causal).
    #[serde(skip_serializing_if = "Mask::is_causal")]
    pub mask: Mask,
    /// Moments of the per-sequence loads.
    pub load: theory::LoadStats,
    /// One row per pool size.
    pub rows: Vec<theory::Comparison>,
    /// The target R − 1.
    pub target: f64,
    /// The smallest P whose bound meets the target.
    pub recommended_by_bound: Option<usize>,
    /// The smallest P whose Monte Carlo mean meets the target.
    pub recommended_by_mc: Option<usize>,
}

/// Refuse a target R − 1 that is negative or not finite (`--target`).
pub fn check_target(target: f64) -> Result<()> {
    if !(target.is_finite() && target >= 0.0) {
        return Err(invalid(
            "--target",
            target,
            "a residual imbalance R − 1 ≥ 0",
        ));
    }
    Ok(())
}

/// The theory comparison over prepared trial loads ([`trial_loads_under`] `mask`) of `src`.
pub fn theory_report(
    src: &Source,
    mask: &Mask,
    loads: &[Vec<u64>],
    gbs: usize,
    pool_sizes: &[usize],
    seed: u64,
    target: f64,
) -> Result<TheoryReport> {
    check_target(target)?;
    let (load, rows) = theory::compare(loads, pool_sizes, seed)?;
    let (by_bound, by_mc) = theory::recommend(&rows, target);
    Ok(TheoryReport {
        source: src.name().to_string(),
        seq_len: src.seq_len(),
        gbs,
        trials: loads.len() as u64,
        seed,
        mask: *mask,
        load,
        rows,
        target,
        recommended_by_bound: by_bound,
        recommended_by_mc: by_mc,
    })
}

/// Where a study's global batches come from.
pub enum Source {
    /// Documents of a corpus packed into global batches.
    Corpus {
        /// The document stream.
        corpus: Corpus,
        /// Sequence length L.
        seq_len: u32,
        /// How documents are packed.
        packing: Packing,
    },
    /// Pre-packed sequences (a `--packed` file).
    Packed {
        /// The file it came from.
        name: String,
        /// The sequences, the batch's first D of them.
        seqs: Vec<PackedSeq>,
        /// Sequence length L.
        seq_len: u32,
    },
}

impl Source {
    /// The corpus's or file's name.
    pub fn name(&self) -> &str {
        match self {
            Source::Corpus { corpus, .. } => corpus.name(),
            Source::Packed { name, .. } => name,
        }
    }
    /// Sequence length L.
    pub fn seq_len(&self) -> u32 {
        match self {
            Source::Corpus { seq_len, .. } | Source::Packed { seq_len, .. } => *seq_len,
        }
    }
    /// The packing (`pre-packed` for a packed file).
    pub fn packing(&self) -> String {
        match self {
            Source::Corpus { packing, .. } => packing.to_string(),
            Source::Packed { .. } => "pre-packed".into(),
        }
    }
}

/// Resolves `--corpus`/`--packed` (exactly one of `corpus`, `packed`), `--seq-len` and
/// `--packing`.
pub fn resolve_source(
    corpus: Option<&str>,
    packed: Option<&Path>,
    seq_len: Option<u32>,
    packing: &str,
    gbs: usize,
) -> Result<Source> {
    if let Some(0) = seq_len {
        return Err(invalid("--seq-len", 0, "a sequence length L ≥ 1 token"));
    }
    if gbs == 0 {
        return Err(invalid("--gbs", 0, "a global batch of ≥ 1 packed sequence"));
    }
    match (corpus, packed) {
        (Some(spec), None) => {
            let corpus = load_corpus(spec)?;
            let seq_len = seq_len
                .or(corpus.default_seq_len())
                .unwrap_or(DEFAULT_SEQ_LEN);
            Ok(Source::Corpus {
                corpus,
                seq_len,
                packing: packing.parse()?,
            })
        }
        (None, Some(path)) => {
            let text = read_input_text(path, MAX_TABLE_BYTES)
                .with_context(|| format!("reading --packed {}", path.display()))?;
            let (seqs, seq_len) = parse_packed(&path.display().to_string(), &text, seq_len, gbs)?;
            Ok(Source::Packed {
                name: path.display().to_string(),
                seqs,
                seq_len,
            })
        }
        _ => bail!("give exactly one of --corpus NAME|FILE or --packed FILE"),
    }
}

/// Parses a `--packed` file: a JSON list of lists of sample lengths (each ≥ 1 token, each
/// sequence ≤ L tokens). Keeps the first `gbs` sequences.
pub fn parse_packed(
    name: &str,
    text: &str,
    seq_len: Option<u32>,
    gbs: usize,
) -> Result<(Vec<PackedSeq>, u32)> {
    let raw: Vec<Vec<serde_json::Number>> = serde_json::from_str(text).with_context(|| {
        format!(
            "{name}: expected a JSON list of lists of sample lengths, e.g. [[4096, 512], [8192]]"
        )
    })?;
    if raw.len() < gbs {
        return Err(invalid(
            "--gbs",
            gbs,
            format!("at most the {} packed sequences {name} holds", raw.len()),
        ));
    }
    let mut lens: Vec<Vec<u32>> = Vec::with_capacity(gbs);
    for (i, seq) in raw.iter().take(gbs).enumerate() {
        let mut v = Vec::with_capacity(seq.len());
        for (j, n) in seq.iter().enumerate() {
            match n.as_u64() {
                Some(x) if (1..=u64::from(u32::MAX)).contains(&x) => v.push(x as u32),
                _ => {
                    return Err(invalid("length", n, "an integer number of tokens ≥ 1"))
                        .context(format!("{name}: sequence {i}, sample {j}"))
                }
            }
        }
        lens.push(v);
    }
    let tokens = |v: &Vec<u32>| v.iter().map(|&x| u64::from(x)).sum::<u64>();
    let longest = lens.iter().map(tokens).max().unwrap_or(0);
    let seq_len = match seq_len {
        Some(l) => {
            if let Some((i, v)) = lens
                .iter()
                .enumerate()
                .find(|(_, v)| tokens(v) > u64::from(l))
            {
                return Err(invalid(
                    "--seq-len",
                    l,
                    format!(
                        "at least the {} tokens sequence {i} of {name} holds",
                        tokens(v)
                    ),
                ));
            }
            l
        }
        None => u32::try_from(longest.max(1)).map_err(|_| {
            spec_error!(
                "{name}: a sequence holds {longest} tokens, more than a u32 sequence length allows"
            )
        })?,
    };
    let mut first_doc = 0u64;
    let seqs = lens
        .into_iter()
        .map(|v| {
            let seq = PackedSeq::from_lengths(&v, seq_len, first_doc);
            first_doc += v.len() as u64;
            seq
        })
        .collect();
    Ok((seqs, seq_len))
}

/// The per-sequence loads Σℓ² of each trial's global batch, trials in parallel and in order,
/// after [`check_study_size`] (`names`: the trials' and the global batch's knobs).
pub fn trial_loads(
    src: &Source,
    gbs: usize,
    trials: u64,
    seed: u64,
    names: (&str, &str),
) -> Result<Vec<Vec<u64>>> {
    trial_loads_under(src, gbs, trials, seed, &Mask::Causal, names)
}

/// [`trial_loads`] with each sequence's load under `mask` (`PackedSeq::load_under`).
pub fn trial_loads_under(
    src: &Source,
    gbs: usize,
    trials: u64,
    seed: u64,
    mask: &Mask,
    names: (&str, &str),
) -> Result<Vec<Vec<u64>>> {
    check_study_size(src, gbs, trials, seed, names)?;
    match src {
        Source::Packed { seqs, .. } => {
            let loads: Vec<u64> = seqs.iter().map(|s| s.load_under(mask)).collect();
            Ok((0..trials).map(|_| loads.clone()).collect())
        }
        Source::Corpus {
            corpus,
            seq_len,
            packing,
        } => (0..trials)
            .into_par_iter()
            .map(|t| {
                let batch = global_batch(corpus, *seq_len, gbs, *packing, seed, t)?;
                if batch.len() != gbs {
                    return Err(invalid(
                        "--gbs",
                        gbs,
                        format!(
                            "at most the {} packed sequences corpus {} gave",
                            batch.len(),
                            corpus.name()
                        ),
                    ));
                }
                Ok(batch.iter().map(|s| s.load_under(mask)).collect())
            })
            .collect(),
    }
}

/// Parses and validates the grouping policies; `field` names them in messages
/// (`--policies`, `policies`).
pub fn parse_policies(names: &[String], field: &str) -> Result<Vec<Policy>> {
    if names.is_empty() {
        return Err(invalid(
            field,
            "\"\"",
            format!("one or more of: {}", Policy::allowed()),
        ));
    }
    names
        .iter()
        .map(|n| n.parse::<Policy>().context(field))
        .collect()
}

/// Checks the pool sizes against D up front, so the error names the knob; `names` are the
/// pool sizes' and the global batch's knobs in messages (`--pool-sizes` and `--gbs`, or a
/// file's `pool_sizes` and `gbs`).
pub fn check_pool_sizes(
    pool_sizes: &[usize],
    gbs: usize,
    (sizes_name, gbs_name): (&str, &str),
) -> Result<()> {
    if pool_sizes.is_empty() {
        return Err(invalid(
            sizes_name,
            "\"\"",
            format!("one or more pool sizes P ≥ 1 that divide {gbs_name} = {gbs}"),
        ));
    }
    for &p in pool_sizes {
        if p == 0 {
            return Err(invalid(
                sizes_name,
                0,
                format!("P = 0 is no pool size: each must be ≥ 1 and divide {gbs_name} = {gbs}"),
            ));
        }
        if gbs % p != 0 {
            return Err(invalid(
                sizes_name,
                p,
                format!(
                    "P = {p} does not divide {gbs_name} = {gbs} (K = D/P pools of exactly P); \
                     allowed: divisors of {gbs}"
                ),
            ));
        }
    }
    Ok(())
}

/// One row of the result table.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Row {
    /// Pool size P.
    pub pool_size: usize,
    /// Pools per global batch, K = D / P.
    pub pools: usize,
    /// Grouping policy (serialized as its name).
    #[serde(deserialize_with = "policy_by_name")]
    pub policy: Policy,
    /// R − 1 over trials.
    pub r_minus_1: theory::Spread,
    /// R − 1 by Libra Eq. 4 for this P (a property of the corpus, the same for every policy).
    pub lln_bound: f64,
    /// R − 1 by the CLT with the exact mean maximum of K Gaussians.
    pub gaussian_exact: f64,
    /// Mean over trials of the indivisible-outlier floor F_max/(ΣF/K) − 1: no policy can
    /// go below it.
    pub outlier_floor: f64,
    /// Mean over trials of the exact-cardinality floor (F_max + the P − 1 lightest)/(ΣF/K) − 1:
    /// no policy with P per pool can go below it.
    pub cardinality_floor: f64,
}

/// A policy read back from its name (what `Policy` serializes to).
fn policy_by_name<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Policy, D::Error> {
    String::deserialize(d)?
        .parse()
        .map_err(serde::de::Error::custom)
}

/// The whole result of one study.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Study {
    /// The corpus or packed file.
    pub source: String,
    /// Sequence length L.
    pub seq_len: u32,
    /// Global batch size D.
    pub gbs: usize,
    /// The packing.
    pub packing: String,
    /// Monte-Carlo trials.
    pub trials: u64,
    /// Seed of every stream.
    pub seed: u64,
    /// Moments of every per-sequence load of every trial.
    pub load: theory::LoadStats,
    /// One row per (P, policy).
    pub rows: Vec<Row>,
}

/// Runs the study over prepared trial loads.
pub fn study(
    src: &Source,
    loads: &[Vec<u64>],
    gbs: usize,
    pool_sizes: &[usize],
    policies: &[Policy],
    seed: u64,
) -> Result<Study> {
    let all: Vec<u64> = loads.iter().flatten().copied().collect();
    let load = theory::load_stats(&all);
    let res: Vec<Residual> = theory::residual_imbalance(loads, pool_sizes, policies, seed)?;
    let mut floors = Vec::with_capacity(pool_sizes.len());
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    for &p in pool_sizes {
        let any: Vec<f64> = loads
            .iter()
            .map(|l| theory::outlier_floor(l, p))
            .collect::<Result<_>>()?;
        let exact: Vec<f64> = loads
            .iter()
            .map(|l| theory::cardinality_floor(l, p))
            .collect::<Result<_>>()?;
        floors.push((p, mean(&any), mean(&exact)));
    }
    let floor_of = |p: usize| {
        floors
            .iter()
            .find(|f| f.0 == p)
            .map_or((0.0, 0.0), |f| (f.1, f.2))
    };
    let rows = res
        .into_iter()
        .map(|r| -> Result<Row> {
            Ok(Row {
                pool_size: r.pool_size,
                pools: gbs / r.pool_size,
                policy: r.policy,
                r_minus_1: r.spread,
                lln_bound: theory::lln_bound(load.cv, gbs, r.pool_size)? - 1.0,
                gaussian_exact: theory::gaussian_exact(load.cv, gbs, r.pool_size)? - 1.0,
                outlier_floor: floor_of(r.pool_size).0,
                cardinality_floor: floor_of(r.pool_size).1,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Study {
        source: src.name().to_string(),
        seq_len: src.seq_len(),
        gbs,
        packing: src.packing(),
        trials: loads.len() as u64,
        seed,
        load,
        rows,
    })
}

/// The result table (6 significant digits, so it is the same bytes everywhere).
pub fn table(rows: &[Row]) -> Table {
    let mut t = Table::new([
        "P",
        "K",
        "policy",
        "mean_R-1",
        "std",
        "p05",
        "p50",
        "p95",
        "max",
        "lln_bound",
        "gaussian_exact",
        "outlier_floor",
        "card_floor",
    ]);
    for r in rows {
        let s = &r.r_minus_1;
        t.row([
            r.pool_size.to_string(),
            r.pools.to_string(),
            r.policy.to_string(),
            sig(s.mean, 4),
            sig(s.std, 3),
            sig(s.p05, 4),
            sig(s.p50, 4),
            sig(s.p95, 4),
            sig(s.max, 4),
            sig(r.lln_bound, 4),
            sig(r.gaussian_exact, 4),
            sig(r.outlier_floor, 4),
            sig(r.cardinality_floor, 4),
        ]);
    }
    t
}

/// R − 1 against P on log axes: one series per policy (mean over trials), Eq. 4 dashed and
/// the exact-max Gaussian model dotted, both drawn smoothly between the smallest and largest P.
pub fn chart(title: &str, rows: &[Row], gbs: usize, cv: f64) -> Chart {
    let mut policies: Vec<Policy> = Vec::new();
    for r in rows {
        if !policies.contains(&r.policy) {
            policies.push(r.policy);
        }
    }
    let mut c = Chart::new(title)
        .x("pool size P", Scale::Log)
        .y("R − 1 (mean over trials)", Scale::Log);
    let mut sizes: Vec<f64> = rows.iter().map(|r| r.pool_size as f64).collect();
    sizes.dedup();
    if sizes.len() > 1 {
        c = c.x_ticks(sizes);
    }
    for p in policies {
        let pts = rows
            .iter()
            .filter(|r| r.policy == p)
            .map(|r| (r.pool_size as f64, r.r_minus_1.mean))
            .collect();
        c = c.series(Series::line(p.name(), pts));
    }
    let (lo, hi) = rows.iter().fold((usize::MAX, 0), |(a, b), r| {
        (a.min(r.pool_size), b.max(r.pool_size))
    });
    if lo < hi {
        let n = 60;
        let d = gbs as f64;
        let curve = |f: &dyn Fn(f64) -> f64| -> Vec<(f64, f64)> {
            (0..=n)
                .map(|i| {
                    let p = (lo as f64) * ((hi as f64) / (lo as f64)).powf(i as f64 / n as f64);
                    (p, f(p))
                })
                .collect()
        };
        let eq4 = curve(&|p: f64| cv / p.sqrt() * (2.0 * (d / p).ln()).max(0.0).sqrt());
        c = c.series(
            Series::new("LLN bound (Eq. 4)", eq4, Mark::Line)
                .dashed()
                .color("#555555"),
        );
        let exact: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.policy == rows[0].policy)
            .map(|r| (r.pool_size as f64, r.gaussian_exact))
            .collect();
        c = c.series(
            Series::new("Gaussian, exact max", exact, Mark::LinePoints)
                .dashed()
                .color("#999999"),
        );
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_file_parsing() {
        let (seqs, l) = parse_packed("f", "[[3, 4], [10], []]", None, 2).unwrap();
        assert_eq!(l, 10);
        assert_eq!(seqs.len(), 2);
        assert_eq!(seqs[0].load(), 25);
        let e = parse_packed("f", "[[3, 0]]", None, 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sequence 0, sample 1: invalid length = 0"),
            "{e}"
        );
        let e = parse_packed("f", "[[3, -2]]", None, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid length = -2"), "{e}");
        let e = parse_packed("f", "[[3], [4]]", Some(3), 2).unwrap_err();
        assert!(
            matches!(&e, crate::Error::Invalid { field, value, allowed }
                if field == "--seq-len" && value == "3" && allowed.contains("4 tokens sequence 1")),
            "{e}"
        );
        let e = parse_packed("f", "[[3]]", None, 2).unwrap_err().to_string();
        assert!(e.contains("--gbs = 2"), "{e}");
        assert!(parse_packed("f", "{\"a\": 1}", None, 1).is_err());
    }

    /// The LLN bound's CV under each mask, by hand: sequences [6], [3, 3], [2, 2, 2] (L = 6),
    /// each document's load 2·pairs(ℓ) − ℓ (ℓ² when causal); D = 3, P = 1, so Eq. 4's
    /// R − 1 = CV·√(2 ln 3).
    #[test]
    fn the_bound_under_each_mask_by_hand() {
        let (seqs, seq_len) = parse_packed("f", "[[6], [3, 3], [2, 2, 2]]", None, 3).unwrap();
        let src = Source::Packed {
            name: "f".into(),
            seqs,
            seq_len,
        };
        let cv = |v: [f64; 3]| {
            let mean = v.iter().sum::<f64>() / 3.0;
            (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 3.0).sqrt() / mean
        };
        for (mask, loads) in [
            // ℓ²: 36; 9 + 9; 4 + 4 + 4
            ("causal", [36, 18, 12]),
            // pairs 11, 5, 3 (keys per query 1 2 2 2 2 2; 1 2 2; 1 2)
            ("sliding:2", [16, 14, 12]),
            // pairs 13, 6, 3 (1 2 3 4 1 2; 1 2 3; 1 2)
            ("chunked:4", [20, 18, 12]),
            // pairs 17, 6, 3 (own block and block 0: 1 2 3 4 3 4; 1 2 3; 1 2)
            ("block-sparse:2:local=1:global=1", [28, 18, 12]),
        ] {
            let m = Mask::parse(mask, "mask").unwrap();
            let l = trial_loads_under(&src, 3, 1, 0, &m, ("trials", "gbs")).unwrap();
            assert_eq!(l, [loads.to_vec()], "{mask}");
            let r = theory_report(&src, &m, &l, 3, &[1], 0, 0.1).unwrap();
            let want = cv(loads.map(|x| x as f64));
            assert_eq!(r.mask, m);
            assert!(
                (r.load.cv - want).abs() < 1e-12,
                "{mask}: {} vs {want}",
                r.load.cv
            );
            let bound = want * (2.0 * 3f64.ln()).sqrt();
            assert!((r.rows[0].bound - bound).abs() < 1e-12, "{mask}");
        }
    }
}
