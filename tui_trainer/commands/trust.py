"""`tui-trainer trust FILE`: lets a net of your own file run on this machine (its content as
it is now, core/settings/user_models.py); `tui-trainer trust FOLDER`: names a folder of
your images, so that the runs of any session that names it may read it
(core/settings/user_data.py)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..core.errors import EXIT_OK
from ..core.settings import user_data, user_models
from ..core.settings.config import FOLDER
from ..core.settings.machine import folder_root
from ..core.text import shown


def add(sub: Any) -> None:
    sp = sub.add_parser("trust", help="let a model file run here (its content as it is now), "
                        "or a session's folder of images be read",
                        description="Trust a Python file that defines a net (model = "
                                    "\"FILE:Name\"): its content, as it is now, may run in "
                                    "this user's training processes on this machine. A "
                                    "session that names a file never makes it run by "
                                    "itself; a file changed since is not trusted until it "
                                    "is trusted again. Naming a file yourself (--set "
                                    "model=FILE:Name, a TOML file you give) trusts it too. "
                                    "What is trusted lives in your config folder, by the "
                                    "content's SHA-256, never in a session. Given a folder "
                                    "(dataset = \"folder:PATH\"), names it: the runs of a "
                                    "session that names it may read its images.")
    sp.add_argument("file", metavar="FILE", help="the file (FILE or FILE:Name), or a folder "
                    "of images (FOLDER or folder:FOLDER), relative to here or absolute")
    sp.add_argument("--json", action="store_true", help="one JSON object")


def run(args: argparse.Namespace) -> int:
    root = folder_root(args.file if args.file.startswith(FOLDER) else FOLDER + args.file)
    if root.is_dir():                   # a folder of images: named by this user
        user_data.name(root)
        if args.json:
            print(json.dumps({"folder": str(root)}))
        else:
            print(f"named {shown(root, 300)}: its images may be read for the runs of any "
                  "session that names it, on this machine")
        return EXIT_OK
    written = args.file
    if user_models.FILE_MODEL.match(written):
        written = user_models.parse(written)[0]
    path = user_models.resolve(written)
    sha = user_models.trust(path)          # BadInput: missing, not a file, not Python
    if args.json:
        print(json.dumps({"path": str(path), "sha256": sha}))
    else:
        print(f"trusted {shown(path, 300)} (sha256 {sha}): its code may run in your training "
              "processes on this machine; a changed file must be trusted again")
    return EXIT_OK
