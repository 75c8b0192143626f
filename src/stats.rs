//! Summaries of measured samples (pause times, bench figures), and what
//! `--stats` prints at the end of a run.

use std::cmp::Ordering;
use std::io::Write;

use vmm::RunReport;

/// A sample value with a total order: floats sort by `total_cmp`, so a NaN
/// cannot make the sort (and the percentile) depend on the input order.
pub trait Sample: Copy {
    fn order(&self, other: &Self) -> Ordering;
}

impl Sample for u64 {
    fn order(&self, other: &Self) -> Ordering {
        self.cmp(other)
    }
}

impl Sample for f64 {
    fn order(&self, other: &Self) -> Ordering {
        self.total_cmp(other)
    }
}

/// The p-th percentile (nearest rank, p in 0..=100) of `v`, in any order;
/// `None` for no samples.
pub fn percentile<T: Sample>(v: &[T], p: f64) -> Option<T> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_unstable_by(T::order);
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    Some(s[rank.clamp(1, s.len()) - 1])
}

/// `--stats`: exits per vCPU and kind, assists, where each vCPU stopped
/// (`function` names it), pauses.
pub fn print_stats(report: &RunReport, function: &dyn Fn(u64) -> Option<String>) {
    use vmm::exit::ExitKind;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "exits per vCPU:");
    let _ = write!(err, "  {:<18}", "kind");
    for cpu in 0..report.vcpus.len() {
        let _ = write!(err, " {:>12}", format!("cpu{cpu}"));
    }
    let _ = writeln!(err);
    for kind in ExitKind::ALL {
        if report.vcpus.iter().all(|v| v.get(kind) == 0) {
            continue;
        }
        let _ = write!(err, "  {:<18}", kind.name());
        for v in &report.vcpus {
            let _ = write!(err, " {:>12}", v.get(kind));
        }
        let _ = writeln!(err);
    }
    for (cpu, v) in report.vcpus.iter().enumerate() {
        for (insn, n) in &v.assists {
            let _ = writeln!(err, "  cpu{cpu}: emulation assist `{insn}` x{n}");
        }
    }
    for (cpu, r) in report.last_regs.iter().enumerate() {
        match r {
            Some(s) => {
                let _ = writeln!(
                    err,
                    "  cpu{cpu} stopped at rip {:#x}{} (cs {:#x} base {:#x}), rsp {:#x}, cr0 {:#x}, cr3 {:#x}",
                    s.regs.rip,
                    function(s.regs.rip).map(|f| format!(" in {f}")).unwrap_or_default(),
                    s.sregs.cs.selector, s.sregs.cs.base, s.regs.rsp, s.sregs.cr0, s.sregs.cr3
                );
            }
            None => {
                let _ = writeln!(err, "  cpu{cpu} had already stopped");
            }
        }
    }
    print_kvm_counts(&mut err, report);
    let p = &report.pause;
    if !p.latency_ns.is_empty() {
        let _ = writeln!(
            err,
            "pauses: {}, latency p50 {} us, window p50 {} us",
            p.latency_ns.len(),
            percentile(&p.latency_ns, 50.0).unwrap_or(0) / 1000,
            percentile(&p.window_ns, 50.0).unwrap_or(0) / 1000
        );
    }
}

/// The `--stats` row of the instructions KVM emulated (`bench` reads its
/// last column, the total).
pub const STATS_INSTRUCTIONS_ROW: &str = "instructions emulated";
/// The `--stats` line of the run's time (`bench` reads it).
pub const STATS_RUN_LINE: &str = "run:";

/// `--stats`: KVM's own per-vCPU counts (KVM_GET_STATS_FD), and the run's
/// time.
fn print_kvm_counts(err: &mut impl Write, report: &RunReport) {
    let counts = &report.kvm;
    let rows: [(&str, Vec<Option<u64>>); 2] = [
        (
            STATS_INSTRUCTIONS_ROW,
            counts.iter().map(|c| c.insn_emulation).collect(),
        ),
        (
            "exits (all kinds)",
            counts.iter().map(|c| c.exits).collect(),
        ),
    ];
    if rows.iter().all(|(_, v)| v.iter().all(Option::is_none)) {
        let why = report
            .kvm_error
            .clone()
            .unwrap_or_else(|| "this KVM has no binary statistics (KVM_GET_STATS_FD)".to_string());
        let _ = writeln!(err, "KVM's own counts: not available ({why})");
    } else {
        let _ = writeln!(err, "KVM's own counts per vCPU (its binary statistics):");
        let _ = write!(err, "  {:<21}", "");
        for cpu in 0..counts.len() {
            let _ = write!(err, " {:>12}", format!("cpu{cpu}"));
        }
        let _ = writeln!(err, " {:>13}", "total");
        for (what, v) in &rows {
            let _ = write!(err, "  {what:<21}");
            for n in v {
                let _ = write!(err, " {:>12}", n.map_or("-".to_string(), |n| n.to_string()));
            }
            let total = v
                .iter()
                .copied()
                .sum::<Option<u64>>()
                .map_or("-".to_string(), |n| n.to_string());
            let _ = writeln!(err, " {total:>13}");
        }
        let _ = writeln!(
            err,
            "  (instructions emulated: counted by KVM's instruction emulator, its insn_emulation; \
             every guest kernel instruction only where KVM emulates guest ring 0 ({}), near 0 \
             on hardware-virtualized KVM)",
            if vmm::host::emulates_ring0() {
                "it does here: kvm_pvm"
            } else {
                "not here, it seems: no kvm_pvm"
            }
        );
    }
    let _ = writeln!(
        err,
        "{STATS_RUN_LINE} {:.3} s from the vCPUs' start to their stop",
        report.elapsed.as_secs_f64()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<u64> = (1..=10).rev().collect();
        assert_eq!(percentile(&v, 50.0), Some(5));
        assert_eq!(percentile(&v, 99.0), Some(10));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&v, 100.0), Some(10));
        assert_eq!(percentile::<u64>(&[], 50.0), None);
        assert_eq!(percentile(&[2.5, f64::NAN, 1.5], 50.0), Some(2.5));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
    }
}
