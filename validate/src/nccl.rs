//! Moving planned bytes between GPUs through NCCL (plan execution on one or more
//! GPUs): one grouped send/recv exchange (an all-to-all with arbitrary per-pair sizes), timed
//! with CUDA events on every GPU; the exchange's time is the slowest GPU's.
//!
//! Owns nothing else: the caller decides which worker maps to which GPU. Written for any GPU
//! count ≥ 1: with one GPU (a one-rank communicator) and [`Local::Nccl`], a GPU's moves to
//! itself go through NCCL too (a send to and a receive from its own rank in one group,
//! which NCCL allows), so the NCCL path runs for real on a one-GPU machine; with
//! [`Local::Copy`] they are device-to-device copies. Which operations each rank enqueues is
//! [`exchange_ops`], a pure function tested without a GPU. NCCL is loaded at run time
//! (cudarc `dynamic-loading`), so building needs no NCCL and a machine without it gets
//! [`Error::Invalid`] naming the library, not a panic.

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

/// How a GPU's moves to itself travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    /// A device-to-device copy on the GPU's stream.
    Copy,
    /// An NCCL send to and receive from its own rank, inside the group.
    Nccl,
}

/// One NCCL communicator per GPU (single process, `ncclCommInitAll`).
pub struct Mesh {
    comms: Vec<Comm>,
    local: Local,
}

/// What one exchange enqueues: `copies` (indices into the moves, device-to-device on the
/// source GPU, before the group) and, inside one NCCL group, per rank its sends and
/// receives as (peer, move index).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExchangeOps {
    pub copies: Vec<usize>,
    pub sends: Vec<Vec<(usize, usize)>>,
    pub recvs: Vec<Vec<(usize, usize)>>,
}

/// The operations of one grouped exchange of `moves` over `n` GPUs: moves of 0 bytes are
/// dropped; a move between two GPUs is a send on its source rank and a receive on its
/// destination rank; a move inside one GPU is a copy ([`Local::Copy`]) or a send and a
/// receive on that rank ([`Local::Nccl`]). Errors name a move outside 0..n.
pub fn exchange_ops(moves: &[Move], n: usize, local: Local) -> Result<ExchangeOps, Error> {
    if n == 0 {
        return Err(invalid("GPUs in the exchange", 0, ">= 1"));
    }
    let mut ops = ExchangeOps {
        copies: Vec::new(),
        sends: vec![Vec::new(); n],
        recvs: vec![Vec::new(); n],
    };
    for (i, m) in moves.iter().enumerate() {
        if m.src >= n || m.dst >= n {
            return Err(invalid(
                "move GPU",
                format!("{} -> {}", m.src, m.dst),
                format!("GPUs 0..{n}"),
            ));
        }
        if m.bytes == 0 {
            continue;
        }
        if m.src == m.dst && local == Local::Copy {
            ops.copies.push(i);
        } else {
            ops.sends[m.src].push((m.dst, i));
            ops.recvs[m.dst].push((m.src, i));
        }
    }
    Ok(ops)
}

/// Bytes moving from GPU `src` to GPU `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub src: usize,
    pub dst: usize,
    pub bytes: usize,
}

impl Mesh {
    /// Communicators over the GPUs of `streams` (one stream per GPU, ranks in that order);
    /// `local` says how a GPU's moves to itself travel.
    pub fn new(streams: Vec<Arc<CudaStream>>, local: Local) -> Result<Self, Error> {
        if streams.is_empty() {
            return Err(invalid("GPUs for NCCL", 0, ">= 1"));
        }
        if !nccl_present() {
            return Err(invalid(
                "NCCL",
                "libnccl not found",
                "libnccl.so.2 on the library path for transfers between GPUs",
            ));
        }
        let comms = Comm::from_devices(streams).map_err(nccl("ncclCommInitAll"))?;
        Ok(Mesh { comms, local })
    }

    /// NCCL's version (e.g. 22807 for 2.28.7).
    pub fn nccl_version() -> Result<i32, Error> {
        let mut v = 0i32;
        // SAFETY: plain out-parameter query.
        unsafe { cudarc::nccl::sys::ncclGetVersion(&mut v) }
            .result()
            .map_err(nccl("ncclGetVersion"))?;
        Ok(v)
    }

    /// GPUs in the mesh.
    pub fn len(&self) -> usize {
        self.comms.len()
    }

    /// Always false (a mesh has at least one GPU).
    pub fn is_empty(&self) -> bool {
        self.comms.is_empty()
    }

    /// Times `reps` runs of one grouped exchange of `moves` after `warmup` untimed ones.
    /// Moves inside one GPU are copies or NCCL self send/recv ([`Local`], [`exchange_ops`]).
    /// Per run: the slowest GPU's time between its start and end events, ms.
    pub fn time_exchange(
        &self,
        moves: &[Move],
        warmup: usize,
        reps: usize,
    ) -> Result<Vec<f64>, Error> {
        let n = self.comms.len();
        let ops = exchange_ops(moves, n, self.local)?;
        let mut bufs: Vec<Option<(CudaSlice<u8>, CudaSlice<u8>)>> = Vec::with_capacity(moves.len());
        for m in moves {
            if m.bytes == 0 {
                bufs.push(None);
                continue;
            }
            let s = self.comms[m.src].stream();
            let d = self.comms[m.dst].stream();
            bufs.push(Some((
                s.alloc_zeros::<u8>(m.bytes)
                    .map_err(cuda("cuMemAlloc(send)"))?,
                d.alloc_zeros::<u8>(m.bytes)
                    .map_err(cuda("cuMemAlloc(recv)"))?,
            )));
        }
        let missing = || invalid("exchange buffer", "none", "a buffer for every move");
        let run = |bufs: &mut Vec<Option<(CudaSlice<u8>, CudaSlice<u8>)>>| -> Result<(), Error> {
            for &i in &ops.copies {
                let (s, r) = bufs[i].as_mut().ok_or_else(missing)?;
                self.comms[moves[i].src]
                    .stream()
                    .memcpy_dtod(&*s, r)
                    .map_err(cuda("cuMemcpyDtoDAsync"))?;
            }
            group_start().map_err(nccl("ncclGroupStart"))?;
            for (rank, sends) in ops.sends.iter().enumerate() {
                for &(peer, i) in sends {
                    let (s, _) = bufs[i].as_ref().ok_or_else(missing)?;
                    self.comms[rank]
                        .send(s, peer as i32)
                        .map_err(nccl("ncclSend"))?;
                }
            }
            for (rank, recvs) in ops.recvs.iter().enumerate() {
                for &(peer, i) in recvs {
                    let (_, r) = bufs[i].as_mut().ok_or_else(missing)?;
                    self.comms[rank]
                        .recv(r, peer as i32)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn mv(src: usize, dst: usize, bytes: usize) -> Move {
        Move { src, dst, bytes }
    }

    #[test]
    fn exchange_ops_pair_every_send_with_its_receive() {
        let moves = [
            mv(0, 1, 10),
            mv(1, 0, 5),
            mv(2, 2, 7),
            mv(0, 2, 0),
            mv(2, 0, 3),
        ];
        let ops = exchange_ops(&moves, 3, Local::Copy).unwrap();
        assert_eq!(ops.copies, vec![2]);
        assert_eq!(ops.sends, vec![vec![(1, 0)], vec![(0, 1)], vec![(0, 4)]]);
        assert_eq!(ops.recvs, vec![vec![(1, 1), (2, 4)], vec![(0, 0)], vec![]]);
        // Through NCCL, the local move is a send and a receive on rank 2 itself.
        let ops = exchange_ops(&moves, 3, Local::Nccl).unwrap();
        assert!(ops.copies.is_empty());
        assert_eq!(ops.sends[2], vec![(2, 2), (0, 4)]);
        assert_eq!(ops.recvs[2], vec![(2, 2)]);
        // Every byte is sent once and received once, whatever the GPU count.
        for n in 1..=8 {
            let many: Vec<Move> = (0..24).map(|k| mv(k % n, (k * 7 + 3) % n, 1 + k)).collect();
            for local in [Local::Copy, Local::Nccl] {
                let ops = exchange_ops(&many, n, local).unwrap();
                let sent: usize = ops
                    .sends
                    .iter()
                    .flatten()
                    .map(|&(_, i)| many[i].bytes)
                    .sum();
                let recv: usize = ops
                    .recvs
                    .iter()
                    .flatten()
                    .map(|&(_, i)| many[i].bytes)
                    .sum();
                let copied: usize = ops.copies.iter().map(|&i| many[i].bytes).sum();
                let total: usize = many.iter().map(|m| m.bytes).sum();
                assert_eq!(sent, recv);
                assert_eq!(sent + copied, total, "n {n} {local:?}");
                for (rank, s) in ops.sends.iter().enumerate() {
                    for &(peer, i) in s {
                        assert_eq!((many[i].src, many[i].dst), (rank, peer));
                        assert!(ops.recvs[peer].contains(&(rank, i)));
                    }
                }
            }
        }
        // One GPU with copies: no NCCL operation at all.
        let one = exchange_ops(&[mv(0, 0, 9)], 1, Local::Copy).unwrap();
        assert!(one.sends[0].is_empty() && one.copies == vec![0]);
        // Out of range and empty meshes are errors.
        let e = exchange_ops(&[mv(0, 3, 1)], 3, Local::Copy)
            .unwrap_err()
            .to_string();
        assert!(e.contains("0 -> 3") && e.contains("GPUs 0..3"), "{e}");
        assert!(exchange_ops(&[], 0, Local::Nccl).is_err());
    }
}
