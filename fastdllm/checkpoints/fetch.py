"""A pull's files into the Hugging Face cache, each checked against what the hub lists for it: the
size, and the sha256 of an LFS file or the git blob hash of any other (a config.json altered on the
way is caught as a weight file is). A file that fails its check is removed with its blob, so that
the next pull fetches it again; a copy already here is checked the same way, so that a pull after
the hub is fixed repairs it.

A snapshot is a model only with its config.json (locate.is_complete), so config.json is taken away
before anything else is fetched and put back last, once every other file is checked: a pull that
fails, stops or is interrupted never leaves a copy that is listed or used. A GGUF file pulled alone
has no config.json: it is linked into the snapshot only once its transfer is whole, and removed
if its sha256 does not match. The transfers run in a
worker thread so that Ctrl+C reaches the main thread at once (huggingface_hub's own pool finishes
its files first); huggingface_hub's bars and warnings give way to the caller's Report: the bytes,
the file being fetched, one line per retry."""

from __future__ import annotations

import hashlib
import logging
import queue
import re
import threading
from pathlib import Path

from ..errors import UserError
from ..units import human_bytes

CONFIG = "config.json"


class Report:
    """What a pull says while it runs, called in the thread that called pull (the CLI renders it)."""

    def fetching(self, name: str, size: int) -> None:
        """A transfer starts (files already here and checked are not fetched)."""

    def progress(self, done: int, total: int) -> None:
        """Bytes checked or received so far, of all the files."""

    def retry(self, line: str) -> None:
        """One line per retry of a transfer or a request."""


class Mismatch(UserError):
    """A file whose bytes are not what the hub lists (removed)."""


def mismatch(path: Path, f) -> str | None:
    """What of `f` (a RepoFile) the file at `path` does not match: 'size', 'sha256' (LFS files) or
    'git blob hash' (the others); None when it matches."""
    size = path.stat().st_size
    if size != f.size:
        return "size"
    if f.lfs is not None:
        digest, what, want = hashlib.sha256(), "sha256", f.lfs.sha256
    else:
        digest, what, want = hashlib.sha1(b"blob %d\0" % size), "git blob hash", f.blob_id
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return None if digest.hexdigest() == want else what


def blob_name(f) -> str:
    """The name of `f`'s blob in the cache: its ETag, the sha256 of an LFS file, else its git blob hash."""
    return f.lfs.sha256 if f.lfs is not None else f.blob_id


class Fetch:
    """One pull: fetch(files) brings every file of a snapshot, checked."""

    def __init__(self, repo_id: str, commit: str, repo_folder: Path, settings: dict, report: Report | None):
        self.repo_id, self.commit, self.settings = repo_id, commit, settings
        self.snapshot = repo_folder / "snapshots" / commit
        self.blobs = repo_folder / "blobs"
        self.report = report or Report()
        self.total = 0                 # bytes of all the files
        self.done = 0                  # bytes of the files checked
        self.receiving = 0             # bytes of the transfer under way
        self.current = None            # the RepoFile being fetched
        self.fetched: list[str] = []
        self.started: queue.Queue = queue.Queue()     # RepoFiles whose transfer started
        self.lines: queue.Queue = queue.Queue()       # retry lines
        self.stop = threading.Event()
        self.error: BaseException | None = None      # the worker's, raised again in the main thread

    def fetch(self, files: dict) -> None:
        """Every file of `files` (name -> RepoFile) here and checked, config.json last; on Ctrl+C
        the worker is left behind (the process ends) and its partial blob removed."""
        self.total = sum(f.size for f in files.values())
        others = [f for name, f in sorted(files.items()) if name != CONFIG]
        worker = threading.Thread(target=self._work, args=(others,), daemon=True, name="pull")
        hub_logger = logging.getLogger("huggingface_hub")
        saved = hub_logger.handlers[:], hub_logger.propagate
        hub_logger.handlers, hub_logger.propagate = [RetryLines(self)], False
        try:
            worker.start()
            while worker.is_alive():
                worker.join(0.1)
                self._tell()
            if self.error is not None:
                raise self.error
            checked = CONFIG not in files          # a GGUF file alone: no config.json to put back
            try:                                   # in this thread: Ctrl+C cannot leave it unchecked
                if not checked:
                    self._ensure(files[CONFIG])
                checked = True
            finally:
                if not checked:
                    (self.snapshot / CONFIG).unlink(missing_ok=True)
            self._tell()
        except KeyboardInterrupt:
            self.stop.set()
            for f in files.values():                # the worker's partial file: nothing half-written stays
                for partial in self.blobs.glob(f"{blob_name(f)}.*incomplete"):
                    partial.unlink(missing_ok=True)
            raise
        finally:
            if not worker.is_alive():              # else the process is ending: the worker stays quiet
                hub_logger.handlers, hub_logger.propagate = saved

    def _work(self, files: list) -> None:
        try:
            for f in files:
                if self.stop.is_set():
                    return
                self._ensure(f)
        except BaseException as e:
            self.error = e

    def _ensure(self, f) -> None:
        """`f` in the snapshot and checked: a copy here that matches is kept, else it is fetched."""
        local = self.snapshot / f.path
        if local.is_file():
            if mismatch(local, f) is None:
                self.done += f.size
                return
            remove(local)                          # a bad copy from before (the hub since fixed)
        (self.snapshot / CONFIG).unlink(missing_ok=True)     # not a model until this pull ends well
        blob = self.blobs / blob_name(f)
        good_blob = blob.is_file() and mismatch(blob, f) is None     # kept by a pull that stopped
        if blob.is_file() and not good_blob:
            blob.unlink()
        self.current, self.receiving = f, 0
        self.started.put(f)
        try:
            path = Path(self._download(f))
        except KeyboardInterrupt:
            raise
        except Exception as e:
            raise UserError(f"download of {self.repo_id} failed at {f.path} ({failure(e)}); the files already "
                            "checked are kept: run the same pull again to fetch the rest") from None
        if good_blob and path.resolve() == blob.resolve():
            pass                                   # linked, not fetched: checked above
        elif (what := mismatch(path, f)) is not None:
            remove(path)
            raise Mismatch(f"{f.path} does not match the {what} the hub lists (removed); run the same pull "
                           "again, and if it fails again the download is being altered on the way")
        self.fetched.append(f.path)
        self.done, self.receiving = self.done + f.size, 0

    def _download(self, f) -> str:
        from huggingface_hub import hf_hub_download
        from tqdm import tqdm

        fetch = self

        class Bytes(tqdm):                          # huggingface_hub's bar, silent, counting for Report
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **{**kwargs, "disable": True})

            def update(self, n=1):
                fetch.receiving += n

            def update_transfer(self, n=1):         # Xet: count the bytes written, once
                pass

            def set_transfer_postfix_str(self, *args, **kwargs):
                pass

        return hf_hub_download(self.repo_id, f.path, revision=self.commit, tqdm_class=Bytes, **self.settings)

    def _tell(self) -> None:
        while not self.started.empty():
            f = self.started.get()
            self.report.fetching(f.path, f.size)
        while not self.lines.empty():
            self.report.retry(self.lines.get())
        self.report.progress(self.done + self.receiving, self.total)


def remove(path: Path) -> None:
    """A snapshot's file and the blob it links to."""
    path.resolve().unlink(missing_ok=True)
    path.unlink(missing_ok=True)


def failure(e: Exception) -> str:
    """Why a transfer failed, in a few words."""
    status = getattr(getattr(e, "response", None), "status_code", None)
    if status == 404:
        return "the hub lists it but answers 404"
    if status is not None:
        return f"the hub answered {status}"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160]}" if text else type(e).__name__


class RetryLines(logging.Handler):
    """huggingface_hub's warnings while a pull runs: each retry one line (its 'Error while downloading
    ... Trying to resume' and 'X thrown while requesting' + 'Retrying in 1s' pairs), anything else its
    first line, once."""

    def __init__(self, fetch: Fetch):
        super().__init__(logging.WARNING)
        self.fetch, self.reason, self.retries, self.seen = fetch, "", {}, set()

    def emit(self, record: logging.LogRecord) -> None:
        if self.fetch.stop.is_set():
            return
        f = self.fetch.current
        name = f.path if f is not None else self.fetch.repo_id
        message = record.getMessage()
        if str(record.msg).startswith("Error while downloading from") and len(record.args or ()) == 2:
            if message.endswith("Trying to resume download..."):
                n = self.retries[name] = self.retries.get(name, 0) + 1
                at = f"at {human_bytes(self.fetch.receiving)} of {human_bytes(f.size)} " if f is not None else ""
                self.fetch.lines.put(f"{name}: the transfer broke off {at}({one_line(record.args[1])}); "
                                     f"resuming (retry {n})")
            return                                  # 'Max retries exceeded': the pull's error says it
        if m := re.match(r"HTTP Error (\d+) thrown while requesting", message):
            self.reason = f"the hub answered {m[1]}"
        elif m := re.match(r"'(.*)' thrown while requesting", message, re.S):
            self.reason = one_line(m[1])
        elif m := re.match(r"(?:Retrying in|Rate limited\. Waiting) (\S+)s.*\[Retry (\d+)/(\d+)\]", message):
            why = "rate limited" if message.startswith("Rate") else self.reason or "no answer"
            self.fetch.lines.put(f"{name}: {why}; retrying in {m[1]} s ({m[2]} of {m[3]})")
        elif (line := one_line(message)) not in self.seen:
            self.seen.add(line)
            self.fetch.lines.put(line)


def one_line(text) -> str:
    lines = str(text).strip().splitlines()
    return lines[0][:160] if lines else ""
