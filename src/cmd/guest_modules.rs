//! The guest's loaded modules, read from a running QEMU guest and added
//! to the kernel image, so that `--trace` and `list` see their functions
//! (`name [module]`); said on stderr. And the `:mod:` globs of modules
//! not loaded yet, which an attach keeps for the modules that come.

use tracer::kernel::filter::{Filter, Globs};
use tracer::kernel::symbols::KernelImage;
use tracer::plan::{ComingModules, Request};

use crate::config::take_waiting;
use tracer::qemu::session::Connected;

/// Functions of modules first loaded during a trace that get sites of
/// their own.
pub(super) const ADDED_SITES: usize = tracer::plan::added_sites::RESERVED;

/// Add the modules `connected`'s guest has loaded to `image`, and say how
/// many. `traced`: an attach (Some("traced")) goes on without them and
/// says only why; `list` (None) also says when the kernel has none.
/// Returns how to walk the guest's modules (None: it has none).
pub(super) fn add(
    connected: &Connected,
    image: &mut KernelImage,
    traced: Option<&str>,
) -> Option<(tracer::kernel::modules::ModuleLayout, i64)> {
    match connected.modules(image) {
        Ok(Some(m)) => {
            let functions = image.add_modules(&m.list, m.layout, m.offset);
            for (addr, orc) in m.orc {
                image.set_module_orc(addr, orc);
            }
            for (addr, btf) in m.btf {
                image.set_module_btf(addr, btf);
            }
            note!(
                "vmtrace: {} loaded module{} in the guest ({functions} functions)",
                m.list.len(),
                if m.list.len() == 1 { "" } else { "s" }
            );
            Some((m.layout, m.offset.phys))
        }
        Ok(None) if traced.is_none() => {
            note!("vmtrace: the guest's kernel has no modules");
            None
        }
        Ok(None) => None,
        // The attach refuses another kernel in one line of its own.
        Err(tracer::kernel::modules::ModuleError::OtherKernel) if traced.is_some() => None,
        Err(e) => {
            note!(
                "vmtrace: the guest's modules are not {}: {e}",
                traced.unwrap_or("listed")
            );
            None
        }
    }
}

/// The `--trace` globs `GLOB:mod:MODULE` whose MODULE names no module of
/// `image` (not loaded yet), taken out of `request` for the plan (each
/// other glob must still match) and kept, with the whole selection, for
/// the modules the guest loads during the trace, as ftrace keeps them.
/// None: no such glob, or the kernel's modules cannot be walked.
pub(super) fn waiting(
    request: &mut Request,
    image: &KernelImage,
    walk: Option<(tracer::kernel::modules::ModuleLayout, i64)>,
) -> Option<(ComingModules, Vec<String>)> {
    let (layout, phys) = walk?;
    let loaded = |module: &str| {
        let m = Globs::for_list(&[module.to_string()]).ok();
        m.is_some_and(|m| image.modules.iter().any(|l| m.is_match(&l.name)))
    };
    // The selection as given, before the waiting globs are taken out.
    let selection = Filter::new(&request.trace, &request.notrace).ok()?;
    let waits = |g: &str| g.split_once(":mod:").is_some_and(|(_, m)| !loaded(m));
    let (waiting, only) = take_waiting(request, waits)?;
    if waiting.is_empty() || only {
        // Nothing else to trace now: the plan says so, as before.
        return None;
    }
    let args = (!request.args.is_empty()).then(|| Globs::for_args(&request.args).ok());
    let coming = ComingModules {
        selection,
        layout,
        phys,
        notify: None,
        args: args.flatten(),
    };
    Some((coming, waiting))
}
