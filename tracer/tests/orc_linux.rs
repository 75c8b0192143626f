//! The ORC tables of the real guest kernels (Linux 6.1 and 6.12, built
//! with CONFIG_UNWINDER_ORC): they parse in their version's `orc_entry`
//! layout, from the vmlinux (with and without BTF) and from the bzImage
//! alone; objtool's entries say what the code does at ftrace sites and in
//! interrupt entry code; and an unwind over a stack laid out as those
//! entries say, for the timer interrupt's real call chain, gives the
//! return addresses of that chain. A kernel not built is skipped with a
//! message, as elsewhere.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use iced_x86::{Decoder, DecoderOptions, FlowControl};
use tracer::kernel::btf::KernelBtf;
use tracer::kernel::symbols::{KernelImage, Symbol};
use tracer::kernel::unwind::orc::{pt_regs, OrcEntry, OrcLayout, OrcTable, OrcType};
use tracer::kernel::unwind::orc_table::reg;
use tracer::kernel::unwind::{
    EntryRegs, NoFixup, Stack, StackEnd, StackMemory, UnwindCtx, Unwinder,
};

fn guest(dir: &str, build: &str) -> Option<(PathBuf, PathBuf)> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../guest/out")
        .join(dir);
    let (bz, vmlinux) = (d.join("bzImage"), d.join("vmlinux"));
    if bz.is_file() && vmlinux.is_file() {
        Some((bz, vmlinux))
    } else {
        eprintln!(
            "SKIPPED: {} is not built; run `bash guest/build.sh {build}`",
            bz.display()
        );
        None
    }
}

/// The image, its BTF and its ORC table; None (skipped) for a build from
/// before the guests had CONFIG_UNWINDER_ORC.
fn load(vmlinux: &Path, build: &str) -> Option<(KernelImage, KernelBtf, OrcTable)> {
    let image = KernelImage::load(vmlinux).unwrap();
    let btf = KernelBtf::from_image(&image).unwrap();
    match OrcTable::from_image(&image, Some(&btf)) {
        Ok(t) => Some((image, btf, t)),
        Err(e) => {
            eprintln!("SKIPPED: {e}; rebuild it with `bash guest/build.sh {build}`");
            None
        }
    }
}

fn sym<'a>(image: &'a KernelImage, name: &str) -> &'a Symbol {
    image
        .symbol(name)
        .unwrap_or_else(|| panic!("{name} is in the symbol table"))
}

/// Where `f` ends: its size, or the next function for a size-0 one.
fn end_of(image: &KernelImage, f: &Symbol) -> u64 {
    if f.size > 0 {
        return f.addr + f.size;
    }
    let i = image.functions.partition_point(|g| g.addr <= f.addr);
    image.functions[i].addr
}

/// The return addresses of the calls in `f` that `pick` accepts (decoded
/// from the file), in address order.
fn calls_in(
    image: &KernelImage,
    f: &str,
    pick: impl Fn(&iced_x86::Instruction) -> bool,
) -> Vec<u64> {
    let f = sym(image, f);
    let len = (end_of(image, f) - f.addr) as usize;
    let code = image.file_bytes(f.addr, len).unwrap();
    Decoder::with_ip(64, code, f.addr, DecoderOptions::NONE)
        .into_iter()
        .filter(|i| {
            matches!(
                i.flow_control(),
                FlowControl::Call | FlowControl::IndirectCall
            ) && pick(i)
        })
        .map(|i| i.next_ip())
        .collect()
}

fn direct_calls(image: &KernelImage, f: &str, target: &str) -> Vec<u64> {
    let to = sym(image, target).addr;
    calls_in(image, f, |i| {
        i.flow_control() == FlowControl::Call && i.near_branch_target() == to
    })
}

/// Indirect calls, also through a retpoline thunk.
fn indirect_calls(image: &KernelImage, f: &str) -> Vec<u64> {
    calls_in(image, f, |i| {
        i.flow_control() == FlowControl::IndirectCall
            || image
                .function_at(i.near_branch_target())
                .is_some_and(|t| t.name.starts_with("__x86_indirect_thunk"))
    })
}

/// The ftrace site of traced function `f`.
fn site(image: &KernelImage, f: &str) -> u64 {
    let f = sym(image, f);
    let end = end_of(image, f);
    *image
        .mcount_loc
        .iter()
        .find(|&&s| (f.addr..end).contains(&s))
        .unwrap_or_else(|| panic!("{} is traced", f.name))
}

fn is_call_sp(e: &OrcEntry, offset: i16) -> bool {
    (e.kind, e.sp_reg, e.sp_offset) == (OrcType::Call, reg::SP, offset)
}

fn check_table(bz: &Path, vmlinux: &Path, build: &str, layout: OrcLayout) {
    let Some((image, btf, t)) = load(vmlinux, build) else {
        return;
    };
    assert_eq!(t.layout(), layout);
    // What told: BTF's struct orc_entry, `type` 2 bits wide before 6.4
    // (with `end`), 3 since (with `signal`).
    let (bits, flag) = match layout {
        OrcLayout::Old => (2, "end"),
        OrcLayout::New => (3, "signal"),
    };
    assert_eq!(btf.bitfield_bits("orc_entry", "type").unwrap(), Some(bits));
    assert_eq!(btf.bitfield_bits("orc_entry", flag).unwrap(), Some(1));
    assert_eq!(btf.bitfield_bits("orc_entry", "sp_offset").unwrap(), None);
    // Without BTF, by `.orc_header`: the same.
    let bare = OrcTable::from_image(&image, None).unwrap();
    assert_eq!((bare.len(), bare.layout()), (t.len(), layout));
    // From the bzImage alone (its payload keeps the sections and BTF).
    let (alone, _) = tracer::kernel::bzimage::load(bz).unwrap();
    let from_bz =
        OrcTable::from_image(&alone, KernelBtf::from_image(&alone).ok().as_ref()).unwrap();
    assert_eq!((from_bz.len(), from_bz.layout()), (t.len(), layout));
    let (u, note) = Unwinder::for_image(&image, Some(&btf));
    assert!(matches!(u, Unwinder::Orc(_)));
    assert_eq!(
        note,
        format!("ORC ({} entries, {})", t.len(), layout.name())
    );
    // A hundred thousand entries or so: one per change of stack layout.
    assert!(t.len() > 10_000, "{} entries", t.len());

    // Every ftrace site is a function's first call, where only the return
    // address is on the stack: CALL, CFA = SP + 8; but for code objtool
    // skips (OBJECT_FILES_NON_STANDARD files, STACK_FRAME_NON_STANDARD
    // functions: 6.1's fixup_vdso_exception, machine_real_restart), where
    // an UNDEFINED entry (the terminator objtool puts at the end of the
    // code before) covers the function from its start.
    let mut skipped = Vec::new();
    // (Zero sites are the dropped weak functions' that 6.12's sorttable
    // clears; ftrace skips them.)
    for &s in image.mcount_loc.iter().filter(|&&s| s != 0) {
        if t.find(s).is_some_and(|e| is_call_sp(e, 8)) {
            continue;
        }
        let f = image.function_at(s).unwrap();
        let last = t.entries_in(f.addr, s + 1).last();
        assert!(
            matches!(last, Some((at, e)) if at == f.addr && e.kind == OrcType::Undefined),
            "{}'s site {s:#x}: {last:?}",
            f.name
        );
        skipped.push(f.name.as_str());
    }
    eprintln!("functions without ORC: {skipped:?}");
    assert!(skipped.len() * 100 < image.mcount_loc.len(), "{skipped:?}");
    let hr = site(&image, "hrtimer_interrupt");
    assert!(is_call_sp(t.find(hr).unwrap(), 8));

    // The timer interrupt's entry code saves a pt_regs.
    let asm = sym(&image, "asm_sysvec_apic_timer_interrupt");
    let kinds: Vec<OrcType> = t
        .entries_in(asm.addr, end_of(&image, asm))
        .map(|(_, e)| e.kind)
        .collect();
    assert!(
        kinds.contains(&OrcType::Regs) || kinds.contains(&OrcType::RegsPartial),
        "{kinds:?}"
    );
    check_timer_interrupt_stack(&image, &t, u);
}

#[derive(Default)]
struct Mem(HashMap<u64, u64>);

impl StackMemory for Mem {
    fn read_u64(&mut self, va: u64) -> Option<u64> {
        self.0.get(&va).copied()
    }
}

/// The KASLR slide the synthetic stacks run at (a multiple of 2 MiB).
const SLIDE: u64 = 0x2a00_0000;
const TASK_STACK: u64 = 0xffff_c900_0001_0000;
const IRQ_STACK_TOP: u64 = 0xffff_c900_0080_4000;

/// Lays out the frame of the function `ret` returns into, per its entry at
/// `ret - 1` (a CALL by SP, as everything without frame pointers is):
/// from `sp` (just above the callee's return address slot) to the CFA,
/// where the next return address `next` goes. Returns the CFA.
fn call_frame(t: &OrcTable, m: &mut Mem, ret: u64, sp: u64, next: u64) -> u64 {
    let e = t.find(ret - 1).unwrap();
    assert!(
        e.kind == OrcType::Call && e.sp_reg == reg::SP,
        "{ret:#x}: {e:?}"
    );
    let cfa = sp + e.sp_offset as u64;
    m.0.insert(cfa - 8, next + SLIDE);
    saved_bp(m, e, cfa);
    cfa
}

/// Where the entry says the caller's bp was saved, something to read.
fn saved_bp(m: &mut Mem, e: &OrcEntry, cfa: u64) {
    if e.bp_reg == reg::PREV_SP {
        m.0.insert(cfa.wrapping_add_signed(e.bp_offset.into()), 0x1234);
    }
}

/// hrtimer_interrupt <- __sysvec_apic_timer_interrupt (an indirect call)
/// <- sysvec_apic_timer_interrupt (on the IRQ stack through SP_INDIRECT,
/// or not) <- asm_sysvec_apic_timer_interrupt (pt_regs), interrupting
/// user mode, or a kernel thread at the start of a traced function G
/// called by ret_from_fork (the stack's bottom).
fn check_timer_interrupt_stack(image: &KernelImage, t: &OrcTable, u: Unwinder) {
    let r1 = indirect_calls(image, "__sysvec_apic_timer_interrupt")[0];
    let r2s = direct_calls(
        image,
        "sysvec_apic_timer_interrupt",
        "__sysvec_apic_timer_interrupt",
    );
    let r3 = direct_calls(
        image,
        "asm_sysvec_apic_timer_interrupt",
        "sysvec_apic_timer_interrupt",
    )[0];
    // The bottom: the return from ret_from_fork's call of a kernel
    // thread's function (6.1), or ret_from_fork_asm's call of the C
    // ret_from_fork (6.12).
    let bottom = match image.symbol("ret_from_fork_asm") {
        Some(_) => direct_calls(image, "ret_from_fork_asm", "ret_from_fork"),
        None => indirect_calls(image, "ret_from_fork"),
    };
    let bottom = *bottom.last().unwrap();
    let g = site(image, "kthread");
    let text = [image.text.unwrap(), image.init_text.unwrap()];
    let ctx = UnwindCtx {
        slide: SLIDE as i64,
        text: &text,
        fixup: &NoFixup,
        modules: &[],
    };
    // Both of sysvec's calls: the IRQ stack switch is the one whose entry
    // reads the stack pointer indirectly.
    let mut switched = 0;
    for &r2 in &r2s {
        let on_irq = t.find(r2 - 1).unwrap().sp_reg == reg::SP_INDIRECT;
        switched += usize::from(on_irq);
        for user in [true, false] {
            let mut m = Mem::default();
            // hrtimer_interrupt's site: its return address at sp0.
            let e1 = *t.find(r1 - 1).unwrap();
            let tos = IRQ_STACK_TOP - 8;
            let sp0 = if on_irq {
                tos - e1.sp_offset as u64 - 8
            } else {
                TASK_STACK + 0x100
            };
            m.0.insert(sp0, r1 + SLIDE);
            let sp1 = call_frame(t, &mut m, r1, sp0 + 8, r2);
            // sysvec's frame: on the task stack below the IRQ stack.
            let sp2 = if on_irq {
                let e2 = t.find(r2 - 1).unwrap();
                assert_eq!(sp1, tos);
                let old_sp = TASK_STACK + 0x100;
                m.0.insert(tos, old_sp);
                let cfa = old_sp + e2.sp_offset as u64;
                m.0.insert(cfa - 8, r3 + SLIDE);
                saved_bp(&mut m, e2, cfa);
                cfa
            } else {
                call_frame(t, &mut m, r2, sp1, r3)
            };
            // The entry code's pt_regs at its CFA.
            let e3 = t.find(r3 - 1).unwrap();
            assert_eq!((e3.kind, e3.sp_reg), (OrcType::Regs, reg::SP), "{e3:?}");
            let regs = sp2 + e3.sp_offset as u64;
            let g_sp = regs + pt_regs::SIZE + 0x200;
            let (ip, cs) = if user {
                (0x40_1000, 0x33)
            } else {
                (g + SLIDE, 0x10)
            };
            for (off, v) in [
                (pt_regs::IP, ip),
                (pt_regs::CS, cs),
                (pt_regs::SP, g_sp),
                (pt_regs::BP, 0),
            ] {
                m.0.insert(regs + off, v);
            }
            m.0.insert(g_sp, bottom + SLIDE);
            let entry = EntryRegs {
                ip: site(image, "hrtimer_interrupt") + SLIDE,
                sp: sp0,
                bp: 0x4321,
            };
            let s = u.unwind(entry, &mut m, &ctx);
            let mut frames = vec![r1, r2, r3];
            let (end, exact) = if user {
                (StackEnd::User, 0)
            } else {
                frames.extend([g, bottom]);
                // g, the interrupted instruction, is frame 3.
                (StackEnd::Bottom, 1 << 3)
            };
            assert_eq!(
                s,
                Stack { frames, end, exact },
                "on the IRQ stack: {on_irq}, user: {user}"
            );
        }
    }
    assert_eq!(switched, 1, "one of {r2s:#x?} switches to the IRQ stack");
}

#[test]
fn linux_6_1_orc_tables() {
    if let Some((bz, vmlinux)) = guest("", "linux") {
        check_table(&bz, &vmlinux, "linux", OrcLayout::Old);
    }
}

#[test]
fn linux_6_12_orc_tables() {
    if let Some((bz, vmlinux)) = guest("linux-6.12", "linux-6.12") {
        check_table(&bz, &vmlinux, "linux-6.12", OrcLayout::New);
    }
}
