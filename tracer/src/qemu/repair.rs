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

use std::path::{Path, PathBuf};
use std::time::Duration;

use vm_memory::GuestAddress;
use vmm::gva::{AddressSpace, Level};
use vmm::Stopped;

// Between two stops the guest runs as long as at a detach (for a vCPU to
// leave vmtrace's code), as many times.
use super::ending::{GRACE, REMOVE_ATTEMPTS as ATTEMPTS};
use super::error::QemuError;
use super::gdb::{Gdb, GdbAddr};
use super::guest::{QemuGuest, QemuStop};
use super::journal::{self, unhex, Armed, Journal, JournalRecord};
use super::marker::{self, Marker, MAGIC};
use super::procmem::ProcRam;
use super::qmp::{GdbServer, Qmp};
use crate::plan::exitless::layout::{
    CODE_LEN, CODE_VA, DATA_VA, FRAMES, FRAMES_OFF, FRAME_BUSY, FRAME_LEN, LARGE_PAGE, PAGE,
    PD_COUNT,
};

/// How long to wait for each QMP or gdbstub reply (as an attach does).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// `query-status`'s status of a guest stopped by the gdbstub (QEMU's
/// RUN_STATE_DEBUG): with no debugger connected, it froze at a breakpoint.
const STATUS_DEBUG: &str = "debug";
/// A page-table entry's present and writable bits, as vmtrace writes its
/// table entries (`session::exitless::map`), and the accessed and dirty
/// bits the CPU may add.
const TABLE: u64 = 0b11;
const ACCESSED_DIRTY: u64 = (1 << 5) | (1 << 6);
/// An entry's physical address bits (bits 12..52).
const ADDR_MASK: u64 = ((1 << 52) - 1) & !0xfff;
/// vmtrace's pages are in the guest's first MiB (`kernel::lowmem`).
const LOW_MIB: u64 = 1 << 20;
/// A `call rel32`: what vmtrace writes at an exitless ftrace site.
const CALL: u8 = 0xe8;
/// A `jmp rel32`: what vmtrace writes at a direct entry (to its stub,
/// `session::direct::stub`).
const JMP: u8 = 0xe9;
/// A direct stub's head (its `call` into the trampoline) is 5 bytes; the
/// stub of a site that held the ftrace NOP jumps back right after it.
const STUB_HEAD: u64 = 5;

/// What a killed vmtrace left in a QEMU, as the attach's check sees it
/// without stopping the guest.
#[derive(Debug, Default)]
pub struct Leftovers {
    pub journal: Option<Journal>,
    /// vmtrace's gdbstub (not one the user gave).
    pub stub: Option<GdbServer>,
    /// The guest froze at a breakpoint with no debugger left.
    pub frozen: bool,
    /// vmtrace's marker in the guest (`super::marker`), and where.
    pub marker: Option<(u64, Marker)>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.journal.is_none() && self.stub.is_none() && !self.frozen && self.marker.is_none()
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
        }
        if let (None, Some((gpa, m))) = (&self.journal, &self.marker) {
            what.push(format!(
                "its code and rings (its marker at guest-physical {gpa:#x}: vmtrace pid {}, {} sites)",
                m.vmtrace_pid,
                m.sites.len()
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
pub fn leftovers(qmp: &mut Qmp, pid: u32) -> Result<Leftovers, QemuError> {
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
    let given = journal.as_ref().and_then(|j| j.record.stub_given.clone());
    let server = qmp.gdbserver()?;
    // A connected stub is somebody's debugger (a live vmtrace has a
    // journal), and a guest it stopped is not frozen.
    let connected = server.as_ref().is_some_and(|s| s.connected);
    let frozen = !connected && qmp.status()? == STATUS_DEBUG;
    let stub = server
        .filter(|s| !s.connected && (is_vmtraces(s) || (journal.is_some() && given.is_none())));
    Ok(Leftovers {
        journal,
        stub,
        frozen,
        marker,
    })
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
    let mut qmp = Qmp::connect(qmp_path, REPLY_TIMEOUT)?;
    let pid = qmp.pid()?;
    let found = leftovers(&mut qmp, pid)?;
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
    match Journal::find(qemu_pid)? {
        Some(j) if j.record.vmtrace_pid == writer => {}
        // Cleanly detached, or another vmtrace's since.
        _ => return Ok(None),
    }
    let mut qmp = Qmp::connect(qmp_path, REPLY_TIMEOUT)?;
    let found = leftovers(&mut qmp, qemu_pid)?;
    repair_found(qmp, qemu_pid, found).map(Some)
}

fn repair_found(mut qmp: Qmp, pid: u32, found: Leftovers) -> Result<Repaired, QemuError> {
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
            let from_marker = marker_record(&found);
            let record = found.journal.as_ref().map(|j| &j.record);
            let record = record.or(from_marker.as_ref());
            in_stops(&guest, true, record, found.frozen, &mut out)
                .and_then(|stop| unmark(stop, &found, &mut out))
                .and_then(|stop| orphan_region(stop, exitless(record), &mut out))
        });
    if let Some(own) = own {
        own.close(&mut qmp);
    }
    result?;
    if look && !out.incomplete {
        return Ok(Repaired {
            nothing: true,
            ..Repaired::default()
        });
    }
    match (found.journal, out.incomplete) {
        (Some(j), false) => {
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

/// The stub the repair works through: vmtrace's own closed (QEMU keeps
/// one gdbstub; breakpoints stay with the vCPUs), the user's (given to
/// the attach, or open beside it) used and kept, else one of the repair's.
fn stub_for(
    qmp: &mut Qmp,
    found: &Leftovers,
    out: &mut Repaired,
) -> Result<(GdbAddr, Option<OwnStub>), QemuError> {
    if let Some(s) = &found.stub {
        qmp.close_gdbserver()?;
        if let Some(GdbAddr::Unix(p)) = &s.addr {
            let _ = std::fs::remove_file(p);
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

/// The repair's own stub, on a socket in a 0700 directory of its own.
struct OwnStub {
    dir: PathBuf,
    socket: PathBuf,
}

impl OwnStub {
    fn open(qmp: &mut Qmp) -> Result<OwnStub, QemuError> {
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
        let socket = dir.join("gdb.sock");
        if let Err(e) = qmp.open_gdbserver(&format!("unix:{},server=on,wait=off", socket.display()))
        {
            let _ = std::fs::remove_dir(&dir);
            return Err(e.into());
        }
        Ok(OwnStub { dir, socket })
    }

    fn close(self, qmp: &mut Qmp) {
        let _ = qmp.close_gdbserver();
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The repair inside the guest: sites in a first stop, the region in a
/// later one, returned: its detach takes every breakpoint out and lets the
/// guest run.
fn in_stops<'g>(
    guest: &'g QemuGuest,
    already: bool,
    record: Option<&JournalRecord>,
    frozen: bool,
    out: &mut Repaired,
) -> Result<QemuStop<'g>, QemuError> {
    // (Stopped since the stub connected, when `already`.)
    let mut stop = guest.stop(already)?;
    if let Some(r) = record.filter(|r| r.armed == Armed::Exitless) {
        let stuck = restore_sites(&stop, r, out)?;
        stop.resume()?;
        // A direct entry still jumping to its stub needs vmtrace's code.
        stop = match stuck {
            0 => region_stop(guest, r, out)?,
            n => {
                out.failed(format!(
                    "{n} direct entries jump into vmtrace's code and no journal holds their \
                     first bytes: they and vmtrace's code and rings are left in place"
                ));
                guest.stop(false)?
            }
        };
    }
    let breakpoints = record.map_or(0, |r| r.breakpoints.len());
    match (record.map(|r| r.armed), frozen) {
        (Some(Armed::Trap), true) => out.did(format!(
            "removed vmtrace's breakpoints (at up to {breakpoints} sites); the guest, frozen at one (paused (debug)), runs again"
        )),
        (Some(Armed::Trap), false) => out.did(format!(
            "removed vmtrace's breakpoints (at up to {breakpoints} sites); the guest runs on"
        )),
        (_, true) => out.did("removed a breakpoint the guest was frozen at (paused (debug)); it runs again".into()),
        _ => out.did("the guest runs on".into()),
    }
    Ok(stop)
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
    if left_mapped(&stop) == 0 {
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
fn orphan_region(stop: QemuStop<'_>, journaled: bool, out: &mut Repaired) -> Result<(), QemuError> {
    let left = match journaled {
        true => 0,
        false => left_mapped(&stop),
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
    in_stops(guest, false, Some(record), false, &mut out)?.detach()?;
    Ok(out)
}

/// Each journaled site that holds vmtrace's call or jump (a `call` or a
/// direct entry's `jmp` into its code) gets its bytes back; one that holds
/// anything else is not vmtrace's to touch. Without the journal (`r` from
/// the marker, whose sites' bytes are the NOP) a direct entry's first
/// bytes are known only when its stub ran nothing in their place (it
/// displaced the ftrace NOP): the others stay, and their count is returned.
fn restore_sites(
    stop: &QemuStop<'_>,
    r: &JournalRecord,
    out: &mut Repaired,
) -> Result<usize, QemuError> {
    let ram = stop.ram();
    // (`Journal::from_marker` knows no start time of QEMU's.)
    let from_marker = r.qemu_start == 0;
    let mut space = crate::session::kernel_space(stop.vcpu_spaces(), &[CODE_VA]);
    let (mut restored, mut as_found, mut other, mut stuck) = (0, 0, Vec::new(), 0);
    for s in &r.sites {
        let Some(original) = unhex(&s.original).filter(|o| o.len() == 5) else {
            other.push(s.va);
            continue;
        };
        let mut now = [0u8; 5];
        ram.read_slice(&mut now, GuestAddress(s.gpa))
            .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
        let known = match into_code(s.va, &now) {
            Some((JMP, stub)) if from_marker => space
                .as_mut()
                .is_some_and(|sp| stub_runs_nothing(sp, s.va, stub)),
            _ => true,
        };
        if now[..] == original[..] {
            as_found += 1;
        } else if !known {
            stuck += 1;
        } else if into_code(s.va, &now).is_some() {
            ram.write_slice(&original, GuestAddress(s.gpa))
                .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
            restored += 1;
        } else {
            other.push(s.va);
        }
    }
    out.did(format!(
        "{restored} sites restored ({as_found} of {} were as found)",
        r.sites.len()
    ));
    if !other.is_empty() {
        out.failed(format!(
            "{} sites hold neither their bytes nor vmtrace's call, left as they are (first at {:#x})",
            other.len(),
            other[0]
        ));
    }
    Ok(stuck)
}

/// If `bytes` at `va` are vmtrace's `call` or `jmp` into its code: the
/// opcode and the target.
fn into_code(va: u64, bytes: &[u8; 5]) -> Option<(u8, u64)> {
    let rel = i32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    let target = va.wrapping_add(5).wrapping_add_signed(rel.into());
    ((bytes[0] == CALL || bytes[0] == JMP) && (CODE_VA..CODE_VA + CODE_LEN).contains(&target))
        .then_some((bytes[0], target))
}

/// Does the direct stub at `stub` of the site at `va` only record and jump
/// back (`jmp va + 5` after its head): the site held the ftrace NOP?
fn stub_runs_nothing(space: &mut vmm::gva::AddressSpace<'_>, va: u64, stub: u64) -> bool {
    let Ok(back) = space.read_array::<5>(stub + STUB_HEAD) else {
        return false;
    };
    into_target(stub + STUB_HEAD, &back) == Some(va + 5)
}

/// The target of a `jmp rel32` at `va`.
fn into_target(va: u64, bytes: &[u8; 5]) -> Option<u64> {
    let rel = i32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    (bytes[0] == JMP).then(|| va.wrapping_add(5).wrapping_add_signed(rel.into()))
}

/// Stop until no vCPU runs in vmtrace's code and no hooked call has yet
/// to return through it, then (in that stop, returned) clear its entries
/// and give its pages back. The region stays when that never happens.
fn region_stop<'g>(
    guest: &'g QemuGuest,
    r: &JournalRecord,
    out: &mut Repaired,
) -> Result<QemuStop<'g>, QemuError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        std::thread::sleep(GRACE);
        let stop = guest.stop(false)?;
        match busy(&stop) {
            Some(_) if attempt < ATTEMPTS => {
                stop.resume()?;
                continue;
            }
            Some(why) => {
                out.failed(format!(
                    "vmtrace's code and rings left mapped: {why}; run vmtrace detach again later"
                ));
                return Ok(stop);
            }
            None => {
                take_region_out(&stop, r, out)?;
                return Ok(stop);
            }
        }
    }
}

/// Why the region cannot go at this stop, if it cannot.
fn busy(stop: &QemuStop<'_>) -> Option<String> {
    for cpu in 0..stop.cpus() {
        let rip = stop.snapshot(cpu)?.regs.rip;
        if (CODE_VA..CODE_VA + CODE_LEN).contains(&rip) {
            return Some(format!("vCPU {cpu} runs in it (at {rip:#x})"));
        }
    }
    let mut space = crate::session::kernel_space(stop.vcpu_spaces(), &[])?;
    let mut pool = vec![0u8; (FRAMES * FRAME_LEN) as usize];
    // No frame pool mapped: no function graph.
    space.read(DATA_VA + FRAMES_OFF, &mut pool).ok()?;
    let busy = FRAME_BUSY as usize..FRAME_BUSY as usize + 4;
    let live = pool
        .chunks_exact(FRAME_LEN as usize)
        .filter(|f| f[busy.clone()] != [0; 4])
        .count();
    (live > 0).then(|| format!("{live} hooked calls have not returned, and return through it"))
}

/// vmtrace's region entries of a vmtrace whose journal is gone: those of
/// 508-510 that point at a table in the low MiB its pages come from, as
/// vmtrace writes them.
fn left_mapped(stop: &QemuStop<'_>) -> usize {
    let Some(space) = crate::session::kernel_space(stop.vcpu_spaces(), &[]) else {
        return 0;
    };
    (0..PD_COUNT as u64)
        .filter_map(|i| space.entry(CODE_VA + i * LARGE_PAGE, Level::Pd).ok())
        .filter(|e| {
            e.value & !ACCESSED_DIRTY & !ADDR_MASK == TABLE && e.value & ADDR_MASK < LOW_MIB
        })
        .count()
}

/// Clear the page-directory entries that point at one of vmtrace's pages
/// as vmtrace wrote them, then give every page its bytes back.
fn take_region_out(
    stop: &QemuStop<'_>,
    r: &JournalRecord,
    out: &mut Repaired,
) -> Result<(), QemuError> {
    let pages: Vec<(u64, Vec<u8>)> = r
        .pages
        .iter()
        .filter_map(|p| Some((p.gpa, unhex(&p.original)?)))
        .filter(|(_, b)| b.len() == PAGE as usize)
        .collect();
    let ours = |v: u64| {
        v & !ACCESSED_DIRTY & !ADDR_MASK == TABLE && r.pages.iter().any(|p| p.gpa == v & ADDR_MASK)
    };
    let mut cleared = 0;
    if let Some(mut space) = crate::session::kernel_space(stop.vcpu_spaces(), &[]) {
        cleared = clear_entries(&mut space, ours)?;
    }
    let ram = stop.ram();
    let mut given = 0;
    for (gpa, was) in &pages {
        let mut now = vec![0u8; was.len()];
        ram.read_slice(&mut now, GuestAddress(*gpa))
            .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
        if now != *was {
            ram.write_slice(was, GuestAddress(*gpa))
                .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
            given += 1;
        }
    }
    out.did(format!(
        "{cleared} page-directory entries cleared, {given} of the guest's {} unused low pages given their bytes back",
        r.pages.len()
    ));
    let unknown = r.pages.len() - pages.len();
    if unknown > 0 {
        out.failed(format!(
            "{unknown} of the guest's unused low pages may hold what vmtrace wrote: what they held \
             before is in its journal only (the guest does not use them)"
        ));
    }
    Ok(())
}

/// Clear each of the region's entries `ours` accepts; returns how many.
fn clear_entries(
    space: &mut AddressSpace<'_>,
    ours: impl Fn(u64) -> bool,
) -> Result<usize, QemuError> {
    let mut cleared = 0;
    for i in 0..PD_COUNT as u64 {
        let va = CODE_VA + i * LARGE_PAGE;
        let Ok(e) = space.entry(va, Level::Pd) else {
            continue;
        };
        if !e.is_empty() && ours(e.value) {
            space
                .set_entry(&e, 0)
                .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
            cleared += 1;
        }
    }
    Ok(cleared)
}

#[cfg(test)]
mod tests {
    use super::*;

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
