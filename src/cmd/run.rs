//! `vmtrace --kernel ...` and `vmtrace record`: boot the guest and, with
//! `--trace`, run the library's session over it (attach, record, detach),
//! then report and/or save the trace. This file only says what happens.

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use tracer::plan::Note;
use tracer::session::guest_ftrace;
use tracer::session::store::Storage;
use tracer::session::{
    Attached, Ended, Observer, Progress, Recording, Session, SessionError, Tracer,
};
use vmm::advice::Advice;
use vmm::{NoTracer, RunReport, StopReason, TrapHandler, Vm};

use crate::cli::{OutputArgs, RunArgs};
use crate::config::{Form, RunConfig, TraceConfig};
use crate::datafile::Data;
use crate::emit::emit;
use crate::error::{Error, Flags, InputError, Outcome, RuntimeError};
use crate::stats::print_stats;

/// How often the live status line is redrawn.
const STATUS_EVERY: Duration = Duration::from_secs(1);

pub fn main(args: &RunArgs, out: &OutputArgs, form: Form) -> Result<Outcome, Error> {
    let RunConfig { vm, stats, trace } = RunConfig::check(args, out, form)?;
    let kernel = vm.kernel.path().to_owned();
    let vm = Vm::create(vm)?;
    match trace {
        None => untraced(vm, stats),
        Some(t) => traced(vm, &kernel, stats, t),
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
    crate::status::end_console();
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
        // "stopped: --duration reached (50.02 s after boot)": the time is
        // the run's, the duration counts from the attach.
        StopReason::DurationReached => format!("{} ({secs:.2} s after boot)", reason.say(&Flags)),
        reason => format!("{reason} after {secs:.2} s"),
    }
}

fn traced(vm: Vm, kernel: &Path, stats: bool, cfg: TraceConfig) -> Result<Outcome, Error> {
    let TraceConfig {
        plan,
        duration,
        max_events,
        buffer,
        overwrite,
        output,
    } = cfg;
    // Left out of tracing, never silently: say which (in the report; here
    // too unless all are overridden __weak functions, as in every Linux).
    let sites = &plan.plan.sites;
    if let Some(rejected) = sites
        .rejected_summary()
        .filter(|_| sites.rejected_unexpected())
    {
        note!(
            "vmtrace: {}: {rejected} (left out)",
            plan.plan.image.path.display()
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
        kernel: kernel.to_owned(),
        vmm: String::new(),
        cmdline: crate::recorded::argv(),
    };
    let notes = plan.notes.clone();
    // What `--modules DIR`'s files give the modules the guest loads.
    let file_uses = plan.plan.coming.as_ref().map(|c| c.said.clone());
    let prepared = Session::prepare(plan, &vm, recording).map_err(|e| {
        data.discard();
        session_error(e)
    })?;
    // Said once nothing can refuse the run any more, before the guest's
    // console starts.
    for n in &notes {
        say_note(n);
    }
    let mut session = prepared.start(vm).map_err(session_error)?;
    let mut status = Status::new(!output.quiet && std::io::stderr().is_terminal());
    status.file_uses = file_uses;
    let result = session.trace(duration, &mut status);
    crate::status::clear();
    let ended = session.end(&Flags);
    // The guest is stopped: its last console line, before vmtrace's.
    crate::status::end_console();
    // A module loaded since the last look.
    status.say_file_uses();
    data.end_on_terminate();
    result.map_err(session_error)?;
    report_end(ended, stats, data, &output)
}

/// Say how the run ended, then report and save what it traced.
fn report_end(
    ended: Ended,
    stats: bool,
    data: Data,
    output: &crate::config::Output,
) -> Result<Outcome, Error> {
    let Ended {
        report,
        detached,
        attached,
        drained,
        places,
        summary,
        saved,
    } = ended;
    let ftrace_line = detached
        .as_ref()
        .ok()
        .and_then(|d| guest_ftrace::detach_line(&d.guest_ftrace));
    match detached {
        Ok(d) if attached > 0 => note!(
            "vmtrace: detached: {} sites restored{}{}",
            d.restored,
            left_alone(&d),
            match d.event_keys {
                0 => String::new(),
                n => format!(", {n} event keys' counts set back to 0"),
            }
        ),
        Ok(_) => {}
        Err(e) => return Err(RuntimeError::Restore(e).into()),
    }
    if let Some(line) = ftrace_line {
        note!("{line}");
    }
    let outcome = stopped(&report, stats, &|rip| places.get(&rip).cloned());
    if attached == 0 {
        data.discard();
        return Err(RuntimeError::NothingTraced(report.reason.clone()).into());
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
    trace.meta.guest_instructions_emulated = report.guest_instructions_emulated();
    let streamed = data.finish(saved, &summary);
    emit(&trace, output, streamed)?;
    if let Some(line) = output
        .data
        .is_none()
        .then(crate::recorded::unsaved_line)
        .flatten()
    {
        note!("vmtrace: {line}");
    }
    say_unfinished(&summary.meta);
    drained.map_err(RuntimeError::Drain)?;
    Ok(outcome)
}

/// Exitless records the guest never finished, said on stderr too: `record`
/// prints no report.
fn say_unfinished(meta: &tracer::trace::model::TraceMeta) {
    if meta.unfinished > 0 {
        let what = match meta.graph {
            true => "records (calls or returns)",
            false => "calls",
        };
        note!(
            "vmtrace: {} {what} reserved a record in vmtrace's rings that was never committed (the \
             guest stopped mid-record): not in the counts, which stay exact for every other call",
            meta.unfinished
        );
    }
}

/// A session error is the user's (nothing was written to the guest) or a
/// failure to restore.
/// What a detach left alone, after its count of sites restored: sites the
/// guest changed, sites of modules it unloaded (their text freed).
pub(crate) fn left_alone(d: &tracer::session::patch::DetachCounts) -> String {
    let mut s = String::new();
    if d.changed > 0 {
        s.push_str(&format!(
            ", {} changed by the guest and left alone",
            d.changed
        ));
    }
    if d.module_unloads > 0 {
        let how = match d.module_restored {
            0 => "its breakpoints removed".to_string(),
            n => format!("its sites restored, {n} in all,"),
        };
        s.push_str(&format!(
            "; a traced module went away {} times ({how} before its memory was freed) and came \
             back {} times (traced again{})",
            d.module_unloads,
            d.module_reloads,
            untraced_sites(d)
        ));
    }
    if d.module_event_sites > 0 {
        s.push_str(&format!(
            "; {} event site{} of a traced module given back at its unloads, before its \
             memory was freed",
            d.module_event_sites,
            if d.module_event_sites == 1 { "" } else { "s" },
        ));
    }
    if d.module_event_sites_freed > 0 {
        s.push_str(&format!(
            "; {} event site{} of a traced module unloaded unfollowed left alone (its memory freed)",
            d.module_event_sites_freed,
            if d.module_event_sites_freed == 1 { "" } else { "s" },
        ));
    }
    if d.module_events_again + d.module_events_untraced > 0 {
        s.push_str(&format!(
            "; {} time{} a traced module's event traced again at its load",
            d.module_events_again,
            if d.module_events_again == 1 { "" } else { "s" },
        ));
        if d.module_events_untraced > 0 {
            s.push_str(&format!(
                " ({} left untraced: their code differs from the attach's)",
                d.module_events_untraced
            ));
        }
    }
    if d.module_first > 0 {
        s.push_str(&format!(
            "; {} module{} first loaded during the trace, traced from {} load",
            d.module_first,
            if d.module_first == 1 { "" } else { "s" },
            if d.module_first == 1 { "its" } else { "their" },
        ));
        if d.module_unslotted > 0 {
            s.push_str(&format!(
                " (but {} function loads past vmtrace's spare sites left untraced)",
                d.module_unslotted
            ));
        }
        if let Some(refused) = d.module_refused.as_ref() {
            s.push_str(&format!(" ({refused})"));
        }
        if d.module_trap_exits > 0 {
            s.push_str(&format!(
                " ({} exits at vmtrace's traps in the module loader)",
                d.module_trap_exits
            ));
        }
    }
    if d.module_gone > 0 {
        s.push_str(&format!(
            ", {} in modules the guest unloaded during the trace left alone (their memory freed)",
            d.module_gone
        ));
    }
    s
}

/// The sites of a module loaded again that were left untraced, and why.
fn untraced_sites(d: &tracer::session::patch::DetachCounts) -> String {
    let mut s = String::new();
    if d.module_untraced > 0 {
        s.push_str(&format!(
            ", but {} sites whose code changed",
            d.module_untraced
        ));
    }
    if d.module_in_use > 0 {
        s.push_str(&format!(
            ", but {} sites the guest's own ftrace used",
            d.module_in_use
        ));
    }
    if d.module_displaced > 0 {
        s.push_str(&format!(
            ", but {} direct entries that displaced instructions (their stubs are for the first \
             address)",
            d.module_displaced
        ));
    }
    s
}

fn session_error(e: SessionError) -> Error {
    match e {
        SessionError::Attach(e) => InputError::Tracer(e).into(),
        SessionError::Restore(e) => RuntimeError::Restore(e).into(),
        SessionError::Start(e) => RuntimeError::Start(e).into(),
    }
}

/// What the plan said about itself, in the CLI's words.
fn say_note(n: &Note) {
    match n {
        Note::GraphLeftOut(names) => note!(
            "vmtrace: --graph: left out {}: the guest's unwinder would stop at vmtrace's hook",
            tracer::plan::graph_names(names)
        ),
        Note::GraphGuestStacks => note!(
            "vmtrace: --graph: the guest's own stack traces leave out the caller of each hooked call \
             (its return address is vmtrace's, outside kernel text); ORC and frame-pointer unwinders \
             mark the frames beyond it unreliable ('?')"
        ),
        Note::AutoTrap { why, remedy } => note!(
            "vmtrace: --mode auto: tracing with traps: {}",
            tracer::advice::join(why.clone(), *remedy, &Flags)
        ),
        Note::Direct(summary) => note!("vmtrace: direct entries: {summary}"),
    }
}

/// The CLI's view of a session: the live status line on a terminal, and
/// the attach said once.
struct Status {
    draw: bool,
    last: Instant,
    /// When the guest started (the attach says how long after).
    started: Instant,
    /// What `--modules DIR`'s files gave the modules loaded, said as they
    /// load.
    file_uses: Option<tracer::kernel::ko_file::FileUses>,
}

impl Status {
    fn new(draw: bool) -> Status {
        Status {
            draw,
            last: Instant::now(),
            started: Instant::now(),
            file_uses: None,
        }
    }

    /// Say what module files gave the modules loaded since the last look.
    fn say_file_uses(&self) {
        if let Some(u) = &self.file_uses {
            crate::cmd::say_uses(u);
        }
    }

    /// Time to redraw?
    fn due(&mut self) -> bool {
        if !self.draw || self.last.elapsed() < STATUS_EVERY {
            return false;
        }
        self.last = Instant::now();
        true
    }
}

impl Observer for Status {
    fn waiting(&mut self, since_start: Duration) {
        if self.due() {
            crate::status::draw(&crate::status::waiting(since_start));
        }
    }

    fn attached(&mut self, a: &Attached, tracer: &Tracer) {
        crate::status::clear();
        let skipped_init = tracer.plan().skipped_init;
        let c = &a.counts;
        let direct = tracer.plan().direct.is_some();
        note!(
            "vmtrace: attached: {} {}sites patched, {} skipped ({} in init text, {} {}) in a {} µs pause (latency {} µs), {:.1} s after boot{}",
            c.patched,
            if direct { "direct " } else { "" },
            skipped_init + c.skipped_other,
            skipped_init,
            c.skipped_other,
            if direct {
                format!(
                    "other: {} whose first instructions the running kernel changed, {} with a guest \
                     context inside; {} tasks' stacks checked",
                    c.direct_changed, c.direct_busy, c.direct_tasks
                )
            } else {
                "not a NOP".to_string()
            },
            a.window.as_micros(),
            a.latency.as_micros(),
            self.started.elapsed().as_secs_f64(),
            match &a.last_not_ready {
                Some(why) => format!(", after {}", why.waited_for()),
                None => String::new(),
            }
        );
        for line in guest_ftrace::attach_lines(&c.guest_ftrace) {
            note!("{line}");
        }
        if c.event_keys > 0 {
            // docs/events.md: the own VMM sets the keys' counts. By the
            // mode, not by `c.exitless`: trap mode's graph maps its return
            // trap too.
            let (tests, meanwhile) = match tracer.trampoline().is_some() {
                true => (
                    "tp->funcs loads made to read tp->iterator",
                    "the guest must not enable them itself meanwhile",
                ),
                false => (
                    "tp->funcs tests trapped",
                    "an event the guest enables itself meanwhile is recorded no more",
                ),
            };
            note!(
                "vmtrace: events: {} enabled (their keys' counts set to 1), {} {tests}; {meanwhile}",
                c.event_keys,
                c.event_tests
            );
        }
        if let Some(m) = c.exitless {
            note!("vmtrace: {}", mapped_line(tracer, m));
        }
        if let Some(o) = tracer.kernel_offset() {
            let kaslr = if o.is_none() { "no KASLR" } else { "KASLR" };
            note!("vmtrace: kernel offset: {o} ({kaslr})");
        }
        self.last = Instant::now();
    }

    fn tracing(&mut self, progress: &Progress, elapsed: Duration, left: Option<Duration>) {
        self.say_file_uses();
        if self.due() {
            crate::status::draw(&crate::status::tracing(progress, elapsed, left));
        }
    }
}

/// Where vmtrace's code page went in the guest: exitless mode's
/// trampoline and rings (and which ring path the trampoline takes), or the
/// trap-mode graph's return trap.
fn mapped_line(tracer: &Tracer, m: tracer::session::exitless::map::Mapped) -> String {
    use tracer::plan::exitless::layout::{CODE_VA, PD_COUNT, PD_FIRST, RETURN_TRAP_VA};
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

    /// The event sites of a module unloaded unfollowed, left alone at the
    /// detach, are said (one, and more).
    #[test]
    fn a_detach_says_the_event_sites_it_leaves_in_freed_module_memory() {
        let d = |n| tracer::session::patch::DetachCounts {
            module_event_sites_freed: n,
            ..Default::default()
        };
        assert_eq!(left_alone(&d(0)), "");
        assert_eq!(
            left_alone(&d(1)),
            "; 1 event site of a traced module unloaded unfollowed left alone (its memory freed)"
        );
        assert!(left_alone(&d(3)).starts_with("; 3 event sites of a traced module"));
    }

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
        // The trace's own end, in the flag's words; the library's plain.
        assert_eq!(
            stop_line(
                &StopReason::DurationReached,
                Duration::from_millis(50_020),
                &named
            ),
            "stopped: --duration reached (50.02 s after boot)"
        );
        assert_eq!(
            StopReason::DurationReached.to_string(),
            "stopped: the trace's duration reached"
        );
    }
}
