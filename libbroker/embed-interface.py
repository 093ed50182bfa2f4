#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# embed-interface.py — turns a Varlink interface definition into a C source defining
#   const char NAME[] = { …the file's bytes…, 0 };
# byte for byte, so that GetInterfaceDescription serves exactly the file that is shipped.
# Bytes rather than a string literal: nothing in the file needs escaping, and nothing can be mangled.
import sys

def main():
    if len(sys.argv) != 4:
        sys.exit('usage: embed-interface.py INPUT.varlink OUTPUT.c SYMBOL')
    src, dst, symbol = sys.argv[1:]
    with open(src, 'rb') as f:
        data = f.read()
    if b'\0' in data:
        sys.exit(f'{src}: contains a NUL byte')
    data.decode('utf-8')  # the description travels in a JSON string: it must be UTF-8
    lines = [
        '/* Generated from %s by embed-interface.py: do not edit. */' % src.rsplit('/', 1)[-1],
        '#include "varlink.h"',
        '',
        'const char %s[] = {' % symbol,
    ]
    for i in range(0, len(data), 12):
        lines.append('        ' + ' '.join('0x%02x,' % b for b in data[i:i + 12]))
    lines.append('        0x00,')
    lines.append('};')
    with open(dst, 'w') as f:
        f.write('\n'.join(lines) + '\n')

main()
