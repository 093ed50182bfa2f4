/* SPDX-License-Identifier: MIT */
/* client-compat.c — libbroker.so only: the LIBBROKER_1 versions of the entry points that take a
 * BrokerAcquireOptions, for programs linked before LIBBROKER_2 appended labels and member to it.
 *
 * The struct says its own size, so one function serves both layouts (options_copy() in client.c); the
 * version was raised so that a program built against the new header, which may set labels, is refused at
 * start by a libbroker.so too old to know them (and so that packages depend on a new enough one), rather
 * than refused call by call with -E2BIG. Not in the static library: slotctl links no version script. */
#include "broker.h"
#include "macro.h"

int broker_acquire_v1(BrokerClient *c, const BrokerAcquireOptions *options, BrokerLease **ret);
int broker_acquire_start_v1(BrokerClient *c, const BrokerAcquireOptions *options);

/* The .symver directive, not GCC's symver attribute: clang (the ASan/UBSan build) does not know the attribute. */
__asm__(".symver broker_acquire_v1, broker_acquire@LIBBROKER_1");
__asm__(".symver broker_acquire_start_v1, broker_acquire_start@LIBBROKER_1");

_public_ int broker_acquire_v1(BrokerClient *c, const BrokerAcquireOptions *options, BrokerLease **ret) {
        return broker_acquire(c, options, ret);
}

_public_ int broker_acquire_start_v1(BrokerClient *c, const BrokerAcquireOptions *options) {
        return broker_acquire_start(c, options);
}
