//! The workspace's layout rules (issue 23), checked on the source as text:
//! no import loops between a crate's modules (paths followed through `pub
//! use` re-exports to the file defining the item), the tracer's stages
//! using earlier stages only (stages.rs), no function over 80 lines without
//! a `Long:` comment saying why, no file over 650 lines besides its test-only
//! items, no type or module defined twice under one name. A small Rust
//! lexer reads the files; nothing is compiled.

mod lex;
mod loops;
mod sizes;
mod source;
mod stages;

use std::path::Path;

use loops::*;
use sizes::*;
use source::*;
use stages::*;

/// Lines a function may take (from `fn` to its closing brace).
pub const MAX_FN_LINES: usize = 80;
/// Lines a file may take besides its test-only items.
pub const MAX_FILE_LINES: usize = 650;

/// What is allowed to break a rule, each entry `(key, why)`; the key is what
/// the failure prints in brackets. `allow_lists_name_what_is_there` fails
/// when an entry no longer matches anything: remove it then.
///
/// Import loops, keyed by their files, sorted, joined by ` `.
const ALLOWED_LOOPS: &[(&str, &str)] = &[];

/// Long functions, keyed `file fn name`. These have no `Long:` comment
/// because their files are being rewritten (issue 23): empty this list then.
const ALLOWED_LONG_FNS: &[(&str, &str)] = &[];

/// Files over MAX_FILE_LINES besides their tests.
const ALLOWED_LONG_FILES: &[(&str, &str)] = &[];

/// Uses of a later stage of the tracer crate (see stages.rs), keyed
/// `from-file -> to-file`.
const ALLOWED_STAGE_USES: &[(&str, &str)] = &[];

/// Type names defined twice, and module names used in two crates.
const ALLOWED_DUPLICATES: &[(&str, &str)] = &[
    (
        "mod layout",
        "exitless's layout places its code and rings inside the private slot of vmm's \
         guest memory map: a part of it, named within plan/exitless/",
    ),
    (
        "mod advice",
        "the tracer's part of vmm's advice, one mechanism: its inputs and remedies, in words \
         that extend vmm's (`TracerWords: Words`), since vmm knows nothing of tracing",
    ),
];

/// A rule broken: `key` names it in the allow lists, `msg` says it.
pub struct Problem {
    pub key: String,
    pub msg: String,
}

/// Fails with every problem the allow list does not name.
fn report(what: &str, problems: Vec<Problem>, allowed: &[(&str, &str)]) {
    let left: Vec<String> = problems
        .into_iter()
        .filter(|p| !allowed.iter().any(|&(k, _)| k == p.key))
        .map(|p| format!("{} [{}]", p.msg, p.key))
        .collect();
    assert!(
        left.is_empty(),
        "{what}: {} found:\n{}",
        left.len(),
        left.join("\n")
    );
}

#[test]
fn no_import_loops() {
    report(
        "import loops",
        import_loop_problems(&workspace()),
        ALLOWED_LOOPS,
    );
}

#[test]
fn stages_use_earlier_stages_only() {
    report(
        "stage order",
        stage_problems(&workspace()),
        ALLOWED_STAGE_USES,
    );
}

#[test]
fn no_long_functions() {
    report(
        "long functions",
        long_fn_problems(&workspace()),
        ALLOWED_LONG_FNS,
    );
}

#[test]
fn no_long_files() {
    report(
        "long files",
        long_file_problems(&workspace()),
        ALLOWED_LONG_FILES,
    );
}

#[test]
fn no_duplicate_names() {
    report(
        "duplicate names",
        duplicate_problems(&workspace()),
        ALLOWED_DUPLICATES,
    );
}

#[test]
fn allow_lists_name_what_is_there() {
    let files = workspace();
    let lists = [
        ("ALLOWED_LOOPS", import_loop_problems(&files), ALLOWED_LOOPS),
        (
            "ALLOWED_STAGE_USES",
            stage_problems(&files),
            ALLOWED_STAGE_USES,
        ),
        (
            "ALLOWED_LONG_FNS",
            long_fn_problems(&files),
            ALLOWED_LONG_FNS,
        ),
        (
            "ALLOWED_LONG_FILES",
            long_file_problems(&files),
            ALLOWED_LONG_FILES,
        ),
        (
            "ALLOWED_DUPLICATES",
            duplicate_problems(&files),
            ALLOWED_DUPLICATES,
        ),
    ];
    let mut stale = Vec::new();
    for (list, problems, allowed) in lists {
        for (key, _) in allowed {
            if !problems.iter().any(|p| p.key == *key) {
                stale.push(format!("{list}: {key:?}"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "nothing matches these entries any more: remove them from their lists:\n{}",
        stale.join("\n")
    );
}

// ---------------------------------------------------------------- the checker's own tests

/// Files of crate `tracer` from (path under tracer/src, text).
fn synthetic(files: &[(&str, &str)]) -> Vec<File> {
    let krate = &CRATES[2];
    let mut out: Vec<File> = files
        .iter()
        .map(|&(p, src)| {
            let module = module_of(Path::new(p), krate);
            parse(format!("tracer/src/{p}"), krate.name, module, src)
        })
        .collect();
    mark_test_files(&mut out);
    out
}

#[test]
fn checker_finds_loops_but_not_a_parent_using_its_children() {
    let files = synthetic(&[
        ("lib.rs", "pub mod a; pub mod b; pub mod p;"),
        ("a.rs", "use crate::b::B;\npub struct A;"),
        // A path in code, through `super`, to a sibling's item.
        ("b.rs", "pub struct B;\nfn f() { let _ = super::a::A; }"),
        // A parent naming its children, and children naming their parent.
        (
            "p/mod.rs",
            "mod c;\nuse self::c::C;\npub fn g() { c::h(); }",
        ),
        ("p/c.rs", "use super::g;\npub struct C;\npub fn h() {}"),
        // A test module's imports are not the module's.
        (
            "p/d.rs",
            "#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}",
        ),
    ]);
    let problems = import_loop_problems(&files);
    let msgs: Vec<&str> = problems.iter().map(|p| p.msg.as_str()).collect();
    assert_eq!(
        msgs,
        ["import loop: tracer/src/a.rs -> tracer/src/b.rs -> tracer/src/a.rs"]
    );
    assert_eq!(problems[0].key, "tracer/src/a.rs tracer/src/b.rs");
}

/// A loop through a file that re-exports a sibling's item: the file named
/// in the path is depended on, not only the file defining the item.
#[test]
fn checker_finds_loops_through_re_exports() {
    let files = synthetic(&[
        ("lib.rs", "pub mod error; pub mod s;"),
        ("error.rs", "use crate::s::state::E;\npub struct Top;"),
        ("s/mod.rs", "pub mod error; pub mod state;"),
        ("s/error.rs", "pub struct E;"),
        (
            "s/state.rs",
            "pub use super::error::E;\nuse crate::error::Top;",
        ),
    ]);
    let problems = import_loop_problems(&files);
    let msgs: Vec<&str> = problems.iter().map(|p| p.msg.as_str()).collect();
    assert_eq!(
        msgs,
        ["import loop: tracer/src/error.rs -> tracer/src/s/state.rs -> tracer/src/error.rs"]
    );
}

#[test]
fn checker_counts_function_lines_past_strings_comments_and_tests() {
    let body = |n: usize| "    let _ = 1;\n".repeat(n);
    let src = format!(
        "pub fn short() {{\n{}}}\n\
         /// Docs.\n#[inline]\npub(crate) fn long() {{\n    let _ = r#\"}}\"#;\n    let _ = '{{';\n    \
         /* }} /* }} */ */\n    let _x: &'static str = \"}}\";\n{}}}\n\
         // Long: one table, read top to bottom.\nfn excused() {{\n{}}}\n\
         #[cfg(test)]\nmod tests {{\n    fn in_tests() {{\n{}    }}\n}}\n",
        body(78),
        body(81),
        body(90),
        body(90)
    );
    let files = synthetic(&[("lib.rs", &src)]);
    let fns = functions(&files[0]);
    let found: Vec<(&str, usize, bool)> = fns
        .iter()
        .map(|(n, _, l, ok)| (n.as_str(), *l, *ok))
        .collect();
    assert_eq!(
        found,
        [
            ("short", 80, false),
            ("long", 87, false),
            ("excused", 92, true)
        ]
    );
    let problems = long_fn_problems(&files);
    assert_eq!(
        problems.len(),
        1,
        "{:?}",
        problems.iter().map(|p| &p.msg).collect::<Vec<_>>()
    );
    assert_eq!(problems[0].key, "tracer/src/lib.rs long");
    // The file's lines end before its tests.
    assert_eq!(files[0].test_mod_line, Some(src.lines().count() - 94));
    assert_eq!(files[0].code_lines(), src.lines().count() - 95);
}

#[test]
fn checker_counts_file_lines_after_a_declared_test_module() {
    // A `#[cfg(test)] mod x;` at the top must not hide the code after it.
    let fns = "pub fn f() {}\n".repeat(1000);
    let src = format!("pub mod a;\n#[cfg(test)]\nmod kvm_tests;\n{fns}#[cfg(test)]\nmod tests {{\n    fn t() {{}}\n}}\n");
    let files = synthetic(&[("lib.rs", &src)]);
    let problems = long_file_problems(&files);
    let msgs: Vec<&str> = problems.iter().map(|p| p.msg.as_str()).collect();
    assert_eq!(
        msgs,
        ["long file: tracer/src/lib.rs has 1001 lines besides its tests (at most 650)"]
    );
}

#[test]
fn checker_finds_types_and_modules_named_twice() {
    let files = vec![
        parse(
            "vmm/src/payload.rs".into(),
            "vmm",
            vec!["payload".into()],
            "pub struct Payload;",
        ),
        parse(
            "tracer/src/payload.rs".into(),
            "tracer",
            vec!["payload".into()],
            "use vmm::payload::Payload;\npub struct Payload;",
        ),
        // Seen in one corner of its crate only: not a name readers meet.
        parse(
            "tracer/src/p/q.rs".into(),
            "tracer",
            vec!["p".into(), "q".into()],
            "pub(super) type Payload = u8;",
        ),
    ];
    let mut msgs: Vec<String> = duplicate_problems(&files)
        .into_iter()
        .map(|p| p.msg)
        .collect();
    msgs.sort();
    assert_eq!(
        msgs,
        [
            "duplicate module payload: tracer/src/payload.rs names vmm's vmm/src/payload.rs \
             (`vmm::payload::Payload`)"
                .to_string(),
            "duplicate module payload: vmm/src/payload.rs and tracer/src/payload.rs both define \
             Payload"
                .to_string(),
            "duplicate type name Payload: struct in vmm/src/payload.rs, struct in \
             tracer/src/payload.rs"
                .to_string(),
        ]
    );
}

#[test]
fn checker_follows_reexports_to_the_defining_file() {
    // kernel/find.rs names plan's TracePlan, defined in plan/build.rs and
    // re-exported by plan/mod.rs; build.rs names kernel::find's Site.
    let files = synthetic(&[
        ("lib.rs", "pub mod kernel; pub mod plan;"),
        ("kernel/mod.rs", "pub mod find;"),
        (
            "kernel/find.rs",
            "use crate::plan::TracePlan;\npub struct Site;",
        ),
        (
            "plan/mod.rs",
            "mod build;\nmod glob;\npub use build::{Note, TracePlan};\npub use glob::*;",
        ),
        (
            "plan/build.rs",
            "use crate::kernel::find::Site;\npub struct TracePlan;\npub struct Note;",
        ),
        // Through a glob re-export, and a path in code.
        (
            "plan/glob.rs",
            "pub fn g() { let _ = crate::kernel::find::Site; }",
        ),
        ("kernel/other.rs", "fn f() { crate::plan::g(); }"),
    ]);
    let msgs: Vec<String> = import_loop_problems(&files)
        .into_iter()
        .map(|p| p.msg)
        .collect();
    assert_eq!(
        msgs,
        [
            "import loop: tracer/src/kernel/find.rs -> tracer/src/plan/build.rs -> \
          tracer/src/kernel/find.rs"
        ]
    );
    let graph = import_graph(&files, "tracer");
    assert!(graph["tracer/src/kernel/other.rs"].contains("tracer/src/plan/glob.rs"));
}

#[test]
fn checker_finds_uses_of_later_stages() {
    let files = synthetic(&[
        (
            "lib.rs",
            "pub mod kernel; pub mod plan; pub mod session; pub mod trace;",
        ),
        ("kernel/mod.rs", "pub mod a;"),
        // Through plan's re-export: the file defining it is named.
        ("kernel/a.rs", "use crate::plan::P;\npub struct K;"),
        ("plan/mod.rs", "mod p;\npub use p::P;"),
        ("plan/p.rs", "use crate::kernel::a::K;\npub struct P;"),
        ("session/mod.rs", "pub mod s;"),
        // A session writes a Trace: trace's model and datafile it may use.
        (
            "session/s.rs",
            "use crate::trace::model::T;\nuse crate::trace::datafile::D;\n\
             fn f() { crate::trace::report::r(); }",
        ),
        (
            "trace/mod.rs",
            "pub mod model; pub mod datafile; pub mod report;",
        ),
        ("trace/model.rs", "pub struct T;"),
        ("trace/datafile.rs", "use crate::session::s;\npub struct D;"),
        ("trace/report.rs", "pub fn r() {}"),
    ]);
    let keys: Vec<String> = stage_problems(&files).into_iter().map(|p| p.key).collect();
    assert_eq!(
        keys,
        [
            "tracer/src/kernel/a.rs -> tracer/src/plan/p.rs",
            "tracer/src/session/s.rs -> tracer/src/trace/report.rs"
        ]
    );
}
