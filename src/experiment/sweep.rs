//! Experiments split into sweep points, for a job array or a pool of processes: a [`Sweep`]
//! lays out an experiment's points, [`Sweep::run_point`] runs one alone — in any order,
//! thread, process or machine — and [`Sweep::finish`] gathers every point's result into the
//! [`Outcome`] that [`super::run_text`] gives, byte for byte.
//!
//! | kind | a point |
//! |---|---|
//! | `four-way`, `attention-microbench`, `distca-ablation` | a (grid point, arm) |
//! | `train` | an (attention variant, grid point); a file without `[sweep]` is one point |
//! | `pools` | a (corpus, D) study |
//! | `runtime-variance` | the study under one of its seeds |
//!
//! A [`PointResult`] is lossless through TOML (`toml::to_string`, `toml::from_str`), which
//! writes a float as its shortest round-tripping decimal and reads it back correctly
//! rounded; serde_json's reader may land an ulp away.

use std::path::Path;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::cluster::variance::SpreadStudy;
use crate::error::{invalid, Context, Result};

use super::study::Study;
use super::{calfile, pools, schemes, throughput, train, variance, Observer, Outcome, Progress};

/// An experiment of any kind, split into its points.
pub enum Sweep {
    /// A scheme comparison.
    Comparison(Box<schemes::Sweep>),
    /// `train`.
    Train(Box<train::Sweep>),
    /// `throughput`.
    Throughput(Box<throughput::Sweep>),
    /// `pools`.
    Pools(pools::Sweep),
    /// `runtime-variance`.
    Variance(variance::Sweep),
}

/// One point's result, of its experiment's kind.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PointResult {
    /// A scheme comparison's point.
    Comparison(schemes::PointResult),
    /// A `train` point.
    Train(train::PointResult),
    /// A `throughput` row.
    Throughput(throughput::PointResult),
    /// A `pools` point.
    Pools(Study),
    /// A `runtime-variance` seed.
    Variance(SpreadStudy),
}

impl PointResult {
    /// The [`Sweep`] variant it belongs to, for messages.
    fn kind(&self) -> &'static str {
        match self {
            PointResult::Comparison(_) => "scheme comparison",
            PointResult::Train(_) => "train",
            PointResult::Throughput(_) => "throughput",
            PointResult::Pools(_) => "pools",
            PointResult::Variance(_) => "runtime-variance",
        }
    }
}

impl Sweep {
    /// Lay out the points of the experiment `text` of kind `kind` (`file` names it in
    /// messages, `title` heads its summary, its paths resolve against `base`, `prices` is
    /// [`super::run_text`]'s calibration); nothing is simulated.
    pub(super) fn new(
        kind: &str,
        file: &str,
        title: &str,
        base: &Path,
        text: &str,
        prices: calfile::Prices,
    ) -> Result<Sweep> {
        Ok(match kind {
            "train" => Sweep::Train(Box::new(train::Sweep::new(
                text, file, title, base, prices,
            )?)),
            "throughput" => Sweep::Throughput(Box::new(throughput::Sweep::new(
                text, file, title, base, prices,
            )?)),
            "pools" => Sweep::Pools(pools::Sweep::new(pools::parse(file, text)?)?),
            "runtime-variance" => Sweep::Variance(variance::Sweep::new(text, file)?),
            _ => Sweep::Comparison(Box::new(schemes::Sweep::new(
                text, file, title, base, prices,
            )?)),
        })
    }

    /// How many points.
    pub fn len(&self) -> usize {
        match self {
            Sweep::Comparison(s) => s.len(),
            Sweep::Train(s) => s.len(),
            Sweep::Throughput(s) => s.len(),
            Sweep::Pools(s) => s.len(),
            Sweep::Variance(s) => s.len(),
        }
    }

    /// Whether the sweep has no points.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The experiment's kind, as `kind = "..."` spells it.
    pub fn kind(&self) -> &str {
        match self {
            Sweep::Comparison(s) => s.kind(),
            Sweep::Train(_) => "train",
            Sweep::Throughput(_) => "throughput",
            Sweep::Pools(s) => &s.spec().kind,
            Sweep::Variance(_) => "runtime-variance",
        }
    }

    /// Point `i` in words, for messages.
    pub fn describe(&self, i: usize) -> String {
        match self {
            Sweep::Comparison(s) => s.describe(i),
            Sweep::Train(s) => s.describe(i),
            Sweep::Throughput(s) => s.describe(i),
            Sweep::Pools(s) => s.describe(i),
            Sweep::Variance(s) => s.describe(i),
        }
    }

    /// Run point `i` (in `0..len()`) alone.
    pub fn run_point(&self, i: usize) -> Result<PointResult> {
        Ok(match self {
            Sweep::Comparison(s) => PointResult::Comparison(s.run_point(i)?),
            Sweep::Train(s) => PointResult::Train(s.run_point(i)?),
            Sweep::Throughput(s) => PointResult::Throughput(s.run_point(i)?),
            Sweep::Pools(s) => PointResult::Pools(s.run_point(i)?),
            Sweep::Variance(s) => PointResult::Variance(s.run_point(i)?),
        })
    }

    /// The run's [`Outcome`] from every point's result (`results[i]` point `i`'s), each
    /// checked to be of this sweep's kind and point.
    pub fn finish(&self, results: Vec<PointResult>) -> Result<Outcome> {
        match self {
            Sweep::Comparison(s) => {
                let r = self.own_kind(results, |r| match r {
                    PointResult::Comparison(r) => Some(r),
                    _ => None,
                })?;
                Ok(s.finish(&r)?.outcome(s.kind().to_string()))
            }
            Sweep::Train(s) => s.finish(&self.own_kind(results, |r| match r {
                PointResult::Train(r) => Some(r),
                _ => None,
            })?),
            Sweep::Throughput(s) => s.finish(&self.own_kind(results, |r| match r {
                PointResult::Throughput(r) => Some(r),
                _ => None,
            })?),
            Sweep::Pools(s) => {
                let r = self.own_kind(results, |r| match r {
                    PointResult::Pools(r) => Some(r),
                    _ => None,
                })?;
                pools::outcome(s.spec(), s.finish(&r)?)
            }
            Sweep::Variance(s) => s.finish(&self.own_kind(results, |r| match r {
                PointResult::Variance(r) => Some(r),
                _ => None,
            })?),
        }
    }

    /// Every result as this sweep's kind's (`own` gives it, or nothing when it is another
    /// kind's).
    fn own_kind<R>(
        &self,
        results: Vec<PointResult>,
        own: impl Fn(PointResult) -> Option<R>,
    ) -> Result<Vec<R>> {
        results
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let kind = r.kind();
                own(r).ok_or_else(|| {
                    invalid(
                        format!("sweep point {i}'s result"),
                        format!("a {kind} result"),
                        format!("a result of this {} experiment", self.kind()),
                    )
                })
            })
            .collect()
    }
}

/// Most points one experiment may lay out (a `sweep --slurm` array runs them spread over
/// a cluster; a grid past this is refused before it is built).
pub const MAX_POINTS: usize = 1 << 16;

/// Refuse a grid of more than [`MAX_POINTS`] points; called as points are laid out, so an
/// oversized product of sweep lists is refused before it fills memory.
pub(crate) fn check_points(n: usize, file: &str) -> Result<()> {
    if n > MAX_POINTS {
        return Err(invalid(
            "[sweep]",
            format!("more than {MAX_POINTS} points"),
            format!("at most {MAX_POINTS} points (the product of the sweep's lists)"),
        ))
        .context(file);
    }
    Ok(())
}

/// Run points `0..len` in parallel (each counted and checked for a cancel through
/// `observer`), gathered in order; the first error in point order wins.
pub(crate) fn run_points<R: Send>(
    len: usize,
    observer: &dyn Observer,
    run: impl Fn(usize) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    let progress = Progress::new(len, "points simulated", observer);
    let results: Vec<Result<R>> = (0..len)
        .into_par_iter()
        .map(|i| {
            progress.check()?;
            run(i)
        })
        .inspect(|_| progress.tick())
        .collect();
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    /// Floats that serde_json's reader does not always land on come back bit for bit
    /// through TOML.
    #[test]
    fn a_point_result_round_trips_through_toml_exactly() {
        let study = SpreadStudy {
            spread: vec![
                0.1 + 0.2,
                1.0 / 3.0,
                5e-324,
                1e300,
                -0.0,
                0.07010000000000001,
            ],
            mean: std::f64::consts::PI,
            peak: f64::MAX,
        };
        let text = toml::to_string(&PointResult::Variance(study.clone())).unwrap();
        match toml::from_str(&text).unwrap() {
            PointResult::Variance(back) => {
                let bits = |s: &SpreadStudy| -> Vec<u64> {
                    s.spread
                        .iter()
                        .chain([&s.mean, &s.peak])
                        .map(|x| x.to_bits())
                        .collect()
                };
                assert_eq!(bits(&back), bits(&study), "{text}");
            }
            r => panic!("a {} result", r.kind()),
        }
    }

    /// A result of another kind is refused, naming the point.
    #[test]
    fn finish_refuses_another_kinds_result() {
        let text = "kind = \"pools\"\ntitle = \"t\"\nseed = 1\ntrials = 2\ngbs = [4]\n\
                    pool_sizes = [2]\npolicies = [\"random\"]\n[[corpus]]\nname = \"wlbllm\"\n";
        let sweep = super::super::sweep(Path::new("p.toml"), text, (None, None)).unwrap();
        assert_eq!((sweep.len(), sweep.kind()), (1, "pools"));
        let other = PointResult::Variance(SpreadStudy {
            spread: vec![],
            mean: 0.0,
            peak: 0.0,
        });
        let e = sweep.finish(vec![other]).unwrap_err();
        assert!(
            matches!(e.root(), Error::Invalid { field, value, .. }
                if field == "sweep point 0's result" && value == "a runtime-variance result"),
            "{e}"
        );
    }
}
