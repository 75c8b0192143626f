//! Direct entries' attach checks on the mini guest under a real pause
//! (real KVM).

use vm_memory::{Bytes, GuestAddress};

use crate::kernel::find::{kernel_image, Given};
use crate::kernel::symbols::KernelImage;
use crate::plan::entry::EntryChoice;
use crate::plan::Plan;
use crate::session::kvm_tests::{
    all_bytes, attach_once_alternatives_are_in, mini_variant, mini_vm,
};
use crate::session::{Attach, NotReady, Tracer};

/// The mini guest built with return thunks and `alternatives_patched`
/// (`mini-rethunk`), traced by direct entries: with the flag at 0 an
/// attach waits in either mode and writes nothing (before, a trap-mode
/// attach wrote its jumps, which a kernel's `apply_alternatives` or
/// `apply_paravirt` could then overwrite); at 1 it attaches.
#[test]
fn a_direct_attach_waits_for_alternatives_in_every_mode() {
    let kernel = mini_variant("mini-rethunk");
    for exitless in [false, true] {
        let image = KernelImage::load(&kernel).unwrap();
        let trace = ["hrtimer_*".to_string(), "schedule".to_string()];
        let plan = Plan::with_entry(image, &trace, &[], EntryChoice::Direct).unwrap();
        let sites = plan.index.addrs.len();
        assert!(plan.direct.is_some() && sites == 5, "{sites} sites");
        let flag = plan.image.symbol("alternatives_patched").unwrap().addr;
        let flag_gpa = GuestAddress(vmm::layout::kernel_virt_to_phys(flag).unwrap());
        let vm = mini_vm(&kernel);
        let (mut tracer, handlers) = match exitless {
            true => Tracer::exitless(plan, vm.cpus(), 1000, None).unwrap(),
            false => Tracer::new(plan, vm.cpus(), 1000),
        };
        let running = vm.start(handlers, true).unwrap();
        let what = format!("exitless {exitless}");
        let patched = attach_once_alternatives_are_in(&running, &mut tracer, flag_gpa, &what);
        assert_eq!(patched, sites, "{what}");
        let mem = running.memory().clone();
        running.request_stop(vmm::StopReason::Requested);
        running.finish();
        let detached = tracer.detach(&mem).unwrap();
        assert_eq!(detached.restored, sites);
    }
}

/// Traced on `mini-noftrace`: functions whose guest count is incremented
/// by their first instruction or inside their displaced bytes, so that a
/// call in flight at the attach is counted by the guest exactly when its
/// entry has passed (README "direct=1"; workload.c). `schedule` and
/// `hrtimer_interrupt` displace `push %rbp; addq $1, n(%rdi)`: a vCPU can
/// stop between the two.
const TRACED: [&str; 6] = [
    "schedule",
    "hrtimer_interrupt",
    "hrtimer_start_range_ns",
    "hrtimer_try_to_cancel",
    "hrtimer_wakeup",
    "tick_sched_timer",
];

/// Their indexes in workload.c's `struct cpu` `count[]`.
const COUNT_INDEX: [u64; 6] = [1, 4, 2, 3, 6, 7];

/// `sizeof(struct cpu)` of workload.c: 9 words, 64-byte aligned.
const CPU_STRUCT: u64 = 128;

/// Pauses tried before giving up on finding a vCPU inside a site: each
/// finds one with a chance of about 1 in 40 (2 vCPUs, 2 inner
/// instructions in an iteration of about 150), so missing in all of
/// them has a chance below 1e-10.
const MAX_PAUSES: u32 = 1000;

/// A vCPU of the mini guest, paused until its RIP really is inside a
/// direct site's displaced bytes (past the first), makes the attach wait,
/// writing nothing; out of waits, the same pause attaches every other
/// site and leaves that one out. The guest runs on to its end; each
/// traced function's calls on each vCPU are exactly the guest's own count
/// from the attach on, and after the detach the text is the file's.
#[test]
fn a_vcpu_inside_the_displaced_bytes_makes_the_attach_wait_or_leave_the_site_out() {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    let kernel = mini_variant("mini-noftrace");
    let file = vmm::boot::KernelFile::open(&kernel).unwrap();
    let image = kernel_image(&file, Given::Nothing).unwrap().image;
    let trace: Vec<String> = TRACED.iter().map(|s| s.to_string()).collect();
    let plan = Plan::with_entry(image, &trace, &[], EntryChoice::Direct).unwrap();
    let sym = |n: &str| plan.image.symbol(n).unwrap().addr;
    let direct = plan.direct.as_ref().unwrap();
    let sites: Vec<(&str, u64, u64)> = TRACED
        .iter()
        .map(|&f| {
            let s = &direct.sites[&sym(f)];
            (f, s.addr, s.addr + s.len as u64)
        })
        .collect();
    let gpa = |va: u64| GuestAddress(vmm::layout::kernel_virt_to_phys(va).unwrap());
    let (cpus_gpa, stop_gpa) = (gpa(sym("mini_cpus")), gpa(sym("mini_stop")));
    let text = (sym("_stext"), sym("_etext"));
    let file_text = plan.image.file_bytes(text.0, (text.1 - text.0) as usize);
    let file_text = file_text.unwrap().to_vec();

    #[derive(Clone, Default)]
    struct Console(Arc<Mutex<Vec<u8>>>);
    impl Write for Console {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let console = Console::default();
    let vm = vmm::Vm::create(vmm::VmConfig {
        kernel: vmm::boot::KernelFile::open(&kernel).unwrap(),
        initrd: None,
        size: vmm::VmSize::new(2, 64).unwrap(),
        cmdline: "mode=loop".into(),
        console: Box::new(console.clone()),
        timeout: Some(std::time::Duration::from_secs(120)),
        hide_hypercalls: false,
    })
    .unwrap();
    let (mut tracer, handlers) = Tracer::new(plan, 2, 10_000_000);
    let running = vm.start(handlers, false).unwrap();
    let mem = running.memory().clone();
    let counts = |mem: &vm_memory::GuestMemoryMmap| -> Vec<[u64; 6]> {
        (0..2u64)
            .map(|cpu| {
                COUNT_INDEX.map(|i| {
                    let at = cpus_gpa.0 + cpu * CPU_STRUCT + 8 * i;
                    mem.read_obj::<u64>(GuestAddress(at)).unwrap()
                })
            })
            .collect()
    };
    let mut pauses = 0;
    let (paused, cpu, rip, site) = loop {
        pauses += 1;
        assert!(
            pauses <= MAX_PAUSES,
            "no vCPU inside a site in {MAX_PAUSES} pauses"
        );
        let paused = running.pause_all();
        let inside = (0..2).find_map(|cpu| {
            let rip = vmm::Stopped::snapshot(&paused, cpu)?.regs.rip;
            let k = sites.iter().position(|&(_, s, e)| rip > s && rip < e)?;
            Some((cpu, rip, k))
        });
        if let Some((cpu, rip, k)) = inside {
            break (paused, cpu, rip, k);
        }
        drop(paused);
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    eprintln!(
        "vCPU {cpu} at {rip:#x}, inside {}, after {pauses} pauses",
        sites[site].0
    );
    let before = all_bytes(&mem);
    let attempt = tracer.attach(&paused).unwrap();
    let who = format!("vCPU {cpu}");
    assert!(
        matches!(&attempt, Attach::NotReady(NotReady::DirectBusy { sites: 1, who: w, at }) if *at == rip && *w == who),
        "{attempt:?}"
    );
    assert!(
        before == all_bytes(&mem),
        "a waiting attach wrote guest memory"
    );
    // Out of waits: the same vCPU, still there, keeps its site out.
    tracer.direct.as_mut().unwrap().busy_waits = super::attach::MAX_BUSY_WAITS;
    let at_attach = counts(&mem);
    let c = tracer.attach(&paused).unwrap().attached().unwrap();
    assert_eq!((c.patched, c.direct_busy), (TRACED.len() - 1, 1));
    drop(paused);
    std::thread::sleep(std::time::Duration::from_millis(500));
    mem.write_obj(1u32, stop_gpa).unwrap();
    let stop = running.wait();
    let text_out = String::from_utf8_lossy(&console.0.lock().unwrap()).into_owned();
    assert_eq!(stop, vmm::StopReason::PowerOff(0), "{text_out}");
    running.finish();
    let at_end = counts(&mem);
    let detached = tracer.detach(&mem).unwrap();
    assert_eq!(detached.restored, TRACED.len() - 1);
    let mut guest_text = vec![0u8; file_text.len()];
    mem.read_slice(&mut guest_text, gpa(text.0)).unwrap();
    assert!(guest_text == file_text, "the text is the file's again");
    let trace = tracer.finish(&kernel, stop.to_string());
    for (i, &f) in TRACED.iter().enumerate() {
        let traced = trace.functions.iter().position(|x| x.name == f);
        for cpu in 0..2 {
            let got = traced.map_or(0, |t| trace.counts[t][cpu]);
            let want = match i == site {
                true => 0,
                false => at_end[cpu][i] - at_attach[cpu][i],
            };
            assert_eq!(got, want, "{f} on vCPU {cpu}");
            assert!(at_end[cpu][i] > at_attach[cpu][i], "{f}: the guest ran on");
        }
    }
}
