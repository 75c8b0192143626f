/* Entry point and interrupt stubs. The VMM starts every vCPU here in 64-bit
 * mode with RDI = vCPU index, RSI = command line (physical = identity-mapped
 * address), RDX = vCPU count, RSP undefined. */

#include "mini.h"

#define STACK_SIZE MINI_STACK_SIZE
#define MAX_CPUS MINI_MAX_CPUS

	.section .text.entry, "ax"
	.code64
	.globl _start
	.type _start, @function
_start:
	cli
	cld
	cmpq	$MAX_CPUS, %rdi
	jae	.Lpark			/* no stack for this vCPU */
	/* rsp = mini_stacks + (cpu + 1) * STACK_SIZE; rdi/rsi/rdx untouched.
	 * mini_stacks is 16 KiB-aligned, so each vCPU's stack is exactly one
	 * 16 KiB-aligned region (Linux's THREAD_SIZE/THREAD_ALIGN). */
	leaq	1(%rdi), %rax
	shlq	$14, %rax		/* * STACK_SIZE (16384 = 1 << 14) */
	leaq	mini_stacks(%rip), %rsp
	addq	%rax, %rsp
	/* Per-CPU data reached the way Linux reaches it (README "Per-CPU
	 * data"): GS base = this CPU's area less __per_cpu_start (0 in the
	 * default build, whose template is linked at 0), so gs:[sym] is this
	 * CPU's copy of the per-CPU variable sym. wrmsr takes EDX:EAX, so RDX
	 * (vCPU count) is kept. */
	movq	%rdi, %rax
	shlq	$MINI_PERCPU_SHIFT, %rax
	leaq	mini_percpu(%rip), %rcx
	addq	%rcx, %rax		/* rax = &mini_percpu[cpu] */
	movq	$__per_cpu_start, %rcx
	subq	%rcx, %rax		/* rax = GS base */
#ifdef MINI_PERCPU_ADDR
	/* Linux 6.15+: the GS base is also this CPU's __per_cpu_offset entry. */
	leaq	__per_cpu_offset(%rip), %rcx
	movq	%rax, (%rcx,%rdi,8)
#endif
	movq	%rdx, %r8
	movq	%rax, %rdx
	shrq	$32, %rdx		/* edx = high half of the GS base */
	movl	$0xc0000101, %ecx	/* IA32_GS_BASE */
	wrmsr
	movq	%r8, %rdx
	/* Its number at gs:[cpu_number] (vmtrace's exitless trampoline reads
	 * it there, as smp_processor_id() does). */
	movl	%edi, %gs:cpu_number
	/* The frame-pointer chain's end (README "Frame pointers"): the C code
	 * is built with frame pointers, so each C function pushes the RBP it
	 * was called with; RBP 0 here, before the first C call, makes the
	 * frame of every C function called from _start hold 0 as its saved
	 * RBP, where an unwinder walking RBP stops (the return address above
	 * it is in _start). The VMM leaves RBP undefined; Linux's
	 * secondary_startup_64 clears it the same way. */
	xorl	%ebp, %ebp
	/* Its tasks, its idle task current: before mini_main, whose entry is
	 * traced. Arguments kept in callee-saved registers across the call
	 * (RBP too: mini_cpu_init restores it, still 0, for mini_main). */
	movq	%rdi, %rbx
	movq	%rsi, %r12
	movq	%rdx, %r13
	call	mini_cpu_init		/* notrace */
	movq	%rbx, %rdi
	movq	%r12, %rsi
	movq	%r13, %rdx
	call	mini_main		/* does not return */
.Lpark:
	cli
	hlt
	jmp	.Lpark
	.size _start, . - _start

#ifdef MINI_RETHUNK
/* mini-rethunk (C built with -mfunction-return=thunk-extern): every C
 * function returns by `jmp __x86_return_thunk`, as in a kernel built with
 * CONFIG_MITIGATION_RETHUNK. The thunk counts this CPU's returns in its
 * per-CPU return_thunk_hits (support.c; incq clobbers flags only, as the
 * kernel's thunks) and returns. */
	.globl __x86_return_thunk
	.type __x86_return_thunk, @function
__x86_return_thunk:
	incq	%gs:return_thunk_hits
	ret
	int3
	.size __x86_return_thunk, . - __x86_return_thunk

/* What a site's `call __fentry__` reached before ftrace NOPed it: on such a
 * kernel, its RET is `jmp __x86_return_thunk` (arch/x86/kernel/ftrace_64.S);
 * vmtrace reads it to learn how the kernel returns. As a kernel with call
 * depth tracking built in (6.2+) has it before applying its alternatives:
 * CALL_DEPTH_ACCOUNT's padding, ten one-byte NOPs, first (the
 * patched-in `sar` goes there; this guest applies none). */
	.globl __fentry__
	.type __fentry__, @function
__fentry__:
	.skip	10, 0x90
	jmp	__x86_return_thunk
	.size __fentry__, . - __fentry__
#endif

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

/* ---- graph=1 workload (README "graph=1") ---------------------------------
 *
 * Everything below is notrace (no NOP, no __mcount_loc entry) except
 * graph_tail_caller. */

/* void graph_tail_caller(struct graph_cpu *c): traced, and a tail call.
 * It starts with the same 5-byte NOP gcc's -mfentry -mnop-mcount emits and
 * records it in __mcount_loc exactly as gcc -mrecord-mcount does (a `.quad`
 * of the NOP's address in section __mcount_loc, "a"), counts itself and ends
 * with a `jmp` (not a call) to the traced C function graph_tail_callee, which
 * therefore runs with graph_tail_caller's return address at [RSP] and
 * returns straight to graph_tail_caller's caller. Written here because the
 * C code is built with -fno-optimize-sibling-calls. Like gcc without -pg,
 * the mini-noftrace build (no -DMINI_FTRACE) has neither NOP nor entry. */
	.text
	.globl graph_tail_caller
	.type graph_tail_caller, @function
	.p2align 4
graph_tail_caller:
#ifdef MINI_FTRACE /* build.sh: with -pg, not for mini-noftrace */
1:	.byte	0x0f, 0x1f, 0x44, 0x00, 0x00	/* nopl 0(%rax,%rax,1): the ftrace site */
	.pushsection __mcount_loc, "a", @progbits
	.quad	1b				/* its __mcount_loc entry */
	.popsection
#endif
	incq	8 * G_graph_tail_caller(%rdi)	/* c->count[G_graph_tail_caller]++ (rdi = c, per-CPU) */
	jmp	graph_tail_callee		/* sibling call: rdi (c) passed on, [rsp] unchanged */
	.size graph_tail_caller, . - graph_tail_caller

/* int graph_setjmp(u64 *jb): save the callee-saved registers, the stack
 * pointer the caller will have after this returns and the return address,
 * then return 0. graph_longjmp(jb, v) later "returns" from this call again,
 * with v. Offsets GJB_* are in mini.h. */
	.globl graph_setjmp
	.type graph_setjmp, @function
	.p2align 4
graph_setjmp:
	movq	%rbx, GJB_RBX(%rdi)		/* callee-saved registers ... */
	movq	%rbp, GJB_RBP(%rdi)
	movq	%r12, GJB_R12(%rdi)
	movq	%r13, GJB_R13(%rdi)
	movq	%r14, GJB_R14(%rdi)
	movq	%r15, GJB_R15(%rdi)		/* ... all six saved */
	leaq	8(%rsp), %rdx			/* the caller's RSP once our return address is popped */
	movq	%rdx, GJB_RSP(%rdi)		/* saved */
	movq	(%rsp), %rdx			/* our return address: the continuation in the caller */
	movq	%rdx, GJB_RIP(%rdi)		/* saved */
	xorl	%eax, %eax			/* return 0: "saved" */
	ret					/* back to the caller (notrace: never hooked) */
	.size graph_setjmp, . - graph_setjmp

/* void graph_longjmp(u64 *jb, int val): does not return. Restores what
 * graph_setjmp saved and continues after that graph_setjmp call, which
 * returns val (1 if val is 0). Every frame between the two (on the mini
 * guest: graph_abandoned's, with its return address slot) is abandoned:
 * nothing ever returns through it. */
	.globl graph_longjmp
	.type graph_longjmp, @function
	.p2align 4
graph_longjmp:
	movl	%esi, %eax			/* graph_setjmp's second return value */
	testl	%eax, %eax			/* is it 0? */
	jnz	1f				/* no: keep it */
	incl	%eax				/* yes: 1, so the caller can tell the two returns apart */
1:	movq	GJB_RBX(%rdi), %rbx		/* callee-saved registers ... */
	movq	GJB_RBP(%rdi), %rbp
	movq	GJB_R12(%rdi), %r12
	movq	GJB_R13(%rdi), %r13
	movq	GJB_R14(%rdi), %r14
	movq	GJB_R15(%rdi), %r15		/* ... all six restored */
	movq	GJB_RSP(%rdi), %rsp		/* the stack as graph_setjmp's caller had it: frames below are dropped */
	jmpq	*GJB_RIP(%rdi)			/* continue after the graph_setjmp call */
	.size graph_longjmp, . - graph_longjmp

/* void graph_switch(u64 *save, const u64 *load): switch stacks, the way
 * Linux's __switch_to_asm does. The current context (its callee-saved
 * registers pushed on its own stack, then RSP) is stored in *save; the
 * context whose RSP is in *load is resumed: its registers are popped from
 * its stack and `ret` returns to where it last called graph_switch (or, for
 * a new stack, to the address workload.c put there). The store of RSP is the
 * last access to the old stack, so another vCPU that sees *save change may
 * resume this context at once (x86 stores are seen in order: the pushes
 * before the RSP). */
	.globl graph_switch
	.type graph_switch, @function
	.p2align 4
graph_switch:
	pushq	%rbp				/* save this context's callee-saved registers ... */
	pushq	%rbx
	pushq	%r12
	pushq	%r13
	pushq	%r14
	pushq	%r15				/* ... on its own stack */
	movq	%rsp, (%rdi)			/* *save = RSP: this context can be resumed from now on */
	movq	(%rsi), %rsp			/* RSP = *load: now on the other context's stack */
	popq	%r15				/* its callee-saved registers ... */
	popq	%r14
	popq	%r13
	popq	%r12
	popq	%rbx
	popq	%rbp				/* ... restored (in reverse push order) */
	ret					/* into the other context */
	.size graph_switch, . - graph_switch

	.section .bss
	/* 16 KiB-aligned: each stack below is exactly one 16 KiB-aligned region. */
	.balign STACK_SIZE
	.globl mini_stacks
	.type mini_stacks, @object
mini_stacks:
	.skip STACK_SIZE * MAX_CPUS
	.size mini_stacks, . - mini_stacks

	/* graph_migrate's task stack (graph=1, 2 or more vCPUs): one more
	 * 16 KiB-aligned region, used by vCPU 0 first and then by vCPU 1. */
	.balign STACK_SIZE
	.globl mini_task_stack
	.type mini_task_stack, @object
mini_task_stack:
	.skip STACK_SIZE
	.size mini_task_stack, . - mini_task_stack

	.section .note.GNU-stack, "", @progbits
