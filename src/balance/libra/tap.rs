//! TAP (Libra §5): SH-tiles, their FLOPs (Eq. 8) and their communication-aware placement
//! on a pool's workers (Algorithm 2, Eq. 9).
//!
//! Owns the tiling of one pool's packed sequences and the placement of its tiles. It may
//! not price work itself (every FLOP and byte comes from [`crate::cost::AttnShape`] through
//! `plan::kv_group_bytes`), build transfers (that is `exchange`) or model time (the engine).
//!
//! # Data layout before attention
//! A pool holds P packed sequences, sequence p on DP replica p whose CP group is pool
//! workers p·CP … p·CP+CP−1 (W = P·CP workers in all). A sequence's tokens are cut into
//! CP contiguous ranks of ⌈L/CP⌉ positions; a sequence chunk of B tokens (an SH-tile's
//! query range) lives, Q, K and V of every head, on the rank holding its first token, its
//! *Q-home*. When B divides L/CP this is exactly the contiguous CP layout; otherwise a
//! chunk crossing a rank boundary is kept whole on its first rank.
//!
//! # SH-tiles (Eq. 6–8)
//! Chunk b of a sequence covers positions [bB, min((b+1)B, tokens)) — across sample
//! boundaries, the last one short, padding never tiled — and tile (b, h) covers it over
//! head shard h (h_q/H query heads). It references KV group (j, h) for every sample j it
//! intersects (Eq. 7), and costs f = (h_q/H) Σ_j Σ_{q=a}^{e−1} (q+1) pair·heads (Eq. 8;
//! `AttnShape::fwd_flops` turns pair·heads into FLOPs).
//!
//! # Placement (Algorithm 2)
//! C = (1+τ) ΣF / |W|; tiles in (f descending, id) order; among workers r with
//! load_r + f ≤ C the least (Δcomm(t, r), load_r, r), otherwise the least
//! (load_r, Δcomm(t, r), r); then r's load grows by f and r commits to K(t). Δcomm is
//! Eq. 9 with the bytes the exchange will really move: a KV group costs the bytes of its
//! tokens not resident on r (zero once committed to r), Q and output cost their bytes
//! when r is not the Q-home.

use crate::cost::AttnShape;
use crate::plan::kv_group_bytes;
use crate::workload::PackedSeq;

/// One sequence chunk (a row of SH-tiles: one tile per head shard).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqChunk {
    /// Pool-local sequence index.
    pub seq: u32,
    /// First position.
    pub q_start: u64,
    /// One past the last position.
    pub q_end: u64,
    /// Exact pairs per query head under the shape's mask (Eq. 8 without h_q/H).
    pub pairs: u64,
    /// Pool-local worker holding the chunk (Q-home of its tiles).
    pub q_home: u32,
    /// Pool samples it intersects: `tiling.samples[first .. first + count]`.
    pub first_sample: u32,
    /// How many.
    pub sample_count: u32,
}

/// A sample of the pool, with where its tokens live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSample {
    /// Pool-local sequence index.
    pub seq: u32,
    /// Sample index inside the sequence.
    pub index: u32,
    /// First position in the sequence.
    pub start: u64,
    /// Tokens.
    pub len: u32,
    /// `tiling.resident[first .. first + count]`: (pool-local worker, tokens held there).
    pub first_resident: u32,
    /// How many.
    pub resident_count: u32,
}

/// The SH-tiles of one pool. Tile id t = chunk · H + shard.
#[derive(Clone, Debug)]
pub struct Tiling {
    /// Workers in the pool, W = P·CP.
    pub workers: u32,
    /// Head shards H.
    pub head_shards: u32,
    /// Query heads per shard, h_q / H.
    pub heads_per_shard: u32,
    /// Sequence chunks in (sequence, position) order.
    pub chunks: Vec<SeqChunk>,
    /// Samples of all sequences, sequence-major.
    pub samples: Vec<PoolSample>,
    /// Resident pieces of samples: (pool-local worker, tokens).
    pub resident: Vec<(u32, u32)>,
    /// Per sequence: the layout as (first position, one past the last, pool-local worker).
    pub layouts: Vec<Vec<(u64, u64, u32)>>,
    /// KV bytes per token of a group, per shard (GQA: the KV heads the shard maps to).
    pub kv_bytes_per_token: Vec<u64>,
    /// Q (= output) bytes per token of a tile.
    pub q_bytes_per_token: u64,
}

impl Tiling {
    /// Number of tiles (chunks × H).
    pub fn len(&self) -> usize {
        self.chunks.len() * self.head_shards as usize
    }

    /// True when there are no tiles.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Tile `t`'s chunk and shard.
    pub fn tile(&self, t: usize) -> (&SeqChunk, u32) {
        let h = self.head_shards as usize;
        (&self.chunks[t / h], (t % h) as u32)
    }

    /// Tile `t`'s cost in pair·heads (Eq. 8).
    pub fn tile_cost(&self, t: usize) -> u64 {
        self.tile(t).0.pairs * u64::from(self.heads_per_shard)
    }

    /// The samples a chunk intersects.
    pub fn chunk_samples(&self, c: &SeqChunk) -> &[PoolSample] {
        let a = c.first_sample as usize;
        &self.samples[a..a + c.sample_count as usize]
    }

    /// Tokens of pool sample `s` resident on pool-local worker `r`.
    pub fn resident_tokens(&self, s: &PoolSample, r: u32) -> u64 {
        let a = s.first_resident as usize;
        self.resident[a..a + s.resident_count as usize]
            .iter()
            .filter(|p| p.0 == r)
            .map(|p| u64::from(p.1))
            .sum()
    }

    /// Index of a pool sample (dense KV-group ids are sample · H + shard).
    fn sample_id(&self, c: &SeqChunk, k: usize) -> usize {
        c.first_sample as usize + k
    }
}

/// Cut a pool's sequences into SH-tiles. `cp` is the CP degree; sequences are the pool's
/// P sequences in DP-replica order. Parameters are assumed validated
/// (`LibraParams::validate`): B ≥ 1, H ≥ 1 dividing h_q, CP ≥ 1.
pub fn tile(
    seqs: &[&PackedSeq],
    cp: u32,
    tile_tokens: u32,
    head_shards: u32,
    shape: &AttnShape,
) -> Tiling {
    let b = u64::from(tile_tokens.max(1));
    let cp = cp.max(1);
    let h = head_shards.max(1);
    let mut t = Tiling {
        workers: seqs.len() as u32 * cp,
        head_shards: h,
        heads_per_shard: shape.heads_q / h,
        chunks: Vec::new(),
        samples: Vec::new(),
        resident: Vec::new(),
        layouts: Vec::with_capacity(seqs.len()),
        kv_bytes_per_token: (0..h).map(|s| kv_group_bytes(shape, h, s, 1)).collect(),
        q_bytes_per_token: shape.q_bytes(1, shape.heads_q / h),
    };
    for (p, seq) in seqs.iter().enumerate() {
        let p = p as u32;
        let tokens = seq.tokens();
        let per_rank = u64::from(seq.capacity).div_ceil(u64::from(cp)).max(1);
        // layout: chunk b on the rank of its first token
        let mut layout: Vec<(u64, u64, u32)> = Vec::new();
        let mut start = 0u64;
        while start < tokens {
            let end = (start + b).min(tokens);
            let rank = (start / per_rank).min(u64::from(cp) - 1) as u32;
            let wk = p * cp + rank;
            match layout.last_mut() {
                Some(last) if last.2 == wk => last.1 = end,
                _ => layout.push((start, end, wk)),
            }
            start = end;
        }
        // samples and their resident pieces
        let first_sample_of_seq = t.samples.len();
        let mut pos = 0u64;
        let mut li = 0usize;
        for (j, s) in seq.samples.iter().enumerate() {
            let (s0, s1) = (pos, pos + u64::from(s.len));
            let first_resident = t.resident.len() as u32;
            while li < layout.len() && layout[li].1 <= s0 {
                li += 1;
            }
            let mut k = li;
            while k < layout.len() && layout[k].0 < s1 {
                let (a, e, wk) = layout[k];
                t.resident.push((wk, (e.min(s1) - a.max(s0)) as u32));
                k += 1;
            }
            t.samples.push(PoolSample {
                seq: p,
                index: j as u32,
                start: s0,
                len: s.len,
                first_resident,
                resident_count: t.resident.len() as u32 - first_resident,
            });
            pos = s1;
        }
        // chunks
        let mut j = first_sample_of_seq;
        let end_sample = t.samples.len();
        let mut start = 0u64;
        while start < tokens {
            let end = (start + b).min(tokens);
            while j < end_sample && t.samples[j].start + u64::from(t.samples[j].len) <= start {
                j += 1;
            }
            let mut k = j;
            let mut pairs = 0u64;
            let mut first = None;
            while k < end_sample && t.samples[k].start < end {
                let s = &t.samples[k];
                let (s0, s1) = (s.start, s.start + u64::from(s.len));
                if s1 > s0 {
                    first.get_or_insert(k);
                    pairs += shape.mask.range_pairs(start.max(s0) - s0, end.min(s1) - s0);
                }
                k += 1;
            }
            let first = first.unwrap_or(j);
            // empty samples inside the chunk are not referenced: trim them from the end
            let mut last = k;
            while last > first && t.samples[last - 1].len == 0 {
                last -= 1;
            }
            let rank = (start / per_rank).min(u64::from(cp) - 1) as u32;
            t.chunks.push(SeqChunk {
                seq: p,
                q_start: start,
                q_end: end,
                pairs,
                q_home: p * cp + rank,
                first_sample: first as u32,
                sample_count: (last - first) as u32,
            });
            start = end;
        }
        t.layouts.push(layout);
    }
    t
}

/// Where Algorithm 2 put each tile.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Pool-local worker of each tile, by tile id.
    pub worker: Vec<u32>,
    /// Pair·heads placed on each worker.
    pub load: Vec<u64>,
    /// The soft cap C (pair·heads).
    pub cap: f64,
    /// Σ Δcomm of the choices made (bytes): what the exchange will move.
    pub comm: u64,
}

/// Which workers committed to which KV groups (dense ids sample · H + shard): per group,
/// a bitset over the workers.
struct Committed {
    words: usize,
    bits: Vec<u64>,
}

impl Committed {
    fn new(workers: usize, groups: usize) -> Committed {
        let words = workers.div_ceil(64);
        Committed {
            words,
            bits: vec![0; groups * words],
        }
    }

    fn has(&self, r: usize, g: usize) -> bool {
        self.bits[g * self.words + r / 64] >> (r % 64) & 1 == 1
    }

    fn set(&mut self, r: usize, g: usize) {
        self.bits[g * self.words + r / 64] |= 1 << (r % 64);
    }
}

/// Δcomm(t, r) of Eq. 9, in bytes, of tile `tile` for every worker r: `out[r]`. A KV
/// group not committed to r costs its tokens not resident on r, (len − resident)·bytes:
/// counted as len·bytes on every such worker, less the bytes of the resident pieces on
/// the few workers holding them.
fn delta_comms(t: &Tiling, committed: &Committed, tile: usize, out: &mut [u64]) {
    let (c, shard) = t.tile(tile);
    let h = t.head_shards as usize;
    let per_tok = t.kv_bytes_per_token[shard as usize];
    out.fill(2 * (c.q_end - c.q_start) * t.q_bytes_per_token);
    if let Some(home) = out.get_mut(c.q_home as usize) {
        *home = 0;
    }
    for (k, s) in t.chunk_samples(c).iter().enumerate() {
        let g = t.sample_id(c, k) * h + shard as usize;
        let whole = u64::from(s.len) * per_tok;
        for (r, d) in out.iter_mut().enumerate() {
            if !committed.has(r, g) {
                *d += whole;
            }
        }
        let a = s.first_resident as usize;
        for &(r, tokens) in &t.resident[a..a + s.resident_count as usize] {
            if !committed.has(r as usize, g) {
                out[r as usize] -= u64::from(tokens) * per_tok;
            }
        }
    }
}

/// Algorithm 2: place every tile of `t` on one of its W workers, with slack `tau` (≥ 0,
/// assumed validated).
pub fn place(t: &Tiling, tau: f64) -> Placement {
    let n = t.len();
    let w = t.workers as usize;
    let total: u64 = (0..n).map(|i| t.tile_cost(i)).sum();
    let cap = (1.0 + tau) * total as f64 / w.max(1) as f64;
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_unstable_by_key(|&i| (std::cmp::Reverse(t.tile_cost(i)), i));
    let h = t.head_shards as usize;
    let mut committed = Committed::new(w, t.samples.len() * h);
    let mut load = vec![0u64; w];
    let mut worker = vec![0u32; n];
    let mut comm = 0u64;
    let mut delta = vec![0u64; w];
    for &i in &order {
        let f = t.tile_cost(i);
        delta_comms(t, &committed, i, &mut delta);
        let mut best: Option<(u64, u64, u32)> = None;
        for r in 0..w as u32 {
            let l = load[r as usize];
            if (l + f) as f64 <= cap {
                let key = (delta[r as usize], l, r);
                if best.is_none_or(|b| key < b) {
                    best = Some(key);
                }
            }
        }
        let (d, r) = match best {
            Some((d, _, r)) => (d, r),
            None => {
                // no worker has room: the least loaded, ties by Δcomm then id
                let min = load.iter().copied().min().unwrap_or(0);
                let mut pick: Option<(u64, u32)> = None;
                for r in 0..w as u32 {
                    if load[r as usize] == min {
                        let key = (delta[r as usize], r);
                        if pick.is_none_or(|p| key < p) {
                            pick = Some(key);
                        }
                    }
                }
                pick.unwrap_or((0, 0))
            }
        };
        worker[i] = r;
        load[r as usize] += f;
        comm += d;
        let (c, shard) = t.tile(i);
        for k in 0..c.sample_count as usize {
            committed.set(r as usize, t.sample_id(c, k) * h + shard as usize);
        }
    }
    Placement {
        worker,
        load,
        cap,
        comm,
    }
}

/// Intra-pool imbalance of a placement: max worker load / mean worker load − 1 (0 for an
/// empty pool).
pub fn imbalance(p: &Placement) -> f64 {
    let total: u64 = p.load.iter().sum();
    if total == 0 || p.load.is_empty() {
        return 0.0;
    }
    let mean = total as f64 / p.load.len() as f64;
    p.load.iter().copied().max().unwrap_or(0) as f64 / mean - 1.0
}
