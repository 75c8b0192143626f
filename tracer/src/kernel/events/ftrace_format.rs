//! An event's ftrace format as the guest kernel's tracefs shows it
//! (`events/SYSTEM/NAME/format`), read from the image: its fields' C
//! types, names, sizes and signedness from the class's `fields_array`
//! (`struct trace_event_fields`, include/linux/trace_events.h, which
//! TRACE_EVENT's stage 4 fills), their offsets laid out as the kernel's
//! `event_define_fields` lays them (kernel/trace/trace_events.c: each
//! aligned after the last, from `sizeof(struct trace_entry)`) and checked
//! against BTF's `struct trace_event_raw_NAME` when the kernel has one
//! (a DEFINE_EVENT's struct is its template's), and its print format
//! (`call->print_fmt`, the string TRACE_EVENT's `TP_printk` became). trace.dat
//! carries it, so that `trace-cmd report` prints the event's fields.

use btf_rs::Type;

use crate::kernel::btf::KernelBtf;
use crate::kernel::events::image_data::EventData;
use crate::kernel::events::KernelEvent;
use crate::kernel::symbols::KernelImage;

/// `TRACE_FUNCTION_TYPE` (include/linux/trace_events.h): a
/// `fields_array` entry whose `type` is this calls `define_fields`
/// instead (syscall events): their layout is not in the image.
const TRACE_FUNCTION_TYPE: u64 = u64::MAX;
/// Most fields read of one event (the largest have a few dozen).
const MAX_FIELDS: usize = 64;
/// Longest print format read (sched_switch's is about 1 KiB).
const MAX_PRINT_FMT: usize = 16 << 10;
/// Longest field type or name.
const MAX_NAME: usize = 128;
/// BTF's name of an event's record struct is this and the event's (or its
/// template's) name (include/trace/stages/stage1_struct_define.h).
const RAW_PREFIX: &str = "trace_event_raw_";
/// Its member of a `__string`/`__dynamic_array` field is this and the
/// field's name (`u32 __data_loc_NAME`).
const DATA_LOC_PREFIX: &str = "__data_loc_";

/// One field of an event's record, as its `format` file lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FtraceField {
    /// The type as the kernel's `format` file prints it: `pid_t`,
    /// `char[16]` (an array's length as the kernel's `len` gives it, not
    /// the macro its source names), `__data_loc char[]`.
    pub ty: String,
    pub name: String,
    /// Bytes from the record's start (after the ring-buffer header).
    pub offset: u32,
    pub size: u32,
    pub signed: bool,
}

impl FtraceField {
    /// Its `field:` line's declaration as `f_show` prints it, type then
    /// name: `char` `prev_comm[16]` (an array's bounds after the name),
    /// `pid_t` `prev_pid`, `__data_loc char[]` `filename`.
    pub fn declaration(&self) -> (&str, String) {
        match self.ty.find('[') {
            Some(at) if !self.is_data_loc() => {
                (&self.ty[..at], format!("{}{}", self.name, &self.ty[at..]))
            }
            _ => (&self.ty, self.name.clone()),
        }
    }

    /// Whether the record holds a `__data_loc`: a `u32`, the dynamic
    /// part's length (high 16 bits) and offset from the record's start.
    pub fn is_data_loc(&self) -> bool {
        self.ty.starts_with("__data_loc")
    }
}

/// An event's own fields (after the common ones) and print format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FtraceFormat {
    /// `call->event.type` when read from the running guest; 0: not known
    /// (the image's is 0: the kernel numbers its events at boot).
    pub id: u16,
    pub fields: Vec<FtraceField>,
    /// `call->print_fmt`: `"prev_comm=%s ...", REC->prev_comm, ...`.
    pub print_fmt: String,
}

/// Where `struct trace_event_fields`' members are (6.1: `int is_signed`;
/// 6.12: a bitfield).
struct FieldsLayout {
    stride: u64,
    ty: u64,
    name: u64,
    size: u64,
    align: u64,
    /// Bit offset of `is_signed` in the struct.
    signed_bit: u64,
    /// `len`, an array's length (Linux 5.18 and later: the type names
    /// the length's macro, `char[TASK_COMM_LEN]`).
    len: Option<u64>,
}

/// The bit offset of `member` in struct `ty`, through anonymous structs and
/// unions (`trace_event_fields` keeps its members in one).
fn bit_offset(btf: &KernelBtf, ty: &str, member: &str) -> Option<u64> {
    let types = btf.types();
    let top = types
        .resolve_types_by_name(ty)
        .ok()?
        .into_iter()
        .find_map(|t| match t {
            Type::Struct(s) => Some(s),
            _ => None,
        })?;
    let mut stack = vec![(top, 0u64)];
    while let Some((s, base)) = stack.pop() {
        for m in &s.members {
            let at = base + u64::from(m.bit_offset());
            let name = types.resolve_name(m).unwrap_or_default();
            if name == member {
                return Some(at);
            }
            if name.is_empty() {
                if let Ok(Type::Struct(inner) | Type::Union(inner)) = types.resolve_chained_type(m)
                {
                    stack.push((inner, at));
                }
            }
        }
    }
    None
}

impl FieldsLayout {
    fn from_btf(btf: &KernelBtf) -> Option<FieldsLayout> {
        const S: &str = "trace_event_fields";
        let byte = |m: &str| bit_offset(btf, S, m).map(|b| b / 8);
        Some(FieldsLayout {
            stride: u64::from(btf.struct_size(S).ok()?),
            ty: byte("type")?,
            name: byte("name")?,
            size: byte("size")?,
            align: byte("align")?,
            signed_bit: bit_offset(btf, S, "is_signed")?,
            len: byte("len"),
        })
    }
}

/// The `format` of `event` (a tracepoint's; None when the image does not
/// hold its layout: a syscall event's, a kernel before `fields_array`
/// (5.6), or a layout BTF contradicts).
pub fn read(image: &KernelImage, btf: &KernelBtf, event: &KernelEvent) -> Option<FtraceFormat> {
    read_in(image, btf, btf, event)
}

/// [`read`] from `mem` (the image, or a running guest's memory for a
/// module's event), `btf` the kernel's and `own` the BTF that declares
/// the event's record struct (a module's own, split on the kernel's).
pub(crate) fn read_in(
    mem: &dyn EventData,
    btf: &KernelBtf,
    own: &KernelBtf,
    event: &KernelEvent,
) -> Option<FtraceFormat> {
    let word = |at: u64| mem.word(at);
    let word32 = |at: u64| mem.word32(at);
    let c_string_max = |at: u64, max: usize| mem.c_string_max(at, max);
    let l = FieldsLayout::from_btf(btf)?;
    let class_at = btf.member("trace_event_call", "class").ok()?.offset;
    let fmt_at = btf.member("trace_event_call", "print_fmt").ok()?.offset;
    let array_at = btf.member("trace_event_class", "fields_array").ok()?.offset;
    let class = word(event.call + u64::from(class_at))?;
    let mut at = word(class + u64::from(array_at))?;
    let mut offset = btf.struct_size("trace_entry").ok()?;
    let mut fields = Vec::new();
    loop {
        let ty = word(at + l.ty)?;
        if ty == 0 {
            break;
        }
        if ty == TRACE_FUNCTION_TYPE || fields.len() == MAX_FIELDS {
            return None;
        }
        let size = word32(at + l.size)?;
        let align = word32(at + l.align)?;
        let signed = word32(at + l.signed_bit / 32 * 4)? >> (l.signed_bit % 32) & 1;
        if !align.is_power_of_two() {
            return None;
        }
        offset = offset.next_multiple_of(align);
        let ty = c_string_max(ty, MAX_NAME)?;
        let len = match l.len {
            Some(len) => Some(word32(at + len)?),
            None => None,
        };
        fields.push(FtraceField {
            ty: array_type(ty, len),
            name: c_string_max(word(at + l.name)?, MAX_NAME)?,
            offset,
            size,
            signed: signed != 0,
        });
        offset = offset.checked_add(size)?;
        at += l.stride;
    }
    let print_fmt = c_string_max(word(event.call + u64::from(fmt_at))?, MAX_PRINT_FMT)?;
    agrees_with_btf(own, &event.name, &fields).then_some(FtraceFormat {
        id: 0,
        fields,
        print_fmt,
    })
}

/// The type as `f_show` prints it: an array's (not a `__data_loc`'s)
/// bounds hold its `len` when the kernel keeps one (`char[16]`, or
/// `char[]` for 0), else they stay as the type spells them.
fn array_type(ty: String, len: Option<u32>) -> String {
    match (ty.find('['), len) {
        (Some(at), Some(len)) if !ty.starts_with("__data_loc") => match len {
            0 => format!("{}[]", &ty[..at]),
            n => format!("{}[{n}]", &ty[..at]),
        },
        _ => ty,
    }
}

/// Whether BTF's `trace_event_raw_NAME`, when the kernel has it, puts
/// each field where the layout does.
fn agrees_with_btf(btf: &KernelBtf, name: &str, fields: &[FtraceField]) -> bool {
    let raw = format!("{RAW_PREFIX}{name}");
    if !btf.has_struct(&raw) {
        return true;
    }
    fields.iter().all(|f| {
        let member = match f.is_data_loc() {
            true => format!("{DATA_LOC_PREFIX}{}", f.name),
            false => f.name.clone(),
        };
        btf.member(&raw, &member)
            .is_ok_and(|m| m.offset == f.offset && m.size == f.size)
    })
}
