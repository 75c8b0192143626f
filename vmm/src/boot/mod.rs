//! Putting a guest kernel into memory and the vCPUs into their entry state.

pub mod linux;
pub mod mptable;
