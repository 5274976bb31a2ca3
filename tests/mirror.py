"""A Fashion-MNIST mirror for tests: the tiny IDX files of tests/idx_files.py gzipped under torchvision's names, served
over HTTP on an address the test picks. Downloads that are meant to race are made to: each download of a file waits
until ``together`` downloads of it have started (or ``wait_s`` passed), then the bytes go out in slow chunks. Every
download is logged: who, which file, when it started and ended."""

import gzip
import hashlib
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Tuple

from torchvision.datasets import FashionMNIST

from tests.idx_files import write_fashion_mnist


def write_archives(folder: Path) -> Path:
    """torchvision's four ``.gz`` files of the tiny data in ``folder`` (gzip's mtime 0: the same bytes every time);
    returns the root of the IDX files they hold (``root/FashionMNIST/raw``)."""
    root = write_fashion_mnist(folder / "source")
    for name, _ in FashionMNIST.resources:
        data = (root / "FashionMNIST" / "raw" / name.removesuffix(".gz")).read_bytes()
        (folder / name).write_bytes(gzip.compress(data, mtime=0))
    return root


def served_resources(folder: Path) -> List[Tuple[str, str]]:
    """torchvision's resource list for the archives in ``folder``: (name, MD5), in its order."""
    return [(name, hashlib.md5((folder / name).read_bytes()).hexdigest()) for name, _ in FashionMNIST.resources]


class Mirror:
    """``folder`` served at ``http://HOST:PORT/`` from a thread of this process; :meth:`stop` ends it."""

    def __init__(self, folder: Path, host: str = "127.0.0.1", together: int = 1, wait_s: float = 60,
                 chunks: int = 8, chunk_s: float = 0.05) -> None:
        self.downloads: List[Dict] = []  # {"client", "file", "start", "end"}, in the order they ended
        arrived: Dict[str, int] = {}
        gate = threading.Condition()
        mirror = self

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs) -> None:
                super().__init__(*args, directory=str(folder), **kwargs)

            def log_message(self, *args) -> None:
                pass

            def copyfile(self, source, outputfile) -> None:
                if self.headers.get("Method") == "HEAD":  # torchvision's redirect check reads no body
                    return
                start, name = time.monotonic(), self.path.lstrip("/")
                with gate:  # the n-th download of a file waits for the rest of its group of ``together``
                    arrived[name] = arrived.get(name, 0) + 1
                    group = -(-arrived[name] // together) * together
                    gate.notify_all()
                    gate.wait_for(lambda: arrived[name] >= group, timeout=wait_s)
                data = source.read()
                step = -(-len(data) // chunks)
                for offset in range(0, len(data), step):
                    outputfile.write(data[offset:offset + step])
                    outputfile.flush()
                    time.sleep(chunk_s)
                mirror.downloads.append({"client": self.client_address[0], "file": name, "start": start,
                                         "end": time.monotonic()})

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}/"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Mirror":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)
