//! DistCA's core-attention scheduler as the public repository implements it
//! (hao-ai-lab/distca, `distca/planner/planner.py`): the arm `distca`.
//!
//! Owns the repository's layout of documents on the CP ranks, its greedy planner and its
//! nano-batch split, with output in the parent module's [`DistcaSchedule`] (so `lower`,
//! `pingpong` and `ticks` run it unchanged). May not touch `cost/` formulas, the engine or
//! the tight scheduler; FLOPs and bytes come from [`AttnShape`] only. No I/O.
//!
//! # Layout (the repository's `batch_to_items_general`)
//!
//! Replica `r`'s packed sequence fills its CP ranks in document order, each rank a budget of
//! ⌈max(L, tokens)/CP⌉ tokens. A document that fits whole into the rank it starts on is one
//! *complete* item there. Any other document is cut into chunks, one per rank it reaches
//! (the first chunk is what is left of the rank it starts on), and a chunk of `n` tokens
//! is *mirrored*: its head is the next ⌊n/2⌋ queries from the document's front, its tail
//! the next ⌈n/2⌉ from its back. A document of 8 tokens over two ranks of 4: rank 0 holds
//! `[0,2)` and `[6,8)`, rank 1 `[2,4)` and `[4,6)`. Every rank holds its budget of tokens,
//! and every chunk carries about the same causal work ([`home_items`], [`layout`]).
//!
//! # Planner (the repository's `plan_items`, `get_priority`, `split_item`)
//!
//! Loads are exact pairs under the shape's mask (causal in the repository); F̄ = total / P
//! over the P = DP·CP servers; a server's surplus is F − F̄ (exact: integers scaled by P).
//! Under another mask ℓ + 1 below reads as the document's pairs per pair of queries,
//! 2·pairs(ℓ)/ℓ (ℓ + 1 exactly when causal), the split's k is the largest whose inner
//! ends' pairs fit (k·a causally) and a move brings the K/V its queries reach,
//! `[key_start(first query), last query + 1)`.
//!
//! 1. *Recipients* are the servers below F̄ at the start, largest deficit first (lowest
//!    index on a tie). Each is planned to the end before the next.
//! 2. *Stop rule per recipient:* it takes work while its need N (its deficit less what it
//!    received) exceeds ε·F̄; it stops early when no server is in surplus, or when the best
//!    candidate cannot move a single query.
//! 3. *Candidates* are the items (with work) on *donors*, servers in surplus. An item's
//!    *priority* is bytes per pair: with m = min(donor's surplus, N, item's pairs) and ℓ
//!    the document's length, (Q bytes of m/(ℓ+1) tokens + K/V bytes of ℓ+1 tokens) / m,
//!    i.e. q/(ℓ+1) + kv·(ℓ+1)/m with q, kv the bytes of one token's Q and K+V
//!    ([`AttnShape::q_bytes`], [`AttnShape::kv_bytes`]). The lowest wins; ties go to the
//!    item placed first.
//! 4. *Split:* the item moves whole when m ≥ its pairs. Otherwise k = ⌊m / a⌋ queries move
//!    from each side of its *inner* ends — the last k of its head and the first k of its
//!    tail, a = head end + tail start + 1 pairs per query pair (ℓ + 1 on the repository's
//!    even lengths) — so a complete document gives up its middle `[⌈ℓ/2⌉ − k, ⌈ℓ/2⌉ + k)`
//!    and a chunk the queries nearest the middle of what it still holds. k = 0 ends the
//!    recipient (rule 2).
//!
//! A recipient never exceeds F̄ (each move is at most N) and so never donates: received
//! work never moves again. Moved tasks are priced as the parent module prices them: Q and
//! output of the moved queries, K/V of the key prefix `[0, last query + 1)` the target
//! neither holds nor received with an earlier move of the same document; a task left in
//! place reads the part of its prefix other ranks hold.
//!
//! # Ping-pong
//!
//! Each server's items split into two nano-batches by pairs (heaviest first onto the
//! lighter half, [`nano_splits`]); the items of a document spread over several ranks all go
//! to nano-batch 0, since a chunk's tail reads keys of every other chunk's head and tail.
//!
//! # Where skewsim departs from the repository, and why
//!
//! - *Layout per replica.* The repository flattens a nano-batch's sequences over all
//!   attention servers; skewsim lays each replica's sequence over that replica's CP ranks,
//!   whose linear layers hold it. The two agree when every packed sequence fills its L.
//! - *Odd lengths.* The repository supports only even document lengths (its `split_item`
//!   asserts); skewsim moves k queries from each side with exact pairs k·a, at most what
//!   the shorter side holds.
//! - *Exact arithmetic.* The repository compares float FLOPs; skewsim keeps loads and
//!   surpluses exact and computes the priority in its simplified form (the same value).
//! - *Tolerance.* The repository's end-to-end script starts at ε = 0.05 and raises ε until
//!   the largest rank's NVSHMEM buffer fits; skewsim runs the configured ε (`eps=`).
//! - *Ping-pong.* The repository's two nano-batches are two sets of whole sequences, each
//!   over all servers; skewsim splits each rank's own items (its linear layers keep their
//!   tokens), as the tight scheduler does.
//! - *No tile.* Like the repository, shards are whole queries; `DistcaConfig::tile` is
//!   the tight scheduler's only.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use serde::{Deserialize, Serialize};

use super::{
    halves_by_pairs, largest_fitting, range_pairs, servers_of, AttnTask, DistcaConfig,
    DistcaSchedule, SampleRef, ServerWork, Stop, Transfer,
};
use crate::cost::{AttnShape, Mask};
use crate::error::{invalid, Result};
use crate::plan::{Resident, WorkerId};
use crate::workload::PackedSeq;

/// One document's queries on one server, as placed: a head `[lo, hi)` and a tail `[lo, hi)`
/// (a complete document is head `[0, ⌈ℓ/2⌉)` and tail `[⌈ℓ/2⌉, ℓ)`; either may be empty).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomeItem {
    /// The sample.
    pub sample: SampleRef,
    /// Head queries, sample-local.
    pub head: (u32, u32),
    /// Tail queries, sample-local.
    pub tail: (u32, u32),
    /// True when the document lies whole on this server.
    pub complete: bool,
}

impl HomeItem {
    /// Exact pairs under `mask`.
    pub fn pairs(&self, mask: &Mask) -> u64 {
        range_pairs(mask, self.head.0, self.head.1) + range_pairs(mask, self.tail.0, self.tail.1)
    }
}

/// The non-empty ranges of a head and a tail, merged when they touch.
fn ranges(head: (u32, u32), tail: (u32, u32)) -> Vec<(u32, u32)> {
    match (head.0 < head.1, tail.0 < tail.1) {
        (true, true) if head.1 == tail.0 => vec![(head.0, tail.1)],
        (true, true) => vec![head, tail],
        (true, false) => vec![head],
        (false, true) => vec![tail],
        (false, false) => Vec::new(),
    }
}

/// The repository's placement of one packed sequence on `cp` ranks: (rank, sample index,
/// item) in placement order.
fn place(seq: &PackedSeq, cp: u32) -> Vec<(u32, u32, HomeItem)> {
    let cp = cp.max(1);
    let per = u64::from(seq.capacity)
        .max(seq.tokens())
        .div_ceil(u64::from(cp))
        .max(1);
    let mut budget = vec![per; cp as usize];
    let mut c = 0usize;
    let mut out = Vec::new();
    for (j, s) in seq.samples.iter().enumerate() {
        let len = s.len;
        let (mut rem, mut hp, mut ts) = (len, 0u32, len);
        while rem > 0 {
            while budget[c] == 0 {
                c += 1;
            }
            let n = u64::from(rem).min(budget[c]) as u32;
            let sample = SampleRef {
                seq: 0,
                index: j as u32,
            };
            let item = if n == len {
                let mid = len.div_ceil(2);
                HomeItem {
                    sample,
                    head: (0, mid),
                    tail: (mid, len),
                    complete: true,
                }
            } else {
                let (hq, tq) = (n / 2, n - n / 2);
                let it = HomeItem {
                    sample,
                    head: (hp, hp + hq),
                    tail: (ts - tq, ts),
                    complete: false,
                };
                hp += hq;
                ts -= tq;
                it
            };
            out.push((c as u32, j as u32, item));
            budget[c] -= u64::from(n);
            rem -= n;
        }
    }
    out
}

/// The items of every server of `batch` (one packed sequence per replica) on `cp` ranks
/// each: `out[r·CP + c]`, in placement order.
pub fn home_items(batch: &[PackedSeq], cp: u32) -> Vec<Vec<HomeItem>> {
    let cp = cp.max(1);
    let mut out = vec![Vec::new(); batch.len() * cp as usize];
    for (r, seq) in batch.iter().enumerate() {
        for (c, _, mut it) in place(seq, cp) {
            it.sample.seq = r as u32;
            out[r * cp as usize + c as usize].push(it);
        }
    }
    out
}

/// Where the repository's placement puts the tokens of `seq` on `ranks` (in rank order):
/// layout pieces in position order, adjacent pieces of one worker merged.
pub fn layout(seq: &PackedSeq, ranks: &[WorkerId]) -> Vec<Resident> {
    let mut starts = Vec::with_capacity(seq.samples.len());
    let mut at = 0u64;
    for s in &seq.samples {
        starts.push(at);
        at += u64::from(s.len);
    }
    let mut pieces: Vec<Resident> = place(seq, ranks.len() as u32)
        .into_iter()
        .flat_map(|(c, j, it)| {
            let s0 = starts[j as usize];
            ranges(it.head, it.tail)
                .into_iter()
                .map(move |(a, b)| Resident {
                    start: s0 + u64::from(a),
                    end: s0 + u64::from(b),
                    worker: ranks[c as usize],
                })
        })
        .collect();
    pieces.sort_unstable_by_key(|r| r.start);
    let mut out: Vec<Resident> = Vec::with_capacity(pieces.len());
    for p in pieces {
        match out.last_mut() {
            Some(l) if l.end == p.start && l.worker == p.worker => l.end = p.end,
            _ => out.push(p),
        }
    }
    out
}

/// Schedules one GA index: `batch[r]` is replica `r`'s micro-batch on its `cp` ranks.
pub fn schedule(batch: &[PackedSeq], cp: u32, cfg: &DistcaConfig) -> Result<DistcaSchedule> {
    schedule_items(batch, cp, &home_items(batch, cp.max(1)), cfg)
}

/// Each server's two nano-batches (module doc, "Ping-pong"): items of a document on
/// several ranks in nano-batch 0, the rest by pairs.
pub fn nano_splits(batch: &[PackedSeq], cp: u32, mask: &Mask) -> Vec<[Vec<HomeItem>; 2]> {
    home_items(batch, cp)
        .into_iter()
        .map(|items| {
            let pairs: Vec<u64> = items.iter().map(|it| it.pairs(mask)).collect();
            let pin = |i: usize| (!items[i].complete).then_some(0);
            halves_by_pairs(&pairs, pin).map(|h| h.into_iter().map(|i| items[i]).collect())
        })
        .collect()
}

/// Ping-pong: both nano-batches of [`nano_splits`], each scheduled over all servers.
pub fn schedule_ping_pong(
    batch: &[PackedSeq],
    cp: u32,
    cfg: &DistcaConfig,
) -> Result<[DistcaSchedule; 2]> {
    if cp == 0 {
        return Err(invalid("cp", cp, "at least 1 rank per replica"));
    }
    let splits = nano_splits(batch, cp, &cfg.shape.mask);
    let half = |h: usize| -> Vec<Vec<HomeItem>> { splits.iter().map(|s| s[h].clone()).collect() };
    // The nano-batches are scheduled apart, side by side.
    let (a, b) = rayon::join(
        || schedule_items(batch, cp, &half(0), cfg),
        || schedule_items(batch, cp, &half(1), cfg),
    );
    Ok([a?, b?])
}

/// An item while planning.
#[derive(Clone, Copy, Debug)]
struct Item {
    home: usize,
    it: HomeItem,
    /// Its pairs under the mask.
    pairs: u64,
    /// Moved whole to another server.
    gone: bool,
}

/// Per-token bytes and the priority formula (module doc, rule 3).
struct Priority {
    q: f64,
    kv: f64,
    servers: f64,
}

impl Priority {
    fn new(shape: &AttnShape, servers: usize) -> Priority {
        Priority {
            q: shape.q_bytes(1, shape.heads_q) as f64,
            kv: shape.kv_bytes(1, shape.heads_kv) as f64,
            servers: servers as f64,
        }
    }

    /// Bytes per pair for a document of `l1` pairs per pair of queries when `m_scaled / P`
    /// pairs can move: non-increasing in `m_scaled`, so `m_scaled` = the item's pairs × P
    /// bounds it below.
    #[cfg(test)]
    fn of(&self, l1: f64, m_scaled: i128) -> f64 {
        self.at_least(l1, l1, m_scaled)
    }

    /// A lower bound of [`Priority::of`] over every `l1` in `[lo, hi]` and every
    /// `m_scaled` up to the one given, exact in floating point: each operation of the
    /// formula is monotone in its operands, and correctly rounded operations keep that.
    /// `of(l, m)` itself when `lo = hi = l`.
    fn at_least(&self, lo: f64, hi: f64, m_scaled: i128) -> f64 {
        let m = m_scaled as f64 / self.servers;
        self.q / hi + self.kv * lo / m
    }
}

/// The planner's state that choosing a candidate reads.
struct State {
    items: Vec<Item>,
    by_server: Vec<Vec<usize>>,
    /// Each server's load less F̄, × P.
    excess: Vec<i128>,
    /// Each item's ℓ + 1 (its sample's; a split keeps it).
    l1: Vec<f64>,
    prio: Priority,
    /// P, the servers.
    pp: i128,
}

impl State {
    /// A candidate: work left on a donor (module doc, rule 3).
    fn candidate(&self, id: usize) -> bool {
        let x = &self.items[id];
        !x.gone && x.pairs > 0 && self.excess[x.home] > 0
    }

    /// What item `id` can move at most whatever the need, × P: min(its donor's surplus,
    /// its pairs); −1 when it is no candidate.
    fn cap(&self, id: usize) -> i128 {
        let x = &self.items[id];
        if self.candidate(id) {
            self.excess[x.home].min(i128::from(x.pairs) * self.pp)
        } else {
            -1
        }
    }

    /// The priority of candidate `id` toward a need of `need` (× P).
    #[cfg(test)]
    fn priority(&self, id: usize, need: i128) -> f64 {
        self.prio.of(self.l1[id], self.cap(id).min(need))
    }
}

/// Chooses the next move's item: the candidate of the lowest priority, ties to the item
/// placed first (module doc, rule 3).
trait Pick {
    /// The best candidate toward `need` (× P), if any.
    fn best(&mut self, st: &State, need: i128) -> Option<usize>;
    /// Follows a move of item `id` off server `donor` (its pairs, its `gone` and the
    /// donor's surplus changed).
    fn moved(&mut self, st: &State, id: usize, donor: usize);
}

/// [`Pick`] by a best-first search of a tree over the items in order of ℓ + 1: a node
/// keeps the range of its leaves' ℓ + 1, their lowest id and the most a candidate among
/// them can move ([`State::cap`]), which bound the priority of every candidate below it
/// ([`Priority::at_least`]). Nodes leave a heap by (bound, lowest id): the first leaf out
/// is the best candidate, its bound its exact priority. Its cost follows the nodes whose
/// bound lies below the answer, not the candidates.
struct Search {
    /// Leaves: `size` and up, the items by (ℓ + 1, id), then empty ones.
    size: usize,
    /// Each item's leaf.
    leaf: Vec<usize>,
    lo: Vec<f64>,
    hi: Vec<f64>,
    first: Vec<usize>,
    cap: Vec<i128>,
    heap: BinaryHeap<Reverse<(u64, usize, usize)>>,
}

impl Search {
    fn new(st: &State) -> Search {
        let n = st.items.len();
        let size = n.next_power_of_two();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_unstable_by(|&a, &b| st.l1[a].total_cmp(&st.l1[b]).then(a.cmp(&b)));
        let mut s = Search {
            size,
            leaf: vec![0; n],
            lo: vec![f64::INFINITY; 2 * size],
            hi: vec![0.0; 2 * size],
            first: vec![usize::MAX; 2 * size],
            cap: vec![-1; 2 * size],
            heap: BinaryHeap::new(),
        };
        for (k, &id) in order.iter().enumerate() {
            let v = size + k;
            s.leaf[id] = v;
            (s.lo[v], s.hi[v], s.first[v], s.cap[v]) = (st.l1[id], st.l1[id], id, st.cap(id));
        }
        for v in (1..size).rev() {
            let (a, b) = (2 * v, 2 * v + 1);
            s.lo[v] = s.lo[a].min(s.lo[b]);
            s.hi[v] = s.hi[a].max(s.hi[b]);
            s.first[v] = s.first[a].min(s.first[b]);
            s.cap[v] = s.cap[a].max(s.cap[b]);
        }
        s
    }

    fn push(&mut self, st: &State, v: usize, need: i128) {
        if self.cap[v] >= 0 {
            let b = st
                .prio
                .at_least(self.lo[v], self.hi[v], self.cap[v].min(need));
            // Bounds are positive (or +∞): their bits sort as their values.
            self.heap.push(Reverse((b.to_bits(), self.first[v], v)));
        }
    }
}

impl Pick for Search {
    fn best(&mut self, st: &State, need: i128) -> Option<usize> {
        self.heap.clear();
        if self.size == 0 {
            return None;
        }
        self.push(st, 1, need);
        while let Some(Reverse((_, first, v))) = self.heap.pop() {
            if v >= self.size {
                return Some(first);
            }
            self.push(st, 2 * v, need);
            self.push(st, 2 * v + 1, need);
        }
        None
    }

    fn moved(&mut self, st: &State, _id: usize, donor: usize) {
        for &j in &st.by_server[donor] {
            let mut v = self.leaf[j];
            let c = st.cap(j);
            if self.cap[v] == c {
                continue;
            }
            self.cap[v] = c;
            while v > 1 {
                v /= 2;
                let c = self.cap[2 * v].max(self.cap[2 * v + 1]);
                if self.cap[v] == c {
                    break;
                }
                self.cap[v] = c;
            }
        }
    }
}

/// Schedules per-server item lists (a subset of [`home_items`]`(batch, cp)`, e.g. one
/// nano-batch). Errors: no server, CP of 0, a list per server other than `batch.len()·cp`,
/// or an item outside its sample or not placed on its server.
pub fn schedule_items(
    batch: &[PackedSeq],
    cp: u32,
    lists: &[Vec<HomeItem>],
    cfg: &DistcaConfig,
) -> Result<DistcaSchedule> {
    plan(batch, cp, lists, cfg, Search::new)
}

/// [`schedule_items`] with the candidate choice `pick` builds.
fn plan<P: Pick>(
    batch: &[PackedSeq],
    cp: u32,
    lists: &[Vec<HomeItem>],
    cfg: &DistcaConfig,
    pick: impl FnOnce(&State) -> P,
) -> Result<DistcaSchedule> {
    let p = servers_of(batch, cp, lists.len(), "item lists")?;
    let mask = &cfg.shape.mask;
    // What every server holds under the placement: its pieces per sample.
    let placed = home_items(batch, cp);
    let mut held: HashMap<(usize, SampleRef), HomeItem> = HashMap::new();
    for (s, list) in placed.iter().enumerate() {
        for it in list {
            held.insert((s, it.sample), *it);
        }
    }
    let mut items = Vec::new();
    let mut by_server = vec![Vec::new(); p];
    let mut load = vec![0u64; p];
    for (s, list) in lists.iter().enumerate() {
        for it in list {
            if held.get(&(s, it.sample)) != Some(it) {
                return Err(invalid(
                    format!("server {s} item"),
                    format!("{it:?}"),
                    "an item of the repository's placement on that server",
                ));
            }
            let pairs = it.pairs(mask);
            load[s] += pairs;
            by_server[s].push(items.len());
            items.push(Item {
                home: s,
                it: *it,
                pairs,
                gone: false,
            });
        }
    }
    let shape = &cfg.shape;
    let total: u64 = load.iter().sum();
    let pp = p as i128;
    let excess: Vec<i128> = load
        .iter()
        .map(|&l| i128::from(l) * pp - i128::from(total))
        .collect();
    let threshold = cfg.epsilon * total as f64;
    // ℓ + 1 of the repository's formula, read under the mask as the pairs per pair of
    // queries of the document, 2·pairs(ℓ)/ℓ (ℓ + 1 exactly under the causal mask).
    let l1_of = |it: &HomeItem| {
        let len = batch[it.sample.seq as usize].samples[it.sample.index as usize].len;
        2.0 * mask.pairs(u64::from(len)) as f64 / f64::from(len.max(1))
    };
    let mut st = State {
        l1: items.iter().map(|x| l1_of(&x.it)).collect(),
        items,
        by_server,
        excess,
        prio: Priority::new(shape, p),
        pp,
    };
    let mut pick = pick(&st);
    let mut recipients: Vec<usize> = (0..p).filter(|&s| st.excess[s] < 0).collect();
    recipients.sort_by_key(|&s| (st.excess[s], s));
    /// A move: (recipient, queries moved, item id).
    type Move = (usize, Vec<(u32, u32)>, usize);
    let mut moves: Vec<Move> = Vec::new();
    for t in recipients {
        let mut need = -st.excess[t];
        while need as f64 > threshold {
            let Some(id) = pick.best(&st, need) else {
                break;
            };
            let x = st.items[id];
            let d = x.home;
            let f = i128::from(x.pairs) * pp;
            let m = st.excess[d].min(need).min(f);
            let (q_ranges, moved) = if m >= f {
                st.items[id].gone = true;
                (ranges(x.it.head, x.it.tail), x.pairs)
            } else {
                // The inner ends' k: causally k·a pairs exactly; a mask keeps at most as
                // many, so the causal k is where the search for the largest fitting starts.
                let (h, tl) = (x.it.head, x.it.tail);
                let a = i128::from(h.1) + i128::from(tl.0) + 1;
                let side = (h.1 - h.0).min(tl.1 - tl.0);
                let inner =
                    |k: u32| range_pairs(mask, h.1 - k, h.1) + range_pairs(mask, tl.0, tl.0 + k);
                let k0 = (m / (pp * a)).min(i128::from(side)) as u64;
                let k = largest_fitting(k0, u64::from(side), 1, |k| {
                    i128::from(inner(k as u32)) * pp <= m
                }) as u32;
                if k == 0 {
                    break;
                }
                let y = &mut st.items[id];
                y.it.head.1 -= k;
                y.it.tail.0 += k;
                y.pairs = y.it.pairs(mask);
                (ranges((h.1 - k, h.1), (tl.0, tl.0 + k)), inner(k))
            };
            let dm = i128::from(moved) * pp;
            st.excess[d] -= dm;
            st.excess[t] += dm;
            need -= dm;
            pick.moved(&st, id, d);
            moves.push((t, q_ranges, id));
        }
    }
    let State {
        items,
        by_server,
        excess,
        ..
    } = st;
    // Keys of `[a, x)` of a sample that server `s` lacks: outside its placed pieces.
    let lacking = |s: usize, sample: SampleRef, a: u32, x: u32| -> u32 {
        let mut have = 0;
        if let Some(h) = held.get(&(s, sample)) {
            for (u, v) in [h.head, h.tail] {
                have += v.min(x).saturating_sub(u.max(a));
            }
        }
        x - a - have
    };
    // Keys a move reaching `[a, x)` must bring: the growth of the hull of the keys earlier
    // moves delivered (`[0, d)` under the causal mask), outside the placed pieces.
    let missing = |s: usize, sample: SampleRef, hull: Option<(u32, u32)>, a: u32, x: u32| {
        u64::from(match hull {
            None => lacking(s, sample, a, x),
            Some((u, v)) => lacking(s, sample, a.min(u), x.max(v)) - lacking(s, sample, u, v),
        })
    };
    // The keys `q_ranges` (ascending) reach: [key_start(first query), last query + 1).
    let reach = |q_ranges: &[(u32, u32)]| -> (u32, u32) {
        let a = q_ranges.first().map_or(0, |r| r.0);
        let e = q_ranges.last().map_or(0, |r| r.1);
        (mask.key_start(u64::from(a)).min(u64::from(e)) as u32, e)
    };
    let task = |home: usize, it: &HomeItem, q_ranges: Vec<(u32, u32)>, kv_tokens: u64| {
        let pairs: u64 = q_ranges.iter().map(|&(a, b)| range_pairs(mask, a, b)).sum();
        AttnTask {
            sample: it.sample,
            home: home as u32,
            of: batch[it.sample.seq as usize].samples[it.sample.index as usize],
            kv_prefix: q_ranges.last().map_or(0, |r| r.1),
            q_ranges,
            kv_bytes: shape.kv_bytes(kv_tokens, shape.heads_kv),
            pairs,
            flops: shape.fwd_flops(pairs, shape.heads_q),
        }
    };
    let mut tasks: Vec<Vec<AttnTask>> = vec![Vec::new(); p];
    for (s, ids) in by_server.iter().enumerate() {
        for &id in ids {
            let x = &items[id];
            let q = ranges(x.it.head, x.it.tail);
            if x.gone || q.is_empty() {
                continue;
            }
            let (a, e) = reach(&q);
            let kv = missing(s, x.it.sample, None, a, e);
            tasks[s].push(task(s, &x.it, q, kv));
        }
    }
    let mut delivered: HashMap<(usize, SampleRef), (u32, u32)> = HashMap::new();
    let mut transfers = Vec::with_capacity(moves.len());
    for (t, q_ranges, id) in moves {
        let x = &items[id];
        let (a, e) = reach(&q_ranges);
        let hull = delivered.get(&(t, x.it.sample)).copied();
        let kv = missing(t, x.it.sample, hull, a, e);
        delivered.insert(
            (t, x.it.sample),
            hull.map_or((a, e), |(u, v)| (u.min(a), v.max(e))),
        );
        let q_tokens: u64 = q_ranges.iter().map(|&(a, b)| u64::from(b - a)).sum();
        let q_bytes = shape.q_bytes(q_tokens, shape.heads_q);
        let tk = task(x.home, &x.it, q_ranges, kv);
        transfers.push(Transfer {
            src: x.home as u32,
            dst: t as u32,
            task: tasks[t].len(),
            q_bytes,
            kv_bytes: tk.kv_bytes,
            out_bytes: q_bytes,
        });
        tasks[t].push(tk);
    }
    let servers: Vec<ServerWork> = tasks
        .into_iter()
        .map(|tasks| {
            let pairs: u64 = tasks.iter().map(|t| t.pairs).sum();
            ServerWork {
                tasks,
                pairs,
                flops: shape.fwd_flops(pairs, shape.heads_q),
            }
        })
        .collect();
    let balanced = excess.iter().all(|e| e.unsigned_abs() as f64 <= threshold);
    Ok(DistcaSchedule {
        servers,
        transfers,
        ideal_flops: shape.fwd_flops(1, shape.heads_q) * total as f64 / p as f64,
        epsilon: cfg.epsilon,
        cp,
        stop: if balanced {
            Stop::Balanced
        } else {
            Stop::NoMoveHelps
        },
    })
}

#[cfg(test)]
mod tests {
    use super::super::lower::plan_step_cp;
    use super::super::DistcaScheduler;
    use super::*;
    use crate::plan::{check, Payload};
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// Unit shape (Q = out = 1 B per token, K+V = 2 B): priority 1/(ℓ+1) + 2(ℓ+1)/m.
    fn cfg(eps: f64) -> DistcaConfig {
        DistcaConfig::new(super::super::tests::unit(), eps, 128).unwrap()
    }

    fn seq(lens: &[u32], capacity: u32) -> PackedSeq {
        PackedSeq::from_lengths(lens, capacity, 0)
    }

    type Moved = (u32, u32, u32, Vec<(u32, u32)>, u64);

    /// (src, dst, sample index, ranges, bytes) per transfer.
    fn moves(s: &DistcaSchedule) -> Vec<Moved> {
        s.transfers
            .iter()
            .map(|t| {
                let task = &s.servers[t.dst as usize].tasks[t.task];
                (
                    t.src,
                    t.dst,
                    task.sample.index,
                    task.q_ranges.clone(),
                    t.bytes(),
                )
            })
            .collect()
    }

    /// The planner's choice as the repository walks it: candidates in a set by their
    /// priority's lower bound (their own pairs moving), walked until that bound exceeds
    /// the best priority seen.
    struct Walk {
        cand: BTreeSet<(u64, usize)>,
        key: Vec<Option<u64>>,
    }

    impl Walk {
        fn new(st: &State) -> Walk {
            let mut w = Walk {
                cand: BTreeSet::new(),
                key: vec![None; st.items.len()],
            };
            for id in 0..st.items.len() {
                w.insert(st, id);
            }
            w
        }

        fn insert(&mut self, st: &State, id: usize) {
            if st.candidate(id) {
                let f = i128::from(st.items[id].pairs) * st.pp;
                let k = st.prio.of(st.l1[id], f).to_bits();
                self.cand.insert((k, id));
                self.key[id] = Some(k);
            }
        }

        fn remove(&mut self, id: usize) {
            if let Some(k) = self.key[id].take() {
                self.cand.remove(&(k, id));
            }
        }
    }

    impl Pick for Walk {
        fn best(&mut self, st: &State, need: i128) -> Option<usize> {
            let mut best: Option<(f64, usize)> = None;
            for &(kb, id) in &self.cand {
                if best.is_some_and(|(bp, _)| f64::from_bits(kb) > bp) {
                    break;
                }
                let pr = st.priority(id, need);
                if best.is_none_or(|(bp, bid)| pr < bp || (pr == bp && id < bid)) {
                    best = Some((pr, id));
                }
            }
            best.map(|(_, id)| id)
        }

        fn moved(&mut self, st: &State, id: usize, donor: usize) {
            self.remove(id);
            self.insert(st, id);
            if st.excess[donor] <= 0 {
                for &j in &st.by_server[donor] {
                    self.remove(j);
                }
            }
        }
    }

    /// The planner's choice by its definition: every candidate's priority, the lowest
    /// (then the lowest id).
    struct Scan;

    impl Pick for Scan {
        fn best(&mut self, st: &State, need: i128) -> Option<usize> {
            (0..st.items.len())
                .filter(|&id| st.candidate(id))
                .min_by(|&a, &b| {
                    let (pa, pb) = (st.priority(a, need), st.priority(b, need));
                    pa.partial_cmp(&pb).unwrap().then(a.cmp(&b))
                })
        }

        fn moved(&mut self, _: &State, _: usize, _: usize) {}
    }

    /// [`schedule_items`] by the tree search, the walk and the scan: one schedule.
    fn same_by_every_pick(
        batch: &[PackedSeq],
        cp: u32,
        lists: &[Vec<HomeItem>],
        c: &DistcaConfig,
    ) -> DistcaSchedule {
        let s = schedule_items(batch, cp, lists, c).unwrap();
        assert_eq!(plan(batch, cp, lists, c, Walk::new).unwrap(), s);
        assert_eq!(plan(batch, cp, lists, c, |_: &State| Scan).unwrap(), s);
        s
    }

    #[test]
    fn search_picks_as_the_walk_on_a_corpus_batch() {
        // One GA index of the 512-server benchmark: 64 replicas × CP 8, 128K tokens
        // (wlbllm), both nano-batches and the whole.
        let c = DistcaConfig::new(
            crate::balance::wlbllm::ConstantThroughput::h200_llama3_8b().shape,
            0.1,
            128,
        )
        .unwrap();
        let corpus = crate::workload::corpus::Corpus::from_spec("wlbllm").unwrap();
        let batch = crate::workload::pack::global_batch(
            &corpus,
            131_072,
            64,
            crate::workload::pack::Packing::Sequential,
            0,
            0,
        )
        .unwrap();
        let splits = nano_splits(&batch, 8, &c.shape.mask);
        let mut moved = 0;
        for h in 0..2 {
            let half: Vec<Vec<HomeItem>> = splits.iter().map(|s| s[h].clone()).collect();
            moved += same_by_every_pick(&batch, 8, &half, &c).transfers.len();
        }
        moved += same_by_every_pick(&batch, 8, &home_items(&batch, 8), &c)
            .transfers
            .len();
        assert!(moved > 100, "{moved}");
    }

    /// `dp` replicas cycling through `lens`, each with `slack` tokens of room.
    fn replicas(lens: &[Vec<u32>], dp: u32, slack: u32) -> Vec<PackedSeq> {
        (0..dp as usize)
            .map(|i| {
                let l = &lens[i % lens.len()];
                PackedSeq::from_lengths(l, l.iter().sum::<u32>() + slack, 10 * i as u64)
            })
            .collect()
    }

    #[test]
    fn placement_mirrors_chunks_by_hand() {
        // CP 2, capacity 8 (4 per rank), one 8-token document: rank 0 takes head [0,2) and
        // tail [6,8), rank 1 head [2,4) and tail [4,6) (18 pairs each).
        let one = [seq(&[8], 8)];
        let hi = home_items(&one, 2);
        type Placed = ((u32, u32), (u32, u32), bool);
        let ht = |v: &[HomeItem]| -> Vec<Placed> {
            v.iter().map(|i| (i.head, i.tail, i.complete)).collect()
        };
        assert_eq!(ht(&hi[0]), vec![((0, 2), (6, 8), false)]);
        assert_eq!(ht(&hi[1]), vec![((2, 4), (4, 6), false)]);
        assert_eq!(
            (hi[0][0].pairs(&Mask::Causal), hi[1][0].pairs(&Mask::Causal)),
            (18, 18)
        );
        let lay: Vec<(u64, u64, u32)> = layout(&one[0], &[5, 6])
            .iter()
            .map(|r| (r.start, r.end, r.worker))
            .collect();
        assert_eq!(lay, vec![(0, 2, 5), (2, 6, 6), (6, 8, 5)]);
        // CP 3, capacity 12 (4 per rank), documents 3, 6, 3. Rank 0: the 3 whole (head
        // [0,2), tail [2,3)), then 1 token of the 6: head ⌊1/2⌋ = 0, tail [5,6). Rank 1:
        // 4 tokens: head [0,2), tail [3,5). Rank 2: the last token: head empty, tail
        // [2,3); then the second 3 whole.
        let b = [seq(&[3, 6, 3], 12)];
        let hi = home_items(&b, 3);
        assert_eq!(
            ht(&hi[0]),
            vec![((0, 2), (2, 3), true), ((0, 0), (5, 6), false)]
        );
        assert_eq!(ht(&hi[1]), vec![((0, 2), (3, 5), false)]);
        assert_eq!(
            ht(&hi[2]),
            vec![((2, 2), (2, 3), false), ((0, 2), (2, 3), true)]
        );
        let lay: Vec<(u64, u64, u32)> = layout(&b[0], &[0, 1, 2])
            .iter()
            .map(|r| (r.start, r.end, r.worker))
            .collect();
        assert_eq!(
            lay,
            vec![
                (0, 3, 0),
                (3, 5, 1),
                (5, 6, 2),
                (6, 8, 1),
                (8, 9, 0),
                (9, 12, 2)
            ]
        );
        // Nano-batches: the pieces of the 6 stay in nano-batch 0; the whole 3s go to the
        // lighter half, 1.
        let sp = nano_splits(&b, 3, &Mask::Causal);
        let idx = |v: &[HomeItem]| -> Vec<u32> { v.iter().map(|i| i.sample.index).collect() };
        let got: Vec<(Vec<u32>, Vec<u32>)> = sp.iter().map(|[a, z]| (idx(a), idx(z))).collect();
        assert_eq!(
            got,
            vec![(vec![1], vec![0]), (vec![1], vec![]), (vec![1], vec![2])]
        );
    }

    #[test]
    fn sliding_window_inner_ends_by_hand() {
        // CP 1, servers [6] and [2] under sliding:2: 11 and 3 pairs, F̄ = 7, ε = 0.15. The
        // 6 is head [0,3) + tail [3,6); server 1 needs 4. The causal count, a = 3 + 3 + 1 = 7 pairs
        // per query pair, gives k = 0; under the window the inner ends [2,3) +
        // [3,4) cost keys(2) + keys(3) = 4: k = 1 moves [2,4), reaching keys [1, 4) (3
        // keys = 6 B, Q 2 B, output 2 B). Loads 7 / 7.
        let shape = AttnShape {
            mask: Mask::Sliding { w: 2 },
            ..super::super::tests::unit()
        };
        let c = DistcaConfig::new(shape, 0.15, 128).unwrap();
        let batch = [seq(&[6], 6), seq(&[2], 6)];
        let s = schedule(&batch, 1, &c).unwrap();
        assert_eq!(s.stop, Stop::Balanced);
        assert_eq!((s.servers[0].pairs, s.servers[1].pairs), (7, 7));
        assert_eq!(moves(&s), vec![(0, 1, 0, vec![(2, 4)], 10)]);
        let t = &s.transfers[0];
        assert_eq!((t.q_bytes, t.out_bytes), (2, 2));
        assert_eq!(s.servers[0].tasks[0].q_ranges, vec![(0, 2), (4, 6)]);
        assert_eq!(s.servers[1].tasks[1].pairs, 4);
        // The plan of the window's schedule checks under the mask: its FLOPs are the
        // window's 14 pairs and its KV exactly the 3 keys.
        let p = plan_step_cp(0, &batch, 2, 1, &c, false).unwrap();
        check(&p.plan).unwrap();
        let kv: u64 = p.plan.groups[0]
            .transfers
            .iter()
            .filter(|t| matches!(t.carries, Payload::Kv { .. }))
            .map(|t| t.bytes)
            .sum();
        assert_eq!(kv, 6);
    }

    #[test]
    fn priority_split_whole_move_and_stop_by_hand() {
        // CP 1, four servers: [6, 2] (21 + 3 pairs), [4] (10), [] (0), [2] (3). Total 37,
        // F̄ = 9.25, ε = 0.1: a recipient stops at need ≤ 0.925. Surplus: +14.75, +0.75,
        // −9.25, −6.25. Recipients by deficit: server 2, then 3.
        // Server 2, N = 9.25; candidates (p = 1/(ℓ+1) + 2(ℓ+1)/m):
        //   the 6: m = min(14.75, 9.25, 21) = 9.25, p = 1/7 + 14/9.25 = 1.656;
        //   the 2: m = 3, p = 1/3 + 6/3 = 2.333; the 4: m = 0.75 (its server), p = 13.53.
        //   The 6 splits: a = 3 + 3 + 1 = 7, k = ⌊9.25/7⌋ = 1: its middle [2,4) (7 pairs).
        //   Loads 17 10 7 0; N = 2.25. The 6 (now [0,2) + [4,6), 14 pairs): p = 1/7 + 14/2.25
        //   = 6.365; the 2: m = 2.25, p = 1/3 + 6/2.25 = 3.0 → best, but k = ⌊2.25/3⌋ = 0:
        //   server 2 stops at 7.
        // Server 3, N = 6.25: the 6: m = 6.25, p = 1/7 + 14/6.25 = 2.383; the 2: m = 3,
        //   p = 2.333 → best, m ≥ 3: moves whole. Loads 14 10 7 6; N = 3.25: the 6 (p =
        //   4.45) has a = 2 + 4 + 1 = 7, k = ⌊3.25/7⌋ = 0: stops.
        let batch = [seq(&[6, 2], 8), seq(&[4], 8), seq(&[], 8), seq(&[2], 8)];
        let s = schedule(&batch, 1, &cfg(0.1)).unwrap();
        let loads: Vec<u64> = s.servers.iter().map(|w| w.pairs).collect();
        assert_eq!(loads, vec![14, 10, 7, 6]);
        assert_eq!(s.stop, Stop::NoMoveHelps);
        // bytes: [2,4) Q 2 + out 2 + keys [0,4) 8 = 12; [0,2) 2 + 2 + 4 = 8
        assert_eq!(
            moves(&s),
            vec![(0, 2, 0, vec![(2, 4)], 12), (0, 3, 1, vec![(0, 2)], 8)]
        );
        let kept = &s.servers[0].tasks;
        assert_eq!(kept.len(), 1);
        assert_eq!(
            (
                kept[0].q_ranges.clone(),
                kept[0].kv_prefix,
                kept[0].kv_bytes
            ),
            (vec![(0, 2), (4, 6)], 6, 0)
        );
        // ε = 1.0: every need (≤ 9.25) is within F̄·ε: nothing moves.
        let loose = schedule(&batch, 1, &cfg(1.0)).unwrap();
        assert!(loose.transfers.is_empty());
        assert_eq!(loose.stop, Stop::NoMoveHelps);
    }

    #[test]
    fn mirrored_chunks_give_their_inner_ends_and_lower_by_hand() {
        // DP 2 × CP 2, capacity 8: replica 0 holds one 8-token document (server 0: [0,2) +
        // [6,8), 18 pairs; server 1: [2,4) + [4,6), 18); replica 1 is empty. F̄ = 9.
        // Server 2 (N = 9): both chunks have p = 1/9 + 18/9; the tie goes to server 0's
        // (placed first): a = 2 + 6 + 1 = 9, k = 1: [1,2) + [6,7), 9 pairs. Server 0 is at
        // F̄ and no longer donates. Server 3 (N = 9): server 1's chunk, a = 4 + 4 + 1 = 9,
        // k = 1: [3,5). Balanced.
        let batch = [seq(&[8], 8), seq(&[], 8)];
        let c = cfg(0.1);
        let s = schedule(&batch, 2, &c).unwrap();
        assert_eq!(s.stop, Stop::Balanced);
        assert!(s.servers.iter().all(|w| w.pairs == 9));
        // Bytes: keys [0,7) and [0,5), none held by replica 1: 2 + 14 + 2 = 18 and 2 + 10 +
        // 2 = 14. In place: server 0 keeps [0,1) + [7,8), reading keys [2,6) of server 1
        // (8 B); server 1 keeps [2,3) + [5,6), reading [0,2) of server 0 (4 B).
        assert_eq!(
            moves(&s),
            vec![
                (0, 2, 0, vec![(1, 2), (6, 7)], 18),
                (1, 3, 0, vec![(3, 5)], 14)
            ]
        );
        let kept: Vec<(Vec<(u32, u32)>, u64)> = s.servers[..2]
            .iter()
            .map(|w| (w.tasks[0].q_ranges.clone(), w.tasks[0].kv_bytes))
            .collect();
        assert_eq!(
            kept,
            vec![(vec![(0, 1), (7, 8)], 8), (vec![(2, 3), (5, 6)], 4)]
        );
        assert_eq!(s.bytes(), 44);
        // The plan: the mirrored layout, and the same 44 B (KV per (document, worker)
        // once: worker 2 gets [0,2) + [6,7) from 0 and [2,6) from 1, 6 + 8 B).
        let d = plan_step_cp(0, &batch, 2, 2, &c, false).unwrap();
        let sum = check(&d.plan).unwrap();
        assert_eq!((sum.units, sum.bytes), (7, 44));
        let lay: Vec<(u64, u64, u32)> = d.plan.groups[0].sequences[0]
            .layout
            .iter()
            .map(|r| (r.start, r.end, r.worker))
            .collect();
        assert_eq!(lay, vec![(0, 2, 0), (2, 6, 1), (6, 8, 0)]);
        let kv_to_2: Vec<(u32, u32, u32, u64)> = d.plan.groups[0]
            .transfers
            .iter()
            .filter(|t| t.dst == 2)
            .filter_map(|t| match t.carries {
                Payload::Kv { start, end, .. } => Some((t.src, start, end, t.bytes)),
                _ => None,
            })
            .collect();
        assert_eq!(kv_to_2, vec![(0, 0, 2, 4), (1, 2, 6, 8), (0, 6, 7, 2)]);
        // The tight variant plans the same batch on contiguous slices.
        let t = plan_step_cp(
            0,
            &batch,
            2,
            2,
            &c.with_scheduler(DistcaScheduler::Tight),
            false,
        )
        .unwrap();
        assert_eq!(t.plan.groups[0].sequences[0].layout.len(), 2);
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let batch = [seq(&[4], 4)];
        assert!(schedule(&batch, 0, &cfg(0.1)).is_err());
        assert!(schedule(&[], 1, &cfg(0.1)).is_err());
        let mut lists = home_items(&batch, 1);
        lists[0][0].head.1 += 1;
        let e = schedule_items(&batch, 1, &lists, &cfg(0.1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("server 0 item"), "{e}");
        assert!(schedule_items(&batch, 1, &[], &cfg(0.1)).is_err());
    }

    proptest! {
        /// Random batches, DP, CP, ε and ping-pong: every query once, exact pairs, senders
        /// never below F̄ and receivers never above it; the lowered plan checks, its FLOPs
        /// are the exact causal total, its Q and output bytes are the scheduler's and its
        /// KV bytes at most the scheduler's.
        #[test]
        fn random_batches_conserve_and_plans_check(
            lens in proptest::collection::vec(proptest::collection::vec(1u32..400, 0..6), 1..7),
            dp in 1u32..5,
            cp in 1u32..5,
            eps in 0.0f64..0.4,
            slack in 0u32..200,
            ping_pong in any::<bool>(),
        ) {
            let shape = AttnShape { heads_q: 4, heads_kv: 2, head_dim: 2, dtype_bytes: 2, mask: crate::cost::Mask::Causal };
            let c = DistcaConfig::new(shape, eps, 128).unwrap();
            let batch = replicas(&lens, dp, slack);
            let exact: u64 = batch.iter().map(PackedSeq::causal_pairs).sum();
            let scheds: Vec<DistcaSchedule> = if ping_pong {
                schedule_ping_pong(&batch, cp, &c).unwrap().into()
            } else {
                vec![schedule(&batch, cp, &c).unwrap()]
            };
            let mut hit: Vec<Vec<Vec<u8>>> = batch
                .iter()
                .map(|q| q.samples.iter().map(|x| vec![0; x.len as usize]).collect())
                .collect();
            let mut total = 0;
            for s in &scheds {
                let p = s.servers.len() as u64;
                let sum: u64 = s.servers.iter().map(|w| w.pairs).sum();
                for w in &s.servers {
                    for t in &w.tasks {
                        let mut pairs = 0;
                        for &(a, b) in &t.q_ranges {
                            pairs += range_pairs(&Mask::Causal, a, b);
                            for q in a..b {
                                hit[t.sample.seq as usize][t.sample.index as usize][q as usize] += 1;
                            }
                        }
                        prop_assert_eq!(pairs, t.pairs);
                    }
                }
                for t in &s.transfers {
                    prop_assert!(s.servers[t.src as usize].pairs * p >= sum);
                    prop_assert!(s.servers[t.dst as usize].pairs * p <= sum);
                }
                total += sum;
            }
            prop_assert_eq!(total, exact);
            prop_assert!(hit.iter().flatten().flatten().all(|&h| h == 1));
            let d = plan_step_cp(1, &batch, dp, cp, &c, ping_pong).unwrap();
            d.nano.validate(&d.plan).unwrap();
            let s = check(&d.plan);
            prop_assert!(s.is_ok(), "{:?}", s);
            let want = shape.fwd_flops(exact, 4);
            prop_assert!((s.unwrap().flops - want).abs() <= 1e-9 * want.max(1.0));
            let (mut pq, mut pkv) = (0, 0);
            for t in d.plan.groups.iter().flat_map(|g| &g.transfers) {
                match t.carries {
                    Payload::Kv { .. } => pkv += t.bytes,
                    _ => pq += t.bytes,
                }
            }
            let sq: u64 = scheds.iter().flat_map(|s| &s.transfers).map(|t| t.q_bytes + t.out_bytes).sum();
            let skv: u64 = scheds
                .iter()
                .map(|s| s.transfers.iter().map(|t| t.kv_bytes).sum::<u64>() + s.in_place_kv_bytes())
                .sum();
            prop_assert_eq!(pq, sq);
            prop_assert!(pkv <= skv);
        }

        /// The tree search picks what the repository's walk and a scan of every
        /// candidate pick: equal schedules on random batches, masks, shapes, ε and
        /// nano-batches, with many documents of one length (ties in priority).
        #[test]
        fn search_picks_as_the_walk_and_the_scan(
            lens in proptest::collection::vec(
                proptest::collection::vec(prop_oneof![1u32..600, Just(96u32), Just(250u32)], 0..8),
                1..9,
            ),
            dp in 1u32..9,
            cp in 1u32..9,
            eps in 0.0f64..0.3,
            slack in 0u32..100,
            mask in prop_oneof![
                Just(Mask::Causal),
                (1u32..64).prop_map(|w| Mask::Sliding { w }),
                (1u32..300).prop_map(|c| Mask::Chunked { c }),
            ],
            kv_heads in 1u32..5,
            group in 1u32..5,
            half in 0usize..3,
        ) {
            let shape = AttnShape { heads_q: kv_heads * group, heads_kv: kv_heads, head_dim: 4, dtype_bytes: 2, mask };
            let c = DistcaConfig::new(shape, eps, 128).unwrap();
            let batch = replicas(&lens, dp, slack);
            let lists: Vec<Vec<HomeItem>> = match half {
                2 => home_items(&batch, cp),
                h => nano_splits(&batch, cp, &mask).into_iter().map(|s| s[h].clone()).collect(),
            };
            same_by_every_pick(&batch, cp, &lists, &c);
        }
    }
}
