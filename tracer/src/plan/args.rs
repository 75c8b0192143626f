//! Which traced calls record their arguments: `--args` alone, every traced
//! function's (the CLI passes it as the glob `*`); `--args=GLOB`, only the
//! traced functions matching (as `--stack GLOB` selects stacks).

use crate::kernel::filter::{FilterError, Globs};
use crate::plan::Plan;

/// `--args` globs that name no traced function.
#[derive(Debug, thiserror::Error)]
pub enum ArgPlanError {
    #[error(transparent)]
    Filter(#[from] FilterError),
    #[error("the argument globs {globs} match none of the traced functions; give globs of functions the trace selects")]
    NoneTraced { globs: String },
}

/// The traced functions `globs` select (indices into `Plan::funcs`,
/// ascending); None without globs.
pub fn select(plan: &Plan, globs: &[String]) -> Result<Option<Vec<u32>>, ArgPlanError> {
    if globs.is_empty() {
        return Ok(None);
    }
    let globs = Globs::for_args(globs)?;
    let funcs = plan.traced_matching(&globs);
    if funcs.is_empty() {
        return Err(ArgPlanError::NoneTraced {
            globs: globs.positive().join(","),
        });
    }
    Ok(Some(funcs))
}
