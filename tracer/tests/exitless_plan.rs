//! The exitless plan against the real mini guest images (guest/out/*.elf,
//! built by `bash guest/build.sh NAME`): the code vmtrace generates for
//! what each image is, before and after the kernel's offset is known.

use std::path::{Path, PathBuf};
use std::process::Command;

use iced_x86::{Code, Instruction, Mnemonic, Register};
use tracer::advice::{Remedy, TracerAdvice};
use tracer::kernel::kaslr::KernelOffset;
use tracer::kernel::symbols::KernelImage;
use tracer::plan::exitless::ret::Return;
use tracer::plan::exitless::{ExitlessPlan, Records};
use tracer::session::exitless::state::{Exitless, Resolved};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::gva::{AddressSpace, PagingMode};
use vmm::layout::KERNEL_MAP_BASE;

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

/// Guest memory with the VMM's boot page tables (the kernel map onto
/// physical 0) and the image's text where KASLR (`off`) put it.
fn guest(image: &KernelImage, off: KernelOffset) -> GuestMemoryMmap {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
    vmm::boot::regs::setup_page_tables(&mem).unwrap();
    let (start, end) = image.text.unwrap();
    let text = image.file_bytes(start, (end - start) as usize).unwrap();
    mem.write_slice(text, GuestAddress(off.runtime(start) - KERNEL_MAP_BASE))
        .unwrap();
    // And the flag `resolve` reads, as the file has it.
    if let Some(flag) = image.symbol("alternatives_patched") {
        let value = image.file_bytes(flag.addr, 4).unwrap();
        mem.write_slice(
            value,
            GuestAddress(off.runtime(flag.addr) - KERNEL_MAP_BASE),
        )
        .unwrap();
    }
    mem
}

/// `Exitless::resolve` on a guest that runs `image` at `off`.
fn resolve(ex: &mut Exitless, image: &KernelImage, off: KernelOffset) -> Resolved {
    let mem = guest(image, off);
    let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
    ex.resolve(&mut space, image, off)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn prepare(image: &KernelImage) -> Exitless {
    let (tx, _rx) = crossbeam_channel::unbounded::<Vec<tracer::trace::model::Event>>();
    let plain = Records {
        graph: false,
        tasks: &Default::default(),
        values: Default::default(),
        arg_sites: None,
        direct: false,
        added: 0,
        copies: None,
        child_exits: None,
    };
    Exitless::new(
        ExitlessPlan::build(image, 2, 3, Some(16), plain).unwrap_or_else(|e| panic!("{e}")),
        tx.into(),
    )
}

/// The trampoline's read of the CPU number: `mov r10d, gs:[disp]`.
fn cpu_number_read(ex: &Exitless) -> Instruction {
    let read = *ex
        .plan()
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
    assert_eq!(resolve(&mut ex, &old, slide), Resolved::Ready);
    assert_eq!(cpu_number_read(&ex).memory_displacement64(), 0);

    // 6.15+: a kernel address, where KASLR moved it.
    let new = KernelImage::load(&mini("mini-percpu-addr")).unwrap();
    let link = new.symbol("cpu_number").unwrap().addr;
    assert!(link >= 0xffff_ffff_8000_0000, "{link:#x}");
    let mut ex = prepare(&new);
    let stubs: Vec<u64> = (0..3).map(|k| ex.plan().trampoline.stub_va(k)).collect();
    assert_eq!(cpu_number_read(&ex).memory_displacement64(), link);
    assert_eq!(resolve(&mut ex, &new, slide), Resolved::Ready);
    assert_eq!(
        cpu_number_read(&ex).memory_displacement64(),
        link + 0x2a0_0000
    );
    // Regenerated in place: the sites' targets did not move.
    let after: Vec<u64> = (0..3).map(|k| ex.plan().trampoline.stub_va(k)).collect();
    assert_eq!(after, stubs);
}

/// A kernel whose returns go through a return thunk (the mini guest built
/// with -mfunction-return=thunk-extern; its `__fentry__` is ten one-byte
/// NOPs, as CALL_DEPTH_ACCOUNT before the kernel's alternatives, then
/// `jmp __x86_return_thunk`): vmtrace's code returns through the same thunk,
/// where KASLR put it, with no bare `ret` and no more instructions.
#[test]
fn the_code_returns_through_the_kernels_return_thunk() {
    let image = KernelImage::load(&mini("mini-rethunk")).unwrap();
    let thunk = image.symbol("__x86_return_thunk").unwrap().addr;
    for off in [
        KernelOffset::NONE,
        KernelOffset {
            virt: 0x200_0000,
            phys: 0x200_0000,
        },
    ] {
        let mut ex = prepare(&image);
        assert_eq!(
            ex.plan().ret(),
            Return::default(),
            "ret; int3 until resolved"
        );
        assert_eq!(resolve(&mut ex, &image, off), Resolved::Ready);
        assert_eq!(
            ex.plan().ret(),
            Return {
                depth: None,
                thunk: Some(off.runtime(thunk))
            }
        );
        let path = &ex.plan().trampoline.common_path;
        let last = path.last().unwrap();
        assert_eq!(last.code(), Code::Jmp_rel32_64);
        assert_eq!(last.near_branch_target(), off.runtime(thunk));
        // (23: the CPU number's bound check is two of them.)
        assert_eq!(path.len(), 23);
        assert!(path.iter().all(|i| i.mnemonic() != Mnemonic::Ret));
        println!("{}", ex.plan().trampoline.listing());
    }
    // Before the kernel applied its alternatives its returns may still
    // change: nothing is decided (nor `__fentry__` read: its padding is
    // more NOPs than any form after) until `alternatives_patched` is set.
    let mut ex = prepare(&image);
    let flag = image.symbol("alternatives_patched").unwrap().addr;
    let mem = guest(&image, KernelOffset::NONE);
    let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
    for (value, want) in [(0u32, Resolved::AlternativesPending), (1, Resolved::Ready)] {
        mem.write_obj(value, GuestAddress(flag - KERNEL_MAP_BASE))
            .unwrap();
        let got = ex.resolve(&mut space, &image, KernelOffset::NONE).unwrap();
        assert_eq!(got, want);
    }
    assert_eq!(ex.plan().ret().thunk, Some(thunk));
    // The default mini guest has no __fentry__: `ret; int3`.
    let plain = KernelImage::load(&mini("mini")).unwrap();
    let mut ex = prepare(&plain);
    resolve(&mut ex, &plain, KernelOffset::NONE);
    assert_eq!(ex.plan().ret(), Return::default());
    assert_eq!(
        ex.plan().trampoline.common_path.last().unwrap().mnemonic(),
        Mnemonic::Ret
    );
}

/// guest/out/NAME.elf without the symbols `strip`, as kallsyms without
/// CONFIG_KALLSYMS_ALL gives them (no data symbols), in a file of its own.
fn mini_without(name: &str, strip: &[&str]) -> KernelImage {
    // A file per call: tests running side by side may strip the same
    // symbols of the same guest, and one must not read the other's file
    // while objcopy writes it.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{}-{call}.elf",
        strip.join("-"),
        std::process::id()
    ));
    let mut cmd = Command::new("objcopy");
    for s in strip {
        cmd.arg(format!("--strip-symbol={s}"));
    }
    let status = cmd.arg(mini(name)).arg(&out).status().unwrap();
    assert!(status.success(), "objcopy");
    let image = KernelImage::load(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    for s in strip {
        assert!(image.symbol(s).is_none(), "{s} still there");
    }
    image
}

/// A kernel with return thunks whose symbols do not say when it applied
/// its alternatives: its compiled `jmp __x86_return_thunk` may be read
/// before the kernel rewrites it, so exitless is refused, before the guest
/// runs (the check `--mode auto` falls back to traps on) and, for a thunk
/// seen only in the running `__fentry__`, at the attach.
#[test]
fn return_thunks_without_alternatives_patched_are_refused() {
    let image = mini_without("mini-rethunk", &["alternatives_patched"]);
    let plain = Records {
        graph: false,
        tasks: &Default::default(),
        values: Default::default(),
        arg_sites: None,
        direct: false,
        added: 0,
        copies: None,
        child_exits: None,
    };
    let err = ExitlessPlan::build(&image, 2, 3, Some(16), plain).unwrap_err();
    assert_eq!(err.remedy(), Some(Remedy::TrapModeOrVmlinux));
    assert_eq!(
        err.to_string(),
        format!(
            "{}: the kernel has return thunks but no `alternatives_patched` symbol (kallsyms without \
             CONFIG_KALLSYMS_ALL?), so vmtrace cannot tell whether it has rewritten its returns yet; \
             trace in trap mode, or give its vmlinux",
            image.path.display()
        )
    );
    // The thunk under another name: known only at the attach.
    let image = mini_without(
        "mini-rethunk",
        &["alternatives_patched", "__x86_return_thunk"],
    );
    let fentry = image.symbol("__fentry__").unwrap().addr;
    let mut ex = prepare(&image);
    let mem = guest(&image, KernelOffset::NONE);
    let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
    let err = ex
        .resolve(&mut space, &image, KernelOffset::NONE)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!(
            "the guest's __fentry__ at {fentry:#x}: the kernel has return thunks but no `alternatives_patched`"
        )),
        "{err}"
    );
    assert!(!err.contains('\n'));
    // The code stays as it was planned: `ret; int3`.
    assert_eq!(ex.plan().ret(), Return::default());
}

/// `ModeChoice::Auto` on that kernel plans traps and says why, with the
/// remedy as data for the front end to word (`tracer::advice`), no flag.
#[test]
fn auto_mode_falls_back_to_traps_with_the_reason_as_data() {
    use tracer::plan::{Mode, ModeChoice, Note, Request, TracePlan};
    let image = mini_without("mini-rethunk", &["alternatives_patched"]);
    let path = image.path.display().to_string();
    let request = Request {
        trace: vec!["hrtimer_*".to_string()],
        notrace: Vec::new(),
        graph: false,
        mode: ModeChoice::Auto,
        ring_events: None,
        cpus: 2,
        emulator_host: false,
        linux: false,
        pids: Vec::new(),
        comm: None,
        args: Vec::new(),
        retval: false,
        stack: Vec::new(),
        entry: Default::default(),
        events: Vec::new(),
        module_events: Vec::new(),
    };
    let plan = TracePlan::build(image, &request).unwrap();
    assert!(matches!(plan.mode, Mode::Trap));
    let auto: Vec<_> = plan
        .notes
        .iter()
        .filter_map(|n| match n {
            Note::AutoTrap { why, remedy } => Some((why.as_str(), *remedy)),
            _ => None,
        })
        .collect();
    let why = format!(
        "{path}: the kernel has return thunks but no `alternatives_patched` symbol (kallsyms \
         without CONFIG_KALLSYMS_ALL?), so vmtrace cannot tell whether it has rewritten its \
         returns yet"
    );
    assert_eq!(auto, [(why.as_str(), Some(Remedy::TrapModeOrVmlinux))]);
}
