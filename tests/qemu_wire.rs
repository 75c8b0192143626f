//! The QEMU backend's wire layer against a real QEMU (TCG): the QMP client,
//! the RAM layout, the gdbstub client and /proc/PID/mem, and their errors.
//!
//! The Linux guest (the ACPI variant) boots without an initrd, with `root=/dev/vda rootwait`:
//! there is no such disk, so the kernel, fully up (long mode, paging, both
//! vCPUs online), waits for it forever in a sleep loop; the vCPUs idle in
//! HLT. `nokaslr` puts `linux_banner` at its link address minus
//! __START_KERNEL_map. One QEMU boot runs every live check, in sequence.

mod common;

use std::io::{ErrorKind, Write};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{elf_symbol, root, scratch_in};
use tracer::qemu::gdb::{Gdb, GdbAddr, ThreadId};
use tracer::qemu::procmem::ProcRam;
use tracer::qemu::qmp::{Qmp, QmpError};

const QEMU: &str = "qemu-system-x86_64";
const TIMEOUT: Duration = Duration::from_secs(10);
/// Linux's __START_KERNEL_map: the kernel image's virtual base.
const START_KERNEL_MAP: u64 = 0xffff_ffff_8000_0000;

/// guest/out/linux-acpi/{bzImage,vmlinux}: the ACPI variant of the default
/// guest (with the MP table alone, SeaBIOS's table shows Linux one CPU),
/// built or copied from the cache once per test binary.
fn linux_acpi() -> (PathBuf, PathBuf) {
    static BUILD: std::sync::Once = std::sync::Once::new();
    BUILD.call_once(|| {
        let st = Command::new("bash")
            .arg(root().join("guest/build.sh"))
            .arg("linux-acpi")
            .status()
            .expect("run guest/build.sh linux-acpi");
        assert!(st.success(), "guest/build.sh linux-acpi failed");
    });
    let dir = root().join("guest/out/linux-acpi");
    (dir.join("bzImage"), dir.join("vmlinux"))
}

/// A QEMU child, killed on drop (also when a check panics).
struct QemuVm {
    child: Child,
    dir: PathBuf,
    qmp: PathBuf,
    log: PathBuf,
}

impl QemuVm {
    /// Starts QEMU (TCG, 2 vCPUs, 256 MiB) with its QMP socket in a fresh
    /// directory, plus `args`.
    fn launch(name: &str, args: &[&str]) -> QemuVm {
        let dir = scratch_in("qemu-wire", name);
        let qmp = dir.join("qmp.sock");
        let log = dir.join("console.log");
        let mut cmd = Command::new(QEMU);
        cmd.args(["-accel", "tcg", "-smp", "2", "-m", "256", "-nographic"])
            .args(["-no-reboot", "-monitor", "none"])
            .arg("-serial")
            .arg(format!("file:{}", log.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
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

    /// The default Linux guest, booted until it waits for its root disk.
    fn linux(name: &str) -> QemuVm {
        let (bz, _) = linux_acpi();
        let vm = QemuVm::launch(
            name,
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

    fn console(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// Waits for `cond`, far longer than a boot takes (a guard, not a timing).
    fn wait_for(&self, cond: impl Fn() -> bool, what: &str) {
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

    fn qmp(&self) -> Qmp {
        Qmp::connect(&self.qmp, TIMEOUT).unwrap_or_else(|e| panic!("QMP connect: {e}"))
    }

    fn kill(&mut self) {
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

fn connect_err(path: &Path, timeout: Duration) -> String {
    match Qmp::connect(path, timeout) {
        Ok(_) => panic!("QMP connect to {} succeeded", path.display()),
        Err(e) => e.to_string(),
    }
}

/// Sockets that are not QEMU's QMP: each error names the path and the problem.
#[test]
fn qmp_connect_errors_name_the_socket() {
    let dir = scratch_in("qemu-wire", "errors");
    let missing = dir.join("missing.sock");
    assert_eq!(
        connect_err(&missing, TIMEOUT),
        format!("QMP socket {}: no such file", missing.display())
    );
    let file = dir.join("file");
    std::fs::write(&file, "x").unwrap();
    assert_eq!(
        connect_err(&file, TIMEOUT),
        format!("QMP socket {}: not a unix socket", file.display())
    );
    let dead = dir.join("dead.sock");
    drop(UnixListener::bind(&dead).unwrap());
    assert_eq!(
        connect_err(&dead, TIMEOUT),
        format!(
            "QMP socket {}: connection refused (no QEMU listens on it)",
            dead.display()
        )
    );
    // Peers that are not QEMU: one that writes something else, one that
    // hangs up, one that says nothing.
    for (name, reply) in [
        ("http", Some(&b"HTTP/1.1 400 Bad Request\r\n"[..])),
        ("hangup", None),
    ] {
        let path = dir.join(format!("{name}.sock"));
        let l = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            if let Some(r) = reply {
                s.write_all(r).unwrap();
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let e = connect_err(&path, TIMEOUT);
        server.join().unwrap();
        let got = if reply.is_some() {
            "\"HTTP/1.1 400 Bad Request\""
        } else {
            "\"nothing\""
        };
        assert_eq!(
            e,
            format!(
                "QMP socket {}: the peer is not QEMU (no QMP greeting, got {got})",
                path.display()
            )
        );
    }
    let silent = dir.join("silent.sock");
    let _l = UnixListener::bind(&silent).unwrap();
    let e = connect_err(&silent, Duration::from_millis(300));
    assert!(
        e.starts_with(&format!(
            "QMP socket {}: no QMP greeting within 0.3 s",
            silent.display()
        )),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gdb_connect_error_names_the_socket() {
    let dir = scratch_in("qemu-wire", "gdb-errors");
    let missing = dir.join("gdb.sock");
    let addr: GdbAddr = missing.to_str().unwrap().parse().unwrap();
    assert_eq!(addr, GdbAddr::Unix(missing.clone()));
    let e = Gdb::connect(&addr, TIMEOUT).err().unwrap().to_string();
    assert!(
        e.starts_with(&format!("gdbstub {}: cannot connect: ", missing.display())),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A QEMU that has not started its guest (-S): one QMP client at a time,
/// and QEMU's death is a clear error on the client that holds the socket.
#[test]
fn qmp_busy_and_qemu_gone() {
    let mut vm = QemuVm::launch("busy", &["-S"]);
    let mut qmp = vm.qmp();
    assert_eq!(
        qmp.pid().unwrap(),
        vm.child.id(),
        "QEMU's pid from SO_PEERCRED"
    );
    assert_eq!(qmp.status().unwrap(), "prelaunch");
    let e = connect_err(&vm.qmp, Duration::from_millis(500));
    assert!(
        e.contains("another client holds the QMP socket"),
        "second client: {e}"
    );
    // The first client still works after the second gave up.
    assert_eq!(qmp.accel().unwrap(), "tcg");
    // A gdbstub on TCP (host:port), then QEMU killed under both clients.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    qmp.open_gdbserver(&format!("tcp:127.0.0.1:{port}"))
        .unwrap();
    let addr: GdbAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert_eq!(addr, GdbAddr::Tcp(format!("127.0.0.1:{port}")));
    let mut gdb = Gdb::connect(&addr, TIMEOUT).unwrap();
    assert_eq!(gdb.threads().unwrap().len(), 2);
    assert!(gdb.stop().unwrap().starts_with('T'));
    vm.kill();
    let e = gdb.stop().unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("gdbstub 127.0.0.1:{port}: the stub closed the connection")
    );
    let e = qmp.status().unwrap_err();
    assert!(matches!(e, QmpError::Closed { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        format!(
            "QMP socket {}: QEMU closed its QMP socket",
            vm.qmp.display()
        )
    );
}

/// Every live check on one booted Linux guest, in order.
#[test]
fn live_linux_guest() {
    let vm = QemuVm::linux("live");
    let mut qmp = vm.qmp();
    qmp_facts(&vm, &mut qmp);
    let ram = ram_of(&mut qmp);
    let gdb_sock = vm.dir.join("gdb.sock");
    let spec = format!("unix:{},server=on,wait=off", gdb_sock.display());
    qmp.open_gdbserver(&spec).unwrap();
    let e = qmp.open_gdbserver(&spec).unwrap_err().to_string();
    assert!(
        e.contains("HMP command \"gdbserver unix:") && e.contains("Could not open gdbserver"),
        "a second gdbserver: {e}"
    );
    let mut gdb = Gdb::connect(&GdbAddr::Unix(gdb_sock.clone()), TIMEOUT).unwrap();
    let stop = gdb.stop().unwrap();
    assert!(stop.starts_with('T'), "stop reply {stop}");
    assert_eq!(qmp.status().unwrap(), "paused");
    vcpu_regs(&mut qmp, &mut gdb);
    memory(&vm, &mut gdb, &ram);
    stop_resume(&mut qmp, &mut gdb);
    gdb.detach().unwrap();
    assert_eq!(qmp.status().unwrap(), "running", "after detach");
    drop(gdb);
    qmp.close_gdbserver().unwrap();
    assert!(
        Gdb::connect(&GdbAddr::Unix(gdb_sock.clone()), TIMEOUT).is_err(),
        "a closed gdbserver refuses"
    );
    // A fresh gdbserver on the same path works; a client that goes without
    // detaching leaves the VM stopped (QEMU stops it on connect).
    qmp.open_gdbserver(&spec).unwrap();
    let mut gdb = Gdb::connect(&GdbAddr::Unix(gdb_sock.clone()), TIMEOUT).unwrap();
    assert_eq!(gdb.threads().unwrap().len(), 2);
    drop(gdb);
    assert_eq!(qmp.status().unwrap(), "paused", "after a client left");
    qmp.execute("cont", None).unwrap();
    assert_eq!(qmp.status().unwrap(), "running");
    qmp.close_gdbserver().unwrap();
    let console = vm.console();
    assert!(!console.contains("Kernel panic"), "console:\n{console}");
}

fn qmp_facts(vm: &QemuVm, qmp: &mut Qmp) {
    let v = qmp.version().clone();
    assert!(v.major >= 7, "QEMU version {v}");
    eprintln!("QEMU {v}");
    assert_eq!(qmp.pid().unwrap(), vm.child.id(), "QEMU's pid");
    assert_eq!(qmp.accel().unwrap(), "tcg");
    assert_eq!(qmp.status().unwrap(), "running");
    let cpus = qmp.cpus().unwrap();
    assert_eq!(
        cpus.iter().map(|c| c.index).collect::<Vec<_>>(),
        [0, 1],
        "{cpus:?}"
    );
    for c in &cpus {
        // Each vCPU's host thread is a thread of QEMU's process.
        let task = format!("/proc/{}/task/{}", vm.child.id(), c.thread_id);
        assert!(Path::new(&task).exists(), "{task} for vCPU {}", c.index);
    }
    assert!(qmp.hmp("no-such-command").is_err());
}

/// The RAM layout covers the guest's 256 MiB, and ProcRam opens over it.
fn ram_of(qmp: &mut Qmp) -> ProcRam {
    let layout = qmp.ram_layout().unwrap();
    eprintln!("RAM layout: {layout:#x?}");
    let covered = |a: u64, b: u64| {
        (a..b)
            .step_by(0x1000)
            .all(|p| layout.iter().any(|r| r.hva_of(p).is_some()))
    };
    assert!(
        covered(0, 0xa0000),
        "low RAM below the VGA hole: {layout:x?}"
    );
    assert!(
        covered(0x10_0000, 0x1000_0000),
        "RAM from 1 MiB to 256 MiB: {layout:x?}"
    );
    assert!(layout.iter().all(|r| r.name == "pc.ram" && r.hva != 0));
    assert!(
        !layout.iter().any(|r| r.hva_of(0xfd00_0000).is_some()),
        "no vga.vram"
    );
    // One block: the host addresses keep the guest's offsets.
    let base = layout[0].hva - layout[0].gpa;
    assert!(layout.iter().all(|r| r.hva - r.gpa == base), "{layout:x?}");
    ProcRam::open(qmp.pid().unwrap(), &layout).unwrap()
}

fn vcpu_regs(qmp: &mut Qmp, gdb: &mut Gdb) {
    let threads = gdb.threads().unwrap();
    let vcpus: Vec<u32> = threads.iter().map(|t| t.vcpu().unwrap()).collect();
    let indexes: Vec<u32> = qmp.cpus().unwrap().iter().map(|c| c.index).collect();
    assert_eq!(vcpus, indexes, "threads {threads:?}");
    for t in &threads {
        let r = gdb.regs(*t).unwrap();
        assert_ne!(r.cr0 & (1 << 31), 0, "{t}: CR0.PG {r:x?}");
        assert_ne!(r.efer & (1 << 10), 0, "{t}: EFER.LMA {r:x?}");
        assert_ne!(r.cr3, 0, "{t}: CR3");
        assert!(
            r.rip >= START_KERNEL_MAP,
            "{t}: rip {:#x} in the kernel",
            r.rip
        );
        assert_ne!(r.gs_base, 0, "{t}: the kernel's per-CPU GS base");
        assert_eq!(r.cs & 3, 0, "{t}: ring 0");
    }
    let (a, b) = (gdb.regs(threads[0]).unwrap(), gdb.regs(threads[1]).unwrap());
    assert_ne!(a.gs_base, b.gs_base, "each vCPU's own registers");
    assert_eq!(ThreadId::parse(&threads[1].to_string()), Some(threads[1]));
}

/// The banner read through the stub and through /proc/PID/mem agree, and
/// writes through either are seen by the other.
fn memory(_vm: &QemuVm, gdb: &mut Gdb, ram: &ProcRam) {
    let (_, vmlinux) = linux_acpi();
    let banner = elf_symbol(&vmlinux, "linux_banner") - START_KERNEL_MAP;
    gdb.phys_mode(true).unwrap();
    let mut by_stub = vec![0u8; 4096];
    gdb.read(banner, &mut by_stub).unwrap();
    let mut by_proc = vec![0u8; 4096];
    ram.read(banner, &mut by_proc).unwrap();
    assert!(
        by_stub.starts_with(b"Linux version 6."),
        "banner at {banner:#x}: {:?}",
        String::from_utf8_lossy(&by_stub[..64])
    );
    assert_eq!(
        by_stub, by_proc,
        "4 KiB at the banner, stub vs /proc/PID/mem"
    );

    let scratch = 0x8000;
    let mut saved = [0u8; 64];
    gdb.read(scratch, &mut saved).unwrap();
    let pattern: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ b'$').collect();
    gdb.write(scratch, &pattern).unwrap();
    let mut back = [0u8; 64];
    ram.read(scratch, &mut back).unwrap();
    assert_eq!(
        back[..],
        pattern[..],
        "written through the stub, read from /proc"
    );
    ram.store_u64(scratch, 0x1122_3344_5566_7788).unwrap();
    let mut word = [0u8; 8];
    gdb.read(scratch, &mut word).unwrap();
    assert_eq!(u64::from_le_bytes(word), 0x1122_3344_5566_7788);
    assert_eq!(ram.load_u32(scratch + 4).unwrap(), 0x1122_3344);
    gdb.write(scratch, &saved).unwrap();
    ram.read(scratch, &mut back).unwrap();
    assert_eq!(back, saved, "scratch restored");

    // Physical reads outside RAM read as unassigned memory (no error); a
    // virtual address the page tables do not map is an error naming it.
    gdb.phys_mode(false).unwrap();
    let e = gdb.read(0x10, &mut word).unwrap_err().to_string();
    assert!(
        e.ends_with("read of 8 bytes at guest-virtual 0x10 failed: E14"),
        "{e}"
    );
    gdb.phys_mode(true).unwrap();
    let e = ram.read(0x3000_0000, &mut word).unwrap_err().to_string();
    assert_eq!(e, "guest-physical address 0x30000000 is not in guest RAM");

    // What a 4 KiB read costs each way (printed, never asserted).
    let n = 50;
    let t = Instant::now();
    for _ in 0..n {
        gdb.read(banner, &mut by_stub).unwrap();
    }
    let stub = t.elapsed() / n;
    let t = Instant::now();
    for _ in 0..n {
        ram.read(banner, &mut by_proc).unwrap();
    }
    eprintln!(
        "4 KiB read: stub {stub:?}, /proc/PID/mem {:?}",
        t.elapsed() / n
    );
    gdb.phys_mode(false).unwrap();
}

fn stop_resume(qmp: &mut Qmp, gdb: &mut Gdb) {
    gdb.resume().unwrap();
    assert_eq!(qmp.status().unwrap(), "running", "after resume");
    let n = 20;
    let t = Instant::now();
    for _ in 0..n {
        gdb.stop().unwrap();
        gdb.resume().unwrap();
    }
    eprintln!("stop + resume round trip: {:?}", t.elapsed() / n);
    assert_eq!(qmp.status().unwrap(), "running");
    // A QMP stop reaches the stub as a stop; the stub's stop then finds
    // the VM stopped and still answers.
    qmp.execute("stop", None).unwrap();
    let stop = gdb.stop().unwrap();
    assert!(stop.starts_with('T'), "{stop}");
    assert!(qmp.take_events().stop, "QMP saw the STOP event");
    let threads = gdb.threads().unwrap();
    assert_eq!(threads.len(), 2);
    let r = gdb.regs(threads[1]).unwrap();
    assert_ne!(r.cr3, 0);
}
