//! The GPU side: driver/NVRTC discovery, kernel compilation, launches, CUDA-event timing.
//!
//! Every driver call is checked and mapped to [`Error::Cuda`] naming the call; a machine without
//! libcuda gets [`Error::NoDriver`] from [`Gpu::open`] (checked before any cudarc call that would
//! otherwise panic on the missing library).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtrMut, DriverError, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};

use crate::bf16;
use crate::error::{invalid, Error};
use crate::units::{Heads, Layout};

/// The forward kernel's source (shared definitions first), embedded at build time.
pub const ATTN_FWD_SRC: &str = concat!(
    include_str!("../kernels/attn_common.cuh"),
    include_str!("../kernels/attn_fwd.cu")
);
/// The version-2 forward kernel's source (shared definitions first).
pub const ATTN_FWD_V2_SRC: &str = concat!(
    include_str!("../kernels/attn_common.cuh"),
    include_str!("../kernels/attn_fwd_v2.cu")
);
/// The version-3 forward kernel's source (shared definitions first).
pub const ATTN_FWD_V3_SRC: &str = concat!(
    include_str!("../kernels/attn_common.cuh"),
    include_str!("../kernels/attn_fwd_v3.cu")
);
/// The backward kernels' source (shared definitions first).
pub const ATTN_BWD_SRC: &str = concat!(
    include_str!("../kernels/attn_common.cuh"),
    include_str!("../kernels/attn_bwd.cu")
);

fn cuda(call: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| Error::Cuda {
        call,
        msg: e.to_string(),
    }
}

/// Compile-time variant of the forward kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FwdVariant {
    pub head_dim: u32,
    /// Warps per block.
    pub nwarps: u32,
    /// Kernel version: 1 = `attn_fwd` (16 query rows per warp, Q in registers), 2 =
    /// `attn_fwd_v2` (32 rows per warp, Q re-read from shared memory), 3 = `attn_fwd_v3` (v2 with
    /// precomputed copy addresses and coalesced O stores).
    pub version: u32,
}

impl FwdVariant {
    /// Version-1 kernel.
    pub fn v1(head_dim: u32, nwarps: u32) -> Self {
        FwdVariant {
            head_dim,
            nwarps,
            version: 1,
        }
    }
    /// Version-2 kernel.
    pub fn v2(head_dim: u32, nwarps: u32) -> Self {
        FwdVariant {
            head_dim,
            nwarps,
            version: 2,
        }
    }
    /// Parses `v{version}w{nwarps}` (e.g. `v2w4`) for head dimension `head_dim`.
    pub fn parse(spec: &str, head_dim: u32) -> Result<Self, Error> {
        let bad = || invalid("kernel variant", spec, "v{1,2,3}w{4,8}, e.g. v2w4");
        let rest = spec.strip_prefix('v').ok_or_else(bad)?;
        let (v, w) = rest.split_once('w').ok_or_else(bad)?;
        let (version, nwarps) = (v.parse().map_err(|_| bad())?, w.parse().map_err(|_| bad())?);
        if !matches!(version, 1..=3) || !matches!(nwarps, 4 | 8) {
            return Err(bad());
        }
        Ok(FwdVariant {
            head_dim,
            nwarps,
            version,
        })
    }

    /// The kernel's entry-point name in its source.
    pub fn entry(&self) -> &'static str {
        match self.version {
            2 => "attn_fwd_v2",
            3 => "attn_fwd_v3",
            _ => "attn_fwd",
        }
    }

    /// Query rows per tile: 16 (v1) or 32 (v2, v3) per warp.
    pub fn block_m(&self) -> u32 {
        if self.version >= 2 {
            32 * self.nwarps
        } else {
            16 * self.nwarps
        }
    }
    /// Dynamic shared memory: Q tile + double-buffered K and V tiles of 64 rows, bf16.
    pub fn smem_bytes(&self) -> u32 {
        (self.block_m() + 4 * 64) * self.head_dim * 2
    }
    /// Kernel-version label for CSV/BENCHMARKS.
    pub fn label(&self) -> String {
        format!("fwd-v{}-d{}-w{}", self.version, self.head_dim, self.nwarps)
    }
}

/// Compiles a forward-kernel variant to PTX with NVRTC (needs libnvrtc, not a GPU).
pub fn compile_fwd(var: FwdVariant, include_dirs: &[String]) -> Result<Ptx, Error> {
    match var.version {
        1 => compile_src(ATTN_FWD_SRC, "attn_fwd.cu", var, include_dirs),
        2 => compile_src(ATTN_FWD_V2_SRC, "attn_fwd_v2.cu", var, include_dirs),
        3 => compile_src(ATTN_FWD_V3_SRC, "attn_fwd_v3.cu", var, include_dirs),
        v => Err(invalid("kernel version", v, "1, 2 or 3")),
    }
}

/// Compiles the backward kernels (4 warps: 64-row query and key tiles) for `head_dim`.
pub fn compile_bwd(head_dim: u32, include_dirs: &[String]) -> Result<Ptx, Error> {
    let var = FwdVariant::v1(head_dim, 4);
    compile_src(ATTN_BWD_SRC, "attn_bwd.cu", var, include_dirs)
}

fn compile_src(
    src: &str,
    name: &str,
    var: FwdVariant,
    include_dirs: &[String],
) -> Result<Ptx, Error> {
    if var.head_dim != 64 && var.head_dim != 128 {
        return Err(invalid("head_dim", var.head_dim, "64 or 128"));
    }
    if var.nwarps != 4 && var.nwarps != 8 {
        return Err(invalid("nwarps", var.nwarps, "4 or 8"));
    }
    // SAFETY: dlopen probe only.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::NoNvrtc);
    }
    let opts = CompileOptions {
        arch: Some("sm_90"),
        options: vec![
            format!("-DHEAD_DIM={}", var.head_dim),
            format!("-DNWARPS={}", var.nwarps),
            "-std=c++17".into(),
        ],
        include_paths: include_dirs.to_vec(),
        name: Some(name.into()),
        ..Default::default()
    };
    compile_ptx_with_opts(src, opts.clone()).map_err(|e| match e {
        CompileError::CompileError { log, .. } => Error::Compile {
            kernel: var.label(),
            options: opts.options.clone(),
            log: log.to_string_lossy().into_owned(),
        },
        other => Error::Compile {
            kernel: var.label(),
            options: opts.options.clone(),
            log: format!("{other:?}"),
        },
    })
}

/// An opened GPU with compiled kernels.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    pub driver_version: i32,
    pub sm_count: i32,
    include_dirs: Vec<String>,
    kernels: HashMap<FwdVariant, CudaFunction>,
    /// Host wall-clock time (ms since the Unix epoch) when the last timed series started, to
    /// line launches up with an external clock/power log.
    pub last_timing_start_unix_ms: f64,
    bwd_kernels: HashMap<u32, [CudaFunction; 3]>,
}

/// Gradients from the backward kernels, fp32, in the layouts of Q and K/V.
pub struct GpuGrads {
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
}

/// Device buffers of one backward pass.
pub struct BwdBuffers {
    pub dout: CudaSlice<u16>,
    pub dvec: CudaSlice<f32>,
    pub dq: CudaSlice<f32>,
    pub dk: CudaSlice<f32>,
    pub dv: CudaSlice<f32>,
    pub key_tiles: CudaSlice<i32>,
    pub n_key_tiles: u32,
    /// Rows × query heads of the current layout (the Dv launch's extent).
    pub rows_heads: usize,
    /// Elements of dQ the current layout writes.
    pub q_len: usize,
    /// Elements of dK (and dV) the current layout accumulates (zeroed before each pass).
    pub kv_len: usize,
}

/// Dynamic shared memory of the backward kernels: two 64-row tiles + two double-buffered ones,
/// plus 2x2x64 floats of LSE/Dv.
pub fn bwd_smem_bytes(head_dim: u32) -> u32 {
    6 * 64 * head_dim * 2 + 4 * 64 * 4
}

/// Device buffers of one forward launch.
pub struct FwdBuffers {
    pub q: CudaSlice<u16>,
    pub k: CudaSlice<u16>,
    pub v: CudaSlice<u16>,
    pub o: CudaSlice<u16>,
    pub lse: CudaSlice<f32>,
    pub units: CudaSlice<i32>,
    pub tiles: CudaSlice<i32>,
    pub n_tiles: u32,
}

/// Is the CUDA driver library loadable here?
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library candidates; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

impl Gpu {
    /// The GPUs visible to this process (after `CUDA_VISIBLE_DEVICES`).
    /// `Err(Error::NoDriver)` where libcuda is missing.
    pub fn count() -> Result<usize, Error> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        let n = CudaContext::device_count().map_err(cuda("cuDeviceGetCount"))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Opens device `ordinal`. `Err(Error::NoDriver)` where libcuda is missing.
    pub fn open(ordinal: usize) -> Result<Self, Error> {
        let n = Self::count()?;
        if n == 0 {
            return Err(Error::NoDevice);
        }
        if ordinal >= n {
            return Err(invalid("device ordinal", ordinal, format!("0..{n}")));
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda("cuCtxCreate"))?;
        // One stream, no cross-stream hazards: skip cudarc's per-launch event bookkeeping so
        // timed launches contain only the kernel.
        // SAFETY: all work of this crate runs on `stream` in order.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let name = ctx.name().map_err(cuda("cuDeviceGetName"))?;
        let mut driver_version = 0i32;
        // SAFETY: plain out-parameter query.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(cuda("cuDriverGetVersion"))?;
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(cuda("cuDeviceGetAttribute"))?;
        let include_dirs = ["/usr/local/cuda/include"]
            .iter()
            .filter(|p| std::path::Path::new(p).is_dir())
            .map(|p| p.to_string())
            .collect();
        Ok(Gpu {
            ctx,
            stream,
            name,
            driver_version,
            sm_count,
            include_dirs,
            kernels: HashMap::new(),
            last_timing_start_unix_ms: 0.0,
            bwd_kernels: HashMap::new(),
        })
    }

    /// Compiles (once) and returns the forward kernel variant.
    pub fn fwd_kernel(&mut self, var: FwdVariant) -> Result<CudaFunction, Error> {
        if let Some(f) = self.kernels.get(&var) {
            return Ok(f.clone());
        }
        let ptx = compile_fwd(var, &self.include_dirs)?;
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(cuda("cuModuleLoadData"))?;
        let f = module
            .load_function(var.entry())
            .map_err(cuda("cuModuleGetFunction"))?;
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            var.smem_bytes() as i32,
        )
        .map_err(cuda("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)"))?;
        self.kernels.insert(var, f.clone());
        Ok(f)
    }

    /// Compiles (once) the backward kernels for `head_dim`: [dot, dq, dkdv].
    pub fn bwd_kernels(&mut self, head_dim: u32) -> Result<[CudaFunction; 3], Error> {
        if let Some(f) = self.bwd_kernels.get(&head_dim) {
            return Ok(f.clone());
        }
        let ptx = compile_bwd(head_dim, &self.include_dirs)?;
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(cuda("cuModuleLoadData(bwd)"))?;
        let get = |n: &str| {
            module
                .load_function(n)
                .map_err(cuda("cuModuleGetFunction(bwd)"))
        };
        let fs = [
            get("attn_bwd_dot")?,
            get("attn_bwd_dq")?,
            get("attn_bwd_dkdv")?,
        ];
        for f in &fs[1..] {
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bwd_smem_bytes(head_dim) as i32,
            )
            .map_err(cuda(
                "cuFuncSetAttribute(bwd MAX_DYNAMIC_SHARED_SIZE_BYTES)",
            ))?;
        }
        self.bwd_kernels.insert(head_dim, fs.clone());
        Ok(fs)
    }

    /// Allocates the backward buffers for the units of `layout` (`key_tiles` from
    /// [`Layout::key_tiles`] with 64 keys) and uploads the upstream gradient `dout`.
    pub fn alloc_bwd(
        &self,
        heads: Heads,
        layout: &Layout,
        key_tiles: &[crate::units::Tile],
        fwd: &FwdBuffers,
        dout: &[u16],
    ) -> Result<BwdBuffers, Error> {
        if layout.block_m != 64 {
            return Err(invalid(
                "layout block_m",
                layout.block_m,
                "64 for the backward kernels",
            ));
        }
        if dout.len() != fwd.q.len() {
            return Err(invalid(
                "dout length",
                dout.len(),
                format!("{} (as q)", fwd.q.len()),
            ));
        }
        let s = &self.stream;
        let kt: Vec<i32> = key_tiles
            .iter()
            .flat_map(|t| [t.unit as i32, t.m_block as i32])
            .collect();
        Ok(BwdBuffers {
            dout: s.clone_htod(dout).map_err(cuda("cuMemcpyHtoD(dout)"))?,
            dvec: s
                .alloc_zeros::<f32>(layout.q_rows * heads.h_q as usize)
                .map_err(cuda("cuMemAlloc(Dv)"))?,
            dq: s
                .clone_htod(&vec![f32::NAN; fwd.q.len()])
                .map_err(cuda("cuMemcpyHtoD(poison dq)"))?,
            dk: s
                .alloc_zeros::<f32>(fwd.k.len())
                .map_err(cuda("cuMemAlloc(dk)"))?,
            dv: s
                .alloc_zeros::<f32>(fwd.v.len())
                .map_err(cuda("cuMemAlloc(dv)"))?,
            key_tiles: s.clone_htod(&kt).map_err(cuda("cuMemcpyHtoD(key tiles)"))?,
            n_key_tiles: u32::try_from(key_tiles.len())
                .map_err(|_| invalid("key tiles", key_tiles.len(), "< 2^32"))?,
            rows_heads: layout.q_rows * heads.h_q as usize,
            q_len: fwd.q.len(),
            kv_len: fwd.k.len(),
        })
    }

    /// Backward buffers as large as `fwd`'s tensors, for many layouts over their first rows
    /// ([`Gpu::set_bwd_layout`]); dO is a device copy of Q (random values already there).
    pub fn alloc_bwd_within(&self, fwd: &FwdBuffers, head_dim: u32) -> Result<BwdBuffers, Error> {
        let s = &self.stream;
        let mut dout = s
            .alloc_zeros::<u16>(fwd.q.len())
            .map_err(cuda("cuMemAlloc(dout)"))?;
        s.memcpy_dtod(&fwd.q, &mut dout)
            .map_err(cuda("cuMemcpyDtoDAsync(dout)"))?;
        Ok(BwdBuffers {
            dout,
            dvec: s
                .alloc_zeros::<f32>((fwd.q.len() / head_dim.max(1) as usize).max(1))
                .map_err(cuda("cuMemAlloc(Dv)"))?,
            dq: s
                .alloc_zeros::<f32>(fwd.q.len())
                .map_err(cuda("cuMemAlloc(dq)"))?,
            dk: s
                .alloc_zeros::<f32>(fwd.k.len())
                .map_err(cuda("cuMemAlloc(dk)"))?,
            dv: s
                .alloc_zeros::<f32>(fwd.v.len())
                .map_err(cuda("cuMemAlloc(dv)"))?,
            key_tiles: s
                .alloc_zeros::<i32>(2)
                .map_err(cuda("cuMemAlloc(key tiles)"))?,
            n_key_tiles: 0,
            rows_heads: 0,
            q_len: 0,
            kv_len: 0,
        })
    }

    /// Points `g` at `layout` (64-row query tiles, `key_tiles` of 64 keys) over the first rows
    /// of its buffers; the forward buffers must hold the same layout ([`Gpu::set_layout_within`]).
    pub fn set_bwd_layout(
        &self,
        g: &mut BwdBuffers,
        layout: &Layout,
        key_tiles: &[crate::units::Tile],
        heads: Heads,
    ) -> Result<(), Error> {
        if layout.block_m != 64 {
            return Err(invalid(
                "layout block_m",
                layout.block_m,
                "64 for the backward kernels",
            ));
        }
        let d = heads.head_dim as usize;
        let (q_len, kv_len) = (
            layout.q_rows * heads.h_q as usize * d,
            layout.kv_rows * heads.h_kv as usize * d,
        );
        let rows_heads = layout.q_rows * heads.h_q as usize;
        if q_len > g.dq.len() || kv_len > g.dk.len() || rows_heads > g.dvec.len() {
            return Err(invalid(
                "backward layout rows",
                format!("q {} / kv {}", layout.q_rows, layout.kv_rows),
                "at most the rows of the allocated backward buffers",
            ));
        }
        let kt: Vec<i32> = key_tiles
            .iter()
            .flat_map(|t| [t.unit as i32, t.m_block as i32])
            .collect();
        if !kt.is_empty() {
            g.key_tiles = self
                .stream
                .clone_htod(&kt)
                .map_err(cuda("cuMemcpyHtoD(key tiles)"))?;
        }
        g.n_key_tiles = u32::try_from(key_tiles.len())
            .map_err(|_| invalid("key tiles", key_tiles.len(), "< 2^32"))?;
        (g.rows_heads, g.q_len, g.kv_len) = (rows_heads, q_len, kv_len);
        Ok(())
    }

    /// Fills the current layout's dQ with NaN (0xFF bytes), so unwritten elements show.
    pub fn poison_dq(&self, g: &mut BwdBuffers) -> Result<(), Error> {
        let n = g.q_len;
        let mut view = g.dq.slice_mut(0..n);
        let (ptr, _rec) = view.device_ptr_mut(&self.stream);
        // SAFETY: `ptr` addresses `n` f32 of `g.dq` allocated on this stream; all-ones bytes
        // are a valid (NaN) f32 pattern.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                ptr,
                0xFF,
                n * std::mem::size_of::<f32>(),
                self.stream.cu_stream(),
            )
        }
        .map_err(cuda("cuMemsetD8Async(poison dq)"))
    }

    /// Copies the current layout's dQ, dK and dV back (only the elements it uses).
    pub fn download_bwd_used(&self, g: &BwdBuffers) -> Result<GpuGrads, Error> {
        let s = &self.stream;
        let get = |src: &CudaSlice<f32>, n: usize, call| -> Result<Vec<f32>, Error> {
            let mut h = vec![0f32; n];
            s.memcpy_dtoh(&src.slice(0..n), &mut h)
                .map_err(cuda(call))?;
            Ok(h)
        };
        Ok(GpuGrads {
            dq: get(&g.dq, g.q_len, "cuMemcpyDtoH(dq)")?,
            dk: get(&g.dk, g.kv_len, "cuMemcpyDtoH(dk)")?,
            dv: get(&g.dv, g.kv_len, "cuMemcpyDtoH(dv)")?,
        })
    }

    /// Copies the first `n` elements of O back.
    pub fn download_o_prefix(&self, b: &FwdBuffers, n: usize) -> Result<Vec<u16>, Error> {
        let n = n.min(b.o.len());
        let mut h = vec![0u16; n];
        self.stream
            .memcpy_dtoh(&b.o.slice(0..n), &mut h)
            .map_err(cuda("cuMemcpyDtoH(o prefix)"))?;
        Ok(h)
    }

    /// Enqueues one backward pass: zeroes dK/dV (they are accumulated atomically), then the
    /// dot, dQ and dK/dV launches. No synchronisation.
    pub fn launch_bwd(
        &mut self,
        heads: Heads,
        fwd: &FwdBuffers,
        g: &mut BwdBuffers,
        scale: f32,
    ) -> Result<(), Error> {
        let [fdot, fdq, fdkdv] = self.bwd_kernels(heads.head_dim)?;
        let s = self.stream.clone();
        let kv = g.kv_len.min(g.dk.len());
        s.memset_zeros(&mut g.dk.slice_mut(0..kv))
            .map_err(cuda("cuMemsetD8(dk)"))?;
        s.memset_zeros(&mut g.dv.slice_mut(0..kv))
            .map_err(cuda("cuMemsetD8(dv)"))?;
        let rows_heads = g.rows_heads.min(g.dvec.len()) as i64;
        let (hq, hkv) = (heads.h_q as i32, heads.h_kv as i32);
        let blocks = u32::try_from((rows_heads + 7) / 8)
            .map_err(|_| invalid("rows x heads", rows_heads, "< 2^35"))?;
        // SAFETY (all three launches): argument lists match the kernels' signatures in
        // attn_bwd.cu; buffers have the sizes the layout's units/tiles index.
        let mut l = s.launch_builder(&fdot);
        l.arg(&fwd.o).arg(&g.dout).arg(&mut g.dvec).arg(&rows_heads);
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (blocks.max(1), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(cuda("cuLaunchKernel(attn_bwd_dot)"))?;
        let smem = bwd_smem_bytes(heads.head_dim);
        if fwd.n_tiles > 0 {
            let mut l = s.launch_builder(&fdq);
            l.arg(&fwd.q)
                .arg(&fwd.k)
                .arg(&fwd.v)
                .arg(&g.dout)
                .arg(&fwd.lse)
                .arg(&g.dvec)
                .arg(&mut g.dq)
                .arg(&fwd.units)
                .arg(&fwd.tiles)
                .arg(&hq)
                .arg(&hkv)
                .arg(&scale);
            unsafe {
                l.launch(LaunchConfig {
                    grid_dim: (fwd.n_tiles, heads.h_q, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: smem,
                })
            }
            .map_err(cuda("cuLaunchKernel(attn_bwd_dq)"))?;
        }
        if g.n_key_tiles > 0 {
            let mut l = s.launch_builder(&fdkdv);
            l.arg(&fwd.q)
                .arg(&fwd.k)
                .arg(&fwd.v)
                .arg(&g.dout)
                .arg(&fwd.lse)
                .arg(&g.dvec)
                .arg(&mut g.dk)
                .arg(&mut g.dv)
                .arg(&fwd.units)
                .arg(&g.key_tiles)
                .arg(&hq)
                .arg(&hkv)
                .arg(&scale);
            unsafe {
                l.launch(LaunchConfig {
                    grid_dim: (g.n_key_tiles, heads.h_q, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: smem,
                })
            }
            .map_err(cuda("cuLaunchKernel(attn_bwd_dkdv)"))?;
        }
        self.ctx
            .check_err()
            .map_err(cuda("attn_bwd (async error)"))?;
        Ok(())
    }

    /// Copies dQ, dK, dV back.
    pub fn download_bwd(&self, g: &BwdBuffers) -> Result<GpuGrads, Error> {
        let s = &self.stream;
        Ok(GpuGrads {
            dq: s.clone_dtoh(&g.dq).map_err(cuda("cuMemcpyDtoH(dq)"))?,
            dk: s.clone_dtoh(&g.dk).map_err(cuda("cuMemcpyDtoH(dk)"))?,
            dv: s.clone_dtoh(&g.dv).map_err(cuda("cuMemcpyDtoH(dv)"))?,
        })
    }

    /// Backward pass, synchronised: dQ poisoned with NaN before and required written by the
    /// caller's check; dK/dV accumulated from zero.
    pub fn backward(
        &mut self,
        heads: Heads,
        layout: &Layout,
        key_tiles: &[crate::units::Tile],
        fwd: &FwdBuffers,
        dout: &[u16],
        scale: f32,
    ) -> Result<GpuGrads, Error> {
        let mut g = self.alloc_bwd(heads, layout, key_tiles, fwd, dout)?;
        self.launch_bwd(heads, fwd, &mut g, scale)?;
        self.sync()?;
        self.download_bwd(&g)
    }

    /// Times `reps` backward passes (each: dK/dV zeroing + 3 launches) between CUDA events after
    /// `warmup` untimed ones; per-pass milliseconds.
    pub fn time_bwd(
        &mut self,
        heads: Heads,
        fwd: &FwdBuffers,
        g: &mut BwdBuffers,
        scale: f32,
        warmup: usize,
        reps: usize,
    ) -> Result<Vec<f64>, Error> {
        for _ in 0..warmup {
            self.launch_bwd(heads, fwd, g, scale)?;
        }
        self.sync()?;
        let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let mut evs = Vec::with_capacity(reps + 1);
        for _ in 0..=reps {
            evs.push(self.ctx.new_event(flags).map_err(cuda("cuEventCreate"))?);
        }
        evs[0].record(&self.stream).map_err(cuda("cuEventRecord"))?;
        for ev in evs.iter().skip(1) {
            self.launch_bwd(heads, fwd, g, scale)?;
            ev.record(&self.stream).map_err(cuda("cuEventRecord"))?;
        }
        self.sync()?;
        evs.windows(2)
            .map(|w| {
                w[0].elapsed_ms(&w[1])
                    .map(f64::from)
                    .map_err(cuda("cuEventElapsedTime"))
            })
            .collect()
    }

    /// Registers, spilled (local) bytes of the backward kernels [dot, dq, dkdv].
    pub fn bwd_resources(&mut self, head_dim: u32) -> Result<Vec<(i32, i32)>, Error> {
        self.bwd_kernels(head_dim)?
            .iter()
            .map(|f| {
                Ok((
                    f.num_regs().map_err(cuda("cuFuncGetAttribute(NUM_REGS)"))?,
                    f.local_size_bytes()
                        .map_err(cuda("cuFuncGetAttribute(LOCAL_SIZE_BYTES)"))?,
                ))
            })
            .collect()
    }

    /// Registers, spilled (local) bytes of a compiled variant.
    pub fn kernel_resources(&mut self, var: FwdVariant) -> Result<(i32, i32), Error> {
        let f = self.fwd_kernel(var)?;
        Ok((
            f.num_regs().map_err(cuda("cuFuncGetAttribute(NUM_REGS)"))?,
            f.local_size_bytes()
                .map_err(cuda("cuFuncGetAttribute(LOCAL_SIZE_BYTES)"))?,
        ))
    }

    /// Uploads inputs and allocates poisoned outputs for one launch.
    pub fn upload(
        &self,
        layout: &Layout,
        heads: Heads,
        q: &[u16],
        k: &[u16],
        v: &[u16],
    ) -> Result<FwdBuffers, Error> {
        let s = &self.stream;
        let d = heads.head_dim as usize;
        if q.len() != layout.q_rows * heads.h_q as usize * d {
            return Err(invalid("q length", q.len(), "q_rows·h_q·head_dim"));
        }
        if k.len() != layout.kv_rows * heads.h_kv as usize * d || v.len() != k.len() {
            return Err(invalid("k/v length", k.len(), "kv_rows·h_kv·head_dim"));
        }
        let mut b = FwdBuffers {
            q: s.clone_htod(q).map_err(cuda("cuMemcpyHtoD(q)"))?,
            k: s.clone_htod(k).map_err(cuda("cuMemcpyHtoD(k)"))?,
            v: s.clone_htod(v).map_err(cuda("cuMemcpyHtoD(v)"))?,
            o: s.alloc_zeros::<u16>(q.len())
                .map_err(cuda("cuMemAlloc(o)"))?,
            lse: s
                .alloc_zeros::<f32>(layout.q_rows * heads.h_q as usize)
                .map_err(cuda("cuMemAlloc(lse)"))?,
            units: s
                .clone_htod(&layout.unit_words)
                .map_err(cuda("cuMemcpyHtoD(units)"))?,
            tiles: s
                .clone_htod(&layout.tile_words())
                .map_err(cuda("cuMemcpyHtoD(tiles)"))?,
            n_tiles: u32::try_from(layout.tiles.len())
                .map_err(|_| invalid("tiles", layout.tiles.len(), "< 2^32"))?,
        };
        self.poison(&mut b)?;
        Ok(b)
    }

    /// Replaces the units/tiles of `b` with those of `layout`, which must have the same Q and
    /// K/V row counts as the uploaded tensors.
    pub fn set_layout(
        &self,
        b: &mut FwdBuffers,
        layout: &Layout,
        heads: Heads,
    ) -> Result<(), Error> {
        self.set_layout_within(b, layout, heads, true)
    }

    /// As [`Gpu::set_layout`]; with `exact == false` the layout may use only the first rows of
    /// the uploaded tensors (one large random upload serves many smaller batches).
    pub fn set_layout_within(
        &self,
        b: &mut FwdBuffers,
        layout: &Layout,
        heads: Heads,
        exact: bool,
    ) -> Result<(), Error> {
        let d = heads.head_dim as usize;
        let (need_q, need_kv) = (
            layout.q_rows * heads.h_q as usize * d,
            layout.kv_rows * heads.h_kv as usize * d,
        );
        let fits = if exact {
            b.q.len() == need_q && b.k.len() == need_kv
        } else {
            b.q.len() >= need_q && b.k.len() >= need_kv
        };
        if !fits {
            return Err(invalid(
                "layout rows",
                format!("q {} / kv {}", layout.q_rows, layout.kv_rows),
                "the row counts of the uploaded tensors",
            ));
        }
        b.units = self
            .stream
            .clone_htod(&layout.unit_words)
            .map_err(cuda("cuMemcpyHtoD(units)"))?;
        b.tiles = self
            .stream
            .clone_htod(&layout.tile_words())
            .map_err(cuda("cuMemcpyHtoD(tiles)"))?;
        b.n_tiles = u32::try_from(layout.tiles.len())
            .map_err(|_| invalid("tiles", layout.tiles.len(), "< 2^32"))?;
        Ok(())
    }

    /// Fills O with bf16 NaN and LSE with f32 NaN, so unwritten elements are detected.
    pub fn poison(&self, b: &mut FwdBuffers) -> Result<(), Error> {
        let po = vec![bf16::POISON; b.o.len()];
        self.stream
            .memcpy_htod(&po, &mut b.o)
            .map_err(cuda("cuMemcpyHtoD(poison o)"))?;
        let pl = vec![f32::NAN; b.lse.len()];
        self.stream
            .memcpy_htod(&pl, &mut b.lse)
            .map_err(cuda("cuMemcpyHtoD(poison lse)"))?;
        Ok(())
    }

    /// Enqueues one forward launch (no synchronisation).
    pub fn launch_fwd(
        &mut self,
        var: FwdVariant,
        heads: Heads,
        b: &mut FwdBuffers,
        scale: f32,
    ) -> Result<(), Error> {
        if var.head_dim != heads.head_dim {
            return Err(invalid(
                "kernel head_dim",
                var.head_dim,
                format!("the data's head_dim {}", heads.head_dim),
            ));
        }
        if b.n_tiles == 0 {
            return Ok(());
        }
        let f = self.fwd_kernel(var)?;
        let cfg = LaunchConfig {
            grid_dim: (b.n_tiles, heads.h_q, 1),
            block_dim: (32 * var.nwarps, 1, 1),
            shared_mem_bytes: var.smem_bytes(),
        };
        let (hq, hkv) = (heads.h_q as i32, heads.h_kv as i32);
        let scale_log2 = scale * std::f32::consts::LOG2_E;
        let mut l = self.stream.launch_builder(&f);
        l.arg(&b.q)
            .arg(&b.k)
            .arg(&b.v)
            .arg(&mut b.o)
            .arg(&mut b.lse)
            .arg(&b.units)
            .arg(&b.tiles)
            .arg(&hq)
            .arg(&hkv)
            .arg(&scale_log2);
        // SAFETY: argument order and types match `attn_fwd`'s signature; buffer sizes were
        // checked in `upload` against the layout the tiles/units index.
        unsafe { l.launch(cfg) }.map_err(cuda("cuLaunchKernel(attn_fwd)"))?;
        self.ctx
            .check_err()
            .map_err(cuda("attn_fwd (async error)"))?;
        Ok(())
    }

    /// Waits for the stream and surfaces any asynchronous error.
    pub fn sync(&self) -> Result<(), Error> {
        self.stream
            .synchronize()
            .map_err(cuda("cuStreamSynchronize"))
    }

    /// Times `reps` launches, each between its own pair of CUDA events, after `warmup` untimed
    /// ones. Returns per-launch milliseconds.
    pub fn time_fwd(
        &mut self,
        var: FwdVariant,
        heads: Heads,
        b: &mut FwdBuffers,
        scale: f32,
        warmup: usize,
        reps: usize,
    ) -> Result<Vec<f64>, Error> {
        for _ in 0..warmup {
            self.launch_fwd(var, heads, b, scale)?;
        }
        self.sync()?;
        let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let mut evs = Vec::with_capacity(reps + 1);
        for _ in 0..=reps {
            evs.push(self.ctx.new_event(flags).map_err(cuda("cuEventCreate"))?);
        }
        evs[0].record(&self.stream).map_err(cuda("cuEventRecord"))?;
        self.last_timing_start_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(0.0);
        let mut pairs = Vec::with_capacity(reps);
        // Back-to-back launches with an event between each: launch i is timed by (ev[i], ev[i+1]).
        for i in 0..reps {
            self.launch_fwd(var, heads, b, scale)?;
            evs[i + 1]
                .record(&self.stream)
                .map_err(cuda("cuEventRecord"))?;
            pairs.push(i);
        }
        self.sync()?;
        pairs
            .iter()
            .map(|&i| {
                evs[i]
                    .elapsed_ms(&evs[i + 1])
                    .map(f64::from)
                    .map_err(cuda("cuEventElapsedTime"))
            })
            .collect()
    }

    /// Times `reps` device-to-device copies of `bytes` bytes (one buffer to another on this
    /// GPU), each between its own pair of CUDA events, after `warmup` untimed ones. Returns
    /// per-copy milliseconds. On one GPU this measures HBM (read + write), not a network.
    pub fn time_copy(&self, bytes: usize, warmup: usize, reps: usize) -> Result<Vec<f64>, Error> {
        if bytes == 0 {
            return Ok(vec![0.0; reps]);
        }
        let src = self
            .stream
            .alloc_zeros::<u8>(bytes)
            .map_err(cuda("cuMemAlloc(copy src)"))?;
        let mut dst = self
            .stream
            .alloc_zeros::<u8>(bytes)
            .map_err(cuda("cuMemAlloc(copy dst)"))?;
        for _ in 0..warmup {
            self.stream
                .memcpy_dtod(&src, &mut dst)
                .map_err(cuda("cuMemcpyDtoDAsync"))?;
        }
        self.sync()?;
        let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let mut evs = Vec::with_capacity(reps + 1);
        for _ in 0..=reps {
            evs.push(self.ctx.new_event(flags).map_err(cuda("cuEventCreate"))?);
        }
        evs[0].record(&self.stream).map_err(cuda("cuEventRecord"))?;
        for ev in evs.iter().skip(1) {
            self.stream
                .memcpy_dtod(&src, &mut dst)
                .map_err(cuda("cuMemcpyDtoDAsync"))?;
            ev.record(&self.stream).map_err(cuda("cuEventRecord"))?;
        }
        self.sync()?;
        (0..reps)
            .map(|i| {
                evs[i]
                    .elapsed_ms(&evs[i + 1])
                    .map(f64::from)
                    .map_err(cuda("cuEventElapsedTime"))
            })
            .collect()
    }

    /// Copies O and LSE back.
    pub fn download(&self, b: &FwdBuffers) -> Result<(Vec<u16>, Vec<f32>), Error> {
        let o = self
            .stream
            .clone_dtoh(&b.o)
            .map_err(cuda("cuMemcpyDtoH(o)"))?;
        let l = self
            .stream
            .clone_dtoh(&b.lse)
            .map_err(cuda("cuMemcpyDtoH(lse)"))?;
        Ok((o, l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_parse_and_size_their_tiles() {
        let v = FwdVariant::parse("v2w4", 128).unwrap();
        assert_eq!(v, FwdVariant::v2(128, 4));
        assert_eq!(v.block_m(), 128);
        assert_eq!(v.smem_bytes(), (128 + 256) * 128 * 2);
        assert_eq!(v.label(), "fwd-v2-d128-w4");
        assert_eq!(FwdVariant::parse("v1w8", 64).unwrap().block_m(), 128);
        assert_eq!(FwdVariant::v1(128, 4).smem_bytes(), 80 * 1024);
        assert_eq!(FwdVariant::parse("v3w8", 128).unwrap().block_m(), 256);
        for bad in ["v4w4", "v1w5", "w4", "v1", "v1wx", ""] {
            assert!(FwdVariant::parse(bad, 128).is_err(), "{bad}");
        }
    }
}
