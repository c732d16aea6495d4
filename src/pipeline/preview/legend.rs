//! Text on the picture: the orientation letters at each panel's edges and the legend strip
//! (a colour swatch and a name per label) under the panels.

use super::font;
use super::Picture;

/// Font pixels per glyph pixel: 10x14 characters, readable on a screen.
const SCALE: usize = 2;
/// Horizontal advance of one character.
const ADVANCE: usize = (font::WIDTH + 1) * SCALE;
/// Text height.
const TEXT_H: usize = font::HEIGHT * SCALE;
/// Height of a legend row, and the margin around the strip.
const ROW: usize = TEXT_H + 6;
const MARGIN: usize = 6;
/// Space after an entry.
const GAP: usize = 3 * ADVANCE;

/// An edge letter's black box.
const LETTER_BOX_W: usize = font::WIDTH * SCALE + 4;
const LETTER_BOX_H: usize = TEXT_H + 4;
// Every panel has room for three letter boxes along each side.
const _: () = assert!(super::MIN_PANEL >= 3 * LETTER_BOX_W && super::MIN_PANEL >= 3 * LETTER_BOX_H);

const WHITE: [u8; 3] = [255, 255, 255];
const BLACK: [u8; 3] = [0, 0, 0];

/// One legend entry: the label's colour and its name.
pub struct Entry {
    /// Overlay colour.
    pub colour: [u8; 3],
    /// What the legend says.
    pub name: String,
}

impl Picture {
    /// Fill the rectangle at (x, y) of size w x h, clipped to the picture.
    pub(super) fn fill(&mut self, x: usize, y: usize, w: usize, h: usize, c: [u8; 3]) {
        for yy in y..(y + h).min(self.height) {
            for xx in x..(x + w).min(self.width) {
                let at = (yy * self.width + xx) * 3;
                self.rgb[at..at + 3].copy_from_slice(&c);
            }
        }
    }

    /// Write `s` with its top-left corner at (x, y), clipped to the picture.
    pub(super) fn text(&mut self, x: usize, y: usize, s: &str, c: [u8; 3]) {
        for (n, ch) in s.chars().enumerate() {
            for gy in 0..font::HEIGHT {
                for gx in 0..font::WIDTH {
                    if font::ink(ch, gx, gy) {
                        let px = x + n * ADVANCE + gx * SCALE;
                        self.fill(px, y + gy * SCALE, SCALE, SCALE, c);
                    }
                }
            }
        }
    }

    /// A letter in white on a black box (readable over any grey) inside the panel at `x0`
    /// (`w` x `h`, at least [`super::MIN_PANEL`] a side, so the four boxes never overlap):
    /// `edges` = left, right, top, bottom.
    pub(super) fn edge_letters(&mut self, x0: usize, w: usize, h: usize, edges: [char; 4]) {
        let (bw, bh) = (LETTER_BOX_W, LETTER_BOX_H);
        let spots = [
            (x0, (h - bh) / 2),
            (x0 + w - bw, (h - bh) / 2),
            (x0 + (w - bw) / 2, 0),
            (x0 + (w - bw) / 2, h - bh),
        ];
        for ((x, y), ch) in spots.into_iter().zip(edges) {
            self.fill(x, y, bw, bh, BLACK);
            self.text(x + 2, y + 2, &ch.to_string(), WHITE);
        }
    }
}

/// Where each entry goes in a strip `width` wide: (x, row) per entry, and the rows needed.
fn layout(entries: &[Entry], width: usize) -> (Vec<(usize, usize)>, usize) {
    let (mut x, mut row) = (MARGIN, 0);
    let mut at = Vec::with_capacity(entries.len());
    for e in entries {
        let w = TEXT_H + ADVANCE + e.name.chars().count() * ADVANCE;
        if x > MARGIN && x + w > width.saturating_sub(MARGIN) {
            (x, row) = (MARGIN, row + 1);
        }
        at.push((x, row));
        x += w + GAP;
    }
    (at, row + 1)
}

/// Height of the legend strip for `entries` under panels `width` wide.
pub fn height(entries: &[Entry], width: usize) -> usize {
    2 * MARGIN + layout(entries, width).1 * ROW
}

/// Draw the legend strip from row `y0` of `pic` (black background already there).
pub fn draw(pic: &mut Picture, y0: usize, entries: &[Entry]) {
    let (at, _) = layout(entries, pic.width);
    for (e, (x, row)) in entries.iter().zip(at) {
        let y = y0 + MARGIN + row * ROW;
        pic.fill(x, y, TEXT_H, TEXT_H, e.colour);
        pic.text(x + TEXT_H + ADVANCE, y, &e.name, WHITE);
    }
}
