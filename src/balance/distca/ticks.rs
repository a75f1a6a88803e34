//! DistCA under pipeline parallelism: one tick's core attention pooled over every GPU.
//!
//! Owns the tick plan (paper: "all stages run the same phase at the same time, and idle
//! GPUs of the pipeline warm-up and drain serve as attention servers"): the step's
//! micro-batches go through the tick schedule ([`pp_ticks`]); tick k's group pools the
//! micro-batch each active stage runs in that tick — one sequence per (stage, replica) —
//! over all PP · DP · CP GPUs; an idle stage's replicas hold nothing (an empty sequence)
//! and only serve. Scheduling and lowering are [`plan_step_cp`]'s, with "replica" j =
//! stage · DP + replica, so its workers are the GPUs (stage-major, as
//! `schedule::RankMap` places them). Core attention has no weights, so a stage's tasks and
//! a DP replica's are alike to the scheduler.
//!
//! A backward tick's group is scheduled on its own: a micro-batch meets other stages'
//! micro-batches there than in its forward tick, so its servers may differ. The lowering
//! (`plan_attn`) moves dO in and dQ/dK/dV back along the backward tick's own transfers and
//! takes a server to hold, or recompute from, the unit's Q, K and V; re-sending them to a
//! backward server that did not compute the forward is not priced.
//!
//! May not time anything (the engine runs it under `PipelineKind::Ticks` through
//! `schedule::plan_attn::PlanAttention::pooled`); no I/O.

use super::lower::{plan_step_cp, DistcaPlan};
use super::pingpong::pp_ticks;
use super::DistcaConfig;
use crate::error::{invalid, Result};
use crate::workload::PackedSeq;

/// Replica r's micro-batches under the tick plan's reading of the global batch: micro-batch
/// m is `global[m · DP + r]` (GA = GBS / DP). The step builder's linear work follows it.
pub fn replica_batches(global: &[PackedSeq], dp: u32) -> Result<Vec<Vec<PackedSeq>>> {
    if dp == 0 || global.is_empty() || global.len() % dp as usize != 0 {
        return Err(invalid(
            "GBS for distca ticks",
            global.len(),
            format!("a positive multiple of DP = {dp}"),
        ));
    }
    let dp = dp as usize;
    Ok((0..dp)
        .map(|r| global.iter().skip(r).step_by(dp).cloned().collect())
        .collect())
}

/// The sequences of every tick, tick-major: tick k's PP · DP sequences at
/// [k · PP · DP + stage · DP + replica], the active stage's micro-batch (replica r's
/// micro-batch m is `global[m · DP + r]`, GA = GBS / DP) or an empty sequence.
pub fn tick_batch(global: &[PackedSeq], dp: u32, pp: u32) -> Result<Vec<PackedSeq>> {
    let reps = replica_batches(global, dp)?;
    let ga = reps[0].len() as u32;
    let ticks = pp_ticks(pp, ga)?;
    let mut out = Vec::with_capacity(ticks.len() * (pp * dp) as usize);
    for t in &ticks {
        for mb in &t.stages {
            for rep in &reps {
                out.push(match mb {
                    Some(m) => rep[*m as usize].clone(),
                    None => PackedSeq {
                        samples: Vec::new(),
                        capacity: 0,
                    },
                });
            }
        }
    }
    Ok(out)
}

/// DistCA's plan of one step under PP: group k is tick k over all PP · DP · CP GPUs (see
/// the module doc); `ping_pong` splits each tick's work into two nano-batches.
pub fn plan_ticks(
    step: u64,
    global: &[PackedSeq],
    dp: u32,
    cp: u32,
    pp: u32,
    cfg: &DistcaConfig,
    ping_pong: bool,
) -> Result<DistcaPlan> {
    let batch = tick_batch(global, dp, pp)?;
    plan_step_cp(step, &batch, pp * dp, cp, cfg, ping_pong)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::AttnShape;
    use crate::plan::check;
    use crate::workload::Sample;

    fn seq(lens: &[u32], doc0: u64) -> PackedSeq {
        PackedSeq {
            samples: lens
                .iter()
                .enumerate()
                .map(|(i, &len)| Sample {
                    doc: doc0 + i as u64,
                    offset: 0,
                    len,
                    cut: false,
                })
                .collect(),
            capacity: 4096,
        }
    }

    #[test]
    fn every_tick_pools_its_active_stages_over_every_gpu() {
        // DP 2, PP 2, GA 2: ticks F0 F1 B0 F2(no mb) ... — 2·(GA + PP − 1) = 6 ticks.
        let global = vec![
            seq(&[4096], 0),
            seq(&[512; 8], 10),
            seq(&[1024; 4], 20),
            seq(&[2048, 2048], 30),
        ];
        let batch = tick_batch(&global, 2, 2).unwrap();
        assert_eq!(batch.len(), 6 * 2 * 2);
        // Tick 0 (forward): stage 0 runs micro-batch 0 (global 0, 1), stage 1 is idle.
        assert_eq!(batch[0], global[0]);
        assert_eq!(batch[1], global[1]);
        assert!(batch[2].samples.is_empty() && batch[3].samples.is_empty());
        // Tick 1: stage 0 micro-batch 1, stage 1 micro-batch 0.
        assert_eq!(
            batch[4..8],
            [
                global[2].clone(),
                global[3].clone(),
                global[0].clone(),
                global[1].clone()
            ]
        );
        let shape = AttnShape {
            heads_q: 4,
            heads_kv: 2,
            head_dim: 8,
            dtype_bytes: 2,
            mask: crate::cost::Mask::Causal,
        };
        let cfg = DistcaConfig::new(shape, 0.1, 128).unwrap();
        for ping_pong in [false, true] {
            let d = plan_ticks(0, &global, 2, 2, 2, &cfg, ping_pong).unwrap();
            let s = check(&d.plan).unwrap();
            assert_eq!(d.plan.groups.len(), 6);
            // Every micro-batch's attention runs once per stage per phase: 2 stages × 2
            // phases × the global batch's pairs.
            let pairs: u64 = global.iter().map(PackedSeq::causal_pairs).sum();
            let want = shape.fwd_flops(4 * pairs, shape.heads_q);
            assert!(
                (s.flops - want).abs() <= 1e-9 * want,
                "{} vs {want}",
                s.flops
            );
            // The pool is every GPU: 2 stages × 2 replicas × CP 2.
            assert!(d.plan.groups.iter().all(|g| g.workers.len() == 8));
            // Tick 0's idle stage-1 GPUs (4..8) serve: the long document's work moves there.
            let g0 = &d.plan.groups[0];
            assert!(g0.units.iter().any(|u| u.worker >= 4), "idle stage serves");
        }
        let reps = replica_batches(&global, 2).unwrap();
        assert_eq!(reps[0], [global[0].clone(), global[2].clone()]);
        assert_eq!(reps[1], [global[1].clone(), global[3].clone()]);
        let e = tick_batch(&global[..3], 2, 2).unwrap_err().to_string();
        assert!(e.contains("multiple of DP"), "{e}");
    }
}
