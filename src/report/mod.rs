//! Report: the edge where results become files a person reads — tables, CSV, JSON and
//! SVG plots.
