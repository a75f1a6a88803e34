//! `skewsim run FILE.toml`: run an experiment file and write `runs/NAME/`.
//!
//! An experiment file names its `kind`; each kind has its own module that parses the rest
//! of the file and writes its outputs. Unknown kinds are an error listing the known ones.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

use super::Output;

#[derive(clap::Args)]
pub struct Args {
    /// The experiment file (TOML) to run.
    pub file: PathBuf,
    /// Where to write results (default: runs/NAME, NAME the file's stem).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A calibration file (JSON, from `skewsim calibrate`) replacing the built-in H200
    /// cost figures, for kinds that price work.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
}

/// The experiment kinds this build knows, as `kind = "..."` spells them.
const KINDS: &[&str] = &[
    "pools",
    "runtime-variance",
    "train",
    "four-way",
    "attention-microbench",
    "distca-ablation",
];

pub fn run(args: Args, out: Output) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading experiment file {}", args.file.display()))?;
    let doc: toml::Table = toml::from_str(&text)
        .with_context(|| format!("{} is not valid TOML", args.file.display()))?;
    let kind = match doc.get("kind") {
        Some(toml::Value::String(k)) => k.clone(),
        _ => bail!(
            "{}: missing string field `kind` (one of: {})",
            args.file.display(),
            KINDS.join(", ")
        ),
    };
    let dir = out_dir(&args.file, args.out.as_deref());
    match kind.as_str() {
        "pools" | "runtime-variance" if args.calibration.is_some() => bail!(
            "--calibration: experiment kind {kind:?} prices no GPU work (kinds that do: train, {})",
            super::exp_schemes::KINDS.join(", ")
        ),
        "pools" => super::exp_pools::run(&args.file, &text, &dir, out),
        "runtime-variance" => super::exp_variance::run(&args.file, &text, &dir, out),
        "train" => super::exp_train::run(&args.file, &dir, args.calibration.as_deref(), out),
        k if super::exp_schemes::KINDS.contains(&k) => {
            super::exp_schemes::run(&args.file, &dir, args.calibration.as_deref(), out)
        }
        _ => bail!(
            "{}: unknown experiment kind = {kind:?} (one of: {})",
            args.file.display(),
            KINDS.join(", ")
        ),
    }
}

/// Check an experiment file against its kind's schema exactly as `run` reads it (unknown
/// and mistyped fields refused) without running it; `doc` is its parsed TOML.
pub fn check_schema(file: &Path, text: &str, doc: &toml::Table) -> Result<()> {
    let name = file.display().to_string();
    match doc.get("kind") {
        Some(toml::Value::String(k)) => match k.as_str() {
            "pools" => super::exp_pools::parse(&name, text).map(|_| ()),
            "runtime-variance" => toml::from_str::<super::exp_variance::Experiment>(text)
                .map(|_| ())
                .map_err(|e| skewsim::error::parse_error(&name, e.to_string()).into()),
            "train" => super::exp_train::check(text, &name),
            k if super::exp_schemes::KINDS.contains(&k) => super::exp_schemes::check(text, &name),
            _ => bail!(
                "{name}: unknown experiment kind = {k:?} (one of: {})",
                KINDS.join(", ")
            ),
        },
        _ => bail!(
            "{name}: missing string field `kind` (one of: {})",
            KINDS.join(", ")
        ),
    }
}

/// `runs/NAME` for `experiments/NAME.toml`, unless `--out` says otherwise.
pub fn out_dir(file: &Path, out: Option<&Path>) -> PathBuf {
    out.map(Path::to_path_buf).unwrap_or_else(|| {
        let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned());
        PathBuf::from("runs").join(stem.unwrap_or_else(|| "experiment".into()))
    })
}
