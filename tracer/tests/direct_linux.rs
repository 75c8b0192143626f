//! Direct entry analysis (issue 26) on real images: the 6.1 guest's
//! vmlinux (its tables, safe functions and functions refused by each rule,
//! checked against objdump's reading of the same bytes) and the mini guest
//! built without ftrace (one table entry, direct.S's: its code decides). An image not
//! built is skipped with a message, as elsewhere. The summaries by rule
//! are printed (run with --nocapture to see them).

use std::path::{Path, PathBuf};
use std::process::Command;

use tracer::kernel::direct::{DirectSite, KernelTable, Refusal, SiteTables, Summary};
use tracer::kernel::symbols::KernelImage;

const TABLES: [KernelTable; 7] = [
    KernelTable::ExTable,
    KernelTable::Alternative,
    KernelTable::JumpLabel,
    KernelTable::StaticCall,
    KernelTable::Retpoline,
    KernelTable::ReturnThunk,
    KernelTable::Ftrace,
];

fn built(file: &str, build: &str) -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../guest/out")
        .join(file);
    if p.is_file() {
        Some(p)
    } else {
        eprintln!(
            "SKIPPED: {} is not built; run `bash guest/build.sh {build}`",
            p.display()
        );
        None
    }
}

fn index(image: &KernelImage, name: &str) -> usize {
    image
        .functions
        .iter()
        .position(|f| f.name == name)
        .unwrap_or_else(|| panic!("no function {name} in {}", image.path.display()))
}

fn site(image: &KernelImage, tables: &SiteTables, name: &str) -> Result<DirectSite, Refusal> {
    DirectSite::analyze(image, tables, index(image, name))
}

/// `(address, text)` of each instruction objdump decodes in `start..end`.
fn objdump(path: &Path, start: u64, end: u64) -> Vec<(u64, String)> {
    let out = Command::new("objdump")
        .args(["-d", "-M", "intel", "--no-show-raw-insn"])
        .arg(format!("--start-address={start:#x}"))
        .arg(format!("--stop-address={end:#x}"))
        .arg(path)
        .output()
        .expect("objdump (binutils) must be installed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (addr, text) = l.trim_start().split_once(":\t")?;
            Some((u64::from_str_radix(addr, 16).ok()?, text.trim().to_string()))
        })
        .collect()
}

/// A safe site's displaced instructions are objdump's first instructions
/// of the function (after ENDBR64), whole, reaching `len`.
fn assert_displaced_as_objdump(path: &Path, image: &KernelImage, name: &str, s: &DirectSite) {
    let f = &image.functions[index(image, name)];
    assert!(s.addr == f.addr || s.addr == f.addr + 4, "{name}");
    let theirs = objdump(path, s.addr, s.addr + s.len as u64);
    let ours: Vec<u64> = s.insns.iter().map(|i| i.ip()).collect();
    let their_addrs: Vec<u64> = theirs.iter().map(|t| t.0).collect();
    assert_eq!(ours, their_addrs, "{name}: {theirs:?}");
    assert!(
        s.len >= 5 && s.len - s.insns.last().unwrap().len() < 5,
        "{name}"
    );
}

#[test]
fn linux_6_1() {
    let Some(path) = built("vmlinux", "linux") else {
        return;
    };
    let image = KernelImage::load(&path).unwrap();
    let tables = SiteTables::read(&image).unwrap();
    for t in TABLES {
        eprintln!("{} table: {} sites", t.site(), tables.count(t));
    }
    // The default 6.1 guest: no retpolines, no jump labels; the others
    // as their sections' sizes say (12-byte ex_table and 6.1 alt_instr).
    let len = |a: &str, b: &str| image.symbol(b).unwrap().addr - image.symbol(a).unwrap().addr;
    let ex = len("__start___ex_table", "__stop___ex_table") / 12;
    let alt = len("__alt_instructions", "__alt_instructions_end") / 12;
    let sc = len("__start_static_call_sites", "__stop_static_call_sites") / 8;
    assert!(ex > 100 && alt > 100 && sc > 10, "{ex} {alt} {sc}");
    assert_eq!(tables.count(KernelTable::ExTable), ex as usize);
    assert_eq!(tables.count(KernelTable::Alternative), alt as usize);
    assert_eq!(tables.count(KernelTable::StaticCall), sc as usize);
    assert_eq!(tables.count(KernelTable::Ftrace), image.mcount_loc.len());
    assert!(tables.entry_text.is_some() && tables.noinstr_text.is_some());

    let summary = Summary::of(&image, &tables);
    eprintln!("6.1: {summary}");
    let refused: usize = summary.refused.values().sum();
    assert_eq!(summary.safe + refused, image.functions.len());
    for rule in [
        "indirect-jump",
        "entry-text",
        "noinstr-text",
        "ex-table",
        "alternative",
    ] {
        assert!(
            summary.refused.get(rule).is_some_and(|&n| n > 0),
            "{rule}: {summary}"
        );
    }
    let mut no_ftrace = tables.clone();
    no_ftrace.remove(KernelTable::Ftrace);
    let all = Summary::of(&image, &no_ftrace);
    eprintln!("6.1 without its ftrace sites: {all}");
    assert!(!all.refused.contains_key("ftrace-site"));
    // Every ftrace site is its function's first instruction: displaced
    // alone, as the NOP the kernel makes of it. So no function is refused
    // for one, and every function with a site is safe for a direct entry
    // unless another rule refuses it.
    assert!(!summary.refused.contains_key("ftrace-site"), "{summary}");
    assert!(summary.safe + 200 > all.safe, "{summary} / {all}");

    // A traced function: its ftrace site alone is displaced, run as the
    // NOP it is; with ftrace's sites set aside, that `call __fentry__`
    // alone is, to be relocated.
    let s = site(&image, &tables, "hrtimer_active").unwrap();
    assert!(s.ftrace_nop && s.insns.is_empty());
    assert_eq!(
        (s.addr, s.len),
        (image.symbol("hrtimer_active").unwrap().addr, 5)
    );
    let s = site(&image, &no_ftrace, "hrtimer_active").unwrap();
    assert_eq!((s.len, s.insns.len(), s.rip_relative), (5, 1, false));
    let fentry = image.symbol("__fentry__").unwrap().addr;
    assert_eq!(s.insns[0].near_branch_target(), fentry);
    assert_displaced_as_objdump(&path, &image, "hrtimer_active", &s);
    // Inline functions are notrace: no ftrace site, a direct site.
    for name in ["hrtimer_forward_now", "perf_trace_initcall_level"] {
        let s = site(&image, &tables, name).unwrap();
        assert_displaced_as_objdump(&path, &image, name, &s);
    }

    // A switch's jump table (objdump: `jmp QWORD PTR [rax*8-...]`).
    let f = &image.functions[index(&image, "nmi_perfctr_msr_to_bit")];
    let Err(Refusal::IndirectJump { at }) = site(&image, &tables, &f.name) else {
        panic!(
            "nmi_perfctr_msr_to_bit: {:?}",
            site(&image, &tables, &f.name)
        );
    };
    let insn = objdump(&path, f.addr + at, f.addr + at + 15);
    assert!(insn[0].1.starts_with("jmp    QWORD PTR [rax*8"), "{insn:?}");
    // rdtsc_ordered()'s alternative (`lfence; rdtsc` / `rdtscp`) first.
    assert_eq!(
        site(&image, &tables, "read_tsc").unwrap_err(),
        Refusal::Overlaps {
            table: KernelTable::Alternative,
            at: 0
        }
    );
    for (name, why) in [
        ("asm_sysvec_apic_timer_interrupt", Refusal::EntryText),
        ("entry_SYSCALL_64", Refusal::EntryText),
        ("do_syscall_64", Refusal::NoinstrText),
    ] {
        assert_eq!(site(&image, &tables, name).unwrap_err(), why, "{name}");
    }
}

#[test]
fn mini_without_ftrace() {
    let Some(path) = built("mini-noftrace.elf", "mini-noftrace") else {
        return;
    };
    assert!(KernelImage::load(&path).is_err(), "it has no ftrace sites");
    let image = KernelImage::load_without_sites(&path).unwrap();
    assert!(image.mcount_loc.is_empty());
    let tables = SiteTables::read(&image).unwrap();
    // One table entry: direct.S's direct_extable (tests/direct_mini.rs).
    for t in TABLES {
        let n = usize::from(t == KernelTable::ExTable);
        assert_eq!(tables.count(t), n, "{t:?}");
    }
    assert_eq!((tables.entry_text, tables.noinstr_text), (None, None));
    let summary = Summary::of(&image, &tables);
    eprintln!("mini-noftrace: {summary}");
    let refused: usize = summary.refused.values().sum();
    assert_eq!(summary.safe + refused, image.functions.len());
    assert!(summary.safe > 40, "{summary}");
    // direct.S's crafted refusals are the only ones of their rules.
    for rule in ["ex-table", "jump-into-site"] {
        assert_eq!(summary.refused.get(rule), Some(&1), "{rule}: {summary}");
    }
    for name in [
        "hrtimer_try_to_cancel",
        "schedule",
        "__hrtimer_run_queues",
        "graph_migrate_finish",
    ] {
        let s = site(&image, &tables, name).unwrap();
        assert_displaced_as_objdump(&path, &image, name, &s);
    }
    // halt_forever is `cli; hlt; jmp halt_forever`: 4 bytes.
    assert_eq!(
        site(&image, &tables, "halt_forever").unwrap_err(),
        Refusal::TooShort { len: 4 }
    );
    // mini_main's switches are jump tables (objdump: `jmp QWORD PTR
    // [rsi*8-...]`, the register as gcc chose it); the first is refused.
    let f = &image.functions[index(&image, "mini_main")];
    let Err(Refusal::IndirectJump { at }) = site(&image, &tables, "mini_main") else {
        panic!("mini_main: {:?}", site(&image, &tables, "mini_main"));
    };
    let insn = objdump(&path, f.addr + at, f.addr + at + 15);
    let jmp = &insn[0].1;
    assert!(
        jmp.starts_with("jmp    QWORD PTR [r") && jmp.contains("*8-0x"),
        "{insn:?}"
    );
}
