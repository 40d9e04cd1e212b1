/* cq_fault: armed by ORBITE_CQ_FAULT_ARMED=1 on the requester.  It removes
 * successful completions of accepted payload WRs from poll_cq (the core
 * compacts the array and returns the reduced count) and logs each one as
 * withheld.  It never invents data or completions: error completions and
 * completions of other work always pass, and a withheld completion is gone
 * for good (the provider already consumed it).
 *
 *   ORBITE_CQ_FAULT_SKIP   successful payload completions passed first (0)
 *   ORBITE_CQ_FAULT_LIMIT  at most this many withheld, 0 = no limit (0)
 *   ORBITE_CQ_FAULT_REPEAT 1: after LIMIT withheld, pass SKIP and withhold
 *                          LIMIT again, for good (one window per round a
 *                          long-lived process loses); needs LIMIT > 0 (0)
 */
#include "obs.h"

#include <stdlib.h>
#include <string.h>

static int armed;
static long skip, skip_left, limit, withheld, repeat;

static void cq_fault_init(void)
{
	const char *arm = getenv("ORBITE_CQ_FAULT_ARMED");

	if (!arm || strcmp(arm, "1") != 0) {
		obs_warn("not armed (ORBITE_CQ_FAULT_ARMED is not 1): accounting only");
		return;
	}
	if (obs_env_long("ORBITE_CQ_FAULT_SKIP", 0, 0, 1L << 40, &skip) ||
	    obs_env_long("ORBITE_CQ_FAULT_LIMIT", 0, 0, 1L << 40, &limit) ||
	    obs_env_long("ORBITE_CQ_FAULT_REPEAT", 0, 0, 1, &repeat)) {
		obs_warn("not armed: bad configuration");
		return;
	}
	if (repeat && !limit) {
		obs_warn("not armed: ORBITE_CQ_FAULT_REPEAT=1 needs ORBITE_CQ_FAULT_LIMIT > 0");
		return;
	}
	skip_left = skip;
	armed = 1;
}

/* Called under the core's ledger lock. */
static int cq_fault_withhold(const char *dev)
{
	(void)dev;
	if (!armed)
		return 0;
	if (skip_left > 0) {
		skip_left--;
		return 0;
	}
	if (limit && withheld >= limit) {
		if (!repeat)
			return 0;
		withheld = 0; /* the next window: SKIP passed again first */
		skip_left = skip;
		if (skip_left > 0) {
			skip_left--;
			return 0;
		}
	}
	withheld++;
	return 1;
}

const struct obs_tool obs_tool = {
	.name = "cq_fault",
	.init = cq_fault_init,
	.withhold = cq_fault_withhold,
};
