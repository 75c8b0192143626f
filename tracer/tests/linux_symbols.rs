//! Symbols from a bzImage alone, on the real guest kernels (Linux 6.1 and
//! 6.12, LZ4 payloads): the payload decompresses to the vmlinux's own
//! sections, kallsyms decodes to the vmlinux's symbols, and the
//! `__mcount_loc` table found by the scan is exactly the vmlinux's.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
use tracer::kernel::kallsyms::Layout;
use tracer::kernel::payload::Compression;
use tracer::kernel::sites::SiteTable;
use tracer::kernel::symbols::KernelImage;
use tracer::plan::list::{Kind, Listing};

fn guest_out() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../guest/out")
}

/// A built guest's bzImage and vmlinux, or None (with a message saying how to
/// build it) when it is not built.
fn guest(dir: &str, build: &str) -> Option<(PathBuf, PathBuf)> {
    let d = guest_out().join(dir);
    let (bz, vmlinux) = (d.join("bzImage"), d.join("vmlinux"));
    if bz.is_file() && vmlinux.is_file() {
        Some((bz, vmlinux))
    } else {
        eprintln!(
            "SKIPPED: {} is not built; run `bash guest/build.sh {build}`",
            bz.display()
        );
        None
    }
}

/// Every (name, address) of the vmlinux's symbol table.
fn elf_symbols(vmlinux: &Path) -> HashSet<(String, u64)> {
    let data = std::fs::read(vmlinux).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    obj.symbols()
        .filter_map(|s| Some((s.name().ok()?.to_string(), s.address())))
        .collect()
}

fn check_kernel(bz: &Path, vmlinux: &Path, layout: Layout) {
    // The payload is the vmlinux, stripped: the same sections, byte for byte.
    let t = Instant::now();
    let payload = tracer::kernel::payload::extract(bz).unwrap();
    eprintln!(
        "{}: {} payload, {} bytes, decompressed in {:?} (extract {:?})",
        bz.display(),
        payload.compression,
        payload.elf.len(),
        payload.elapsed,
        t.elapsed()
    );
    assert_eq!(payload.compression, Compression::Lz4);
    let reference = KernelImage::load(vmlinux).unwrap();
    let stripped = object::File::parse(&*payload.elf).unwrap();
    for name in [".text", ".rodata", ".init.data", ".data"] {
        let s = stripped.section_by_name(name).unwrap();
        let bytes = s.data().unwrap();
        assert_eq!(
            Some(bytes),
            reference.file_bytes(s.address(), bytes.len()),
            "{name} differs from the vmlinux's"
        );
    }

    let t = Instant::now();
    let (image, info) = tracer::kernel::bzimage::load(bz).unwrap();
    eprintln!(
        "{}: {} kallsyms ({}), {} functions, __mcount_loc {:#x}..{:#x}, loaded in {:?}",
        bz.display(),
        info.kallsyms,
        info.layout,
        image.functions.len(),
        info.mcount_loc.0,
        info.mcount_loc.1,
        t.elapsed()
    );
    assert_eq!(info.layout, layout);
    assert_eq!(image.build_id, reference.build_id);
    // The scanned table is __start_mcount_loc..__stop_mcount_loc but for
    // the entries the build zeroed (sorted first; 6.12 has some).
    let start = reference.symbol("__start_mcount_loc").unwrap().addr;
    let stop = reference.symbol("__stop_mcount_loc").unwrap().addr;
    let zeroed = reference.mcount_loc.iter().take_while(|&&a| a == 0).count();
    assert_eq!(info.mcount_loc, (start + 8 * zeroed as u64, stop));
    assert_eq!(image.mcount_loc, reference.mcount_loc[zeroed..]);

    // Every kallsyms function is a symbol of the vmlinux, at its address.
    let elf = elf_symbols(vmlinux);
    for f in &image.functions {
        assert!(
            elf.contains(&(f.name.clone(), f.addr)),
            "{} at {:#x} is not in the vmlinux",
            f.name,
            f.addr
        );
    }
    for name in ["_stext", "_etext", "_sinittext", "_einittext", "__fentry__"] {
        assert_eq!(
            image.symbol(name).map(|s| s.addr),
            reference.symbol(name).map(|s| s.addr),
            "{name}"
        );
    }
    assert_eq!(image.init_text, reference.init_text);
    assert_eq!(image.text, reference.text);

    // The same sites, each in a function at the same address.
    let ours = SiteTable::build(&image).unwrap();
    let theirs = SiteTable::build(&reference).unwrap();
    let addrs = |t: &SiteTable, img: &KernelImage| -> Vec<(u64, u64, bool)> {
        t.sites
            .iter()
            .map(|s| (s.addr, img.functions[s.func as usize].addr, s.init))
            .collect()
    };
    assert_eq!(addrs(&ours, &image), addrs(&theirs, &reference));
    assert!(ours.len() > 5000, "{} sites", ours.len());
    check_listing(&image, &ours, &reference, &theirs, vmlinux);
    let rodata = stripped.section_by_name(".rodata").unwrap();
    let table = tracer::kernel::kallsyms::find(rodata.data().unwrap(), rodata.address()).unwrap();
    check_names(&image, &ours, &reference, &theirs, &table.entries);
    // The entries left out are the code of overridden __weak functions,
    // named alike from either symbol source (not after the function before
    // them, which kallsyms' sizes would reach over them).
    assert_eq!(ours.rejected, theirs.rejected);
    assert_eq!(ours.weak, ours.rejected, "{:?}", ours.rejected_summary());
    assert_eq!(
        theirs.weak,
        theirs.rejected,
        "{:?}",
        theirs.rejected_summary()
    );
    assert_eq!(ours.rejected_examples, theirs.rejected_examples);
    assert_eq!(ours.rejected_summary(), theirs.rejected_summary());
    eprintln!("{}: {:?}", bz.display(), ours.rejected_summary());
    let hr = image.symbol("hrtimer_interrupt").unwrap();
    assert_eq!(
        Some(hr.addr),
        reference.symbol("hrtimer_interrupt").map(|s| s.addr)
    );
}

/// `vmtrace list` of the bzImage alone names the functions as `vmtrace
/// list` of the vmlinux: every alias under each name (`__x64_sys_getpid`
/// and `__do_sys_getpid`), no assembler local label (`.E_copy`) or section
/// bound (`_etext`); the same traceable and init-only lines. What kallsyms
/// cannot tell apart is exactly this: kallsyms-only lines are labels inside
/// assembly functions (untyped, size 0 in the vmlinux: `nmi_restore`), and
/// vmlinux-only ones are functions of `.exit.text`, which kallsyms leaves out.
fn check_listing(
    image: &KernelImage,
    sites: &SiteTable,
    reference: &KernelImage,
    reference_sites: &SiteTable,
    vmlinux: &Path,
) {
    let lines = |img: &KernelImage, t: &SiteTable| -> HashSet<(String, Kind)> {
        let l = Listing::new(img, t, &[]).unwrap();
        l.functions
            .iter()
            .map(|f| (f.name.to_string(), f.kind))
            .collect()
    };
    let ours = lines(image, sites);
    let theirs = lines(reference, reference_sites);
    for name in ["__x64_sys_getpid", "__do_sys_getpid"] {
        assert!(ours.contains(&(name.into(), Kind::Traceable)), "{name}");
        assert!(theirs.contains(&(name.into(), Kind::Traceable)), "{name}");
    }
    assert!(!ours
        .iter()
        .any(|(n, _)| n.starts_with('.') || n == "_etext"));
    let data = std::fs::read(vmlinux).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let labels: HashSet<&str> = elf
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Unknown && s.size() == 0)
        .filter_map(|s| s.name().ok())
        .collect();
    let exit_text = elf.section_by_name(".exit.text").map(|s| s.index());
    let exit_functions: HashSet<&str> = elf
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.section_index() == exit_text)
        .filter_map(|s| s.name().ok())
        .collect();
    let only_ours: Vec<_> = ours.difference(&theirs).collect();
    let only_theirs: Vec<_> = theirs.difference(&ours).collect();
    for (name, kind) in &only_ours {
        assert!(
            *kind == Kind::NoSite && labels.contains(name.as_str()),
            "{name} ({kind:?}) is listed from kallsyms only, and is no label of the vmlinux"
        );
    }
    for (name, kind) in &only_theirs {
        assert!(
            *kind == Kind::NoSite && exit_functions.contains(name.as_str()),
            "{name} ({kind:?}) is listed from the vmlinux only, and is no .exit.text function"
        );
    }
    eprintln!(
        "{} names listed from kallsyms, {} from the vmlinux; {} labels only from kallsyms, \
         {} .exit.text functions only from the vmlinux",
        ours.len(),
        theirs.len(),
        only_ours.len(),
        only_theirs.len()
    );
}

/// Every site's function has the same name from either symbol source, and
/// it is the name the kernel gives its address: the first at that address
/// in the kernel's own kallsyms table (what `kallsyms_lookup`, and so
/// ftrace and trace-cmd, print). Aliases are where this can differ: a
/// syscall stub and its body (`__do_sys_getpid` and `__x64_sys_getpid`), a
/// weak alias (`blake2s_compress` of `blake2s_compress_generic`). (Before,
/// the vmlinux preferred a global name and its symbol table's order.)
fn check_names(
    image: &KernelImage,
    sites: &SiteTable,
    reference: &KernelImage,
    reference_sites: &SiteTable,
    kallsyms: &[tracer::kernel::kallsyms::KallsymsEntry],
) {
    let mut kernel_name: HashMap<u64, &str> = HashMap::new();
    for e in kallsyms {
        kernel_name.entry(e.addr).or_insert(&e.name);
    }
    let mut aliased = 0;
    for (s, r) in sites.sites.iter().zip(&reference_sites.sites) {
        let ours = &image.functions[s.func as usize];
        let theirs = &reference.functions[r.func as usize];
        assert_eq!(
            (ours.name.as_str(), ours.addr),
            (theirs.name.as_str(), theirs.addr),
            "site {:#x}: kallsyms and vmlinux name its function differently",
            s.addr
        );
        assert_eq!(
            Some(&ours.name.as_str()),
            kernel_name.get(&ours.addr),
            "site {:#x}: not the kernel's name",
            s.addr
        );
        aliased += usize::from(image.names(s.func as usize).nth(1).is_some());
    }
    assert!(aliased > 10, "{aliased} sites in functions with aliases");
    let named = |img: &KernelImage, alias: &str| {
        let addr = img.symbol(alias).unwrap().addr;
        let i = tracer::kernel::symbols::function_index_at(&img.functions, addr).unwrap();
        img.functions[i].name.clone()
    };
    for (alias, name) in [
        ("__x64_sys_getpid", "__do_sys_getpid"),
        ("blake2s_compress", "blake2s_compress_generic"),
    ] {
        assert_eq!(named(image, alias), name);
        assert_eq!(named(reference, alias), name);
    }
    eprintln!("{aliased} sites in functions with aliases, named as the kernel names them");
}

#[test]
fn linux_6_1_bzimage_alone_gives_the_vmlinux_symbols_and_sites() {
    let Some((bz, vmlinux)) = guest("", "linux") else {
        return;
    };
    // Debian's 6.1 has seqs_of_names backported.
    check_kernel(&bz, &vmlinux, Layout::OffsetsFirst { seqs: true });
}

#[test]
fn linux_6_12_bzimage_alone_gives_the_vmlinux_symbols_and_sites() {
    let Some((bz, vmlinux)) = guest("linux-6.12", "linux-6.12") else {
        return;
    };
    check_kernel(&bz, &vmlinux, Layout::OffsetsAfterTokens);
}

/// The report header says where the symbols came from, right after the
/// build id; a trace that does not know (a saved one) has no such line.
#[test]
fn report_header_names_the_symbol_source() {
    use tracer::trace::report::{render, ReportOptions};
    let mut t = tracer::trace::model::Trace::synthetic(1000);
    let plain = render(&t, &ReportOptions::default());
    assert!(!plain.contains("# symbols:"), "{plain}");
    t.meta.symbols = "kallsyms in the lz4 payload of /tmp/k/bzImage (no vmlinux found)".into();
    let out = render(&t, &ReportOptions::default());
    let lines: Vec<&str> = out.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("# symbols:"))
        .unwrap();
    assert!(lines[at - 1].starts_with("# build id:"), "{out}");
    assert!(lines[at].ends_with("(no vmlinux found)"), "{out}");
}
