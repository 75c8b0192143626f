//! A new task's `sys_exit_fork` (clone, vfork, clone3) in exitless mode:
//! the child starts in `ret_from_fork(prev, regs, fn, fn_arg)`, never
//! returning through the syscall's function (`kernel::events::fork_child`).
//! That site's code records the call unhooked (`TrampolineSpec::
//! entry_only`) with its arguments and two words copied from `regs` at the
//! call (`strcopy::fork_words`: `regs->orig_ax`, `regs->ax`; the child's
//! first syscall overwrites them). The drainer makes such a record, when
//! its task is a user task (`fn` NULL) and its syscall a traced forking
//! syscall's exit, that syscall function's return in the child, `ret`
//! `regs->ax` (0): what trap mode records at the same call
//! (`session::record::child_exits`). Any other record there (a kernel
//! thread's, a syscall not traced, words not copied) is dropped and in no
//! count: `ret_from_fork`'s calls are not the trace's.

use crate::kernel::events::fields::FieldValue;
use crate::kernel::events::fork_child::{FN_ARG, REGS_ARG, SLOT_BELOW_REGS};
use crate::kernel::task::COMM_LEN;
use crate::plan::exitless::strcopy::{self, StrCopy, STRINGS_LEN};
use crate::plan::syscall_events::ChildExitSites;
use crate::session::exitless::ring::Record;
use crate::trace::model::RETURN_BIT;

/// What the drainer makes of `ret_from_fork`'s records.
#[derive(Clone, Debug)]
pub struct ChildStarts {
    sites: ChildExitSites,
    /// Where its records hold `regs->orig_ax` and `regs->ax`, then (when
    /// tasks are recorded) the task's name, two words.
    words: Vec<StrCopy>,
}

/// A new task's exit, made of its `ret_from_fork`'s record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChildExit {
    /// The syscall function's return, in the child.
    pub record: Record,
    /// The child's name at the call (None: not copied), which names it
    /// and which `--comm` keeps or not: by the drain it may have renamed
    /// itself, or exec'd.
    pub comm: Option<[u8; COMM_LEN]>,
}

impl ChildStarts {
    /// For `sites`, whose `ret_from_fork` site's code copies `words`
    /// (`ExitlessPlan::copies_at`, `strcopy::fork_words`); None when it
    /// copies none (the kernel's copy functions traced, or absent): then
    /// no child's exit.
    pub fn new(sites: ChildExitSites, words: &[StrCopy]) -> Option<ChildStarts> {
        if words.len() != 2 && words.len() != 4 {
            return None;
        }
        Some(ChildStarts {
            sites,
            words: words.to_vec(),
        })
    }

    /// What exitless code that records the children's exits makes of
    /// them (`ExitlessPlan::child_exits`: the sites, and the words
    /// `ret_from_fork`'s site copies); None when it records none.
    pub fn of(planned: Option<(ChildExitSites, &[StrCopy])>) -> Option<ChildStarts> {
        let (sites, words) = planned?;
        ChildStarts::new(sites, words)
    }

    /// Record `r`, if it is `ret_from_fork`'s: the child's exit it makes
    /// (Some(Some)), or none (Some(None): dropped). None for any other
    /// site's record.
    pub fn at(&self, r: &Record) -> Option<Option<ChildExit>> {
        if r.site as usize != self.sites.site {
            return None;
        }
        let (Some(args), Some(area)) = (r.args, r.strings.as_ref()) else {
            return Some(None);
        };
        // A kernel thread: `fn` is its function.
        if args[FN_ARG] != 0 {
            return Some(None);
        }
        let word = |c: &StrCopy| match strcopy::value(c, area) {
            FieldValue::Int(v) => Some(v as u64),
            _ => None,
        };
        let (Some(nr), Some(ret)) = (word(&self.words[0]), word(&self.words[1])) else {
            return Some(None);
        };
        let Some(&(_, site)) = self.sites.exits.iter().find(|(n, _)| *n == nr) else {
            return Some(None);
        };
        let slot = args[REGS_ARG].wrapping_sub(SLOT_BELOW_REGS);
        let record = Record {
            // The syscall function's return: where the child goes from
            // here is user mode (no kernel caller), its slot
            // `ret_from_fork`'s, with no entry stored there.
            site: site as u32,
            parent: 0,
            slot: slot | RETURN_BIT,
            ret,
            args: None,
            strings: None,
            ..*r
        };
        let comm = self.words.get(2).and_then(|c| name(c, area));
        Some(Some(ChildExit { record, comm }))
    }
}

/// The name whose first word `c` is, in `area` (its two words follow each
/// other, `strcopy::fork_words`); None when not copied (no task in the
/// record: zeroes).
fn name(c: &StrCopy, area: &[u8; STRINGS_LEN]) -> Option<[u8; COMM_LEN]> {
    let at = c.bytes as usize;
    let comm: [u8; COMM_LEN] = area.get(at..at + COMM_LEN)?.try_into().ok()?;
    (comm[0] != 0).then_some(comm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::events::fork_child::ForkRegs;
    use crate::plan::exitless::strcopy::WORD_STATUS;
    use crate::trace::model::ARG_REGS;

    const REGS: ForkRegs = ForkRegs {
        orig_ax: 120,
        ax: 80,
    };
    /// The child's `struct pt_regs`.
    const REGS_VA: u64 = 0xffff_c900_0001_3f58;
    /// `task_struct.comm`'s offset.
    const COMM_OFF: u32 = 0xbc0;
    /// "wl-worker", as two little-endian words.
    const NAME: [u64; 2] = [0x656b_726f_772d_6c77, 0x72];

    /// `ret_from_fork`'s record (site 1) of a task whose `fn` and words
    /// (`regs->orig_ax`, `regs->ax`, the name's two; None: not copied)
    /// are these.
    fn start(func: u64, words: Option<[u64; 4]>) -> Record {
        let mut area = [0u8; STRINGS_LEN];
        let copies = strcopy::fork_words(REGS, Some(COMM_OFF));
        if let Some(w) = words {
            let at = copies[0].status as usize;
            area[at..at + 4].copy_from_slice(&WORD_STATUS.to_le_bytes());
            for (c, v) in copies.iter().zip(w) {
                let at = c.bytes as usize;
                area[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
        }
        let mut args = [0u64; ARG_REGS];
        args[REGS_ARG] = REGS_VA;
        args[FN_ARG] = func;
        Record {
            tsc: 99,
            parent: 0xffff_ffff_8100_0123,
            site: 1,
            slot: 0,
            task: 0xffff_8880_0420_0000,
            pid: 212,
            ret: 0,
            args: Some(args),
            strings: Some(area),
        }
    }

    /// A user task forked by fork(2) (traced, site 0's return) gets that
    /// exit, `ret` `regs->ax`, in its own task, at `ret_from_fork`'s
    /// return-address slot; a kernel thread, a syscall whose exit is not
    /// traced (clone, 56), words not copied give nothing; another site's
    /// record is not `ret_from_fork`'s.
    #[test]
    fn a_user_tasks_start_is_its_forking_syscalls_exit() {
        let sites = ChildExitSites {
            site: 1,
            regs: REGS,
            exits: vec![(57, 0)],
        };
        let words = strcopy::fork_words(REGS, Some(COMM_OFF));
        let c = ChildStarts::new(sites.clone(), &words).unwrap();
        let [a, b] = NAME;
        let exit = c.at(&start(0, Some([57, 0, a, b]))).unwrap().unwrap();
        let r = exit.record;
        assert_eq!((r.site, r.ret, r.parent), (0, 0, 0));
        assert_eq!(r.slot, (REGS_VA - 8) | RETURN_BIT);
        assert_eq!((r.task, r.pid, r.tsc), (0xffff_8880_0420_0000, 212, 99));
        assert_eq!((r.args, r.strings), (None, None));
        assert_eq!(exit.comm, Some(*b"wl-worker\0\0\0\0\0\0\0"));
        let kthread = start(0xffff_ffff_810a_0000, Some([0; 4]));
        for r in [kthread, start(0, Some([56, 0, a, b])), start(0, None)] {
            assert_eq!(c.at(&r), Some(None), "{r:?}");
        }
        let other = Record {
            site: 0,
            ..start(0, Some([57, 0, a, b]))
        };
        assert_eq!(c.at(&other), None);
        // Without the task's name (no task recorded): the exit, unnamed.
        let two = ChildStarts::new(sites.clone(), &words[..2]).unwrap();
        let exit = two.at(&start(0, Some([57, 0, 0, 0]))).unwrap().unwrap();
        assert_eq!((exit.record.site, exit.comm), (0, None));
        assert!(ChildStarts::new(sites, &[]).is_none());
    }
}
