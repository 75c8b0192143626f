/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vmt_test's one event, vmt_test:vmt_event: fired once per vmt_hit() call
 * of a batch, with the batch's size k and the call's index i, so that a
 * trace of the event counts exactly k per write (vmtrace's module event
 * tests, tests/qemu_modules.rs).
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM vmt_test

#if !defined(_VMT_TEST_TRACE_H) || defined(TRACE_HEADER_MULTI_READ)
#define _VMT_TEST_TRACE_H

#include <linux/tracepoint.h>

TRACE_EVENT(vmt_event,
	TP_PROTO(unsigned long k, unsigned long i),
	TP_ARGS(k, i),
	TP_STRUCT__entry(
		__field(unsigned long, k)
		__field(unsigned long, i)
	),
	TP_fast_assign(
		__entry->k = k;
		__entry->i = i;
	),
	TP_printk("k=%lu i=%lu", __entry->k, __entry->i)
);

#endif /* _VMT_TEST_TRACE_H */

/* This header is found beside vmt_test.c (Kbuild adds -I$(src)). */
#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE vmt_test_trace
#include <trace/define_trace.h>
