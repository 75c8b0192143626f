//! Patch and restore every non-init ftrace site of guest/out/vmlinux in a
//! guest memory image: the vmlinux's PT_LOAD segments at their physical
//! addresses, vmtrace's boot page tables, sites reached through an `AddressSpace`
//! (goal for the pause window: <= 10 ms for all sites). Skipped, with a
//! message, when the vmlinux has not been built.

mod common;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tracer::kernel::sites::{SiteTable, FENTRY};
use tracer::kernel::symbols::KernelImage;
use tracer::session::patch::{self, Attached, CallSites};
use vmm::gva::{AddressSpace, PagingMode};

/// Guest RAM for the image (its segments end below 27 MiB).
const MEM_MIB: usize = 96;

fn patch_all(c: &mut Criterion) {
    let Some(vmlinux) = common::vmlinux() else {
        return;
    };
    let mem = common::load_elf(&vmlinux, MEM_MIB);
    let image = KernelImage::load(&vmlinux).unwrap();
    let table = SiteTable::build(&image).unwrap();
    let addrs: Vec<u64> = table
        .sites
        .iter()
        .filter(|s| !s.init)
        .map(|s| s.addr)
        .collect();
    let fentry = image.symbol(FENTRY).map(|s| s.addr);

    let mut g = c.benchmark_group("patch_all");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    g.bench_function(format!("attach_detach_{}_sites", addrs.len()), |b| {
        b.iter(|| {
            let mut map = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
            // The image never ran: its sites still call __fentry__.
            let attached = patch::attach(&mut map, fentry, &addrs, CallSites::Patch).unwrap();
            let Attached::Patched { sites, skipped } = attached else {
                panic!("not patched: {attached:?}");
            };
            assert_eq!((sites.len(), skipped), (addrs.len(), 0));
            let d = patch::detach(&mem, &sites).unwrap();
            assert_eq!(d.restored, addrs.len());
        })
    });
    g.finish();
}

criterion_group!(benches, patch_all);
criterion_main!(benches);
