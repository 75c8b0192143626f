//! Host-side cost of one traced call, from the exit to the next KVM_RUN,
//! without the kernel's exit cost: build the `Trap` the vCPU thread builds
//! and call the real `Recorder` (clock, counter, caller read from the guest
//! stack through the page tables, event buffered and sent to the collector
//! thread, which drains the channel in the background). For scale, the
//! least any handler must do (find the site, set RIP) is timed alongside.
//!
//! `--stack`: the frame-pointer unwinder alone on a constructed chain of 4
//! frames (the mini guest's `stack_outer_a` path), and the recorder that
//! unwinds and interns that stack at every trap (it needs the mini guest's
//! image for its text; skipped without guest/out/mini.elf).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use tracer::kernel::sites::SITE_LEN;
use tracer::kernel::symbols::KernelImage;
use tracer::kernel::unwind::{EntryRegs, NoFixup, StackEnd, UnwindCtx, Unwinder};
use tracer::session::record::{self, SiteIndex, OUT_LEN};
use tracer::session::stacks::{SpaceMemory, StackSource, StackTable};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::gva::{AddressSpace, PagingMode};
use vmm::{Trap, TrapHandler};

/// Patched sites in the index (a `--trace` of a busy subsystem).
const SITES: u64 = 1000;
/// Guest physical address of the top of the stack the traps see.
const STACK_TOP: u64 = 0x20_0000;
/// Guest physical address of the constructed frame-pointer chain's entry
/// RSP, and the distance between its frames.
const CHAIN_SP: u64 = 0x2f_f000;
const FRAME_GAP: u64 = 0x40;
/// The return addresses on the chain, innermost first: 4 frames, in the
/// first 16 KiB of text (the mini guest's is 18 KiB).
const CHAIN: [u64; 4] = [
    common::TEXT + 0x100,
    common::TEXT + 0x200,
    common::TEXT + 0x300,
    common::TEXT + 0x400,
];

/// Writes the frame-pointer chain of `CHAIN` into `mem`: the entry RSP
/// (the first return address at `[sp]`) and RBP (the caller's frame:
/// saved RBP, then return address; the outermost's saved RBP is 0).
fn fp_chain(mem: &GuestMemoryMmap) -> EntryRegs {
    let va = |phys: u64| vmm::layout::KERNEL_MAP_BASE + phys;
    mem.write_obj(CHAIN[0], GuestAddress(CHAIN_SP)).unwrap();
    let frames: Vec<u64> = (1..CHAIN.len() as u64)
        .map(|k| CHAIN_SP + k * FRAME_GAP)
        .collect();
    for (k, &f) in frames.iter().enumerate() {
        let up = frames.get(k + 1).map_or(0, |&n| va(n));
        mem.write_obj(up, GuestAddress(f)).unwrap();
        mem.write_obj(CHAIN[k + 1], GuestAddress(f + 8)).unwrap();
    }
    EntryRegs {
        ip: common::TEXT,
        sp: va(CHAIN_SP),
        bp: va(frames[0]),
    }
}

/// Times `iters` traps at the sites of `index` (cycling), entry RSP and RBP
/// from `regs`, handled by a fresh recorder that unwinds stacks with
/// `stacks` if given; checks every event was stored, and with `stacks`
/// that each names the one stack.
fn time_recorder(
    index: &Arc<SiteIndex>,
    mem: &GuestMemoryMmap,
    regs: EntryRegs,
    stacks: Option<&Arc<StackSource>>,
    iters: u64,
) -> Duration {
    // RIP past the `out`, as emulating hosts report it.
    let rips: Vec<u64> = index.addrs.iter().map(|a| a + OUT_LEN).collect();
    let cr3 = vmm::layout::PML4_START;
    // Fresh recorders each sample, so the collector's memory stays bounded.
    let (shared, mut recs, store) = record::recorders(
        Arc::clone(index),
        1,
        u64::MAX,
        tracer::session::store::Storage::Memory,
        Arc::new(Vec::new()),
    );
    let mut rec = recs.pop().unwrap();
    if let Some(s) = stacks {
        rec.record_stacks(Arc::clone(s));
    }
    let start = Instant::now();
    for i in 0..iters as usize {
        let mut trap = Trap::for_bench(
            0,
            rips[i % rips.len()],
            regs.sp,
            cr3,
            PagingMode::Level4,
            mem,
        );
        trap.rbp = regs.bp;
        rec.on_trap(&mut trap).unwrap();
    }
    let t = start.elapsed();
    // As the vCPU thread does when it leaves its loop.
    rec.flush();
    drop(rec);
    let tracer::session::store::Stored::Memory(events) = store.thread.join().unwrap() else {
        panic!("kept in memory")
    };
    assert_eq!(events.len() as u64, iters);
    let want = u32::from(stacks.is_some());
    assert!(events.iter().all(|e| e.stack == want));
    assert_eq!(
        shared
            .parent_unreadable
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    t
}

/// The recorders' stack source over the mini guest's text (every site
/// records its stack), if guest/out/mini.elf has been built.
fn mini_stacks() -> Option<Arc<StackSource>> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("guest/out/mini.elf");
    let Ok(image) = KernelImage::load(&p) else {
        eprintln!(
            "trap_path/recorder_stack skipped: {} is absent (build it with `bash \
             guest/build.sh mini`)",
            p.display()
        );
        return None;
    };
    let sites = vec![true; SITES as usize];
    let table = Arc::new(StackTable::new());
    Some(Arc::new(StackSource::new(
        Unwinder::FramePointer,
        &image,
        sites,
        table,
    )))
}

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
    let plain = EntryRegs {
        ip: common::TEXT,
        sp: rsp,
        bp: 0,
    };
    g.bench_function("recorder", |b| {
        b.iter_custom(|iters| time_recorder(&index, &mem, plain, None, iters))
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
    // --stack: the unwinder alone, from a fresh trap's address space, as
    // the recorder unwinds; then the recorder that does it at every trap.
    let chain = fp_chain(&mem);
    let text = [(common::TEXT, common::TEXT + 0x4000)];
    let ctx = UnwindCtx {
        slide: 0,
        text: &text,
        fixup: &NoFixup,
        modules: &[],
    };
    let unwind = || {
        let mut space = AddressSpace::new(&mem, cr3, PagingMode::Level4);
        Unwinder::FramePointer.unwind(black_box(chain), &mut SpaceMemory(&mut space), &ctx)
    };
    let stack = unwind();
    assert_eq!(
        (stack.frames.as_slice(), stack.end),
        (&CHAIN[..], StackEnd::Bottom)
    );
    g.bench_function("unwind_fp_4_frames", |b| b.iter(unwind));
    if let Some(stacks) = mini_stacks() {
        g.bench_function("recorder_stack", |b| {
            b.iter_custom(|iters| time_recorder(&index, &mem, chain, Some(&stacks), iters))
        });
    }
    g.finish();
}

criterion_group!(benches, trap_path);
criterion_main!(benches);
