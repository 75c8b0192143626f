//! The tracing flags that a run, `record` and `attach` share (`TraceArgs`),
//! as the tracer's `Request`: written once, so that every command asks the
//! tracer alike.

use tracer::plan::entry::EntryChoice;
use tracer::plan::Request;

use crate::cli::{EntryArg, TraceArgs};
use crate::error::InputError;

impl TraceArgs {
    /// The tracer's request for these flags, on a guest of `cpus` vCPUs;
    /// `emulator_host`: `vmm::host::emulates_ring0` (auto mode traps there).
    pub fn request(&self, cpus: usize, emulator_host: bool, linux: bool) -> Request {
        Request {
            trace: self.trace.clone(),
            notrace: self.notrace.clone(),
            pids: self.pid.clone(),
            comm: self.comm.clone(),
            args: self.args.clone(),
            retval: self.retval,
            stack: self.stack.clone(),
            entry: self.entry.choice(),
            graph: self.graph,
            mode: self.mode.choice(),
            ring_events: self.ring_events,
            cpus,
            emulator_host,
            linux,
        }
    }

    /// `vmtrace attach`'s request, once `check_attach` passed.
    pub fn attach_request(&self, cpus: usize) -> Request {
        Request {
            // The QEMU session patches ftrace sites only (`auto` included).
            entry: EntryChoice::Ftrace,
            // Not this host's KVM: attach's auto mode goes by the guest's
            // room (`tracer::qemu::mode::decide`).
            ..self.request(cpus, false, true)
        }
    }

    /// The tracing flags `vmtrace attach` cannot honour yet, refused before
    /// it connects rather than ignored.
    pub fn check_attach(&self) -> Result<(), InputError> {
        let refused = [
            (
                self.entry == EntryArg::Direct,
                "--entry direct",
                "enters traced functions through their ftrace call sites only",
            ),
            (
                self.ring_events.is_some(),
                "--ring-events",
                "sizes its rings itself, to the guest's unused memory",
            ),
        ];
        match refused.into_iter().find(|(given, ..)| *given) {
            Some((_, flag, why)) => Err(InputError::NotOnAttach { flag, why }),
            None => Ok(()),
        }
    }
}
