//! vmtrace's own VMM and the guest's kernel modules: every module the
//! guest has is loaded after the attach (the attach comes early in the
//! boot), so a kernel with modules has its module loader followed
//! (`tracer::session::module_traps`): the whole selection applies to each
//! module the guest loads, and `GLOB:mod:MODULE` globs wait for their
//! module, as `vmtrace attach` keeps those of modules not loaded yet.

use std::sync::Arc;

use tracer::kernel::filter::{Filter, Globs};
use tracer::kernel::module_files::ModuleFiles;
use tracer::kernel::module_notify::ModuleNotify;
use tracer::kernel::modules::{ModuleLayout, MODULES};
use tracer::kernel::symbols::KernelImage;
use tracer::plan::added_sites::RESERVED;
use tracer::plan::{ComingModules, Request, TracePlan};

use crate::error::InputError;

/// `--modules DIR`'s module files.
pub(super) type Files = Arc<ModuleFiles>;

/// What waits for the guest's modules: the whole selection, the `:mod:`
/// globs, whether they are all the positive globs (no kernel function
/// is traced: `TracePlan::for_modules`), and `--modules DIR`'s files.
pub(super) type Waiting = (Filter, Vec<String>, bool, Option<Files>);

/// The `:mod:` globs taken out of `request` (they wait for their module;
/// every other glob must still match the kernel, as before), and the
/// whole selection, when `image` has modules. None: a kernel without
/// (`files` then said unused).
pub(super) fn waiting(
    request: &mut Request,
    image: &KernelImage,
    files: Option<Files>,
) -> Option<Waiting> {
    if image.symbol(MODULES).is_none() {
        if files.is_some() {
            note!(
                "vmtrace: --modules: {} has no modules (no `{MODULES}` in its symbols): no module file is used",
                image.path.display()
            );
        }
        return None;
    }
    if let Some(f) = files.as_deref() {
        say_unread(f);
    }
    let selection = Filter::new(&request.trace, &request.notrace).ok()?;
    let (waiting, only) = take_waiting(request, |g| g.contains(":mod:"))?;
    let only = only && request.events.is_empty();
    Some((selection, waiting, only, files))
}

/// Say how many of `--modules DIR`'s files could not be read, if any.
pub(crate) fn say_unread(files: &ModuleFiles) {
    if let Some(first) = files.unreadable.first() {
        note!(
            "vmtrace: --modules: {} module file{} not read, e.g. {first}",
            files.unreadable.len(),
            if files.unreadable.len() == 1 { "" } else { "s" },
        );
    }
}

/// The positive `--trace` globs of `request` that `waits` says wait for
/// their module, taken out of it when others are left (each of those
/// must still match, as before; the negative globs stay with them), and
/// whether they are all its positive globs (then `request` is left as
/// it was). The own VMM's and `vmtrace attach`'s waiting `:mod:` globs.
pub(crate) fn take_waiting(
    request: &mut Request,
    waits: impl Fn(&str) -> bool,
) -> Option<(Vec<String>, bool)> {
    let globs = Globs::for_trace(&request.trace).ok()?;
    let (waiting, kept): (Vec<String>, Vec<String>) =
        globs.positive().iter().cloned().partition(|g| waits(g));
    let only = !waiting.is_empty() && kept.is_empty();
    if !waiting.is_empty() && !kept.is_empty() {
        let negated = globs.negative().iter().map(|g| format!("!{g}"));
        request.trace = vec![kept
            .into_iter()
            .chain(negated)
            .collect::<Vec<_>>()
            .join(",")];
    }
    Some((waiting, only))
}

/// The plan of `request` (`waiting`: from `waiting`), its `:mod:` globs
/// waiting for their modules.
pub(super) fn plan(
    image: KernelImage,
    request: &Request,
    waiting: Option<Waiting>,
) -> Result<TracePlan, InputError> {
    let Some((selection, globs, only, files)) = waiting else {
        return Ok(TracePlan::build(image, request)?);
    };
    let mut plan = match only {
        true => TracePlan::for_modules(image, request)?,
        false => TracePlan::build(image, request)?,
    };
    follow(&mut plan, request, (selection, globs), files)?;
    Ok(plan)
}

/// The module notifier's traps of `p`: on their ftrace sites, also in a
/// plan of direct entries (none of which may displace them).
fn notify(p: &tracer::plan::Plan) -> Result<ModuleNotify, String> {
    let Some(direct) = p.direct.as_ref() else {
        return ModuleNotify::find(&p.image, &p.sites);
    };
    let displaced: Vec<std::ops::Range<u64>> = (p.index.addrs.iter())
        .filter_map(|a| direct.sites.get(a))
        .map(|d| d.addr..d.addr + d.len as u64)
        .collect();
    ModuleNotify::find_direct(&p.image, &displaced)
}

/// Follow the guest's module loader in `plan` (built from `request`),
/// and say so; `waiting`: the `:mod:` globs that wait. Where the modules
/// cannot be followed, said in one line; refused (exit status 2) when a
/// glob waits. `files`: `--modules DIR`'s, which complete the modules
/// loaded.
fn follow(
    plan: &mut TracePlan,
    request: &Request,
    (selection, waiting): (Filter, Vec<String>),
    files: Option<Files>,
) -> Result<(), InputError> {
    let globs = waiting.join(",");
    let p = &plan.plan;
    let why = p
        .btf
        .as_deref()
        .ok_or_else(|| "the kernel has no BTF".to_string())
        .and_then(|btf| ModuleLayout::find(&p.image, btf).map_err(|e| e.to_string()))
        .and_then(|l| Ok((l, notify(p)?)));
    let (layout, notify) = match why {
        Ok(found) => found,
        Err(why) if waiting.is_empty() => {
            note!("vmtrace: the functions of the modules the guest loads are not traced ({why})");
            return Ok(());
        }
        Err(why) => return Err(InputError::ModulesUnfollowed { globs, why }),
    };
    let coming = ComingModules {
        selection,
        layout,
        phys: 0,
        notify: Some(notify),
        files,
        said: Default::default(),
        // The functions `--args` selects record theirs, in either mode.
        args: (!request.args.is_empty())
            .then(|| Globs::for_args(&request.args).ok())
            .flatten(),
    };
    plan.reserve_added(coming, RESERVED, request)?;
    if !waiting.is_empty() {
        note!("vmtrace: '{globs}': its functions are traced from each load of the module");
    }
    Ok(())
}
