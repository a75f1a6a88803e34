//! skewsim's end-to-end tests: one test binary (so the crate is linked once), one module
//! per command family, all driving the real `skewsim` binary through [`common`].
//! Bad input must give a message naming the field and what is allowed, a non-zero exit and
//! never a panic; re-running an experiment must reproduce its committed results byte for
//! byte, whatever `RAYON_NUM_THREADS` is.

mod cli;
mod cluster;
mod common;
mod gpus;
mod libra;
mod plans;
mod pools;
mod recommend;
mod robust;
mod schemes;
mod sweep;
mod throughput;
mod validate;
