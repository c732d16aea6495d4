//! The NVRTC programs the catalogue compiles as: one per family, except that a family with many
//! generated conv instances is cut into parts, each its file with a share of the `*_ENTRY(...)`
//! lines. A cold start builds the programs on rayon's threads, so it takes about its slowest
//! program: `conv_wgmma`'s 40 instances as one program took ~120 s of NVRTC (W3's first run
//! timed out behind it), as ten parts 6-18 s each.

use super::catalogue::{instances, Family, KERNELS};

/// One NVRTC program: part `part` of `parts` of a family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    pub family: Family,
    pub part: usize,
    pub parts: usize,
}

/// How many programs a family compiles as, by the NVRTC time of one program (one core, sm_90 /
/// sm_90a): `conv_wgmma` ~120 s, `conv_mma` ~14 s, the next `conv_small` ~13 s (no generated
/// instances to cut), `conv_halo` ~7 s. The round-robin cut spreads each config table's
/// instances over the parts.
fn parts_of(fam: Family) -> usize {
    match fam {
        Family::ConvWgmma => 10,
        Family::ConvMma => 2,
        _ => 1,
    }
}

/// Every program of `fam`, in part order.
pub fn units(fam: Family) -> impl Iterator<Item = Unit> {
    let parts = parts_of(fam);
    (0..parts).map(move |part| Unit {
        family: fam,
        part,
        parts,
    })
}

impl Unit {
    /// The kernel cache's file prefix: the family's name, with the part where it has several
    /// (`conv_wgmma.p3of10`).
    pub fn label(self) -> String {
        match self.parts {
            1 => self.family.name().to_string(),
            n => format!("{}.p{}of{n}", self.family.name(), self.part),
        }
    }

    /// The generated instances this part compiles: every `parts`-th from `part` on.
    fn instances(self) -> impl Iterator<Item = (&'static str, String)> {
        instances(self.family)
            .into_iter()
            .skip(self.part)
            .step_by(self.parts)
    }

    /// What NVRTC compiles: the family's source with this part's entry lines alone (the plain
    /// kernels of the file compile in every part; part 0 exports them).
    pub fn source(self) -> String {
        if self.parts == 1 {
            return self.family.source();
        }
        let lines: String = self.instances().map(|(_, l)| l).collect();
        format!("{}{lines}", self.family.head())
    }

    /// The entry points loaded from this part's module.
    pub fn entries(self) -> Vec<&'static str> {
        if self.parts == 1 {
            return self.family.entries();
        }
        let plain = KERNELS
            .iter()
            .filter(|k| k.family == self.family && self.part == 0)
            .map(|k| k.name);
        plain.chain(self.instances().map(|(e, _)| e)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::host::catalogue::FAMILIES;

    /// The parts of a family export each of its entry points exactly once, and each part's
    /// source instantiates just the entries it exports.
    #[test]
    fn parts_export_every_entry_once() {
        for fam in FAMILIES {
            let mut got: Vec<&str> = units(fam).flat_map(Unit::entries).collect();
            let mut want = fam.entries();
            got.sort();
            want.sort();
            assert_eq!(got, want, "{}", fam.name());
            for u in units(fam).filter(|u| u.parts > 1) {
                let src = u.source();
                let generated = src.lines().filter(|l| {
                    !l.starts_with("#define")
                        && l.contains("_ENTRY(")
                        && !l.trim_start().starts_with("//")
                });
                let n = generated.count();
                let plain = KERNELS.iter().filter(|k| k.family == fam).count();
                let exported = u.entries().len() - if u.part == 0 { plain } else { 0 };
                assert_eq!(n, exported, "{}", u.label());
                assert!(n > 0, "{} has no instances", u.label());
            }
        }
    }

    /// A family of one part is the family's program unchanged (its cache key stays as it was).
    #[test]
    fn a_single_part_is_the_family() {
        let u = units(Family::Norm).next().unwrap();
        assert_eq!((u.parts, u.label().as_str()), (1, "norm"));
        assert_eq!(u.source(), Family::Norm.source());
    }
}
