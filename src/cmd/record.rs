//! `vmtrace record`: boot and trace as the one-shot form does, save the
//! trace to the data file (vmtrace.data by default, the previous one kept
//! as vmtrace.data.old) and any exports, print no report.

use crate::cli::RecordArgs;
use crate::config::Form;
use crate::error::{Error, Outcome};

pub fn main(args: &RecordArgs) -> Result<Outcome, Error> {
    super::run::main(&args.run, &args.output, Form::Record)
}
