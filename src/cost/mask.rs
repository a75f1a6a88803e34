//! Attention masks: which keys of its own document a query attends, as data.
//!
//! Owns the [`Mask`] of one attention layer and its exact counts: the query–key pairs a
//! range of sample-local queries keeps ([`Mask::range_pairs`], Libra Eq. 8 with the mask's
//! pairs instead of the causal ones), the keys a query range reaches ([`Mask::reach`]:
//! what a plan must move to the worker that computes it), the per-document load a mask
//! gives (Σ over queries of the keys they attend) and the model file's per-layer
//! [`AttentionPattern`]. Every mask is causal and stays inside its document; it only
//! drops keys:
//! - `causal`: query q attends keys [0, q] — q + 1 keys;
//! - `sliding:W`: the last W keys [q + 1 − W, q] (Mistral- and Gemma-style local layers) —
//!   min(q + 1, W) keys;
//! - `chunked:C`: the keys of its own chunk of C tokens, [C·⌊q/C⌋, q] (Llama-4-style
//!   chunked local layers) — q mod C + 1 keys;
//! - `block-sparse:B:local=K:global=G`: in blocks of B tokens, query block i attends its
//!   own block causally, the K − 1 blocks before it and the first G blocks of the
//!   document (a local + global block pattern) — q mod B + 1 + B·(earlier blocks) keys.
//!
//! Counts are closed forms of prefix sums (O(1) per range), so the causal count is
//! Σ ℓ(ℓ+1)/2 exactly.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{invalid, Result};

/// Which keys of its own document each query attends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Mask {
    /// Every earlier key and itself.
    #[default]
    Causal,
    /// The last `w` keys (itself included).
    Sliding {
        /// Window W ≥ 1.
        w: u32,
    },
    /// The earlier keys of its own chunk of `c` tokens.
    Chunked {
        /// Chunk C ≥ 1.
        c: u32,
    },
    /// Blocks of `block` tokens: its own block causally, `local` − 1 blocks before it and
    /// the first `global` blocks.
    BlockSparse {
        /// Block size B ≥ 1.
        block: u32,
        /// Diagonal band in blocks (≥ 1: the own block).
        local: u32,
        /// Leading blocks every query block attends.
        global: u32,
    },
}

/// What a mask string may be, for errors.
const MASK_FORMS: &str =
    "causal, sliding:W, chunked:C or block-sparse:B:local=K:global=G (W, C, B, K >= 1; G >= 0)";

impl Mask {
    /// True for the causal mask.
    pub fn is_causal(&self) -> bool {
        *self == Mask::Causal
    }

    /// Parse `causal`, `sliding:W`, `chunked:C` or `block-sparse:B:local=K:global=G`;
    /// `field` names it in errors.
    pub fn parse(text: &str, field: &str) -> Result<Mask> {
        let t = text.trim();
        let bad = |why: &str| {
            invalid(
                field,
                format!("\"{t}\""),
                format!("{why}; one of {MASK_FORMS}"),
            )
        };
        let num = |s: &str, what: &str, min: u32| -> Result<u32> {
            match s.trim().parse::<u32>() {
                Ok(v) if v >= min => Ok(v),
                _ => Err(bad(&format!("{what} must be an integer >= {min}"))),
            }
        };
        let parts: Vec<&str> = t.split(':').collect();
        match parts.as_slice() {
            ["causal"] => Ok(Mask::Causal),
            ["sliding", w] => Ok(Mask::Sliding {
                w: num(w, "the window W", 1)?,
            }),
            ["chunked", c] => Ok(Mask::Chunked {
                c: num(c, "the chunk C", 1)?,
            }),
            ["block-sparse", b, local, global] => {
                let block = num(b, "the block B", 1)?;
                let local = match local.strip_prefix("local=") {
                    Some(k) => num(k, "local", 1)?,
                    None => return Err(bad("the third part must be local=K")),
                };
                let global = match global.strip_prefix("global=") {
                    Some(g) => num(g, "global", 0)?,
                    None => return Err(bad("the fourth part must be global=G")),
                };
                Ok(Mask::BlockSparse {
                    block,
                    local,
                    global,
                })
            }
            _ => Err(bad("not a mask")),
        }
    }

    /// Check the mask against the sequence length `seq_len`: a chunk larger than L, or a
    /// block that does not tile L, is refused by `field`'s name.
    pub fn check_len(&self, seq_len: u32, field: &str) -> Result<()> {
        match *self {
            Mask::Chunked { c } if c > seq_len => Err(invalid(
                field,
                self,
                format!("a chunk C no larger than the sequence length L = {seq_len}"),
            )),
            Mask::BlockSparse { block, .. } if seq_len % block != 0 => Err(invalid(
                field,
                self,
                format!(
                    "a block B that divides the sequence length L = {seq_len} (blocks tile it)"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Pairs of the queries [0, n): Σ_{q<n} keys_of(q), in closed form.
    fn prefix(&self, n: u64) -> u64 {
        match *self {
            Mask::Causal => tri(n),
            Mask::Sliding { w } => {
                let w = u64::from(w);
                if n <= w {
                    tri(n)
                } else {
                    tri(w) + (n - w) * w
                }
            }
            Mask::Chunked { c } => chunked_prefix(n, u64::from(c)),
            Mask::BlockSparse {
                block,
                local,
                global,
            } => {
                let b = u64::from(block);
                let (m, r) = (n / b, n % b);
                let blocks =
                    b * earlier_prefix(m, local, global) + r * earlier_blocks(m, local, global);
                chunked_prefix(n, b) + b * blocks
            }
        }
    }

    /// Exact pairs of sample-local queries [a, e) (per query head): Eq. 8's count under
    /// the mask.
    pub fn range_pairs(&self, a: u64, e: u64) -> u64 {
        if e <= a {
            return 0;
        }
        self.prefix(e) - self.prefix(a)
    }

    /// Exact pairs of a whole document of `len` tokens.
    pub fn pairs(&self, len: u64) -> u64 {
        self.prefix(len)
    }

    /// The per-document load proxy of Libra Eq. 1 under the mask: 2·pairs(len) − len =
    /// Σ_q (2·keys(q) − 1) — exactly ℓ² under the causal mask, ≈ ℓ·(2W − 1) − W² for a
    /// sliding window W < ℓ.
    pub fn load(&self, len: u64) -> u64 {
        2 * self.pairs(len) - len
    }

    /// The lowest key query q reaches (sample-local); keys are monotone in q for every
    /// mask, so queries [a, e) reach keys within [key_start(a), e).
    pub fn key_start(&self, q: u64) -> u64 {
        match *self {
            Mask::Causal => 0,
            Mask::Sliding { w } => (q + 1).saturating_sub(u64::from(w)),
            Mask::Chunked { c } => q - q % u64::from(c),
            Mask::BlockSparse {
                block,
                local,
                global,
            } => {
                if global > 0 {
                    0
                } else {
                    let i = q / u64::from(block);
                    (i - i.min(u64::from(local) - 1)) * u64::from(block)
                }
            }
        }
    }

    /// The most keys any one query attends, whatever its position: `None` under the
    /// causal mask (unbounded), W, C, or B·(local + global).
    pub fn max_keys(&self) -> Option<u64> {
        match *self {
            Mask::Causal => None,
            Mask::Sliding { w } => Some(u64::from(w)),
            Mask::Chunked { c } => Some(u64::from(c)),
            Mask::BlockSparse {
                block,
                local,
                global,
            } => Some(u64::from(block) * (u64::from(local) + u64::from(global))),
        }
    }

    /// True when a query attends at least as many keys as any query before it (causal,
    /// sliding): then a range's pairs grow convexly with its queries, and a run of queries
    /// further into the document never costs less.
    pub fn keys_monotone(&self) -> bool {
        matches!(self, Mask::Causal | Mask::Sliding { .. })
    }

    /// The keys sample-local queries [a, e) reach: [key_start(a), e) — what a worker
    /// computing them must hold or receive.
    pub fn reach(&self, a: u64, e: u64) -> (u64, u64) {
        (self.key_start(a).min(e), e)
    }

    /// True when every pair this mask keeps the `wider` mask keeps too (a plan made for
    /// `wider` moves every key this mask needs).
    pub fn within(&self, wider: &Mask) -> bool {
        match (*self, *wider) {
            (a, b) if a == b => true,
            (_, Mask::Causal) => true,
            (Mask::Sliding { w: a }, Mask::Sliding { w: b }) => a <= b,
            (Mask::Chunked { c: a }, Mask::Chunked { c: b }) => b % a == 0,
            (Mask::Chunked { c }, Mask::Sliding { w }) => c <= w,
            _ => false,
        }
    }
}

/// n(n+1)/2.
fn tri(n: u64) -> u64 {
    n * (n + 1) / 2
}

/// Σ_{q<n} (q mod c + 1).
fn chunked_prefix(n: u64, c: u64) -> u64 {
    (n / c) * tri(c) + tri(n % c)
}

/// Key blocks before block i that block i attends: min(i, K−1) + min(G, max(0, i−K+1)).
fn earlier_blocks(i: u64, local: u32, global: u32) -> u64 {
    let k = u64::from(local) - 1;
    i.min(k) + u64::from(global).min(i.saturating_sub(k))
}

/// Σ_{t<n} min(t, k).
fn capped_prefix(n: u64, k: u64) -> u64 {
    if n <= k {
        n * n.saturating_sub(1) / 2
    } else {
        k * k.saturating_sub(1) / 2 + k * (n - k)
    }
}

/// Σ_{i<m} earlier_blocks(i).
fn earlier_prefix(m: u64, local: u32, global: u32) -> u64 {
    let k = u64::from(local) - 1;
    capped_prefix(m, k) + capped_prefix(m.saturating_sub(k), u64::from(global))
}

impl fmt::Display for Mask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Mask::Causal => write!(f, "causal"),
            Mask::Sliding { w } => write!(f, "sliding:{w}"),
            Mask::Chunked { c } => write!(f, "chunked:{c}"),
            Mask::BlockSparse {
                block,
                local,
                global,
            } => write!(f, "block-sparse:{block}:local={local}:global={global}"),
        }
    }
}

impl TryFrom<String> for Mask {
    type Error = crate::error::Error;
    fn try_from(s: String) -> Result<Mask> {
        Mask::parse(&s, "mask")
    }
}

impl From<Mask> for String {
    fn from(m: Mask) -> String {
        m.to_string()
    }
}

/// A model's per-layer attention: a pattern of masks that repeats over the layers, each
/// entry `MASK` or `N*MASK` (N consecutive layers), e.g.
/// `attention = ["3*sliding:4096", "causal"]` (three local layers, then a global one).
/// Empty (left out): every layer causal.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<String>", into = "Vec<String>")]
pub struct AttentionPattern {
    /// One mask per layer of the repeating unit (repeats expanded).
    masks: Vec<Mask>,
}

impl AttentionPattern {
    /// The pattern of the given masks, one per layer of the repeating unit.
    pub fn new(masks: Vec<Mask>) -> AttentionPattern {
        AttentionPattern { masks }
    }

    /// Parse the entries (`MASK` or `N*MASK`); `field` names them in errors.
    pub fn parse(entries: &[String], field: &str) -> Result<AttentionPattern> {
        let mut masks = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            let f = format!("{field}[{i}]");
            let (n, m) = match e.split_once('*') {
                Some((n, m)) => match n.trim().parse::<u32>() {
                    Ok(n) if (1..=4096).contains(&n) => (n, m),
                    _ => {
                        return Err(invalid(
                            f,
                            format!("\"{e}\""),
                            "N*MASK with a repeat N from 1 to 4096",
                        ))
                    }
                },
                None => (1, e.as_str()),
            };
            let mask = Mask::parse(m, &f)?;
            masks.extend(std::iter::repeat_n(mask, n as usize));
        }
        Ok(AttentionPattern { masks })
    }

    /// True when every layer is causal.
    pub fn all_causal(&self) -> bool {
        self.masks.iter().all(Mask::is_causal)
    }

    /// Check that the pattern tiles `layers` layers (its length divides them); `field`
    /// names it in errors.
    pub fn check_layers(&self, layers: u32, field: &str) -> Result<()> {
        let n = self.masks.len() as u32;
        if n > 0 && layers % n != 0 {
            return Err(invalid(
                field,
                format!("a pattern of {n} layers"),
                format!("a pattern whose length divides the model's {layers} layers (it repeats over them)"),
            ));
        }
        Ok(())
    }

    /// The mask of layer `layer`.
    pub fn mask_of(&self, layer: u32) -> Mask {
        if self.masks.is_empty() {
            Mask::Causal
        } else {
            self.masks[layer as usize % self.masks.len()]
        }
    }

    /// The index of layer `layer`'s mask in [`AttentionPattern::classes`] over `layers`.
    pub fn class_index(&self, layer: u32, layers: u32) -> usize {
        let m = self.mask_of(layer);
        self.classes(layers)
            .iter()
            .position(|c| c.0 == m)
            .unwrap_or(0)
    }

    /// The distinct masks over `layers` layers with how many layers use each, in order of
    /// first use.
    pub fn classes(&self, layers: u32) -> Vec<(Mask, u32)> {
        let mut out: Vec<(Mask, u32)> = Vec::new();
        for l in 0..layers {
            let m = self.mask_of(l);
            match out.iter_mut().find(|c| c.0 == m) {
                Some(c) => c.1 += 1,
                None => out.push((m, 1)),
            }
        }
        out
    }

    /// The mask a step's plan is made for: the one whose pairs contain every layer's (the
    /// widest class), or causal when no class contains the others.
    pub fn plan_mask(&self, layers: u32) -> Mask {
        let classes = self.classes(layers);
        classes
            .iter()
            .map(|c| c.0)
            .find(|w| classes.iter().all(|c| c.0.within(w)))
            .unwrap_or(Mask::Causal)
    }
}

impl TryFrom<Vec<String>> for AttentionPattern {
    type Error = crate::error::Error;
    fn try_from(v: Vec<String>) -> Result<AttentionPattern> {
        AttentionPattern::parse(&v, "attention")
    }
}

impl From<AttentionPattern> for Vec<String> {
    fn from(p: AttentionPattern) -> Vec<String> {
        p.masks.iter().map(Mask::to_string).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force: count the (q, k) pairs of a document of `len` tokens the mask keeps.
    fn brute(m: &Mask, a: u64, e: u64) -> u64 {
        (a..e)
            .map(|q| (0..=q).filter(|&k| keeps(m, q, k)).count() as u64)
            .sum()
    }

    fn keeps(m: &Mask, q: u64, k: u64) -> bool {
        match *m {
            Mask::Causal => k <= q,
            Mask::Sliding { w } => k <= q && q - k < u64::from(w),
            Mask::Chunked { c } => k <= q && k / u64::from(c) == q / u64::from(c),
            Mask::BlockSparse {
                block,
                local,
                global,
            } => {
                let (i, j) = (q / u64::from(block), k / u64::from(block));
                k <= q && (i - j < u64::from(local) || j < u64::from(global))
            }
        }
    }

    #[test]
    fn pairs_of_a_six_token_document_by_hand() {
        // keys per query q = 0..5
        // causal:            1 2 3 4 5 6 = 21
        // sliding:2:         1 2 2 2 2 2 = 11
        // chunked:4:         1 2 3 4 1 2 = 13
        // block-sparse:2:local=1:global=1 (own block + block 0):
        //                    1 2 1+2 2+2 1+2 2+2 = 1 2 3 4 3 4 = 17
        let m = |s: &str| Mask::parse(s, "t").unwrap();
        assert_eq!(m("causal").pairs(6), 21);
        assert_eq!(m("sliding:2").pairs(6), 11);
        assert_eq!(m("chunked:4").pairs(6), 13);
        assert_eq!(m("block-sparse:2:local=1:global=1").pairs(6), 17);
        // queries [2, 5) of the same document
        assert_eq!(m("causal").range_pairs(2, 5), 3 + 4 + 5);
        assert_eq!(m("sliding:2").range_pairs(2, 5), 6);
        assert_eq!(m("chunked:4").range_pairs(2, 5), 3 + 4 + 1);
        assert_eq!(
            m("block-sparse:2:local=1:global=1").range_pairs(2, 5),
            3 + 4 + 3
        );
        // a window as wide as the document is causal
        assert_eq!(m("sliding:6").pairs(6), 21);
    }

    #[test]
    fn closed_forms_match_brute_force() {
        let masks = [
            Mask::Causal,
            Mask::Sliding { w: 1 },
            Mask::Sliding { w: 5 },
            Mask::Chunked { c: 1 },
            Mask::Chunked { c: 7 },
            Mask::BlockSparse {
                block: 3,
                local: 1,
                global: 0,
            },
            Mask::BlockSparse {
                block: 3,
                local: 2,
                global: 1,
            },
            Mask::BlockSparse {
                block: 4,
                local: 3,
                global: 2,
            },
        ];
        for m in masks {
            for e in 0..40 {
                for a in 0..=e {
                    assert_eq!(m.range_pairs(a, e), brute(&m, a, e), "{m} [{a}, {e})");
                }
            }
            for q in 0..40 {
                let lo = (0..=q).find(|&k| keeps(&m, q, k)).unwrap();
                assert_eq!(m.key_start(q), lo, "{m} q {q}");
            }
        }
    }

    #[test]
    fn reach_of_a_window() {
        let s = Mask::Sliding { w: 4 };
        // queries [6, 9) reach keys [3, 9)
        assert_eq!(s.reach(6, 9), (3, 9));
        // near the document start the window is clipped at key 0
        assert_eq!(s.reach(1, 3), (0, 3));
        assert_eq!(Mask::Causal.reach(6, 9), (0, 9));
        assert_eq!(Mask::Chunked { c: 4 }.reach(6, 9), (4, 9));
    }

    #[test]
    fn bad_masks_are_named_errors() {
        let e = Mask::parse("sliding:0", "attention[1]").unwrap_err();
        assert!(
            e.to_string().contains("attention[1]") && e.to_string().contains("window W"),
            "{e}"
        );
        assert!(Mask::parse("sliding:-3", "a").is_err());
        assert!(Mask::parse("chunked:0", "a").is_err());
        assert!(Mask::parse("dilated:4", "a").is_err());
        assert!(Mask::parse("block-sparse:64:4:1", "a").is_err());
        let e = Mask::Chunked { c: 8192 }
            .check_len(4096, "attention")
            .unwrap_err();
        assert!(
            e.to_string().contains("chunked:8192") && e.to_string().contains("4096"),
            "{e}"
        );
        assert!(Mask::Chunked { c: 4096 }.check_len(4096, "a").is_ok());
        let b = Mask::BlockSparse {
            block: 96,
            local: 2,
            global: 0,
        };
        assert!(b
            .check_len(4096, "a")
            .unwrap_err()
            .to_string()
            .contains("divides"));
        // round trip through the text form
        for s in [
            "causal",
            "sliding:4096",
            "chunked:8192",
            "block-sparse:128:local=4:global=1",
        ] {
            assert_eq!(Mask::parse(s, "a").unwrap().to_string(), s);
        }
    }

    #[test]
    fn patterns_repeat_over_the_layers() {
        let p = AttentionPattern::parse(&["3*sliding:4096".into(), "causal".into()], "attention")
            .unwrap();
        assert_eq!(p.mask_of(0), Mask::Sliding { w: 4096 });
        assert_eq!(p.mask_of(3), Mask::Causal);
        assert_eq!(p.mask_of(6), Mask::Sliding { w: 4096 });
        assert_eq!(
            p.classes(8),
            vec![(Mask::Sliding { w: 4096 }, 6), (Mask::Causal, 2)]
        );
        assert_eq!(p.plan_mask(8), Mask::Causal);
        assert!(p.check_layers(32, "attention").is_ok());
        let e = p.check_layers(30, "attention").unwrap_err();
        assert!(
            e.to_string().contains("divides the model's 30 layers"),
            "{e}"
        );
        let only =
            AttentionPattern::parse(&["sliding:512".into(), "sliding:64".into()], "a").unwrap();
        assert_eq!(only.plan_mask(2), Mask::Sliding { w: 512 });
        let odd =
            AttentionPattern::parse(&["sliding:512".into(), "chunked:1024".into()], "a").unwrap();
        assert_eq!(odd.plan_mask(2), Mask::Causal);
        assert!(AttentionPattern::default().all_causal());
        assert_eq!(AttentionPattern::default().mask_of(5), Mask::Causal);
        let e = AttentionPattern::parse(&["0*causal".into()], "attention").unwrap_err();
        assert!(e.to_string().contains("attention[0]"), "{e}");
    }
}

#[cfg(test)]
mod measured {
    use crate::cost::{CostModel, Mask, ModelConfig};

    /// Median |predicted − measured| / measured of the H200 launches in
    /// `validate/results/torch_window_h200.csv` (`validate/torch/torch_window.py`: PyTorch's
    /// varlen FlashAttention forward, held-out document mixes of 16K–256K tokens, 8 or 32
    /// heads, head_dim 128) whose mask starts with `kind`, each launch priced whole
    /// through the built-in efficiency table (`CostModel::h200`) under its mask.
    fn median_ape(kind: &str) -> f64 {
        let text = include_str!("../../validate/results/torch_window_h200.csv");
        let c = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
        let mut e: Vec<f64> = text
            .lines()
            .skip(1)
            .map(|line| line.split(',').collect::<Vec<_>>())
            .filter(|f| f[0].starts_with(kind))
            .map(|f| {
                let mask = Mask::parse(f[0], "mask").unwrap();
                let heads: u32 = f[1].parse().unwrap();
                let docs: Vec<u32> = f[4].split(';').map(|x| x.parse().unwrap()).collect();
                let ms: f64 = f[5].parse().unwrap();
                let pred = c.for_mask(mask).attn_fwd_ps_f(docs, heads) * 1e-9;
                ((pred - ms) / ms).abs()
            })
            .collect();
        e.sort_by(f64::total_cmp);
        e[e.len() / 2]
    }

    /// The table predicts the causal launches within 5 % (median); the sliding-window ones
    /// it under-predicts by about a fifth (median 21 % measured): the windowed kernel does
    /// more per kept pair than a causal one of any length in the table (masked blocks at
    /// the window's lower edge), which no mechanism here models yet.
    #[test]
    fn measured_window_launches_against_the_table() {
        assert!(median_ape("causal") <= 0.05, "{}", median_ape("causal"));
        let s = median_ape("sliding");
        assert!(s <= 0.25, "{s}");
    }
}
