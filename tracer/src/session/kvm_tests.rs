//! `Tracer::attach` on the mini guest under a real pause (real KVM).

use std::path::{Path, PathBuf};
use std::process::Command;

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::{Attach, NotReady, Plan, Tracer};
use crate::kernel::sites::FENTRY;
use crate::kernel::symbols::Symbol;

/// guest/out/mini.elf, built (or found up to date) by guest/build.sh.
fn mini_elf() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .args(["guest/build.sh", "mini"])
        .current_dir(&root)
        .output()
        .expect("cannot run bash guest/build.sh mini");
    assert!(
        out.status.success(),
        "guest/build.sh mini failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    root.join("guest/out/mini.elf")
}

/// guest/out/NAME.elf of a variant of the mini guest (`guest/build.sh NAME`).
pub(in crate::session) fn mini_variant(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .args(["guest/build.sh", name])
        .current_dir(&root)
        .output()
        .expect("cannot run bash guest/build.sh");
    assert!(
        out.status.success(),
        "guest/build.sh {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    root.join(format!("guest/out/{name}.elf"))
}

pub(in crate::session) fn mini_vm(kernel: &Path) -> vmm::Vm {
    vmm::Vm::create(vmm::VmConfig {
        kernel: vmm::boot::KernelFile::open(kernel).unwrap(),
        initrd: None,
        size: vmm::VmSize::new(1, 64).unwrap(),
        cmdline: "mode=loop".into(),
        console: Box::new(std::io::sink()),
        timeout: Some(std::time::Duration::from_secs(60)),
        hide_hypercalls: false,
    })
    .unwrap()
}

/// Every byte of guest memory, vmtrace's own slot included.
pub(in crate::session) fn all_bytes(mem: &GuestMemoryMmap) -> Vec<u8> {
    let mut out = Vec::new();
    for r in mem.iter() {
        let mut b = vec![0u8; r.len() as usize];
        mem.read_slice(&mut b, r.start_addr()).unwrap();
        out.extend(b);
    }
    out
}

/// An exitless attach that finds a site still calling `__fentry__` (a Linux
/// guest whose ftrace_init is converting) leaves guest memory as it was:
/// before, vmtrace's page-directory entries, code and rings were written
/// first and the sites checked after.
#[test]
fn a_not_ready_exitless_attach_leaves_guest_memory_untouched() {
    let kernel = mini_elf();
    let mut plan = Plan::new(&kernel, &["*".to_string()], &[]).unwrap();
    // Make the mini guest look like a Linux kernel that converts its own
    // sites: a `__fentry__` (a function without a site), and a site still
    // calling it.
    let fentry = plan.image.symbol("mini_account").unwrap().addr;
    plan.image.symbols.insert(
        FENTRY.to_string(),
        Symbol {
            name: FENTRY.to_string(),
            addr: fentry,
            size: 1,
        },
    );
    plan.image.linux = true;
    let site = plan.index.addrs[plan.index.addrs.len() - 1];
    let rel = (fentry.wrapping_sub(site + 5) as i64) as i32;
    let mut call = [0xe8u8; 5];
    call[1..].copy_from_slice(&rel.to_le_bytes());

    let vm = mini_vm(&kernel);
    let (mut tracer, handlers) = Tracer::exitless(plan, vm.cpus(), 1000, None).unwrap();
    let running = vm.start(handlers, true).unwrap();
    let paused = running.pause_all();
    let mem = paused.memory().clone();
    let gpa = vmm::layout::kernel_virt_to_phys(site).unwrap();
    mem.write_slice(&call, GuestAddress(gpa)).unwrap();
    // The stand-in `__fentry__` returns at once, as a Linux one does without
    // return thunks (the exitless attach reads how it returns).
    let fentry_gpa = vmm::layout::kernel_virt_to_phys(fentry).unwrap();
    mem.write_slice(&[0xc3], GuestAddress(fentry_gpa)).unwrap();
    let before = all_bytes(&mem);
    let attempt = tracer.attach(&paused).unwrap();
    assert!(
        matches!(
            attempt,
            Attach::NotReady(NotReady::CallSites { calls: 1, first }) if first == site
        ),
        "{attempt:?}"
    );
    let after = all_bytes(&mem);
    let changed = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    assert_eq!(
        changed, 0,
        "bytes of guest memory written by a refused attach"
    );
    assert!(!tracer.is_attached());
    drop(paused);
    running.request_stop(vmm::StopReason::Requested);
    running.finish();
}

/// Staged while the guest may run (`Tracer::stage`), an exitless attach
/// writes none of vmtrace's code and rings inside its pause: zeroing them
/// there (megabytes never touched before) was most of its window. And the
/// drainer, spawned at the stage and started by the attach, drains.
#[test]
fn a_staged_exitless_attach_leaves_code_and_rings_alone_in_its_pause() {
    use crate::plan::exitless::layout::{CODE_GPA, CODE_LEN, DATA_LEN};
    let kernel = mini_elf();
    let plan = Plan::new(&kernel, &["*".to_string()], &[]).unwrap();
    let vm = mini_vm(&kernel);
    let (mut tracer, handlers) = Tracer::exitless(plan, vm.cpus(), 1_000_000, None).unwrap();
    let running = vm.start(handlers, true).unwrap();
    tracer.stage(running.ram()).unwrap();
    let region = |mem: &GuestMemoryMmap| {
        let mut b = vec![0u8; (CODE_LEN + DATA_LEN) as usize];
        mem.read_slice(&mut b, GuestAddress(CODE_GPA)).unwrap();
        b
    };
    let staged = region(running.memory());
    assert_ne!(staged, vec![0u8; staged.len()], "the code is written");
    {
        let paused = running.pause_all();
        let counts = tracer.attach(&paused).unwrap().attached().unwrap();
        // Every site of the mini guest after boot (its init text aside).
        assert_eq!(counts.patched, 30);
        assert!(
            region(paused.memory()) == staged,
            "the attach wrote code or rings in its pause"
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mem = running.memory().clone();
    running.request_stop(vmm::StopReason::Requested);
    let report = running.finish();
    tracer.detach(&mem).unwrap();
    let trace = tracer.finish(&kernel, report.reason.to_string());
    assert!(trace.meta.events_total > 0, "nothing drained");
}

/// An attach while the guest's `alternatives_patched` (at `flag`) is 0
/// waits, writing no guest memory; with it 1, it attaches: the sites
/// patched. (`what`: the case, for the messages.)
pub(in crate::session) fn attach_once_alternatives_are_in(
    running: &vmm::Running,
    tracer: &mut Tracer,
    flag: GuestAddress,
    what: &str,
) -> usize {
    {
        let paused = running.pause_all();
        let mem = paused.memory().clone();
        mem.write_obj(0u32, flag).unwrap();
        let before = all_bytes(&mem);
        let attempt = tracer.attach(&paused).unwrap();
        assert!(
            matches!(attempt, Attach::NotReady(NotReady::AlternativesPending)),
            "{what}: {attempt:?}"
        );
        assert!(
            before == all_bytes(&mem),
            "{what}: a waiting attach wrote guest memory"
        );
        assert!(!tracer.is_attached());
    }
    let paused = running.pause_all();
    paused.memory().write_obj(1u32, flag).unwrap();
    let counts = tracer.attach(&paused).unwrap().attached().unwrap();
    counts.patched
}

/// The mini guest built with return thunks, whose `__fentry__` is ten NOPs
/// then `jmp __x86_return_thunk`, as a kernel with call depth tracking has it
/// before it applies its alternatives: with `alternatives_patched` at 0 the
/// attach waits, touching nothing (it read nothing that could fail); at 1
/// it attaches, returning through the thunk.
#[test]
fn an_exitless_attach_waits_for_alternatives_then_attaches() {
    let kernel = mini_variant("mini-rethunk");
    let plan = Plan::new(&kernel, &["*".to_string()], &[]).unwrap();
    let flag = plan.image.symbol("alternatives_patched").unwrap().addr;
    let thunk = plan.image.symbol("__x86_return_thunk").unwrap().addr;
    let flag_gpa = GuestAddress(vmm::layout::kernel_virt_to_phys(flag).unwrap());
    let vm = mini_vm(&kernel);
    let (mut tracer, handlers) = Tracer::exitless(plan, vm.cpus(), 1000, None).unwrap();
    let running = vm.start(handlers, true).unwrap();
    let patched = attach_once_alternatives_are_in(&running, &mut tracer, flag_gpa, "exitless");
    // Every site of the mini guest after boot (its init text aside).
    assert_eq!(patched, 30);
    let ret = tracer.reach.exitless().unwrap().plan().ret();
    assert_eq!(ret.thunk, Some(thunk));
    let mem = running.memory().clone();
    running.request_stop(vmm::StopReason::Requested);
    running.finish();
    tracer.detach(&mem).unwrap();
}
