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
