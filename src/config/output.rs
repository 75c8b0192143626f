//! The output options, checked: what a traced run or `vmtrace report`
//! prints on stdout (the view), the data file it saves and the files it
//! exports. Every value is parsed first, then whether it applies: an option
//! that would do nothing here is refused, in one line naming it.

use std::path::{Path, PathBuf};

use tracer::trace::output_path::{self, Target};
use tracer::trace::report::{self, By, ReportOptions, Sort, TreeOptions};
use tracer::trace::window::Window;

use crate::cli::{
    ByKey, ExportArg, ExportFormat, Format, OutputArgs, SortKey, ViewArgs, WindowArgs,
};
use crate::datafile::DataPath;
use crate::error::InputError;

/// Where a traced run's results go.
#[derive(Clone, Debug)]
pub struct Output {
    /// What is printed on stdout; None for `record`, which prints no report.
    pub view: Option<View>,
    /// The data file (`-o FILE`; `record`: vmtrace.data by default).
    pub data: Option<DataPath>,
    pub exports: Vec<Export>,
    /// `report --time/--cpu`: the exports are of this part of the trace.
    /// (A run's exports and data file hold the whole trace.)
    pub export_window: Option<Window>,
    /// No live status line.
    pub quiet: bool,
}

/// What is printed on stdout.
#[derive(Clone, Debug)]
pub struct View {
    pub format: Format,
    pub report: ReportOptions,
    /// `--tree`: the call tree instead of the text report.
    pub tree: Option<TreeOptions>,
    /// `--time` (and `--cpu`): only this part of the trace is shown. The
    /// text report and the tree take `--cpu` alone themselves (in `report`
    /// and `tree`), which keeps their counts exact where a window's are of
    /// stored events only (`tracer::trace::window`).
    pub window: Option<Window>,
    /// `--time` and `--cpu` as given, for exports of the same part.
    pub asked: Option<Window>,
}

/// `--export FMT=FILE`, checked.
#[derive(Clone, Debug)]
pub struct Export {
    pub format: ExportFormat,
    pub path: PathBuf,
}

/// The option flags as typed, for messages.
const VIEW_FLAGS: [&str; 10] = [
    "--format",
    "--sort",
    "--by",
    "-g",
    "--percent-limit",
    "--tree",
    "--depth",
    "--threshold",
    "--time",
    "--cpu",
];

/// The view options that were given (in [`VIEW_FLAGS`]' order).
fn view_given(v: &ViewArgs) -> Vec<&'static str> {
    let given = [
        v.format.is_some(),
        v.sort.is_some(),
        v.by.is_some(),
        v.callers,
        v.percent_limit.is_some(),
        v.tree,
        v.depth.is_some(),
        v.threshold.is_some(),
        v.window.time.is_some(),
        v.window.cpu.is_some(),
    ];
    VIEW_FLAGS
        .iter()
        .zip(given)
        .filter_map(|(f, g)| g.then_some(*f))
        .collect()
}

/// The output options of a run that were given, view options included.
fn output_given(a: &OutputArgs) -> Vec<&'static str> {
    let mut given = Vec::new();
    if a.output.is_some() {
        given.push("-o");
    }
    if !a.export.is_empty() {
        given.push("--export");
    }
    given.extend(view_given(&a.view));
    if a.quiet {
        given.push("-q");
    }
    given
}

impl Output {
    /// The one-shot form (`vmtrace --kernel ...`): the view on stdout, and
    /// with `-o` the data file. None for an untraced run, which takes no
    /// output option.
    pub fn for_run(args: &OutputArgs, traced: bool) -> Result<Option<Output>, InputError> {
        let view = View::check(&args.view)?;
        if !traced {
            return match output_given(args).first() {
                Some(&flag) => Err(InputError::NeedsTrace { flag }),
                None => Ok(None),
            };
        }
        let data = args.output.as_ref().map(|path| DataPath {
            path: path.clone(),
            keep_old: false,
        });
        if let Some(d) = &data {
            check_path(&d.path, "-o")?;
        }
        let exports = check_exports(&args.export)?;
        Ok(Some(Output {
            view: Some(view),
            data,
            exports,
            export_window: None,
            quiet: args.quiet,
        }))
    }

    /// `vmtrace record`: the data file (vmtrace.data by default, the
    /// previous one kept as .old) and exports; no view.
    pub fn for_record(args: &OutputArgs) -> Result<Output, InputError> {
        View::parse(&args.view)?;
        if let Some(&flag) = view_given(&args.view).first() {
            return Err(InputError::RecordView { flag });
        }
        let path = args
            .output
            .clone()
            .unwrap_or_else(|| PathBuf::from(crate::cli::DEFAULT_DATA));
        check_path(&path, "-o")?;
        crate::datafile::check_keep_old(&path)?;
        let exports = check_exports(&args.export)?;
        Ok(Output {
            view: None,
            data: Some(DataPath {
                path,
                keep_old: true,
            }),
            exports,
            export_window: None,
            quiet: args.quiet,
        })
    }

    /// Every file this output writes, each with the option that names it.
    pub fn files(&self) -> Vec<(String, &Path)> {
        let mut files = Vec::new();
        if let Some(d) = &self.data {
            files.push(("-o".to_string(), d.path.as_path()));
        }
        for e in &self.exports {
            files.push((format!("--export {}", e.format.name()), e.path.as_path()));
        }
        files
    }

    /// The view asked for that only a function-graph trace has (`--tree`,
    /// `--format folded`, `--export folded=...`), if any: a run without
    /// `--graph`, or a saved trace without returns, cannot show it.
    pub fn graph_view(&self) -> Option<&'static str> {
        self.view.as_ref().and_then(View::graph_view).or_else(|| {
            self.exports
                .iter()
                .any(|e| e.format == ExportFormat::Folded)
                .then_some("--export folded")
        })
    }
}

/// The values of the view options, parsed.
struct Parsed {
    window: Option<Window>,
    threshold_ns: Option<u64>,
}

impl View {
    /// Parse every value (a bad one is refused wherever it was given).
    fn parse(args: &ViewArgs) -> Result<Parsed, InputError> {
        let window = window(&args.window)?;
        let threshold_ns = match &args.threshold {
            Some(t) => Some(report::duration::parse(t).map_err(InputError::Threshold)?),
            None => None,
        };
        if let Some(p) = args.percent_limit {
            if !(0.0..=100.0).contains(&p) {
                return Err(InputError::PercentLimit(p));
            }
        }
        Ok(Parsed {
            window,
            threshold_ns,
        })
    }

    /// `--by`, checked: the report by task has no durations and no callers.
    fn by(args: &ViewArgs) -> Result<By, InputError> {
        let by = match args.by.unwrap_or(ByKey::Function) {
            ByKey::Function => By::Function,
            ByKey::Task => By::Task,
        };
        if by == By::Task {
            // Task rows have stored calls and a name: no durations, no callers.
            let sort = args
                .sort
                .filter(|s| !matches!(s, SortKey::Count | SortKey::Name));
            if let Some(s) = sort {
                return Err(InputError::NotByTask { flag: sort_flag(s) });
            }
            if args.callers {
                return Err(InputError::NotByTask { flag: "-g" });
            }
        }
        Ok(by)
    }

    /// The view options, parsed and checked against each other: the text
    /// report's options need the text format, `--depth`/`--threshold` need
    /// `--tree`.
    pub fn check(args: &ViewArgs) -> Result<View, InputError> {
        let Parsed {
            window,
            threshold_ns,
        } = View::parse(args)?;
        let format = args.format.unwrap_or(Format::Text);
        if !args.tree {
            if args.depth.is_some() {
                return Err(InputError::NeedsTree { flag: "--depth" });
            }
            if threshold_ns.is_some() {
                return Err(InputError::NeedsTree {
                    flag: "--threshold",
                });
            }
        } else if format != Format::Text {
            return Err(InputError::TreeFormat {
                format: format_name(format),
            });
        }
        // The text report's own options: with another format, or with the
        // call tree printed instead of the report, they would do nothing.
        let report_only = [
            ("--sort", args.sort.is_some()),
            ("--by", args.by.is_some()),
            ("-g", args.callers),
            ("--percent-limit", args.percent_limit.is_some()),
        ];
        if let Some(&(flag, _)) = report_only.iter().find(|(_, given)| *given) {
            if format != Format::Text {
                return Err(InputError::TextOnly {
                    flag,
                    format: format_name(format),
                });
            }
            if args.tree {
                return Err(InputError::NotWithTree { flag });
            }
        }
        let by = View::by(args)?;
        let cpus = window.as_ref().and_then(|w| w.cpus.clone());
        let tree = args.tree.then(|| TreeOptions {
            cpus: cpus.clone(),
            depth: args.depth,
            threshold_ns: threshold_ns.unwrap_or(0),
        });
        // `--cpu` alone: the text views select the vCPUs themselves.
        let shown = window
            .clone()
            .filter(|w| format != Format::Text || w.time.is_some());
        Ok(View {
            format,
            report: ReportOptions {
                by,
                sort: match args.sort.unwrap_or(SortKey::Count) {
                    SortKey::Count => Sort::Count,
                    SortKey::Name => Sort::Name,
                    SortKey::Cpu => Sort::Cpu,
                    SortKey::Total => Sort::Total,
                    SortKey::SelfTime => Sort::SelfTime,
                    SortKey::Avg => Sort::Avg,
                    SortKey::Max => Sort::Max,
                },
                cpus,
                callers: args.callers,
                percent_limit: args.percent_limit,
                ..ReportOptions::default()
            },
            tree,
            window: shown,
            asked: window,
        })
    }

    /// See [`Output::graph_view`].
    pub fn graph_view(&self) -> Option<&'static str> {
        if self.tree.is_some() {
            Some("--tree")
        } else if self.format == Format::Folded {
            Some("--format folded")
        } else {
            None
        }
    }
}

/// `--sort KEY` as typed, for messages.
fn sort_flag(key: SortKey) -> &'static str {
    match key {
        SortKey::Count => "--sort count",
        SortKey::Name => "--sort name",
        SortKey::Cpu => "--sort cpu",
        SortKey::Total => "--sort total",
        SortKey::SelfTime => "--sort self",
        SortKey::Avg => "--sort avg",
        SortKey::Max => "--sort max",
    }
}

/// `--time` and `--cpu`: the part of the trace to keep, if restricted.
pub fn window(args: &WindowArgs) -> Result<Option<Window>, InputError> {
    let cpus = match &args.cpu {
        Some(list) => Some(report::parse_cpu_list(list).map_err(InputError::CpuList)?),
        None => None,
    };
    let time = match &args.time {
        Some(t) => Some(tracer::trace::window::parse_time(t).map_err(InputError::Time)?),
        None => None,
    };
    if time.is_none() && cpus.is_none() {
        return Ok(None);
    }
    Ok(Some(Window { time, cpus }))
}

/// The `--format` value as typed.
pub fn format_name(f: Format) -> &'static str {
    match f {
        Format::Text => "text",
        Format::Json => "json",
        Format::Csv => "csv",
        Format::Chrome => "chrome",
        Format::Folded => "folded",
    }
}

/// An output path, before anything runs: one `tracer::trace::output_path` will
/// write (a new or regular file, replaced atomically, or a character device
/// written into; a symlink followed; never a directory, FIFO, socket or
/// block device), in a writable directory with room for a start.
pub fn check_path(path: &Path, flag: &'static str) -> Result<Target, InputError> {
    output_path::check(path).map_err(|source| InputError::Output {
        flag,
        path: path.to_path_buf(),
        source,
    })
}

/// Every `--export`, checked as an output path.
fn check_exports(args: &[ExportArg]) -> Result<Vec<Export>, InputError> {
    args.iter()
        .map(|a| {
            check_path(&a.path, "--export")?;
            Ok(Export {
                format: a.format,
                path: a.path.clone(),
            })
        })
        .collect()
}

/// What a path names, for telling two outputs that would write the same
/// file apart from two that only look different (`./a`, `a`, a symlink).
#[derive(PartialEq, Eq)]
enum Identity {
    /// An existing file: device and inode.
    Inode(u64, u64),
    /// A new file: its directory's canonical path and its name.
    New(PathBuf),
}

fn identity(path: &Path) -> Option<Identity> {
    use std::os::unix::fs::MetadataExt;
    match output_path::target(path).ok()? {
        // A device is written into, never replaced: two outputs there
        // (`/dev/null`) clobber nothing.
        Target::Device(_) => None,
        Target::File { path, existing } => match existing {
            Some(_) => {
                let m = std::fs::metadata(&path).ok()?;
                Some(Identity::Inode(m.dev(), m.ino()))
            }
            None => {
                let dir = match path.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d,
                    _ => Path::new("."),
                };
                Some(Identity::New(
                    std::fs::canonicalize(dir).ok()?.join(path.file_name()?),
                ))
            }
        },
    }
}

/// No two of `files` (option, path) may write the same file: the second
/// write would replace the first.
pub fn distinct(files: &[(String, &Path)]) -> Result<(), InputError> {
    let ids: Vec<Option<Identity>> = files.iter().map(|(_, p)| identity(p)).collect();
    for (i, a) in ids.iter().enumerate() {
        let Some(a) = a else { continue };
        if let Some(j) = ids[..i].iter().position(|b| b.as_ref() == Some(a)) {
            return Err(InputError::SameOutput {
                first: files[j].0.clone(),
                second: files[i].0.clone(),
                path: files[i].1.to_path_buf(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn output_args(args: &[&str]) -> OutputArgs {
        let mut argv = vec!["vmtrace"];
        argv.extend_from_slice(args);
        crate::cli::Cli::parse_from(argv).output
    }

    #[test]
    fn text_report_options_need_the_text_format() {
        for (flag, args) in [
            ("--sort", &["--sort", "name"][..]),
            ("-g", &["-g"][..]),
            ("--percent-limit", &["--percent-limit", "5"][..]),
        ] {
            let mut a = vec!["--format", "json"];
            a.extend_from_slice(args);
            let e = View::check(&output_args(&a).view).unwrap_err().to_string();
            assert_eq!(
                e,
                format!(
                    "{flag} applies to the text report, not to --format json; drop one of them"
                )
            );
        }
        let e = View::check(&output_args(&["--tree", "--percent-limit", "1"]).view)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "--percent-limit applies to the text report, which --tree replaces; drop one of them"
        );
        let v = View::check(&output_args(&["--sort", "name", "-g"]).view).unwrap();
        assert_eq!(v.report.sort, Sort::Name);
        assert!(v.report.callers);
        assert_eq!(v.report.by, By::Function);
    }

    #[test]
    fn by_task_takes_count_or_name_and_no_callers() {
        let v = View::check(&output_args(&["--by", "task", "--sort", "name"]).view).unwrap();
        assert_eq!((v.report.by, v.report.sort), (By::Task, Sort::Name));
        let v = View::check(&output_args(&["--by", "task", "--percent-limit", "5"]).view).unwrap();
        assert_eq!((v.report.by, v.report.sort), (By::Task, Sort::Count));
        for (flag, args) in [
            ("--sort total", &["--sort", "total"][..]),
            ("--sort cpu", &["--sort", "cpu"][..]),
            ("-g", &["-g"][..]),
        ] {
            let mut a = vec!["--by", "task"];
            a.extend_from_slice(args);
            let e = View::check(&output_args(&a).view).unwrap_err().to_string();
            assert_eq!(
                e,
                format!(
                    "{flag} applies to the report by function; with --by task use --sort count \
                     or --sort name, without -g"
                )
            );
        }
        let e = View::check(&output_args(&["--by", "task", "--format", "csv"]).view)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "--by applies to the text report, not to --format csv; drop one of them"
        );
        let e = View::check(&output_args(&["--by", "task", "--tree"]).view)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "--by applies to the text report, which --tree replaces; drop one of them"
        );
    }

    #[test]
    fn an_untraced_run_takes_no_output_option() {
        for (flag, args) in [
            ("-o", &["-o", "x"][..]),
            ("--export", &["--export", "json=x"][..]),
            ("--format", &["--format", "csv"][..]),
            ("--sort", &["--sort", "name"][..]),
            ("--cpu", &["--cpu", "0"][..]),
            ("-g", &["-g"][..]),
            ("--tree", &["--tree"][..]),
            ("--percent-limit", &["--percent-limit", "1"][..]),
            ("-q", &["-q"][..]),
        ] {
            let e = Output::for_run(&output_args(args), false).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("{flag} needs --trace GLOB (it only applies to a traced run)")
            );
        }
        assert!(Output::for_run(&output_args(&[]), false).unwrap().is_none());
    }

    #[test]
    fn record_takes_no_view_option() {
        for (flag, args) in [
            ("--format", &["--format", "json"][..]),
            ("--sort", &["--sort", "name"][..]),
            ("--tree", &["--tree"][..]),
            ("--cpu", &["--cpu", "1"][..]),
        ] {
            let e = Output::for_record(&output_args(args)).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("{flag}: record prints no report; use `vmtrace report` afterwards")
            );
        }
    }

    #[test]
    fn percentages_are_0_to_100() {
        for bad in ["-1", "101", "NaN"] {
            let a = output_args(&[&format!("--percent-limit={bad}")]);
            assert!(
                matches!(View::check(&a.view), Err(InputError::PercentLimit(_))),
                "{bad}"
            );
        }
        let v = View::check(&output_args(&["--percent-limit", "0.5"]).view).unwrap();
        assert_eq!(v.report.percent_limit, Some(0.5));
    }

    #[test]
    fn the_same_file_twice_is_refused_a_device_twice_is_not() {
        let d = std::env::temp_dir().join(format!("vmtrace-distinct-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let a = d.join("a.json");
        let same = d.join(".").join("a.json");
        let e = distinct(&[("-o".into(), &a), ("--export json".into(), &same)])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("-o and --export json both name "), "{e}");
        std::fs::write(&a, b"x").unwrap();
        let link = d.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&a, &link).unwrap();
        assert!(distinct(&[("-o".into(), &a), ("--export csv".into(), &link)]).is_err());
        let b = d.join("b.json");
        assert!(distinct(&[("-o".into(), &a), ("--export csv".into(), &b)]).is_ok());
        let null = Path::new("/dev/null");
        assert!(distinct(&[("-o".into(), null), ("--export csv".into(), null)]).is_ok());
        let _ = std::fs::remove_dir_all(&d);
    }
}
