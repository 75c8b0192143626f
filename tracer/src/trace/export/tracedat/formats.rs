//! The texts of trace.dat's header: the ring buffer's page and event
//! headers, and the `format` files of ftrace's own entries vmtrace writes
//! (`function`, `funcgraph_entry`, `funcgraph_exit`, `kernel_stack`), as
//! a Linux x86-64 guest's tracefs holds them.

use std::fmt::Write as _;

use super::{ID_FUNCGRAPH_ENTRY, ID_FUNCGRAPH_EXIT, ID_FUNCTION, ID_KERNEL_STACK};

/// `events/header_page` of a 64-bit kernel (ring_buffer_print_page_header).
pub(super) const HEADER_PAGE: &str = "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n\
\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n\
\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n\
\tfield: char data;\toffset:16;\tsize:4080;\tsigned:1;\n";

/// `events/header_event` (ring_buffer_print_entry_header).
pub(super) const HEADER_EVENT: &str = "# compressed entry header\n\
\ttype_len    :    5 bits\n\
\ttime_delta  :   27 bits\n\
\tarray       :   32 bits\n\
\n\
\tpadding     : type == 29\n\
\ttime_extend : type == 30\n\
\ttime_stamp : type == 31\n\
\tdata max type_len  == 28\n";

/// A field of an event's format: type, name, offset, size, signed.
pub(super) type Field<'a> = (&'a str, &'a str, u32, u32, bool);

/// The common fields of every event (kernel/trace/trace_events.c,
/// trace_define_common_fields).
pub(super) const COMMON_FIELDS: [Field<'static>; 4] = [
    ("unsigned short", "common_type", 0, 2, false),
    ("unsigned char", "common_flags", 2, 1, false),
    ("unsigned char", "common_preempt_count", 3, 1, false),
    ("int", "common_pid", 4, 4, true),
];
/// Size of the common fields.
pub(super) const COMMON_SIZE: usize = 8;

/// An ftrace event's `format` file (trace_events.c, f_show).
pub(super) fn format_file(name: &str, id: u16, fields: &[Field], print_fmt: &str) -> String {
    let mut s = format!("name: {name}\nID: {id}\nformat:\n");
    let field = |s: &mut String, &(ty, name, offset, size, signed): &Field| {
        let signed = u8::from(signed);
        let _ = writeln!(
            s,
            "\tfield:{ty} {name};\toffset:{offset};\tsize:{size};\tsigned:{signed};"
        );
    };
    COMMON_FIELDS.iter().for_each(|f| field(&mut s, f));
    // f_show puts a blank line between the common and the event's fields.
    s.push('\n');
    fields.iter().for_each(|f| field(&mut s, f));
    let _ = write!(s, "\nprint fmt: {print_fmt}\n");
    s
}

/// The `function` event's format (kernel/trace/trace_entries.h, `function`).
pub(super) fn function_format() -> String {
    format_file(
        "function",
        ID_FUNCTION,
        &[
            ("unsigned long", "ip", 8, 8, false),
            ("unsigned long", "parent_ip", 16, 8, false),
        ],
        "\" %ps <-- %ps\", (void *)REC->ip, (void *)REC->parent_ip",
    )
}

/// `funcgraph_entry` (trace_entries.h; packed: `func` then `depth`).
pub(super) fn funcgraph_entry_format() -> String {
    format_file(
        "funcgraph_entry",
        ID_FUNCGRAPH_ENTRY,
        &[
            ("unsigned long", "func", 8, 8, false),
            ("int", "depth", 16, 4, true),
        ],
        "\"--> %ps (%d)\", (void *)REC->func, REC->depth",
    )
}

/// `funcgraph_exit` (trace_entries.h): Linux 6.1's layout, or with
/// `retval` the layout of Linux 6.5 and later built with
/// CONFIG_FUNCTION_GRAPH_RETVAL, `retval` after `func`.
pub(super) fn funcgraph_exit_format(retval: bool) -> String {
    let fields: &[Field] = if retval {
        &[
            ("unsigned long", "func", 8, 8, false),
            ("unsigned long", "retval", 16, 8, false),
            ("int", "depth", 24, 4, true),
            ("unsigned int", "overrun", 28, 4, false),
            ("unsigned long long", "calltime", 32, 8, false),
            ("unsigned long long", "rettime", 40, 8, false),
        ]
    } else {
        &[
            ("unsigned long", "func", 8, 8, false),
            ("int", "depth", 16, 4, true),
            ("unsigned int", "overrun", 20, 4, false),
            ("unsigned long long", "calltime", 24, 8, false),
            ("unsigned long long", "rettime", 32, 8, false),
        ]
    };
    let print_fmt = if retval {
        "\"<-- %ps (%d) (start: %llx  end: %llx) over: %d retval: %lx\", (void *)REC->func, \
         REC->depth, REC->calltime, REC->rettime, REC->depth, REC->retval"
    } else {
        "\"<-- %ps (%d) (start: %llx  end: %llx) over: %d\", (void *)REC->func, \
         REC->depth, REC->calltime, REC->rettime, REC->depth"
    };
    format_file("funcgraph_exit", ID_FUNCGRAPH_EXIT, fields, print_fmt)
}

/// `kernel_stack` (trace_entries.h, `FTRACE_STACK_ENTRIES` 8; a record
/// holds `size` frames, as many as were saved).
pub(super) fn kernel_stack_format() -> String {
    format_file(
        "kernel_stack",
        ID_KERNEL_STACK,
        &[
            ("int", "size", 8, 4, true),
            ("unsigned long", "caller[8]", 16, 64, false),
        ],
        "\"\\t=> %ps\\n\\t=> %ps\\n\\t=> %ps\\n\\t=> %ps\\n\\t=> %ps\\n\\t=> %ps\\n\\t=> %ps\\n\\t=> %ps\\n\", \
         (void *)REC->caller[0], (void *)REC->caller[1], (void *)REC->caller[2], \
         (void *)REC->caller[3], (void *)REC->caller[4], (void *)REC->caller[5], \
         (void *)REC->caller[6], (void *)REC->caller[7]",
    )
}
