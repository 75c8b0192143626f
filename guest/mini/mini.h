/* mini: a tiny freestanding x86-64 guest whose call graph imitates a slice of
 * the Linux idle/hrtimer path, compiled with the kernel's ftrace flags. */
#ifndef MINI_H
#define MINI_H

/* ---- shared with entry.S ------------------------------------------------ */

/* Every stack (the 64 per-vCPU stacks and graph_migrate's task stack) is one
 * 16 KiB region aligned to 16 KiB, like Linux's task stacks (THREAD_SIZE =
 * THREAD_ALIGN = 16 KiB on x86-64): a stack slot's address rounded down to
 * 16 KiB names the stack it is on. */
#define MINI_STACK_SIZE 16384
#define MINI_MAX_CPUS 64 /* entry.S has this many stacks */

/* Per-CPU data (README "Per-CPU data"): each vCPU's area is one
 * MINI_PERCPU_AREA-byte block of mini_percpu[] (.bss); GS base = the area
 * less __per_cpu_start, so `gs:sym` reads this CPU's copy of the per-CPU
 * variable sym, as in Linux. The template section (.data..percpu) must fit
 * in an area: mini.ld asserts it. */
#define MINI_PERCPU_SHIFT 6
#define MINI_PERCPU_AREA (1 << MINI_PERCPU_SHIFT)

/* Tasks (README "Tasks"): each vCPU has MINI_TASKS_PER_CPU tasks, its idle
 * task (index 0) and two workers; iteration i runs as task i % 3. Each
 * task counts the calls of every traced C function it made (MINI_TASK_FUNCS
 * counters), per name it had (mini-b renames itself once). */
#define MINI_TASKS_PER_CPU 3
#define MINI_TASK_IDLE 0
#define MINI_TASK_A 1
#define MINI_TASK_B 2
#define MINI_TASK_FUNCS 37

/* graph=1 workload (README "graph=1"). Indexes into struct graph_cpu's
 * count[] (at offset 0), in the order the counts are printed; entry.S's
 * graph_tail_caller increments count[G_graph_tail_caller] itself. */
#define G_graph_depth 0
#define G_graph_depth2 1
#define G_graph_depth3 2
#define G_graph_leaf 3
#define G_graph_tail_caller 4
#define G_graph_tail_callee 5
#define G_graph_recurse 6
#define G_graph_abandon_outer 7
#define G_graph_abandoned 8
#define G_graph_long 9
#define G_graph_migrate 10
#define G_NR 11

/* graph_recurse(c, n) is started with n = GRAPH_RECURSE_DEPTH and recurses
 * down to n = 0: GRAPH_RECURSE_DEPTH + 1 calls (6), nested 6 deep. */
#define GRAPH_RECURSE_DEPTH 5
/* Iteration i runs graph_abandon_outer (whose callee graph_abandoned is
 * abandoned by a longjmp) when i % GRAPH_ABANDON_EVERY == 0. */
#define GRAPH_ABANDON_EVERY 10
/* Iteration i runs graph_long when i % GRAPH_LONG_EVERY == 0; graph_long
 * spins until the TSC has advanced by at least GRAPH_LONG_TICKS (about
 * 0.75 ms at 2.7 GHz). */
#define GRAPH_LONG_EVERY 50
#define GRAPH_LONG_TICKS 2000000

/* stack=1 workload (README "stack=1"): iteration i calls stack_leaf through
 * stack_outer_a -> stack_mid every time, through stack_outer_b when
 * i % STACK_B_EVERY == 0, directly when i % STACK_DIRECT_EVERY == 0 and
 * through STACK_RECURSE_DEPTH nested stack_recurse frames when
 * i % STACK_RECURSE_EVERY == 0. */
#define STACK_B_EVERY 2
#define STACK_DIRECT_EVERY 4
#define STACK_RECURSE_EVERY 8
#define STACK_RECURSE_DEPTH 3

/* direct=1 (README "direct=1"): direct.S's functions, crafted for the
 * direct-entry rules. Indexes into struct direct_cpu's count[] (at offset
 * 0, which direct.S increments), in printed order; iteration i calls
 * function D_k when i % (D_k + 1) == 0: D_k is called ceil(N / (D_k + 1))
 * times in N iterations. */
#define D_direct_riprel 0	/* safe: its first instruction is RIP-relative */
#define D_direct_endbr 1	/* safe: endbr64, then the site at +4 */
#define D_direct_jcc 2		/* safe: a short jz among the displaced bytes */
#define D_direct_jump_into 3	/* refused: jump-into-site */
#define D_direct_table 4	/* refused: indirect-jump (a jump table) */
#define D_direct_extable 5	/* refused: ex-table (first instruction listed) */
#define D_NR 6
/* What direct_riprel's first instruction loads (RIP-relative) and returns. */
#define DIRECT_RIPREL_MAGIC 0x5eed0f0ddeadbeef
/* direct_table's jump table: 4 cases, case k returns k. */
#define DIRECT_TABLE_CASES 4

/* struct graph_jmp_buf (entry.S's graph_setjmp/graph_longjmp): byte offsets. */
#define GJB_RBX 0
#define GJB_RBP 8
#define GJB_R12 16
#define GJB_R13 24
#define GJB_R14 32
#define GJB_R15 40
#define GJB_RSP 48 /* the caller's RSP after graph_setjmp returns */
#define GJB_RIP 56 /* graph_setjmp's return address */
#define GJB_SIZE 64

#ifndef __ASSEMBLER__

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

/* Instructions workload.c's calibration_spin() executes per mode=loop
 * iteration with mini_spin = n (vmtrace bench relies on it: 2n more than
 * with n = 0). */
#define MINI_SPIN_INSNS(n) (3 + 2 * (u64)(n))

/* ---- tasks, as Linux lays them out (found by vmtrace from BTF) ---------- */

typedef int pid_t;
#define TASK_COMM_LEN 16
#define PF_IDLE 0x00000002 /* Linux's flag of the idle tasks */

/* A few of Linux's members (same names and types), pid, tgid and comm at
 * offsets away from 0, then the guest's own counters (mini_*). Each
 * vCPU's tasks are mini_tasks[cpu][0..2]; all run on the vCPU's stack. */
struct task_struct {
	unsigned int __state;		/* 0: running (TASK_RUNNING) */
	unsigned int flags;		/* PF_IDLE for the idle tasks */
	void *stack;			/* the vCPU's 16 KiB stack region */
	int prio;			/* 120 (nice 0), 140 for the idle tasks */
	int static_prio;
	int normal_prio;
	unsigned int rt_priority;	/* 0 */
	pid_t pid;
	pid_t tgid;
	struct task_struct *real_parent; /* the vCPU's idle task */
	struct task_struct *group_leader; /* mini-b's is mini-a */
	/* Calls of each traced C function (workload.c's T_* order) under its
	 * current name. */
	u64 mini_calls[MINI_TASK_FUNCS];
	char comm[TASK_COMM_LEN];
	unsigned int mini_renamed;	/* 1 once mini-b renamed itself */
	/* After a rename: the calls under its first name. */
	u64 mini_calls_before[MINI_TASK_FUNCS];
};

#ifdef MINI_PERCPU_ADDR
/* Linux 6.2+'s hot per-CPU data: the current task is a member (here after
 * another, so its offset is not 0), not a per-CPU variable of its own. */
struct pcpu_hot {
	u64 preempt_count;
	struct task_struct *current_task;
	u64 top_of_stack;
};
#endif

/* Linux's DEFINE_PER_CPU: a variable of the per-CPU template, reached only
 * as gs:name (support.c defines them). */
#define __percpu_var __attribute__((section(".data..percpu")))

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
	int graph;   /* graph=1: also run the function-graph workload (README) */
	int args;    /* args=1: also call the argument functions (README "args=1") */
	int stack;   /* stack=1: also run the known call chains (README "stack=1") */
	int direct;  /* direct=1: also call direct.S's functions (README "direct=1") */
};

/* support.c (all notrace) */
void serial_puts(const char *s);
void serial_putu(u64 v);
void serial_puti(long v);
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
void mini_cpu_init(u64 cpu);
void mini_main(u64 cpu, const char *cmdline, u64 ncpus) __noreturn;
extern u8 mini_stacks[MINI_MAX_CPUS][MINI_STACK_SIZE]; /* entry.S */

/* ---- graph=1 workload ---------------------------------------------------- */

/* Per-CPU state of the graph workload, one per vCPU in mini_graph[] (apart
 * from workload.c's struct cpu, whose layout vmtrace's tests and bench read). */
struct graph_cpu {
	u64 count[G_NR];     /* calls of each graph function (entry.S writes one) */
	u64 long_ticks_sum;  /* graph_long's own TSC-measured durations */
	u64 long_ticks_max;
	u64 long_outer_ticks_sum; /* the same calls, measured by their caller */
	u64 jb[GJB_SIZE / 8]; /* graph_abandon_run's graph_setjmp buffer */
} __attribute__((aligned(64)));

/* entry.S (all notrace: no NOP, no __mcount_loc entry, except
 * graph_tail_caller, which is traced) */
void graph_tail_caller(struct graph_cpu *c);	/* traced; ends in `jmp graph_tail_callee` */
/* Saves RBX, RBP, R12-R15, the caller's RSP and the return address in jb;
 * returns 0, and again 1 (or val) when graph_longjmp(jb, val) jumps back. */
int graph_setjmp(u64 *jb) __attribute__((returns_twice));
void graph_longjmp(u64 *jb, int val) __noreturn;
/* Pushes RBP, RBX, R12-R15, stores RSP in *save, loads RSP from *load, pops
 * them and returns: a context switch between two stacks. */
void graph_switch(u64 *save, const u64 *load);
extern u64 mini_task_stack[MINI_STACK_SIZE / 8]; /* 16 KiB, 16 KiB-aligned */

/* ---- direct=1 (direct.S, all notrace: no NOP in any build) --------------- */

/* Per-CPU counts of direct.S's functions, one per vCPU in mini_direct[]. */
struct direct_cpu {
	u64 count[D_NR];	/* each function increments its own */
} __attribute__((aligned(64)));

/* Each counts its call in c->count[D_*] (README "direct=1"). */
u64 direct_riprel(struct direct_cpu *c);		/* returns DIRECT_RIPREL_MAGIC */
void direct_endbr(struct direct_cpu *c);
u64 direct_jcc(struct direct_cpu *c, u64 i);		/* returns i & 1 */
u64 direct_jump_into(struct direct_cpu *c);		/* returns 2 */
u64 direct_table(struct direct_cpu *c, u64 i);		/* returns i % DIRECT_TABLE_CASES */
u64 direct_extable(struct direct_cpu *c);		/* returns its count after the call */

#endif /* !__ASSEMBLER__ */

#endif
