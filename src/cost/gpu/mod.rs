//! GPUs as data: one `gpus/NAME.toml` per GPU (dense BF16 and FP8 peaks, HBM capacity and
//! bandwidth, SMs, clock, board power, the share of peak a large GEMM reaches), every figure
//! cited in its file. Built-ins are embedded (`include_str!`), so a run names a GPU
//! (`h200`, `b200`, ...) without the repository around it; a file's *text* is parsed here,
//! a path is read at the edge (`experiment`).
//!
//! What owns what:
//! - [`Gpu`] (this file): the figures, their parse and checks, lookup by name.
//! - [`derive`]: the cost models of a GPU other than the one the built-in profiles were
//!   measured on, derived from the measured H200 models ([`crate::cost::CostModel::for_gpu`]).
//! - [`precision`]: BF16 or FP8 linear layers ([`Precision`]) and what FP8 changes in the
//!   GEMMs' prices ([`crate::cost::CostModel::with_precision`]).
//!
//! Architecture invariant: the H200 is the reference GPU ([`REFERENCE`]); a cost model
//! priced for it is the measured one, bit for bit.

pub mod derive;
pub mod precision;

use serde::{Deserialize, Serialize};

use crate::error::{invalid, parse_error, Result};
pub use derive::Scaling;
pub use precision::Precision;

/// The GPU the built-in kernel profiles (`calibrations/`) were measured on.
pub const REFERENCE: &str = "h200";

/// Most SMs a GPU file may give (the block models' limit).
pub const MAX_SMS: u32 = super::blocks::MAX_SMS;

/// One GPU's figures (a `gpus/*.toml` file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// Short name runs use (`h200`, `b200`, ...).
    pub name: String,
    /// What the GPU is, for summaries.
    pub description: String,
    /// Dense BF16 Tensor Core peak, TFLOP/s (the MFU denominator).
    pub bf16_tflops: f64,
    /// Whether the Tensor Cores run FP8 GEMMs.
    pub fp8: bool,
    /// Dense FP8 Tensor Core peak, TFLOP/s (with `fp8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_tflops: Option<f64>,
    /// HBM capacity, GB (10⁹ bytes), as the datasheet states it.
    pub memory_gbyte: f64,
    /// HBM bandwidth, GB/s (10⁹ bytes/s).
    pub hbm_gbyte_s: f64,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Boost (compute) clock, MHz, where published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boost_mhz: Option<f64>,
    /// Board power (maximum TDP / TGP), W.
    pub board_power_w: f64,
    /// Idle power, W, where published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_power_w: Option<f64>,
    /// The share of the BF16 peak the best large cuBLAS GEMM reaches (published).
    pub bf16_gemm_efficiency: f64,
    /// The share of the FP8 peak the best large cuBLASLt FP8 GEMM reaches (with `fp8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_gemm_efficiency: Option<f64>,
}

const BUILTINS: &[(&str, &str)] = &[
    ("a100", include_str!("../../../gpus/a100.toml")),
    ("b200", include_str!("../../../gpus/b200.toml")),
    ("gb200", include_str!("../../../gpus/gb200.toml")),
    ("gb300", include_str!("../../../gpus/gb300.toml")),
    ("h100", include_str!("../../../gpus/h100.toml")),
    ("h200", include_str!("../../../gpus/h200.toml")),
];

/// The names of the built-in GPUs.
pub fn builtin_names() -> Vec<&'static str> {
    BUILTINS.iter().map(|(n, _)| *n).collect()
}

impl Gpu {
    /// A built-in GPU by name; `field` names the option in errors (`gpu`, `[cluster] gpu`).
    pub fn builtin(field: &str, name: &str) -> Result<Self> {
        let text =
            super::builtin_text(BUILTINS, field, name, ", or a path to a GPU file (*.toml)")?;
        Self::from_toml_str(text, &format!("gpus/{name}.toml (built in)"))
    }

    /// The reference GPU (the H200).
    pub fn reference() -> Result<Self> {
        Self::builtin("gpu", REFERENCE)
    }

    /// Whether this is the GPU the built-in profiles were measured on.
    pub fn is_reference(&self) -> bool {
        self.name == REFERENCE
    }

    /// Parse a GPU file's text; `context` names the file in errors.
    pub fn from_toml_str(text: &str, context: &str) -> Result<Self> {
        let g: Gpu = toml::from_str(text).map_err(|e| parse_error(context, e.to_string()))?;
        g.validate(context)?;
        Ok(g)
    }

    /// Check every field's range and FP8's consistency; `ctx` names the file.
    pub fn validate(&self, ctx: &str) -> Result<()> {
        let f = |n: &str| format!("{ctx}: {n}");
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid(
                f("name"),
                &self.name,
                "a non-empty name of letters, digits, '-' and '_'",
            ));
        }
        let rates = [
            ("bf16_tflops", Some(self.bf16_tflops)),
            ("fp8_tflops", self.fp8_tflops),
            ("memory_gbyte", Some(self.memory_gbyte)),
            ("hbm_gbyte_s", Some(self.hbm_gbyte_s)),
            ("boost_mhz", self.boost_mhz),
            ("board_power_w", Some(self.board_power_w)),
            ("idle_power_w", self.idle_power_w),
        ];
        for (n, v) in rates {
            if let Some(v) = v.filter(|v| !(v.is_finite() && *v > 0.0 && *v < 1e9)) {
                return Err(invalid(f(n), v, "a finite number in (0, 1e9)"));
            }
        }
        for (n, v) in [
            ("bf16_gemm_efficiency", Some(self.bf16_gemm_efficiency)),
            ("fp8_gemm_efficiency", self.fp8_gemm_efficiency),
        ] {
            if let Some(v) = v.filter(|v| !(v.is_finite() && *v > 0.0 && *v <= 1.0)) {
                return Err(invalid(f(n), v, "a share of the peak in (0, 1]"));
            }
        }
        if !(1..=MAX_SMS).contains(&self.sms) {
            return Err(invalid(
                f("sms"),
                self.sms,
                format!("an integer in [1, {MAX_SMS}]"),
            ));
        }
        if let Some(idle) = self.idle_power_w.filter(|i| *i > self.board_power_w) {
            return Err(invalid(
                f("idle_power_w"),
                idle,
                format!("at most board_power_w ({} W)", self.board_power_w),
            ));
        }
        match (self.fp8, self.fp8_tflops, self.fp8_gemm_efficiency) {
            (true, Some(_), Some(_)) | (false, None, None) => Ok(()),
            (true, _, _) => Err(invalid(
                f("fp8"),
                true,
                "fp8 = true with fp8_tflops and fp8_gemm_efficiency given",
            )),
            (false, _, _) => Err(invalid(
                f("fp8"),
                false,
                "fp8 = false without fp8_tflops or fp8_gemm_efficiency (a GPU without FP8 \
                 has no FP8 figures)",
            )),
        }
    }

    /// HBM capacity in bytes (the feasibility check's limit).
    pub fn memory_bytes(&self) -> u64 {
        (self.memory_gbyte * 1e9).round() as u64
    }

    /// HBM bandwidth in bytes/s.
    pub fn hbm_bytes_per_s(&self) -> f64 {
        self.hbm_gbyte_s * 1e9
    }

    /// Dense BF16 peak of one SM, TFLOP/s.
    pub fn bf16_tflops_per_sm(&self) -> f64 {
        self.bf16_tflops / f64::from(self.sms)
    }

    /// How much faster a large FP8 GEMM runs than a large BF16 one on this GPU: the ratio of
    /// the published achieved rates (peak × efficiency), else `None` (no FP8).
    pub fn fp8_gemm_speedup(&self) -> Option<f64> {
        match (self.fp8, self.fp8_tflops, self.fp8_gemm_efficiency) {
            (true, Some(t), Some(e)) => {
                Some(t * e / (self.bf16_tflops * self.bf16_gemm_efficiency))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn every_builtin_parses_under_its_own_name() {
        for n in builtin_names() {
            let g = Gpu::builtin("gpu", n).unwrap();
            assert_eq!(g.name, n);
        }
        let h = Gpu::reference().unwrap();
        assert!(h.is_reference());
        // The H200's figures are the ones the cost model's defaults carry.
        let hw = crate::cost::Hardware::default();
        assert_eq!(h.bf16_tflops, hw.peak_tflops);
        assert_eq!(h.hbm_bytes_per_s(), hw.hbm_bytes_per_s);
        assert_eq!(h.memory_bytes(), hw.memory_bytes);
        assert_eq!(h.sms, crate::cost::blocks::H200_SMS);
    }

    #[test]
    fn an_unknown_gpu_is_named_with_the_known_ones() {
        let e = Gpu::builtin("[cluster] gpu", "h300").unwrap_err();
        match &e {
            Error::Invalid {
                field,
                value,
                allowed,
            } => {
                assert_eq!((field.as_str(), value.as_str()), ("[cluster] gpu", "h300"));
                for n in builtin_names() {
                    assert!(allowed.contains(n), "{allowed}");
                }
            }
            e => panic!("{e:?}"),
        }
    }

    fn field_of(e: &Error) -> String {
        match e.root() {
            Error::Invalid { field, .. } => field.clone(),
            Error::Parse { message, .. } => message.clone(),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn bad_fields_are_refused_by_name() {
        let base = include_str!("../../../gpus/b200.toml");
        let with = |from: &str, to: &str| {
            assert!(base.contains(from), "{from}");
            Gpu::from_toml_str(&base.replace(from, to), "x.toml").unwrap_err()
        };
        let cases = [
            ("sms = 148", "sms = 0", "x.toml: sms"),
            (
                "bf16_tflops = 2250.0",
                "bf16_tflops = -1.0",
                "x.toml: bf16_tflops",
            ),
            (
                "hbm_gbyte_s = 8000.0",
                "hbm_gbyte_s = inf",
                "x.toml: hbm_gbyte_s",
            ),
            (
                "fp8_gemm_efficiency = 0.763",
                "fp8_gemm_efficiency = 1.5",
                "x.toml: fp8_gemm_efficiency",
            ),
            ("fp8 = true", "fp8 = false", "x.toml: fp8"),
            ("name = \"b200\"", "name = \"b 200\"", "x.toml: name"),
        ];
        for (from, to, field) in cases {
            assert_eq!(field_of(&with(from, to)), field, "{to}");
        }
        // An unknown key is a parse error naming it.
        let e = with("sms = 148", "sms = 148\nsm_count = 148");
        assert!(field_of(&e).contains("sm_count"), "{e}");
        // FP8 figures need fp8 = true.
        let a100 = include_str!("../../../gpus/a100.toml");
        let e = Gpu::from_toml_str(&format!("{a100}\nfp8_tflops = 600.0\n"), "a.toml").unwrap_err();
        assert_eq!(field_of(&e), "a.toml: fp8");
    }

    #[test]
    fn derived_figures_by_hand() {
        let b = Gpu::builtin("gpu", "b200").unwrap();
        assert_eq!(b.memory_bytes(), 180_000_000_000);
        assert_eq!(b.hbm_bytes_per_s(), 8e12);
        assert!((b.bf16_tflops_per_sm() - 2250.0 / 148.0).abs() < 1e-12);
        // 4500 · 0.763 / (2250 · 0.776)
        let s = b.fp8_gemm_speedup().unwrap();
        assert!((s - 4500.0 * 0.763 / (2250.0 * 0.776)).abs() < 1e-12);
        assert_eq!(
            Gpu::builtin("gpu", "a100").unwrap().fp8_gemm_speedup(),
            None
        );
    }
}
