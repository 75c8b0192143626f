//! The library's pipeline without the CLI, on real KVM with the mini guest:
//! the kernel file opened once, its symbols found, a trace planned, and one
//! `Session` (the driver the CLI and the bench use) started, traced and
//! ended. Counts must equal what the guest counted itself, in both modes.

mod common;

use std::time::Duration;

use common::*;
use tracer::kernel::find::{kernel_image, Given};
use tracer::plan::{ModeChoice, Note, Request, TracePlan};
use tracer::session::{Attached, Observer, Progress, Recording, Session, Tracer};

/// What the driver told its observer.
#[derive(Default)]
struct Seen {
    attached: Vec<Attached>,
    tracing: u32,
}

impl Observer for Seen {
    fn attached(&mut self, a: &Attached, _tracer: &Tracer) {
        self.attached.push(a.clone());
    }
    fn tracing(&mut self, _p: &Progress, _elapsed: Duration, _left: Option<Duration>) {
        self.tracing += 1;
    }
}

fn request(mode: ModeChoice, graph: bool) -> Request {
    Request {
        trace: vec!["hrtimer_*".to_string(), "schedule".to_string()],
        notrace: Vec::new(),
        graph,
        mode,
        ring_events: None,
        cpus: 2,
        emulator_host: false,
        linux: false,
        pids: Vec::new(),
        comm: None,
        args: Vec::new(),
        retval: false,
        stack: Vec::new(),
        entry: Default::default(),
        events: Vec::new(),
        module_events: Vec::new(),
    }
}

/// The whole pipeline: counts per (CPU, function) equal the guest's own,
/// every site restored, the observer told of the attach.
fn pipeline(mode: ModeChoice, graph: bool) {
    let elf = mini_elf();
    let kernel = vmm::boot::KernelFile::open(&elf).unwrap();
    let found = kernel_image(&kernel, Given::Nothing).unwrap();
    assert_eq!(found.note, None, "an ELF kernel is its own vmlinux");
    assert!(found.image.source.ends_with("(the kernel itself)"));
    let plan = TracePlan::build(found.image, &request(mode, graph)).unwrap();
    let want = match mode {
        ModeChoice::Exitless => "exitless",
        _ => "trap",
    };
    assert_eq!(plan.mode.name(), want);
    assert!(plan
        .notes
        .iter()
        .all(|n| !matches!(n, Note::AutoTrap { .. })));
    let capture = Capture::default();
    let mut cfg = mini_config(&elf, 2, "iters=400", &capture);
    cfg.kernel = kernel;
    let vm = vmm::Vm::create(cfg).unwrap();
    let mut session = Session::start(vm, plan, Recording::memory(10_000_000)).unwrap();
    let mut seen = Seen::default();
    let attached = session.trace(None, &mut seen).unwrap().expect("attached");
    assert_eq!(seen.attached.len(), 1, "the attach is said once");
    assert_eq!(attached.counts.patched, seen.attached[0].counts.patched);
    assert_eq!(attached.retries, 0, "the mini guest is ready at once");
    let ended = session.end(&vmm::advice::Plain);
    assert_eq!(
        ended.report.reason,
        vmm::StopReason::PowerOff(0),
        "{}",
        capture.text()
    );
    let detached = ended.detached.unwrap();
    assert_eq!(
        detached.restored, ended.attached,
        "every patched site restored"
    );
    ended.drained.unwrap();
    let (guest, done) = parse_mini_console(&capture.text());
    assert_eq!(done, vec![0, 1]);
    let trace = ended.summary;
    for (f, func) in trace.functions.iter().enumerate() {
        for cpu in 0..2u32 {
            let theirs = guest[&(cpu, func.name.clone())];
            assert_eq!(
                trace.counts[f][cpu as usize], theirs,
                "{} on cpu{cpu}",
                func.name
            );
            if graph {
                assert_eq!(
                    trace.returns[f][cpu as usize], theirs,
                    "{} returns",
                    func.name
                );
            }
        }
    }
    let calls: u64 = trace.counts.iter().flatten().sum();
    assert_eq!(trace.events.len() as u64, calls * if graph { 2 } else { 1 });
}

#[test]
fn the_library_pipeline_counts_exactly_in_trap_mode() {
    pipeline(ModeChoice::Trap, false);
}

#[test]
fn the_library_pipeline_counts_exactly_in_exitless_mode() {
    pipeline(ModeChoice::Exitless, false);
}

#[test]
fn the_library_pipeline_counts_calls_and_returns_with_the_graph() {
    pipeline(ModeChoice::Trap, true);
}

/// A session over the mini guest in `mode=loop` (it never ends by itself),
/// tracing the request's functions with traps, keeping `max_events`.
fn looping_session(max_events: u64) -> (std::path::PathBuf, Session) {
    let elf = mini_elf();
    let kernel = vmm::boot::KernelFile::open(&elf).unwrap();
    let image = kernel_image(&kernel, Given::Nothing).unwrap().image;
    let plan = TracePlan::build(image, &request(ModeChoice::Trap, false)).unwrap();
    let capture = Capture::default();
    let mut cfg = mini_config(&elf, 2, "mode=loop", &capture);
    cfg.kernel = kernel;
    let vm = vmm::Vm::create(cfg).unwrap();
    let session = Session::start(vm, plan, Recording::memory(max_events)).unwrap();
    (elf, session)
}

/// A duration ends the session: detached under a pause first, then the
/// guest stopped as the duration ran out (the mini guest in `mode=loop`
/// never ends).
#[test]
fn a_duration_detaches_then_stops_the_guest() {
    let (_, mut session) = looping_session(10_000_000);
    let mut seen = Seen::default();
    let attached = session
        .trace(Some(Duration::from_millis(300)), &mut seen)
        .unwrap();
    assert!(attached.is_some());
    assert!(seen.tracing > 0, "the observer saw the trace run");
    assert!(
        !session.tracer().is_attached(),
        "detached before the guest stopped"
    );
    let ended = session.end(&vmm::advice::Plain);
    assert_eq!(ended.report.reason, vmm::StopReason::DurationReached);
    let calls: u64 = ended.summary.counts.iter().flatten().sum();
    assert!(calls > 0, "the loop was traced");
    assert_eq!(ended.summary.events.len() as u64, calls);
}

/// A selection that matches nothing is refused before any guest exists,
/// in the library's words: no flag named.
#[test]
fn a_selection_that_matches_nothing_is_refused_in_the_librarys_words() {
    let elf = mini_elf();
    let kernel = vmm::boot::KernelFile::open(&elf).unwrap();
    let image = kernel_image(&kernel, Given::Nothing).unwrap().image;
    let mut req = request(ModeChoice::Trap, false);
    req.trace = vec!["no_such_function_anywhere".to_string()];
    let err = TracePlan::build(image, &req)
        .err()
        .expect("refused")
        .to_string();
    assert!(!err.contains("--"), "{err}");
}

/// The guest's text, read through its physical mapping.
fn text_bytes(mem: &vm_memory::GuestMemoryMmap, kernel: &std::path::Path) -> Vec<u8> {
    use vm_memory::{Bytes, GuestAddress};
    let (start, end) = (elf_symbol(kernel, "_stext"), elf_symbol(kernel, "_etext"));
    let mut buf = vec![0u8; (end - start) as usize];
    let phys = vmm::layout::kernel_virt_to_phys(start).unwrap();
    mem.read_slice(&mut buf, GuestAddress(phys)).unwrap();
    buf
}

/// A session dropped without `end` (a caller's early return) still stops
/// the guest and restores every site it patched.
#[test]
fn a_session_dropped_without_end_restores_every_site() {
    let (elf, mut session) = looping_session(1_000_000);
    let mem = session.running().memory().clone();
    let before = text_bytes(&mem, &elf);
    {
        let (running, tracer) = session.parts();
        let paused = running.pause_all();
        tracer.attach(&paused).unwrap().attached().unwrap();
    }
    assert_ne!(text_bytes(&mem, &elf), before, "the attach patched sites");
    drop(session);
    assert_eq!(text_bytes(&mem, &elf), before, "every site restored");
}
