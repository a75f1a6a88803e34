//! A training step whose core attention follows a [`Plan`]: the Ulysses step builder's
//! linear blocks, pipeline, GA and DP all-reduce with [`PlanAttention`] plugged in, and
//! the Libra variants the experiments compare (TAP on loader-order pools, TAP on VRSP
//! pools, and TAP + VRSP + the pipeliner).
//!
//! Owns mapping a Plan's sequences to (replica, micro-batch) slots and choosing Libra's
//! pools for a step. It may not plan (that is `balance/`), price (`cost/`) or time
//! (`engine/`).

use super::plan_attn::{Overlap, PlanAttention};
use super::step::{build_step, build_step_with, StepGraph};
use super::train::split_replicas;
use super::{RankMap, RuntimeVariance};
use crate::balance::grouping::vrsp;
use crate::balance::libra::{consecutive_pools, plan_step as libra_plan, step_shape, LibraParams};
use crate::balance::schemes::Scheme;
use crate::cost::CostModel;
use crate::engine::{run, Timeline};
use crate::error::{invalid, Result};
use crate::net::NetworkModel;
use crate::plan::Plan;
use crate::workload::PackedSeq;

/// Which attention a step runs: one [`Scheme`]'s (Ulysses or Libra) and, for Libra,
/// its settings and which of its parts run (the ablations `train` compares).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StepAttention {
    /// DeepSpeed-Ulysses' all-to-alls (the step builder's own attention).
    Ulysses,
    /// Libra's TAP on pools of P consecutive sequences (no VRSP), no pipelining.
    LibraTap(LibraParams),
    /// TAP on VRSP pools, no pipelining.
    LibraTapVrsp(LibraParams),
    /// TAP on VRSP pools with the pipeliner's M head chunks overlapped.
    Libra(LibraParams),
}

impl StepAttention {
    /// The names experiment files use.
    pub const NAMES: [&'static str; 4] = ["ulysses", "libra-tap", "libra-tap-vrsp", "libra"];

    /// The scheme named `name` with Libra settings `p` (ignored by Ulysses).
    pub fn parse(name: &str, p: LibraParams) -> Result<Self> {
        Ok(match name {
            "ulysses" => StepAttention::Ulysses,
            "libra-tap" => StepAttention::LibraTap(p),
            "libra-tap-vrsp" => StepAttention::LibraTapVrsp(p),
            "libra" => StepAttention::Libra(p),
            _ => {
                return Err(invalid(
                    "scheme",
                    name,
                    format!("one of {}", StepAttention::NAMES.join(", ")),
                ))
            }
        })
    }

    /// The scheme it runs.
    pub fn scheme(&self) -> Scheme {
        match self {
            StepAttention::Ulysses => Scheme::Ulysses,
            _ => Scheme::Libra,
        }
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        match self {
            StepAttention::Ulysses => "ulysses",
            StepAttention::LibraTap(_) => "libra-tap",
            StepAttention::LibraTapVrsp(_) => "libra-tap-vrsp",
            StepAttention::Libra(_) => "libra",
        }
    }
}

/// Libra's plan of one step: `global` is the step's GBS sequences in loader order; pools
/// by VRSP (`vrsp`) or P consecutive sequences. P is capped at DP (a pool cannot hold more
/// replicas than there are), so `p.pool_size` is the paper's P for DP ≥ P.
pub fn libra_step_plan(
    step: u64,
    global: &[PackedSeq],
    dp: u32,
    p: &LibraParams,
    use_vrsp: bool,
) -> Result<Plan> {
    let mut p = *p;
    p.pool_size = p.pool_size.min(dp).max(1);
    // P against DP (and GBS against DP) first, so a bad P is named against DP.
    step_shape(global.len(), dp, &p)?;
    let pools = if use_vrsp {
        let loads: Vec<u64> = global.iter().map(|s| s.load_under(&p.shape.mask)).collect();
        vrsp(&loads, p.pool_size as usize)?
    } else {
        consecutive_pools(global.len(), p.pool_size as usize)
    };
    libra_plan(step, global, &pools, dp, &p)
}

/// The per-replica micro-batches a plan implies: sequence `s` of a group at GA index g is
/// part of replica r's micro-batch g, r the replica of the worker holding its first token
/// (its linear work runs there). Several sequences on one (replica, GA index) — a
/// variable-length packing such as WLB-LLM's — are concatenated into one; a slot with none
/// (a replica idle at that GA index) is an empty sequence.
pub fn replica_batches(
    plan: &Plan,
    global: &[PackedSeq],
    dp: u32,
    ga: u32,
    cp: u32,
) -> Result<Vec<Vec<PackedSeq>>> {
    let mut slots: Vec<Vec<usize>> = vec![Vec::new(); (dp * ga) as usize];
    let mut seen = vec![false; global.len()];
    for g in &plan.groups {
        for s in &g.sequences {
            let Some(first) = s.layout.first() else {
                continue;
            };
            let r = first.worker / cp.max(1);
            let i = s.id as usize;
            if r >= dp || g.ga >= ga || i >= global.len() {
                return Err(invalid(
                    format!("plan sequence {}", s.id),
                    format!("replica {r}, GA index {}", g.ga),
                    format!(
                        "a replica below dp = {dp}, a GA index below ga = {ga} and a batch index below {}",
                        global.len()
                    ),
                ));
            }
            if std::mem::replace(&mut seen[i], true) {
                return Err(invalid(
                    format!("plan sequence {}", s.id),
                    "planned twice",
                    "each batch sequence in at most one group",
                ));
            }
            slots[(r * ga + g.ga) as usize].push(i);
        }
    }
    let mut out = Vec::with_capacity(dp as usize);
    for r in 0..dp {
        let mut mbs = Vec::with_capacity(ga as usize);
        for m in 0..ga {
            let ids = &slots[(r * ga + m) as usize];
            let mut seq = PackedSeq {
                samples: Vec::new(),
                capacity: 0,
            };
            for &i in ids {
                seq.samples.extend_from_slice(&global[i].samples);
                seq.capacity = seq.capacity.saturating_add(global[i].capacity);
            }
            mbs.push(if ids.len() == 1 {
                global[ids[0]].clone()
            } else {
                seq
            });
        }
        out.push(mbs);
    }
    Ok(out)
}

/// Build one step whose attention follows `plan` (any scheme's), cut for overlap as
/// `overlap` says (head chunks per worker, 1 = no pipelining; or DistCA's nano-batches).
pub fn build_plan_step(
    cost: &CostModel,
    map: RankMap,
    plan: &Plan,
    global: &[PackedSeq],
    overlap: Overlap<'_>,
    var: &dyn RuntimeVariance,
) -> Result<StepGraph> {
    let par = map.par;
    let batch = replica_batches(plan, global, par.dp, par.ga, par.cp)?;
    let mut attn = PlanAttention::new(cost, plan, map, overlap)?;
    build_step_with(cost, map, &batch, plan.step, var, &mut attn)
}

/// Simulate one step of `scheme` whose global batch is `global` (GBS = DP × GA) on `net`.
pub fn simulate_scheme_batch(
    scheme: &StepAttention,
    cost: &CostModel,
    map: RankMap,
    global: Vec<PackedSeq>,
    step: u64,
    net: &mut dyn NetworkModel,
    var: &dyn RuntimeVariance,
) -> Result<(StepGraph, Timeline)> {
    let (dp, ga) = (map.par.dp, map.par.ga);
    if global.len() != (dp * ga) as usize {
        return Err(invalid(
            "global batch",
            global.len(),
            format!("dp x ga = {}", dp * ga),
        ));
    }
    let sg = match scheme {
        StepAttention::Ulysses => {
            let batch = split_replicas(global, dp, ga);
            build_step(cost, map, &batch, step, var)?
        }
        StepAttention::LibraTap(p) | StepAttention::LibraTapVrsp(p) | StepAttention::Libra(p) => {
            if p.cp != map.par.cp {
                return Err(invalid(
                    "libra cp",
                    p.cp,
                    format!("the layout's cp = {}", map.par.cp),
                ));
            }
            let use_vrsp = !matches!(scheme, StepAttention::LibraTap(_));
            let plan = libra_step_plan(step, &global, dp, p, use_vrsp)?;
            let m = if matches!(scheme, StepAttention::Libra(_)) {
                p.chunks
            } else {
                1
            };
            build_plan_step(cost, map, &plan, &global, Overlap::HeadChunks(m), var)?
        }
    };
    let t = run(&sg.graph, net)?;
    Ok((sg, t))
}

#[cfg(test)]
mod tests;
