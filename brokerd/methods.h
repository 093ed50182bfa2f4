/* SPDX-License-Identifier: MIT */
/* methods.h — the Varlink interfaces brokerd serves: org.varlink.service and io.slotbroker, bound to each
 * client connection as its call and disconnect handlers (userdata: its Session). */
#pragma once

#include "connection.h"
#include "varlink.h"

/* Answers (or starts answering) one call, or defers it behind the session's open Acquire. Unknown methods
 * get the standard Varlink errors. */
ConnectionCallResult methods_on_call(Connection *c, const VarlinkCall *call, void *userdata);
/* The connection went: a History reply being produced stops, then the session ends. */
void methods_on_disconnect(Connection *c, void *userdata);
