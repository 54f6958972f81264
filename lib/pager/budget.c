// SPDX-License-Identifier: MIT
/*
 * The budget: parsing it ("8G", "512M", "40%"), choosing it at open, making
 * room for a fill (the eviction policy picks the victims), shrinking to it.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "pager/pager_priv.h"

/* Longest wait for budget before looking again (a fill ends or grace runs out sooner). */
#define BUDGET_WAIT_NS	(100ull * 1000 * 1000)
/* Longest wait for the room of a read whose deferred eviction will drop it. */
#define PENDING_WAIT_NS	(1000ull * 1000 * 1000)

int mp_budget_parse(const char *s, uint64_t model_bytes, uint64_t *out)
{
	const char *p;
	char *end;
	double v, mult = 1;

	if (!s || !*s)
		return mp_err(-EINVAL, "budget: empty string (want e.g. 8G, 512M or 40%%)");
	for (p = s; *p; p++)
		if (!isdigit((unsigned char)*p) && !strchr(".%KkMmGgTtBbi", *p))
			return mp_err(-EINVAL, "budget '%s': unexpected character '%c' (want e.g. "
				      "8G, 512M or 40%%)", s, *p);
	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno || !isfinite(v) || v <= 0)
		return mp_err(-EINVAL, "budget '%s': not a positive number", s);
	if (!strcmp(end, "%")) {
		if (v > 100)
			return mp_err(-EINVAL, "budget '%s': more than 100%% of the experts", s);
		if (!model_bytes)
			return mp_err(-EINVAL, "budget '%s': a percentage needs the model's size",
				      s);
		*out = (uint64_t)((double)model_bytes * v / 100.0);
		return 0;
	}
	switch (toupper((unsigned char)*end)) {
	case 'T':
		mult *= 1024;
		/* fall through */
	case 'G':
		mult *= 1024;
		/* fall through */
	case 'M':
		mult *= 1024;
		/* fall through */
	case 'K':
		mult *= 1024;
		end++;
		break;
	default:
		break;
	}
	/* Allow the unit spelt out: "8GB", "8GiB", "4096B". */
	if (*end == 'i' && mult > 1)
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end)
		return mp_err(-EINVAL, "budget '%s': unknown unit '%s' (K, M, G, T or %%)", s, end);
	v *= mult;
	if (v >= 18446744073709551615.0)
		return mp_err(-EINVAL, "budget '%s': too large", s);
	*out = (uint64_t)v;
	return 0;
}

/* The budget from the config, $MOEPAGER_BUDGET, or the default; checked against one expert. */
int mp_pager_resolve_budget(struct mp_pager *p, const struct mp_pager_config *cfg)
{
	uint64_t total = mp_store_total_expert_bytes(p->store), b = 0;
	const char *env = getenv("MOEPAGER_BUDGET");
	const char *from = "config";
	int err;

	if (cfg->budget_bytes) {
		b = cfg->budget_bytes;
	} else if (cfg->budget && *cfg->budget) {
		err = mp_budget_parse(cfg->budget, total, &b);
		if (err)
			return err;
	} else if (env && *env) {
		from = "MOEPAGER_BUDGET";
		err = mp_budget_parse(env, total, &b);
		if (err)
			return err;
	} else {
		long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
		uint64_t half = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 2 : total;

		from = "default";
		b = MP_MIN(total, half);
	}
	if (b < p->expert_bytes)
		return plog_err(p, -EINVAL, "budget %llu bytes (%s) is below one expert "
				"(%llu bytes)",
				(unsigned long long)b, from, (unsigned long long)p->expert_bytes);
	p->mem.budget = b;
	plog_debug(p, "budget %llu bytes (%s): %.1f experts of %llu", (unsigned long long)b, from,
		   (double)b / (double)p->expert_bytes, (unsigned long long)total);
	return 0;
}

void mp_pager_wait_ns(struct mp_pager *p, pthread_cond_t *cv, uint64_t ns)
{
	struct timespec ts;
	uint64_t t;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + ns;
	ts.tv_sec = (time_t)(t / 1000000000ull);
	ts.tv_nsec = (long)(t % 1000000000ull);
	pthread_cond_timedwait(cv, &p->lock, &ts);
}

struct evict_scan {
	struct mp_pager *p;
	uint64_t now;
	uint64_t next_ok;	/* earliest time a skipped candidate becomes evictable */
};

static bool evictable(void *arg, uint32_t key)
{
	struct evict_scan *c = arg;
	struct mp_pager *p = c->p;
	struct slot *s = &p->slots[key];

	if (s->state != ST_MAPPED && s->state != ST_HOST)
		return false;
	if (s->evict_retry_at > c->now) {
		c->next_ok = MP_MIN(c->next_ok, s->evict_retry_at);
		return false;
	}
	return true;
}

/*
 * When the threads that faulted a slot in may first read it: until then
 * the slot is not evicted, so a reader under a tight budget is not
 * starved by a refill racing its read. 0 when it may go now.
 */
static uint64_t grace_end(const struct mp_pager *p, const struct slot *s, uint64_t now)
{
	/*
	 * Only a budget that cannot hold one expert per fill thread and one
	 * more lets concurrent fills evict each other's fresh experts; with
	 * more room the policy's victim is old enough, and waiting on it
	 * would only stall the fill.
	 */
	if (p->mem.budget >= (uint64_t)(p->nworkers + 2) * p->expert_bytes)
		return 0;
	if (s->demanded && s->state == ST_MAPPED && now - s->mapped_at < p->mem.min_resident_ns)
		return s->mapped_at + p->mem.min_resident_ns;
	return 0;
}

/*
 * Resident bytes once the room on its way is back: evictions in flight, and
 * reads whose deferred eviction drops them when they end (which may also
 * be evicted meanwhile, counted twice for a moment: hence the floor).
 */
static uint64_t resident_after_coming(const struct mp_pager *p)
{
	uint64_t coming = p->mem.dropping + p->mem.pending_drop;

	return p->mem.resident > coming ? p->mem.resident - coming : 0;
}

/*
 * A read that a deferred eviction drops when it ends makes the room too:
 * waits for it (its fill wakes this wait then, or when it fails) and
 * returns true, for up to PENDING_WAIT_NS from *until's first setting; a
 * read stuck longer is not waited for.
 */
static bool waited_for_pending(struct mp_pager *p, uint64_t now, uint64_t *until)
{
	if (resident_after_coming(p) + p->expert_bytes > p->mem.budget)
		return false;
	if (!*until)
		*until = now + PENDING_WAIT_NS;
	if (now >= *until)
		return false;
	mp_pager_wait_ns(p, &p->state_cv, MP_MIN(*until - now, BUDGET_WAIT_NS));
	return true;
}

/*
 * Makes room for one expert and reserves it for slot. Called locked by a
 * fill worker; evicts victims the policy picks, and waits when every
 * candidate is busy or within its minimum residency. -EAGAIN: a prefetch
 * that may not evict the victim (mp_evict_admit()), nothing reserved.
 */
int mp_pager_reserve(struct mp_pager *p, uint32_t slot)
{
	uint64_t pending_until = 0;

	while (p->mem.resident + p->expert_bytes > p->mem.budget) {
		struct evict_scan c = { p, mp_now_ns(), UINT64_MAX };
		int64_t v;

		if (atomic_load(&p->closing))
			return -ESHUTDOWN;
		if (p->broken)
			return -EPIPE;
		/* Another thread's eviction in flight makes the room: wait for it, evict no more. */
		if (p->mem.resident - p->mem.dropping + p->expert_bytes <= p->mem.budget) {
			mp_pager_wait_ns(p, &p->state_cv, BUDGET_WAIT_NS);
			continue;
		}
		if (waited_for_pending(p, c.now, &pending_until))
			continue;
		v = p->evict.ops->pick_victim(&p->evict, evictable, &c);
		/*
		 * A prefetch never evicts an expert predicted to be needed before
		 * the one it brings (prefetch/policy.h hints): it is given up, like an
		 * unwanted prefetch, unless a thread already waits for it.
		 */
		if (v >= 0 && p->slots[slot].prefetched && !p->slots[slot].waiters &&
		    !mp_evict_admit(p->evict.env.hints, slot, (uint32_t)v))
			return -EAGAIN;
		if (v >= 0) {
			/* The policy's choice stands; if it is still in its grace, wait for it. */
			uint64_t until = grace_end(p, &p->slots[v], c.now);

			if (until) {
				mp_pager_wait_ns(p, &p->state_cv, until - c.now + 1000);
				continue;
			}
			mp_pager_evict_locked(p, (uint32_t)v, false);
			continue;
		}
		if (!p->mem.resident)
			return plog_err(p, -ENOSPC, "budget %llu cannot hold one expert "
					"(%llu bytes)",
					(unsigned long long)p->mem.budget,
					(unsigned long long)p->expert_bytes);
		mp_pager_wait_ns(p, &p->state_cv, c.next_ok != UINT64_MAX ?
			     MP_MIN(c.next_ok - c.now, BUDGET_WAIT_NS) + 1000 : BUDGET_WAIT_NS);
	}
	p->mem.resident += p->expert_bytes;
	p->mem.resident_n++;
	p->mem.resident_peak = MP_MAX(p->mem.resident_peak, p->mem.resident);
	return 0;
}

/*
 * Evicts until the budget holds (after it shrank). Called locked, off the
 * handler. Evictions other threads have in flight (and deferred ones) count
 * as done, so two threads enforcing at once do not both evict for the same
 * excess.
 */
void mp_pager_enforce_budget(struct mp_pager *p)
{
	while (resident_after_coming(p) > p->mem.budget && !p->broken) {
		struct evict_scan c = { p, mp_now_ns(), UINT64_MAX };
		int64_t v = p->evict.ops->pick_victim(&p->evict, evictable, &c);

		if (v < 0)
			break;
		mp_pager_evict_locked(p, (uint32_t)v, false);
	}
}

/*
 * Waits, locked, for the evictions other threads have in flight while the
 * budget is exceeded: mp_pager_enforce_budget() counted them as done, and
 * mp_pager_set_budget() promises the budget holds when it returns. Enforces
 * again after each, as one that failed leaves its expert in place.
 */
static void wait_for_dropping(struct mp_pager *p)
{
	uint64_t deadline = mp_now_ns() + PENDING_WAIT_NS;

	while (p->mem.resident > p->mem.budget && p->mem.dropping && !p->broken &&
	       mp_now_ns() < deadline) {
		mp_pager_wait_ns(p, &p->state_cv, BUDGET_WAIT_NS);
		mp_pager_enforce_budget(p);
	}
}

int mp_pager_set_budget(struct mp_pager *p, uint64_t bytes)
{
	if (bytes < p->expert_bytes)
		return plog_err(p, -EINVAL, "budget %llu bytes is below one expert (%llu bytes)",
				(unsigned long long)bytes, (unsigned long long)p->expert_bytes);
	pthread_mutex_lock(&p->lock);
	/* Stored atomically: a fill reads it unlocked (fill.c: slack_for_one). */
	__atomic_store_n(&p->mem.budget, bytes, __ATOMIC_RELAXED);
	mp_pager_enforce_budget(p);
	wait_for_dropping(p);
	/* A smaller budget lowers the bound even when nothing had to be evicted. */
	mp_pager_trim_spares(p);
	pthread_cond_broadcast(&p->state_cv);
	pthread_mutex_unlock(&p->lock);
	return 0;
}

uint64_t mp_pager_budget(const struct mp_pager *p)
{
	return __atomic_load_n(&p->mem.budget, __ATOMIC_RELAXED);
}
