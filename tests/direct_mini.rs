//! Direct entries on real KVM with the mini guest (docs/direct.md): built
//! without ftrace (`mini-noftrace`, no `__mcount_loc`), its functions are
//! entered through jumps to vmtrace's stubs, in trap and exitless modes,
//! with and without the function graph. Counts must equal what the guest
//! counted itself, and the text must be the file's again after detach.
//! On the ftrace build, `--entry direct` traces what ftrace traces, and a
//! `notrace` function too.

mod common;

use std::path::Path;

use common::*;
use tracer::kernel::find::{kernel_image, Given};
use tracer::plan::entry::{EntryChoice, EntryKind};
use tracer::plan::{ModeChoice, Note, Request, TracePlan};
use tracer::session::{Observer, Recording, Session};

/// Told nothing.
struct Quiet;
impl Observer for Quiet {}

fn request(trace: &[&str], mode: ModeChoice, graph: bool, entry: EntryChoice) -> Request {
    Request {
        trace: trace.iter().map(|s| s.to_string()).collect(),
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
        entry,
        events: Vec::new(),
        module_events: Vec::new(),
    }
}

/// The `.text` bytes of the ELF file at `path` (what the guest loads).
fn file_text(path: &Path) -> (u64, Vec<u8>) {
    use object::{Object, ObjectSection};
    let bytes = std::fs::read(path).unwrap();
    let elf = object::File::parse(bytes.as_slice()).unwrap();
    let text = elf.section_by_name(".text").unwrap();
    (text.address(), text.data().unwrap().to_vec())
}

/// The guest's `.text`, read through its physical mapping.
fn guest_text(mem: &vm_memory::GuestMemoryMmap, start: u64, len: usize) -> Vec<u8> {
    use vm_memory::{Bytes, GuestAddress};
    let mut buf = vec![0u8; len];
    let phys = vmm::layout::kernel_virt_to_phys(start).unwrap();
    mem.read_slice(&mut buf, GuestAddress(phys)).unwrap();
    buf
}

/// Trace `req` on `elf` with `cmdline`; the counts per (CPU, function)
/// (and with the graph the returns) must be `want`'s, the text the
/// file's after the detach. Returns the trace's function names.
fn run(elf: &Path, req: &Request, cmdline: &str, want: impl Fn(u32, &str) -> u64) -> Vec<String> {
    let kernel = vmm::boot::KernelFile::open(elf).unwrap();
    let image = kernel_image(&kernel, Given::Nothing).unwrap().image;
    let plan = TracePlan::build(image, req).unwrap();
    assert_eq!(plan.plan.entry, EntryKind::Direct);
    assert!(plan.notes.iter().any(|n| matches!(n, Note::Direct(_))));
    let want_mode = match req.mode {
        ModeChoice::Exitless => "exitless",
        _ => "trap",
    };
    assert_eq!(plan.mode.name(), want_mode);
    let capture = Capture::default();
    let mut cfg = mini_config(elf, 2, cmdline, &capture);
    cfg.kernel = kernel;
    let vm = vmm::Vm::create(cfg).unwrap();
    let mut session = Session::start(vm, plan, Recording::memory(10_000_000)).unwrap();
    let mem = session.running().memory().clone();
    let (start, text) = file_text(elf);
    let attached = session.trace(None, &mut Quiet).unwrap().expect("attached");
    assert_eq!(attached.counts.skipped_other, 0);
    let ended = session.end(&vmm::advice::Plain);
    assert_eq!(
        ended.report.reason,
        vmm::StopReason::PowerOff(0),
        "{}",
        capture.text()
    );
    let detached = ended.detached.unwrap();
    assert_eq!(detached.restored, ended.attached, "every site restored");
    assert!(
        guest_text(&mem, start, text.len()) == text,
        "the text is the file's again, byte for byte"
    );
    ended.drained.unwrap();
    let (guest, done) = parse_mini_console(&capture.text());
    assert_eq!(done, vec![0, 1], "{}", capture.text());
    let trace = ended.summary;
    for (f, func) in trace.functions.iter().enumerate() {
        for cpu in 0..2u32 {
            let theirs = guest
                .get(&(cpu, func.name.clone()))
                .copied()
                .unwrap_or_else(|| want(cpu, &func.name));
            assert_eq!(
                trace.counts[f][cpu as usize], theirs,
                "{} on cpu{cpu}",
                func.name
            );
            if req.graph {
                assert_eq!(
                    trace.returns[f][cpu as usize], theirs,
                    "{} returns",
                    func.name
                );
            }
        }
    }
    let calls: u64 = trace.counts.iter().flatten().sum();
    let per_call = if req.graph { 2 } else { 1 };
    assert_eq!(trace.events.len() as u64, calls * per_call);
    trace.functions.iter().map(|f| f.name.clone()).collect()
}

const WORK: [&str; 2] = ["hrtimer_*", "schedule"];

fn noftrace(mode: ModeChoice, graph: bool) {
    let elf = mini_variant_elf("mini-noftrace");
    let req = request(&WORK, mode, graph, EntryChoice::Auto);
    let names = run(&elf, &req, "iters=400", |_, f| panic!("{f} is not counted"));
    assert_eq!(names.len(), 5, "{names:?}");
}

#[test]
fn direct_entries_count_exactly_with_traps() {
    noftrace(ModeChoice::Trap, false);
}

#[test]
fn direct_entries_count_exactly_exitless() {
    noftrace(ModeChoice::Exitless, false);
}

#[test]
fn direct_entries_hook_every_return_with_traps() {
    noftrace(ModeChoice::Trap, true);
}

#[test]
fn direct_entries_hook_every_return_exitless() {
    noftrace(ModeChoice::Exitless, true);
}

/// On the ftrace build: `--entry direct` selects the functions `--entry
/// ftrace` does, and traces `mini_account`, which is `notrace` (called
/// at every third iteration: 134 times in 400).
#[test]
fn on_an_ftrace_kernel_direct_entries_trace_a_notrace_function_too() {
    let elf = mini_elf();
    let load = || {
        let kernel = vmm::boot::KernelFile::open(&elf).unwrap();
        kernel_image(&kernel, Given::Nothing).unwrap().image
    };
    let names = |entry| {
        let plan = TracePlan::build(load(), &request(&WORK, ModeChoice::Trap, false, entry));
        let plan = plan.unwrap().plan;
        let mut n: Vec<String> = plan
            .funcs
            .iter()
            .map(|&f| plan.image.functions[f].name.clone())
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(EntryChoice::Direct), names(EntryChoice::Ftrace));
    let ftrace = TracePlan::build(
        load(),
        &request(
            &["mini_account"],
            ModeChoice::Trap,
            false,
            EntryChoice::Ftrace,
        ),
    );
    let err = ftrace
        .err()
        .expect("mini_account has no ftrace site")
        .to_string();
    assert!(err.contains("mini_account"), "{err}");
    for mode in [ModeChoice::Trap, ModeChoice::Exitless] {
        let req = request(
            &["mini_account", "schedule"],
            mode,
            true,
            EntryChoice::Direct,
        );
        let names = run(&elf, &req, "iters=400", |_, f| match f {
            "mini_account" => 134,
            f => panic!("{f} is not counted"),
        });
        assert_eq!(names.len(), 2);
    }
}

/// The functions crafted for the rules (`direct=1`, guest/mini/direct.S):
/// the safe ones (a RIP-relative first instruction, ENDBR64 first, a short
/// `je` widened in the stub) are traced exactly, in both modes and with
/// the graph; the guest checks each one's result, so a bad relocation
/// stops it. The refused ones are named with their rule.
#[test]
fn the_crafted_functions_are_traced_exactly_or_refused_by_rule() {
    let elf = mini_variant_elf("mini-noftrace");
    let kernel = vmm::boot::KernelFile::open(&elf).unwrap();
    let image = kernel_image(&kernel, Given::Nothing).unwrap().image;
    let plan = TracePlan::build(
        image,
        &request(&["direct_*"], ModeChoice::Trap, false, EntryChoice::Auto),
    );
    let plan = plan.unwrap().plan;
    let direct = plan.direct.as_ref().unwrap();
    let refused = |name: &str| {
        let f = plan
            .image
            .functions
            .iter()
            .position(|f| f.name == name)
            .unwrap();
        direct.refused[&f].rule()
    };
    assert_eq!(refused("direct_jump_into"), "jump-into-site");
    assert_eq!(refused("direct_table"), "indirect-jump");
    assert_eq!(refused("direct_extable"), "ex-table");
    for (mode, graph) in [
        (ModeChoice::Trap, false),
        (ModeChoice::Exitless, false),
        (ModeChoice::Exitless, true),
    ] {
        let mut req = request(&["direct_*"], mode, graph, EntryChoice::Auto);
        // The guest's own report of a wrong result, never called.
        req.notrace = vec!["direct_bad".to_string()];
        let mut names = run(&elf, &req, "iters=100 direct=1", |_, f| {
            panic!("{f} is not counted by the guest")
        });
        names.sort();
        assert_eq!(names, ["direct_endbr", "direct_jcc", "direct_riprel"]);
    }
}

/// A glob that matches only refused functions names each one's reason,
/// in one line, exit status 2, before any guest runs.
#[test]
fn a_refused_function_is_named_with_its_rule() {
    let elf = mini_variant_elf("mini-noftrace");
    assert_bad_input(
        &["--kernel", elf.to_str().unwrap(), "--trace", "halt_forever"],
        "--trace 'halt_forever' matches no traceable function (halt_forever: refused for a \
         direct entry: too short: 4 bytes of instructions, the jump needs 5)",
    );
}
