"""Fuzz driver: mutate valid .mrt artifacts and check the runtime's contract.

The contract: for *any* bytes, ``minirt.Session(bytes)`` followed by ``run``
either succeeds or raises a subclass of ``minirt.Error``.  Anything else (an
``IndexError``, ``ValueError``, ``MemoryError``, ``RecursionError``, a hang, a
crash of the interpreter) is a finding.

Usage::

    python -m tests.fuzz.fuzz_artifacts --iterations 50000 --seed 1
    python -m tests.fuzz.fuzz_artifacts --iterations 2000 --corpus-model examples/digits/digits_cnn.onnx
    python -m tests.fuzz.fuzz_artifacts --reproduce /tmp/minirt-fuzz-findings/s1-i1234.mrt
    python -m tests.fuzz.fuzz_artifacts --seed 1 --start 1234 --iterations 1 --in-process -v

Mutant ``i`` of seed ``S`` is generated from ``random.Random(f"{S}:{i}")``
alone (the seed artifacts are deterministic), so a finding is reproduced by
its seed and iteration.  Inputs run in batches inside worker processes; each
input runs under a soft watchdog (SIGALRM, reported with a traceback) and the
parent kills a worker whose input exceeds twice that (a hang in C code), and
notices a worker that died (a segfault or the OOM killer).  Workers run with
an address-space limit so that an artifact that makes the runtime allocate
gigabytes fails with a ``MemoryError`` (a finding when it escapes), and an
input that grows the peak RSS by more than ``--rss-jump-mb`` is reported too.

Findings are printed and saved under ``/tmp/minirt-fuzz-findings/``: the
mutant as ``<name>.mrt`` and the mutation log plus traceback as ``<name>.txt``.
"""
from __future__ import annotations

import argparse
import warnings
import multiprocessing as mp
import os
import random
import resource
import signal
import sys
import tempfile
import time
import traceback

import numpy as np

import minirt
from minirt.dtypes import ONNX_TO_NUMPY
from tests.fuzz.mutator import Mutator

FINDINGS_DIR = "/tmp/minirt-fuzz-findings"
MAX_FEED_ELEMENTS = 1 << 16  # the harness refuses to build bigger inputs itself


class InputTimeout(BaseException):
    """Raised by the soft watchdog.  A BaseException so the session cannot wrap it."""


def _on_alarm(signum, frame):
    raise InputTimeout("input exceeded the per-input time limit")


# --- one input -----------------------------------------------------------------------


def make_feed(sess: minirt.Session, rng: random.Random) -> dict | None:
    """Random inputs matching ``get_inputs()``: symbolic/unknown dims are 1..3.

    Returns None when a declared input is too large for the harness to build
    (a fixed dim of 2**40 is a legal declaration; the session must still load).
    """
    symbols: dict[str, int] = {}
    feed = {}
    nrng = np.random.default_rng(rng.getrandbits(32))
    for arg in sess.get_inputs():
        if arg.shape is None:
            shape = [rng.randint(1, 3) for _ in range(rng.randint(0, 2))]
        else:
            shape = []
            for d in arg.shape:
                if isinstance(d, int):
                    shape.append(d)
                elif isinstance(d, str):
                    shape.append(symbols.setdefault(d, rng.randint(1, 3)))
                else:
                    shape.append(rng.randint(1, 3))
        n = span = 1
        for d in shape:
            n *= d
            span *= max(d, 1)  # numpy refuses (0, 2**62) too
        if span > MAX_FEED_ELEMENTS:
            return None
        code = arg._dtype_code or 1
        if code == 8:
            arr = np.array([rng.choice(["", "a", "bc", "é"]) for _ in range(n)], dtype=object).reshape(shape)
        else:
            dtype = ONNX_TO_NUMPY[code]
            if dtype.kind == "f":
                arr = nrng.standard_normal(n).astype(dtype).reshape(shape)
            elif dtype.kind == "b":
                arr = nrng.integers(0, 2, n).astype(bool).reshape(shape)
            elif dtype.kind == "u":
                arr = nrng.integers(0, 4, n).astype(dtype).reshape(shape)
            else:
                arr = nrng.integers(-3, 4, n).astype(dtype).reshape(shape)
        feed[arg.name] = arr
    return feed


def _signing_key() -> bytes:
    from tests.fuzz.seeds import signing_public_key

    return signing_public_key()


def exercise(data: bytes, rng: random.Random, tmpdir: str | None = None, mode: float | None = None) -> str:
    """Load and run one artifact the way an application would.  Returns the outcome.

    ``mode`` (drawn from ``rng`` unless given): < 0.1 skips checksum
    verification, (0.90, 0.95] requires the signed seed's signature
    (``verify_key``), > 0.95 loads through a file (the mmap path).
    """
    mode = rng.random() if mode is None else mode
    verify = mode >= 0.1  # 10%: skip the checksums, as a user may for speed
    if tmpdir is not None and mode > 0.95:  # 5%: through a file (the mmap path)
        path = os.path.join(tmpdir, "mutant.mrt")
        with open(path, "wb") as f:
            f.write(data)
        sess = minirt.Session(path, verify_checksums=verify)
    else:
        # 5%: a session that requires the signed seed's signature (almost every mutant must be refused)
        key = _signing_key() if 0.90 < mode <= 0.95 else None
        sess = minirt.Session(data, verify_checksums=verify, verify_key=key)
    sess.get_outputs()
    sess.get_overridable_initializers()
    sess.get_modelmeta()
    feed = make_feed(sess, rng)
    if feed is None:
        return "loaded"
    outputs = sess.run(None, feed)
    if any(not isinstance(o, np.ndarray) or (o.dtype == object and o.size and any(x is None for x in o.flat))
           for o in outputs):
        return "ran-with-None-output"
    return "ran"


def check_one(mutator: Mutator, seed: int, i: int, timeout: float, tmpdir: str | None = None) -> tuple[str, dict | None]:
    """Generate mutant ``i`` of ``seed``, exercise it; ``(outcome, finding or None)``."""
    rng = random.Random(f"{seed}:{i}")
    data, log = mutator.mutate(rng)
    return run_checked(data, rng, timeout, tmpdir, seed=seed, i=i, log=log)


def run_checked(data, rng, timeout, tmpdir=None, *, seed=None, i=None, log=(), mode=None):
    use_alarm = timeout > 0 and hasattr(signal, "setitimer")
    if use_alarm:
        old = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return exercise(data, rng, tmpdir, mode), None
    except minirt.Error as exc:
        return type(exc).__name__, None
    except InputTimeout:
        kind = "hang"
        tb = traceback.format_exc()
    except BaseException as exc:  # noqa: BLE001 - everything else is a finding
        if isinstance(exc, KeyboardInterrupt):
            raise
        kind = type(exc).__name__
        tb = traceback.format_exc()
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    return kind, {"kind": kind, "seed": seed, "iteration": i, "log": list(log), "traceback": tb, "data": data}


# --- findings --------------------------------------------------------------------------


def signature(finding: dict) -> str:
    """Exception type and the innermost minirt frame: groups findings by bug."""
    tb = finding.get("traceback") or ""
    where = ""
    for line in tb.splitlines():
        line = line.strip()
        if line.startswith("File ") and ("minirt" in line or "builder" in line) and "tests/fuzz" not in line:
            where = line
    return f"{finding['kind']} at {where or '?'}"


def save_finding(finding: dict, directory: str = FINDINGS_DIR) -> str:
    os.makedirs(directory, exist_ok=True)
    name = f"s{finding['seed']}-i{finding['iteration']}-{finding['kind']}"
    base = os.path.join(directory, name)
    if finding.get("data") is not None:
        with open(base + ".mrt", "wb") as f:
            f.write(finding["data"])
    with open(base + ".txt", "w") as f:
        f.write(f"kind: {finding['kind']}\nseed: {finding['seed']}\niteration: {finding['iteration']}\n")
        f.write(f"reproduce: python -m tests.fuzz.fuzz_artifacts --seed {finding['seed']} --start {finding['iteration']} "
                f"--iterations 1 --in-process -v\n")
        f.write("mutation:\n  " + "\n  ".join(finding.get("log") or []) + "\n\n")
        f.write(finding.get("traceback") or "")
    return base


_REPORTED: dict[str, int] = {}
REPORT_PER_SIGNATURE = 5


def is_note(finding: dict) -> bool:
    """Notes are worth a look but do not break the contract (e.g. a kernel allocating a lot)."""
    return finding["kind"].endswith("-note")


def report_finding(finding: dict, directory: str = FINDINGS_DIR) -> None:
    """Print and save a finding; only the first few of each signature, so long runs stay readable."""
    sig = signature(finding)
    _REPORTED[sig] = _REPORTED.get(sig, 0) + 1
    if _REPORTED[sig] > REPORT_PER_SIGNATURE:
        return
    base = save_finding(finding, directory)
    print(f"\n=== FINDING {finding['kind']} seed={finding['seed']} iteration={finding['iteration']} -> {base}.mrt",
          file=sys.stderr)
    print("mutation: " + " | ".join(finding.get("log") or []), file=sys.stderr)
    print(finding.get("traceback") or "", file=sys.stderr, flush=True)


# --- seeds -------------------------------------------------------------------------------


def load_seeds(corpus: list[str] | None = None) -> list[tuple[str, bytes]]:
    from tests.fuzz.seeds import seed_artifacts

    seeds = list(seed_artifacts())
    for path in corpus or ():
        if path.endswith(".mrt"):
            with open(path, "rb") as f:
                seeds.append((os.path.basename(path), f.read()))
        else:
            from minirt.builder import build_bytes

            seeds.append((os.path.basename(path), build_bytes(path)))
    return seeds


# --- in-process loop (the test suite uses this) -------------------------------------------


def fuzz_in_process(seeds, seed: int, start: int, iterations: int, timeout: float = 10.0, verbose: bool = False,
                    on_finding=None) -> tuple[list[dict], dict]:
    mutator = Mutator(seeds)
    findings, outcomes = [], {}
    with tempfile.TemporaryDirectory(prefix="minirt-fuzz-") as tmpdir:
        for i in range(start, start + iterations):
            outcome, finding = check_one(mutator, seed, i, timeout, tmpdir)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if verbose:
                rng = random.Random(f"{seed}:{i}")
                _d, log = mutator.mutate(rng)
                print(f"[{i}] {outcome}: " + " | ".join(log))
            if finding is not None:
                findings.append(finding)
                if on_finding:
                    on_finding(finding)
    return findings, outcomes


# --- worker pool -----------------------------------------------------------------------------


def _limit_memory(mem_limit_mb: int) -> None:
    if mem_limit_mb <= 0:
        return
    try:
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        vm = 0
    limit = vm + mem_limit_mb * 2**20
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ValueError, OSError):
        pass


def _worker(wid, seeds, seed, timeout, mem_limit_mb, rss_jump_mb, tasks, results, current, heartbeat):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _limit_memory(mem_limit_mb)
    mutator = Mutator(seeds)
    tmpdir = tempfile.mkdtemp(prefix="minirt-fuzz-")
    try:
        while True:
            task = tasks.get()
            if task is None:
                break
            lo, hi = task
            outcomes: dict[str, int] = {}
            for i in range(lo, hi):
                current[wid] = i
                heartbeat[wid] = time.monotonic()
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                outcome, finding = check_one(mutator, seed, i, timeout, tmpdir)
                grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
                if finding is None and grew > rss_jump_mb:
                    rng = random.Random(f"{seed}:{i}")
                    data, log = mutator.mutate(rng)
                    finding = {"kind": "memory-note", "seed": seed, "iteration": i, "log": log, "data": data,
                               "traceback": f"peak RSS grew by {grew:.0f} MiB on this input (outcome {outcome})\n"}
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                if finding is not None:
                    results.put(("finding", finding))
            current[wid] = -1
            heartbeat[wid] = time.monotonic()
            results.put(("done", (lo, hi, outcomes)))
    finally:
        try:
            os.rmdir(tmpdir)
        except OSError:
            pass


def fuzz_pool(seeds, seed: int, start: int, iterations: int, workers: int, timeout: float, chunk: int,
              mem_limit_mb: int, rss_jump_mb: int, findings_dir: str) -> tuple[list[dict], dict, float]:
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    tasks, results = ctx.Queue(), ctx.Queue()
    current = ctx.Array("q", [-1] * workers, lock=False)
    heartbeat = ctx.Array("d", [time.monotonic()] * workers, lock=False)
    pending = {}  # (lo, hi) -> True until done
    for lo in range(start, start + iterations, chunk):
        hi = min(lo + chunk, start + iterations)
        tasks.put((lo, hi))
        pending[(lo, hi)] = True
    owner: dict[int, tuple] = {}  # wid -> chunk it is working on (learnt from current[])

    def spawn(wid):
        p = ctx.Process(target=_worker, args=(wid, seeds, seed, timeout, mem_limit_mb, rss_jump_mb, tasks, results,
                                              current, heartbeat), daemon=True)
        current[wid] = -1
        heartbeat[wid] = time.monotonic()
        p.start()
        return p

    procs = [spawn(w) for w in range(workers)]
    findings, outcomes = [], {}
    done_count = 0
    t0 = last_print = time.monotonic()

    def chunk_of(i):
        for lo, hi in pending:
            if lo <= i < hi:
                return lo, hi
        return None

    def lost_worker(wid, kind, detail):
        nonlocal done_count
        i = current[wid]
        span = chunk_of(i) if i >= 0 else None
        if i >= 0:
            rng = random.Random(f"{seed}:{i}")
            data, log = Mutator(seeds).mutate(rng)
            f = {"kind": kind, "seed": seed, "iteration": i, "log": log, "data": data, "traceback": detail + "\n"}
            findings.append(f)
            report_finding(f, findings_dir)
        if span is not None:
            # The rest of that chunk goes back into the queue; the inputs before i were counted as lost.
            del pending[span]
            done_count += i - span[0] + 1
            outcomes[kind] = outcomes.get(kind, 0) + 1
            if i + 1 < span[1]:
                pending[(i + 1, span[1])] = True
                tasks.put((i + 1, span[1]))
        procs[wid] = spawn(wid)

    try:
        while pending:
            try:
                kind, payload = results.get(timeout=0.5)
            except Exception:  # queue.Empty
                kind = None
            if kind == "finding":
                findings.append(payload)
                report_finding(payload, findings_dir)
            elif kind == "done":
                lo, hi, outs = payload
                pending.pop((lo, hi), None)
                done_count += hi - lo
                for k, v in outs.items():
                    outcomes[k] = outcomes.get(k, 0) + v
            now = time.monotonic()
            for wid, p in enumerate(procs):
                if not p.is_alive():
                    lost_worker(wid, "crash", f"worker died with exit code {p.exitcode} (signal {-p.exitcode if p.exitcode and p.exitcode < 0 else 'none'})")
                elif current[wid] >= 0 and now - heartbeat[wid] > 2 * timeout + 5:
                    p.kill()
                    p.join()
                    lost_worker(wid, "hang", f"input ran for more than {2 * timeout + 5:.0f} s and ignored the soft watchdog; worker killed")
            if now - last_print > 10:
                last_print = now
                rate = done_count / (now - t0)
                print(f"  {done_count}/{iterations} inputs, {rate:.0f}/s, {len(findings)} findings", file=sys.stderr, flush=True)
    finally:
        for _ in procs:
            tasks.put(None)
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return findings, outcomes, time.monotonic() - t0


def quiet_numpy() -> None:
    """Kernels fed NaN/huge values warn on every input; that noise is not a finding."""
    np.seterr(all="ignore")
    warnings.simplefilter("ignore", RuntimeWarning)


def main(argv=None) -> int:
    quiet_numpy()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first iteration (to reproduce one input)")
    ap.add_argument("--corpus-model", action="append", default=[], metavar="PATH",
                    help="extra seed: an .onnx model (built with the builder) or an .mrt artifact; repeatable")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--chunk", type=int, default=250, help="inputs per worker batch")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per input before it counts as a hang")
    ap.add_argument("--mem-limit-mb", type=int, default=1024, help="extra address space a worker may map (0: no limit)")
    ap.add_argument("--rss-jump-mb", type=int, default=512, help="report an input that grows the peak RSS by this much")
    ap.add_argument("--findings-dir", default=FINDINGS_DIR)
    ap.add_argument("--in-process", action="store_true", help="no worker processes (no crash isolation)")
    ap.add_argument("--reproduce", metavar="MRT", help="run one saved artifact in-process and show the outcome")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)

    if args.reproduce:
        with open(args.reproduce, "rb") as f:
            data = f.read()
        status = 0
        with tempfile.TemporaryDirectory(prefix="minirt-fuzz-") as tmpdir:
            for label, mode in (("bytes", 0.5), ("bytes, checksums off", 0.0), ("file", 0.99)):
                outcome, finding = run_checked(data, random.Random(0), args.timeout, tmpdir, mode=mode)
                print(f"{label}: {outcome}")
                if finding:
                    print(finding["traceback"])
                    status = 1
        return status

    seeds = load_seeds(args.corpus_model)
    print(f"seeds: {', '.join(f'{n} ({len(d)} B)' for n, d in seeds)}", file=sys.stderr)
    t0 = time.monotonic()
    if args.in_process:
        _limit_memory(args.mem_limit_mb)
        findings, outcomes = fuzz_in_process(seeds, args.seed, args.start, args.iterations, args.timeout, args.verbose,
                                             on_finding=lambda f: report_finding(f, args.findings_dir))
        elapsed = time.monotonic() - t0
    else:
        findings, outcomes, elapsed = fuzz_pool(seeds, args.seed, args.start, args.iterations, args.workers,
                                                args.timeout, args.chunk, args.mem_limit_mb, args.rss_jump_mb,
                                                args.findings_dir)
    total = sum(outcomes.values())
    notes = [f for f in findings if is_note(f)]
    findings = [f for f in findings if not is_note(f)]
    print(f"\n{total} inputs in {elapsed:.1f} s ({total / max(elapsed, 1e-9):.0f}/s), {len(findings)} findings, "
          f"{len(notes)} notes")
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1])))
    groups: dict[str, list] = {}
    for f in findings + notes:
        groups.setdefault(signature(f), []).append(f)
    for sig, fs in groups.items():
        print(f"  {len(fs):5d} x {sig}  (first: seed {fs[0]['seed']} iteration {fs[0]['iteration']})")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
