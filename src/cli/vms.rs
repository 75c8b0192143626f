//! `vmtrace vms`'s flags.

use clap::{Args, ValueEnum};

/// `vmtrace vms`: where to look, how to print.
#[derive(Args, Debug, Clone)]
pub struct VmsArgs {
    /// libvirt's connection URI.
    #[arg(long, value_name = "URI", default_value = tracer::qemu::libvirt::DEFAULT_URI)]
    pub connect: String,
    /// text (a table), or json.
    #[arg(long, value_enum, default_value_t = VmsFormat::Text)]
    pub format: VmsFormat,
}

/// What `vmtrace vms` prints.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmsFormat {
    Text,
    Json,
}
