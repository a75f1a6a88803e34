//! Calibration files: read one (`--calibration` of `validate`, `calibrate` and `run`, an
//! experiment's `calibration`) and build the cost model or the launch pricing it describes.
//! The parsing and checks are `cost::Calibration::from_json_str`'s; this adds the file I/O.
//! It also reads the GPU a run names (`gpu`: a built-in name or a GPU file) and prices the
//! model on it ([`cost_model_on`]).

use std::path::Path;

use super::inputs::{read_input_text, MAX_SPEC_BYTES};
use crate::cluster::TopologySpec;
use crate::cost::elementwise::ElementwiseModel;
use crate::cost::fit::Pricing;
use crate::cost::gemm::GemmModel;
use crate::cost::gpu::{Gpu, Precision};
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

/// `model` priced on `gpu` with its linear layers in `precision` ([`on_gpu`] of
/// [`cost_model`]'s prices).
pub fn cost_model_on(
    model: ModelConfig,
    path: Option<&Path>,
    kernel: Kernel,
    gpu: &Gpu,
    precision: Precision,
) -> Result<CostModel> {
    on_gpu(
        &cost_model(model, path, kernel)?,
        path.is_some(),
        gpu,
        precision,
    )
}

/// `measured` ([`cost_model`]'s prices) on `gpu` with the linear layers in `precision`: the
/// built-in profile's models (`calibrated` false) derived for `gpu` (`CostModel::for_gpu`;
/// the H200's: as measured), a calibration file's taken as measured on `gpu` with `gpu`'s
/// datasheet figures (`CostModel::on_measured_gpu`); then `CostModel::with_precision`.
pub fn on_gpu(
    measured: &CostModel,
    calibrated: bool,
    gpu: &Gpu,
    precision: Precision,
) -> Result<CostModel> {
    let on = if calibrated {
        measured.on_measured_gpu(gpu)
    } else {
        measured.for_gpu(gpu)?
    };
    on.with_precision(precision, gpu)
}

/// The GPU a run is priced on: `named` (the option `field`: `[cluster] gpu`, `--gpu`; a
/// built-in or a GPU file relative to `base`), else `topology`'s `gpu`, else the H200.
pub fn run_gpu(
    named: Option<&str>,
    field: &str,
    topology: Option<&TopologySpec>,
    base: &Path,
) -> Result<Gpu> {
    match (named, topology) {
        (Some(g), _) => gpu(g, base, field),
        (None, Some(t)) => gpu(t.gpu_name(), base, &format!("{}: gpu", t.source)),
        (None, None) => Gpu::reference(),
    }
}

/// The GPU `name` names: a built-in (`h200`, `b200`, ...), or a GPU file's path (one that
/// ends in `.toml`) relative to `base`; `field` names the option in errors.
pub fn gpu(name: &str, base: &Path, field: &str) -> Result<Gpu> {
    if !name.ends_with(".toml") {
        return Gpu::builtin(field, name);
    }
    let p = base.join(name);
    let shown = p.display().to_string();
    let text = read_input_text(&p, MAX_SPEC_BYTES)
        .with_context(|| format!("{field}: reading GPU file {shown}"))?;
    Gpu::from_toml_str(&text, &shown)
}

/// The line a summary gives the GPU a run is priced on: nothing on the H200 with its
/// measured models, else which GPU and which of its figures are derived.
pub fn gpu_note(gpu: &Gpu, cost: &CostModel) -> String {
    let fp8 = if cost.precision == Precision::Fp8 {
        format!(
            " Linear layers in FP8: GEMMs at {:.2}× the BF16 rate (the GPU file's published FP8 \
             over BF16 matmul rate), TransformerEngine's FP8 weight caches and saved inputs; MFU \
             against the BF16 peak.",
            cost.fp8_gemm_speedup
        )
    } else {
        String::new()
    };
    match (cost.derived.is_some(), gpu.is_reference()) {
        (false, true) if fp8.is_empty() => String::new(),
        (true, _) => format!(
            "GPU {} ({}): attention, GEMM and elementwise derived from the H200 measurements \
             by peak/SM and HBM ratio (cost::gpu::derive); {:.0} TFLOP/s BF16 peak, {} GB.{fp8}\n\n",
            gpu.name, gpu.description, gpu.bf16_tflops, gpu.memory_gbyte
        ),
        (false, _) => format!(
            "GPU {} ({}): {:.0} TFLOP/s BF16 peak, {} GB.{fp8}\n\n",
            gpu.name, gpu.description, gpu.bf16_tflops, gpu.memory_gbyte
        ),
    }
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
