/* direct=1 (README "direct=1"): functions crafted for the direct-entry
 * rules of vmtrace (tracer/src/kernel/direct, docs/direct.md), written here
 * so that their bytes, and so the offsets each rule names, are the same in
 * every build. None has an ftrace site in any build (like notrace C
 * functions): a direct entry is the only way to trace them. Each takes
 * c = &mini_direct[cpu] in RDI and counts its call in c->count[D_*]; what
 * it returns lets its caller (workload.c's direct_iteration) check that it
 * ran right. The offsets in the comments are from the function's start;
 * tracer/tests/direct_mini.rs asserts the rule each one gets. */

#include "mini.h"

#define COUNT(d) (8 * (d))(%rdi)

	.text

/* u64 direct_riprel(c): safe, its first instruction RIP-relative (7
 * bytes, all displaced), to be rebased where a stub runs it: a load of
 * direct_riprel_magic, returned. Run unrebased, it would load other bytes,
 * which the caller reports (`mini: direct_riprel bad ...`). */
	.globl direct_riprel
	.type direct_riprel, @function
	.p2align 4
direct_riprel:
	movq	direct_riprel_magic(%rip), %rax	/* +0, 7 bytes: 48 8b 05 rel32 */
	incq	COUNT(D_direct_riprel)		/* +7 */
	ret
	.size direct_riprel, . - direct_riprel

/* void direct_endbr(c): safe, starts with endbr64 (IBT's landing pad, a
 * NOP without IBT), then a frame-pointer prologue: the site is at +4,
 * `push %rbp; mov %rsp,%rbp; incq` (1 + 3 + 4 = 8 bytes) displaced. */
	.globl direct_endbr
	.type direct_endbr, @function
	.p2align 4
direct_endbr:
	endbr64					/* +0, 4 bytes */
	pushq	%rbp				/* +4, the site */
	movq	%rsp, %rbp			/* +5 */
	incq	COUNT(D_direct_endbr)		/* +8, 4 bytes: 48 ff 47 disp8 */
	popq	%rbp				/* +12 */
	ret
	.size direct_endbr, . - direct_endbr

/* u64 direct_jcc(c, i): safe, a short `jz` (rel8) among the displaced
 * bytes (`testb; jz`: 4 + 2 = 6), to a target past them: relocated, it
 * must be widened to reach back. Returns i & 1, so a relocated branch
 * that goes the wrong way shows. */
	.globl direct_jcc
	.type direct_jcc, @function
	.p2align 4
direct_jcc:
	testb	$1, %sil			/* +0, 4 bytes: 40 f6 c6 01 */
	jz	1f				/* +4, 2 bytes: 74 rel8 */
	movl	$1, %eax			/* +6: i odd */
	jmp	2f
1:	xorl	%eax, %eax			/* i even */
2:	incq	COUNT(D_direct_jcc)
	ret
	.size direct_jcc, . - direct_jcc

/* u64 direct_jump_into(c): refused (jump-into-site): a loop whose branch
 * back lands at +2, inside the displaced bytes (xor, inc, cmp: 2 + 2 + 3 =
 * 7) past their first instruction, where a jump written at +0 would have
 * its middle. The loop runs twice; returns 2. */
	.globl direct_jump_into
	.type direct_jump_into, @function
	.p2align 4
direct_jump_into:
	xorl	%eax, %eax			/* +0, 2 bytes */
1:	incl	%eax				/* +2, 2 bytes: the branch's target */
	cmpl	$2, %eax			/* +4, 3 bytes */
	jb	1b				/* +7: back to +2 */
	incq	COUNT(D_direct_jump_into)
	ret
	.size direct_jump_into, . - direct_jump_into

/* u64 direct_table(c, i): refused (indirect-jump): a switch through a jump
 * table, as gcc compiles one with -mcmodel=kernel (`jmp
 * *table(,%rax,8)`, at +5), whose targets cannot be checked. Case k
 * returns k = i % DIRECT_TABLE_CASES. */
	.globl direct_table
	.type direct_table, @function
	.p2align 4
direct_table:
	movl	%esi, %eax			/* +0, 2 bytes */
	andl	$DIRECT_TABLE_CASES - 1, %eax	/* +2, 3 bytes */
	jmpq	*direct_table_targets(, %rax, 8) /* +5: ff 24 c5 disp32 */
.Ltable0:
	xorl	%eax, %eax
	jmp	1f
.Ltable1:
	movl	$1, %eax
	jmp	1f
.Ltable2:
	movl	$2, %eax
	jmp	1f
.Ltable3:
	movl	$3, %eax
1:	incq	COUNT(D_direct_table)
	ret
	.size direct_table, . - direct_table

/* u64 direct_extable(c): refused (ex-table): its first instruction, a load
 * of its own count, is listed in __ex_table (Linux 6.x's struct
 * exception_table_entry: s32 insn, fixup and type, each relative to
 * itself), as a kernel's get_user() is. It cannot fault here (the mini
 * guest has no fixup handler; the entry is only listed), and a direct
 * entry must not move it: the kernel finds the fixup by the faulting
 * instruction's address. Returns the count after this call. */
	.globl direct_extable
	.type direct_extable, @function
	.p2align 4
direct_extable:
.Lextable_insn:
	movq	COUNT(D_direct_extable), %rax	/* +0, 4 bytes: listed */
	incq	%rax				/* +4 */
	movq	%rax, COUNT(D_direct_extable)
	ret
.Lextable_fixup:				/* never reached */
	movq	$-14, %rax			/* -EFAULT, as a fixup would give */
	ret
	.size direct_extable, . - direct_extable

	.pushsection __ex_table, "a"
	.balign 4
	.long	.Lextable_insn - .		/* insn */
	.long	.Lextable_fixup - .		/* fixup */
	.long	1				/* type: EX_TYPE_DEFAULT */
	.popsection

	.section .rodata
	.balign 8
	.globl direct_riprel_magic
	.type direct_riprel_magic, @object
direct_riprel_magic:
	.quad	DIRECT_RIPREL_MAGIC
	.size direct_riprel_magic, . - direct_riprel_magic

	.type direct_table_targets, @object
direct_table_targets:
	.quad	.Ltable0, .Ltable1, .Ltable2, .Ltable3
	.size direct_table_targets, . - direct_table_targets

	.section .note.GNU-stack, "", @progbits
