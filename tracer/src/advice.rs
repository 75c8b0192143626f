//! The tracer's part of how a library error names what the user gave and
//! what to do, without a front end's words (`vmm::advice`, the mechanism).
//!
//! An error whose message names a tracer input (the trace globs) or offers a
//! remedy (trace with traps, give the kernel's vmlinux) holds them as data,
//! a `TraceInput` and a `Remedy`, and implements `TracerAdvice`.
//! `TracerAdvice::say(words)` is the message with them in a front end's
//! `TracerWords`, which extend the VMM's `Words`; the error's `Display` is
//! `say(&Plain)`, the libraries' own words. So the library says "...; trace
//! in trap mode" where the CLI, with its flag words (src/error.rs), says
//! "...; use --mode trap".
//!
//! A message is its problem (`TracerAdvice::problem`), then "; " and its
//! remedy when it has one (`TracerAdvice::remedy`, also there for a front
//! end that acts on it, e.g. falls back to traps); an error whose remedy
//! sits elsewhere in its sentence overrides `say`. Wrapper enums delegate
//! all three; one wrapping a VMM error (a file's) says it in the same
//! words, `TracerWords` being `Words`, with no remedy. A variant whose
//! `Display` is `say(&Plain)` needs its own arm in `problem` (the others'
//! arm is their `Display`, which would call back).

use vmm::advice::Words;

/// The libraries' own words: `vmm`'s, with the tracer's inputs and remedies.
pub use vmm::advice::Plain;

/// A setting the user gives the tracer, named in an error's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceInput {
    /// The globs of the functions to trace.
    Trace,
    /// The globs of the functions not to trace.
    Notrace,
    /// The globs of the functions to list (`crate::plan::list`).
    List,
    /// The globs of the traced functions whose stacks to record.
    Stack,
    /// The globs of the traced functions whose arguments to record.
    Args,
    /// The globs of the traced functions whose events a saved trace's
    /// views show (`crate::trace::filter`).
    Symbols,
}

/// What the user can do about an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remedy {
    /// Trace with traps: the exitless trampoline cannot work here.
    TrapMode,
    /// Trace fewer functions (smaller rings), or with traps.
    FewerFunctionsOrTrapMode,
    /// Trace with traps, or give the kernel's vmlinux (its data symbols).
    TrapModeOrVmlinux,
    /// Give the kernel's vmlinux: a bzImage alone did not do.
    KernelVmlinux,
    /// Give the kernel's unstripped vmlinux: a bzImage's kallsyms did not do.
    UnstrippedKernelVmlinux,
    /// Give the unstripped vmlinux: the one given has no symbol table.
    UnstrippedVmlinux,
    /// Give the vmlinux of the running kernel: the one given is another's.
    OwnVmlinux,
    /// Give the vmlinux of this very build: the one given differs from it.
    SameBuildVmlinux,
    /// Boot the guest without FRED, or give the vmlinux of this very build
    /// with its data symbols: its KASLR offset cannot be read otherwise.
    FredOffOrVmlinux,
    /// Give the uncompressed vmlinux, or the bzImage alone (vmtrace reads a
    /// bzImage's own symbols): a bzImage was given as the vmlinux.
    VmlinuxNotBzImage,
    /// Trace through direct entries: the kernel has no ftrace call sites.
    DirectEntries,
    /// Trace through the kernel's ftrace call sites: direct entries cannot.
    FtraceEntries,
    /// Trace in exitless mode, or through ftrace's call sites: direct
    /// entries need vmtrace's code in guest memory, which this mode lacks.
    ExitlessModeOrFtraceEntries,
}

/// How a front end words the tracer's inputs and remedies, besides the
/// VMM's inputs (a tracer front end runs VMs too).
pub trait TracerWords: Words {
    /// The name of `input` in a sentence ("--trace", "trace filter").
    fn trace_input(&self, input: TraceInput) -> &'static str;
    /// What to do, as an imperative clause ("use --mode trap").
    fn remedy(&self, remedy: Remedy) -> &'static str;
}

impl TracerWords for Plain {
    fn trace_input(&self, input: TraceInput) -> &'static str {
        match input {
            TraceInput::Trace => "trace filter",
            TraceInput::Notrace => "notrace filter",
            TraceInput::List => "list globs",
            TraceInput::Stack => "stack globs",
            TraceInput::Args => "argument globs",
            TraceInput::Symbols => "symbol filter",
        }
    }

    fn remedy(&self, remedy: Remedy) -> &'static str {
        match remedy {
            Remedy::TrapMode => "trace in trap mode",
            Remedy::FewerFunctionsOrTrapMode => "trace fewer functions, or in trap mode",
            Remedy::TrapModeOrVmlinux => "trace in trap mode, or give its vmlinux",
            Remedy::KernelVmlinux => "pass the kernel's vmlinux",
            Remedy::UnstrippedKernelVmlinux => "pass the kernel's unstripped vmlinux",
            Remedy::UnstrippedVmlinux => "pass the unstripped vmlinux",
            Remedy::OwnVmlinux => "pass its own vmlinux",
            Remedy::SameBuildVmlinux => "pass the vmlinux of this very build",
            Remedy::FredOffOrVmlinux => {
                "boot it with `fred=off` on its command line, or pass the vmlinux of this very \
                 build (with its data symbols)"
            }
            Remedy::VmlinuxNotBzImage => {
                "pass the uncompressed vmlinux (or the bzImage alone: vmtrace reads a bzImage's \
                 own symbols)"
            }
            Remedy::DirectEntries => "trace it through direct entries, or rebuild it with them",
            Remedy::FtraceEntries => "trace it through its ftrace call sites",
            Remedy::ExitlessModeOrFtraceEntries => {
                "trace in exitless mode, or through ftrace's call sites"
            }
        }
    }
}

/// A tracer error whose message names inputs or offers a remedy (module
/// docs).
pub trait TracerAdvice {
    /// What is wrong, with any input named in `words`.
    fn problem(&self, words: &dyn TracerWords) -> String;

    /// What the user can do, when the message offers something.
    fn remedy(&self) -> Option<Remedy> {
        None
    }

    /// The whole message in `words`: the problem, then "; " and the remedy.
    fn say(&self, words: &dyn TracerWords) -> String {
        join(self.problem(words), self.remedy(), words)
    }
}

/// `problem`, then "; " and `remedy` in `words`: `TracerAdvice::say`'s
/// default, for wrapper enums whose own variants keep it.
pub fn join(problem: String, remedy: Option<Remedy>, words: &dyn TracerWords) -> String {
    match remedy {
        Some(r) => format!("{problem}; {}", words.remedy(r)),
        None => problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm::advice::Input;

    /// A front end that keeps the VMM's plain words and has its own for the
    /// tracer's: one value says both crates' errors.
    struct Flags;
    impl Words for Flags {
        fn input(&self, input: Input) -> &'static str {
            Plain.input(input)
        }
    }
    impl TracerWords for Flags {
        fn trace_input(&self, _: TraceInput) -> &'static str {
            "<flag>"
        }
        fn remedy(&self, _: Remedy) -> &'static str {
            "use <flag>"
        }
    }

    struct Example;
    impl TracerAdvice for Example {
        fn problem(&self, w: &dyn TracerWords) -> String {
            format!(
                "{} 3 with {} x is wrong",
                w.input(Input::Cpus),
                w.trace_input(TraceInput::Trace)
            )
        }
        fn remedy(&self) -> Option<Remedy> {
            Some(Remedy::TrapMode)
        }
    }

    #[test]
    fn a_message_is_its_problem_then_its_remedy_in_the_words_given() {
        assert_eq!(
            Example.say(&Plain),
            "vCPU count 3 with trace filter x is wrong; trace in trap mode"
        );
        assert_eq!(
            Example.say(&Flags),
            "vCPU count 3 with <flag> x is wrong; use <flag>"
        );
    }
}
