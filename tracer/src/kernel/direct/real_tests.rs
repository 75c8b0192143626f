//! Issue 35's entry rules on real images, each read once per test binary:
//! the 6.1 guest (guest/out/vmlinux, symbols), its build without ftrace
//! (guest/out/linux-noftrace/vmlinux) and Debian's 6.1 and 6.12 cloud
//! kernels (bzImages alone: kallsyms). An image not built is skipped with
//! a message, as elsewhere.

use std::path::PathBuf;
use std::sync::OnceLock;

use super::*;
use crate::session::direct::stub::{self, Head};

/// An image with its tables, or None when it is not built.
type Loaded = Option<(KernelImage, SiteTables)>;

fn out(rel: &str, build: &str) -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../guest/out")
        .join(rel);
    if p.is_file() {
        return Some(p);
    }
    eprintln!(
        "SKIPPED: {} is not built; run `bash guest/build.sh {build}`",
        p.display()
    );
    None
}

fn with_tables(image: KernelImage) -> (KernelImage, SiteTables) {
    let tables = SiteTables::read(&image).unwrap();
    (image, tables)
}

fn linux_61() -> Option<&'static (KernelImage, SiteTables)> {
    static IMAGE: OnceLock<Loaded> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let p = out("vmlinux", "linux")?;
            Some(with_tables(KernelImage::load(&p).unwrap()))
        })
        .as_ref()
}

fn noftrace() -> Option<&'static (KernelImage, SiteTables)> {
    static IMAGE: OnceLock<Loaded> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let p = out("linux-noftrace/vmlinux", "linux-noftrace")?;
            Some(with_tables(KernelImage::load_without_sites(&p).unwrap()))
        })
        .as_ref()
}

/// A Debian kernel, without its tables: the entry rules come before
/// any table's (and reading 6.12's takes long). Downloaded on first use
/// (`guest/build.sh debian-SERIES`, cached in ~/.cache/vmtrace/debian), as
/// the QEMU tests do (tests/common/qemu.rs).
fn debian(series: &'static str) -> Loaded {
    let build = format!("debian-{series}");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    if !root.join(format!("guest/out/{build}/vmlinuz")).is_file() {
        let st = std::process::Command::new("bash")
            .arg(root.join("guest/build.sh"))
            .arg(&build)
            .status();
        eprintln!("guest/build.sh {build}: {st:?}");
    }
    let p = out(&format!("{build}/vmlinuz"), &build)?;
    let image = crate::kernel::bzimage::load(&p).unwrap().0;
    Some((image, SiteTables::default()))
}

fn debian_61() -> Option<&'static (KernelImage, SiteTables)> {
    static IMAGE: OnceLock<Loaded> = OnceLock::new();
    IMAGE.get_or_init(|| debian("6.1")).as_ref()
}

fn debian_612() -> Option<&'static (KernelImage, SiteTables)> {
    static IMAGE: OnceLock<Loaded> = OnceLock::new();
    IMAGE.get_or_init(|| debian("6.12")).as_ref()
}

/// The noftrace build's bzImage alone: kallsyms, no ftrace sites.
fn noftrace_bzimage() -> Option<&'static (KernelImage, SiteTables)> {
    static IMAGE: OnceLock<Loaded> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let p = out("linux-noftrace/bzImage", "linux-noftrace")?;
            Some(with_tables(crate::kernel::bzimage::load(&p).unwrap().0))
        })
        .as_ref()
}

fn index(image: &KernelImage, name: &str) -> usize {
    image
        .functions
        .iter()
        .position(|f| f.name == name)
        .unwrap_or_else(|| panic!("no function {name} in {}", image.path.display()))
}

fn site((image, tables): &(KernelImage, SiteTables), name: &str) -> Result<DirectSite, Refusal> {
    DirectSite::analyze(image, tables, index(image, name))
}

fn not_entry(why: NotEntry) -> Refusal {
    Refusal::NotEntry { why }
}

/// `ret_from_fork` (entry_64.S, untyped) begins `mov rdi,rax; call
/// schedule_tail`: a new task's first return address, never called.
/// Functions only called through pointers are typed, and stay.
#[test]
fn untyped_assembly_labels_are_no_entries() {
    let Some(l) = linux_61() else { return };
    for name in ["ret_from_fork", "secondary_startup_64", "startup_64"] {
        assert_eq!(
            site(l, name).unwrap_err(),
            not_entry(NotEntry::Untyped),
            "{name}"
        );
    }
    let r = site(l, "ret_from_fork").unwrap_err();
    assert_eq!(r.rule(), "not-entry");
    assert_eq!(
        r.to_string(),
        "not a function entry: an untyped assembly label that no call targets"
    );
    // hrtimer_wakeup: called only as a timer's function pointer.
    assert!(site(l, "hrtimer_wakeup").is_ok());
}

/// GCC's `foo.cold`: the unlikely part of `foo`, which jumps to it.
#[test]
fn cold_fragments_are_no_entries() {
    let Some(l) = debian_61() else { return };
    assert_eq!(
        site(l, "name_to_dev_t.cold").unwrap_err(),
        not_entry(NotEntry::Cold)
    );
    let colds = (0..l.0.functions.len())
        .filter(|&f| l.0.not_entry(f) == Some(NotEntry::Cold))
        .count();
    assert!(colds > 1000, "{colds} .cold fragments");
    // Its function is an entry.
    assert_eq!(l.0.not_entry(index(&l.0, "name_to_dev_t")), None);
}

/// On Debian's 6.12 (kallsyms alone): objtool's `__pfx_` padding before
/// every function, and the inner labels of head_64.S's
/// `secondary_startup_64`, are no entries; its C `ret_from_fork` (called
/// by `ret_from_fork_asm`) is one.
#[test]
fn preambles_and_inner_labels_are_no_entries() {
    let Some(l) = debian_612() else { return };
    assert_eq!(
        site(l, "__pfx_schedule").unwrap_err(),
        not_entry(NotEntry::Preamble)
    );
    for name in [
        "secondary_startup_64",
        "secondary_startup_64_no_verify",
        "common_startup_64",
    ] {
        assert_eq!(
            site(l, name).unwrap_err(),
            not_entry(NotEntry::Unproved),
            "{name}"
        );
    }
    let image = &l.0;
    for name in ["ret_from_fork", "schedule"] {
        assert_eq!(image.not_entry(index(image, name)), None, "{name}");
    }
    // ftrace_caller (SYM_FUNC) is read on over its inner labels up to
    // the next entry (past its end's label and the next `__pfx_`).
    let f = index(image, "ftrace_caller");
    let label = image.symbol("ftrace_caller_end").unwrap().addr;
    let extent = image.entry_extent(f);
    assert!(image.functions[f].addr + extent > label, "{extent:#x}");
    let next = image.functions[f + 1..]
        .iter()
        .enumerate()
        .find(|(i, _)| image.not_entry(f + 1 + i).is_none())
        .unwrap()
        .1;
    assert_eq!(image.functions[f].addr + extent, next.addr, "{}", next.name);
}

/// From kallsyms a function is read on over the symbols after it that
/// are no entries, for its branches; its displaced bytes stay its own.
/// `mach_reboot_fixups` is a lone `ret`, and `machine_power_off` after it
/// (called through `pm_power_off`) cannot be proved an entry there: a
/// jump over both would be entered in its middle.
#[test]
fn displaced_bytes_stay_in_their_own_symbol() {
    let Some(l) = noftrace_bzimage() else { return };
    let f = index(&l.0, "mach_reboot_fixups");
    assert_eq!(l.0.functions[f].size, 1);
    assert!(l.0.entry_extent(f) > 1);
    assert_eq!(
        site(l, "mach_reboot_fixups").unwrap_err(),
        Refusal::TooShort { len: 1 }
    );
}

/// `call *(%rdi)` and `call *0x8(%rdi)` first, another instruction
/// displaced after them: their return address would be inside the jump.
#[test]
fn a_short_call_must_be_the_last_displaced_instruction() {
    let Some(l) = noftrace() else { return };
    for name in ["clocksource_verify_one_cpu", "platform_power_off_notify"] {
        let r = site(l, name).unwrap_err();
        assert_eq!(r, Refusal::CallNotLast { at: 0 }, "{name}");
        assert_eq!(r.rule(), "call-not-last");
    }
    // With ftrace, their ftrace site is displaced alone.
    let Some(l) = linux_61() else { return };
    for name in ["clocksource_verify_one_cpu", "platform_power_off_notify"] {
        assert!(site(l, name).unwrap().ftrace_nop, "{name}");
    }
}

/// Per-CPU loads (`mov rax, gs:[rip + var]`, the variable's offset as
/// target) first in a function: reached from the stubs by wrapping past
/// 0, and so encoded in the stub.
#[test]
fn per_cpu_operands_are_reached_by_wrapping() {
    let Some(l) = noftrace() else { return };
    let s = site(l, "__cond_resched_lock").unwrap();
    let i = &s.insns[0];
    assert_eq!(i.segment_prefix(), iced_x86::Register::GS);
    let target = i.ip_rel_memory_address();
    assert!(target < 0x10_0000, "{target:#x}");
    let at = 0xffff_ffff_ff9f_0000;
    let code = stub::build(s.addr, s.len, &s.insns, Head::Trap, at).unwrap();
    let mut d = Decoder::with_ip(
        64,
        &code[JUMP_LEN..],
        at + JUMP_LEN as u64,
        DecoderOptions::NONE,
    );
    let relocated = d.decode();
    assert_eq!(relocated.code(), i.code());
    assert_eq!(relocated.ip_rel_memory_address(), target);
    // None of the build's functions is out of reach any more (156 were).
    let summary = Summary::of(&l.0, &l.1);
    eprintln!("linux-noftrace: {summary}");
    assert_eq!(summary.refused.get("out-of-reach"), None, "{summary}");
    for rule in ["not-entry", "call-not-last"] {
        assert!(summary.refused.contains_key(rule), "{rule}: {summary}");
    }
}
