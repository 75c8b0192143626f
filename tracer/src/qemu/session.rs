//! A tracing session over a QEMU that is already running: connect through
//! its QMP socket, open its gdbstub, attach exitless inside one all-stop,
//! drain the rings from its RAM while it runs, detach inside another stop,
//! and take everything vmtrace added out again (sites, page-table entries,
//! its pages, the gdbstub), leaving the guest running as found.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vmm::gva::{AddressSpace, Level};
use vmm::Stopped;

use super::gdb::{Gdb, GdbAddr, GdbError};
use super::guest::{ClockSource, QemuGuest, QemuStop};
use super::procmem::ProcRam;
use super::qmp::{QemuVersion, Qmp, QmpError};
use crate::error::TracerError;
use crate::kernel::kaslr::{self, Detected, KernelOffset};
use crate::kernel::lowmem::{self, LowMemError, LowMemory};
use crate::kernel::symbols::KernelImage;
use crate::plan::{Mode, Plan};
use crate::session::exitless::backing::{
    Backed, RegionPages, CODE_SLOTS, GRAPH_BOTTOM, PAGE, STUB_PAGES, TABLE_SLOTS,
};
use crate::session::exitless::layout::{
    RingLayout, CODE_VA, LARGE_PAGE, MAX_RECORDS, MIN_RECORDS, PD_COUNT,
};
use crate::session::exitless::state::Exitless;
use crate::session::patch::DetachCounts;
use crate::session::Saved;
use crate::session::{Attach, Recording, Tracer};
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

#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error(transparent)]
    Gdb(#[from] GdbError),
    #[error(transparent)]
    Ram(#[from] super::procmem::ProcMemError),
    #[error("the guest of the QEMU at {qmp} is not running (its status is {status}): vmtrace attaches to running guests only, and would leave this one running; continue it first (QMP cont)")]
    NotRunning { qmp: PathBuf, status: String },
    #[error("the QEMU at {qmp} has no vCPU the gdbstub lists")]
    NoVcpus { qmp: PathBuf },
    #[error("cannot find the running kernel in the guest: {0}")]
    NotTraceable(String),
    #[error("the guest runs another kernel than {path}: its banner ({banner:?}) is nowhere in the guest kernel's mapping; give the running kernel's vmlinux or bzImage")]
    OtherKernel { path: PathBuf, banner: String },
    #[error("no guest memory is free for vmtrace's code and rings: {0}")]
    NoRoom(#[from] LowMemError),
    #[error("the guest kernel's tsc_khz is {0}: its TSC rate is unknown, so exitless events cannot be dated")]
    NoTscRate(u32),
    #[error("{sites} sites on {cpus} CPUs need more than the {kib} KiB of guest memory the guest leaves unused; trace fewer functions")]
    RingsTooBig { sites: usize, cpus: usize, kib: u64 },
    #[error("the page-directory entries vmtrace maps its code with are in use, by the guest or by an earlier vmtrace attach that left its code there for function-graph calls that had not returned (it stays until the guest reboots): no exitless attach is possible")]
    RegionLeft,
    #[error("the guest was never ready to attach ({0})")]
    NotReady(String),
    #[error(transparent)]
    Tracer(#[from] TracerError),
}

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

/// Where the gdbstub is: one vmtrace opened through QMP (and closes at
/// the end), or one the user gave.
enum Stub {
    Opened(PathBuf),
    Given,
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

/// What the first stop tells: where the kernel runs, where vmtrace's
/// region can live, how fast the guest's TSC runs.
struct Survey {
    offset: KernelOffset,
    low: LowMemory,
    tsc_khz: u32,
}

fn survey(stop: &QemuStop<'_>, plan: &Plan) -> Result<Survey, QemuError> {
    let offset = match kaslr::detect(stop, &plan.image) {
        Ok(Detected::Offset(o)) => o,
        Ok(_) => return Err(not_found(stop, &plan.image)),
        Err(e) => return Err(QemuError::NotTraceable(e.to_string())),
    };
    let mut space = kernel_space(stop, &plan.image, offset)?;
    // A region an earlier attach had to leave (calls that had not
    // returned through it) lives in the same free pages: nothing may be
    // written there while it is mapped.
    let left = (0..PD_COUNT as u64)
        .map(|i| space.entry(CODE_VA + i * LARGE_PAGE, Level::Pd))
        .any(|e| e.is_ok_and(|e| !e.is_empty()));
    if left {
        return Err(QemuError::RegionLeft);
    }
    let low = lowmem::find(&mut space, &plan.image, offset)?;
    let tsc_khz = match plan.image.symbol("tsc_khz") {
        Some(s) => space
            .read_array::<4>(offset.runtime(s.addr))
            .map(u32::from_le_bytes)
            .unwrap_or(0),
        None => 0,
    };
    // 0 when the kernel found no usable TSC (TCG's): the host's rate is
    // the guest's (`clock`).
    let tsc_khz = match tsc_khz {
        0 => super::clock::host_tsc_khz(),
        k => k,
    };
    if tsc_khz == 0 {
        return Err(QemuError::NoTscRate(tsc_khz));
    }
    Ok(Survey {
        offset,
        low,
        tsc_khz,
    })
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

/// The kernel's own page tables (never a PTI user table), as an attach
/// picks them.
fn kernel_space<'a>(
    stop: &'a QemuStop<'_>,
    image: &KernelImage,
    offset: KernelOffset,
) -> Result<AddressSpace<'a>, QemuError> {
    // Kernel data must be mapped (a PTI user table maps only text).
    let probes: Vec<u64> = ["e820_table", "linux_banner"]
        .iter()
        .filter_map(|n| image.symbol(n))
        .map(|s| offset.runtime(s.addr))
        .collect();
    crate::session::kernel_space(stop.vcpu_spaces(), &probes)
        .ok_or_else(|| QemuError::NotTraceable("no vCPU maps the kernel's data".into()))
}

/// Records per ring so that code, tables and every CPU's ring fit `pages`
/// free pages (the largest power of two that does).
fn ring_records(plan: &Plan, cpus: usize, pages: usize) -> Result<u64, QemuError> {
    let sites = plan.index.addrs.len();
    let code =
        Exitless::code_pages(&plan.image, cpus, sites, plan.graph).map_err(TracerError::from)?;
    // The pages below the rings (`backing::RegionPages`): the tables and
    // the code; with the function graph, its parts at their fixed places.
    let bottom = match plan.graph {
        false => TABLE_SLOTS + code,
        // (The code's pages count the return stubs' too.)
        true if code.saturating_sub(STUB_PAGES) <= CODE_SLOTS => GRAPH_BOTTOM,
        true => pages + 1,
    };
    let room = pages.saturating_sub(bottom) as u64 * PAGE / cpus.max(1) as u64;
    let fits = |cap| {
        RingLayout::new(cpus, sites, Some(cap), plan.graph).is_ok_and(|l| l.ring_bytes <= room)
    };
    if !fits(MIN_RECORDS) {
        return Err(QemuError::RingsTooBig {
            sites,
            cpus,
            kib: pages as u64 * PAGE / 1024,
        });
    }
    let mut cap = MIN_RECORDS;
    while cap < MAX_RECORDS && fits(cap * 2) {
        cap *= 2;
    }
    Ok(cap)
}

/// A QEMU being traced.
pub struct QemuSession {
    qmp: Qmp,
    guest: QemuGuest,
    stub: Stub,
    tracer: Tracer,
    pub info: QemuInfo,
    pub low: LowMemory,
    pages: Arc<Mutex<RegionPages>>,
    kernel: PathBuf,
}

impl Connected {
    /// Open the gdbstub (the guest stops), plan the region from the
    /// stopped guest, then attach (exitless) in a stop of its own, retrying
    /// while the guest is not ready. On error the guest runs on as found
    /// and the stub is closed.
    pub fn attach(self, plan: Plan, rec: Recording) -> Result<QemuSession, QemuError> {
        let Connected {
            mut qmp,
            ram,
            gdb,
            info,
        } = self;
        let (mut guest, stub) = open_stub(&mut qmp, gdb, ram, info.pid)?;
        let kernel = rec.kernel.clone();
        match setup(&mut guest, plan, rec) {
            Ok((tracer, low, pages)) => Ok(QemuSession {
                qmp,
                guest,
                stub,
                tracer,
                info,
                low,
                pages,
                kernel,
            }),
            Err(e) => {
                let _ = guest.release();
                close_stub(&mut qmp, &stub);
                Err(e)
            }
        }
    }
}

type Setup = (Tracer, LowMemory, Arc<Mutex<RegionPages>>);

fn setup(guest: &mut QemuGuest, plan: Plan, rec: Recording) -> Result<Setup, QemuError> {
    let cpus = guest.cpus();
    // Stopped since the stub connected.
    let first = guest.stop(true)?;
    let s = survey(&first, &plan)?;
    first.resume()?;
    let cap = ring_records(&plan, cpus, s.low.pages.len())?;
    let pages = Arc::new(Mutex::new(RegionPages::new(s.low.pages.clone())));
    let (mut tracer, _no_traps) = Tracer::create(plan, cpus, Mode::Exitless, Some(cap), rec)?;
    tracer.assume_kernel_offset(s.offset);
    tracer.back_region(Arc::clone(&pages));
    guest.set_view(Arc::new(Backed::new(guest.ram(), Arc::clone(&pages))));
    guest.set_clock(ClockSource { tsc_khz: s.tsc_khz });
    // Rings, tables and pool written while the guest runs (its free pages,
    // unmapped until the attach): the attach's stop then only writes the
    // code, the mapping and the sites.
    tracer.stage(guest.view())?;
    let mut last = String::new();
    for _ in 0..ATTEMPTS {
        let stop = guest.stop(false)?;
        match tracer.attach(&stop) {
            Ok(Attach::Attached(_)) => {
                stop.resume()?;
                return Ok((tracer, s.low, pages));
            }
            Ok(Attach::NotReady(why)) => last = why.to_string(),
            Err(e) => {
                // Whatever was written comes out before the error is said.
                let _ = tracer.detach(&**stop.ram());
                return Err(e.into());
            }
        }
        stop.resume()?;
        std::thread::sleep(RETRY);
    }
    Err(QemuError::NotReady(last))
}

/// How a QEMU session ended.
pub struct QemuEnded {
    /// What the detach restored, or why it could not.
    pub detached: Result<DetachCounts, QemuError>,
    /// vmtrace's page-table entries taken out, or why its region stays
    /// (the QEMU was gone, a hooked call never returned, ...).
    pub removed: Result<usize, String>,
    /// Sites patched at the attach.
    pub attached: usize,
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
}

impl std::fmt::Display for EndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndReason::Duration => write!(f, "duration elapsed"),
            EndReason::Signal(sig) => write!(f, "signal {sig}"),
            EndReason::QemuGone(why) => write!(f, "QEMU went away: {why}"),
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
    /// going away.
    pub fn trace(&mut self, duration: Option<Duration>) -> EndReason {
        let start = Instant::now();
        loop {
            if let Some(sig) = vmm::run::take_terminate_signal() {
                return EndReason::Signal(sig);
            }
            if duration.is_some_and(|d| start.elapsed() >= d) {
                return EndReason::Duration;
            }
            if let Err(e) = self.qmp.status() {
                return EndReason::QemuGone(e.to_string());
            }
            std::thread::sleep(POLL);
        }
    }

    /// Detach inside one stop, drain, take vmtrace's region out inside
    /// another (after a grace period) and hand the guest back to QEMU from
    /// it, close the stub vmtrace opened, and finish the trace.
    pub fn end(mut self, reason: &EndReason) -> QemuEnded {
        let gone = matches!(reason, EndReason::QemuGone(_));
        let detached = match gone {
            true => Err(QemuError::NotTraceable("the QEMU is gone".into())),
            false => self.detach_sites(),
        };
        let drained = self.tracer.stop_draining();
        let removed = match gone {
            true => Err("the QEMU is gone".into()),
            false => self.remove_region(detached.is_ok()),
        };
        close_stub(&mut self.qmp, &self.stub);
        let attached = self.tracer.attach_counts.patched;
        let (summary, saved) = self
            .tracer
            .finish_stored(&self.kernel, reason.to_string(), 0);
        QemuEnded {
            detached,
            removed,
            attached,
            drained,
            summary,
            saved,
        }
    }

    fn detach_sites(&mut self) -> Result<DetachCounts, QemuError> {
        let stop = self.guest.stop(false)?;
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
            let stop = self.guest.stop(false).map_err(|e| e.to_string())?;
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

    /// Pages of the guest's free memory vmtrace's region used, of all.
    pub fn region_pages(&self) -> (usize, usize) {
        self.pages.lock().unwrap_or_else(|e| e.into_inner()).used()
    }
}
