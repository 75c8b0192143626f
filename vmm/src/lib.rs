//! vmtrace's VMM: a small KVM virtual machine monitor that boots an
//! instrumented guest kernel, runs its vCPUs, stops them all on request, and
//! gives the tracer access to guest memory by guest-virtual address.

pub mod boot;
pub mod gva;
pub mod layout;
