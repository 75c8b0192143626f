/* The traced workload: each function below (except the notrace ones) starts
 * with gcc's 5-byte __fentry__ NOP and is listed in __mcount_loc. The nesting
 * mirrors the kernel's idle/hrtimer path; the VMM checks callers from the
 * return address, so every call here must stay a real `call`. */
#include "mini.h"

enum {
	F_do_idle,
	F_schedule,
	F_hrtimer_start_range_ns,
	F_hrtimer_try_to_cancel,
	F_hrtimer_interrupt,
	F___hrtimer_run_queues,
	F_hrtimer_wakeup,
	F_tick_sched_timer,
	F_NR
};

/* Printed in this order (matches the enum). */
static const char *const fn_names[F_NR] = {
	"do_idle",
	"schedule",
	"hrtimer_start_range_ns",
	"hrtimer_try_to_cancel",
	"hrtimer_interrupt",
	"__hrtimer_run_queues",
	"hrtimer_wakeup",
	"tick_sched_timer",
};

struct cpu {
	u64 count[F_NR];
	u64 accounted; /* mini_account calls (untraced, not printed) */
} __attribute__((aligned(64))); /* one cache line apart: no false sharing */

static struct cpu mini_cpus[MINI_MAX_CPUS];

/* Set by the VMM from outside to end mode=loop. */
volatile unsigned int mini_stop __attribute__((aligned(4)));

/* Set by the VMM from outside (under a pause) to make each mode=loop
 * iteration also run MINI_SPIN_INSNS(mini_spin) instructions of
 * calibration_spin(): `vmtrace bench` times them to find what one guest
 * instruction costs. 0 (the default) adds only 3 instructions, no call. */
volatile unsigned int mini_spin __attribute__((aligned(4)));

/* vCPUs that have printed "done"; the last one powers off. */
static unsigned int mini_done;

/* ---- traced workload ---------------------------------------------------- */

noipa void hrtimer_start_range_ns(struct cpu *c)
{
	c->count[F_hrtimer_start_range_ns]++;
}

noipa void schedule(struct cpu *c)
{
	c->count[F_schedule]++;
	hrtimer_start_range_ns(c);
}

noipa void hrtimer_try_to_cancel(struct cpu *c)
{
	c->count[F_hrtimer_try_to_cancel]++;
}

noipa void hrtimer_wakeup(struct cpu *c)
{
	c->count[F_hrtimer_wakeup]++;
}

noipa void tick_sched_timer(struct cpu *c)
{
	c->count[F_tick_sched_timer]++;
}

noipa void __hrtimer_run_queues(struct cpu *c)
{
	c->count[F___hrtimer_run_queues]++;
	hrtimer_wakeup(c);
	tick_sched_timer(c);
}

noipa void hrtimer_interrupt(struct cpu *c)
{
	c->count[F_hrtimer_interrupt]++;
	__hrtimer_run_queues(c);
}

/* Untraced on purpose: a called function that has no site. */
notrace noipa void mini_account(struct cpu *c)
{
	c->accounted++;
}

noipa void do_idle(struct cpu *c, u64 i)
{
	c->count[F_do_idle]++;
	schedule(c);
	if (i % 2 == 0)
		hrtimer_try_to_cancel(c);
	hrtimer_interrupt(c);
	if (i % 3 == 0)
		mini_account(c);
}

/* ---- calibration --------------------------------------------------------- */

/* Exactly MINI_SPIN_INSNS(n) instructions for n = mini_spin read once:
 * mov, test, jz (taken when n is 0, so the loop never runs 2^32 times), then
 * n times dec + jnz. No call and no memory access in the loop, so nothing
 * here is a site or can trap; spin n costs 2n instructions more than spin 0. */
static notrace inline __attribute__((always_inline)) void calibration_spin(void)
{
	asm volatile("movl %0, %%ecx\n\t"
		     "testl %%ecx, %%ecx\n\t"
		     "jz 2f\n"
		     "1:\n\t"
		     "decl %%ecx\n\t"
		     "jnz 1b\n"
		     "2:"
		     :
		     : "m"(mini_spin)
		     : "ecx", "cc");
}

/* ---- boot --------------------------------------------------------------- */

/* Like Linux's __init code: one traced site outside _stext.._etext. */
__init noipa void mini_init_setup(const struct mini_cfg *cfg, u64 ncpus)
{
	print_lock();
	serial_puts("mini: start cpus=");
	serial_putu(ncpus);
	serial_puts(" iters=");
	serial_putu(cfg->iters);
	serial_puts(cfg->loop ? " mode=loop\n" : " mode=count\n");
	print_unlock();
}

static notrace void report(struct cpu *c, u64 cpu)
{
	print_lock();
	for (int f = 0; f < F_NR; f++) {
		serial_puts("mini: cpu ");
		serial_putu(cpu);
		serial_puts(" ");
		serial_puts(fn_names[f]);
		serial_puts(" ");
		serial_putu(c->count[f]);
		serial_puts("\n");
	}
	serial_puts("mini: cpu ");
	serial_putu(cpu);
	serial_puts(" done\n");
	print_unlock();
}

/* Called by entry.S on every vCPU with its own stack. Traced (has a site). */
void mini_main(u64 cpu, const char *cmdline, u64 ncpus)
{
	struct cpu *c = &mini_cpus[cpu];
	struct mini_cfg cfg;
	u64 i;

	if (ncpus == 0)
		ncpus = 1;
	if (ncpus > MINI_MAX_CPUS)
		ncpus = MINI_MAX_CPUS; /* entry.S parks vCPUs >= 64 */

	/* Every vCPU parses for itself, so none waits for vCPU 0. */
	parse_cmdline(cmdline, &cfg);
	if (cpu == 0)
		mini_init_setup(&cfg, ncpus);
	if (cfg.end && cpu == 0)
		bad_end(cfg.end);
	if (cfg.int3) {
		idt_load();
		if (cpu == 0)
			int3_selftest();
	}
	if (cfg.strio && cpu == 0)
		string_io_selftest();

	if (cfg.loop) {
		for (i = 0; !mini_stop; i++) {
			do_idle(c, i);
			calibration_spin();
		}
	} else {
		for (i = 0; i < cfg.iters; i++)
			do_idle(c, i);
	}

	report(c, cpu);
	if (__atomic_add_fetch(&mini_done, 1, __ATOMIC_SEQ_CST) == ncpus) {
		print_lock();
		serial_puts("mini: all done\n");
		print_unlock();
		poweroff(0);
	}
	halt_forever();
}
