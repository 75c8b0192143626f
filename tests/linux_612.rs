//! Linux 6.12 on 1 and 4 vCPUs (2 are in linux_612_alone.rs): traced with
//! traps on one, exitless on four, where its CPU number lives in
//! `pcpu_hot` (6.2 and later), which vmtrace's trampoline reads, and every
//! vCPU comes up (ACPI MADT and MP table both offered). Both boots also
//! load the test module N times at boot (`vmt_boot`, docs/guests.md) and
//! trace its functions from each load (issue 37): by `:mod:` with traps,
//! with their stacks through the module's frames (its ORC tables read at
//! each load), their arguments (named by its file's DWARF, `--modules
//! DIR`, the file named in the report's symbols) and the function graph
//! (vmt_batch's calls of vmt_hit nested); by a plain glob exitless, with
//! vmt_hit's stacks (its site trapping at each load). Both trace the
//! kernel's functions by their direct entries. Each boot runs until the
//! guest's init (which cannot run here) panics, after the module's last
//! cycle.

mod common;

use std::sync::Mutex;

use common::*;

/// One Linux guest at a time: two on this 2-core host starve each other.
static ONE_GUEST: Mutex<()> = Mutex::new(());

/// The test module's cycles at boot: N loads (all but the last unloaded),
/// K calls of `vmt_hit` each: two, so that one unload and one load again
/// are seen, and few calls (each a trap in trap mode), for CI's time.
const CYCLES: u64 = 2;
const HITS: u64 = 50;

/// Boot the 6.12 guest traced with `hrtimer_*` in `mode` on `cpus` vCPUs for
/// `duration` seconds after the attach (6.12 boots slowly on the emulating
/// host, as in linux_612_alone.rs), with its initramfs and the test
/// module's cycles, loading its file `ko` in the initramfs; returns the
/// run, its console and stderr.
fn run(
    bz: &std::path::Path,
    vmlinux: &std::path::Path,
    (mode, ko): (&str, &str),
    cpus: &str,
    duration: &str,
    extra: &[&str],
) -> (std::process::Output, String, String) {
    let initrd = bz.with_file_name("initramfs.cpio.gz");
    // The boot's work no check needs skipped (`TEST_BOOT_CMDLINE`: with
    // it, 6.12's initcalls no longer wait behind its weak-function scan).
    let cmdline = format!(
        "{TEST_BOOT_CMDLINE} vmt_boot.ko={ko} vmt_boot.hits={HITS} vmt_boot.cycles={CYCLES}"
    );
    let modules = [
        "--initrd",
        initrd.to_str().unwrap(),
        "--cmdline",
        cmdline.as_str(),
    ];
    let extra = [&modules[..], extra].concat();
    let extra = &extra[..];
    let _one = ONE_GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("vmtrace-612-{mode}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let console = dir.join("console.log");
    let base = [
        "--kernel",
        bz.to_str().unwrap(),
        "--vmlinux",
        vmlinux.to_str().unwrap(),
        "--trace",
        "hrtimer_*",
        "--mode",
        mode,
        "--cpus",
        cpus,
        "--mem",
        "128",
        "--duration",
        duration,
        "--timeout",
        "1800",
        "--console",
        console.to_str().unwrap(),
        "--format",
        "json",
    ];
    let out = vmtrace(&[&base[..], extra].concat());
    let err = stderr(&out);
    let text = std::fs::read_to_string(&console).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(err.contains("vmtrace: attached:"), "{err}\n{text}");
    assert!(
        out.status.code() == Some(0) || out.status.code() == Some(1),
        "{err}"
    );
    assert!(text.contains("Linux version 6.12"), "{text}");
    for bad in ["ftrace bug", "WARNING:", "BUG:", "Oops"] {
        assert!(!text.contains(bad), "the guest said {bad}:\n{text}\n{err}");
    }
    (out, text, err)
}

/// The trace's count of each function named `name` in the JSON report.
fn count(v: &serde_json::Value, name: &str) -> Option<u64> {
    let f = v["functions"]
        .as_array()?
        .iter()
        .find(|f| f["name"] == name)?;
    f["count"].as_u64()
}

/// The module's calls as the guest's console says them, the trace's
/// exactly equal; every load but the last unloaded, said on the stop line.
fn module_traced(v: &serde_json::Value, text: &str, err: &str) {
    let said: u64 = text
        .lines()
        .filter_map(|l| l.split("vmt_boot: cycle ").nth(1))
        .filter_map(|l| l.split(": ").nth(1)?.strip_suffix(" calls of vmt_hit"))
        .map(|k| k.trim().parse::<u64>().unwrap())
        .sum();
    let done = format!("vmt_boot: {CYCLES} of {CYCLES} cycles of {HITS} calls done");
    assert!(text.contains(&done), "{text}");
    assert_eq!(said, CYCLES * HITS, "{text}");
    assert_eq!(count(v, "vmt_hit [vmt_test]"), Some(said), "{v}\n{err}");
    assert_eq!(count(v, "vmt_batch [vmt_test]"), Some(CYCLES), "{v}");
    assert_eq!(v["dropped"].as_u64(), Some(0), "{v}");
    let went = format!(
        "a traced module went away {} times (its sites restored, {} in all, before its memory was freed) and came back {} times (traced again); 1 module first loaded during the trace, traced from its load",
        CYCLES - 1,
        // vmt_batch, vmt_hit and vmt_write: each load's 3 sites.
        3 * (CYCLES - 1),
        CYCLES - 1
    );
    assert!(err.contains(&went), "{err}");
}

#[test]
fn linux_6_12_on_one_vcpu_traced_with_traps() {
    let Some((bz, vmlinux)) = linux_612() else {
        return;
    };
    // Saved too (as `record` saves), then read back by `report` and `script`.
    let data = std::env::temp_dir().join(format!("vmtrace-612-mod-{}.data", std::process::id()));
    // The guest loads the module without its BTF (`/vmt_nobtf.ko`,
    // guest/build.sh): `--modules DIR` gives its prototypes, from the
    // DWARF of its file, found by build id under another name a
    // directory down.
    let nobtf = bz.with_file_name("vmt_nobtf.ko");
    let dir = std::env::temp_dir().join(format!("vmtrace-612-ko-{}", std::process::id()));
    let file = dir.join("extra/renamed.ko");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::copy(&nobtf, &file).unwrap();
    let (out, text, err) = run(
        &bz,
        &vmlinux,
        ("trap", "/vmt_nobtf.ko"),
        "1",
        "1500",
        &[
            "--stack",
            "hrtimer_run_queues,vmt_hit",
            "--args",
            "--trace",
            // (Not `*:mod:`: the module's event functions,
            // `__traceiter_vmt_event` and the like, would add their sites.)
            "vmt_*:mod:vmt_test",
            "--modules",
            dir.to_str().unwrap(),
            "-o",
            data.to_str().unwrap(),
        ]
        .into_iter()
        .chain(TRAP_MODULES)
        .collect::<Vec<_>>(),
    );
    let _ = std::fs::remove_dir_all(&dir);
    trap_modules_checked(&v_of(&out, &err), &err, &data, &file);
    // Said once, at its first load, as `vmtrace attach` says it of a
    // loaded module.
    let id = tracer::kernel::module_build_id::ko_build_id(&nobtf)
        .unwrap()
        .unwrap();
    let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let line = format!(
        "vmtrace: module vmt_test: {} has its build id {id}: taken from it: its prototypes, from its DWARF",
        file.display()
    );
    assert_eq!(err.matches(&line).count(), 1, "{line}\n{err}");
    assert!(text.contains("Brought up 1 node, 1 CPU"), "{text}");
    let v = v_of(&out, &err);
    assert_eq!(v["mode"].as_str(), Some("trap"), "{v}");
    assert!(
        err.contains("'vmt_*:mod:vmt_test': its functions are traced from each load of the module"),
        "{err}"
    );
    module_traced(&v, &text, &err);
    let report = vmtrace(&["report", data.to_str().unwrap(), "--format", "json"]);
    let saved: serde_json::Value = serde_json::from_str(&stdout(&report))
        .unwrap_or_else(|e| panic!("{e}: {}", stderr(&report)));
    assert_eq!(count(&saved, "vmt_hit [vmt_test]"), Some(CYCLES * HITS));
    let script = vmtrace(&["script", data.to_str().unwrap()]);
    let lines = stdout(&script);
    // Its entries (`...: vmt_hit [vmt_test](i=3) <-CALLER`), not the
    // ` => ` lines of a stack (a tick in vmt_hit has its frame), nor its
    // returns (`vmt_hit [vmt_test] returned to vmt_batch [vmt_test]+...`).
    let hits = lines
        .lines()
        .filter(|l| l.contains("vmt_hit [vmt_test]") && !l.contains(" returned to "))
        .filter(|l| !l.starts_with(" => ") && !l.starts_with('#'));
    assert_eq!(hits.count() as u64, CYCLES * HITS, "{}", stderr(&script));
    hit_arguments(&data);
    let _ = std::fs::remove_file(&data);
    // Every traced call was one exit and every return one more (the
    // graph's return trap), and every one is in the counts.
    let events = v["events"].as_u64().unwrap();
    assert!(events > 0, "{v}");
    let returns: u64 = (v["functions"].as_array().unwrap().iter())
        .map(|f| f["returns"].as_u64().unwrap_or_else(|| panic!("{f}")))
        .sum();
    assert_eq!(v["trap_exits"].as_u64(), Some(events + returns), "{v}");
    assert_eq!(
        v["events_stored"].as_u64().unwrap() + v["dropped"].as_u64().unwrap(),
        events
    );
    // 6.12's ORC tables (the 6.4+ entry layout, from its BTF): every
    // stack of hrtimer_run_queues (the tick's) complete, every frame
    // named, and through the local APIC timer interrupt's entry (a tick
    // in the module's code unwinds through its ORC tables, read at its
    // load; one in its init text, freed after the load and not read,
    // would end there, outside the kernel's text).
    let source = v["stacks_source"].as_str().unwrap();
    assert!(source.contains("Linux 6.4+ layout"), "{source}");
    // vmt_hit, a function of the module the guest loads during the trace,
    // has its stacks too: one per call, each from vmt_batch, through the
    // module's own ORC tables, read at each load.
    module_stacks(&v);
    let ticks = stacks_of(&v, "hrtimer_run_queues");
    assert!(ticks.iter().any(|(s, _)| s["complete"] == true), "{v}");
    for (s, f) in &ticks {
        assert!(s["complete"] == true || s["end"] == "not_text", "{s}");
        assert!(f.contains(&"asm_sysvec_apic_timer_interrupt"), "{f:?}");
    }
}

/// The stacks of `function` in the JSON report `v`: each with its calls'
/// count (`count`, beside the stack's own fields) and its frames'
/// function names.
fn stacks_of<'v>(
    v: &'v serde_json::Value,
    function: &str,
) -> Vec<(serde_json::Value, Vec<&'v str>)> {
    let f = v["functions"].as_array().unwrap();
    let f = f.iter().find(|f| f["name"] == function);
    let ids = f.and_then(|f| f["stacks"].as_array());
    let ids = ids.unwrap_or_else(|| panic!("no stacks of {function}: {v}"));
    let stacks = v["stacks"].as_array().unwrap();
    ids.iter()
        .map(|id| {
            let s = &stacks[id["id"].as_u64().unwrap() as usize - 1];
            let names = s["frames"].as_array().unwrap().iter();
            let names = names.map(|f| f["function"].as_str().unwrap_or_else(|| panic!("{s}")));
            let mut s = s.clone();
            s["count"] = id["count"].clone();
            (s, names.collect())
        })
        .collect()
}

/// What the trap boot adds to its run (issue 37): the function graph,
/// and the kernel's functions by their direct entries (the module's by
/// their ftrace sites, the loader's traps on its notifier's).
const TRAP_MODULES: [&str; 3] = ["--graph", "--entry", "direct"];

/// The run's JSON report.
fn v_of(out: &std::process::Output, err: &str) -> serde_json::Value {
    serde_json::from_str(&stdout(out)).unwrap_or_else(|e| panic!("{e}: {}\n{err}", stdout(out)))
}

/// The trap boot's `TRAP_MODULES` checked, with `--modules DIR`'s file
/// `file` named where the symbols came from, in its report `v` and its
/// data file `data` (though the module came after the start).
fn trap_modules_checked(
    v: &serde_json::Value,
    err: &str,
    data: &std::path::Path,
    file: &std::path::Path,
) {
    assert!(err.contains("direct sites patched"), "{err}");
    module_returned(v);
    graph_nested(data);
    module_file_named(v, data, file);
}

/// Every call of the module's functions returned through vmtrace's hook,
/// each with its duration, in the JSON report `v`.
fn module_returned(v: &serde_json::Value) {
    for (name, calls) in [
        ("vmt_hit [vmt_test]", CYCLES * HITS),
        ("vmt_batch [vmt_test]", CYCLES),
    ] {
        let f = v["functions"].as_array().unwrap();
        let f = f.iter().find(|f| f["name"] == name).unwrap();
        let n = |k: &str| f[k].as_u64().unwrap_or_else(|| panic!("{k}: {f}"));
        assert_eq!(
            (n("returns"), n("returned"), n("not_returned")),
            (calls, calls, 0),
            "{f}"
        );
        assert!(n("min_ns") > 0 && n("total_ns") >= n("max_ns"), "{f}");
    }
}

/// The module's calls in the saved function graph, nested as it makes
/// them: each `vmt_batch(K)` entered, then K calls of `vmt_hit` entered
/// and returned inside it, then its return, cycle after cycle (one task
/// makes them, on one vCPU at a time); each return at its entry's slot,
/// `vmt_hit`'s deeper in the stack than its caller's.
fn graph_nested(data: &std::path::Path) {
    let trace = tracer::trace::datafile::load(data).unwrap();
    let id = |name: &str| {
        let f = trace.functions.iter().position(|f| f.name == name);
        f.unwrap_or_else(|| panic!("no {name}: {:?}", trace.functions)) as u32
    };
    let (batch, hit) = (id("vmt_batch [vmt_test]"), id("vmt_hit [vmt_test]"));
    let mut seen: Vec<_> = (trace.events.iter())
        .filter(|e| e.func == batch || e.func == hit)
        .collect();
    seen.sort_by_key(|e| e.ts_ns);
    let got: Vec<(u32, bool)> = seen.iter().map(|e| (e.func, e.is_return())).collect();
    let one = std::iter::once((batch, false))
        .chain((0..HITS).flat_map(|_| [(hit, false), (hit, true)]))
        .chain([(batch, true)]);
    let want: Vec<(u32, bool)> = (0..CYCLES).flat_map(|_| one.clone()).collect();
    assert_eq!(got, want, "{batch} vmt_batch, {hit} vmt_hit");
    for cycle in seen.chunks(2 * HITS as usize + 2) {
        let (entry, ret) = (cycle[0], cycle[cycle.len() - 1]);
        assert_eq!(entry.slot, ret.stack_slot(), "{entry:?} {ret:?}");
        for pair in cycle[1..cycle.len() - 1].chunks(2) {
            assert_eq!(pair[0].slot, pair[1].stack_slot(), "{pair:?}");
            assert!(
                pair[0].slot != 0 && pair[0].slot < entry.slot,
                "{pair:?} {entry:?}"
            );
        }
    }
}

/// `vmt_hit(i)`'s argument in the saved trace: `vmt_batch(K)` calls it
/// with i from 0 to K - 1, in each cycle, in time order (one task makes
/// them all: on one vCPU at a time, its stamps from one clock); shown by
/// name, `(i=3)`, by the module's prototypes (its BTF, or its file's).
fn hit_arguments(data: &std::path::Path) {
    let trace = tracer::trace::datafile::load(data).unwrap();
    let (_, calls) = common::vmt_hit_calls(&trace);
    let got: Vec<u64> = calls
        .iter()
        .map(|e| {
            trace
                .args_of(e)
                .unwrap_or_else(|| panic!("no arguments: {e:?}"))[0]
        })
        .collect();
    let want: Vec<u64> = (0..CYCLES).flat_map(|_| 0..HITS).collect();
    assert_eq!(got, want);
    let shown: Vec<String> = (calls.iter())
        .map(|e| tracer::trace::values::entry_args(&trace, e).unwrap_or_default())
        .collect();
    let want: Vec<String> = want.iter().map(|i| format!("(i={i})")).collect();
    assert_eq!(shown, want);
}

#[test]
fn linux_6_12_exitless_on_four_vcpus_reads_pcpu_hot() {
    let Some((bz, vmlinux)) = linux_612() else {
        return;
    };
    let data = std::env::temp_dir().join(format!("vmtrace-612-graph-{}.data", std::process::id()));
    let (out, text, err) = run(
        &bz,
        &vmlinux,
        ("exitless", "/vmt_test.ko"),
        "4",
        "1500",
        &[
            "--trace",
            "vmt_*",
            // Not with `--graph` (refused: the unwinder cannot see through
            // exitless return hooks; the trap boot has the graph). The
            // kernel's loader too: a plain glob must match a traced
            // function of the kernel.
            "--stack",
            "vmt_load_module,vmt_hit",
            "--args=vmt_*",
            // The kernel's functions by their direct entries, the module's
            // (which the guest loads after the attach) by their ftrace
            // sites, the loader's traps on its notifier's ftrace sites.
            "--entry",
            "direct",
            "-o",
            data.to_str().unwrap(),
        ],
    );
    assert!(err.contains("direct sites patched"), "{err}");
    // The arguments through the spare sites' records too.
    hit_arguments(&data);
    let _ = std::fs::remove_file(&data);
    assert!(err.contains("vmtrace: exitless: trampoline"), "{err}");
    assert!(text.contains("Brought up 1 node, 4 CPUs"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("{e}: {}\n{err}", stdout(&out)));
    assert_eq!(v["mode"].as_str(), Some("exitless"), "{v}");
    module_traced(&v, &text, &err);
    // The kernel's own `vmt_*` too: its loader's one call a cycle.
    assert_eq!(count(&v, "vmt_load_module"), Some(CYCLES), "{v}");
    // No call trapped but those whose stacks `--stack` wants: the
    // trampoline handled every other, on every CPU it ran.
    assert_eq!(
        v["trap_exits"].as_u64(),
        Some(CYCLES * HITS + CYCLES),
        "{v}"
    );
    module_stacks(&v);
    let per_cpu: Vec<u64> = (0..4)
        .map(|cpu| {
            v["functions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["per_cpu"][cpu.to_string().as_str()].as_u64().unwrap_or(0))
                .sum()
        })
        .collect();
    let total: u64 = per_cpu.iter().sum();
    assert!(total > 0, "{v}");
    // Timers fire on more than one CPU: the CPU number read from pcpu_hot
    // is each CPU's own (a wrong offset would put every call on one ring,
    // or none: calls on a CPU number out of range are not recorded).
    assert!(
        per_cpu.iter().filter(|&&n| n > 0).count() >= 2,
        "calls per vCPU {per_cpu:?}\n{err}"
    );
}

/// `--stack vmt_hit` (issue 37; in exitless mode the module's function
/// trapped at each load instead of calling its spare site): each of its
/// calls with its stack, from vmt_batch, through the module's frames (its
/// ORC tables, read at each load).
fn module_stacks(v: &serde_json::Value) {
    let hits = stacks_of(v, "vmt_hit [vmt_test]");
    let calls: u64 = hits.iter().map(|(s, _)| s["count"].as_u64().unwrap()).sum();
    assert_eq!(calls, CYCLES * HITS, "{hits:?}");
    for (s, f) in &hits {
        assert!(
            f.first().is_some_and(|f| f.starts_with("vmt_batch")),
            "{f:?}"
        );
        assert_eq!(s["complete"], true, "{s}");
    }
}
