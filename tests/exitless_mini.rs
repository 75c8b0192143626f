//! Exitless mode end to end with the mini guest: vmtrace's trampoline in the
//! guest, events through its rings, no exit per call; counts equal the
//! guest's own, callers exact, and a full ring loses no count.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("vmtrace-exitless-{}-{name}", std::process::id()))
}

/// Run the mini guest traced in exitless mode; the JSON report and what the
/// guest printed (per (cpu, function) counts).
fn run(cpus: u32, iters: u64, extra: &[&str]) -> (serde_json::Value, BTreeMap<(u32, String), u64>) {
    run_kernel(&mini_elf(), cpus, iters, extra)
}

/// `run` with a variant of the mini guest.
fn run_kernel(
    kernel: &std::path::Path,
    cpus: u32,
    iters: u64,
    extra: &[&str],
) -> (serde_json::Value, BTreeMap<(u32, String), u64>) {
    let cpus_s = cpus.to_string();
    let cmdline = format!("iters={iters}");
    let mut args = vec![
        "--kernel",
        kernel.to_str().unwrap(),
        "--cpus",
        &cpus_s,
        "--cmdline",
        &cmdline,
        "--trace",
        "hrtimer_*",
        "-g",
        "--mode",
        "exitless",
    ];
    args.extend_from_slice(extra);
    let (out, v) = run_json(&args);
    let (printed, done) = parse_mini_console(&stderr(&out));
    assert_eq!(done, (0..cpus).collect::<Vec<_>>());
    (v, printed)
}

/// Every traced function's count on every vCPU equals the guest's own.
fn assert_counts_exact(v: &serde_json::Value, printed: &BTreeMap<(u32, String), u64>, cpus: u32) {
    let mut total = 0;
    for f in v["functions"].as_array().unwrap() {
        let name = f["name"].as_str().unwrap();
        let per_cpu: BTreeMap<String, u64> = serde_json::from_value(f["per_cpu"].clone()).unwrap();
        for cpu in 0..cpus {
            let guest = printed[&(cpu, name.to_string())];
            assert_eq!(per_cpu[&cpu.to_string()], guest, "{name} on vCPU {cpu}");
            total += guest;
        }
    }
    assert_eq!(v["events"].as_u64(), Some(total));
}

#[test]
fn exitless_counts_and_callers_are_exact_with_no_trap_exit() {
    for cpus in [1, 4] {
        let (v, printed) = run(cpus, 1500, &[]);
        assert_eq!(v["mode"], "exitless");
        assert_eq!(v["trap_exits"].as_u64(), Some(0), "no exit per call");
        assert_counts_exact(&v, &printed, cpus);
        assert_eq!(v["dropped"].as_u64(), Some(0));
        assert_eq!(v["events_stored"], v["events"]);
        let known = [
            ("hrtimer_wakeup", "__hrtimer_run_queues"),
            ("hrtimer_start_range_ns", "schedule"),
            ("hrtimer_try_to_cancel", "do_idle"),
            ("hrtimer_interrupt", "do_idle"),
        ];
        for f in v["functions"].as_array().unwrap() {
            let name = f["name"].as_str().unwrap();
            let want = known.iter().find(|(n, _)| *n == name).unwrap().1;
            let callers = f["callers"].as_array().unwrap();
            assert_eq!(callers.len(), 1, "{name}: {callers:?}");
            assert_eq!(callers[0]["name"], want, "{name}");
            assert_eq!(callers[0]["count"], f["count"], "{name}");
        }
    }
}

/// Linux 6.15+ links the per-CPU section in the kernel image: `cpu_number`
/// is a kernel address, read as gs:[address] with GS base = area -
/// __per_cpu_start. The mini guest built that way is traced exactly, as the
/// zero-based layout is.
#[test]
fn exitless_reads_per_cpu_symbols_that_are_kernel_addresses() {
    let kernel = mini_variant_elf("mini-percpu-addr");
    assert!(
        elf_symbol(&kernel, "cpu_number") >= 0xffff_ffff_8000_0000,
        "the variant's cpu_number is a kernel address"
    );
    assert_eq!(
        elf_symbol(&mini_elf(), "cpu_number"),
        0,
        "the default's an offset"
    );
    let cpus = 4;
    let (v, printed) = run_kernel(&kernel, cpus, 1000, &[]);
    assert_eq!(v["mode"], "exitless");
    assert_eq!(v["trap_exits"].as_u64(), Some(0));
    assert_counts_exact(&v, &printed, cpus);
    assert_eq!(v["dropped"].as_u64(), Some(0));
}

/// The mini guest built with return thunks (-mfunction-return=thunk-extern:
/// every C return is `jmp __x86_return_thunk`, which counts its runs per
/// vCPU) traced in `mode`; per vCPU: (thunk runs, traced calls).
fn thunk_runs(mode: &str, graph: bool) -> BTreeMap<u32, (u64, u64)> {
    let kernel = mini_variant_elf("mini-rethunk");
    let mut args = vec![
        "--kernel",
        kernel.to_str().unwrap(),
        "--cpus",
        "2",
        "--cmdline",
        "iters=300",
        "--trace",
        "hrtimer_*",
        "--mode",
        mode,
    ];
    if graph {
        args.push("--graph");
    }
    let (out, v) = run_json(&args);
    let console = stderr(&out);
    let (printed, done) = parse_mini_console(&console);
    assert_eq!(done, [0, 1], "{console}");
    let stats = parse_mini_stats(&console);
    let mut per_cpu = BTreeMap::new();
    for cpu in 0..2u32 {
        let mut calls = 0;
        for f in v["functions"].as_array().unwrap() {
            let name = f["name"].as_str().unwrap();
            let n = f["per_cpu"][cpu.to_string()].as_u64().unwrap();
            assert_eq!(n, printed[&(cpu, name.to_string())], "{name} on vCPU {cpu}");
            calls += n;
        }
        per_cpu.insert(cpu, (stats[&(cpu, "return_thunk_hits".to_string())], calls));
    }
    per_cpu
}

/// A kernel with return thunks: vmtrace's code returns through the
/// kernel's thunk, as the kernel's own `__fentry__` does, once per recorded
/// call (and once more per hooked return with the graph); traps run no guest
/// code. Exact per vCPU, on real KVM.
#[test]
fn exitless_code_returns_through_the_guests_return_thunk() {
    let trap = thunk_runs("trap", false);
    let exitless = thunk_runs("exitless", false);
    let graph = thunk_runs("exitless", true);
    for cpu in 0..2 {
        let (own, calls) = trap[&cpu];
        assert!(own > 0 && calls > 0, "vCPU {cpu}: {own} {calls}");
        assert_eq!(exitless[&cpu], (own + calls, calls), "vCPU {cpu}");
        // Every hrtimer_* call returns: its entry and its return.
        assert_eq!(graph[&cpu], (own + 2 * calls, calls), "vCPU {cpu}");
    }
}

#[test]
fn a_ring_too_small_records_some_and_counts_every_call() {
    // Four records per vCPU ring: most calls find it full and are counted
    // in the guest instead (per site), so recorded + counted = calls.
    let saved = tmp("small.vmtrace");
    let (v, printed) = run(2, 3000, &["--ring-events", "4"]);
    assert_counts_exact(&v, &printed, 2);
    let (events, stored, dropped) = (
        v["events"].as_u64().unwrap(),
        v["events_stored"].as_u64().unwrap(),
        v["dropped"].as_u64().unwrap(),
    );
    assert!(dropped > 0, "the ring overflowed: {v}");
    assert!(stored > 0, "and some calls were recorded: {v}");
    assert_eq!(stored + dropped, events);
    // Every drop's cause: a full ring, counted by vmtrace's code in the
    // guest per vCPU; those of each vCPU are its calls not stored, exactly
    // (the guest's own counts, less the CSV rows of that vCPU, below).
    let d = &v["drops"];
    let full: Vec<u64> = d["ring_full"]
        .as_array()
        .unwrap_or_else(|| panic!("{d}"))
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(full.len(), 2, "{d}");
    assert_eq!(full.iter().sum::<u64>(), dropped, "{d}");
    assert_eq!((&d["ring_asked"], &d["ring_given"]), (&4.into(), &4.into()));
    assert_eq!(
        (&d["over_budget"], &d["overwritten"]),
        (&0.into(), &0.into())
    );
    assert!(d["held"].as_u64().unwrap() <= dropped, "{d}");

    // The same through a saved trace: each stored event is one CSV row.
    let kernel = mini_elf();
    let out = vmtrace(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--cpus",
        "2",
        "--cmdline",
        "iters=3000",
        "--trace",
        "hrtimer_*",
        "--mode",
        "exitless",
        "--ring-events",
        "4",
        "-o",
        saved.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("mode:     exitless (0 trap exits)"),
        "{}",
        stdout(&out)
    );
    let csv = vmtrace(&["report", "-i", saved.to_str().unwrap(), "--format", "csv"]);
    let json = vmtrace(&["report", "-i", saved.to_str().unwrap(), "--format", "json"]);
    let _ = std::fs::remove_file(&saved);
    assert!(
        csv.status.success() && json.status.success(),
        "{}",
        stderr(&csv)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    let rows = stdout(&csv).lines().count() as u64 - 1; // header
    assert_eq!(rows, v["events_stored"].as_u64().unwrap());
    assert_eq!(
        v["events_stored"].as_u64().unwrap() + v["dropped"].as_u64().unwrap(),
        v["events"].as_u64().unwrap()
    );
    assert_eq!(v["mode"], "exitless");
    // Per vCPU, exactly: its calls (the guest's own counts, which the
    // file's per-vCPU counts equal) = its stored rows + its ring-full drops.
    let text = stdout(&csv);
    for cpu in 0..2u64 {
        let calls: u64 = v["functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["per_cpu"][cpu.to_string().as_str()].as_u64().unwrap())
            .sum();
        let stored = text
            .lines()
            .skip(1)
            .filter(|l| l.split(',').nth(1) == Some(&cpu.to_string()))
            .count() as u64;
        let full = v["drops"]["ring_full"][cpu as usize].as_u64().unwrap();
        assert_eq!(stored + full, calls, "vCPU {cpu}: {}", v["drops"]);
    }
}

#[test]
fn bad_exitless_options_are_refused_before_the_guest_runs() {
    let kernel = mini_elf();
    let k = kernel.to_str().unwrap();
    for ring in ["3", "1"] {
        assert_bad_input(
            &[
                "--kernel",
                k,
                "--cmdline",
                "mode=loop",
                "--timeout",
                "30",
                "--trace",
                "hrtimer_*",
                "--mode",
                "exitless",
                "--ring-events",
                ring,
            ],
            "not a power of two",
        );
    }
}

#[test]
fn auto_mode_picks_traps_where_kvm_emulates_guest_ring_0() {
    let kernel = mini_elf();
    let args = [
        "--kernel",
        kernel.to_str().unwrap(),
        "--cmdline",
        "iters=10",
        "--trace",
        "hrtimer_*",
    ];
    let (_, v) = run_json(&args);
    let emulating = std::path::Path::new("/sys/module/kvm_pvm").exists();
    assert_eq!(v["mode"], if emulating { "trap" } else { "exitless" });
    if emulating {
        assert_eq!(v["trap_exits"], v["events"], "one exit per call");
    }
}

/// The run ends while a record is reserved in a ring and never committed
/// (what a writer stopped, or preempted for good, between its reservation
/// and its commit leaves; made here under a pause, as the trampoline's
/// `cmpxchg` makes it: `head` moved one record on, nothing written). The
/// drain reads past it after `ring::STALL`, the ring fills one lap past it
/// and the later calls are counted as drops; the last drain reads every
/// record committed behind it and counts it as unfinished. Every function's
/// count (records + drops) equals the guest's own, exactly, and the one
/// unfinished reservation is said, by the run and by the data file it
/// streamed to (its report, script and JSON). (Before, the drain stopped
/// at the reserved slot for good: the records behind it were in no count;
/// then the data file did not keep the unfinished count.)
#[test]
fn a_record_reserved_and_never_committed_at_the_end_loses_no_count() {
    use tracer::plan::exitless::layout::{RingLayout, HEAD_OFF, LIMIT_OFF, RECORD_LEN};
    use tracer::plan::Mode;
    use tracer::plan::Plan;
    use tracer::session::store::Storage;
    use tracer::session::{Recording, Tracer};
    use vm_memory::{Bytes, GuestAddress};

    const RING: u64 = 256;
    let kernel = mini_elf();
    let console = Capture::default();
    let vm = vmm::Vm::create(mini_config(&kernel, 1, "mode=loop", &console)).unwrap();
    let plan = Plan::new(&kernel, &["hrtimer_*".to_string()], &[]).unwrap();
    let layout = RingLayout::new(1, plan.index.addrs.len(), Some(RING), false).unwrap();
    // Streamed to a data file, as `vmtrace record` does.
    let data = tmp("unfinished.data");
    let rec = Recording {
        max_events: u64::MAX,
        storage: Storage::Stream {
            file: tracer::trace::datafile::DataFile::create(&data).unwrap(),
            buffer: 64 << 20,
        },
        kernel: kernel.clone(),
        // Who ran the guest, as `vmtrace attach` names its QEMU: kept in
        // the data file (version 7) and said in the header and JSON.
        vmm: "a test VMM".into(),
        cmdline: Vec::new(),
    };
    let mode = Mode::exitless(&plan, 1, Some(RING)).unwrap();
    let (mut tracer, handlers) = Tracer::create(plan, 1, mode, rec).unwrap();
    // Attached before the guest's first instruction: every call traced.
    let running = vm.start(handlers, true).unwrap();
    {
        let p = running.pause_all();
        tracer.attach(&p).unwrap().attached().unwrap();
    }
    // The guest's own count of hrtimer_start_range_ns calls on vCPU 0
    // (mini_cpus[0].count[2], workload.c): one per iteration. Progress is
    // waited for by count, not by time.
    let counter = GuestAddress(
        vmm::layout::kernel_virt_to_phys(elf_symbol(&kernel, "mini_cpus")).unwrap() + 2 * 8,
    );
    let wait_iterations = |n: u64| {
        let from: u64 = running.memory().read_obj(counter).unwrap();
        while running.memory().read_obj::<u64>(counter).unwrap() < from + n {
            assert!(running.wait_stop(Duration::from_millis(1)).is_none());
        }
    };
    wait_iterations(100);
    let head_gpa = GuestAddress(layout.ring_gpa(0) + HEAD_OFF);
    let limit_gpa = GuestAddress(layout.ring_gpa(0) + LIMIT_OFF);
    // A slot is reserved where the ring has room. A pause can find it full
    // (a loaded host delayed the drainer): then the guest runs on (the
    // drainer catches up as it does) and the pause is tried again; bounded
    // by a count of the guest's own progress, never by time.
    let mut full_at = Vec::new();
    loop {
        let p = running.pause_all();
        let mem = p.memory();
        let head: u64 = mem.read_obj(head_gpa).unwrap();
        let limit: u64 = mem.read_obj(limit_gpa).unwrap();
        if head < limit {
            mem.write_obj(head + RECORD_LEN, head_gpa).unwrap();
            break;
        }
        full_at.push((head, limit));
        assert!(
            full_at.len() < 1000,
            "the ring was full at every pause: {full_at:?}"
        );
        drop(p);
        wait_iterations(10);
    }
    // Calls go on behind the reserved slot: more than a ring of them.
    wait_iterations(RING);
    // End the loop, still attached: the last iteration's calls are traced.
    let stop = vmm::layout::kernel_virt_to_phys(elf_symbol(&kernel, "mini_stop")).unwrap();
    {
        let p = running.pause_all();
        p.memory().write_obj(1u32, GuestAddress(stop)).unwrap();
    }
    let mem = running.memory().clone();
    running.wait();
    let report = running.finish();
    tracer.detach(&mem).unwrap();
    tracer.stop_draining().unwrap();
    let (run, saved) = tracer.finish_stored(&kernel, report.reason.to_string(), 0);
    saved.unwrap().unwrap();
    assert_eq!(run.meta.unfinished, 1);
    // Everything below is read back from the data file.
    let t = tracer::trace::datafile::load(&data).unwrap();
    let (printed, done) = parse_mini_console(&console.text());
    assert_eq!(done, [0], "{}", console.text());

    let mut calls = 0;
    for (f, sym) in t.functions.iter().enumerate() {
        let guest = printed[&(0, sym.name.clone())];
        assert_eq!(t.counts[f][0], guest, "{}", sym.name);
        calls += guest;
    }
    assert_eq!(t.meta.events_total, calls);
    assert_eq!(t.meta.unfinished, 1);
    assert_eq!(t.meta.vmm, "a test VMM");
    // The ring filled one lap past the reserved slot: drops, and more
    // records than a ring holds, those behind the slot among them.
    let stored = t.events.len() as u64;
    assert!(t.meta.events_dropped > 0, "{:?}", t.meta);
    assert!(stored > RING, "{stored} records");
    assert_eq!(stored + t.meta.events_dropped, calls);
    // Their cause, from the data file (version 10): the ring full, and of
    // those, the drops while the drain was held at the reserved slot (all
    // of them after it; any before were the drain's speed's).
    let d = &t.meta.drops;
    assert_eq!(d.ring_full.len(), 1, "{d:?}");
    assert_eq!(d.ring_full_total(), t.meta.events_dropped, "{d:?}");
    assert!(d.held > 0 && d.held <= d.ring_full_total(), "{d:?}");
    assert_eq!((d.ring_asked, d.ring_given), (RING, RING));
    // Said in the report's header, from the data file, by `vmtrace report`.
    let data_s = data.to_str().unwrap();
    let text = stdout(&vmtrace(&["report", data_s]));
    let said = text
        .lines()
        .find_map(|l| l.strip_prefix("# unfinished:"))
        .map(str::trim_start);
    let want = format!(
        "1 calls reserved a record in vmtrace's rings that was never committed (the run ended \
         while their writer was between the two): their functions are unknown, so they are not \
         in the counts; {} calls in all",
        tracer::trace::report::thousands(calls + 1)
    );
    assert_eq!(said, Some(want.as_str()), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&vmtrace(&["report", data_s, "--format", "json"]))).unwrap();
    assert_eq!(json["unfinished"], 1, "{json}");
    assert_eq!(json["vmm"], "a test VMM", "{json}");
    assert!(text.contains("\n# guest:"), "{text}");
    assert!(text.contains("run by a test VMM\n"), "{text}");
    assert_eq!(json["events"].as_u64(), Some(calls));
    let script = stdout(&vmtrace(&["script", data_s]));
    assert!(
        script.contains("\n# 1 calls unfinished: their record in vmtrace's rings was reserved"),
        "{}",
        &script[..script.len().min(2000)]
    );
    let _ = std::fs::remove_file(&data);
}
