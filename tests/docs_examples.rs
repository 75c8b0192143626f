//! Every example command line of README.md, docs/*.md (the changelog
//! aside) and each command's `--help` runs as written on a fresh clone:
//! vmtrace's own parser takes it (the binary with VMTRACE_PARSE_ONLY set,
//! which parses and exits), each kernel file it names is either under
//! guest/out (made by guest/build.sh, which the page names, and there
//! after CI built the guests) or named in the page's prose too (which says
//! what it is and how to get it), and the cheap ones run for real: `list`
//! on guest/out's kernels, runs of the mini guest. No guest but the mini.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A word of a shell command line, and whether any of it was quoted.
#[derive(Debug)]
struct Word {
    text: String,
    quoted: bool,
}

/// The commands of one shell line (split at `|`, `;`, `&&`, `||`), as
/// words; comments and redirections left out. None: not a shell line
/// (an unclosed quote).
fn commands(line: &str) -> Option<Vec<Vec<Word>>> {
    let mut out: Vec<Vec<Word>> = vec![Vec::new()];
    let mut cur: Option<Word> = None;
    let mut skip_next = false;
    let mut chars = line.chars().peekable();
    let end_word = |cur: &mut Option<Word>, out: &mut Vec<Vec<Word>>, skip: &mut bool| {
        if let Some(w) = cur.take() {
            if std::mem::take(skip) {
                return;
            }
            out.last_mut().unwrap().push(w);
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                let w = cur.get_or_insert(Word {
                    text: String::new(),
                    quoted: true,
                });
                w.quoted = true;
                loop {
                    match chars.next() {
                        None => return None,
                        Some(q) if q == c => break,
                        Some(ch) => w.text.push(ch),
                    }
                }
            }
            '\\' => {
                let ch = chars.next()?;
                cur.get_or_insert(Word {
                    text: String::new(),
                    quoted: true,
                })
                .text
                .push(ch);
            }
            c if c.is_whitespace() => end_word(&mut cur, &mut out, &mut skip_next),
            '#' if cur.is_none() => break,
            '|' | ';' | '&' => {
                end_word(&mut cur, &mut out, &mut skip_next);
                if chars.peek() == Some(&c) {
                    chars.next();
                }
                out.push(Vec::new());
            }
            '>' | '<' => {
                // `2>` and `>FILE`: the redirection and its file are no words.
                if cur.as_ref().is_some_and(|w| w.text == "2" && !w.quoted) {
                    cur = None;
                }
                end_word(&mut cur, &mut out, &mut skip_next);
                if chars.peek() == Some(&'&') {
                    chars.next();
                }
                skip_next = true;
            }
            c => cur
                .get_or_insert(Word {
                    text: String::new(),
                    quoted: false,
                })
                .text
                .push(c),
        }
    }
    end_word(&mut cur, &mut out, &mut skip_next);
    Some(out)
}

/// One example: where it is, and vmtrace's arguments.
#[derive(Debug)]
struct Example {
    place: String,
    args: Vec<String>,
}

/// The vmtrace commands of a line of code, unless it is a synopsis
/// (`[OPTIONS]`, `(A | B)`, `GLOB...`).
fn examples_in_line(place: &str, line: &str) -> Vec<Example> {
    let line = line.trim();
    let line = line.strip_prefix("$ ").unwrap_or(line);
    let Some(cmds) = commands(line) else {
        return Vec::new();
    };
    let synopsis = cmds.iter().flatten().any(|w| {
        !w.quoted && (w.text.starts_with('[') || w.text.starts_with('(') || w.text.contains("..."))
    });
    if synopsis {
        return Vec::new();
    }
    let mut out = Vec::new();
    for words in cmds {
        let mut w: Vec<&str> = words.iter().map(|w| w.text.as_str()).collect();
        if w.first() == Some(&"sudo") {
            w.remove(0);
        }
        let args = match w.as_slice() {
            ["vmtrace", rest @ ..] => rest,
            ["cargo", "run", "--release", "--", rest @ ..] => rest,
            _ => continue,
        };
        out.push(Example {
            place: place.to_string(),
            args: args.iter().map(|s| s.to_string()).collect(),
        });
    }
    out
}

/// The example commands of a Markdown page: fenced or indented code,
/// continuation lines (`\`) joined.
fn examples_in_page(name: &str, text: &str) -> Vec<Example> {
    let mut out = Vec::new();
    let mut fenced = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let code = fenced || line.starts_with("    ") || line.starts_with('\t');
        let (at, joined) = match pending.take() {
            Some((at, head)) => (at, format!("{head} {}", line.trim())),
            None if code => (i + 1, line.to_string()),
            None => continue,
        };
        if let Some(head) = joined.trim_end().strip_suffix('\\') {
            pending = Some((at, head.to_string()));
            continue;
        }
        out.extend(examples_in_line(&format!("{name}:{at}"), &joined));
    }
    out
}

/// The page's prose: every line that is not an example command.
fn prose(text: &str) -> String {
    text.lines()
        .filter(|l| examples_in_line("", l).is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The kernel files an example names.
fn files(args: &[String]) -> Vec<&str> {
    let mut out = Vec::new();
    for (i, a) in args.iter().enumerate() {
        for flag in ["--kernel", "--vmlinux", "--initrd"] {
            if a == flag {
                if let Some(v) = args.get(i + 1) {
                    out.push(v.as_str());
                }
            } else if let Some(v) = a.strip_prefix(&format!("{flag}=")) {
                out.push(v);
            }
        }
    }
    out
}

/// The guest/build.sh target that makes a guest/out file.
fn target_of(file: &str) -> &str {
    let rest = file.trim_start_matches("guest/out/");
    match rest.split_once('/') {
        // guest/out/debian-6.1/vmlinuz, guest/out/linux-noftrace/bzImage, ...
        Some((dir, _)) => dir,
        None if rest == "workload.cpio.gz" => "workload",
        None => match rest.strip_suffix(".elf") {
            Some(mini) => mini,
            None => "linux",
        },
    }
}

/// Make a guest/out file as its page says (`bash guest/build.sh TARGET`),
/// once: CI builds the guests but not the distribution kernels, which
/// their first user downloads.
fn build(target: &str) -> bool {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !built.iter().any(|t| t == target) {
        let st = Command::new("bash")
            .arg(root().join("guest/build.sh"))
            .arg(target)
            .status()
            .expect("run guest/build.sh");
        if !st.success() {
            return false;
        }
        built.push(target.to_string());
    }
    true
}

/// What is wrong with the files an example of `page` names: a guest/out
/// file the page does not say how to make (`guest/build.sh TARGET`), or
/// that the build does not make; any other file the page's prose does
/// not name.
fn file_problems(ex: &Example, page: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    for f in files(&ex.args) {
        if f.starts_with("guest/out/") {
            let target = target_of(f);
            // (Words as a reader sees them, whatever the line breaks.)
            let says = |p: &str| {
                let words = p.split_whitespace().collect::<Vec<_>>().join(" ");
                words.contains(&format!("guest/build.sh {target}"))
            };
            if page.is_some_and(|p| !says(p)) {
                out.push(format!(
                    "{}: {f}, but the page never says `guest/build.sh {target}`",
                    ex.place
                ));
            } else if !(root().join(f).exists() || (build(target) && root().join(f).exists())) {
                out.push(format!(
                    "{}: {f} is not made by `guest/build.sh {target}`",
                    ex.place
                ));
            }
            continue;
        }
        let name = Path::new(f)
            .file_name()
            .map_or(f.into(), |n| n.to_string_lossy());
        if let Some(p) = page {
            if !prose(p).contains(&*name) {
                out.push(format!(
                    "{}: {f} is a file nobody has, and the page does not say what it is or how to get it",
                    ex.place
                ));
            }
        }
    }
    out
}

fn vmtrace(args: &[String], parse_only: bool) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vmtrace"));
    c.args(args).current_dir(root());
    if parse_only {
        c.env("VMTRACE_PARSE_ONLY", "1");
    }
    c.output().expect("run vmtrace")
}

/// Why vmtrace's parser refuses an example, if it does.
fn parse_problem(ex: &Example) -> Option<String> {
    let o = vmtrace(&ex.args, true);
    (!o.status.success()).then(|| {
        format!(
            "{}: vmtrace {}: {}",
            ex.place,
            ex.args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        )
    })
}

fn pages() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md") && n != "CHANGELOG.md")
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(root().join(&n)).unwrap();
            (n, text)
        })
        .collect()
}

/// The commands whose `--help` ends in examples.
const COMMANDS: [&str; 9] = [
    "", "record", "report", "script", "list", "bench", "attach", "detach", "vms",
];

/// The examples of `vmtrace [COMMAND] --help`.
fn help_examples(command: &str) -> Vec<Example> {
    let mut args: Vec<String> = command.split_whitespace().map(String::from).collect();
    args.push("--help".into());
    let o = vmtrace(&args, false);
    assert!(o.status.success(), "vmtrace {args:?}");
    let text = String::from_utf8(o.stdout).unwrap();
    let Some((_, after)) = text.split_once("\nExamples:\n") else {
        return Vec::new();
    };
    let place = format!("vmtrace {command} --help").replace("  ", " ");
    after
        .lines()
        .take_while(|l| l.starts_with("  "))
        .flat_map(|l| examples_in_line(&place, l))
        .collect()
}

/// Every documented example parses and names only files one can have.
#[test]
fn every_documented_example_parses_and_names_files_one_can_get() {
    let mut problems = Vec::new();
    let mut count = 0;
    for (name, text) in pages() {
        for ex in examples_in_page(&name, &text) {
            count += 1;
            problems.extend(parse_problem(&ex));
            problems.extend(file_problems(&ex, Some(&text)));
        }
    }
    assert!(count >= 50, "only {count} examples found in the docs");
    for command in COMMANDS {
        let examples = help_examples(command);
        assert!(
            !examples.is_empty(),
            "vmtrace {command} --help has no examples"
        );
        for ex in examples {
            problems.extend(parse_problem(&ex));
            problems.extend(file_problems(&ex, None));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The cheap examples run for real: `list` of a guest/out kernel, runs of
/// the mini guest (and each `--help` above).
#[test]
fn cheap_examples_run() {
    let mut all: Vec<Example> = pages()
        .iter()
        .flat_map(|(n, t)| examples_in_page(n, t))
        .collect();
    for c in COMMANDS {
        all.extend(help_examples(c));
    }
    let cheap: Vec<&Example> = all
        .iter()
        .filter(|ex| {
            let files = files(&ex.args);
            let local = !files.is_empty() && files.iter().all(|f| f.starts_with("guest/out/"));
            let list = ex.args.first().map(String::as_str) == Some("list");
            let mini = files.iter().any(|f| f.starts_with("guest/out/mini"));
            local && (list || mini)
        })
        .collect();
    assert!(cheap.len() >= 5, "{cheap:?}");
    let mut problems = Vec::new();
    for ex in cheap {
        // What the page says to build first (the distribution kernels are
        // downloaded by their first user).
        for f in files(&ex.args) {
            if !root().join(f).exists() {
                assert!(build(target_of(f)), "guest/build.sh {}", target_of(f));
            }
        }
        let o = vmtrace(&ex.args, false);
        if !o.status.success() || o.stdout.is_empty() {
            problems.push(format!(
                "{}: vmtrace {}: exit {:?}: {}",
                ex.place,
                ex.args.join(" "),
                o.status.code(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The checks can fail: a misspelt flag, a file nobody has, a guest/out
/// file the build does not make are each found.
#[test]
fn broken_examples_are_found() {
    let page = "Build it with `guest/build.sh mini`:\n\n    \
                vmtrace --kernal guest/out/mini.elf --trace 'a*'   # misspelt\n    \
                vmtrace list 'a*' --kernel vmlinuz-6.1.0-56-cloud-amd64\n    \
                sudo vmtrace list 'a*' --kernel guest/out/nothing.elf | head\n\n\
                ```\nvmtrace [RUN OPTIONS] --trace GLOB...\n```\n";
    let ex = examples_in_page("page", page);
    assert_eq!(ex.len(), 3, "{ex:?}");
    assert!(parse_problem(&ex[0]).is_some());
    assert_eq!(parse_problem(&ex[1]), None);
    assert_eq!(file_problems(&ex[1], Some(page)).len(), 1);
    assert_eq!(
        ex[2].args.last().map(String::as_str),
        Some("guest/out/nothing.elf")
    );
    // The page says how to build mini.elf, not nothing.elf.
    assert_eq!(file_problems(&ex[2], Some(page)).len(), 1);
    assert_eq!(target_of("guest/out/nothing.elf"), "nothing");
    assert_eq!(target_of("guest/out/debian-6.1/vmlinuz"), "debian-6.1");
    assert_eq!(target_of("guest/out/initramfs.cpio.gz"), "linux");
    assert_eq!(target_of("guest/out/workload.cpio.gz"), "workload");
    // Said in the prose: a file the page explains is fine.
    let explained = format!("{page}\n`vmlinuz-6.1.0-56-cloud-amd64`: apt-get download it.\n");
    assert!(file_problems(&ex[1], Some(&explained)).is_empty());
}

#[test]
fn shell_lines_split_as_a_shell_does() {
    let c = commands(r#"a 'b c' "d" e\ f | g -x # h"#).unwrap();
    let words: Vec<Vec<&str>> = c
        .iter()
        .map(|ws| ws.iter().map(|w| w.text.as_str()).collect())
        .collect();
    assert_eq!(words, vec![vec!["a", "b c", "d", "e f"], vec!["g", "-x"]]);
    let c = commands("vmtrace report > out.txt 2>&1 && vmtrace script").unwrap();
    assert_eq!(c.len(), 2);
    assert_eq!(c[0].len(), 2, "{c:?}");
    assert!(commands("a 'b").is_none());
}
