//! Task layouts from the real guest kernels' BTF (Linux 6.1 and 6.12),
//! from the vmlinux and from the bzImage alone (its payload keeps `.BTF`),
//! checked against pahole's own reading of the same vmlinux and its symbol
//! table. A kernel not built is skipped with a message, as elsewhere.

use std::path::{Path, PathBuf};
use std::process::Command;

use tracer::kernel::btf::KernelBtf;
use tracer::kernel::percpu::PerCpuLayout;
use tracer::kernel::symbols::KernelImage;
use tracer::kernel::task::TaskLayout;

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
