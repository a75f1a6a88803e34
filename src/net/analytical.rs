//! The analytical network model: alpha–beta over the bottleneck link, O(1) per transfer.
//!
//! A transfer of `b` bytes from `src` to `dst` along its route takes
//! `α + b / min_link(capacity)`, where α is the sum of the route's link latencies and a
//! link's capacity is nominal bandwidth × efficiency × any injected fault fraction. It
//! ignores every other transfer (no contention): the fast model the flow model is checked
//! against where there is none.
//!
//! Architecture invariant: completions are reported in (finish time, start order).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use crate::cluster::{LinkId, LinkKind, Route, Topology};
use crate::net::{transfer_ps, FixedDurations, GpuId, NetworkModel, Ps};

/// Alpha–beta model over a [`Topology`].
#[derive(Clone, Debug)]
pub struct AnalyticalModel {
    topo: Arc<Topology>,
    /// Per link: its capacity now (nominal × efficiency × any fault scale) and its latency,
    /// side by side and apart from the topology's link records, so a route's link costs one
    /// cache line per link.
    link: Vec<(f64, Ps)>,
    local_latency: Ps,
    /// True when every leaf–spine link has one capacity and latency: a route's time is
    /// then the same whichever spine ECMP picks.
    spines_alike: bool,
    queue: BinaryHeap<Reverse<(Ps, u64, u64)>>,
    seq: u64,
}

impl AnalyticalModel {
    /// The model over `topo`; local transfers (`src == dst`, 0 bytes) take 0 ps.
    pub fn new(topo: Arc<Topology>) -> AnalyticalModel {
        let link: Vec<(f64, Ps)> = topo
            .links
            .iter()
            .map(|l| (l.capacity(), l.latency))
            .collect();
        let spines_alike = spines_alike(&topo, &link);
        AnalyticalModel {
            topo,
            link,
            local_latency: 0,
            spines_alike,
            queue: BinaryHeap::new(),
            seq: 0,
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

    /// Run `link` at `scale` × its bandwidth for transfers started from now on (fault
    /// injection; `scale` in (0, 1]).
    pub fn scale_link(&mut self, _now: Ps, link: LinkId, scale: f64) {
        let l = link as usize;
        if let (Some(c), Some(link)) = (self.link.get_mut(l), self.topo.links.get(l)) {
            c.0 = link.capacity() * scale;
            if link.kind == LinkKind::LeafSpine {
                self.spines_alike = spines_alike(&self.topo, &self.link);
            }
        }
    }

    /// Capacity of `link` now, bytes/s.
    pub fn link_capacity(&self, link: LinkId) -> f64 {
        self.link[link as usize].0
    }

    /// Bottleneck capacity of a route, bytes/s.
    pub fn route_capacity(&self, r: &Route) -> f64 {
        r.links()
            .iter()
            .map(|&l| self.link_capacity(l))
            .fold(f64::INFINITY, f64::min)
    }

    /// Duration of `bytes` over route `r` alone: α + bytes / bottleneck.
    pub fn route_time(&self, r: &Route, bytes: u64) -> Ps {
        if bytes == 0 || r.links().is_empty() {
            return self.local_latency;
        }
        let (alpha, cap) = r
            .links()
            .iter()
            .map(|&l| self.link[l as usize])
            .fold((0, f64::INFINITY), |(a, c), (lc, ll)| (a + ll, c.min(lc)));
        alpha.saturating_add(transfer_ps(bytes as f64, cap))
    }

    /// Duration of a transfer from `src` to `dst` (ECMP choice by `flow_id`).
    pub fn transfer_time(&self, src: GpuId, dst: GpuId, bytes: u64, flow_id: u64) -> Option<Ps> {
        let r = self.topo.route(src, dst, flow_id).ok()?;
        Some(self.route_time(&r, bytes))
    }
}

/// True when every leaf–spine link of `topo` has one (capacity, latency) in `link`.
fn spines_alike(topo: &Topology, link: &[(f64, Ps)]) -> bool {
    let mut spine = topo
        .links
        .iter()
        .zip(link)
        .filter(|(l, _)| l.kind == LinkKind::LeafSpine)
        .map(|(_, c)| c);
    let first = spine.next();
    spine.all(|c| Some(c) == first)
}

impl FixedDurations for AnalyticalModel {
    /// [`AnalyticalModel::transfer_time`] with the tag as ECMP flow id; endpoints that are
    /// not GPUs of the topology finish as a local transfer.
    fn duration(&self, src: GpuId, dst: GpuId, bytes: u64, tag: u64) -> Ps {
        self.transfer_time(src, dst, bytes, tag)
            .unwrap_or(self.local_latency)
    }

    /// The tag picks only the spine ([`Topology::route`]).
    fn tag_free(&self) -> bool {
        self.spines_alike
    }
}

impl NetworkModel for AnalyticalModel {
    fn start(&mut self, now: Ps, src: GpuId, dst: GpuId, bytes: u64, tag: u64) {
        self.seq += 1;
        let end = now.saturating_add(self.duration(src, dst, bytes, tag));
        self.queue.push(Reverse((end, self.seq, tag)));
    }

    fn fixed_durations(&self) -> Option<&dyn FixedDurations> {
        Some(self)
    }

    fn next_completion(&self) -> Option<Ps> {
        self.queue.peek().map(|Reverse((t, _, _))| *t)
    }

    fn set_link_scale(&mut self, now: Ps, link: LinkId, scale: f64) {
        self.scale_link(now, link, scale);
    }

    fn advance(&mut self, now: Ps, done: &mut Vec<u64>) {
        while let Some(Reverse((t, _, tag))) = self.queue.peek().copied() {
            if t > now {
                break;
            }
            self.queue.pop();
            done.push(tag);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpha_beta_and_link_faults() {
        let t = crate::cluster::topology::test_small();
        let mut a = AnalyticalModel::new(t.clone());
        // gpu0 → gpu1 over NVLink: 1 µs + 1 MB / 100 GB/s = 1 µs + 10 µs.
        assert_eq!(a.transfer_time(0, 1, 1_000_000, 0), Some(11_000_000));
        // Half the NVSwitch → gpu1 link: the β term doubles, α stays.
        let down = t.nvlink_down(1);
        let dyn_a: &mut dyn NetworkModel = &mut a;
        dyn_a.set_link_scale(0, down, 0.5);
        assert_eq!(a.transfer_time(0, 1, 1_000_000, 0), Some(21_000_000));
        a.start(5, 0, 1, 1_000_000, 9);
        a.start(5, 2, 2, 1_000_000, 8);
        let mut done = Vec::new();
        a.advance(5, &mut done);
        assert_eq!(done, vec![8]);
        assert_eq!(a.next_completion(), Some(21_000_005));
        // An endpoint outside the topology finishes as a local transfer.
        assert_eq!(a.duration(0, 99, 10, 7), 0);
    }

    /// Durations ignore the tag exactly while every spine link is alike.
    #[test]
    fn tag_free_while_spines_are_alike() {
        let t = crate::cluster::topology::test_small();
        let gpus = t.gpus();
        let varies = |a: &AnalyticalModel| {
            (0..gpus).any(|s| {
                (0..gpus).any(|d| {
                    (1..16).any(|k| a.duration(s, d, 1 << 20, k) != a.duration(s, d, 1 << 20, 0))
                })
            })
        };
        let mut a = AnalyticalModel::new(t.clone());
        assert!(a.tag_free() && !varies(&a));
        let spine = (0..t.links.len() as LinkId)
            .find(|&l| t.links[l as usize].kind == LinkKind::LeafSpine)
            .unwrap();
        a.scale_link(0, spine, 0.5);
        assert!(!a.tag_free() && varies(&a));
        a.scale_link(0, spine, 1.0);
        assert!(a.tag_free() && !varies(&a));
    }
}
