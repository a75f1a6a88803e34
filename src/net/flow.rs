//! The flow-level network model: every transfer is a flow along its route; flows share
//! every link max–min fairly; rates are recomputed only when a flow starts or drains (or a
//! link's bandwidth is changed by fault injection), and the drain events of the flows
//! whose rates changed are rescheduled.
//!
//! # Event lifecycle
//! A flow starts (`start`), competes for bandwidth until its last byte is sent (its *drain*
//! time, `remaining / rate` after its last re-rating), then completes one route latency
//! later. With no other flow it therefore takes `α + bytes / bottleneck`, exactly the
//! analytical model's duration (both use [`crate::net::transfer_ps`]).
//!
//! Starts and drains at the same picosecond are batched into one recomputation: `start`
//! only marks the flow's links dirty, and the recomputation runs as an internal event at
//! that time. [`NetworkModel::next_completion`] therefore returns the earliest *internal*
//! event (a pending recomputation or a drain) when that comes before the next completion;
//! an `advance` to it may finish nothing.
//!
//! # Rate recomputation (progressive filling, exact max–min)
//! Max–min rates decompose over connected components of the flow–link incidence graph, so
//! a recomputation re-rates only the component(s) reachable from the dirty links (found by
//! a search over per-link flow lists kept up to date on every start and drain). Each
//! component is filled alone: count the flows on each link; repeatedly take the link with
//! the smallest fair share `remaining capacity ÷ unfrozen flows`, ties to the smaller link
//! id (a scan in a small component, a binary heap of links with lazy increase-key in a
//! large one), freeze its unfrozen flows at that share and charge it to their other
//! links. Every flow frozen at one link subtracts the same share, so the rates do not
//! depend on the order of the per-link lists. A component of one flow alone on its links
//! (an all-to-all's aggregates on a rail-optimized fabric) takes that filling's result,
//! its smallest capacity, without the filling's scratch. A drain marks dirty only the
//! links it leaves carrying flows. Cost: O(F_c·h + L_c log L_c) for the F_c
//! flows and L_c links of the affected components (h ≤ 6 links per flow) — linear in the
//! active flows that share links with the change, not in all active flows; measured in
//! BENCHMARKS.md. In the worst case (one giant component, e.g. everything crossing one
//! oversubscribed link) that is every active flow. A recomputation that re-rates many
//! flows in several components fills them in parallel (rayon), each component by the same
//! sequential procedure, so the rates are the same at any thread count.
//!
//! Per-link state (flow list, capacity, latency, search marks) is one cache line, and so is
//! what a recomputation reads of a flow: in a large step the engine's op arrays evict the
//! model's state between events, so misses, not arithmetic, set its cost.
//!
//! Architecture invariant: deterministic — no hashing by address, heap ties broken by link
//! id or flow slot, completions reported in (finish time, start order), components filled
//! apart whatever the thread count.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use rayon::prelude::*;

use crate::cluster::{LinkId, Route, Topology};
use crate::net::{transfer_ps, GpuId, NetworkModel, Ps};

/// A flow slot. What a recomputation touches (route, marks, bytes, rate) fills the first
/// cache line; the rest the second.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Flow {
    route: Route,
    /// Bumped on every re-rating; stale drain-queue entries carry an old version.
    version: u32,
    /// The recomputation that last found it (see `FlowModel::epoch`).
    mark: u32,
    /// Its index inside the component that recomputation found.
    local: u32,
    /// Bytes left to send at time `since`.
    remaining: f64,
    rate: f64,
    since: Ps,
    latency: Ps,
    tag: u64,
    seq: u64,
    alive: bool,
}

/// A link's state, in one cache line: its active flows (slots), capacity and latency, and
/// the recomputation scratch.
#[derive(Clone, Debug, Default)]
#[repr(C, align(64))]
struct LinkState {
    flows: Vec<u32>,
    cap: f64,
    latency: Ps,
    /// The recomputation that last found it (see `FlowModel::epoch`).
    mark: u32,
    /// Its index inside the component that recomputation found.
    local: u32,
    /// Whether a flow has crossed it since the model was made.
    used: bool,
}

/// Counters of the work the model did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FlowStats {
    /// Flows started.
    pub starts: u64,
    /// Flows completed (reported by `advance`).
    pub finishes: u64,
    /// Rate recomputations.
    pub recomputes: u64,
    /// Σ over recomputations of the flows they re-rated.
    pub flows_rerated: u64,
    /// Most flows active at once.
    pub max_active: u64,
}

/// Max–min fair flow model over a [`Topology`].
#[derive(Clone, Debug)]
pub struct FlowModel {
    topo: Arc<Topology>,
    links: Vec<LinkState>,
    local_latency: Ps,
    flows: Vec<Flow>,
    free: Vec<u32>,
    active: usize,
    drain_q: BinaryHeap<Reverse<(Ps, u32, u32)>>,
    tail: BinaryHeap<Reverse<(Ps, u64, u64)>>,
    seq: u64,
    dirty: Option<Ps>,
    dirty_links: Vec<LinkId>,
    /// Scratch for recomputation: links and flows whose `mark` equals it were found by the
    /// current one (epoch marks avoid clearing).
    epoch: u32,
    comp_links: Vec<LinkId>,
    comp_flows: Vec<u32>,
    /// Per found component: the ends of its links and flows in `comp_links`, `comp_flows`.
    comps: Vec<(u32, u32)>,
    comp_rates: Vec<f64>,
    stack: Vec<LinkId>,
    filling: Filling,
    stats: FlowStats,
    /// Transfers whose endpoints were not GPUs of the topology (finished as local).
    pub bad_endpoints: u64,
}

impl FlowModel {
    /// The model over `topo`; local transfers take 0 ps.
    pub fn new(topo: Arc<Topology>) -> FlowModel {
        let links = (topo.links.iter())
            .map(|l| LinkState {
                cap: l.capacity(),
                latency: l.latency,
                ..LinkState::default()
            })
            .collect();
        FlowModel {
            topo,
            links,
            local_latency: 0,
            flows: Vec::new(),
            free: Vec::new(),
            active: 0,
            drain_q: BinaryHeap::new(),
            tail: BinaryHeap::new(),
            seq: 0,
            dirty: None,
            dirty_links: Vec::new(),
            epoch: 0,
            comp_links: Vec::new(),
            comp_flows: Vec::new(),
            comps: Vec::new(),
            comp_rates: Vec::new(),
            stack: Vec::new(),
            filling: Filling::default(),
            stats: FlowStats::default(),
            bad_endpoints: 0,
        }
    }

    /// Set the latency of a local transfer.
    pub fn with_local_latency(mut self, ps: Ps) -> Self {
        self.local_latency = ps;
        self
    }

    /// The topology.
    pub fn topology(&self) -> &Arc<Topology> {
        &self.topo
    }

    /// Work counters.
    pub fn stats(&self) -> FlowStats {
        self.stats
    }

    /// Flows currently competing for bandwidth.
    pub fn active(&self) -> usize {
        self.active
    }

    /// The current rate of every active flow, by tag, in start order (for tests).
    pub fn rates(&self) -> Vec<(u64, f64)> {
        let mut r: Vec<(u64, u64, f64)> = self
            .flows
            .iter()
            .filter(|f| f.alive)
            .map(|f| (f.seq, f.tag, f.rate))
            .collect();
        r.sort_by_key(|x| x.0);
        r.into_iter().map(|(_, t, x)| (t, x)).collect()
    }

    /// Bytes of one link's state (a model holds one per link of its topology).
    pub const LINK_BYTES: usize = std::mem::size_of::<LinkState>();

    /// True when no transfer is in flight, draining or waiting for a recomputation.
    pub fn is_idle(&self) -> bool {
        self.active == 0 && self.tail.is_empty() && self.dirty.is_none()
    }

    /// A model of the same network (topology, link bandwidths as scaled so far, local
    /// latency) with no traffic and no counts.
    pub fn idle_copy(&self) -> FlowModel {
        let mut m = FlowModel::new(self.topo.clone()).with_local_latency(self.local_latency);
        for (l, s) in m.links.iter_mut().zip(&self.links) {
            l.cap = s.cap;
        }
        m
    }

    /// The links some flow of this model has crossed, in id order.
    pub fn used_links(&self) -> impl Iterator<Item = LinkId> + '_ {
        (self.links.iter().enumerate())
            .filter(|(_, l)| l.used)
            .map(|(i, _)| i as LinkId)
    }

    /// Models of one network that ran apart, on link-disjoint traffic, up to one time
    /// (every internal event up to it processed), joined into `self` (idle, of the same
    /// network) as one model that ran all their traffic would stand: their flows, drains
    /// and pending completions, the flows of `parts[0]` first in start order, then
    /// `parts[1]`'s, …, and the counters summed. Max–min rates are per component and
    /// components never span parts, so every rate and drain time carries over unchanged.
    pub fn join(&mut self, parts: Vec<FlowModel>) {
        for p in parts {
            debug_assert!(p.dirty.is_none() && p.dirty_links.is_empty());
            let off = self.seq;
            let mut slot_of = vec![u32::MAX; p.flows.len()];
            for (old, f) in p.flows.iter().enumerate().filter(|(_, f)| f.alive) {
                let slot = self.flows.len() as u32;
                slot_of[old] = slot;
                for &l in f.route.links() {
                    self.links[l as usize].flows.push(slot);
                }
                self.flows.push(Flow {
                    mark: 0,
                    local: 0,
                    seq: f.seq + off,
                    ..*f
                });
            }
            for &Reverse((at, old, version)) in p.drain_q.iter() {
                let f = &p.flows[old as usize];
                if f.alive && f.version == version {
                    self.drain_q
                        .push(Reverse((at, slot_of[old as usize], version)));
                }
            }
            self.tail.extend(
                p.tail
                    .iter()
                    .map(|&Reverse((t, s, tag))| Reverse((t, s + off, tag))),
            );
            for (l, pl) in self.links.iter_mut().zip(&p.links) {
                l.used |= pl.used;
            }
            self.seq += p.seq;
            self.active += p.active;
            let (a, b) = (&mut self.stats, p.stats);
            a.starts += b.starts;
            a.finishes += b.finishes;
            a.recomputes += b.recomputes;
            a.flows_rerated += b.flows_rerated;
            a.max_active = a.max_active.max(b.max_active);
            self.bad_endpoints += p.bad_endpoints;
        }
        self.stats.max_active = self.stats.max_active.max(self.active as u64);
    }

    /// From `now` on, run `link` at `scale` × its bandwidth (fault injection; `scale` in
    /// (0, 1]); rates are recomputed at `now`.
    pub fn scale_link(&mut self, now: Ps, link: LinkId, scale: f64) {
        self.run_internal(now, false);
        if let Some(ls) = self.links.get_mut(link as usize) {
            ls.cap = self.topo.links[link as usize].capacity() * scale;
            self.dirty_links.push(link);
            self.mark_dirty(now);
        }
    }

    /// Start a flow of `bytes` along an explicit route (e.g. GPU → NVSwitch only).
    pub fn start_route(&mut self, now: Ps, route: Route, bytes: u64, tag: u64) {
        self.run_internal(now, false);
        self.seq += 1;
        self.stats.starts += 1;
        if bytes == 0 || route.links().is_empty() {
            self.tail.push(Reverse((
                now.saturating_add(self.local_latency),
                self.seq,
                tag,
            )));
            return;
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.flows.push(Flow {
                    route: Route::EMPTY,
                    version: 0,
                    mark: 0,
                    local: 0,
                    remaining: 0.0,
                    rate: 0.0,
                    since: 0,
                    latency: 0,
                    tag: 0,
                    seq: 0,
                    alive: false,
                });
                (self.flows.len() - 1) as u32
            }
        };
        // The route's latency (`Topology::route_latency`), from the links' copies.
        let mut latency: Ps = 0;
        for &l in route.links() {
            let ls = &mut self.links[l as usize];
            ls.flows.push(slot);
            ls.used = true;
            latency += ls.latency;
            self.dirty_links.push(l);
        }
        let f = &mut self.flows[slot as usize];
        *f = Flow {
            route,
            version: f.version.wrapping_add(1),
            mark: f.mark,
            local: 0,
            remaining: bytes as f64,
            rate: 0.0,
            since: now,
            latency,
            tag,
            seq: self.seq,
            alive: true,
        };
        self.active += 1;
        self.stats.max_active = self.stats.max_active.max(self.active as u64);
        self.mark_dirty(now);
    }

    fn mark_dirty(&mut self, now: Ps) {
        self.dirty = Some(self.dirty.map_or(now, |d| d.min(now)));
    }

    /// Drop stale entries from the top of the drain queue, so its top is a real drain.
    fn clean_drain_top(&mut self) {
        while let Some(Reverse((_, slot, version))) = self.drain_q.peek().copied() {
            let f = &self.flows[slot as usize];
            if f.version == version && f.alive {
                return;
            }
            self.drain_q.pop();
        }
    }

    fn next_drain(&self) -> Ps {
        self.drain_q.peek().map_or(Ps::MAX, |Reverse((t, _, _))| *t)
    }

    /// Process drains and recomputations up to `until` (inclusive or not).
    fn run_internal(&mut self, until: Ps, inclusive: bool) {
        loop {
            self.clean_drain_top();
            let drain = self.next_drain();
            let dirty = self.dirty.unwrap_or(Ps::MAX);
            let t = drain.min(dirty);
            if t == Ps::MAX || t > until || (!inclusive && t == until) {
                return;
            }
            if drain <= dirty {
                self.drain(drain);
            } else {
                self.dirty = None;
                self.recompute(dirty);
            }
        }
    }

    /// Retire every flow whose last byte leaves at `t`; it completes a latency later.
    fn drain(&mut self, t: Ps) {
        while let Some(Reverse((at, slot, version))) = self.drain_q.peek().copied() {
            if at > t {
                break;
            }
            self.drain_q.pop();
            let f = &self.flows[slot as usize];
            if f.version != version || !f.alive {
                continue;
            }
            self.tail
                .push(Reverse((at.saturating_add(f.latency), f.seq, f.tag)));
            self.unlink(slot);
        }
        if !self.dirty_links.is_empty() {
            self.mark_dirty(t);
        }
    }

    /// Remove a flow from its links' lists (marking them dirty) and free its slot. A list
    /// is searched for the slot: that reads only the list, which the removal touches
    /// anyway, where keeping each flow's positions up to date would touch the flow moved
    /// into the gap; and it is O(flows on the link), no more than the recomputation the
    /// drain causes. Only a link that still carries flows is marked dirty: an emptied one
    /// has none to re-rate.
    fn unlink(&mut self, slot: u32) {
        let route = self.flows[slot as usize].route;
        for &l in route.links() {
            let list = &mut self.links[l as usize].flows;
            if let Some(p) = list.iter().position(|&x| x == slot) {
                list.swap_remove(p);
            }
            if !list.is_empty() {
                self.dirty_links.push(l);
            }
        }
        let fm = &mut self.flows[slot as usize];
        fm.alive = false;
        fm.version = fm.version.wrapping_add(1);
        self.free.push(slot);
        self.active -= 1;
    }

    /// Re-rate the components reachable from the dirty links at time `t`: bring their
    /// flows' `remaining` up to `t` at the old rates, max–min rates by progressive filling
    /// (components apart, in parallel when they are many and large), then reschedule their
    /// drains.
    fn recompute(&mut self, t: Ps) {
        self.stats.recomputes += 1;
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            // Wrapped: clear the marks once every 2^32 recomputations.
            self.links.iter_mut().for_each(|l| l.mark = 0);
            self.flows.iter_mut().for_each(|f| f.mark = 0);
            self.epoch = 1;
        }
        self.find_components();
        self.stats.flows_rerated += self.comp_flows.len() as u64;
        for &fs in &self.comp_flows {
            let f = &mut self.flows[fs as usize];
            let dt_ps = t.saturating_sub(f.since) as f64;
            // Multiply before dividing: exact for round rates and times.
            f.remaining = (f.remaining - f.rate * dt_ps / 1.0e12).max(0.0);
            f.since = t;
        }
        self.fill_rates();
        for (&fs, &rate) in self.comp_flows.iter().zip(&self.comp_rates) {
            let f = &mut self.flows[fs as usize];
            f.rate = rate;
            f.version = f.version.wrapping_add(1);
            let at = t.saturating_add(transfer_ps(f.remaining, f.rate));
            self.drain_q.push(Reverse((at, fs, f.version)));
        }
    }

    /// The connected components reachable from the dirty links (which it clears), one after
    /// another in `comp_links` and `comp_flows` (ends in `comps`), with every link's and
    /// flow's index inside its component in its `local`.
    fn find_components(&mut self) {
        let ep = self.epoch;
        self.comp_links.clear();
        self.comp_flows.clear();
        self.comps.clear();
        let dirty = std::mem::take(&mut self.dirty_links);
        for &seed in &dirty {
            if self.links[seed as usize].mark == ep {
                continue;
            }
            self.links[seed as usize].mark = ep;
            self.stack.push(seed);
            let (l0, f0) = (self.comp_links.len(), self.comp_flows.len());
            while let Some(l) = self.stack.pop() {
                let ls = &mut self.links[l as usize];
                ls.local = (self.comp_links.len() - l0) as u32;
                self.comp_links.push(l);
                for k in 0..self.links[l as usize].flows.len() {
                    let fs = self.links[l as usize].flows[k];
                    let f = &mut self.flows[fs as usize];
                    if f.mark == ep {
                        continue;
                    }
                    f.mark = ep;
                    f.local = (self.comp_flows.len() - f0) as u32;
                    self.comp_flows.push(fs);
                    for &m in f.route.links() {
                        let ms = &mut self.links[m as usize];
                        if ms.mark != ep {
                            ms.mark = ep;
                            self.stack.push(m);
                        }
                    }
                }
            }
            if self.comp_flows.len() > f0 {
                self.comps
                    .push((self.comp_links.len() as u32, self.comp_flows.len() as u32));
            } else {
                // Links left without flows: nothing to re-rate.
                self.comp_links.truncate(l0);
            }
        }
        self.dirty_links = dirty;
        self.dirty_links.clear();
    }

    /// Max–min rates of the flows of every found component into `comp_rates` (in
    /// `comp_flows` order). Components share no link, so each is filled alone, the same
    /// on any number of threads.
    fn fill_rates(&mut self) {
        let n = self.comp_flows.len();
        self.comp_rates.clear();
        self.comp_rates.resize(n, 0.0);
        let view = FillView {
            links: &self.links,
            flows: &self.flows,
        };
        if self.comps.len() > 1 && n >= PAR_FLOWS {
            let mut outs = Vec::with_capacity(self.comps.len());
            let (mut links, mut flows, mut rates) = (
                self.comp_links.as_slice(),
                self.comp_flows.as_slice(),
                self.comp_rates.as_mut_slice(),
            );
            let (mut l0, mut f0) = (0, 0);
            for &(l1, f1) in &self.comps {
                let (l, lr) = links.split_at(l1 as usize - l0);
                let (f, fr) = flows.split_at(f1 as usize - f0);
                let (r, rr) = rates.split_at_mut(f1 as usize - f0);
                outs.push((l, f, r));
                (links, flows, rates, l0, f0) = (lr, fr, rr, l1 as usize, f1 as usize);
            }
            outs.into_par_iter()
                .for_each_init(Filling::default, |fill, (l, f, r)| fill.run(&view, l, f, r));
        } else {
            let (mut l0, mut f0) = (0, 0);
            for &(l1, f1) in &self.comps {
                let (l1, f1) = (l1 as usize, f1 as usize);
                self.filling.run(
                    &view,
                    &self.comp_links[l0..l1],
                    &self.comp_flows[f0..f1],
                    &mut self.comp_rates[f0..f1],
                );
                (l0, f0) = (l1, f1);
            }
        }
    }
}

/// Re-rated flows at or above which the components of one recomputation are filled in
/// parallel.
const PAR_FLOWS: usize = 4096;

/// Components of at most this many links find their bottleneck by a scan, larger ones by
/// a heap (both pick the smallest fair share, ties to the smaller link id).
const SCAN_LINKS: usize = 32;

/// What progressive filling reads: the model's links and flows, with the found components'
/// local indices.
struct FillView<'a> {
    links: &'a [LinkState],
    flows: &'a [Flow],
}

/// Scratch of progressive filling over one component, indexed by local link and flow.
#[derive(Clone, Debug, Default)]
struct Filling {
    rem: Vec<f64>,
    count: Vec<u32>,
    frozen: Vec<bool>,
    heap: BinaryHeap<Reverse<(u64, LinkId, u32)>>,
}

impl Filling {
    /// Exact max–min rates of one component's `flows` (over its `links`) into `rate`:
    /// repeatedly take the link with the smallest fair share `remaining capacity ÷
    /// unfrozen flows` (ties to the smaller link id), freeze its unfrozen flows at that
    /// share and charge it to their other links.
    fn run(&mut self, v: &FillView, links: &[LinkId], flows: &[u32], rate: &mut [f64]) {
        if let [fs] = flows {
            if let Some(r) = alone(v, *fs) {
                rate[0] = r;
                return;
            }
        }
        self.rem.clear();
        self.count.clear();
        for &l in links {
            let ls = &v.links[l as usize];
            self.rem.push(ls.cap);
            self.count.push(ls.flows.len() as u32);
        }
        self.frozen.clear();
        self.frozen.resize(flows.len(), false);
        let scan = links.len() <= SCAN_LINKS;
        self.heap.clear();
        if !scan {
            for (i, &l) in links.iter().enumerate() {
                if self.count[i] > 0 {
                    self.heap.push(Reverse((
                        share_key(self.rem[i], self.count[i]),
                        l,
                        i as u32,
                    )));
                }
            }
        }
        while let Some(i) = if scan {
            self.scan_min(links)
        } else {
            self.heap_min()
        } {
            let l = links[i];
            let share = self.rem[i].max(0.0) / f64::from(self.count[i]);
            for &fs in &v.links[l as usize].flows {
                let f = &v.flows[fs as usize];
                let j = f.local as usize;
                if self.frozen[j] {
                    continue;
                }
                self.frozen[j] = true;
                rate[j] = share;
                for &m in f.route.links() {
                    if m != l {
                        let k = v.links[m as usize].local as usize;
                        self.rem[k] -= share;
                        self.count[k] -= 1;
                    }
                }
            }
            self.count[i] = 0;
        }
    }

    /// The unfinished link with the smallest (fair share, link id), by a scan.
    fn scan_min(&self, links: &[LinkId]) -> Option<usize> {
        let mut best: Option<(u64, LinkId, usize)> = None;
        for (i, &l) in links.iter().enumerate() {
            let c = self.count[i];
            if c == 0 {
                continue;
            }
            let k = (share_key(self.rem[i], c), l, i);
            if best.is_none_or(|b| k < b) {
                best = Some(k);
            }
        }
        best.map(|b| b.2)
    }

    /// The same by the heap. A link's fair share only grows as flows elsewhere freeze at
    /// smaller shares ((rem − s)/(c − 1) ≥ rem/c when s ≤ rem/c), so a popped key that is
    /// smaller than the link's current share is re-queued at its current share (lazy
    /// increase-key); a popped key equal to it is the true minimum.
    fn heap_min(&mut self) -> Option<usize> {
        while let Some(Reverse((key, l, i))) = self.heap.pop() {
            let c = self.count[i as usize];
            if c == 0 {
                continue;
            }
            let cur = share_key(self.rem[i as usize], c);
            if cur > key {
                self.heap.push(Reverse((cur, l, i)));
                continue;
            }
            return Some(i as usize);
        }
        None
    }
}

/// The rate of flow `fs` when it is the only flow on each of its links: progressive
/// filling's first bottleneck (the smallest `capacity ÷ 1`) and its share, computed as
/// [`Filling::run`] computes them; `None` when a link carries another flow (or the route
/// crosses a link twice).
fn alone(v: &FillView, fs: u32) -> Option<f64> {
    let mut key = u64::MAX;
    for &l in v.flows[fs as usize].route.links() {
        let ls = &v.links[l as usize];
        if ls.flows.len() != 1 {
            return None;
        }
        key = key.min(share_key(ls.cap, 1));
    }
    Some(f64::from_bits(key))
}

/// Heap key of a fair share: the bits of a non-negative f64 order like the number.
fn share_key(rem: f64, count: u32) -> u64 {
    (rem.max(0.0) / f64::from(count)).to_bits()
}

impl NetworkModel for FlowModel {
    fn start(&mut self, now: Ps, src: GpuId, dst: GpuId, bytes: u64, tag: u64) {
        let route = match self.topo.route(src, dst, tag) {
            Ok(r) => r,
            Err(_) => {
                self.bad_endpoints += 1;
                Route::EMPTY
            }
        };
        self.start_route(now, route, bytes, tag);
    }

    /// The earliest completion, or an earlier internal event (rate recomputation or a
    /// drain) that `advance` must process first. May be earlier than needed when the top
    /// of the drain queue is stale (then `advance` to it does nothing visible).
    fn next_completion(&self) -> Option<Ps> {
        let t = self
            .next_drain()
            .min(self.dirty.unwrap_or(Ps::MAX))
            .min(self.tail.peek().map_or(Ps::MAX, |Reverse((t, _, _))| *t));
        (t != Ps::MAX).then_some(t)
    }

    fn set_link_scale(&mut self, now: Ps, link: LinkId, scale: f64) {
        self.scale_link(now, link, scale);
    }

    fn as_flow(&mut self) -> Option<&mut FlowModel> {
        Some(self)
    }

    fn advance(&mut self, now: Ps, done: &mut Vec<u64>) {
        self.run_internal(now, true);
        self.clean_drain_top();
        while let Some(Reverse((t, _, tag))) = self.tail.peek().copied() {
            if t > now {
                break;
            }
            self.tail.pop();
            self.stats.finishes += 1;
            done.push(tag);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::TopologySpec;
    use crate::net::AnalyticalModel;

    /// 2 nodes × 2 GPUs, 1 NIC per node at 100 Gb/s (12.5 GB/s), one leaf per node, one
    /// spine, leaf uplink 12.5 GB/s; NVLink 100 GB/s; all efficiencies 1; latencies 1 µs.
    pub(crate) const TWO: &str = r#"
name = "two"
nodes = 2
gpus_per_node = 2
[nvlink]
bandwidth_gbyte_s = 100.0
efficiency = 1.0
latency_us = 1.0
[nic]
per_node = 1
bandwidth_gbit_s = 100.0
efficiency = 1.0
latency_us = 1.0
pcie_gbyte_s = 50.0
[fabric]
hosts_per_leaf = 1
spines = 1
oversubscription = 1.0
hop_latency_us = 0.0
rail_optimized = true
"#;

    fn topo() -> Arc<Topology> {
        Arc::new(
            TopologySpec::parse(TWO, "two.toml")
                .unwrap()
                .build(None)
                .unwrap(),
        )
    }

    fn run_all(m: &mut dyn NetworkModel) -> Vec<(Ps, u64)> {
        let mut out = Vec::new();
        let mut done = Vec::new();
        while let Some(t) = m.next_completion() {
            m.advance(t, &mut done);
            out.extend(done.drain(..).map(|tag| (t, tag)));
        }
        out
    }

    #[test]
    fn single_flow_equals_analytical() {
        let t = topo();
        let mut f = FlowModel::new(t.clone());
        let mut a = AnalyticalModel::new(t);
        for (i, (s, d, b)) in [(0, 1, 1_000_000u64), (0, 3, 12_345_678), (2, 2, 5)]
            .into_iter()
            .enumerate()
        {
            f.start(0, s, d, b, i as u64);
            a.start(0, s, d, b, i as u64);
        }
        // Different routes do not share links here (0→1 NVLink, 0→3 network).
        assert_eq!(run_all(&mut f), run_all(&mut a));
        // 0→3: 1 µs PCIe latency + 12,345,678 B / 12.5 GB/s = 987,654.24 ns → ceil in ps.
        let want = 1_000_000 + (12_345_678f64 * 1e12 / 12.5e9).ceil() as u64;
        assert_eq!(a.transfer_time(0, 3, 12_345_678, 1), Some(want));
    }

    #[test]
    fn two_flows_share_a_nic_then_the_survivor_speeds_up() {
        // gpu0→gpu2 and gpu1→gpu3 both cross node 0's NIC (12.5 GB/s): 6.25 GB/s each.
        // The 1 MB flow drains at 1e6/6.25e9 s = 160 µs; the 3 MB one has 2 MB left and
        // then runs alone at 12.5 GB/s: 160 µs more. Plus 1 µs latency each.
        let mut f = FlowModel::new(topo());
        f.start(0, 0, 2, 1_000_000, 7);
        f.start(0, 1, 3, 3_000_000, 8);
        f.advance(0, &mut Vec::new());
        assert_eq!(f.rates(), vec![(7, 6.25e9), (8, 6.25e9)]);
        let got = run_all(&mut f);
        assert_eq!(got, vec![(161_000_000, 7), (321_000_000, 8)]);
        assert_eq!(f.stats().starts, 2);
        assert_eq!(f.stats().finishes, 2);
    }

    #[test]
    fn max_min_with_two_bottlenecks() {
        // Flows: A gpu0→gpu2 (NIC up of node 0 + NIC down of node 1),
        //        B gpu1→gpu0 (NVLink), C gpu3→gpu2 (NVLink down of gpu2 shared? no: NVLink
        //        only), D gpu1→gpu3 (NIC up of node 0).
        // NIC up of node 0 carries A and D → 6.25 GB/s each; B alone on NVLink → 100 GB/s.
        // Then the NVLink down-link of gpu2 is shared by C (100 GB/s link) only; A enters
        // gpu2 over PCIe (50 GB/s) — not a bottleneck. Rates: A 6.25, B 100, C 100, D 6.25.
        let mut f = FlowModel::new(topo());
        f.start(0, 0, 2, 1 << 30, 1);
        f.start(0, 1, 0, 1 << 30, 2);
        f.start(0, 3, 2, 1 << 30, 3);
        f.start(0, 1, 3, 1 << 30, 4);
        f.advance(0, &mut Vec::new());
        assert_eq!(
            f.rates(),
            vec![(1, 6.25e9), (2, 100e9), (3, 100e9), (4, 6.25e9)]
        );
        // Fault: node 0's NIC at a quarter: A and D get 12.5/4/2 each.
        let nic = f.topology().link_by_name("nic0.0>leaf0").unwrap();
        f.set_link_scale(0, nic, 0.25);
        f.advance(0, &mut Vec::new());
        assert_eq!(f.rates()[0], (1, 1.5625e9));
        assert_eq!(f.rates()[3], (4, 1.5625e9));
    }

    #[test]
    fn completions_come_in_time_then_start_order() {
        let mut f = FlowModel::new(topo());
        // Two identical uncontended NVLink transfers on disjoint links finish together.
        f.start(5, 1, 0, 1000, 42);
        f.start(5, 0, 1, 1000, 41);
        f.start(5, 3, 3, 0, 40);
        let got = run_all(&mut f);
        assert_eq!(got[0], (5, 40));
        assert_eq!(got[1].1, 42);
        assert_eq!(got[2].1, 41);
        assert_eq!(got[1].0, got[2].0);
    }

    /// Reference max–min: naive progressive filling over every flow (no components, no
    /// heap), O(L·F) per round.
    fn reference_rates(topo: &Topology, routes: &[Route]) -> Vec<f64> {
        let mut rate = vec![f64::NAN; routes.len()];
        let mut rem: Vec<f64> = topo.links.iter().map(|l| l.capacity()).collect();
        loop {
            let mut count = vec![0u32; rem.len()];
            for (i, r) in routes.iter().enumerate() {
                if rate[i].is_nan() {
                    for &l in r.links() {
                        count[l as usize] += 1;
                    }
                }
            }
            let Some((bl, share)) = (0..rem.len())
                .filter(|&l| count[l] > 0)
                .map(|l| (l, rem[l] / f64::from(count[l])))
                .min_by(|a, b| a.1.total_cmp(&b.1))
            else {
                return rate;
            };
            for (i, r) in routes.iter().enumerate() {
                if rate[i].is_nan() && r.links().contains(&(bl as u32)) {
                    rate[i] = share;
                    for &l in r.links() {
                        rem[l as usize] -= share;
                    }
                }
            }
        }
    }

    #[test]
    fn incremental_max_min_matches_reference_as_flows_come_and_go() {
        let t = crate::cluster::topology::test_small();
        let mut rng = crate::rng::stream(9, "flow-reference", 0);
        use rand::Rng as _;
        let mut f = FlowModel::new(t.clone());
        let mut routes = std::collections::BTreeMap::new();
        let mut now = 0;
        let mut tag = 0u64;
        for _wave in 0..6 {
            for _ in 0..12 {
                let (src, dst) = (rng.random_range(0..16), rng.random_range(0..16));
                if src == dst {
                    continue;
                }
                f.start(now, src, dst, rng.random_range(1_000..5_000_000), tag);
                routes.insert(tag, t.route(src, dst, tag).unwrap());
                tag += 1;
            }
            f.advance(now, &mut Vec::new());
            let got = f.rates();
            let rs: Vec<Route> = got.iter().map(|(tg, _)| routes[tg]).collect();
            let want = reference_rates(&t, &rs);
            for ((tg, r), w) in got.iter().zip(&want) {
                assert!((r - w).abs() <= 1e-9 * w, "flow {tg}: {r} vs reference {w}");
            }
            // Let some flows finish before the next wave.
            let mut done = Vec::new();
            for _ in 0..8 {
                if let Some(n) = f.next_completion() {
                    now = n;
                    f.advance(now, &mut done);
                }
            }
        }
        // Same inputs, same outputs.
        let again = {
            let mut g = FlowModel::new(t.clone());
            let mut out = Vec::new();
            for k in 0..30u64 {
                g.start(
                    k * 1000,
                    (k % 16) as u32,
                    ((k * 7 + 3) % 16) as u32,
                    1 << 20,
                    k,
                );
            }
            while let Some(n) = g.next_completion() {
                let mut d = Vec::new();
                g.advance(n, &mut d);
                out.extend(d.into_iter().map(|x| (n, x)));
            }
            out
        };
        let mut g = FlowModel::new(t);
        for k in 0..30u64 {
            g.start(
                k * 1000,
                (k % 16) as u32,
                ((k * 7 + 3) % 16) as u32,
                1 << 20,
                k,
            );
        }
        assert_eq!(run_all(&mut g), again);
    }

    /// The straightforward flow model the optimized one must equal to the bit: active flows
    /// in a list in start order, the affected flows found by a fixpoint over links, rates
    /// by naive progressive filling over every active flow (O(L·F) per round); the same
    /// event rules (starts and drains at one picosecond batched, drains before the
    /// recomputation, completion a route latency after the drain).
    struct Naive {
        topo: Arc<Topology>,
        cap: Vec<f64>,
        flows: Vec<NaiveFlow>,
        tail: Vec<(Ps, u64, u64)>,
        dirty: Option<Ps>,
        dirty_links: Vec<LinkId>,
        seq: u64,
    }

    struct NaiveFlow {
        route: Route,
        remaining: f64,
        rate: f64,
        since: Ps,
        drain: Ps,
        tag: u64,
        seq: u64,
    }

    impl Naive {
        fn new(topo: Arc<Topology>) -> Naive {
            let cap = topo.links.iter().map(|l| l.capacity()).collect();
            Naive {
                topo,
                cap,
                flows: Vec::new(),
                tail: Vec::new(),
                dirty: None,
                dirty_links: Vec::new(),
                seq: 0,
            }
        }

        fn mark_dirty(&mut self, t: Ps) {
            self.dirty = Some(self.dirty.map_or(t, |d| d.min(t)));
        }

        fn run_internal(&mut self, until: Ps, inclusive: bool) {
            loop {
                let drain = self.flows.iter().map(|f| f.drain).min().unwrap_or(Ps::MAX);
                let dirty = self.dirty.unwrap_or(Ps::MAX);
                let t = drain.min(dirty);
                if t == Ps::MAX || t > until || (!inclusive && t == until) {
                    return;
                }
                if drain <= dirty {
                    for f in self.flows.iter().filter(|f| f.drain == drain) {
                        let lat = self.topo.route_latency(&f.route);
                        self.tail.push((drain.saturating_add(lat), f.seq, f.tag));
                        self.dirty_links.extend_from_slice(f.route.links());
                    }
                    self.flows.retain(|f| f.drain != drain);
                    self.mark_dirty(drain);
                } else {
                    self.dirty = None;
                    self.recompute(dirty);
                }
            }
        }

        fn recompute(&mut self, t: Ps) {
            let mut links: Vec<LinkId> = std::mem::take(&mut self.dirty_links);
            let mut hit = vec![false; self.flows.len()];
            loop {
                let mut grew = false;
                for (i, f) in self.flows.iter().enumerate() {
                    if !hit[i] && f.route.links().iter().any(|l| links.contains(l)) {
                        hit[i] = true;
                        links.extend_from_slice(f.route.links());
                        grew = true;
                    }
                }
                if !grew {
                    break;
                }
            }
            let mut rate = vec![f64::NAN; self.flows.len()];
            let mut rem = self.cap.clone();
            loop {
                let mut count = vec![0u32; rem.len()];
                for (i, f) in self.flows.iter().enumerate() {
                    if rate[i].is_nan() {
                        for &l in f.route.links() {
                            count[l as usize] += 1;
                        }
                    }
                }
                let Some((bl, share)) = (0..rem.len())
                    .filter(|&l| count[l] > 0)
                    .map(|l| (l, rem[l].max(0.0) / f64::from(count[l])))
                    .min_by(|a, b| a.1.total_cmp(&b.1))
                else {
                    break;
                };
                for (i, f) in self.flows.iter().enumerate() {
                    if rate[i].is_nan() && f.route.links().contains(&(bl as u32)) {
                        rate[i] = share;
                        for &l in f.route.links() {
                            rem[l as usize] -= share;
                        }
                    }
                }
            }
            for (i, f) in self.flows.iter_mut().enumerate() {
                if hit[i] {
                    let dt_ps = t.saturating_sub(f.since) as f64;
                    f.remaining = (f.remaining - f.rate * dt_ps / 1.0e12).max(0.0);
                    f.since = t;
                    f.rate = rate[i];
                    f.drain = t.saturating_add(transfer_ps(f.remaining, f.rate));
                }
            }
        }
    }

    impl NetworkModel for Naive {
        fn start(&mut self, now: Ps, src: GpuId, dst: GpuId, bytes: u64, tag: u64) {
            self.run_internal(now, false);
            self.seq += 1;
            let route = self.topo.route(src, dst, tag).unwrap();
            if bytes == 0 || route.links().is_empty() {
                self.tail.push((now, self.seq, tag));
                return;
            }
            self.dirty_links.extend_from_slice(route.links());
            self.flows.push(NaiveFlow {
                route,
                remaining: bytes as f64,
                rate: 0.0,
                since: now,
                drain: Ps::MAX,
                tag,
                seq: self.seq,
            });
            self.mark_dirty(now);
        }

        fn next_completion(&self) -> Option<Ps> {
            let t = (self.flows.iter().map(|f| f.drain))
                .chain(self.dirty)
                .chain(self.tail.iter().map(|x| x.0))
                .min();
            t.filter(|&t| t != Ps::MAX)
        }

        fn set_link_scale(&mut self, now: Ps, link: LinkId, scale: f64) {
            self.run_internal(now, false);
            self.cap[link as usize] = self.topo.links[link as usize].capacity() * scale;
            self.dirty_links.push(link);
            self.mark_dirty(now);
        }

        fn advance(&mut self, now: Ps, done: &mut Vec<u64>) {
            self.run_internal(now, true);
            self.tail.sort_unstable();
            let n = self.tail.partition_point(|x| x.0 <= now);
            done.extend(self.tail.drain(..n).map(|x| x.2));
        }
    }

    /// A model under test: its rates in start order.
    trait Rated: NetworkModel {
        fn rates_now(&self) -> Vec<(u64, f64)>;
    }

    impl Rated for FlowModel {
        fn rates_now(&self) -> Vec<(u64, f64)> {
            self.rates()
        }
    }

    impl Rated for Naive {
        fn rates_now(&self) -> Vec<(u64, f64)> {
            self.flows.iter().map(|f| (f.tag, f.rate)).collect()
        }
    }

    /// One scripted action at a time: start a flow or scale a link.
    #[derive(Clone, Copy)]
    enum Act {
        Start(GpuId, GpuId, u64, u64),
        Scale(LinkId, f64),
    }

    fn small() -> Arc<Topology> {
        crate::cluster::topology::test_small()
    }

    /// Random flows (many at one picosecond, some local or empty) and link scalings on
    /// test-small; with `burst`, first more than `PAR_FLOWS` flows at time 0 inside the
    /// nodes (one component per node, so they are filled in parallel).
    fn script(seed: u64, burst: bool) -> Vec<(Ps, Act)> {
        use rand::Rng as _;
        let mut rng = crate::rng::stream(seed, "flow-differential", 0);
        let links = small().links.len() as u32;
        let mut acts = Vec::new();
        let mut tag = 0;
        if burst {
            for k in 0..PAR_FLOWS as u32 + 100 {
                let node = k % 4;
                let (a, b) = (rng.random_range(0..4), rng.random_range(1..4));
                let bytes = [1u64 << 20, 3 << 20, 5 << 20][rng.random_range(0..3)];
                let (src, dst) = (node * 4 + a, node * 4 + (a + b) % 4);
                acts.push((0, Act::Start(src, dst, bytes, tag)));
                tag += 1;
            }
        }
        let mut now = 1;
        for _ in 0..400 {
            if rng.random_range(0..3) != 0 {
                now += rng.random_range(0..300_000_000);
            }
            if rng.random_range(0..12) == 0 {
                let scale = [0.25, 0.5, 0.3, 1.0][rng.random_range(0..4)];
                acts.push((now, Act::Scale(rng.random_range(0..links), scale)));
            } else {
                let (src, dst) = (rng.random_range(0..16), rng.random_range(0..16));
                let bytes = rng.random_range(0..8_000_000);
                acts.push((now, Act::Start(src, dst, bytes, tag)));
                tag += 1;
            }
        }
        acts
    }

    /// Play `acts` on `m`: every completion as (time, tag), and the rates after each
    /// instant's actions.
    #[allow(clippy::type_complexity)]
    fn play(m: &mut dyn Rated, acts: &[(Ps, Act)]) -> (Vec<(Ps, u64)>, Vec<Vec<(u64, f64)>>) {
        let mut out = Vec::new();
        let mut seen = Vec::new();
        let mut done = Vec::new();
        let mut step = |m: &mut dyn Rated, until: Ps, out: &mut Vec<(Ps, u64)>| {
            while let Some(n) = m.next_completion().filter(|&n| n <= until) {
                m.advance(n, &mut done);
                out.extend(done.drain(..).map(|tag| (n, tag)));
            }
        };
        for (i, &(t, a)) in acts.iter().enumerate() {
            step(m, t.saturating_sub(1), &mut out);
            match a {
                Act::Start(s, d, b, tag) => m.start(t, s, d, b, tag),
                Act::Scale(l, x) => m.set_link_scale(t, l, x),
            }
            if acts.get(i + 1).is_none_or(|n| n.0 != t) {
                step(m, t, &mut out);
                seen.push(m.rates_now());
            }
        }
        step(m, Ps::MAX, &mut out);
        (out, seen)
    }

    #[test]
    fn equals_straightforward_recomputation_to_the_picosecond() {
        for (seed, burst) in [(1, false), (2, false), (3, true)] {
            let acts = script(seed, burst);
            let (fast, fast_rates) = play(&mut FlowModel::new(small()), &acts);
            let (naive, naive_rates) = play(&mut Naive::new(small()), &acts);
            assert_eq!(
                fast.len(),
                acts.iter()
                    .filter(|a| matches!(a.1, Act::Start(..)))
                    .count()
            );
            assert_eq!(fast, naive, "seed {seed}: completions differ");
            assert_eq!(fast_rates, naive_rates, "seed {seed}: rates differ");
        }
    }

    #[test]
    fn same_timeline_at_one_and_three_threads() {
        let acts = script(4, true);
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut f = FlowModel::new(small());
                let got = play(&mut f, &acts);
                (got, f.stats())
            })
        };
        let one = run(1);
        assert!(one.1.recomputes > 0 && one.1.max_active > PAR_FLOWS as u64);
        assert_eq!(one, run(3));
    }
}
