// SPDX-License-Identifier: MIT
/* Logging through an application-installed handler, and the per-thread last error. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

#include "base/base.h"

/*
 * The handler is process-wide on purpose, as libbpf_set_print() is: log
 * lines come from threads the application does not own (the fault handler),
 * so there is no per-call context to carry it.
 */
static mp_log_fn log_handler;
static void *log_handler_arg;
static _Thread_local char last_error[512];
static atomic_int log_max = MP_LOG_DEBUG;

void mp_set_log_handler(mp_log_fn fn, void *arg)
{
	log_handler = fn;
	log_handler_arg = arg;
}

void mp_set_log_level(enum mp_log_level max)
{
	atomic_store_explicit(&log_max, (int)max, memory_order_relaxed);
}

const char *mp_last_error(void)
{
	return last_error;
}

static void vlog(enum mp_log_level level, const char *fmt, va_list ap)
{
	char line[512];

	/* Nobody takes the line: errors are still kept for mp_last_error(). */
	if (level != MP_LOG_ERROR &&
	    (!log_handler || (int)level > atomic_load_explicit(&log_max, memory_order_relaxed)))
		return;
	vsnprintf(line, sizeof(line), fmt, ap);
	if (level == MP_LOG_ERROR)
		snprintf(last_error, sizeof(last_error), "%s", line);
	if (log_handler)
		log_handler(level, line, log_handler_arg);
}

void mp_log(enum mp_log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(level, fmt, ap);
	va_end(ap);
}

int mp_err(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(MP_LOG_ERROR, fmt, ap);
	va_end(ap);
	return err;
}
