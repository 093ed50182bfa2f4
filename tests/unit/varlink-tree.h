/* SPDX-License-Identifier: MIT */
/* varlink-tree.h — the Varlink envelope's rules read from a message parsed as a tree (json_parse_object()):
 * the reference that libbroker's readers, which never build the envelope (varlink_call_message_parse(),
 * varlink_reply_message_parse()), are checked against, message by message, in test-varlink and the Varlink
 * fuzz target. Written the plain way on purpose: a second reading of the same rules. */
#pragma once

#include <jansson.h>

#include "varlink.h"

/* Reads a call: "method" mandatory; "parameters" an object (absent or null: an empty object is added to
 * msg); "more", "oneway", "upgrade" booleans (null: false); other keys only as vendor extensions
 * ("org.example.key", containing a dot). Returns 0; -EBADMSG for anything else, including more together
 * with oneway and a method name the grammar refuses; -ENOMEM. *ret untouched on failure. */
int tree_call_parse(json_t *msg, VarlinkCall *ret);

/* Reads a reply: "parameters" (absent or null: an empty object is added), "continues", "error" (a
 * qualified name, or null; an error is always final). Other keys as for calls. Returns 0, -EBADMSG,
 * -ENOMEM. */
int tree_reply_parse(json_t *msg, VarlinkReply *ret);
