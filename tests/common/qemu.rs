//! A Linux guest in QEMU, as people run it, for the tests that attach to a
//! running QEMU: `qemu-system-x86_64 -accel tcg` (this host's nested KVM
//! cannot run a QEMU+KVM Linux guest) with the default guest's kernel and
//! the workload initramfs (guest/linux/workload.c, `bash guest/build.sh
//! workload`), a QMP socket and nothing else vmtrace-specific. The serial
//! console is a unix socket the test listens on (QEMU connects at start, so
//! no output is lost): every byte is kept for [`QemuGuest::console`] and
//! [`QemuGuest::wait_for`], and [`QemuGuest::send_line`] types into it.
//!
//! One guest at a time per test binary (a TCG guest with 2 vCPUs takes both
//! cores here): [`QemuGuest::boot`] waits until the previous guest is dropped.

use std::io::ErrorKind;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Condvar, Mutex, Once};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use super::console::{tail, SerialConsole};
use super::{linux_61, root};
use tracer::qemu::queries::Queries;

/// A hang guard for a boot to the workload's ready line (TCG boots take
/// seconds to a minute here; no test asserts a time).
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(600);

/// A hang guard for one workload command or a power-off.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// What the worker names itself (prctl PR_SET_NAME in workload.c).
pub const WORKER_COMM: &str = "wl-worker";

/// How to start QEMU.
#[derive(Clone, Debug)]
pub struct QemuOpts {
    /// The bzImage QEMU boots (`-kernel`).
    pub kernel: PathBuf,
    /// vCPUs (`-smp`).
    pub cpus: u32,
    /// Added to the kernel command line after `console=ttyS0 panic=-1`.
    pub append: String,
    /// Added to QEMU's arguments (e.g. a memory backend).
    pub qemu_args: Vec<String>,
    /// The initramfs (`-initrd`); None: the workload's.
    pub initrd: Option<PathBuf>,
}

impl QemuOpts {
    /// The default guest (guest/out/bzImage: no ACPI, CPUs from the MP
    /// table), 2 vCPUs.
    pub fn linux() -> Self {
        QemuOpts {
            kernel: linux_61().0,
            cpus: 2,
            append: String::new(),
            qemu_args: Vec::new(),
            initrd: None,
        }
    }

    /// The ACPI variant (guest/out/linux-acpi/bzImage), 2 vCPUs. Its
    /// built-in refscale would power the guest off after its run: the
    /// shortest run, and no power-off (guest/linux/config-acpi.fragment).
    pub fn linux_acpi() -> Self {
        QemuOpts {
            kernel: linux_acpi_bzimage(),
            append: "refscale.shutdown=0 refscale.holdoff=0 refscale.nruns=1 \
                     refscale.loops=1 refscale.nreaders=1"
                .into(),
            ..QemuOpts::linux()
        }
    }
}

impl Default for QemuOpts {
    fn default() -> Self {
        QemuOpts::linux()
    }
}

/// guest/out/workload.cpio.gz, built once per test binary (a second run
/// finds it up to date).
pub fn workload_initramfs() -> PathBuf {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| guest_build("workload"));
    root().join("guest/out/workload.cpio.gz")
}

/// guest/out/linux-acpi/bzImage, built (copied from the cache when warm)
/// if absent.
pub fn linux_acpi_bzimage() -> PathBuf {
    static BUILD: Once = Once::new();
    let bz = root().join("guest/out/linux-acpi/bzImage");
    BUILD.call_once(|| {
        if !bz.is_file() {
            guest_build("linux-acpi");
        }
    });
    bz
}

/// guest/out/debian-6.12/vmlinuz: Debian's own 6.12 cloud kernel, a
/// distribution kernel vmtrace's tests did not build (downloaded once per
/// test binary; cached in ~/.cache/vmtrace/debian).
pub fn debian_612() -> PathBuf {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| guest_build("debian-6.12"));
    root().join("guest/out/debian-6.12/vmlinuz")
}

/// guest/out/debian-6.12/workload-vmt.cpio.gz: the workload initramfs with
/// /vmt_test.ko, the test module built against Debian 6.12's headers
/// (guest/build.sh vmt-test; the headers are cached in ~/.cache/vmtrace).
pub fn vmt_test_initramfs() -> PathBuf {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| guest_build("vmt-test"));
    root().join("guest/out/debian-6.12/workload-vmt.cpio.gz")
}

/// guest/out/debian-6.1/vmlinuz: bookworm's own 6.1 cloud kernel
/// (downloaded once per test binary; cached in ~/.cache/vmtrace/debian).
/// Unlike 6.12 it counts QEMU's disabled MADT entries as hot-pluggable CPUs
/// under TCG (6.12 does so only under a hypervisor it knows).
pub fn debian_61() -> PathBuf {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| guest_build("debian-6.1"));
    root().join("guest/out/debian-6.1/vmlinuz")
}

/// guest/out/debian-5.10/vmlinuz: bullseye's own 5.10 cloud kernel
/// (downloaded once per test binary; cached in ~/.cache/vmtrace/debian).
/// Before 5.13: its low MiB is not known unused, and its `__mcount_loc`
/// table is not sorted at build time.
pub fn debian_510() -> PathBuf {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| guest_build("debian-5.10"));
    root().join("guest/out/debian-5.10/vmlinuz")
}

fn guest_build(what: &str) {
    let st = Command::new("bash")
        .arg(root().join("guest/build.sh"))
        .arg(what)
        .status()
        .expect("run guest/build.sh");
    assert!(st.success(), "guest/build.sh {what} failed");
}

/// The workload's `workload: ready pid=1 worker=W comm=C` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// /init's pid (1).
    pub init_pid: u32,
    /// The worker's pid: the one that runs the commands.
    pub worker: u32,
    /// The worker's comm ([`WORKER_COMM`]).
    pub comm: String,
}

impl Workload {
    /// The fields of a ready line, or None if `line` is not one.
    pub fn parse(line: &str) -> Option<Workload> {
        let rest = &line[line.find("workload: ready ")? + "workload: ready ".len()..];
        let field = |key: &str| {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        };
        Some(Workload {
            init_pid: field("pid")?.parse().ok()?,
            worker: field("worker")?.parse().ok()?,
            comm: field("comm")?.to_string(),
        })
    }
}

/// A running QEMU; dropping it kills QEMU and removes its temporary
/// directory (sockets).
pub struct QemuGuest {
    child: Child,
    status: Option<ExitStatus>,
    dir: PathBuf,
    qmp: PathBuf,
    serial: SerialConsole,
    _one: OneGuest,
}

impl QemuGuest {
    /// Start QEMU with `opts` and the workload initramfs; returns once QEMU
    /// has connected its serial port and opened its QMP socket (the guest
    /// is booting: wait for [`QemuGuest::wait_ready`]).
    pub fn boot(opts: QemuOpts) -> QemuGuest {
        let initrd = opts.initrd.clone().unwrap_or_else(workload_initramfs);
        assert!(
            opts.kernel.is_file(),
            "no kernel at {}",
            opts.kernel.display()
        );
        let one = OneGuest::take();
        let dir = fresh_dir();
        let qmp = dir.join("qmp.sock");
        let serial_path = dir.join("serial.sock");
        let listener = UnixListener::bind(&serial_path)
            .unwrap_or_else(|e| panic!("listen on {}: {e}", serial_path.display()));
        let append = format!("console=ttyS0 panic=-1 {}", opts.append);
        // One vCPU per socket: SeaBIOS's MP table lists one CPU per package,
        // and the default guest (no ACPI) finds its CPUs there.
        let smp = format!("{0},sockets={0}", opts.cpus);
        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args(["-accel", "tcg", "-m", "256", "-nographic", "-no-reboot"])
            .args(["-monitor", "none", "-smp", &smp])
            .arg("-kernel")
            .arg(&opts.kernel)
            .arg("-initrd")
            .arg(&initrd)
            .args(["-append", append.trim_end()])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .arg("-chardev")
            .arg(format!("socket,id=s0,path={}", serial_path.display()))
            .args(["-serial", "chardev:s0"])
            .args(cpu_args(&opts.qemu_args))
            .args(&opts.qemu_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr_file(&dir));
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                panic!("qemu-system-x86_64 is not installed: apt-get install qemu-system-x86")
            }
            Err(e) => panic!("start qemu-system-x86_64: {e}"),
        };
        let serial = match accept_serial(&listener, &mut child, &qmp) {
            Ok(s) => s,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let err = std::fs::read_to_string(dir.join("qemu.stderr")).unwrap_or_default();
                let _ = std::fs::remove_dir_all(&dir);
                panic!("QEMU did not start: {e}; its stderr: {}", err.trim_end());
            }
        };
        QemuGuest {
            child,
            status: None,
            dir,
            qmp,
            serial: SerialConsole::new(serial, "QEMU exited"),
            _one: one,
        }
    }

    /// QEMU's QMP socket (unix, server, any number of connections in turn).
    pub fn qmp_socket(&self) -> &Path {
        &self.qmp
    }

    /// QEMU's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The temporary directory that holds the sockets, removed on drop: a
    /// place for more of them (e.g. a gdbstub's).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The first whole console line containing `pattern` after the line the
    /// previous `wait_for` matched ([`SerialConsole::wait_for`]).
    pub fn wait_for(&self, pattern: &str, timeout: Duration) -> Result<String, String> {
        self.serial.wait_for(pattern, timeout)
    }

    /// Wait for the workload's ready line ([`BOOT_TIMEOUT`]).
    pub fn wait_ready(&self) -> Result<Workload, String> {
        self.serial.wait_ready()
    }

    /// Type `line` and a newline into the guest's console.
    pub fn send_line(&self, line: &str) {
        self.serial.send_line(line)
    }

    /// Make the worker call `syscall` `n` times and wait for its `done`
    /// line ([`SerialConsole::go`]).
    pub fn go(&self, syscall: &str, n: u64) -> Result<String, String> {
        self.serial.go(syscall, n)
    }

    /// All console output so far (`\r\n` as the guest's tty wrote it).
    pub fn console(&self) -> String {
        self.serial.text()
    }

    /// Kill QEMU (SIGKILL) and reap it.
    pub fn kill(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
    }

    /// Whether QEMU is still running.
    pub fn is_alive(&mut self) -> bool {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status.is_none()
    }

    /// Wait for QEMU to exit by itself; its status, or Err with its stderr
    /// if `timeout` passes (QEMU is left running).
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + timeout;
        while self.is_alive() {
            if Instant::now() >= deadline {
                return Err(format!(
                    "QEMU (pid {}) still runs after {timeout:?}; console end:\n{}",
                    self.pid(),
                    tail(&self.console(), 20)
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(self.status.expect("exited"))
    }

    /// What QEMU wrote to its stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("qemu.stderr")).unwrap_or_default()
    }
}

impl Drop for QemuGuest {
    fn drop(&mut self) {
        self.kill();
        self.serial.close();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// DIR/qemu.stderr, for QEMU's stderr (a file: nothing has to drain it).
fn stderr_file(dir: &Path) -> std::fs::File {
    let path = dir.join("qemu.stderr");
    std::fs::File::create(&path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()))
}

/// /tmp/vmtrace-qemu-PID-N (short: unix socket paths are limited to 107 bytes).
fn fresh_dir() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("vmtrace-qemu-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

/// QEMU's connection to our serial socket, once its QMP socket exists too
/// (both are made before the guest starts).
fn accept_serial(
    listener: &UnixListener,
    child: &mut Child,
    qmp: &Path,
) -> Result<UnixStream, String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut serial = None;
    loop {
        if serial.is_none() {
            match listener.accept() {
                Ok((s, _)) => serial = Some(s),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(format!("accept on the serial socket: {e}")),
            }
        }
        if serial.is_some() && qmp.exists() {
            let s = serial.take().expect("accepted");
            s.set_nonblocking(false).map_err(|e| e.to_string())?;
            return Ok(s);
        }
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("it exited with {st}"));
        }
        if Instant::now() >= deadline {
            return Err("no serial connection and QMP socket within 60 s".into());
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// The right to run the one QEMU guest of this test binary.
struct OneGuest;

static ONE: (Mutex<Option<ThreadId>>, Condvar) = (Mutex::new(None), Condvar::new());

impl OneGuest {
    fn take() -> OneGuest {
        let me = thread::current().id();
        let mut owner = ONE.0.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(t) = *owner {
            assert_ne!(
                t, me,
                "this thread already runs a QEMU guest: drop it first"
            );
            owner = ONE.1.wait(owner).unwrap_or_else(|e| e.into_inner());
        }
        *owner = Some(me);
        OneGuest
    }
}

impl Drop for OneGuest {
    fn drop(&mut self) {
        *ONE.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
        ONE.1.notify_all();
    }
}

/// HMP `info pci` of the QEMU at `qmp`: the devices, to compare before and
/// after an attach that hot-plugs its ring device.
pub fn info_pci(qmp: &Path) -> String {
    tracer::qemu::qmp::Qmp::connect(qmp, Duration::from_secs(10))
        .unwrap()
        .hmp("info pci")
        .unwrap()
}

/// The ring device files of vmtrace's for the QEMU `pid` on this host.
pub fn ring_files(pid: u32) -> Vec<String> {
    let prefix = format!("vmtrace-rings-{pid}-");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Each of `events` (`SYSTEM:NAME`) has in trace.dat `dat` (Debian's
/// `trace-cmd report --events`) the id the guest's kernel gave it, as its
/// tracefs shows it (`events/SYSTEM/NAME/id`, the workload's `ftrace id`).
pub fn check_guest_ids(guest: &QemuGuest, dat: &Path, events: &[&str]) {
    let tc = std::process::Command::new("trace-cmd")
        .args(["report", "--events", "-i"])
        .arg(dat)
        .output()
        .expect("trace-cmd is not installed: apt-get install trace-cmd (CI's .ci/run does)");
    let formats = String::from_utf8_lossy(&tc.stdout);
    for e in events {
        let name = e.split_once(':').unwrap().1;
        let at = formats
            .find(&format!("name: {name}\nID: "))
            .unwrap_or_else(|| panic!("no {name} in {formats}"));
        let id = formats[at..].lines().nth(1).unwrap()["ID: ".len()..].trim();
        guest.send_line(&format!("ftrace id {e}"));
        let line = guest
            .wait_for(
                &format!("workload: ftrace id {e}="),
                Duration::from_secs(300),
            )
            .unwrap();
        let guests = line.split('=').nth(1).unwrap().trim();
        assert!(guests.parse::<u16>().is_ok_and(|n| n > 0), "{line}");
        assert_eq!(id, guests, "{e}: trace.dat's id, the guest's");
    }
}

/// QEMU's default CPU without `cmpxchg16b`, unless `args` name a CPU:
/// QEMU 7.2's TCG computes that instruction's flags wrongly now and then,
/// which crashes guests, the more often the more a trace stops them
/// (tracer::qemu::tcg_flags). A test that wants the instruction names
/// its CPU.
pub fn cpu_args(args: &[impl AsRef<str>]) -> Vec<&'static str> {
    match args.iter().any(|a| a.as_ref() == "-cpu") {
        true => Vec::new(),
        false => vec!["-cpu", "qemu64,-cx16"],
    }
}
