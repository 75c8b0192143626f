//! `vmtrace list [GLOB...]`: the kernel's functions, traceable or not and
//! why (`tracer::plan::list`), or with `-e` its events
//! (`tracer::kernel::events`), on stdout; the summary on stderr, so that
//! the list pipes. No guest is booted.

use tracer::error::TracerError;
use tracer::kernel::btf::KernelBtf;
use tracer::kernel::events::module_events::ModuleEvent;
use tracer::kernel::events::module_globs;
use tracer::kernel::events::{EventError, EventGlobs, EventTable};
use tracer::kernel::sites::SiteTable;
use tracer::kernel::symbols::KernelImage;
use tracer::plan::entry::{DirectPlan, EntryKind};
use tracer::plan::list::Listing;
use tracer::qemu::session;

use crate::cli::ListArgs;
use crate::config::ListConfig;
use crate::emit::to_stdout;
use crate::error::{Error, InputError, Outcome};

pub fn main(args: &ListArgs) -> Result<Outcome, Error> {
    let mut cfg = ListConfig::check(args)?;
    if cfg.events {
        return events(&cfg, args.qmp.as_deref());
    }
    if let Some(qmp) = args.qmp.as_deref() {
        add_modules(qmp, &mut cfg.image)?;
    }
    let listing = match cfg.entry.resolve(&cfg.image) {
        EntryKind::Ftrace => {
            if let Some(e) = cfg.image.missing_sites() {
                return Err(InputError::from(TracerError::from(e)).into());
            }
            let sites = SiteTable::build(&cfg.image).map_err(TracerError::from)?;
            Listing::new(&cfg.image, &sites, &cfg.globs)
        }
        EntryKind::Direct => {
            let (direct, sites) = DirectPlan::build(&cfg.image).map_err(TracerError::from)?;
            Listing::direct(&cfg.image, &sites, &direct, &cfg.globs)
        }
    }
    .map_err(InputError::from)?;
    let listing = module_names_only(listing, &cfg.image);
    to_stdout("list", |w| listing.write(w))?;
    note!(
        "vmtrace: {} (symbols: {})",
        listing.summary(),
        cfg.image.source
    );
    Ok(Outcome::Clean)
}

/// The guest's loaded modules at `qmp` added to `image` (said on stderr).
fn add_modules(qmp: &std::path::Path, image: &mut KernelImage) -> Result<(), Error> {
    let connected = session::connect(qmp, None).map_err(InputError::Qemu)?;
    super::guest_modules::add(&connected, image, None, None);
    Ok(())
}

/// A module's function listed once, as `function [module]` (as ftrace's
/// available_filter_functions), not under its bare name too (an alias
/// `--trace` matches).
fn module_names_only<'a>(mut listing: Listing<'a>, image: &KernelImage) -> Listing<'a> {
    listing.functions.retain(|f| {
        f.name.ends_with(']')
            || !image
                .modules
                .iter()
                .any(|m| m.text.contains(&f.addr.wrapping_add(m.virt as u64)))
    });
    listing
}

/// The events of the modules loaded in `qmp`'s guest, and those modules'
/// names (none when they cannot be read: said on stderr).
fn module_events(
    qmp: &std::path::Path,
    image: &KernelImage,
) -> Result<(Vec<ModuleEvent>, Vec<String>), Error> {
    let connected = session::connect(qmp, None).map_err(InputError::Qemu)?;
    match connected.modules(image) {
        Ok(Some(m)) => Ok((m.events, m.list.into_iter().map(|(m, _)| m.name).collect())),
        Ok(None) => Ok(Default::default()),
        Err(e) => {
            note!("vmtrace: the guest's modules' events are not listed: {e}");
            Ok(Default::default())
        }
    }
}

/// `list -e`: one line per event the kernel lists, `SYSTEM:NAME (ARGS)`,
/// sorted by name as tracefs' `available_events` is not (it follows the
/// kernel's array), and with `--qmp` those of the guest's loaded modules,
/// `SYSTEM:NAME [MODULE]`; the counts on stderr.
fn events(cfg: &ListConfig, qmp: Option<&std::path::Path>) -> Result<Outcome, Error> {
    let (mut modules, globs) = match qmp {
        Some(qmp) => {
            let (events, loaded) = module_events(qmp, &cfg.image)?;
            // `GLOB:mod:MODULE`: a loaded module's events by their names.
            let m =
                module_globs::resolve(&cfg.globs, &events, &loaded).map_err(InputError::from)?;
            if !m.waiting.is_empty() {
                let globs = m.waiting.join(",");
                return Err(InputError::EventsModuleNotLoaded { globs }.into());
            }
            (events, m.globs)
        }
        None => (Vec::new(), cfg.globs.clone()),
    };
    let globs = EventGlobs::parse(&globs).map_err(InputError::from)?;
    let btf =
        KernelBtf::from_image(&cfg.image).map_err(|e| InputError::from(EventError::from(e)))?;
    let table = EventTable::read(&cfg.image, &btf).map_err(InputError::from)?;
    modules.retain(|m| globs.is_match(&m.event));
    modules.sort_by_key(|m| (m.event.full_name(), m.module.clone()));
    let mut chosen = match modules.is_empty() {
        // No event at all gets the closest names.
        true => table.select(&globs).map_err(InputError::from)?,
        false => table.listed().filter(|e| globs.is_match(e)).collect(),
    };
    chosen.sort_by_key(|e| e.full_name());
    to_stdout("list", |w| {
        for e in &chosen {
            match e.signature().as_str() {
                "" => writeln!(w, "{}", e.full_name())?,
                sig => writeln!(w, "{} {sig}", e.full_name())?,
            }
        }
        for m in &modules {
            writeln!(w, "{} [{}]", m.event.full_name(), m.module)?;
        }
        Ok(())
    })?;
    let systems: std::collections::BTreeSet<&str> = chosen
        .iter()
        .copied()
        .chain(modules.iter().map(|m| &m.event))
        .map(|e| e.system.as_str())
        .collect();
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let listed = table.listed().count();
    let unlisted = table.events.len() - listed;
    let why = match table.syscalls_checked {
        true => "the ftrace system's formats, syscalls outside its syscall table",
        false => "the ftrace system's formats",
    };
    note!(
        "vmtrace: {}{} in {}, of the {listed} the kernel lists ({unlisted} more in its table \
         it does not: {why}) (symbols: {})",
        plural(chosen.len(), "event"),
        match qmp {
            Some(_) => format!(" (and {} of the guest's modules)", modules.len()),
            None => String::new(),
        },
        plural(systems.len(), "subsystem"),
        cfg.image.source
    );
    Ok(Outcome::Clean)
}
