//! `--format folded`: folded stacks of a function-graph trace, and of the
//! entries that carry a kernel stack (see [`write_folded`]).

use std::collections::HashMap;
use std::io::{self, BufWriter, Write};

use crate::trace::graph::Graph;
use crate::trace::model::Trace;
use crate::trace::report::escape;

/// Writes folded stacks (Brendan Gregg's format, read by flamegraph.pl,
/// inferno and speedscope): one line per distinct call path,
/// `outer;inner;leaf VALUE`, the value being the self time in ns summed
/// over the calls with that path, on every vCPU.
///
/// Only calls that returned count (a call that did not return has no
/// duration); a returned call under one that did not return keeps it in
/// its path. The values add up to the self time of every returned call.
/// Paths whose self time is 0 are left out. Lines are sorted by path
/// (byte order). A `;` in a function name would split the frame: it
/// becomes `_`; control characters (a newline would split the line) are
/// escaped (`\x0a`, see `report::escape`). Kernel symbols have neither. An
/// entry-only trace has no returned calls: the output is empty.
///
/// A trace that knows its guest tasks starts each path whose task is known
/// with the task's comm (`swapper` for the idle tasks), as perf's
/// stackcollapse-perf.pl does with a process's name: `sh;do_sys_open;getname
/// 1200`.
///
/// An entry that carries its kernel stack (`--stack`) is, in any trace, a
/// line of its own as `perf script | stackcollapse-perf.pl` folds a
/// sample: `comm;outermost;...;caller;function COUNT`, the frames its
/// stack's functions outermost first (without offsets; a return address
/// in no known function in hex), the value the number of stored entries
/// with that path. In a function-graph trace these lines come on top of
/// the self-time lines (their values are counts, not ns). Lines whose
/// path is the same add up.
pub fn write_folded(trace: &Trace, w: impl Write) -> io::Result<()> {
    let mut w = BufWriter::new(w);
    let g = Graph::build(trace);
    let frames = FrameNames::new(trace);
    let mut paths = Paths::default();
    for f in &g.frames {
        // Parents come before their callees (frames are in entry order).
        let parent = match f.parent {
            Some(p) => paths.frame_path[p as usize],
            None => {
                let comm = (f.task as usize)
                    .checked_sub(1)
                    .and_then(|i| frames.task_frame.get(i).copied());
                comm.map_or(ROOT, |c| paths.path_of(ROOT, c))
            }
        };
        paths.add_frame(parent, f.func, f.self_ns());
    }
    let mut lines = paths.lines(&frames);
    lines.extend(stack_lines(trace, &frames));
    lines.sort();
    let mut lines = lines.into_iter().peekable();
    while let Some((path, mut n)) = lines.next() {
        while let Some((_, m)) = lines.next_if(|(p, _)| *p == path) {
            n = n.saturating_add(m);
        }
        writeln!(w, "{path} {n}")?;
    }
    w.flush()
}

/// The entries that carry a kernel stack, folded by path (comm, frames
/// outermost first, the function), with how many share each.
fn stack_lines(trace: &Trace, frames: &FrameNames) -> Vec<(String, u64)> {
    let mut count: HashMap<String, u64> = HashMap::new();
    for e in trace.events.iter().filter(|e| !e.is_return()) {
        let Some(stack) = trace.stack_of(e) else {
            continue;
        };
        let mut path: Vec<String> = Vec::with_capacity(stack.frames.len() + 2);
        let comm = (e.task as usize)
            .checked_sub(1)
            .and_then(|i| frames.task_frame.get(i).copied());
        if let Some(c) = comm {
            path.push(frames.name_of(c).to_string());
        }
        for i in (0..stack.frames.len()).rev() {
            let a = stack.frames[i];
            let f = crate::trace::stacks::StackFrame::of(trace, stack, i);
            path.push(match f.function {
                Some(s) => escape(&s.name).replace(';', "_"),
                None => format!("{a:#x}"),
            });
        }
        path.push(frames.name_of(e.func).to_string());
        *count.entry(path.join(";")).or_default() += 1;
    }
    count.into_iter().collect()
}

/// The path of the outermost frames.
const ROOT: u32 = u32::MAX;

/// The names of a folded line's frames: functions (numbered by their index)
/// and tasks' comms, each a frame of its own, numbered down from ROOT - 1.
struct FrameNames {
    /// Functions' names, `;` replaced, control characters escaped.
    names: Vec<String>,
    /// Distinct comms, the first numbered ROOT - 1.
    comm_names: Vec<String>,
    /// Each task's comm frame (task id - 1 as index).
    task_frame: Vec<u32>,
}

impl FrameNames {
    fn new(trace: &Trace) -> Self {
        let names: Vec<String> = trace
            .functions
            .iter()
            .map(|f| escape(&f.name).replace(';', "_"))
            .collect();
        let mut comm_names: Vec<String> = Vec::new();
        let mut comm_ids: HashMap<String, u32> = HashMap::new();
        let task_frame: Vec<u32> = trace
            .tasks
            .iter()
            .map(|t| {
                let comm = if t.pid == 0 {
                    "swapper"
                } else {
                    t.comm.as_str()
                };
                let comm = escape(comm).replace(';', "_");
                let next = ROOT - 1 - comm_names.len() as u32;
                *comm_ids.entry(comm).or_insert_with_key(|c| {
                    comm_names.push(c.clone());
                    next
                })
            })
            .collect();
        FrameNames {
            names,
            comm_names,
            task_frame,
        }
    }

    /// The name of frame `func`: a comm or a function.
    fn name_of(&self, func: u32) -> &str {
        match (ROOT - 1).checked_sub(func) {
            Some(k) if (k as usize) < self.comm_names.len() => self.comm_names[k as usize].as_str(),
            _ => self.names.get(func as usize).map_or("?", String::as_str),
        }
    }
}

/// Distinct call paths and their summed self time.
#[derive(Default)]
struct Paths {
    /// Each path's id: (parent path, frame).
    ids: HashMap<(u32, u32), u32>,
    /// Each path, by id: (parent path, frame).
    paths: Vec<(u32, u32)>,
    /// Each path's self time, by id.
    self_ns: Vec<u64>,
    /// Each graph frame's path, in the graph's order.
    frame_path: Vec<u32>,
}

impl Paths {
    /// The id of path `parent;func`, added if new.
    fn path_of(&mut self, parent: u32, func: u32) -> u32 {
        let paths = &mut self.paths;
        *self.ids.entry((parent, func)).or_insert_with(|| {
            paths.push((parent, func));
            (paths.len() - 1) as u32
        })
    }

    /// Adds the next graph frame, a call of `func` under path `parent`.
    fn add_frame(&mut self, parent: u32, func: u32, self_ns: Option<u64>) {
        let id = self.path_of(parent, func);
        self.frame_path.push(id);
        if self.self_ns.len() <= id as usize {
            self.self_ns.resize(id as usize + 1, 0);
        }
        if let Some(s) = self_ns {
            self.self_ns[id as usize] = self.self_ns[id as usize].saturating_add(s);
        }
    }

    /// The folded lines, `(path, self ns)`, sorted; paths with no self
    /// time left out.
    fn lines(&self, frames: &FrameNames) -> Vec<(String, u64)> {
        let mut lines: Vec<(String, u64)> = Vec::new();
        for (id, &ns) in self.self_ns.iter().enumerate() {
            if ns == 0 {
                continue;
            }
            let mut chain = Vec::new();
            let mut at = id as u32;
            while at != ROOT {
                let (parent, func) = self.paths[at as usize];
                chain.push(frames.name_of(func));
                at = parent;
            }
            chain.reverse();
            lines.push((chain.join(";"), ns));
        }
        lines.sort();
        lines
    }
}
