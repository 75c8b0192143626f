//! A bare QEMU to test the QEMU backend's wire layer against (TCG, its QMP
//! socket in a fresh directory, its console in a file, a kernel that waits
//! for a disk it never gets); it is killed on drop, also when a check
//! panics. The attach tests boot the workload guest instead (`qemu`).

use std::io::ErrorKind;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tracer::qemu::qmp::Qmp;

use super::scratch_in;

pub const QEMU: &str = "qemu-system-x86_64";
/// How long a QMP or gdbstub reply may take: a guard, far above any.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// guest/out/linux-acpi/{bzImage,vmlinux}: the ACPI variant of the default
/// guest (with the MP table alone, SeaBIOS's table shows Linux one CPU),
/// built or copied from the cache once per test binary.
pub fn linux_acpi() -> (PathBuf, PathBuf) {
    let bz = super::qemu::linux_acpi_bzimage();
    let vmlinux = bz.with_file_name("vmlinux");
    (bz, vmlinux)
}

/// A QEMU child, killed on drop (also when a check panics).
pub struct QemuVm {
    pub child: Child,
    pub dir: PathBuf,
    pub qmp: PathBuf,
    pub log: PathBuf,
}

impl QemuVm {
    /// Starts QEMU (TCG, 2 vCPUs, `mem`) with its QMP socket in a fresh
    /// directory, plus `args`.
    pub fn launch(name: &str, mem: &str, args: &[&str]) -> QemuVm {
        let dir = scratch_in("qemu-wire", name);
        let qmp = dir.join("qmp.sock");
        let log = dir.join("console.log");
        let mut cmd = Command::new(QEMU);
        cmd.args(["-accel", "tcg", "-smp", "2", "-m", mem, "-nographic"])
            .args(["-no-reboot", "-monitor", "none"])
            .arg("-serial")
            .arg(format!("file:{}", log.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .args(super::qemu::cpu_args(args))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // SAFETY: prctl in the forked child before exec, async-signal-safe:
        // QEMU dies with this test thread even if the test process aborts.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                panic!("{QEMU} is not installed: install the apt package qemu-system-x86")
            }
            Err(e) => panic!("cannot start {QEMU}: {e}"),
        };
        let vm = QemuVm {
            child,
            dir,
            qmp,
            log,
        };
        vm.wait_for(|| vm.qmp.exists(), "its QMP socket");
        vm
    }

    /// The ACPI variant of the default Linux guest, without an initrd, with
    /// `root=/dev/vda rootwait`: there is no such disk, so the kernel, fully
    /// up (long mode, paging, both vCPUs online), waits for it forever in a
    /// sleep loop, its vCPUs idle. `nokaslr`: linux_banner sits at its link
    /// address minus __START_KERNEL_map.
    pub fn linux(name: &str) -> QemuVm {
        let (bz, _) = linux_acpi();
        let vm = QemuVm::launch(
            name,
            "256",
            &[
                "-kernel",
                bz.to_str().unwrap(),
                "-append",
                "console=ttyS0 nokaslr root=/dev/vda rootwait panic=-1",
            ],
        );
        vm.wait_for(
            || vm.console().contains("Waiting for root device"),
            "the guest kernel to wait for its root device",
        );
        vm
    }

    pub fn console(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// Waits for `cond`, far longer than a boot takes (a guard, not a timing).
    pub fn wait_for(&self, cond: impl Fn() -> bool, what: &str) {
        let end = Instant::now() + Duration::from_secs(180);
        while !cond() {
            assert!(
                Instant::now() < end,
                "QEMU never showed {what}; console:\n{}",
                self.console()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn qmp(&self) -> Qmp {
        Qmp::connect(&self.qmp, TIMEOUT).unwrap_or_else(|e| panic!("QMP connect: {e}"))
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for QemuVm {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
