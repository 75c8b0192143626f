//! The guest side of a repair: vmtrace's exitless sites given their bytes
//! back, and its region (page-directory entries and low pages) taken out
//! once nothing runs in it.

use vm_memory::GuestAddress;
use vmm::gva::{AddressSpace, Level};
use vmm::Stopped;

// Between two stops the guest runs as long as at a detach (for a vCPU to
// leave vmtrace's code), as many times.
use super::super::ending::{GRACE, REMOVE_ATTEMPTS as ATTEMPTS};
use super::super::error::QemuError;
use super::super::guest::{QemuGuest, QemuStop};
use super::super::ivshmem::SharedNames;
use super::super::journal::{hex, unhex, JournalRecord, JournaledSite};
use super::Repaired;
use crate::kernel::sites::SITE_LEN;
use crate::plan::exitless::layout::{
    CODE_LEN, CODE_VA, DATA_VA, FRAMES, FRAMES_OFF, FRAME_BUSY, FRAME_LEN, HIGH_RINGS_VA,
    LARGE_PAGE, PAGE, PD_COUNT,
};
use crate::session::direct::contexts::VcpuRegs;
use crate::session::region::returns_into_code_of;

/// A page-table entry's present and writable bits, as vmtrace writes its
/// table entries (`session::exitless::map`), and the accessed and dirty
/// bits the CPU may add.
const TABLE: u64 = 0b11;
const ACCESSED_DIRTY: u64 = (1 << 5) | (1 << 6);
/// A present 2 MiB leaf (page size), writable, not executable.
const LEAF: u64 = 1 | (1 << 7);
const WRITABLE: u64 = 1 << 1;
const NO_EXEC: u64 = 1 << 63;
/// An entry's physical address bits (bits 12..52).
const ADDR_MASK: u64 = ((1 << 52) - 1) & !0xfff;
/// vmtrace's pages are in the guest's first MiB (`kernel::lowmem`).
const LOW_MIB: u64 = 1 << 20;
/// A `call rel32`: what vmtrace writes at an exitless site.
pub(super) const CALL: u8 = 0xe8;
/// A `jmp rel32`: what vmtrace writes at a direct entry (to its stub,
/// `session::direct::stub`).
pub(super) const JMP: u8 = 0xe9;
/// A direct stub's head (its `call` into the trampoline) is 5 bytes; the
/// stub of a site that held the ftrace NOP jumps back right after it.
const STUB_HEAD: u64 = 5;

/// The modules' sites a marker names (`Marker::module_sites`), located
/// in `stop` through the kernel's page tables (a module's text is not in
/// the image's linear mapping), each as the marker's others: the kernel's
/// NOP its bytes. Those no longer mapped (their module unloaded since
/// vmtrace went) are left, and counted. None: no vCPU's tables map
/// vmtrace's code, to find them with.
pub(super) fn locate_module_sites(
    stop: &QemuStop<'_>,
    vas: &[u64],
) -> Option<(Vec<JournaledSite>, usize)> {
    if vas.is_empty() {
        return Some((Vec::new(), 0));
    }
    // (Module text is in the kernel half of the tables that map vmtrace's
    // code, as `restore_sites` finds them.)
    let mut space = crate::session::kernel_space(stop.vcpu_spaces(), &[CODE_VA])?;
    let mut found = Vec::new();
    for &va in vas {
        let next = (va | (PAGE - 1)) + 1;
        let tail = match next - va < SITE_LEN as u64 {
            true => space.gpa(next).map(Some),
            false => Ok(None),
        };
        if let (Ok(gpa), Ok(tail)) = (space.gpa(va), tail) {
            found.push(JournaledSite {
                va,
                gpa,
                original: hex(&crate::kernel::sites::NOP5),
                tail,
            });
        }
    }
    let gone = vas.len() - found.len();
    Some((found, gone))
}

/// `r` with the modules' sites a marker names (`modules`), located in
/// `stop` (`locate_module_sites`), and how many could not be: those may
/// still call vmtrace's code, which then stays.
pub(super) fn with_module_sites(
    stop: &QemuStop<'_>,
    r: &JournalRecord,
    modules: &[u64],
    out: &mut Repaired,
) -> (JournalRecord, usize) {
    let located = locate_module_sites(stop, modules);
    let unlocated = match located {
        Some(_) => 0,
        None => modules.len(),
    };
    let (sites, gone) = located.unwrap_or_default();
    if gone > 0 {
        out.did(format!(
            "{gone} module sites left alone (their module unloaded since: its memory freed)"
        ));
    }
    if unlocated > 0 {
        out.failed(format!(
            "{unlocated} module sites the marker names could not be located: vmtrace's code and \
             rings are left in place"
        ));
    }
    let r = JournalRecord {
        sites: r.sites.iter().cloned().chain(sites).collect(),
        ..r.clone()
    };
    (r, unlocated)
}

/// Each journaled site that holds vmtrace's call or jump (a `call` or a
/// direct entry's `jmp` into its code) gets its bytes back; one that holds
/// anything else is not vmtrace's to touch. Without the journal (`r` from
/// the marker, whose sites' bytes are the NOP) a direct entry's first
/// bytes are known only when its stub ran nothing in their place (it
/// displaced the ftrace NOP): the others stay, and their count is returned.
pub(super) fn restore_sites(
    stop: &QemuStop<'_>,
    r: &JournalRecord,
    out: &mut Repaired,
) -> Result<usize, QemuError> {
    let ram = stop.ram();
    // (`Journal::from_marker` knows no start time of QEMU's.)
    let from_marker = r.qemu_start == 0;
    let mut space = crate::session::kernel_space(stop.vcpu_spaces(), &[CODE_VA]);
    let (mut restored, mut as_found, mut other, mut stuck) = (0, 0, Vec::new(), 0);
    for s in &r.sites {
        let original = unhex(&s.original).and_then(|o| <[u8; SITE_LEN]>::try_from(o).ok());
        let Some(original) = original else {
            other.push(s.va);
            continue;
        };
        let now = s.read(&**ram).map_err(QemuError::NotTraceable)?;
        let known = match into_code(s.va, &now) {
            Some((JMP, stub)) if from_marker => space
                .as_mut()
                .is_some_and(|sp| stub_runs_nothing(sp, s.va, stub)),
            _ => true,
        };
        if now == original {
            as_found += 1;
        } else if !known {
            stuck += 1;
        } else if into_code(s.va, &now).is_some() {
            s.write(&**ram, &original)
                .map_err(QemuError::NotTraceable)?;
            restored += 1;
        } else {
            other.push(s.va);
        }
    }
    out.did(format!(
        "{restored} sites restored ({as_found} of {} were as found)",
        r.sites.len()
    ));
    if !other.is_empty() {
        out.failed(format!(
            "{} sites hold neither their bytes nor vmtrace's call, left as they are (first at {:#x})",
            other.len(),
            other[0]
        ));
    }
    Ok(stuck)
}

/// If `bytes` at `va` are vmtrace's `call` or `jmp` into its code: the
/// opcode and the target.
pub(super) fn into_code(va: u64, bytes: &[u8; 5]) -> Option<(u8, u64)> {
    let rel = i32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    let target = va.wrapping_add(5).wrapping_add_signed(rel.into());
    ((bytes[0] == CALL || bytes[0] == JMP) && (CODE_VA..CODE_VA + CODE_LEN).contains(&target))
        .then_some((bytes[0], target))
}

/// Does the direct stub at `stub` of the site at `va` only record and jump
/// back (`jmp va + 5` after its head): the site held the ftrace NOP?
fn stub_runs_nothing(space: &mut vmm::gva::AddressSpace<'_>, va: u64, stub: u64) -> bool {
    let Ok(back) = space.read_array::<5>(stub + STUB_HEAD) else {
        return false;
    };
    into_target(stub + STUB_HEAD, &back) == Some(va + 5)
}

/// The target of a `jmp rel32` at `va`.
pub(super) fn into_target(va: u64, bytes: &[u8; 5]) -> Option<u64> {
    let rel = i32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    (bytes[0] == JMP).then(|| va.wrapping_add(5).wrapping_add_signed(rel.into()))
}

/// Stop until no vCPU runs in vmtrace's code and no hooked call has yet
/// to return through it, then (in that stop, returned) clear its entries
/// and give its pages back. The region stays when that never happens.
pub(super) fn region_stop<'g>(
    guest: &'g QemuGuest,
    r: &JournalRecord,
    out: &mut Repaired,
) -> Result<QemuStop<'g>, QemuError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        std::thread::sleep(GRACE);
        let stop = guest.stop(false)?;
        match busy(&stop, r) {
            Some(_) if attempt < ATTEMPTS => {
                stop.resume()?;
                continue;
            }
            Some(why) => {
                out.failed(format!(
                    "vmtrace's code and rings left mapped: {why}; run vmtrace detach again later"
                ));
                return Ok(stop);
            }
            None => {
                take_region_out(&stop, r, out)?;
                return Ok(stop);
            }
        }
    }
}

/// The region of a VM someone else holds stopped: taken out in this stop,
/// or left for a repair once the VM runs (a task inside it cannot leave
/// while the VM is stopped).
pub(super) fn region_held<'g>(
    stop: QemuStop<'g>,
    r: &JournalRecord,
    status: &str,
    out: &mut Repaired,
) -> Result<QemuStop<'g>, QemuError> {
    match busy(&stop, r) {
        Some(why) => out.failed(format!(
            "vmtrace's code and rings left mapped: {why}, and the VM is {status}; run vmtrace detach again once it runs"
        )),
        None => take_region_out(&stop, r, out)?,
    }
    Ok(stop)
}

/// Why the region cannot go at this stop, if it cannot: a vCPU in its
/// code, a hooked call yet to return through it, or (a preemptible kernel
/// whose task walk the journal kept) a context whose stack returns into
/// it: a task switched out inside the trampoline or a stub. A walk that
/// fails keeps the region: such a task cannot be ruled out.
fn busy(stop: &QemuStop<'_>, r: &JournalRecord) -> Option<String> {
    for cpu in 0..stop.cpus() {
        let rip = stop.snapshot(cpu)?.regs.rip;
        if (CODE_VA..CODE_VA + CODE_LEN).contains(&rip) {
            return Some(format!("vCPU {cpu} runs in it (at {rip:#x})"));
        }
    }
    let mut space = crate::session::kernel_space(stop.vcpu_spaces(), &[])?;
    let mut pool = vec![0u8; (FRAMES * FRAME_LEN) as usize];
    // No frame pool mapped: no function graph.
    if space.read(DATA_VA + FRAMES_OFF, &mut pool).is_ok() {
        let busy = FRAME_BUSY as usize..FRAME_BUSY as usize + 4;
        let live = pool
            .chunks_exact(FRAME_LEN as usize)
            .filter(|f| f[busy.clone()] != [0; 4])
            .count();
        if live > 0 {
            return Some(format!(
                "{live} hooked calls have not returned, and return through it"
            ));
        }
    }
    let scan = r.tasks.as_ref()?;
    let vcpus = VcpuRegs::of(stop);
    match returns_into_code_of(&mut space, &vcpus, scan) {
        Ok(found) => found.map(|b| b.to_string()),
        Err(e) => Some(format!(
            "{e}, so a task switched out inside it cannot be ruled out"
        )),
    }
}

/// vmtrace's region entries of a vmtrace whose journal is gone: those of
/// 508-510 that point at a table in the low MiB its pages come from, or
/// (`device`: a ring device QEMU shows) map that device, as vmtrace
/// writes them; and entry 508 onto the device in the kernel's tables and
/// in the UEFI ones the device names.
pub(super) fn left_mapped(stop: &QemuStop<'_>, device: Option<&SharedNames>) -> usize {
    let Some(space) = crate::session::kernel_space(stop.vcpu_spaces(), &[]) else {
        return 0;
    };
    let efi = device.and_then(|d| d.efi).map(|e| space.with_root(e.root));
    let device = device.and_then(|d| Some((d.gpa?, d.size)));
    let high = |s: &AddressSpace<'_>| {
        s.entry(HIGH_RINGS_VA, Level::Pdpt)
            .is_ok_and(|e| device.is_some_and(|d| table_in_device(e.value, d)))
    };
    let region = (0..PD_COUNT as u64)
        .filter_map(|i| space.entry(CODE_VA + i * LARGE_PAGE, Level::Pd).ok())
        .filter(|e| {
            let low_table =
                e.value & !ACCESSED_DIRTY & !ADDR_MASK == TABLE && e.value & ADDR_MASK < LOW_MIB;
            low_table || device.is_some_and(|d| maps_device(e.value, d))
        })
        .count();
    region + usize::from(high(&space)) + usize::from(efi.as_ref().is_some_and(high))
}

/// Is `v` a table entry as vmtrace writes them, onto a table in the ring
/// device at `(gpa, size)` (entry 508's page directory, in the device)?
fn table_in_device(v: u64, (gpa, size): (u64, u64)) -> bool {
    v & !ACCESSED_DIRTY & !ADDR_MASK == TABLE
        && (gpa..gpa.saturating_add(size)).contains(&(v & ADDR_MASK))
}

/// Clear the page-directory entries that point at one of vmtrace's pages
/// as vmtrace wrote them, then give every page its bytes back.
fn take_region_out(
    stop: &QemuStop<'_>,
    r: &JournalRecord,
    out: &mut Repaired,
) -> Result<(), QemuError> {
    let pages: Vec<(u64, Vec<u8>)> = r
        .pages
        .iter()
        .filter_map(|p| Some((p.gpa, unhex(&p.original)?)))
        .filter(|(_, b)| b.len() == PAGE as usize)
        .collect();
    // The tables are in the free pages, or in the ring device when it
    // holds the code; the rings' 2 MiB entries map the device itself. All
    // out of the page tables before the device goes.
    let device = r.shared.as_ref().and_then(|s| Some((s.gpa?, s.size)));
    let ours = |v: u64| {
        let at = v & ADDR_MASK;
        let table = v & !ACCESSED_DIRTY & !ADDR_MASK == TABLE
            && (r.pages.iter().any(|p| p.gpa == at)
                || device.is_some_and(|(gpa, size)| (gpa..gpa + size).contains(&at)));
        table || device.is_some_and(|d| maps_device(v, d))
    };
    let mut cleared = 0;
    if let Some(mut space) = crate::session::kernel_space(stop.vcpu_spaces(), &[]) {
        // The UEFI runtime services' page tables too, whose entry 508 the
        // attach set with the kernel's (journaled with the device).
        let efi = r.shared.as_ref().and_then(|s| s.efi);
        let mut efi_space = efi.map(|e| space.with_root(e.root));
        cleared = clear_entries(&mut space, ours)?;
        if let Some(s) = efi_space.as_mut() {
            cleared += clear_entries(s, ours)?;
        }
    }
    let ram = stop.ram();
    let mut given = 0;
    for (gpa, was) in &pages {
        let mut now = vec![0u8; was.len()];
        ram.read_slice(&mut now, GuestAddress(*gpa))
            .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
        if now != *was {
            ram.write_slice(was, GuestAddress(*gpa))
                .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
            given += 1;
        }
    }
    out.region_out = true;
    out.did(format!(
        "{cleared} page-directory entries cleared, {given} of the guest's {} unused low pages given their bytes back",
        r.pages.len()
    ));
    let unknown = r.pages.len() - pages.len();
    if unknown > 0 {
        out.failed(format!(
            "{unknown} of the guest's unused low pages may hold what vmtrace wrote: what they held \
             before is in its journal only (the guest does not use them)"
        ));
    }
    Ok(())
}

/// Is `v` a 2 MiB entry as vmtrace writes them (`session::exitless::map`:
/// code read-only, data writable and maybe not executable) onto the ring
/// device at `(gpa, size)`?
fn maps_device(v: u64, (gpa, size): (u64, u64)) -> bool {
    let flags = v & !ACCESSED_DIRTY & !ADDR_MASK;
    let addr = v & ADDR_MASK;
    [LEAF, LEAF | WRITABLE, LEAF | WRITABLE | NO_EXEC].contains(&flags)
        && (gpa..gpa.saturating_add(size)).contains(&addr)
}

/// Clear each of the region's entries `ours` accepts; returns how many.
fn clear_entries(
    space: &mut AddressSpace<'_>,
    ours: impl Fn(u64) -> bool,
) -> Result<usize, QemuError> {
    let mut cleared = 0;
    // The rings' entry 508 (onto a directory in the device), then the
    // region's page-directory entries.
    let entries = std::iter::once((HIGH_RINGS_VA, Level::Pdpt))
        .chain((0..PD_COUNT as u64).map(|i| (CODE_VA + i * LARGE_PAGE, Level::Pd)));
    for (va, level) in entries {
        let Ok(e) = space.entry(va, level) else {
            continue;
        };
        if !e.is_empty() && ours(e.value) {
            space
                .set_entry(&e, 0)
                .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
            cleared += 1;
        }
    }
    Ok(cleared)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_2_mib_entry_is_vmtraces_only_onto_its_device() {
        let dev = (0x1_0000_0000, 4 << 20);
        let data = 0x1_0020_0000 | LEAF | WRITABLE | NO_EXEC | ACCESSED_DIRTY;
        assert!(maps_device(data, dev));
        assert!(maps_device(0x1_0000_0000 | LEAF, dev));
        // Past the device, a user page, a table: not vmtrace's.
        assert!(!maps_device(0x1_0040_0000 | LEAF | WRITABLE, dev));
        assert!(!maps_device(0x1_0000_0000 | LEAF | WRITABLE | 4, dev));
        assert!(!maps_device(0x1_0000_0000 | TABLE, dev));
    }
}
