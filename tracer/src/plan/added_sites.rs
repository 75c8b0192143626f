//! Sites added during the trace (issue 37): the functions of a kernel
//! module the guest first loads while `vmtrace attach` traces it, which
//! the plan, made before, could not list. Slots are reserved when the
//! plan is made and filled, in order, from the module load hook (one
//! thread, the VM stopped); every vCPU's trap path reads them without a
//! lock. Slot k is the site of function `first_func + k` of the trace
//! (one ftrace site per function), added after the plan's functions; its
//! site number follows the plan's sites (`SiteIndex::find`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::kernel::prototype::Prototype;
use crate::kernel::symbols::Symbol;

/// Slots reserved for the functions of modules first loaded during a
/// trace (more are counted and left untraced): as many as a large
/// driver's that a `:mod:` glob would take whole.
pub const RESERVED: usize = 4096;

/// Spare slots exitless mode's code has (of those reserved): each takes a
/// site body (110 to 150 bytes of code, or a stub of a few bytes where
/// the code is in the shared shape) and a drop counter (two with the
/// function graph) in every ring, in the guest's few free pages. 256 is
/// a large driver's traced functions, for 8 or 9 pages of bodies and
/// 2 KiB of counters a ring; a function past them is left untraced and
/// counted.
pub const EXITLESS_ADDED: usize = 256;

/// The spare slots of one plan.
#[derive(Debug, Default)]
pub struct AddedSites {
    /// Running address of each slot's site; 0 while its module is not
    /// loaded (unloaded after it came).
    addrs: Box<[AtomicU64]>,
    /// Per slot: does a call there record its arguments (`--args`, trap
    /// mode), set with its address.
    args: Box<[AtomicBool]>,
    /// Slots filled so far (the next one given is `used`).
    used: AtomicUsize,
    /// The trace function of slot 0: the plan's function count.
    first_func: u32,
    /// Each used slot's function (`function [module]`, its address and
    /// size when it came); never read by the trap path.
    functions: Mutex<Vec<Symbol>>,
    /// Each used slot's prototype, from its module's own BTF (None: not
    /// described, or values not recorded); never read by the trap path.
    prototypes: Mutex<Vec<Option<Prototype>>>,
}

impl AddedSites {
    /// `n` spare slots, for functions numbered from `first_func`.
    pub fn new(n: usize, first_func: u32) -> AddedSites {
        AddedSites {
            addrs: (0..n).map(|_| AtomicU64::new(0)).collect(),
            args: (0..n).map(|_| AtomicBool::new(false)).collect(),
            used: AtomicUsize::new(0),
            first_func,
            functions: Mutex::new(Vec::new()),
            prototypes: Mutex::new(Vec::new()),
        }
    }

    /// Slots reserved.
    pub fn capacity(&self) -> usize {
        self.addrs.len()
    }

    /// Slots filled so far: functions added to the trace.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// A new function, `function`, its site at running address `addr`:
    /// its slot, None when every slot is taken. Called by one thread only,
    /// before the site is written in the guest.
    pub fn add(&self, addr: u64, function: Symbol) -> Option<usize> {
        self.add_with(addr, function, false, None)
    }

    /// `add`; `args`: its calls record their arguments; `prototype`: how
    /// to show its values.
    pub fn add_with(
        &self,
        addr: u64,
        function: Symbol,
        args: bool,
        prototype: Option<Prototype>,
    ) -> Option<usize> {
        let k = self.used.load(Ordering::Relaxed);
        let slot = self.addrs.get(k)?;
        slot.store(addr, Ordering::Relaxed);
        self.args[k].store(args, Ordering::Relaxed);
        self.functions_now().push(function);
        // A panic elsewhere while holding it left a whole Vec.
        let mut prototypes = self.prototypes.lock().unwrap_or_else(|p| p.into_inner());
        prototypes.push(prototype);
        // Publishes the address with the count: a trap path that sees
        // slot k used sees its address.
        self.used.store(k + 1, Ordering::Release);
        Some(k)
    }

    /// The functions added so far, slot by slot: those the trace names
    /// after the plan's.
    pub fn functions(&self) -> Vec<Symbol> {
        self.functions_now().clone()
    }

    /// The prototypes of the functions added so far, slot by slot.
    pub fn prototypes(&self) -> Vec<Option<Prototype>> {
        // A panic elsewhere while holding it left a whole Vec.
        (self.prototypes.lock().unwrap_or_else(|p| p.into_inner())).clone()
    }

    fn functions_now(&self) -> std::sync::MutexGuard<'_, Vec<Symbol>> {
        // A panic elsewhere while holding it left a whole Vec.
        self.functions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Slot `k`'s module loaded again at `addr`, or gone (0): called with
    /// its site not written in the guest.
    pub fn set(&self, k: usize, addr: u64) {
        self.addrs[k].store(addr, Ordering::Release);
    }

    /// The running address of slot `k`'s site (0: not loaded).
    pub fn addr(&self, k: usize) -> u64 {
        self.addrs[k].load(Ordering::Acquire)
    }

    /// Does a call at slot `k`'s site record its arguments.
    pub fn records_args(&self, k: usize) -> bool {
        k < self.used() && self.args[k].load(Ordering::Relaxed)
    }

    /// The trace function of slot 0: the plan's function count.
    pub fn first_func(&self) -> u32 {
        self.first_func
    }

    /// The trace function of slot `k`.
    pub fn func(&self, k: usize) -> u32 {
        self.first_func + k as u32
    }

    /// The slot whose site is at running address `addr`.
    pub fn find(&self, addr: u64) -> Option<usize> {
        if addr == 0 {
            return None;
        }
        (0..self.used()).find(|&k| self.addr(k) == addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::prototype::ValueKind;

    /// Each slot keeps its function's prototype, slot by slot, beside its
    /// name: the trace's after the plan's.
    #[test]
    fn each_added_function_keeps_its_prototype() {
        let added = AddedSites::new(4, 10);
        let sym = |name: &str| Symbol {
            name: name.into(),
            addr: 0xffff_ffff_8000_0000,
            size: 0x40,
        };
        let p = Prototype {
            params: Vec::new(),
            ret: ValueKind::Signed(4),
            unshown: Vec::new(),
        };
        assert_eq!(added.add(0x1004, sym("a [m]")), Some(0));
        let typed = added.add_with(0x1044, sym("b [m]"), true, Some(p.clone()));
        assert_eq!(typed, Some(1));
        assert_eq!(added.prototypes(), [None, Some(p)]);
        assert_eq!(added.functions().len(), 2);
        assert!(added.records_args(1) && !added.records_args(0));
    }
}
