//! Task layouts from the real guest kernels' BTF (Linux 6.1 and 6.12),
//! from the vmlinux and from the bzImage alone (its payload keeps `.BTF`),
//! checked against pahole's own reading of the same vmlinux and its symbol
//! table; and functions' prototypes as their argument registers hold them
//! (`--args`, `--retval`). A kernel not built is skipped with a message,
//! as elsewhere.

use std::path::{Path, PathBuf};
use std::process::Command;

use tracer::kernel::btf::KernelBtf;
use tracer::kernel::percpu::PerCpuLayout;
use tracer::kernel::symbols::KernelImage;
use tracer::kernel::task::TaskLayout;
use tracer::trace::model::{Param, Prototype, ValueKind};

fn guest(dir: &str, build: &str) -> Option<(PathBuf, PathBuf)> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../guest/out")
        .join(dir);
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

/// `(offset, size)` of `member` in `struct ty` as pahole prints it
/// (`/*   960     4 */`), from the vmlinux's BTF.
fn pahole(vmlinux: &Path, ty: &str, member: &str) -> (u32, u32) {
    let out = Command::new("pahole")
        .args(["-F", "btf", "-C", ty])
        .arg(vmlinux)
        .output()
        .expect("pahole (Debian's dwarves) must be installed: apt-get install dwarves");
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        let decl = line.split(';').next().unwrap_or("");
        let last = decl.split_whitespace().last().unwrap_or("");
        let name = last.split('[').next().unwrap_or("").trim_start_matches('*');
        // The first such member, at any depth: nested anonymous structs
        // and unions print deeper (offsets relative to them; the ones this
        // test reads sit at offset 0 of theirs).
        if name == member && line.starts_with('\t') && line.contains("/*") {
            let c = line.split("/*").nth(1).expect("an offset comment");
            let nums: Vec<u32> = c
                .split_whitespace()
                .filter_map(|w| w.trim_end_matches("*/").parse().ok())
                .collect();
            return (nums[0], nums[1]);
        }
    }
    panic!(
        "pahole shows no {ty}.{member} in {}:\n{text}",
        vmlinux.display()
    );
}

fn symbol(vmlinux: &Path, name: &str) -> Option<u64> {
    let out = Command::new("nm").arg(vmlinux).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let mut w = l.split_whitespace();
        let (addr, _, n) = (w.next()?, w.next()?, w.next()?);
        (n == name).then(|| u64::from_str_radix(addr, 16).unwrap())
    })
}

fn check(bz: &Path, vmlinux: &Path, current: &str) {
    let elf = KernelImage::load(vmlinux).unwrap();
    let from_elf = TaskLayout::find(&elf, &KernelBtf::from_image(&elf).unwrap()).unwrap();
    let (alone, _) = tracer::kernel::bzimage::load(bz).unwrap();
    let btf = KernelBtf::from_image(&alone).unwrap();
    let from_bz = TaskLayout::find(&alone, &btf).unwrap();
    // The bzImage's kallsyms have no data symbols (no KALLSYMS_ALL): the
    // per-CPU variable came from BTF's DATASEC, and it is the same.
    assert_eq!(from_bz, from_elf, "{}", bz.display());
    for (member, at) in [
        ("pid", from_elf.pid),
        ("tgid", from_elf.tgid),
        ("comm", from_elf.comm),
    ] {
        assert_eq!(
            pahole(vmlinux, "task_struct", member).0,
            at,
            "task_struct.{member}"
        );
    }
    assert_eq!(pahole(vmlinux, "task_struct", "comm").1, 16);
    assert_eq!(from_elf.current_var.layout, PerCpuLayout::Offset);
    assert_eq!(Some(from_elf.current_var.link), symbol(vmlinux, current));
    if current == "pcpu_hot" {
        assert_eq!(
            from_elf.current_member,
            pahole(vmlinux, "pcpu_hot", "current_task").0
        );
    } else {
        assert_eq!(from_elf.current_member, 0);
    }
}

#[test]
fn linux_6_1_task_layout_from_btf_matches_pahole() {
    if let Some((bz, vmlinux)) = guest("", "linux") {
        check(&bz, &vmlinux, "current_task");
    }
}

#[test]
fn linux_6_12_task_layout_from_btf_matches_pahole() {
    if let Some((bz, vmlinux)) = guest("linux-6.12", "linux-6.12") {
        check(&bz, &vmlinux, "pcpu_hot");
    }
}

fn param(name: &str, kind: ValueKind, reg: u8) -> Param {
    Param {
        name: name.into(),
        kind,
        reg,
    }
}

/// Prototypes of Linux functions, the same from the vmlinux and from the
/// bzImage alone, as `pfunct -F btf -P` prints them.
fn check_prototypes(bz: &Path, vmlinux: &Path) {
    let elf = KernelImage::load(vmlinux).unwrap();
    let btf = KernelBtf::from_image(&elf).unwrap();
    let (alone, _) = tracer::kernel::bzimage::load(bz).unwrap();
    let bz_btf = KernelBtf::from_image(&alone).unwrap();

    // void hrtimer_start_range_ns(struct hrtimer *timer, ktime_t tim,
    //                             u64 delta_ns, const enum hrtimer_mode mode)
    let hr = btf.prototype("hrtimer_start_range_ns").unwrap();
    assert_eq!(hr.ret, ValueKind::Void);
    assert!(hr.unshown.is_empty(), "{:?}", hr.unshown);
    assert_eq!(
        hr.params[..3],
        [
            param("timer", ValueKind::Pointer, 0),
            // ktime_t: a typedef of s64.
            param("tim", ValueKind::Signed(8), 1),
            param("delta_ns", ValueKind::Unsigned(8), 2),
        ]
    );
    let mode = &hr.params[3];
    assert_eq!((mode.name.as_str(), mode.reg), ("mode", 3));
    // Through `const`, the enum with its names.
    let ValueKind::Enum {
        size,
        signed,
        names,
    } = &mode.kind
    else {
        panic!("mode is an enum: {mode:?}")
    };
    assert_eq!((*size, *signed), (4, false));
    assert!(names.contains(&(0, "HRTIMER_MODE_ABS".into())));
    assert!(names.contains(&(1, "HRTIMER_MODE_REL".into())));
    assert!(names.contains(&(11, "HRTIMER_MODE_REL_PINNED_HARD".into())));

    // long do_sys_openat2(int dfd, const char *filename, struct open_how *how)
    assert_eq!(
        btf.prototype("do_sys_openat2"),
        Some(Prototype {
            params: vec![
                param("dfd", ValueKind::Signed(4), 0),
                param("filename", ValueKind::Pointer, 1),
                param("how", ValueKind::Pointer, 2),
            ],
            ret: ValueKind::Signed(8),
            unshown: Vec::new(),
        })
    );

    // Eight parameters: the last two on the stack.
    let seq = btf.prototype("seq_buf_hex_dump").unwrap();
    assert_eq!(seq.params.len(), 6);
    assert_eq!(seq.params[5], param("buf", ValueKind::Pointer, 5));
    assert_eq!(
        seq.unshown,
        [
            "len: not in a register (on the stack)",
            "ascii: not in a register (on the stack)"
        ]
    );
    assert_eq!(seq.ret, ValueKind::Signed(4));

    // pte_t, a struct of 8 bytes by value: one register.
    assert_eq!(
        btf.prototype("set_pte_vaddr"),
        Some(Prototype {
            params: vec![param("vaddr", ValueKind::Unsigned(8), 0)],
            ret: ValueKind::Void,
            unshown: vec!["pteval: a struct passed by value (RSI)".into()],
        })
    );

    for f in [
        "hrtimer_start_range_ns",
        "do_sys_openat2",
        "seq_buf_hex_dump",
    ] {
        assert_eq!(bz_btf.prototype(f), btf.prototype(f), "{f}");
    }
    // GCC's clones have no BTF of their own (another calling convention).
    let clone = elf
        .functions
        .iter()
        .find(|f| f.name.contains(".isra.") || f.name.contains(".constprop."))
        .expect("a GCC clone");
    assert_eq!(btf.prototype(&clone.name), None, "{}", clone.name);
}

#[test]
fn linux_6_1_prototypes_from_btf() {
    if let Some((bz, vmlinux)) = guest("", "linux") {
        check_prototypes(&bz, &vmlinux);
    }
}

#[test]
fn linux_6_12_prototypes_from_btf() {
    if let Some((bz, vmlinux)) = guest("linux-6.12", "linux-6.12") {
        check_prototypes(&bz, &vmlinux);
    }
}
