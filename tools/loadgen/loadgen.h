/* SPDX-License-Identifier: MIT */
/* The pieces of `moepager loadgen`: prompts, models, the open-loop run, the report. */
#ifndef MP_LOADGEN_H
#define MP_LOADGEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include <curl/curl.h>

#define LG_MAX_MODELS 64

struct lg_prompts {
	char **text;		/* JSON-ready (raw) texts */
	uint32_t n;
};

/* Texts of a file: fortune format (between "%" lines), else one per line; cut to chars. */
int lg_read_prompts(const char *path, uint32_t chars, struct lg_prompts *out);
void lg_prompts_free(struct lg_prompts *p);

struct lg_models {
	char *name[LG_MAX_MODELS];
	double cdf[LG_MAX_MODELS];	/* cumulative share of models 0..i */
	uint32_t n;
};

/*
 * The models: mix ("A,B,C") or, when NULL, the server's GET /v1/models;
 * model i's share is proportional to (i + 1)^-alpha.
 */
int lg_models(const char *url, const char *mix, double alpha, struct lg_models *out);
void lg_models_free(struct lg_models *m);

/* Counters of the server's /metrics, summed over models (-1: absent). */
struct lg_metrics {
	double hits, misses, steps, step_s, sched_s, http_s, tokens, batch_sum, batch_count;
	double sched_cpu_s, http_cpu_s, http_thread_cpu_s;
	double gathers, gather_s;	/* an empty batch's waits for a burst */
	double resumes;			/* connections the HTTP thread resumed */
	double ready_s, warm_s, dense_lent, dense_read;	/* the server's start */
	double engine_threads;
	bool ok;
};

/* Reads GET /metrics; out->ok false when the server has none. */
void lg_scrape(const char *url, struct lg_metrics *out);
/*
 * Sends $MOEPAGER_API_KEY as the bearer token of h's requests when it is set
 * (a server started with --api-key); every request of loadgen and the benches.
 */
void lg_auth(CURL *h);
/* POSTs body to url + path: the answer's body (free()) and *status, or NULL. */
char *lg_post(const char *url, const char *path, const char *body, long *status);

/*
 * Where requests go (pool.c): one URL, or a pool file rewritten (renamed
 * over) by whoever scales the servers: "epoch N", then one URL per line.
 */
#define LG_POOL_MAX 16

struct lg_pool {
	const char *path;		/* NULL: the one URL */
	uint64_t epoch;
	uint32_t cur[LG_POOL_MAX];	/* the epoch's backends, indexes into url[] */
	uint32_t ncur;
	char *url[LG_POOL_MAX];		/* every backend seen */
	uint32_t inflight[LG_POOL_MAX];	/* loadgen's requests in flight to each */
	uint64_t sent[LG_POOL_MAX];
	uint32_t nurl, rr, epochs;
	struct stat st;
	bool have;
};

/* One URL (path NULL) or the pool file path. Returns 0 or -errno (message printed). */
int lg_pool_init(struct lg_pool *p, const char *url, const char *path);
/* Re-reads the pool file if it changed; a bad one is reported and the last good kept. */
int lg_pool_refresh(struct lg_pool *p);
/* The current backend with the fewest requests in flight, or -1 when the epoch has none. */
int lg_pool_pick(struct lg_pool *p);
void lg_pool_free(struct lg_pool *p);

/* One request as it went. */
struct lg_req {
	double t_arrive;		/* scheduled arrival, s from the start */
	double t_first, t_last, t_end;	/* s from the start; 0: never */
	uint32_t tokens;		/* completion_tokens the server reported */
	uint32_t model;
	long status;			/* HTTP status; 0: no answer */
	bool error;			/* failed: a 5xx, a broken stream, no [DONE] */
	uint32_t retries;		/* refused before any token, sent again (retry_s) */
	uint64_t epoch;			/* the pool's epoch when last sent */
	int backend;			/* lg_pool.url[] it was last sent to */
	int prompt;			/* the text's index; -1 before the first send */
	double retry_at;
	void *flight;			/* lg_run()'s own, while it runs */
};

struct lg_run {
	const char *url;
	double rate, duration, temperature, drain;
	uint32_t max_tokens;
	bool ignore_eos;		/* every request generates max_tokens */
	uint64_t seed;
	const struct lg_prompts *prompts;
	const struct lg_models *models;
	/*
	 * pool: where requests go (NULL: url). retry_s: a request refused
	 * before its first token (no connection, 503, closed without an
	 * answer: not admitted) is sent again to the current epoch's backends
	 * until this long after its arrival (0: never), as a load balancer would.
	 */
	struct lg_pool *pool;
	double retry_s;
	/* Prompts of prompt_ids random token ids below vocab instead of texts (0: texts). */
	uint32_t prompt_ids, vocab;
	/* Results */
	struct lg_req *reqs;
	uint32_t n;
	double wall;			/* s from the first arrival to the last request's end */
	double t0;			/* the run's start, cli_now_ns() / 1e9 */
};

/* Runs the load; fills reqs. Returns 0 or a negative errno (message printed). */
int lg_run(struct lg_run *r);
void lg_run_free(struct lg_run *r);

void lg_report(const struct lg_run *r, const struct lg_metrics *before,
	       const struct lg_metrics *after, double slo_ttft_ms, double slo_tpot_ms, bool json);

#endif /* MP_LOADGEN_H */
