"""Recorded traces as tests: `pytest --vgpu-traces DIR` replays every trace under DIR with
`vgpu replay --check` semantics, one test per trace.

A trace is a folder holding `*.trace` manifests (what `vgpu record -o` writes); DIR may be
one, or hold them at any depth. Every trace replays on one private emu server, started at
the first trace test and stopped when the run ends. A trace whose results differ from its
recording fails with the difference (session, call, what differed); one that cannot be
read fails with what is wrong with it.

Without --vgpu-traces the plugin does nothing: no server, no collection of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_SERVER = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vgpu", "vgpu recorded traces")
    group.addoption("--vgpu-traces", action="append", default=[], metavar="DIR",
                    help="replay every vgpu trace under DIR as a test (vgpu replay --check "
                         "on a private emu server); may be given more than once")


def _trace_folders(config: pytest.Config) -> list[Path]:
    return [Path(d).resolve() for d in config.getoption("vgpu_traces", default=[]) or []]


def pytest_configure(config: pytest.Config) -> None:
    folders = _trace_folders(config)
    if not folders:
        return
    if not hasattr(pytest, "Directory"):
        raise pytest.UsageError("--vgpu-traces needs pytest 8 or newer")
    config.stash[_SERVER] = []  # [process, address] once started
    given = [Path(str(a).split("::")[0]).resolve() for a in config.args]
    for folder in folders:
        if folder not in given:
            config.args.append(str(folder))


def _is_trace(path: Path) -> bool:
    try:
        return any(p.suffix == ".trace" and p.is_file() for p in path.iterdir())
    except OSError:
        return False


# optionalhook: pytest 7 has no such hook, and the plugin must not break its runs.
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_collect_directory(path: Path, parent: pytest.Collector):
    folders = _trace_folders(parent.config)
    if not folders:
        return None
    resolved = path.resolve()
    if not any(resolved == f or f in resolved.parents for f in folders):
        return None
    if _is_trace(path):
        return TraceFolder.from_parent(parent, path=path)
    return None


class TraceFolder(getattr(pytest, "Directory", pytest.Collector)):
    """A trace: one test."""

    def collect(self):
        yield TraceItem.from_parent(self, name=self.path.name)


class TraceDiffers(Exception):
    """A replay whose outcome differs from the recording, or a trace that cannot be run."""


class TraceItem(pytest.Item):
    def runtest(self) -> None:
        from vgpu.replay.replayer import ReplayError, replay
        from vgpu.replay.trace import TraceError, read_trace

        try:
            trace = read_trace(self.path)
            difference = replay(trace, _address(self.config), check=True)
        except (TraceError, ReplayError) as exc:
            raise TraceDiffers(f"vgpu replay: {exc}") from None
        if difference is not None:
            # On one line with the session and call: the short summary shows the first.
            raise TraceDiffers(f"vgpu replay: results differ from the recording at "
                               f"{difference}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, TraceDiffers):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"vgpu trace {self.path.name}"


def _address(config: pytest.Config) -> str:
    server = config.stash[_SERVER]
    if not server:
        from vgpu.cli import _start_private_server

        proc, address = _start_private_server("emu")
        if proc is None:
            raise TraceDiffers("vgpu replay: the private emu server failed to start")
        server[:] = [proc, address]
    return server[1]


def pytest_unconfigure(config: pytest.Config) -> None:
    server = config.stash.get(_SERVER, None)
    if server:
        from vgpu.cli import _stop

        _stop(*server)
        server.clear()
