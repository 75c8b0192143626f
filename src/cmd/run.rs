//! `vmtrace --kernel ...` and `vmtrace record`: boot the guest and, with
//! `--trace`, attach, record, detach, then report and/or save the trace.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracer::session::store::Storage;
use tracer::session::{Attach, Recording, Saved, Tracer};
use tracer::trace::datafile::DataFile;
use vmm::advice::Advice;
use vmm::boot::Protocol;
use vmm::{NoTracer, RunReport, Running, StopReason, TrapHandler, Vm};

use crate::cli::{OutputArgs, RunArgs};
use crate::config::{Form, KernelKind, RunConfig, TraceConfig};
use crate::emit::{emit, Streamed, Written};
use crate::error::{Error, Flags, InputError, Outcome, RuntimeError};
use crate::stats::percentile;
use crate::{datafile, datalock};

/// How often the controller looks at the guest while it runs.
const POLL: Duration = Duration::from_millis(20);
/// How often the live status line is redrawn.
const STATUS_EVERY: Duration = Duration::from_secs(1);

pub fn main(args: &RunArgs, out: &OutputArgs, form: Form) -> Result<Outcome, Error> {
    let RunConfig {
        vm,
        kind,
        stats,
        trace,
    } = RunConfig::check(args, out, form)?;
    let kernel = vm.kernel.clone();
    let vm = Vm::create(vm)?;
    match trace {
        None => untraced(vm, stats),
        Some(t) => traced(vm, kind, &kernel, stats, t),
    }
}

fn untraced(vm: Vm, stats: bool) -> Result<Outcome, Error> {
    let handlers = (0..vm.cpus())
        .map(|_| Box::new(NoTracer) as Box<dyn TrapHandler>)
        .collect();
    let running = vm.start(handlers, false).map_err(RuntimeError::Start)?;
    running.wait();
    Ok(stopped(&running.finish(), stats, &|_| None))
}

/// Say why and when the guest stopped (and, with `--stats`, how it ran);
/// `function` names the kernel function at a guest address, if it can.
fn stopped(report: &RunReport, stats: bool, function: &dyn Fn(u64) -> Option<String>) -> Outcome {
    note!(
        "vmtrace: {}",
        stop_line(&report.reason, report.elapsed, function)
    );
    if let Some(lost) = crate::console::loss() {
        note!("vmtrace: {lost}");
    }
    if stats {
        print_stats(report, function);
    }
    Outcome::of(&report.reason)
}

/// Why and when the guest stopped, in one line.
fn stop_line(
    reason: &StopReason,
    elapsed: Duration,
    function: &dyn Fn(u64) -> Option<String>,
) -> String {
    let secs = elapsed.as_secs_f64();
    match reason {
        // It says its own time: "timeout after 8 s", not "... after 8.03 s".
        StopReason::Timeout(_) => format!("{reason} (--timeout)"),
        // A failure's message ends in advice: the time and the function
        // first, so that neither is glued to it.
        reason @ (StopReason::Error(_) | StopReason::TripleFault { .. }) => {
            let place = reason
                .rip()
                .and_then(function)
                .map(|f| format!(", in {f}"))
                .unwrap_or_default();
            format!("after {secs:.2} s{place}: {}", reason.say(&Flags))
        }
        reason => format!("{reason} after {secs:.2} s"),
    }
}

/// Where a failing guest (and with `--stats`, each vCPU) stopped, each
/// address with its function.
fn stop_names(report: &RunReport, tracer: &Tracer) -> std::collections::HashMap<u64, String> {
    let rips = report
        .reason
        .rip()
        .into_iter()
        .chain(report.last_regs.iter().flatten().map(|s| s.regs.rip));
    rips.filter_map(|rip| Some((rip, function_at(tracer, rip)?)))
        .collect()
}

/// `rip` as `function+0xoffset`, from the traced kernel's symbols (slid by
/// its KASLR offset, once known); in exitless mode, a vCPU running
/// vmtrace's own code (a traced call being recorded) is named so, as
/// `vmtrace's trampoline+0xoffset`: that code is in no kernel symbol.
fn function_at(tracer: &Tracer, rip: u64) -> Option<String> {
    use tracer::session::exitless::layout::{CODE_LEN, CODE_VA};
    if tracer.trampoline().is_some() && (CODE_VA..CODE_VA + CODE_LEN).contains(&rip) {
        return Some(format!("vmtrace's trampoline+{:#x}", rip - CODE_VA));
    }
    let image = &tracer.plan().image;
    let link = match tracer.kernel_offset() {
        Some(o) => o.link(rip),
        // Not Linux: it runs where it was linked.
        None if !image.linux => rip,
        // Linux before its offset was found: it may have moved.
        None => return None,
    };
    let f = image.function_at(link)?;
    Some(format!("{}+{:#x}", f.name, link - f.addr))
}

fn traced(
    vm: Vm,
    kind: KernelKind,
    kernel: &Path,
    stats: bool,
    cfg: TraceConfig,
) -> Result<Outcome, Error> {
    let TraceConfig {
        plan,
        mode,
        ring_events,
        duration,
        max_events,
        buffer,
        overwrite,
        output,
        notes,
    } = cfg;
    // A kernel that does not patch its own sites (the mini guest) is traced
    // from its first instruction; Linux once its ftrace_init made the sites NOPs.
    let attach_now = !kind.is_linux();
    debug_assert_eq!(
        attach_now,
        vm.boot_plan().protocol == Protocol::Direct,
        "the config and the loader disagree on the boot protocol"
    );
    // Left out of tracing, never silently: say which (in the report; here
    // too unless all are overridden __weak functions, as in every Linux).
    if let Some(rejected) = plan
        .sites
        .rejected_summary()
        .filter(|_| plan.sites.rejected_unexpected())
    {
        note!(
            "vmtrace: {}: {rejected} (left out)",
            plan.image.path.display()
        );
    }
    let mut data = Data::open(output.data.as_ref())?;
    let file = data.file.take().expect("just opened");
    let storage = match overwrite {
        Some(per_cpu) => Storage::Overwrite { file, per_cpu },
        None => Storage::Stream { file, buffer },
    };
    let recording = Recording {
        max_events,
        storage,
        kernel: kernel.to_path_buf(),
    };
    let (mut tracer, handlers) = Tracer::create(plan, vm.cpus(), mode, ring_events, recording)
        .map_err(|e| {
            data.discard();
            Error::Input(InputError::from(e))
        })?;
    // Said once nothing can refuse the run any more.
    for n in notes {
        note!("{n}");
    }
    let running = vm
        .start(handlers, attach_now)
        .map_err(RuntimeError::Start)?;
    let mem = running.memory().clone();

    let result = trace_loop(&running, &mut tracer, attach_now, duration, output.quiet);
    // Whatever happened: stop the guest, then put every byte back.
    let run_report = running.finish();
    // What every detach of the run restored, including one at --duration.
    let detach = tracer.detach(&mem).map(|_| tracer.detached.clone());
    let attached = tracer.attach_counts.patched;
    // Exitless: what the stopped guest left in its rings; a loss is said
    // after the report (the counts that remain are still exact).
    let drained = tracer.stop_draining();
    // Exits at the trace port: one per traced call in trap mode, none in
    // exitless mode (traps happen only while sites hold them).
    let trap_exits = run_report
        .vcpus
        .iter()
        .map(|v| v.get(vmm::exit::ExitKind::Trap))
        .sum();
    // Named while the symbols are at hand.
    let names = stop_names(&run_report, &tracer);
    // The data file's footer: it is complete from here on.
    let reason = run_report.reason.say(&Flags);
    let (summary, saved) = tracer.finish_stored(kernel, reason, trap_exits);
    data.end_on_terminate();
    result?;
    match detach {
        Ok(d) if attached > 0 => note!(
            "vmtrace: detached: {} sites restored{}",
            d.restored,
            if d.changed > 0 {
                format!(", {} changed by the guest and left alone", d.changed)
            } else {
                String::new()
            }
        ),
        Ok(_) => {}
        Err(e) => return Err(RuntimeError::Restore(e).into()),
    }
    let outcome = stopped(&run_report, stats, &|rip| names.get(&rip).cloned());
    if attached == 0 {
        data.discard();
        return Err(RuntimeError::NothingTraced(run_report.reason.clone()).into());
    }
    let saved = saved.unwrap_or_else(|| {
        Err(tracer::trace::datafile::TraceFileError::Invalid {
            path: data.stream.clone(),
            detail: "no data file was written".into(),
        })
    });
    // The views and exports need the events: read back from the file.
    let needs_events = output.view.is_some() || !output.exports.is_empty();
    let mut trace = match (&saved, needs_events) {
        (Ok(_), true) => match tracer::trace::datafile::load(&data.stream) {
            Ok(t) => t,
            Err(e) => {
                note!("vmtrace: {e}; the report has the counts only");
                summary.clone()
            }
        },
        _ => summary.clone(),
    };
    // The run's, not the data file's (it does not keep them).
    trace.meta.guest_instructions_emulated = run_report.guest_instructions_emulated();
    let streamed = data.finish(saved, &summary);
    emit(&trace, &output, streamed)?;
    if summary.meta.unfinished > 0 {
        // Said on stderr too: `record` prints no report.
        let what = match summary.meta.graph {
            true => "records (calls or returns)",
            false => "calls",
        };
        note!(
            "vmtrace: {} {what} reserved a record in vmtrace's rings that was never committed (the \
             guest stopped mid-record): not in the counts, which stay exact for every other call",
            summary.meta.unfinished
        );
    }
    drained.map_err(RuntimeError::Drain)?;
    Ok(outcome)
}

/// The data file a traced run writes while the guest runs: the one asked
/// for (`-o`, `record`'s vmtrace.data, the previous one kept as .old), or
/// for a one-shot run without `-o` a temporary file the report is read
/// from and which is removed at the end. A character device asked for
/// gets the file once it is complete (it cannot be read back).
struct Data {
    /// Held while the run writes `stream` (see `datalock`).
    lock: Option<datalock::Lock>,
    /// Where events are written as they come.
    stream: PathBuf,
    file: Option<DataFile>,
    /// Where the user asked for it (None: no data file asked for).
    asked: Option<PathBuf>,
    /// `stream` is vmtrace's own, removed at the end.
    temporary: bool,
    kept: Option<PathBuf>,
}

impl Data {
    fn open(asked: Option<&crate::config::DataFile>) -> Result<Data, Error> {
        let device = asked.is_some_and(|d| {
            matches!(
                tracer::trace::output_path::target(&d.path),
                Ok(tracer::trace::output_path::Target::Device(_))
            )
        });
        // Another run writing the file: refused before anything is moved
        // or created (the lock is beside the file, never renamed; see
        // `datalock`).
        let lock = match asked {
            Some(d) if !device => datalock::Lock::acquire(&lock_target(&d.path))?,
            _ => None,
        };
        let (stream, temporary, kept) = match asked {
            Some(d) if !device => {
                let kept = if d.keep_old {
                    datafile::keep_old(&d.path)?
                } else {
                    None
                };
                (d.path.clone(), false, kept)
            }
            _ => (temporary_path(), true, None),
        };
        let file = DataFile::create(&stream).map_err(RuntimeError::Save)?;
        Ok(Data {
            lock,
            stream,
            file: Some(file),
            asked: asked.map(|d| d.path.clone()),
            temporary,
            kept,
        })
    }

    /// The run traced nothing: no file is left (a temporary one), or the
    /// one asked for stays as written (it says so: no events).
    fn discard(&self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.stream);
        }
    }

    /// The guest is stopped, its text restored, the file complete: Ctrl-C
    /// now ends a long report or export at once, removing what this run
    /// made for itself (it was caught to stop the run cleanly, and a second
    /// one said "restoring the guest's text").
    fn end_on_terminate(&self) {
        let temporary = self.temporary.then_some(self.stream.as_path());
        let lock = self.lock.as_ref().map(|l| l.path());
        if let Err(e) = vmm::run::end_on_terminate([temporary, lock]) {
            note!("vmtrace: cannot restore Ctrl-C ({e}): it is ignored until vmtrace ends");
        }
    }

    /// Once the file is complete (`saved`): to a device if one was asked
    /// for, the temporary file removed; what to say about it.
    fn finish(
        &self,
        saved: Result<Saved, tracer::trace::datafile::TraceFileError>,
        summary: &tracer::trace::model::Trace,
    ) -> Option<Streamed> {
        let m = &summary.meta;
        let unstored = m.events_dropped + m.returns_dropped;
        let out = self.asked.as_ref().map(|asked| {
            let saved = saved.map_err(RuntimeError::Save)?;
            if self.temporary {
                // A character device: the whole file into it.
                copy_into(&self.stream, asked)?;
            }
            // The file's records are calls and returns; the report counts
            // calls as events and returns apart.
            let returns = m.graph.then(|| {
                let total: u64 = summary.returns.iter().flatten().sum();
                total.saturating_sub(m.returns_dropped)
            });
            Ok(Written {
                path: asked.clone(),
                events: saved.events - returns.unwrap_or(0).min(saved.events),
                returns,
                unstored,
                kept: self.kept.clone(),
            })
        });
        self.discard();
        out
    }
}

impl Drop for Data {
    /// Whatever ended the run (an error included), no temporary file stays.
    fn drop(&mut self) {
        self.discard();
    }
}

/// The file a data file path writes: a symlink's target (two names of one
/// file share its lock), else the path itself.
fn lock_target(path: &Path) -> PathBuf {
    match tracer::trace::output_path::target(path) {
        Ok(tracer::trace::output_path::Target::File { path, .. }) => path,
        _ => path.to_path_buf(),
    }
}

/// Where a one-shot run without `-o` streams its events.
fn temporary_path() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("vmtrace-{}-{n}.data", std::process::id()))
}

/// The complete data file `from` into the character device `to`.
fn copy_into(from: &Path, to: &Path) -> Result<(), RuntimeError> {
    let lost = |source| RuntimeError::Lost {
        what: "trace",
        path: to.to_path_buf(),
        source,
        note: "what reached the device is incomplete".to_string(),
    };
    let mut src = std::fs::File::open(from).map_err(lost)?;
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .open(to)
        .map_err(lost)?;
    std::io::copy(&mut src, &mut dst).map_err(lost)?;
    Ok(())
}

/// Attach when the guest is ready, trace until it stops or `--duration`
/// ends, detach under a pause when vmtrace is the one stopping it.
fn trace_loop(
    running: &Running,
    tracer: &mut Tracer,
    attach_now: bool,
    duration: Option<Duration>,
    quiet: bool,
) -> Result<(), Error> {
    // Attach: once the guest's ftrace_init is done (polled), then under a
    // pause only if every selected site agrees; otherwise resume and retry.
    // Exitless code and rings written now, not inside the attach's pause.
    tracer.stage(running.memory()).map_err(|e| {
        running.request_stop(StopReason::Requested);
        InputError::Tracer(e)
    })?;
    let mut retries = 0u32;
    let mut last_not_ready = None;
    let status = !quiet && std::io::stderr().is_terminal();
    let booting = Instant::now();
    let mut last_status = Instant::now();
    loop {
        if status && !attach_now && last_status.elapsed() >= STATUS_EVERY {
            last_status = Instant::now();
            crate::status::draw(&crate::status::waiting(booting.elapsed()));
        }
        if attach_now || tracer.guest_ready(running.memory()) {
            let paused = running.pause_all();
            let attempt = tracer.attach(&paused).map_err(|e| {
                running.request_stop(StopReason::Requested);
                InputError::Tracer(e)
            })?;
            let c = match attempt {
                Attach::Attached(c) => c.clone(),
                Attach::NotReady(why) => {
                    drop(paused);
                    retries += 1;
                    last_not_ready = Some(why);
                    if running.wait_stop(POLL).is_some() {
                        return Ok(());
                    }
                    continue;
                }
            };
            let window = paused.window();
            let latency = paused.latency();
            drop(paused);
            crate::status::clear();
            note!(
                "vmtrace: attached: {} sites patched, {} skipped ({} in init text, {} not a NOP) in a {} µs pause (latency {} µs){}",
                c.patched,
                tracer.plan().skipped_init + c.skipped_other,
                tracer.plan().skipped_init,
                c.skipped_other,
                window.as_micros(),
                latency.as_micros(),
                match &last_not_ready {
                    Some(why) => format!(", after {retries} attempts found the guest not ready (the last: {why})"),
                    None => String::new(),
                }
            );
            if let Some(m) = c.exitless {
                note!("vmtrace: {}", mapped_line(&*tracer, m));
            }
            if let Some(o) = tracer.kernel_offset() {
                let kaslr = if o.is_none() { "no KASLR" } else { "KASLR" };
                note!("vmtrace: kernel offset: {o} ({kaslr})");
            }
            break;
        }
        if running.wait_stop(POLL).is_some() {
            return Ok(());
        }
    }
    // Trace.
    let start = Instant::now();
    loop {
        if running.wait_stop(POLL).is_some() {
            break;
        }
        if duration.is_some_and(|d| start.elapsed() >= d) {
            // Restore under a pause before stopping, so the guest never runs
            // half-restored text.
            let paused = running.pause_all();
            tracer
                .detach(paused.memory())
                .map_err(RuntimeError::Restore)?;
            drop(paused);
            running.request_stop(StopReason::Requested);
            break;
        }
        if status && last_status.elapsed() >= STATUS_EVERY {
            last_status = Instant::now();
            let left = duration.map(|d| d.saturating_sub(start.elapsed()));
            crate::status::draw(&crate::status::tracing(
                &tracer.progress(),
                start.elapsed(),
                left,
            ));
        }
    }
    crate::status::clear();
    Ok(())
}

/// `--stats`: exits per vCPU and kind, assists, where each vCPU stopped
/// (`function` names it), pauses.
fn print_stats(report: &RunReport, function: &dyn Fn(u64) -> Option<String>) {
    use vmm::exit::ExitKind;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "exits per vCPU:");
    let _ = write!(err, "  {:<18}", "kind");
    for cpu in 0..report.vcpus.len() {
        let _ = write!(err, " {:>12}", format!("cpu{cpu}"));
    }
    let _ = writeln!(err);
    for kind in ExitKind::ALL {
        if report.vcpus.iter().all(|v| v.get(kind) == 0) {
            continue;
        }
        let _ = write!(err, "  {:<18}", kind.name());
        for v in &report.vcpus {
            let _ = write!(err, " {:>12}", v.get(kind));
        }
        let _ = writeln!(err);
    }
    for (cpu, v) in report.vcpus.iter().enumerate() {
        for (insn, n) in &v.assists {
            let _ = writeln!(err, "  cpu{cpu}: emulation assist `{insn}` x{n}");
        }
    }
    for (cpu, r) in report.last_regs.iter().enumerate() {
        match r {
            Some(s) => {
                let _ = writeln!(
                    err,
                    "  cpu{cpu} stopped at rip {:#x}{} (cs {:#x} base {:#x}), rsp {:#x}, cr0 {:#x}, cr3 {:#x}",
                    s.regs.rip,
                    function(s.regs.rip).map(|f| format!(" in {f}")).unwrap_or_default(),
                    s.sregs.cs.selector, s.sregs.cs.base, s.regs.rsp, s.sregs.cr0, s.sregs.cr3
                );
            }
            None => {
                let _ = writeln!(err, "  cpu{cpu} had already stopped");
            }
        }
    }
    print_kvm_counts(&mut err, report);
    let p = &report.pause;
    if !p.latency_ns.is_empty() {
        let _ = writeln!(
            err,
            "pauses: {}, latency p50 {} us, window p50 {} us",
            p.latency_ns.len(),
            percentile(&p.latency_ns, 50.0).unwrap_or(0) / 1000,
            percentile(&p.window_ns, 50.0).unwrap_or(0) / 1000
        );
    }
}

/// The `--stats` row of the instructions KVM emulated (`bench` reads its
/// last column, the total).
pub const STATS_INSTRUCTIONS_ROW: &str = "instructions emulated";
/// The `--stats` line of the run's time (`bench` reads it).
pub const STATS_RUN_LINE: &str = "run:";

/// `--stats`: KVM's own per-vCPU counts (KVM_GET_STATS_FD), and the run's
/// time.
fn print_kvm_counts(err: &mut impl Write, report: &RunReport) {
    let counts = &report.kvm;
    let rows: [(&str, Vec<Option<u64>>); 2] = [
        (
            STATS_INSTRUCTIONS_ROW,
            counts.iter().map(|c| c.insn_emulation).collect(),
        ),
        (
            "exits (all kinds)",
            counts.iter().map(|c| c.exits).collect(),
        ),
    ];
    if rows.iter().all(|(_, v)| v.iter().all(Option::is_none)) {
        let why = report
            .kvm_error
            .clone()
            .unwrap_or_else(|| "this KVM has no binary statistics (KVM_GET_STATS_FD)".to_string());
        let _ = writeln!(err, "KVM's own counts: not available ({why})");
    } else {
        let _ = writeln!(err, "KVM's own counts per vCPU (its binary statistics):");
        let _ = write!(err, "  {:<21}", "");
        for cpu in 0..counts.len() {
            let _ = write!(err, " {:>12}", format!("cpu{cpu}"));
        }
        let _ = writeln!(err, " {:>13}", "total");
        for (what, v) in &rows {
            let _ = write!(err, "  {what:<21}");
            for n in v {
                let _ = write!(err, " {:>12}", n.map_or("-".to_string(), |n| n.to_string()));
            }
            let total = v
                .iter()
                .copied()
                .sum::<Option<u64>>()
                .map_or("-".to_string(), |n| n.to_string());
            let _ = writeln!(err, " {total:>13}");
        }
        let _ = writeln!(
            err,
            "  (instructions emulated: counted by KVM's instruction emulator, its insn_emulation; \
             every guest kernel instruction only where KVM emulates guest ring 0 ({}), near 0 \
             on hardware-virtualized KVM)",
            if crate::config::emulator_host() {
                "it does here: kvm_pvm"
            } else {
                "not here, it seems: no kvm_pvm"
            }
        );
    }
    let _ = writeln!(
        err,
        "{STATS_RUN_LINE} {:.3} s from the vCPUs' start to their stop",
        report.elapsed.as_secs_f64()
    );
}

/// Where vmtrace's code page went in the guest: exitless mode's
/// trampoline and rings (and which ring path the trampoline takes), or the
/// trap-mode graph's return trap.
fn mapped_line(tracer: &Tracer, m: tracer::session::exitless::map::Mapped) -> String {
    use tracer::session::exitless::layout::{CODE_VA, PD_COUNT, PD_FIRST, RETURN_TRAP_VA};
    let entries = format!(
        "page-directory entries {PD_FIRST}-{}",
        PD_FIRST + PD_COUNT - 1
    );
    let how = match (m.reused, m.own_pd) {
        (true, _) => format!("{entries} already vmtrace's (an earlier attach)"),
        (false, true) => {
            format!("{entries} of a page directory of vmtrace's own (the guest had none there)")
        }
        (false, false) => format!("{entries}, found empty"),
    };
    match tracer.trampoline() {
        Some(t) => format!(
            "exitless: trampoline and rings mapped at {CODE_VA:#x}, {how}; {}",
            if t.locked {
                "ring reservations locked (lock cmpxchg: the kernel is preemptible)"
            } else {
                "ring reservations unlocked (cmpxchg: the kernel cannot preempt)"
            }
        ),
        None => format!("graph: return trap mapped at {RETURN_TRAP_VA:#x}, {how}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure's time and function come before its message, whose advice
    /// ends the line (before: "...bare-metal KVM host after 12.34 s", and
    /// no function).
    #[test]
    fn a_failure_says_when_and_where_before_its_advice() {
        let reason = StopReason::Error(vmm::VcpuError::Assist(
            vmm::assist::AssistError::Unsupported {
                cpu: 1,
                insn: "xsave [rcx]".into(),
                rip: 0xffff_ffff_8103_0047,
                hint: "boot Linux with `noxsave`",
            },
        ));
        let named = |rip| (rip == 0xffff_ffff_8103_0047).then(|| "fpu__init_cpu+0x47".to_string());
        assert_eq!(
            stop_line(&reason, Duration::from_millis(12_340), &named),
            "after 12.34 s, in fpu__init_cpu+0x47: vCPU 1 executed `xsave [rcx]` at \
             0xffffffff81030047, which this host's KVM cannot emulate; boot Linux with `noxsave`"
        );
        assert_eq!(
            stop_line(&reason, Duration::from_secs(2), &|_| None),
            format!("after 2.00 s: {reason}")
        );
        assert_eq!(
            stop_line(&StopReason::PowerOff(0), Duration::from_millis(300), &named),
            "guest powered off (status 0) after 0.30 s"
        );
    }

    /// A vCPU stopped inside vmtrace's exitless code is named as such, not
    /// left without a function (before: "cpu0 stopped at rip 0x...", no
    /// name, when a signal caught a vCPU recording a call); kernel
    /// addresses keep their function.
    #[test]
    fn a_vcpu_in_vmtraces_own_code_is_named() {
        use tracer::plan::Plan;
        use tracer::session::exitless::layout::{CODE_LEN, CODE_VA};
        use tracer::session::{Mode, Recording};
        let kernel = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("guest/out/mini.elf");
        let plan = || Plan::new(&kernel, &["*".to_string()], &[]).unwrap();
        let p = plan();
        let f = &p.image.functions[p.funcs[0]];
        let (name, addr) = (f.name.clone(), f.addr);
        let rec = Recording::memory(1000);
        let (exitless, _) = Tracer::create(p, 1, Mode::Exitless, None, rec).unwrap();
        assert_eq!(
            function_at(&exitless, CODE_VA + 0x1a).as_deref(),
            Some("vmtrace's trampoline+0x1a")
        );
        assert_eq!(
            function_at(&exitless, CODE_VA + CODE_LEN - 1),
            Some(format!("vmtrace's trampoline+{:#x}", CODE_LEN - 1))
        );
        assert_eq!(
            function_at(&exitless, addr + 1),
            Some(format!("{name}+0x1"))
        );
        // Trap mode maps no code there.
        let (trap, _) = Tracer::new(plan(), 1, 1000);
        assert_eq!(function_at(&trap, CODE_VA + 0x1a), None);
    }
}
