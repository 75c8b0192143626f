//! The call tree of a function-graph trace, as ftrace's `function_graph`
//! tracer prints it (`vmtrace report --tree`):
//!
//! ```text
//! # CPU  DURATION                  FUNCTION CALLS
//! # |     |   |                     |   |   |   |
//!  0)               |  hrtimer_interrupt() {
//!  0)   0.412 us    |    __hrtimer_run_queues();
//!  0) + 12.310 us   |  } /* hrtimer_interrupt */
//! ```
//!
//! One section per vCPU (those `--cpu` selects), each call on the vCPU it
//! was entered on, in entry order, nested by the guest stack it ran on
//! (`crate::trace::graph`): a call's callees are indented 2 spaces deeper, a call
//! without shown callees is one line (`func();`), one with callees opens
//! (`func() {`) and closes with its duration (`} /* func */`). The duration
//! column is ftrace's, with its markers: `+` over 10 us, `!` over 100 us,
//! `#` over 1 ms, `*` over 10 ms, `@` over 100 ms, `$` over 1 s. Unlike
//! ftrace, an interrupt that ran on its own stack is its own root, after the
//! call it interrupted, not nested in it.
//!
//! A call that returned on another vCPU says so on its last line; one that
//! did not return has no duration and says why (`/* abandoned */`,
//! `/* return lost */`, `/* running at detach */`, `/* unhooked */`). A callee entered on
//! another vCPU than its caller (the caller migrated) starts a root in that
//! vCPU's section, at its own depth.
//!
//! With `--args` a call's line shows its arguments as ftrace's
//! `funcgraph-args` does (`do_sys_open(dfd=-100, ...) {`), and with
//! `--retval` its return value as `funcgraph-retval` does: on a leaf
//! `func(); /* ret=-2 (-ENOENT) */`, on a closing line
//! `} /* func ret=-2 (-ENOENT) */` (`trace::values`).
//!
//! A trace that knows its guest tasks (`Trace::tasks`) adds ftrace's
//! `funcgraph-proc` column, each call's task as `comm-pid` (the comm cut
//! to 7 characters, `<idle>-0` for the idle tasks, `vcpuN-M` where the task
//! is unknown, as in `vmtrace script`), and ftrace's context-switch lines
//! where the task on a vCPU changes:
//!
//! ```text
//! # CPU  TASK/PID         DURATION                  FUNCTION CALLS
//! # |     |    |         |   |                     |   |   |   |
//!  0)     sh-57     |               |  do_sys_open() {
//!  0)     sh-57     |   1.200 us    |    getname();
//!  0)     sh-57     |   3.100 us    |  } /* do_sys_open */
//!  ------------------------------------------
//!  0)     sh-57     =>   <idle>-0
//!  ------------------------------------------
//!
//!  0)   <idle>-0    |   0.300 us    |  do_idle();
//! ```
//!
//! `depth` hides calls nested `depth` or more levels deep (`--depth 1`:
//! only the outermost calls); `threshold_ns` hides returned calls shorter
//! than it, with their callees (`uftrace replay -t`). Calls that did not
//! return are never hidden by the threshold: their duration is unknown.
//!
//! Names and the kernel's path are printed through `super::escape`.

use std::borrow::Cow;
use std::cell::Cell;
use std::io::{self, Write};

use super::duration::human;
use super::escape;
use super::numbers::format_cpu_list;
use crate::trace::graph::{End, Frame, Graph};
use crate::trace::model::Trace;
use crate::trace::values;

/// What the tree shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeOptions {
    /// `--cpu`: only these vCPUs' sections. `None`: all.
    pub cpus: Option<Vec<u32>>,
    /// `--depth N`: show calls less than N levels deep (N >= 1).
    pub depth: Option<u32>,
    /// `--threshold DUR`: hide returned calls shorter than this, ns.
    pub threshold_ns: u64,
}

/// Spaces per nesting level (ftrace's TRACE_GRAPH_INDENT).
const INDENT: usize = 2;
/// Width of the task column (ftrace's TRACE_GRAPH_PROCINFO_LENGTH).
const PROC_WIDTH: usize = 14;
/// Characters of a comm the task column keeps (ftrace's print_graph_proc).
const PROC_COMM: usize = 7;

/// The tree, as printed.
pub fn render_tree(trace: &Trace, opts: &TreeOptions) -> String {
    let mut out = Vec::new();
    write_tree(trace, opts, &mut out).expect("writing to a Vec cannot fail");
    String::from_utf8(out).expect("the tree is UTF-8")
}

/// Writes the tree of `trace` (which should be a function-graph trace:
/// without returns every call is shown as unhooked).
pub fn write_tree(trace: &Trace, opts: &TreeOptions, w: impl Write) -> io::Result<()> {
    let mut w = io::BufWriter::new(w);
    let g = Graph::build(trace);
    let ncpus = trace.meta.cpus;
    let (cpus, missing): (Vec<u32>, Vec<u32>) = match &opts.cpus {
        None => ((0..ncpus).collect(), Vec::new()),
        Some(c) => {
            let mut c = c.clone();
            c.sort_unstable();
            c.dedup();
            c.into_iter().partition(|&cpu| cpu < ncpus)
        }
    };
    // Callees of each frame, in entry order (frames are in entry order).
    let mut children: Vec<Vec<u32>> = vec![Vec::new(); g.frames.len()];
    for (i, f) in g.frames.iter().enumerate() {
        if let Some(p) = f.parent {
            children[p as usize].push(i as u32);
        }
    }
    let names: Vec<Cow<str>> = trace.functions.iter().map(|f| escape(&f.name)).collect();
    let tasks = !trace.tasks.is_empty();
    let p = Printer {
        trace,
        frames: &g.frames,
        names: &names,
        opts,
        cpu_w: ncpus.saturating_sub(1).max(1).to_string().len(),
        tasks,
        last: Cell::new(None),
    };

    tree_header(&mut w, trace, opts, &cpus, &missing)?;

    for &cpu in &cpus {
        writeln!(w, "# vCPU {cpu}")?;
        p.last.set(None);
        let roots = g.frames.iter().enumerate().filter(|(_, f)| {
            f.cpu == cpu && f.parent.is_none_or(|q| g.frames[q as usize].cpu != cpu)
        });
        let mut any = false;
        for (root, _) in roots {
            any |= p.walk(&mut w, root as u32, cpu, &children)?;
        }
        if !any {
            writeln!(w, "# (no calls shown on vCPU {cpu})")?;
        }
    }
    w.flush()
}

/// The tree's header: the kernel, the vCPUs shown (and those `missing`
/// from the trace), the depth and threshold, the column titles.
fn tree_header(
    w: &mut impl Write,
    trace: &Trace,
    opts: &TreeOptions,
    cpus: &[u32],
    missing: &[u32],
) -> io::Result<()> {
    writeln!(w, "# tracer: function_graph (vmtrace)")?;
    writeln!(w, "#")?;
    writeln!(w, "# kernel: {}", escape(&trace.meta.kernel))?;
    // A count, then which: "vCPUs: 0" alone would read as none.
    let mut shown = format!("# vCPUs: {} ({})", cpus.len(), format_cpu_list(cpus));
    if cpus.is_empty() {
        shown = "# vCPUs: none of the requested vCPUs exist".to_string();
    }
    if !missing.is_empty() {
        shown.push_str(&format!(
            "; ignored {}: not in this trace",
            format_cpu_list(missing)
        ));
    }
    writeln!(w, "{shown}")?;
    if !trace.meta.shown.is_empty() {
        writeln!(w, "# filter: {}", escape(&trace.meta.shown))?;
    }
    if let Some(d) = opts.depth {
        writeln!(w, "# depth: calls less than {d} levels deep")?;
    }
    if opts.threshold_ns > 0 {
        writeln!(
            w,
            "# threshold: calls shorter than {} hidden",
            human(opts.threshold_ns)
        )?;
    }
    writeln!(w, "#")?;
    if !trace.tasks.is_empty() {
        writeln!(
            w,
            "# CPU  TASK/PID         DURATION                  FUNCTION CALLS"
        )?;
        writeln!(
            w,
            "# |     |    |         |   |                     |   |   |   |"
        )?;
    } else {
        writeln!(w, "# CPU  DURATION                  FUNCTION CALLS")?;
        writeln!(w, "# |     |   |                     |   |   |   |")?;
    }
    Ok(())
}

struct Printer<'a> {
    trace: &'a Trace,
    frames: &'a [Frame],
    names: &'a [Cow<'a, str>],
    opts: &'a TreeOptions,
    /// Width of the CPU column's number.
    cpu_w: usize,
    /// The task column and context-switch lines (the trace has tasks).
    tasks: bool,
    /// The task of the last line printed in this vCPU's section: its pid
    /// (None: unknown), and its column.
    last: Cell<Option<(Option<u32>, String)>>,
}

impl Printer<'_> {
    /// Whether frame `i` is shown in vCPU `cpu`'s section (its callers are).
    fn shown(&self, i: u32, cpu: u32) -> bool {
        let f = &self.frames[i as usize];
        f.cpu == cpu
            && self.opts.depth.is_none_or(|d| f.depth < d)
            && f.total_ns().is_none_or(|t| t >= self.opts.threshold_ns)
    }

    /// Prints the subtree of `root` (without recursion: a corrupt or
    /// adversarial trace can nest calls arbitrarily deep). Returns whether
    /// anything was printed.
    fn walk(
        &self,
        w: &mut impl Write,
        root: u32,
        cpu: u32,
        children: &[Vec<u32>],
    ) -> io::Result<bool> {
        if !self.shown(root, cpu) {
            return Ok(false);
        }
        // (frame, index of the next callee to visit); a frame on the stack
        // has printed its opening line.
        let mut stack: Vec<(u32, usize)> = Vec::new();
        self.open(w, root, cpu, children, &mut stack)?;
        while let Some(&(i, next)) = stack.last() {
            let kids = &children[i as usize];
            match kids[next..].iter().position(|&k| self.shown(k, cpu)) {
                Some(off) => {
                    if let Some(top) = stack.last_mut() {
                        top.1 = next + off + 1;
                    }
                    self.open(w, kids[next + off], cpu, children, &mut stack)?;
                }
                None => {
                    stack.pop();
                    self.close(w, i)?;
                }
            }
        }
        Ok(true)
    }

    /// Prints frame `i` as a leaf, or its opening line (and pushes it).
    fn open(
        &self,
        w: &mut impl Write,
        i: u32,
        cpu: u32,
        children: &[Vec<u32>],
        stack: &mut Vec<(u32, usize)>,
    ) -> io::Result<()> {
        let f = &self.frames[i as usize];
        let name = self.names.get(f.func as usize).map_or("?", |n| &**n);
        let args = values::args_by_id(self.trace, f.func, f.args);
        let args = args.as_deref().unwrap_or("()");
        if children[i as usize].iter().any(|&k| self.shown(k, cpu)) {
            self.line(w, f, None, &format!("{name}{args} {{"))?;
            stack.push((i, 0));
            Ok(())
        } else {
            let said: Vec<String> = self.ret(f).into_iter().chain(note(f)).collect();
            let comment = match said.is_empty() {
                true => String::new(),
                false => format!(" /* {} */", said.join(", ")),
            };
            self.line(w, f, f.total_ns(), &format!("{name}{args};{comment}"))
        }
    }

    /// The closing line of frame `i`.
    fn close(&self, w: &mut impl Write, i: u32) -> io::Result<()> {
        let f = &self.frames[i as usize];
        let name = self.names.get(f.func as usize).map_or("?", |n| &**n);
        let ret = self.ret(f).map_or(String::new(), |r| format!(" {r}"));
        let text = match note(f) {
            Some(n) => format!("}} /* {name}{ret}, {n} */"),
            None => format!("}} /* {name}{ret} */"),
        };
        self.line(w, f, f.total_ns(), &text)
    }

    /// `ret=VALUE` of a frame that returned, when return values were
    /// recorded (and its function's is not `void`).
    fn ret(&self, f: &Frame) -> Option<String> {
        if !matches!(f.end, End::Returned { .. }) {
            return None;
        }
        values::return_value(self.trace, f.func, f.ret).map(|v| format!("ret={v}"))
    }

    /// ` 0) <duration> |  <indent><text>`, the duration column as ftrace's
    /// print_graph_duration lays it out; with tasks ` 0) <task> | <duration>
    /// ...`, after a context-switch block if the vCPU's task changed.
    fn line(&self, w: &mut impl Write, f: &Frame, ns: Option<u64>, text: &str) -> io::Result<()> {
        let indent = f.depth as usize * INDENT;
        let cpu_w = self.cpu_w;
        if self.tasks {
            let (pid, proc) = self.proc(f);
            if let Some((last_pid, last_proc)) = self.last.take() {
                if last_pid != pid {
                    // ftrace's verif_pid.
                    writeln!(w, " ------------------------------------------")?;
                    writeln!(w, " {:>cpu_w$}) {last_proc} => {proc}", f.cpu)?;
                    writeln!(w, " ------------------------------------------\n")?;
                }
            }
            write!(w, " {:>cpu_w$}) {proc} | ", f.cpu)?;
            self.last.set(Some((pid, proc)));
        } else {
            write!(w, " {:>cpu_w$}) ", f.cpu)?;
        }
        match ns {
            None => w.write_all(b"              |  ")?,
            Some(ns) => {
                let us = (ns / 1000).to_string();
                let mut field = us.clone();
                // ftrace keeps the number to 7 digits: fewer decimals as it grows.
                if us.len() < 7 {
                    let decimals = format!("{:03}", ns % 1000);
                    field.push('.');
                    field.push_str(&decimals[..3.min(7 - us.len())]);
                }
                let pad = 8usize.saturating_sub(field.len());
                write!(w, "{} {field} us {}|  ", mark(ns), " ".repeat(pad))?;
            }
        }
        writeln!(w, "{:indent$}{text}", "")
    }
}

impl Printer<'_> {
    /// Frame `f`'s task (its pid, None if unknown) and its column: ftrace's
    /// print_graph_proc, `comm-pid` centred in `PROC_WIDTH` characters,
    /// the comm cut to `PROC_COMM`.
    fn proc(&self, f: &Frame) -> (Option<u32>, String) {
        let task = (f.task as usize)
            .checked_sub(1)
            .and_then(|i| self.trace.tasks.get(i));
        let (pid, comm, shown) = match task {
            Some(t) if t.pid == 0 => (Some(0), Cow::Borrowed("<idle>"), 0),
            Some(t) => (Some(t.pid), escape(&t.comm), u64::from(t.pid)),
            None => (
                None,
                Cow::Owned(format!("vcpu{}", f.cpu)),
                u64::from(f.cpu) + 1,
            ),
        };
        let comm: String = comm.chars().take(PROC_COMM).collect();
        let label = format!("{comm}-{shown}");
        let spaces = PROC_WIDTH.saturating_sub(label.chars().count());
        let left = spaces / 2;
        let col = format!("{}{label}{}", " ".repeat(left), " ".repeat(spaces - left));
        (pid, col)
    }
}

/// ftrace's duration marker (trace_find_mark): the first threshold exceeded.
fn mark(ns: u64) -> char {
    const MARKS: [(u64, char); 6] = [
        (1_000_000_000, '$'),
        (100_000_000, '@'),
        (10_000_000, '*'),
        (1_000_000, '#'),
        (100_000, '!'),
        (10_000, '+'),
    ];
    MARKS
        .iter()
        .find(|&&(limit, _)| ns > limit)
        .map_or(' ', |&(_, c)| c)
}

/// What a frame's last line says besides its duration.
fn note(f: &Frame) -> Option<String> {
    match f.end {
        End::Returned { cpu, .. } if cpu != f.cpu => Some(format!("returned on vCPU {cpu}")),
        End::Returned { .. } => None,
        End::Abandoned => Some("abandoned".into()),
        End::Lost => Some("return lost".into()),
        End::Running => Some("running at detach".into()),
        End::Unhooked => Some("unhooked".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_ftraces() {
        assert_eq!(mark(10_000), ' ');
        assert_eq!(mark(10_001), '+');
        assert_eq!(mark(100_001), '!');
        assert_eq!(mark(1_000_001), '#');
        assert_eq!(mark(10_000_001), '*');
        assert_eq!(mark(100_000_001), '@');
        assert_eq!(mark(1_000_000_001), '$');
    }
}
