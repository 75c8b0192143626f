//! Taking QEMU's gdbstub safely. QEMU's stub serves one debugger and stops
//! the VM when one connects (gdbstub.c's gdb_chr_event, CHR_EVENT_OPENED):
//! a second connection waits in the socket's accept queue and pauses the
//! VM whenever QEMU lets it in, so vmtrace connects only while QMP says no
//! debugger is connected. The stub vmtrace opens itself listens in a fresh
//! private directory (0700, a random name), so nobody else can connect to
//! it first; one given (`--gdb`) must be QEMU's. After connecting, QMP
//! must show the stub connected.

use std::ffi::{CString, OsString};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use super::gdb::GdbAddr;
use super::qmp::QmpError;
use super::queries::{GdbServer, Queries};

/// The socket's name in vmtrace's private directory.
pub const SOCKET: &str = "gdb.sock";
/// The private directory's name: this prefix, vmtrace's pid, `-` and
/// mkdtemp's random part.
pub const DIR_PREFIX: &str = "vmtrace-gdb-";

#[derive(Debug, thiserror::Error)]
pub enum GdbStubError {
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error(
        "QEMU's gdbstub ({filename}) already has a debugger connected: QEMU serves one at a \
         time, and another connection would pause the guest when QEMU lets it in; detach it \
         first"
    )]
    InUse { filename: String },
    #[error(
        "the gdbstub given ({given}) is not QEMU's ({qemu}): give the address of QEMU's gdbstub, \
         or none and vmtrace opens one of its own"
    )]
    NotQemus { given: String, qemu: String },
    #[error("cannot make a private directory for the gdbstub's socket in {}: {source}", dir.display())]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "QEMU's gdbstub does not show vmtrace's connection ({filename}, vmtrace connected to \
         {addr}): someone else's debugger may hold it; nothing was changed"
    )]
    NotOurs { filename: String, addr: String },
    #[error(
        "{error}; the guest is left paused (the gdbstub's connection stopped it, and {why}): \
         continue it with QMP cont"
    )]
    LeftPaused { error: String, why: String },
}

/// vmtrace's own stub: its socket, and how to reopen the stub it closed to
/// open its own (QEMU has one gdbstub).
pub struct OwnStub {
    pub socket: PathBuf,
    pub replaced: Option<String>,
}

/// The `gdbserver` argument that reopens the stub QEMU shows as
/// `filename`, for a TCP or unix one (None for others: pty, stdio...).
/// QEMU adds `server=on,wait=off` to a TCP device itself (gdbstub.c's
/// gdbserver_start), and must be told so for a unix one.
pub fn reopen_spec(filename: &str) -> Option<String> {
    let rest = filename.strip_prefix("disconnected:").unwrap_or(filename);
    let spec = rest.split(" <-> ").next()?.split(',').next()?;
    if spec.starts_with("tcp:") {
        Some(spec.to_string())
    } else if spec.starts_with("unix:") {
        Some(format!("{spec},server=on,wait=off"))
    } else {
        None
    }
}

/// QEMU's gdbstub, if one is open, refused if a debugger is connected.
pub fn check_free(qmp: &mut dyn Queries) -> Result<Option<GdbServer>, GdbStubError> {
    match qmp.gdbserver()? {
        Some(s) if s.connected => Err(GdbStubError::InUse {
            filename: s.filename,
        }),
        s => Ok(s),
    }
}

/// The stub given is QEMU's stub: the same socket path, or the same port
/// on an address of the host it listens on.
pub fn check_given(given: &GdbAddr, qemu: Option<&GdbServer>) -> Result<(), GdbStubError> {
    let refuse = |qemu: String| GdbStubError::NotQemus {
        given: given.to_string(),
        qemu,
    };
    let Some(qemu) = qemu else {
        return Err(refuse("QEMU has none open".into()));
    };
    if same_stub(given, qemu) {
        Ok(())
    } else {
        Err(refuse(format!("QEMU's is {}", qemu.filename)))
    }
}

fn same_stub(given: &GdbAddr, qemu: &GdbServer) -> bool {
    match (given, &qemu.addr) {
        (GdbAddr::Unix(a), Some(GdbAddr::Unix(b))) => canonical(a) == canonical(b),
        (GdbAddr::Tcp(a), Some(GdbAddr::Tcp(_))) => {
            let Some((host, port)) = tcp_listen(&qemu.filename) else {
                return false;
            };
            let Ok(given): Result<Vec<SocketAddr>, _> = a.to_socket_addrs().map(Iterator::collect)
            else {
                return false;
            };
            // A stub on every address is reached on any of the host's.
            let wildcard = matches!(host.as_str(), "" | "0.0.0.0" | "::" | "[::]");
            let listens: Vec<SocketAddr> = format!("{host}:{port}")
                .to_socket_addrs()
                .map(Iterator::collect)
                .unwrap_or_default();
            given
                .iter()
                .any(|g| g.port() == port && (wildcard || listens.contains(g)))
        }
        _ => false,
    }
}

fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

/// The host and port of a TCP stub's chardev filename
/// (`[disconnected:]tcp:HOST:PORT,server=on[ <-> PEER]`).
fn tcp_listen(filename: &str) -> Option<(String, u16)> {
    let rest = filename.strip_prefix("disconnected:").unwrap_or(filename);
    let spec = rest.split(" <-> ").next()?.split(',').next()?;
    let (host, port) = spec.strip_prefix("tcp:")?.rsplit_once(':')?;
    Some((host.to_string(), port.parse().ok()?))
}

/// Makes vmtrace's private directory: in $XDG_RUNTIME_DIR if set and
/// usable, else in the temporary directory, with mkdtemp (mode 0700, a
/// random name nobody can have made first). A QEMU running as another
/// user than root's vmtrace gets the directory, to make its socket in.
pub fn private_dir(qemu_uid: u32) -> Result<PathBuf, GdbStubError> {
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute() && d.is_dir());
    let mut last = None;
    for base in runtime.into_iter().chain([std::env::temp_dir()]) {
        match mkdtemp(&base) {
            Ok(dir) => return hand_to(dir, qemu_uid),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("the temporary directory was tried"))
}

fn mkdtemp(base: &Path) -> Result<PathBuf, GdbStubError> {
    let template = base.join(format!("{DIR_PREFIX}{}-XXXXXX", std::process::id()));
    let err = |source| GdbStubError::Dir {
        dir: base.to_path_buf(),
        source,
    };
    let c = CString::new(template.as_os_str().as_bytes())
        .map_err(|_| err(std::io::ErrorKind::InvalidInput.into()))?;
    let mut bytes = c.into_bytes_with_nul();
    // SAFETY: mkdtemp rewrites the template's trailing XXXXXX in place; the
    // buffer is NUL-terminated and lives across the call.
    let made = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
    if made.is_null() {
        return Err(err(std::io::Error::last_os_error()));
    }
    bytes.pop();
    Ok(PathBuf::from(OsString::from_vec(bytes)))
}

/// Gives `dir` to QEMU's user when vmtrace runs as root and QEMU does not:
/// QEMU makes the socket in it (root reaches it regardless).
pub fn hand_to(dir: PathBuf, qemu_uid: u32) -> Result<PathBuf, GdbStubError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || qemu_uid == 0 {
        return Ok(dir);
    }
    let c = CString::new(dir.as_os_str().as_bytes()).expect("made from a C string");
    // SAFETY: chown on a NUL-terminated path that lives across the call;
    // gid -1 (as u32) leaves the group.
    if unsafe { libc::chown(c.as_ptr(), qemu_uid, u32::MAX) } != 0 {
        let source = std::io::Error::last_os_error();
        let _ = std::fs::remove_dir(&dir);
        return Err(GdbStubError::Dir { dir, source });
    }
    Ok(dir)
}

/// Removes vmtrace's private directory around `socket` (its parent, only
/// if it is one: the stub given is never touched).
pub fn remove_private(socket: &Path) {
    let _ = std::fs::remove_file(socket);
    if let Some(dir) = socket.parent() {
        let ours = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(DIR_PREFIX));
        if ours {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Removes the private directories a vmtrace `pid` that is gone left
/// (killed before its detach removed them). The caller checks that no
/// other process has that pid now: pids wrap, and a live vmtrace's
/// directory carries its pid too. Only an empty directory, or one holding
/// nothing but the stub's socket, is removed. Returns what was removed.
pub fn remove_dead_dirs(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("{DIR_PREFIX}{pid}-");
    let runtime = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
    let mut removed = Vec::new();
    for base in runtime.into_iter().chain([std::env::temp_dir()]) {
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        for e in entries.flatten() {
            let named = e.file_name().to_string_lossy().starts_with(&prefix);
            if !named || !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let dir = e.path();
            let _ = std::fs::remove_file(dir.join(SOCKET));
            if std::fs::remove_dir(&dir).is_ok() {
                removed.push(dir);
            }
        }
    }
    removed
}

/// After vmtrace connected to `addr`: QMP shows QEMU's stub connected, and
/// for vmtrace's own stub, listening on its socket (so that the one
/// connection is vmtrace's: no one else can reach the private directory).
pub fn confirm(qmp: &mut dyn Queries, addr: &GdbAddr, own: bool) -> Result<(), GdbStubError> {
    let now = qmp.gdbserver()?;
    let ok = now
        .as_ref()
        .is_some_and(|s| s.connected && (!own || s.addr.as_ref() == Some(addr)));
    if ok {
        return Ok(());
    }
    Err(GdbStubError::NotOurs {
        filename: now.map_or_else(|| "none open".into(), |s| s.filename),
        addr: addr.to_string(),
    })
}

/// Why the guest stays paused after an error past the connect, if it does:
/// the stub's client could not detach, so QMP is asked, and a guest paused
/// (by the connection) is continued through QMP.
pub fn let_go(qmp: &mut dyn Queries) -> Option<String> {
    match qmp.status() {
        Ok(s) if s == "paused" => match qmp.execute("cont", None) {
            Ok(_) => None,
            Err(e) => Some(format!("QMP cont failed: {e}")),
        },
        Ok(_) => None,
        Err(QmpError::Closed { .. }) => None,
        Err(e) => Some(format!("QMP cannot say whether it runs: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_dead_vmtraces_directories_go_and_nothing_else() {
        // A pid no process has now: a child that was reaped.
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let _ = { child }.wait();
        let base = std::env::temp_dir();
        let empty = base.join(format!("{DIR_PREFIX}{pid}-aaaaaa"));
        let socket = base.join(format!("{DIR_PREFIX}{pid}-bbbbbb"));
        let other = base.join(format!("{DIR_PREFIX}{pid}-cccccc"));
        let alive = base.join(format!("{DIR_PREFIX}{}-dddddd", std::process::id()));
        for d in [&empty, &socket, &other, &alive] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(socket.join(SOCKET), b"").unwrap();
        std::fs::write(other.join("notes"), b"someone's").unwrap();
        let mut removed = remove_dead_dirs(pid);
        removed.sort();
        assert_eq!(removed, vec![empty.clone(), socket.clone()]);
        assert!(other.join("notes").exists() && alive.is_dir());
        std::fs::remove_dir_all(&other).unwrap();
        std::fs::remove_dir_all(&alive).unwrap();
    }

    #[test]
    fn a_private_directory_is_0700_and_fresh_each_time() {
        let a = private_dir(0).unwrap();
        let b = private_dir(0).unwrap();
        assert_ne!(a, b);
        for d in [&a, &b] {
            let mode = std::fs::metadata(d).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", d.display());
            let name = d.file_name().unwrap().to_str().unwrap();
            assert!(
                name.starts_with(&format!("{DIR_PREFIX}{}-", std::process::id())),
                "{name}"
            );
            remove_private(&d.join(SOCKET));
            assert!(!d.exists());
        }
    }

    #[test]
    fn the_stub_given_must_be_qemus() {
        let unix = GdbServer::parse("disconnected:unix:/tmp/q/g.sock,server=on");
        assert_eq!(
            reopen_spec(&unix.filename).as_deref(),
            Some("unix:/tmp/q/g.sock,server=on,wait=off")
        );
        assert_eq!(
            reopen_spec("tcp:0.0.0.0:1234,server=on <-> 127.0.0.1:4242").as_deref(),
            Some("tcp:0.0.0.0:1234")
        );
        assert_eq!(reopen_spec("pty:/dev/pts/3"), None);
        let ok = |g: &str, s: &GdbServer| check_given(&g.parse().unwrap(), Some(s)).is_ok();
        assert!(ok("/tmp/q/g.sock", &unix));
        assert!(!ok("/tmp/q/other.sock", &unix));
        assert!(!ok("127.0.0.1:1234", &unix));
        let any = GdbServer::parse("disconnected:tcp:0.0.0.0:1234,server=on");
        assert!(ok("127.0.0.1:1234", &any));
        assert!(ok("localhost:1234", &any));
        assert!(!ok("127.0.0.1:1235", &any));
        let lo = GdbServer::parse("disconnected:tcp:127.0.0.1:1234,server=on");
        assert!(ok("127.0.0.1:1234", &lo));
        assert!(!ok("127.0.0.2:1234", &lo));
        let e = check_given(&"127.0.0.1:1234".parse().unwrap(), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the gdbstub given (127.0.0.1:1234) is not QEMU's (QEMU has none open): give the \
             address of QEMU's gdbstub, or none and vmtrace opens one of its own"
        );
    }
}
