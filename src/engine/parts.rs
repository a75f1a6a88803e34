//! A graph built in parts: ops emitted apart (each part by its own thread, with its own ids
//! and streams) and laid out as one builder emitting them phase by phase would have.
//!
//! Every part records a [`Mark`] at the end of each phase, and all parts have the same
//! phases. [`assemble`] places phase k's ops of part 0, then of part 1, …, after every op
//! of phase k − 1, and does the same for collectives, transfers and grouped send/recv
//! pairs; every id an op or collective holds is translated. So a schedule that emits
//! phase by phase and, inside a phase, part after part gets the same [`super::Graph`] from
//! parts built in parallel as from one builder, whatever the number of threads.
//!
//! A stream's ops must all lie in one part (each part links its own streams); dependencies
//! between parts are added after assembly ([`Layout::op`] gives the ids). [`Layout`] alone gives
//! a part's ids in the graph from every part's marks, to time a part without assembling.

use rayon::prelude::*;

use super::{
    CollId, CollInfo, Graph, GraphBuilder, Op, OpId, StreamId, StreamInfo, TAG_COLL_OP, TAG_SEND,
};
use crate::error::{invalid, Result};

/// How far a builder has got: its ops, collectives, transfers and grouped send/recv pairs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    ops: u32,
    colls: u32,
    xfers: u32,
    pairs: u32,
}

impl GraphBuilder {
    /// The end of the phase emitted so far (for [`assemble`]).
    pub fn mark(&self) -> Mark {
        let g = &self.g;
        Mark {
            ops: g.ops.len() as u32,
            colls: g.colls.len() as u32,
            xfers: g.xfers.len() as u32,
            pairs: g.p2p_pairs.len() as u32,
        }
    }

    /// The streams added so far.
    pub fn streams(&self) -> &[StreamInfo] {
        &self.g.streams
    }
}

/// One part of a graph built apart.
pub struct Part {
    /// The part's ops, collectives and transfers, with its own ids and streams.
    pub b: GraphBuilder,
    /// The end of each phase (the ops after the last mark form one more phase).
    pub marks: Vec<Mark>,
    /// The graph's stream of each of the part's streams.
    pub streams: Vec<StreamId>,
}

/// One id space laid out: segment s = phase · parts + part starts at `local[s]` in its part
/// and at `global[s]` in the graph (`global` has one more entry: the total).
struct Space {
    local: Vec<u32>,
    global: Vec<u64>,
}

impl Space {
    fn new(marks: &[Vec<Mark>], f: impl Fn(&Mark) -> u32) -> Space {
        let (np, nk) = (marks.len(), marks.first().map_or(0, Vec::len));
        let (mut local, mut global) =
            (Vec::with_capacity(np * nk), Vec::with_capacity(np * nk + 1));
        let mut acc = 0u64;
        for k in 0..nk {
            for m in marks {
                let lo = if k == 0 { 0 } else { f(&m[k - 1]) };
                local.push(lo);
                global.push(acc);
                acc += u64::from(f(&m[k]).saturating_sub(lo));
            }
        }
        global.push(acc);
        Space { local, global }
    }

    fn total(&self) -> u64 {
        self.global.last().copied().unwrap_or(0)
    }

    /// The graph id of part q's local id `x` (which the part holds).
    fn place(&self, np: usize, q: usize, x: u32) -> u32 {
        let nk = self.local.len() / np.max(1);
        // The last phase whose segment of part q starts at or before x holds it (an empty
        // segment starts where the next one does).
        let (mut lo, mut hi) = (0, nk);
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            if self.local[mid * np + q] <= x {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let s = lo * np + q;
        (self.global[s] + u64::from(x - self.local[s])) as u32
    }

    /// Part q's table of graph ids by local id (`n` ids).
    fn table(&self, np: usize, q: usize, n: u32) -> Vec<u32> {
        let nk = self.local.len() / np.max(1);
        let mut t = Vec::with_capacity(n as usize);
        for k in 0..nk {
            let s = k * np + q;
            let len = self.global[s + 1] - self.global[s];
            t.extend((0..len).map(|i| (self.global[s] + i) as u32));
        }
        t
    }
}

/// The graph's items in order: item g is `f(s, i)` for the i-th item of the segment s that
/// holds it (`starts`: each segment's first item, then the total). Built in parallel.
fn gather<T: Send>(starts: &[u64], f: impl Fn(usize, u32) -> T + Sync) -> Vec<T> {
    let total = starts.last().copied().unwrap_or(0);
    (0..total)
        .into_par_iter()
        .map_init(
            || 0usize,
            |s, g| {
                if !(starts[*s] <= g && g < starts[*s + 1]) {
                    *s = starts.partition_point(|&x| x <= g) - 1;
                }
                f(*s, (g - starts[*s]) as u32)
            },
        )
        .collect()
}

/// Where the graph laid out from parts' marks holds each part's ops and collectives (the
/// ids [`assemble`] gives them).
pub struct Layout {
    ops: Space,
    colls: Space,
    parts: usize,
}

impl Layout {
    /// The layout of parts whose phases end at `marks` (per part, every phase's end, the
    /// last phase's included; all parts have as many).
    pub fn new(marks: &[Vec<Mark>]) -> Layout {
        Layout {
            ops: Space::new(marks, |m| m.ops),
            colls: Space::new(marks, |m| m.colls),
            parts: marks.len(),
        }
    }

    /// The graph id of part `part`'s op `local`.
    pub fn op(&self, part: usize, local: OpId) -> OpId {
        self.ops.place(self.parts, part, local)
    }

    /// The graph id of part `part`'s collective `local`.
    pub fn coll(&self, part: usize, local: CollId) -> CollId {
        self.colls.place(self.parts, part, local)
    }
}

impl Mark {
    /// True when both marks place as many ops and collectives (the ids a graph's layout
    /// gives; transfers and pairs may be shared differently).
    pub fn same_ids(&self, other: &Mark) -> bool {
        (self.ops, self.colls) == (other.ops, other.colls)
    }
}

/// Lay `parts` out as one builder over `streams` (the graph's streams, in order): phase by
/// phase, part by part. Errors when the parts' phases differ, a part names a stream the
/// graph does not have, two parts put ops on one stream, or the graph is too large.
pub fn assemble(streams: Vec<StreamInfo>, mut parts: Vec<Part>) -> Result<(GraphBuilder, Layout)> {
    for p in &mut parts {
        let m = p.b.mark();
        p.marks.push(m);
    }
    let np = parts.len();
    let nk = parts.first().map_or(0, |p| p.marks.len());
    if let Some((q, p)) = parts.iter().enumerate().find(|(_, p)| p.marks.len() != nk) {
        return Err(invalid(
            format!("graph part {q} phases"),
            p.marks.len() - 1,
            format!("{} (every part has the same phases)", nk - 1),
        ));
    }
    let ns = streams.len();
    let mut count = vec![0u32; ns];
    for (q, p) in parts.iter().enumerate() {
        if p.streams.len() != p.b.g.streams.len() {
            return Err(invalid(
                format!("graph part {q} stream map"),
                p.streams.len(),
                format!("{} (one graph stream per part stream)", p.b.g.streams.len()),
            ));
        }
        for (ls, &gs) in p.streams.iter().enumerate() {
            let c = p.b.count[ls];
            match count.get_mut(gs as usize) {
                None => {
                    return Err(invalid(
                        format!("graph part {q} stream"),
                        gs,
                        format!("< {ns} streams"),
                    ))
                }
                Some(n) if *n > 0 && c > 0 => {
                    return Err(invalid(
                        format!("graph part {q} stream"),
                        gs,
                        "a stream with no ops in another part (a stream's ops lie in one part)",
                    ))
                }
                Some(n) => *n += c,
            }
        }
    }
    let marks: Vec<Vec<Mark>> = parts
        .iter_mut()
        .map(|p| std::mem::take(&mut p.marks))
        .collect();
    let Layout { ops, colls, .. } = Layout::new(&marks);
    let xfers = Space::new(&marks, |m| m.xfers);
    let pairs = Space::new(&marks, |m| m.pairs);
    if ops.total() >= u64::from(OpId::MAX) || colls.total() >= u64::from(super::COLL_BIT) {
        return Err(invalid(
            "op graph size",
            format!("{} ops, {} collectives", ops.total(), colls.total()),
            "fewer than 2^32 - 1 ops and 2^31 collectives",
        ));
    }
    let tables = |sp: &Space, n: &(dyn Fn(&Part) -> usize + Sync)| -> Vec<Vec<u32>> {
        (0..np)
            .into_par_iter()
            .map(|q| sp.table(np, q, n(&parts[q]) as u32))
            .collect()
    };
    let op_id = tables(&ops, &|p| p.b.g.ops.len());
    let coll_id = tables(&colls, &|p| p.b.g.colls.len());
    let xfer_id = tables(&xfers, &|p| p.b.g.xfers.len());
    let new_ops: Vec<Op> = gather(&ops.global, |s, i| {
        let q = s % np;
        let mut op = parts[q].b.g.ops[(ops.local[s] + i) as usize];
        op.stream = parts[q].streams[op.stream as usize];
        match op.tag() {
            TAG_COLL_OP => op.with_arg(u64::from(coll_id[q][op.arg() as usize])),
            TAG_SEND => op.with_arg(u64::from(xfer_id[q][op.arg() as usize])),
            _ => op,
        }
    });
    for p in &mut parts {
        p.b.g.ops = Vec::new();
    }
    let ndeps: Vec<u32> = gather(&ops.global, |s, i| {
        parts[s % np].b.g.ndeps[(ops.local[s] + i) as usize]
    });
    for p in &mut parts {
        p.b.g.ndeps = Vec::new();
    }
    // Each part's dependencies are translated where they lie and kept as its own chunk
    // (part order is the order one builder would have added them in).
    let edges: Vec<Vec<(OpId, OpId)>> = parts
        .par_iter_mut()
        .zip(&op_id)
        .flat_map_iter(|(p, ids)| {
            let mut chunks = std::mem::take(&mut p.b.edges);
            for (d, s) in chunks.iter_mut().flatten() {
                (*d, *s) = (ids[*d as usize], ids[*s as usize]);
            }
            chunks
        })
        .collect();
    let too_long = parts
        .iter()
        .zip(&op_id)
        .filter_map(|(p, ids)| p.b.too_long.map(|(o, d)| (ids[o as usize], d)))
        .min();
    drop((op_id, coll_id, xfer_id));
    let new_colls: Vec<CollInfo> = gather(&colls.global, |s, i| {
        let q = s % np;
        let mut c = parts[q].b.g.colls[(colls.local[s] + i) as usize];
        // A collective's transfers and pairs, unless it shares an earlier collective's (of
        // its own part), are added with it, in its segment.
        c.xfer_start = if c.xfer_len == 0 {
            (xfers.global[s] + u64::from(c.xfer_start - xfers.local[s])) as u32
        } else {
            xfers.place(np, q, c.xfer_start)
        };
        if let Some((a, l)) = c.p2p {
            let a = if l == 0 {
                (pairs.global[s] + u64::from(a - pairs.local[s])) as u32
            } else {
                pairs.place(np, q, a)
            };
            c.p2p = Some((a, l));
        }
        c
    });
    let new_xfers = gather(&xfers.global, |s, i| {
        parts[s % np].b.g.xfers[(xfers.local[s] + i) as usize]
    });
    let new_pairs = gather(&pairs.global, |s, i| {
        parts[s % np].b.g.p2p_pairs[(pairs.local[s] + i) as usize]
    });
    drop(parts);
    let b = GraphBuilder {
        g: Graph {
            ops: new_ops,
            streams,
            xfers: new_xfers,
            ndeps,
            colls: new_colls,
            p2p_pairs: new_pairs,
            ..Graph::default()
        },
        edges,
        count,
        too_long,
        xfer_lists: Default::default(),
    };
    Ok((
        b,
        Layout {
            ops,
            colls,
            parts: np,
        },
    ))
}
