/* SPDX-License-Identifier: MIT */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "scenario.h"
#include "selector.h"
#include "strv.h"

/* More would take hours to simulate; the cap also keeps ids and counters far from overflow. */
#define ARRIVALS_MAX ((uint64_t) UINT32_MAX)
#define RATE_WHOLE_MAX UINT64_C(1000000000000)
#define RATE_FRACTION_DIGITS_MAX 6
/* queueWaitMs is an integer from 1 to 2^31−1 (SPEC §3.2). */
#define MAX_WAIT_MS_MAX ((uint64_t) INT32_MAX)

int scenario_error(char **error, const char *format, ...) {
        va_list ap;
        char *m = NULL;

        va_start(ap, format);
        int k = vasprintf(&m, format, ap);
        va_end(ap);
        if (k < 0)
                return -ENOMEM;
        free(*error);
        *error = m;
        return -EINVAL;
}

static void strv_free_n(char **v, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(v[i]);
        free(v);
}

static void traffic_done(ScenarioTraffic *t) {
        free(t->lane);
        strv_free(t->labels);
        free(t->member);
        free(t->origin);
        *t = (ScenarioTraffic) {};
}

/* A deep copy: the phase or request owns its lane and origin. */
static int traffic_copy(const ScenarioTraffic *from, ScenarioTraffic *to) {
        ScenarioTraffic t = *from;

        t.lane = t.origin = t.member = NULL;
        t.labels = NULL;
        if (strdup_or_null(from->lane, &t.lane) < 0 || strdup_or_null(from->origin, &t.origin) < 0 ||
            strdup_or_null(from->member, &t.member) < 0 || (from->labels && !(t.labels = strv_copy(from->labels)))) {
                traffic_done(&t);
                return -ENOMEM;
        }
        *to = t;
        return 0;
}

int scenario_new(const char *origin, Scenario **ret) {
        assert_return(origin, -EINVAL);
        assert_return(ret, -EINVAL);

        _cleanup_(scenario_freep) Scenario *s = calloc(1, sizeof(Scenario));
        if (!s)
                return -ENOMEM;
        s->origin = strdup(origin);
        if (!s->origin)
                return -ENOMEM;
        s->deadline_ms = SIM_FOREVER;

        *ret = TAKE_PTR(s);
        return 0;
}

static void drains_free(ScenarioDrain *d, size_t n) {
        for (size_t i = 0; i < n; i++) {
                free(d[i].pool);
                free(d[i].member);
                free(d[i].reason);
                free(d[i].origin);
        }
        free(d);
}

Scenario *scenario_free(Scenario *s) {
        if (!s)
                return NULL;

        for (size_t i = 0; i < s->n_settings; i++) {
                free(s->settings[i].section);
                free(s->settings[i].key);
                free(s->settings[i].value);
                free(s->settings[i].where);
                free(s->settings[i].origin);
        }
        free(s->settings);
        strv_free_n(s->pools, s->n_pools);
        strv_free_n(s->pool_wheres, s->n_pools);
        strv_free_n(s->lanes, s->n_lanes);
        strv_free_n(s->lane_wheres, s->n_lanes);
        for (size_t i = 0; i < s->n_phases; i++)
                traffic_done(&s->phases[i].traffic);
        free(s->phases);
        for (size_t i = 0; i < s->n_requests; i++) {
                free(s->requests[i].name);
                traffic_done(&s->requests[i].traffic);
        }
        free(s->requests);
        free(s->request_order);
        drains_free(s->drains, s->n_drains);
        drains_free(s->quarantines, s->n_quarantines);
        for (size_t i = 0; i < s->n_reservations; i++) {
                free(s->reservations[i].pool);
                free(s->reservations[i].member);
                strv_free(s->reservations[i].labels);
                free(s->reservations[i].reason);
                free(s->reservations[i].origin);
        }
        free(s->reservations);
        free(s->cancel_order);
        free(s->reloads);
        for (size_t i = 0; i < s->n_presences; i++)
                free(s->presences[i].section);
        free(s->presences);
        free(s->origin);
        return mfree(s);
}

int scenario_add_setting(Scenario *s, const char *section, const char *key, const char *value, const char *where,
                         const char *origin) {
        assert_return(s && section && key && value && where && origin, -EINVAL);

        ScenarioSetting *n = reallocarray(s->settings, s->n_settings + 1, sizeof(ScenarioSetting));
        if (!n)
                return -ENOMEM;
        s->settings = n;

        ScenarioSetting set = {
                .section = strdup(section),
                .key = strdup(key),
                .value = strdup(value),
                .where = strdup(where),
                .origin = strdup(origin),
        };
        if (!set.section || !set.key || !set.value || !set.where || !set.origin) {
                free(set.section);
                free(set.key);
                free(set.value);
                free(set.where);
                free(set.origin);
                return -ENOMEM;
        }
        s->settings[s->n_settings++] = set;
        return 0;
}

static bool strv_contains_n(char *const *v, size_t n, const char *s) {
        for (size_t i = 0; i < n; i++)
                if (streq(v[i], s))
                        return true;
        return false;
}

/* Appends name and where to two arrays of the same length n. */
static int strv_push_pair(char ***names, char ***wheres, size_t *n, const char *name, const char *where) {
        char **a = reallocarray(*names, *n + 1, sizeof(char *));
        if (!a)
                return -ENOMEM;
        *names = a;
        char **b = reallocarray(*wheres, *n + 1, sizeof(char *));
        if (!b)
                return -ENOMEM;
        *wheres = b;

        a[*n] = strdup(name);
        b[*n] = strdup(where);
        if (!a[*n] || !b[*n]) {
                free(a[*n]);
                free(b[*n]);
                return -ENOMEM;
        }
        (*n)++;
        return 0;
}

int scenario_add_pool(Scenario *s, const char *name, const char *where) {
        assert_return(s && name && where, -EINVAL);
        if (strv_contains_n(s->pools, s->n_pools, name))
                return 0;
        return strv_push_pair(&s->pools, &s->pool_wheres, &s->n_pools, name, where);
}

int scenario_add_lane(Scenario *s, const char *name, const char *where) {
        assert_return(s && name && where, -EINVAL);
        if (strv_contains_n(s->lanes, s->n_lanes, name))
                return 0;
        return strv_push_pair(&s->lanes, &s->lane_wheres, &s->n_lanes, name, where);
}

const char *scenario_pool_name(const Scenario *s, const char *name) {
        if (!name)
                return NULL;
        for (size_t i = 0; i < s->n_pools; i++)
                if (streq(s->pools[i], name))
                        return s->pools[i];
        return NULL;
}

size_t scenario_reload_at(const Scenario *s, uint64_t ms) {
        /* A binary search (reloads are in time order): each configuration asks it of every request, drain and
         * reservation, and a scan made a scenario of R reloads O(R²) in them. */
        size_t lo = 0, hi = s->n_reloads;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (s->reloads[mid] <= ms)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo;
}

static int compare_index(const void *a, const void *b) {
        size_t x = *(const size_t *) a, y = *(const size_t *) b;
        return x < y ? -1 : x > y;
}

/* The first position in base[0..n) (elements of `size` bytes, in time order by the uint64_t at `at_offset`;
 * through order[] if not NULL) whose time is at least ms: n when none is. */
static size_t first_at_least(const void *base, size_t n, size_t size, size_t at_offset, const size_t *order,
                             uint64_t ms) {
        size_t lo = 0, hi = n;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                uint64_t at;
                memcpy(&at, (const char *) base + (order ? order[mid] : mid) * size + at_offset, sizeof at);
                if (at < ms)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo;
}

/* Where in base[0..n) (as first_at_least()) the things the reload-th configuration meets are: those at
 * [reloads[reload − 1], reloads[reload]) (scenario_reload_at(): a reload comes before its instant's arrivals
 * and reservations), or with `before` at (reloads[reload − 1], reloads[reload]] (reload_before(): after its
 * drains and quarantines). Only once scenario_finish() has put them in time order: else all of them, each
 * still checked by the caller. */
static void reload_window(const Scenario *s, size_t reload, bool before, const void *base, size_t n, size_t size,
                          size_t at_offset, const size_t *order, size_t *ret_from, size_t *ret_to) {
        size_t from = 0, to = n;
        if (s->finished) {
                if (reload > 0 && (!before || s->reloads[reload - 1] < UINT64_MAX))
                        from = first_at_least(base, n, size, at_offset, order, s->reloads[reload - 1] + before);
                if (reload < s->n_reloads && (!before || s->reloads[reload] < UINT64_MAX))
                        to = first_at_least(base, n, size, at_offset, order, s->reloads[reload] + before);
        }
        *ret_from = from;
        *ret_to = MAX(from, to);
}

/* Whether section ("pool NAME", "lane NAME") is in the reload-th configuration: as the last of its presences up
 * to it has it; before its first, there if that first removes it (the first configuration had it). */
static bool section_present(const Scenario *s, const char *section, size_t reload) {
        bool seen = false, present = true;
        for (size_t i = 0; i < s->n_presences; i++) {
                const ScenarioPresence *e = &s->presences[i];
                if (!streq(e->section, section))
                        continue;
                if (!seen)
                        present = !e->present;
                seen = true;
                if (e->reload <= reload)
                        present = e->present;
        }
        return present;
}

static int presence_add(Scenario *s, const char *section, size_t reload, bool present) {
        ScenarioPresence *n = reallocarray(s->presences, s->n_presences + 1, sizeof(ScenarioPresence));
        if (!n)
                return -ENOMEM;
        s->presences = n;
        n[s->n_presences] = (ScenarioPresence) { .section = strdup(section), .reload = reload, .present = present };
        if (!n[s->n_presences].section)
                return -ENOMEM;
        s->n_presences++;
        return 0;
}

/* ---- values ---- */

int parse_rate(const char *s, Rate *ret) {
        static const struct {
                const char *suffix;
                uint64_t seconds;
        } units[] = {
                { "/s", 1 }, { "/sec", 1 }, { "/min", 60 }, { "/m", 60 }, { "/h", 3600 }, { "/hour", 3600 },
        };
        uint64_t whole = 0, fraction = 0, scale = 1;
        const char *p = s;

        assert_return(s, -EINVAL);
        assert_return(ret, -EINVAL);

        if (!isdigit((unsigned char) *p))
                return -EINVAL; /* also rejects a sign */
        for (; isdigit((unsigned char) *p); p++) {
                whole = whole * 10 + (uint64_t) (*p - '0');
                if (whole > RATE_WHOLE_MAX)
                        return -EINVAL;
        }
        if (*p == '.') {
                p++;
                if (!isdigit((unsigned char) *p))
                        return -EINVAL;
                for (unsigned k = 0; isdigit((unsigned char) *p); p++, k++) {
                        if (k >= RATE_FRACTION_DIGITS_MAX)
                                return -EINVAL;
                        fraction = fraction * 10 + (uint64_t) (*p - '0');
                        scale *= 10;
                }
        }
        for (size_t i = 0; i < ELEMENTSOF(units); i++)
                if (streq(p, units[i].suffix)) {
                        *ret = (Rate) {
                                .num = whole * scale + fraction,
                                .den = scale * units[i].seconds,
                        };
                        return 0;
                }
        return -EINVAL;
}

int parse_duration_ms(const char *s, bool allow_forever, uint64_t *ret) {
        usec_t usec;
        int r;

        assert_return(s, -EINVAL);
        assert_return(ret, -EINVAL);

        if (streq(s, "forever")) {
                if (!allow_forever)
                        return -EINVAL;
                *ret = SIM_FOREVER;
                return 0;
        }
        r = timespan_parse(s, USEC_PER_SEC, &usec);
        if (r < 0)
                return r;
        if (usec == USEC_INFINITY) {
                if (!allow_forever)
                        return -EINVAL;
                *ret = SIM_FOREVER;
                return 0;
        }
        if (usec % USEC_PER_MSEC != 0)
                return -EDOM;
        if (usec / USEC_PER_MSEC > SIM_SPAN_MAX_MS)
                return -ERANGE;
        *ret = usec / USEC_PER_MSEC;
        return 0;
}

int scenario_duration_error(char **error, const char *origin, const char *s, int r) {
        if (r == -EDOM)
                return scenario_error(error, "%s: invalid duration \"%s\": the virtual clock counts whole milliseconds", origin,
                                      s);
        if (r == -ERANGE)
                return scenario_error(error, "%s: \"%s\" is longer than " SIM_SPAN_MAX_TEXT ", the most virtual time a simulation covers",
                                      origin, s);
        return scenario_error(error, "%s: invalid duration \"%s\"", origin, s);
}

uint64_t arrival_phase_count(Rate rate, uint64_t duration_ms) {
        /* floor(i·1000·den/num) < D  ⇔  i·1000·den < D·num  ⇔  i < D·num / (1000·den): the count is the ceiling. */
        if (rate.num == 0 || rate.den == 0 || duration_ms == 0)
                return 0;
        unsigned __int128 d = (unsigned __int128) 1000 * rate.den;
        unsigned __int128 n = ((unsigned __int128) duration_ms * rate.num + d - 1) / d;
        return n > UINT64_MAX ? UINT64_MAX : (uint64_t) n;
}

uint64_t arrival_phase_offset_ms(Rate rate, uint64_t i) {
        assert(rate.num > 0);
        /* The 64-bit division is the common case; it runs once per arrival. */
        if (rate.den <= UINT64_MAX / 1000 && i <= UINT64_MAX / (1000 * rate.den))
                return i * 1000 * rate.den / rate.num;
        unsigned __int128 v = (unsigned __int128) i * 1000 * rate.den / rate.num;
        return v > UINT64_MAX ? UINT64_MAX : (uint64_t) v;
}

/* ---- phases from "RATE/s:DURATION,…" ---- */

static int add_phase(Scenario *s, const char *rate, const char *duration, const ScenarioTraffic *traffic,
                     const char *origin, char **error) {
        ArrivalPhase phase = {};
        int r;

        if (parse_rate(rate, &phase.rate) < 0)
                return scenario_error(error, "%s: invalid rate \"%s\"", origin, rate);
        r = parse_duration_ms(duration, false, &phase.duration_ms);
        if (r < 0)
                return scenario_duration_error(error, origin, duration, r);
        if (phase.duration_ms == 0)
                return scenario_error(error, "%s: invalid duration \"%s\"", origin, duration);

        ArrivalPhase *n = reallocarray(s->phases, s->n_phases + 1, sizeof(ArrivalPhase));
        if (!n)
                return -ENOMEM;
        s->phases = n;
        r = traffic_copy(traffic, &phase.traffic);
        if (r < 0)
                return r;
        s->phases[s->n_phases++] = phase;
        return 0;
}

int scenario_add_phases(Scenario *s, const char *spec, const ScenarioTraffic *traffic, char **error) {
        assert_return(s && spec && traffic && error, -EINVAL);

        const char *origin = traffic->origin ?: "--arrivals";
        _cleanup_free_ char *copy = strdup(spec);
        if (!copy)
                return -ENOMEM;
        if (*copy == '\0')
                return scenario_error(error, "%s: no phase given, expected RATE/s:DURATION", origin);

        char *save = NULL;
        for (char *phase = strtok_r(copy, ",", &save); phase; phase = strtok_r(NULL, ",", &save)) {
                char *colon = strchr(phase, ':');
                if (!colon)
                        return scenario_error(error, "%s: invalid phase \"%s\", expected RATE/s:DURATION", origin,
                                              phase);
                *colon = '\0';
                int r = add_phase(s, phase, colon + 1, traffic, origin, error);
                if (r < 0)
                        return r;
        }
        /* strtok_r skips empty fields; a stray comma is still a typo worth reporting. */
        if (spec[0] == ',' || spec[strlen(spec) - 1] == ',' || strstr(spec, ",,"))
                return scenario_error(error, "%s: empty phase in \"%s\"", origin, spec);
        return 0;
}

/* ---- finishing ---- */

static int compare_request_order(const void *a, const void *b, void *userdata) {
        const Scenario *s = userdata;
        size_t x = *(const size_t *) a, y = *(const size_t *) b;
        uint64_t tx = s->requests[x].at_ms, ty = s->requests[y].at_ms;

        if (tx != ty)
                return tx < ty ? -1 : 1;
        return x < y ? -1 : x > y; /* file order within an instant */
}

typedef struct SortByAt {
        const char *base;
        size_t size, at_offset;
} SortByAt;

static int compare_by_at(const void *a, const void *b, void *userdata) {
        const SortByAt *sort = userdata;
        size_t x = *(const size_t *) a, y = *(const size_t *) b;
        uint64_t tx, ty;

        memcpy(&tx, sort->base + x * sort->size + sort->at_offset, sizeof tx);
        memcpy(&ty, sort->base + y * sort->size + sort->at_offset, sizeof ty);
        if (tx != ty)
                return tx < ty ? -1 : 1;
        return x < y ? -1 : x > y; /* file order within an instant */
}

/* Sorts n elements of `size` bytes by the uint64_t at `at_offset` in each, file order within an instant: qsort()
 * is not stable, so it sorts their indices, the index breaking ties. O(n log n) whatever the file's order (an
 * insertion sort took minutes for 100,000 drains given backwards). */
static int sort_by_at(void *base, size_t n, size_t size, size_t at_offset) {
        if (n < 2)
                return 0;
        _cleanup_free_ size_t *order = reallocarray(NULL, n, sizeof(size_t));
        _cleanup_free_ char *copy = reallocarray(NULL, n, size);
        if (!order || !copy)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                order[i] = i;
        qsort_r(order, n, sizeof(size_t), compare_by_at,
                &(SortByAt) { .base = base, .size = size, .at_offset = at_offset });
        memcpy(copy, base, n * size);
        for (size_t i = 0; i < n; i++)
                memcpy((char *) base + i * size, copy + order[i] * size, size);
        return 0;
}

static int compare_cancel_order(const void *a, const void *b, void *userdata) {
        const Scenario *s = userdata;
        uint64_t cx = scenario_request_cancel_at(&s->requests[*(const size_t *) a]),
                 cy = scenario_request_cancel_at(&s->requests[*(const size_t *) b]);

        if (cx != cy)
                return cx < cy ? -1 : 1;
        return compare_request_order(a, b, userdata); /* in request_order within an instant */
}

/* The explicit requests with a cancel, by when it comes, in request_order within an instant. */
static int order_cancels(Scenario *s) {
        s->cancel_order = mfree(s->cancel_order);
        s->n_cancels = 0;
        for (size_t i = 0; i < s->n_requests; i++) {
                if (s->requests[i].cancel_ms == SIM_FOREVER)
                        continue;
                if (!s->cancel_order) {
                        s->cancel_order = calloc(s->n_requests, sizeof(size_t));
                        if (!s->cancel_order)
                                return -ENOMEM;
                }
                s->cancel_order[s->n_cancels++] = i;
        }
        if (s->n_cancels > 1)
                qsort_r(s->cancel_order, s->n_cancels, sizeof(size_t), compare_cancel_order, s);
        return 0;
}

static int check_lane(const Scenario *s, const ScenarioTraffic *t, char **error) {
        if (!t->lane)
                return scenario_error(error, "%s.lane: missing (the scenario has several lanes)", t->origin);
        if (!strv_contains_n(s->lanes, s->n_lanes, t->lane))
                return scenario_error(error, "%s.lane: unknown lane \"%s\"", t->origin, t->lane);
        return 0;
}

int scenario_finish(Scenario *s, char **error) {
        uint64_t start = 0, total = 0;
        int r;

        assert_return(s && error, -EINVAL);
        assert_return(!s->finished, -EBUSY);

        for (size_t i = 0; i < s->n_phases; i++) {
                ArrivalPhase *p = &s->phases[i];

                r = check_lane(s, &p->traffic, error);
                if (r < 0)
                        return r;
                p->start_ms = start;
                p->count = arrival_phase_count(p->rate, p->duration_ms);
                p->first = total;
                if (p->count > ARRIVALS_MAX - total)
                        return scenario_error(error, "%s: too many arrivals (more than %" PRIu64 ")", p->traffic.origin,
                                              ARRIVALS_MAX);
                total += p->count;
                if (p->duration_ms > SIM_SPAN_MAX_MS - start)
                        return scenario_error(error, "%s: the phases last longer than " SIM_SPAN_MAX_TEXT
                                                     ", the most virtual time a simulation covers",
                                              p->traffic.origin);
                start += p->duration_ms;
        }
        s->n_generated = total;

        for (size_t i = 0; i < s->n_requests; i++) {
                r = check_lane(s, &s->requests[i].traffic, error);
                if (r < 0)
                        return r;
        }
        if (s->n_requests > ARRIVALS_MAX - total)
                return scenario_error(error, "%s: too many requests", s->origin);

        free(s->request_order);
        s->request_order = NULL;
        if (s->n_requests > 0) {
                s->request_order = calloc(s->n_requests, sizeof(size_t));
                if (!s->request_order)
                        return -ENOMEM;
                for (size_t i = 0; i < s->n_requests; i++)
                        s->request_order[i] = i;
                qsort_r(s->request_order, s->n_requests, sizeof(size_t), compare_request_order, s);
        }
        if (s->n_reservations > ARRIVALS_MAX - total - s->n_requests)
                return scenario_error(error, "%s: too many reservations", s->origin);
        r = sort_by_at(s->drains, s->n_drains, sizeof(ScenarioDrain), offsetof(ScenarioDrain, at_ms));
        if (r >= 0)
                r = sort_by_at(s->reservations, s->n_reservations, sizeof(ScenarioReservation),
                               offsetof(ScenarioReservation, at_ms));
        if (r >= 0)
                r = sort_by_at(s->quarantines, s->n_quarantines, sizeof(ScenarioDrain), offsetof(ScenarioDrain, at_ms));
        if (r >= 0)
                r = order_cancels(s);
        if (r < 0)
                return r;

        /* Settings and presences as the file's reloads add them, in reload order: reload_builds_on_previous(). */
        s->reloads_in_order = true;
        for (size_t i = 1; i < s->n_settings; i++)
                s->reloads_in_order = s->reloads_in_order && s->settings[i - 1].reload <= s->settings[i].reload;
        for (size_t i = 1; i < s->n_presences; i++)
                s->reloads_in_order = s->reloads_in_order && s->presences[i - 1].reload <= s->presences[i].reload;

        s->finished = true;
        return 0;
}

const ScenarioTraffic *scenario_traffic(const Scenario *s, uint64_t id) {
        if (id >= s->n_generated) {
                uint64_t k = id - s->n_generated;
                return k < s->n_requests ? &s->requests[k].traffic : NULL;
        }

        /* The last phase whose first arrival is at or before id: a phase without arrivals shares its
         * `first` with the next one, which comes later in the array and so wins. */
        size_t lo = 0, hi = s->n_phases;
        while (hi - lo > 1) {
                size_t mid = lo + (hi - lo) / 2;
                if (s->phases[mid].first <= id)
                        lo = mid;
                else
                        hi = mid;
        }
        return &s->phases[lo].traffic;
}

const char *scenario_request_name(const Scenario *s, uint64_t id) {
        if (id < s->n_generated || id - s->n_generated >= s->n_requests)
                return NULL;
        return s->requests[id - s->n_generated].name;
}

/* ---- the configuration ---- */

static const char *conf_error_text(const ConfErrors *errors) {
        if (errors->n_errors == 0 || !errors->errors[errors->n_errors - 1].message)
                return "invalid value";
        return errors->errors[errors->n_errors - 1].message;
}

/* How many slots of the pool a request could ever get: its members that match the request's labels and
 * member (SPEC §3.5; the lane's labels= with them), or its limit. */
static unsigned pool_capacity(const PoolConfig *p, const LaneConfig *l, const ScenarioTraffic *t) {
        size_t n_lane = strv_length(l->labels), n = strv_length(t->labels);
        if (n_lane + n == 0 && !t->member)
                return p->limit;
        if (!p->members)
                return 0; /* local or shared alike (SPEC §3.5) */
        _cleanup_free_ char **terms = calloc(n_lane + n + 1, sizeof(char *));
        _cleanup_free_ uint64_t *set = NULL;
        if (!terms)
                return 0;
        for (size_t i = 0; i < n_lane + n; i++)
                terms[i] = i < n_lane ? l->labels[i] : t->labels[i - n_lane];
        if (selector_resolve(&(Selector) { .terms = terms, .member = t->member }, p->members, p->labels, p->n_labels,
                             &set) < 0)
                return 0;
        return member_set_count(set, member_set_words(p->n_members));
}

static bool lane_fits(const BrokerConfig *c, const ScenarioTraffic *t, unsigned *ret_largest) {
        const LaneConfig *l = conf_find_lane(c, t->lane);
        unsigned largest = 0;

        if (!l)
                return false;
        for (size_t i = 0; i < l->n_pools; i++) {
                const PoolConfig *p = conf_find_pool(c, l->pools[i]);
                if (p)
                        largest = MAX(largest, MIN(pool_capacity(p, l, t), conf_lane_most(c, l, p->name)));
        }
        *ret_largest = largest;
        return t->slots <= largest;
}

static int check_fits(const BrokerConfig *c, const ScenarioTraffic *t, const char *key, const char *value,
                      char **error) {
        unsigned largest = 0;

        if (!conf_find_lane(c, t->lane))
                return scenario_error(error, "%s.lane: no lane \"%s\" when it arrives (a reload removed it, or adds it later)",
                                      t->origin, t->lane);
        if (lane_fits(c, t, &largest))
                return 0;
        if (key)
                return scenario_error(error,
                                      "%s.slots: %u slots, but with %s=%s no pool of lane \"%s\" has more than %u",
                                      t->origin, t->slots, key, value, t->lane, largest);
        if (t->labels || t->member || conf_find_lane(c, t->lane)->labels)
                return scenario_error(error, "%s.slots: %u slots, but in no pool of lane \"%s\" do more than %u members match its labels and member",
                                      t->origin, t->slots, t->lane, largest);
        return scenario_error(error, "%s.slots: %u slots, but no pool of lane \"%s\" has more than %u", t->origin,
                              t->slots, t->lane, largest);
}

/* How many reloads come before `ms`: the configuration a drain or quarantine at `ms` meets (before that
 * instant's reloads). */
static size_t reload_before(const Scenario *s, uint64_t ms) {
        return ms == 0 ? 0 : scenario_reload_at(s, ms - 1);
}

/* A drain's, quarantine's or reservation's pool in the configuration in force when it comes: a reload may have
 * removed it, or add it later. */
static int find_pool_then(const BrokerConfig *c, const char *pool, const char *origin, char **error,
                          const PoolConfig **ret) {
        *ret = conf_find_pool(c, pool);
        if (!*ret)
                return scenario_error(error, "%s.pool: no pool \"%s\" then (a reload removed it, or adds it later)",
                                      origin, pool);
        return 0;
}

/* The drains or quarantines that meet the reload-th configuration: their pools there, their members its. */
static int check_drains(const Scenario *s, const BrokerConfig *c, size_t reload, const ScenarioDrain *drains,
                        size_t n, char **error) {
        size_t from, to;
        reload_window(s, reload, true, drains, n, sizeof(ScenarioDrain), offsetof(ScenarioDrain, at_ms), NULL, &from,
                      &to);
        for (size_t i = from; i < to; i++) {
                const ScenarioDrain *d = &drains[i];
                const PoolConfig *p = NULL;
                if (reload_before(s, d->at_ms) != reload)
                        continue;
                int r = find_pool_then(c, d->pool, d->origin, error, &p);
                if (r < 0)
                        return r;
                if (d->member && !strv_contains(p->members, d->member))
                        return scenario_error(error, "%s.member: pool \"%s\" has no member \"%s\"", d->origin, d->pool,
                                              d->member);
        }
        return 0;
}

int scenario_build_config(const Scenario *s, const char *key, const char *value, char **error, BrokerConfig **ret) {
        return scenario_build_config_reload(s, key, value, 0, NULL, error, ret);
}

/* Where in s->settings the settings of the reload-th reload are, when the reload-th configuration is the one
 * before it with them (and the sweep) applied on top: the reload adds and removes no pool or lane, and the
 * settings are in reload order (those of the first configuration that options add come last otherwise). Then
 * building it costs its own settings, not every setting of every reload before it (which made a scenario of R
 * reloads O(R²) in them). A sweep's key (limit, max-queue, queue-timeout) is set last either way, and each
 * takes its value alone: applying it before the reload's settings too changes nothing. */
static bool reload_builds_on_previous(const Scenario *s, size_t reload, size_t *ret_from, size_t *ret_to) {
        if (!s->finished || !s->reloads_in_order || reload == 0)
                return false;
        size_t lo = 0, hi = s->n_presences;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (s->presences[mid].reload < reload)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        if (lo < s->n_presences && s->presences[lo].reload == reload)
                return false;
        size_t from = 0, to;
        for (hi = s->n_settings; from < hi;) {
                size_t mid = from + (hi - from) / 2;
                if (s->settings[mid].reload < reload)
                        from = mid + 1;
                else
                        hi = mid;
        }
        for (to = from, hi = s->n_settings; to < hi;) {
                size_t mid = to + (hi - to) / 2;
                if (s->settings[mid].reload <= reload)
                        to = mid + 1;
                else
                        hi = mid;
        }
        *ret_from = from;
        *ret_to = to;
        return true;
}

static int build_config(const Scenario *s, const char *key, const char *value, size_t reload,
                        const BrokerConfig *previous, char **error, BrokerConfig **ret) {
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        _cleanup_free_ size_t *requests = NULL;
        ConfErrors errors = {};
        size_t first_setting = 0, end_setting = s->n_settings;
        int r;

        if (previous && reload_builds_on_previous(s, reload, &first_setting, &end_setting)) {
                r = conf_copy(previous, &c);
                if (r < 0)
                        return r;
                goto settings;
        }
        first_setting = 0;
        end_setting = s->n_settings;
        r = conf_new(&c);
        if (r < 0)
                return r;

        /* Sections first, so that conf_validate() names where a pool or lane was defined. */
        for (size_t i = 0; i < s->n_pools + s->n_lanes; i++) {
                bool pool = i < s->n_pools;
                const char *name = pool ? s->pools[i] : s->lanes[i - s->n_pools];
                const char *where = pool ? s->pool_wheres[i] : s->lane_wheres[i - s->n_pools];
                _cleanup_free_ char *section = NULL;
                ConfSource source = { .file = (char *) where };

                if (asprintf(&section, "%s %s", pool ? "pool" : "lane", name) < 0) {
                        r = -ENOMEM;
                        goto finish;
                }
                if (!section_present(s, section, reload))
                        continue;
                r = conf_section_add(c, section, &source, &errors);
                if (r == -EINVAL)
                        r = scenario_error(error, "%s: %s", where, conf_error_text(&errors));
                if (r < 0)
                        goto finish;
        }

settings:
        for (size_t i = first_setting; i < end_setting; i++) {
                const ScenarioSetting *set = &s->settings[i];
                ConfSource source = { .file = set->where };

                /* A pool or lane added back has the keys it had, these on top. */
                if (set->reload > reload || !section_present(s, set->section, reload))
                        continue;
                r = conf_set(c, set->section, set->key, set->value, &source, &errors);
                if (r == -EINVAL)
                        r = scenario_error(error, "%s: %s", set->origin, conf_error_text(&errors));
                if (r < 0)
                        goto finish;
        }

        if (key) {
                _cleanup_free_ char *origin = NULL;
                if (asprintf(&origin, "--sweep %s=%s", key, value) < 0) {
                        r = -ENOMEM;
                        goto finish;
                }
                for (size_t i = 0; i < s->n_pools; i++) {
                        _cleanup_free_ char *section = NULL;
                        ConfSource source = { .file = origin };

                        if (asprintf(&section, "pool %s", s->pools[i]) < 0) {
                                r = -ENOMEM;
                                goto finish;
                        }
                        if (!section_present(s, section, reload))
                                continue;
                        r = conf_set(c, section, key, value, &source, &errors);
                        if (r == -EINVAL)
                                r = scenario_error(error, "%s: %s", origin, conf_error_text(&errors));
                        if (r < 0)
                                goto finish;
                }
        }

        r = conf_validate(c, &errors);
        if (r == -EINVAL) {
                /* Every problem, one per line, each naming where it came from. */
                _cleanup_free_ char *text = NULL;
                size_t size = 0;
                FILE *f = open_memstream(&text, &size);
                if (!f) {
                        r = -ENOMEM;
                        goto finish;
                }
                conf_errors_print(&errors, f);
                if (fclose(f) != 0 || !text) {
                        r = -ENOMEM;
                        goto finish;
                }
                while (size > 0 && text[size - 1] == '\n')
                        text[--size] = '\0';
                r = scenario_error(error, "%s", size > 0 ? text : "invalid configuration");
                goto finish;
        }
        if (r < 0)
                goto finish;

        /* What comes while this configuration is in force, [from, to), must fit it (a reload at an instant comes
         * before its arrivals and reservations, after its drains and quarantines). */
        uint64_t from = reload == 0 ? 0 : s->reloads[reload - 1],
                 to = reload < s->n_reloads ? s->reloads[reload] : SIM_FOREVER;
        for (size_t i = 0; i < s->n_phases; i++) {
                const ArrivalPhase *ph = &s->phases[i];
                if (ph->count == 0 || ph->start_ms >= to || from >= ph->start_ms + ph->duration_ms)
                        continue;
                r = check_fits(c, &ph->traffic, key, value, error);
                if (r < 0)
                        goto finish;
        }
        /* The requests of this configuration, in file order: the first that does not fit is named. */
        size_t from_request, to_request;
        reload_window(s, reload, false, s->requests, s->n_requests, sizeof(ScenarioRequest),
                      offsetof(ScenarioRequest, at_ms), s->request_order, &from_request, &to_request);
        if (s->request_order && to_request > from_request) {
                requests = reallocarray(NULL, to_request - from_request, sizeof(size_t));
                if (!requests) {
                        r = -ENOMEM;
                        goto finish;
                }
                memcpy(requests, s->request_order + from_request, (to_request - from_request) * sizeof(size_t));
                qsort(requests, to_request - from_request, sizeof(size_t), compare_index);
        }
        for (size_t j = from_request; j < to_request; j++) {
                size_t i = requests ? requests[j - from_request] : j;
                if (scenario_reload_at(s, s->requests[i].at_ms) != reload)
                        continue;
                r = check_fits(c, &s->requests[i].traffic, key, value, error);
                if (r < 0)
                        goto finish;
        }
        /* Every reload's configuration is valid too, so that a run does not fail halfway: each built on the one
         * before where that is the same. */
        if (reload == 0 && s->n_reloads > 0) {
                _cleanup_(conf_freep) BrokerConfig *later = NULL;
                for (size_t k = 1; k <= s->n_reloads; k++) {
                        BrokerConfig *next = NULL;
                        r = build_config(s, key, value, k, later ?: c, error, &next);
                        if (r < 0)
                                goto finish;
                        conf_free(later);
                        later = next;
                }
        }
        /* As slotctl drain, quarantine and restore are refused: a member the pool does not have (a quarantine
         * always names one). */
        r = check_drains(s, c, reload, s->drains, s->n_drains, error);
        if (r < 0)
                goto finish;
        r = check_drains(s, c, reload, s->quarantines, s->n_quarantines, error);
        if (r < 0)
                goto finish;
        /* As brokerd refuses a Reserve (SPEC §3.6): a member or labels no member of the pool has. */
        size_t from_reservation, to_reservation;
        reload_window(s, reload, false, s->reservations, s->n_reservations, sizeof(ScenarioReservation),
                      offsetof(ScenarioReservation, at_ms), NULL, &from_reservation, &to_reservation);
        for (size_t i = from_reservation; i < to_reservation; i++) {
                const ScenarioReservation *v = &s->reservations[i];
                const PoolConfig *p = NULL;
                _cleanup_free_ uint64_t *set = NULL;
                if (scenario_reload_at(s, v->at_ms) != reload)
                        continue;
                r = find_pool_then(c, v->pool, v->origin, error, &p);
                if (r < 0)
                        goto finish;
                if (!v->member && !v->labels)
                        continue;
                if (!p->members) {
                        r = scenario_error(error, "%s.%s: pool \"%s\" has no members", v->origin,
                                           v->member ? "member" : "labels", v->pool);
                        goto finish;
                }
                if (v->member && !strv_contains(p->members, v->member)) {
                        r = scenario_error(error, "%s.member: pool \"%s\" has no member \"%s\"", v->origin, v->pool,
                                           v->member);
                        goto finish;
                }
                if (selector_resolve(&(Selector) { .terms = v->labels, .member = v->member }, p->members, p->labels,
                                     p->n_labels, &set) < 0 ||
                    member_set_count(set, member_set_words(p->n_members)) == 0) {
                        r = scenario_error(error, "%s.labels: no member of pool \"%s\" matches them", v->origin,
                                           v->pool);
                        goto finish;
                }
        }

        *ret = TAKE_PTR(c);
        r = 0;
finish:
        conf_errors_done(&errors);
        return r;
}

int scenario_build_config_reload(const Scenario *s, const char *key, const char *value, size_t reload,
                                 const BrokerConfig *previous, char **error, BrokerConfig **ret) {
        assert_return(s && error && ret, -EINVAL);
        assert_return(!key == !value, -EINVAL);
        assert_return(!previous || reload > 0, -EINVAL);

        return build_config(s, key, value, reload, previous, error, ret);
}

/* ---- scenario files ---- */

typedef enum ValueKind {
        VALUE_INTEGER,     /* or a string, as the INI file would have it: "infinity" */
        VALUE_STRING,
        VALUE_STRING_LIST, /* joined with spaces, as the INI file would have it */
        VALUE_INTEGER_LIST, /* an array of integers joined with spaces, or a string as the INI file has it */
} ValueKind;

typedef struct KeyRule {
        const char *key;
        ValueKind kind;
} KeyRule;

/* The config's own key names (SPEC §4); conf_set() judges the values. */
static const KeyRule pool_keys[] = {
        { "limit", VALUE_INTEGER },
        { "members", VALUE_STRING_LIST },
        { "max-queue", VALUE_INTEGER },
        { "queue-timeout", VALUE_STRING },
        { "queue-congestion-timeout", VALUE_STRING },
        { "cooldown", VALUE_STRING },
        { "quarantine-exit-codes", VALUE_INTEGER_LIST }, /* [3, 4] or "3 4" */
        { "quarantine-after", VALUE_INTEGER },
        { "backend", VALUE_STRING },
        { "admin-users", VALUE_STRING_LIST },
        { "admin-groups", VALUE_STRING_LIST },
};

/* label.NAME (SPEC §3.5): any name, which conf_set() judges. */
static const KeyRule pool_label_key = { "label.", VALUE_STRING_LIST };

static const KeyRule lane_keys[] = {
        { "pools", VALUE_STRING_LIST },
        { "labels", VALUE_STRING_LIST },
        { "also", VALUE_STRING_LIST }, /* ["db", "licence:2"]: as also= (SPEC §3.5) */
        { "policy", VALUE_STRING },
        { "priority", VALUE_INTEGER },
        { "max-in-use", VALUE_INTEGER },
        { "reserve", VALUE_INTEGER },
        { "queue-timeout", VALUE_STRING },
        { "client-wait", VALUE_STRING },
        { "max-hold", VALUE_STRING },
        { "health", VALUE_STRING }, /* "yes", "also", "no" */
        { "allow-users", VALUE_STRING_LIST },
        { "allow-groups", VALUE_STRING_LIST },
};

static const KeyRule *find_rule(const KeyRule *rules, size_t n_rules, const char *key) {
        for (size_t i = 0; i < n_rules; i++)
                if (streq(rules[i].key, key))
                        return &rules[i];
        if (rules == pool_keys && strncmp(key, pool_label_key.key, strlen(pool_label_key.key)) == 0)
                return &pool_label_key;
        return NULL;
}

static const char *json_kind(const json_t *v) {
        switch (json_typeof(v)) {
        case JSON_OBJECT:
                return "an object";
        case JSON_ARRAY:
                return "an array";
        case JSON_STRING:
                return "a string";
        case JSON_INTEGER:
                return "an integer";
        case JSON_REAL:
                return "a number with a fraction";
        case JSON_TRUE:
        case JSON_FALSE:
                return "a boolean";
        case JSON_NULL:
        default:
                return "null";
        }
}

/* Names become INI section names and space-separated lists: no blanks, no controls, not empty. */
static bool name_is_valid(const char *s, size_t len) {
        if (len == 0 || strlen(s) != len || len > 255)
                return false;
        for (const char *p = s; *p; p++)
                if ((unsigned char) *p <= ' ' || *p == 0x7f || *p == '[' || *p == ']')
                        return false;
        return true;
}

static int get_string(const json_t *v, const char *path, char **error, const char **ret) {
        if (!json_is_string(v))
                return scenario_error(error, "%s: expected a string, got %s", path, json_kind(v));
        if (strlen(json_string_value(v)) != json_string_length(v))
                return scenario_error(error, "%s: contains a NUL character", path);
        *ret = json_string_value(v);
        return 0;
}

static int value_to_string(const json_t *v, ValueKind kind, const char *path, char **error, char **ret) {
        char *s = NULL;

        switch (kind) {
        case VALUE_INTEGER:
                if (json_is_integer(v)) {
                        if (asprintf(&s, "%" JSON_INTEGER_FORMAT, json_integer_value(v)) < 0)
                                return -ENOMEM;
                        break;
                }
                /* Any other spelling the config takes ("infinity" for max-queue=) is the config parser's to
                 * judge, the same as in brokerd.conf. */
                if (!json_is_string(v))
                        return scenario_error(error, "%s: expected an integer, got %s", path, json_kind(v));
                __attribute__((fallthrough));
        case VALUE_STRING: {
                const char *t;
                int r = get_string(v, path, error, &t);
                if (r < 0)
                        return r;
                s = strdup(t);
                if (!s)
                        return -ENOMEM;
                break;
        }

        case VALUE_INTEGER_LIST: {
                size_t i, size = 0;
                json_t *e;
                FILE *f;

                if (json_is_string(v))
                        return value_to_string(v, VALUE_STRING, path, error, ret);
                if (!json_is_array(v))
                        return scenario_error(error, "%s: expected an array of integers, got %s", path, json_kind(v));
                json_array_foreach(v, i, e)
                        if (!json_is_integer(e))
                                return scenario_error(error, "%s[%zu]: expected an integer, got %s", path, i,
                                                      json_kind(e));
                f = open_memstream(&s, &size);
                if (!f)
                        return -ENOMEM;
                json_array_foreach(v, i, e)
                        fprintf(f, "%s%" JSON_INTEGER_FORMAT, i > 0 ? " " : "", json_integer_value(e));
                if (fclose(f) != 0 || !s) {
                        free(s);
                        return -ENOMEM;
                }
                break;
        }

        case VALUE_STRING_LIST: {
                size_t i, size = 0;
                json_t *e;
                FILE *f;

                if (!json_is_array(v))
                        return scenario_error(error, "%s: expected an array of names, got %s", path, json_kind(v));
                json_array_foreach(v, i, e)
                        if (!json_is_string(e) || !name_is_valid(json_string_value(e), json_string_length(e)))
                                return scenario_error(error, "%s[%zu]: expected a name (a string without blanks)", path,
                                                      i);
                f = open_memstream(&s, &size);
                if (!f)
                        return -ENOMEM;
                json_array_foreach(v, i, e)
                        fprintf(f, "%s%s", i > 0 ? " " : "", json_string_value(e));
                if (fclose(f) != 0 || !s) {
                        free(s);
                        return -ENOMEM;
                }
                break;
        }
        }

        *ret = s;
        return 0;
}

/* prefix: "" for the first configuration, "reloads[k]." for the reload-th (k + 1) */
static int parse_section(Scenario *s, const char *prefix, size_t reload, const char *kind, const char *name,
                         const json_t *obj, const KeyRule *rules, size_t n_rules, char **error) {
        _cleanup_free_ char *section = NULL, *where = NULL;
        const char *key;
        json_t *v;
        int r;

        if (asprintf(&where, "%s: %s%ss.%s", s->origin, prefix, kind, name) < 0)
                return -ENOMEM;
        if (!json_is_object(obj))
                return scenario_error(error, "%s: expected an object, got %s", where, json_kind(obj));
        if (asprintf(&section, "%s %s", kind, name) < 0)
                return -ENOMEM;

        json_object_foreach((json_t *) obj, key, v) {
                _cleanup_free_ char *path = NULL, *value = NULL;
                const KeyRule *rule = NULL;

                if (asprintf(&path, "%s.%s", where, key) < 0)
                        return -ENOMEM;
                rule = find_rule(rules, n_rules, key);
                if (!rule)
                        return scenario_error(error, "%s: unknown key", path);

                if (streq(kind, "lane") && streq(key, "pools")) {
                        size_t i;
                        json_t *e;

                        if (!json_is_array(v) || json_array_size(v) == 0)
                                return scenario_error(error, "%s: expected a non-empty array of pool names", path);
                        json_array_foreach(v, i, e)
                                if (json_is_string(e) && !scenario_pool_name(s, json_string_value(e)))
                                        return scenario_error(error, "%s[%zu]: unknown pool \"%s\"", path, i,
                                                              json_string_value(e));
                }

                r = value_to_string(v, rule->kind, path, error, &value);
                if (r < 0)
                        return r;
                r = scenario_add_setting(s, section, key, value, where, path);
                if (r < 0)
                        return r;
                s->settings[s->n_settings - 1].reload = reload;
        }
        return 0;
}

static int parse_pools(Scenario *s, const json_t *pools, const json_t *pool, char **error) {
        const char *name;
        json_t *v;
        int r;

        if (pools && pool)
                return scenario_error(error, "%s: pool: cannot be combined with \"pools\"", s->origin);
        if (pool) {
                _cleanup_free_ char *where = NULL;

                if (!json_is_object(pool))
                        return scenario_error(error, "%s: pool: expected an object, got %s", s->origin,
                                              json_kind(pool));
                if (asprintf(&where, "%s: pool", s->origin) < 0)
                        return -ENOMEM;
                r = scenario_add_pool(s, "default", where);
                if (r < 0)
                        return r;
                /* The shorthand names its keys as written: "pool.limit". */
                json_object_foreach((json_t *) pool, name, v) {
                        _cleanup_free_ char *path = NULL, *value = NULL;
                        const KeyRule *rule = NULL;

                        if (asprintf(&path, "%s.%s", where, name) < 0)
                                return -ENOMEM;
                        rule = find_rule(pool_keys, ELEMENTSOF(pool_keys), name);
                        if (!rule)
                                return scenario_error(error, "%s: unknown key", path);
                        r = value_to_string(v, rule->kind, path, error, &value);
                        if (r < 0)
                                return r;
                        r = scenario_add_setting(s, "pool default", name, value, where, path);
                        if (r < 0)
                                return r;
                }
                return 0;
        }

        if (!pools)
                return scenario_error(error, "%s: pools: missing (or \"pool\" for a single pool)", s->origin);
        if (!json_is_object(pools))
                return scenario_error(error, "%s: pools: expected an object, got %s", s->origin, json_kind(pools));
        if (json_object_size(pools) == 0)
                return scenario_error(error, "%s: pools: no pool defined", s->origin);

        /* Names first, so that the order of keys in the file does not matter to lanes. */
        json_object_foreach((json_t *) pools, name, v) {
                _cleanup_free_ char *where = NULL;

                if (!conf_name_is_valid(name))
                        return scenario_error(error, "%s: pools: invalid pool name \"%s\" (expected 1 to %d characters from A-Z a-z 0-9 . _ -)",
                                              s->origin, name, CONF_NAME_MAX);
                if (asprintf(&where, "%s: pools.%s", s->origin, name) < 0)
                        return -ENOMEM;
                r = scenario_add_pool(s, name, where);
                if (r < 0)
                        return r;
        }
        json_object_foreach((json_t *) pools, name, v) {
                r = parse_section(s, "", 0, "pool", name, v, pool_keys, ELEMENTSOF(pool_keys), error);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int parse_lanes(Scenario *s, const json_t *lanes, char **error) {
        const char *name;
        json_t *v;
        int r;

        if (!lanes) {
                if (s->n_pools != 1)
                        return scenario_error(error, "%s: lanes: missing (needed with more than one pool)", s->origin);
                /* One lane that waits on the one pool (SPEC §9). */
                _cleanup_free_ char *where = NULL;
                if (asprintf(&where, "%s: the default lane", s->origin) < 0)
                        return -ENOMEM;
                r = scenario_add_lane(s, "default", where);
                if (r < 0)
                        return r;
                r = scenario_add_setting(s, "lane default", "pools", s->pools[0], where, where);
                if (r < 0)
                        return r;
                return scenario_add_setting(s, "lane default", "policy", "wait", where, where);
        }

        if (!json_is_object(lanes))
                return scenario_error(error, "%s: lanes: expected an object, got %s", s->origin, json_kind(lanes));
        if (json_object_size(lanes) == 0)
                return scenario_error(error, "%s: lanes: no lane defined", s->origin);
        json_object_foreach((json_t *) lanes, name, v) {
                _cleanup_free_ char *where = NULL;

                if (!conf_name_is_valid(name))
                        return scenario_error(error, "%s: lanes: invalid lane name \"%s\" (expected 1 to %d characters from A-Z a-z 0-9 . _ -)",
                                              s->origin, name, CONF_NAME_MAX);
                if (asprintf(&where, "%s: lanes.%s", s->origin, name) < 0)
                        return -ENOMEM;
                r = scenario_add_lane(s, name, where);
                if (r < 0)
                        return r;
                r = parse_section(s, "", 0, "lane", name, v, lane_keys, ELEMENTSOF(lane_keys), error);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int parse_duration_value(const json_t *v, bool allow_forever, const char *path, char **error,
                                uint64_t *ret) {
        const char *text = NULL;
        int r;

        r = get_string(v, path, error, &text);
        if (r < 0)
                return r;
        r = parse_duration_ms(text, allow_forever, ret);
        if (r < 0)
                return scenario_duration_error(error, path, text, r);
        return 0;
}

/* A drain's or a reservation's "pool": one the scenario configures, copied to *ret. */
static int get_pool_name(const Scenario *s, const json_t *v, const char *path, char **error, char **ret) {
        const char *text;
        int r = get_string(v, path, error, &text);
        if (r < 0)
                return r;
        if (!scenario_pool_name(s, text))
                return scenario_error(error, "%s: unknown pool \"%s\"", path, text);
        return strdup_or_null(text, ret) < 0 ? -ENOMEM : 0;
}

/* A "member": a valid name (the pool's own members are checked against the config later), copied to *ret. */
static int get_member_name(const json_t *v, const char *path, char **error, char **ret) {
        const char *text;
        int r = get_string(v, path, error, &text);
        if (r < 0)
                return r;
        if (!conf_name_is_valid(text))
                return scenario_error(error, "%s: invalid member name \"%s\"", path, text);
        return strdup_or_null(text, ret) < 0 ? -ENOMEM : 0;
}

/* "labels": an array of selector terms (label or !label), at most SELECTOR_TERMS_MAX / 2 of them, copied to *ret.
 * A request may give an empty one (no labels); a reservation may not (SPEC §3.6: a member or labels). */
static int get_labels(const json_t *v, bool allow_empty, const char *path, char **error, char ***ret) {
        size_t i, n = json_array_size(v);
        json_t *term;

        if (!json_is_array(v) || (n == 0 && !allow_empty))
                return scenario_error(error, "%s: expected an array of labels, got %s", path,
                                      json_is_array(v) ? "an empty one" : json_kind(v));
        if (n > SELECTOR_TERMS_MAX / 2)
                return scenario_error(error, "%s: %zu labels, at most %d", path, n, SELECTOR_TERMS_MAX / 2);
        _cleanup_(strv_freep) char **l = calloc(n + 1, sizeof(char *));
        if (!l)
                return -ENOMEM;
        json_array_foreach(v, i, term) {
                if (!json_is_string(term) || !selector_term_is_valid(json_string_value(term)))
                        return scenario_error(error, "%s[%zu]: expected a label or !label (a-z 0-9 . _ -)", path, i);
                if (!(l[i] = strdup(json_string_value(term))))
                        return -ENOMEM;
        }
        *ret = TAKE_PTR(l);
        return 0;
}

/* The keys a phase and a request share. Returns 1 if `key` was one of them. */
static int parse_traffic_key(Scenario *s, ScenarioTraffic *t, const char *key, const json_t *v, const char *path,
                             char **error) {
        const char *text;
        int r = 0;

        if (streq(key, "hold")) {
                r = parse_duration_value(v, true, path, error, &t->hold_ms);
        } else if (streq(key, "lane")) {
                r = get_string(v, path, error, &text);
                if (r < 0)
                        return r;
                if (!strv_contains_n(s->lanes, s->n_lanes, text))
                        return scenario_error(error, "%s: unknown lane \"%s\"", path, text);
                free(t->lane);
                t->lane = strdup(text);
                if (!t->lane)
                        return -ENOMEM;
        } else if (streq(key, "slots")) {
                if (!json_is_integer(v))
                        return scenario_error(error, "%s: expected an integer, got %s", path, json_kind(v));
                json_int_t n = json_integer_value(v);
                if (n < 1 || n > 1000000)
                        return scenario_error(error, "%s: invalid slot count %" JSON_INTEGER_FORMAT, path, n);
                t->slots = (unsigned) n;
        } else if (streq(key, "labels")) {
                t->labels = strv_free(t->labels);
                r = get_labels(v, true, path, error, &t->labels);
        } else if (streq(key, "member")) {
                t->member = mfree(t->member);
                r = get_member_name(v, path, error, &t->member);
        } else if (streq(key, "exit")) {
                /* As `slotctl run` reports its command's exit status with the release (SPEC §3.6). */
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 255)
                        return scenario_error(error, "%s: expected an exit status, an integer from 0 to 255", path);
                t->exits = true;
                t->exit_status = (int) json_integer_value(v);
        } else if (streq(key, "wait")) {
                if (!json_is_boolean(v))
                        return scenario_error(error, "%s: expected a boolean, got %s", path, json_kind(v));
                t->no_wait = !json_is_true(v);
        } else if (streq(key, "max-wait")) {
                uint64_t ms;
                r = parse_duration_value(v, false, path, error, &ms);
                if (r < 0)
                        return r;
                if (ms < 1 || ms > MAX_WAIT_MS_MAX)
                        return scenario_error(error, "%s: out of range (1ms to %" PRIu64 "ms)", path, MAX_WAIT_MS_MAX);
                t->max_wait = ms * USEC_PER_MSEC;
        } else
                return 0;

        return r < 0 ? r : 1;
}

static int traffic_init(Scenario *s, ScenarioTraffic *t, const char *origin) {
        *t = (ScenarioTraffic) {
                .slots = 1,
                .hold_ms = SIM_FOREVER,
                .max_wait = USEC_INFINITY,
        };
        t->origin = strdup(origin);
        if (!t->origin)
                return -ENOMEM;
        /* With one lane, naming it is optional. */
        if (s->n_lanes == 1) {
                t->lane = strdup(s->lanes[0]);
                if (!t->lane)
                        return -ENOMEM;
        }
        return 0;
}

static int parse_arrivals(Scenario *s, const json_t *arrivals, char **error) {
        size_t i;
        json_t *phase;
        int r;

        if (!json_is_array(arrivals))
                return scenario_error(error, "%s: arrivals: expected an array, got %s", s->origin, json_kind(arrivals));

        json_array_foreach(arrivals, i, phase) {
                _cleanup_(traffic_done) ScenarioTraffic t = {};
                _cleanup_free_ char *origin = NULL;
                const char *rate = NULL, *duration = NULL, *key;
                bool have_hold = false;
                json_t *v;

                if (asprintf(&origin, "%s: arrivals[%zu]", s->origin, i) < 0)
                        return -ENOMEM;
                if (!json_is_object(phase))
                        return scenario_error(error, "%s: expected an object, got %s", origin, json_kind(phase));
                r = traffic_init(s, &t, origin);
                if (r < 0)
                        return r;

                json_object_foreach(phase, key, v) {
                        _cleanup_free_ char *path = NULL;
                        if (asprintf(&path, "%s.%s", origin, key) < 0)
                                return -ENOMEM;

                        if (streq(key, "rate")) {
                                r = get_string(v, path, error, &rate);
                                if (r < 0)
                                        return r;
                                Rate dummy;
                                if (parse_rate(rate, &dummy) < 0)
                                        return scenario_error(error, "%s: invalid rate \"%s\"", path, rate);
                                continue;
                        }
                        if (streq(key, "for")) {
                                uint64_t ms;
                                r = parse_duration_value(v, false, path, error, &ms);
                                if (r < 0)
                                        return r;
                                if (ms == 0)
                                        return scenario_error(error, "%s: invalid duration \"%s\": must be positive", path,
                                                              json_string_value(v));
                                duration = json_string_value(v);
                                continue;
                        }
                        r = parse_traffic_key(s, &t, key, v, path, error);
                        if (r < 0)
                                return r;
                        if (r == 0)
                                return scenario_error(error, "%s: unknown key", path);
                        if (streq(key, "hold"))
                                have_hold = true;
                }
                if (!rate)
                        return scenario_error(error, "%s.rate: missing", origin);
                if (!duration)
                        return scenario_error(error, "%s.for: missing", origin);
                if (!have_hold)
                        return scenario_error(error, "%s.hold: missing", origin);

                r = add_phase(s, rate, duration, &t, origin, error);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int parse_requests(Scenario *s, const json_t *requests, char **error) {
        size_t i;
        json_t *req;
        int r;

        if (!json_is_array(requests))
                return scenario_error(error, "%s: requests: expected an array, got %s", s->origin, json_kind(requests));
        _cleanup_(json_decrefp) json_t *names = json_object(); /* the names so far, as a set */
        if (!names)
                return -ENOMEM;
        if (json_array_size(requests) > 0) {
                ScenarioRequest *all = reallocarray(s->requests, s->n_requests + json_array_size(requests),
                                                    sizeof(ScenarioRequest));
                if (!all)
                        return -ENOMEM;
                s->requests = all;
        }

        json_array_foreach(requests, i, req) {
                _cleanup_(traffic_done) ScenarioTraffic t = {};
                _cleanup_free_ char *origin = NULL, *name = NULL;
                uint64_t at = SIM_FOREVER, cancel = SIM_FOREVER;
                bool have_hold = false;
                const char *key;
                json_t *v;

                if (asprintf(&origin, "%s: requests[%zu]", s->origin, i) < 0)
                        return -ENOMEM;
                if (!json_is_object(req))
                        return scenario_error(error, "%s: expected an object, got %s", origin, json_kind(req));
                r = traffic_init(s, &t, origin);
                if (r < 0)
                        return r;

                json_object_foreach(req, key, v) {
                        _cleanup_free_ char *path = NULL;
                        if (asprintf(&path, "%s.%s", origin, key) < 0)
                                return -ENOMEM;

                        if (streq(key, "name")) {
                                if (!json_is_string(v) || !name_is_valid(json_string_value(v), json_string_length(v)))
                                        return scenario_error(error, "%s: expected a name (a string without blanks)",
                                                              path);
                                /* Numbers name the generated requests; an explicit "7" would be ambiguous. */
                                if (strspn(json_string_value(v), "0123456789") == json_string_length(v))
                                        return scenario_error(error, "%s: \"%s\" is a number, which names a generated request",
                                                              path, json_string_value(v));
                                /* A hash set: checking each name against all before it took 29 s for 80,000 requests. */
                                if (json_object_get(names, json_string_value(v)))
                                        return scenario_error(error, "%s: duplicate name \"%s\"", path,
                                                              json_string_value(v));
                                if (json_object_set_new(names, json_string_value(v), json_true()) < 0)
                                        return -ENOMEM;
                                free(name);
                                name = strdup(json_string_value(v));
                                if (!name)
                                        return -ENOMEM;
                                continue;
                        }
                        if (streq(key, "at")) {
                                r = parse_duration_value(v, false, path, error, &at);
                                if (r < 0)
                                        return r;
                                continue;
                        }
                        if (streq(key, "cancel")) {
                                r = parse_duration_value(v, false, path, error, &cancel);
                                if (r < 0)
                                        return r;
                                if (cancel == 0)
                                        return scenario_error(error, "%s: out of range (1ms to " SIM_SPAN_MAX_TEXT ")",
                                                              path);
                                continue;
                        }
                        r = parse_traffic_key(s, &t, key, v, path, error);
                        if (r < 0)
                                return r;
                        if (r == 0)
                                return scenario_error(error, "%s: unknown key", path);
                        if (streq(key, "hold"))
                                have_hold = true;
                }
                if (!name)
                        return scenario_error(error, "%s.name: missing", origin);
                if (at == SIM_FOREVER)
                        return scenario_error(error, "%s.at: missing", origin);
                if (!have_hold)
                        return scenario_error(error, "%s.hold: missing", origin);

                s->requests[s->n_requests++] = (ScenarioRequest) {
                        .name = TAKE_PTR(name),
                        .at_ms = at,
                        .cancel_ms = cancel,
                        .traffic = t,
                };
                t = (ScenarioTraffic) {};
        }
        return 0;
}

/* A reason as slotctl drain --reason and slotctl reserve --reason take it: one printable line of 1 to 1024 bytes. */
static int get_reason(const json_t *v, const char *path, char **error, char **ret) {
        const char *text;
        int r = get_string(v, path, error, &text);
        if (r < 0)
                return r;
        for (const unsigned char *c = (const unsigned char *) text; *c; c++)
                if (*c < 0x20 || *c == 0x7f)
                        return scenario_error(error, "%s: contains a control character", path);
        if (strlen(text) > 1024)
                return scenario_error(error, "%s: longer than 1024 bytes", path);
        return strdup_or_null(text, ret);
}

/* The keys a drain and a reservation share, as slotctl drain and slotctl reserve take them: "at", "pool",
 * "member", "reason". Returns 1 if `key` was one of them. */
static int parse_action_key(const Scenario *s, const char *key, const json_t *v, const char *path, char **error,
                            uint64_t *at_ms, char **pool, char **member, char **reason) {
        int r;

        if (streq(key, "at"))
                r = parse_duration_value(v, false, path, error, at_ms);
        else if (streq(key, "pool"))
                r = get_pool_name(s, v, path, error, pool);
        else if (streq(key, "member"))
                r = get_member_name(v, path, error, member);
        else if (streq(key, "reason"))
                r = get_reason(v, path, error, reason);
        else
                return 0;

        return r < 0 ? r : 1;
}

/* drains: [{"at", "pool", "member", "reason", "until"} or {"at", "pool", "member", "undrain": true}]; with
 * `quarantines`, the scenario's quarantines: [{"at", "pool", "member", "reason"} or {"at", "pool", "member",
 * "restore": true}], as `slotctl quarantine` and `restore` take them. The member is checked against the pool's
 * members= by scenario_build_config(), which has the configuration. */
static int parse_drains(Scenario *s, const json_t *drains, bool quarantines, char **error) {
        const char *name = quarantines ? "quarantines" : "drains", *undrain = quarantines ? "restore" : "undrain";
        ScenarioDrain **list = quarantines ? &s->quarantines : &s->drains;
        size_t *n = quarantines ? &s->n_quarantines : &s->n_drains, i;
        json_t *d;
        int r;

        if (!json_is_array(drains))
                return scenario_error(error, "%s: %s: expected an array, got %s", s->origin, name, json_kind(drains));
        if (json_array_size(drains) > 0) {
                ScenarioDrain *all = reallocarray(*list, *n + json_array_size(drains), sizeof(ScenarioDrain));
                if (!all)
                        return -ENOMEM;
                *list = all;
        }

        json_array_foreach(drains, i, d) {
                ScenarioDrain x = { .at_ms = SIM_FOREVER, .until_ms = SIM_FOREVER };
                const char *key;
                json_t *v;

                if (asprintf(&x.origin, "%s: %s[%zu]", s->origin, name, i) < 0)
                        return -ENOMEM;
                /* Owned by the scenario from here: freed with it whatever follows. */
                (*list)[(*n)++] = x;
                ScenarioDrain *e = &(*list)[*n - 1];
                if (!json_is_object(d))
                        return scenario_error(error, "%s: expected an object, got %s", e->origin, json_kind(d));

                json_object_foreach(d, key, v) {
                        _cleanup_free_ char *path = NULL;
                        if (asprintf(&path, "%s.%s", e->origin, key) < 0)
                                return -ENOMEM;

                        if (streq(key, "until") && !quarantines) {
                                r = parse_duration_value(v, false, path, error, &e->until_ms);
                                if (r < 0)
                                        return r;
                        } else if (streq(key, undrain)) {
                                if (!json_is_boolean(v))
                                        return scenario_error(error, "%s: expected a boolean, got %s", path, json_kind(v));
                                e->undrain = json_is_true(v);
                        } else {
                                r = parse_action_key(s, key, v, path, error, &e->at_ms, &e->pool, &e->member,
                                                     &e->reason);
                                if (r < 0)
                                        return r;
                                if (r == 0)
                                        return scenario_error(error, "%s: unknown key", path);
                        }
                }
                if (e->at_ms == SIM_FOREVER)
                        return scenario_error(error, "%s.at: missing", e->origin);
                if (!e->pool)
                        return scenario_error(error, "%s.pool: missing", e->origin);
                if (quarantines && !e->member)
                        return scenario_error(error, "%s.member: missing", e->origin);
                if (e->undrain && (e->reason || e->until_ms != SIM_FOREVER))
                        return scenario_error(error, "%s: %s", e->origin,
                                              quarantines ? "a restore takes no reason" : "an undrain takes no reason or until");
                if (e->until_ms != SIM_FOREVER && e->until_ms <= e->at_ms)
                        return scenario_error(error, "%s.until: not after its at (a drain until the past)", e->origin);
        }
        return 0;
}

/* reservations: [{"at", "pool", "member" or "labels", "for", "reason"}], as `slotctl reserve` takes them. The
 * member and labels are checked against the pool's members by scenario_build_config(). */
static int parse_reservations(Scenario *s, const json_t *list, char **error) {
        size_t i;
        json_t *d;
        int r;

        if (!json_is_array(list))
                return scenario_error(error, "%s: reservations: expected an array, got %s", s->origin, json_kind(list));
        if (json_array_size(list) > 0) {
                ScenarioReservation *all = reallocarray(s->reservations, s->n_reservations + json_array_size(list),
                                                        sizeof(ScenarioReservation));
                if (!all)
                        return -ENOMEM;
                s->reservations = all;
        }

        json_array_foreach(list, i, d) {
                ScenarioReservation x = { .at_ms = SIM_FOREVER };
                const char *key;
                json_t *v;

                if (asprintf(&x.origin, "%s: reservations[%zu]", s->origin, i) < 0)
                        return -ENOMEM;
                /* Owned by the scenario from here: freed with it whatever follows. */
                s->reservations[s->n_reservations++] = x;
                ScenarioReservation *e = &s->reservations[s->n_reservations - 1];
                if (!json_is_object(d))
                        return scenario_error(error, "%s: expected an object, got %s", e->origin, json_kind(d));

                json_object_foreach(d, key, v) {
                        _cleanup_free_ char *path = NULL;
                        if (asprintf(&path, "%s.%s", e->origin, key) < 0)
                                return -ENOMEM;

                        if (streq(key, "for")) {
                                r = parse_duration_value(v, false, path, error, &e->for_ms);
                                if (r < 0)
                                        return r;
                                if (e->for_ms == 0)
                                        return scenario_error(error, "%s: out of range (1ms to " SIM_SPAN_MAX_TEXT ")", path);
                        } else if (streq(key, "labels")) {
                                r = get_labels(v, false, path, error, &e->labels);
                                if (r < 0)
                                        return r;
                        } else {
                                r = parse_action_key(s, key, v, path, error, &e->at_ms, &e->pool, &e->member,
                                                     &e->reason);
                                if (r < 0)
                                        return r;
                                if (r == 0)
                                        return scenario_error(error, "%s: unknown key", path);
                        }
                }
                if (e->at_ms == SIM_FOREVER)
                        return scenario_error(error, "%s.at: missing", e->origin);
                if (!e->pool)
                        return scenario_error(error, "%s.pool: missing", e->origin);
                if (e->for_ms == 0)
                        return scenario_error(error, "%s.for: missing", e->origin);
                if (!e->reason)
                        return scenario_error(error, "%s.reason: missing", e->origin);
                if (!e->reason[0])
                        return scenario_error(error, "%s.reason: empty", e->origin);
                if (e->member && e->labels)
                        return scenario_error(error, "%s: a member or labels, not both", e->origin);
        }
        return 0;
}

/* One reload's pools or lanes (kind "pool" or "lane"): NAME: {KEY: VALUE…} changes keys of one there, adds one
 * not there (new, or removed before: it comes back with its keys, these on top), NAME: null removes one. */
static int parse_reload_sections(Scenario *s, const char *prefix, size_t reload, const char *kind, const json_t *v,
                                 const char *path, char **error) {
        bool pools = streq(kind, "pool");
        const char *name;
        json_t *section;
        int r;

        if (!json_is_object(v))
                return scenario_error(error, "%s: expected an object, got %s", path, json_kind(v));
        json_object_foreach((json_t *) v, name, section) {
                _cleanup_free_ char *id = NULL, *where = NULL;
                bool known = pools ? scenario_pool_name(s, name) != NULL : strv_contains_n(s->lanes, s->n_lanes, name);

                if (asprintf(&id, "%s %s", kind, name) < 0 || asprintf(&where, "%s.%s", path, name) < 0)
                        return -ENOMEM;
                bool there = known && section_present(s, id, reload - 1);
                if (json_is_null(section)) {
                        if (!there)
                                return scenario_error(error, "%s: no %s \"%s\" to remove", where, kind, name);
                        r = presence_add(s, id, reload, false);
                        if (r < 0)
                                return r;
                        continue;
                }
                if (!conf_name_is_valid(name))
                        return scenario_error(error, "%s: invalid %s name (expected 1 to %d characters from A-Z a-z 0-9 . _ -)",
                                              where, kind, CONF_NAME_MAX);
                if (!known) {
                        r = pools ? scenario_add_pool(s, name, where) : scenario_add_lane(s, name, where);
                        if (r < 0)
                                return r;
                }
                if (!there) {
                        r = presence_add(s, id, reload, true);
                        if (r < 0)
                                return r;
                }
                r = parse_section(s, prefix, reload, kind, name, section, pools ? pool_keys : lane_keys,
                                  pools ? ELEMENTSOF(pool_keys) : ELEMENTSOF(lane_keys), error);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* reloads: [{"at", "pools": {NAME: {KEY: VALUE…} or null}, "lanes": {…}}], in time order: brokerd reloading its
 * configuration (SPEC §4) with these keys changed in the scenario's pools and lanes, pools and lanes added
 * (a name not there) and removed (null). The pools of a reload before its lanes, which may name them. */
static int parse_reloads(Scenario *s, const json_t *list, char **error) {
        size_t i;
        json_t *d;
        int r;

        if (!json_is_array(list))
                return scenario_error(error, "%s: reloads: expected an array, got %s", s->origin, json_kind(list));
        if (json_array_size(list) > 0) {
                uint64_t *all = reallocarray(s->reloads, s->n_reloads + json_array_size(list), sizeof(uint64_t));
                if (!all)
                        return -ENOMEM;
                s->reloads = all;
        }

        json_array_foreach(list, i, d) {
                _cleanup_free_ char *origin = NULL, *prefix = NULL;
                uint64_t at = SIM_FOREVER;
                const char *key;
                json_t *v;

                if (asprintf(&origin, "%s: reloads[%zu]", s->origin, i) < 0 || asprintf(&prefix, "reloads[%zu].", i) < 0)
                        return -ENOMEM;
                if (!json_is_object(d))
                        return scenario_error(error, "%s: expected an object, got %s", origin, json_kind(d));
                size_t reload = s->n_reloads + 1;
                json_object_foreach(d, key, v) {
                        _cleanup_free_ char *path = NULL;
                        if (asprintf(&path, "%s.%s", origin, key) < 0)
                                return -ENOMEM;
                        if (streq(key, "at")) {
                                r = parse_duration_value(v, false, path, error, &at);
                                if (r < 0)
                                        return r;
                        } else if (!streq(key, "pools") && !streq(key, "lanes"))
                                return scenario_error(error, "%s: unknown key", path);
                }
                for (unsigned k = 0; k < 2; k++) {
                        const char *kind = k == 0 ? "pool" : "lane";
                        _cleanup_free_ char *path = NULL;
                        v = json_object_get(d, k == 0 ? "pools" : "lanes");
                        if (!v)
                                continue;
                        if (asprintf(&path, "%s.%ss", origin, kind) < 0)
                                return -ENOMEM;
                        r = parse_reload_sections(s, prefix, reload, kind, v, path, error);
                        if (r < 0)
                                return r;
                }
                if (at == SIM_FOREVER)
                        return scenario_error(error, "%s.at: missing", origin);
                if (s->n_reloads > 0 && at < s->reloads[s->n_reloads - 1])
                        return scenario_error(error, "%s.at: before the reload before it (reloads come in time order)",
                                              origin);
                s->reloads[s->n_reloads++] = at;
        }
        return 0;
}

static int scenario_parse_json(Scenario *s, const json_t *root, char **error) {
        static const char *const top_keys[] = { "pools", "pool", "lanes", "deadline", "arrivals", "requests", "drains",
                                                "reservations", "quarantines", "reloads" };
        const char *key;
        json_t *v;
        int r;

        if (!json_is_object(root))
                return scenario_error(error, "%s: expected an object at the top, got %s", s->origin, json_kind(root));
        json_object_foreach((json_t *) root, key, v) {
                bool known = false;
                for (size_t i = 0; i < ELEMENTSOF(top_keys); i++)
                        known = known || streq(top_keys[i], key);
                if (!known)
                        return scenario_error(error, "%s: %s: unknown key", s->origin, key);
        }

        /* Pools before lanes before traffic, whatever the order in the file: each refers to the one before. */
        r = parse_pools(s, json_object_get(root, "pools"), json_object_get(root, "pool"), error);
        if (r < 0)
                return r;
        r = parse_lanes(s, json_object_get(root, "lanes"), error);
        if (r < 0)
                return r;

        /* After the lanes (a reload names them), before the traffic (which may name the pools and lanes a
         * reload adds). */
        v = json_object_get(root, "reloads");
        if (v) {
                r = parse_reloads(s, v, error);
                if (r < 0)
                        return r;
        }

        v = json_object_get(root, "deadline");
        if (v) {
                _cleanup_free_ char *path = NULL;
                if (asprintf(&path, "%s: deadline", s->origin) < 0)
                        return -ENOMEM;
                r = parse_duration_value(v, true, path, error, &s->deadline_ms);
                if (r < 0)
                        return r;
        }

        v = json_object_get(root, "arrivals");
        if (v) {
                r = parse_arrivals(s, v, error);
                if (r < 0)
                        return r;
        }
        v = json_object_get(root, "requests");
        if (v) {
                r = parse_requests(s, v, error);
                if (r < 0)
                        return r;
        }
        v = json_object_get(root, "drains");
        if (v) {
                r = parse_drains(s, v, false, error);
                if (r < 0)
                        return r;
        }
        v = json_object_get(root, "reservations");
        if (v) {
                r = parse_reservations(s, v, error);
                if (r < 0)
                        return r;
        }
        v = json_object_get(root, "quarantines");
        if (v) {
                r = parse_drains(s, v, true, error);
                if (r < 0)
                        return r;
        }

        return scenario_finish(s, error);
}

static int scenario_load(json_t *root, const json_error_t *jerr, const char *origin, char **error, Scenario **ret) {
        _cleanup_(scenario_freep) Scenario *s = NULL;
        int r;

        if (!root) {
                if (jerr->line > 0)
                        return scenario_error(error, "%s:%d:%d: invalid JSON: %s", origin, jerr->line, jerr->column,
                                              jerr->text);
                return scenario_error(error, "%s: %s", origin, jerr->text);
        }

        r = scenario_new(origin, &s);
        if (r < 0)
                return r;
        r = scenario_parse_json(s, root, error);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(s);
        return 0;
}

int scenario_load_file(const char *path, char **error, Scenario **ret) {
        json_error_t jerr;

        assert_return(path && error && ret, -EINVAL);

        /* json_load_file() reads a directory as an empty file: "invalid JSON … near end of file". */
        FILE *f = fopen(path, "re");
        if (!f)
                return scenario_error(error, "%s: %s", path, strerror(errno));
        struct stat st;
        int e = fstat(fileno(f), &st) < 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : 0;
        if (e != 0) {
                fclose(f);
                return scenario_error(error, "%s: %s", path, strerror(e));
        }

        json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
        fclose(f);
        int r = scenario_load(root, &jerr, path, error, ret);
        json_decref(root);
        return r;
}

int scenario_load_string(const char *text, const char *origin, char **error, Scenario **ret) {
        json_error_t jerr;

        assert_return(text && origin && error && ret, -EINVAL);

        json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
        int r = scenario_load(root, &jerr, origin, error, ret);
        json_decref(root);
        return r;
}

/* ---- walking the arrivals ---- */

static void cursor_settle(ArrivalCursor *c) {
        const Scenario *s = c->scenario;

        while (c->phase < s->n_phases && c->i >= s->phases[c->phase].count) {
                c->phase++;
                c->i = 0;
        }
        if (c->phase < s->n_phases) {
                const ArrivalPhase *p = &s->phases[c->phase];
                c->next_gen_ms = p->start_ms + arrival_phase_offset_ms(p->rate, c->i);
        } else
                c->next_gen_ms = SIM_FOREVER;
}

void arrival_cursor_init(ArrivalCursor *c, const Scenario *s) {
        assert(s->finished);
        *c = (ArrivalCursor) {
                .scenario = s,
        };
        cursor_settle(c);
}

static uint64_t cursor_next_request_ms(const ArrivalCursor *c) {
        const Scenario *s = c->scenario;
        return c->request < s->n_requests ? s->requests[s->request_order[c->request]].at_ms : SIM_FOREVER;
}

uint64_t arrival_cursor_peek(const ArrivalCursor *c) {
        return MIN(c->next_gen_ms, cursor_next_request_ms(c));
}

bool arrival_cursor_next(ArrivalCursor *c, Arrival *ret) {
        const Scenario *s = c->scenario;
        uint64_t req_ms = cursor_next_request_ms(c);

        if (c->next_gen_ms == SIM_FOREVER && req_ms == SIM_FOREVER)
                return false;

        /* Generated arrivals go before explicit requests of the same instant (SPEC §3.3). */
        if (c->next_gen_ms <= req_ms) {
                const ArrivalPhase *p = &s->phases[c->phase];
                *ret = (Arrival) {
                        .at_ms = c->next_gen_ms,
                        .id = p->first + c->i,
                        .traffic = &p->traffic,
                };
                c->i++;
                cursor_settle(c);
                return true;
        }

        size_t k = s->request_order[c->request++];
        *ret = (Arrival) {
                .at_ms = req_ms,
                .id = s->n_generated + k,
                .traffic = &s->requests[k].traffic,
        };
        return true;
}
