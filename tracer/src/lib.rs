//! vmtrace's tracer, by stage, in the order a trace is made:
//!
//! - [`kernel`]: what is read from the kernel image before the guest runs:
//!   its symbols (vmlinux or kallsyms in a bzImage's payload), its ftrace
//!   call sites, the function filters, where KASLR put it;
//! - [`plan`]: what to trace, resolved against that image and checked once;
//! - [`session`]: the live session over a running guest: patching under a
//!   pause, trap-mode recording, exitless trampoline and rings, shadow
//!   stacks, storing events, detaching;
//! - [`trace`]: what a session leaves: the data file, the trace model, the
//!   function graph, windows, reports and exports.
//!
//! Beside them, [`qemu`] reaches a running QEMU (monitor, gdbstub, RAM), a
//! second backend beside `vmm`.
//!
//! [`error::TracerError`] is any stage's error.
//!
//! Errors say what is wrong, never which CLI flag: the inputs they name and
//! the remedies they offer are data a front end words ([`advice`], the
//! tracer's part of `vmm::advice`).

pub mod advice;
pub mod error;
pub mod kernel;
pub mod plan;
pub mod qemu;
pub mod session;
pub mod trace;
