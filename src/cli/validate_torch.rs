//! `skewsim validate --kernel torch-flash|torch-cudnn`: a plan's launches through PyTorch's
//! varlen attention, run by the Python sidecar `validate/torch/sidecar.py`.
//!
//! The binary cuts the plan into launches exactly as for its own kernel
//! ([`super::validate::launches`]), sends them in that order as one JSON request on the
//! sidecar's stdin (each launch's units as (query length, KV length): the queries
//! [e − q, e) of one sample against its keys [0, e)), and reads JSON lines back: a `ready`
//! line naming torch and the GPU, one line of raw timings per launch (forward, backward,
//! dispatch and return copies, `reps` each, timed as `validate::gpu::Gpu::time_fwd` times
//! the project's kernel), then `done`. The rows are the own kernel's rows
//! ([`super::validate::rows_of`]), so `skewsim calibrate` reads them unchanged.
//!
//! A missing Python, sidecar script, torch or GPU is an [`Unavailable`] error naming what
//! is missing; any other failure is the sidecar's own message.

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::validate::LaunchSpec;

/// The request format's version; the sidecar refuses any other.
pub const PROTOCOL: u32 = 1;

/// One launch as the sidecar runs it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LaunchReq {
    pub heads: u32,
    pub kv_heads: u32,
    /// (query length, KV length) per unit, in the launch's order.
    pub units: Vec<(u32, u32)>,
    pub dispatch_bytes: u64,
    pub return_bytes: u64,
}

impl LaunchReq {
    pub fn of(spec: &LaunchSpec) -> LaunchReq {
        LaunchReq {
            heads: spec.heads,
            kv_heads: spec.heads_kv,
            units: spec.batch.units.iter().map(|u| (u.e - u.a, u.e)).collect(),
            dispatch_bytes: spec.dispatch_bytes,
            return_bytes: spec.return_bytes,
        }
    }
}

/// What the sidecar is asked to run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Request {
    pub protocol: u32,
    /// `torch-flash` or `torch-cudnn`.
    pub kernel: String,
    pub device: usize,
    pub warmup: usize,
    pub reps: usize,
    pub head_dim: u32,
    pub bwd: bool,
    /// Seeds the random inputs.
    pub seed: u64,
    pub launches: Vec<LaunchReq>,
}

/// The sidecar's first line: what it runs on.
#[derive(Clone, Debug, Deserialize)]
pub struct Ready {
    pub torch: String,
    pub cuda: Option<String>,
    pub cudnn: Option<serde_json::Value>,
    pub gpu: String,
    pub sms: u32,
}

impl fmt::Display for Ready {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "torch {} (CUDA {}, cuDNN {}) on {} ({} SMs)",
            self.torch,
            self.cuda.as_deref().unwrap_or("?"),
            self.cudnn
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_else(|| "?".into()),
            self.gpu,
            self.sms
        )
    }
}

/// One launch's raw timings, ms per timed call.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct LaunchTimes {
    pub launch: usize,
    /// None for a launch without units.
    pub fwd_ms: Option<Vec<f64>>,
    /// None without the backward (or without units).
    pub bwd_ms: Option<Vec<f64>>,
    pub dispatch_ms: Vec<f64>,
    pub return_ms: Vec<f64>,
}

/// The sidecar cannot run here: what is missing.
#[derive(Debug)]
pub enum Unavailable {
    /// The Python interpreter could not be started.
    Python { python: String, why: String },
    /// The sidecar script is not where `--sidecar` says.
    Script(PathBuf),
    /// Python runs but cannot import torch.
    Torch { python: String, why: String },
    /// torch sees no CUDA GPU.
    Gpu(String),
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::Python { python, why } => write!(
                f,
                "torch sidecar: cannot start --python {python} ({why}): allowed a Python 3 \
                 interpreter with PyTorch (the torch kernels run through it)"
            ),
            Unavailable::Script(p) => write!(
                f,
                "torch sidecar: --sidecar {} does not exist: allowed the path of \
                 validate/torch/sidecar.py (run from the repository root, or pass --sidecar)",
                p.display()
            ),
            Unavailable::Torch { python, why } => write!(
                f,
                "torch sidecar: --python {python} cannot import torch ({why}): allowed a Python \
                 with PyTorch installed"
            ),
            Unavailable::Gpu(why) => write!(
                f,
                "torch sidecar: no CUDA GPU ({why}): the torch kernels run on an NVIDIA GPU"
            ),
        }
    }
}

impl std::error::Error for Unavailable {}

/// How to start the sidecar.
#[derive(Clone, Debug)]
pub struct Sidecar {
    pub python: String,
    pub script: PathBuf,
}

/// One line the sidecar writes.
#[derive(Debug)]
enum Line {
    Ready(Ready),
    Launch(LaunchTimes),
    Done(usize),
    Error { kind: String, message: String },
}

fn parse_line(text: &str) -> Result<Line> {
    let v: serde_json::Value = serde_json::from_str(text)
        .with_context(|| format!("torch sidecar: a line that is not JSON: {text:.200}"))?;
    let bad = || anyhow!("torch sidecar: an unexpected line: {text:.200}");
    if let Some(r) = v.get("ready") {
        return Ok(Line::Ready(
            serde_json::from_value(r.clone()).map_err(|_| bad())?,
        ));
    }
    if let Some(e) = v.get("error") {
        let s = |k: &str| e.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
        return Ok(Line::Error {
            kind: s("kind"),
            message: s("message"),
        });
    }
    if let Some(n) = v.get("done") {
        return Ok(Line::Done(n.as_u64().ok_or_else(bad)? as usize));
    }
    if v.get("launch").is_some() {
        return Ok(Line::Launch(serde_json::from_value(v).map_err(|_| bad())?));
    }
    Err(bad())
}

/// The error for the sidecar's `{"error": ...}` line.
fn sidecar_error(python: &str, kernel: &str, kind: &str, message: String) -> anyhow::Error {
    match kind {
        "no-torch" => Unavailable::Torch {
            python: python.to_string(),
            why: message,
        }
        .into(),
        "no-gpu" => Unavailable::Gpu(message).into(),
        "unsupported" => anyhow!("--kernel {kernel} cannot run this plan: {message}"),
        _ => anyhow!("torch sidecar failed ({kind}): {message}"),
    }
}

/// Checks one launch's timings against its request.
fn check_times(t: &LaunchTimes, req: &Request, i: usize) -> Result<()> {
    if t.launch != i {
        bail!(
            "torch sidecar: answered launch {} where {i} was due",
            t.launch
        );
    }
    let has_units = !req.launches[i].units.is_empty();
    let series = [
        ("fwd_ms", t.fwd_ms.as_ref(), has_units),
        ("bwd_ms", t.bwd_ms.as_ref(), has_units && req.bwd),
        ("dispatch_ms", Some(&t.dispatch_ms), true),
        ("return_ms", Some(&t.return_ms), true),
    ];
    for (name, s, want) in series {
        match s {
            Some(v) if want => {
                if v.len() != req.reps || v.iter().any(|x| !x.is_finite() || *x < 0.0) {
                    bail!(
                        "torch sidecar: launch {i}: {name} has {} timings ({v:?}): allowed {} finite times >= 0",
                        v.len(),
                        req.reps
                    );
                }
            }
            None if !want => {}
            _ => bail!(
                "torch sidecar: launch {i}: {name} {}: the launch {} it",
                if want { "missing" } else { "present" },
                if want { "needs" } else { "does not ask for" }
            ),
        }
    }
    Ok(())
}

impl Sidecar {
    /// Runs `req`: what the sidecar runs on, and each launch's timings in request order.
    pub fn run(&self, req: &Request) -> Result<(Ready, Vec<LaunchTimes>)> {
        if !self.script.is_file() {
            return Err(Unavailable::Script(self.script.clone()).into());
        }
        let mut child = Command::new(&self.python)
            .arg(&self.script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| Unavailable::Python {
                python: self.python.clone(),
                why: e.to_string(),
            })?;
        let text = serde_json::to_string(req)?;
        if let Some(mut stdin) = child.stdin.take() {
            // A sidecar that stops reading early (a refusal) answers on stdout; a broken
            // pipe here is read from there.
            let _ = stdin.write_all(text.as_bytes());
        }
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("torch sidecar: no stdout"))?;
        let mut ready = None;
        let mut times = Vec::with_capacity(req.launches.len());
        let mut done = false;
        let mut failure = None;
        for line in BufReader::new(stdout).lines() {
            let line = line.context("reading the torch sidecar's answer")?;
            if line.trim().is_empty() {
                continue;
            }
            match parse_line(&line)? {
                Line::Ready(r) => ready = Some(r),
                Line::Launch(t) => {
                    if times.len() >= req.launches.len() {
                        bail!(
                            "torch sidecar: more launches answered than the {} asked",
                            req.launches.len()
                        );
                    }
                    check_times(&t, req, times.len())?;
                    times.push(t);
                }
                Line::Done(n) => done = n == req.launches.len(),
                Line::Error { kind, message } => {
                    failure = Some(sidecar_error(&self.python, &req.kernel, &kind, message));
                    break;
                }
            }
        }
        let status = child.wait().context("waiting for the torch sidecar")?;
        if let Some(e) = failure {
            return Err(e);
        }
        match ready {
            Some(r) if done && times.len() == req.launches.len() && status.success() => {
                Ok((r, times))
            }
            _ => bail!(
                "torch sidecar exited ({status}) after answering {} of {} launches",
                times.len(),
                req.launches.len()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::validate::{default_chunks, launches, tests::small_plan};

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("skewsim-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn request(specs: &[LaunchSpec], bwd: bool) -> Request {
        Request {
            protocol: PROTOCOL,
            kernel: "torch-flash".into(),
            device: 0,
            warmup: 1,
            reps: 3,
            head_dim: 128,
            bwd,
            seed: 5,
            launches: specs.iter().map(LaunchReq::of).collect(),
        }
    }

    /// A fake sidecar: a shell script printing `lines` after reading the request.
    fn fake(dir: &std::path::Path, name: &str, lines: &[String], status: i32) -> Sidecar {
        let script = dir.join(name);
        let mut text = String::from("cat > /dev/null\n");
        for l in lines {
            text.push_str(&format!("echo '{l}'\n"));
        }
        text.push_str(&format!("exit {status}\n"));
        std::fs::write(&script, text).unwrap();
        Sidecar {
            python: "sh".into(),
            script,
        }
    }

    const READY: &str = r#"{"ready": {"torch": "2.11.0", "cuda": "13.0", "cudnn": 91900, "gpu": "Fake GPU", "sms": 132}}"#;

    fn answer(req: &Request) -> Vec<String> {
        let mut lines = vec![READY.to_string()];
        for (i, l) in req.launches.iter().enumerate() {
            let f = if l.units.is_empty() {
                "null".to_string()
            } else {
                format!(
                    "[{}, {}, {}]",
                    1.0 + i as f64,
                    2.0 + i as f64,
                    3.0 + i as f64
                )
            };
            let b = if l.units.is_empty() || !req.bwd {
                "null".to_string()
            } else {
                "[4.0, 5.0, 6.0]".to_string()
            };
            lines.push(format!(
                r#"{{"launch": {i}, "fwd_ms": {f}, "bwd_ms": {b}, "dispatch_ms": [0.1, 0.2, 0.3], "return_ms": [0.0, 0.0, 0.0]}}"#
            ));
        }
        lines.push(format!(r#"{{"done": {}}}"#, req.launches.len()));
        lines
    }

    #[test]
    fn requests_carry_each_launchs_units_in_order() {
        let plan = small_plan();
        let specs = launches(&plan, default_chunks(&plan)).unwrap();
        let req = request(&specs, true);
        assert_eq!(req.launches.len(), specs.len());
        for (l, s) in req.launches.iter().zip(&specs) {
            assert_eq!(l.units.len(), s.batch.units.len());
            for (&(q, kv), u) in l.units.iter().zip(&s.batch.units) {
                assert_eq!((q, kv), (u.e - u.a, u.e));
                assert!(q >= 1 && q <= kv && kv <= s.batch.sample_lens[u.sample]);
            }
            assert_eq!((l.heads, l.kv_heads), (s.heads, s.heads_kv));
        }
        let v: serde_json::Value = serde_json::to_value(&req).unwrap();
        assert_eq!(v["protocol"], 1);
        assert_eq!(v["launches"][0]["units"][0][1], specs[0].batch.units[0].e);
    }

    #[test]
    fn a_fake_sidecars_answers_become_the_measurement_rows() {
        let dir = scratch("fake_sidecar");
        let plan = small_plan();
        let specs = launches(&plan, default_chunks(&plan)).unwrap();
        for bwd in [true, false] {
            let req = request(&specs, bwd);
            let sc = fake(&dir, "ok.sh", &answer(&req), 0);
            let (ready, times) = sc.run(&req).unwrap();
            assert_eq!(ready.gpu, "Fake GPU");
            let rows = crate::cli::validate::torch_rows(&specs, &times, "p", 3, &plan).unwrap();
            let per = if bwd { 4 } else { 3 };
            assert_eq!(rows.len(), per * specs.len());
            // The median of (1 + i, 2 + i, 3 + i) is 2 + i: the forward row of launch i.
            assert_eq!(rows[1].measured_ms, 2.0);
            assert_eq!(rows[per + 1].measured_ms, 3.0);
            assert_eq!(rows[0].measured_ms, 0.2);
            if bwd {
                assert_eq!(rows[3].measured_ms, 5.0);
                assert_eq!(rows[3].pass, skewsim::cost::fit::Pass::Bwd);
            }
            // The format `skewsim calibrate` reads, unchanged.
            let csv = skewsim::cost::fit::measurements_to_csv(&rows).unwrap();
            let back = skewsim::cost::fit::measurements_from_csv(&csv, "t").unwrap();
            assert_eq!(back.len(), rows.len());
            assert_eq!(back[1].segs, rows[1].segs);
        }
    }

    #[test]
    fn sidecar_failures_are_named() {
        let dir = scratch("fake_sidecar_errors");
        let plan = small_plan();
        let specs = launches(&plan, default_chunks(&plan)).unwrap();
        let req = request(&specs, true);
        let err = |sc: &Sidecar| sc.run(&req).unwrap_err();
        let no_torch = fake(
            &dir,
            "nt.sh",
            &[
                r#"{"error": {"kind": "no-torch", "message": "ModuleNotFoundError: torch"}}"#
                    .into(),
            ],
            1,
        );
        let e = err(&no_torch);
        assert!(matches!(
            e.downcast_ref::<Unavailable>(),
            Some(Unavailable::Torch { .. })
        ));
        assert!(e.to_string().contains("cannot import torch"), "{e}");
        let no_gpu = fake(
            &dir,
            "ng.sh",
            &[
                READY.into(),
                r#"{"error": {"kind": "no-gpu", "message": "torch sees no CUDA GPU"}}"#.into(),
            ],
            1,
        );
        assert!(matches!(
            err(&no_gpu).downcast_ref::<Unavailable>(),
            Some(Unavailable::Gpu(_))
        ));
        let refused = fake(
            &dir,
            "un.sh",
            &[
                READY.into(),
                r#"{"error": {"kind": "unsupported", "message": "not bottom-right"}}"#.into(),
            ],
            1,
        );
        let e = err(&refused).to_string();
        assert!(
            e.contains("--kernel torch-flash cannot run this plan: not bottom-right"),
            "{e}"
        );
        // Exits without answering every launch.
        let mut short = answer(&req);
        short.truncate(2);
        let e = err(&fake(&dir, "short.sh", &short, 0)).to_string();
        assert!(
            e.contains(&format!("after answering 1 of {} launches", specs.len())),
            "{e}"
        );
        // Too few timings for a launch.
        let mut bad = answer(&req);
        bad[1] = bad[1].replace("[0.1, 0.2, 0.3]", "[0.1]");
        let e = err(&fake(&dir, "bad.sh", &bad, 0)).to_string();
        assert!(e.contains("launch 0: dispatch_ms has 1 timings"), "{e}");
        // No interpreter, no script.
        let missing = Sidecar {
            python: "/nonexistent/python3".into(),
            script: no_torch.script.clone(),
        };
        let e = err(&missing);
        assert!(matches!(
            e.downcast_ref::<Unavailable>(),
            Some(Unavailable::Python { .. })
        ));
        assert!(
            e.to_string().contains("--python /nonexistent/python3"),
            "{e}"
        );
        let noscript = Sidecar {
            python: "sh".into(),
            script: dir.join("absent.py"),
        };
        let e = err(&noscript);
        assert!(matches!(
            e.downcast_ref::<Unavailable>(),
            Some(Unavailable::Script(_))
        ));
    }

    /// The real sidecar: runs where Python, torch and a GPU are; elsewhere its refusal must
    /// be the named one, and the test says it skipped.
    #[test]
    fn the_real_sidecar_runs_or_names_what_is_missing() {
        let plan = small_plan();
        let specs = launches(&plan, default_chunks(&plan)).unwrap();
        let req = request(&specs, true);
        let sc = Sidecar {
            python: "python3".into(),
            script: concat!(env!("CARGO_MANIFEST_DIR"), "/validate/torch/sidecar.py").into(),
        };
        match sc.run(&req) {
            Ok((ready, times)) => {
                assert_eq!(times.len(), specs.len());
                eprintln!("ran on {ready}");
            }
            Err(e) => match e.downcast_ref::<Unavailable>() {
                Some(u) => eprintln!("skipped (sidecar unavailable here): {u}"),
                None => panic!("{e:#}"),
            },
        }
    }
}
