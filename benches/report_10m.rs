//! The text report (with callers) and the JSON export of a synthetic trace
//! of 10 million events over 500 functions, 4 vCPUs (goal: report <= 1 s).

mod common;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tracer::trace::report::{self, ReportOptions};

const EVENTS: u64 = 10_000_000;

fn report_10m(c: &mut Criterion) {
    let trace = common::synthetic_trace(EVENTS);
    let opts = ReportOptions {
        callers: true,
        ..ReportOptions::default()
    };
    let mut g = c.benchmark_group("report_10m");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    g.bench_function("render_with_callers", |b| {
        b.iter(|| report::render(&trace, &opts))
    });
    g.bench_function("json_export", |b| {
        b.iter(|| tracer::trace::export::write_json(&trace, std::io::sink()).unwrap())
    });
    g.finish();
}

criterion_group!(benches, report_10m);
criterion_main!(benches);
