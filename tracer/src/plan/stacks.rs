//! Which traced calls record their kernel stack (`--stack GLOB`, ftrace's
//! `func_stack_trace` for some functions), and how the kernel's stacks are
//! unwound (`kernel::unwind`: its ORC tables, else frame pointers).

use crate::kernel::filter::{FilterError, Globs};
use crate::kernel::unwind::Unwinder;
use crate::plan::site_index::SiteIndex;
use crate::plan::Plan;

/// The stacks a session records.
#[derive(Clone, Debug)]
pub struct StackPlan {
    /// The functions whose calls record a stack, as indices into
    /// `Plan::funcs` (`Trace::functions`), ascending.
    pub funcs: Vec<u32>,
    /// The globs, for the functions of a module the guest first loads
    /// during the trace (`StackSource::set_added`).
    pub globs: Globs,
    pub unwinder: Unwinder,
    /// How stacks are unwound (`TraceMeta::stacks`).
    pub note: String,
}

/// `--stack` globs that name no traced function.
#[derive(Debug, thiserror::Error)]
pub enum StackPlanError {
    #[error(transparent)]
    Filter(#[from] FilterError),
    #[error("the stack globs {globs} match none of the traced functions; give globs of functions the trace selects")]
    NoneTraced { globs: String },
}

impl StackPlan {
    /// The stacks `globs` select among `plan`'s traced functions; None
    /// without globs. `waiting`: a `:mod:` glob waits for its module,
    /// whose functions globs that match no traced function may name.
    pub fn build(
        plan: &Plan,
        globs: &[String],
        waiting: bool,
    ) -> Result<Option<StackPlan>, StackPlanError> {
        if globs.is_empty() {
            return Ok(None);
        }
        let globs = Globs::for_stack(globs)?;
        let funcs = plan.traced_matching(&globs);
        if funcs.is_empty() && !waiting {
            return Err(StackPlanError::NoneTraced {
                globs: globs.positive().join(","),
            });
        }
        let (unwinder, note) = Unwinder::for_image(&plan.image, plan.btf.as_deref());
        Ok(Some(StackPlan {
            funcs,
            globs,
            unwinder,
            note,
        }))
    }

    /// Per site of `index`: does a call there record its stack.
    pub fn sites(&self, index: &SiteIndex) -> Vec<bool> {
        index
            .funcs
            .iter()
            .map(|f| self.funcs.binary_search(f).is_ok())
            .collect()
    }
}
