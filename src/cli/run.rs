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
    /// A calibration file (JSON, from `skewsim calibrate`) replacing the built-in kernel
    /// profile and cost figures, for kinds that price work (wins over the file's).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// The attention kernel's built-in profile to price by, for kinds that price work:
    /// torch-flash (PyTorch's varlen FlashAttention-2 on the H200, the default) or skewsim
    /// (the project's own kernels); replaces the file's calibration.
    #[arg(long)]
    pub kernel: Option<String>,
    /// Replace the experiment's corpus (`[workload] corpus` and any `[sweep] corpus`) with
    /// this one: a built-in name, a length file (JSON, CSV, one length per line) or a
    /// parametric spec. For `train` and the scheme comparisons.
    #[arg(long)]
    pub corpus: Option<String>,
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
    let text = match &args.corpus {
        None => text,
        Some(_) if !matches!(kind.as_str(), "train") && !super::exp_schemes::KINDS.contains(&kind.as_str()) => bail!(
            "--corpus: experiment kind {kind:?} takes no corpus override (kinds that do: train, {})",
            super::exp_schemes::KINDS.join(", ")
        ),
        Some(c) => with_corpus(doc, c)
            .with_context(|| format!("{}: --corpus {c}", args.file.display()))?,
    };
    let kernel = super::calfile::kernel_flag(args.kernel.as_deref(), args.calibration.is_some())?;
    match kind.as_str() {
        "pools" | "runtime-variance" if args.calibration.is_some() || kernel.is_some() => bail!(
            "--calibration, --kernel: experiment kind {kind:?} prices no GPU work (kinds that do: train, {})",
            super::exp_schemes::KINDS.join(", ")
        ),
        "pools" => super::exp_pools::run(&args.file, &text, &dir, out),
        "runtime-variance" => super::exp_variance::run(&args.file, &text, &dir, out),
        "train" => {
            let prices = (args.calibration.as_deref(), kernel);
            super::exp_train::run(&args.file, &text, &dir, prices, out)
        }
        k if super::exp_schemes::KINDS.contains(&k) => {
            let prices = (args.calibration.as_deref(), kernel);
            super::exp_schemes::run(&args.file, &text, &dir, prices, out)
        }
        _ => bail!(
            "{}: unknown experiment kind = {kind:?} (one of: {})",
            args.file.display(),
            KINDS.join(", ")
        ),
    }
}

/// The experiment `doc` with its corpus replaced by `corpus` (`[workload] corpus`, and
/// `[sweep] corpus` when the file sweeps corpora), and a line saying so heading its
/// description. A corpus that names an existing file is made absolute, so it is read from
/// where the command was run.
fn with_corpus(mut doc: toml::Table, corpus: &str) -> Result<String> {
    let spec = match std::fs::canonicalize(corpus) {
        Ok(p) if p.is_file() => p.display().to_string(),
        _ => corpus.to_string(),
    };
    let Some(toml::Value::Table(w)) = doc.get_mut("workload") else {
        bail!("the experiment has no [workload] section to take a corpus");
    };
    w.insert("corpus".into(), toml::Value::String(spec.clone()));
    if let Some(toml::Value::Table(sw)) = doc.get_mut("sweep") {
        if sw.contains_key("corpus") {
            sw.insert(
                "corpus".into(),
                toml::Value::Array(vec![toml::Value::String(spec.clone())]),
            );
        }
    }
    let desc = match doc.get("description") {
        Some(toml::Value::String(d)) => d.clone(),
        _ => String::new(),
    };
    doc.insert(
        "description".into(),
        toml::Value::String(format!(
            "Corpus `{corpus}`, given on the command line (`--corpus`), in place of the file's.\n\n{desc}"
        )),
    );
    Ok(toml::to_string(&doc)?)
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
