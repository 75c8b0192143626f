//! `vmtrace attach --domain` refused in one line, exit status 2, before
//! anything is asked of a QEMU: no libvirt daemon at the URI, no such
//! domain, a domain not running (left as it was), a user libvirt does not
//! let in, a driver that is not QEMU's. No domain boots here (~1 s).

mod common;

use common::libvirt::{DefinedDomain, URI};
use common::{assert_bad_input, linux_61, s};

/// `vmtrace attach ARGS --kernel (the default guest) --trace ...`.
fn attach(args: &[&str]) -> Vec<String> {
    let (bz, _) = linux_61();
    let mut all: Vec<String> = ["attach"].iter().map(|a| a.to_string()).collect();
    all.extend(args.iter().map(|a| a.to_string()));
    all.extend(["--kernel", s(&bz), "--trace", "__x64_sys_getpid"].map(String::from));
    all
}

fn refused(args: &[&str], needle: &str) {
    let all = attach(args);
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    assert_bad_input(&all, needle);
}

#[test]
fn no_daemon_no_domain_and_a_stopped_domain_are_refused() {
    // A libvirt URI whose daemon socket does not exist: no daemon there.
    refused(
        &[
            "--connect",
            "qemu:///system?socket=/nonexistent/libvirt-sock",
            "--domain",
            "x",
        ],
        "libvirt at qemu:///system?socket=/nonexistent/libvirt-sock is not reachable (is \
         libvirtd running?): Failed to connect socket to '/nonexistent/libvirt-sock'",
    );
    refused(
        &["--domain", "vmtrace-no-such-domain"],
        &format!("libvirt at {URI} has no domain named \"vmtrace-no-such-domain\""),
    );
    // Defined, never started: refused, and still shut off.
    let d = DefinedDomain::define("stopped");
    refused(
        &["--domain", &d.name],
        &format!(
            "libvirt domain {} is not running (its state is shut off)",
            d.name
        ),
    );
    assert_eq!(d.state(), "shut off");
}

/// Not QEMU's driver: libvirt's LXC driver (in this daemon: Debian's
/// libvirt-daemon-system brings it), its built-in test driver (a running
/// domain "test" of no hypervisor), and Xen's, absent here (libvirt names
/// it inactive): each refused as not QEMU's.
#[test]
fn domains_of_other_drivers_are_refused() {
    refused(
        &["--connect", "lxc:///system", "--domain", "x"],
        "libvirt at lxc:///system is its LXC driver, not QEMU's",
    );
    refused(
        &["--connect", "test:///default", "--domain", "test"],
        "libvirt at test:///default is its TEST driver, not QEMU's",
    );
    refused(
        &["--connect", "xen:///system", "--domain", "x"],
        "libvirt at xen:///system names the xen driver (not available here",
    );
}

/// A user libvirt does not let manage domains (nobody: not root, not in
/// the libvirt group; libvirtd asks polkit, which here cannot even be
/// reached) is refused with libvirt's reason and what to do.
#[test]
fn a_user_libvirt_refuses_is_told_so() {
    let all = attach(&["--domain", "x"]);
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_vmtrace"))
        .args(&all)
        .output()
        .expect("run setpriv (util-linux)");
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "vmtrace: libvirt at {URI} refused the connection: "
        )) && err
            .trim_end()
            .ends_with("(run as root, or as a member of the libvirt group)"),
        "{err}"
    );
}

/// With no libvirt to ask, `vmtrace vms` still lists the QEMUs it finds
/// (exit status 0) and says in one line that libvirt was not reachable.
#[test]
fn vms_without_libvirt_says_so_in_one_line() {
    let uri = "qemu:///system?socket=/nonexistent/libvirt-sock";
    let out = common::vmtrace(&["vms", "--connect", uri]);
    let err = common::stderr(&out);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "vmtrace: no libvirt domains listed: libvirt at {uri} is not reachable"
        )),
        "{err}"
    );
    let text = common::stdout(&out);
    assert!(
        text.starts_with(&format!("libvirt domains ({uri}): not reachable: ")),
        "{text}"
    );
    assert!(
        text.contains("\nQEMU processes with a QMP socket: "),
        "{text}"
    );
    let out = common::vmtrace(&["vms", "--connect", uri, "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&common::stdout(&out)).unwrap();
    assert!(v["libvirt"]["domains"].is_null(), "{v}");
    assert!(v["libvirt"]["error"].as_str().is_some(), "{v}");
    assert!(v["qemus"].is_array(), "{v}");
}
