//! The QEMU backend's wire layer against a real QEMU (TCG): the QMP client,
//! the RAM layout, the gdbstub client and /proc/PID/mem, and their errors.
//!
//! The Linux guest (`QemuVm::linux`) waits for a root disk that never
//! comes, idle and fully up; one boot runs every live check, in sequence.
//! Other checks use a QEMU that never starts its guest (-S).

mod common;

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::qemu_vm::{linux_acpi, QemuVm, TIMEOUT};
use common::{elf_symbol, scratch_in};
use tracer::qemu::gdb::{Gdb, GdbAddr, ThreadId};
use tracer::qemu::procmem::ProcRam;
use tracer::qemu::qmp::{Qmp, QmpError};
use tracer::qemu::queries::Queries;

/// Linux's __START_KERNEL_map: the kernel image's virtual base.
const START_KERNEL_MAP: u64 = 0xffff_ffff_8000_0000;

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

/// Opening the memory of another user's process: the error says permission
/// and what it takes. As root, this test runs itself again as nobody
/// against its own (root's) process; as another user, it opens PID 1's.
#[test]
fn proc_ram_permission_denied() {
    const TARGET: &str = "QEMU_WIRE_OPEN_MEM_OF";
    if let Ok(pid) = std::env::var(TARGET) {
        // The run as nobody: its result on stdout, for the run as root.
        match ProcRam::open(pid.parse().unwrap(), &[]) {
            Ok(_) => println!("RESULT: opened"),
            Err(e) => println!("RESULT: {e}"),
        }
        return;
    }
    // SAFETY: geteuid has no preconditions.
    let e = if unsafe { libc::geteuid() } == 0 {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["proc_ram_permission_denied", "--exact", "--nocapture"])
            .env(TARGET, std::process::id().to_string())
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix("RESULT: "))
            .unwrap_or_else(|| panic!("the run as nobody said nothing: {text}"))
            .to_string()
    } else {
        ProcRam::open(1, &[]).err().unwrap().to_string()
    };
    assert!(
        e.contains("/mem: permission denied (reading another process's memory needs root"),
        "{e}"
    );
}

/// A QEMU that has not started its guest (-S): one QMP client at a time,
/// one gdbstub client at a time, RAM above 4 GiB (3.5 GiB: never touched,
/// the guest does not run), and QEMU's death is a clear error on each.
#[test]
fn qmp_busy_and_qemu_gone() {
    let mut vm = QemuVm::launch("busy", "3584", &["-S"]);
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
    assert_eq!(qmp.gdbserver().unwrap(), None);
    qmp.open_gdbserver(&format!("tcp:127.0.0.1:{port}"))
        .unwrap();
    let addr: GdbAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert_eq!(addr, GdbAddr::Tcp(format!("127.0.0.1:{port}")));
    let server = qmp.gdbserver().unwrap().unwrap();
    assert_eq!(
        (server.addr.as_ref(), server.connected),
        (Some(&addr), false)
    );
    let mut gdb = Gdb::connect(&addr, TIMEOUT).unwrap();
    assert!(
        qmp.gdbserver().unwrap().unwrap().connected,
        "a client is on"
    );
    assert_eq!(gdb.threads().unwrap().len(), 2);
    gdb.stop().unwrap();
    let e = Gdb::connect(&addr, Duration::from_millis(500))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("another debugger holds the stub"), "{e}");
    assert_eq!(
        gdb.threads().unwrap().len(),
        2,
        "the first client still works"
    );
    let layout = qmp.ram_layout().unwrap();
    let spans: Vec<(u64, u64)> = layout.iter().map(|r| (r.gpa, r.gpa + r.len)).collect();
    assert_eq!(
        spans,
        [
            (0, 0xa0000),
            (0x10_0000, 0xc000_0000),
            (0x1_0000_0000, 0x1_2000_0000)
        ],
        "3.5 GiB: 3 GiB below the PCI hole, 512 MiB above 4 GiB"
    );
    let ram = ProcRam::open(qmp.pid().unwrap(), &layout).unwrap();
    gdb.phys_mode(true).unwrap();
    for gpa in [0x10_0000, 0xbfff_fff8, 0x1_0000_0000, 0x1_1fff_fff8] {
        ram.store_u32(gpa, 0xfeed_f00d).unwrap();
        let mut b = [0u8; 4];
        gdb.read(gpa, &mut b).unwrap();
        assert_eq!(u32::from_le_bytes(b), 0xfeed_f00d, "at {gpa:#x}");
    }
    // One access across the end of the low RAM: the second part is unmapped.
    let e = ram
        .read(0xbfff_fff8, &mut [0u8; 16])
        .unwrap_err()
        .to_string();
    assert_eq!(e, "guest-physical address 0xc0000000 is not in guest RAM");
    vm.kill();
    assert_eq!(
        ram.load_u32(0x10_0000).unwrap_err().to_string(),
        format!(
            "/proc/{}/mem: the process has exited (QEMU is gone)",
            vm.child.id()
        )
    );
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
    gdb.stop().unwrap();
    assert_eq!(qmp.status().unwrap(), "paused");
    // QEMU stopped the VM on connect and said so.
    assert!(
        gdb.last_stop().unwrap().starts_with("T02thread:"),
        "{:?}",
        gdb.last_stop()
    );
    vcpu_regs(&mut qmp, &mut gdb);
    memory(&mut gdb, &ram);
    stop_resume(&mut qmp, &mut gdb);
    breakpoint(&mut gdb);
    // Detach from a running VM: the client stops it first.
    gdb.resume().unwrap();
    gdb.stop().unwrap();
    let jiffies = elf_symbol(&linux_acpi().1, "jiffies_64") - START_KERNEL_MAP;
    let stopped_at = ram.load_u64(jiffies).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        ram.load_u64(jiffies).unwrap(),
        stopped_at,
        "time stands still"
    );
    gdb.resume().unwrap();
    gdb.detach().unwrap();
    assert_eq!(qmp.status().unwrap(), "running", "after detach");
    vm.wait_for(
        || ram.load_u64(jiffies).unwrap() > stopped_at,
        "jiffies to move on after detach",
    );
    drop(gdb);
    qmp.close_gdbserver().unwrap();
    assert!(
        Gdb::connect(&GdbAddr::Unix(gdb_sock.clone()), TIMEOUT).is_err(),
        "a closed gdbserver refuses"
    );
    // A fresh gdbserver on the same path works; a client dropped while it
    // holds the VM stopped (QEMU stops it on connect, and would keep it
    // stopped when the connection closes) detaches: the VM runs.
    qmp.open_gdbserver(&spec).unwrap();
    let mut gdb = Gdb::connect(&GdbAddr::Unix(gdb_sock.clone()), TIMEOUT).unwrap();
    assert_eq!(gdb.threads().unwrap().len(), 2);
    assert_eq!(qmp.status().unwrap(), "paused", "stopped on connect");
    drop(gdb);
    assert_eq!(qmp.status().unwrap(), "running", "after a client left");
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
fn memory(gdb: &mut Gdb, ram: &ProcRam) {
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
    // 64 KiB and an odd end: several batches of packets in flight.
    let (mut text_stub, mut text_proc) = (vec![0u8; 65536 + 77], vec![0u8; 65536 + 77]);
    gdb.read(0x100_0000 + 3, &mut text_stub).unwrap();
    ram.read(0x100_0000 + 3, &mut text_proc).unwrap();
    assert!(text_stub == text_proc, "kernel text, stub vs /proc/PID/mem");

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
    let t = Instant::now();
    gdb.read(0x100_0000, &mut text_stub).unwrap();
    eprintln!("64 KiB read through the stub: {:?}", t.elapsed());
    gdb.phys_mode(false).unwrap();
}

fn stop_resume(qmp: &mut Qmp, gdb: &mut Gdb) {
    gdb.resume().unwrap();
    assert_eq!(qmp.status().unwrap(), "running", "after resume");
    let e = gdb.threads().unwrap_err().to_string();
    assert!(
        e.ends_with("qfThreadInfo sent while the VM runs: stop it first"),
        "{e}"
    );
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
    gdb.stop().unwrap();
    assert_eq!(qmp.status().unwrap(), "paused");
    assert!(qmp.take_events().stop, "QMP saw the STOP event");
    let threads = gdb.threads().unwrap();
    assert_eq!(threads.len(), 2);
    let r = gdb.regs(threads[1]).unwrap();
    assert_ne!(r.cr3, 0);
}

/// Why guest code is written through the stub: under TCG, QEMU runs
/// translations of guest code it caches; a write through the stub drops
/// those of the memory written, a write through /proc/PID/mem bypasses
/// QEMU and the old translation keeps running. On a QEMU that never ran
/// its firmware (-S), vCPU 0 runs a real-mode loop storing a byte.
#[test]
fn code_written_through_the_stub_replaces_translations() {
    let vm = QemuVm::launch("tcg-code", "64", &["-S"]);
    let mut qmp = vm.qmp();
    let gdb_sock = vm.dir.join("gdb.sock");
    qmp.open_gdbserver(&format!("unix:{},server=on,wait=off", gdb_sock.display()))
        .unwrap();
    let mut gdb = Gdb::connect(&GdbAddr::Unix(gdb_sock), TIMEOUT).unwrap();
    let ram = ProcRam::open(qmp.pid().unwrap(), &qmp.ram_layout().unwrap()).unwrap();
    let (code, flag) = (0x1000u64, 0x2000u64);
    // mov byte [0x2000], 1; jmp back to the mov.
    let program = [0xc6, 0x06, 0x00, 0x20, 0x01, 0xeb, 0xf9];
    gdb.phys_mode(true).unwrap();
    gdb.write(code, &program).unwrap();
    let cpu0 = gdb.threads().unwrap()[0];
    gdb.set_reg(cpu0, "cs", 0).unwrap();
    gdb.set_reg(cpu0, "rip", code).unwrap();
    assert_eq!(gdb.regs(cpu0).unwrap().rip, code);

    // Runs the loop until it stores its byte, and returns that byte.
    let run = |gdb: &mut Gdb| {
        ram.write(flag, &[0]).unwrap();
        gdb.resume().unwrap();
        vm.wait_for(
            || ram.read(flag, &mut [0u8]).is_ok() && byte(&ram, flag) != 0,
            "vCPU 0 storing its byte",
        );
        gdb.stop().unwrap();
        byte(&ram, flag)
    };
    assert_eq!(run(&mut gdb), 1);
    // The immediate, changed behind QEMU's back: the old translation stays.
    ram.write(code + 4, &[2]).unwrap();
    assert_eq!(
        run(&mut gdb),
        1,
        "a /proc/PID/mem write to code is not seen"
    );
    // Through the stub: QEMU drops the translation and runs the new code.
    gdb.write(code + 4, &[3]).unwrap();
    assert_eq!(run(&mut gdb), 3, "a stub write to code is seen");
    gdb.detach().unwrap();
}

fn byte(ram: &ProcRam, gpa: u64) -> u8 {
    let mut b = [0u8];
    ram.read(gpa, &mut b).unwrap();
    b[0]
}

/// A breakpoint through the stub: the rootwait loop calls msleep(5) every
/// 5 ms; the vCPU that hits it stops them all, at msleep's address.
fn breakpoint(gdb: &mut Gdb) {
    let (_, vmlinux) = linux_acpi();
    let msleep = elf_symbol(&vmlinux, "msleep");
    gdb.set_breakpoint(msleep).unwrap();
    gdb.resume().unwrap();
    let stop = gdb
        .wait_stop(Duration::from_secs(60))
        .unwrap()
        .expect("the guest calls msleep");
    assert_eq!(stop.signal, 5, "{stop:?}");
    let thread = stop.thread.expect("the stop names its vCPU");
    assert_eq!(gdb.regs(thread).unwrap().rip, msleep, "{stop:?}");
    gdb.clear_breakpoint(msleep).unwrap();
    // No breakpoint left: the guest runs on until stopped.
    gdb.resume().unwrap();
    assert_eq!(gdb.wait_stop(Duration::from_millis(100)).unwrap(), None);
    gdb.stop().unwrap();
}
