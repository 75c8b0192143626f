//! The exitless region's layout, shared by the trampoline generator, the
//! mapping code and the host collector. See the module comment of
//! `exitless` for the protocol.

use crate::advice::{Plain, Remedy, TracerAdvice, TracerWords};

/// Guest-physical base of vmtrace's own memory slot (the VMM's memory map
/// places it: above all RAM, never in the guest's e820 map).
pub const REGION_GPA: u64 = vmm::layout::PRIVATE_START;
/// Size of the slot: code (2 MiB), data (4 MiB), and a spare 2 MiB holding a
/// page directory for guests that have none for the fixmap range.
pub const REGION_LEN: u64 = vmm::layout::PRIVATE_SIZE;
/// 2 MiB: one page-directory entry with PS=1.
pub const LARGE_PAGE: u64 = 2 << 20;

/// Where the code is mapped: page-directory entry 508 of the top 1 GiB.
pub const CODE_VA: u64 = 0xffff_ffff_ff80_0000;
/// Where the code reads each CPU's ring's address (`RingLayout::table`):
/// a u64 per CPU at the start of the code page, before the first
/// instruction, read-only as the code is.
pub const RING_TABLE_VA: u64 = CODE_VA;
// Direct entries' reach rule assumes the stubs in the top 8 MiB.
const _: () = assert!(CODE_VA >= crate::kernel::direct::STUBS_FROM);
/// Code: the first 2 MiB of the region.
pub const CODE_GPA: u64 = REGION_GPA;
pub const CODE_LEN: u64 = LARGE_PAGE;
/// Data (the rings): entries 509 and 510, the next 4 MiB of the region.
pub const DATA_VA: u64 = CODE_VA + CODE_LEN;
pub const DATA_GPA: u64 = REGION_GPA + CODE_LEN;
pub const DATA_LEN: u64 = 2 * LARGE_PAGE;
/// A page directory of vmtrace's own, for a guest without one above
/// 0xffffffffc0000000 (the mini guest): the first page of the spare 2 MiB.
pub const SPARE_PD_GPA: u64 = DATA_GPA + DATA_LEN;
/// First page-directory index used (CODE_VA), and how many.
pub const PD_FIRST: usize = 508;
pub const PD_COUNT: usize = 3;

/// Rings larger than the data window (a ring device sized by `--buffer`,
/// `crate::qemu::ring_device`): page-upper-directory entry 508 of the
/// kernel's top 512 GiB, `0xffffffff00000000`, which Linux leaves empty
/// (Documentation/x86/x86_64/mm.rst: an unused hole between the EFI
/// region's top and the kernel text; `level3_kernel_pgt` fills only 510
/// and 511), gets a page directory of vmtrace's own whose 2 MiB entries
/// map the rings. The code reads each ring's 64-bit address from its
/// table, so the rings need not be within a disp32 of it.
pub const HIGH_RINGS_VA: u64 = crate::kernel::high_rings::HIGH_RINGS_VA;
/// The page-upper-directory entry of `HIGH_RINGS_VA`.
pub const HIGH_RINGS_PUD: usize = 508;
/// Most bytes of rings there: the 1 GiB entry 508 maps.
pub const HIGH_RINGS_MAX: u64 = 1 << 30;

/// Ring header fields: `head` and `limit` on cache lines of their own (the
/// guest writes one, the host the other). Both count bytes of records
/// (index * `RECORD_LEN`), so the trampoline turns a reserved head into its
/// slot's offset with one `and`.
pub const HEAD_OFF: u64 = 0;
pub const LIMIT_OFF: u64 = 64;
/// Per-site drop counters start here (then, with the function graph, the
/// per-site counters of returns not recorded: `RingLayout::ret_drops_off`).
pub const DROPS_OFF: u64 = 128;
/// One record: the commit word (u32: the site index + 1, written last; 0
/// while the slot is free, the host zeroes it when it consumes the record),
/// the task's pid (u32), the guest TSC, the parent, (function graph) the
/// stack slot of the return address, bit 0 set for a return, 0 for an
/// unhooked entry, and the current task's `task_struct` address (0 when
/// tasks are not recorded); the rest is unused, for the record to be a
/// power of two.
pub const RECORD_LEN: u64 = 64;
pub const REC_COMMIT: u64 = 0;
pub const REC_PID: u64 = 4;
pub const REC_TSC: u64 = 8;
pub const REC_PARENT: u64 = 16;
pub const REC_SLOT: u64 = 24;
pub const REC_TASK: u64 = 32;
/// Function graph with return values: a return's RAX.
pub const REC_RET: u64 = 40;
/// With arguments (`--args`): a record is `RECORD_LEN_ARGS` bytes, the
/// six argument registers (RDI, RSI, RDX, RCX, R8, R9) from `REC_ARGS`.
pub const RECORD_LEN_ARGS: u64 = 128;
pub const REC_ARGS: u64 = 64;
/// With strings copied at the event (`super::strcopy`: an event's fields
/// that do not last past it): a record is `RECORD_LEN_STRINGS` bytes, the
/// arguments' record and from `REC_STRINGS` the copies (their status words,
/// then their bytes).
pub const RECORD_LEN_STRINGS: u64 = 256;
pub const REC_STRINGS: u64 = RECORD_LEN_ARGS;
/// Calls the pid filter rejected on this CPU (u64, written by the guest:
/// on `head`'s cache line).
pub const FILTERED_OFF: u64 = 8;

/// Function graph: vmtrace's pool of hooked frames, at the end of the data
/// region. A frame: `busy` u32 (claimed with `xchg`), the site index u32,
/// the real return address u64.
pub const FRAME_LEN: u64 = 16;
pub const FRAME_BUSY: u64 = 0;
pub const FRAME_SITE: u64 = 4;
pub const FRAME_RET: u64 = 8;
/// Frames in the pool: live hooked calls at once, all guest stacks
/// together (a frame abandoned by its stack is never freed). A power of two.
pub const FRAMES: u64 = 1 << 14;
/// The pool's allocation counter (u32, on its own cache line), then the
/// frames.
pub const FRAME_NEXT_OFF: u64 = DATA_LEN - FRAMES * FRAME_LEN - 64;
pub const FRAMES_OFF: u64 = DATA_LEN - FRAMES * FRAME_LEN;
/// Each frame's return stub (`mov r11d, j; jmp`), `FRAME_LEN` bytes apart
/// like the frames, at the end of the code page: frame j's stub is at
/// `RET_STUBS_VA + j * FRAME_LEN`, so one `lea` turns a frame's offset into
/// its stub's address.
pub const RET_STUBS_OFF: u64 = CODE_LEN - FRAMES * FRAME_LEN;
pub const RET_STUBS_VA: u64 = CODE_VA + RET_STUBS_OFF;
/// Trap mode's return trap (`crate::plan::traps::RETURN_TRAP`), just below the return
/// stubs: never inside any exitless code, so the two can share the page
/// (the exitless graph image carries the same bytes there).
pub const RETURN_TRAP_OFF: u64 = RET_STUBS_OFF - 16;
pub const RETURN_TRAP_VA: u64 = CODE_VA + RETURN_TRAP_OFF;

/// Bytes per direct entry's stub slot (`crate::session::direct::stub`):
/// the head (5), the displaced instructions (at most 15 bytes each, a few
/// of them; a short branch grows to 6) and the jump back (5), rounded to a
/// cache line.
pub const STUB_SLOT: u64 = 64;

/// Bytes the stubs of `sites` direct sites take at the end of the code
/// page, before the return trap.
pub fn direct_stubs_len(sites: usize) -> u64 {
    sites as u64 * STUB_SLOT
}

/// Spare stub slots after a plan's direct sites' (issue 37): one per
/// spare site (`added`, `crate::plan::added_sites`) for the direct entries
/// of modules first loaded during the trace
/// (`crate::session::module_direct`), written at their loads. None with
/// the function graph: a QEMU's free pages leave its direct entries only
/// the return trap's page (`crate::plan::attach_mode`).
pub fn direct_spares(direct: bool, graph: bool, added: usize) -> usize {
    match direct && !graph {
        true => added,
        false => 0,
    }
}

// Every site a plan may have (`MAX_DIRECT_SITES`) has its stub slot.
const _: () = assert!(crate::plan::entry::MAX_DIRECT_SITES as u64 * STUB_SLOT <= RETURN_TRAP_OFF);

/// 4 KiB: a page, the unit of rings and of the region in free pages of
/// the guest's own (a running QEMU, which gives vmtrace no memory:
/// `crate::session::exitless::backing`).
pub const PAGE: u64 = 4096;
/// Region pages before the code: the spare page directory and the page
/// tables of the three page-directory entries (`map::table_page`).
pub const TABLE_SLOTS: usize = 4;
/// Free pages kept for the trampoline's own code (its first pages) before
/// the function graph's parts.
pub const CODE_SLOTS: usize = 8;
/// The function graph's return stubs (and the return trap's page below
/// them) at the end of the code, and its frame pool (and the counter's
/// page below it) at the end of the data: pages of each.
pub const STUB_PAGES: usize = ((CODE_LEN - RETURN_TRAP_OFF) / PAGE) as usize + 1;
/// In free pages of the guest's own (a running QEMU), direct entries'
/// stubs below the return trap's page take the slots of the graph's
/// return stubs, from the last down: this many pages (about 4,100 stubs
/// with those in the return trap's page), and none with the graph.
pub const DIRECT_STUB_PAGES: usize = STUB_PAGES - 1;
pub const POOL_PAGES: usize = ((DATA_LEN - FRAME_NEXT_OFF).div_ceil(PAGE)) as usize;
/// Free pages below the rings with the function graph, whatever the code.
pub const GRAPH_BOTTOM: usize = TABLE_SLOTS + CODE_SLOTS + STUB_PAGES + POOL_PAGES;

/// Why a ring layout cannot be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("{}", self.say(&Plain))]
    TooBig { cpus: usize, sites: usize, min: u64 },
    #[error("a ring of {0} records is not a power of two between 2 and 2^24")]
    BadCapacity(u64),
}

impl TracerAdvice for LayoutError {
    fn problem(&self, _: &dyn TracerWords) -> String {
        match self {
            LayoutError::TooBig { cpus, sites, min } => format!(
                "{cpus} CPUs x {sites} sites do not fit vmtrace's {} MiB of ring memory with at \
                 least {min} records per CPU",
                DATA_LEN >> 20
            ),
            e => e.to_string(),
        }
    }

    fn remedy(&self) -> Option<Remedy> {
        match self {
            LayoutError::TooBig { .. } => Some(Remedy::FewerFunctionsOrTrapMode),
            LayoutError::BadCapacity(_) => None,
        }
    }
}

/// What a record holds besides the call, which sets its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// The call alone (`RECORD_LEN`).
    Call,
    /// The argument registers too (`RECORD_LEN_ARGS`).
    Args,
    /// The arguments and the strings an event's body copies
    /// (`RECORD_LEN_STRINGS`).
    Strings,
}

impl RecordKind {
    /// `Args` with arguments, else `Call`.
    pub fn of_args(args: bool) -> RecordKind {
        match args {
            true => RecordKind::Args,
            false => RecordKind::Call,
        }
    }

    /// Bytes per record.
    pub fn record_len(self) -> u64 {
        match self {
            RecordKind::Call => RECORD_LEN,
            RecordKind::Args => RECORD_LEN_ARGS,
            RecordKind::Strings => RECORD_LEN_STRINGS,
        }
    }
}

/// Fewest records a ring may have.
pub const MIN_RECORDS: u64 = 2;
/// Most records a ring may have (keeps `cap * RECORD_LEN - 1`, the
/// trampoline's slot mask, an imm32 and rings small).
pub const MAX_RECORDS: u64 = 1 << 24;

/// The rings of one attach: `cpus` rings of `ring_bytes` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    pub cpus: usize,
    pub sites: usize,
    /// Function graph: return drop counters in each ring, and the frame
    /// pool after the rings.
    pub graph: bool,
    /// Records per ring (a power of two).
    pub cap: u64,
    /// Offset of the first record in a ring.
    pub records_off: u64,
    /// Bytes per ring (a multiple of 4 KiB).
    pub ring_bytes: u64,
    /// Records hold the call's arguments (`RECORD_LEN_ARGS` bytes each).
    pub args: bool,
    /// Records hold the strings events copy too (`RECORD_LEN_STRINGS`
    /// bytes each; `args` with them).
    pub strings: bool,
    /// Guest-virtual and guest-physical address of ring 0 (the others
    /// follow, `ring_bytes` apart): the data window (`DATA_VA`, `DATA_GPA`)
    /// unless `placed` elsewhere. The code reads each ring's address from a
    /// table (`RING_TABLE_VA`), so the rings may be anywhere.
    pub va: u64,
    pub gpa: u64,
}

const CACHE_LINE: u64 = 64;

fn align_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

impl RingLayout {
    /// Rings for `cpus` CPUs and `sites` sites: `records` per ring if given
    /// (a power of two), else as many as fit in the data region (less the
    /// frame pool with the function graph).
    pub fn new(
        cpus: usize,
        sites: usize,
        records: Option<u64>,
        graph: bool,
    ) -> Result<RingLayout, LayoutError> {
        RingLayout::with_args(cpus, sites, records, graph, false)
    }

    /// `new`, with records that hold the call's arguments when `args`.
    pub fn with_args(
        cpus: usize,
        sites: usize,
        records: Option<u64>,
        graph: bool,
        args: bool,
    ) -> Result<RingLayout, LayoutError> {
        RingLayout::with_kind(cpus, sites, records, graph, RecordKind::of_args(args))
    }

    /// `new`, with records of `kind`.
    pub fn with_kind(
        cpus: usize,
        sites: usize,
        records: Option<u64>,
        graph: bool,
        kind: RecordKind,
    ) -> Result<RingLayout, LayoutError> {
        let rings_len = if graph { FRAME_NEXT_OFF } else { DATA_LEN };
        RingLayout::within(cpus, sites, records, graph, kind, rings_len)
    }

    /// Rings of `cap` records at `HIGH_RINGS_VA`, all `cpus` of them in
    /// `area` bytes (at most `HIGH_RINGS_MAX`); their guest-physical
    /// address is set once the memory is there (`placed`). The function
    /// graph's frame pool stays in the data window.
    pub fn high(
        cpus: usize,
        sites: usize,
        cap: u64,
        graph: bool,
        kind: RecordKind,
        area: u64,
    ) -> Result<RingLayout, LayoutError> {
        let l = RingLayout::within(
            cpus,
            sites,
            Some(cap),
            graph,
            kind,
            area.min(HIGH_RINGS_MAX),
        )?;
        Ok(l.placed(HIGH_RINGS_VA, 0))
    }

    /// `with_kind`, the rings in `rings_len` bytes.
    fn within(
        cpus: usize,
        sites: usize,
        records: Option<u64>,
        graph: bool,
        kind: RecordKind,
        rings_len: u64,
    ) -> Result<RingLayout, LayoutError> {
        let record_len = kind.record_len();
        let counters = if graph { 2 } else { 1 };
        let records_off = align_up(DROPS_OFF + counters * sites as u64 * 8, CACHE_LINE);
        let per_ring = rings_len / cpus.max(1) as u64;
        let cap = match records {
            Some(n) if !n.is_power_of_two() || !(MIN_RECORDS..=MAX_RECORDS).contains(&n) => {
                return Err(LayoutError::BadCapacity(n))
            }
            Some(n) => n,
            None => {
                let room = per_ring.saturating_sub(records_off) / record_len;
                let mut cap = 1u64 << (63 - room.max(1).leading_zeros());
                cap = cap.min(MAX_RECORDS);
                // Round the ring to pages without outgrowing its share.
                while cap >= MIN_RECORDS
                    && align_up(records_off + cap * record_len, PAGE) > per_ring
                {
                    cap /= 2;
                }
                cap
            }
        };
        let ring_bytes = align_up(records_off + cap * record_len, PAGE);
        if cap < MIN_RECORDS || ring_bytes * cpus as u64 > rings_len {
            return Err(LayoutError::TooBig {
                cpus,
                sites,
                min: MIN_RECORDS.max(records.unwrap_or(0)),
            });
        }
        Ok(RingLayout {
            cpus,
            sites,
            graph,
            cap,
            records_off,
            ring_bytes,
            args: kind != RecordKind::Call,
            strings: kind == RecordKind::Strings,
            va: DATA_VA,
            gpa: DATA_GPA,
        })
    }

    /// The same rings with ring 0 at guest-virtual `va` and guest-physical
    /// `gpa`.
    pub fn placed(self, va: u64, gpa: u64) -> RingLayout {
        RingLayout { va, gpa, ..self }
    }

    /// The rings are at `HIGH_RINGS_VA` (`high`), not in the data window.
    pub fn is_high(&self) -> bool {
        self.va == HIGH_RINGS_VA
    }

    /// Bytes all the rings take.
    pub fn rings_len(&self) -> u64 {
        self.ring_bytes * self.cpus as u64
    }

    /// Bytes per record.
    pub fn record_len(&self) -> u64 {
        self.kind().record_len()
    }

    /// What each record holds.
    pub fn kind(&self) -> RecordKind {
        match (self.strings, self.args) {
            (true, _) => RecordKind::Strings,
            (false, true) => RecordKind::Args,
            (false, false) => RecordKind::Call,
        }
    }

    /// The rings' table (`RING_TABLE_VA`): each CPU's ring's address.
    pub fn table(&self) -> Vec<u64> {
        (0..self.cpus).map(|cpu| self.ring_va(cpu)).collect()
    }

    /// Guest-virtual and guest-physical address of CPU `cpu`'s ring.
    pub fn ring_va(&self, cpu: usize) -> u64 {
        self.va + cpu as u64 * self.ring_bytes
    }
    pub fn ring_gpa(&self, cpu: usize) -> u64 {
        self.gpa + cpu as u64 * self.ring_bytes
    }

    /// Offset in a ring of the per-site counters of returns not recorded
    /// (function graph).
    pub fn ret_drops_off(&self) -> u64 {
        DROPS_OFF + self.sites as u64 * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_addresses_are_the_fixmap_entries_and_reachable_as_imm32() {
        assert_eq!((CODE_VA >> 21) & 511, PD_FIRST as u64);
        assert_eq!(
            ((DATA_VA + DATA_LEN - 1) >> 21) & 511,
            (PD_FIRST + PD_COUNT - 1) as u64
        );
        // Sign-extended 32-bit displacements reach both.
        assert_eq!(CODE_VA as i64 as i32 as i64 as u64, CODE_VA);
        assert_eq!(
            (DATA_VA + DATA_LEN - 1) as i64 as i32 as i64 as u64,
            DATA_VA + DATA_LEN - 1
        );
        const { assert!(SPARE_PD_GPA + PAGE <= REGION_GPA + REGION_LEN) };
    }

    #[test]
    fn rings_fill_the_data_region_and_refuse_what_does_not_fit() {
        let l = RingLayout::new(4, 10, None, false).unwrap();
        assert!(l.cap.is_power_of_two() && l.cap >= 8 * 1024);
        assert!(l.ring_bytes * 4 <= DATA_LEN && l.ring_bytes.is_multiple_of(PAGE));
        assert_eq!(l.records_off, 256); // 128 + 10 * 8, to a cache line
        let small = RingLayout::new(1, 10, Some(4), false).unwrap();
        assert_eq!((small.cap, small.ring_bytes), (4, PAGE));
        assert_eq!(
            RingLayout::new(1, 1, Some(3), false),
            Err(LayoutError::BadCapacity(3))
        );
        assert!(matches!(
            RingLayout::new(64, 10_000, None, false),
            Err(LayoutError::TooBig { .. })
        ));
        assert_eq!(l.ring_va(1) - l.ring_va(0), l.ring_bytes);
        // With the graph: return counters, and the rings end before the pool.
        let g = RingLayout::new(4, 10, None, true).unwrap();
        assert_eq!(g.records_off, 320); // 128 + 2 * 10 * 8, to a cache line
        assert_eq!(g.ret_drops_off(), 128 + 80);
        assert!(g.ring_bytes * 4 <= FRAME_NEXT_OFF);
        assert!(g.cap.is_power_of_two() && g.cap >= 8 * 1024);
    }

    #[test]
    fn high_rings_take_their_area_and_refuse_what_does_not_fit() {
        // 56 MiB for 2 CPUs: 16 MiB rings, past the data window's 4 MiB.
        let call = RecordKind::Call;
        let l = RingLayout::high(2, 10, 1 << 18, true, call, 56 << 20).unwrap();
        assert!(l.is_high() && l.va == HIGH_RINGS_VA);
        assert_eq!(l.ring_va(1), HIGH_RINGS_VA + l.ring_bytes);
        assert!(l.rings_len() <= 56 << 20 && l.rings_len() > DATA_LEN);
        assert!(matches!(
            RingLayout::high(4, 10, 1 << 18, false, call, 56 << 20),
            Err(LayoutError::TooBig { .. })
        ));
        // Never past entry 508's 1 GiB, whatever the area.
        assert!(RingLayout::high(2, 1, 1 << 24, false, call, 4 << 30).is_err());
        assert_eq!((HIGH_RINGS_VA >> 30) & 511, 508);
        assert_eq!(l.placed(l.va, 0x1_0080_0000).ring_gpa(0), 0x1_0080_0000);
    }

    #[test]
    fn frames_and_their_stubs_line_up() {
        assert_eq!(FRAMES_OFF + FRAMES * FRAME_LEN, DATA_LEN);
        assert_eq!(RET_STUBS_VA + FRAMES * FRAME_LEN, CODE_VA + CODE_LEN);
        // lea reg, [frame_offset + RET_STUBS_VA]: a sign-extended disp32;
        // frame fields are reached the same way from DATA_VA.
        assert_eq!(RET_STUBS_VA as i64 as i32 as i64 as u64, RET_STUBS_VA);
        assert_eq!(
            (DATA_VA + FRAME_NEXT_OFF) as i64 as i32 as i64 as u64,
            DATA_VA + FRAME_NEXT_OFF
        );
        assert!(FRAMES.is_power_of_two() && FRAME_LEN.is_power_of_two());
    }
}
