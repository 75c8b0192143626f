//! How a library error names what the user gave and what to do, without a
//! front end's words (a CLI flag) in its text.
//!
//! The one mechanism, for `vmm` and `tracer` alike: an error whose message
//! names a user input (the vCPU count, the trace globs) or offers a remedy
//! (trace with traps, give the kernel's vmlinux) holds them as data, an
//! `Input` and a `Remedy`, and implements `Advice`. `Advice::say(words)` is
//! the message with them in a front end's `Words`; the error's `Display` is
//! `say(&Plain)`, the library's own words. So the library says "vCPU count
//! 65 is out of range" and "...; trace in trap mode" where the CLI, with its
//! flag words (src/error.rs), says "--cpus 65 ..." and "...; use --mode trap".
//!
//! A message is its problem (`Advice::problem`), then "; " and its remedy
//! when it has one (`Advice::remedy`, also there for a front end that acts on
//! it, e.g. falls back to traps); an error whose remedy sits elsewhere in its
//! sentence overrides `say`. Wrapper enums delegate all three. A variant
//! whose `Display` is `say(&Plain)` needs its own arm in `problem` (the
//! others' arm is their `Display`, which would call back). A hint picked
//! from a table marks where it names an input (`assist::AssistError`).
//!
//! Lives in `vmm` because both libraries use it and `vmm` is the one below.

/// A setting the user gives a front end, named in an error's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// The guest kernel file.
    Kernel,
    /// The initrd file.
    Initrd,
    /// How many vCPUs the guest has.
    Cpus,
    /// The guest's memory size, in MiB.
    Mem,
    /// The globs of the functions to trace.
    Trace,
    /// The globs of the functions not to trace.
    Notrace,
    /// The globs of the functions to list (`tracer::plan::list`).
    List,
    /// The globs of the traced functions whose stacks to record.
    Stack,
    /// The globs of the traced functions whose arguments to record.
    Args,
    /// A command line that replaces the guest's default one.
    CmdlineReplace,
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
}

/// How a front end words inputs and remedies.
pub trait Words {
    /// The name of `input` in a sentence ("--cpus", "vCPU count").
    fn input(&self, input: Input) -> &'static str;
    /// What to do, as an imperative clause ("use --mode trap").
    fn remedy(&self, remedy: Remedy) -> &'static str;
}

/// The library's own words, for `Display`.
pub struct Plain;

impl Words for Plain {
    fn input(&self, input: Input) -> &'static str {
        match input {
            Input::Kernel => "kernel",
            Input::Initrd => "an initrd",
            Input::Cpus => "vCPU count",
            Input::Mem => "memory size",
            Input::Trace => "trace filter",
            Input::Notrace => "notrace filter",
            Input::List => "list globs",
            Input::Stack => "stack globs",
            Input::Args => "argument globs",
            Input::CmdlineReplace => "a replacement command line",
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
        }
    }
}

/// An error whose message names inputs or offers a remedy (module docs).
pub trait Advice {
    /// What is wrong, with any input named in `words`.
    fn problem(&self, words: &dyn Words) -> String;

    /// What the user can do, when the message offers something.
    fn remedy(&self) -> Option<Remedy> {
        None
    }

    /// The whole message in `words`: the problem, then "; " and the remedy.
    fn say(&self, words: &dyn Words) -> String {
        join(self.problem(words), self.remedy(), words)
    }
}

/// `problem`, then "; " and `remedy` in `words`: `Advice::say`'s default,
/// for wrapper enums whose own variants keep it.
pub fn join(problem: String, remedy: Option<Remedy>, words: &dyn Words) -> String {
    match remedy {
        Some(r) => format!("{problem}; {}", words.remedy(r)),
        None => problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Flags;
    impl Words for Flags {
        fn input(&self, _: Input) -> &'static str {
            "<flag>"
        }
        fn remedy(&self, _: Remedy) -> &'static str {
            "use <flag>"
        }
    }

    struct Example;
    impl Advice for Example {
        fn problem(&self, w: &dyn Words) -> String {
            format!("{} 3 is wrong", w.input(Input::Cpus))
        }
        fn remedy(&self) -> Option<Remedy> {
            Some(Remedy::TrapMode)
        }
    }

    #[test]
    fn a_message_is_its_problem_then_its_remedy_in_the_words_given() {
        assert_eq!(
            Example.say(&Plain),
            "vCPU count 3 is wrong; trace in trap mode"
        );
        assert_eq!(Example.say(&Flags), "<flag> 3 is wrong; use <flag>");
    }
}
