#!/usr/bin/env python3
"""Check that the library's dependencies run one way, up the LAYERS file.

usage: layers.py --src SRCDIR --build BUILDDIR [--layers FILE] [--list]

LAYERS (default SRCDIR/LAYERS) names the layers bottom first.  Each line
that is not blank or a comment ('#') is either

    NAME: PREFIX...          a layer: the files whose paths (relative to
                             SRCDIR) begin with one of the prefixes
    known FROM -> TO         an upward use not yet removed (FROM and TO
                             are files); each is reported, and one that no
                             longer occurs is an error, so the list only
                             shrinks

A file may use what its own layer and the layers below it define.  Two
kinds of use are read:

  symbols   every object file of the build: each global symbol it leaves
            undefined (nm) is looked up among those the other objects
            define, and charged to the two source files;
  includes  every #include "..." of a source or header file of a layer,
            resolved as the compiler does here (the file's folder, then
            include/, src/ and SRCDIR).

Each upward use is printed as
    UP  FROM -> TO  (LAYER -> LAYER): NAMES
Exit status: 0 when every upward use is a known one and every known one
occurs, 1 otherwise, 2 when the check could not run (no LAYERS, no nm,
no object files).  --list prints the layers and their files.
"""
import os
import re
import subprocess
import sys


def fail_usage(msg):
    sys.stderr.write("layers.py: %s\n" % msg)
    sys.exit(2)


def read_layers(path):
    layers, known = [], set()
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as e:
        fail_usage("cannot read %s: %s" % (path, e.strerror))
    for no, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("known "):
            parts = line[6:].split("->")
            if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
                fail_usage("%s:%d: 'known FROM -> TO' expected" % (path, no))
            known.add((parts[0].strip(), parts[1].strip()))
            continue
        name, sep, rest = line.partition(":")
        prefixes = rest.split()
        if not sep or not name.strip() or not prefixes:
            fail_usage("%s:%d: 'NAME: PREFIX...' expected" % (path, no))
        layers.append((name.strip(), prefixes))
    if not layers:
        fail_usage("%s names no layer" % path)
    return layers, known


def layer_index(rel, layers):
    """The layer of a file: the longest prefix that matches wins."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            if (rel == p or rel.startswith(p.rstrip("/") + "/")) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def object_files(build, src):
    """(source file relative to src, object path) for the build's objects.

    libtool leaves a PIC copy under .libs/ and automake may prefix an
    object with its target's name ("libfoo_la-bar.o"); the source is
    the .c of the same stem in the matching source folder."""
    out = []
    for root, dirs, files in os.walk(build):
        dirs[:] = [d for d in dirs if d != ".libs" and not d.startswith("_")]
        rel_dir = os.path.relpath(root, build)
        for f in files:
            if not f.endswith(".o"):
                continue
            stem = f[:-2]
            cands = [stem] + ([stem.split("-", 1)[1]] if "-" in stem else [])
            for c in cands:
                rel = os.path.normpath(os.path.join(rel_dir, c + ".c"))
                if os.path.isfile(os.path.join(src, rel)):
                    out.append((rel, os.path.join(root, f)))
                    break
    return out


def nm_symbols(path):
    """(defined globals, undefined) of one object file."""
    try:
        res = subprocess.run(["nm", "-P", path], capture_output=True, text=True, check=False)
    except OSError:
        fail_usage("cannot run nm")
    defined, undefined = set(), set()
    for line in res.stdout.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        name, kind = f[0], f[1]
        if kind == "U":
            undefined.add(name)
        elif kind.isupper() or kind == "i":
            defined.add(name)
    return defined, undefined


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def includes(src, rel):
    try:
        text = open(os.path.join(src, rel), encoding="utf-8", errors="replace").read()
    except OSError:
        return []
    out = []
    for name in INCLUDE.findall(text):
        for base in (os.path.dirname(rel), "include", "src", ""):
            cand = os.path.normpath(os.path.join(base, name))
            if os.path.isfile(os.path.join(src, cand)):
                out.append((cand, name))
                break
    return out


def main(argv):
    args = {"--src": None, "--build": None, "--layers": None}
    listing = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        if a == "--list":
            listing = True
        elif a in args and i + 1 < len(argv):
            args[a] = argv[i + 1]
            i += 1
        else:
            fail_usage("bad argument %r (--help)" % a)
        i += 1
    if not args["--src"] or not args["--build"]:
        fail_usage("--src and --build are needed (--help)")
    src = os.path.abspath(args["--src"])
    build = os.path.abspath(args["--build"])
    layers, known = read_layers(args["--layers"] or os.path.join(src, "LAYERS"))

    sources = []
    for top in sorted({p.split("/")[0] for _, ps in layers for p in ps}):
        for root, _, files in os.walk(os.path.join(src, top)):
            for f in files:
                if f.endswith((".c", ".h")):
                    rel = os.path.relpath(os.path.join(root, f), src)
                    if layer_index(rel, layers) is not None:
                        sources.append(rel)
    sources.sort()
    if listing:
        for i, (name, _) in enumerate(layers):
            files = [s for s in sources if layer_index(s, layers) == i]
            print("%d %s (%d files): %s" % (i, name, len(files), " ".join(files)))
        return 0

    objs = [(rel, o) for rel, o in object_files(build, src) if layer_index(rel, layers) is not None]
    if not objs:
        fail_usage("no object file of a layer under %s (build first)" % build)
    definer, wanted = {}, {}
    for rel, o in objs:
        d, u = nm_symbols(o)
        for s in d:
            definer.setdefault(s, rel)
        wanted.setdefault(rel, set()).update(u)

    ups = {}  # (from, to) -> set of names

    def use(frm, to, what):
        a, b = layer_index(frm, layers), layer_index(to, layers)
        if a is not None and b is not None and b > a:
            ups.setdefault((frm, to), set()).add(what)

    for rel, names in wanted.items():
        for s in names:
            if s in definer and definer[s] != rel:
                use(rel, definer[s], s)
    for rel in sources:
        for target, name in includes(src, rel):
            use(rel, target, '#include "%s"' % name)

    unknown = 0
    for (frm, to) in sorted(ups):
        names = sorted(ups[(frm, to)])
        shown = ", ".join(names[:6]) + (" ... (%d in all)" % len(names) if len(names) > 6 else "")
        tag = "known" if (frm, to) in known else "UP"
        unknown += tag == "UP"
        print("%-5s %s -> %s  (%s -> %s): %s" % (
            tag, frm, to, layers[layer_index(frm, layers)][0],
            layers[layer_index(to, layers)][0], shown))
    gone = sorted(known - set(ups))
    for frm, to in gone:
        print("GONE  %s -> %s: listed as known in LAYERS, no longer used: remove the line"
              % (frm, to))
    print("layers: %d layers, %d object files, %d sources; %d upward uses between pairs of "
          "files: %d known, %d new; %d known ones gone"
          % (len(layers), len(objs), len(sources), len(ups), len(ups) - unknown, unknown,
             len(gone)))
    return 1 if unknown or gone else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
