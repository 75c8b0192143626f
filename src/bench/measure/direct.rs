//! Direct entries (issue 26): call/direct's stubs counted in their code
//! (the phases are call/exitless's, `exitless_costs` with
//! `EntryChoice::Direct`), attach/direct's pause windows for 100 and 1,000
//! direct sites, and sites/direct's count of the functions a kernel's
//! direct entries can trace, and of those refused, by rule.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use iced_x86::{Decoder, DecoderOptions};
use tracer::error::TracerError;
use tracer::kernel::sites::SiteTable;
use tracer::kernel::symbols::KernelImage;
use tracer::plan::entry::{DirectPlan, EntryChoice, EntryKind};
use tracer::plan::exitless::symbols::ALTERNATIVES_PATCHED;
use tracer::plan::Plan;
use tracer::session::direct::{stub, DirectSites, Head};
use tracer::session::record::SiteIndex;
use tracer::session::Tracer;
use vm_memory::{Bytes, GuestAddress};
use vmm::{NoTracer, StopReason, TrapHandler, Vm};

use super::{attach_figures, guest_config, AttachFigures, LINUX_MEM_MIB};
use crate::error::{Error, RuntimeError};

/// Site counts of attach/direct.
pub const DIRECT_SITES: [usize; 2] = [100, 1000];

/// A direct-entry call's instructions besides the body and the relocated
/// ones, counted in the stubs' code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StubCount {
    /// Direct sites traced.
    pub sites: usize,
    /// Instructions a recorded call runs around the trampoline's path
    /// (`Trampoline::common_path_instructions`): the site's `jmp`, the
    /// stub's `call` and its jump back; the same at every site (else the
    /// run fails).
    pub around: usize,
    /// Each site's displaced instructions, relocated into its stub (run
    /// untraced too, so not counted in `around`).
    pub relocated: Vec<usize>,
}

impl StubCount {
    /// Relocated instructions per site, mean.
    pub fn relocated_mean(&self) -> f64 {
        self.relocated.iter().sum::<usize>() as f64 / self.relocated.len().max(1) as f64
    }
}

/// The stubs of an exitless tracer's direct sites, built as its attach
/// builds them (at their link addresses: the mini guest has no KASLR) and
/// decoded; None for ftrace sites.
pub fn stub_count(tracer: &Tracer) -> Result<Option<StubCount>, String> {
    let plan = tracer.plan();
    let (Some(direct), Some(sites)) = (plan.direct.as_ref(), DirectSites::of(plan)) else {
        return Ok(None);
    };
    let t = tracer
        .trampoline()
        .ok_or("the exitless tracer has no trampoline")?;
    let mut count = StubCount {
        sites: sites.len(),
        around: 0,
        relocated: Vec::new(),
    };
    for (k, addr) in plan.index.addrs.iter().enumerate() {
        let site = &direct.sites[addr];
        // k < the layout's sites: the index is the trampoline's.
        let head = Head::Call(t.stub_va(k as u32));
        let around = around_body(site.addr, site.len, &site.insns, head, sites.stub_va(k))?;
        if k > 0 && around != count.around {
            return Err(format!(
                "direct stub {k} runs {around} instructions around the body, stub 0 {}",
                count.around
            ));
        }
        count.around = around;
        count.relocated.push(site.insns.len());
    }
    Ok(Some(count))
}

/// The instructions a call through the stub of the site at `site` (its
/// `len` bytes displaced: `insns`) runs besides the body `head` calls and
/// the relocated ones: the site's `jmp`, and the stub (built at `va` as
/// the attach builds it, decoded) less what it relocates.
fn around_body(
    site: u64,
    len: usize,
    insns: &[iced_x86::Instruction],
    head: Head,
    va: u64,
) -> Result<usize, String> {
    let code = stub::build(site, len, insns, head, va).map_err(|e| e.to_string())?;
    let mut d = Decoder::with_ip(64, &code, va, DecoderOptions::NONE);
    let mut n = 0;
    while d.can_decode() {
        let _ = d.decode();
        n += 1;
    }
    Ok(1 + n - insns.len())
}

/// attach/direct: the windows, and what they were measured on.
pub struct DirectAttach {
    pub vmlinux: PathBuf,
    /// Functions with a direct site in it (those `--trace '*'` selects).
    pub safe: usize,
    /// By site count, ascending.
    pub attach: Vec<AttachFigures>,
}

/// attach/direct on `vmlinux` loaded into a VM that never runs, as
/// attach/scaling: 100 and 1,000 of its direct sites (spread evenly),
/// attached `E_REPS` times each in trap mode.
pub fn attach_direct(vmlinux: &Path) -> Result<DirectAttach, Error> {
    let load = || -> Result<KernelImage, Error> {
        let mut image = KernelImage::load_without_sites(vmlinux).map_err(TracerError::from)?;
        // Never run: a displaced ftrace site (a vmlinux with ftrace) is
        // still `call __fentry__`; patch it as the NOP it would be.
        image.linux = false;
        Ok(image)
    };
    let all = Plan::with_entry(load()?, &["*".to_string()], &[], EntryChoice::Direct)?;
    let (all_targets, all_funcs, sites) = (
        all.index.sites().collect::<Vec<_>>(),
        all.funcs.clone(),
        all.sites.clone(),
    );
    let direct = all.direct;
    let vm = Vm::create(guest_config(vmlinux, 1, LINUX_MEM_MIB, "")?)?;
    let running = vm
        .start(vec![Box::new(NoTracer) as Box<dyn TrapHandler>], true)
        .map_err(RuntimeError::Start)?;
    // Held for the whole measurement: this guest never runs, its vCPU
    // stays at the kernel's entry (the attach checks its registers).
    let paused = running.pause_all();
    // A direct attach waits for the kernel's alternatives: this one stands
    // for a booted kernel, which has applied them.
    alternatives_applied(&all.image, &paused)?;
    let mut figures = Vec::new();
    let result = (|| -> Result<(), Error> {
        for n in DIRECT_SITES.into_iter().filter(|&n| n <= all_targets.len()) {
            let step = (all_targets.len() / n).max(1);
            let targets: Vec<(u64, u32)> =
                all_targets.iter().step_by(step).take(n).copied().collect();
            let plan = direct_plan(load()?, sites.clone(), all_funcs.clone(), targets, &direct);
            figures.push(attach_figures(plan, n.to_string(), n, &paused, vmlinux)?);
        }
        Ok(())
    })();
    running.request_stop(StopReason::Requested);
    drop(paused);
    running.finish();
    result?;
    Ok(DirectAttach {
        vmlinux: vmlinux.to_path_buf(),
        safe: all_targets.len(),
        attach: figures,
    })
}

/// Sets the never-booted kernel's `alternatives_patched`, as its boot
/// would have (a kernel without the flag has nothing to wait for).
fn alternatives_applied(image: &KernelImage, paused: &vmm::Paused<'_>) -> Result<(), Error> {
    let Some(flag) = image.symbol(ALTERNATIVES_PATCHED) else {
        return Ok(());
    };
    let measure = |what: String| Error::from(RuntimeError::Measure(what));
    let gpa = vmm::layout::kernel_virt_to_phys(flag.addr).ok_or_else(|| {
        measure(format!(
            "{ALTERNATIVES_PATCHED} at {:#x} is not in the kernel's mapping",
            flag.addr
        ))
    })?;
    paused
        .memory()
        .write_obj(1u32, GuestAddress(gpa))
        .map_err(|e| measure(format!("writing {ALTERNATIVES_PATCHED} at {gpa:#x}: {e}")))
}

/// A trap-mode direct plan of `targets` (site, function slot) alone.
fn direct_plan(
    image: KernelImage,
    sites: SiteTable,
    funcs: Vec<usize>,
    targets: Vec<(u64, u32)>,
    direct: &Option<DirectPlan>,
) -> Plan {
    Plan {
        image,
        sites,
        funcs,
        index: Arc::new(SiteIndex::new(targets)),
        skipped_init: 0,
        ftrace_enabled: None,
        graph: false,
        // The attach's cost alone: no task read at calls.
        tasks: Default::default(),
        btf: None,
        values: Default::default(),
        arg_funcs: None,
        stacks: None,
        entry: EntryKind::Direct,
        direct: direct.clone(),
        boot_patched: Default::default(),
        events: Default::default(),
        coming: None,
    }
}

/// sites/direct on one kernel.
pub struct DirectSiteCounts {
    /// What it is ("vmlinux", "distro kernel").
    pub label: &'static str,
    pub path: PathBuf,
    pub functions: usize,
    /// Functions with a direct site (`DirectPlan::sites`).
    pub safe: usize,
    pub refused: usize,
    /// Refusals by rule, most first.
    pub by_rule: Vec<(&'static str, usize)>,
    /// Its ftrace sites (`SiteTable::build`), for comparison; None: none.
    pub ftrace_sites: Option<usize>,
    /// ms to analyze every function (`DirectPlan::build`).
    pub analyze_ms: f64,
}

/// `DirectPlan::build` over the kernel at `path`: a vmlinux, or a bzImage
/// (its symbols from kallsyms).
pub fn direct_sites(label: &'static str, path: &Path) -> Result<DirectSiteCounts, Error> {
    let mut magic = [0u8; 4];
    let elf = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF");
    let image = if elf {
        KernelImage::load_without_sites(path).map_err(TracerError::from)?
    } else {
        tracer::kernel::bzimage::load(path)
            .map_err(|e| RuntimeError::Measure(format!("{}: {e}", path.display())))?
            .0
    };
    let t = Instant::now();
    let (plan, _) = DirectPlan::build(&image).map_err(TracerError::from)?;
    let analyze_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut by_rule: Vec<(&'static str, usize)> =
        plan.by_rule.iter().map(|(r, n)| (*r, *n)).collect();
    by_rule.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let ftrace_sites = (!image.mcount_loc.is_empty())
        .then(|| SiteTable::build(&image).ok().map(|t| t.sites.len()))
        .flatten();
    Ok(DirectSiteCounts {
        label,
        path: path.to_path_buf(),
        functions: image.functions.len(),
        safe: plan.sites.len(),
        refused: plan.refused.len(),
        by_rule,
        ftrace_sites,
        analyze_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: u64 = 0xffff_ffff_8100_1000;
    const STUB: u64 = 0xffff_ffff_ff9f_0000;
    const BODY: u64 = 0xffff_ffff_ff80_0040;

    fn decode(bytes: &[u8]) -> Vec<iced_x86::Instruction> {
        let mut d = Decoder::with_ip(64, bytes, SITE, DecoderOptions::NONE);
        let mut v = Vec::new();
        while d.can_decode() {
            v.push(d.decode());
        }
        v
    }

    #[test]
    fn a_direct_call_runs_three_instructions_around_the_body() {
        // push rbp ; mov rbp, rsp ; push rbx: three relocated.
        let insns = decode(&[0x55, 0x48, 0x89, 0xe5, 0x53]);
        assert_eq!(around_body(SITE, 5, &insns, Head::Call(BODY), STUB), Ok(3));
        // A short branch widened in the stub is still one instruction.
        let insns = decode(&[0x85, 0xff, 0x74, 0x20, 0x55]);
        assert_eq!(insns.len(), 3);
        assert_eq!(around_body(SITE, 5, &insns, Head::Call(BODY), STUB), Ok(3));
        // An ftrace NOP displaced: nothing relocated, the same three.
        assert_eq!(around_body(SITE, 5, &[], Head::Call(BODY), STUB), Ok(3));
        // A trap stub: `out` and the jump back, its NOP never run but in
        // the code (what call/direct's trap phases run is not counted).
        assert_eq!(around_body(SITE, 5, &[], Head::Trap, STUB), Ok(4));
    }

    #[test]
    fn relocated_mean_over_sites() {
        let c = StubCount {
            sites: 4,
            around: 3,
            relocated: vec![1, 1, 2, 1],
        };
        assert_eq!(c.relocated_mean(), 1.25);
    }
}
