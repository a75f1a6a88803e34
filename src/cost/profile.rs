//! Built-in kernel profiles: calibrations shipped with the binary, one per attention
//! kernel a run may price (`--kernel`). Each is a `skewsim calibrate` output committed
//! under `calibrations/` beside the measurements it was fitted to.
//!
//! - `torch-flash`: PyTorch 2.11's varlen FlashAttention-2 on an H200 (bf16, head_dim
//!   128; other head dims scale its steps by head_dim), block models in
//!   FlashAttention-2's layout (`calibrate --block-layout flash2`), fitted to the
//!   head_dim-128 launches of `validate/results/torch_fit`.
//! - `skewsim`: the project's own NVRTC kernels (`validate/kernels`), fitted to
//!   `validate/results/plans_run19`.
//!
//! PyTorch's cuDNN attention is not a profile: on the H200 its varlen causal attention
//! gave outputs that differ from FlashAttention's on units whose queries are a suffix of
//! their keys (`validate/results/torch_fit/env_fit.json`), the units plans lower to.

use super::Calibration;
use crate::error::{invalid, Result};

const TORCH_FLASH_D128: &str = include_str!("../../calibrations/torch-flash-d128.json");
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

    /// The built-in calibration of this kernel.
    pub fn calibration(self) -> Result<Calibration> {
        let (text, name) = match self {
            Kernel::TorchFlash => (TORCH_FLASH_D128, "calibrations/torch-flash-d128.json"),
            Kernel::Skewsim => (SKEWSIM_H200, "calibrations/skewsim-h200.json"),
        };
        Calibration::from_json_str(text, &format!("{name} (built in)"))
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
