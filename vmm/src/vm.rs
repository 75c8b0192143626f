//! Creating the VM: KVM, guest memory, the in-kernel interrupt controllers,
//! devices, the kernel, and every vCPU in its entry state.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvm_bindings::{
    kvm_pit_config, kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::advice::{Advice, Input, Plain, Words};
use crate::boot::{self, BootPlan, Protocol};
use crate::devices::{Console, Devices};
use crate::exit::VcpuStats;
use crate::kvm_stats::{KvmStats, KvmStatsError, VcpuKvmStats};
use crate::layout;
use crate::pause::PauseControl;
use crate::run::{Running, Shared};
use crate::stop::StopReason;
use crate::trap::TrapHandler;
use crate::vcpu::VcpuThread;

pub use crate::layout::MAX_CPUS;

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("{}", self.say(&Plain))]
    Cpus(u64),
    #[error("{}", self.say(&Plain))]
    Mem(u64),
    #[error("cannot open /dev/kvm: {0}; vmtrace needs read/write access to /dev/kvm (is KVM enabled, are you in the kvm group?)")]
    Kvm(kvm_ioctls::Error),
    #[error("KVM_{what} failed: {source}")]
    Ioctl {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("cannot allocate {mib} MiB of guest memory: {source}")]
    Memory {
        mib: u64,
        source: vm_memory::mmap::FromRangesError,
    },
    #[error("cannot create an eventfd: {0}")]
    EventFd(std::io::Error),
    #[error("{}", self.say(&Plain))]
    Boot(#[from] boot::BootError),
    #[error(transparent)]
    Regs(#[from] boot::regs::RegsError),
    #[error(transparent)]
    Cpuid(#[from] boot::cpuid::CpuidError),
    #[error("cannot open KVM's statistics: {0}")]
    Stats(#[from] KvmStatsError),
    #[error("cannot start the thread of vCPU {cpu}: {source}")]
    Thread { cpu: usize, source: std::io::Error },
    #[error("cannot install the {what} signal handler: {source}")]
    Signal {
        what: &'static str,
        source: std::io::Error,
    },
}

/// The messages that name inputs (`crate::advice`).
impl Advice for VmError {
    fn problem(&self, w: &dyn Words) -> String {
        match self {
            VmError::Cpus(n) => format!(
                "{} {n} is out of range; use 1 to {MAX_CPUS}",
                w.input(Input::Cpus)
            ),
            VmError::Mem(n) => format!(
                "{} {n} MiB is out of range; use {} to {} MiB",
                w.input(Input::Mem),
                layout::MIN_MEM_MIB,
                layout::MAX_MEM_MIB
            ),
            VmError::Boot(e) => e.problem(w),
            e => e.to_string(),
        }
    }
}

/// How many vCPUs and how much memory, checked once (`VmSize::new`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmSize {
    cpus: u64,
    mem_mib: u64,
}

impl VmSize {
    pub fn new(cpus: u64, mem_mib: u64) -> Result<VmSize, VmError> {
        Ok(VmSize {
            cpus: VmSize::check_cpus(cpus)?,
            mem_mib: VmSize::check_mem(mem_mib)?,
        })
    }

    /// 1 to `MAX_CPUS` vCPUs.
    pub fn check_cpus(cpus: u64) -> Result<u64, VmError> {
        if cpus == 0 || cpus > u64::from(MAX_CPUS) {
            return Err(VmError::Cpus(cpus));
        }
        Ok(cpus)
    }

    /// `MIN_MEM_MIB` to `MAX_MEM_MIB` MiB.
    pub fn check_mem(mem_mib: u64) -> Result<u64, VmError> {
        if !(layout::MIN_MEM_MIB..=layout::MAX_MEM_MIB).contains(&mem_mib) {
            return Err(VmError::Mem(mem_mib));
        }
        Ok(mem_mib)
    }

    pub fn cpus(self) -> u64 {
        self.cpus
    }

    pub fn mem_mib(self) -> u64 {
        self.mem_mib
    }
}

/// What to boot and how.
pub struct VmConfig {
    /// The kernel, opened and checked once (by whoever planned the run).
    pub kernel: boot::KernelFile,
    pub initrd: Option<PathBuf>,
    pub size: VmSize,
    pub cmdline: String,
    pub console: Box<dyn Write + Send>,
    pub timeout: Option<Duration>,
    /// Offer the guest no KVM feature that needs `vmcall` (see boot::cpuid).
    pub hide_hypercalls: bool,
}

/// A VM ready to run.
pub struct Vm {
    // Kept open for the VM's lifetime.
    _kvm: Kvm,
    _fd: VmFd,
    mem: GuestMemoryMmap,
    vcpus: Vec<VcpuFd>,
    /// KVM's own counters of each vCPU, opened with it.
    kvm_stats: KvmStats,
    devices: Devices,
    plan: BootPlan,
    timeout: Option<Duration>,
}

fn ioctl(what: &'static str) -> impl Fn(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Ioctl { what, source }
}

/// Guest RAM from 0 and the private region past it, each registered with
/// KVM as a memory slot.
fn guest_memory(fd: &VmFd, mem_mib: u64) -> Result<GuestMemoryMmap, VmError> {
    let mem = GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), (mem_mib << 20) as usize),
        (
            GuestAddress(layout::PRIVATE_START),
            layout::PRIVATE_SIZE as usize,
        ),
    ])
    .map_err(|source| VmError::Memory {
        mib: mem_mib,
        source,
    })?;
    for (slot, region) in mem.iter().enumerate() {
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
            flags: 0,
        };
        // SAFETY: the region is a live mmap owned by `mem`, which outlives
        // the VM fd (both live in `Vm`, and then in `Shared`, until the end).
        unsafe { fd.set_user_memory_region(r) }.map_err(ioctl("SET_USER_MEMORY_REGION"))?;
    }
    Ok(mem)
}

/// A vCPU's registers at the start, by the boot protocol.
fn entry_state(vcpu: &VcpuFd, cpu: usize, ncpus: usize, plan: &BootPlan) -> Result<(), VmError> {
    match plan.protocol {
        Protocol::Linux { zero_page } => {
            // Only the boot CPU starts here; the kernel wakes the others.
            if cpu == 0 {
                boot::regs::setup_sregs(vcpu, cpu)?;
                boot::regs::setup_regs(vcpu, cpu, plan.entry, [0, zero_page, 0])?;
            }
        }
        Protocol::Direct => {
            boot::regs::setup_sregs(vcpu, cpu)?;
            boot::regs::setup_regs(
                vcpu,
                cpu,
                plan.entry,
                [cpu as u64, layout::CMDLINE_START, ncpus as u64],
            )?;
            let runnable = kvm_bindings::kvm_mp_state {
                mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE,
            };
            vcpu.set_mp_state(runnable).map_err(ioctl("SET_MP_STATE"))?;
        }
    }
    Ok(())
}

impl Vm {
    /// Validate the configuration, then build the whole machine.
    pub fn create(cfg: VmConfig) -> Result<Vm, VmError> {
        let VmSize { cpus, mem_mib } = cfg.size;
        let ncpus = cpus as usize;
        let kvm = Kvm::new().map_err(VmError::Kvm)?;
        let fd = kvm.create_vm().map_err(ioctl("CREATE_VM"))?;
        let mem_size = mem_mib << 20;
        let mem = guest_memory(&fd, mem_mib)?;
        fd.set_tss_address(layout::KVM_TSS_ADDR as usize)
            .map_err(ioctl("SET_TSS_ADDR"))?;
        fd.create_irq_chip().map_err(ioctl("CREATE_IRQCHIP"))?;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        fd.create_pit2(pit).map_err(ioctl("CREATE_PIT2"))?;
        let serial_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(VmError::EventFd)?;
        fd.register_irqfd(&serial_irq, layout::SERIAL_IRQ)
            .map_err(ioctl("IRQFD"))?;
        let devices = Devices::new(serial_irq, Console::new(cfg.console));

        let plan = boot::load_kernel(
            &mem,
            &cfg.kernel,
            cfg.initrd.as_deref(),
            &cfg.cmdline,
            mem_size,
            cpus as u8,
        )?;
        let supported = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(ioctl("GET_SUPPORTED_CPUID"))?;
        let mut vcpus = Vec::with_capacity(ncpus);
        let mut kvm_stats = Vec::with_capacity(ncpus);
        for cpu in 0..ncpus {
            let vcpu = fd.create_vcpu(cpu as u64).map_err(ioctl("CREATE_VCPU"))?;
            // Now, while this thread holds the vCPU fd (see kvm_stats).
            kvm_stats.push(VcpuKvmStats::open(&kvm, &vcpu, cpu)?);
            boot::cpuid::setup_cpuid(&vcpu, cpu, ncpus, &supported, cfg.hide_hypercalls)?;
            boot::regs::setup_msrs(&vcpu, cpu)?;
            boot::regs::setup_fpu(&vcpu, cpu)?;
            boot::regs::setup_lint(&vcpu, cpu)?;
            entry_state(&vcpu, cpu, ncpus, &plan)?;
            vcpus.push(vcpu);
        }
        Ok(Vm {
            _kvm: kvm,
            _fd: fd,
            mem,
            vcpus,
            kvm_stats: KvmStats::new(kvm_stats),
            devices,
            plan,
            timeout: cfg.timeout,
        })
    }

    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    pub fn boot_plan(&self) -> BootPlan {
        self.plan
    }

    pub fn cpus(&self) -> usize {
        self.vcpus.len()
    }

    /// KVM's own counters of the vCPUs (see kvm_stats).
    pub fn kvm_stats(&self) -> KvmStats {
        self.kvm_stats.clone()
    }

    /// Start one thread per vCPU, each with its trap handler. With
    /// `start_paused` they park before the first guest instruction, so the
    /// caller's first `pause_all` sees the guest untouched.
    pub fn start(
        self,
        handlers: Vec<Box<dyn TrapHandler>>,
        start_paused: bool,
    ) -> Result<Running, VmError> {
        assert_eq!(
            handlers.len(),
            self.vcpus.len(),
            "one trap handler per vCPU"
        );
        let ncpus = self.vcpus.len();
        let signal = |what| move |source| VmError::Signal { what, source };
        crate::run::install_terminate_handlers().map_err(signal("SIGINT/SIGTERM/SIGHUP"))?;
        let pause = PauseControl::new(ncpus, start_paused).map_err(signal("vCPU kick"))?;
        let shared = Arc::new(Shared::new(self.mem, self.devices, pause));
        let mut threads = Vec::with_capacity(ncpus);
        for (cpu, (fd, handler)) in self.vcpus.into_iter().zip(handlers).enumerate() {
            let t = VcpuThread {
                cpu,
                fd,
                shared: Arc::clone(&shared),
                handler,
                stats: VcpuStats::default(),
            };
            let spawned = std::thread::Builder::new()
                .name(format!("vcpu{cpu}"))
                .spawn(move || t.run());
            match spawned {
                Ok(handle) => threads.push(handle),
                Err(source) => {
                    // Do not leave the vCPUs already started running.
                    shared.stop(StopReason::Requested);
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(VmError::Thread { cpu, source });
                }
            }
        }
        let started = Instant::now();
        Ok(Running {
            shared,
            threads,
            started,
            deadline: self.timeout.map(|t| started + t),
            timeout: self.timeout,
            kvm_stats: self.kvm_stats,
            _vm: (self._kvm, self._fd),
        })
    }
}
