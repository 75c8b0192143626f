//! What is read from the kernel image before the guest runs: symbols and
//! their sources, ftrace call sites, function filters, KASLR offsets, the
//! running kernel's CPUs, and how kernel names are printed.

pub mod boot_patched;
pub mod btf;
pub mod bzimage;
pub mod calls;
pub mod cpus;
pub mod direct;
pub mod dwarf;
pub mod dwarf_prototype;
pub mod events;
pub mod filter;
pub mod filter_names;
pub mod find;
pub mod ftrace_records;
pub mod glob_syntax;
pub mod high_rings;
pub mod image_module;
pub mod kallsyms;
pub mod kaslr;
pub mod ko_file;
pub mod lowmem;
pub mod module_btf;
pub mod module_build_id;
pub mod module_files;
pub mod module_image;
pub mod module_notify;
pub mod module_orc;
pub mod module_tables;
pub mod module_walk;
pub mod modules;
pub mod names;
pub mod not_entry;
pub mod payload;
pub mod pci_hotplug;
pub mod percpu;
pub mod prototype;
pub mod sites;
pub mod stack_bounds;
pub mod symbol_index;
pub mod symbols;
pub mod task;
pub mod task_list;
pub mod top_table;
pub mod unwind;
pub mod vmlinux;
