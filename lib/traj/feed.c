// SPDX-License-Identifier: MIT
/* The trajectory feed: the BPF ring buffer or the in-process recorder, one record format. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <moepager/traj.h>

#include "base/base.h"
#include "base/probes.h"
#include "traj/queue.h"
#include "traj/bpf_source.h"

#define DEFAULT_RING_BYTES	(4u << 20)
#define DEFAULT_QUEUE_RECORDS	4096u
/* The in-process recorder has no fd to sleep on: a waiting poll checks this often. */
#define INPROC_POLL_NS		1000000ull

struct mp_traj {
	enum mp_traj_source source;
	struct bpf_feed *bpf;
	struct traj_queue *q;
	int pid;
	_Atomic bool recording;		/* in-process: queue records only while started */
	uint64_t records;
	struct mp_traj_rec rec;		/* the record being handed to a poll callback */
};

static bool is_pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

static int check_opts(const struct mp_traj_opts *o)
{
	const struct mp_traj_range *r = &o->range;
	long page = sysconf(_SC_PAGESIZE);

	if (o->source > MP_TRAJ_SRC_INPROC)
		return mp_err(-EINVAL, "trajectory feed: unknown source %d", (int)o->source);
	if (o->pid < 0)
		return mp_err(-EINVAL, "trajectory feed: bad pid %d", o->pid);
	if (o->ring_bytes && (!is_pow2(o->ring_bytes) || o->ring_bytes < (uint64_t)page))
		return mp_err(-EINVAL, "trajectory feed: ring of %u bytes is not a power of two "
			      ">= the page size", o->ring_bytes);
	if (o->queue_records && (!is_pow2(o->queue_records) || o->queue_records < 2))
		return mp_err(-EINVAL, "trajectory feed: queue of %u records is not a power of two "
			      ">= 2", o->queue_records);
	if (r->slot_bytes) {
		if (!r->slots_per_layer || !r->layers || r->layers > MP_MAX_LAYERS)
			return mp_err(-EINVAL, "trajectory feed: expert range needs slots per "
				      "layer and 1..%u layers", MP_MAX_LAYERS);
		if (r->slot_bytes > UINT64_MAX / r->slots_per_layer / r->layers ||
		    r->base > UINT64_MAX - r->slot_bytes * r->slots_per_layer * r->layers)
			return mp_err(-EINVAL, "trajectory feed: expert range at 0x%llx overflows "
				      "the address space", (unsigned long long)r->base);
	}
	return 0;
}

int mp_traj_open(const struct mp_traj_opts *opts, struct mp_traj **out)
{
	struct mp_traj_opts o;
	struct mp_traj *t;
	int err, self = getpid();

	if (!opts || !out)
		return mp_err(-EINVAL, "trajectory feed: NULL argument");
	err = check_opts(opts);
	if (!err)
		err = mp_check_reserved(opts->reserved, MP_ARRAY_SIZE(opts->reserved),
					"trajectory options");
	if (err)
		return err;
	o = *opts;
	if (!o.pid)
		o.pid = self;
	if (!o.ring_bytes)
		o.ring_bytes = DEFAULT_RING_BYTES;
	if (!o.queue_records)
		o.queue_records = DEFAULT_QUEUE_RECORDS;
	if (o.source == MP_TRAJ_SRC_INPROC && o.pid != self)
		return mp_err(-EINVAL, "trajectory feed: the in-process recorder records only "
			      "this process (pid %d), not %d", self, o.pid);

	t = calloc(1, sizeof(*t));
	if (!t)
		return mp_err(-ENOMEM, "trajectory feed: out of memory");
	t->pid = o.pid;
	if (o.source != MP_TRAJ_SRC_INPROC) {
		/* Another process can only be recorded through BPF: no fallback for it. */
		bool fallback = o.source == MP_TRAJ_SRC_AUTO && o.pid == self;

		err = bpf_feed_open(&o, fallback ? MP_LOG_WARN : MP_LOG_ERROR, &t->bpf);
		if (!err) {
			t->source = MP_TRAJ_SRC_BPF;
			*out = t;
			return 0;
		}
		if (!fallback)
			goto err_free;
		mp_info("trajectory feed: in-process recorder (BPF unavailable: %s)",
			strerror(-err));
	}
	err = traj_queue_create(o.queue_records, &t->q);
	if (err)
		goto err_free;
	t->source = MP_TRAJ_SRC_INPROC;
	if (o.source == MP_TRAJ_SRC_INPROC)
		mp_info("trajectory feed: in-process recorder (requested), %u records",
			o.queue_records);
	*out = t;
	return 0;

err_free:
	free(t);
	return err;
}

int mp_traj_start(struct mp_traj *t)
{
	int err;

	if (!t)
		return mp_err(-EINVAL, "trajectory feed: NULL");
	if (t->source == MP_TRAJ_SRC_BPF) {
		err = bpf_feed_start(t->bpf);
		if (err)
			return err;
	}
	atomic_store(&t->recording, true);
	return 0;
}

static int poll_inproc(struct mp_traj *t, int timeout_ms, mp_traj_fn fn, void *arg)
{
	uint64_t deadline = mp_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000;
	/* Bounded by the capacity so a busy producer cannot keep one poll going. */
	uint64_t budget = 2 * DEFAULT_QUEUE_RECORDS;
	int n = 0, ret;

	for (;;) {
		while (budget-- && traj_queue_pop(t->q, &t->rec)) {
			n++;
			t->records++;
			ret = fn ? fn(&t->rec, arg) : 0;
			if (ret)
				return ret;
		}
		if (n || !timeout_ms || (timeout_ms > 0 && mp_now_ns() >= deadline))
			return n;
		struct timespec ts = { 0, INPROC_POLL_NS };

		if (nanosleep(&ts, NULL) && errno == EINTR)
			return -EINTR;
		budget = 2 * DEFAULT_QUEUE_RECORDS;
	}
}

struct count_ctx {
	struct mp_traj *t;
	mp_traj_fn fn;
	void *arg;
};

static int count_record(const struct mp_traj_rec *r, void *arg)
{
	struct count_ctx *c = arg;

	c->t->records++;
	return c->fn ? c->fn(r, c->arg) : 0;
}

int mp_traj_poll(struct mp_traj *t, int timeout_ms, mp_traj_fn fn, void *arg)
{
	struct count_ctx c = { t, fn, arg };

	if (!t)
		return mp_err(-EINVAL, "trajectory feed: NULL");
	if (t->source == MP_TRAJ_SRC_INPROC)
		return poll_inproc(t, timeout_ms, fn, arg);
	return bpf_feed_poll(t->bpf, timeout_ms, count_record, &c);
}

int mp_traj_stop(struct mp_traj *t)
{
	if (!t)
		return mp_err(-EINVAL, "trajectory feed: NULL");
	atomic_store(&t->recording, false);
	return t->source == MP_TRAJ_SRC_BPF ? bpf_feed_stop(t->bpf) : 0;
}

void mp_traj_close(struct mp_traj *t)
{
	if (!t)
		return;
	atomic_store(&t->recording, false);
	bpf_feed_close(t->bpf);
	traj_queue_destroy(t->q);
	free(t);
}

enum mp_traj_source mp_traj_source(const struct mp_traj *t)
{
	return t->source;
}

const char *mp_traj_source_name(enum mp_traj_source s)
{
	switch (s) {
	case MP_TRAJ_SRC_AUTO:
		return "auto";
	case MP_TRAJ_SRC_BPF:
		return "bpf";
	case MP_TRAJ_SRC_INPROC:
		return "inproc";
	}
	return "unknown";
}

const char *mp_traj_pin_dir(const struct mp_traj *t)
{
	return t->source == MP_TRAJ_SRC_BPF ? bpf_feed_pin_dir(t->bpf) : NULL;
}

const char *mp_traj_binary(const struct mp_traj *t)
{
	return t->source == MP_TRAJ_SRC_BPF ? bpf_feed_binary(t->bpf) : NULL;
}

int mp_traj_stats(const struct mp_traj *t, struct mp_traj_stats *out)
{
	if (!t || !out)
		return mp_err(-EINVAL, "trajectory feed: NULL argument");
	memset(out, 0, sizeof(*out));
	if (t->source == MP_TRAJ_SRC_BPF)
		bpf_feed_stats(t->bpf, out);
	else
		out->dropped = traj_queue_dropped(t->q);
	out->records = t->records;
	return 0;
}

static int counts_unsupported(void)
{
	return mp_err(-EOPNOTSUPP, "trajectory feed: the in-process recorder keeps no count maps "
		      "(count the polled records)");
}

int mp_traj_expert_stats(const struct mp_traj *t,
			 int (*fn)(const struct mp_traj_expert_stats *s, void *arg), void *arg)
{
	if (!t || !fn)
		return mp_err(-EINVAL, "trajectory feed: NULL argument");
	return t->source == MP_TRAJ_SRC_BPF ? bpf_feed_expert_stats(t->bpf, fn, arg) :
					      counts_unsupported();
}

int mp_traj_transitions(const struct mp_traj *t,
			int (*fn)(const struct mp_traj_transition *tr, void *arg), void *arg)
{
	if (!t || !fn)
		return mp_err(-EINVAL, "trajectory feed: NULL argument");
	return t->source == MP_TRAJ_SRC_BPF ? bpf_feed_transitions(t->bpf, fn, arg) :
					      counts_unsupported();
}

int mp_traj_fault_latency(const struct mp_traj *t,
			  int (*fn)(const struct mp_traj_hist *h, void *arg), void *arg)
{
	if (!t || !fn)
		return mp_err(-EINVAL, "trajectory feed: NULL argument");
	return t->source == MP_TRAJ_SRC_BPF ? bpf_feed_fault_latency(t->bpf, fn, arg) :
					      counts_unsupported();
}

static bool queueing(struct mp_traj *t)
{
	return t && t->source == MP_TRAJ_SRC_INPROC &&
	       atomic_load_explicit(&t->recording, memory_order_relaxed);
}

int mp_traj_route(struct mp_traj *t, uint32_t request, uint32_t token, uint32_t layer,
		  uint32_t k, const uint32_t *ids, const float *weights)
{
	struct mp_traj_rec r;

	if (!k || k > MP_TRAJ_MAX_K || !ids)
		return mp_err(-EINVAL, "route of request %u token %u layer %u: k=%u not in [1, %u]",
			      request, token, layer, k, MP_TRAJ_MAX_K);
	MP_PROBE(route, request, token, layer, k, ids, weights);
	if (!queueing(t))
		return 0;
	r.ts_ns = mp_now_ns();
	r.value = 0;
	r.kind = MP_TRAJ_ROUTE;
	r.tid = (uint32_t)gettid();
	r.request = request;
	r.token = token;
	r.layer = layer;
	r.expert = MP_TRAJ_NONE;
	r.tier = 0;
	r.err = 0;
	r.k = k;
	r.flags = weights ? MP_TRAJ_F_WEIGHTS : 0;
	memcpy(r.ids, ids, k * sizeof(*ids));
	if (weights)
		memcpy(r.weights, weights, k * sizeof(*weights));
	return traj_queue_push(t->q, &r);
}

int mp_traj_note(struct mp_traj *t, const struct mp_traj_rec *r)
{
	struct mp_traj_rec c;

	if (!r || r->kind < MP_TRAJ_ROUTE || r->kind > MP_TRAJ_PREFILL ||
	    (r->kind == MP_TRAJ_ROUTE && (!r->k || r->k > MP_TRAJ_MAX_K)))
		return mp_err(-EINVAL, "trajectory record: bad kind %u or k %u", r ? r->kind : 0,
			      r ? r->k : 0);
	if (!queueing(t))
		return 0;
	c = *r;
	if (!c.ts_ns)
		c.ts_ns = mp_now_ns();
	if (!c.tid)
		c.tid = (uint32_t)gettid();
	return traj_queue_push(t->q, &c);
}
