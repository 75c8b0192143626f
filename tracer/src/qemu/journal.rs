//! vmtrace's journal of what it changes in a QEMU, on the host: written
//! and fsynced before each change to the guest, removed once everything
//! is given back. A vmtrace that dies (SIGKILL, OOM, a panic) leaves it
//! behind, and `vmtrace detach` (`super::repair`) undoes what it says;
//! the next `vmtrace attach` refuses while it is there.
//!
//! One file per QEMU process, named by its pid and start time (a pid
//! reused by another QEMU is another name): `qemu-PID-START.json`, mode
//! 0600, in a 0700 directory of the user's (`dir`). It holds what only the
//! host knows: each free guest page's bytes before vmtrace wrote to it,
//! each site's address and original bytes, and which stub vmtrace used.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vm_memory::GuestAddress;
use vmm::GuestRam;

use super::ivshmem::SharedNames;
use super::marker::Marker;
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::sites::NOP5;
use crate::plan::exitless::layout::PAGE;
use crate::session::region::TaskScan;

/// The journal's format; a file of another version is said, not guessed.
pub const VERSION: u32 = 1;
/// Overrides where journals go (tests, or a host whose runtime directory
/// is not shared between the attach and the repair).
pub const DIR_ENV: &str = "VMTRACE_JOURNAL_DIR";

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("cannot write vmtrace's journal {path}: {source}; nothing was changed in the guest")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read what vmtrace is about to change, for its journal: {0}; nothing was changed in the guest")]
    Guest(String),
    #[error(
        "cannot read vmtrace's journal {path}: {why}; remove it if no vmtrace runs on this QEMU"
    )]
    Read { path: PathBuf, why: String },
}

/// How calls reached vmtrace, once decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Armed {
    /// Not yet decided: only the stub may have been opened.
    Connecting,
    Trap,
    Exitless,
}

/// A site vmtrace may patch: its running address, where its bytes are
/// in guest memory, and what they were (hex).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournaledSite {
    pub va: u64,
    pub gpa: u64,
    pub original: String,
    /// A site straddling two pages (module text is mapped page by page):
    /// where its bytes past `gpa`'s page are (`super::site_span`). Absent
    /// for a site in one page, and from journals written before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<u64>,
}

/// One call site vmtrace enables: its running address, where its bytes
/// are in guest memory, and the NOP and jump (hex) it holds before and
/// while vmtrace traces.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournaledJump {
    pub va: u64,
    pub gpa: u64,
    pub nop: String,
    pub jump: String,
    /// Where its static key's `enabled` count is: a site whose key the
    /// guest has enabled since holds the guest's own jump, and is left
    /// alone. (0: not known.)
    #[serde(default)]
    pub key_gpa: u64,
    /// The module whose text it is in, as loaded when it was written
    /// (None: the kernel image's): the repair writes it back only while
    /// that module is loaded (`super::event_modules`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<crate::kernel::module_walk::ModuleId>,
}

/// A free guest page vmtrace may write to, and its bytes before (hex).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournaledPage {
    pub gpa: u64,
    pub original: String,
}

/// What one `vmtrace attach` may have changed in one QEMU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalRecord {
    pub version: u32,
    pub vmtrace_pid: u32,
    /// /proc/PID/stat's start time: a reused pid is another process.
    pub vmtrace_start: u64,
    pub qemu_pid: u32,
    pub qemu_start: u64,
    pub qmp: PathBuf,
    /// The stub the user gave (`--gdb`): the repair uses it and leaves it
    /// open. None: vmtrace opened its own through QMP.
    pub stub_given: Option<String>,
    pub armed: Armed,
    /// Trap mode: the breakpoints' addresses.
    pub breakpoints: Vec<u64>,
    /// Exitless mode: every site it may patch.
    pub sites: Vec<JournaledSite>,
    /// Exitless mode: every free page it may write.
    pub pages: Vec<JournaledPage>,
    /// Exitless mode on a kernel that preempts tasks in kernel mode: how
    /// the repair walks its tasks, to keep vmtrace's code while a task
    /// switched out inside it would return there. (Absent from journals
    /// written before it, and from the guest's marker.)
    #[serde(default)]
    pub tasks: Option<TaskScan>,
    /// Events' call sites vmtrace made jumps (any mode; absent from
    /// journals written before events were traced).
    #[serde(default)]
    pub jumps: Vec<JournaledJump>,
    /// The ring device and its backend and file (`super::ivshmem`),
    /// written before they are added: the repair takes them out.
    #[serde(default)]
    pub shared: Option<SharedNames>,
}

/// A journal on disk.
#[derive(Debug)]
pub struct Journal {
    pub path: PathBuf,
    pub record: JournalRecord,
}

/// Where journals go: `$VMTRACE_JOURNAL_DIR`, else
/// `$XDG_RUNTIME_DIR/vmtrace`, else `/run/vmtrace` for root, else
/// `$TMPDIR/vmtrace-UID`. Runtime directories are the place: a journal
/// means nothing after the host reboots (its QEMUs are gone).
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os(DIR_ENV) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("vmtrace");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    match uid {
        0 => PathBuf::from("/run/vmtrace"),
        _ => std::env::temp_dir().join(format!("vmtrace-{uid}")),
    }
}

/// A process's start time (clock ticks after boot, /proc/PID/stat field
/// 22), None when it is gone.
pub fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|(_, start)| start)
}

/// A process's state letter (field 3) and start time (field 22).
fn stat(pid: u32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields count from
    // after its last ')', which ends field 2.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.nth(18)?.parse().ok()?))
}

/// Does the process `pid` started at `start` still run? A zombie (killed,
/// not yet reaped by its parent) does not: its files are closed.
pub fn runs(pid: u32, start: u64) -> bool {
    stat(pid).is_some_and(|(state, s)| s == start && !matches!(state, 'Z' | 'X'))
}

/// Has the process `pid` exited (gone, or a zombie)? Its files are closed
/// a moment before it becomes a zombie (the kernel's do_exit closes them
/// before exit_notify), so a pipe's EOF alone does not tell.
pub fn exited(pid: u32) -> bool {
    stat(pid).is_none_or(|(state, _)| matches!(state, 'Z' | 'X'))
}

/// Does another process than the one `pid` started at `start` have that
/// pid now (pids wrap)?
pub fn pid_reused(pid: u32, start: u64) -> bool {
    stat(pid).is_some_and(|(state, s)| s != start && !matches!(state, 'Z' | 'X'))
}

/// Remove the journals of QEMUs that are gone (nothing left to repair in
/// them), and the ring files they name, so that the directory holds only
/// what may matter.
fn forget_gone() {
    let Ok(entries) = fs::read_dir(dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some((pid, start)) = name
            .to_str()
            .and_then(|n| n.strip_prefix("qemu-")?.strip_suffix(".json"))
            .and_then(|n| n.split_once('-'))
            .and_then(|(p, s)| Some((p.parse::<u32>().ok()?, s.parse::<u64>().ok()?)))
        else {
            continue;
        };
        if start_time(pid) != Some(start) {
            // Its ring device's file too: the QEMU that mapped it is gone.
            let record = fs::read_to_string(e.path())
                .ok()
                .and_then(|t| serde_json::from_str::<JournalRecord>(&t).ok());
            if let Some(shared) = record.and_then(|r| r.shared) {
                let _ = fs::remove_file(shared.path);
            }
            let _ = fs::remove_file(e.path());
        }
    }
}

/// The journal of the QEMU with `pid`, started at `start`.
pub fn path_for(pid: u32, start: u64) -> PathBuf {
    dir().join(format!("qemu-{pid}-{start}.json"))
}

/// The stop mark's extension, in place of the journal's `json`.
const STOP_MARK_EXT: &str = "stopped";

/// The stop mark (`Journal::stop_mark`) of an attach to the QEMU `pid`,
/// whether or not its journal is still there.
pub fn stop_mark_of(pid: u32) -> PathBuf {
    path_for(pid, start_time(pid).unwrap_or(0)).with_extension(STOP_MARK_EXT)
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `hex`'s bytes back (None: not hex).
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The kernel image's mapping (`KERNEL_IMAGE_SIZE`): modules are above.
const IMAGE_MAP: u64 = 1 << 30;

impl Journal {
    /// A journal for the QEMU `qemu_pid` reached at `qmp`, written before
    /// anything of the guest's is touched (the stub not yet opened).
    pub fn begin(
        qemu_pid: u32,
        qmp: &Path,
        stub_given: Option<String>,
    ) -> Result<Journal, JournalError> {
        let me = std::process::id();
        let qemu_start = start_time(qemu_pid).unwrap_or(0);
        let journal = Journal {
            path: path_for(qemu_pid, qemu_start),
            record: JournalRecord {
                version: VERSION,
                vmtrace_pid: me,
                vmtrace_start: start_time(me).unwrap_or(0),
                qemu_pid,
                qemu_start,
                qmp: qmp.to_owned(),
                stub_given,
                armed: Armed::Connecting,
                breakpoints: Vec::new(),
                sites: Vec::new(),
                pages: Vec::new(),
                tasks: None,
                jumps: Vec::new(),
                shared: None,
            },
        };
        journal.save()?;
        forget_gone();
        Ok(journal)
    }

    /// The journal a vmtrace left for the QEMU `qemu_pid`, if any.
    pub fn find(qemu_pid: u32) -> Result<Option<Journal>, JournalError> {
        let path = path_for(qemu_pid, start_time(qemu_pid).unwrap_or(0));
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(JournalError::Read {
                    path,
                    why: e.to_string(),
                })
            }
        };
        let record: JournalRecord =
            serde_json::from_str(&text).map_err(|e| JournalError::Read {
                path: path.clone(),
                why: e.to_string(),
            })?;
        if record.version != VERSION {
            return Err(JournalError::Read {
                path,
                why: format!(
                    "format version {} (this vmtrace reads {VERSION})",
                    record.version
                ),
            });
        }
        Ok(Some(Journal { path, record }))
    }

    /// Is the vmtrace that wrote it still running (then it is not a
    /// leftover: that vmtrace will detach)?
    pub fn writer_alive(&self) -> bool {
        let r = &self.record;
        r.vmtrace_pid != std::process::id() && runs(r.vmtrace_pid, r.vmtrace_start)
    }

    /// Write the record, durably: a temporary file fsynced, renamed over
    /// the journal, the directory fsynced. A crash at any point leaves the
    /// old record or the new one.
    pub fn save(&self) -> Result<(), JournalError> {
        let err = |source| JournalError::Write {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
        let tmp = self.path.with_extension("json.tmp");
        let text = serde_json::to_vec(&self.record).map_err(|e| err(e.into()))?;
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(err)?;
        f.write_all(&text).map_err(err)?;
        f.sync_all().map_err(err)?;
        fs::rename(&tmp, &self.path).map_err(err)?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(err)?;
        Ok(())
    }

    /// The ring device about to be added (None: taken out again).
    pub fn set_shared(&mut self, shared: Option<SharedNames>) -> Result<(), JournalError> {
        self.record.shared = shared;
        self.save()
    }

    /// Trap mode, about to set breakpoints at `sites` (running addresses).
    pub fn arm_trap(&mut self, sites: Vec<u64>) -> Result<(), JournalError> {
        self.record.armed = Armed::Trap;
        self.record.breakpoints = sites;
        self.save()
    }

    /// About to make the events' call sites `jumps` jumps.
    pub fn arm_jumps(&mut self, jumps: Vec<JournaledJump>) -> Result<(), JournalError> {
        self.record.jumps = jumps;
        self.save()
    }

    /// Trap mode's function graph: the journal's writer from here on, for
    /// the return breakpoints set while tracing (`ReturnJournal::add`).
    /// This journal is not saved again (only removed at the end).
    pub fn for_returns(&self) -> ReturnJournal {
        ReturnJournal {
            journal: Journal {
                path: self.path.clone(),
                record: self.record.clone(),
            },
            named: self.record.breakpoints.iter().copied().collect(),
        }
    }

    /// Exitless mode, about to write into the free `pages` and patch
    /// `sites` ((running address, guest-physical address, that of its
    /// bytes past the first page if it straddles two) each): what they
    /// hold now, read from `ram` while the guest runs.
    pub fn arm_exitless(
        &mut self,
        ram: &dyn GuestRam,
        pages: &[u64],
        sites: &[(u64, u64, Option<u64>)],
        tasks: Option<TaskScan>,
    ) -> Result<(), JournalError> {
        self.record.tasks = tasks;
        let read = |gpa: u64, len: usize| {
            let mut b = vec![0u8; len];
            ram.read_slice(&mut b, GuestAddress(gpa))
                .map(|()| hex(&b))
                .map_err(|e| JournalError::Guest(e.to_string()))
        };
        self.record.pages = pages
            .iter()
            .map(|&gpa| {
                Ok(JournaledPage {
                    gpa,
                    original: read(gpa, PAGE as usize)?,
                })
            })
            .collect::<Result<_, JournalError>>()?;
        self.record.sites = sites
            .iter()
            .map(|&(va, gpa, tail)| {
                let mut site = JournaledSite {
                    va,
                    gpa,
                    original: String::new(),
                    tail,
                };
                let bytes = site.read(ram).map_err(JournalError::Guest)?;
                site.original = hex(&bytes);
                Ok(site)
            })
            .collect::<Result<_, JournalError>>()?;
        self.record.armed = Armed::Exitless;
        self.save()
    }

    /// What the guest's marker says of this attach (`super::marker`).
    pub fn marker(&self, offset: KernelOffset) -> Marker {
        let r = &self.record;
        let in_image =
            |va: &u64| vmm::layout::kernel_virt_to_phys(*va).is_some_and(|p| p < IMAGE_MAP);
        // The image's sites apart: the marker finds their pages by the
        // image's linear mapping, which a module's text is not in
        // (`super::modules`); a module's are found through the page tables.
        let (sites, module_sites) = r.sites.iter().map(|s| s.va).partition(in_image);
        Marker {
            vmtrace_pid: r.vmtrace_pid,
            vmtrace_start: r.vmtrace_start,
            qemu_pid: r.qemu_pid,
            offset,
            pages: r.pages.iter().map(|p| p.gpa).collect(),
            sites,
            module_sites,
            truncated: false,
            efi_root: r.shared.as_ref().and_then(|s| s.efi).map(|e| e.root),
        }
    }

    /// The record a repair works from when only the guest's marker is
    /// left: the sites' bytes are the kernel's NOP (vmtrace patches no
    /// other), the pages' bytes unknown (""). The modules' sites are not
    /// in it: the repair locates them in its stop (`Marker::module_sites`).
    pub fn from_marker(m: &Marker) -> JournalRecord {
        JournalRecord {
            version: VERSION,
            vmtrace_pid: m.vmtrace_pid,
            vmtrace_start: m.vmtrace_start,
            qemu_pid: m.qemu_pid,
            qemu_start: 0,
            qmp: PathBuf::new(),
            stub_given: None,
            armed: Armed::Exitless,
            breakpoints: Vec::new(),
            sites: m
                .sites
                .iter()
                .filter_map(|&va| {
                    Some(JournaledSite {
                        va,
                        gpa: m.site_gpa(va)?,
                        original: hex(&NOP5),
                        // (The image's linear mapping: one run.)
                        tail: None,
                    })
                })
                .collect(),
            pages: m
                .pages
                .iter()
                .map(|&gpa| JournaledPage {
                    gpa,
                    original: String::new(),
                })
                .collect(),
            tasks: None,
            jumps: Vec::new(),
            shared: None,
        }
    }

    /// Everything is given back: the journal goes.
    pub fn remove(self) {
        let _ = fs::remove_file(self.stop_mark());
        let _ = fs::remove_file(&self.path);
    }

    /// Where the attach marks its own stops of the VM
    /// (`super::guest::StopMark`): beside the journal.
    pub fn stop_mark(&self) -> PathBuf {
        self.path.with_extension(STOP_MARK_EXT)
    }
}

/// The journal of a trap-mode attach with the function graph: each
/// return address a breakpoint is set at is named before it is set, once
/// (a repair takes out breakpoints that are no longer set as no error).
#[derive(Debug)]
pub struct ReturnJournal {
    journal: Journal,
    named: std::collections::HashSet<u64>,
}

impl ReturnJournal {
    /// Name `addr` among the breakpoints, durably, unless already named.
    pub fn add(&mut self, addr: u64) -> Result<(), JournalError> {
        if self.named.insert(addr) {
            self.journal.record.breakpoints.push(addr);
            self.journal.save()?;
        }
        Ok(())
    }

    /// The events' call sites made jumps since this writer was made: kept
    /// in each later save.
    pub fn name_jumps(&mut self, jumps: &[JournaledJump]) {
        self.journal.record.jumps = jumps.to_vec();
    }

    /// The event sites it names (a module going away takes its own out:
    /// `super::event_sites::release`), saved by `save`.
    pub fn jumps(&mut self) -> &mut Vec<JournaledJump> {
        &mut self.journal.record.jumps
    }

    pub fn save(&mut self) -> Result<(), JournalError> {
        self.journal.save()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_what_is_not_hex() {
        assert_eq!(hex(&[0x0f, 0x1f, 0x44, 0, 0]), "0f1f440000");
        assert_eq!(unhex("0f1f440000"), Some(vec![0x0f, 0x1f, 0x44, 0, 0]));
        assert_eq!(unhex("0f1"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn a_process_has_one_start_time_and_a_gone_one_none() {
        let me = start_time(std::process::id()).unwrap();
        assert!(me > 0);
        assert_eq!(start_time(std::process::id()), Some(me));
        assert_eq!(start_time(u32::MAX), None);
        assert!(runs(std::process::id(), me));
        assert!(!runs(std::process::id(), me + 1));
    }

    #[test]
    fn a_killed_process_not_yet_reaped_does_not_run() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = start_time(pid).unwrap();
        assert!(runs(pid, start));
        child.kill().unwrap();
        // A zombie until waited for: /proc still lists it.
        while stat(pid).is_some_and(|(state, _)| state != 'Z') {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(start_time(pid), Some(start));
        assert!(!runs(pid, start));
        child.wait().unwrap();
    }

    #[test]
    fn a_journal_is_private_durable_and_found_again() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = std::env::temp_dir().join(format!("vmtrace-journal-test-{}", std::process::id()));
        std::env::set_var(DIR_ENV, &tmp);
        // This process stands in for the QEMU.
        let qemu = std::process::id();
        // A gone QEMU's journal goes at the next begin.
        fs::DirBuilder::new().mode(0o700).create(&tmp).unwrap();
        let gone = path_for(u32::MAX, 1);
        fs::write(&gone, "{}").unwrap();
        // One whose ring device stayed (its VM stopped) names the file.
        let ring = tmp.join("ring");
        fs::write(&ring, "").unwrap();
        let mut left = Journal::begin(qemu, Path::new("/q.sock"), None).unwrap();
        left.record.shared = Some(SharedNames {
            path: ring.clone(),
            ..SharedNames::new(7, u32::MAX, 4 << 20)
        });
        let left_gone = path_for(u32::MAX, 2);
        fs::write(&left_gone, serde_json::to_string(&left.record).unwrap()).unwrap();
        left.remove();
        let mut j = Journal::begin(qemu, Path::new("/q.sock"), None).unwrap();
        assert!(!gone.exists());
        assert!(!left_gone.exists() && !ring.exists());
        j.record.armed = Armed::Trap;
        j.record.breakpoints = vec![0xffff_ffff_8100_0000];
        j.save().unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&j.path), 0o600);
        assert_eq!(mode(&tmp), 0o700);
        let found = Journal::find(qemu).unwrap().unwrap();
        assert_eq!(found.record, j.record);
        // The ring device, named before it is added, is found again; a
        // journal written before the field was there has none.
        let names = SharedNames::new(7, qemu, 4 << 20);
        j.set_shared(Some(names.clone())).unwrap();
        let found = Journal::find(qemu).unwrap().unwrap();
        assert_eq!(found.record.shared, Some(names));
        let mut old = serde_json::to_value(&found.record).unwrap();
        old.as_object_mut().unwrap().remove("shared");
        let old: JournalRecord = serde_json::from_value(old).unwrap();
        assert_eq!(old.shared, None);
        j.set_shared(None).unwrap();
        // Written by this very process: not another vmtrace still running.
        assert!(!found.writer_alive());
        // Trap mode's graph: each return address named once, durably.
        let mut returns = j.for_returns();
        for a in [
            0xffff_ffff_8100_1234,
            0xffff_ffff_8100_0000,
            0xffff_ffff_8100_1234,
        ] {
            returns.add(a).unwrap();
        }
        let found = Journal::find(qemu).unwrap().unwrap();
        assert_eq!(
            found.record.breakpoints,
            [0xffff_ffff_8100_0000, 0xffff_ffff_8100_1234]
        );
        j.remove();
        assert!(Journal::find(qemu).unwrap().is_none());
        let _ = fs::remove_dir_all(&tmp);
    }
}
