// SPDX-License-Identifier: MIT
/* The moepager command-line tool: dispatches to one file per subcommand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager.h>

#include "cli.h"

static const struct cli_command commands[] = {
	{ "gen", "write a model with deterministic random weights", cmd_gen },
	{ "inspect", "print an .mpk file's geometry, tensors and experts", cmd_inspect },
	{ "run", "greedy decoding of a model, resident or paged; throughput as JSON", cmd_run },
	{ "verify", "check every tensor and expert checksum of an .mpk file", cmd_verify },
	{ "adapter", "pack, merge, make and inspect expert adapters (.mpa)", cmd_adapter },
	{ "trace", "record a process's expert trajectory through BPF; export moe-trace", cmd_trace },
	{ "eval", "held-out perplexity of a trained model, computed by the runner", cmd_eval },
	{ "generate", "continue a text prompt with a trained model and its tokenizer", cmd_generate },
	{ "bench", "compare prefetch/eviction policies and baselines on traces at budgets", cmd_bench },
	{ "faultbench", "expert fault service vs raw io_uring and mmap, as JSON", cmd_faultbench },
	{ "batchbench", "batched decode throughput against its memory-bandwidth bound", cmd_batchbench },
	{ "bench-adapters", "many expert adapters over one base vs base, padded and merged",
	  cmd_adapterbench },
	{ "serve", "an OpenAI-style HTTP server over a model, with continuous batching", cmd_serve },
	{ "loadgen", "open-loop Poisson load on a completions server; latency as JSON", cmd_loadgen },
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
	if (argc < 2) {
		usage(stderr);
		return 1;
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
	cli_install_log_handler();
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].run(argc - 1, argv + 1) ? 1 : 0;
	fprintf(stderr, "moepager: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 1;
}
