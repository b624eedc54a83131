"""MkDocs hooks (``hooks:`` in mkdocs.yml): the reference pages generated from the code.

``on_files`` adds every page of :data:`docs_reference.PAGES` to the build as a generated file,
so ``mkdocs build`` always documents the code it runs with; nothing generated is committed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import docs_reference
from mkdocs.structure.files import File, Files


def on_files(files: Files, config: Any) -> Files:
    for path, page in docs_reference.PAGES.items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, path, content=page()))
    return files
