//! A loaded module's ORC entries added to the kernel's
//! (`OrcTable::with_entries`, as `Unwinder::for_image` adds each module's
//! read from the guest): a stack through a module's functions into the
//! kernel's.

use super::*;
use crate::kernel::unwind::orc_table::ModuleTable;

/// A module's text above the kernel's (link addresses), its traced
/// function M1 called by M2, called by the kernel's C.
const MODULE: u64 = TEXT_END + 0x1000_0000;
const MODULE_END: u64 = MODULE + 0x1000;
const M1: u64 = MODULE + 0x100;
const M2: u64 = MODULE + 0x200;

/// The module's entries as read from its `struct module` (raw bytes).
fn module_entries(layout: OrcLayout) -> Vec<(u64, [u8; 6])> {
    let weak = entry(OrcType::Undefined, reg::UNDEFINED, 0, reg::UNDEFINED, 0);
    [
        (M1, call(8)),
        (M1 + 1, call(16)),
        (M2, call(8)),
        (M2 + 4, call(0x20)),
        (MODULE_END, weak),
    ]
    .iter()
    .map(|(ip, e)| (*ip, encode(layout, e)))
    .collect()
}

/// A task's stack stopped in the module at M1: [sp] into M2, M2's
/// 0x20-byte frame, its return into C, C's 0x30, its return into D (the
/// bottom); and the registers there.
fn stack_through_module() -> (Mem, EntryRegs) {
    let sp = TASK_STACK + 0x100;
    let mut m = Mem::default();
    m.put(sp, run(M2 + 0x10))
        .put(sp + 0x20, run(C + 0x40))
        .put(sp + 0x20 + 0x30, run(D + 0x10));
    let regs = EntryRegs {
        ip: run(M1),
        sp,
        bp: 0,
    };
    (m, regs)
}

#[test]
fn a_stack_unwinds_through_a_modules_frames_into_the_kernel() {
    let text = [(TEXT, TEXT_END), (MODULE, MODULE_END)];
    let ctx = UnwindCtx {
        slide: SLIDE,
        text: &text,
        fixup: &NoFixup,
        modules: &[],
    };
    for layout in LAYOUTS {
        let (mut m, regs) = stack_through_module();
        let with = kernel(layout).with_entries(module_entries(layout));
        assert_eq!(with.len(), kernel(layout).len() + 5);
        assert_eq!(
            orc::unwind(&with, regs, &mut m, &ctx),
            Stack {
                frames: vec![M2 + 0x10, C + 0x40, D + 0x10],
                end: StackEnd::Bottom,
                exact: 0,
            },
            "{layout:?}"
        );
        // Without them the module's addresses fall under the kernel's last
        // entry (a terminator): no stack at all.
        let without = orc::unwind(&kernel(layout), regs, &mut m, &ctx);
        assert_eq!(without.end, StackEnd::NoUnwindInfo, "{layout:?}");
        assert!(without.frames.is_empty(), "{without:?}");
    }
}

/// A module first loaded during the trace: its entries apart from the
/// kernel's table (`UnwindCtx::modules`), its text kernel text with them.
#[test]
fn a_stack_unwinds_through_a_module_loaded_after_the_table_was_made() {
    let text = [(TEXT, TEXT_END)];
    for layout in LAYOUTS {
        let (mut m, regs) = stack_through_module();
        let modules = [ModuleTable::new(
            (MODULE, MODULE_END),
            layout,
            module_entries(layout),
        )];
        let ctx = |modules| UnwindCtx {
            slide: SLIDE,
            text: &text,
            fixup: &NoFixup,
            modules,
        };
        assert_eq!(
            orc::unwind(&kernel(layout), regs, &mut m, &ctx(&modules)),
            Stack {
                frames: vec![M2 + 0x10, C + 0x40, D + 0x10],
                end: StackEnd::Bottom,
                exact: 0,
            },
            "{layout:?}"
        );
        // Gone (unloaded): its addresses are no kernel text's again.
        let gone = orc::unwind(&kernel(layout), regs, &mut m, &ctx(&[]));
        assert!(gone.frames.is_empty(), "{gone:?}");
    }
}
