//! DistCA ping-pong and pipeline ticks, as data the step lowering reads.
//!
//! Owns two descriptions, no timing (the engine times them; `cost/` prices them):
//!
//! 1. [`NanoTable`]: which nano-batch (0 or 1) each unit and each transfer of a lowered
//!    DistCA plan belongs to (paper: "ping-pong execution" — each micro-batch split into two
//!    nano-batches so that one's core-attention communication overlaps the other's compute).
//!    It is a side table beside the [`Plan`] (the Plan IR and its JSON are unchanged):
//!    `distca::lower` emits nano-batch 0's units first, so per group the table is the
//!    number of units of each nano-batch. A transfer inherits its unit's nano-batch (Q and
//!    output name their unit; a KV transfer the earliest nano-batch of the units on its
//!    destination that read its KV group, as `plan::build` emits it before that unit).
//! 2. [`pp_ticks`]: DistCA's pipeline-parallel *ticks* (paper §"pipeline parallelism"): every
//!    stage runs the same phase in a tick — all forward or all backward — so that the core
//!    attention of a tick can be pooled over every GPU; a stage with no micro-batch in the
//!    tick (pipeline warm-up and drain) runs no linear layers but still serves attention.
//!    Forward tick k runs micro-batch k − s on stage s; backward tick j runs micro-batch
//!    j − (PP − 1 − s); backward tick j follows forward tick j + PP − 1, the tick in which
//!    the last stage finished micro-batch j's forward (1F1B order in the steady state).
//!
//! May not touch the engine, `plan::build` or the scheduler; no I/O.

use std::collections::HashMap;

use serde::Serialize;

use crate::error::{invalid, Result};
use crate::plan::{Group, KvGroup, Payload, Plan, WorkerId};

/// Per group of a DistCA plan, how many units each nano-batch has (nano-batch 0's first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NanoTable {
    /// `units[g] = [n0, n1]`: units `[0, n0)` of group g are nano-batch 0, `[n0, n0 + n1)`
    /// nano-batch 1. Without ping-pong every unit is nano-batch 0 (`n1 = 0`).
    pub units: Vec<[u32; 2]>,
}

impl NanoTable {
    /// The table for a plan whose every group holds one nano-batch (no ping-pong).
    pub fn single(plan: &Plan) -> NanoTable {
        NanoTable {
            units: plan
                .groups
                .iter()
                .map(|g| [g.units.len() as u32, 0])
                .collect(),
        }
    }

    /// Check the table against `plan`: one entry per group, counts summing to its units.
    pub fn validate(&self, plan: &Plan) -> Result<()> {
        if self.units.len() != plan.groups.len() {
            return Err(invalid(
                "nano table groups",
                self.units.len(),
                format!("the plan's {} groups", plan.groups.len()),
            ));
        }
        for (g, (c, grp)) in self.units.iter().zip(&plan.groups).enumerate() {
            let n = u64::from(c[0]) + u64::from(c[1]);
            if n != grp.units.len() as u64 {
                return Err(invalid(
                    format!("nano table group {g} units"),
                    n,
                    format!("the group's {} units", grp.units.len()),
                ));
            }
        }
        Ok(())
    }

    /// The nano-batch (0 or 1) of unit `unit` of group `g` (0 for an index out of range).
    pub fn unit_nano(&self, g: usize, unit: u32) -> u8 {
        self.units.get(g).map_or(0, |c| u8::from(unit >= c[0]))
    }

    /// The nano-batch of each transfer of group `g` (`group` = the plan's group `g`), in
    /// transfer order.
    pub fn transfer_nanos(&self, g: usize, group: &Group) -> Vec<u8> {
        // The earliest nano-batch of the units on each worker that read each KV group, in
        // one pass over the units (looked up, never iterated).
        let mut reads: HashMap<(WorkerId, KvGroup), u8> = HashMap::new();
        for u in &group.units {
            let k = self.unit_nano(g, u.id);
            for &kv in &u.kv_groups {
                let m = reads.entry((u.worker, kv)).or_insert(k);
                *m = (*m).min(k);
            }
        }
        group
            .transfers
            .iter()
            .map(|t| match t.carries {
                Payload::Q { unit, .. } | Payload::Output { unit, .. } => self.unit_nano(g, unit),
                Payload::Kv { group: kv, .. } => reads.get(&(t.dst, kv)).copied().unwrap_or(0),
            })
            .collect()
    }
}

/// The phase every stage runs in a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Phase {
    /// Forward passes.
    Forward,
    /// Backward passes.
    Backward,
}

/// One pipeline tick: the phase, and per stage the micro-batch it runs (None: the stage
/// is idle in its linear layers and only serves attention).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Tick {
    /// Forward or backward, for every stage.
    pub phase: Phase,
    /// `stages[s]`: micro-batch on stage s, if any.
    pub stages: Vec<Option<u32>>,
}

impl Tick {
    /// Stages with no micro-batch in this tick (warm-up / drain): attention servers only.
    pub fn idle_stages(&self) -> usize {
        self.stages.iter().filter(|s| s.is_none()).count()
    }
}

/// DistCA's tick schedule of `ga` micro-batches over `pp` stages: 2·(GA + PP − 1) ticks,
/// forward tick k then, once k ≥ PP − 1, backward tick k − (PP − 1); then the remaining
/// backward ticks. Errors: PP or GA of 0.
pub fn pp_ticks(pp: u32, ga: u32) -> Result<Vec<Tick>> {
    if pp == 0 {
        return Err(invalid("pp", pp, "at least one pipeline stage"));
    }
    if ga == 0 {
        return Err(invalid("ga", ga, "at least one micro-batch"));
    }
    let n = ga + pp - 1;
    let fwd = |k: u32| Tick {
        phase: Phase::Forward,
        stages: (0..pp)
            .map(|s| k.checked_sub(s).filter(|&m| m < ga))
            .collect(),
    };
    let bwd = |j: u32| Tick {
        phase: Phase::Backward,
        stages: (0..pp)
            .map(|s| j.checked_sub(pp - 1 - s).filter(|&m| m < ga))
            .collect(),
    };
    let mut out = Vec::with_capacity(2 * n as usize);
    for k in 0..n {
        out.push(fwd(k));
        if k + 1 >= pp {
            out.push(bwd(k + 1 - pp));
        }
    }
    for j in (n + 1 - pp)..n {
        out.push(bwd(j));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::lower::plan_step;
    use super::super::DistcaConfig;
    use super::*;
    use crate::cost::AttnShape;
    use crate::workload::{PackedSeq, Sample};

    #[test]
    fn ticks_by_hand_pp2_ga2() {
        // F0: s0 mb0, s1 idle; F1: s0 mb1, s1 mb0; B0: s0 idle, s1 mb0; F2: s0 idle, s1 mb1;
        // B1: s0 mb0, s1 mb1; B2: s0 mb1, s1 idle.
        let t = pp_ticks(2, 2).unwrap();
        let got: Vec<(Phase, Vec<Option<u32>>)> =
            t.iter().map(|t| (t.phase, t.stages.clone())).collect();
        use Phase::*;
        assert_eq!(
            got,
            vec![
                (Forward, vec![Some(0), None]),
                (Forward, vec![Some(1), Some(0)]),
                (Backward, vec![None, Some(0)]),
                (Forward, vec![None, Some(1)]),
                (Backward, vec![Some(0), Some(1)]),
                (Backward, vec![Some(1), None]),
            ]
        );
        assert_eq!(t.iter().map(Tick::idle_stages).sum::<usize>(), 4);
    }

    #[test]
    fn ticks_run_every_pass_once_in_dependency_order() {
        for pp in 1..6u32 {
            for ga in 1..9u32 {
                let t = pp_ticks(pp, ga).unwrap();
                assert_eq!(t.len() as u32, 2 * (ga + pp - 1));
                // tick index of (phase, stage, mb)
                let mut at = std::collections::HashMap::new();
                for (i, tick) in t.iter().enumerate() {
                    for (s, m) in tick.stages.iter().enumerate() {
                        if let Some(m) = m {
                            assert!(at.insert((tick.phase, s as u32, *m), i).is_none());
                        }
                    }
                }
                assert_eq!(at.len() as u32, 2 * pp * ga);
                for m in 0..ga {
                    for s in 0..pp {
                        let f = at[&(Phase::Forward, s, m)];
                        let b = at[&(Phase::Backward, s, m)];
                        assert!(f < b);
                        if s > 0 {
                            assert!(at[&(Phase::Forward, s - 1, m)] < f);
                        }
                        if s + 1 < pp {
                            assert!(at[&(Phase::Backward, s + 1, m)] < b);
                            assert!(at[&(Phase::Forward, pp - 1, m)] < b);
                        }
                    }
                }
                // idle stage-ticks: 2 · PP · (PP − 1) (warm-up + drain of both phases)
                let idle: usize = t.iter().map(Tick::idle_stages).sum();
                assert_eq!(idle as u32, 2 * pp * (pp - 1));
            }
        }
        assert!(pp_ticks(0, 2).is_err());
        assert!(pp_ticks(2, 0).unwrap_err().to_string().contains("ga"));
    }

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
            capacity: lens.iter().sum::<u32>(),
        }
    }

    #[test]
    fn nano_table_of_a_ping_pong_plan() {
        let shape = AttnShape {
            heads_q: 2,
            heads_kv: 1,
            head_dim: 2,
            dtype_bytes: 2,
            mask: crate::cost::Mask::Causal,
        };
        let batch = [seq(&[900, 300, 40], 0), seq(&[64, 32], 10)];
        let cfg = DistcaConfig::new(shape, 0.05, 16).unwrap();
        let d = plan_step(0, &batch, 2, &cfg, true).unwrap();
        let t = d.nano.clone();
        t.validate(&d.plan).unwrap();
        let g = &d.plan.groups[0];
        // nano-batch h's units cover exactly the queries of its samples.
        let halves: Vec<[Vec<u32>; 2]> = super::super::home_ranges(&batch, 1)
            .iter()
            .map(|r| {
                super::super::nano_split(r, &crate::cost::Mask::Causal)
                    .map(|h| h.iter().map(|x| x.sample.index).collect())
            })
            .collect();
        for u in &g.units {
            let h = t.unit_nano(0, u.id) as usize;
            for s in &u.segments {
                assert!(halves[u.seq as usize][h].contains(&s.sample), "{u:?}");
            }
        }
        assert!(t.units[0][0] > 0 && t.units[0][1] > 0);
        // Q/output transfers carry their unit's nano-batch; a KV transfer the earliest of
        // the units it serves, which all read the same sample (same nano-batch).
        let n = t.transfer_nanos(0, g);
        assert_eq!(n.len(), g.transfers.len());
        // the same as scanning every unit for every transfer
        let scan: Vec<u8> = g
            .transfers
            .iter()
            .map(|tr| match tr.carries {
                Payload::Q { unit, .. } | Payload::Output { unit, .. } => t.unit_nano(0, unit),
                Payload::Kv { group: kv, .. } => g
                    .units
                    .iter()
                    .filter(|u| u.worker == tr.dst && u.kv_groups.contains(&kv))
                    .map(|u| t.unit_nano(0, u.id))
                    .min()
                    .unwrap_or(0),
            })
            .collect();
        assert_eq!(n, scan);
        assert!(n.contains(&1));
        for (tr, &h) in g.transfers.iter().zip(&n) {
            if let Payload::Kv { group, .. } = tr.carries {
                assert!(halves[group.seq as usize][h as usize].contains(&group.sample));
            }
        }
        let single = plan_step(0, &batch, 2, &cfg, false).unwrap();
        assert_eq!(single.nano, NanoTable::single(&single.plan));
        let mut bad = t;
        bad.units[0][1] += 1;
        assert!(bad
            .validate(&d.plan)
            .unwrap_err()
            .to_string()
            .contains("units"));
    }
}
