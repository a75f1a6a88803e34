//! The schemes behind one planner: a step's global batch in, a checked-shape
//! [`Plan`] (and, for DistCA with ping-pong, its [`NanoTable`]) out.
//!
//! Owns the choice of settings each scheme gets when compared on one cluster, and nothing
//! else: every plan is made by the scheme's own planner (`ulysses`, `wlbllm` + `lower`,
//! `distca::lower`, `libra` after VRSP grouping). WLB-LLM's latency estimates come from
//! `cost/` ([`CostLatency`]). Stateful only where the scheme is: WLB-LLM's packer carries
//! samples (and outlier queues) from step to step, so steps must be planned in order.
//!
//! # One cluster, one layout
//! Every scheme runs DP replicas × CP ranks with the same GA (Libra pools P replicas).
//! Megatron's dynamic CP pools the DP·CP ranks into CP groups of its own per sample and
//! runs as many micro-batches as its schedule makes (`balance::megatron_dcp`). DistCA keeps the baseline's contiguous CP layout for its linear layers (paper: in-place
//! attention servers) and pools the core attention of all DP·CP GPUs
//! ([`SchemeSettings::layout`]).
//!
//! May not touch the planners' algorithms or the engine; no I/O.

use serde::Serialize;

use super::distca::pingpong::NanoTable;
use super::distca::{self, DistcaConfig, DistcaScheduler};
use super::grouping::{group, Policy};
use super::libra::{self, LibraParams};
use super::megatron_dcp::{self, DcpConfig, DcpLoad, DcpRounds};
use super::pricing::CostLatency;
use super::ulysses::{self, UlyssesParams};
use super::wlbllm::lower::{to_plan, ShardingMode, WlbPlanParams};
use super::wlbllm::{OutlierDelay, WlbConfig, WlbPacker, KERNEL_TILE};
use crate::cost::CostModel;
use crate::error::{invalid, Result};
use crate::plan::Plan;
use crate::workload::PackedSeq;

/// A balancing scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Scheme {
    /// DeepSpeed-Ulysses (the baseline: no balancing across replicas).
    Ulysses,
    /// WLB-LLM: variable-length packing + per-document / adaptive CP sharding.
    WlbLlm,
    /// DistCA: core attention disaggregated over all GPUs.
    DistCa,
    /// Libra: VRSP pools + TAP placement + exchange.
    Libra,
    /// Megatron-Core's dynamic (hybrid DP × CP) context parallelism.
    MegatronDcp,
}

impl Scheme {
    /// All of them, in the order tables print them.
    pub const ALL: [Scheme; 5] = [
        Scheme::Ulysses,
        Scheme::WlbLlm,
        Scheme::DistCa,
        Scheme::Libra,
        Scheme::MegatronDcp,
    ];

    /// The name files and tables use.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Ulysses => "ulysses",
            Scheme::WlbLlm => "wlbllm",
            Scheme::DistCa => "distca",
            Scheme::Libra => "libra",
            Scheme::MegatronDcp => "megatron-dcp",
        }
    }
}

impl std::str::FromStr for Scheme {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> Result<Scheme> {
        Scheme::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                invalid(
                    "scheme",
                    s,
                    "ulysses, wlbllm, distca, libra or megatron-dcp",
                )
            })
    }
}

/// Every scheme's knobs (each uses its own).
#[derive(Clone, Debug, PartialEq)]
pub struct SchemeSettings {
    /// CP ranks per DP replica (Ulysses, WLB-LLM, Libra).
    pub cp: u32,
    /// WLB-LLM's S_max (default 2·L).
    pub s_max: Option<u32>,
    /// WLB-LLM's sharding.
    pub sharding: ShardingMode,
    /// WLB-LLM's outlier-delay thresholds (None: off).
    pub outlier: Option<Vec<u32>>,
    /// DistCA's tolerance ε.
    pub epsilon: f64,
    /// DistCA's ping-pong nano-batches.
    pub ping_pong: bool,
    /// DistCA's scheduler (the repository's by default; `distca:tight`).
    pub distca_scheduler: DistcaScheduler,
    /// Libra's P, H, B, τ, M (its `cp` and `shape` are set from the above and the model).
    pub libra: LibraParams,
    /// Seed of Libra's grouping stream (VRSP does not draw; kept for `random`).
    pub seed: u64,
    /// Megatron dynamic CP's `max_seqlen_per_dp_cp_rank` (None: ⌈L / CP⌉, static CP's
    /// tokens per rank).
    pub max_seqlen_per_rank: Option<u32>,
    /// Megatron dynamic CP's `min_dynamic_context_parallel_size`.
    pub min_dynamic_cp: u32,
    /// Megatron dynamic CP's workload estimate.
    pub dcp_load: DcpLoad,
    /// How far Megatron dynamic CP's rounds grow.
    pub dcp_rounds: DcpRounds,
}

impl Default for SchemeSettings {
    fn default() -> Self {
        SchemeSettings {
            cp: 8,
            s_max: None,
            sharding: ShardingMode::Adaptive,
            outlier: None,
            epsilon: distca::DEFAULT_EPSILON,
            ping_pong: true,
            distca_scheduler: DistcaScheduler::Reference,
            libra: LibraParams::default(),
            seed: 0,
            max_seqlen_per_rank: None,
            min_dynamic_cp: 1,
            dcp_load: DcpLoad::Pairs,
            dcp_rounds: DcpRounds::Open,
        }
    }
}

impl SchemeSettings {
    /// (DP, CP) a scheme runs with on `dp` replicas × `self.cp` ranks: the same for all
    /// four (DistCA's attention pool spans all DP·CP GPUs, its linear layers keep the CP
    /// layout).
    pub fn layout(&self, _scheme: Scheme, dp: u32) -> (u32, u32) {
        (dp, self.cp)
    }

    /// Megatron dynamic CP's settings on `dp` replicas × `self.cp` ranks for sequences of
    /// `seq_len` tokens: S = `max_seqlen_per_rank` or ⌈L / CP⌉.
    pub fn dcp_config(&self, dp: u32, seq_len: u32) -> Result<DcpConfig> {
        let s = self
            .max_seqlen_per_rank
            .unwrap_or(seq_len.div_ceil(self.cp.max(1)));
        Ok(
            DcpConfig::new(dp.saturating_mul(self.cp), s, self.min_dynamic_cp)?
                .with_rounds(self.dcp_rounds),
        )
    }
}

/// One step's plan.
#[derive(Clone, Debug, PartialEq)]
pub struct SchemePlan {
    /// The plan.
    pub plan: Plan,
    /// DistCA's nano-batch table (None for the other schemes).
    pub nano: Option<NanoTable>,
    /// The global batch as the scheme trains it: WLB-LLM's repacked micro-batches (capacity
    /// S_max), the input batch for the others. In GA-major order for the schedule:
    /// `batch[ga · DP + replica]`.
    pub trained: Vec<PackedSeq>,
}

/// Plans successive steps of one scheme.
pub struct SchemePlanner<'a> {
    scheme: Scheme,
    set: SchemeSettings,
    cost: &'a CostModel,
    dp: u32,
    wlb: Option<WlbPacker<CostLatency<'a>>>,
    dcp: Option<DcpConfig>,
}

impl<'a> SchemePlanner<'a> {
    /// A planner for `scheme` on `dp` replicas (× `set.cp` ranks) of `gbs` sequences of
    /// `seq_len` tokens. Errors name the setting that does not fit.
    pub fn new(
        scheme: Scheme,
        set: SchemeSettings,
        cost: &'a CostModel,
        dp: u32,
        gbs: usize,
        seq_len: u32,
    ) -> Result<SchemePlanner<'a>> {
        let (sdp, scp) = set.layout(scheme, dp);
        if sdp == 0 || gbs == 0 || gbs % sdp as usize != 0 {
            return Err(invalid(
                format!("GBS for {}", scheme.name()),
                gbs,
                format!("a positive multiple of its DP = {sdp}"),
            ));
        }
        if scheme == Scheme::Libra {
            // the knobs as given, before `plan` caps P at DP
            LibraParams {
                cp: scp,
                shape: cost.attn(),
                ..set.libra
            }
            .validate()?;
        }
        let wlb = match scheme {
            Scheme::WlbLlm => {
                let s_max = set.s_max.unwrap_or(seq_len.saturating_mul(2));
                let outlier = set.outlier.clone().map(OutlierDelay::new).transpose()?;
                super::wlbllm::CpConfig::new(set.cp, KERNEL_TILE, s_max)?;
                Some(WlbPacker::new(
                    WlbConfig::new(gbs, s_max, outlier)?,
                    CostLatency { cost },
                ))
            }
            _ => None,
        };
        let dcp = match scheme {
            Scheme::MegatronDcp => Some(set.dcp_config(dp, seq_len)?),
            _ => None,
        };
        Ok(SchemePlanner {
            scheme,
            set,
            cost,
            dp,
            wlb,
            dcp,
        })
    }

    /// The scheme it plans.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// DistCA's plan of `step` under `pp` pipeline stages: one group per tick over every
    /// GPU ([`distca::ticks::plan_ticks`]). Errors for the other schemes.
    pub fn plan_ticks(&mut self, step: u64, batch: &[PackedSeq], pp: u32) -> Result<SchemePlan> {
        if self.scheme != Scheme::DistCa {
            return Err(invalid(
                "pipeline for ".to_string() + self.scheme.name(),
                "ticks",
                "gpipe or 1f1b (ticks are DistCA's)",
            ));
        }
        let s = &self.set;
        let (dp, cp) = s.layout(self.scheme, self.dp);
        let cfg = DistcaConfig::new(self.cost.attn(), s.epsilon, KERNEL_TILE)?
            .with_scheduler(s.distca_scheduler);
        let d = distca::ticks::plan_ticks(step, batch, dp, cp, pp, &cfg, s.ping_pong)?;
        Ok(SchemePlan {
            plan: d.plan,
            nano: Some(d.nano),
            trained: batch.to_vec(),
        })
    }

    /// The plan of `step` for its global batch (steps in order for WLB-LLM).
    pub fn plan(&mut self, step: u64, batch: &[PackedSeq]) -> Result<SchemePlan> {
        let shape = self.cost.attn();
        let s = &self.set;
        let (dp, cp) = s.layout(self.scheme, self.dp);
        Ok(match self.scheme {
            Scheme::Ulysses => {
                let p = UlyssesParams { cp, shape };
                p.validate()?;
                SchemePlan {
                    plan: ulysses::plan_step(step, batch, dp, &p)?,
                    nano: None,
                    trained: batch.to_vec(),
                }
            }
            Scheme::Libra => {
                // a pool cannot hold more replicas than there are: P is capped at DP
                let p = LibraParams {
                    cp,
                    shape,
                    pool_size: s.libra.pool_size.min(dp),
                    ..s.libra
                };
                p.validate()?;
                let loads: Vec<u64> = batch.iter().map(|s| s.load_under(&p.shape.mask)).collect();
                let mut rng = crate::rng::stream(s.seed, "libra-grouping", step);
                let pools = group(&loads, p.pool_size as usize, Policy::Vrsp, &mut rng)?;
                SchemePlan {
                    plan: libra::plan_step(step, batch, &pools, dp, &p)?,
                    nano: None,
                    trained: batch.to_vec(),
                }
            }
            Scheme::DistCa => {
                let cfg = DistcaConfig::new(shape, s.epsilon, KERNEL_TILE)?
                    .with_scheduler(s.distca_scheduler);
                let d = distca::lower::plan_step_cp(step, batch, dp, cp, &cfg, s.ping_pong)?;
                SchemePlan {
                    plan: d.plan,
                    nano: Some(d.nano),
                    trained: batch.to_vec(),
                }
            }
            Scheme::MegatronDcp => {
                let Some(cfg) = self.dcp.as_ref() else {
                    return Err(invalid(
                        "megatron-dcp settings",
                        "missing",
                        "built by new()",
                    ));
                };
                let model = CostLatency { cost: self.cost };
                let work = megatron_dcp::sample_work(s.dcp_load, &model);
                let sched = megatron_dcp::schedule(batch, cfg, work)?;
                SchemePlan {
                    plan: megatron_dcp::to_plan(step, &sched, cfg, &shape),
                    nano: None,
                    trained: batch.to_vec(),
                }
            }
            Scheme::WlbLlm => {
                let Some(packer) = self.wlb.as_mut() else {
                    return Err(invalid("wlbllm packer", "missing", "built by new()"));
                };
                let s_max = packer.config().s_max;
                let out = packer.step(batch)?;
                let p = WlbPlanParams {
                    dp,
                    cp,
                    tile: KERNEL_TILE,
                    s_max,
                    sharding: s.sharding,
                    shape,
                };
                let mut plan = to_plan(&out, &p, &CostLatency { cost: self.cost })?.plan;
                plan.step = step;
                SchemePlan {
                    plan,
                    nano: None,
                    trained: out
                        .micro_batches
                        .iter()
                        .map(|m| m.to_packed(s_max))
                        .collect(),
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::ModelConfig;
    use crate::plan::check;
    use crate::workload::corpus::Corpus;
    use crate::workload::pack::{global_batch, Packing};

    #[test]
    fn every_scheme_plans_a_checked_step_with_the_exact_flops() {
        let cost = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
        let corpus = Corpus::from_spec("wlbllm").unwrap();
        let batch = global_batch(&corpus, 32_768, 16, Packing::Sequential, 5, 0).unwrap();
        let set = SchemeSettings {
            cp: 4,
            libra: LibraParams {
                pool_size: 2,
                head_shards: 4,
                chunks: 2,
                tile_tokens: 4096,
                ..LibraParams::default()
            },
            ..SchemeSettings::default()
        };
        let exact: u64 = batch.iter().map(PackedSeq::causal_pairs).sum();
        let want = cost.attn().fwd_flops(exact, 32);
        for sc in Scheme::ALL {
            let mut p = SchemePlanner::new(sc, set.clone(), &cost, 4, 16, 32_768).unwrap();
            let sp = p.plan(0, &batch).unwrap();
            let s = check(&sp.plan).unwrap();
            assert!((s.flops - want).abs() <= 1e-9 * want, "{sc:?}");
            assert_eq!(sp.plan.scheme, sc.name());
            assert_eq!(sp.nano.is_some(), sc == Scheme::DistCa);
            assert_eq!(sp.trained.len(), 16);
            let workers: u32 = sp
                .plan
                .groups
                .iter()
                .flat_map(|g| &g.workers)
                .copied()
                .max()
                .unwrap();
            assert_eq!(workers, 15, "{sc:?} uses all 16 GPUs");
        }
        assert!("x"
            .parse::<Scheme>()
            .unwrap_err()
            .to_string()
            .contains("libra"));
        // Every scheme under masks: an all-sliding model's plan counts the window's pairs
        // and passes the checker; a causal plan narrowed to a window (a mixed model's
        // sliding layers) passes it under the window, with no more bytes.
        let window = crate::cost::Mask::Sliding { w: 2048 };
        let swa = cost.for_mask(window);
        let exact: u64 = batch.iter().map(|s| s.pairs(&window)).sum();
        let want = swa.attn().fwd_flops(exact, 32);
        for sc in Scheme::ALL {
            let mut p = SchemePlanner::new(sc, set.clone(), &swa, 4, 16, 32_768).unwrap();
            let sp = p.plan(0, &batch).unwrap();
            assert_eq!(sp.plan.shape.mask, window);
            let s = check(&sp.plan).unwrap();
            assert!((s.flops - want).abs() <= 1e-9 * want, "{sc:?}");
            let mut p = SchemePlanner::new(sc, set.clone(), &cost, 4, 16, 32_768).unwrap();
            let causal = p.plan(0, &batch).unwrap().plan;
            let narrowed = crate::plan::build::narrow(&causal, window);
            let n = check(&narrowed).unwrap_or_else(|v| panic!("{sc:?}: {v}"));
            assert!((n.flops - want).abs() <= 1e-9 * want, "{sc:?}");
            assert!(n.bytes <= check(&causal).unwrap().bytes, "{sc:?}");
        }
        let e = SchemePlanner::new(Scheme::DistCa, set, &cost, 4, 6, 32_768);
        assert!(e
            .err()
            .unwrap()
            .to_string()
            .contains("multiple of its DP = 4"));
    }

    /// Libra's knobs are refused as given, before a step caps P at DP.
    #[test]
    fn libra_knobs_out_of_range_are_refused_by_name() {
        let cost = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
        let ok = SchemeSettings {
            cp: 2,
            libra: LibraParams {
                pool_size: 2,
                ..LibraParams::default()
            },
            ..SchemeSettings::default()
        };
        for (libra, field) in [
            (
                LibraParams {
                    pool_size: 0,
                    ..ok.libra
                },
                "P (pool size)",
            ),
            (
                LibraParams {
                    pool_size: u32::MAX,
                    ..ok.libra
                },
                "P × CP (workers per pool)",
            ),
            (
                LibraParams {
                    tile_tokens: u32::MAX,
                    ..ok.libra
                },
                "B (tile tokens)",
            ),
            (
                LibraParams {
                    tau: f64::NAN,
                    ..ok.libra
                },
                "tau",
            ),
        ] {
            let set = SchemeSettings {
                libra,
                ..ok.clone()
            };
            let e = SchemePlanner::new(Scheme::Libra, set, &cost, 4, 16, 32_768).err();
            assert!(
                matches!(e, Some(crate::Error::Invalid { field: ref f, .. }) if f == field),
                "{field}: {e:?}"
            );
        }
        assert!(SchemePlanner::new(Scheme::Libra, ok, &cost, 4, 16, 32_768).is_ok());
    }
}
