//! Opening the devices while the model loads. The CUDA driver's start (`cuInit`, the context, the
//! kernel modules: about 0.6 s on the H200 machine) needs nothing of the model, and the ONNX import
//! (about 0.35 s for W1's 125 MB export) needs nothing of the device, so
//! [`super::Engine::from_file`] runs them on two threads: the engine is ready after the longer of
//! the two, not after their sum.
//!
//! What a caller sees does not depend on the overlap. Errors come out in the order the sequential
//! start gives them: the model's (load, then validation), then the device list's, then the
//! device's; a bad model file is reported as such even when no device would open. The device
//! thread is always joined before an error goes up, so it is never left inside the driver while
//! the process exits. A list of CPUs alone opens on the caller's thread after the load, as
//! before: the CPU backend is made in microseconds.

use super::parts::Worker;
use crate::backend::Device;
use crate::{Error, Result};
use std::thread::JoinHandle;
use std::time::Instant;

/// The opened devices: one worker per entry of the list, and the device each became (`Auto`
/// resolved to the CPU or `cuda:0`).
pub(super) struct Opened {
    pub workers: Vec<Worker>,
    pub devices: Vec<Device>,
}

/// Checks `list` and opens its devices in order, on this thread.
pub(super) fn open_all(list: &[Device]) -> Result<Opened> {
    super::check_devices(list)?;
    let t = Instant::now();
    let mut workers = Vec::with_capacity(list.len());
    let mut devices = Vec::with_capacity(list.len());
    for &d in list {
        let (w, dev) = Worker::open(d)?;
        workers.push(w);
        devices.push(dev);
    }
    let names: Vec<&str> = workers.iter().map(|w| w.name.as_str()).collect();
    tracing::debug!(
        "device start in {:.0} ms: {}",
        t.elapsed().as_secs_f64() * 1e3,
        names.join(" + ")
    );
    Ok(Opened { workers, devices })
}

/// Whether opening `list` is worth a thread of its own: it names a device other than the CPU.
pub(super) fn worth_a_thread(list: &[Device]) -> bool {
    list.iter().any(|&d| d != Device::Cpu)
}

/// Runs `load` on this thread and opens the devices of `list`: on a thread of their own started
/// first when `concurrent`, else after the load. `load`'s error wins over the devices'.
pub(super) fn load_and_open<T>(
    list: &[Device],
    concurrent: bool,
    load: impl FnOnce() -> Result<T>,
) -> Result<(T, Opened)> {
    let list = list.to_vec();
    overlap(move || open_all(&list), concurrent, load)
}

/// `load` on this thread while `open` runs on a thread named `voxtile-device` (when
/// `concurrent` and a thread can be started; else `open` after `load`). The thread is joined
/// before anything returns; `load`'s error wins, then `open`'s.
fn overlap<T, D: Send + 'static>(
    open: impl FnOnce() -> Result<D> + Clone + Send + 'static,
    concurrent: bool,
    load: impl FnOnce() -> Result<T>,
) -> Result<(T, D)> {
    let t = Instant::now();
    let opener = if concurrent {
        spawn(open.clone())
    } else {
        None
    };
    let loaded = load();
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let Some(opener) = opener else {
        return Ok((loaded?, open()?));
    };
    let t_wait = Instant::now();
    let opened = join(opener);
    let wait_ms = t_wait.elapsed().as_secs_f64() * 1e3;
    let loaded = match loaded {
        Ok(v) => v,
        Err(e) => {
            if let Err(d) = &opened {
                tracing::debug!("device start failed too (the model's error wins): {d}");
            }
            return Err(e);
        }
    };
    tracing::debug!(
        "engine init {:.0} ms: model load {load_ms:.0} ms while the devices started, then {wait_ms:.0} ms waiting for them",
        t.elapsed().as_secs_f64() * 1e3
    );
    Ok((loaded, opened?))
}

/// Starts `open` on a thread named `voxtile-device` that logs to this thread's subscriber; None
/// when no thread can be started.
fn spawn<D: Send + 'static>(
    open: impl FnOnce() -> Result<D> + Send + 'static,
) -> Option<JoinHandle<Result<D>>> {
    let dispatch = tracing::dispatcher::get_default(|d| d.clone());
    std::thread::Builder::new()
        .name("voxtile-device".into())
        .spawn(move || tracing::dispatcher::with_default(&dispatch, open))
        .inspect_err(|e| {
            tracing::debug!("no device thread ({e}): the devices open after the model")
        })
        .ok()
}

/// The device thread's result; a panic there (a bug, already reported by the panic hook) is one
/// error line, as the input reader's is.
fn join<D>(opener: JoinHandle<Result<D>>) -> Result<D> {
    opener.join().unwrap_or_else(|_| {
        Err(Error::Backend(
            "opening the devices stopped on an internal error".into(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, Options};
    use ndarray::Array4;
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/deepbrain.onnx");

    /// An explicit budget: the default, half the RAM available when each engine is built, moves
    /// between two builds while other processes run.
    fn cpu() -> Options {
        Options {
            device: Device::Cpu,
            roi: Some([16; 3]),
            keep_logits: true,
            memory_budget: Some(1 << 30),
            ..Options::default()
        }
    }

    /// A copy of the first kilobyte of the model: not a valid protobuf.
    fn truncated_model() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("cut.onnx");
        std::fs::write(&bad, &std::fs::read(MODEL).unwrap()[..1000]).unwrap();
        (dir, bad)
    }

    #[test]
    fn the_concurrent_start_builds_the_sequential_engine() {
        let mut a = Engine::load_and_open(Path::new(MODEL), cpu(), true).unwrap();
        let mut b = Engine::new(crate::model::onnx::load(MODEL).unwrap(), cpu()).unwrap();
        assert_eq!(a.graph(), b.graph());
        assert_eq!(a.device_name(), b.device_name());
        assert_eq!(a.memory_budget(), b.memory_budget());
        assert_eq!(a.model_path(), Some(Path::new(MODEL)));
        let x = Array4::from_shape_fn((1, 20, 18, 17), |(_, i, j, k)| {
            ((i * 7 + j * 3 + k) % 11) as f32 / 5.0 - 1.0
        });
        let sa = a.segment_array(x.view(), &mut |_, _| {}).unwrap();
        let sb = b.segment_array(x.view(), &mut |_, _| {}).unwrap();
        assert!(sa.report.windows > 1, "{}", sa.report.windows);
        assert_eq!(sa.labels, sb.labels);
        assert_eq!(sa.logits, sb.logits);
    }

    #[test]
    fn a_bad_model_is_its_one_line_error_while_the_device_start_is_pending() {
        let (_dir, bad) = truncated_model();
        let sequential = crate::model::onnx::load(&bad).unwrap_err().to_string();
        let failed = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicBool::new(false));
        let (f, done) = (failed.clone(), finished.clone());
        // The device start ends (in an error of its own) only after the load has failed.
        let open = move || {
            let t = Instant::now();
            while !f.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(30));
            done.store(true, Ordering::SeqCst);
            Err::<(), _>(Error::Backend("CUDA context creation failed".into()))
        };
        let load = || {
            let r = crate::model::onnx::load(&bad);
            assert!(
                !finished.load(Ordering::SeqCst),
                "the device start is pending"
            );
            failed.store(true, Ordering::SeqCst);
            r
        };
        let e = overlap(open, true, load).unwrap_err().to_string();
        assert_eq!(e, sequential);
        assert!(e.contains("cut.onnx") && !e.contains('\n'), "{e}");
        assert!(
            finished.load(Ordering::SeqCst),
            "joined before the error went up"
        );
    }

    #[test]
    fn the_device_error_comes_after_a_good_load_either_way() {
        for concurrent in [true, false] {
            let open = || Err::<(), _>(Error::Backend("CUDA device 3 does not exist".into()));
            let e = overlap(open, concurrent, || Ok(1)).unwrap_err().to_string();
            assert_eq!(e, "CUDA device 3 does not exist", "{concurrent}");
            let ok = overlap(|| Ok("opened"), concurrent, || Ok(2)).unwrap();
            assert_eq!(ok, (2, "opened"));
        }
    }

    #[test]
    fn a_panic_on_the_device_thread_is_one_error_line() {
        let open = || -> Result<()> { panic!("a bug on the device thread") };
        let e = overlap(open, true, || Ok(())).unwrap_err().to_string();
        assert!(
            e.contains("opening the devices stopped on an internal error"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn errors_keep_the_sequential_order_on_real_device_lists() {
        let (_dir, bad) = truncated_model();
        let sequential = crate::model::onnx::load(&bad).unwrap_err().to_string();
        for list in [vec![Device::Cuda(0)], vec![Device::Cuda(0), Device::Cpu]] {
            let bad_load = || crate::model::onnx::load(&bad);
            let e = load_and_open(&list, true, bad_load).err().unwrap();
            assert_eq!(e.to_string(), sequential, "{list:?}");
        }
        let mixed = [Device::Cuda(0), Device::Cpu];
        let e = load_and_open(&mixed, true, || Ok(())).err().unwrap();
        assert!(e.to_string().contains("mix the CPU and CUDA"), "{e}");
        assert!(worth_a_thread(&mixed) && worth_a_thread(&[Device::Auto]));
        assert!(!worth_a_thread(&[Device::Cpu, Device::Cpu]));
    }
}
