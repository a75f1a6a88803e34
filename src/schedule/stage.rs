//! The pluggable attention stage of a training step.
//!
//! Owns the [`AttentionStage`] seam: the step builder ([`super::step::build_step_with`])
//! emits every linear block, the pipeline sends, gradient accumulation and the DP
//! all-reduce itself and hands each (stage, layer, micro-batch, direction)'s core
//! attention to a stage, which appends ops on the GPUs' compute and CP-communication
//! streams. Ulysses' all-to-all attention is one stage ([`super::ulysses`]); a [`Plan`]
//! lowered by [`super::plan_attn`] is the other, so any scheme that writes a Plan
//! (Libra, WLB-LLM, DistCA) runs inside the same step.
//!
//! It may not price work (that is `cost/`) or run the graph (that is `engine/`).
//!
//! [`Plan`]: crate::plan::Plan

use super::{RankMap, RuntimeVariance};
use crate::engine::{GraphBuilder, OpClass, OpId, StreamId, StreamKind};
use crate::error::Result;
use crate::net::{GpuId, Ps};

/// What every stage call may read: the rank layout, the variance seam and the step.
#[derive(Clone, Copy)]
pub struct StepEnv<'a> {
    /// The rank layout.
    pub map: RankMap,
    /// Runtime variance of kernels.
    pub var: &'a dyn RuntimeVariance,
    /// The training step (for variance draws).
    pub step: u64,
}

impl StepEnv<'_> {
    /// The stream of `kind` on `gpu` (the step builder makes
    /// [`RankMap::streams_per_gpu`] per GPU, in [`StreamKind`] order).
    pub fn stream(&self, gpu: GpuId, kind: StreamKind) -> StreamId {
        self.map.streams_per_gpu() * gpu + kind as u32
    }

    /// `base` under the kernel's variance factor (the same draw as the step builder's).
    pub fn vary(&self, gpu: GpuId, layer: u32, class: OpClass, mb: u32, base: Ps) -> Ps {
        let f = self.var.kernel_factor(gpu, self.step, layer, class, mb)
            * self.var.persistent_factor(gpu);
        if f == 1.0 {
            base
        } else {
            (base as f64 * f.max(0.0)).round() as Ps
        }
    }
}

/// One call: a layer's core attention for one micro-batch on one pipeline stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnCall {
    /// Pipeline stage.
    pub stage: u32,
    /// Layer index.
    pub layer: u32,
    /// Micro-batch (GA index).
    pub mb: u32,
    /// For a [`AttentionStage::per_replica`] stage, the one replica (DP index) to emit;
    /// otherwise `None`: every replica.
    pub replica: Option<u32>,
    /// Forward (true) or backward (false).
    pub fwd: bool,
    /// Full recomputation: the backward also re-runs the forward attention kernel.
    pub recompute: bool,
}

/// A layer's core attention as graph ops.
pub trait AttentionStage {
    /// Nano-batches per micro-batch (DistCA's ping-pong: 2; default 1). With n > 1 the step
    /// builder cuts every linear block of a rank into n ops of equal token shares (nano-batch
    /// 0's first, on the same compute stream) and `last` holds n entries per rank.
    fn nanos(&self) -> u32 {
        1
    }

    /// Pooled across pipeline stages (DistCA's ticks): under `PipelineKind::Ticks` the step
    /// builder then calls [`Self::emit`] once per (tick, layer j of every stage) with
    /// `call.mb` = the tick, `call.layer` = j, `call.stage` = 0, and `last` spanning all
    /// stages: `last[(stage · nanos + k) · W + (replica · CP + cp_rank) · TP + tp_rank]`.
    /// Default: one call per stage.
    fn pooled(&self) -> bool {
        false
    }

    /// Per replica: a replica's attention involves only its own GPUs (Ulysses' CP
    /// groups). The step builder then calls [`Self::emit`] once per replica, right after
    /// that replica's linear block, with `call.replica` set; the indices of `last` are
    /// unchanged. A per-replica stage is not [`Self::pooled`]. Default: one call for every
    /// replica.
    fn per_replica(&self) -> bool {
        false
    }

    /// Append the attention of `call` to `b`. `last[k · W + (replica · CP + cp_rank) · TP +
    /// tp_rank]` (W = DP · CP · TP, k < [`Self::nanos`]; the GPU's offset in its stage) is
    /// the last op of nano-batch k of that rank of the stage (the linear block that produced Q/K/V, or in backward the one that produced
    /// dO); on return it must be the op nano-batch k's next linear block waits for.
    fn emit(
        &mut self,
        b: &mut GraphBuilder,
        env: &StepEnv<'_>,
        call: AttnCall,
        last: &mut [OpId],
    ) -> Result<()>;
}
