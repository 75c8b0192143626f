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
