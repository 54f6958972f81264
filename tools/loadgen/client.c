// SPDX-License-Identifier: MIT
/* loadgen's inputs: prompt texts, the models and their shares, the server's /metrics. */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loadgen/loadgen.h"

static int add_prompt(struct lg_prompts *p, const char *s, size_t len, uint32_t chars)
{
	char **t;

	while (len && (s[len - 1] == '\n' || s[len - 1] == ' ' || s[len - 1] == '\t'))
		len--;
	while (len && (*s == '\n' || *s == ' ' || *s == '\t')) {
		s++;
		len--;
	}
	if (!len)
		return 0;
	if (len > chars) {
		len = chars;
		/* Not in the middle of a UTF-8 character. */
		while (len && ((unsigned char)s[len] & 0xc0) == 0x80)
			len--;
	}
	t = realloc(p->text, (p->n + 1) * sizeof(*t));
	if (!t)
		return -ENOMEM;
	p->text = t;
	p->text[p->n] = strndup(s, len);
	if (!p->text[p->n])
		return -ENOMEM;
	p->n++;
	return 0;
}

int lg_read_prompts(const char *path, uint32_t chars, struct lg_prompts *out)
{
	char *buf, *text = NULL;
	bool fortunes;
	size_t len;
	int err;

	memset(out, 0, sizeof(*out));
	err = cli_read_file(path, &buf, &len);
	if (err)
		return err;
	/* Fortune format: texts between lines holding only '%'; else a text per line. */
	fortunes = !strncmp(buf, "%\n", 2) || strstr(buf, "\n%\n");
	for (char *line = buf; !err && line < buf + len;) {
		char *eol = strchr(line, '\n');
		size_t n = eol ? (size_t)(eol - line) : strlen(line);

		if (!fortunes) {
			err = add_prompt(out, line, n, chars);
		} else if (n == 1 && line[0] == '%') {
			if (text)
				err = add_prompt(out, text, (size_t)(line - text), chars);
			text = NULL;
		} else if (!text) {
			text = line;
		}
		line += n + (eol != NULL);
	}
	if (!err && text)
		err = add_prompt(out, text, (size_t)(buf + len - text), chars);
	free(buf);
	if (!err && !out->n)
		err = -ENODATA;
	if (err)
		cli_error(0, "%s: %s", path,
			err == -ENODATA ? "no prompt in it" : strerror(-err));
	return err;
}

void lg_prompts_free(struct lg_prompts *p)
{
	for (uint32_t i = 0; i < p->n; i++)
		free(p->text[i]);
	free(p->text);
	memset(p, 0, sizeof(*p));
}

static size_t collect(char *data, size_t size, size_t n, void *arg)
{
	struct { char *s; size_t len; } *b = arg;
	char *s = realloc(b->s, b->len + size * n + 1);

	if (!s)
		return 0;
	memcpy(s + b->len, data, size * n);
	b->s = s;
	b->len += size * n;
	b->s[b->len] = '\0';
	return size * n;
}

void lg_auth(CURL *h)
{
	const char *key = getenv("MOEPAGER_API_KEY");

	if (key && *key) {
		curl_easy_setopt(h, CURLOPT_HTTPAUTH, (long)CURLAUTH_BEARER);
		curl_easy_setopt(h, CURLOPT_XOAUTH2_BEARER, key);
	}
}

/* GET url + path (POST body when not NULL) into a new string (NULL on failure). */
static char *request(const char *url, const char *path, const char *body, long *status)
{
	struct { char *s; size_t len; } b = { NULL, 0 };
	char full[2048];
	CURL *h = curl_easy_init();
	CURLcode rc;

	if (!h)
		return NULL;
	snprintf(full, sizeof(full), "%s%s", url, path);
	curl_easy_setopt(h, CURLOPT_URL, full);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
	curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
	lg_auth(h);
	if (body)
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
	rc = curl_easy_perform(h);
	*status = 0;
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
	curl_easy_cleanup(h);
	if (rc != CURLE_OK) {
		cli_say("%s %s: %s", body ? "POST" : "GET", full,
			curl_easy_strerror(rc));
		free(b.s);
		return NULL;
	}
	return b.s;
}

static char *get(const char *url, const char *path, long *status)
{
	return request(url, path, NULL, status);
}

char *lg_post(const char *url, const char *path, const char *body, long *status)
{
	return request(url, path, body, status);
}

static int server_models(const char *url, struct lg_models *out)
{
	long status;
	char *body = get(url, "/v1/models", &status);
	json_t *j = body ? json_loads(body, 0, NULL) : NULL;
	json_t *data = json_object_get(j, "data");

	free(body);
	for (size_t i = 0; json_is_array(data) && i < json_array_size(data) &&
			   out->n < LG_MAX_MODELS; i++) {
		const char *id = json_string_value(json_object_get(json_array_get(data, i), "id"));

		if (id)
			out->name[out->n++] = strdup(id);
	}
	json_decref(j);
	if (!out->n)
		return cli_error(-EPROTO, "%s/v1/models lists no model (status %ld)",
				 url, status);
	return 0;
}

int lg_models(const char *url, const char *mix, double alpha, struct lg_models *out)
{
	int err = 0;

	memset(out, 0, sizeof(*out));
	if (mix) {
		char *copy = strdup(mix), *save = NULL;

		for (char *m = strtok_r(copy, ",", &save); m && out->n < LG_MAX_MODELS;
		     m = strtok_r(NULL, ",", &save))
			out->name[out->n++] = strdup(m);
		free(copy);
		if (!out->n)
			err = -EINVAL;
	} else {
		err = server_models(url, out);
	}
	if (err)
		return err;
	cli_power_cdf(out->cdf, out->n, alpha);
	return 0;
}

void lg_models_free(struct lg_models *m)
{
	for (uint32_t i = 0; i < m->n; i++)
		free(m->name[i]);
	memset(m, 0, sizeof(*m));
}

/* The sum over its samples of a metric family's values (no labels looked at). */
static double family_sum(const char *text, const char *name)
{
	size_t len = strlen(name);
	double sum = 0;
	bool found = false;

	for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
		const char *v;

		if (strncmp(l, name, len) || (l[len] != '{' && l[len] != ' '))
			continue;
		v = l[len] == '{' ? strchr(l, '}') : l + len;
		if (v && (v = strchr(v, ' '))) {
			sum += strtod(v + 1, NULL);
			found = true;
		}
	}
	return found ? sum : -1;
}

void lg_scrape(const char *url, struct lg_metrics *out)
{
	long status;
	char *t = get(url, "/metrics", &status);

	memset(out, 0, sizeof(*out));
	if (!t || status != 200) {
		free(t);
		return;
	}
	out->ok = true;
	out->hits = family_sum(t, "moepager_pager_hits_total");
	out->misses = family_sum(t, "moepager_pager_misses_total");
	out->steps = family_sum(t, "moepager_steps_total");
	out->step_s = family_sum(t, "moepager_step_seconds_total");
	out->sched_s = family_sum(t, "moepager_sched_seconds_total");
	out->http_s = family_sum(t, "moepager_http_handler_seconds_total");
	out->sched_cpu_s = family_sum(t, "moepager_sched_cpu_seconds_total");
	out->http_cpu_s = family_sum(t, "moepager_http_handler_cpu_seconds_total");
	out->http_thread_cpu_s = family_sum(t, "moepager_http_thread_cpu_seconds_total");
	out->gathers = family_sum(t, "moepager_gathers_total");
	out->resumes = family_sum(t, "moepager_http_resumes_total");
	out->gather_s = family_sum(t, "moepager_gather_seconds_total");
	out->tokens = family_sum(t, "moepager_generation_tokens_total");
	out->batch_sum = family_sum(t, "moepager_batch_size_sum");
	out->batch_count = family_sum(t, "moepager_batch_size_count");
	out->ready_s = family_sum(t, "moepager_serve_ready_seconds");
	out->warm_s = family_sum(t, "moepager_serve_warm_seconds");
	out->dense_lent = family_sum(t, "moepager_runner_dense_lent_bytes");
	out->dense_read = family_sum(t, "moepager_runner_dense_read_bytes");
	out->engine_threads = family_sum(t, "moepager_engine_threads");
	free(t);
}
