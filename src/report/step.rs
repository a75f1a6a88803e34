//! Per-step metrics of a simulated training step: iteration time, tokens/s, MFU, per-GPU
//! busy/idle split, pipeline bubble, the straggler, per-micro-batch forward time and
//! per-rank memory — and their CSV / Markdown forms.
//!
//! Time split of one GPU over the step (they sum to the iteration time):
//! - compute: its compute stream is running a kernel;
//! - exposed communication: a transfer of its own is in flight (collective after every
//!   part arrived, or a pipeline send) and no kernel runs;
//! - sync wait: it has arrived at a collective the other ranks have not reached yet, and
//!   neither a kernel nor a transfer of its own runs — the cost of skew;
//! - idle: everything else (pipeline bubbles, waiting for a previous stage).
//!
//! The pipeline bubble fraction is the mean idle share over GPUs. The straggler is the
//! GPU with the most compute; "by how much" is its compute over the mean compute, minus 1.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::cost::memory::MemoryBreakdown;
use crate::cost::CostModel;
use crate::engine::{Graph, OpKind, StreamId, Timeline};
use crate::net::Ps;
use crate::schedule::step::StepGraph;
use crate::schedule::Coords;

/// One GPU's step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuStats {
    /// Global GPU id.
    pub gpu: u32,
    /// Its node.
    pub node: u32,
    /// Its rank coordinates.
    pub coords: Coords,
    /// Kernel time, ps.
    pub compute: Ps,
    /// Communication not hidden behind compute, ps.
    pub exposed_comm: Ps,
    /// Waiting at collectives for other ranks, ps.
    pub sync_wait: Ps,
    /// Other idle time (bubbles), ps.
    pub idle: Ps,
    /// Peak memory by kind.
    pub memory: MemoryBreakdown,
    /// Peak memory fits the GPU.
    pub fits: bool,
}

/// The forward time of one micro-batch on one stage of one replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MicroBatchTime {
    /// Replica.
    pub replica: u32,
    /// Pipeline stage.
    pub stage: u32,
    /// Micro-batch.
    pub mb: u32,
    /// From the first forward kernel to the last, over the CP group, ps.
    pub fwd_span: Ps,
}

/// Everything measured in one step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    /// Step index.
    pub step: u64,
    /// Iteration time, ps.
    pub iteration: Ps,
    /// Non-padding tokens.
    pub tokens: u64,
    /// Tokens per second.
    pub tokens_per_s: f64,
    /// Model FLOPs utilisation.
    pub mfu: f64,
    /// Mean idle share (pipeline bubbles).
    pub bubble_fraction: f64,
    /// Mean sync-wait share (skew).
    pub wait_fraction: f64,
    /// Mean exposed-communication share.
    pub exposed_comm_fraction: f64,
    /// The GPU with the most compute.
    pub straggler_gpu: u32,
    /// Its compute over the mean, minus 1.
    pub straggler_excess: f64,
    /// GPUs whose peak memory exceeds the capacity.
    pub infeasible_ranks: u32,
    /// Events the engine processed.
    pub events: u64,
    /// Per GPU.
    pub gpus: Vec<GpuStats>,
    /// Per (replica, stage, micro-batch).
    pub microbatches: Vec<MicroBatchTime>,
}

/// A time interval [start, end), ps.
pub type Iv = (Ps, Ps);

/// Sort and merge `v` into disjoint intervals. The lists here are a few sorted runs (one
/// per stream), which the stable sort merges in linear time per run.
fn union(v: &mut Vec<Iv>) {
    v.retain(|&(a, b)| b > a);
    v.sort();
    let mut w = 0;
    for i in 0..v.len() {
        if w > 0 && v[i].0 <= v[w - 1].1 {
            v[w - 1].1 = v[w - 1].1.max(v[i].1);
        } else {
            v[w] = v[i];
            w += 1;
        }
    }
    v.truncate(w);
}

fn measure(v: &[Iv]) -> Ps {
    v.iter().map(|&(a, b)| b - a).sum()
}

/// Measure of `a \ b`, both sorted and disjoint.
fn minus(a: &[Iv], b: &[Iv]) -> Ps {
    let mut total = 0;
    let mut j = 0;
    for &(s, e) in a {
        let mut cur = s;
        while j < b.len() && b[j].1 <= cur {
            j += 1;
        }
        let mut k = j;
        while cur < e {
            if k < b.len() && b[k].0 < e {
                if b[k].0 > cur {
                    total += b[k].0 - cur;
                }
                cur = cur.max(b[k].1);
                k += 1;
            } else {
                total += e - cur;
                cur = e;
            }
        }
    }
    total
}

/// The part of sorted, disjoint `v` from `t0` on, cut off `v`.
fn cut_at(v: &mut Vec<Iv>, t0: Ps) -> Vec<Iv> {
    let i = v.partition_point(|&(_, b)| b <= t0);
    let mut tail = v.split_off(i);
    if let Some(first) = tail.first_mut().filter(|x| x.0 < t0) {
        v.push((first.0, t0));
        first.0 = t0;
    }
    tail
}

/// One GPU's time split over some stretch of the step (see the module's definitions);
/// splits of disjoint stretches add up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuTimes {
    /// Kernel time, ps.
    pub compute: Ps,
    /// Communication not hidden behind compute, ps.
    pub exposed_comm: Ps,
    /// Waiting at collectives for other ranks, ps.
    pub sync_wait: Ps,
}

impl std::ops::Add for GpuTimes {
    type Output = GpuTimes;
    fn add(self, o: GpuTimes) -> GpuTimes {
        GpuTimes {
            compute: self.compute + o.compute,
            exposed_comm: self.exposed_comm + o.exposed_comm,
            sync_wait: self.sync_wait + o.sync_wait,
        }
    }
}

/// One GPU's intervals: kernels running, transfers of its own in flight, and waits at
/// collectives for other ranks. Filled stream by stream ([`GpuSpans::add_stream`]), then
/// merged; a merged set cut at a time ([`GpuSpans::cut_at`]) gives two stretches whose
/// [`GpuTimes`] add up to the whole's, so the stretch after a time can take more streams'
/// intervals later.
#[derive(Clone, Debug, Default)]
pub struct GpuSpans {
    comp: Vec<Iv>,
    act: Vec<Iv>,
    wait: Vec<Iv>,
}

impl GpuSpans {
    /// Empty, keeping the lists' room.
    pub fn clear(&mut self) {
        self.comp.clear();
        self.act.clear();
        self.wait.clear();
    }

    /// Stream `s` of `g` as timed by `t` (`compute`: the GPU's compute stream); each
    /// forward kernel of micro-batch mb < `fwd.len()` widens `fwd[mb]` (first start, last
    /// end).
    pub fn add_stream(
        &mut self,
        g: &Graph,
        t: &Timeline,
        xs: Option<&[Ps]>,
        s: StreamId,
        compute: bool,
        fwd: &mut [Iv],
    ) {
        for &o in g.stream_ops(s) {
            let op = &g.ops[o as usize];
            let (st, en) = (t.start[o as usize], t.end[o as usize]);
            let l = op.label();
            if l.class.is_forward_compute() {
                if let Some(f) = fwd.get_mut(usize::from(l.mb)) {
                    *f = (f.0.min(st), f.1.max(en));
                }
            }
            match op.kind() {
                _ if compute => self.comp.push((st, en)),
                OpKind::Coll(_) => {
                    let cs = xs.map_or_else(|| g.xfer_start(t, o), |v| v[o as usize]);
                    self.wait.push((st, cs));
                    self.act.push((cs, en));
                }
                _ => self.act.push((st, en)),
            }
        }
    }

    /// Merge each list into disjoint intervals.
    pub fn merge(&mut self) {
        union(&mut self.comp);
        union(&mut self.act);
        union(&mut self.wait);
    }

    /// The merged intervals from `t0` on, cut off these.
    pub fn cut_at(&mut self, t0: Ps) -> GpuSpans {
        GpuSpans {
            comp: cut_at(&mut self.comp, t0),
            act: cut_at(&mut self.act, t0),
            wait: cut_at(&mut self.wait, t0),
        }
    }

    /// The time split of the merged intervals (`ca`: scratch).
    pub fn times(&self, ca: &mut Vec<Iv>) -> GpuTimes {
        ca.clear();
        ca.extend_from_slice(&self.comp);
        ca.extend_from_slice(&self.act);
        union(ca);
        GpuTimes {
            compute: measure(&self.comp),
            exposed_comm: minus(&self.act, &self.comp),
            sync_wait: minus(&self.wait, ca),
        }
    }
}

/// One GPU's time split, and per micro-batch of its replica the first start and last end
/// of its forward compute (`(Ps::MAX, 0)` when it has none). `xs`: `Graph::xfer_starts`.
fn measure_gpu(
    sg: &StepGraph,
    t: &Timeline,
    xs: Option<&[Ps]>,
    gpu: u32,
    (w, ca): &mut (GpuSpans, Vec<Iv>),
) -> (GpuTimes, Vec<Iv>) {
    let mut fwd = vec![(Ps::MAX, 0); sg.map.par.ga as usize];
    w.clear();
    let s0 = sg.streams_per_gpu * gpu;
    for s in s0..s0 + sg.streams_per_gpu {
        w.add_stream(&sg.graph, t, xs, s, s == s0, &mut fwd);
    }
    w.merge();
    (w.times(ca), fwd)
}

/// Measure the step. GPUs are measured in parallel and gathered in GPU order; the
/// micro-batch spans are a min / max over GPUs, so the report is the same at any thread
/// count.
pub fn step_report(sg: &StepGraph, t: &Timeline, cost: &CostModel, step: u64) -> StepReport {
    step_report_with(sg, t, cost, step, |_| ()).0
}

/// [`step_report`], and `also(gpu)` of every GPU, run on the thread that has just measured
/// that GPU (so a second look at its ops finds them in cache), gathered in GPU order.
pub fn step_report_with<X: Send>(
    sg: &StepGraph,
    t: &Timeline,
    cost: &CostModel,
    step: u64,
    also: impl Fn(u32) -> X + Sync,
) -> (StepReport, Vec<X>) {
    let xs = sg.graph.xfer_starts(t);
    let (measured, extra): (Vec<(GpuTimes, Vec<Iv>)>, Vec<X>) = (0..sg.map.gpus())
        .into_par_iter()
        .map_init(Default::default, |w, gpu| {
            (measure_gpu(sg, t, xs.as_deref(), gpu, w), also(gpu))
        })
        .unzip();
    (
        report_of(sg, measured, t.makespan, t.events, cost, step),
        extra,
    )
}

/// The step's report from each GPU's time split and forward spans per micro-batch (in GPU
/// order), the makespan and the events; `sg` gives the layout, tokens and memory (its
/// graph is not read).
pub fn report_of(
    sg: &StepGraph,
    measured: Vec<(GpuTimes, Vec<Iv>)>,
    span: Ps,
    events: u64,
    cost: &CostModel,
    step: u64,
) -> StepReport {
    let map = sg.map;
    let n = map.gpus();
    let cap = cost.hw.memory_bytes;
    // Per micro-batch forward spans.
    let par = map.par;
    let key = |c: Coords, mb: u32| ((c.pp * par.dp + c.dp) * par.ga + mb) as usize;
    let nk = (par.pp * par.dp * par.ga) as usize;
    let (mut lo, mut hi) = (vec![Ps::MAX; nk], vec![0; nk]);
    let mut gpus = Vec::with_capacity(n as usize);
    for (gpu, (tm, fwd)) in (0..n).zip(measured) {
        let coords = map.coords(gpu);
        for (mb, &(a, b)) in fwd.iter().enumerate() {
            let k = key(coords, mb as u32);
            lo[k] = lo[k].min(a);
            hi[k] = hi[k].max(b);
        }
        let memory = sg.memory.get(gpu as usize).copied().unwrap_or_default();
        gpus.push(GpuStats {
            gpu,
            node: map.place.node(gpu),
            coords,
            compute: tm.compute,
            exposed_comm: tm.exposed_comm,
            sync_wait: tm.sync_wait,
            idle: span.saturating_sub(tm.compute + tm.exposed_comm + tm.sync_wait),
            memory,
            fits: memory.total() <= cap,
        });
    }
    let mut microbatches = Vec::with_capacity(nk);
    for pp in 0..par.pp {
        for dp in 0..par.dp {
            for mb in 0..par.ga {
                let k = key(
                    Coords {
                        pp,
                        dp,
                        cp: 0,
                        tp: 0,
                    },
                    mb,
                );
                microbatches.push(MicroBatchTime {
                    replica: dp,
                    stage: pp,
                    mb,
                    fwd_span: hi[k].saturating_sub(lo[k].min(hi[k])),
                });
            }
        }
    }
    let secs = span as f64 * 1e-12;
    let denom = (span as f64).max(1.0) * f64::from(n.max(1));
    let frac = |f: fn(&GpuStats) -> Ps| gpus.iter().map(|x| f(x) as f64).sum::<f64>() / denom;
    let mean_compute = gpus.iter().map(|x| x.compute as f64).sum::<f64>() / f64::from(n.max(1));
    let (straggler_gpu, max_c) = gpus.iter().fold((0, 0), |(bg, bc), x| {
        if x.compute > bc {
            (x.gpu, x.compute)
        } else {
            (bg, bc)
        }
    });
    let flops = cost.model_flops(sg.tokens, &sg.class_pairs);
    StepReport {
        step,
        iteration: span,
        tokens: sg.tokens,
        tokens_per_s: if secs > 0.0 {
            sg.tokens as f64 / secs
        } else {
            0.0
        },
        mfu: if secs > 0.0 {
            flops / (secs * f64::from(n) * cost.hw.peak_tflops * 1e12)
        } else {
            0.0
        },
        bubble_fraction: frac(|x| x.idle),
        wait_fraction: frac(|x| x.sync_wait),
        exposed_comm_fraction: frac(|x| x.exposed_comm),
        straggler_gpu,
        straggler_excess: if mean_compute > 0.0 {
            max_c as f64 / mean_compute - 1.0
        } else {
            0.0
        },
        infeasible_ranks: gpus.iter().filter(|x| !x.fits).count() as u32,
        events,
        gpus,
        microbatches,
    }
}

/// Milliseconds with microsecond precision, formatted exactly from integer ps.
pub fn ms(ps: Ps) -> String {
    format!("{}.{:06}", ps / 1_000_000_000, (ps % 1_000_000_000) / 1_000)
}

/// One row per step.
pub fn steps_csv(steps: &[StepReport]) -> String {
    let mut s = String::from("step,iteration_ms,tokens,tokens_per_s,mfu,bubble_fraction,wait_fraction,exposed_comm_fraction,straggler_gpu,straggler_excess,infeasible_ranks,events\n");
    for r in steps {
        s += &format!(
            "{},{},{},{:.1},{:.6},{:.6},{:.6},{:.6},{},{:.6},{},{}\n",
            r.step,
            ms(r.iteration),
            r.tokens,
            r.tokens_per_s,
            r.mfu,
            r.bubble_fraction,
            r.wait_fraction,
            r.exposed_comm_fraction,
            r.straggler_gpu,
            r.straggler_excess,
            r.infeasible_ranks,
            r.events
        );
    }
    s
}

/// One row per GPU of one step.
pub fn gpus_csv(r: &StepReport) -> String {
    let mut s = String::from("step,gpu,node,pp,dp,cp,compute_ms,exposed_comm_ms,sync_wait_ms,idle_ms,mem_weights_gib,mem_grads_gib,mem_optimizer_gib,mem_activations_gib,mem_attn_buffers_gib,mem_comm_buffers_gib,mem_total_gib,fits\n");
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    for g in &r.gpus {
        let m = g.memory;
        s += &format!(
            "{},{},{},{},{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{}\n",
            r.step,
            g.gpu,
            g.node,
            g.coords.pp,
            g.coords.dp,
            g.coords.cp,
            ms(g.compute),
            ms(g.exposed_comm),
            ms(g.sync_wait),
            ms(g.idle),
            gib(m.weights),
            gib(m.grads),
            gib(m.optimizer),
            gib(m.activations),
            gib(m.attn_buffers),
            gib(m.comm_buffers),
            gib(m.total()),
            g.fits
        );
    }
    s
}

/// One row per micro-batch.
pub fn microbatches_csv(steps: &[StepReport]) -> String {
    let mut s = String::from("step,replica,stage,mb,fwd_ms\n");
    for r in steps {
        for m in &r.microbatches {
            s += &format!(
                "{},{},{},{},{}\n",
                r.step,
                m.replica,
                m.stage,
                m.mb,
                ms(m.fwd_span)
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::ModelConfig;
    use crate::engine::run;
    use crate::engine::stub_net::StubNet;
    use crate::schedule::step::build_step;
    use crate::schedule::{NoVariance, Parallelism, PipelineKind, Placement, Precision, RankMap};
    use crate::workload::PackedSeq;

    #[test]
    fn interval_algebra_by_hand() {
        let mut v = vec![(5, 7), (0, 2), (1, 3), (9, 9)];
        union(&mut v);
        assert_eq!(v, vec![(0, 3), (5, 7)]);
        assert_eq!(measure(&v), 5);
        assert_eq!(minus(&[(0, 10)], &[(2, 3), (5, 7)]), 7);
        assert_eq!(minus(&[(0, 4), (6, 10)], &[(3, 7)]), 6);
        assert_eq!(minus(&[(2, 3)], &[(0, 10)]), 0);
        assert_eq!(ms(1_234_567_890_123), "1234.567890");
    }

    fn seq(lens: &[u32], cap: u32) -> PackedSeq {
        PackedSeq::from_lengths(lens, cap, 0)
    }

    #[test]
    fn time_split_sums_and_skew_shows_as_wait() {
        let cost = CostModel::h200(ModelConfig::builtin("qwen3-30b-a3b").unwrap()).unwrap();
        let par = Parallelism {
            dp: 2,
            pp: 1,
            cp: 8,
            ga: 2,
            pipeline: PipelineKind::OneFOneB,
            recompute: false,
            zero_stage: 3,
            dp_buckets: 8,
            tp: 1,
            sp: true,
            tp_overlap: false,
            ep: 1,
            moe_hot_share: 0.0,
            precision: Precision::Bf16,
        };
        let map = RankMap::new(par, Placement::new(8, 2), "t").unwrap();
        let light = seq(&[1024; 32], 32_768);
        let heavy = seq(&[32_768], 32_768);
        let batch = vec![
            vec![light.clone(), light.clone()],
            vec![heavy.clone(), light.clone()],
        ];
        let sg = build_step(&cost, map, &batch, 0, &NoVariance).unwrap();
        let t = run(&sg.graph, &mut StubNet::dgx_h200()).unwrap();
        let r = step_report(&sg, &t, &cost, 0);
        for g in &r.gpus {
            assert_eq!(
                g.compute + g.exposed_comm + g.sync_wait + g.idle,
                r.iteration,
                "gpu {}",
                g.gpu
            );
        }
        // Replica 0 (light) waits for replica 1 (heavy) at the all-reduce.
        assert!(r.gpus[0].sync_wait > 0 && r.gpus[8].sync_wait == 0);
        assert!(r.straggler_gpu >= 8 && r.straggler_excess > 0.0);
        assert_eq!(r.tokens, 4 * 32_768);
        assert!(r.mfu > 0.0 && r.mfu < 1.0, "{}", r.mfu);
        assert_eq!(r.microbatches.len(), 4);
        // The heavy micro-batch's forward takes longer than a light one's.
        assert!(r.microbatches[2].fwd_span > r.microbatches[0].fwd_span);
        assert_eq!(r.infeasible_ranks, 0, "{:?}", r.gpus[0].memory);
        let csv = gpus_csv(&r);
        assert_eq!(csv.lines().count(), 17);
        // Without sharding, 30.5B parameters with fp32 grads and Adam (18 B/param) do
        // not fit 141 GB: every rank is flagged.
        let unsharded = RankMap::new(
            Parallelism {
                zero_stage: 0,
                ..par
            },
            map.place,
            "t",
        )
        .unwrap();
        let sg0 = build_step(&cost, unsharded, &batch, 0, &NoVariance).unwrap();
        let r0 = step_report(
            &sg0,
            &run(&sg0.graph, &mut StubNet::dgx_h200()).unwrap(),
            &cost,
            0,
        );
        assert_eq!(r0.infeasible_ranks, 16);
        assert!(r0.gpus[0].memory.total() > 18 * 30_000_000_000);
    }

    /// Same experiment twice ⇒ byte-identical CSV and trace.
    #[test]
    fn same_run_twice_is_byte_identical() {
        use crate::schedule::train::{simulate_step, Workload};
        let cost = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
        let par = Parallelism {
            dp: 2,
            pp: 2,
            cp: 4,
            ga: 3,
            pipeline: PipelineKind::OneFOneB,
            recompute: false,
            zero_stage: 1,
            dp_buckets: 4,
            tp: 1,
            sp: true,
            tp_overlap: false,
            ep: 1,
            moe_hot_share: 0.0,
            precision: Precision::Bf16,
        };
        let map = RankMap::new(par, Placement::new(8, 2), "t").unwrap();
        let wl = Workload::Corpus {
            corpus: crate::workload::corpus::Corpus::from_spec("lognormal:mu=6.68,sigma=1.5")
                .unwrap(),
            seq_len: 16_384,
            packing: crate::workload::pack::Packing::Sequential,
            seed: 5,
        };
        let once = || {
            let mut out = Vec::new();
            let mut reps = Vec::new();
            for step in 0..2 {
                let (sg, t) =
                    simulate_step(&cost, map, &wl, step, &mut StubNet::dgx_h200(), &NoVariance)
                        .unwrap();
                let r = step_report(&sg, &t, &cost, step);
                out.push(gpus_csv(&r));
                out.push(crate::report::trace::chrome_trace(&sg, &t, 0));
                reps.push(r);
            }
            out.push(steps_csv(&reps));
            out.push(microbatches_csv(&reps));
            out
        };
        let (a, b) = (once(), once());
        assert_eq!(a, b);
        // And the two steps differ (different batches), so the test can fail.
        assert_ne!(a[0].replace("\n0,", "\n1,"), a[2]);
    }

    /// A pipeline of 4 stages and 8 micro-batches on a network with no cost: the bubble is
    /// close to the textbook (p − 1)/(m + p − 1) for both schedules, which take the same
    /// time, and 1F1B keeps fewer micro-batches of activations alive than GPipe.
    #[test]
    fn pipeline_bubble_matches_the_textbook_fraction() {
        let cost = CostModel::h200(ModelConfig::builtin("llama-34b").unwrap()).unwrap();
        let s = seq(&[4096, 4096], 8192);
        let run_kind = |pipeline| {
            let par = Parallelism {
                dp: 1,
                pp: 4,
                cp: 1,
                ga: 8,
                pipeline,
                recompute: false,
                zero_stage: 0,
                dp_buckets: 1,
                tp: 1,
                sp: true,
                tp_overlap: false,
                ep: 1,
                moe_hot_share: 0.0,
                precision: Precision::Bf16,
            };
            let map = RankMap::new(par, Placement::new(1, 4), "t").unwrap();
            let sg = build_step(&cost, map, &[vec![s.clone(); 8]], 0, &NoVariance).unwrap();
            let t = run(&sg.graph, &mut StubNet::new(1, 0, 1e30, 1e30)).unwrap();
            (step_report(&sg, &t, &cost, 0), sg.memory[0].activations)
        };
        let (g, g_act) = run_kind(PipelineKind::Gpipe);
        let (f, f_act) = run_kind(PipelineKind::OneFOneB);
        let textbook = 3.0 / 11.0;
        // The last stage also runs the LM head, so stages are not exactly equal.
        assert!(
            (g.bubble_fraction - textbook).abs() < 0.03,
            "{}",
            g.bubble_fraction
        );
        assert!(
            (f.bubble_fraction - textbook).abs() < 0.03,
            "{}",
            f.bubble_fraction
        );
        let rel = (g.iteration as f64 - f.iteration as f64).abs() / g.iteration as f64;
        assert!(rel < 0.01, "{} vs {}", g.iteration, f.iteration);
        assert_eq!(
            g_act,
            2 * f_act,
            "GPipe holds 8 micro-batches on stage 0, 1F1B holds 4"
        );
        assert_eq!(g.wait_fraction, 0.0);
    }
}
