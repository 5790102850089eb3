"""Every file the project's tools write (docs/FILES_WRITTEN.md) refuses to take the place of a
file they were given to read, a directory or a device: convert.py's and gguf_from_hf.py's
outputs, compare_llamacpp.py's --raw folder and --plot, make_figures.py's --output folder.
(barellm's own, chat's /save, is in tests/test_chat_hostile.py.)"""

import os
import subprocess
import sys

import pytest

from convert_testlib import CONVERT, REPO, make_checkpoint, run
from test_cli_hostile import write_model
from test_compare_llamacpp import compare, tools  # noqa: F401 (a fixture)


GGUF_FROM_HF = os.path.join(REPO, "scripts", "gguf_from_hf.py")
MAKE_FIGURES = os.path.join(REPO, "scripts", "make_figures.py")


def snapshot(root):
    """{relative path: bytes} of every regular file under `root` (links followed), and the
    kind of everything else (reading a FIFO would block)."""
    files = {}
    for folder, folders, names in os.walk(root):
        for name in names + folders:
            path = os.path.join(folder, name)
            key = os.path.relpath(path, root)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    files[key] = f.read()
            else:
                files[key] = (os.path.islink(path), os.path.exists(path) and
                              os.stat(path).st_mode >> 12)
    return files


def special_outputs(tmp_path):
    """{path: kind}: a FIFO, a link to a device, a directory."""
    fifo, device, directory = tmp_path / "fifo", tmp_path / "null", tmp_path / "dir"
    os.mkfifo(fifo)
    device.symlink_to("/dev/null")  # a link: were it replaced, /dev/null would be safe
    directory.mkdir()
    return {fifo: "it is not a regular file", device: "it is not a regular file",
            directory: "it is a directory"}


@pytest.mark.parametrize("tool", ["convert", "gguf_from_hf"])
def test_the_converters_refuse_devices_fifos_and_directories(tmp_path, tool):
    if tool == "gguf_from_hf":
        pytest.importorskip("gguf", reason="pip package gguf missing")
    hf = make_checkpoint(tmp_path / "hf")
    for output, why in special_outputs(tmp_path).items():
        before = snapshot(tmp_path)
        result = run(CONVERT if tool == "convert" else GGUF_FROM_HF, hf, "-o", output)
        program = "convert" if tool == "convert" else "gguf_from_hf"
        assert result.returncode == 1, result.stderr
        assert result.stderr == f"{program}: cannot write output '{output}': {why}\n"
        assert snapshot(tmp_path) == before
    assert (tmp_path / "null").is_symlink() and not (tmp_path / "fifo").is_file()
    assert sorted(os.listdir(tmp_path)) == ["dir", "fifo", "hf", "null"]  # no temporary file


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json"])
def test_gguf_from_hf_refuses_an_output_that_is_an_input(tmp_path, name):
    pytest.importorskip("gguf", reason="pip package gguf missing")
    hf = make_checkpoint(tmp_path / "hf")
    link = tmp_path / "link.gguf"
    link.symlink_to(hf / name)
    before = snapshot(tmp_path)
    for output in (hf / name, link):
        result = run(GGUF_FROM_HF, hf, "-o", output)
        assert result.returncode == 1, result.stderr
        assert result.stderr == (f"gguf_from_hf: output '{output}' is the input file "
                                 f"{hf / name}\n")
    assert snapshot(tmp_path) == before


def test_compare_refuses_a_full_raw_folder_and_a_plot_over_an_input(tools, tmp_path):  # noqa: F811
    bin_dir, models = tools
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "barellm-1-t1-1.json").write_text("kept")
    result = compare(tools, "--raw", raw)
    assert result.returncode == 2, result.stderr
    assert f"--raw {raw}: not a new or empty folder" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert (raw / "barellm-1-t1-1.json").read_text() == "kept"

    png, folder = tmp_path / "plot.png", tmp_path / "folder.png"
    png.symlink_to(models[0][1])
    folder.mkdir()
    for plot in (png, folder):
        result = compare(tools, "--plot", plot)
        assert result.returncode == 2, result.stderr
        assert "not a new or regular file apart from the inputs" in result.stderr
    assert open(models[0][1]).read() == "1"

    assert compare(tools, "-t", "1", "--raw", raw / "new").returncode == 0  # made anew
    assert "barellm-1-t1-1.json" in os.listdir(raw / "new")


def test_make_figures_never_writes_over_the_model_it_measures(tmp_path):
    out = tmp_path / "figures"
    out.mkdir()
    model = write_model(out / "ladder.txt")  # the name of the ladder output it saves
    before = model.read_bytes()
    result = subprocess.run([sys.executable, MAKE_FIGURES, "--output", out, "--measure", model],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert f"--measure {model} is a file this script writes in {out}" in result.stderr
    assert model.read_bytes() == before
    assert os.listdir(out) == ["ladder.txt"]
