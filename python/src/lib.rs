//! `skewsim._skewsim`: the Python package's native module, a thin layer over the skewsim
//! library (no logic of its own). Each function releases the GIL while it simulates, runs
//! the work on a worker thread and checks for Ctrl-C every 50 ms: an interrupt asks the
//! library to stop between sweep points ([`Observer::cancelled`]) and is raised once the
//! worker has stopped. Library errors arrive as `skewsim.SkewsimError`, with `field`,
//! `value` and `allowed` set when the error names them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyRuntimeError};
use pyo3::prelude::*;

use skewsim::cost::Mask;
use skewsim::experiment::plan::{no_budget, plan as make_plan, PlanRequest, SchemeKnobs, Workload};
use skewsim::experiment::study::{
    check_pool_sizes, check_target, corpus_report, parse_policies, resolve_source, study,
    theory_report, trial_loads, trial_loads_under, DEFAULT_SEQ_LEN,
};
use skewsim::experiment::{self, inputs::load_corpus, Observer};
use skewsim::Error;

create_exception!(
    _skewsim,
    SkewsimError,
    PyException,
    "An input skewsim refused, or a run that failed; `field`, `value` and `allowed` name \
     the offending input where the error does."
);

/// The cancel flag an interrupt sets; sweeps read it between points.
struct Flag<'a>(&'a AtomicBool);

impl Observer for Flag<'_> {
    fn cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A library error as a Python exception: `SkewsimError` carrying the innermost error's
/// field, value and allowed values (when it names them); a cancelled run as
/// `KeyboardInterrupt`.
fn to_py(py: Python<'_>, e: Error) -> PyErr {
    if matches!(e, Error::Cancelled) {
        return pyo3::exceptions::PyKeyboardInterrupt::new_err("cancelled");
    }
    let err = SkewsimError::new_err(skewsim::error::compact_numbers(&e.to_string()));
    let value = err.value(py);
    let (field, val, allowed) = match e.root() {
        Error::Invalid {
            field,
            value,
            allowed,
        } => (
            Some(field.clone()),
            Some(value.clone()),
            Some(allowed.clone()),
        ),
        _ => (None, None, None),
    };
    let _ = value.setattr("field", field);
    let _ = value.setattr("value", val);
    let _ = value.setattr("allowed", allowed);
    err
}

/// Run `work` on a worker thread with the GIL released; poll for signals while it runs,
/// ask it to stop on one and re-raise it when it has.
fn interruptible<T: Send>(
    py: Python<'_>,
    work: impl FnOnce(&dyn Observer) -> skewsim::Result<T> + Send,
) -> PyResult<T> {
    let flag = AtomicBool::new(false);
    let (result, signal) = std::thread::scope(|s| {
        let handle = s.spawn(|| work(&Flag(&flag)));
        let mut signal = None;
        while !handle.is_finished() {
            py.allow_threads(|| std::thread::sleep(Duration::from_millis(50)));
            if signal.is_none() {
                if let Err(e) = py.check_signals() {
                    flag.store(true, Ordering::Relaxed);
                    signal = Some(e);
                }
            }
        }
        (handle.join(), signal)
    });
    if let Some(e) = signal {
        return Err(e);
    }
    match result {
        Ok(r) => r.map_err(|e| to_py(py, e)),
        Err(_) => Err(PyRuntimeError::new_err("skewsim: the simulation panicked")),
    }
}

/// Run the experiment `text` (TOML) named `path` (relative files resolve against its
/// folder); returns (kind, files as (name, contents), points file, summary, json).
#[pyfunction]
#[pyo3(signature = (text, path, calibration=None))]
#[allow(clippy::type_complexity)]
fn run_text(
    py: Python<'_>,
    text: String,
    path: PathBuf,
    calibration: Option<PathBuf>,
) -> PyResult<(
    String,
    Vec<(String, String)>,
    String,
    String,
    Option<String>,
)> {
    let o = interruptible(py, |obs| {
        experiment::run_text(&path, &text, (calibration.as_deref(), None), obs)
    })?;
    Ok((
        o.kind,
        o.files,
        o.points_file.to_string(),
        o.summary,
        o.json,
    ))
}

/// Convert an experiment given as JSON (a Python dict) to TOML text.
#[pyfunction]
fn json_to_toml(py: Python<'_>, json: &str) -> PyResult<String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| to_py(py, Error::Spec(e.to_string())))?;
    toml::to_string(&value).map_err(|e| {
        to_py(
            py,
            Error::Spec(format!("the experiment as TOML: {e} (no None values)")),
        )
    })
}

/// Statistics of a corpus and of its packed sequences, as JSON.
#[pyfunction]
#[pyo3(signature = (corpus, seq_len=None, sequences=1024, samples=200_000, packing="sequential".to_string(), seed=0))]
fn corpus(
    py: Python<'_>,
    corpus: String,
    seq_len: Option<u32>,
    sequences: usize,
    samples: usize,
    packing: String,
    seed: u64,
) -> PyResult<String> {
    interruptible(py, |_| {
        let c = load_corpus(&corpus)?;
        let packing = packing.parse()?;
        let seq_len = seq_len.or(c.default_seq_len()).unwrap_or(DEFAULT_SEQ_LEN);
        let r = corpus_report(&c, seq_len, sequences, samples, packing, seed)?;
        Ok(serde_json::to_string(&r)?)
    })
}

/// The pool study of `skewsim pools`, as JSON.
#[pyfunction]
#[pyo3(signature = (corpus=None, packed=None, seq_len=None, gbs=128, pool_sizes=vec![2, 4, 8, 16, 32, 64], policies=vec!["random".to_string(), "vrsp".to_string()], trials=200, seed=0, packing="sequential".to_string()))]
#[allow(clippy::too_many_arguments)]
fn pools(
    py: Python<'_>,
    corpus: Option<String>,
    packed: Option<PathBuf>,
    seq_len: Option<u32>,
    gbs: usize,
    pool_sizes: Vec<usize>,
    policies: Vec<String>,
    trials: u64,
    seed: u64,
    packing: String,
) -> PyResult<String> {
    interruptible(py, |_| {
        let policies = parse_policies(&policies, "policies")?;
        check_pool_sizes(&pool_sizes, gbs, ("pool_sizes", "gbs"))?;
        let src = resolve_source(corpus.as_deref(), packed.as_deref(), seq_len, &packing, gbs)?;
        let loads = trial_loads(&src, gbs, trials, seed, ("trials", "gbs"))?;
        let st = study(&src, &loads, gbs, &pool_sizes, &policies, seed)?;
        Ok(serde_json::to_string(&st)?)
    })
}

/// Libra Eq. 4's bound beside Monte Carlo of `skewsim theory`, as JSON.
#[pyfunction]
#[pyo3(signature = (corpus=None, packed=None, seq_len=None, gbs=128, pool_sizes=vec![2, 4, 8, 16, 32, 64], target=0.1, trials=1000, seed=0, packing="sequential".to_string(), mask="causal".to_string()))]
#[allow(clippy::too_many_arguments)]
fn theory(
    py: Python<'_>,
    corpus: Option<String>,
    packed: Option<PathBuf>,
    seq_len: Option<u32>,
    gbs: usize,
    pool_sizes: Vec<usize>,
    target: f64,
    trials: u64,
    seed: u64,
    packing: String,
    mask: String,
) -> PyResult<String> {
    interruptible(py, |_| {
        check_target(target)?;
        check_pool_sizes(&pool_sizes, gbs, ("pool_sizes", "gbs"))?;
        let mask = Mask::parse(&mask, "mask")?;
        let src = resolve_source(corpus.as_deref(), packed.as_deref(), seq_len, &packing, gbs)?;
        mask.check_len(src.seq_len(), "mask")?;
        let loads = trial_loads_under(&src, gbs, trials, seed, &mask, ("trials", "gbs"))?;
        let r = theory_report(&src, &mask, &loads, gbs, &pool_sizes, seed, target)?;
        Ok(serde_json::to_string(&r)?)
    })
}

/// One step's checked plan of `skewsim plan`: (plan JSON text, report JSON).
#[pyfunction]
#[pyo3(signature = (experiment=None, step=0, scheme=None, corpus=None, seq_len=None, gbs=None, dp=None, cp=None, pool_size=None, head_shards=None, tile_tokens=None, tau=None, chunks=None, seed=None, packing=None, grouping=None, s_max=None, sharding=None, outlier_thresholds=None, epsilon=None, ping_pong=None, tight=None, pipeline=false))]
#[allow(clippy::too_many_arguments)]
fn plan(
    py: Python<'_>,
    experiment: Option<PathBuf>,
    step: u64,
    scheme: Option<String>,
    corpus: Option<String>,
    seq_len: Option<u32>,
    gbs: Option<usize>,
    dp: Option<u32>,
    cp: Option<u32>,
    pool_size: Option<u32>,
    head_shards: Option<u32>,
    tile_tokens: Option<u32>,
    tau: Option<f64>,
    chunks: Option<u32>,
    seed: Option<u64>,
    packing: Option<String>,
    grouping: Option<String>,
    s_max: Option<u32>,
    sharding: Option<String>,
    outlier_thresholds: Option<Vec<u32>>,
    epsilon: Option<f64>,
    ping_pong: Option<bool>,
    tight: Option<bool>,
    pipeline: bool,
) -> PyResult<(String, String)> {
    let req = PlanRequest {
        file: experiment.as_deref(),
        workload: Workload {
            corpus,
            seq_len,
            gbs,
            dp,
            cp,
            tau,
            chunks,
            seed,
            packing,
            grouping,
        },
        pool_size,
        head_shards,
        tile_tokens,
        scheme: SchemeKnobs {
            scheme,
            s_max,
            sharding,
            outlier_thresholds,
            epsilon,
            ping_pong,
            tight,
        },
        step,
        pipeline,
    };
    interruptible(py, |_| {
        let o = make_plan(&req, &no_budget)?;
        let report = serde_json::json!({
            "settings": o.settings,
            "scheme": o.scheme,
            "step": o.step,
            "check": o.check,
            "groups": o.groups,
            "pipeline": o.pipeline,
        });
        Ok((o.plan.to_json()?, report.to_string()))
    })
}

/// Check an experiment (TOML text named `path`) against its kind's schema without
/// running it.
#[pyfunction]
fn check(py: Python<'_>, text: &str, path: &str) -> PyResult<()> {
    let doc: toml::Table = toml::from_str(text)
        .map_err(|e| to_py(py, Error::Spec(format!("{path} is not valid TOML: {e}"))))?;
    experiment::check(path, text, &doc).map_err(|e| to_py(py, e))
}

/// `skewsim recommend`: which scheme, settings and layout to run; returns (kind, files,
/// points file, summary, json) as [`run_text`] does (points: the ranked table).
#[pyfunction]
#[pyo3(signature = (corpus, gpus, seq_len, model="llama3-8b".to_string(), topology="dgx-h200-roce".to_string(), memory_gib=None, global_batch=None, pipeline=false, tp=None, cp=None, pp=None, schemes=vec![], seeds=3, seed=1, layers=None, simulate=16, top=6, recompute=true, zero_stage=3, calibration=None))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn recommend(
    py: Python<'_>,
    corpus: String,
    gpus: u32,
    seq_len: u32,
    model: String,
    topology: String,
    memory_gib: Option<f64>,
    global_batch: Option<u32>,
    pipeline: bool,
    tp: Option<u32>,
    cp: Option<u32>,
    pp: Option<u32>,
    schemes: Vec<String>,
    seeds: u32,
    seed: u64,
    layers: Option<u32>,
    simulate: u32,
    top: u32,
    recompute: bool,
    zero_stage: u8,
    calibration: Option<PathBuf>,
) -> PyResult<(
    String,
    Vec<(String, String)>,
    String,
    String,
    Option<String>,
)> {
    use skewsim::experiment::recommend::{recommend, Spec};
    let o = interruptible(py, |obs| {
        let spec = Spec {
            memory_gib,
            global_batch,
            pipeline,
            tp,
            cp,
            pp,
            schemes: schemes
                .iter()
                .map(|s| s.parse())
                .collect::<skewsim::Result<_>>()?,
            seeds,
            seed,
            layers,
            simulate,
            top,
            recompute,
            zero_stage,
            ..Spec::new(&model, &corpus, &topology, gpus, seq_len)
        };
        let r = recommend(
            &spec,
            std::path::Path::new("."),
            (calibration.as_deref(), None),
            obs,
        )?;
        Ok(r.outcome())
    })?;
    Ok((
        o.kind,
        o.files,
        o.points_file.to_string(),
        o.summary,
        o.json,
    ))
}

/// The native module.
#[pymodule]
fn _skewsim(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("SkewsimError", m.py().get_type::<SkewsimError>())?;
    m.add("KINDS", experiment::KINDS.to_vec())?;
    m.add_function(wrap_pyfunction!(run_text, m)?)?;
    m.add_function(wrap_pyfunction!(json_to_toml, m)?)?;
    m.add_function(wrap_pyfunction!(corpus, m)?)?;
    m.add_function(wrap_pyfunction!(pools, m)?)?;
    m.add_function(wrap_pyfunction!(theory, m)?)?;
    m.add_function(wrap_pyfunction!(check, m)?)?;
    m.add_function(wrap_pyfunction!(recommend, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    Ok(())
}
