//! vmtrace's tracer: the guest kernel's symbols and ftrace call sites, filters,
//! patching, trap handling, recording and reports.

pub mod exitless;
pub mod export;
pub mod filter;
pub mod graph;
pub mod hookable;
pub mod kallsyms;
pub mod kaslr;
pub mod list;
pub mod model;
pub mod patch;
pub mod payload;
pub mod record;
pub mod report;
pub mod session;
pub mod shadow;
pub mod sites;
pub mod store;
pub mod symbols;
pub mod tracefile;
pub mod window;
