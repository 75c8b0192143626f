//! Each rule on hand-assembled functions at `BASE`.

use super::*;

const BASE: u64 = 0xffff_ffff_8100_0000;
/// push rbp; mov rbp,rsp; push rbx: 5 bytes, a frame-pointer prologue.
const PROLOGUE: [u8; 5] = [0x55, 0x48, 0x89, 0xe5, 0x53];
/// pop rbx; pop rbp; ret
const EPILOGUE: [u8; 3] = [0x5b, 0x5d, 0xc3];

fn func(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn analyze(code: &[u8]) -> Result<DirectSite, Refusal> {
    DirectSite::analyze_code(BASE, code, &SiteTables::default())
}

#[test]
fn a_prologue_is_displaced_whole() {
    let code = func(&[&PROLOGUE, &EPILOGUE]);
    let s = analyze(&code).unwrap();
    assert_eq!((s.addr, s.len, s.rip_relative), (BASE, 5, false));
    let text: Vec<String> = s.insns.iter().map(format_insn).collect();
    assert_eq!(text, ["push rbp", "mov rbp,rsp", "push rbx"]);
}

#[test]
fn whole_instructions_cover_at_least_five_bytes() {
    // push rbp; mov rax,[rdi+8] (4 bytes): 5; then lea rax,[rax+rax*2]
    let code = [0x55, 0x48, 0x8b, 0x47, 0x08, 0x48, 0x8d, 0x04, 0x40, 0xc3];
    assert_eq!(analyze(&code).unwrap().len, 5);
    // xor eax,eax; mov rax,[rdi+8]: 2 + 4 = 6 bytes, two instructions.
    let code = [0x31, 0xc0, 0x48, 0x8b, 0x47, 0x08, 0xc3];
    let s = analyze(&code).unwrap();
    assert_eq!((s.len, s.insns.len()), (6, 2));
}

#[test]
fn the_site_starts_after_endbr64() {
    let code = func(&[&crate::kernel::sites::ENDBR64, &PROLOGUE, &EPILOGUE]);
    let s = analyze(&code).unwrap();
    assert_eq!((s.addr, s.len, s.insns.len()), (BASE + 4, 5, 3));
    // A branch back to the ENDBR64 or to the site's first byte is fine.
    let back = [0xeb, 0x100u16.wrapping_sub(0x0b + 2) as u8]; // jmp +0
    let code = func(&[
        &crate::kernel::sites::ENDBR64,
        &PROLOGUE,
        &[0x90, 0x90],
        &back,
    ]);
    assert!(analyze(&code).is_ok());
}

#[test]
fn short_functions_are_refused() {
    assert_eq!(
        analyze(&[0x31, 0xc0, 0xc3]).unwrap_err(),
        Refusal::TooShort { len: 3 }
    );
    let code = func(&[&crate::kernel::sites::ENDBR64, &[0xc3]]);
    assert_eq!(analyze(&code).unwrap_err(), Refusal::TooShort { len: 1 });
    assert_eq!(analyze(&[]).unwrap_err(), Refusal::TooShort { len: 0 });
}

#[test]
fn bad_code_is_refused() {
    // 0x06 (push es) does not exist in 64-bit mode.
    let code = func(&[&PROLOGUE, &[0x06], &EPILOGUE]);
    assert_eq!(analyze(&code).unwrap_err(), Refusal::Undecodable { at: 5 });
    // mov rax,[rdi+8] cut after 2 of its 4 bytes.
    let code = func(&[&PROLOGUE, &[0x48, 0x8b]]);
    assert_eq!(analyze(&code).unwrap_err(), Refusal::RunsPastEnd { at: 5 });
}

#[test]
fn a_jump_into_the_displaced_bytes_is_refused() {
    // jmp from +8 to +1 (the mov): inside, past the first byte.
    let code = func(&[&PROLOGUE, &[0x90, 0x90, 0x90, 0xeb, 0xf7], &EPILOGUE]);
    assert_eq!(
        analyze(&code).unwrap_err(),
        Refusal::JumpIntoSite { from: 8, to: 1 }
    );
    // jne to +4 (push rbx), as a 6-byte jcc, and a call to +1.
    let jne = [0x0f, 0x85, 0xf9, 0xff, 0xff, 0xff];
    let code = func(&[&PROLOGUE, &jne, &EPILOGUE]);
    assert_eq!(
        analyze(&code).unwrap_err(),
        Refusal::JumpIntoSite { from: 5, to: 4 }
    );
    let call = [0xe8, 0xf7, 0xff, 0xff, 0xff];
    let code = func(&[&PROLOGUE, &call, &EPILOGUE]);
    assert_eq!(
        analyze(&code).unwrap_err(),
        Refusal::JumpIntoSite { from: 5, to: 1 }
    );
    // To +5, just past them: fine.
    let code = func(&[&PROLOGUE, &[0x90, 0x90, 0x90, 0xeb, 0xfb], &EPILOGUE]);
    assert!(analyze(&code).is_ok());
}

#[test]
fn indirect_jumps_are_refused() {
    // jmp [table+rax*8] (notrack, as jump tables under IBT), and jmp rax.
    let table = [0x3e, 0xff, 0x24, 0xc5, 0x00, 0x10, 0x00, 0x81];
    let code = func(&[&PROLOGUE, &table, &EPILOGUE]);
    assert_eq!(analyze(&code).unwrap_err(), Refusal::IndirectJump { at: 5 });
    let code = func(&[&PROLOGUE, &EPILOGUE[..2], &[0xff, 0xe0]]);
    assert_eq!(analyze(&code).unwrap_err(), Refusal::IndirectJump { at: 7 });
    // call rax is no jump.
    let code = func(&[&PROLOGUE, &[0xff, 0xd0], &EPILOGUE]);
    assert!(analyze(&code).is_ok());
}

#[test]
fn a_jump_to_a_retpoline_thunk_is_an_indirect_jump() {
    let thunk = BASE + 0x1000;
    let mut tables = SiteTables::default();
    tables.indirect_thunks.push((thunk, thunk + 0x20));
    // jmp rel32 to the thunk at +5; a call to it is fine.
    let rel = |at: u64| ((thunk - (BASE + at + 5)) as u32).to_le_bytes();
    let code = func(&[&PROLOGUE, &[0xe9], &rel(5)]);
    assert_eq!(
        DirectSite::analyze_code(BASE, &code, &tables).unwrap_err(),
        Refusal::IndirectJump { at: 5 }
    );
    let code = func(&[&PROLOGUE, &[0xe8], &rel(5), &EPILOGUE]);
    assert!(DirectSite::analyze_code(BASE, &code, &tables).is_ok());
}

#[test]
fn displaced_branches_must_leave_the_displaced_bytes() {
    // jmp rel32 to elsewhere first (a tail call): relocatable.
    let code = [0xe9, 0x00, 0x10, 0x00, 0x00];
    let s = analyze(&code).unwrap();
    assert_eq!((s.len, s.insns[0].near_branch_target()), (5, BASE + 0x1005));
    // je +4 among the displaced bytes, landing in them: refused as such
    // (before the jump-into rule).
    let code = [0x85, 0xff, 0x74, 0x00, 0x48, 0x8b, 0x47, 0x08, 0xc3];
    assert_eq!(
        analyze(&code).unwrap_err(),
        Refusal::Unrelocatable {
            at: 2,
            insn: "je short 0FFFFFFFF81000004h".into()
        }
    );
    // test edi,edi; jne out (to the ret): fine.
    let code = [0x85, 0xff, 0x75, 0x04, 0x48, 0x8b, 0x47, 0x08, 0xc3];
    assert!(analyze(&code).is_ok());
}

#[test]
fn loops_traps_and_interrupts_are_not_relocated() {
    for (code, insn) in [
        (&[0xe2, 0x04][..], "loop 0FFFFFFFF81000006h"),
        (&[0xe3, 0x04][..], "jrcxz 0FFFFFFFF81000006h"),
        (&[0x0f, 0x0b][..], "ud2"),
        (&[0xcc][..], "int3"),
        (&[0x0f, 0x05][..], "syscall"),
    ] {
        let code = func(&[code, &[0x48, 0x8b, 0x47, 0x08, 0x90, 0x90, 0xc3]]);
        assert_eq!(
            analyze(&code).unwrap_err(),
            Refusal::Unrelocatable {
                at: 0,
                insn: insn.into()
            },
            "{insn}"
        );
    }
}

#[test]
fn rip_relative_operands_are_kept_for_rebasing() {
    // mov rax,[rip+0x100]; ret
    let code = [0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, 0xc3];
    let s = analyze(&code).unwrap();
    assert_eq!((s.len, s.rip_relative), (7, true));
    assert_eq!(s.insns[0].ip_rel_memory_address(), BASE + 7 + 0x100);
}

#[test]
fn a_table_site_in_the_displaced_bytes_is_refused() {
    let code = func(&[&PROLOGUE, &EPILOGUE]);
    for table in [
        KernelTable::ExTable,
        KernelTable::Alternative,
        KernelTable::JumpLabel,
        KernelTable::StaticCall,
        KernelTable::Retpoline,
        KernelTable::ReturnThunk,
        KernelTable::Ftrace,
    ] {
        let mut tables = SiteTables::default();
        tables.insert(table, BASE + 4, 1);
        assert_eq!(
            DirectSite::analyze_code(BASE, &code, &tables).unwrap_err(),
            Refusal::Overlaps { table, at: 4 }
        );
        // Just past the displaced bytes, or before them: fine.
        let mut tables = SiteTables::default();
        tables.insert(table, BASE + 5, 1);
        tables.insert(table, BASE - 8, 8);
        assert!(DirectSite::analyze_code(BASE, &code, &tables).is_ok());
    }
    // An alternative that starts before the site and reaches into it.
    let mut tables = SiteTables::default();
    tables.insert(KernelTable::Alternative, BASE - 2, 3);
    assert_eq!(
        DirectSite::analyze_code(BASE, &code, &tables).unwrap_err(),
        Refusal::Overlaps {
            table: KernelTable::Alternative,
            at: 2u64.wrapping_neg()
        }
    );
}

#[test]
fn refusals_say_their_rule() {
    let r = Refusal::Overlaps {
        table: KernelTable::ExTable,
        at: 3,
    };
    assert_eq!(
        r.to_string(),
        "exception-table entry at +0x3 in the displaced bytes"
    );
    assert_eq!(r.rule(), "ex-table");
    let r = Refusal::JumpIntoSite { from: 0x10, to: 2 };
    assert_eq!(
        r.to_string(),
        "the branch at +0x10 lands at +0x2, inside the displaced bytes"
    );
    assert_eq!(
        Refusal::TooShort { len: 3 }.to_string(),
        "too short: 3 bytes of instructions, the jump needs 5"
    );
    assert_eq!(Refusal::EntryText.to_string(), "in entry text");
}

#[test]
fn the_summary_counts_by_rule() {
    let mut s = Summary {
        functions: 10,
        safe: 6,
        rip_relative: 1,
        ..Summary::default()
    };
    s.refused.insert("too-short", 1);
    s.refused.insert("ftrace-site", 3);
    assert_eq!(
        s.to_string(),
        "10 functions: 6 direct sites safe (1 with RIP-relative operands), 4 refused: \
         ftrace-site 3, too-short 1"
    );
}

#[test]
fn an_ftrace_site_first_is_displaced_alone_as_a_nop() {
    // `call __fentry__` (the file's form of the site), then the prologue.
    let call = [0xe8, 0, 0, 0, 0];
    let code = func(&[&call, &PROLOGUE, &EPILOGUE]);
    let mut tables = SiteTables::default();
    tables.insert(KernelTable::Ftrace, BASE, 5);
    let site = DirectSite::analyze_code(BASE, &code, &tables).unwrap();
    assert!(site.ftrace_nop);
    assert_eq!((site.addr, site.len), (BASE, 5));
    assert!(site.insns.is_empty(), "nothing to run in its place");
    // After ENDBR64 too; an ftrace site further in is still refused.
    let code = func(&[&crate::kernel::sites::ENDBR64, &call, &EPILOGUE]);
    let mut tables = SiteTables::default();
    tables.insert(KernelTable::Ftrace, BASE + 4, 5);
    let site = DirectSite::analyze_code(BASE, &code, &tables).unwrap();
    assert!(site.ftrace_nop);
    assert_eq!(site.addr, BASE + 4);
    let code = func(&[&PROLOGUE, &EPILOGUE]);
    let mut tables = SiteTables::default();
    tables.insert(KernelTable::Ftrace, BASE + 1, 5);
    assert_eq!(
        DirectSite::analyze_code(BASE, &code, &tables).unwrap_err(),
        Refusal::Overlaps {
            table: KernelTable::Ftrace,
            at: 1
        }
    );
}

#[test]
fn a_target_out_of_the_stubs_reach_is_refused() {
    // mov rax, [rip + disp32] reaching below the kernel's top 2 GiB.
    let low = 0xffff_ffff_7000_0000u64;
    let disp = (low.wrapping_sub(BASE + 7) as i64) as i32;
    let d = disp.to_le_bytes();
    let code = func(&[&[0x48, 0x8b, 0x05, d[0], d[1], d[2], d[3]], &EPILOGUE]);
    let r = DirectSite::analyze_code(BASE, &code, &SiteTables::default()).unwrap_err();
    assert_eq!(r, Refusal::OutOfReach { at: 0, target: low });
    assert_eq!(r.rule(), "out-of-reach");
}

#[test]
fn a_displaced_call_must_be_the_last() {
    // call [rdi] (2 bytes), then mov rax,[rdi+8]: the call's return
    // address, +2, would be inside the jump.
    let code = [0xff, 0x17, 0x48, 0x8b, 0x47, 0x08, 0xc3];
    assert_eq!(analyze(&code).unwrap_err(), Refusal::CallNotLast { at: 0 });
    // push rbp; call rel32: the call last, its return address past them.
    let code = func(&[&[0x55, 0xe8, 0, 0x10, 0, 0], &EPILOGUE]);
    assert!(analyze(&code).is_ok());
    // syscall is no call (iced's flow control counts it as one).
    let code = func(&[&[0x0f, 0x05], &PROLOGUE, &EPILOGUE]);
    assert!(matches!(
        analyze(&code).unwrap_err(),
        Refusal::Unrelocatable { at: 0, .. }
    ));
}

#[test]
fn low_targets_are_reached_by_wrapping() {
    // gs: mov rax, [rip + disp32] (8 bytes) reaching `target`.
    let load = |target: u64| {
        let d = (target.wrapping_sub(BASE + 8) as u32).to_le_bytes();
        func(&[&[0x65, 0x48, 0x8b, 0x05, d[0], d[1], d[2], d[3]], &EPILOGUE])
    };
    // A per-CPU variable's offset: reached from the top 8 MiB past 0.
    assert!(analyze(&load(0x1abc0)).unwrap().rip_relative);
    // 2 GiB - 8 MiB and above: not from the lowest stub (kernel text
    // cannot reach that far either); below the top 2 GiB, neither.
    let far = 0x7f80_0000;
    assert!(stub_reaches(far - 1) && !stub_reaches(far));
    assert!(stub_reaches(STUB_REACH) && !stub_reaches(STUB_REACH - 1));
}
