#!/usr/bin/env python3
"""The layout's rules, checked on the build (issue 18):

1. No two modules depend on each other in a circle: each object file of
   the library and of the command is a module; a module depends on another
   when it uses a symbol the other defines (nm).  Any strongly connected
   set of more than one module fails, with the edges that close it.
2. The command is a client of idem.h: no file under cli/ includes an
   internal header of the library (src/), except the developer tools
   under cli/bench/.

    modules_test.py SOURCE_DIR OBJECT...
"""
import collections
import os
import re
import subprocess
import sys


def symbols(obj, defined):
    args = ["nm", "--defined-only" if defined else "--undefined-only", obj]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    names = []
    for line in out.splitlines():
        parts = line.split()
        if defined and len(parts) == 3 and parts[1] in "TDBRC":
            names.append(parts[2])
        elif not defined and parts:
            names.append(parts[-1])
    return names


def module(obj):
    # .../CMakeFiles/idem_obj.dir/src/store/pg.c.o -> src/store/pg.c
    return obj.split(".dir/", 1)[-1][:-2]


def circles(objs):
    owner = {}
    for o in objs:
        for s in symbols(o, True):
            owner[s] = module(o)
    edges = collections.defaultdict(set)
    for o in objs:
        for s in symbols(o, False):
            if s in owner and owner[s] != module(o):
                edges[module(o)].add(owner[s])
    # Tarjan's strongly connected components, iteratively
    index, low, on, stack, found = {}, {}, set(), [], []
    counter = [0]
    for root in sorted({module(o) for o in objs}):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
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
                        found.append((sorted(comp), edges))
    return found


def internal_includes(src):
    bad = []
    internal = {f for f in os.listdir(os.path.join(src, "src")) if f.endswith(".h")}
    for dirpath, _, files in os.walk(os.path.join(src, "cli")):
        rel = os.path.relpath(dirpath, src)
        if rel == os.path.join("cli", "bench"):
            continue  # the developer tools may
        for f in files:
            if not f.endswith((".c", ".h")):
                continue
            text = open(os.path.join(dirpath, f), encoding="utf-8").read()
            for m in re.finditer(r'#include\s+"([^"]+)"', text):
                if os.path.basename(m.group(1)) in internal:
                    bad.append("%s/%s includes %s" % (rel, f, m.group(1)))
    return bad


def main():
    src, objs = sys.argv[1], sys.argv[2:]
    if len(objs) < 10:
        print("too few object files given (%d)" % len(objs))
        return 1
    fails = 0
    for comp, edges in circles(objs):
        fails += 1
        print("circle: " + ", ".join(comp))
        for a in comp:
            for b in sorted(edges[a]):
                if b in comp:
                    print("  %s -> %s" % (a, b))
    for line in internal_includes(src):
        fails += 1
        print(line)
    print("%d modules, %d problems" % (len({module(o) for o in objs}), fails))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
