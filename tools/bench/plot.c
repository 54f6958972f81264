// SPDX-License-Identifier: MIT
/* moepager bench --plot: throughput and hit rate against budget, the trace's activation heatmap. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "bench.h"

static FILE *open_in(const char *dir, const char *name, char *path, size_t len)
{
	FILE *f;

	snprintf(path, len, "%s/%s", dir, name);
	f = fopen(path, "w");
	if (!f)
		cli_error(0, "%s: %s", path, strerror(errno));
	return f;
}

/* Distinct "prefetch:evict" labels and budgets, in first-seen order. */
static uint32_t distinct(const struct bench_row *rows, uint32_t n, bool budgets,
			 const struct bench_row **out)
{
	uint32_t m = 0;

	for (uint32_t i = 0; i < n; i++) {
		bool seen = false;

		for (uint32_t j = 0; j < m && !seen; j++)
			seen = budgets ? !strcmp(out[j]->budget, rows[i].budget) :
			       !strcmp(out[j]->spec.prefetch, rows[i].spec.prefetch) &&
			       !strcmp(out[j]->spec.evict, rows[i].spec.evict);
		if (!seen)
			out[m++] = &rows[i];
	}
	return m;
}

static const struct bench_row *find(const struct bench_row *rows, uint32_t n,
				    const struct bench_row *pol, const struct bench_row *bud)
{
	for (uint32_t i = 0; i < n; i++)
		if (!strcmp(rows[i].budget, bud->budget) &&
		    !strcmp(rows[i].spec.prefetch, pol->spec.prefetch) &&
		    !strcmp(rows[i].spec.evict, pol->spec.evict))
			return &rows[i];
	return NULL;
}

/* metric 0: decode tokens/s, 1: hit rate in %. */
static int write_metric(const char *dir, const char *name, int metric,
			const struct bench_row *rows, uint32_t n)
{
	const struct bench_row **pols = calloc(n, sizeof(*pols)), **buds = calloc(n, sizeof(*buds));
	uint32_t np, nb;
	char path[4096];
	FILE *f;

	if (!pols || !buds) {
		free(pols);
		free(buds);
		return -ENOMEM;
	}
	np = distinct(rows, n, false, pols);
	nb = distinct(rows, n, true, buds);
	f = open_in(dir, name, path, sizeof(path));
	if (!f) {
		free(pols);
		free(buds);
		return -EIO;
	}
	fprintf(f, "budget");
	for (uint32_t p = 0; p < np; p++)
		fprintf(f, " %s:%s", pols[p]->spec.prefetch, pols[p]->spec.evict);
	fputc('\n', f);
	for (uint32_t b = 0; b < nb; b++) {
		fprintf(f, "%s", buds[b]->budget);
		for (uint32_t p = 0; p < np; p++) {
			const struct bench_row *r = find(rows, n, pols[p], buds[b]);
			double v = 0;

			if (r && metric == 0 && r->r.seconds > 0)
				v = r->r.tokens / r->r.seconds;
			else if (r && metric == 1 && r->r.uses)
				v = 100.0 * r->r.hits / r->r.uses;
			fprintf(f, " %.6f", v);
		}
		fputc('\n', f);
	}
	fclose(f);
	free(pols);
	free(buds);
	return (int)np;
}

static int write_heatmap(const char *dir, struct mp_trace *const *traces, uint32_t ntraces)
{
	uint32_t L = mp_trace_layers(traces[0]), J = mp_trace_experts(traces[0]);
	uint64_t *count = calloc((size_t)L * J, sizeof(*count));
	char path[4096];
	FILE *f;

	if (!count)
		return -ENOMEM;
	for (uint32_t i = 0; i < ntraces; i++) {
		const struct mp_trace *t = traces[i];
		uint32_t K = mp_trace_topk(t);

		for (uint32_t r = 0; r < mp_trace_requests(t); r++)
			for (uint32_t tok = 0; tok < mp_trace_tokens(t, r); tok++)
				for (uint32_t l = 0; l < L; l++) {
					const uint32_t *ids;
					const float *w;

					if (mp_trace_route(t, r, tok, l, &ids, &w))
						continue;
					for (uint32_t x = 0; x < K; x++)
						count[(size_t)l * J + ids[x]]++;
				}
	}
	f = open_in(dir, "heatmap.dat", path, sizeof(path));
	if (!f) {
		free(count);
		return -EIO;
	}
	/* Share of the layer's uses per expert: x = expert, y = layer. */
	for (uint32_t l = 0; l < L; l++) {
		uint64_t sum = 0;

		for (uint32_t j = 0; j < J; j++)
			sum += count[(size_t)l * J + j];
		for (uint32_t j = 0; j < J; j++)
			fprintf(f, "%u %u %.6f\n", j, l,
				sum ? 100.0 * count[(size_t)l * J + j] / sum : 0);
		fputc('\n', f);
	}
	fclose(f);
	free(count);
	return 0;
}

static int run_gnuplot(const char *script)
{
	char cmd[8192];
	int st;

	snprintf(cmd, sizeof(cmd), "gnuplot '%s'", script);
	st = system(cmd);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st))
		return cli_error(-EIO, "gnuplot %s failed (status %d)", script, st);
	return 0;
}

int bench_plot(const struct bench_opts *o, const struct bench_row *rows, uint32_t n,
	       struct mp_trace *const *traces)
{
	const char *dir = o->plot;
	const char *unit = o->simulate ? "decode tokens per model time unit (simulated)" :
			   "decode tokens/s";
	char path[4096], names[1024] = "";

	for (uint32_t i = 0; i < o->ntraces; i++) {
		const char *base = strrchr(o->traces[i], '/');

		size_t used = strlen(names);

		snprintf(names + used, sizeof(names) - used, "%s%s", i ? ", " : "",
			 base ? base + 1 : o->traces[i]);
	}
	int np, err;
	FILE *f;

	if (mkdir(dir, 0755) && errno != EEXIST)
		return cli_error(-errno, "mkdir %s: %s", dir, strerror(errno));
	np = write_metric(dir, "throughput.dat", 0, rows, n);
	if (np < 0 || (np = write_metric(dir, "hit_rate.dat", 1, rows, n)) < 0)
		return np;
	if ((err = write_heatmap(dir, traces, o->ntraces)))
		return err;
	f = open_in(dir, "plots.gp", path, sizeof(path));
	if (!f)
		return -EIO;
	fprintf(f, "# Written by moepager bench --plot; rerun with: gnuplot plots.gp\n"
		"cd '%s'\n"
		"set key outside right top noenhanced\n"
		"set grid\n"
		"set xlabel 'expert memory budget'\n"
		"do for [fmt in 'svg png'] {\n"
		"  if (fmt eq 'svg') { set terminal svg size 900,500 dynamic } "
		"else { set terminal pngcairo size 900,500 }\n"
		"  set output 'throughput.'.fmt\n"
		"  set title 'Decode throughput vs budget' noenhanced\n"
		"  set ylabel '%s'\n"
		"  set yrange [0:*]\n"
		"  set xrange [-0.5:%u.5]\n"
		"  plot for [c=2:%d] 'throughput.dat' using c:xtic(1) with linespoints lw 2 "
		"title columnhead(c)\n"
		"  set output 'hit_rate.'.fmt\n"
		"  set title 'Expert hit rate vs budget' noenhanced\n"
		"  set ylabel 'hit rate (%%)'\n"
		"  set yrange [0:100]\n"
		"  plot for [c=2:%d] 'hit_rate.dat' using c:xtic(1) with linespoints lw 2 "
		"title columnhead(c)\n"
		"  set output 'heatmap.'.fmt\n"
		"  unset key\n"
		"  set title 'Expert activation share per layer (%s)' noenhanced\n"
		"  set xlabel 'expert'\n"
		"  set ylabel 'layer'\n"
		"  set cblabel 'share of the layer''s uses (%%)'\n"
		"  set xrange [*:*]\n"
		"  set autoscale xfix\n"
		"  set autoscale yfix\n"
		"  set yrange [*:*] reverse\n"
		"  set xtics 1\n"
		"  set palette rgb 33,13,10\n"
		"  plot 'heatmap.dat' using 1:2:3 with image\n"
		"  set yrange [*:*] noreverse\n"
		"  set xtics autofreq\n"
		"  set key\n"
		"  set xlabel 'expert memory budget'\n"
		"}\n", dir, unit, o->nbudgets - 1, np + 1, np + 1, names);
	fclose(f);
	return run_gnuplot(path);
}
