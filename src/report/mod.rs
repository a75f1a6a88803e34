//! Report: the edge where results become files a person reads — tables, CSV, JSON and
//! SVG plots.

pub mod step;
pub mod trace;
