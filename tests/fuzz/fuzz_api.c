// SPDX-License-Identifier: MIT
/*
 * libFuzzer target: `moepager serve`'s request parsers (completions, adapter loads) on any
 * bytes. A parsed request keeps its promises (a prompt, fields in range,
 * at most 4 stop strings); a refused one names a status and says why.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/api.h"

#define CHECK(c) do {							\
	if (!(c)) {							\
		fprintf(stderr, "fuzz_api: broken promise: %s\n", #c);	\
		__builtin_trap();					\
	}								\
} while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct api_request r;
	struct api_adapter_load ld;
	struct api_error e;
	char *j;

	/* The same bytes as a POST /v1/adapters body. */
	if (api_parse_adapter_load((const char *)data, size, &ld, &e))
		CHECK(e.status == 400 && strlen(e.message) > 0);
	else
		CHECK(ld.file[0] && strlen(ld.file) < sizeof(ld.file) &&
		      strlen(ld.name) < sizeof(ld.name));
	if (api_parse_completion((const char *)data, size, &r, &e)) {
		CHECK(e.status >= 400 && e.status < 600);
		CHECK(strlen(e.message) > 0);
		j = api_error_json(&e, "invalid_request_error");
		CHECK(j);
		free(j);
		return 0;
	}
	CHECK((r.prompt_text != NULL) != (r.prompt_ids != NULL));
	CHECK(!r.prompt_ids || (r.nprompt_ids >= 1 && r.nprompt_ids <= API_MAX_PROMPT_IDS));
	CHECK(r.max_tokens >= 1);
	CHECK(r.temperature >= 0 && r.temperature <= 2);
	CHECK(r.top_p > 0 && r.top_p <= 1);
	CHECK(r.nstop <= API_MAX_STOP);
	for (uint32_t i = 0; i < r.nstop; i++)
		CHECK(strlen(r.stop[i]) >= 1 && strlen(r.stop[i]) <= API_MAX_STOP_LEN);
	api_request_free(&r);
	return 0;
}
