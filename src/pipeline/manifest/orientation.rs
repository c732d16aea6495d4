//! The manifest's `orientation`: "stored" (the default) or axis codes such as "RAS", parsed as
//! `--orientation` is ([`crate::volume::Orientation`]).

use super::text;
use crate::volume::Orientation;

/// The orientation a manifest asks for (None: it says nothing), or why its value is wrong.
pub fn parse(value: &Option<String>) -> Result<Option<Orientation>, String> {
    let Some(s) = value else {
        return Ok(None);
    };
    text::check_string("orientation", s)?;
    // Checked above: no control character, short; the parser's message shows it whole.
    s.parse::<Orientation>().map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_stored_and_refusals() {
        assert_eq!(parse(&None), Ok(None));
        assert_eq!(
            parse(&Some("LPS".into())),
            Ok(Some(Orientation::Codes(*b"LPS")))
        );
        assert_eq!(parse(&Some("stored".into())), Ok(Some(Orientation::Stored)));
        let e = parse(&Some("RAR".into())).unwrap_err();
        assert!(e.contains("orientation") && e.contains("RAR"), "{e}");
    }
}
