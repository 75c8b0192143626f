//! The ORC unwinder (placeholder: being written).

use super::{EntryRegs, Stack, StackEnd, StackMemory, UnwindCtx};
use crate::kernel::btf::KernelBtf;
use crate::kernel::symbols::KernelImage;

/// A kernel's ORC tables, sorted by address.
#[derive(Debug)]
pub struct OrcTable {
    entries: usize,
}

impl OrcTable {
    pub fn from_image(_image: &KernelImage, _btf: Option<&KernelBtf>) -> Result<OrcTable, String> {
        Err("the image has no ORC tables".into())
    }

    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    pub fn layout_name(&self) -> &'static str {
        "unknown"
    }
}

pub fn unwind(
    _t: &OrcTable,
    _regs: EntryRegs,
    _mem: &mut dyn StackMemory,
    _ctx: &UnwindCtx<'_>,
) -> Stack {
    Stack {
        frames: Vec::new(),
        end: StackEnd::NoUnwindInfo,
    }
}
