//! Schedules: lower a training step (model, parallelism, micro-batches) to an engine op
//! graph.
//!
//! Owns the parallel layout ([`Parallelism`]: DP × PP × CP, gradient accumulation, GPipe
//! or 1F1B, recomputation, ZeRO stage, gradient buckets), the rank placement
//! ([`Placement`], [`RankMap`]), the seam for runtime variance ([`RuntimeVariance`]) and
//! the Ulysses step builder ([`ulysses`]). Durations come from `cost/` only; time from
//! `engine/` only. It does no I/O.
//!
//! Placement rule: CP innermost (a CP group fills a node before it spans nodes), then DP,
//! then PP outermost, so pipeline stages sit on different nodes whenever DP × CP fills at
//! least a node: `gpu = (pp_idx · DP + dp_idx) · CP + cp_idx`.
//!
//! Architecture invariant: every rank of every replica is simulated; nothing assumes
//! ranks are alike, because per-rank skew is the point.

pub mod compare;
pub mod plan_attn;
pub mod plan_step;
pub mod stage;
pub mod train;
pub mod ulysses;

use serde::{Deserialize, Serialize};

use crate::cluster::VarianceModel;
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parallelism {
    /// Data-parallel replicas.
    pub dp: u32,
    /// Pipeline stages.
    pub pp: u32,
    /// Context-parallel (Ulysses) group size.
    pub cp: u32,
    /// Micro-batches per replica per step (gradient accumulation).
    pub ga: u32,
    /// Pipeline schedule.
    #[serde(default = "default_pipeline")]
    pub pipeline: PipelineKind,
    /// Full activation recomputation in backward.
    #[serde(default)]
    pub recompute: bool,
    /// ZeRO stage 0..=3 over the DP × CP group.
    #[serde(default)]
    pub zero_stage: u8,
    /// Gradient all-reduce buckets: 1 = one all-reduce after the backward; k > 1 = k
    /// buckets, each reduced as soon as the last micro-batch's backward has produced it.
    #[serde(default = "one")]
    pub dp_buckets: u32,
}

fn default_pipeline() -> PipelineKind {
    PipelineKind::OneFOneB
}

fn one() -> u32 {
    1
}

impl Parallelism {
    /// GPUs the layout uses.
    pub fn gpus(&self) -> u64 {
        u64::from(self.dp) * u64::from(self.pp) * u64::from(self.cp)
    }

    /// Check the figures; `ctx` names the file or section.
    pub fn validate(&self, ctx: &str) -> Result<()> {
        for (f, v) in [
            ("dp", self.dp),
            ("pp", self.pp),
            ("cp", self.cp),
            ("ga", self.ga),
            ("dp_buckets", self.dp_buckets),
        ] {
            if v == 0 {
                return Err(invalid(format!("{ctx}: {f}"), v, "a positive integer"));
            }
        }
        if self.ga > u32::from(u16::MAX) - 1 {
            return Err(invalid(format!("{ctx}: ga"), self.ga, "at most 65534"));
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

/// Where each (pp, dp, cp) rank runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankMap {
    /// The layout.
    pub par: Parallelism,
    /// The cluster.
    pub place: Placement,
}

/// A rank's coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Coords {
    /// Pipeline stage.
    pub pp: u32,
    /// Data-parallel replica.
    pub dp: u32,
    /// Position in the CP group.
    pub cp: u32,
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
                format!("{ctx}: dp × pp × cp"),
                par.gpus(),
                format!("at most the cluster's {have} GPUs"),
            ));
        }
        Ok(Self { par, place })
    }

    /// GPUs in use.
    pub fn gpus(&self) -> u32 {
        self.par.gpus() as u32
    }

    /// The GPU of rank (pp, dp, cp).
    pub fn gpu(&self, pp: u32, dp: u32, cp: u32) -> GpuId {
        (pp * self.par.dp + dp) * self.par.cp + cp
    }

    /// The coordinates of `gpu` (which must be < [`RankMap::gpus`]).
    pub fn coords(&self, gpu: GpuId) -> Coords {
        Coords {
            cp: gpu % self.par.cp,
            dp: (gpu / self.par.cp) % self.par.dp,
            pp: gpu / (self.par.cp * self.par.dp),
        }
    }

    /// The placement, for a person: how groups map onto nodes.
    pub fn describe(&self) -> String {
        let p = &self.par;
        let g = self.place.gpus_per_node;
        let span = |n: u32| n.div_ceil(g);
        let mut s = format!(
            "placement: DP {} x PP {} x CP {} = {} GPUs on {} node(s) of {} GPUs (rank order: CP innermost, then DP, then PP)\n",
            p.dp, p.pp, p.cp, self.gpus(), span(self.gpus()), g
        );
        s += &format!(
            "  CP group: {} GPUs, {} (GPUs {}..{} for replica 0, stage 0)\n",
            p.cp,
            if p.cp <= g && g % p.cp == 0 {
                "inside one node".to_string()
            } else {
                format!("across {} nodes", span(p.cp))
            },
            self.gpu(0, 0, 0),
            self.gpu(0, 0, p.cp - 1)
        );
        for pp in 0..p.pp {
            let (a, b) = (self.gpu(pp, 0, 0), self.gpu(pp, p.dp - 1, p.cp - 1));
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
/// [`VarianceModel`](crate::cluster::VarianceModel) below.
pub trait RuntimeVariance {
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
        Parallelism {
            dp,
            pp,
            cp,
            ga: 1,
            pipeline: PipelineKind::OneFOneB,
            recompute: false,
            zero_stage: 0,
            dp_buckets: 1,
        }
    }

    #[test]
    fn cp_fills_a_node_first_and_pp_goes_across_nodes() {
        let m = RankMap::new(par(2, 2, 8), Placement::new(8, 4), "t").unwrap();
        // Replica 0 stage 0 is node 0; replica 1 stage 0 node 1; stage 1 nodes 2 and 3.
        assert_eq!(m.gpu(0, 0, 7), 7);
        assert_eq!(m.gpu(0, 1, 0), 8);
        assert_eq!(m.gpu(1, 0, 0), 16);
        for g in 0..32 {
            let c = m.coords(g);
            assert_eq!(m.gpu(c.pp, c.dp, c.cp), g);
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
    fn layouts_that_do_not_fit_are_rejected() {
        let e = RankMap::new(par(4, 2, 8), Placement::new(8, 4), "x.toml").unwrap_err();
        assert!(e.to_string().contains("32 GPUs"), "{e}");
        assert!(RankMap::new(par(0, 1, 1), Placement::new(8, 1), "x").is_err());
    }
}
