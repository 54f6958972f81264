/* SPDX-License-Identifier: MIT */
/* GET /metrics: the library's counters in Prometheus text format (exposition format 0.0.4). */
#ifndef MP_SERVE_METRICS_H
#define MP_SERVE_METRICS_H

#include <moepager.h>

#include "serve/strbuf.h"

/* Each appends its families, labelled model="NAME". */
void metrics_sched(struct strbuf *o, const char *model, const struct mp_sched_stats *s);
void metrics_pager(struct strbuf *o, const char *model, const struct mp_pager_stats *s);
void metrics_prefetcher(struct strbuf *o, const char *model, const struct mp_prefetcher_stats *s);
void metrics_adapters(struct strbuf *o, const char *model, const struct mp_adapters_stats *s);
void metrics_multi(struct strbuf *o, const char *model, const struct mp_multi_stats *s);
/* Where the runner's dense weights are: bytes lent by its source, bytes read from files. */
void metrics_dense(struct strbuf *o, const char *model, uint64_t lent, uint64_t read);

/* The engine's threads now, and how many times they were changed while serving. */
void metrics_threads(struct strbuf *o, const char *model, uint32_t threads, uint64_t changes);

/* A family's # HELP and # TYPE lines. */
void metrics_family(struct strbuf *o, const char *name, const char *type, const char *help);

#endif /* MP_SERVE_METRICS_H */
