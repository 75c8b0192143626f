//! Task layouts from DWARF (`.debug_info`) equal those from BTF, on the
//! real guest kernels (Linux 6.1: `current_task`; 6.12: `pcpu_hot`) and the
//! mini guest (built with -g), and a vmlinux without `.BTF` gets its
//! layout from DWARF. A kernel not built is skipped with a message, as
//! elsewhere.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use tracer::kernel::btf::KernelBtf;
use tracer::kernel::dwarf::KernelDwarf;
use tracer::kernel::symbols::KernelImage;
use tracer::kernel::task::TaskLayout;
use tracer::plan::tasks::TaskPlan;

fn built(rel: &str, build: &str) -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../guest/out")
        .join(rel);
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

/// The layout from DWARF, checked equal to BTF's; how long DWARF took.
fn same_layout(path: &Path) -> TaskLayout {
    let image = KernelImage::load(path).unwrap();
    let btf = TaskLayout::find(&image, &KernelBtf::from_image(&image).unwrap()).unwrap();
    let t = Instant::now();
    let dwarf = KernelDwarf::from_image(&image).unwrap();
    let from_dwarf = TaskLayout::find(&image, &dwarf).unwrap();
    eprintln!(
        "{}: task layout from DWARF in {:?}",
        path.display(),
        t.elapsed()
    );
    assert_eq!(from_dwarf, btf, "{}", path.display());
    // The sizes as well: the same members, the same widths.
    for (ty, member, size) in [
        ("task_struct", "pid", 4),
        ("task_struct", "tgid", 4),
        ("task_struct", "comm", 16),
    ] {
        assert_eq!(
            dwarf.member(ty, member).unwrap().size,
            size,
            "{ty}.{member}"
        );
    }
    btf
}

#[test]
fn linux_6_1_task_layout_from_dwarf_is_btfs() {
    if let Some(vmlinux) = built("vmlinux", "linux") {
        let l = same_layout(&vmlinux);
        assert_eq!(l.current_member, 0, "6.1 has `current_task`");
    }
}

#[test]
fn linux_6_12_task_layout_from_dwarf_is_btfs() {
    if let Some(vmlinux) = built("linux-6.12/vmlinux", "linux-6.12") {
        let l = same_layout(&vmlinux);
        let image = KernelImage::load(&vmlinux).unwrap();
        let dwarf = KernelDwarf::from_image(&image).unwrap();
        let at = dwarf.member("pcpu_hot", "current_task").unwrap();
        assert_eq!((at.offset, at.size), (l.current_member, 8));
    }
}

#[test]
fn mini_task_layout_from_dwarf_is_btfs() {
    if let Some(elf) = built("mini.elf", "mini") {
        same_layout(&elf);
    }
}

#[test]
fn a_vmlinux_without_btf_gets_its_layout_from_dwarf() {
    let Some(vmlinux) = built("vmlinux", "linux") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("vmtrace-dwarf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (no_btf, neither) = (dir.join("vmlinux-no-btf"), dir.join("vmlinux-neither"));
    // `.BTF` is renamed, not removed: symbols (`__start_BTF`) point into it.
    let objcopy = |out: &Path, args: &[&str]| {
        let st = Command::new("objcopy")
            .args(args)
            .arg(&vmlinux)
            .arg(out)
            .status()
            .expect("objcopy (binutils)");
        assert!(st.success(), "objcopy {args:?}");
    };
    objcopy(&no_btf, &["--rename-section=.BTF=.notBTF"]);
    objcopy(
        &neither,
        &["--rename-section=.BTF=.notBTF", "--strip-debug"],
    );

    let want = same_layout(&vmlinux);
    let image = KernelImage::load(&no_btf).unwrap();
    let btf = KernelBtf::from_image(&image);
    assert!(btf.is_err());
    let plan = TaskPlan::find(&image, btf.as_ref());
    assert_eq!(plan.note, format!("from the DWARF of {}", no_btf.display()));
    assert_eq!(plan.layout, Some(want));

    let image = KernelImage::load(&neither).unwrap();
    let btf = KernelBtf::from_image(&image);
    let plan = TaskPlan::find(&image, btf.as_ref());
    assert_eq!(plan.layout, None);
    assert_eq!(
        plan.note,
        format!(
            "none: {} has no BTF (.BTF section) nor DWARF (.debug_info): build the kernel \
             with CONFIG_DEBUG_INFO_BTF=y",
            neither.display()
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
