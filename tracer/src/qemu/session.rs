//! A tracing session over a QEMU that is already running: connect through
//! its QMP socket, open its gdbstub, attach exitless inside one all-stop,
//! drain the rings from its RAM while it runs, detach inside another stop,
//! and take everything vmtrace added out again (sites, page-table entries,
//! its pages, the gdbstub), leaving the guest running as found.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use vm_memory::GuestAddress;
use vmm::Stopped;

use super::drive::{Arming, QemuVm, Stub};
use super::ending::Detach;
pub use super::ending::{EndReason, QemuEnded};
pub use super::error::QemuError;
use super::gdb::{Gdb, GdbAddr, GdbError};
use super::guest::{QemuGuest, StopMark};
use super::journal::Journal;
use super::kernel_at::{image_span, kernel_offset, site_addresses};
use super::marker::MARKER_GPA;
use super::mode::{falls_back, ring_cpus, room};
use super::monitor::Monitor;
use super::procmem::ProcRam;
use super::qmp::QemuVersion;
use super::queries::Queries;
use super::repair;
use super::ring_device;
use super::staging::{exitless_region, ring_memory};
use super::stub::{self, GdbStubError};
use crate::kernel::high_rings::EfiTable;
use crate::kernel::lowmem::LowMemory;
use crate::kernel::symbols::KernelImage;
use crate::plan::attach_mode::{self, Decision, Refused};
use crate::plan::{Mode, ModeChoice, TracePlan};
use crate::session::backend::{self, Patience, Waited};
use crate::session::store::Storage;
use crate::session::{Observer, Recording, Tracer};

/// How long to wait for each QMP or gdbstub reply.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Attach attempts while the guest is not ready (its ftrace_init running),
/// `RETRY` apart.
const ATTEMPTS: u32 = 100;
const RETRY: Duration = Duration::from_millis(100);

/// The QEMU traced, for the report's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QemuInfo {
    pub version: QemuVersion,
    pub pid: u32,
    pub accel: &'static str,
    pub qmp: PathBuf,
    pub cpus: usize,
    /// The libvirt domain it runs ("NAME (URI)"), reached through libvirt.
    pub domain: Option<String>,
    /// Its TCG gets the guest's `cmpxchg16b` wrong (`super::tcg_flags`).
    pub cmpxchg16b_bug: bool,
}

impl std::fmt::Display for QemuInfo {
    /// "QEMU 7.2.22 (Debian 1:7.2+dfsg-7), pid 4242, kvm, QMP /run/q.sock",
    /// or "..., libvirt domain vm1 (qemu:///system)"
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = &self.version;
        write!(f, "QEMU {}.{}.{}", v.major, v.minor, v.micro)?;
        if !v.package.trim().is_empty() {
            write!(f, " ({})", v.package.trim())?;
        }
        write!(f, ", pid {}, {}, ", self.pid, self.accel)?;
        match &self.domain {
            Some(d) => write!(f, "libvirt domain {d}"),
            None => write!(f, "QMP {}", self.qmp.display()),
        }
    }
}

/// A QEMU whose monitor answered: what it is and where its RAM is. The
/// guest runs on untouched until `attach`.
pub struct Connected {
    qmp: Monitor,
    ram: ProcRam,
    gdb: Option<GdbAddr>,
    pub info: QemuInfo,
}

/// Connect to the QEMU whose QMP socket is `qmp_path`; its gdbstub will be
/// `gdb`, or one vmtrace opens at `attach`. The socket is held for short
/// bursts only (`super::monitor`).
pub fn connect(qmp_path: &Path, gdb: Option<GdbAddr>) -> Result<Connected, QemuError> {
    connect_monitor(super::burst::connect(qmp_path, REPLY_TIMEOUT)?, gdb)
}

/// `connect`, through any monitor transport (`super::monitor`): the
/// checks at connect in one burst.
pub fn connect_monitor(mut qmp: Monitor, gdb: Option<GdbAddr>) -> Result<Connected, QemuError> {
    let (ram, info) = qmp.burst(look_at)?;
    Ok(Connected {
        qmp,
        ram,
        gdb,
        info,
    })
}

/// What an attach checks first, and where the guest's RAM is.
fn look_at(qmp: &mut Monitor) -> Result<(ProcRam, QemuInfo), QemuError> {
    let qmp_path = qmp.path().to_owned();
    // What a vmtrace that did not detach left comes first: it explains a
    // guest frozen at a breakpoint, and nothing may be added to it.
    let pid = qmp.pid();
    let left = repair::leftovers(qmp, pid)?;
    if !left.is_empty() {
        return Err(QemuError::Leftover {
            qmp: qmp_path,
            what: left.describe(),
        });
    }
    // The gdbstub resumes the guest whenever it lets it go: a paused one
    // (by its user, or started with -S) would not stay paused.
    let status = qmp.status()?;
    if status != "running" {
        return Err(QemuError::NotRunning {
            qmp: qmp_path,
            status,
        });
    }
    let accel = qmp.accel()?;
    let cpus = qmp.cpus()?;
    let Some(first) = cpus.first() else {
        return Err(QemuError::NoVcpus { qmp: qmp_path });
    };
    let cmpxchg16b_bug = super::tcg_flags::asked(qmp, accel, &first.qom_path)?;
    let cpus = cpus.len();
    let layout = qmp.ram_layout()?;
    let ram = ProcRam::open(pid, &layout)?;
    let info = QemuInfo {
        version: qmp.version().clone(),
        pid,
        accel,
        qmp: qmp_path,
        cpus,
        domain: None,
        cmpxchg16b_bug,
    };
    Ok((ram, info))
}

/// Connect to the QEMU of a running libvirt domain, its monitor reached
/// through libvirt (`super::libvirt_monitor`).
pub fn connect_domain(
    domain: super::libvirt::LibvirtDomain,
    gdb: Option<GdbAddr>,
) -> Result<Connected, QemuError> {
    let name = format!("{} ({})", domain.name, domain.uri);
    let mut connected = connect_monitor(super::libvirt_monitor::monitor(domain)?, gdb)?;
    connected.info.domain = Some(name);
    Ok(connected)
}

/// Open (or take the given) gdbstub and connect to it: QEMU stops the
/// guest as a debugger connects. Only while no debugger is connected to
/// QEMU's stub, and the given one must be QEMU's (`stub`); vmtrace's own
/// listens in a private directory. Once connected, QMP must show the
/// connection; any error from there lets the guest go (a dropped client
/// detaches, and `let_go` asks QMP) before the stub is closed.
fn open_stub(
    qmp: &mut Monitor,
    given: Option<GdbAddr>,
    ram: ProcRam,
    mark: StopMark,
) -> Result<(QemuGuest, Stub), QemuError> {
    let qemus = stub::check_free(qmp)?;
    let (addr, opened) = match given {
        Some(a) => {
            stub::check_given(&a, qemus.as_ref())?;
            (a, Stub::Given)
        }
        None => {
            let path = stub::private_dir(qmp.uid())?.join(stub::SOCKET);
            // Reopened at the end: the user's stub (-s) stays theirs.
            let replaced = qemus.as_ref().and_then(|s| stub::reopen_spec(&s.filename));
            // QEMU 7.2 cannot replace an open stub ("duplicate yank
            // instance"): it is closed first.
            if qemus.is_some() {
                if let Err(e) = qmp.close_gdbserver() {
                    stub::remove_private(&path);
                    return Err(e.into());
                }
            }
            let own = stub::OwnStub {
                socket: path.clone(),
                replaced,
            };
            let spec = format!("unix:{},server=on,wait=off", path.display());
            if let Err(e) = qmp.open_gdbserver(&spec) {
                close_stub(qmp, &Stub::Opened(own));
                return Err(e.into());
            }
            (GdbAddr::Unix(path), Stub::Opened(own))
        }
    };
    // QEMU stops the VM as the stub's client connects.
    mark.set(true);
    let mut gdb = match Gdb::connect(&addr, REPLY_TIMEOUT) {
        Ok(g) => g,
        Err(e) => {
            mark.set(false);
            // Not let in (no connection, or queued behind another: its
            // drop wrote the detach there): the guest was not stopped.
            let held = !matches!(e, GdbError::Connect { .. } | GdbError::Busy { .. });
            return Err(let_go(qmp, &opened, e.into(), held));
        }
    };
    let own = matches!(opened, Stub::Opened(_));
    if let Err(e) = stub::confirm(qmp, &addr, own) {
        // Detaching, QEMU resumes the guest.
        let held = gdb.detach().is_err();
        drop(gdb);
        return Err(let_go(qmp, &opened, e.into(), held));
    }
    match QemuGuest::new(gdb, ram) {
        Ok(mut g) => {
            g.set_stop_mark(mark);
            Ok((g, opened))
        }
        // The client was dropped, detaching (whether it could is unknown).
        Err(e) => Err(let_go(qmp, &opened, e.into(), true)),
    }
}

/// Close the gdbstub vmtrace opened (nothing for one the user gave) and
/// its private directory; reopen the stub it replaced, if any.
pub(super) fn close_stub(qmp: &mut Monitor, stub: &Stub) {
    if let Stub::Opened(own) = stub {
        let _ = qmp.close_gdbserver();
        stub::remove_private(&own.socket);
        if let Some(spec) = &own.replaced {
            let _ = qmp.open_gdbserver(spec);
        }
    }
}

/// After an error past the stub's connect, once its client let go: close
/// the stub; if the client may still have held the guest stopped (`held`:
/// its detach failed or is unknown), make sure through QMP that the guest
/// runs (QEMU 7.2 does not resume it when the connection closes), and if
/// it cannot, `error` says that it stays paused and how to continue it. A
/// guest the client let go is never continued: a pause then is not ours.
fn let_go(qmp: &mut Monitor, opened: &Stub, error: QemuError, held: bool) -> QemuError {
    close_stub(qmp, opened);
    if !held {
        return error;
    }
    match stub::let_go(qmp) {
        None => error,
        Some(why) => GdbStubError::LeftPaused {
            error: error.to_string(),
            why,
        }
        .into(),
    }
}

/// A QEMU being traced.
pub struct QemuSession {
    pub(super) vm: QemuVm,
    pub(super) tracer: Tracer,
    pub info: QemuInfo,
    /// The free low memory exitless mode uses (None in trap mode).
    pub low: Option<LowMemory>,
    /// Why trap mode was chosen where exitless was possible to ask for.
    pub fallback: Option<String>,
    pub(super) kernel: PathBuf,
    /// What this attach may have changed, on the host until the detach
    /// gave it all back (`super::journal`).
    pub(super) journal: Option<Journal>,
}

impl Connected {
    /// The guest kernel's loaded modules, read while it runs (None: a
    /// kernel without modules), to add to `image` before the plan.
    pub fn modules(
        &self,
        image: &KernelImage,
    ) -> Result<Option<super::modules::GuestModules>, crate::kernel::modules::ModuleError> {
        super::modules::read(&self.ram, image)
    }

    /// `attach_in` exitless mode.
    pub fn attach(self, mut plan: TracePlan, rec: Recording) -> Result<QemuSession, QemuError> {
        plan.asked = ModeChoice::Exitless;
        self.attach_in(plan, rec)
    }

    /// Open the gdbstub (the guest stops), decide the mode (`decide`) and
    /// plan the region from the stopped guest, then attach in a stop of
    /// its own, retrying while the guest is not ready. On error the guest
    /// runs on as found and the stub is closed.
    pub fn attach_in(self, plan: TracePlan, rec: Recording) -> Result<QemuSession, QemuError> {
        let Connected {
            mut qmp,
            ram,
            gdb,
            info,
        } = self;
        // Before the stub stops the guest: a vmtrace killed from here on
        // leaves a journal naming what to undo.
        let mut journal = Journal::begin(info.pid, &info.qmp, gdb.as_ref().map(|g| g.to_string()))?;
        let mark = StopMark(journal.stop_mark());
        let (guest, stub) = match open_stub(&mut qmp, gdb, ram, mark) {
            Ok(opened) => opened,
            Err(e) => {
                journal.remove();
                return Err(e);
            }
        };
        let kernel = rec.kernel.clone();
        let mut vm = QemuVm::new(qmp, guest, stub, info.pid);
        match setup(&mut vm, plan, rec, &mut journal) {
            Ok(set) => Ok(QemuSession {
                vm,
                tracer: set.tracer,
                info,
                low: set.low,
                fallback: set.fallback,
                kernel,
                journal: Some(journal),
            }),
            Err(e) => {
                // Whatever was written (staged pages, an entry, a site) goes
                // back as the journal says, and the guest is handed back;
                // then the ring device goes (the guest ejects it).
                let gave = repair::give_back(&vm.guest, &journal.record);
                let e = let_go(&mut vm.qmp, &vm.stub, e, gave.is_err());
                let gave = gave.is_ok_and(|g| !g.incomplete)
                    && ring_device::unplug(&mut vm.qmp, &mut journal).is_ok();
                if gave {
                    journal.remove();
                }
                Err(e)
            }
        }
    }
}

/// A session set up.
struct Setup {
    tracer: Tracer,
    low: Option<LowMemory>,
    fallback: Option<String>,
}

// Long: one attach's steps in their order, each a call or a short match:
// the first stop, the mode, the tracer for it, the attach, the events.
fn setup(
    vm: &mut QemuVm,
    mut plan: TracePlan,
    rec: Recording,
    journal: &mut Journal,
) -> Result<Setup, QemuError> {
    // Stopped since the stub connected.
    let first = vm.guest.stop(true)?;
    let offset = kernel_offset(&first, &plan.plan)?;
    crate::session::event_ids::read(&**first.ram(), &mut plan.plan.events, offset);
    let events = plan.plan.events.clone();
    if let Err(why) = super::modules::confirm(&*vm.guest.ram(), &plan.plan.image, offset) {
        let _ = first.resume();
        return Err(QemuError::ModulesChanged(why));
    }
    vm.image = image_span(&plan.plan.image, offset);
    // Exitless mode's rings: one per CPU the guest kernel may use.
    let cpus = ring_cpus(&first, &plan.plan, offset, first.cpus());
    // The ring device's size, from `--buffer` where the rings may have it.
    let device = match &rec.storage {
        Storage::Stream { buffer, .. } => *buffer,
        _ => ring_device::DEFAULT_SIZED,
    };
    let room = || room(&first, &plan.plan, offset, device);
    let decided = attach_mode::decide(&plan, cpus, room, falls_back);
    let decided = match decided {
        Ok(d) => d,
        Err(e) => {
            let _ = first.resume();
            return Err(match e {
                Refused::Plan(e) => e.into(),
                Refused::Room(e) => e,
            });
        }
    };
    first.resume()?;
    let (decided, shared) = ring_memory(vm, journal, &plan, cpus, decided)?;
    let sites = site_addresses(vm, &plan.plan, offset);
    let (mut tracer, low, fallback) = match decided {
        Decision::Exitless(code, room) => {
            let mode = Mode::Exitless(code);
            let (mut tracer, _no_traps) = Tracer::create(plan.plan, cpus, mode, rec)?;
            tracer.assume_kernel_offset(offset);
            let low = room.low.clone();
            journal.arm_exitless(&*vm.guest.ram(), &low.pages, &sites, tracer.task_scan())?;
            exitless_region(vm, &mut tracer, room, shared)?;
            // Staged: the region says whose it is (`super::marker`).
            let marker = journal.marker(offset);
            vm.guest
                .view()
                .write_slice(&marker.encode(), GuestAddress(MARKER_GPA))
                .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
            vm.follow_with(journal, marker);
            (tracer, Some(low), None)
        }
        Decision::Trap { why } => {
            journal.arm_trap(sites.iter().map(|s| s.0).collect())?;
            let cpus = vm.guest.cpus();
            let (mut tracer, handlers) = Tracer::watched(plan.plan, cpus, rec);
            tracer.assume_kernel_offset(offset);
            vm.arming = Arming::Trap {
                handlers: Some(handlers),
                breakpoints: None,
                // (Also names the breakpoints of modules loaded meanwhile.)
                journal: Some(Box::new(journal.for_returns())),
            };
            (tracer, None, why)
        }
    };
    let patience = Patience {
        step: RETRY,
        attempts: Some(ATTEMPTS),
    };
    match backend::attach(&mut tracer, vm, patience, &mut Quiet)? {
        Waited::Attached(_) => {
            vm.enable_events((&events, &tracer.plan().image), offset, journal)?;
            Ok(Setup {
                tracer,
                low,
                fallback,
            })
        }
        Waited::GaveUp(last) => Err(QemuError::NotReady(
            last.map(|w| w.to_string()).unwrap_or_default(),
        )),
        // (The stub's waits end nothing before the attach.)
        Waited::Ended(end) => Err(QemuError::NotReady(EndReason::from(end).to_string())),
    }
}

/// The QEMU session tells no front end how it goes (`Observer`'s defaults).
pub(super) struct Quiet;
impl Observer for Quiet {}

/// Why nothing is written to a QEMU that exited.
const QEMU_GONE: &str = "the QEMU is gone";

/// How often the trace loop looks at the clock, the signals and the QEMU.
const POLL: Duration = Duration::from_millis(50);

impl QemuSession {
    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    /// Whether calls reach vmtrace through breakpoints (trap mode).
    pub fn traps(&self) -> bool {
        matches!(self.vm.arming, Arming::Trap { .. })
    }

    /// The guard of the traced events (exitless mode's `super::event_guard`,
    /// trap mode's breakpoints), if set: the call sites the guest took
    /// over and took back, and its static call updates kept on
    /// `__traceiter_NAME`, as it enabled and disabled traced events.
    pub fn events_taken_over(&self) -> Option<[usize; 3]> {
        match (&self.vm.arming, &self.vm.guard) {
            (
                Arming::Trap {
                    breakpoints: Some(b),
                    ..
                },
                _,
            ) => Some([b.taken_over, b.taken_back, b.kept]),
            (_, Some(g)) => Some([g.taken_over, g.taken_back, g.kept]),
            _ => None,
        }
    }

    /// Why the guest's modules are not followed (`QemuVm::modules_unfollowed`).
    pub fn modules_unfollowed(&self) -> Option<&str> {
        self.vm.modules_unfollowed()
    }

    /// The events' call sites vmtrace enabled (`super::event_sites`), and
    /// its `tp->funcs` loads redirected (`super::funcs_loads`).
    pub fn event_sites(&self) -> (usize, usize) {
        super::funcs_loads::split(&self.vm.jumps)
    }

    /// Trace until `duration` (if any), a termination signal, or the QEMU
    /// going away; in trap mode, serving breakpoint hits meanwhile (no hit
    /// is served outside this call: the guest waits at its first one).
    pub fn trace(&mut self, duration: Option<Duration>) -> EndReason {
        self.trace_until(duration, &AtomicBool::new(false))
    }

    /// `trace`, also until `done` is set (by another thread: e.g. one that
    /// drives the guest's workload while this one serves its hits).
    pub fn trace_until(&mut self, duration: Option<Duration>, done: &AtomicBool) -> EndReason {
        self.trace_with(duration, done, &mut Quiet)
    }

    /// `trace_until`, telling `observer` how it goes (and what keeps it
    /// waiting: a stalled QEMU, someone else's stop).
    pub fn trace_with(
        &mut self,
        duration: Option<Duration>,
        done: &AtomicBool,
        observer: &mut dyn Observer,
    ) -> EndReason {
        backend::trace(&self.tracer, &mut self.vm, duration, done, POLL, observer).into()
    }

    /// Detach inside one stop, take vmtrace's region out inside another
    /// (after a grace period, the rings drained a last time in it) and
    /// hand the guest back to QEMU from it (trap mode: remove the
    /// breakpoints and hand it back in one stop), close the stub vmtrace
    /// opened, and finish the trace. A stalled QEMU is waited for; a VM
    /// someone else stopped is worked on inside that stop and left
    /// stopped; a reset guest, or a QEMU gone, is not written to.
    pub fn end(self, reason: &EndReason) -> QemuEnded {
        self.end_with(reason, &mut Quiet)
    }

    /// `end`, telling `observer` what keeps it waiting.
    pub fn end_with(mut self, reason: &EndReason, observer: &mut dyn Observer) -> QemuEnded {
        let trap = matches!(self.vm.arming, Arming::Trap { .. });
        let untouchable = match reason {
            EndReason::QemuGone(_) => Some(QEMU_GONE),
            EndReason::GuestReset(_) => {
                Some("the guest was reset: its memory is no longer the traced kernel's")
            }
            _ if !self.vm.alive() => Some(QEMU_GONE),
            _ => None,
        };
        let (detached, removed, drained) = match untouchable {
            Some(why) => (
                Err(QemuError::NotTraceable(why.into())),
                Err(why.to_string()),
                self.tracer.stop_draining(),
            ),
            None if trap => (
                self.detach_parts().remove_breakpoints(observer),
                Ok(0),
                self.tracer.stop_draining(),
            ),
            None => {
                let detached = self.detach_parts().detach_sites(observer);
                let (removed, drained) = self
                    .detach_parts()
                    .remove_region(detached.is_ok(), observer);
                (detached, removed, drained)
            }
        };
        if let Arming::Trap {
            breakpoints: Some(b),
            ..
        } = &mut self.vm.arming
        {
            // The store ends once every recorder is gone.
            b.finish();
        }
        // (QMP only, nothing written to the guest; with QEMU gone, only its
        // socket file is left to remove.)
        close_stub(&mut self.vm.qmp, &self.vm.stub);
        let out = untouchable.is_some() || (detached.is_ok() && removed.is_ok());
        let ring_device = self.unplug_rings(out, untouchable == Some(QEMU_GONE)).err();
        // All given back (or the QEMU, or the guest's memory, gone with
        // it): nothing to repair.
        if out && ring_device.is_none() {
            if let Some(j) = self.journal.take() {
                j.remove();
            }
        }
        let attached = self.tracer.attach_counts.patched;
        let left_stopped = self.vm.held.take().map(|(why, _)| why);
        let (summary, saved) = self
            .tracer
            .finish_stored(&self.kernel, reason.to_string(), 0);
        QemuEnded {
            ring_device,
            left_stopped,
            detached,
            removed,
            attached,
            trap,
            drained,
            summary,
            saved,
        }
    }

    /// Take the ring device out once nothing maps it (`out`: the region
    /// is out of the guest, or its memory is no longer the traced
    /// kernel's); with the QEMU `gone`, only its file. A region left in
    /// the guest keeps it, with the journal, for the repair; so does a VM
    /// someone else holds stopped (its guest cannot eject the device, and
    /// vmtrace does not resume it). Err: why it stays.
    fn unplug_rings(&mut self, out: bool, gone: bool) -> Result<(), String> {
        let Some(j) = self.journal.as_mut() else {
            return Ok(());
        };
        match (&j.record.shared, gone, out) {
            (None, _, _) => Ok(()),
            (Some(_), false, false) => Err("vmtrace's region stays in the guest".into()),
            (Some(_), false, true) if self.vm.held.is_some() => {
                Err("the VM is stopped: its guest cannot eject it".into())
            }
            (Some(names), true, _) => {
                let _ = std::fs::remove_file(&names.path);
                Ok(())
            }
            (Some(_), false, true) => {
                ring_device::unplug(&mut self.vm.qmp, j).map_err(|e| e.to_string())
            }
        }
    }

    fn detach_parts(&mut self) -> Detach<'_> {
        Detach {
            vm: &mut self.vm,
            tracer: &mut self.tracer,
        }
    }

    /// The ring device (None without one): its memory's guest-physical
    /// address and size, and the UEFI page tables mapping its rings too.
    pub fn ring_device(&self) -> Option<(u64, u64, Option<EfiTable>)> {
        let shared = self.journal.as_ref()?.record.shared.as_ref()?;
        Some((shared.gpa?, shared.size, shared.efi))
    }

    /// Pages of the guest's free memory vmtrace's region used, of all
    /// (None in trap mode).
    pub fn region_pages(&self) -> Option<(usize, usize)> {
        match &self.vm.arming {
            Arming::Exitless { pages } => {
                Some(pages.lock().unwrap_or_else(|e| e.into_inner()).used())
            }
            Arming::Trap { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_session_can_serve_hits_on_a_thread_of_its_own() {
        fn check<T: Send>() {}
        check::<super::QemuSession>();
    }
}
