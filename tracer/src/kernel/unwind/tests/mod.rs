//! Unit tests of both unwinders over hand-laid stacks and hand-built ORC
//! tables (HashMap memory), each rule and each way a stack ends, in both
//! `struct orc_entry` layouts.

use std::collections::HashMap;

use super::orc::pt_regs;
use super::orc_table::{reg, OrcEntry, OrcLayout, OrcTable, OrcType};
use super::*;

const LAYOUTS: [OrcLayout; 2] = [OrcLayout::Old, OrcLayout::New];
/// Kernel text at link addresses.
const TEXT: u64 = 0xffff_ffff_8100_0000;
const TEXT_END: u64 = 0xffff_ffff_8200_0000;
const TEXT_RANGES: &[(u64, u64)] = &[(TEXT, TEXT_END)];
/// The KASLR slide of most tests.
const SLIDE: i64 = 0x1e00_0000;
/// A task stack and an IRQ stack (guest-virtual; the IRQ stack above).
const TASK_STACK: u64 = 0xffff_c900_0001_0000;
const IRQ_STACK_TOP: u64 = 0xffff_c900_0080_4000;

/// Functions of the made-up kernel (link addresses).
const A: u64 = TEXT + 0x1000; // the traced function
const B: u64 = TEXT + 0x2000; // frame-pointer frame
const C: u64 = TEXT + 0x3000; // sp-only frame
const D: u64 = TEXT + 0x4000; // the stack's bottom (ret_from_fork)
const ENTRY: u64 = TEXT + 0x5000; // interrupt entry code
const H: u64 = TEXT + 0x6000; // interrupt handler
const S: u64 = TEXT + 0x7000; // switches to the IRQ stack
const R: u64 = TEXT + 0x8000; // recursive

fn run(link: u64) -> u64 {
    link.wrapping_add(SLIDE as u64)
}

#[derive(Default)]
struct Mem(HashMap<u64, u64>);

impl Mem {
    fn put(&mut self, va: u64, v: u64) -> &mut Mem {
        self.0.insert(va, v);
        self
    }

    /// A `struct pt_regs` at `at` with these ip, cs, sp, bp (and r10).
    fn regs(&mut self, at: u64, ip: u64, cs: u64, sp: u64, bp: u64) -> &mut Mem {
        self.put(at + pt_regs::IP, ip)
            .put(at + pt_regs::CS, cs)
            .put(at + pt_regs::SP, sp)
            .put(at + pt_regs::BP, bp)
    }
}

impl StackMemory for Mem {
    fn read_u64(&mut self, va: u64) -> Option<u64> {
        self.0.get(&va).copied()
    }
}

/// One hooked return: `slot` holds `hook` instead of `real`.
struct Hooked {
    slot: u64,
    hook: u64,
    real: u64,
}

impl ReturnFixup for Hooked {
    fn real(&self, slot: u64, value: u64) -> u64 {
        if slot == self.slot && value == self.hook {
            self.real
        } else {
            value
        }
    }
}

fn ctx<'a>(fixup: &'a dyn ReturnFixup) -> UnwindCtx<'a> {
    UnwindCtx {
        slide: SLIDE,
        text: TEXT_RANGES,
        fixup,
        modules: &[],
    }
}

fn entry(kind: OrcType, sp_reg: u8, sp_offset: i16, bp_reg: u8, bp_offset: i16) -> OrcEntry {
    OrcEntry {
        sp_offset,
        bp_offset,
        sp_reg,
        bp_reg,
        kind,
        signal: matches!(kind, OrcType::Regs | OrcType::RegsPartial),
    }
}

fn call(sp_off: i16) -> OrcEntry {
    entry(OrcType::Call, reg::SP, sp_off, reg::UNDEFINED, 0)
}

/// After `push %rbp; mov %rsp,%rbp`: the CFA is bp + 16, the caller's bp
/// at CFA - 16.
fn bp_frame() -> OrcEntry {
    entry(OrcType::Call, reg::BP, 16, reg::PREV_SP, -16)
}

fn end() -> OrcEntry {
    entry(OrcType::EndOfStack, reg::UNDEFINED, 0, reg::UNDEFINED, 0)
}

/// The flags of `e` as objtool writes them in `layout` (the inverse of
/// `OrcLayout::decode`).
fn encode(layout: OrcLayout, e: &OrcEntry) -> [u8; 6] {
    let regs = u16::from(e.sp_reg) | u16::from(e.bp_reg) << 4;
    let flags = match (layout, e.kind) {
        (OrcLayout::Old, OrcType::EndOfStack) => 1 << 10,
        (OrcLayout::Old, OrcType::Undefined) => u16::from(e.bp_reg) << 4,
        (OrcLayout::Old, k) => regs | (k as u16 - OrcType::Call as u16) << 8,
        (OrcLayout::New, k) => regs | (k as u16) << 8 | u16::from(e.signal) << 11,
    };
    let mut raw = [0; 6];
    raw[..2].copy_from_slice(&e.sp_offset.to_le_bytes());
    raw[2..4].copy_from_slice(&e.bp_offset.to_le_bytes());
    raw[4..].copy_from_slice(&flags.to_le_bytes());
    raw
}

/// A table in `layout`, through its bytes, as the image's would be read.
fn table(layout: OrcLayout, entries: &[(u64, OrcEntry)]) -> OrcTable {
    let pairs = entries
        .iter()
        .map(|(ip, e)| (*ip, layout.decode(encode(layout, e))))
        .collect();
    OrcTable::new(layout, pairs)
}

/// The made-up kernel's ORC: A's entry site, B with a frame pointer, C
/// without, D the bottom; interrupt entry code; S calling on the IRQ
/// stack; R recursive; nothing past TEXT + 0x9000.
fn kernel(layout: OrcLayout) -> OrcTable {
    let iret = entry(OrcType::RegsPartial, reg::SP, 0, reg::UNDEFINED, 0);
    let regs = entry(OrcType::Regs, reg::SP, 0, reg::UNDEFINED, 0);
    table(
        layout,
        &[
            (A, call(8)),
            (A + 1, call(16)),
            (B, call(8)),
            (B + 1, call(16)),
            (B + 4, bp_frame()),
            (C, call(8)),
            (C + 4, call(0x30)),
            (D, end()),
            (ENTRY, iret),
            (ENTRY + 0x10, regs),
            (ENTRY + 0x30, end()),
            (H, call(8)),
            (H + 4, call(0x18)),
            (S, call(8)),
            (S + 1, call(16)),
            (S + 4, bp_frame()),
            // call_on_stack(): rsp is the IRQ stack's top, where the old
            // rsp is stored; the old frame's CFA is 16 above that.
            (
                S + 0x20,
                entry(OrcType::Call, reg::SP_INDIRECT, 16, reg::PREV_SP, -16),
            ),
            (S + 0x30, bp_frame()),
            (R, call(8)),
            (R + 4, call(0x10)),
            (
                TEXT + 0x9000,
                entry(OrcType::Undefined, reg::UNDEFINED, 0, reg::UNDEFINED, 0),
            ),
        ],
    )
}

fn orc(layout: OrcLayout, regs: EntryRegs, mem: &mut Mem, fixup: &dyn ReturnFixup) -> Stack {
    orc::unwind(&kernel(layout), regs, mem, &ctx(fixup))
}

/// A's entry site with `[sp]` = `ret` (link) at sp.
fn at_a(sp: u64, bp: u64) -> EntryRegs {
    EntryRegs { ip: run(A), sp, bp }
}

#[test]
fn entries_decode_in_both_layouts() {
    // CALL, SP + 8, bp UNDEFINED: type 0 before 6.4, 2 since.
    let old = OrcLayout::Old.decode([8, 0, 0, 0, 0x05, 0x00]);
    assert_eq!(old, call(8));
    assert_eq!(OrcLayout::New.decode([8, 0, 0, 0, 0x05, 0x02]), call(8));
    // The same bytes in the other layout: 6.1's REGS_PARTIAL is 6.4's CALL.
    let partial = OrcLayout::Old.decode([0, 0, 0, 0, 0x05, 0x02]);
    assert_eq!((partial.kind, partial.signal), (OrcType::RegsPartial, true));
    // 6.4's REGS with signal; 6.1's end bit (UNWIND_HINT_EMPTY).
    let regs = OrcLayout::New.decode([0, 0, 0, 0, 0x05, 0x0b]);
    assert_eq!(
        (regs.kind, regs.signal, regs.sp_reg),
        (OrcType::Regs, true, reg::SP)
    );
    assert_eq!(
        OrcLayout::Old.decode([0, 0, 0, 0, 0, 0x04]).kind,
        OrcType::EndOfStack
    );
    assert_eq!(
        OrcLayout::New.decode([0, 0, 0, 0, 0, 0x01]).kind,
        OrcType::EndOfStack
    );
    // sp_reg UNDEFINED without end: a weak terminator before 6.4.
    assert_eq!(OrcLayout::Old.decode([0; 6]).kind, OrcType::Undefined);
    assert_eq!(OrcLayout::New.decode([0; 6]).kind, OrcType::Undefined);
    // Offsets are signed; the bp rule's nibble.
    let e = OrcLayout::New.decode([0x10, 0, 0xf0, 0xff, 0x14, 0x02]);
    assert_eq!(
        (e.sp_offset, e.bp_offset, e.sp_reg, e.bp_reg),
        (16, -16, reg::BP, reg::PREV_SP)
    );
    for layout in LAYOUTS {
        for e in [
            call(8),
            bp_frame(),
            end(),
            entry(OrcType::Regs, reg::SP, 0, 0, 0),
        ] {
            assert_eq!(layout.decode(encode(layout, &e)), e, "{layout:?}");
        }
    }
    assert_eq!(OrcLayout::Old.name(), "Linux 4.14-6.3 layout");
    assert_eq!(OrcLayout::New.name(), "Linux 6.4+ layout");
}

#[test]
fn lookup_takes_the_last_entry_at_or_below_and_skips_weak_terminators() {
    let weak = entry(OrcType::Undefined, reg::UNDEFINED, 0, reg::UNDEFINED, 0);
    // In file order the terminator comes after the real entry at 0x200.
    let t = OrcTable::new(
        OrcLayout::New,
        vec![
            (0x200, call(24)),
            (0x100, call(8)),
            (0x200, weak),
            (0x300, weak),
        ],
    );
    assert_eq!(t.len(), 4);
    assert_eq!(t.find(0xff), None);
    assert_eq!(t.find(0x100), Some(&call(8)));
    assert_eq!(t.find(0x1ff), Some(&call(8)));
    assert_eq!(t.find(0x200), Some(&call(24)));
    assert_eq!(t.find(0x2ff), Some(&call(24)));
    assert_eq!(t.find(0x300), Some(&weak));
    let starts: Vec<u64> = t.entries_in(0x100, 0x300).map(|(ip, _)| ip).collect();
    assert_eq!(starts, [0x100, 0x200, 0x200]);
}

/// A <- B (frame pointer) <- C (sp only) <- D (bottom): the return
/// addresses, bp restored from B's frame on the way.
#[test]
fn call_frames_by_sp_and_bp_to_the_bottom() {
    for layout in LAYOUTS {
        let sp = TASK_STACK + 0x100;
        let mut m = Mem::default();
        // [sp] = into B; B pushed bp (= C's, 0x1234) at sp + 8 and has
        // bp = sp + 8; above: return into C, 0x30 of C's frame, return
        // into D.
        m.put(sp, run(B + 0x25))
            .put(sp + 8, 0x1234)
            .put(sp + 16, run(C + 0x40))
            .put(sp + 16 + 0x30, run(D + 0x10));
        let s = orc(layout, at_a(sp, sp + 8), &mut m, &NoFixup);
        assert_eq!(
            s,
            Stack {
                frames: vec![B + 0x25, C + 0x40, D + 0x10],
                end: StackEnd::Bottom,
                exact: 0,
            },
            "{layout:?}"
        );
    }
}

/// B's frame found from bp and bp's saved value through BP (bp_reg BP),
/// and BP_INDIRECT (a realigned stack's saved CFA).
#[test]
fn bp_based_rules() {
    for layout in LAYOUTS {
        let sp = TASK_STACK + 0x100;
        let bp = sp + 0x40;
        // B+4: CFA = bp + 16 ... here through bp_reg BP: caller's bp at
        // [bp - 0]; BP_INDIRECT: CFA = [bp - 8].
        let t = table(
            layout,
            &[
                (A, call(8)),
                (B, entry(OrcType::Call, reg::BP, 16, reg::BP, 0)),
                (
                    C,
                    entry(OrcType::Call, reg::BP_INDIRECT, -8, reg::PREV_SP, -16),
                ),
                (D, end()),
            ],
        );
        let mut m = Mem::default();
        m.put(sp, run(B + 0x25))
            .put(bp, bp + 0x100) // B's saved bp: C's
            .put(bp + 8, run(C + 0x40));
        let c_bp = bp + 0x100;
        let cfa = c_bp + 0x200;
        m.put(c_bp - 8, cfa)
            .put(cfa - 8, run(D + 0x10))
            .put(cfa - 16, 0);
        let s = orc::unwind(&t, at_a(sp, bp), &mut m, &ctx(&NoFixup));
        assert_eq!(s.frames, [B + 0x25, C + 0x40, D + 0x10], "{layout:?}");
        assert_eq!(s.end, StackEnd::Bottom);
    }
}

/// An interrupt in F: H (the handler) called A; H was called by the
/// entry code, whose REGS entry finds the full pt_regs; F is looked up
/// at the interrupted address exactly, its bp from the pt_regs.
#[test]
fn a_pt_regs_frame_from_kernel_and_from_user_mode() {
    for layout in LAYOUTS {
        for (cs, want_end) in [(0x10, StackEnd::Bottom), (0x33, StackEnd::User)] {
            let sp = TASK_STACK + 0x100;
            let regs_at = sp + 0x20; // H's frame is 0x18, then the call's slot
            let f_sp = regs_at + pt_regs::SIZE + 0x40;
            let mut m = Mem::default();
            m.put(sp, run(H + 0x15))
                .put(sp + 0x18 - 8 + 8, run(ENTRY + 0x25))
                // F was interrupted at B + 0x4 (exactly: a frame-pointer
                // rule starts there) with bp = f_bp.
                .regs(regs_at, run(B + 0x4), cs, f_sp, f_sp + 8)
                .put(f_sp + 16, run(C + 0x40))
                .put(f_sp + 8, 0x5555) // B's caller's bp
                .put(f_sp + 16 + 0x30, run(D + 0x10));
            let s = orc(layout, at_a(sp, 0x9999), &mut m, &NoFixup);
            let mut want = vec![H + 0x15, ENTRY + 0x25];
            if cs == 0x10 {
                want.extend([B + 0x4, C + 0x40, D + 0x10]);
            }
            assert_eq!(s.frames, want, "{layout:?} cs {cs:#x}");
            assert_eq!(s.end, want_end);
        }
    }
}

/// An interrupt taken right at the entry code's start: only the iret
/// frame (REGS_PARTIAL), pt_regs IRET_FRAME_OFFSET below it; bp kept.
#[test]
fn an_iret_frame() {
    for layout in LAYOUTS {
        let sp = TASK_STACK + 0x100;
        // A traced function called from the entry code (hypothetically,
        // to reach the partial rule): its return address ENTRY + 2 is
        // looked up at ENTRY + 1.
        let t = table(
            layout,
            &[
                (A, call(8)),
                (ENTRY, entry(OrcType::Call, reg::SP, 8, reg::UNDEFINED, 0)),
                (
                    ENTRY + 1,
                    entry(OrcType::RegsPartial, reg::SP, 0, reg::UNDEFINED, 0),
                ),
                (B, bp_frame()),
                (D, end()),
            ],
        );
        let iret = sp + 8;
        let f_bp = TASK_STACK + 0x800;
        let mut m = Mem::default();
        m.put(sp, run(ENTRY + 2))
            .put(iret, run(B + 0x30)) // ip
            .put(iret + 8, 0x10) // cs
            .put(iret + 24, TASK_STACK + 0x700) // sp
            .put(f_bp, 0)
            .put(f_bp + 8, run(D + 0x10));
        let s = orc::unwind(&t, at_a(sp, f_bp), &mut m, &ctx(&NoFixup));
        assert_eq!(s.frames, [ENTRY + 2, B + 0x30, D + 0x10], "{layout:?}");
        assert_eq!(s.end, StackEnd::Bottom);
    }
}

/// R10-based rules (a realigned stack's DRAP) need a full pt_regs frame.
#[test]
fn register_rules_need_full_regs() {
    for layout in LAYOUTS {
        let drap = entry(OrcType::Call, reg::R10, 0, reg::UNDEFINED, 0);
        let regs = entry(OrcType::Regs, reg::SP, 0, reg::UNDEFINED, 0);
        let t = table(
            layout,
            &[(A, call(8)), (B, drap), (ENTRY, regs), (D, end())],
        );
        let sp = TASK_STACK + 0x100;
        // Without a pt_regs frame before it: no way on.
        let mut m = Mem::default();
        m.put(sp, run(B + 0x25));
        let s = orc::unwind(&t, at_a(sp, 0), &mut m, &ctx(&NoFixup));
        assert_eq!(s.frames, [B + 0x25], "{layout:?}");
        assert_eq!(s.end, StackEnd::NoUnwindInfo);
        // Interrupted in B: R10 from the regs.
        let regs_at = sp + 8;
        let r10 = TASK_STACK + 0x900;
        let mut m = Mem::default();
        m.put(sp, run(ENTRY + 0x5))
            .regs(regs_at, run(B + 0x8), 0x10, TASK_STACK + 0x400, 0)
            .put(regs_at + pt_regs::R10, r10)
            .put(r10 - 8, run(D + 1));
        let s = orc::unwind(&t, at_a(sp, 0), &mut m, &ctx(&NoFixup));
        assert_eq!(s.frames, [ENTRY + 0x5, B + 0x8, D + 1], "{layout:?}");
        assert_eq!(s.end, StackEnd::Bottom);
    }
}

/// A called on the IRQ stack by S (call_on_irqstack): SP_INDIRECT reads
/// the task stack's sp stored at the IRQ stack's top, adds the offset;
/// the task stack lies below, which only an indirect step may do.
#[test]
fn irq_stack_switch_through_sp_indirect() {
    for layout in LAYOUTS {
        let tos = IRQ_STACK_TOP - 8;
        let old_sp = TASK_STACK + 0x200; // S's rsp before the switch
        let mut m = Mem::default();
        m.put(tos - 8, run(S + 0x25))
            .put(tos, old_sp)
            // S's frame: bp pushed at old_sp, return into C above it.
            .put(old_sp, 0x7777)
            .put(old_sp + 8, run(C + 0x40))
            .put(old_sp + 16 + 0x30 - 8, run(D + 0x10));
        let s = orc(layout, at_a(tos - 8, old_sp), &mut m, &NoFixup);
        assert_eq!(s.frames, [S + 0x25, C + 0x40, D + 0x10], "{layout:?}");
        assert_eq!(s.end, StackEnd::Bottom);
    }
}

/// A return hooked by the function graph: the slot's value is the hook;
/// the fixup gives the real return address.
#[test]
fn a_hooked_return_is_fixed_up() {
    let sp = TASK_STACK + 0x100;
    let hook = 0xffff_ffff_c000_1000; // vmtrace's, outside kernel text
    let mut m = Mem::default();
    m.put(sp, run(B + 0x25))
        .put(sp + 8, 0)
        .put(sp + 16, hook)
        .put(sp + 16 + 0x30, run(D + 0x10));
    let fixup = Hooked {
        slot: sp + 16,
        hook,
        real: run(C + 0x40),
    };
    for layout in LAYOUTS {
        let s = orc(layout, at_a(sp, sp + 8), &mut m, &fixup);
        assert_eq!(s.frames, [B + 0x25, C + 0x40, D + 0x10], "{layout:?}");
        // Not fixed up: the hook is not text.
        let s = orc(layout, at_a(sp, sp + 8), &mut m, &NoFixup);
        assert_eq!(s.frames, [B + 0x25]);
        assert_eq!(s.end, StackEnd::NotText);
    }
    let s = fp::unwind(at_a(sp, sp + 8), &mut m, &ctx(&fixup));
    assert_eq!(s.frames, [B + 0x25, C + 0x40]);
    assert_eq!(s.end, StackEnd::Bottom);
}

/// Each way an ORC unwind is cut short.
#[test]
fn orc_stacks_cut_short() {
    let sp = TASK_STACK + 0x100;
    for layout in LAYOUTS {
        let run_with = |m: &mut Mem, regs| orc(layout, regs, m, &NoFixup);
        // Unreadable: nothing at sp.
        let s = run_with(&mut Mem::default(), at_a(sp, 0));
        assert_eq!((s.frames.len(), s.end), (0, StackEnd::Unreadable));
        // NoUnwindInfo: a return address past the last real entry (an
        // UNDEFINED terminator), and one below the first entry (still
        // text).
        let mut m = Mem::default();
        m.put(sp, run(TEXT + 0x9100));
        let s = run_with(&mut m, at_a(sp, 0));
        assert_eq!(
            s,
            Stack {
                frames: vec![TEXT + 0x9100],
                end: StackEnd::NoUnwindInfo,
                exact: 0,
            }
        );
        m.put(sp, run(TEXT + 0x10));
        assert_eq!(run_with(&mut m, at_a(sp, 0)).end, StackEnd::NoUnwindInfo);
        // NotText.
        m.put(sp, run(TEXT_END));
        let s = run_with(&mut m, at_a(sp, 0));
        assert_eq!((s.frames.len(), s.end), (0, StackEnd::NotText));
        // TooDeep: R calling itself, each frame 0x10 above the last.
        let mut m = Mem::default();
        m.put(sp, run(R + 0x9));
        for i in 0..100 {
            m.put(sp + 8 + 0x10 * i + 8, run(R + 0x9));
        }
        let s = run_with(&mut m, at_a(sp, 0));
        assert_eq!(s.frames, vec![R + 0x9; MAX_FRAMES]);
        assert_eq!(s.end, StackEnd::TooDeep);
    }
    // NotMoving: a CALL entry whose CFA is not above sp.
    for off in [0, -8] {
        let t = table(OrcLayout::New, &[(A, call(off)), (D, end())]);
        let mut m = Mem::default();
        m.put(sp - 8, run(D + 1)).put(sp - 16, run(D + 1));
        let s = orc::unwind(&t, at_a(sp, 0), &mut m, &ctx(&NoFixup));
        assert_eq!((s.frames.len(), s.end), (0, StackEnd::NotMoving), "{off}");
    }
    // An entry site that has no entry at all.
    let t = table(OrcLayout::Old, &[(B, call(8))]);
    let s = orc::unwind(&t, at_a(sp, 0), &mut Mem::default(), &ctx(&NoFixup));
    assert_eq!(
        s,
        Stack {
            frames: vec![],
            end: StackEnd::NoUnwindInfo,
            exact: 0,
        }
    );
}

/// The 6.4 layout takes "signal" from the entry itself: a CALL-type
/// entry with signal set makes the next lookup exact.
#[test]
fn new_layout_signal_bit_makes_the_next_lookup_exact() {
    let mut sig = call(8);
    sig.signal = true;
    // B's entry starts exactly at the return address: exact lookup finds
    // it (end), the byte before finds C's (no info).
    let weak = entry(OrcType::Undefined, reg::UNDEFINED, 0, reg::UNDEFINED, 0);
    let sp = TASK_STACK + 0x100;
    let mut m = Mem::default();
    m.put(sp, run(B));
    // With signal, B is an exact address (looked up and named as itself).
    for (a, want, exact) in [
        (sig, StackEnd::Bottom, 1),
        (call(8), StackEnd::NoUnwindInfo, 0),
    ] {
        let t = OrcTable::new(OrcLayout::New, vec![(A, a), (B - 0x10, weak), (B, end())]);
        let s = orc::unwind(&t, at_a(sp, 0), &mut m, &ctx(&NoFixup));
        assert_eq!(
            s,
            Stack {
                frames: vec![B],
                end: want,
                exact,
            }
        );
    }
}

mod frame_pointer;
mod module;
