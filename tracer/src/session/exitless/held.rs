//! The ring-full drops the drain itself caused: while a ring's drain is
//! held at a record reserved and not committed (stopped at it for
//! `ring::HELD` and more, up to `ring::STALL`, then reading past it but
//! keeping its slot from reuse),
//! the guest can fill that ring one lap past the slot, however fast the
//! drain reads. Those drops are counted apart from the rest: the increase
//! of the CPU's drop counters from the first pass that found the ring held
//! to the first that found it free again. The counters are read only
//! while a ring is held (rare: a writer interrupted between its
//! reservation and its commit).

/// Per CPU, the drop counters' sum when its ring was last seen held.
#[derive(Clone, Debug)]
pub struct HeldDrops {
    since: Vec<Option<u64>>,
    total: u64,
}

impl HeldDrops {
    pub fn new(cpus: usize) -> HeldDrops {
        HeldDrops {
            since: vec![None; cpus],
            total: 0,
        }
    }

    /// Drops counted while a ring was held, all CPUs.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// After a pass over `cpu`'s ring: whether the drain is `held` there
    /// now. The drops since the pass that found it held are counted;
    /// `drops` reads the CPU's drop counters' sum (only called while held,
    /// or just after).
    pub fn note<E>(
        &mut self,
        cpu: usize,
        held: bool,
        drops: impl FnOnce() -> Result<u64, E>,
    ) -> Result<(), E> {
        let Some(since) = self.since.get_mut(cpu) else {
            return Ok(());
        };
        if since.is_none() && !held {
            return Ok(());
        }
        let now = drops()?;
        if let Some(before) = *since {
            self.total += now.saturating_sub(before);
        }
        *since = held.then_some(now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The drop counters (a CPU's sum) as passes read them: counted only
    /// from the pass that found the ring held to the first that found it
    /// free again; a free ring's counters are never read.
    #[test]
    fn counts_the_drops_while_held_only() {
        let mut h = HeldDrops::new(2);
        let read = |n: u64| move || Ok::<_, ()>(n);
        let never = || -> Result<u64, ()> { panic!("read while free") };
        h.note(0, false, never).unwrap();
        // Held at 10 drops (those before are the ring's size's)...
        h.note(0, true, read(10)).unwrap();
        h.note(0, true, read(15)).unwrap();
        // ... free again at 18: 8 while held.
        h.note(0, false, read(18)).unwrap();
        h.note(0, false, never).unwrap();
        assert_eq!(h.total(), 8);
        // CPU 1 held from 0 to 4; a CPU without a ring is left alone.
        h.note(1, true, read(0)).unwrap();
        h.note(1, false, read(4)).unwrap();
        h.note(2, true, never).unwrap();
        assert_eq!(h.total(), 12);
    }
}
