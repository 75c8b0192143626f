//! Symbols, ftrace sites and filters on real ELF files, built at test time
//! from tests/fixtures with the system gcc and ld the way a kernel is built.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use tracer::advice::{Remedy, TraceInput, TracerAdvice};
use tracer::kernel::filter::{Filter, FilterError};
use tracer::kernel::sites::{classify, SiteKind, SiteTable, ENDBR64, NOP5, SITE_LEN};
use tracer::kernel::symbols::{KernelImage, SymbolError};

/// How Linux compiles with CONFIG_DYNAMIC_FTRACE (minus what a freestanding
/// fixture does not need).
const KERNEL_CFLAGS: &[&str] = &[
    "-O2",
    "-mcmodel=kernel",
    "-fno-pic",
    "-ffreestanding",
    "-fno-stack-protector",
    "-fno-asynchronous-unwind-tables",
    "-mno-red-zone",
];
const FTRACE_CFLAGS: &[&str] = &["-pg", "-mfentry", "-mrecord-mcount"];

/// The functions of kern.c + arch.c that have an ftrace site.
const TRACEABLE: &[&str] = &[
    "hrtimer_start_range_ns",
    "hrtimer_try_to_cancel",
    "hrtimer_interrupt",
    "__hrtimer_run_queues",
    "hrtimer_wakeup",
    "tick_sched_timer",
    "schedule",
    "do_idle",
    "arch_cpu_idle",
    "mini_init_setup",
    "_start",
];
const HRTIMER: &[&str] = &[
    "hrtimer_start_range_ns",
    "hrtimer_try_to_cancel",
    "hrtimer_interrupt",
    "hrtimer_wakeup",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Variant {
    /// -mnop-mcount, table in .init.data as in vmlinux, stale entries, build-id.
    Plain,
    /// Plain but stripped.
    Stripped,
    /// -fcf-protection=full: functions start with endbr64.
    Ibt,
    /// Without -mnop-mcount: sites call __fentry__.
    Call,
    /// Table in its own misaligned `__mcount_loc` output section.
    Dedicated,
    /// Without -pg and without table bounds.
    NoFtrace,
    /// Without -pg: the bounds exist but enclose nothing.
    EmptyTable,
    /// The table bounds in .bss, which has no file data.
    TableInBss,
}

struct Recipe {
    ftrace: &'static [&'static str],
    script: &'static str,
    stale: bool,
    build_id: bool,
    strip: bool,
}

impl Variant {
    fn recipe(self) -> Recipe {
        let r = |ftrace, script, stale| Recipe {
            ftrace,
            script,
            stale,
            build_id: false,
            strip: false,
        };
        let nop: &[&str] = &["-mnop-mcount"];
        match self {
            Variant::Plain => Recipe {
                build_id: true,
                ..r(nop, "kernel.ld", true)
            },
            Variant::Stripped => Recipe {
                strip: true,
                ..r(nop, "kernel.ld", true)
            },
            Variant::Ibt => r(
                &["-mnop-mcount", "-fcf-protection=full"],
                "kernel.ld",
                false,
            ),
            Variant::Call => r(&[], "kernel.ld", false),
            Variant::Dedicated => r(nop, "dedicated.ld", true),
            Variant::NoFtrace => r(&[], "nomcount.ld", false),
            Variant::EmptyTable => r(&[], "kernel.ld", false),
            Variant::TableInBss => r(&[], "bss.ld", false),
        }
    }

    fn has_ftrace(self) -> bool {
        !matches!(
            self,
            Variant::NoFtrace | Variant::EmptyTable | Variant::TableInBss
        )
    }
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The ELF for `v`, built once per test process.
fn fixture(v: Variant) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<Variant, PathBuf>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    built.entry(v).or_insert_with(|| build(v)).clone()
}

/// This process's scratch directory; those of dead test processes are removed.
fn scratch_dir() -> PathBuf {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("elf_sites");
    if let Ok(entries) = std::fs::read_dir(&base) {
        for e in entries.flatten() {
            let pid = e.file_name().to_string_lossy().into_owned();
            if !Path::new("/proc").join(&pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    base.join(std::process::id().to_string())
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn build(v: Variant) -> PathBuf {
    let recipe = v.recipe();
    let src = fixtures_dir();
    let dir = scratch_dir().join(format!("{v:?}"));
    std::fs::create_dir_all(&dir).expect("create scratch dir");

    let mut objects = Vec::new();
    for c in ["kern.c", "arch.c"] {
        let obj = dir.join(c.replace(".c", ".o"));
        let mut cc = Command::new("gcc");
        cc.args(KERNEL_CFLAGS);
        if v.has_ftrace() {
            cc.args(FTRACE_CFLAGS);
        }
        cc.args(recipe.ftrace);
        run(cc.arg("-c").arg(src.join(c)).arg("-o").arg(&obj));
        objects.push(obj);
    }
    let mut asm = vec!["entry.S"];
    if recipe.stale {
        asm.push("stale.S");
    }
    for s in asm {
        let obj = dir.join(s.replace(".S", ".o"));
        run(Command::new("gcc")
            .arg("-c")
            .arg(src.join(s))
            .arg("-o")
            .arg(&obj));
        objects.push(obj);
    }

    let elf = dir.join("kernel.elf");
    let mut ld = Command::new("ld");
    ld.arg("--no-warn-rwx-segments")
        .arg("-T")
        .arg(src.join(recipe.script));
    if recipe.build_id {
        ld.arg("--build-id=sha1");
    }
    run(ld.arg("-o").arg(&elf).args(&objects));
    if recipe.strip {
        run(Command::new("strip").arg(&elf));
    }
    elf
}

fn load(v: Variant) -> KernelImage {
    let path = fixture(v);
    KernelImage::load(&path).unwrap_or_else(|e| panic!("{v:?}: {e}"))
}

fn load_err(v: Variant) -> SymbolError {
    match KernelImage::load(&fixture(v)) {
        Ok(_) => panic!("{v:?} loaded but should not"),
        Err(e) => e,
    }
}

fn sites(image: &KernelImage) -> SiteTable {
    SiteTable::build(image).unwrap_or_else(|e| panic!("{e}"))
}

fn addr_of(image: &KernelImage, name: &str) -> u64 {
    image
        .symbol(name)
        .unwrap_or_else(|| panic!("no symbol {name}"))
        .addr
}

fn site_names(image: &KernelImage, table: &SiteTable, idx: &[usize]) -> BTreeSet<String> {
    idx.iter()
        .map(|&i| image.functions[table.sites[i].func as usize].name.clone())
        .collect()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Index of the site starting exactly at `addr`.
fn lookup(table: &SiteTable, addr: u64) -> Option<usize> {
    table.sites.binary_search_by_key(&addr, |s| s.addr).ok()
}

/// Distinct `__mcount_loc` entries the table left out as stale.
fn unmatched(image: &KernelImage, table: &SiteTable) -> usize {
    let distinct: BTreeSet<u64> = image.mcount_loc.iter().copied().collect();
    distinct.len() - table.len()
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Loads Plain and selects with the given flags.
fn select(trace: &[&str], notrace: &[&str]) -> Result<BTreeSet<String>, FilterError> {
    let image = load(Variant::Plain);
    let table = sites(&image);
    let filter = Filter::new(&strings(trace), &strings(notrace))?;
    let idx = filter.select(&image, &table)?;
    Ok(site_names(&image, &table, &idx))
}

// ---- symbols ----

#[test]
fn functions_are_sorted_code_symbols() {
    let image = load(Variant::Plain);
    assert!(image.functions.windows(2).all(|w| w[0].addr < w[1].addr));
    let fnames: BTreeSet<&str> = image.functions.iter().map(|f| f.name.as_str()).collect();
    for name in TRACEABLE {
        assert!(fnames.contains(name), "{name} missing from functions");
    }
    // STT_FUNC asm, notrace C and an untyped asm entry point with a size.
    for name in ["__fentry__", "mini_account", "entry_fixture_64"] {
        assert!(fnames.contains(name), "{name} missing from functions");
    }
    // Sizeless labels and data are not functions.
    for name in [
        "fixture_label",
        "_stext",
        "_etext",
        "mini_stop",
        "__start_mcount_loc",
    ] {
        assert!(!fnames.contains(name), "{name} must not be a function");
    }
}

#[test]
fn symbol_finds_data_and_local_symbols() {
    let image = load(Variant::Plain);
    let stop = image.symbol("mini_stop").expect("mini_stop");
    assert_eq!(stop.size, 4);
    assert!(image.function_at(stop.addr).is_none());
    // hrtimer_wakeup is static: a local symbol.
    assert!(image.symbol("hrtimer_wakeup").is_some());
    assert!(image.symbol("no_such_symbol").is_none());
}

#[test]
fn function_at_respects_sizes() {
    let image = load(Variant::Plain);
    let schedule = image.symbol("schedule").expect("schedule").clone();
    assert_eq!(image.function_at(schedule.addr), Some(&schedule));
    assert_eq!(
        image.function_at(schedule.addr + schedule.size - 1),
        Some(&schedule)
    );
    // Padding after a function belongs to none (the next starts 16-aligned).
    let after = schedule.addr + schedule.size;
    let next = image.function_at(after);
    assert!(next.is_none() || next.is_some_and(|f| f.addr == after));
    assert!(image.function_at(addr_of(&image, "_stext") - 1).is_none());
}

#[test]
fn text_and_init_text_bounds_come_from_linker_symbols() {
    let image = load(Variant::Plain);
    let text = (addr_of(&image, "_stext"), addr_of(&image, "_etext"));
    let init = (addr_of(&image, "_sinittext"), addr_of(&image, "_einittext"));
    assert_eq!(image.text, Some(text));
    assert_eq!(image.init_text, Some(init));
    assert_eq!(init.0, addr_of(&image, "mini_init_setup"));
}

#[test]
fn text_bounds_fall_back_to_sections() {
    // dedicated.ld defines no _stext/_etext.
    let image = load(Variant::Dedicated);
    let (start, end) = image.text.expect(".text bounds");
    assert_eq!(start, 0xffff_ffff_8100_0000);
    assert!(end > addr_of(&image, "schedule"));
}

#[test]
fn build_id_is_read_when_linked_with_one() {
    assert_eq!(load(Variant::Plain).build_id.map(|b| b.len()), Some(20));
    assert_eq!(load(Variant::Dedicated).build_id, None);
}

#[test]
fn file_bytes_reads_code_by_virtual_address() {
    let image = load(Variant::Plain);
    let schedule = addr_of(&image, "schedule");
    assert_eq!(image.file_bytes(schedule, SITE_LEN), Some(&NOP5[..]));
    let (_, etext) = image.text.expect("text");
    // Past the end of .text's data, and in .bss (no file data).
    assert!(image.file_bytes(etext - 2, 8).is_none());
    assert!(image.file_bytes(addr_of(&image, "mini_stop"), 4).is_none());
}

#[test]
fn mcount_table_is_read_from_init_data() {
    let image = load(Variant::Plain);
    // 12 compiled sites (incl. the overridden weak one) + 3 from stale.S.
    assert_eq!(image.mcount_loc.len(), 15);
    assert!(image.mcount_loc.contains(&0));
    let schedule = addr_of(&image, "schedule");
    let dups = image.mcount_loc.iter().filter(|&&a| a == schedule).count();
    assert_eq!(dups, 2);
}

#[test]
fn misaligned_dedicated_table_is_read() {
    let image = load(Variant::Dedicated);
    assert_eq!(addr_of(&image, "__start_mcount_loc") % 8, 1);
    let plain = load(Variant::Plain);
    let dedicated = sites(&image);
    let all: Vec<usize> = (0..dedicated.len()).collect();
    let want: Vec<usize> = (0..sites(&plain).len()).collect();
    assert_eq!(
        site_names(&image, &dedicated, &all),
        site_names(&plain, &sites(&plain), &want)
    );
}

// ---- load errors ----

#[test]
fn stripped_image_is_rejected() {
    let e = load_err(Variant::Stripped);
    assert!(matches!(e, SymbolError::Stripped { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("has no symbol table (stripped?)"), "{msg}");
    assert!(msg.ends_with("; pass the unstripped vmlinux"), "{msg}");
    assert_eq!(e.remedy(), Some(Remedy::UnstrippedVmlinux));
    assert!(msg.contains(&fixture(Variant::Stripped).display().to_string()));
}

#[test]
fn image_without_mcount_loc_is_rejected() {
    let e = load_err(Variant::NoFtrace);
    assert!(matches!(e, SymbolError::NoMcountLoc { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("has no __mcount_loc table"), "{msg}");
    assert!(
        msg.contains("CONFIG_FUNCTION_TRACER=y and CONFIG_DYNAMIC_FTRACE=y"),
        "{msg}"
    );
}

#[test]
fn empty_mcount_loc_is_rejected() {
    let e = load_err(Variant::EmptyTable);
    assert!(matches!(e, SymbolError::EmptyMcountLoc { .. }), "{e:?}");
    assert!(e.to_string().contains("CONFIG_DYNAMIC_FTRACE=y"), "{e}");
}

#[test]
fn mcount_loc_without_file_data_is_rejected() {
    let e = load_err(Variant::TableInBss);
    assert!(matches!(e, SymbolError::McountLocNotInFile { .. }), "{e:?}");
}

#[test]
fn missing_and_non_elf_files_are_rejected() {
    let missing = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-vmlinux");
    let e = KernelImage::load(&missing).expect_err("missing file");
    assert!(
        matches!(e, SymbolError::File(vmm::boot::FileError::Open { .. })),
        "{e:?}"
    );
    assert!(e.to_string().contains("no-such-vmlinux"), "{e}");

    let not_elf = fixtures_dir().join("kern.c");
    let e = KernelImage::load(&not_elf).expect_err("C source");
    assert!(matches!(e, SymbolError::NotElf { .. }), "{e:?}");
    assert!(e.to_string().contains("not an ELF file"), "{e}");
}

#[test]
fn errors_are_one_line() {
    for v in [
        Variant::Stripped,
        Variant::NoFtrace,
        Variant::EmptyTable,
        Variant::TableInBss,
    ] {
        let msg = load_err(v).to_string();
        assert!(!msg.contains('\n'), "{v:?}: {msg}");
    }
}

// ---- sites ----

#[test]
fn sites_map_to_function_starts() {
    let image = load(Variant::Plain);
    let table = sites(&image);
    let all: Vec<usize> = (0..table.len()).collect();
    assert_eq!(site_names(&image, &table, &all), names(TRACEABLE));
    assert!(table.sites.windows(2).all(|w| w[0].addr < w[1].addr));
    for (i, site) in table.sites.iter().enumerate() {
        assert_eq!(site.addr, image.functions[site.func as usize].addr);
        assert_eq!(lookup(&table, site.addr), Some(i));
        assert_eq!(lookup(&table, site.addr + 1), None);
        let bytes = image.file_bytes(site.addr, SITE_LEN).expect("site bytes");
        assert_eq!(classify(bytes, site.addr, None), SiteKind::Nop);
    }
}

#[test]
fn stale_entries_are_left_out_and_counted() {
    let image = load(Variant::Plain);
    let table = sites(&image);
    // The overridden weak arch_cpu_idle, try_to_cancel+7 and a zero entry;
    // the duplicate `schedule` entry is merged, not counted.
    assert_eq!(unmatched(&image, &table), 3);
    assert_eq!(table.len(), TRACEABLE.len());
    let inside = addr_of(&image, "hrtimer_try_to_cancel") + 7;
    assert_eq!(lookup(&table, inside), None);
    assert_eq!(lookup(&table, 0), None);
    // The weak body is still in .text, but no symbol covers it any more.
    let weak: Vec<u64> = image
        .mcount_loc
        .iter()
        .copied()
        .filter(|&a| a != 0 && a != inside && lookup(&table, a).is_none())
        .collect();
    assert_eq!(weak.len(), 1, "{weak:x?}");
    // Both counted and named, for the report (the zero entry is no site).
    assert_eq!(table.rejected, 2);
    assert_eq!(table.entries, TRACEABLE.len() + 2);
    let named: Vec<u64> = table.rejected_examples.iter().map(|r| r.addr).collect();
    assert_eq!(named, {
        let mut v = vec![inside, weak[0]];
        v.sort_unstable();
        v
    });
    let summary = table.rejected_summary().unwrap();
    assert!(
        summary.starts_with("2 sites not at a function entry: ")
            && summary.contains("hrtimer_try_to_cancel+0x7"),
        "{summary}"
    );
    assert!(image.function_at(weak[0]).is_none());
    // The weak body is told apart: a site's bytes at no function's entry.
    assert_eq!(table.weak, 1);
    assert!(
        summary.contains(&format!("{:#x} (overridden __weak)", weak[0])),
        "{summary}"
    );
    assert_eq!(image.file_bytes(weak[0], SITE_LEN), Some(&NOP5[..]));
}

#[test]
fn init_sites_are_marked() {
    let image = load(Variant::Plain);
    let table = sites(&image);
    let init: Vec<&str> = table
        .sites
        .iter()
        .filter(|s| s.init)
        .map(|s| image.functions[s.func as usize].name.as_str())
        .collect();
    assert_eq!(init, ["mini_init_setup"]);
}

#[test]
fn ibt_sites_sit_after_endbr64() {
    let image = load(Variant::Ibt);
    let table = sites(&image);
    let all: Vec<usize> = (0..table.len()).collect();
    assert_eq!(site_names(&image, &table, &all), names(TRACEABLE));
    // Only the overridden weak function's entry is stale here.
    assert_eq!(unmatched(&image, &table), 1);
    for site in &table.sites {
        let f = &image.functions[site.func as usize];
        let endbr = image.file_bytes(f.addr, 4) == Some(&ENDBR64[..]);
        let want = if endbr { f.addr + 4 } else { f.addr };
        assert_eq!(site.addr, want, "{}", f.name);
    }
    // gcc gives global functions endbr64, but not a static one whose address
    // is never taken.
    let schedule = addr_of(&image, "schedule");
    assert_eq!(lookup(&table, schedule + 4).map(|_| ()), Some(()));
    let wakeup = addr_of(&image, "hrtimer_wakeup");
    assert_eq!(lookup(&table, wakeup).map(|_| ()), Some(()));
}

#[test]
fn unpatched_sites_call_fentry() {
    let image = load(Variant::Call);
    let table = sites(&image);
    assert_eq!(table.len(), TRACEABLE.len());
    let fentry = Some(addr_of(&image, "__fentry__"));
    for site in &table.sites {
        let bytes = image.file_bytes(site.addr, SITE_LEN).expect("site bytes");
        assert_eq!(bytes[0], 0xe8);
        assert_eq!(classify(bytes, site.addr, fentry), SiteKind::CallFentry);
        // Without knowing __fentry__, a call is not recognised.
        assert_eq!(classify(bytes, site.addr, None), SiteKind::Other);
    }
}

// ---- filters ----

#[test]
fn no_trace_flag_selects_everything() {
    assert_eq!(select(&[], &[]).expect("select"), names(TRACEABLE));
}

#[test]
fn hrtimer_glob_selects_exactly_the_hrtimer_functions() {
    assert_eq!(select(&["hrtimer_*"], &[]).expect("select"), names(HRTIMER));
}

#[test]
fn notrace_removes_functions() {
    let got = select(&["hrtimer_*"], &["hrtimer_wakeup"]).expect("select");
    assert_eq!(
        got,
        names(&[
            "hrtimer_start_range_ns",
            "hrtimer_try_to_cancel",
            "hrtimer_interrupt"
        ])
    );
    let got = select(&[], &["*hrtimer*,tick_*"]).expect("select");
    assert_eq!(
        got,
        names(&[
            "schedule",
            "do_idle",
            "arch_cpu_idle",
            "mini_init_setup",
            "_start"
        ])
    );
}

#[test]
fn comma_lists_and_repeated_flags_add_up() {
    let got = select(&["schedule,do_idle", " tick_sched_timer"], &[]).expect("select");
    assert_eq!(got, names(&["schedule", "do_idle", "tick_sched_timer"]));
}

#[test]
fn bracket_and_question_mark_globs() {
    let got = select(&["hrtimer_[st]*"], &[]).expect("select");
    assert_eq!(
        got,
        names(&["hrtimer_start_range_ns", "hrtimer_try_to_cancel"])
    );
    let got = select(&["sch?dule", "do_id??"], &[]).expect("select");
    assert_eq!(got, names(&["schedule", "do_idle"]));
}

#[test]
fn glob_matching_nothing_suggests_close_names() {
    let e = select(&["schedule", "hrtimr_*"], &[]).expect_err("no match");
    let FilterError::NoMatch { glob, closest, .. } = &e else {
        panic!("{e:?}");
    };
    assert_eq!(glob, "hrtimr_*");
    // The four hrtimer_ names are one edit away; then __hrtimer_run_queues.
    assert_eq!(closest.len(), 5, "{closest:?}");
    let first: BTreeSet<String> = closest[..4].iter().cloned().collect();
    assert_eq!(first, names(HRTIMER));
    let msg = e.to_string();
    assert!(
        msg.starts_with("trace filter 'hrtimr_*' matches no traceable function"),
        "{msg}"
    );
    assert!(msg.contains("; closest: hrtimer_"), "{msg}");

    let e = select(&["schedul"], &[]).expect_err("no match");
    let FilterError::NoMatch { closest, .. } = &e else {
        panic!("{e:?}");
    };
    assert_eq!(closest[0], "schedule");
}

#[test]
fn glob_matching_only_notrace_functions_says_so() {
    let e = select(&["mini_account"], &[]).expect_err("notrace function");
    let FilterError::NoMatch { untraceable, .. } = &e else {
        panic!("{e:?}");
    };
    assert_eq!(untraceable, &["mini_account"]);
    assert!(e.to_string().contains("no ftrace call site"), "{e}");
}

#[test]
fn bad_globs_are_rejected_by_name() {
    let e = Filter::new(&strings(&["schedule,hrtimer_[ab"]), &[]).expect_err("bad glob");
    assert!(
        matches!(
            e,
            FilterError::BadGlob {
                input: TraceInput::Trace,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("'hrtimer_[ab'"), "{msg}");
    assert!(!msg.contains('\n'));

    let e = Filter::new(&[], &strings(&["[z-a]"])).expect_err("bad range");
    assert!(
        matches!(
            e,
            FilterError::BadGlob {
                input: TraceInput::Notrace,
                ..
            }
        ),
        "{e:?}"
    );

    let e = Filter::new(&strings(&["schedule,,do_idle"]), &[]).expect_err("empty glob");
    assert!(matches!(e, FilterError::EmptyGlob { .. }), "{e:?}");
}

#[test]
fn notrace_removing_everything_is_an_error() {
    let e = select(&["hrtimer_*"], &["hrtimer*"]).expect_err("nothing left");
    assert!(matches!(e, FilterError::NothingLeft), "{e:?}");
}

#[test]
fn negation_and_braces_select_like_ftrace() {
    let got = select(&["hrtimer_*,!hrtimer_wakeup"], &[]).expect("select");
    assert_eq!(
        got,
        names(&[
            "hrtimer_start_range_ns",
            "hrtimer_try_to_cancel",
            "hrtimer_interrupt"
        ])
    );
    let got = select(&["hrtimer_{start,try}*,tick_*"], &[]).expect("select");
    assert_eq!(
        got,
        names(&[
            "hrtimer_start_range_ns",
            "hrtimer_try_to_cancel",
            "tick_sched_timer"
        ])
    );
    // A `!glob` matching nothing is no error; alone, it is.
    assert!(select(&["schedule,!no_such_function"], &[]).is_ok());
    let e = select(&["!schedule"], &[]).expect_err("only negated");
    assert!(matches!(e, FilterError::OnlyNegated { .. }), "{e:?}");
    // The image alone has no module's functions: a module glob matches none.
    let e = select(&[":mod:ext4"], &[]).expect_err("module");
    assert!(matches!(e, FilterError::NoMatch { .. }), "{e:?}");
    let e = select(&[":mod:"], &[]).expect_err("no module");
    assert!(matches!(e, FilterError::Module { .. }), "{e:?}");
}

// ---- list ----

#[test]
fn list_marks_init_and_notrace_functions() {
    use tracer::plan::list::{Kind, Listing};
    let image = load(Variant::Plain);
    let table = sites(&image);
    let all = Listing::new(&image, &table, &[]).expect("list");
    assert_eq!(all.functions.len(), image.functions.len());
    assert!(all.functions.windows(2).all(|w| w[0].name <= w[1].name));
    let kind = |name: &str| {
        all.functions
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("{name} not listed"))
            .kind
    };
    assert_eq!(kind("schedule"), Kind::Traceable);
    assert_eq!(kind("mini_init_setup"), Kind::InitOnly);
    assert_eq!(kind("mini_account"), Kind::NoSite);
    assert_eq!(kind("__fentry__"), Kind::NoSite);
    let out = all.render();
    assert!(out.contains("\nmini_account [notrace]\n"), "{out}");
    assert!(out.contains("\nmini_init_setup [init]\n"), "{out}");
    assert!(out.contains("\nschedule\n"), "{out}");
    // Exactly the functions the same --trace selects, plus the others.
    let traceable = all.count(Kind::Traceable) + all.count(Kind::InitOnly);
    assert_eq!(traceable, TRACEABLE.len());

    let some = Listing::new(&image, &table, &strings(&["mini_*,hrtimer_w*"])).expect("list");
    assert_eq!(
        some.render(),
        "hrtimer_wakeup\nmini_account [notrace]\nmini_init_setup [init]\n"
    );
    assert_eq!(
        some.summary(),
        "3 functions: 1 traceable, 1 init-only, 1 without an ftrace site"
    );
    let e = Listing::new(&image, &table, &strings(&["shedule"])).expect_err("no match");
    assert!(e.to_string().contains("; closest: schedule"), "{e}");
}

#[test]
fn a_notrace_glob_matching_nothing_is_refused_as_ftrace_does() {
    let e = select(&["hrtimer_*"], &["hrtimer_wakeup,nomatch_*"]).expect_err("no match");
    let FilterError::NoMatch { input, glob, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!((*input, glob.as_str()), (TraceInput::Notrace, "nomatch_*"));
    assert!(
        e.to_string()
            .starts_with("notrace filter 'nomatch_*' matches no traceable function"),
        "{e}"
    );
    // One that matches a traceable function --trace did not select is fine.
    assert!(select(&["hrtimer_*"], &["schedule"]).is_ok());
}

#[test]
fn what_a_non_elf_vmlinux_is_told_depends_on_what_it_is() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("notelf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // An ELF identification of a 64-bit big-endian file, then zeros.
    let mut be = b"\x7fELF\x02\x02\x01".to_vec();
    be.resize(64, 0);
    let mut bz = vec![0u8; 0x300];
    bz[0x202..0x206].copy_from_slice(b"HdrS");
    for (name, bytes, want) in [
        ("empty", Vec::new(), "the file is empty"),
        ("be.elf", be, "pass an x86-64 vmlinux"),
        ("bzImage", bz, "it is a bzImage"),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        let e = KernelImage::load(&p).expect_err(name).to_string();
        assert!(e.contains(want), "{name}: {e}");
        // Only a bzImage is told it is one.
        assert_eq!(e.contains("bzImage"), name == "bzImage", "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
