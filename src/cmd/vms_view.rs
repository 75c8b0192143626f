//! How `vmtrace vms` prints what it found (`vms_model::Vms`): a table per kind
//! of VM, or one JSON document.

use std::io::{self, Write};

use serde_json::json;

use super::vms_model::Vms;

/// Two tables, libvirt's domains then the plain QEMUs, each row followed by
/// its attach command.
pub fn text(vms: &Vms, w: &mut dyn Write) -> io::Result<()> {
    match &vms.domains {
        Ok(list) => {
            writeln!(w, "libvirt domains ({}): {}", vms.uri, list.len())?;
            if !list.is_empty() {
                writeln!(
                    w,
                    "  {:<24} {:<10} {:>5} {:>9} {:>8}  KERNEL",
                    "NAME", "STATE", "VCPUS", "MEMORY", "PID"
                )?;
            }
            for d in list {
                let s = &d.summary;
                writeln!(
                    w,
                    "  {:<24} {:<10} {:>5} {:>5} MiB {:>8}  {}",
                    s.name,
                    s.state,
                    s.vcpus,
                    s.memory_kib / 1024,
                    d.pid.map_or_else(|| "-".into(), |p| p.to_string()),
                    s.kernel
                        .as_ref()
                        .map_or_else(|| "-".into(), |k| k.display().to_string()),
                )?;
                writeln!(w, "      {}", d.attach)?;
            }
        }
        Err(why) => writeln!(w, "libvirt domains ({}): not reachable: {why}", vms.uri)?,
    }
    writeln!(w, "QEMU processes with a QMP socket: {}", vms.qemus.len())?;
    if !vms.qemus.is_empty() {
        writeln!(w, "  {:>8} {:<6} {:<16} QMP", "PID", "ACCEL", "NAME")?;
    }
    for q in &vms.qemus {
        writeln!(
            w,
            "  {:>8} {:<6} {:<16} {}",
            q.pid,
            q.accel,
            q.name.as_deref().unwrap_or("-"),
            q.qmp.display()
        )?;
        writeln!(w, "      {}", q.attach)?;
    }
    Ok(())
}

/// `{"libvirt": {"uri", "domains" | "error"}, "qemus": [...]}`.
pub fn json(vms: &Vms, w: &mut dyn Write) -> io::Result<()> {
    let libvirt = match &vms.domains {
        Ok(list) => json!({
            "uri": vms.uri,
            "domains": list.iter().map(|d| {
                let s = &d.summary;
                json!({
                    "name": s.name,
                    "state": s.state,
                    "vcpus": s.vcpus,
                    "memory_kib": s.memory_kib,
                    "kernel": s.kernel,
                    "uuid": s.uuid,
                    "pid": d.pid,
                    "attach": d.attach,
                })
            }).collect::<Vec<_>>(),
        }),
        Err(why) => json!({ "uri": vms.uri, "error": why }),
    };
    let qemus: Vec<_> = vms
        .qemus
        .iter()
        .map(|q| {
            json!({
                "pid": q.pid,
                "qmp": q.qmp,
                "accel": q.accel,
                "name": q.name,
                "attach": q.attach,
            })
        })
        .collect();
    let doc = json!({ "libvirt": libvirt, "qemus": qemus });
    serde_json::to_writer_pretty(&mut *w, &doc)?;
    writeln!(w)
}
