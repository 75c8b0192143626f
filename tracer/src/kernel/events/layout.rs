//! Where the kernel keeps what an event table entry says, from its BTF:
//! the members of `struct trace_event_call`, `struct trace_event_class`,
//! `struct tracepoint` and `struct syscall_metadata`
//! (include/linux/trace_events.h, include/linux/tracepoint-defs.h,
//! include/trace/syscall.h), and the values of the `TRACE_EVENT_FL_*`
//! flags, whose bits moved between versions. Nothing is assumed of a
//! version.

use crate::kernel::btf::{BtfError, KernelBtf};

/// The flag of a `trace_event_call` whose name is its tracepoint's
/// (`call->tp`, else `call->name`).
const FL_TRACEPOINT: &str = "TRACE_EVENT_FL_TRACEPOINT";
/// The flag of an event that tracefs shows the format of but cannot enable
/// (the `ftrace` system's; `available_events` leaves them out).
const FL_IGNORE_ENABLE: &str = "TRACE_EVENT_FL_IGNORE_ENABLE";

/// Byte offsets of the members vmtrace reads, and the flags' values.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EventLayout {
    pub(crate) call_class: u32,
    /// `call->name` and `call->tp` share this place (a union).
    pub(crate) call_name: u32,
    pub(crate) call_flags: u32,
    pub(crate) call_data: u32,
    pub(crate) class_system: u32,
    pub(crate) class_reg: u32,
    pub(crate) class_raw_init: u32,
    pub(crate) tp_name: u32,
    pub(crate) tp_key: u32,
    pub(crate) tp_iterator: u32,
    pub(crate) fl_tracepoint: u32,
    pub(crate) fl_ignore_enable: u32,
    /// `struct syscall_metadata`, if the kernel has syscall events.
    pub(crate) meta: Option<MetaLayout>,
}

/// `struct syscall_metadata`'s members.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MetaLayout {
    pub(crate) name: u32,
    pub(crate) nb_args: u32,
    pub(crate) types: u32,
    pub(crate) args: u32,
}

impl EventLayout {
    /// The layout of this kernel's structures, from its BTF.
    pub(crate) fn from_btf(btf: &KernelBtf) -> Result<EventLayout, BtfError> {
        let at = |ty: &str, member: &str| btf.member(ty, member).map(|m| m.offset);
        let call = "trace_event_call";
        let class = "trace_event_class";
        let tp = "tracepoint";
        let flags = btf.enum_declaring(FL_TRACEPOINT).unwrap_or_default();
        let flag = |name: &str| {
            flags
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, v)| u32::try_from(*v).ok())
                .ok_or_else(|| BtfError::Broken {
                    path: btf.path().to_owned(),
                    what: format!("no enumerator {name}"),
                })
        };
        let meta = match btf.has_struct("syscall_metadata") {
            true => Some(MetaLayout {
                name: at("syscall_metadata", "name")?,
                nb_args: at("syscall_metadata", "nb_args")?,
                types: at("syscall_metadata", "types")?,
                args: at("syscall_metadata", "args")?,
            }),
            false => None,
        };
        Ok(EventLayout {
            call_class: at(call, "class")?,
            call_name: at(call, "name")?,
            call_flags: at(call, "flags")?,
            call_data: at(call, "data")?,
            class_system: at(class, "system")?,
            class_reg: at(class, "reg")?,
            class_raw_init: at(class, "raw_init")?,
            tp_name: at(tp, "name")?,
            tp_key: at(tp, "key")?,
            tp_iterator: at(tp, "iterator")?,
            fl_tracepoint: flag(FL_TRACEPOINT)?,
            fl_ignore_enable: flag(FL_IGNORE_ENABLE)?,
            meta,
        })
    }
}
