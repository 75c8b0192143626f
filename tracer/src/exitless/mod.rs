//! Exitless tracing: vmtrace's own code and rings inside the guest.
//!
//! Each selected site becomes `call stub_k` (k: the site's index in the
//! `SiteIndex`). The stub loads k + 1 and jumps to one common trampoline,
//! which appends a record to the calling CPU's ring and returns: no VM exit.
//! A collector thread on the host drains the rings while the guest runs.
//!
//! # Where it lives
//! A region of guest-physical memory the guest is never told about (its own
//! KVM memory slot at `REGION_GPA`, outside the e820 map), mapped at attach
//! into the kernel half of the address space with 2 MiB pages, in entries
//! 508-510 of the page directory that maps 0xffffffffc0000000-: Linux's
//! `level2_fixmap_pgt`, whose entries 508-511 head_64.S leaves empty
//! (Documentation/x86/x86_64/mm.rst: the fixmap and the vsyscall page are
//! below). `call rel32` reaches it from all of the kernel image
//! (0xffffffff80000000 + up to 1 GiB). Code: present, read-only,
//! executable; data: present, writable, NX; both supervisor-only, not
//! global. Both stay mapped until the guest ends: a task preempted inside the
//! trampoline must be able to finish (ftrace's reason for not freeing
//! dynamic trampolines on preemptible kernels).
//!
//! # Rings (one per guest CPU, found through the CPU's own per-CPU data:
//! `mov r10d, gs:[cpu_number]`, what the kernel's `smp_processor_id()`
//! reads; every attach checks that each CPU's number is below the vCPU
//! count there, since the trampoline indexes the rings with it unchecked)
//!
//! At `DATA_VA + cpu * layout.ring_bytes`:
//!
//! | offset            | field                         | written by |
//! |-------------------|-------------------------------|------------|
//! | `HEAD_OFF`        | u64 bytes reserved so far (records x `RECORD_LEN`) | guest |
//! | `LIMIT_OFF`       | u64 first byte not free yet (same unit) | host |
//! | `DROPS_OFF`       | u64 per site: calls not recorded (ring full) | guest |
//! | `layout.records_off` | `cap` records of `RECORD_LEN` bytes | guest; host clears commit words |
//!
//! A record: the commit word u32 at 0 (the site index + 1, written last; 0
//! while the slot holds no record), guest TSC u64 at 8, parent (the traced
//! function's return address, read from the stack) u64 at 16, and with the
//! function graph the return address's stack slot u64 at 24.
//!
//! Writer (trampoline), per call: read `head`; if `head >= limit` the ring
//! is full: `drops[k] += 1` and return. Else reserve with `cmpxchg head:
//! head -> head + RECORD_LEN`, retrying if it fails, then write the
//! record's fields and last its commit word. Interrupts and NMIs on the same
//! CPU come only between two instructions, so a nested trampoline run either
//! finishes before the read of `head` or makes the `cmpxchg` fail. On a
//! preemptible kernel, where a task can read its CPU number, be moved, and
//! finish its reservation on another CPU's ring, the `cmpxchg` and the drop
//! counter's `inc` are locked; elsewhere they are not (as the kernel's
//! `local_t`). The lock costs no extra instruction. x86 stores are seen in program order (TSO), so a record
//! whose commit word reads non-zero is complete.
//!
//! Reader (host collector), per ring: from `tail` (kept by the host, in
//! records) on, stop at the first record whose commit word is 0 (reserved,
//! not yet committed: e.g. its writer was interrupted by the writer of the
//! next one); for each record read, store 0 to its commit word; after
//! consuming, store `limit = (tail + cap) * RECORD_LEN` (Release: after the
//! zeroes). A slot is reused only after the host moved `limit` past it, so
//! no record changes while it is read, and a non-zero commit word is never
//! the previous lap's. Calls per site and CPU = records + drops, exactly.

mod body;
pub mod collect;
pub mod graph_code;
pub mod layout;
pub mod map;
mod pending;
pub mod ring;
pub mod state;
pub mod trampoline;
pub use layout::*;
