//! The QEMU backend's wire layer: a running QEMU reached through the
//! interfaces it ships with. [`qmp`] talks to its monitor over one connection,
//! [`monitor`] per burst over any transport ([`queries`]: version, PID,
//! vCPUs, the RAM layout, opening its gdbstub), [`gdb`] to its gdbstub
//! (all-stop, registers, coherent guest memory), [`procmem`] reads and writes its
//! guest RAM through /proc/PID/mem while the guest runs; [`lines`] reads its lines within bounds, [`layout`] parses
//! the monitor's texts about RAM, [`regs`] the stub's target description,
//! [`rsp`] the stub's encodings; [`trap`] adds breakpoints to the stub client, [`step`] steps a vCPU over one, [`frames`] keeps the function graph's frames in trap mode, [`stub`] takes
//! the stub only where no one else can hold it; [`liveness`] tells a QEMU
//! gone from a stalled one and whose a stop is; [`journal`] keeps on the host
//! what an attach changes, [`marker`] says in the guest whose region it is,
//! and [`repair`] undoes what a killed vmtrace left. [`libvirt`] reaches a
//! domain's QEMU through libvirt (its monitor passthrough), [`procs`] finds
//! the host's QEMU processes and their QMP sockets in /proc. [`ivshmem`]
//! hot-plugs the ring device (rings in memory of vmtrace's own) on guests
//! that take it.

pub mod breakpoints;
pub mod burst;
pub mod clock;
mod drive;
pub mod ending;
pub mod error;
pub mod event_guard;
mod event_modules;
mod event_reload;
pub mod event_sites;
pub mod frames;
mod funcs_loads;
pub mod gdb;
mod guarded_sites;
pub mod guest;
pub mod ivshmem;
pub mod journal;
mod kernel_at;
pub mod layout;
pub mod libvirt;
pub mod libvirt_monitor;
mod lines;
pub mod liveness;
pub mod marker;
pub mod mode;
pub mod module_files;
pub mod module_follow;
pub mod module_hooks;
pub mod modules;
pub mod monitor;
mod pairing;
pub mod procmem;
pub mod procs;
pub mod qmp;
pub mod queries;
pub mod regs;
pub mod repair;
pub mod reset;
pub mod ring_device;
pub mod rsp;
pub mod session;
mod site_span;
mod staging;
mod static_guard;
pub mod step;
pub mod stub;
mod stub_memory;
pub mod tcg_flags;
pub mod trap;
mod unix_connect;
mod vcpus;
