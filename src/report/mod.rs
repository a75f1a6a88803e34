//! Report: the edge where results become text a person reads — tables (aligned text,
//! Markdown, CSV) and SVG charts. Builds strings only; the CLI writes the files.
//! May not touch: any simulation state; it formats what it is given.

pub mod comm;
pub mod step;
pub mod svg;
pub mod table;
pub mod trace;
