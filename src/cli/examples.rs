//! The EXAMPLES ending each command's `--help`, as perf's and git's man
//! pages end theirs. tests/docs_examples.rs parses every line of them, as
//! it parses the README's and the docs' examples.

/// `vmtrace --help`: a run without a command.
pub const RUN: &str = "Examples:
  vmtrace --kernel guest/out/bzImage --trace 'hrtimer_*' --duration 20
  vmtrace --kernel guest/out/bzImage --trace 'update_process_times,scheduler_tick' --graph --tree --duration 20
  vmtrace --kernel guest/out/bzImage --trace 'schedule' --comm 'kworker/*' -o sched.data --duration 20
  vmtrace --kernel guest/out/mini.elf --cpus 2 --trace 'hrtimer_*' --format json

A run prints its report and saves nothing unless -o FILE is given; `vmtrace record` saves vmtrace.data.";

/// `vmtrace record --help`.
pub const RECORD: &str = "Examples:
  vmtrace record --kernel guest/out/bzImage --cpus 2 --trace 'hrtimer_*' --duration 30
  vmtrace record --kernel guest/out/bzImage --trace 'schedule,kernel_clone' --graph -o boot.data --duration 30
  vmtrace report            # then: the report of vmtrace.data";

/// `vmtrace list --help`.
pub const LIST: &str = "Examples:
  vmtrace list 'hrtimer_*' --kernel guest/out/bzImage
  vmtrace list --entry direct 'sched_clock*' --kernel guest/out/bzImage
  vmtrace list -e 'sched:*' --kernel guest/out/bzImage";

/// `vmtrace attach --help`.
pub const ATTACH: &str = "Examples:
  sudo vmtrace vms          # the VMs on this host, each with its attach command
  sudo vmtrace attach --domain web1 --kernel /boot/vmlinuz-of-the-guest --trace '__x64_sys_*' --duration 30
  sudo vmtrace attach --qmp /tmp/vm/qmp.sock --kernel guest/out/bzImage --trace 'hrtimer_*' --graph --duration 10

Needs root, or QEMU's user with access to its QMP socket, its gdbstub's directory and /proc/PID/mem.";

/// `vmtrace detach --help`.
pub const DETACH: &str = "Examples:
  sudo vmtrace detach --qmp /tmp/vm/qmp.sock
  sudo vmtrace detach --domain web1";

/// `vmtrace vms --help`.
pub const VMS: &str = "Examples:
  sudo vmtrace vms
  sudo vmtrace vms --format json";

/// `vmtrace bench --help`.
pub const BENCH: &str = "Examples:
  vmtrace bench list
  vmtrace bench call/exitless
  vmtrace bench --markdown docs/benchmarks.md";
