"""Downloads into one shared folder at once (datamodules/files.py ``download``): several preparers, as nodes' local
rank 0 on a cluster with a shared home, fetch from a test mirror together (tests/mirror.py makes them overlap) while
a reader watches the folder. Threads here, real nodes in tests/cluster/test_two_nodes.py."""

import os
import threading
from pathlib import Path

import pytest
from torchvision.datasets import FashionMNIST

from datamodules import FashionMNISTDataModule
from datamodules.files import RAW_FILES, DataNotFoundError, download_or_raise, missing_files, raw_folder
from tests.mirror import Mirror, served_resources, write_archives

PREPARERS = 3


@pytest.fixture
def served(tmp_path, monkeypatch) -> Path:
    """The folder of the tiny data's archives (their IDX files in ``source``), and torchvision pointed at their MD5s
    with no mirror of its own (no network)."""
    folder = tmp_path / "served"
    folder.mkdir()
    write_archives(folder)
    monkeypatch.setattr(FashionMNIST, "resources", served_resources(folder))
    monkeypatch.setattr(FashionMNIST, "mirrors", [])
    return folder


def source(served: Path) -> Path:
    return raw_folder(str(served / "source"))


def download_beside_one_file(served: Path, tmp_path: Path):
    """A download into a folder that already holds the first file: (folder, its raw/, that file's stat, the mirror)."""
    shared = tmp_path / "shared"
    raw = raw_folder(str(shared))
    raw.mkdir(parents=True)
    (raw / RAW_FILES[0]).write_bytes((source(served) / RAW_FILES[0]).read_bytes())
    kept = os.stat(raw / RAW_FILES[0])
    with Mirror(served, chunk_s=0) as mirror:
        download_or_raise(str(shared), missing_files(str(shared)), True, mirror.url)
    return shared, raw, kept, mirror


def test_preparers_that_download_into_one_folder_at_once_leave_the_same_checked_files_and_no_half_written_one(
        served, tmp_path):
    shared = tmp_path / "shared"
    expected = {name: (source(served) / name).read_bytes() for name in RAW_FILES}
    raw, seen_partial, failures = raw_folder(str(shared)), [], []
    done = threading.Event()

    def read_while_they_download() -> None:
        while not done.is_set():
            for name in RAW_FILES:
                try:
                    data = (raw / name).read_bytes()
                except FileNotFoundError:
                    continue
                if data != expected[name]:
                    seen_partial.append((name, len(data)))

    def prepare() -> None:
        try:
            FashionMNISTDataModule(data_dir=str(shared), batch_size=32, mirror=mirror.url).prepare_data()
        except Exception as error:  # noqa: BLE001: reported by the assertion below
            failures.append(repr(error))

    with Mirror(served, together=PREPARERS, chunks=4, chunk_s=0.02) as mirror:
        reader = threading.Thread(target=read_while_they_download)
        reader.start()
        preparers = [threading.Thread(target=prepare) for _ in range(PREPARERS)]
        for thread in preparers:
            thread.start()
        for thread in preparers:
            thread.join(timeout=120)
        done.set()
        reader.join(timeout=10)
    assert failures == []
    for name, _ in FashionMNIST.resources:  # every preparer downloaded every file, all at once
        downloads = [d for d in mirror.downloads if d["file"] == name]
        assert len(downloads) == PREPARERS
        assert max(d["start"] for d in downloads) < min(d["end"] for d in downloads), downloads
    assert seen_partial == []
    assert {name: (raw / name).read_bytes() for name in RAW_FILES} == expected
    assert sorted(path.name for path in raw.parent.iterdir()) == ["raw"]  # no private download folder left
    assert sorted(path.name for path in raw.iterdir()) == sorted(RAW_FILES)


def test_a_download_fills_in_only_the_missing_files_uses_archives_at_hand_and_a_failed_one_leaves_nothing(
        served, tmp_path):
    shared, raw, kept, mirror = download_beside_one_file(served, tmp_path)
    assert [d["file"] for d in mirror.downloads] == [name for name, _ in FashionMNIST.resources]
    assert missing_files(str(shared)) == [] and os.stat(raw / RAW_FILES[0]).st_ino == kept.st_ino  # not replaced
    offline = raw_folder(str(tmp_path / "offline"))  # torchvision's archives put there by hand: used, not fetched
    offline.mkdir(parents=True)
    for name, _ in FashionMNIST.resources:
        (offline / name).write_bytes((served / name).read_bytes())
    download_or_raise(str(tmp_path / "offline"), list(RAW_FILES), True, "http://127.0.0.1:9/")  # nothing listens
    assert missing_files(str(tmp_path / "offline")) == []
    empty = tmp_path / "empty"
    with pytest.raises(DataNotFoundError, match=r"download failed \(RuntimeError: Error downloading"):
        download_or_raise(str(empty), list(RAW_FILES), True, "http://127.0.0.1:9/")  # nothing listens there
    assert [path.name for path in raw_folder(str(empty)).parent.iterdir()] == ["raw"]
    assert list(raw_folder(str(empty)).iterdir()) == []


def test_on_a_file_system_without_hard_links_the_files_are_renamed_into_place_and_none_is_replaced(
        served, tmp_path, monkeypatch):
    def no_hard_links(src, dst, **kwargs):
        raise PermissionError(1, "Operation not permitted")  # what link() gives on a file system without them

    monkeypatch.setattr(os, "link", no_hard_links)
    shared, raw, kept, mirror = download_beside_one_file(served, tmp_path)
    assert {name: (raw / name).read_bytes() for name in RAW_FILES} == \
        {name: (source(served) / name).read_bytes() for name in RAW_FILES}
    assert os.stat(raw / RAW_FILES[0]).st_ino == kept.st_ino  # the file already there was not replaced
    assert sorted(path.name for path in raw.parent.iterdir()) == ["raw"]  # no private download folder left
