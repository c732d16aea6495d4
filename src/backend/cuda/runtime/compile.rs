//! The NVRTC build of the catalogue's families with an on-disk cache of PTX and cubin (so that only
//! the first run on a machine pays for compilation, and a warm start loads machine code without
//! the driver's JIT), and their loading into a context.

use super::device::drv;
use crate::backend::cuda::host::catalogue::{
    halo_all, upsample_vec_name, upsample_vec_st_name, COMMON, CONV1X1_N16_S, CONV1X1_N32_S,
    CONV1X1_NORM_N16_S, CONV1X1_NORM_N32_S, FAMILIES, MMA_CONFIGS, WGK_CONFIGS,
};
use crate::backend::cuda::host::conv_kernel::ConvKernel;
use crate::backend::cuda::host::units::{units, Unit};
use crate::sys::notice::SUMMARY_TARGET;
use crate::{Error, Result};
use cudarc::driver::{sys, CudaContext, CudaFunction};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::PathBuf;
use std::sync::Arc;

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

/// What one family compiles to: PTX, and for a real architecture (`sm_XX`) the cubin NVRTC
/// builds alongside it. The cubin loads as is; the PTX is the fallback the driver JIT-compiles.
pub struct Image {
    pub ptx: String,
    pub cubin: Option<Vec<u8>>,
}

/// Compiles one family to PTX for `arch` (e.g. "sm_90"). Any warning is an error: the log must be
/// empty, so a sloppy kernel cannot slip through CI.
pub fn compile_family(name: &str, src: &str, arch: &str) -> Result<String> {
    compile_image(name, src, arch).map(|i| i.ptx)
}

/// Compiles one family for `arch` to PTX and, when `arch` is a real architecture, its cubin
/// (see [`compile_family`] for the warning rule).
pub fn compile_image(name: &str, src: &str, arch: &str) -> Result<Image> {
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
    let image = match compiled {
        Ok(()) if log.is_empty() => unsafe { nvrtc::get_ptx(prog) }
            .map(|p| Image {
                ptx: unsafe { CStr::from_ptr(p.as_ptr()) }
                    .to_string_lossy()
                    .into_owned(),
                // SAFETY: `prog` compiled successfully and is still live.
                cubin: if arch.starts_with("sm_") {
                    unsafe { get_cubin(prog) }
                } else {
                    None
                },
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
    image
}

/// The cubin of a compiled program; `None` when NVRTC has none (a virtual architecture).
///
/// # Safety
/// `prog` must be a live, successfully compiled program.
unsafe fn get_cubin(prog: nvrtc_sys::nvrtcProgram) -> Option<Vec<u8>> {
    let mut size = 0usize;
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) }
        .result()
        .ok()?;
    if size == 0 {
        return None;
    }
    let mut buf = vec![0u8; size];
    unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) }
        .result()
        .ok()?;
    buf.starts_with(b"\x7fELF").then_some(buf)
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

/// One family's image, from the disk cache when source, arch, NVRTC and driver match.
/// Returns (image, came_from_cache). A cache that cannot be written is not an error; a cached cubin
/// is optional (caches written before cubins were kept have PTX alone).
pub fn image_cached(
    name: &str,
    src: &str,
    arch: &str,
    driver_version: i32,
) -> Result<(Image, bool)> {
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
    let cubin_path = path.as_ref().map(|p| p.with_extension("cubin"));
    if let Some(p) = &path {
        if let Ok(ptx) = std::fs::read_to_string(p) {
            if ptx.contains(".entry") {
                let cubin = cubin_path
                    .as_ref()
                    .and_then(|c| std::fs::read(c).ok())
                    .filter(|c| c.starts_with(b"\x7fELF"));
                return Ok((Image { ptx, cubin }, true));
            }
        }
    }
    first_compile_notice(arch, path.as_deref());
    let image = compile_image(name, src, arch)?;
    // The cubin first: a reader that finds the PTX finds its cubin too.
    if let Some(c) = &image.cubin {
        cache_write(cubin_path.as_deref(), c);
    }
    cache_write(path.as_deref(), image.ptx.as_bytes());
    Ok((image, false))
}

/// Says once per process that the kernels are being compiled: a cold cache costs a first run
/// ~20 s on 16 cores (minutes on 2) that would otherwise pass in silence.
fn first_compile_notice(arch: &str, path: Option<&std::path::Path>) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let kept = match path.and_then(|p| p.parent()) {
            Some(d) => format!("kept in {} for later runs", d.display()),
            None => "not kept: neither XDG_CACHE_HOME nor HOME is set".into(),
        };
        tracing::info!(
            target: SUMMARY_TARGET,
            "compiling the CUDA kernels for {arch} (first run with this driver and NVRTC; {kept})"
        );
    });
}

/// Writes one cache file through a temporary name (readers never see half a file).
fn cache_write(path: Option<&std::path::Path>, bytes: &[u8]) {
    let Some(p) = path else { return };
    if let Some(dir) = p.parent() {
        let _ = std::fs::create_dir_all(dir);
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, bytes).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }
}

/// Loads one family: its cubin when there is one (no driver JIT), else (or when the driver
/// refuses the cubin) its PTX.
fn load_image(
    ctx: &Arc<CudaContext>,
    name: &str,
    image: Image,
) -> Result<Arc<cudarc::driver::CudaModule>> {
    if let Some(cubin) = image.cubin {
        match ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)) {
            Ok(m) => return Ok(m),
            Err(e) => tracing::debug!("kernels/{name}.cu: cubin refused ({e}); loading its PTX"),
        }
    }
    ctx.load_module(cudarc::nvrtc::Ptx::from_src(image.ptx))
        .map_err(drv(&format!("loading kernels/{name}.cu")))
}

/// Every program of the families that have a target for `arch`, with that target (see
/// [`units`]).
pub fn targets_for(arch: &str) -> Vec<(Unit, String)> {
    FAMILIES
        .iter()
        .filter_map(|f| f.target(arch).map(|t| (*f, t)))
        .flat_map(|(f, t)| units(f).map(move |u| (u, t.clone())))
        .collect()
}

/// Every family's image for a device of `arch`, from the cache or NVRTC (see [`images_of`]):
/// made before the device's context exists, so that a start reads them while the driver
/// creates it.
pub(crate) struct FamilyImages {
    targets: Vec<(Unit, String)>,
    images: Vec<Result<(Image, bool, f64)>>,
}

impl FamilyImages {
    /// The images of the families that have a target for `arch`.
    pub fn new(arch: &str, driver_version: i32) -> FamilyImages {
        let targets = targets_for(arch);
        let images = images_of(&targets, driver_version);
        FamilyImages { targets, images }
    }
}

/// Every entry point of every family, by name, loaded from `images` into `ctx`, and how many
/// families came from the cache. On sm_80+ the tiled conv kernels get their dynamic
/// shared memory limit raised to what their config needs (halo kernels only where the device's
/// opt-in limit `smem_optin` holds them).
pub(crate) fn load_all(
    ctx: &Arc<CudaContext>,
    images: FamilyImages,
    major: i32,
    smem_optin: usize,
) -> Result<(HashMap<&'static str, CudaFunction>, usize)> {
    let mut funcs = HashMap::new();
    let mut from_cache = 0;
    let FamilyImages { targets, images } = images;
    for ((unit, _), got) in targets.iter().zip(images) {
        let name = unit.label();
        let (image, cached, got) = got?;
        from_cache += cached as usize;
        let t = std::time::Instant::now();
        let kind = if image.cubin.is_some() {
            "cubin"
        } else {
            "PTX"
        };
        let module = load_image(ctx, &name, image)?;
        let loaded = t.elapsed().as_secs_f64() * 1e3;
        for e in unit.entries() {
            let f = module
                .load_function(e)
                .map_err(drv(&format!("loading kernel {e}")))?;
            funcs.insert(e, f);
        }
        // Where a start's time goes (W3): the image from the cache or NVRTC, the driver's load.
        tracing::debug!(
            "kernels/{name}.cu: {kind} from {} in {got:.1} ms, module load {loaded:.1} ms, functions {:.1} ms",
            if cached { "the cache" } else { "NVRTC" },
            t.elapsed().as_secs_f64() * 1e3 - loaded
        );
    }
    if major >= 8 {
        for (name, bytes) in smem_limits(smem_optin) {
            if let Some(f) = funcs.get(name) {
                f.set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                )
                .map_err(drv(&format!("shared memory limit of {name}")))?;
            }
        }
    }
    Ok((funcs, from_cache))
}

/// The kernels (sm_80+) whose dynamic shared memory passes the default 48 KB, with the bytes
/// their launches ask: a kernel missing here fails its launch ("invalid argument"). The halo
/// kernels only where the device's opt-in limit `smem_optin` holds them.
fn smem_limits(smem_optin: usize) -> Vec<(&'static str, u32)> {
    let halo = halo_all()
        .filter(|c| c.smem_bytes() as usize <= smem_optin)
        .map(|c| (c.name, c.smem_bytes()));
    // The mma conv tiles, their convt_up twins and those twins' `_st` twins share the tile's
    // shared memory.
    let mma = MMA_CONFIGS.iter().flat_map(|c| {
        let up = upsample_vec_name(c.name);
        let st = up.and_then(upsample_vec_st_name);
        std::iter::once(c.name)
            .chain(up)
            .chain(st)
            .map(move |n| (n, c.smem_bytes()))
    });
    // The staged heads (and their twins that normalise on load) pass 48 KB from Cin 64 on
    // (at Cout 32 always); they may take Cin 256.
    let heads = [
        (16, [CONV1X1_N16_S, CONV1X1_NORM_N16_S]),
        (32, [CONV1X1_N32_S, CONV1X1_NORM_N32_S]),
    ]
    .into_iter()
    .flat_map(|(nc, kernels)| {
        let bytes = ConvKernel::Pointwise {
            nc,
            staged: true,
            mma: false,
        }
        .pointwise_smem(256) as u32;
        kernels.into_iter().map(move |k| (k.name, bytes))
    });
    let wgk = WGK_CONFIGS
        .iter()
        .filter(|c| c.smem_bytes() as usize <= smem_optin)
        .map(|c| (c.name, c.smem_bytes()));
    halo.chain(mma).chain(heads).chain(wgk).collect()
}

/// The image of each (program, architecture) in `targets`, from the cache or NVRTC, whether it
/// came from the cache and the milliseconds it took, in `targets` order. The programs build on
/// rayon's threads: a cold start compiles every one (minutes one after the other), and NVRTC
/// programs are independent (their cache files too).
pub fn images_of(
    targets: &[(Unit, String)],
    driver_version: i32,
) -> Vec<Result<(Image, bool, f64)>> {
    targets
        .par_iter()
        .map(|(unit, arch)| {
            let t = std::time::Instant::now();
            let (image, cached) =
                image_cached(&unit.label(), &unit.source(), arch, driver_version)?;
            Ok((image, cached, t.elapsed().as_secs_f64() * 1e3))
        })
        .collect()
}

/// Compiles each (program, architecture) of `targets` with NVRTC, no cache, on rayon's threads
/// (see [`compile_image`]), in `targets` order.
pub fn compile_all(targets: &[(Unit, String)]) -> Vec<Result<Image>> {
    targets
        .par_iter()
        .map(|(unit, arch)| compile(*unit, arch))
        .collect()
}

/// Compiles `unit` for `arch` (see [`compile_image`]).
pub fn compile(unit: Unit, arch: &str) -> Result<Image> {
    compile_image(&unit.label(), &unit.source(), arch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::host::catalogue::{UPSAMPLE_VEC, UPSAMPLE_VEC_ST};

    /// Every mma tile's staged twins (`convt_up_*`, their `_st` twins) get the tile's limit:
    /// the `_st` twins once missed it and failed their first launch.
    #[test]
    fn every_mma_twin_gets_its_tiles_shared_memory() {
        let limits: HashMap<_, _> = smem_limits(227 * 1024).into_iter().collect();
        let tile = |name: &str| MMA_CONFIGS.iter().find(|c| c.name == name).unwrap();
        for (mma, up) in UPSAMPLE_VEC {
            assert_eq!(limits.get(up), Some(&tile(mma).smem_bytes()), "{up}");
            for (_, st) in UPSAMPLE_VEC_ST.iter().filter(|(b, _)| b == up) {
                assert_eq!(limits.get(st), Some(&tile(mma).smem_bytes()), "{st}");
            }
        }
        assert!(UPSAMPLE_VEC_ST
            .iter()
            .all(|(b, _)| UPSAMPLE_VEC.iter().any(|(_, u)| u == b)));
    }
}
