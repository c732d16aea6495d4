//! The single-window API (`Backend::run`): one batch of f32 NCDHW windows in, through the
//! prepared launch list, f32 NCDHW out, via pinned and device staging made on first use.

use super::launch_list::{Prepared, SingleWindow, Steps};
use crate::backend::cuda::host::catalogue::{NCDHW_TO_NDHWC, NDHWC_TO_NCDHW};
use crate::backend::cuda::runtime::device::{drv, DevBuf};
use crate::backend::cuda::runtime::launch::{Arg, Gpu};
use crate::{Error, Result};
use cudarc::driver::result as cu;
use ndarray::{Array5, ArrayView5};

/// Runs `input` (`[n <= batch, C_in, roi]`) through `prep`; `poison` fills the activations
/// with NaN first.
pub(crate) fn run_single(
    gpu: &Gpu,
    prep: &mut Prepared,
    input: ArrayView5<f32>,
    poison: bool,
) -> Result<Array5<f32>> {
    let (n, c, d, h, w) = input.dim();
    if n == 0 || n > prep.batch || c != prep.cin || [d, h, w] != prep.roi {
        return Err(Error::Invalid(format!(
            "input {:?} does not fit the prepared [<= {}, {}, {:?}]",
            input.dim(),
            prep.batch,
            prep.cin,
            prep.roi
        )));
    }
    let in_len = n * c * d * h * w;
    if prep.single.is_none() {
        let (bi, bo) = prep.stage_bytes;
        // SAFETY: host buffers are written before they are read. Flags 0: cached (not
        // write-combined) memory, fast to read back on the host.
        let host_in = unsafe { gpu.ctx.alloc_pinned_with_flags::<f32>(bi / 4, 0) }
            .map_err(drv("pinned allocation"))?;
        let host_out = unsafe { gpu.ctx.alloc_pinned_with_flags::<f32>(bo / 4, 0) }
            .map_err(drv("pinned allocation"))?;
        prep.single = Some(SingleWindow {
            stage_in: DevBuf::new(&gpu.ctx, bi)?,
            stage_out: DevBuf::new(&gpu.ctx, bo)?,
            host_in,
            host_out,
        });
    }
    let single = prep.single.as_mut().expect("made above");
    {
        let hs = single
            .host_in
            .as_mut_slice()
            .map_err(drv("pinned access"))?;
        for (dst, src) in hs[..in_len].iter_mut().zip(input.iter()) {
            *dst = *src;
        }
    }
    let s = &*gpu.stream;
    let hs = single.host_in.as_slice().map_err(drv("pinned access"))?;
    // SAFETY: stage_in holds batch*cin*roi floats >= in_len; synchronised before returning.
    unsafe { cu::memcpy_htod_async(single.stage_in.ptr, &hs[..in_len], s.cu_stream()) }
        .map_err(drv("upload"))?;
    let (stage_in, stage_out) = (single.stage_in.ptr, single.stage_out.ptr);
    if poison {
        prep.poison(gpu)?;
    }
    let sp = d * h * w;
    gpu.eltwise(
        s,
        NCDHW_TO_NDHWC.name,
        in_len,
        &mut [
            Arg::Ptr(stage_in),
            Arg::Ptr(prep.input),
            Arg::I32(n as i32),
            Arg::I32(c as i32),
            Arg::I64(sp as i64),
        ],
    )?;
    let [od, oh, ow] = prep.out_spatial;
    let osp = od * oh * ow;
    let out_len = n * prep.cout * osp;
    let to_ncdhw = |src: u64, dst: u64, windows: usize| {
        gpu.eltwise(
            s,
            NDHWC_TO_NCDHW.name,
            windows * prep.cout * osp,
            &mut [
                Arg::Ptr(src),
                Arg::Ptr(dst),
                Arg::I32(windows as i32),
                Arg::I32(prep.cout as i32),
                Arg::I64(osp as i64),
            ],
        )
    };
    prep.run_part(gpu, Steps::Front(n))?;
    if prep.back {
        // Each window's output exists between its back steps and the next window's.
        for b in 0..n {
            prep.run_part(gpu, Steps::Back(b))?;
            let dst = stage_out + (b * prep.cout * osp * 4) as u64;
            to_ncdhw(prep.window_output(b), dst, 1)?;
        }
    } else {
        to_ncdhw(prep.output, stage_out, n)?;
    }
    let cout = prep.cout;
    let single = prep.single.as_mut().expect("made above");
    let ho = single
        .host_out
        .as_mut_slice()
        .map_err(drv("pinned access"))?;
    // SAFETY: host_out holds >= out_len floats; synchronised right after.
    unsafe { cu::memcpy_dtoh_async(&mut ho[..out_len], stage_out, s.cu_stream()) }
        .map_err(drv("download"))?;
    s.synchronize().map_err(drv("running the graph"))?;
    let v = ho[..out_len].to_vec();
    Array5::from_shape_vec((n, cout, od, oh, ow), v)
        .map_err(|e| Error::Backend(format!("output shape: {e}")))
}
