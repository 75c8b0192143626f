//! A tracing session over a QEMU that is already running: connect through
//! its QMP socket, open its gdbstub, attach exitless inside one all-stop,
//! drain the rings from its RAM while it runs, detach inside another stop,
//! and take everything vmtrace added out again (sites, page-table entries,
//! its pages, the gdbstub), leaving the guest running as found.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vmm::Stopped;

use super::drive::{Arming, QemuVm, Stub};
pub use super::error::QemuError;
use super::gdb::{Gdb, GdbAddr};
use super::guest::{ClockSource, QemuGuest, QemuStop};
use super::mode::{falls_back, ring_cpus, room, FreeRoom};
use super::procmem::ProcRam;
use super::qmp::{QemuVersion, Qmp};
use crate::error::TracerError;
use crate::kernel::kaslr::{self, Detected, KernelOffset};
use crate::kernel::lowmem::LowMemory;
use crate::kernel::symbols::KernelImage;
use crate::plan::attach_mode::{self, Decision, Refused};
use crate::plan::{Mode, ModeChoice, Plan, TracePlan};
use crate::session::backend::{self, Patience, TraceEnd, Waited};
use crate::session::exitless::backing::{Backed, RegionPages};
use crate::session::patch::DetachCounts;
use crate::session::Saved;
use crate::session::{Observer, Recording, Tracer};
use crate::trace::datafile::TraceFileError;
use crate::trace::model::Trace;

/// How long to wait for each QMP or gdbstub reply.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Attach attempts while the guest is not ready (its ftrace_init running),
/// `RETRY` apart.
const ATTEMPTS: u32 = 100;
const RETRY: Duration = Duration::from_millis(100);
/// After the sites are restored: the guest runs this long before vmtrace's
/// code is taken out, so that any context interrupted inside it finishes.
const GRACE: Duration = Duration::from_millis(50);
/// The kernel image's virtual area: `__START_KERNEL_map` and its size with
/// KASLR (arch/x86/include/asm/page_64_types.h).
const KERNEL_MAP_BASE: u64 = vmm::layout::KERNEL_MAP_BASE;
const KERNEL_IMAGE_SIZE: u64 = 1 << 30;

/// The QEMU traced, for the report's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QemuInfo {
    pub version: QemuVersion,
    pub pid: u32,
    pub accel: &'static str,
    pub qmp: PathBuf,
    pub cpus: usize,
}

impl std::fmt::Display for QemuInfo {
    /// "QEMU 7.2.22 (Debian 1:7.2+dfsg-7), pid 4242, kvm, QMP /run/q.sock"
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = &self.version;
        write!(f, "QEMU {}.{}.{}", v.major, v.minor, v.micro)?;
        if !v.package.trim().is_empty() {
            write!(f, " ({})", v.package.trim())?;
        }
        write!(
            f,
            ", pid {}, {}, QMP {}",
            self.pid,
            self.accel,
            self.qmp.display()
        )
    }
}

/// A QEMU whose monitor answered: what it is and where its RAM is. The
/// guest runs on untouched until `attach`.
pub struct Connected {
    qmp: Qmp,
    ram: ProcRam,
    gdb: Option<GdbAddr>,
    pub info: QemuInfo,
}

/// Connect to the QEMU whose QMP socket is `qmp_path`; its gdbstub will be
/// `gdb`, or one vmtrace opens at `attach`.
pub fn connect(qmp_path: &Path, gdb: Option<GdbAddr>) -> Result<Connected, QemuError> {
    let mut qmp = Qmp::connect(qmp_path, REPLY_TIMEOUT)?;
    // The gdbstub resumes the guest whenever it lets it go: a paused one
    // (by its user, or started with -S) would not stay paused.
    let status = qmp.status()?;
    if status != "running" {
        return Err(QemuError::NotRunning {
            qmp: qmp_path.to_owned(),
            status,
        });
    }
    let pid = qmp.pid()?;
    let accel = qmp.accel()?;
    let cpus = qmp.cpus()?.len();
    if cpus == 0 {
        return Err(QemuError::NoVcpus {
            qmp: qmp_path.to_owned(),
        });
    }
    let layout = qmp.ram_layout()?;
    let ram = ProcRam::open(pid, &layout)?;
    let info = QemuInfo {
        version: qmp.version().clone(),
        pid,
        accel,
        qmp: qmp_path.to_owned(),
        cpus,
    };
    Ok(Connected {
        qmp,
        ram,
        gdb,
        info,
    })
}

/// Open (or take the given) gdbstub and connect to it: QEMU stops the
/// guest as a debugger connects.
fn open_stub(
    qmp: &mut Qmp,
    given: Option<GdbAddr>,
    ram: ProcRam,
    pid: u32,
) -> Result<(QemuGuest, Stub), QemuError> {
    let (addr, stub) = match given {
        Some(a) => (a, Stub::Given),
        None => {
            let path =
                std::env::temp_dir().join(format!("vmtrace-gdb-{}-{pid}.sock", std::process::id()));
            let _ = std::fs::remove_file(&path);
            qmp.open_gdbserver(&format!("unix:{},server=on,wait=off", path.display()))?;
            (GdbAddr::Unix(path.clone()), Stub::Opened(path))
        }
    };
    match Gdb::connect(&addr, REPLY_TIMEOUT).and_then(|g| QemuGuest::new(g, ram)) {
        Ok(g) => Ok((g, stub)),
        Err(e) => {
            close_stub(qmp, &stub);
            Err(e.into())
        }
    }
}

/// Close the gdbstub vmtrace opened (nothing for one the user gave).
fn close_stub(qmp: &mut Qmp, stub: &Stub) {
    if let Stub::Opened(path) = stub {
        let _ = qmp.close_gdbserver();
        let _ = std::fs::remove_file(path);
    }
}

/// Where the kernel runs (KASLR), from the first stop.
fn kernel_offset(stop: &QemuStop<'_>, plan: &Plan) -> Result<KernelOffset, QemuError> {
    match kaslr::detect(stop, &plan.image) {
        Ok(Detected::Offset(o)) => Ok(o),
        Ok(_) => Err(not_found(stop, &plan.image)),
        Err(e) => Err(QemuError::NotTraceable(e.to_string())),
    }
}

/// Why the kernel's banner was found nowhere: a kernel runs (its image's
/// virtual area maps memory) but not this one, or none runs yet. The
/// running kernel maps at least 2 MiB there, so one of the 2 MiB steps
/// lands in it.
fn not_found(stop: &QemuStop<'_>, image: &KernelImage) -> QemuError {
    // Any paged vCPU's tables: the kernel's image area is in every one.
    let mapped = stop.vcpu_spaces().into_iter().any(|mut v| {
        (0..KERNEL_IMAGE_SIZE / kaslr::KASLR_ALIGN).any(|i| {
            v.space
                .gpa(KERNEL_MAP_BASE + i * kaslr::KASLR_ALIGN)
                .is_ok()
        })
    });
    let banner = image
        .symbol(kaslr::BANNER)
        .and_then(|b| image.file_bytes(b.addr, usize::try_from(b.size).ok()?));
    match (mapped, banner) {
        (true, Some(b)) => QemuError::OtherKernel {
            path: image.path.clone(),
            banner: String::from_utf8_lossy(b)
                .trim_end_matches(['\0', '\n'])
                .to_string(),
        },
        _ => QemuError::NotTraceable(
            "no vCPU runs with the kernel's page tables, and its banner is not mapped (still in firmware or early boot?)".into(),
        ),
    }
}

/// A QEMU being traced.
pub struct QemuSession {
    vm: QemuVm,
    tracer: Tracer,
    pub info: QemuInfo,
    /// The free low memory exitless mode uses (None in trap mode).
    pub low: Option<LowMemory>,
    /// Why trap mode was chosen where exitless was possible to ask for.
    pub fallback: Option<String>,
    kernel: PathBuf,
}

impl Connected {
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
        attach_mode::check_early(&plan)?;
        let Connected {
            mut qmp,
            ram,
            gdb,
            info,
        } = self;
        let (guest, stub) = open_stub(&mut qmp, gdb, ram, info.pid)?;
        let kernel = rec.kernel.clone();
        let mut vm = QemuVm {
            qmp,
            guest,
            stub,
            // Set at the first stop (`setup`).
            arming: Arming::Trap {
                handlers: None,
                breakpoints: None,
            },
            tracing: false,
        };
        match setup(&mut vm, plan, rec) {
            Ok(set) => Ok(QemuSession {
                vm,
                tracer: set.tracer,
                info,
                low: set.low,
                fallback: set.fallback,
                kernel,
            }),
            Err(e) => {
                let _ = vm.guest.release();
                close_stub(&mut vm.qmp, &vm.stub);
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

fn setup(vm: &mut QemuVm, plan: TracePlan, rec: Recording) -> Result<Setup, QemuError> {
    // Stopped since the stub connected.
    let first = vm.guest.stop(true)?;
    let offset = kernel_offset(&first, &plan.plan)?;
    // Exitless mode's rings: one per CPU the guest kernel may use.
    let cpus = ring_cpus(&first, &plan.plan, offset, first.cpus());
    let decided = attach_mode::decide(&plan, cpus, || room(&first, &plan.plan, offset), falls_back);
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
    let (tracer, low, fallback) = match decided {
        Decision::Exitless(code, room) => {
            let mode = Mode::Exitless(code);
            let (mut tracer, _no_traps) = Tracer::create(plan.plan, cpus, mode, rec)?;
            tracer.assume_kernel_offset(offset);
            let low = room.low.clone();
            exitless_region(vm, &mut tracer, room)?;
            (tracer, Some(low), None)
        }
        Decision::Trap { why } => {
            let cpus = vm.guest.cpus();
            let (mut tracer, handlers) = Tracer::create(plan.plan, cpus, Mode::Trap, rec)?;
            tracer.assume_kernel_offset(offset);
            vm.arming = Arming::Trap {
                handlers: Some(handlers),
                breakpoints: None,
            };
            (tracer, None, why)
        }
    };
    let mut tracer = tracer;
    let patience = Patience {
        step: RETRY,
        attempts: Some(ATTEMPTS),
    };
    match backend::attach(&mut tracer, vm, patience, &mut Quiet)? {
        Waited::Attached(_) => Ok(Setup {
            tracer,
            low,
            fallback,
        }),
        Waited::GaveUp(last) => Err(QemuError::NotReady(
            last.map(|w| w.to_string()).unwrap_or_default(),
        )),
        // (The stub's waits end nothing before the attach.)
        Waited::Ended(end) => Err(QemuError::NotReady(EndReason::from(end).to_string())),
    }
}

/// Exitless mode's region in the guest's free pages, its rings, tables and
/// pool written while the guest runs (unmapped until the attach): the
/// attach's stop then only writes the code, the mapping and the sites.
fn exitless_region(vm: &mut QemuVm, tracer: &mut Tracer, room: FreeRoom) -> Result<(), QemuError> {
    let pages = Arc::new(Mutex::new(RegionPages::new(room.low.pages)));
    tracer.back_region(Arc::clone(&pages));
    vm.guest
        .set_view(Arc::new(Backed::new(vm.guest.ram(), Arc::clone(&pages))));
    vm.guest.set_clock(ClockSource {
        tsc_khz: room.tsc_khz,
    });
    vm.arming = Arming::Exitless { pages };
    tracer.stage(vm.guest.view())?;
    Ok(())
}

/// How a QEMU session ended.
pub struct QemuEnded {
    /// What the detach restored, or why it could not.
    pub detached: Result<DetachCounts, QemuError>,
    /// vmtrace's page-table entries taken out, or why its region stays
    /// (the QEMU was gone, a hooked call never returned, ...); trap mode
    /// has none (0).
    pub removed: Result<usize, String>,
    /// Sites patched (or breakpoints set) at the attach.
    pub attached: usize,
    /// Traced through breakpoints: no region was there to take out.
    pub trap: bool,
    /// An error draining the rings (the counts stay exact).
    pub drained: Result<(), TracerError>,
    pub summary: Trace,
    pub saved: Option<Result<Saved, TraceFileError>>,
}

/// Why a trace ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndReason {
    Duration,
    Signal(i32),
    /// QEMU closed its sockets (it quit or was killed).
    QemuGone(String),
    /// The gdbstub failed while tracing through its breakpoints (QEMU
    /// still answers its monitor).
    Stub(String),
    /// The caller said so (`QemuSession::trace_until`).
    Done,
}

impl From<TraceEnd> for EndReason {
    fn from(end: TraceEnd) -> EndReason {
        match end {
            TraceEnd::Duration => EndReason::Duration,
            TraceEnd::Signal(sig) => EndReason::Signal(sig),
            // A QEMU's guest never stops on its own: its monitor goes.
            TraceEnd::GuestStopped => EndReason::QemuGone("the guest stopped".into()),
            TraceEnd::VmmGone(why) => EndReason::QemuGone(why),
            TraceEnd::Stub(why) => EndReason::Stub(why),
            TraceEnd::Done => EndReason::Done,
        }
    }
}

/// The QEMU session tells no front end how it goes (`Observer`'s defaults).
struct Quiet;
impl Observer for Quiet {}

impl std::fmt::Display for EndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndReason::Duration => write!(f, "duration elapsed"),
            EndReason::Signal(sig) => write!(f, "signal {sig}"),
            EndReason::QemuGone(why) => write!(f, "QEMU went away: {why}"),
            EndReason::Stub(why) => write!(f, "the gdbstub failed: {why}"),
            EndReason::Done => write!(f, "done"),
        }
    }
}

/// How often the trace loop looks at the clock, the signals and the QEMU.
const POLL: Duration = Duration::from_millis(50);

impl QemuSession {
    pub fn tracer(&self) -> &Tracer {
        &self.tracer
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
        backend::trace(&self.tracer, &mut self.vm, duration, done, POLL, &mut Quiet).into()
    }

    /// Detach inside one stop, drain, take vmtrace's region out inside
    /// another (after a grace period) and hand the guest back to QEMU from
    /// it (trap mode: remove the breakpoints and hand it back in one stop),
    /// close the stub vmtrace opened, and finish the trace.
    pub fn end(mut self, reason: &EndReason) -> QemuEnded {
        let gone = matches!(reason, EndReason::QemuGone(_));
        let trap = matches!(self.vm.arming, Arming::Trap { .. });
        let detached = match (gone, trap) {
            (true, _) => Err(QemuError::NotTraceable("the QEMU is gone".into())),
            (false, false) => self.detach_sites(),
            (false, true) => self.remove_breakpoints(),
        };
        let drained = self.tracer.stop_draining();
        let removed = match (gone, trap) {
            (true, _) => Err("the QEMU is gone".into()),
            (false, true) => Ok(0),
            (false, false) => self.remove_region(detached.is_ok()),
        };
        if let Arming::Trap {
            breakpoints: Some(b),
            ..
        } = &mut self.vm.arming
        {
            // The store ends once every recorder is gone.
            b.finish();
        }
        close_stub(&mut self.vm.qmp, &self.vm.stub);
        let attached = self.tracer.attach_counts.patched;
        let (summary, saved) = self
            .tracer
            .finish_stored(&self.kernel, reason.to_string(), 0);
        QemuEnded {
            detached,
            removed,
            attached,
            trap,
            drained,
            summary,
            saved,
        }
    }

    /// Trap mode's detach: in one stop, record a hit that came just
    /// before it, remove every breakpoint, and hand the guest back.
    fn remove_breakpoints(&mut self) -> Result<DetachCounts, QemuError> {
        let vm = &mut self.vm;
        let Arming::Trap {
            breakpoints: Some(b),
            ..
        } = &mut vm.arming
        else {
            return Ok(DetachCounts::default());
        };
        // Only the reply of the stop below counts.
        let _ = vm.guest.take_last_stop();
        let stop = vm.guest.stop(false)?;
        let last = vm.guest.take_last_stop();
        let n = b.remove(&vm.guest, &stop, last)?;
        let c = self.tracer.unwatched(n);
        stop.detach()?;
        Ok(c)
    }

    fn detach_sites(&mut self) -> Result<DetachCounts, QemuError> {
        let stop = self.vm.guest.stop(false)?;
        let c = self.tracer.detach(&**stop.ram())?;
        stop.resume()?;
        Ok(c)
    }

    /// Take the region out once no vCPU runs in it and (function graph)
    /// no hooked call has yet to return through it, trying for
    /// `ATTEMPTS` x `GRACE`; then hand the guest back to QEMU from that
    /// last stop. Never while a site may still lead there (`sites_out`
    /// false: the detach failed). Returns the entries cleared, or why the
    /// region stays.
    fn remove_region(&mut self, sites_out: bool) -> Result<usize, String> {
        for attempt in 1..=ATTEMPTS {
            std::thread::sleep(GRACE);
            let stop = self.vm.guest.stop(false).map_err(|e| e.to_string())?;
            let removed = match sites_out {
                true => self.tracer.remove_region(&stop),
                false => {
                    let _ = stop.detach();
                    return Err("the sites could not all be restored, and may lead to it".into());
                }
            };
            let why = match removed {
                Ok(Ok(n)) => {
                    stop.detach().map_err(|e| e.to_string())?;
                    return Ok(n);
                }
                Ok(Err(_)) if attempt < ATTEMPTS => {
                    stop.resume().map_err(|e| e.to_string())?;
                    continue;
                }
                Ok(Err(busy)) => busy.to_string(),
                Err(e) => e.to_string(),
            };
            let _ = stop.detach();
            return Err(why);
        }
        Err("no stop".into())
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
