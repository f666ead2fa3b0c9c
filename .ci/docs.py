#!/usr/bin/env python3
"""Checks the Markdown of README.md and docs/ (run by .ci/test, about a second):

1. every relative link and image resolves to a file or directory of the repository;
2. every #anchor (in the same file or another .md) names a heading there, by the code
   host's rule (lower case, punctuation dropped, spaces to hyphens, -1/-2 for repeats);
3. every `delayq <verb> [<sub-verb>]` command line in a ```sh block names a verb of the
   generated CLI reference (docs/reference/cli.md, itself checked against clap by
   tests/service/reference.rs).

Usage: python3 .ci/docs.py [FILE.md ...]   (default: README.md, ARCHITECTURE.md, docs/**/*.md)
Exit 1 listing every broken link, anchor or command.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading, seen):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits, underscore (unicode)
    s = text.replace(" ", "-")
    n = seen.get(s, 0)
    seen[s] = n + 1
    return s if n == 0 else f"{s}-{n}"


def prose_lines(path):
    """(line number, text) outside fenced code blocks; and the fenced blocks' lines with
    their info string."""
    prose, code, fence, info = [], [], None, ""
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if m and fence is None:
            fence, info = m.group(1), line.strip()[3:].strip()
            continue
        if m and fence is not None and line.strip().startswith(fence):
            fence = None
            continue
        (code if fence else prose).append((i, line, info))
    return prose, code


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen, found = {}, set()
        prose, _ = prose_lines(path)
        for _, line, _ in prose:
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                found.add(slug(m.group(1), seen))
            for a in re.findall(r'<a\s+(?:name|id)="([^"]+)"', line):
                found.add(a)
        _anchors[path] = found
    return _anchors[path]


def cli_verbs():
    """Each verb of the generated CLI reference with the long options its --help lists
    (the top-level `delayq` section's, the global ones, under the key "")."""
    ref = ROOT / "docs/reference/cli.md"
    if not ref.exists():
        return None
    text = ref.read_text()
    heads = list(re.finditer(r"^## `delayq ?([^`]*)`", text, re.M))
    verbs = {}
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        verbs[m.group(1)] = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text[m.end():end]))
    return verbs


def check(path, verbs, problems):
    rel = path.relative_to(ROOT)
    prose, code = prose_lines(path)
    for no, line, _ in prose:
        # Inline code is not a link.
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                continue  # http:, https:, mailto: ...
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                problems.append(f"{rel}:{no}: {target}: no such file")
                continue
            try:
                dest.relative_to(ROOT)
            except ValueError:
                problems.append(f"{rel}:{no}: {target}: outside the repository")
                continue
            if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{rel}:{no}: {target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    if verbs is None:
        return
    for no, line, info in code:
        if info.split(",")[0] not in ("sh", "bash", "shell", "console"):
            continue
        cmd = line.strip().lstrip("$ ").strip().split()
        if not cmd or not re.fullmatch(r"(?:\./target/\w+/)?delayq", cmd[0]):
            continue
        # Global options may come first: skip "--redis-url X" style pairs.
        rest = cmd[1:]
        while rest and rest[0].startswith("--"):
            rest = rest[2:] if "=" not in rest[0] else rest[1:]
        words = [w for w in rest[:2] if re.fullmatch(r"[a-z][a-z-]*", w)]
        if not words:
            continue
        if words[0] not in verbs:
            problems.append(f"{rel}:{no}: `delayq {words[0]}`: no such verb (docs/reference/cli.md)")
            continue
        verb = words[0]
        if len(words) > 1 and any(v.startswith(words[0] + " ") for v in verbs):
            verb = f"{words[0]} {words[1]}"
            if verb not in verbs:
                problems.append(f"{rel}:{no}: `delayq {verb}`: no such sub-verb")
                continue
        # Every long option on the line is one the verb's --help (or the global one) lists.
        known = verbs[verb] | verbs.get("", set()) | {"--help", "--version"}
        for opt in cmd[1:]:
            if opt == "--" or opt in ("|", ">", "&&", ";"):
                break
            name = opt.split("=", 1)[0]
            if re.fullmatch(r"--[a-z][a-z0-9-]*", name) and name not in known:
                problems.append(f"{rel}:{no}: `delayq {verb} {name}`: no such option (docs/reference/cli.md)")


def main(argv):
    files = [pathlib.Path(a).resolve() for a in argv] or (
        [ROOT / "README.md", ROOT / "ARCHITECTURE.md"] + sorted((ROOT / "docs").rglob("*.md"))
    )
    verbs = cli_verbs()
    problems = []
    for f in files:
        check(f, verbs, problems)
    for p in problems:
        print(p)
    print(f"docs: {len(files)} files checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
