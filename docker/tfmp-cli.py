# Installed as /usr/local/bin/tfmp, with this interpreter's path as its first line
# (what pip makes of pyproject.toml's `tfmp = "app.cli:main"`).
#
# Why a script and not `python -m app`: `-m` puts the current folder first on
# sys.path, so a user's own app.py or app/ (a common name) there would run instead
# of the package.  A script's sys.path starts with its own folder (/usr/local/bin);
# the package comes from /opt/tfmp/src (tfmp-app.pth), whatever the current folder.
# Users' --model/--dataset modules are still found in the current folder: app/task/user_code.py
# adds it for them.
import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
