//! A libvirt domain for the tests that attach by domain name: a transient
//! TCG domain (`virsh create`, through libvirt's own bindings) that boots
//! the default guest's kernel directly with the workload initramfs, as
//! tests/common/qemu.rs does with QEMU alone, its serial console on a unix
//! socket the test listens on (QEMU connects at start: no output is lost).
//!
//! libvirt runs QEMU as its own user (libvirt-qemu) and takes the kernel
//! and initramfs it boots for that user (dynamic ownership): both are
//! copied into a 0755 directory of the domain's own, as is the console's
//! socket, so that guest/out stays as it is. The domain has a unique name
//! and is destroyed on drop (a panicking test's too).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use tracer::qemu::layout::{join_layout, parse_flat_ram, parse_gpa2hva, parse_ramblocks, RamRange};
use tracer::qemu::libvirt::LibvirtDomain;
use virt::connect::Connect;
use virt::domain::Domain;

use super::console::SerialConsole;
use super::linux_61;
use super::qemu::{workload_initramfs, Workload};

/// The libvirt the tests use: the system daemon (.ci/run starts it).
pub const URI: &str = "qemu:///system";

/// A running transient domain; dropping it destroys it and removes its
/// directory.
pub struct LibvirtGuest {
    conn: Connect,
    dom: Option<Domain>,
    name: String,
    dir: PathBuf,
    pub console: SerialConsole,
    pid: u32,
    /// How long `boot` took until the workload said it was ready.
    pub boot_time: Duration,
}

/// A name no other test (of this binary or another) uses at the same time.
pub fn unique_name(what: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("vmtrace-{what}-{}-{n}", std::process::id())
}

/// The domain XML of the default guest: TCG, direct kernel boot, the
/// console on `serial` (QEMU connects to it), `cpus` vCPUs (one per
/// socket: the default guest finds its CPUs in SeaBIOS's MP table).
pub fn domain_xml(name: &str, dir: &Path, cpus: u32, serial: &Path) -> String {
    format!(
        "<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>256</memory>
  <vcpu>{cpus}</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{dir}/bzImage</kernel>
    <initrd>{dir}/workload.cpio.gz</initrd>
    <cmdline>console=ttyS0 panic=-1</cmdline>
  </os>
  <cpu mode='custom' match='exact'><model fallback='allow'>qemu64</model>
    <feature policy='disable' name='cx16'/>
    <topology sockets='{cpus}' dies='1' cores='1' threads='1'/></cpu>
  <devices>
    <serial type='unix'><source mode='connect' path='{serial}'/><target port='0'/></serial>
    <memballoon model='none'/>
  </devices>
</domain>",
        dir = dir.display(),
        serial = serial.display()
    )
}

/// Connect to the system libvirt, or say how to start it.
pub fn connect() -> Connect {
    virt::error::clear_error_callback();
    Connect::open(Some(URI)).unwrap_or_else(|e| {
        panic!(
            "libvirt at {URI}: {e}; start its daemons (`virtlogd -d; libvirtd -d`, as .ci/run does)"
        )
    })
}

/// /tmp/vmtrace-libvirt-NAME, 0755, holding copies of what the domain
/// boots (readable by libvirt's QEMU user).
fn domain_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (bz, _) = linux_61();
    for (from, to) in [(bz, "bzImage"), (workload_initramfs(), "workload.cpio.gz")] {
        let dest = dir.join(to);
        std::fs::copy(&from, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    dir
}

impl LibvirtGuest {
    /// Create a transient domain of the default guest with `cpus` vCPUs
    /// and wait for its workload's ready line.
    pub fn boot(what: &str, cpus: u32) -> (LibvirtGuest, Workload) {
        let name = unique_name(what);
        let dir = domain_dir(&name);
        let serial_path = dir.join("serial.sock");
        let listener = UnixListener::bind(&serial_path)
            .unwrap_or_else(|e| panic!("listen on {}: {e}", serial_path.display()));
        // QEMU connects as libvirt's user.
        std::fs::set_permissions(&serial_path, std::fs::Permissions::from_mode(0o777)).unwrap();
        let conn = connect();
        let start = Instant::now();
        let xml = domain_xml(&name, &dir, cpus, &serial_path);
        let dom = Domain::create_xml(&conn, &xml, 0).unwrap_or_else(|e| {
            let _ = std::fs::remove_dir_all(&dir);
            panic!("libvirt did not create domain {name}: {e}")
        });
        let serial = accept(&listener);
        let mut guest = LibvirtGuest {
            conn,
            dom: Some(dom),
            name,
            dir,
            console: SerialConsole::new(serial, "the domain's QEMU exited"),
            pid: 0,
            boot_time: Duration::ZERO,
        };
        let w = guest.console.wait_ready().unwrap();
        guest.boot_time = start.elapsed();
        guest.pid = guest.libvirt().pid;
        eprintln!(
            "domain {} (QEMU pid {}) booted to the workload in {:.1} s",
            guest.name,
            guest.pid,
            guest.boot_time.as_secs_f64()
        );
        (guest, w)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The domain's QEMU process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// vmtrace's own view of the domain (tracer::qemu::libvirt).
    pub fn libvirt(&self) -> LibvirtDomain {
        LibvirtDomain::open(URI, &self.name).unwrap()
    }

    /// Run `virsh -c URI ARGS...`.
    pub fn virsh(&self, args: &[&str]) -> Output {
        virsh(args)
    }

    /// The domain's state as libvirt says it ("running", ...).
    pub fn state(&self) -> String {
        let dom = self.dom.as_ref().expect("not destroyed");
        let (s, _) = dom.get_state().unwrap();
        tracer::qemu::libvirt::state_name(s).to_string()
    }

    /// Guest-physical RAM and where the domain's QEMU maps it, asked
    /// through libvirt's monitor passthrough as vmtrace asks QMP.
    pub fn ram_layout(&self) -> Vec<RamRange> {
        let d = self.libvirt();
        let hmp = |cmd: &str| -> String {
            let r = d
                .execute(
                    "human-monitor-command",
                    Some(serde_json::json!({ "command-line": cmd })),
                )
                .unwrap();
            r.as_str().unwrap().to_string()
        };
        let flat = parse_flat_ram(&hmp("info mtree -f -o")).unwrap();
        let blocks = parse_ramblocks(&hmp("info ramblock"));
        let hvas: Vec<u64> = flat
            .iter()
            .map(|r| parse_gpa2hva(&hmp(&format!("gpa2hva {:#x}", r.gpa))).unwrap())
            .collect();
        join_layout(&flat, &hvas, &blocks).unwrap()
    }

    /// Destroy the domain now (as its drop does).
    pub fn destroy(&mut self) {
        if let Some(d) = self.dom.take() {
            let _ = d.destroy();
        }
        self.console.close();
    }

    /// The connection the domain was made on.
    pub fn conn(&self) -> &Connect {
        &self.conn
    }
}

impl Drop for LibvirtGuest {
    fn drop(&mut self) {
        self.destroy();
        let _ = std::fs::remove_dir_all(&self.dir);
        // virtlogd's log of the transient domain, kept by libvirt after it.
        let _ = std::fs::remove_file(format!("/var/log/libvirt/qemu/{}.log", self.name));
    }
}

/// A persistent domain defined and never started (shut off); undefined on
/// drop.
pub struct DefinedDomain {
    dom: Option<Domain>,
    pub name: String,
}

impl DefinedDomain {
    /// Define the default guest's domain under a unique name, without
    /// starting it (its files need not exist until a start).
    pub fn define(what: &str) -> DefinedDomain {
        let name = unique_name(what);
        let dir = std::env::temp_dir().join(&name);
        let xml = domain_xml(&name, &dir, 1, &dir.join("serial.sock"));
        let dom = Domain::define_xml(&connect(), &xml)
            .unwrap_or_else(|e| panic!("libvirt did not define domain {name}: {e}"));
        DefinedDomain {
            dom: Some(dom),
            name,
        }
    }

    /// Its state as libvirt says it ("shut off").
    pub fn state(&self) -> String {
        let (s, _) = self.dom.as_ref().expect("defined").get_state().unwrap();
        tracer::qemu::libvirt::state_name(s).to_string()
    }
}

impl Drop for DefinedDomain {
    fn drop(&mut self) {
        if let Some(d) = self.dom.take() {
            let _ = d.undefine();
        }
    }
}

/// Run `virsh -c URI ARGS...`.
pub fn virsh(args: &[&str]) -> Output {
    Command::new("virsh")
        .arg("-c")
        .arg(URI)
        .args(args)
        .output()
        .expect("run virsh (apt-get install libvirt-clients)")
}

/// QEMU's connection to the console's socket (made as QEMU starts, before
/// the guest runs).
fn accept(listener: &UnixListener) -> UnixStream {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                return s;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept on the console's socket: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "the domain's QEMU did not connect its console within 60 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
