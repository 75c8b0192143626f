//! `vmtrace attach --qmp SOCKET ...`: trace a QEMU guest that is already
//! running (the library's `tracer::qemu` session), then detach, leaving it
//! running as found, and report like a normal run.

use std::time::{Duration, Instant};
use tracer::kernel::events::module_globs;
use tracer::plan::{Note, TracePlan};
use tracer::qemu::gdb::GdbAddr;
use tracer::qemu::libvirt::{self, LibvirtDomain};
use tracer::qemu::session::{self, EndReason, QemuEnded, QemuError, QemuSession};

use tracer::session::backend::HeldUp;
use tracer::session::guest_ftrace;
use tracer::session::store::Storage;
use tracer::session::{Observer, Progress, Recording};

use super::vm_target::VmTarget;
use super::{guard, guest_modules};
use crate::cli::AttachArgs;
use crate::config::{kernel_image, secs, size, Output};
use crate::datafile::Data;
use crate::emit::emit;
use crate::error::{Error, Flags, InputError, Outcome, RuntimeError};

/// The smallest `--buffer`, as for a run.
const MIN_BUFFER: u64 =
    2 * (tracer::session::record::BATCH * tracer::trace::datafile::EVENT_SIZE) as u64;

pub fn main(args: &AttachArgs) -> Result<Outcome, Error> {
    let t = &args.tracing;
    t.check_attach()?;
    let duration = secs(t.duration, "--duration")?;
    let buffer = buffer_size(&t.buffer)?;
    let output = Output::for_run(&args.output, true)?.ok_or(InputError::NoKernel)?;
    // Before the kernel is read and any QEMU touched: a wrong DIR is bad
    // input.
    let files = module_files(args)?;
    let mut image = kernel_image(args.kernel.as_deref(), args.vmlinux.as_deref())?;
    let gdb = args
        .gdb
        .as_deref()
        .map(|g| g.parse::<GdbAddr>().unwrap_or_else(|e| match e {}));
    if let Some(domain) = args.qmp.as_deref().and_then(libvirt::monitor_owner) {
        let path = args.qmp.clone().expect("checked");
        return Err(InputError::LibvirtMonitor { path, domain }.into());
    }
    let connected = connect(args, gdb).map_err(InputError::Qemu)?;
    // Held until this process ends, however it ends (`guard`).
    let target = VmTarget::of(args.qmp.as_deref(), args.domain.as_deref(), &args.connect);
    let mut guardian = guard::spawn_or_say(target, connected.info.pid);
    let added = guest_modules::add(&connected, &mut image, Some("traced"), files.as_deref());
    let request = t.attach_request(connected.info.cpus);
    let (mut plan, waiting) = plan_waiting(image, request, added, files)?;
    check_attachable(&plan)?;
    // Auto mode found exitless mode impossible for this kernel already.
    let planned = plan.notes.iter().find_map(|n| match n {
        Note::AutoTrap { why, remedy } => Some(tracer::advice::join(why.clone(), *remedy, &Flags)),
        _ => None,
    });
    plan.notes.retain(|n| !matches!(n, Note::AutoTrap { .. }));
    // The header names the file given (the bzImage the guest runs), not
    // the vmlinux found beside it for its symbols (the header says where
    // the symbols came from).
    let kernel = args
        .kernel
        .clone()
        .or_else(|| args.vmlinux.clone())
        .unwrap_or_else(|| plan.plan.image.path.clone());
    let mut data = Data::open(output.data.as_ref())?;
    let file = data.file.take().expect("just opened");
    let recording = Recording {
        max_events: t.max_events.unwrap_or(u64::MAX),
        storage: Storage::Stream { file, buffer },
        kernel,
        vmm: connected.info.to_string(),
        cmdline: crate::recorded::argv(),
    };
    vmm::run::install_terminate_handlers().map_err(RuntimeError::Signals)?;
    let events = plan.plan.events.clone();
    let mut waits = Waits::saying(plan.plan.coming.as_ref());
    let mut s = connected.attach_in(plan, recording).map_err(|e| {
        data.discard();
        InputError::Qemu(e)
    })?;
    if let Some(why) = planned.as_ref().or(s.fallback.as_ref()) {
        note!("vmtrace: {why}: tracing through gdbstub breakpoints instead (slow: every traced call stops the whole guest, about 0.7 ms each measured under TCG)");
    }
    say_attached(&s);
    say_modules(s.modules_unfollowed(), waiting.as_deref());
    say_events(&s, &events.behind_static_calls());
    say_syscalls(&events.syscalls);
    say_child_exits(&events, s.traps(), s.tracer().records_child_exits());
    for line in guest_ftrace::attach_lines(&s.tracer().attach_counts.guest_ftrace) {
        note!("{line}");
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    let reason = s.trace_with(duration, &done, &mut waits);
    say_taken_over(&s);
    let ended = s.end_with(&reason, &mut waits);
    waits.say_file_uses();
    if let (Ok(_), Ok(_), Some(g)) = (&ended.detached, &ended.removed, guardian.as_mut()) {
        // All taken out but maybe the ring device of a VM someone holds
        // stopped, said below with its remedy: nothing for the guardian.
        g.detached();
    }
    data.end_on_terminate();
    report(ended, &reason, data, &output)
}

/// The module files of `--modules DIR`, if given.
fn module_files(
    args: &AttachArgs,
) -> Result<Option<std::sync::Arc<tracer::kernel::module_files::ModuleFiles>>, InputError> {
    let files = (args.modules.as_deref())
        .map(tracer::kernel::module_files::ModuleFiles::scan)
        .transpose()?;
    Ok(files.map(std::sync::Arc::new))
}

/// `--buffer`, which also sizes the ring device of a guest that takes one
/// (`tracer::qemu::ring_device::size_for`): its rings are mapped through
/// one 1 GiB entry, so no more than that.
fn buffer_size(value: &str) -> Result<u64, InputError> {
    let buffer = size(value, "--buffer", MIN_BUFFER)?;
    let most = tracer::qemu::ring_device::MAX_SIZED;
    if buffer > most {
        return Err(InputError::Size {
            flag: "--buffer",
            value: value.to_string(),
            why: format!(
                "more than {}G, the most vmtrace attach maps for its rings",
                most >> 30
            ),
        });
    }
    Ok(buffer)
}

/// What the plan asks that an attach refuses before it touches the VM: the
/// module hooks traced (vmtrace follows modules there), events on a kernel
/// whose event sites `attach` cannot enable.
fn check_attachable(plan: &TracePlan) -> Result<(), InputError> {
    if let Some(name) = tracer::qemu::module_hooks::traced_hook(&plan.plan) {
        return Err(InputError::ModuleHookTraced { name });
    }
    plan.plan
        .events
        .attachable(&plan.plan.image.path)
        .map_err(|e| InputError::from(tracer::plan::PlanError::from(e)))
}

/// Where `-e`'s syscall events are recorded (docs/events.md).
fn say_syscalls(syscalls: &[tracer::plan::syscall_events::PlannedSyscall]) {
    if syscalls.is_empty() {
        return;
    }
    let mut funcs: Vec<&str> = syscalls.iter().map(|s| s.func.as_str()).collect();
    funcs.sort_unstable();
    funcs.dedup();
    note!(
        "vmtrace: {} syscall events recorded at {} syscall functions (__x64_sys_NAME: sys_enter_* at the entry, sys_exit_* at the return); nothing written in the guest's threads",
        syscalls.len(),
        funcs.len()
    );
}

/// Where a new task's exit of the forking syscall that created it is
/// recorded (`recorded`), or why it is not (docs/events.md).
fn say_child_exits(events: &tracer::plan::events::EventPlan, traps: bool, recorded: bool) {
    use tracer::kernel::events::fork_child::is_forking_exit;
    let forking: Vec<String> = (events.syscalls.iter())
        .map(|s| s.name.clone())
        .filter(|n| is_forking_exit(&format!("syscalls:{n}")))
        .collect();
    if forking.is_empty() {
        return;
    }
    let names = forking.join(", ");
    match (&events.child_exits, recorded || traps) {
        (Some(_), true) => note!(
            "vmtrace: a new task's {names} recorded at its ret_from_fork (ret 0), the parent's at the syscall's return"
        ),
        (Some(_), false) => note!(
            "vmtrace: a new task's {names} is not recorded in exitless mode here, the parent's only: vmtrace's code copies nothing at its ret_from_fork (the kernel's nofault copies traced, or missing); trace with --mode trap for both"
        ),
        (None, _) => note!(
            "vmtrace: a new task's {names} is not recorded, the parent's only: this kernel's ret_from_fork has no ftrace site (assembly before Linux 6.5)"
        ),
    }
}

/// What `-e` enabled, and what it cannot record yet.
fn say_events(s: &QemuSession, silent: &[String]) {
    let (sites, loads) = s.event_sites();
    if sites > 0 {
        // Trap mode's breakpoints and exitless mode's guard give a site
        // back to the guest as it enables its event.
        let meanwhile = match s.traps() || s.events_taken_over().is_some() {
            true => "the guest may enable these events itself meanwhile",
            false => "do not enable these events in the guest meanwhile (its jump_label would BUG)",
        };
        note!(
            "vmtrace: {} call sites of the events enabled (the kernel's jumps, given back their NOPs at the detach); {meanwhile}",
            sites
        );
    }
    if loads > 0 {
        note!(
            "vmtrace: {loads} tp->funcs loads of the events read tp->iterator instead (this kernel's static calls then reach __traceiter_NAME, traced without a stop; given back at the detach)"
        );
    }
    if !silent.is_empty() {
        note!(
            "vmtrace: not recorded yet: {} (this kernel's static calls reach __traceiter_NAME only while a probe is registered in the guest; docs/events.md)",
            silent.join(", ")
        );
    }
}

/// What the guard did as the guest enabled traced events.
fn say_taken_over(s: &QemuSession) {
    if let Some([sites, back, kept]) = s
        .events_taken_over()
        .filter(|n| n.iter().sum::<usize>() > 0)
    {
        note!(
            "vmtrace: the guest enabled traced events itself meanwhile: {sites} call sites given to it, {back} taken back as it disabled them (vmtrace's again, still recorded; the others its own at the detach), {kept} static call updates kept on __traceiter_NAME, which calls its probes and is still recorded"
        );
    }
}

/// The QEMU to trace: a libvirt domain's (`--domain`), through libvirt,
/// or the one at a QMP socket.
fn connect(args: &AttachArgs, gdb: Option<GdbAddr>) -> Result<session::Connected, QemuError> {
    match VmTarget::of(args.qmp.as_deref(), args.domain.as_deref(), &args.connect) {
        VmTarget::Domain { name, uri } => {
            session::connect_domain(LibvirtDomain::open(uri, name)?, gdb)
        }
        VmTarget::Qmp(qmp) => session::connect(qmp, gdb),
    }
}

/// How often a wait on QEMU is said again while it lasts.
const WAIT_SAID_EVERY: Duration = Duration::from_secs(10);

/// Says what keeps vmtrace waiting on the QEMU (a stalled monitor,
/// someone else's stop): once as it starts, every `WAIT_SAID_EVERY`, and
/// once as it ends.
#[derive(Default)]
struct Waits {
    /// The wait said last, when it was said, and whether this step saw it.
    said: Option<(HeldUp, Instant)>,
    seen: bool,
    /// What `--modules DIR`'s files gave the modules first loaded, said
    /// as they load.
    file_uses: Option<tracer::kernel::ko_file::FileUses>,
}

impl Waits {
    /// Waits that also say what `--modules DIR`'s files give the modules
    /// first loaded (`coming`), as they load.
    fn saying(coming: Option<&tracer::plan::ComingModules>) -> Waits {
        Waits {
            file_uses: coming.map(|c| c.said.clone()),
            ..Waits::default()
        }
    }

    /// Say what the files gave the modules loaded since the last look.
    fn say_file_uses(&self) {
        if let Some(u) = &self.file_uses {
            crate::cmd::say_uses(u);
        }
    }
}

impl Observer for Waits {
    fn held_up(&mut self, why: &HeldUp) {
        self.seen = true;
        let again = match &self.said {
            Some((last, at)) => {
                std::mem::discriminant(last) != std::mem::discriminant(why)
                    || at.elapsed() >= WAIT_SAID_EVERY
            }
            None => true,
        };
        if again {
            match why {
                HeldUp::Unanswered { since } => note!(
                    "vmtrace: QEMU has not answered for {:.0} s (its main loop is busy, or its process is stopped); waiting for it",
                    since.as_secs_f64()
                ),
                HeldUp::Stopped { why, since } => note!(
                    "vmtrace: the VM was stopped by someone else {:.0} s ago ({why}); vmtrace leaves it stopped and waits",
                    since.as_secs_f64()
                ),
            }
            self.said = Some((why.clone(), Instant::now()));
        }
    }

    fn tracing(&mut self, _: &Progress, _: Duration, _: Option<Duration>) {
        self.say_file_uses();
        if !std::mem::take(&mut self.seen) {
            if let Some((last, _)) = self.said.take() {
                match last {
                    HeldUp::Unanswered { .. } => note!("vmtrace: QEMU answers again; tracing on"),
                    HeldUp::Stopped { .. } => note!("vmtrace: the VM runs again; tracing on"),
                }
            }
        }
    }
}

/// The plan of `request`, the loaded modules' events `added` selectable
/// as the image's, its `:mod:` globs of modules not loaded yet kept for
/// the modules the guest loads during the trace (returned, to say).
fn plan_waiting(
    image: tracer::kernel::symbols::KernelImage,
    mut request: tracer::plan::Request,
    added: guest_modules::Added,
    files: Option<std::sync::Arc<tracer::kernel::module_files::ModuleFiles>>,
) -> Result<(TracePlan, Option<Vec<String>>), InputError> {
    // `-e GLOB:mod:MODULE`: the events of a loaded module by their names.
    let loaded: Vec<String> = image.modules.iter().map(|m| m.name.clone()).collect();
    let events = module_globs::resolve(&request.events, &added.events, &loaded)?;
    if !events.waiting.is_empty() {
        let globs = events.waiting.join(",");
        return Err(InputError::EventsModuleWaiting { globs });
    }
    request.events = events.globs;
    request.module_events = added.events;
    let walk = added.walk;
    let waiting = guest_modules::waiting(&mut request, &image, walk, files);
    let mut plan =
        TracePlan::build_waiting(image, &request, waiting.is_some()).map_err(InputError::from)?;
    let Some((coming, globs)) = waiting else {
        return Ok((plan, None));
    };
    if !request.args.is_empty() && request.mode != tracer::plan::ModeChoice::Trap {
        // (Exitless mode's spare sites' code and records hold none.)
        let globs = globs.join(",");
        return Err(InputError::ArgsModuleWaiting { globs });
    }
    plan.reserve_added(coming, guest_modules::ADDED_SITES, &request)
        .map_err(InputError::from)?;
    Ok((plan, Some(globs)))
}

/// Says which `:mod:` globs wait for their module, or that modules are
/// not followed (`unfollowed`: why) and what that leaves untraced.
fn say_modules(unfollowed: Option<&str>, waiting: Option<&[String]>) {
    let globs = waiting.map(|g| g.join(","));
    match (unfollowed, globs) {
        (None, None) => {}
        (None, Some(globs)) => note!(
            "vmtrace: '{globs}': no such module loaded yet; its functions are traced when the guest loads it"
        ),
        (Some(why), globs) => note!(
            "vmtrace: the guest's modules cannot be followed ({why}): functions of modules it loads during the trace are not traced{}, and a traced module it unloads is not traced again (its sites left alone at the detach, their memory freed)",
            globs.map_or_else(String::new, |g| format!(" ('{g}' waits in vain)"))
        ),
    }
}

fn say_attached(s: &QemuSession) {
    let i = &s.info;
    let domain = i
        .domain
        .as_ref()
        .map_or_else(String::new, |d| format!("libvirt domain {d}: "));
    let qemu = format!(
        "vmtrace: attached to {domain}QEMU {}.{}.{} (pid {}, {}, {} vCPUs)",
        i.version.major, i.version.minor, i.version.micro, i.pid, i.accel, i.cpus,
    );
    let sites = s.tracer().attach_counts.patched;
    // A guest booted by UEFI: entry 508 in its runtime services' tables too.
    let device = s.ring_device();
    let efi = device.and_then(|d| d.2).map_or_else(String::new, |e| {
        format!(
            "; its rings also mapped in the UEFI runtime services' page tables (at {:#x})",
            e.root
        )
    });
    match (s.region_pages(), device.map(|(gpa, size, _)| (gpa, size))) {
        // No guest page known unused (a kernel before 5.13): all in the device.
        (Some((0, 0)), Some((gpa, size))) => note!(
            "{qemu}: {sites} sites patched, exitless; \
             vmtrace's code and rings in a hot-plugged ivshmem device \
             ({} MiB at {gpa:#x}, removed at the detach), no guest page used{efi}",
            size >> 20
        ),
        (Some((used, free)), Some((gpa, size))) => note!(
            "{qemu}: {sites} sites patched, exitless; \
             vmtrace's code in {used} of the guest's {free} unused low pages, \
             its rings in a hot-plugged ivshmem device ({} MiB at {gpa:#x}, removed at the detach){efi}",
            size >> 20
        ),
        (Some((used, free)), None) => note!(
            "{qemu}: {sites} sites patched, exitless; \
             vmtrace's code and rings in {used} of the guest's {free} unused low pages"
        ),
        (None, _) => {
            let kind = s.tracer().watch_kind();
            let at = match kind.direct {
                true => "function entries (direct)",
                false => "sites",
            };
            let returns = match kind.returns {
                true => " and at each return address awaited (function graph)",
                false => "",
            };
            // (`say_events` names the events' call sites it wrote.)
            let unwritten = match s.event_sites() {
                (0, 0) => "; guest memory unwritten",
                _ => "",
            };
            note!("{qemu}: a gdbstub breakpoint at each of {sites} {at}{returns}, trap mode{unwritten}")
        }
    }
    // Once attached (a refusal stays one line).
    if s.info.cmpxchg16b_bug {
        let v = &s.info.version;
        note!(
            "vmtrace: QEMU {}.{} under TCG sometimes computes the flags of the guest's cmpxchg16b wrongly (fixed in QEMU 8.0), which can crash this guest (its CPU has cx16), the likelier the more often a trace stops it (trap mode): start the VM with -cpu MODEL,-cx16, or use QEMU 8.0 or later, or KVM",
            v.major, v.minor
        );
    }
}

/// The ring device left in the VM, and why (`QemuEnded::ring_device`).
fn say_ring_device(left: Option<String>) {
    if let Some(why) = left {
        note!(
            "vmtrace: its ring device stays in the VM ({why}): `vmtrace detach` removes it once the guest runs"
        );
    }
}

/// How the detach left the VM: running, or in someone else's stop.
fn runs_on(left_stopped: Option<&str>) -> String {
    match left_stopped {
        None => "the guest runs on".to_string(),
        Some(why) => format!(
            "the VM stays stopped ({}), as someone else stopped it",
            tracer::qemu::liveness::RunState::parse(why)
        ),
    }
}

/// Say how the detach went, then report and save what was traced.
fn report(
    ended: QemuEnded,
    reason: &EndReason,
    data: Data,
    output: &Output,
) -> Result<Outcome, Error> {
    let QemuEnded {
        detached,
        removed,
        attached: _,
        trap,
        drained,
        summary,
        saved,
        left_stopped,
        ring_device,
    } = ended;
    let runs_on = runs_on(left_stopped.as_deref());
    match (&detached, reason) {
        (Ok(d), _) if trap => note!(
            "vmtrace: detached ({reason}): {} breakpoints removed{}; {runs_on}",
            d.restored,
            super::run::left_alone(d),
        ),
        (Ok(d), _) => note!(
            "vmtrace: detached ({reason}): {} sites restored{}{}; {runs_on}",
            d.restored,
            super::run::left_alone(d),
            match &removed {
                Ok(_) => ", vmtrace's code and page-table entries taken out".to_string(),
                Err(why) => format!(
                    ", vmtrace's code and rings left mapped in the guest's unused memory ({why})"
                ),
            }
        ),
        (Err(_), EndReason::QemuGone(_)) => {
            note!("vmtrace: {reason}; kept what was traced until then")
        }
        (Err(_), EndReason::GuestReset(_)) => note!(
            "vmtrace: {reason}: the trace ends there; vmtrace wrote nothing to the guest after it (its kernel, and vmtrace's changes, went with the reset)"
        ),
        (Err(e), _) => return Err(RuntimeError::Detach(e.to_string()).into()),
    }
    say_ring_device(ring_device);
    if let Some(line) = detached
        .as_ref()
        .ok()
        .and_then(|d| guest_ftrace::detach_line(&d.guest_ftrace))
    {
        note!("{line}");
    }
    let saved = saved.unwrap_or_else(|| {
        Err(tracer::trace::datafile::TraceFileError::Invalid {
            path: data.stream.clone(),
            detail: "no data file was written".into(),
        })
    });
    let needs_events = output.view.is_some() || !output.exports.is_empty();
    let trace = match (&saved, needs_events) {
        (Ok(_), true) => tracer::trace::datafile::load(&data.stream).unwrap_or_else(|e| {
            note!("vmtrace: {e}; the report has the counts only");
            summary.clone()
        }),
        _ => summary.clone(),
    };
    let streamed = data.finish(saved, &summary);
    emit(&trace, output, streamed)?;
    match (drained, reason) {
        // Its RAM went with it: what was not drained yet is what the line
        // above says was not kept.
        (Err(_), EndReason::QemuGone(_) | EndReason::GuestReset(_)) | (Ok(()), _) => {
            Ok(Outcome::Clean)
        }
        (Err(e), _) => Err(RuntimeError::Drain(e).into()),
    }
}
