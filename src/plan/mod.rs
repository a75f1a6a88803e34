//! Plan IR: what one training step's core attention does, as data.
//!
//! Owns the [`Plan`] format (versioned serde JSON), its reader and writer, and the
//! [`check()`] verifier. A Plan covers one step: for each GA index and each pool (or CP
//! group, for schemes without pools) a [`Group`] lists its workers, its packed sequences
//! with the worker each token range lives on (its *layout*), the attention [`WorkUnit`]s
//! (sequence, sample segments, query range, head shard, KV groups referenced, causal
//! pairs and FLOPs, Q-home and executing worker) and the [`Transfer`]s (source,
//! destination, bytes, and what they carry: Q, a KV span — the sender's tokens of one or
//! more consecutive samples' KV groups, [`KvSpans`] — or an output).
//!
//! It may not touch files, the engine or any strategy: planners (balance/) build Plans,
//! the schedule, the engine and the GPU validator read them. Bytes and FLOPs in a Plan
//! are those of [`crate::cost::AttnShape`]; the checker recomputes them there.
//!
//! Units: positions are token indices inside a packed sequence (global positions);
//! segments and KV spans are sample-local token indices; `pairs` are exact causal
//! query–key pairs per query head (Libra Eq. 8 without the constant); bytes and FLOPs
//! are one attention layer's forward pass.

pub mod build;
pub mod check;

pub use check::{check, check_resident, CheckSummary, Violation, ViolationKind, MAX_GROUP_WORKERS};

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::cost::{AttnShape, Mask};
use crate::error::{human_bytes, invalid, parse_error, Result};

/// The Plan format version this build writes and reads.
///
/// Version 2 (this one) lets a KV payload be a *span*: the tokens its sender holds among
/// positions that may reach past its sample into the following ones ([`Payload::Kv`]), so
/// one transfer carries a sender's share of an all-gather of many samples. Version 1 plans
/// required a KV payload to be one contiguous range held entirely by its sender, inside
/// one sample; they are rejected (re-create them with this build).
pub const PLAN_VERSION: u32 = 2;

/// Bytes of a plan's JSON, at most, written or read: `skewsim plan`'s default plan is
/// 14 MB, one of 1,024 sequences on 64 × 16 GPUs 450 MB.
pub const MAX_JSON_BYTES: u64 = 1 << 30;

/// A GPU's global index (`dp_replica * CP + cp_rank` for the planners here).
pub type WorkerId = u32;

/// One step's attention plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Always [`PLAN_VERSION`] for plans this build writes.
    pub version: u32,
    /// The strategy that made it (`libra`, `ulysses`, ...).
    pub scheme: String,
    /// The training step (index of the global batch).
    pub step: u64,
    /// The attention layer's shape (heads, head dim, bytes per element).
    pub shape: AttnShape,
    /// H: the query heads are cut into this many equal head shards; a unit's `shard`
    /// indexes them. Shard h holds query heads [h·h_q/H, (h+1)·h_q/H).
    pub head_shards: u32,
    /// Per GA index and pool (or CP group), in (ga, pool) order.
    pub groups: Vec<Group>,
}

/// The work of one pool (or CP group) at one GA index.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Group {
    /// Gradient-accumulation index.
    pub ga: u32,
    /// Pool (or CP group) index inside the GA index.
    pub pool: u32,
    /// The workers that share this group's work.
    pub workers: Vec<WorkerId>,
    /// The packed sequences whose attention this group computes.
    pub sequences: Vec<PlanSeq>,
    /// Attention work units, by id.
    pub units: Vec<WorkUnit>,
    /// Data movement between the group's workers.
    pub transfers: Vec<Transfer>,
}

/// A packed sequence as the plan sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSeq {
    /// Index of the sequence in the step's global batch (unique in the plan).
    pub id: u32,
    /// Sample lengths in position order; samples lie end to end from position 0.
    pub samples: Vec<u32>,
    /// Sequence length L (tokens past the samples are padding, never computed).
    pub capacity: u32,
    /// Where each token's Q, K and V live before attention: ranges in position order
    /// that cover [0, tokens) exactly.
    pub layout: Vec<Resident>,
}

impl PlanSeq {
    /// Tokens holding samples.
    pub fn tokens(&self) -> u64 {
        self.samples.iter().map(|&l| u64::from(l)).sum()
    }

    /// Exact causal query–key pairs per query head: Σ ℓ(ℓ+1)/2.
    pub fn causal_pairs(&self) -> u64 {
        self.pairs(&Mask::Causal)
    }

    /// Exact query–key pairs per query head under `mask`: Σ over samples of its pairs.
    pub fn pairs(&self, mask: &Mask) -> u64 {
        self.samples.iter().map(|&l| mask.pairs(u64::from(l))).sum()
    }
}

/// Positions [start, end) of a sequence live on `worker`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resident {
    /// First position.
    pub start: u64,
    /// One past the last position.
    pub end: u64,
    /// The worker holding them.
    pub worker: WorkerId,
}

/// A unit of attention work: the queries [q_start, q_end) of one sequence, over one head
/// shard, attending causally inside their own samples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkUnit {
    /// Unique inside its group.
    pub id: u32,
    /// The sequence's `id`.
    pub seq: u32,
    /// First query position.
    pub q_start: u64,
    /// One past the last query position.
    pub q_end: u64,
    /// The head shard.
    pub shard: u32,
    /// The query range cut at sample boundaries, in position order.
    pub segments: Vec<Segment>,
    /// The KV groups the unit reads: one per sample it intersects (Libra Eq. 7).
    pub kv_groups: Vec<KvGroup>,
    /// Exact causal query–key pairs per query head (Eq. 8 without h_q/H and the constant).
    pub pairs: u64,
    /// Forward FLOPs: `shape.fwd_flops(pairs, h_q / H)`.
    pub flops: f64,
    /// The worker holding the unit's queries (the layout's owner of `q_start`), which
    /// provides Q and receives the output.
    pub q_home: WorkerId,
    /// The worker that computes it.
    pub worker: WorkerId,
}

/// The part of a unit's query range inside one sample: sample-local queries [start, end).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Segment {
    /// Sample index inside the sequence.
    pub sample: u32,
    /// First sample-local query.
    pub start: u32,
    /// One past the last sample-local query.
    pub end: u32,
}

/// KV group g = (sample j, head shard h) of one sequence: the whole K and V of the sample
/// over the KV heads the shard's query heads map to (GQA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvGroup {
    /// The sequence's `id`.
    pub seq: u32,
    /// Sample index inside the sequence.
    pub sample: u32,
    /// Head shard.
    pub shard: u32,
}

/// Bytes moving from `src` to `dst`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transfer {
    /// Sender.
    pub src: WorkerId,
    /// Receiver.
    pub dst: WorkerId,
    /// Bytes moved (priced by [`AttnShape`]).
    pub bytes: u64,
    /// What moves.
    pub carries: Payload,
}

/// What a transfer carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Payload {
    /// Queries [start, end) (global positions) of a unit, over its shard's query heads.
    Q {
        /// The unit's id.
        unit: u32,
        /// First position.
        start: u64,
        /// One past the last position.
        end: u64,
    },
    /// K and V, over the KV heads of `group.shard`, of the tokens the sender holds among
    /// positions [p0 + start, p0 + end) of sequence `group.seq`, p0 the first position of
    /// sample `group.sample` (a *span*, see [`KvSpans::pieces`]). The span may reach past
    /// the sample's end into the following samples, and skips tokens the sender does not
    /// hold; it starts and ends on tokens the sender holds. Each sample it touches is a KV
    /// group (same sequence and shard) that the receiver must read. A span inside one
    /// sample that the sender holds entirely is plain K and V of tokens [start, end).
    Kv {
        /// The group of the span's first sample.
        group: KvGroup,
        /// First token, local to `group.sample`.
        start: u32,
        /// One past the last token, local to `group.sample` (may exceed its length).
        end: u32,
    },
    /// The attention output of queries [start, end) of a unit, going back to their home.
    Output {
        /// The unit's id.
        unit: u32,
        /// First position.
        start: u64,
        /// One past the last position.
        end: u64,
    },
}

impl Plan {
    /// The Plan as pretty JSON (deterministic: fields in declaration order), refused past
    /// [`MAX_JSON_BYTES`], the most a plan file may hold to be read back, as soon as the
    /// text passes it.
    pub fn to_json(&self) -> Result<String> {
        self.json_within(MAX_JSON_BYTES)
    }

    /// [`Self::to_json`] under a limit of `limit` bytes.
    fn json_within(&self, limit: u64) -> Result<String> {
        /// A buffer that refuses to grow past its limit.
        struct Capped(Vec<u8>, u64);
        impl std::io::Write for Capped {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                if (self.0.len() + b.len()) as u64 > self.1 {
                    return Err(std::io::Error::other("past the limit"));
                }
                self.0.extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut out = Capped(Vec::new(), limit);
        match serde_json::to_writer_pretty(&mut out, self) {
            Ok(()) => String::from_utf8(out.0)
                .map_err(|e| parse_error("plan", format!("cannot serialise: {e}"))),
            Err(e) if e.is_io() => Err(invalid(
                "plan JSON",
                format!(
                    "past {} at {} units and {} transfers",
                    human_bytes(limit as f64),
                    self.groups.iter().map(|g| g.units.len()).sum::<usize>(),
                    self.groups.iter().map(|g| g.transfers.len()).sum::<usize>()
                ),
                format!(
                    "at most {}, the most check-plan and validate read: larger tiles or \
                     fewer sequences make fewer units",
                    human_bytes(limit as f64)
                ),
            )),
            Err(e) => Err(parse_error("plan", format!("cannot serialise: {e}"))),
        }
    }

    /// Read a Plan from JSON. `context` names the source (a file name) in errors. A plan of
    /// another format version is rejected before anything else is read.
    pub fn from_json(text: &str, context: &str) -> Result<Plan> {
        /// Only the version, so another format is rejected before its fields are read
        /// (and without building the whole document twice).
        #[derive(Deserialize)]
        struct Versioned {
            version: Option<serde_json::Value>,
        }
        let head: Versioned = serde_json::from_str(text)
            .map_err(|e| parse_error(context, format!("not a JSON plan object: {e}")))?;
        match head.version.as_ref() {
            Some(serde_json::Value::Number(n)) if n.as_u64() == Some(u64::from(PLAN_VERSION)) => {}
            Some(serde_json::Value::Number(n)) if n.as_u64() == Some(1) => {
                return Err(invalid(
                    format!("{context}: version"),
                    1,
                    format!(
                        "this build reads only plan format version {PLAN_VERSION}; version 1 \
                         (an older build's) has no KV spans — re-create the plan with this build"
                    ),
                ))
            }
            Some(v) => {
                return Err(invalid(
                    format!("{context}: version"),
                    v,
                    format!(
                        "{PLAN_VERSION}, the only plan format version this build reads \
                         (re-create the plan with this build)"
                    ),
                ))
            }
            None => {
                return Err(parse_error(
                    context,
                    format!("missing field `version` (expected {PLAN_VERSION})"),
                ))
            }
        }
        serde_json::from_str(text).map_err(|e| parse_error(context, format!("{e}")))
    }

    /// Query heads per head shard, h_q / H (0 if H is 0; the checker rejects that).
    pub fn heads_per_shard(&self) -> u32 {
        self.shape
            .heads_q
            .checked_div(self.head_shards)
            .unwrap_or(0)
    }
}

/// The KV heads the query heads [lo, hi) read under GQA (h_q / h_kv query heads per KV
/// head): [lo / g, ceil(hi / g)). Empty when the shape is degenerate.
pub fn kv_heads_of(shape: &AttnShape, lo: u32, hi: u32) -> (u32, u32) {
    let g = shape.heads_q.checked_div(shape.heads_kv).unwrap_or(0);
    if g == 0 || hi <= lo {
        return (0, 0);
    }
    (lo / g, hi.div_ceil(g))
}

/// Bytes of KV group `shard` over `tokens` tokens: K and V of the KV heads its query heads
/// map to.
pub fn kv_group_bytes(shape: &AttnShape, head_shards: u32, shard: u32, tokens: u64) -> u64 {
    let w = shape.heads_q.checked_div(head_shards).unwrap_or(0);
    let (lo, hi) = kv_heads_of(shape, shard * w, (shard + 1) * w);
    shape.kv_bytes(tokens, hi - lo)
}

/// Exact causal pairs of sample-local queries [a, e): Σ_{q=a}^{e−1} (q+1)
/// ([`Mask::range_pairs`] of the causal mask).
pub fn segment_pairs(a: u64, e: u64) -> u64 {
    Mask::Causal.range_pairs(a, e)
}

/// Sample start positions of one sequence, for cutting position ranges into segments in
/// O(log n + segments).
#[derive(Clone, Debug)]
pub struct SampleIndex {
    /// starts[j] = first position of sample j; starts[n] = tokens.
    starts: Vec<u64>,
}

impl SampleIndex {
    /// Index the samples of lengths `samples` (laid end to end from position 0).
    pub fn new(samples: &[u32]) -> SampleIndex {
        let mut starts = Vec::with_capacity(samples.len() + 1);
        let mut s = 0u64;
        starts.push(0);
        for &l in samples {
            s += u64::from(l);
            starts.push(s);
        }
        SampleIndex { starts }
    }

    /// Tokens holding samples.
    pub fn tokens(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    /// First position of sample `j` and one past its last.
    pub fn span(&self, j: usize) -> (u64, u64) {
        (self.starts[j], self.starts[j + 1])
    }

    /// The segments of positions [start, end): the intersection with each sample,
    /// sample-local, in position order (empty samples give none).
    pub fn segments(&self, start: u64, end: u64) -> Vec<Segment> {
        let mut out = Vec::new();
        let n = self.starts.len() - 1;
        // first sample whose end is past `start`
        let mut j = self.starts[1..].partition_point(|&e| e <= start);
        while j < n && self.starts[j] < end {
            let (s0, s1) = (self.starts[j], self.starts[j + 1]);
            if s1 > s0 {
                out.push(Segment {
                    sample: j as u32,
                    start: (start.max(s0) - s0) as u32,
                    end: (end.min(s1) - s0) as u32,
                });
            }
            j += 1;
        }
        out
    }
}

/// A group's sequences indexed for reading KV spans ([`Payload::Kv`]): sample starts and,
/// per worker, the layout ranges it holds.
#[derive(Clone, Debug)]
pub struct KvSpans<'a> {
    seqs: HashMap<u32, SpanSeq<'a>>,
}

#[derive(Clone, Debug)]
struct SpanSeq<'a> {
    seq: &'a PlanSeq,
    samples: SampleIndex,
    /// Per worker, the (start, end) positions it holds, in position order.
    held: HashMap<WorkerId, Vec<(u64, u64)>>,
}

impl<'a> KvSpans<'a> {
    /// Index `sequences` (a group's).
    pub fn new(sequences: &'a [PlanSeq]) -> KvSpans<'a> {
        let seqs = sequences
            .iter()
            .map(|seq| {
                let mut held: HashMap<WorkerId, Vec<(u64, u64)>> = HashMap::new();
                for r in &seq.layout {
                    held.entry(r.worker).or_default().push((r.start, r.end));
                }
                let view = SpanSeq {
                    seq,
                    samples: SampleIndex::new(&seq.samples),
                    held,
                };
                (seq.id, view)
            })
            .collect();
        KvSpans { seqs }
    }

    /// What a KV payload sent by `src` carries: the tokens `src` holds among the span's
    /// positions, cut at sample boundaries, as sample-local [`Segment`]s in position order.
    /// `Err` says why the payload is malformed: an unknown sequence or sample, an empty
    /// span, one past the sequence's tokens, or one that does not start and end on tokens
    /// `src` holds.
    pub fn pieces(
        &self,
        src: WorkerId,
        group: KvGroup,
        start: u32,
        end: u32,
    ) -> std::result::Result<Vec<Segment>, String> {
        let Some(sv) = self.seqs.get(&group.seq) else {
            return Err(format!("sequence {} is not in the group", group.seq));
        };
        let j = group.sample as usize;
        if j >= sv.seq.samples.len() {
            return Err(format!(
                "KV group (sample {}, shard {}) does not exist",
                group.sample, group.shard
            ));
        }
        let (p0, _) = sv.samples.span(j);
        let (a, e) = (p0 + u64::from(start), p0 + u64::from(end));
        if start >= end || e > sv.samples.tokens() {
            return Err(format!(
                "KV span [{start}, {end}) of sample {j} is empty or reaches past the \
                 sequence's {} tokens",
                sv.samples.tokens()
            ));
        }
        let held = sv.held.get(&src).map_or(&[][..], Vec::as_slice);
        let i = held.partition_point(|r| r.1 <= a);
        let inside: Vec<(u64, u64)> = held[i..]
            .iter()
            .take_while(|r| r.0 < e)
            .map(|r| (a.max(r.0), e.min(r.1)))
            .collect();
        let ends_held = matches!(
            (inside.first(), inside.last()),
            (Some(f), Some(l)) if f.0 == a && l.1 == e
        );
        if !ends_held {
            return Err(format!(
                "worker {src} does not hold the first and last KV tokens of span \
                 [{start}, {end}) of sample {j} (a span starts and ends on its sender's tokens)"
            ));
        }
        Ok(inside
            .into_iter()
            .flat_map(|(x, y)| sv.samples.segments(x, y))
            .collect())
    }

    /// Tokens a transfer carries: a Q or output range's length, or the tokens a KV span's
    /// sender holds in it (0 for a malformed span; the checker rejects those).
    pub fn tokens(&self, t: &Transfer) -> u64 {
        match t.carries {
            Payload::Q { start, end, .. } | Payload::Output { start, end, .. } => {
                end.saturating_sub(start)
            }
            Payload::Kv { group, start, end } => self
                .pieces(t.src, group, start, end)
                .map(|v| v.iter().map(|s| u64::from(s.end - s.start)).sum())
                .unwrap_or(0),
        }
    }
}

/// The segments of positions [start, end) of a sequence with sample lengths `samples`
/// (see [`SampleIndex::segments`]).
pub fn segments_of(samples: &[u32], start: u64, end: u64) -> Vec<Segment> {
    SampleIndex::new(samples).segments(start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_pairs_by_hand() {
        // queries 2,3,4 of a sample: 3 + 4 + 5 keys.
        assert_eq!(segment_pairs(2, 5), 12);
        assert_eq!(segment_pairs(0, 4), 10);
        assert_eq!(segment_pairs(3, 3), 0);
    }

    #[test]
    fn segments_cut_at_sample_boundaries() {
        // samples [0,3) [3,7) [7,8); positions [2, 8)
        let s = segments_of(&[3, 4, 1], 2, 8);
        assert_eq!(
            s,
            vec![
                Segment {
                    sample: 0,
                    start: 2,
                    end: 3
                },
                Segment {
                    sample: 1,
                    start: 0,
                    end: 4
                },
                Segment {
                    sample: 2,
                    start: 0,
                    end: 1
                },
            ]
        );
        assert!(segments_of(&[3, 0, 4], 3, 3).is_empty());
        assert_eq!(segments_of(&[3, 0, 4], 3, 4).len(), 1);
    }

    #[test]
    fn gqa_kv_heads() {
        let shape = AttnShape {
            heads_q: 32,
            heads_kv: 4,
            head_dim: 128,
            dtype_bytes: 2,
            mask: crate::cost::Mask::Causal,
        };
        // H = 4: 8 query heads per shard, one KV head each.
        assert_eq!(kv_heads_of(&shape, 8, 16), (1, 2));
        // H = 8: 4 query heads; shards 0 and 1 both need KV head 0.
        assert_eq!(kv_heads_of(&shape, 0, 4), (0, 1));
        assert_eq!(kv_heads_of(&shape, 4, 8), (0, 1));
        // H = 2: 16 query heads → 2 KV heads; 10 tokens × 2 (K,V) × 2 heads × 128 × 2 B.
        assert_eq!(kv_group_bytes(&shape, 2, 1, 10), 2 * 10 * 2 * 128 * 2);
    }

    /// A plan's JSON stops at the limit, naming its size, instead of writing a file that
    /// `check-plan` and `validate` would refuse to read.
    #[test]
    fn json_past_the_limit_is_refused() {
        let plan = Plan {
            version: PLAN_VERSION,
            scheme: "libra".into(),
            step: 0,
            shape: crate::balance::libra::LibraParams::default().shape,
            head_shards: 4,
            groups: Vec::new(),
        };
        let json = plan.to_json().unwrap();
        assert_eq!(Plan::from_json(&json, "p.json").unwrap(), plan);
        let n = json.len() as u64;
        assert_eq!(plan.json_within(n).unwrap(), json);
        let e = plan.json_within(n - 1).unwrap_err();
        assert!(
            matches!(&e, crate::Error::Invalid { field, value, .. }
                if field == "plan JSON" && value.ends_with("0 units and 0 transfers")),
            "{e:?}"
        );
    }

    #[test]
    fn reader_rejects_other_versions() {
        // version 1 (before KV spans): named, with the version this build reads
        let err = Plan::from_json(r#"{"version": 1, "scheme": "x"}"#, "p.json").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("p.json: version = 1"), "{msg}");
        assert!(
            msg.contains("reads only plan format version 2; version 1"),
            "{msg}"
        );
        let err = Plan::from_json(r#"{"version": 3, "scheme": "x"}"#, "p.json").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("p.json: version = 3"), "{msg}");
        assert!(msg.contains(": 2, the only plan format version"), "{msg}");
        let err = Plan::from_json(r#"{"scheme": "x"}"#, "p.json").unwrap_err();
        assert!(err.to_string().contains("missing field `version`"));
        assert!(Plan::from_json("not json", "p.json").is_err());
        // the current version gets past the version check to the fields
        let err = Plan::from_json(r#"{"version": 2, "scheme": "x"}"#, "p.json").unwrap_err();
        assert!(err.to_string().contains("missing field `step`"), "{err}");
    }
}
