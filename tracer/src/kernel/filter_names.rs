//! Globs judging a function known by more than one name: a module's
//! function added during the trace, `function [module]` and its bare name
//! (`crate::qemu::module_added`, `--stack` and `--args` of it).

use crate::kernel::filter::Globs;

impl Globs {
    /// Whether a function known by all of `names` matches: a positive
    /// glob by any name, and no `!glob` by any.
    pub fn is_match_any(&self, names: &[&str]) -> bool {
        let positive = |n: &&str| self.positive.is_empty() || self.positive_set.is_match(n);
        names.iter().any(positive) && !names.iter().any(|n| self.negative_set.is_match(n))
    }
}
