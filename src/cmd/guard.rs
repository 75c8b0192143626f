//! The guardian of a `vmtrace attach`: a second vmtrace process that
//! repairs the VM (`tracer::qemu::repair`) when the attach dies without
//! detaching (SIGKILL, out of memory, a crash), so that a trap-mode guest
//! never freezes at a breakpoint nobody serves. The attach holds the
//! write end of a pipe that is the guardian's stdin: the kernel closes it
//! however the attach ends, and the guardian then looks for the attach's
//! journal. A clean detach removed it: the guardian exits, untouched.
//! A detach that kept the journal on purpose (the ring device of a VM
//! someone holds stopped, said by the attach with its remedy) tells the
//! guardian so on the pipe ([`Guardian::detached`]): it exits untouched
//! too, rather than repair what the attach just left and said.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};

use std::time::{Duration, Instant};

use tracer::qemu::{journal, repair};

use super::vm_target::VmTarget;
use crate::cli::GuardArgs;
use crate::error::{Error, InputError, Outcome};

/// The hidden subcommand's name.
pub const GUARD: &str = "guard";

/// How long the attach may take to exit once its pipe closed (a process
/// stuck in uninterruptible sleep while exiting, e.g. on a dead NFS
/// mount, can take longer: the repair then says it still runs).
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// What the attach sends its guardian once it detached: the VM is as the
/// attach said, whatever it left (its journal) said with its remedy.
const DETACHED: &[u8] = b"detached\n";

/// The attach's end of its guardian: the guardian lives until this
/// process ends (the pipe closes), so keep it until then.
pub struct Guardian {
    _child: Child,
    pipe: Option<ChildStdin>,
}

impl Guardian {
    /// The attach detached and said what it left: the guardian is to
    /// leave the VM alone. (A write that fails leaves it to repair, as
    /// it would after a kill.)
    pub fn detached(&mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            let _ = pipe.write_all(DETACHED);
            // Kept open: its closing is the attach's exit.
            self.pipe = Some(pipe);
        }
    }
}

/// [`spawn`], or None, said with the remedy a killed attach then needs.
pub fn spawn_or_say(target: VmTarget<'_>, qemu_pid: u32) -> Option<Guardian> {
    spawn(target, qemu_pid)
        .map_err(|e| {
            note!(
                "vmtrace: no guardian ({e}): if vmtrace is killed, repair the VM with `{}`",
                target.detach_command()
            );
        })
        .ok()
}

/// Start the guardian of this attach to the QEMU `qemu_pid`, `target`.
pub fn spawn(target: VmTarget<'_>, qemu_pid: u32) -> std::io::Result<Guardian> {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(std::env::current_exe()?)
        .arg(GUARD)
        .args(target.args())
        .arg("--qemu-pid")
        .arg(qemu_pid.to_string())
        .arg("--attach-pid")
        .arg(std::process::id().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        // Its own process group: a Ctrl-C at the terminal, meant for the
        // attach (which then detaches), does not end its guardian.
        .process_group(0)
        .spawn()?;
    let pipe = child.stdin.take();
    Ok(Guardian {
        _child: child,
        pipe,
    })
}

pub fn main(args: &GuardArgs) -> Result<Outcome, Error> {
    // Until the attach is gone: EOF (or an error) on the pipe.
    let mut told = Vec::new();
    let mut chunk = [0u8; 64];
    let mut stdin = std::io::stdin();
    while let Ok(n @ 1..) = stdin.read(&mut chunk) {
        told.extend_from_slice(&chunk[..n]);
    }
    if told.ends_with(DETACHED) {
        return Ok(Outcome::Clean);
    }
    // The pipe closes as the attach exits, a moment before the kernel
    // shows it exited: until then the repair would take it for alive.
    let deadline = Instant::now() + EXIT_WAIT;
    while !journal::exited(args.attach_pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let target = VmTarget::of(args.qmp.as_deref(), args.domain.as_deref(), &args.connect);
    let done = repair::repair_journaled_with(|| target.monitor(), args.qemu_pid, args.attach_pid)
        .map_err(InputError::Qemu)?;
    let Some(done) = done else {
        return Ok(Outcome::Clean);
    };
    note!(
        "vmtrace: the attach (pid {}) ended without detaching; its guardian repairs the VM:",
        args.attach_pid
    );
    Ok(super::detach::say(&done))
}
