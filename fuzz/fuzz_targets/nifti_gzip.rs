//! The same reader through its gzip path: the input is gzip-compressed first, so the fuzzer
//! mutates the decompressed file (headers, data lengths) while the decoder and the capped,
//! incremental read of compressed streams are exercised. A raw input starting with the gzip magic
//! is also fed as-is, to reach the decoder's own error paths (bad CRC, cut stream).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::Write;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let p = Path::new("fuzz.nii.gz");
    if data.len() >= 2 && data[0] == 0x1f && data[1] == 0x8b {
        let _ = voxtile::volume::read_bytes(data, p);
        return;
    }
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    let z = e.finish().unwrap();
    if let Ok(v) = voxtile::volume::read_bytes(&z, p) {
        assert!(v.header.gzipped);
        let _ = voxtile::volume::describe(p, &v);
    }
});
