//! Topology: the cluster description (`topologies/*.toml`), the graph built from it, and
//! deterministic routing.
//!
//! # The family of clusters described
//! `nodes` nodes of `gpus_per_node` GPUs. GPUs of one NVLink domain (a node, or a
//! super-node of `super_node.nodes` nodes such as an NVL72 rack) meet at one NVSwitch vertex
//! (the switch chips of a domain are one non-blocking crossbar). Each node has
//! `nic.per_node` NICs; GPU `l` of a node reaches NIC `l·nics/gpus` over PCIe. NICs attach
//! to leaf switches: with `rail_optimized`, NIC `r` of the `hosts_per_leaf` nodes of a group
//! goes to that group's rail-`r` leaf (NVIDIA SuperPOD wiring); otherwise all NICs of the
//! group share one leaf. Every leaf has one uplink to each of `spines` spine switches; the
//! uplink bandwidth is set by the oversubscription ratio (leaf down-bandwidth ÷
//! up-bandwidth).
//!
//! # Routing
//! Inside an NVLink domain: GPU → NVSwitch → GPU. Otherwise GPU → NIC → leaf
//! [→ spine → leaf] → NIC → GPU. The spine (the only equal-cost choice) is picked by a hash
//! of (flow id, source leaf, destination leaf): deterministic, never a draw whose order
//! depends on events. Routes are computed by formula in O(1) from the link numbering and
//! checked against the petgraph graph (and against BFS distances) in the tests.
//!
//! Architecture invariant: link `i` of [`Topology::links`] is edge `i` of
//! [`Topology::graph`], vertex `v` is node `v`; a [`Route`] is a list of link ids.

use petgraph::graph::{DiGraph, NodeIndex};
use serde::{Deserialize, Serialize};

use crate::cluster::faults::FaultSpec;
use crate::cluster::variance::VarianceSpec;
use crate::error::{invalid, parse_error, Error, Result};
use crate::net::{GpuId, Ps};

/// Index of a vertex (GPU, switch or NIC) in [`Topology::vertices`] and in the graph.
pub type VertexId = u32;
/// Index of a directed link in [`Topology::links`] and edge index in the graph.
pub type LinkId = u32;

/// Most nodes a topology may have (16,384 GPUs need 2,048 DGX nodes; room for 64× more).
pub const MAX_NODES: u32 = 131_072;
/// Most GPUs in one node.
pub const MAX_GPUS_PER_NODE: u32 = 72;
/// Most directed links a built topology may have (16,384 DGX GPUs need 131,072; the cap
/// keeps a hostile file from asking for terabytes).
pub const MAX_LINKS: u64 = 1 << 24;

/// A topology file. Unknown keys are rejected; [`TopologySpec::parse`] validates ranges.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    /// Name shown in summaries (e.g. `dgx-h200-roce`).
    pub name: String,
    /// Default node count; `skewsim topo --nodes N` (and experiments) override it.
    pub nodes: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// The GPU every node holds: a built-in name (`gpus/NAME.toml`: `h200`, `b200`, ...) or
    /// a GPU file's path (`*.toml`, relative to the experiment that reads the topology),
    /// resolved by the caller (`experiment::calfile::run_gpu`); absent: `h200`
    /// ([`TopologySpec::gpu_name`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// The intra-node (or intra-super-node) NVLink fabric.
    pub nvlink: NvlinkSpec,
    /// The NICs of one node (absent: no scale-out network).
    #[serde(default)]
    pub nic: Option<NicSpec>,
    /// The leaf/spine scale-out fabric (required when there are NICs).
    #[serde(default)]
    pub fabric: Option<FabricSpec>,
    /// A multi-node NVLink domain (NVL72 and friends).
    #[serde(default)]
    pub super_node: Option<SuperNodeSpec>,
    /// GPU runtime variance (absent: the calibrated defaults).
    #[serde(default)]
    pub variance: Option<VarianceSpec>,
    /// Faults and stragglers to inject.
    #[serde(default)]
    pub faults: Option<FaultSpec>,
    /// How NCCL's collectives run here (absent: NCCL's own latency table, NVLS where the
    /// NVLink fabric has `sharp_efficiency`).
    #[serde(default)]
    pub collectives: CollectivesSpec,
    /// Where the text came from (a file name); set by [`TopologySpec::parse`].
    #[serde(skip)]
    pub source: String,
}

/// NVLink/NVSwitch fabric of one domain.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvlinkSpec {
    /// Bandwidth per GPU per direction, GB/s (10⁹ bytes/s), as the datasheet states it.
    pub bandwidth_gbyte_s: f64,
    /// Fraction of that bandwidth a bulk transfer achieves, in (0, 1].
    pub efficiency: f64,
    /// Per-transfer start-up cost (alpha: software + hardware), µs.
    pub latency_us: f64,
    /// With in-switch reduction (NVLink SHARP, "NVLS"): the fraction of NVLink bandwidth an
    /// NVLS all-reduce achieves, in (0, 1]. Absent: all-reduce uses the ring.
    #[serde(default)]
    pub sharp_efficiency: Option<f64>,
}

/// `[collectives]`: NCCL on this fabric (`net::collective::CollectiveModel`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CollectivesSpec {
    /// Multiplies NCCL's latency table (base + per-step latencies of each algorithm),
    /// fitted to nccl-tests on this hardware; > 0.
    pub latency_scale: f64,
    /// NVLink SHARP (NVLS) for all-reduce, all-gather and reduce-scatter where NCCL would
    /// pick it (needs `nvlink.sharp_efficiency`); `false` = the cluster runs with
    /// `NCCL_NVLS_ENABLE=0`.
    pub nvls: bool,
    /// NCCL's tuner picks NVLS for communicators of at least this many GPUs of one NVLink
    /// domain (≥ 3: `ncclNvlsInit` never builds NVLS for two).
    pub nvls_min_gpus: u32,
    /// The GPU's memory bandwidth, GB/s (datasheet): a ring ends each pass over its
    /// buffer with a local copy of every rank's share while the links wait
    /// (`net::collective`); absent: that copy is not priced.
    pub hbm_gbyte_s: Option<f64>,
    /// NCCL's ring channels on this fabric (`NCCL_DEBUG=INFO`: "N coll channels"): the
    /// ring's pipeline fills with one slice per channel before its links run full
    /// (`net::collective`); in [1, 64] (NCCL's `MAXCHANNELS`); absent: not priced.
    pub ring_channels: Option<u32>,
    /// NCCL's NVLS channels on this fabric (`NCCL_DEBUG=INFO`: "N nvls channels"): an NVLS
    /// all-reduce walks its buffer in loops of one chunk per channel and rank, and fills
    /// and drains by two loops (`net::collective`); in [1, 64]; absent: not priced.
    pub nvls_channels: Option<u32>,
    /// The cost of one NVLS chunk copy beyond its bytes, µs: each channel copies one chunk
    /// per rank in every loop (`net::collective`); in [0, 1e6], only with `nvls_channels`;
    /// absent: 0.
    pub nvls_copy_us: Option<f64>,
    /// Measured latency and bandwidth per algorithm (`skewsim calibrate --collectives`
    /// prints these entries): a listed algorithm, run inside one NVLink domain, is priced
    /// by them instead of NCCL's latency table and the links' efficiency.
    pub fit: Vec<CollectiveFitSpec>,
}

/// `[[collectives.fit]]`: one algorithm's fitted `latency + port bytes / bandwidth`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectiveFitSpec {
    /// `ring`, `NVLS`, `tree` or `PAT` (NCCL's names).
    pub algo: String,
    /// µs, including one transfer's start-up; in [0, 1e6].
    pub latency_us: f64,
    /// Achieved bytes per second of the busiest GPU port, GB/s; > 0.
    pub bandwidth_gbyte_s: f64,
}

/// The algorithm names `[[collectives.fit]]` accepts.
pub const FIT_ALGOS: [&str; 4] = ["ring", "NVLS", "tree", "PAT"];

impl Default for CollectivesSpec {
    fn default() -> Self {
        Self {
            latency_scale: 1.0,
            nvls: true,
            nvls_min_gpus: 3,
            hbm_gbyte_s: None,
            ring_channels: None,
            nvls_channels: None,
            nvls_copy_us: None,
            fit: Vec::new(),
        }
    }
}

/// The NICs of one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NicSpec {
    /// NICs (rails) per node; must divide `gpus_per_node`.
    pub per_node: u32,
    /// Line rate of one NIC, Gb/s (10⁹ bits/s).
    pub bandwidth_gbit_s: f64,
    /// Fraction of line rate a bulk transfer achieves, in (0, 1].
    pub efficiency: f64,
    /// Per-transfer start-up cost (alpha) of an inter-node transfer, µs.
    pub latency_us: f64,
    /// GPU↔NIC PCIe bandwidth per direction, GB/s.
    pub pcie_gbyte_s: f64,
}

/// Two-tier leaf/spine fabric.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricSpec {
    /// Nodes whose NICs share one leaf (one leaf per rail if `rail_optimized`).
    pub hosts_per_leaf: u32,
    /// Spine switches; each leaf has one uplink to each.
    pub spines: u32,
    /// Leaf down-bandwidth ÷ up-bandwidth, ≥ 1 (1 = non-blocking).
    pub oversubscription: f64,
    /// Latency of one switch hop, µs.
    pub hop_latency_us: f64,
    /// One leaf per rail (NIC index) per group of `hosts_per_leaf` nodes.
    pub rail_optimized: bool,
}

/// A multi-node NVLink domain.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuperNodeSpec {
    /// Nodes per NVLink domain; must divide the node count.
    pub nodes: u32,
}

/// What a vertex of the graph is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Vertex {
    /// A GPU, by global id.
    Gpu(GpuId),
    /// The NVSwitch crossbar of NVLink domain `d`.
    NvSwitch(u32),
    /// NIC `rail` of node `node`.
    Nic {
        /// The node.
        node: u32,
        /// The rail (NIC index within the node).
        rail: u32,
    },
    /// Leaf switch.
    Leaf(u32),
    /// Spine switch.
    Spine(u32),
}

impl std::fmt::Display for Vertex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Vertex::Gpu(g) => write!(f, "gpu{g}"),
            Vertex::NvSwitch(d) => write!(f, "nvs{d}"),
            Vertex::Nic { node, rail } => write!(f, "nic{node}.{rail}"),
            Vertex::Leaf(l) => write!(f, "leaf{l}"),
            Vertex::Spine(s) => write!(f, "spine{s}"),
        }
    }
}

/// What a link is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum LinkKind {
    /// GPU ↔ NVSwitch.
    Nvlink,
    /// GPU ↔ NIC.
    Pcie,
    /// NIC ↔ leaf.
    NicLeaf,
    /// Leaf ↔ spine.
    LeafSpine,
}

/// A directed link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Tail vertex.
    pub src: VertexId,
    /// Head vertex.
    pub dst: VertexId,
    /// Nominal bandwidth, bytes/s.
    pub bandwidth: f64,
    /// Achieved fraction of nominal for bulk transfers.
    pub efficiency: f64,
    /// Latency this link adds to a transfer that crosses it, ps.
    pub latency: Ps,
    /// Kind.
    pub kind: LinkKind,
}

impl Link {
    /// Bandwidth a bulk transfer achieves on this link alone, bytes/s.
    pub fn capacity(&self) -> f64 {
        self.bandwidth * self.efficiency
    }
}

/// Longest route (GPU, NIC, leaf, spine, leaf, NIC, GPU = 6 links).
pub const MAX_HOPS: usize = 6;

/// A route: the links a flow crosses, in order. `Copy`, no allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    hops: [LinkId; MAX_HOPS],
    len: u8,
}

impl Route {
    /// The empty route (a GPU to itself).
    pub const EMPTY: Route = Route {
        hops: [0; MAX_HOPS],
        len: 0,
    };

    /// A route over the given links (at most [`MAX_HOPS`]; extra links are an error).
    pub fn from_links(links: &[LinkId]) -> Result<Route> {
        if links.len() > MAX_HOPS {
            return Err(invalid(
                "route length",
                links.len(),
                format!("at most {MAX_HOPS} links"),
            ));
        }
        let mut r = Route::EMPTY;
        for &l in links {
            r.push(l);
        }
        Ok(r)
    }

    fn push(&mut self, l: LinkId) {
        self.hops[usize::from(self.len)] = l;
        self.len += 1;
    }

    /// The links, in order.
    pub fn links(&self) -> &[LinkId] {
        &self.hops[..usize::from(self.len)]
    }
}

fn field_err(source: &str, field: &str, value: impl ToString, allowed: &str) -> Error {
    invalid(format!("{source}: {field}"), value, allowed)
}

fn check_pos(source: &str, field: &str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 && v <= 1.0e6 {
        Ok(())
    } else {
        Err(field_err(source, field, v, "a finite number > 0 and ≤ 1e6"))
    }
}

fn check_eff(source: &str, field: &str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 && v <= 1.0 {
        Ok(())
    } else {
        Err(field_err(source, field, v, "a fraction in (0, 1]"))
    }
}

fn check_latency(source: &str, field: &str, v: f64) -> Result<()> {
    if v.is_finite() && (0.0..=1.0e6).contains(&v) {
        Ok(())
    } else {
        Err(field_err(source, field, v, "microseconds in [0, 1e6]"))
    }
}

fn us_to_ps(us: f64) -> Ps {
    // Validated to [0, 1e6] µs, so the product fits a u64 with room to spare.
    (us * 1.0e6).round() as Ps
}

impl TopologySpec {
    /// Parse and validate a topology file's text; `source` (a file name) prefixes every
    /// error. Unknown keys, out-of-range values and inconsistent shapes are errors.
    pub fn parse(text: &str, source: &str) -> Result<TopologySpec> {
        let mut spec: TopologySpec =
            toml::from_str(text).map_err(|e| parse_error(source, e.to_string()))?;
        spec.source = source.to_string();
        spec.validate()?;
        Ok(spec)
    }

    /// The GPU the file names, `h200` when it names none.
    pub fn gpu_name(&self) -> &str {
        self.gpu.as_deref().unwrap_or(crate::cost::gpu::REFERENCE)
    }

    /// Check every field's range and the shape's consistency at the file's default node
    /// count (a `--nodes` override is checked again by [`TopologySpec::build`]).
    pub fn validate(&self) -> Result<()> {
        let s = self.source.as_str();
        if self.gpus_per_node == 0 || self.gpus_per_node > MAX_GPUS_PER_NODE {
            return Err(field_err(
                s,
                "gpus_per_node",
                self.gpus_per_node,
                &format!("an integer in [1, {MAX_GPUS_PER_NODE}]"),
            ));
        }
        if let Some(g) = self
            .gpu
            .as_deref()
            .filter(|g| g.is_empty() || g.len() > 4096)
        {
            return Err(field_err(
                s,
                "gpu",
                format!("{} characters", g.len()),
                "a GPU's name or a GPU file's path (1 to 4096 characters)",
            ));
        }
        check_pos(s, "nvlink.bandwidth_gbyte_s", self.nvlink.bandwidth_gbyte_s)?;
        check_eff(s, "nvlink.efficiency", self.nvlink.efficiency)?;
        check_latency(s, "nvlink.latency_us", self.nvlink.latency_us)?;
        if let Some(e) = self.nvlink.sharp_efficiency {
            check_eff(s, "nvlink.sharp_efficiency", e)?;
        }
        check_pos(
            s,
            "collectives.latency_scale",
            self.collectives.latency_scale,
        )?;
        let c = &self.collectives;
        if let Some(h) = c.hbm_gbyte_s {
            check_pos(s, "collectives.hbm_gbyte_s", h)?;
        }
        for (field, ch) in [
            ("collectives.ring_channels", c.ring_channels),
            ("collectives.nvls_channels", c.nvls_channels),
        ] {
            if let Some(ch) = ch.filter(|ch| !(1..=64).contains(ch)) {
                return Err(field_err(
                    s,
                    field,
                    ch,
                    "an integer in [1, 64] (NCCL's MAXCHANNELS)",
                ));
            }
        }
        if let Some(us) = c.nvls_copy_us {
            check_latency(s, "collectives.nvls_copy_us", us)?;
            if c.nvls_channels.is_none() {
                return Err(field_err(
                    s,
                    "collectives.nvls_copy_us",
                    us,
                    "set together with collectives.nvls_channels (the copies are counted per NVLS channel)",
                ));
            }
        }
        if !(3..=65_536).contains(&c.nvls_min_gpus) {
            return Err(field_err(
                s,
                "collectives.nvls_min_gpus",
                c.nvls_min_gpus,
                "an integer in [3, 65536] (NCCL never builds NVLS for two GPUs)",
            ));
        }
        for (i, f) in c.fit.iter().enumerate() {
            let at = |field: &str| format!("collectives.fit[{i}].{field}");
            if !FIT_ALGOS.contains(&f.algo.as_str()) {
                return Err(field_err(s, &at("algo"), &f.algo, &FIT_ALGOS.join(", ")));
            }
            if c.fit[..i].iter().any(|g| g.algo == f.algo) {
                return Err(field_err(
                    s,
                    &at("algo"),
                    &f.algo,
                    "each algorithm at most once",
                ));
            }
            check_latency(s, &at("latency_us"), f.latency_us)?;
            check_pos(s, &at("bandwidth_gbyte_s"), f.bandwidth_gbyte_s)?;
        }
        if let Some(nic) = &self.nic {
            if nic.per_node == 0
                || nic.per_node > self.gpus_per_node
                || self.gpus_per_node % nic.per_node != 0
            {
                return Err(field_err(
                    s,
                    "nic.per_node",
                    nic.per_node,
                    &format!(
                        "a divisor of gpus_per_node = {} (1 ..= {})",
                        self.gpus_per_node, self.gpus_per_node
                    ),
                ));
            }
            check_pos(s, "nic.bandwidth_gbit_s", nic.bandwidth_gbit_s)?;
            check_eff(s, "nic.efficiency", nic.efficiency)?;
            check_latency(s, "nic.latency_us", nic.latency_us)?;
            check_pos(s, "nic.pcie_gbyte_s", nic.pcie_gbyte_s)?;
            let Some(fabric) = &self.fabric else {
                return Err(field_err(
                    s,
                    "fabric",
                    "(missing)",
                    "a [fabric] table is required when [nic] is given",
                ));
            };
            if fabric.hosts_per_leaf == 0 || fabric.hosts_per_leaf > MAX_NODES {
                return Err(field_err(
                    s,
                    "fabric.hosts_per_leaf",
                    fabric.hosts_per_leaf,
                    &format!("an integer in [1, {MAX_NODES}]"),
                ));
            }
            if fabric.spines == 0 || fabric.spines > 4096 {
                return Err(field_err(
                    s,
                    "fabric.spines",
                    fabric.spines,
                    "an integer in [1, 4096]",
                ));
            }
            if !(fabric.oversubscription.is_finite()
                && (1.0..=64.0).contains(&fabric.oversubscription))
            {
                return Err(field_err(
                    s,
                    "fabric.oversubscription",
                    fabric.oversubscription,
                    "a ratio in [1, 64] (1 = non-blocking)",
                ));
            }
            check_latency(s, "fabric.hop_latency_us", fabric.hop_latency_us)?;
        } else if self.fabric.is_some() {
            return Err(field_err(
                s,
                "fabric",
                "(given)",
                "a [fabric] needs a [nic] table to attach to",
            ));
        }
        if let Some(v) = &self.variance {
            v.validate(s)?;
        }
        self.check_nodes(self.nodes)?;
        Ok(())
    }

    /// Nodes per NVLink domain (1 without super-nodes).
    pub fn domain_nodes(&self) -> u32 {
        self.super_node.as_ref().map_or(1, |sn| sn.nodes)
    }

    fn check_nodes(&self, nodes: u32) -> Result<()> {
        let s = self.source.as_str();
        if nodes == 0 || nodes > MAX_NODES {
            return Err(field_err(
                s,
                "nodes",
                nodes,
                &format!("an integer in [1, {MAX_NODES}]"),
            ));
        }
        if let Some(sn) = &self.super_node {
            if sn.nodes == 0 || nodes % sn.nodes != 0 {
                return Err(field_err(
                    s,
                    "super_node.nodes",
                    sn.nodes,
                    &format!("a divisor of nodes = {nodes} (super-nodes must tile the cluster)"),
                ));
            }
        }
        if self.nic.is_none() && nodes > self.domain_nodes() {
            return Err(field_err(
                s,
                "nic",
                "(missing)",
                &format!(
                    "no route between node 0 and node {}: GPUs outside one NVLink domain \
                     need a [nic] and [fabric]",
                    self.domain_nodes()
                ),
            ));
        }
        Ok(())
    }

    /// Build the graph for `nodes` nodes (the file's `nodes` if `None`).
    pub fn build(&self, nodes: Option<u32>) -> Result<Topology> {
        let nodes = nodes.unwrap_or(self.nodes);
        self.check_nodes(nodes)?;
        Topology::new(self.clone(), nodes)
    }
}

/// A built cluster: vertices, links (arena-indexed) and the same as a petgraph graph.
#[derive(Clone, Debug)]
pub struct Topology {
    /// The description it was built from.
    pub spec: TopologySpec,
    /// Node count.
    pub nodes: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Vertices by [`VertexId`].
    pub vertices: Vec<Vertex>,
    /// Directed links by [`LinkId`].
    pub links: Vec<Link>,
    /// The graph (node `v` = vertex `v`, edge `i` = link `i`, edge weight = link id).
    pub graph: DiGraph<Vertex, LinkId, u32>,
    layout: Layout,
    /// Per GPU: where routes leave it (its NVLink domain, NIC and leaf), worked out once so a
    /// route does no division.
    places: Vec<GpuPlace>,
}

/// A GPU's NVLink domain, global NIC and leaf switch.
#[derive(Clone, Copy, Debug)]
struct GpuPlace {
    domain: u32,
    nic: u32,
    leaf: u32,
}

/// Where each block of vertices and links starts (the numbering routes are computed from).
#[derive(Clone, Copy, Debug)]
struct Layout {
    gpus: u32,
    gpus_per_node: u32,
    domains: u32,
    domain_gpus: u32,
    nics_per_node: u32,
    leaves: u32,
    spines: u32,
    hosts_per_leaf: u32,
    rail_optimized: bool,
    v_nvs: u32,
    v_nic: u32,
    v_leaf: u32,
    v_spine: u32,
    l_pcie: u32,
    l_nic: u32,
    l_spine: u32,
    nvlink_latency: Ps,
    nic_latency: Ps,
    hop_latency: Ps,
}

/// splitmix64 finaliser: the ECMP hash.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Topology {
    fn new(spec: TopologySpec, nodes: u32) -> Result<Topology> {
        let g_per = spec.gpus_per_node;
        let gpus64 = u64::from(nodes) * u64::from(g_per);
        let gpus = u32::try_from(gpus64)
            .map_err(|_| field_err(&spec.source, "nodes", nodes, "fewer than 2^32 GPUs"))?;
        let domain_nodes = spec.domain_nodes();
        let domains = nodes / domain_nodes;
        let (nics_per_node, hosts_per_leaf, spines, rail_opt) = match (&spec.nic, &spec.fabric) {
            (Some(n), Some(f)) => (n.per_node, f.hosts_per_leaf, f.spines, f.rail_optimized),
            _ => (0, 1, 0, false),
        };
        let nics = nodes * nics_per_node;
        let groups = nodes.div_ceil(hosts_per_leaf);
        let leaves = if nics_per_node == 0 {
            0
        } else if rail_opt {
            groups * nics_per_node
        } else {
            groups
        };
        let v_nvs = gpus;
        let v_nic = v_nvs + domains;
        let v_leaf = v_nic + nics;
        let v_spine = v_leaf + leaves;
        let n_vertices = u64::from(v_spine) + u64::from(spines);
        let l_pcie = 2 * gpus;
        let l_nic = l_pcie + if nics_per_node > 0 { 2 * gpus } else { 0 };
        let l_spine = l_nic + 2 * nics;
        let n_links = u64::from(l_spine) + 2 * u64::from(leaves) * u64::from(spines);
        if n_vertices > MAX_LINKS || n_links > MAX_LINKS {
            return Err(field_err(
                &spec.source,
                "nodes",
                nodes,
                &format!(
                    "a cluster of at most {MAX_LINKS} directed links (this one needs {n_links}: \
                     fewer nodes, spines or leaves)"
                ),
            ));
        }
        let nv = &spec.nvlink;
        let layout = Layout {
            gpus,
            gpus_per_node: g_per,
            domains,
            domain_gpus: domain_nodes * g_per,
            nics_per_node,
            leaves,
            spines,
            hosts_per_leaf,
            rail_optimized: rail_opt,
            v_nvs,
            v_nic,
            v_leaf,
            v_spine,
            l_pcie,
            l_nic,
            l_spine,
            nvlink_latency: us_to_ps(nv.latency_us),
            nic_latency: spec.nic.as_ref().map_or(0, |n| us_to_ps(n.latency_us)),
            hop_latency: spec
                .fabric
                .as_ref()
                .map_or(0, |f| us_to_ps(f.hop_latency_us)),
        };

        let mut vertices = Vec::with_capacity(n_vertices as usize);
        vertices.extend((0..gpus).map(Vertex::Gpu));
        vertices.extend((0..domains).map(Vertex::NvSwitch));
        for node in 0..nodes {
            vertices.extend((0..nics_per_node).map(|rail| Vertex::Nic { node, rail }));
        }
        vertices.extend((0..leaves).map(Vertex::Leaf));
        vertices.extend((0..spines).map(Vertex::Spine));

        let mut links = Vec::with_capacity(n_links as usize);
        let nvl_bw = nv.bandwidth_gbyte_s * 1e9;
        for g in 0..gpus {
            let nvs = v_nvs + g / layout.domain_gpus;
            let l = |src, dst, latency| Link {
                src,
                dst,
                bandwidth: nvl_bw,
                efficiency: nv.efficiency,
                latency,
                kind: LinkKind::Nvlink,
            };
            links.push(l(g, nvs, layout.nvlink_latency));
            links.push(l(nvs, g, 0));
        }
        if let (Some(nic), Some(fabric)) = (&spec.nic, &spec.fabric) {
            let pcie_bw = nic.pcie_gbyte_s * 1e9;
            for g in 0..gpus {
                let nic_v = v_nic + layout.nic_of(g);
                let l = |src, dst, latency| Link {
                    src,
                    dst,
                    bandwidth: pcie_bw,
                    efficiency: 1.0,
                    latency,
                    kind: LinkKind::Pcie,
                };
                links.push(l(g, nic_v, layout.nic_latency));
                links.push(l(nic_v, g, 0));
            }
            let nic_bw = nic.bandwidth_gbit_s * 1e9 / 8.0;
            for n in 0..nics {
                let leaf = v_leaf + layout.leaf_of_nic(n);
                let l = |src, dst| Link {
                    src,
                    dst,
                    bandwidth: nic_bw,
                    efficiency: nic.efficiency,
                    latency: layout.hop_latency,
                    kind: LinkKind::NicLeaf,
                };
                links.push(l(v_nic + n, leaf));
                links.push(l(leaf, v_nic + n));
            }
            // Down-bandwidth of a leaf ÷ oversubscription, spread over its spine uplinks.
            let down_ports = if rail_opt {
                hosts_per_leaf
            } else {
                hosts_per_leaf * nics_per_node
            };
            let up_bw =
                f64::from(down_ports) * nic_bw / (fabric.oversubscription * f64::from(spines));
            for leaf in 0..leaves {
                for s in 0..spines {
                    let l = |src, dst| Link {
                        src,
                        dst,
                        bandwidth: up_bw,
                        efficiency: nic.efficiency,
                        latency: layout.hop_latency,
                        kind: LinkKind::LeafSpine,
                    };
                    links.push(l(v_leaf + leaf, v_spine + s));
                    links.push(l(v_spine + s, v_leaf + leaf));
                }
            }
        }
        debug_assert_eq!(links.len() as u64, n_links);

        let mut graph = DiGraph::with_capacity(vertices.len(), links.len());
        for v in &vertices {
            graph.add_node(*v);
        }
        for (i, l) in links.iter().enumerate() {
            graph.add_edge(
                NodeIndex::new(l.src as usize),
                NodeIndex::new(l.dst as usize),
                i as u32,
            );
        }
        let places = (0..gpus)
            .map(|g| {
                let nic = layout.nic_of(g);
                GpuPlace {
                    domain: g / layout.domain_gpus,
                    nic,
                    leaf: if nics_per_node == 0 {
                        0
                    } else {
                        layout.leaf_of_nic(nic)
                    },
                }
            })
            .collect();
        Ok(Topology {
            nodes,
            gpus_per_node: g_per,
            spec,
            vertices,
            links,
            graph,
            layout,
            places,
        })
    }

    /// Number of GPUs.
    pub fn gpus(&self) -> u32 {
        self.layout.gpus
    }

    /// Number of NVLink domains (nodes, or super-nodes).
    pub fn domains(&self) -> u32 {
        self.layout.domains
    }

    /// GPUs per NVLink domain.
    pub fn domain_gpus(&self) -> u32 {
        self.layout.domain_gpus
    }

    /// Leaf and spine switch counts.
    pub fn switches(&self) -> (u32, u32) {
        (self.layout.leaves, self.layout.spines)
    }

    /// NVLink domain of a GPU.
    pub fn domain_of(&self, g: GpuId) -> u32 {
        g / self.layout.domain_gpus
    }

    /// The NVSwitch vertex of a GPU's domain.
    pub fn nvswitch_of(&self, g: GpuId) -> VertexId {
        self.layout.v_nvs + self.domain_of(g)
    }

    /// Link GPU → its NVSwitch.
    pub fn nvlink_up(&self, g: GpuId) -> LinkId {
        2 * g
    }

    /// Link NVSwitch → GPU.
    pub fn nvlink_down(&self, g: GpuId) -> LinkId {
        2 * g + 1
    }

    /// The name of a link, `SRC>DST` (e.g. `gpu3>nvs0`, `leaf2>spine5`), as fault
    /// injection spells it.
    pub fn link_name(&self, l: LinkId) -> String {
        let link = &self.links[l as usize];
        format!(
            "{}>{}",
            self.vertices[link.src as usize], self.vertices[link.dst as usize]
        )
    }

    /// The link with this name, if any.
    pub fn link_by_name(&self, name: &str) -> Option<LinkId> {
        let (a, b) = name.split_once('>')?;
        let a = self.vertex_by_name(a)?;
        let b = self.vertex_by_name(b)?;
        let e = self
            .graph
            .find_edge(NodeIndex::new(a as usize), NodeIndex::new(b as usize))?;
        Some(self.graph[e])
    }

    fn vertex_by_name(&self, s: &str) -> Option<VertexId> {
        let num = |p: &str| s.strip_prefix(p).and_then(|r| r.parse::<u32>().ok());
        let lay = &self.layout;
        if let Some(g) = num("gpu") {
            return (g < lay.gpus).then_some(g);
        }
        if let Some(d) = num("nvs") {
            return (d < lay.domains).then_some(lay.v_nvs + d);
        }
        if let Some(l) = num("leaf") {
            return (l < lay.leaves).then_some(lay.v_leaf + l);
        }
        if let Some(sp) = num("spine") {
            return (sp < lay.spines).then_some(lay.v_spine + sp);
        }
        let (node, rail) = s.strip_prefix("nic")?.split_once('.')?;
        let (node, rail) = (node.parse::<u32>().ok()?, rail.parse::<u32>().ok()?);
        (node < self.nodes && rail < lay.nics_per_node)
            .then_some(lay.v_nic + node * lay.nics_per_node + rail)
    }

    /// The route of flow `flow_id` from `src` to `dst`. Equal-cost spine choice by a hash
    /// of the flow id; an out-of-range GPU is an error.
    pub fn route(&self, src: GpuId, dst: GpuId, flow_id: u64) -> Result<Route> {
        let lay = &self.layout;
        if src >= lay.gpus || dst >= lay.gpus {
            return Err(invalid(
                "route endpoint",
                format!("{src}->{dst}"),
                format!("GPU ids in [0, {})", lay.gpus),
            ));
        }
        let mut r = Route::EMPTY;
        if src == dst {
            return Ok(r);
        }
        let (ps, pd) = (self.places[src as usize], self.places[dst as usize]);
        if ps.domain == pd.domain {
            r.push(self.nvlink_up(src));
            r.push(self.nvlink_down(dst));
            return Ok(r);
        }
        // Validation guarantees NICs whenever there is more than one domain.
        let (ns, nd) = (ps.nic, pd.nic);
        let (ls, ld) = (ps.leaf, pd.leaf);
        r.push(lay.l_pcie + 2 * src);
        r.push(lay.l_nic + 2 * ns);
        if ls != ld {
            let h = mix64(flow_id ^ mix64((u64::from(ls) << 32) | u64::from(ld)));
            let s = (h % u64::from(lay.spines)) as u32;
            r.push(lay.l_spine + 2 * (ls * lay.spines + s));
            r.push(lay.l_spine + 2 * (ld * lay.spines + s) + 1);
        }
        r.push(lay.l_nic + 2 * nd + 1);
        r.push(lay.l_pcie + 2 * dst + 1);
        Ok(r)
    }

    /// Sum of the latencies of a route's links, ps.
    pub fn route_latency(&self, r: &Route) -> Ps {
        r.links()
            .iter()
            .map(|&l| self.links[l as usize].latency)
            .sum()
    }

    /// The smallest achieved capacity along a route, bytes/s (infinite for an empty one).
    pub fn route_capacity(&self, r: &Route) -> f64 {
        r.links()
            .iter()
            .map(|&l| self.links[l as usize].capacity())
            .fold(f64::INFINITY, f64::min)
    }
}

impl Layout {
    /// Global NIC index of a GPU.
    fn nic_of(&self, g: GpuId) -> u32 {
        let (node, local) = (g / self.gpus_per_node, g % self.gpus_per_node);
        node * self.nics_per_node + local * self.nics_per_node / self.gpus_per_node
    }

    /// Leaf index of a global NIC.
    fn leaf_of_nic(&self, n: u32) -> u32 {
        let node = n / self.nics_per_node;
        let group = node / self.hosts_per_leaf;
        if self.rail_optimized {
            group * self.nics_per_node + n % self.nics_per_node
        } else {
            group
        }
    }
}

/// The small test topology (`topologies/test-small.toml`), built without a seed.
#[cfg(test)]
pub(crate) fn test_small() -> std::sync::Arc<Topology> {
    let text = include_str!("../../topologies/test-small.toml");
    std::sync::Arc::new(
        TopologySpec::parse(text, "test-small")
            .unwrap()
            .build(None)
            .unwrap(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const SMALL: &str = r#"
name = "t"
nodes = 4
gpus_per_node = 4
[nvlink]
bandwidth_gbyte_s = 100.0
efficiency = 1.0
latency_us = 1.0
[nic]
per_node = 2
bandwidth_gbit_s = 200.0
efficiency = 1.0
latency_us = 2.0
pcie_gbyte_s = 64.0
[fabric]
hosts_per_leaf = 2
spines = 2
oversubscription = 2.0
hop_latency_us = 0.5
rail_optimized = true
"#;

    fn small() -> Topology {
        TopologySpec::parse(SMALL, "small.toml")
            .and_then(|s| s.build(None))
            .unwrap()
    }

    #[test]
    fn counts_match_hand_count() {
        let t = small();
        assert_eq!(t.gpus(), 16);
        // 16 GPUs + 4 NVSwitches + 8 NICs + (2 groups × 2 rails) leaves + 2 spines.
        assert_eq!(t.vertices.len(), 16 + 4 + 8 + 4 + 2);
        // NVLink 32 + PCIe 32 + NIC–leaf 16 + leaf–spine 4·2·2 = 96.
        assert_eq!(t.links.len(), 96);
        // Leaf uplink: 2 hosts × 25 GB/s ÷ (2 × 2 spines) = 12.5 GB/s.
        let up = t
            .links
            .iter()
            .find(|l| l.kind == LinkKind::LeafSpine)
            .unwrap();
        assert_eq!(up.bandwidth, 12.5e9);
    }

    #[test]
    fn routes_follow_graph_edges_and_are_shortest() {
        let t = small();
        for src in 0..t.gpus() {
            let dist =
                petgraph::algo::dijkstra(&t.graph, NodeIndex::new(src as usize), None, |_| 1u32);
            for dst in 0..t.gpus() {
                for flow in 0..4u64 {
                    let r = t.route(src, dst, flow).unwrap();
                    let mut at = src;
                    for &l in r.links() {
                        let link = &t.links[l as usize];
                        assert_eq!(link.src, at, "route {src}->{dst} breaks at link {l}");
                        let e = t
                            .graph
                            .edge_weight(petgraph::graph::EdgeIndex::new(l as usize));
                        assert_eq!(e, Some(&l));
                        at = link.dst;
                    }
                    assert_eq!(at, dst);
                    let want = dist[&NodeIndex::new(dst as usize)];
                    assert_eq!(r.links().len() as u32, want, "{src}->{dst} not shortest");
                }
            }
        }
    }

    #[test]
    fn ecmp_is_deterministic_and_spreads_over_spines() {
        let t = small();
        // gpu0 (node 0, rail 0, leaf 0) to gpu12 (node 3, rail 0, leaf 2): via a spine.
        let mut used = std::collections::BTreeSet::new();
        for flow in 0..64 {
            let a = t.route(0, 12, flow).unwrap();
            assert_eq!(a, t.route(0, 12, flow).unwrap());
            assert_eq!(a.links().len(), 6);
            used.insert(t.links[a.links()[2] as usize].dst);
        }
        assert_eq!(used.len(), 2, "both spines carry some flows");
    }

    #[test]
    fn latency_and_capacity_of_routes() {
        let t = small();
        let intra = t.route(0, 1, 0).unwrap();
        assert_eq!(t.route_latency(&intra), 1_000_000);
        assert_eq!(t.route_capacity(&intra), 100e9);
        // Same leaf (nodes 0 and 1, rail 0): PCIe 2 µs + 2 hops × 0.5 µs.
        let leaf = t.route(0, 4, 0).unwrap();
        assert_eq!(leaf.links().len(), 4);
        assert_eq!(t.route_latency(&leaf), 3_000_000);
        assert_eq!(t.route_capacity(&leaf), 25e9);
        let spine = t.route(0, 12, 0).unwrap();
        assert_eq!(t.route_latency(&spine), 4_000_000);
        assert_eq!(t.route_capacity(&spine), 12.5e9);
    }

    #[test]
    fn link_names_round_trip() {
        let t = small();
        for l in 0..t.links.len() as u32 {
            assert_eq!(t.link_by_name(&t.link_name(l)), Some(l));
        }
        assert_eq!(t.link_name(t.nvlink_up(5)), "gpu5>nvs1");
        assert_eq!(t.link_by_name("gpu99>nvs0"), None);
        assert_eq!(t.link_by_name("leaf0>leaf1"), None);
    }

    fn err_of(text: &str) -> String {
        match TopologySpec::parse(text, "bad.toml").and_then(|s| s.build(None)) {
            Ok(_) => panic!("accepted bad topology:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_input_names_file_field_and_range() {
        let e = err_of(&SMALL.replace("hosts_per_leaf = 2", "hosts_per_leaf = 2\ncolour = 1"));
        assert!(e.contains("bad.toml") && e.contains("colour"), "{e}");
        let e = err_of(&SMALL.replace("bandwidth_gbyte_s = 100.0", "bandwidth_gbyte_s = -3.0"));
        assert!(
            e.contains("bad.toml: nvlink.bandwidth_gbyte_s") && e.contains("> 0"),
            "{e}"
        );
        let e = err_of(&SMALL.replace("bandwidth_gbit_s = 200.0", "bandwidth_gbit_s = 0.0"));
        assert!(e.contains("nic.bandwidth_gbit_s = 0"), "{e}");
        let e = err_of(&format!("{SMALL}\n[super_node]\nnodes = 3\n"));
        assert!(
            e.contains("super_node.nodes = 3") && e.contains("divisor of nodes = 4"),
            "{e}"
        );
        let no_nic = SMALL.split("[nic]").next().unwrap();
        let e = err_of(no_nic);
        assert!(e.contains("bad.toml: nic") && e.contains("no route"), "{e}");
        let e = err_of(&SMALL.replace("per_node = 2", "per_node = 3"));
        assert!(e.contains("nic.per_node = 3"), "{e}");
        let e = err_of(&SMALL.replace("oversubscription = 2.0", "oversubscription = 0.5"));
        assert!(e.contains("fabric.oversubscription"), "{e}");
        let e = err_of(&SMALL.replace(
            "efficiency = 1.0\nlatency_us = 1.0",
            "efficiency = 1.5\nlatency_us = 1.0",
        ));
        assert!(e.contains("nvlink.efficiency = 1.5"), "{e}");
        // [collectives]: (the line, what its error names)
        for (line, names) in [
            (
                "latency_scale = 0.0",
                &["collectives.latency_scale = 0"][..],
            ),
            ("hbm_gbyte_s = -1.0", &["collectives.hbm_gbyte_s = -1"]),
            ("nvls = \"off\"", &["nvls"]),
            (
                "ring_channels = 0",
                &["collectives.ring_channels = 0", "[1, 64]"],
            ),
            (
                "nvls_channels = 65",
                &["collectives.nvls_channels = 65", "[1, 64]"],
            ),
            (
                "nvls_copy_us = -0.5",
                &["collectives.nvls_copy_us = -0.5", "[0, 1e6]"],
            ),
            (
                "nvls_copy_us = 0.5",
                &["collectives.nvls_copy_us = 0.5", "nvls_channels"],
            ),
            (
                "nvls_min_gpus = 2",
                &["collectives.nvls_min_gpus = 2", "[3, 65536]"],
            ),
        ] {
            let e = err_of(&format!("{SMALL}\n[collectives]\n{line}\n"));
            assert!(names.iter().all(|n| e.contains(n)), "{line}: {e}");
        }
        let fit = |algo: &str, lat: &str, bw: &str| {
            format!("{SMALL}\n[[collectives.fit]]\nalgo = \"{algo}\"\nlatency_us = {lat}\nbandwidth_gbyte_s = {bw}\n")
        };
        let e = err_of(&fit("bogus", "10.0", "300.0"));
        assert!(
            e.contains("collectives.fit[0].algo = bogus") && e.contains("ring, NVLS, tree, PAT"),
            "{e}"
        );
        let e = err_of(&fit("ring", "-1.0", "300.0"));
        assert!(e.contains("collectives.fit[0].latency_us = -1"), "{e}");
        let e = err_of(&fit("ring", "10.0", "0.0"));
        assert!(
            e.contains("collectives.fit[0].bandwidth_gbyte_s = 0"),
            "{e}"
        );
        let twice = fit("ring", "10.0", "300.0")
            + "[[collectives.fit]]\nalgo = \"ring\"\nlatency_us = 1.0\nbandwidth_gbyte_s = 1.0\n";
        let e = err_of(&twice);
        assert!(
            e.contains("collectives.fit[1].algo = ring") && e.contains("at most once"),
            "{e}"
        );
        let t = small();
        let e = t.route(0, 16, 0).unwrap_err().to_string();
        assert!(e.contains("[0, 16)"), "{e}");
        let spec = TopologySpec::parse(SMALL, "small.toml").unwrap();
        let e = spec.build(Some(0)).unwrap_err().to_string();
        assert!(e.contains("small.toml: nodes = 0"), "{e}");
        // 131,072 nodes × 2 rails / 2 per leaf = 131,072 leaves × 4,096 spines: too many.
        let big = SMALL.replace("spines = 2", "spines = 4096");
        let spec = TopologySpec::parse(&big, "big.toml").unwrap();
        let e = spec.build(Some(MAX_NODES)).unwrap_err().to_string();
        assert!(
            e.contains("big.toml: nodes") && e.contains("directed links"),
            "{e}"
        );
    }

    #[test]
    fn shipped_topologies_parse_and_build() {
        let files = [
            (
                "dgx-h200-roce",
                include_str!("../../topologies/dgx-h200-roce.toml"),
            ),
            (
                "dgx-h200-ib",
                include_str!("../../topologies/dgx-h200-ib.toml"),
            ),
            (
                "gb200-nvl72",
                include_str!("../../topologies/gb200-nvl72.toml"),
            ),
            (
                "test-small",
                include_str!("../../topologies/test-small.toml"),
            ),
        ];
        for (name, text) in files {
            let spec = TopologySpec::parse(text, name).unwrap();
            assert_eq!(spec.name, name);
            let t = spec.build(None).unwrap();
            assert!(t.gpus() >= 8, "{name}");
            if let Some(f) = &spec.faults {
                f.resolve(&t, name).unwrap();
            }
        }
        let dgx = TopologySpec::parse(files[0].1, "dgx")
            .unwrap()
            .build(Some(2048))
            .unwrap();
        assert_eq!(dgx.gpus(), 16_384);
        // 2048 nodes / 32 per leaf × 8 rails = 512 leaves, 32 spines.
        assert_eq!(dgx.switches(), (512, 32));
        let nvl = TopologySpec::parse(files[2].1, "nvl72").unwrap();
        assert_eq!(nvl.build(Some(36)).unwrap().domain_gpus(), 72);
        let e = nvl.build(Some(20)).unwrap_err().to_string();
        assert!(e.contains("nvl72: super_node.nodes = 18"), "{e}");
    }

    #[test]
    fn super_nodes_route_over_nvlink() {
        let text = format!("{SMALL}\n[super_node]\nnodes = 2\n");
        let t = TopologySpec::parse(&text, "sn.toml")
            .unwrap()
            .build(None)
            .unwrap();
        assert_eq!(t.domains(), 2);
        // gpu0 (node 0) and gpu7 (node 1) share a domain; gpu8 (node 2) does not.
        assert_eq!(t.route(0, 7, 0).unwrap().links().len(), 2);
        assert!(t.route(0, 8, 0).unwrap().links().len() >= 4);
        let e = TopologySpec::parse(&text, "sn.toml")
            .unwrap()
            .build(Some(5))
            .unwrap_err();
        assert!(e.to_string().contains("super_node.nodes = 2"), "{e}");
    }
}
