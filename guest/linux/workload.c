/*
 * /init of the workload initramfs (guest/out/workload.cpio.gz): a guest
 * program with a known pid that makes a known system call exactly N times
 * when told to on the serial console, for tests that trace a running guest
 * (tests/qemu_guest.rs, the QEMU attach tests).
 *
 * Built by `bash guest/build.sh workload` with
 *   gcc -static -nostdlib -ffreestanding -fno-pie -no-pie -Os ...
 * No libc: every system call the program makes is one written below, so a
 * trace of the worker between a command and its `done` line holds only the
 * calls asked for, the read of the command and the write of the answer.
 *
 * pid 1 forks the worker and then only reaps children (init never exits).
 * The worker names itself `wl-worker` (prctl PR_SET_NAME), turns the
 * console's echo off (canonical mode stays: one read, one line), prints
 *   workload: ready pid=1 worker=W comm=wl-worker
 * and then runs one command per console line:
 *   go getpid N    getpid(2) N times     -> workload: done getpid N pid=W
 *   go getppid N   getppid(2) N times    -> workload: done getppid N pid=W
 *   go openat N    openat(2) of a missing path N times (each ENOENT)
 *                                        -> workload: done openat N pid=W
 *   ftrace on F [G]  the guest's own function tracer on F (and G): tracefs
 *                  mounted if needed, the trace cleared, set_ftrace_filter
 *                  written one function at a time (each one's result, 0 or
 *                  -errno), then current_tracer = function if any was taken
 *                                        -> workload: ftrace on F=0 G=-22 tracer=0
 *   ftrace off     current_tracer = nop, set_ftrace_filter emptied
 *                                        -> workload: ftrace off tracer=0 filter=0
 *   ftrace hits F  the lines of F's calls in the trace
 *                                        -> workload: ftrace hits F N
 *   ftrace enabled the functions in enabled_functions
 *                                        -> workload: ftrace enabled F G
 *   ftrace events  the events the kernel lists (available_events), one
 *                  line each, then their count
 *                                        -> workload: event S:E ...
 *                                           workload: events N
 *   ftrace event S:E 1|0  enable (1) or disable (0) event S:E in the
 *                  guest's own tracer (events/S/E/enable)
 *                                        -> workload: ftrace event S:E=R (R: 0,
 *                                           or the write's negative errno)
 *   ftrace id S:E  the id the kernel gave event S:E (events/S/E/id)
 *                                        -> workload: ftrace id S:E=N (N, or the
 *                                           read's negative errno)
 *   ping                                 -> workload: pong pid=W
 *   cx16flags      the flags after a `cmpxchg16b` that succeeds, read by
 *                  pushf, in a block that QEMU's TCG begins with the flags
 *                  as they are (after popf), an `add` of 0x801 before the
 *                  exchange: 0x242 on hardware (ZF the exchange's, the
 *                  others the add's), 0xa43 under QEMU 7.2's TCG, which
 *                  takes the add's operand for the flags (CPUs with cx16
 *                  only: elsewhere the instruction is undefined)
 *                                        -> workload: cx16flags flags=F pid=W
 *   suspend        suspend to RAM (mem to /sys/power/state, sysfs mounted
 *                  first); returns once the machine woke up
 *                                        -> workload: resumed R pid=W (R: 0, or
 *                                           the write's negative errno)
 *   online CPU     bring CPU online (1 to /sys/devices/system/cpu/cpuCPU/online,
 *                  sysfs mounted first)  -> workload: online CPU pid=W
 *   pin CPU        run the worker on CPU only (sched_setaffinity)
 *                                        -> workload: pinned CPU pid=W
 *   rename N       N times: rename the worker (prctl PR_SET_NAME, wl-r0,
 *                  wl-r1, ...), then getpid(2) once; then wl-worker again
 *                                        -> workload: renamed N pid=W
 *   spawn N [K]    fork K children (1 to 8, default 1; named wl-child) that
 *                  each call getpid(2) N times and exit; reap them
 *                                        -> workload: spawned N pid=W
 *   forks K        fork K children (1 to 8, named wl-child, as spawn's) that
 *                  exit at once; reap them; their pids in fork order
 *                                        -> workload: forked K pids=P1,P2,... pid=W
 *   execs K        as forks K, each child then execs /init (which exits at
 *                  once: it is not pid 1)
 *                                        -> workload: execd K pids=P1,P2,... pid=W
 *   busy K         fork K background tasks (1 to 8, named wl-busy) that loop
 *                  until the guest ends: each round forks a child that exits at
 *                  once and reaps it, sleeps 1 ms (nanosleep: a timer), calls
 *                  getppid(2) and openat(2) of a missing path; never getpid(2),
 *                  so that `go getpid N` stays exact beside them
 *                                        -> workload: busy K pid=W
 *   quit           power off (ACPI) or, with no ACPI, restart: under QEMU
 *                  -no-reboot either one ends QEMU with exit status 0
 *                                        -> workload: quit power-off|restart
 *   insmod PATH    load the module file PATH (finit_module(2), no
 *                  parameters)           -> workload: insmod 0 pid=W (or
 *                                           workload: error insmod 0 failed: errno E)
 *   rmmod NAME     unload module NAME (delete_module(2), O_NONBLOCK)
 *                                        -> workload: rmmod 0 pid=W (or error)
 *   vmt K          write K to /proc/vmt_test (procfs mounted first): the
 *                  test module (guest/linux/vmt_test) calls vmt_hit() K times
 *                                        -> workload: vmt K pid=W (or error)
 *   vmtcycles N K PATH  N times: vmt K, rmmod vmt_test, insmod PATH (the
 *                  module loaded before and after; one round trip for
 *                  all)                  -> workload: vmtcycles N pid=W (or
 *                                           error at the first failure)
 * Anything else: `workload: error ...`. Nothing is printed unasked (no
 * heartbeat), so the console stays quiet while a test traces.
 */

#define SYS_read 0
#define SYS_write 1
#define SYS_open 2
#define SYS_close 3
#define SYS_ioctl 16
#define SYS_dup2 33
#define SYS_pause 34
#define SYS_nanosleep 35
#define SYS_getpid 39
#define SYS_fork 57
#define SYS_wait4 61
#define SYS_getppid 110
#define SYS_prctl 157
#define SYS_mount 165
#define SYS_reboot 169
#define SYS_exit 60
#define SYS_sched_setaffinity 203
#define SYS_openat 257
#define SYS_delete_module 176
#define SYS_finit_module 313
#define SYS_execve 59

#define O_RDONLY 0
#define O_WRONLY 01
#define O_RDWR 02
#define O_TRUNC 01000
#define O_NOCTTY 0400
#define O_DIRECTORY 0200000
#define AT_FDCWD -100
#define ENOENT 2
#define EINTR 4
#define ENOEXEC 8
#define ECHILD 10
#define TCGETS 0x5401
#define TCSETS 0x5402
#define PR_SET_NAME 15

#define LINUX_REBOOT_MAGIC1 0xfee1deadUL
#define LINUX_REBOOT_MAGIC2 672274793UL
#define LINUX_REBOOT_CMD_RESTART 0x01234567UL
#define LINUX_REBOOT_CMD_POWER_OFF 0x4321fedcUL

/* c_lflag bits: every kind of echo. */
#define ECHO 0000010
#define ECHOE 0000020
#define ECHOK 0000040
#define ECHONL 0000100
#define ECHOCTL 0001000
#define ECHOKE 0004000

#define WORKER_COMM "wl-worker"
#define TRACEFS "/sys/kernel/tracing/"
#define MISSING_PATH "/vmtrace-workload-missing"

/* The kernel's struct termios (asm-generic/termbits.h), what TCGETS fills. */
struct ktermios {
	unsigned int c_iflag, c_oflag, c_cflag, c_lflag;
	unsigned char c_line;
	unsigned char c_cc[19];
};

static long sys6(long n, long a, long b, long c, long d, long e, long f)
{
	long ret;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}

static long sys3(long n, long a, long b, long c)
{
	return sys6(n, a, b, c, 0, 0, 0);
}

static long sys0(long n)
{
	return sys6(n, 0, 0, 0, 0, 0, 0);
}

/* One output line, built in place and written with one write(2). */
struct line {
	char buf[256];
	unsigned long len;
};

static void put(struct line *l, const char *s)
{
	while (*s && l->len < sizeof(l->buf) - 1)
		l->buf[l->len++] = *s++;
}

static void put_num(struct line *l, long v)
{
	char tmp[24];
	int n = 0;
	unsigned long u = v < 0 ? -(unsigned long)v : (unsigned long)v;

	if (v < 0)
		put(l, "-");
	do {
		tmp[n++] = '0' + u % 10;
		u /= 10;
	} while (u);
	while (n && l->len < sizeof(l->buf) - 1)
		l->buf[l->len++] = tmp[--n];
}

static void emit(struct line *l)
{
	l->buf[l->len++] = '\n';
	sys3(SYS_write, 1, (long)l->buf, l->len);
	l->len = 0;
}

static void say(const char *s)
{
	struct line l = { .len = 0 };

	put(&l, "workload: ");
	put(&l, s);
	emit(&l);
}

static int streq(const char *a, const char *b)
{
	while (*a && *a == *b)
		a++, b++;
	return *a == *b;
}

/* Splits `s` in place at blanks into at most `max` words; returns the count. */
static int split(char *s, char **words, int max)
{
	int n = 0;

	for (;;) {
		while (*s == ' ' || *s == '\t')
			*s++ = 0;
		if (!*s)
			return n;
		if (n == max)
			return max + 1;
		words[n++] = s;
		while (*s && *s != ' ' && *s != '\t')
			s++;
	}
}

/* A decimal count, or -1 when `s` is not one (or above a billion). */
static long parse_count(const char *s)
{
	long v = 0;

	if (!*s)
		return -1;
	for (; *s; s++) {
		if (*s < '0' || *s > '9' || v > 100000000L)
			return -1;
		v = v * 10 + (*s - '0');
	}
	return v;
}

/*
 * `go NAME N`: the system call NAME exactly N times, nothing else between.
 * Returns 0, or -1 for an unknown NAME.
 */
static int run_go(const char *name, long count, long *unexpected)
{
	long i, r;

	*unexpected = 0;
	if (streq(name, "getpid")) {
		for (i = 0; i < count; i++)
			sys0(SYS_getpid);
	} else if (streq(name, "getppid")) {
		for (i = 0; i < count; i++)
			sys0(SYS_getppid);
	} else if (streq(name, "openat")) {
		for (i = 0; i < count; i++) {
			r = sys6(SYS_openat, AT_FDCWD, (long)MISSING_PATH, O_RDONLY, 0, 0, 0);
			if (r != -ENOENT)
				++*unexpected;
			if (r >= 0)
				sys3(SYS_close, r, 0, 0);
		}
	} else {
		return -1;
	}
	return 0;
}

/* Mount sysfs at /sys, once (a second mount fails with EBUSY: harmless). */
static void mount_sysfs(void)
{
	sys6(SYS_mount, (long)"sysfs", (long)"/sys", (long)"sysfs", 0, 0, 0);
}

/* `online CPU`: 0, or the failing system call's negative errno. */
static long cpu_online(long cpu)
{
	struct line path = { .len = 0 };
	long fd, r;

	mount_sysfs();
	put(&path, "/sys/devices/system/cpu/cpu");
	put_num(&path, cpu);
	put(&path, "/online");
	path.buf[path.len] = 0;
	fd = sys3(SYS_open, (long)path.buf, O_RDWR, 0);
	if (fd < 0)
		return fd;
	r = sys3(SYS_write, fd, (long)"1", 1);
	sys3(SYS_close, fd, 0, 0);
	return r < 0 ? r : 0;
}

/* `pin CPU`: the worker on CPU only; 0 or a negative errno. */
static long pin(long cpu)
{
	unsigned long mask[16] = { 0 };

	if (cpu >= (long)(sizeof(mask) * 8))
		return -22;
	mask[cpu / 64] = 1UL << (cpu % 64);
	return sys3(SYS_sched_setaffinity, 0, sizeof(mask), (long)mask);
}

/* `rename N`: N names, one getpid(2) under each, then the worker's own. */
static void rename_loop(long count)
{
	struct line name;
	long i;

	for (i = 0; i < count; i++) {
		name.len = 0;
		put(&name, "wl-r");
		put_num(&name, i);
		name.buf[name.len] = 0;
		sys6(SYS_prctl, PR_SET_NAME, (long)name.buf, 0, 0, 0, 0);
		sys0(SYS_getpid);
	}
	sys6(SYS_prctl, PR_SET_NAME, (long)WORKER_COMM, 0, 0, 0, 0);
}

/* `spawn N`: a short-lived child that calls getpid(2) N times; its pid. */
static long spawn(long count, long kids)
{
	int status;
	long i, k, child = 0, pids[8];

	if (kids < 1 || kids > 8)
		return -22;
	for (k = 0; k < kids; k++) {
		child = sys0(SYS_fork);
		if (child == 0) {
			sys6(SYS_prctl, PR_SET_NAME, (long)"wl-child", 0, 0, 0, 0);
			for (i = 0; i < count; i++)
				sys0(SYS_getpid);
			sys3(SYS_exit, 0, 0, 0);
		}
		pids[k] = child;
		if (child < 0)
			break;
	}
	/* Reaped once all run: K of them compete for the CPUs meanwhile. */
	for (i = 0; i < k; i++)
		sys6(SYS_wait4, pids[i], (long)&status, 0, 0, 0, 0);
	return child;
}

static void reply(struct line *l, const char *what, long n, long err, long pid);

/*
 * `cx16flags` (see the top): popfq ends QEMU's translation block with the
 * flags kept "as they are"; the next block's add leaves its operand where
 * TCG keeps the flags lazily; QEMU 7.2's cmpxchg16b helper computes the
 * flags from the stale state (target/i386/tcg/mem_helper.c), the operand.
 * 0x801 makes them CF and OF only (never TF, DF or AC, which the next
 * interrupt would load).
 */
static long cx16flags(void)
{
	static unsigned long slot[2] __attribute__((aligned(16)));
	unsigned long flags, rax = 0, rdx = 0;
	register unsigned long r8 __asm__("r8") = 0;

	slot[0] = 0;
	slot[1] = 0;
	/* (Past the red zone: this leaf function's locals may be there.) */
	__asm__ volatile("lea -128(%%rsp), %%rsp\n\t"
			 "pushq $0x202\n\t"
			 "popfq\n\t"
			 "add %%rdi, %%r8\n\t"
			 "cmpxchg16b %[m]\n\t"
			 "pushfq\n\t"
			 "popq %[f]\n\t"
			 "lea 128(%%rsp), %%rsp"
			 : [f] "=r"(flags), [m] "+m"(slot), "+a"(rax), "+d"(rdx), "+r"(r8)
			 : "b"(1UL), "c"(1UL), "D"(0x801UL)
			 : "cc", "memory");
	return (long)flags;
}

/* `forks K`: K children that rename themselves and exit; their pids said.
 * `execs K` (`exec` set): each child then execs /init, which exits at once
 * when it is not pid 1 (workload_main). */
static void forks(struct line *l, long kids, long pid, const char *exec)
{
	int status;
	long k, n = 0, pids[8];
	const char *said = exec ? "execd " : "forked ";

	if (kids < 1 || kids > 8) {
		reply(l, said, kids, -22, pid);
		return;
	}
	for (k = 0; k < kids; k++) {
		pids[k] = sys0(SYS_fork);
		if (pids[k] == 0) {
			char *argv[] = { (char *)exec, 0 };
			char *envp[] = { 0 };

			sys6(SYS_prctl, PR_SET_NAME, (long)"wl-child", 0, 0, 0, 0);
			if (exec)
				sys3(SYS_execve, (long)exec, (long)argv, (long)envp);
			sys3(SYS_exit, 0, 0, 0);
		}
		if (pids[k] < 0) {
			reply(l, said, kids, pids[k], pid);
			break;
		}
		n++;
	}
	for (k = 0; k < n; k++)
		sys6(SYS_wait4, pids[k], (long)&status, 0, 0, 0, 0);
	if (n < kids)
		return;
	put(l, "workload: ");
	put(l, said);
	put_num(l, kids);
	put(l, " pids=");
	for (k = 0; k < n; k++) {
		if (k)
			put(l, ",");
		put_num(l, pids[k]);
	}
	put(l, " pid=");
	put_num(l, pid);
	emit(l);
}

/* `busy K`: K tasks forking, sleeping and calling, until the guest ends. */
static long busy(long kids)
{
	struct { long sec, nsec; } ms = { 0, 1000000 };
	int status;
	long k, child, grandchild;

	if (kids < 1 || kids > 8)
		return -22;
	for (k = 0; k < kids; k++) {
		child = sys0(SYS_fork);
		if (child < 0)
			return child;
		if (child > 0)
			continue;
		sys6(SYS_prctl, PR_SET_NAME, (long)"wl-busy", 0, 0, 0, 0);
		for (;;) {
			grandchild = sys0(SYS_fork);
			if (grandchild == 0)
				sys3(SYS_exit, 0, 0, 0);
			if (grandchild > 0)
				sys6(SYS_wait4, grandchild, (long)&status, 0, 0, 0, 0);
			sys3(SYS_nanosleep, (long)&ms, 0, 0);
			sys0(SYS_getppid);
			child = sys6(SYS_openat, AT_FDCWD, (long)MISSING_PATH, O_RDONLY, 0, 0, 0);
			if (child >= 0)
				sys3(SYS_close, child, 0, 0);
		}
	}
	return 0;
}

static unsigned long len_of(const char *s)
{
	unsigned long n = 0;

	while (s[n])
		n++;
	return n;
}

/* tracefs at /sys/kernel/tracing (sysfs under it), mounted once. */
static long tracefs_mount(void)
{
	static int mounted;
	long r;

	if (mounted)
		return 0;
	mount_sysfs();
	r = sys6(SYS_mount, (long)"nodev", (long)TRACEFS, (long)"tracefs", 0, 0, 0);
	if (r == 0)
		mounted = 1;
	return r;
}

/* Open tracefs file `name` with `flags`: the fd, or -errno. */
static long tracefs_open(const char *name, long flags)
{
	struct line path = { .len = 0 };

	put(&path, TRACEFS);
	put(&path, name);
	path.buf[path.len] = 0;
	return sys3(SYS_open, (long)path.buf, flags, 0);
}

/* Write `text` (may be empty) to tracefs file `name`: 0 or -errno. */
static long tracefs_write(const char *name, const char *text, long flags)
{
	long fd = tracefs_open(name, O_WRONLY | flags), r = 0;

	if (fd < 0)
		return fd;
	if (*text)
		r = sys3(SYS_write, fd, (long)text, len_of(text));
	sys3(SYS_close, fd, 0, 0);
	return r < 0 ? r : 0;
}

/* Read tracefs file `name` whole (what fits): its length, or -errno. */
static long tracefs_read(const char *name, char *buf, long size)
{
	long fd = tracefs_open(name, O_RDONLY), got, used = 0;

	if (fd < 0)
		return fd;
	while (used < size - 1) {
		got = sys3(SYS_read, fd, (long)(buf + used), size - 1 - used);
		if (got == -EINTR)
			continue;
		if (got <= 0)
			break;
		used += got;
	}
	sys3(SYS_close, fd, 0, 0);
	buf[used] = 0;
	return used;
}

/* Does `s` start with `p`? */
static int starts(const char *s, const char *p)
{
	while (*p && *s == *p)
		s++, p++;
	return !*p;
}

/* `ftrace ...` (w[1..n-1]): the guest's own function tracer. */
static void run_ftrace(char **w, int n)
{
	static char text[256 * 1024];
	struct line l = { .len = 0 }, pat = { .len = 0 }, name = { .len = 0 };
	long r, len, i, hits = 0, taken = 0;
	int k;

	r = tracefs_mount();
	if (r < 0) {
		put(&l, "workload: error mounting tracefs: ");
		put_num(&l, r);
		emit(&l);
		return;
	}
	if (n >= 3 && n <= 4 && streq(w[1], "on")) {
		put(&l, "workload: ftrace on");
		tracefs_write("set_ftrace_filter", "", O_TRUNC);
		tracefs_write("trace", "", O_TRUNC);
		for (k = 2; k < n; k++) {
			/*
			 * With its blank the name is matched in write(2), which
			 * says if it failed; without, only at close, silently.
			 */
			name.len = 0;
			put(&name, w[k]);
			put(&name, "\n");
			name.buf[name.len] = 0;
			r = tracefs_write("set_ftrace_filter", name.buf, 0);
			taken += r == 0;
			put(&l, " ");
			put(&l, w[k]);
			put(&l, "=");
			put_num(&l, r);
		}
		/* No function taken: an empty filter would trace every function. */
		put(&l, " tracer=");
		if (taken)
			put_num(&l, tracefs_write("current_tracer", "function", O_TRUNC));
		else
			put(&l, "off");
		emit(&l);
		return;
	}
	if (n == 2 && streq(w[1], "off")) {
		put(&l, "workload: ftrace off tracer=");
		put_num(&l, tracefs_write("current_tracer", "nop", O_TRUNC));
		put(&l, " filter=");
		put_num(&l, tracefs_write("set_ftrace_filter", "", O_TRUNC));
		emit(&l);
		return;
	}
	if (n == 3 && streq(w[1], "hits")) {
		len = tracefs_read("trace", text, sizeof(text));
		/* A function tracer line: "...: F <-CALLER". */
		put(&pat, ": ");
		put(&pat, w[2]);
		put(&pat, " <-");
		pat.buf[pat.len] = 0;
		for (i = 0; i < len; i++)
			hits += starts(text + i, pat.buf);
		put(&l, "workload: ftrace hits ");
		put(&l, w[2]);
		put(&l, " ");
		put_num(&l, len < 0 ? len : hits);
		emit(&l);
		return;
	}
	if (n == 2 && streq(w[1], "enabled")) {
		len = tracefs_read("enabled_functions", text, sizeof(text));
		put(&l, "workload: ftrace enabled");
		/* The first word of each line. */
		for (i = 0; i < len; i++) {
			if (i > 0 && text[i - 1] != '\n')
				continue;
			put(&l, " ");
			while (i < len && text[i] != ' ' && text[i] != '\t' && text[i] != '\n')
				l.buf[l.len < sizeof(l.buf) - 2 ? l.len++ : l.len] = text[i++];
			i--;
		}
		emit(&l);
		return;
	}
	if (n == 2 && streq(w[1], "events")) {
		len = tracefs_read("available_events", text, sizeof(text));
		/* One console line per event: "SYSTEM:EVENT\n" each. */
		for (i = 0; i < len; i++) {
			if (i > 0 && text[i - 1] != '\n')
				continue;
			put(&l, "workload: event ");
			while (i < len && text[i] != '\n')
				l.buf[l.len < sizeof(l.buf) - 2 ? l.len++ : l.len] = text[i++];
			emit(&l);
			hits++;
		}
		put(&l, "workload: events ");
		put_num(&l, len < 0 ? len : hits);
		emit(&l);
		return;
	}
	if (n == 4 && streq(w[1], "event") && (streq(w[3], "0") || streq(w[3], "1"))) {
		/* S:E, as available_events names it: events/S/E/enable. */
		put(&name, "events/");
		put(&name, w[2]);
		for (i = 0; i < (long)name.len; i++)
			if (name.buf[i] == ':')
				name.buf[i] = '/';
		put(&name, "/enable");
		name.buf[name.len] = 0;
		put(&l, "workload: ftrace event ");
		put(&l, w[2]);
		put(&l, "=");
		put_num(&l, tracefs_write(name.buf, w[3], O_TRUNC));
		emit(&l);
		return;
	}
	if (n == 3 && streq(w[1], "id")) {
		/* S:E, as available_events names it: events/S/E/id. */
		put(&name, "events/");
		put(&name, w[2]);
		for (i = 0; i < (long)name.len; i++)
			if (name.buf[i] == ':')
				name.buf[i] = '/';
		put(&name, "/id");
		name.buf[name.len] = 0;
		len = tracefs_read(name.buf, text, sizeof(text));
		put(&l, "workload: ftrace id ");
		put(&l, w[2]);
		put(&l, "=");
		if (len < 0)
			put_num(&l, len);
		/* The number, without its newline. */
		for (i = 0; i < len && text[i] >= '0' && text[i] <= '9'; i++)
			l.buf[l.len < sizeof(l.buf) - 2 ? l.len++ : l.len] = text[i];
		emit(&l);
		return;
	}
	say("error unknown command (ftrace on F [G], off, hits F, enabled, events, event S:E 1|0, id S:E)");
}

/* Power off when the kernel can (ACPI), else restart; never returns. */
static void __attribute__((noreturn)) quit(void)
{
	long fd, cmd = LINUX_REBOOT_CMD_RESTART;

	/*
	 * Without a power-off driver the kernel turns POWER_OFF into HALT, which
	 * stops every CPU and leaves QEMU running; a restart ends QEMU instead
	 * (-no-reboot). /sys/firmware/acpi exists only when ACPI is up.
	 */
	mount_sysfs();
	fd = sys3(SYS_open, (long)"/sys/firmware/acpi", O_RDONLY | O_DIRECTORY, 0);
	if (fd >= 0) {
		sys3(SYS_close, fd, 0, 0);
		cmd = LINUX_REBOOT_CMD_POWER_OFF;
	}
	say(cmd == LINUX_REBOOT_CMD_POWER_OFF ? "quit power-off" : "quit restart");
	sys6(SYS_reboot, LINUX_REBOOT_MAGIC1, LINUX_REBOOT_MAGIC2, cmd, 0, 0, 0);
	say("error reboot returned");
	for (;;)
		sys0(SYS_pause);
}

/* `suspend`: 0 once woken, or the failing system call's negative errno. */
static long suspend_to_ram(void)
{
	long fd, r;

	mount_sysfs();
	fd = sys3(SYS_open, (long)"/sys/power/state", O_RDWR, 0);
	if (fd < 0)
		return fd;
	r = sys3(SYS_write, fd, (long)"mem", 3);
	sys3(SYS_close, fd, 0, 0);
	return r < 0 ? r : 0;
}

/* `workload: WHAT N pid=W`, or `workload: error WHAT N failed: errno E`. */
static void reply(struct line *l, const char *what, long n, long err, long pid)
{
	put(l, err ? "workload: error " : "workload: ");
	put(l, what);
	put_num(l, n);
	if (err) {
		put(l, " failed: errno ");
		put_num(l, -err);
	} else {
		put(l, " pid=");
		put_num(l, pid);
	}
	emit(l);
}

/* Write K (decimal `k`) to /proc/vmt_test: the write's result. */
static long vmt_write(const char *k)
{
	long fd, r;

	/* procfs, mounted at the first `vmt` (EBUSY after: ignored). */
	sys6(SYS_mount, (long)"proc", (long)"/proc", (long)"proc", 0, 0, 0);
	fd = sys3(SYS_open, (long)"/proc/vmt_test", O_WRONLY, 0);
	r = fd < 0 ? fd : sys3(SYS_write, fd, (long)k, len_of(k));
	if (fd >= 0)
		sys3(SYS_close, fd, 0, 0);
	return r;
}

/* finit_module(2) of the file at `path`: 0 or -errno. */
static long load_module(const char *path)
{
	long fd = sys3(SYS_open, (long)path, O_RDONLY, 0);
	long r = fd < 0 ? fd : sys3(SYS_finit_module, fd, (long)"", 0);

	if (fd >= 0)
		sys3(SYS_close, fd, 0, 0);
	return r;
}

/* vmtcycles N K PATH: N times the calls, the unload and the load again. */
static void run_cycles(char **w, long pid)
{
	struct line l = { .len = 0 };
	long n = parse_count(w[1]), i, r = 0;

	for (i = 0; r >= 0 && i < n; i++) {
		r = vmt_write(w[2]);
		/* O_NONBLOCK (04000): fail at once if the module is in use. */
		if (r >= 0)
			r = sys3(SYS_delete_module, (long)"vmt_test", 04000, 0);
		if (r >= 0)
			r = load_module(w[3]);
	}
	reply(&l, "vmtcycles ", n, r < 0 ? r : 0, pid);
}

/* exec N PATH: N execve(2)s of PATH, a file no binary format takes (a .ko,
 * ELF but not an executable): each fails with ENOEXEC after every format's
 * load_binary ran once (binfmt_misc's too, when loaded). 0, or the first
 * other result. */
static long exec_n(long n, const char *path)
{
	char *argv[] = { (char *)path, 0 };
	char *envp[] = { 0 };
	long i, r;

	for (i = 0; i < n; i++) {
		r = sys3(SYS_execve, (long)path, (long)argv, (long)envp);
		if (r != -ENOEXEC)
			return r;
	}
	return 0;
}

/* Module commands (insmod PATH, rmmod NAME, vmt K, vmtcycles N K PATH,
 * exec N PATH): 1 if `w` was one. */
static int run_module(char **w, int n, long pid)
{
	struct line l = { .len = 0 };
	long r, k;

	if (n == 4 && streq(w[0], "vmtcycles") && parse_count(w[1]) >= 0 &&
	    parse_count(w[2]) >= 0) {
		run_cycles(w, pid);
		return 1;
	}
	if (n == 3 && streq(w[0], "exec") && parse_count(w[1]) >= 0) {
		reply(&l, "exec ", parse_count(w[1]), exec_n(parse_count(w[1]), w[2]), pid);
		return 1;
	}
	if (n != 2)
		return 0;
	if (streq(w[0], "insmod")) {
		reply(&l, "insmod ", 0, load_module(w[1]), pid);
		return 1;
	}
	if (streq(w[0], "rmmod")) {
		/* O_NONBLOCK (04000): fail at once if the module is in use. */
		reply(&l, "rmmod ", 0, sys3(SYS_delete_module, (long)w[1], 04000, 0), pid);
		return 1;
	}
	k = parse_count(w[1]);
	if (k >= 0 && streq(w[0], "vmt")) {
		r = vmt_write(w[1]);
		reply(&l, "vmt ", k, r < 0 ? r : 0, pid);
		return 1;
	}
	return 0;
}

static void run_command(char *text, long pid)
{
	struct line l = { .len = 0 };
	char *w[4];
	long count, unexpected;
	int n = split(text, w, 4);

	if (n == 0)
		return;
	if (n == 1 && streq(w[0], "quit"))
		quit();
	if (n == 1 && streq(w[0], "ping")) {
		put(&l, "workload: pong pid=");
		put_num(&l, pid);
		emit(&l);
		return;
	}
	if (n == 1 && streq(w[0], "cx16flags")) {
		reply(&l, "cx16flags flags=", cx16flags(), 0, pid);
		return;
	}
	if (n == 1 && streq(w[0], "suspend")) {
		long r = suspend_to_ram();

		put(&l, "workload: resumed ");
		put_num(&l, r);
		put(&l, " pid=");
		put_num(&l, pid);
		emit(&l);
		return;
	}
	if (n <= 4 && streq(w[0], "ftrace")) {
		run_ftrace(w, n);
		return;
	}
	if (run_module(w, n, pid))
		return;
	count = n == 3 ? parse_count(w[2]) : -1;
	if (n == 3 && streq(w[0], "go") && count >= 0 && run_go(w[1], count, &unexpected) == 0) {
		put(&l, "workload: done ");
		put(&l, w[1]);
		put(&l, " ");
		put_num(&l, count);
		put(&l, " pid=");
		put_num(&l, pid);
		if (unexpected) {
			put(&l, " unexpected=");
			put_num(&l, unexpected);
		}
		emit(&l);
		return;
	}
	count = n == 2 ? parse_count(w[1]) : -1;
	if (count >= 0 && streq(w[0], "online")) {
		reply(&l, "online ", count, cpu_online(count), pid);
		return;
	}
	if (count >= 0 && streq(w[0], "pin")) {
		reply(&l, "pinned ", count, pin(count), pid);
		return;
	}
	if (count >= 0 && streq(w[0], "rename")) {
		rename_loop(count);
		reply(&l, "renamed ", count, 0, pid);
		return;
	}
	if (count >= 0 && streq(w[0], "forks")) {
		forks(&l, count, pid, 0);
		return;
	}
	if (count >= 0 && streq(w[0], "execs")) {
		forks(&l, count, pid, "/init");
		return;
	}
	if (count >= 0 && streq(w[0], "busy")) {
		reply(&l, "busy ", count, busy(count), pid);
		return;
	}
	if (n == 3 && streq(w[0], "spawn") && parse_count(w[1]) >= 0 && parse_count(w[2]) >= 0) {
		long child = spawn(parse_count(w[1]), parse_count(w[2]));

		reply(&l, "spawned ", parse_count(w[1]), child < 0 ? child : 0, pid);
		return;
	}
	if (count >= 0 && streq(w[0], "spawn")) {
		long child = spawn(count, 1);

		reply(&l, "spawned ", count, child < 0 ? child : 0, pid);
		return;
	}
	say("error unknown command (go getpid|getppid|openat N, online CPU, pin CPU, rename N, spawn N, forks K, execs K, busy K, ftrace ..., insmod PATH, rmmod NAME, vmt K, vmtcycles N K PATH, exec N PATH, ping, suspend, quit)");
}

/* Echo off, canonical input kept: each read(2) returns one whole line. */
static void console_quiet(void)
{
	struct ktermios t;

	if (sys3(SYS_ioctl, 0, TCGETS, (long)&t) < 0) {
		say("error TCGETS on the console failed");
		return;
	}
	t.c_lflag &= ~(ECHO | ECHOE | ECHOK | ECHONL | ECHOCTL | ECHOKE);
	if (sys3(SYS_ioctl, 0, TCSETS, (long)&t) < 0)
		say("error TCSETS on the console failed");
}

static void __attribute__((noreturn)) worker(void)
{
	static char buf[512];
	struct line l = { .len = 0 };
	long pid = sys0(SYS_getpid), got, used = 0, i, start;

	sys6(SYS_prctl, PR_SET_NAME, (long)WORKER_COMM, 0, 0, 0, 0);
	console_quiet();
	put(&l, "workload: ready pid=");
	put_num(&l, sys0(SYS_getppid));
	put(&l, " worker=");
	put_num(&l, pid);
	put(&l, " comm=" WORKER_COMM);
	emit(&l);

	for (;;) {
		if (used == sizeof(buf) - 1)
			used = 0; /* an overlong line: dropped */
		got = sys3(SYS_read, 0, (long)(buf + used), sizeof(buf) - 1 - used);
		if (got == -EINTR)
			continue;
		if (got <= 0) {
			say("error reading the console failed; stopping");
			for (;;)
				sys0(SYS_pause);
		}
		used += got;
		/* Run every complete line; keep a partial one for the next read. */
		start = 0;
		for (i = 0; i < used; i++) {
			if (buf[i] != '\n' && buf[i] != '\r')
				continue;
			buf[i] = 0;
			run_command(buf + start, pid);
			start = i + 1;
		}
		for (i = start; i < used; i++)
			buf[i - start] = buf[i];
		used -= start;
	}
}

void __attribute__((noreturn, used)) workload_main(void)
{
	long pid, fd;
	int status;

	/* Exec'd by a child (`execs K`), not started as init: done. */
	if (sys0(SYS_getpid) != 1)
		sys3(SYS_exit, 0, 0, 0);

	/* The kernel opens /dev/console as fds 0-2 for init; if it could not, we do. */
	if (sys3(SYS_write, 1, (long)"", 0) < 0) {
		fd = sys3(SYS_open, (long)"/dev/console", O_RDWR | O_NOCTTY, 0);
		if (fd == 0) {
			sys3(SYS_dup2, 0, 1, 0);
			sys3(SYS_dup2, 0, 2, 0);
		}
	}

	pid = sys0(SYS_fork);
	if (pid == 0)
		worker();
	if (pid < 0)
		say("error fork failed");

	/* Init: reap whatever exits, forever (pause once no child is left). */
	for (;;) {
		long r = sys6(SYS_wait4, -1, (long)&status, 0, 0, 0, 0);

		if (r == pid) {
			struct line l = { .len = 0 };

			put(&l, "workload: error worker exited, wait status ");
			put_num(&l, status & 0xffff);
			emit(&l);
		} else if (r == -ECHILD) {
			sys0(SYS_pause);
		}
	}
}

/* Entry point: the kernel starts us with an aligned stack and no return address. */
__asm__(".text\n"
	".global _start\n"
	".type _start, @function\n"
	"_start:\n"
	"	xorl %ebp, %ebp\n"
	"	andq $-16, %rsp\n"
	"	call workload_main\n"
	"	hlt\n");
