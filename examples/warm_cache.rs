//! Fills the kernel cache for a device that is not here: every family's NVRTC image for `arch`
//! (default sm_90) keyed as a device whose driver reports `driver` (cuDriverGetVersion; default
//! 13000, CUDA 13.0) will look it up, into `$XDG_CACHE_HOME/voxtile`. `tests/gpu/build.sh` ships
//! it in the bundle, so a fresh device machine reads its families rather than compiling them
//! (a minute or more of a call's time). A key that does not match there costs nothing: the
//! device compiles as before.
//!   XDG_CACHE_HOME=DIR cargo run --release --example warm_cache -- [arch] [driver]
use voxtile::internals::cuda::runtime::compile::{images_of, targets_for};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let arch = a.get(1).map_or("sm_90", String::as_str);
    let driver: i32 = a
        .get(2)
        .map_or(Ok(13000), |d| d.parse())
        .unwrap_or_else(|e| {
            eprintln!("warm_cache: driver version {:?}: {e}", a[2]);
            std::process::exit(2)
        });
    let targets = targets_for(arch);
    let mut failed = false;
    for ((unit, t), got) in targets.iter().zip(images_of(&targets, driver)) {
        match got {
            Ok((_, cached, ms)) => {
                println!(
                    "{} {t}: {} in {ms:.0} ms",
                    unit.label(),
                    if cached { "cached" } else { "compiled" }
                )
            }
            Err(e) => {
                eprintln!("warm_cache: {} {t}: {e}", unit.label());
                failed = true;
            }
        }
    }
    std::process::exit(i32::from(failed));
}
