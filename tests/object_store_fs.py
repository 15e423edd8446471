"""A local folder with an object store's ``move``, for ``run.storage`` tests on CPU.

An object store has no directories, only keys under a prefix, so it has no directory rename:
Arrow's ``S3FileSystem::Move`` copies the one object named by the source key and deletes it
("we don't implement moving directories as it would be too expensive", arrow/filesystem/s3fs.cc),
so moving a folder of files fails with S3's NoSuchKey (no object has the folder's own key). This
handler is the local filesystem in every call but ``move``, which refuses a folder as S3 does; a
file is moved as S3 moves it (copy, then delete)."""

from __future__ import annotations

import pyarrow.fs as pafs


class ObjectStoreMoves(pafs.FileSystemHandler):
    """``LocalFileSystem`` whose ``move`` takes files only, as an object store's does."""

    def __init__(self) -> None:
        self.local = pafs.LocalFileSystem()

    def __eq__(self, other) -> bool:
        return isinstance(other, ObjectStoreMoves)

    def __ne__(self, other) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return "object-store-moves"

    def normalize_path(self, path):
        return self.local.normalize_path(path)

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("not on a test filesystem")

    def delete_file(self, path):
        self.local.delete_file(path)

    def move(self, src, dest):
        if self.local.get_file_info(src).type != pafs.FileType.File:
            raise OSError(f"When copying key '{src}' to '{dest}': AWS Error NO_SUCH_KEY during CopyObject "
                          "operation: The specified key does not exist.")
        self.local.copy_file(src, dest)
        self.local.delete_file(src)

    def copy_file(self, src, dest):
        self.local.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.local.open_input_stream(path)

    def open_input_file(self, path):
        return self.local.open_input_file(path)

    def open_output_stream(self, path, metadata):
        return self.local.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path, metadata):
        return self.local.open_append_stream(path, metadata=metadata)


def object_store_like() -> pafs.FileSystem:
    """The local filesystem with an object store's ``move`` (:class:`ObjectStoreMoves`)."""
    return pafs.PyFileSystem(ObjectStoreMoves())
