"""tfmp-tensorboard, the command behind JupyterLab's TensorBoard tile: which folder it serves,
and one clear line for every bad setting (docker/bin/tfmp-tensorboard in the checkout,
/usr/local/bin/tfmp-tensorboard in the image)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

CANDIDATES = [ROOT / "docker/bin/tfmp-tensorboard", Path("/usr/local/bin/tfmp-tensorboard")]
SCRIPT = next((p for p in CANDIDATES if p.is_file()), None)
pytestmark = pytest.mark.skipif(SCRIPT is None, reason="tfmp-tensorboard is not here")


def launch(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("TFMP_TENSORBOARD_LOGDIR", "TFMP_WORKSPACE")}
    clean.update(env)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=clean, timeout=60)


def test_default_is_the_workspace_runs_folder_created_if_missing(tmp_path):
    proc = launch("--check", TFMP_WORKSPACE=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "runs")
    assert (tmp_path / "runs").is_dir()


def test_the_variable_chooses_another_folder_or_url(tmp_path):
    target = tmp_path / "elsewhere" / "runs"
    proc = launch("--check", TFMP_TENSORBOARD_LOGDIR=str(target), TFMP_WORKSPACE=str(tmp_path))
    assert proc.returncode == 0 and proc.stdout.strip() == str(target)
    proc = launch("--check", TFMP_TENSORBOARD_LOGDIR="gs://bucket/runs")
    assert proc.returncode == 0 and proc.stdout.strip() == "gs://bucket/runs"


@pytest.mark.parametrize("value, says", [
    ("", "is set but empty"),
    ("runs", "must be an absolute path"),
    ("/a\nb", "contains a control character"),
    ("FILE", "is a file, not a folder"),
    ("FILE/sub", "cannot be created"),
])
def test_a_bad_logdir_gets_one_line_and_exit_2(tmp_path, value, says):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    proc = launch("--check", TFMP_TENSORBOARD_LOGDIR=value.replace("FILE", str(a_file)))
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and says in lines[0] and "TFMP_TENSORBOARD_LOGDIR" in lines[0], lines
    assert "allowed: an absolute folder path" in lines[0]


@pytest.mark.parametrize("args", [[], ["--port"], ["--port", "x"], ["--port", "70000"], ["--nope"]])
def test_bad_arguments_get_one_line(args):
    proc = launch(*args)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr


# --- the Profile tab: loaded lazily, working offline --------------------------------------------

def _module():
    from importlib.machinery import SourceFileLoader

    return SourceFileLoader("tfmp_tensorboard", str(SCRIPT)).load_module()


PROFILE_PAGE = """<app></app><script>
    function loadBundle() {
      const script = document.createElement('script');
      script.src = 'bundle.js';
      document.body.appendChild(script);
      return script;
    }
    const script = loadChart('www.gstatic.com');
    script.onerror = () => {
      script.onerror = null;
      document.body.removeChild(script);

      loadChart('www.gstatic.cn');
    }
</script>"""


def test_the_profile_page_loads_its_code_when_the_charts_cdn_is_unreachable():
    page = _module().profile_index_html(PROFILE_PAGE)
    assert "const cn = loadChart('www.gstatic.cn');" in page
    assert "cn.onerror = tfmpWithoutCharts;" in page
    assert "setTimeout(tfmpWithoutCharts, 5000);" in page
    assert page.index("var tfmpBundleLoaded") < page.index("loadChart('www.gstatic.com')")
    assert "script.src = 'bundle.js';\n      tfmpBundleLoaded = true;" in page
    other = "<html>another version</html>"
    assert _module().profile_index_html(other) == other


def test_profiles_are_found_below_the_logdir(tmp_path):
    mod = _module()
    assert not mod.has_profiles(str(tmp_path))
    (tmp_path / "run" / "tensorboard" / "plugins" / "profile" / "2026_01_01").mkdir(parents=True)
    assert mod.has_profiles(str(tmp_path))


# --- `%tensorboard` in notebooks (TENSORBOARD_BINARY) -------------------------------------------

@pytest.mark.parametrize("argv", [["--logdir", "runs"], ["--logdir=runs", "--port", "6007"],
                                  ["--port", "0", "--logdir", "/workspace/runs"],
                                  ["--logdir_spec", "a:/x,b:/y"]])
def test_the_magics_command_line_goes_to_tensorboard_as_it_is(argv):
    assert _module().parse_args(argv) == ("tensorboard", argv)


@pytest.mark.parametrize("argv,local", [
    (["--logdir", "runs"], True), (["--logdir", "/workspace/runs", "--port", "0"], True),
    (["--logdir", "gs://bucket/runs"], False), (["--logdir_spec", "a:/x,b:s3://bucket/y"], False)])
def test_the_magics_tensorboard_keeps_tensorflow_only_for_urls(argv, local):
    assert _module().reads_only_local_files(argv) is local


def test_a_bad_flag_for_the_magics_tensorboard_gets_tensorboards_own_error(tmp_path):
    proc = launch("--logdir", str(tmp_path), "--nope")
    assert proc.returncode == 2, proc.stderr
    assert "unrecognized arguments: --nope" in proc.stderr.splitlines()[-1], proc.stderr
