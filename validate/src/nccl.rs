//! Moving planned bytes between GPUs through NCCL (issue 7, "Plan execution", two or more
//! GPUs): one grouped send/recv exchange (an all-to-all with arbitrary per-pair sizes), timed
//! with CUDA events on every GPU; the exchange's time is the slowest GPU's.
//!
//! Owns nothing else: the caller decides which worker maps to which GPU. Written for any GPU
//! count ≥ 2; NCCL is loaded at run time (cudarc `dynamic-loading`), so building needs no
//! NCCL and a machine without it gets [`Error::Invalid`] naming the library, not a panic.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::{group_end, group_start, Comm};

use crate::error::{invalid, Error};

fn nccl(call: &'static str) -> impl Fn(cudarc::nccl::result::NcclError) -> Error {
    move |e| Error::Cuda {
        call,
        msg: format!("{e:?}"),
    }
}

fn cuda(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Cuda {
        call,
        msg: e.to_string(),
    }
}

/// Is the NCCL library loadable here?
pub fn nccl_present() -> bool {
    // SAFETY: only tries to dlopen the library candidates; no symbol is called.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// One NCCL communicator per GPU (single process, `ncclCommInitAll`).
pub struct Mesh {
    comms: Vec<Comm>,
}

/// Bytes moving from GPU `src` to GPU `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub src: usize,
    pub dst: usize,
    pub bytes: usize,
}

impl Mesh {
    /// Communicators over the GPUs of `streams` (one stream per GPU, ranks in that order).
    pub fn new(streams: Vec<Arc<CudaStream>>) -> Result<Self, Error> {
        if streams.len() < 2 {
            return Err(invalid("GPUs for NCCL", streams.len(), ">= 2"));
        }
        if !nccl_present() {
            return Err(invalid(
                "NCCL",
                "libnccl not found",
                "libnccl.so.2 on the library path for transfers between GPUs",
            ));
        }
        let comms = Comm::from_devices(streams).map_err(nccl("ncclCommInitAll"))?;
        Ok(Mesh { comms })
    }

    /// GPUs in the mesh.
    pub fn len(&self) -> usize {
        self.comms.len()
    }

    /// Always false (a mesh has at least two GPUs).
    pub fn is_empty(&self) -> bool {
        self.comms.is_empty()
    }

    /// Times `reps` runs of one grouped exchange of `moves` after `warmup` untimed ones.
    /// Moves inside one GPU are device-to-device copies on its stream. Per run: the slowest
    /// GPU's time between its start and end events, ms.
    pub fn time_exchange(
        &self,
        moves: &[Move],
        warmup: usize,
        reps: usize,
    ) -> Result<Vec<f64>, Error> {
        let n = self.comms.len();
        for m in moves {
            if m.src >= n || m.dst >= n {
                return Err(invalid(
                    "move GPU",
                    format!("{} -> {}", m.src, m.dst),
                    format!("GPUs 0..{n}"),
                ));
            }
        }
        let moves: Vec<Move> = moves.iter().copied().filter(|m| m.bytes > 0).collect();
        let mut bufs: Vec<(CudaSlice<u8>, CudaSlice<u8>)> = Vec::with_capacity(moves.len());
        for m in &moves {
            let s = self.comms[m.src].stream();
            let d = self.comms[m.dst].stream();
            bufs.push((
                s.alloc_zeros::<u8>(m.bytes)
                    .map_err(cuda("cuMemAlloc(send)"))?,
                d.alloc_zeros::<u8>(m.bytes)
                    .map_err(cuda("cuMemAlloc(recv)"))?,
            ));
        }
        let run = |bufs: &mut Vec<(CudaSlice<u8>, CudaSlice<u8>)>| -> Result<(), Error> {
            for (m, (s, r)) in moves.iter().zip(bufs.iter_mut()) {
                if m.src == m.dst {
                    self.comms[m.src]
                        .stream()
                        .memcpy_dtod(&*s, r)
                        .map_err(cuda("cuMemcpyDtoDAsync"))?;
                }
            }
            group_start().map_err(nccl("ncclGroupStart"))?;
            for (m, (s, r)) in moves.iter().zip(bufs.iter_mut()) {
                if m.src != m.dst {
                    self.comms[m.src]
                        .send(&*s, m.dst as i32)
                        .map_err(nccl("ncclSend"))?;
                    self.comms[m.dst]
                        .recv(r, m.src as i32)
                        .map_err(nccl("ncclRecv"))?;
                }
            }
            group_end().map_err(nccl("ncclGroupEnd"))?;
            Ok(())
        };
        let sync = || -> Result<(), Error> {
            for c in &self.comms {
                c.stream()
                    .synchronize()
                    .map_err(cuda("cuStreamSynchronize"))?;
            }
            Ok(())
        };
        for _ in 0..warmup {
            run(&mut bufs)?;
        }
        sync()?;
        let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let mut out = Vec::with_capacity(reps);
        for _ in 0..reps {
            let mut evs = Vec::with_capacity(n);
            for c in &self.comms {
                let (a, b) = (
                    c.context()
                        .new_event(flags)
                        .map_err(cuda("cuEventCreate"))?,
                    c.context()
                        .new_event(flags)
                        .map_err(cuda("cuEventCreate"))?,
                );
                a.record(&c.stream()).map_err(cuda("cuEventRecord"))?;
                evs.push((a, b));
            }
            run(&mut bufs)?;
            for (c, (_, b)) in self.comms.iter().zip(&evs) {
                b.record(&c.stream()).map_err(cuda("cuEventRecord"))?;
            }
            sync()?;
            let mut worst = 0f64;
            for (a, b) in &evs {
                worst = worst.max(f64::from(
                    a.elapsed_ms(b).map_err(cuda("cuEventElapsedTime"))?,
                ));
            }
            out.push(worst);
        }
        Ok(out)
    }
}
