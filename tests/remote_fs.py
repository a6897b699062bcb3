"""`testfs://` paths: a Beam FileSystem over a local directory, standing in for gs:// or
s3:// so the stage's non-local code paths (match, open, create, rename, delete through
Beam's FileSystems, no directory rename) run for real. Importing this module registers it."""

from __future__ import annotations

import os

from apache_beam.io.localfilesystem import LocalFileSystem

ROOT = os.environ.get("TFPIPE_TESTFS_ROOT", "/tmp/tfpipe-testfs")
PREFIX = "testfs://"


def local(path: str) -> str:
    return os.path.join(ROOT, path[len(PREFIX):].lstrip("/")) if path.startswith(PREFIX) else path


def remote(path: str) -> str:
    return PREFIX + os.path.relpath(path, ROOT)


class TestFileSystem(LocalFileSystem):
    """Maps testfs://REL to ROOT/REL and delegates to a plain LocalFileSystem."""

    @classmethod
    def scheme(cls):
        return "testfs"

    @property
    def _local(self) -> LocalFileSystem:
        return LocalFileSystem(pipeline_options=None)

    def join(self, base, *paths):
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in paths)])

    def split(self, path):
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def mkdirs(self, path):
        return self._local.mkdirs(local(path))

    def has_dirs(self):
        return False  # like an object store

    def match(self, patterns, limits=None):
        results = self._local.match([local(p) for p in patterns], limits)
        for r in results:
            r.pattern = remote(r.pattern)
            for m in r.metadata_list:
                m.path = remote(m.path)
        return results

    def create(self, path, *args, **kw):
        return self._local.create(local(path), *args, **kw)

    def open(self, path, *args, **kw):
        return self._local.open(local(path), *args, **kw)

    def copy(self, src, dst):
        return self._local.copy([local(p) for p in src], [local(p) for p in dst])

    def rename(self, src, dst):
        for p in dst:  # an object store has no folders to create first
            os.makedirs(os.path.dirname(local(p)), exist_ok=True)
        return self._local.rename([local(p) for p in src], [local(p) for p in dst])

    def exists(self, path):
        return self._local.exists(local(path))

    def size(self, path):
        return self._local.size(local(path))

    def last_updated(self, path):
        return self._local.last_updated(local(path))

    def checksum(self, path):
        return self._local.checksum(local(path))

    def metadata(self, path):
        return self._local.metadata(local(path))

    def delete(self, paths):
        return self._local.delete([local(p) for p in paths])
