/* RTLD_NEXT probe, the next definition. */
int orbite_probe(void)
{
	return 2;
}
