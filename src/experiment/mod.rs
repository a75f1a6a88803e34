//! Experiments as library code: an experiment file (TOML, `kind = "..."`) in, its typed
//! result out — the files a run writes (name → contents), the text a person reads and the
//! points table. The `skewsim` binary, the Python package and any other caller go through
//! [`run_text`]; nothing here writes a file or prints (progress goes to an [`Observer`]).
//!
//! Each kind has its module: [`schemes`] (`four-way`, `attention-microbench`,
//! `distca-ablation`), [`train`] (`train`), [`pools`] (`pools`, over the pool [`study`]) and
//! [`variance`] (`runtime-variance`); [`plan`] is one step's plan of any scheme (`skewsim
//! plan`). Experiments read the files they name (models,
//! topologies, corpus traces, calibrations) relative to the experiment file; [`inputs`] and
//! [`calfile`] are those readers.
//!
//! # Cancelling
//!
//! Sweeps check [`Observer::cancelled`] before each point and return [`Error::Cancelled`]
//! when it says so, so a caller (Ctrl-C in Python) stops a long run between points.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{bail, invalid, Context, Error, Result};

pub mod calfile;
pub mod inputs;
pub mod plan;
pub mod pools;
pub mod recommend;
pub mod schemes;
pub mod study;
pub mod sweep;
pub mod throughput;
pub mod train;
pub mod variance;

/// The experiment kinds, as `kind = "..."` spells them.
pub const KINDS: &[&str] = &[
    "pools",
    "runtime-variance",
    "train",
    "throughput",
    "four-way",
    "attention-microbench",
    "distca-ablation",
];

/// Kinds that price GPU work (take a calibration and a corpus override).
pub fn prices_work(kind: &str) -> bool {
    kind == "train" || kind == "throughput" || schemes::KINDS.contains(&kind)
}

/// What a running experiment reports, and how its caller stops it.
pub trait Observer: Sync {
    /// A progress line (`3/40 points simulated`); the CLI prints it on stderr.
    fn progress(&self, _line: &str) {}
    /// Whether the caller asked the run to stop; checked before each sweep point.
    fn cancelled(&self) -> bool {
        false
    }
}

/// An observer that shows nothing and never cancels.
pub struct Quiet;

impl Observer for Quiet {}

/// Counts finished jobs of a parallel batch and reports `k/total what` per job.
pub(crate) struct Progress<'a> {
    done: AtomicUsize,
    total: usize,
    what: &'static str,
    observer: &'a dyn Observer,
}

impl<'a> Progress<'a> {
    pub(crate) fn new(total: usize, what: &'static str, observer: &'a dyn Observer) -> Self {
        Progress {
            done: AtomicUsize::new(0),
            total,
            what,
            observer,
        }
    }

    /// [`Error::Cancelled`] when the caller asked the run to stop.
    pub(crate) fn check(&self) -> Result<()> {
        if self.observer.cancelled() {
            return Err(Error::Cancelled);
        }
        Ok(())
    }

    /// Count one finished job (nothing is reported once the run is cancelled: its
    /// remaining jobs return at once).
    pub(crate) fn tick(&self) {
        if self.observer.cancelled() {
            return;
        }
        let k = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        self.observer
            .progress(&format!("{k}/{} {}", self.total, self.what));
    }
}

/// The files of a run being built, in the order they are written.
#[derive(Default)]
pub(crate) struct Files(pub(crate) Vec<(String, String)>);

impl Files {
    /// Add (or replace) the file `name`.
    pub(crate) fn write(&mut self, name: impl Into<String>, body: impl Into<String>) {
        let (name, body) = (name.into(), body.into());
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some(f) => f.1 = body,
            None => self.0.push((name, body)),
        }
    }
}

/// Everything one experiment run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The experiment's kind.
    pub kind: String,
    /// The files a run writes into its directory, in order: name → contents.
    pub files: Vec<(String, String)>,
    /// The file among [`Outcome::files`] that holds one row per point (CSV).
    pub points_file: &'static str,
    /// What a person reads (the summary, Markdown).
    pub summary: String,
    /// The result as JSON text (pretty-printed), where the kind has one beyond its files.
    pub json: Option<String>,
}

impl Outcome {
    /// The contents of the file `name`, if the run wrote one.
    pub fn file(&self, name: &str) -> Option<&str> {
        self.files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.as_str())
    }

    /// The points table: its header and one row of cells per point.
    pub fn points(&self) -> Result<(Vec<String>, Vec<Vec<String>>)> {
        let text = self.file(self.points_file).unwrap_or_default();
        let mut r = csv::ReaderBuilder::new().from_reader(text.as_bytes());
        let head = r
            .headers()
            .map_err(|e| Error::Spec(format!("{}: {e}", self.points_file)))?
            .iter()
            .map(str::to_string)
            .collect();
        let rows = r
            .records()
            .map(|rec| {
                rec.map(|rec| rec.iter().map(str::to_string).collect())
                    .map_err(|e| Error::Spec(format!("{}: {e}", self.points_file)))
            })
            .collect::<Result<_>>()?;
        Ok((head, rows))
    }
}

/// The kind an experiment's TOML names, or an error listing the known ones.
pub fn kind_of(file: &str, doc: &toml::Table) -> Result<String> {
    match doc.get("kind") {
        Some(toml::Value::String(k)) if KINDS.contains(&k.as_str()) => Ok(k.clone()),
        Some(toml::Value::String(k)) => Err(invalid(
            "kind",
            format!("{k:?}"),
            format!("one of: {}", KINDS.join(", ")),
        ))
        .context(file),
        _ => bail!(
            "{file}: missing string field `kind` (one of: {})",
            KINDS.join(", ")
        ),
    }
}

/// Check an experiment against its kind's schema exactly as [`run_text`] reads it (unknown
/// and mistyped fields refused) without running it; `file` names it in messages, `doc` is
/// its parsed TOML.
pub fn check(file: &str, text: &str, doc: &toml::Table) -> Result<()> {
    match kind_of(file, doc)?.as_str() {
        "pools" => pools::parse(file, text).map(|_| ()),
        "runtime-variance" => toml::from_str::<variance::Experiment>(text)
            .map(|_| ())
            .map_err(|e| crate::error::parse_error(file, e.to_string())),
        "train" => train::check(text, file),
        "throughput" => throughput::check(text, file),
        _ => schemes::check(text, file),
    }
}

/// Run the experiment `text`; `path` names it in messages and titles its summary, and the
/// files it names resolve against `path`'s folder; `calibration` (a calibration file or a
/// built-in kernel profile) replaces the file's own.
pub fn run_text(
    path: &Path,
    text: &str,
    calibration: calfile::Prices,
    observer: &dyn Observer,
) -> Result<Outcome> {
    let file = path.display().to_string();
    let kind = priced_kind(&file, text, calibration)?;
    let (title, base) = title_and_base(path);
    match kind.as_str() {
        "pools" => pools::run(path, text, observer),
        "runtime-variance" => variance::run(path, text),
        "train" => train::run_text(text, &file, &title, base, calibration, observer),
        "throughput" => throughput::run_text(text, &file, &title, base, calibration, observer),
        _ => Ok(schemes::run_text(text, &file, &title, base, calibration, observer)?.outcome(kind)),
    }
}

/// The kind of the experiment `text` (`file` names it), refusing a calibration or kernel
/// profile for a kind that prices no GPU work.
fn priced_kind(file: &str, text: &str, calibration: calfile::Prices) -> Result<String> {
    let doc: toml::Table =
        toml::from_str(text).with_context(|| format!("{file} is not valid TOML"))?;
    let kind = kind_of(file, &doc)?;
    if (calibration.0.is_some() || calibration.1.is_some()) && !prices_work(&kind) {
        bail!(
            "--calibration, --kernel: experiment kind {kind:?} prices no GPU work (kinds that do: train, {})",
            schemes::KINDS.join(", ")
        );
    }
    Ok(kind)
}

/// An experiment's summary title (its file's stem) and the folder its paths resolve against.
fn title_and_base(path: &Path) -> (String, &Path) {
    let title = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    (title, path.parent().unwrap_or(Path::new(".")))
}

/// The experiment `text` (arguments as [`run_text`]'s) split into its sweep points, each
/// run alone (a job-array task, a process) and gathered by [`sweep::Sweep::finish`] into
/// the [`Outcome`] [`run_text`] gives; every kind (see [`mod@sweep`] for what a point is).
pub fn sweep(path: &Path, text: &str, calibration: calfile::Prices) -> Result<sweep::Sweep> {
    let file = path.display().to_string();
    let kind = priced_kind(&file, text, calibration)?;
    let (title, base) = title_and_base(path);
    sweep::Sweep::new(&kind, &file, &title, base, text, calibration)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Cancels once it has seen `after` progress lines.
    struct StopAfter {
        after: usize,
        seen: AtomicUsize,
        asked: AtomicBool,
    }

    impl Observer for StopAfter {
        fn progress(&self, _line: &str) {
            self.seen.fetch_add(1, Ordering::Relaxed);
        }
        fn cancelled(&self) -> bool {
            self.asked.store(true, Ordering::Relaxed);
            self.seen.load(Ordering::Relaxed) >= self.after
        }
    }

    #[test]
    fn a_cancelled_sweep_stops_before_its_points() {
        for (file, text) in [
            (
                "experiments/four-way.toml",
                include_str!("../../experiments/four-way.toml"),
            ),
            (
                "experiments/libra-fig8.toml",
                include_str!("../../experiments/libra-fig8.toml"),
            ),
        ] {
            let obs = StopAfter {
                after: 0,
                seen: AtomicUsize::new(0),
                asked: AtomicBool::new(false),
            };
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
            let e = run_text(&path, text, (None, None), &obs).unwrap_err();
            assert_eq!(e, Error::Cancelled, "{file}");
            assert!(obs.asked.load(Ordering::Relaxed), "{file}");
            assert_eq!(obs.seen.load(Ordering::Relaxed), 0, "{file}: no point ran");
        }
        // Cancelled after its first point, a sweep runs no more than the points in flight.
        let obs = StopAfter {
            after: 1,
            seen: AtomicUsize::new(0),
            asked: AtomicBool::new(false),
        };
        let file = "experiments/libra-fig8.toml";
        let text = include_str!("../../experiments/libra-fig8.toml");
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        assert_eq!(
            run_text(&path, text, (None, None), &obs).unwrap_err(),
            Error::Cancelled
        );
        assert_eq!(obs.seen.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn unknown_kinds_and_schema_errors_are_typed() {
        let e = run_text(
            Path::new("x.toml"),
            "kind = \"nope\"\n",
            (None, None),
            &Quiet,
        )
        .unwrap_err();
        assert!(
            matches!(e.root(), Error::Invalid { field, value, allowed }
                if field == "kind" && value == "\"nope\"" && KINDS.iter().all(|k| allowed.contains(k))),
            "{e}"
        );
        let e = run_text(
            Path::new("x.toml"),
            "kind = \"pools\"\n",
            (Some(Path::new("cal.json")), None),
            &Quiet,
        )
        .unwrap_err();
        assert!(
            matches!(&e, Error::Spec(m) if m.starts_with("--calibration")),
            "{e}"
        );
    }
}
