//! Text from the provider, made safe to print: the origin's operator must not get a
//! provider's control characters (terminal escapes) or unbounded strings on their terminal.

/// The longest provider string printed; longer ones are cut with an ellipsis.
const MAX_CHARS: usize = 300;

/// `s` with control characters shown as `\u{..}` and cut at 300 characters.
pub fn printable(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == MAX_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_long_text_cut() {
        assert_eq!(printable("ok \u{1b}[2J"), "ok \\u{1b}[2J");
        assert_eq!(printable("line\nnext"), "line\\u{a}next");
        let long = "x".repeat(400);
        assert_eq!(printable(&long).chars().count(), 301);
        assert_eq!(printable("apps-origin/db"), "apps-origin/db");
    }
}
