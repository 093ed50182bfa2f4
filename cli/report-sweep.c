/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "conf.h"
#include "replay.h"
#include "report-sweep.h"
#include "simulate.h"

static int compare_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return x < y ? -1 : x > y;
}

/* The run's grants' waits: p95 (nearest rank) and longest, from the records a replay keeps per request. */
static int grant_waits(const SimResult *res, usec_t *ret_p95, usec_t *ret_max) {
        _cleanup_free_ uint64_t *waits = calloc(res->n_records ?: 1, sizeof(uint64_t));
        size_t n = 0;
        if (!waits)
                return -ENOMEM;
        for (size_t i = 0; i < res->n_records; i++)
                if (res->records[i].outcome == SIM_OUTCOME_GRANTED)
                        waits[n++] = res->records[i].waited_ms;
        if (n == 0) {
                *ret_p95 = *ret_max = 0;
                return 0;
        }
        qsort(waits, n, sizeof(uint64_t), compare_u64);
        size_t rank = (n * 95 + 99) / 100; /* ⌈0.95 n⌉, 1-based */
        *ret_p95 = waits[rank - 1] * USEC_PER_MSEC;
        *ret_max = waits[n - 1] * USEC_PER_MSEC;
        return 0;
}

int report_sweep_pool(const char *history, ReportPool *p, unsigned from, unsigned to) {
        _cleanup_(replay_info_done) ReplayInfo info = {};
        _cleanup_(scenario_freep) Scenario *s = NULL;
        _cleanup_free_ char *error = NULL;
        int k;

        k = replay_load(&(ReplayOptions) { .path = history, .pool = p->name, .sweep_key = "limit" }, &error, &s, &info);
        if (k == -EINVAL) {
                p->sweep_error = TAKE_PTR(error);
                return 0;
        }
        if (k < 0)
                return k;

        p->sweep = calloc(to - from + 1, sizeof(ReportSweepPoint));
        if (!p->sweep)
                return -ENOMEM;
        for (unsigned limit = from; limit <= to; limit++) {
                _cleanup_(sim_result_freep) SimResult *res = NULL;
                _cleanup_(conf_freep) BrokerConfig *c = NULL;
                char value[16];

                snprintf(value, sizeof value, "%u", limit);
                k = scenario_build_config(s, "limit", value, &error, &c);
                if (k == -EINVAL) {
                        p->sweep_error = TAKE_PTR(error);
                        p->sweep = mfree(p->sweep);
                        p->n_sweep = 0;
                        return 0;
                }
                if (k >= 0)
                        k = sim_run(s, c, &(SimOptions) { .seed = 1 }, &res);
                if (k == -E2BIG || k == -ENOBUFS) {
                        /* A bound of the simulator, which the page says as it says why a pool cannot be modelled. */
                        _cleanup_free_ char *text = sim_bound_text(k);
                        if (!text || asprintf(&p->sweep_error, "limit=%u: %s", limit, text) < 0)
                                return -ENOMEM;
                        p->sweep = mfree(p->sweep);
                        p->n_sweep = 0;
                        return 0;
                }
                if (k < 0)
                        return k;
                ReportSweepPoint *pt = &p->sweep[p->n_sweep++];
                *pt = (ReportSweepPoint) {
                        .limit = limit,
                        .requests = res->requests,
                        .granted = res->granted,
                };
                for (size_t i = 0; i < _REFUSAL_MAX; i++)
                        pt->refused += res->refused[i];
                k = grant_waits(res, &pt->p95_wait, &pt->longest_wait);
                if (k < 0)
                        return k;
        }
        return 0;
}
