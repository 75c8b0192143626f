//! `vmtrace bench`: list the benches, or measure what tracing costs with
//! those named (see the `bench` module for the methods), print the table,
//! write `--json FILE` and `--markdown FILE`.

use std::io::Write as _;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::bench::results::{self, markdown};
use crate::bench::{run, suite};
use crate::cli::BenchArgs;
use crate::config::BenchConfig;
use crate::error::{Error, Outcome, RuntimeError};

pub fn main(args: &BenchArgs) -> Result<Outcome, Error> {
    if let Some(benches) = BenchConfig::to_list(args)? {
        // A closed stdout loses the list; nothing else to do.
        let _ = write!(std::io::stdout(), "{}", suite::list(&benches));
        return Ok(Outcome::Clean);
    }
    let cfg = BenchConfig::check(args)?;
    let started = Instant::now();
    let r = run::run(&cfg)?;
    let goals = results::goals(&r, &cfg);
    let run = results::Run { cfg: &cfg, started };
    // A closed stdout loses the table, not the run (the JSON is written).
    let _ = write!(std::io::stdout(), "{}", results::table(&r, &goals, &run));
    let _ = std::io::stdout().flush();
    if cfg.json.is_some() || cfg.markdown.is_some() {
        let j = results::json(&r, &goals, &run).map_err(RuntimeError::BenchJson)?;
        if let Some(path) = &cfg.json {
            write(path, &j)?;
        }
        if let Some(path) = &cfg.markdown {
            write(path, &markdown_file(path, &j)?)?;
        }
    }
    // The table and the JSON say so too; the run did not do what was asked.
    if let Some(Err(e)) = &r.ftrace {
        return Err(RuntimeError::Measure(format!("boot/ftrace (i): {e}")).into());
    }
    Ok(Outcome::Clean)
}

/// `text` to `path`: atomically over a regular file, into a device,
/// nothing else.
fn write(path: &Path, text: &str) -> Result<(), Error> {
    tracer::trace::output_path::write(path, |w| w.write_all(text.as_bytes())).map_err(
        |source| RuntimeError::Write {
            path: path.to_path_buf(),
            source,
        },
    )?;
    Ok(())
}

/// What `--markdown FILE` writes: the figures table of the JSON document
/// `json`; into FILE's own figures block if it has one (docs/benchmarks.md),
/// the rest of it kept.
fn markdown_file(path: &Path, json: &str) -> Result<String, Error> {
    let doc: serde_json::Value = serde_json::from_str(json).map_err(RuntimeError::BenchJson)?;
    let table = markdown::from_json(&doc, &command(), &host(), &today())
        .map_err(RuntimeError::BenchMarkdown)?;
    let block = markdown::render_checked(&table).map_err(RuntimeError::BenchMarkdown)?;
    // Only a regular file is read: a device (a terminal) is written.
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return Ok(block);
    }
    let old = std::fs::read_to_string(path).map_err(|source| RuntimeError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(markdown::splice(&old, &block).unwrap_or(block))
}

/// This command line, as it could be typed again.
fn command() -> String {
    let args = std::env::args().skip(1).map(|a| {
        let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=,:@%+".contains(c);
        match a.chars().all(plain) && !a.is_empty() {
            true => a,
            false => format!("'{}'", a.replace('\'', r"'\''")),
        }
    });
    std::iter::once("vmtrace".to_string())
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The host, as far as it bears on the figures: its CPU, how many, its
/// kernel, whether its KVM emulates guest ring 0, and how busy it was (the
/// load averages at the run's end: other work on the host spreads the
/// times).
fn host() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| Some(l.strip_prefix("model name")?.split_once(':')?.1.trim()))
        .unwrap_or("unknown CPU");
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let kvm = match vmm::host::emulates_ring0() {
        true => "KVM emulates guest ring 0 (nested, kvm_pvm)",
        false => "hardware-virtualized KVM",
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "{model}, {cpus} CPUs, Linux {}, {kvm}; load average {} (1, 5, 15 minutes, at the run's end)",
        release.trim(),
        load.join(" ")
    )
}

/// Today's date, UTC.
fn today() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    date(secs)
}

/// The date of `secs` after the epoch, UTC, as YYYY-MM-DD.
fn date(secs: u64) -> String {
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} (UTC)")
}

#[cfg(test)]
mod tests {
    use super::date;

    #[test]
    fn bench_markdown_dates() {
        assert_eq!(date(0), "1970-01-01 (UTC)");
        assert_eq!(date(951_782_400), "2000-02-29 (UTC)");
        assert_eq!(date(1_795_924_800), "2026-11-29 (UTC)");
        assert_eq!(date(4_107_542_399), "2100-02-28 (UTC)");
    }
}
