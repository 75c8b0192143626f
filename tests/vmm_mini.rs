//! The VMM core on real KVM with the mini guest.

mod common;

use std::time::Duration;
use vmm::Stopped;

use common::*;
use vm_memory::{Bytes, GuestAddress};

fn check_counts(console: &str, cpus: u32, iters: u64) {
    let (counts, done) = parse_mini_console(console);
    assert_eq!(
        done,
        (0..cpus).collect::<Vec<_>>(),
        "every CPU says done:\n{console}"
    );
    for cpu in 0..cpus {
        for f in MINI_FUNCS {
            assert_eq!(
                counts.get(&(cpu, f.to_string())).copied(),
                Some(mini_expected(f, iters)),
                "cpu {cpu} {f}"
            );
        }
    }
}

/// Run the mini guest through the CLI and demand a clean power-off; returns
/// (console, stderr).
fn run_mini_clean(cpus: u32, cmdline: &str, extra: &[&str]) -> (String, String) {
    let kernel = mini_elf();
    let cpus = cpus.to_string();
    let mut args = vec![
        "--kernel",
        kernel.to_str().unwrap(),
        "--cpus",
        &cpus,
        "--cmdline",
        cmdline,
        "--timeout",
        "120",
        // The console alone on stdout (the default is stderr).
        "--console",
        "-",
    ];
    args.extend_from_slice(extra);
    let out = vmtrace(&args);
    let err = stderr(&out);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    assert!(err.contains("guest powered off (status 0)"), "{err}");
    (stdout(&out), err)
}

#[test]
fn mini_guest_one_and_four_cpus_power_off_with_exact_counts() {
    for (cpus, iters) in [(1u32, 500u64), (4, 2001)] {
        let (console, _) = run_mini_clean(cpus, &format!("iters={iters}"), &[]);
        assert!(console.contains("mini: all done"));
        check_counts(&console, cpus, iters);
    }
}

#[test]
fn int3_reaches_the_guest_handler_through_the_assist() {
    let (console, err) = run_mini_clean(2, "iters=10 int3=1", &["--stats"]);
    assert!(console.contains("mini: int3 ok 2"), "{console}");
    check_counts(&console, 2, 10);
    // On an emulating host the assist ran; on bare metal int3 runs natively.
    if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        assert!(err.contains("emulation assist `int3` x2"), "{err}");
    }
}

#[test]
fn two_hundred_pause_cycles_while_four_vcpus_loop() {
    let kernel = mini_elf();
    let capture = Capture::default();
    let cfg = mini_config(&kernel, 4, "mode=loop", &capture);
    let vm = vmm::Vm::create(cfg).unwrap();
    let handlers = no_tracers(4);
    let running = vm.start(handlers, false).unwrap();
    let stop_gpa = vmm::layout::kernel_virt_to_phys(elf_symbol(&kernel, "mini_stop")).unwrap();
    let mut latencies = Vec::new();
    let mut rips = std::collections::HashSet::new();
    for _ in 0..200 {
        std::thread::sleep(Duration::from_millis(2));
        let p = running.pause_all();
        for cpu in 0..4 {
            let snap = p.snapshot(cpu).expect("every vCPU parked with a snapshot");
            rips.insert(snap.regs.rip);
        }
        latencies.push(p.latency().as_nanos() as u64);
        drop(p);
    }
    assert!(
        rips.len() > 4,
        "vCPUs ran between pauses (distinct RIPs: {})",
        rips.len()
    );
    running
        .memory()
        .write_obj(1u32, GuestAddress(stop_gpa))
        .unwrap();
    let reason = running.wait();
    let report = running.finish();
    assert_eq!(reason, vmm::StopReason::PowerOff(0), "{}", capture.text());
    assert_eq!(report.pause.latency_ns.len(), 200);
    assert_eq!(report.pause.window_ns.len(), 200);
    let (counts, done) = parse_mini_console(&capture.text());
    assert_eq!(done, vec![0, 1, 2, 3]);
    for cpu in 0..4 {
        let n = counts[&(cpu, "do_idle".to_string())];
        assert!(n > 0);
        for f in MINI_FUNCS {
            assert_eq!(
                counts[&(cpu, f.to_string())],
                mini_expected(f, n),
                "cpu {cpu} {f}"
            );
        }
    }
    latencies.sort_unstable();
    println!(
        "pause latency over 200 cycles, 4 vCPUs: p50 {} us, p99 {} us, max {} us",
        latencies[99] / 1000,
        latencies[197] / 1000,
        latencies[199] / 1000
    );
}

#[test]
fn start_paused_runs_no_guest_instruction_before_resume() {
    let kernel = mini_elf();
    let capture = Capture::default();
    let cfg = mini_config(&kernel, 2, "iters=5", &capture);
    let vm = vmm::Vm::create(cfg).unwrap();
    let entry = vm.boot_plan().entry;
    let handlers = no_tracers(2);
    let running = vm.start(handlers, true).unwrap();
    {
        let p = running.pause_all();
        for cpu in 0..2 {
            assert_eq!(p.snapshot(cpu).unwrap().regs.rip, entry);
        }
        assert!(capture.text().is_empty());
    }
    assert_eq!(running.wait(), vmm::StopReason::PowerOff(0));
    running.finish();
}

#[test]
fn triple_fault_and_reset_end_the_run_and_say_why() {
    let kernel = mini_elf();
    for (end, says) in [
        ("triple-fault", "vCPU 0 triple-faulted"),
        ("reset", "guest requested a reset"),
    ] {
        let out = vmtrace(&[
            "--kernel",
            kernel.to_str().unwrap(),
            "--cpus",
            "2",
            "--cmdline",
            &format!("end={end} iters=100"),
            "--timeout",
            "60",
        ]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(stderr(&out).contains(says), "{end}: {}", stderr(&out));
    }
}

#[test]
fn timeout_stops_a_looping_guest_and_says_where_it_was() {
    let out = vmtrace(&[
        "--kernel",
        mini_elf().to_str().unwrap(),
        "--cpus",
        "2",
        "--cmdline",
        "mode=loop",
        "--timeout",
        "0.5",
        "--stats",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("timeout after 0.5 s"), "{err}");
    assert!(err.contains("cpu1 stopped at rip 0xffffffff81"), "{err}");
}

#[test]
fn string_port_io_delivers_every_element() {
    let (console, _) = run_mini_clean(1, "iters=10 strio=1", &[]);
    assert!(
        console.contains("mini: rep outsb ok, every byte of one string write\n"),
        "{console}"
    );
    // Before every element was delivered: `mini: rep insb bad 96 255 255 ...`.
    assert!(console.contains("mini: rep insb ok\n"), "{console}");
    check_counts(&console, 1, 10);
}

/// Panics the first time its vCPU parks.
struct PanicOnFlush;

impl vmm::TrapHandler for PanicOnFlush {
    fn on_trap(&mut self, trap: &mut vmm::Trap<'_>) -> Result<(), vmm::TrapError> {
        vmm::NoTracer.on_trap(trap)
    }
    fn flush(&mut self) {
        panic!("handler exploded");
    }
}

#[test]
fn a_panicking_vcpu_thread_ends_the_run_and_says_so() {
    let kernel = mini_elf();
    let (tx, rx) = std::sync::mpsc::channel();
    // On a thread, so that a hang (a pause waiting for the dead vCPU) fails
    // the test instead of blocking it.
    std::thread::spawn(move || {
        let capture = Capture::default();
        let vm = vmm::Vm::create(mini_config(&kernel, 2, "mode=loop", &capture)).unwrap();
        let mut handlers = no_tracers(2);
        handlers[1] = Box::new(PanicOnFlush);
        // Started paused: vCPU 1 flushes, and panics, before its first run.
        let running = vm.start(handlers, true).unwrap();
        drop(running.pause_all());
        let reason = running.wait();
        let report = running.finish();
        let _ = tx.send((reason, report.reason));
    });
    let (reason, final_reason) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the run hung after a vCPU thread panicked");
    let expected = vmm::StopReason::Error(vmm::VcpuError::Panicked {
        cpu: 1,
        message: "handler exploded".into(),
    });
    assert_eq!(reason, expected);
    assert_eq!(final_reason, expected);
    assert_eq!(
        reason.to_string(),
        "the thread of vCPU 1 panicked: handler exploded"
    );
}

#[test]
fn a_timeout_says_its_time_once() {
    let kernel = mini_elf();
    let out = vmtrace(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--cmdline",
        "mode=loop",
        "--timeout",
        "0.5",
        "--console",
        "none",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("vmtrace: timeout after 0.5 s (--timeout)"),
        "{err}"
    );
    assert!(!err.contains(" s after "), "{err}");
}

/// Does this host's KVM run guest ring 0 in its instruction emulator (so
/// that `insn_emulation` counts every guest instruction)?
fn emulating_host() -> bool {
    std::path::Path::new("/sys/module/kvm_pvm").exists()
}

/// KVM's per-vCPU statistics: read while the guest runs, from this thread
/// (not the vCPUs'), they grow; under a pause they stand still; the run
/// report has the final counts.
#[test]
fn kvm_counts_grow_while_the_guest_runs() {
    let kernel = mini_elf();
    let capture = Capture::default();
    let vm = vmm::Vm::create(mini_config(&kernel, 2, "mode=loop", &capture)).unwrap();
    let running = vm.start(no_tracers(2), false).unwrap();
    let stats = running.kvm_stats();
    let first = stats.read().unwrap();
    assert_eq!(first.len(), 2);
    if first
        .iter()
        .all(|c| c.insn_emulation.is_none() && c.exits.is_none())
    {
        println!("skipped: this KVM keeps no binary statistics (KVM_GET_STATS_FD)");
        running.request_stop(vmm::StopReason::Requested);
        let report = running.finish();
        assert_eq!(report.guest_instructions_emulated(), None);
        return;
    }
    std::thread::sleep(Duration::from_millis(300));
    let (paused_a, paused_b) = {
        let p = running.pause_all();
        let a = running.kvm_counts().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let b = running.kvm_counts().unwrap();
        drop(p);
        (a, b)
    };
    assert_eq!(paused_a, paused_b, "counts move while every vCPU is parked");
    for cpu in 0..2 {
        let (f, g) = (first[cpu], paused_a[cpu]);
        // Every pause kicks each vCPU out of KVM_RUN: at least one exit.
        if let (Some(f), Some(g)) = (f.exits, g.exits) {
            assert!(g > f, "cpu{cpu}: exits {f} -> {g}");
        }
        if emulating_host() {
            // 300 ms of a ring-0 loop, every instruction emulated.
            let (f, g) = (f.insn_emulation.unwrap(), g.insn_emulation.unwrap());
            assert!(g > f + 1000, "cpu{cpu}: instructions {f} -> {g}");
        }
    }
    running.request_stop(vmm::StopReason::Requested);
    let report = running.finish();
    assert_eq!(report.kvm_error, None);
    for (cpu, (g, end)) in paused_a.iter().zip(&report.kvm).enumerate() {
        assert!(end.insn_emulation >= g.insn_emulation, "cpu{cpu}");
        assert!(end.exits >= g.exits, "cpu{cpu}");
    }
    if emulating_host() {
        let total: Vec<u64> = report.guest_instructions_emulated().unwrap();
        println!("guest instructions emulated by KVM per vCPU: {total:?}");
        assert!(total.iter().all(|&n| n > 1000), "{total:?}");
    }
}
