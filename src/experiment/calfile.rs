//! Calibration files: read one (`--calibration` of `validate`, `calibrate` and `run`, an
//! experiment's `calibration`) and build the cost model or the launch pricing it describes.
//! The parsing and checks are `cost::Calibration::from_json_str`'s; this adds the file I/O.

use std::path::Path;

use super::inputs::{read_input_text, MAX_SPEC_BYTES};
use crate::cost::elementwise::ElementwiseModel;
use crate::cost::fit::Pricing;
use crate::cost::gemm::GemmModel;
use crate::cost::profile::Kernel;
use crate::cost::{Calibration, CostModel, ModelConfig};
use crate::error::{bail, Context, Result};

/// Where a run's prices come from, as its flags give it: `--calibration`'s file or
/// `--kernel`'s profile (at most one), else the experiment file's calibration, else
/// [`Kernel::DEFAULT`].
pub type Prices<'a> = (Option<&'a Path>, Option<Kernel>);

/// The calibration in `path`, checked; errors name the file.
pub fn read(path: &Path) -> Result<Calibration> {
    let name = path.display().to_string();
    let text = read_input_text(path, MAX_SPEC_BYTES)
        .with_context(|| format!("reading calibration {name}"))?;
    Calibration::from_json_str(&text, &name)
}

/// `model` priced by the calibration in `path`, else by the built-in profile of `kernel`
/// (its calibration at the model's head_dim) and the built-in H200 GEMM and elementwise
/// models.
pub fn cost_model(model: ModelConfig, path: Option<&Path>, kernel: Kernel) -> Result<CostModel> {
    Ok(match path {
        None => {
            let c = kernel.calibration_for(model.head_dim)?;
            CostModel::calibrated(model, &c, &format!("--kernel {}", kernel.name()))?
                .with_gemm(GemmModel::h200_default()?)
                .with_elementwise(ElementwiseModel::h200_default()?)
        }
        Some(p) => CostModel::calibrated(model, &read(p)?, &p.display().to_string())?,
    })
}

/// `--kernel`'s kernel, if given; refused with `--calibration` (`calibration`).
pub fn kernel_flag(kernel: Option<&str>, calibration: bool) -> Result<Option<Kernel>> {
    match kernel {
        Some(_) if calibration => bail!("--calibration and --kernel: give one of them"),
        Some(k) => Ok(Some(Kernel::from_name("--kernel", k)?)),
        None => Ok(None),
    }
}

/// The launch pricing of the calibration in `path`, else of the built-in profile of
/// `kernel` (`--kernel`), else of the default kernel's ([`Kernel::DEFAULT`]).
pub fn pricing(path: Option<&Path>, kernel: Option<&str>) -> Result<Pricing> {
    Ok(match (path, kernel_flag(kernel, path.is_some())?) {
        (Some(p), _) => Pricing::from_calibration(&read(p)?, &p.display().to_string())?,
        (None, k) => k.unwrap_or(Kernel::DEFAULT).pricing()?,
    })
}
