// SPDX-License-Identifier: MIT
/* Budget strings: "8G", "512M", "1.5G", "40%" of the model's expert bytes. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/pager.h>

#include "base/base.h"

int mp_budget_parse(const char *s, uint64_t model_bytes, uint64_t *out)
{
	const char *p;
	char *end;
	double v, mult = 1;

	if (!s || !*s)
		return mp_err(-EINVAL, "budget: empty string (want e.g. 8G, 512M or 40%%)");
	for (p = s; *p; p++)
		if (!isdigit((unsigned char)*p) && !strchr(".%KkMmGgTtBbi", *p))
			return mp_err(-EINVAL, "budget '%s': unexpected character '%c' (want e.g. "
				      "8G, 512M or 40%%)", s, *p);
	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno || !isfinite(v) || v <= 0)
		return mp_err(-EINVAL, "budget '%s': not a positive number", s);
	if (!strcmp(end, "%")) {
		if (v > 100)
			return mp_err(-EINVAL, "budget '%s': more than 100%% of the experts", s);
		if (!model_bytes)
			return mp_err(-EINVAL, "budget '%s': a percentage needs the model's size",
				      s);
		*out = (uint64_t)((double)model_bytes * v / 100.0);
		return 0;
	}
	switch (toupper((unsigned char)*end)) {
	case 'T':
		mult *= 1024;
		/* fall through */
	case 'G':
		mult *= 1024;
		/* fall through */
	case 'M':
		mult *= 1024;
		/* fall through */
	case 'K':
		mult *= 1024;
		end++;
		break;
	default:
		break;
	}
	/* Allow the unit spelt out: "8GB", "8GiB", "4096B". */
	if (*end == 'i' && mult > 1)
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end)
		return mp_err(-EINVAL, "budget '%s': unknown unit '%s' (K, M, G, T or %%)", s, end);
	v *= mult;
	if (v >= 18446744073709551615.0)
		return mp_err(-EINVAL, "budget '%s': too large", s);
	*out = (uint64_t)v;
	return 0;
}
