#!/usr/bin/env python3
"""Extract the C examples of Loom's man pages and README.md for
tests/man/test_examples.sh.

Usage: examples.py SRCDIR OUTDIR

Every literal block (.Bd -literal ... .Ed) of man/man3 and man/man7 that
looks like C (a call of a loom_* function, or a line ending in ';'), and
every ```c block of README.md, must say how it is checked, in comment
lines just above it:

  .\\" example: program [run N [EXPECT]]
      a whole program: compiled, linked with libloom and, with "run N",
      run on N ranks under loomrun; EXPECT (quoted) must be in its output.
  .\\" example: fragment
  .\\" cc: DECLARATIONS
      a piece of a function: compiled (not linked) as the body of a
      function returning loom_result_t, after loom.h, the C library
      headers and the DECLARATIONS of the cc: lines (what the fragment
      uses without declaring).  Lines up to a '}' in column 0 (function
      definitions) and #include lines go before the function.
  .\\" example: declaration
      a copy of a type of loom.h: its members must be those of loom.h.
  .\\" example: skip REASON
      not checked, and the test says why.

In README.md the same words go in an HTML comment: <!-- example: ... -->.

Writes OUTDIR/NNN.c and one line per example to OUTDIR/manifest, fields
separated by tabs: kind, where (page:line), file, then for programs the
ranks to run and the expected text, for skips and failures the reason
("-" for an empty field).
Pages being rewritten elsewhere are listed in SKIP_PAGES.
"""
import glob
import os
import re
import sys

# Pages whose examples are not checked, with the reason.
SKIP_PAGES = {}

LOOKS_LIKE_C = re.compile(r"loom_\w+\s*\(|;\s*$", re.M)
PRELUDE = """#define _POSIX_C_SOURCE 200809L
#include <loom.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
"""


def unroff(line):
    """The text of a line of a literal block: \\e is a backslash, \\& is
    nothing; any other escape is reported."""
    out, i = [], 0
    while i < len(line):
        c = line[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = line[i + 1:i + 2]
        if nxt == "e":
            out.append("\\")
        elif nxt == "&":
            pass
        elif nxt == "-":
            out.append("-")
        else:
            raise ValueError("escape \\%s not understood" % nxt)
        i += 2
    return "".join(out)


def man_blocks(path):
    """(line, directives, text) of every literal block of a page."""
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].startswith(".Bd -literal"):
            start = i
            j = i + 1
            while j < len(lines) and not lines[j].startswith(".Ed"):
                j += 1
            dirs = []
            k = start - 1
            while k >= 0 and lines[k].startswith('.\\"'):
                dirs.insert(0, lines[k][3:].strip())
                k -= 1
            yield start + 1, dirs, [unroff(x) for x in lines[start + 1:j]]
            i = j
        i += 1


def readme_blocks(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```c":
            start = i
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            dirs = []
            k = start - 1
            while k >= 0 and lines[k].startswith("<!--"):
                dirs.insert(0, lines[k].strip()[4:-3].strip())
                k -= 1
            yield start + 1, dirs, lines[start + 1:j], True
            i = j
        i += 1


def members(text):
    """The member declarations of the first { ... } of text, normalised."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    a = text.index("{")
    depth, b = 0, a
    for b in range(a, len(text)):
        if text[b] == "{":
            depth += 1
        elif text[b] == "}":
            depth -= 1
            if depth == 0:
                break
    body = text[a + 1:b]
    out = []
    for m in body.split(";"):
        m = re.sub(r"\s+", " ", m).strip()
        m = re.sub(r"\s*([*(),])\s*", r"\1", m)
        if m:
            out.append(m)
    return out


def header_type(header, first_line):
    """The definition in loom.h that starts like first_line."""
    key = re.sub(r"\s+", " ", first_line.strip())
    m = re.search(re.escape(key).replace("\\ ", r"\s+") + r".*?\n\}[^;]*;", header, re.S)
    return m.group(0) if m else None


def main():
    src, out = sys.argv[1], sys.argv[2]
    header = open(os.path.join(src, "include", "loom.h"), encoding="utf-8").read()
    pages = sorted(glob.glob(os.path.join(src, "man", "man3", "*.3")) +
                   glob.glob(os.path.join(src, "man", "man7", "*.7")))
    todo = []  # (where, dirs, lines, is_c)
    for p in pages:
        name = os.path.basename(p)
        for line, dirs, text in man_blocks(p):
            is_c = bool(LOOKS_LIKE_C.search("\n".join(text)))
            todo.append(("%s:%d" % (name, line), name, dirs, text, is_c))
    for line, dirs, text, is_c in readme_blocks(os.path.join(src, "README.md")):
        todo.append(("README.md:%d" % line, "README.md", dirs, text, is_c))

    manifest = []
    n = 0
    for where, page, dirs, text, is_c in todo:
        kind_dirs = [d for d in dirs if d.startswith("example:")]
        cc = [d[3:].strip() for d in dirs if d.startswith("cc:")]
        if page in SKIP_PAGES:
            if is_c:
                manifest.append(("skip", where, "", SKIP_PAGES[page]))
            continue
        if not kind_dirs:
            if is_c:
                manifest.append(("missing", where, "",
                                 "a C example that does not say how to check it (an "
                                 "'example:' line above it: see tests/man/examples.py)"))
            continue
        words = kind_dirs[-1][len("example:"):].split(None, 1)
        kind = words[0] if words else ""
        rest = words[1] if len(words) > 1 else ""
        n += 1
        f = os.path.join(out, "%03d.c" % n)
        body = "\n".join(text) + "\n"
        if kind == "program":
            with open(f, "w") as o:
                o.write("/* %s */\n" % where + body)
            m = re.match(r'run\s+(\d+)(?:\s+"(.*)")?\s*$', rest)
            manifest.append(("program", where, f, m.group(1) if m else "",
                             m.group(2) or "" if m else ""))
        elif kind == "fragment":
            # Function definitions open with "{" alone in column 0 (the
            # fragments' own blocks open at the end of a line): they and
            # what comes before them go before the function.
            outer, inner = [], []
            last, opened = -1, False
            for i, l in enumerate(text):
                if l.rstrip() == "{":
                    opened = True
                elif opened and l.startswith("}"):
                    last, opened = i, False
            for i, l in enumerate(text):
                if i <= last or l.startswith("#include"):
                    outer.append(l)
                else:
                    inner.append(l)
            with open(f, "w") as o:
                o.write("/* %s */\n" % where + PRELUDE + "\n".join(outer) + "\n")
                o.write("\n".join(cc) + "\n")
                o.write("loom_result_t loom_example(void);\n"
                        "loom_result_t loom_example(void)\n{\n")
                o.write("\n".join(inner) + "\nreturn LOOM_SUCCESS;\n}\n")
            manifest.append(("fragment", where, f))
        elif kind == "declaration":
            want = header_type(header, text[0])
            if want is None:
                manifest.append(("bad", where, "", "no type in loom.h starts with '%s'" %
                                 text[0].strip()))
            elif members(body) != members(want):
                manifest.append(("bad", where, "", "members differ from loom.h's: page %s, "
                                 "loom.h %s" % (members(body), members(want))))
            else:
                manifest.append(("declaration", where, ""))
        elif kind == "skip":
            manifest.append(("skip", where, "", rest or "no reason given"))
        else:
            manifest.append(("bad", where, "", "unknown example kind '%s'" % kind))
    with open(os.path.join(out, "manifest"), "w") as o:
        for m in manifest:
            # No empty fields: the shell's read would merge the tabs.
            o.write("\t".join(x or "-" for x in m) + "\n")


if __name__ == "__main__":
    main()
