//! Symbols and ftrace sites of the Linux guest: `KernelImage::load` +
//! `SiteTable::build` on guest/out/vmlinux (goal: <= 100 ms). Skipped, with a
//! message, when the vmlinux has not been built.

mod common;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tracer::kernel::sites::SiteTable;
use tracer::kernel::symbols::KernelImage;

fn load_sites(c: &mut Criterion) {
    let Some(vmlinux) = common::vmlinux() else {
        return;
    };
    let mut g = c.benchmark_group("load_sites");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    g.bench_function("vmlinux", |b| {
        b.iter(|| {
            let image = KernelImage::load(&vmlinux).unwrap();
            let sites = SiteTable::build(&image).unwrap();
            assert!(sites.len() > 1000);
            (image, sites)
        })
    });
    g.finish();
}

criterion_group!(benches, load_sites);
criterion_main!(benches);
