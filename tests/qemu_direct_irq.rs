//! A guest context really inside a direct site's displaced bytes, with an
//! interrupt handler running over it, on the project's 6.1 guest without
//! ftrace (`guest/build.sh linux-noftrace`) booted in QEMU/TCG on one vCPU
//! (`nokaslr`: link addresses are running ones). `__x64_sys_getpid` begins
//! `xor %edx,%edx; mov $1,%esi`: a direct entry displaces both (7 bytes),
//! and a vCPU at +2 is inside them.
//!
//! Through a gdbstub of the test's own (QMP `gdbserver`, QEMU's breakpoints:
//! guest memory unwritten), the worker's getpid is stopped at +2, and an
//! interrupt made pending there: a line on the serial console (the 8250's
//! IRQ, or the timer's if it comes first), then QMP `inject-nmi`. Each is
//! taken before the instruction at +2 runs, and the vCPU is stopped in its
//! handler: on the CPU's IRQ stack (`__common_interrupt`,
//! `__sysvec_apic_timer_interrupt`), then on the NMI's exception stack
//! (`exc_nmi`); the handler's own `pt_regs` argument says that the
//! interrupted RIP is +2. There the direct attach's context check
//! (`session::direct::contexts::find`, over the stopped QEMU's memory and
//! registers as an attach reads them) finds that context: from the IRQ
//! stack only through the link at its top to the task stack (without the
//! IRQ stack's bounds it finds nothing), from the NMI stack in the frame
//! the CPU pushed and the entry code's copies of it; and with an NMI taken
//! over the IRQ handler, through the chain NMI stack, IRQ stack, task
//! stack (again nothing without the IRQ stack's bounds). The tracer's own
//! attach, in that stop, waits (`DirectBusy`: one site, vCPU 0, +2) and
//! writes nothing (every byte is compared after). Once the handler has
//! returned and the same call is past the displaced bytes, the check finds
//! nothing. The stub closed, the guest runs on (the getpid loop ends with
//! its count, the kernel saw the NMI), memory as found; then `vmtrace
//! attach --entry direct` traces `__x64_sys_getpid` and counts the worker's
//! calls exactly.
//!
//! On this kernel (`PREEMPT_NONE`, tinyconfig's, as on all the project's
//! guests) no task is ever switched out with an interrupted context on its
//! stack: the task case is Debian's (`tests/qemu_direct.rs` runs its attach
//! under load), and the crafted `contexts` unit tests.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::attach::{count_of, Attach};
use common::guard::{assert_no_gdbstub, assert_runs_on, assert_same, Kernel};
use common::qemu::{QemuGuest, QemuOpts, COMMAND_TIMEOUT};
use common::{root, s};
use tracer::kernel::btf::KernelBtf;
use tracer::kernel::kaslr::KernelOffset;
use tracer::kernel::stack_bounds::StackLayout;
use tracer::kernel::symbols::KernelImage;
use tracer::plan::entry::EntryChoice;
use tracer::plan::Plan;
use tracer::qemu::gdb::{Gdb, GdbAddr};
use tracer::qemu::guest::{QemuGuest as Stub, QemuStop};
use tracer::qemu::procmem::ProcRam;
use tracer::qemu::qmp::Qmp;
use tracer::qemu::queries::Queries;
use tracer::session::direct::contexts::{
    self, Inside, SiteContexts, StackWindow, Stacks, VcpuRegs,
};
use tracer::session::direct::DirectSites;
use tracer::session::{Attach as Attempt, NotReady, Tracer};
use vmm::gva::{AddressSpace, PagingMode};
use vmm::Stopped;

/// The traced function, and the names the report may give it (an alias).
const F: &str = "__x64_sys_getpid";
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];
/// Its first instruction's length (`xor %edx,%edx`), and where the third
/// begins, past the displaced bytes (`mov %gs:...,%rdi`).
const INSIDE: u64 = 2;
const PAST: u64 = 7;
/// The handlers that run on the IRQ stack (`call_on_irqstack`): a device
/// IRQ's and the local APIC timer's.
const IRQ_HANDLERS: [&str; 2] = ["__common_interrupt", "__sysvec_apic_timer_interrupt"];
/// The NMI handler, on the NMI's exception stack.
const NMI_HANDLER: &str = "exc_nmi";
/// `pt_regs.ip` (arch/x86/include/asm/ptrace.h: 16 words before it).
const PT_REGS_IP: u64 = 16 * 8;
/// `pt_regs.sp`.
const PT_REGS_SP: u64 = 19 * 8;
/// RFLAGS.IF.
const IF: u64 = 1 << 9;
/// getpid calls the worker makes while the test stops it.
const LOOP: u64 = 200_000;
/// Tries at stopping an IRQ exactly at +2: one made pending there is taken
/// there; a guard against one the vCPU would hold back.
const TRIES: u32 = 20;
/// A line of blanks: 16 bytes with its newline, the 8250's FIFO.
const BLANKS: &str = "               ";
/// A guard for each stop (far above any).
const HANG: Duration = Duration::from_secs(120);
const TIMEOUT: Duration = Duration::from_secs(10);

/// guest/out/linux-noftrace/{bzImage,vmlinux}, copied from the cache (or
/// built) by guest/build.sh.
fn noftrace_guest() -> (PathBuf, PathBuf) {
    let st = std::process::Command::new("bash")
        .arg(root().join("guest/build.sh"))
        .arg("linux-noftrace")
        .status()
        .unwrap();
    assert!(st.success(), "guest/build.sh linux-noftrace failed");
    let dir = root().join("guest/out/linux-noftrace");
    (dir.join("bzImage"), dir.join("vmlinux"))
}

/// What the check needs of the kernel: the site's displaced range, where
/// its stacks are; and a tracer of that site, for its attach.
struct Subject {
    tracer: Tracer,
    layout: StackLayout,
    ranges: Vec<(u64, u64)>,
    f: u64,
}

impl Subject {
    fn new(vmlinux: &Path) -> Subject {
        let image = KernelImage::load_without_sites(vmlinux).unwrap();
        let btf = KernelBtf::from_image(&image).unwrap();
        let layout = StackLayout::find(&image, Some(&btf));
        let plan = Plan::with_entry(image, &[F.to_string()], &[], EntryChoice::Direct).unwrap();
        let direct = plan.direct.as_ref().unwrap();
        assert!(direct.preempted.is_none(), "a preemptible kernel");
        let ranges = DirectSites::of(&plan).unwrap().ranges(0);
        let f = plan.image.symbol(F).unwrap().addr;
        assert_eq!(ranges, [(f, f + PAST)], "{F}'s displaced bytes");
        let (tracer, _) = Tracer::new(plan, 1, 1000);
        Subject {
            tracer,
            layout,
            ranges,
            f,
        }
    }

    fn sym(&self, name: &str) -> u64 {
        self.tracer.plan().image.symbol(name).unwrap().addr
    }

    /// The check of an attach under `stop`, the stacks it saw, and the
    /// page-table root it read them through.
    fn check(&self, stop: &QemuStop<'_>) -> (SiteContexts, Stacks, u64) {
        let cr3 = stop.snapshot(0).unwrap().sregs.cr3;
        let ram = stop.ram();
        let mut space = AddressSpace::new(&**ram, cr3, PagingMode::Level4);
        let stacks = Stacks::read(&mut space, &self.layout, KernelOffset::NONE, stop.cpus());
        let vcpus = VcpuRegs::of(stop);
        let found = contexts::find(&mut space, &self.ranges, &vcpus, &stacks, &[]);
        (found, stacks, cr3)
    }

    /// The tracer's whole attach under `stop`, called only once the check
    /// found the context inside (else it would write): it waits, saying
    /// where.
    fn attach_waits(&mut self, stop: &QemuStop<'_>, at: u64) {
        let attempt = self.tracer.attach(stop).unwrap();
        let want = NotReady::DirectBusy {
            sites: 1,
            who: "vCPU 0".into(),
            at,
        };
        assert!(
            matches!(&attempt, Attempt::NotReady(why) if *why == want),
            "{attempt:?}"
        );
    }
}

/// A word of guest memory, through the page tables at `cr3`.
fn word(stop: &QemuStop<'_>, cr3: u64, va: u64) -> u64 {
    let ram = stop.ram();
    let mut space = AddressSpace::new(&**ram, cr3, PagingMode::Level4);
    space
        .read_u64(va)
        .unwrap_or_else(|e| panic!("read {va:#x}: {e}"))
}

/// Resume the VM and wait for the next breakpoint's stop.
fn run_to<'a>(stub: &'a Stub, stop: QemuStop<'a>) -> QemuStop<'a> {
    stop.resume().unwrap();
    let hit = stub
        .wait_hit(HANG)
        .unwrap()
        .unwrap_or_else(|| panic!("no breakpoint hit within {HANG:?}"));
    assert_eq!(hit.reply.signal, 5, "{:?}", hit.reply);
    // Kept stopped (a hit resumes when dropped), as a stop of every vCPU
    // with their registers, which is what an attach works in.
    hit.hold();
    stub.stop(true).unwrap()
}

fn rip(stop: &QemuStop<'_>) -> u64 {
    stop.snapshot(0).unwrap().regs.rip
}

#[test]
fn an_interrupt_over_a_context_inside_the_displaced_bytes_is_found() {
    let (bz, vmlinux) = noftrace_guest();
    let mut subject = Subject::new(&vmlinux);
    let kernel = Kernel::from_bzimage(&bz);
    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.clone(),
        cpus: 1,
        append: "nokaslr".into(),
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    let qmp_path = guest.qmp_socket();
    let (before, _) = kernel.read(qmp_path);

    let mut qmp = Qmp::connect(qmp_path, TIMEOUT).unwrap();
    let sock = guest.dir().join("gdb.sock");
    qmp.open_gdbserver(&format!("unix:{},server=on,wait=off", sock.display()))
        .unwrap();
    let ram = ProcRam::open(qmp.pid().unwrap(), &qmp.ram_layout().unwrap()).unwrap();
    // QEMU stops the VM as the stub connects.
    let gdb = Gdb::connect(&GdbAddr::Unix(sock), TIMEOUT).unwrap();
    let stub = Stub::new(gdb, ram).unwrap();
    let stop = stub.stop(true).unwrap();
    stop.set_breakpoint(subject.f + INSIDE).unwrap();
    guest.send_line(&format!("go getpid {LOOP}"));
    let stop = irq_over_inside(&mut subject, &stub, stop, &guest, &mut qmp);
    let stop = nmi_over_inside(&mut subject, &stub, stop, &mut qmp);

    // Let go: the stub closed, the guest runs on.
    stop.detach().unwrap();
    drop(stub);
    qmp.close_gdbserver().unwrap();
    drop(qmp);
    let done = guest
        .wait_for(&format!("workload: done getpid {LOOP} "), COMMAND_TIMEOUT)
        .unwrap();
    assert!(!done.contains("unexpected="), "{done}");
    assert!(
        guest.console().contains("NMI received for unknown reason"),
        "the kernel took the NMI"
    );
    assert_no_gdbstub(qmp_path);
    let (after, _) = kernel.read(qmp_path);
    assert_same(&before, &after, "after the stops");

    // And a real direct attach counts exactly.
    let args = ["--kernel", s(&bz), "--entry", "direct"];
    let args = [&args[..], &["--format", "json", "--trace", F]].concat();
    let a = Attach::start(qmp_path, &args).attached();
    guest.go("getpid", 100).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert_eq!(count_of(&e.counts(), &GETPID), 100, "{}", e.stdout);
    let (after, _) = kernel.read(qmp_path);
    assert_same(&before, &after, "after the attach");
    assert_no_gdbstub(qmp_path);
    assert_runs_on(&guest, w.worker);
}

/// The context the check must find: the interrupted RIP, on a stack.
fn interrupted(subject: &Subject) -> Inside {
    Inside {
        k: 0,
        cpu: Some(0),
        at: subject.f + INSIDE,
        on_stack: true,
    }
}

/// From a stop with a breakpoint at +2: an IRQ's handler stopped on the
/// IRQ stack over a context at +2, the check and the attach there, then
/// the same call past the displaced bytes (the stop returned is there).
fn irq_over_inside<'a>(
    subject: &mut Subject,
    stub: &'a Stub,
    stop: QemuStop<'a>,
    guest: &QemuGuest,
    qmp: &mut Qmp,
) -> QemuStop<'a> {
    let (stop, regs) = irq_at_inside(subject, stub, stop, guest, qmp);
    let (found, stacks, cr3) = subject.check(&stop);
    let rsp = stop.snapshot(0).unwrap().regs.rsp;
    assert!(
        matches!(stacks.window(rsp), StackWindow::Irq { .. }),
        "RSP {rsp:#x} not on an IRQ stack: {stacks:x?}"
    );
    assert_eq!(found.inside, [interrupted(subject)], "{found:x?}");
    assert_eq!(found.unreadable, None);
    subject.attach_waits(&stop, subject.f + INSIDE);
    // Only through the IRQ stack's link: taken for a task stack, the IRQ
    // stack alone holds no such context.
    let blind = Stacks {
        irq: Vec::new(),
        ..stacks.clone()
    };
    let mut space = AddressSpace::new(&**stop.ram(), cr3, PagingMode::Level4);
    let vcpus = VcpuRegs::of(&stop);
    let without = contexts::find(&mut space, &subject.ranges, &vcpus, &blind, &[]);
    assert!(without.inside.is_empty(), "{without:x?}");
    let task_sp = word(&stop, cr3, regs + PT_REGS_SP);
    let stop = nmi_over_irq(subject, stub, stop, qmp);
    let stop = past_is_clean(subject, stub, stop);
    assert_eq!(stop.snapshot(0).unwrap().regs.rsp, task_sp, "the same call");
    stop
}

/// From a stop at an IRQ handler's entry over a context at +2: an NMI
/// taken there, its handler stopped. The check follows the NMI stack's
/// frame to the IRQ stack, and its link to the task stack, where the
/// context at +2 is: found, and only through both.
fn nmi_over_irq<'a>(
    subject: &mut Subject,
    stub: &'a Stub,
    stop: QemuStop<'a>,
    qmp: &mut Qmp,
) -> QemuStop<'a> {
    let handler = rip(&stop);
    let nmi = subject.sym(NMI_HANDLER);
    stop.set_breakpoint(nmi).unwrap();
    qmp.execute("inject-nmi", None).unwrap();
    let stop = run_to(stub, stop);
    assert_eq!(rip(&stop), nmi);
    stop.clear_breakpoint(nmi).unwrap();
    let (found, stacks, cr3) = subject.check(&stop);
    let regs = stop.snapshot(0).unwrap().regs.rdi;
    assert_eq!(word(&stop, cr3, regs + PT_REGS_IP), handler);
    assert_eq!(found.inside, [interrupted(subject)], "{found:x?}");
    assert_eq!(found.unreadable, None);
    subject.attach_waits(&stop, subject.f + INSIDE);
    let blind = Stacks {
        irq: Vec::new(),
        ..stacks
    };
    let mut space = AddressSpace::new(&**stop.ram(), cr3, PagingMode::Level4);
    let vcpus = VcpuRegs::of(&stop);
    let without = contexts::find(&mut space, &subject.ranges, &vcpus, &blind, &[]);
    assert!(without.inside.is_empty(), "{without:x?}");
    stop
}

/// Stops at +2 and makes an IRQ pending there until one is taken at +2:
/// the stop in its handler, and the handler's `pt_regs`.
fn irq_at_inside<'a>(
    subject: &Subject,
    stub: &'a Stub,
    mut stop: QemuStop<'a>,
    guest: &QemuGuest,
    qmp: &mut Qmp,
) -> (QemuStop<'a>, u64) {
    let inside = subject.f + INSIDE;
    let irq_handlers = IRQ_HANDLERS.map(|h| subject.sym(h));
    for tries in 1..=TRIES {
        stop = run_to(stub, stop);
        assert_eq!(rip(&stop), inside);
        let flags = stop.snapshot(0).unwrap().regs.rflags;
        assert!(
            flags & IF != 0,
            "interrupts off at {F}+{INSIDE}: {flags:#x}"
        );
        stop.clear_breakpoint(inside).unwrap();
        for h in irq_handlers {
            stop.set_breakpoint(h).unwrap();
        }
        // A line on the console: the 8250 raises its IRQ, pending in the
        // vCPU's local APIC until the VM runs. Blanks, which the worker
        // skips, as many as fill the receive FIFO to Linux's trigger level
        // of 8 bytes (UART_FCR_R_TRIG_10): fewer would raise it only at
        // the FIFO's timeout, a timer on the virtual clock, which is
        // stopped with the VM (QEMU's hw/char/serial.c).
        guest.send_line(BLANKS);
        wait_irr(qmp);
        stop = run_to(stub, stop);
        let at = rip(&stop);
        assert!(irq_handlers.contains(&at), "stopped at {at:#x}");
        for h in irq_handlers {
            stop.clear_breakpoint(h).unwrap();
        }
        let cr3 = stop.snapshot(0).unwrap().sregs.cr3;
        // The handler's argument: the interrupted context's registers.
        let regs = stop.snapshot(0).unwrap().regs.rdi;
        let ip = word(&stop, cr3, regs + PT_REGS_IP);
        eprintln!("try {tries}: handler {at:#x} over {ip:#x}");
        if ip == inside {
            return (stop, regs);
        }
        stop.set_breakpoint(inside).unwrap();
    }
    panic!("no IRQ taken at {F}+{INSIDE} in {TRIES} tries");
}

/// From a stop past the displaced bytes: an NMI's handler stopped on the
/// NMI stack over a context at +2, the check and the attach there, then
/// the same call past the displaced bytes again.
fn nmi_over_inside<'a>(
    subject: &mut Subject,
    stub: &'a Stub,
    mut stop: QemuStop<'a>,
    qmp: &mut Qmp,
) -> QemuStop<'a> {
    let inside = subject.f + INSIDE;
    stop.set_breakpoint(inside).unwrap();
    stop = run_to(stub, stop);
    assert_eq!(rip(&stop), inside);
    stop.clear_breakpoint(inside).unwrap();
    let nmi = subject.sym(NMI_HANDLER);
    stop.set_breakpoint(nmi).unwrap();
    // Pending at once (QEMU's x86_nmi: the local APIC's NMI), taken first.
    qmp.execute("inject-nmi", None).unwrap();
    stop = run_to(stub, stop);
    assert_eq!(rip(&stop), nmi);
    stop.clear_breakpoint(nmi).unwrap();
    let (found, stacks, cr3) = subject.check(&stop);
    let regs = stop.snapshot(0).unwrap().regs.rdi;
    assert_eq!(word(&stop, cr3, regs + PT_REGS_IP), inside);
    let rsp = stop.snapshot(0).unwrap().regs.rsp;
    assert!(
        matches!(stacks.window(rsp), StackWindow::Exception { .. }),
        "RSP {rsp:#x} not on an exception stack: {stacks:x?}"
    );
    // The CPU's frame, and the entry code's copies of it (entry_64.S's
    // nested-NMI frames, pt_regs), all on the NMI stack: one site.
    assert!(found.inside.len() > 1, "{found:x?}");
    let want = interrupted(subject);
    assert!(found.inside.iter().all(|i| *i == want), "{found:x?}");
    assert_eq!(found.unreadable, None);
    subject.attach_waits(&stop, inside);
    past_is_clean(subject, stub, stop)
}

/// Runs to the instruction past the displaced bytes: no context inside.
fn past_is_clean<'a>(subject: &Subject, stub: &'a Stub, stop: QemuStop<'a>) -> QemuStop<'a> {
    let past = subject.f + PAST;
    stop.set_breakpoint(past).unwrap();
    let stop = run_to(stub, stop);
    assert_eq!(rip(&stop), past);
    assert_eq!(subject.check(&stop).0, SiteContexts::default());
    stop.clear_breakpoint(past).unwrap();
    stop
}

/// Until the vCPU's local APIC holds a requested interrupt (QEMU's `info
/// lapic`: its IRR line lists pending vectors).
fn wait_irr(qmp: &mut Qmp) {
    for _ in 0..1000 {
        let text = qmp.hmp("info lapic").unwrap();
        let irr = text
            .lines()
            .find(|l| l.starts_with("IRR"))
            .unwrap_or_else(|| panic!("no IRR in {text}"));
        if !irr.contains("(none)") {
            eprintln!("{irr}");
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no interrupt pending after the console's byte");
}
