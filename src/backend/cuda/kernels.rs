//! Our kernel sources (kernels/*.cu, embedded) and their NVRTC build with an on-disk PTX cache,
//! so that only the first run on a machine pays for compilation.

use crate::{Error, Result};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use sha2::{Digest, Sha256};
use std::ffi::{CStr, CString};
use std::path::PathBuf;

/// Prepended to every family: activation codes and helpers shared by the epilogues.
const COMMON: &str = include_str!("../../../kernels/common.cuh");

/// One entry per kernel family (one .cu file each) and the `extern "C"` kernels it defines.
pub const FAMILIES: &[(&str, &str, &[&str])] = &[
    (
        "conv",
        include_str!("../../../kernels/conv.cu"),
        &[
            "conv_igemm_n64_v8",
            "conv_igemm_n32_v8",
            "conv_igemm_n64_v1",
            "conv_igemm_n32_v1",
            "conv_mma_m256n32_v8",
            "conv_mma_m128n32_v8",
            "conv_mma_m128n64_v8",
            "conv_mma_m128n128_v8",
            "conv_mma_m128n32_v2",
            "conv_mma_m128n64_v2",
            "conv_mma_m128n32_v1",
            "conv_mma_m128n64_v1",
            "conv1x1_n16",
            "conv1x1_n32",
            "convt_up_m256n32_v8",
            "convt_up_m128n32_v8",
            "convt_up_m128n64_v8",
            "convt_up_m128n128_v8",
            "conv_c1_k3",
            "conv_halo_c32n32",
            "conv_halo_c64n32",
            "conv_halo_c32n64",
            "conv_halo_c64n64",
            "conv_halo_c32n32_w4",
            "conv_halo_c64n32_w4",
            "conv_halo_c32n32_r",
            "conv_halo_c32n32_rp",
            "conv_halo_c32n32_rp2",
            "conv_halo_c32n32_rb",
            "conv_halo_c32n32_s4",
            "conv_halo_c64n32_s4",
            "conv_halo_c64n32_rp",
            "conv_halo_c64n64_b",
            "conv_halo_c32n32_x16",
            "conv_halo_c32n32_y8",
            "conv_halo_c16n16",
            "conv_halo_c16n16_w8",
            "conv_halo_c16n32",
            "conv_halo_c16n16_r",
            "conv_halo_c16n16_rp2",
            "conv_halo_c64n64_h2",
            "conv_halo_c32n64_h2",
        ],
    ),
    (
        "conv_transpose",
        include_str!("../../../kernels/conv_transpose.cu"),
        &["conv_direct"],
    ),
    (
        "norm",
        include_str!("../../../kernels/norm.cu"),
        &[
            "norm_partial_v8",
            "norm_partial",
            "norm_finalize",
            "affine_act",
            "affine_act_v8",
        ],
    ),
    (
        "eltwise",
        include_str!("../../../kernels/eltwise.cu"),
        &[
            "act_kernel",
            "binary_kernel",
            "binary_const_kernel",
            "concat_copy",
            "concat_copy_v8",
            "binary_v8",
            "act_v8",
            "copy_half",
            "fill_half",
            "softmax_channels",
            "ncdhw_to_ndhwc",
            "ndhwc_to_ncdhw",
        ],
    ),
    (
        "pool_resize",
        include_str!("../../../kernels/pool_resize.cu"),
        &["pool_kernel", "resize_kernel"],
    ),
    (
        "blend",
        include_str!("../../../kernels/blend.cu"),
        &[
            "blend_window_ring",
            "finalize_planes",
            "finalize_planes_v4",
            "gather_window_ring",
        ],
    ),
];

/// Whether libnvrtc can be loaded (cudarc panics on first use when it cannot).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library names cudarc would use.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// NVRTC's (major, minor) version; part of the cache key.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_present() {
        return Err(no_nvrtc());
    }
    let (mut a, mut b) = (0, 0);
    // SAFETY: the library is present; both pointers are valid for the call.
    unsafe { nvrtc_sys::nvrtcVersion(&mut a, &mut b) }
        .result()
        .map_err(|e| Error::Backend(format!("nvrtcVersion failed: {e}")))?;
    Ok((a, b))
}

fn no_nvrtc() -> Error {
    Error::Backend(
        "no NVRTC found (libnvrtc.so): install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and add \
         its lib folder to LD_LIBRARY_PATH"
            .into(),
    )
}

/// Include folders for NVRTC (cuda_fp16.h, mma.h): `VOXTILE_CUDA_INCLUDE` (':'-separated) first,
/// then `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`, those that exist.
pub fn include_dirs() -> Vec<String> {
    let mut dirs: Vec<String> = Vec::new();
    if let Ok(v) = std::env::var("VOXTILE_CUDA_INCLUDE") {
        dirs.extend(v.split(':').filter(|s| !s.is_empty()).map(String::from));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(v) = std::env::var(var) {
            dirs.push(format!("{v}/include"));
        }
    }
    dirs.push("/usr/local/cuda/include".into());
    let mut out: Vec<String> = Vec::new();
    for d in dirs {
        if std::path::Path::new(&d).join("cuda_fp16.h").exists() && !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

/// The full source NVRTC sees for one family.
pub fn family_source(src: &str) -> String {
    format!("{COMMON}\n{src}")
}

/// Compiles one family to PTX for `arch` (e.g. "sm_90"). Any warning is an error: the log must be
/// empty, so a sloppy kernel cannot slip through CI.
pub fn compile_family(name: &str, src: &str, arch: &str) -> Result<String> {
    if !nvrtc_present() {
        return Err(no_nvrtc());
    }
    let incs = include_dirs();
    if incs.is_empty() {
        return Err(Error::Backend(
            "no CUDA headers found (cuda_fp16.h): set VOXTILE_CUDA_INCLUDE to the CUDA include folder".into(),
        ));
    }
    let full = family_source(src);
    let csrc = CString::new(full)
        .map_err(|_| Error::Backend(format!("kernel {name}.cu contains a NUL byte")))?;
    let cname = CString::new(format!("{name}.cu")).expect("static kernel name");
    let mut opts: Vec<String> = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--use_fast_math".into(),
    ];
    opts.extend(incs.iter().map(|d| format!("--include-path={d}")));
    let prog = nvrtc::create_program(&csrc, Some(&cname))
        .map_err(|e| Error::Backend(format!("NVRTC could not create program {name}.cu: {e}")))?;
    // SAFETY: `prog` is a live program; the options are valid C strings.
    let compiled = unsafe { nvrtc::compile_program(prog, &opts) };
    // SAFETY: as above; the log is NUL-terminated by NVRTC.
    let log = unsafe { nvrtc::get_program_log(prog) }
        .ok()
        .map(|l| {
            unsafe { CStr::from_ptr(l.as_ptr()) }
                .to_string_lossy()
                .trim()
                .to_string()
        })
        .unwrap_or_default();
    let ptx = match compiled {
        Ok(()) if log.is_empty() => unsafe { nvrtc::get_ptx(prog) }
            .map(|p| {
                unsafe { CStr::from_ptr(p.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            })
            .map_err(|e| Error::Backend(format!("NVRTC gave no PTX for {name}.cu: {e}"))),
        Ok(()) => Err(Error::Backend(format!(
            "kernels/{name}.cu compiled with warnings for {arch}: {log}"
        ))),
        Err(e) => Err(Error::Backend(format!(
            "kernels/{name}.cu failed to compile for {arch} ({e}): {log}"
        ))),
    };
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    ptx
}

fn cache_dir() -> Option<PathBuf> {
    if let Ok(x) = std::env::var("XDG_CACHE_HOME") {
        if !x.is_empty() {
            return Some(PathBuf::from(x).join("voxtile"));
        }
    }
    std::env::var("HOME")
        .ok()
        .map(|h| PathBuf::from(h).join(".cache").join("voxtile"))
}

/// PTX for one family, from the disk cache when source, arch, NVRTC and driver match.
/// Returns (ptx, came_from_cache). A cache that cannot be written is not an error.
pub fn ptx_cached(
    name: &str,
    src: &str,
    arch: &str,
    driver_version: i32,
) -> Result<(String, bool)> {
    let (ma, mi) = nvrtc_version()?;
    let mut h = Sha256::new();
    h.update(family_source(src).as_bytes());
    h.update(format!("|{arch}|nvrtc{ma}.{mi}|driver{driver_version}|fastmath").as_bytes());
    let key: String = h
        .finalize()
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect();
    let path = cache_dir().map(|d| d.join(format!("{name}-{arch}-{key}.ptx")));
    if let Some(p) = &path {
        if let Ok(s) = std::fs::read_to_string(p) {
            if s.contains(".entry") {
                return Ok((s, true));
            }
        }
    }
    let ptx = compile_family(name, src, arch)?;
    if let Some(p) = &path {
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
            let tmp = p.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, &ptx).is_ok() {
                let _ = std::fs::rename(&tmp, p);
            }
        }
    }
    Ok((ptx, false))
}
