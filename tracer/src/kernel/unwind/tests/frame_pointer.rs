//! The frame-pointer unwinder (`unwind::fp`) on constructed stacks.

use super::*;

/// The frame-pointer chain: [sp], then [bp + 8] up the chain, to bp 0.
#[test]
fn fp_chain_to_the_bottom_and_through_pt_regs() {
    let sp = TASK_STACK + 0x100;
    let mut m = Mem::default();
    let (b1, b2) = (sp + 0x20, sp + 0x80);
    m.put(sp, run(B + 0x25))
        .put(b1, b2)
        .put(b1 + 8, run(C + 0x40))
        .put(b2, 0)
        .put(b2 + 8, run(D + 0x10));
    let s = fp::unwind(at_a(sp, b1), &mut m, &ctx(&NoFixup));
    assert_eq!(
        s,
        Stack {
            frames: vec![B + 0x25, C + 0x40, D + 0x10],
            end: StackEnd::Bottom,
            exact: 0,
        }
    );

    // An encoded pt_regs pointer (bit 0): the interrupted ip, then its bp.
    for (cs, want) in [(0x10, StackEnd::Bottom), (0x2b, StackEnd::User)] {
        let regs_at = sp + 0x40;
        let f_bp = regs_at + pt_regs::SIZE + 0x20;
        let mut m = Mem::default();
        m.put(sp, run(H + 0x15))
            .put(b1, regs_at | 1)
            .put(b1 + 8, run(ENTRY + 0x25))
            .regs(regs_at, run(B + 0x31), cs, f_bp - 0x10, f_bp)
            .put(f_bp, 0)
            .put(f_bp + 8, run(D + 0x10));
        let s = fp::unwind(at_a(sp, b1), &mut m, &ctx(&NoFixup));
        let mut frames = vec![H + 0x15, ENTRY + 0x25];
        let mut exact = 0;
        if want == StackEnd::Bottom {
            frames.extend([B + 0x31, D + 0x10]);
            // B + 0x31, the interrupted ip, is frame 2.
            exact = 1 << 2;
        }
        assert_eq!(
            s,
            Stack {
                frames,
                end: want,
                exact
            },
            "cs {cs:#x}"
        );
    }
}

/// Each way a frame-pointer unwind is cut short; and a far jump (the IRQ
/// stack's first frame to the task stack below) is a stack switch.
#[test]
fn fp_stacks_cut_short() {
    let sp = IRQ_STACK_TOP - 0x100;
    let fp_run = |m: &mut Mem, bp| fp::unwind(at_a(sp, bp), m, &ctx(&NoFixup));
    let s = fp_run(&mut Mem::default(), 0);
    assert_eq!(
        s,
        Stack {
            frames: vec![],
            end: StackEnd::Unreadable,
            exact: 0,
        }
    );
    let mut m = Mem::default();
    m.put(sp, run(B + 1));
    // bp at or below the return address slot, close by: a loop.
    for bp in [sp, sp - 0x100] {
        assert_eq!(
            fp_run(&mut m, bp),
            Stack {
                frames: vec![B + 1],
                end: StackEnd::NotMoving,
                exact: 0,
            }
        );
    }
    // Unreadable frame.
    assert_eq!(fp_run(&mut m, sp + 0x10).end, StackEnd::Unreadable);
    // Far below: the task stack.
    let task_bp = TASK_STACK + 0x100;
    m.put(task_bp, 0).put(task_bp + 8, run(C + 2));
    assert_eq!(
        fp_run(&mut m, task_bp),
        Stack {
            frames: vec![B + 1, C + 2],
            end: StackEnd::Bottom,
            exact: 0,
        }
    );
    // A frame pointing at itself again.
    m.put(task_bp, task_bp);
    assert_eq!(fp_run(&mut m, task_bp).end, StackEnd::NotMoving);
    // NotText.
    m.put(task_bp, 0).put(task_bp + 8, 0x1000);
    assert_eq!(
        fp_run(&mut m, task_bp),
        Stack {
            frames: vec![B + 1],
            end: StackEnd::NotText,
            exact: 0,
        }
    );
    // TooDeep: a chain 65 frames long.
    let mut m = Mem::default();
    m.put(sp, run(B + 1));
    for i in 0..70 {
        let bp = sp + 0x10 + 0x10 * i;
        m.put(bp, bp + 0x10).put(bp + 8, run(R + 9));
    }
    let s = fp_run(&mut m, sp + 0x10);
    assert_eq!((s.frames.len(), s.end), (MAX_FRAMES, StackEnd::TooDeep));
}

/// for_image says which unwinder and why.
#[test]
fn without_orc_tables_frame_pointers_with_the_reason() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/mini.elf");
    if !path.is_file() {
        eprintln!(
            "SKIPPED: {} is not built; run `bash guest/build.sh mini`",
            path.display()
        );
        return;
    }
    let image = crate::kernel::symbols::KernelImage::load(&path).unwrap();
    let (u, note) = Unwinder::for_image(&image, None);
    assert!(matches!(u, Unwinder::FramePointer));
    assert_eq!(
        note,
        format!(
            "frame pointers ({} has no ORC tables (.orc_unwind_ip, .orc_unwind): the kernel was \
             not built with CONFIG_UNWINDER_ORC=y)",
            path.display()
        )
    );
}
