//! The traced events' fields (`-e`) in a trace: each event's format (its
//! fields' names, C types and how ftrace prints them) by the traced
//! function that records it (`__traceiter_NAME`), and each recorded
//! event's values, by its arguments id (`Event::data`: an event entry
//! always records its arguments). An event's record is then a list of
//! (name, value) fields: `Trace::named_fields`.

use std::borrow::Cow;

use crate::kernel::events::field_values::{print_value, render};
use crate::kernel::events::fields::Source;
pub use crate::kernel::events::fields::{EventFormat, Field, FieldValue, Print};

pub use super::model::EventFields;
use super::model::{Event, Trace};

impl Trace {
    /// The format and the values of event `e`, when it is an event's
    /// whose fields were recorded: an entry's (by its arguments id), or a
    /// syscall exit's return (its `ret` the return's value).
    pub fn fields_of(&self, e: &Event) -> Option<(&EventFormat, Cow<'_, [FieldValue]>)> {
        if e.is_return() {
            let format = self.fields.return_format(e.func)?;
            let values = format.fields.iter().map(|f| match f.source {
                Source::Const(v) => FieldValue::Int(v),
                Source::Ret => FieldValue::Int(e.data as i64),
                _ => FieldValue::Unread,
            });
            return Some((format, Cow::Owned(values.collect())));
        }
        if e.data == 0 {
            return None;
        }
        let format = self.fields.format(e.func)?;
        let values = self.fields.values.get(&e.data)?;
        Some((format, Cow::Borrowed(values)))
    }

    /// Event `e`'s fields by name, each value as ftrace prints it.
    pub fn named_fields(&self, e: &Event) -> Option<Vec<(&str, String)>> {
        let (format, values) = self.fields_of(e)?;
        let each = format.fields.iter().zip(values.iter());
        Some(
            each.map(|(f, v)| (f.name.as_str(), print_value(f.print, v)))
                .collect(),
        )
    }

    /// Event `e` as ftrace's event line prints it after the task, CPU and
    /// time: `sched_switch: prev_comm=... ==> next_comm=...`.
    pub fn event_line(&self, e: &Event) -> Option<String> {
        let (format, values) = self.fields_of(e)?;
        Some(format!("{}: {}", format.name(), render(format, &values)))
    }

    /// The name (`sched:sched_switch`) of the event entry `e` of
    /// function `func` records (an entry's, or with `ret` a return's), if
    /// it records one.
    pub fn event_name(&self, func: u32, ret: bool) -> Option<&str> {
        let format = match ret {
            true => self.fields.return_format(func),
            false => self.fields.format(func),
        };
        format.map(|f| f.event.as_str())
    }
}
