/* mini: a tiny freestanding x86-64 guest whose call graph imitates a slice of
 * the Linux idle/hrtimer path, compiled with the kernel's ftrace flags. */
#ifndef MINI_H
#define MINI_H

typedef unsigned long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

/* Linux's notrace: gcc emits no __fentry__ NOP, hence no __mcount_loc site. */
#define notrace __attribute__((no_instrument_function))
/* Keep a function exactly as written: no inlining, cloning or IPA changes,
 * so its call site and caller stay what the source says. */
#define noipa __attribute__((noipa))
#define __init __attribute__((section(".init.text")))
#define __noreturn __attribute__((noreturn))

#define MINI_MAX_CPUS 64 /* entry.S has this many stacks */

/* Instructions workload.c's calibration_spin() executes per mode=loop
 * iteration with mini_spin = n (vmtrace bench relies on it: 2n more than
 * with n = 0). */
#define MINI_SPIN_INSNS(n) (3 + 2 * (u64)(n))

#define POWEROFF_PORT 0xf4
#define COM1_PORT 0x3f8
#define I8042_COMMAND_PORT 0x64
#define I8042_RESET 0xfe
#define END_TRIPLE_FAULT 1
#define END_RESET 2

struct mini_cfg {
	u64 iters;   /* iters=N */
	int loop;    /* mode=loop */
	int int3;    /* int3=1 */
	int end;     /* end=triple-fault|reset: vCPU 0 ends the run badly (for the VMM's tests) */
	int strio;   /* strio=1: vCPU 0 tests string port I/O (rep outsb / rep insb) */
};

/* support.c (all notrace) */
void serial_puts(const char *s);
void serial_putu(u64 v);
void print_lock(void);
void print_unlock(void);
void parse_cmdline(const char *s, struct mini_cfg *cfg);
void idt_load(void);
void int3_selftest(void);
void string_io_selftest(void);
void poweroff(u8 status) __noreturn;
void halt_forever(void) __noreturn;
void bad_end(int how) __noreturn;

/* workload.c */
void mini_main(u64 cpu, const char *cmdline, u64 ncpus) __noreturn;

#endif
