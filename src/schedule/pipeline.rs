//! Pipeline schedules: which layers each stage holds and the order in which a stage runs
//! its micro-batches' forwards and backwards.
//!
//! Owns the split of the decoder layers into virtual stages (model chunks), the per-stage
//! slot order of GPipe, 1F1B (PipeDream-flush, Megatron's non-interleaved schedule), DistCA's
//! ticks and Megatron's interleaved 1F1B, and the activations a stage holds at its peak. It
//! builds no ops: `step` emits a slot's ops; this module only says which slot comes when.
//!
//! # Interleaved 1F1B
//!
//! With `vp` > 1 every stage holds `vp` model chunks; virtual stage q = c · PP + p (chunk c
//! of stage p) holds the q-th run of layers, so an activation goes stage 0 → PP − 1 through
//! chunk 0, then back to stage 0 for chunk 1, and so on (Narayanan et al., "Efficient
//! Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21, §2.2).
//! The order is Megatron-Core's `forward_backward_pipelining_with_interleaving`
//! (`megatron/core/pipeline_parallel/schedules.py`) with its default group of PP contiguous
//! micro-batches per chunk (`microbatch_group_size_per_vp_stage`): the schedule table lists,
//! group by group, every chunk's micro-batches of the group; forward k runs table entry k,
//! backward k the same micro-batch through chunk vp − 1 − c. Stage p first runs
//! (PP − p − 1) · 2 + (vp − 1) · PP forwards (at most all of them), then alternates one
//! forward and one backward, then drains its backwards. Megatron-Core refuses a last group
//! shorter than PP, so GA must be a multiple of PP. The bubble shrinks from (PP − 1) / GA of
//! the step to (PP − 1) / (vp · GA) at the price of vp times the pipeline sends.
//!
//! # Uneven stages
//!
//! `account_for_embedding` / `account_for_loss` (Megatron's
//! `--account-for-{embedding,loss}-in-pipeline-split`) count the embedding and the LM head
//! as one layer each in the split, so the first and last virtual stages hold one decoder
//! layer fewer: Llama 3 405B's 126 layers on PP 16 (Dubey et al., "The Llama 3 Herd of
//! Models", 2024, §3.3.2: one layer fewer on the first and last stages) are 8 slots a
//! stage. With either option or vp > 1 the slots (layers + those counted) must divide evenly
//! into PP · vp virtual stages; otherwise a stage split keeps the remainder on the earlier
//! stages ([`stage_layers`]).

use super::{Parallelism, PipelineKind};
use crate::error::{invalid, Result};

/// Most virtual stages per stage (`vp`): a model chunk holds one layer or more.
pub const MAX_VP: u32 = 1 << 10;

/// One slot of a stage's order: micro-batch `mb`'s forward (`fwd`) or backward through the
/// stage's model chunk `chunk` (0 unless interleaved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Forward (true) or backward.
    pub fwd: bool,
    /// The micro-batch.
    pub mb: u32,
    /// The stage's model chunk.
    pub chunk: u32,
}

/// The first and last layer (inclusive start, exclusive end) of each stage: layers split
/// as evenly as possible, earlier stages taking the remainder.
pub fn stage_layers(layers: u32, pp: u32) -> Vec<(u32, u32)> {
    let (base, rem) = (layers / pp, layers % pp);
    let mut out = Vec::with_capacity(pp as usize);
    let mut a = 0;
    for s in 0..pp {
        let n = base + u32::from(s < rem);
        out.push((a, a + n));
        a += n;
    }
    out
}

/// Whether the layout splits layers into equal slots ([`chunk_layers`]'s even rule) rather
/// than [`stage_layers`]'s.
fn slotted(par: &Parallelism) -> bool {
    par.vp > 1 || par.account_for_embedding || par.account_for_loss
}

/// Refuse a pipeline layout the interleaved schedule or the slot split cannot run, naming
/// the field; `layers` is the model's decoder layers, `ctx` the file or section.
pub fn check(par: &Parallelism, layers: u32, ctx: &str) -> Result<()> {
    let (pp, vp) = (par.pp, par.vp);
    if vp == 0 || vp > MAX_VP {
        return Err(invalid(
            format!("{ctx}: vp"),
            vp,
            format!("1 to {MAX_VP} virtual stages per stage"),
        ));
    }
    if vp > 1 {
        if pp < 2 {
            return Err(invalid(
                format!("{ctx}: vp"),
                vp,
                format!("1 at pp = {pp} (virtual stages interleave two or more stages)"),
            ));
        }
        if par.pipeline != PipelineKind::OneFOneB {
            return Err(invalid(
                format!("{ctx}: vp"),
                vp,
                "1 unless pipeline = \"1f1b\" (the interleaved schedule is 1F1B's)",
            ));
        }
        if par.ga % pp != 0 {
            return Err(invalid(
                format!("{ctx}: ga"),
                par.ga,
                format!(
                    "a multiple of pp = {pp} with vp = {vp} (Megatron-Core's interleaved \
                     schedule runs the micro-batches in groups of PP)"
                ),
            ));
        }
    }
    if !slotted(par) {
        return Ok(());
    }
    if par.pipeline == PipelineKind::Ticks {
        return Err(invalid(
            format!("{ctx}: pipeline"),
            "ticks",
            "\"1f1b\" or \"gpipe\" with account_for_embedding or account_for_loss",
        ));
    }
    let slots = layers + u32::from(par.account_for_embedding) + u32::from(par.account_for_loss);
    if slots % pp != 0 {
        return Err(invalid(
            format!("{ctx}: pp"),
            pp,
            format!(
                "a divisor of the {slots} layer slots ({layers} layers{}) when stages are \
                 split evenly (vp > 1 or the embedding or loss counted as a layer)",
                counted(par)
            ),
        ));
    }
    let per_stage = slots / pp;
    if per_stage % vp != 0 {
        return Err(invalid(
            format!("{ctx}: vp"),
            vp,
            format!(
                "a divisor of each stage's {per_stage} layer slots ({layers} layers{} over \
                 pp = {pp})",
                counted(par)
            ),
        ));
    }
    if per_stage / vp < 2 && (par.account_for_embedding || par.account_for_loss) {
        return Err(invalid(
            format!("{ctx}: vp"),
            vp,
            format!(
                "at most {} so that the first and last virtual stages keep a decoder layer \
                 beside the embedding or loss",
                per_stage / 2
            ),
        ));
    }
    Ok(())
}

fn counted(par: &Parallelism) -> &'static str {
    match (par.account_for_embedding, par.account_for_loss) {
        (true, true) => " + embedding + loss",
        (true, false) => " + embedding",
        (false, true) => " + loss",
        (false, false) => "",
    }
}

/// The decoder layers [first, end) of each virtual stage q = chunk · PP + stage (PP · vp of
/// them; without interleaving one per stage). The layout must have passed [`check`].
pub fn chunk_layers(par: &Parallelism, layers: u32) -> Vec<(u32, u32)> {
    if !slotted(par) {
        return stage_layers(layers, par.pp);
    }
    let n = par.pp * par.vp;
    let slots = layers + u32::from(par.account_for_embedding) + u32::from(par.account_for_loss);
    let per = slots / n;
    let mut out = Vec::with_capacity(n as usize);
    let mut a = 0;
    for q in 0..n {
        let mut k = per;
        if q == 0 && par.account_for_embedding {
            k -= 1;
        }
        if q + 1 == n && par.account_for_loss {
            k -= 1;
        }
        out.push((a, a + k));
        a += k;
    }
    out
}

/// The decoder layers stage `stage` holds over all its chunks.
pub fn stage_layer_count(chunks: &[(u32, u32)], pp: u32, stage: u32) -> u32 {
    chunks
        .iter()
        .skip(stage as usize)
        .step_by(pp.max(1) as usize)
        .map(|&(a, b)| b - a)
        .sum()
}

/// The order of forward (true) and backward (false) micro-batch slots on `stage` of a
/// schedule of one chunk per stage.
pub fn stage_order(kind: PipelineKind, pp: u32, stage: u32, ga: u32) -> Vec<(bool, u32)> {
    let mut v = Vec::with_capacity(2 * ga as usize);
    match kind {
        PipelineKind::Gpipe => {
            v.extend((0..ga).map(|m| (true, m)));
            v.extend((0..ga).map(|m| (false, m)));
        }
        PipelineKind::OneFOneB => {
            let w = (pp - stage - 1).min(ga);
            v.extend((0..w).map(|m| (true, m)));
            for i in 0..ga - w {
                v.push((true, w + i));
                v.push((false, i));
            }
            v.extend((ga - w..ga).map(|m| (false, m)));
        }
        PipelineKind::Ticks => {
            use crate::balance::distca::pingpong::{pp_ticks, Phase};
            for t in pp_ticks(pp, ga).unwrap_or_default() {
                if let Some(Some(mb)) = t.stages.get(stage as usize) {
                    v.push((t.phase == Phase::Forward, *mb));
                }
            }
        }
    }
    v
}

/// Megatron-Core's interleaved order on `stage` (module doc): `vp` chunks, groups of PP
/// micro-batches, (PP − stage − 1) · 2 + (vp − 1) · PP warm-up forwards.
pub fn interleaved_order(pp: u32, vp: u32, stage: u32, ga: u32) -> Vec<Slot> {
    let mut table = Vec::with_capacity((ga * vp) as usize);
    let mut g0 = 0;
    while g0 < ga {
        let end = if g0 + pp >= ga { ga } else { g0 + pp };
        for c in 0..vp {
            table.extend((g0..end).map(|mb| (mb, c)));
        }
        g0 = end;
    }
    let total = table.len();
    let warm = (((pp - stage - 1) * 2 + (vp - 1) * pp) as usize).min(total);
    let f = |k: usize| Slot {
        fwd: true,
        mb: table[k].0,
        chunk: table[k].1,
    };
    let b = |k: usize| Slot {
        fwd: false,
        mb: table[k].0,
        chunk: vp - 1 - table[k].1,
    };
    let mut v = Vec::with_capacity(2 * total);
    v.extend((0..warm).map(f));
    for k in 0..total - warm {
        v.push(f(k + warm));
        v.push(b(k));
    }
    v.extend((total - warm..total).map(b));
    v
}

/// Stage `stage`'s slots in the layout's schedule.
pub fn slots(par: &Parallelism, stage: u32) -> Vec<Slot> {
    if par.vp > 1 {
        return interleaved_order(par.pp, par.vp, stage, par.ga);
    }
    stage_order(par.pipeline, par.pp, stage, par.ga)
        .into_iter()
        .map(|(fwd, mb)| Slot { fwd, mb, chunk: 0 })
        .collect()
}

/// Micro-batches whose activations a stage of a one-chunk schedule holds at its peak.
pub fn in_flight(kind: PipelineKind, pp: u32, stage: u32, ga: u32) -> u32 {
    match kind {
        PipelineKind::Gpipe => ga,
        PipelineKind::OneFOneB => (pp - stage).min(ga),
        // The most forwards not yet matched by their backward along the stage's order.
        PipelineKind::Ticks => stage_order(kind, pp, stage, ga)
            .iter()
            .scan(0i64, |n, &(fwd, _)| {
                *n += if fwd { 1 } else { -1 };
                Some(*n)
            })
            .max()
            .unwrap_or(0) as u32,
    }
}

/// Decoder layers' activations `stage` holds at its peak, summed over the (micro-batch,
/// chunk) pairs whose forward has run and backward has not: one-chunk schedules hold
/// [`in_flight`] micro-batches of the stage's layers; interleaved ones the chunks' layers
/// along [`slots`].
pub fn held_layers(par: &Parallelism, chunks: &[(u32, u32)], stage: u32) -> u64 {
    if par.vp <= 1 {
        let (a, b) = chunks[stage as usize];
        return u64::from(in_flight(par.pipeline, par.pp, stage, par.ga)) * u64::from(b - a);
    }
    let layers = |c: u32| {
        let (a, b) = chunks[(c * par.pp + stage) as usize];
        i64::from(b - a)
    };
    slots(par, stage)
        .iter()
        .scan(0i64, |n, s| {
            *n += if s.fwd {
                layers(s.chunk)
            } else {
                -layers(s.chunk)
            };
            Some(*n)
        })
        .max()
        .unwrap_or(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(v: &[Slot]) -> String {
        v.iter()
            .map(|s| format!("{}{}.{}", if s.fwd { 'F' } else { 'B' }, s.mb, s.chunk))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn par(pp: u32, vp: u32, ga: u32) -> Parallelism {
        Parallelism {
            vp,
            ..Parallelism::plain(1, pp, 1, ga)
        }
    }

    #[test]
    fn interleaved_order_is_megatron_cores() {
        // PP 2, vp 2, GA 4: table (mb, chunk) = 0.0 1.0 0.1 1.1 2.0 3.0 2.1 3.1; stage 0
        // warms up with (2 − 0 − 1)·2 + (2 − 1)·2 = 4 forwards, stage 1 with 2.
        assert_eq!(
            show(&interleaved_order(2, 2, 0, 4)),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0"
        );
        assert_eq!(
            show(&interleaved_order(2, 2, 1, 4)),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0"
        );
        // Every (mb, chunk) runs once forward and once backward, the forward first.
        for (pp, vp, ga) in [(4, 2, 8), (4, 3, 4), (8, 4, 16), (2, 5, 6)] {
            for s in 0..pp {
                let o = interleaved_order(pp, vp, s, ga);
                assert_eq!(o.len(), (2 * vp * ga) as usize);
                for mb in 0..ga {
                    for c in 0..vp {
                        let at = |fwd| {
                            o.iter()
                                .position(|x| x.fwd == fwd && x.mb == mb && x.chunk == c)
                                .unwrap()
                        };
                        assert!(at(true) < at(false), "pp {pp} vp {vp} stage {s}");
                    }
                }
            }
        }
    }

    #[test]
    fn chunks_split_layers_evenly_and_the_embedding_and_loss_take_a_slot() {
        // 8 layers on PP 2 × vp 2: virtual stage q = chunk·PP + stage holds layers 2q, 2q+1.
        assert_eq!(
            chunk_layers(&par(2, 2, 2), 8),
            vec![(0, 2), (2, 4), (4, 6), (6, 8)]
        );
        // Llama 3 405B: 126 layers + embedding + loss = 128 slots on PP 16: 7, 8 × 14, 7.
        let p = Parallelism {
            account_for_embedding: true,
            account_for_loss: true,
            ..par(16, 1, 16)
        };
        check(&p, 126, "t").unwrap();
        let c = chunk_layers(&p, 126);
        assert_eq!(c.len(), 16);
        assert_eq!(c[0], (0, 7));
        assert_eq!(c[15], (119, 126));
        assert!(c[1..15].iter().all(|&(a, b)| b - a == 8));
        // With vp 4: 64 virtual stages of 2 slots, the first and last with one layer.
        let p4 = Parallelism { vp: 4, ..p };
        check(&p4, 126, "t").unwrap();
        let c4 = chunk_layers(&p4, 126);
        assert_eq!((c4.len(), c4[0], c4[63]), (64, (0, 1), (125, 126)));
        assert_eq!(stage_layer_count(&c4, 16, 0), 7);
        assert_eq!(stage_layer_count(&c4, 16, 5), 8);
        // Without the options and vp 1 the remainder stays on the early stages.
        assert_eq!(chunk_layers(&par(3, 1, 3), 8), stage_layers(8, 3));
    }

    #[test]
    fn bad_layouts_are_refused_by_name() {
        let field = |p: Parallelism, layers| {
            let e = check(&p, layers, "f").unwrap_err();
            match e.root() {
                crate::error::Error::Invalid { field, .. } => field.clone(),
                other => panic!("{other:?}"),
            }
        };
        // vp not dividing a stage's layers: 32 layers on PP 4 are 8 a stage.
        assert_eq!(field(par(4, 3, 8), 32), "f: vp");
        // GA not a multiple of PP.
        assert_eq!(field(par(4, 2, 6), 32), "f: ga");
        // vp without a pipeline, vp under GPipe, vp past the limit.
        assert_eq!(field(par(1, 2, 4), 32), "f: vp");
        let g = Parallelism {
            pipeline: PipelineKind::Gpipe,
            ..par(2, 2, 4)
        };
        assert_eq!(field(g, 32), "f: vp");
        assert_eq!(field(par(2, MAX_VP + 1, 4), 32), "f: vp");
        assert_eq!(field(par(2, 0, 4), 32), "f: vp");
        // An uneven slot count.
        let e = Parallelism {
            account_for_embedding: true,
            ..par(4, 1, 4)
        };
        assert_eq!(field(e, 32), "f: pp");
        check(&par(4, 2, 8), 32, "f").unwrap();
        check(&par(3, 1, 3), 32, "f").unwrap();
    }

    #[test]
    fn held_layers_follow_the_order() {
        // One chunk: in flight × the stage's layers (1F1B, stage 0 of 4: 4 micro-batches).
        let p = par(4, 1, 8);
        let c = chunk_layers(&p, 32);
        assert_eq!(held_layers(&p, &c, 0), 4 * 8);
        assert_eq!(held_layers(&p, &c, 3), 8);
        // Interleaved PP 2, vp 2, GA 4, 8 layers (2 a chunk): stage 0 runs 5 forwards
        // before its first backward (F0.0 F1.0 F0.1 F1.1 F2.0): 10 layers.
        let q = par(2, 2, 4);
        let cq = chunk_layers(&q, 8);
        assert_eq!(held_layers(&q, &cq, 0), 10);
        // Stage 1: F0.0 F1.0 F0.1 then B0.1 F1.1 ...: 3 chunks of 2 layers.
        assert_eq!(held_layers(&q, &cq, 1), 6);
    }
}
