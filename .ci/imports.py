#!/usr/bin/env python3
"""The engine's import graph, read off the `use` lines (and `crate::` / `super::` paths) of
src/: prints every import circle and the engine modules that import the worker, and fails
(exit 1) when a circle inside src/engine/ is larger than MAX_CIRCLE files or a module other
than the worker's own imports `engine::worker` (ARCHITECTURE.md, "Layout"). Run by .ci/test.

    python3 .ci/imports.py [src] [engine] [-v]
"""
import os, re, sys
MAX_CIRCLE = 3
args = [a for a in sys.argv[1:] if not a.startswith('-')]
root = args[0] if args else 'src'
scope = args[1] if len(args) > 1 else 'engine'
mods = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if not f.endswith('.rs'): continue
        p = os.path.join(d, f)
        rel = os.path.relpath(p, root)[:-3].split(os.sep)
        if rel[-1] in ('mod', 'lib', 'main'): rel = rel[:-1]
        mods['::'.join(rel)] = p
def strip_tests(t):
    # drop #[cfg(test)] mod tests { ... } blocks (to end of file, conventionally last)
    i = t.find('#[cfg(test)]\nmod tests')
    return t if i < 0 else t[:i]
def resolve(cur, path):
    parts = path.split('::')
    if parts[0] == 'crate': base = []; parts = parts[1:]
    elif parts[0] in ('super', 'self'):
        base = cur.split('::') if cur else []
        # file module: self = cur; super = parent
        while parts and parts[0] in ('super', 'self'):
            if parts[0] == 'super': base = base[:-1]
            parts = parts[1:]
    else: return None
    best = None
    for k in range(len(parts), -1, -1):
        m = '::'.join(base + parts[:k])
        if m in mods: best = m; break
    return best
edges = {m: set() for m in mods}
pat = re.compile(r'\b((?:crate|super|self)(?:::\w+)+)')
usegrp = re.compile(r'use\s+((?:crate|super|self)(?:::\w+)*)::\{([^;]*)\};', re.S)
for m, p in mods.items():
    t = strip_tests(open(p).read())
    t = re.sub(r'//[^\n]*', '', t)
    paths = set(pat.findall(t))
    for g in usegrp.finditer(t):
        pre = g.group(1)
        for item in re.split(r',', g.group(2)):
            item = item.strip().split(' as ')[0].strip()
            item = re.sub(r'\{.*', '', item).rstrip(':')
            if item: paths.add(pre + '::' + item)
            # nested groups
        for sub in re.finditer(r'(\w+(?:::\w+)*)::\{', g.group(2)):
            paths.add(pre + '::' + sub.group(1))
    for path in paths:
        r = resolve(m, path)
        if r is not None and r != m and not m.startswith(r + '::') :
            edges[m].add(r)
sel = [m for m in mods if m == scope or m.startswith(scope + '::')]
# Tarjan
idx = {}; low = {}; st = []; on = set(); out = []; c = [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in sel: continue
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        out.append(comp)
for v in sel:
    if v not in idx: sc(v)
big = sorted([x for x in out if len(x) > 1], key=len, reverse=True)
for comp in big: print(len(comp), sorted(comp))
print('largest circle:', max((len(x) for x in out), default=0))
w = [m for m in sel if not m.startswith(scope + '::worker') and any(e.startswith(scope + '::worker') for e in edges[m])]
print('engine modules importing worker:', sorted(w))
if '-v' in sys.argv:
    for comp in big:
        for a in sorted(comp):
            print(' ', a, '->', sorted(e for e in edges[a] if e in comp))
largest = max((len(x) for x in out), default=0)
if largest > MAX_CIRCLE or w:
    print(f'imports: FAILED (largest circle {largest}, at most {MAX_CIRCLE}; worker importers {sorted(w)})')
    sys.exit(1)
print('imports: ok')
