//! Experiment kind `runtime-variance`: re-run, in simulation, the hardware runtime-variance
//! measurement quoted in the Libra reading note (§3.3): 256 identical GPUs run the same 32K
//! causal attention input for 500 steps; per step, drop the fastest and the slowest GPU and
//! take (slowest − fastest) ÷ fastest. Published: mean 7.01%, peak 15.07%.
//!
//! Writes `summary.md` (ours beside the published figures), `spread.csv` (per step) and
//! `spread.svg` (the per-step spread with both means marked).

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cluster::variance::{spread_study, SpreadStudy};
use crate::cluster::{VarianceModel, VarianceSpec};
use crate::error::{invalid, spec_error, Context, Result};

use super::Outcome as RunOutcome;

/// Published mean and peak trimmed spread (Libra reading note §3.3).
pub const PUBLISHED_MEAN: f64 = 0.0701;
/// Published peak.
pub const PUBLISHED_PEAK: f64 = 0.1507;

/// The experiment file.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    /// Always `runtime-variance`.
    pub kind: String,
    /// Identical GPUs measured.
    pub gpus: u32,
    /// Steps.
    pub steps: u64,
    /// Kernels per step (the measured input is one attention call: 1).
    #[serde(default = "one")]
    pub kernels_per_step: u32,
    /// Outliers dropped at each end per step.
    #[serde(default = "one")]
    pub trim: u32,
    /// Seed of every variance stream.
    pub seed: u64,
    /// Also run seeds `seed + 1 .. seed + seeds − 1` and report the spread of the results.
    #[serde(default = "one")]
    pub seeds: u32,
    /// Variance parameters (absent: the calibrated defaults).
    #[serde(default)]
    pub variance: Option<VarianceSpec>,
}

/// Kernel times one experiment may draw (GPUs × steps × kernels per step × seeds).
const MAX_DRAWS: u64 = 1 << 26;

fn one() -> u32 {
    1
}

/// The result table.
#[derive(Debug, Serialize)]
pub struct Outcome {
    /// GPUs.
    pub gpus: u32,
    /// Steps.
    pub steps: u64,
    /// Our mean spread.
    pub mean: f64,
    /// Our peak spread.
    pub peak: f64,
    /// Published mean.
    pub published_mean: f64,
    /// Published peak.
    pub published_peak: f64,
}

/// (mean, peak) of the extra seeds.
pub type SeedResults = Vec<(f64, f64)>;

/// A `runtime-variance` experiment split into its points: point k is the study under seed
/// `seed + k` (k in `0..seeds`), run by [`Sweep::run_point`] alone, and [`Sweep::finish`]
/// writes from all of them the files [`run`] writes.
pub struct Sweep {
    exp: Experiment,
    spec: VarianceSpec,
    source: String,
}

impl Sweep {
    /// Parse and check the experiment `text` (`source` names it in messages).
    pub fn new(text: &str, source: &str) -> Result<Sweep> {
        let exp: Experiment =
            toml::from_str(text).map_err(|e| crate::error::parse_error(source, e.to_string()))?;
        let ranges = [
            ("gpus", u64::from(exp.gpus), 2, 1_000_000),
            ("steps", exp.steps, 1, 1_000_000),
            (
                "kernels_per_step",
                u64::from(exp.kernels_per_step),
                1,
                100_000,
            ),
            ("seeds", u64::from(exp.seeds), 1, 64),
        ];
        for (field, v, lo, hi) in ranges {
            if !(lo..=hi).contains(&v) {
                return Err(invalid(field, v, format!("an integer in [{lo}, {hi}]")))
                    .context(source);
            }
        }
        let draws = u64::from(exp.gpus)
            * exp.steps
            * u64::from(exp.kernels_per_step)
            * u64::from(exp.seeds);
        if draws > MAX_DRAWS {
            return Err(invalid(
                "gpus × steps × kernels_per_step × seeds",
                format!(
                    "{} × {} × {} × {} = {draws} kernel times",
                    exp.gpus, exp.steps, exp.kernels_per_step, exp.seeds
                ),
                format!("at most {MAX_DRAWS} (a few seconds of drawing)"),
            ))
            .context(source);
        }
        let spec = exp.variance.unwrap_or_default();
        spec.validate(source)?;
        Ok(Sweep {
            exp,
            spec,
            source: source.to_string(),
        })
    }

    /// How many points: the seeds.
    pub fn len(&self) -> usize {
        self.exp.seeds as usize
    }

    /// Whether the sweep has no points.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Point `k` in words (`seed S`), for messages.
    pub fn describe(&self, k: usize) -> String {
        format!("seed {}", self.exp.seed.wrapping_add(k as u64))
    }

    /// The study under point `k`'s seed.
    pub fn run_point(&self, k: usize) -> Result<SpreadStudy> {
        let (exp, source) = (&self.exp, &self.source);
        if k >= self.len() {
            return Err(invalid(
                "sweep point",
                k,
                format!("0..={} (one per seed)", self.len().saturating_sub(1)),
            ));
        }
        let model = VarianceModel::new(self.spec, exp.seed.wrapping_add(k as u64), exp.gpus);
        spread_study(&model, exp.gpus, exp.steps, exp.kernels_per_step, exp.trim)
            .map_err(|e| spec_error!("{source}: {e}"))
    }

    /// The experiment's files from every seed's study (`studies[k]` point `k`'s).
    pub fn finish(&self, studies: &[SpreadStudy]) -> Result<RunOutcome> {
        let (exp, source) = (&self.exp, &self.source);
        if studies.len() != self.len() {
            return Err(invalid(
                "sweep point results",
                studies.len(),
                format!("one per seed ({})", self.len()),
            ))
            .context(source.as_str());
        }
        let others: SeedResults = studies[1..].iter().map(|s| (s.mean, s.peak)).collect();
        outcome(exp, &studies[0], &others, source)
    }

    /// Every seed's study, in order.
    fn run_all(&self) -> Result<Vec<SpreadStudy>> {
        (0..self.len()).map(|k| self.run_point(k)).collect()
    }
}

/// Parse the experiment, run it under its seed and its extra seeds.
pub fn simulate(text: &str, source: &str) -> Result<(Experiment, SpreadStudy, SeedResults)> {
    let sweep = Sweep::new(text, source)?;
    let mut studies = sweep.run_all()?;
    let others = studies[1..].iter().map(|s| (s.mean, s.peak)).collect();
    Ok((sweep.exp, studies.swap_remove(0), others))
}

/// Run the experiment in `text` (`file` names it in messages).
pub fn run(file: &Path, text: &str) -> Result<RunOutcome> {
    let sweep = Sweep::new(text, &file.display().to_string())?;
    sweep.finish(&sweep.run_all()?)
}

/// The run's files from the main seed's study and the extra seeds' (mean, peak).
fn outcome(
    exp: &Experiment,
    study: &SpreadStudy,
    others: &[(f64, f64)],
    source: &str,
) -> Result<RunOutcome> {
    let outcome = Outcome {
        gpus: exp.gpus,
        steps: exp.steps,
        mean: study.mean,
        peak: study.peak,
        published_mean: PUBLISHED_MEAN,
        published_peak: PUBLISHED_PEAK,
    };
    let summary = summary_md(exp, study, others, source);
    let mut csv = String::from("step,spread\n");
    for (i, x) in study.spread.iter().enumerate() {
        let _ = writeln!(csv, "{i},{x:.6}");
    }
    Ok(RunOutcome {
        kind: exp.kind.clone(),
        files: vec![
            ("summary.md".into(), summary.clone()),
            ("spread.csv".into(), csv),
            ("spread.svg".into(), plot(study)),
        ],
        points_file: "spread.csv",
        summary,
        json: Some(serde_json::to_string_pretty(&outcome)?),
    })
}

fn summary_md(exp: &Experiment, s: &SpreadStudy, others: &[(f64, f64)], source: &str) -> String {
    let spec = exp.variance.unwrap_or_default();
    let mut all: Vec<(f64, f64)> = vec![(s.mean, s.peak)];
    all.extend_from_slice(others);
    let range = |f: fn(&(f64, f64)) -> f64| {
        let mut v: Vec<f64> = all.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        (v[0] * 100.0, v[v.len() / 2] * 100.0, v[v.len() - 1] * 100.0)
    };
    let (m0, m1, m2) = range(|x| x.0);
    let (p0, p1, p2) = range(|x| x.1);
    let seeds = if all.len() > 1 {
        format!(
            "\nAcross {} seeds ({} … {}): mean {m0:.2}% / {m1:.2}% / {m2:.2}% and peak \
             {p0:.2}% / {p1:.2}% / {p2:.2}% (min / median / max). The peak is the largest of \
             500 heavy-tailed draws, so it moves a lot from seed to seed; the mean does not.\n",
            all.len(),
            exp.seed,
            exp.seed + all.len() as u64 - 1
        )
    } else {
        String::new()
    };
    let table = format!(
        "# Runtime variance: {gpus} identical GPUs, {steps} steps\n\n\
         Source: `{source}` (seed {seed}). Per step every GPU runs the same kernel \
         ({k} per step); its duration is multiplied by the GPU's persistent factor and the \
         kernel's jitter. The fastest and slowest {trim} GPU(s) are dropped; the spread is \
         (slowest − fastest) ÷ fastest.\n\n\
         | trimmed spread | skewsim | published (Libra, 256 × GPU, 500 steps) |\n\
         |---|---:|---:|\n\
         | mean | {mean:.2}% | {pm:.2}% |\n\
         | peak | {peak:.2}% | {pp:.2}% |\n\n\
         Variance parameters: persistent {p:?}; jitter {j:?}; spike {sp:?}.\n",
        gpus = exp.gpus,
        steps = exp.steps,
        seed = exp.seed,
        k = exp.kernels_per_step,
        trim = exp.trim,
        mean = s.mean * 100.0,
        peak = s.peak * 100.0,
        pm = PUBLISHED_MEAN * 100.0,
        pp = PUBLISHED_PEAK * 100.0,
        p = spec.persistent,
        j = spec.jitter,
        sp = spec.spike,
    );
    table + &seeds
}

/// Per-step spread as a line, with our mean and the published mean and peak as rules.
fn plot(s: &SpreadStudy) -> String {
    let (w, h, pad) = (720.0, 360.0, 40.0);
    let ymax = s.peak.max(PUBLISHED_PEAK) * 1.1;
    let n = s.spread.len().max(2) as f64;
    let x = |i: usize| pad + i as f64 / (n - 1.0) * (w - 2.0 * pad);
    let y = |v: f64| h - 70.0 - v / ymax * (h - 70.0 - pad);
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    out += "\n";
    let mut pts = String::new();
    for (i, v) in s.spread.iter().enumerate() {
        let _ = write!(pts, "{:.1},{:.1} ", x(i), y(*v));
    }
    let _ = writeln!(
        out,
        r##"<polyline points="{pts}" fill="none" stroke="#36c" stroke-width="1"/>"##
    );
    for (i, (v, colour, dash, label)) in [
        (
            s.mean,
            "#36c",
            "5 3",
            format!(
                "skewsim mean {:.2}% (peak {:.2}%)",
                s.mean * 100.0,
                s.peak * 100.0
            ),
        ),
        (
            PUBLISHED_MEAN,
            "#c33",
            "2 2",
            format!("published mean {:.2}%", PUBLISHED_MEAN * 100.0),
        ),
        (
            PUBLISHED_PEAK,
            "#c33",
            "5 3",
            format!("published peak {:.2}%", PUBLISHED_PEAK * 100.0),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let ly = h - 12.0 - 14.0 * (2 - i) as f64;
        let _ = writeln!(
            out,
            r##"<line x1="{pad}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-dasharray="{dash}"/><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-dasharray="{dash}"/><text x="{:.1}" y="{:.1}" fill="{colour}">{label}</text>"##,
            y(v),
            w - pad,
            y(v),
            w - 250.0,
            ly - 4.0,
            w - 220.0,
            ly - 4.0,
            w - 215.0,
            ly
        );
    }
    for tick in [0.0, 0.05, 0.10, 0.15, 0.20] {
        if tick <= ymax {
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{:.0}%</text>"#,
                pad - 4.0,
                y(tick) + 4.0,
                tick * 100.0
            );
        }
    }
    let _ = writeln!(
        out,
        r#"<line x1="{pad}" y1="{b:.1}" x2="{r}" y2="{b:.1}" stroke="black"/><line x1="{pad}" y1="{pad}" x2="{pad}" y2="{b:.1}" stroke="black"/><text x="{pad}" y="{t}">trimmed spread per step (0 … {m:.1}%), steps 0 … {last}</text>"#,
        b = h - 70.0,
        r = w - pad,
        t = pad - 10.0,
        m = ymax * 100.0,
        last = s.spread.len().saturating_sub(1)
    );
    out += "</svg>\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_experiment_reproduces_published_mean() {
        let text = include_str!("../../experiments/runtime-variance.toml");
        let (_, s, others) = simulate(text, "experiments/runtime-variance.toml").unwrap();
        assert!(
            (s.mean - PUBLISHED_MEAN).abs() <= 0.01,
            "mean {:.4}",
            s.mean
        );
        for (mean, _) in others {
            assert!((mean - PUBLISHED_MEAN).abs() <= 0.01, "mean {mean:.4}");
        }
    }

    #[test]
    fn rerun_reproduces_the_committed_summary() {
        let text = include_str!("../../experiments/runtime-variance.toml");
        let source = "experiments/runtime-variance.toml";
        let (exp, s, others) = simulate(text, source).unwrap();
        let committed = include_str!("../../experiments/results/runtime-variance/summary.md");
        assert_eq!(summary_md(&exp, &s, &others, source), committed);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let e = simulate(
            "kind = \"runtime-variance\"\ngpus = 8\nsteps = 5\nseed = 1\nfoo = 2\n",
            "x.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("x.toml") && e.contains("foo"), "{e}");
        let e = simulate(
            "kind = \"runtime-variance\"\ngpus = 1\nsteps = 5\nseed = 1\n",
            "x.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("gpus = 1"), "{e}");
    }
}
