//! Collectives: NCCL's algorithm choice on a cluster ([`CollectiveModel`], the one model
//! `skewsim topo` and the step engine share), step-by-step lowerings onto point-to-point
//! transfers, and algorithm / bus bandwidth as nccl-tests reports them.
//!
//! # The collective model
//! [`CollectiveModel::lower`] takes (all-reduce | all-gather | reduce-scatter, bytes, group)
//! and returns how the engine runs it ([`Lowered`]): one phase of transfers that load each
//! link as the algorithm does, started together, plus the algorithm's latency once they
//! land. Time = one transfer's start-up α (the topology's link latency) + the algorithm's
//! latency + the most loaded link's bytes ÷ its achieved capacity. Every algorithm NCCL
//! could use for the group is priced that way and the fastest wins, as NCCL's tuner picks
//! the least modelled time (`topoGetAlgoInfo`, src/enqueue.cc):
//! - ring, in each of NCCL's three protocols: each rank moves (n−1)/n · S (all-gather,
//!   reduce-scatter) or 2(n−1)/n · S (all-reduce); latency = base + one per-step latency
//!   per ring step, NVLink steps and network steps apart (`ncclTopoTuneModel`,
//!   src/graph/tuning.cc: `baseLat[p]` + `(nsteps − nInterSteps) · hwLat[NVLINK][p] +
//!   nInterSteps · hwLat[NET][p]`); bandwidth = the links' (Simple), × 0.92 (LL128; 0.7
//!   with one GPU per node), × 1/3 (LL all-gather and reduce-scatter on one node; 1/4
//!   for all-reduce or across nodes) capped at `llMaxBw` (the same function's "model
//!   refinements"). A slower protocol's transfers carry its bytes ÷ that fraction, so
//!   that the links take its time. Small messages go LL, then LL128, then Simple, as
//!   NCCL's least-time choice (`topoGetAlgoInfo`) sends them. The ring's kernel
//!   (`runRing` in NVIDIA/nccl src/device/all_gather.h, reduce_scatter.h, all_reduce.h)
//!   walks the buffer in loops of one chunk per channel and rank; each loop ends with a
//!   step that receives without sending (all-gather and all-reduce: `directRecv`, the
//!   chunk copied from the receive buffer into the output; reduce-scatter:
//!   `recvReduceCopy`). Every rank reaches that step at once and starts the next loop
//!   only after it, so no link carries anything meanwhile. Summed over the loops, each
//!   rank reads and writes its share S/n once more in its own memory: 2·S/n at the GPU's
//!   memory bandwidth (`[collectives] hbm_gbyte_s`), added to the ring's latency in every
//!   protocol. It is one local step per 2(n−1) link steps of an all-reduce and per n − 1
//!   of an all-gather or reduce-scatter, so it weighs most on small rings. The ring's
//!   pipeline moves whole slices behind flags (a rank forwards a slice once it has landed
//!   whole: `directRecvCopyDirectSend`, `recvReduceSend` in the same kernels), so it
//!   fills and drains by one slice per channel, priced as one slice per channel
//!   (`[collectives] ring_channels`) crossing the busiest link at the protocol's rate,
//!   once per collective. A slice is `stepSize · sliceSteps` (`calcCollChunking`,
//!   src/enqueue.cc; `stepSize = buffSizes[p] / NCCL_STEPS`, src/init.cc;
//!   `*_SLICESTEPS` / `*_CHUNKSTEPS`, src/include/collectives.h): Simple 1 MiB, half its 2
//!   MiB chunk; LL128 and LL one chunk (576,000 and 32,768 bytes of data). On a buffer
//!   smaller than one loop (channels × ranks × chunk) `runRing` shrinks the chunk to the
//!   buffer's share of one channel and rank (`divUp(remCount, nranks)`). So the fill
//!   grows with the buffer up to one loop and stays at 24 MiB (Simple, 24 channels, 67 µs
//!   at 375 GB/s) beyond: the bus bandwidth keeps rising with size up to 8 GiB, and the
//!   fill, not the per-step latency, carries the large sizes' shortfall;
//! - NVLS (NVLink SHARP) all-reduce inside one NVLink domain whose topology has
//!   `nvlink.sharp_efficiency`, on communicators of at least `[collectives] nvls_min_gpus`
//!   GPUs (≥ 3: `ncclNvlsInit`, src/transport/nvls.cc, builds no NVLS for two; the DGX
//!   H200 files say 6, from NCCL's tuner tables on an H100 node, see their comments),
//!   unless turned off (`[collectives] nvls = false` in the topology, `[network] nvls =
//!   false` in an experiment, `skewsim topo --no-nvls`; NCCL's `NCCL_NVLS_ENABLE=0`).
//!   `multimem.ld_reduce` makes the switch read every rank's whole buffer and return its
//!   reduced shard, `multimem.st` multicasts it, so each GPU link carries S(1 + 1/n) each
//!   way. Lowered as shift-by-one transfers of those bytes × (NVLink efficiency ÷ NVLS
//!   efficiency), which load one up-link and one down-link per GPU for the time NVLS needs
//!   at its own efficiency; latency NCCL's constant (`hwLat[NVLINK][NVLS]`) plus the
//!   kernel's loops; Simple only (the tuner skips LL and LL128 for NVLS). The kernel
//!   (`RunWorkElement<AllReduce, NVLS>`, src/device/all_reduce.h) runs three thread groups
//!   per channel as a pipeline: scatter copies the rank's input into one chunk per rank,
//!   reduce (`multimem.ld_reduce` / `multimem.st`) handles the rank's own chunk, gather
//!   copies every rank's reduced chunk out. They walk the buffer in loops of one chunk per
//!   channel and rank; the chunk is 128 KiB (`nvlsChunkSize`), shrunk to 64, 32 and 16 KiB
//!   on buffers below 64, 8 and 2 loops of the larger one (`calcCollChunking`,
//!   src/enqueue.cc: `concurrentOps = nChannels * nHeads`, one head per rank on one node).
//!   Priced: two loops' bytes at NVLS's rate (the three-stage pipeline fills and drains),
//!   and one chunk copy's fixed cost (`[collectives] nvls_copy_us`) per rank for every
//!   loop, the two of the fill included, on `[collectives] nvls_channels` channels. So
//!   small buffers pay for many small chunks and large ones approach NVLS's rate: on 8
//!   H100s the bus bandwidth runs 177 GB/s at 8 MiB, 362 at 64 MiB, 480 at 8 GiB, and
//!   jumps where the chunk doubles at 1 GiB (NVIDIA/dgxc-benchmarking `nccl/README.md`).
//!   NCCL's tuner does not see the loops: it chooses by its latency and bandwidth alone,
//!   so the loops price NVLS once it is chosen and take no part in the choice. NVLS
//!   all-gather and reduce-scatter are not
//!   candidates: NCCL's tuner gives them 25.5 / 114.8 / 177.1 GB/s against the ring's 720
//!   / 480 / 432 on 2 / 4 / 6 H100s with about the ring's latency (NCCL 2.29
//!   `NCCL_DEBUG=TUNING` tables of the same source), so the ring wins from a few MiB on;
//! - tree (all-reduce) and PAT (all-gather, reduce-scatter) when every rank is in its own
//!   NVLink domain (PAT: `ncclPatEnable`, one GPU per node; the tree is also considered
//!   only there here): tree latency `baseLat` + 2 · log2(nodes) · `interLat` in each
//!   protocol, bandwidth 0.92 × ½ of the link's (`busBw*.92`, algorithm bandwidth = bus
//!   bandwidth × .5) in Simple, × 1/3.8 (LL, at most `llMaxBw`) or 120/128 (LL128) of
//!   that; PAT (Simple only) latency log2(nodes) · `interLat`/3.5 + nRanks · 2.8 µs,
//!   bandwidth 0.75 of the ring's (`busBw *= .75`; its network `interLat` is taken as the
//!   ring's).
//!
//! NCCL's constants, µs, read in NVIDIA/nccl src/graph/tuning.cc (`baseLat`, `hwLat`,
//! `llMaxBws`), whose ring latencies NCCL 2.29.2's own `NCCL_DEBUG=TUNING` table on four
//! H100s reproduces (all-reduce LL 10.2 µs, LL128 25.4, Simple 28.8 = 6.6 + 6 · 0.6, 14 + 6
//! · 1.9, 8.4 + 6 · 3.4; LL128 at 0.92 of Simple's 240 GB/s): ring `baseLat` LL 6.6, LL128
//! 14, Simple 8.4; per-step `hwLat` over NVLink 0.6 / 1.9 / 3.4, over the network 2.7 / 4 /
//! 14; tree `baseLat` 6.8 / 14 / 0 and network `hwLat` 5 / 8.5 / 28; NVLS `hwLat` 23;
//! `llMaxBw` 87.7 GB/s on one Hopper node, 39 on two, 20.4 on more (Intel hosts); the PAT
//! latency formula from the 2.23 tuning code. The whole latency table is scaled by the
//! topology's `[collectives] latency_scale`.
//!
//! The DGX H200 files' NVLink efficiency, `latency_scale`, NVLS efficiency and NVLS chunk
//! copy are fitted to the `fit` rows of `traces/nccl_tests_published.csv` (one 8-GPU H100
//! ring reduce-scatter series, priced with the H100's 3.35 TB/s of memory, and one 8-GPU
//! H100 NVLS all-reduce series, 8 MiB – 16 GiB) and scored on the other rows (2, 4 and 6
//! GPUs, other 8-GPU sources) by the `published_nccl_tests_figures` test. The fitted link
//! rate, 0.833 × 450 = 374.9 GB/s, is 1 % above NCCL's own figure for an H100's NVLink (18
//! links × 20.6 GB/s, `SM90_NVLINK_BW`, src/graph/topo.h); the latency scale comes out 0.64
//! (the held-out 4-GPU rows at 8 MiB land within 6 % with it). The GB200 NVL72 file's NVLS
//! efficiency and chunk copy are fitted the same way to one 72-GPU rack's all-reduce
//! (`traces/nccl_tests_gb200.csv`). Without a topology
//! ([`CollectiveModel::default`], a stub network) every collective is a Simple ring with
//! no latency of its own.
//!
//! Channels: NCCL runs a collective on `comm->nChannels` channels (one thread block each)
//! and lowers that count only for small messages (`topoGetAlgoInfo`, src/enqueue.cc: `while
//! (nBytes < nc * nt * threadThreshold) nc--`; `threadThresholds` in src/graph/tuning.cc: 64
//! bytes per thread for Simple, 8 for LL128, 8 × nRanks for the ring's LL; `nt` 512 threads,
//! 640 for LL128). On c channels the loop stops at c · 32 KiB (Simple), c · 5 KiB (LL128)
//! and c · nRanks · 4 KiB (LL): 768 KiB, 120 KiB and nRanks · 96 KiB at 24 channels, below
//! every size the published figures cover (≥ 8 MiB), where NCCL runs on all its channels.
//! The model prices every collective on the full links and does not lower the count; the
//! count (`[collectives] ring_channels`) sets the pipeline's fill. It does not depend on
//! the GPUs taken: on an H100 NVSwitch node NCCL 2.29
//! builds 24 ring channels for 2 and for 4 GPUs alike, 15 GB/s each in its tuner (360 GB/s
//! of bus bandwidth; `NCCL_DEBUG=INFO` logs of github.com/waynehacking8/nccl-collectives-bench,
//! results/scaling_attributed/), and neither its tuner nor its kernels treat a small ring
//! differently beyond the step counts above.
//!
//! # Step-by-step lowerings
//! [`lower`] gives the phases of each algorithm step (benchmarks and the flow-vs-analytical
//! differential tests use them):
//! - all-to-all(v): one phase in which every rank sends to every other rank at once (what
//!   Ulysses, DistCA and Libra's tile exchange issue), or `n − 1` pairwise shift rounds;
//! - ring all-gather / reduce-scatter: `n − 1` steps of `S/n` to the next rank;
//! - ring all-reduce: reduce-scatter then all-gather, `2(n − 1)` steps of `S/n`;
//! - send/recv: every rank sends `S` to the next one (the nccl-tests `sendrecv` pattern;
//!   a single pair is a group of two).
//!
//! A lowering is a list of *phases*; a phase starts when the previous one has completed
//! everywhere (a ring on homogeneous links proceeds in lock step, so this is its time).
//! [`run_phases`] drives any [`NetworkModel`] through them; [`analytical_phases`] prices
//! them in closed form: per transfer `α + load(bottleneck link) / capacity`, where a link's
//! load is every byte of the phase that crosses it. Without contention that is exactly what
//! the flow model gives; with it, max–min sharing can only be as slow or slower on some
//! flows and faster on none of the bottlenecked ones.
//!
//! Bus bandwidth (nccl-tests PERFORMANCE.md): `busbw = algbw × f`, `f = (n−1)/n` for
//! all-gather, reduce-scatter and all-to-all, `2(n−1)/n` for all-reduce, 1 for send/recv;
//! `algbw = S / time` with `S` the nccl-tests "size" (all-gather: the gathered output;
//! all-to-all: one rank's send buffer).

use std::collections::HashMap;

use serde::Serialize;

use crate::cluster::Topology;
use crate::error::{invalid, Result};
use crate::net::{transfer_ps, AnalyticalModel, GpuId, NetworkModel, Ps};

/// A collective operation, as nccl-tests names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Collective {
    /// Every rank sends `S/n` to every rank (one phase, all pairs concurrently).
    AllToAll,
    /// `n − 1` shift rounds; round k: rank i → rank i + k (pairwise exchange).
    AllToAllPairwise,
    /// Ring all-gather.
    AllGather,
    /// Ring reduce-scatter.
    ReduceScatter,
    /// Ring all-reduce.
    AllReduce,
    /// Each rank sends `S` to the next.
    SendRecv,
}

impl Collective {
    /// nccl-tests' bus-bandwidth factor for `n` ranks.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Collective::AllToAll
            | Collective::AllToAllPairwise
            | Collective::AllGather
            | Collective::ReduceScatter => (n - 1.0) / n,
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::SendRecv => 1.0,
        }
    }

    /// The name nccl-tests uses.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllToAll => "alltoall",
            Collective::AllToAllPairwise => "alltoall-pairwise",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllReduce => "all_reduce",
            Collective::SendRecv => "sendrecv",
        }
    }
}

/// One point-to-point transfer of a lowered collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Transfer {
    /// Sending GPU.
    pub src: GpuId,
    /// Receiving GPU.
    pub dst: GpuId,
    /// Bytes.
    pub bytes: u64,
}

/// Phases of transfers; phase k + 1 starts when phase k has completed.
pub type Phases = Vec<Vec<Transfer>>;

/// Lower `op` of nccl-tests size `bytes` over the ranks `group` (ring order = group
/// order).
pub fn lower(op: Collective, group: &[GpuId], bytes: u64) -> Result<Phases> {
    let n = group.len();
    if n < 2 {
        return Err(invalid("group size", n, "at least 2 ranks"));
    }
    let mut seen = group.to_vec();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != n {
        return Err(invalid("group", format!("{group:?}"), "distinct GPU ids"));
    }
    let chunk = bytes / n as u64;
    let ring = |steps: usize| -> Phases {
        (0..steps)
            .map(|_| shift(group, 1, chunk).collect())
            .collect()
    };
    Ok(match op {
        Collective::AllGather | Collective::ReduceScatter => ring(n - 1),
        Collective::AllReduce => ring(2 * (n - 1)),
        Collective::SendRecv => vec![shift(group, 1, bytes).collect()],
        Collective::AllToAll => vec![(0..n)
            .flat_map(|i| {
                (0..n).filter(move |&j| j != i).map(move |j| Transfer {
                    src: group[i],
                    dst: group[j],
                    bytes: chunk,
                })
            })
            .collect()],
        Collective::AllToAllPairwise => (1..n).map(|k| shift(group, k, chunk).collect()).collect(),
    })
}

/// Every rank of `group` sends `bytes` to the rank `k` places after it.
fn shift(group: &[GpuId], k: usize, bytes: u64) -> impl Iterator<Item = Transfer> + '_ {
    let n = group.len();
    (0..n).map(move |i| Transfer {
        src: group[i],
        dst: group[(i + k) % n],
        bytes,
    })
}

/// All-to-all-v: rank i sends `matrix[i][j]` bytes to rank j, all at once.
pub fn lower_alltoallv(group: &[GpuId], matrix: &[Vec<u64>]) -> Result<Phases> {
    let n = group.len();
    if matrix.len() != n || matrix.iter().any(|row| row.len() != n) {
        return Err(invalid(
            "alltoallv matrix",
            format!("{} rows", matrix.len()),
            format!("{n} rows of {n} byte counts"),
        ));
    }
    Ok(vec![(0..n)
        .flat_map(|i| {
            (0..n)
                .filter(move |&j| j != i && matrix[i][j] > 0)
                .map(move |j| Transfer {
                    src: group[i],
                    dst: group[j],
                    bytes: matrix[i][j],
                })
        })
        .collect()])
}

/// Drive `model` through `phases` starting at `start`; returns the completion time.
/// Transfer `k` (counting across phases) carries tag `tag_base + k`, which is also its
/// ECMP flow id.
pub fn run_phases(model: &mut dyn NetworkModel, start: Ps, phases: &Phases, tag_base: u64) -> Ps {
    let mut t = start;
    let mut tag = tag_base;
    let mut done = Vec::new();
    for phase in phases {
        for tr in phase {
            model.start(t, tr.src, tr.dst, tr.bytes, tag);
            tag += 1;
        }
        let mut left = phase.len();
        while left > 0 {
            let Some(next) = model.next_completion() else {
                break;
            };
            model.advance(next, &mut done);
            left = left.saturating_sub(done.len());
            done.clear();
            t = t.max(next);
        }
    }
    t
}

/// Closed-form price of `phases` on the analytical model (same tags/ECMP choices as
/// [`run_phases`]): per phase, the slowest transfer's `α + load / capacity` of its most
/// loaded link.
pub fn analytical_phases(model: &AnalyticalModel, phases: &Phases, tag_base: u64) -> Ps {
    let topo = model.topology();
    let mut tag = tag_base;
    let mut total: Ps = 0;
    let mut load: HashMap<u32, f64> = HashMap::new();
    let mut routes = Vec::new();
    for phase in phases {
        load.clear();
        routes.clear();
        for tr in phase {
            let r = topo.route(tr.src, tr.dst, tag).ok();
            tag += 1;
            if let Some(r) = &r {
                for &l in r.links() {
                    *load.entry(l).or_insert(0.0) += tr.bytes as f64;
                }
            }
            routes.push((r, tr.bytes));
        }
        let mut phase_t: Ps = 0;
        for (r, bytes) in &routes {
            let t = match r {
                Some(r) if *bytes > 0 && !r.links().is_empty() => {
                    let beta = r
                        .links()
                        .iter()
                        .map(|&l| transfer_ps(load[&l], model.link_capacity(l)))
                        .max()
                        .unwrap_or(0);
                    topo.route_latency(r).saturating_add(beta)
                }
                _ => 0,
            };
            phase_t = phase_t.max(t);
        }
        total = total.saturating_add(phase_t);
    }
    total
}

/// An algorithm NCCL can run a collective with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Algo {
    /// Ring: `n − 1` steps (all-gather, reduce-scatter) or `2(n − 1)` (all-reduce).
    Ring,
    /// NVLink SHARP: in-switch reduction / multicast inside one NVLink domain.
    Nvls,
    /// Double binary tree across nodes (all-reduce).
    Tree,
    /// Parallel aggregated trees (all-gather, reduce-scatter; one GPU per node).
    Pat,
}

impl Algo {
    /// The name `NCCL_ALGO` uses.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Nvls => "NVLS",
            Algo::Tree => "tree",
            Algo::Pat => "PAT",
        }
    }
}

/// NCCL's protocols: LL (8-byte flag+data stores, lowest latency), LL128 (128-byte lines
/// with a flag) and Simple (bulk copies behind a per-step handshake).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Proto {
    /// Low latency.
    Ll,
    /// Low latency, 128-byte lines.
    Ll128,
    /// Bulk.
    Simple,
}

impl Proto {
    /// The name `NCCL_PROTO` uses.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Ll => "LL",
            Proto::Ll128 => "LL128",
            Proto::Simple => "Simple",
        }
    }
}

// NCCL's ring latencies, µs, indexed by [`Proto`] (src/graph/tuning.cc: `baseLat`,
// `hwLat[NCCL_HW_NVLINK]`, `hwLat[NCCL_HW_NET]`).
const RING_BASE_US: [f64; 3] = [6.6, 14.0, 8.4];
const RING_STEP_NVLINK_US: [f64; 3] = [0.6, 1.9, 3.4];
const RING_STEP_NET_US: [f64; 3] = [2.7, 4.0, 14.0];
/// NCCL's ring chunk per channel and rank, bytes, by [`Proto`] (`calcCollChunking`,
/// src/enqueue.cc: `stepSize = buffSizes[p] / NCCL_STEPS`, × `chunkSteps` for Simple;
/// LL carries half its bytes, LL128 15 of each 16 words). Buffers (src/init.cc): LL 8 ·
/// 512 · 8 · 16 B = 512 KiB, LL128 120 · 640 · 8 · 8 B, Simple 4 MiB (`DEFAULT_BUFFSIZE`);
/// `NCCL_STEPS` 8, `ALLREDUCE_CHUNKSTEPS` = `ALLGATHER_CHUNKSTEPS` =
/// `REDUCESCATTER_CHUNKSTEPS` = 4 (src/include/collectives.h).
const RING_CHUNK: [u64; 3] = [32 << 10, 614_400 / 16 * 15, 2 << 20];
/// Slices per chunk by [`Proto`]: `CHUNKSTEPS / SLICESTEPS` = 4 / 2 for Simple; one
/// (`sliceSteps = 1`) for LL and LL128.
const RING_SLICES_PER_CHUNK: [u64; 3] = [1, 1, 2];
/// NCCL's protocols, Simple first (it wins ties).
pub const PROTOS: [Proto; 3] = [Proto::Simple, Proto::Ll128, Proto::Ll];
/// LL128's bus bandwidth ÷ Simple's, at least two GPUs per node / one GPU per node.
const LL128_BW: [f64; 2] = [0.92, 0.7];
/// LL's bus bandwidth ÷ Simple's: all-gather and reduce-scatter on one node / all-reduce or
/// across nodes.
const LL_BW: [f64; 2] = [1.0 / 3.0, 1.0 / 4.0];
/// LL's bus-bandwidth cap `llMaxBw`, GB/s: one Hopper node, two nodes, more (Intel hosts).
const LL_MAX_GBS: [f64; 3] = [87.7, 39.0, 20.4];
// NCCL's tree latencies, µs, by [`Proto`]: `baseLat`, `hwLat[NCCL_HW_NET]`.
const TREE_BASE_US: [f64; 3] = [6.8, 14.0, 0.0];
const TREE_STEP_NET_US: [f64; 3] = [5.0, 8.5, 28.0];
/// The tree's LL and LL128 bus bandwidth ÷ its Simple one across nodes: 1/3.8, 120/128.
const TREE_PROTO_BW: [f64; 3] = [1.0 / 3.8, 120.0 / 128.0, 1.0];
const NVLS_US: f64 = 23.0;
const PAT_NET_DIVISOR: f64 = 3.5;
const PAT_RANK_US: f64 = 2.8;
/// Tree all-reduce: bus bandwidth × 0.92, algorithm bandwidth = bus bandwidth / 2.
const TREE_BW: f64 = 0.92 * 0.5;
/// PAT: bus bandwidth × 0.75 of the ring's.
const PAT_BW: f64 = 0.75;

/// A collective the model lowers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum CollOp {
    /// All-reduce.
    AllReduce,
    /// All-gather (size = the gathered output).
    AllGather,
    /// Reduce-scatter (size = one rank's input).
    ReduceScatter,
}

impl CollOp {
    /// The nccl-tests collective.
    pub fn collective(self) -> Collective {
        match self {
            CollOp::AllReduce => Collective::AllReduce,
            CollOp::AllGather => Collective::AllGather,
            CollOp::ReduceScatter => Collective::ReduceScatter,
        }
    }
}

/// What NCCL's choice depends on in one cluster. Integer fields, so that the placement
/// that carries it stays `Eq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fabric {
    /// GPUs of one NVLink domain.
    pub domain_gpus: u32,
    /// Achieved bytes/s of one GPU's NVLink port.
    pub nvlink_bps: u64,
    /// Achieved bytes/s of one NIC path (0: no scale-out network).
    pub nic_bps: u64,
    /// NVLS usable: its bytes are stretched by NVLink efficiency ÷ NVLS efficiency (parts
    /// per million), so that a plain NVLink transfer takes NVLS's time.
    pub nvls_stretch_ppm: Option<u64>,
    /// NCCL's latency table × this, parts per million.
    pub latency_ppm: u64,
    /// Smallest communicator NCCL's tuner gives NVLS (`[collectives] nvls_min_gpus`).
    pub nvls_min_gpus: u32,
    /// Per-transfer start-up over NVLink, ps.
    pub nvlink_alpha_ps: Ps,
    /// GPU memory bytes/s for the ring's local last step (`[collectives] hbm_gbyte_s`; 0:
    /// not priced).
    pub hbm_bps: u64,
    /// NCCL's ring channels (`[collectives] ring_channels`; 0: the ring's pipeline fill is
    /// not priced).
    pub ring_channels: u32,
    /// NCCL's NVLS channels (`[collectives] nvls_channels`; 0: NVLS's loops are not
    /// priced).
    pub nvls_channels: u32,
    /// One NVLS chunk copy's cost beyond its bytes, ps (`[collectives] nvls_copy_us`).
    pub nvls_copy_ps: Ps,
    /// Measured (latency ps, port bytes/s) per algorithm, in [`Algo`] order
    /// (`[[collectives.fit]]`, measured inside one NVLink domain and applied there).
    pub fits: [Option<(Ps, u64)>; 4],
}

/// NCCL's algorithm choice and latency on one cluster: the one collective model of
/// `skewsim topo` and the step engine. `Default` knows no fabric (a stub network): every
/// collective is a ring with no latency of its own beyond the network's per-transfer α.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CollectiveModel {
    fabric: Option<Fabric>,
}

/// How the engine runs one collective: `xfers` all start when the last GPU arrives (one
/// phase, each loading the links the algorithm loads), and the collective ends `latency`
/// after the last lands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lowered {
    /// NCCL's choice.
    pub algo: Algo,
    /// Its protocol.
    pub proto: Proto,
    /// The transfers.
    pub xfers: Vec<Transfer>,
    /// The algorithm's latency beyond one transfer's start-up.
    pub latency: Ps,
}

/// `gpus` as `nodes` whole blocks of `per_node` consecutive members, each block on its own
/// node, nodes in increasing order (CP and DP groups under the placement rule, whenever
/// they fill nodes): `Some((nodes, per_node))`.
pub fn node_blocks(gpus: &[GpuId], gpus_per_node: u32) -> Option<(usize, usize)> {
    let node = |g: GpuId| g / gpus_per_node.max(1);
    let first = *gpus.first()?;
    let per_node = gpus.iter().take_while(|&&g| node(g) == node(first)).count();
    if gpus.len() % per_node != 0 {
        return None;
    }
    let mut prev: Option<u32> = None;
    for block in gpus.chunks(per_node) {
        let nd = node(block[0]);
        if block.iter().any(|&g| node(g) != nd) || prev.is_some_and(|p| nd <= p) {
            return None;
        }
        prev = Some(nd);
    }
    Some((gpus.len() / per_node, per_node))
}

impl CollectiveModel {
    /// GPUs of one NVLink domain of the modelled fabric (`None`: no fabric known).
    pub fn domain_gpus(&self) -> Option<u32> {
        self.fabric.map(|f| f.domain_gpus)
    }

    /// The model of `topo`; `nvls = false` turns NVLS off on top of the topology's own
    /// `[collectives] nvls`.
    pub fn of(topo: &Topology, nvls: bool) -> Self {
        let spec = &topo.spec;
        let nv = &spec.nvlink;
        let nic_bps = spec.nic.as_ref().map_or(0.0, |n| {
            (n.bandwidth_gbit_s * 1e9 / 8.0 * n.efficiency).min(n.pcie_gbyte_s * 1e9)
        });
        let nvls_stretch_ppm = match nv.sharp_efficiency {
            Some(e) if nvls && spec.collectives.nvls => {
                Some((nv.efficiency / e * 1e6).round() as u64)
            }
            _ => None,
        };
        let us_ps = |us: f64| (us * 1e6).round() as Ps;
        let mut fits = [None; 4];
        for f in &spec.collectives.fit {
            if let Some(k) = ALGOS.iter().position(|a| a.name() == f.algo) {
                fits[k] = Some((
                    us_ps(f.latency_us),
                    (f.bandwidth_gbyte_s * 1e9).round() as u64,
                ));
            }
        }
        Self {
            fabric: Some(Fabric {
                domain_gpus: topo.domain_gpus(),
                nvlink_bps: (nv.bandwidth_gbyte_s * 1e9 * nv.efficiency).round() as u64,
                nic_bps: nic_bps.round() as u64,
                nvls_stretch_ppm,
                latency_ppm: (spec.collectives.latency_scale * 1e6).round() as u64,
                nvls_min_gpus: spec.collectives.nvls_min_gpus,
                nvlink_alpha_ps: us_ps(nv.latency_us),
                hbm_bps: spec
                    .collectives
                    .hbm_gbyte_s
                    .map_or(0, |h| (h * 1e9).round() as u64),
                ring_channels: spec.collectives.ring_channels.unwrap_or(0),
                nvls_channels: spec.collectives.nvls_channels.unwrap_or(0),
                nvls_copy_ps: us_ps(spec.collectives.nvls_copy_us.unwrap_or(0.0)),
                fits,
            }),
        }
    }

    /// The fabric, if one is known.
    pub fn fabric(&self) -> Option<&Fabric> {
        self.fabric.as_ref()
    }

    /// Lower `op` (nccl-tests size `bytes`) over `group` (distinct GPUs; ring order = group
    /// order) on nodes of `gpus_per_node` GPUs, as NCCL would run it: every algorithm and
    /// protocol NCCL could use here is priced (its latency + its most loaded link alone)
    /// and the fastest wins, the ring's Simple protocol first on ties. A group of one moves
    /// nothing.
    pub fn lower(&self, op: CollOp, group: &[GpuId], bytes: u64, gpus_per_node: u32) -> Lowered {
        self.lower_in(&PROTOS, op, group, bytes, gpus_per_node)
    }

    /// [`CollectiveModel::lower`] with only the protocols `protos` (Simple first), e.g.
    /// `&[Proto::Simple]` for the bulk protocol a measured `[[collectives.fit]]` line
    /// stands for.
    pub fn lower_in(
        &self,
        protos: &[Proto],
        op: CollOp,
        group: &[GpuId],
        bytes: u64,
        gpus_per_node: u32,
    ) -> Lowered {
        self.priced(protos, None, op, group, bytes, gpus_per_node)
            .unwrap_or_else(|| Lowered {
                algo: Algo::Ring,
                proto: Proto::Simple,
                xfers: ring_xfers(group, 0, gpus_per_node),
                latency: 0,
            })
    }

    /// `algo` in `proto`, priced as if NCCL had chosen it (NVLS with its loops), whether or
    /// not the tuner would; `None` where the group cannot run it (NVLS across domains or
    /// below `nvls_min_gpus`, tree and PAT inside a domain, NVLS in LL or LL128). For fits
    /// that hold the algorithm and protocol of a row fixed while parameters move.
    pub fn lower_as(
        &self,
        algo: Algo,
        proto: Proto,
        op: CollOp,
        group: &[GpuId],
        bytes: u64,
        gpus_per_node: u32,
    ) -> Option<Lowered> {
        self.priced(&[proto], Some(algo), op, group, bytes, gpus_per_node)
            .filter(|l| l.proto == proto)
    }

    /// The fastest candidate in `protos` (of `only`, when given), NVLS's loops added once
    /// it is the one; `None` when no candidate is left.
    fn priced(
        &self,
        protos: &[Proto],
        only: Option<Algo>,
        op: CollOp,
        group: &[GpuId],
        bytes: u64,
        gpus_per_node: u32,
    ) -> Option<Lowered> {
        let n = group.len();
        let ring_steps = match op {
            CollOp::AllReduce => 2 * n.saturating_sub(1),
            CollOp::AllGather | CollOp::ReduceScatter => n.saturating_sub(1),
        };
        let keep = |l: Lowered| Some(l).filter(|l| only.is_none_or(|a| a == l.algo));
        if n < 2 {
            return keep(Lowered {
                algo: Algo::Ring,
                proto: Proto::Simple,
                xfers: Vec::new(),
                latency: 0,
            });
        }
        // each rank's bytes over its ring link
        let moved = (ring_steps as u64 * bytes).div_ceil(n as u64);
        let ring = Lowered {
            algo: Algo::Ring,
            proto: Proto::Simple,
            xfers: ring_xfers(group, moved, self.domain_gpus().unwrap_or(gpus_per_node)),
            latency: 0,
        };
        let Some(f) = self.fabric else {
            return keep(ring);
        };
        let domain = |g: GpuId| g / f.domain_gpus.max(1);
        let mut domains: Vec<u32> = group.iter().map(|&g| domain(g)).collect();
        domains.sort_unstable();
        domains.dedup();
        let d = domains.len();
        let inter = match op {
            CollOp::AllReduce => 2 * (d - 1),
            _ => d - 1,
        };
        let us = |v: f64| (v * f.latency_ppm as f64).round() as Ps;
        // The busiest link's time alone, s.
        let link_secs = |l: &Lowered| -> f64 {
            l.xfers
                .iter()
                .map(|t| {
                    let bps = if domain(t.src) == domain(t.dst) {
                        f.nvlink_bps
                    } else {
                        f.nic_bps
                    };
                    t.bytes as f64 / bps.max(1) as f64
                })
                .fold(0.0, f64::max)
        };
        let simple = link_secs(&ring);
        let per_rank = ring_steps as f64 * bytes as f64 / n as f64;
        // the ring's last step: each rank's share read and written in its own memory
        let last_step = if f.hbm_bps > 0 {
            (2.0 * bytes.div_ceil(n as u64) as f64 / f.hbm_bps as f64 * 1e12).round() as Ps
        } else {
            0
        };
        // the ring's pipeline fill: one slice per channel, a slice being the protocol's
        // chunk, or the buffer's share of one channel and rank when that is smaller
        let fill = |p: Proto| -> u64 {
            let c = u64::from(f.ring_channels);
            if c == 0 {
                return 0;
            }
            let k = p as usize;
            let chunk = bytes.div_ceil(c * n as u64).min(RING_CHUNK[k]);
            c * chunk.div_ceil(RING_SLICES_PER_CHUNK[k])
        };
        let mut cands: Vec<Lowered> = protos
            .iter()
            .map(|&p| {
                let k = p as usize;
                // this protocol's bandwidth ÷ Simple's (tuning.cc, "model refinements")
                let frac = match p {
                    Proto::Simple => 1.0,
                    Proto::Ll128 => LL128_BW[usize::from(d == n)],
                    Proto::Ll => {
                        let share = LL_BW[usize::from(d > 1 || op == CollOp::AllReduce)];
                        let capped = per_rank / (LL_MAX_GBS[d.min(3) - 1] * 1e9);
                        if capped > 0.0 {
                            share.min(simple / capped)
                        } else {
                            share
                        }
                    }
                };
                let mut l = Lowered {
                    proto: p,
                    xfers: stretched(&ring.xfers, 1.0 / frac),
                    latency: us(RING_BASE_US[k]
                        + (ring_steps - inter) as f64 * RING_STEP_NVLINK_US[k]
                        + inter as f64 * RING_STEP_NET_US[k])
                        + last_step,
                    ..ring.clone()
                };
                // the fill crosses the busiest link at this protocol's rate
                if moved > 0 {
                    let share = fill(p) as f64 / moved as f64;
                    l.latency += (link_secs(&l) * share * 1e12).round() as Ps;
                }
                l
            })
            .collect();
        let shift_by_one =
            |per: f64| -> Vec<Transfer> { shift(group, 1, per.round() as u64).collect() };
        let s = bytes as f64;
        if let Some(ppm) = f.nvls_stretch_ppm {
            if op == CollOp::AllReduce && d == 1 && n >= f.nvls_min_gpus as usize {
                // S(1 + 1/n) up and down each GPU link
                let per = s * (n as f64 + 1.0) / n as f64;
                cands.push(Lowered {
                    algo: Algo::Nvls,
                    proto: Proto::Simple,
                    xfers: shift_by_one(per * ppm as f64 * 1e-6),
                    latency: us(NVLS_US),
                });
            }
        }
        if d == n && f.nic_bps > 0 {
            let log2 = f64::from(usize::BITS - 1 - n.leading_zeros());
            match op {
                CollOp::AllReduce => cands.extend(protos.iter().map(|&p| {
                    let k = p as usize;
                    let frac = match p {
                        // `llMaxBw` caps LL's bus bandwidth (= 2 × its algorithm bandwidth)
                        Proto::Ll => TREE_PROTO_BW[k].min(
                            LL_MAX_GBS[d.min(3) - 1] * 1e9 / (TREE_BW * 2.0 * f.nic_bps as f64),
                        ),
                        _ => TREE_PROTO_BW[k],
                    };
                    Lowered {
                        algo: Algo::Tree,
                        proto: p,
                        xfers: shift_by_one(s / TREE_BW / frac),
                        latency: us(TREE_BASE_US[k] + 2.0 * log2 * TREE_STEP_NET_US[k]),
                    }
                })),
                _ => cands.push(Lowered {
                    algo: Algo::Pat,
                    proto: Proto::Simple,
                    xfers: shift_by_one(s * (n - 1) as f64 / n as f64 / PAT_BW),
                    latency: us(
                        log2 * RING_STEP_NET_US[Proto::Simple as usize] / PAT_NET_DIVISOR
                            + n as f64 * PAT_RANK_US,
                    ),
                }),
            }
        }
        if d == 1 {
            // a measured fit prices its algorithm as one line (its bulk protocol's place)
            cands.retain(|c| c.proto == Proto::Simple || f.fits[c.algo as usize].is_none());
            for c in &mut cands {
                if let Some(fit) = f.fits[c.algo as usize] {
                    apply_fit(c, fit, &f);
                }
            }
        }
        if let Some(a) = only {
            cands.retain(|c| c.algo == a);
        }
        if cands.is_empty() {
            return None;
        }
        let estimate = |l: &Lowered| l.latency as f64 * 1e-12 + link_secs(l);
        let mut best = 0;
        for (k, c) in cands.iter().enumerate().skip(1) {
            if estimate(c) < estimate(&cands[best]) {
                best = k;
            }
        }
        let mut chosen = cands.swap_remove(best);
        // NVLS's loops price it once chosen: NCCL's tuner chooses by its latency and
        // bandwidth alone; a measured NVLS fit is the whole price
        if chosen.algo == Algo::Nvls && f.fits[Algo::Nvls as usize].is_none() {
            let loops_ps = nvls_loops_ps(&f, n as u64, bytes, link_secs(&chosen));
            chosen.latency = chosen.latency.saturating_add(loops_ps);
        }
        Some(chosen)
    }
}

/// NCCL's largest NVLS chunk, bytes (`nvlsChunkSize`, `NCCL_NVLS_CHUNKSIZE`'s default).
const NVLS_CHUNK: u64 = 128 << 10;

/// An NVLS all-reduce of `bytes` on `ranks` GPUs and `channels` NVLS channels: (bytes of
/// one loop, loops). Each loop carries one chunk per channel and rank; NCCL shrinks the
/// chunk from 128 KiB to 64, 32 and 16 KiB on buffers below 64, 8 and 2 loops of the
/// larger chunk (`calcCollChunking`, src/enqueue.cc: `concurrentOps = nChannels *
/// nvls.nHeads`, one head per rank on one node).
fn nvls_loops(channels: u32, ranks: u64, bytes: u64) -> (u64, u64) {
    let ops = u64::from(channels) * ranks;
    let mut chunk = NVLS_CHUNK;
    for (loops, smaller) in [(64, 64 << 10), (8, 32 << 10), (2, 16 << 10)] {
        if bytes < (loops * ops).saturating_mul(chunk) && chunk > smaller {
            chunk = smaller;
        }
    }
    let loop_bytes = ops * chunk;
    (loop_bytes, bytes.div_ceil(loop_bytes))
}

/// The loops of an NVLS all-reduce of `bytes` on `ranks` GPUs whose transfers alone take
/// `link_secs`, ps: two loops fill and drain the three-stage pipeline at NVLS's rate, and
/// every loop, the fill's included, copies one chunk per rank (0 without `nvls_channels`).
fn nvls_loops_ps(f: &Fabric, ranks: u64, bytes: u64, link_secs: f64) -> Ps {
    if f.nvls_channels == 0 || bytes == 0 {
        return 0;
    }
    let (loop_bytes, loops) = nvls_loops(f.nvls_channels, ranks, bytes);
    let fill = 2.0 * loop_bytes.min(bytes) as f64 / bytes as f64;
    let fill_ps = (link_secs * fill * 1e12).round() as Ps;
    let copies = (loops + 2).saturating_mul(ranks);
    fill_ps.saturating_add(copies.saturating_mul(f.nvls_copy_ps))
}

/// `xfers` with every transfer's bytes × `by` (a slower protocol or algorithm's time on the
/// same links).
fn stretched(xfers: &[Transfer], by: f64) -> Vec<Transfer> {
    xfers
        .iter()
        .map(|t| Transfer {
            bytes: (t.bytes as f64 * by).round() as u64,
            ..*t
        })
        .collect()
}

/// Price `l` (inside one NVLink domain) by a measured `(latency, port bytes/s)`: each
/// transfer is stretched so that NVLink moves it at the measured rate (the busiest port
/// then takes `port bytes / rate`), and the latency is what the measurement holds beyond
/// one transfer's start-up.
fn apply_fit(l: &mut Lowered, (lat, bps): (Ps, u64), f: &Fabric) {
    l.xfers = stretched(&l.xfers, f.nvlink_bps as f64 / bps.max(1) as f64);
    l.latency = lat.saturating_sub(f.nvlink_alpha_ps);
}

/// NCCL's algorithms in [`Algo`] order (`Fabric::fits` is indexed by it).
const ALGOS: [Algo; 4] = [Algo::Ring, Algo::Nvls, Algo::Tree, Algo::Pat];

/// A ring's one-phase transfers: each rank moves `per` bytes. On whole blocks of an NVLink
/// domain (`domain_gpus`: a node, or a multi-node NVLink domain, whose ranks NCCL's
/// topology search sees as one system: `ncclTopoGetSystem`, src/graph/topo.cc, fuses the
/// topology of every rank of an MNNVL clique) the ring runs as NCCL's with one channel per
/// GPU of a block: 1/g of a rank's traffic crosses to the rank at its position in the next
/// domain (through its own NIC), the rest goes over NVLink to the next rank of its block;
/// any other group is one ring in group order.
fn ring_xfers(group: &[GpuId], per: u64, domain_gpus: u32) -> Vec<Transfer> {
    let n = group.len();
    let mut xf = Vec::with_capacity(2 * n);
    match node_blocks(group, domain_gpus) {
        Some((nodes, g)) if nodes > 1 => {
            let inter = per.div_ceil(g as u64);
            for (i, &src) in group.iter().enumerate() {
                let (k, j) = (i / g, i % g);
                if g > 1 {
                    xf.push(Transfer {
                        src,
                        dst: group[k * g + (j + 1) % g],
                        bytes: per - inter,
                    });
                }
                xf.push(Transfer {
                    src,
                    dst: group[((k + 1) % nodes) * g + j],
                    bytes: inter,
                });
            }
        }
        _ => xf.extend(shift(group, 1, per)),
    }
    xf
}

/// Time of `lw` on `model` from time 0: its one phase, then its latency (what the engine
/// gives the same collective on the same network, uncontended).
pub fn lowered_time(model: &mut dyn NetworkModel, lw: &Lowered, tag_base: u64) -> Ps {
    let phases = vec![lw.xfers.clone()];
    run_phases(model, 0, &phases, tag_base).saturating_add(lw.latency)
}

/// One nccl-tests style row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BusBw {
    /// Collective.
    pub op: &'static str,
    /// NCCL's algorithm (none for all-to-all and send/recv).
    pub algo: Option<Algo>,
    /// Ranks.
    pub ranks: usize,
    /// nccl-tests size, bytes.
    pub bytes: u64,
    /// Time, µs.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbs: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbs: f64,
}

/// algbw and busbw of `op` (by `algo`) over `ranks` ranks moving `bytes` in `time` ps.
pub fn bus_bandwidth(
    op: Collective,
    algo: Option<Algo>,
    ranks: usize,
    bytes: u64,
    time: Ps,
) -> BusBw {
    let secs = time as f64 * 1e-12;
    let algbw = if secs > 0.0 {
        bytes as f64 / secs / 1e9
    } else {
        0.0
    };
    BusBw {
        op: op.name(),
        algo,
        ranks,
        bytes,
        time_us: time as f64 * 1e-6,
        algbw_gbs: algbw,
        busbw_gbs: algbw * op.bus_factor(ranks),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::Rng as _;

    use super::*;
    use crate::cluster::{Topology, TopologySpec};
    use crate::net::FlowModel;
    use crate::rng::stream;

    fn shipped(name: &str, text: &str, nodes: u32) -> Arc<Topology> {
        Arc::new(
            TopologySpec::parse(text, name)
                .unwrap()
                .build(Some(nodes))
                .unwrap(),
        )
    }

    const DGX_ROCE: &str = include_str!("../../topologies/dgx-h200-roce.toml");

    fn both(topo: &Arc<Topology>, phases: &Phases) -> (Ps, Ps, Ps) {
        let mut f = FlowModel::new(topo.clone());
        let mut a = AnalyticalModel::new(topo.clone());
        let tf = run_phases(&mut f, 0, phases, 0);
        let ta = run_phases(&mut a, 0, phases, 0);
        (tf, ta, analytical_phases(&a, phases, 0))
    }

    #[test]
    fn ring_lowering_counts() {
        let p = lower(Collective::AllReduce, &[3, 1, 2], 300).unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(
            p[0][0],
            Transfer {
                src: 3,
                dst: 1,
                bytes: 100
            }
        );
        assert_eq!(
            p[0][2],
            Transfer {
                src: 2,
                dst: 3,
                bytes: 100
            }
        );
        let p = lower(Collective::AllToAll, &[0, 1, 2, 3], 400).unwrap();
        assert_eq!(p[0].len(), 12);
        let p = lower(Collective::AllToAllPairwise, &[0, 1, 2, 3], 400).unwrap();
        assert_eq!((p.len(), p[2][3].dst), (3, 2));
        assert!(lower(Collective::AllGather, &[1], 8).is_err());
        assert!(lower(Collective::AllGather, &[1, 1], 8).is_err());
        assert!(lower_alltoallv(&[0, 1], &[vec![0, 5]]).is_err());
        assert_eq!(
            lower_alltoallv(&[0, 1], &[vec![0, 5], vec![0, 0]]).unwrap()[0].len(),
            1
        );
    }

    #[test]
    fn bus_factors_are_nccl_tests() {
        let b = bus_bandwidth(
            Collective::AllReduce,
            None,
            8,
            8_000_000_000,
            1_000_000_000_000,
        );
        assert_eq!(b.algbw_gbs, 8.0);
        assert_eq!(b.busbw_gbs, 14.0);
        assert_eq!(Collective::AllGather.bus_factor(8), 0.875);
    }

    const PUBLISHED: &str = include_str!("../../traces/nccl_tests_published.csv");

    /// nccl-tests time of `op` at `bytes` on GPUs 0..n of the DGX H200 model.
    fn modelled(
        t: &Arc<Topology>,
        coll: &CollectiveModel,
        op: CollOp,
        n: u32,
        bytes: u64,
    ) -> (Algo, Ps) {
        let group: Vec<GpuId> = (0..n).collect();
        let lw = coll.lower(op, &group, bytes, t.gpus_per_node);
        let mut a = AnalyticalModel::new(t.clone());
        (lw.algo, lowered_time(&mut a, &lw, 0))
    }

    /// The published rows of `traces/nccl_tests_published.csv`: (line, op, GPUs, bytes,
    /// published bus bandwidth GB/s).
    fn published_rows() -> Vec<(&'static str, CollOp, u32, u64, f64)> {
        PUBLISHED
            .lines()
            .filter(|l| !l.starts_with('#'))
            .skip(1)
            .map(|line| {
                let f: Vec<&str> = line.split(',').collect();
                let op = match f[3] {
                    "all_reduce" => CollOp::AllReduce,
                    "all_gather" => CollOp::AllGather,
                    "reduce_scatter" => CollOp::ReduceScatter,
                    o => panic!("op {o}"),
                };
                (
                    line,
                    op,
                    f[2].parse().unwrap(),
                    f[5].parse().unwrap(),
                    f[7].parse().unwrap(),
                )
            })
            .collect()
    }

    /// (NCCL's algorithm, bus bandwidth error) of the DGX H200 model on one published row.
    fn row_error(
        t: &Arc<Topology>,
        coll: &CollectiveModel,
        row: &(&str, CollOp, u32, u64, f64),
    ) -> (Algo, f64) {
        let &(_, op, n, bytes, published) = row;
        let (algo, time) = modelled(t, coll, op, n, bytes);
        let ours = bus_bandwidth(op.collective(), Some(algo), n as usize, bytes, time).busbw_gbs;
        (algo, ours / published - 1.0)
    }

    /// The collective model against every published nccl-tests figure of
    /// `traces/nccl_tests_published.csv` (2, 4, 6 and 8 GPUs of H100/H200 NVSwitch nodes):
    /// NCCL's algorithm on every row; bus bandwidth within the targets (5 % at ≥ 64 MiB,
    /// 15 % at 8–32 MiB) on every row, fit and check alike, but [`MISSES`], each held to its
    /// own bound and each still past the targets (a row that comes within them leaves the
    /// list).
    #[test]
    fn published_nccl_tests_figures() {
        // The rings' rows ran on H100s: their 3.35 TB/s of HBM3 (datasheet), not the
        // H200's 4.8, for the ring's local last step.
        let mut spec = TopologySpec::parse(DGX_ROCE, "dgx-h200-roce.toml").unwrap();
        spec.collectives.hbm_gbyte_s = Some(3350.0);
        let t = Arc::new(spec.build(Some(1)).unwrap());
        let coll = CollectiveModel::of(&t, true);
        let rows = published_rows();
        let mut missed = 0;
        let mut wrong = Vec::new();
        for row in &rows {
            let &(line, _, n, bytes, published) = row;
            let f: Vec<&str> = line.split(',').collect();
            let (algo, err) = row_error(&t, &coll, row);
            let lw = coll.lower(row.1, &(0..n).collect::<Vec<_>>(), bytes, t.gpus_per_node);
            eprintln!(
                "{} {} GPUs {:>6} MiB {:>5} {:>6} {:>5}: published {published:7.2} GB/s, model {:7.2} ({:+.1} %)",
                f[3],
                n,
                bytes >> 20,
                algo.name(),
                lw.proto.name(),
                f[8],
                published * (1.0 + err),
                100.0 * err
            );
            let target = if bytes >= 64 << 20 { 0.05 } else { 0.15 };
            let fault = match MISSES
                .iter()
                .find(|m| (m.0, m.1, m.2, m.3) == (f[0], f[3], n, bytes >> 20))
            {
                _ if algo.name() != f[4] => Some("another algorithm"),
                Some(m) if err.abs() > m.4 => Some("past its bound"),
                Some(_) if err.abs() <= target => Some("meets the target: not a miss"),
                Some(_) => {
                    missed += 1;
                    None
                }
                None if err.abs() > target => Some("past the target"),
                None => None,
            };
            if let Some(why) = fault {
                wrong.push(format!("{line}: {:+.1} %, {why}", 100.0 * err));
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
        assert_eq!((rows.len(), missed), (116, MISSES.len()));
    }

    /// Rows past the targets, with the bound each is held to: (source, op, GPUs, MiB, bound).
    /// All are `check` rows (BENCHMARKS.md, "Collectives: the ring's pipeline fill"). The
    /// 4-GPU all-gather at 8 MiB took 57.1 µs in the source's first run and 47.3 µs in its
    /// rerun on a quiet host, where its reduce-scatter, which moves the same bytes over the
    /// same steps and reduces on top, took 42.9 and 42.7: all-gather runs about 4 µs slower
    /// than reduce-scatter from 4 to 128 MiB in both runs, and the model prices the two alike.
    /// NCCL's maintainers know no reason for all-gather trailing reduce-scatter on H100 and
    /// put it down to code generation (`NVIDIA/nccl#1281`: all-gather is built for byte
    /// elements only, reduce-scatter per datatype), so it is not modelled.
    const MISSES: &[(&str, &str, u32, u64, f64)] = &[
        (BENCH_AG, "all_gather", 4, 8, 0.41),
        (BENCH_AG_QUIET, "all_gather", 4, 8, 0.17),
    ];
    /// The DGX H200 files' NVLink efficiency, latency scale, NVLS efficiency and chunk-copy
    /// cost are the model's own parameters fitted to the `fit` rows
    /// ([`crate::net::collective_fit::fit_params`]): the ring's two on reduce-scatter
    /// 128 MiB – 8 GiB (`NVIDIA/nccl#1047`), NVLS's two on all-reduce 8 MiB – 16 GiB
    /// (`NVIDIA/dgxc-benchmarking`), both on 8 H100s, with the H100's HBM for the ring's
    /// last step. The files keep three digits of the efficiencies and the copy cost, two of
    /// the latency scale (0.635 fitted); NVLS's two, fitted at 0.64, move with it (copy
    /// 0.228 µs at 0.635).
    #[test]
    fn the_dgx_files_collective_parameters_are_the_fit_of_the_fit_rows() {
        use crate::net::collective_fit::{fit_params, rows_from_csv};
        let fit_rows: String = PUBLISHED
            .lines()
            .filter(|l| !l.starts_with('#'))
            .enumerate()
            .filter(|(i, l)| *i == 0 || l.ends_with(",fit"))
            .map(|(_, l)| format!("{l}\n"))
            .collect();
        let rows = rows_from_csv(&fit_rows, "published fit rows").unwrap();
        let mut spec = TopologySpec::parse(DGX_ROCE, "dgx-h200-roce.toml").unwrap();
        spec.collectives.hbm_gbyte_s = Some(3350.0);
        let f = fit_params(&spec, &rows, true).unwrap();
        eprintln!("{f:?}");
        assert_eq!((rows.len(), f.ring_rows, f.nvls_rows), (19, 7, 12));
        let (nv, c) = (&spec.nvlink, &spec.collectives);
        for (fitted, shipped, within) in [
            (f.nvlink_efficiency, nv.efficiency, 5e-4),
            (f.latency_scale, c.latency_scale, 5e-3),
            (
                f.sharp_efficiency.unwrap(),
                nv.sharp_efficiency.unwrap(),
                5e-4,
            ),
            (f.nvls_copy_us.unwrap(), c.nvls_copy_us.unwrap(), 5e-3),
        ] {
            assert!((fitted - shipped).abs() <= within, "{f:?}");
        }
    }

    /// The GB200 NVL72 file's NVLS efficiency and chunk-copy cost are the model's own
    /// parameters fitted to the `fit` rows of `traces/nccl_tests_gb200.csv` (one 72-GPU rack,
    /// 512 MiB, 2 GiB, 8 GiB), and its one-rack `check` rows (1 GiB, 4 GiB) come within 5 %.
    /// Across two racks NCCL runs NVLSTree, which the model does not have; its ring, built
    /// over each rack's 72 GPUs as NCCL builds rings over an MNNVL clique (1/72 of a rank's
    /// bytes crosses racks, through the rank's own NIC), comes within 15 % of those rows.
    #[test]
    fn gb200_nvls_is_the_fit_of_its_fit_rows() {
        use crate::net::collective_fit::{fit_params, price, rows_from_csv};
        let text = include_str!("../../traces/nccl_tests_gb200.csv");
        let rows_of = |role: &str| {
            let t: String = text
                .lines()
                .filter(|l| !l.starts_with('#'))
                .enumerate()
                .filter(|(i, l)| *i == 0 || l.ends_with(role))
                .map(|(_, l)| format!("{l}\n"))
                .collect();
            rows_from_csv(&t, "nccl_tests_gb200.csv").unwrap()
        };
        let gb200 = include_str!("../../topologies/gb200-nvl72.toml");
        let spec = TopologySpec::parse(gb200, "gb200-nvl72.toml").unwrap();
        let f = fit_params(&spec, &rows_of(",fit"), true).unwrap();
        assert_eq!((f.ring_rows, f.nvls_rows), (0, 3));
        let (e, c) = (f.sharp_efficiency.unwrap(), f.nvls_copy_us.unwrap());
        assert!(
            (e - spec.nvlink.sharp_efficiency.unwrap()).abs() <= 5e-4,
            "{f:?}"
        );
        assert!(
            (c - spec.collectives.nvls_copy_us.unwrap()).abs() <= 5e-4,
            "{f:?}"
        );
        let t = Arc::new(spec.build(Some(36)).unwrap());
        let coll = CollectiveModel::of(&t, true);
        let check = rows_of(",check");
        assert_eq!(check.len(), 8);
        for r in &check {
            let p = price(r, &t, &coll).unwrap();
            let err = r.time_us / p.model_us - 1.0;
            eprintln!(
                "{} GPUs {} B {}: {:+.1} %",
                r.gpus,
                r.bytes,
                p.algo,
                100.0 * err
            );
            let (algo, within) = if r.gpus == 72 {
                ("NVLS", 0.05)
            } else {
                ("ring", 0.15)
            };
            assert!(p.algo == algo && err.abs() < within, "{r:?}: {err}");
        }
        // the two-rack ring: each rank sends 1/72 of its bytes to the next rack
        let group: Vec<GpuId> = (0..144).collect();
        let lw = coll.lower_in(&[Proto::Simple], CollOp::AllReduce, &group, 1 << 30, 4);
        let moved = (2 * 143 * (1u64 << 30)).div_ceil(144);
        let across: Vec<u64> = lw
            .xfers
            .iter()
            .filter(|x| x.src / 72 != x.dst / 72)
            .map(|x| x.bytes)
            .collect();
        assert_eq!(across.len(), 144);
        assert!(
            across.iter().all(|&b| b == moved.div_ceil(72)),
            "{across:?}"
        );
    }

    const BENCH_AG: &str = "github.com/waynehacking8/nccl-collectives-bench/results/all_gather.txt";
    const BENCH_AG_QUIET: &str =
        "github.com/waynehacking8/nccl-collectives-bench/results/quiet/all_gather.txt";

    #[test]
    fn nccl_picks_its_algorithm_by_size_and_gpu_count() {
        let t = shipped("dgx-h200-roce.toml", DGX_ROCE, 16);
        let on = CollectiveModel::of(&t, true);
        let off = CollectiveModel::of(&t, false);
        let algo = |c: &CollectiveModel, op, g: &[GpuId], b| c.lower(op, g, b, 8).algo;
        let node = |n: u32| (0..n).collect::<Vec<GpuId>>();
        // NCCL's tuner on an H100/H200 node: the ring below 6 GPUs (`nvls_min_gpus`), NVLS
        // from 6, at 8 MiB too, where NVLS's loops make it slower than the ring's LL128:
        // the tuner does not see them; never when turned off, nor across nodes.
        for (n, want) in [
            (2, Algo::Ring),
            (4, Algo::Ring),
            (5, Algo::Ring),
            (6, Algo::Nvls),
            (8, Algo::Nvls),
        ] {
            for bytes in [8u64 << 20, 1 << 30] {
                assert_eq!(
                    algo(&on, CollOp::AllReduce, &node(n), bytes),
                    want,
                    "{n} GPUs, {bytes} B"
                );
            }
        }
        assert_eq!(algo(&off, CollOp::AllReduce, &node(8), 1 << 30), Algo::Ring);
        assert_eq!(
            algo(
                &on,
                CollOp::AllReduce,
                &(0..16).collect::<Vec<_>>(),
                1 << 30
            ),
            Algo::Ring
        );
        // All-gather and reduce-scatter run as rings on one node at every size.
        for op in [CollOp::AllGather, CollOp::ReduceScatter] {
            for bytes in [1u64 << 20, 8 << 20, 1 << 30] {
                assert_eq!(algo(&on, op, &node(8), bytes), Algo::Ring);
            }
        }
        // One GPU on each of 16 nodes: the tree's log-depth latency wins small all-reduces,
        // the ring's bandwidth large ones; PAT likewise for all-gather.
        let rail: Vec<GpuId> = (0..16).map(|k| 8 * k).collect();
        assert_eq!(algo(&on, CollOp::AllReduce, &rail, 1 << 20), Algo::Tree);
        assert_eq!(algo(&on, CollOp::AllReduce, &rail, 1 << 30), Algo::Ring);
        assert_eq!(algo(&on, CollOp::AllGather, &rail, 1 << 20), Algo::Pat);
        assert_eq!(algo(&on, CollOp::AllGather, &rail, 1 << 30), Algo::Ring);
        // Without a fabric: a ring with no latency of its own.
        let stub = CollectiveModel::default().lower(CollOp::AllReduce, &node(8), 8 << 20, 8);
        assert_eq!(
            (stub.algo, stub.latency, stub.xfers.len()),
            (Algo::Ring, 0, 8)
        );
        assert_eq!(stub.xfers[0].bytes, (14 * (8u64 << 20)).div_ceil(8));
    }

    #[test]
    fn bytes_and_steps_by_hand_on_2_4_and_8_gpus() {
        // One DGX H200 node: NVLink 450 GB/s × 0.833, α 7.97 µs, NCCL's Simple latencies ×
        // 0.64, the last step's S/n read and written at 4.8 TB/s, and the pipeline's fill:
        // 1 GiB fills 2 MiB chunks on every GPU count, one 1 MiB slice on each of 24
        // channels, 24 MiB at 374.85 GB/s = 67.14 µs.
        let t = shipped("dgx-h200-roce.toml", DGX_ROCE, 1);
        let on = CollectiveModel::of(&t, true);
        let s = 1u64 << 30;
        let fill = (24u64 << 20) as f64 / 374.85e9 * 1e12;
        assert!((fill - 67.136e6).abs() < 1e3);
        let lat = |steps: f64, n: u32| {
            (0.64e6 * (8.4 + 3.4 * steps)).round()
                + (2.0 * (s / u64::from(n)) as f64 / 4.8e12 * 1e12).round()
                + fill
        };
        for (n, op, per, steps) in [
            // all-reduce: 2(n − 1)/n · S per rank, 2(n − 1) steps
            (2u32, CollOp::AllReduce, s, 2.0),
            (4, CollOp::AllReduce, 3 * s / 2, 6.0),
            // all-gather / reduce-scatter: (n − 1)/n · S, n − 1 steps
            (2, CollOp::AllGather, s / 2, 1.0),
            (4, CollOp::ReduceScatter, 3 * s / 4, 3.0),
            (8, CollOp::AllGather, 7 * s / 8, 7.0),
            (8, CollOp::ReduceScatter, 7 * s / 8, 7.0),
        ] {
            let g: Vec<GpuId> = (0..n).collect();
            let lw = on.lower(op, &g, s, 8);
            assert_eq!(
                (lw.algo, lw.proto),
                (Algo::Ring, Proto::Simple),
                "{op:?} on {n}"
            );
            assert_eq!(lw.xfers.len(), n as usize);
            assert!(lw.xfers.iter().all(|x| x.bytes == per), "{op:?} on {n}");
            assert!(
                (lw.latency as f64 - lat(steps, n)).abs() <= 1.0,
                "{op:?} on {n}"
            );
            // each rank to the next, one link each way per GPU
            assert!(lw.xfers.iter().all(|x| x.dst == (x.src + 1) % n));
        }
        // NVLS all-reduce on 8: S(1 + 1/8) per GPU port, stretched by 0.833 / 0.709 so
        // that NVLink carries it at NVLS's rate; NVLS's latency (23 µs × 0.64), then its
        // loops: 1 GiB runs 128 KiB chunks on 16 channels × 8 ranks, loops of 16 MiB, 64 of
        // them; two loops fill and drain (2 · 16 MiB of the 1 GiB at NVLS's rate) and each
        // of the 64 + 2 loops copies 8 chunks at 0.225 µs.
        let lw = on.lower(CollOp::AllReduce, &(0..8).collect::<Vec<_>>(), s, 8);
        let ppm = (0.833f64 / 0.709 * 1e6).round();
        let want = (s as f64 * 9.0 / 8.0 * ppm * 1e-6).round() as u64;
        let fill = (want as f64 / 374.85e9 * (2.0 * 16.0 / 1024.0) * 1e12).round();
        let copies = 66.0 * 8.0 * 0.225e6;
        assert_eq!(lw.algo, Algo::Nvls);
        assert!(
            (lw.latency as f64 - ((0.64e6f64 * 23.0).round() + fill + copies)).abs() <= 1.0,
            "{}",
            lw.latency
        );
        assert!(lw.xfers.iter().all(|x| x.bytes == want));
    }

    #[test]
    fn a_measured_fit_prices_its_algorithm() {
        // ring measured at 30 µs + port bytes / 300 GB/s: a 4-GPU reduce-scatter of 4 GiB
        // moves 3 GiB through each port, 30 µs + 3 GiB / 300 GB/s, in topo and the engine.
        let text = format!(
            "{DGX_ROCE}\n[[collectives.fit]]\nalgo = \"ring\"\nlatency_us = 30.0\nbandwidth_gbyte_s = 300.0\n"
        );
        let t = shipped("fit.toml", &text, 1);
        let coll = CollectiveModel::of(&t, true);
        let g: Vec<GpuId> = (0..4).collect();
        let lw = coll.lower(CollOp::ReduceScatter, &g, 4 << 30, 8);
        let mut a = AnalyticalModel::new(t.clone());
        let got = lowered_time(&mut a, &lw, 0) as f64;
        let want = 30e6 + (3u64 << 30) as f64 / 300e9 * 1e12;
        assert!((got - want).abs() <= 10.0, "{got} ps vs {want}");
        // NVLS has no fit here: still NCCL's table and the topology's NVLS efficiency.
        let base = CollectiveModel::of(&shipped("dgx-h200-roce.toml", DGX_ROCE, 1), true);
        let all: Vec<GpuId> = (0..8).collect();
        assert_eq!(
            coll.lower(CollOp::AllReduce, &all, 1 << 30, 8),
            base.lower(CollOp::AllReduce, &all, 1 << 30, 8)
        );
        // An NVLS fit is the whole NVLS price: its line on the port bytes (as `calibrate
        // --collectives` counts them), without the loops.
        let text = format!(
            "{DGX_ROCE}\n[[collectives.fit]]\nalgo = \"NVLS\"\nlatency_us = 40.0\nbandwidth_gbyte_s = 300.0\n"
        );
        let nv = CollectiveModel::of(&shipped("fit.toml", &text, 1), true);
        for bytes in [8u64 << 20, 1 << 30] {
            let lw = nv.lower(CollOp::AllReduce, &all, bytes, 8);
            let got = lowered_time(&mut a, &lw, 0) as f64;
            let unfitted = base.lower(CollOp::AllReduce, &all, bytes, 8);
            let port = unfitted.xfers.iter().map(|x| x.bytes).max().unwrap_or(0);
            let want = 40e6 + port as f64 / 300e9 * 1e12;
            assert_eq!(lw.algo, Algo::Nvls);
            assert!((got - want).abs() <= 10.0, "{got} ps vs {want}");
        }
    }

    #[test]
    fn each_protocol_pays_its_latency_per_step_and_runs_at_its_bandwidth() {
        // NCCL's ring latency per protocol (base + per NVLink step) × the fitted 0.64, at
        // every GPU count, + the last step's S/n read and written at 4.8 TB/s + the
        // pipeline's fill, one slice per channel (24) at the protocol's rate on the link
        // (`rate`, bytes/s); network steps cost 14 µs.
        let t = shipped("dgx-h200-roce.toml", DGX_ROCE, 2);
        let off = CollectiveModel::of(&t, false);
        let last = |n: u32, bytes: u64| {
            (2.0 * bytes.div_ceil(u64::from(n)) as f64 / 4.8e12 * 1e12).round()
        };
        let slice = |p: Proto, n: u32, bytes: u64| {
            let k = p as usize;
            let chunk = bytes.div_ceil(24 * u64::from(n)).min(RING_CHUNK[k]);
            (24 * chunk.div_ceil(RING_SLICES_PER_CHUNK[k])) as f64
        };
        let lat = |p: Proto, steps: f64, n: u32, bytes: u64, rate: f64| {
            let k = p as usize;
            (0.64e6 * (RING_BASE_US[k] + RING_STEP_NVLINK_US[k] * steps)).round()
                + last(n, bytes)
                + slice(p, n, bytes) / rate * 1e12
        };
        let near = |got: Ps, want: f64| (got as f64 - want).abs() <= 2.0;
        let nvlink = 374.85e9;
        for n in [2u32, 4, 8] {
            let g: Vec<GpuId> = (0..n).collect();
            let steps = f64::from(n - 1);
            // 64 MiB: Simple; 16 KiB: LL, whose bytes are stretched to its 87.7 GB/s cap
            // (below 1/3 and 1/4 of the links' 374.85) on the same links
            let big = 64u64 << 20;
            let rs = off.lower(CollOp::ReduceScatter, &g, big, 8);
            let ar = off.lower(CollOp::AllReduce, &g, big, 8);
            assert_eq!((rs.proto, ar.proto), (Proto::Simple, Proto::Simple));
            assert!(near(rs.latency, lat(Proto::Simple, steps, n, big, nvlink)));
            assert!(near(
                ar.latency,
                lat(Proto::Simple, 2.0 * steps, n, big, nvlink)
            ));
            let b = 16u64 << 10;
            let per = (steps as u64 * b).div_ceil(u64::from(n));
            let capped = |per: u64| (per as f64 * 374.85 / 87.7).round() as u64;
            let ag = off.lower(CollOp::AllGather, &g, b, 8);
            assert_eq!(ag.proto, Proto::Ll, "{n} GPUs");
            assert!(
                near(ag.latency, lat(Proto::Ll, steps, n, b, 87.7e9)),
                "{n} GPUs"
            );
            assert!(ag.xfers[0].bytes.abs_diff(capped(per)) <= 1, "{n} GPUs");
            let ar = off.lower(CollOp::AllReduce, &g, b, 8);
            assert_eq!(ar.proto, Proto::Ll);
            assert!(ar.xfers[0].bytes.abs_diff(capped(2 * per)) <= 1);
        }
        // 8 MiB over 8 GPUs: 14 all-reduce steps make LL128's 1.9 µs per step beat Simple's
        // 3.4 for 8 % less bandwidth (and LL's 87.7 GB/s cap loses).
        let g: Vec<GpuId> = (0..8).collect();
        let ar = off.lower(CollOp::AllReduce, &g, 8 << 20, 8);
        assert_eq!(ar.proto, Proto::Ll128);
        let ll128 = 0.92 * nvlink;
        assert!(near(ar.latency, lat(Proto::Ll128, 14.0, 8, 8 << 20, ll128)));
        // Across two nodes: 2 network steps per direction.
        let two_nodes: Vec<GpuId> = (0..16).collect();
        let ar = off.lower(CollOp::AllReduce, &two_nodes, 1 << 30, 8);
        assert_eq!(ar.proto, Proto::Simple);
        // the fill, 24 MiB, crosses the busiest link: the NIC, 1/8 of each rank's bytes
        // at 48.5 GB/s against 7/8 at 374.85
        let nic = 400e9 / 8.0 * 0.97;
        let want = (0.64e6_f64 * (8.4 + 3.4 * 28.0 + 14.0 * 2.0)).round()
            + last(16, 1 << 30)
            + slice(Proto::Simple, 16, 1 << 30) / 8.0 / nic * 1e12;
        assert!(
            (ar.latency as f64 - want).abs() <= 1e3,
            "{} vs {want}",
            ar.latency
        );
    }

    #[test]
    fn engine_prices_a_collective_as_topo_does() {
        use crate::engine::{run, GraphBuilder, OpClass, OpKind, OpLabel, StreamKind, Xfer};
        let t = shipped("dgx-h200-roce.toml", DGX_ROCE, 2);
        let coll = CollectiveModel::of(&t, true);
        let mut rng = stream(7, "engine-vs-topo", 0);
        for case in 0..12 {
            let n = [2u32, 4, 8, 16][case % 4];
            let op = [CollOp::AllReduce, CollOp::AllGather, CollOp::ReduceScatter][case % 3];
            let bytes = rng.random_range(1u64 << 20..1 << 32);
            let group: Vec<GpuId> = (0..n).collect();
            let lw = coll.lower(op, &group, bytes, 8);
            let mut b = GraphBuilder::with_capacity(n as usize);
            let xf: Vec<Xfer> = lw
                .xfers
                .iter()
                .map(|x| Xfer {
                    src: x.src,
                    dst: x.dst,
                    bytes: x.bytes,
                })
                .collect();
            let c = b.add_collective_with_latency(&xf, lw.latency);
            let label = OpLabel {
                class: OpClass::DpAllReduce,
                mb: 0,
                layer: 0,
            };
            for &g in &group {
                let s = b.add_stream(g, StreamKind::DpComm);
                b.add_op(s, OpKind::Coll(c), label, &[]);
            }
            let graph = b.build().unwrap();
            let engine = |net: &mut dyn NetworkModel| run(&graph, net).unwrap().makespan;
            let mut a = AnalyticalModel::new(t.clone());
            let mut f = FlowModel::new(t.clone());
            let mut a2 = AnalyticalModel::new(t.clone());
            let topo = lowered_time(&mut a2, &lw, 0);
            assert_eq!(engine(&mut a), topo, "case {case}");
            // uncontended: the flow model gives the same, to within rounding
            let tf = engine(&mut f);
            assert!(
                tf.abs_diff(topo) * 1000 <= topo,
                "case {case}: {tf} vs {topo}"
            );
        }
    }

    #[test]
    fn one_nic_between_nodes_runs_at_its_achieved_rate() {
        // One 400 Gb/s NIC between nodes: 48–49 GB/s for a large message.
        let t = shipped("dgx-h200-roce.toml", DGX_ROCE, 2);
        let mut a2 = AnalyticalModel::new(t.clone());
        let p = vec![vec![Transfer {
            src: 0,
            dst: 8,
            bytes: 1 << 30,
        }]];
        let secs = run_phases(&mut a2, 0, &p, 0) as f64 * 1e-12;
        let gbs = (1u64 << 30) as f64 / secs / 1e9;
        assert!((48.0..=49.0).contains(&gbs), "NIC {gbs} GB/s");
    }

    #[test]
    fn flow_agrees_with_analytical_when_uncontended() {
        // Random sizes and placements: single transfers, rings inside a node, rail-aligned
        // rings under one leaf, all-to-all inside a node.
        let t = shipped("dgx-h200-roce.toml", DGX_ROCE, 8);
        let mut rng = stream(1, "differential", 0);
        for case in 0..60 {
            let bytes = rng.random_range(1u64..(1 << 30));
            let phases = match case % 4 {
                0 => {
                    let src = rng.random_range(0..t.gpus());
                    let dst = rng.random_range(0..t.gpus());
                    vec![vec![Transfer { src, dst, bytes }]]
                }
                1 => {
                    let node = rng.random_range(0..8u32);
                    let n = rng.random_range(2..=8usize);
                    let mut g: Vec<GpuId> = (0..8).map(|l| node * 8 + l).collect();
                    for i in (1..8).rev() {
                        g.swap(i, rng.random_range(0..=i));
                    }
                    g.truncate(n);
                    let op = [Collective::AllGather, Collective::AllReduce][case % 3 % 2];
                    lower(op, &g, bytes).unwrap()
                }
                2 => {
                    // Same rail of several nodes: all under one rail leaf, no spine.
                    let rail = rng.random_range(0..8u32);
                    let n = rng.random_range(2..=8u32);
                    let g: Vec<GpuId> = (0..n).map(|node| node * 8 + rail).collect();
                    lower(Collective::ReduceScatter, &g, bytes).unwrap()
                }
                _ => {
                    let node = rng.random_range(0..8u32);
                    let g: Vec<GpuId> = (0..8).map(|l| node * 8 + l).collect();
                    lower(Collective::AllToAll, &g, bytes).unwrap()
                }
            };
            let (tf, ta, tc) = both(&t, &phases);
            if case % 4 != 3 {
                // No two transfers of a phase share a link: per-transfer alpha–beta holds.
                let rel = (tf as f64 - ta as f64).abs() / ta.max(1) as f64;
                assert!(rel <= 0.01, "case {case}: flow {tf} vs analytical {ta}");
            }
            let rel = (tf as f64 - tc as f64).abs() / tc.max(1) as f64;
            assert!(rel <= 0.01, "case {case}: flow {tf} vs closed form {tc}");
        }
    }

    /// 4 nodes × 1 GPU, 1 NIC of 100 Gb/s (12.5 GB/s) each, 2 nodes per leaf, 1 spine,
    /// oversubscription 4: each leaf's single uplink is 2 × 12.5 / 4 = 6.25 GB/s.
    const OVERSUB: &str = r#"
name = "oversub"
nodes = 4
gpus_per_node = 1
[nvlink]
bandwidth_gbyte_s = 100.0
efficiency = 1.0
latency_us = 0.0
[nic]
per_node = 1
bandwidth_gbit_s = 100.0
efficiency = 1.0
latency_us = 2.0
pcie_gbyte_s = 64.0
[fabric]
hosts_per_leaf = 2
spines = 1
oversubscription = 4.0
hop_latency_us = 0.0
rail_optimized = true
"#;

    #[test]
    fn two_alltoalls_on_an_oversubscribed_spine_slow_each_other_as_max_min_says() {
        let t = shipped("oversub.toml", OVERSUB, 4);
        // X = {gpu0 (leaf 0), gpu2 (leaf 1)}, Y = {gpu1 (leaf 0), gpu3 (leaf 1)}.
        // X sends 2 × 4 MB (size 8 MB over 2 ranks), Y 2 × 2 MB.
        let x = lower(Collective::AllToAll, &[0, 2], 8_000_000).unwrap();
        let y = lower(Collective::AllToAll, &[1, 3], 4_000_000).unwrap();
        // Alone, X's flows (one each way) each own a 6.25 GB/s spine uplink/downlink:
        // 4 MB / 6.25 GB/s = 640 µs, + 2 µs latency.
        let alone = |p: &Phases| {
            let mut f = FlowModel::new(t.clone());
            run_phases(&mut f, 0, p, 0)
        };
        assert_eq!(alone(&x), 642_000_000);
        assert_eq!(alone(&y), 322_000_000);
        // Together: leaf0→spine carries X's 0→2 and Y's 1→3 (3.125 GB/s each), likewise
        // the other direction. Y's 2 MB drain at 2e6 / 3.125e9 = 640 µs; X has 2 MB left
        // and then runs alone at 6.25 GB/s: 320 µs more. X ends at 960 µs + 2 µs, Y at
        // 640 µs + 2 µs.
        let mut f = FlowModel::new(t.clone());
        for (k, tr) in x[0].iter().chain(y[0].iter()).enumerate() {
            f.start(0, tr.src, tr.dst, tr.bytes, k as u64);
        }
        let mut done = Vec::new();
        let mut fin = HashMap::new();
        while let Some(now) = f.next_completion() {
            f.advance(now, &mut done);
            for tag in done.drain(..) {
                fin.insert(tag, now);
            }
        }
        assert_eq!(fin[&0], 962_000_000);
        assert_eq!(fin[&1], 962_000_000);
        assert_eq!(fin[&2], 642_000_000);
        assert_eq!(fin[&3], 642_000_000);
        // The analytical model ignores the other collective: it predicts X alone.
        let a = AnalyticalModel::new(t.clone());
        assert_eq!(analytical_phases(&a, &x, 0), 642_000_000);
    }
}
