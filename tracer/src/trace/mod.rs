//! What a session leaves: the data file, the trace model, the function
//! graph, time and vCPU windows, filters after recording, reports and exports, arguments and
//! return values and kernel stacks as printed.

pub mod cmdline;
pub mod datafile;
pub mod export;
pub mod fields;
pub mod filter;
pub mod graph;
pub mod model;
pub mod output_path;
pub mod report;
pub mod stacks;
pub mod values;
pub mod window;
