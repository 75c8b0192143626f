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

/* ---- tasks (README "Tasks") --------------------------------------------- */

/* args=1's functions (README "args=1"), in printed order. */
enum {
	A_args_six,
	A_args_errno,
	A_args_void,
	A_args_struct,
	A_args_seven,
	A_NR
};

/* stack=1's functions (README "stack=1"), in task-line order. */
enum {
	S_stack_leaf,
	S_stack_mid,
	S_stack_outer_a,
	S_stack_outer_b,
	S_stack_recurse,
	S_NR
};

/* Per-task call counters (struct task_struct's mini_calls[T_*]), in
 * the order of the task lines: the workload's, the graph workload's, the
 * args=1 functions, the stack=1 functions, the direct=1 functions, then
 * mini_main and mini_init_setup. */
enum {
	T_WORK = 0,		/* + F_* */
	T_GRAPH = F_NR,		/* + G_* */
	T_ARGS = F_NR + G_NR,	/* + A_* */
	T_STACK = T_ARGS + A_NR, /* + S_* */
	T_DIRECT = T_STACK + S_NR, /* + D_* */
	T_mini_main = T_DIRECT + D_NR,
	T_mini_init_setup,
	T_NR
};
_Static_assert(T_NR == MINI_TASK_FUNCS, "mini.h's MINI_TASK_FUNCS");

static const char *const args_fn_names[A_NR] = {
	"args_six",
	"args_errno",
	"args_void",
	"args_struct",
	"args_seven",
};

static const char *const stack_fn_names[S_NR] = {
	"stack_leaf",
	"stack_mid",
	"stack_outer_a",
	"stack_outer_b",
	"stack_recurse",
};

/* direct=1's functions (direct.S; README "direct=1"), in printed order. */
static const char *const direct_fn_names[D_NR] = {
	"direct_riprel",
	"direct_endbr",
	"direct_jcc",
	"direct_jump_into",
	"direct_table",
	"direct_extable",
};

/* Each vCPU's tasks: [0] its idle task, [1] mini-a, [2] mini-b. */
struct task_struct mini_tasks[MINI_MAX_CPUS][MINI_TASKS_PER_CPU];

/* This CPU's current task, read through GS as Linux's `current` is. */
static notrace inline __attribute__((always_inline)) struct task_struct *get_current(void)
{
	struct task_struct *t;

#ifdef MINI_PERCPU_ADDR
	asm volatile("movq %%gs:pcpu_hot+%c1, %0"
		     : "=r"(t)
		     : "i"(__builtin_offsetof(struct pcpu_hot, current_task)));
#else
	asm volatile("movq %%gs:current_task, %0" : "=r"(t));
#endif
	return t;
}

static notrace inline __attribute__((always_inline)) void set_current(struct task_struct *t)
{
#ifdef MINI_PERCPU_ADDR
	asm volatile("movq %0, %%gs:pcpu_hot+%c1"
		     :
		     : "r"(t), "i"(__builtin_offsetof(struct pcpu_hot, current_task))
		     : "memory");
#else
	asm volatile("movq %0, %%gs:current_task" : : "r"(t) : "memory");
#endif
}

/* One more call of traced function T_* by the current task (under its
 * current name). Every traced C function does this next to its per-CPU
 * count, so both count the same calls. */
static notrace inline __attribute__((always_inline)) void task_count(unsigned int f)
{
	get_current()->mini_calls[f]++;
}

/* The pids of vCPU cpu's workers: 1000 + 10 * cpu + 1 and + 2. */
static notrace u64 task_pid(u64 cpu, unsigned int k)
{
	return k == MINI_TASK_IDLE ? 0 : 1000 + 10 * cpu + k;
}

/* The name task k of vCPU cpu has under name number gen, without "/cpu". */
static notrace const char *task_prefix(unsigned int k, unsigned int gen)
{
	static const char *const prefix[MINI_TASKS_PER_CPU] = { "swapper", "mini-a", "mini-b" };

	return k == MINI_TASK_B && gen == 1 ? "mini-b2" : prefix[k];
}

/* comm = prefix "/" cpu, NUL-padded (cpu < 64: at most 11 bytes). */
static notrace void set_comm(struct task_struct *t, const char *prefix, u64 cpu)
{
	unsigned int n = 0;

	while (*prefix && n < TASK_COMM_LEN - 4)
		t->comm[n++] = *prefix++;
	t->comm[n++] = '/';
	if (cpu >= 10)
		t->comm[n++] = (char)('0' + cpu / 10 % 10);
	t->comm[n++] = (char)('0' + cpu % 10);
	while (n < TASK_COMM_LEN)
		t->comm[n++] = 0;
}

/* From entry.S on each vCPU, with GS set, before mini_main: its tasks, and
 * its idle task current (mini_main's entry is traced). */
notrace void mini_cpu_init(u64 cpu)
{
	struct task_struct *tasks = mini_tasks[cpu];

	for (unsigned int k = 0; k < MINI_TASKS_PER_CPU; k++) {
		struct task_struct *t = &tasks[k];

		t->__state = 0;
		t->flags = k == MINI_TASK_IDLE ? PF_IDLE : 0;
		t->stack = mini_stacks[cpu];
		t->prio = t->static_prio = t->normal_prio = k == MINI_TASK_IDLE ? 140 : 120;
		t->pid = (pid_t)task_pid(cpu, k);
		/* mini-b is a thread of mini-a's process. */
		t->tgid = (pid_t)task_pid(cpu, k == MINI_TASK_B ? MINI_TASK_A : k);
		t->real_parent = &tasks[MINI_TASK_IDLE];
		t->group_leader = &tasks[k == MINI_TASK_B ? MINI_TASK_A : k];
		set_comm(t, task_prefix(k, 0), cpu);
	}
	set_current(&tasks[MINI_TASK_IDLE]);
}

/* mini-b renames itself (exec or PR_SET_NAME): comm "mini-b2/cpu", its
 * calls counted apart from then on (those so far kept in
 * mini_calls_before). */
static notrace noipa void task_rename(struct task_struct *t, u64 cpu)
{
	for (unsigned int f = 0; f < T_NR; f++) {
		t->mini_calls_before[f] = t->mini_calls[f];
		t->mini_calls[f] = 0;
	}
	t->mini_renamed = 1;
	set_comm(t, task_prefix(MINI_TASK_B, 1), cpu);
}

/* ---- traced workload ---------------------------------------------------- */

noipa void hrtimer_start_range_ns(struct cpu *c)
{
	c->count[F_hrtimer_start_range_ns]++;
	task_count(T_WORK + F_hrtimer_start_range_ns);
}

noipa void schedule(struct cpu *c)
{
	c->count[F_schedule]++;
	task_count(T_WORK + F_schedule);
	hrtimer_start_range_ns(c);
}

noipa void hrtimer_try_to_cancel(struct cpu *c)
{
	c->count[F_hrtimer_try_to_cancel]++;
	task_count(T_WORK + F_hrtimer_try_to_cancel);
}

noipa void hrtimer_wakeup(struct cpu *c)
{
	c->count[F_hrtimer_wakeup]++;
	task_count(T_WORK + F_hrtimer_wakeup);
}

noipa void tick_sched_timer(struct cpu *c)
{
	c->count[F_tick_sched_timer]++;
	task_count(T_WORK + F_tick_sched_timer);
}

noipa void __hrtimer_run_queues(struct cpu *c)
{
	c->count[F___hrtimer_run_queues]++;
	task_count(T_WORK + F___hrtimer_run_queues);
	hrtimer_wakeup(c);
	tick_sched_timer(c);
}

noipa void hrtimer_interrupt(struct cpu *c)
{
	c->count[F_hrtimer_interrupt]++;
	task_count(T_WORK + F_hrtimer_interrupt);
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
	task_count(T_WORK + F_do_idle);
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
	task_count(T_GRAPH + G_graph_leaf);
}

noipa void graph_depth3(struct graph_cpu *c)
{
	c->count[G_graph_depth3]++;
	task_count(T_GRAPH + G_graph_depth3);
	graph_leaf(c);
}

noipa void graph_depth2(struct graph_cpu *c)
{
	c->count[G_graph_depth2]++;
	task_count(T_GRAPH + G_graph_depth2);
	graph_depth3(c);
}

noipa void graph_depth(struct graph_cpu *c)
{
	c->count[G_graph_depth]++;
	task_count(T_GRAPH + G_graph_depth);
	graph_depth2(c);
}

/* Reached only by entry.S's graph_tail_caller's `jmp`: [RSP] on entry is
 * graph_tail_caller's return address (into mini_main). */
noipa void graph_tail_callee(struct graph_cpu *c)
{
	c->count[G_graph_tail_callee]++;
	task_count(T_GRAPH + G_graph_tail_callee);
}

/* n + 1 calls nested n + 1 deep. The count comes after the recursive call
 * so the call can never become a jump or a loop. */
noipa void graph_recurse(struct graph_cpu *c, u64 n)
{
	if (n)
		graph_recurse(c, n - 1);
	c->count[G_graph_recurse]++;
	task_count(T_GRAPH + G_graph_recurse);
}

/* Never returns normally: graph_longjmp goes back into graph_abandon_run
 * (its caller), so this frame, return address slot included, is abandoned. */
noipa void graph_abandoned(struct graph_cpu *c)
{
	c->count[G_graph_abandoned]++;
	task_count(T_GRAPH + G_graph_abandoned);
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
	task_count(T_GRAPH + G_graph_abandon_outer);
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
	task_count(T_GRAPH + G_graph_long);
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
	/* entry.S's graph_tail_caller counts itself per CPU only (its code
	 * stays NOP, incq, jmp): its task's count here, after it returned
	 * (the same task: nothing switches tasks in between). */
	task_count(T_GRAPH + G_graph_tail_caller);
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
	task_count(T_GRAPH + G_graph_migrate); /* vCPU 0's current task */
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

/* ---- args=1: arguments and return values (README "args=1") ------------- */

/* A Linux-like enum with named values, passed by args_six. */
enum mini_state {
	MINI_STATE_IDLE = 0,
	MINI_STATE_RUNNING = 1,
	MINI_STATE_SLEEPING = 2,
	MINI_STATE_DEAD = 64,
};

/* A struct passed by value (16 bytes: in two registers, RDI and RSI). */
struct mini_pair {
	u64 key;
	u32 val;
};

/* What each args=1 function received and returned, per CPU: its calls, the
 * wrapping sums of each argument (sign-extended when signed) and of its
 * return values, and (args_errno) how often each return value came. */
#define ARGS_MAX 7
#define ERRNO_PATTERN 6
struct args_fn {
	u64 calls;
	u64 ret;
	u64 arg[ARGS_MAX];
};
struct args_cpu {
	struct args_fn fn[A_NR];
	u64 errno_rets[ERRNO_PATTERN];
} __attribute__((aligned(64)));

static struct args_cpu mini_args[MINI_MAX_CPUS];

/* args_errno(n) returns errno_pattern[n % 6]: 0, -ENOENT, 1, -EINVAL,
 * 4096, -EAGAIN. */
static const int errno_pattern[ERRNO_PATTERN] = { 0, -2, 1, -22, 4096, -11 };

/* How each function's sums are printed: its parameters' names (as in its
 * prototype), which are signed, whether it returns a value and whether
 * that is signed. */
static const struct {
	const char *param[ARGS_MAX];
	u8 nparams;
	u8 signed_params; /* bit k: param[k] is signed */
	u8 returns;
	u8 signed_ret;
} args_info[A_NR] = {
	[A_args_six] = { { "a", "b", "t", "s", "ch", "e" }, 6, 1 << 1 | 1 << 5, 1, 1 },
	[A_args_errno] = { { "n" }, 1, 0, 1, 1 },
	[A_args_void] = { { "n" }, 1, 0, 0, 0 },
	/* p's members, then after. */
	[A_args_struct] = { { "p.key", "p.val", "after" }, 3, 1 << 2, 1, 1 },
	[A_args_seven] = { { "a1", "a2", "a3", "a4", "a5", "a6", "a7" }, 7,
			   1 << 0 | 1 << 1 | 1 << 3 | 1 << 4 | 1 << 6, 1, 1 },
};

/* This CPU's sums. */
static notrace inline __attribute__((always_inline)) struct args_cpu *this_args(void)
{
	u32 cpu;

	asm volatile("movl %%gs:cpu_number, %0" : "=r"(cpu));
	return &mini_args[cpu];
}

/* Six arguments of mixed types, in RDI, ESI, RDX, ECX, R8B, R9; returns
 * e + b. */
noipa long args_six(u64 a, int b, struct task_struct *t, enum mini_state s, u8 ch, long e)
{
	struct args_fn *f = &this_args()->fn[A_args_six];
	long ret = (long)((u64)e + (u64)(long)b);

	task_count(T_ARGS + A_args_six);
	f->calls++;
	f->arg[0] += a;
	f->arg[1] += (u64)(long)b;
	f->arg[2] += (u64)t;
	f->arg[3] += (u64)s;
	f->arg[4] += ch;
	f->arg[5] += (u64)e;
	f->ret += (u64)ret;
	return ret;
}

/* Negative errnos and positive values, by n: errno_pattern[n % 6] (an int:
 * in EAX, RAX's upper half not sign-extended). */
noipa int args_errno(unsigned int n)
{
	struct args_cpu *p = this_args();
	struct args_fn *f = &p->fn[A_args_errno];
	unsigned int k = n % ERRNO_PATTERN;
	int ret = errno_pattern[k];

	task_count(T_ARGS + A_args_errno);
	f->calls++;
	f->arg[0] += n;
	f->ret += (u64)(long)ret;
	p->errno_rets[k]++;
	return ret;
}

/* Returns nothing. */
noipa void args_void(u64 n)
{
	struct args_fn *f = &this_args()->fn[A_args_void];

	task_count(T_ARGS + A_args_void);
	f->calls++;
	f->arg[0] += n;
}

/* A struct by value (p.key in RDI, p.val in ESI), then an int (EDX);
 * returns p.key + p.val + after. */
noipa long args_struct(struct mini_pair p, int after)
{
	struct args_fn *f = &this_args()->fn[A_args_struct];
	long ret = (long)(p.key + p.val + (u64)(long)after);

	task_count(T_ARGS + A_args_struct);
	f->calls++;
	f->arg[0] += p.key;
	f->arg[1] += p.val;
	f->arg[2] += (u64)(long)after;
	f->ret += (u64)ret;
	return ret;
}

/* Seven arguments: a1-a6 in registers, a7 on the stack (at RSP + 8 on
 * entry); returns their sum (wrapping). */
noipa long args_seven(int a1, long a2, u64 a3, int a4, long a5, u64 a6, long a7)
{
	struct args_fn *f = &this_args()->fn[A_args_seven];
	u64 v[ARGS_MAX] = { (u64)(long)a1, (u64)a2, a3, (u64)(long)a4, (u64)a5, a6, (u64)a7 };
	u64 ret = 0;

	task_count(T_ARGS + A_args_seven);
	f->calls++;
	for (int k = 0; k < ARGS_MAX; k++) {
		f->arg[k] += v[k];
		ret += v[k];
	}
	f->ret += ret;
	return (long)ret;
}

/* Iteration i's calls (inlined into mini_main, every call's caller), by
 * vCPU cpu's current task t: arguments from i, cpu and t (README). */
static notrace inline __attribute__((always_inline)) void args_iteration(u64 cpu, struct task_struct *t, u64 i)
{
	static const enum mini_state states[4] = {
		MINI_STATE_IDLE, MINI_STATE_RUNNING, MINI_STATE_SLEEPING, MINI_STATE_DEAD,
	};

	args_six(0xfedc000000000000 + (cpu << 32) + i, (int)(i % 7) - 3, t, states[i % 4],
		 (u8)(200 + i % 50), (long)(0 - 100003 * i - cpu));
	args_errno((unsigned int)i);
	args_void(i);
	args_struct((struct mini_pair){ .key = 0x5000 + i, .val = (u32)(i % 100) }, -(int)(i % 9));
	args_seven((int)i - 500, (long)(0 - 1000 * i), 0x7000000000 + i, -(int)(i % 13), (long)(i << 20),
		   ~i, (long)(0 - 7 - i));
}

/* ---- stack=1: known call chains (README "stack=1") ---------------------- */

/* The paths by which stack_leaf is called, in printed order. */
enum {
	P_outer_a,	/* mini_main -> stack_outer_a -> stack_mid -> stack_leaf */
	P_outer_b,	/* mini_main -> stack_outer_b -> stack_leaf */
	P_direct,	/* mini_main -> stack_leaf */
	P_recurse,	/* mini_main -> stack_recurse x STACK_RECURSE_DEPTH -> stack_leaf */
	P_NR
};

/* Each path's name and its chain at stack_leaf's entry: stack_leaf, then its
 * callers, innermost first, down to _start (whose call of mini_main is the
 * last return address: the frame above holds RBP 0). */
static const char *const stack_path_names[P_NR] = { "outer_a", "outer_b", "direct", "recurse" };
static const char *const stack_path_chains[P_NR] = {
	"stack_leaf,stack_mid,stack_outer_a,mini_main,_start",
	"stack_leaf,stack_outer_b,mini_main,_start",
	"stack_leaf,mini_main,_start",
	"stack_leaf,stack_recurse,stack_recurse,stack_recurse,mini_main,_start",
};
_Static_assert(STACK_RECURSE_DEPTH == 3, "stack_path_chains[P_recurse] has 3 stack_recurse");
/* The return addresses on each chain: its callers (one per comma above). */
static const u8 stack_path_frames[P_NR] = { 4, 3, 2, 2 + STACK_RECURSE_DEPTH };

/* Per CPU: stack_leaf's calls by path, counted by stack_leaf itself from
 * the path its caller passed down. */
struct stack_cpu {
	u64 leaf[P_NR];
} __attribute__((aligned(64)));

static struct stack_cpu mini_stack[MINI_MAX_CPUS];

extern const char _stext[], _etext[]; /* mini.ld */

/* A tracer's function graph (vmtrace --graph) replaces the return address
 * of each hooked call with its own return hook in the top 8 MiB of the
 * address space (vmtrace's code region starts at 0xffffffffff800000): such a
 * frame is still a frame, as the kernel's unwinders map ftrace's return
 * trampoline back (ftrace_graph_ret_addr). */
#define TRACER_HOOKS 0xffffffffff800000UL

/* Return addresses on the RBP chain from frame fp (a frame: saved RBP at
 * fp[0], return address at fp[1]) up to the frame whose saved RBP is 0
 * (mini_main's: entry.S clears RBP), or ~0 if the chain leaves fp's
 * 16 KiB stack, has a return address outside _stext.._etext (and not a
 * tracer's return hook) or is longer than 16. */
static notrace u64 stack_chain_frames(const u64 *fp)
{
	u64 stack = (u64)fp & ~(u64)(MINI_STACK_SIZE - 1), n = 0;

	while (fp) {
		if (((u64)fp & ~(u64)(MINI_STACK_SIZE - 1)) != stack || n == 16)
			return ~0UL;
		if ((fp[1] < (u64)_stext || fp[1] >= (u64)_etext) && fp[1] < TRACER_HOOKS)
			return ~0UL;
		n++;
		fp = (const u64 *)fp[0];
	}
	return n;
}

/* Not reached while the chains are sound. */
static notrace noipa __noreturn void stack_chain_broken(unsigned int path, u64 got)
{
	print_lock();
	serial_puts("mini: stack chain broken: path ");
	serial_puts(stack_path_names[path]);
	serial_puts(" frames ");
	serial_putu(got);
	serial_puts(" want ");
	serial_putu(stack_path_frames[path]);
	serial_puts("\n");
	poweroff(1);
}

/* Every function here is traced (has a site), built with frame pointers
 * like the rest (build.sh), and noipa: each edge is a real `call`, so each
 * chain is exactly as written. stack_leaf checks its own chain on every
 * call: stack_path_frames[path] return addresses up to RBP 0, else it says
 * so and powers off with status 1. */
noipa void stack_leaf(struct stack_cpu *s, unsigned int path)
{
	u64 got = stack_chain_frames(__builtin_frame_address(0));

	if (got != stack_path_frames[path])
		stack_chain_broken(path, got);
	s->leaf[path]++;
	task_count(T_STACK + S_stack_leaf);
}

/* The counts come after the calls, so no call can become a jump. */
noipa void stack_mid(struct stack_cpu *s)
{
	stack_leaf(s, P_outer_a);
	task_count(T_STACK + S_stack_mid);
}

noipa void stack_outer_a(struct stack_cpu *s)
{
	stack_mid(s);
	task_count(T_STACK + S_stack_outer_a);
}

noipa void stack_outer_b(struct stack_cpu *s)
{
	stack_leaf(s, P_outer_b);
	task_count(T_STACK + S_stack_outer_b);
}

/* n nested frames (n >= 1), the innermost calling stack_leaf. */
noipa void stack_recurse(struct stack_cpu *s, u64 n)
{
	if (n > 1)
		stack_recurse(s, n - 1);
	else
		stack_leaf(s, P_recurse);
	task_count(T_STACK + S_stack_recurse);
}

/* One iteration i of the stack workload, after do_idle (and the graph and
 * args calls). Inlined into mini_main, every chain's outermost caller. */
static notrace inline __attribute__((always_inline)) void stack_iteration(struct stack_cpu *s, u64 i)
{
	stack_outer_a(s);
	if (i % STACK_B_EVERY == 0)
		stack_outer_b(s);
	if (i % STACK_DIRECT_EVERY == 0)
		stack_leaf(s, P_direct);
	if (i % STACK_RECURSE_EVERY == 0)
		stack_recurse(s, STACK_RECURSE_DEPTH);
}

/* `mini: stack cpu C PATH N CHAIN` (README "stack=1"). */
static notrace void report_stack(u64 cpu)
{
	for (unsigned int p = 0; p < P_NR; p++) {
		serial_puts("mini: stack cpu ");
		serial_putu(cpu);
		serial_puts(" ");
		serial_puts(stack_path_names[p]);
		serial_puts(" ");
		serial_putu(mini_stack[cpu].leaf[p]);
		serial_puts(" ");
		serial_puts(stack_path_chains[p]);
		serial_puts("\n");
	}
}

/* ---- direct=1: functions crafted for direct entries (README "direct=1") -- */

struct direct_cpu mini_direct[MINI_MAX_CPUS];

/* direct.S increments count[D_*] at 8 * D_* from the struct's start. */
_Static_assert(__builtin_offsetof(struct direct_cpu, count) == 0, "count[] first");

/* Not reached while direct.S's functions run right (as written, or through
 * a tracer's relocated copy of their first instructions). */
static notrace noipa __noreturn void direct_bad(unsigned int d, u64 got, u64 want)
{
	print_lock();
	serial_puts("mini: ");
	serial_puts(direct_fn_names[d]);
	serial_puts(" bad: returned ");
	serial_putu(got);
	serial_puts(" want ");
	serial_putu(want);
	serial_puts("\n");
	poweroff(1);
}

/* One iteration i of the direct workload: D_k when i % (k + 1) == 0, so
 * each function has a count of its own (README). Each one's task count
 * is made here, after it returned (direct.S counts per CPU only), on the
 * same task. Inlined into mini_main, every call's caller. */
static notrace inline __attribute__((always_inline)) void direct_iteration(struct direct_cpu *d, u64 i)
{
	u64 r;

	r = direct_riprel(d);
	if (r != DIRECT_RIPREL_MAGIC)
		direct_bad(D_direct_riprel, r, DIRECT_RIPREL_MAGIC);
	task_count(T_DIRECT + D_direct_riprel);
	if (i % (D_direct_endbr + 1) == 0) {
		direct_endbr(d);
		task_count(T_DIRECT + D_direct_endbr);
	}
	if (i % (D_direct_jcc + 1) == 0) {
		r = direct_jcc(d, i);
		if (r != (i & 1))
			direct_bad(D_direct_jcc, r, i & 1);
		task_count(T_DIRECT + D_direct_jcc);
	}
	if (i % (D_direct_jump_into + 1) == 0) {
		r = direct_jump_into(d);
		if (r != 2)
			direct_bad(D_direct_jump_into, r, 2);
		task_count(T_DIRECT + D_direct_jump_into);
	}
	if (i % (D_direct_table + 1) == 0) {
		r = direct_table(d, i);
		if (r != i % DIRECT_TABLE_CASES)
			direct_bad(D_direct_table, r, i % DIRECT_TABLE_CASES);
		task_count(T_DIRECT + D_direct_table);
	}
	if (i % (D_direct_extable + 1) == 0) {
		r = direct_extable(d);
		if (r != d->count[D_direct_extable])
			direct_bad(D_direct_extable, r, d->count[D_direct_extable]);
		task_count(T_DIRECT + D_direct_extable);
	}
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
	task_count(T_mini_init_setup);
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

/* `mini: task cpu C pid P tgid T comm NAME calls F=N ...`: one line per task
 * and name it had, its nonzero counts in T_* order. */
static notrace void report_tasks(u64 cpu)
{
	for (unsigned int k = 0; k < MINI_TASKS_PER_CPU; k++) {
		const struct task_struct *t = &mini_tasks[cpu][k];

		for (unsigned int gen = 0; gen <= t->mini_renamed; gen++) {
			const u64 *calls = gen < t->mini_renamed ? t->mini_calls_before : t->mini_calls;

			serial_puts("mini: task cpu ");
			serial_putu(cpu);
			serial_puts(" pid ");
			serial_puti(t->pid);
			serial_puts(" tgid ");
			serial_puti(t->tgid);
			serial_puts(" comm ");
			serial_puts(task_prefix(k, gen));
			serial_puts("/");
			serial_putu(cpu);
			serial_puts(" calls");
			for (unsigned int f = 0; f < T_NR; f++) {
				const char *name = f < T_GRAPH		     ? fn_names[f]
						   : f < T_ARGS		     ? graph_fn_names[f - T_GRAPH]
						   : f < T_STACK	     ? args_fn_names[f - T_ARGS]
						   : f < T_DIRECT	     ? stack_fn_names[f - T_STACK]
						   : f < T_mini_main	     ? direct_fn_names[f - T_DIRECT]
						   : f == T_mini_main	     ? "mini_main"
									     : "mini_init_setup";

				if (!calls[f])
					continue;
				serial_puts(" ");
				serial_puts(name);
				serial_puts("=");
				serial_putu(calls[f]);
			}
			serial_puts("\n");
		}
	}
}

static notrace void put_value(u64 v, int is_signed)
{
	if (is_signed)
		serial_puti((long)v);
	else
		serial_putu(v);
}

/* `mini: args cpu C FUNC calls N KEY=SUM ...` (README "args=1"). */
static notrace void report_args(u64 cpu)
{
	const struct args_cpu *p = &mini_args[cpu];

	for (unsigned int a = 0; a < A_NR; a++) {
		const struct args_fn *f = &p->fn[a];

		serial_puts("mini: args cpu ");
		serial_putu(cpu);
		serial_puts(" ");
		serial_puts(args_fn_names[a]);
		serial_puts(" calls ");
		serial_putu(f->calls);
		if (args_info[a].returns) {
			serial_puts(" ret=");
			put_value(f->ret, args_info[a].signed_ret);
		}
		for (unsigned int k = 0; k < args_info[a].nparams; k++) {
			serial_puts(" ");
			serial_puts(args_info[a].param[k]);
			serial_puts("=");
			put_value(f->arg[k], args_info[a].signed_params >> k & 1);
		}
		if (a == A_args_errno) {
			for (unsigned int k = 0; k < ERRNO_PATTERN; k++) {
				serial_puts(" ret[");
				serial_puti(errno_pattern[k]);
				serial_puts("]=");
				serial_putu(p->errno_rets[k]);
			}
		}
		serial_puts("\n");
	}
}

static notrace void report(struct cpu *c, struct graph_cpu *g, const struct mini_cfg *cfg, u64 cpu)
{
	print_lock();
	for (int f = 0; f < F_NR; f++)
		report_line("mini: cpu ", cpu, fn_names[f], c->count[f]);
#ifdef MINI_RETHUNK
	report_line("mini: stat cpu ", cpu, "return_thunk_hits", mini_thunk_seen[cpu]);
#endif
	if (cfg->graph) {
		for (int f = 0; f < G_NR; f++)
			report_line("mini: cpu ", cpu, graph_fn_names[f], g->count[f]);
		/* Not function counts: their own prefix. */
		report_line("mini: stat cpu ", cpu, "graph_long_ticks_sum", g->long_ticks_sum);
		report_line("mini: stat cpu ", cpu, "graph_long_ticks_max", g->long_ticks_max);
		report_line("mini: stat cpu ", cpu, "graph_long_outer_ticks_sum", g->long_outer_ticks_sum);
	}
	if (cfg->direct)
		for (int d = 0; d < D_NR; d++)
			report_line("mini: cpu ", cpu, direct_fn_names[d], mini_direct[cpu].count[d]);
	report_tasks(cpu);
	if (cfg->args)
		report_args(cpu);
	if (cfg->stack)
		report_stack(cpu);
	serial_puts("mini: cpu ");
	serial_putu(cpu);
	serial_puts(" done\n");
	print_unlock();
}

/* The iterations of one vCPU: until mini_stop (loop) or cfg->iters, each
 * run by task i % 3 (t), mini-b renamed once, before the calls of the
 * first of its iterations i >= iters / 2 (README "Tasks"). Inlined with
 * constant loop, graph, args, stack and direct, so each combination is a
 * loop of its own and one without graph=1, args=1, stack=1 or direct=1
 * runs none of their instructions. */
static notrace inline __attribute__((always_inline)) void
workload(u64 cpu, const struct mini_cfg *cfg, const int loop, const int graph, const int args, const int stack,
	 const int direct)
{
	struct cpu *c = &mini_cpus[cpu];
	struct graph_cpu *g = &mini_graph[cpu];
	struct stack_cpu *s = &mini_stack[cpu];
	struct direct_cpu *d = &mini_direct[cpu];
	struct task_struct *tasks = mini_tasks[cpu], *t = tasks, *b = &tasks[MINI_TASK_B];
	u64 rename_at = cfg->iters / 2 + (MINI_TASKS_PER_CPU + MINI_TASK_B - cfg->iters / 2 % 3) % 3;
	u64 i;

	for (i = 0; loop ? !mini_stop : i < cfg->iters; i++) {
		set_current(t);
		if (i == rename_at)
			task_rename(b, cpu);
		do_idle(c, i);
		if (graph)
			graph_iteration(g, i);
		if (args)
			args_iteration(cpu, t, i);
		if (stack)
			stack_iteration(s, i);
		if (direct)
			direct_iteration(d, i);
		if (loop)
			calibration_spin();
		t = t == b ? tasks : t + 1;
	}
	/* The idle task again for what follows (graph_migrate, the report). */
	set_current(tasks);
}

/* workload() with constant graph, args, stack and direct: the
 * combination cfg asks for. */
static notrace inline __attribute__((always_inline)) void
workload_modes(u64 cpu, const struct mini_cfg *cfg, const int loop)
{
#define W(g, a, s, d)                                             \
	case (g) | (a) << 1 | (s) << 2 | (d) << 3:                \
		workload(cpu, cfg, loop, g, a, s, d);             \
		break
	switch ((cfg->graph ? 1 : 0) | (cfg->args ? 2 : 0) | (cfg->stack ? 4 : 0) | (cfg->direct ? 8 : 0)) {
	W(0, 0, 0, 0); W(1, 0, 0, 0); W(0, 1, 0, 0); W(1, 1, 0, 0);
	W(0, 0, 1, 0); W(1, 0, 1, 0); W(0, 1, 1, 0); W(1, 1, 1, 0);
	W(0, 0, 0, 1); W(1, 0, 0, 1); W(0, 1, 0, 1); W(1, 1, 0, 1);
	W(0, 0, 1, 1); W(1, 0, 1, 1); W(0, 1, 1, 1);
	default: workload(cpu, cfg, loop, 1, 1, 1, 1); break;
	}
#undef W
}

/* Called by entry.S on every vCPU with its own stack, after mini_cpu_init.
 * Traced (has a site). */
void mini_main(u64 cpu, const char *cmdline, u64 ncpus)
{
	struct cpu *c = &mini_cpus[cpu];
	struct graph_cpu *g = &mini_graph[cpu];
	struct mini_cfg cfg;

	task_count(T_mini_main);
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

	if (cfg.loop)
		workload_modes(cpu, &cfg, 1);
	else
		workload_modes(cpu, &cfg, 0);
	/* Once per run, after the loop: a call that moves from vCPU 0 to 1. */
	if (cfg.graph && ncpus >= 2) {
		if (cpu == 0)
			graph_migrate_start();
		else if (cpu == 1)
			graph_migrate_finish();
	}

#ifdef MINI_RETHUNK
	/* Read before report(), whose own returns would count. */
	asm volatile("movq %%gs:return_thunk_hits, %0" : "=r"(mini_thunk_seen[cpu]));
#endif
	report(c, g, &cfg, cpu);
	if (__atomic_add_fetch(&mini_done, 1, __ATOMIC_SEQ_CST) == ncpus) {
		print_lock();
		serial_puts("mini: all done\n");
		print_unlock();
		poweroff(0);
	}
	halt_forever();
}
