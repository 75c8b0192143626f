//! What a fault may not change in a QEMU guest vmtrace attached to: the
//! bytes it may write (the low MiB its pages live in, the kernel's text its
//! sites are in), read while no vmtrace holds QMP; its gdbstub; the guest's
//! liveness and its console.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::elf_symbol;
use super::qemu::{QemuGuest, QemuOpts, Workload, COMMAND_TIMEOUT};
use tracer::kernel::symbols::KernelImage;
use tracer::qemu::procmem::ProcRam;
use tracer::qemu::qmp::{Qmp, RamRange};
use tracer::qemu::queries::Queries;

/// What a kernel prints when something went wrong.
pub const BAD: [&str; 5] = ["WARNING:", "BUG:", "ftrace bug", "Oops", "Kernel panic"];
/// The kernel image's virtual base (`__START_KERNEL_map`).
pub const KERNEL_MAP: u64 = 0xffff_ffff_8000_0000;
/// Physical KASLR moves the kernel in steps of 2 MiB.
pub const KASLR_ALIGN: u64 = 2 << 20;
/// The project's 6.1 guest booted in QEMU (`opts`), its worker ready, and
/// the bytes of its kernel vmtrace may write, read before any attach: the
/// bzImage to attach with, the kernel, the guest, its workload, the bytes.
pub fn boot_linux(opts: QemuOpts) -> (PathBuf, Kernel, QemuGuest, Workload, Memory) {
    let (bz, vmlinux) = super::linux_61();
    let kernel = Kernel::new(&vmlinux);
    let guest = QemuGuest::boot(opts);
    let w = guest.wait_ready().unwrap();
    let (before, _) = kernel.read(guest.qmp_socket());
    (bz, kernel, guest, w, before)
}

/// The guest runs on, answers, and its console has no kernel complaint.
pub fn assert_runs_on(guest: &QemuGuest, worker: u32) {
    guest.send_line("ping");
    guest
        .wait_for(&format!("workload: pong pid={worker}"), COMMAND_TIMEOUT)
        .unwrap();
    guest.go("getpid", 10).unwrap();
    super::console::assert_no_complaint(&guest.console(), &BAD, "");
}

/// The guest memory vmtrace may touch: the low MiB (its pages) and the
/// kernel's text (its sites), read through QMP and /proc/PID/mem while no
/// vmtrace is connected (QMP serves one client at a time).
#[derive(PartialEq, Eq)]
pub struct Memory {
    /// Guest-physical address and bytes of each RAM piece.
    pub pieces: Vec<(u64, Vec<u8>)>,
}

/// Where the kernel runs and what to compare, from its vmlinux.
pub struct Kernel {
    pub vmlinux: PathBuf,
    /// `_stext`, `_etext` (link addresses).
    pub text: (u64, u64),
    /// `linux_banner`'s link address and bytes.
    pub banner: (u64, Vec<u8>),
}

impl Kernel {
    pub fn new(vmlinux: &Path) -> Kernel {
        let image = KernelImage::load(vmlinux).unwrap();
        let b = image.symbol("linux_banner").expect("linux_banner");
        let bytes = image.file_bytes(b.addr, 64).unwrap().to_vec();
        Kernel {
            vmlinux: vmlinux.to_owned(),
            text: (elf_symbol(vmlinux, "_stext"), elf_symbol(vmlinux, "_etext")),
            banner: (b.addr, bytes),
        }
    }

    /// From a bzImage alone (its kallsyms), as vmtrace reads it.
    pub fn from_bzimage(bz: &Path) -> Kernel {
        let file = vmm::boot::KernelFile::open(bz).unwrap();
        let image = tracer::kernel::find::kernel_image(&file, tracer::kernel::find::Given::Nothing)
            .unwrap()
            .image;
        let b = image.symbol("linux_banner").expect("linux_banner");
        let bytes = image.file_bytes(b.addr, 64).unwrap().to_vec();
        let sym = |n: &str| image.symbol(n).unwrap_or_else(|| panic!("{n}")).addr;
        Kernel {
            vmlinux: bz.to_owned(),
            text: (sym("_stext"), sym("_etext")),
            banner: (b.addr, bytes),
        }
    }

    /// The kernel's physical KASLR offset: the one 2 MiB step at which RAM
    /// holds its banner.
    pub fn phys_offset(&self, ram: &ProcRam) -> u64 {
        let link = self.banner.0 - KERNEL_MAP;
        let mut buf = vec![0u8; self.banner.1.len()];
        let hits: Vec<u64> = (0..128)
            .map(|i| i * KASLR_ALIGN)
            .filter(|off| ram.read(link + off, &mut buf).is_ok() && buf == self.banner.1)
            .collect();
        assert_eq!(
            hits.len(),
            1,
            "{}'s banner at steps {hits:x?}",
            self.vmlinux.display()
        );
        hits[0]
    }

    /// Find the kernel in the guest's RAM (through QMP: no vmtrace may be
    /// connected) and open that RAM for [`Watch::read`].
    pub fn watch(&self, qmp_path: &Path) -> Watch {
        let mut qmp = Qmp::connect(qmp_path, Duration::from_secs(10)).unwrap();
        let layout = qmp.ram_layout().unwrap();
        self.watch_ram(&layout, qmp.pid().unwrap())
    }

    /// [`Kernel::watch`] of the QEMU `pid` whose RAM is at `layout` (a
    /// libvirt domain's: its monitor is libvirt's).
    pub fn watch_ram(&self, layout: &[RamRange], pid: u32) -> Watch {
        let ram = ProcRam::open(pid, layout).unwrap();
        let phys = self.phys_offset(&ram);
        let text = (
            self.text.0 - KERNEL_MAP + phys,
            self.text.1 - KERNEL_MAP + phys,
        );
        let mut areas = Vec::new();
        for (start, end) in [(0, LOW), text] {
            for r in layout {
                let (a, b) = (start.max(r.gpa), end.min(r.gpa + r.len));
                if a < b {
                    areas.push((a, b));
                }
            }
        }
        assert!(
            areas.iter().any(|p| p.0 == text.0),
            "text {text:x?} not in RAM {layout:?}"
        );
        Watch { ram, areas, phys }
    }

    /// The low MiB and the kernel's text now, and the physical offset.
    pub fn read(&self, qmp_path: &Path) -> (Memory, u64) {
        let w = self.watch(qmp_path);
        (w.read(), w.phys)
    }
}

/// The low MiB vmtrace's pages live in.
pub const LOW: u64 = 1 << 20;

/// Guest RAM the kernel's and vmtrace's bytes are in, readable while
/// vmtrace is attached (/proc/PID/mem, opened before).
pub struct Watch {
    pub ram: ProcRam,
    /// Guest-physical `[start, end)` pieces: the low MiB's RAM, the text.
    pub areas: Vec<(u64, u64)>,
    pub phys: u64,
}

impl Watch {
    pub fn read(&self) -> Memory {
        let pieces = self
            .areas
            .iter()
            .map(|&(a, b)| {
                let mut buf = vec![0u8; (b - a) as usize];
                self.ram.read(a, &mut buf).unwrap();
                (a, buf)
            })
            .collect();
        Memory { pieces }
    }
}

/// Guest-physical addresses whose bytes differ, with both values.
pub fn diffs(before: &Memory, after: &Memory) -> Vec<(u64, u8, u8)> {
    assert_eq!(before.pieces.len(), after.pieces.len());
    let mut out = Vec::new();
    for ((gpa, a), (gpb, b)) in before.pieces.iter().zip(&after.pieces) {
        assert_eq!((gpa, a.len()), (gpb, b.len()));
        let at = a.iter().zip(b).enumerate().filter(|(_, (x, y))| x != y);
        out.extend(at.map(|(i, (x, y))| (gpa + i as u64, *x, *y)));
    }
    out
}

/// Both reads hold the same bytes; else the first differing addresses.
pub fn assert_same(before: &Memory, after: &Memory, when: &str) {
    let d = diffs(before, after);
    let first: Vec<String> = d
        .iter()
        .take(32)
        .map(|(at, x, y)| format!("{at:#x}: {x:#04x} -> {y:#04x}"))
        .collect();
    assert!(
        d.is_empty(),
        "guest memory changed {when} at {} bytes: {}",
        d.len(),
        first.join(", ")
    );
}

/// The x86 NOPs a kernel's jump label holds while its key is off
/// (`arch/x86/kernel/jump_label.c`: 2- or 5-byte, P6 or K8 form).
const LABEL_NOPS: [&[u8]; 3] = [
    &[0x66, 0x90],
    &[0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x66, 0x66, 0x66, 0x66, 0x90],
];

/// Whether the bytes at `i` of `piece` (guest-physical `gpa`) changed as
/// the guest's own static key changes them: a label NOP in one read and a
/// `jmp` of the same length in the other, landing inside the same piece
/// (the kernel's text). vmtrace's own jumps (direct entries) land in its
/// region far above the text, so a jump left by vmtrace is never taken
/// for the guest's.
fn guest_label_at(a: &[u8], b: &[u8], i: usize) -> Option<usize> {
    let (len, text) = (a.len(), a.len() as i64);
    LABEL_NOPS.iter().find_map(|nop| {
        let n = nop.len();
        let end = i + n;
        if end > len {
            return None;
        }
        let (x, y) = (&a[i..end], &b[i..end]);
        let jump = if x == *nop {
            y
        } else if y == *nop {
            x
        } else {
            return None;
        };
        let rel = match (n, jump[0]) {
            (2, 0xeb) => i64::from(jump[1] as i8),
            (5, 0xe9) => i64::from(i32::from_le_bytes(jump[1..5].try_into().unwrap())),
            _ => return None,
        };
        let target = (end as i64) + rel;
        (0..text).contains(&target).then_some(n)
    })
}

/// `assert_same`, but for the guest's own static-key flips meanwhile
/// (`guest_label_at`): a loaded host can make a guest change a key (its
/// clocksource watchdog, for one) while vmtrace is attached, and those
/// bytes are not vmtrace's. Returns how many label sites the guest flipped.
pub fn assert_same_but_guest_labels(before: &Memory, after: &Memory, when: &str) -> usize {
    let mut flipped = 0;
    let mut left = Vec::new();
    for ((gpa, a), (_, b)) in before.pieces.iter().zip(&after.pieces) {
        let mut i = 0;
        while i < a.len() {
            if a[i] == b[i] {
                i += 1;
                continue;
            }
            // The site may start a few bytes before the first difference.
            let site = (i.saturating_sub(4)..=i).find_map(|s| Some((s, guest_label_at(a, b, s)?)));
            match site {
                Some((s, n)) if s + n > i => {
                    flipped += 1;
                    i = s + n;
                }
                _ => {
                    left.push(format!(
                        "{:#x}: {:#04x} -> {:#04x}",
                        gpa + i as u64,
                        a[i],
                        b[i]
                    ));
                    i += 1;
                }
            }
        }
    }
    assert!(
        left.is_empty(),
        "guest memory changed {when} at {} bytes: {}",
        left.len(),
        left.iter().take(32).cloned().collect::<Vec<_>>().join(", ")
    );
    flipped
}

/// No chardev of vmtrace's gdbstub (id `gdb`, its socket) is left in
/// QEMU. QEMU's first `gdbserver` also makes the stub's monitor chardev
/// (`#chrN: filename=gdb`), which QEMU keeps for its lifetime and offers no
/// way to remove: that one may stay.
pub fn assert_no_gdbstub(qmp: &Path) {
    let list = Qmp::connect(qmp, Duration::from_secs(10))
        .unwrap()
        .hmp("info chardev")
        .unwrap();
    assert!(
        !list
            .lines()
            .any(|l| l.starts_with("gdb:") || l.contains("vmtrace-gdb")),
        "{list}"
    );
}

/// Every byte that differed while vmtrace was attached (`during`: its pages,
/// its sites) is as `before` again in `after`; bytes the guest itself
/// changed meanwhile (a suspend's jump labels, its wake-up data) are not
/// vmtrace's and may differ.
pub fn assert_restored(before: &Memory, during: &Memory, after: &Memory, when: &str) {
    let touched: std::collections::BTreeSet<u64> =
        diffs(before, during).into_iter().map(|d| d.0).collect();
    assert!(!touched.is_empty(), "vmtrace's bytes unseen while attached");
    let left: Vec<String> = diffs(before, after)
        .into_iter()
        .filter(|d| touched.contains(&d.0))
        .take(32)
        .map(|(at, x, y)| format!("{at:#x}: {x:#04x} -> {y:#04x}"))
        .collect();
    assert!(
        left.is_empty(),
        "vmtrace's bytes not restored {when}: {}",
        left.join(", ")
    );
}
