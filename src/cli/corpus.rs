//! `skewsim corpus NAME|FILE`: document-length statistics of a corpus and, after packing to
//! L, the spread of the per-sequence attention load.

use anyhow::Result;

use skewsim::experiment::inputs::load_corpus;
use skewsim::experiment::study::{corpus_report, mean_doc_len};
use skewsim::workload::corpus::Corpus;
use skewsim::workload::pack::Packing;

use super::{limits, Output};

#[derive(clap::Args)]
pub struct Args {
    /// A built-in corpus (wlbllm, libra-256k, libra-1m), a parametric spec
    /// (e.g. `lognormal:median=600,p99=33000`) or a trace file (.json, .csv, .txt, .gz).
    pub corpus: String,
    /// Sequence length L to pack to (default: the corpus's own, else 131072).
    #[arg(long, value_parser = limits::count::<u32>(1, limits::MAX_SEQ_LEN))]
    pub seq_len: Option<u32>,
    /// Packed sequences to measure the load spread over.
    #[arg(long, default_value_t = 1024,
          value_parser = limits::count::<usize>(1, limits::MAX_SEQUENCES))]
    pub sequences: usize,
    /// Documents drawn for the length statistics of a distribution (a trace uses all).
    #[arg(long, default_value_t = 200_000,
          value_parser = limits::count::<usize>(1, limits::MAX_SAMPLES))]
    pub samples: usize,
    /// Packing: sequential, best-fit or best-fit:W.
    #[arg(long, default_value = "sequential")]
    pub packing: String,
    /// Seed of the document stream.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Refuse a batch of `n` packed sequences of `seq_len` tokens whose estimated memory
/// exceeds the limit (`flag` names the knob); the mean document length comes from the
/// stream's first documents.
pub fn check_batch_memory(
    corpus: &Corpus,
    seq_len: u32,
    n: usize,
    seed: u64,
    flag: &str,
) -> Result<()> {
    limits::check_memory(
        &format!("{flag} {n} at L = {seq_len}"),
        limits::packed_bytes(n as u64, seq_len, mean_doc_len(corpus, seq_len, seed)),
    )
}

pub fn run(args: Args, out: Output) -> Result<()> {
    let corpus = load_corpus(&args.corpus)?;
    let packing: Packing = args.packing.parse()?;
    let seq_len = args.seq_len.or(corpus.default_seq_len()).unwrap_or(131_072);
    // the statistics' lengths and their sorted copy, beside a trace's own lengths
    let (what, bytes) = match corpus.trace() {
        Some(t) => (
            format!("trace {} of {} documents", args.corpus, t.len()),
            12.0 * t.len() as f64,
        ),
        None => (
            format!("--samples {}", args.samples),
            8.0 * args.samples as f64,
        ),
    };
    limits::check_memory(&what, bytes)?;
    check_batch_memory(&corpus, seq_len, args.sequences, args.seed, "--sequences")?;
    let report = corpus_report(
        &corpus,
        seq_len,
        args.sequences,
        args.samples,
        packing,
        args.seed,
    )?;
    out.emit(&report, || {
        let d = &report.documents;
        let p = &report.packed;
        format!(
            "corpus {name}\n\
             documents  {count:>10}   mean {mean:>10.1}   median {median:>8}   p90 {p90:>8}   p99 {p99:>8}   max {max:>8}\n\
             packed to L = {l} ({packing}, {n} sequences, {sps:.1} samples/seq, {pad:.2}% padding, {cut} documents cut)\n\
             per-sequence load Σℓ²: CV {cv:.3}, max/mean {mx:.2}; share from documents ≥ {long} tokens: {share:.1}%\n",
            name = report.corpus,
            count = d.count,
            mean = d.mean,
            median = d.median,
            p90 = d.p90,
            p99 = d.p99,
            max = d.max,
            l = p.seq_len,
            packing = report.packing,
            n = p.sequences,
            sps = p.samples_per_seq,
            pad = 100.0 * p.padding_share,
            cut = p.cut_documents,
            cv = p.load_cv,
            mx = p.load_max_over_mean,
            long = p.long_doc,
            share = 100.0 * p.long_doc_load_share,
        )
    })
}
