//! The trace model: a recorded trace, everything a report, a saved file or
//! an export needs, self-contained (no vmlinux needed to read it back).

use std::collections::HashMap;
use std::ops::Range;

use crate::kernel::symbols::Symbol;

/// One traced function entry, or (function-graph traces) one return.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Event {
    /// Host CLOCK_MONOTONIC, nanoseconds.
    pub ts_ns: u64,
    /// Entry: the return address at [RSP], where in the caller the call came
    /// from (the real one, also when a hooked frame had replaced it: a tail
    /// call). Return: the address execution went back to (the same).
    pub parent: u64,
    /// Function-graph traces: the guest-virtual address of the stack slot
    /// holding the function's return address (which guest stack, and how
    /// deep), with bit 0 set for a return (`RETURN_BIT`; slots are 8-byte
    /// aligned). 0: an entry whose return is not hooked (entry-only tracing,
    /// or no frame was free).
    pub slot: u64,
    /// Index into `Trace::functions`.
    pub func: u32,
    /// vCPU that made the call (or the return).
    pub cpu: u32,
    /// The guest task that ran it: `Trace::tasks[task - 1]`; 0 when not
    /// known (the kernel has no BTF, or its current task was unreadable).
    pub task: u32,
    /// An entry at a `--stack` function: its kernel stack,
    /// `Trace::stacks[stack - 1]`; 0: none recorded.
    pub stack: u32,
    /// A return (`--retval`): the function's return value, RAX as it
    /// returned. An entry (`--args`): its arguments, `Trace::args[data -
    /// 1]`; 0: none recorded. Otherwise 0.
    pub data: u64,
}

/// A guest task as vmtrace saw it at a call: ftrace's `comm-pid`. One
/// task changes entries when it changes its name (exec, `PR_SET_NAME`);
/// the idle task of each CPU is its own entry (pid 0, `swapper/N`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Task {
    /// The thread's id (`task_struct.pid`): 0 for the idle tasks.
    pub pid: u32,
    /// Its thread group's, the process id (`task_struct.tgid`).
    pub tgid: u32,
    /// `task_struct.comm`, up to its first NUL (at most 15 bytes), bytes
    /// that are not UTF-8 replaced.
    pub comm: String,
}

/// Bit 0 of `Event::slot`: the event is a return.
pub const RETURN_BIT: u64 = 1;

impl Event {
    /// A function's return, not its entry.
    pub fn is_return(&self) -> bool {
        self.slot & RETURN_BIT != 0
    }

    /// The return-address slot (without the return bit); 0 if not hooked.
    pub fn stack_slot(&self) -> u64 {
        self.slot & !RETURN_BIT
    }
}

/// Facts about the run, for the report header.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceMeta {
    /// The kernel file the guest booted.
    pub kernel: String,
    /// GNU build id of the vmlinux the symbols came from (hex), if it has one.
    pub build_id: Option<String>,
    pub cpus: u32,
    /// Host monotonic time of the attach and of the detach, ns.
    pub attach_ns: u64,
    pub detach_ns: u64,
    /// Sites written with the trap.
    pub sites_patched: u64,
    /// Selected sites left alone: in init text (freed by the guest after boot)
    /// or not holding a NOP / `call __fentry__` when checked.
    pub sites_skipped_init: u64,
    pub sites_skipped_other: u64,
    /// The attach's stop-the-world window and latency, ns.
    pub attach_window_ns: u64,
    pub attach_latency_ns: u64,
    /// Events counted (exact), and how many of them were not stored (over
    /// `--max-events`); counts include the unstored ones.
    pub events_total: u64,
    pub events_dropped: u64,
    /// Traps whose caller could not be read from the guest stack.
    pub parent_unreadable: u64,
    /// Why the guest stopped.
    pub stop_reason: String,
    /// How calls reached vmtrace: "trap" or "exitless".
    pub mode: String,
    /// Exits at the trace port while attached (every call in trap mode,
    /// none in exitless mode).
    pub trap_exits: u64,
    /// Function-graph tracing: returns hooked and recorded too.
    pub graph: bool,
    /// Returns counted (exact, in `Trace::returns`) but not stored.
    pub returns_dropped: u64,
    /// Entries whose return could not be hooked (vmtrace's frame pool in the
    /// guest was full): their duration is unknown.
    pub unhooked: u64,
    /// The guest TSC's rate in kHz, when vmtrace read it (0: unknown).
    pub tsc_khz: u64,
    /// Where the symbols came from (a vmlinux and how it was found, or
    /// kallsyms in the bzImage); empty when unknown (saved traces do not
    /// keep it).
    pub symbols: String,
    /// Events (entries and returns) the recording could not keep because
    /// the writer fell behind or the disk refused them, per vCPU; included
    /// in `events_dropped` and `returns_dropped`. Empty: none (or an older
    /// file).
    pub lost: Vec<u64>,
    /// Flight recorder (`--overwrite`): the events not stored are the
    /// oldest ones, overwritten by newer ones.
    pub overwrite: bool,
    /// `__mcount_loc` entries left out of tracing (not at a function entry),
    /// as said at the run; empty: none.
    pub rejected_sites: String,
    /// KASLR: how far the running kernel was from its link addresses,
    /// virtual and physical, in bytes (None: not known).
    pub kernel_offset: Option<(i64, i64)>,
    /// Read from a data file whose recording was cut short (the process was
    /// killed before it wrote the footer): the counts are those of the
    /// stored events, the run's facts those known at attach.
    pub incomplete: bool,
    /// Guest instructions KVM's instruction emulator ran during the whole
    /// run, per vCPU (its `insn_emulation` statistic): every guest kernel
    /// instruction where KVM emulates guest ring 0, only the rare emulated
    /// ones elsewhere. None: KVM did not count them (or not known: saved
    /// traces do not keep it).
    pub guest_instructions_emulated: Option<Vec<u64>>,
    /// Exitless mode: records reserved in vmtrace's rings and never
    /// committed when the run ended (their writer stopped, or was
    /// preempted, between reserving and committing): calls whose function
    /// is not known, so they are in no count and not in `events_total`
    /// (calls = `events_total` + this). Saved traces do not keep it.
    pub unfinished: u64,
    /// Who ran the guest, when not vmtrace's own VMM: e.g. "QEMU 7.2.22
    /// (pid 4242, kvm; QMP /run/qemu.sock)" for `vmtrace attach`. Empty:
    /// vmtrace's own VMM (or an older file).
    pub vmm: String,
    /// Where the guest tasks of events came from ("BTF in PATH"), or why
    /// events have none ("no BTF in PATH: ..."); empty: not asked (or an
    /// older file).
    pub tasks: String,
    /// Calls the task filter (`--pid`, `--comm`) rejected: in no count,
    /// no event.
    pub filtered: u64,
    /// A trace filtered after recording (`crate::trace::filter`): what the
    /// filter kept and how many of the stored calls, said in every
    /// header; empty: not filtered. Never saved (a data file holds what
    /// was recorded).
    pub shown: String,
    /// `--args`: entries carry their arguments (`Event::data`).
    pub args: bool,
    /// `--retval`: returns carry their return value (`Event::data`; 0 is
    /// a value then, not "none").
    pub retval: bool,
    /// `--stack`: how stacks were unwound ("ORC (...)", "frame pointers
    /// (...)"); empty: no stacks recorded (or an older file).
    pub stacks: String,
    /// The functions whose entries carry stacks (`--stack`), as indices
    /// into `Trace::functions`.
    pub stack_funcs: Vec<u32>,
    /// Why events counted were not stored, cause by cause (empty: nothing
    /// dropped, or an older file).
    pub drops: DropCauses,
    /// The command line that recorded the trace, argv as given (see
    /// `crate::trace::cmdline`); empty: not known (an older file, or a
    /// trace built without one).
    pub cmdline: Vec<String>,
}

/// Why events counted were not stored: each cause counted where it
/// happens (vmtrace's code in the guest, the drain, the recorders, the
/// data file's writer). Events (entries and returns), by cause. Each is
/// also in `TraceMeta::events_dropped` / `returns_dropped`, except what
/// `TraceMeta::lost` and `unhooked` already say (the writer's losses; the
/// returns never hooked).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DropCauses {
    /// Exitless, per vCPU: calls and returns for which vmtrace's code in
    /// the guest found no free slot in that vCPU's ring (the rings' drop
    /// counters). Empty: none. vCPU 0's also holds the calls of a CPU
    /// past the rings, which the code counts in ring 0's counters.
    pub ring_full: Vec<u64>,
    /// Of `ring_full`: those while the drain held a ring's slots behind a
    /// record reserved and not committed yet (its writer interrupted or
    /// preempted: the drain's stall rule keeps that slot from reuse), not
    /// because the drain read too slowly.
    pub held: u64,
    /// Records per ring asked (`--buffer`, or what vmtrace's own region
    /// holds) and given: fewer given when the rings had to fit the guest's
    /// free pages below 1 MiB (`vmtrace attach`). Both 0: not sized down.
    pub ring_asked: u64,
    pub ring_given: u64,
    /// Entries and returns over `--max-events`.
    pub over_budget: u64,
    /// Entries and returns overwritten by newer ones (`--overwrite`).
    pub overwritten: u64,
}

impl DropCauses {
    /// Every ring-full drop.
    pub fn ring_full_total(&self) -> u64 {
        self.ring_full.iter().sum()
    }

    /// Nothing to say: no drop counted by cause, no ring sized down.
    pub fn is_empty(&self) -> bool {
        self.ring_full_total() == 0
            && self.held == 0
            && self.over_budget == 0
            && self.overwritten == 0
            && self.ring_given >= self.ring_asked
    }

    /// The rings were given fewer records than asked.
    pub fn capped(&self) -> bool {
        self.ring_given < self.ring_asked
    }
}

/// The whole trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    pub meta: TraceMeta,
    /// The traced functions (those with a patched site).
    pub functions: Vec<Symbol>,
    /// Exact call counts, `counts[func][cpu]`.
    pub counts: Vec<Vec<u64>>,
    /// Function-graph traces: exact return counts, `returns[func][cpu]` (the
    /// vCPU the return ran on); empty otherwise.
    pub returns: Vec<Vec<u64>>,
    /// The functions that callers' return addresses fall in, sorted by address.
    pub callers: Vec<Symbol>,
    /// Stored events, sorted by time.
    pub events: Vec<Event>,
    /// The guest tasks events name (`Event::task` - 1 indexes it).
    pub tasks: Vec<Task>,
    /// Entries' arguments (`--args`), as the six argument registers held
    /// them at the call (RDI, RSI, RDX, RCX, R8, R9); `Event::data` - 1
    /// indexes it.
    pub args: Vec<[u64; ARG_REGS]>,
    /// With `--args` or `--retval`: each traced function's prototype
    /// (parallel to `functions`; None: BTF does not describe it); empty
    /// otherwise.
    pub prototypes: Vec<Option<Prototype>>,
    /// The distinct kernel stacks entries name (`Event::stack` - 1
    /// indexes it); their frames' functions are in `callers`.
    pub stacks: Vec<Stack>,
    /// `-e`: the traced events' formats and each event entry's fields
    /// (read through `crate::trace::fields`).
    pub fields: EventFields,
}

use crate::kernel::events::fields::{EventFormat, FieldValue};
pub use crate::kernel::prototype::{Param, Prototype, ValueKind, ARG_REGS};
pub use crate::kernel::unwind::{Stack, StackEnd};

impl Trace {
    /// The kernel stack of entry `e`, if recorded.
    pub fn stack_of(&self, e: &Event) -> Option<&Stack> {
        (e.stack as usize)
            .checked_sub(1)
            .and_then(|i| self.stacks.get(i))
    }

    /// The arguments of entry `e`, if recorded.
    pub fn args_of(&self, e: &Event) -> Option<&[u64; ARG_REGS]> {
        if e.is_return() {
            return None;
        }
        (e.data as usize)
            .checked_sub(1)
            .and_then(|i| self.args.get(i))
    }

    /// The task that ran `e`, if known.
    pub fn task_of(&self, e: &Event) -> Option<&Task> {
        (e.task as usize)
            .checked_sub(1)
            .and_then(|i| self.tasks.get(i))
    }

    /// The caller function containing return address `ip`.
    pub fn caller_of(&self, ip: u64) -> Option<&Symbol> {
        caller_index(&self.callers, ip).map(|i| &self.callers[i])
    }

    /// Seconds between attach and detach.
    pub fn duration_s(&self) -> f64 {
        self.meta.detach_ns.saturating_sub(self.meta.attach_ns) as f64 / 1e9
    }

    /// A deterministic synthetic trace: `events` calls of 500 functions from 200
    /// callers on 4 vCPUs, skewed like a real trace (a few hot functions), with
    /// 1 in 1,000 return addresses in no known function. For benchmarks.
    pub fn synthetic(events: u64) -> Trace {
        const TEXT: u64 = 0xffff_ffff_8100_0000;
        const CALLER_TEXT: u64 = 0xffff_ffff_8200_0000;
        let functions: Vec<Symbol> = (0..SYNTH_FUNCS)
            .map(|i| Symbol {
                name: format!("subsys{}_function_{i}", i % 17),
                addr: TEXT + i as u64 * 0x400,
                size: 0x300,
            })
            .collect();
        let callers: Vec<Symbol> = (0..SYNTH_CALLERS)
            .map(|i| Symbol {
                name: format!("caller_{i}"),
                addr: CALLER_TEXT + i as u64 * 0x200,
                size: 0x200,
            })
            .collect();
        let mut counts = vec![vec![0u64; SYNTH_CPUS as usize]; SYNTH_FUNCS];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            // xorshift64*
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let mut ev = Vec::with_capacity(events as usize);
        for i in 0..events {
            let r = next();
            // Skewed: the product of two uniforms favours small indices.
            let func = ((r % 1000) * ((r >> 10) % 1000) / 2000) as usize % SYNTH_FUNCS;
            let cpu = (i % u64::from(SYNTH_CPUS)) as u32;
            let parent = if (r >> 20).is_multiple_of(1000) {
                0xffff_ffff_8300_0000 + (r >> 32) % 0x1000
            } else {
                let c = (func * 7 + ((r >> 30) % 3) as usize) % SYNTH_CALLERS;
                CALLER_TEXT + c as u64 * 0x200 + 0x10 + (r >> 40) % 0x100
            };
            counts[func][cpu as usize] += 1;
            ev.push(Event {
                ts_ns: 1_000_000 + i * 100,
                parent,
                slot: 0,
                func: func as u32,
                cpu,
                task: 0,
                stack: 0,
                data: 0,
            });
        }
        Trace {
            meta: TraceMeta {
                kernel: "synthetic".into(),
                build_id: None,
                cpus: SYNTH_CPUS,
                attach_ns: 1_000_000,
                detach_ns: 1_000_000 + events * 100,
                sites_patched: SYNTH_FUNCS as u64,
                events_total: events,
                stop_reason: "synthetic".into(),
                mode: "trap".into(),
                trap_exits: 0,
                ..TraceMeta::default()
            },
            functions,
            counts,
            returns: Vec::new(),
            callers,
            events: ev,
            tasks: Vec::new(),
            args: Vec::new(),
            prototypes: Vec::new(),
            stacks: Vec::new(),
            fields: EventFields::default(),
        }
    }
}

/// The events' formats and their recorded values.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventFields {
    /// Per traced function (parallel to `Trace::functions`): the format of
    /// the event whose `__traceiter_NAME` it is, None for a function.
    /// Empty: no event's fields recorded.
    pub formats: Vec<Option<EventFormat>>,
    /// Each event entry's values, in its format's field order, by its
    /// arguments id.
    pub values: std::collections::BTreeMap<u64, Vec<FieldValue>>,
    /// Per traced function, like `formats`: the format of the event its
    /// return records (a syscall's `sys_exit_NAME`, its value the return's
    /// `Event::data`), None for others. Empty: none.
    pub return_formats: Vec<Option<EventFormat>>,
}

impl EventFields {
    /// No format and no value.
    pub fn is_empty(&self) -> bool {
        self.formats.is_empty() && self.values.is_empty() && self.return_formats.is_empty()
    }

    /// The format of function `func`'s event, if it is one.
    pub fn format(&self, func: u32) -> Option<&EventFormat> {
        self.formats.get(func as usize)?.as_ref()
    }

    /// The format of the event function `func`'s return records, if any.
    pub fn return_format(&self, func: u32) -> Option<&EventFormat> {
        self.return_formats.get(func as usize)?.as_ref()
    }

    /// Every event format with its function and whether it is a return's:
    /// the entries' first, then the returns'.
    pub fn all_formats(&self) -> impl Iterator<Item = (usize, bool, &EventFormat)> {
        let entries = self.formats.iter().enumerate();
        let entries = entries.filter_map(|(f, e)| Some((f, false, e.as_ref()?)));
        let returns = self.return_formats.iter().enumerate();
        entries.chain(returns.filter_map(|(f, e)| Some((f, true, e.as_ref()?))))
    }
}

/// The index of the symbol of `callers` (sorted by address) holding return
/// address `ip` (a size of 0 holds only its own address).
pub fn caller_index(callers: &[Symbol], ip: u64) -> Option<usize> {
    let i = callers.partition_point(|s| s.addr <= ip).checked_sub(1)?;
    let s = &callers[i];
    (ip < s.addr + s.size.max(1)).then_some(i)
}

/// Replaces entry callers that are vmtrace's own return hooks (a tail call:
/// the callee's entry found the caller's return already hooked, so `[RSP]`
/// held vmtrace's address) with the real return address, the caller of the
/// live frame at the same slot, as ftrace's `ftrace_graph_ret_addr` does.
/// `hooks`: the guest-virtual range of vmtrace's return code. Returns how
/// many were replaced; those with no live frame at their slot stay.
pub fn unhook_callers(events: &mut [Event], hooks: Range<u64>) -> u64 {
    // Per slot: the callers of the live frames there, innermost last.
    let mut at: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut replaced = 0;
    for e in events.iter_mut() {
        let slot = e.stack_slot();
        if slot == 0 {
            // Not hooked: no slot to find the real caller by.
            continue;
        }
        let callers = at.entry(slot).or_default();
        if e.is_return() {
            if let Some(real) = callers.pop() {
                if hooks.contains(&e.parent) {
                    e.parent = real;
                }
            }
            continue;
        }
        if hooks.contains(&e.parent) {
            if let Some(&real) = callers.last() {
                e.parent = real;
                replaced += 1;
            }
        } else {
            // A fresh call at this slot: whatever was live here was abandoned.
            callers.clear();
        }
        callers.push(e.parent);
    }
    replaced
}

/// Shape of `Trace::synthetic`.
pub const SYNTH_FUNCS: usize = 500;
pub const SYNTH_CALLERS: usize = 200;
pub const SYNTH_CPUS: u32 = 4;
