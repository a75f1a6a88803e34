//! Summary measures of a built topology: diameter (GPU-to-GPU hops) and bisection
//! bandwidth.
//!
//! Bisection bandwidth is the maximum flow, over nominal link bandwidths, from one half of
//! the cluster to the other (halves at an NVLink-domain boundary when there are at least
//! two domains, else half the GPUs of the one domain), computed exactly with Dinic's
//! algorithm on the link graph. The diameter is the largest BFS hop count between two
//! GPUs; BFS starts from every GPU of the first and the last node (every node is wired
//! alike, so these eccentricities cover the graph; the exhaustive check is a test).

use std::collections::VecDeque;

use petgraph::graph::NodeIndex;
use petgraph::visit::EdgeRef;

use crate::cluster::topology::{Topology, Vertex};

/// Hop distance from `src` (a vertex) to every vertex, `u32::MAX` for unreachable.
pub fn bfs_hops(topo: &Topology, src: u32) -> Vec<u32> {
    let mut dist = vec![u32::MAX; topo.vertices.len()];
    let mut queue = VecDeque::new();
    dist[src as usize] = 0;
    queue.push_back(src);
    while let Some(v) = queue.pop_front() {
        let d = dist[v as usize];
        for e in topo.graph.edges(NodeIndex::new(v as usize)) {
            let w = e.target().index();
            if dist[w] == u32::MAX {
                dist[w] = d + 1;
                queue.push_back(w as u32);
            }
        }
    }
    dist
}

/// Largest hop count between two GPUs (from the GPUs of the first and last node).
pub fn diameter(topo: &Topology) -> u32 {
    let g = topo.gpus_per_node;
    let last = topo.gpus() - g;
    (0..g)
        .chain(last..last + g)
        .map(|s| {
            let d = bfs_hops(topo, s);
            (0..topo.gpus() as usize).map(|t| d[t]).max().unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

/// Exhaustive diameter (BFS from every GPU); for tests and small topologies.
pub fn diameter_exhaustive(topo: &Topology) -> u32 {
    (0..topo.gpus())
        .map(|s| {
            let d = bfs_hops(topo, s);
            (0..topo.gpus() as usize).map(|t| d[t]).max().unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

/// One-way bisection bandwidth in bytes/s (nominal), and the GPUs on side A.
pub fn bisection_bandwidth(topo: &Topology) -> (f64, u32) {
    let gpus = topo.gpus();
    let half = if topo.domains() >= 2 {
        (topo.domains() / 2) * topo.domain_gpus()
    } else {
        gpus / 2
    };
    if half == 0 {
        return (0.0, 0);
    }
    // Capacities in bytes/s as integers (bandwidths are whole bytes/s up to rounding).
    let n = topo.vertices.len() + 2;
    let (s, t) = (n - 2, n - 1);
    let mut net = Dinic::new(n);
    for l in &topo.links {
        net.add_edge(l.src as usize, l.dst as usize, l.bandwidth.round() as u64);
    }
    for (v, vert) in topo.vertices.iter().enumerate() {
        if let Vertex::Gpu(g) = vert {
            if *g < half {
                net.add_edge(s, v, u64::MAX / 4);
            } else {
                net.add_edge(v, t, u64::MAX / 4);
            }
        }
    }
    (net.max_flow(s, t) as f64, half)
}

/// Dinic's maximum flow on an adjacency-array network with integer capacities.
struct Dinic {
    head: Vec<usize>,
    to: Vec<usize>,
    cap: Vec<u64>,
    next: Vec<usize>,
    level: Vec<u32>,
    iter: Vec<usize>,
}

const NIL: usize = usize::MAX;

impl Dinic {
    fn new(n: usize) -> Dinic {
        Dinic {
            head: vec![NIL; n],
            to: Vec::new(),
            cap: Vec::new(),
            next: Vec::new(),
            level: vec![0; n],
            iter: vec![NIL; n],
        }
    }

    fn add_edge(&mut self, a: usize, b: usize, c: u64) {
        for (x, y, cc) in [(a, b, c), (b, a, 0)] {
            self.to.push(y);
            self.cap.push(cc);
            self.next.push(self.head[x]);
            self.head[x] = self.to.len() - 1;
        }
    }

    fn bfs(&mut self, s: usize, t: usize) -> bool {
        self.level.iter_mut().for_each(|l| *l = u32::MAX);
        self.level[s] = 0;
        let mut q = VecDeque::from([s]);
        while let Some(v) = q.pop_front() {
            let mut e = self.head[v];
            while e != NIL {
                let w = self.to[e];
                if self.cap[e] > 0 && self.level[w] == u32::MAX {
                    self.level[w] = self.level[v] + 1;
                    q.push_back(w);
                }
                e = self.next[e];
            }
        }
        self.level[t] != u32::MAX
    }

    /// Blocking-flow DFS with an explicit stack (no recursion on big graphs).
    fn augment(&mut self, s: usize, t: usize) -> u64 {
        let mut total = 0u64;
        loop {
            // Find one s–t path in the level graph, advancing per-vertex edge iterators.
            let mut path: Vec<usize> = Vec::new();
            let mut v = s;
            loop {
                if v == t {
                    break;
                }
                let mut e = self.iter[v];
                while e != NIL {
                    let w = self.to[e];
                    if self.cap[e] > 0 && self.level[w] == self.level[v] + 1 {
                        break;
                    }
                    e = self.next[e];
                }
                self.iter[v] = e;
                if e == NIL {
                    // Dead end: retreat.
                    self.level[v] = u32::MAX;
                    match path.pop() {
                        Some(pe) => v = self.to[pe ^ 1],
                        None => return total,
                    }
                } else {
                    path.push(e);
                    v = self.to[e];
                }
            }
            let push = path.iter().map(|&e| self.cap[e]).min().unwrap_or(0);
            for &e in &path {
                self.cap[e] -= push;
                self.cap[e ^ 1] += push;
            }
            total += push;
        }
    }

    fn max_flow(&mut self, s: usize, t: usize) -> u64 {
        let mut flow = 0u64;
        while self.bfs(s, t) {
            self.iter.copy_from_slice(&self.head);
            flow = flow.saturating_add(self.augment(s, t));
        }
        flow
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::topology::TopologySpec;

    fn topo(text: &str, nodes: u32) -> Topology {
        TopologySpec::parse(text, "t.toml")
            .unwrap()
            .build(Some(nodes))
            .unwrap()
    }

    const CLOS: &str = r#"
name = "t"
nodes = 4
gpus_per_node = 2
[nvlink]
bandwidth_gbyte_s = 100.0
efficiency = 1.0
latency_us = 1.0
[nic]
per_node = 2
bandwidth_gbit_s = 400.0
efficiency = 1.0
latency_us = 1.0
pcie_gbyte_s = 64.0
[fabric]
hosts_per_leaf = 2
spines = 2
oversubscription = 2.0
hop_latency_us = 0.0
rail_optimized = true
"#;

    #[test]
    fn bisection_matches_hand_calculation() {
        // 4 nodes, 2 groups of 2 nodes; halves = nodes {0,1} (group 0) vs {2,3} (group 1):
        // everything crosses the spines. Per group 2 rail leaves, each with 2 uplinks of
        // 2 hosts × 50 GB/s ÷ (2 × 2) = 25 GB/s: 4 × 25 = 100 GB/s one way.
        let (bw, half) = bisection_bandwidth(&topo(CLOS, 4));
        assert_eq!(half, 4);
        assert_eq!(bw, 100e9);
        // Non-blocking: NICs limit: 2 nodes × 2 NICs × 50 GB/s = 200 GB/s.
        let (bw, _) = bisection_bandwidth(&topo(
            &CLOS.replace("subscription = 2.0", "subscription = 1.0"),
            4,
        ));
        assert_eq!(bw, 200e9);
        // One node: gpu0 → gpu1 over NVLink (100 GB/s) plus out of gpu0's rail-0 NIC
        // (50 GB/s) through both spines (2 × 25 GB/s) into the rail-1 leaf and NIC: 150.
        let (bw, half) = bisection_bandwidth(&topo(CLOS, 1));
        assert_eq!((bw, half), (150e9, 1));
    }

    #[test]
    fn diameter_sampled_equals_exhaustive() {
        for nodes in [1, 2, 3, 4, 6] {
            let t = topo(CLOS, nodes);
            assert_eq!(diameter(&t), diameter_exhaustive(&t), "nodes = {nodes}");
        }
        assert_eq!(diameter(&topo(CLOS, 1)), 2);
        // gpu → nic → leaf → spine → leaf → nic → gpu.
        assert_eq!(diameter(&topo(CLOS, 4)), 6);
    }
}
