//! `-e` of a module's event (issues 37 and 38): vmt_test's
//! `vmt_test:vmt_event (k, i)`, fired once before each of a batch's K
//! `vmt_hit` calls (guest/linux/vmt_test/vmt_test_trace.h), traced from
//! the host as an event of the kernel image is: the module's own
//! `__jump_table` entries of its key made jumps, its fields by the
//! module's own BTF and its event's format read from the guest's memory.

use super::common::attach::*;
use super::common::console::assert_no_complaint;
use super::common::guard::*;
use super::common::qemu::*;
use super::common::{self, s};
use super::{command, Modules};
use tracer::kernel::events::jump_sites::{NOP2, NOP5};
use tracer::kernel::modules::LoadedModule;

/// The event, as ftrace names it.
const EVENT: &str = "vmt_test:vmt_event";

/// The module's text as it is now, and the module.
fn text_now(modules: &Modules) -> (LoadedModule, Vec<u8>) {
    let (list, mut space) = modules.read();
    let m = list
        .into_iter()
        .find(|m| m.name == "vmt_test")
        .expect("loaded");
    let mut b = vec![0u8; (m.text.end - m.text.start) as usize];
    space.read(m.text.start, &mut b).unwrap();
    (m, b)
}

/// The JSON report's records of the event, each one's `(k, i)`.
fn event_fields(doc: &serde_json::Value) -> Vec<(u64, u64)> {
    let events = doc["trace_events"].as_array().expect("trace_events");
    let Some(e) = events.iter().find(|e| e["event"] == EVENT) else {
        return Vec::new();
    };
    let records = e["records"].as_array().unwrap();
    assert_eq!(e["count"].as_u64(), Some(records.len() as u64), "{e}");
    let field = |r: &serde_json::Value, n: &str| r["fields"][n].as_u64().expect(n);
    records
        .iter()
        .map(|r| (field(r, "k"), field(r, "i")))
        .collect()
}

/// Each of the module's jump label sites holds one of the kernel's NOPs
/// (no key of its is enabled).
fn assert_labels_nops(modules: &Modules, when: &str) {
    let (list, mut space) = modules.read();
    let m = list.iter().find(|m| m.name == "vmt_test").expect("loaded");
    assert!(!m.tables.jumps.is_empty(), "{when}: {m:?}");
    for &(code, _) in &m.tables.jumps {
        let mut b = [0u8; 5];
        space.read(code, &mut b).unwrap();
        assert!(b == NOP5 || b[..2] == NOP2, "{when}: {code:#x}: {b:02x?}");
    }
}

/// `-e vmt_test:vmt_event` in trap and exitless attaches: exactly K
/// events per `vmt K`, their `k` K and their `i` 0 to K-1 in order, the
/// module's text byte-identical after the detach; the trap trace's
/// trace.dat read by `trace-cmd report` with the fields; an unknown
/// module event refused with the closest names; and unloaded and loaded
/// again during a trace in each mode: its sites given back at the unload
/// (said), its text's labels NOPs, its events untraced after the load.
pub(super) fn module_event_traced(
    guest: &QemuGuest,
    bz: &std::path::Path,
    worker: u32,
    modules: &Modules,
) {
    let dir = common::scratch_in("modevent", "data");
    let (_, before) = text_now(modules);
    // Trap mode names it by its module (`:mod:`, as `--trace` globs do).
    for (mode, k, glob) in [("trap", 4u64, "vmt_*:mod:vmt_test"), ("exitless", 6, EVENT)] {
        let data = dir.join(format!("{mode}.vmtrace"));
        let args = [
            "--kernel",
            s(bz),
            "--format",
            "json",
            "-e",
            glob,
            "--mode",
            mode,
            "-o",
            s(&data),
        ];
        let mut a = Attach::start(guest.qmp_socket(), &args);
        let line = a.wait_line("vmtrace: attached to QEMU");
        assert!(line.contains(mode), "{line}");
        command(guest, &format!("vmt {k}"), &format!("vmt {k}"), worker);
        a.signal(libc::SIGINT);
        let e = a.end();
        assert!(e.status.success(), "{mode}: {}: {}", e.status, e.stderr);
        let want: Vec<(u64, u64)> = (0..k).map(|i| (k, i)).collect();
        assert_eq!(event_fields(&e.json()), want, "{mode}: {}", e.stdout);
        assert_eq!(
            text_now(modules).1,
            before,
            "{mode}: the module's text after"
        );
        assert_no_gdbstub(guest.qmp_socket());
        if mode == "trap" {
            trace_cmd_shows_fields(&data, k);
        }
    }

    // A name no event has: the closest, the module's among them.
    let o = common::vmtrace(&[
        "attach",
        "--qmp",
        s(guest.qmp_socket()),
        "--kernel",
        s(bz),
        "-e",
        "vmt_test:vmt_evnt",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
    let err = common::stderr(&o);
    assert!(err.contains("closest: vmt_test:vmt_event"), "{err}");

    for mode in ["trap", "exitless"] {
        unload_during(guest, bz, worker, modules, mode);
    }
    for mode in ["trap", "exitless"] {
        killed_after_a_reload(guest, bz, worker, modules, mode);
    }
    assert_no_complaint(&guest.console(), &BAD, "");
}

/// `-e` naming the events of a module not loaded (`:mod:`): refused in
/// one line, exit status 2, before the guest is touched (no gdbstub
/// left): a module first loaded during the trace gets its functions
/// traced, not yet its events.
pub(super) fn waiting_refused(guest: &QemuGuest, bz: &std::path::Path) {
    let o = common::vmtrace(&[
        "attach",
        "--qmp",
        s(guest.qmp_socket()),
        "--kernel",
        s(bz),
        "-e",
        "vmt_test:*:mod:vmt_test",
    ]);
    let err = common::stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(
        err.lines().last(),
        Some(
            "vmtrace: -e 'vmt_test:*:mod:vmt_test': no such module loaded yet, and the events \
             of a module the guest loads during the trace are not traced yet (its functions \
             are: --trace 'GLOB:mod:MODULE'); load the module before the attach"
        ),
        "{err}"
    );
    assert_no_gdbstub(guest.qmp_socket());
}

/// trace.dat of `data` read by Debian's `trace-cmd report -N`: one
/// `vmt_event: k=K i=I` line per event, in order.
fn trace_cmd_shows_fields(data: &std::path::Path, k: u64) {
    let dat = data.with_extension("dat");
    let arg = format!("trace.dat={}", dat.display());
    let o = common::vmtrace(&["report", s(data), "--export", &arg]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let tc = std::process::Command::new("trace-cmd")
        .args(["report", "-N", "-i"])
        .arg(&dat)
        .output()
        .expect("trace-cmd is not installed: apt-get install trace-cmd (CI's .ci/run does)");
    let out = String::from_utf8_lossy(&tc.stdout);
    assert!(
        tc.status.success(),
        "{}",
        String::from_utf8_lossy(&tc.stderr)
    );
    let lines: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once(" vmt_event: ").map(|(_, f)| f.trim()))
        .collect();
    let want: Vec<String> = (0..k).map(|i| format!("k={k} i={i}")).collect();
    assert_eq!(lines, want, "{out}");
}

/// `vmtcycles 2 K` during a trace of the event and vmt_hit in `mode`: the
/// K events of each batch (the module as the attach found it, then
/// loaded again), every vmt_hit call; the detach says the module's event
/// sites were given back at its unloads and its event traced again at
/// both loads; its labels and ftrace sites NOPs after, its functions and
/// labels where the attach found them.
fn unload_during(
    guest: &QemuGuest,
    bz: &std::path::Path,
    worker: u32,
    modules: &Modules,
    mode: &str,
) {
    const K: u64 = 3;
    let (at_attach, before) = text_now(modules);
    let args = [
        "--kernel",
        s(bz),
        "--format",
        "json",
        "-e",
        EVENT,
        "--trace",
        "vmt_hit",
        "--mode",
        mode,
    ];
    let mut a = Attach::start(guest.qmp_socket(), &args);
    a.wait_line("vmtrace: attached to QEMU");
    let line = format!("vmtcycles 2 {K} /vmt_test.ko");
    command(guest, &line, "vmtcycles 2", worker);
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{mode}: {}: {}", e.status, e.stderr);
    // Both batches: the module as the attach found it, and loaded again.
    let want: Vec<(u64, u64)> = (0..2 * K).map(|i| (K, i % K)).collect();
    assert_eq!(event_fields(&e.json()), want, "{mode}: {}", e.stdout);
    assert_eq!(
        e.counts().get("vmt_hit [vmt_test]"),
        Some(&(2 * K)),
        "{}",
        e.stdout
    );
    // At each of the two unloads, trap: the call site; exitless: it and
    // its `tp->funcs` load.
    let sites = if mode == "trap" { 2 } else { 4 };
    let said = format!(
        "{sites} event sites of a traced module given back at its unloads, before its memory \
         was freed; 2 times a traced module's event traced again at its load"
    );
    assert!(e.stderr.contains(&said), "{mode}: {}", e.stderr);
    assert!(!e.stderr.contains("changed by the guest"), "{}", e.stderr);
    assert_no_gdbstub(guest.qmp_socket());
    assert_labels_nops(modules, mode);
    // Its text is not the attach's byte for byte once loaded again (its
    // calls and data references move with it: 6.4+ places text and data
    // apart): its shape is, and each site and label is the kernel's NOP.
    let (now, after) = text_now(modules);
    let shape = |m: &LoadedModule| {
        let f: Vec<_> = (m.functions.iter())
            .map(|f| (&f.name, f.addr - m.text.start, f.size))
            .collect();
        let j: Vec<_> = m.tables.jumps.iter().map(|j| j.0 - m.text.start).collect();
        format!("{f:?} {j:?}")
    };
    assert_eq!(shape(&now), shape(&at_attach), "{mode}");
    assert_eq!(after.len(), before.len(), "{mode}");
    for &site in &now.sites {
        let at = (site - now.text.start) as usize;
        assert_eq!(after[at..at + 5], NOP5, "{mode}: site {site:#x}");
    }
}

/// `-e vmt_test:vmt_event` in `mode`, the module unloaded and loaded again
/// (its event's sites written again at the load, journaled, each naming
/// the module loaded again), then vmtrace and its guardian killed. Trap
/// mode: the journal altered to name another `struct module` at the same
/// text (as if unloaded and loaded again since), the repair leaves the
/// site alone ([`repair_leaves_a_gone_modules_site`]). Exitless mode:
/// `vmtrace detach` gives the reloaded
/// module's event sites back from the journal (trap: its call site;
/// exitless: it and its `tp->funcs` load), leaves no gdbstub, every jump
/// label of the module the kernel's NOP again, and the guest runs on (its
/// calls complete: a jump left to a probe call with no probe, or a
/// load left redirected, would not be the kernel's code).
fn killed_after_a_reload(
    guest: &QemuGuest,
    bz: &std::path::Path,
    worker: u32,
    modules: &Modules,
    mode: &str,
) {
    let args = ["--kernel", s(bz), "-e", EVENT, "--mode", mode];
    let mut a = Attach::start(guest.qmp_socket(), &args);
    a.wait_line("vmtrace: attached to QEMU");
    command(guest, "vmtcycles 1 2 /vmt_test.ko", "vmtcycles 1", worker);
    kill_with_guardian(a);
    let site = journal_names_the_reloaded_module(guest, modules, mode);
    if mode == "trap" {
        repair_leaves_a_gone_modules_site(guest, worker, modules, site);
        return;
    }
    let o = detach(guest.qmp_socket());
    let err = common::stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{mode}: {err}");
    // The attach's site went back at the unload (out of the journal):
    // only the reload's remain, each still vmtrace's.
    let said = "1 event call sites given back their NOP (0 were as found, 0 hold neither";
    assert!(err.contains(said), "{mode}: {err}");
    let loads = err.contains("1 tp->funcs loads given back their address");
    assert_eq!(loads, mode == "exitless", "{mode}: {err}");
    assert_no_gdbstub(guest.qmp_socket());
    assert_labels_nops(modules, mode);
    command(guest, "vmt 3", "vmt 3", worker);
}

/// The journal's event sites (after a kill): each names vmt_test as
/// loaded now (its `struct module`, name and text). Returns the call
/// site (the one whose bytes before were the kernel's NOP).
fn journal_names_the_reloaded_module(guest: &QemuGuest, modules: &Modules, mode: &str) -> u64 {
    let path = super::journal_of(guest);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let jumps = doc["jumps"].as_array().expect("jumps");
    assert_eq!(jumps.len(), if mode == "trap" { 1 } else { 2 }, "{doc}");
    let (now, _) = text_now(modules);
    for j in jumps {
        let m = &j["module"];
        assert_eq!(m["name"], "vmt_test", "{mode}: {j}");
        assert_eq!(m["addr"].as_u64(), Some(now.addr), "{mode}: {j}");
        assert_eq!(m["text"]["start"].as_u64(), Some(now.text.start), "{j}");
        assert_eq!(m["text"]["end"].as_u64(), Some(now.text.end), "{j}");
    }
    let site = jumps
        .iter()
        .find(|j| j["nop"] == "0f1f440000" || j["nop"] == "6690");
    site.and_then(|j| j["va"].as_u64()).expect("a call site")
}

/// The killed trap attach's journal altered to name another `struct
/// module` at the reloaded module's text (a module unloaded and loaded
/// again there since: the page the journal names may be anyone's):
/// `vmtrace detach` leaves the site alone and says so, vmtrace's jump
/// still there, its breakpoints out (no gdbstub left). The module then
/// unloaded and loaded afresh (its labels the kernel's NOPs again).
fn repair_leaves_a_gone_modules_site(guest: &QemuGuest, worker: u32, modules: &Modules, site: u64) {
    let path = super::journal_of(guest);
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let m = &mut doc["jumps"][0]["module"];
    m["addr"] = (m["addr"].as_u64().unwrap() + 0x40).into();
    std::fs::write(&path, doc.to_string()).unwrap();
    let o = detach(guest.qmp_socket());
    let err = common::stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let said = "1 event sites left alone: their module was unloaded since (its memory freed)";
    assert!(err.contains(said), "{err}");
    assert!(
        err.contains("0 event call sites given back their NOP"),
        "{err}"
    );
    assert_no_gdbstub(guest.qmp_socket());
    let (_, mut space) = modules.read();
    let mut b = [0u8; 2];
    space.read(site, &mut b).unwrap();
    // vmtrace's `jmp` (rel32 or rel8), unwritten.
    assert!(b[0] == 0xe9 || b[0] == 0xeb, "{site:#x}: {b:02x?}");
    command(guest, "rmmod vmt_test", "rmmod 0", worker);
    command(guest, "insmod /vmt_test.ko", "insmod 0", worker);
    assert_labels_nops(modules, "loaded afresh");
    command(guest, "vmt 3", "vmt 3", worker);
}
