//! Figure (k), `vmtrace attach` on a QEMU guest: its goal, its lines of the
//! table, its `k_` figures in the JSON, its method.

use std::fmt::{self, Write as _};

use super::super::measure::{QemuFigures, K_CALLS, K_GLOBS, K_TRAP_CALLS};
use super::super::median;
use super::Goal;

/// Goal: the attach of about a hundred sites stops the guest at most this
/// long (TCG, where every write through the gdbstub is a round trip).
pub const GOAL_PAUSE_100_US: f64 = 20_000.0;

/// The `k_` figures, in the order printed.
pub fn figures(r: &QemuFigures) -> Vec<(String, f64)> {
    let mut v = Vec::new();
    for (i, p) in r.pause_us.iter().enumerate() {
        let sites = r.sites.get(i).copied().unwrap_or(0);
        v.push((format!("k_attach_{sites}_sites_p50_us"), median(p)));
    }
    v.push(("k_burst_attach_p50_us".into(), median(&r.burst_pause_us)));
    v.push(("k_untraced_ns_per_call".into(), median(&r.untraced_ns)));
    v.push(("k_exitless_ns_per_call".into(), median(&r.exitless_ns)));
    v.push(("k_stored_events_per_s".into(), median(&r.stored_per_s)));
    v.push(("k_stored_share".into(), median(&r.stored_share)));
    v.push(("k_trap_ns_per_call".into(), median(&r.trap_ns)));
    v.push((
        "k_trap_untraced_ns_per_call".into(),
        median(&r.trap_untraced_ns),
    ));
    v.push((
        "k_trap_direct_ns_per_call".into(),
        median(&r.trap_direct_ns),
    ));
    v.push(("k_trap_graph_ns_per_call".into(), median(&r.trap_graph_ns)));
    v
}

fn goal_name() -> String {
    format!(
        "QEMU attach pause for ~100 sites <= {} ms",
        GOAL_PAUSE_100_US / 1e3
    )
}

pub fn goal(r: &QemuFigures) -> Goal {
    let p = r.pause_us.get(1).map_or(f64::NAN, |p| median(p));
    Goal {
        name: goal_name(),
        measured: format!(
            "{:.1} ms for {} sites (median of {} attaches)",
            p / 1e3,
            r.sites.get(1).copied().unwrap_or(0),
            r.pause_us.get(1).map_or(0, Vec::len)
        ),
        pass: Ok(p <= GOAL_PAUSE_100_US),
    }
}

/// (k): the pauses and the cost per call.
pub fn write(o: &mut String, r: &QemuFigures) -> fmt::Result {
    writeln!(o, "(k) vmtrace attach on {}", r.qemu)?;
    for (i, p) in r.pause_us.iter().enumerate() {
        writeln!(
            o,
            "    attach pause, {} sites (--trace '{}'): {:.1} ms (median of {})",
            r.sites.get(i).copied().unwrap_or(0),
            K_GLOBS[i],
            median(p) / 1e3,
            p.len()
        )?;
    }
    writeln!(
        o,
        "    attach pause of the bursts' attach, 1 site (on {}): {:.1} ms (median of {})",
        r.burst_guest,
        median(&r.burst_pause_us) / 1e3,
        r.burst_pause_us.len()
    )?;
    let (u, e) = (median(&r.untraced_ns), median(&r.exitless_ns));
    writeln!(
        o,
        "    getpid x {K_CALLS} (on {}): {u:.0} ns per call untraced, {e:.0} ns exitless \
         (+{:.0} ns)",
        r.burst_guest,
        e - u
    )?;
    writeln!(
        o,
        "    events stored: {:.0}/s of the bursts, {:.0}% of the calls (the rest counted)",
        median(&r.stored_per_s),
        100.0 * median(&r.stored_share)
    )?;
    writeln!(
        o,
        "    getpid x {K_TRAP_CALLS} in trap mode (gdbstub breakpoints): {:.0} µs per call \
         ({:.0} ns untraced)",
        median(&r.trap_ns) / 1e3,
        median(&r.trap_untraced_ns)
    )?;
    writeln!(
        o,
        "    ... with direct entries (a hit and a step): {:.0} µs per call; with the function \
         graph (an entry and a return): {:.0} µs per call",
        median(&r.trap_direct_ns) / 1e3,
        median(&r.trap_graph_ns) / 1e3
    )
}

pub fn method() -> String {
    format!(
        "the Linux guest beside the vmlinux in QEMU (TCG, 2 vCPUs) with the workload initramfs; \
         per round: an exitless attach and detach for each of {K_GLOBS:?} (the report's pause \
         window), then `go getpid {K_CALLS}` untraced and traced exitless, the session's trace \
         loop running (host time from the command to its done line), on Debian's 6.12 cloud \
         kernel in a second QEMU where guest/out/debian-6.12 holds it (its ACPI PCI hot-plug \
         takes the ring device: rings sized by the default --buffer, 64 MiB, the device plugged \
         and filled before the attach's pause, which is timed too), else on the \
         same guest; then `go getpid {K_TRAP_CALLS}` untraced and in trap mode (a gdbstub \
         breakpoint per site: each call stops the guest), then in trap mode with a direct entry \
         (the vCPU stepped over the first instruction) and with the function graph (a \
         breakpoint at the return address). TCG runs guest code far from KVM's \
         speed: the pause is the gdbstub's round trips, which a QEMU/KVM guest pays alike; the \
         per-call cost is TCG's"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures_of_three_rounds() -> QemuFigures {
        QemuFigures {
            qemu: "QEMU 7.2.22, pid 1, tcg, QMP /q".into(),
            burst_guest: "guest/out/debian-6.12/vmlinuz".into(),
            sites: vec![1, 102],
            pause_us: vec![
                vec![1000.0, 1200.0, 1400.0],
                vec![10_000.0, 11_000.0, 12_000.0],
            ],
            untraced_ns: vec![400.0, 410.0, 420.0],
            exitless_ns: vec![500.0, 520.0, 540.0],
            stored_per_s: vec![1e5, 2e5, 3e5],
            stored_share: vec![0.1, 0.2, 0.3],
            burst_pause_us: vec![1500.0, 1600.0, 1700.0],
            trap_ns: vec![700_000.0, 800_000.0, 900_000.0],
            trap_untraced_ns: vec![900.0, 1000.0, 1100.0],
            trap_direct_ns: vec![1_400_000.0, 1_500_000.0, 1_600_000.0],
            trap_graph_ns: vec![1_500_000.0, 1_600_000.0, 1_700_000.0],
        }
    }

    #[test]
    fn figures_table_and_goal_of_k() {
        let r = figures_of_three_rounds();
        let f = figures(&r);
        assert_eq!(f[0], ("k_attach_1_sites_p50_us".into(), 1200.0));
        assert_eq!(f[1], ("k_attach_102_sites_p50_us".into(), 11_000.0));
        assert_eq!(f[2], ("k_burst_attach_p50_us".into(), 1600.0));
        assert_eq!(f[4], ("k_exitless_ns_per_call".into(), 520.0));
        assert!(f.contains(&("k_trap_direct_ns_per_call".into(), 1_500_000.0)));
        assert!(f.contains(&("k_trap_graph_ns_per_call".into(), 1_600_000.0)));
        let mut o = String::new();
        write(&mut o, &r).unwrap();
        assert!(
            o.contains("with direct entries (a hit and a step): 1500 µs per call; with the function graph (an entry and a return): 1600 µs per call"),
            "{o}"
        );
        assert!(
            o.contains("attach pause, 102 sites (--trace 'hrtimer_*,tick_*'): 11.0 ms"),
            "{o}"
        );
        assert!(
            o.contains("attach pause of the bursts' attach, 1 site (on guest/out/debian-6.12/vmlinuz): 1.6 ms"),
            "{o}"
        );
        assert!(
            o.contains("410 ns per call untraced, 520 ns exitless (+110 ns)"),
            "{o}"
        );
        assert!(
            o.contains("trap mode (gdbstub breakpoints): 800 µs per call (1000 ns"),
            "{o}"
        );
        let g = goal(&r);
        assert_eq!(g.pass, Ok(true));
        assert!(
            g.measured.starts_with("11.0 ms for 102 sites"),
            "{}",
            g.measured
        );
    }
}
