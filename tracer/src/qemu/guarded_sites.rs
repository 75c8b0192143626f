//! The traced events' call sites the guard watches (trap mode's
//! `super::breakpoints`, exitless mode's `super::event_guard`): vmtrace's
//! jumps the guest has not taken over by enabling their event itself.
//!
//! The guest enabling one (its key's first probe) calls
//! `arch_jump_label_transform_queue(entry, JUMP_LABEL_JMP)`, which checks
//! that the site holds its NOP and queues the kernel's jump over it
//! (arch/x86/kernel/jump_label.c `__jump_label_patch`, which BUGs on
//! anything else). vmtrace's jump is that very jump (same length, same
//! target: `crate::kernel::events::jump_sites`), so the guard makes the
//! call return `true` at once, the site untouched: the site never holds
//! its NOP meanwhile. (Giving the NOP back there and letting the kernel
//! queue its jump lost the event at that site until the kernel's
//! `text_poke_bp_batch` came, which may be after the enabling task was
//! preempted: a `sched_switch` on the other vCPU was missing in about
//! half the runs of tests/qemu_tracepoints.rs's exitless attach.) A call
//! to make a site of vmtrace's its NOP finds the jump it expects, and
//! runs.
//!
//! At the detach every site still vmtrace's gets its NOP back whatever
//! its key's count. A key the guest is enabling has its count -1 until
//! all its sites are queued (kernel/jump_label.c
//! `static_key_enable_cpuslocked`); its sites not queued yet will be
//! checked for their NOP once the guard is gone. `super::event_sites::restore`,
//! which leaves the sites of a key counted as the guest's, runs after.

use std::collections::HashMap;

use vm_memory::GuestAddress;
use vmm::gva::AddressSpace;
use vmm::pause::VcpuSnapshot;

use super::gdb::GdbError;
use super::journal::{unhex, JournaledJump};
use super::step::BreakOps;
use crate::kernel::kaslr::KernelOffset;

/// Why the guard could not serve the kernel's call for a site.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("cannot read or write an event's call site: {0}")]
    Site(#[from] vmm::RamError),
    #[error("cannot return from arch_jump_label_transform_queue: {0}")]
    Return(String),
    #[error(transparent)]
    Gdb(#[from] GdbError),
}

/// `enum jump_label_type`'s `JUMP_LABEL_JMP` (include/linux/jump_label.h):
/// `arch_jump_label_transform_queue`'s second argument when the site is
/// to become its jump (its key enabled).
const JUMP_LABEL_JMP: u64 = 1;

/// What the guard did at a call of `arch_jump_label_transform_queue`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Queued {
    /// Not a site of vmtrace's (or one holding something else than its
    /// jump): the function runs as ever.
    NotOurs,
    /// vmtrace's site, to be made the kernel's jump, which is already
    /// there: the vCPU was made to return `true` from the function at
    /// once, the site untouched. The site is the guest's from then on.
    Returned,
    /// vmtrace's site, to be made the NOP (its key disabled): the function
    /// runs, its check finding the jump it expects, and the kernel
    /// patches the site. The site is the guest's from then on.
    Left,
    /// A site the guest took over (`Returned`), to be made its NOP again
    /// as the guest disables its event: the vCPU was made to return
    /// `true` at once, the site keeping the jump, which is vmtrace's
    /// again (its event still recorded; given its NOP at the detach).
    TakenBack,
}

/// The guard's sites: vmtrace's, and those the guest took over.
#[derive(Debug, Default)]
pub(super) struct Sites {
    /// vmtrace's jumps the guest has not taken over, by their code's
    /// address.
    pub ours: HashMap<u64, JournaledJump>,
    /// Those it took over (enabled their event itself): it may disable
    /// them again, and vmtrace then takes them back.
    pub given: HashMap<u64, JournaledJump>,
}

impl Sites {
    pub fn new(jumps: impl IntoIterator<Item = JournaledJump>) -> Sites {
        Sites {
            ours: jumps.into_iter().map(|j| (j.va, j)).collect(),
            given: HashMap::new(),
        }
    }
}

/// The kernel image's mapping from `__START_KERNEL_map`
/// (arch/x86/include/asm/page_64_types.h); modules are mapped past it.
const KERNEL_IMAGE_SIZE: u64 = 1 << 30;

/// A stop at `arch_jump_label_transform_queue(entry, type)`'s first
/// instruction on `cpu` (registers `snap`): see the module's comment.
/// The kernel sorted its `__jump_table` at boot, so an entry (in the
/// kernel's image: `struct jump_entry { s32 code; ... }`) is known by the
/// code it names. A site of `sites.ours` leaves it, to `sites.given`
/// when the guest takes it over (and back when it disables the event
/// again). Registers are set through `ops`.
pub(super) fn serve_queue(
    cpu: usize,
    snap: &VcpuSnapshot,
    offset: KernelOffset,
    sites: &mut Sites,
    ram: &dyn vmm::GuestRam,
    ops: &dyn BreakOps,
) -> Result<Queued, GuardError> {
    let (entry, kind) = (snap.regs.rdi, snap.regs.rsi);
    // A module's entry (its own `__jump_table`, in its memory) through
    // the vCPU's page tables; the image's through its linear mapping.
    let in_image = offset
        .phys_of(offset.link(entry))
        .filter(|_| offset.link(entry) < vmm::layout::KERNEL_MAP_BASE + KERNEL_IMAGE_SIZE);
    let by_tables = || {
        let space = vmm::gva::AddressSpace::of_vcpu(ram, &snap.sregs)?;
        space.translate(entry).ok().map(|t| t.gpa)
    };
    let Some(gpa) = in_image.or_else(by_tables) else {
        return Ok(Queued::NotOurs);
    };
    let mut rel = [0u8; 4];
    ram.read_slice(&mut rel, GuestAddress(gpa))?;
    let code = entry.wrapping_add_signed(i64::from(i32::from_le_bytes(rel)));
    if kind != JUMP_LABEL_JMP {
        // The guest disabling an event it enabled: its site keeps the
        // jump, vmtrace's again, and the event is still recorded.
        if let Some(j) = sites.given.remove(&code) {
            if !holds_jump(&j, ram)? {
                return Ok(Queued::NotOurs);
            }
            return_true(cpu, snap, ram, ops)?;
            sites.ours.insert(code, j);
            return Ok(Queued::TakenBack);
        }
    }
    let Some(j) = sites.ours.remove(&code) else {
        return Ok(Queued::NotOurs);
    };
    if !holds_jump(&j, ram)? {
        return Ok(Queued::NotOurs);
    }
    if kind != JUMP_LABEL_JMP {
        return Ok(Queued::Left);
    }
    return_true(cpu, snap, ram, ops)?;
    sites.given.insert(code, j);
    Ok(Queued::Returned)
}

/// The vCPU `cpu`, stopped at a function's first instruction (the return
/// address at [RSP]), made to return `true` from it without running it:
/// RIP the return address, RSP past it, RAX 1 (a `bool` in AL).
fn return_true(
    cpu: usize,
    snap: &VcpuSnapshot,
    ram: &dyn vmm::GuestRam,
    ops: &dyn BreakOps,
) -> Result<(), GuardError> {
    let gva_err = |e: vmm::gva::GvaError| GuardError::Return(e.to_string());
    let mut space = AddressSpace::of_vcpu(ram, &snap.sregs)
        .ok_or_else(|| GuardError::Return("the vCPU runs with paging off".into()))?;
    let ret = space.read_u64(snap.regs.rsp).map_err(gva_err)?;
    ops.set_reg(cpu, "rax", 1)?;
    ops.set_reg(cpu, "rsp", snap.regs.rsp.wrapping_add(8))?;
    ops.set_reg(cpu, "rip", ret)?;
    Ok(())
}

/// At the detach, the guard's breakpoints gone: every site of `guarded`
/// still holding vmtrace's jump given its NOP, whatever its key's count
/// (see the module's comment); `guarded` emptied. Returns the sites given.
pub(super) fn give_back_all(
    guarded: &mut Sites,
    ram: &dyn vmm::GuestRam,
) -> Result<usize, vmm::RamError> {
    let mut given = 0;
    guarded.given.clear();
    for j in std::mem::take(&mut guarded.ours).into_values() {
        given += usize::from(give_back(&j, ram)?);
    }
    Ok(given)
}

impl Sites {
    /// Forget the sites in `text` (a module going away, whose sites were
    /// given their NOP: `super::event_sites::release`): nothing is
    /// written there after.
    pub fn forget(&mut self, text: &std::ops::Range<u64>) {
        self.ours.retain(|va, _| !text.contains(va));
        self.given.retain(|va, _| !text.contains(va));
    }
}

/// `j`'s NOP written where its jump is; anything else there left alone.
fn give_back(j: &JournaledJump, ram: &dyn vmm::GuestRam) -> Result<bool, vmm::RamError> {
    let Some(nop) = unhex(&j.nop) else {
        return Ok(false);
    };
    if !holds_jump(j, ram)? {
        return Ok(false);
    }
    ram.write_slice(&nop, GuestAddress(j.gpa))?;
    Ok(true)
}

/// Whether `j`'s site holds vmtrace's jump.
fn holds_jump(j: &JournaledJump, ram: &dyn vmm::GuestRam) -> Result<bool, vmm::RamError> {
    let Some(want) = unhex(&j.jump) else {
        return Ok(false);
    };
    let mut now = vec![0u8; want.len()];
    ram.read_slice(&mut now, GuestAddress(j.gpa))?;
    Ok(now == want)
}

#[cfg(test)]
mod tests {
    use crate::qemu::step::RecordedOps;

    use vm_memory::{Bytes, GuestMemoryMmap};

    use super::*;
    use crate::qemu::journal::hex;

    /// The kernel's 5-byte NOP (`nopl 0x0(%rax,%rax,1)`) and a jump.
    const NOP: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];
    const JUMP: [u8; 5] = [0xe9, 0x10, 0x20, 0x00, 0x00];
    /// Three sites of one event (kernel map: physical = virtual - 2 GiB
    /// from the top), its static key, its `__jump_table` entry for `A`.
    const A: u64 = 0xffff_ffff_8100_0000;
    const B: u64 = 0xffff_ffff_8100_0100;
    const C: u64 = 0xffff_ffff_8100_0200;
    const KEY: u64 = 0xffff_ffff_8120_0000;
    const ENTRY: u64 = 0xffff_ffff_8130_0000;
    const PHYS: u64 = 0xffff_ffff_8000_0000;
    /// The stack at `arch_jump_label_transform_queue`'s entry, and the
    /// return address on it (in `__jump_label_update`).
    const RSP: u64 = 0xffff_ffff_8140_0ff8;
    const RET: u64 = 0xffff_ffff_8100_2345;
    /// `enum jump_label_type`.
    const JUMP_LABEL_NOP: u64 = 0;
    /// Paging on, 4 levels (`AddressSpace::of_vcpu`).
    const CR0_PG: u64 = 1 << 31;
    const CR4_PAE: u64 = 1 << 5;

    fn site(va: u64) -> JournaledJump {
        JournaledJump {
            module: None,
            va,
            gpa: va - PHYS,
            nop: hex(&NOP),
            jump: hex(&JUMP),
            key_gpa: KEY - PHYS,
        }
    }

    /// Guest memory with the kernel map's page tables, `sites` holding
    /// vmtrace's jump, `ENTRY` naming `A` and `RET` at `RSP`.
    fn guest(sites: &[u64]) -> GuestMemoryMmap {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 32 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        for va in sites {
            mem.write_slice(&JUMP, GuestAddress(va - PHYS)).unwrap();
        }
        // `struct jump_entry`'s code: relative to the entry.
        let rel = i32::try_from(A as i64 - ENTRY as i64).unwrap();
        mem.write_obj(rel, GuestAddress(ENTRY - PHYS)).unwrap();
        mem.write_obj(RET, GuestAddress(RSP - PHYS)).unwrap();
        mem
    }

    /// A vCPU at `arch_jump_label_transform_queue(ENTRY, kind)`'s entry.
    fn at_queue(kind: u64) -> VcpuSnapshot {
        let mut s = VcpuSnapshot {
            regs: Default::default(),
            sregs: Default::default(),
            clock: None,
            syscall_entry: None,
        };
        (s.regs.rdi, s.regs.rsi, s.regs.rsp) = (ENTRY, kind, RSP);
        (s.sregs.cr0, s.sregs.cr4) = (CR0_PG, CR4_PAE);
        s.sregs.cr3 = vmm::layout::PML4_START;
        s
    }

    fn bytes_at(mem: &GuestMemoryMmap, va: u64) -> [u8; 5] {
        let mut b = [0u8; 5];
        mem.read_slice(&mut b, GuestAddress(va - PHYS)).unwrap();
        b
    }

    /// The guest enabling a traced event's key queues its site: vmtrace's
    /// jump there is the kernel's own, so the call returns `true` at once
    /// (RAX 1, RSP past the return address, RIP that address) and the site
    /// keeps its jump: at no moment does it hold its NOP, through which
    /// the event would go unrecorded until the kernel patched it (the
    /// sched_switch lost in exitless attach). The site is the guest's
    /// then: the detach leaves it; a second call for it runs.
    #[test]
    fn the_guest_enabling_a_site_finds_its_jump_there_all_along() {
        let mem = guest(&[A]);
        let mut guarded = Sites::new([site(A)]);
        let ops = RecordedOps::default();
        let off = KernelOffset::NONE;
        let q = serve_queue(0, &at_queue(JUMP_LABEL_JMP), off, &mut guarded, &mem, &ops);
        assert_eq!(q.unwrap(), Queued::Returned);
        assert_eq!(bytes_at(&mem, A), JUMP);
        let set = [("rax", 1), ("rsp", RSP + 8), ("rip", RET)].map(|(r, v)| (r.to_string(), v));
        assert_eq!(*ops.0.borrow(), set);
        assert!(guarded.ours.is_empty() && guarded.given.contains_key(&A));
        let q = serve_queue(0, &at_queue(JUMP_LABEL_JMP), off, &mut guarded, &mem, &ops);
        assert_eq!(q.unwrap(), Queued::NotOurs);
        assert_eq!(ops.0.borrow().len(), 3);
        assert_eq!(give_back_all(&mut guarded, &mem).unwrap(), 0);
        assert_eq!(bytes_at(&mem, A), JUMP);
    }

    /// The guest disabling the event it enabled: the site it took over is
    /// to be made its NOP; the call returns `true` at once, the site keeps
    /// the jump, vmtrace's again (the event still recorded), given its NOP
    /// at the detach; the guest enabling it once more takes it over again.
    #[test]
    fn the_guest_disabling_its_event_gives_the_site_back_to_vmtrace() {
        let mem = guest(&[A]);
        let mut guarded = Sites::new([site(A)]);
        let ops = RecordedOps::default();
        let off = KernelOffset::NONE;
        let mut serve = |kind| serve_queue(0, &at_queue(kind), off, &mut guarded, &mem, &ops);
        assert_eq!(serve(JUMP_LABEL_JMP).unwrap(), Queued::Returned);
        assert_eq!(serve(JUMP_LABEL_NOP).unwrap(), Queued::TakenBack);
        assert_eq!(serve(JUMP_LABEL_JMP).unwrap(), Queued::Returned);
        assert_eq!(serve(JUMP_LABEL_NOP).unwrap(), Queued::TakenBack);
        assert_eq!(ops.0.borrow().len(), 4 * 3);
        assert_eq!(bytes_at(&mem, A), JUMP);
        assert!(guarded.ours.contains_key(&A) && guarded.given.is_empty());
        assert_eq!(give_back_all(&mut guarded, &mem).unwrap(), 1);
        assert_eq!(bytes_at(&mem, A), NOP);
    }

    /// A site of vmtrace's that the kernel is to make its NOP holds the
    /// jump the kernel checks for: the call runs (no register set), the
    /// site untouched and the guest's; a site holding anything else than
    /// vmtrace's jump is left as it is.
    #[test]
    fn a_site_to_be_made_a_nop_or_not_vmtraces_is_left_to_the_kernel() {
        let mem = guest(&[A]);
        let mut guarded = Sites::new([site(A)]);
        let ops = RecordedOps::default();
        let off = KernelOffset::NONE;
        let q = serve_queue(0, &at_queue(JUMP_LABEL_NOP), off, &mut guarded, &mem, &ops);
        assert_eq!(q.unwrap(), Queued::Left);
        assert!(guarded.ours.is_empty() && ops.0.borrow().is_empty());
        assert_eq!(bytes_at(&mem, A), JUMP);
        mem.write_slice(&NOP, GuestAddress(A - PHYS)).unwrap();
        let mut guarded = Sites::new([site(A)]);
        let q = serve_queue(0, &at_queue(JUMP_LABEL_JMP), off, &mut guarded, &mem, &ops);
        assert_eq!(q.unwrap(), Queued::NotOurs);
        assert!(guarded.ours.is_empty() && ops.0.borrow().is_empty());
        assert_eq!(bytes_at(&mem, A), NOP);
    }

    /// The guest enabling a key of three sites (its count -1 meanwhile)
    /// queued the first (returned at once, the site the guest's); the
    /// detach comes then: the second, still vmtrace's jump, gets its NOP
    /// whatever the count, the first (the guest's now) and the third (the
    /// guest's bytes) are left.
    #[test]
    fn the_detach_gives_back_a_key_mid_enable() {
        let mem = guest(&[A, B]);
        let other = [0xe9, 0, 0, 0, 0];
        mem.write_slice(&other, GuestAddress(C - PHYS)).unwrap();
        mem.write_obj(-1i32, GuestAddress(KEY - PHYS)).unwrap();
        let mut guarded = Sites::new([A, B, C].map(site));
        let (off, ops) = (KernelOffset::NONE, RecordedOps::default());
        let q = serve_queue(0, &at_queue(JUMP_LABEL_JMP), off, &mut guarded, &mem, &ops);
        assert_eq!(q.unwrap(), Queued::Returned);
        assert!(!guarded.ours.contains_key(&A));
        assert_eq!(give_back_all(&mut guarded, &mem).unwrap(), 1);
        assert!(guarded.ours.is_empty() && guarded.given.is_empty());
        let at = |va| bytes_at(&mem, va);
        assert_eq!((at(A), at(B), at(C)), (JUMP, NOP, other));
    }
}
