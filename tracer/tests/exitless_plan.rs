//! The exitless plan against the real mini guest images (guest/out/*.elf,
//! built by `bash guest/build.sh NAME`): the code vmtrace generates for
//! what each image is, before and after the kernel's offset is known.

use std::path::{Path, PathBuf};
use std::process::Command;

use iced_x86::{Instruction, Register};
use tracer::exitless::state::Exitless;
use tracer::kaslr::KernelOffset;
use tracer::symbols::KernelImage;

/// guest/out/NAME.elf, built by guest/build.sh (a no-op when up to date).
fn mini(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .args(["guest/build.sh", name])
        .current_dir(&root)
        .output()
        .unwrap_or_else(|e| panic!("cannot run bash guest/build.sh {name}: {e}"));
    assert!(
        out.status.success(),
        "guest/build.sh {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    root.join(format!("guest/out/{name}.elf"))
}

fn prepare(image: &KernelImage) -> Exitless {
    let (tx, _rx) = crossbeam_channel::unbounded();
    Exitless::prepare(image, 2, 3, Some(16), false, tx).unwrap_or_else(|e| panic!("{e}"))
}

/// The trampoline's read of the CPU number: `mov r10d, gs:[disp]`.
fn cpu_number_read(ex: &Exitless) -> Instruction {
    let read = *ex
        .trampoline
        .common_path
        .iter()
        .find(|i| i.segment_prefix() == Register::GS)
        .expect("a gs: read");
    assert_eq!(read.op0_register(), Register::R10D);
    assert_eq!(read.memory_base(), Register::None);
    read
}

#[test]
fn the_cpu_number_is_read_where_each_per_cpu_layout_puts_it() {
    let slide = KernelOffset {
        virt: 0x2a0_0000,
        phys: 0x2a0_0000,
    };
    // Up to Linux 6.14: an offset in the area, the same wherever KASLR
    // puts the kernel.
    let old = KernelImage::load(&mini("mini")).unwrap();
    assert_eq!(old.symbol("cpu_number").unwrap().addr, 0);
    let mut ex = prepare(&old);
    ex.resolve(slide).unwrap();
    assert_eq!(cpu_number_read(&ex).memory_displacement64(), 0);

    // 6.15+: a kernel address, where KASLR moved it.
    let new = KernelImage::load(&mini("mini-percpu-addr")).unwrap();
    let link = new.symbol("cpu_number").unwrap().addr;
    assert!(link >= 0xffff_ffff_8000_0000, "{link:#x}");
    let mut ex = prepare(&new);
    let stubs: Vec<u64> = (0..3).map(|k| ex.trampoline.stub_va(k)).collect();
    assert_eq!(cpu_number_read(&ex).memory_displacement64(), link);
    ex.resolve(slide).unwrap();
    assert_eq!(
        cpu_number_read(&ex).memory_displacement64(),
        link + 0x2a0_0000
    );
    // Regenerated in place: the sites' targets did not move.
    let after: Vec<u64> = (0..3).map(|k| ex.trampoline.stub_va(k)).collect();
    assert_eq!(after, stubs);
}
