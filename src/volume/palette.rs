//! The one colour of each label value, shared by the label map's table (Caret XML, the 3D Slicer
//! colour table) and the preview's overlay, so a class looks the same wherever it is shown.

/// Distinct colours for labels 1, 2, ... (cycled); label 0, the background, is black.
const PALETTE: [[u8; 3]; 12] = [
    [230, 25, 75],
    [60, 180, 75],
    [255, 225, 25],
    [0, 130, 200],
    [245, 130, 48],
    [145, 30, 180],
    [70, 240, 240],
    [240, 50, 230],
    [210, 245, 60],
    [250, 190, 212],
    [0, 128, 128],
    [170, 110, 40],
];

/// The colour of label value `l`: black for 0, else the palette's (it repeats every 12).
pub fn label_colour(l: u16) -> [u8; 3] {
    match l {
        0 => [0; 3],
        l => PALETTE[(l as usize - 1) % PALETTE.len()],
    }
}
