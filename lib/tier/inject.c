// SPDX-License-Identifier: MIT
/* The fault-injection tier: parses MOEPAGER_FAULT rules and applies them to a tier's reads. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "tier/inject.h"

/* Longest injected delay: beyond it a spec is a typo, not a latency spike. */
#define MAX_DELAY_NS	(3600ull * 1000000000ull)
/* A delay sleeps in slices this long, so closing the pager never waits longer. */
#define DELAY_SLICE_NS	(5ull * 1000 * 1000)
/* Short reads and EIO stop on a page boundary, as a device's partial transfer does. */
#define CUT_ALIGN	4096u
#define RULE_TEXT_MAX	80

enum fault_op { OP_READ, OP_ALLOC };

enum fault_kind { K_EIO, K_ENOMEM, K_SHORT, K_CORRUPT, K_DELAY, K_RATE };

/* Salts of the independent draws one rule makes for one operation. */
enum { SALT_P = 1, SALT_POS = 2 };

struct rule {
	char text[RULE_TEXT_MAX];	/* as written, for messages */
	uint8_t op;			/* enum fault_op */
	uint8_t kind;			/* enum fault_kind */
	bool has_p;
	bool has_layer;
	bool has_expert;
	double p;
	uint64_t delay_ns;
	double rate;			/* read:rate=: bytes per second */
	_Atomic uint64_t rate_next_ns;	/* when the capped reads so far are done (mp_now_ns) */
	uint64_t every;			/* 0: every operation */
	uint64_t after;
	uint64_t count;			/* 0: no limit */
	uint32_t layer;
	uint32_t expert;
	_Atomic uint64_t seen;		/* matching operations so far */
	_Atomic uint64_t fired;
};

/* How many times each expert was read and allocated: the per-expert input of the draws. */
struct expert_counts {
	pthread_mutex_t lock;
	uint64_t *keys;			/* layer << 32 | expert, or KEY_NONE */
	uint64_t (*vals)[2];		/* [CNT_READ], [CNT_ALLOC] */
	uint32_t cap;			/* a power of two */
	uint32_t n;
	_Atomic uint64_t overflow;	/* used only when the table could not grow */
};

#define KEY_NONE	UINT64_MAX
enum { CNT_READ = 0, CNT_ALLOC = 1 };

/*
 * The rules and what they counted, with the tier they were opened on;
 * other files' tiers can share them (mp_tier_inject_share()), so the
 * state lives until the last tier using it is destroyed.
 */
struct tier_fault {
	struct mp_tier t;
	struct mp_tier *inner;
	_Atomic uint32_t refs;
	uint64_t seed;
	uint32_t nrules;
	struct rule *rules;
	struct expert_counts ec;
	struct {
		_Atomic uint64_t reads, eio, enomem, short_reads, corrupt, delays, alloc_enomem;
		_Atomic uint64_t rate_waits, rate_wait_ns;
	} c;
};

/*
 * Parser
 */

struct slice {
	const char *s;
	size_t len;
};

struct parse_ctx {
	const char *src;	/* "fault spec" or the environment variable's name */
	const char *spec;
	uint32_t ruleno;	/* 1-based */
	struct slice rule;
};

static bool slice_eq(struct slice a, const char *b)
{
	return a.len == strlen(b) && !memcmp(a.s, b, a.len);
}

static int __mp_printf(3, 4) bad(const struct parse_ctx *c, const char *at, const char *fmt, ...)
{
	char why[160];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return mp_err(-EINVAL, "%s: rule %u '%.*s', position %zu: %s", c->src, c->ruleno,
		      (int)c->rule.len, c->rule.s, (size_t)(at - c->spec) + 1, why);
}

/* Decimal digits only: no sign, no spaces, no hex, no overflow. */
static int parse_u64(struct slice v, uint64_t *out)
{
	uint64_t x = 0;

	if (!v.len)
		return -EINVAL;
	for (size_t i = 0; i < v.len; i++) {
		unsigned d = (unsigned)(v.s[i] - '0');

		if (d > 9 || x > (UINT64_MAX - d) / 10)
			return -EINVAL;
		x = x * 10 + d;
	}
	*out = x;
	return 0;
}

static int parse_u32(struct slice v, uint32_t *out)
{
	uint64_t x;

	if (parse_u64(v, &x) || x > UINT32_MAX)
		return -EINVAL;
	*out = (uint32_t)x;
	return 0;
}

/* A plain decimal number ("0.01", "50", "1.5"): strtod would also take "inf", "0x1p3", " 1". */
static int parse_decimal(struct slice v, size_t *used, double *out)
{
	char buf[40];
	size_t i = 0, dots = 0;

	while (i < v.len && ((v.s[i] >= '0' && v.s[i] <= '9') || v.s[i] == '.')) {
		dots += v.s[i] == '.';
		i++;
	}
	if (!i || dots > 1 || i >= sizeof(buf) || v.s[0] == '.' || v.s[i - 1] == '.')
		return -EINVAL;
	memcpy(buf, v.s, i);
	buf[i] = 0;
	*out = strtod(buf, NULL);
	*used = i;
	return 0;
}

static int parse_duration(const struct parse_ctx *c, struct slice v, uint64_t *ns)
{
	static const struct { const char *unit; double ns; } units[] = {
		{ "ns", 1 }, { "us", 1e3 }, { "ms", 1e6 }, { "s", 1e9 },
	};
	struct slice unit;
	size_t used;
	double x;

	if (parse_decimal(v, &used, &x))
		return bad(c, v.s, "delay '%.*s' is not a duration (e.g. 50ms, 200us, 1.5s)",
			   (int)v.len, v.s);
	unit = (struct slice){ v.s + used, v.len - used };
	for (size_t i = 0; i < MP_ARRAY_SIZE(units); i++) {
		if (!slice_eq(unit, units[i].unit))
			continue;
		x *= units[i].ns;
		if (x > (double)MAX_DELAY_NS)
			return bad(c, v.s, "delay '%.*s' is longer than an hour", (int)v.len, v.s);
		*ns = (uint64_t)llround(x);
		return 0;
	}
	return bad(c, unit.s, "delay '%.*s' needs a unit: ns, us, ms or s", (int)v.len, v.s);
}

/* Bytes per second: a decimal with an optional K, M, G or T (powers of 1024), above 0. */
static int parse_rate(const struct parse_ctx *c, struct slice v, double *out)
{
	static const char units[] = "KMGT";
	size_t used;
	double x;

	if (parse_decimal(v, &used, &x))
		return bad(c, v.s, "rate '%.*s' is not bytes per second (e.g. 64M, 500K)",
			   (int)v.len, v.s);
	if (used + 1 == v.len && strchr(units, v.s[used]) && v.s[used])
		x *= (double)(1ull << (10 * (strchr(units, v.s[used]) - units + 1)));
	else if (used != v.len)
		return bad(c, v.s + used, "rate '%.*s': unknown unit (K, M, G or T)", (int)v.len,
			   v.s);
	if (x < 1.0)
		return bad(c, v.s, "rate '%.*s' is below one byte per second", (int)v.len, v.s);
	*out = x;
	return 0;
}

static int parse_action(const struct parse_ctx *c, struct slice f, struct rule *r)
{
	static const struct { const char *name; uint8_t op; uint8_t kind; } actions[] = {
		{ "eio", OP_READ, K_EIO },
		{ "enomem", OP_READ, K_ENOMEM },
		{ "short", OP_READ, K_SHORT },
		{ "corrupt", OP_READ, K_CORRUPT },
		{ "enomem", OP_ALLOC, K_ENOMEM },
	};
	static const char *const op_names[] = { "read", "alloc" };
	const char *eq = memchr(f.s, '=', f.len);

	if (eq && r->op == OP_READ && (size_t)(eq - f.s) == 5 && !memcmp(f.s, "delay", 5)) {
		r->kind = K_DELAY;
		return parse_duration(c, (struct slice){ eq + 1, f.len - 6 }, &r->delay_ns);
	}
	if (eq && r->op == OP_READ && (size_t)(eq - f.s) == 4 && !memcmp(f.s, "rate", 4)) {
		r->kind = K_RATE;
		return parse_rate(c, (struct slice){ eq + 1, f.len - 5 }, &r->rate);
	}
	for (size_t i = 0; i < MP_ARRAY_SIZE(actions); i++) {
		if (actions[i].op == r->op && slice_eq(f, actions[i].name)) {
			r->kind = actions[i].kind;
			return 0;
		}
	}
	return bad(c, f.s, "unknown %s fault '%.*s' (%s)", op_names[r->op], (int)f.len, f.s,
		   r->op == OP_READ ? "eio, enomem, short, corrupt, delay=DURATION, rate=BYTES" :
		   "enomem");
}

static int parse_param(const struct parse_ctx *c, struct slice f, struct rule *r, unsigned *seen)
{
	static const char *const keys[] = { "p", "every", "after", "count", "expert", "layer" };
	static const char *const list = "p, every, after, count, expert, layer";
	const char *eq = memchr(f.s, '=', f.len);
	struct slice k, v;
	unsigned i;

	if (!eq)
		return bad(c, f.s, "'%.*s' is not key=value (%s)", (int)f.len, f.s, list);
	k = (struct slice){ f.s, (size_t)(eq - f.s) };
	v = (struct slice){ eq + 1, f.len - k.len - 1 };
	for (i = 0; i < MP_ARRAY_SIZE(keys); i++)
		if (slice_eq(k, keys[i]))
			break;
	if (i == MP_ARRAY_SIZE(keys))
		return bad(c, f.s, "unknown parameter '%.*s' (%s)", (int)k.len, k.s, list);
	if (*seen & (1u << i))
		return bad(c, f.s, "%s= given twice", keys[i]);
	*seen |= 1u << i;
	switch (i) {
	case 0: {
		size_t used;

		if (parse_decimal(v, &used, &r->p) || used != v.len || r->p > 1.0)
			return bad(c, v.s, "p=%.*s is not a probability in [0, 1]", (int)v.len,
				   v.s);
		r->has_p = true;
		return 0;
	}
	case 1:
		if (parse_u64(v, &r->every) || !r->every)
			return bad(c, v.s, "every=%.*s is not a count >= 1", (int)v.len, v.s);
		return 0;
	case 2:
		if (parse_u64(v, &r->after))
			return bad(c, v.s, "after=%.*s is not a count", (int)v.len, v.s);
		return 0;
	case 3:
		if (parse_u64(v, &r->count) || !r->count)
			return bad(c, v.s, "count=%.*s is not a count >= 1", (int)v.len, v.s);
		return 0;
	case 4: {
		const char *dot = memchr(v.s, '.', v.len);

		if (*seen & (1u << 5))
			return bad(c, f.s, "expert=L.E already names the layer; drop layer=");
		if (!dot || parse_u32((struct slice){ v.s, (size_t)(dot - v.s) }, &r->layer) ||
		    parse_u32((struct slice){ dot + 1, v.len - (size_t)(dot - v.s) - 1 },
			      &r->expert))
			return bad(c, v.s, "expert=%.*s is not LAYER.EXPERT (e.g. expert=1.3)",
				   (int)v.len, v.s);
		r->has_layer = r->has_expert = true;
		return 0;
	}
	default:
		if (*seen & (1u << 4))
			return bad(c, f.s, "expert=L.E already names the layer; drop layer=");
		if (parse_u32(v, &r->layer))
			return bad(c, v.s, "layer=%.*s is not a layer number", (int)v.len, v.s);
		r->has_layer = true;
		return 0;
	}
}

static int parse_rule(const struct parse_ctx *c, struct rule *r)
{
	const char *p = c->rule.s, *end = c->rule.s + c->rule.len;
	unsigned field = 0, seen = 0;
	int err;

	memset(r, 0, sizeof(*r));
	snprintf(r->text, sizeof(r->text), "%.*s", (int)c->rule.len, c->rule.s);
	for (;;) {
		const char *colon = memchr(p, ':', (size_t)(end - p));
		struct slice f = { p, (size_t)((colon ? colon : end) - p) };

		if (!f.len)
			return bad(c, p, "empty field (a rule is OP:FAULT[:KEY=VALUE...])");
		if (field == 0) {
			if (slice_eq(f, "read"))
				r->op = OP_READ;
			else if (slice_eq(f, "alloc"))
				r->op = OP_ALLOC;
			else
				return bad(c, p, "unknown operation '%.*s' (read, alloc)",
					   (int)f.len, f.s);
		} else if (field == 1) {
			err = parse_action(c, f, r);
			if (err)
				return err;
		} else {
			err = parse_param(c, f, r, &seen);
			if (err)
				return err;
		}
		field++;
		if (!colon)
			break;
		p = colon + 1;
	}
	if (field < 2)
		return bad(c, end, "'%.*s' names no fault (e.g. %.*s:eio)", (int)c->rule.len,
			   c->rule.s, (int)c->rule.len, c->rule.s);
	return 0;
}

/*
 * Parses spec into rules (NULL: only checks it). Returns the number of
 * rules or -EINVAL. An empty spec has none; one trailing ';' is allowed.
 */
static int parse_spec(const char *src, const char *spec, struct rule *rules)
{
	struct parse_ctx c = { .src = src, .spec = spec };
	struct rule scratch;
	const char *p = spec;
	uint32_t n = 0;

	if (!spec || !*spec)
		return 0;
	for (;;) {
		const char *semi = strchr(p, ';');
		size_t len = semi ? (size_t)(semi - p) : strlen(p);
		int err;

		if (!len && !semi && n)
			break;		/* a trailing ';' */
		c.ruleno = n + 1;
		c.rule = (struct slice){ p, len };
		if (!len)
			return bad(&c, p, "empty rule");
		err = parse_rule(&c, rules ? &rules[n] : &scratch);
		if (err)
			return err;
		if (++n > INT32_MAX / 2)
			return bad(&c, p, "too many rules");
		if (!semi)
			break;
		p = semi + 1;
	}
	return (int)n;
}

int mp_fault_spec_check(const char *spec)
{
	return parse_spec("fault spec", spec, NULL);
}

/*
 * Deterministic draws
 */

static uint64_t mix(uint64_t x)
{
	/* splitmix64's finaliser: every input bit affects every output bit. */
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t draw(const struct tier_fault *f, uint32_t rule, uint32_t salt, uint32_t layer,
		     uint32_t expert, uint64_t n)
{
	uint64_t h = mix(f->seed);

	h = mix(h ^ ((uint64_t)rule << 32 | salt));
	h = mix(h ^ ((uint64_t)layer << 32 | expert));
	return mix(h ^ n);
}

static double unit_interval(uint64_t h)
{
	return (double)(h >> 11) * 0x1.0p-53;
}

/* Returns how many times (layer, expert) went through `which` before, and counts this one. */
static uint64_t bump(struct expert_counts *ec, uint32_t layer, uint32_t expert, int which)
{
	uint64_t key = (uint64_t)layer << 32 | expert, ret;
	uint32_t i;

	pthread_mutex_lock(&ec->lock);
	if ((ec->n + 1) * 2 > ec->cap) {
		uint32_t cap = ec->cap ? ec->cap * 2 : 256;
		uint64_t *keys = malloc(cap * sizeof(*keys));
		uint64_t (*vals)[2] = calloc(cap, sizeof(*vals));

		if (keys && vals) {
			memset(keys, 0xff, cap * sizeof(*keys));
			for (uint32_t j = 0; j < ec->cap; j++) {
				if (ec->keys[j] == KEY_NONE)
					continue;
				i = (uint32_t)mix(ec->keys[j]) & (cap - 1);
				while (keys[i] != KEY_NONE)
					i = (i + 1) & (cap - 1);
				keys[i] = ec->keys[j];
				memcpy(vals[i], ec->vals[j], sizeof(vals[i]));
			}
			free(ec->keys);
			free(ec->vals);
			ec->keys = keys;
			ec->vals = vals;
			ec->cap = cap;
		} else {
			free(keys);
			free(vals);
		}
	}
	if (ec->n + 1 >= ec->cap) {
		/* Out of memory with a full table: draws stay random, just not per expert. */
		pthread_mutex_unlock(&ec->lock);
		return atomic_fetch_add(&ec->overflow, 1);
	}
	i = (uint32_t)mix(key) & (ec->cap - 1);
	while (ec->keys[i] != key && ec->keys[i] != KEY_NONE)
		i = (i + 1) & (ec->cap - 1);
	if (ec->keys[i] == KEY_NONE) {
		ec->keys[i] = key;
		ec->n++;
	}
	ret = ec->vals[i][which]++;
	pthread_mutex_unlock(&ec->lock);
	return ret;
}

/* Whether rule idx fires for this operation; n is the expert's count before it. */
static bool fires(struct tier_fault *f, uint32_t idx, uint32_t layer, uint32_t expert, uint64_t n)
{
	struct rule *r = &f->rules[idx];
	uint64_t seen, fired;

	if ((r->has_layer && layer != r->layer) || (r->has_expert && expert != r->expert))
		return false;
	seen = atomic_fetch_add(&r->seen, 1) + 1;
	if (seen <= r->after || (r->every && seen % r->every))
		return false;
	if (r->has_p && unit_interval(draw(f, idx, SALT_P, layer, expert, n)) >= r->p)
		return false;
	fired = atomic_load(&r->fired);
	do {
		if (r->count && fired >= r->count)
			return false;
	} while (!atomic_compare_exchange_weak(&r->fired, &fired, fired + 1));
	return true;
}

/*
 * The tier
 */

/* One read's interception: where to stop, which bit to flip. */
struct xfer {
	const struct mp_tier_read *rd;
	uint64_t done;		/* bytes handed on so far */
	uint64_t cut;		/* stop after this many bytes (UINT64_MAX: never) */
	uint64_t flip;		/* byte to corrupt (UINT64_MAX: none) */
	uint8_t flip_mask;
	bool flipped;
	bool stopped;		/* the cut ended the inner read */
};

static int xfer_ready(void *arg, const void *buf, size_t len)
{
	struct xfer *x = arg;
	int err;

	if (x->flip >= x->done && x->flip - x->done < len) {
		/* buf lies in the caller's destination chunks (rd->iov), which are writable. */
		((unsigned char *)(uintptr_t)buf)[x->flip - x->done] ^= x->flip_mask;
		x->flipped = true;
	}
	if (x->cut - x->done < len) {
		size_t part = (size_t)(x->cut - x->done);

		err = part ? x->rd->ready(x->rd->arg, buf, part) : 0;
		if (err)
			return err;
		x->done += part;
		x->stopped = true;
		/* Any nonzero value ends the inner read; fault_read turns it into the fault. */
		return -ECANCELED;
	}
	err = x->rd->ready(x->rd->arg, buf, len);
	if (!err)
		x->done += len;
	return err;
}

static int sleep_cancellable(uint64_t ns, const atomic_bool *cancel)
{
	while (ns) {
		uint64_t step = MP_MIN(ns, DELAY_SLICE_NS);
		struct timespec ts = { .tv_sec = (time_t)(step / 1000000000ull),
				       .tv_nsec = (long)(step % 1000000000ull) };

		if (cancel && atomic_load(cancel))
			return -ECANCELED;
		nanosleep(&ts, NULL);
		ns -= step;
	}
	return cancel && atomic_load(cancel) ? -ECANCELED : 0;
}

/*
 * read:rate=: the reads a rule matches pass one at a time through a device
 * of that many bytes per second, in arrival order, with no burst: a read
 * takes its turn after the reads before it and waits until its bytes are
 * through. Returns how long to wait from now.
 */
static uint64_t rate_wait(struct rule *r, uint64_t bytes, uint64_t now)
{
	uint64_t cost = (uint64_t)llround((double)bytes * 1e9 / r->rate);
	uint64_t cur = atomic_load(&r->rate_next_ns), next;

	do {
		next = MP_MAX(cur, now) + cost;
	} while (!atomic_compare_exchange_weak(&r->rate_next_ns, &cur, next));
	return next - now;
}

/* A page-aligned point strictly inside the expert's bytes (0 for an expert of one page). */
static uint64_t cut_point(const struct tier_fault *f, uint32_t idx, const struct mp_tier_read *rd,
			  uint64_t n)
{
	uint64_t pos = draw(f, idx, SALT_POS, rd->layer, rd->expert, n) % rd->bytes;

	return pos - pos % CUT_ALIGN;
}

/* f's rules applied to a read of inner (f's own tier, or a tier sharing them). */
static int fault_apply(struct tier_fault *f, struct mp_tier *inner, const struct mp_tier_read *rd)
{
	struct xfer x = { .rd = rd, .cut = UINT64_MAX, .flip = UINT64_MAX };
	struct mp_tier_read in = *rd;
	const struct rule *end = NULL, *flip = NULL;
	uint64_t n, delay = 0, capped = 0, now = mp_now_ns();
	int err;

	atomic_fetch_add(&f->c.reads, 1);
	n = bump(&f->ec, rd->layer, rd->expert, CNT_READ);
	/* Every rule is evaluated, so its counters do not depend on the others. */
	for (uint32_t i = 0; i < f->nrules; i++) {
		const struct rule *r = &f->rules[i];

		if (r->op != OP_READ || !fires(f, i, rd->layer, rd->expert, n))
			continue;
		switch (r->kind) {
		case K_DELAY:
			delay += r->delay_ns;
			break;
		case K_RATE: {
			/* Several caps on one read: it waits for the slowest. */
			uint64_t w = rate_wait(&f->rules[i], rd->bytes, now);

			capped = MP_MAX(capped, w);
			break;
		}
		case K_CORRUPT:
			if (!flip && rd->bytes) {
				uint64_t h = draw(f, i, SALT_POS, rd->layer, rd->expert, n);

				flip = r;
				x.flip = h % rd->bytes;
				x.flip_mask = (uint8_t)(1u << ((h >> 56) & 7));
			}
			break;
		default:
			/* The first failure in spec order decides how the read ends. */
			if (!end && rd->bytes) {
				end = r;
				x.cut = cut_point(f, i, rd, n);
			}
			break;
		}
	}
	if (delay) {
		atomic_fetch_add(&f->c.delays, 1);
		mp_debug("fault injection: layer %u expert %u: read delayed %.3f ms", rd->layer,
			 rd->expert, (double)delay / 1e6);
		if (sleep_cancellable(delay, rd->cancel))
			return -ECANCELED;
	}
	if (capped) {
		atomic_fetch_add(&f->c.rate_waits, 1);
		atomic_fetch_add(&f->c.rate_wait_ns, capped);
		if (sleep_cancellable(capped, rd->cancel))
			return -ECANCELED;
	}
	if (end && end->kind == K_ENOMEM) {
		atomic_fetch_add(&f->c.enomem, 1);
		return mp_err(-ENOMEM, "fault injection: layer %u expert %u: read refused for lack "
			      "of memory (rule '%s')", rd->layer, rd->expert, end->text);
	}
	if (!end && !flip)
		return mp_tier_read(inner, rd);

	in.ready = xfer_ready;
	in.arg = &x;
	err = mp_tier_read(inner, &in);
	if (x.flipped) {
		atomic_fetch_add(&f->c.corrupt, 1);
		mp_debug("fault injection: layer %u expert %u: bit %#x of byte %llu flipped "
			 "(rule '%s')", rd->layer, rd->expert, x.flip_mask,
			 (unsigned long long)x.flip, flip->text);
	}
	if (!x.stopped)
		return err;
	if (end->kind == K_SHORT) {
		atomic_fetch_add(&f->c.short_reads, 1);
		mp_debug("fault injection: layer %u expert %u: short read, %llu of %llu bytes "
			 "(rule '%s')", rd->layer, rd->expert, (unsigned long long)x.done,
			 (unsigned long long)rd->bytes, end->text);
		return 0;
	}
	atomic_fetch_add(&f->c.eio, 1);
	return mp_err(-EIO, "fault injection: layer %u expert %u: EIO after %llu of %llu bytes "
		      "(rule '%s')", rd->layer, rd->expert, (unsigned long long)x.done,
		      (unsigned long long)rd->bytes, end->text);
}

static int fault_read(struct mp_tier *t, const struct mp_tier_read *rd)
{
	struct tier_fault *f = container_of(t, struct tier_fault, t);

	return fault_apply(f, f->inner, rd);
}

static void fault_unref(struct tier_fault *f)
{
	if (atomic_fetch_sub(&f->refs, 1) != 1)
		return;
	pthread_mutex_destroy(&f->ec.lock);
	free(f->ec.keys);
	free(f->ec.vals);
	free(f->rules);
	free(f);
}

/* Its own file's tier goes now; the rules stay while a sharing tier uses them. */
static void fault_destroy(struct mp_tier *t)
{
	struct tier_fault *f = container_of(t, struct tier_fault, t);

	mp_tier_destroy(f->inner);
	f->inner = NULL;
	fault_unref(f);
}

static const struct mp_tier_ops fault_ops = {
	.name = "fault",
	.read = fault_read,
	.destroy = fault_destroy,
};

/* Another file's tier behind a fault tier's rules. */
struct tier_share {
	struct mp_tier t;
	struct mp_tier *inner;
	struct tier_fault *f;
};

static int share_read(struct mp_tier *t, const struct mp_tier_read *rd)
{
	struct tier_share *s = container_of(t, struct tier_share, t);

	return fault_apply(s->f, s->inner, rd);
}

static void share_destroy(struct mp_tier *t)
{
	struct tier_share *s = container_of(t, struct tier_share, t);

	mp_tier_destroy(s->inner);
	fault_unref(s->f);
	free(s);
}

static const struct mp_tier_ops share_ops = {
	.name = "fault-shared",
	.read = share_read,
	.destroy = share_destroy,
};

int mp_tier_inject_share(struct mp_tier *with, struct mp_tier **tier)
{
	struct tier_share *s;

	if (!mp_tier_is_fault(with))
		return 0;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->f = container_of(with, struct tier_fault, t);
	atomic_fetch_add(&s->f->refs, 1);
	s->inner = *tier;
	s->t.ops = &share_ops;
	s->t.number = s->inner->number;
	snprintf(s->t.name, sizeof(s->t.name), "%.34s with faults", s->inner->name);
	*tier = &s->t;
	return 0;
}

bool mp_tier_is_fault(const struct mp_tier *t)
{
	return t && t->ops == &fault_ops;
}

int mp_tier_inject_alloc(struct mp_tier *t, uint32_t layer, uint32_t expert)
{
	struct tier_fault *f;
	uint64_t n;

	if (!mp_tier_is_fault(t))
		return 0;
	f = container_of(t, struct tier_fault, t);
	n = bump(&f->ec, layer, expert, CNT_ALLOC);
	for (uint32_t i = 0; i < f->nrules; i++) {
		if (f->rules[i].op != OP_ALLOC || !fires(f, i, layer, expert, n))
			continue;
		atomic_fetch_add(&f->c.alloc_enomem, 1);
		return mp_err(-ENOMEM, "fault injection: layer %u expert %u: memory for the expert "
			      "refused (rule '%s')", layer, expert, f->rules[i].text);
	}
	return 0;
}

void mp_tier_inject_counts(const struct mp_tier *t, struct mp_fault_counts *out)
{
	const struct tier_fault *f;

	memset(out, 0, sizeof(*out));
	if (!mp_tier_is_fault(t))
		return;
	f = container_of(t, const struct tier_fault, t);
	out->reads = atomic_load(&f->c.reads);
	out->eio = atomic_load(&f->c.eio);
	out->enomem = atomic_load(&f->c.enomem);
	out->short_reads = atomic_load(&f->c.short_reads);
	out->corrupt = atomic_load(&f->c.corrupt);
	out->delays = atomic_load(&f->c.delays);
	out->alloc_enomem = atomic_load(&f->c.alloc_enomem);
	out->rate_waits = atomic_load(&f->c.rate_waits);
	out->rate_wait_ns = atomic_load(&f->c.rate_wait_ns);
}

static int fault_open(struct mp_tier *inner, const char *src, const char *spec, uint64_t seed,
		      struct mp_tier **out)
{
	struct tier_fault *f;
	int n;

	*out = NULL;
	n = parse_spec(src, spec, NULL);
	if (n < 0)
		return n;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->rules = calloc((size_t)MP_MAX(n, 1), sizeof(*f->rules));
	if (!f->rules) {
		free(f);
		return -ENOMEM;
	}
	parse_spec(src, spec, f->rules);
	f->nrules = (uint32_t)n;
	f->seed = seed;
	f->inner = inner;
	f->refs = 1;
	f->t.ops = &fault_ops;
	f->t.number = inner->number;
	pthread_mutex_init(&f->ec.lock, NULL);
	snprintf(f->t.name, sizeof(f->t.name), "%.34s with faults", inner->name);
	mp_info("fault injection on tier %s: %d rule%s from %s, seed %llu: %s", inner->name, n,
		n == 1 ? "" : "s", src, (unsigned long long)seed, spec ? spec : "");
	*out = &f->t;
	return 0;
}

int mp_tier_inject_open(struct mp_tier *inner, const char *spec, uint64_t seed,
		       struct mp_tier **out)
{
	return fault_open(inner, "fault spec", spec, seed, out);
}

int mp_tier_inject_wrap(struct mp_tier **tier, const char *spec, uint64_t seed)
{
	const char *src = "fault spec";
	struct mp_tier *w;
	int err;

	if (!spec) {
		spec = getenv(MP_FAULT_ENV);
		src = MP_FAULT_ENV;
	}
	if (!spec || !*spec)
		return 0;
	if (!seed) {
		const char *s = getenv(MP_FAULT_SEED_ENV);

		seed = MP_FAULT_DEFAULT_SEED;
		if (s && *s && parse_u64((struct slice){ s, strlen(s) }, &seed))
			return mp_err(-EINVAL, "%s: '%s' is not a decimal number",
				      MP_FAULT_SEED_ENV, s);
	}
	err = fault_open(*tier, src, spec, seed, &w);
	if (err)
		return err;
	*tier = w;
	return 0;
}
