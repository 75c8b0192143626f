//! No guest context may be inside a direct site's displaced bytes (past
//! their first) when they change: it would resume in the middle of the
//! jump. Under the pause, for every vCPU in kernel mode: its RIP, and every
//! word of the stack it is on from RSP to that stack's top (interrupted
//! contexts' saved RIPs and return addresses are there; a stale word counts
//! too, which only delays the site). A vCPU on its IRQ stack (a hard or
//! soft interrupt) came from a context whose registers are on the stack it
//! left, so that stack is scanned too, through the link the IRQ stack's
//! top word holds; one on an exception stack, through the frame the CPU
//! pushed at its top (`stack_windows`). And on a kernel that can preempt a
//! task in kernel mode, every task's stack from the stack pointer it was
//! switched out with (`task_walk`). A page of a stack that cannot be read
//! could hold anything: it makes every site wait, as a context inside does.

use vmm::gva::AddressSpace;

pub use super::stack_windows::{StackWindow, Stacks};
pub use super::task_walk::{task_stacks, TaskStack, WalkError, MAX_TASKS};

/// A vCPU as the check needs it.
#[derive(Clone, Copy, Debug)]
pub struct VcpuRegs {
    pub cpu: usize,
    pub rip: u64,
    pub rsp: u64,
    /// It runs at CPL 3: no kernel context to check.
    pub user_mode: bool,
}

/// Selector bits 1:0 of CS: the privilege level a vCPU (or a saved frame)
/// runs at.
const CS_RPL_MASK: u64 = 3;

/// EFER.LMA (Intel SDM vol. 3, 2.2.1): long mode active. A vCPU without it
/// runs no kernel code yet (an application processor waiting for its
/// start-up IPI, in real mode with RSP 0).
const EFER_LMA: u64 = 1 << 10;

/// Stacks followed from a vCPU's: NMI over #DB over an IRQ over a task.
const MAX_LINKS: usize = 4;

/// The hardware's interrupt frame at an exception stack's top (Intel SDM
/// vol. 3, 6.14.2, "64-bit mode stack frame"): SS, then RSP, RFLAGS, CS.
const FRAME_RSP: u64 = 16;
const FRAME_CS: u64 = 32;

impl VcpuRegs {
    /// Every stopped vCPU whose registers are known and that runs in
    /// long mode.
    pub fn of(stopped: &dyn vmm::Stopped) -> Vec<VcpuRegs> {
        (0..stopped.cpus())
            .filter_map(|cpu| {
                let s = stopped.snapshot(cpu)?;
                if s.sregs.efer & EFER_LMA == 0 {
                    return None;
                }
                Some(VcpuRegs {
                    cpu,
                    rip: s.regs.rip,
                    rsp: s.regs.rsp,
                    user_mode: u64::from(s.sregs.cs.selector) & CS_RPL_MASK == 3,
                })
            })
            .collect()
    }
}

/// A context found inside a site's displaced bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inside {
    /// Index of the site (into the ranges given).
    pub k: usize,
    /// The vCPU; None for a task switched out.
    pub cpu: Option<usize>,
    /// The address inside the displaced bytes.
    pub at: u64,
    /// Where it was: the vCPU's RIP, or a word on a stack.
    pub on_stack: bool,
}

/// A stack page that could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unreadable {
    /// The vCPU on that stack; None for a task switched out.
    pub cpu: Option<usize>,
    pub at: u64,
}

/// What the check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SiteContexts {
    pub inside: Vec<Inside>,
    /// The first stack page that could not be read: then no site is
    /// known to be clear.
    pub unreadable: Option<Unreadable>,
}

impl SiteContexts {
    /// The sites some context is inside, each once: one site may hold
    /// several (an NMI's frame and the entry code's copies of it).
    pub fn busy_sites(&self) -> std::collections::BTreeSet<usize> {
        self.inside.iter().map(|i| i.k).collect()
    }
}

/// The sites of `ranges` (running `(start, end)` of each site's displaced
/// bytes, by site) that some context of `vcpus`, on the stacks they are
/// on (`stacks`), or on the stacks of the tasks switched out (`tasks`), is
/// inside.
pub fn find(
    space: &mut AddressSpace<'_>,
    ranges: &[(u64, u64)],
    vcpus: &[VcpuRegs],
    stacks: &Stacks,
    tasks: &[TaskStack],
) -> SiteContexts {
    let spans = Spans::new(ranges);
    let mut found = SiteContexts::default();
    let mut rips = Vec::new();
    for v in vcpus.iter().filter(|v| !v.user_mode) {
        if let Some(k) = spans.inside(v.rip) {
            rips.push(Inside {
                k,
                cpu: Some(v.cpu),
                at: v.rip,
                on_stack: false,
            });
        }
        scan_vcpu(space, &spans, stacks, v, &mut found);
    }
    for t in tasks {
        let top = t.base.wrapping_add(stacks.thread_size);
        let from = match t.sp >= t.base && t.sp < top {
            true => t.sp,
            false => t.base,
        };
        scan(space, &spans, &mut found, None, (from, top), true);
    }
    rips.append(&mut found.inside);
    found.inside = rips;
    found
}

/// The sites' displaced bytes, sorted by start, with the span of them all.
struct Spans {
    /// `(start, end, site)`.
    sorted: Vec<(u64, u64, usize)>,
    lo: u64,
    hi: u64,
}

impl Spans {
    fn new(ranges: &[(u64, u64)]) -> Spans {
        let mut sorted: Vec<(u64, u64, usize)> = ranges
            .iter()
            .enumerate()
            .map(|(k, &(s, e))| (s, e, k))
            .collect();
        sorted.sort_unstable();
        let lo = sorted.first().map_or(u64::MAX, |r| r.0);
        let hi = sorted.iter().map(|r| r.1).max().unwrap_or(0);
        Spans { sorted, lo, hi }
    }

    /// The site whose displaced bytes `a` is inside, past their first.
    fn inside(&self, a: u64) -> Option<usize> {
        // Most stack words are no text address: one compare rules them out.
        if a <= self.lo || a >= self.hi {
            return None;
        }
        let i = self.sorted.partition_point(|r| r.0 < a).checked_sub(1)?;
        let (s, e, k) = self.sorted[i];
        (a > s && a < e).then_some(k)
    }
}

/// Every word from `from` to `top` that is inside a site, into `found`;
/// an unreadable page too when `strict`.
fn scan(
    space: &mut AddressSpace<'_>,
    spans: &Spans,
    found: &mut SiteContexts,
    cpu: Option<usize>,
    (from, top): (u64, u64),
    strict: bool,
) {
    let bad = stack_words(space, from, top, |word| {
        if let Some(k) = spans.inside(word) {
            found.inside.push(Inside {
                k,
                cpu,
                at: word,
                on_stack: true,
            });
        }
    });
    if let (Some(at), true) = (bad, strict) {
        found.unreadable.get_or_insert(Unreadable { cpu, at });
    }
}

/// vCPU `v`'s stacks: the one its RSP is on, then through each IRQ
/// stack's link or exception frame the stack it interrupted, to the task
/// stack.
fn scan_vcpu(
    space: &mut AddressSpace<'_>,
    spans: &Spans,
    stacks: &Stacks,
    v: &VcpuRegs,
    found: &mut SiteContexts,
) {
    // On its way in or out of the kernel a vCPU may run on a stack that
    // is none of the kernel's: what it cannot read there is not the
    // kernel's either.
    let strict = !stacks.in_entry_text(v.rip);
    let cpu = Some(v.cpu);
    let mut sp = v.rsp;
    for _ in 0..MAX_LINKS {
        // No stack (yet): nothing of the kernel's on it.
        if sp == 0 {
            return;
        }
        let next = match stacks.window(sp) {
            StackWindow::Task { top } => {
                scan(space, spans, found, cpu, (sp, top), strict);
                return;
            }
            StackWindow::Irq { top } => {
                scan(space, spans, found, cpu, (sp, top), strict);
                space.read_u64(top - 8).ok()
            }
            StackWindow::Exception { top } => {
                scan(space, spans, found, cpu, (sp, top), strict);
                // A frame from user mode ends the chain.
                match space.read_u64(top - FRAME_CS) {
                    Ok(cs) if cs & CS_RPL_MASK != 0 => return,
                    Ok(_) => space.read_u64(top - FRAME_RSP).ok(),
                    Err(_) => None,
                }
            }
        };
        match next {
            Some(n) => sp = n,
            None => {
                if strict {
                    found.unreadable.get_or_insert(Unreadable { cpu, at: sp });
                }
                return;
            }
        }
    }
}

/// Each word from `from` to `top`, given to `word`, page by page; the
/// first address of the first page that could not be read, where the
/// words stop.
fn stack_words(
    space: &mut AddressSpace<'_>,
    from: u64,
    top: u64,
    mut word: impl FnMut(u64),
) -> Option<u64> {
    const PAGE: u64 = 4096;
    let mut buf = [0u8; PAGE as usize];
    let mut at = from & !7;
    while at < top {
        let end = ((at | (PAGE - 1)) + 1).min(top);
        let chunk = &mut buf[..(end - at) as usize];
        if space.read(at, chunk).is_err() {
            return Some(at);
        }
        for c in chunk.chunks_exact(8) {
            word(u64::from_le_bytes(c.try_into().expect("8")));
        }
        at = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
    use vmm::gva::PagingMode;

    /// The boot tables map the kernel half's top 2 GiB to physical 0.
    const MAP: u64 = 0xffff_ffff_8000_0000;
    const BASE: u64 = 0xffff_ffff_8100_0000;
    /// Two sites: 7 and 5 displaced bytes.
    const RANGES: [(u64, u64); 2] = [(BASE + 0x100, BASE + 0x107), (BASE + 0x200, BASE + 0x205)];

    fn memory() -> GuestMemoryMmap {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        mem
    }

    fn put(mem: &GuestMemoryMmap, va: u64, v: u64) {
        mem.write_obj(v, GuestAddress(va - MAP)).unwrap();
    }

    fn stacks() -> Stacks {
        Stacks {
            thread_size: 16 << 10,
            ..Stacks::default()
        }
    }

    fn v(cpu: usize, rip: u64, rsp: u64, user_mode: bool) -> VcpuRegs {
        VcpuRegs {
            cpu,
            rip,
            rsp,
            user_mode,
        }
    }

    fn at(k: usize, cpu: Option<usize>, at: u64, on_stack: bool) -> Inside {
        Inside {
            k,
            cpu,
            at,
            on_stack,
        }
    }

    #[test]
    fn a_rip_or_a_stack_word_inside_the_displaced_bytes_is_found() {
        let mem = memory();
        // A task stack at 0x20_0000..0x20_4000 physical, RSP near its top.
        let stack_top = MAP + 0x20_4000;
        let rsp = stack_top - 0x40;
        put(&mem, rsp + 0x18, BASE + 0x203);
        // Below RSP: dead, not read.
        put(&mem, rsp - 8, BASE + 0x101);
        let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        let s = stacks();
        let cpu0 = [v(0, BASE + 0x102, rsp, false)];
        let found = find(&mut space, &RANGES, &cpu0, &s, &[]);
        assert_eq!(
            found.inside,
            [
                at(0, Some(0), BASE + 0x102, false),
                at(1, Some(0), BASE + 0x203, true)
            ]
        );
        assert_eq!(found.unreadable, None);
        assert_eq!(found.busy_sites().len(), 2);
        // Two contexts inside one site: one site.
        put(&mem, rsp + 0x20, BASE + 0x104);
        let found = find(&mut space, &RANGES, &cpu0, &s, &[]);
        assert_eq!(found.inside.len(), 3);
        assert_eq!(found.busy_sites().into_iter().collect::<Vec<_>>(), [0, 1]);
        put(&mem, rsp + 0x20, 0);
        // A task switched out with its stack at RSP: found the same way.
        let task = TaskStack {
            sp: rsp,
            base: stack_top - (16 << 10),
        };
        let found = find(&mut space, &RANGES, &[], &s, &[task]);
        assert_eq!(found.inside, [at(1, None, BASE + 0x203, true)]);
        // The first byte is fine (the jump is there), and so is a user-mode vCPU.
        let vcpus = [
            v(0, BASE + 0x100, rsp, false),
            v(1, BASE + 0x103, rsp, true),
        ];
        let found = find(&mut space, &RANGES[..1], &vcpus, &s, &[]);
        assert_eq!(found, SiteContexts::default());
    }

    /// A vCPU in an interrupt handler on its IRQ stack (page-aligned, as
    /// a vmapped one is) interrupted a context whose registers are on the
    /// task stack it left: the IRQ stack's top word leads there.
    #[test]
    fn the_context_an_irq_stack_interrupted_is_found_on_the_task_stack() {
        let mem = memory();
        let irq_top = MAP + 0x31_5000;
        let task_top = MAP + 0x20_4000;
        let task_sp = task_top - 0xa8;
        // The interrupted RIP, inside site 0, in pt_regs on the task stack.
        put(&mem, task_sp + 0x80, BASE + 0x104);
        // The IRQ stack: its link, and a return address of the handler.
        put(&mem, irq_top - 8, task_sp);
        let rsp = irq_top - 0x100;
        put(&mem, rsp + 0x10, MAP + 0x123456);
        let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        let s = Stacks {
            irq: vec![(irq_top - (16 << 10), irq_top)],
            ..stacks()
        };
        let cpu0 = [v(0, MAP + 0x100_0000, rsp, false)];
        let found = find(&mut space, &RANGES, &cpu0, &s, &[]);
        assert_eq!(found.inside, [at(0, Some(0), BASE + 0x104, true)]);
        // The same from an exception stack whose frame came from the
        // kernel (CS RPL 0), and not from one that came from user mode.
        let ex_top = MAP + 0x40_3000;
        put(&mem, ex_top - 16, task_sp);
        put(&mem, ex_top - 32, 0x10);
        let s = Stacks {
            exception: vec![(ex_top - (8 << 10), ex_top)],
            ..stacks()
        };
        let cpu0 = [v(0, MAP + 0x100_0000, ex_top - 0x80, false)];
        let found = find(&mut space, &RANGES, &cpu0, &s, &[]);
        assert_eq!(found.inside, [at(0, Some(0), BASE + 0x104, true)]);
        put(&mem, ex_top - 32, 0x33);
        let found = find(&mut space, &RANGES, &cpu0, &s, &[]);
        assert_eq!(found, SiteContexts::default());
    }

    /// A stack page that cannot be read may hold a context inside any
    /// site: the check says so (before, the scan stopped there and the
    /// sites counted as clear). A vCPU in entry text may be on a stack
    /// that is none of the kernel's: not there.
    #[test]
    fn an_unreadable_stack_page_is_reported() {
        let mem = memory();
        let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        // Not mapped by the boot tables.
        let unmapped = 0xffff_c900_0000_4000u64;
        let task = TaskStack {
            sp: unmapped + 0x3f00,
            base: unmapped,
        };
        let found = find(&mut space, &RANGES, &[], &stacks(), &[task]);
        let want = Unreadable {
            cpu: None,
            at: unmapped + 0x3f00,
        };
        assert_eq!(found.unreadable, Some(want));
        let cpu0 = [v(0, MAP + 0x100_0000, unmapped + 0x3f00, false)];
        let found = find(&mut space, &RANGES, &cpu0, &stacks(), &[]);
        assert_eq!(found.unreadable.map(|u| u.cpu), Some(Some(0)));
        let entry = Stacks {
            entry_text: Some((MAP + 0x100_0000, MAP + 0x100_1000)),
            ..stacks()
        };
        let found = find(&mut space, &RANGES, &cpu0, &entry, &[]);
        assert_eq!(found, SiteContexts::default());
        // A vCPU with no stack yet (RSP 0) has nothing on it.
        let cpu0 = [v(0, MAP + 0x100_0000, 0, false)];
        let found = find(&mut space, &RANGES, &cpu0, &stacks(), &[]);
        assert_eq!(found, SiteContexts::default());
    }
}
