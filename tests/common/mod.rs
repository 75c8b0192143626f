//! Shared by the integration tests: the workspace, the guests, the binary.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, Once};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// guest/out/mini.elf, built once per test binary.
pub fn mini_elf() -> PathBuf {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        let st = Command::new("bash")
            .arg(root().join("guest/build.sh"))
            .arg("mini")
            .status()
            .expect("run guest/build.sh mini");
        assert!(st.success(), "guest/build.sh mini failed");
    });
    root().join("guest/out/mini.elf")
}

/// Run the vmtrace binary.
pub fn vmtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(args)
        .output()
        .expect("run vmtrace")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The workload functions in the order the mini guest prints them.
pub const MINI_FUNCS: [&str; 8] = [
    "do_idle",
    "schedule",
    "hrtimer_start_range_ns",
    "hrtimer_try_to_cancel",
    "hrtimer_interrupt",
    "__hrtimer_run_queues",
    "hrtimer_wakeup",
    "tick_sched_timer",
];

/// What the mini guest's workload arithmetic says each CPU calls in N iterations.
pub fn mini_expected(func: &str, iters: u64) -> u64 {
    match func {
        "hrtimer_try_to_cancel" => iters.div_ceil(2),
        _ => iters,
    }
}

/// (cpu, function) -> count, from `mini: cpu C FUNC N` lines; plus the CPUs that said `done`.
pub fn parse_mini_console(text: &str) -> (BTreeMap<(u32, String), u64>, Vec<u32>) {
    let mut counts = BTreeMap::new();
    let mut done = Vec::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["mini:", "cpu", c, "done"] => done.push(c.parse().unwrap()),
            ["mini:", "cpu", c, f, n] => {
                counts.insert((c.parse().unwrap(), f.to_string()), n.parse().unwrap());
            }
            _ => {}
        }
    }
    done.sort_unstable();
    (counts, done)
}

/// A console sink the tests can read.
#[derive(Clone, Default)]
pub struct Capture(pub Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// The address of a symbol in an ELF file.
pub fn elf_symbol(path: &Path, name: &str) -> u64 {
    let data = std::fs::read(path).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    use object::{Object, ObjectSymbol};
    obj.symbols()
        .find(|s| s.name() == Ok(name))
        .map(|s| s.address())
        .unwrap_or_else(|| panic!("no symbol {name}"))
}

/// A VM configuration for the mini guest with its console captured.
pub fn mini_config(kernel: &Path, cpus: u64, cmdline: &str, console: &Capture) -> vmm::VmConfig {
    vmm::VmConfig {
        kernel: kernel.to_owned(),
        kind: vmm::boot::KernelKind::Elf,
        initrd: None,
        cpus,
        mem_mib: 64,
        cmdline: cmdline.into(),
        console: Box::new(console.clone()),
        timeout: Some(std::time::Duration::from_secs(300)),
        hide_hypercalls: false,
    }
}

/// One do-nothing trap handler per vCPU, for runs without a tracer.
pub fn no_tracers(cpus: usize) -> Vec<Box<dyn vmm::TrapHandler>> {
    (0..cpus)
        .map(|_| Box::new(vmm::NoTracer) as Box<dyn vmm::TrapHandler>)
        .collect()
}
