"""Saturation in a child process: hard time and memory limits, and a crash in egglog costs only the child.

What decides the e-graph is counted (`Limits.iterations`, `nodes`, `work`: `egraph/runner.py`); the time
limits here are backstops for a machine several times slower than the defaults were sized on.
One egglog call cannot be interrupted from Python and can allocate without bound, and a panic or a
crash in Rust would take the caller's process down. So `saturate_isolated` forks: the child saturates
(`runner.saturate`, whose limits are checked after each rule application), freezes the result into
plain Python data and sends it back through a pipe, reporting each step on the way (progress bars).
The parent waits until the time limit plus 10% and kills the child then; the child's address space is
capped at its size at the fork plus `Limits.memory`. Under a call's deadline (`superopt/core/deadline.py`)
the time limit is the smaller of `Limits.seconds` and `SATURATION_SHARE` of the time left once the
rules are compiled (compiling them is the first call's cost in a process), so the stages after
saturation keep the rest. Where that deadline counts CPU time (a segment's search), so does the child:
its runner's limits are in its own CPU time, the kernel stops it at the limit plus 10% and a second of
CPU time (RLIMIT_CPU, SIGXCPU; the second is for freezing and sending what it reached), and the parent
waits `CPU_WALL_SLACK` times as long in wall-clock time before it kills it, for a machine that gives it
less than a core. A child that is killed, runs out of memory or
crashes yields a report with that stop reason and an error, and no e-graph: the caller keeps the
original program. A search's program is written into the e-graph in the child as well
(`encode_and_saturate`: the child's copy of the process's template e-graph), so the caller's template
is never changed; saturation's time limit starts once it is written.
"""
from __future__ import annotations

import faulthandler
import math
import os
import pickle
import resource
import signal
import struct
import sys
import tempfile
import time
from dataclasses import replace

from superopt.core import progress
from superopt.core.forked import fork, read_exactly
from superopt.egraph.analysis import analysis
from superopt.egraph.frozen import ENode, FrozenEGraph, freeze, node_facts
from superopt.core.deadline import Deadline, TimeLimit
from superopt.egraph.limits import SATURATION_SHARE, Limits, RunReport, StopReason
from superopt.egraph.encode import constructors, encode
from superopt.egraph.runner import (NODE_SLACK, ran, reachable, reachable_from, registered, ruleset_of, saturate,
                                  saturate_analysis, use_cpu_time)

_HEADER = struct.Struct("<Q")
CPU_WALL_SLACK = 3   # a child limited in CPU time is killed after this many times its limit in wall-clock time


def portable(view: FrozenEGraph) -> FrozenEGraph:
    """`view` with egglog's e-class values (which do not pickle) replaced by integers, in order of
    first appearance, so the same e-graph always gets the same numbers."""
    ids: dict = {}

    def cid(value) -> int:
        return ids.setdefault(value, len(ids))

    out = FrozenEGraph(growth_cut=view.growth_cut, assumed=view.assumed)
    for cls, nodes in view.classes.items():
        out.classes[cid(cls)] = [ENode(n.fn, n.args, tuple(cid(c) for c in n.children), cid(cls)) for n in nodes]
    out.shapes = {cid(k): v for k, v in view.shapes.items()}
    out.dtypes = {cid(k): v for k, v in view.dtypes.items()}
    out.outputs = {k: cid(v) for k, v in view.outputs.items()}
    return out


def saturate_isolated(egraph, schedule, limits: Limits = Limits(),
                      deadline: Deadline | None = None) -> tuple[RunReport, FrozenEGraph | None]:
    """`saturate` in a child process: (report, the frozen e-graph), or (report, None) where the child
    was killed at the time limit, ran out of memory, crashed, or saturation failed (module doc). With
    `deadline`, saturation gets at most `SATURATION_SHARE` of the time it leaves, and `TimeLimit` is
    raised if it has passed before saturation starts."""
    report, frozen, _ = _in_child(lambda left: (egraph, None), reachable(egraph, schedule), schedule, limits,
                                  deadline)
    return report, frozen


def encode_and_saturate(graph, template, schedule, limits: Limits = Limits(), deadline: Deadline | None = None,
                        origins: bool = False) -> tuple[RunReport, FrozenEGraph | None, list, float, dict | None]:
    """`graph` encoded (`encode.encode`, with `origins`) into `template`, the process's template e-graph, in
    the child process, and saturated there as `saturate_isolated` saturates: (report, frozen e-graph or None,
    the encoding's interned conv params, the seconds encoding took, and with `origins` the analysis's facts of
    each node of `graph` before any rule ran, `frozen.node_facts`, else None). The program is never written into this
    process's template, so nothing has to be taken out of it after the search: egglog's push and pop of the
    template, which encoding here needed, cost 77 ms a search once a process had run 34 small programs (the
    template holds every rule set its searches ran). The rules compiled here first are those reachable from
    the constructors the encoding writes (`encode.constructors`). A `TimeLimit` or another error while
    encoding is raised here, as if encoding had run here."""
    def prepare(left: float):   # in the child, where a deadline's clock restarts if it counts CPU time
        start = time.perf_counter()
        local = None if deadline is None else Deadline(left, clock=deadline.clock, also=deadline.also)
        try:
            enc = encode(graph, local, origins, template)
            facts = None
            if origins:   # the facts of the program as captured: the analysis first, as saturation's first step
                saturate_analysis(enc.egraph)
                facts = node_facts(enc.egraph)
            if local is not None:   # saturation starts with time left, as where encoding ran in the parent
                local.check("saturate")
        except TimeLimit as exc:   # named with the call's limit, as the parent's deadline would name it
            raise TimeLimit(exc.stage, deadline.seconds, exc.cpu) if exc.seconds == local.seconds else exc
        return enc.egraph, (enc.conv_params, time.perf_counter() - start, facts)

    report, frozen, encoded = _in_child(prepare, reachable_from(constructors(graph), schedule), schedule, limits,
                                        deadline)
    conv_params, seconds, facts = encoded if encoded is not None else ([], 0.0, None)   # the child died
    return report, frozen, conv_params, seconds, facts


def _in_child(prepare, rules: list, schedule, limits: Limits, deadline: Deadline | None) -> tuple:
    """Saturate the e-graph `prepare(seconds the deadline leaves at the fork)` makes (its first item) in a child
    process: (report, frozen e-graph or None, what `prepare` returned second, or None where the child failed).
    `rules` (the reachable ones) are compiled here before the fork. Saturation's time limit starts once the
    child has prepared; until then it has the time the deadline leaves."""
    for rule in rules:
        if deadline is not None:
            deadline.check("saturate")
        ruleset_of(rule)  # compiled here, where they outlive the child (compiling takes most of a first run),
        # and kept as a rule set, which the next search's template registers (`runner.prime`)
    analysis()    # likewise the analysis rule set, which every step runs
    limits = replace(limits, seconds=min(limits.seconds, limits.saturation_seconds))
    if deadline is not None:
        deadline.check("saturate")
        limits = replace(limits, seconds=max(min(limits.seconds, deadline.share(SATURATION_SHARE)), 1e-3))
    cpu = deadline is not None and deadline.counts_cpu
    left = math.inf if deadline is None else deadline.left()
    start = time.perf_counter()
    read_fd, write_fd = os.pipe()
    errors = tempfile.TemporaryFile()
    pid = fork()   # the child runs egglog only, and collects none of the garbage it inherits
    if pid == 0:  # pragma: no cover - the child; coverage is not collected there
        os.close(read_fd)
        _child(lambda: prepare(left), schedule, rules, limits, write_fd, errors.fileno(), cpu)
    os.close(write_fd)
    bar = progress.task("saturate", transient=True)
    budget = _cpu_cap(limits) * CPU_WALL_SLACK if cpu else limits.seconds * NODE_SLACK
    until = start + left + budget   # until it has prepared
    try:
        while True:
            message = _receive(read_fd, until)
            if message is not None and message[0] == "prepared":
                until = time.perf_counter() + budget
                continue
            if message is None or message[0] != "step":
                break
            _, name, it, cap = message
            bar.update(f"saturate: phase {name}, iteration {it}", completed=it, total=cap)
    except BaseException:  # interrupted (Ctrl-C): the child must not outlive the call
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    finally:
        bar.close()
        os.close(read_fd)
    if message is not None and message[0] in ("done", "raise", "time limit"):
        os.waitpid(pid, 0)
        errors.close()
        if message[0] == "raise":
            raise message[1]
        if message[0] == "time limit":
            raise TimeLimit(*message[1:])
        report, frozen, held, extra = message[1:]
        if report.error is None:
            ran(rules[i] for i in held)   # registered there without a crash: the next template registers them
        return report, frozen, extra
    seconds = time.perf_counter() - start
    timed_out = message is None and time.perf_counter() >= until
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:   # its CPU time ran out
        timed_out = True
    errors.seek(0)
    stderr = errors.read().decode(errors="replace").strip()
    errors.close()
    report = RunReport(StopReason.ERROR, seconds=seconds)
    if timed_out:
        report.stop_reason = StopReason.TIME_LIMIT
        within = f"CPU time limit plus 10% and 1 s ({_cpu_cap(limits):.3g} s)" if cpu else \
            f"time limit plus 10% ({limits.seconds * NODE_SLACK:.3g} s)"
        report.error = f"saturation did not stop within its {within}: the child process running egglog was killed"
    elif (message is not None and message[0] == "memory") or "memory allocation" in stderr:
        report.stop_reason = StopReason.MEMORY_LIMIT
        report.error = f"saturation ran out of its memory limit ({limits.memory / 2**30:.3g} GiB)"
    elif message is not None:
        report.error = message[1]
    else:
        how = f"signal {signal.Signals(-os.waitstatus_to_exitcode(status)).name}" \
            if os.WIFSIGNALED(status) else f"exit status {os.waitstatus_to_exitcode(status)}"
        first = stderr.splitlines()[0] if stderr else "no message"
        report.error = f"egglog crashed ({how}): {first}"
    return report, None, None


def _child(prepare, schedule, rules: list, limits: Limits, write_fd: int, errors_fd: int,
           cpu: bool = False) -> None:  # pragma: no cover
    """Prepare the e-graph (`prepare()`: the e-graph, and what goes back with the result), then saturate,
    freeze and send, with the positions of those of `rules` (the reachable ones) whose rule sets the
    saturation registered; never returns (os._exit skips the parent's exit handlers). An error while
    preparing is sent to be raised in the parent. With `cpu`, the limits count this process's CPU time."""
    try:
        os.dup2(errors_fd, 2)
        sys.stderr = open(2, "w", closefd=False)
        if faulthandler.is_enabled():  # a crash's Python traceback goes with the rest of the child's errors
            faulthandler.enable(sys.stderr)

        def send(message) -> None:
            payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
            os.write(write_fd, _HEADER.pack(len(payload)))
            view = memoryview(payload)
            while view:
                view = view[os.write(write_fd, view):]

        try:
            egraph, extra = prepare()
        except TimeLimit as exc:
            send(("time limit", exc.stage, exc.seconds, exc.cpu))
            return
        except Exception as exc:  # noqa: BLE001 - raised in the parent, as if it had prepared there
            try:
                send(("raise", exc))
            except Exception:  # noqa: BLE001 - an error that does not pickle
                send(("error", f"encoding failed: {type(exc).__name__}: {exc}"))
            return
        except BaseException as exc:  # noqa: BLE001 - egglog's PanicException, while the program is written
            send(("error", f"egglog failed: {type(exc).__name__}: {exc}"))
            return
        send(("prepared",))
        _cap_memory(limits.memory)
        if cpu:
            use_cpu_time()
            _cap_cpu(_cpu_cap(limits))
        try:
            with progress.bars(enabled=False):
                report = saturate(egraph, schedule, limits, on_step=lambda *step: send(("step", *step)))
            frozen = portable(freeze(egraph)) if report.stop_reason is not StopReason.ERROR else None
            send(("done", report, frozen, registered(egraph, rules), extra))
        except MemoryError:
            send(("memory",))
        except BaseException as exc:  # noqa: BLE001 - egglog's PanicException derives from BaseException
            send(("error", f"egglog failed: {type(exc).__name__}: {exc}"))
    finally:
        os._exit(0)


def _cap_memory(extra: int) -> None:  # pragma: no cover - runs in the child
    """Cap the address space at its current size plus `extra` bytes (Linux; elsewhere, no cap)."""
    try:
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = current + extra
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _cpu_cap(limits: Limits) -> float:
    """The CPU seconds after which the kernel stops a child limited in CPU time."""
    return limits.seconds * NODE_SLACK + 1.0


def _cap_cpu(seconds: float) -> None:  # pragma: no cover - runs in the child
    """Have the kernel stop this process (SIGXCPU) once it has used `seconds` of CPU time (whole seconds,
    rounded up: the kernel counts no finer)."""
    soft = max(1, math.ceil(time.process_time() + seconds))
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))  # no core file
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _receive(fd: int, deadline: float):
    """The next message from the child, or None at the deadline or where the child closed the pipe."""
    deadline = None if deadline == math.inf else deadline
    header = read_exactly(fd, _HEADER.size, deadline)
    if header is None:
        return None
    body = read_exactly(fd, _HEADER.unpack(header)[0], deadline)
    return None if body is None else pickle.loads(body)
