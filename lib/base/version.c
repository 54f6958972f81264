// SPDX-License-Identifier: MIT
/* Runtime version getters: report the library actually loaded. */
#include <moepager/mp_version.h>

#include "base/base.h"

int mp_version_major(void)
{
	return MP_VERSION_MAJOR;
}

int mp_version_minor(void)
{
	return MP_VERSION_MINOR;
}

const char *mp_version_string(void)
{
	return MP_VERSION_STRING;
}
