//! A module's event found again at its load, or left untraced where its
//! code differs, read through page tables as the guest's: the boot page
//! tables (`vmm::boot::regs::setup_page_tables`) map `KMAP` + physical.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::gva::{AddressSpace, PagingMode};

use super::*;
use crate::kernel::events::jump_sites::NOP5;
use crate::kernel::module_walk::ModuleWalk;

/// The kernel map of the boot page tables: virtual `KMAP` + physical.
const KMAP: u64 = 0xffff_ffff_8000_0000;
/// The module's text at the attach and once loaded again (the physical
/// pages of the new one are `NEW_PHYS`), 4 KiB each.
const OLD: u64 = KMAP + 0x10_0000;
const NEW_PHYS: u64 = 0x20_0000;
const NEW: u64 = KMAP + NEW_PHYS;
const TEXT: u64 = 0x1000;
/// Its event's static key at the attach and in the new load (the data
/// moves apart from the text, 6.4+).
const OLD_KEY: u64 = KMAP + 0x30_0000;
const NEW_KEY_PHYS: u64 = 0x31_0000;
const NEW_KEY: u64 = KMAP + NEW_KEY_PHYS;
/// `tp->funcs` is 0x40 past the key in this event's `struct tracepoint`.
const FUNCS: u64 = 0x40;
/// The event's call sites and their jump's target (text offsets).
const SITE: u64 = 0x10;
const SITE2: u64 = 0x60;
const TARGET: u64 = 0x30;
/// A `__jump_table` entry's key with `JUMP_TYPE_TRUE` set (a flag bit
/// the key's address is found without).
const KEY_FLAG: u64 = 1;
/// vmtrace's jump at `SITE`: `jmp rel32` to `TARGET`.
const JMP: [u8; 5] = [0xe9, 0x1b, 0x00, 0x00, 0x00];
/// Its `struct module` at the attach and once loaded again.
const OLD_MODULE: u64 = KMAP + 0x38_0000;
const NEW_MODULE: u64 = KMAP + 0x40_0000;

/// The module as the attach read it.
fn attach_module() -> ModuleId {
    ModuleId {
        addr: OLD_MODULE,
        name: "vmt_test".into(),
        text: OLD..OLD + TEXT,
        walk: ModuleWalk {
            head: KMAP + 0x1000,
            list: 8,
            state: 0,
            name: 0x18,
            text_base: 0x100,
            text_size: 0x108,
        },
    }
}

/// The guest's memory, mapped, each new site holding the kernel's NOP.
fn memory() -> GuestMemoryMmap {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
    vmm::boot::regs::setup_page_tables(&mem).unwrap();
    for s in [SITE, SITE2] {
        mem.write_slice(&NOP5, GuestAddress(NEW_PHYS + s)).unwrap();
    }
    mem
}

/// The attach's event in the module's old text: call sites at `sites`
/// (offsets), trap mode's `tp->funcs` test after the first.
fn attach_event(sites: &[u64]) -> AttachEvent {
    AttachEvent {
        module: "vmt_test".into(),
        key: OLD_KEY,
        funcs: OLD_KEY + FUNCS,
        iterator_cell: OLD_KEY + 0x48,
        iterator: OLD + 0x800,
        tramp: None,
        sites: (sites.iter())
            .map(|&s| (OLD + s, OLD + TARGET, NOP5.to_vec(), JMP.to_vec()))
            .collect(),
        tests: vec![(OLD + 0x20, OLD + 0x24, OLD + 0x28, "rax".into())],
        skips: true,
        loads: false,
    }
}

/// The module loaded again at `NEW`: a jump label entry at each of
/// `entries` (offset, target offset, key).
fn reloaded(entries: &[(u64, u64, u64)]) -> Reloaded {
    Reloaded {
        name: "vmt_test".into(),
        module: NEW_MODULE,
        was: OLD..OLD + TEXT,
        text: NEW..NEW + TEXT,
        jumps: entries.iter().map(|e| (NEW + e.0, NEW + e.1)).collect(),
        keys: entries
            .iter()
            .map(|e| (NEW + e.0, e.2 | KEY_FLAG))
            .collect(),
    }
}

/// Found again in trap mode: (again, untraced) and what it gets.
fn found(mem: &GuestMemoryMmap, e: AttachEvent, r: &Reloaded) -> (usize, usize, Vec<Again>) {
    let mut space = AddressSpace::new(mem, vmm::layout::PML4_START, PagingMode::Level4);
    let mut events = ReloadEvents {
        events: vec![e],
        modules: vec![attach_module()],
        ..ReloadEvents::default()
    };
    let again = events.found_again(r, &mut space, false);
    (events.again, events.untraced, again)
}

/// At the same offset, of the same target and one key, its NOP there:
/// traced again, its site the same jump where the new text is (naming
/// the module as loaded now), its key's count and `tp->funcs` where the
/// new key is.
#[test]
fn an_event_at_the_same_offsets_is_traced_again_where_the_module_is_now() {
    let mem = memory();
    let r = reloaded(&[(SITE, TARGET, NEW_KEY)]);
    let (again, untraced, a) = found(&mem, attach_event(&[SITE]), &r);
    assert_eq!((again, untraced, a.len()), (1, 0, 1));
    let want = JournaledJump {
        module: Some(attach_module().again(NEW_MODULE, NEW..NEW + TEXT)),
        va: NEW + SITE,
        gpa: NEW_PHYS + SITE,
        nop: hex(&NOP5),
        jump: hex(&JMP),
        key_gpa: NEW_KEY_PHYS,
    };
    assert_eq!(a[0].jumps, [want]);
    let skip = (
        NEW + 0x24,
        NEW + 0x28,
        "rax".to_string(),
        NEW_KEY + FUNCS - 8,
    );
    assert_eq!(a[0].skips, [skip]);
}

/// Why it differs, the attach's sites (offsets), the new load's jump label
/// entries, whether the site holds the guest's own jump.
type Case = (&'static str, Vec<u64>, Vec<(u64, u64, u64)>, bool);

/// Each way a reloaded module's event can differ from the attach's
/// leaves it untraced, counted, with nothing to write: a site not its NOP
/// now, no jump label entry at its offset, an entry of another target,
/// two sites of two keys, a site past the module's old text.
#[test]
fn an_event_whose_code_differs_is_left_untraced() {
    let other_key = NEW_KEY + 0x100;
    let cases: [Case; 5] = [
        ("bytes", vec![SITE], vec![(SITE, TARGET, NEW_KEY)], true),
        (
            "offset",
            vec![SITE],
            vec![(SITE + 8, TARGET, NEW_KEY)],
            false,
        ),
        (
            "target",
            vec![SITE],
            vec![(SITE, TARGET + 8, NEW_KEY)],
            false,
        ),
        (
            "key",
            vec![SITE, SITE2],
            vec![(SITE, TARGET, NEW_KEY), (SITE2, TARGET, other_key)],
            false,
        ),
        (
            "text",
            vec![TEXT + SITE],
            vec![(SITE, TARGET, NEW_KEY)],
            false,
        ),
    ];
    for (why, sites, entries, changed) in cases {
        let mem = memory();
        if changed {
            // The guest's own jump there (say, its key enabled at init).
            mem.write_slice(&JMP, GuestAddress(NEW_PHYS + SITE))
                .unwrap();
        }
        let (again, untraced, a) = found(&mem, attach_event(&sites), &reloaded(&entries));
        assert_eq!((again, untraced), (0, 1), "{why}");
        assert!(a.is_empty(), "{why}: {a:?}");
    }
}
