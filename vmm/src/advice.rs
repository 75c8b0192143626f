//! How a library error names what the user gave, without a front end's
//! words (a CLI flag) in its text.
//!
//! The one mechanism, for `vmm` and `tracer` alike: an error whose message
//! names a user input (the vCPU count, the memory size) holds it as data, an
//! `Input`, and implements `Advice`. `Advice::say(words)` is the message
//! with it in a front end's `Words`; the error's `Display` is `say(&Plain)`,
//! the library's own words. So the library says "vCPU count 65 is out of
//! range" where the CLI, with its flag words (src/error.rs), says "--cpus 65
//! is out of range".
//!
//! Here only the VMM's inputs: `vmm` knows nothing of tracing. The tracer
//! extends this with its own inputs and its remedies ("...; trace in trap
//! mode"), in words that extend these (`tracer::advice`); no VMM error
//! offers a remedy.
//!
//! Wrapper enums delegate. A variant whose `Display` is `say(&Plain)` needs
//! its own arm in `problem` (the others' arm is their `Display`, which would
//! call back). A hint picked from a table marks where it names an input
//! (`assist::AssistError`).

/// A setting the user gives a front end to run a VM, named in an error's
/// message.
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
    /// A command line that replaces the guest's default one.
    CmdlineReplace,
    /// How long the guest is traced before it is stopped.
    Duration,
}

/// How a front end words the inputs.
pub trait Words {
    /// The name of `input` in a sentence ("--cpus", "vCPU count").
    fn input(&self, input: Input) -> &'static str;
}

/// The libraries' own words, for `Display` (the tracer's too).
pub struct Plain;

impl Words for Plain {
    fn input(&self, input: Input) -> &'static str {
        match input {
            Input::Kernel => "kernel",
            Input::Initrd => "an initrd",
            Input::Cpus => "vCPU count",
            Input::Mem => "memory size",
            Input::CmdlineReplace => "a replacement command line",
            Input::Duration => "the trace's duration",
        }
    }
}

/// An error whose message names inputs (module docs).
pub trait Advice {
    /// What is wrong, with any input named in `words`.
    fn problem(&self, words: &dyn Words) -> String;

    /// The whole message in `words`, what a front end says: the problem, as
    /// no VMM error offers a remedy (the tracer's do).
    fn say(&self, words: &dyn Words) -> String {
        self.problem(words)
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
    }

    struct Example;
    impl Advice for Example {
        fn problem(&self, w: &dyn Words) -> String {
            format!("{} 3 is wrong", w.input(Input::Cpus))
        }
    }

    #[test]
    fn a_message_names_its_inputs_in_the_words_given() {
        assert_eq!(Example.say(&Plain), "vCPU count 3 is wrong");
        assert_eq!(Example.say(&Flags), "<flag> 3 is wrong");
    }
}
