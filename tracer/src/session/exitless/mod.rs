//! Exitless tracing: vmtrace's own code and rings inside the guest. The
//! code and the rings' layout are planned (`crate::plan::exitless`); this
//! module writes, maps, drains and removes them.
//!
//! Each selected site becomes `call stub_k` (k: the site's index in the
//! `SiteIndex`). The stub loads k + 1 and jumps to one common trampoline,
//! which appends a record to the calling CPU's ring and returns: no VM exit.
//! A collector thread on the host drains the rings while the guest runs.
//! It returns as the kernel's `__fentry__` does (`ret`: `ret; int3`, or
//! through the kernel's return thunk and call depth accounting).
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
//! reads, in either per-CPU layout (`percpu`); every attach checks that each CPU's number is below the vCPU
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
//! records) on, stop at the first record whose commit word is 0: below
//! `head` it is reserved, not yet committed (its writer was interrupted by
//! the writer of the next one, or, on a preemptible kernel, preempted
//! between the two); from `head` on, not reserved. For each record read,
//! store 0 to its commit word; after consuming, store `limit = (oldest
//! slot not read + cap) * RECORD_LEN` (Release: after the zeroes). A slot
//! is reused only after the host moved `limit` past it, so no record
//! changes while it is read, and a non-zero commit word is never the
//! previous lap's.
//!
//! A reserved slot stops its ring's drain for `ring::STALL` (10 ms) at
//! most: a preempted writer may not run again for much longer, and the
//! records behind its slot would wait for it. Then the reader reads past
//! it and keeps it in a list of its own: it reads its record when it
//! commits (later than the records after it; its time is its own). The
//! limit stays one lap past the oldest slot not read, so the guest never
//! reserves that slot again meanwhile: if the writer stays away, the ring
//! fills one lap past it and further calls on that CPU are counted as
//! drops, as with a host that falls behind.
//!
//! The last drain, after the guest stopped, reads every committed record
//! up to `head`, past any slot still reserved and not committed, and
//! counts those as unfinished (`TraceMeta::unfinished`): calls whose
//! writer will never commit, whose site (the commit word) is therefore
//! unknown. Calls per CPU = records + drops + unfinished, exactly; per
//! site and CPU = records + drops, unless a call of that site is among the
//! unfinished.

pub mod backing;
pub mod child_starts;
pub mod code;
pub mod collect;
pub mod copy_fns;
pub mod error;
mod held;
pub mod map;
mod pace;
mod pending;
pub mod ring;
mod span;
pub mod state;
