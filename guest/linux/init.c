/*
 * /init of the vmtrace guest initramfs (x86_64 Linux, no libc).
 *
 * Built by guest/linux/build.sh with
 *   gcc -static -nostdlib -ffreestanding -fno-pie -no-pie -Os ...
 * It prints one line to the console and powers the machine off.
 *
 * The kernel opens /dev/console as fds 0, 1 and 2 before running /init (the
 * initramfs provides the device node); if fd 1 is not usable we open
 * /dev/console ourselves.
 *
 * Power-off: with no ACPI and no other power-off driver, reboot(POWER_OFF)
 * prints "reboot: Power down", then the calling task exits; as that task is
 * init, the kernel panics ("Attempted to kill init!") and, with `panic=-1` on
 * the command line, restarts at once (`reboot=k`: keyboard-controller reset,
 * a write of 0xfe to port 0x64; QEMU -no-reboot turns that into an exit).
 * Should reboot() return anyway, we halt in a pause loop.
 *
 * Note: on the nested KVM host described in docs/emulating-kvm.md guest user
 * space dies at its first system call, so this program only runs to the end
 * on real KVM hosts.
 */

#define SYS_write 1
#define SYS_open 2
#define SYS_reboot 169
#define SYS_exit 60

#define O_WRONLY 01
#define O_NOCTTY 0400

#define LINUX_REBOOT_MAGIC1 0xfee1deadUL
#define LINUX_REBOOT_MAGIC2 672274793UL
#define LINUX_REBOOT_CMD_POWER_OFF 0x4321fedcUL

static long sys3(long n, long a, long b, long c)
{
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a), "S"(b), "d"(c)
			 : "rcx", "r11", "memory");
	return ret;
}

static long sys4(long n, long a, long b, long c, long d)
{
	long ret;
	register long r10 __asm__("r10") = d;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
			 : "rcx", "r11", "memory");
	return ret;
}

static const char hello[] = "vmtrace-init: hello\n";

void __attribute__((noreturn, used)) vmtrace_init_main(void)
{
	long len = sizeof(hello) - 1;

	if (sys3(SYS_write, 1, (long)hello, len) != len) {
		long fd = sys3(SYS_open, (long)"/dev/console", O_WRONLY | O_NOCTTY, 0);
		if (fd >= 0)
			sys3(SYS_write, fd, (long)hello, len);
	}

	sys4(SYS_reboot, LINUX_REBOOT_MAGIC1, LINUX_REBOOT_MAGIC2,
	     LINUX_REBOOT_CMD_POWER_OFF, 0);

	for (;;)
		__asm__ volatile("pause");
}

/* Entry point: the kernel starts us with an aligned stack and no return address. */
__asm__(".text\n"
	".global _start\n"
	".type _start, @function\n"
	"_start:\n"
	"	xorl %ebp, %ebp\n"
	"	andq $-16, %rsp\n"
	"	call vmtrace_init_main\n"
	"	hlt\n");
