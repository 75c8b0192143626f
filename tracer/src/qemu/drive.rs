//! A QEMU as the session driver's loops see it (`session::backend`): each
//! attach attempt in a stop through its gdbstub, and while tracing, its
//! breakpoint hits served (trap mode), the termination signals taken, and
//! its monitor asked how the VM is: gone only when QEMU's process is (or
//! its monitor closed), stalled while the monitor does not answer, held
//! while someone else stops it, and reset when its machine was.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vmm::Stopped;

use super::breakpoints::{self, Breakpoints, Served};
use super::error::QemuError;
use super::event_guard::EventGuard;
use super::guest::QemuGuest;
use super::liveness::{QemuProcess, RunState};
use super::module_follow::{FollowError, ModuleFollow};
use super::module_hooks::{HookError, ModuleHooks};
use super::monitor::Monitor;
use super::qmp::QmpError;
use super::queries::Queries;
use super::reset::{self, CpuView, LookSeen, Verdict};
use super::step::SIGTRAP;
use crate::kernel::direct::DirectSite;
use crate::session::backend::{AttachedIn, Backend, HeldUp, TraceEnd};
use crate::session::exitless::backing::RegionPages;
use crate::session::module_added::FirstLoads;
use crate::session::module_marks::Marks;
use crate::session::watch::Watch;
use crate::session::{Attach, NotReady, Tracer};

/// How long a look waits for QMP's socket while another client holds it
/// (Proxmox's `qm`, a user's `socat`): not the trace loop's whole step
/// (trap mode serves no hit meanwhile); a look not let in is a look
/// unanswered, waited out like a stalled QEMU.
const LOOK_WAIT: Duration = Duration::from_millis(100);

/// How long looks go unanswered before it is said (a QMP reply's
/// timeout, `session::REPLY_TIMEOUT`).
const UNANSWERED_SAID: Duration = Duration::from_secs(10);

/// Where the gdbstub is: one vmtrace opened through QMP (and closes at
/// the end, reopening the one it replaced), or one the user gave.
pub(super) enum Stub {
    Opened(super::stub::OwnStub),
    Given,
}

/// How calls reach vmtrace in this QEMU, with what only that mode has.
pub(super) enum Arming {
    /// vmtrace's region in the guest's free low memory.
    Exitless { pages: Arc<Mutex<RegionPages>> },
    /// Breakpoints through the stub: the trap handlers until the attach
    /// sets the breakpoints, which serve them from then on.
    Trap {
        handlers: Option<Vec<crate::session::record::Recorder>>,
        breakpoints: Option<Box<Breakpoints>>,
        /// With the function graph: where return breakpoints are named.
        journal: Option<Box<super::journal::ReturnJournal>>,
    },
}

/// A QEMU whose guest a session traces.
pub(super) struct QemuVm {
    pub(super) qmp: Monitor,
    pub(super) guest: QemuGuest,
    pub(super) stub: Stub,
    pub(super) arming: Arming,
    /// Attached: from here on a wait also serves hits, asks the monitor
    /// and takes the termination signals.
    pub(super) tracing: bool,
    pub(super) process: QemuProcess,
    /// Since when the monitor has not answered.
    pub(super) unanswered: Option<Instant>,
    /// Someone else's stop of the VM (QEMU's run state), and since when.
    pub(super) held: Option<(String, Instant)>,
    /// Where the traced kernel's image runs (set at the attach's first
    /// stop), for `reset::judge`.
    pub(super) image: Option<std::ops::Range<u64>>,
    /// The last look's verdict was `reset::Verdict::Suspect`.
    suspected: bool,
    /// The events' call sites vmtrace made jumps (`super::event_sites`),
    /// given back their NOPs at the detach.
    pub(super) jumps: Vec<super::journal::JournaledJump>,
    /// Exitless mode: the hooks that follow a traced module through its
    /// unloads and loads (`super::module_follow`), and the journal they
    /// name what they write in until the attach hands it to them.
    pub(super) follow: Option<Box<ModuleFollow>>,
    pub(super) follow_journal: Option<super::journal::Journal>,
    /// Exitless mode: the guard for the guest enabling a traced event
    /// itself (`super::event_guard`).
    pub(super) guard: Option<Box<EventGuard>>,
    /// The guest's marker as the attach wrote it, for the hooks to name
    /// the module sites they write in.
    pub(super) follow_marker: Option<super::marker::Marker>,
    /// Why modules are not followed, where some traced site or `:mod:`
    /// glob needs it (the hooks could not be set).
    pub(super) unfollowed: Option<String>,
}

impl QemuVm {
    /// Why the guest's modules are not followed through their loads and
    /// unloads, where a traced site or a `:mod:` glob needs it (the
    /// hooks of `super::module_hooks` could not be set).
    pub(super) fn modules_unfollowed(&self) -> Option<&str> {
        match &self.arming {
            Arming::Trap {
                breakpoints: Some(b),
                ..
            } => b.unfollowed.as_deref(),
            _ => self.unfollowed.as_deref(),
        }
    }

    /// Exitless: copies of the attach's journal and the guest's marker
    /// for the module hooks (`super::module_follow`), which name in them
    /// the module sites they write.
    pub(super) fn follow_with(
        &mut self,
        journal: &super::journal::Journal,
        marker: super::marker::Marker,
    ) {
        self.follow_journal = Some(super::journal::Journal {
            path: journal.path.clone(),
            record: journal.record.clone(),
        });
        self.follow_marker = Some(marker);
    }
    pub(super) fn new(qmp: Monitor, guest: QemuGuest, stub: Stub, pid: u32) -> QemuVm {
        QemuVm {
            qmp,
            guest,
            stub,
            // Set at the first stop (`setup`).
            arming: Arming::Trap {
                handlers: None,
                breakpoints: None,
                journal: None,
            },
            tracing: false,
            process: QemuProcess::watch(pid),
            unanswered: None,
            held: None,
            image: None,
            suspected: false,
            jumps: Vec::new(),
            follow: None,
            follow_journal: None,
            guard: None,
            follow_marker: None,
            unfollowed: None,
        }
    }

    /// How the VM is now, from its monitor (one burst: the run state and
    /// CPU 0's registers, `super::reset`): None while QEMU runs on (a
    /// stalled monitor is waited out, someone else's stop noted), else why
    /// tracing must end. A late answer is never taken for a later
    /// command's (QMP ids).
    pub(super) fn look(&mut self) -> Option<TraceEnd> {
        if self.process.is_gone() {
            return Some(TraceEnd::VmmGone("its process exited".into()));
        }
        let looked = self.qmp.burst_within(LOOK_WAIT, |m| {
            let status = m.status()?;
            // (Its failure is no sign: the run state decides then.)
            Ok((status, m.hmp("info registers").ok()))
        });
        let (status, regs) = match looked {
            Ok((s, r)) => (Ok(s), r),
            Err(e) => (Err(e), None),
        };
        let events = self.qmp.take_events();
        let status = match status {
            Ok(s) => s,
            Err(QmpError::Closed { .. }) => {
                return Some(TraceEnd::VmmGone("QEMU closed its monitor socket".into()))
            }
            Err(e @ QmpError::Replaced { .. }) => {
                return Some(TraceEnd::MonitorLost(e.to_string()))
            }
            // Busy, stopped or slow, but there: waited out. (Events seen
            // in the burst still count.)
            Err(_) => {
                self.unanswered.get_or_insert_with(Instant::now);
                String::new()
            }
        };
        let cpu0 = regs.as_deref().and_then(CpuView::parse);
        let seen = LookSeen {
            status: &status,
            events: &events,
            cpu0: cpu0.as_ref(),
        };
        let verdict = reset::judge(&seen, self.image.as_ref(), self.suspected);
        self.suspected = matches!(verdict, Verdict::Suspect(_));
        match verdict {
            Verdict::Reset(why) => {
                // Before anything else can write: the drainer's next word
                // would land in the firmware's or the next kernel's memory.
                self.guest.seal();
                Some(TraceEnd::GuestReset(why))
            }
            Verdict::Suspended => Some(TraceEnd::Suspended),
            _ if status.is_empty() => None,
            Verdict::GoOn(state) | Verdict::Suspect(state) => {
                self.unanswered = None;
                self.note_state(state);
                None
            }
        }
    }

    /// Track someone else's stop: running again, it ends. Exitless, a
    /// stopped VM (vmtrace holds no stop while tracing) is someone else's;
    /// in trap mode the stub's stop replies say whose a stop is (a VM
    /// stopped at a breakpoint is vmtrace's, its hit not served yet).
    fn note_state(&mut self, state: RunState) {
        let exitless = matches!(self.arming, Arming::Exitless { .. });
        match state {
            RunState::Running => {
                if self.held.take().is_some() {
                    // (Trap mode: the stub's next stop reply is a new stop.)
                    self.guest.runs_again();
                }
            }
            RunState::Stopped(why) => {
                // (Followed modules, guarded events: the stub's replies
                // say, as in trap mode.)
                if exitless && !self.serves_stops() && self.held.is_none() {
                    self.held = Some((why, Instant::now()));
                }
            }
        }
    }

    /// Does QEMU still run? (Its process, through the pidfd.)
    pub(super) fn alive(&self) -> bool {
        !self.process.is_gone()
    }

    /// The VM's run state before a stop of vmtrace's, asked until QEMU
    /// answers (while it lives): someone else's stop is then worked inside
    /// and left alone.
    pub(super) fn state_patient(
        &mut self,
        on_wait: &mut dyn FnMut(&HeldUp),
    ) -> Result<RunState, QemuError> {
        let since = Instant::now();
        loop {
            match self.qmp.status() {
                Ok(s) => return Ok(RunState::parse(&s)),
                Err(QmpError::Timeout { .. }) if self.alive() => on_wait(&HeldUp::Unanswered {
                    since: since.elapsed(),
                }),
                // Another QEMU took the socket's path while this one runs
                // on: its stub (held) says how it is, as for any stop.
                Err(QmpError::Replaced { .. }) if self.alive() => return Ok(RunState::Running),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl QemuVm {
    /// Exitless mode: whether breakpoints of vmtrace's stop the VM (the
    /// module hooks, the event guard), their stops served by `serve_hooks`.
    pub(super) fn serves_stops(&self) -> bool {
        self.follow.is_some() || self.guard.is_some()
    }

    /// Exitless mode: the module hooks' and the event guard's stops served
    /// for `step`.
    fn serve_hooks(&mut self, step: Duration) -> Option<TraceEnd> {
        let until = Instant::now() + step;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let guard = self.guard.as_deref_mut();
            match serve_exitless(&self.guest, guard, self.follow.as_deref_mut(), left) {
                Ok(Served::Hit) => continue,
                Ok(Served::Idle) => return None,
                Ok(Served::NotOurs { signal }) => {
                    self.held = Some((format!("gdb signal {signal}"), Instant::now()));
                    return None;
                }
                Err(e) => return Some(self.look().unwrap_or(TraceEnd::Stub(e))),
            }
        }
    }
}

/// Exitless mode's stops of its own served for up to `timeout`: the
/// event guard's and the module hooks' (`super::module_follow`); any other
/// stop is left alone (someone else's). Errors as text: the trace ends.
fn serve_exitless(
    guest: &QemuGuest,
    mut guard: Option<&mut EventGuard>,
    follow: Option<&mut super::module_follow::ModuleFollow>,
    timeout: Duration,
) -> Result<Served, String> {
    let Some(hit) = guest.wait_hit(timeout).map_err(|e| e.to_string())? else {
        return Ok(Served::Idle);
    };
    let signal = hit.reply.signal;
    let (SIGTRAP, Some(cpu)) = (signal, hit.cpu) else {
        hit.hold();
        return Ok(Served::NotOurs { signal });
    };
    if let Some(g) = guard.as_deref_mut() {
        let rip = hit.snapshot(cpu).map_err(|e| e.to_string())?.regs.rip;
        if g.owns(rip) {
            return g.serve_hit(hit, cpu).map_err(|e| e.to_string());
        }
    }
    match follow {
        Some(f) => {
            let served = f.serve_hit(hit, cpu).map_err(|e| e.to_string());
            // A module gone: the guard no longer has sites there; one
            // loaded again: its event sites are guarded again.
            let news = std::mem::take(&mut f.guard_news);
            if let Some(g) = guard {
                g.learn(news);
            }
            served
        }
        None => {
            hit.hold();
            Ok(Served::NotOurs { signal })
        }
    }
}

impl QemuVm {
    /// The events' call sites made jumps, once the attach is in place, and
    /// named wherever the journal is written from now on; exitless mode's
    /// guard set (`super::event_guard`).
    pub(super) fn enable_events(
        &mut self,
        (events, image): (
            &crate::plan::events::EventPlan,
            &crate::kernel::symbols::KernelImage,
        ),
        offset: crate::kernel::kaslr::KernelOffset,
        journal: &mut super::journal::Journal,
    ) -> Result<(), QemuError> {
        let breakpoints = match &mut self.arming {
            Arming::Trap {
                breakpoints: Some(b),
                ..
            } => Some(&mut **b),
            _ => None,
        };
        let reload = super::event_reload::ReloadEvents::of(events, image, offset);
        let mut breakpoints = breakpoints;
        if let Some(b) = breakpoints.as_deref_mut() {
            b.reload = Some(super::event_reload::ReloadEvents::of(events, image, offset));
        }
        let plan = (events, image);
        let guard = super::event_sites::enable(&self.guest, plan, offset, journal, breakpoints)?;
        self.jumps = journal.record.jumps.clone();
        if let Some(f) = self.follow.as_mut() {
            f.reload = reload;
            let bps = guard.as_ref().map(|g| g.breakpoints()).unwrap_or_default();
            let named = f.name_jumps(&self.jumps, &bps);
            named.map_err(|e| QemuError::NotTraceable(e.to_string()))?;
        }
        self.guard = guard.map(Box::new);
        Ok(())
    }
}

/// The hooks for the traced module sites of `tracer`'s plan, and for the
/// modules first loaded during the trace (when slots were kept), read
/// under `stop` (None: none to follow; an error: why they cannot be).
fn module_hooks(
    stop: &super::guest::QemuStop<'_>,
    tracer: &Tracer,
) -> Result<Option<ModuleHooks>, HookError> {
    let plan = tracer.plan();
    let virt = plan.index.slide();
    let sites = plan
        .index
        .addrs
        .iter()
        .map(|&a| a.wrapping_add(virt as u64))
        .collect();
    let ram = Arc::clone(vmm::Stopped::ram(stop));
    let coming = plan.coming.as_ref().filter(|_| plan.exitless_added() > 0);
    let coming = coming.map(|c| {
        let mut f = FirstLoads::of_plan(c, plan);
        // `--entry direct`: by their direct entries, those that displace
        // instructions with stubs in the spare stub slots, if any.
        if let Some(links) = crate::session::module_direct::direct_links(plan) {
            f.want_direct(links, plan.direct_spare_stubs() > 0);
        }
        f
    });
    ModuleHooks::new(&plan.image, virt, &*ram, &sites, coming)
}

/// What each spare site of `tracer`'s exitless code calls, by slot (none
/// without the code).
fn added_stubs(tracer: &Tracer) -> Vec<u64> {
    let Some(t) = tracer.trampoline() else {
        return Vec::new();
    };
    let planned = tracer.plan().index.addrs.len();
    (planned..t.sites()).map(|k| t.stub_va(k as u32)).collect()
}

/// The direct entries of `tracer`'s plan in the modules found at the
/// attach that displaced other instructions than an ftrace NOP, by running
/// address (their stubs are written again at a reload).
fn module_entries(tracer: &Tracer) -> HashMap<u64, DirectSite> {
    let plan = tracer.plan();
    let Some(direct) = plan.direct.as_ref() else {
        return HashMap::new();
    };
    let slide = plan.index.slide() as u64;
    let in_module = |a: u64| plan.image.module_at(a).is_some();
    (direct.sites.iter())
        .filter(|(_, d)| !d.ftrace_nop)
        .map(|(&a, d)| (a.wrapping_add(slide), d.clone()))
        .filter(|&(a, _)| in_module(a))
        .collect()
}

/// The guest's ftrace records, to mark a reloaded module's as the attach
/// marked its sites' (None where it could not).
fn marks_of(tracer: &Tracer) -> Option<Marks> {
    let records = tracer.ftrace_records()?.clone();
    Some(Marks::new(records, tracer.kernel_offset()?))
}

impl Backend for QemuVm {
    type Error = QemuError;

    /// One attach in a stop: exitless, the tracer's attach (whatever it
    /// wrote taken out again on an error); trap mode, a breakpoint at each
    /// site found ready (nothing written).
    fn attach_once(
        &mut self,
        tracer: &mut Tracer,
    ) -> Result<Result<AttachedIn, NotReady>, QemuError> {
        let stop = self.guest.stop(false)?;
        let times = |t: &Tracer| (t.attach_counts.clone(), stop.window(), stop.latency());
        let attached = match &mut self.arming {
            Arming::Exitless { .. } => {
                // Read before the attach writes the sites.
                let hooks = module_hooks(&stop, tracer);
                match tracer.attach(&stop) {
                    Ok(Attach::Attached(_)) => {
                        // Not followed (said: `unfollowed`): an unloaded
                        // module's sites are left alone at the detach, a
                        // module first loaded is not traced.
                        let started = hooks.map_err(FollowError::from).and_then(|h| {
                            let Some(h) = h else { return Ok(None) };
                            let j = (self.follow_journal.take(), self.follow_marker.take());
                            let marks = marks_of(tracer);
                            let stubs = added_stubs(tracer);
                            let direct = (tracer.direct_spare_stubs(), module_entries(tracer));
                            ModuleFollow::start(h, &stop, j, marks, stubs)
                                .map(|f| Some(f.with_direct(direct.0, direct.1)))
                        });
                        match started {
                            Ok(f) => self.follow = f.map(Box::new),
                            Err(e) => self.unfollowed = Some(e.to_string()),
                        }
                        Ok(times(tracer))
                    }
                    Ok(Attach::NotReady(why)) => Err(why),
                    Err(e) => {
                        // Whatever was written comes out before the error is said.
                        let _ = tracer.detach(&**stop.ram());
                        return Err(e.into());
                    }
                }
            }
            Arming::Trap {
                handlers,
                breakpoints,
                journal,
            } => match tracer.watch_sites(&stop)? {
                Watch::Ready { sites, others } => {
                    let hs = handlers.take().unwrap_or_default();
                    let j = journal.take().map(|j| *j);
                    let mut b = breakpoints::watch(tracer, &stop, &sites, others, hs, j)?;
                    let t = times(tracer);
                    if let Err(e) = stop.resume() {
                        b.finish();
                        return Err(e.into());
                    }
                    *breakpoints = Some(Box::new(b));
                    self.tracing = true;
                    return Ok(Ok(t));
                }
                Watch::NotReady(why) => Err(why),
            },
        };
        stop.resume()?;
        self.tracing = attached.is_ok();
        Ok(attached)
    }

    fn run_for(&mut self, step: Duration) -> Option<TraceEnd> {
        if !self.tracing {
            std::thread::sleep(step);
            return None;
        }
        if let Some(sig) = vmm::run::take_terminate_signal() {
            return Some(TraceEnd::Signal(sig));
        }
        match &mut self.arming {
            Arming::Trap {
                breakpoints: Some(b),
                ..
            } if self.held.is_none() => {
                let until = Instant::now() + step;
                loop {
                    // (A socket takes no zero timeout: the step is over.)
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    match b.serve(&self.guest, left) {
                        // Hits keep coming: QMP is asked every step, not
                        // every hit.
                        Ok(Served::Hit) => continue,
                        Ok(Served::Idle) => break,
                        Ok(Served::NotOurs { signal }) => {
                            let why = format!("gdb signal {signal}");
                            self.held = Some((why, Instant::now()));
                            break;
                        }
                        Err(e) => {
                            return Some(match self.look() {
                                Some(end) => end,
                                None => TraceEnd::Stub(e.to_string()),
                            })
                        }
                    }
                }
            }
            Arming::Exitless { .. }
                if self.held.is_none() && (self.follow.is_some() || self.guard.is_some()) =>
            {
                if let Some(end) = self.serve_hooks(step) {
                    return Some(end);
                }
            }
            _ => std::thread::sleep(step),
        }
        self.look()
    }

    fn held_up(&self) -> Option<HeldUp> {
        // A look not let in for a moment (another client's command) is not
        // worth a word: only a monitor silent for as long as one reply may
        // take is.
        if let Some(t) = self.unanswered.filter(|t| t.elapsed() >= UNANSWERED_SAID) {
            return Some(HeldUp::Unanswered { since: t.elapsed() });
        }
        self.held.as_ref().map(|(why, t)| HeldUp::Stopped {
            why: why.clone(),
            since: t.elapsed(),
        })
    }
}
