//! call/stack's cross-check, as call/trap's (`calls::handler_alone`): the
//! recorder timed alone in process, on a `Trap` over the mini guest's
//! memory (loaded, not run; no exit), at `stack_leaf`'s site with a
//! frame-pointer chain written on its stack, by a tracer planned without
//! `--stack` and by one planned with it. Their difference is the stack's
//! host cost per call without the noise of a running guest: on a busy
//! host the phases' times may swamp it.

use std::path::Path;

use tracer::kernel::symbols::KernelImage;
use tracer::kernel::unwind::StackEnd;
use tracer::session::record::OUT_LEN;
use tracer::session::Tracer;
use vmm::gva::{AddressSpace, PagingMode};
use vmm::{Trap, Vm};

use super::calls::HANDLER_TRAPS;
use super::stack::{plan, StackAlone, STACK_CMDLINE, STACK_FUNC};
use super::{guest_config, MINI_MEM_MIB};
use crate::error::{Error, RuntimeError};

/// The chain written for the traps: `stack_leaf` called by way of the
/// `outer_a` path (guest/mini/README.md "stack=1"), innermost caller first.
const CHAIN: [&str; 4] = ["stack_mid", "stack_outer_a", "mini_main", "_start"];
/// Where the chain's entry RSP is, above `__bss_start` (handler_alone's
/// stack page), and the distance between its frames.
const CHAIN_SP: u64 = 0x800;
const FRAME_GAP: u64 = 0x40;

fn measure(m: String) -> Error {
    RuntimeError::Measure(m).into()
}

/// Writes the frame-pointer chain of `CHAIN` (a return address 8 bytes
/// into each function) on the guest's stack: the entry RSP and RBP.
fn write_chain(space: &mut AddressSpace<'_>, image: &KernelImage) -> Result<(u64, u64), Error> {
    let sym = |n: &str| {
        image
            .symbol(n)
            .map(|s| s.addr)
            .ok_or_else(|| measure(format!("the mini guest has no {n}")))
    };
    let sp = sym("__bss_start")? + CHAIN_SP;
    let mut put = |va: u64, v: u64| {
        space
            .write(va, &v.to_le_bytes())
            .map_err(|e| measure(format!("writing the guest's stack: {e}")))
    };
    put(sp, sym(CHAIN[0])? + 8)?;
    let frames: Vec<u64> = (1..CHAIN.len() as u64)
        .map(|k| sp + k * FRAME_GAP)
        .collect();
    for (k, &f) in frames.iter().enumerate() {
        put(f, frames.get(k + 1).copied().unwrap_or(0))?;
        put(f + 8, sym(CHAIN[k + 1])? + 8)?;
    }
    Ok((sp, frames[0]))
}

/// ns per `on_trap` of each tracer's recorder, `HANDLER_TRAPS` traps at
/// `stack_leaf`'s site; the stacks the second recorded, checked.
pub fn stack_alone(kernel: &Path) -> Result<StackAlone, Error> {
    let vm = Vm::create(guest_config(kernel, 1, MINI_MEM_MIB, STACK_CMDLINE)?)?;
    let mem = vm.memory();
    let cr3 = vmm::layout::PML4_START;
    let load = || KernelImage::load(kernel).map_err(tracer::error::TracerError::from);
    let image = load()?;
    let (sp, bp) = write_chain(&mut AddressSpace::new(mem, cr3, PagingMode::Level4), &image)?;
    let mut ns = [0.0f64; 2];
    let mut stack = None;
    for (k, with) in [false, true].into_iter().enumerate() {
        let (tracer, mut recs) = Tracer::new(plan(load()?, 1, with)?, 1, u64::MAX);
        let p = tracer.plan();
        let leaf = p
            .funcs
            .iter()
            .position(|&f| p.image.functions[f].name == STACK_FUNC);
        let site = leaf.and_then(|slot| p.index.funcs.iter().position(|&s| s as usize == slot));
        let rip = site
            .map(|i| p.index.addrs[i] + OUT_LEN)
            .ok_or_else(|| measure(format!("the mini guest has no {STACK_FUNC} site")))?;
        let rec = &mut recs[0];
        let t = std::time::Instant::now();
        for _ in 0..HANDLER_TRAPS {
            let mut trap = Trap::for_bench(0, rip, sp, cr3, PagingMode::Level4, mem);
            trap.rbp = bp;
            rec.on_trap(&mut trap).map_err(RuntimeError::Trap)?;
        }
        rec.flush();
        ns[k] = t.elapsed().as_secs_f64() * 1e9 / HANDLER_TRAPS as f64;
        drop(recs);
        let trace = tracer.finish(kernel, String::new());
        if trace.meta.events_total != HANDLER_TRAPS as u64 {
            return Err(measure(format!(
                "in-process recorder stored {} of {HANDLER_TRAPS} events",
                trace.meta.events_total
            )));
        }
        if with {
            stack = trace
                .stacks
                .first()
                .cloned()
                .filter(|_| trace.stacks.len() == 1);
        }
    }
    match stack {
        Some(s) if s.end == StackEnd::Bottom && s.frames.len() == CHAIN.len() => Ok(StackAlone {
            recorder_ns: ns[0],
            recorder_stack_ns: ns[1],
            frames: s.frames.len(),
        }),
        s => Err(measure(format!(
            "in-process recorder unwound {s:?}, not the {} frames written",
            CHAIN.len()
        ))),
    }
}
