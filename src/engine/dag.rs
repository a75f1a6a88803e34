//! The exact fast path: a graph timed as a DAG, with no event queue.
//!
//! When the network model fixes each transfer's duration by the transfer alone
//! ([`FixedDurations`]: the analytical model, the stub), nothing in a step depends on the
//! order in which simultaneous events are handled, and every time is a max-plus function of
//! earlier ones:
//! - an op starts at the latest end among its stream predecessor and its dependencies (a
//!   collective part: its arrival);
//! - a compute op ends its duration later, a send its transfer's duration later;
//! - a whole-group collective's transfers start at its last arrival and every part ends
//!   the collective's latency after the last one lands (no transfer: after the last
//!   arrival);
//! - a grouped send/recv part's transfers start at the last arrival among it and its peers,
//!   the part drains when they have landed, and it ends when it and every peer have
//!   drained.
//!
//! A grouped send/recv is first swept whole: once all its parts have arrived (in the
//! sweep's order, not in time) one pass takes every part's start, drain and end from its
//! peers' times, with no counter per peer. The times are the same max-plus values; only
//! where a part's end leads to another part's arrival of the same collective can that
//! order not finish, and then the graph is swept again part by part.
//!
//! [`run_dag`] evaluates these in topological order (Kahn): the event engine's timeline to
//! the picosecond, with the same transfer durations (the model's one
//! [`FixedDurations::duration`], called with the same tags, or, when the model's durations
//! ignore tags, [`FixedDurations::tag_free`], once per shared transfer list and once per
//! grouped send/recv part's share of one) and the same event count.
//!
//! # Parallelism
//! The sweep runs in rounds. The ops ready at the start of a round are processed in parallel
//! (rayon); each follows its stream as long as the next op becomes ready, and the ops it
//! makes ready elsewhere form the next round. Dependency counters and latest-end times are
//! atomics; `max` and `+` do not care in which order they are applied, so the timeline is
//! the same at any thread count, byte for byte. A frontier of a few ops (a part of a graph
//! timed alone, [`run_dag_within`]) is swept on the calling thread until it grows.
//!
//! Architecture invariant: the same graph and durations give the event engine's timeline;
//! a graph that cannot finish is the same error, naming the same stuck op.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

use rayon::prelude::*;

use super::parts::Layout;
use super::{stuck_error, Graph, OpId, OpKind, Timeline, TAG_COLL, TAG_PART};
use crate::error::Result;
use crate::net::{FixedDurations, Ps};

/// A dependency counter's value once its op has ended.
const DONE: u32 = u32::MAX;

/// Whole-group collectives with more transfers than this take their latest landing in
/// parallel.
const PAR_XFERS: usize = 4096;

/// A graph that is one part of a larger one ([`super::parts`]), timed alone: its transfers
/// take the tags the larger graph's ids give them, and its ops wait for what lies outside
/// it as earliest starts.
#[derive(Clone, Copy)]
pub struct Within<'a> {
    /// Where the larger graph holds the part's ops and collectives.
    pub layout: &'a Layout,
    /// Which part it is.
    pub part: usize,
    /// Per op, its earliest start (the latest end among its dependencies outside the
    /// part); empty for none.
    pub release: &'a [Ps],
}

struct Dag<'a> {
    g: &'a Graph,
    net: &'a dyn FixedDurations,
    within: Option<Within<'a>>,
    /// Per op: what the sweep reads and writes together, in one place ([`Node`]).
    node: Vec<Node>,
    end: Vec<AtomicU64>,
    /// Per collective: parts arrived (whole-group; grouped send/recv swept whole).
    arrived: Vec<AtomicU32>,
    /// Grouped send/recvs are swept whole (else part by part).
    p2p_whole: bool,
    /// Per collective: last arrival (whole-group) or earliest part start (grouped).
    coll_start: Vec<AtomicU64>,
    /// Per grouped send/recv part: arrivals (it and its peers) still awaited, and its own
    /// arrival. The last of them takes the latest arrival over it and its peers (peers are
    /// mutual), so each arrival writes one time and not one per peer.
    part_wait: Vec<AtomicU32>,
    part_arrive: Vec<AtomicU64>,
    /// Per grouped send/recv part: drains (it and its peers) still awaited, and when its
    /// own transfers have landed; the last takes the latest over it and its peers.
    part_end_wait: Vec<AtomicU32>,
    part_drain: Vec<AtomicU64>,
    /// When the durations do not depend on tags ([`FixedDurations::tag_free`]): per
    /// transfer, the longest duration of the whole-group collective's list that starts
    /// there, plus one (0 until known; lists alike are shared, one layer's exchange after
    /// another's); else empty.
    span: Vec<AtomicU64>,
    /// The same per transfer for a grouped send/recv part whose transfers start there:
    /// collectives sharing a list give the part on one GPU the same transfers.
    part_span: Vec<AtomicU64>,
}

/// One op's sweep state, 16 bytes: an op that ends reads its own and, for each successor,
/// that one's, so each is one cache line and not one per field.
struct Node {
    /// The latest end among its ended predecessors (its start once `wait` is 0).
    start: AtomicU64,
    /// Predecessors (stream predecessor and dependencies) not yet ended; `DONE` once the
    /// op has ended.
    wait: AtomicU32,
    /// The op after it on its stream (`DONE` for none).
    after: AtomicU32,
}

impl Dag<'_> {
    /// Run `op` (ready: every predecessor has ended) and the ops of its stream after it
    /// while each becomes ready; push the ops made ready on other streams onto `out`.
    fn follow(&self, op: OpId, out: &mut Vec<OpId>) {
        let mut cur = Some(op);
        while let Some(op) = cur.take() {
            self.run_op(op, &mut cur, out);
        }
    }

    fn run_op(&self, op: OpId, next: &mut Option<OpId>, out: &mut Vec<OpId>) {
        let g = self.g;
        let t = self.node[op as usize].start.load(Relaxed);
        match g.ops[op as usize].kind() {
            OpKind::Compute(d) => self.finish(op, t + d, next, out),
            OpKind::Send(x) => {
                let x = g.xfers[x as usize];
                let id = self.within.map_or(op, |w| w.layout.op(w.part, op));
                let d = self.net.duration(x.src, x.dst, x.bytes, u64::from(id));
                self.finish(op, t.saturating_add(d), next, out);
            }
            OpKind::Coll(c) if g.colls[c as usize].p2p.is_some() => {
                let k = g.part_of(c, op);
                self.part_arrive[k as usize].store(t, Relaxed);
                if self.p2p_whole {
                    let ci = c as usize;
                    if self.arrived[ci].fetch_add(1, AcqRel) + 1 == g.colls[ci].parts {
                        self.run_p2p(c, next, out);
                    }
                    return;
                }
                for q in std::iter::once(k).chain(g.part_nbrs(k).iter().copied()) {
                    if last_of(&self.part_wait[q as usize]) {
                        self.start_part(c, q, next, out);
                    }
                }
            }
            OpKind::Coll(c) => {
                let ci = c as usize;
                self.coll_start[ci].fetch_max(t, Relaxed);
                if self.arrived[ci].fetch_add(1, AcqRel) + 1 == g.colls[ci].parts {
                    let cs = self.coll_start[ci].load(Relaxed);
                    let end = cs
                        .saturating_add(self.span(c))
                        .saturating_add(g.colls[ci].latency);
                    let (a, b) = (
                        g.coll_part_off[ci] as usize,
                        g.coll_part_off[ci + 1] as usize,
                    );
                    for &p in &g.coll_parts[a..b] {
                        self.finish(p, end, next, out);
                    }
                }
            }
        }
    }

    /// The longest duration among whole-group collective `c`'s transfers (0 for none).
    fn span(&self, c: u32) -> Ps {
        let g = self.g;
        let xf = g.coll_xfers(c);
        if xf.is_empty() {
            return 0;
        }
        let memo = self.span.get(g.colls[c as usize].xfer_start as usize);
        memoized(memo, || {
            let id = self.within.map_or(c, |w| w.layout.coll(w.part, c));
            let tag = TAG_COLL | u64::from(id);
            let dur = |x: &super::Xfer| self.net.duration(x.src, x.dst, x.bytes, tag);
            if xf.len() > PAR_XFERS {
                xf.par_iter().map(dur).max()
            } else {
                xf.iter().map(dur).max()
            }
            .unwrap_or(0)
        })
    }

    /// The longest duration among grouped send/recv part `k`'s own transfers (0 for none).
    fn part_span(&self, k: u32) -> Ps {
        let g = self.g;
        let xf = g.part_xfers(k);
        let Some(&first) = xf.first() else {
            return 0;
        };
        memoized(self.part_span.get(first as usize), || {
            let tag = TAG_PART | u64::from(k);
            xf.iter()
                .map(|&x| {
                    let x = g.xfers[x as usize];
                    self.net.duration(x.src, x.dst, x.bytes, tag)
                })
                .max()
                .unwrap_or(0)
        })
    }

    /// The latest of `at` over part `k` and its peers.
    fn latest(&self, at: &[AtomicU64], k: u32) -> Ps {
        std::iter::once(k)
            .chain(self.g.part_nbrs(k).iter().copied())
            .map(|q| at[q as usize].load(Relaxed))
            .max()
            .unwrap_or(0)
    }

    /// Every part of grouped send/recv `c` has arrived: each one's transfers start, land
    /// and drain, then each ends with its peers.
    fn run_p2p(&self, c: u32, next: &mut Option<OpId>, out: &mut Vec<OpId>) {
        let g = self.g;
        let (a, b) = (g.coll_part_off[c as usize], g.coll_part_off[c as usize + 1]);
        // One thread sweeps the collective: its earliest start is stored once.
        let go = (a..b).map(|k| self.drain(k)).min();
        if let Some(go) = go {
            self.coll_start[c as usize].store(go, Relaxed);
        }
        for k in a..b {
            let end = self.latest(&self.part_drain, k);
            self.finish(g.coll_parts[k as usize], end, next, out);
        }
    }

    /// Part `k` of a grouped send/recv and its peers have all arrived: its transfers start
    /// (returned) and land; its drain is noted.
    fn drain(&self, k: u32) -> Ps {
        let go = self.latest(&self.part_arrive, k);
        let drain = go.saturating_add(self.part_span(k));
        self.part_drain[k as usize].store(drain, Relaxed);
        go
    }

    /// Part `k` of grouped send/recv `c` and its peers have all arrived: its transfers
    /// start; once they land it drains, for itself and each peer.
    fn start_part(&self, c: u32, k: u32, next: &mut Option<OpId>, out: &mut Vec<OpId>) {
        let g = self.g;
        let go = self.drain(k);
        self.coll_start[c as usize].fetch_min(go, Relaxed);
        for q in std::iter::once(k).chain(g.part_nbrs(k).iter().copied()) {
            if last_of(&self.part_end_wait[q as usize]) {
                let end = self.latest(&self.part_drain, q);
                self.finish(g.coll_parts[q as usize], end, next, out);
            }
        }
    }

    /// `op` ends at `end`: tell its successors and the next op on its stream.
    fn finish(&self, op: OpId, end: Ps, next: &mut Option<OpId>, out: &mut Vec<OpId>) {
        let g = self.g;
        let oi = op as usize;
        self.end[oi].store(end, Relaxed);
        let me = &self.node[oi];
        me.wait.store(DONE, Relaxed);
        let (a, b) = (g.succ_off[oi] as usize, g.succ_off[oi + 1] as usize);
        let after = Some(me.after.load(Relaxed)).filter(|&s| s != DONE);
        for s in after.into_iter().chain(g.succ[a..b].iter().copied()) {
            let n = &self.node[s as usize];
            let ready = if n.wait.load(Acquire) == 1 {
                // This is its last predecessor (counters only fall, and this one has not
                // counted yet): nobody else touches it, so no read-modify-write.
                let t = n.start.load(Relaxed).max(end);
                n.start.store(t, Relaxed);
                n.wait.store(0, Relaxed);
                true
            } else {
                n.start.fetch_max(end, Relaxed);
                n.wait.fetch_sub(1, AcqRel) == 1
            };
            if ready {
                if next.is_none() {
                    *next = Some(s);
                } else {
                    out.push(s);
                }
            }
        }
    }
}

/// `memo`'s value less one when set, else `f()`, noted in `memo` (when there is one and the
/// value fits). Every thread that computes it finds the same value.
fn memoized(memo: Option<&AtomicU64>, f: impl FnOnce() -> Ps) -> Ps {
    if let Some(s) = memo.map(|m| m.load(Relaxed)).filter(|&s| s > 0) {
        return s - 1;
    }
    let s = f();
    if let (Some(m), true) = (memo, s < Ps::MAX) {
        m.store(s + 1, Relaxed);
    }
    s
}

/// Count one down on `w`; true when that was the last. The last count skips the
/// read-modify-write: counters only fall, so one that reads 1 before this count is touched
/// by nobody else. Acquire (or the RMW's) sees what every earlier count published.
fn last_of(w: &AtomicU32) -> bool {
    if w.load(Acquire) == 1 {
        w.store(0, Relaxed);
        true
    } else {
        w.fetch_sub(1, AcqRel) == 1
    }
}

fn atomics64(n: usize, x: u64) -> Vec<AtomicU64> {
    (0..n).into_par_iter().map(|_| AtomicU64::new(x)).collect()
}

fn plain64(v: Vec<AtomicU64>) -> Vec<u64> {
    v.into_iter().map(AtomicU64::into_inner).collect()
}

/// Frontiers smaller than this are swept on the calling thread, until they grow to
/// [`PAR_FRONTIER`] (a part timed alone, a narrow stretch of a whole graph).
const SEQ_FRONTIER: usize = 64;
const PAR_FRONTIER: usize = 256;

/// Time `g` with the fixed transfer durations of `net` by one sweep in topological order;
/// the same timeline (and error) as the event engine, [`super::run_events`].
pub fn run_dag(g: &Graph, net: &dyn FixedDurations) -> Result<Timeline> {
    sweep(g, net, None)
}

/// [`run_dag`] of a part of a larger graph ([`Within`]): the part's ops timed as in the
/// larger graph, given the ends of their dependencies outside it. A grouped send/recv
/// part's tag is its index in `g` (a graph with such collectives is timed whole).
pub fn run_dag_within(g: &Graph, net: &dyn FixedDurations, within: Within<'_>) -> Result<Timeline> {
    sweep(g, net, Some(within))
}

fn sweep(g: &Graph, net: &dyn FixedDurations, within: Option<Within<'_>>) -> Result<Timeline> {
    let whole = g.part_count() > 0;
    match sweep_as(g, net, within, whole) {
        Err(Stuck(..)) if whole => sweep_as(g, net, within, false),
        r => r,
    }
    .map_err(|Stuck(s, op)| stuck_error(g, s, op))
}

/// A sweep that did not finish: the first stream with an op that never ran, and that op.
struct Stuck(u32, OpId);

/// [`sweep`] with grouped send/recvs swept whole (`p2p_whole`) or part by part.
fn sweep_as(
    g: &Graph,
    net: &dyn FixedDurations,
    within: Option<Within<'_>>,
    p2p_whole: bool,
) -> std::result::Result<Timeline, Stuck> {
    let n = g.ops.len();
    let nc = g.colls.len();
    let np = g.part_count();
    let release = within.map_or(&[][..], |w| w.release);
    let node = nodes(g, release);
    // Only a stream's first op can be ready at once.
    let mut frontier: Vec<OpId> = stream_lists(g)
        .filter_map(|s| s.first().copied())
        .filter(|&op| g.ndeps[op as usize] == 0)
        .collect();
    frontier.sort_unstable();
    let peers = |k: u32| 1 + g.part_nbrs(k).len() as u32;
    let counters = |np: u32| -> Vec<AtomicU32> {
        if p2p_whole {
            Vec::new()
        } else {
            (0..np).map(|k| AtomicU32::new(peers(k))).collect()
        }
    };
    let memo = |n: usize| {
        if net.tag_free() {
            atomics64(n, 0)
        } else {
            Vec::new()
        }
    };
    let dag = Dag {
        g,
        net,
        within,
        node,
        end: atomics64(n, 0),
        arrived: (0..nc).map(|_| AtomicU32::new(0)).collect(),
        coll_start: g
            .colls
            .iter()
            .map(|c| {
                AtomicU64::new(if c.p2p.is_some() && c.parts > 0 {
                    Ps::MAX
                } else {
                    0
                })
            })
            .collect(),
        p2p_whole,
        part_wait: counters(np as u32),
        part_arrive: atomics64(np, 0),
        part_end_wait: counters(np as u32),
        part_drain: atomics64(np, 0),
        span: memo(g.xfers.len()),
        part_span: memo(if np > 0 { g.xfers.len() } else { 0 }),
    };
    while !frontier.is_empty() {
        if frontier.len() < SEQ_FRONTIER {
            let mut out = Vec::new();
            while let Some(op) = frontier.pop() {
                dag.follow(op, &mut out);
                frontier.append(&mut out);
                if frontier.len() >= PAR_FRONTIER {
                    break;
                }
            }
            continue;
        }
        let rounds: Vec<Vec<OpId>> = frontier
            .par_iter()
            .fold(Vec::new, |mut out, &op| {
                dag.follow(op, &mut out);
                out
            })
            .collect();
        frontier = rounds.concat();
    }
    // An op ends only after its stream predecessor, so every op has ended when every
    // stream's last op has.
    let done = |op: &OpId| dag.node[*op as usize].wait.load(Relaxed) == DONE;
    let finished = stream_lists(g).all(|s| s.last().is_none_or(done));
    for s in (0..g.streams.len() as u32).filter(|_| !finished) {
        if let Some(&op) = g
            .stream_ops(s)
            .iter()
            .find(|&&o| dag.node[o as usize].wait.load(Relaxed) != DONE)
        {
            return Err(Stuck(s, op));
        }
    }
    let events = event_count(g);
    let Dag {
        node,
        end,
        coll_start,
        ..
    } = dag;
    let start: Vec<Ps> = node.into_par_iter().map(|x| x.start.into_inner()).collect();
    let end = plain64(end);
    // An op ends no earlier than its stream predecessor: the latest end is a stream's
    // last op's.
    let makespan = stream_lists(g)
        .filter_map(|s| s.last())
        .map(|&op| end[op as usize])
        .max()
        .unwrap_or(0);
    Ok(Timeline {
        start,
        end,
        coll_start: plain64(coll_start),
        makespan,
        events,
    })
}

/// Per op of `g`, its [`Node`] before the sweep: its earliest start (`release`'s entry, 0
/// when empty), its predecessors (a stream's ops after its first also wait for the one
/// before) and the op after it on its stream.
fn nodes(g: &Graph, release: &[Ps]) -> Vec<Node> {
    let node: Vec<Node> = g
        .ndeps
        .par_iter()
        .enumerate()
        .map(|(i, &d)| Node {
            start: AtomicU64::new(release.get(i).copied().unwrap_or(0)),
            wait: AtomicU32::new(d + 1),
            after: AtomicU32::new(DONE),
        })
        .collect();
    (0..g.streams.len() as u32).into_par_iter().for_each(|s| {
        let ops = g.stream_ops(s);
        if let Some(&first) = ops.first() {
            node[first as usize].wait.fetch_sub(1, Relaxed);
        }
        for w in ops.windows(2) {
            node[w[0] as usize].after.store(w[1], Relaxed);
        }
    });
    node
}

/// Every stream's ops in issue order.
fn stream_lists(g: &Graph) -> impl Iterator<Item = &[OpId]> {
    (0..g.streams.len() as u32).map(|s| g.stream_ops(s))
}

/// The events the event engine processes on a graph that finishes: one per compute op and
/// per transfer (every op but a collective's parts is a compute op or a send), and one for
/// each collective or grouped part without transfers.
fn event_count(g: &Graph) -> u64 {
    let ops = (g.ops.len() - g.coll_parts.len()) as u64;
    let colls: u64 = (0..g.colls.len())
        .into_par_iter()
        .map(|ci| {
            let c = &g.colls[ci];
            if c.p2p.is_some() {
                (g.coll_part_off[ci]..g.coll_part_off[ci + 1])
                    .map(|k| g.part_xfers(k).len().max(1) as u64)
                    .sum()
            } else if c.parts > 0 {
                u64::from(c.xfer_len.max(1)) + u64::from(c.latency > 0 && c.xfer_len > 0)
            } else {
                0
            }
        })
        .sum();
    ops + colls
}
