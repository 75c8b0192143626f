//! vmtrace's tracer: the guest kernel's symbols and ftrace call sites, filters,
//! patching, trap handling, recording and reports.

pub mod export;
pub mod filter;
pub mod patch;
pub mod record;
pub mod report;
pub mod sites;
pub mod symbols;
pub mod trace;
pub mod tracefile;
pub mod tracing;
