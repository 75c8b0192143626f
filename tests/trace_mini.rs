//! The tracer on real KVM with the mini guest: exact counts, callers,
//! attach/detach cycles, text restored byte for byte, refused mismatches.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;
use vmm::Stopped;

use common::*;
use tracer::plan::ModeChoice;
use tracer::plan::Plan;
use tracer::session::Tracer;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

fn phys(va: u64) -> u64 {
    vmm::layout::kernel_virt_to_phys(va).unwrap()
}

/// The guest's text, read through its physical mapping.
fn text_bytes(mem: &GuestMemoryMmap, kernel: &Path) -> Vec<u8> {
    let (start, end) = (elf_symbol(kernel, "_stext"), elf_symbol(kernel, "_etext"));
    let mut buf = vec![0u8; (end - start) as usize];
    mem.read_slice(&mut buf, GuestAddress(phys(start))).unwrap();
    buf
}

fn boot(
    kernel: &Path,
    vmlinux: &Path,
    cpus: usize,
    cmdline: &str,
    globs: &[&str],
) -> (vmm::Running, Tracer, Capture) {
    boot_in(ModeChoice::Trap, kernel, vmlinux, cpus, cmdline, globs)
}

fn boot_in(
    mode: ModeChoice,
    kernel: &Path,
    vmlinux: &Path,
    cpus: usize,
    cmdline: &str,
    globs: &[&str],
) -> (vmm::Running, Tracer, Capture) {
    let capture = Capture::default();
    let cfg = mini_config(kernel, cpus as u64, cmdline, &capture);
    let globs: Vec<String> = globs.iter().map(|s| s.to_string()).collect();
    let plan = Plan::new(vmlinux, &globs, &[]).unwrap();
    let vm = vmm::Vm::create(cfg).unwrap();
    let (tracer, handlers) = match mode {
        ModeChoice::Trap => Tracer::new(plan, cpus, 10_000_000),
        _ => Tracer::exitless(plan, cpus, 10_000_000, None).unwrap(),
    };
    let running = vm.start(handlers, true).unwrap();
    (running, tracer, capture)
}

#[test]
fn callers_are_the_known_parents() {
    let kernel = mini_elf();
    let (running, mut tracer, capture) = boot(
        &kernel,
        &kernel,
        2,
        "iters=300",
        &["hrtimer_wakeup,hrtimer_start_range_ns,hrtimer_try_to_cancel"],
    );
    {
        let p = running.pause_all();
        tracer.attach(&p).unwrap().attached().unwrap();
    }
    assert_eq!(
        running.wait(),
        vmm::StopReason::PowerOff(0),
        "{}",
        capture.text()
    );
    let mem = running.memory().clone();
    running.finish();
    tracer.detach(&mem).unwrap();
    let trace = tracer.finish(&kernel, "test".into());
    let expect = [
        ("hrtimer_wakeup", "__hrtimer_run_queues"),
        ("hrtimer_start_range_ns", "schedule"),
        ("hrtimer_try_to_cancel", "do_idle"),
    ];
    assert_eq!(trace.events.len() as u64, 2 * (300 + 300 + 150));
    for e in &trace.events {
        let f = &trace.functions[e.func as usize].name;
        let caller = trace.caller_of(e.parent).map(|s| s.name.as_str());
        let want = expect.iter().find(|(c, _)| c == f).unwrap().1;
        assert_eq!(caller, Some(want), "{f} called from {:#x}", e.parent);
    }
    assert!(
        trace.events.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns),
        "events sorted by time"
    );
}

/// Per function: the instruction range in which a vCPU has passed the site but
/// not yet bumped the guest's own counter (the first `add` after the site).
fn in_flight_ranges(kernel: &Path, funcs: &[&str]) -> Vec<(u64, u64)> {
    let image = tracer::kernel::symbols::KernelImage::load(kernel).unwrap();
    funcs
        .iter()
        .map(|f| {
            let s = image.symbol(f).unwrap();
            let start = s.addr + 5;
            let code = image.file_bytes(start, 32).unwrap();
            let mut d = iced_x86::Decoder::with_ip(64, code, start, iced_x86::DecoderOptions::NONE);
            let add = d
                .iter()
                .find(|i| i.mnemonic() == iced_x86::Mnemonic::Add)
                .unwrap();
            (start, add.ip())
        })
        .collect()
}

#[test]
fn attach_detach_100_times_accounts_every_call_and_restores_text() {
    attach_detach_100_times(ModeChoice::Trap);
}

#[test]
fn exitless_attach_detach_100_times_accounts_every_call_and_restores_text() {
    attach_detach_100_times(ModeChoice::Exitless);
}

fn attach_detach_100_times(mode: ModeChoice) {
    const CPUS: usize = 4;
    let kernel = mini_elf();
    let funcs = MINI_FUNCS;
    let (running, mut tracer, capture) = boot_in(
        mode,
        &kernel,
        &kernel,
        CPUS,
        "mode=loop",
        &["*", "-mini_main"][..1],
    );
    let mem = running.memory().clone();
    let original_text = text_bytes(&mem, &kernel);
    let cpus_sym = elf_symbol(&kernel, "mini_cpus");
    let stride = 128u64; // struct cpu: 9 counters, 64-byte aligned
    let guest_count = |cpu: usize, f: usize| -> u64 {
        mem.read_obj(GuestAddress(
            phys(cpus_sym) + cpu as u64 * stride + f as u64 * 8,
        ))
        .unwrap()
    };
    let ranges = in_flight_ranges(&kernel, &funcs);
    // Exitless: a vCPU inside vmtrace's trampoline has made its call but not
    // bumped the guest's counter; its function is the one whose site + 5 is
    // the return address the trampoline will return to (where on the stack
    // depends on where in the trampoline the vCPU stopped).
    let trampoline = tracer.trampoline().cloned();
    let in_trampoline = |p: &vmm::Paused, c: usize, f: usize| -> bool {
        let regs = p.snapshot(c).unwrap().regs;
        let Some(slot) = trampoline
            .as_ref()
            .and_then(|t| t.site_return_slot(regs.rip))
        else {
            return false;
        };
        let mut space = p.vcpu_spaces().remove(c).space;
        space.read_u64(regs.rsp + slot).ok() == Some(ranges[f].0)
    };
    let in_flight = |p: &vmm::Paused, f: usize| -> u64 {
        (0..CPUS)
            .filter(|&c| {
                let rip = p.snapshot(c).unwrap().regs.rip;
                (rip >= ranges[f].0 && rip <= ranges[f].1) || in_trampoline(p, c, f)
            })
            .count() as u64
    };
    // expected[f] = calls made while attached, from the guest's own counters.
    let mut expected = vec![0i64; funcs.len()];
    for cycle in 0..100 {
        {
            let p = running.pause_all();
            for (f, e) in expected.iter_mut().enumerate() {
                let g: u64 = (0..CPUS).map(|c| guest_count(c, f)).sum();
                *e -= (g + in_flight(&p, f)) as i64;
            }
            tracer.attach(&p).unwrap().attached().unwrap();
        }
        std::thread::sleep(Duration::from_millis(1 + cycle % 4));
        {
            let p = running.pause_all();
            for (f, e) in expected.iter_mut().enumerate() {
                let g: u64 = (0..CPUS).map(|c| guest_count(c, f)).sum();
                *e += (g + in_flight(&p, f)) as i64;
            }
            let d = tracer.detach(p.memory()).unwrap();
            assert_eq!(d.changed, 0);
            assert_eq!(
                text_bytes(p.memory(), &kernel),
                original_text,
                "text restored after cycle {cycle}"
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    running
        .memory()
        .write_obj(1u32, GuestAddress(phys(elf_symbol(&kernel, "mini_stop"))))
        .unwrap();
    assert_eq!(
        running.wait(),
        vmm::StopReason::PowerOff(0),
        "no guest fault: {}",
        capture.text()
    );
    running.finish();
    // Exitless: what the guest left in its rings, drained.
    tracer.stop_draining().unwrap();
    let counts = tracer.counts();
    let trace_funcs: Vec<String> = tracer
        .plan()
        .funcs
        .iter()
        .map(|&i| tracer.plan().image.functions[i].name.clone())
        .collect();
    for (f, name) in funcs.iter().enumerate() {
        let slot = trace_funcs.iter().position(|n| n == name).unwrap();
        let traced: u64 = counts[slot].iter().sum();
        assert_eq!(
            traced as i64, expected[f],
            "{name}: traced vs guest-counted calls while attached"
        );
        assert!(traced > 0, "{name} was called while attached");
    }
    assert_eq!(text_bytes(&mem, &kernel), original_text);
    let (_, done) = parse_mini_console(&capture.text());
    assert_eq!(done, vec![0, 1, 2, 3]);
}

/// A copy of the mini guest whose function bodies differ from the running one.
fn mismatched_vmlinux(kernel: &Path) -> PathBuf {
    let image = tracer::kernel::symbols::KernelImage::load(kernel).unwrap();
    let data = std::fs::read(kernel).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    use object::{Object, ObjectSection};
    let text = obj.section_by_name(".text").unwrap();
    let (off, _) = text.file_range().unwrap();
    let mut out = data.clone();
    // Flip the byte after every site (the function body) in the copy.
    for &site in &image.mcount_loc {
        let pos = (off + site - text.address() + 6) as usize;
        out[pos] ^= 0xff;
    }
    let path = std::env::temp_dir().join(format!("vmtrace-mismatch-{}.elf", std::process::id()));
    std::fs::write(&path, out).unwrap();
    path
}

#[test]
fn mismatched_vmlinux_is_refused_and_text_untouched() {
    let kernel = mini_elf();
    let wrong = mismatched_vmlinux(&kernel);
    let (running, mut tracer, _capture) = boot(&kernel, &wrong, 1, "iters=10", &["hrtimer_*"]);
    let mem = running.memory().clone();
    let before = text_bytes(&mem, &kernel);
    {
        let p = running.pause_all();
        let err = tracer.attach(&p).unwrap_err().to_string();
        assert!(err.contains("does not match the running kernel"), "{err}");
        assert_eq!(text_bytes(p.memory(), &kernel), before);
    }
    assert!(!tracer.is_attached());
    running.wait();
    running.finish();
    // And from the command line: exit status 2, one line.
    let out = vmtrace(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--vmlinux",
        wrong.to_str().unwrap(),
        "--trace",
        "hrtimer_*",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("does not match the running kernel"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_file(wrong);
}

fn assert_cli_error(args: &[&str], needle: &str) {
    let out = vmtrace(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(needle), "{needle:?} in {err}");
}

#[test]
fn bad_tracer_inputs_are_one_line_errors() {
    let kernel = mini_elf();
    let k = kernel.to_str().unwrap();
    let stripped =
        std::env::temp_dir().join(format!("vmtrace-stripped-{}.elf", std::process::id()));
    std::fs::copy(&kernel, &stripped).unwrap();
    assert!(std::process::Command::new("strip")
        .arg(&stripped)
        .status()
        .unwrap()
        .success());
    assert_cli_error(
        &[
            "--kernel",
            k,
            "--vmlinux",
            stripped.to_str().unwrap(),
            "--trace",
            "hrtimer_*",
        ],
        "no symbol table",
    );
    assert_cli_error(
        &["--kernel", k, "--trace", "hrtimer_nope*"],
        "closest: hrtimer_",
    );
    let st = std::process::Command::new("bash")
        .arg(root().join("guest/build.sh"))
        .arg("mini-noftrace")
        .status()
        .unwrap();
    assert!(st.success());
    let noftrace = root().join("guest/out/mini-noftrace.elf");
    assert_cli_error(
        &[
            "--kernel",
            noftrace.to_str().unwrap(),
            "--entry",
            "ftrace",
            "--trace",
            "hrtimer_*",
        ],
        "CONFIG_FUNCTION_TRACER",
    );
    assert_cli_error(&["--kernel", k, "--trace", "[unclosed"], "[unclosed");
    let _ = std::fs::remove_file(stripped);
}
