//! Symbols, sites and filters on the mini test guest (guest/out/mini.elf),
//! built by `bash guest/build.sh mini` (a no-op when it is up to date).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use tracer::kernel::filter::Filter;
use tracer::kernel::sites::{classify, SiteKind, SiteTable, SITE_LEN};
use tracer::kernel::symbols::KernelImage;

/// The functions guest/mini/README.md lists as having a site.
const MINI_SITES: &[&str] = &[
    "do_idle",
    "schedule",
    "hrtimer_start_range_ns",
    "hrtimer_try_to_cancel",
    "hrtimer_interrupt",
    "__hrtimer_run_queues",
    "hrtimer_wakeup",
    "tick_sched_timer",
    "mini_main",
    "mini_init_setup",
    // The graph=1 workload (run only with graph=1, but always sites).
    "graph_depth",
    "graph_depth2",
    "graph_depth3",
    "graph_leaf",
    "graph_tail_caller",
    "graph_tail_callee",
    "graph_recurse",
    "graph_abandon_outer",
    "graph_abandoned",
    "graph_long",
    "graph_migrate",
    // The args=1 functions (called only with args=1, but always sites).
    "args_six",
    "args_errno",
    "args_void",
    "args_struct",
    "args_seven",
    // The stack=1 chains (called only with stack=1, but always sites).
    "stack_leaf",
    "stack_mid",
    "stack_outer_a",
    "stack_outer_b",
    "stack_recurse",
];

/// Functions of the graph=1 workload that are called but have no site.
const MINI_GRAPH_NOTRACE: &[&str] = &[
    "graph_abandon_run",
    "graph_setjmp",
    "graph_longjmp",
    "graph_switch",
    "graph_task_main",
    "graph_migrate_start",
    "graph_migrate_finish",
];

/// guest/out/mini.elf, (re)built once per test process.
fn mini_elf() -> &'static Path {
    static ELF: OnceLock<PathBuf> = OnceLock::new();
    ELF.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = Command::new("bash")
            .args(["guest/build.sh", "mini"])
            .current_dir(&root)
            .output()
            .unwrap_or_else(|e| panic!("cannot run bash guest/build.sh mini: {e}"));
        assert!(
            out.status.success(),
            "`bash guest/build.sh mini` failed in {}; fix the mini guest build first:\n{}",
            root.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let elf = root.join("guest/out/mini.elf");
        assert!(
            elf.exists(),
            "guest/build.sh mini did not produce {}",
            elf.display()
        );
        elf
    })
}

fn load() -> (KernelImage, SiteTable) {
    let image = KernelImage::load(mini_elf()).unwrap_or_else(|e| panic!("{e}"));
    let sites = SiteTable::build(&image).unwrap_or_else(|e| panic!("{e}"));
    (image, sites)
}

fn site_name(image: &KernelImage, sites: &SiteTable, i: usize) -> String {
    image.functions[sites.sites[i].func as usize].name.clone()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn mini_sites_are_the_documented_functions() {
    let (image, sites) = load();
    let got: BTreeSet<String> = (0..sites.len())
        .map(|i| site_name(&image, &sites, i))
        .collect();
    assert_eq!(got, names(MINI_SITES));
    // Every distinct __mcount_loc entry is a site: none is stale.
    let distinct: BTreeSet<u64> = image.mcount_loc.iter().copied().collect();
    assert_eq!(distinct.len(), sites.len());
    for site in &sites.sites {
        let f = &image.functions[site.func as usize];
        assert_eq!(site.addr, f.addr, "{}: mini is built without IBT", f.name);
        let bytes = image.file_bytes(site.addr, SITE_LEN).expect("site bytes");
        assert_eq!(
            classify(bytes, site.addr, None),
            SiteKind::Nop,
            "{}",
            f.name
        );
    }
}

#[test]
fn mini_account_is_a_function_without_a_site() {
    let (image, sites) = load();
    let account = image.symbol("mini_account").expect("mini_account");
    assert!(image.functions.iter().any(|f| f.name == "mini_account"));
    assert!(sites.sites.iter().all(|s| s.addr != account.addr));
}

#[test]
fn mini_graph_helpers_are_functions_without_a_site() {
    let (image, sites) = load();
    for name in MINI_GRAPH_NOTRACE {
        let sym = image
            .symbol(name)
            .unwrap_or_else(|| panic!("no symbol {name}"));
        assert!(
            image.functions.iter().any(|f| f.name == *name),
            "{name} is a function"
        );
        assert!(
            sites.sites.iter().all(|s| s.addr != sym.addr),
            "{name} has no site"
        );
        let bytes = image.file_bytes(sym.addr, SITE_LEN).expect("bytes");
        assert_ne!(classify(bytes, sym.addr, None), SiteKind::Nop, "{name}");
    }
}

/// entry.S's graph_tail_caller: the ftrace NOP, then `incq` of its counter,
/// then a 5-byte `jmp rel32` to graph_tail_callee as its last instruction (a
/// sibling call: no `call`, no `ret`).
#[test]
fn mini_graph_tail_caller_ends_in_a_jmp_to_its_callee() {
    let (image, _) = load();
    let caller = image
        .symbol("graph_tail_caller")
        .expect("graph_tail_caller");
    let callee = image
        .symbol("graph_tail_callee")
        .expect("graph_tail_callee");
    let bytes = image
        .file_bytes(caller.addr, caller.size as usize)
        .expect("graph_tail_caller bytes");
    assert_eq!(
        bytes,
        {
            let mut want = vec![0x0f, 0x1f, 0x44, 0x00, 0x00]; // the site
            want.extend([0x48, 0xff, 0x47, 8 * 4]); // incq 8*G_graph_tail_caller(%rdi)
            want.push(0xe9); // jmp rel32
            let next = caller.addr + caller.size;
            want.extend(((callee.addr.wrapping_sub(next)) as u32).to_le_bytes());
            want
        }
        .as_slice(),
        "graph_tail_caller's code"
    );
}

#[test]
fn mini_init_setup_is_the_only_init_site() {
    let (image, sites) = load();
    let init: Vec<String> = (0..sites.len())
        .filter(|&i| sites.sites[i].init)
        .map(|i| site_name(&image, &sites, i))
        .collect();
    assert_eq!(init, ["mini_init_setup"]);
    let (start, end) = image.init_text.expect("init text");
    let (tstart, tend) = image.text.expect("text");
    assert!(tend <= start || end <= tstart, "init text overlaps text");
}

#[test]
fn mini_symbols_and_build_id() {
    let (image, _) = load();
    let stop = image.symbol("mini_stop").expect("mini_stop");
    assert_eq!(stop.size, 4);
    assert!(image.function_at(stop.addr).is_none());
    assert!(image.build_id.as_ref().is_some_and(|id| !id.is_empty()));
    let schedule = image.symbol("schedule").expect("schedule");
    assert_eq!(
        image
            .function_at(schedule.addr + 1)
            .map(|f| f.name.as_str()),
        Some("schedule")
    );
}

#[test]
fn mini_hrtimer_filter() {
    let (image, sites) = load();
    let trace = vec!["hrtimer_*".to_string()];
    let filter = Filter::new(&trace, &[]).expect("filter");
    let got: BTreeSet<String> = filter
        .select(&image, &sites)
        .expect("select")
        .into_iter()
        .map(|i| site_name(&image, &sites, i))
        .collect();
    let want = [
        "hrtimer_start_range_ns",
        "hrtimer_try_to_cancel",
        "hrtimer_interrupt",
        "hrtimer_wakeup",
    ];
    assert_eq!(got, names(&want));

    let trace = vec!["mini_acount".to_string()];
    let e = Filter::new(&trace, &[])
        .expect("filter")
        .select(&image, &sites)
        .expect_err("typo");
    let msg = e.to_string();
    assert!(msg.contains("closest: mini_main"), "{msg}");
}
