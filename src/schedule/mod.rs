//! Schedules: lower a training step (model, parallelism, micro-batches) to an engine op
//! graph.
//!
//! Owns the parallel layout ([`Parallelism`]: TP × CP × DP × PP and EP, gradient
//! accumulation, GPipe or 1F1B, recomputation, ZeRO stage, gradient buckets), the rank
//! placement ([`Placement`], [`RankMap`]), the seam for runtime variance
//! ([`RuntimeVariance`]) and the step builder ([`step`]). Durations come from `cost/`
//! only; time from `engine/` only. It does no I/O.
//!
//! Placement rule (Megatron-Core's order): TP innermost (a TP group sits inside one NVLink
//! domain), then CP (a CP group fills a node before it spans nodes), then DP, then PP
//! outermost, so pipeline stages sit on different nodes whenever TP × CP × DP fills at
//! least a node: `gpu = ((pp_idx · DP + dp_idx) · CP + cp_idx) · TP + tp_idx`. EP groups
//! (MoE layers) are EP consecutive ranks of that order (Megatron-Core's MoE parallel
//! folding with expert tensor parallelism 1): they span TP first, then CP, then DP.
//!
//! Architecture invariant: every rank of every replica is simulated; nothing assumes
//! ranks are alike, because per-rank skew is the point.

pub mod compare;
pub mod pipeline;
pub mod plan_attn;
pub mod plan_step;
pub mod stage;
pub mod step;
pub mod train;
pub mod ulysses;

use serde::{Deserialize, Serialize};

use crate::cluster::VarianceModel;
pub use crate::cost::gpu::Precision;
pub use crate::cost::memory::Recompute;
use crate::engine::OpClass;
use crate::error::{invalid, Result};
use crate::net::collective::CollectiveModel;
use crate::net::GpuId;

/// The pipeline schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PipelineKind {
    /// All forwards, then all backwards.
    Gpipe,
    /// One forward, one backward (PipeDream-flush / Megatron non-interleaved).
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// DistCA's ticks (`balance::distca::pingpong::pp_ticks`): in every tick all stages run
    /// the same phase, layer j of every stage together, so a pooled attention stage can
    /// balance core attention across stages and idle warm-up/drain stages serve it.
    #[serde(rename = "ticks")]
    Ticks,
}

/// How a step is parallelised.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parallelism {
    /// Data-parallel replicas.
    pub dp: u32,
    /// Pipeline stages.
    pub pp: u32,
    /// Context-parallel (Ulysses) group size.
    pub cp: u32,
    /// Tensor-parallel group size (Megatron-style column/row-parallel linear layers; each
    /// rank holds h_q/TP query heads).
    #[serde(default = "one")]
    pub tp: u32,
    /// Sequence parallelism with TP > 1: norms run on L/TP tokens, an all-gather before and
    /// a reduce-scatter after each attention and MLP block (else two all-reduces).
    #[serde(default = "yes")]
    pub sp: bool,
    /// Overlap TP communication with the GEMMs beside it (Megatron's tp-comm-overlap).
    #[serde(default)]
    pub tp_overlap: bool,
    /// Expert-parallel group size (MoE models): each rank holds experts/EP experts; tokens
    /// reach them through a dispatch and a combine all-to-all.
    #[serde(default = "one")]
    pub ep: u32,
    /// MoE routing skew: the share of each MoE layer's routed token copies that go to its
    /// hottest expert (expert 0, on the first rank of every EP group); the others share the
    /// rest evenly. 0 = uniform routing.
    #[serde(default)]
    pub moe_hot_share: f64,
    /// Micro-batches per replica per step (gradient accumulation).
    pub ga: u32,
    /// Pipeline schedule.
    #[serde(default = "default_pipeline")]
    pub pipeline: PipelineKind,
    /// Virtual pipeline stages per stage (Megatron's interleaved 1F1B with `vp` model
    /// chunks per GPU, [`pipeline`]); 1 = one contiguous chunk per stage.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub vp: u32,
    /// The input embedding takes one layer's place in the first virtual stage (Megatron's
    /// `--account-for-embedding-in-pipeline-split`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub account_for_embedding: bool,
    /// The LM head and loss take one layer's place in the last virtual stage (Megatron's
    /// `--account-for-loss-in-pipeline-split`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub account_for_loss: bool,
    /// Activation recomputation in backward: none, selective (core attention) or full.
    #[serde(default)]
    pub recompute: Recompute,
    /// The linear layers' number format (attention stays BF16).
    #[serde(default, skip_serializing_if = "Precision::is_bf16")]
    pub precision: Precision,
    /// ZeRO stage 0..=3 over the DP × CP group.
    #[serde(default)]
    pub zero_stage: u8,
    /// Gradient all-reduce buckets: 1 = one all-reduce after the backward; k > 1 = k
    /// buckets, each reduced as soon as the last micro-batch's backward has produced it.
    #[serde(default = "one")]
    pub dp_buckets: u32,
    /// Megatron's distributed optimizer: optimizer states sharded over DP × CP (as ZeRO 1,
    /// which it implies), gradients reduce-scattered and the updated BF16 parameters
    /// all-gathered, bucket by bucket, instead of one all-reduce.
    #[serde(default, skip_serializing_if = "is_false")]
    pub distributed_optimizer: bool,
    /// With the distributed optimizer: each bucket's parameter all-gather runs at the start
    /// of the step, and the first forward through the bucket's layers waits for it
    /// (Megatron's `--overlap-param-gather`); without it the gathers follow the
    /// reduce-scatters at the end of the step.
    #[serde(default, skip_serializing_if = "is_false")]
    pub overlap_param_gather: bool,
    /// Gradients accumulated and reduced in fp32 (Megatron's `grad_reduce_in_fp32`); false:
    /// in the parameters' BF16, as NeMo's and Megatron-Bridge's performance recipes run.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub grad_reduce_in_fp32: bool,
}

impl Default for Parallelism {
    /// One GPU, one micro-batch: every degree 1, every option off.
    fn default() -> Self {
        Parallelism::plain(1, 1, 1, 1)
    }
}

/// Most gradient all-reduce buckets (`dp_buckets`): past the model's layers they add none.
pub const MAX_DP_BUCKETS: u32 = 1 << 10;

fn default_pipeline() -> PipelineKind {
    PipelineKind::OneFOneB
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

fn is_false(v: &bool) -> bool {
    !*v
}

fn is_true(v: &bool) -> bool {
    *v
}

impl Parallelism {
    /// GPUs the layout uses.
    pub fn gpus(&self) -> u64 {
        u64::from(self.dp) * u64::from(self.pp) * u64::from(self.cp) * u64::from(self.tp)
    }

    /// The layout without tensor or expert parallelism: what a step is when every rank is
    /// one GPU holding every head.
    pub fn plain(dp: u32, pp: u32, cp: u32, ga: u32) -> Self {
        Parallelism {
            dp,
            pp,
            cp,
            tp: 1,
            sp: true,
            tp_overlap: false,
            ep: 1,
            moe_hot_share: 0.0,
            ga,
            pipeline: PipelineKind::OneFOneB,
            vp: 1,
            account_for_embedding: false,
            account_for_loss: false,
            recompute: Recompute::None,
            precision: Precision::Bf16,
            zero_stage: 0,
            dp_buckets: 1,
            distributed_optimizer: false,
            overlap_param_gather: false,
            grad_reduce_in_fp32: true,
        }
    }

    /// The distributed optimizer gathers parameters at the start of the step, overlapped
    /// with the forward.
    pub fn gathers_params_early(&self) -> bool {
        self.distributed_optimizer && self.overlap_param_gather
    }

    /// Bytes per parameter of the gradients a rank holds and reduces.
    pub fn grad_bytes_per_param(&self) -> u64 {
        crate::cost::memory::grad_bytes_per_param(self.grad_reduce_in_fp32)
    }

    /// Check the figures; `ctx` names the file or section.
    pub fn validate(&self, ctx: &str) -> Result<()> {
        for (f, v) in [
            ("dp", self.dp),
            ("pp", self.pp),
            ("cp", self.cp),
            ("tp", self.tp),
            ("ep", self.ep),
            ("ga", self.ga),
            ("dp_buckets", self.dp_buckets),
        ] {
            if v == 0 {
                return Err(invalid(format!("{ctx}: {f}"), v, "a positive integer"));
            }
        }
        if self.dp_buckets > MAX_DP_BUCKETS {
            return Err(invalid(
                format!("{ctx}: dp_buckets"),
                self.dp_buckets,
                format!("at most {MAX_DP_BUCKETS} (a bucket holds one layer or more)"),
            ));
        }
        if self.ga > u32::from(u16::MAX) - 1 {
            return Err(invalid(format!("{ctx}: ga"), self.ga, "at most 65534"));
        }
        if self.ep > 1 {
            let span = u64::from(self.tp) * u64::from(self.cp) * u64::from(self.dp);
            if span % u64::from(self.ep) != 0 {
                return Err(invalid(
                    format!("{ctx}: ep"),
                    self.ep,
                    format!(
                        "a divisor of TP × CP × DP = {span} (EP groups fold over the \
                         tensor-, context- and data-parallel ranks of one stage)"
                    ),
                ));
            }
        }
        if self.overlap_param_gather && !self.distributed_optimizer {
            return Err(invalid(
                format!("{ctx}: overlap_param_gather"),
                true,
                "false unless distributed_optimizer = true (the gathers are the distributed optimizer's)",
            ));
        }
        if self.zero_stage > 3 {
            return Err(invalid(
                format!("{ctx}: zero_stage"),
                self.zero_stage,
                "0, 1, 2 or 3",
            ));
        }
        Ok(())
    }
}

/// The cluster as far as placement needs it: GPUs per node and node count (GPU ids are
/// node-major, as in `net::GpuId`), and how NCCL runs collectives on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// GPUs in one node.
    pub gpus_per_node: u32,
    /// Nodes.
    pub nodes: u32,
    /// NCCL's algorithm choice and latency on this cluster (default: no fabric known, rings
    /// with no latency of their own); set from the topology with
    /// [`Placement::with_collectives`].
    #[serde(skip)]
    pub coll: CollectiveModel,
}

impl Placement {
    /// `nodes` nodes of `gpus_per_node` GPUs, no fabric known.
    pub fn new(gpus_per_node: u32, nodes: u32) -> Self {
        Self {
            gpus_per_node,
            nodes,
            coll: CollectiveModel::default(),
        }
    }

    /// The same cluster whose collectives run as `coll` says.
    pub fn with_collectives(self, coll: CollectiveModel) -> Self {
        Self { coll, ..self }
    }

    /// The node of `gpu`.
    pub fn node(&self, gpu: GpuId) -> u32 {
        gpu / self.gpus_per_node.max(1)
    }
}

/// Where each (pp, dp, cp, tp) rank runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankMap {
    /// The layout.
    pub par: Parallelism,
    /// The cluster.
    pub place: Placement,
}

/// A rank's coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coords {
    /// Pipeline stage.
    pub pp: u32,
    /// Data-parallel replica.
    pub dp: u32,
    /// Position in the CP group.
    pub cp: u32,
    /// Position in the TP group.
    pub tp: u32,
}

impl RankMap {
    /// Check that the layout fits the cluster.
    pub fn new(par: Parallelism, place: Placement, ctx: &str) -> Result<Self> {
        par.validate(ctx)?;
        if place.gpus_per_node == 0 || place.nodes == 0 {
            return Err(invalid(
                format!("{ctx}: cluster"),
                format!("{} GPUs/node × {} nodes", place.gpus_per_node, place.nodes),
                "positive GPUs per node and nodes",
            ));
        }
        let have = u64::from(place.gpus_per_node) * u64::from(place.nodes);
        if par.gpus() > have || par.gpus() > u64::from(u32::MAX / 8) {
            return Err(invalid(
                format!("{ctx}: tp × cp × dp × pp"),
                par.gpus(),
                format!("at most the cluster's {have} GPUs"),
            ));
        }
        // A node, or a multi-node NVLink domain (NVL72) when the fabric is known.
        let domain = place
            .coll
            .domain_gpus()
            .map_or(place.gpus_per_node, |d| d.max(place.gpus_per_node));
        if par.tp > domain || domain % par.tp != 0 {
            return Err(invalid(
                format!("{ctx}: tp"),
                par.tp,
                format!(
                    "a divisor of the {domain} GPUs of one NVLink domain (a TP group must sit \
                     inside one)"
                ),
            ));
        }
        Ok(Self { par, place })
    }

    /// GPUs in use.
    pub fn gpus(&self) -> u32 {
        self.par.gpus() as u32
    }

    /// Streams per GPU: compute, CP, PP and DP communication, plus a TP/EP communication
    /// stream when the layout has tensor or expert parallelism.
    pub fn streams_per_gpu(&self) -> u32 {
        if self.par.tp > 1 || self.par.ep > 1 {
            5
        } else {
            4
        }
    }

    /// The GPU of rank (pp, dp, cp, tp).
    pub fn gpu(&self, pp: u32, dp: u32, cp: u32, tp: u32) -> GpuId {
        ((pp * self.par.dp + dp) * self.par.cp + cp) * self.par.tp + tp
    }

    /// The coordinates of `gpu` (which must be < [`RankMap::gpus`]).
    pub fn coords(&self, gpu: GpuId) -> Coords {
        let r = gpu / self.par.tp;
        Coords {
            tp: gpu % self.par.tp,
            cp: r % self.par.cp,
            dp: (r / self.par.cp) % self.par.dp,
            pp: r / (self.par.cp * self.par.dp),
        }
    }

    /// The placement, for a person: how groups map onto nodes.
    pub fn describe(&self) -> String {
        let p = &self.par;
        let g = self.place.gpus_per_node;
        let span = |n: u32| n.div_ceil(g);
        let mut s = if p.tp == 1 {
            format!(
                "placement: DP {} x PP {} x CP {} = {} GPUs on {} node(s) of {} GPUs (rank order: CP innermost, then DP, then PP)\n",
                p.dp, p.pp, p.cp, self.gpus(), span(self.gpus()), g
            )
        } else {
            format!(
                "placement: TP {} x CP {} x DP {} x PP {} = {} GPUs on {} node(s) of {} GPUs (rank order: TP innermost, then CP, then DP, then PP)\n",
                p.tp, p.cp, p.dp, p.pp, self.gpus(), span(self.gpus()), g
            )
        };
        let cp_span = p.cp * p.tp;
        s += &format!(
            "  CP group: {} GPUs, {} (GPUs {}..{} for replica 0, stage 0)\n",
            p.cp,
            if cp_span <= g && g % cp_span == 0 {
                "inside one node".to_string()
            } else {
                format!("across {} nodes", span(cp_span))
            },
            self.gpu(0, 0, 0, 0),
            self.gpu(0, 0, p.cp - 1, 0)
        );
        for pp in 0..p.pp {
            let (a, b) = (
                self.gpu(pp, 0, 0, 0),
                self.gpu(pp, p.dp - 1, p.cp - 1, p.tp - 1),
            );
            s += &format!(
                "  PP stage {pp}: GPUs {a}..{b} on nodes {}..{}\n",
                self.place.node(a),
                self.place.node(b)
            );
        }
        s
    }
}

/// The seam for runtime variance: a multiplicative factor on every kernel's duration,
/// `kernel_factor × persistent_factor`. Implemented for the cluster's
/// [`VarianceModel`] below.
pub trait RuntimeVariance: Sync {
    /// Transient factor of one kernel (1.0 = nominal): op `op` of micro-batch `mb` in layer
    /// `layer` at step `step` on `gpu`. Layer index `layers` stands for the block after the
    /// last layer (final norm, LM head).
    fn kernel_factor(&self, gpu: GpuId, step: u64, layer: u32, op: OpClass, mb: u32) -> f64;
    /// Persistent factor of one GPU (1.0 = nominal).
    fn persistent_factor(&self, gpu: GpuId) -> f64;
}

/// No variance: every kernel takes its cost-model time.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoVariance;

impl RuntimeVariance for NoVariance {
    fn kernel_factor(&self, _: GpuId, _: u64, _: u32, _: OpClass, _: u32) -> f64 {
        1.0
    }
    fn persistent_factor(&self, _: GpuId) -> f64 {
        1.0
    }
}

/// The cluster's variance: per-kernel jitter and spikes drawn from (seed, gpu, step, layer,
/// op) with op = class + 256 · micro-batch, times any injected GPU slowdown at that step;
/// the persistent factor per GPU.
impl RuntimeVariance for VarianceModel {
    fn kernel_factor(&self, gpu: GpuId, step: u64, layer: u32, op: OpClass, mb: u32) -> f64 {
        let key = op as u64 | (u64::from(mb) << 8);
        VarianceModel::kernel_factor(self, gpu, step, layer, key)
            * self.faults().gpu_factor(gpu, step)
    }
    fn persistent_factor(&self, gpu: GpuId) -> f64 {
        VarianceModel::persistent_factor(self, gpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn par(dp: u32, pp: u32, cp: u32) -> Parallelism {
        Parallelism::plain(dp, pp, cp, 1)
    }

    #[test]
    fn cp_fills_a_node_first_and_pp_goes_across_nodes() {
        let m = RankMap::new(par(2, 2, 8), Placement::new(8, 4), "t").unwrap();
        // Replica 0 stage 0 is node 0; replica 1 stage 0 node 1; stage 1 nodes 2 and 3.
        assert_eq!(m.gpu(0, 0, 7, 0), 7);
        assert_eq!(m.gpu(0, 1, 0, 0), 8);
        assert_eq!(m.gpu(1, 0, 0, 0), 16);
        for g in 0..32 {
            let c = m.coords(g);
            assert_eq!(m.gpu(c.pp, c.dp, c.cp, c.tp), g);
        }
        let d = m.describe();
        assert!(
            d.contains("inside one node") && d.contains("PP stage 1: GPUs 16..31 on nodes 2..3"),
            "{d}"
        );
        let m16 = RankMap::new(par(1, 1, 16), Placement::new(8, 2), "t").unwrap();
        assert!(m16.describe().contains("across 2 nodes"));
    }

    #[test]
    fn tp_is_innermost_then_cp_then_dp_then_pp() {
        let par = Parallelism {
            tp: 8,
            ..Parallelism::plain(2, 2, 2, 1)
        };
        let place = Placement::new(8, 8);
        let m = RankMap::new(par, place, "t").unwrap();
        assert_eq!(m.gpus(), 64);
        // A TP group is one node; CP rank 1 is the next node; replica 1 two nodes on.
        assert_eq!(m.gpu(0, 0, 0, 7), 7);
        assert_eq!(m.gpu(0, 0, 1, 0), 8);
        assert_eq!(m.gpu(0, 1, 0, 0), 16);
        assert_eq!(m.gpu(1, 0, 0, 0), 32);
        for g in 0..64 {
            let c = m.coords(g);
            assert_eq!(m.gpu(c.pp, c.dp, c.cp, c.tp), g);
            assert_eq!(place.node(g), g / 8);
        }
        let e = RankMap::new(
            Parallelism {
                tp: 16,
                ..Parallelism::plain(1, 1, 1, 1)
            },
            Placement::new(8, 2),
            "x.toml",
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("x.toml: tp") && msg.contains("NVLink domain"),
            "{msg}"
        );
        let e = Parallelism {
            tp: 2,
            ep: 3,
            ..Parallelism::plain(2, 1, 1, 1)
        }
        .validate("y")
        .unwrap_err();
        assert!(e.to_string().contains("y: ep"), "{e}");
    }

    /// On GB200 NVL72 (4-GPU nodes, 72-GPU NVLink domains) a TP group may span nodes of one
    /// rack; without the fabric, or past the domain, it is refused by name.
    #[test]
    fn tp_fits_a_multi_node_nvlink_domain() {
        use crate::cluster::TopologySpec;
        use crate::net::collective::CollectiveModel;
        let spec = TopologySpec::parse(
            include_str!("../../topologies/gb200-nvl72.toml"),
            "gb200-nvl72",
        )
        .unwrap();
        let t = spec.build(Some(18)).unwrap();
        let rack = Placement::new(4, 18).with_collectives(CollectiveModel::of(&t, true));
        let tp = |n| Parallelism {
            tp: n,
            ..par(1, 1, 2)
        };
        assert!(RankMap::new(tp(8), rack, "t").is_ok());
        let e = RankMap::new(tp(16), rack, "t").unwrap_err().to_string();
        assert!(
            e.contains("tp") && e.contains("72 GPUs of one NVLink domain"),
            "{e}"
        );
        let e = RankMap::new(tp(8), Placement::new(4, 18), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("4 GPUs of one NVLink domain"), "{e}");
    }

    #[test]
    fn layouts_that_do_not_fit_are_rejected() {
        let e = RankMap::new(par(4, 2, 8), Placement::new(8, 4), "x.toml").unwrap_err();
        assert!(e.to_string().contains("32 GPUs"), "{e}");
        assert!(RankMap::new(par(0, 1, 1), Placement::new(8, 1), "x").is_err());
    }
}
