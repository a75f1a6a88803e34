//! A bf16 GEMM's time on one GPU from its shape (M × K by K × N), fitted to cuBLAS
//! measurements (`validate/torch/torch_grid.py`'s `gemm` section).
//!
//! The GEMM is cut into output tiles of `tm × tn`; each tile's main loop walks K at the
//! SMs' rate, and tiles run in waves of `sms` ([`GemmModel::time_ps`]):
//!
//!   main(tile, s) = ⌈tiles · s / sms⌉ · tm · tn · ⌈K / s⌉ · 2 / (rate / sms)
//!                   + \[s > 1\] · M · N · 4 · (s + 1) / bandwidth
//!
//! with K split into s slices when that fills idle SMs (s ≤ `max_split`, slices of at
//! least `min_split_k`; the fp32 partial sums written and read back), the library picking
//! the tile and split that run fastest. A call takes
//!
//!   t = max(floor, call + max(main, (M·K + K·N) · 2 / bandwidth) + M·N · 2 / bandwidth)
//!
//! — operands streamed under the main loop, the output written after it, at least the
//! per-call floor (an eager call's dispatch). Past `sustain_us` of one call the GPU's power
//! cap has lowered the SM clock: the rest of the call runs `sustained_slowdown` times
//! slower (measured: isolated cuBLAS calls of ≤ 2 ms at ~770 TFLOP/s and an SM clock near
//! its 1,980 MHz boost, calls of ≥ 8 ms at ~700 TFLOP/s with the clock at 1,300–1,850 MHz
//! under the 700 W cap, `validate/results/fed_run/smi.csv`). It may not price anything
//! else: the step builder's linear pieces call it per GEMM (`CostModel`).

use serde::{Deserialize, Serialize};

use super::MAX_CALL_MS;
use crate::error::{invalid, parse_error, Result};

/// The GEMM model's figures (a calibration's `gemm`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmModel {
    /// Main-loop rate of the whole GPU, TFLOP/s.
    pub tflops: f64,
    /// Memory rate of operands, outputs and split-K partial sums, bytes/s.
    pub bytes_per_s: f64,
    /// Fixed time of one call, µs.
    pub call_us: f64,
    /// Least time of one call, µs.
    pub floor_us: f64,
    /// SMs the tiles run on.
    pub sms: u32,
    /// Output tiles the library chooses among, (rows, columns).
    pub tiles: Vec<(u32, u32)>,
    /// Most slices K is split into.
    pub max_split: u32,
    /// Fewest K per slice.
    pub min_split_k: u32,
    /// How long one call runs at the boost clock before the power cap lowers it, µs (0 with
    /// `sustained_slowdown` 1: no cap).
    #[serde(default)]
    pub sustain_us: f64,
    /// How much slower a call runs past `sustain_us` (the boost over the capped clock's
    /// rate), ≥ 1.
    #[serde(default = "one")]
    pub sustained_slowdown: f64,
    /// Bytes per element of the operands A and B (2: bf16; 1: fp8, `cost::gpu::precision`);
    /// the output is bf16 either way.
    #[serde(default = "two", skip_serializing_if = "is_two")]
    pub operand_bytes: u32,
}

fn one() -> f64 {
    1.0
}

fn two() -> u32 {
    2
}

fn is_two(v: &u32) -> bool {
    *v == 2
}

impl GemmModel {
    /// Check the fields; `ctx` names the file.
    pub fn validate(&self, ctx: &str) -> Result<()> {
        let f = |n: &str| format!("{ctx}: gemm.{n}");
        for (n, v) in [("tflops", self.tflops), ("bytes_per_s", self.bytes_per_s)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(invalid(f(n), v, "a finite rate > 0"));
            }
        }
        for (n, v) in [
            ("call_us", self.call_us),
            ("floor_us", self.floor_us),
            ("sustain_us", self.sustain_us),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid(f(n), v, "a finite time >= 0 µs"));
            }
        }
        if !(self.sustained_slowdown.is_finite() && self.sustained_slowdown >= 1.0) {
            return Err(invalid(
                f("sustained_slowdown"),
                self.sustained_slowdown,
                "a finite factor >= 1",
            ));
        }
        for (n, v) in [
            ("sms", self.sms),
            ("max_split", self.max_split),
            ("min_split_k", self.min_split_k),
        ] {
            if v == 0 {
                return Err(invalid(f(n), 0, "at least 1"));
            }
        }
        if !(1..=2).contains(&self.operand_bytes) {
            return Err(invalid(
                f("operand_bytes"),
                self.operand_bytes,
                "1 (fp8) or 2 (bf16)",
            ));
        }
        if self.tiles.is_empty() || self.tiles.iter().any(|t| t.0 == 0 || t.1 == 0) {
            return Err(invalid(
                f("tiles"),
                format!("{:?}", self.tiles),
                "at least one tile, each side >= 1",
            ));
        }
        Ok(())
    }

    /// The main loop's time, ps: the fastest tile and split.
    fn main_ps(&self, m: u64, n: u64, k: u64) -> f64 {
        let per_sm = self.tflops / f64::from(self.sms); // TFLOP/s = FLOP/ps
        let splits = (k / u64::from(self.min_split_k)).clamp(1, u64::from(self.max_split));
        let mut best = f64::INFINITY;
        for &(tm, tn) in &self.tiles {
            let (tm, tn) = (u64::from(tm), u64::from(tn));
            let tiles = m.div_ceil(tm) * n.div_ceil(tn);
            for s in 1..=splits {
                let waves = (tiles * s).div_ceil(u64::from(self.sms)) as f64;
                let mut t = waves * (tm * tn * k.div_ceil(s)) as f64 * 2.0 / per_sm;
                if s > 1 {
                    t += (m * n * 4 * (s + 1)) as f64 / self.bytes_per_s * 1e12;
                }
                best = best.min(t);
            }
        }
        best
    }

    /// Time in ps of one M × K by K × N GEMM (0 when any side is 0).
    pub fn time_ps(&self, m: u64, n: u64, k: u64) -> f64 {
        if m == 0 || n == 0 || k == 0 {
            return 0.0;
        }
        let ps_per_byte = 1e12 / self.bytes_per_s;
        let operands = ((m * k + k * n) * u64::from(self.operand_bytes)) as f64 * ps_per_byte;
        let out = (m * n * 2) as f64 * ps_per_byte;
        let t = self.call_us * 1e6 + self.main_ps(m, n, k).max(operands) + out;
        let boost = self.sustain_us * 1e6;
        let t = if t > boost {
            boost + (t - boost) * self.sustained_slowdown
        } else {
            t
        };
        t.max(self.floor_us * 1e6)
    }
}

/// One measured GEMM (a row of `gemm_*.csv`).
#[derive(Clone, Debug, PartialEq)]
pub struct GemmRow {
    /// Which model, part, TP and pass it was (labels).
    pub label: String,
    /// Rows of the output (A is M × K).
    pub m: u64,
    /// Columns of the output (B is K × N).
    pub n: u64,
    /// The reduction dimension.
    pub k: u64,
    /// Median of the timed calls, ms.
    pub ms: f64,
}

/// The columns a GEMM measurement CSV must have.
const GEMM_COLUMNS: [&str; 9] = [
    "model",
    "part",
    "tp",
    "tokens",
    "pass",
    "m",
    "n",
    "k",
    "median_ms",
];

/// Parse GEMM measurement CSV text; `context` names the file in errors.
pub fn gemm_rows_from_csv(text: &str, context: &str) -> Result<Vec<GemmRow>> {
    let mut rdr = csv::Reader::from_reader(text.as_bytes());
    let headers = rdr
        .headers()
        .map_err(|e| parse_error(context, e.to_string()))?
        .clone();
    let mut col = [0usize; GEMM_COLUMNS.len()];
    for (i, name) in GEMM_COLUMNS.iter().enumerate() {
        col[i] = headers
            .iter()
            .position(|h| h == *name)
            .ok_or_else(|| parse_error(context, format!("missing column `{name}`")))?;
    }
    let mut out = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let rec = rec.map_err(|e| parse_error(context, e.to_string()))?;
        let ctx = format!("{context}: line {}", i + 2);
        let f = |k: usize| rec.get(col[k]).unwrap_or("");
        let dim = |k: usize| -> Result<u64> {
            let name = GEMM_COLUMNS[k];
            match f(k).parse::<u64>() {
                Ok(v) if (1..=1 << 24).contains(&v) => Ok(v),
                _ => Err(invalid(
                    format!("{ctx}: {name}"),
                    f(k),
                    "an integer in 1..=16777216",
                )),
            }
        };
        let ms: f64 = f(8)
            .parse()
            .ok()
            .filter(|v: &f64| *v > 0.0 && *v <= MAX_CALL_MS)
            .ok_or_else(|| {
                invalid(
                    format!("{ctx}: median_ms"),
                    f(8),
                    format!("a time in (0, {MAX_CALL_MS}] ms"),
                )
            })?;
        out.push(GemmRow {
            label: format!("{} {} tp{} {} {}", f(0), f(1), f(2), f(3), f(4)),
            m: dim(5)?,
            n: dim(6)?,
            k: dim(7)?,
            ms,
        });
    }
    Ok(out)
}

/// Absolute percentage errors of `model` on `rows`: (median, p90, max) over the rows.
pub fn score(model: &GemmModel, rows: &[GemmRow]) -> (f64, f64, f64) {
    let mut e: Vec<f64> = rows
        .iter()
        .map(|r| (model.time_ps(r.m, r.n, r.k) * 1e-9 / r.ms - 1.0).abs() * 100.0)
        .collect();
    e.sort_by(f64::total_cmp);
    let q = |p: f64| {
        if e.is_empty() {
            f64::NAN
        } else {
            e[((p * (e.len() - 1) as f64).round() as usize).min(e.len() - 1)]
        }
    };
    (q(0.5), q(0.9), q(1.0))
}

const GEMM_H200: &str = include_str!("../../calibrations/gemm-h200.json");

impl GemmModel {
    /// The built-in H200 model (`calibrations/gemm-h200.json`, fitted by `skewsim calibrate
    /// --gemm validate/results/torch_fit/gemm_fit.csv`).
    pub fn h200_default() -> Result<Self> {
        let ctx = "calibrations/gemm-h200.json (built in)";
        let m: GemmModel =
            serde_json::from_str(GEMM_H200).map_err(|e| parse_error(ctx, e.to_string()))?;
        m.validate(ctx)?;
        Ok(m)
    }
}

/// The H200's geometry with cuBLAS's common Hopper tiles, at the given figures.
pub fn h200(tflops: f64, bytes_per_s: f64, call_us: f64, floor_us: f64) -> GemmModel {
    GemmModel {
        tflops,
        bytes_per_s,
        call_us,
        floor_us,
        sms: super::blocks::H200_SMS,
        tiles: vec![(128, 128), (128, 256), (256, 128)],
        max_split: 32,
        min_split_k: 512,
        sustain_us: 0.0,
        sustained_slowdown: 1.0,
        operand_bytes: 2,
    }
}

/// Fit the six figures of `start` to `rows` by coordinate search on the mean absolute
/// relative error (each figure scaled up and down by a step that halves when no move
/// helps, until 0.1 %), from `start` and from a grid of memory rates (1.5–6 TB/s) and
/// call terms (0, 10 µs) — the max() terms leave local minima —, each with the power cap
/// starting at 2 ms and 15 % (or `start`'s own); geometry kept.
pub fn fit(rows: &[GemmRow], start: &GemmModel) -> Result<GemmModel> {
    if rows.is_empty() {
        return Err(invalid("gemm measurements", 0, "at least one row"));
    }
    let cost = |m: &GemmModel| -> f64 {
        rows.iter()
            .map(|r| (m.time_ps(r.m, r.n, r.k) * 1e-9 / r.ms - 1.0).abs())
            .sum::<f64>()
    };
    let mut starts = vec![start.clone()];
    for bw in [1.5e12, 3e12, 4.5e12, 6e12] {
        for call_us in [0.0, 10.0] {
            let capped = start.sustained_slowdown > 1.0;
            starts.push(GemmModel {
                bytes_per_s: bw,
                call_us,
                sustain_us: if capped { start.sustain_us } else { 2000.0 },
                sustained_slowdown: if capped {
                    start.sustained_slowdown
                } else {
                    1.15
                },
                ..start.clone()
            });
        }
    }
    let fits = starts.into_iter().map(|s| descend(s, &cost));
    fits.min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|f| f.0)
        .ok_or_else(|| invalid("gemm fit starts", 0, "at least one"))
}

/// One coordinate search from `start` under `cost`: the model and its cost.
fn descend(start: GemmModel, cost: &dyn Fn(&GemmModel) -> f64) -> (GemmModel, f64) {
    let mut best = start;
    let mut c = cost(&best);
    let mut step = 0.25_f64;
    while step > 1e-3 {
        let mut moved = false;
        for i in 0..6 {
            for dir in [1.0 + step, 1.0 / (1.0 + step)] {
                let mut t = best.clone();
                // A zero time moves off zero by a µs; the slowdown moves as its excess
                // over 1 (kept >= 1).
                let scale = |v: f64| if v == 0.0 { 1.0 } else { v * dir };
                match i {
                    0 => t.tflops = scale(t.tflops),
                    1 => t.bytes_per_s = scale(t.bytes_per_s),
                    2 => t.call_us = scale(t.call_us),
                    3 => t.floor_us = scale(t.floor_us),
                    4 => t.sustain_us = scale(t.sustain_us),
                    _ => t.sustained_slowdown = 1.0 + (t.sustained_slowdown - 1.0).max(1e-3) * dir,
                }
                let ct = cost(&t);
                if ct < c {
                    (best, c, moved) = (t, ct, true);
                }
            }
        }
        if !moved {
            step /= 2.0;
        }
    }
    (best, c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gemm_by_hand() {
        // One 128 × 128 tile, K = 256, 1 SM at 1 TFLOP/s (1 FLOP/ps): 8,388,608 ps of main
        // loop; operands 2·(128·256·2) bytes at 1 byte/ps below it; the output 32,768 ps
        // after it; no call term or floor.
        let m = GemmModel {
            sms: 1,
            tiles: vec![(128, 128)],
            ..h200(1.0, 1e12, 0.0, 0.0)
        };
        let t = m.time_ps(128, 128, 256);
        assert_eq!(t, 128.0 * 128.0 * 256.0 * 2.0 + 128.0 * 128.0 * 2.0);
        // Two tiles: two waves on the one SM.
        assert_eq!(m.time_ps(256, 128, 256), 2.0 * 8_388_608.0 + 2.0 * 32_768.0);
        // The floor holds small calls up.
        let f = GemmModel {
            floor_us: 20.0,
            ..m.clone()
        };
        assert_eq!(f.time_ps(1, 1, 1), 20e6);
        assert_eq!(m.time_ps(0, 5, 5), 0.0);
    }

    #[test]
    fn split_k_fills_idle_sms() {
        // A 128 × 128 output over K = 65,536 on 132 SMs: one tile would leave 131 SMs idle;
        // split 32 ways it runs ~32× faster in the main loop.
        let m = h200(660.0, 3e12, 0.0, 0.0);
        let one = GemmModel {
            max_split: 1,
            ..m.clone()
        };
        let (a, b) = (m.time_ps(128, 128, 65_536), one.time_ps(128, 128, 65_536));
        assert!(a < b / 10.0, "{a} {b}");
    }

    #[test]
    fn past_the_sustain_time_a_call_runs_slower() {
        let m = GemmModel {
            sustain_us: 1000.0,
            sustained_slowdown: 1.2,
            ..h200(700.0, 3e12, 0.0, 0.0)
        };
        let plain = GemmModel {
            sustained_slowdown: 1.0,
            ..m.clone()
        };
        // A 49 µs call ends at the boost clock.
        let short = plain.time_ps(1024, 4096, 4096);
        assert!(short < 1e9);
        assert_eq!(m.time_ps(1024, 4096, 4096), short);
        // An 11 ms call: its first ms at the boost clock, the rest 1.2× slower.
        let long = plain.time_ps(65_536, 14_336, 4096);
        assert!(long > 1e10);
        assert_eq!(m.time_ps(65_536, 14_336, 4096), 1e9 + (long - 1e9) * 1.2);
        let bad = GemmModel {
            sustained_slowdown: 0.9,
            ..m.clone()
        };
        let e = bad.validate("c.json").unwrap_err().to_string();
        assert!(e.contains("c.json: gemm.sustained_slowdown"), "{e}");
    }

    #[test]
    fn the_fit_recovers_known_figures() {
        let truth = GemmModel {
            sustain_us: 3000.0,
            sustained_slowdown: 1.12,
            ..h200(700.0, 3.5e12, 8.0, 20.0)
        };
        let shapes = [
            (1024, 4096, 4096),
            (16384, 4096, 4096),
            (65536, 14336, 4096),
            (4096, 4096, 65536),
            (512, 2048, 196_608),
            (196_608, 4096, 512),
            (64, 2048, 768),
            (2048, 128, 12288),
            (262_144, 8192, 8192),
            (8192, 1024, 1024),
        ];
        let rows: Vec<GemmRow> = shapes
            .iter()
            .map(|&(m, n, k)| GemmRow {
                label: String::new(),
                m,
                n,
                k,
                ms: truth.time_ps(m, n, k) * 1e-9,
            })
            .collect();
        let got = fit(&rows, &h200(500.0, 2e12, 0.0, 10.0)).unwrap();
        let (med, _, max) = score(&got, &rows);
        assert!(med < 0.5 && max < 2.0, "{got:?} {med} {max}");
    }

    #[test]
    fn bad_rows_and_fields_are_named() {
        let ok = "model,part,tp,tokens,pass,m,n,k,median_ms\nx,qkv,1,1024,fwd,1024,6144,4096,0.1\n";
        assert_eq!(gemm_rows_from_csv(ok, "g.csv").unwrap().len(), 1);
        let e = gemm_rows_from_csv(&ok.replace(",6144,", ",0,"), "g.csv")
            .unwrap_err()
            .to_string();
        assert!(e.contains("g.csv: line 2: n"), "{e}");
        for bad in ["nan", "0", "60001", "1e300"] {
            let e = gemm_rows_from_csv(&ok.replace(",0.1", &format!(",{bad}")), "g.csv")
                .unwrap_err()
                .to_string();
            assert!(e.contains("median_ms") && e.contains("60000] ms"), "{e}");
        }
        let e = gemm_rows_from_csv("m,n\n1,2\n", "g.csv")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing column `model`"), "{e}");
        let bad = GemmModel {
            tflops: -1.0,
            ..h200(700.0, 3e12, 0.0, 0.0)
        };
        let e = bad.validate("c.json").unwrap_err().to_string();
        assert!(e.contains("c.json: gemm.tflops"), "{e}");
    }
}
