//! Segment a volume with an ONNX model and its manifest through the library, in about twenty
//! lines: what `voxtile segment INPUT -m MODEL -o OUTPUT` does.
//!
//! cargo run --release --example segment -- data/mni_t1_128.nii.gz data/deepbrain.onnx /tmp/mask.nii.gz

use voxtile::Pipeline;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, input, model, output] = args.as_slice() else {
        return Err("usage: segment INPUT.nii.gz MODEL.onnx OUTPUT.nii.gz".into());
    };
    // MODEL.toml beside MODEL.onnx, when there is one: window, normalisation, classes...
    let mut pipeline = Pipeline::from_model(model)?;
    let volume = voxtile::volume::read(input)?;
    let out = pipeline.run(&volume, &mut |_, _| {})?;
    let labelled = out.labels.iter().filter(|&&l| l > 0).count();
    println!(
        "{} windows on {}: {labelled} labelled voxels",
        out.report.engine.windows,
        pipeline.engines()[0].device_name()
    );
    voxtile::volume::write_labels(output, out.labels.view(), &out.header)?;
    Ok(())
}
