//! The linear layers' precision (`[parallel] precision`): BF16, or FP8 as NVIDIA's
//! TransformerEngine runs it (per-tensor scaled e4m3/e5m2 GEMMs in the linear layers;
//! attention, norms and elementwise kernels stay BF16).
//!
//! What FP8 changes in the prices ([`CostModel::with_precision`]):
//! - every linear GEMM's main loop runs at the GPU's FP8 rate: the BF16 model's rate ×
//!   [`Gpu::fp8_gemm_speedup`] (the published achieved FP8 over achieved BF16 matmul rate
//!   of that GPU, each the best cuBLAS(Lt) GEMM of a shape search: stas00/ml-engineering,
//!   "Maximum Achievable Matmul FLOPS", cited in `gpus/*.toml`), its operands at 1 byte per
//!   element ([`GemmModel::operand_bytes`]), its output BF16;
//! - each GEMM's quantization, counted as bytes at the HBM rate ([`cast_bytes`]): forward,
//!   the activation operand (M × K) read in BF16 and written in FP8 twice, row- and
//!   column-wise (the column-wise copy is what the weight-gradient GEMM reads; on Hopper FP8
//!   GEMMs take only the TN layout, so it is a physical transpose: TransformerEngine,
//!   "Performance considerations — Handling transposes",
//!   https://nvidia.github.io/TransformerEngine/features/low_precision_training/performance_considerations/performance_considerations.html);
//!   backward, the output gradient (M × N) likewise. Weights are quantized once a step and
//!   cached across micro-batches (TransformerEngine's FP8 weight caching,
//!   `is_first_microbatch`), so their cast is not counted per GEMM. The casts are priced
//!   with the GEMM model (the default prices); a calibration file's FLOP-rate path counts
//!   the FP8 rate alone.
//!
//! Memory under FP8 (`cost::memory`, `MemoryInputs::fp8`): the BF16 weights stay (and the
//! FP32 master copy in the optimizer), plus the cached FP8 weight in both usages (row-wise
//! for the forward and input-gradient GEMMs' operand, column-wise for the other: 2 bytes
//! per linear parameter; TransformerEngine PR #1596, `layernorm_linear.py`: "Weight with
//! column-wise usage is needed for dgrad GEMM"); each linear layer saves its input for the
//! weight gradient as FP8 instead of BF16 ("Input with column-wise usage is needed for
//! wgrad GEMM", same PR) — the QKV and MLP inputs (the normed hidden states) and the MLP's
//! down-projection input at 1 byte, and the O projection's input an FP8 copy beside the
//! BF16 attention output that attention's own backward keeps.
//!
//! MFU stays against the BF16 peak (`Hardware::peak_tflops`). NVIDIA's Megatron-Bridge
//! performance summary (https://docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary-archive.html,
//! "Performance Metrics") reports BF16 and FP8 runs alike as model TFLOP/s per GPU, with
//! no utilization against an FP8 peak; divided by the BF16 dense peak, as here, an FP8 run
//! shows as a higher MFU of the same denominator, and runs of either precision compare.

use serde::{Deserialize, Serialize};

use super::Gpu;
use crate::cost::gemm::GemmModel;
use crate::cost::CostModel;
use crate::error::{invalid, Result};

/// The precision of the linear layers' GEMMs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// BF16 operands and outputs.
    #[default]
    Bf16,
    /// FP8 operands (TransformerEngine), BF16 outputs.
    Fp8,
}

impl Precision {
    /// The name a spec uses.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Bf16 => "bf16",
            Precision::Fp8 => "fp8",
        }
    }

    /// Whether this is the default (BF16): what a spec may leave out.
    pub fn is_bf16(&self) -> bool {
        *self == Precision::Bf16
    }
}

/// Bytes one GEMM's FP8 quantization moves (the module doc): forward, the M × K activation
/// read in BF16 and written row- and column-wise in FP8 (4 bytes an element); backward, the
/// M × N output gradient likewise.
pub fn cast_bytes(m: u64, n: u64, k: u64, bwd: bool) -> f64 {
    let elems = if bwd { m * n } else { m * k };
    4.0 * elems as f64
}

impl GemmModel {
    /// The same GEMM with FP8 operands on a GPU whose FP8 GEMMs run `speedup` times the
    /// BF16 ones' rate.
    pub fn fp8(&self, speedup: f64) -> GemmModel {
        GemmModel {
            tflops: self.tflops * speedup,
            operand_bytes: 1,
            ..self.clone()
        }
    }
}

impl CostModel {
    /// The same model with the linear layers' GEMMs in `precision` on `gpu` (BF16: itself).
    /// FP8 on a GPU without FP8 Tensor Cores is refused, naming the GPU.
    pub fn with_precision(&self, precision: Precision, gpu: &Gpu) -> Result<CostModel> {
        match precision {
            Precision::Bf16 => Ok(self.clone()),
            Precision::Fp8 => {
                let speedup = gpu.fp8_gemm_speedup().ok_or_else(|| {
                    invalid(
                        "[parallel] precision",
                        "fp8",
                        format!(
                            "bf16: {} ({}) has no FP8 Tensor Cores",
                            gpu.name, gpu.description
                        ),
                    )
                })?;
                let mut c = self.clone();
                c.precision = Precision::Fp8;
                c.fp8_gemm_speedup = speedup;
                c.gemm = self.gemm.as_ref().map(|g| g.fp8(speedup));
                Ok(c)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::gemm;
    use crate::cost::{LinearPart, LinearPiece, ModelConfig};
    use crate::error::Error;

    fn gpu(name: &str) -> Gpu {
        Gpu::builtin("gpu", name).unwrap()
    }

    #[test]
    fn an_fp8_gemm_is_priced_by_hand() {
        let g = gemm::h200(800.0, 4e12, 0.0, 0.0);
        let bf16 = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap())
            .unwrap()
            .with_gemm(g.clone());
        let h100 = gpu("h100");
        let fp8 = bf16.with_precision(Precision::Fp8, &h100).unwrap();
        // 1979 · 0.709 / (989 · 0.803)
        let s = 1979.0 * 0.709 / (989.0 * 0.803);
        assert!((fp8.fp8_gemm_speedup - s).abs() < 1e-12);
        let f = fp8.gemm.clone().unwrap();
        assert_eq!((f.tflops, f.operand_bytes), (800.0 * s, 1));
        // The QKV piece over 8192 tokens: a (8192 × 6144 × 4096) GEMM, then the norm. FP8:
        // the same norm, the GEMM at the FP8 rate with one-byte operands, and its input's
        // cast, 4 bytes an element of 8192 × 4096 at 4.8 TB/s.
        let (m, n, k) = (8192u64, 6144u64, 4096u64);
        let t0 = bf16.piece_fwd_ps_f(LinearPiece::Qkv, m, m);
        let t1 = fp8.piece_fwd_ps_f(LinearPiece::Qkv, m, m);
        let cast = 4.0 * (m * k) as f64 / 4.8e12 * 1e12;
        let want = t0 - g.time_ps(m, n, k) + f.time_ps(m, n, k) + cast;
        assert!((t1 / want - 1.0).abs() < 1e-12, "{t1} {want}");
        // A compute-bound GEMM: main loop s times faster; the operands a byte an element.
        let main = |g: &GemmModel| g.time_ps(m, n, k) - (m * n * 2) as f64 / 4e12 * 1e12;
        assert!((main(&g) / main(&f) / s - 1.0).abs() < 1e-9);
        // The backward casts the output gradient (M × N).
        let b0 = bf16.linear_bwd_ps(LinearPart::PreAttn, m) as f64;
        let b1 = fp8.linear_bwd_ps(LinearPart::PreAttn, m) as f64;
        let gemms = |g: &GemmModel| g.time_ps(m, k, n) + g.time_ps(k, n, m);
        let want = b0 - gemms(&g) + gemms(&f) + 4.0 * (m * n) as f64 / 4.8e12 * 1e12;
        assert!((b1 / want - 1.0).abs() < 1e-9, "{b1} {want}");
        // MFU's denominator stays the BF16 peak.
        assert_eq!(fp8.hw.peak_tflops, bf16.hw.peak_tflops);
        // BF16 is the model itself.
        let same = bf16.with_precision(Precision::Bf16, &h100).unwrap();
        assert_eq!(same.gemm, bf16.gemm);
        assert_eq!(same.fp8_gemm_speedup, 1.0);
    }

    #[test]
    fn without_a_gemm_model_fp8_runs_at_the_faster_rate() {
        let bf16 = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
        let b200 = gpu("b200");
        let fp8 = bf16.with_precision(Precision::Fp8, &b200).unwrap();
        let s = b200.fp8_gemm_speedup().unwrap();
        let gemm = |c: &CostModel| {
            c.piece_fwd_ps_f(LinearPiece::Ffn, 4096, 4096)
                - c.piece_fwd_ps_f(LinearPiece::Ffn, 0, 4096)
        };
        assert!((gemm(&bf16) / gemm(&fp8) / s - 1.0).abs() < 1e-12);
    }

    #[test]
    fn fp8_on_a_gpu_without_it_is_refused_naming_the_gpu() {
        let c = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
        let e = c.with_precision(Precision::Fp8, &gpu("a100")).unwrap_err();
        match e {
            Error::Invalid {
                field,
                value,
                allowed,
            } => {
                assert_eq!(
                    (field.as_str(), value.as_str()),
                    ("[parallel] precision", "fp8")
                );
                assert!(
                    allowed.contains("a100") && allowed.contains("bf16"),
                    "{allowed}"
                );
            }
            e => panic!("{e:?}"),
        }
    }
}
