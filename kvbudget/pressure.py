"""When the KV pool counts as full: the one bar `kvbudget doctor` and the dashboard share.

Both answer "requests are held back: is the pool full, or the budget?", and an operator who
runs both must get one answer. So both read the pool the same way, and compare it with
this one bar. Nothing is imported here: the dashboard (`kvbudget.tui`, no daemon, no torch,
no NVML) and the doctor may both import it.
"""

from __future__ import annotations

# The pool counts as full at this share of its usable blocks *held*, the held share being
# the mean over the moments requests were held back ("under pressure": a sample where some
# waited, or the cumulative preemption count rose since the sample before), not one
# instant: under a steady saturated load the queue comes and goes and usage swings around
# the bar from one sample to the next. Pool-bound at or above it, with pressure; below it,
# the limit is not the blocks. 0.90 is also where the dashboard's usage gauges turn red.
#
# Where the two still differ, on purpose:
# - the window: the dashboard judges the queue over its last 10 s and preemptions over
#   its last 30 s; the doctor judges over the samples it takes (5, 1 s apart, by default:
#   inside both). Both take a daemon with nothing running and nothing waiting now for
#   idle (the doctor: healthy), whatever pressure came before.
# - below the bar: the dashboard calls any pressure budget-bound. The doctor says
#   budget-bound when held + reserved (committed, the same mean) reaches the bar, that is
#   free blocks are promised away, or a tenant's quota holds the queue; a queue that still
#   moves with neither is healthy; one that does not move is "stuck queue" on a pool
#   mostly free, else pool-bound (too full for the request at its head). The dashboard
#   has no stuck-queue or quota verdict.
POOL_FULL_SHARE = 0.90
