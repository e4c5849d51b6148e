#!/usr/bin/env python3
"""Renders docs/configuration.md into the body of postspool.conf(5).

The man page is generated from the Markdown reference at build time, so that
the two cannot disagree: usage: configuration_to_scd.py HEADER.scd.in
configuration.md OUT.scd. HEADER holds the hand-written sections (NAME,
SYNOPSIS, FILES, SEE ALSO) and a line @REFERENCE@ where the reference goes.

Markdown handled: '#'/'##' headings, paragraphs, '- ' lists, tables of
key | default | meaning (and any other three-column table), `code` (bold),
*emphasis* (kept), [text](link) (the text). Nothing else is in the file.
"""
import re
import sys


def inline(text):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    # `code` becomes bold; a literal '*' inside it is escaped for scdoc.
    text = re.sub(r"`([^`]*)`", lambda m: "*" + m.group(1).replace("*", "\\*") + "*", text)
    return text


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def render(markdown):
    out = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("# "):  # the document title: the man page has its own
            i += 1
            continue
        if line.startswith("## "):
            out += ["", "# " + line[3:].strip().upper(), ""]
            i += 1
            continue
        if line.startswith("|"):
            header = cells(line)
            i += 2  # the header and the |---| line
            while i < len(lines) and lines[i].startswith("|"):
                row = cells(lines[i])
                if header[:2] == ["key", "default"] or header[:2] == ["what", "value"] \
                        or header[:2] == ["metric", "type"]:
                    term = inline(row[0])
                    out += [term + " (" + header[1] + ": " + inline(row[1]) + ")"]
                    out += (["\t" + inline(row[2]), ""] if row[2] else [""])
                else:
                    out += ["- " + " / ".join(inline(c) for c in row), ""]
                i += 1
            continue
        out.append(inline(line))
        i += 1
    return "\n".join(out)


def main():
    header_path, markdown_path, out_path = sys.argv[1:4]
    with open(header_path, encoding="utf-8") as f:
        header = f.read()
    with open(markdown_path, encoding="utf-8") as f:
        body = render(f.read())
    if "@REFERENCE@" not in header:
        sys.exit(header_path + ": no @REFERENCE@ line")
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(header.replace("@REFERENCE@", body.strip("\n")))


if __name__ == "__main__":
    main()
