//! The mode of an attach to a guest vmtrace did not boot (a running QEMU),
//! settled at its first stop from what the guest offers: the mode planned
//! (`TracePlan::mode`) where the guest has room for vmtrace's code and
//! rings in pages it never uses, its rings sized to them; else, when auto
//! mode was asked, trap mode through the stub's breakpoints, saying why.
//! Trap mode takes direct entries and the function graph too, through
//! breakpoints alone (`crate::qemu::breakpoints`): nothing is written.

use crate::advice::{Plain, Remedy, TracerAdvice, TracerWords};

use super::build::{ModeChoice, TracePlan};
use super::exitless::error::ExitlessPlanError;
use super::exitless::layout::{
    direct_stubs_len, RecordKind, RingLayout, CODE_SLOTS, DATA_LEN, DIRECT_STUB_PAGES,
    FRAME_NEXT_OFF, GRAPH_BOTTOM, MAX_RECORDS, MIN_RECORDS, PAGE, RETURN_TRAP_OFF, STUB_PAGES,
    STUB_SLOT, TABLE_SLOTS,
};
use super::exitless::ExitlessPlan;
use super::{Mode, Plan};

/// Why auto mode traps for events behind static calls.
const EVENTS_AT_BREAKPOINTS: &str =
    "the events of a kernel with static calls are recorded at breakpoint stops";

/// Why auto mode traces with breakpoints when stacks are asked.
pub const STACKS_AT_BREAKPOINTS: &str = "kernel stacks are unwound at breakpoint stops";

/// How the attach traces: exitless with the code sized to the guest's room
/// (and the room), or through breakpoints (with why, when auto mode fell
/// back to them).
#[derive(Debug)]
pub enum Decision<R> {
    Exitless(Box<ExitlessPlan>, R),
    Trap { why: Option<String> },
}

/// What keeps an attach's mode from being planned.
#[derive(Debug, thiserror::Error)]
pub enum AttachModeError {
    /// Kernel stacks asked of exitless mode; said with its remedy (`Advice`).
    #[error("{}", self.say(&Plain))]
    StacksNeedTrap,
    #[error("{sites} direct entries with the function graph: its return stubs and frames take the guest's unused memory their stubs would need, and leave room for {most}; trace fewer functions, or without the function graph")]
    DirectWithGraph { sites: usize, most: usize },
    #[error("{sites} sites on {cpus} CPUs need more than the {kib} KiB of guest memory the guest leaves unused; trace fewer functions")]
    RingsTooBig { sites: usize, cpus: usize, kib: u64 },
    /// Said in the front end's words (`Advice`).
    #[error("{}", self.say(&Plain))]
    Code(#[from] ExitlessPlanError),
}

/// A front end words the remedies these errors name (`crate::advice`).
impl TracerAdvice for AttachModeError {
    fn problem(&self, w: &dyn TracerWords) -> String {
        match self {
            AttachModeError::StacksNeedTrap => "kernel stacks are unwound while a breakpoint \
                                                holds the guest, and exitless calls never stop it"
                .into(),
            AttachModeError::Code(e) => e.problem(w),
            other => other.to_string(),
        }
    }

    fn remedy(&self) -> Option<Remedy> {
        match self {
            AttachModeError::StacksNeedTrap => Some(Remedy::TrapMode),
            AttachModeError::Code(e) => e.remedy(),
            _ => None,
        }
    }
}

/// Why an attach's mode cannot be settled: the plan's reason, or the
/// guest's (`E`) where no fallback applies.
#[derive(Debug)]
pub enum Refused<E> {
    Plan(AttachModeError),
    Room(E),
}

impl<E> From<AttachModeError> for Refused<E> {
    fn from(e: AttachModeError) -> Self {
        Refused::Plan(e)
    }
}

impl<E> From<ExitlessPlanError> for Refused<E> {
    fn from(e: ExitlessPlanError) -> Self {
        Refused::Plan(e.into())
    }
}

/// What the guest offers exitless mode: `pages` free pages, and whatever
/// else the session found with them (`R`); with `own_rings`, memory of
/// vmtrace's own for the whole data window (`DATA_LEN`) besides, where
/// the rings go instead of the free pages; with `own_code`, for the whole
/// region (code and tables too), laid out as in vmtrace's own VMM.
pub struct Room<R> {
    pub pages: usize,
    pub own_rings: bool,
    pub own_code: bool,
    /// With `own_rings`: bytes of vmtrace's own memory for the rings alone,
    /// mapped at `HIGH_RINGS_VA` (`RingLayout::high`); 0: the rings share
    /// the data window with the frame pool.
    pub ring_area: u64,
    pub found: R,
}

/// The attach's mode from `plan` and the guest's room (`room`, looked at
/// only when exitless mode is still possible); `falls_back` tells which
/// of the guest's reasons let auto mode trap instead (rings too big for
/// the room do).
pub fn decide<R, E: std::fmt::Display>(
    plan: &TracePlan,
    cpus: usize,
    room: impl FnOnce() -> Result<Room<R>, E>,
    falls_back: impl Fn(&E) -> bool,
) -> Result<Decision<R>, Refused<E>> {
    let auto = plan.asked == ModeChoice::Auto;
    // Events behind static calls: auto mode passes their `tp->funcs` tests
    // with breakpoints (`kernel::events::enabled_branch`), where the guest
    // may enable the events itself meanwhile; exitless mode, asked, makes
    // their loads read another cell, and the guest must not.
    let events = plan.plan.events.any_static_call();
    if auto && events && plan.plan.stacks.is_none() {
        return Ok(Decision::Trap {
            why: Some(EVENTS_AT_BREAKPOINTS.into()),
        });
    }
    let decided = match (&plan.mode, plan.plan.stacks.is_some()) {
        // An exitless site never stops the guest, and an unwind needs it
        // stopped: kernel stacks are unwound at breakpoint stops.
        (_, true) if plan.asked == ModeChoice::Exitless => {
            return Err(AttachModeError::StacksNeedTrap.into())
        }
        (_, true) => Decision::Trap {
            why: auto.then(|| STACKS_AT_BREAKPOINTS.into()),
        },
        // Trap asked, or auto mode found this kernel unfit (its note says why).
        (Mode::Trap, false) => Decision::Trap { why: None },
        (Mode::Exitless(code), false) => match room() {
            Ok(r) => match in_guest_pages(code, plan, cpus, &r) {
                Ok(code) => Decision::Exitless(Box::new(code), r.found),
                // Too much for the room: breakpoints need none.
                Err(
                    e @ (AttachModeError::RingsTooBig { .. }
                    | AttachModeError::DirectWithGraph { .. }),
                ) if auto => Decision::Trap {
                    why: Some(e.to_string()),
                },
                Err(e) => return Err(e.into()),
            },
            Err(e) if auto && falls_back(&e) => Decision::Trap {
                why: Some(e.to_string()),
            },
            Err(e) => return Err(Refused::Room(e)),
        },
    };
    Ok(decided)
}

/// `code` with rings of as many records as fit the room's free pages with
/// its tables and code (a power of two), for `cpus` CPUs; with
/// `own_rings`, the tables and code in the free pages (or, `own_code`, in
/// vmtrace's own memory too) and the rings as many as fit the data window,
/// as in vmtrace's own VMM.
fn in_guest_pages<R>(
    code: &ExitlessPlan,
    plan: &TracePlan,
    cpus: usize,
    room: &Room<R>,
) -> Result<ExitlessPlan, AttachModeError> {
    let (pages, own_rings) = (room.pages, room.own_rings);
    let plan = &plan.plan;
    let sites = plan.index.addrs.len();
    let mut code = code.clone();
    // The code at its smallest rings: what it takes whatever their size.
    code.set_rings(cpus, MIN_RECORDS)?;
    if !plan.graph && plan.direct.is_none() {
        // Bodies per site too many for the free pages: the shared body.
        let rings = match own_rings {
            true => 0,
            false => code.layout().ring_bytes as usize * cpus / PAGE as usize,
        };
        if TABLE_SLOTS + code.code_pages() + rings > pages {
            code.compact()?;
        }
    }
    let code_pages = code.code_pages();
    // The pages below the rings (`session::exitless::backing`): the tables
    // and the code; with the function graph, its parts at their fixed places.
    // Direct entries' stubs: in the return trap's page, and below it in
    // the return stubs' slots from the last down (`backing::slot`).
    let direct = planned_stub_pages(plan);
    let bottom = match (plan.graph, direct) {
        // The whole region in vmtrace's own memory: every part at its
        // place, as in vmtrace's own VMM.
        _ if room.own_code => 0,
        (true, Some(below)) if below > 0 => {
            return Err(AttachModeError::DirectWithGraph {
                sites,
                most: direct_with_graph(),
            })
        }
        (false, None) => TABLE_SLOTS + code_pages,
        // The code from the bottom, the stubs down from the return trap's
        // page, the last of the graph's code slots (`backing::slot`).
        (false, Some(below)) if code_pages + below <= CODE_SLOTS + DIRECT_STUB_PAGES => {
            TABLE_SLOTS + CODE_SLOTS + STUB_PAGES
        }
        (false, Some(_)) => pages + 1,
        // (The code's pages count the return stubs' too.)
        (true, _) if code_pages.saturating_sub(STUB_PAGES) <= CODE_SLOTS => GRAPH_BOTTOM,
        (true, _) => pages + 1,
    };
    let high = own_rings && room.ring_area > 0;
    let area = room.ring_area;
    let room = match own_rings {
        // The code must still fit the free pages.
        true if bottom <= pages && high => area,
        true if bottom <= pages => own_rings_len(plan.graph),
        true => 0,
        false => pages.saturating_sub(bottom) as u64 * PAGE,
    } / cpus.max(1) as u64;
    let kind = code.layout().kind();
    let fits = |cap| ring_fits(plan, kind, cpus, cap, high.then_some(area), room);
    if !fits(MIN_RECORDS) {
        return Err(AttachModeError::RingsTooBig {
            sites,
            cpus,
            kib: pages as u64 * PAGE / 1024,
        });
    }
    let mut cap = MIN_RECORDS;
    while cap < MAX_RECORDS && fits(cap * 2) {
        cap *= 2;
    }
    // The code's own bound check and ring stride: `cpus` rings, not the
    // vCPUs the plan was made for (a guest with CPUs to hot-add or online
    // has more CPU numbers than QEMU has vCPUs).
    match high {
        true => code.set_high_rings(cpus, cap, area)?,
        false => code.set_rings(cpus, cap)?,
    }
    Ok(code)
}

/// Do `cpus` rings of `cap` records for `plan` fit `room` bytes each: in
/// the data window, or past it in `high` bytes (`RingLayout::high`)?
fn ring_fits(
    plan: &Plan,
    kind: RecordKind,
    cpus: usize,
    cap: u64,
    high: Option<u64>,
    room: u64,
) -> bool {
    let (sites, graph) = (plan.index.addrs.len(), plan.graph);
    let l = match high {
        Some(area) => RingLayout::high(cpus, sites, cap, graph, kind, area),
        None => RingLayout::with_kind(cpus, sites, Some(cap), graph, kind),
    };
    l.is_ok_and(|l| l.ring_bytes <= room)
}

/// Bytes of the data window the rings may take when it is memory of
/// vmtrace's own: all of it, less the function graph's frame pool.
fn own_rings_len(graph: bool) -> u64 {
    match graph {
        true => FRAME_NEXT_OFF,
        false => DATA_LEN,
    }
}

/// Whether `plan`'s code needs the whole region in memory of vmtrace's own
/// (the ring device, holding the code too): direct entries with the
/// function graph, more of them than the return trap's page holds (the
/// graph's return stubs and frames take the free pages' other slots).
pub fn code_needs_own_memory(plan: &Plan) -> bool {
    plan.graph && plan.direct.is_some() && direct_stub_pages(plan.index.addrs.len()) > 0
}

/// Pages below the return trap's page that `plan`'s direct entries'
/// stubs take, with the spare stubs of the modules first loaded during
/// the trace (`Plan::direct_spare_stubs`); None: no direct entries.
fn planned_stub_pages(plan: &Plan) -> Option<usize> {
    let stubs = plan.index.addrs.len() + plan.direct_spare_stubs();
    plan.direct.as_ref().map(|_| direct_stub_pages(stubs))
}

/// Pages the stubs of `sites` direct entries take below the return trap's
/// page (`direct_stubs_len`; the last stubs share that page).
fn direct_stub_pages(sites: usize) -> usize {
    let trap_page = RETURN_TRAP_OFF / PAGE;
    (trap_page - (RETURN_TRAP_OFF - direct_stubs_len(sites)) / PAGE) as usize
}

/// Direct entries whose stubs fit the return trap's page: all the function
/// graph leaves them in the guest's free pages.
fn direct_with_graph() -> usize {
    ((RETURN_TRAP_OFF % PAGE) / STUB_SLOT) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::symbols::KernelImage;
    use crate::plan::build::Request;
    use crate::plan::exitless::layout::RECORD_LEN;

    /// A plan of the mini guest's `hrtimer_*` on 2 CPUs, as asked.
    fn plan(asked: ModeChoice, graph: bool, stack: bool) -> Option<TracePlan> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/mini.elf");
        if !path.is_file() {
            eprintln!("SKIPPED: {} is not built", path.display());
            return None;
        }
        let req = Request {
            graph,
            stack: match stack {
                true => vec!["hrtimer_interrupt".into()],
                false => Vec::new(),
            },
            ..Request::new(vec!["hrtimer_*".into()], asked, 2)
        };
        Some(TracePlan::build(KernelImage::load(&path).unwrap(), &req).unwrap())
    }

    /// The guest's own reason, and whether auto mode falls back on it.
    #[derive(Debug)]
    struct Why(&'static str, bool);
    impl std::fmt::Display for Why {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    fn decided(p: &TracePlan, room: Result<Room<()>, Why>) -> Result<Decision<()>, Refused<Why>> {
        decide(p, 2, || room, |w: &Why| w.1)
    }

    const PAGES: usize = 256;
    fn pages(n: usize) -> Result<Room<()>, Why> {
        Ok(Room {
            pages: n,
            own_rings: false,
            own_code: false,
            ring_area: 0,
            found: (),
        })
    }

    /// Rings in memory of vmtrace's own (an ivshmem BAR): as large as the
    /// data window allows, as in vmtrace's own VMM, whatever the free
    /// pages; the code must still fit those.
    #[test]
    fn own_ring_memory_sizes_rings_to_the_data_window() {
        let Some(p) = plan(ModeChoice::Exitless, false, false) else {
            return;
        };
        let own = |n| {
            Ok(Room {
                pages: n,
                own_rings: true,
                own_code: false,
                ring_area: 0,
                found: (),
            })
        };
        let Ok(Decision::Exitless(code, ())) = decided(&p, own(PAGES)) else {
            panic!("no exitless decision")
        };
        let l = code.layout();
        let vmm = RingLayout::with_args(2, l.sites, None, false, false).unwrap();
        assert_eq!(l.cap, vmm.cap);
        assert!(l.cap * RECORD_LEN > 512 << 10, "{l:?}");
        // Code and tables need the free pages still.
        assert!(matches!(
            decided(&p, own(TABLE_SLOTS + code.code_pages() - 1)).unwrap_err(),
            Refused::Plan(AttachModeError::RingsTooBig { .. })
        ));
    }

    /// A guest whose kernel may use more CPU numbers than QEMU has vCPUs
    /// (`-smp 1,maxcpus=2`, CPUs offline): the code's rings and its bound
    /// check are for all of them, not for the vCPUs the plan was made for.
    /// (Before, the plan's 2 stayed, and a CPU hot-added later counted its
    /// calls as ring 0's drops.)
    #[test]
    fn exitless_code_has_a_ring_for_every_cpu_number_the_guest_may_use() {
        let Some(p) = plan(ModeChoice::Exitless, false, false) else {
            return;
        };
        let Ok(Decision::Exitless(code, ())) = decide(&p, 4, || pages(PAGES), |w: &Why| w.1) else {
            panic!("no exitless decision")
        };
        assert_eq!(code.layout().cpus, 4);
    }

    #[test]
    fn exitless_code_is_sized_to_the_guests_free_pages() {
        let Some(p) = plan(ModeChoice::Auto, false, false) else {
            return;
        };
        let Ok(Decision::Exitless(code, ())) = decided(&p, pages(PAGES)) else {
            panic!("no exitless decision")
        };
        let l = code.layout();
        // Every ring with its records fits what the code and tables leave.
        let left = (PAGES - TABLE_SLOTS - code.code_pages()) as u64 * PAGE;
        assert!(l.cpus as u64 * l.ring_bytes <= left, "{l:?}");
        assert!(l.cap.is_power_of_two() && l.cap >= MIN_RECORDS);
        // Twice the records would not fit.
        let twice = RingLayout::with_args(2, l.sites, Some(l.cap * 2), false, false).unwrap();
        assert!(2 * twice.ring_bytes > left, "{twice:?}");
        // Too few pages: auto traps, saying why; exitless asked is refused.
        let Ok(Decision::Trap { why: Some(why) }) = decided(&p, pages(TABLE_SLOTS + 1)) else {
            panic!("auto did not fall back")
        };
        assert!(
            why.contains("KiB of guest memory the guest leaves unused"),
            "{why}"
        );
        let p = plan(ModeChoice::Exitless, false, false).unwrap();
        let e = decided(&p, pages(TABLE_SLOTS + 1)).unwrap_err();
        assert!(matches!(
            e,
            Refused::Plan(AttachModeError::RingsTooBig { .. })
        ));
    }

    /// Direct entries in trap mode: breakpoints at the functions' entries,
    /// nothing written; asked, or where auto mode falls back. (Refused
    /// before: `DirectNeedsRoom`.)
    #[test]
    fn direct_entries_trap_where_there_is_no_room() {
        let Some(_) = plan(ModeChoice::Auto, false, false) else {
            return;
        };
        let direct = |asked, graph| {
            let req = Request {
                entry: crate::plan::entry::EntryChoice::Direct,
                graph,
                ..Request::new(vec!["hrtimer_*".into()], asked, 2)
            };
            let path =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/mini.elf");
            TracePlan::build(KernelImage::load(&path).unwrap(), &req).unwrap()
        };
        for graph in [false, true] {
            let trap = direct(ModeChoice::Trap, graph);
            let d = decide(
                &trap,
                2,
                || -> Result<Room<()>, Why> { panic!("looked") },
                |_| true,
            );
            assert!(matches!(d, Ok(Decision::Trap { why: None })), "{d:?}");
            // Where auto mode falls back: trap mode, with the guest's reason.
            let auto = direct(ModeChoice::Auto, graph);
            let Ok(Decision::Trap { why: Some(why) }) = decided(&auto, Err(Why("no room", true)))
            else {
                panic!("a direct plan did not fall back to trap mode")
            };
            assert_eq!(why, "no room");
            assert!(matches!(
                decided(&auto, pages(PAGES)),
                Ok(Decision::Exitless(..))
            ));
        }
    }

    /// Direct entries with the function graph, more than the free pages
    /// leave them: refused there (`DirectWithGraph`), planned when the
    /// whole region is in memory of vmtrace's own (the ring device), with
    /// the rings as large as the data window less the frame pool.
    #[test]
    fn direct_entries_with_the_graph_take_the_whole_region_in_own_memory() {
        // The 6.1 guest: more direct sites than the mini guest's 62.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/vmlinux");
        if !path.is_file() {
            eprintln!("SKIPPED: {} is not built", path.display());
            return;
        }
        let req = Request {
            entry: crate::plan::entry::EntryChoice::Direct,
            graph: true,
            ..Request::new(vec!["__x64_sys_*".into()], ModeChoice::Exitless, 2)
        };
        let p = TracePlan::build(KernelImage::load(&path).unwrap(), &req).unwrap();
        let sites = p.plan.index.addrs.len();
        assert!(sites > direct_with_graph(), "{sites} sites");
        assert!(code_needs_own_memory(&p.plan));
        let room = |own_code| {
            Ok(Room {
                pages: PAGES,
                own_rings: own_code,
                own_code,
                ring_area: 0,
                found: (),
            })
        };
        assert!(matches!(
            decided(&p, room(false)).unwrap_err(),
            Refused::Plan(AttachModeError::DirectWithGraph { .. })
        ));
        let Ok(Decision::Exitless(code, ())) = decided(&p, room(true)) else {
            panic!("no exitless decision with the region in own memory")
        };
        let l = code.layout();
        assert_eq!(l.sites, sites);
        assert!(2 * l.ring_bytes <= FRAME_NEXT_OFF, "{l:?}");
        // Without the graph, or with a few direct entries, the free pages do.
        let few = Request {
            entry: crate::plan::entry::EntryChoice::Direct,
            graph: true,
            ..Request::new(vec!["hrtimer_*".into()], ModeChoice::Exitless, 2)
        };
        let few = TracePlan::build(KernelImage::load(&path).unwrap(), &few).unwrap();
        assert!(!code_needs_own_memory(&few.plan));
    }

    #[test]
    fn direct_stubs_take_pages_of_their_own() {
        // The return trap sits 16 bytes below a page's end: 63 stubs share
        // its page; the function graph leaves them no other.
        assert_eq!(RETURN_TRAP_OFF % PAGE, PAGE - 16);
        assert_eq!(direct_with_graph(), 63);
        assert_eq!(direct_stub_pages(63), 0);
        assert_eq!(direct_stub_pages(64), 1);
        // 1,000 direct entries: 62.5 KiB of stubs, 59 KiB below the
        // return trap's page.
        assert_eq!(direct_stub_pages(1000), 15);
    }

    #[test]
    fn auto_falls_back_where_the_guest_says_it_may_and_no_further() {
        let Some(auto) = plan(ModeChoice::Auto, false, false) else {
            return;
        };
        let Ok(Decision::Trap { why: Some(why) }) = decided(&auto, Err(Why("no room", true)))
        else {
            panic!("auto did not fall back")
        };
        assert_eq!(why, "no room");
        // A reason without a fallback (a guest still booting) is said.
        assert!(matches!(
            decided(&auto, Err(Why("booting", false))),
            Err(Refused::Room(Why("booting", false)))
        ));
        // Exitless asked: no fallback.
        let exitless = plan(ModeChoice::Exitless, false, false).unwrap();
        assert!(matches!(
            decided(&exitless, Err(Why("no room", true))),
            Err(Refused::Room(_))
        ));
        // Trap asked: the guest is not even looked at.
        let trap = plan(ModeChoice::Trap, false, false).unwrap();
        let d = decide(
            &trap,
            2,
            || -> Result<Room<()>, Why> { panic!("looked") },
            |_| true,
        );
        assert!(matches!(d, Ok(Decision::Trap { why: None })));
    }

    #[test]
    fn stacks_trap_and_the_graph_traps_without_room() {
        let Some(auto) = plan(ModeChoice::Auto, false, true) else {
            return;
        };
        let Ok(Decision::Trap { why: Some(why) }) = decided(&auto, pages(PAGES)) else {
            panic!("stacks in auto mode did not trap")
        };
        assert_eq!(why, STACKS_AT_BREAKPOINTS);
        let exitless = plan(ModeChoice::Exitless, false, true).unwrap();
        let Err(Refused::Plan(e)) = decided(&exitless, pages(PAGES)) else {
            panic!("stacks in exitless mode were planned")
        };
        assert_eq!(
            e.to_string(),
            "kernel stacks are unwound while a breakpoint holds the guest, and exitless calls \
             never stop it; trace in trap mode"
        );
        // The graph in trap mode: breakpoints at the returns (refused
        // before: `GraphNeedsRoom`), asked or where auto falls back.
        let trap = plan(ModeChoice::Trap, true, false).unwrap();
        assert!(matches!(
            decided(&trap, pages(PAGES)),
            Ok(Decision::Trap { why: None })
        ));
        let auto = plan(ModeChoice::Auto, true, false).unwrap();
        let Ok(Decision::Trap { why: Some(why) }) = decided(&auto, Err(Why("no room", true)))
        else {
            panic!("the graph in auto mode did not fall back to trap mode")
        };
        assert_eq!(why, "no room");
    }

    /// Every function of the default guest (guest/out/vmlinux, 9,865
    /// sites): bodies per site where the pages hold them, else the shared
    /// body in its 152 free pages, rings beside it.
    #[test]
    fn every_function_fits_the_free_pages_with_the_shared_body() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/vmlinux");
        if !path.is_file() {
            eprintln!("SKIPPED: {} is not built", path.display());
            return;
        }
        let req = Request::new(vec!["*".into()], ModeChoice::Exitless, 2);
        let p = TracePlan::build(KernelImage::load(&path).unwrap(), &req).unwrap();
        let code_pages = |n| match decided(&p, pages(n)) {
            Ok(Decision::Exitless(code, ())) => code.code_pages(),
            _ => panic!("no exitless decision in {n} pages"),
        };
        let (wide, few) = (code_pages(1024), code_pages(152));
        assert!(few * 3 < wide, "{few} pages, {wide} per site");
    }
}
