//! The command line that recorded a trace (`TraceMeta::cmdline`), as
//! perf keeps its own (`perf report --header`'s `cmdline`): how much of it
//! a data file keeps, and the one line that a shell reads back into the
//! same arguments.

use std::fmt::Write as _;

/// The most arguments a data file keeps: a longer command line keeps its
/// first `MAX_ARGS - 1` and then says how many more there were.
pub const MAX_ARGS: usize = 256;
/// The longest argument a data file keeps, in bytes (a `--trace` list of
/// hundreds of functions fits): a longer one is cut, and ends in [`CUT`].
pub const MAX_ARG_BYTES: usize = 16 << 10;
/// The end of an argument cut at [`MAX_ARG_BYTES`].
pub const CUT: &str = "[...]";

/// `argv` as a data file keeps it: every argument exactly, unless the
/// command line is past [`MAX_ARGS`] or an argument past [`MAX_ARG_BYTES`]
/// (it keeps what fits and says so).
pub fn bounded(argv: &[String]) -> Vec<String> {
    let mut kept: Vec<String> = argv
        .iter()
        .take(MAX_ARGS)
        .map(|a| match a.len() <= MAX_ARG_BYTES {
            true => a.clone(),
            false => {
                let mut end = MAX_ARG_BYTES - CUT.len();
                while !a.is_char_boundary(end) {
                    end -= 1;
                }
                format!("{}{CUT}", &a[..end])
            }
        })
        .collect();
    if argv.len() > MAX_ARGS {
        kept[MAX_ARGS - 1] = format!("[{} more arguments]", argv.len() - (MAX_ARGS - 1));
    }
    kept
}

/// `argv` as one line to paste into a shell: an argument of anything but
/// letters, digits and `_-./,:+@%=` in single quotes (a blank, a glob's
/// `*` or `{a,b}`, `'`, `$`, `!`, ...), one with a control character (a
/// newline) in bash's `$'...'`, so that the line stays one line.
pub fn shell_line(argv: &[String]) -> String {
    let words: Vec<String> = argv
        .iter()
        .enumerate()
        .map(|(i, a)| quote(a, i == 0))
        .collect();
    words.join(" ")
}

/// One argument as a shell word; `first`: the command's (where `a=b` is an
/// assignment). (shell-words' `quote` leaves `{a,b}` and `!` bare, which
/// bash expands.)
fn quote(arg: &str, first: bool) -> String {
    let bare = |(i, c): (usize, char)| {
        c.is_ascii_alphanumeric()
            || "_-./,:+@%".contains(c)
            // zsh expands a leading `=cmd` to cmd's path.
            || (c == '=' && !first && i > 0)
    };
    if !arg.is_empty() && arg.char_indices().all(bare) {
        return arg.to_string();
    }
    if !arg.contains(char::is_control) {
        return format!("'{}'", arg.replace('\'', r"'\''"));
    }
    let mut s = String::from("$'");
    for c in arg.chars() {
        match c {
            '\\' | '\'' => {
                s.push('\\');
                s.push(c);
            }
            // Bash's \xHH is a byte, \uHHHH a character (its UTF-8).
            c if c.is_control() && c.is_ascii() => {
                write!(s, "\\x{:02x}", u32::from(c)).expect("writing to a String cannot fail")
            }
            c if c.is_control() => {
                write!(s, "\\u{:04x}", u32::from(c)).expect("writing to a String cannot fail")
            }
            c => s.push(c),
        }
    }
    s.push('\'');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(args: &[&str]) -> String {
        shell_line(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn plain_words_stay_and_the_others_are_quoted() {
        assert_eq!(
            line(&["vmtrace", "record", "-f", "guest/out/bzImage", "-n", "2"]),
            "vmtrace record -f guest/out/bzImage -n 2"
        );
        assert_eq!(
            line(&[
                "vmtrace",
                "-g",
                "hrtimer_*",
                "-o",
                "my trace.data",
                "it's",
                ""
            ]),
            r#"vmtrace -g 'hrtimer_*' -o 'my trace.data' 'it'\''s' ''"#
        );
        assert_eq!(
            line(&["a=b", "-O", "json=t.json", "=ls", "{a,b}", "!x", "~", "é"]),
            "'a=b' -O json=t.json '=ls' '{a,b}' '!x' '~' 'é'"
        );
        assert_eq!(line(&["a\nb", "c\td'\\"]), r#"$'a\x0ab' $'c\x09d\'\\'"#);
    }

    #[test]
    fn a_long_command_line_is_cut_and_says_so() {
        let argv: Vec<String> = (0..MAX_ARGS + 10).map(|i| i.to_string()).collect();
        let kept = bounded(&argv);
        assert_eq!(kept.len(), MAX_ARGS);
        assert_eq!(kept[MAX_ARGS - 2], (MAX_ARGS - 2).to_string());
        assert_eq!(kept[MAX_ARGS - 1], "[11 more arguments]");
        // A multi-byte character across the bound is not split.
        let long = format!("x{}", "é".repeat(MAX_ARG_BYTES));
        let kept = bounded(&[long.clone(), "b".into()]);
        assert!(kept[0].len() <= MAX_ARG_BYTES && kept[0].ends_with(CUT));
        assert!(long.starts_with(kept[0].trim_end_matches(CUT)));
        assert_eq!(kept[1], "b");
        let exact = "y".repeat(MAX_ARG_BYTES);
        assert_eq!(bounded(std::slice::from_ref(&exact)), [exact]);
    }
}
