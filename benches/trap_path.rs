//! Host-side cost of one traced call, from the exit to the next KVM_RUN,
//! without the kernel's exit cost: build the `Trap` the vCPU thread builds
//! and call the real `Recorder` (clock, counter, caller read from the guest
//! stack through the page tables, event buffered and sent to the collector
//! thread, which drains the channel in the background). For scale, the
//! least any handler must do (find the site, set RIP) is timed alongside.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use tracer::kernel::sites::SITE_LEN;
use tracer::session::record::{self, SiteIndex, OUT_LEN};
use vm_memory::{Bytes, GuestAddress};
use vmm::gva::PagingMode;
use vmm::{Trap, TrapHandler};

/// Patched sites in the index (a `--trace` of a busy subsystem).
const SITES: u64 = 1000;
/// Guest physical address of the top of the stack the traps see.
const STACK_TOP: u64 = 0x20_0000;

fn trap_path(c: &mut Criterion) {
    let mem = common::memory(64);
    // A return address on the guest stack, reached through the kernel mapping.
    let rsp_phys = STACK_TOP - 8;
    mem.write_obj(common::TEXT + 0x1234u64, GuestAddress(rsp_phys))
        .unwrap();
    let rsp = vmm::layout::KERNEL_MAP_BASE + rsp_phys;
    let sites: Vec<(u64, u32)> = (0..SITES)
        .map(|i| (common::TEXT + i * 0x240, i as u32))
        .collect();
    let index = Arc::new(SiteIndex::new(sites));
    // RIP past the `out`, as emulating hosts report it.
    let rips: Vec<u64> = index.addrs.iter().map(|a| a + OUT_LEN).collect();
    let cr3 = vmm::layout::PML4_START;

    let mut g = c.benchmark_group("trap_path");
    g.sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    g.bench_function("recorder", |b| {
        b.iter_custom(|iters| {
            // Fresh recorders each sample, so the collector's memory stays bounded.
            let (shared, mut recs, store) = record::recorders(
                Arc::clone(&index),
                1,
                u64::MAX,
                tracer::session::store::Storage::Memory,
                Arc::new(Vec::new()),
            );
            let mut rec = recs.pop().unwrap();
            let start = Instant::now();
            for i in 0..iters as usize {
                let mut trap =
                    Trap::for_bench(0, rips[i % rips.len()], rsp, cr3, PagingMode::Level4, &mem);
                rec.on_trap(&mut trap).unwrap();
            }
            let t = start.elapsed();
            // As the vCPU thread does when it leaves its loop.
            rec.flush();
            drop(rec);
            let tracer::session::store::Stored::Memory(events) = store.thread.join().unwrap()
            else {
                panic!("kept in memory")
            };
            assert_eq!(events.len() as u64, iters);
            assert_eq!(
                shared
                    .parent_unreadable
                    .load(std::sync::atomic::Ordering::Relaxed),
                0
            );
            t
        })
    });
    g.bench_function("resume_only", |b| {
        let mut i = 0usize;
        b.iter(|| {
            let mut trap =
                Trap::for_bench(0, rips[i % rips.len()], rsp, cr3, PagingMode::Level4, &mem);
            i += 1;
            let s = index.find(trap.rip).unwrap();
            trap.set_rip(index.addrs[s] + SITE_LEN as u64);
            trap
        })
    });
    g.finish();
}

criterion_group!(benches, trap_path);
criterion_main!(benches);
