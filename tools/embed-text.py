#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# embed-text.py — turns text files into a C source defining
#   const char SYMBOL[] = { …the files' bytes, one after the other…, 0 };
# byte for byte: GetInterfaceDescription serves exactly the io.slotbroker.varlink that is shipped, and
# Redis runs exactly brokerd/lua/prelude.lua followed by an operation's file (one script, no rule written
# twice). Bytes rather than a string literal: nothing in a file needs escaping, and nothing can be mangled.
#
# usage: embed-text.py [--include HEADER] OUTPUT.c SYMBOL INPUT...
import sys

def main():
    args = sys.argv[1:]
    include = None
    if args[:1] == ['--include']:
        include, args = args[1], args[2:]
    if len(args) < 3:
        sys.exit('usage: embed-text.py [--include HEADER] OUTPUT.c SYMBOL INPUT...')
    dst, symbol, sources = args[0], args[1], args[2:]
    data = b''
    for src in sources:
        with open(src, 'rb') as f:
            text = f.read()
        if b'\0' in text:
            sys.exit(f'{src}: contains a NUL byte')
        text.decode('utf-8')  # a Varlink description travels in a JSON string, a script as a Redis string
        data += text
    names = ' + '.join(s.rsplit('/', 1)[-1] for s in sources)
    lines = ['/* Generated from %s by embed-text.py: do not edit. */' % names]
    if include:
        lines.append('#include "%s"' % include)
    lines += ['', 'const char %s[] = {' % symbol]
    for i in range(0, len(data), 12):
        lines.append('        ' + ' '.join('0x%02x,' % b for b in data[i:i + 12]))
    lines.append('        0x00,')
    lines.append('};')
    with open(dst, 'w') as f:
        f.write('\n'.join(lines) + '\n')

main()
