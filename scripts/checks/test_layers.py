"""Tests of the layout check on small workspaces written for each case:
each rule must fail on the layout it forbids and pass the one it allows.
Run by scripts/check-layers before the check itself (standard library
only)."""

import shutil
import tempfile
import textwrap
import unittest
from pathlib import Path

import layers


def check(root):
    """The breaches of `root`, but for the share of each crate (a workspace
    of one or two crates is all share)."""
    return [b for b in layers.check(root) if "lines under src/" not in b]


CREATED = []


def tearDownModule():
    for root in CREATED:
        shutil.rmtree(root, ignore_errors=True)


def workspace(files):
    """A workspace from {path: text}; Cargo.toml members from the crates given."""
    root = Path(tempfile.mkdtemp(prefix="layers-test."))
    CREATED.append(root)
    crates = sorted({path.split("/")[0] for path in files if path.endswith(".rs")})
    (root / "Cargo.toml").write_text(
        "[workspace]\nmembers = [" + ", ".join(f'"{c}"' for c in crates) + "]\n")
    for crate in crates:
        manifest = files.get(f"{crate}/Cargo.toml", f'[package]\nname = "flotilla-{crate}"\n')
        (root / crate).mkdir(exist_ok=True)
        (root / crate / "Cargo.toml").write_text(manifest)
    for path, text in files.items():
        if path.endswith(".rs"):
            file = root / path
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(textwrap.dedent(text))
    return root


class CircleTest(unittest.TestCase):
    def test_two_siblings_naming_each_other_are_a_circle(self):
        root = workspace({
            "engine/src/lib.rs": "mod a;\nmod b;\n",
            "engine/src/a.rs": "use crate::b::B;\npub struct A;\n",
            "engine/src/b.rs": "use crate::a::A;\npub struct B;\n",
        })
        breaches = check(root)
        self.assertTrue(any("import circle" in b and "a.rs" in b and "b.rs" in b for b in breaches), breaches)

    def test_a_circle_through_a_grouped_super_import_is_found(self):
        root = workspace({
            "engine/src/lib.rs": "mod run;\n",
            "engine/src/run/mod.rs": "mod x;\nmod y;\n",
            "engine/src/run/x.rs": "use super::{y::Y, X2};\npub struct X;\npub struct X2;\n",
            "engine/src/run/y.rs": "pub struct Y;\nfn f() { let _ = super::x::X; }\n",
        })
        self.assertTrue(any("import circle" in b for b in check(root)))

    def test_a_parent_made_of_its_children_is_no_circle(self):
        root = workspace({
            "engine/src/lib.rs": "mod a;\npub use a::A;\npub struct Hub { a: a::A }\n",
            "engine/src/a.rs": "use crate::Hub;\npub struct A;\nimpl A { fn f(_: &Hub) {} }\n",
        })
        self.assertEqual(check(root), [])

    def test_a_re_export_is_followed_to_the_file_that_defines_the_item(self):
        # c uses the root's re-export of B; b uses c: a circle b -> c -> b.
        root = workspace({
            "engine/src/lib.rs": "mod b;\nmod c;\npub use b::B;\n",
            "engine/src/b.rs": "use crate::c::C;\npub struct B;\n",
            "engine/src/c.rs": "use crate::B;\npub struct C;\n",
        })
        self.assertTrue(any("import circle" in b for b in check(root)))

    def test_test_modules_do_not_count(self):
        root = workspace({
            "engine/src/lib.rs": "mod a;\nmod b;\n",
            "engine/src/a.rs": "pub struct A;\n#[cfg(test)]\nmod tests {\n    use crate::b::B;\n}\n",
            "engine/src/b.rs": "use crate::a::A;\npub struct B;\n",
        })
        self.assertEqual(check(root), [])


class FolderTest(unittest.TestCase):
    def test_an_executor_importing_an_operation_is_refused(self):
        root = workspace({
            "engine/src/lib.rs": "mod nodes;\nmod ops;\n",
            "engine/src/nodes/mod.rs": "mod call;\n",
            "engine/src/nodes/call.rs": "use crate::ops::submit::Submission;\n",
            "engine/src/ops/mod.rs": "pub(crate) mod submit;\n",
            "engine/src/ops/submit.rs": "pub struct Submission;\n",
        })
        breaches = check(root)
        self.assertTrue(any("nodes/call.rs: imports" in b and "ops/" in b for b in breaches), breaches)

    def test_a_service_may_use_an_operation(self):
        root = workspace({
            "engine/src/lib.rs": "mod services;\nmod ops;\n",
            "engine/src/services/mod.rs": "mod sweeper;\n",
            "engine/src/services/sweeper.rs": "use crate::ops::submit::Submission;\n",
            "engine/src/ops/mod.rs": "pub(crate) mod submit;\n",
            "engine/src/ops/submit.rs": "pub struct Submission;\n",
        })
        self.assertEqual(check(root), [])


class CrateTest(unittest.TestCase):
    def test_the_api_depending_on_the_store_is_refused(self):
        root = workspace({
            "api/Cargo.toml": '[package]\nname = "flotilla-api"\n[dependencies]\nflotilla-store = "1"\n',
            "api/src/lib.rs": "",
            "store/src/lib.rs": "",
        })
        breaches = check(root)
        self.assertTrue(any("api/Cargo.toml: depends on flotilla-store" in b for b in breaches), breaches)

    def test_the_language_depending_on_tokio_is_refused(self):
        root = workspace({
            "workflow/Cargo.toml": '[package]\nname = "flotilla-workflow"\n[dependencies]\ntokio = "1"\n',
            "workflow/src/lib.rs": "",
        })
        self.assertTrue(any("does no IO" in b for b in check(root)))


class SizeTest(unittest.TestCase):
    def test_a_long_file_and_a_crowded_folder_are_named(self):
        files = {"engine/src/lib.rs": "".join(f"mod m{i};\n" for i in range(16))}
        files.update({f"engine/src/m{i}.rs": "fn f() {}\n" for i in range(15)})
        files["engine/src/m15.rs"] = "// line\n" * (layers.MAX_FILE_LINES + 1)
        breaches = check(workspace(files))
        self.assertTrue(any("m15.rs" in b and "lines" in b for b in breaches), breaches)
        self.assertTrue(any("17 source files" in b for b in breaches), breaches)


class ShareTest(unittest.TestCase):
    def test_a_crate_over_its_share_is_named(self):
        files = {f"{c}/src/lib.rs": "fn f() {}\n" for c in ("a", "b", "c")}
        files["big/src/lib.rs"] = "fn f() {}\n" * 10
        breaches = layers.check(workspace(files))
        self.assertEqual([b for b in breaches if "over 30%" in b],
                         ["big: 10 of 13 lines under src/ (77%), over 30%"])


if __name__ == "__main__":
    unittest.main()
