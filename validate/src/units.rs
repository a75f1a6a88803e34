//! Work units and their packed-buffer layout.
//!
//! A [`WorkUnit`] is the query range `[a, e)` of one sample with that sample's KV prefix `[0, e)`:
//! the piece of causal attention TAP tiles and DistCA shards hand to one kernel call. A
//! [`Batch`] is a set of samples (their lengths) and units over them; [`Layout`] packs it into
//! the buffers the kernel reads (varlen layout: tokens × heads × head_dim) and lists the
//! query tiles of one launch, heaviest first.

use crate::error::{invalid, Error};

/// Query range `[a, e)` of sample `sample`; it attends the keys `[0, e)` of that sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkUnit {
    pub sample: usize,
    pub a: u32,
    pub e: u32,
}

/// Attention head geometry shared by all units of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    /// Query heads.
    pub h_q: u32,
    /// Key/value heads (grouped-query attention: `h_q` is a multiple of `h_kv`).
    pub h_kv: u32,
    /// Head dimension (64 or 128).
    pub head_dim: u32,
}

impl Heads {
    /// Checks the geometry the kernels support.
    pub fn new(h_q: u32, h_kv: u32, head_dim: u32) -> Result<Self, Error> {
        if h_kv == 0 || h_q == 0 || h_q % h_kv != 0 {
            return Err(invalid(
                "heads (h_q/h_kv)",
                format!("{h_q}/{h_kv}"),
                "h_q and h_kv >= 1 with h_q a multiple of h_kv",
            ));
        }
        if head_dim != 64 && head_dim != 128 {
            return Err(invalid("head_dim", head_dim, "64 or 128"));
        }
        Ok(Heads {
            h_q,
            h_kv,
            head_dim,
        })
    }

    /// Query heads per KV head.
    pub fn group(&self) -> u32 {
        self.h_q / self.h_kv
    }
}

/// Samples (lengths in tokens) and the units over them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub sample_lens: Vec<u32>,
    pub units: Vec<WorkUnit>,
}

impl Batch {
    /// Whole documents: one unit `[0, len)` per sample.
    pub fn documents(lens: &[u32]) -> Self {
        Batch {
            sample_lens: lens.to_vec(),
            units: lens
                .iter()
                .enumerate()
                .map(|(s, &l)| WorkUnit {
                    sample: s,
                    a: 0,
                    e: l,
                })
                .collect(),
        }
    }

    /// `total / doc_len` documents of `doc_len` tokens (the PyTorch reference shapes).
    pub fn equal_documents(total: u32, doc_len: u32) -> Result<Self, Error> {
        if doc_len == 0 || total % doc_len != 0 {
            return Err(invalid(
                "doc_len",
                doc_len,
                format!("a positive divisor of total_tokens = {total}"),
            ));
        }
        Ok(Self::documents(&vec![doc_len; (total / doc_len) as usize]))
    }

    /// A packed batch of `total` tokens drawn from a document-length corpus: lengths are read in
    /// corpus order from a seeded random offset (wrapping), each capped at what is left, until
    /// `total` is filled. With `chunk`, every document is cut into units of `chunk` query tokens
    /// `[0, c), [c, 2c), …`, each attending its document's prefix (context-parallel / TAP-style
    /// pieces, bottom-right aligned); without, one unit per document.
    pub fn from_corpus(
        corpus: &[u32],
        total: u32,
        chunk: Option<u32>,
        rng: &mut impl rand::Rng,
    ) -> Result<Self, Error> {
        if corpus.is_empty() || corpus.contains(&0) {
            return Err(invalid(
                "corpus",
                format!("{} lengths", corpus.len()),
                "a non-empty list of positive lengths",
            ));
        }
        if total == 0 {
            return Err(invalid("total_tokens", total, ">= 1"));
        }
        if chunk == Some(0) {
            return Err(invalid("chunk", 0, ">= 1"));
        }
        let mut i = rng.random_range(0..corpus.len());
        let mut lens = Vec::new();
        let mut left = total;
        while left > 0 {
            let l = corpus[i].min(left);
            lens.push(l);
            left -= l;
            i = (i + 1) % corpus.len();
        }
        let mut units = Vec::new();
        for (s, &l) in lens.iter().enumerate() {
            let c = chunk.unwrap_or(l);
            let mut a = 0;
            while a < l {
                let e = (a + c).min(l);
                units.push(WorkUnit { sample: s, a, e });
                a = e;
            }
        }
        Ok(Batch {
            sample_lens: lens,
            units,
        })
    }

    /// Causal attention FLOPs of the batch: 4·head_dim·h_q per (query, visible key) pair, i.e.
    /// `4·d·h·Σ_units Σ_{p=a}^{e-1} (p+1)` (for a whole document of `l` tokens, `4·d·h·l(l+1)/2`,
    /// the count the reference CSV uses).
    pub fn flops(&self, heads: Heads) -> f64 {
        let pairs: f64 = self
            .units
            .iter()
            .map(|u| {
                let (a, e) = (f64::from(u.a), f64::from(u.e));
                // Σ_{p=a}^{e-1} (p+1) = (e(e+1) - a(a+1)) / 2
                (e * (e + 1.0) - a * (a + 1.0)) / 2.0
            })
            .sum();
        4.0 * f64::from(heads.head_dim) * f64::from(heads.h_q) * pairs
    }
}

/// One query tile of a launch: `block_m` query positions starting at `a + m_block·block_m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    pub unit: u32,
    pub m_block: u32,
}

/// A batch packed for the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Rows of the packed Q/O buffers (Σ (e - a)).
    pub q_rows: usize,
    /// Rows of the packed K/V buffers (Σ sample lengths).
    pub kv_rows: usize,
    /// Per sample, its first row in K/V.
    pub kv_off: Vec<usize>,
    /// Per unit, its first row in Q/O.
    pub q_off: Vec<usize>,
    /// Per unit `[q_off, kv_off, a, e]` as the kernel's `Unit` struct.
    pub unit_words: Vec<i32>,
    /// Tiles, heaviest (most keys) first, ties by (unit, m_block); `[unit, m_block]` pairs.
    pub tiles: Vec<Tile>,
    /// Query rows per tile.
    pub block_m: u32,
}

impl Layout {
    /// Packs `batch` for tiles of `block_m` query rows; checks every unit against its sample.
    pub fn new(batch: &Batch, block_m: u32) -> Result<Self, Error> {
        if block_m == 0 {
            return Err(invalid("block_m", block_m, ">= 1"));
        }
        let mut kv_off = Vec::with_capacity(batch.sample_lens.len());
        let mut kv_rows = 0usize;
        for &l in &batch.sample_lens {
            kv_off.push(kv_rows);
            kv_rows += l as usize;
        }
        let mut q_off = Vec::with_capacity(batch.units.len());
        let mut unit_words = Vec::with_capacity(4 * batch.units.len());
        let mut tiles = Vec::new();
        let mut q_rows = 0usize;
        for (i, u) in batch.units.iter().enumerate() {
            let Some(&len) = batch.sample_lens.get(u.sample) else {
                return Err(invalid(
                    format!("units[{i}].sample"),
                    u.sample,
                    format!("0..{}", batch.sample_lens.len()),
                ));
            };
            if u.a >= u.e || u.e > len {
                return Err(invalid(
                    format!("units[{i}] query range [a, e)"),
                    format!("[{}, {})", u.a, u.e),
                    format!("a < e <= sample length {len}"),
                ));
            }
            q_off.push(q_rows);
            let to_i32 = |x: usize, what: &str| {
                i32::try_from(x).map_err(|_| invalid(what, x, "< 2^31 rows"))
            };
            unit_words.extend([
                to_i32(q_rows, "q rows")?,
                to_i32(kv_off[u.sample], "kv rows")?,
                u.a as i32,
                u.e as i32,
            ]);
            let n = u.e - u.a;
            for m in 0..n.div_ceil(block_m) {
                tiles.push(Tile {
                    unit: i as u32,
                    m_block: m,
                });
            }
            q_rows += n as usize;
        }
        i32::try_from(kv_rows).map_err(|_| invalid("kv rows", kv_rows, "< 2^31"))?;
        // Heaviest first: a tile's work is the number of keys it visits.
        let keys = |t: &Tile| {
            let u = &batch.units[t.unit as usize];
            (u.a + (t.m_block + 1) * block_m).min(u.e)
        };
        tiles.sort_by(|x, y| {
            keys(y)
                .cmp(&keys(x))
                .then(x.unit.cmp(&y.unit))
                .then(x.m_block.cmp(&y.m_block))
        });
        Ok(Layout {
            q_rows,
            kv_rows,
            kv_off,
            q_off,
            unit_words,
            tiles,
            block_m,
        })
    }

    /// Tiles as the kernel's `Tile` words.
    pub fn tile_words(&self) -> Vec<i32> {
        self.tiles
            .iter()
            .flat_map(|t| [t.unit as i32, t.m_block as i32])
            .collect()
    }

    /// Key tiles of the backward dK/dV launch: per unit, blocks of `block_n` keys of its KV
    /// prefix `[0, e)`; heaviest (most query rows that see the block) first, ties by
    /// (unit, block). `Tile::m_block` is the key-block index.
    pub fn key_tiles(&self, batch: &Batch, block_n: u32) -> Result<Vec<Tile>, Error> {
        if block_n == 0 {
            return Err(invalid("block_n", block_n, ">= 1"));
        }
        let mut tiles = Vec::new();
        for (i, u) in batch.units.iter().enumerate() {
            for kb in 0..u.e.div_ceil(block_n) {
                tiles.push(Tile {
                    unit: i as u32,
                    m_block: kb,
                });
            }
        }
        let rows = |t: &Tile| {
            let u = &batch.units[t.unit as usize];
            u.e - u.a.max(t.m_block * block_n)
        };
        tiles.sort_by(|x, y| {
            rows(y)
                .cmp(&rows(x))
                .then(x.unit.cmp(&y.unit))
                .then(x.m_block.cmp(&y.m_block))
        });
        Ok(tiles)
    }

    /// Bytes a launch must move at least: Q and O once, K and V once.
    pub fn min_bytes(&self, heads: Heads) -> f64 {
        let d = f64::from(heads.head_dim) * 2.0;
        2.0 * self.q_rows as f64 * f64::from(heads.h_q) * d
            + 2.0 * self.kv_rows as f64 * f64::from(heads.h_kv) * d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heads() -> Heads {
        Heads::new(4, 2, 64).unwrap()
    }

    #[test]
    fn layout_packs_units_and_orders_tiles_heaviest_first() {
        // Sample 0: 100 tokens; sample 1: 40. Units: [0,100) of s0, [10,40) of s1, [64,80) of s0.
        let batch = Batch {
            sample_lens: vec![100, 40],
            units: vec![
                WorkUnit {
                    sample: 0,
                    a: 0,
                    e: 100,
                },
                WorkUnit {
                    sample: 1,
                    a: 10,
                    e: 40,
                },
                WorkUnit {
                    sample: 0,
                    a: 64,
                    e: 80,
                },
            ],
        };
        let l = Layout::new(&batch, 64).unwrap();
        assert_eq!(l.kv_off, vec![0, 100]);
        assert_eq!(l.kv_rows, 140);
        assert_eq!(l.q_off, vec![0, 100, 130]);
        assert_eq!(l.q_rows, 146);
        assert_eq!(
            l.unit_words,
            vec![0, 0, 0, 100, 100, 100, 10, 40, 130, 0, 64, 80]
        );
        // Tiles and their key counts: (0,0)->64, (0,1)->100, (1,0)->40, (2,0)->80.
        let order: Vec<(u32, u32)> = l.tiles.iter().map(|t| (t.unit, t.m_block)).collect();
        assert_eq!(order, vec![(0, 1), (2, 0), (0, 0), (1, 0)]);
        assert_eq!(l.tile_words(), vec![0, 1, 2, 0, 0, 0, 1, 0]);
        // Key tiles (64 keys): unit 0 blocks 0,1 see 100 and 36 query rows; unit 1 block 0
        // sees 30; unit 2 ([64,80) of s0, keys [0,80)) blocks 0,1 see 16 each.
        let kt: Vec<(u32, u32)> = l
            .key_tiles(&batch, 64)
            .unwrap()
            .iter()
            .map(|t| (t.unit, t.m_block))
            .collect();
        assert_eq!(kt, vec![(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]);
        // Bytes: Q+O = 2*146*4*128 B, K+V = 2*140*2*128 B.
        assert_eq!(
            l.min_bytes(heads()),
            (2 * 146 * 4 * 128 + 2 * 140 * 2 * 128) as f64
        );
    }

    #[test]
    fn flops_match_the_reference_csv_count() {
        // 4 docs of 1024 tokens, 32 heads, d=128: 4·128·32·4·1024·1025/2.
        let b = Batch::equal_documents(4096, 1024).unwrap();
        let h = Heads::new(32, 32, 128).unwrap();
        assert_eq!(b.flops(h), 4.0 * 128.0 * 32.0 * 4.0 * 1024.0 * 1025.0 / 2.0);
        // A suffix unit [a, e) counts pairs Σ_{p=a}^{e-1}(p+1): [2,4) -> 3 + 4 = 7.
        let s = Batch {
            sample_lens: vec![4],
            units: vec![WorkUnit {
                sample: 0,
                a: 2,
                e: 4,
            }],
        };
        assert_eq!(s.flops(Heads::new(1, 1, 64).unwrap()), 4.0 * 64.0 * 7.0);
    }

    #[test]
    fn corpus_batches_fill_the_total_and_chunk_documents() {
        use rand::SeedableRng;
        let corpus = [5u32, 300, 7, 1000];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let b = Batch::from_corpus(&corpus, 1500, Some(128), &mut rng).unwrap();
        assert_eq!(b.sample_lens.iter().sum::<u32>(), 1500);
        // Consecutive corpus entries (wrapping), the last one capped.
        let start = corpus.iter().position(|&c| c == b.sample_lens[0]).unwrap();
        for (k, &l) in b.sample_lens.iter().enumerate() {
            let want = corpus[(start + k) % 4];
            assert!(
                l == want || (k == b.sample_lens.len() - 1 && l < want),
                "{:?}",
                b.sample_lens
            );
        }
        // Units tile each document exactly, in chunks of 128 query rows.
        let mut covered = vec![0u32; b.sample_lens.len()];
        for u in &b.units {
            assert!(u.e - u.a <= 128 && u.e <= b.sample_lens[u.sample]);
            assert_eq!(u.a, covered[u.sample]);
            covered[u.sample] = u.e;
        }
        assert_eq!(covered, b.sample_lens);
        let l = Layout::new(&b, 64).unwrap();
        assert_eq!((l.q_rows, l.kv_rows), (1500, 1500));
        // Same seed, same batch; no chunk, one unit per document.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let w = Batch::from_corpus(&corpus, 1500, None, &mut rng).unwrap();
        assert_eq!(w.sample_lens, b.sample_lens);
        assert_eq!(w.units.len(), w.sample_lens.len());
        assert!(Batch::from_corpus(&[], 10, None, &mut rng).is_err());
        assert!(Batch::from_corpus(&[4], 10, Some(0), &mut rng).is_err());
    }

    #[test]
    fn bad_units_and_heads_are_rejected_with_the_field_named() {
        let b = Batch {
            sample_lens: vec![10],
            units: vec![WorkUnit {
                sample: 0,
                a: 5,
                e: 11,
            }],
        };
        let msg = Layout::new(&b, 64).unwrap_err().to_string();
        assert!(msg.contains("units[0]") && msg.contains("[5, 11)"), "{msg}");
        let b = Batch {
            sample_lens: vec![10],
            units: vec![WorkUnit {
                sample: 3,
                a: 0,
                e: 1,
            }],
        };
        assert!(Layout::new(&b, 64)
            .unwrap_err()
            .to_string()
            .contains("sample"));
        assert!(Heads::new(6, 4, 128).is_err());
        assert!(Heads::new(8, 2, 96)
            .unwrap_err()
            .to_string()
            .contains("head_dim"));
        assert!(Batch::equal_documents(100, 30).is_err());
    }
}
