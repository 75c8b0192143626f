//! The tracing flags that a run, `record` and `attach` share (`TraceArgs`),
//! as the tracer's `Request`: written once, so that every command asks the
//! tracer alike.

use tracer::plan::Request;

use crate::cli::TraceArgs;
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
            events: self.event.clone(),
            module_events: Vec::new(),
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
        // Not this host's KVM: attach's auto mode goes by the guest's
        // room (`tracer::qemu::mode::decide`).
        self.request(cpus, false, true)
    }

    /// The tracing flags `vmtrace attach` cannot honour yet, refused before
    /// it connects rather than ignored.
    pub fn check_attach(&self) -> Result<(), InputError> {
        let refused = [(
            self.ring_events.is_some(),
            "--ring-events",
            "sizes its rings itself: a ring device as large as --buffer (16M to 1G) where the \
             guest takes a hot-plugged PCI device, else the guest's unused low memory",
            "; for larger rings give --buffer (e.g. --buffer 256M)",
        )];
        match refused.into_iter().find(|(given, ..)| *given) {
            Some((_, flag, why, instead)) => Err(InputError::NotOnAttach { flag, why, instead }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use tracer::plan::entry::EntryChoice;
    use tracer::plan::ModeChoice;

    use super::*;
    use crate::cli::{Cli, Command};

    fn attach(flags: &[&str]) -> TraceArgs {
        let argv = [
            "vmtrace", "attach", "--qmp", "q", "--kernel", "k", "--trace", "f",
        ];
        match Cli::parse_from(argv.iter().chain(flags)).command {
            Some(Command::Attach(a)) => a.tracing,
            c => panic!("{c:?}"),
        }
    }

    /// The flags reach the request as a run gives them, `--entry`
    /// included; attach keeps its own auto mode.
    #[test]
    fn one_request_for_run_and_attach() {
        let flags = ["--mode", "exitless", "--graph", "--pid", "1,2", "--args=g"];
        let t = attach(&flags);
        let run = t.request(4, true, false);
        assert_eq!(
            (run.mode, run.entry),
            (ModeChoice::Exitless, EntryChoice::Auto)
        );
        assert_eq!((run.cpus, run.emulator_host, run.linux), (4, true, false));
        assert!(run.graph && run.trace == ["f"] && run.pids == [1, 2] && run.args == ["g"]);
        let a = t.attach_request(2);
        assert_eq!(
            (a.entry, a.emulator_host, a.linux),
            (EntryChoice::Auto, false, true)
        );
        assert_eq!(
            (a.mode, a.cpus, a.pids),
            (ModeChoice::Exitless, 2, run.pids)
        );
    }

    #[test]
    fn attach_refuses_what_it_cannot_honour_and_takes_the_rest() {
        for entry in ["ftrace", "direct", "auto"] {
            let ok = ["--entry", entry];
            assert!(attach(&ok).check_attach().is_ok(), "{ok:?}");
            assert_eq!(
                attach(&ok).attach_request(1).entry,
                attach(&ok).entry.choice()
            );
        }
        assert!(attach(&[]).check_attach().is_ok());
        let e = attach(&["--ring-events", "64"]).check_attach().unwrap_err();
        let e = e.to_string();
        assert!(
            e.starts_with("--ring-events: vmtrace attach sizes its rings itself"),
            "{e}"
        );
        assert!(
            e.contains("; drop --ring-events; for larger rings give --buffer"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }
}
