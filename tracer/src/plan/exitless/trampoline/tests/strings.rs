//! An event's strings that do not last past it, copied into its record at
//! the event (`strcopy::emit_strings`), run in the emulator of
//! `trampoline`'s tests, in each shape: per-site bodies, the shared body
//! (a site's own entry path) and the function graph's entry (likewise).

use super::*;
use crate::kernel::events::fields::{EventFormat, FieldValue};

/// Site 0 is `task_rename(task, comm)`, site 1 `sched_process_exec(p,
/// old_pid, bprm)`, site 2 a function of no event: sites 0 and 1 copy the
/// names and the file name into the record, each register kept; a pointer
/// to nothing reads unread, a file name past the bound is cut and marked;
/// a copying site's path is a plain site's and the instructions
/// `strcopy::path_instructions` says (plus r11's save in a shared entry,
/// and one emulated step per kernel call).
#[test]
fn emulated_events_copy_their_strings_into_the_record() {
    let off = field_offsets();
    let rename = event(
        "task_rename",
        &[("struct task_struct *", "task"), ("const char *", "comm")],
    );
    let exec = event(
        "sched_process_exec",
        &[
            ("struct task_struct *", "p"),
            ("pid_t", "old_pid"),
            ("struct linux_binprm *", "bprm"),
        ],
    );
    let copies: std::sync::Arc<[Vec<StrCopy>]> = vec![
        strcopy::copies(&rename, &off),
        strcopy::copies(&exec, &off),
        Vec::new(),
    ]
    .into();
    assert_eq!((copies[0].len(), copies[1].len()), (2, 1));
    for (shape, graph) in [
        (Shape::PerSite, false),
        (Shape::Shared, false),
        (Shape::Shared, true),
    ] {
        let mut s = with_task(spec(1, 3, 8), &[]);
        s.layout = RingLayout::with_kind(1, 3, Some(8), graph, RecordKind::Strings).unwrap();
        s.copies = Some(copies.clone());
        s.copy_fns = Some(CopyFns {
            strncpy: STRNCPY_VA,
            copy: COPY_VA,
        });
        let t = generate_shaped(&s, shape).unwrap();
        if shape == Shape::PerSite {
            let base = COMMON_PATH_INSTRUCTIONS + TASK_INSTRUCTIONS + ARGS_INSTRUCTIONS;
            for k in 0..2 {
                let want = base + strcopy::path_instructions(&copies[k]);
                assert_eq!(t.site_path(k).unwrap().len(), want, "site {k}");
            }
        }
        copy_each_way(&t, &s, &copies, [&rename, &exec], shape, graph);
    }
}

/// Runs `t`'s three sites (see the test) and checks what each copied.
fn copy_each_way(
    t: &Trampoline,
    s: &TrampolineSpec,
    copies: &[Vec<StrCopy>],
    [rename, exec]: [&EventFormat; 2],
    shape: Shape,
    graph: bool,
) {
    let off = field_offsets();
    let how = format!("{shape:?}, graph {graph}");
    let mem = memory(&[0]);
    ring::init_rings(&mem, &s.layout).unwrap();
    run_task(&mem, 0, 77);
    let [task, name, bprm, file] = strings_in(&mem);
    let mut emu = Emu {
        mem: &mem,
        code: &t.code,
        tsc: 5,
    };
    let mut reader = RingReader::new(s.layout);
    let mut run = |site: u32, args: [u64; 3]| {
        let mut r = regs(0);
        // RSI, RDX, RCX: the event's arguments after __data.
        (r.gpr[6], r.gpr[2], r.gpr[1]) = (args[0], args[1], args[2]);
        let before = r.clone();
        let steps = emu.call(&mut r, site, PARENT, t, &mut no_interrupt);
        for reg in (0..16).filter(|&g| g != R10 && g != R11) {
            assert_eq!(r.gpr[reg], before.gpr[reg], "{how}: register {reg} changed");
        }
        let got = drain(&mut reader, &emu.mem.clone());
        assert_eq!(got.len(), 1, "{how}");
        (got[0].1.strings.expect("strings"), steps)
    };
    let values = |format, area: &[u8; strcopy::STRINGS_LEN]| {
        let mut v = vec![FieldValue::Unread; 4];
        strcopy::fill(format, &off, area, &mut v);
        v
    };
    let str = |v: &str| FieldValue::Str(v.into());
    // A plain site's path, then each copying site's beside it: its copies'
    // instructions, r11 kept in a shared entry, and the emulator's one step
    // per kernel call.
    let (_, plain) = run(2, [task, name, 0]);
    let extra = |k: usize| {
        let calls: usize = copies[k].iter().map(StrCopy::calls).sum();
        let r11 = match shape {
            Shape::PerSite => 0,
            Shape::Shared => strcopy::R11_SAVE_INSTRUCTIONS,
        };
        strcopy::path_instructions(&copies[k]) + r11 + calls
    };
    // task_rename: oldcomm (field 1) and newcomm (field 2), cut to a comm
    // as ftrace's strscpy cuts it, unmarked.
    let (area, steps) = run(0, [task, name, 0]);
    assert_eq!(steps, plain + extra(0), "{how}");
    let v = values(rename, &area);
    assert_eq!(v[1..3], [str("wl-worker"), str("wl-child-with-a")], "{how}");
    // A name at no mapped address: unread, never a fault.
    let (area, _) = run(0, [task, 0xffff_8000_dead_0000, 0]);
    assert_eq!(
        values(rename, &area)[1..3],
        [str("wl-worker"), FieldValue::Unread],
        "{how}"
    );
    // sched_process_exec: bprm->filename, then the name.
    let (area, steps) = run(1, [task, 42, bprm]);
    assert_eq!(steps, plain + extra(1), "{how}");
    assert_eq!(values(exec, &area)[0], str("/init"), "{how}");
    // A name longer than the bound: cut and marked.
    let long = "/a".repeat(100);
    mem.write_slice(format!("{long}\0").as_bytes(), GuestAddress(file))
        .unwrap();
    let (area, _) = run(1, [task, 42, bprm]);
    let bound = copies[1][0].bound as usize;
    let cut = format!("{}{}", &long[..bound - 1], strcopy::TRUNCATED);
    assert_eq!(values(exec, &area)[0], str(&cut), "{how}");
    // A bprm whose pointer cannot be read: unread.
    let (area, _) = run(1, [task, 42, 0xffff_8000_dead_0000]);
    assert_eq!(values(exec, &area)[0], FieldValue::Unread, "{how}");
}

/// A task named `wl-worker`, a long new name, and a `linux_binprm` whose
/// file name is `/init`, in `mem`: their addresses.
fn strings_in(mem: &GuestMemoryMmap) -> [u64; 4] {
    let (task, name, bprm, file) = (0x9_0000u64, 0x9_1000u64, 0x9_2000u64, 0x9_3000u64);
    mem.write_slice(b"wl-worker\0", GuestAddress(task + 0x10))
        .unwrap();
    mem.write_slice(b"wl-child-with-a-long-name\0", GuestAddress(name))
        .unwrap();
    mem.write_obj(file, GuestAddress(bprm + 0x40)).unwrap();
    mem.write_slice(b"/init\0", GuestAddress(file)).unwrap();
    [task, name, bprm, file]
}
