/* Temporary: until brokerd/history.c lands. */
#include <errno.h>
#include "history.h"
void history_append(History *h, const AuditRecord *r, usec_t realtime) {
}
int history_query(History *h, const HistoryQuery *q, HistoryQueryFn done, void *userdata) {
        return -EOPNOTSUPP;
}
void history_cancel(History *h, void *userdata) {
}
void history_get_stats(const History *h, HistoryStats *ret) {
        *ret = (HistoryStats) {};
}
int history_lease_commit(History *h, const HistoryLeaseRow *row, HistoryDoneFn done, void *userdata) {
        return -EOPNOTSUPP;
}
void history_lease_delete(History *h, const char *id) {
}
int history_new(sd_event *event, const char *directory, usec_t retention, History **ret) {
        return -EOPNOTSUPP;
}
History *history_free(History *h) {
        return NULL;
}
int history_load_leases(History *h, HistoryLeaseRow **ret, size_t *ret_n) {
        return -EOPNOTSUPP;
}
int history_load_token_floors(History *h, HistoryTokenFloor **ret, size_t *ret_n) {
        return -EOPNOTSUPP;
}
void history_lease_row_done(HistoryLeaseRow *row) {
}
