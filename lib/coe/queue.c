// SPDX-License-Identifier: MIT
/* An executor's request queue and request arranging (see queue.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "coe/queue.h"

int coe_queue_init(struct coe_queue *q, uint32_t n_models, uint32_t *queued)
{
	memset(q, 0, sizeof(*q));
	q->running = -1;
	q->queued = queued;
	q->count = calloc(n_models, sizeof(*q->count));
	q->last = calloc(n_models, sizeof(*q->last));
	if (!q->count || !q->last) {
		coe_queue_fini(q);
		return -ENOMEM;
	}
	return 0;
}

void coe_queue_fini(struct coe_queue *q)
{
	while (q->head) {
		struct creq *r = q->head;

		q->head = r->next;
		free(r);
	}
	free(q->count);
	free(q->last);
	memset(q, 0, sizeof(*q));
}

static void insert(struct coe_queue *q, struct creq *r, struct creq *after)
{
	r->prev = after;
	r->next = after ? after->next : q->head;
	if (r->next)
		r->next->prev = r;
	else
		q->tail = r;
	if (after)
		after->next = r;
	else
		q->head = r;
	q->count[r->model]++;
	if (q->queued)
		q->queued[r->model]++;
	/* Requests go at the end or right behind their model's last one: it is the last now. */
	q->last[r->model] = r;
	q->T += r->pred;
}

void coe_queue_add(struct coe_queue *q, struct creq *r, bool arrange, bool in_memory)
{
	struct creq *after = q->tail, *last = q->last[r->model];

	r->front = false;
	if (arrange && last) {
		after = last;
		r->front = last->front;
	} else if (arrange && (in_memory || q->running == (int)r->model)) {
		after = q->front_tail;
		r->front = true;
	}
	if (r->front && after == q->front_tail)
		q->front_tail = r;
	insert(q, r, after);
}

struct creq *coe_queue_pop(struct coe_queue *q)
{
	struct creq *r = q->head;

	if (q->front_tail == r)
		q->front_tail = NULL;
	q->head = r->next;
	if (q->head)
		q->head->prev = NULL;
	else
		q->tail = NULL;
	/* Requests leave from the head: the model's last one stays while any is left. */
	if (!--q->count[r->model])
		q->last[r->model] = NULL;
	if (q->queued)
		q->queued[r->model]--;
	q->T -= r->pred;
	r->prev = r->next = NULL;
	return r;
}
