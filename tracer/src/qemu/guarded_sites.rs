//! The traced events' call sites the guard watches (trap mode's
//! `super::breakpoints`, exitless mode's `super::event_guard`): vmtrace's
//! jumps the guest has not taken over by enabling their event itself.
//!
//! At the detach every site still vmtrace's gets its NOP back whatever
//! its key's count. A key the guest is enabling has its count -1 until
//! all its sites are queued (kernel/jump_label.c
//! `static_key_enable_cpuslocked`); its sites not queued yet will be
//! checked for their NOP once the guard is gone (arch/x86/kernel/jump_label.c
//! `__jump_label_patch` BUGs on anything else). `super::event_sites::restore`,
//! which leaves the sites of a key counted as the guest's, runs after.

use std::collections::HashMap;

use vm_memory::GuestAddress;

use super::journal::{unhex, JournaledJump};
use crate::kernel::kaslr::KernelOffset;

/// The guest patches the site of the `__jump_table` entry at `entry`
/// (`struct jump_entry { s32 code; ... }`, in the kernel's image; the
/// kernel sorted its table at boot, so an entry is known by the code it
/// names): if it is one of `guarded` holding vmtrace's jump, its NOP goes
/// back first, and it leaves `guarded`. Returns whether it was given.
pub(super) fn give_to_guest(
    entry: u64,
    offset: KernelOffset,
    guarded: &mut HashMap<u64, JournaledJump>,
    ram: &dyn vmm::GuestRam,
) -> Result<bool, vmm::RamError> {
    let Some(gpa) = offset.phys_of(offset.link(entry)) else {
        return Ok(false);
    };
    let mut rel = [0u8; 4];
    ram.read_slice(&mut rel, GuestAddress(gpa))?;
    let code = entry.wrapping_add_signed(i64::from(i32::from_le_bytes(rel)));
    let Some(j) = guarded.remove(&code) else {
        return Ok(false);
    };
    give_back(&j, ram)
}

/// At the detach, the guard's breakpoints gone: every site of `guarded`
/// still holding vmtrace's jump given its NOP, whatever its key's count
/// (see the module's comment); `guarded` emptied. Returns the sites given.
pub(super) fn give_back_all(
    guarded: &mut HashMap<u64, JournaledJump>,
    ram: &dyn vmm::GuestRam,
) -> Result<usize, vmm::RamError> {
    let mut given = 0;
    for j in std::mem::take(guarded).into_values() {
        given += usize::from(give_back(&j, ram)?);
    }
    Ok(given)
}

/// `j`'s NOP written where its jump is; anything else there left alone.
fn give_back(j: &JournaledJump, ram: &dyn vmm::GuestRam) -> Result<bool, vmm::RamError> {
    let (Some(nop), Some(jump)) = (unhex(&j.nop), unhex(&j.jump)) else {
        return Ok(false);
    };
    let mut now = vec![0u8; nop.len()];
    ram.read_slice(&mut now, GuestAddress(j.gpa))?;
    if now != jump {
        return Ok(false);
    }
    ram.write_slice(&nop, GuestAddress(j.gpa))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
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

    fn site(va: u64) -> JournaledJump {
        JournaledJump {
            va,
            gpa: va - PHYS,
            nop: hex(&NOP),
            jump: hex(&JUMP),
            key_gpa: KEY - PHYS,
        }
    }

    /// The guest enabling a key of three sites (its count -1 meanwhile)
    /// queued the first (its NOP given back there, the site the guest's);
    /// the detach comes then: the second, still vmtrace's jump, gets its
    /// NOP whatever the count, the third (the guest's bytes) is left.
    #[test]
    fn the_detach_gives_back_a_key_mid_enable() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 32 << 20)]).unwrap();
        for va in [A, B] {
            mem.write_slice(&JUMP, GuestAddress(va - PHYS)).unwrap();
        }
        let other = [0xe9, 0, 0, 0, 0];
        mem.write_slice(&other, GuestAddress(C - PHYS)).unwrap();
        mem.write_obj(-1i32, GuestAddress(KEY - PHYS)).unwrap();
        // `struct jump_entry`'s code: relative to the entry.
        let rel = i32::try_from(A as i64 - ENTRY as i64).unwrap();
        mem.write_obj(rel, GuestAddress(ENTRY - PHYS)).unwrap();
        let mut guarded: HashMap<u64, JournaledJump> =
            [A, B, C].into_iter().map(|v| (v, site(v))).collect();
        let off = KernelOffset::NONE;
        assert!(give_to_guest(ENTRY, off, &mut guarded, &mem).unwrap());
        assert!(!guarded.contains_key(&A));
        // The guest's own jump at A now (it patched it): not vmtrace's.
        mem.write_slice(&JUMP, GuestAddress(A - PHYS)).unwrap();
        assert_eq!(give_back_all(&mut guarded, &mem).unwrap(), 1);
        assert!(guarded.is_empty());
        let at = |va: u64| {
            let mut b = [0u8; 5];
            mem.read_slice(&mut b, GuestAddress(va - PHYS)).unwrap();
            b
        };
        assert_eq!((at(A), at(B), at(C)), (JUMP, NOP, other));
        // A second entry for A finds it no longer guarded.
        assert!(!give_to_guest(ENTRY, off, &mut guarded, &mem).unwrap());
    }
}
