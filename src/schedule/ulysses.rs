//! DeepSpeed-Ulysses' attention as an [`AttentionStage`] of the step builder
//! ([`super::step`]).
//!
//! Per layer and micro-batch on each rank of a CP group (Jacobs et al., "DeepSpeed
//! Ulysses", 2023, §3): the rank holds L/CP tokens of the packed sequence with all heads;
//! an all-to-all of Q/K/V gives it all L tokens for h_q/CP query heads (and
//! max(1, h_kv/CP) KV heads: KV heads are replicated when CP exceeds h_kv); it runs core
//! attention over every document of the sequence for its heads; an all-to-all of the
//! output gives the tokens back. Backward mirrors it (dO out, dQ/dK/dV back); under
//! recomputation the backward kernel also re-runs the forward one (the all-to-alls are
//! not repeated). Head counts that do not divide are rejected. Each layer is priced under
//! its own mask class.
//!
//! Every rank of a CP group computes the same attention FLOPs (heads split evenly), so
//! Ulysses balances *within* a CP group; different replicas get different packed
//! sequences, and that cross-replica skew waits at the DP gradient all-reduce. A
//! replica's attention involves only its own CP groups, so the stage is per replica and the
//! step builder emits the replicas in parallel parts, each with a stage of its own.

use super::stage::{AttentionStage, AttnCall, StepEnv};
use super::step::{a2a_pattern, all_to_all, attn_split, chunk, part_stream, A2aRoute};
use super::RankMap;
use crate::cost::{CostModel, HeadSplit};
use crate::engine::{GraphBuilder, OpClass, OpId, OpKind, OpLabel, StreamKind, Xfer};
use crate::error::{invalid, Result};
use crate::net::{GpuId, Ps};
use crate::workload::PackedSeq;

/// Ulysses' all-to-all attention over some replicas of a step.
pub struct UlyssesAttention<'a> {
    map: RankMap,
    batch: &'a [Vec<PackedSeq>],
    /// Per mask class of the model, one TP rank's cost model.
    class_costs: Vec<CostModel>,
    /// The mask class of each layer.
    layer_class: Vec<usize>,
    split: HeadSplit,
    /// The replicas it emits: [r0, r0 + nr).
    r0: usize,
    nr: usize,
    /// The builder's stream numbering ([`part_stream`]).
    local: Option<(u32, u32, u32)>,
    /// Per stage: all-to-all routes of each rank in its lane's CP group, at (replica ·
    /// TP + tp_rank) · CP + position, and the lanes' GPUs, indexed alike.
    routes: Vec<Vec<A2aRoute>>,
    cp_gpus: Vec<Vec<GpuId>>,
    /// Per (stage, replica) at stage · nr + replica: its current micro-batch's figures.
    slots: Vec<Slot>,
    xf: Vec<Xfer>,
}

/// One replica's attention figures for one micro-batch.
#[derive(Clone, Default)]
struct Slot {
    /// The micro-batch they are for (`None`: not yet priced).
    mb: Option<u32>,
    /// Per mask class: attention time, forward and backward.
    attn_f: Vec<Ps>,
    attn_b: Vec<Ps>,
    /// Per CP position: all-to-all bytes to each peer, in (Q/K/V) and out (the output).
    pair_in: Vec<u64>,
    pair_out: Vec<u64>,
}

impl<'a> UlyssesAttention<'a> {
    /// The stage over every replica of `batch` (`batch[r][m]`: replica r's micro-batch m)
    /// on `map`; `cost` prices the whole model (the stage takes one TP rank's share). An
    /// error where CP does not divide the heads.
    pub fn new(cost: &CostModel, map: RankMap, batch: &'a [Vec<PackedSeq>]) -> Result<Self> {
        let par = map.par;
        let shard = cost.tp_shard(par.tp, par.ep)?;
        let split = attn_split(&shard.model, par.cp, false)?;
        let nr = par.dp as usize;
        Ok(Self::part(&shard, map, batch, split, 0, nr, None))
    }

    /// The stage over replicas [r0, r0 + nr) as a part's builder numbers its streams
    /// (`local`, [`part_stream`]); `cost` prices one TP rank, `split` its heads.
    pub(super) fn part(
        cost: &CostModel,
        map: RankMap,
        batch: &'a [Vec<PackedSeq>],
        split: HeadSplit,
        r0: usize,
        nr: usize,
        local: Option<(u32, u32, u32)>,
    ) -> Self {
        let par = map.par;
        let m = &cost.model;
        let class_costs: Vec<CostModel> = cost.mask_classes().into_iter().map(|c| c.2).collect();
        let layer_class = (0..m.layers)
            .map(|l| m.attention.class_index(l, m.layers))
            .collect();
        let mut buf = Vec::with_capacity(par.cp as usize);
        let (mut routes, mut cp_gpus) = (Vec::new(), Vec::new());
        for p in 0..par.pp {
            let (mut rs, mut gs) = (Vec::new(), Vec::new());
            for r in r0 as u32..(r0 + nr) as u32 {
                for t in 0..par.tp {
                    let lane: Vec<GpuId> = (0..par.cp).map(|c| map.gpu(p, r, c, t)).collect();
                    a2a_pattern(&map.place, &lane, &mut buf);
                    rs.extend_from_slice(&buf);
                    gs.extend_from_slice(&lane);
                }
            }
            routes.push(rs);
            cp_gpus.push(gs);
        }
        UlyssesAttention {
            map,
            batch,
            class_costs,
            layer_class,
            split,
            r0,
            nr,
            local,
            routes,
            cp_gpus,
            slots: vec![Slot::default(); par.pp as usize * nr],
            xf: Vec::new(),
        }
    }

    /// Prices replica r's (of the span) slot at stage p for micro-batch mb, unless done.
    fn price(&mut self, p: u32, r: usize, mb: u32) -> Result<()> {
        let at = p as usize * self.nr + r;
        if self.slots[at].mb == Some(mb) {
            return Ok(());
        }
        let seq = self
            .batch
            .get(self.r0 + r)
            .and_then(|m| m.get(mb as usize))
            .ok_or_else(|| {
                invalid(
                    "ulysses micro-batch",
                    format!("replica {} micro-batch {mb}", self.r0 + r),
                    format!(
                        "one of the batch's {} replicas' micro-batches",
                        self.batch.len()
                    ),
                )
            })?;
        let (a, split, cp) = (self.class_costs[0].attn(), self.split, self.map.par.cp);
        let tokens = seq.tokens();
        let s = &mut self.slots[at];
        s.mb = Some(mb);
        s.attn_f.clear();
        s.attn_b.clear();
        for c in &self.class_costs {
            s.attn_f.push(c.attn_fwd_ps(seq.lengths(), split.q));
            s.attn_b.push(c.attn_bwd_ps(seq.lengths(), split.q));
        }
        s.pair_in.clear();
        s.pair_out.clear();
        for c in 0..cp {
            let t = chunk(tokens, cp, c);
            s.pair_in
                .push(a.q_bytes(t, split.q) + a.kv_bytes(t, split.kv));
            s.pair_out.push(a.q_bytes(t, split.q));
        }
        Ok(())
    }

    /// Replica r's (of the span) attention: per TP lane, its CP group's all-to-all in, core
    /// attention, all-to-all out (or, in backward, dO in, attention backward, dQ/dK/dV
    /// out).
    fn emit_replica(
        &mut self,
        b: &mut GraphBuilder,
        env: &StepEnv<'_>,
        call: AttnCall,
        r: usize,
        last: &mut [OpId],
    ) -> Result<()> {
        self.price(call.stage, r, call.mb)?;
        let AttnCall {
            stage,
            layer,
            mb,
            fwd,
            recompute,
            ..
        } = call;
        let p = stage as usize;
        let (cpu, tp) = (self.map.par.cp as usize, self.map.par.tp as usize);
        let slot = &self.slots[p * self.nr + r];
        let class = self.layer_class[layer as usize];
        let attn = if fwd {
            slot.attn_f[class]
        } else {
            slot.attn_b[class] + if recompute { slot.attn_f[class] } else { 0 }
        };
        let (b_in, b_out) = if fwd {
            (&slot.pair_in, &slot.pair_out)
        } else {
            (&slot.pair_out, &slot.pair_in)
        };
        let (c_in, c_out, c_attn) = if fwd {
            (OpClass::A2aIn, OpClass::A2aOut, OpClass::AttnFwd)
        } else {
            (OpClass::A2aOut, OpClass::A2aIn, OpClass::AttnBwd)
        };
        let lab = |class| OpLabel {
            class,
            mb: mb as u16,
            layer: layer as u16,
        };
        let (map, local) = (&self.map, self.local);
        let stream = |g: GpuId, k| part_stream(map, local, g, k);
        for t in 0..tp {
            let lane = (r * tp + t) * cpu..(r * tp + t + 1) * cpu;
            let (group, routes) = (&self.cp_gpus[p][lane.clone()], &self.routes[p][lane]);
            // rank c of the lane is at offset (replica · CP + c) · TP + t of `last`
            let at = |c: usize| (r * cpu + c) * tp + t;
            if cpu > 1 {
                let coll = all_to_all(b, &mut self.xf, routes, b_in);
                for (c, &g) in group.iter().enumerate() {
                    let s = stream(g, StreamKind::CpComm);
                    last[at(c)] = b.add_op(s, OpKind::Coll(coll), lab(c_in), &[last[at(c)]]);
                }
            }
            for (c, &g) in group.iter().enumerate() {
                let dur = env.vary(g, layer, c_attn, mb, attn);
                let deps: &[OpId] = if cpu > 1 {
                    std::slice::from_ref(&last[at(c)])
                } else {
                    &[]
                };
                let s = stream(g, StreamKind::Compute);
                last[at(c)] = b.add_op(s, OpKind::Compute(dur), lab(c_attn), deps);
            }
            if cpu > 1 {
                let coll = all_to_all(b, &mut self.xf, routes, b_out);
                for (c, &g) in group.iter().enumerate() {
                    let s = stream(g, StreamKind::CpComm);
                    last[at(c)] = b.add_op(s, OpKind::Coll(coll), lab(c_out), &[last[at(c)]]);
                }
            }
        }
        Ok(())
    }
}

impl AttentionStage for UlyssesAttention<'_> {
    fn per_replica(&self) -> bool {
        true
    }

    fn emit(
        &mut self,
        b: &mut GraphBuilder,
        env: &StepEnv<'_>,
        call: AttnCall,
        last: &mut [OpId],
    ) -> Result<()> {
        match call.replica {
            Some(r) => {
                let r = (r as usize)
                    .checked_sub(self.r0)
                    .filter(|&r| r < self.nr)
                    .ok_or_else(|| {
                        invalid(
                            "ulysses replica",
                            r,
                            format!("{}..{}", self.r0, self.r0 + self.nr),
                        )
                    })?;
                self.emit_replica(b, env, call, r, last)
            }
            None => (0..self.nr).try_for_each(|r| self.emit_replica(b, env, call, r, last)),
        }
    }
}
