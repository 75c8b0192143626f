//! Arguments and return values of traced calls, on real KVM with the mini
//! guest's `args=1` functions (guest/mini/README.md "args=1"): they sum what
//! they receive and return, per vCPU, and print the sums; vmtrace's recorded
//! argument registers and return values, read as the C types hold them,
//! must sum to exactly the same, in trap and exitless modes, with and
//! without the function graph.

mod common;

use std::collections::BTreeMap;

use common::*;
use tracer::kernel::find::{kernel_image, Given};
use tracer::plan::{Mode, ModeChoice, Request, TracePlan, ValuePlan};
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

fn run(mode: ModeChoice, graph: bool) -> (Trace, String) {
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
        args: true,
        retval: graph,
        stack: Vec::new(),
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
        ModeChoice::Exitless => Mode::Exitless,
        _ => Mode::Trap,
    };
    assert_eq!(plan.mode, want);
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
/// the sums by name (`ret` for the return values).
fn sums(trace: &Trace) -> Sums<i128> {
    let mut raw: Sums<(Ty, i128)> = BTreeMap::new();
    for e in &trace.events {
        let f = trace.functions[e.func as usize].name.clone();
        let (params, ret) = layout(&f);
        let entry = raw.entry((e.cpu, f)).or_default();
        if e.is_return() {
            if let Some(ty) = ret {
                let s = entry.1.entry("ret".into()).or_insert((ty, 0));
                s.1 += ty.value(e.data);
            }
            continue;
        }
        entry.0 += 1;
        let regs = trace.args_of(e).expect("every entry has its arguments");
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
    let (trace, console) = run(mode, graph);
    assert_eq!(trace.meta.events_dropped, 0);
    let guest = parse_mini_args(&console);
    let got = sums(&trace);
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
        let shown = layout(f).0.len() + usize::from(graph && layout(f).1.is_some());
        assert_eq!(sums.len(), shown, "{f}: {sums:?}");
    }
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
