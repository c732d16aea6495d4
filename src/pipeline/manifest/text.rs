//! Manifest strings: checked when a manifest is read, and shown in messages only escaped and
//! cut short, so a class name can neither forge a line of output nor flood it; and parser
//! messages with the file's own text taken out.

/// Longest string a manifest may hold (a class name, a label, the model's name), in bytes.
pub const MAX_STRING_BYTES: usize = 256;

/// Characters of a manifest string shown in a message.
const SHOWN_CHARS: usize = 40;

/// Longest identifier a parser message may name (a field or variant of the manifest format).
const MAX_NAMED: usize = 32;

/// Refuses `s` when it holds a control character (a newline would forge a line on stderr) or is
/// longer than [`MAX_STRING_BYTES`]; `what` names it ("class 2", "name").
pub fn check_string(what: &str, s: &str) -> Result<(), String> {
    if s.len() > MAX_STRING_BYTES {
        return Err(format!(
            "{what} is {} bytes long, more than the {MAX_STRING_BYTES} a manifest string may have",
            s.len()
        ));
    }
    if s.chars().any(char::is_control) {
        return Err(format!(
            "{what} {} holds a control character (newline, tab, escape...), which a manifest string may not",
            show(s)
        ));
    }
    Ok(())
}

/// `s` for a message: in double quotes, escaped (control characters, quotes, backslashes) and cut
/// at [`SHOWN_CHARS`] characters ("…" where cut).
pub fn show(s: &str) -> String {
    let mut out = String::from("\"");
    for (i, c) in s.chars().enumerate() {
        if i == SHOWN_CHARS {
            out.push('…');
            break;
        }
        out.extend(c.escape_debug());
    }
    out.push('"');
    out
}

/// Whether a quoted piece of a parser message may stay: a plain short identifier (a field or
/// variant name) or a single punctuation mark (toml's "expected `=`").
fn nameable(s: &str) -> bool {
    let mut cs = s.chars();
    let plain = s.len() <= MAX_NAMED
        && cs
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_');
    plain || (s.len() == 1 && s.chars().all(|c| c.is_ascii_punctuation()))
}

/// A serde or toml message on one line, without the file's text. A piece in `"` (a string of the
/// file) becomes `…`; a piece in `` ` `` stays only when [`nameable`] and the format's own word: a
/// field named by "unknown/missing/duplicate field", or what follows "expected"; a value (an
/// unknown variant, a number) becomes `…` too. Control characters become spaces.
pub fn scrub(msg: &str) -> String {
    let mut out = String::new();
    let mut rest = msg;
    while let Some(at) = rest.find(['`', '"']) {
        out.push_str(&rest[..at]);
        let q = rest[at..].chars().next().unwrap_or('"');
        let body = &rest[at + 1..];
        let end = closing(body, q);
        let inner = &body[..end.unwrap_or(body.len())];
        let ours = out.ends_with("field ") || out.contains("expected");
        let keep = q == '`' && end.is_some() && ours && nameable(inner);
        out.push(q);
        out.push_str(if keep { inner } else { "…" });
        out.push(q);
        rest = end.map_or("", |e| &body[e + 1..]);
    }
    out.push_str(rest);
    let one_line: String = out
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    one_line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The key a TOML line `key = value` sets, when it is a plain short identifier (the field an
/// error is about); never any other text of the line.
pub fn key_of(line: &str) -> Option<&str> {
    let key = line.split_once('=')?.0.trim();
    nameable(key)
        .then_some(key)
        .filter(|k| !k.starts_with(|c: char| c.is_ascii_punctuation()))
}

/// Byte offset of the quote `q` that closes `body` (a `"` preceded by a backslash is escaped).
fn closing(body: &str, q: char) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            '\\' if q == '"' && !escaped => escaped = true,
            c if c == q && !escaped => return Some(i),
            _ => escaped = false,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_refused_shown_and_scrubbed() {
        assert!(check_string("class 1", "liver").is_ok());
        let e = check_string("class 1", "liver\nerror: forged").unwrap_err();
        assert!(!e.contains('\n') && e.contains(r"liver\nerror"), "{e}");
        let e = check_string("name", &"x".repeat(900_000)).unwrap_err();
        assert!(e.len() < 200 && e.contains("900000 bytes"), "{e}");
        assert_eq!(show("a\"b"), r#""a\"b""#);
        assert_eq!(show(&"y".repeat(100)).chars().count(), SHOWN_CHARS + 3);
        let m = scrub("unknown field `colour`, expected one of `name`, `classes`");
        assert_eq!(
            m,
            "unknown field `colour`, expected one of `name`, `classes`"
        );
        let m = scrub("invalid type: string \"SECRET \\\" pw\", expected a sequence");
        assert_eq!(m, "invalid type: string \"…\", expected a sequence");
        let m = scrub("invalid type: string \"hunter2\", expected `x`; integer `5`");
        assert_eq!(m, "invalid type: string \"…\", expected `x`; integer `…`");
        assert_eq!(scrub("unknown variant `hunter2`"), "unknown variant `…`");
        assert_eq!(
            scrub("duplicate field `classes`"),
            "duplicate field `classes`"
        );
        let m = scrub("unknown variant `TRUST2-SECRET hunter2`, expected `auto`\nmore");
        assert_eq!(m, "unknown variant `…`, expected `auto` more");
        assert_eq!(scrub("expected `.`, `=`"), "expected `.`, `=`");
        assert_eq!(scrub("dangling `quote here"), "dangling `…`");
        assert_eq!(key_of("classes = 3"), Some("classes"));
        assert_eq!(key_of("SECRET-7f3a alice = hunter2"), None);
        assert_eq!(key_of("no equals sign"), None);
    }
}
