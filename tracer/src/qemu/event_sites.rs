//! The traced events' call sites in a QEMU guest: their NOPs made jumps in
//! a stop of vmtrace's once it has attached, and the NOPs put back at the
//! detach (and by `vmtrace detach`'s repair, from the journal).
//!
//! The guest's own `static_key_enable` of an event vmtrace enabled would
//! find vmtrace's jump where it expects its NOP, and BUG
//! (arch/x86/kernel/jump_label.c `__jump_label_patch`): a key the guest
//! has enabled (its `enabled` count above 0) is refused at the attach, and
//! at a breakpoint where the kernel checks and queues each site the call
//! returns at once, vmtrace's jump being the kernel's own
//! (`super::guarded_sites`; trap mode: `super::breakpoints`; exitless:
//! `super::event_guard`). The key's count is never written: once vmtrace
//! detaches, the guest's perf or ftrace enable the event as ever.

use vm_memory::GuestAddress;
use vmm::{GuestRam, Stopped};

use super::breakpoints::{Breakpoints, FuncsSkip};
use super::error::QemuError;
use super::event_guard::EventGuard;
use super::guest::QemuStop;
use super::journal::{hex, unhex, Journal, JournaledJump};
use super::static_guard::StaticGuard;
use crate::kernel::kaslr::KernelOffset;
use crate::plan::events::EventPlan;

/// What putting the NOPs back found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JumpsRestored {
    /// Jumps made NOPs again.
    pub restored: usize,
    /// Sites already their NOP.
    pub as_found: usize,
    /// Sites holding neither (left alone).
    pub other: usize,
    /// Sites whose key the guest has enabled since: its own jumps, left.
    pub guests: usize,
    /// Of `restored`: exitless mode's `tp->funcs` loads given back their
    /// displacement (`super::funcs_loads`).
    pub loads: usize,
}

impl std::fmt::Display for JumpsRestored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} event call sites given back their NOP ({} were as found, {} hold neither and are left alone, {} are the guest's own: it enabled their event since)",
            self.restored - self.loads,
            self.as_found,
            self.other,
            self.guests
        )?;
        match self.loads {
            0 => Ok(()),
            n => write!(f, "; {n} tp->funcs loads given back their address"),
        }
    }
}

fn read(ram: &dyn GuestRam, gpa: u64, len: usize) -> Result<Vec<u8>, QemuError> {
    let mut b = vec![0u8; len];
    ram.read_slice(&mut b, GuestAddress(gpa))
        .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
    Ok(b)
}

/// Every planned call site as it will be written, checked in `stop`: each
/// key's count 0 (the guest has not enabled the event), each site its NOP.
pub(super) fn check(
    stop: &QemuStop<'_>,
    events: &EventPlan,
    offset: KernelOffset,
) -> Result<Vec<JournaledJump>, QemuError> {
    let ram = &**stop.ram();
    let mut jumps = Vec::new();
    for e in &events.events {
        let phys = |va: u64, what: &str| {
            events.gpa(ram, offset, e, va).ok_or_else(|| {
                let runtime = offset.runtime(va);
                QemuError::NotTraceable(format!("{what} at {runtime:#x} is not mapped"))
            })
        };
        // struct static_key { atomic_t enabled; ... } (include/linux/jump_label.h).
        let count = read(ram, phys(e.key, "a static key")?, 4)?;
        let count = i32::from_le_bytes([count[0], count[1], count[2], count[3]]);
        if count != 0 {
            return Err(QemuError::EventEnabled {
                event: e.full_name(),
                count,
            });
        }
        let key_gpa = phys(e.key, "a static key")?;
        for s in &e.sites {
            let gpa = phys(s.code, "an event's call site")?;
            let now = read(ram, gpa, s.nop.len())?;
            if now != s.nop {
                return Err(QemuError::EventSite {
                    event: e.full_name(),
                    va: offset.runtime(s.code),
                    found: hex(&now),
                });
            }
            jumps.push(JournaledJump {
                module: None,
                va: offset.runtime(s.code),
                gpa,
                nop: hex(&s.nop),
                jump: hex(&s.jump),
                key_gpa,
            });
        }
    }
    Ok(jumps)
}

/// Each event's `tp->funcs` tests, as trap mode passes them (running
/// addresses); none for an event any of whose sites has no such test.
pub(super) fn skips(events: &EventPlan, offset: KernelOffset) -> Vec<FuncsSkip> {
    let whole = events
        .events
        .iter()
        .filter(|e| e.static_call && e.tests.len() == e.sites.len());
    whole
        .flat_map(|e| e.tests.iter().map(move |t| (e, t)))
        .map(|(e, t)| FuncsSkip {
            test: offset.runtime(t.test),
            after_je: offset.runtime(t.after_je),
            reg: t.reg.clone(),
            value: offset.runtime(e.funcs) - 8,
        })
        .collect()
}

/// Enables the events' call sites in a stop of their own, the journal
/// naming them (and, in trap mode, the breakpoints at their `tp->funcs`
/// tests, set first; in exitless mode, the guard's) before the first is
/// written, each in a module of `image` naming it. Exitless mode: the
/// guard set (`super::event_guard`), None when the kernel lacks what it
/// needs.
pub(super) fn enable(
    guest: &super::guest::QemuGuest,
    (events, image): (&EventPlan, &crate::kernel::symbols::KernelImage),
    offset: KernelOffset,
    journal: &mut Journal,
    breakpoints: Option<&mut Breakpoints>,
) -> Result<Option<EventGuard>, QemuError> {
    if events.events.is_empty() {
        return Ok(None);
    }
    let stop = guest.stop(false)?;
    match write(&stop, (events, image), offset, journal, breakpoints) {
        Ok(g) => {
            stop.resume()?;
            Ok(g)
        }
        Err(e) => {
            let _ = stop.resume();
            Err(e)
        }
    }
}

fn write(
    stop: &QemuStop<'_>,
    (events, image): (&EventPlan, &crate::kernel::symbols::KernelImage),
    offset: KernelOffset,
    journal: &mut Journal,
    breakpoints: Option<&mut Breakpoints>,
) -> Result<Option<EventGuard>, QemuError> {
    let mut jumps = check(stop, events, offset)?;
    if breakpoints.is_none() {
        // Exitless: no breakpoint passes the `tp->funcs` tests.
        jumps.extend(super::funcs_loads::plan(stop, events, offset)?);
    }
    super::event_modules::tag(&mut jumps, image);
    let event_guard = match breakpoints.is_none() {
        true => EventGuard::plan(events, offset, &jumps).ok().flatten(),
        false => None,
    };
    if let Some(g) = &event_guard {
        journal.record.breakpoints.extend(g.breakpoints());
    }
    let skips = match breakpoints.is_some() {
        true => skips(events, offset),
        false => Vec::new(),
    };
    journal
        .record
        .breakpoints
        .extend(skips.iter().map(|k| k.test));
    let guard = events.guard.filter(|_| breakpoints.is_some());
    let guard = guard.map(|g| offset.runtime(g));
    journal.record.breakpoints.extend(guard);
    // Trap mode: without `__static_call_update` the guest's first probe
    // gets the static call, and its events are not recorded (said in
    // docs/events.md).
    let statics = match breakpoints.is_some() {
        true => StaticGuard::plan(events, offset).ok().flatten(),
        false => None,
    };
    journal
        .record
        .breakpoints
        .extend(statics.as_ref().map(|g| g.at));
    journal.arm_jumps(jumps.clone())?;
    if let Some(b) = breakpoints {
        // (Its saves from here on keep the jumps.)
        b.name_jumps(&jumps);
        b.add_skips(stop, skips)?;
        if let Some(g) = guard {
            b.guard(stop, g, offset, &jumps)?;
        }
        if let Some(g) = statics {
            b.keep_static_calls(stop, g)?;
        }
    }
    if let Some(g) = &event_guard {
        g.set(stop)?;
    }
    for j in &jumps {
        let bytes = unhex(&j.jump).unwrap_or_default();
        stop.ram()
            .write_slice(&bytes, GuestAddress(j.gpa))
            .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
    }
    Ok(event_guard)
}

/// Puts each site's NOP back where vmtrace's jump is, in `stop`.
pub fn restore(stop: &QemuStop<'_>, jumps: &[JournaledJump]) -> Result<JumpsRestored, QemuError> {
    let ram = &**stop.ram();
    let mut out = JumpsRestored::default();
    for j in jumps {
        let (Some(nop), Some(jump)) = (unhex(&j.nop), unhex(&j.jump)) else {
            out.other += 1;
            continue;
        };
        let now = read(ram, j.gpa, nop.len())?;
        let count = match j.key_gpa {
            0 => 0,
            gpa => read(ram, gpa, 4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))?,
        };
        if count != 0 {
            out.guests += 1;
        } else if now == nop {
            out.as_found += 1;
        } else if now == jump {
            ram.write_slice(&nop, GuestAddress(j.gpa))
                .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
            out.restored += 1;
            let is_nop = crate::kernel::events::jump_sites::nop_at(&nop, j.va).is_ok();
            out.loads += usize::from(!is_nop);
        } else {
            out.other += 1;
        }
    }
    Ok(out)
}

/// The sites among `jumps` in `text` (running addresses: a module's, as
/// it goes away, its text still there), each still holding vmtrace's bytes
/// given its own back (a call site its NOP, a `tp->funcs` load its
/// address), and all taken out of `jumps`: the module's memory is freed
/// next, and nothing is written there after. Returns how many were given
/// back.
pub(super) fn release(
    ram: &dyn GuestRam,
    jumps: &mut Vec<JournaledJump>,
    text: &std::ops::Range<u64>,
) -> Result<usize, vmm::RamError> {
    let mut given = 0;
    for j in jumps.iter().filter(|j| text.contains(&j.va)) {
        let (Some(nop), Some(jump)) = (unhex(&j.nop), unhex(&j.jump)) else {
            continue;
        };
        let mut now = vec![0u8; jump.len()];
        ram.read_slice(&mut now, GuestAddress(j.gpa))?;
        if now == jump {
            ram.write_slice(&nop, GuestAddress(j.gpa))?;
            given += 1;
        }
    }
    jumps.retain(|j| !text.contains(&j.va));
    Ok(given)
}

/// The sites among `jumps` in the text of a module of `image` no longer
/// loaded where it was read (unloaded where its unload was not followed:
/// its memory is freed), taken out: the detach writes nothing there.
/// Returns those texts, for the guard to forget too. A module list that
/// cannot be read keeps them all.
pub(super) fn drop_freed(
    ram: &dyn GuestRam,
    image: &crate::kernel::symbols::KernelImage,
    jumps: &mut Vec<JournaledJump>,
) -> Vec<std::ops::Range<u64>> {
    if jumps.iter().all(|j| image.module_at(j.va).is_none()) {
        return Vec::new();
    }
    let Ok(loaded) = crate::kernel::modules::still_loaded(ram, image) else {
        return Vec::new();
    };
    let gone: Vec<std::ops::Range<u64>> = (image.modules.iter().zip(loaded))
        .filter(|(_, l)| !l)
        .map(|(m, _)| m.text.clone())
        .collect();
    jumps.retain(|j| !gone.iter().any(|t| t.contains(&j.va)));
    gone
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestMemoryMmap};

    use super::*;

    const NOP: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];
    const JUMP: [u8; 5] = [0xe9, 0x10, 0x00, 0x00, 0x00];
    /// A module's text (running addresses) and where its page is.
    const TEXT: std::ops::Range<u64> = 0xffff_ffff_c000_0000..0xffff_ffff_c000_1000;
    const PAGE: u64 = 0x20_0000;

    fn jump(va: u64, gpa: u64) -> JournaledJump {
        JournaledJump {
            module: None,
            va,
            gpa,
            nop: hex(&NOP),
            jump: hex(&JUMP),
            key_gpa: 0,
        }
    }

    /// At a module's unload: its site holding vmtrace's jump gets its NOP,
    /// one holding anything else is left as it is, both leave the list;
    /// a site outside its text stays, unwritten.
    #[test]
    fn a_modules_sites_are_given_back_and_forgotten_at_its_unload() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap();
        let (ours, changed, image) = (PAGE + 0x10, PAGE + 0x20, 0x1000);
        for gpa in [ours, image] {
            mem.write_slice(&JUMP, GuestAddress(gpa)).unwrap();
        }
        mem.write_slice(&[0xcc; 5], GuestAddress(changed)).unwrap();
        let mut jumps = vec![
            jump(TEXT.start + 0x10, ours),
            jump(TEXT.start + 0x20, changed),
            jump(0xffff_ffff_8100_1000, image),
        ];
        assert_eq!(release(&mem, &mut jumps, &TEXT).unwrap(), 1);
        let at = |gpa: u64| {
            let mut b = [0u8; 5];
            mem.read_slice(&mut b, GuestAddress(gpa)).unwrap();
            b
        };
        assert_eq!(at(ours), NOP);
        assert_eq!(at(changed), [0xcc; 5]);
        assert_eq!(at(image), JUMP);
        assert_eq!(jumps, vec![jump(0xffff_ffff_8100_1000, image)]);
    }
}
