# SPDX-License-Identifier: GPL-3.0-or-later
"""_envblock: marked blocks keep the rest of a file byte for byte; symlinks are followed only on safe paths."""
from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _envblock

H = "# header\n"


def body(*lines):
    return "".join(line + "\n" for line in lines)


def test_new_file_gets_header_and_removal_removes_it():
    text = _envblock.replace_block(None, "a", body("X"), H)
    assert text == H + "# BEGIN gpufleet a\nX\n# END gpufleet a\n"
    assert _envblock.replace_block(text, "a", None, H) is None
    assert _envblock.replace_block(None, "a", None, H) is None


@pytest.mark.parametrize("original", [
    "",
    "# install the apport exception handler if available\ntry:\n    import apport_python_hook\nexcept ImportError:\n    pass\n",
    "a\r\nb\r\n",
    "\n\n",
])
def test_add_then_remove_restores_bytes(original):
    added = _envblock.replace_block(original, "nccl", body("X = 1"), H)
    assert added.startswith(original)
    assert _envblock.replace_block(added, "nccl", None, H) == original


def test_missing_trailing_newline_gets_one():
    added = _envblock.replace_block("x = 1", "n", body("Y"), H)
    assert added == "x = 1\n# BEGIN gpufleet n\nY\n# END gpufleet n\n"


def test_replace_in_place_keeps_surroundings_and_other_blocks():
    text = "top\n" + _envblock.replace_block("", "a", body("A1"), H) + "middle\n"
    text = _envblock.replace_block(text, "b", body("B1"), H)
    text2 = _envblock.replace_block(text, "a", body("A2", "A3"), H)
    assert text2 == "top\n# BEGIN gpufleet a\nA2\nA3\n# END gpufleet a\nmiddle\n# BEGIN gpufleet b\nB1\n# END gpufleet b\n"
    assert _envblock.replace_block(text2, "a", body("A2", "A3"), H) == text2
    assert _envblock.replace_block(text2, "a", None, H) == "top\nmiddle\n# BEGIN gpufleet b\nB1\n# END gpufleet b\n"


@pytest.mark.parametrize("text", [
    "# BEGIN gpufleet a\nX\n",
    "# END gpufleet a\n",
    "# END gpufleet a\n# BEGIN gpufleet a\n",
    "# BEGIN gpufleet a\n# END gpufleet a\n# BEGIN gpufleet a\n# END gpufleet a\n",
])
def test_damaged_blocks_are_refused(text):
    with pytest.raises(_envblock.BlockError, match="damaged block"):
        _envblock.replace_block(text, "a", body("X"), H)


@pytest.mark.parametrize("name", ["a b", "a=b", "", "x\n", "ä"])
def test_block_names_are_checked(name):
    with pytest.raises(_envblock.BlockError):
        _envblock.check_block_name(name)


def _layout(tmp_path):
    """/usr/lib/python3.X/sitecustomize.py -> /etc/python3.X/sitecustomize.py, inside tmp_path."""
    etc = tmp_path / "etc" / "python3.11"
    lib = tmp_path / "usr" / "lib" / "python3.11"
    etc.mkdir(parents=True)
    lib.mkdir(parents=True)
    (etc / "sitecustomize.py").write_text("# distro\n")
    link = lib / "sitecustomize.py"
    link.symlink_to("../../../etc/python3.11/sitecustomize.py")
    return link, etc / "sitecustomize.py"


def test_safe_symlink_resolves_to_target(tmp_path):
    link, target = _layout(tmp_path)
    real, links = _envblock.resolve_target(str(link))
    assert real == str(target) and links == [str(link)]


@pytest.mark.parametrize("which,mode", [("etc", 0o775), ("etc", 0o777), ("lib", 0o757), ("top", 0o770)])
def test_writable_directories_refuse_the_symlink(tmp_path, which, mode):
    link, target = _layout(tmp_path)
    d = {"etc": target.parent, "lib": link.parent, "top": tmp_path / "etc"}[which]
    os.chmod(d, mode)
    with pytest.raises(_envblock.BlockError, match="writable by group or others"):
        _envblock.resolve_target(str(link))


def test_sticky_world_writable_ancestor_is_accepted_but_not_as_parent(tmp_path):
    link, target = _layout(tmp_path)
    os.chmod(tmp_path / "etc", 0o1777)  # like /tmp: an ancestor of the target's directory
    assert _envblock.resolve_target(str(link))[0] == str(target)
    os.chmod(target.parent, 0o1777)  # the directory holding the file itself
    with pytest.raises(_envblock.BlockError, match="writable by group or others"):
        _envblock.resolve_target(str(link))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
@pytest.mark.parametrize("what", ["link", "target", "dir"])
def test_foreign_owner_refuses_the_symlink(tmp_path, what):
    link, target = _layout(tmp_path)
    path = {"link": link, "target": target, "dir": target.parent}[what]
    os.lchown(path, 65534, 65534)
    with pytest.raises(_envblock.BlockError, match="owned by uid 65534"):
        _envblock.resolve_target(str(link))


def test_plain_file_and_missing_file_resolve_to_themselves(tmp_path):
    f = tmp_path / "plain.py"
    f.write_text("")
    assert _envblock.resolve_target(str(f)) == (str(f), [])
    assert _envblock.resolve_target(str(tmp_path / "missing.py")) == (str(tmp_path / "missing.py"), [])


def test_dangling_safe_symlink_resolves_to_the_missing_target(tmp_path):
    link, target = _layout(tmp_path)
    target.unlink()
    assert _envblock.resolve_target(str(link)) == (str(target), [str(link)])


def test_symlink_loop_is_refused(tmp_path):
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.symlink_to(b)
    b.symlink_to(a)
    with pytest.raises(_envblock.BlockError, match="too many levels"):
        _envblock.resolve_target(str(a))


def test_blocks_only_counts_the_files_own_lines_instead_of_printing_them():
    text = ('import os\nos.environ.setdefault("HF_TOKEN", "hf_SECRET")\n'
            "# BEGIN gpufleet nccl\nos.environ['NCCL_PROTO'] = 'LL'\n# END gpufleet nccl\n"
            "x = 1\n")
    shown = _envblock.blocks_only(text)
    assert "hf_SECRET" not in shown and "x = 1" not in shown
    assert shown == ("# ... 2 lines not written by gpufleet (unchanged, not shown)\n"
                     "# BEGIN gpufleet nccl\nos.environ['NCCL_PROTO'] = 'LL'\n# END gpufleet nccl\n"
                     "# ... 1 line not written by gpufleet (unchanged, not shown)\n")
    assert _envblock.blocks_only(None) is None and _envblock.blocks_only("") == ""
