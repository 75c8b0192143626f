//! vmtrace: trace a Linux guest kernel's function calls from the hypervisor.

/// `eprintln!` without its panic: a closed or full stderr
/// (`vmtrace ... 2>&1 | head`) loses the message, not the run.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        // Under a live status line: erase it first.
        crate::status::clear();
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod bench;
mod cli;
mod cmd;
mod config;
mod console;
mod datafile;
mod datalock;
mod emit;
mod error;
mod recorded;
mod stats;
mod status;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

/// Set: parse the command line, then exit (0, or 2 as for any bad input).
const PARSE_ONLY: &str = "VMTRACE_PARSE_ONLY";

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "vmtrace: {} (see vmtrace --help)",
                one_line(&e.to_string())
            );
            return ExitCode::from(error::EXIT_BAD_INPUT);
        }
    };
    // tests/docs_examples.rs checks every documented command line against
    // this parser without running it (no user-facing flag for that).
    if std::env::var_os(PARSE_ONLY).is_some() {
        return ExitCode::SUCCESS;
    }
    match cmd::dispatch(cli) {
        Ok(outcome) => ExitCode::from(outcome.exit_status()),
        Err(e) => {
            // Never a panic, even with stderr gone.
            let _ = writeln!(std::io::stderr(), "vmtrace: {e}");
            ExitCode::from(e.exit_status())
        }
    }
}

/// clap's error in one line: every line that says something (the problem,
/// the argument it names, its possible values, a tip such as "a similar
/// argument exists: '--trace'"), without the blank lines, the `Usage:` block
/// and "For more information, try '--help'".
fn one_line(text: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut in_usage = false;
    for line in text.lines().map(str::trim) {
        if line.is_empty() {
            in_usage = false;
            continue;
        }
        if line.starts_with("Usage:") {
            in_usage = true;
            continue;
        }
        if in_usage || line.starts_with("For more information") {
            continue;
        }
        let line = line.trim_start_matches("error: ");
        match parts.last_mut() {
            // A list after its heading ("not provided:", "[possible values: ...]").
            Some(prev) if prev.ends_with(':') || line.starts_with('[') => {
                prev.push(' ');
                prev.push_str(line);
            }
            _ => parts.push(line.to_string()),
        }
    }
    if parts.is_empty() {
        return "invalid arguments".to_string();
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn error_of(args: &[&str]) -> String {
        let mut argv = vec!["vmtrace"];
        argv.extend_from_slice(args);
        match cli::Cli::try_parse_from(argv) {
            Ok(_) => panic!("{args:?} parsed"),
            Err(e) => one_line(&e.to_string()),
        }
    }

    /// `--args` alone records every traced function's arguments (`*`), and
    /// leaves the next flag alone; `--args=GLOB` lists add up.
    #[test]
    fn args_parse_alone_and_with_globs() {
        let parse = |args: &[&str]| {
            let mut argv = vec!["vmtrace"];
            argv.extend_from_slice(args);
            cli::Cli::try_parse_from(argv).unwrap()
        };
        let c = parse(&["--kernel", "k", "--trace", "x", "--args", "--graph"]);
        assert_eq!(
            (c.run.tracing.args, c.run.tracing.graph),
            (vec!["*".to_string()], true)
        );
        let c = parse(&["--kernel", "k", "--trace", "x", "--args=a,b", "--args=!c"]);
        assert_eq!(c.run.tracing.args, ["a,b", "!c"]);
        let c = parse(&["--kernel", "k", "--trace", "x"]);
        assert!(c.run.tracing.args.is_empty());
        let c = parse(&["record", "--kernel", "k", "--trace", "x", "--args"]);
        let Some(cli::Command::Record(r)) = c.command else {
            panic!("not a record")
        };
        assert_eq!(r.run.tracing.args, ["*"]);
        let c = parse(&[
            "attach", "--qmp", "q", "--kernel", "k", "--trace", "x", "--args=f",
        ]);
        let Some(cli::Command::Attach(a)) = c.command else {
            panic!("not an attach")
        };
        assert_eq!(a.tracing.args, ["f"]);
        // Globs follow `=` only: a separate word is not --args' value.
        let e = error_of(&["--kernel", "k", "--trace", "x", "--args", "f"]);
        assert!(e.contains("'f'") && e.contains("--args[=<GLOB>]"), "{e}");
    }

    #[test]
    fn clap_errors_keep_every_meaningful_line() {
        let e = error_of(&["--kernel", "k", "--trac", "x"]);
        assert!(e.starts_with("unexpected argument '--trac' found; "), "{e}");
        assert!(
            e.contains("tip: a similar argument exists: '--trace'"),
            "{e}"
        );
        let e = error_of(&["--format", "xml"]);
        assert!(
            e.contains("invalid value 'xml' for '--format <FORMAT>' [possible values: text, json, csv, chrome, folded]"),
            "{e}"
        );
        let e = error_of(&["list", "do_*"]);
        assert!(
            e.contains("the following required arguments were not provided: "),
            "{e}"
        );
        assert!(e.contains("--kernel <PATH>"), "{e}");
        let e = error_of(&["--export", "xml=f"]);
        assert!(
            e.contains("unknown format 'xml'; use one of json, csv, chrome, folded, trace.dat"),
            "{e}"
        );
        for e in [e, error_of(&["report", "-q"])] {
            assert!(
                !e.contains('\n') && !e.contains("Usage") && !e.contains("--help"),
                "{e}"
            );
        }
    }
}
