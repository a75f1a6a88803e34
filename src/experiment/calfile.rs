//! Calibration files: read one (`--calibration` of `validate`, `calibrate` and `run`, an
//! experiment's `calibration`) and build the cost model or the launch pricing it describes.
//! The parsing and checks are `cost::Calibration::from_json_str`'s; this adds the file I/O.

use std::path::Path;

use crate::cost::fit::Pricing;
use crate::cost::profile::Kernel;
use crate::cost::{Calibration, CostModel, ModelConfig};
use crate::error::{bail, Context, Result};

/// The calibration in `path`, checked; errors name the file.
pub fn read(path: &Path) -> Result<Calibration> {
    let name = path.display().to_string();
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading calibration {name}"))?;
    Calibration::from_json_str(&text, &name)
}

/// `model` priced by the calibration in `path`, else by the built-in H200 figures.
pub fn cost_model(model: ModelConfig, path: Option<&Path>) -> Result<CostModel> {
    Ok(match path {
        None => CostModel::h200(model)?,
        Some(p) => CostModel::calibrated(model, &read(p)?, &p.display().to_string())?,
    })
}

/// The launch pricing of the calibration in `path`, else of the built-in profile of
/// `kernel` (`--kernel`), else the built-in H200 one.
pub fn pricing(path: Option<&Path>, kernel: Option<&str>) -> Result<Pricing> {
    Ok(match (path, kernel) {
        (Some(_), Some(_)) => bail!("--calibration and --kernel: give one of them"),
        (Some(p), None) => Pricing::from_calibration(&read(p)?, &p.display().to_string())?,
        (None, Some(k)) => Pricing::from_calibration(
            &Kernel::from_name("--kernel", k)?.calibration()?,
            &format!("--kernel {k}"),
        )?,
        (None, None) => Pricing::h200_default()?,
    })
}
