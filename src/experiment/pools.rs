//! Experiment kind `pools`: the pool-size study of `skewsim pools` swept over corpora and
//! global batch sizes, with the paper's figures set beside ours. Writes `results.csv`,
//! `summary.md` and one SVG per chart into the run directory.
//!
//! ```toml
//! kind = "pools"
//! title = "..."
//! seed = 1
//! trials = 200
//! packing = "sequential"            # optional
//! gbs = [128]
//! pool_sizes = [2, 4, 8, 16, 32, 64]
//! policies = ["random", "vrsp"]
//! discussion = """Markdown put under the tables."""   # optional
//! [[corpus]]
//! name = "libra-256k"               # anything `--corpus` accepts
//! seq_len = 262144                  # optional: the corpus's own, else 131072
//! [[paper]]                         # optional: the paper's number for one cell
//! corpus = "libra-256k"
//! gbs = 128
//! pool_size = 8
//! policy = "random"
//! r_minus_1 = 1.077
//! source = "Fig. 8"
//! ```
//!
//! A corpus's rows depend only on (corpus, seq_len, gbs, pool sizes, policies, trials,
//! seed), never on which other corpora the file lists, so a file reduced to one corpus
//! (and its `[[paper]]` rows) reproduces that corpus's rows exactly (the reproduction test
//! relies on this).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use serde::Deserialize;

use crate::balance::Policy;
use crate::error::{bail, invalid, Context, Result};
use crate::report::svg::{palette, Chart, Mark, Scale, Series};
use crate::report::table::{sig, Table};

use super::inputs::load_corpus;
use super::study::{
    chart, check_pool_sizes, check_study_counts, parse_policies, study, trial_loads, Source, Study,
    DEFAULT_SEQ_LEN,
};
use super::{Observer, Outcome};

/// An experiment file of kind `pools`: the pool study over corpora × global batch sizes.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Always `pools`.
    pub kind: String,
    /// Heads the summary.
    pub title: String,
    /// Seed of every stream.
    pub seed: u64,
    /// Monte-Carlo trials (global batches) per (corpus, D).
    pub trials: u64,
    /// Packing of corpus documents: sequential, best-fit or best-fit:W.
    #[serde(default = "sequential")]
    pub packing: String,
    /// Global batch sizes D.
    pub gbs: Vec<usize>,
    /// Pool sizes P; each must divide every D.
    pub pool_sizes: Vec<usize>,
    /// Grouping policies (random, production, zigzag, zigzag-swap, vrsp, lpt).
    pub policies: Vec<String>,
    /// Copied into the summary after the tables.
    #[serde(default)]
    pub discussion: String,
    /// The corpora studied (`[[corpus]]`).
    pub corpus: Vec<CorpusSpec>,
    /// The paper's figures, drawn beside ours (`[[paper]]`).
    #[serde(default)]
    pub paper: Vec<PaperPoint>,
    /// The experiment's name (the file's stem), set by [`parse`].
    #[serde(skip)]
    pub stem: String,
}

fn sequential() -> String {
    "sequential".into()
}

/// One `[[corpus]]` entry.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct CorpusSpec {
    /// A built-in corpus, a parametric spec or a trace file.
    pub name: String,
    /// Sequence length L (default: the corpus's own, else 131072).
    pub seq_len: Option<u32>,
}

/// A figure the paper reports, for comparison (`[[paper]]`).
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct PaperPoint {
    /// The corpus it belongs to.
    pub corpus: String,
    /// Global batch size D.
    pub gbs: usize,
    /// Pool size P.
    pub pool_size: usize,
    /// Grouping policy.
    pub policy: String,
    /// The reported R − 1.
    pub r_minus_1: f64,
    /// Where the paper reports it (figure, table, section).
    pub source: String,
}

/// Parses an experiment file of kind `pools`.
pub fn parse(name: &str, text: &str) -> Result<Spec> {
    let mut spec: Spec =
        toml::from_str(text).with_context(|| format!("{name}: not a valid `pools` experiment"))?;
    spec.stem = Path::new(name)
        .file_stem()
        .map_or_else(|| "experiment".into(), |s| s.to_string_lossy().into_owned());
    if spec.kind != "pools" {
        return Err(invalid(
            "kind",
            format!("{:?}", spec.kind),
            "\"pools\" (this runner reads pools experiments)",
        ))
        .context(name);
    }
    if spec.corpus.is_empty() {
        bail!("{name}: no [[corpus]] entries (at least one)");
    }
    if spec.gbs.is_empty() {
        return Err(invalid("gbs", "[]", "at least one global batch size")).context(name);
    }
    for &g in &spec.gbs {
        check_study_counts(g, spec.trials, ("trials", "gbs")).context(name.to_string())?;
        check_pool_sizes(&spec.pool_sizes, g, ("pool_sizes", "gbs")).context(name)?;
    }
    let policies = parse_policies(&spec.policies, "policies").context(name)?;
    for (i, p) in spec.paper.iter_mut().enumerate() {
        check_paper_point(p, &spec.corpus, &spec.gbs, &spec.pool_sizes, &policies)
            .with_context(|| format!("{name}: [[paper]] row {}", i + 1))?;
    }
    Ok(spec)
}

/// Refuse a `[[paper]]` row that is no cell of the experiment (a corpus, D, P or policy it
/// does not run) or whose R − 1 is no imbalance of that cell: R = max_k L_k/(P·μ) ≤ K with
/// K = D/P pools, so R − 1 lies in 0..=K − 1. The row's policy is set to its canonical name,
/// which the summary matches on.
fn check_paper_point(
    p: &mut PaperPoint,
    corpora: &[CorpusSpec],
    gbs: &[usize],
    pool_sizes: &[usize],
    policies: &[Policy],
) -> Result<()> {
    if !corpora.iter().any(|c| c.name == p.corpus) {
        let names: Vec<String> = corpora.iter().map(|c| format!("{:?}", c.name)).collect();
        return Err(invalid(
            "corpus",
            format!("{:?}", p.corpus),
            format!("a [[corpus]] name of this file: {}", names.join(", ")),
        ));
    }
    if !gbs.contains(&p.gbs) {
        return Err(invalid(
            "gbs",
            p.gbs,
            format!("one of the file's gbs {gbs:?}"),
        ));
    }
    if !pool_sizes.contains(&p.pool_size) {
        return Err(invalid(
            "pool_size",
            p.pool_size,
            format!("one of the file's pool_sizes {pool_sizes:?}"),
        ));
    }
    let policy: Policy = p.policy.parse()?;
    if !policies.contains(&policy) {
        let names: Vec<&str> = policies.iter().map(|q| q.name()).collect();
        return Err(invalid(
            "policy",
            format!("{:?}", p.policy),
            format!("one of the file's policies: {}", names.join(", ")),
        ));
    }
    p.policy = policy.name().to_string();
    let k_minus_1 = (p.gbs / p.pool_size - 1) as f64;
    if !(0.0..=k_minus_1).contains(&p.r_minus_1) {
        return Err(invalid(
            "r_minus_1",
            p.r_minus_1,
            format!(
                "an imbalance R − 1 in 0..={k_minus_1} (K − 1 for K = D/P = {}/{} pools)",
                p.gbs, p.pool_size
            ),
        ));
    }
    Ok(())
}

/// Everything one run produces, in memory: file name → contents.
pub struct Outputs {
    /// File name → contents.
    pub files: BTreeMap<String, String>,
    /// (corpus, study) per (corpus, D), in the file's order.
    pub studies: Vec<(String, Study)>,
}

/// Runs the experiment (no file I/O except reading trace corpora); a progress line per
/// (corpus, D) goes to `observer`, which may cancel between them.
pub fn execute(spec: &Spec, observer: &dyn Observer) -> Result<Outputs> {
    let t0 = Instant::now();
    let sweep = Sweep::new(spec.clone())?;
    let mut studies = Vec::with_capacity(sweep.len());
    for i in 0..sweep.len() {
        if observer.cancelled() {
            return Err(crate::Error::Cancelled);
        }
        studies.push(sweep.run_point(i)?);
        observer.progress(&format!(
            "{} done ({:.1} s)",
            sweep.describe(i),
            t0.elapsed().as_secs_f64()
        ));
    }
    sweep.finish(&studies)
}

/// A `pools` experiment split into its points: point i is one (corpus, D) study, corpora
/// outermost in the file's order, run by [`Sweep::run_point`] alone, and [`Sweep::finish`]
/// writes from all of them the files [`execute`] writes.
pub struct Sweep {
    spec: Spec,
    policies: Vec<Policy>,
    packing: crate::workload::pack::Packing,
}

impl Sweep {
    /// Check the experiment's policies and packing; nothing is simulated.
    pub fn new(spec: Spec) -> Result<Self> {
        Ok(Sweep {
            policies: parse_policies(&spec.policies, "policies")?,
            packing: spec.packing.parse()?,
            spec,
        })
    }

    /// The experiment.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// How many points: corpora × global batch sizes.
    pub fn len(&self) -> usize {
        self.spec.corpus.len() * self.spec.gbs.len()
    }

    /// Whether the sweep has no points.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Point `i`'s corpus and D.
    fn job(&self, i: usize) -> (&CorpusSpec, usize) {
        let g = self.spec.gbs.len();
        (&self.spec.corpus[i / g], self.spec.gbs[i % g])
    }

    /// Point `i` in words (`CORPUS at D = G`), for messages.
    pub fn describe(&self, i: usize) -> String {
        let (c, gbs) = self.job(i);
        format!("{} at D = {gbs}", c.name)
    }

    /// The pool study of point `i` (in `0..len()`).
    pub fn run_point(&self, i: usize) -> Result<Study> {
        if i >= self.len() {
            return Err(invalid(
                "sweep point",
                i,
                format!("0..={} (corpora × gbs)", self.len().saturating_sub(1)),
            ));
        }
        let (c, gbs) = self.job(i);
        let corpus = load_corpus(&c.name)?;
        let seq_len = c
            .seq_len
            .or(corpus.default_seq_len())
            .unwrap_or(DEFAULT_SEQ_LEN);
        let src = Source::Corpus {
            corpus,
            seq_len,
            packing: self.packing,
        };
        let loads = trial_loads(
            &src,
            gbs,
            self.spec.trials,
            self.spec.seed,
            ("trials", "gbs"),
        )?;
        study(
            &src,
            &loads,
            gbs,
            &self.spec.pool_sizes,
            &self.policies,
            self.spec.seed,
        )
    }

    /// The run's files from every point's study (`results[i]` point `i`'s), checked to be
    /// this sweep's points in order.
    pub fn finish(&self, results: &[Study]) -> Result<Outputs> {
        if results.len() != self.len() {
            return Err(invalid(
                "sweep point results",
                results.len(),
                format!("one per point ({})", self.len()),
            ))
            .context(self.spec.stem.as_str());
        }
        let mut studies: Vec<(String, Study)> = Vec::with_capacity(results.len());
        for (i, st) in results.iter().enumerate() {
            let (c, gbs) = self.job(i);
            if st.gbs != gbs || st.trials != self.spec.trials || st.seed != self.spec.seed {
                return Err(invalid(
                    format!("sweep point {i}'s result"),
                    format!("D = {}, {} trials, seed {}", st.gbs, st.trials, st.seed),
                    format!(
                        "the study of {} ({} trials, seed {})",
                        self.describe(i),
                        self.spec.trials,
                        self.spec.seed
                    ),
                ))
                .context(self.spec.stem.as_str());
            }
            studies.push((c.name.clone(), st.clone()));
        }
        let mut files = BTreeMap::new();
        files.insert("results.csv".to_string(), csv(&studies).to_csv());
        let charts = charts(&self.spec, &studies, &self.policies);
        files.insert(
            "summary.md".to_string(),
            summary(&self.spec, &studies, &charts),
        );
        files.extend(charts);
        Ok(Outputs { files, studies })
    }
}

fn csv(studies: &[(String, Study)]) -> Table {
    let mut t = Table::new([
        "corpus",
        "seq_len",
        "gbs",
        "pool_size",
        "pools",
        "policy",
        "trials",
        "mean_r_minus_1",
        "std",
        "p05",
        "p50",
        "p95",
        "max",
        "lln_bound",
        "gaussian_exact",
        "outlier_floor",
        "cardinality_floor",
        "load_cv",
    ]);
    for (name, st) in studies {
        for r in &st.rows {
            let s = &r.r_minus_1;
            t.row([
                name.clone(),
                st.seq_len.to_string(),
                st.gbs.to_string(),
                r.pool_size.to_string(),
                r.pools.to_string(),
                r.policy.to_string(),
                st.trials.to_string(),
                sig(s.mean, 6),
                sig(s.std, 6),
                sig(s.p05, 6),
                sig(s.p50, 6),
                sig(s.p95, 6),
                sig(s.max, 6),
                sig(r.lln_bound, 6),
                sig(r.gaussian_exact, 6),
                sig(r.outlier_floor, 6),
                sig(r.cardinality_floor, 6),
                sig(st.load.cv, 6),
            ]);
        }
    }
    t
}

fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// R − 1 vs P per (corpus, gbs) when several P are swept; else R − 1 vs D per corpus.
/// The paper's values for `policy` as rings in the colour of our series for it (series `i`).
fn paper_series(policy: &Policy, i: usize, pts: Vec<(f64, f64)>) -> Series {
    Series::new(format!("paper: {policy}"), pts, Mark::Ring).color(palette(i))
}

fn charts(
    spec: &Spec,
    studies: &[(String, Study)],
    policies: &[Policy],
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if spec.pool_sizes.len() > 1 {
        for (name, st) in studies {
            let title = format!(
                "{name}: R − 1 vs P (L = {}, D = {}, {} trials)",
                st.seq_len, st.gbs, st.trials
            );
            let mut ch = chart(&title, &st.rows, st.gbs, st.load.cv);
            for (i, pol) in policies.iter().enumerate() {
                let pts: Vec<(f64, f64)> = spec
                    .paper
                    .iter()
                    .filter(|p| &p.corpus == name && p.gbs == st.gbs && p.policy == pol.name())
                    .map(|p| (p.pool_size as f64, p.r_minus_1))
                    .collect();
                if !pts.is_empty() {
                    ch = ch.series(paper_series(pol, i, pts));
                }
            }
            out.insert(format!("{}-gbs{}.svg", slug(name), st.gbs), ch.render());
        }
    } else {
        for c in &spec.corpus {
            let mine: Vec<&Study> = studies
                .iter()
                .filter(|(n, _)| n == &c.name)
                .map(|(_, s)| s)
                .collect();
            let p = spec.pool_sizes[0];
            let mut ch = Chart::new(format!("{}: R − 1 vs global batch D at P = {p}", c.name))
                .x("global batch size D", Scale::Log)
                .x_ticks(spec.gbs.iter().map(|&g| g as f64).collect())
                .y("R − 1 (mean over trials)", Scale::Log);
            for &pol in policies {
                let pts = mine
                    .iter()
                    .flat_map(|s| {
                        s.rows
                            .iter()
                            .filter(|r| r.policy == pol)
                            .map(|r| (s.gbs as f64, r.r_minus_1.mean))
                    })
                    .collect();
                ch = ch.series(Series::line(pol.name(), pts));
            }
            let bound = mine
                .iter()
                .filter_map(|s| s.rows.first().map(|r| (s.gbs as f64, r.lln_bound)))
                .collect();
            ch = ch.series(
                Series::line("LLN bound (Eq. 4)", bound)
                    .dashed()
                    .color("#555555"),
            );
            for (i, pol) in policies.iter().enumerate() {
                let pts: Vec<(f64, f64)> = spec
                    .paper
                    .iter()
                    .filter(|q| q.corpus == c.name && q.pool_size == p && q.policy == pol.name())
                    .map(|q| (q.gbs as f64, q.r_minus_1))
                    .collect();
                if !pts.is_empty() {
                    ch = ch.series(paper_series(pol, i, pts));
                }
            }
            out.insert(format!("{}.svg", slug(&c.name)), ch.render());
        }
    }
    out
}

fn summary(spec: &Spec, studies: &[(String, Study)], charts: &BTreeMap<String, String>) -> String {
    let mut s = format!("# {}\n\n", spec.title);
    let _ = writeln!(
        s,
        "Residual attention-load imbalance R − 1 = max_k L_k/(P·μ) − 1 across K = D/P pools of P \
         packed sequences (load Σℓ², Libra Eq. 1), mean over {} trials (one fresh global batch \
         each), seed {}, {} packing. *LLN bound* is Libra Eq. 4 and *Gaussian exact* the same \
         CLT model with the exact mean maximum of K Gaussians (both as R − 1). \
         *Outlier floor* is the mean of \
         F_max/(ΣF/K) − 1, below which no grouping can go (one sequence heavier than a fair \
         pool share), and *P-floor* the mean of (F_max + the P − 1 lightest)/(ΣF/K) − 1, \
         below which no grouping with exactly P per pool can go. Reproduce with \
         `skewsim run experiments/{}.toml`; `results.csv` has every number at 6 significant \
         digits, with p50, max and std besides.\n",
        spec.trials, spec.seed, spec.packing, spec.stem
    );
    let mut seen = Vec::new();
    for (name, st) in studies {
        if !seen.contains(name) {
            seen.push(name.clone());
            let _ = writeln!(
                s,
                "## {name}\n\nL = {} tokens; per-sequence load CV {:.3}, skewness {:.2}, max/mean {:.1} (over every sampled sequence at D = {}).\n",
                st.seq_len, st.load.cv, st.load.skewness, st.load.max_over_mean, st.gbs
            );
        }
        let mut t = Table::new([
            "D",
            "P",
            "K",
            "policy",
            "mean R−1",
            "p05",
            "p95",
            "LLN bound",
            "Gaussian exact",
            "outlier floor",
            "P-floor",
        ]);
        for r in &st.rows {
            t.row([
                st.gbs.to_string(),
                r.pool_size.to_string(),
                r.pools.to_string(),
                r.policy.to_string(),
                sig(r.r_minus_1.mean, 4),
                sig(r.r_minus_1.p05, 4),
                sig(r.r_minus_1.p95, 4),
                sig(r.lln_bound, 4),
                sig(r.gaussian_exact, 4),
                sig(r.outlier_floor, 4),
                sig(r.cardinality_floor, 4),
            ]);
        }
        s += &t.to_markdown();
        s.push('\n');
    }
    if !spec.paper.is_empty() {
        s += "## The paper's figures beside ours\n\n";
        let mut t = Table::new([
            "corpus",
            "D",
            "P",
            "policy",
            "paper R−1",
            "ours (mean)",
            "ours p05–p95",
            "ours/paper",
            "paper source",
        ]);
        for p in &spec.paper {
            let row = studies
                .iter()
                .find(|(n, st)| n == &p.corpus && st.gbs == p.gbs)
                .and_then(|(_, st)| {
                    st.rows
                        .iter()
                        .find(|r| r.pool_size == p.pool_size && r.policy.name() == p.policy)
                });
            let (ours, band, ratio) = match row {
                Some(r) => (
                    sig(r.r_minus_1.mean, 4),
                    format!("{}–{}", sig(r.r_minus_1.p05, 3), sig(r.r_minus_1.p95, 3)),
                    sig(r.r_minus_1.mean / p.r_minus_1, 3),
                ),
                None => ("not run".into(), String::new(), String::new()),
            };
            t.row([
                p.corpus.clone(),
                p.gbs.to_string(),
                p.pool_size.to_string(),
                p.policy.clone(),
                sig(p.r_minus_1, 4),
                ours,
                band,
                ratio,
                p.source.clone(),
            ]);
        }
        s += &t.to_markdown();
        s.push('\n');
    }
    if !spec.discussion.trim().is_empty() {
        s += "## Where ours differ from the paper, and why\n\n";
        s += spec.discussion.trim();
        s += "\n\n";
    }
    if !charts.is_empty() {
        s += "## Plots\n\n";
        for name in charts.keys() {
            let _ = writeln!(s, "![{name}]({name})\n");
        }
    }
    s
}

/// Run the experiment of kind `pools` in `text` (`file` names it in messages).
pub fn run(file: &Path, text: &str, observer: &dyn Observer) -> Result<Outcome> {
    let spec = parse(&file.display().to_string(), text)?;
    let o = execute(&spec, observer)?;
    outcome(&spec, o)
}

/// A run's [`Outcome`] from its outputs.
pub fn outcome(spec: &Spec, o: Outputs) -> Result<Outcome> {
    let summary = o.files.get("summary.md").cloned().unwrap_or_default();
    let json: Vec<serde_json::Value> = o
        .studies
        .iter()
        .map(|(n, st)| serde_json::json!({"corpus": n, "study": st}))
        .collect();
    Ok(Outcome {
        kind: spec.kind.clone(),
        files: o.files.into_iter().collect(),
        points_file: "results.csv",
        summary,
        json: Some(serde_json::to_string_pretty(&json)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
kind = "pools"
title = "t"
seed = 1
trials = 4
gbs = [32]
pool_sizes = [2, 8]
policies = ["random", "vrsp"]
[[corpus]]
name = "wlbllm"
[[paper]]
corpus = "wlbllm"
gbs = 32
pool_size = 8
policy = "random"
r_minus_1 = 1.077
source = "x"
"#;

    /// The field named by the error of `BASE` with `from` replaced by `to`.
    fn refused(from: &str, to: &str) -> String {
        assert!(BASE.contains(from), "{from:?}");
        let text = BASE.replacen(from, to, 1);
        let e = parse("e.toml", &text).expect_err(to);
        match e.root() {
            crate::Error::Invalid { field, .. } => field.clone(),
            other => panic!("{to}: {other}"),
        }
    }

    #[test]
    fn paper_rows_must_be_a_cell_of_the_experiment_with_an_imbalance_in_range() {
        let spec = parse("e.toml", BASE).unwrap();
        assert_eq!(spec.paper[0].policy, "random");
        let canonical = parse(
            "e.toml",
            &BASE.replace("policy = \"random\"", "policy = \"VRSP\""),
        );
        assert_eq!(canonical.unwrap().paper[0].policy, "vrsp");
        for (from, to, field) in [
            (
                "corpus = \"wlbllm\"\ngbs",
                "corpus = \"zzz\"\ngbs",
                "corpus",
            ),
            ("gbs = 32\npool", "gbs = 0\npool", "gbs"),
            ("gbs = 32\npool", "gbs = 64\npool", "gbs"),
            ("pool_size = 8", "pool_size = 0", "pool_size"),
            ("pool_size = 8", "pool_size = 4", "pool_size"),
            ("policy = \"random\"", "policy = \"lpt\"", "policy"),
            ("policy = \"random\"", "policy = \"zzz\"", "policy"),
            ("r_minus_1 = 1.077", "r_minus_1 = nan", "r_minus_1"),
            ("r_minus_1 = 1.077", "r_minus_1 = inf", "r_minus_1"),
            ("r_minus_1 = 1.077", "r_minus_1 = -1", "r_minus_1"),
            ("r_minus_1 = 1.077", "r_minus_1 = 1e300", "r_minus_1"),
            // K = 32/8 = 4 pools: R − 1 is at most 3.
            ("r_minus_1 = 1.077", "r_minus_1 = 3.5", "r_minus_1"),
        ] {
            assert_eq!(refused(from, to), field, "{to}");
        }
    }

    /// The file's own keys are named, never the `skewsim pools` flags.
    #[test]
    fn refusals_name_the_files_keys() {
        for (from, to, field) in [
            ("pool_sizes = [2, 8]", "pool_sizes = [0]", "pool_sizes"),
            ("pool_sizes = [2, 8]", "pool_sizes = [3]", "pool_sizes"),
            ("pool_sizes = [2, 8]", "pool_sizes = []", "pool_sizes"),
            (
                "policies = [\"random\", \"vrsp\"]",
                "policies = []",
                "policies",
            ),
        ] {
            assert_eq!(refused(from, to), field, "{to}");
        }
        let text = BASE.replacen("\"random\", \"vrsp\"]", "\"zzz\"]", 1);
        let e = parse("e.toml", &text).err().unwrap().to_string();
        assert!(e.contains("e.toml: policies: invalid policy"), "{e}");
        let text = BASE.replacen("pool_sizes = [2, 8]", "pool_sizes = [3]", 1);
        let e = parse("e.toml", &text).err().unwrap().to_string();
        assert!(e.contains("divide gbs = 32") && !e.contains("--"), "{e}");
    }
}
