/* Entry point and interrupt stubs. The VMM starts every vCPU here in 64-bit
 * mode with RDI = vCPU index, RSI = command line (physical = identity-mapped
 * address), RDX = vCPU count, RSP undefined. */

#define STACK_SIZE 16384
#define MAX_CPUS 64

	.section .text.entry, "ax"
	.code64
	.globl _start
	.type _start, @function
_start:
	cli
	cld
	cmpq	$MAX_CPUS, %rdi
	jae	.Lpark			/* no stack for this vCPU */
	/* rsp = mini_stacks + (cpu + 1) * STACK_SIZE; rdi/rsi/rdx untouched */
	leaq	1(%rdi), %rax
	shlq	$14, %rax
	leaq	mini_stacks(%rip), %rsp
	addq	%rax, %rsp
	/* Per-CPU data reached the way Linux reaches it: GS base = this CPU's
	 * area, its number at gs:[cpu_number] (vmtrace's exitless trampoline
	 * reads it there). wrmsr takes EDX:EAX, so RDX (vCPU count) is kept. */
	movq	%rdi, %rax
	shlq	$6, %rax		/* sizeof(struct mini_percpu) */
	leaq	mini_percpu(%rip), %rcx
	addq	%rcx, %rax		/* rax = &mini_percpu[cpu] */
	movl	%edi, (%rax)		/* ->cpu_number = cpu */
	movq	%rdx, %r8
	movq	%rax, %rdx
	shrq	$32, %rdx		/* edx = high half of the GS base */
	movl	$0xc0000101, %ecx	/* IA32_GS_BASE */
	wrmsr
	movq	%r8, %rdx
	xorl	%ebp, %ebp
	call	mini_main		/* does not return */
.Lpark:
	cli
	hlt
	jmp	.Lpark
	.size _start, . - _start

/* #BP: count and return. Touches no register; iretq restores RFLAGS. */
	.globl mini_int3_entry
	.type mini_int3_entry, @function
mini_int3_entry:
	lock incq mini_int3_hits(%rip)
	iretq
	.size mini_int3_entry, . - mini_int3_entry

/* Every other vector: push the vector number and report it. The stub for
 * vector v is at mini_exc_stubs + 16 * v (support.c relies on that). Some
 * exceptions push an error code too; we power off, so the frame can stay. */
	.globl mini_exc_stubs
	.type mini_exc_stubs, @function
	.balign 16
mini_exc_stubs:
	.set .Lvec, 0
	.rept 256
	.balign 16
	pushq	$.Lvec
	jmp	.Lexc_common
	.set .Lvec, .Lvec + 1
	.endr
.Lexc_common:
	popq	%rdi			/* vector */
	andq	$-16, %rsp		/* C ABI alignment */
	call	mini_exception		/* powers off */
	jmp	.Lpark
	.size mini_exc_stubs, . - mini_exc_stubs

	.section .bss
	.balign 4096
	.globl mini_stacks
	.type mini_stacks, @object
mini_stacks:
	.skip STACK_SIZE * MAX_CPUS
	.size mini_stacks, . - mini_stacks

	.section .note.GNU-stack, "", @progbits
