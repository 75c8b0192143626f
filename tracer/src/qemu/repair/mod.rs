//! What a vmtrace that died (SIGKILL, OOM, a panic) left in a QEMU, found
//! and taken out: `vmtrace detach --qmp SOCKET`, and the check by which
//! the next `vmtrace attach` refuses such a VM rather than trip over it.
//!
//! The journal (`super::journal`) says what vmtrace may have changed; QEMU
//! says what is left of its gdbstub (its chardev `gdb`) and whether the
//! guest froze at a breakpoint (status `debug`). The repair undoes them
//! with the checks of a detach: everything in a stop of its own stub; a
//! site restored only where it still holds vmtrace's call; the region's
//! page-directory entries cleared only when they hold what vmtrace wrote,
//! and only once no vCPU runs in its code and (function graph) no hooked
//! call has yet to return through it; then every page given back its
//! bytes. QEMU 7.2 removes every breakpoint and resumes the guest when a
//! debugger detaches (gdbstub/gdbstub.c: handle_detach ->
//! gdb_process_breakpoint_remove_all, gdb_continue), whichever stub set
//! them: that is how trap mode's breakpoints go.

mod region;

use std::path::{Path, PathBuf};
use std::time::Duration;

use vm_memory::GuestAddress;
use vmm::Stopped;

use super::error::QemuError;
use super::gdb::{Gdb, GdbAddr};
use super::guest::{QemuGuest, QemuStop};
use super::ivshmem;
use super::journal::{self, Armed, Journal, JournalRecord};
use super::marker::{self, Marker, MAGIC};
use super::monitor::Monitor;
use super::procmem::ProcRam;
use super::queries::{GdbServer, Queries};
use crate::kernel::high_rings::EfiTable;
use region::{left_mapped, region_held, region_stop, restore_sites};

/// How long to wait for each QMP or gdbstub reply (as an attach does).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// `query-status`'s status of a guest stopped by the gdbstub (QEMU's
/// RUN_STATE_DEBUG): with no debugger connected, it froze at a breakpoint.
const STATUS_DEBUG: &str = "debug";
/// `query-status`'s status of a guest stopped by a QMP `stop`, or by a
/// gdbstub client's connect or interrupt.
const STATUS_PAUSED: &str = "paused";
/// `query-status`'s status of a guest that runs.
const STATUS_RUNNING: &str = "running";

/// What a killed vmtrace left in a QEMU, as the attach's check sees it
/// without stopping the guest.
#[derive(Debug, Default)]
pub struct Leftovers {
    pub journal: Option<Journal>,
    /// vmtrace's gdbstub (not one the user gave).
    pub stub: Option<GdbServer>,
    /// The guest froze at a breakpoint with no debugger left.
    pub frozen: bool,
    /// The VM's status when someone else holds it stopped (`paused` after
    /// a QMP `stop`, `suspended`, ...): the repair leaves it so.
    pub held: Option<String>,
    /// vmtrace's marker in the guest (`super::marker`), and where.
    pub marker: Option<(u64, Marker)>,
    /// A ring device of vmtrace's no journal names (its journal lost, or
    /// another host's), as QEMU shows it.
    pub device: Option<ivshmem::SharedNames>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.journal.is_none()
            && self.stub.is_none()
            && !self.frozen
            && self.marker.is_none()
            && self.device.is_none()
    }

    /// One clause naming each.
    pub fn describe(&self) -> String {
        let mut what = Vec::new();
        if let Some(j) = &self.journal {
            let r = &j.record;
            what.push(format!(
                "the journal of vmtrace pid {} ({}, {})",
                r.vmtrace_pid,
                match r.armed {
                    Armed::Exitless => format!("exitless: {} sites", r.sites.len()),
                    Armed::Trap => format!("trap mode: {} breakpoints", r.breakpoints.len()),
                    Armed::Connecting => "attaching".to_string(),
                },
                j.path.display()
            ));
            if let Some(s) = &r.shared {
                what.push(format!("its ring device {}", s.device));
            }
        }
        if let (None, Some((gpa, m))) = (&self.journal, &self.marker) {
            what.push(format!(
                "its code and rings (its marker at guest-physical {gpa:#x}: vmtrace pid {}, {} sites)",
                m.vmtrace_pid,
                m.sites.len() + m.module_sites.len()
            ));
        }
        if let Some(d) = &self.device {
            what.push(format!(
                "its ring device {} (no journal names it)",
                d.device
            ));
        }
        if let Some(s) = &self.stub {
            what.push(format!("its gdbstub ({})", s.filename));
        }
        if self.frozen {
            what.push(
                "the guest frozen at one of its breakpoints (status paused (debug))".to_string(),
            );
        }
        what.join(", ")
    }
}

/// How the sockets of the stubs vmtrace opens are named: an attach's
/// (`session::open_stub`: the file, or the private directory it is in)
/// and a repair's (its directory).
const STUB_NAMES: [&str; 2] = ["vmtrace-gdb-", "vmtrace-repair-"];

/// Is this gdbstub one vmtrace opened (its socket's name says so)? Only
/// asked when no journal says which stub is vmtrace's.
fn is_vmtraces(s: &GdbServer) -> bool {
    let Some(GdbAddr::Unix(p)) = &s.addr else {
        return false;
    };
    let named = |n: Option<&std::ffi::OsStr>| {
        n.is_some_and(|n| {
            STUB_NAMES
                .iter()
                .any(|v| n.to_string_lossy().starts_with(v))
        })
    };
    named(p.file_name()) || named(p.parent().and_then(|d| d.file_name()))
}

/// What a vmtrace that is gone left in the QEMU `pid` at `qmp`; an error
/// when another vmtrace still runs on it.
pub fn leftovers(qmp: &mut Monitor, pid: u32) -> Result<Leftovers, QemuError> {
    let journal = super::journal::Journal::find(pid)?;
    if let Some(j) = &journal {
        if j.writer_alive() {
            return Err(QemuError::InUse {
                qmp: qmp.path().to_owned(),
                vmtrace: j.record.vmtrace_pid,
            });
        }
    }
    // The marker, read while the guest runs (its RAM through /proc).
    let ram = ProcRam::open(pid, &qmp.ram_layout()?)?;
    let marker = marker::find(|gpa, buf| ram.read(gpa, buf).is_ok());
    if let Some((_, m)) = &marker {
        if journal.is_none() && journal::runs(m.vmtrace_pid, m.vmtrace_start) {
            return Err(QemuError::InUse {
                qmp: qmp.path().to_owned(),
                vmtrace: m.vmtrace_pid,
            });
        }
    }
    let device = match &journal {
        Some(_) => None,
        None => leftover_device(qmp)?,
    };
    let given = journal.as_ref().and_then(|j| j.record.stub_given.clone());
    let server = qmp.gdbserver()?;
    // A connected stub is somebody's debugger (a live vmtrace has a
    // journal), and a guest it stopped is not frozen.
    let connected = server.as_ref().is_some_and(|s| s.connected);
    let status = qmp.status()?;
    let frozen = !connected && status == STATUS_DEBUG;
    // `paused` by a vmtrace killed inside a stop of its own (it marked
    // it), or by someone else, whose stop the repair keeps.
    let own_stop = status == STATUS_PAUSED && journal::stop_mark_of(pid).exists();
    let held = (status != STATUS_RUNNING && status != STATUS_DEBUG && !own_stop).then_some(status);
    let stub = server
        .filter(|s| !s.connected && (is_vmtraces(s) || (journal.is_some() && given.is_none())));
    Ok(Leftovers {
        journal,
        stub,
        frozen,
        held,
        marker,
        device,
    })
}

/// A ring device of vmtrace's QEMU lists with no journal naming it; an
/// error when the vmtrace that added it (its pid in the device's id)
/// still runs: its journal is elsewhere (another journal directory).
fn leftover_device(qmp: &mut Monitor) -> Result<Option<ivshmem::SharedNames>, QemuError> {
    let Some((vmtrace, names)) = ivshmem::find_leftover(qmp)? else {
        return Ok(None);
    };
    let comm = std::fs::read_to_string(format!("/proc/{vmtrace}/comm")).unwrap_or_default();
    if comm.trim_end() == "vmtrace" && !journal::exited(vmtrace) {
        return Err(QemuError::InUse {
            qmp: qmp.path().to_owned(),
            vmtrace,
        });
    }
    Ok(Some(names))
}

/// What a repair did, one line each, and whether the VM is as vmtrace
/// would leave it.
#[derive(Debug, Default)]
pub struct Repaired {
    pub lines: Vec<String>,
    /// Something could not be given back (the lines say what).
    pub incomplete: bool,
    /// Nothing of vmtrace's was found.
    pub nothing: bool,
    /// The region's entries are out of the guest's page tables (its ring
    /// device, if any, may go even when its pages' bytes could not).
    pub region_out: bool,
}

impl Repaired {
    fn did(&mut self, line: String) {
        self.lines.push(line);
    }
    fn failed(&mut self, line: String) {
        self.incomplete = true;
        self.lines.push(line);
    }
}

/// Find and take out what a killed vmtrace left in the QEMU at `qmp_path`.
pub fn repair(qmp_path: &Path) -> Result<Repaired, QemuError> {
    repair_monitor(super::burst::connect(qmp_path, REPLY_TIMEOUT)?)
}

/// `repair` of the QEMU whose monitor is `qmp` (any transport: a libvirt
/// domain's too).
pub fn repair_monitor(mut qmp: Monitor) -> Result<Repaired, QemuError> {
    let pid = qmp.pid();
    let found = qmp.burst(|m| leftovers(m, pid))?;
    repair_found(qmp, pid, found)
}

/// `repair` of the QEMU `qemu_pid`, only when the journal of the vmtrace
/// `writer` says it did not finish (None otherwise, QMP and the guest
/// untouched): what the guardian of an attach runs once that attach is
/// gone.
pub fn repair_journaled(
    qmp_path: &Path,
    qemu_pid: u32,
    writer: u32,
) -> Result<Option<Repaired>, QemuError> {
    let open = || Ok(super::burst::connect(qmp_path, REPLY_TIMEOUT)?);
    repair_journaled_with(open, qemu_pid, writer)
}

/// `repair_journaled`, its monitor opened by `open` (only when there is
/// something to repair).
pub fn repair_journaled_with(
    open: impl FnOnce() -> Result<Monitor, QemuError>,
    qemu_pid: u32,
    writer: u32,
) -> Result<Option<Repaired>, QemuError> {
    match Journal::find(qemu_pid)? {
        Some(j) if j.record.vmtrace_pid == writer => {}
        // Cleanly detached, or another vmtrace's since.
        _ => return Ok(None),
    }
    let mut qmp = open()?;
    let found = qmp.burst(|m| leftovers(m, qemu_pid))?;
    repair_found(qmp, qemu_pid, found).map(Some)
}

fn repair_found(mut qmp: Monitor, pid: u32, found: Leftovers) -> Result<Repaired, QemuError> {
    let mut out = Repaired::default();
    // Nothing QMP or the journal shows: still, a region whose journal is
    // gone would be in the guest's tables. Looked for in a stop of the
    // repair's own stub, unless the stub is somebody's.
    let look = found.is_empty();
    if look && qmp.gdbserver()?.is_some() {
        out.nothing = true;
        return Ok(out);
    }
    let (addr, own) = stub_for(&mut qmp, &found, &mut out)?;
    let ram = ProcRam::open(pid, &qmp.ram_layout()?)?;
    let result = Gdb::connect(&addr, REPLY_TIMEOUT)
        .and_then(|g| QemuGuest::new(g, ram))
        .map_err(QemuError::from)
        .and_then(|guest| {
            let mut from_marker = marker_record(&found);
            if let Some(r) = from_marker.as_mut() {
                // Its rings' entries map the device QEMU shows, in the
                // UEFI page tables the marker names too.
                r.shared = device_of_marker(&found);
            }
            let record = found.journal.as_ref().map(|j| &j.record);
            let record = record.or(from_marker.as_ref());
            let held = found.held.as_deref();
            let modules = found.marker.as_ref().map_or(&[][..], |m| &m.1.module_sites);
            let modules = match found.journal {
                None => modules,
                // (The journal names them, with their bytes.)
                Some(_) => &[],
            };
            in_stops(
                &guest,
                true,
                (record, modules),
                found.frozen,
                held,
                &mut out,
            )
            .and_then(|stop| unmark(stop, &found, &mut out))
            .and_then(|stop| {
                let device = device_of_marker(&found);
                orphan_region(stop, exitless(record), device.as_ref(), &mut out)
            })
        });
    if let Some(own) = own {
        own.close(&mut qmp);
    }
    result?;
    // The VM runs again (or stays in someone else's stop, unmarked).
    let _ = std::fs::remove_file(journal::stop_mark_of(pid));
    remove_device(&mut qmp, &found, &mut out);
    if look && !out.incomplete {
        return Ok(Repaired {
            nothing: true,
            ..Repaired::default()
        });
    }
    match (found.journal, out.incomplete) {
        (Some(j), false) => {
            let (pid, start) = (j.record.vmtrace_pid, j.record.vmtrace_start);
            if !journal::pid_reused(pid, start) {
                for dir in super::stub::remove_dead_dirs(pid) {
                    out.did(format!(
                        "removed vmtrace's gdbstub directory {}",
                        dir.display()
                    ));
                }
            }
            out.did(format!("removed vmtrace's journal {}", j.path.display()));
            j.remove();
        }
        (Some(j), true) => out.lines.push(format!(
            "kept vmtrace's journal {} for another try",
            j.path.display()
        )),
        (None, _) => {}
    }
    Ok(out)
}

/// The ring device (the journal's, or one QEMU shows that no journal
/// names) removed once the region is out of the guest's page tables, even
/// where the pages' bytes could not be given back (a repair by the
/// marker); kept while someone else holds the VM stopped (its guest
/// cannot eject it, and the repair does not resume it).
fn remove_device(qmp: &mut Monitor, found: &Leftovers, out: &mut Repaired) {
    let journaled = found.journal.as_ref().and_then(|j| j.record.shared.clone());
    let shared = journaled.or_else(|| found.device.clone());
    let out_of_tables = out.region_out || !out.incomplete;
    if let (Some(_), Some(held)) = (&shared, &found.held) {
        // Its guest cannot eject it, and the repair does not resume it.
        out.failed(format!(
            "kept vmtrace's ring device while the VM is stopped ({held})"
        ));
    } else if let (Some(names), true) = (shared, out_of_tables) {
        // The region is out of the guest: its ring device may go.
        match qmp.burst(|m| ivshmem::unplug(m, &names)) {
            Ok(()) => out.did(format!(
                "removed vmtrace's ring device {} and its file {}",
                names.device,
                names.path.display()
            )),
            Err(e) => out.failed(format!("kept vmtrace's ring device: {e}")),
        }
    }
}

/// The stub the repair works through: vmtrace's own closed (QEMU keeps
/// one gdbstub; breakpoints stay with the vCPUs), the user's (given to
/// the attach, or open beside it) used and kept, else one of the repair's.
fn stub_for(
    qmp: &mut Monitor,
    found: &Leftovers,
    out: &mut Repaired,
) -> Result<(GdbAddr, Option<OwnStub>), QemuError> {
    if let Some(s) = &found.stub {
        qmp.close_gdbserver()?;
        if let Some(GdbAddr::Unix(p)) = &s.addr {
            super::stub::remove_private(p);
        }
        out.did(format!("closed vmtrace's gdbstub ({})", s.filename));
    }
    let given = found
        .journal
        .as_ref()
        .and_then(|j| j.record.stub_given.as_deref());
    let theirs = match (&found.stub, given) {
        (None, None) => qmp.gdbserver()?.and_then(|s| s.addr),
        (_, given) => given.map(|g| g.parse::<GdbAddr>().unwrap_or_else(|e| match e {})),
    };
    Ok(match theirs {
        Some(a) => (a, None),
        None => {
            let own = OwnStub::open(qmp)?;
            (GdbAddr::Unix(own.socket.clone()), Some(own))
        }
    })
}

/// Without its journal, what the marker says the attach wrote (not what
/// the pages held).
fn marker_record(found: &Leftovers) -> Option<JournalRecord> {
    let (None, Some((_, m))) = (&found.journal, &found.marker) else {
        return None;
    };
    let mut r = Journal::from_marker(m);
    if m.truncated {
        // Sites it does not name may call the region: it stays.
        r.pages.clear();
    }
    Some(r)
}

/// Without its journal, the ring device QEMU shows, with the UEFI page
/// tables whose entry 508 the marker says the attach set (the repair has
/// no kernel to find `efi_mm` with; the entry there is cleared only if it
/// points into that device, as the kernel's).
fn device_of_marker(found: &Leftovers) -> Option<ivshmem::SharedNames> {
    let efi = found.marker.as_ref().and_then(|(_, m)| m.efi_root);
    found.device.clone().map(|d| ivshmem::SharedNames {
        efi: efi.map(|root| EfiTable { root }),
        ..d
    })
}

/// The repair's own stub, on a socket in a 0700 directory of its own.
struct OwnStub {
    dir: PathBuf,
    socket: PathBuf,
}

impl OwnStub {
    fn open(qmp: &mut Monitor) -> Result<OwnStub, QemuError> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("vmtrace-repair-{}-{nanos:x}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| QemuError::NotTraceable(format!("{}: {e}", dir.display())))?;
        // A QEMU of another user (libvirt's) makes its socket there too.
        let dir = super::stub::hand_to(dir, qmp.uid())?;
        let socket = dir.join("gdb.sock");
        if let Err(e) = qmp.open_gdbserver(&format!("unix:{},server=on,wait=off", socket.display()))
        {
            let _ = std::fs::remove_dir(&dir);
            return Err(e.into());
        }
        Ok(OwnStub { dir, socket })
    }

    fn close(self, qmp: &mut Monitor) {
        let _ = qmp.close_gdbserver();
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The repair inside the guest: sites in a first stop (with `record`'s,
/// the modules' sites a marker names, located there), the region in a
/// later one, returned: its detach takes every breakpoint out and lets the
/// guest run. In a VM someone else holds stopped (`held`: its status), all
/// is done in one stop that never resumes it: the breakpoints the journal
/// names are taken out one by one (a detach would resume the VM), and a
/// region a task is still inside stays for a later repair.
fn in_stops<'g>(
    guest: &'g QemuGuest,
    already: bool,
    (record, modules): (Option<&JournalRecord>, &[u64]),
    frozen: bool,
    held: Option<&str>,
    out: &mut Repaired,
) -> Result<QemuStop<'g>, QemuError> {
    // (Stopped since the stub connected, when `already`.)
    let mut stop = guest.stop_in(already, held.is_some())?;
    if let Some(r) = record.filter(|r| !r.jumps.is_empty()) {
        // Not in a module's memory freed since (`super::event_modules`).
        let r = super::event_modules::repairable(&stop, &r.jumps);
        out.did(crate::qemu::event_sites::restore(&stop, &r.jumps)?.to_string());
        if r.gone > 0 {
            out.did(format!(
                "{} event sites left alone: their module was unloaded since (its memory freed)",
                r.gone
            ));
        }
        if r.unchecked > 0 {
            out.failed(format!(
                "{} event sites of modules left alone: the guest's module list could not be read",
                r.unchecked
            ));
        }
    }
    if let Some(r) = record.filter(|r| r.armed == Armed::Exitless) {
        let (with_modules, unlocated) = region::with_module_sites(&stop, r, modules, out);
        let r = &with_modules;
        let stuck = restore_sites(&stop, r, out)?;
        if stuck > 0 {
            // A direct entry still jumping to its stub needs vmtrace's code.
            out.failed(format!(
                "{stuck} direct entries jump into vmtrace's code and no journal holds their \
                 first bytes: they and vmtrace's code and rings are left in place"
            ));
        }
        stop = match (stuck + unlocated, held) {
            (0, Some(status)) => region_held(stop, r, status, out)?,
            (0, None) => {
                stop.resume()?;
                region_stop(guest, r, out)?
            }
            _ => stop,
        };
    }
    let breakpoints = record.map_or(0, |r| r.breakpoints.len());
    match (record.map(|r| r.armed), frozen, held) {
        (Some(Armed::Trap), _, Some(status)) => {
            for &addr in record.map_or(&[][..], |r| &r.breakpoints[..]) {
                clear_breakpoint(&stop, addr)?;
            }
            out.did(format!(
                "removed vmtrace's breakpoints (at up to {breakpoints} sites); the VM stays {status}, as someone left it"
            ))
        }
        (_, _, Some(status)) => out.did(format!("the VM stays {status}, as someone left it")),
        (Some(Armed::Trap), true, None) => out.did(format!(
            "removed vmtrace's breakpoints (at up to {breakpoints} sites); the guest, frozen at one (paused (debug)), runs again"
        )),
        (Some(Armed::Trap), false, None) => out.did(format!(
            "removed vmtrace's breakpoints (at up to {breakpoints} sites); the guest runs on"
        )),
        (_, true, None) => out.did("removed a breakpoint the guest was frozen at (paused (debug)); it runs again".into()),
        _ => out.did("the guest runs on".into()),
    }
    Ok(stop)
}

/// Takes out the breakpoint at `addr`; one that is not set (the journal
/// names every site it might arm) is no error, a broken stub is.
fn clear_breakpoint(stop: &QemuStop<'_>, addr: u64) -> Result<(), QemuError> {
    match stop.clear_breakpoint(addr) {
        Ok(()) | Err(crate::qemu::gdb::GdbError::Reply { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A marker the journal-less repair went by: its magic cleared once the
/// region is out (the page's other bytes are what vmtrace wrote, and stay:
/// what they were is in the journal only), or a marker that lists only
/// some sites said.
fn unmark<'g>(
    stop: QemuStop<'g>,
    found: &Leftovers,
    out: &mut Repaired,
) -> Result<QemuStop<'g>, QemuError> {
    let (None, Some((gpa, m))) = (&found.journal, &found.marker) else {
        return Ok(stop);
    };
    if m.truncated {
        out.failed(format!(
            "vmtrace's marker names only {} of the sites it patched: the others may still call its code",
            m.sites.len()
        ));
    }
    if left_mapped(&stop, device_of_marker(found).as_ref()) == 0 {
        stop.ram()
            .write_slice(&[0u8; MAGIC.len()], GuestAddress(*gpa))
            .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
    }
    Ok(stop)
}

/// Was the journaled attach exitless?
fn exitless(record: Option<&JournalRecord>) -> bool {
    record.is_some_and(|r| r.armed == Armed::Exitless)
}

/// The repair's last stop: a region no journal names (its journal gone,
/// or that of an earlier attach) is said, and left; then the stub detaches
/// (every breakpoint out, the guest running).
fn orphan_region(
    stop: QemuStop<'_>,
    journaled: bool,
    device: Option<&ivshmem::SharedNames>,
    out: &mut Repaired,
) -> Result<(), QemuError> {
    let left = match journaled {
        true => 0,
        false => left_mapped(&stop, device),
    };
    stop.detach()?;
    if left > 0 {
        out.failed(format!(
            "vmtrace's code and rings are mapped ({left} page-directory entries), but no journal \
             says which sites call them or what its pages held: left in place"
        ));
    }
    Ok(())
}

/// An attach that failed after it wrote to the guest (its stub still
/// connected, the guest running): everything the journal names given
/// back as a repair would, and the guest handed back to QEMU. Says what
/// could not be.
pub fn give_back(guest: &QemuGuest, record: &JournalRecord) -> Result<Repaired, QemuError> {
    let mut out = Repaired::default();
    in_stops(guest, false, (Some(record), &[]), false, None, &mut out)?.detach()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::region::{into_code, into_target, CALL, JMP};
    use super::*;
    use crate::plan::exitless::layout::{CODE_LEN, CODE_VA};

    #[test]
    fn a_site_is_vmtraces_only_when_it_calls_or_jumps_into_its_code() {
        let va = 0xffff_ffff_8100_0000u64;
        let call = |target: u64| {
            let rel = target.wrapping_sub(va + 5) as i64 as i32;
            let mut b = [CALL, 0, 0, 0, 0];
            b[1..].copy_from_slice(&rel.to_le_bytes());
            b
        };
        assert_eq!(
            into_code(va, &call(CODE_VA + 0x40)),
            Some((CALL, CODE_VA + 0x40))
        );
        assert!(into_code(va, &call(CODE_VA + CODE_LEN)).is_none());
        // ftrace's own call (ftrace_caller, in kernel text) is the guest's.
        assert!(into_code(va, &call(va + 0x1000)).is_none());
        assert!(into_code(va, &[0x0f, 0x1f, 0x44, 0, 0]).is_none());
        // A direct entry's jump to its stub is vmtrace's too.
        let mut jmp = call(CODE_VA + 0x1c0);
        jmp[0] = JMP;
        assert_eq!(into_code(va, &jmp), Some((JMP, CODE_VA + 0x1c0)));
        assert_eq!(into_target(va, &jmp), Some(CODE_VA + 0x1c0));
        assert_eq!(into_target(va, &call(CODE_VA)), None);
    }

    #[test]
    fn only_vmtraces_stub_is_taken_for_a_leftover() {
        let s = GdbServer::parse("disconnected:unix:/tmp/vmtrace-gdb-42-7.sock,server=on");
        assert!(is_vmtraces(&s));
        let s = GdbServer::parse("disconnected:unix:/tmp/vmtrace-repair-9-ab/gdb.sock,server=on");
        assert!(is_vmtraces(&s));
        let s = GdbServer::parse("disconnected:tcp:0.0.0.0:1234,server=on");
        assert!(!is_vmtraces(&s));
        // A user's socket in a directory of theirs that says vmtrace.
        let s = GdbServer::parse("disconnected:unix:/tmp/vmtrace-qemu-4-0/gdb.sock,server=on");
        assert!(!is_vmtraces(&s));
        assert!(Leftovers::default().is_empty());
    }
}
