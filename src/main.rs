//! vmtrace: trace a Linux guest kernel's function calls from the hypervisor.

mod bench;
mod cli;
mod output;
mod session;
mod stats;
mod trace;

use std::process::ExitCode;

use clap::Parser;

/// Exit status for bad input (usage, files, configuration).
const EXIT_BAD_INPUT: u8 = 2;
/// Exit status when the guest did not end cleanly.
const EXIT_GUEST_FAILED: u8 = 1;

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
            eprintln!("vmtrace: {first} (see vmtrace --help)");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    match session::main(cli) {
        Ok(session::Outcome::Clean) => ExitCode::SUCCESS,
        Ok(session::Outcome::GuestFailed) => ExitCode::from(EXIT_GUEST_FAILED),
        Err(e) => {
            eprintln!("vmtrace: {e}");
            ExitCode::from(match e {
                session::Error::Input(_) => EXIT_BAD_INPUT,
                session::Error::Runtime(_) => EXIT_GUEST_FAILED,
            })
        }
    }
}
