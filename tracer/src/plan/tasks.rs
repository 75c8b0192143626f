//! Which guest tasks a session names and keeps: the kernel's task layout
//! (from its BTF, else its DWARF), or why events will have no task; and the `--pid` and
//! `--comm` filters (trace-cmd's `-P`, ftrace's `set_ftrace_pid`).

use globset::{Glob, GlobMatcher};

use crate::kernel::btf::{BtfError, KernelBtf, BTF_SECTION};
use crate::kernel::dwarf::{DwarfError, KernelDwarf, DWARF_SECTION};
use crate::kernel::symbols::KernelImage;
use crate::kernel::task::TaskLayout;

/// What a plan knows of the guest's tasks.
#[derive(Clone, Debug, Default)]
pub struct TaskPlan {
    /// Where `current`, pid, tgid and comm are; None: events get no task.
    pub layout: Option<TaskLayout>,
    /// For the report: where the layout came from, or why there is none.
    pub note: String,
    pub filter: TaskFilter,
}

impl TaskPlan {
    /// The task layout of `image`, from its BTF (`KernelBtf::from_image`,
    /// parsed by the caller), else from its DWARF when it has no BTF, or
    /// why there is none.
    pub fn find(image: &KernelImage, btf: Result<&KernelBtf, &BtfError>) -> TaskPlan {
        let found = match btf {
            Ok(btf) => TaskLayout::find(image, btf).map(|l| (l, "BTF")),
            Err(BtfError::Missing { .. }) => match KernelDwarf::from_image(image) {
                Ok(dwarf) => TaskLayout::find(image, &dwarf).map(|l| (l, "DWARF")),
                Err(DwarfError::Missing { .. }) => {
                    return TaskPlan::none(format!(
                        "{} has no BTF ({BTF_SECTION} section) nor DWARF ({DWARF_SECTION}): \
                         build the kernel with CONFIG_DEBUG_INFO_BTF=y",
                        image.path.display()
                    ));
                }
                Err(e) => Err(e.into()),
            },
            Err(e) => return TaskPlan::none(e.to_string()),
        };
        match found {
            Ok((layout, from)) => TaskPlan {
                layout: Some(layout),
                note: format!("from the {from} of {}", image.path.display()),
                filter: TaskFilter::default(),
            },
            Err(why) => TaskPlan::none(why.to_string()),
        }
    }

    /// No layout, because of `why`.
    fn none(why: String) -> TaskPlan {
        TaskPlan {
            layout: None,
            note: format!("none: {why}"),
            filter: TaskFilter::default(),
        }
    }
}

/// `--pid LIST` and `--comm GLOB`: a call is kept when its task matches
/// every filter given (no filter: every call).
#[derive(Clone, Debug, Default)]
pub struct TaskFilter {
    /// Thread ids (`task_struct.pid`, what ftrace's set_ftrace_pid takes);
    /// empty: any.
    pub pids: Vec<u32>,
    /// The comm glob, as given and compiled.
    pub comm: Option<(String, GlobMatcher)>,
}

/// A `--comm` glob that does not compile.
#[derive(Debug, thiserror::Error)]
#[error("the comm glob {glob:?} is not valid: {source}")]
pub struct CommGlobError {
    pub glob: String,
    #[source]
    source: globset::Error,
}

/// A comm glob compiled: the one place of its rules, for the recording's
/// task filter and the filters after recording (`crate::trace::filter`).
pub fn comm_glob(g: &str) -> Result<GlobMatcher, CommGlobError> {
    Glob::new(g)
        .map(|m| m.compile_matcher())
        .map_err(|source| CommGlobError {
            glob: g.to_owned(),
            source,
        })
}

impl TaskFilter {
    pub fn new(pids: Vec<u32>, comm: Option<&str>) -> Result<TaskFilter, CommGlobError> {
        let comm = comm
            .map(|g| comm_glob(g).map(|m| (g.to_owned(), m)))
            .transpose()?;
        Ok(TaskFilter { pids, comm })
    }

    /// Any filter given.
    pub fn is_active(&self) -> bool {
        !self.pids.is_empty() || self.comm.is_some()
    }

    /// Whether a call by the task with this pid and comm is kept.
    pub fn accepts(&self, pid: u32, comm: &str) -> bool {
        (self.pids.is_empty() || self.pids.contains(&pid))
            && self.comm.as_ref().is_none_or(|(_, m)| m.is_match(comm))
    }

    /// "pid 7, 9; comm sh*", for messages and the report.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.pids.is_empty() {
            let pids: Vec<String> = self.pids.iter().map(u32::to_string).collect();
            parts.push(format!("pid {}", pids.join(", ")));
        }
        if let Some((g, _)) = &self.comm {
            parts.push(format!("comm {g}"));
        }
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_and_comm_must_all_match() {
        let any = TaskFilter::default();
        assert!(!any.is_active() && any.accepts(5, "x"));
        let f = TaskFilter::new(vec![0, 12], Some("swapper/*")).unwrap();
        assert!(f.is_active());
        assert!(f.accepts(0, "swapper/1"));
        assert!(!f.accepts(0, "kworker/0:1"));
        assert!(!f.accepts(13, "swapper/1"));
        assert_eq!(f.describe(), "pid 0, 12; comm swapper/*");
        let e = TaskFilter::new(vec![], Some("[a")).unwrap_err().to_string();
        assert!(e.starts_with("the comm glob \"[a\" is not valid"), "{e}");
    }
}
