//! Syscall events (`syscalls:sys_enter_*`, `sys_exit_*`): their arguments
//! from the syscall's metadata (`struct syscall_metadata`, which
//! SYSCALL_DEFINE writes: include/linux/syscalls.h), and which of them the
//! kernel registers. At boot it gives each metadata the number of the
//! entry of the syscall table whose function is that syscall's, by name
//! (kernel/trace/trace_syscalls.c, `init_ftrace_syscalls` and
//! `find_syscall_meta`, with x86's `arch_syscall_match_sym_name` in
//! arch/x86/include/asm/ftrace.h), and drops the events of those no entry
//! names (compat-only and other tables' syscalls). The same is done here
//! from the image.

use std::collections::HashMap;

use crate::kernel::events::image_data::{c_string, word, word32};
use crate::kernel::events::layout::MetaLayout;
use crate::kernel::events::EventArg;
use crate::kernel::symbols::KernelImage;

/// The x86-64 syscall table: pointers to the `__x64_sys_*` functions.
const SYSCALL_TABLE: &str = "sys_call_table";
/// The function of the table's unused numbers.
const NI_SYSCALL: &str = "sys_ni_syscall";
/// A syscall table has fewer entries than this.
const MAX_SYSCALLS: u64 = 4096;
/// A syscall has at most this many arguments.
const MAX_ARGS: u32 = 6;

/// One syscall's metadata, as an event's `call->data` points to it.
#[derive(Clone, Debug)]
pub(crate) struct SyscallMeta {
    /// `sys_openat`.
    pub(crate) name: String,
    pub(crate) args: Vec<EventArg>,
}

/// The metadata at `at`.
pub(crate) fn read_meta(image: &KernelImage, l: &MetaLayout, at: u64) -> Option<SyscallMeta> {
    let name = c_string(image, word(image, at.wrapping_add(u64::from(l.name)))?)?;
    let n = word32(image, at.wrapping_add(u64::from(l.nb_args)))?;
    if n > MAX_ARGS {
        return None;
    }
    let (types, names) = (
        word(image, at.wrapping_add(u64::from(l.types)))?,
        word(image, at.wrapping_add(u64::from(l.args)))?,
    );
    let args = (0..u64::from(n))
        .map(|i| {
            let ty = c_string(image, word(image, types.wrapping_add(8 * i))?)?;
            let name = c_string(image, word(image, names.wrapping_add(8 * i))?)?;
            Some(EventArg { ty, name })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(SyscallMeta { name, args })
}

/// Whether the table function `sym` is the syscall of metadata `name` (x86's
/// `arch_syscall_match_sym_name`: past the `__x64_sys`, `__ia32_sys`,
/// `__do_sys` or `sys` prefix, the same).
fn matches(sym: &str, name: &str) -> bool {
    let tail = |s: &str, n: usize| s.get(n..).map(str::to_owned);
    let name3 = tail(name, 3);
    let same = |skip: usize| tail(sym, skip).is_some_and(|t| Some(t) == name3);
    same(3)
        || (sym.starts_with("__x64_") && same(9))
        || (sym.starts_with("__ia32_") && same(10))
        || (sym.starts_with("__do_sys") && same(8))
}

/// Where the kernel's x86-64 syscall table maps a syscall's metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableEntry {
    /// Its number: the last entry naming it, as `init_ftrace_syscalls`
    /// leaves `meta->syscall_nr`.
    pub nr: u32,
    /// The table's function: `__x64_sys_openat`, the syscall's own entry,
    /// called with the user's registers (`struct pt_regs *`).
    pub func: String,
}

/// The metadata the kernel maps to a syscall number (and so registers the
/// events of), by name (`sys_openat`), or None when the image does not
/// name its syscall table (a bzImage without CONFIG_KALLSYMS_ALL).
pub(crate) fn mapped(image: &KernelImage, metas: &[&str]) -> Option<HashMap<String, TableEntry>> {
    let table = image.symbol(SYSCALL_TABLE)?;
    // The symbol's size bounds the table (kallsyms': up to the next
    // symbol, which may be the next table: ia32's).
    let entries = match table.size / 8 {
        0 => MAX_SYSCALLS,
        n => n.min(MAX_SYSCALLS),
    };
    let mut found = HashMap::new();
    for i in 0..entries {
        let Some(f) = word(image, table.addr.wrapping_add(8 * i)).and_then(|a| {
            let f = image.function_at(a)?;
            (f.addr == a).then_some(f)
        }) else {
            break;
        };
        if matches(&f.name, NI_SYSCALL) {
            continue;
        }
        if let Some(m) = metas.iter().find(|m| matches(&f.name, m)) {
            let entry = TableEntry {
                nr: i as u32,
                func: f.name.to_string(),
            };
            found.insert((*m).to_owned(), entry);
        }
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn table_functions_match_their_metadata_by_name() {
        assert!(matches("__x64_sys_openat", "sys_openat"));
        assert!(matches("__ia32_sys_openat", "sys_openat"));
        assert!(matches("__do_sys_fork", "sys_fork"));
        assert!(matches("sys_ni_syscall", "sys_ni_syscall"));
        assert!(matches("__x64_sys_ni_syscall", "sys_ni_syscall"));
        assert!(!matches("__x64_sys_open", "sys_openat"));
        assert!(!matches("__x64_sys_openat", "sys_open"));
        assert!(!matches("ab", "sys_open"));
    }
}
