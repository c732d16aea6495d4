//! Compiles the vendored ONNX schema subset with protox (pure Rust, no protoc on the machine).
fn main() {
    println!("cargo:rerun-if-changed=proto/onnx_subset.proto");
    let fds = protox::compile(["onnx_subset.proto"], ["proto"])
        .expect("proto/onnx_subset.proto compiles");
    // Tensor payloads as `Bytes`: decoded from the file's own buffer they are views into it, not
    // copies (a 125 MB model was read once and copied once more, tensor by tensor).
    prost_build::Config::new()
        .bytes([".onnx.TensorProto.raw_data"])
        .compile_fds(fds)
        .expect("prost generates the ONNX types");
}
