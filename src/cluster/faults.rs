//! Fault and straggler injection: a GPU k× slower, or a link at a fraction of its
//! bandwidth, from step `from_step` to step `to_step` (inclusive).
//!
//! [`FaultSpec`] is the file form (`[[faults.gpu]]`, `[[faults.link]]`); [`Faults`] is the
//! form resolved against a built [`Topology`] (link names checked). GPU slowdowns multiply
//! kernel durations through `VarianceModel::factor`; link fractions are applied by the
//! engine at step boundaries through the network models' `set_link_scale`.

use serde::{Deserialize, Serialize};

use crate::cluster::topology::{LinkId, Topology};
use crate::error::{invalid, Result};
use crate::net::GpuId;

/// A slow GPU in the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuFaultSpec {
    /// The GPU's global id.
    pub gpu: GpuId,
    /// Kernels take `slowdown` times as long, ≥ 1.
    pub slowdown: f64,
    /// First step affected.
    pub from_step: u64,
    /// Last step affected (inclusive).
    pub to_step: u64,
}

/// A degraded link in the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkFaultSpec {
    /// The link's name, `SRC>DST` as `skewsim topo` lists it (e.g. `leaf0>spine1`).
    pub link: String,
    /// Fraction of its bandwidth left, in (0, 1].
    pub fraction: f64,
    /// First step affected.
    pub from_step: u64,
    /// Last step affected (inclusive).
    pub to_step: u64,
}

/// The `[faults]` table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// Slow GPUs.
    #[serde(default)]
    pub gpu: Vec<GpuFaultSpec>,
    /// Degraded links.
    #[serde(default)]
    pub link: Vec<LinkFaultSpec>,
}

/// A resolved GPU fault.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuFault {
    /// GPU.
    pub gpu: GpuId,
    /// Slowdown factor.
    pub slowdown: f64,
    /// Steps `from..=to`.
    pub from_step: u64,
    /// Last step.
    pub to_step: u64,
}

/// A resolved link fault.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkFault {
    /// Link.
    pub link: LinkId,
    /// Bandwidth fraction left.
    pub fraction: f64,
    /// First step.
    pub from_step: u64,
    /// Last step.
    pub to_step: u64,
}

/// Faults resolved against a topology.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    /// Slow GPUs.
    pub gpu: Vec<GpuFault>,
    /// Degraded links.
    pub link: Vec<LinkFault>,
}

impl FaultSpec {
    /// Check every entry against `topo`; `source` names the file in errors.
    pub fn resolve(&self, topo: &Topology, source: &str) -> Result<Faults> {
        let mut out = Faults::default();
        for (i, f) in self.gpu.iter().enumerate() {
            let field = |name: &str| format!("{source}: faults.gpu[{i}].{name}");
            if f.gpu >= topo.gpus() {
                return Err(invalid(
                    field("gpu"),
                    f.gpu,
                    format!("a GPU id in [0, {})", topo.gpus()),
                ));
            }
            if !(f.slowdown.is_finite() && (1.0..=1.0e6).contains(&f.slowdown)) {
                return Err(invalid(
                    field("slowdown"),
                    f.slowdown,
                    "a factor in [1, 1e6]",
                ));
            }
            if f.to_step < f.from_step {
                return Err(invalid(
                    field("to_step"),
                    f.to_step,
                    format!("≥ from_step = {}", f.from_step),
                ));
            }
            out.gpu.push(GpuFault {
                gpu: f.gpu,
                slowdown: f.slowdown,
                from_step: f.from_step,
                to_step: f.to_step,
            });
        }
        for (i, f) in self.link.iter().enumerate() {
            let field = |name: &str| format!("{source}: faults.link[{i}].{name}");
            let Some(link) = topo.link_by_name(&f.link) else {
                return Err(invalid(
                    field("link"),
                    &f.link,
                    "an existing link SRC>DST (gpuN, nvsN, nicNODE.RAIL, leafN, spineN; \
                     `skewsim topo FILE --links` lists them)",
                ));
            };
            if !(f.fraction.is_finite() && f.fraction > 0.0 && f.fraction <= 1.0) {
                return Err(invalid(
                    field("fraction"),
                    f.fraction,
                    "a fraction in (0, 1]",
                ));
            }
            if f.to_step < f.from_step {
                return Err(invalid(
                    field("to_step"),
                    f.to_step,
                    format!("≥ from_step = {}", f.from_step),
                ));
            }
            out.link.push(LinkFault {
                link,
                fraction: f.fraction,
                from_step: f.from_step,
                to_step: f.to_step,
            });
        }
        Ok(out)
    }
}

impl Faults {
    /// The slowdown of `gpu` at `step` (product of the faults in force; 1 if none).
    pub fn gpu_factor(&self, gpu: GpuId, step: u64) -> f64 {
        self.gpu
            .iter()
            .filter(|f| f.gpu == gpu && (f.from_step..=f.to_step).contains(&step))
            .map(|f| f.slowdown)
            .product()
    }

    /// The bandwidth fraction of `link` at `step` (product of the faults in force).
    pub fn link_factor(&self, link: LinkId, step: u64) -> f64 {
        self.link
            .iter()
            .filter(|f| f.link == link && (f.from_step..=f.to_step).contains(&step))
            .map(|f| f.fraction)
            .product()
    }

    /// Links whose fraction changes between `step - 1` and `step`, with their new
    /// fraction: what the engine applies at a step boundary.
    pub fn link_changes(&self, step: u64) -> Vec<(LinkId, f64)> {
        let mut links: Vec<LinkId> = self.link.iter().map(|f| f.link).collect();
        links.sort_unstable();
        links.dedup();
        links
            .into_iter()
            .filter_map(|l| {
                let now = self.link_factor(l, step);
                let before = if step == 0 {
                    1.0
                } else {
                    self.link_factor(l, step - 1)
                };
                (now != before).then_some((l, now))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::cluster::topology::TopologySpec;

    const TOPO: &str = r#"
name = "t"
nodes = 2
gpus_per_node = 2
[nvlink]
bandwidth_gbyte_s = 100.0
efficiency = 1.0
latency_us = 1.0
[nic]
per_node = 1
bandwidth_gbit_s = 100.0
efficiency = 1.0
latency_us = 1.0
pcie_gbyte_s = 64.0
[fabric]
hosts_per_leaf = 1
spines = 1
oversubscription = 1.0
hop_latency_us = 0.0
rail_optimized = true
[[faults.gpu]]
gpu = 3
slowdown = 2.5
from_step = 10
to_step = 20
[[faults.link]]
link = "leaf0>spine0"
fraction = 0.25
from_step = 5
to_step = 6
"#;

    #[test]
    fn faults_apply_in_their_window_only() {
        let spec = TopologySpec::parse(TOPO, "f.toml").unwrap();
        let topo = spec.build(None).unwrap();
        let f = spec
            .faults
            .as_ref()
            .unwrap()
            .resolve(&topo, "f.toml")
            .unwrap();
        assert_eq!(f.gpu_factor(3, 9), 1.0);
        assert_eq!(f.gpu_factor(3, 10), 2.5);
        assert_eq!(f.gpu_factor(3, 20), 2.5);
        assert_eq!(f.gpu_factor(2, 15), 1.0);
        let l = topo.link_by_name("leaf0>spine0").unwrap();
        assert_eq!(f.link_factor(l, 5), 0.25);
        assert_eq!(f.link_factor(l, 7), 1.0);
        assert_eq!(f.link_changes(5), vec![(l, 0.25)]);
        assert_eq!(f.link_changes(6), vec![]);
        assert_eq!(f.link_changes(7), vec![(l, 1.0)]);
    }

    #[test]
    fn bad_faults_are_named() {
        let spec = TopologySpec::parse(TOPO, "f.toml").unwrap();
        let topo = spec.build(None).unwrap();
        let mut fs = spec.faults.clone().unwrap();
        fs.link[0].link = "leaf0>spine9".into();
        let e = fs.resolve(&topo, "f.toml").unwrap_err().to_string();
        assert!(
            e.contains("f.toml: faults.link[0].link = leaf0>spine9"),
            "{e}"
        );
        let mut fs = spec.faults.clone().unwrap();
        fs.gpu[0].gpu = 4;
        let e = fs.resolve(&topo, "f.toml").unwrap_err().to_string();
        assert!(
            e.contains("faults.gpu[0].gpu = 4") && e.contains("[0, 4)"),
            "{e}"
        );
        let mut fs = spec.faults.unwrap();
        fs.gpu[0].slowdown = 0.5;
        assert!(fs.resolve(&topo, "f.toml").is_err());
    }
}
