/* RTLD_NEXT probe, first definition: asks for the next one through dlsym,
 * which the observers interpose (see test_observers.py::test_dlsym_rtld_next). */
#define _GNU_SOURCE
#include <dlfcn.h>

int orbite_probe(void)
{
	return 1;
}

int orbite_probe_next(void)
{
	int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "orbite_probe");

	return next ? next() : -1;
}
