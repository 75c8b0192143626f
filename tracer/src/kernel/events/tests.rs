//! The event tables of real kernels (guest/out): the project's 6.1 guest
//! from its vmlinux and from its bzImage alone, and Debian's 6.12 cloud
//! kernel from its bzImage (kallsyms and BTF in the payload).

use std::path::{Path, PathBuf};

use crate::kernel::btf::KernelBtf;
use crate::kernel::events::{EventGlobs, EventKind, EventTable, KernelEvent};
use crate::kernel::symbols::KernelImage;

/// A kernel of guest/out, or None (skipped) when it is not built.
fn out(rel: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../guest/out")
        .join(rel);
    if !p.is_file() {
        eprintln!("SKIPPED: {} is not built", p.display());
        return None;
    }
    Some(p)
}

fn bzimage(rel: &str) -> Option<KernelImage> {
    Some(crate::kernel::bzimage::load(&out(rel)?).unwrap().0)
}

fn table(image: &KernelImage) -> EventTable {
    let btf = KernelBtf::from_image(image).unwrap();
    EventTable::read(image, &btf).unwrap()
}

fn event<'a>(t: &'a EventTable, full: &str) -> &'a KernelEvent {
    t.events
        .iter()
        .find(|e| e.full_name() == full)
        .unwrap_or_else(|| panic!("no event {full}"))
}

const SCHED_SWITCH: &str = "(bool preempt, struct task_struct *prev, struct task_struct *next, \
                            unsigned int prev_state)";

/// Every tracepoint event's `struct tracepoint` and `__traceiter_NAME` are
/// the symbols of those names.
fn tracepoints_match_symbols(image: &KernelImage, t: &EventTable) {
    let mut n = 0;
    for e in t.events.iter().filter(|e| e.kind == EventKind::Tracepoint) {
        let iter = image.symbol(&format!("__traceiter_{}", e.name)).unwrap();
        assert_eq!(e.iterator, Some(iter.addr), "{}", e.name);
        if let Some(tp) = image.symbol(&format!("__tracepoint_{}", e.name)) {
            assert_eq!(e.tracepoint, Some(tp.addr), "{}", e.name);
            n += 1;
        }
        assert!(e.args.is_some(), "{} has no prototype", e.name);
    }
    assert!(n > 0 || image.symbol("__tracepoint_sched_switch").is_none());
}

/// The project's guests (6.1 and 6.12, tinyconfig): the bzImage alone
/// gives the events its vmlinux does, its array (found by the scan in 6.1,
/// whose kallsyms have no data symbols) exactly where the symbols put it.
#[test]
fn guest_events_from_the_vmlinux_and_from_the_bzimage_alone_are_equal() {
    for dir in ["", "linux-6.12/"] {
        let (Some(vmlinux), Some(bz)) = (
            out(&format!("{dir}vmlinux")),
            bzimage(&format!("{dir}bzImage")),
        ) else {
            continue;
        };
        let vmlinux = KernelImage::load_without_sites(&vmlinux).unwrap();
        let (a, b) = (table(&vmlinux), table(&bz));
        assert!(!a.scanned);
        // Scanned where kallsyms have no data symbols.
        assert_eq!(b.scanned, bz.symbol("__start_ftrace_events").is_none());
        let start = vmlinux.symbol("__start_ftrace_events").unwrap().addr;
        let stop = vmlinux.symbol("__stop_ftrace_events").unwrap().addr;
        assert_eq!(a.array, (start, stop));
        assert_eq!(b.array, a.array, "{dir}");
        assert_eq!(a.events.len() as u64, (stop - start) / 8);
        assert_eq!(a.events, b.events, "{dir}");
        let e = event(&a, "sched:sched_switch");
        assert_eq!(e.kind, EventKind::Tracepoint);
        assert_eq!(e.signature(), SCHED_SWITCH);
        tracepoints_match_symbols(&vmlinux, &a);
        // No syscall events (no CONFIG_FTRACE_SYSCALLS); the `ftrace`
        // system's are there but not listed, and the others all are.
        assert!(a.events.iter().all(|e| e.kind != EventKind::Syscall));
        for e in &a.events {
            assert_eq!(e.listed, e.system != "ftrace", "{}", e.full_name());
        }
    }
}

/// Debian's cloud kernels (6.12 and 6.1), each from its bzImage alone:
/// both pass `prev_state` to sched_switch (since Linux 5.18), both have
/// syscall events, whose arguments come from their metadata.
#[test]
fn debian_events_from_their_bzimages() {
    for rel in ["debian-6.12/vmlinuz", "debian-6.1/vmlinuz"] {
        let Some(image) = bzimage(rel) else {
            continue;
        };
        let t = table(&image);
        assert!(!t.scanned && t.syscalls_checked, "{rel}");
        let e = event(&t, "sched:sched_switch");
        assert_eq!(e.signature(), SCHED_SWITCH, "{rel}");
        let tp = image.symbol("__tracepoint_sched_switch").unwrap().addr;
        assert_eq!(e.tracepoint, Some(tp));
        assert!(e.key.is_some_and(|k| k > tp && k < tp + 64));
        let open = event(&t, "syscalls:sys_enter_openat");
        assert_eq!(open.kind, EventKind::Syscall);
        assert!(open.listed && open.tracepoint.is_none());
        assert_eq!(
            open.signature(),
            "(int dfd, const char *filename, int flags, umode_t mode)"
        );
        let exit = event(&t, "syscalls:sys_exit_openat");
        assert_eq!(exit.signature(), "(long ret)");
        tracepoints_match_symbols(&image, &t);
    }
}

#[test]
fn globs_select_as_set_event_does() {
    let Some(vmlinux) = out("vmlinux") else {
        return;
    };
    let t = table(&KernelImage::load_without_sites(&vmlinux).unwrap());
    let names = |globs: &[&str]| -> Vec<String> {
        let args: Vec<String> = globs.iter().map(|g| g.to_string()).collect();
        let g = EventGlobs::parse(&args).unwrap();
        t.listed()
            .filter(|e| g.is_match(e))
            .map(|e| e.full_name())
            .collect()
    };
    assert_eq!(names(&["*:*switch*"]), ["sched:sched_switch"]);
    assert_eq!(names(&["sched_switch"]), ["sched:sched_switch"]);
    let sched = names(&["sched:*"]);
    assert!(sched.len() > 10 && sched.iter().all(|n| n.starts_with("sched:")));
    assert_eq!(names(&["sched"]), sched);
    let some = names(&["sched:*", "!sched:sched_switch"]);
    assert_eq!(some.len(), sched.len() - 1);
    assert!(EventGlobs::parse(&["a:b:c".into()]).is_err());
    assert!(EventGlobs::parse(&["sched:,".into()]).is_err());
}

/// Each common event's call sites in real kernels: the kernel's NOPs in
/// its text, each jumping (once enabled) within its own function, and its
/// `__traceiter_NAME` an ftrace site (as `available_filter_functions`
/// lists it), so that vmtrace records it like a function.
#[test]
fn common_events_have_nop_sites_and_traced_iterators() {
    use crate::kernel::events::jump_sites;
    let common = [
        "sched:sched_switch",
        "sched:sched_wakeup",
        "sched:sched_process_fork",
        "task:task_rename",
    ];
    for rel in [
        "debian-6.12/vmlinuz",
        "debian-6.1/vmlinuz",
        "linux-6.12/bzImage",
    ] {
        let Some(image) = bzimage(rel) else {
            continue;
        };
        let t = table(&image);
        let entries = jump_sites::entries(&image).unwrap();
        if rel.starts_with("linux-") {
            // The project's guest (tinyconfig) has no CONFIG_JUMP_LABEL.
            let key = event(&t, common[0]).key.unwrap();
            let err = jump_sites::event_sites(&image, &entries, common[0], key);
            assert!(matches!(
                err,
                Err(jump_sites::JumpSiteError::NoJumpLabels { .. })
            ));
            continue;
        }
        for full in common {
            let e = event(&t, full);
            let sites = jump_sites::event_sites(&image, &entries, full, e.key.unwrap())
                .unwrap_or_else(|err| panic!("{rel}: {err}"));
            let btf = KernelBtf::from_image(&image).unwrap();
            let funcs = e.tracepoint.unwrap()
                + u64::from(btf.member("tracepoint", "funcs").unwrap().offset);
            for s in &sites {
                // Static calls: the `tp->funcs` test a trap makes pass.
                let t = super::enabled_branch::funcs_test(&image, s.target, funcs)
                    .unwrap_or_else(|| panic!("{rel} {full}: no funcs test after {:#x}", s.target));
                assert!(t.test > s.target && t.after_je > t.test, "{rel} {full}");
                let f = image.function_at(s.code).unwrap();
                assert_eq!(
                    image.function_at(s.target).unwrap().addr,
                    f.addr,
                    "{rel} {full}"
                );
                assert_eq!(image.file_bytes(s.code, s.nop.len()).unwrap(), s.nop);
            }
            let iter = e.iterator.unwrap();
            let f = image.function_at(iter).unwrap();
            assert_eq!(f.addr, iter);
            assert!(
                image.mcount_loc.iter().any(|&m| m >= iter && m < iter + 16),
                "{rel}: __traceiter of {full} has no ftrace site"
            );
            eprintln!("{rel} {full}: {} sites", sites.len());
        }
    }
}

/// The project's guests (no jump labels, static calls): each event's
/// `tp->funcs` tests are found in the text, testing RAX before a call of
/// the event's static call, never in `__traceiter_NAME` itself (whose
/// own load walks the probes); `sched_switch`'s is in `__schedule`.
#[test]
fn guests_without_jump_labels_have_their_funcs_tests_found_in_the_text() {
    use crate::plan::events::EventPlan;
    for rel in ["bzImage", "linux-6.12/bzImage"] {
        let Some(image) = bzimage(rel) else {
            continue;
        };
        let globs = ["sched:sched_switch,sched:sched_wakeup".to_string()];
        let plan = EventPlan::build(&image, &globs).unwrap();
        assert!(plan.counted_keys, "{rel}");
        assert!(plan.attachable(&image.path).is_err(), "{rel}");
        for e in &plan.events {
            let sct = image.symbol(&format!("__SCT__tp_func_{}", e.name)).unwrap();
            assert!(e.static_call && e.sites.is_empty(), "{rel} {}", e.name);
            assert!(!e.tests.is_empty(), "{rel} {}: no funcs test", e.name);
            for t in &e.tests {
                assert_eq!(t.reg, "rax", "{rel} {} at {:#x}", e.name, t.test);
                assert_eq!(t.callee, Some(sct.addr), "{rel} {}", e.name);
                let f = image.function_at(t.test).unwrap();
                assert!(!f.name.starts_with("__traceiter_"), "{rel} {}", f.name);
                assert_eq!(image.file_bytes(t.test, 3).unwrap(), [0x48, 0x85, 0xc0]);
            }
            let in_schedule = e
                .tests
                .iter()
                .any(|t| image.function_at(t.test).unwrap().name == "__schedule");
            assert_eq!(in_schedule, e.name == "sched_switch", "{rel} {}", e.name);
            eprintln!("{rel} {}: {} tests", e.full_name(), e.tests.len());
        }
    }
}

/// Every tracepoint event's `tp->funcs` tests in the project's guests, by
/// the register the compiler chose: each is the `test R, R` the own VMM's
/// trap replaces (`session::event_keys::test_bytes`), and is trapped, R
/// any register: in Linux 6.1 three of 216 test another register than RAX.
#[test]
fn funcs_tests_of_every_event_by_register() {
    use crate::plan::events::EventPlan;
    use crate::session::event_keys::{test_bytes, GPRS};
    for rel in ["bzImage", "linux-6.12/bzImage"] {
        let Some(image) = bzimage(rel) else {
            continue;
        };
        // Every event vmtrace enables as a tracepoint (not raw_syscalls',
        // which it refuses).
        let globs = ["*:*,!syscalls:*,!raw_syscalls:*".to_string()];
        let plan = EventPlan::build(&image, &globs).unwrap();
        let mut by_reg: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
        for e in &plan.events {
            for t in &e.tests {
                let n = GPRS.iter().position(|&r| r == t.reg).unwrap();
                assert_eq!(image.file_bytes(t.test, 3).unwrap(), test_bytes(n as u8));
                by_reg.entry(GPRS[n]).or_default().push(e.full_name());
            }
        }
        for (reg, events) in &by_reg {
            let some = &events[..events.len().min(6)];
            eprintln!("{rel} {reg}: {} tests, e.g. {some:?}", events.len());
        }
        // Every one trapped, whatever its register.
        let traps = crate::session::event_keys::TestTraps::of(&plan).unwrap();
        assert_eq!(traps.len(), by_reg.values().map(Vec::len).sum::<usize>());
        if rel == "bzImage" {
            // Linux 6.1's: kmalloc's test is of RDI (`test rdi,rdi`).
            assert_eq!(by_reg["rdi"], ["kmem:kmalloc"], "{by_reg:?}");
            assert!(by_reg["rsi"].contains(&"dev:devres_log".to_string()));
            assert!(by_reg["rax"].len() > 200, "{by_reg:?}");
        }
    }
}

/// An exitless event's instructions beyond a function entry's
/// (`path_cost`), counted in the project's guests' text: every one of
/// `sched_switch`'s and `sched_wakeup`'s enabled branches decodes from its
/// load to its call, through the static call's `jmp`, and
/// `__traceiter_NAME` to its `ret` with no probe; and in Debian 6.12's
/// (jump labels, inline static calls).
#[test]
fn event_paths_are_counted_in_the_text() {
    use crate::kernel::events::path_cost::event_path_cost;
    use crate::plan::events::EventPlan;
    for rel in ["bzImage", "linux-6.12/bzImage", "debian-6.12/vmlinuz"] {
        let Some(image) = bzimage(rel) else {
            continue;
        };
        let globs = ["sched:sched_switch,sched:sched_wakeup".to_string()];
        let plan = EventPlan::build(&image, &globs).unwrap();
        for e in &plan.events {
            assert!(!e.tests.is_empty(), "{rel} {}", e.name);
            for t in &e.tests {
                let c = event_path_cost(&image, t, e.funcs, e.iterator)
                    .unwrap_or_else(|| panic!("{rel} {} at {:#x}", e.name, t.load));
                eprintln!("{rel} {} at {:#x}: {c:?} = {}", e.name, t.load, c.total());
                // The load, `test`, `je`, `__data`'s load, the `call`.
                assert!(c.branch >= 5, "{rel} {}: {c:?}", e.name);
                assert!(c.trampoline <= 1, "{rel} {}: {c:?}", e.name);
                // Its load of `tp->funcs`, `test`, `je`, `ret`.
                assert!(c.iterator >= 4, "{rel} {}: {c:?}", e.name);
            }
        }
    }
}
