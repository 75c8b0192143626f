//! `vmtrace vms`: the VMs on this host vmtrace can attach to, in the
//! spirit of `virsh list` and `perf kvm` (gathered by `vms_model`, printed
//! by `vms_view`). With no libvirt to ask, the plain QEMUs are listed and
//! one line says why libvirt's domains are not.

use super::vms_model::Vms;
use super::vms_view;
use crate::cli::{VmsArgs, VmsFormat};
use crate::emit::to_stdout;
use crate::error::{Error, Outcome};

pub fn main(args: &VmsArgs) -> Result<Outcome, Error> {
    let vms = Vms::gather(&args.connect);
    if let Err(why) = &vms.domains {
        note!("vmtrace: no libvirt domains listed: {why}");
    }
    match args.format {
        VmsFormat::Text => to_stdout("vms", |w| vms_view::text(&vms, w))?,
        VmsFormat::Json => to_stdout("vms", |w| vms_view::json(&vms, w))?,
    }
    Ok(Outcome::Clean)
}
