//! The benches by name, as `perf bench` names its suites: a collection
//! (`call`, `attach`, ...) and a bench in it (`call/trap`), each with the
//! question it answers, the figure it reports and what it needs. `vmtrace
//! bench list` prints them; `vmtrace bench NAME...` runs some of them.

use std::fmt::Write as _;

/// One bench; the order of `BENCHES` (a collection's benches together).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BenchId {
    CallTrap,
    CallExitless,
    CallGraph,
    CallStack,
    CallDirect,
    AttachPause,
    AttachScaling,
    AttachModes,
    AttachDirect,
    RecordThroughput,
    ReportRender,
    BootFtrace,
    QemuAttach,
    QemuDrain,
    SitesDirect,
    EventsCost,
}

/// What a bench runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    Nothing,
    /// guest/out/mini.elf (`--kernel`), built if missing.
    MiniGuest,
    /// guest/out/mini-noftrace.elf (the mini guest without ftrace's
    /// sites), built if missing.
    MiniNoftrace,
    /// A Linux vmlinux (`--vmlinux`, default guest/out/vmlinux), loaded
    /// into a VM and never run.
    Vmlinux,
    /// The Linux guest (bzImage, initramfs beside the vmlinux), booted
    /// `--linux-boots N` times per configuration.
    LinuxGuest,
    /// The Linux guest beside the vmlinux, run by QEMU (TCG) with the
    /// workload initramfs (`bash guest/build.sh workload`).
    QemuGuest,
}

impl Needs {
    pub fn describe(self) -> &'static str {
        match self {
            Needs::Nothing => "nothing (no guest)",
            Needs::MiniGuest => "the mini guest",
            Needs::MiniNoftrace => "the mini guest built without ftrace (mini-noftrace)",
            Needs::Vmlinux => "a Linux vmlinux (loaded, never booted)",
            Needs::LinuxGuest => "the Linux guest, booted (--linux-boots N)",
            Needs::QemuGuest => {
                "the Linux guest in QEMU (qemu-system-x86_64, TCG), with the workload initramfs"
            }
        }
    }
}

/// A bench: its name, the letters it had before it had a name (still
/// accepted), the question it answers, and the figure it reports.
#[derive(Debug)]
pub struct Bench {
    pub id: BenchId,
    /// `collection/bench`.
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    /// What it answers, one line.
    pub goal: &'static str,
    /// The figure it reports, and its unit.
    pub figure: &'static str,
    pub unit: &'static str,
    pub needs: Needs,
}

impl Bench {
    pub fn collection(&self) -> &'static str {
        self.name.split_once('/').map_or(self.name, |(c, _)| c)
    }
}

/// Every bench, a collection's together.
pub const BENCHES: [Bench; 16] = [
    Bench {
        id: BenchId::CallTrap,
        name: "call/trap",
        aliases: &["a", "b", "c"],
        goal: "What does a traced call cost in trap mode, against the exit round trip no \
               trap can avoid?",
        figure: "b / a: cost per traced call (recorder) over the exit round trip \
                 (resume-only handler), medians over the rounds",
        unit: "ratio (a, b in µs)",
        needs: Needs::MiniGuest,
    },
    Bench {
        id: BenchId::CallExitless,
        name: "call/exitless",
        aliases: &["f"],
        goal: "How many exits and guest instructions does an exitless call cost, against a \
               trapped one?",
        figure: "guest instructions per exitless call (priced by a calibration loop; counted \
                 by KVM where it emulates ring 0) and exits per call",
        unit: "guest instructions, exits per call",
        needs: Needs::MiniGuest,
    },
    Bench {
        id: BenchId::CallGraph,
        name: "call/graph",
        aliases: &["g"],
        goal: "What do return hooks (--graph) add per call: exits in trap mode, guest \
               instructions exitless?",
        figure: "exits per hooked call (trap) and guest instructions per hooked call \
                 (exitless), beside call/exitless's entry-only figures",
        unit: "exits, guest instructions per call",
        needs: Needs::MiniGuest,
    },
    Bench {
        id: BenchId::CallStack,
        name: "call/stack",
        aliases: &[],
        goal: "What does recording the kernel stack (--stack) add to a trapped call?",
        figure: "host time per stack_leaf call with its stack over without (frame pointers, \
                 2 to 5 frames), medians over the rounds; frames per stack; exits per call",
        unit: "ratio (µs both, frames, exits)",
        needs: Needs::MiniGuest,
    },
    Bench {
        id: BenchId::CallDirect,
        name: "call/direct",
        aliases: &[],
        goal: "How many more guest instructions does an exitless direct-entry call cost than \
               an ftrace site's?",
        figure: "guest instructions per exitless direct-entry call (counted in the stubs' code; \
                 by KVM where it emulates ring 0), beside call/exitless's ftrace-site figure; \
                 exits per call",
        unit: "guest instructions, exits per call",
        needs: Needs::MiniNoftrace,
    },
    Bench {
        id: BenchId::AttachPause,
        name: "attach/pause",
        aliases: &["d"],
        goal: "How long does pausing 1, 2 and 4 running vCPUs take, and how long are they \
               stopped to attach and detach?",
        figure: "pause latency, and windows of empty, attach and detach pauses: p50, p99, max",
        unit: "µs",
        needs: Needs::MiniGuest,
    },
    Bench {
        id: BenchId::AttachScaling,
        name: "attach/scaling",
        aliases: &["e", "loading"],
        goal: "How does the attach window grow from 10 sites to all of Linux's, and how long \
               does loading the symbols and sites take?",
        figure: "attach window for 10, 100, 1,000 and all sites (first, p50, worst); loading",
        unit: "µs (loading: ms)",
        needs: Needs::Vmlinux,
    },
    Bench {
        id: BenchId::AttachModes,
        name: "attach/modes",
        aliases: &["j"],
        goal: "Does an exitless attach stop the guest for at most twice as long as a trap \
               attach?",
        figure: "first attach's pause, exitless over trap, median over fresh guests",
        unit: "ratio (pauses in µs)",
        needs: Needs::MiniGuest,
    },
    Bench {
        id: BenchId::AttachDirect,
        name: "attach/direct",
        aliases: &[],
        goal: "How long does attaching 100 and 1,000 direct entries stop the guest?",
        figure: "attach window for 100 and 1,000 direct sites of a Linux vmlinux (first, p50, \
                 worst)",
        unit: "µs",
        needs: Needs::Vmlinux,
    },
    Bench {
        id: BenchId::RecordThroughput,
        name: "record/throughput",
        aliases: &["h"],
        goal: "How many events per second does recording sustain to a data file, in how much \
               memory?",
        figure: "events stored per second, MB/s to the file, peak memory growth",
        unit: "events/s (MiB)",
        needs: Needs::Nothing,
    },
    Bench {
        id: BenchId::ReportRender,
        name: "report/render",
        aliases: &[],
        goal: "How long do the text report (with callers) and the JSON export of a \
               10-million-event trace take?",
        figure: "seconds to render the report, and to export JSON (--report-events events)",
        unit: "s",
        needs: Needs::Nothing,
    },
    Bench {
        id: BenchId::BootFtrace,
        name: "boot/ftrace",
        aliases: &["i"],
        goal: "What does vmtrace add per call to a Linux boot, against the guest's own \
               ftrace?",
        figure: "guest instructions added per kernfs_* call by exitless, trap and ftrace (less \
                 its setup), counted by KVM's emulator",
        unit: "guest instructions per call",
        needs: Needs::LinuxGuest,
    },
    Bench {
        id: BenchId::QemuAttach,
        name: "qemu/attach",
        aliases: &[],
        goal: "How long does `vmtrace attach` stop a QEMU guest, and what does an exitless \
               call cost it?",
        figure: "attach pause for 1, ~100 and all sites, and of an attach that plugs the ring device; ns per getpid call untraced and exitless; \
                 events stored per second of the bursts",
        unit: "µs (ns per call, events/s)",
        needs: Needs::QemuGuest,
    },
    Bench {
        id: BenchId::QemuDrain,
        name: "qemu/drain",
        aliases: &[],
        goal: "How many events per second does the exitless drainer itself take from its \
               rings to a data file, in a QEMU's ring device and in the own VMM's memory?",
        figure: "events drained and stored per second, rings filled at memory speed by host \
                 threads, in each VMM's memory (same run, same drainer)",
        unit: "events/s",
        needs: Needs::Nothing,
    },
    Bench {
        id: BenchId::SitesDirect,
        name: "sites/direct",
        aliases: &[],
        goal: "How many of a kernel's functions can a direct entry trace, and why are the \
               others refused?",
        figure: "functions proved safe for a direct entry, and refused by rule, on the 6.1 \
                 default guest's vmlinux and a distro kernel (--distro-kernel)",
        unit: "functions",
        needs: Needs::Vmlinux,
    },
    Bench {
        id: BenchId::EventsCost,
        name: "events/cost",
        aliases: &[],
        goal: "How many guest instructions does an exitless event (-e) cost, beside a traced \
               function entry?",
        figure: "guest instructions per exitless sched_switch, sched_wakeup and task_rename: a \
                 function entry's (vmtrace's trampoline) plus the event's path in the kernel's \
                 text (plus task_rename's string copies in vmtrace's code), counted in the code \
                 of the 6.1 default guest's vmlinux, never run",
        unit: "guest instructions",
        needs: Needs::Vmlinux,
    },
];

/// Each collection and what its benches measure, in `BENCHES`' order.
pub const COLLECTIONS: [(&str, &str); 8] = [
    ("call", "what one traced call costs"),
    (
        "attach",
        "how long the guest is stopped to attach and detach",
    ),
    ("record", "recording to disk"),
    ("report", "reading a trace back"),
    ("boot", "a Linux guest's boot, traced"),
    ("qemu", "a QEMU guest traced by `vmtrace attach`"),
    ("sites", "which functions a kernel lets vmtrace trace"),
    ("events", "what a kernel event (-e) costs"),
];

pub fn bench(id: BenchId) -> &'static Bench {
    // BENCHES is in BenchId's order (a test checks it).
    &BENCHES[id as usize]
}

/// The benches a run measures: chosen by name, or the default set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    /// In `BENCHES`' order.
    pub ids: Vec<BenchId>,
    /// Chosen by name: the table, the goals and the JSON show these alone.
    /// Otherwise (the default set, `--counts-only`) every bench is shown,
    /// those not run said not measured, and why.
    pub named: bool,
}

impl Selection {
    /// No name, or `all`: every bench but boot/ftrace, which boots Linux
    /// (minutes) and runs only with `--linux-boots N`; `--counts-only`:
    /// those whose figures are counts.
    pub fn default_set(counts_only: bool, linux_boots: usize) -> Selection {
        let ids = BENCHES
            .iter()
            .map(|b| b.id)
            .filter(|&id| match id {
                BenchId::BootFtrace => linux_boots > 0,
                // Runs QEMU, or (qemu/drain) writes gigabytes to measure
                // what it drains: only when named.
                BenchId::QemuAttach | BenchId::QemuDrain => false,
                BenchId::CallExitless | BenchId::CallGraph => true,
                _ => !counts_only,
            })
            .collect();
        Selection { ids, named: false }
    }

    /// The benches `names` choose (names, collections, letters), in
    /// `BENCHES`' order; Err: the first name that is none of these.
    pub fn named(names: &[String]) -> Result<Selection, String> {
        let mut chosen = Vec::new();
        for name in names {
            let found: Vec<BenchId> = BENCHES
                .iter()
                .filter(|b| {
                    b.name == name.as_str()
                        || b.collection() == name.as_str()
                        || b.aliases.contains(&name.as_str())
                })
                .map(|b| b.id)
                .collect();
            if found.is_empty() {
                return Err(name.clone());
            }
            chosen.extend(found);
        }
        let ids = BENCHES
            .iter()
            .map(|b| b.id)
            .filter(|id| chosen.contains(id))
            .collect();
        Ok(Selection { ids, named: true })
    }

    /// These benches and `more`'s, in `BENCHES`' order, shown as these are.
    pub fn and(&self, more: &Selection) -> Selection {
        let ids = BENCHES
            .iter()
            .map(|b| b.id)
            .filter(|&id| self.runs(id) || more.runs(id))
            .collect();
        Selection {
            ids,
            named: self.named,
        }
    }

    pub fn runs(&self, id: BenchId) -> bool {
        self.ids.contains(&id)
    }

    /// Whether the table and JSON show `id`: run, or said not run.
    pub fn shows(&self, id: BenchId) -> bool {
        !self.named || self.runs(id)
    }

    pub fn needs(&self, needs: Needs) -> bool {
        self.ids.iter().any(|&id| bench(id).needs == needs)
    }
}

/// Every name `vmtrace bench` takes, for the error that names an unknown one.
pub fn names() -> String {
    let benches: Vec<&str> = BENCHES.iter().map(|b| b.name).collect();
    let collections: Vec<&str> = COLLECTIONS.iter().map(|(c, _)| *c).collect();
    format!(
        "{}; collections {}; all",
        benches.join(", "),
        collections.join(", ")
    )
}

/// `vmtrace bench list`: by collection, each bench of `ids` with its goal,
/// figure, unit and what it needs.
pub fn list(ids: &[BenchId]) -> String {
    let mut o = String::new();
    // Writing to a String cannot fail.
    let shown = BENCHES.iter().filter(|b| ids.contains(&b.id));
    let collections = COLLECTIONS
        .iter()
        .filter(|(c, _)| shown.clone().any(|b| b.collection() == *c))
        .count();
    let _ = writeln!(
        o,
        "vmtrace bench: {} of {} benches, in {collections} of {} collections. `vmtrace bench \
         NAME...` runs the benches named (a collection runs all of its own); no name, or `all`, \
         runs every bench but boot/ftrace, which runs with --linux-boots N, and the qemu \
         benches, which run when named.",
        shown.count(),
        BENCHES.len(),
        COLLECTIONS.len()
    );
    for (collection, what) in COLLECTIONS {
        let benches: Vec<&Bench> = BENCHES
            .iter()
            .filter(|b| b.collection() == collection && ids.contains(&b.id))
            .collect();
        if benches.is_empty() {
            continue;
        }
        let _ = writeln!(o, "\n{collection}: {what}");
        for b in benches {
            let aliases = match b.aliases {
                [] => String::new(),
                a => format!(" (also {})", a.join(", ")),
            };
            let _ = writeln!(o, "  {}{aliases}", b.name);
            let _ = writeln!(o, "      goal:   {}", b.goal);
            let _ = writeln!(o, "      figure: {} [{}]", b.figure, b.unit);
            let _ = writeln!(o, "      needs:  {}", b.needs.describe());
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Result<Vec<BenchId>, String> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        Selection::named(&names).map(|s| s.ids)
    }

    #[test]
    fn names_collections_and_letters_choose_benches_in_order() {
        use BenchId::*;
        assert_eq!(ids(&["call/graph", "a"]), Ok(vec![CallTrap, CallGraph]));
        assert_eq!(
            ids(&["call"]),
            Ok(vec![
                CallTrap,
                CallExitless,
                CallGraph,
                CallStack,
                CallDirect
            ])
        );
        assert_eq!(
            ids(&["attach"]),
            Ok(vec![AttachPause, AttachScaling, AttachModes, AttachDirect])
        );
        assert_eq!(
            ids(&["sites", "call/direct"]),
            Ok(vec![CallDirect, SitesDirect])
        );
        assert_eq!(ids(&["loading", "e"]), Ok(vec![AttachScaling]));
        assert_eq!(ids(&["report", "i"]), Ok(vec![ReportRender, BootFtrace]));
        assert_eq!(ids(&["call/nope"]), Err("call/nope".to_string()));
    }

    #[test]
    fn default_set_is_every_bench_but_the_boots_and_qemu() {
        let all = Selection::default_set(false, 0);
        assert_eq!(all.ids.len(), BENCHES.len() - 3);
        assert!(!all.runs(BenchId::BootFtrace) && !all.named);
        assert!(!all.runs(BenchId::QemuAttach) && !all.runs(BenchId::QemuDrain));
        for id in [
            BenchId::CallDirect,
            BenchId::AttachDirect,
            BenchId::SitesDirect,
            BenchId::EventsCost,
        ] {
            assert!(all.runs(id));
        }
        assert!(Selection::default_set(false, 3).runs(BenchId::BootFtrace));
        assert_eq!(
            ids(&["qemu"]),
            Ok(vec![BenchId::QemuAttach, BenchId::QemuDrain])
        );
        assert_eq!(
            Selection::default_set(true, 0).ids,
            [BenchId::CallExitless, BenchId::CallGraph]
        );
    }

    #[test]
    fn benches_are_in_their_ids_order() {
        for (i, b) in BENCHES.iter().enumerate() {
            assert_eq!(b.id as usize, i, "{}", b.name);
        }
    }

    #[test]
    fn every_bench_is_listed_with_its_goal_and_needs() {
        let all: Vec<BenchId> = BENCHES.iter().map(|b| b.id).collect();
        let l = list(&all);
        for b in &BENCHES {
            assert!(l.contains(&format!("\n  {}", b.name)), "{l}");
            assert!(l.contains(b.goal), "{l}");
        }
        assert_eq!(l.matches("      needs:  ").count(), BENCHES.len());
        // Names are unique, and every bench is in a listed collection.
        for b in &BENCHES {
            assert_eq!(BENCHES.iter().filter(|x| x.name == b.name).count(), 1);
            assert!(COLLECTIONS.iter().any(|(c, _)| *c == b.collection()));
        }
        // Some: only theirs, under their collections.
        let l = list(&[BenchId::CallGraph, BenchId::ReportRender]);
        assert_eq!(l.matches("      needs:  ").count(), 2, "{l}");
        assert!(l.contains("\ncall: ") && l.contains("\nreport: "), "{l}");
        assert!(!l.contains("\nattach: ") && !l.contains("call/trap"), "{l}");
    }
}
