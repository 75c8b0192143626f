//! The guest's loaded modules, read from a running QEMU guest and added
//! to the kernel image, so that `--trace` and `list` see their functions
//! (`name [module]`); said on stderr. And the `:mod:` globs of modules
//! not loaded yet, which an attach keeps for the modules that come.

use tracer::kernel::events::module_events::ModuleEvent;
use tracer::kernel::filter::{Filter, Globs};
use tracer::kernel::module_files::ModuleFiles;
use tracer::kernel::symbols::KernelImage;
use tracer::plan::{ComingModules, Request};
use tracer::qemu::module_files::{complete_from, FileUse};

use crate::config::{say_unread, take_waiting};
use tracer::qemu::session::Connected;

/// Functions of modules first loaded during a trace that get sites of
/// their own.
pub(super) const ADDED_SITES: usize = tracer::plan::added_sites::RESERVED;

/// Add the modules `connected`'s guest has loaded to `image`, and say how
/// many. `traced`: an attach (Some("traced")) goes on without them and
/// says only why; `list` (None) also says when the kernel has none.
/// Returns how to walk the guest's modules, and their events ([`Added`]).
/// `files`: the module files of `--modules DIR`, which complete the
/// modules they match (said, and named where the symbols came from).
pub(super) fn add(
    connected: &Connected,
    image: &mut KernelImage,
    traced: Option<&str>,
    files: Option<&ModuleFiles>,
) -> Added {
    let mut events = Vec::new();
    let walk = add_to(connected, image, traced, files, &mut events);
    Added { walk, events }
}

/// What [`add`] read of the guest's modules: how to walk them (None: the
/// kernel has none, or they cannot be read), and their events, which `-e`
/// selects as the image's.
pub(super) struct Added {
    pub walk: Option<(tracer::kernel::modules::ModuleLayout, i64)>,
    pub events: Vec<ModuleEvent>,
}

/// [`add`], the modules' events put in `events`.
fn add_to(
    connected: &Connected,
    image: &mut KernelImage,
    traced: Option<&str>,
    files: Option<&ModuleFiles>,
    events: &mut Vec<ModuleEvent>,
) -> Option<(tracer::kernel::modules::ModuleLayout, i64)> {
    match connected.modules(image) {
        Ok(Some(mut m)) => {
            let (uses, dwarf) = files.map(|f| complete_from(&mut m, f)).unwrap_or_default();
            let functions = image.add_modules(&m.list, m.layout, m.offset);
            for (addr, orc) in m.orc {
                image.set_module_orc(addr, orc);
            }
            for (addr, btf) in m.btf {
                image.set_module_btf(addr, btf);
            }
            events.extend(m.events);
            for (addr, prototypes) in dwarf {
                image.set_module_prototypes(addr, prototypes);
            }
            say_files(image, &uses);
            if let Some(f) = files {
                say_unread(f);
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

/// Say what `--modules DIR`'s files did, one line each, and name the
/// files used in `image`'s symbol source (the report's `symbols:` line,
/// kept in the data file).
fn say_files(image: &mut KernelImage, uses: &[FileUse]) {
    let used: Vec<String> = uses.iter().filter_map(say_use).collect();
    image.source = tracer::kernel::ko_file::with_files(&image.source, &used);
}

/// Say what `--modules DIR`'s files did for modules first loaded during
/// the trace (`ComingModules::said`), as they come.
pub(crate) fn say_uses(uses: &tracer::kernel::ko_file::FileUses) {
    for u in uses.take() {
        say_use(&u);
    }
}

/// Say in one line (or one a file) what a module's file did; for a file
/// used, `MODULE from PATH`, for the symbols' source.
fn say_use(u: &FileUse) -> Option<String> {
    match u {
        FileUse::Used {
            module,
            path,
            build_id,
            functions,
            prototypes,
        } => {
            let mut took = Vec::new();
            if *functions > 0 {
                took.push(format!("{functions} functions' symbols"));
            }
            if let Some(from) = prototypes {
                took.push(format!("its prototypes, from its {from}"));
            }
            let took = match took.is_empty() {
                true => "nothing the guest's memory lacks".to_string(),
                false => took.join(" and "),
            };
            note!(
                "vmtrace: module {module}: {} has its build id {}: taken from it: {took}",
                path.display(),
                hex(build_id)
            );
            u.named()
        }
        FileUse::Differs {
            module,
            loaded,
            files,
        } => {
            let loaded = match loaded {
                Some(id) => format!("has build id {}", hex(id)),
                None => "has no build id the guest's memory shows".to_string(),
            };
            for (path, id) in files {
                let id = id.as_deref().map_or("none".to_string(), hex);
                note!(
                    "vmtrace: {} is not used: its build id {id} is not module {module}'s, which {loaded}",
                    path.display()
                );
            }
            None
        }
        FileUse::Unreadable { module, error } => {
            note!("vmtrace: module {module}: its file is not used: {error}");
            None
        }
    }
}

/// A build id as `file` and `readelf -n` print it.
fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
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
    files: Option<std::sync::Arc<ModuleFiles>>,
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
        files,
        said: Default::default(),
    };
    Some((coming, waiting))
}
