//! The tracer's error: any stage's, each said in its own way
//! (`crate::advice`). Every stage returns it, so it lives beside them, not in
//! one of them.

use crate::advice::{Plain, Remedy, TracerAdvice, TracerWords};

use crate::kernel::filter::FilterError;
use crate::kernel::kaslr::KaslrError;
use crate::kernel::sites::SiteError;
use crate::kernel::symbols::SymbolError;
use crate::plan::exitless::error::ExitlessPlanError;
use crate::session::exitless::error::ExitlessError;
use crate::session::patch::PatchError;

#[derive(Debug, thiserror::Error)]
#[error("{}", self.say(&Plain))]
pub enum TracerError {
    Symbols(#[from] SymbolError),
    Sites(#[from] SiteError),
    Filter(#[from] FilterError),
    Patch(#[from] PatchError),
    Exitless(#[from] ExitlessError),
    ExitlessPlan(#[from] ExitlessPlanError),
    Kaslr(#[from] KaslrError),
    Direct(#[from] crate::plan::entry::DirectPlanError),
}

/// Each stage's error, said in its own way (`crate::advice`).
impl TracerAdvice for TracerError {
    fn problem(&self, w: &dyn TracerWords) -> String {
        self.inner().problem(w)
    }

    fn remedy(&self) -> Option<Remedy> {
        self.inner().remedy()
    }

    fn say(&self, w: &dyn TracerWords) -> String {
        self.inner().say(w)
    }
}

impl TracerError {
    fn inner(&self) -> &dyn TracerAdvice {
        match self {
            TracerError::Symbols(e) => e,
            TracerError::Sites(e) => e,
            TracerError::Filter(e) => e,
            TracerError::Patch(e) => e,
            TracerError::Exitless(e) => e,
            TracerError::ExitlessPlan(e) => e,
            TracerError::Kaslr(e) => e,
            TracerError::Direct(e) => e,
        }
    }
}
