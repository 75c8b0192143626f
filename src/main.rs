//! vmtrace: trace a Linux guest kernel's function calls from the hypervisor.

/// `eprintln!` and `eprint!` without their panic: a closed or full stderr
/// (`vmtrace ... 2>&1 | head`) loses the message, not the run.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
macro_rules! note_part {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

mod bench;
mod cli;
mod cmd;
mod config;
mod emit;
mod error;
mod stats;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

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
            // clap's first line names the problem; the usage block that follows is noise here.
            let text = e.to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ");
            let _ = writeln!(std::io::stderr(), "vmtrace: {first} (see vmtrace --help)");
            return ExitCode::from(error::EXIT_BAD_INPUT);
        }
    };
    match cmd::dispatch(cli) {
        Ok(outcome) => ExitCode::from(outcome.exit_status()),
        Err(e) => {
            // Never a panic, even with stderr gone.
            let _ = writeln!(std::io::stderr(), "vmtrace: {e}");
            ExitCode::from(e.exit_status())
        }
    }
}
