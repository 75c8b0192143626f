//! The traced events' fields (`-e`) in a trace: each event's format (its
//! fields' names, C types and how ftrace prints them) by the traced
//! function that records it (`__traceiter_NAME`), and each recorded
//! event's values, by its arguments id (`Event::data`: an event entry
//! always records its arguments). An event's record is then a list of
//! (name, value) fields: `Trace::named_fields`.

use crate::kernel::events::field_values::{print_value, render};
pub use crate::kernel::events::fields::{EventFormat, Field, FieldValue, Print};

pub use super::model::EventFields;
use super::model::{Event, Trace};

impl Trace {
    /// The format and the values of entry `e`, when it is an event's
    /// whose fields were recorded.
    pub fn fields_of(&self, e: &Event) -> Option<(&EventFormat, &[FieldValue])> {
        if e.is_return() || e.data == 0 {
            return None;
        }
        let format = self.fields.format(e.func)?;
        let values = self.fields.values.get(&e.data)?;
        Some((format, values))
    }

    /// Entry `e`'s fields by name, each value as ftrace prints it.
    pub fn named_fields(&self, e: &Event) -> Option<Vec<(&str, String)>> {
        let (format, values) = self.fields_of(e)?;
        let each = format.fields.iter().zip(values);
        Some(
            each.map(|(f, v)| (f.name.as_str(), print_value(f.print, v)))
                .collect(),
        )
    }

    /// Entry `e` as ftrace's event line prints it after the task, CPU and
    /// time: `sched_switch: prev_comm=... ==> next_comm=...`.
    pub fn event_line(&self, e: &Event) -> Option<String> {
        let (format, values) = self.fields_of(e)?;
        Some(format!("{}: {}", format.name(), render(format, values)))
    }

    /// The name (`sched:sched_switch`) of the event function `func`
    /// records, if it is one's.
    pub fn event_name(&self, func: u32) -> Option<&str> {
        self.fields.format(func).map(|f| f.event.as_str())
    }
}
