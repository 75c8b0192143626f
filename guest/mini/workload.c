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

/* graph=1: per-CPU counts and stats of the graph workload (struct cpu above
 * keeps its layout, which vmtrace's tests and bench read). */
struct graph_cpu mini_graph[MINI_MAX_CPUS];

/* entry.S's graph_tail_caller increments count[G_graph_tail_caller] at
 * 8 * G_graph_tail_caller from the struct's start. */
_Static_assert(__builtin_offsetof(struct graph_cpu, count) == 0, "count[] first");

/* Printed after fn_names' lines, in this order (matches G_* in mini.h). */
static const char *const graph_fn_names[G_NR] = {
	"graph_depth",
	"graph_depth2",
	"graph_depth3",
	"graph_leaf",
	"graph_tail_caller",
	"graph_tail_callee",
	"graph_recurse",
	"graph_abandon_outer",
	"graph_abandoned",
	"graph_long",
	"graph_migrate",
};

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

/* ---- graph=1 workload (README "graph=1") --------------------------------- */

/* Nested calls of known depth: graph_depth -> graph_depth2 -> graph_depth3
 * -> graph_leaf, every edge a real call (noipa: no inlining). */
noipa void graph_leaf(struct graph_cpu *c)
{
	c->count[G_graph_leaf]++;
}

noipa void graph_depth3(struct graph_cpu *c)
{
	c->count[G_graph_depth3]++;
	graph_leaf(c);
}

noipa void graph_depth2(struct graph_cpu *c)
{
	c->count[G_graph_depth2]++;
	graph_depth3(c);
}

noipa void graph_depth(struct graph_cpu *c)
{
	c->count[G_graph_depth]++;
	graph_depth2(c);
}

/* Reached only by entry.S's graph_tail_caller's `jmp`: [RSP] on entry is
 * graph_tail_caller's return address (into mini_main). */
noipa void graph_tail_callee(struct graph_cpu *c)
{
	c->count[G_graph_tail_callee]++;
}

/* n + 1 calls nested n + 1 deep. The count comes after the recursive call
 * so the call can never become a jump or a loop. */
noipa void graph_recurse(struct graph_cpu *c, u64 n)
{
	if (n)
		graph_recurse(c, n - 1);
	c->count[G_graph_recurse]++;
}

/* Never returns normally: graph_longjmp goes back into graph_abandon_run
 * (its caller), so this frame, return address slot included, is abandoned. */
noipa void graph_abandoned(struct graph_cpu *c)
{
	c->count[G_graph_abandoned]++;
	graph_longjmp(c->jb, 1);
}

/* notrace: the setjmp-like save, then a real call of graph_abandoned, whose
 * graph_longjmp makes graph_setjmp return again, with 1; this function then
 * returns normally to graph_abandon_outer. */
notrace noipa void graph_abandon_run(struct graph_cpu *c)
{
	if (graph_setjmp(c->jb) == 0) {
		graph_abandoned(c);
		/* Not reached: graph_abandoned returned normally. */
		print_lock();
		serial_puts("mini: graph_abandoned returned\n");
		poweroff(1);
	}
}

/* Traced and returns normally, right after the frame of its callee's callee
 * (graph_abandoned) was abandoned: the return of an outer frame. */
noipa void graph_abandon_outer(struct graph_cpu *c)
{
	c->count[G_graph_abandon_outer]++;
	graph_abandon_run(c);
}

static notrace inline __attribute__((always_inline)) u64 rdtsc(void)
{
	u32 lo, hi;

	asm volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return ((u64)hi << 32) | lo;
}

/* A long function: spins until the TSC has advanced by GRAPH_LONG_TICKS and
 * records its own duration, from the rdtsc at its start to the last rdtsc,
 * the one that ends the loop just before it returns. */
noipa void graph_long(struct graph_cpu *c)
{
	u64 t0 = rdtsc(), d;

	do
		d = rdtsc() - t0;
	while (d < GRAPH_LONG_TICKS);
	c->count[G_graph_long]++;
	c->long_ticks_sum += d;
	if (d > c->long_ticks_max)
		c->long_ticks_max = d;
}

/* One iteration i of the graph workload, after do_idle. Inlined into
 * mini_main, so mini_main is every caller here. */
static notrace inline __attribute__((always_inline)) void graph_iteration(struct graph_cpu *g, u64 i)
{
	graph_depth(g);
	graph_tail_caller(g);
	graph_recurse(g, GRAPH_RECURSE_DEPTH);
	if (i % GRAPH_ABANDON_EVERY == 0)
		graph_abandon_outer(g);
	if (i % GRAPH_LONG_EVERY == 0) {
		/* The caller's bracket of the call: vmtrace's entry and return
		 * stamps fall inside it. (Volatile asm keeps its order; the
		 * memory clobbers keep the call between the two rdtscs.) */
		u64 t0 = rdtsc();

		asm volatile("" ::: "memory");
		graph_long(g);
		asm volatile("" ::: "memory");
		g->long_outer_ticks_sum += rdtsc() - t0;
	}
}

/* ---- graph=1: a call that sleeps on vCPU 0 and returns on vCPU 1 --------- */

/* This vCPU's number, from its per-CPU area (GS base), as Linux reads it:
 * per vCPU, not per stack, so it changes when a context moves. */
static notrace inline __attribute__((always_inline)) u32 this_cpu(void)
{
	u32 cpu;

	asm volatile("movl %%gs:cpu_number, %0" : "=r"(cpu));
	return cpu;
}

/* The RSPs graph_switch stores and loads (0 = none yet). */
static struct {
	u64 boot_rsp[2];      /* vCPU 0's and vCPU 1's own contexts, while away */
	u64 task_rsp;         /* the task's initial context (see graph_migrate_start) */
	u64 sleep_rsp;        /* the task asleep in graph_migrate: set = vCPU 1 may resume it */
	u64 dead_rsp;         /* the task after it ended (never resumed) */
	u32 entered_cpu;
	u32 returned_cpu;
} migration;

/* Traced. Entered on vCPU 0 on the task stack; in the middle it "sleeps"
 * (switches vCPU 0 back to its own context, publishing its own), and vCPU 1
 * resumes it, so it returns on vCPU 1, on the same task stack. */
noipa void graph_migrate(struct graph_cpu *c)
{
	u32 cpu = this_cpu();

	c->count[G_graph_migrate]++; /* c: the entering CPU's (vCPU 0's) */
	migration.entered_cpu = cpu;
	graph_switch(&migration.sleep_rsp, &migration.boot_rsp[cpu]);
	migration.returned_cpu = this_cpu();
}

/* The task's code, on mini_task_stack: entered by graph_switch's `ret` on
 * vCPU 0 (with a zero return address above it, where a stack walk ends),
 * left on vCPU 1 by a switch back to vCPU 1's own context. */
static notrace noipa __noreturn void graph_task_main(void)
{
	graph_migrate(&mini_graph[this_cpu()]);
	graph_switch(&migration.dead_rsp, &migration.boot_rsp[this_cpu()]);
	halt_forever(); /* not reached: nothing resumes dead_rsp */
}

/* vCPU 0: start the task on mini_task_stack; back here when it sleeps. */
static notrace noipa void graph_migrate_start(void)
{
	u64 *top = mini_task_stack + MINI_STACK_SIZE / 8;

	/* The frame graph_switch pops: 6 callee-saved registers (0), then the
	 * address its `ret` goes to, then graph_task_main's own (fake, 0)
	 * return address, so graph_task_main starts with RSP = top - 8, as if
	 * called (RSP + 8 16-byte aligned). */
	top[-1] = 0;
	top[-2] = (u64)graph_task_main;
	for (int k = 3; k <= 8; k++)
		top[-k] = 0;
	migration.task_rsp = (u64)&top[-8];
	graph_switch(&migration.boot_rsp[0], &migration.task_rsp);
}

/* vCPU 1: wait for the task to sleep, resume it; back here when it ends,
 * then say where it was entered and where it returned. */
static notrace noipa void graph_migrate_finish(void)
{
	while (!__atomic_load_n(&migration.sleep_rsp, __ATOMIC_ACQUIRE))
		asm volatile("pause");
	graph_switch(&migration.boot_rsp[1], &migration.sleep_rsp);
	print_lock();
	serial_puts("mini: migrate entered_cpu ");
	serial_putu(migration.entered_cpu);
	serial_puts(" returned_cpu ");
	serial_putu(migration.returned_cpu);
	serial_puts("\n");
	print_unlock();
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

static notrace void report_line(const char *prefix, u64 cpu, const char *name, u64 n)
{
	serial_puts(prefix);
	serial_putu(cpu);
	serial_puts(" ");
	serial_puts(name);
	serial_puts(" ");
	serial_putu(n);
	serial_puts("\n");
}

#ifdef MINI_RETHUNK
/* Each CPU's returns through __x86_return_thunk up to its report. */
static u64 mini_thunk_seen[MINI_MAX_CPUS];
#endif

static notrace void report(struct cpu *c, struct graph_cpu *g, int graph, u64 cpu)
{
	print_lock();
	for (int f = 0; f < F_NR; f++)
		report_line("mini: cpu ", cpu, fn_names[f], c->count[f]);
#ifdef MINI_RETHUNK
	report_line("mini: stat cpu ", cpu, "return_thunk_hits", mini_thunk_seen[cpu]);
#endif
	if (graph) {
		for (int f = 0; f < G_NR; f++)
			report_line("mini: cpu ", cpu, graph_fn_names[f], g->count[f]);
		/* Not function counts: their own prefix. */
		report_line("mini: stat cpu ", cpu, "graph_long_ticks_sum", g->long_ticks_sum);
		report_line("mini: stat cpu ", cpu, "graph_long_ticks_max", g->long_ticks_max);
		report_line("mini: stat cpu ", cpu, "graph_long_outer_ticks_sum", g->long_outer_ticks_sum);
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
	struct graph_cpu *g = &mini_graph[cpu];
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

	/* graph=1 has loops of its own, so that without it each iteration runs
	 * exactly the instructions it always did. */
	if (cfg.loop && cfg.graph) {
		for (i = 0; !mini_stop; i++) {
			do_idle(c, i);
			graph_iteration(g, i);
			calibration_spin();
		}
	} else if (cfg.loop) {
		for (i = 0; !mini_stop; i++) {
			do_idle(c, i);
			calibration_spin();
		}
	} else if (cfg.graph) {
		for (i = 0; i < cfg.iters; i++) {
			do_idle(c, i);
			graph_iteration(g, i);
		}
	} else {
		for (i = 0; i < cfg.iters; i++)
			do_idle(c, i);
	}
	/* Once per run, after the loop: a call that moves from vCPU 0 to 1. */
	if (cfg.graph && ncpus >= 2) {
		if (cpu == 0)
			graph_migrate_start();
		else if (cpu == 1)
			graph_migrate_finish();
	}

#ifdef MINI_RETHUNK
	/* Read before report(), whose own returns would count. */
	asm volatile("movq %%gs:cpu_number+8, %0" : "=r"(mini_thunk_seen[cpu]));
#endif
	report(c, g, cfg.graph, cpu);
	if (__atomic_add_fetch(&mini_done, 1, __ATOMIC_SEQ_CST) == ncpus) {
		print_lock();
		serial_puts("mini: all done\n");
		print_unlock();
		poweroff(0);
	}
	halt_forever();
}
