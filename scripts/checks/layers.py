"""The workspace's layout, held as code: which crate may use which, which
folder of the engine may import which, no import circle between files, and
the sizes a newcomer can read (files, folders, crates).

Run as `scripts/check-layers` (no arguments: the repository it sits in) or
`python3 scripts/checks/layers.py ROOT`. Prints each breach and exits 1 when
there is one. Standard library only (Python 3.11 or later, for `tomllib`),
so CI runs it before anything is installed.

Imports are read from the source text: every `use` statement (braces
expanded) and every `crate::`/`super::`/`self::` path in the code, outside
`#[cfg(test)]` modules. A path is resolved to the file of the module it
names, following `pub use` re-exports to the file that defines the item, so
`use crate::Engine` points at the file where `Engine` is written, not at
lib.rs.
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

# Which workspace crates each crate may depend on (normal dependencies).
# A crate not listed here may use any; a `flotilla-*` dependency not in a
# listed crate's set is a breach, and so is an arrow pointing back up.
ALLOWED_CRATES: dict[str, set[str]] = {
    "contracts": set(),
    "codec": {"contracts", "runtime"},
    "runtime": set(),
    "store": {"contracts"},
    "workflow": set(),
    "targets": {"workflow", "runtime"},
    "engine": {"workflow", "targets", "store", "contracts", "runtime"},
    "ingest": {"engine", "codec", "store", "contracts", "runtime"},
    "api": {"engine", "workflow", "contracts", "runtime"},
    "worker": {"api", "ingest", "engine", "targets", "workflow", "store", "codec", "contracts", "runtime"},
    "relay": {"store", "codec", "contracts", "runtime"},
    # The engine under recorded answers: it may drive the engine and read
    # the rows and events it wrote, nothing that touches Kafka or HTTP.
    "rehearsal": {"engine", "targets", "workflow", "store", "contracts"},
}

# External crates a crate must never depend on: the definition language
# does no IO.
FORBIDDEN_EXTERNAL: dict[str, set[str]] = {
    "workflow": {"tokio", "sqlx", "rdkafka", "reqwest", "hyper", "axum"},
}

# Inside the engine crate: folders (first path segment under src/) that may
# not import one another. Executors of step kinds and the operations callers
# ask for are two doors onto the run; `support` is used by all and uses none.
FORBIDDEN_FOLDER_IMPORTS: dict[str, dict[str, set[str]]] = {
    "engine": {
        "nodes": {"ops", "services"},
        "ops": {"nodes", "services"},
        "support": {"run", "nodes", "ops", "services"},
        "run": {"ops", "services"},
    },
}

MAX_FILE_LINES = 600
MAX_FILES_PER_FOLDER = 15
MAX_CRATE_SHARE = 0.30


@dataclass
class Module:
    crate: str
    path: tuple[str, ...]  # module path from the crate root
    file: Path
    text: str  # source outside #[cfg(test)] modules
    reexports: dict[str, tuple[str, ...]] = field(default_factory=dict)
    children: set[str] = field(default_factory=set)


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def without_tests(text: str) -> str:
    """The source above its first `#[cfg(test)]` module."""
    match = re.search(r"^#\[cfg\(test\)\]\s*\n\s*(pub(\([a-z]+\))?\s+)?mod\s", text, flags=re.M)
    return text[: match.start()] if match else text


def expand(tree: str) -> list[str]:
    """`a::{b, c::{d, e}}` as `a::b`, `a::c::d`, `a::c::e`."""
    tree = re.sub(r"\s+", "", tree)
    brace = tree.find("{")
    if brace < 0:
        return [tree] if tree else []
    prefix, rest = tree[:brace], tree[brace + 1 :]
    depth, start, parts = 0, 0, []
    for i, c in enumerate(rest):
        if c == "{":
            depth += 1
        elif c == "}":
            if depth == 0:
                parts.append(rest[start:i])
                break
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(rest[start:i])
            start = i + 1
    out = []
    for part in parts:
        for leaf in expand(part):
            out.append(prefix + leaf)
    return out


USE = re.compile(r"^\s*(pub(\([a-z]+\))?\s+)?use\s+([^;]+);", re.M)
INLINE = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
CHILD = re.compile(r"^\s*(pub(\([a-z]+\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*;", re.M)


def module_path(src: Path, file: Path) -> tuple[str, ...]:
    rel = file.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def absolute(segments: list[str], here: tuple[str, ...], children: set[str]) -> tuple[str, ...] | None:
    """A path as written in module `here`, from the crate root; None when
    it names another crate (or std)."""
    if not segments:
        return None
    head = segments[0]
    if head == "crate":
        return tuple(segments[1:])
    if head in ("super", "self"):
        base = list(here)
        while segments and segments[0] in ("super", "self"):
            if segments[0] == "super":
                if not base:
                    return None
                base.pop()
            segments = segments[1:]
        return tuple(base + segments)
    if head in children:
        return tuple(here) + tuple(segments)
    return None


class Crate:
    def __init__(self, name: str, src: Path):
        self.name = name
        self.src = src
        self.modules: dict[tuple[str, ...], Module] = {}
        for file in sorted(src.rglob("*.rs")):
            if file.name == "tests.rs" or "bin" in file.relative_to(src).parts:
                continue
            text = without_tests(strip_comments(file.read_text()))
            path = module_path(src, file)
            if file.name == "main.rs" and (src / "lib.rs").exists():
                continue
            self.modules[path] = Module(name, path, file, text)
        for module in self.modules.values():
            module.children = {m.group(3) for m in CHILD.finditer(module.text)}
        for module in self.modules.values():
            for m in USE.finditer(module.text):
                if not m.group(1):
                    continue
                for leaf in expand(m.group(3)):
                    leaf = re.sub(r"\s+as\s+\w+$", "", leaf)
                    segments = leaf.split("::")
                    target = absolute(segments, module.path, module.children)
                    if target and segments[-1] not in ("*", "self"):
                        module.reexports[segments[-1]] = target

    def file_of(self, path: tuple[str, ...], seen: int = 0) -> Path | None:
        """The file defining what `path` names: the deepest module on it,
        through re-exports."""
        for cut in range(len(path), -1, -1):
            module = self.modules.get(path[:cut])
            if module is None:
                continue
            rest = path[cut:]
            if rest and rest[0] in module.reexports and seen < 8:
                return self.file_of(module.reexports[rest[0]] + rest[1:], seen + 1) or module.file
            return module.file
        return None

    def is_descendant(self, file: Path, ancestor: tuple[str, ...]) -> bool:
        path = module_path(self.src, file)
        return len(path) > len(ancestor) and path[: len(ancestor)] == ancestor

    def imports(self) -> dict[Path, set[Path]]:
        graph: dict[Path, set[Path]] = {}
        for module in self.modules.values():
            edges: set[Path] = set()
            private_uses = [m.group(3) for m in USE.finditer(module.text) if not m.group(1)]
            body = USE.sub("", module.text)
            paths = [leaf for tree in private_uses for leaf in expand(tree)]
            paths += [m.group(1) for m in INLINE.finditer(body)]
            for child in module.children:
                paths += [m.group(0) for m in re.finditer(rf"(?<![\w:]){child}(?:::[A-Za-z_]\w*)+", body)]
            for leaf in paths:
                leaf = re.sub(r"\s+as\s+\w+$", "", leaf)
                segments = [s for s in leaf.split("::") if s not in ("*",)]
                target = absolute(segments, module.path, module.children)
                if target is None:
                    continue
                file = self.file_of(target)
                if file is None or file == module.file:
                    continue
                # A module made of its children uses them: composition,
                # not an import. Children naming their parent, and
                # siblings naming each other, are imports.
                if self.is_descendant(file, module.path):
                    continue
                edges.add(file)
            graph[module.file] = edges
        return graph


def cycles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """Strongly connected components of more than one file (Tarjan)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    found: list[list[Path]] = []
    counter = [0]

    def visit(v: Path) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def workspace_crates(root: Path) -> dict[str, Path]:
    """Crate directory name → its directory, for every workspace member."""
    members = tomllib.loads((root / "Cargo.toml").read_text())["workspace"]["members"]
    return {Path(m).name if "/" not in m else m: root / m for m in members}


def check(root: Path) -> list[str]:
    breaches: list[str] = []
    crates = workspace_crates(root)
    lines_per_crate: dict[str, int] = {}
    for name, directory in crates.items():
        if not (directory / "Cargo.toml").exists():
            breaches.append(f"{name}: a workspace member without a Cargo.toml")
            continue
        manifest = tomllib.loads((directory / "Cargo.toml").read_text())
        deps = set(manifest.get("dependencies", {}))
        internal = {d.removeprefix("flotilla-") for d in deps if d.startswith("flotilla-")}
        if name in ALLOWED_CRATES:
            for dep in sorted(internal - ALLOWED_CRATES[name]):
                breaches.append(f"{name}/Cargo.toml: depends on flotilla-{dep}, which it may not use")
        for dep in sorted(deps & FORBIDDEN_EXTERNAL.get(name, set())):
            breaches.append(f"{name}/Cargo.toml: depends on {dep}: this crate does no IO")

        src = directory / "src"
        if not src.is_dir():
            continue
        files = sorted(src.rglob("*.rs"))
        lines_per_crate[name] = 0
        for file in files:
            count = len(file.read_text().splitlines())
            lines_per_crate[name] += count
            if count > MAX_FILE_LINES:
                breaches.append(f"{file.relative_to(root)}: {count} lines, over {MAX_FILE_LINES}")
        folders: dict[Path, int] = {}
        for file in files:
            folders[file.parent] = folders.get(file.parent, 0) + 1
        for folder, count in sorted(folders.items()):
            if count > MAX_FILES_PER_FOLDER:
                breaches.append(f"{folder.relative_to(root)}: {count} source files, over {MAX_FILES_PER_FOLDER}")

        crate = Crate(name, src)
        graph = crate.imports()
        for component in cycles(graph):
            shown = ", ".join(str(f.relative_to(root)) for f in component)
            breaches.append(f"import circle: {shown}")
        for folder, forbidden in FORBIDDEN_FOLDER_IMPORTS.get(name, {}).items():
            for file, edges in sorted(graph.items()):
                rel = file.relative_to(src).parts
                if rel[0] != folder:
                    continue
                for target in sorted(edges):
                    into = target.relative_to(src).parts[0]
                    if into in forbidden:
                        breaches.append(
                            f"{file.relative_to(root)}: imports {target.relative_to(root)} ({folder}/ never uses {into}/)"
                        )

    total = sum(lines_per_crate.values())
    for name, count in sorted(lines_per_crate.items()):
        if total and count / total > MAX_CRATE_SHARE:
            breaches.append(f"{name}: {count} of {total} lines under src/ ({count / total:.0%}), over {MAX_CRATE_SHARE:.0%}")
    return breaches


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[2]
    breaches = check(root)
    for breach in breaches:
        print(f"check-layers: {breach}")
    if breaches:
        print(f"check-layers: {len(breaches)} breaches (see docs/architecture.md, 'Where things go')")
        return 1
    print("check-layers: crates, folders, imports and sizes hold")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
