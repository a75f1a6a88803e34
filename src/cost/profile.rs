//! Built-in kernel profiles: calibrations shipped with the binary, one per attention
//! kernel a run may price (`--kernel`). Each is a `skewsim calibrate` output committed
//! under `calibrations/` beside the measurements it was fitted to.
//!
//! - `torch-flash`: PyTorch 2.11's varlen FlashAttention-2 on an H200 (bf16), block
//!   models in FlashAttention-2's layout (`calibrate --block-layout flash2`), one per head
//!   dim the kernel tiles differently (head_dim 128: 128 × 64 forward tiles, 128-key
//!   backward tiles over 64-row steps; head_dim 64: 128 × 128 both), each fitted to the
//!   launches of its head_dim in `validate/results/torch_fit`; other head dims take the
//!   head_dim-128 model with its steps scaled by head_dim.
//! - `skewsim`: the project's own NVRTC kernels (`validate/kernels`), fitted to
//!   `validate/results/plans_run19`.
//!
//! PyTorch's cuDNN attention is not a profile: on the H200 its varlen causal attention
//! gave outputs that differ from FlashAttention's on units whose queries are a suffix of
//! their keys (`validate/results/torch_fit/env_fit.json`), the units plans lower to.

use super::fit::Pricing;
use super::Calibration;
use crate::error::{invalid, Result};

const TORCH_FLASH_D128: &str = include_str!("../../calibrations/torch-flash-d128.json");
const TORCH_FLASH_D64: &str = include_str!("../../calibrations/torch-flash-d64.json");
const SKEWSIM_H200: &str = include_str!("../../calibrations/skewsim-h200.json");

/// An attention kernel with a built-in calibration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// PyTorch's varlen FlashAttention-2.
    TorchFlash,
    /// The project's own kernels.
    Skewsim,
}

impl Kernel {
    /// The names `--kernel` takes.
    pub const NAMES: [&'static str; 2] = ["torch-flash", "skewsim"];

    /// The kernel a run prices without `--kernel` or a calibration: PyTorch's varlen
    /// FlashAttention-2, the kernel production jobs run.
    pub const DEFAULT: Kernel = Kernel::TorchFlash;

    /// The name `--kernel` takes for it.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::TorchFlash => "torch-flash",
            Kernel::Skewsim => "skewsim",
        }
    }

    /// The kernel `name` names; `field` names the option in errors.
    pub fn from_name(field: &str, name: &str) -> Result<Self> {
        match name {
            "torch-flash" => Ok(Kernel::TorchFlash),
            "skewsim" => Ok(Kernel::Skewsim),
            "torch-cudnn" => Err(invalid(
                field,
                name,
                "torch-flash or skewsim (PyTorch's cuDNN varlen attention gave outputs unlike \
                 FlashAttention's on chunked-prefix units on the H200, so it has no profile)",
            )),
            _ => Err(invalid(field, name, "torch-flash or skewsim")),
        }
    }

    /// The kernel's built-in calibrations: (head_dim fitted at, text, file); the first
    /// prices every head_dim without one of its own.
    fn files(self) -> &'static [(u32, &'static str, &'static str)] {
        match self {
            Kernel::TorchFlash => &[
                (128, TORCH_FLASH_D128, "calibrations/torch-flash-d128.json"),
                (64, TORCH_FLASH_D64, "calibrations/torch-flash-d64.json"),
            ],
            Kernel::Skewsim => &[(128, SKEWSIM_H200, "calibrations/skewsim-h200.json")],
        }
    }

    fn parse((_, text, name): (u32, &str, &str)) -> Result<Calibration> {
        Calibration::from_json_str(text, &format!("{name} (built in)"))
    }

    /// The built-in calibration of this kernel (at head_dim 128).
    pub fn calibration(self) -> Result<Calibration> {
        Self::parse(self.files()[0])
    }

    /// The built-in calibration that prices calls at `head_dim`: the one fitted at it,
    /// else the head_dim-128 one (its steps scaled by head_dim).
    pub fn calibration_for(self, head_dim: u32) -> Result<Calibration> {
        let files = self.files();
        Self::parse(*files.iter().find(|f| f.0 == head_dim).unwrap_or(&files[0]))
    }

    /// The launch pricing of this kernel: every measured call by the calibration of its
    /// head_dim ([`Self::calibration_for`]).
    pub fn pricing(self) -> Result<Pricing> {
        let files = self.files();
        let name = |f: &(u32, &str, &str)| format!("{} (built in)", f.2);
        let mut p = Pricing::from_calibration(&self.calibration()?, &name(&files[0]))?;
        for f in &files[1..] {
            let other = Pricing::from_calibration(&Self::parse(*f)?, &name(f))?;
            p.head_dims.push((f.0, other));
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_parses_and_names_its_layout() {
        use crate::cost::blocks::TileOrder;
        let c = Kernel::TorchFlash.calibration().unwrap();
        let (f, b) = (c.attn_blocks.unwrap(), c.attn_bwd_blocks.unwrap());
        assert_eq!(
            (f.head_dim, f.order, b.order),
            (128, TileOrder::Grid, TileOrder::Grid)
        );
        assert!(!b.dq_launch);
        let s = Kernel::Skewsim.calibration().unwrap();
        assert_eq!(s.attn_blocks.unwrap().order, TileOrder::LongestFirst);
    }

    #[test]
    fn each_head_dim_takes_its_own_model() {
        let d64 = Kernel::TorchFlash.calibration_for(64).unwrap();
        let d128 = Kernel::TorchFlash.calibration_for(128).unwrap();
        assert_eq!(d64.attn_blocks.unwrap().head_dim, 64);
        assert_eq!(d64.attn_blocks.unwrap().block_n, 128);
        assert_eq!(d128.attn_blocks.unwrap().head_dim, 128);
        // A head_dim without a model of its own: the head_dim-128 one.
        let d96 = Kernel::TorchFlash.calibration_for(96).unwrap();
        assert_eq!(d96.attn_blocks, d128.attn_blocks);
        let p = Kernel::TorchFlash.pricing().unwrap();
        assert_eq!(p.blocks, d128.attn_blocks);
        assert_eq!(p.head_dims.len(), 1);
        assert_eq!(p.head_dims[0].1.blocks, d64.attn_blocks);
    }

    #[test]
    fn unknown_and_cudnn_names_are_refused_by_name() {
        let e = Kernel::from_name("--kernel", "torch-cudnn")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--kernel") && e.contains("torch-cudnn") && e.contains("torch-flash"),
            "{e}"
        );
        let e = Kernel::from_name("--kernel", "fa3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("fa3") && e.contains("skewsim"), "{e}");
    }
}
