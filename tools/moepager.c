// SPDX-License-Identifier: MIT
/* The moepager command-line tool: dispatches to one file per subcommand. */
#include <stdio.h>
#include <string.h>

#include <moepager.h>

#include "cli.h"

static const struct cli_command commands[] = {
};

static void usage(FILE *f)
{
	fprintf(f, "usage: moepager COMMAND [ARGS...]   (moepager COMMAND --help for details)\n\n"
		   "commands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
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
	cli_install_log_handler();
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].run(argc - 1, argv + 1) ? 1 : 0;
	fprintf(stderr, "moepager: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 1;
}
