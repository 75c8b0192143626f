//! A syscall event's arguments copied at the event (`strcopy::emit_words`),
//! run in the emulator of `trampoline`'s tests, in each shape: per-site
//! bodies, the shared body and the function graph's entry (a site's own
//! entry path there); and a new task's syscall and return value at its
//! `ret_from_fork` (`strcopy::fork_words`), its return not hooked.

use super::*;
use crate::kernel::events::fields::FieldValue;
use crate::kernel::events::fork_child::ForkRegs;
use crate::kernel::events::syscall_format::{self, PtRegs};
use crate::kernel::events::{KernelEvent, TableEntry};

/// `struct pt_regs`' di, si, dx, r10, r8, r9 (Linux 6.12).
const PT_REGS: PtRegs = PtRegs {
    args: [112, 104, 96, 56, 72, 64],
    entry: 8,
};
/// Where the emulated syscall's `struct pt_regs` is.
const REGS_VA: u64 = 0x9_4000;
/// RDI in the emulator's registers.
const RDI: usize = 7;

/// `sys_enter_openat`'s format: `__syscall_nr`, then dfd, filename, flags
/// and mode from `regs`.
fn openat() -> crate::kernel::events::fields::EventFormat {
    let args = [
        ("int", "dfd"),
        ("const char *", "filename"),
        ("int", "flags"),
        ("umode_t", "mode"),
    ];
    let table = TableEntry {
        nr: 257,
        func: "__x64_sys_openat".into(),
    };
    let event = KernelEvent::declared("syscalls", "sys_enter_openat", &args, Some(table));
    syscall_format::format(&event, &PT_REGS).unwrap()
}

/// Site 0 is `__x64_sys_openat` (`sys_enter_openat`), site 1 a function
/// of no event: site 0's records hold the four argument registers as the
/// task's `pt_regs` held them at the call, each register kept; site 1's
/// none (unread); the words cost the instructions `path_instructions`
/// says, 2 a word and the status, in every shape.
#[test]
fn emulated_syscall_entries_copy_their_argument_registers() {
    let format = openat();
    // No string: the words need no structure's offset.
    let off = field_offsets();
    let words = strcopy::copies(&format, &off);
    assert_eq!(words.len(), 4);
    assert!(words.iter().all(|c| c.is_word() && c.calls() == 0));
    assert_eq!(strcopy::path_instructions(&words), 9);
    let copies: std::sync::Arc<[Vec<StrCopy>]> = vec![words, Vec::new()].into();
    // The user's registers: AT_FDCWD, a user pointer, O_CREAT|O_WRONLY, 0644.
    let want = [-100i64, 0x4033cb, 0o101, 0o644];
    for (shape, graph) in [
        (Shape::PerSite, false),
        (Shape::Shared, false),
        (Shape::Shared, true),
    ] {
        let mut s = with_task(spec(1, 2, 8), &[]);
        s.layout = RingLayout::with_kind(1, 2, Some(8), graph, RecordKind::Strings).unwrap();
        s.copies = Some(copies.clone());
        s.copy_fns = Some(CopyFns {
            strncpy: STRNCPY_VA,
            copy: COPY_VA,
        });
        let t = generate_shaped(&s, shape).unwrap();
        let mem = memory(&[0]);
        ring::init_rings(&mem, &s.layout).unwrap();
        run_task(&mem, 0, 77);
        for (&at, &v) in PT_REGS.args.iter().zip(&want) {
            mem.write_obj(v, GuestAddress(REGS_VA + u64::from(at)))
                .unwrap();
        }
        let mut emu = Emu {
            mem: &mem,
            code: &t.code,
            tsc: 5,
        };
        let mut reader = RingReader::new(s.layout);
        let mut steps = [0; 2];
        let mut values = Vec::new();
        for k in 0..2u32 {
            let mut r = regs(0);
            r.gpr[RDI] = REGS_VA;
            let before = r.clone();
            steps[k as usize] = emu.call(&mut r, k, PARENT, &t, &mut no_interrupt);
            for reg in (0..16).filter(|&g| g != R10 && g != R11) {
                assert_eq!(
                    r.gpr[reg], before.gpr[reg],
                    "{shape:?}: register {reg} changed"
                );
            }
            let got = drain(&mut reader, &mem);
            assert_eq!(got.len(), 1, "{shape:?}");
            let area = got[0].1.strings.expect("strings");
            let mut v = vec![FieldValue::Unread; 5];
            strcopy::fill(&format, &off, &area, &mut v);
            values.push(v);
        }
        let ints: Vec<FieldValue> = want.iter().map(|&v| FieldValue::Int(v)).collect();
        assert_eq!(values[0][1..], ints[..], "{shape:?} graph {graph}");
        assert_eq!(values[1][1..], vec![FieldValue::Unread; 4], "{shape:?}");
        assert_eq!(steps[0], steps[1] + 9, "{shape:?} graph {graph}");
        if shape == Shape::PerSite {
            let base = COMMON_PATH_INSTRUCTIONS + TASK_INSTRUCTIONS + ARGS_INSTRUCTIONS;
            assert_eq!(t.site_path(0).unwrap().len(), base + 9);
            continue;
        }
        // Site 0's own entry path: its stub's jump target, where the
        // site's return address is at [rsp], then 8 further per push.
        let stub = t.stub_va(0) - CODE_VA;
        let mut d = Decoder::with_ip(
            64,
            &t.code[stub as usize..],
            t.stub_va(0),
            DecoderOptions::NONE,
        );
        let _r11 = d.decode();
        let own = d.decode().near_branch_target();
        assert_ne!(own, t.common_va());
        let first = Decoder::with_ip(
            64,
            &t.code[(own - CODE_VA) as usize..],
            own,
            DecoderOptions::NONE,
        )
        .decode();
        assert_eq!(t.site_return_slot(own), Some(0));
        assert_eq!(t.site_return_slot(first.next_ip()), Some(8));
    }
}

/// `struct pt_regs`' orig_ax and ax (Linux 6.12).
const FORK_REGS: ForkRegs = ForkRegs {
    orig_ax: 120,
    ax: 80,
};
/// RDX and RSI in the emulator's registers.
const RDX: usize = 2;
const RSI: usize = 6;
/// fork(2)'s number, as the child's `regs->orig_ax` holds it.
const NR_FORK: i64 = 57;
/// `task_struct.comm`'s offset, and the emulated task's name there.
const COMM_OFF: u32 = 0x40;
const NAME: &[u8; 16] = b"wl-worker\0\0\0\0\0\0\0";

/// Site 0 is `ret_from_fork(prev, regs, fn, fn_arg)` with the children's
/// exits traced (`TrampolineSpec::entry_only`, `strcopy::fork_words`),
/// site 1 a function of no event, in every shape: site 0's record holds
/// `regs->orig_ax` and `regs->ax`, read through RSI, its arguments
/// (`fn` NULL), its return never hooked (slot 0, its return address as
/// it was), and the task's name, every register kept; site 1 is hooked
/// with the graph. A call of site 0 costs the plain entry's instructions
/// with the task, the arguments and the four words: 46 through its stub.
#[test]
fn emulated_fork_starts_copy_their_words_unhooked() {
    let words = strcopy::fork_words(FORK_REGS, Some(COMM_OFF));
    // Two words of `regs`, two of the task's name (the task loaded once),
    // and the status.
    assert_eq!(strcopy::path_instructions(&words), 10);
    let copies: std::sync::Arc<[Vec<StrCopy>]> = vec![words.clone(), Vec::new()].into();
    let plain = COMMON_PATH_INSTRUCTIONS + TASK_INSTRUCTIONS + ARGS_INSTRUCTIONS + 10;
    for (shape, graph) in [
        (Shape::PerSite, false),
        (Shape::Shared, false),
        (Shape::Shared, true),
    ] {
        let mut s = with_task(spec(1, 2, 8), &[]);
        s.layout = RingLayout::with_kind(1, 2, Some(8), graph, RecordKind::Strings).unwrap();
        s.copies = Some(copies.clone());
        s.copy_fns = Some(CopyFns {
            strncpy: STRNCPY_VA,
            copy: COPY_VA,
        });
        s.entry_only = Some(0);
        let t = generate_shaped(&s, shape).unwrap();
        let mem = memory(&[0]);
        ring::init_rings(&mem, &s.layout).unwrap();
        run_task(&mem, 0, 78);
        mem.write_slice(NAME, GuestAddress(task_va(0) + u64::from(COMM_OFF)))
            .unwrap();
        mem.write_obj(
            NR_FORK,
            GuestAddress(REGS_VA + u64::from(FORK_REGS.orig_ax)),
        )
        .unwrap();
        mem.write_obj(0i64, GuestAddress(REGS_VA + u64::from(FORK_REGS.ax)))
            .unwrap();
        let mut emu = Emu {
            mem: &mem,
            code: &t.code,
            tsc: 5,
        };
        let mut reader = RingReader::new(s.layout);
        let mut steps = [0; 2];
        for k in 0..2u32 {
            let mut r = regs(0);
            r.gpr[RSI] = REGS_VA;
            r.gpr[RDX] = 0;
            let before = r.clone();
            let slot = r.gpr[RSP] - 8;
            steps[k as usize] = emu.call(&mut r, k, PARENT, &t, &mut no_interrupt);
            for reg in (0..16).filter(|&g| g != R10 && g != R11) {
                assert_eq!(r.gpr[reg], before.gpr[reg], "{shape:?}: register {reg}");
            }
            let hooked = emu.read(slot, 8) != PARENT;
            assert_eq!(hooked, graph && k == 1, "{shape:?} site {k}");
            let got = drain(&mut reader, &mem);
            assert_eq!(got.len(), 1, "{shape:?}");
            let rec = got[0].1;
            if k == 1 {
                continue;
            }
            assert_eq!(rec.slot, 0, "{shape:?}");
            let args = rec.args.expect("arguments");
            assert_eq!((args[1], args[2]), (REGS_VA, 0), "{shape:?}");
            let area = rec.strings.expect("strings");
            let got: Vec<FieldValue> = words.iter().map(|c| strcopy::value(c, &area)).collect();
            assert_eq!(got[..2], [FieldValue::Int(NR_FORK), FieldValue::Int(0)]);
            let name = words[2].bytes as usize;
            assert_eq!(&area[name..name + 16], NAME, "{shape:?}");
        }
        match shape {
            Shape::PerSite => assert_eq!(t.site_path(0).unwrap().len(), plain),
            Shape::Shared => assert_eq!(steps[0], STUB_INSTRUCTIONS + plain, "graph {graph}"),
        }
    }
}
