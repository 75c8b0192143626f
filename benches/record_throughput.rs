//! Events per second handed to the collector by 1, 2 and 4 recorder
//! threads (one per vCPU, as in a traced run), each calling its own
//! `Recorder` on a stream of traps. The collector receives the batches
//! concurrently; its final sort (after the run) is not timed. (Streaming
//! to disk is `vmtrace bench`'s figure (h).)

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tracer::session::record::{self, SiteIndex};
use vm_memory::{Bytes, GuestAddress};
use vmm::gva::PagingMode;
use vmm::{Trap, TrapHandler};

/// Traps each thread makes per sample.
const PER_THREAD: u64 = 200_000;
const SITES: u64 = 1000;

fn record_throughput(c: &mut Criterion) {
    let mem = common::memory(64);
    let sites: Vec<(u64, u32)> = (0..SITES)
        .map(|i| (common::TEXT + i * 0x240, i as u32))
        .collect();
    let index = Arc::new(SiteIndex::new(sites));
    let rips: Vec<u64> = index.addrs.iter().map(|a| a + 2).collect();
    // One stack per thread, each holding a return address.
    let stacks: Vec<u64> = (0..4u64)
        .map(|t| {
            let phys = 0x20_0000 + t * 0x1_0000 - 8;
            mem.write_obj(common::TEXT + 0x40u64, GuestAddress(phys))
                .unwrap();
            vmm::layout::KERNEL_MAP_BASE + phys
        })
        .collect();

    let mut g = c.benchmark_group("record_throughput");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    for threads in [1usize, 2, 4] {
        g.throughput(Throughput::Elements(PER_THREAD * threads as u64));
        g.bench_with_input(BenchmarkId::from_parameter(threads), &threads, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (_shared, recs, store) = record::recorders(
                        Arc::clone(&index),
                        n,
                        u64::MAX,
                        tracer::session::store::Storage::Memory,
                        Arc::new(Vec::new()),
                    );
                    let barrier = Barrier::new(n + 1);
                    let elapsed = std::thread::scope(|s| {
                        for (cpu, mut rec) in recs.into_iter().enumerate() {
                            let (mem, rips, rsp, barrier) = (&mem, &rips, stacks[cpu], &barrier);
                            s.spawn(move || {
                                barrier.wait();
                                for i in 0..PER_THREAD as usize {
                                    let mut trap = Trap::for_bench(
                                        cpu,
                                        rips[i % rips.len()],
                                        rsp,
                                        vmm::layout::PML4_START,
                                        PagingMode::Level4,
                                        mem,
                                    );
                                    rec.on_trap(&mut trap).unwrap();
                                }
                                rec.flush();
                            });
                        }
                        barrier.wait();
                        let start = Instant::now();
                        // Leaving the scope joins every recorder thread.
                        start
                    })
                    .elapsed();
                    total += elapsed;
                    let tracer::session::store::Stored::Memory(events) =
                        store.thread.join().unwrap()
                    else {
                        panic!("kept in memory")
                    };
                    assert_eq!(events.len() as u64, PER_THREAD * n as u64);
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, record_throughput);
criterion_main!(benches);
