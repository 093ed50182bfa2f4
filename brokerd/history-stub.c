/* Temporary: history_append() until brokerd/history.c lands. */
#include "history.h"
void history_append(History *h, const AuditRecord *r, usec_t realtime) {
}
