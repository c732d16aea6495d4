//! `--preview`: panels turned to RAS (radiological display) whatever the voxel order, square
//! pixels in mm, slices through the mask's largest cross-section, a legend with the class
//! colours and names, the CT window on HU values. Every check decodes the written PNG.

use crate::common::tempdir;
use ndarray::Array3;
use voxtile::pipeline::preview::{self, Context, MIN_PANEL, PANEL_GAP};
use voxtile::volume::LabelNames;
use voxtile::volume::Mat4;

/// A decoded RGB PNG.
struct Png {
    width: usize,
    height: usize,
    rgb: Vec<u8>,
}

impl Png {
    fn px(&self, x: usize, y: usize) -> [u8; 3] {
        let a = (y * self.width + x) * 3;
        [self.rgb[a], self.rgb[a + 1], self.rgb[a + 2]]
    }
    fn count(&self, c: [u8; 3]) -> usize {
        self.rgb.chunks(3).filter(|p| *p == c).count()
    }
}

fn preview_png(image: &Array3<f32>, labels: &Array3<u16>, ctx: &Context) -> Png {
    let dir = tempdir();
    let path = dir.path().join("overlay.png");
    preview::write_png(&path, image.view(), labels.view(), ctx).unwrap();
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    Png {
        width: info.width as usize,
        height: info.height as usize,
        rgb: buf,
    }
}

/// An affine whose voxel axis `a` runs along world axis `axes[a].0` with sign `axes[a].1` and
/// size `axes[a].2` mm.
fn affine(axes: [(usize, f64, f64); 3]) -> Mat4 {
    let mut m = [[0.0; 4]; 4];
    for (a, &(w, sign, size)) in axes.iter().enumerate() {
        m[w][a] = sign * size;
    }
    m[3][3] = 1.0;
    m
}

/// RAS grid 20 x 24 x 16 at 1 x 1.5 x 2 mm: a bright labelled block in the left (low i),
/// anterior (high j), superior (high k) corner, a smaller dim one of label 2 in the
/// right-posterior-inferior corner, a gradient elsewhere.
fn ras_pattern() -> (Array3<f32>, Array3<u16>) {
    let (nx, ny, nz) = (20, 24, 16);
    let block = |i: usize, j: usize, k: usize| i < 6 && j >= 16 && k >= 10;
    let small = |i: usize, j: usize, k: usize| i >= 16 && j < 4 && k < 3;
    let image = Array3::from_shape_fn((nx, ny, nz), |(i, j, k)| {
        if block(i, j, k) {
            500.0
        } else {
            (i + 2 * j + 3 * k) as f32
        }
    });
    let labels = Array3::from_shape_fn((nx, ny, nz), |(i, j, k)| {
        if block(i, j, k) {
            1
        } else {
            2 * u16::from(small(i, j, k))
        }
    });
    (image, labels)
}

const RAS_SPACING: [f64; 3] = [1.0, 1.5, 2.0];

fn grey(p: [u8; 3]) -> bool {
    p[0] == p[1] && p[1] == p[2]
}

#[test]
fn lia_and_las_volumes_show_the_pattern_where_the_ras_one_does() {
    let (image, labels) = ras_pattern();
    let (nx, ny, nz) = image.dim();
    let [sx, sy, sz] = RAS_SPACING;
    let ras = affine([(0, 1.0, sx), (1, 1.0, sy), (2, 1.0, sz)]);
    let reference = preview_png(&image, &labels, &Context::plain(ras));

    // LIA: voxel axes run toward Left, Inferior, Anterior (FreeSurfer's conformed order).
    let lia_at = |(a, b, c): (usize, usize, usize)| (nx - 1 - a, c, nz - 1 - b);
    let lia_img = Array3::from_shape_fn((nx, nz, ny), |p| image[lia_at(p)]);
    let lia_lab = Array3::from_shape_fn((nx, nz, ny), |p| labels[lia_at(p)]);
    let lia = affine([(0, -1.0, sx), (2, -1.0, sz), (1, 1.0, sy)]);
    // LAS: x reversed (the common NIfTI radiological storage).
    let las_at = |(a, b, c): (usize, usize, usize)| (nx - 1 - a, b, c);
    let las_img = Array3::from_shape_fn((nx, ny, nz), |p| image[las_at(p)]);
    let las_lab = Array3::from_shape_fn((nx, ny, nz), |p| labels[las_at(p)]);
    let las = affine([(0, -1.0, sx), (1, 1.0, sy), (2, 1.0, sz)]);

    for (name, img, lab, aff) in [
        ("LIA", &lia_img, &lia_lab, lia),
        ("LAS", &las_img, &las_lab, las),
    ] {
        let got = preview_png(img, lab, &Context::plain(aff));
        assert_eq!(
            (got.width, got.height),
            (reference.width, reference.height),
            "{name}"
        );
        assert!(got.rgb == reference.rgb, "{name}: another picture than RAS");
    }

    // Where the block is in the RAS picture. Pixel size: the finest voxel (1 mm) made finer so the
    // longest side (24 x 1.5 = 36 mm) spans 256 pixels.
    let p = 36.0 / 256.0;
    let (ax_w, ax_h) = ((20.0 / p) as usize, (36.0 / p) as usize);
    let block_colour = |c: [u8; 3]| !grey(c) && c[0] > c[2];
    // Axial (radiological): the patient's left on the right, anterior up.
    let x = ax_w - (3.0 / p) as usize;
    let y = (4.0 / p) as usize;
    assert!(block_colour(reference.px(x, y)), "{:?}", reference.px(x, y));
    assert!(grey(reference.px(ax_w - 1 - x, y)), "mirror R/L coloured");
    assert!(grey(reference.px(x, ax_h - 1 - y)), "mirror A/P coloured");
    // Coronal: columns R to L again, superior up (32 mm high).
    let cor_h = (32.0 / p) as usize;
    let x1 = ax_w + PANEL_GAP;
    assert!(block_colour(reference.px(x1 + x, y)));
    assert!(grey(reference.px(x1 + ax_w - 1 - x, y)));
    assert!(
        grey(reference.px(x1 + x, cor_h - 1 - y)),
        "mirror S/I coloured"
    );
    // Sagittal: anterior on the left, superior up.
    let (x2, a) = (2 * (ax_w + PANEL_GAP), (4.0 / p) as usize);
    assert!(block_colour(reference.px(x2 + a, y)));
    assert!(
        grey(reference.px(x2 + ax_h - 1 - a, y)),
        "mirror A/P coloured"
    );
}

/// The size of the panel from column `x0` in a picture where every voxel is labelled (so a
/// panel is never black and around it is): its width along row 30 and height down column
/// `x0 + 40`, both clear of the letter boxes.
fn panel_size(png: &Png, x0: usize) -> (usize, usize) {
    let lit = |x: usize, y: usize| png.px(x, y) != [0; 3];
    let h = (0..png.height).take_while(|&y| lit(x0 + 40, y)).count();
    let w = (x0..png.width).take_while(|&x| lit(x, 30)).count();
    (w, h)
}

/// A labelled volume of `dims` voxels of `mm` (RAS) and its picture.
fn labelled(dims: (usize, usize, usize), mm: [f64; 3]) -> Png {
    let image = Array3::from_shape_fn(dims, |(i, j, k)| (i + j + k) as f32);
    let labels = Array3::from_elem(dims, 1u16);
    let aff = affine([(0, 1.0, mm[0]), (1, 1.0, mm[1]), (2, 1.0, mm[2])]);
    preview_png(&image, &labels, &Context::plain(aff))
}

#[test]
fn panels_have_square_millimetres() {
    // 512 x 512 x 40 at 0.7 x 0.7 x 2 mm: the coronal slice is 358.4 mm wide and 80 mm high,
    // enlarged to MIN_PANEL pixels high with its proportions kept.
    let png = labelled((512, 512, 40), [0.7, 0.7, 2.0]);
    let (axial_w, axial_h) = panel_size(&png, 0);
    assert!(
        axial_h > 400 && axial_w == axial_h,
        "axial {axial_w}x{axial_h}"
    );
    let (w, h) = panel_size(&png, axial_w + PANEL_GAP);
    assert_eq!(h, MIN_PANEL, "coronal height");
    let (ratio, want) = (h as f64 / w as f64, 80.0 / 358.4);
    assert!(
        (ratio - want).abs() < 0.005,
        "coronal height/width {h}/{w} = {ratio:.4}, want {want:.4}"
    );
}

/// Whether the picture has a white pixel (edge letters are white; labelled pixels never are)
/// in the box from (x, y), w x h.
fn white_in(png: &Png, (x, y): (usize, usize), (w, h): (usize, usize)) -> bool {
    (x..x + w).any(|xx| (y..y + h).any(|yy| png.px(xx, yy) == [255; 3]))
}

#[test]
fn thin_volumes_get_readable_panels_with_their_letters() {
    // 20 slices: the coronal and sagittal slices are 128 x 20 mm (once 40-pixel strips without
    // letters). Each panel is at least MIN_PANEL pixels a side with its four letters; square
    // millimetres up to 8:1 (here 6.4:1), stretched beyond (4 slices: 128 x 4 mm).
    for (slices, aspect) in [(20, 128.0 / 20.0), (4, 1024.0 / 128.0)] {
        let png = labelled((128, 128, slices), [1.0, 1.0, 1.0]);
        let (aw, _) = panel_size(&png, 0);
        let mut x0 = aw + PANEL_GAP;
        for view in ["coronal", "sagittal"] {
            let (w, h) = panel_size(&png, x0);
            assert_eq!(h, MIN_PANEL, "{view}, {slices} slices: height");
            let ratio = w as f64 / h as f64;
            assert!((ratio - aspect).abs() < 0.02, "{view}: {w}x{h}");
            let edge = 24;
            let (mid_x, mid_y) = (x0 + w / 2 - edge / 2, h / 2 - edge / 2);
            for (name, at) in [
                ("left", (x0, mid_y)),
                ("right", (x0 + w - edge, mid_y)),
                ("top", (mid_x, 0)),
                ("bottom", (mid_x, h - edge)),
            ] {
                assert!(
                    white_in(&png, at, (edge, edge)),
                    "{view}, {slices} slices: no {name} letter"
                );
            }
            x0 += w + PANEL_GAP;
        }
    }
}

#[test]
fn the_legend_shows_each_class_colour_and_name() {
    let (image, mut labels) = ras_pattern();
    labels[[10, 10, 8]] = 3;
    let ras = affine([(0, 1.0, 1.0), (1, 1.0, 1.0), (2, 1.0, 1.0)]);
    let plain = preview_png(&image, &labels, &Context::plain(ras));
    // Panel pixels blend the colour with grey: only the legend's swatches have it pure.
    for l in 1..=3 {
        let n = plain.count(preview::label_colour(l));
        assert!(n >= 100, "label {l}: {n} pixels of its colour");
    }
    assert_eq!(plain.count(preview::label_colour(4)), 0);
    let names = LabelNames {
        names: ["background", "liver", "spleen", "kidney_left"]
            .map(String::from)
            .to_vec(),
    };
    let ctx = Context {
        names: Some(&names),
        ..Context::plain(ras)
    };
    assert_eq!(ctx.name(3), "kidney_left");
    assert_eq!(ctx.name(9), "label 9");
    assert_eq!(Context::plain(ras).name(3), "label 3");
    let named = preview_png(&image, &labels, &ctx);
    assert!(named.rgb != plain.rgb, "the class names changed nothing");
}

#[test]
fn hu_values_get_the_ct_window() {
    // Left half (low i) soft tissue at 40 HU, right half air, a bone voxel: W400/L40 shows 40 HU
    // as mid grey (127.5 rounds to 128) and air black.
    let (nx, ny, nz) = (40, 40, 40);
    let ct = Array3::from_shape_fn((nx, ny, nz), |(i, j, k)| match (i, j, k) {
        (0, 0, 0) => 1000.0,
        (i, _, _) if i < nx / 2 => 40.0,
        _ => -1000.0,
    });
    let labels = Array3::zeros((nx, ny, nz));
    let ras = affine([(0, 1.0, 1.0), (1, 1.0, 1.0), (2, 1.0, 1.0)]);
    let png = preview_png(&ct, &labels, &Context::plain(ras));
    // Axial panel 256 pixels wide: the patient's left (low i) is on the right.
    assert_eq!(png.px(192, 64), [128; 3]);
    assert_eq!(png.px(64, 64), [0; 3]);
    // Values that are no HU get the percentile window: 40 is then white.
    let mr = ct.mapv(|v| v.max(0.0));
    let png = preview_png(&mr, &labels, &Context::plain(ras));
    assert_eq!(png.px(192, 64), [255; 3]);
    // ... unless the manifest says CT.
    let ctx = Context {
        ct: true,
        ..Context::plain(ras)
    };
    let png = preview_png(&mr, &labels, &ctx);
    assert_eq!(png.px(192, 64), [128; 3]);
}

#[test]
fn slices_cut_the_largest_cross_section() {
    // A blob far from the middle in every axis: mid-slices would miss it.
    let (nx, ny, nz) = (30, 30, 30);
    let image = Array3::from_shape_fn((nx, ny, nz), |(i, j, k)| (i + j + k) as f32);
    let labels = Array3::from_shape_fn((nx, ny, nz), |(i, j, k)| {
        u16::from((2..6).contains(&i) && (3..7).contains(&j) && (24..28).contains(&k))
    });
    let ras = affine([(0, 1.0, 1.0), (1, 1.0, 1.0), (2, 1.0, 1.0)]);
    let png = preview_png(&image, &labels, &Context::plain(ras));
    let panel = 256;
    for (v, x0) in
        ["axial", "coronal", "sagittal"]
            .iter()
            .zip([0, panel + PANEL_GAP, 2 * (panel + PANEL_GAP)])
    {
        let coloured = (x0..x0 + panel)
            .flat_map(|x| (0..panel).map(move |y| (x, y)))
            .filter(|&(x, y)| !grey(png.px(x, y)))
            .count();
        assert!(coloured > 500, "{v}: {coloured} labelled pixels");
    }
    assert_eq!(preview::busiest_slice(labels.view(), 2), 24);
    assert_eq!(
        preview::busiest_slice(Array3::<u16>::zeros((4, 4, 9)).view(), 2),
        4
    );
}
