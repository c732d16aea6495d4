//! Compiles every kernels/*.cu family with NVRTC (no GPU needed): any error or warning fails.
//! Skips with a message when libnvrtc cannot be loaded, unless VOXTILE_REQUIRE_NVRTC=1.
//! CI: LD_LIBRARY_PATH=<wheel>/nvidia/cu13/lib VOXTILE_CUDA_INCLUDE=<wheel>/nvidia/cu13/include.

use voxtile::backend::cuda::kernels;

#[test]
fn every_kernel_family_compiles_without_warnings() {
    let require = std::env::var("VOXTILE_REQUIRE_NVRTC")
        .map(|v| v == "1")
        .unwrap_or(false);
    if !kernels::nvrtc_present() {
        assert!(
            !require,
            "VOXTILE_REQUIRE_NVRTC=1 but libnvrtc could not be loaded (check LD_LIBRARY_PATH)"
        );
        println!("skipped: libnvrtc not found (set LD_LIBRARY_PATH to a CUDA 13.0 NVRTC)");
        return;
    }
    let (ma, mi) = kernels::nvrtc_version().expect("nvrtc version");
    println!(
        "NVRTC {ma}.{mi}, include dirs {:?}",
        kernels::include_dirs()
    );
    let mut failures = Vec::new();
    for arch in ["sm_90", "sm_80"] {
        for (name, src, entries) in kernels::FAMILIES {
            match kernels::compile_family(name, src, arch) {
                Ok(ptx) => {
                    for e in entries.iter() {
                        if !ptx.contains(&format!(".entry {e}(")) {
                            failures.push(format!(
                                "{name}.cu ({arch}): entry {e} missing from the PTX"
                            ));
                        }
                    }
                    println!("{name}.cu {arch}: {} bytes of PTX", ptx.len());
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "kernel build failures:\n{}",
        failures.join("\n")
    );
}
