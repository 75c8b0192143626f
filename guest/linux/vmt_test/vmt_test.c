// SPDX-License-Identifier: GPL-2.0
/*
 * vmt_test: the module vmtrace's module tests load into Debian's 6.12 cloud
 * kernel. Writing a decimal K to /proc/vmt_test calls vmt_hit() K times
 * (and vmt_batch() once around them), so that a trace counts exactly K.
 * Each function has its ftrace call site (__fentry__) under its own name:
 * noipa keeps GCC from inlining them or calling a clone (vmt_batch.isra.0).
 * Each vmt_hit() call is preceded by the event vmt_test:vmt_event (k, i),
 * fired from vmt_batch() so that vmt_hit's own code stays as it was.
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/proc_fs.h>
#include <linux/uaccess.h>

#define CREATE_TRACE_POINTS
#include "vmt_test_trace.h"

#define vmt_noipa noinline __attribute__((__noipa__))

static unsigned long vmt_total;

static vmt_noipa void vmt_hit(unsigned long i)
{
	WRITE_ONCE(vmt_total, vmt_total + i + 1);
}

static vmt_noipa unsigned long vmt_batch(unsigned long k)
{
	unsigned long i;

	for (i = 0; i < k; i++) {
		trace_vmt_event(k, i);
		vmt_hit(i);
	}
	return k;
}

static ssize_t vmt_write(struct file *f, const char __user *buf, size_t len,
			 loff_t *pos)
{
	unsigned long k;
	int err = kstrtoul_from_user(buf, len, 10, &k);

	if (err)
		return err;
	vmt_batch(k);
	return len;
}

static const struct proc_ops vmt_ops = {
	.proc_write = vmt_write,
};

static struct proc_dir_entry *vmt_entry;

static int __init vmt_init(void)
{
	vmt_entry = proc_create("vmt_test", 0200, NULL, &vmt_ops);
	return vmt_entry ? 0 : -ENOMEM;
}

static void __exit vmt_exit(void)
{
	proc_remove(vmt_entry);
}

module_init(vmt_init);
module_exit(vmt_exit);
MODULE_DESCRIPTION("vmtrace's test module: vmt_hit() K times per write to /proc/vmt_test");
MODULE_LICENSE("GPL");
