//! Where the guest kernel keeps its current task and a task's pid, tgid and
//! comm: what vmtrace reads to say who made a call. Linux has kept the
//! current task in a per-CPU variable read through GS (`current` is
//! `this_cpu_read(current_task)`): `current_task` up to 6.1, the member
//! `current_task` of per-CPU `struct pcpu_hot` from 6.2 on. The offsets come
//! from the kernel's BTF, else from its DWARF (`TypeSource`), the per-CPU
//! variable from the symbols (else from BTF's description of the per-CPU
//! section).

use crate::kernel::btf::{BtfError, KernelBtf, MemberAt};
use crate::kernel::dwarf::{DwarfError, KernelDwarf};
use crate::kernel::percpu::PerCpuVar;
use crate::kernel::symbols::KernelImage;

/// Linux's TASK_COMM_LEN: comm is a NUL-padded 16-byte array.
pub const COMM_LEN: usize = 16;

/// The per-CPU variables that have held the current task: (variable,
/// member of it; None: the variable is the pointer).
const CURRENT: [(&str, Option<&str>); 2] = [
    ("current_task", None),             // up to Linux 6.1
    ("pcpu_hot", Some("current_task")), // Linux 6.2 and later
];

/// Where the kernel's structure layouts come from: its BTF or its DWARF.
pub trait TypeSource {
    /// Where `member` is in `struct ty`.
    fn member(&self, ty: &str, member: &str) -> Result<MemberAt, TaskLayoutError>;
    /// The offset of per-CPU variable `name` in the per-CPU section, when
    /// the source describes it (BTF's DATASEC).
    fn percpu_offset(&self, name: &str) -> Option<u32>;
    /// Where, besides the symbols, a per-CPU variable was looked for.
    fn percpu_where(&self) -> &'static str;
}

impl TypeSource for KernelBtf {
    fn member(&self, ty: &str, member: &str) -> Result<MemberAt, TaskLayoutError> {
        Ok(KernelBtf::member(self, ty, member)?)
    }
    fn percpu_offset(&self, name: &str) -> Option<u32> {
        KernelBtf::percpu_offset(self, name)
    }
    fn percpu_where(&self) -> &'static str {
        "symbols or BTF"
    }
}

impl TypeSource for KernelDwarf<'_> {
    fn member(&self, ty: &str, member: &str) -> Result<MemberAt, TaskLayoutError> {
        Ok(KernelDwarf::member(self, ty, member)?)
    }
    /// A kernel with DWARF is a vmlinux: its symbols name the variable.
    fn percpu_offset(&self, _: &str) -> Option<u32> {
        None
    }
    fn percpu_where(&self) -> &'static str {
        "symbols"
    }
}

/// How to find the current task of a CPU and read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskLayout {
    /// The per-CPU variable holding (or containing) `current`.
    pub current_var: PerCpuVar,
    /// The pointer's offset within that variable (0 for `current_task`).
    pub current_member: u32,
    /// Offsets in `struct task_struct`.
    pub pid: u32,
    pub tgid: u32,
    pub comm: u32,
}

/// Why events will have no task.
#[derive(Debug, thiserror::Error)]
pub enum TaskLayoutError {
    #[error(transparent)]
    Btf(#[from] BtfError),
    #[error(transparent)]
    Dwarf(#[from] DwarfError),
    #[error(
        "{}: no per-CPU current task found (neither `current_task` nor `pcpu_hot` in its \
         {looked})",
        path.display()
    )]
    NoCurrent {
        path: std::path::PathBuf,
        looked: &'static str,
    },
    #[error("{}: task_struct.{member} is {size} bytes, not {want}", path.display())]
    BadSize {
        path: std::path::PathBuf,
        member: &'static str,
        size: u32,
        want: u32,
    },
}

impl TaskLayout {
    /// The layout of the kernel `image` describes, from its BTF or DWARF.
    pub fn find<T: TypeSource + ?Sized>(
        image: &KernelImage,
        btf: &T,
    ) -> Result<TaskLayout, TaskLayoutError> {
        let path = || image.path.clone();
        let mut found = None;
        for (var, member) in CURRENT {
            // The symbol table (a vmlinux, or kallsyms with KALLSYMS_ALL),
            // else BTF's per-CPU DATASEC (its offsets are the symbols'
            // values in the layout linked at 0, up to Linux 6.14).
            let link = image
                .symbol(var)
                .map(|s| s.addr)
                .or_else(|| btf.percpu_offset(var).map(u64::from));
            let Some(link) = link else { continue };
            let member_off = match member {
                Some(m) => match btf.member(var, m) {
                    Ok(at) => at.offset,
                    // `pcpu_hot` is a variable of type `struct pcpu_hot`.
                    Err(_) => btf.member("pcpu_hot", m)?.offset,
                },
                None => 0,
            };
            if let Some(v) = PerCpuVar::from_symbol(link) {
                found = Some((v, member_off));
                break;
            }
        }
        let (current_var, current_member) = found.ok_or_else(|| TaskLayoutError::NoCurrent {
            path: path(),
            looked: btf.percpu_where(),
        })?;
        let sized = |member: &'static str, want: u32| -> Result<u32, TaskLayoutError> {
            let at = btf.member("task_struct", member)?;
            if at.size != want {
                return Err(TaskLayoutError::BadSize {
                    path: path(),
                    member,
                    size: at.size,
                    want,
                });
            }
            Ok(at.offset)
        };
        Ok(TaskLayout {
            current_var,
            current_member,
            pid: sized("pid", 4)?,
            tgid: sized("tgid", 4)?,
            comm: sized("comm", COMM_LEN as u32)?,
        })
    }

    /// The guest-virtual address of the current-task pointer of the CPU
    /// whose GS base is `gs_base`, on a kernel `slide` bytes from its link
    /// addresses (KASLR; it moves the variable only in the 6.15+ layout).
    pub fn current_ptr_va(
        &self,
        gs_base: u64,
        slide: crate::kernel::kaslr::KernelOffset,
    ) -> Option<u64> {
        let disp = self.current_var.gs_disp(slide)?;
        Some(
            gs_base
                .wrapping_add(disp as i64 as u64)
                .wrapping_add(u64::from(self.current_member)),
        )
    }
}

/// `comm` as vmtrace shows it: up to the first NUL, not UTF-8 replaced.
pub fn comm_string(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_stops_at_the_first_nul() {
        assert_eq!(comm_string(b"swapper/1\0\0\0\0\0\0\0"), "swapper/1");
        assert_eq!(comm_string(b"0123456789abcdef"), "0123456789abcdef");
        assert_eq!(comm_string(b"a\xffb\0junk"), "a\u{fffd}b");
    }
}
