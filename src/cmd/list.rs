//! `vmtrace list [GLOB...]`: the kernel's functions, traceable or not and
//! why (`tracer::plan::list`), on stdout; the summary on stderr, so that the list
//! pipes. No guest is booted.

use tracer::error::TracerError;
use tracer::kernel::sites::SiteTable;
use tracer::plan::entry::{DirectPlan, EntryKind};
use tracer::plan::list::Listing;

use crate::cli::ListArgs;
use crate::config::ListConfig;
use crate::emit::to_stdout;
use crate::error::{Error, InputError, Outcome};

pub fn main(args: &ListArgs) -> Result<Outcome, Error> {
    let cfg = ListConfig::check(args)?;
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
    to_stdout("list", |w| listing.write(w))?;
    note!(
        "vmtrace: {} (symbols: {})",
        listing.summary(),
        cfg.image.source
    );
    Ok(Outcome::Clean)
}
