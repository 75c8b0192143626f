//! The tables issue 35 added, on real images, each read once: the 6.1
//! guest's vmlinux (paravirt sites, LOCK prefixes, trampolines), its
//! bzImage alone (kallsyms, no data symbols) and Debian's 6.12 cloud
//! kernel's (call-depth sites, jump labels, trampolines). An image not
//! built is skipped with a message, as elsewhere.

use std::sync::OnceLock;

use super::*;
use crate::kernel::boot_patched::BootPatched;
use crate::kernel::direct::{DirectSite, Refusal, Summary};

struct Loaded {
    image: KernelImage,
    tables: SiteTables,
}

fn path(rel: &str) -> Option<std::path::PathBuf> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../guest/out")
        .join(rel);
    if !p.is_file() {
        eprintln!("SKIPPED: {} is not built (guest/build.sh)", p.display());
    }
    p.is_file().then_some(p)
}

fn loaded(image: KernelImage) -> Loaded {
    let tables = SiteTables::read(&image).unwrap();
    Loaded { image, tables }
}

/// guest/out/vmlinux: the 6.1 guest, with its symbol table.
fn linux_6_1() -> Option<&'static Loaded> {
    static L: OnceLock<Option<Loaded>> = OnceLock::new();
    L.get_or_init(|| Some(loaded(KernelImage::load(&path("vmlinux")?).unwrap())))
        .as_ref()
}

/// guest/out/bzImage alone: the same kernel, kallsyms without data.
fn linux_6_1_bzimage() -> Option<&'static Loaded> {
    static L: OnceLock<Option<Loaded>> = OnceLock::new();
    L.get_or_init(|| {
        let (image, _) = crate::kernel::bzimage::load(&path("bzImage")?).unwrap();
        Some(loaded(image))
    })
    .as_ref()
}

/// Debian's 6.12 cloud kernel, its bzImage alone.
fn debian_6_12() -> Option<&'static Loaded> {
    static L: OnceLock<Option<Loaded>> = OnceLock::new();
    L.get_or_init(|| {
        let (image, _) = crate::kernel::bzimage::load(&path("debian-6.12/vmlinuz")?).unwrap();
        Some(loaded(image))
    })
    .as_ref()
}

impl Loaded {
    /// Why each function named `name` (static ones may share it) is
    /// refused, if it is.
    fn all(&self, name: &str) -> Vec<Option<Refusal>> {
        let found: Vec<_> = (0..self.image.functions.len())
            .filter(|&i| self.image.functions[i].name == name)
            .map(|i| DirectSite::analyze(&self.image, &self.tables, i).err())
            .collect();
        assert!(!found.is_empty(), "no function {name}");
        found
    }

    fn refusal(&self, name: &str) -> Option<Refusal> {
        self.all(name).remove(0)
    }

    fn site(&self, name: &str) -> DirectSite {
        let i = self.image.functions.iter().position(|f| f.name == name);
        DirectSite::analyze(&self.image, &self.tables, i.unwrap()).unwrap()
    }
}

fn overlaps(table: KernelTable, at: u64) -> Option<Refusal> {
    Some(Refusal::Overlaps { table, at })
}

#[test]
fn paravirt_sites_refuse_the_functions_they_begin() {
    let Some(l) = linux_6_1() else { return };
    // Eight 16-byte entries (readelf -S: .parainstructions is 0x80 bytes).
    assert_eq!(l.tables.count(KernelTable::Paravirt), 8);
    for name in [
        "__flush_tlb_local",
        "__flush_tlb_one_user",
        "__flush_tlb_multi",
        "paravirt_tlb_remove_table",
    ] {
        assert_eq!(
            l.refusal(name),
            overlaps(KernelTable::Paravirt, 0),
            "{name}"
        );
    }
    let slow = l.all("slow_down_io");
    assert_eq!(slow, vec![overlaps(KernelTable::Paravirt, 0); 2]);
    assert_eq!(slow[0].as_ref().unwrap().rule(), "paravirt");
    // `call *pv_ops+8(%rip)`: its 6 bytes are what apply_paravirt rewrites,
    // and what the running-kernel check must not compare.
    let f = l.image.symbol("__flush_tlb_local").unwrap().addr;
    let patched = BootPatched::read(&l.image).unwrap();
    assert!((f..f + 6).all(|a| patched.covers(a)) && !patched.covers(f + 6));
}

#[test]
fn lock_prefixes_refuse_the_functions_they_begin() {
    let Some(l) = linux_6_1() else { return };
    // Every entry but the page's zero padding, which the kernel skips.
    let (s, e) = (
        l.image.symbol("__smp_locks").unwrap().addr,
        l.image.symbol("__smp_locks_end").unwrap().addr,
    );
    let data = l.image.file_bytes(s, (e - s) as usize).unwrap();
    let real = data.chunks_exact(4).filter(|c| c != &[0; 4]).count();
    assert!(real > 1000 && real < data.len() / 4, "{real}");
    assert_eq!(l.tables.count(KernelTable::SmpLock), real);
    // `lock btr` first; `mov rax,rdi` then `lock or`.
    assert_eq!(
        l.refusal("clear_bit_unlock"),
        overlaps(KernelTable::SmpLock, 0)
    );
    assert_eq!(
        l.refusal("arch_atomic64_fetch_add"),
        overlaps(KernelTable::SmpLock, 3)
    );
    let summary = Summary::of(&l.image, &l.tables);
    assert_eq!(summary.refused.get("smp-lock"), Some(&68), "{summary}");
    // On one CPU the kernel rewrites the prefix at boot: masked.
    let lock = l.image.symbol("clear_bit_unlock").unwrap().addr;
    assert!(BootPatched::read(&l.image).unwrap().covers(lock));
}

#[test]
fn static_call_trampolines_are_refused() {
    for l in [linux_6_1(), debian_6_12()].into_iter().flatten() {
        let named = l
            .image
            .symbols
            .keys()
            .filter(|n| n.starts_with(TRAMP_PREFIX))
            .count();
        assert_eq!(l.tables.trampolines().len(), named);
        let r = l.refusal("__SCT__pv_sched_clock");
        // kallsyms proves no entry of a trampoline only jumped to (from
        // `sched_clock`): the not-entry rule refuses it first there.
        if l.image.typed.is_none() {
            let why = crate::kernel::direct::NotEntry::Unproved;
            assert_eq!(r, Some(Refusal::NotEntry { why }));
            continue;
        }
        assert_eq!(r, overlaps(KernelTable::StaticCallTramp, 0));
        assert_eq!(r.unwrap().rule(), "static-call-trampoline");
    }
}

#[test]
fn static_call_sites_are_found_without_their_table() {
    let (Some(elf), Some(bz)) = (linux_6_1(), linux_6_1_bzimage()) else {
        return;
    };
    // kallsyms without CONFIG_KALLSYMS_ALL has no `__start_static_call_sites`:
    // the calls to trampolines are the sites, as the table lists them.
    assert!(bz.image.symbol("__start_static_call_sites").is_none());
    let sites = |t: &SiteTables| {
        let s = t.sites().iter().filter(|s| s.2 == KernelTable::StaticCall);
        s.map(|s| s.0).collect::<Vec<_>>()
    };
    assert!(sites(&elf.tables).len() > 100);
    assert_eq!(sites(&bz.tables), sites(&elf.tables));
    // sched_clock begins `jmp __SCT__pv_sched_clock`: static_call_update
    // rewrites it.
    for l in [elf, bz] {
        let r = l.refusal("sched_clock");
        assert_eq!(r, overlaps(KernelTable::StaticCall, 0));
    }
}

#[test]
fn a_jump_table_the_image_does_not_locate_is_an_error() {
    let Some(p) = path("vmlinux") else { return };
    // The 6.1 guest has no jump labels (its `__jump_table` is empty);
    // given kernel/jump_label.c's jump_label_init, and its bounds unnamed
    // as in kallsyms without data, the table is in `.data`, unknown.
    let mut image = KernelImage::load(&p).unwrap();
    for bound in ["__start___jump_table", "__stop___jump_table"] {
        image.symbols.remove(bound).unwrap();
    }
    let evidence = image.symbol("__fentry__").unwrap().clone();
    image.symbols.insert("jump_label_init".into(), evidence);
    let e = SiteTables::read(&image).unwrap_err();
    assert!(matches!(
        e,
        TableError::NotFound {
            section: "__jump_table",
            evidence: "jump_label_init",
            ..
        }
    ));
    assert!(
        e.to_string().contains("no direct entry can be proved"),
        "{e}"
    );
    // The plan says what to pass instead.
    let e = crate::plan::entry::DirectPlanError::Tables(e);
    assert_eq!(
        crate::advice::TracerAdvice::remedy(&e),
        Some(crate::advice::Remedy::UnstrippedKernelVmlinux)
    );
    // What the running-kernel check masks is read all the same.
    assert!(!BootPatched::read(&image).unwrap().is_empty());
}

#[test]
fn an_ftrace_call_is_no_call_depth_site() {
    let Some(l) = debian_6_12() else { return };
    // objtool lists `call __fentry__` in `.call_sites`; callthunks skips it.
    let s = l.site("hrtimer_active");
    assert!(s.ftrace_nop);
    assert!(l.tables.count(KernelTable::CallDepth) > 100_000);
}

/// A branch the kernel's code or tables hold, found: `(source, from,
/// function, offset it lands at)`.
fn assert_found(l: &Loaded, want: &[(BranchSource, &str, &str, u64)]) {
    let got: Vec<(BranchSource, String, String, u64)> = l
        .tables
        .targets
        .branches()
        .iter()
        .map(|b| {
            let f = l.image.function_at(b.target).unwrap();
            (b.source, b.from.clone(), f.name.clone(), b.target - f.addr)
        })
        .collect();
    for &(source, from, func, off) in want {
        let w = (source, from.to_string(), func.to_string(), off);
        assert!(got.contains(&w), "{w:?} not in {got:?}");
    }
}

#[test]
fn branches_from_elsewhere_are_collected() {
    if let Some(l) = linux_6_1() {
        assert_found(
            l,
            &[
                (BranchSource::ExFixup, "wrmsrl+0xb", "wrmsrl", 0xd),
                (
                    BranchSource::Alternative,
                    "perf_get_x86_pmu_capability+0x8",
                    "perf_get_x86_pmu_capability",
                    0xf,
                ),
                (
                    BranchSource::Outside,
                    "startup_64+0x5c",
                    "secondary_startup_64",
                    0xe,
                ),
            ],
        );
    }
    if let Some(l) = debian_6_12() {
        assert_found(
            l,
            &[
                (
                    BranchSource::JumpLabel,
                    "lbr_from_signext_quirk_wr+0x7",
                    "lbr_from_signext_quirk_wr",
                    0xe,
                ),
                (
                    BranchSource::ExFixup,
                    "hv_ghcb_negotiate_protocol+0xe",
                    "hv_ghcb_negotiate_protocol",
                    0x10,
                ),
            ],
        );
    }
}

#[test]
fn a_branch_from_elsewhere_into_the_displaced_bytes_is_refused() {
    const BASE: u64 = 0xffff_ffff_8100_0000;
    // push rbp; mov rbp,rsp; push rbx: 5 bytes displaced; pop rbx; pop rbp; ret
    let code = [0x55, 0x48, 0x89, 0xe5, 0x53, 0x5b, 0x5d, 0xc3];
    for (source, rule, text) in [
        (
            BranchSource::ExFixup,
            "ex-table-fixup",
            "the exception fixup of f+0x9",
        ),
        (
            BranchSource::JumpLabel,
            "jump-label-target",
            "the jump label at f+0x9",
        ),
        (
            BranchSource::Alternative,
            "alternative-branch",
            "a branch of the alternative at f+0x9",
        ),
        (
            BranchSource::Outside,
            "branch-from-outside",
            "the branch at f+0x9",
        ),
    ] {
        let tables = |to: u64| SiteTables {
            targets: BranchTargets::from_branches(vec![ForeignBranch {
                target: BASE + to,
                source,
                from: "f+0x9".into(),
            }]),
            ..SiteTables::default()
        };
        let r = DirectSite::analyze_code(BASE, &code, &tables(1)).unwrap_err();
        assert_eq!(
            r,
            Refusal::BranchInto {
                source,
                from: "f+0x9".into(),
                to: 1
            }
        );
        assert_eq!(r.rule(), rule);
        assert_eq!(
            r.to_string(),
            format!("{text} lands at +0x1, inside the displaced bytes")
        );
        // At the first displaced byte, or just past them: fine.
        for to in [0, 5] {
            assert!(DirectSite::analyze_code(BASE, &code, &tables(to)).is_ok());
        }
    }
}

#[test]
fn each_new_table_refuses_by_its_rule() {
    const BASE: u64 = 0xffff_ffff_8100_0000;
    let code = [0x55, 0x48, 0x89, 0xe5, 0x53, 0x5b, 0x5d, 0xc3];
    for (table, rule) in [
        (KernelTable::Paravirt, "paravirt"),
        (KernelTable::SmpLock, "smp-lock"),
        (KernelTable::CallDepth, "call-site"),
        (KernelTable::CfiSite, "cfi-site"),
        (KernelTable::StaticCallTramp, "static-call-trampoline"),
    ] {
        let mut tables = SiteTables::default();
        tables.insert(table, BASE + 2, 1);
        let r = DirectSite::analyze_code(BASE, &code, &tables).unwrap_err();
        assert_eq!(r, Refusal::Overlaps { table, at: 2 });
        assert_eq!(r.rule(), rule);
    }
}

/// A module added to the 6.1 guest's vmlinux (at link addresses: no
/// KASLR), five functions after their objtool `__pfx_` padding, each a
/// frame-pointer prologue: its own tables (a jump label and an exception
/// fixup in the displaced bytes, a `.noinstr.text`) and a LOCK prefix
/// refuse four by the kernel's rules; the fifth is safe.
#[test]
fn a_modules_own_tables_refuse_its_functions_by_the_kernels_rules() {
    use crate::kernel::kaslr::KernelOffset;
    use crate::kernel::module_tables::ModuleTables;
    use crate::kernel::modules::{LoadedModule, ModuleFunction, ModuleLayout};
    let Some(vmlinux) = path("vmlinux") else {
        return;
    };
    const TEXT: u64 = 0xffff_ffff_c000_1000;
    const PFX: u64 = 16;
    let prologue = [0x55, 0x48, 0x89, 0xe5, 0x53, 0x5b, 0x5d, 0xc3];
    // lock incl (%rdi); mov rax,[rdi+8]; ret
    let locked = [0xf0, 0xff, 0x07, 0x48, 0x8b, 0x47, 0x08, 0xc3];
    let names = ["m_jump", "m_fixup", "m_noinstr", "m_lock", "m_plain"];
    let (mut text, mut functions) = (Vec::new(), Vec::new());
    for name in names {
        let at = TEXT + text.len() as u64;
        text.extend([0x90; PFX as usize]);
        let code: &[u8] = if name == "m_lock" { &locked } else { &prologue };
        text.extend(code);
        functions.push(ModuleFunction {
            name: format!("__pfx_{name}"),
            addr: at,
            size: PFX,
        });
        functions.push(ModuleFunction {
            name: name.into(),
            addr: at + PFX,
            size: code.len() as u64,
        });
    }
    let start = |i: u64| TEXT + i * (PFX + 8) + PFX;
    let m = LoadedModule {
        name: "m".into(),
        addr: 0xffff_ffff_c100_0000,
        text: TEXT..TEXT + text.len() as u64,
        functions,
        sites: Vec::new(),
        events: Vec::new(),
        tables: ModuleTables {
            sites: vec![(start(0) + 1, KernelTable::JumpLabel)],
            fixups: vec![(start(4) + 6, start(1) + 2)],
            jumps: Vec::new(),
            keys: Vec::new(),
            noinstr: Some((start(2), start(3) - PFX)),
        },
    };
    let mut image = KernelImage::load(&vmlinux).unwrap();
    let offset = KernelOffset { virt: 0, phys: 0 };
    assert_eq!(
        image.add_modules(&[(m, text)], ModuleLayout::unused(), offset),
        10
    );
    let tables = SiteTables::read(&image).unwrap();
    let refusal = |name: &str| {
        let name = format!("{name} [m]");
        let i = image.functions.iter().position(|f| f.name == name).unwrap();
        DirectSite::analyze(&image, &tables, i)
            .err()
            .map(|r| r.rule())
    };
    assert_eq!(refusal("m_jump"), Some("jump-label"));
    assert_eq!(refusal("m_fixup"), Some("ex-table-fixup"));
    assert_eq!(refusal("m_noinstr"), Some("noinstr-text"));
    assert_eq!(refusal("m_lock"), Some("smp-lock"));
    assert_eq!(refusal("m_plain"), None);
}
