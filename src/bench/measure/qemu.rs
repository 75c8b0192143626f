//! (k) `vmtrace attach` on a QEMU guest: the attach's pause for one site,
//! for about a hundred and for all, and what an exitless call costs the guest
//! against an untraced one. The guest is the default Linux guest in QEMU
//! (TCG) with the workload initramfs, whose worker makes N `getpid` calls
//! when the console says `go getpid N`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tracer::plan::entry::EntryChoice;
use tracer::plan::{ModeChoice, Request, TracePlan};
use tracer::qemu::session::{self, QemuEnded, QemuSession};
use tracer::session::Recording;

use crate::error::{Error, RuntimeError};

/// The globs whose attach is timed: one site, about a hundred, and every
/// site of the kernel.
pub const K_GLOBS: [&str; 3] = ["__x64_sys_getpid", "hrtimer_*,tick_*", "*"];
/// `getpid` calls per timed command.
pub const K_CALLS: u64 = 200_000;
/// ... in trap mode, where each call stops the guest.
pub const K_TRAP_CALLS: u64 = 1_000;
/// How long the guest may take to boot, or a command to finish.
const WAIT: Duration = Duration::from_secs(120);

/// (k): per round, the pause of each glob's attach (µs) and the ns per
/// call, untraced and exitless.
#[derive(Debug, Default)]
pub struct QemuFigures {
    pub qemu: String,
    pub sites: Vec<usize>,
    /// `pause_us[g]`: one value per round for glob g.
    pub pause_us: Vec<Vec<f64>>,
    pub untraced_ns: Vec<f64>,
    pub exitless_ns: Vec<f64>,
    /// The kernel the bursts ran on (Debian 6.12's, which takes the ring
    /// device, where it is there).
    pub burst_guest: String,
    /// Events stored per second of the exitless bursts, and of all calls.
    pub stored_per_s: Vec<f64>,
    pub stored_share: Vec<f64>,
    /// The pause of the bursts' attaches (µs): one site, on Debian 6.12
    /// the ring device plugged and filled before it.
    pub burst_pause_us: Vec<f64>,
    /// ns per call in trap mode (gdbstub breakpoints), against untraced
    /// calls timed the same way.
    pub trap_ns: Vec<f64>,
    pub trap_untraced_ns: Vec<f64>,
    /// ... trap mode with direct entries (a breakpoint at the entry, the
    /// vCPU stepped over its first instruction), and trap mode's function
    /// graph on the ftrace site (a breakpoint at the return address too).
    pub trap_direct_ns: Vec<f64>,
    pub trap_graph_ns: Vec<f64>,
}

/// How a trap-mode bench attach traces.
#[derive(Clone, Copy)]
struct TrapHow {
    entry: EntryChoice,
    graph: bool,
}

/// A QEMU with the workload guest, killed on drop.
struct Guest {
    child: Child,
    dir: PathBuf,
    serial: BufReader<UnixStream>,
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn measure_error(what: impl std::fmt::Display) -> Error {
    RuntimeError::Measure(format!("(k): {what}")).into()
}

impl Guest {
    fn boot(bzimage: &Path, initrd: &Path) -> Result<Guest, Error> {
        Guest::boot_with(bzimage, initrd, "console=ttyS0 panic=-1", "")
    }

    /// `boot`, with kernel command line `append`; `tag` names its
    /// directory apart from another guest's.
    fn boot_with(bzimage: &Path, initrd: &Path, append: &str, tag: &str) -> Result<Guest, Error> {
        let dir =
            std::env::temp_dir().join(format!("vmtrace-bench-qemu{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(measure_error)?;
        let sock = |name: &str| format!("unix:{},server=on,wait=off", dir.join(name).display());
        let child = Command::new("qemu-system-x86_64")
            .args([
                "-accel",
                "tcg",
                // Without cmpxchg16b, whose flags QEMU 7.2's TCG computes
                // wrongly now and then (tracer::qemu::tcg_flags).
                "-cpu",
                "qemu64,-cx16",
                "-m",
                "256",
                "-smp",
                "2,sockets=2",
                "-nographic",
            ])
            .args(["-no-reboot", "-monitor", "none", "-kernel"])
            .arg(bzimage)
            .arg("-initrd")
            .arg(initrd)
            .args(["-append", append, "-qmp", &sock("qmp.sock")])
            .args(["-serial", &sock("serial.sock")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| measure_error(format!("cannot start qemu-system-x86_64: {e}")))?;
        let start = Instant::now();
        let stream = loop {
            match UnixStream::connect(dir.join("serial.sock")) {
                Ok(s) => break s,
                Err(_) if start.elapsed() < WAIT => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(measure_error(format!("QEMU's serial socket: {e}"))),
            }
        };
        stream.set_read_timeout(Some(WAIT)).map_err(measure_error)?;
        let mut g = Guest {
            child,
            dir,
            serial: BufReader::new(stream),
        };
        g.line_with("workload: ready")?;
        Ok(g)
    }

    fn qmp(&self) -> PathBuf {
        self.dir.join("qmp.sock")
    }

    fn line_with(&mut self, what: &str) -> Result<String, Error> {
        let mut line = String::new();
        loop {
            line.clear();
            match self.serial.read_line(&mut line) {
                Ok(0) | Err(_) => return Err(measure_error(format!("no `{what}` from the guest"))),
                Ok(_) if line.contains(what) => return Ok(line),
                Ok(_) => {}
            }
        }
    }

    /// Host time of `go getpid n`, from the command to its done line.
    fn go(&mut self, n: u64) -> Result<Duration, Error> {
        let start = Instant::now();
        let cmd = format!("go getpid {n}\n");
        self.serial
            .get_mut()
            .write_all(cmd.as_bytes())
            .map_err(measure_error)?;
        self.line_with("workload: done getpid")?;
        Ok(start.elapsed())
    }
}

/// Attach to the guest tracing `glob`, exitless.
fn attach(g: &Guest, vmlinux: &Path, glob: &str) -> Result<QemuSession, Error> {
    let how = TrapHow {
        entry: EntryChoice::Ftrace,
        graph: false,
    };
    attach_in(g, vmlinux, glob, ModeChoice::Exitless, how)
}

fn attach_in(
    g: &Guest,
    vmlinux: &Path,
    glob: &str,
    mode: ModeChoice,
    how: TrapHow,
) -> Result<QemuSession, Error> {
    let image = kernel_image(vmlinux)?;
    let connected = session::connect(&g.qmp(), None).map_err(measure_error)?;
    let request = Request {
        entry: how.entry,
        graph: how.graph,
        ..Request::new(vec![glob.to_string()], mode, connected.info.cpus)
    };
    let plan = TracePlan::build(image, &request).map_err(measure_error)?;
    connected
        .attach_in(plan, Recording::memory(u64::MAX))
        .map_err(measure_error)
}

/// ns per call of `go getpid K_TRAP_CALLS` in trap mode: the session
/// serves the breakpoints on a thread of its own while the guest runs.
fn trap_call_ns(g: &mut Guest, vmlinux: &Path, how: TrapHow) -> Result<f64, Error> {
    let mut s = attach_in(g, vmlinux, K_GLOBS[0], ModeChoice::Trap, how)?;
    let done = std::sync::atomic::AtomicBool::new(false);
    let took = std::thread::scope(|scope| {
        let served = scope.spawn(|| s.trace_until(None, &done));
        let took = g.go(K_TRAP_CALLS);
        done.store(true, std::sync::atomic::Ordering::Release);
        served.join().ok();
        took
    })?;
    let end = s.end(&session::EndReason::Duration);
    if end.summary.meta.events_total != K_TRAP_CALLS {
        return Err(measure_error(format!(
            "trap mode counted {} of {K_TRAP_CALLS} calls",
            end.summary.meta.events_total
        )));
    }
    Ok(took.as_nanos() as f64 / K_TRAP_CALLS as f64)
}

/// The exitless burst of `K_CALLS` calls on `g` with its trace loop
/// serving the session meanwhile, as `vmtrace attach` runs it (the loop
/// watches the VM; the drainer has a thread of its own): the burst's host
/// time, and the session's end.
fn exitless_burst(g: &mut Guest, vmlinux: &Path) -> Result<(Duration, QemuEnded), Error> {
    let mut s = attach(g, vmlinux, K_GLOBS[0])?;
    let done = std::sync::atomic::AtomicBool::new(false);
    let took = std::thread::scope(|scope| {
        let served = scope.spawn(|| s.trace_until(None, &done));
        let took = g.go(K_CALLS);
        done.store(true, std::sync::atomic::Ordering::Release);
        served.join().ok();
        took
    })?;
    Ok((took, s.end(&session::EndReason::Duration)))
}

/// The guest of the bursts: Debian's 6.12 cloud kernel beside `out`
/// (`guest/build.sh debian-6.12`) when it is there, whose ACPI PCI
/// hot-plug takes the ring device (rings sized by the attach's buffer,
/// drained from vmtrace's own mapping; the project's ACPI guest, a
/// tinyconfig kernel, has no PCI hot-plug); else none (`g` itself). With
/// the kernel file, read for its symbols.
fn burst_guest(out: &Path) -> Result<Option<(Guest, PathBuf)>, Error> {
    let vmlinuz = out.join("debian-6.12/vmlinuz");
    if !vmlinuz.is_file() {
        return Ok(None);
    }
    let append = "console=ttyS0 panic=-1";
    let g = Guest::boot_with(&vmlinuz, &out.join("workload.cpio.gz"), append, "-612")?;
    Ok(Some((g, vmlinuz)))
}

/// The kernel image of `path`: a vmlinux, or a compressed kernel alone
/// (symbols from its kallsyms).
fn kernel_image(path: &Path) -> Result<tracer::kernel::symbols::KernelImage, Error> {
    if path.file_name().is_some_and(|n| n == "vmlinuz") {
        let file = vmm::boot::KernelFile::open(path).map_err(measure_error)?;
        let given = tracer::kernel::find::Given::Nothing;
        let found = tracer::kernel::find::kernel_image(&file, given).map_err(measure_error)?;
        return Ok(found.image);
    }
    tracer::kernel::symbols::KernelImage::load(path).map_err(measure_error)
}

/// (k): `rounds` rounds on one QEMU guest booted from the bzImage and
/// workload initramfs beside `vmlinux`; the exitless bursts on the Debian
/// 6.12 guest where it is there (`burst_guest`).
pub fn qemu_figures(vmlinux: &Path, rounds: usize) -> Result<QemuFigures, Error> {
    let out = vmlinux.parent().unwrap_or(Path::new("."));
    let mut g = Guest::boot(&out.join("bzImage"), &out.join("workload.cpio.gz"))?;
    let mut debian = burst_guest(out)?;
    let mut f = QemuFigures {
        pause_us: vec![Vec::new(); K_GLOBS.len()],
        ..QemuFigures::default()
    };
    for _ in 0..rounds {
        for (i, glob) in K_GLOBS.iter().enumerate() {
            let s = attach(&g, vmlinux, glob)?;
            f.qemu = s.info.to_string();
            let end = s.end(&session::EndReason::Duration);
            f.pause_us[i].push(end.summary.meta.attach_window_ns as f64 / 1e3);
            if f.sites.len() <= i {
                f.sites.push(end.summary.meta.sites_patched as usize);
            }
        }
        let per_call = |d: Duration| d.as_nanos() as f64 / K_CALLS as f64;
        let (bg, bvmlinux) = match debian.as_mut() {
            Some((a, v)) => (a, v.as_path()),
            None => (&mut g, vmlinux),
        };
        f.burst_guest = bvmlinux.display().to_string();
        f.untraced_ns.push(per_call(bg.go(K_CALLS)?));
        let (burst, end) = exitless_burst(bg, bvmlinux)?;
        f.exitless_ns.push(per_call(burst));
        let m = &end.summary.meta;
        let stored = (m.events_total - m.events_dropped) as f64;
        f.stored_per_s.push(stored / burst.as_secs_f64());
        f.stored_share.push(stored / m.events_total.max(1) as f64);
        f.burst_pause_us.push(m.attach_window_ns as f64 / 1e3);
        let untraced = g.go(K_TRAP_CALLS)?;
        f.trap_untraced_ns
            .push(untraced.as_nanos() as f64 / K_TRAP_CALLS as f64);
        let how = |entry, graph| TrapHow { entry, graph };
        let ftrace = how(EntryChoice::Ftrace, false);
        f.trap_ns.push(trap_call_ns(&mut g, vmlinux, ftrace)?);
        let direct = how(EntryChoice::Direct, false);
        f.trap_direct_ns
            .push(trap_call_ns(&mut g, vmlinux, direct)?);
        let graph = how(EntryChoice::Ftrace, true);
        f.trap_graph_ns.push(trap_call_ns(&mut g, vmlinux, graph)?);
    }
    Ok(f)
}
