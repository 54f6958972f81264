/* SPDX-License-Identifier: MIT */
/*
 * An executor's queue of requests, and request arranging (CoServe §4.2,
 * Fig. 9): a request goes right behind the queue's last request of its
 * model, so a model's requests are adjacent and its load is paid once per
 * group. A group whose model is in memory when it starts goes to the end
 * of the queue's front part, the groups that need no load, first come
 * first served among them: it runs before its model can be evicted, and
 * grows while the groups before it run. Called under the scheduler's lock.
 */
#ifndef MP_COE_QUEUE_H
#define MP_COE_QUEUE_H

#include <stdbool.h>
#include <stdint.h>

struct creq {
	uint32_t id;			/* the board request (its input) */
	uint32_t model;
	double pred;			/* predicted ns it adds to its queue */
	bool front;			/* in the queue's front part */
	struct creq *prev, *next;
};

struct coe_queue {
	struct creq *head, *tail;
	uint32_t *count;		/* per model: its requests in this queue */
	struct creq **last;		/* per model: the last of them */
	struct creq *front_tail;	/* the front part's last request, NULL: none */
	uint32_t *queued;		/* per model: where the queues count their requests
					 * (the scheduler's wanted[], shared), or NULL */
	double T;			/* predicted ns of the queued work */
	int running;			/* the model of the batch running now, -1: none */
};

int coe_queue_init(struct coe_queue *q, uint32_t n_models, uint32_t *queued);
/* Frees the queue and the requests left in it. */
void coe_queue_fini(struct coe_queue *q);
/*
 * Queues r: with arrange, behind the last queued request of its model, or
 * at the end of the front part when its model is in memory (in_memory, or
 * the batch running is of it), else at the end; without arrange, at the end.
 */
void coe_queue_add(struct coe_queue *q, struct creq *r, bool arrange, bool in_memory);
/* Takes the first request off (the queue must not be empty). */
struct creq *coe_queue_pop(struct coe_queue *q);

#endif /* MP_COE_QUEUE_H */
