//! The cost models of a GPU the built-in profiles were not measured on, derived from the
//! measured H200 models ([`CostModel::for_gpu`]). The one place the derivation lives.
//!
//! # The mechanism
//! Every measured figure is one of three kinds, and each kind moves with one ratio of the
//! two GPU files ([`Scaling::between`]):
//!
//! - **compute-bound** — the time of work the Tensor Cores do on one SM: scaled by the
//!   per-SM peak ratio `per_sm = (peak / SMs)_gpu / (peak / SMs)_h200`, and the work is
//!   spread over the GPU's own SMs. So the GEMM model's main-loop rate becomes the per-SM
//!   rate × the GPU's SMs (`tflops` × peak ratio) and its output tiles run in waves of the
//!   GPU's `sms`; the attention block models' key-loop steps (`iter_ns`, `diag_ns`,
//!   `window_ns`) are divided by `per_sm` and their blocks list-scheduled onto the GPU's
//!   `sms`; the whole-launch attention tables (a rate of the whole GPU) are multiplied by
//!   the peak ratio.
//! - **memory-bound** — bytes through HBM: scaled by `hbm = bandwidth_gpu / bandwidth_h200`:
//!   the GEMM model's operand/output/split-K rate, every elementwise kind's achieved rate,
//!   the device copy rate, the backward's per-row·head dot/zeroing term (`row_head_ns`) and
//!   its grouped-query reduction (`reduce_ps_per_byte`), and `Hardware::hbm_bytes_per_s`.
//! - **fixed** — per call, per launch or per block, set by dispatch and latency, not by a
//!   rate: kept. The GEMM call term and floor, the attention launch terms, a block's
//!   prologue/epilogue (`block_ns`) and an empty block (`empty_ns`), co-residency
//!   (`pair_slowdown`, `blocks_per_sm`: 228 KiB of shared memory per SM on Hopper and
//!   Blackwell alike), the tile shapes, the GEMM's power-cap figures (`sustain_us`,
//!   `sustained_slowdown`) and the run-to-run jitter.
//!
//! `Hardware` takes the GPU file's datasheet figures: `peak_tflops` (BF16, the MFU
//! denominator), `hbm_bytes_per_s` and `memory_bytes` (the feasibility check's limit).
//!
//! # Where it departs from the kernels a GPU runs
//! The derived models describe *the H200's kernels* run on another GPU's SMs and HBM:
//! PyTorch's FlashAttention-2 (the measured profile) and Hopper-tiled cuBLAS. That is close
//! on an H100 (the same SM, less HBM bandwidth), where FlashAttention-2 reaches about 35 %
//! of peak (FlashAttention-3 paper, Shah et al. 2024, abstract), but production H100 jobs
//! may run FlashAttention-3 (up to 740 TFLOP/s, 75 %, same paper) or cuDNN, about twice
//! as fast. On Blackwell the Tensor Cores doubled per SM while the exponential units and
//! shared memory did not (FlashAttention-4 paper, Zadouri et al. 2026: forward bound by
//! the softmax's exponentials, backward by shared-memory traffic), so an FA2-class kernel
//! scaled by per-SM peak is optimistic for FA2 itself and pessimistic against
//! FlashAttention-4 (1,613 TFLOP/s, 71 % of a B200) or cuDNN 9.13. A GEMM keeps Hopper's
//! tile set (Blackwell's cuBLAS also runs 2-SM 256-wide tiles). The test
//! `derived_models_against_published_kernel_figures` prints these figures beside the
//! derived ones.

use serde::{Deserialize, Serialize};

use super::Gpu;
use crate::cost::blocks::{BlockModel, BlockTimes, BwdBlockModel};
use crate::cost::elementwise::ElementwiseModel;
use crate::cost::gemm::GemmModel;
use crate::cost::{blocks, CostModel, EffTable, LaunchCosts};
use crate::error::Result;

/// The ratios that carry the reference GPU's measured models to another GPU.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scaling {
    /// Per-SM compute: (BF16 peak / SMs) of the GPU over the reference's.
    pub per_sm: f64,
    /// Whole-GPU compute: BF16 peak of the GPU over the reference's.
    pub peak: f64,
    /// HBM bandwidth of the GPU over the reference's.
    pub hbm: f64,
    /// SMs of the GPU (the blocks' and tiles' waves run on them).
    pub sms: u32,
}

impl Scaling {
    /// The ratios from `reference` (the GPU the models were measured on) to `gpu`.
    pub fn between(reference: &Gpu, gpu: &Gpu) -> Self {
        Self {
            per_sm: gpu.bf16_tflops_per_sm() / reference.bf16_tflops_per_sm(),
            peak: gpu.bf16_tflops / reference.bf16_tflops,
            hbm: gpu.hbm_gbyte_s / reference.hbm_gbyte_s,
            sms: gpu.sms,
        }
    }

    /// The GEMM model on the GPU: the main loop at the per-SM rate over its SMs, operands
    /// at its HBM rate, the call terms and power-cap figures kept.
    pub fn gemm(&self, g: &GemmModel) -> GemmModel {
        GemmModel {
            tflops: g.tflops / f64::from(g.sms) * self.per_sm * f64::from(self.sms),
            bytes_per_s: g.bytes_per_s * self.hbm,
            sms: self.sms,
            ..g.clone()
        }
    }

    /// One kernel's block times: its loop steps (compute) faster by `per_sm`, the fixed
    /// parts kept.
    fn block_times(&self, t: &BlockTimes) -> BlockTimes {
        BlockTimes {
            iter_ns: t.iter_ns / self.per_sm,
            diag_ns: t.diag_ns / self.per_sm,
            ..*t
        }
    }

    /// The forward attention block model on the GPU's SMs.
    pub fn blocks(&self, b: &BlockModel) -> BlockModel {
        let t = self.block_times(&b.times());
        BlockModel {
            iter_ns: t.iter_ns,
            diag_ns: t.diag_ns,
            window_ns: b.window_ns / self.per_sm,
            sms: self.sms,
            ..*b
        }
    }

    /// The backward attention block model on the GPU's SMs.
    pub fn bwd_blocks(&self, b: &BwdBlockModel) -> BwdBlockModel {
        BwdBlockModel {
            row_head_ns: b.row_head_ns / self.hbm,
            dq: self.block_times(&b.dq),
            dkdv: self.block_times(&b.dkdv),
            reduce_ps_per_byte: b.reduce_ps_per_byte / self.hbm,
            sms: self.sms,
            ..*b
        }
    }

    /// A whole-launch attention table on the GPU (a rate of the whole GPU).
    pub fn table(&self, t: &EffTable) -> EffTable {
        t.scaled(self.peak)
    }

    /// The elementwise kinds at the GPU's HBM rate, their call terms kept.
    pub fn elementwise(&self, e: &ElementwiseModel) -> ElementwiseModel {
        let mut e = e.clone();
        for k in &mut e.kinds {
            k.bytes_per_s *= self.hbm;
        }
        e
    }

    /// The launch and copy terms: copies at the GPU's HBM rate, launch terms kept.
    pub fn launch(&self, l: &LaunchCosts) -> LaunchCosts {
        LaunchCosts {
            copy_bytes_per_s: l.copy_bytes_per_s * self.hbm,
            ..l.clone()
        }
    }
}

impl CostModel {
    /// The same model priced on `gpu`: on the reference GPU (the H200) itself, unchanged;
    /// else every measured model derived by [`Scaling`] (the module doc) and the
    /// datasheet figures (BF16 peak, HBM bandwidth and capacity) taken from `gpu`.
    pub fn for_gpu(&self, gpu: &Gpu) -> Result<CostModel> {
        if gpu.is_reference() {
            return Ok(self.clone());
        }
        let s = Scaling::between(&Gpu::reference()?, gpu);
        let mut c = self.clone();
        c.hw.peak_tflops = gpu.bf16_tflops;
        c.hw.hbm_bytes_per_s = gpu.hbm_bytes_per_s();
        c.hw.memory_bytes = gpu.memory_bytes();
        c.attn_eff = s.table(&self.attn_eff);
        c.attn_bwd_eff = self.attn_bwd_eff.as_ref().map(|t| s.table(t));
        c.launch = s.launch(&self.launch);
        c.attn_blocks = self.attn_blocks.as_ref().map(|b| s.blocks(b));
        c.attn_bwd_blocks = self.attn_bwd_blocks.as_ref().map(|b| s.bwd_blocks(b));
        c.gemm = self.gemm.as_ref().map(|g| s.gemm(g));
        c.elementwise = self.elementwise.as_ref().map(|e| s.elementwise(e));
        c.launch_memo = blocks::LaunchMemo::default();
        c.derived = Some(s);
        Ok(c)
    }

    /// The same model with the datasheet figures of `gpu` (BF16 peak, HBM bandwidth and
    /// capacity) and its kernels' prices kept: a calibration measured on `gpu` itself.
    pub fn on_measured_gpu(&self, gpu: &Gpu) -> CostModel {
        if gpu.is_reference() {
            return self.clone();
        }
        let mut c = self.clone();
        c.hw.peak_tflops = gpu.bf16_tflops;
        c.hw.hbm_bytes_per_s = gpu.hbm_bytes_per_s();
        c.hw.memory_bytes = gpu.memory_bytes();
        c
    }
}

#[cfg(test)]
mod tests;
