//! Ring memory of vmtrace's own in a running QEMU: a file on the host,
//! shared with QEMU as a memory backend and shown to the guest as the BAR
//! of an `ivshmem-plain` device it has no driver for, hot-plugged for the
//! trace and unplugged at the detach. The guest's kernel assigns the BAR
//! (ACPI PCI hot-plug: `crate::kernel::pci_hotplug` says whether it
//! can), vmtrace maps it into the kernel's page tables as the rings, and
//! reads the rings from its own mapping of the file: a memory copy.
//!
//! QEMU's side: hw/misc/ivshmem.c (BAR 2 is the memory backend's region,
//! 64-bit, prefetchable), backends/hostmem-file.c (`share=on`: QEMU maps
//! the file MAP_SHARED). The BAR is mapped in the guest's address space
//! only once the guest enabled memory decoding, which `info mtree` shows.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};

use super::layout::parse_flat_ram;
use super::qmp::QmpError;
use super::queries::Queries;
use crate::kernel::high_rings::EfiTable;

/// How long the guest may take to assign the BAR (it takes well under a
/// second under TCG), and to eject the device at the end.
const ASSIGN_WAIT: Duration = Duration::from_secs(5);
const EJECT_WAIT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(50);
/// PCI class of a host bridge, and the bridges' device ids: QEMU's
/// i440FX (`pc`) and Q35's MCH.
const HOST_BRIDGE: u64 = 0x0600;
const I440FX: u64 = 0x1237;
const Q35_MCH: u64 = 0x29c0;
/// QEMU's `pcie-root-port` (vendor Red Hat 0x1b36, device 0x000c).
const ROOT_PORT: (u64, u64) = (0x1b36, 0x000c);

#[derive(Debug, thiserror::Error)]
pub enum IvshmemError {
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error("cannot create the ring file {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the QEMU is neither a pc nor a q35 machine (no i440FX or Q35 host bridge on PCI bus 0)"
    )]
    Machine,
    #[error("the q35 machine has no free PCIe root port with an id to plug a device into")]
    NoRootPort,
    #[error("QEMU refused {cmd}: {why}")]
    Refused { cmd: &'static str, why: String },
    #[error("the guest assigned no address to the device's memory within {0:?}")]
    NotAssigned(Duration),
    #[error(
        "the device's memory at {gpa:#x} is not the ring file alone in QEMU's memory map ({why})"
    )]
    Overlap { gpa: u64, why: String },
    #[error("the guest did not eject device {id} within {wait:?}: it stays, as does {path}")]
    NotEjected {
        id: String,
        wait: Duration,
        path: PathBuf,
    },
    #[error("cannot map the ring file {path}: {why}")]
    Map { path: PathBuf, why: String },
}

/// What an attach adds to the QEMU, named before it is added (the
/// journal keeps it, so that a repair can take it out).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedNames {
    /// The memory backend object's id.
    pub object: String,
    /// The ivshmem device's id.
    pub device: String,
    /// The file behind the backend.
    pub path: PathBuf,
    pub size: u64,
    /// Where the guest put its memory, once it did (journaled again then):
    /// a repair clears vmtrace's entries into it (the rings' 2 MiB entries,
    /// and its page tables there when the device holds the code).
    #[serde(default)]
    pub gpa: Option<u64>,
    /// The UEFI runtime services' page tables, whose entry 508 maps the
    /// rings too (a guest booted by UEFI): a repair clears it there too.
    #[serde(default)]
    pub efi: Option<EfiTable>,
}

impl SharedNames {
    /// Names for vmtrace `pid`'s attach to QEMU `qemu_pid`, `size` bytes.
    /// A process's later attaches get names of their own (`-N` after the
    /// pid): QEMU frees a removed device's memory block after the fact, and
    /// aborts (the whole VM gone) when a new one of the same name comes
    /// meanwhile ("RAMBlock ... already registered").
    pub fn new(pid: u32, qemu_pid: u32, size: u64) -> SharedNames {
        static ATTACHES: AtomicU32 = AtomicU32::new(0);
        let pid = match ATTACHES.fetch_add(1, Ordering::Relaxed) {
            0 => pid.to_string(),
            n => format!("{pid}-{n}"),
        };
        // tmpfs where there is one: the file is memory, never written back.
        let dir = Path::new("/dev/shm");
        let dir = match dir.is_dir() {
            true => dir.to_path_buf(),
            false => std::env::temp_dir(),
        };
        SharedNames {
            object: format!("vmtrace-rings-{pid}"),
            device: format!("vmtrace-ivshmem-{pid}"),
            path: dir.join(format!("vmtrace-rings-{qemu_pid}-{pid}")),
            size,
            gpa: None,
            efi: None,
        }
    }
}

/// The ring memory plugged in: where the guest sees it, and vmtrace's own
/// mapping of it at that guest-physical address.
pub struct SharedRings {
    pub names: SharedNames,
    pub gpa: u64,
    pub mem: GuestMemoryMmap,
}

impl std::fmt::Debug for SharedRings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedRings({:?} at {:#x})", self.names, self.gpa)
    }
}

/// Create the file, add the backend and the device, wait for the guest to
/// assign the BAR, check QEMU maps the file there, and map it. Whatever
/// fails after the file is made is taken out again (`unplug`).
pub fn plug(
    q: &mut (impl Queries + ?Sized),
    names: &SharedNames,
) -> Result<SharedRings, IvshmemError> {
    let bus = bus(q)?;
    let file = create(names)?;
    let added = add(q, names, bus.as_deref()).and_then(|()| assigned(q, names));
    let gpa = match added {
        Ok(gpa) => gpa,
        Err(e) => {
            let _ = unplug(q, names);
            return Err(e);
        }
    };
    let mapped = GuestMemoryMmap::from_ranges_with_files([(
        GuestAddress(gpa),
        names.size as usize,
        Some(FileOffset::new(file, 0)),
    )])
    .map_err(|e| IvshmemError::Map {
        path: names.path.clone(),
        why: e.to_string(),
    });
    match mapped {
        Ok(mem) => Ok(SharedRings {
            names: SharedNames {
                gpa: Some(gpa),
                ..names.clone()
            },
            gpa,
            mem,
        }),
        Err(e) => {
            let _ = unplug(q, names);
            Err(e)
        }
    }
}

/// The bus to plug into: none named on a `pc` machine (QEMU picks a free
/// slot of bus 0), a free root port's id on a q35 machine.
fn bus(q: &mut (impl Queries + ?Sized)) -> Result<Option<String>, IvshmemError> {
    let pci = q.execute("query-pci", None)?;
    let devices = bus0(&pci);
    let host = devices
        .iter()
        .find(|d| d["class_info"]["class"].as_u64() == Some(HOST_BRIDGE))
        .and_then(|d| d["id"]["device"].as_u64());
    match host {
        Some(I440FX) => Ok(None),
        Some(Q35_MCH) => free_root_port(devices).map(Some),
        _ => Err(IvshmemError::Machine),
    }
}

fn bus0(pci: &Value) -> Vec<Value> {
    pci.as_array()
        .and_then(|b| b.iter().find(|b| b["bus"].as_u64() == Some(0)))
        .and_then(|b| b["devices"].as_array())
        .cloned()
        .unwrap_or_default()
}

/// A root port with an id and nothing behind it.
fn free_root_port(devices: Vec<Value>) -> Result<String, IvshmemError> {
    devices
        .iter()
        .filter(|d| {
            (d["id"]["vendor"].as_u64(), d["id"]["device"].as_u64())
                == (Some(ROOT_PORT.0), Some(ROOT_PORT.1))
        })
        .filter(|d| {
            d["pci_bridge"]["devices"]
                .as_array()
                .is_none_or(|v| v.is_empty())
        })
        .filter_map(|d| d["qdev_id"].as_str().filter(|s| !s.is_empty()))
        .map(str::to_string)
        .next()
        .ok_or(IvshmemError::NoRootPort)
}

/// The file, `size` bytes of zeros, only vmtrace's (and QEMU's, when
/// QEMU runs as another user root hands it to).
fn create(names: &SharedNames) -> Result<File, IvshmemError> {
    let err = |source| IvshmemError::File {
        path: names.path.clone(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&names.path)
        .map_err(err)?;
    if let Err(e) = file.set_len(names.size) {
        let _ = std::fs::remove_file(&names.path);
        return Err(err(e));
    }
    Ok(file)
}

fn add(
    q: &mut (impl Queries + ?Sized),
    names: &SharedNames,
    bus: Option<&str>,
) -> Result<(), IvshmemError> {
    let object = json!({
        "qom-type": "memory-backend-file",
        "id": names.object,
        "mem-path": names.path,
        "size": names.size,
        "share": true,
    });
    refused(q.execute("object-add", Some(object)), "object-add")?;
    let mut device = json!({
        "driver": "ivshmem-plain",
        "id": names.device,
        "memdev": names.object,
    });
    if let Some(b) = bus {
        device["bus"] = json!(b);
    }
    refused(q.execute("device_add", Some(device)), "device_add")?;
    Ok(())
}

/// QEMU's refusal of `cmd`, said as such (not a broken monitor).
fn refused(r: Result<Value, QmpError>, cmd: &'static str) -> Result<Value, IvshmemError> {
    r.map_err(|e| match e {
        QmpError::Command { desc, .. } => IvshmemError::Refused { cmd, why: desc },
        e => e.into(),
    })
}

/// The device's BAR 2 once the guest assigned it and enabled it (QEMU
/// reports -1 until then), checked in QEMU's flat memory map.
fn assigned(q: &mut (impl Queries + ?Sized), names: &SharedNames) -> Result<u64, IvshmemError> {
    let start = Instant::now();
    let gpa = loop {
        let pci = q.execute("query-pci", None)?;
        if let Some(gpa) = bar2(&pci, &names.device) {
            break gpa;
        }
        if start.elapsed() > ASSIGN_WAIT {
            return Err(IvshmemError::NotAssigned(ASSIGN_WAIT));
        }
        std::thread::sleep(POLL);
    };
    let mtree = q.hmp("info mtree -f -o")?;
    only_ours(&mtree, gpa, names).map_err(|why| IvshmemError::Overlap { gpa, why })?;
    Ok(gpa)
}

/// BAR 2's address of device `id` anywhere in `query-pci`'s answer.
fn bar2(pci: &Value, id: &str) -> Option<u64> {
    bar2_of(find_device(pci, id)?)
}

/// BAR 2's address of a device of `query-pci`, once assigned.
fn bar2_of(dev: &Value) -> Option<u64> {
    let bar = dev["regions"]
        .as_array()?
        .iter()
        .find(|r| r["bar"].as_u64() == Some(2))?;
    // Unassigned: -1 (PCI_BAR_UNMAPPED), which is no u64 here; 0 too.
    bar["address"].as_u64().filter(|&a| a != 0 && a != u64::MAX)
}

/// How `SharedNames::new` begins a device's id: then vmtrace's pid (and
/// `-N` for its process's later attaches).
const DEVICE_PREFIX: &str = "vmtrace-ivshmem-";

/// The ids of the devices on any bus, bridges' buses included.
fn device_ids(pci: &Value) -> Vec<String> {
    fn walk(devices: &Value, out: &mut Vec<String>) {
        for d in devices.as_array().into_iter().flatten() {
            if let Some(id) = d["qdev_id"].as_str().filter(|s| !s.is_empty()) {
                out.push(id.to_string());
            }
            walk(&d["pci_bridge"]["devices"], out);
        }
    }
    let mut out = Vec::new();
    for b in pci.as_array().into_iter().flatten() {
        walk(&b["devices"], &mut out);
    }
    out
}

/// QOM property `property` of the object at `path`, as a string (a
/// link's is the target's path).
fn qom_string(
    q: &mut (impl Queries + ?Sized),
    path: &str,
    property: &str,
) -> Result<String, IvshmemError> {
    let args = json!({ "path": path, "property": property });
    refused(q.execute("qom-get", Some(args)), "qom-get")
        .map(|v| v.as_str().unwrap_or_default().to_string())
}

/// A ring device of vmtrace's that QEMU lists, found without the journal
/// that named it (lost, or kept on another host), with the pid of the
/// vmtrace that added it: its id and BAR 2 from `query-pci`, its memory
/// backend and file from QOM (the device's `memdev` link, the backend's
/// `mem-path`; hw/misc/ivshmem.c, backends/hostmem-file.c). None when
/// QEMU lists none.
pub fn find_leftover(
    q: &mut (impl Queries + ?Sized),
) -> Result<Option<(u32, SharedNames)>, IvshmemError> {
    let pci = q.execute("query-pci", None)?;
    let Some((pid, device)) = device_ids(&pci).into_iter().find_map(|id| {
        let pid = adder_of(&id)?;
        Some((pid, id))
    }) else {
        return Ok(None);
    };
    let dev = find_device(&pci, &device).unwrap_or(&Value::Null);
    let size = dev["regions"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["bar"].as_u64() == Some(2)))
        .and_then(|r| r["size"].as_u64())
        .unwrap_or(0);
    let memdev = qom_string(q, &format!("/machine/peripheral/{device}"), "memdev")?;
    let path = qom_string(q, &memdev, "mem-path")?;
    let object = memdev.rsplit('/').next().unwrap_or_default().to_string();
    Ok(Some((
        pid,
        SharedNames {
            object,
            gpa: bar2_of(dev),
            device,
            path: PathBuf::from(path),
            size,
            // Not known without the journal (a repair by the marker).
            efi: None,
        },
    )))
}

/// The pid of the vmtrace that named device `id`, if vmtrace did.
fn adder_of(id: &str) -> Option<u32> {
    let rest = id.strip_prefix(DEVICE_PREFIX)?;
    rest.split('-').next()?.parse().ok()
}

/// Device `id` on any bus, bridges' buses included.
fn find_device<'a>(pci: &'a Value, id: &str) -> Option<&'a Value> {
    fn in_list<'a>(devices: &'a Value, id: &str) -> Option<&'a Value> {
        devices.as_array()?.iter().find_map(|d| {
            if d["qdev_id"].as_str() == Some(id) {
                return Some(d);
            }
            in_list(&d["pci_bridge"]["devices"], id)
        })
    }
    pci.as_array()?
        .iter()
        .find_map(|b| in_list(&b["devices"], id))
}

/// The flat view maps `[gpa, gpa + size)` as one RAM range of our
/// backend, from its start.
fn only_ours(mtree: &str, gpa: u64, names: &SharedNames) -> Result<(), String> {
    let flat = parse_flat_ram(mtree)?;
    let r = flat
        .iter()
        .find(|r| r.gpa <= gpa && gpa < r.gpa + r.len)
        .ok_or("no RAM is mapped there")?;
    if r.block != names.object || r.gpa != gpa || r.len != names.size || r.offset != 0 {
        return Err(format!(
            "{:#x}+{:#x} is {} at offset {:#x}",
            r.gpa, r.len, r.block, r.offset
        ));
    }
    Ok(())
}

/// Does QEMU list device `id`?
fn listed(q: &mut (impl Queries + ?Sized), id: &str) -> Result<bool, QmpError> {
    let pci = q.execute("query-pci", None)?;
    Ok(find_device(&pci, id).is_some())
}

/// Take the device out (waiting for the guest's eject), then the backend
/// and the file; what is not there is skipped (a repair after a kill
/// does not know how far the attach came).
pub fn unplug(q: &mut (impl Queries + ?Sized), names: &SharedNames) -> Result<(), IvshmemError> {
    if listed(q, &names.device)? {
        // (A DEVICE_DELETED event may go to no one: the monitor is held
        // per burst; the device's absence from query-pci is polled.)
        let _ = q.execute("device_del", Some(json!({ "id": names.device })));
        let start = Instant::now();
        while listed(q, &names.device)? {
            if start.elapsed() > EJECT_WAIT {
                return Err(IvshmemError::NotEjected {
                    id: names.device.clone(),
                    wait: EJECT_WAIT,
                    path: names.path.clone(),
                });
            }
            std::thread::sleep(POLL);
        }
    }
    // Absent already: QEMU says so, and that is what is wanted.
    let _ = q.execute("object-del", Some(json!({ "id": names.object })));
    match std::fs::remove_file(&names.path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(IvshmemError::File {
            path: names.path.clone(),
            source: e,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `query-pci` of QEMU 7.2's pc machine with the device added, its BAR
    /// 2 not yet assigned, then assigned (abridged).
    fn pci(bar2: i64) -> Value {
        json!([{ "bus": 0, "devices": [
            { "bus": 0, "slot": 0, "function": 0, "class_info": { "class": 1536 },
              "id": { "device": 4663, "vendor": 32902 }, "regions": [], "qdev_id": "" },
            { "bus": 0, "slot": 4, "function": 0, "class_info": { "class": 1280 },
              "id": { "device": 4368, "vendor": 6900 }, "qdev_id": "vmtrace-ivshmem-7",
              "regions": [
                { "bar": 0, "type": "memory", "address": -1, "size": 256 },
                { "bar": 2, "type": "memory", "address": bar2, "size": 4194304 } ] } ] }])
    }

    #[test]
    fn bar2_is_read_once_assigned() {
        assert_eq!(bar2(&pci(-1), "vmtrace-ivshmem-7"), None);
        assert_eq!(
            bar2(&pci(0x1_0000_0000), "vmtrace-ivshmem-7"),
            Some(0x1_0000_0000)
        );
        assert_eq!(bar2(&pci(0x1_0000_0000), "other"), None);
    }

    #[test]
    fn a_leftover_device_is_found_by_its_id_on_any_bus() {
        let mut p = pci(0x1_0000_0000);
        let ids = device_ids(&p);
        assert_eq!(ids, ["vmtrace-ivshmem-7"]);
        let dev = find_device(&p, &ids[0]).unwrap();
        assert_eq!(bar2_of(dev), Some(0x1_0000_0000));
        // Behind a root port (q35).
        let inner = p[0]["devices"][1].take();
        p[0]["devices"][1] = json!({ "qdev_id": "pci.1", "pci_bridge": { "devices": [inner] } });
        assert_eq!(device_ids(&p), ["pci.1", "vmtrace-ivshmem-7"]);
    }

    #[test]
    fn each_attach_of_a_process_names_its_device_anew() {
        let (a, b) = (
            SharedNames::new(7, 9, 4 << 20),
            SharedNames::new(7, 9, 4 << 20),
        );
        assert_ne!(a.object, b.object);
        assert_ne!(a.device, b.device);
        assert_ne!(a.path, b.path);
        assert_eq!(
            (adder_of(&a.device), adder_of(&b.device)),
            (Some(7), Some(7))
        );
        assert_eq!(adder_of("vmtrace-ivshmem-7-2"), Some(7));
        assert_eq!(adder_of("vmtrace-ivshmem-x"), None);
        assert_eq!(adder_of("pci.1"), None);
    }

    #[test]
    fn machine_and_ports() {
        let mut q35 = pci(-1);
        q35[0]["devices"][0]["id"]["device"] = json!(Q35_MCH);
        let port = json!({ "class_info": { "class": 1540 }, "id": { "vendor": 0x1b36, "device": 0x000c },
            "qdev_id": "pci.1", "pci_bridge": { "bus": { "number": 1 }, "devices": [] } });
        let mut busy = port.clone();
        busy["qdev_id"] = json!("pci.2");
        busy["pci_bridge"]["devices"] = json!([{ "qdev_id": "disk" }]);
        assert!(matches!(
            free_root_port(vec![busy.clone()]),
            Err(IvshmemError::NoRootPort)
        ));
        assert_eq!(free_root_port(vec![busy, port]).unwrap(), "pci.1");
        let host = &bus0(&q35)[0];
        assert_eq!(host["id"]["device"].as_u64(), Some(Q35_MCH));
    }

    #[test]
    fn the_bar_must_map_the_file_alone() {
        let names = SharedNames::new(7, 9, 0x40_0000);
        let view = |line: &str| {
            format!(
                "FlatView #1\n AS \"memory\", root: system\n Root memory region: system\n{line}\n"
            )
        };
        // (The object's name: `vmtrace-rings-7`, or `-7-N` when another
        // test of this process named one first.)
        let o = &names.object;
        let ok = view(&format!("  0000000100000000-00000001003fffff (prio 1, ram): {o} owner:{{obj path=/objects/{o}}}"));
        assert_eq!(only_ours(&ok, 0x1_0000_0000, &names), Ok(()));
        let half = view(&format!("  0000000100000000-00000001001fffff (prio 1, ram): {o} owner:{{obj path=/objects/{o}}}"));
        assert!(only_ours(&half, 0x1_0000_0000, &names).is_err());
        let other = view("  0000000100000000-00000001003fffff (prio 0, ram): pc.ram @00000000c0000000 owner:{obj path=/objects/pc.ram}");
        assert!(only_ours(&other, 0x1_0000_0000, &names)
            .unwrap_err()
            .contains("pc.ram"));
    }
}
