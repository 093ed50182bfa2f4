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
