#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Every configuration key that libbroker/conf.c accepts is documented in brokerd.conf(5), in its section.

The key tables (broker_keys, pool_keys, lane_keys: `{ "name", setter, … }`) are read from the source; the
man page must have a `*name=*` entry under "# [broker] SECTION", "# [pool NAME] SECTION" or "# [lane NAME]
SECTION" respectively. A key added to the code without its documentation fails here.

Usage: check-man-keys.py CONF_C BROKERD_CONF_5_SCD
"""
import re
import sys

TABLES = {"broker_keys": "# [broker] SECTION", "pool_keys": "# [pool NAME] SECTION",
          "lane_keys": "# [lane NAME] SECTION"}


def key_tables(source):
    tables = {}
    for name in TABLES:
        m = re.search(r"static const ConfKey " + name + r"\[\] = \{(.*?)\n\};", source, re.S)
        if not m:
            sys.exit(f"{name}[] not found in the source")
        tables[name] = re.findall(r'^\s*\{ "([a-z-]+)",', m.group(1), re.M)
    return tables


def sections(page):
    """The text of each top-level section (# TITLE) of an scdoc page, by title."""
    out, title = {}, None
    for line in page.splitlines():
        if line.startswith("# "):
            title = line
            out[title] = []
        elif title:
            out[title].append(line)
    return {t: "\n".join(lines) for t, lines in out.items()}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        tables = key_tables(f.read())
    with open(sys.argv[2]) as f:
        page = sections(f.read())
    missing = []
    for table, keys in tables.items():
        if not keys:
            sys.exit(f"{table}[] has no keys: the pattern no longer matches the source")
        text = page.get(TABLES[table], "")
        for key in keys:
            # An entry is a line of its own, not indented: "*key=*VALUE", or several keys on one line.
            if not any(line.startswith("*") and f"*{key}=*" in line for line in text.splitlines()):
                missing.append(f"{key} ({TABLES[table][2:]})")
    for m in missing:
        print(f"not documented in brokerd.conf(5): {m}")
    print(f"{sum(len(k) for k in tables.values())} keys checked, {len(missing)} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
