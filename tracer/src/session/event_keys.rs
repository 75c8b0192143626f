//! `-e` on the own VMM, on a kernel without jump labels (the project's
//! guests): there each inlined `trace_NAME()` reads its key's `enabled`
//! count and, with static calls, then tests `tp->funcs`
//! (`crate::kernel::events::counted`). The own VMM owns the guest from its
//! first instruction, so under the attach's stop vmtrace sets each
//! traced event's count to 1 (refused when the guest has set it) and puts
//! its trap (`out`, as at an ftrace site: `crate::session::patch`) over
//! each `test R, R` of `tp->funcs` (R any 64-bit register: the compiler
//! picks it). The trap passes the test as a breakpoint does under `vmtrace
//! attach` (`enabled_branch`): R NULL
//! becomes the address 8 bytes before `tp->funcs`, so `__data` reads
//! NULL, and the vCPU resumes past the `je`, where the call reaches
//! `__traceiter_NAME`, whose own ftrace site records the event. At the
//! detach the tests get their bytes back with every other site, and each
//! count still 1 with no probe in `tp->funcs` is set back to 0; a count
//! the guest changed meanwhile (its own perf or ftrace) is left to it.

use std::sync::Arc;

use vm_memory::GuestAddress;
use vmm::gva::{AddressSpace, PhysSpan};
use vmm::{GuestRam, Trap};

use super::patch::{self, PatchError, PatchedSite, Surveyed};
use super::Tracer;
use crate::error::TracerError;
use crate::kernel::events::enabled_branch::redirect_load;
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::sites::SITE_LEN;
use crate::plan::events::EventPlan;
use crate::plan::site_index::OUT_LEN;

/// `test r64, r64` of one register: REX.W (with R and B for R8-R15),
/// `85`, then ModRM mod 11 with the register in both fields.
const REX_W: u8 = 0x48;
const REX_RB: u8 = 0x05;
const TEST_OPCODE: u8 = 0x85;
const MODRM_REGS: u8 = 0xc0;
/// The general-purpose registers by their number in the encoding
/// (`Trap::gprs`), as `FuncsTest::reg` names them.
pub(crate) const GPRS: [&str; 16] = [
    "rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13",
    "r14", "r15",
];

/// The 3 bytes of `test R, R` for register number `n`.
pub(crate) fn test_bytes(n: u8) -> [u8; 3] {
    let rex = REX_W | if n >= 8 { REX_RB } else { 0 };
    [rex, TEST_OPCODE, MODRM_REGS | (n & 7) << 3 | (n & 7)]
}
/// A `nop` after the 2-byte `out`, over the test's last byte.
const NOP1: u8 = 0x90;
/// The bytes of a `mov r64, [rip + disp32]` before its ModRM: REX.W, 8B.
/// The 5 after them (ModRM, disp32) are the site written.
const LOAD_HEAD: u64 = 2;

/// One `tp->funcs` test that traps (link-time addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TestTrap {
    pub test: u64,
    pub after_je: u64,
    pub funcs: u64,
    /// The register tested, by its number (`Trap::gprs`).
    pub reg: u8,
}

/// The tests the recorders pass, sorted by address.
#[derive(Debug, Default)]
pub struct TestTraps {
    traps: Vec<TestTrap>,
}

impl TestTraps {
    /// The tests of `plan`'s events when the kernel has no jump labels
    /// (else none: jump-label events are `vmtrace attach`'s).
    pub fn of(plan: &EventPlan) -> Option<Arc<TestTraps>> {
        if !plan.counted_keys || plan.is_empty() {
            return None;
        }
        let mut traps: Vec<TestTrap> = plan
            .events
            .iter()
            .flat_map(|e| e.tests.iter().map(move |t| (e, t)))
            .filter_map(|(e, t)| {
                Some(TestTrap {
                    test: t.test,
                    after_je: t.after_je,
                    funcs: e.funcs,
                    reg: GPRS.iter().position(|&r| r == t.reg)? as u8,
                })
            })
            .collect();
        traps.sort_unstable_by_key(|t| t.test);
        traps.dedup_by_key(|t| t.test);
        Some(Arc::new(TestTraps { traps }))
    }

    pub fn len(&self) -> usize {
        self.traps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.traps.is_empty()
    }

    /// The test a trap at link-time `rip` came from: at its `out` or
    /// just past it (`SiteIndex::find`).
    fn find(&self, rip: u64) -> Option<&TestTrap> {
        let at = |a: u64| {
            self.traps
                .binary_search_by_key(&a, |t| t.test)
                .ok()
                .map(|i| &self.traps[i])
        };
        at(rip).or_else(|| at(rip.wrapping_sub(OUT_LEN)))
    }

    /// Pass the test a trap came from, if it came from one (`slide`: the
    /// running kernel's KASLR offset): the tested register NULL made
    /// `tp->funcs - 8`, the vCPU moved past the `je`. A probe of the
    /// guest's (the register not NULL) is called as the kernel would.
    pub fn pass(&self, trap: &mut Trap<'_>, slide: i64) -> bool {
        let Some(t) = self.find(trap.rip.wrapping_sub(slide as u64)) else {
            return false;
        };
        let reg = usize::from(t.reg);
        if trap.gprs[reg] == 0 {
            trap.set_gpr(reg, t.funcs.wrapping_add_signed(slide).wrapping_sub(8));
        }
        trap.set_rip(t.after_je.wrapping_add_signed(slide));
        true
    }
}

impl Tracer {
    /// `-e` on a kernel without jump labels (`event_keys`), after every
    /// other site is written: on an error every site is given back.
    pub(super) fn enable_events(
        &mut self,
        space: &mut AddressSpace<'_>,
        off: KernelOffset,
        ram: &Arc<dyn GuestRam>,
    ) -> Result<(), TracerError> {
        let Some(traps) = TestTraps::of(&self.plan.events) else {
            return Ok(());
        };
        let exitless = self.reach.exitless().is_some();
        match enable(space, off, &self.plan.events, &traps, exitless) {
            Ok((sites, keys)) => {
                self.attach_counts.event_tests = sites.len();
                self.attach_counts.event_keys = keys.len();
                self.patched.extend(sites);
                self.event_keys = keys;
                Ok(())
            }
            Err(e) => {
                self.detach(&**ram)?;
                Err(e.into())
            }
        }
    }
}

/// A key vmtrace set: where its count and its `tp->funcs` are.
#[derive(Clone, Debug)]
pub struct SetKey {
    count_gpa: u64,
    funcs_gpa: u64,
}

/// The attach's writes for the events, under its stop, after every other
/// site's: the traps over the tests (`exitless`: the loads of `tp->funcs`
/// made to read `tp->iterator` instead, `redirected_loads`), then the
/// counts. Nothing written when a key's count is not 0 (the guest's own).
pub fn enable(
    space: &mut AddressSpace<'_>,
    off: KernelOffset,
    plan: &EventPlan,
    traps: &TestTraps,
    exitless: bool,
) -> Result<(Vec<PatchedSite>, Vec<SetKey>), PatchError> {
    let mut keys = Vec::new();
    for e in plan.events.iter() {
        let (key, funcs) = (off.runtime(e.key), off.runtime(e.funcs));
        let gpa = |space: &mut AddressSpace<'_>, va: u64| {
            space.gpa(va).map_err(|err| PatchError::Memory {
                addr: va,
                gpa: 0,
                why: err.to_string(),
            })
        };
        let (count_gpa, funcs_gpa) = (gpa(space, key)?, gpa(space, funcs)?);
        let count: u32 = read(space.memory(), key, count_gpa)?;
        if count != 0 {
            return Err(PatchError::EventKeyEnabled {
                event: e.full_name(),
                addr: key,
                count,
            });
        }
        keys.push(SetKey {
            count_gpa,
            funcs_gpa,
        });
    }
    let (found, written) = match exitless {
        true => redirected_loads(space, off, plan)?,
        false => trapped_tests(space, off, traps)?,
    };
    let (sites, _) = patch::write(space.memory(), Surveyed::entries(found, 0), |k, _| {
        Ok(written[k])
    })?;
    for k in &keys {
        write(space.memory(), k.count_gpa, 1u32)?;
    }
    Ok((sites, keys))
}

/// Sites to write (index, running address, place, bytes there) and what
/// each gets.
type Found = (
    Vec<(usize, u64, PhysSpan, [u8; SITE_LEN])>,
    Vec<[u8; SITE_LEN]>,
);

/// The 5 bytes at `addr` in the running kernel, and where they are.
fn bytes_at(
    space: &mut AddressSpace<'_>,
    addr: u64,
) -> Result<(PhysSpan, [u8; SITE_LEN]), PatchError> {
    let span = space
        .span(addr, SITE_LEN)
        .map_err(|err| PatchError::Memory {
            addr,
            gpa: 0,
            why: err.to_string(),
        })?;
    let mut original = [0u8; SITE_LEN];
    span.read(space.memory(), &mut original)
        .map_err(|err| PatchError::Memory {
            addr,
            gpa: span.start(),
            why: err.to_string(),
        })?;
    Ok((span, original))
}

/// Trap mode: each test (`test R, R` of its register), its trap's bytes (`trapped`).
fn trapped_tests(
    space: &mut AddressSpace<'_>,
    off: KernelOffset,
    traps: &TestTraps,
) -> Result<Found, PatchError> {
    let mut found = Vec::new();
    let mut written = vec![[0u8; SITE_LEN]; traps.traps.len()];
    for (k, t) in traps.traps.iter().enumerate() {
        let addr = off.runtime(t.test);
        let (span, original) = bytes_at(space, addr)?;
        // The running text must be the image's test (else the kernel is
        // not the planned one, or changed its text): left alone.
        if original[..3] == test_bytes(t.reg) {
            written[k] = trapped(original);
            found.push((k, addr, span, original));
        }
    }
    Ok((found, written))
}

/// Exitless mode, no exit per event: each test's load of `tp->funcs`
/// (`mov R, [rip + disp32]`, 7 bytes: REX, 8B, ModRM, disp32) made to
/// read `tp->iterator`, which holds `__traceiter_NAME`'s address, never
/// NULL (as `vmtrace attach` does, `crate::qemu::funcs_loads`): the test
/// passes, whatever register it tests, and the call reaches
/// `__traceiter_NAME`, recorded by the trampoline at its site. The 5 bytes
/// written are the load's last (ModRM and displacement), of which only
/// the displacement changes; a load that does not read so is left alone.
fn redirected_loads(
    space: &mut AddressSpace<'_>,
    off: KernelOffset,
    plan: &EventPlan,
) -> Result<Found, PatchError> {
    let loads = plan
        .events
        .iter()
        .flat_map(|e| e.tests.iter().map(move |t| (e, t)));
    let (mut found, mut written) = (Vec::new(), Vec::new());
    for (e, t) in loads {
        let addr = off.runtime(t.load);
        let (_, head) = bytes_at(space, addr)?;
        let (span, original) = bytes_at(space, addr + LOAD_HEAD)?;
        let mut insn = head[..LOAD_HEAD as usize].to_vec();
        insn.extend_from_slice(&original);
        let (from, to) = (off.runtime(e.funcs), off.runtime(e.iterator_cell));
        let Ok(new) = redirect_load(&insn, addr, from, to) else {
            continue;
        };
        if new.len() != insn.len() || new[..LOAD_HEAD as usize] != insn[..LOAD_HEAD as usize] {
            continue;
        }
        let mut bytes = [0u8; SITE_LEN];
        bytes.copy_from_slice(&new[LOAD_HEAD as usize..]);
        found.push((written.len(), addr + LOAD_HEAD, span, original));
        written.push(bytes);
    }
    Ok((found, written))
}

/// Give back each count still 1 with no probe of the guest's; returns
/// how many.
pub fn restore(mem: &dyn GuestRam, keys: &[SetKey]) -> usize {
    keys.iter()
        .filter(|k| {
            let count = mem.read_obj::<u32>(GuestAddress(k.count_gpa)).ok();
            let funcs = mem.read_obj::<u64>(GuestAddress(k.funcs_gpa)).ok();
            count == Some(1)
                && funcs == Some(0)
                && mem.write_obj(0u32, GuestAddress(k.count_gpa)).is_ok()
        })
        .count()
}

/// The test's 5 bytes as written: the trap's `out`, a `nop` over the
/// test's last byte, and the two bytes after the test (the `je`'s) as
/// they are: a context interrupted between the test and the `je`
/// returns to the `je` unchanged.
fn trapped(original: [u8; SITE_LEN]) -> [u8; SITE_LEN] {
    let mut b = original;
    b[..OUT_LEN as usize].copy_from_slice(&patch::TRAP[..OUT_LEN as usize]);
    b[OUT_LEN as usize] = NOP1;
    b
}

fn read(mem: &dyn GuestRam, addr: u64, gpa: u64) -> Result<u32, PatchError> {
    mem.read_obj::<u32>(GuestAddress(gpa))
        .map_err(|e| PatchError::Memory {
            addr,
            gpa,
            why: e.to_string(),
        })
}

fn write(mem: &dyn GuestRam, gpa: u64, v: u32) -> Result<(), PatchError> {
    mem.write_obj(v, GuestAddress(gpa))
        .map_err(|e| PatchError::Memory {
            addr: 0,
            gpa,
            why: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};
    use vm_memory::GuestMemoryMmap;
    use vmm::gva::PagingMode;

    #[test]
    fn a_trapped_test_is_out_and_nop_before_the_je_as_it_was() {
        // `test rax,rax; je +0x15`, as in 6.1's `__schedule`.
        let b = trapped([0x48, 0x85, 0xc0, 0x74, 0x15]);
        let mut d = Decoder::with_ip(64, &b, 0x1000, DecoderOptions::NONE);
        let out = d.decode();
        assert_eq!(out.mnemonic(), Mnemonic::Out);
        assert_eq!(out.immediate8(), vmm::layout::TRACE_PORT as u8);
        assert_eq!(d.decode().mnemonic(), Mnemonic::Nop);
        let je = d.decode();
        assert_eq!(
            (je.mnemonic(), je.near_branch_target()),
            (Mnemonic::Je, 0x101a)
        );
    }

    #[test]
    fn test_bytes_are_each_registers_test() {
        for (n, name) in GPRS.iter().enumerate() {
            let b = test_bytes(n as u8);
            let i = Decoder::with_ip(64, &b, 0, DecoderOptions::NONE).decode();
            assert_eq!(i.len(), 3, "{name}");
            assert_eq!(i.mnemonic(), Mnemonic::Test, "{name}");
            let reg = format!("{:?}", i.op0_register()).to_lowercase();
            assert_eq!((reg.as_str(), i.op1_register()), (*name, i.op0_register()));
        }
    }

    #[test]
    fn a_test_of_another_register_is_passed_in_that_register() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let t = TestTrap {
            test: 0xffff_ffff_8100_0100,
            after_je: 0xffff_ffff_8100_0105,
            funcs: 0xffff_ffff_8180_0038,
            reg: 12,
        };
        let traps = TestTraps { traps: vec![t] };
        let mut trap = Trap::for_bench(0, t.test, 0, 0, PagingMode::Level4, &mem);
        assert!(traps.pass(&mut trap, 0));
        assert_eq!(trap.new_gpr(), Some((12, t.funcs - 8)));
        // A probe of the guest's in R12: left to be called.
        let mut trap = Trap::for_bench(0, t.test, 0, 0, PagingMode::Level4, &mem);
        trap.gprs[12] = 0xffff_8880_0000_1000;
        assert!(traps.pass(&mut trap, 0));
        assert_eq!(trap.new_gpr(), None);
        assert_eq!(trap.new_rip(), Some(t.after_je));
    }

    #[test]
    fn a_trap_at_a_test_makes_funcs_read_null_and_moves_past_the_je() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let t = TestTrap {
            test: 0xffff_ffff_8100_0100,
            after_je: 0xffff_ffff_8100_0105,
            funcs: 0xffff_ffff_8180_0038,
            reg: 0,
        };
        let traps = TestTraps { traps: vec![t] };
        let slide = 0x1360_0000i64;
        // KVM leaves RIP at the `out` or past it: both are the test's.
        for past in [0, OUT_LEN] {
            let rip = t.test + slide as u64 + past;
            let mut trap = Trap::for_bench(0, rip, 0, 0, PagingMode::Level4, &mem);
            assert!(traps.pass(&mut trap, slide));
            assert_eq!(trap.new_gpr(), Some((0, t.funcs + slide as u64 - 8)));
            assert_eq!(trap.new_rip(), Some(t.after_je + slide as u64));
        }
        let mut trap = Trap::for_bench(0, t.test + 1, 0, 0, PagingMode::Level4, &mem);
        assert!(!traps.pass(&mut trap, 0));
        assert_eq!((trap.new_gpr(), trap.new_rip()), (None, None));
    }
}
