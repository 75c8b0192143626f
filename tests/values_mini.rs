//! Arguments and return values of traced calls, on real KVM with the mini
//! guest's `args=1` functions (guest/mini/README.md "args=1"): they sum what
//! they receive and return, per vCPU, and print the sums; vmtrace's recorded
//! argument registers and return values, read as the C types hold them,
//! must sum to exactly the same, in trap and exitless modes, with and
//! without the function graph; with `--args=args_six`, args_six's entries
//! alone carry them.

mod common;

use std::collections::BTreeMap;

use common::*;
use tracer::kernel::find::{kernel_image, Given};
use tracer::plan::{ModeChoice, Request, TracePlan, ValuePlan};
use tracer::session::{Recording, Session};
use tracer::trace::model::Trace;

const CPUS: u32 = 2;
const CMDLINE: &str = "iters=150 args=1";

/// How a C type holds a value passed in a 64-bit register.
#[derive(Clone, Copy)]
enum Ty {
    U64,
    I64,
    U32,
    I32,
    U8,
}

impl Ty {
    /// The value as the guest's sums count it: sign-extended when signed.
    fn value(self, reg: u64) -> i128 {
        match self {
            Ty::U64 => i128::from(reg),
            Ty::I64 => i128::from(reg as i64),
            Ty::U32 => i128::from(reg as u32),
            Ty::I32 => i128::from(reg as u32 as i32),
            Ty::U8 => i128::from(reg as u8),
        }
    }

    /// A wrapping 64-bit sum, printed as the guest prints this type.
    fn wrap(self, sum: i128) -> i128 {
        let w = sum as u64;
        match self {
            Ty::U64 | Ty::U32 | Ty::U8 => i128::from(w),
            Ty::I64 | Ty::I32 => i128::from(w as i64),
        }
    }
}

/// Each function's printed argument names with their register and type,
/// and its return type (None: void). `args_seven`'s seventh is on the stack.
fn layout(f: &str) -> (Vec<(&'static str, usize, Ty)>, Option<Ty>) {
    use Ty::*;
    match f {
        "args_six" => (
            vec![
                ("a", 0, U64),
                ("b", 1, I32),
                ("t", 2, U64),
                ("s", 3, U32),
                ("ch", 4, U8),
                ("e", 5, I64),
            ],
            Some(I64),
        ),
        "args_errno" => (vec![("n", 0, U32)], Some(I32)),
        "args_void" => (vec![("n", 0, U64)], None),
        "args_struct" => (
            vec![("p.key", 0, U64), ("p.val", 1, U32), ("after", 2, I32)],
            Some(I64),
        ),
        "args_seven" => (
            vec![
                ("a1", 0, I32),
                ("a2", 1, I64),
                ("a3", 2, U64),
                ("a4", 3, I32),
                ("a5", 4, I64),
                ("a6", 5, U64),
            ],
            Some(I64),
        ),
        other => panic!("not an args=1 function: {other}"),
    }
}

fn run(mode: ModeChoice, graph: bool, args: &str) -> (Trace, String) {
    let elf = mini_elf();
    let kernel = vmm::boot::KernelFile::open(&elf).unwrap();
    let image = kernel_image(&kernel, Given::Nothing).unwrap().image;
    let request = Request {
        trace: vec!["args_*".to_string()],
        notrace: Vec::new(),
        graph,
        mode,
        ring_events: None,
        cpus: CPUS as usize,
        emulator_host: false,
        linux: false,
        pids: Vec::new(),
        comm: None,
        args: vec![args.to_string()],
        retval: graph,
        stack: Vec::new(),
        entry: Default::default(),
        events: Vec::new(),
        module_events: Vec::new(),
    };
    let plan = TracePlan::build(image, &request).unwrap();
    assert_eq!(
        plan.plan.values,
        ValuePlan {
            args: true,
            retval: graph
        }
    );
    let want = match mode {
        ModeChoice::Exitless => "exitless",
        _ => "trap",
    };
    assert_eq!(plan.mode.name(), want);
    let capture = Capture::default();
    let mut cfg = mini_config(&elf, u64::from(CPUS), CMDLINE, &capture);
    cfg.kernel = kernel;
    let vm = vmm::Vm::create(cfg).unwrap();
    let mut session = Session::start(vm, plan, Recording::memory(10_000_000)).unwrap();
    session.trace(None, &mut Quiet).unwrap().expect("attached");
    let ended = session.end(&vmm::advice::Plain);
    assert_eq!(
        ended.report.reason,
        vmm::StopReason::PowerOff(0),
        "{}",
        capture.text()
    );
    ended.drained.unwrap();
    (ended.summary, capture.text())
}

struct Quiet;
impl tracer::session::Observer for Quiet {}

/// (cpu, function) -> calls, and sums by name.
type Sums<V> = BTreeMap<(u32, String), (u64, BTreeMap<String, V>)>;

/// The guest's sums, rebuilt from the trace: (cpu, function) -> calls and
/// the sums by name (`ret` for the return values). The entries of the
/// functions `with_args` selects carry arguments, the others none.
fn sums(trace: &Trace, with_args: impl Fn(&str) -> bool) -> Sums<i128> {
    let mut raw: Sums<(Ty, i128)> = BTreeMap::new();
    for e in &trace.events {
        let f = trace.functions[e.func as usize].name.clone();
        let (params, ret) = layout(&f);
        let selected = with_args(&f);
        let entry = raw.entry((e.cpu, f.clone())).or_default();
        if e.is_return() {
            if let Some(ty) = ret {
                let s = entry.1.entry("ret".into()).or_insert((ty, 0));
                s.1 += ty.value(e.data);
            }
            continue;
        }
        entry.0 += 1;
        if !selected {
            assert_eq!((e.data, trace.args_of(e)), (0, None), "{f}'s entry");
            continue;
        }
        let regs = trace
            .args_of(e)
            .expect("every selected entry has its arguments");
        for (name, reg, ty) in params {
            let s = entry.1.entry(name.into()).or_insert((ty, 0));
            s.1 += ty.value(regs[reg]);
        }
    }
    raw.into_iter()
        .map(|(k, (calls, m))| {
            let m = m.into_iter().map(|(n, (ty, v))| (n, ty.wrap(v))).collect();
            (k, (calls, m))
        })
        .collect()
}

fn check(mode: ModeChoice, graph: bool) {
    check_selected(mode, graph, "*");
}

/// `--args=GLOB`: the functions `glob` matches record their arguments
/// (summed exactly), the others none.
fn check_selected(mode: ModeChoice, graph: bool, glob: &str) {
    let (trace, console) = run(mode, graph, glob);
    assert_eq!(trace.meta.events_dropped, 0);
    let guest = parse_mini_args(&console);
    let with_args = |f: &str| glob == "*" || f == glob;
    let got = sums(&trace, with_args);
    assert_eq!(guest.len(), got.len(), "{mode:?}: {got:?}");
    for ((cpu, f), want) in &guest {
        let (calls, sums) = &got[&(*cpu, f.clone())];
        assert_eq!(*calls, want.calls, "{mode:?} {f} on cpu {cpu}");
        for (name, v) in sums {
            assert_eq!(
                want.sums.get(name),
                Some(v),
                "{mode:?} graph={graph}: {f}'s {name} on cpu {cpu}"
            );
        }
        // Every argument the guest sums in a register, and (with the graph)
        // the return value, was checked.
        let args = if with_args(f) { layout(f).0.len() } else { 0 };
        let shown = args + usize::from(graph && layout(f).1.is_some());
        assert_eq!(sums.len(), shown, "{f}: {sums:?}");
    }
    if glob != "*" {
        check_outputs(&trace);
    }
}

/// `vmtrace script` and the CSV show `args_six(a=...)` at each of its
/// entries, and no other function's arguments.
fn check_outputs(trace: &Trace) {
    use tracer::trace::export::{script::write_script, write_csv};
    let entries = |f: &str| {
        trace
            .events
            .iter()
            .filter(|e| !e.is_return() && trace.functions[e.func as usize].name == f)
            .count()
    };
    let mut script = Vec::new();
    write_script(trace, &mut script).unwrap();
    let script = String::from_utf8(script).unwrap();
    let mut csv = Vec::new();
    write_csv(trace, &mut csv).unwrap();
    let csv = String::from_utf8(csv).unwrap();
    assert!(entries("args_six") > 0);
    for text in [&script, &csv] {
        assert_eq!(text.matches("(a=").count(), entries("args_six"));
        // The others' first arguments: n, p.key, a1.
        for other in ["(n=", "(p.", "(a1="] {
            assert_eq!(text.matches(other).count(), 0, "{other}");
        }
    }
    // The others' entries are named plainly.
    assert!(entries("args_void") > 0);
    assert!(script.contains("args_void"));
}

#[test]
fn arguments_are_exact_in_trap_mode() {
    check(ModeChoice::Trap, false);
}

#[test]
fn arguments_are_exact_in_exitless_mode() {
    check(ModeChoice::Exitless, false);
}

#[test]
fn arguments_and_return_values_are_exact_with_the_graph_in_trap_mode() {
    check(ModeChoice::Trap, true);
}

#[test]
fn arguments_and_return_values_are_exact_with_the_graph_in_exitless_mode() {
    check(ModeChoice::Exitless, true);
}

#[test]
fn only_the_selected_functions_arguments_are_recorded_in_trap_mode() {
    check_selected(ModeChoice::Trap, false, "args_six");
}

#[test]
fn only_the_selected_functions_arguments_are_recorded_in_exitless_mode() {
    check_selected(ModeChoice::Exitless, false, "args_six");
}

/// The shared body stores every call's arguments; the drainer keeps the
/// selected sites'.
#[test]
fn only_the_selected_functions_arguments_are_kept_with_the_graph_in_exitless_mode() {
    check_selected(ModeChoice::Exitless, true, "args_six");
}
