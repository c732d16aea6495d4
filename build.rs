//! Compiles the vendored ONNX schema subset with protox (pure Rust, no protoc on the machine).
fn main() {
    println!("cargo:rerun-if-changed=proto/onnx_subset.proto");
    let fds = protox::compile(["onnx_subset.proto"], ["proto"])
        .expect("proto/onnx_subset.proto compiles");
    prost_build::Config::new()
        .compile_fds(fds)
        .expect("prost generates the ONNX types");
}
