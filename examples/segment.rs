//! Segment a NIfTI file with an ONNX model through the library, in about twenty lines.
//!
//! cargo run --release --example segment -- data/mni_t1_128.nii.gz data/deepbrain.onnx /tmp/mask.nii.gz

use voxtile::engine::{Engine, Options};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, input, model, output] = args.as_slice() else {
        return Err("usage: segment INPUT.nii.gz MODEL.onnx OUTPUT.nii.gz".into());
    };
    let volume = voxtile::volume::read(input.as_ref())?;
    let mut engine = Engine::from_file(model.as_ref(), Options::default())?;
    let seg = engine.segment(&volume)?;
    let labelled = seg.labels.iter().filter(|&&l| l > 0).count();
    println!(
        "{} windows on {}: {labelled} labelled voxels",
        seg.report.windows,
        engine.device_name()
    );
    voxtile::volume::write_labels(output.as_ref(), seg.labels.view(), &seg.header)?;
    Ok(())
}
