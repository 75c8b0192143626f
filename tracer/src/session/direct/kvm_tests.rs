//! Direct entries' attach checks on the mini guest under a real pause
//! (real KVM).

use vm_memory::{Bytes, GuestAddress};

use crate::kernel::symbols::KernelImage;
use crate::plan::entry::EntryChoice;
use crate::plan::Plan;
use crate::session::kvm_tests::{all_bytes, mini_variant, mini_vm};
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
        {
            let paused = running.pause_all();
            let mem = paused.memory().clone();
            mem.write_obj(0u32, flag_gpa).unwrap();
            let before = all_bytes(&mem);
            let attempt = tracer.attach(&paused).unwrap();
            assert!(
                matches!(attempt, Attach::NotReady(NotReady::AlternativesPending)),
                "exitless {exitless}: {attempt:?}"
            );
            assert!(
                before == all_bytes(&mem),
                "exitless {exitless}: a waiting attach wrote guest memory"
            );
            assert!(!tracer.is_attached());
        }
        {
            let paused = running.pause_all();
            paused.memory().write_obj(1u32, flag_gpa).unwrap();
            let counts = tracer.attach(&paused).unwrap().attached().unwrap();
            assert_eq!(counts.patched, sites, "exitless {exitless}");
        }
        let mem = running.memory().clone();
        running.request_stop(vmm::StopReason::Requested);
        running.finish();
        let detached = tracer.detach(&mem).unwrap();
        assert_eq!(detached.restored, sites);
    }
}
