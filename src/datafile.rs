//! The data file: the binary trace `vmtrace record` (default `vmtrace.data`)
//! and `vmtrace -o FILE` write, and `report`/`script` read.
//!
//! `record` keeps the previous file of that name as `FILE.old`, as perf
//! does with `perf.data.old`, so that recording twice never loses the first
//! trace. Only a regular file is renamed: a symlink's target and a
//! character device are written by the output rules (`tracer::trace::output_path`)
//! and stay where they are. An old `FILE.old` that is a regular file is
//! replaced; anything else there (a directory, a symlink, a device) is left
//! alone and the record refused before the guest boots.
//!
//! [`Data`] is the file one traced run writes, from its lock and `.old` to
//! the temporary file of a run without `-o`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use tracer::trace::report::thousands;

use crate::cli::DEFAULT_DATA;
use tracer::session::Saved;
use tracer::trace::datafile::DataFile;

use crate::datalock;
use crate::error::{InputError, RuntimeError};

/// The data file a run streamed (`cmd::run`): written to its end, or why
/// not.
pub type Streamed = Result<Written, RuntimeError>;

/// A data file written while the guest ran.
pub struct Written {
    pub path: std::path::PathBuf,
    /// Calls in the file (the report's events), returns in it (a
    /// function-graph trace), and events counted but not stored.
    pub events: u64,
    pub returns: Option<u64>,
    pub unstored: u64,
    /// Where the previous file went (`record`: FILE.old).
    pub kept: Option<std::path::PathBuf>,
}

/// `FILE.old` beside `FILE`.
pub fn old_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".old");
    PathBuf::from(name)
}

/// What [`keep_old`] will do with `path`.
enum Rotation {
    /// Nothing to keep: no file there, or not a regular file.
    Nothing,
    /// Rename `path` to this.
    Rename(PathBuf),
}

/// Decide without touching anything; `Err(why)` when `FILE.old` is in the way.
fn rotation(path: &Path) -> io::Result<Result<Rotation, String>> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => {}
        Ok(_) => return Ok(Ok(Rotation::Nothing)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Ok(Rotation::Nothing)),
        Err(e) => return Err(e),
    }
    let old = old_path(path);
    match fs::symlink_metadata(&old) {
        Ok(m) if m.file_type().is_file() => Ok(Ok(Rotation::Rename(old))),
        Ok(m) => Ok(Err(format!("it is {}", kind(&m)))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Ok(Rotation::Rename(old))),
        Err(e) => Err(e),
    }
}

fn kind(m: &fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symlink"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// The binary trace to save, as the output options ask for it (here, not
/// in `config`, which checks it with `check_keep_old`: no import loop).
#[derive(Clone, Debug)]
pub struct DataPath {
    pub path: PathBuf,
    /// `record`: keep the previous file as FILE.old.
    pub keep_old: bool,
}

/// Before the run: `record` will be able to keep the previous `path`.
pub fn check_keep_old(path: &Path) -> Result<(), InputError> {
    let old = old_path(path);
    let refuse = |why: String| InputError::KeepOld {
        path: path.to_path_buf(),
        old: old.clone(),
        why,
    };
    match rotation(path) {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(why)) => Err(refuse(why)),
        Err(e) => Err(refuse(e.to_string())),
    }
}

/// Rename the previous data file `path`, if it is a regular file, to
/// `path.old` (replacing an older one); returns the new name if it did.
/// Call it right before the new data file is first written.
pub fn keep_old(path: &Path) -> Result<Option<PathBuf>, RuntimeError> {
    let err = |source: io::Error| RuntimeError::KeepOld {
        path: path.to_path_buf(),
        old: old_path(path),
        source,
    };
    match rotation(path).map_err(err)? {
        Ok(Rotation::Nothing) => Ok(None),
        Ok(Rotation::Rename(old)) => {
            fs::rename(path, &old).map_err(err)?;
            Ok(Some(old))
        }
        Err(why) => Err(err(io::Error::new(io::ErrorKind::AlreadyExists, why))),
    }
}

/// The line that ends a run that saved its trace, in the spirit of perf's
/// `[ perf record: Captured and wrote 1.2 MB perf.data (123 samples) ]`:
/// `wrote vmtrace.data (12,345 events, 1.2 MB); read it with: vmtrace report`
/// (after `vmtrace: `). `events`: calls stored in the file, as the
/// report counts events; `returns`: returns stored (a function-graph
/// trace); `unstored`: counted only; `kept`: where the previous file went
/// ([`keep_old`]). Call it once the file is complete: it says the file's size.
pub fn wrote_line(
    path: &Path,
    events: u64,
    returns: Option<u64>,
    unstored: u64,
    kept: Option<&Path>,
) -> String {
    let mut what = format!(
        "{} event{}",
        thousands(events),
        if events == 1 { "" } else { "s" }
    );
    if let Some(r) = returns {
        what.push_str(&format!(
            " and {} return{}",
            thousands(r),
            if r == 1 { "" } else { "s" }
        ));
    }
    if unstored > 0 {
        what.push_str(&format!(" and {} counted only", thousands(unstored)));
    }
    // A device has no size worth saying.
    if let Some(m) = fs::metadata(path).ok().filter(|m| m.is_file()) {
        what.push_str(&format!(", {}", size(m.len())));
    }
    if let Some(old) = kept {
        what.push_str(&format!("; the previous one is {}", old.display()));
    }
    let read = if path == Path::new(DEFAULT_DATA) {
        "vmtrace report".to_string()
    } else {
        format!("vmtrace report {}", shell_word(path))
    };
    format!("wrote {} ({what}); read it with: {read}", path.display())
}

/// A human size: bytes, kB, MB, GB (decimal, as `ls -h --si`).
fn size(bytes: u64) -> String {
    match bytes {
        0..=999 => format!("{bytes} bytes"),
        1_000..=999_999 => format!("{:.1} kB", bytes as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.1} MB", bytes as f64 / 1e6),
        _ => format!("{:.1} GB", bytes as f64 / 1e9),
    }
}

/// `path` as the user can paste it into a shell.
fn shell_word(path: &Path) -> String {
    let s = path.display().to_string();
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+,:@%=".contains(c))
    {
        s
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The data file a traced run writes while the guest runs: the one asked
/// for (`-o`, `record`'s vmtrace.data, the previous one kept as .old), or
/// for a one-shot run without `-o` a temporary file the report is read
/// from and which is removed at the end. A character device asked for
/// gets the file once it is complete (it cannot be read back).
pub struct Data {
    /// Held while the run writes `stream` (see `datalock`).
    lock: Option<datalock::Lock>,
    /// Where events are written as they come.
    pub stream: PathBuf,
    pub file: Option<DataFile>,
    /// Where the user asked for it (None: no data file asked for).
    asked: Option<PathBuf>,
    /// `stream` is vmtrace's own, removed at the end.
    temporary: bool,
    kept: Option<PathBuf>,
}

impl Data {
    pub fn open(asked: Option<&DataPath>) -> Result<Data, crate::error::Error> {
        let device = asked.is_some_and(|d| {
            matches!(
                tracer::trace::output_path::target(&d.path),
                Ok(tracer::trace::output_path::Target::Device(_))
            )
        });
        // Another run writing the file: refused before anything is moved
        // or created (the lock is beside the file, never renamed; see
        // `datalock`).
        let lock = match asked {
            Some(d) if !device => datalock::Lock::acquire(&lock_target(&d.path))?,
            _ => None,
        };
        let (stream, temporary, kept) = match asked {
            Some(d) if !device => {
                let kept = if d.keep_old { keep_old(&d.path)? } else { None };
                (d.path.clone(), false, kept)
            }
            _ => (temporary_path(), true, None),
        };
        let file = DataFile::create(&stream).map_err(RuntimeError::Save)?;
        Ok(Data {
            lock,
            stream,
            file: Some(file),
            asked: asked.map(|d| d.path.clone()),
            temporary,
            kept,
        })
    }

    /// The run traced nothing: no file is left (a temporary one), or the
    /// one asked for stays as written (it says so: no events).
    pub fn discard(&self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.stream);
        }
    }

    /// The guest is stopped, its text restored, the file complete: Ctrl-C
    /// now ends a long report or export at once, removing what this run
    /// made for itself (it was caught to stop the run cleanly, and a second
    /// one said "restoring the guest's text").
    pub fn end_on_terminate(&self) {
        let temporary = self.temporary.then_some(self.stream.as_path());
        let lock = self.lock.as_ref().map(|l| l.path());
        if let Err(e) = vmm::run::end_on_terminate([temporary, lock]) {
            note!("vmtrace: cannot restore Ctrl-C ({e}): it is ignored until vmtrace ends");
        }
    }

    /// Once the file is complete (`saved`): to a device if one was asked
    /// for, the temporary file removed; what to say about it.
    pub fn finish(
        &self,
        saved: Result<Saved, tracer::trace::datafile::TraceFileError>,
        summary: &tracer::trace::model::Trace,
    ) -> Option<Streamed> {
        let m = &summary.meta;
        let unstored = m.events_dropped + m.returns_dropped;
        let out = self.asked.as_ref().map(|asked| {
            let saved = saved.map_err(RuntimeError::Save)?;
            if self.temporary {
                // A character device: the whole file into it.
                copy_into(&self.stream, asked)?;
            }
            // The file's records are calls and returns; the report counts
            // calls as events and returns apart.
            let returns = m.graph.then(|| {
                let total: u64 = summary.returns.iter().flatten().sum();
                total.saturating_sub(m.returns_dropped)
            });
            Ok(Written {
                path: asked.clone(),
                events: saved.events - returns.unwrap_or(0).min(saved.events),
                returns,
                unstored,
                kept: self.kept.clone(),
            })
        });
        self.discard();
        out
    }
}

impl Drop for Data {
    /// Whatever ended the run (an error included), no temporary file stays.
    fn drop(&mut self) {
        self.discard();
    }
}

/// The file a data file path writes: a symlink's target (two names of one
/// file share its lock), else the path itself.
fn lock_target(path: &Path) -> PathBuf {
    match tracer::trace::output_path::target(path) {
        Ok(tracer::trace::output_path::Target::File { path, .. }) => path,
        _ => path.to_path_buf(),
    }
}

/// Where a one-shot run without `-o` streams its events.
fn temporary_path() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("vmtrace-{}-{n}.data", std::process::id()))
}

/// The complete data file `from` into the character device `to`.
fn copy_into(from: &Path, to: &Path) -> Result<(), RuntimeError> {
    let lost = |source| RuntimeError::Lost {
        what: "trace",
        path: to.to_path_buf(),
        source,
        note: "what reached the device is incomplete".to_string(),
    };
    let mut src = std::fs::File::open(from).map_err(lost)?;
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .open(to)
        .map_err(lost)?;
    std::io::copy(&mut src, &mut dst).map_err(lost)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("vmtrace-datafile-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_regular_file_becomes_old_replacing_an_older_one() {
        let d = scratch("rotate");
        let data = d.join("vmtrace.data");
        assert_eq!(keep_old(&data).unwrap(), None, "nothing to keep");
        fs::write(&data, b"first").unwrap();
        assert_eq!(keep_old(&data).unwrap(), Some(d.join("vmtrace.data.old")));
        assert!(!data.exists());
        fs::write(&data, b"second").unwrap();
        keep_old(&data).unwrap();
        assert_eq!(fs::read(d.join("vmtrace.data.old")).unwrap(), b"second");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn never_renames_what_is_not_a_regular_file() {
        let d = scratch("special");
        let target = d.join("real");
        fs::write(&target, b"x").unwrap();
        let link = d.join("link.data");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(keep_old(&link).unwrap(), None);
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        let dir = d.join("dir.data");
        fs::create_dir(&dir).unwrap();
        assert_eq!(keep_old(&dir).unwrap(), None);
        assert_eq!(keep_old(Path::new("/dev/null")).unwrap(), None);
        // A directory where FILE.old would go: refused, before and after a run.
        let data = d.join("t.data");
        fs::write(&data, b"keep").unwrap();
        fs::create_dir(d.join("t.data.old")).unwrap();
        let e = check_keep_old(&data).unwrap_err().to_string();
        assert!(e.contains("t.data.old: it is a directory"), "{e}");
        assert!(keep_old(&data).is_err());
        assert_eq!(fs::read(&data).unwrap(), b"keep");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn the_wrote_line_says_what_where_and_how_to_read_it() {
        let d = scratch("line");
        let data = d.join("t.data");
        fs::write(&data, vec![0u8; 1_500]).unwrap();
        assert_eq!(
            wrote_line(&data, 12_345, None, 0, None),
            format!(
                "wrote {0} (12,345 events, 1.5 kB); read it with: vmtrace report {0}",
                data.display()
            )
        );
        let old = old_path(&data);
        let line = wrote_line(&data, 10, None, 4, Some(&old));
        assert!(
            line.contains("(10 events and 4 counted only, 1.5 kB; the previous one is "),
            "{line}"
        );
        // A function-graph trace: calls as the report counts them, returns
        // beside them (not 98,802 "events" for 49,401 calls).
        let line = wrote_line(&data, 49_401, Some(49_401), 0, None);
        assert!(
            line.contains("(49,401 events and 49,401 returns, 1.5 kB)"),
            "{line}"
        );
        // (Whatever vmtrace.data the test's directory holds.)
        let line = wrote_line(Path::new(DEFAULT_DATA), 1, None, 0, None);
        assert!(line.starts_with("wrote vmtrace.data (1 event"), "{line}");
        assert!(line.ends_with("); read it with: vmtrace report"), "{line}");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn sizes_and_shell_words() {
        assert_eq!(size(12), "12 bytes");
        assert_eq!(size(1_234), "1.2 kB");
        assert_eq!(size(1_240_000), "1.2 MB");
        assert_eq!(shell_word(Path::new("/tmp/a.data")), "/tmp/a.data");
        assert_eq!(shell_word(Path::new("it's here")), r"'it'\''s here'");
    }
}
