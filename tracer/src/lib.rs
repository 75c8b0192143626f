//! vmtrace's tracer: the guest kernel's symbols and ftrace call sites, filters,
//! patching, trap handling, recording and reports.

pub mod filter;
pub mod sites;
pub mod symbols;
pub mod patch;
pub mod record;
pub mod trace;
pub mod tracing;
