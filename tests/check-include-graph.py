#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The include graph of brokerd/ has no cycle (issue 10).

X.c or X.h including "Y.h" means module X uses module Y. A file's module is the longest '-'-separated
prefix of its name for which a .c file exists (history-internal.h belongs to history, config-files.h to
config), else its name (a header-only module such as decision.h). Only headers in the directory count:
libbroker's and meson's config.h are outside it.

  check-include-graph.py DIR                   exit 1 and print the evidence if the graph has a cycle
  check-include-graph.py DIR --allow FILE      edges listed there ("a -> b  # why") are left out; an
                                               allowed edge that no longer exists is an error, so the
                                               list can only shrink
  check-include-graph.py DIR --readme FILE     also fail if FILE's map (between the include-graph
                                               markers) differs from --print's
  check-include-graph.py DIR --print           the layered map: modules by depth, leaves first (without
                                               the allowed edges)
  check-include-graph.py --self-test
"""

import argparse
import pathlib
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
MARK_BEGIN = '<!-- include-graph -->'
MARK_END = '<!-- /include-graph -->'


def module_of(stem, c_stems):
    parts = stem.split('-')
    for k in range(len(parts), 0, -1):
        prefix = '-'.join(parts[:k])
        if prefix in c_stems:
            return prefix
    return stem


def read_graph(directory):
    """{module: {module: [(file, header), ...]}} and the set of modules."""
    d = pathlib.Path(directory)
    files = sorted(list(d.glob('*.c')) + list(d.glob('*.h')))
    headers = {p.name for p in files if p.suffix == '.h'}
    c_stems = {p.stem for p in files if p.suffix == '.c'}
    modules = {module_of(p.stem, c_stems) for p in files}
    graph = {m: {} for m in modules}
    for p in files:
        src = p.read_text(errors='replace')
        a = module_of(p.stem, c_stems)
        for inc in INCLUDE.findall(src):
            if inc not in headers:
                continue
            b = module_of(inc[:-2], c_stems)
            if a != b:
                graph[a].setdefault(b, []).append((p.name, inc))
    return graph, modules


def components(graph):
    """Strongly connected components of two or more modules (Tarjan, iterative)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def read_allow(path):
    allowed = set()
    for n, line in enumerate(pathlib.Path(path).read_text().splitlines(), 1):
        line = line.split('#', 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r'([\w-]+)\s*->\s*([\w-]+)', line)
        if not m:
            raise SystemExit(f'{path}:{n}: expected "a -> b"')
        allowed.add((m.group(1), m.group(2)))
    return allowed


def layers(graph):
    """Depth of each module: 0 for a leaf, else one more than its deepest dependency (acyclic graph)."""
    depth = {}

    def visit(m):
        if m not in depth:
            depth[m] = 0
            depth[m] = 1 + max((visit(x) for x in graph[m]), default=-1)
        return depth[m]

    for m in graph:
        visit(m)
    return depth


def render_map(graph):
    depth = layers(graph)
    lines = []
    for level in range(max(depth.values(), default=-1) + 1):
        for m in sorted(x for x in graph if depth[x] == level):
            uses = ' '.join(sorted(graph[m])) or '-'
            lines.append(f'L{level}  {m:14} -> {uses}')
    return '\n'.join(lines)


def readme_map(path):
    text = pathlib.Path(path).read_text()
    if MARK_BEGIN not in text or MARK_END not in text:
        return None
    block = text.split(MARK_BEGIN, 1)[1].split(MARK_END, 1)[0]
    return '\n'.join(l for l in block.strip().splitlines() if not l.startswith('```')).strip()


def check(directory, allow=None, readme=None, out=sys.stdout):
    graph, _ = read_graph(directory)
    failed = False
    allowed = read_allow(allow) if allow else set()
    for a, b in sorted(allowed):
        if b not in graph.get(a, {}):
            print(f'stale allowance: {a} -> {b} no longer exists; delete it from {allow}', file=out)
            failed = True
    pruned = {a: {b: ev for b, ev in bs.items() if (a, b) not in allowed} for a, bs in graph.items()}
    for comp in components(pruned):
        failed = True
        print(f'include cycle among: {" ".join(comp)}', file=out)
        for a in comp:
            for b in sorted(pruned[a]):
                if b in comp:
                    ev = ', '.join(f'{f} includes {h}' for f, h in pruned[a][b])
                    print(f'  {a} -> {b}: {ev}', file=out)
    if readme and not failed:
        want = render_map(pruned)
        have = readme_map(readme)
        if have != want:
            print(f'the map in {readme} is stale: paste the output of --print between its markers:', file=out)
            print(want, file=out)
            failed = True
    return not failed


def self_test():
    import io

    def tree(files):
        d = tempfile.TemporaryDirectory()
        for name, text in files.items():
            (pathlib.Path(d.name) / name).write_text(text)
        return d

    cases = [
        ('acyclic', {'a.c': '#include "b.h"\n#include "a.h"\n', 'a.h': '', 'b.c': '#include "b.h"\n',
                     'b.h': '#include "c.h"\n', 'c.h': '', 'b-room.h': '', 'config.h': ''}, True, None),
        ('two modules', {'a.c': '#include "b.h"\n', 'a.h': '', 'b.c': '#include "a.h"\n', 'b.h': ''}, False,
         'a -> b: a.c includes b.h'),
        ('through headers', {'a.h': '#include "b.h"\n', 'b.h': '#include "c.h"\n', 'c.h': '#include "a.h"\n'},
         False, 'include cycle among: a b c'),
        ('room counts as its module', {'x.c': '', 'x-room.h': '#include "y.h"\n', 'y.c': '#include "x.h"\n',
                                       'x.h': '', 'y.h': ''}, False, 'x -> y: x-room.h includes y.h'),
        ('outside headers ignored', {'a.c': '#include "config.h"\n#include "list.h"\n', 'a.h': ''}, True, None),
    ]
    ok = True
    for name, files, want, evidence in cases:
        with tree(files) as d:
            out = io.StringIO()
            got = check(d, out=out)
            if got != want or (evidence and evidence not in out.getvalue()):
                print(f'not ok - {name}: {got} {out.getvalue()!r}')
                ok = False
            else:
                print(f'ok - {name}')
    with tree({'a.c': '#include "b.h"\n', 'b.h': '', 'allow': 'a -> c  # gone\n'}) as d:
        out = io.StringIO()
        got = check(d, allow=pathlib.Path(d) / 'allow', out=out)
        good = not got and 'stale allowance: a -> c' in out.getvalue()
        print(('ok' if good else 'not ok') + ' - stale allowance')
        ok = ok and good
    with tree({'a.c': '#include "b.h"\n', 'b.h': '', 'README.md': f'{MARK_BEGIN}\nL0 old\n{MARK_END}\n'}) as d:
        out = io.StringIO()
        got = check(d, readme=pathlib.Path(d) / 'README.md', out=out)
        good = not got and 'stale' in out.getvalue()
        print(('ok' if good else 'not ok') + ' - stale readme map')
        ok = ok and good
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('directory', nargs='?')
    ap.add_argument('--allow')
    ap.add_argument('--readme')
    ap.add_argument('--print', action='store_true')
    ap.add_argument('--self-test', action='store_true')
    a = ap.parse_args()
    if a.self_test:
        return 0 if self_test() else 1
    if not a.directory:
        ap.error('the directory is needed')
    if a.print:
        if not check(a.directory, a.allow):
            return 1
        graph, _ = read_graph(a.directory)
        allowed = read_allow(a.allow) if a.allow else set()
        print(render_map({x: {y: e for y, e in ys.items() if (x, y) not in allowed} for x, ys in graph.items()}))
        return 0
    return 0 if check(a.directory, a.allow, a.readme) else 1


if __name__ == '__main__':
    sys.exit(main())
