//! `vmtrace bench`, checked: the benches named, the mini guest (built if
//! missing) if they need it, the Linux vmlinux of attach/scaling, the Linux
//! guest of boot/ftrace, the counts, and a writable `--json FILE` and
//! `--markdown FILE`.

use std::path::PathBuf;
use std::process::Command;

use super::{at_least_one, check_cpus};
use crate::bench::measure::LinuxGuest;
use crate::bench::suite::{self, BenchId, Needs, Selection};
use crate::cli::BenchArgs;
use crate::error::InputError;

/// A bench run, checked.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The benches to run.
    pub benches: Selection,
    /// The mini guest; None: no bench run needs it.
    pub kernel: Option<PathBuf>,
    /// The Linux vmlinux of (e) and the loading figure; None: skipped.
    pub vmlinux: Option<PathBuf>,
    /// call/direct's mini guest without ftrace; None: not run.
    pub mini_noftrace: Option<PathBuf>,
    /// attach/direct's vmlinux: linux-noftrace/vmlinux beside the vmlinux
    /// if there is one, else the vmlinux itself (direct entries on a
    /// kernel with ftrace); None: no vmlinux.
    pub direct_vmlinux: Option<PathBuf>,
    /// sites/direct's distro kernel (`--distro-kernel`); None: not given.
    pub distro_kernel: Option<PathBuf>,
    pub json: Option<PathBuf>,
    /// `--markdown FILE`: the figures table.
    pub markdown: Option<PathBuf>,
    pub iters: u64,
    pub cpus: u64,
    pub rounds: usize,
    pub cycles: usize,
    pub report_events: u64,
    /// Events streamed to a data file for (h).
    pub record_events: u64,
    /// Events qemu/drain drains to a data file, per memory.
    pub drain_events: u64,
    /// Boots per configuration for (i) (0: skipped), and the Linux guest.
    pub linux_boots: usize,
    pub linux: Option<LinuxGuest>,
    /// `--counts-only`: call/exitless, call/graph (and boot/ftrace) alone.
    pub counts_only: bool,
}

impl BenchConfig {
    pub fn check(args: &BenchArgs) -> Result<BenchConfig, InputError> {
        let iters = at_least_one(args.iters, "--iters")?;
        let cpus = check_cpus(args.cpus)?;
        let rounds = at_least_one(args.rounds, "--rounds")?;
        let cycles = at_least_one(args.cycles, "--cycles")?;
        let report_events = at_least_one(args.report_events, "--report-events")?;
        let record_events = at_least_one(args.record_events, "--record-events")?;
        let drain_events = at_least_one(args.drain_events, "--drain-events")?;
        let benches = selection(args)?;
        let vmlinux = linux_vmlinux(args)?;
        let needing = suite::BENCHES
            .iter()
            .find(|b| benches.runs(b.id) && b.needs == Needs::Vmlinux);
        if let (true, Some(b), None) = (benches.named, needing, &vmlinux) {
            return Err(InputError::BenchNeedsVmlinux {
                bench: b.name,
                path: project_root().join("guest/out/vmlinux"),
            });
        }
        let kernel = match benches.needs(Needs::MiniGuest) {
            true => Some(mini_kernel(args)?),
            false => None,
        };
        let mini_noftrace = match benches.needs(Needs::MiniNoftrace) {
            true => Some(mini_noftrace()?),
            false => None,
        };
        let direct_vmlinux = vmlinux.as_ref().map(|v| {
            let noftrace = v.with_file_name("linux-noftrace").join("vmlinux");
            if noftrace.is_file() {
                noftrace
            } else {
                v.clone()
            }
        });
        let distro_kernel = match &args.distro_kernel {
            Some(p) if !p.is_file() => return Err(InputError::DistroKernelMissing(p.clone())),
            p => p.clone(),
        };
        let linux = match benches.runs(BenchId::BootFtrace) {
            true => Some(linux_guest(vmlinux.as_deref())?),
            false => None,
        };
        check_outputs(args)?;
        Ok(BenchConfig {
            benches,
            kernel,
            vmlinux,
            mini_noftrace,
            direct_vmlinux,
            distro_kernel,
            json: args.json.clone(),
            markdown: args.markdown.clone(),
            iters,
            cpus,
            rounds,
            cycles,
            report_events,
            record_events,
            drain_events,
            linux_boots: args.linux_boots,
            linux,
            counts_only: args.counts_only,
        })
    }

    /// `vmtrace bench list [NAME...]` or `--list`: the benches to list
    /// rather than run (those the other names choose, or all); None: run.
    pub fn to_list(args: &BenchArgs) -> Result<Option<Vec<BenchId>>, InputError> {
        if !args.list && !args.names.iter().any(|n| n == "list") {
            return Ok(None);
        }
        let names: Vec<String> = args
            .names
            .iter()
            .filter(|n| !matches!(n.as_str(), "list" | "all"))
            .cloned()
            .collect();
        if names.is_empty() {
            return Ok(Some(suite::BENCHES.iter().map(|b| b.id).collect()));
        }
        let chosen = Selection::named(&names).map_err(|name| InputError::UnknownBench {
            name,
            names: suite::names(),
        })?;
        Ok(Some(chosen.ids))
    }
}

/// `--json FILE` and `--markdown FILE` by the output-file rules, now, not
/// after minutes of measuring (and without creating or truncating anything
/// yet); not both one file.
fn check_outputs(args: &BenchArgs) -> Result<(), InputError> {
    for (flag, path) in [("--json", &args.json), ("--markdown", &args.markdown)] {
        if let Some(path) = path {
            tracer::trace::output_path::check(path).map_err(|source| InputError::Output {
                flag,
                path: path.clone(),
                source,
            })?;
        }
    }
    let files: Vec<(String, &std::path::Path)> =
        [("--json", &args.json), ("--markdown", &args.markdown)]
            .into_iter()
            .filter_map(|(flag, p)| Some((flag.to_string(), p.as_deref()?)))
            .collect();
    super::output::distinct(&files)
}

/// The benches `args` names: the default set for no name or `all`, and
/// with `all` beside names (`all qemu`), the default set and those named
/// (qemu/* and boot/ftrace run only when named).
fn selection(args: &BenchArgs) -> Result<Selection, InputError> {
    chosen(&args.names, args.counts_only, args.linux_boots)
}

/// `selection` from the names alone.
fn chosen(all: &[String], counts_only: bool, linux_boots: usize) -> Result<Selection, InputError> {
    let names: Vec<String> = all
        .iter()
        .filter(|n| n.as_str() != "all")
        .cloned()
        .collect();
    let default = Selection::default_set(counts_only, linux_boots);
    if names.is_empty() {
        return Ok(default);
    }
    if counts_only {
        return Err(InputError::CountsOnlyNamed);
    }
    let mut benches = Selection::named(&names).map_err(|name| InputError::UnknownBench {
        name,
        names: suite::names(),
    })?;
    if names.len() < all.len() {
        benches = default.and(&benches);
    }
    if benches.runs(BenchId::BootFtrace) && linux_boots == 0 {
        return Err(InputError::BenchNeedsBoots);
    }
    Ok(benches)
}

/// boot/ftrace's guest: the bzImage and initramfs beside the vmlinux (by default
/// guest/out's, as `bash guest/build.sh linux` leaves them).
fn linux_guest(vmlinux: Option<&std::path::Path>) -> Result<LinuxGuest, InputError> {
    let vmlinux = match vmlinux {
        Some(v) => v.to_path_buf(),
        None => project_root().join("guest/out/vmlinux"),
    };
    let guest = LinuxGuest {
        kernel: vmlinux.with_file_name("bzImage"),
        initrd: vmlinux.with_file_name("initramfs.cpio.gz"),
        vmlinux,
    };
    for (what, path) in [
        ("vmlinux", &guest.vmlinux),
        ("kernel", &guest.kernel),
        ("initramfs", &guest.initrd),
    ] {
        if !path.is_file() {
            return Err(InputError::LinuxGuestMissing {
                what,
                path: path.clone(),
            });
        }
    }
    Ok(guest)
}

/// The directory holding `guest/`: the working directory if it has
/// guest/build.sh, else the source tree this binary was built from.
fn project_root() -> PathBuf {
    let cwd = PathBuf::from(".");
    if cwd.join("guest/build.sh").is_file() {
        return cwd;
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if src.join("guest/build.sh").is_file() {
        return src;
    }
    cwd
}

/// `--kernel`, else guest/out/mini.elf (built with guest/build.sh if missing).
fn mini_kernel(args: &BenchArgs) -> Result<PathBuf, InputError> {
    if let Some(k) = &args.kernel {
        if !k.is_file() {
            return Err(InputError::MiniMissing(k.clone()));
        }
        return Ok(k.clone());
    }
    built_guest("mini", |_| InputError::BuildFailed)
}

/// guest/out/NAME.elf, built with `guest/build.sh NAME` if missing;
/// `failed` words a build that did not make it.
fn built_guest(
    name: &str,
    failed: impl FnOnce(PathBuf) -> InputError,
) -> Result<PathBuf, InputError> {
    let root = project_root();
    let kernel = root.join(format!("guest/out/{name}.elf"));
    if !kernel.is_file() {
        note!(
            "vmtrace bench: {} is missing; building it",
            kernel.display()
        );
        let st = Command::new("bash")
            .arg(root.join("guest/build.sh"))
            .arg(name)
            .status()
            .map_err(InputError::BuildRun)?;
        if !st.success() || !kernel.is_file() {
            return Err(failed(kernel));
        }
    }
    Ok(kernel)
}

/// guest/out/mini-noftrace.elf, built with guest/build.sh if missing.
fn mini_noftrace() -> Result<PathBuf, InputError> {
    built_guest("mini-noftrace", InputError::NoftraceBuildFailed)
}

/// `--vmlinux`, else guest/out/vmlinux if present (attach/scaling's, and
/// beside it boot/ftrace's guest).
fn linux_vmlinux(args: &BenchArgs) -> Result<Option<PathBuf>, InputError> {
    match &args.vmlinux {
        Some(p) if p.is_file() => Ok(Some(p.clone())),
        Some(p) => Err(InputError::VmlinuxMissing(p.clone())),
        None => {
            let p = project_root().join("guest/out/vmlinux");
            Ok(p.is_file().then_some(p))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn all_beside_names_runs_the_default_set_and_those_named() {
        let default = Selection::default_set(false, 0);
        assert_eq!(chosen(&names(&["all"]), false, 0).unwrap(), default);
        let with_qemu = chosen(&names(&["all", "qemu"]), false, 0).unwrap();
        assert!(with_qemu.runs(BenchId::QemuAttach) && with_qemu.runs(BenchId::QemuDrain));
        assert!(default.ids.iter().all(|&id| with_qemu.runs(id)));
        assert_eq!(with_qemu.ids.len(), default.ids.len() + 2);
        // Shown as the default set is: every bench, those not run said so.
        assert!(!with_qemu.named);
        let alone = chosen(&names(&["qemu/drain"]), false, 0).unwrap();
        assert_eq!(alone.ids, [BenchId::QemuDrain]);
        assert!(matches!(
            chosen(&names(&["all", "boot/ftrace"]), false, 0),
            Err(InputError::BenchNeedsBoots)
        ));
    }
}
