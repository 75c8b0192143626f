//! Kernel names as printed: symbol names come from the guest (a crafted
//! kernel can hold any bytes), so every stage that prints one escapes it
//! here, first of all the kernel's own filters and `vmtrace list`.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `name` as printed: control characters (C0, DEL and C1: `char::is_control`)
/// become `\xNN`, their code point in hex, so that a crafted name cannot
/// end or forge a line, or send escape sequences to a terminal. Other text,
/// backslashes included, is kept (kernel symbols are plain ASCII: they are
/// borrowed unchanged).
pub fn escape(name: &str) -> Cow<'_, str> {
    if !name.contains(char::is_control) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        if c.is_control() {
            write!(out, "\\x{:02x}", u32::from(c)).expect("writing to a String cannot fail");
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_turns_controls_into_hex() {
        assert!(matches!(escape("hrtimer_interrupt"), Cow::Borrowed(_)));
        assert_eq!(
            escape("a\nb\rc\x1b[2J\x7f\u{85}é\\"),
            "a\\x0ab\\x0dc\\x1b[2J\\x7f\\x85é\\"
        );
        assert_eq!(escape("\t\0"), "\\x09\\x00");
    }
}
