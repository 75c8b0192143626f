//! ftrace's filter syntax beyond globs (`crate::kernel::filter`): its
//! module syntax, `GLOB:mod:MODULE`, and its function commands
//! (`FUNCTION:COMMAND`), which vmtrace refuses.

/// Why a filter entry is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotGlob {
    /// `:mod:` without a module's name.
    Module,
    /// A function command (`schedule:traceon`).
    Command,
}

/// Kernel function names never hold a ':': one is ftrace syntax.
pub(crate) fn check(glob: &str) -> Result<(), NotGlob> {
    match glob.find(':') {
        None => Ok(()),
        Some(i) if glob[i..].starts_with(":mod:") => {
            let module = &glob[i + ":mod:".len()..];
            match module.is_empty() || module.contains(':') {
                true => Err(NotGlob::Module),
                false => Ok(()),
            }
        }
        Some(_) => Err(NotGlob::Command),
    }
}

/// `glob` over full names: `G:mod:M` is `G [M]` (`*` for an empty G), the
/// name of module M's function G (`crate::kernel::module_image`).
pub(crate) fn module_glob(glob: &str) -> String {
    match glob.split_once(":mod:") {
        None => glob.to_string(),
        Some((func, module)) => {
            let func = if func.is_empty() { "*" } else { func };
            format!("{func} \\[{module}\\]")
        }
    }
}
