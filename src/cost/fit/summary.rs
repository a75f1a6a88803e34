//! Predicted against measured: absolute percentage errors per worker and per step ([`Summary`]).

use serde::Serialize;

use super::*;

/// Absolute percentage errors summarised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ErrStats {
    /// Pairs counted.
    pub n: usize,
    /// Median absolute percentage error.
    pub median_ape: f64,
    /// Its 90th percentile.
    pub p90_ape: f64,
    /// Its maximum.
    pub max_ape: f64,
}

pub(super) fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Linear interpolation between order statistics.
    let x = p * (sorted.len() - 1) as f64;
    let lo = x.floor() as usize;
    let hi = x.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (x - lo as f64)
}

impl ErrStats {
    /// From (predicted, measured) pairs; pairs with measured 0 are skipped.
    pub fn of(pairs: &[(f64, f64)]) -> Self {
        let mut e: Vec<f64> = pairs
            .iter()
            .filter(|(_, m)| *m > 0.0)
            .map(|(p, m)| (p - m).abs() / m * 100.0)
            .collect();
        e.sort_by(f64::total_cmp);
        ErrStats {
            n: e.len(),
            median_ape: quantile(&e, 0.5),
            p90_ape: quantile(&e, 0.9),
            max_ape: e.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// One worker's attention time of one pass in one (plan, GA index, pool): Σ of its chunks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkerTime {
    /// The plan.
    pub plan: String,
    /// The GA index.
    pub ga: u32,
    /// The pool.
    pub pool: u32,
    /// The worker.
    pub worker: u32,
    /// Forward or backward.
    pub pass: Pass,
    /// Σ predicted chunk times.
    pub predicted_ms: f64,
    /// Σ measured chunk times.
    pub measured_ms: f64,
}

/// Predicted vs measured: per worker (attention), per step (slowest worker), copies; for
/// the forward, the backward and the two together.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Every worker's time per pass.
    pub workers: Vec<WorkerTime>,
    /// APE of per-worker forward attention time.
    pub worker_err: ErrStats,
    /// APE of the slowest worker's forward time per (plan, GA index): the straggler.
    pub max_worker_err: ErrStats,
    /// APE of single forward launches.
    pub launch_err: ErrStats,
    /// The same three for the backward (n = 0 without backward rows).
    pub bwd_worker_err: ErrStats,
    /// Backward: the slowest worker per (plan, GA index).
    pub bwd_max_worker_err: ErrStats,
    /// Backward: single calls.
    pub bwd_launch_err: ErrStats,
    /// Forward + backward per worker (workers with both passes) and its slowest worker.
    pub fb_worker_err: ErrStats,
    /// Forward + backward: the slowest worker per (plan, GA index).
    pub fb_max_worker_err: ErrStats,
    /// APE of copies (dispatch and return, bytes > 0).
    pub copy_err: ErrStats,
}

/// Slowest worker per (plan, GA index): (predicted max, measured max).
pub(super) fn step_maxima<'a>(
    workers: impl Iterator<Item = (&'a str, u32, f64, f64)>,
) -> Vec<(f64, f64)> {
    let mut steps: std::collections::BTreeMap<(&str, u32), (f64, f64)> = Default::default();
    for (plan, ga, p, m) in workers {
        let e = steps.entry((plan, ga)).or_insert((0.0, 0.0));
        e.0 = e.0.max(p);
        e.1 = e.1.max(m);
    }
    steps.into_values().collect()
}

/// Summarise `rows` priced by `pricing`.
pub fn summarize(rows: &[Measurement], pricing: &Pricing) -> Summary {
    let mut workers: Vec<WorkerTime> = Vec::new();
    let mut launches: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
    let mut copies = Vec::new();
    let mut index: std::collections::BTreeMap<(String, u32, u32, u32, Pass), usize> =
        std::collections::BTreeMap::new();
    for r in rows {
        let p = pricing.predict_ms(r);
        match r.kind {
            MeasureKind::Attn => {
                launches[usize::from(r.pass == Pass::Bwd)].push((p, r.measured_ms));
                let key = (r.plan.clone(), r.ga, r.pool, r.worker, r.pass);
                let i = *index.entry(key).or_insert_with(|| {
                    workers.push(WorkerTime {
                        plan: r.plan.clone(),
                        ga: r.ga,
                        pool: r.pool,
                        worker: r.worker,
                        pass: r.pass,
                        predicted_ms: 0.0,
                        measured_ms: 0.0,
                    });
                    workers.len() - 1
                });
                workers[i].predicted_ms += p;
                workers[i].measured_ms += r.measured_ms;
            }
            _ if r.bytes > 0 => copies.push((p, r.measured_ms)),
            _ => {}
        }
    }
    let of_pass = |pass: Pass| {
        let w: Vec<&WorkerTime> = workers.iter().filter(|w| w.pass == pass).collect();
        let pairs: Vec<(f64, f64)> = w.iter().map(|w| (w.predicted_ms, w.measured_ms)).collect();
        let steps = step_maxima(
            w.iter()
                .map(|w| (w.plan.as_str(), w.ga, w.predicted_ms, w.measured_ms)),
        );
        (ErrStats::of(&pairs), ErrStats::of(&steps))
    };
    let (fw, fs) = of_pass(Pass::Fwd);
    let (bw, bs) = of_pass(Pass::Bwd);
    // Forward + backward of the workers that have both.
    let mut both: Vec<(&str, u32, f64, f64)> = Vec::new();
    for w in workers.iter().filter(|w| w.pass == Pass::Fwd) {
        let key = (w.plan.clone(), w.ga, w.pool, w.worker, Pass::Bwd);
        if let Some(&j) = index.get(&key) {
            let b = &workers[j];
            both.push((
                w.plan.as_str(),
                w.ga,
                w.predicted_ms + b.predicted_ms,
                w.measured_ms + b.measured_ms,
            ));
        }
    }
    let fb: Vec<(f64, f64)> = both.iter().map(|x| (x.2, x.3)).collect();
    let fb_steps = step_maxima(both.iter().copied());
    Summary {
        worker_err: fw,
        max_worker_err: fs,
        launch_err: ErrStats::of(&launches[0]),
        bwd_worker_err: bw,
        bwd_max_worker_err: bs,
        bwd_launch_err: ErrStats::of(&launches[1]),
        fb_worker_err: ErrStats::of(&fb),
        fb_max_worker_err: ErrStats::of(&fb_steps),
        copy_err: ErrStats::of(&copies),
        workers,
    }
}

impl Summary {
    /// Text table: the error statistics (backward lines only when there are backward rows).
    pub fn table(&self) -> String {
        let mut s = String::from(
            "quantity                          n  median APE %  p90 APE %  max APE %\n",
        );
        let mut lines = vec![
            ("fwd per-worker attention time", &self.worker_err),
            ("fwd slowest worker per step", &self.max_worker_err),
            ("fwd single launch", &self.launch_err),
        ];
        if self.bwd_launch_err.n > 0 {
            lines.extend([
                ("bwd per-worker attention time", &self.bwd_worker_err),
                ("bwd slowest worker per step", &self.bwd_max_worker_err),
                ("bwd single call", &self.bwd_launch_err),
                ("fwd+bwd per-worker time", &self.fb_worker_err),
                ("fwd+bwd slowest worker", &self.fb_max_worker_err),
            ]);
        }
        lines.push(("copy (HBM d2d)", &self.copy_err));
        for (name, e) in lines {
            s.push_str(&format!(
                "{name:<30}{:>5}{:>14.2}{:>11.2}{:>11.2}\n",
                e.n, e.median_ape, e.p90_ape, e.max_ape
            ));
        }
        s
    }
}
