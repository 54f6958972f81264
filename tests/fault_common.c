// SPDX-License-Identifier: MIT
/* Shared by the fault tests: the tiny model, pagers over a fault tier, guarded checked reads. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fault_common.h"

struct fx fx;

void fx_setup(const char *path)
{
	if (path) {
		snprintf(fx.path, sizeof(fx.path), "%s", path);
	} else {
		snprintf(fx.path, sizeof(fx.path), "%s", t_path("tiny.mpk"));
		assert_int_equal(t_gen_tiny(fx.path, MP_DTYPE_F32, 42), 0);
	}
	assert_int_equal(mp_store_open(fx.path, &fx.store), 0);
	fx.geo = mp_store_geometry(fx.store);
	fx.xbytes = mp_store_expert_bytes(fx.store);
}

void fx_teardown(void)
{
	mp_store_close(fx.store);
	fx.store = NULL;
}

int fx_group_setup(void **state)
{
	(void)state;
	fx_log_capture();
	fx_setup(NULL);
	return 0;
}

int fx_group_teardown(void **state)
{
	(void)state;
	fx_teardown();
	t_tmpdir_cleanup();
	return 0;
}

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char logbuf[1 << 16];
static size_t loglen;

static void capture(enum mp_log_level level, const char *msg, void *arg)
{
	size_t n = strlen(msg);

	(void)level;
	(void)arg;
	pthread_mutex_lock(&log_lock);
	/* Keeps the newest lines: a full buffer drops its older half. */
	if (loglen + n + 2 > sizeof(logbuf)) {
		size_t keep = loglen > sizeof(logbuf) / 2 ? sizeof(logbuf) / 2 : loglen;

		memmove(logbuf, logbuf + loglen - keep, keep);
		loglen = keep;
	}
	if (loglen + n + 2 <= sizeof(logbuf)) {
		memcpy(logbuf + loglen, msg, n);
		loglen += n;
		logbuf[loglen++] = '\n';
		logbuf[loglen] = 0;
	}
	pthread_mutex_unlock(&log_lock);
	if (getenv("T_VERBOSE"))
		fprintf(stderr, "log: %s\n", msg);
}

void fx_log_capture(void)
{
	mp_set_log_handler(capture, NULL);
}

void fx_log_reset(void)
{
	pthread_mutex_lock(&log_lock);
	loglen = 0;
	logbuf[0] = 0;
	pthread_mutex_unlock(&log_lock);
}

bool fx_log_contains(const char *needle)
{
	bool found;

	pthread_mutex_lock(&log_lock);
	found = strstr(logbuf, needle) != NULL;
	pthread_mutex_unlock(&log_lock);
	return found;
}

struct wrap_arg {
	const char *spec;
	uint64_t seed;
};

static int wrap(void *arg, struct mp_tier *lower, struct mp_tier **out)
{
	const struct wrap_arg *w = arg;

	return mp_tier_inject_open(lower, w->spec, w->seed, out);
}

struct mp_pager *fx_open(struct mp_store *s, const char *spec, uint64_t seed,
			 uint32_t budget_experts, struct mp_pager_config *cfg)
{
	struct wrap_arg w = { spec, seed };
	struct mp_pager_hooks hooks = { .wrap_tier = wrap, .arg = &w };
	struct mp_pager_config def;
	struct mp_pager *p = NULL;
	int err;

	if (!cfg) {
		mp_pager_config_init(&def);
		def.budget_bytes = budget_experts * fx.xbytes;
		def.no_route_fill = true;
		cfg = &def;
	}
	err = mp_pager_open_hooked(s ? s : fx.store, cfg, &hooks, &p);
	if (err == -EPERM || err == -EOPNOTSUPP) {
		print_message("userfaultfd unavailable: %s\n", mp_last_error());
		exit(t_require_all() ? 1 : T_EXIT_SKIP);
	}
	if (err)
		fail_msg("mp_pager_open: %s (%s)", strerror(-err), mp_last_error());
	return p;
}

void fx_counts(struct mp_pager *p, struct mp_fault_counts *out)
{
	mp_tier_inject_counts(p->tier, out);
}

struct check {
	const uint8_t *x;
	uint64_t bytes;
	uint64_t sum;
};

static int check_expert(void *arg)
{
	struct check *c = arg;

	return mp_checksum(c->x, c->bytes) == c->sum ? 0 : -EILSEQ;
}

int fx_read(struct mp_pager *p, uint32_t layer, uint32_t expert)
{
	struct mp_store *s = mp_pager_store(p);
	struct check c = {
		.x = mp_pager_expert(p, layer, expert),
		.bytes = mp_store_expert_bytes(s),
		.sum = mp_store_expert(s, layer, expert)->checksum,
	};

	if (!c.x)
		return -EINVAL;
	return mp_pager_guard(p, check_expert, &c);
}

bool fx_join(pthread_t th, uint32_t ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return pthread_timedjoin_np(th, NULL, &ts) == 0;
}
