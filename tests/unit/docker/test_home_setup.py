"""tfmp-home, the persistent home's start-up jobs (docker/bin/tfmp-home in the checkout,
/usr/local/bin/tfmp-home in the image): the image's files brought into a home that outlives
the image without touching the user's edits, and user-site packages that would break
TensorFlow named, one line each."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

CANDIDATES = [ROOT / "docker/bin/tfmp-home", Path("/usr/local/bin/tfmp-home")]
SCRIPT = next((p for p in CANDIDATES if p.is_file()), None)
pytestmark = pytest.mark.skipif(SCRIPT is None, reason="tfmp-home is not here")


def _module():
    loader = importlib.machinery.SourceFileLoader("tfmp_home", str(SCRIPT))
    spec = importlib.util.spec_from_loader("tfmp_home", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def tfmp_home(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60)


# --- sync ------------------------------------------------------------------------------

@pytest.fixture
def image_home(tmp_path) -> Path:
    """An image's pristine home: what the Dockerfile copies, readable by anyone."""
    src = tmp_path / "image-home"
    (src / ".ssh").mkdir(parents=True)
    (src / ".jupyter").mkdir()
    (src / ".bashrc").write_text("# image bashrc v1\n")
    (src / ".profile").write_text("# image profile v1\n")
    (src / "bin").mkdir()
    (src / "bin" / "helper").write_text("#!/bin/sh\necho v1\n")
    (src / "bin" / "helper").chmod(0o755)
    for folder in (src, src / ".ssh", src / ".jupyter", src / "bin"):
        folder.chmod(0o755)
    return src


def sync(image_home: Path, home: Path) -> tuple[int, str]:
    proc = tfmp_home("sync", "--image-home", str(image_home), "--home", str(home))
    return proc.returncode, proc.stdout.strip() + proc.stderr.strip()


def test_an_empty_home_gets_every_file_and_private_folders(image_home, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    status, out = sync(image_home, home)
    assert status == 0, out
    assert out == "image files in the home: 3 added, 0 refreshed, 0 kept"
    assert (home / ".bashrc").read_text() == "# image bashrc v1\n"
    assert os.access(home / "bin" / "helper", os.X_OK)
    for folder in (".ssh", ".jupyter", "bin"):
        assert stat.S_IMODE((home / folder).stat().st_mode) == 0o700, folder


def test_a_new_image_refreshes_unedited_files_and_keeps_edited_ones(image_home, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    sync(image_home, home)
    (home / ".profile").write_text("# mine\nexport EDITOR=vim\n")  # the user edits one
    (home / "bin" / "helper").unlink()  # and deletes another
    (image_home / ".bashrc").write_text("# image bashrc v2\n")  # the rebuilt image
    (image_home / ".profile").write_text("# image profile v2\n")
    (image_home / "bin" / "helper").write_text("#!/bin/sh\necho v2\n")
    status, out = sync(image_home, home)
    assert status == 0, out
    assert out == ("image files in the home: 1 added, 1 refreshed, 1 kept "
                   "(yours, left as they are: .profile)")
    assert (home / ".bashrc").read_text() == "# image bashrc v2\n"
    assert (home / ".profile").read_text() == "# mine\nexport EDITOR=vim\n"
    assert (home / "bin" / "helper").read_text() == "#!/bin/sh\necho v2\n"
    # Unchanged image, second start: nothing to do, the edit still kept.
    assert sync(image_home, home) == (0, "image files in the home: 0 added, 0 refreshed, "
                                         "1 kept (yours, left as they are: .profile)")


def test_a_home_from_before_the_record_keeps_every_differing_file(image_home, tmp_path):
    """No record of what an older image installed: a differing file may be the user's."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("# whoever wrote this\n")
    status, out = sync(image_home, home)
    assert status == 0 and "kept (yours, left as they are: .bashrc)" in out, out
    assert (home / ".bashrc").read_text() == "# whoever wrote this\n"
    record = json.loads((home / ".local/state/tfmp/image-files.json").read_text())
    assert ".bashrc" not in record and ".profile" in record


def test_a_users_folder_or_link_in_the_files_place_is_left_alone(image_home, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".profile").mkdir()
    (home / "elsewhere").write_text("# mine\n")
    (home / ".bashrc").symlink_to(home / "elsewhere")
    status, out = sync(image_home, home)
    assert status == 0 and "kept (yours, left as they are: .bashrc .profile)" in out, out
    assert (home / ".bashrc").is_symlink() and (home / "elsewhere").read_text() == "# mine\n"


def test_links_in_the_image_home_are_installed_as_links(image_home, tmp_path):
    (image_home / "notebooks").symlink_to("/workspace/notebooks")
    home = tmp_path / "home"
    home.mkdir()
    status, out = sync(image_home, home)
    assert status == 0, out
    assert os.readlink(home / "notebooks") == "/workspace/notebooks"
    assert "4 added" in out


def test_sync_refuses_a_missing_folder(tmp_path):
    proc = tfmp_home("sync", "--image-home", str(tmp_path / "nope"), "--home", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"tfmp-home: error: --image-home '{tmp_path / 'nope'}' is not a "
                                   "folder; allowed: an existing folder")
    assert list(tmp_path.iterdir()) == []


# --- check -------------------------------------------------------------------------------

def dist_info(site: Path, name: str, version: str, *requires: str) -> None:
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {req}" for req in requires]
    (folder / "METADATA").write_text("\n".join(lines) + "\n")


@pytest.fixture
def sites(tmp_path) -> tuple[Path, Path, Path]:
    """(user site, the image's site, constraints file): an image with TensorFlow's shape."""
    user, system = tmp_path / "user-site", tmp_path / "site-packages"
    dist_info(system, "tensorflow-cpu", "2.9.3", "numpy>=1.20", "protobuf<3.20,>=3.9.2",
              "tensorflow-io-gcs-filesystem>=0.23.1; extra == 'gcs'")
    dist_info(system, "numpy", "1.26.4")
    dist_info(system, "protobuf", "3.19.6")
    user.mkdir()
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("# pins\ntensorflow-cpu==2.9.3\nnumpy>=1.20,<2  # TF 2.9\n"
                           "protobuf>=3.9.2,<3.20\nwindows-only<1; sys_platform == 'win32'\n")
    return user, system, constraints


def problems(sites) -> list:
    module = _module()
    user, system, constraints = sites
    return module.find_problems(str(user), [str(system)], module.read_constraints(str(constraints)))


def test_numpy_2_in_the_user_site_is_named_though_pip_check_would_pass(sites):
    """TF 2.9.3 says numpy>=1.20 only: the constraints file is what catches numpy 2."""
    user = sites[0]
    dist_info(user, "numpy", "2.0.0")
    assert problems(sites) == [
        f"user package numpy 2.0.0 in {user}: outside the image's constraints (numpy<2,>=1.20), "
        "which keep TensorFlow working; `pip uninstall numpy` removes it"]


def test_a_user_package_breaking_an_image_requirement_is_named_once(sites):
    user = sites[0]
    dist_info(user, "protobuf", "4.21.0")
    [line] = problems(sites)
    assert line.startswith(f"user package protobuf 4.21.0 in {user}: outside the image's "
                           "constraints (protobuf<3.20,>=3.9.2), which keep TensorFlow working; "
                           "breaks tensorflow-cpu 2.9.3 (needs protobuf<3.20,>=3.9.2);")


def test_a_user_package_with_unmet_requirements_is_named(sites):
    user = sites[0]
    dist_info(user, "needs-things", "1.0", "absent-pkg>=1", "numpy>=2", "extra-only; extra == 'x'")
    [line] = problems(sites)
    assert ("needs absent-pkg>=1, which is not installed; "
            "needs numpy>=2, but numpy 1.26.4 is installed;") in line
    assert "extra-only" not in line


def test_good_user_packages_and_a_platform_constraint_give_no_line(sites):
    user = sites[0]
    dist_info(user, "numpy", "1.24.4")  # an allowed version shadowing the image's
    dist_info(user, "tiny-probe", "0.1", "numpy>=1.20")
    dist_info(user, "windows-only", "5.0")  # its constraint's marker is false here
    assert problems(sites) == []


def test_check_without_a_user_site_or_packages_prints_nothing(sites, tmp_path):
    constraints = sites[2]
    for site in (tmp_path / "absent", sites[0]):
        proc = tfmp_home("check", "--constraints", str(constraints), "--user-site", str(site))
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_check_reads_the_users_site_though_it_runs_without_it(sites, tmp_path):
    """The start runs tfmp-home with PYTHONNOUSERSITE=1, so no .pth file of the user's runs
    in it (entrypoint.sh, user_cmd): the check still reads the site the user's sessions load."""
    base = tmp_path / "user-base"
    env = dict(os.environ, PYTHONUSERBASE=str(base), PYTHONNOUSERSITE="1")
    user_site = subprocess.run([sys.executable, "-c", "import site; print(site.getusersitepackages())"],
                               env=env, capture_output=True, text=True, check=True).stdout.strip()
    dist_info(Path(user_site), "numpy", "2.0.0")
    proc = subprocess.run([sys.executable, str(SCRIPT), "check", "--constraints", str(sites[2])],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"user package numpy 2.0.0 in {user_site}:" in proc.stdout, proc.stdout


def test_check_command_prints_one_line_per_package(sites):
    user, _, constraints = sites
    dist_info(user, "numpy", "2.0.0")
    proc = tfmp_home("check", "--constraints", str(constraints), "--user-site", str(user))
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 1 and "numpy 2.0.0" in proc.stdout


def test_check_refuses_a_missing_constraints_file(tmp_path):
    proc = tfmp_home("check", "--constraints", str(tmp_path / "none.txt"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"tfmp-home: error: --constraints '{tmp_path / 'none.txt'}' "
                                   "is not a file; allowed: a pip constraints file")


def test_a_users_file_where_the_image_has_a_folder_keeps_the_rest_going(image_home, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "bin").write_text("# mine, not a folder\n")
    status, out = sync(image_home, home)
    assert status == 0 and out.endswith("2 added, 0 refreshed, 1 kept (yours, left as they are: "
                                        "bin)"), out
    assert (home / "bin").read_text() == "# mine, not a folder\n"
    assert (home / ".bashrc").is_file() and (home / ".ssh").is_dir()
