/* SPDX-License-Identifier: MIT */
/* methods.h — the Varlink interfaces brokerd serves: org.varlink.service and io.slotbroker. */
#pragma once

#include "varlink.h"

typedef struct Connection Connection;

/* Answers (or starts answering) one call. Unknown methods get the standard Varlink errors. */
void methods_dispatch(Connection *c, const VarlinkCall *call);
