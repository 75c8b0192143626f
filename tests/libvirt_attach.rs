//! `vmtrace attach --domain`: a libvirt domain (transient, TCG, the
//! default guest) traced by name through libvirt's monitor passthrough.

mod common;

use common::libvirt::LibvirtGuest;

#[test]
fn a_transient_domain_boots_and_answers_through_libvirt() {
    let (guest, w) = LibvirtGuest::boot("fixture", 2);
    assert_eq!(w.comm, common::qemu::WORKER_COMM);
    guest.console.go("getpid", 5).unwrap();
    assert_eq!(guest.state(), "running");
    let d = guest.libvirt();
    assert_eq!(
        d.execute("query-status", None).unwrap()["status"],
        "running"
    );
    assert_eq!(d.vcpus().unwrap(), 2);
    assert!(!guest.ram_layout().is_empty());
}
