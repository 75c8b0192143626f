//! How a QEMU session traces, decided at the first stop: exitless where
//! the guest has room for vmtrace's code and rings (its free low memory,
//! its TSC rate, rings that fit), else (in auto mode) through gdbstub
//! breakpoints (`breakpoints`), saying why.

use vmm::gva::{AddressSpace, Level};
use vmm::Stopped;

use super::error::QemuError;
use super::guest::QemuStop;
use crate::error::TracerError;
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::lowmem::{self, LowMemError, LowMemory};
use crate::kernel::symbols::KernelImage;
use crate::plan::{ModeChoice, Plan};
use crate::session::exitless::backing::{CODE_SLOTS, GRAPH_BOTTOM, PAGE, STUB_PAGES, TABLE_SLOTS};
use crate::session::exitless::layout::{
    RingLayout, CODE_VA, LARGE_PAGE, MAX_RECORDS, MIN_RECORDS, PD_COUNT,
};
use crate::session::exitless::state::Exitless;
use crate::session::exitless::state::Records;

/// Where exitless mode's region can live and how fast the guest's TSC
/// runs, from the first stop.
pub struct Room {
    pub low: LowMemory,
    pub tsc_khz: u32,
    /// Records per ring.
    pub cap: u64,
}

/// Room for exitless mode in the stopped guest: its free low memory, its
/// TSC rate, rings that fit.
pub fn room(stop: &QemuStop<'_>, plan: &Plan, offset: KernelOffset) -> Result<Room, QemuError> {
    let mut space = kernel_space(stop, &plan.image, offset)?;
    // A region an earlier attach had to leave (calls that had not
    // returned through it) lives in the same free pages: nothing may be
    // written there while it is mapped.
    let left = (0..PD_COUNT as u64)
        .map(|i| space.entry(CODE_VA + i * LARGE_PAGE, Level::Pd))
        .any(|e| e.is_ok_and(|e| !e.is_empty()));
    if left {
        return Err(QemuError::RegionLeft);
    }
    let low = lowmem::find(&mut space, &plan.image, offset)?;
    let tsc_khz = match plan.image.symbol("tsc_khz") {
        Some(s) => space
            .read_array::<4>(offset.runtime(s.addr))
            .map(u32::from_le_bytes)
            .unwrap_or(0),
        None => 0,
    };
    // 0 when the kernel found no usable TSC (TCG's): the host's rate is
    // the guest's (`clock`).
    let tsc_khz = match tsc_khz {
        0 => super::clock::host_tsc_khz(),
        k => k,
    };
    if tsc_khz == 0 {
        return Err(QemuError::NoTscRate(tsc_khz));
    }
    let cap = ring_records(plan, stop.cpus(), low.pages.len())?;
    Ok(Room { low, tsc_khz, cap })
}

/// How a session traces: exitless (with its room), or through gdbstub
/// breakpoints (with why, when it fell back).
#[derive(Debug)]
pub enum Decision<T> {
    Exitless(T),
    Trap { why: Option<String> },
}

/// The mode asked for, decided at the first stop: `Auto` is exitless where
/// the guest has room for it (`room`), else trap mode through the stub,
/// saying why; an exitless mode asked for has no fallback.
pub fn decide<T>(
    mode: ModeChoice,
    room: impl FnOnce() -> Result<T, QemuError>,
) -> Result<Decision<T>, QemuError> {
    match mode {
        ModeChoice::Trap => Ok(Decision::Trap { why: None }),
        ModeChoice::Exitless => room().map(Decision::Exitless),
        ModeChoice::Auto => match room() {
            Ok(r) => Ok(Decision::Exitless(r)),
            Err(e) if falls_back(&e) => Ok(Decision::Trap {
                why: Some(e.to_string()),
            }),
            Err(e) => Err(e),
        },
    }
}

/// Errors that leave exitless mode no room in this guest (and trap mode
/// through the stub unaffected); a guest still booting is none of them.
fn falls_back(e: &QemuError) -> bool {
    match e {
        QemuError::NoRoom(LowMemError::Booting) => false,
        QemuError::NoRoom(_) | QemuError::NoTscRate(_) | QemuError::RingsTooBig { .. } => true,
        // vmtrace's own region left by an earlier attach: said as it is
        // (it goes at the guest's reboot), no slow fallback.
        _ => false,
    }
}

/// The kernel's own page tables (never a PTI user table), as an attach
/// picks them.
fn kernel_space<'a>(
    stop: &'a QemuStop<'_>,
    image: &KernelImage,
    offset: KernelOffset,
) -> Result<AddressSpace<'a>, QemuError> {
    // Kernel data must be mapped (a PTI user table maps only text).
    let probes: Vec<u64> = ["e820_table", "linux_banner"]
        .iter()
        .filter_map(|n| image.symbol(n))
        .map(|s| offset.runtime(s.addr))
        .collect();
    crate::session::kernel_space(stop.vcpu_spaces(), &probes)
        .ok_or_else(|| QemuError::NotTraceable("no vCPU maps the kernel's data".into()))
}

/// Records per ring so that code, tables and every CPU's ring fit `pages`
/// free pages (the largest power of two that does).
fn ring_records(plan: &Plan, cpus: usize, pages: usize) -> Result<u64, QemuError> {
    let sites = plan.index.addrs.len();
    let code = Exitless::code_pages(&plan.image, cpus, sites, Records::of(plan))
        .map_err(TracerError::from)?;
    // The pages below the rings (`backing::RegionPages`): the tables and
    // the code; with the function graph, its parts at their fixed places.
    let bottom = match plan.graph {
        false => TABLE_SLOTS + code,
        // (The code's pages count the return stubs' too.)
        true if code.saturating_sub(STUB_PAGES) <= CODE_SLOTS => GRAPH_BOTTOM,
        true => pages + 1,
    };
    let room = pages.saturating_sub(bottom) as u64 * PAGE / cpus.max(1) as u64;
    let fits = |cap| {
        RingLayout::with_args(cpus, sites, Some(cap), plan.graph, plan.values.args)
            .is_ok_and(|l| l.ring_bytes <= room)
    };
    if !fits(MIN_RECORDS) {
        return Err(QemuError::RingsTooBig {
            sites,
            cpus,
            kib: pages as u64 * PAGE / 1024,
        });
    }
    let mut cap = MIN_RECORDS;
    while cap < MAX_RECORDS && fits(cap * 2) {
        cap *= 2;
    }
    Ok(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_room(e: LowMemError) -> impl FnOnce() -> Result<(), QemuError> {
        move || Err(QemuError::NoRoom(e))
    }

    #[test]
    fn auto_falls_back_to_trap_where_the_guest_has_no_room_and_says_why() {
        let d = decide(ModeChoice::Auto, no_room(LowMemError::TooOld(5, 10))).unwrap();
        let Decision::Trap { why: Some(why) } = d else {
            panic!("{d:?}")
        };
        assert!(
            why.starts_with("no guest memory is free for vmtrace's code and rings: ")
                && why.contains("Linux 5.10, older than 5.13"),
            "{why}"
        );
        let rings = || -> Result<(), QemuError> {
            Err(QemuError::RingsTooBig {
                sites: 9000,
                cpus: 64,
                kib: 600,
            })
        };
        assert!(matches!(
            decide(ModeChoice::Auto, rings).unwrap(),
            Decision::Trap { why: Some(_) }
        ));
        let sym = no_room(LowMemError::NoSymbol("real_mode_header"));
        assert!(matches!(
            decide(ModeChoice::Auto, sym).unwrap(),
            Decision::Trap { why: Some(_) }
        ));
    }

    #[test]
    fn auto_is_exitless_where_there_is_room_and_no_fallback_else() {
        assert!(matches!(
            decide(ModeChoice::Auto, || Ok(7)).unwrap(),
            Decision::Exitless(7)
        ));
        // Asked for: no fallback.
        let e = decide(ModeChoice::Exitless, no_room(LowMemError::TooOld(5, 4)));
        assert!(matches!(
            e,
            Err(QemuError::NoRoom(LowMemError::TooOld(5, 4)))
        ));
        // An earlier attach's region still mapped (graph calls in flight):
        // said, not worked around.
        let left = || -> Result<(), QemuError> { Err(QemuError::RegionLeft) };
        assert!(matches!(
            decide(ModeChoice::Auto, left),
            Err(QemuError::RegionLeft)
        ));
        // A guest still booting is not ready, not roomless.
        let e = decide(ModeChoice::Auto, no_room(LowMemError::Booting));
        assert!(matches!(e, Err(QemuError::NoRoom(LowMemError::Booting))));
        // Trap asked for: the guest is not even looked at.
        let d = decide(ModeChoice::Trap, || -> Result<(), QemuError> {
            panic!("looked for room")
        });
        assert!(matches!(d.unwrap(), Decision::Trap { why: None }));
    }
}
