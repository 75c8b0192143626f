//! Where the unstripped vmlinux of a bzImage may be, in the order vmtrace
//! looks: beside it, at the root of the kernel build tree it was built in,
//! where distributions install debug symbols for a kernel version, both in
//! a package unpacked beside the image (`dpkg -x`) and on this system.

use std::path::{Path, PathBuf};

/// Where a bzImage sits in a kernel build tree (or its `O=` object tree):
/// the vmlinux is at the tree's root.
const TREE_BZIMAGE: [&str; 3] = ["arch", "x86", "boot"];

/// One place a vmlinux may be, and why vmtrace looks there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub path: PathBuf,
    /// For messages: "beside the bzImage", "the build tree's root", ...
    pub place: &'static str,
}

/// Where a distribution installs its kernel images (`/boot/vmlinuz-<release>`).
const BOOT_DIR: &str = "boot";
/// Where distributions install a kernel's debug symbols, relative to the
/// root of the file system (or of an unpacked package), and the place's
/// name for messages.
fn debug_paths(release: &str) -> [(String, &'static str); 2] {
    [
        (
            format!("usr/lib/debug/boot/vmlinux-{release}"),
            "the debug-symbol directory",
        ),
        (
            format!("usr/lib/debug/lib/modules/{release}/vmlinux"),
            "the debug-symbol directory",
        ),
    ]
}

/// The places to look for the vmlinux of the bzImage at `kernel`, in order.
/// `release` is the kernel's release ("6.1.192", the first word of the
/// setup header's version string), when the bzImage has one.
pub fn candidates(kernel: &Path, release: Option<&str>) -> Vec<Candidate> {
    let mut out = vec![Candidate {
        path: kernel.with_file_name("vmlinux"),
        place: "beside the bzImage",
    }];
    // <tree>/arch/x86/boot/bzImage -> <tree>/vmlinux.
    let mut dir = kernel.parent();
    for part in TREE_BZIMAGE.iter().rev() {
        dir = dir.filter(|d| d.file_name().is_some_and(|n| n == *part));
        dir = dir.and_then(Path::parent);
    }
    let in_tree = dir.is_some();
    if let Some(tree) = dir {
        out.push(Candidate {
            path: tree.join("vmlinux"),
            place: "the build tree's root",
        });
    }
    // A release that is a plain file name (no '/', not "." or "..").
    let Some(r) = release.filter(|r| !r.is_empty() && !r.contains('/') && *r != "." && *r != "..")
    else {
        return out;
    };
    // <root>/boot/vmlinuz-<release>: a package unpacked with `dpkg -x` into
    // <root>, its -dbg package likely beside it (<root>/usr/lib/debug/...);
    // not a build tree's arch/x86/boot.
    let unpacked = kernel
        .parent()
        .filter(|_| !in_tree)
        .filter(|d| d.file_name().is_some_and(|n| n == BOOT_DIR))
        .and_then(Path::parent)
        // Not the system's own /boot: that root is searched below.
        .filter(|root| !root.as_os_str().is_empty() && *root != Path::new("/"));
    if let Some(root) = unpacked {
        for (path, _) in debug_paths(r) {
            out.push(Candidate {
                path: root.join(path),
                place: "the debug-symbol directory under the image's root",
            });
        }
    }
    for (path, place) in debug_paths(r) {
        out.push(Candidate {
            path: Path::new("/").join(path),
            place,
        });
    }
    out.push(Candidate {
        path: PathBuf::from(format!("/{BOOT_DIR}/vmlinux-{r}")),
        place: "/boot",
    });
    out
}

/// The kernel release in a bzImage's version string: its first word
/// ("6.1.192 (user@host) #1 SMP ..." -> "6.1.192").
pub fn release(version: &str) -> Option<&str> {
    version.split_whitespace().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(c: &[Candidate]) -> Vec<String> {
        c.iter().map(|c| c.path.display().to_string()).collect()
    }

    #[test]
    fn beside_tree_and_debug_locations_in_order() {
        let c = candidates(
            Path::new("/src/linux/arch/x86/boot/bzImage"),
            Some("6.12.7"),
        );
        assert_eq!(
            paths(&c),
            [
                "/src/linux/arch/x86/boot/vmlinux",
                "/src/linux/vmlinux",
                "/usr/lib/debug/boot/vmlinux-6.12.7",
                "/usr/lib/debug/lib/modules/6.12.7/vmlinux",
                "/boot/vmlinux-6.12.7",
            ]
        );
        // Not in a build tree, no version.
        let c = candidates(Path::new("/tmp/k/bzImage"), None);
        assert_eq!(paths(&c), ["/tmp/k/vmlinux"]);
        // A relative path in a tree whose root is the current directory.
        let c = candidates(Path::new("arch/x86/boot/bzImage"), None);
        assert_eq!(paths(&c), ["arch/x86/boot/vmlinux", "vmlinux"]);
        // A package unpacked with `dpkg -x` (its -dbg package beside it):
        // its debug-symbol places first, then the system's.
        let c = candidates(
            Path::new("/tmp/deb/boot/vmlinuz-6.1.0-56-cloud-amd64"),
            Some("6.1.0-56-cloud-amd64"),
        );
        assert_eq!(
            paths(&c),
            [
                "/tmp/deb/boot/vmlinux",
                "/tmp/deb/usr/lib/debug/boot/vmlinux-6.1.0-56-cloud-amd64",
                "/tmp/deb/usr/lib/debug/lib/modules/6.1.0-56-cloud-amd64/vmlinux",
                "/usr/lib/debug/boot/vmlinux-6.1.0-56-cloud-amd64",
                "/usr/lib/debug/lib/modules/6.1.0-56-cloud-amd64/vmlinux",
                "/boot/vmlinux-6.1.0-56-cloud-amd64",
            ]
        );
        // The system's /boot and a relative boot/ are looked at once.
        let c = candidates(
            Path::new("/boot/vmlinuz-6.1.0-56-amd64"),
            Some("6.1.0-56-amd64"),
        );
        assert_eq!(c.len(), 4);
        let c = candidates(
            Path::new("boot/vmlinuz-6.1.0-56-amd64"),
            Some("6.1.0-56-amd64"),
        );
        assert_eq!(c.len(), 4);
        // Not a release that names a file elsewhere.
        let c = candidates(Path::new("/tmp/bzImage"), Some("../../etc"));
        assert_eq!(c.len(), 1);
        assert_eq!(release("6.1.192 (u@h) #1 SMP"), Some("6.1.192"));
        assert_eq!(release(""), None);
    }
}
