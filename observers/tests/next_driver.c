/* Prints what dlsym(RTLD_NEXT) found from inside next_a: 2 is right. */
#include <stdio.h>

int orbite_probe_next(void);

int main(void)
{
	printf("%d\n", orbite_probe_next());
	return 0;
}
