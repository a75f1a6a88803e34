//! The [`Pricing`] of one measured launch or copy through the one cost model.

use super::*;
use crate::cost::blocks::{self, BlockModel, BwdBlockModel, LaunchBlocks};
use crate::cost::{
    attn_bwd_segment_ps_f, attn_segment_ps_f, AttnShape, Calibration, EffTable, Hardware,
    LaunchCosts, Mask,
};
use crate::error::Result;

/// A measured forward launch's blocks under `m`'s geometry.
pub(crate) fn row_blocks(m: &BlockModel, r: &Measurement) -> LaunchBlocks {
    LaunchBlocks::new(m, r.mask, r.heads, r.head_dim, Pricing::seg_ranges(&r.segs))
}

/// Prices measured launches and copies through the cost model's tables and launch terms.
#[derive(Clone, Debug)]
pub struct Pricing {
    /// Forward efficiency table.
    pub eff: EffTable,
    /// Measured backward efficiency table, if any (else forward × efficiency).
    pub bwd: Option<EffTable>,
    /// Backward FLOP factor and efficiency.
    pub hw: Hardware,
    /// Launch and copy terms.
    pub launch: LaunchCosts,
    /// The forward kernel's block model, if a calibration fitted one (it then prices every
    /// forward launch instead of the table).
    pub blocks: Option<BlockModel>,
    /// The backward kernels' block model, if a calibration fitted one (it then prices every
    /// backward call instead of the table).
    pub bwd_blocks: Option<BwdBlockModel>,
    /// Pricings of head dims a kernel profile fitted apart (`profile::Kernel::pricing`): a
    /// row of one of these head dims is priced by its pricing.
    pub head_dims: Vec<(u32, Pricing)>,
}

impl Pricing {
    /// The built-in H200 table with default launch terms and backward assumptions.
    pub fn h200_default() -> Result<Self> {
        Ok(Pricing {
            eff: EffTable::h200_default()?,
            bwd: None,
            hw: Hardware::default(),
            launch: LaunchCosts::default(),
            blocks: None,
            bwd_blocks: None,
            head_dims: Vec::new(),
        })
    }

    /// The pricing of a calibration.
    pub fn from_calibration(c: &Calibration, context: &str) -> Result<Self> {
        Ok(Pricing {
            eff: EffTable::from_points(&c.attn_fwd, context)?,
            bwd: c
                .attn_bwd
                .as_deref()
                .map(|b| EffTable::from_points(b, &format!("{context}: attn_bwd")))
                .transpose()?,
            hw: c.hardware,
            launch: c.launch.clone(),
            blocks: c.attn_blocks,
            bwd_blocks: c.attn_bwd_blocks,
            head_dims: Vec::new(),
        })
    }

    /// From a calibration file's text.
    pub fn from_calibration_json(text: &str, context: &str) -> Result<Self> {
        Self::from_calibration(&Calibration::from_json_str(text, context)?, context)
    }

    fn shape(heads: u32, head_dim: u32, mask: Mask) -> AttnShape {
        AttnShape {
            heads_q: heads,
            heads_kv: 1,
            head_dim,
            dtype_bytes: 2,
            mask,
        }
    }

    /// A launch's segments as (start, end, count) in sample-local positions.
    pub(crate) fn seg_ranges(
        segs: &[SegCount],
    ) -> impl Iterator<Item = (u64, u64, u32)> + Clone + '_ {
        segs.iter()
            .map(|s| (u64::from(s.kv - s.q), u64::from(s.kv), s.n))
    }

    /// Forward time of a launch's segments, ms, without the launch overhead: the table's
    /// price, or with a block model its blocks' makespan ([`blocks::launch_fwd_ps_f`]).
    pub fn attn_fwd_launch_ms(
        eff: &EffTable,
        blocks: Option<&BlockModel>,
        heads: u32,
        (head_dim, mask): (u32, Mask),
        segs: &[SegCount],
    ) -> f64 {
        match blocks.filter(|_| blocks::prices_mask(&mask)) {
            None => Self::attn_compute_ms(eff, heads, (head_dim, mask), segs),
            Some(m) => {
                let key = (mask, head_dim, heads);
                blocks::launch_fwd_ps_f(0.0, Some(m), key, Self::seg_ranges(segs)) * 1e-9
            }
        }
    }

    /// Attention time of a launch's segments at `heads` per call by the table alone, ms,
    /// without the launch overhead.
    pub fn attn_compute_ms(
        eff: &EffTable,
        heads: u32,
        (head_dim, mask): (u32, Mask),
        segs: &[SegCount],
    ) -> f64 {
        let shape = Self::shape(heads, head_dim, mask);
        Self::seg_ranges(segs)
            .map(|(start, end, n)| {
                // ps → ms
                attn_segment_ps_f(eff, &shape, heads, start, end) * f64::from(n) * 1e-9
            })
            .sum()
    }

    /// Backward time of a launch's segments, ms, without the call overhead: through
    /// [`attn_bwd_segment_ps_f`] with `bwd` (or the forward table × efficiency).
    pub fn attn_bwd_compute_ms(
        eff: &EffTable,
        bwd: Option<&EffTable>,
        hw: &Hardware,
        heads: u32,
        (head_dim, mask): (u32, Mask),
        segs: &[SegCount],
    ) -> f64 {
        let shape = Self::shape(heads, head_dim, mask);
        Self::seg_ranges(segs)
            .map(|(start, end, n)| {
                attn_bwd_segment_ps_f(eff, bwd, hw, &shape, heads, start, end) * f64::from(n) * 1e-9
            })
            .sum()
    }

    /// Backward time of a call's segments, ms, without the call overhead: the table's price
    /// ([`Self::attn_bwd_compute_ms`]), or with a backward block model its kernels' blocks
    /// ([`blocks::launch_bwd_ps_f`]).
    pub fn attn_bwd_launch_ms(
        &self,
        (heads, kv_heads): (u32, u32),
        (head_dim, mask): (u32, Mask),
        segs: &[SegCount],
    ) -> f64 {
        match self
            .bwd_blocks
            .as_ref()
            .filter(|_| blocks::prices_mask(&mask))
        {
            None => Self::attn_bwd_compute_ms(
                &self.eff,
                self.bwd.as_ref(),
                &self.hw,
                heads,
                (head_dim, mask),
                segs,
            ),
            Some(m) => {
                let (heads, key) = ((heads, kv_heads), (mask, head_dim));
                blocks::launch_bwd_ps_f(0.0, Some(m), key, heads, Self::seg_ranges(segs)) * 1e-9
            }
        }
    }

    /// Fixed time of one backward call, µs: the measured one with a backward table or
    /// block model, else the forward launch's (as [`crate::cost::CostModel::attn_bwd_ps`] prices
    /// it).
    pub fn bwd_launch_us(&self) -> f64 {
        if self.bwd.is_some() || self.bwd_blocks.is_some() {
            self.launch.attn_bwd_launch_us
        } else {
            self.launch.attn_launch_us
        }
    }

    /// Predicted milliseconds of one measurement row.
    pub fn predict_ms(&self, m: &Measurement) -> f64 {
        if let Some((_, p)) = self.head_dims.iter().find(|d| d.0 == m.head_dim) {
            return p.predict_ms(m);
        }
        match (m.kind, m.pass) {
            (MeasureKind::Attn, _) if m.segs.is_empty() => 0.0,
            (MeasureKind::Attn, Pass::Fwd) => {
                self.launch.attn_launch_us * 1e-3
                    + Self::attn_fwd_launch_ms(
                        &self.eff,
                        self.blocks.as_ref(),
                        m.heads,
                        (m.head_dim, m.mask),
                        &m.segs,
                    )
            }
            (MeasureKind::Attn, Pass::Bwd) => {
                self.bwd_launch_us() * 1e-3
                    + self.attn_bwd_launch_ms((m.heads, m.kv_heads), (m.head_dim, m.mask), &m.segs)
            }
            _ if m.bytes == 0 => 0.0,
            _ => self.copy_ms(m.bytes),
        }
    }

    /// One device-to-device copy of `bytes` inside a GPU, ms.
    pub fn copy_ms(&self, bytes: u64) -> f64 {
        self.launch.copy_launch_us * 1e-3 + bytes as f64 / self.launch.copy_bytes_per_s * 1e3
    }
}
