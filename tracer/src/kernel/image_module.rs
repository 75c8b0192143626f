//! A running guest's module whose functions a kernel image holds
//! (`crate::kernel::module_image` adds them): what the attach checks is
//! still loaded where it was read.

use std::ops::Range;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageModule {
    pub name: String,
    /// Its `struct module`'s running address.
    pub addr: u64,
    /// Its text's running addresses.
    pub text: Range<u64>,
    /// The kernel's virtual and physical KASLR offsets when it was read
    /// (its functions' link addresses in the image are `virt` below their
    /// running ones).
    pub virt: i64,
    pub phys: i64,
}
