//! Calibration files at the CLI edge: read one (`--calibration` of `validate`, `calibrate`
//! and `run`) and build the cost model or the launch pricing it describes. The parsing and
//! checks are the library's (`cost::Calibration::from_json_str`); this adds the file I/O.

use std::path::Path;

use anyhow::{bail, Context, Result};
use skewsim::cost::fit::Pricing;
use skewsim::cost::profile::Kernel;
use skewsim::cost::{Calibration, CostModel, ModelConfig};

/// The calibration in `path`, checked; errors name the file.
pub fn read(path: &Path) -> Result<Calibration> {
    let name = path.display().to_string();
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading calibration {name}"))?;
    Ok(Calibration::from_json_str(&text, &name)?)
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
        (None, Some(k)) => Kernel::from_name("--kernel", k)?.pricing()?,
        (None, None) => Pricing::h200_default()?,
    })
}
