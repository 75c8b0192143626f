//! `vmtrace detach --qmp SOCKET` (or `--domain NAME`): take out what a vmtrace that did not
//! detach (killed, out of memory, crashed) left in a QEMU (the library's
//! `tracer::qemu::repair`), saying in one line per thing what it did.

use tracer::qemu::repair;

use super::vm_target::VmTarget;
use crate::cli::DetachArgs;
use crate::error::{Error, InputError, Outcome};

pub fn main(args: &DetachArgs) -> Result<Outcome, Error> {
    let target = VmTarget::of(args.qmp.as_deref(), args.domain.as_deref(), &args.connect);
    let monitor = target.monitor().map_err(InputError::Qemu)?;
    let done = repair::repair_monitor(monitor).map_err(InputError::Qemu)?;
    if done.nothing {
        note!("vmtrace: nothing of vmtrace's found; the VM is as vmtrace would leave it");
        return Ok(Outcome::Clean);
    }
    Ok(say(&done))
}

/// Say what a repair did, one line per thing, and how it ended.
pub fn say(done: &repair::Repaired) -> Outcome {
    for line in &done.lines {
        note!("vmtrace: {line}");
    }
    match done.incomplete {
        false => {
            note!("vmtrace: repaired; the VM is as vmtrace would leave it");
            Outcome::Clean
        }
        true => Outcome::GuestFailed,
    }
}
