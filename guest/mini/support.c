/* Support code: serial output, number formatting, command line, spinlock,
 * IDT, power off. Everything here is notrace, so it has no ftrace site. */
#include "mini.h"

static notrace inline void outb(u16 port, u8 val)
{
	asm volatile("outb %0, %1" : : "a"(val), "Nd"(port) : "memory");
}

notrace void halt_forever(void)
{
	for (;;)
		asm volatile("cli; hlt" : : : "memory");
}

notrace void poweroff(u8 status)
{
	outb(POWEROFF_PORT, status);
	halt_forever(); /* in case the VMM lets us run on */
}

/* ---- serial ------------------------------------------------------------- */

/* The VMM's UART takes a byte at any time, so we skip polling LSR (each poll
 * would be one more VM exit). */
notrace void serial_puts(const char *s)
{
	while (*s)
		outb(COM1_PORT, (u8)*s++);
}

notrace void serial_putu(u64 v)
{
	char buf[21];
	int i = sizeof(buf) - 1;

	buf[i] = 0;
	do {
		buf[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	serial_puts(&buf[i]);
}

notrace void serial_puti(long v)
{
	if (v < 0) {
		serial_puts("-");
		serial_putu(-(u64)v);
	} else {
		serial_putu((u64)v);
	}
}

/* ---- spinlock: keeps each vCPU's lines together ------------------------- */

static unsigned int print_lock_word;

notrace void print_lock(void)
{
	while (__atomic_exchange_n(&print_lock_word, 1, __ATOMIC_ACQUIRE))
		while (__atomic_load_n(&print_lock_word, __ATOMIC_RELAXED))
			asm volatile("pause");
}

notrace void print_unlock(void)
{
	__atomic_store_n(&print_lock_word, 0, __ATOMIC_RELEASE);
}

/* ---- command line ------------------------------------------------------- */

/* Does token [s, end) start with key? Returns the rest, or 0. */
static notrace const char *after(const char *s, const char *end, const char *key)
{
	while (*key) {
		if (s == end || *s != *key)
			return 0;
		s++, key++;
	}
	return s;
}

static notrace int equals(const char *s, const char *end, const char *word)
{
	const char *rest = after(s, end, word);

	return rest && rest == end;
}

/* Decimal [s, end) into *out; nonzero on success. Overflow wraps. */
static notrace int parse_u64(const char *s, const char *end, u64 *out)
{
	u64 v = 0;

	if (s == end)
		return 0;
	for (; s < end; s++) {
		if (*s < '0' || *s > '9')
			return 0;
		v = v * 10 + (u64)(*s - '0');
	}
	*out = v;
	return 1;
}

/* Space-separated tokens; unknown tokens and bad values are ignored. */
notrace void parse_cmdline(const char *s, struct mini_cfg *cfg)
{
	cfg->iters = 1000;
	cfg->loop = 0;
	cfg->int3 = 0;
	cfg->end = 0;
	cfg->strio = 0;
	cfg->graph = 0;
	cfg->args = 0;
	cfg->stack = 0;
	cfg->direct = 0;
	if (!s)
		return;
	while (*s) {
		const char *end, *v;

		while (*s == ' ' || *s == '\t' || *s == '\n')
			s++;
		for (end = s; *end && *end != ' ' && *end != '\t' && *end != '\n'; end++)
			;
		if ((v = after(s, end, "iters=")))
			parse_u64(v, end, &cfg->iters);
		else if ((v = after(s, end, "mode="))) {
			if (equals(v, end, "loop"))
				cfg->loop = 1;
			else if (equals(v, end, "count"))
				cfg->loop = 0;
		} else if ((v = after(s, end, "int3=")))
			cfg->int3 = equals(v, end, "1");
		else if ((v = after(s, end, "strio=")))
			cfg->strio = equals(v, end, "1");
		else if ((v = after(s, end, "graph=")))
			cfg->graph = equals(v, end, "1");
		else if ((v = after(s, end, "args=")))
			cfg->args = equals(v, end, "1");
		else if ((v = after(s, end, "stack=")))
			cfg->stack = equals(v, end, "1");
		else if ((v = after(s, end, "direct=")))
			cfg->direct = equals(v, end, "1");
		else if ((v = after(s, end, "end="))) {
			if (equals(v, end, "triple-fault"))
				cfg->end = END_TRIPLE_FAULT;
			else if (equals(v, end, "reset"))
				cfg->end = END_RESET;
		}
		s = end;
	}
}

/* ---- IDT and the int3 self-test ----------------------------------------- */

struct idt_entry {
	u16 off0;
	u16 sel;
	u8 ist;
	u8 attr;
	u16 off1;
	u32 off2;
	u32 zero;
} __attribute__((packed));

#define KERNEL_CS 0x10
#define GATE_INTR 0x8e /* present, DPL 0, 64-bit interrupt gate */

static struct idt_entry idt[256] __attribute__((aligned(4096)));

/* entry.S */
extern char mini_int3_entry[];
extern char mini_exc_stubs[]; /* 256 stubs, 16 bytes apart */

/* Counted by mini_int3_entry (entry.S). */
volatile u64 mini_int3_hits;

/* Every vCPU fills the table with the same values, then loads it: no vCPU
 * waits for another, and rewriting identical bytes is harmless. */
notrace void idt_load(void)
{
	struct {
		u16 limit;
		u64 base;
	} __attribute__((packed)) desc = { sizeof(idt) - 1, (u64)idt };

	for (int v = 0; v < 256; v++) {
		u64 h = v == 3 ? (u64)mini_int3_entry : (u64)mini_exc_stubs + 16 * (u64)v;

		idt[v].off0 = (u16)h;
		idt[v].sel = KERNEL_CS;
		idt[v].ist = 0;
		idt[v].attr = GATE_INTR;
		idt[v].off1 = (u16)(h >> 16);
		idt[v].off2 = (u32)(h >> 32);
		idt[v].zero = 0;
	}
	asm volatile("lidt %0" : : "m"(desc) : "memory");
}

/* From entry.S for any vector but 3. */
notrace void mini_exception(u64 vector)
{
	serial_puts("mini: exception ");
	serial_putu(vector);
	serial_puts("\n");
	poweroff(1);
}

notrace void int3_selftest(void)
{
	asm volatile("int3" : : : "memory");
	asm volatile("int3" : : : "memory");
	print_lock();
	serial_puts(mini_int3_hits == 2 ? "mini: int3 ok " : "mini: int3 bad ");
	serial_putu(mini_int3_hits);
	serial_puts("\n");
	print_unlock();
	if (mini_int3_hits != 2)
		poweroff(1);
}

/* ---- string port I/O self-test ---------------------------------------- */

#define COM1_LSR (COM1_PORT + 5)

/* One `rep outsb` writes a whole line to COM1, so the console shows all of it
 * only if the VMM delivers every byte of a string I/O exit. One `rep insb`
 * reads the UART's line status register into every byte of a buffer, so all
 * bytes are equal (and not the empty bus's 0xff) only if the VMM answers
 * every element. */
notrace void string_io_selftest(void)
{
	static const char line[] = "mini: rep outsb ok, every byte of one string write\n";
	const char *src = line;
	u8 lsr[16];
	u8 *dst = lsr;
	u64 n = sizeof(line) - 1;
	int same = 1;

	print_lock();
	asm volatile("rep outsb" : "+S"(src), "+c"(n) : "d"((u16)COM1_PORT) : "memory");
	n = sizeof(lsr);
	asm volatile("rep insb" : "+D"(dst), "+c"(n) : "d"((u16)COM1_LSR) : "memory");
	for (unsigned i = 1; i < sizeof(lsr); i++)
		same &= lsr[i] == lsr[0];
	if (same && lsr[0] != 0xff) {
		serial_puts("mini: rep insb ok\n");
	} else {
		serial_puts("mini: rep insb bad");
		for (unsigned i = 0; i < sizeof(lsr); i++) {
			serial_puts(" ");
			serial_putu(lsr[i]);
		}
		serial_puts("\n");
	}
	print_unlock();
}

/* End the run the way a broken or rebooting kernel would. */
notrace void bad_end(int how)
{
	if (how == END_RESET) {
		/* What Linux's reboot=k does: pulse the reset line through the i8042. */
		asm volatile("outb %0, %1" : : "a"((u8)I8042_RESET), "Nd"((u16)I8042_COMMAND_PORT));
	} else {
		/* No IDT: #UD cannot be delivered, nor the #DF after it: triple fault. */
		asm volatile("lidt %0; ud2" : : "m"((struct { u16 l; u64 b; } __attribute__((packed))){ 0, 0 }));
	}
	halt_forever();
}

/* ---- per-CPU data (README "Per-CPU data") ------------------------------- */

/* The per-CPU template, section .data..percpu (mini.ld), as Linux defines
 * its per-CPU variables. In the default build the section is linked at 0,
 * as up to Linux 6.14, so each symbol is the variable's offset in a CPU's
 * area; in mini-percpu-addr it is linked in the image, as from 6.15, so
 * each symbol is a kernel address. Either way GS base = the CPU's area
 * (mini_percpu[cpu]) less __per_cpu_start (entry.S), and `gs:sym` is this
 * CPU's copy. No CPU copies the template (all zero): entry.S and
 * mini_cpu_init set what each CPU's copy needs. */

/* First in the template (mini.ld), so at offset 0 in the default build:
 * smp_processor_id(), and vmtrace's exitless trampoline reads it. */
int cpu_number __attribute__((section(".data..percpu..first")));
/* mini-rethunk: this CPU's returns through __x86_return_thunk (entry.S). */
unsigned long return_thunk_hits __percpu_var;
#ifdef MINI_PERCPU_ADDR
/* Linux 6.2+: the current task in pcpu_hot.current_task. */
struct pcpu_hot pcpu_hot __percpu_var;
/* Linux 6.15+ (x86/percpu/64: relative per-CPU offsets): each CPU's GS
 * base, also `__per_cpu_offset[cpu]` (0 until the CPU set it: the
 * template, whose number is 0). */
unsigned long __per_cpu_offset[MINI_MAX_CPUS];
#else
/* Up to Linux 6.1: the current task in a per-CPU variable of its own. */
struct task_struct *current_task __percpu_var;
#endif

/* The areas, one a CPU, zero like fresh RAM. */
u8 mini_percpu[MINI_MAX_CPUS][MINI_PERCPU_AREA] __attribute__((aligned(MINI_PERCPU_AREA)));

#ifdef MINI_RETHUNK
/* Linux sets this once it has applied its alternatives, return sites
 * included (alternative_instructions()); this guest applies none, so it is
 * set from the start. vmtrace waits for it before reading how __fentry__
 * returns. */
int alternatives_patched = 1;
#endif
