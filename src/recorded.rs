//! When a saved trace was written, in words, and the command line that
//! recorded it: `report` and `script` say them first on a terminal, and a
//! run that saved nothing says that the `vmtrace.data` beside it is an
//! earlier run's (a run without a command saves its trace only with `-o
//! FILE`, as `perf trace` saves nothing; `vmtrace record` saves it, as
//! `perf record` does).

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracer::trace::cmdline::shell_line;
use tracer::trace::model::TraceMeta;

/// `2026-11-29 16:02:11 UTC, 12 min ago`: when `path` was last written
/// (its modification time: a data file is written to its end when the
/// run stops), or None if it cannot be read.
pub fn when(path: &Path) -> Option<String> {
    let written = std::fs::metadata(path).ok()?.modified().ok()?;
    let ago = SystemTime::now()
        .duration_since(written)
        .unwrap_or_default();
    Some(format!("{}, {}", utc(written)?, ago_words(ago)))
}

/// On a terminal, before a saved trace is shown: which file, of which
/// kernel, written when, by which command line when the file kept it (a
/// file of an earlier run than the one just watched is no surprise).
pub fn say_on_terminal(path: &Path, meta: &TraceMeta) {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return;
    }
    if let Some(when) = when(path) {
        let by = match meta.cmdline.is_empty() {
            true => String::new(),
            false => format!("; command line: {}", shell_line(&meta.cmdline)),
        };
        note!(
            "vmtrace: reading {}: a trace of {}, written {when}{by}",
            path.display(),
            meta.kernel
        );
    }
}

/// After a run that saved nothing: the data file `report` would read, if
/// there is one here, is an earlier run's.
pub fn unsaved_line() -> Option<String> {
    let default = Path::new(crate::cli::DEFAULT_DATA);
    let when = when(default).filter(|_| default.is_file())?;
    Some(format!(
        "this run's trace was not saved (-o FILE saves it, as `vmtrace record` does); {} here \
         is an earlier run's, written {when}",
        default.display()
    ))
}

/// This process's command line, argv as given, for the data file to keep
/// (an argument that is not UTF-8 with U+FFFD for its bad bytes).
pub fn argv() -> Vec<String> {
    std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// `YYYY-MM-DD HH:MM:SS UTC`.
fn utc(t: SystemTime) -> Option<String> {
    t.duration_since(UNIX_EPOCH).ok()?;
    // humantime's RFC 3339 form, `2026-11-29T16:02:11Z`, in words.
    let rfc = humantime::format_rfc3339_seconds(t).to_string();
    Some(format!(
        "{} UTC",
        rfc.trim_end_matches('Z').replacen('T', " ", 1)
    ))
}

/// `just now`, `40 s ago`, `12 min ago`, `3 h ago`, `2 days ago`.
fn ago_words(d: Duration) -> String {
    match d.as_secs() {
        0..=4 => "just now".into(),
        s @ 5..=119 => format!("{s} s ago"),
        s @ 120..=7_199 => format!("{} min ago", s / 60),
        s @ 7_200..=172_799 => format!("{} h ago", s / 3600),
        s => format!("{} days ago", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_ages_in_words() {
        assert_eq!(utc(UNIX_EPOCH).unwrap(), "1970-01-01 00:00:00 UTC");
        // 2026-11-29 16:02:11 UTC, and a leap day.
        let t = UNIX_EPOCH + Duration::from_secs(1_795_968_131);
        assert_eq!(utc(t).unwrap(), "2026-11-29 16:02:11 UTC");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(utc(leap).unwrap(), "2000-02-29 00:00:00 UTC");
        assert_eq!(ago_words(Duration::from_secs(2)), "just now");
        assert_eq!(ago_words(Duration::from_secs(40)), "40 s ago");
        assert_eq!(ago_words(Duration::from_secs(12 * 60 + 5)), "12 min ago");
        assert_eq!(ago_words(Duration::from_secs(3 * 3600)), "3 h ago");
        assert_eq!(ago_words(Duration::from_secs(5 * 86_400)), "5 days ago");
    }
}
