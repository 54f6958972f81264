// SPDX-License-Identifier: MIT
/* The moepager command-line tool: dispatches to one file per subcommand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include <moepager.h>

#include "cli.h"

static const struct cli_command commands[] = {
	{ "gen", "write a model with deterministic random weights", cmd_gen },
	{ "inspect", "print an .mpk file's geometry, tensors and experts", cmd_inspect },
	{ "run", "greedy decoding of a model, resident or paged; throughput as JSON", cmd_run },
	{ "verify", "check every tensor and expert checksum of an .mpk file", cmd_verify },
	{ "adapter", "pack, merge, make and inspect expert adapters (.mpa)", cmd_adapter },
	{ "consolidate", "map which variant's expert serves all at each position (Multi-MoE)",
	  cmd_consolidate },
	{ "import", "convert a GGUF model file (llama.cpp) into an .mpk", cmd_import },
	{ "export", "write an .mpk model as a GGUF file llama.cpp loads", cmd_export },
	{ "trace", "record a process's expert trajectory through BPF; export moe-trace", cmd_trace },
	{ "eval", "held-out perplexity of a trained model, computed by the runner", cmd_eval },
	{ "generate", "continue a text prompt with a trained model and its tokenizer", cmd_generate },
	{ "bench", "compare prefetch/eviction policies and baselines on traces at budgets", cmd_bench },
	{ "faultbench", "expert fault service vs raw io_uring and mmap, as JSON", cmd_faultbench },
	{ "bench-preload", "llama.cpp with libmoepager-preload.so vs its own mmap, as JSON",
	  cmd_preloadbench },
	{ "bench-elastic", "1 -> 2 -> 1 engine processes: a shared host tier vs a copy, a restart",
	  cmd_elasticbench },
	{ "batchbench", "batched decode throughput against its memory-bandwidth bound", cmd_batchbench },
	{ "bench-serve", "HTTP and scheduling overhead per step: the runner alone vs served",
	  cmd_servebench },
	{ "bench-adapters", "many expert adapters over one base vs base, padded and merged",
	  cmd_adapterbench },
	{ "bench-multi", "model variants consolidated vs one model, a split and time-sharing",
	  cmd_multibench },
	{ "pagerd", "the pager daemon: one host tier (memfd) shared by engine processes",
	  cmd_pagerd },
	{ "serve", "an OpenAI-style HTTP server over a model, with continuous batching", cmd_serve },
	{ "loadgen", "open-loop Poisson load on a completions server; latency as JSON", cmd_loadgen },
	{ "coe-gen", "write a Collaboration-of-Experts model: many whole models, one container",
	  cmd_coe_gen },
	{ "coe-profile", "profile a CoE per executor and architecture: K, B, max batch, loads",
	  cmd_coe_profile },
	{ "coe-window", "CoServe's decay-window search for the experts' share of memory",
	  cmd_coe_window },
	{ "bench-coe", "CoServe against FCFS+LRU, FIFO, round robin and its ablations, as JSON",
	  cmd_bench_coe },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: moepager COMMAND [ARGS...]   (moepager COMMAND --help for details)\n\n"
		   "commands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "  %-15s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv)
{
	static char prog[64];

	if (argc < 2) {
		usage(stderr);
		return EX_USAGE;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("moepager %s\n", mp_version_string());
		return 0;
	}
	/* The subcommands' doc strings are laid out for 100 columns (argp's default is 79). */
	setenv("ARGP_HELP_FMT", "rmargin=100", 0);
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		if (strcmp(argv[1], commands[i].name))
			continue;
		/* argp's usage lines and errors, and the tool's, name the whole command. */
		snprintf(prog, sizeof(prog), "moepager %s", commands[i].name);
		argv[1] = prog;
		cli_install_log_handler(prog);
		return commands[i].run(argc - 1, argv + 1) ? 1 : 0;
	}
	fprintf(stderr, "moepager: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return EX_USAGE;
}
