//! A stand-in network for the engine's tests and benchmarks: every transfer takes a fixed
//! latency plus bytes over a bandwidth that depends only on whether both GPUs share a node.
//! No links, no contention. It is *not* the cluster's analytical model (`net::analytical`,
//! built from a topology); it exists so the engine can be tested and timed on its own.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::net::{FixedDurations, GpuId, NetworkModel, Ps};

/// Fixed alpha + bytes / bandwidth, intra- or inter-node.
#[derive(Clone, Debug)]
pub struct StubNet {
    /// GPUs per node (GPU ids are node-major).
    pub gpus_per_node: u32,
    /// Latency of every transfer, ps.
    pub alpha_ps: Ps,
    /// Intra-node bandwidth, bytes per second.
    pub intra_bytes_per_s: f64,
    /// Inter-node bandwidth, bytes per second.
    pub inter_bytes_per_s: f64,
    active: BinaryHeap<Reverse<(Ps, u64, u64)>>,
    seq: u64,
}

impl StubNet {
    /// A stub with the given figures.
    pub fn new(
        gpus_per_node: u32,
        alpha_ps: Ps,
        intra_bytes_per_s: f64,
        inter_bytes_per_s: f64,
    ) -> Self {
        Self {
            gpus_per_node: gpus_per_node.max(1),
            alpha_ps,
            intra_bytes_per_s,
            inter_bytes_per_s,
            active: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// An H200 DGX-like stub: 8 GPUs per node, 450 GB/s NVLink per direction, one 400 Gb/s
    /// (50 GB/s) NIC per GPU, 5 µs latency.
    pub fn dgx_h200() -> Self {
        Self::new(8, 5_000_000, 450e9, 50e9)
    }

    /// The time `bytes` take from `src` to `dst`.
    pub fn duration(&self, src: GpuId, dst: GpuId, bytes: u64) -> Ps {
        if src == dst || bytes == 0 {
            return self.alpha_ps;
        }
        let bw = if src / self.gpus_per_node == dst / self.gpus_per_node {
            self.intra_bytes_per_s
        } else {
            self.inter_bytes_per_s
        };
        self.alpha_ps + (bytes as f64 / bw * 1e12).round() as Ps
    }
}

impl FixedDurations for StubNet {
    fn duration(&self, src: GpuId, dst: GpuId, bytes: u64, _tag: u64) -> Ps {
        StubNet::duration(self, src, dst, bytes)
    }

    fn tag_free(&self) -> bool {
        true
    }
}

impl NetworkModel for StubNet {
    fn start(&mut self, now: Ps, src: GpuId, dst: GpuId, bytes: u64, tag: u64) {
        self.seq += 1;
        let t = now.saturating_add(StubNet::duration(self, src, dst, bytes));
        self.active.push(Reverse((t, self.seq, tag)));
    }

    fn fixed_durations(&self) -> Option<&dyn FixedDurations> {
        Some(self)
    }

    fn next_completion(&self) -> Option<Ps> {
        self.active.peek().map(|r| r.0 .0)
    }

    fn advance(&mut self, now: Ps, done: &mut Vec<u64>) {
        while let Some(Reverse((t, _, tag))) = self.active.peek().copied() {
            if t > now {
                break;
            }
            self.active.pop();
            done.push(tag);
        }
    }
}
