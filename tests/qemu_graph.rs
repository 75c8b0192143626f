//! `vmtrace attach --graph` against a real QEMU/TCG guest: every call of
//! the traced system call and every return counted exactly, across more
//! records than a ring holds (TCG makes the calls faster than the rings are
//! drained: the records beyond are counted, not stored), and a
//! second session on the same guest after a plain one (vmtrace's pages get
//! the same guest pages whatever a session maps: the guest's TLBs may still
//! hold the last session's translations).

mod common;

use common::attach::*;
use common::console::assert_no_complaint;
use common::guard::BAD;
use common::qemu::*;
use common::s;

const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];

/// One session: `--graph` if asked, `batches` x `go getpid n`, SIGINT.
fn session(guest: &QemuGuest, bz: &str, graph: bool, batches: u64, n: u64) -> serde_json::Value {
    let mut args = vec![
        "--kernel",
        bz,
        "--trace",
        "__x64_sys_getpid",
        "--format",
        "json",
    ];
    if graph {
        args.push("--graph");
    }
    let a = Attach::start(guest.qmp_socket(), &args).attached();
    for _ in 0..batches {
        guest.go("getpid", n).unwrap();
        // A chance for the drainer to free the ring between batches (TCG
        // makes a batch's calls within a millisecond); nothing below
        // depends on it.
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(
        e.stderr
            .contains("vmtrace's code and page-table entries taken out; the guest runs on"),
        "{}",
        e.stderr
    );
    assert_eq!(count_of(&e.counts(), &GETPID), batches * n, "{}", e.stdout);
    let j = e.json();
    // A plain session's calls fit its rings (8,192 records per vCPU).
    if !graph {
        assert_eq!(j["dropped"], 0, "{}", e.stdout);
    }
    assert!(j.get("unfinished").is_none(), "{}", e.stdout);
    j
}

#[test]
fn graph_attach_counts_calls_and_returns_exactly() {
    let (bz, _) = common::linux_61();
    let guest = QemuGuest::boot(QemuOpts::linux());
    let w = guest.wait_ready().unwrap();
    // Plain first: the graph session after it maps other region pages
    // (its return stubs and frame pool) at other addresses.
    session(&guest, s(&bz), false, 1, 3000);
    // 12 x 100 calls, 2,400 records: more than the graph's ring holds (256
    // 64-byte records per vCPU in the guest's free low pages), each batch
    // within it.
    let j = session(&guest, s(&bz), true, 12, 100);
    let (g, n) = (&j["graph"], |v: &serde_json::Value| v.as_u64().unwrap());
    // A call whose entry was recorded has its return hooked: returned and
    // recorded, or counted; one whose entry a full ring dropped has not.
    assert_eq!(n(&g["returns"]) + n(&j["dropped"]), 1200, "{j}");
    assert_eq!(
        n(&g["returns"]),
        n(&g["returns_stored"]) + n(&g["returns_dropped"]),
        "{j}"
    );
    assert_eq!(
        n(&j["events"]) - n(&j["dropped"]),
        n(&j["events_stored"]),
        "{j}"
    );
    assert_eq!(g["unmatched_returns"], 0, "{j}");
    assert_eq!(g["mismatched_returns"], 0, "{j}");
    assert_eq!(g["running"], 0, "{j}");
    // The rings were sized down to the guest's free low pages (said, with
    // the size asked), and every call or return not stored was counted
    // by vmtrace's code in the guest as finding its ring full.
    let d = &j["drops"];
    assert!(n(&d["ring_given"]) < n(&d["ring_asked"]), "{d}");
    let full: u64 = d["ring_full"].as_array().unwrap().iter().map(n).sum();
    assert_eq!(full, n(&j["dropped"]) + n(&g["returns_dropped"]), "{d}");
    assert_eq!(n(&d["over_budget"]), 0, "{d}");
    // And plain again: the graph's pages gave back what they held.
    session(&guest, s(&bz), false, 1, 500);
    guest.send_line("ping");
    guest.wait_for("workload: pong", COMMAND_TIMEOUT).unwrap();
    same_graph_in_trap_mode(&guest, s(&bz), w.worker);
}

/// The function graph in trap mode (a breakpoint at each return address
/// awaited: nothing written) gives what the exitless graph gives: the
/// same calls and returns of getpid, each returning the worker's pid.
/// (Refused before: the graph needed vmtrace's code in guest memory.)
fn same_graph_in_trap_mode(guest: &QemuGuest, bz: &str, pid: u32) {
    let getpid = |mode: &str| {
        let args = [
            "--kernel", bz, "--mode", mode, "--graph", "--retval", "--format", "json",
        ];
        let mut a = Attach::start(
            guest.qmp_socket(),
            &[&args[..], &["--trace", "__x64_sys_getpid"]].concat(),
        );
        a.wait_line("vmtrace: attached to QEMU");
        guest.go("getpid", 40).unwrap();
        a.signal(libc::SIGINT);
        let e = a.end();
        assert!(e.status.success(), "{mode}: {}: {}", e.status, e.stderr);
        let j = e.json();
        let f = j["functions"]
            .as_array()
            .and_then(|fs| {
                fs.iter()
                    .find(|f| GETPID.contains(&f["name"].as_str().unwrap_or_default()))
            })
            .cloned()
            .unwrap_or_else(|| panic!("{mode}: no getpid in {j}"));
        let values = f["return_values"].clone();
        (
            f["count"].clone(),
            f["returns"].clone(),
            values,
            j["graph"]["unmatched_returns"].clone(),
        )
    };
    let exitless = getpid("exitless");
    let trap = getpid("trap");
    assert_eq!(trap, exitless);
    let want = serde_json::json!([{ "count": 40, "value": pid.to_string() }]);
    assert_eq!(
        (&trap.0, &trap.1, &trap.2, &trap.3),
        (&40.into(), &40.into(), &want, &0.into())
    );
}

/// A function-graph call still in flight at the detach (the worker asleep
/// in `read`, its return hooked) keeps vmtrace's code mapped, said at the
/// detach; a later attach finds it and refuses before writing anything;
/// the sleeping call returns through it, and the guest runs on.
#[test]
fn graph_call_in_flight_keeps_the_code_and_a_later_attach_refuses() {
    let (bz, _) = common::linux_61();
    let guest = QemuGuest::boot(QemuOpts::linux());
    let w = guest.wait_ready().unwrap();
    let args = ["--kernel", s(&bz), "--trace", "__x64_sys_read", "--graph"];
    let a = Attach::start(guest.qmp_socket(), &args).attached();
    // The worker leaves the read it sleeps in (not hooked: it began
    // before the attach), answers, and sleeps in a hooked one.
    guest.send_line("ping");
    guest
        .wait_for(&format!("workload: pong pid={}", w.worker), COMMAND_TIMEOUT)
        .unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(
        e.stderr.contains(
            "vmtrace's code and rings left mapped in the guest's unused memory (1 hooked calls \
             had not returned, and return through it); the guest runs on"
        ),
        "{}",
        e.stderr
    );
    let again = Attach::start(
        guest.qmp_socket(),
        &["--kernel", s(&bz), "--trace", "__x64_sys_getpid"],
    )
    .end();
    assert_eq!(again.status.code(), Some(2), "{}", again.stderr);
    // The detach kept its journal: the region is vmtrace's, for
    // `vmtrace detach` to take out once the call returned.
    assert!(
        again
            .stderr
            .contains("repair it first with `vmtrace detach --qmp"),
        "{}",
        again.stderr
    );
    assert_eq!(again.stderr.lines().count(), 1, "{}", again.stderr);
    // The hooked read returns through vmtrace's code: the guest runs on.
    guest.go("getpid", 10).unwrap();
    guest.send_line("ping");
    guest.wait_for("workload: pong", COMMAND_TIMEOUT).unwrap();
    assert_no_complaint(&guest.console(), &BAD, "");
}
