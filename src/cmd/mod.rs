//! The commands, one file each: every one checks its arguments into a
//! config (see `config`) before it does anything, then carries it out.

mod attach;
mod bench;
mod detach;
mod guard;
mod guest_modules;
mod list;
mod record;
mod report;
pub(crate) mod run;
mod script;
mod vm_target;
mod vms;
mod vms_model;
mod vms_view;

pub(crate) use guest_modules::say_uses;

use crate::cli::{Cli, Command};
use crate::config::Form;
use crate::error::{Error, Outcome};

/// Run the command the user asked for.
pub fn dispatch(cli: Cli) -> Result<Outcome, Error> {
    match cli.command {
        Some(Command::Record(args)) => record::main(&args),
        Some(Command::Report(args)) => report::main(&args),
        Some(Command::Script(args)) => script::main(&args),
        Some(Command::List(args)) => list::main(&args),
        Some(Command::Bench(args)) => bench::main(&args),
        Some(Command::Attach(args)) => attach::main(&args),
        Some(Command::Detach(args)) => detach::main(&args),
        Some(Command::Guard(args)) => guard::main(&args),
        Some(Command::Vms(args)) => vms::main(&args),
        None => run::main(&cli.run, &cli.output, Form::OneShot),
    }
}
